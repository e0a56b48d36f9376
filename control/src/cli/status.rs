//! `sluice status`: the running appliance's `/status`, as tables.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use sluice_admin_api as api;

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
    pub(crate) admin: SocketAddr,
    /// Print the raw JSON instead of tables.
    #[arg(long)]
    pub(crate) json: bool,
    /// Only this service: its routes and its endpoints.
    #[arg(long, value_name = "NAME")]
    pub(crate) service: Option<String>,
    /// Most endpoints listed, or `all` (default: 1000, or all of --service's).
    #[arg(long, value_name = "N|all")]
    pub(crate) endpoints: Option<String>,
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
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
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

/// An optional value, or "-" when the appliance does not know it.
fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// The BIRD driver's part: BIRD itself, each BGP session and each VIP.
fn bird(o: &mut String, b: &api::bird::Bird) {
    let _ = writeln!(
        o,
        "bird: {} ({}, pid {}) | {} | configured {} time(s), {} failure(s) | restarts {}{}",
        if b.connected { "answering" } else { "NOT ANSWERING" },
        b.mode,
        or_dash(b.pid),
        b.version,
        b.configured,
        b.configure_failures,
        b.restarts,
        b.last_exit.as_ref().map(|x| format!(" (last exit: {x})")).unwrap_or_default()
    );
    if let Some(e) = &b.error {
        let _ = writeln!(o, "  error: {e}");
    }
    let rows: Vec<Vec<String>> = b
        .sessions
        .iter()
        .map(|x| {
            let bfd = if x.bfd { x.bfd_state.clone().unwrap_or_else(|| "?".into()) } else { "off".into() };
            vec![x.router.clone(), x.neighbor.clone(), x.interface.clone(), x.bgp_state.clone(), bfd, x.since.clone(), x.info.clone()]
        })
        .collect();
    if !rows.is_empty() {
        table(o, &["ROUTER", "NEIGHBOR", "INTERFACE", "BGP", "BFD", "SINCE", "INFO"], &rows);
    }
    let rows: Vec<Vec<String>> = b
        .vips
        .iter()
        .map(|v| vec![v.vip.to_string(), if v.announced { "announced".into() } else { "withdrawn".into() }, v.reason.clone()])
        .collect();
    if !rows.is_empty() {
        table(o, &["VIP", "STATE", "REASON"], &rows);
    }
}

/// Renders a `/status` document.
pub(crate) fn render(st: &api::Status) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "sluice {} on {} | config {} | up {:.0}s | snapshot generation {} (last publish {:.2} ms)",
        st.version,
        st.dpdk,
        st.config,
        st.uptime_seconds,
        st.generation,
        st.publish_seconds * 1e3
    );
    let health = |ok: bool, why: &[String]| -> String {
        if ok {
            "yes".into()
        } else {
            format!("NO ({})", why.first().map_or("", String::as_str))
        }
    };
    let _ = writeln!(o, "healthy: {} | ready: {}", health(st.healthy, &st.not_healthy), health(st.ready, &st.not_ready));
    last_minute(&mut o, st.last_minute.as_ref());
    sources(&mut o, &st.sources);
    if let Some(x) = &st.xds {
        xds(&mut o, x);
    }
    if let Some(b) = &st.bird {
        bird(&mut o, b);
    }
    if let Some(k) = &st.kubernetes {
        kubernetes(&mut o, k);
    }
    if let Some(y) = &st.sync {
        sync(&mut o, y);
    }
    if let Some(h) = &st.health {
        if h.passive {
            passive_health(&mut o, h);
        }
        active_checks(&mut o, &h.checks);
    }
    let _ = writeln!(o, "mbufs in use: {} of {}\n\nPORTS", st.mbufs_in_use, st.mbufs);
    ports(&mut o, &st.ports);
    let _ = writeln!(o, "\nWORKERS");
    workers(&mut o, &st.workers);
    let _ = writeln!(o, "\nSERVICES");
    let rows: Vec<Vec<String>> = st
        .services
        .iter()
        .map(|v| {
            let ft = if v.flow_table { "+flows" } else { "" };
            let ready = if v.ready { "yes" } else { "NO" };
            vec![v.name.to_string(), format!("{}{ft}", v.algorithm), v.table_size.to_string(), ready.into(), v.packets.to_string(), v.bytes.to_string()]
        })
        .collect();
    table(&mut o, &["NAME", "ALGORITHM", "TABLE", "READY", "PACKETS", "BYTES"], &rows);
    let _ = writeln!(o, "\nENDPOINTS");
    endpoints(&mut o, st);
    if !st.drops.is_empty() {
        let _ = writeln!(o, "\nDROPS");
        let rows: Vec<Vec<String>> = st.drops.iter().map(|(reason, n)| vec![reason.clone(), n.to_string()]).collect();
        table(&mut o, &["REASON", "PACKETS"], &rows);
    }
    o
}

/// What came in, went out, was dropped and lost over the last minute.
fn last_minute(o: &mut String, m: Option<&api::LastMinute>) {
    let Some(m) = m else {
        let _ = writeln!(o, "last minute: not reported (the appliance is older than this sluice)");
        return;
    };
    if m.seconds <= 0.0 {
        let _ = writeln!(o, "last minute: no sample yet");
        return;
    }
    let reasons = if m.drops_by_reason.is_empty() {
        String::new()
    } else {
        format!(" ({})", m.drops_by_reason.iter().map(|(r, n)| format!("{r} {n}")).collect::<Vec<_>>().join(", "))
    };
    let _ = writeln!(
        o,
        "last {:.0} s: {} received, {} balanced, {} DROPPED{reasons}, {} LOST below DPDK, {} missed (no descriptor), {} without an mbuf",
        m.seconds, m.rx_packets, m.balanced, m.drops, m.lost_below_dpdk, m.rx_missed, m.rx_nombuf
    );
}

/// What became of each source's last state.
fn sources(o: &mut String, sources: &std::collections::BTreeMap<String, api::Source>) {
    for (name, src) in sources {
        if src.accepted {
            let shown = src.rebuilt.len();
            let count = src.rebuilt_count;
            let more = if count > shown { format!(" and {} more", count - shown) } else { String::new() };
            let names = serde_json::to_string(&src.rebuilt).unwrap_or_default();
            let _ = writeln!(o, "source {name}: applied ({}), rebuilt {count}: {names}{more}", src.trigger);
        } else {
            let _ = writeln!(o, "source {name}: REJECTED ({}), still serving its previous state:", src.trigger);
            for p in &src.problems {
                let _ = writeln!(o, "  {p}");
            }
        }
    }
}

/// The xDS source: the connection, what each type accepted, the NACKs.
fn xds(o: &mut String, x: &api::xds::Xds) {
    let ago = |t: Option<u64>| t.map_or_else(|| "never".to_owned(), |t| format!("{}s ago", crate::ground::now_epoch().saturating_sub(t)));
    let versions: Vec<String> = x
        .types
        .iter()
        .map(|(t, v)| format!("{} {} ({} resources)", t.rsplit('.').next().unwrap_or(t), v.version, v.resources))
        .collect();
    let _ = writeln!(
        o,
        "xds: {} {} ({}, {}) | {} services, {} endpoints | accepted: {} | last update {} | NACKs {}",
        x.state,
        x.server,
        x.mode,
        x.transport,
        x.services,
        x.endpoints,
        versions.join(", "),
        ago(x.last_update),
        x.nacks
    );
    if let Some(n) = &x.last_nack {
        let _ = writeln!(o, "  last NACK ({}): {}", ago(Some(n.at)), n.error);
    }
    if let Some(e) = &x.last_error {
        let _ = writeln!(o, "  last error ({}): {e}", ago(x.last_error_at));
    }
}

fn ports(o: &mut String, ports: &[api::Port]) {
    let rows: Vec<Vec<String>> = ports
        .iter()
        .map(|p| {
            let link = match p.link_up {
                Some(true) => "up",
                Some(false) => "down",
                None => "?",
            };
            let lost = &p.lost_below_dpdk;
            vec![
                p.name.clone(),
                p.device.clone(),
                p.mac.clone(),
                p.mtu.to_string(),
                link.into(),
                p.kernel_interface.clone(),
                p.rx_packets.to_string(),
                p.tx_packets.to_string(),
                // A lower bound while frames arrive: "at least".
                format!("{}{} ({})", if lost.exact { "" } else { ">=" }, lost.below_dpdk, lost.source),
                p.rx_nombuf.to_string(),
            ]
        })
        .collect();
    table(o, &["NAME", "DEVICE", "MAC", "MTU", "LINK", "KERNEL IF", "RX", "TX", "LOST BELOW DPDK", "NO MBUF"], &rows);
}

fn workers(o: &mut String, workers: &[api::Worker]) {
    let rows: Vec<Vec<String>> = workers
        .iter()
        .map(|w| {
            vec![
                w.lcore.to_string(),
                w.rx_packets.to_string(),
                w.tx_packets.to_string(),
                w.balanced.to_string(),
                w.returned.to_string(),
                w.exception.to_string(),
                w.drops.to_string(),
                format!("{:.1}%", w.busy_percent_recent),
                format!("{:.1}", w.packets_per_busy_poll),
                format!("{}/{}", w.steered_out, w.steered_in),
                w.generation.to_string(),
            ]
        })
        .collect();
    table(o, &["LCORE", "RX", "TX", "BALANCED", "RETURNED", "TO KERNEL", "DROPS", "BUSY", "PKTS/BUSY POLL", "STEERED OUT/IN", "GENERATION"], &rows);
}

/// The endpoints, each with its share of its service's packets, and how
/// many were left out.
fn endpoints(o: &mut String, st: &api::Status) {
    let totals: std::collections::HashMap<&str, u64> = st.services.iter().map(|v| (&*v.name, v.packets)).collect();
    let rows: Vec<Vec<String>> = st
        .endpoints
        .iter()
        .map(|e| {
            let total = totals.get(&*e.service).copied().unwrap_or(0);
            #[allow(clippy::cast_precision_loss)] // a share, to a tenth of a percent
            let share = if total > 0 { format!("{:.1}%", 100.0 * e.packets as f64 / total as f64) } else { "-".into() };
            let state = match &e.reason {
                Some(r) => format!("{} ({r})", e.state),
                None => e.state.to_string(),
            };
            vec![e.service.to_string(), e.id.to_string(), e.address.to_string(), or_dash(e.mac), state, e.packets.to_string(), share]
        })
        .collect();
    table(o, &["SERVICE", "ID", "ADDRESS", "MAC", "STATE", "PACKETS", "SHARE"], &rows);
    if st.endpoints_omitted > 0 {
        let _ = writeln!(
            o,
            "({} of {} endpoints not listed: --endpoints all lists them, --service NAME one service's)",
            st.endpoints_omitted, st.endpoints_total
        );
    }
}

/// The Kubernetes source: whether it reaches the API, what it watches,
/// what it serves or why not, and the objects it left out.
fn kubernetes(o: &mut String, k: &api::kubernetes::Kubernetes) {
    let when = |v: Option<u64>| v.map_or_else(|| "never".to_owned(), |t| format!("at {t} (epoch s)"));
    let conn = if k.connected {
        format!("connected to {}", k.server_version.as_deref().unwrap_or("a server of unknown version"))
    } else {
        "NOT CONNECTED".to_owned()
    };
    let _ = writeln!(o, "kubernetes: Gateway {}/{} | {conn} | last change {}", k.namespace, k.gateway, when(k.last_sync_at));
    if !k.synced {
        let _ = writeln!(o, "  not listed yet: {} (nothing from Kubernetes is served before)", k.waiting_for.join(", "));
    }
    let watched: Vec<String> = k.watched.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
    let _ = writeln!(o, "  watching: {}", watched.join(", "));
    let _ = writeln!(o, "  serving: {}", k.serving);
    if let Some(e) = &k.last_error {
        let _ = writeln!(o, "  last error {}: {e}", when(k.last_error_at));
    }
    for r in &k.refused {
        let _ = writeln!(o, "  left out {} ({}): {}", r.object, r.reason, r.message);
    }
}

/// Sibling sync: the pins held and taken, what went each way, what was
/// refused or dropped, and each sibling.
fn sync(o: &mut String, y: &api::sync::Sync) {
    let start = if y.settled {
        "settled".to_owned()
    } else {
        "WAITING for the siblings' pins".to_owned()
    };
    let _ = writeln!(
        o,
        "siblings: {start} | pins held {}, synced {} | sent {}, received {} | refused {}, rate-dropped {}, unknown {}, stale {}, overflows {}",
        y.pins_held, y.pins_synced, y.sent, y.received, y.refused, y.rate_dropped, y.unknown, y.stale, y.overflows
    );
    if !y.not_heard.is_empty() {
        let _ = writeln!(o, "  announced without the pins of: {}", y.not_heard.join(", "));
    }
    let a = &y.agreement;
    if a.mismatched > 0 {
        let gate = if a.gate { format!(", {} withdrawn (siblings.gate)", a.withdrawn) } else { String::new() };
        let _ = writeln!(
            o,
            "  TABLES DIFFER: {} of {} services differ on a sibling ({} in the minority here{gate})",
            a.mismatched, a.services, a.minority
        );
        for m in &a.services_mismatched {
            let _ = writeln!(o, "    {}{}", m.why, if m.withdrawn { "; its VIPs are WITHDRAWN" } else { "" });
        }
    } else if a.siblings_compared > 0 {
        let _ = writeln!(o, "  tables: all {} services agree with {} sibling(s)", a.services, a.siblings_compared);
    }
    let yes = |b: bool| if b { "yes" } else { "NO" }.to_owned();
    let rows: Vec<Vec<String>> = y
        .peers
        .iter()
        .map(|p| {
            let heard = p.last_heard_seconds.map_or_else(|| "never".to_owned(), |s| format!("{s:.1}s ago"));
            let tables = match p.digests {
                None => "-".to_owned(),
                Some(_) if p.mismatched == 0 => "agree".to_owned(),
                Some(_) => format!("{} DIFFER", p.mismatched),
            };
            vec![p.address.clone(), yes(p.connected), yes(p.in_sync), heard, yes(p.subscribed), p.lag.to_string(), tables]
        })
        .collect();
    if !rows.is_empty() {
        table(o, &["SIBLING", "CONNECTED", "IN SYNC", "LAST HEARD", "SUBSCRIBED", "LAG", "TABLES"], &rows);
    }
}

/// Passive health: its rule, then every endpoint a handshake was seen
/// with (out ones first).
fn passive_health(o: &mut String, h: &api::health::Health) {
    let out = h.endpoints.iter().filter(|e| e.state != "healthy").count();
    let _ = writeln!(
        o,
        "passive health: {out} of {} endpoints seen out or held | {} failed handshakes in a row take one out for {}s (doubling, at most {}s) | {} handshakes swept, {} discounted",
        h.endpoints.len(),
        h.fall,
        h.ejection_seconds,
        h.max_ejection_seconds,
        h.outcomes,
        h.discounted
    );
    let us = |v: Option<u32>| v.map_or_else(|| "-".to_owned(), |v| format!("{v}us"));
    let mut rows: Vec<(bool, Vec<String>)> = h
        .endpoints
        .iter()
        .map(|e| {
            let state = match e.back_in_seconds {
                Some(b) if e.state == "ejected" => format!("EJECTED, back in {b:.0}s"),
                _ if e.state == "held" => "HELD (limit)".to_owned(),
                _ => e.state.clone(),
            };
            let failed = e.reset + e.retransmitted + e.unanswered;
            let row = vec![e.service.clone(), e.id.to_string(), e.address.clone(), state, e.succeeded.to_string(), failed.to_string(), us(e.handshake_median_us), us(e.handshake_p90_us)];
            (e.state == "healthy", row)
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    if !rows.is_empty() {
        table(o, &["SERVICE", "ID", "ADDRESS", "STATE", "OK", "FAILED", "MEDIAN", "P90"], &rows.into_iter().map(|r| r.1).collect::<Vec<_>>());
    }
}

fn active_checks(o: &mut String, c: &api::health::Checks) {
    if c.endpoints.is_empty() {
        return;
    }
    let down = c.endpoints.iter().filter(|e| e.state != "up").count();
    let _ = writeln!(o, "active checks: {down} of {} endpoints down or held | {} run, {} failed, {} late, {} running (at most {})", c.endpoints.len(), c.run, c.failed, c.late, c.in_flight, c.max_in_flight);
    let mut rows: Vec<(bool, Vec<String>)> = c
        .endpoints
        .iter()
        .map(|e| {
            let state = match e.state.as_str() {
                "down" => "DOWN".to_owned(),
                "held" => "HELD (limit)".to_owned(),
                s => s.to_owned(),
            };
            let last = match (&e.last_error, e.last_ms) {
                (Some(err), _) if e.failures_in_a_row > 0 => err.clone(),
                (_, Some(ms)) => format!("{ms:.1}ms"),
                _ => "-".to_owned(),
            };
            let row = vec![e.service.clone(), e.id.to_string(), e.address.clone(), e.check.clone(), state, e.checks.to_string(), e.failures.to_string(), last];
            (e.state == "up", row)
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    table(o, &["SERVICE", "ID", "ADDRESS", "CHECK", "STATE", "CHECKS", "FAILED", "LAST"], &rows.into_iter().map(|r| r.1).collect::<Vec<_>>());
}

/// Runs `sluice status`.
pub fn run(args: &StatusArgs) -> Result<ExitCode> {
    let body = http_get(args.admin, &args.path())?;
    if args.json {
        println!("{body}");
        return Ok(ExitCode::SUCCESS);
    }
    let st: api::Status = serde_json::from_str(&body).context("the admin endpoint's /status is not the document this sluice reads")?;
    print!("{}", render(&st));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let st = api::Status { endpoints_total: 1200, endpoints_omitted: 200, ..Default::default() };
        assert!(render(&st).contains("(200 of 1200 endpoints not listed: --endpoints all lists them"), "{}", render(&st));
        let st = api::Status { endpoints_total: 3, endpoints_omitted: 0, ..Default::default() };
        assert!(!render(&st).contains("not listed"));
    }

    #[test]
    fn what_the_appliance_does_not_know_shows_as_a_dash_not_a_zero() {
        let endpoint = api::Endpoint {
            service: "web".into(),
            id: 1,
            address: "2001:db8::6".parse().unwrap(),
            weight: 1,
            mac: None,
            port: None,
            state: api::EndpointState::Unresolved,
            reason: None,
            packets: 0,
            bytes: 0,
        };
        let st = api::Status {
            ports: vec![api::Port { name: "p0".into(), link_up: None, ..Default::default() }],
            endpoints: vec![endpoint],
            bird: Some(api::bird::Bird { mode: "external".into(), pid: None, ..Default::default() }),
            ..Default::default()
        };
        let text = render(&st);
        assert!(text.contains("bird: NOT ANSWERING (external, pid -) |"), "{text}");
        let row = |first: &str| text.lines().find(|l| l.trim_start().starts_with(first)).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
        // NAME DEVICE MAC MTU LINK (empty device and MAC take no column).
        assert_eq!(row("p0")[..3], ["p0", "0", "?"], "{text}");
        assert_eq!(row("web"), ["web", "1", "2001:db8::6", "-", "unresolved", "0", "-"], "{text}");
    }

    #[test]
    fn the_last_minute_comes_second_with_drops_by_reason() {
        let mut st = api::Status { ready: true, healthy: true, ..api::Status::default() };
        st.last_minute = Some(api::LastMinute {
            seconds: 60.0,
            rx_packets: 60_000,
            balanced: 59_400,
            drops: 600,
            drops_by_reason: vec![("no_route".into(), 590), ("ttl_expired".into(), 10)],
            lost_below_dpdk: 6,
            rx_missed: 0,
            rx_nombuf: 0,
        });
        let text = render(&st);
        assert_eq!(
            text.lines().nth(2),
            Some("last 60 s: 60000 received, 59400 balanced, 600 DROPPED (no_route 590, ttl_expired 10), 6 LOST below DPDK, 0 missed (no descriptor), 0 without an mbuf"),
            "{text}"
        );
        st.last_minute = None;
        assert!(render(&st).contains("last minute: not reported"), "an older appliance");
        st.last_minute = Some(api::LastMinute::default());
        assert!(render(&st).contains("last minute: no sample yet"));
    }

    #[test]
    fn a_document_without_a_field_is_an_error_not_a_zero() {
        let st: api::Status = api::Status::default();
        let mut v = serde_json::to_value(st).unwrap();
        v.as_object_mut().unwrap().remove("mbufs_in_use");
        let e = serde_json::from_value::<api::Status>(v).unwrap_err();
        assert!(e.to_string().contains("missing field `mbufs_in_use`"), "{e}");
    }

    #[test]
    fn siblings_are_shown_with_their_lag_and_who_was_not_heard() {
        let y = api::sync::Sync {
            pins_held: 12,
            settled: true,
            not_heard: vec!["10.99.0.3:7946".into()],
            peers: vec![
                api::sync::Peer {
                    address: "10.99.0.2:7946".into(),
                    connected: true,
                    in_sync: true,
                    last_heard_seconds: Some(0.4),
                    subscribed: true,
                    lag: 3,
                    digests: Some(2),
                    mismatched: 1,
                    health: Some(0),
                },
                api::sync::Peer { address: "10.99.0.3:7946".into(), ..Default::default() },
            ],
            agreement: api::sync::Agreement {
                services: 2,
                siblings_compared: 1,
                mismatched: 1,
                minority: 1,
                gate: true,
                withdrawn: 1,
                services_mismatched: vec![api::sync::Mismatch { service: "web".into(), why: "service web's table (0123) differs".into(), withdrawn: true, ..Default::default() }],
            },
            ..Default::default()
        };
        let mut o = String::new();
        sync(&mut o, &y);
        assert!(o.starts_with("siblings: settled | pins held 12, synced 0 |"), "{o}");
        assert!(o.contains("  announced without the pins of: 10.99.0.3:7946\n"), "{o}");
        let row = |addr: &str| o.lines().find(|l| l.trim_start().starts_with(addr)).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
        assert_eq!(row("10.99.0.2:7946"), ["10.99.0.2:7946", "yes", "yes", "0.4s", "ago", "yes", "3", "1", "DIFFER"]);
        assert_eq!(row("10.99.0.3:7946"), ["10.99.0.3:7946", "NO", "NO", "never", "NO", "0", "-"]);
        assert!(o.contains("  TABLES DIFFER: 1 of 2 services differ on a sibling (1 in the minority here, 1 withdrawn (siblings.gate))\n"), "{o}");
        assert!(o.contains("    service web's table (0123) differs; its VIPs are WITHDRAWN\n"), "{o}");
    }

    #[test]
    fn the_kubernetes_source_is_shown_with_why_nothing_is_served() {
        let mut k = api::kubernetes::Kubernetes { gateway: "sllb-a".into(), namespace: "tenant-a".into(), ..Default::default() };
        k.waiting_for = vec!["Gateway".into(), "L34Route".into()];
        k.last_error = Some("reaching the API server: connection refused".into());
        k.last_error_at = Some(1_700_000_000);
        k.serving = "nothing from Kubernetes yet: waiting for the first list of every kind".into();
        let mut o = String::new();
        kubernetes(&mut o, &k);
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
        k.refused = vec![api::kubernetes::Refused { object: "kubernetes: L34Route/tenant-a/r".into(), reason: "Conflicted".into(), message: "why".into() }];
        let mut o = String::new();
        kubernetes(&mut o, &k);
        assert!(o.starts_with("kubernetes: Gateway tenant-a/sllb-a | connected to v1.32.0 |"), "{o}");
        assert!(o.contains("  watching: 1 Gateway, 3 L34Route\n") && o.contains("  left out kubernetes: L34Route/tenant-a/r (Conflicted): why\n"), "{o}");
        k.server_version = None;
        let mut o = String::new();
        kubernetes(&mut o, &k);
        assert!(o.starts_with("kubernetes: Gateway tenant-a/sllb-a | connected to a server of unknown version |"), "{o}");
    }
}
