//! Soak: real TCP and UDP through the appliance (the demo topology in
//! network namespaces) while a second process hammers the admin port with
//! hostile requests (scripts/admin_hammer.py) and the test rewrites the
//! configuration every 100 ms with random valid and invalid edits.
//!
//! Every 25th edit swaps the file for a FIFO (nothing ever writes to it):
//! it is refused as not a regular file while `/healthz` keeps answering,
//! and the next edit puts a regular file back.
//!
//! Meanwhile the largest table there is (16,777,213 slots) is fetched from
//! `/tables/big` by two clients at once, a third reads `/tables` on a
//! kept-alive connection, six pollers hold keep-alive connections, and
//! `/healthz` is asked every 250 ms.
//!
//! The appliance must never exit, traffic must never stop or fail, every
//! invalid edit must be rejected with its own reason (and every valid one
//! applied), `/healthz` must answer throughout (never 5 s without a 200),
//! resident memory must stay within [`SOAK_GROWTH_MIB`] of what it was when
//! ready, and every mbuf must be back in the pool at the end.
//!
//! Bounded: `SOAK_SECONDS` (default 45) of churn.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::http::{proc_kib, reset_peak};
use sluice_tests::topology::{root, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

/// One edit of the configuration: its text and, for an invalid one, a
/// piece of the reason it must be rejected with.
struct Edit {
    text: String,
    rejected_because: Option<String>,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const BACKENDS: [&str; 3] = ["10.200.0.11", "10.200.0.12", "10.200.0.13"];

/// A service with the largest table there is (16,777,213 slots; its
/// `/tables/big` is hundreds of megabytes of JSON), which the edits leave
/// alone (it states its flow table, which the edits' defaults vary).
const BIG: &str = "  - name: big
    tableSize: 16777213
    flowTable: false
    endpoints:
      - {id: 0, address: 10.200.0.11}
      - {id: 1, address: 10.200.0.12}
      - {id: 2, address: 10.200.0.13}
";

/// The services and routes part of the configuration, valid, varied by `n`.
fn valid(n: u64, rng: &mut Rng) -> String {
    let flow_table = rng.below(2) == 1;
    let dns_alg = if rng.below(2) == 1 { "random" } else { "maglev" };
    let extra: Vec<String> = (0..=rng.below(3))
        .map(|i| format!("      - {{id: {}, address: {}, weight: {}}}", i, BACKENDS[usize::try_from(i).unwrap()], 1 + rng.below(4)))
        .collect();
    format!(
        r#"defaults:
  flowTable: {flow_table}
services:
{BIG}  - name: web
    endpoints:
      - {{id: 0, address: 10.200.0.11}}
      - {{id: 1, address: 10.200.0.12}}
      - {{id: 2, address: 10.200.0.13}}
  - name: dns
    algorithm: {dns_alg}
    endpoints:
      - {{id: 0, address: 10.200.0.11, weight: {w0}}}
      - {{id: 1, address: 10.200.0.12, weight: {w1}}}
      - {{id: 2, address: 10.200.0.13}}
  - name: extra
    endpoints:
{extra}
routes:
  - {{name: web-tcp, service: web, priority: 10, vips: [20.0.0.1], protocols: [TCP], destinationPorts: ["80"]}}
  - {{name: dns-udp, service: dns, priority: 10, vips: [20.0.0.1], protocols: [UDP], destinationPorts: ["53"]}}
  - {{name: extra, service: extra, priority: {n}, vips: [20.0.0.2], protocols: [TCP], destinationPorts: ["8080"]}}
  - {{name: big, service: big, priority: 10, vips: [20.0.0.2], protocols: [TCP], destinationPorts: ["443"]}}
"#,
        w0 = 1 + rng.below(3),
        w1 = 1 + rng.below(3),
        extra = extra.join("\n"),
    )
}

/// An invalid variant of a valid configuration, and why it is invalid.
fn invalid(n: u64, good: &str, rng: &mut Rng) -> (String, String) {
    match rng.below(7) {
        0 => {
            let vip = format!("20.0.{}.0/24", n % 250);
            (good.replace("vips: [20.0.0.2]", &format!("vips: [{vip}]")), format!("VIP {vip} is not a /32 or /128"))
        }
        1 => {
            let s = format!("ghost-{n}");
            (good.replace("service: extra,", &format!("service: {s},")), format!("route to an unknown service \"{s}\""))
        }
        2 => (
            good.replace("      - {id: 2, address: 10.200.0.13}\n  - name: extra", "      - {id: 1, address: 10.200.0.13}\n  - name: extra"),
            "duplicate endpoint identifier 1 in service \"dns\"".into(),
        ),
        3 => {
            let m = 1000 + 2 * (n % 500);
            (good.replace("  - name: extra\n", &format!("  - name: extra\n    tableSize: {m}\n")), format!("table size {m} is not a prime"))
        }
        4 => {
            let key = format!("prio{n}");
            (good.replace("priority: 10, vips: [20.0.0.1], protocols: [UDP]", &format!("{key}: 10, vips: [20.0.0.1], protocols: [UDP]")), format!("{key}: unknown field"))
        }
        5 => {
            let limit = 70_000 + n;
            (good.replace("  - name: extra\n", &format!("  - name: extra\n    endpointLimit: {limit}\n")), format!("{limit} is out of range"))
        }
        _ => (format!("{good}routes: [{{name: broken-{n}\n"), "key \"routes\" appears twice in a mapping".into()),
    }
}

/// Atomically replaces `path` with `text`.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Log lines after `offset`; advances it.
fn new_lines(log: &Path, offset: &mut usize) -> Vec<String> {
    let text = std::fs::read(log).unwrap_or_default();
    if text.len() <= *offset {
        return Vec::new();
    }
    let s = String::from_utf8_lossy(&text[*offset..]).into_owned();
    // Only whole lines.
    let Some(end) = s.rfind('\n') else { return Vec::new() };
    *offset += end + 1;
    s[..end].lines().map(str::to_owned).collect()
}

/// What the admin readers saw.
#[derive(Debug, Default)]
struct AdminTally {
    /// `/tables/big` answered 200, read to its end, cut short (by the
    /// request timeout, or the reader), and the bytes of it read.
    tables: u64,
    tables_complete: u64,
    tables_cut: u64,
    table_bytes: u64,
    /// Requests not answered 200 (refused at the connection cap, or the
    /// connection closed before an answer).
    refused: u64,
    /// Answers of the keep-alive pollers, and how many came on a
    /// connection kept from an earlier answer.
    polled: u64,
    kept_alive: u64,
    /// `/healthz` asked on a fresh connection: answered 200, not, and the
    /// longest time without an answer.
    health_ok: u64,
    health_not: u64,
    health_gap: Duration,
}

/// Runs `f` on a thread inside the network namespace `ns` (where the
/// appliance's admin endpoint is on loopback) until `stop`.
fn in_netns(ns: &str, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        f();
    })
}

/// Readers of the admin endpoint of the appliance in `ns`, while the soak
/// runs: two fetch `/tables/big` over and over at once (one fast, one
/// slowly), one reads `/tables` and the big table's summary on a
/// kept-alive connection, six keep-alive pollers ask `/readyz` every
/// second, and `/healthz` is asked every 250 ms on a fresh connection.
fn admin_readers(ns: &str, stop: &Arc<AtomicBool>, tally: &Arc<Mutex<AdminTally>>) -> Vec<std::thread::JoinHandle<()>> {
    use sluice_tests::http::Client;
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], 9091).into();
    let mut threads = Vec::new();
    // 64 KiB a millisecond at most (the whole table in about ten seconds,
    // a quarter of a core for its JSON), and 64 KiB every 20 ms.
    for pace in [Duration::from_millis(1), Duration::from_millis(20)] {
        let (stop, tally) = (Arc::clone(stop), Arc::clone(tally));
        threads.push(in_netns(ns, move || {
            let mut c = Client::new(addr);
            while !stop.load(Ordering::Relaxed) {
                let r = c.get("/tables/big", |_| {
                    std::thread::sleep(pace);
                    !stop.load(Ordering::Relaxed)
                });
                let mut t = tally.lock().unwrap();
                if r.is(200) {
                    t.tables += 1;
                    t.table_bytes += r.body_bytes;
                    if r.complete {
                        t.tables_complete += 1;
                    } else {
                        t.tables_cut += 1;
                    }
                } else {
                    t.refused += 1;
                    drop(t);
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }));
    }
    let pollers = [(&["/tables", "/tables/big?runs=false"][..], Duration::from_millis(500))].into_iter().chain(std::iter::repeat_n((&["/readyz"][..], Duration::from_secs(1)), 6));
    for (paths, period) in pollers {
        let (stop, tally) = (Arc::clone(stop), Arc::clone(tally));
        threads.push(in_netns(ns, move || {
            let mut c = Client::new(addr);
            while !stop.load(Ordering::Relaxed) {
                for path in paths {
                    let r = c.get(path, |_| true);
                    let mut t = tally.lock().unwrap();
                    if r.is(200) && r.complete {
                        t.polled += 1;
                    } else {
                        t.refused += 1;
                    }
                }
                std::thread::sleep(period);
            }
            tally.lock().unwrap().kept_alive += c.reused;
        }));
    }
    let (stop, tally) = (Arc::clone(stop), Arc::clone(tally));
    threads.push(in_netns(ns, move || {
        let mut last = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let r = Client::new(addr).get("/healthz", |_| true);
            let mut t = tally.lock().unwrap();
            if r.is(200) {
                t.health_ok += 1;
                last = Instant::now();
            } else {
                t.health_not += 1;
            }
            t.health_gap = t.health_gap.max(last.elapsed());
            drop(t);
            std::thread::sleep(Duration::from_millis(250));
        }
    }));
    threads
}

/// The resident memory a soaking appliance may hold beyond what it held
/// when it became ready: three streamed admin responses of 16 MiB each at
/// most (item "every admin response is bounded"), and what the edits
/// compile meanwhile (each compiles the small services again and publishes
/// a snapshot; old snapshots are freed once the workers have moved on).
const SOAK_GROWTH_MIB: u64 = 3 * 16 + 64;

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn traffic_admin_attacks_and_config_churn_do_not_stop_the_appliance() {
    privileged();
    let secs: u64 = std::env::var("SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(45);
    let prefix = format!("sk{}", std::process::id());
    let topo = Topology::up(&prefix);
    let backend = root().join("scripts/backend.py");
    let _backends: Vec<Proc> = (1..=3)
        .map(|i| topo.spawn(&format!("be{i}"), &["python3", backend.to_str().unwrap(), &format!("be{i}"), "20.0.0.1", "20.0.0.2"]))
        .collect();

    let dir = std::env::temp_dir().join(format!("sluice-{prefix}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let head = demo[..demo.find("\ndefaults:").unwrap()].replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    let head = format!("{head}\n");
    let mut rng = Rng(0x5eed_1234_abcd_0001 ^ u64::from(std::process::id()));
    let cfg = dir.join("appliance.yaml");
    write(&cfg, &format!("{head}{}", valid(0, &mut rng)));
    // The log lives apart from the configuration (as it would in production):
    // the file source watches the configuration's directory.
    let logdir = std::env::temp_dir().join(format!("sluice-{prefix}-log"));
    let _ = std::fs::remove_dir_all(&logdir);
    std::fs::create_dir_all(&logdir).unwrap();
    let log = logdir.join("sluice.log");
    let bin = sluice_bin();
    let cmdline = format!("exec {} --log info,sluice::sources=debug,sluice::reconcile=debug run --config {} 2> {}", bin.display(), cfg.display(), log.display());
    let mut lb = topo.spawn("lb", &["sh", "-c", &cmdline]);
    let status = |t: &Topology| -> Option<Value> {
        let o = t.output("lb", &[bin.to_str().unwrap(), "status", "--json"]);
        o.status.success().then(|| serde_json::from_slice(&o.stdout).ok()).flatten()
    };
    // The big table is built on start (about a second of one core).
    let ready = wait_until(Duration::from_secs(60), || {
        status(&topo).is_some_and(|s| s["ready"] == true && s["endpoints"].as_array().is_some_and(|e| e.iter().any(|e| e["state"] == "ready")))
    });
    assert!(ready, "the appliance did not become ready:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
    let mut offset = 0usize;
    let _ = new_lines(&log, &mut offset);

    // Resident memory, from now on: the baseline once the big table's
    // digest has been taken (it is kept), then sampled every 50 ms, and the
    // peak (VmHWM, reset now) at the end.
    let pid = lb.id().unwrap();
    // The kernel keeps the first 15 bytes of the program's name.
    let name: String = bin.file_name().unwrap().to_string_lossy().chars().take(15).collect();
    assert_eq!(std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim(), name, "the appliance is the process started");
    let summary = topo.output("lb", &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "30", "http://127.0.0.1:9091/tables/big?runs=false"]);
    assert_eq!(String::from_utf8_lossy(&summary.stdout), "200", "the big table's summary");
    let base = proc_kib(pid, "VmRSS");
    reset_peak(pid);
    let rss_peak = Arc::new(AtomicU64::new(base));
    let admin_stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, peak) = (Arc::clone(&admin_stop), Arc::clone(&rss_peak));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(proc_kib(pid, "VmRSS"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let admin_tally = Arc::new(Mutex::new(AdminTally::default()));
    let readers = admin_readers(&topo.ns("lb"), &admin_stop, &admin_tally);

    let hammer = root().join("scripts/admin_hammer.py");
    let mut hammer = topo.spawn("lb", &["python3", hammer.to_str().unwrap(), "127.0.0.1:9091", &secs.to_string()]);

    // Traffic, all along: batches of short TCP connections and UDP queries.
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new((0u64, 0u64, 0u64, Duration::ZERO)));
    let traffic = {
        let (stop, tally, ns) = (Arc::clone(&stop), Arc::clone(&tally), topo.ns("client"));
        let script = root().join("scripts/client.py");
        std::thread::spawn(move || {
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                for args in [&["short", "20.0.0.1", "20", "4"][..], &["udp", "20.0.0.1", "10"][..]] {
                    let out = Command::new("ip")
                        .args(["netns", "exec", &ns, "python3", script.to_str().unwrap()])
                        .args(args)
                        .output()
                        .unwrap();
                    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
                    let obj = v.as_object().cloned().unwrap_or_default();
                    let failed = obj.get("failed").and_then(Value::as_u64).unwrap_or(0);
                    let ok: u64 = obj.iter().filter(|(k, _)| *k != "failed").filter_map(|(_, v)| v.as_u64()).sum();
                    let mut t = tally.lock().unwrap();
                    t.0 += 1;
                    t.1 += ok;
                    t.2 += failed;
                    if ok == 0 {
                        t.2 += 1; // a batch that got nothing through
                    }
                    t.3 = t.3.max(last.elapsed());
                    last = Instant::now();
                }
            }
        })
    };

    // Configuration churn, one edit every 100 ms, each one's fate checked.
    let (mut applied, mut rejected, mut fifos) = (0u64, 0u64, 0u64);
    let healthz = |t: &Topology| -> String {
        let o = t.output("lb", &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "2", "http://127.0.0.1:9091/healthz"]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let end = Instant::now() + Duration::from_secs(secs);
    let mut n = 1u64;
    let mut last_good = String::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        let good = valid(n, &mut rng);
        let edit = if rng.below(2) == 0 {
            last_good = good.clone();
            Edit { text: format!("{head}{good}"), rejected_because: None }
        } else {
            let base = if last_good.is_empty() { good } else { last_good.clone() };
            let (text, why) = invalid(n, &base, &mut rng);
            Edit { text: format!("{head}{text}"), rejected_because: Some(why) }
        };
        let fifo = n % 25 == 0;
        let edit = if fifo {
            let tmp = cfg.with_extension("fifo");
            let _ = std::fs::remove_file(&tmp);
            assert!(Command::new("mkfifo").arg(&tmp).status().unwrap().success());
            std::fs::rename(&tmp, &cfg).unwrap();
            Edit { text: String::new(), rejected_because: Some("not a regular file (a FIFO): refused".into()) }
        } else {
            // Each edit changes the file, if only by this comment.
            write(&cfg, &format!("# edit {n}\n{}", edit.text));
            edit
        };
        eprintln!("{:?} wrote edit {n} ({:?})", std::time::SystemTime::now(), edit.rejected_because);
        let mut seen = false;
        let mut read = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !seen && Instant::now() < deadline {
            for l in new_lines(&log, &mut offset) {
                read.push(l.clone());
                match &edit.rejected_because {
                    None if l.contains("configuration applied") => seen = true,
                    Some(why) if l.contains("rejected") && l.contains(why.as_str()) => seen = true,
                    _ if l.contains("rejected") || l.contains("applied") => eprintln!("  edit {n} skips: {}", &l[..l.len().min(120)]),
                    _ => {}
                }
            }
            if !seen {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        assert!(lb.running(), "the appliance exited:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        match &edit.rejected_because {
            None => {
                assert!(seen, "valid edit {n} was not applied within 10 s; log lines meanwhile:\n{}", read.join("\n"));
                applied += 1;
            }
            Some(why) => {
                assert!(seen, "invalid edit {n} was not rejected with {why:?} within 10 s; log lines meanwhile:\n{}", read.join("\n"));
                rejected += 1;
            }
        }
        if fifo {
            // The admin hammer holds most of the connection slots: a few
            // tries may be refused before one gets through.
            let mut code = String::new();
            let answered = wait_until(Duration::from_secs(10), || {
                code = healthz(&topo);
                code == "200"
            });
            assert!(answered, "/healthz with a FIFO in place of the configuration: last answer {code:?}");
            fifos += 1;
        }
        n += 1;
        if let Some(rest) = Duration::from_millis(100).checked_sub(t0.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
    let (_, hammer_out, hammer_err) = hammer.stop("TERM", Duration::from_secs(30));
    eprintln!("admin hammer: {hammer_out}{hammer_err}");
    admin_stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    sampler.join().unwrap();
    let peak = rss_peak.load(Ordering::Relaxed).max(proc_kib(pid, "VmHWM"));
    let admin = std::mem::take(&mut *admin_tally.lock().unwrap());
    eprintln!("admin readers: {admin:?}");
    eprintln!("resident: {base} KiB when ready, {peak} KiB at most (+{} MiB; bound +{SOAK_GROWTH_MIB} MiB)", peak.saturating_sub(base) / 1024);
    let (batches, ok, failed, gap) = *tally.lock().unwrap();
    eprintln!("{applied} edits applied, {rejected} rejected ({fifos} of them FIFOs); traffic: {batches} batches, {ok} ok, {failed} failed, longest gap {gap:?}");
    assert!(applied > 0 && rejected > 0 && fifos > 0);
    assert!(batches > 4 && ok > 0, "traffic ran");
    assert_eq!(failed, 0, "no connection or query failed");
    assert!(gap < Duration::from_secs(10), "traffic never stalled (longest batch {gap:?})");
    assert!(lb.running());
    assert!(admin.tables > 2 && admin.table_bytes > 64 << 20, "the big table was fetched: {admin:?}");
    assert!(admin.polled > 0 && admin.kept_alive > 0, "keep-alive connections answered: {admin:?}");
    assert!(
        peak.saturating_sub(base) / 1024 <= SOAK_GROWTH_MIB,
        "resident memory grew by {} MiB, more than {SOAK_GROWTH_MIB} MiB",
        peak.saturating_sub(base) / 1024
    );
    assert!(admin.health_ok > 0 && admin.health_gap < Duration::from_secs(5), "/healthz answered throughout: {admin:?}");

    let st = status(&topo).expect("status after the soak");
    assert_eq!(st["healthy"], true, "{st}");
    let (code, _, _) = lb.stop("INT", Duration::from_secs(20));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(code, Some(0), "clean exit:\n{}", &text[text.len().saturating_sub(4000)..]);
    assert!(text.contains("mbufs_in_use=0"), "every mbuf back in the pool");
    drop(topo);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&logdir);
}
