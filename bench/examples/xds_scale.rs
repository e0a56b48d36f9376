//! xDS at scale, against a real `sluice run` (bench/xds_scale.sh runs it):
//!
//! 1. time from the management server sending N clusters × E endpoints to
//!    the snapshot being live (from `set_snapshot`, and from the server
//!    handing the clusters to its stream) (the admin endpoint's `/explain` of a flow to
//!    the last cluster's VIP names its service: the workers' snapshot has
//!    it), with the first cluster checked too;
//! 2. resident memory of the appliance before, at the moment the last
//!    cluster is live, and 2 s later (once a heap release has run); and
//!    again right after the single changes below, and 2 s after them;
//! 3. K single-endpoint changes, one after the other: from the server
//!    having it (`set_snapshot`) to `/tables/<service>` showing the new
//!    endpoint (p50, p99, max with hdrhistogram); from the server handing
//!    the response to its stream to the same (without the test server's
//!    diff of its whole snapshot, done on the appliance's core here); and
//!    what the appliance itself measures from the response's arrival to
//!    its publication (`xds.to_live` in /status); and from the server
//!    handing the response to its stream to the appliance publishing the
//!    snapshot that holds it (the time of its "snapshot published" log
//!    line, on the same wall clock: without the 1 ms polling of
//!    `/tables` and the admin endpoint's answer);
//! 4. the same K changes applied as a file edit, as a baseline measured in
//!    the same run: the ratio xDS / file says what the xDS path adds.
//!
//! The server is the test management server (`sluice_tests::xds_server`,
//! go-control-plane's snapshot-cache semantics) in this process; the
//! appliance runs on `net_null` ports with endpoints behind a gateway.
//! By default the worker is busy on frames `net_null` makes up
//! (`--ports traffic`), so the server shares a core with the appliance's
//! control thread; with `--ports idle` the ports receive nothing, the
//! worker pauses and its core is free for the server, which a deployment
//! runs elsewhere. The time to live is bounded by the appliance's own
//! compile either way, not by the server's share of a core.
//!
//! `XDS_SCALE_LOG=FILE` keeps the appliances' logs (each publication's
//! compile and publish times) in FILE (else they go to a file in a
//! temporary directory).
//!
//! ```text
//! cargo run --release -p sluice-bench --example xds_scale -- \
//!     --sluice target/release/sluice [--clusters 10000] [--endpoints 10] \
//!     [--changes 200] [--mode sotw|delta] [--ports idle|traffic] \
//!     [--out bench/results/xds_scale.json]
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use sluice_tests::xds_server::{assignment, Snapshot, XdsServer, CLA_TYPE, CLUSTER_TYPE, DEFAULT_NODE};

struct Args {
    sluice: PathBuf,
    clusters: usize,
    endpoints: usize,
    changes: usize,
    mode: String,
    /// What the appliance's ports receive: `idle` (nothing: its worker
    /// pauses, as an appliance's does without traffic, and leaves its core
    /// to this process's management server, which in a deployment runs on
    /// another machine) or `traffic` (`net_null` hands the worker frames
    /// without end: its core is busy, and the server, this process and the
    /// appliance's control thread share the other one).
    ports: String,
    out: Option<PathBuf>,
}

fn args() -> Args {
    let mut a = Args { sluice: "target/release/sluice".into(), clusters: 10_000, endpoints: 10, changes: 200, mode: "sotw".into(), ports: "traffic".into(), out: None };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--sluice" => a.sluice = v.into(),
            "--clusters" => a.clusters = v.parse().expect("--clusters"),
            "--endpoints" => a.endpoints = v.parse().expect("--endpoints"),
            "--changes" => a.changes = v.parse().expect("--changes"),
            "--mode" => a.mode = v,
            "--ports" => a.ports = v,
            "--out" => a.out = Some(v.into()),
            _ => panic!("unknown argument {k}"),
        }
    }
    assert!(a.ports == "idle" || a.ports == "traffic", "--ports is idle or traffic, not {:?}", a.ports);
    assert!(a.clusters >= 1 && a.clusters < 1 << 20 && a.endpoints >= 1 && a.endpoints <= 32);
    a
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET from the admin endpoint: the body when 200.
fn get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8(buf).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_owned())
}

fn json_at(port: u16, path: &str) -> Value {
    get(port, path).and_then(|b| serde_json::from_str(&b).ok()).unwrap_or(Value::Null)
}

/// Polls `f` every 200 µs until it holds (or 120 s pass): the time it took.
fn until(what: &str, f: impl FnMut() -> bool) -> Duration {
    until_every(what, Duration::from_micros(200), f)
}

/// Polls `f` every `every` until it holds (or 120 s pass). The appliance's
/// control thread shares a core with this process here: polling faster
/// than the admin endpoint answers would measure the polling.
fn until_every(what: &str, every: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(120), "{what}: not within 120 s");
        std::thread::sleep(every);
    }
    t0.elapsed()
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
}

fn vip(i: usize) -> String {
    let n = 0x1500_0001_u32 + i as u32; // 21.0.0.1 and up
    std::net::Ipv4Addr::from(n).to_string()
}

fn endpoint(i: usize, j: usize) -> String {
    let n = 0x0a40_0001_u32 + (i * 32 + j) as u32; // 10.64.0.1 and up
    std::net::Ipv4Addr::from(n).to_string()
}

fn cluster_json(i: usize) -> Value {
    json!({
        "name": format!("svc{i}"), "type": "EDS", "lb_policy": "MAGLEV",
        "eds_cluster_config": {"service_name": format!("svc{i}")},
        "metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": vip(i), "port": 80, "protocol": "TCP", "delivery": "ipip"}}}
    })
}

fn cla_json(i: usize, addrs: &[String]) -> Value {
    let lb: Vec<Value> = addrs.iter().map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a, "port_value": 80}}}})).collect();
    json!({"cluster_name": format!("svc{i}"), "endpoints": [{"lb_endpoints": lb}]})
}

const HEAD: &str = r#"
dpdk: {lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: FILEPREFIX, mbufs: 2047, descriptors: 256}
ports:
  - {name: a, device: "net_null0DEVARGS", addresses: [10.1.0.1/24], kernelInterface: ""}
  - {name: b, device: "net_null1DEVARGS", addresses: [10.2.0.1/24], kernelInterface: ""}
gateways:
  - {address: 10.1.0.254, port: a, mac: "02:00:00:00:01:fe"}
admin: {listen: "127.0.0.1:ADMIN"}
capacity: {services: 16384, endpoints: 262144}
"#;

struct Appliance {
    child: Child,
}

/// The configuration's head for the appliance named `prefix`.
fn config_head(a: &Args, prefix: &str, admin: u16) -> String {
    let devargs = if a.ports == "idle" { ",no-rx=1" } else { "" };
    HEAD.replace("FILEPREFIX", &format!("{prefix}{}", std::process::id())).replace("ADMIN", &admin.to_string()).replace("DEVARGS", devargs)
}

/// The appliances' log: the file named by `XDS_SCALE_LOG`, else `default`.
fn log_path(default: &Path) -> PathBuf {
    std::env::var_os("XDS_SCALE_LOG").map_or_else(|| default.to_owned(), PathBuf::from)
}

impl Appliance {
    /// Starts `sluice run`, its log appended to `log`.
    fn start(sluice: &Path, cfg: &Path, admin: u16, log: &Path) -> Appliance {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open the appliance's log");
        let child = Command::new(sluice)
            .args(["run", "--config", cfg.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start sluice run");
        let a = Appliance { child };
        until("the admin endpoint answers", || get(admin, "/healthz").is_some());
        a
    }
}

impl Drop for Appliance {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Microseconds since the Unix epoch of a log line's timestamp
/// (`2026-11-26T13:33:10.493519Z`, UTC, as `tracing` writes it).
fn log_time_us(line: &str) -> Option<i64> {
    let t = line.get(..27)?;
    let n = |a: usize, b: usize| t.get(a..b)?.parse::<i64>().ok();
    let (y, m, d) = (n(0, 4)?, n(5, 7)?, n(8, 10)?);
    let (hh, mm, ss, us) = (n(11, 13)?, n(14, 16)?, n(17, 19)?, n(20, 26)?);
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + us)
}

/// When the appliance published the snapshot made for each xDS version of
/// the assignments, from its log: version -> microseconds since the epoch.
fn published_at(log: &str) -> std::collections::HashMap<String, i64> {
    let mut at = std::collections::HashMap::new();
    for line in log.lines().filter(|l| l.contains("snapshot published")) {
        // why="xDS delta ClusterLoadAssignment \"7\"" or why="xDS ClusterLoadAssignment version \"7\""
        let Some((_, rest)) = line.split_once("ClusterLoadAssignment ") else { continue };
        let rest = rest.strip_prefix("version ").unwrap_or(rest);
        let Some((v, _)) = rest.strip_prefix("\\\"").and_then(|r| r.split_once("\\\"")) else { continue };
        if let Some(t) = log_time_us(line) {
            at.entry(v.to_owned()).or_insert(t);
        }
    }
    at
}

fn summary(h: &Histogram<u64>) -> Value {
    json!({"count": h.len(), "p50_us": h.value_at_quantile(0.5), "p99_us": h.value_at_quantile(0.99), "max_us": h.max()})
}

/// Serves endpoint `addr` of service `i` as live once the summary of its
/// table (`/tables/svc{i}?runs=false`, without the slots) shows it.
fn shows(admin: u16, i: usize, addr: &str) -> bool {
    json_at(admin, &format!("/tables/svc{i}?runs=false"))["endpoints"].to_string().contains(&format!("\"{addr}\""))
}

/// How often the initial load is polled for: 2 ms. The control thread
/// compiling the 10,000 services shares its core with this process and
/// with the admin endpoint answering: polling every 200 µs (5,000 requests
/// a second) takes a third of that core and makes the load about 1.6x
/// slower than the same work alone. 2 ms is 0.2 % of the time measured.
const LOAD_POLL: Duration = Duration::from_millis(2);

/// How often a change is polled for: 1 ms (the summary costs the
/// appliance about 0.1 ms).
const CHANGE_POLL: Duration = Duration::from_millis(1);
/// How long after the load the settled RSS is read: past the appliance's
/// lull before a heap release (500 ms) and the release itself.
const SETTLE: Duration = Duration::from_secs(2);

fn main() {
    let a = args();
    let dir = std::env::temp_dir().join(format!("sluice-xds-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = log_path(&dir.join("sluice.log"));
    // The wall clock of an instant of this process (the appliance's log
    // has wall-clock times).
    let (base, base_wall) = (Instant::now(), std::time::SystemTime::now());
    let wall_us = |at: Instant| -> i64 {
        let since = base_wall.duration_since(std::time::UNIX_EPOCH).unwrap();
        i64::try_from((since + at.saturating_duration_since(base)).as_micros()).unwrap()
    };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, Snapshot::new("0", &[], &[]).unwrap());
    let running = rt.block_on(server.serve(SocketAddr::from(([127, 0, 0, 1], 0)), None)).unwrap();

    let (n, e) = (a.clusters, a.endpoints);
    let mut addrs: Vec<Vec<String>> = (0..n).map(|i| (0..e).map(|j| endpoint(i, j)).collect()).collect();
    let clusters: Vec<Value> = (0..n).map(cluster_json).collect();
    let clas: Vec<Value> = (0..n).map(|i| cla_json(i, &addrs[i])).collect();
    let mut snap = Snapshot::new("1", &clusters, &clas).unwrap();
    eprintln!("built {n} clusters × {e} endpoints");

    // The appliance following the server.
    let admin = free_port();
    let cfg = dir.join("xds.yaml");
    let head = config_head(&a, "xs", admin);
    std::fs::write(
        &cfg,
        format!("{head}xds-control-plane: {{enabled: true, server-address: \"{}\", node-id: bench, mode: {}}}\n", running.addr, a.mode),
    )
    .unwrap();
    let log_from = std::fs::metadata(&log).map_or(0, |m| m.len());
    let app = Appliance::start(&a.sluice, &cfg, admin, &log);
    until("connected", || json_at(admin, "/status")["xds"]["state"] == "connected");
    let rss_before = rss_kib(app.child.id());

    // 1. Everything at once.
    let last = n - 1;
    let live = |i: usize| {
        let q = format!("/explain?proto=tcp&src=198.51.100.1:1000&dst={}:80", vip(i));
        json_at(admin, &q)["service"] == format!("svc{i}").as_str()
    };
    let t0 = Instant::now();
    server.set_snapshot(DEFAULT_NODE, snap.clone());
    let mut polls = 0u32;
    until_every("the last cluster live", LOAD_POLL, || {
        polls += 1;
        if polls % 1000 == 0 {
            let x = &json_at(admin, "/status")["xds"];
            assert!(x["last_nack"].is_null(), "refused: {}", x["last_nack"]);
        }
        live(last)
    });
    let live_at = Instant::now();
    let to_live = live_at - t0;
    // From the server handing the clusters to the stream (without the
    // test server's own diff and encoding of its snapshot, done in this
    // process on the appliance's control core).
    let (version, sent) = server.last_sent(CLUSTER_TYPE).expect("the clusters were sent");
    assert_eq!(version, "1");
    let sent_to_live = live_at - sent;
    assert!(live(0), "the first cluster is live too");
    let rss_after = rss_kib(app.child.id());
    eprintln!("{n} clusters live in {to_live:?} from set_snapshot, {sent_to_live:?} from the server sending them; RSS {rss_before} KiB -> {rss_after} KiB");
    // Resident once the load has settled: the appliance gives the heap's
    // free pages back after a bulk publication, in the first lull.
    std::thread::sleep(SETTLE);
    let rss_settled_load = rss_kib(app.child.id());
    eprintln!("RSS {SETTLE:?} later: {rss_settled_load} KiB");

    // 3. Single changes: endpoint 0 of one cluster gets a new address.
    let mut h = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    let mut hs = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    // (version, when the server sent it), for the log's publication times.
    let mut sent_at: Vec<(String, i64)> = Vec::new();
    for k in 1..=a.changes {
        let i = (k * 7919) % n;
        let new = std::net::Ipv4Addr::from(0x0a63_0000_u32 + k as u32).to_string(); // 10.99.x.y
        addrs[i][0].clone_from(&new);
        snap.version = format!("{}", k + 1);
        snap.add_assignment_with(assignment(&cla_json(i, &addrs[i])).unwrap(), &format!("{i}-{k}"));
        let next = snap.clone();
        let t0 = Instant::now();
        server.set_snapshot(DEFAULT_NODE, next);
        until_every("a change live", CHANGE_POLL, || shows(admin, i, &new));
        let live = Instant::now();
        h.saturating_record((live - t0).as_micros() as u64);
        // From the server handing the response to its stream: without the
        // test server's own work (diffing 10,000 clusters and assignments
        // on this core), which a management server elsewhere does on its own.
        let (version, at) = server.last_sent(CLA_TYPE).expect("an assignment was sent");
        assert_eq!(version, snap.version, "the change was sent in one response");
        hs.saturating_record(live.saturating_duration_since(at).as_micros() as u64);
        sent_at.push((version, wall_us(at)));
    }
    let own = json_at(admin, "/status")["xds"]["to_live"].clone();
    // Resident after the changes too: the load's transient memory is
    // freed by then (the reading at "live" still holds some of it).
    let rss_settled = rss_kib(app.child.id());
    eprintln!("RSS after the single changes: {rss_settled} KiB");
    std::thread::sleep(SETTLE);
    let rss_changes_settled = rss_kib(app.child.id());
    eprintln!("RSS {SETTLE:?} after the single changes: {rss_changes_settled} KiB");
    drop(app);
    // From the server sending each change to the appliance publishing it.
    let text = std::fs::read(&log).unwrap_or_default();
    let published = published_at(&String::from_utf8_lossy(text.get(usize::try_from(log_from).unwrap_or(0)..).unwrap_or_default()));
    let mut hp = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    for (version, sent) in &sent_at {
        let at = published.get(version).unwrap_or_else(|| panic!("no publication of version {version} in the appliance's log {}", log.display()));
        hp.saturating_record(u64::try_from(at - sent).unwrap_or(0));
    }

    // 4. Baseline: the same services and changes from a file.
    let file_cfg = dir.join("file.yaml");
    let write_file = |addrs: &[Vec<String>], path: &Path| {
        let mut s = String::with_capacity(n * 400);
        s.push_str(&config_head(&a, "xf", admin));
        s.push_str("services:\n");
        for (i, eps) in addrs.iter().enumerate() {
            s.push_str(&format!("  - name: svc{i}\n    delivery: ipip\n    endpoints:\n"));
            for (j, ad) in eps.iter().enumerate() {
                s.push_str(&format!("      - {{id: {j}, address: {ad}}}\n"));
            }
        }
        s.push_str("routes:\n");
        for i in 0..addrs.len() {
            s.push_str(&format!("  - {{name: r{i}, service: svc{i}, vips: [{}], protocols: [TCP], destinationPorts: [\"80\"]}}\n", vip(i)));
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, s).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    };
    write_file(&addrs, &file_cfg);
    let file_app = Appliance::start(&a.sluice, &file_cfg, admin, &log);
    until("the file's services live", || live(last));
    let file_rss = rss_kib(file_app.child.id());
    let mut fh = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    for k in 1..=a.changes.min(50) {
        let i = (k * 104_729) % n;
        let new = std::net::Ipv4Addr::from(0x0a62_0000_u32 + k as u32).to_string(); // 10.98.x.y
        addrs[i][0].clone_from(&new);
        let t0 = Instant::now();
        write_file(&addrs, &file_cfg);
        until_every("a file change live", CHANGE_POLL, || shows(admin, i, &new));
        fh.saturating_record(t0.elapsed().as_micros() as u64);
    }
    // After up to 50 reloads of the whole file: right after the last one
    // (its parse of the whole file is still resident), and once settled.
    let file_rss_reloaded = rss_kib(file_app.child.id());
    std::thread::sleep(SETTLE);
    let file_rss_settled = rss_kib(file_app.child.id());
    eprintln!("file source RSS {file_rss} KiB at live, {file_rss_reloaded} KiB right after the edits, {file_rss_settled} KiB {SETTLE:?} later");
    drop(file_app);
    rt.block_on(running.stop());

    let p99 = |h: &Histogram<u64>| h.value_at_quantile(0.99).max(1) as f64;
    let out = json!({
        "mode": a.mode,
        "ports": a.ports,
        "clusters": n,
        "endpoints_per_cluster": e,
        "to_live_ms": to_live.as_secs_f64() * 1e3,
        "sent_to_live_ms": sent_to_live.as_secs_f64() * 1e3,
        "rss_kib": {"before": rss_before, "with_services": rss_after, "with_services_settled": rss_settled_load, "after_changes": rss_settled, "after_changes_settled": rss_changes_settled, "file_source_with_services": file_rss, "file_source_after_edits": file_rss_reloaded, "file_source_after_edits_settled": file_rss_settled},
        "single_change_to_live": summary(&h),
        "single_change_sent_to_live": summary(&hs),
        "single_change_sent_to_published": summary(&hp),
        "appliance_measured_response_to_publish": own,
        "baseline_file_edit_to_live": summary(&fh),
        "ratio_xds_p99_over_file_p99": p99(&h) / p99(&fh),
        "targets": {"to_live_ms": 1000, "single_change_p99_ms": 5, "rss_mib": 150},
    });
    println!("{}", serde_json::to_string_pretty(&out).unwrap());
    if let Some(p) = a.out {
        std::fs::write(p, serde_json::to_string_pretty(&out).unwrap()).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
