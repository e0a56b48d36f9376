//! Parsing of the route, service and endpoint fields shared by the
//! appliance file and the Kubernetes-style manifests.

// Integers are range-checked by `Node::int` before any narrowing cast.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::net::Ipv6Addr;

use sluice_dataplane::addr::{Addr, Cidr};
use sluice_dataplane::classify::{ByteMatch, PortRange};
use sluice_dataplane::maglev::{is_prime, next_prime};
use sluice_dataplane::parse::proto;

use super::node::Node;
use crate::problem::Problems;
use crate::model::{limits, simple_name, CheckDef, CheckTarget, Probe};

/// Why `text` (an address, or `address/length`) may not be written as it
/// is: IPv4 addresses are kept as IPv4-mapped IPv6 inside, so a mapped
/// address written by hand (`::ffff:20.0.0.1`) would silently become IPv4.
pub fn mapped_v4(text: &str) -> Option<String> {
    let (a, len) = match text.trim().split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (text.trim(), None),
    };
    let v4 = a.parse::<Ipv6Addr>().ok()?.to_ipv4_mapped()?;
    let ipv4_form = match len.map(|l| l.trim().parse::<u8>()) {
        None => v4.to_string(),
        Some(Ok(l)) if (96..=128).contains(&l) => format!("{v4}/{}", l - 96),
        Some(_) => return Some(format!("{text:?} is an IPv4-mapped IPv6 address: write IPv4 addresses and prefixes in their IPv4 form")),
    };
    Some(format!("{text:?} is an IPv4-mapped IPv6 address: write the IPv4 form, {ipv4_form}"))
}

/// An IP address (not IPv4-mapped IPv6).
pub(crate) fn addr(n: Node<'_>, p: &mut Problems) -> Option<Addr> {
    let s = n.string(p)?;
    if let Some(why) = mapped_v4(&s) {
        n.bad(p, why);
        return None;
    }
    match s.trim().parse::<Addr>() {
        Ok(a) => Some(a),
        Err(e) => {
            n.bad(p, format!("{s:?} is not an IP address: {e}"));
            None
        }
    }
}

/// A destination that must be a single address (a VIP): `a.b.c.d`,
/// `a.b.c.d/32`, `x::y` or `x::y/128`.
pub(crate) fn vip(n: Node<'_>, p: &mut Problems) -> Option<Addr> {
    let s = n.string(p)?;
    let s = s.trim();
    if let Some(why) = mapped_v4(s) {
        n.bad(p, why);
        return None;
    }
    if let Some((a, len)) = s.split_once('/') {
        let addr: Addr = match a.parse() {
            Ok(a) => a,
            Err(_) => {
                n.bad(p, format!("{s:?} is not an IP address"));
                return None;
            }
        };
        let host = if addr.is_v4() { "32" } else { "128" };
        if len != host {
            n.bad(p, format!("VIP {s} is not a /32 or /128: a route's destinations are single addresses"));
            return None;
        }
        return Some(addr);
    }
    match s.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            n.bad(p, format!("{s:?} is not an IP address"));
            None
        }
    }
}

/// A prefix like `10.0.0.0/8` (not IPv4-mapped IPv6).
pub(crate) fn cidr(n: Node<'_>, p: &mut Problems) -> Option<Cidr> {
    let s = n.string(p)?;
    if let Some(why) = mapped_v4(&s) {
        n.bad(p, why);
        return None;
    }
    n.parse::<Cidr>(p, "a CIDR prefix")
}

/// `80`, `8000-8080` or `any`.
pub(crate) fn port_range(n: Node<'_>, p: &mut Problems) -> Option<PortRange> {
    let s = n.string(p)?;
    let s = s.trim();
    if s == "any" {
        return Some(PortRange::ANY);
    }
    let num = |t: &str| -> Option<u16> { t.trim().parse().ok() };
    let r = match s.split_once('-') {
        Some((a, b)) => match (num(a), num(b)) {
            (Some(lo), Some(hi)) => PortRange { lo, hi },
            _ => {
                n.bad(p, format!("{s:?} is not a port range (0-65535, like 80, 8000-8080 or any)"));
                return None;
            }
        },
        None => match num(s) {
            Some(x) => PortRange::single(x),
            None => {
                n.bad(p, format!("{s:?} is not a port (0-65535, like 80, 8000-8080 or any)"));
                return None;
            }
        },
    };
    if r.lo > r.hi {
        n.bad(p, format!("port range {s} is reversed (write {}-{})", r.hi, r.lo));
        return None;
    }
    Some(r)
}

/// TCP, UDP or SCTP (any case).
pub(crate) fn protocol(n: Node<'_>, p: &mut Problems) -> Option<u8> {
    let s = n.string(p)?;
    match s.to_ascii_uppercase().as_str() {
        "TCP" => Some(proto::TCP),
        "UDP" => Some(proto::UDP),
        "SCTP" => Some(proto::SCTP),
        _ => {
            n.bad(p, format!("unknown protocol {s:?} (expected TCP, UDP or SCTP)"));
            None
        }
    }
}

/// Name of a transport protocol number.
pub fn protocol_name(p: u8) -> &'static str {
    match p {
        proto::TCP => "TCP",
        proto::UDP => "UDP",
        proto::SCTP => "SCTP",
        _ => "?",
    }
}

fn number(t: &str) -> Option<u32> {
    let t = t.trim();
    match t.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    }
}

/// `proto[offset:len] & mask = value` (tcpdump-like, as in Meridio and
/// nfqlb): `len` is 1, 2 or 4 bytes, the mask is optional.
pub(crate) fn byte_match(n: Node<'_>, p: &mut Problems) -> Option<ByteMatch> {
    let s = n.string(p)?;
    let fail = |p: &mut Problems, why: &str| {
        n.bad(p, format!("byte match {s:?}: {why} (format: tcp[13:1] & 0x02 = 0x02)"));
        None
    };
    let Some((lhs, value)) = s.split_once('=') else { return fail(p, "missing \"= value\"") };
    let (field, mask) = match lhs.split_once('&') {
        Some((f, m)) => (f.trim(), Some(m.trim())),
        None => (lhs.trim(), None),
    };
    let Some((pname, rest)) = field.split_once('[') else { return fail(p, "expected proto[offset:length]") };
    let protocol = match pname.trim() {
        "tcp" => proto::TCP,
        "udp" => proto::UDP,
        "sctp" => proto::SCTP,
        other => return fail(p, &format!("unknown protocol {other:?} (tcp, udp or sctp)")),
    };
    let Some(inner) = rest.strip_suffix(']') else { return fail(p, "missing ']'") };
    let Some((off, len)) = inner.split_once(':') else { return fail(p, "expected [offset:length]") };
    let Some(offset) = number(off).and_then(|o| u16::try_from(o).ok()) else { return fail(p, "bad offset") };
    let len = match number(len) {
        Some(l @ (1 | 2 | 4)) => l as u8,
        _ => return fail(p, "length must be 1, 2 or 4"),
    };
    if u32::from(offset) + u32::from(len) > limits::BYTE_MATCH_END_MAX {
        return fail(p, &format!("offset {offset} is beyond the largest packet ({} bytes)", limits::BYTE_MATCH_END_MAX));
    }
    let full = if len == 4 { u32::MAX } else { (1u32 << (8 * u32::from(len))) - 1 };
    let mask = match mask {
        Some(m) => match number(m) {
            Some(m) if m <= full => m,
            _ => return fail(p, "bad mask (hexadecimal, as wide as the length)"),
        },
        None => full,
    };
    let Some(value) = number(value) else { return fail(p, "bad value") };
    if value & !mask != 0 {
        return fail(p, "the value has bits outside the mask: it can never match");
    }
    Some(ByteMatch { proto: protocol, offset, len, mask, value })
}

/// A service's endpoint limit (identifiers are `0..limit`).
pub(crate) fn endpoint_limit(n: Node<'_>, p: &mut Problems) -> Option<u32> {
    n.bounded(p).map(|v| v as u32)
}

/// A lookup-table size: a prime, at most [`limits::TABLE_SIZE_MAX`] (that
/// it is not below the endpoint limit is checked when the service is
/// resolved, as the limit may come from the defaults).
pub(crate) fn table_size(n: Node<'_>, p: &mut Problems) -> Option<u32> {
    let m = n.bounded(p)? as u32;
    if !is_prime(m) {
        n.bad(p, format!("table size {m} is not a prime (the next prime is {})", next_prime(m)));
        return None;
    }
    Some(m)
}

/// Why `m` cannot be a next hop's MAC (`None` for a unicast one): frames
/// sent to a broadcast or multicast MAC reach every host of the segment
/// (each backend would see every flow), and the all-zero MAC is no host's.
pub fn not_unicast(m: [u8; 6]) -> Option<&'static str> {
    if m == [0xff; 6] {
        Some("the broadcast MAC")
    } else if m[0] & 1 != 0 {
        Some("a multicast MAC")
    } else if m == [0; 6] {
        Some("the all-zero MAC")
    } else {
        None
    }
}

/// A unicast MAC address `aa:bb:cc:dd:ee:ff` (an endpoint's or a
/// gateway's).
pub(crate) fn mac(n: Node<'_>, p: &mut Problems) -> Option<[u8; 6]> {
    let s = n.string(p)?;
    let parts: Vec<&str> = s.trim().split(':').collect();
    let mut m = [0u8; 6];
    if !(parts.len() == 6 && parts.iter().zip(m.iter_mut()).all(|(t, b)| u8::from_str_radix(t, 16).map(|v| *b = v).is_ok())) {
        n.bad(p, format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"));
        return None;
    }
    if let Some(what) = not_unicast(m) {
        n.bad(p, format!("{s:?} is {what}: a next hop needs a unicast MAC (the low bit of the first byte clear)"));
        return None;
    }
    Some(m)
}

/// A name usable as an identifier: letters, digits, `-`, `_`, `.`.
pub(crate) fn name(n: Node<'_>, p: &mut Problems) -> Option<String> {
    let s = n.string(p)?;
    if !simple_name(&s) {
        n.bad(p, format!("{s:?} is not a valid name (letters, digits, '-', '_', '.'; at most {})", limits::NAME_MAX_LEN));
        return None;
    }
    Some(s)
}

/// The bytes of `text`, two hex digits a byte (spaces between them).
fn hex_bytes(text: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if digits.len() % 2 != 0 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return Err(format!("{text:?} is not hex (two digits a byte)"));
    }
    Ok(digits.chunks(2).filter_map(|d| std::str::from_utf8(d).ok().and_then(|d| u8::from_str_radix(d, 16).ok())).collect())
}

/// A check's `target`: `endpoint` or `vip`.
fn check_target(n: Node<'_>, p: &mut Problems) -> Option<CheckTarget> {
    match n.string(p).as_deref() {
        Some("endpoint") => Some(CheckTarget::Endpoint),
        Some("vip") => Some(CheckTarget::Vip),
        Some(other) => {
            n.bad(p, format!("{other:?} is not a check target (endpoint: the endpoint's own address; vip: the service's VIP, through the endpoint)"));
            None
        }
        None => None,
    }
}

/// An active health check: `protocol` (tcp, http, https, udp or dns) and
/// `port` required; `target` (endpoint, the default, or vip: not http);
/// `intervalMs`, `timeoutMs`, `rise`, `fall`; `path`,
/// `host` and `expectStatus` for http and https; `send` and `expect` for udp; `query` for
/// dns. Every number bounded ([`CheckDef::problems`]).
pub(crate) fn health_check(n: Node<'_>, p: &mut Problems) -> Option<CheckDef> {
    let before = p.0.len();
    if !n.section(p) {
        return None;
    }
    let protocol = n.required(p, "protocol", |n, p| n.string(p)).flatten();
    let port = n.required(p, "port", |n, p| n.bounded(p)).flatten();
    let only = |key: &str, allowed: &[&str], p: &mut Problems| {
        if !protocol.as_deref().is_some_and(|x| allowed.contains(&x)) {
            n.field(key, |k| k.bad(p, format!("{key} is for {} checks", allowed.join(" and "))));
        }
    };
    const WEB: &[&str] = &["http", "https"];
    for (key, allowed) in [("path", WEB), ("host", WEB), ("expectStatus", WEB), ("send", &["udp"]), ("expect", &["udp"]), ("sendHex", &["udp"]), ("expectHex", &["udp"]), ("query", &["dns"])] {
        only(key, allowed, p);
    }
    let text = |key: &str, p: &mut Problems| n.field(key, |n| n.string(p)).flatten();
    let probe = match protocol.as_deref() {
        Some("tcp") => Some(Probe::Tcp),
        Some(web @ ("http" | "https")) => {
            let mut statuses = Vec::new();
            n.field("expectStatus", |n| {
                n.each(p, |n, p| {
                    if let Some(r) = port_range(n, p) {
                        if (100..=599).contains(&r.lo) && r.hi <= 599 {
                            statuses.push((r.lo, r.hi));
                        } else {
                            n.bad(p, format!("{}-{} is not a range of HTTP statuses (100..599)", r.lo, r.hi));
                        }
                    }
                });
            });
            if statuses.is_empty() {
                statuses.push((200, 399));
            }
            Some(Probe::Http { path: text("path", p).unwrap_or_else(|| "/".to_owned()), host: text("host", p), statuses, tls: web == "https" })
        }
        Some("udp") => {
            // Each payload as text, or as hex (`...Hex`: two digits a byte,
            // spaces allowed between them), not both.
            let hex = |key: &str, p: &mut Problems| n.field(key, |k| k.string(p).and_then(|t| hex_bytes(&t).map_err(|why| k.bad(p, why)).ok())).flatten();
            let payload = |key: &str, p: &mut Problems| match (text(key, p), hex(&format!("{key}Hex"), p)) {
                (Some(_), Some(_)) => {
                    n.field(key, |k| k.bad(p, format!("{key} and {key}Hex: give one")));
                    None
                }
                (t, h) => t.map(String::into_bytes).or(h),
            };
            let send = payload("send", p);
            let expect = payload("expect", p).unwrap_or_default();
            if send.is_none() && n.field("send", |_| ()).is_none() && n.field("sendHex", |_| ()).is_none() {
                n.bad(p, "a UDP check needs send or sendHex (the datagram it sends)");
            }
            send.map(|send| Probe::Udp { send, expect })
        }
        Some("dns") => Some(Probe::Dns { name: text("query", p).unwrap_or_else(|| ".".to_owned()) }),
        Some(other) => {
            n.field("protocol", |k| k.bad(p, format!("{other:?} is not a health check protocol (tcp, http, https, udp or dns)")));
            None
        }
        None => None,
    };
    let int = |key: &str, p: &mut Problems| n.field(key, |n| n.bounded(p)).flatten().map(|v| v as u32);
    let interval = int("intervalMs", p);
    let timeout = int("timeoutMs", p);
    let rise = int("rise", p);
    let fall = int("fall", p);
    let target = n.field("target", |k| check_target(k, p)).flatten();
    let mut check = CheckDef::new(probe?, port? as u16);
    check.target = target.unwrap_or_default();
    check.interval_ms = interval.unwrap_or(check.interval_ms);
    check.timeout_ms = timeout.unwrap_or(check.timeout_ms.min(check.interval_ms));
    check.rise = rise.unwrap_or(check.rise);
    check.fall = fall.unwrap_or(check.fall);
    if p.0.len() > before {
        return None;
    }
    let problems = check.problems();
    for m in &problems {
        n.bad(p, m.clone());
    }
    problems.is_empty().then_some(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::yaml::{document, Budget};

    /// The messages of the problems a field was refused with, shown
    /// joined by `; `.
    #[derive(Debug, thiserror::Error)]
    #[error("{}", .0.join("; "))]
    struct Refused(Vec<String>);

    fn one<T>(text: &str, f: impl FnOnce(Node<'_>, &mut Problems) -> Option<T>) -> Result<T, Refused> {
        let quoted = format!("'{}'", text.replace('\'', "''"));
        let v = document(&quoted, &mut Budget::default()).unwrap();
        let mut p = Problems::default();
        f(Node::root(&v, "f"), &mut p).ok_or_else(|| Refused(p.0.iter().map(|x| x.message.clone()).collect()))
    }

    #[test]
    fn byte_matches() {
        let b = one("tcp[13:1] & 0x02 = 0x02", byte_match).unwrap();
        assert_eq!((b.proto, b.offset, b.len, b.mask, b.value), (proto::TCP, 13, 1, 2, 2));
        let b = one("sctp[8:4] = 0x01020304", byte_match).unwrap();
        assert_eq!((b.mask, b.value), (u32::MAX, 0x0102_0304));
        assert!(one("udp[0:3] = 1", byte_match).unwrap_err().to_string().contains("length must be 1, 2 or 4"));
        assert!(one("icmp[0:1] = 1", byte_match).unwrap_err().to_string().contains("unknown protocol"));
        assert!(one("tcp[0:1] & 0x0f = 0x10", byte_match).unwrap_err().to_string().contains("never match"));
        assert!(one("tcp[0:1] & 0x1ff = 1", byte_match).unwrap_err().to_string().contains("bad mask"));
        assert!(one("tcp[9596:4] = 1", byte_match).is_ok(), "the last four bytes of the largest packet");
        assert!(one("tcp[9597:4] = 1", byte_match).unwrap_err().to_string().contains("offset 9597 is beyond the largest packet (9600 bytes)"));
        assert!(one("tcp[65535:4] = 1", byte_match).unwrap_err().to_string().contains("beyond the largest packet"));
    }

    #[test]
    fn mapped_addresses_are_written_as_ipv4() {
        let want = "\"::ffff:20.0.0.1\" is an IPv4-mapped IPv6 address: write the IPv4 form, 20.0.0.1";
        assert_eq!(one("::ffff:20.0.0.1", vip).unwrap_err().to_string(), want);
        assert_eq!(one("::ffff:20.0.0.1", addr).unwrap_err().to_string(), want);
        assert!(one("::ffff:20.0.0.1/128", vip).unwrap_err().to_string().contains("write the IPv4 form, 20.0.0.1/32"));
        assert!(one("::ffff:10.0.0.0/104", cidr).unwrap_err().to_string().contains("write the IPv4 form, 10.0.0.0/8"));
        assert!(one("::FFFF:0a00:0001", addr).unwrap_err().to_string().contains("write the IPv4 form, 10.0.0.1"), "in any spelling");
        assert!(one("::ffff:0:0/64", cidr).unwrap_err().to_string().contains("in their IPv4 form"));
        assert!(one("2001:db8::1", addr).unwrap().to_string().starts_with("2001:db8::"));
        assert!(one("::1", addr).is_ok());
        assert!(one("10.0.0.1", addr).unwrap().is_v4());
        assert!(one("::/0", cidr).is_ok());
    }

    #[test]
    fn ports_vips_macs() {
        assert_eq!(one("8000-8080", port_range).unwrap(), PortRange { lo: 8000, hi: 8080 });
        assert_eq!(one("any", port_range).unwrap(), PortRange::ANY);
        assert!(one("90-80", port_range).unwrap_err().to_string().contains("reversed (write 80-90)"));
        assert!(one("70000", port_range).unwrap_err().to_string().contains("not a port"));
        assert_eq!(one("20.0.0.1/32", vip).unwrap(), "20.0.0.1".parse().unwrap());
        assert!(one("20.0.0.0/24", vip).unwrap_err().to_string().contains("not a /32 or /128"));
        assert!(one("2001:db8::1/64", vip).unwrap_err().to_string().contains("not a /32 or /128"));
        assert_eq!(one("02:00:00:aa:bb:0c", mac).unwrap(), [2, 0, 0, 0xaa, 0xbb, 0x0c]);
        assert!(one("02:00:00:aa:bb", mac).is_err());
        assert!(one("FF:FF:FF:FF:FF:FF", mac).unwrap_err().to_string().contains("is the broadcast MAC"), "in any spelling");
        assert!(one("03:00:00:00:00:01", mac).unwrap_err().to_string().contains("is a multicast MAC"));
        assert!(one("0:0:0:0:0:0", mac).unwrap_err().to_string().contains("is the all-zero MAC"));
        assert_eq!(one("fe:ff:ff:ff:ff:ff", mac).unwrap(), [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff], "locally administered unicast");
        assert!(one("web tier", name).is_err());
    }

    #[test]
    fn health_checks_take_defaults_and_refuse_what_cannot_be_checked() {
        let check = |text: &str| {
            let v = document(text, &mut Budget::default()).unwrap();
            let mut p = Problems::default();
            health_check(Node::root(&v, "f").with_schema(&crate::config::schema::FILE, "services[].healthCheck"), &mut p).ok_or_else(|| p.0.iter().map(|x| x.to_string()).collect::<Vec<_>>().join("; "))
        };
        let c = check("{protocol: tcp, port: 80}").unwrap();
        assert_eq!((c.probe.clone(), c.port, c.interval_ms, c.timeout_ms, c.rise, c.fall), (Probe::Tcp, 80, 2000, 1000, 2, 3));
        let c = check("{protocol: http, port: 8080, path: /healthz, expectStatus: [200, 300-302], intervalMs: 500, rise: 1, fall: 2}").unwrap();
        assert_eq!(c.probe, Probe::Http { path: "/healthz".into(), host: None, statuses: vec![(200, 200), (300, 302)], tls: false });
        assert_eq!((c.interval_ms, c.timeout_ms, c.rise, c.fall), (500, 500, 1, 2), "the timeout is at most the interval");
        let c = check("{protocol: https, port: 8443, host: web.example}").unwrap();
        assert_eq!(c.probe, Probe::Http { path: "/".into(), host: Some("web.example".into()), statuses: vec![(200, 399)], tls: true });
        assert_eq!(c.to_string(), "https/8443 GET / every 2000ms, timeout 1000ms, rise 2, fall 3");
        assert_eq!(check("{protocol: dns, port: 53}").unwrap().probe, Probe::Dns { name: ".".into() });
        assert_eq!(check("{protocol: udp, port: 53, send: ping, expect: pong}").unwrap().probe, Probe::Udp { send: b"ping".to_vec(), expect: b"pong".to_vec() });
        let c = check("{protocol: udp, port: 9, sendHex: '00 01 ff', expectHex: 0A0b}").unwrap();
        assert_eq!(c.probe, Probe::Udp { send: vec![0, 1, 255], expect: vec![10, 11] });
        assert_eq!(c.target, CheckTarget::Endpoint, "the endpoint's own address by default");
        let c = check("{protocol: tcp, port: 80, target: vip}").unwrap();
        assert_eq!(c.target, CheckTarget::Vip);
        assert_eq!(c.to_string(), "tcp/80 to the VIP every 2000ms, timeout 1000ms, rise 2, fall 3");
        assert_eq!(check("{protocol: tcp, port: 80, target: endpoint}").unwrap().target, CheckTarget::Endpoint);
        assert_eq!(check("{protocol: dns, port: 53, target: vip}").unwrap().target, CheckTarget::Vip);
        assert_eq!(check("{protocol: udp, port: 9, send: x, target: vip}").unwrap().target, CheckTarget::Vip);
        for (text, why) in [
            ("{protocol: tcp, port: 80, target: node}", "\"node\" is not a check target"),
            ("{protocol: http, port: 80, target: vip}", "a check of the VIP (target: vip) is a tcp, udp or dns check; an http check"),
            ("{protocol: https, port: 443, target: vip}", "an https check goes to the endpoint's own address"),
            ("{protocol: tcp}", "missing field \"port\""),
            ("{protocol: smtp, port: 25}", "not a health check protocol"),
            ("{protocol: tcp, port: 80, path: /}", "path is for http and https checks"),
            ("{protocol: tcp, port: 80, intervalMs: 50}", "out of range 100..=3600000"),
            ("{protocol: tcp, port: 80, intervalMs: 1000, timeoutMs: 2000}", "timeout 2000 ms is outside 10..=the interval (1000 ms)"),
            ("{protocol: tcp, port: 80, fall: 0}", "out of range 1..=100"),
            ("{protocol: udp, port: 53}", "needs send or sendHex"),
            ("{protocol: udp, port: 53, send: a, sendHex: '61'}", "send and sendHex: give one"),
            ("{protocol: udp, port: 53, sendHex: '6'}", "is not hex"),
            ("{protocol: udp, port: 53, sendHex: zz}", "is not hex"),
            ("{protocol: tcp, port: 80, sendHex: '61'}", "sendHex is for udp checks"),
            ("{protocol: http, port: 80, path: healthz}", "must start with /"),
            ("{protocol: http, port: 80, path: '/a<b>'}", "a URI's path and query characters"),
            ("{protocol: http, port: 80, expectStatus: 700}", "not a range of HTTP statuses"),
            ("{protocol: dns, port: 53, query: 'a..b'}", "is not a DNS name"),
            ("{protocol: tcp, port: 80, every: 2}", "every"),
        ] {
            let e = check(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
