//! A real Prometheus (Debian's package) scraping an appliance in its
//! namespace, and the dashboard's queries as Grafana would send them.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::topology::Topology;
use crate::{wait_until, Proc};

/// Where Prometheus listens, in the appliance's namespace.
pub const LISTEN: &str = "127.0.0.1:9099";

/// Every query of a dashboard: `panels[].targets[].expr`, rows' panels
/// included.
pub fn dashboard_queries(d: &Value) -> Vec<String> {
    fn walk(panels: &Value, out: &mut Vec<String>) {
        for p in panels.as_array().into_iter().flatten() {
            for t in p["targets"].as_array().into_iter().flatten() {
                out.push(t["expr"].as_str().unwrap_or_else(|| panic!("a target without an expr in panel {}", p["title"])).to_owned());
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&d["panels"], &mut out);
    out
}

/// The query of the dashboard's panel titled `title` (its first target).
pub fn panel_query(d: &Value, title: &str) -> String {
    let panels = d["panels"].as_array().expect("panels");
    let p = panels.iter().find(|p| p["title"] == title).unwrap_or_else(|| panic!("no panel {title:?} in the dashboard"));
    p["targets"][0]["expr"].as_str().expect("an expr").to_owned()
}

/// A dashboard query as Grafana would send it with every appliance
/// chosen: its variables replaced by their values.
pub fn as_sent(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
}

/// Prometheus' answer to the instant query `q` (its `data`), or the error.
pub fn query(topo: &Topology, q: &str) -> Result<Value, String> {
    let url = format!("http://{LISTEN}/api/v1/query");
    let arg = format!("query={q}");
    let v = topo.json("lb", &["curl", "-sS", "-G", "--data-urlencode", &arg, &url]);
    if v["status"] == "success" {
        Ok(v["data"].clone())
    } else {
        Err(format!("{q}: {v}"))
    }
}

/// The value of each series of an instant query's `data`, by the value of
/// its label `label`.
pub fn values_by(data: &Value, label: &str) -> Vec<(String, f64)> {
    data["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let v = r["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
            (r["metric"][label].as_str().unwrap_or("").to_owned(), v)
        })
        .collect()
}

/// Prometheus in the namespace `lb` of `topo`, its data in `dir`, scraping
/// the appliance's admin endpoint (127.0.0.1:9091) every second with the
/// rules of `rules` loaded; returned once it has scraped it.
pub fn start(topo: &Topology, dir: &Path, rules: Option<&Path>) -> Proc {
    let cfg = dir.join("prometheus.yml");
    let rule_files = rules.map_or_else(String::new, |r| format!("rule_files: [{}]\n", r.display()));
    std::fs::write(
        &cfg,
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n{rule_files}scrape_configs:\n  - job_name: sluice\n    static_configs: [{{targets: ['127.0.0.1:9091']}}]\n"
        ),
    )
    .unwrap();
    let data = dir.join("tsdb");
    let mut prometheus = topo.spawn(
        "lb",
        &[
            "prometheus",
            &format!("--config.file={}", cfg.display()),
            &format!("--storage.tsdb.path={}", data.display()),
            &format!("--web.listen-address={LISTEN}"),
        ],
    );
    let scraping = wait_until(Duration::from_secs(30), || {
        query(topo, "up{job=\"sluice\"}").is_ok_and(|d| d["result"].as_array().is_some_and(|r| r.len() == 1 && r[0]["value"][1] == "1"))
    });
    if !scraping {
        let (_, _, err) = prometheus.stop("TERM", Duration::from_secs(5));
        panic!("Prometheus does not scrape the appliance:\n{err}");
    }
    prometheus
}
