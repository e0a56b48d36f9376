//! TCP checks without a socket each: a SYN sent from a raw socket, and the
//! endpoint's answer read from it: a SYN-ACK (a listener) passes, an RST
//! (a closed port) fails. No connection is made: no socket of the
//! kernel's owns the port the SYN came from, so the kernel answers the
//! SYN-ACK with an RST and the endpoint forgets the half-open connection
//! (its application never sees it). A check of a TCP connection through
//! a kernel socket costs its creation, registration, connection and close;
//! this costs a send and a share of a receive (bench/active_checks.sh
//! measures both).
//!
//! - **Ports:** the SYNs come from [`PORTS`] ports per family, each held
//!   bound (not listening) by a TCP socket of the kernel's so that no
//!   connection of the kernel's takes it, taken in turn; an answer is told
//!   by its address, ports and the sequence number it acknowledges.
//! - **Checks of the VIP** (`target: vip`): the SYN to the VIP is a whole
//!   IP packet sent from an `IPPROTO_RAW` socket to the endpoint's
//!   address, so the kernel routes it (and resolves the MAC) as for the
//!   endpoint and it reaches the VIP there, as the worker delivers the
//!   VIP's traffic at layer 2. The answer comes from the VIP to the
//!   appliance's address; the worker hands it to the kernel, and the
//!   prober sends the RST that ends the half-open connection the same way
//!   (the kernel's own would go to the VIP, not to that endpoint).
//! - **Source address:** the kernel's route to the endpoint picks it (the
//!   address of the exception interface that reaches it), as for a socket
//!   of its own; learnt once per endpoint address from a UDP socket
//!   connected to it, and kept ([`MAX_SOURCES`] at most).
//! - **Answers:** a raw socket of IPPROTO_TCP receives a copy of every TCP
//!   segment the kernel receives. It is not watched: the active checks'
//!   task reads what came ([`Inline::drain`]) each time it wakes, which is
//!   at least every [`super::active::BATCH`] while checks wait for an
//!   answer. Thousands of answers a second then cost a hundred wake-ups,
//!   not one each; a check's time is read to within that tick. An answer
//!   is taken from that endpoint's address and port, to the SYN's port,
//!   acknowledging the SYN's sequence number.
//! - **Deadlines:** the checks' task times them out itself ([`Inline`]):
//!   no task, future or timer per check.
//! - **Needs** `CAP_NET_RAW` (the appliance runs as root for DPDK); without
//!   it TCP checks connect a socket each ([`super::probe`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::net::{AddressFamily, SocketFlags, SocketType};

/// Ports held per family.
pub(crate) const PORTS: usize = 64;
/// Bytes asked for each raw socket's receive buffer: what the kernel's TCP
/// receives between two reads.
const RECV_BUFFER: usize = 4 << 20;
/// Endpoint addresses whose source address is kept.
const MAX_SOURCES: usize = 1 << 16;
/// Segments read from one family's socket at most per drain (the rest at
/// the next: a flood of the kernel's TCP does not hold the task).
const MAX_READ: usize = 1 << 16;

/// What an endpoint answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// SYN-ACK: something listens.
    Open,
    /// RST: the port is closed.
    Refused,
}

/// A check waiting: (the address its answer comes from, that port, our
/// port, our SYN's sequence number). The sequence number tells apart
/// checks of one VIP through different endpoints from the same port.
pub(crate) type Key = (IpAddr, u16, u16, u32);

/// One family's raw sockets and the ports it sends from.
struct Family {
    /// A raw socket, non-blocking, read and written directly (no runtime
    /// watches it).
    raw: UdpSocket,
    ports: Vec<u16>,
    /// Holds the ports.
    _held: Vec<std::net::TcpListener>,
}

/// The prober: both families' raw sockets, the checks waiting for an
/// answer (their sequence number and tag), and the source address of each
/// endpoint address.
pub(crate) struct Prober {
    v4: Option<Family>,
    v6: Option<Family>,
    /// Tag of each check waiting, and the endpoint a check of the VIP
    /// went through (its SYN-ACK is answered with an RST the same way).
    waiting: HashMap<Key, (u64, Option<IpAddr>)>,
    sources: HashMap<IpAddr, IpAddr>,
    next_port: usize,
    next_seq: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober").field("v4", &self.v4.is_some()).field("v6", &self.v6.is_some()).finish_non_exhaustive()
    }
}

/// A raw TCP socket of `family`, non-blocking.
fn raw(family: AddressFamily) -> io::Result<UdpSocket> {
    let fd: OwnedFd = rustix::net::socket_with(family, SocketType::RAW, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, Some(rustix::net::ipproto::TCP))?;
    // Every TCP segment the kernel receives is copied here: room for those
    // of a tick (the kernel caps it at net.core.rmem_max).
    rustix::net::sockopt::set_socket_recv_buffer_size(&fd, RECV_BUFFER)?;
    Ok(UdpSocket::from(fd))
}

/// Sends the whole IP packet `packet` to `via` from a raw socket of its
/// family (`IPPROTO_RAW`, opened once and shared: it is only written): the
/// kernel takes the route, and the next hop's MAC, from `via`, and leaves
/// the packet's own destination (a VIP) as it is. A check of the VIP so
/// reaches the VIP at the endpoint's MAC, as the worker delivers the VIP's
/// traffic at layer 2.
pub(crate) fn send_whole(packet: &[u8], via: IpAddr) -> Result<(), String> {
    static WHOLE: [OnceLock<Option<UdpSocket>>; 2] = [OnceLock::new(), OnceLock::new()];
    let v6 = via.is_ipv6();
    let socket = WHOLE[usize::from(v6)].get_or_init(|| {
        let family = if v6 { AddressFamily::INET6 } else { AddressFamily::INET };
        rustix::net::socket_with(family, SocketType::RAW, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC, Some(rustix::net::ipproto::RAW))
            .map(|fd: OwnedFd| UdpSocket::from(fd))
            .map_err(|e| tracing::info!(error = %e, v6, "active checks: no raw socket for whole IP packets (CAP_NET_RAW); checks of the VIP fail"))
            .ok()
    });
    let socket = socket.as_ref().ok_or("a check of the VIP needs a raw socket (CAP_NET_RAW)")?;
    rustix::net::sendto(socket, packet, rustix::net::SendFlags::empty(), &SocketAddr::new(via, 0)).map_err(|e| format!("send: {e}"))?;
    Ok(())
}

/// The source address the kernel picks for `to` (that of the exception
/// interface that reaches it), from a UDP socket connected to it.
pub(crate) fn source_for(to: IpAddr) -> io::Result<IpAddr> {
    let any: SocketAddr = if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let u = UdpSocket::bind(any)?;
    u.connect(SocketAddr::new(to, 9))?;
    Ok(u.local_addr()?.ip())
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
    /// left out: its checks connect); `None` when neither opens (no
    /// `CAP_NET_RAW`).
    pub(crate) fn start() -> Option<Prober> {
        let family = |v6: bool| -> io::Result<Family> {
            let raw = raw(if v6 { AddressFamily::INET6 } else { AddressFamily::INET })?;
            let (ports, held) = hold_ports(v6, PORTS)?;
            Ok(Family { raw, ports, _held: held })
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
        Some(Prober { v4, v6, waiting: HashMap::new(), sources: HashMap::new(), next_port: 0, next_seq: seed, buf: vec![0; 2048] })
    }

    fn family(&self, v6: bool) -> Option<&Family> {
        if v6 { self.v6.as_ref() } else { self.v4.as_ref() }
    }

    /// Whether `to`'s family is probed here.
    pub(crate) fn covers(&self, to: SocketAddr) -> bool {
        self.family(to.is_ipv6()).is_some()
    }

    /// The source address the kernel picks for `to`.
    fn source(&mut self, to: IpAddr) -> io::Result<IpAddr> {
        if let Some(s) = self.sources.get(&to) {
            return Ok(*s);
        }
        let s = source_for(to)?;
        if self.sources.len() >= MAX_SOURCES {
            self.sources.clear();
        }
        self.sources.insert(to, s);
        Ok(s)
    }

    /// Sends a SYN to `to`, through endpoint `via` for a check of the VIP
    /// `to` (the SYN goes to the endpoint's MAC, as the worker sends the
    /// VIP's traffic at layer 2). The ports are taken in turn: one
    /// endpoint's checks, an interval apart, take different ones. Its
    /// answer is read by [`Prober::drain`] under `tag`.
    pub(crate) fn send(&mut self, to: SocketAddr, via: Option<IpAddr>, tag: u64) -> Result<Key, String> {
        let hop = via.unwrap_or(to.ip());
        if hop.is_ipv4() != to.is_ipv4() {
            return Err(format!("{to} and the endpoint {hop} are of different families"));
        }
        let src = self.source(hop).map_err(|e| format!("no route: {e}"))?;
        let fam = self.family(to.is_ipv6()).ok_or("no raw socket of this family")?;
        let port = fam.ports[self.next_port % fam.ports.len()];
        let seq = self.next_seq;
        // A raw socket's send does not wait: a full send buffer is a
        // failed check (sent again at its next interval).
        let syn = syn(src, to, port, seq, 0x02);
        match via {
            None => drop(rustix::net::sendto(&fam.raw, &syn, rustix::net::SendFlags::empty(), &SocketAddr::new(to.ip(), 0)).map_err(|e| format!("send: {e}"))?),
            Some(via) => send_whole(&ip_packet(src, to.ip(), TCP, &syn), via)?,
        }
        self.next_port = self.next_port.wrapping_add(1);
        self.next_seq = seq.wrapping_add(0x9e37_79b9);
        let key = (to.ip(), to.port(), port, seq);
        self.waiting.insert(key, (tag, via));
        Ok(key)
    }

    /// Resets the half-open connection a check of the VIP through `via`
    /// left at the endpoint (the kernel's own RST would go to the VIP,
    /// which is not routed back to that endpoint).
    fn reset(&mut self, key: &Key, via: IpAddr) {
        let (vip, port, ours, seq) = *key;
        let Ok(src) = self.source(via) else { return };
        let rst = syn(src, SocketAddr::new(vip, port), ours, seq.wrapping_add(1), 0x04);
        // Best effort: the endpoint forgets it anyway after its retries.
        let _ = send_whole(&ip_packet(src, vip, TCP, &rst), via);
    }

    /// Forgets a check (an answer that comes later is not taken).
    pub(crate) fn forget(&mut self, key: &Key) {
        self.waiting.remove(key);
    }

    /// Reads what both families' sockets received, and gives `answered`
    /// the tag of each check answered and what the endpoint said.
    pub(crate) fn drain(&mut self, mut answered: impl FnMut(u64, Answer)) {
        for v6 in [false, true] {
            for _ in 0..MAX_READ {
                let Some(fam) = (if v6 { self.v6.as_ref() } else { self.v4.as_ref() }) else { break };
                let (n, from) = match fam.raw.recv_from(&mut self.buf) {
                    Ok(r) => r,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "active checks: reading the raw socket failed");
                        break;
                    }
                };
                // IPv4 raw sockets give the IP header, IPv6 ones do not.
                let seg = self.buf.get(..n).unwrap_or_default();
                let tcp = if v6 { Some(seg) } else { seg.first().and_then(|b| seg.get(usize::from(b & 0x0f) * 4..)) };
                let Some((key, answer)) = tcp.and_then(|t| answer_of(from.ip(), t)) else { continue };
                if let Some((tag, via)) = self.waiting.remove(&key) {
                    if let (Answer::Open, Some(via)) = (answer, via) {
                        self.reset(&key, via);
                    }
                    answered(tag, answer);
                }
            }
        }
    }
}

/// TCP checks sent for a task that runs them without a task, a future or a
/// timer each: what each check is to the caller (`T`), when it was sent,
/// and the deadlines (one queue per timeout, in which they come in the
/// order sent).
pub(crate) struct Inline<T> {
    prober: Prober,
    pending: HashMap<u64, (T, Instant, Key)>,
    deadlines: BTreeMap<Duration, VecDeque<(Instant, u64)>>,
    next_tag: u64,
}

impl<T> Inline<T> {
    pub(crate) fn new(prober: Prober) -> Inline<T> {
        Inline { prober, pending: HashMap::new(), deadlines: BTreeMap::new(), next_tag: 0 }
    }

    /// Whether `to`'s family is probed here.
    pub(crate) fn covers(&self, to: SocketAddr) -> bool {
        self.prober.covers(to)
    }

    /// Sends a SYN to `to` (through endpoint `via`: a check of the VIP
    /// `to`), to be answered within `timeout`; the error of a check that
    /// failed at once.
    pub(crate) fn send(&mut self, to: SocketAddr, via: Option<IpAddr>, timeout: Duration, what: T, now: Instant) -> Result<(), String> {
        let tag = self.next_tag;
        let key = self.prober.send(to, via, tag)?;
        self.next_tag += 1;
        self.pending.insert(tag, (what, now, key));
        self.deadlines.entry(timeout).or_default().push_back((now + timeout, tag));
        Ok(())
    }

    /// The checks answered since the last drain, read at `now`, with their
    /// results (the time from the SYN to `now`).
    pub(crate) fn drain(&mut self, now: Instant) -> Vec<(T, Result<Duration, String>)> {
        let mut out = Vec::new();
        // Read even with no check waiting: what came meanwhile leaves
        // room for the answers of the next.
        let pending = &mut self.pending;
        self.prober.drain(|tag, answer| {
            if let Some((what, sent, _)) = pending.remove(&tag) {
                out.push((
                    what,
                    match answer {
                        Answer::Open => Ok(now.saturating_duration_since(sent)),
                        Answer::Refused => Err("connection refused (RST)".to_owned()),
                    },
                ));
            }
        });
        out
    }

    /// The checks unanswered at their deadline, forgotten by the prober.
    pub(crate) fn expired(&mut self, now: Instant) -> Vec<(T, String)> {
        let mut out = Vec::new();
        for (timeout, queue) in &mut self.deadlines {
            while let Some(&(_, tag)) = queue.front().filter(|(d, _)| *d <= now) {
                queue.pop_front();
                if let Some((what, _, key)) = self.pending.remove(&tag) {
                    self.prober.forget(&key);
                    out.push((what, format!("no answer within {} ms", timeout.as_millis())));
                }
            }
        }
        self.deadlines.retain(|_, q| !q.is_empty());
        out
    }

    /// The earliest deadline.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.values().filter_map(|q| q.front().map(|(d, _)| *d)).min()
    }

    /// Whether checks wait for an answer.
    pub(crate) fn waiting(&self) -> bool {
        !self.pending.is_empty()
    }
}

/// A segment from `from`: the check it answers (the sequence number it
/// acknowledges, less one) and what it says; `None` unless it is a SYN-ACK
/// or an RST with ACK.
fn answer_of(from: IpAddr, t: &[u8]) -> Option<(Key, Answer)> {
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
    Some(((from, sport, dport, ack.wrapping_sub(1)), answer))
}

/// IP protocol numbers.
const TCP: u8 = 6;
pub(crate) const UDP: u8 = 17;

/// The IP packet from `src` to `dst` carrying `seg`, a segment of protocol
/// `proto` (IPv4: DF, TTL 64, the kernel fills in the length,
/// identification and checksum; IPv6: hop limit 64).
pub(crate) fn ip_packet(src: IpAddr, dst: IpAddr, proto: u8, seg: &[u8]) -> Vec<u8> {
    let len = u16::try_from(seg.len()).unwrap_or(u16::MAX);
    let mut p = Vec::with_capacity(40 + seg.len());
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            p.extend_from_slice(&[0x45, 0]);
            p.extend_from_slice(&(len + 20).to_be_bytes());
            p.extend_from_slice(&[0, 0, 0x40, 0, 64, proto, 0, 0]);
            p.extend_from_slice(&s.octets());
            p.extend_from_slice(&d.octets());
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            p.extend_from_slice(&[0x60, 0, 0, 0]);
            p.extend_from_slice(&len.to_be_bytes());
            p.extend_from_slice(&[proto, 64]);
            p.extend_from_slice(&v6(s));
            p.extend_from_slice(&v6(d));
        }
    }
    p.extend_from_slice(seg);
    p
}

/// A SYN (`flags` 0x02) or an RST (0x04) from `src`:`sport` to `to`, with
/// an MSS option, its checksum over the pseudo-header.
fn syn(src: IpAddr, to: SocketAddr, sport: u16, seq: u32, flags: u8) -> [u8; 24] {
    let mut t = [0u8; 24];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&to.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[12] = 6 << 4; // six words: the header and the MSS option
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t[20..24].copy_from_slice(&[2, 4, 0x05, 0xb4]); // MSS 1460
    let c = l4_checksum(src, to.ip(), TCP, &t);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

/// The TCP or UDP checksum of `seg` (its checksum field zero) from `src` to
/// `dst`, over the pseudo-header.
pub(crate) fn l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, seg: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    // Every slice but the last is of even length.
    let mut add = |b: &[u8]| {
        for w in b.chunks(2) {
            sum += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
    };
    let len = u32::try_from(seg.len()).unwrap_or(u32::MAX);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            add(&s.octets());
            add(&d.octets());
            add(&[0, proto]);
            add(&len.to_be_bytes()[2..]);
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            add(&v6(s));
            add(&v6(d));
            add(&len.to_be_bytes());
            add(&[0, 0, 0, proto]);
        }
    }
    add(seg);
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    #[allow(clippy::cast_possible_truncation)] // folded to 16 bits above
    let c = !(sum as u16);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syn_carries_its_checksum() {
        // Summing a segment with its checksum over the pseudo-header gives 0xffff.
        let (src, to) = (IpAddr::from([10, 0, 0, 1]), SocketAddr::from(([10, 0, 0, 2], 80)));
        let t = syn(src, to, 40000, 12345, 0x02);
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
    fn checksums_of_odd_segments_and_of_ipv6_hold() {
        // A UDP datagram of odd length, over each family: summing the
        // pseudo-header and the datagram with its checksum gives 0xffff,
        // which is what `l4_checksum` of it then returns the complement of.
        for (src, dst) in [(IpAddr::from([10, 0, 0, 1]), IpAddr::from([20, 0, 0, 1])), ("fd00::1".parse().unwrap(), "fd00:20::1".parse().unwrap())] {
            let mut u = vec![0x9c, 0x40, 0, 53, 0, 11, 0, 0, b'a', b'b', b'c'];
            let c = l4_checksum(src, dst, UDP, &u);
            u[6..8].copy_from_slice(&c.to_be_bytes());
            assert_eq!(l4_checksum(src, dst, UDP, &u), 0, "{dst}");
        }
        let p = ip_packet(IpAddr::from([10, 0, 0, 1]), IpAddr::from([20, 0, 0, 1]), UDP, &[0; 9]);
        assert_eq!((p[0], p[9], &p[16..20], p.len()), (0x45, UDP, &[20, 0, 0, 1][..], 29));
        let p = ip_packet("fd00::1".parse().unwrap(), "fd00:20::1".parse().unwrap(), TCP, &[0; 20]);
        assert_eq!((p[0], p[5], p[6], p.len()), (0x60, 20, TCP, 60));
    }

    #[test]
    fn only_syn_acks_and_resets_answer() {
        let from = IpAddr::from([10, 0, 0, 2]);
        let mut t = [0u8; 20];
        t[0..2].copy_from_slice(&80u16.to_be_bytes());
        t[2..4].copy_from_slice(&40000u16.to_be_bytes());
        t[8..12].copy_from_slice(&12346u32.to_be_bytes());
        t[13] = 0x12;
        assert_eq!(answer_of(from, &t), Some(((from, 80, 40000, 12345), Answer::Open)));
        t[13] = 0x14;
        assert_eq!(answer_of(from, &t).map(|a| a.1), Some(Answer::Refused));
        t[13] = 0x10;
        assert_eq!(answer_of(from, &t), None, "a bare ACK says nothing");
        assert_eq!(answer_of(from, &t[..19]), None);
    }

    /// Over loopback (skipped without CAP_NET_RAW): a listener's answer
    /// ends its check with the time taken, a closed port's with a refusal,
    /// the listener never accepts a connection; a check past its deadline
    /// is forgotten, and its answer, coming later, is not taken.
    #[tokio::test]
    async fn checks_are_answered_when_drained_or_expire() {
        let Some(p) = Prober::start() else {
            eprintln!("no raw sockets here (CAP_NET_RAW): skipped");
            return;
        };
        let mut inline = Inline::new(p);
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = l.local_addr().unwrap();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let second = Duration::from_secs(1);
        let drained = |inline: &mut Inline<&'static str>, n: usize| {
            let mut got = Vec::new();
            for _ in 0..200 {
                got.extend(inline.drain(Instant::now()));
                if got.len() >= n {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            got.sort_by_key(|g| g.0);
            got
        };
        let t0 = Instant::now();
        for _ in 0..3 {
            inline.send(open, None, second, "open", t0).unwrap();
        }
        inline.send(closed, None, second, "closed", t0).unwrap();
        let got = drained(&mut inline, 4);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], ("closed", Err("connection refused (RST)".to_owned())));
        assert!(got[1..].iter().all(|g| g.0 == "open" && g.1.as_ref().is_ok_and(|d| *d < second)), "{got:?}");
        assert!(!inline.waiting() && inline.prober.waiting.is_empty(), "every answered check left");
        let accepted = tokio::time::timeout(Duration::from_millis(200), l.accept()).await;
        assert!(accepted.is_err(), "no connection was made");
        assert_eq!(inline.next_deadline(), Some(t0 + second), "deadlines stay queued until they pass");
        assert!(inline.expired(t0 + second).is_empty(), "all were answered");
        assert_eq!(inline.next_deadline(), None);
        // No time to answer: expired at once, forgotten by the prober, and
        // the answer that comes anyway is not taken.
        let t1 = Instant::now();
        inline.send(open, None, Duration::ZERO, "late", t1).unwrap();
        assert_eq!(inline.expired(t1), vec![("late", "no answer within 0 ms".to_owned())]);
        assert!(inline.prober.waiting.is_empty());
        std::thread::sleep(Duration::from_millis(100));
        assert!(inline.drain(Instant::now()).is_empty(), "a forgotten check's answer is dropped");
        if let Ok(l6) = tokio::net::TcpListener::bind("[::1]:0").await {
            inline.send(l6.local_addr().unwrap(), None, second, "v6", Instant::now()).unwrap();
            let got = drained(&mut inline, 1);
            assert!(got.len() == 1 && got[0].1.is_ok(), "{got:?}");
        }
    }
}
