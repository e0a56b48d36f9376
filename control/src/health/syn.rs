//! TCP checks without a socket each: a SYN sent from a raw socket, and the
//! endpoint's answer read from it: a SYN-ACK (a listener) passes, an RST
//! (a closed port) fails. No connection is made: no socket of the
//! kernel's owns the port the SYN came from, so the kernel answers the
//! SYN-ACK with an RST and the endpoint forgets the half-open connection
//! (its application never sees it). A check of a TCP connection through
//! a kernel socket costs its creation, registration, connection and close;
//! this costs a send and a receive (bench/active_checks.sh measures both).
//!
//! - **Ports:** the SYNs come from [`PORTS`] ports per family, each held
//!   bound (not listening) by a TCP socket of the kernel's so that no
//!   connection of the kernel's takes it; checks of one endpoint at once
//!   take different ones.
//! - **Source address:** the kernel's route to the endpoint picks it (the
//!   address of the exception interface that reaches it), as for a socket
//!   of its own; learnt once per endpoint address from a UDP socket
//!   connected to it, and kept ([`MAX_SOURCES`] at most).
//! - **Answers:** a raw socket of IPPROTO_TCP receives a copy of every TCP
//!   segment the kernel receives; one task per family reads them and hands
//!   each answer to the check waiting for it: from that endpoint's address
//!   and port, to the SYN's port, acknowledging the SYN's sequence number.
//! - **Needs** `CAP_NET_RAW` (the appliance runs as root for DPDK); without
//!   it TCP checks connect a socket each ([`super::probe`]).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustix::net::{AddressFamily, SocketFlags, SocketType};
use tokio::sync::oneshot;

use crate::ground::lock;

/// Ports held per family.
pub(crate) const PORTS: usize = 64;
/// Bytes asked for each raw socket's receive buffer.
const RECV_BUFFER: usize = 4 << 20;
/// Endpoint addresses whose source address is kept.
const MAX_SOURCES: usize = 1 << 16;

/// What an endpoint answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// SYN-ACK: something listens.
    Open,
    /// RST: the port is closed.
    Refused,
}

/// A check waiting: (endpoint address, endpoint port, our port).
type Key = (IpAddr, u16, u16);

/// One family's raw socket and the ports it sends from.
struct Family {
    /// A raw socket, which tokio's UDP socket drives as well (datagrams
    /// sent to and received from an address).
    raw: Arc<tokio::net::UdpSocket>,
    ports: Vec<u16>,
    /// Holds the ports.
    _held: Vec<std::net::TcpListener>,
}

/// The prober: both families' raw sockets, the checks waiting for an
/// answer, and the source address of each endpoint address.
pub(crate) struct Prober {
    v4: Option<Family>,
    v6: Option<Family>,
    waiting: Mutex<HashMap<Key, (u32, oneshot::Sender<Answer>)>>,
    sources: Mutex<HashMap<IpAddr, IpAddr>>,
    next_port: AtomicUsize,
    next_seq: AtomicU32,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").field("v4", &self.v4.is_some()).field("v6", &self.v6.is_some()).finish_non_exhaustive()
    }
}

/// A raw TCP socket of `family`, non-blocking, registered with the runtime.
fn raw(family: AddressFamily) -> io::Result<tokio::net::UdpSocket> {
    let fd: OwnedFd = rustix::net::socket_with(family, SocketType::RAW, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, Some(rustix::net::ipproto::TCP))?;
    // Every TCP segment the kernel receives is copied here: room for a
    // burst while the reader waits its turn (the kernel caps it at
    // net.core.rmem_max).
    rustix::net::sockopt::set_socket_recv_buffer_size(&fd, RECV_BUFFER)?;
    tokio::net::UdpSocket::from_std(UdpSocket::from(fd))
}

/// `n` ports held by bound sockets that do not listen: a listener
/// bound then let go would free its port, so each is bound through a
/// socket that is kept, and never listens.
fn hold_ports(v6: bool, n: usize) -> io::Result<(Vec<u16>, Vec<std::net::TcpListener>)> {
    let (mut ports, mut held) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let family = if v6 { AddressFamily::INET6 } else { AddressFamily::INET };
        let fd = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
        if v6 {
            rustix::net::sockopt::set_ipv6_v6only(&fd, true)?;
            rustix::net::bind(&fd, &SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)))?;
        } else {
            rustix::net::bind(&fd, &SocketAddr::from(([0, 0, 0, 0], 0)))?;
        }
        let port = match rustix::net::getsockname(&fd)?.try_into() {
            Ok(a) => SocketAddr::port(&a),
            Err(_) => return Err(io::Error::other("a bound socket without an address")),
        };
        ports.push(port);
        // Kept as a std type only to close it on drop; it never listens.
        held.push(std::net::TcpListener::from(fd));
    }
    Ok((ports, held))
}

impl Prober {
    /// Opens the raw sockets (a family whose socket cannot be opened is
    /// left out: its checks connect) and starts the readers; `None` when
    /// neither opens (no `CAP_NET_RAW`).
    pub(crate) fn start() -> Option<Arc<Prober>> {
        let family = |v6: bool| -> io::Result<Family> {
            let raw = raw(if v6 { AddressFamily::INET6 } else { AddressFamily::INET })?;
            let (ports, held) = hold_ports(v6, PORTS)?;
            Ok(Family { raw: Arc::new(raw), ports, _held: held })
        };
        let (v4, v6) = (family(false), family(true));
        if let Err(e) = &v4 {
            tracing::info!(error = %e, "active checks: no raw IPv4 TCP socket; IPv4 TCP checks connect a socket each");
        }
        if let Err(e) = &v6 {
            tracing::info!(error = %e, "active checks: no raw IPv6 TCP socket; IPv6 TCP checks connect a socket each");
        }
        let (v4, v6) = (v4.ok(), v6.ok());
        if v4.is_none() && v6.is_none() {
            return None;
        }
        let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.subsec_nanos() | 1);
        let p = Arc::new(Prober {
            v4,
            v6,
            waiting: Mutex::new(HashMap::new()),
            sources: Mutex::new(HashMap::new()),
            next_port: AtomicUsize::new(0),
            next_seq: AtomicU32::new(seed),
        });
        for v6 in [false, true] {
            if let Some(f) = p.family(v6) {
                let (weak, raw) = (Arc::downgrade(&p), Arc::clone(&f.raw));
                tokio::spawn(async move { read_answers(&weak, &raw, v6).await });
            }
        }
        Some(p)
    }

    fn family(&self, v6: bool) -> Option<&Family> {
        if v6 { self.v6.as_ref() } else { self.v4.as_ref() }
    }

    /// Whether `to`'s family is probed here.
    pub(crate) fn covers(&self, to: SocketAddr) -> bool {
        self.family(to.is_ipv6()).is_some()
    }

    /// The source address the kernel picks for `to`.
    fn source(&self, to: IpAddr) -> io::Result<IpAddr> {
        if let Some(s) = lock(&self.sources).get(&to) {
            return Ok(*s);
        }
        let any: SocketAddr = if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
        let u = UdpSocket::bind(any)?;
        u.connect(SocketAddr::new(to, 9))?;
        let s = u.local_addr()?.ip();
        let mut sources = lock(&self.sources);
        if sources.len() >= MAX_SOURCES {
            sources.clear();
        }
        sources.insert(to, s);
        Ok(s)
    }

    /// Sends a SYN to `to` and waits for its answer (the caller bounds the
    /// wait).
    pub(crate) async fn probe(&self, to: SocketAddr) -> Result<Answer, String> {
        let fam = self.family(to.is_ipv6()).ok_or("no raw socket of this family")?;
        let src = self.source(to.ip()).map_err(|e| format!("no route: {e}"))?;
        let seq = self.next_seq.fetch_add(0x9e37_79b9, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        // A port no check of this endpoint waits on.
        let port = {
            let mut waiting = lock(&self.waiting);
            let start = self.next_port.fetch_add(1, Ordering::Relaxed);
            let free = (0..fam.ports.len()).map(|i| fam.ports[(start + i) % fam.ports.len()]).find(|p| !waiting.contains_key(&(to.ip(), to.port(), *p)));
            let Some(port) = free else { return Err(format!("{} checks of this endpoint at once already", fam.ports.len())) };
            waiting.insert((to.ip(), to.port(), port), (seq, tx));
            port
        };
        let key = (to.ip(), to.port(), port);
        let _gone = Waiting(self, key);
        let syn = syn(src, to, port, seq);
        fam.raw.send_to(&syn, SocketAddr::new(to.ip(), 0)).await.map_err(|e| format!("send: {e}"))?;
        rx.await.map_err(|_| "the prober stopped".to_owned())
    }
}

/// Takes a check's entry out of the table when it ends, answered or not.
struct Waiting<'a>(&'a Prober, Key);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.0.waiting).remove(&self.1);
    }
}

/// Reads one family's TCP segments and answers the checks waiting; ends
/// when the prober is dropped (at its next segment) or its socket fails.
async fn read_answers(p: &std::sync::Weak<Prober>, raw: &tokio::net::UdpSocket, v6: bool) {
    let mut buf = vec![0u8; 2048];
    loop {
        let (n, from) = match raw.recv_from(&mut buf).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "active checks: the raw socket failed; TCP checks of this family now time out");
                return;
            }
        };
        // IPv4 raw sockets give the IP header, IPv6 ones do not.
        let seg = buf.get(..n).unwrap_or_default();
        let tcp = if v6 { Some(seg) } else { seg.first().and_then(|b| seg.get(usize::from(b & 0x0f) * 4..)) };
        let Some((key, answer, ack)) = tcp.and_then(|t| answer_of(from.ip(), t)) else { continue };
        let Some(prober) = p.upgrade() else { return };
        let mut waiting = lock(&prober.waiting);
        if waiting.get(&key).is_some_and(|(seq, _)| ack == seq.wrapping_add(1)) {
            if let Some((_, tx)) = waiting.remove(&key) {
                let _ = tx.send(answer);
            }
        }
    }
}

/// A segment from `from`: the check it answers, what it says, and what
/// it acknowledges; `None` unless it is a SYN-ACK or an RST with ACK.
fn answer_of(from: IpAddr, t: &[u8]) -> Option<(Key, Answer, u32)> {
    if t.len() < 20 {
        return None;
    }
    let sport = u16::from_be_bytes([t[0], t[1]]);
    let dport = u16::from_be_bytes([t[2], t[3]]);
    let ack = u32::from_be_bytes([t[8], t[9], t[10], t[11]]);
    let flags = t[13];
    let (syn, rst, ackf) = (flags & 0x02 != 0, flags & 0x04 != 0, flags & 0x10 != 0);
    let answer = match (syn, rst, ackf) {
        (true, false, true) => Answer::Open,
        (false, true, true) => Answer::Refused,
        _ => return None,
    };
    Some(((from, sport, dport), answer, ack))
}

/// A SYN from `src`:`sport` to `to`, with an MSS option, its checksum
/// over the pseudo-header.
fn syn(src: IpAddr, to: SocketAddr, sport: u16, seq: u32) -> [u8; 24] {
    let mut t = [0u8; 24];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&to.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 6 << 4; // six words: the header and the MSS option
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]); // MSS 1460
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    match (src, to.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            add(&s.octets());
            add(&d.octets());
            add(&[0, 6, 0, 24]);
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            add(&v6(s));
            add(&v6(d));
            add(&[0, 0, 0, 24, 0, 0, 0, 6]);
        }
    }
    add(&t);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[allow(clippy::cast_possible_truncation)] // folded to 16 bits above
    let c = !(sum as u16);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syn_carries_its_checksum() {
        // Summing a segment with its checksum over the pseudo-header gives 0xffff.
        let (src, to) = (IpAddr::from([10, 0, 0, 1]), SocketAddr::from(([10, 0, 0, 2], 80)));
        let t = syn(src, to, 40000, 12345);
        let mut sum: u32 = 0;
        for w in [10u16 << 8, 1, 10 << 8, 2, 6, 24] {
            sum += u32::from(w);
        }
        for w in t.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
        }
        while sum >> 16 != 0 {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff);
        assert_eq!((t[13], u16::from_be_bytes([t[2], t[3]])), (0x02, 80));
    }

    #[test]
    fn only_syn_acks_and_resets_answer() {
        let from = IpAddr::from([10, 0, 0, 2]);
        let mut t = [0u8; 20];
        t[0..2].copy_from_slice(&80u16.to_be_bytes());
        t[2..4].copy_from_slice(&40000u16.to_be_bytes());
        t[8..12].copy_from_slice(&12346u32.to_be_bytes());
        t[13] = 0x12;
        assert_eq!(answer_of(from, &t), Some(((from, 80, 40000), Answer::Open, 12346)));
        t[13] = 0x14;
        assert_eq!(answer_of(from, &t).map(|a| a.1), Some(Answer::Refused));
        t[13] = 0x10;
        assert_eq!(answer_of(from, &t), None, "a bare ACK says nothing");
        assert_eq!(answer_of(from, &t[..19]), None);
    }

    /// Over loopback (needs CAP_NET_RAW: skipped without it): a listener
    /// answers, a closed port refuses, and the listener never accepts a
    /// connection.
    #[tokio::test]
    async fn a_listener_answers_and_a_closed_port_refuses() {
        let Some(p) = Prober::start() else {
            eprintln!("no raw sockets here (CAP_NET_RAW): skipped");
            return;
        };
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = l.local_addr().unwrap();
        for _ in 0..3 {
            assert_eq!(p.probe(open).await, Ok(Answer::Open));
        }
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        assert_eq!(p.probe(closed).await, Ok(Answer::Refused));
        let accepted = tokio::time::timeout(std::time::Duration::from_millis(200), l.accept()).await;
        assert!(accepted.is_err(), "no connection was made");
        assert!(lock(&p.waiting).is_empty(), "every answered check left");
        if let Ok(l6) = tokio::net::TcpListener::bind("[::1]:0").await {
            assert_eq!(p.probe(l6.local_addr().unwrap()).await, Ok(Answer::Open));
        }
    }
}
