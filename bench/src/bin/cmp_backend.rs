//! A backend for `bench/compare_ns.sh`: the protocol of `scripts/backend.py`
//! (TCP port 80: "<name>\n" on accept, then every line echoed back prefixed
//! with the name, until the client closes) without Python's cost per
//! connection, and a UDP sink on port 53 of each VIP that only receives
//! (what arrived is read from the namespace's `/proc/net/snmp`).
//!
//! Usage: `cmp_backend NAME VIP...` (IPv4 VIPs; runs until killed).
#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

/// What can stop the backend before it serves.
#[derive(Debug, thiserror::Error)]
enum BackendError {
    /// Bad arguments.
    #[error("usage: cmp_backend NAME VIP... ({0})")]
    Usage(String),
    /// A socket could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        addr: SocketAddrV4,
        #[source]
        source: std::io::Error,
    },
}

fn serve_tcp(c: TcpStream, name: &[u8]) -> std::io::Result<()> {
    c.set_nodelay(true)?;
    let mut w = c.try_clone()?;
    w.write_all(name)?;
    w.write_all(b"\n")?;
    let mut r = BufReader::new(c);
    let mut line = Vec::with_capacity(64);
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line)? == 0 {
            return Ok(());
        }
        let mut out = Vec::with_capacity(name.len() + 1 + line.len());
        out.extend_from_slice(name);
        out.push(b' ');
        out.extend_from_slice(&line);
        w.write_all(&out)?;
    }
}

fn udp_sink(s: &UdpSocket) {
    let mut buf = [0u8; 2048];
    loop {
        // Errors (a signal, a full buffer) only mean nothing was read.
        let _ = s.recv_from(&mut buf);
    }
}

fn run() -> Result<(), BackendError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (name, vips) = args.split_first().ok_or_else(|| BackendError::Usage("no name".into()))?;
    let name: Arc<[u8]> = Arc::from(name.as_bytes());
    for v in vips {
        let ip: Ipv4Addr = v.parse().map_err(|e| BackendError::Usage(format!("VIP `{v}`: {e}")))?;
        let addr = SocketAddrV4::new(ip, 53);
        let s = UdpSocket::bind(addr).map_err(|source| BackendError::Bind { addr, source })?;
        thread::spawn(move || udp_sink(&s));
    }
    let addr = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 80);
    let l = TcpListener::bind(addr).map_err(|source| BackendError::Bind { addr, source })?;
    for c in l.incoming() {
        let Ok(c) = c else { continue };
        let name = Arc::clone(&name);
        thread::spawn(move || {
            // A client that goes away mid-exchange is its own business.
            let _ = serve_tcp(c, &name);
        });
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cmp_backend: {e}");
            ExitCode::FAILURE
        }
    }
}
