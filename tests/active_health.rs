//! Active health checks end to end, on the demo's configuration with
//! passive health off and a check for each service: an HTTP `GET /healthz`
//! on port 8080 for `web` (or a TCP check of that port: a SYN from a raw
//! socket), a DNS query on UDP port 5353 for `dns` (every 500 ms, timeout
//! 300 ms, rise 2, fall 3). The checks leave from the
//! appliance's own address through its exception interface, cross the
//! worker and the `back` port, and come back the same way.
//!
//! When be2's process stops (its ports close), be2 is out of new flows of
//! both services within interval × fall (plus the jitter and one tick of
//! the health task); connections held to be1 and be3 all the while are
//! unaffected. When it starts again, it is back within interval × rise.
//!
//! A check of the VIP (`target: vip`): each backend listens on TCP port
//! 7070 and UDP port 53 of the VIP only, as a NAT-less endpoint may. The
//! SYN or datagram goes to the VIP at the endpoint's MAC, the answer comes
//! back from the VIP to the appliance's own address and the worker hands
//! it to the kernel; when be2's listeners stop, be2 alone goes down.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::topology::{held_outcome, held_why, root, stop_cleanly, tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until};

const HTTP_CHECK: &str = "
    healthCheck: {protocol: http, port: 8080, path: /healthz, intervalMs: 500, timeoutMs: 300, rise: 2, fall: 3}";
const TCP_CHECK: &str = "
    healthCheck: {protocol: tcp, port: 8080, intervalMs: 500, timeoutMs: 300, rise: 2, fall: 3}";
const DNS_CHECK: &str = "
    healthCheck: {protocol: dns, port: 5353, query: health.example, intervalMs: 500, timeoutMs: 300, rise: 2, fall: 3}";

/// Interval, fall and rise of both checks.
const INTERVAL: Duration = Duration::from_millis(500);
const FALL: u32 = 3;
const RISE: u32 = 2;

/// The demo configuration with passive health off, `web_check` for web and
/// the DNS check above.
fn config(prefix: &str, web_check: &str) -> String {
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap().replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    let demo = demo.replace("  passive: true ", "  passive: false");
    assert!(demo.contains("passive: false"), "the demo's health section moved");
    let web = demo.find("  - name: web\n").expect("web");
    let demo = format!("{}{}{}", &demo[..web + "  - name: web".len()], web_check, &demo[web + "  - name: web".len()..]);
    let dns = demo.find("    algorithm: random\n").expect("dns");
    format!("{}{}{}", &demo[..dns + "    algorithm: random".len()], DNS_CHECK, &demo[dns + "    algorithm: random".len()..])
}

/// The active check's record of endpoint `id` of `service`.
fn checked(status: &Value, service: &str, id: u64) -> Option<Value> {
    status["health"]["checks"]["endpoints"].as_array()?.iter().find(|e| e["service"] == service && e["id"] == id).cloned()
}

/// The published state of endpoint `id` of `service`.
fn published(status: &Value, service: &str, id: u64) -> Value {
    status["endpoints"].as_array().and_then(|e| e.iter().find(|e| e["service"] == service && e["id"] == id)).map(|e| e["state"].clone()).unwrap_or_default()
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn http_and_dns_checks_through_the_exception_path_drain_a_stopped_backend_and_bring_it_back() {
    drain_and_bring_back("ah", HTTP_CHECK, "http/8080");
}

/// The same with web's check a SYN to port 8080 from a raw socket: its
/// SYN-ACK crosses the worker back to the kernel like any answer, and
/// be2's closed port answers with an RST.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn tcp_checks_by_syn_through_the_exception_path_drain_a_stopped_backend_and_bring_it_back() {
    drain_and_bring_back("at", TCP_CHECK, "tcp/8080");
}

/// Checks web by `web_check` (shown as `label`) and dns by DNS, stops be2,
/// starts it again.
fn drain_and_bring_back(name: &str, web_check: &str, label: &str) {
    privileged();
    let prefix = format!("{name}{}", std::process::id());
    let topo = Topology::up(&prefix);
    let mut backends = topo.backends(&["20.0.0.1"]);
    // The first checks must find the backends listening: every check is to
    // pass from the start.
    topo.backends_listen(&[8080], &[5353]);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    std::fs::write(&cfg, config(&prefix, web_check)).unwrap();
    let check = std::process::Command::new(sluice_bin()).args(["check", "--config", cfg.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "sluice check: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    let mut lb = topo.spawn("lb", &[sluice_bin().to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let all_up = |st: &Value| {
        ["web", "dns"].iter().all(|s| (0..3).all(|id| checked(st, s, id).is_some_and(|e| e["state"] == "up" && e["checks"].as_u64() >= Some(2) && e["failures"] == 0)))
    };
    if !wait_until(Duration::from_secs(30), || all_up(&topo.status())) {
        let st = topo.status();
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the checks did not all pass (exit {code:?}): {}\n{out}\n{err}", st["health"]);
    }
    let st = topo.status();
    println!("checks: {}", st["health"]["checks"]);
    assert_eq!(st["health"]["passive"], false);
    assert_eq!(checked(&st, "web", 1).unwrap()["check"], label);
    assert_eq!(checked(&st, "dns", 1).unwrap()["check"], "dns/5353");

    // Connections held to every backend.
    let held = dir.join("held.json");
    let _held = topo.hold_for("20.0.0.1", 30, 25, &held);
    assert!(wait_until(Duration::from_secs(20), || dir.join("held.json.ready").exists()), "held connections open");

    // be2 stops: out of both services' new flows.
    let stopped = Instant::now();
    backends[1].stop("KILL", Duration::from_secs(5));
    let out = |st: &Value| ["web", "dns"].iter().all(|s| published(st, s, 1) == "draining" && checked(st, s, 1).is_some_and(|e| e["state"] == "down"));
    assert!(wait_until(Duration::from_secs(20), || out(&topo.status())), "be2 not drained: {}", topo.status()["health"]["checks"]);
    let took = stopped.elapsed();
    let st = topo.status();
    println!("be2 out of new flows {:.2} s after it stopped: {} / {}", took.as_secs_f64(), checked(&st, "web", 1).unwrap(), checked(&st, "dns", 1).unwrap());
    // Its last success was at most an interval before the stop; then
    // `fall` failures an interval apart (±10 %), then the health task's
    // tick (100 ms) and the publication.
    let bound = INTERVAL.mul_f64(f64::from(FALL) * 1.1) + Duration::from_millis(500);
    assert!(took <= bound, "be2 out after {took:?}, over interval × fall ({bound:?} with the margins)");
    assert_eq!(checked(&st, "web", 1).unwrap()["state"], "down");
    assert!(checked(&st, "web", 1).unwrap()["last_error"].as_str().is_some_and(|e| e.contains("refused")), "{st}");
    for s in ["web", "dns"] {
        assert_eq!((published(&st, s, 0), published(&st, s, 2)), (Value::from("ready"), Value::from("ready")), "{s}");
    }
    let c = topo.client(&["short", "20.0.0.1", "30", "1"]);
    assert_eq!(c.get("failed"), None, "{c:?}");
    assert!(!c.contains_key("be2"), "{c:?}");

    // be2 starts again: back within interval × rise of its listeners.
    let script = root().join("scripts/backend.py");
    let started = Instant::now();
    backends[1] = topo.spawn("be2", &["python3", script.to_str().unwrap(), "be2", "20.0.0.1"]);
    let back = |st: &Value| ["web", "dns"].iter().all(|s| published(st, s, 1) == "ready" && checked(st, s, 1).is_some_and(|e| e["state"] == "up"));
    assert!(wait_until(Duration::from_secs(20), || back(&topo.status())), "be2 not back: {}", topo.status()["health"]["checks"]);
    let took = started.elapsed();
    let st = topo.status();
    println!("be2 back in new flows {:.2} s after it started again: {}", took.as_secs_f64(), checked(&st, "web", 1).unwrap());
    // Python's start (about 100 ms here) and then as above with `rise`.
    let bound = INTERVAL.mul_f64(f64::from(RISE) * 1.1) + Duration::from_millis(400) + Duration::from_millis(500);
    assert!(took <= bound, "be2 back after {took:?}, over interval × rise ({bound:?} with the margins)");

    let _ = std::fs::write(dir.join("held.json.stop"), "");
    assert!(wait_until(Duration::from_secs(30), || held.exists()), "held connections' outcome");
    let outcome = held_outcome(&held);
    println!("held connections by backend [ok, broken]: {outcome:?}");
    for (b, [ok, broken]) in &outcome {
        if b != "be2" {
            assert_eq!(*broken, 0, "{b}: held connections broken: {outcome:?}; {}", held_why(&held));
            assert!(*ok > 0);
        }
    }
    stop_cleanly(&mut lb);
    for mut b in backends {
        b.stop("KILL", Duration::from_secs(5));
    }
    topo.remove();
}

/// A listener on port 7070 of VIP 20.0.0.1 only, that never accepts.
const VIP_LISTENER: &str = "import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('20.0.0.1', 7070))
s.listen(64)
time.sleep(3600)";

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_check_of_the_vip_reaches_each_endpoint_that_listens_on_the_vip_only() {
    privileged();
    let prefix = format!("av{}", std::process::id());
    let topo = Topology::up(&prefix);
    let mut backends = topo.backends(&["20.0.0.1"]);
    let mut listeners: Vec<_> = (1..=3).map(|i| topo.spawn(&format!("be{i}"), &["python3", "-c", VIP_LISTENER])).collect();
    topo.backends_listen(&[7070], &[53]);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    let check = "
    healthCheck: {protocol: tcp, port: 7070, target: vip, intervalMs: 500, timeoutMs: 300, rise: 2, fall: 3}";
    // backend.py's UDP port 53 (on the VIP only) echoes what it gets.
    let udp = "
    healthCheck: {protocol: udp, port: 53, send: ping, expect: ping, target: vip, intervalMs: 500, timeoutMs: 300, rise: 2, fall: 3}";
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap().replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    let demo = demo.replace("  passive: true ", "  passive: false");
    let web = demo.find("  - name: web\n").expect("web") + "  - name: web".len();
    let demo = format!("{}{check}{}", &demo[..web], &demo[web..]);
    let dns = demo.find("    algorithm: random\n").expect("dns") + "    algorithm: random".len();
    std::fs::write(&cfg, format!("{}{udp}{}", &demo[..dns], &demo[dns..])).unwrap();
    let mut lb = topo.spawn("lb", &[sluice_bin().to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let up = |st: &Value, s: &str, id: u64| checked(st, s, id).is_some_and(|e| e["state"] == "up" && e["checks"].as_u64() >= Some(2) && e["failures"] == 0);
    if !wait_until(Duration::from_secs(30), || ["web", "dns"].iter().all(|s| (0..3).all(|id| up(&topo.status(), s, id)))) {
        let st = topo.status();
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the checks of the VIP did not all pass (exit {code:?}): {}\n{out}\n{err}", st["health"]);
    }
    let st = topo.status();
    println!("checks: {}", st["health"]["checks"]);
    assert_eq!(checked(&st, "web", 1).unwrap()["check"], "tcp/20.0.0.1:7070");
    assert_eq!(checked(&st, "web", 1).unwrap()["address"], "10.200.0.12");
    assert_eq!(checked(&st, "dns", 1).unwrap()["check"], "udp/20.0.0.1:53");
    // Nothing listens on the backends' own addresses there: a check of
    // those would fail.
    let own = topo.output("lb", &["python3", "-c", "import socket; socket.create_connection(('10.200.0.12', 7070), timeout=2)"]);
    assert!(String::from_utf8_lossy(&own.stderr).contains("ConnectionRefusedError"), "{own:?}");
    // The prober resets the connections its SYN-ACKs opened: none piles up.
    let half_open = |ns: &str| topo.output(ns, &["ss", "-Htn", "state", "syn-recv", "sport", "=", ":7070"]).stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count();
    let n = half_open("be1");
    println!("half-open connections on be1's port 7070: {n}");
    assert!(n <= 2, "{n} half-open connections on be1: the checks' RSTs did not reach it");

    // be2's listeners stop: be2 out of both, the others stay.
    let stopped = Instant::now();
    listeners[1].stop("KILL", Duration::from_secs(5));
    backends[1].stop("KILL", Duration::from_secs(5));
    let out = |st: &Value| ["web", "dns"].iter().all(|s| published(st, s, 1) == "draining" && checked(st, s, 1).is_some_and(|e| e["state"] == "down"));
    assert!(wait_until(Duration::from_secs(20), || out(&topo.status())), "be2 not drained: {}", topo.status()["health"]["checks"]);
    let took = stopped.elapsed();
    let st = topo.status();
    println!("be2 out {:.2} s after its listeners stopped: {} / {}", took.as_secs_f64(), checked(&st, "web", 1).unwrap(), checked(&st, "dns", 1).unwrap());
    // A datagram unanswered fails only at its timeout (300 ms).
    let bound = INTERVAL.mul_f64(f64::from(FALL) * 1.1) + Duration::from_millis(300) + Duration::from_millis(500);
    assert!(took <= bound, "be2 out after {took:?}, over interval × fall + the timeout ({bound:?} with the margins)");
    assert!(checked(&st, "web", 1).unwrap()["last_error"].as_str().is_some_and(|e| e.contains("refused")), "{st}");
    assert!(checked(&st, "dns", 1).unwrap()["last_error"].as_str().is_some_and(|e| e.contains("no answer within 300 ms")), "{st}");
    for (s, id) in [("web", 0), ("web", 2), ("dns", 0), ("dns", 2)] {
        assert!(checked(&st, s, id).is_some_and(|e| e["state"] == "up" && e["failures"] == 0), "{}", st["health"]["checks"]);
        assert_eq!(published(&st, s, id), "ready");
    }

    // It listens again: back.
    let started = Instant::now();
    listeners[1] = topo.spawn("be2", &["python3", "-c", VIP_LISTENER]);
    backends[1] = topo.spawn("be2", &["python3", root().join("scripts/backend.py").to_str().unwrap(), "be2", "20.0.0.1"]);
    let back = |st: &Value| ["web", "dns"].iter().all(|s| published(st, s, 1) == "ready");
    assert!(wait_until(Duration::from_secs(20), || back(&topo.status())), "be2 not back: {}", topo.status()["health"]["checks"]);
    println!("be2 back {:.2} s after its listeners started again", started.elapsed().as_secs_f64());

    stop_cleanly(&mut lb);
    for mut p in listeners.into_iter().chain(backends.drain(..)) {
        p.stop("KILL", Duration::from_secs(5));
    }
    topo.remove();
}
