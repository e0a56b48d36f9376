//! What the workers forward with, shown by endpoint address: each
//! service's lookup table (so two appliances can be compared slot by slot:
//! the same digest means every slot sends to the same endpoint address) and
//! the explanation of one flow (which route, service and endpoint it gets,
//! and why).

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};

use serde::Serialize;
use sluice_dataplane::classify::Lookup;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::hash::{flow_hash, reduce};
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{ethertype, parse, proto, Frame};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::service::{Algorithm, Delivery, Service};
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::verdict::Verdict;

use crate::sync::agree::{self, slots};

/// One service's table, summed up.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(super) struct TableSummary {
    /// Service.
    pub(crate) service: String,
    /// Algorithm for new flows.
    pub(crate) algorithm: String,
    /// Flows remembered per worker.
    pub(crate) flow_table: bool,
    /// Slots (0 when no endpoint takes new flows).
    pub(crate) size: u32,
    /// Endpoints taking new flows: (identifier, address, slots).
    pub(crate) endpoints: Vec<(u16, String, u32)>,
    /// SHA-256 of the endpoint address of every slot, in order.
    pub(crate) digest: String,
}

/// A table in full: runs of consecutive slots with the same endpoint (the
/// whole value that [`write_dump`]'s stream is checked against).
#[cfg(test)]
#[derive(Debug, Serialize)]
pub(super) struct TableDump {
    /// The summary.
    #[serde(flatten)]
    pub(crate) summary: TableSummary,
    /// (endpoint address, consecutive slots), from slot 0.
    pub(crate) runs: Vec<(String, u32)>,
}

/// The summary, its digest taken slot by slot.
fn summary(s: &Service) -> TableSummary {
    summary_of(s, digest(s))
}

/// SHA-256 of the endpoint address of every slot, in hex (the digest the
/// siblings compare).
fn digest(s: &Service) -> String {
    agree::hex(&agree::table_digest(s))
}

/// The digests of the tables summed up lately. A built service never
/// changes (a change builds another), so a table polled again, as while a
/// change is awaited, is not hashed again: hashing its slots (16 bytes
/// each, 100 KiB at the default size for 32 endpoints) would take most of
/// a poll's time.
#[derive(Debug, Default)]
pub(super) struct Digests(Mutex<VecDeque<(Weak<Service>, String)>>);

/// How many digests are kept: the services summed up last.
const DIGESTS_KEPT: usize = 64;

impl Digests {
    /// The digest of `s`'s table.
    fn of(&self, s: &Arc<Service>) -> String {
        // A kept weak reference keeps the service's allocation, so no other
        // service can be at the same address while its digest is kept.
        if let Some((_, d)) = crate::ground::lock(&self.0).iter().find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(s))) {
            return d.clone();
        }
        let d = digest(s);
        let mut kept = crate::ground::lock(&self.0);
        kept.retain(|(w, _)| w.strong_count() > 0);
        if kept.len() >= DIGESTS_KEPT {
            kept.pop_front();
        }
        kept.push_back((Arc::downgrade(s), d.clone()));
        d
    }
}

fn summary_of(s: &Service, digest: String) -> TableSummary {
    let endpoints = s.endpoints().zip(s.entry_counts()).filter(|&(_, n)| n > 0).map(|(e, n)| (e.id, e.addr.to_string(), n)).collect();
    TableSummary {
        service: s.name.clone(),
        algorithm: s.algorithm.to_string(),
        flow_table: s.flow_table,
        size: s.table.as_ref().map_or(0, |t| t.size()),
        endpoints,
        digest,
    }
}

/// The service named `service`.
fn named<'a>(snap: &'a Snapshot, service: &str) -> Option<&'a Arc<Service>> {
    // The compiler lays services out in name order: a binary search (the
    // admin endpoint is polled while changes are timed; a pass over 10,000
    // names costs the control thread as much as a change does). A snapshot
    // made in another order is searched from end to end.
    match snap.services.binary_search_by(|s| s.name.as_str().cmp(service)) {
        Ok(i) => snap.services.get(i),
        Err(_) => snap.services.iter().find(|s| s.name == service),
    }
}

/// One service's table summed up, without its slots (cheap enough to poll:
/// its digest is taken once, then kept in `digests`).
pub(super) fn summary_for(snap: &Snapshot, service: &str, digests: &Digests) -> Option<TableSummary> {
    named(snap, service).map(|s| summary_of(s, digests.of(s)))
}

/// Every service's table, by service name (the whole value that
/// [`write_summaries`]' stream is checked against).
#[cfg(test)]
pub(super) fn summaries(snap: &Snapshot) -> Vec<TableSummary> {
    let mut v: Vec<TableSummary> = snap.services.iter().map(|s| summary(s)).collect();
    v.sort_by(|a, b| a.service.cmp(&b.service));
    v
}

/// The runs of consecutive slots with the same endpoint address, from
/// slot 0, computed as they are taken.
fn runs(s: &Service) -> impl Iterator<Item = (String, u32)> + '_ {
    let mut slots = slots(s).peekable();
    std::iter::from_fn(move || {
        let a = slots.next()?;
        let mut n = 1u32;
        while slots.next_if_eq(&a).is_some() {
            n += 1;
        }
        Some((a.map_or_else(|| "-".to_owned(), |a| a.to_string()), n))
    })
}

/// One service's table in full.
#[cfg(test)]
pub(super) fn dump(snap: &Snapshot, service: &str) -> Option<TableDump> {
    let s = named(snap, service)?;
    Some(TableDump { summary: summary(s), runs: runs(s).collect() })
}

/// The service named `service`, if the snapshot has it.
pub(super) fn find(snap: &Arc<Snapshot>, service: &str) -> Option<Arc<Service>> {
    named(snap, service).cloned()
}

/// Writes [`dump`]'s JSON (pretty, as the other views) of the service `s`
/// to `w` as it is computed: the runs are never all held (a table of
/// 16,777,213 slots has millions), so what it holds does not grow with the
/// table. An error of `w` (the client went away, the request's time is
/// up) stops it.
pub(super) fn write_dump(s: &Arc<Service>, digests: &Digests, w: impl std::io::Write) -> std::io::Result<()> {
    /// The runs, serialized as a list while they are computed.
    struct Runs<'a>(&'a Service);
    impl Serialize for Runs<'_> {
        fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
            ser.collect_seq(runs(self.0))
        }
    }
    /// [`TableDump`]'s fields, in its order.
    #[derive(Serialize)]
    struct Streamed<'a> {
        #[serde(flatten)]
        summary: TableSummary,
        runs: Runs<'a>,
    }
    let out = Streamed { summary: summary_of(s, digests.of(s)), runs: Runs(s) };
    serde_json::to_writer_pretty(w, &out).map_err(std::io::Error::other)
}

/// Tables of this many slots or more have their digest kept by
/// [`write_summaries`] (hashing the largest, 16,777,213 slots, takes most
/// of a second); smaller ones are hashed again, so that listing thousands
/// of services does not push the large ones out of [`Digests`].
const KEEP_DIGESTS_FROM: u32 = 1 << 20;

/// Writes [`summaries`]' JSON to `w` one service at a time.
pub(super) fn write_summaries(snap: &Snapshot, digests: &Digests, w: impl std::io::Write) -> std::io::Result<()> {
    /// The services' summaries by name, each made as it is written.
    struct All<'a>(&'a Snapshot, &'a Digests);
    impl Serialize for All<'_> {
        fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
            let mut order: Vec<&Arc<Service>> = self.0.services.iter().collect();
            order.sort_by(|a, b| a.name.cmp(&b.name));
            ser.collect_seq(order.into_iter().map(|s| match &s.table {
                Some(t) if t.size() >= KEEP_DIGESTS_FROM => summary_of(s, self.1.of(s)),
                _ => summary(s),
            }))
        }
    }
    serde_json::to_writer_pretty(w, &All(snap, digests)).map_err(std::io::Error::other)
}

/// The endpoint a flow gets, and why.
#[derive(Debug, Serialize)]
pub(super) struct Explanation {
    /// The flow, as understood.
    pub(crate) flow: String,
    /// What happens to it, in one sentence.
    pub(crate) verdict: String,
    /// The winning route.
    pub(crate) route: Option<String>,
    /// Its priority.
    pub(crate) priority: Option<i32>,
    /// The route's service.
    pub(crate) service: Option<String>,
    /// The service's algorithm.
    pub(crate) algorithm: Option<String>,
    /// The flow hash and the table slot it selects (Maglev).
    pub(crate) slot: Option<(String, u32)>,
    /// The endpoint: (identifier, address).
    pub(crate) endpoint: Option<(u16, String)>,
    /// How the packet reaches it.
    pub(crate) delivery: Option<String>,
    /// What the explanation could not take into account.
    pub(crate) notes: Vec<String>,
}

/// Parses `tcp|udp|sctp`.
pub(super) fn protocol(s: &str) -> Option<u8> {
    match s.to_ascii_lowercase().as_str() {
        "tcp" => Some(proto::TCP),
        "udp" => Some(proto::UDP),
        "sctp" => Some(proto::SCTP),
        _ => None,
    }
}

/// The port a packet explained arrives on.
const EXPLAIN_PORT: u8 = 0;

/// Why a flow cannot be explained: its two addresses are of two families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("src and dst must both be IPv4 or both IPv6")]
pub(super) struct MixedFamilies;

/// The first packet of a new flow from `src` to `dst`: a TCP SYN, or a UDP
/// or SCTP packet without payload, addressed at layer 2 to the port it
/// arrives on (in its VLAN). IPv4 when both addresses are; IPv6 (with the 16 bytes as
/// given, `::ffff:a.b.c.d` included) when both are.
fn first_packet(snap: &Snapshot, protocol: u8, src: SocketAddr, dst: SocketAddr) -> Result<Vec<u8>, MixedFamilies> {
    let l4 = match protocol {
        proto::TCP => craft::tcp(src.port(), dst.port(), 0x02, &[]),
        proto::UDP => craft::udp(src.port(), dst.port(), &[]),
        _ => craft::sctp(src.port(), dst.port(), &[]),
    };
    let (et, ip) = match (src.ip(), dst.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => (ethertype::IPV4, craft::with_l4_checksum(craft::ipv4(s.octets(), d.octets(), protocol, &l4), 20)),
        (IpAddr::V6(s), IpAddr::V6(d)) => (ethertype::IPV6, craft::with_l4_checksum(craft::ipv6(s.octets(), d.octets(), protocol, &l4), 40)),
        _ => return Err(MixedFamilies),
    };
    let port = snap.ports.get(usize::from(EXPLAIN_PORT)).copied().unwrap_or_default();
    let vlans: &[u16] = if port.vlan == 0 { &[] } else { &[port.vlan] };
    Ok(craft::ether_with(port.mac, craft::SRC_MAC, vlans, et, &ip))
}

/// Counter slots that cover every service and endpoint of `snap`.
fn counter_slots(snap: &Snapshot) -> (usize, usize) {
    snap.services.iter().fold((0, 0), |(s, e), svc| {
        let e = svc.endpoints().map(|ep| ep.counter as usize + 1).fold(e, usize::max);
        (s.max(svc.key as usize + 1), e)
    })
}

/// The explanation of the flow before its packet is put through the
/// pipeline: the flow in words, nothing decided yet, and the note on what
/// byte matches see of a packet without payload.
fn unexplained(protocol: u8, src: SocketAddr, dst: SocketAddr) -> Explanation {
    Explanation {
        flow: format!(
            "{} {} port {} -> {} port {}",
            match protocol {
                proto::TCP => "tcp",
                proto::UDP => "udp",
                proto::SCTP => "sctp",
                _ => "?",
            },
            src.ip(),
            src.port(),
            dst.ip(),
            dst.port()
        ),
        verdict: String::new(),
        route: None,
        priority: None,
        service: None,
        algorithm: None,
        slot: None,
        endpoint: None,
        delivery: None,
        notes: vec![match protocol {
            proto::TCP => "the packet explained is a TCP SYN without payload: byte matches are evaluated on it",
            _ => "the packet explained carries no payload: byte matches are evaluated on its header",
        }
        .into()],
    }
}

/// Explains what the workers do with the first packet of a new flow of
/// `protocol` from `src` to `dst`. The packet is built and put through the
/// workers' own pipeline ([`Pipeline::process`], on fresh tables of its
/// own), as arriving on port 0: the verdict is theirs; the route, table
/// slot and endpoint are read from the same snapshot to say why. Fails when
/// the two addresses are not of one family.
pub(super) fn explain(snap: &Snapshot, protocol: u8, src: SocketAddr, dst: SocketAddr) -> Result<Explanation, MixedFamilies> {
    let frame = first_packet(snap, protocol, src, dst)?;
    let mut x = unexplained(protocol, src, dst);
    let (services, endpoints) = counter_slots(snap);
    let ctr = WorkerCounters::new(services, endpoints);
    let cfg = PipelineConfig { flow_entries: 64, frag_entries: 16, ..PipelineConfig::default() };
    let mut pipeline = Pipeline::new(&cfg, 1);
    let mut pkt = MemBuf::new(&frame);
    let verdict = pipeline.process(snap, EXPLAIN_PORT, &mut pkt, 1000, &ctr);

    // Why: the route and service of the packet as the workers parse and
    // classify it.
    let c = &snap.classifier;
    let Ok(Frame::Ip(p)) = parse(&frame) else {
        x.verdict = describe(verdict);
        return Ok(x);
    };
    let l4 = frame.get(usize::from(p.l4)..usize::from(p.ip_end));
    let svc = match c.classify(&p.flow, p.has_ports, l4) {
        Lookup::Route(r) => {
            let route = c.route(r);
            x.route = Some(route.name.clone());
            x.priority = Some(route.priority);
            c.service_of(r).and_then(|i| snap.services.get(i as usize))
        }
        Lookup::NoRoute | Lookup::NotVip => None,
    };
    if let Some(svc) = svc {
        x.service = Some(svc.name.clone());
        x.algorithm = Some(format!("{}{}", svc.algorithm, if svc.flow_table { " with a flow table" } else { "" }));
        if let (Some(table), Algorithm::Maglev) = (&svc.table, svc.algorithm) {
            let hash = flow_hash(&p.flow);
            x.slot = Some((format!("{hash:#018x}"), reduce(hash, table.size())));
        }
    }
    let balanced = ctr.balanced.get() > 0;
    // The endpoint the pipeline counted the packet for.
    let ep = svc.filter(|_| balanced).and_then(|s| s.endpoints().find(|e| ctr.endpoints.get(e.counter as usize).is_some_and(|c| c.packets.get() > 0)));
    match (verdict, svc, ep) {
        (Verdict::Forward(_), Some(svc), Some(_)) if svc.algorithm == Algorithm::Random => {
            x.verdict = "a new flow gets a random endpoint (in proportion to weights), then keeps it in the worker's flow table".into();
            x.notes.push("random: no single endpoint can be named in advance".into());
        }
        (Verdict::Forward(_), Some(svc), Some(ep)) => {
            x.endpoint = Some((ep.id, ep.addr.to_string()));
            x.delivery = Some(match svc.delivery(ep) {
                Delivery::L2 => format!("NAT-less, out of port {} to MAC {}", ep.port, sluice_ffi::MacAddr(ep.mac)),
                Delivery::IpIp { src } => {
                    format!("IP-in-IP from {src} to {}, out of port {} via MAC {}", ep.addr, ep.port, sluice_ffi::MacAddr(ep.mac))
                }
            });
            if svc.flow_table {
                x.notes.push("an established flow keeps the endpoint it started with (flow table), even if the table changed since".into());
            }
            x.verdict = format!("forwarded to endpoint {} ({})", ep.id, ep.addr);
        }
        (Verdict::Forward(o), _, _) if ctr.returned.get() > 0 => {
            x.verdict = format!("the source is a VIP: return traffic, forwarded to the gateway out of port {o}");
        }
        (Verdict::Exception, _, _) if !c.is_vip(p.flow.dst) => {
            x.verdict = format!("{} is not a VIP: the packet goes to the kernel (exception path)", dst.ip());
        }
        (v, _, _) => x.verdict = describe(v),
    }
    Ok(x)
}

/// A verdict in words.
fn describe(v: Verdict) -> String {
    match v {
        Verdict::Forward(o) => format!("forwarded out of port {o}"),
        Verdict::Exception => "handed to the kernel (exception path)".into(),
        Verdict::Stash => "held back as a fragment".into(),
        Verdict::Steer(w) => format!("handed to worker {w}, which owns the flow"),
        Verdict::Drop(r) => format!("dropped ({})", r.name()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_dataplane::classify::{PortRange, RouteMatch, RouteSpec};
    use sluice_dataplane::parse::Flow;
    use sluice_dataplane::service::ServiceSpec;
    use sluice_dataplane::snapshot::PortInfo;

    use crate::fixture::{endpoint, one_service, web};

    use super::*;

    fn snap(eps: &[(u16, &str)]) -> Snapshot {
        let endpoints = eps.iter().map(|&(id, a)| endpoint(id, 1, a.parse::<IpAddr>().unwrap())).collect();
        let spec = ServiceSpec { limit: 8, ..web(0, Algorithm::Maglev, false, endpoints) };
        let route = RouteSpec {
            name: "r".into(),
            priority: 3,
            service: 0,
            matches: RouteMatch {
                vips: vec!["20.0.0.1".parse().unwrap()],
                protocols: vec![proto::TCP],
                dst_ports: vec![PortRange::single(80)],
                ..RouteMatch::default()
            }.into(),
        };
        Snapshot::new(1, &[route], vec![Arc::new(Service::build(&spec).unwrap())], vec![PortInfo::default()], None, None)
    }

    #[test]
    fn digests_compare_tables_by_endpoint_address() {
        let a = summaries(&snap(&[(0, "10.0.0.1"), (1, "10.0.0.2"), (2, "10.0.0.3")]));
        let b = summaries(&snap(&[(2, "10.0.0.3"), (0, "10.0.0.1"), (1, "10.0.0.2")]));
        assert_eq!(a, b, "the order endpoints are given in does not matter");
        // Same addresses under other identifiers: other tables, other digest.
        let c = summaries(&snap(&[(0, "10.0.0.2"), (1, "10.0.0.1"), (2, "10.0.0.3")]));
        assert_ne!(a[0].digest, c[0].digest);
        let d = dump(&snap(&[(0, "10.0.0.1"), (1, "10.0.0.2")]), "web").unwrap();
        assert_eq!(d.runs.iter().map(|r| r.1).sum::<u32>(), d.summary.size);
        assert!(dump(&snap(&[(0, "10.0.0.1")]), "nope").is_none());
    }

    use sha2::{Digest as _, Sha256};

    /// A writer that keeps nothing: counts the bytes and hashes them.
    #[derive(Default)]
    struct Sink {
        bytes: usize,
        hash: Sha256,
    }

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.bytes += b.len();
            self.hash.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn big(size: u32, eps: u16) -> Snapshot {
        let endpoints = (0..eps).map(|id| endpoint(id, 1, format!("10.1.{}.{}", id / 250, id % 250 + 1).parse::<IpAddr>().unwrap())).collect();
        one_service(&ServiceSpec { limit: eps.into(), table_size: size, ..web(0, Algorithm::Maglev, false, endpoints) })
    }

    #[test]
    fn a_streamed_table_is_the_same_json() {
        for (size, eps) in [(0, 1), (65537, 3), (1_000_003, 200), (1_048_583, 7)] {
            let s = big(size, eps);
            let whole = serde_json::to_string_pretty(&dump(&s, "web").unwrap()).unwrap();
            let mut streamed = Vec::new();
            write_dump(&s.services[0], &Digests::default(), &mut streamed).unwrap();
            assert!(whole.as_bytes() == streamed, "table of {size} slots: the streamed JSON differs");
            let whole = serde_json::to_string_pretty(&summaries(&s)).unwrap();
            let mut streamed = Vec::new();
            write_summaries(&s, &Digests::default(), &mut streamed).unwrap();
            assert!(whole.as_bytes() == streamed);
        }
    }

    #[test]
    fn a_writer_error_stops_the_dump() {
        struct Refuses(usize);
        impl std::io::Write for Refuses {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0 += 1;
                if self.0 > 3 {
                    return Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone"));
                }
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let s = big(1_000_003, 200);
        let mut w = Refuses(0);
        let e = write_dump(&s.services[0], &Digests::default(), &mut w).unwrap_err();
        assert!(e.to_string().contains("gone"), "{e}");
        assert_eq!(w.0, 4, "nothing is written after the first error");
        let mut sink = Sink::default();
        write_dump(&s.services[0], &Digests::default(), &mut sink).unwrap();
        assert!(sink.bytes > 1000 * 4, "{} bytes", sink.bytes);
        let _ = sink.hash.finalize();
    }

    #[test]
    fn a_kept_digest_is_the_digest_of_that_table_only() {
        let digests = Digests::default();
        let a = snap(&[(0, "10.0.0.1"), (1, "10.0.0.2"), (2, "10.0.0.3")]);
        let fresh = summaries(&a).remove(0);
        assert_eq!(summary_for(&a, "web", &digests).unwrap(), fresh);
        assert_eq!(summary_for(&a, "web", &digests).unwrap(), fresh, "kept, and still the same");
        // The service rebuilt with other endpoints (a change, as published
        // while the old one is still kept): its own digest, not the kept one.
        let b = snap(&[(0, "10.0.0.1"), (1, "10.0.0.9"), (2, "10.0.0.3")]);
        let changed = summary_for(&b, "web", &digests).unwrap();
        assert_eq!(changed, summaries(&b).remove(0));
        assert_ne!(changed.digest, fresh.digest);
        // Gone services are let go; never more than DIGESTS_KEPT kept.
        drop((a, b));
        for i in 0..DIGESTS_KEPT + 3 {
            let s = snap(&[(0, "10.0.0.1"), (1, &format!("10.0.1.{i}"))]);
            assert_eq!(summary_for(&s, "web", &digests).unwrap(), summaries(&s).remove(0));
            assert_eq!(crate::ground::lock(&digests.0).len(), 1, "only live services are kept");
        }
        let live: Vec<Snapshot> = (0..DIGESTS_KEPT + 3).map(|i| snap(&[(0, &format!("10.0.2.{i}"))])).collect();
        for s in &live {
            summary_for(s, "web", &digests).unwrap();
        }
        assert_eq!(crate::ground::lock(&digests.0).len(), DIGESTS_KEPT);
        assert_eq!(summary_for(&live[0], "web", &digests).unwrap(), summaries(&live[0]).remove(0), "let go, then taken again");
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn explanations_name_route_service_and_endpoint() {
        let s = snap(&[(0, "10.0.0.1"), (1, "10.0.0.2")]);
        let flow = Flow { src: "10.9.0.1".parse().unwrap(), dst: "20.0.0.1".parse().unwrap(), sport: 4000, dport: 80, proto: proto::TCP };
        let x = explain(&s, proto::TCP, sa("10.9.0.1:4000"), sa("20.0.0.1:80")).unwrap();
        assert_eq!((x.route.as_deref(), x.priority, x.service.as_deref()), (Some("r"), Some(3), Some("web")));
        let (id, addr) = x.endpoint.clone().unwrap();
        let want = s.services[0].endpoint_at(s.services[0].table.as_ref().unwrap().lookup(flow_hash(&flow))).unwrap();
        assert_eq!(id, want.id);
        assert_eq!(addr, want.addr.to_string());
        assert!(x.verdict.starts_with("forwarded to endpoint"), "{}", x.verdict);
        let x = explain(&s, proto::TCP, sa("10.9.0.1:4000"), sa("20.0.0.1:81")).unwrap();
        assert!(x.verdict.contains("no_route"), "{}", x.verdict);
        let x = explain(&s, proto::TCP, sa("10.9.0.1:4000"), sa("20.0.0.2:80")).unwrap();
        assert!(x.verdict.contains("not a VIP"), "{}", x.verdict);
        assert!(explain(&s, proto::TCP, sa("10.9.0.1:4000"), sa("[2001:db8::1]:80")).is_err(), "one family");
    }

    /// The workers drop an IPv6 packet whose source or destination is
    /// IPv4-mapped (`::ffff:a.b.c.d`); so does the explanation.
    #[test]
    fn explain_drops_ipv4_mapped_ipv6_addresses_as_the_workers_do() {
        let s = snap(&[(0, "10.0.0.1"), (1, "10.0.0.2")]);
        for (src, dst) in [("[2001:db8::9]:4000", "[::ffff:20.0.0.1]:80"), ("[::ffff:10.9.0.1]:4000", "[::ffff:20.0.0.1]:80")] {
            let x = explain(&s, proto::TCP, sa(src), sa(dst)).unwrap();
            assert_eq!(x.endpoint, None, "{src} -> {dst}: {}", x.verdict);
            assert!(x.verdict.contains("ipv6_mapped_address"), "{src} -> {dst}: {}", x.verdict);
        }
        let x = explain(&s, proto::TCP, sa("10.9.0.1:4000"), sa("20.0.0.1:80")).unwrap();
        assert!(x.endpoint.is_some(), "the same VIP over IPv4 is served: {}", x.verdict);
    }
}
