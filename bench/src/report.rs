//! The README's performance section and the charts beside it, generated from
//! results files only: `bench/results/compare_ns.json` (bench/compare_ns.sh)
//! and, when present, `bench/results/lab.json` (bench/lab.sh), both in the
//! shared format `{"bench", "command", "machine": {...}, "runs": [{"system",
//! "mode", ...}]}`.
//!
//! Every number printed comes from a run of a results file, and each table
//! names the file and the command that wrote it. The Markdown goes between
//! [`BEGIN`] and [`END`] in the README; nothing outside the markers changes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde_json::Value;

/// The README marker before the generated section.
pub const BEGIN: &str = "<!-- perf:begin -->";
/// The README marker after it.
pub const END: &str = "<!-- perf:end -->";

/// The system whose efficiency the others are compared with.
pub const REFERENCE: &str = "sluice-af_packet";

/// Loss below this fraction counts as "delivered without loss" in the table.
const LOSS_OK: f64 = 0.01;

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A results file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A results file is not JSON.
    #[error("parse {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A results file lacks what the report needs.
    #[error("{what}: {why}")]
    Format {
        /// The file or the run.
        what: String,
        /// What is missing.
        why: String,
    },
    /// The README lacks the markers, or has them out of order.
    #[error("README: {0}")]
    Markers(String),
    /// A chart could not be drawn.
    #[error("chart {path}: {why}")]
    Chart {
        /// The chart's file.
        path: PathBuf,
        /// Why.
        why: String,
    },
}

/// One results file and where it came from.
#[derive(Debug, Clone)]
pub struct Results {
    /// The path shown in the README (relative to the repository).
    pub path: String,
    /// Its content.
    pub json: Value,
}

impl Results {
    /// Reads `file`, shown as `shown` in the README.
    pub fn load(file: &Path, shown: &str) -> Result<Results, ReportError> {
        let text = std::fs::read_to_string(file).map_err(|source| ReportError::Read { path: file.to_owned(), source })?;
        let json = serde_json::from_str(&text).map_err(|source| ReportError::Parse { path: file.to_owned(), source })?;
        let r = Results { path: shown.to_owned(), json };
        r.runs()?;
        Ok(r)
    }

    /// Its runs.
    pub fn runs(&self) -> Result<&Vec<Value>, ReportError> {
        self.json["runs"].as_array().ok_or_else(|| ReportError::Format { what: self.path.clone(), why: "no `runs` array".into() })
    }

    fn command(&self) -> String {
        self.json["command"].as_str().unwrap_or("(not recorded)").to_owned()
    }

    /// The machine and the date under a table; the commit measured stays in
    /// the results file (`machine.git_rev`), out of the README.
    fn machine_line(&self) -> String {
        let m = &self.json["machine"];
        let la = m["loadavg"].as_array().map(|a| a.iter().map(plain).collect::<Vec<_>>().join(" ")).unwrap_or_default();
        format!(
            "{}, {} cores, kernel {}, DPDK {}, load average {} at the start, {}",
            plain(&m["cpu_model"]),
            plain(&m["cores"]),
            plain(&m["kernel"]),
            plain(&m["dpdk"]),
            la,
            plain(&m["date"])
        )
    }
}

/// A JSON scalar as text (`?` when absent).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "?".into(),
        other => other.to_string(),
    }
}

/// A number for a table: integers above 100, three significant digits below.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "?".into();
    }
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn f(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn fnum(v: &Value) -> String {
    f(v).map_or_else(|| "–".into(), num)
}

/// Integers (counts, microseconds) as they are; other numbers through [`num`].
fn count(v: &Value) -> String {
    match (v.as_u64(), v.as_i64()) {
        (Some(n), _) => n.to_string(),
        (None, Some(n)) => n.to_string(),
        _ => fnum(v),
    }
}

/// The systems of a results file in the order they first appear.
fn systems(runs: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        if let Some(s) = r["system"].as_str() {
            if !out.iter().any(|x| x == s) {
                out.push(s.to_owned());
            }
        }
    }
    out
}

fn of<'a>(runs: &'a [Value], system: &str, mode: &str) -> Vec<&'a Value> {
    runs.iter().filter(|r| r["system"] == system && r["mode"] == mode && r.get("skipped").is_none()).collect()
}

/// The highest offered UDP rate a system carried with less than 1 % loss.
fn best_udp<'a>(runs: &[&'a Value]) -> Option<&'a Value> {
    runs.iter()
        .copied()
        .filter(|r| {
            let (sent, lost) = (f(&r["sent"]).unwrap_or(0.0), f(&r["lost"]).unwrap_or(f64::INFINITY));
            sent > 0.0 && lost / sent < LOSS_OK
        })
        .max_by(|a, b| f(&a["offered_pps"]).unwrap_or(0.0).total_cmp(&f(&b["offered_pps"]).unwrap_or(0.0)))
}

/// The namespace comparison as a Markdown table with its provenance.
pub fn compare_table(res: &Results) -> Result<String, ReportError> {
    let runs = res.runs()?;
    let reference = of(runs, REFERENCE, "tcp_crr").first().and_then(|r| f(&r["connections_per_lb_core_s"]));
    let mut t = String::new();
    t.push_str(
        "| system | TCP conn/s | latency p50 / p99 / p99.9 (µs) | LB CPU | conn per LB core-s | vs sluice-af_packet at equal CPU | \
         UDP pps with < 1 % loss (highest offered) | UDP pps per LB core-s | backend removed: other flows kept / broken | its own flows kept / broken |\n",
    );
    t.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for s in systems(runs) {
        let whole: Vec<&Value> = runs.iter().filter(|r| r["system"] == s.as_str() && r.get("mode").is_none()).collect();
        if let Some(r) = whole.first() {
            let why = r["skipped"].as_str().map(|w| format!("skipped: {w}")).or_else(|| r["failed"].as_str().map(|w| format!("failed: {}", w.lines().next().unwrap_or(""))));
            if let Some(why) = why {
                let _ = writeln!(t, "| {s} | {} | | | | | | | | |", why.replace('|', "/"));
                continue;
            }
        }
        let tcp = of(runs, &s, "tcp_crr");
        let (cps, lat, cpu, per_core, ratio) = match tcp.first() {
            Some(r) => {
                let l = &r["latency_us"];
                let per_core = f(&r["connections_per_lb_core_s"]);
                let ratio = match (per_core, reference) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{} ×", num(a / b)),
                    _ => "–".into(),
                };
                (
                    fnum(&r["connections_per_s"]),
                    format!("{} / {} / {}", count(&l["p50"]), count(&l["p99"]), count(&l["p999"])),
                    f(&r["cpu_pct"]).map_or_else(|| "–".into(), |c| format!("{} %", num(c))),
                    per_core.map_or_else(|| "–".into(), num),
                    ratio,
                )
            }
            None => ("–".into(), "–".into(), "–".into(), "–".into(), "–".into()),
        };
        let udp_runs = of(runs, &s, "udp");
        let udp_skipped = runs.iter().find(|r| r["system"] == s.as_str() && r["mode"] == "udp" && r.get("skipped").is_some());
        let (udp, udp_core) = match (best_udp(&udp_runs), udp_skipped) {
            (Some(r), _) => (
                format!("{} ({})", fnum(&r["delivered_pps"]), fnum(&r["offered_pps"])),
                fnum(&r["packets_per_lb_core_s"]),
            ),
            (None, Some(r)) => (format!("n/a: {}", plain(&r["skipped"])), "–".into()),
            (None, None) if !udp_runs.is_empty() => ("none below 1 % loss".into(), "–".into()),
            (None, None) => ("–".into(), "–".into()),
        };
        let (others, own) = match of(runs, &s, "remove_backend").first() {
            Some(r) => (
                format!("{} / {}", count(&r["kept_on_others"]), count(&r["broken_on_others"])),
                format!("{} / {}", count(&r["kept_on_removed"]), count(&r["broken_on_removed"])),
            ),
            None => ("–".into(), "–".into()),
        };
        let _ = writeln!(t, "| {s} | {cps} | {lat} | {cpu} | {per_core} | {ratio} | {udp} | {udp_core} | {others} | {own} |");
    }
    let _ = write!(
        t,
        "\nFrom `{}`, written by `{}` on {}. LB CPU: the load balancer's process time plus \
         the irq and softirq time of its core (the client and backends run on the other core; tick-sampled, \
         so small values are coarse); the file's `cpu_method` has the details and every run also records the \
         whole machine's CPU. UDP rates are what the sender achieved.\n",
        res.path,
        res.command(),
        res.machine_line()
    );
    Ok(t)
}

/// The lab's runs (any system and mode) as a Markdown table with their provenance.
pub fn lab_table(res: &Results) -> Result<String, ReportError> {
    let runs = res.runs()?;
    let mut t = String::new();
    t.push_str(
        "| system | mode | offered pps | delivered pps | lost | round trip p50 / p99 / p99.9 (µs) | \
         through the worker p50 / p99 / p99.9 (µs) | CPU |\n",
    );
    t.push_str("|---|---|--:|--:|--:|--:|--:|--:|\n");
    let percentiles = |l: &Value| {
        if l.is_object() {
            format!("{} / {} / {}", count(&l["p50"]), count(&l["p99"]), count(&l["p999"]))
        } else {
            "–".into()
        }
    };
    for r in runs {
        if let Some(why) = r["skipped"].as_str() {
            let _ = writeln!(t, "| {} | {} | skipped: {} | | | | | |", plain(&r["system"]), plain(&r["mode"]), why.replace('|', "/"));
            continue;
        }
        let lat = percentiles(&r["latency_us"]);
        let worker = percentiles(&r["worker_latency_us"]);
        let cpu = f(&r["cpu_pct"]).map_or_else(|| "–".into(), |c| format!("{} %", num(c)));
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} | {lat} | {worker} | {cpu} |",
            plain(&r["system"]),
            plain(&r["mode"]),
            fnum(&r["offered_pps"]),
            fnum(&r["delivered_pps"]),
            count(&r["lost"])
        );
    }
    let _ = write!(t, "\nFrom `{}`, written by `{}` on {}.\n", res.path, res.command(), res.machine_line());
    Ok(t)
}

/// The whole generated section (without the markers).
pub fn perf_section(compare: &Results, lab: Option<&Results>, charts: &[String]) -> Result<String, ReportError> {
    let mut s = String::from("\n");
    if let Some(lab) = lab {
        s.push_str("### The memif lab: `sluice gen` → `sluice run` → `sluice gen`\n\n");
        s.push_str(&lab_table(lab)?);
        s.push('\n');
    }
    s.push_str("### Side by side with the kernel's load balancers (network namespaces)\n\n");
    s.push_str(&compare_table(compare)?);
    if !charts.is_empty() {
        s.push('\n');
        for c in charts {
            let _ = writeln!(s, "![{c}]({c})");
        }
    }
    s.push('\n');
    Ok(s)
}

/// `readme` with the text between the markers replaced by `section`.
pub fn splice(readme: &str, section: &str) -> Result<String, ReportError> {
    let b = readme.find(BEGIN).ok_or_else(|| ReportError::Markers(format!("no `{BEGIN}`")))?;
    let e = readme.find(END).ok_or_else(|| ReportError::Markers(format!("no `{END}`")))?;
    if e < b {
        return Err(ReportError::Markers(format!("`{END}` before `{BEGIN}`")));
    }
    if readme[b + BEGIN.len()..].contains(BEGIN) || readme[e + END.len()..].contains(END) {
        return Err(ReportError::Markers("markers appear more than once".into()));
    }
    Ok(format!("{}{BEGIN}{section}{END}{}", &readme[..b], &readme[e + END.len()..]))
}

/// A labelled line of (x, y) points.
type Series = (String, Vec<(f64, f64)>);

/// A line per system: (offered, delivered) pps of its UDP runs (and the lab's runs that have both).
fn throughput_series(compare: &Results, lab: Option<&Results>) -> Result<Vec<Series>, ReportError> {
    let mut out = Vec::new();
    for (prefix, res) in std::iter::once(("", compare)).chain(lab.map(|l| ("lab: ", l))) {
        let runs = res.runs()?;
        for s in systems(runs) {
            let mut pts: Vec<(f64, f64)> = runs
                .iter()
                .filter(|r| r["system"] == s.as_str() && r.get("skipped").is_none())
                .filter_map(|r| Some((f(&r["offered_pps"])?, f(&r["delivered_pps"])?)))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            out.push((format!("{prefix}{s}"), pts));
        }
    }
    Ok(out)
}

/// Latency percentiles (p50, p99, p99.9) of every run that has them, labelled.
fn latency_series(compare: &Results, lab: Option<&Results>) -> Result<Vec<(String, [f64; 3])>, ReportError> {
    let mut out = Vec::new();
    for (prefix, res) in std::iter::once(("", compare)).chain(lab.map(|l| ("lab: ", l))) {
        for r in res.runs()? {
            let l = &r["latency_us"];
            let (Some(a), Some(b), Some(c)) = (f(&l["p50"]), f(&l["p99"]), f(&l["p999"])) else { continue };
            let mut label = format!("{prefix}{} {}", plain(&r["system"]), plain(&r["mode"]));
            if let Some(o) = f(&r["offered_pps"]) {
                let _ = write!(label, " @{} pps", num(o));
            }
            out.push((label, [a, b, c]));
        }
    }
    Ok(out)
}

fn chart_err(path: &Path) -> impl Fn(String) -> ReportError + '_ {
    move |why| ReportError::Chart { path: path.to_owned(), why }
}

/// Delivered vs offered packets/s, one line per system.
fn draw_throughput(path: &Path, series: &[Series]) -> Result<(), ReportError> {
    let e = chart_err(path);
    let max = series.iter().flat_map(|(_, p)| p.iter().map(|&(o, d)| o.max(d))).fold(1.0, f64::max) * 1.05;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut c = ChartBuilder::on(&root)
        .caption("UDP: delivered vs offered packets/s", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max, 0.0..max)
        .map_err(|x| e(x.to_string()))?;
    c.configure_mesh()
        .x_desc("offered (packets/s)")
        .y_desc("delivered (packets/s)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|x| e(x.to_string()))?;
    c.draw_series(LineSeries::new([(0.0, 0.0), (max, max)], BLACK.mix(0.2)))
        .map_err(|x| e(x.to_string()))?
        .label("no loss")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], BLACK.mix(0.2)));
    for (i, (name, pts)) in series.iter().enumerate() {
        let col = Palette99::pick(i).to_rgba();
        c.draw_series(LineSeries::new(pts.iter().copied(), col.stroke_width(2)))
            .map_err(|x| e(x.to_string()))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, col.filled()))).map_err(|x| e(x.to_string()))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
}

/// p50 / p99 / p99.9 latency, one line per run, logarithmic.
fn draw_latency(path: &Path, series: &[(String, [f64; 3])]) -> Result<(), ReportError> {
    let e = chart_err(path);
    let max = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(10.0, f64::max) * 2.0;
    let min = series.iter().flat_map(|(_, v)| v.iter().copied()).fold(max, f64::min).max(1.0) / 2.0;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(x.to_string()))?;
    let mut c = ChartBuilder::on(&root)
        .caption("Latency percentiles (µs, log scale)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.2f64..2.2f64, (min..max).log_scale())
        .map_err(|x| e(x.to_string()))?;
    c.configure_mesh()
        .x_labels(3)
        .x_label_formatter(&|x| {
            let i = x.round();
            let name = if (x - i).abs() > 0.01 {
                ""
            } else if i == 0.0 {
                "p50"
            } else if i == 1.0 {
                "p99"
            } else if i == 2.0 {
                "p99.9"
            } else {
                ""
            };
            name.to_owned()
        })
        .y_desc("latency (µs)")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(|x| e(x.to_string()))?;
    for (i, (name, v)) in series.iter().enumerate() {
        let col = Palette99::pick(i).to_rgba();
        let pts: Vec<(f64, f64)> = v.iter().enumerate().map(|(k, &y)| (k as f64, y)).collect();
        c.draw_series(LineSeries::new(pts.iter().copied(), col.stroke_width(2)))
            .map_err(|x| e(x.to_string()))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], col.stroke_width(2)));
        c.draw_series(pts.iter().map(|&p| Circle::new(p, 3, col.filled()))).map_err(|x| e(x.to_string()))?;
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|x| e(x.to_string()))?;
    root.present().map_err(|x| e(x.to_string()))
}

/// Draws the charts into `dir`; returns their file names (those with data).
pub fn charts(compare: &Results, lab: Option<&Results>, dir: &Path) -> Result<Vec<String>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Read { path: dir.to_owned(), source })?;
    let mut out = Vec::new();
    let tp = throughput_series(compare, lab)?;
    if !tp.is_empty() {
        draw_throughput(&dir.join("udp_throughput.svg"), &tp)?;
        out.push("udp_throughput.svg".to_owned());
    }
    let lat = latency_series(compare, lab)?;
    if !lat.is_empty() {
        draw_latency(&dir.join("latency.svg"), &lat)?;
        out.push("latency.svg".to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn fixture() -> Results {
        let json = serde_json::from_str(include_str!("../fixtures/compare_ns_small.json")).unwrap();
        Results { path: "bench/fixtures/compare_ns_small.json".into(), json }
    }

    #[test]
    fn compare_table_rows_come_from_the_runs() {
        let t = compare_table(&fixture()).unwrap();
        let rows: Vec<&str> = t.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| system")).collect();
        assert_eq!(rows.len(), 4, "{t}");
        // sluice-af_packet: 5000 conn/s, 2000 connections per LB core-s (reference: 1.00 ×);
        // UDP: 50000 offered lost 0.5 % (counts), 100000 lost 10 % (does not).
        assert_eq!(
            rows[0],
            "| sluice-af_packet | 5000 | 150 / 900 / 2500 | 25.0 % | 2000 | 1.00 × | 49750 (50000) | 9950 | 40 / 0 | 0 / 20 |"
        );
        // nftables: half the connections per core: 0.500 ×; no UDP rate below 1 % loss.
        assert_eq!(
            rows[1],
            "| nftables-jhash | 4000 | 200 / 1000 / 3000 | 4.00 % | 1000 | 0.500 × | none below 1 % loss | – | 13 / 27 | 0 / 20 |"
        );
        assert_eq!(rows[2], "| haproxy-tcp | 3000 | 300 / 2000 / 5000 | 50.0 % | 600 | 0.300 × | n/a: no UDP | – | 40 / 0 | 20 / 0 |");
        assert_eq!(rows[3], "| ipvs-mh | skipped: no IPVS here | | | | | | | | |");
        assert!(t.contains("From `bench/fixtures/compare_ns_small.json`, written by `bench/compare_ns.sh` on Test CPU, 2 cores"), "{t}");
        assert!(t.contains("load average 1.50 1.20 1.00"), "{t}");
    }

    #[test]
    fn lab_table_lists_every_run() {
        let lab = Results {
            path: "bench/results/lab.json".into(),
            json: serde_json::json!({"bench": "lab", "command": "bench/lab.sh", "machine": {}, "runs": [
                {"system": "sluice", "mode": "memif", "offered_pps": 1_000_000, "delivered_pps": 999_000, "lost": 1000,
                 "latency_us": {"p50": 12, "p99": 40.5, "p999": 80},
                 "worker_latency_us": {"p50": 1.5, "p99": 6, "p999": 20, "max": 90, "packets": 999_000}, "cpu_pct": 100},
                {"system": "sluice-gen", "mode": "txonly", "offered_pps": 30_000_000, "delivered_pps": 30_000_000, "lost": 0,
                 "latency_us": null, "cpu_pct": 100},
                {"system": "testpmd", "mode": "txonly", "skipped": "not built"}
            ]}),
        };
        let t = lab_table(&lab).unwrap();
        assert!(t.contains("| sluice | memif | 1000000 | 999000 | 1000 | 12 / 40.5 / 80 | 1.50 / 6 / 20 | 100 % |"), "{t}");
        assert!(t.contains("| sluice-gen | txonly | 30000000 | 30000000 | 0 | – | – | 100 % |"), "{t}");
        assert!(t.contains("| testpmd | txonly | skipped: not built |"), "{t}");
        assert!(t.contains("written by `bench/lab.sh`"), "{t}");
    }

    #[test]
    fn splice_replaces_only_between_the_markers() {
        let readme = format!("# T\n\nbefore\n{BEGIN}\nold\n{END}\nafter\n");
        let out = splice(&readme, "\nnew\n").unwrap();
        assert_eq!(out, format!("# T\n\nbefore\n{BEGIN}\nnew\n{END}\nafter\n"));
        // Idempotent.
        assert_eq!(splice(&out, "\nnew\n").unwrap(), out);
        assert!(matches!(splice("# T\n", "x"), Err(ReportError::Markers(_))));
        assert!(matches!(splice(&format!("{END}{BEGIN}"), "x"), Err(ReportError::Markers(_))));
        assert!(matches!(splice(&format!("{BEGIN}{END}{BEGIN}{END}"), "x"), Err(ReportError::Markers(_))));
    }

    #[test]
    fn missing_runs_is_an_error() {
        let r = Results { path: "x.json".into(), json: serde_json::json!({"bench": "x"}) };
        assert!(matches!(compare_table(&r), Err(ReportError::Format { .. })));
    }

    #[test]
    fn charts_are_svg_with_every_system() {
        let dir = std::env::temp_dir().join(format!("sluice-report-test-{}", std::process::id()));
        let names = charts(&fixture(), None, &dir).unwrap();
        assert_eq!(names, ["udp_throughput.svg", "latency.svg"]);
        let svg = std::fs::read_to_string(dir.join("udp_throughput.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("sluice-af_packet") && svg.contains("nftables-jhash"));
        assert!(!svg.contains("haproxy-tcp"), "no UDP runs, no line");
        let svg = std::fs::read_to_string(dir.join("latency.svg")).unwrap();
        assert!(svg.contains("haproxy-tcp tcp_crr"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn numbers() {
        assert_eq!(num(123456.7), "123457");
        assert_eq!(num(42.26), "42.3");
        assert_eq!(num(4.0), "4.00");
        assert_eq!(num(0.5), "0.500");
        assert_eq!(num(0.0), "0");
        assert_eq!(num(f64::NAN), "?");
    }
}
