//! The admin endpoint under attack, against a running `sluice run` (two
//! `net_null` ports, no namespaces needed): a request that declares a huge
//! body, oversized headers, a slow client holding connections open, many
//! concurrent connections and garbage request lines. The appliance must keep
//! running and keep answering.
//!
//! Before the control runtime, the first request alone aborted the whole
//! process (workers included): the HTTP server allocated the declared body.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Sends `req` raw and returns what came back (possibly nothing) within `t`.
fn raw(addr: SocketAddr, req: &[u8], t: Duration) -> String {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { return String::new() };
    s.set_read_timeout(Some(t)).unwrap();
    s.set_write_timeout(Some(t)).unwrap();
    let _ = s.write_all(req);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

fn status_line(resp: &str) -> &str {
    resp.lines().next().unwrap_or("")
}

fn healthy(addr: SocketAddr) -> bool {
    raw(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", Duration::from_secs(3)).starts_with("HTTP/1.1 200")
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn hostile_requests_do_not_stop_the_appliance() {
    privileged();
    let dir = std::env::temp_dir().join(format!("sluice-admin-attack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let cfg = dir.join("null.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"
dpdk: {{lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: atk{pid}, mbufs: 2047, descriptors: 256}}
ports:
  - {{name: a, device: net_null0, addresses: [10.1.0.1/24], kernelInterface: ""}}
  - {{name: b, device: net_null1, addresses: [10.2.0.1/24], kernelInterface: ""}}
admin: {{listen: "127.0.0.1:{port}"}}
services: [{{name: web, endpoints: [{{id: 0, address: 10.2.0.5, mac: "02:00:00:00:00:05"}}]}}]
routes: [{{name: r, service: web, vips: [20.0.0.1]}}]
"#,
            pid = std::process::id()
        ),
    )
    .unwrap();
    let mut lb = Proc::spawn(&[sluice_bin().to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    assert!(wait_until(Duration::from_secs(30), || healthy(addr)), "the appliance never became healthy");

    // 1. A body declared at ~1 PB.
    let r = raw(
        addr,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999999\r\n\r\n",
        Duration::from_secs(3),
    );
    assert!(lb.running(), "a declared huge body stopped the appliance (answer: {r:?})");
    assert!(healthy(addr));

    // 2. A megabyte of headers is refused, not buffered.
    let mut big = b"GET /status HTTP/1.1\r\nHost: x\r\n".to_vec();
    for i in 0..16_000 {
        big.extend_from_slice(format!("X-Pad-{i}: {}\r\n", "a".repeat(60)).as_bytes());
    }
    big.extend_from_slice(b"\r\n");
    let r = raw(addr, &big, Duration::from_secs(5));
    assert!(lb.running());
    assert!(!r.starts_with("HTTP/1.1 200"), "oversized headers were accepted: {}", status_line(&r));

    // 3. Garbage.
    for junk in [&b"\x00\x01\x02\x03\r\n\r\n"[..], b"GET\r\n\r\n", b"BREW /pot HTCPCP/1.0\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n"] {
        let _ = raw(addr, junk, Duration::from_secs(2));
    }
    assert!(lb.running());

    // 4. Slow clients: half a request line, then silence, on many sockets.
    let slow: Vec<TcpStream> = (0..200)
        .filter_map(|_| {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
            let _ = s.write_all(b"GET /metr");
            Some(s)
        })
        .collect();
    // While they hang, the endpoint must still answer someone.
    let t0 = Instant::now();
    let answered = wait_until(Duration::from_secs(20), || healthy(addr));
    assert!(answered, "slow clients starved the endpoint");
    eprintln!("answered next to 200 slow clients after {:?}", t0.elapsed());
    // The server closes them (header timeout), it does not keep them forever.
    let closed = slow
        .into_iter()
        .filter(|s| {
            let mut s = s.try_clone().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            let mut b = [0u8; 64];
            match s.read(&mut b) {
                Ok(n) => n == 0 || b.starts_with(b"HTTP/1.1 408"), // closed, or told it timed out
                Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            }
        })
        .count();
    assert_eq!(closed, 200);

    // 5. Many concurrent well-formed scrapes.
    let threads: Vec<_> = (0..64)
        .map(|_| {
            std::thread::spawn(move || {
                (0..10)
                    .filter(|_| {
                        raw(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", Duration::from_secs(10))
                            .starts_with("HTTP/1.1 200")
                    })
                    .count()
            })
        })
        .collect();
    let ok: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(ok > 0, "no scrape succeeded under load");
    assert!(lb.running());
    assert!(healthy(addr));

    let (code, out, err) = lb.stop("INT", Duration::from_secs(20));
    assert_eq!(code, Some(0), "exit status\n{out}\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Starts `sluice run` on two `net_null` ports with `extra` appended to the
/// configuration (services, routes, admin settings); returns it with its
/// admin address and its directory.
fn start(tag: &str, admin: &str, extra: &str) -> (Proc, SocketAddr, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("sluice-admin-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let cfg = dir.join("null.yaml");
    std::fs::write(
        &cfg,
        format!(
            r#"
dpdk: {{lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: {tag}{pid}, mbufs: 2047, descriptors: 256}}
ports:
  - {{name: a, device: net_null0, addresses: [10.1.0.1/24], kernelInterface: ""}}
  - {{name: b, device: net_null1, addresses: [10.2.0.1/24], kernelInterface: ""}}
admin: {{listen: "127.0.0.1:{port}"{admin}}}
{extra}"#,
            pid = std::process::id()
        ),
    )
    .unwrap();
    let lb = Proc::spawn(&[sluice_bin().to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    (lb, addr, dir)
}

/// Reads one HTTP/1.1 response (headers, then a body of Content-Length
/// bytes) from a kept-alive connection; `None` when it was closed first.
fn read_response(s: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let len: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).ok()?;
    Some(head)
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn health_answers_while_keep_alive_pollers_hold_every_slot() {
    privileged();
    let svc = "services: [{name: web, endpoints: [{id: 0, address: 10.2.0.5, mac: \"02:00:00:00:00:05\"}]}]\nroutes: [{name: r, service: web, vips: [20.0.0.1]}]\n";
    // The default cap (16 connections), 20 pollers.
    let (mut lb, addr, dir) = start("probe", "", svc);
    assert!(wait_until(Duration::from_secs(30), || healthy(addr)), "the appliance never became healthy");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pollers: Vec<_> = (0..20)
        .map(|_| {
            let (stop, answered) = (std::sync::Arc::clone(&stop), std::sync::Arc::clone(&answered));
            std::thread::spawn(move || {
                let mut conn: Option<TcpStream> = None;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if conn.is_none() {
                        conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok();
                        if let Some(c) = &conn {
                            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        }
                    }
                    if let Some(c) = conn.as_mut() {
                        let ok = c.write_all(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n").is_ok() && read_response(c).is_some();
                        if ok {
                            answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        } else {
                            conn = None;
                        }
                    }
                    // A kubelet-like period.
                    std::thread::sleep(Duration::from_millis(1500));
                }
            })
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(20), || answered.load(std::sync::atomic::Ordering::Relaxed) >= 40),
        "the pollers got {} answers",
        answered.load(std::sync::atomic::Ordering::Relaxed)
    );
    let mut refused = Vec::new();
    for i in 0..8 {
        let r = raw(addr, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", Duration::from_secs(3));
        if !r.starts_with("HTTP/1.1 200") {
            refused.push(format!("probe {i}: {:?}", status_line(&r)));
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in pollers {
        p.join().unwrap();
    }
    assert!(refused.is_empty(), "/healthz was refused next to 20 keep-alive pollers: {refused:?}");
    assert!(lb.running());
    let (code, out, err) = lb.stop("INT", Duration::from_secs(20));
    assert_eq!(code, Some(0), "exit status\n{out}\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A service with the largest table there is (16,777,213 slots) over 64
/// endpoints: its `/tables/web` is some 400 MB of JSON.
fn largest_table() -> String {
    let eps: Vec<String> = (0..64).map(|i| format!("{{id: {i}, address: 10.2.0.{}, mac: \"02:00:00:00:00:05\"}}", i + 10)).collect();
    format!(
        "services: [{{name: web, endpointLimit: 64, tableSize: 16777213, endpoints: [{}]}}]\nroutes: [{{name: r, service: web, vips: [20.0.0.1]}}]\n",
        eps.join(", ")
    )
}

/// GETs `path` on a connection of its own and reads the answer, giving the
/// body to `each` as it arrives (false: hang up). Returns the response and
/// when the reading ended.
fn fetch(addr: SocketAddr, path: &str, each: impl FnMut(&[u8]) -> bool) -> (sluice_tests::http::Response, Instant) {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { return (Default::default(), Instant::now()) };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    let mut r = std::io::BufReader::with_capacity(64 * 1024, s);
    let resp = sluice_tests::http::read_response(&mut r, each);
    (resp, Instant::now())
}

/// The resident memory bound of a streamed admin response, beyond what the
/// appliance holds without it.
const PER_REQUEST_MIB: u64 = 16;

/// What the allocator may keep besides (arenas of the threads that wrote).
const MARGIN_MIB: u64 = 32;

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn the_largest_table_is_streamed_in_bounded_memory_and_cut_at_the_deadline() {
    use sluice_tests::http::{cpu_ticks_except, proc_kib, reset_peak};
    privileged();
    let timeout = Duration::from_secs(8);
    let (mut lb, addr, dir) = start("tables", &format!(", requestTimeoutSeconds: {}", timeout.as_secs()), &largest_table());
    let t0 = Instant::now();
    // Built on start: a 16,777,213-slot Maglev table (about a second of one
    // core's time).
    let up = wait_until(Duration::from_secs(120), || !lb.running() || healthy(addr));
    assert!(up && lb.running(), "the appliance did not become healthy:\n{}", lb.stop("INT", Duration::from_secs(20)).2);
    eprintln!("healthy {:?} after start", t0.elapsed());
    let pid = lb.id().unwrap();
    // The table's digest is taken once and kept: taken before the baseline.
    let (summary, _) = fetch(addr, "/tables/web?runs=false", |_| true);
    assert!(summary.is(200) && summary.complete, "{summary:?}");
    let base = proc_kib(pid, "VmRSS");
    reset_peak(pid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(proc_kib(pid, "VmRSS"));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    // `/healthz` asked every 200 ms meanwhile (each try waits 3 s at most):
    // answered, not, and the longest time without an answer.
    let probes = {
        let done = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            let (mut ok, mut refused, mut gap, mut last) = (0u32, 0u32, Duration::ZERO, Instant::now());
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if healthy(addr) {
                    ok += 1;
                    last = Instant::now();
                } else {
                    refused += 1;
                }
                gap = gap.max(last.elapsed());
                std::thread::sleep(Duration::from_millis(200));
            }
            (ok, refused, gap)
        })
    };
    // Three at once: one reads as fast as it can, one reads 64 KiB every
    // 50 ms (some 1.3 MB a second: cut at the deadline), one hangs up after
    // a megabyte.
    let started = Instant::now();
    let fast = std::thread::spawn(move || fetch(addr, "/tables/web", |_| true));
    let slow = std::thread::spawn(move || {
        fetch(addr, "/tables/web", |_| {
            std::thread::sleep(Duration::from_millis(50));
            true
        })
    });
    let gone = std::thread::spawn(move || {
        let mut n = 0;
        fetch(addr, "/tables/web", move |b| {
            n += b.len();
            n < 1 << 20
        })
    });
    let (fast, fast_end) = fast.join().unwrap();
    let (slow, slow_end) = slow.join().unwrap();
    let (gone, _) = gone.join().unwrap();
    let ended = fast_end.max(slow_end);
    // The work of the three has stopped once the threads that are not
    // workers are about idle: under a quarter of a core over a second.
    let mut busy = Vec::new();
    let quiet = wait_until(Duration::from_secs(20), || {
        let a = cpu_ticks_except(pid, "rte-worker");
        std::thread::sleep(Duration::from_secs(1));
        let ticks = cpu_ticks_except(pid, "rte-worker") - a;
        busy.push(ticks);
        ticks < 25
    });
    let quiet_after = ended.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let sampled = sampler.join().unwrap();
    let (probed, refused, gap) = probes.join().unwrap();
    let peak = proc_kib(pid, "VmHWM").max(sampled);
    let after = proc_kib(pid, "VmRSS");
    let growth_mib = peak.saturating_sub(base) / 1024;
    eprintln!(
        "fast: {fast:?} in {:?}; slow: {slow:?} in {:?}; hung up: {gone:?}",
        fast_end - started,
        slow_end - started
    );
    eprintln!(
        "resident: {base} KiB before, {peak} KiB at most (+{growth_mib} MiB), {after} KiB after; control threads' CPU ticks per second after: {busy:?}; /healthz {probed} answered, {refused} not, at most {gap:?} without an answer"
    );
    let bound = 3 * PER_REQUEST_MIB + MARGIN_MIB;
    assert!(growth_mib <= bound, "three dumps of the largest table grew the appliance by {growth_mib} MiB (bound {bound} MiB)");
    assert!(fast.is(200) && slow.is(200) && gone.is(200), "each is answered at once, the table sent as it is made: {fast:?} {slow:?} {gone:?}");
    assert!(fast.body_bytes > 8 << 20, "the fast reader got {} bytes", fast.body_bytes);
    assert!(gone.body_bytes >= 1 << 20 && !gone.complete);
    assert!(!slow.complete, "a slow reader of 400 MB got it all: {slow:?}");
    assert!(slow_end - started < timeout + Duration::from_secs(10), "the slow reader was not cut at the {timeout:?} deadline: {:?}", slow_end - started);
    assert!(quiet, "the control threads were still busy after the responses ended: {busy:?} ticks a second");
    assert!(quiet_after < Duration::from_secs(8), "the work went on {quiet_after:?} after the responses ended (ticks a second: {busy:?})");
    assert!(probed > 0 && gap < Duration::from_secs(5), "/healthz went {gap:?} without an answer while the table was fetched ({refused} of {} tries not answered)", probed + refused);
    assert!(healthy(addr));
    assert!(lb.running());
    let (code, out, err) = lb.stop("INT", Duration::from_secs(20));
    assert_eq!(code, Some(0), "exit status\n{out}\n{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
