//! What active checks cost the control side: ENDPOINTS endpoints checked
//! every 2 s (TCP connect, timeout 1 s) for SECONDS, on one thread, as
//! the appliance's control side runs them. Reported as the CPU time of the
//! checking thread over the time it ran (the share of a core); the same
//! with no endpoint is the baseline.
//!
//!     active_checks ENDPOINTS SECONDS                # loopback (127.1.x.y)
//!     active_checks ENDPOINTS SECONDS 10.77.0.0 PORT # those, from .1 up
//!
//! On loopback the endpoint's side of every handshake runs on the checking
//! thread too; `bench/active_checks.sh` runs the second form against a
//! network namespace whose packets are processed on the other core, as an
//! endpoint's answers are in the appliance (by the worker that writes
//! them to the exception interface).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::time::Duration;

use sluice::model::{CheckDef, Probe};

fn main() {
    let mut args = std::env::args().skip(1);
    let endpoints: u16 = args.next().map_or(10_000, |a| a.parse().expect("ENDPOINTS"));
    let seconds: u64 = args.next().map_or(20, |a| a.parse().expect("SECONDS"));
    let (base, port) = match (args.next(), args.next()) {
        (Some(b), Some(p)) => (u32::from(b.parse::<Ipv4Addr>().expect("BASE")), p.parse::<u16>().expect("PORT")),
        _ => {
            let listener = TcpListener::bind("0.0.0.0:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            std::thread::spawn(move || {
                for c in listener.incoming() {
                    drop(c);
                }
            });
            (u32::from(Ipv4Addr::new(127, 1, 0, 0)), port)
        }
    };
    let addrs: Vec<IpAddr> = (1..=u32::from(endpoints.max(1))).map(|i| IpAddr::V4(Ipv4Addr::from(base + i))).collect();
    let mut check = CheckDef::new(Probe::Tcp, port);
    (check.interval_ms, check.timeout_ms) = (2000, 1000);
    let run = Duration::from_secs(seconds);
    let (_, idle) = sluice::active_checks_cost(0, &addrs, check.clone(), run).unwrap();
    let (st, cpu) = sluice::active_checks_cost(endpoints, &addrs, check, run).unwrap();
    let share = |d: Duration| d.as_secs_f64() / run.as_secs_f64();
    println!("active checks: {endpoints} endpoints from {}, TCP every 2 s, {seconds} s", addrs[0]);
    println!("  checks run {}, failed {}, late {}, at most {} at once", st.run, st.failed, st.late, st.max_in_flight);
    println!("  checks per second: {:.0} (expected {:.0})", st.run as f64 / run.as_secs_f64(), f64::from(endpoints) / 2.0);
    println!("  baseline (no endpoint): {:.4} of a core", share(idle));
    println!("  with the checks:        {:.4} of a core ({:.1} % of a core; {:.1} us a check)", share(cpu), 100.0 * share(cpu), cpu.as_secs_f64() * 1e6 / st.run.max(1) as f64);
    if let Some(e) = st.endpoints.iter().find(|e| e.failures > 0) {
        println!("  a failure: {:?}", e.last_error);
    }
    // The floor: the same connections one after the other (socket,
    // SO_LINGER 0, connect, close), on this thread's own runtime.
    let n = usize::try_from(st.run).unwrap_or(usize::MAX).min(addrs.len() * 5);
    let floor = floor(&addrs[..usize::from(endpoints.max(1))], port, n);
    println!("  floor, the same connections one at a time: {:.1} us a check", floor.as_secs_f64() * 1e6 / n.max(1) as f64);
    println!("  checks / floor, per check: {:.2}", (cpu.as_secs_f64() / st.run.max(1) as f64) / (floor.as_secs_f64() / n.max(1) as f64));
}

/// CPU time of `n` TCP connections to `addrs` in turn, one at a time.
fn floor(addrs: &[IpAddr], port: u16, n: usize) -> Duration {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let t0 = sluice::thread_cpu().unwrap();
    rt.block_on(async {
        for i in 0..n {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            #[allow(deprecated)] // SO_LINGER 0: the close sends an RST, as the checks' do.
            s.set_linger(Some(Duration::ZERO)).unwrap();
            let c = s.connect(std::net::SocketAddr::new(addrs[i % addrs.len()], port)).await.unwrap();
            drop(c);
        }
    });
    sluice::thread_cpu().unwrap() - t0
}
