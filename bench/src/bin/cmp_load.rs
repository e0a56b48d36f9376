//! Client traffic for `bench/compare_ns.sh`, run in the client namespace.
//!
//! ```text
//! cmp_load tcp VIP:PORT WORKERS SECONDS
//!     closed loop: each worker connects, reads the backend's name, sends
//!     "ping\n", reads "<name> ping", closes, and starts again at once.
//!     Prints {"connections", "failed", "seconds", "connections_per_s",
//!     "latency_us": {"p50","p99","p999","max"}, "per_backend": {name: n}}
//!     (latency: from connect() to the echoed line, completed ones only).
//! cmp_load udp VIP:PORT RATE_PPS SECONDS FLOWS
//!     paced sender: FLOWS connected sockets (one source port each), RATE
//!     datagrams/s in bursts every millisecond, round robin over the flows.
//!     Prints {"sent", "errors", "seconds", "offered_pps"} (errors: datagrams
//!     the kernel refused, not sent and not in "sent").
//! ```
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::json;

/// What stops a measurement before it starts.
#[derive(Debug, thiserror::Error)]
enum LoadError {
    /// Bad arguments.
    #[error("usage: cmp_load tcp VIP:PORT WORKERS SECONDS | udp VIP:PORT RATE_PPS SECONDS FLOWS ({0})")]
    Usage(String),
    /// A UDP socket could not be opened or connected.
    #[error("udp socket to {addr}: {source}")]
    Socket {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The histogram refused its bounds.
    #[error("histogram: {0}")]
    Histogram(String),
    /// A worker thread panicked.
    #[error("a worker thread panicked")]
    Worker,
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, what: &str) -> Result<T, LoadError>
where
    T::Err: std::fmt::Display,
{
    let s = args.get(i).ok_or_else(|| LoadError::Usage(format!("missing {what}")))?;
    s.parse().map_err(|e| LoadError::Usage(format!("{what} `{s}`: {e}")))
}

/// One exchange: the backend's name, or why it failed.
fn exchange(addr: SocketAddr) -> std::io::Result<String> {
    let timeout = Duration::from_secs(3);
    let c = TcpStream::connect_timeout(&addr, timeout)?;
    c.set_read_timeout(Some(timeout))?;
    c.set_nodelay(true)?;
    let mut w = c.try_clone()?;
    let mut r = BufReader::new(c);
    let mut name = String::new();
    r.read_line(&mut name)?;
    let name = name.trim_end().to_owned();
    w.write_all(b"ping\n")?;
    let mut echo = String::new();
    r.read_line(&mut echo)?;
    if name.is_empty() || !echo.starts_with(&format!("{name} ping")) {
        return Err(std::io::Error::other(format!("bad echo {echo:?} from {name:?}")));
    }
    Ok(name)
}

struct WorkerResult {
    hist: Histogram<u64>,
    failed: u64,
    per_backend: BTreeMap<String, u64>,
}

fn tcp(args: &[String]) -> Result<serde_json::Value, LoadError> {
    let addr: SocketAddr = arg(args, 0, "VIP:PORT")?;
    let workers: usize = arg(args, 1, "WORKERS")?;
    let secs: f64 = arg(args, 2, "SECONDS")?;
    if workers == 0 || secs.is_nan() || secs <= 0.0 {
        return Err(LoadError::Usage("WORKERS and SECONDS must be positive".into()));
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(secs);
    let mut handles = Vec::with_capacity(workers);
    for _ in 0..workers {
        let hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| LoadError::Histogram(e.to_string()))?;
        handles.push(thread::spawn(move || {
            let mut res = WorkerResult { hist, failed: 0, per_backend: BTreeMap::new() };
            while Instant::now() < end {
                let t0 = Instant::now();
                match exchange(addr) {
                    Ok(name) => {
                        let us = u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX);
                        res.hist.saturating_record(us.max(1));
                        *res.per_backend.entry(name).or_default() += 1;
                    }
                    Err(_) => {
                        res.failed += 1;
                        // A refused or reset connection returns at once: do
                        // not spin on it.
                        thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            res
        }));
    }
    let mut total = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| LoadError::Histogram(e.to_string()))?;
    let mut failed = 0;
    let mut per_backend: BTreeMap<String, u64> = BTreeMap::new();
    for h in handles {
        let r = h.join().map_err(|_| LoadError::Worker)?;
        total.add(&r.hist).map_err(|e| LoadError::Histogram(e.to_string()))?;
        failed += r.failed;
        for (k, v) in r.per_backend {
            *per_backend.entry(k).or_default() += v;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let n = total.len();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let cps = n as f64 / elapsed;
    Ok(json!({
        "connections": n,
        "failed": failed,
        "seconds": elapsed,
        "connections_per_s": cps,
        "latency_us": {
            "p50": total.value_at_quantile(0.50),
            "p99": total.value_at_quantile(0.99),
            "p999": total.value_at_quantile(0.999),
            "max": total.max(),
        },
        "per_backend": per_backend,
    }))
}

fn udp(args: &[String]) -> Result<serde_json::Value, LoadError> {
    let addr: SocketAddr = arg(args, 0, "VIP:PORT")?;
    let rate: u64 = arg(args, 1, "RATE_PPS")?;
    let secs: f64 = arg(args, 2, "SECONDS")?;
    let flows: usize = arg(args, 3, "FLOWS")?;
    if rate == 0 || flows == 0 || secs.is_nan() || secs <= 0.0 {
        return Err(LoadError::Usage("RATE_PPS, SECONDS and FLOWS must be positive".into()));
    }
    let mut socks = Vec::with_capacity(flows);
    for _ in 0..flows {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(|source| LoadError::Socket { addr, source })?;
        s.connect(addr).map_err(|source| LoadError::Socket { addr, source })?;
        socks.push(s);
    }
    let payload = [0x5au8; 18];
    let (mut sent, mut errors, mut attempts) = (0u64, 0u64, 0u64);
    let start = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let mut next = 0usize;
    loop {
        let el = start.elapsed();
        if el >= dur {
            break;
        }
        // Due by the end of the current millisecond.
        let due = u64::try_from((el.as_micros() / 1000 + 1) * u128::from(rate) / 1000).unwrap_or(u64::MAX);
        while attempts < due {
            match socks[next].send(&payload) {
                Ok(_) => sent += 1,
                Err(_) => errors += 1,
            }
            attempts += 1;
            next = (next + 1) % flows;
        }
        let tick_end = Duration::from_millis(u64::try_from(el.as_millis()).unwrap_or(u64::MAX) + 1);
        if let Some(wait) = tick_end.checked_sub(start.elapsed()) {
            thread::sleep(wait);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    let offered = attempts as f64 / elapsed;
    Ok(json!({"sent": sent, "errors": errors, "seconds": elapsed, "offered_pps": offered}))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("tcp") => tcp(&args[1..]),
        Some("udp") => udp(&args[1..]),
        _ => Err(LoadError::Usage("mode tcp or udp".into())),
    };
    match res {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cmp_load: {e}");
            ExitCode::FAILURE
        }
    }
}
