//! `sluice run` under a service manager (systemd's `Type=notify`, the
//! unit in `configs/package/`), with `NOTIFY_SOCKET` set to this test's
//! own socket, as systemd sets it (systemd is not PID 1 here):
//!
//! - `READY=1` comes once, and only when `/readyz` answers 200;
//! - `WATCHDOG=1` comes a quarter of `WATCHDOG_USEC` apart while the worker
//!   polls, and stops when it stalls (the test hook: SIGUSR2 freezes the
//!   only worker), with a `STATUS=` that says why; the process then exits
//!   with status 3 after `dpdk.stallExitSeconds`;
//! - a second run, stopped with SIGTERM, says `STOPPING=1` and exits 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice_tests::topology::{root, stop_cleanly, tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

/// A notification, and when it came.
struct Note {
    at: Instant,
    text: String,
}

/// The datagrams on `sock` until `until` is true of one of them, or
/// `timeout` passes; each is checked by `each` as it comes.
fn notes_until(sock: &UnixDatagram, timeout: Duration, mut each: impl FnMut(&Note), until: impl Fn(&Note) -> bool) -> (Vec<Note>, bool) {
    let t0 = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < timeout {
        if let Ok(n) = sock.recv(&mut buf) {
            let note = Note { at: Instant::now(), text: String::from_utf8_lossy(&buf[..n]).into_owned() };
            each(&note);
            let done = until(&note);
            got.push(note);
            if done {
                return (got, true);
            }
        }
    }
    (got, false)
}

fn readyz(topo: &Topology) -> String {
    String::from_utf8(topo.output("lb", &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "127.0.0.1:9091/readyz"]).stdout).unwrap()
}

/// `sluice run` with the environment systemd gives a `Type=notify` service
/// with `WatchdogSec=2s` (`WATCHDOG_PID` is its own pid: the shell execs it).
fn start(topo: &Topology, cfg: &Path, sock: &Path) -> Proc {
    let env = format!("NOTIFY_SOCKET={}", sock.display());
    let bin = sluice_bin();
    let cmd = ["env", &env, "WATCHDOG_USEC=2000000", "SLUICE_TEST_HOOKS=1", "sh", "-c", "WATCHDOG_PID=$$ exec \"$@\"", "sh"];
    topo.spawn("lb", &[&cmd[..], &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]].concat())
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn ready_once_serving_the_watchdog_fed_while_workers_poll_and_stopping_said() {
    privileged();
    let prefix = format!("sm{}", std::process::id());
    let dir = tempdir(&prefix);
    let sock_path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&["20.0.0.1"]);
    let cfg = dir.join("appliance.yaml");
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let text = demo.replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}")).replace("stallExitSeconds: 10", "stallExitSeconds: 4");
    assert!(text.contains("stallExitSeconds: 4"), "the demo's dpdk section moved");
    std::fs::write(&cfg, text).unwrap();

    // READY=1 once /readyz is 200, never before.
    let mut lb = start(&topo, &cfg, &sock_path);
    let mut ready_answer = String::new();
    let (before, ready) = notes_until(
        &sock,
        Duration::from_secs(30),
        |n| {
            if n.text.lines().any(|l| l == "READY=1") {
                ready_answer = readyz(&topo);
            }
        },
        |n| n.text.lines().any(|l| l == "READY=1"),
    );
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("no READY=1 (exit {code:?}); notes: {:?}\n{out}\n{err}", before.iter().map(|n| &n.text).collect::<Vec<_>>());
    }
    assert_eq!(ready_answer, "200", "/readyz when READY=1 came");
    for n in &before[..before.len() - 1] {
        assert!(!n.text.contains("STATUS=serving"), "serving said before READY=1: {}", n.text);
    }
    assert!(before.last().unwrap().text.contains("STATUS=serving"), "{}", before.last().unwrap().text);

    // The watchdog is fed every 500 ms (WATCHDOG_USEC / 4) while the worker polls.
    let (fed, _) = notes_until(&sock, Duration::from_secs(3), |_| {}, |_| false);
    let pings = fed.iter().filter(|n| n.text.lines().any(|l| l == "WATCHDOG=1")).count();
    assert!((4..=8).contains(&pings), "{pings} watchdog pings in 3 s");
    assert!(fed.iter().all(|n| !n.text.contains("READY=1")), "READY=1 is said once");

    // The worker stalls: the pings stop, the status says why, the process ends with status 3.
    let pid = lb.id().unwrap();
    let stalled_at = Instant::now();
    sluice_tests::run(&["kill", "-USR2", &pid.to_string()]);
    let (after, _) = notes_until(&sock, Duration::from_secs(3), |_| {}, |_| false);
    let late_pings: Vec<&Note> = after.iter().filter(|n| n.text.contains("WATCHDOG=1") && n.at.duration_since(stalled_at) > Duration::from_millis(1500)).collect();
    assert!(late_pings.is_empty(), "{} pings after the stall was reported", late_pings.len());
    assert!(after.iter().any(|n| n.text.contains("STATUS=not ready: ") && n.text.contains("has not polled")), "{:?}", after.iter().map(|n| &n.text).collect::<Vec<_>>());
    assert!(wait_until(Duration::from_secs(12), || !lb.running()), "still running after the stall");
    let (code, _, err) = lb.stop("KILL", Duration::from_secs(5));
    assert_eq!(code, Some(3), "{err}");

    // A second run, stopped with SIGTERM: STOPPING=1, exit 0.
    let mut lb = start(&topo, &cfg, &sock_path);
    let (_, ready) = notes_until(&sock, Duration::from_secs(30), |_| {}, |n| n.text.contains("READY=1"));
    assert!(ready, "the second run said READY=1");
    sluice_tests::run(&["kill", "-TERM", &lb.id().unwrap().to_string()]);
    let (_, stopping) = notes_until(&sock, Duration::from_secs(10), |_| {}, |n| n.text.lines().any(|l| l == "STOPPING=1"));
    assert!(stopping, "STOPPING=1 after SIGTERM");
    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}
