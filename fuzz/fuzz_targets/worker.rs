//! Two workers with steering over in-memory I/O, fed a sequence of frames
//! the fuzzer steers: TCP, UDP and SCTP to IPv4 and IPv6 VIPs of the
//! snapshot, first and later fragments, ICMP and ICMPv6 errors about VIP
//! flows, return traffic from endpoints and from strangers, raw bytes, byte
//! flips (IPv4 header checksums fixed up), polls, clock steps and snapshot
//! swaps. Services keep flow tables; tunnels are small enough for packets
//! to be too big.
//!
//! Invariants: the conservation identity holds for each worker between
//! polls and summed over both; no buffer leaks (every injected frame is in
//! an input, an output, freed, held, or in a steering queue, and after
//! shutdown in an output or freed); frames a worker forwards parse.
//!
//! Input: records `[op, a, b, c]`; op 12 (raw) is followed by `a` bytes.
//! `c`: bit 0 worker, bit 1 input port, bit 2 VLAN tag, bit 3 DF, bits 4-7
//! size class (payload of 96 bytes per class).
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::checksum;
use sluice_dataplane::classify::{PortRange, RouteMatch, RouteSpec};
use sluice_dataplane::counters::{Ledger, WorkerCounters};
use sluice_dataplane::craft;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::{MemBuf, MemIo};
use sluice_dataplane::parse::{ethertype, parse, proto, v4, Frame};
use sluice_dataplane::pipeline::PipelineConfig;
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};
use sluice_dataplane::steer::Steering;
use sluice_dataplane::worker::{Input, Worker, WorkerConfig};

const PORT_MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 1, 0], [2, 0, 0, 0, 1, 1]];
const ROUTER_MAC: [u8; 6] = [2, 0xcc, 0, 0, 0, 1];
const GW_MAC: [u8; 6] = [2, 0, 0, 0, 0xf, 0xf];
const VIP4: [u8; 4] = [20, 0, 0, 1];
const VIP6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const OUTPUTS: usize = 4;

fn ep_mac(svc: u8, id: u8) -> [u8; 6] {
    [2, 0xee, 0, 0, svc, id]
}

/// Services of variant `v` (0 or 1: endpoints change between them).
fn services(v: u8) -> Vec<Arc<Service>> {
    let svc = |key: u32, algorithm, delivery: Delivery| {
        let ids: &[u16] = if v == 0 { &[0, 1, 2] } else { &[1, 2, 3] };
        let endpoints = ids
            .iter()
            .map(|&id| EndpointSpec {
                id,
                incarnation: 1 + u32::from(v) * u32::from(id == 2),
                weight: 1 + u32::from(id),
                draining: v == 1 && id == 1,
                addr: match delivery {
                    Delivery::IpIp { src } if !src.is_v4() => Addr::v6([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10 + id as u8]),
                    _ => Addr::v4([10, 1, key as u8, id as u8]),
                },
                port: 1,
                mac: ep_mac(key as u8, id as u8),
                delivery,
                counter: key * 8 + u32::from(id),
            })
            .collect();
        Arc::new(
            Service::build(&ServiceSpec { name: format!("s{key}"), key, algorithm, flow_table: true, limit: 8, table_size: 0, endpoints })
                .unwrap(),
        )
    };
    vec![
        svc(0, Algorithm::Random, Delivery::L2),
        svc(1, Algorithm::Maglev, Delivery::IpIp { src: Addr::v4([192, 0, 2, 1]) }),
        svc(2, Algorithm::Maglev, Delivery::IpIp { src: "fd00::1".parse().unwrap() }),
        svc(3, Algorithm::Random, Delivery::IpIp { src: Addr::v4([192, 0, 2, 1]) }),
    ]
}

static SERVICES: OnceLock<[Vec<Arc<Service>>; 2]> = OnceLock::new();

fn snapshot(generation: u64) -> Snapshot {
    let svcs = SERVICES.get_or_init(|| [services(0), services(1)]);
    let route = |name: &str, service, vip: Addr, lo, hi, protocols: &[u8]| RouteSpec {
        name: name.into(),
        priority: 1,
        service,
        matches: RouteMatch {
            vips: vec![vip],
            dst_ports: vec![PortRange { lo, hi }],
            protocols: protocols.to_vec(),
            ..RouteMatch::default()
        }.into(),
    };
    Snapshot::new(
        generation,
        &[
            route("v4-random", 0, Addr::v4(VIP4), 0, 1999, &[proto::TCP, proto::UDP, proto::SCTP]),
            route("v4-tunnel", 1, Addr::v4(VIP4), 2000, 65535, &[proto::TCP, proto::UDP, proto::SCTP]),
            route("v6-tunnel", 2, Addr::v6(VIP6), 0, 1999, &[]),
            route("v6-random", 3, Addr::v6(VIP6), 2000, 65535, &[]),
        ],
        svcs[(generation % 2) as usize].clone(),
        vec![PortInfo { mac: PORT_MAC[0], mtu: 1500, vlan: 0 }, PortInfo { mac: PORT_MAC[1], mtu: 1400, vlan: 0 }],
        Some(NextHop { port: 0, mac: GW_MAC }),
        Some(NextHop { port: 0, mac: GW_MAC }),
    )
}

fn client4(a: u8) -> [u8; 4] {
    [10, 0, a >> 4, (a & 15) + 1]
}

fn client6(a: u8) -> [u8; 16] {
    [0x20, 1, 0x0d, 0xb8, 0, 0xc, 0, 0, 0, 0, 0, 0, 0, 0, 0, a]
}

fn l4(protocol: u8, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    match protocol {
        proto::TCP => craft::tcp(sport, dport, 0x18, payload),
        proto::UDP => craft::udp(sport, dport, payload),
        _ => craft::sctp(sport, dport, payload),
    }
}

/// Recomputes the IPv4 header checksum of an untagged or tagged frame.
fn fix_ipv4_checksum(f: &mut [u8]) {
    let mut l3 = 14;
    while f.len() >= l3 && matches!(u16::from_be_bytes([f[l3 - 2], f[l3 - 1]]), 0x8100 | 0x88a8) {
        l3 += 4;
    }
    if f.len() < l3 + 20 || u16::from_be_bytes([f[l3 - 2], f[l3 - 1]]) != ethertype::IPV4 {
        return;
    }
    let ihl = usize::from(f[l3] & 0x0f) * 4;
    if ihl < 20 || f.len() < l3 + ihl {
        return;
    }
    f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
    let c = checksum::checksum(&f[l3..l3 + ihl]);
    f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
}

struct Rig {
    publisher: Publisher<Snapshot>,
    steering: Arc<Steering<MemBuf>>,
    workers: Vec<Worker<MemIo>>,
    now: u64,
    injected: u64,
    out: u64,
}

impl Rig {
    fn new() -> Rig {
        let publisher = Publisher::new(snapshot(1));
        let steering = Steering::new(2, 4);
        let pipeline = PipelineConfig { flow_entries: 64, frag_entries: 16, frag_ttl_ms: 500, icmp_rate: 100, icmp_burst: 3, ..Default::default() };
        let workers = (0..2)
            .map(|k| {
                let cfg = WorkerConfig {
                    id: k,
                    inputs: vec![
                        Input::Port { port: 0, exception: Some(2) },
                        Input::Port { port: 1, exception: None },
                        Input::Passthrough { output: 3 },
                    ],
                    outputs: OUTPUTS,
                    pipeline,
                    stash_capacity: 4,
                    stash_ttl_ms: 200,
                };
                Worker::new(MemIo::new(3, OUTPUTS), publisher.reader(), Arc::new(WorkerCounters::new(4, 32)), &cfg)
                    .with_steering(Arc::clone(&steering), k as usize)
            })
            .collect();
        Rig { publisher, steering, workers, now: 1, injected: 0, out: 0 }
    }

    fn inject(&mut self, flags: u8, frame: Vec<u8>) {
        let w = usize::from(flags & 1);
        let input = if flags & 0x80 != 0 && flags & 0x40 != 0 { 2 } else { usize::from(flags >> 1 & 1) };
        self.workers[w].io_mut().inputs[input].push_back(MemBuf::new(&frame));
        self.injected += 1;
    }

    fn poll(&mut self, w: usize) {
        self.workers[w].poll(self.now);
        self.collect(w);
        self.check();
    }

    /// Takes the outputs of worker `w`, checking forwarded frames parse.
    fn collect(&mut self, w: usize) {
        let io = self.workers[w].io_mut();
        for (o, frames) in io.outputs.iter_mut().enumerate() {
            for f in frames.drain(..) {
                if o < 2 {
                    match parse(f.data()) {
                        Ok(Frame::Ip(_)) => {}
                        other => panic!("worker {w} sent on port {o} a frame that does not parse: {other:?} {:02x?}", f.data()),
                    }
                }
                self.out += 1;
            }
        }
    }

    fn check(&mut self) {
        let mut sum = Ledger::default();
        let (mut freed, mut waiting) = (0u64, 0u64);
        for w in &mut self.workers {
            let l = w.ledger();
            if let Err(e) = l.check() {
                panic!("conservation: {e}");
            }
            sum = sum + l;
            let io = w.io_mut();
            freed += io.freed as u64;
            waiting += io.inputs.iter().map(|q| q.len() as u64).sum::<u64>();
        }
        let queued = self.steering.queued() as u64;
        assert_eq!(sum.steered_out - sum.steered_in, queued, "steered packets are in a queue");
        assert_eq!(sum.sent, self.out, "sent = collected");
        assert_eq!(sum.dropped + sum.output_drops, freed, "every drop freed its buffer");
        assert_eq!(self.injected, waiting + sum.received, "inputs");
        assert_eq!(self.injected, waiting + self.out + freed + sum.held + queued, "no buffer leaks");
    }
}

fuzz_target!(|data: &[u8]| {
    let mut rig = Rig::new();
    let mut generation = 1;
    let mut i = 0;
    let mut steps = 0;
    let mut swapped = false;
    while i + 4 <= data.len() && steps < 256 {
        steps += 1;
        if !swapped && i >= data.len() / 2 {
            // A snapshot swap in the middle of every run.
            swapped = true;
            generation += 1;
            rig.publisher.publish(snapshot(generation));
        }
        let (op, a, b, c) = (data[i] % 16, data[i + 1], data[i + 2], data[i + 3]);
        i += 4;
        let port = usize::from(c >> 1 & 1);
        let vlans: &[u16] = if c & 4 != 0 { &[100] } else { &[] };
        let df = if c & 8 != 0 { v4::DF } else { 0 };
        let payload = vec![0x5a; usize::from(c >> 4) * 96];
        let sport = 1024 + u16::from(b);
        let dport4 = if a & 1 == 0 { 80 } else { 2000 + u16::from(a) };
        let dport6 = if a & 1 == 0 { 443 } else { 2000 + u16::from(a) };
        let eth4 = |ip: &[u8]| craft::ether_with(PORT_MAC[port], ROUTER_MAC, vlans, ethertype::IPV4, ip);
        let eth6 = |ip: &[u8]| craft::ether_with(PORT_MAC[port], ROUTER_MAC, vlans, ethertype::IPV6, ip);
        let frame = match op {
            0..=2 => {
                let p = [proto::TCP, proto::UDP, proto::SCTP][usize::from(op)];
                let ip = craft::ipv4_full(client4(a), VIP4, p, 64, u16::from(b), df, &[], &l4(p, sport, dport4, &payload));
                Some(eth4(&craft::with_l4_checksum(ip, 20)))
            }
            3 | 4 => {
                let p = if op == 3 { proto::SCTP } else { proto::TCP };
                Some(eth6(&craft::with_l4_checksum(craft::ipv6(client6(a), VIP6, p, &l4(p, sport, dport6, &payload)), 40)))
            }
            5 | 6 => {
                // A fragment of datagram b: the first carries the ports.
                let dgram = l4(proto::UDP, 1024 + u16::from(a), dport4, &payload);
                let (frag, body) =
                    if op == 5 { (v4::MF, &dgram[..dgram.len().min(24)]) } else { (3 | if c & 8 != 0 { v4::MF } else { 0 }, &payload[..]) };
                Some(eth4(&craft::ipv4_full(client4(a), VIP4, proto::UDP, 64, u16::from(b), frag, &[], body)))
            }
            7 | 8 => {
                let dgram = l4(proto::UDP, 1024 + u16::from(a), dport6, &payload);
                let mut ext = craft::ipv6_fragment_header(proto::UDP, if op == 7 { 0 } else { 3 }, op == 7 || c & 8 != 0, u32::from(b)).to_vec();
                ext.extend_from_slice(if op == 7 { &dgram[..dgram.len().min(24)] } else { &payload[..] });
                Some(eth6(&craft::ipv6(client6(a), VIP6, proto::FRAGMENT, &ext)))
            }
            9 => {
                let reply = craft::ipv4(VIP4, client4(a), proto::UDP, &craft::udp(dport4, sport, &payload));
                let err = craft::icmp4_error(3, 4, &reply[..reply.len().min(28 + usize::from(c >> 4) * 8)]);
                Some(eth4(&craft::ipv4_full([203, 0, 113, 1], VIP4, proto::ICMP, 64, 0, df, &[], &err)))
            }
            10 => {
                let reply = craft::ipv6(VIP6, client6(a), proto::TCP, &craft::tcp(dport6, sport, 0x10, &payload));
                let err = craft::icmp6_error(2, 0, &reply[..reply.len().min(1232)]);
                Some(eth6(&craft::with_l4_checksum(craft::ipv6([0x20, 1, 0x0d, 0xb8, 0, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], VIP6, proto::ICMPV6, &err), 40)))
            }
            11 => {
                // Return traffic, from an endpoint's MAC (of some service) or a stranger's.
                let from = if b < 200 { ep_mac(b & 3, (b >> 2) & 3) } else { [2, 0x66, 0, 0, 0, b] };
                let v6 = a & 1 != 0;
                let (ip, et) = if v6 {
                    (craft::ipv6(VIP6, client6(a), proto::TCP, &craft::tcp(dport6, sport, 0x12, &payload)), ethertype::IPV6)
                } else {
                    (craft::ipv4(VIP4, client4(a), proto::TCP, &craft::tcp(dport4, sport, 0x12, &payload)), ethertype::IPV4)
                };
                Some(craft::ether_with(PORT_MAC[port], from, vlans, et, &ip))
            }
            12 => {
                let n = usize::from(a).min(data.len() - i);
                let mut f = data[i..i + n].to_vec();
                i += n;
                if f.len() >= 6 && b & 1 == 0 {
                    f[..6].copy_from_slice(&PORT_MAC[port]);
                }
                Some(f)
            }
            13 => {
                rig.now += u64::from(b) * 4;
                rig.poll(usize::from(a & 1));
                None
            }
            14 => {
                generation += 1;
                rig.publisher.publish(snapshot(generation));
                None
            }
            _ => {
                // Flip a byte of the last frame waiting on an input.
                let w = usize::from(c & 1);
                let q = usize::from(c >> 1 & 1);
                if let Some(last) = rig.workers[w].io_mut().inputs[q].back_mut() {
                    let d = last.data_mut();
                    if !d.is_empty() {
                        let at = usize::from(a) % d.len();
                        d[at] ^= b;
                        fix_ipv4_checksum(d);
                    }
                }
                None
            }
        };
        if let Some(f) = frame {
            rig.inject(c, f);
            if steps % 8 == 0 {
                rig.poll(steps / 8 % 2);
            }
        }
    }
    // Drain: both workers, until nothing moves (bounded).
    for _ in 0..8 {
        rig.poll(0);
        rig.poll(1);
    }
    for k in 0..2 {
        rig.workers[k].shutdown();
        rig.collect(k);
    }
    rig.check();
    let held: usize = rig.workers.iter().map(Worker::held).sum();
    let waiting: usize = rig.workers.iter_mut().map(|w| w.io_mut().inputs.iter().map(|q| q.len()).sum::<usize>()).sum();
    assert_eq!((held, rig.steering.queued(), waiting), (0, 0, 0), "after shutdown every frame is in an output or freed");
});
