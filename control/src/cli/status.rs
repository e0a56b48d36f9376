//! `sluice status`: the running appliance's `/status`, as tables.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Show what a running appliance is doing.
///
/// Reads /status from the admin endpoint and prints ports, workers,
/// services, endpoints (with each one's share of its service's packets)
/// and drops. Endpoints are listed up to --endpoints (1000 unless said);
/// --service shows one service, its routes and all its endpoints.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// Admin endpoint of the appliance (admin.listen in its configuration).
    #[arg(long, default_value = "127.0.0.1:9091")]
    pub admin: SocketAddr,
    /// Print the raw JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Only this service: its routes and its endpoints.
    #[arg(long, value_name = "NAME")]
    pub service: Option<String>,
    /// Most endpoints listed, or `all` (default: 1000, or all of --service's).
    #[arg(long, value_name = "N|all")]
    pub endpoints: Option<String>,
}

impl StatusArgs {
    /// The `/status` path with these arguments' query.
    fn path(&self) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        if let Some(s) = &self.service {
            q.append_pair("service", s);
        }
        // One service's endpoints are all listed unless a limit is given.
        if let Some(n) = self.endpoints.as_deref().or(self.service.as_ref().map(|_| "all")) {
            q.append_pair("endpoints", n);
        }
        let q = q.finish();
        if q.is_empty() { "/status".into() } else { format!("/status?{q}") }
    }
}

/// GETs `path` from `addr` (HTTP/1.0) and returns the body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .with_context(|| format!("cannot reach the admin endpoint at {addr}: is `sluice run` running there?"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let Some((head, body)) = buf.split_once("\r\n\r\n") else { bail!("malformed HTTP answer from {addr}") };
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("{addr} answered: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_owned())
}

fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |out: &mut String, cells: Vec<String>| {
        let s: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<width$}", width = w[i])).collect();
        let _ = writeln!(out, "  {}", s.join("  ").trim_end());
    };
    line(out, header.iter().map(|h| (*h).to_owned()).collect());
    for r in rows {
        line(out, r.clone());
    }
}

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The BIRD driver's part: BIRD itself, each BGP session and each VIP.
fn bird(o: &mut String, b: &Value) {
    if !b.is_object() {
        return;
    }
    let _ = writeln!(
        o,
        "bird: {} ({}, pid {}) | {} | configured {} time(s), {} failure(s) | restarts {}{}",
        if b["connected"].as_bool().unwrap_or(false) { "answering" } else { "NOT ANSWERING" },
        s(&b["mode"]),
        s(&b["pid"]),
        s(&b["version"]),
        b["configured"],
        b["configure_failures"],
        b["restarts"],
        b["last_exit"].as_str().map(|x| format!(" (last exit: {x})")).unwrap_or_default()
    );
    if let Some(e) = b["error"].as_str() {
        let _ = writeln!(o, "  error: {e}");
    }
    let rows: Vec<Vec<String>> = b["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| {
            let bfd = if x["bfd"].as_bool().unwrap_or(false) { x["bfd_state"].as_str().unwrap_or("?").to_owned() } else { "off".into() };
            vec![s(&x["router"]), s(&x["neighbor"]), s(&x["interface"]), s(&x["bgp_state"]), bfd, s(&x["since"]), s(&x["info"])]
        })
        .collect();
    if !rows.is_empty() {
        table(o, &["ROUTER", "NEIGHBOR", "INTERFACE", "BGP", "BFD", "SINCE", "INFO"], &rows);
    }
    let rows: Vec<Vec<String>> = b["vips"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| vec![s(&v["vip"]), if v["announced"].as_bool().unwrap_or(false) { "announced".into() } else { "withdrawn".into() }, s(&v["reason"])])
        .collect();
    if !rows.is_empty() {
        table(o, &["VIP", "STATE", "REASON"], &rows);
    }
}

/// Renders a `/status` document.
pub fn render(st: &Value) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "sluice {} on {} | config {} | up {:.0}s | snapshot generation {} (last publish {:.2} ms)",
        s(&st["version"]),
        s(&st["dpdk"]),
        s(&st["config"]),
        st["uptime_seconds"].as_f64().unwrap_or(0.0),
        st["generation"],
        st["publish_seconds"].as_f64().unwrap_or(0.0) * 1e3
    );
    let health = |ok: &Value, why: &Value| -> String {
        if ok.as_bool().unwrap_or(false) {
            "yes".into()
        } else {
            let first = why.as_array().and_then(|a| a.first()).map(s).unwrap_or_default();
            format!("NO ({first})")
        }
    };
    let _ = writeln!(o, "healthy: {} | ready: {}", health(&st["healthy"], &st["not_healthy"]), health(&st["ready"], &st["not_ready"]));
    for (name, src) in st["sources"].as_object().into_iter().flatten() {
        if src["accepted"].as_bool().unwrap_or(false) {
            let shown = src["rebuilt"].as_array().map_or(0, Vec::len);
            let count = src["rebuilt_count"].as_u64().and_then(|c| usize::try_from(c).ok()).unwrap_or(shown);
            let more = if count > shown { format!(" and {} more", count - shown) } else { String::new() };
            let _ = writeln!(o, "source {name}: applied ({}), rebuilt {count}: {}{more}", s(&src["trigger"]), src["rebuilt"]);
        } else {
            let _ = writeln!(o, "source {name}: REJECTED ({}), still serving its previous state:", s(&src["trigger"]));
            for p in src["problems"].as_array().into_iter().flatten() {
                let _ = writeln!(o, "  {}", s(p));
            }
        }
    }
    let x = &st["xds"];
    if x.is_object() {
        let ago = |t: &Value| t.as_u64().map_or_else(|| "never".to_owned(), |t| format!("{}s ago", crate::ground::now_epoch().saturating_sub(t)));
        let versions: Vec<String> = x["types"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(t, v)| format!("{} {} ({} resources)", t.rsplit('.').next().unwrap_or(t), s(&v["version"]), v["resources"]))
            .collect();
        let _ = writeln!(
            o,
            "xds: {} {} ({}, {}) | {} services, {} endpoints | accepted: {} | last update {} | NACKs {}",
            s(&x["state"]),
            s(&x["server"]),
            s(&x["mode"]),
            s(&x["transport"]),
            x["services"],
            x["endpoints"],
            versions.join(", "),
            ago(&x["last_update"]),
            x["nacks"]
        );
        if let Some(n) = x["last_nack"].as_object() {
            let _ = writeln!(o, "  last NACK ({}): {}", ago(&n["at"]), n["error"].as_str().unwrap_or(""));
        }
        if let Some(e) = x["last_error"].as_str() {
            let _ = writeln!(o, "  last error ({}): {e}", ago(&x["last_error_at"]));
        }
    }
    bird(&mut o, &st["bird"]);
    if st["kubernetes"].is_object() {
        kubernetes(&mut o, &st["kubernetes"]);
    }
    let _ = writeln!(o, "mbufs in use: {} of {}\n\nPORTS", st["mbufs_in_use"], st["mbufs"]);
    let rows: Vec<Vec<String>> = st["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let link = match p["link_up"].as_bool() {
                Some(true) => "up",
                Some(false) => "down",
                None => "?",
            };
            let lost = &p["lost_below_dpdk"];
            vec![
                s(&p["name"]),
                s(&p["device"]),
                s(&p["mac"]),
                s(&p["mtu"]),
                link.into(),
                s(&p["kernel_interface"]),
                s(&p["rx_packets"]),
                s(&p["tx_packets"]),
                // A lower bound while frames arrive: "at least".
                format!("{}{} ({})", if lost["exact"] == false { ">=" } else { "" }, s(&lost["below_dpdk"]), s(&lost["source"])),
                s(&p["rx_nombuf"]),
            ]
        })
        .collect();
    table(&mut o, &["NAME", "DEVICE", "MAC", "MTU", "LINK", "KERNEL IF", "RX", "TX", "LOST BELOW DPDK", "NO MBUF"], &rows);
    let _ = writeln!(o, "\nWORKERS");
    let rows: Vec<Vec<String>> = st["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let f1 = |v: &Value| format!("{:.1}", v.as_f64().unwrap_or(0.0));
            vec![
                s(&w["lcore"]),
                s(&w["rx_packets"]),
                s(&w["tx_packets"]),
                s(&w["balanced"]),
                s(&w["returned"]),
                s(&w["exception"]),
                s(&w["drops"]),
                format!("{}%", f1(&w["busy_percent_recent"])),
                f1(&w["packets_per_busy_poll"]),
                format!("{}/{}", s(&w["steered_out"]), s(&w["steered_in"])),
                s(&w["generation"]),
            ]
        })
        .collect();
    table(
        &mut o,
        &["LCORE", "RX", "TX", "BALANCED", "RETURNED", "TO KERNEL", "DROPS", "BUSY", "PKTS/BUSY POLL", "STEERED OUT/IN", "GENERATION"],
        &rows,
    );
    let _ = writeln!(o, "\nSERVICES");
    let rows: Vec<Vec<String>> = st["services"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            let ft = if v["flow_table"].as_bool().unwrap_or(false) { "+flows" } else { "" };
            vec![s(&v["name"]), format!("{}{ft}", s(&v["algorithm"])), s(&v["table_size"]), if v["ready"].as_bool().unwrap_or(false) { "yes".into() } else { "NO".into() }, s(&v["packets"]), s(&v["bytes"])]
        })
        .collect();
    table(&mut o, &["NAME", "ALGORITHM", "TABLE", "READY", "PACKETS", "BYTES"], &rows);
    let _ = writeln!(o, "\nENDPOINTS");
    let totals: std::collections::HashMap<String, f64> = st["services"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| (s(&v["name"]), v["packets"].as_f64().unwrap_or(0.0)))
        .collect();
    let rows: Vec<Vec<String>> = st["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let total = totals.get(&s(&e["service"])).copied().unwrap_or(0.0);
            let pk = e["packets"].as_f64().unwrap_or(0.0);
            let share = if total > 0.0 { format!("{:.1}%", 100.0 * pk / total) } else { "-".into() };
            let state = match e["reason"].as_str() {
                Some(r) => format!("{} ({r})", s(&e["state"])),
                None => s(&e["state"]),
            };
            vec![s(&e["service"]), s(&e["id"]), s(&e["address"]), s(&e["mac"]), state, s(&e["packets"]), share]
        })
        .collect();
    table(&mut o, &["SERVICE", "ID", "ADDRESS", "MAC", "STATE", "PACKETS", "SHARE"], &rows);
    if let Some(n) = st["endpoints_omitted"].as_u64().filter(|&n| n > 0) {
        let _ = writeln!(o, "({n} of {} endpoints not listed: --endpoints all lists them, --service NAME one service's)", s(&st["endpoints_total"]));
    }
    let drops = st["drops"].as_array().cloned().unwrap_or_default();
    if !drops.is_empty() {
        let _ = writeln!(o, "\nDROPS");
        let rows: Vec<Vec<String>> = drops.iter().map(|d| vec![s(&d[0]), s(&d[1])]).collect();
        table(&mut o, &["REASON", "PACKETS"], &rows);
    }
    o
}

/// The Kubernetes source ([`crate::sources::kube::KubeStatus`]): whether
/// it reaches the API, what it watches, what it serves or why not, and
/// the objects it left out.
fn kubernetes(o: &mut String, k: &Value) {
    let when = |v: &Value| v.as_u64().map_or_else(|| "never".to_owned(), |t| format!("at {t} (epoch s)"));
    let conn = if k["connected"].as_bool().unwrap_or(false) {
        format!("connected to {}", s(&k["server_version"]))
    } else {
        "NOT CONNECTED".to_owned()
    };
    let _ = writeln!(o, "kubernetes: Gateway {}/{} | {conn} | last change {}", s(&k["namespace"]), s(&k["gateway"]), when(&k["last_sync_at"]));
    if !k["synced"].as_bool().unwrap_or(false) {
        let waiting: Vec<String> = k["waiting_for"].as_array().into_iter().flatten().map(s).collect();
        let _ = writeln!(o, "  not listed yet: {} (nothing from Kubernetes is served before)", waiting.join(", "));
    }
    let watched: Vec<String> = k["watched"].as_object().into_iter().flatten().map(|(kind, n)| format!("{n} {kind}")).collect();
    let _ = writeln!(o, "  watching: {}", watched.join(", "));
    let _ = writeln!(o, "  serving: {}", s(&k["serving"]));
    if !k["last_error"].is_null() {
        let _ = writeln!(o, "  last error {}: {}", when(&k["last_error_at"]), s(&k["last_error"]));
    }
    for r in k["refused"].as_array().into_iter().flatten() {
        let _ = writeln!(o, "  left out {} ({}): {}", s(&r["object"]), s(&r["reason"]), s(&r["message"]));
    }
}

/// Runs `sluice status`.
pub fn run(args: &StatusArgs) -> Result<ExitCode> {
    let body = http_get(args.admin, &args.path())?;
    if args.json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let v: Value = serde_json::from_str(&body).context("the admin endpoint answered something that is not JSON")?;
    print!("{}", render(&v));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::kube::{KubeStatus, RefusedObject};

    #[test]
    fn the_arguments_make_the_query() {
        let args = |service: Option<&str>, endpoints: Option<&str>| StatusArgs {
            admin: "127.0.0.1:9091".parse().unwrap(),
            json: false,
            service: service.map(str::to_owned),
            endpoints: endpoints.map(str::to_owned),
        };
        assert_eq!(args(None, None).path(), "/status");
        assert_eq!(args(None, Some("all")).path(), "/status?endpoints=all");
        assert_eq!(args(Some("web"), None).path(), "/status?service=web&endpoints=all");
        assert_eq!(args(Some("ns/a b"), Some("10")).path(), "/status?service=ns%2Fa+b&endpoints=10");
    }

    #[test]
    fn endpoints_left_out_are_counted_under_the_table() {
        let st = serde_json::json!({"endpoints": [], "endpoints_total": 1200, "endpoints_omitted": 200});
        assert!(render(&st).contains("(200 of 1200 endpoints not listed: --endpoints all lists them"), "{}", render(&st));
        let st = serde_json::json!({"endpoints": [], "endpoints_total": 3, "endpoints_omitted": 0});
        assert!(!render(&st).contains("not listed"));
    }

    #[test]
    fn the_kubernetes_source_is_shown_with_why_nothing_is_served() {
        let mut k = KubeStatus { gateway: "sllb-a".into(), namespace: "tenant-a".into(), ..Default::default() };
        k.waiting_for = vec!["Gateway".into(), "L34Route".into()];
        k.last_error = Some("reaching the API server: connection refused".into());
        k.last_error_at = Some(1_700_000_000);
        k.serving = "nothing from Kubernetes yet: waiting for the first list of every kind".into();
        let mut o = String::new();
        kubernetes(&mut o, &serde_json::to_value(&k).unwrap());
        assert_eq!(o, "kubernetes: Gateway tenant-a/sllb-a | NOT CONNECTED | last change never\n  \
                       not listed yet: Gateway, L34Route (nothing from Kubernetes is served before)\n  \
                       watching: \n  \
                       serving: nothing from Kubernetes yet: waiting for the first list of every kind\n  \
                       last error at 1700000000 (epoch s): reaching the API server: connection refused\n");
        k.connected = true;
        k.synced = true;
        k.server_version = Some("v1.32.0".into());
        k.watched = [("Gateway".to_owned(), 1), ("L34Route".to_owned(), 3)].into_iter().collect();
        k.last_error = None;
        k.refused = vec![RefusedObject { object: "kubernetes: L34Route/tenant-a/r".into(), reason: "Conflicted".into(), message: "why".into() }];
        let mut o = String::new();
        kubernetes(&mut o, &serde_json::to_value(&k).unwrap());
        assert!(o.starts_with("kubernetes: Gateway tenant-a/sllb-a | connected to v1.32.0 |"), "{o}");
        assert!(o.contains("  watching: 1 Gateway, 3 L34Route\n") && o.contains("  left out kubernetes: L34Route/tenant-a/r (Conflicted): why\n"), "{o}");
    }
}
