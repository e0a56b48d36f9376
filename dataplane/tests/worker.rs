//! The worker loop over in-memory I/O: where packets go, what happens to
//! fragments and full queues, how the algorithms keep flows, and that every
//! packet is accounted for (sent, dropped under a reason, or held).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use common::*;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::craft;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::{MemBuf, MemIo};
use sluice_dataplane::parse::{ethertype, proto, v4};
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::service::{Algorithm, Delivery};
use sluice_dataplane::snapshot::Snapshot;
use sluice_dataplane::verdict::DropReason;
use sluice_dataplane::worker::{IdlePolicy, Input, Worker, WorkerConfig};

const CLIENT_MAC: [u8; 6] = [0x02, 0xcc, 0, 0, 0, 1];

fn config() -> WorkerConfig {
    WorkerConfig {
        id: 0,
        // p0 (front, exception to output 2), p1 (back, no exception path),
        // the kernel's side of p0's exception path (out on p0).
        inputs: vec![
            Input::Port { port: 0, exception: Some(2) },
            Input::Port { port: 1, exception: None },
            Input::Passthrough { output: 0 },
        ],
        outputs: 3,
        pipeline: Default::default(),
        stash_capacity: 16,
        stash_ttl_ms: 1000,
    }
}

/// A worker and the number of frames taken from its outputs so far.
struct H {
    w: Worker<MemIo>,
    drained: u64,
}

impl std::ops::Deref for H {
    type Target = Worker<MemIo>;
    fn deref(&self) -> &Worker<MemIo> {
        &self.w
    }
}

impl std::ops::DerefMut for H {
    fn deref_mut(&mut self) -> &mut Worker<MemIo> {
        &mut self.w
    }
}

fn worker(p: &Publisher<Snapshot>) -> H {
    H { w: Worker::new(MemIo::new(3, 3), p.reader(), Arc::new(WorkerCounters::new(8, 1000)), &config()), drained: 0 }
}

/// A packet of an established flow (TCP: an ACK) to the VIP.
fn to_vip(sport: u16, dport: u16, p: u8) -> Vec<u8> {
    to_vip_flags(sport, dport, p, TCP_ACK)
}

const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

fn to_vip_flags(sport: u16, dport: u16, p: u8, flags: u8) -> Vec<u8> {
    let l4 = if p == proto::UDP { craft::udp(sport, dport, &[7; 40]) } else { craft::tcp(sport, dport, flags, b"") };
    craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &craft::with_l4_checksum(craft::ipv4(CLIENT, VIP, p, &l4), 20))
}

fn feed(w: &mut H, input: usize, frames: &[Vec<u8>]) {
    w.io_mut().inputs[input].extend(frames.iter().map(|f| MemBuf::new(f)));
}

fn drain(w: &mut H, output: usize) -> Vec<MemBuf> {
    let v = std::mem::take(&mut w.io_mut().outputs[output]);
    w.drained += v.len() as u64;
    v
}

fn dst_mac(b: &MemBuf) -> [u8; 6] {
    b.data()[0..6].try_into().unwrap()
}

/// Every received packet was sent (by category), dropped under a reason,
/// or is held; and the buffers agree with the counters.
fn assert_conserved(w: &mut H) {
    let c = Arc::clone(w.counters());
    let ledger = w.ledger();
    let drained = w.drained;
    let io = w.io_mut();
    let sent: u64 = drained + io.outputs.iter().map(|o| o.len() as u64).sum::<u64>();
    ledger.check().unwrap();
    assert_eq!(
        c.rx_packets.get() + c.steered_in.get(),
        c.tx_packets.get() + c.total_drops() + ledger.held + c.steered_out.get(),
        "counters add up"
    );
    assert_eq!(c.tx_packets.get(), sent);
    assert_eq!(c.total_drops(), io.freed as u64, "every drop freed its buffer");
}

#[test]
fn exception_path_and_kernel_passthrough() {
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    let arp = craft::ether_with([0xff; 6], CLIENT_MAC, &[], ethertype::ARP, &[0; 28]);
    feed(&mut w, 0, std::slice::from_ref(&arp));
    feed(&mut w, 1, std::slice::from_ref(&arp));
    feed(&mut w, 2, &[b"from the kernel, any frame at all".to_vec()]);
    assert_eq!(w.poll(1), 3);
    assert_eq!(drain(&mut w, 2).len(), 1, "front ARP to the kernel");
    assert_eq!(drain(&mut w, 0)[0].data(), b"from the kernel, any frame at all");
    assert_eq!(w.counters().drops[DropReason::NoExceptionPath.index()].get(), 1);
    assert_eq!((w.counters().exception.get(), w.counters().from_kernel.get()), (1, 1));
    assert_conserved(&mut w);
}

#[test]
fn fragments_out_of_order_are_held_then_follow_their_first() {
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    // One UDP datagram to the "dns" service (random: only the flow table
    // makes later fragments follow), in three fragments.
    let dgram = craft::udp(5353, 53, &[1; 64]);
    let frag = |off: u16, more: bool, part: &[u8]| {
        let f = (off / 8) | if more { v4::MF } else { 0 };
        craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &craft::ipv4_full(CLIENT, VIP, proto::UDP, 64, 4242, f, &[], part))
    };
    let first = frag(0, true, &dgram[..24]);
    let middle = frag(24, true, &dgram[24..48]);
    let last = frag(48, false, &dgram[48..]);
    feed(&mut w, 0, &[last.clone(), middle.clone()]);
    w.poll(10);
    assert_eq!(w.held(), 2, "later fragments wait for the first");
    assert!(w.io_mut().outputs[1].is_empty());
    feed(&mut w, 0, &[first]);
    w.poll(20);
    assert_eq!(w.held(), 0);
    let out = drain(&mut w, 1);
    assert_eq!(out.len(), 3);
    let macs: HashSet<[u8; 6]> = out.iter().map(dst_mac).collect();
    assert_eq!(macs.len(), 1, "all fragments reach one endpoint");
    // Further fragments of the same datagram follow without waiting.
    feed(&mut w, 0, &[middle]);
    w.poll(30);
    assert_eq!(dst_mac(&drain(&mut w, 1)[0]), *macs.iter().next().unwrap());

    // A later fragment whose first never comes is dropped after the hold time.
    let orphan = craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &craft::ipv4_full(CLIENT, VIP, proto::UDP, 64, 99, 3, &[], &[0; 16]));
    feed(&mut w, 0, &[orphan]);
    w.poll(100);
    assert_eq!(w.held(), 1);
    w.poll(1200);
    assert_eq!(w.held(), 0);
    assert_eq!(w.counters().drops[DropReason::FragmentTimeout.index()].get(), 1);
    assert_conserved(&mut w);
}

#[test]
fn a_full_output_queue_is_counted() {
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    w.io_mut().tx_limit = 5;
    let frames: Vec<Vec<u8>> = (0..20).map(|i| to_vip(1000 + i, 80, proto::TCP)).collect();
    feed(&mut w, 0, &frames);
    w.poll(1);
    assert_eq!(drain(&mut w, 1).len(), 5);
    assert_eq!(w.counters().drops[DropReason::TxQueueFull.index()].get(), 15);
    assert_conserved(&mut w);
}

/// Endpoint MAC each flow (by source port) was sent to.
fn send_flows(w: &mut H, ports: std::ops::Range<u16>, dport: u16, p: u8, now: u64) -> HashMap<u16, [u8; 6]> {
    send_flows_flags(w, ports, dport, p, TCP_ACK, now)
}

fn send_flows_flags(w: &mut H, ports: std::ops::Range<u16>, dport: u16, p: u8, flags: u8, now: u64) -> HashMap<u16, [u8; 6]> {
    let frames: Vec<Vec<u8>> = ports.clone().map(|s| to_vip_flags(s, dport, p, flags)).collect();
    feed(w, 0, &frames);
    while w.poll(now) > 0 {}
    let out = drain(w, 1);
    assert_eq!(out.len(), frames.len(), "every flow forwarded");
    ports.zip(out.iter().map(dst_mac)).collect()
}

#[test]
fn random_picks_spread_and_stick() {
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    let first = send_flows(&mut w, 1000..1400, 53, proto::UDP, 1000);
    let again = send_flows(&mut w, 1000..1400, 53, proto::UDP, 2000);
    assert_eq!(first, again, "each flow keeps its endpoint");
    let used: HashSet<&[u8; 6]> = first.values().collect();
    assert_eq!(used.len(), 4, "new flows spread over all endpoints");
    assert_conserved(&mut w);
}

/// The "sticky" (maglev + flow table) and "web" (maglev) services with
/// `n` endpoints, the first `draining` of them draining.
fn with_endpoints(generation: u64, n: u16, draining: u16) -> Snapshot {
    let mut s = appliance(generation);
    let eps = |svc: u8| {
        (0..n)
            .map(|i| {
                let mut e = endpoint(svc, i, 1, Delivery::L2);
                e.draining = i < draining;
                e
            })
            .collect::<Vec<_>>()
    };
    let mut services: Vec<_> = s.services.iter().cloned().collect();
    services[0] = service("web", 0, Algorithm::Maglev, false, eps(0));
    services[4] = service("sticky", 4, Algorithm::Maglev, true, eps(4));
    s = sluice_dataplane::snapshot::Snapshot::new(
        generation,
        &[
            route("web", 0, Addr::v4(VIP), Some(80), &[proto::TCP]),
            route("sticky", 4, Addr::v4(VIP), Some(8080), &[proto::TCP]),
        ],
        services,
        s.ports.clone(),
        s.gateway_v4,
        None,
    );
    s
}

#[test]
fn flow_table_keeps_established_flows_when_endpoints_change() {
    let mut p = Publisher::new(with_endpoints(1, 3, 0));
    let mut w = worker(&p);
    let sticky0 = send_flows(&mut w, 2000..2600, 8080, proto::TCP, 1000);
    let web0 = send_flows(&mut w, 2000..2600, 80, proto::TCP, 1000);

    // A fourth endpoint joins: stateless maglev moves about 1/4 of the flows,
    // the flow table keeps every established one where it was.
    p.publish(with_endpoints(2, 4, 0));
    let sticky1 = send_flows(&mut w, 2000..2600, 8080, proto::TCP, 2000);
    let web1 = send_flows(&mut w, 2000..2600, 80, proto::TCP, 2000);
    assert_eq!(sticky0, sticky1, "established flows survive the addition");
    let moved = web0.iter().filter(|(k, v)| web1[k] != **v).count();
    assert!((100..200).contains(&moved), "stateless maglev moved {moved} of 600 (about a quarter)");
    let fresh = send_flows(&mut w, 5000..5400, 8080, proto::TCP, 2000);
    assert!(fresh.values().any(|m| *m == ep_mac(4, 3, 1)), "new flows reach the new endpoint");

    // Endpoint 0 drains: its established flows stay (flow table), new ones avoid it.
    p.publish(with_endpoints(3, 4, 1));
    let sticky2 = send_flows(&mut w, 2000..2600, 8080, proto::TCP, 3000);
    assert_eq!(sticky0, sticky2);
    let fresh = send_flows(&mut w, 6000..6400, 8080, proto::TCP, 3000);
    assert!(fresh.values().all(|m| *m != ep_mac(4, 0, 1)), "no new flow to a draining endpoint");
    let web2 = send_flows(&mut w, 2000..2600, 80, proto::TCP, 3000);
    assert!(web2.values().all(|m| *m != ep_mac(0, 0, 1)), "without a flow table, draining moves flows away");

    // The worker holds the snapshot it read last, and nothing older.
    let current = Arc::downgrade(&p.current());
    p.publish(with_endpoints(4, 4, 1));
    assert_eq!(p.reclaim(), 1, "the worker has not passed a quiescent point since");
    assert!(current.upgrade().is_some());
    w.poll(4000);
    assert!(p.synchronize(std::time::Duration::from_secs(1)), "freed once the worker polled again");
    assert!(current.upgrade().is_none(), "the replaced snapshot is gone");
    assert_conserved(&mut w);
}

#[test]
fn a_pin_holds_until_its_endpoint_leaves_and_a_syn_chooses_again() {
    let id = |m: &[u8; 6]| u16::from_be_bytes([m[4], m[5]]);
    let mut p = Publisher::new(with_endpoints(1, 3, 0));
    let mut w = worker(&p);
    let first = send_flows(&mut w, 2000..2600, 8080, proto::TCP, 1000);
    p.publish(with_endpoints(2, 4, 0));
    assert_eq!(send_flows(&mut w, 2000..2600, 8080, proto::TCP, 2000), first, "pins hold when an endpoint joins");
    // A SYN starts a new connection on the same ports: the table chooses.
    let syn = send_flows_flags(&mut w, 2000..2600, 8080, proto::TCP, TCP_SYN, 3000);
    let moved = first.iter().filter(|(k, v)| syn[k] != **v).count();
    assert!((100..200).contains(&moved), "a SYN takes the table's choice: {moved} of 600 moved (about a quarter)");
    let to_new = syn.iter().filter(|(k, v)| first[k] != **v && id(v) == 3).count();
    assert!(to_new * 10 >= moved * 9, "mostly to the new endpoint: {to_new} of {moved}");
    assert_eq!(send_flows(&mut w, 2000..2600, 8080, proto::TCP, 4000), syn, "and is pinned there");
    // Endpoint 3 leaves: its flows take the table's choice; no other moves.
    p.publish(with_endpoints(3, 3, 0));
    let after = send_flows(&mut w, 2000..2600, 8080, proto::TCP, 5000);
    for (k, m) in &syn {
        if id(m) == 3 {
            assert_ne!(id(&after[k]), 3, "flow {k} moved off the removed endpoint");
        } else {
            assert_eq!(after[k], *m, "flow {k} stays");
        }
    }
    assert_conserved(&mut w);
}

/// A UDP packet of `client`'s flow to the "dns" service (random + flow table).
fn dns(client: [u8; 4], sport: u16) -> Vec<u8> {
    let ip = craft::with_l4_checksum(craft::ipv4(client, VIP, proto::UDP, &craft::udp(sport, 53, &[1; 40])), 20);
    craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &ip)
}

/// A UDP datagram of `client`'s flow to "dns" in three fragments.
fn dns_fragments(client: [u8; 4], sport: u16, id: u16) -> [Vec<u8>; 3] {
    let dgram = craft::udp(sport, 53, &[2; 64]);
    let frag = |off: u16, more: bool, part: &[u8]| {
        let f = (off / 8) | if more { v4::MF } else { 0 };
        craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &craft::ipv4_full(client, VIP, proto::UDP, 64, id, f, &[], part))
    };
    [frag(0, true, &dgram[..24]), frag(24, true, &dgram[24..48]), frag(48, false, &dgram[48..])]
}

/// A router's "fragmentation needed" about the reply VIP:53 -> client.
fn dns_icmp(client: [u8; 4], sport: u16) -> Vec<u8> {
    let reply = craft::ipv4(VIP, client, proto::UDP, &craft::udp(53, sport, &[0; 40]));
    let err = craft::icmp4_error(3, 4, &reply[..28]);
    craft::ether_with(FRONT_MAC, [0x02, 0xaa, 0, 0, 0, 1], &[], ethertype::IPV4, &craft::ipv4([203, 0, 113, 1], VIP, proto::ICMP, &err))
}

/// The client a forwarded frame is about: the source, or for an ICMP error
/// the destination of the reply it quotes.
fn client_of(frame: &[u8]) -> Addr {
    match sluice_dataplane::parse::parse(frame) {
        Ok(sluice_dataplane::parse::Frame::Ip(p)) if p.icmp_error => p.inner.dst,
        Ok(sluice_dataplane::parse::Frame::Ip(p)) => p.flow.src,
        other => panic!("a forwarded frame parses: {other:?}"),
    }
}

#[test]
fn steering_brings_every_packet_of_a_flow_to_one_endpoint() {
    steer_every_packet_of_a_flow_to_one_endpoint(usize::MAX);
}

/// The same with every burst, steered ones too, through the look-ahead stages.
#[test]
fn steering_through_the_look_ahead_stages_brings_every_packet_of_a_flow_to_one_endpoint() {
    steer_every_packet_of_a_flow_to_one_endpoint(0);
}

/// Three workers, each flow's packets spread over them; bursts go through
/// the look-ahead stages when the tables take `staging` bytes or more.
fn steer_every_packet_of_a_flow_to_one_endpoint(staging: usize) {
    use sluice_dataplane::counters::Ledger;
    use sluice_dataplane::steer::Steering;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    const WORKERS: usize = 3;
    let p = Publisher::new(appliance(1));
    let steering = Steering::new(WORKERS, 1024);
    let stop = Arc::new(AtomicBool::new(false));
    let mut feeds = Vec::new();
    let mut counters = Vec::new();
    let mut threads = Vec::new();
    for k in 0..WORKERS {
        let (tx, rx) = mpsc::channel::<Vec<Vec<u8>>>();
        let ctr = Arc::new(WorkerCounters::new(8, 1000));
        let cfg = WorkerConfig { id: k as u32, stash_capacity: 512, ..config() };
        let mut w = Worker::new(MemIo::new(3, 3), p.reader(), Arc::clone(&ctr), &cfg).with_steering(Arc::clone(&steering), k).with_staging(staging);
        let stop = Arc::clone(&stop);
        feeds.push(tx);
        counters.push(ctr);
        threads.push(std::thread::spawn(move || {
            let mut out = Vec::new();
            loop {
                let stopping = stop.load(Ordering::Acquire);
                while let Ok(batch) = rx.try_recv() {
                    w.io_mut().inputs[0].extend(batch.iter().map(|f| MemBuf::new(f)));
                }
                w.poll(1);
                out.append(&mut w.io_mut().outputs[1]);
                if stopping {
                    break;
                }
            }
            w.shutdown();
            let ledger = w.ledger();
            let io = w.io_mut();
            assert!(io.inputs.iter().all(|q| q.is_empty()));
            (out, ledger, io.freed, io.outputs.iter().map(Vec::len).sum::<usize>())
        }));
    }
    let settled = |n: u64| {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let done: u64 = counters.iter().map(|c| c.tx_packets.get() + c.total_drops()).sum();
            if done >= n {
                return done;
            }
            assert!(Instant::now() < end, "{done} of {n} packets came out");
            std::thread::sleep(Duration::from_millis(1));
        }
    };

    // RSS would spread a flow's packets by addresses; here every kind of
    // packet of flow i goes to another worker than the others.
    let clients: Vec<[u8; 4]> = (0..90u8).map(|i| [10, 9, i / 16, i]).collect();
    let mut batches = vec![Vec::new(); WORKERS];
    for (i, c) in clients.iter().enumerate() {
        batches[i % WORKERS].push(dns(*c, 5000));
    }
    for (f, b) in feeds.iter().zip(batches) {
        f.send(b).unwrap();
    }
    let first = settled(90);
    assert_eq!(first, 90);
    let mut batches = vec![Vec::new(); WORKERS];
    for (i, c) in clients.iter().enumerate() {
        let [a, b, z] = dns_fragments(*c, 5000, 1000 + i as u16);
        // Later fragments first, the first one last, on three workers.
        batches[(i + 2) % WORKERS].push(z);
        batches[(i + 1) % WORKERS].push(b);
        batches[(i + 1) % WORKERS].push(dns(*c, 5000));
        batches[i % WORKERS].push(a);
        batches[(i + 2) % WORKERS].push(dns_icmp(*c, 5000));
    }
    for (f, b) in feeds.iter().zip(batches) {
        f.send(b).unwrap();
    }
    let total = 90 * 6;
    assert_eq!(settled(total), total);
    stop.store(true, Ordering::Release);

    let mut endpoints: HashMap<Addr, HashSet<[u8; 6]>> = HashMap::new();
    let mut sum = Ledger::default();
    let (mut freed, mut out_frames) = (0, 0);
    for t in threads {
        let (out, ledger, f, o) = t.join().unwrap();
        for b in &out {
            endpoints.entry(client_of(b.data())).or_default().insert(dst_mac(b));
        }
        ledger.check().unwrap();
        sum = sum + ledger;
        freed += f;
        out_frames += o + out.len();
    }
    let split: Vec<_> = endpoints.iter().filter(|(_, m)| m.len() > 1).collect();
    assert!(split.is_empty(), "flows sent to several endpoints: {split:?}");
    assert_eq!(endpoints.len(), 90);
    assert_eq!(endpoints.values().map(HashSet::len).sum::<usize>(), 90);
    // Conservation over all workers; the queues are empty.
    sum.check().unwrap();
    assert_eq!(sum.received, total);
    assert_eq!((sum.sent, sum.dropped + sum.output_drops, sum.held), (total, 0, 0), "{sum:?}");
    assert_eq!(sum.steered_out, sum.steered_in, "nothing left in the queues");
    assert!(sum.steered_out >= 90 * 4, "most fragments and errors changed worker ({})", sum.steered_out);
    assert_eq!(steering.queued(), 0);
    assert_eq!((freed, out_frames as u64), (0, total));
}

#[test]
fn steering_is_for_stateful_traffic_and_bounded() {
    use sluice_dataplane::steer::{owner, Steering};
    let p = Publisher::new(appliance(1));
    let steering = Steering::new(2, 1);
    let mut a = H {
        w: Worker::new(MemIo::new(3, 3), p.reader(), Arc::new(WorkerCounters::new(8, 1000)), &config()).with_steering(Arc::clone(&steering), 0),
        drained: 0,
    };
    // Clients owned by worker 1.
    let theirs: Vec<[u8; 4]> = (0..=255u8).map(|i| [10, 7, 0, i]).filter(|c| owner(Addr::v4(*c), Addr::v4(VIP), 2) == 1).take(3).collect();
    let web = |c: [u8; 4]| craft::ether_with(FRONT_MAC, CLIENT_MAC, &[], ethertype::IPV4, &craft::ipv4(c, VIP, proto::TCP, &craft::tcp(4000, 80, 2, b"")));
    // Stateless maglev, not fragmented: never steered.
    feed(&mut a, 0, &theirs.iter().map(|c| web(*c)).collect::<Vec<_>>());
    a.poll(1);
    assert_eq!(drain(&mut a, 1).len(), 3);
    assert_eq!(a.counters().steered_out.get(), 0);
    // A flow-table service: steered, one queue slot, the rest a counted drop.
    feed(&mut a, 0, &theirs.iter().map(|c| dns(*c, 7)).collect::<Vec<_>>());
    a.poll(1);
    assert_eq!(a.counters().steered_out.get(), 1);
    assert_eq!(a.counters().drops[DropReason::SteerQueueFull.index()].get(), 2);
    assert_eq!(steering.queued(), 1);
    // Worker 0's own flows stay with it.
    let mine = (0..=255u8).map(|i| [10, 8, 0, i]).find(|c| owner(Addr::v4(*c), Addr::v4(VIP), 2) == 0).unwrap();
    feed(&mut a, 0, &[dns(mine, 7)]);
    a.poll(1);
    assert_eq!(drain(&mut a, 1).len(), 1);
    assert_conserved(&mut a);
    // Shutdown frees what waits in the queues, counted.
    a.w.shutdown();
    assert_eq!(steering.queued(), 0);
    assert_eq!(a.counters().drops[DropReason::SteeredAtShutdown.index()].get(), 1);
    assert_eq!(a.counters().steered_in.get(), 1);
    assert_conserved(&mut a);
}

#[test]
fn busy_time_is_time_not_polls() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    let frames: Vec<Vec<u8>> = (0..64).map(|i| to_vip(1000 + i, 80, proto::TCP)).collect();
    feed(&mut w, 0, &frames);
    let ctr = Arc::clone(w.counters());
    let stop = AtomicBool::new(false);
    let polls = AtomicU64::new(0);
    // A clock on which a packet costs 1000 cycles and a round 10: two busy
    // rounds of 32 packets, then 998 idle ones.
    let cycles = || 1000 * ctr.rx_packets.get() + 10 * polls.load(Ordering::Relaxed);
    let clock_ms = || {
        if polls.fetch_add(1, Ordering::Relaxed) + 1 == 1000 {
            stop.store(true, Ordering::Relaxed);
        }
        1
    };
    w.run(&stop, clock_ms, cycles);
    assert_eq!((ctr.busy_polls.get(), ctr.idle_polls.get()), (2, 998));
    assert_eq!(ctr.busy_cycles.get(), 2 * 10 + 64 * 1000);
    assert_eq!(ctr.idle_cycles.get(), 998 * 10);
    let busy = ctr.busy_cycles.get() as f64 / (ctr.busy_cycles.get() + ctr.idle_cycles.get()) as f64;
    assert!(busy > 0.8, "busy {busy}, though only 0.2 % of the polls were");
    assert_eq!(drain(&mut w, 1).len(), 64);
    assert_conserved(&mut w);
}

#[test]
fn an_idle_worker_pauses_and_traffic_is_taken_before_the_next_pause() {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicBool, Ordering};
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    let ctr = Arc::clone(w.counters());
    let policy = IdlePolicy { spin_rounds: 2, max_pause_us: 8, rx_interrupts: false };
    let stop = AtomicBool::new(false);
    let asked = RefCell::new(Vec::new());
    w.run_with(&stop, || 1, || 0, policy, |us| {
        asked.borrow_mut().push(us);
        if asked.borrow().len() == 6 {
            stop.store(true, Ordering::Relaxed);
        }
    });
    assert_eq!(*asked.borrow(), [1, 2, 4, 8, 8, 8]);
    assert_eq!(ctr.idle_pauses.get(), 6);
    assert_eq!(ctr.idle_polls.get(), 8, "two rounds spun, then one after each pause");

    // Traffic: 40 packets are taken in two rounds without a pause between,
    // then two empty rounds spin before the first (shortest) pause.
    let frames: Vec<Vec<u8>> = (0..40).map(|i| to_vip(2000 + i, 80, proto::TCP)).collect();
    feed(&mut w, 0, &frames);
    stop.store(false, Ordering::Relaxed);
    asked.borrow_mut().clear();
    w.run_with(&stop, || 1, || 0, policy, |us| {
        asked.borrow_mut().push(us);
        stop.store(true, Ordering::Relaxed);
    });
    assert_eq!(*asked.borrow(), [1]);
    assert_eq!(ctr.busy_polls.get(), 2);
    assert_eq!(ctr.idle_polls.get(), 8 + 3);
    assert_eq!(drain(&mut w, 1).len(), 40);
    assert_conserved(&mut w);
}

#[test]
fn pauses_wait_on_receive_interrupts_where_the_inputs_have_them() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let policy = IdlePolicy { spin_rounds: 2, max_pause_us: 8, rx_interrupts: true };
    // 12 empty rounds: 2 spun, 10 paused.
    let run = |w: &mut H, policy: IdlePolicy, pause: &dyn Fn(u32)| {
        let stop = AtomicBool::new(false);
        let rounds = AtomicU64::new(0);
        let clock_ms = || {
            if rounds.fetch_add(1, Ordering::Relaxed) + 1 == 12 {
                stop.store(true, Ordering::Relaxed);
            }
            1
        };
        w.run_with(&stop, clock_ms, || 0, policy, pause);
    };

    // Inputs that signal arrivals: every pause is a wait on them.
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    let ctr = Arc::clone(w.counters());
    w.io_mut().interrupts = true;
    run(&mut w, policy, &|_| panic!("slept although the inputs can wake the worker"));
    assert_eq!(w.io_mut().waited, [1, 2, 4, 8, 8, 8, 8, 8, 8, 8], "the same back-off, spent waiting");
    assert_eq!((ctr.idle_pauses.get(), ctr.interrupt_waits.get(), ctr.interrupt_wakeups.get()), (10, 10, 0));
    assert_eq!(ctr.interrupts_armed.get(), 1);

    // An interrupt ends a wait before its frame shows: the worker polls
    // closely again (spins, then the shortest pauses) instead of waiting
    // the longest pause for what is already there.
    let mut w = worker(&p);
    let ctr = Arc::clone(w.counters());
    w.io_mut().interrupts = true;
    w.io_mut().early_signals = 1;
    run(&mut w, policy, &|_| panic!("slept although the inputs can wake the worker"));
    assert_eq!(w.io_mut().waited, [1, 1, 2, 4, 8, 8, 8, 8]);
    assert_eq!((ctr.interrupt_waits.get(), ctr.interrupt_wakeups.get()), (8, 1));

    // The same inputs with the policy's switch off, and inputs without
    // interrupts: the worker sleeps.
    for (interrupts, switch) in [(true, false), (false, true)] {
        let mut w = worker(&p);
        let ctr = Arc::clone(w.counters());
        w.io_mut().interrupts = interrupts;
        let slept = std::cell::RefCell::new(Vec::new());
        run(&mut w, IdlePolicy { rx_interrupts: switch, ..policy }, &|us| slept.borrow_mut().push(us));
        assert_eq!(slept.borrow().len(), 10);
        assert!(w.io_mut().waited.is_empty());
        assert_eq!((ctr.interrupts_armed.get(), ctr.interrupt_waits.get()), (0, 0));
    }
    assert_conserved(&mut w);
}

#[test]
fn busy_polling_never_pauses() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let p = Publisher::new(appliance(1));
    let mut w = worker(&p);
    let ctr = Arc::clone(w.counters());
    let stop = AtomicBool::new(false);
    let rounds = AtomicU64::new(0);
    let clock_ms = || {
        if rounds.fetch_add(1, Ordering::Relaxed) + 1 == 500 {
            stop.store(true, Ordering::Relaxed);
        }
        1
    };
    w.run_with(&stop, clock_ms, || 0, IdlePolicy::BUSY_POLL, |_| panic!("paused while busy polling"));
    assert_eq!((ctr.idle_polls.get(), ctr.idle_pauses.get()), (500, 0));
}

#[test]
fn the_look_ahead_stages_change_no_outcome() {
    let p = Publisher::new(appliance(1));
    let staged_worker = |min: usize| H {
        w: Worker::new(MemIo::new(3, 3), p.reader(), Arc::new(WorkerCounters::new(8, 1000)), &config()).with_staging(min),
        drained: 0,
    };
    let (mut on, mut off) = (staged_worker(0), staged_worker(usize::MAX));
    // Every kind of packet, interleaved within bursts: maglev, random with a
    // flow table, maglev with a flow table, IP-in-IP, no endpoint, no route,
    // fragments (first after later), ICMP errors, not a VIP, broadcast,
    // truncated.
    let mut frames = Vec::new();
    for i in 0..200u16 {
        frames.push(to_vip(1000 + i, 80, proto::TCP));
        frames.push(dns([198, 51, 100, (i % 7) as u8 + 1], 2000 + i));
        frames.push(to_vip(3000 + i, 8080, proto::TCP));
        frames.push(to_vip(4000 + i, 8443, proto::UDP));
        frames.push(to_vip(5000 + i, 9, proto::TCP));
        frames.push(to_vip(6000 + i, 7777, proto::TCP));
        if i % 10 == 0 {
            let [first, second, third] = dns_fragments([198, 51, 100, 99], 7000 + i, i);
            frames.extend([third, first, second]);
            frames.push(dns_icmp([198, 51, 100, 1], 2000 + i));
            let mut other = to_vip(8000 + i, 80, proto::TCP);
            other[30] = 21; // to 21.0.0.1: not a VIP
            frames.push(other);
            let mut bcast = to_vip(9000 + i, 80, proto::TCP);
            bcast[..6].copy_from_slice(&[0xff; 6]);
            frames.push(bcast);
            frames.push(to_vip(9500 + i, 80, proto::TCP)[..20].to_vec());
        }
    }
    for w in [&mut on, &mut off] {
        feed(w, 0, &frames);
        let mut now = 1;
        while w.poll(now) > 0 {
            now += 1;
        }
    }
    assert!(on.io_mut().prefetches.get() > 1000, "the stages ran");
    assert_eq!(off.io_mut().prefetches.get(), 0);
    for o in 0..3 {
        let a: Vec<Vec<u8>> = drain(&mut on, o).iter().map(|b| b.data().to_vec()).collect();
        let b: Vec<Vec<u8>> = drain(&mut off, o).iter().map(|b| b.data().to_vec()).collect();
        assert!(!a.is_empty() || o == 0, "output {o} saw traffic (0 only carries return traffic)");
        assert_eq!(a, b, "output {o}");
    }
    let (a, b) = (on.counters(), off.counters());
    assert_eq!((a.balanced.get(), a.exception.get(), a.total_drops()), (b.balanced.get(), b.exception.get(), b.total_drops()));
    assert_conserved(&mut on);
    assert_conserved(&mut off);
}

#[test]
fn latency_counts_each_packet_from_a_port_once() {
    use sluice_dataplane::latency::SharedLatency;
    use std::sync::atomic::{AtomicU64, Ordering};
    static CLOCK: AtomicU64 = AtomicU64::new(0);
    // Every read of the clock advances it by 10 ticks: a burst is stamped
    // at its arrival and again once its round has sent everything.
    fn clock() -> u64 {
        CLOCK.fetch_add(10, Ordering::Relaxed)
    }
    let p = Publisher::new(appliance(1));
    let shared = Arc::new(SharedLatency::default());
    let w = Worker::new(MemIo::new(3, 3), p.reader(), Arc::new(WorkerCounters::new(8, 1000)), &config());
    let mut w = H { w: w.with_latency(clock, Arc::clone(&shared)), drained: 0 };
    let arp = craft::ether_with([0xff; 6], CLIENT_MAC, &[], ethertype::ARP, &[0; 28]);
    let frames: Vec<Vec<u8>> = (0..40).map(|i| to_vip(1000 + i, 80, proto::TCP)).collect();
    feed(&mut w, 0, &frames);
    feed(&mut w, 1, std::slice::from_ref(&arp));
    feed(&mut w, 2, &[b"from the kernel: not timed".to_vec()]);
    let mut now = 1;
    while w.poll(now) > 0 {
        now += 1;
    }
    w.shutdown();
    let h = shared.snapshot();
    assert_eq!(h.len(), 41, "the 40 frames to the VIP and the ARP, each once; not the kernel's frame");
    assert!(h.min() >= 10, "a burst's time includes the clock read between its stamps");
    drain(&mut w, 1);
    drain(&mut w, 2);
    drain(&mut w, 0);
    assert_conserved(&mut w);
}

/// An endpoint's answer on the return path (source = the VIP, from its MAC
/// on the back port) to client port `sport`, with TCP flags `flags`.
fn from_endpoint(mac: [u8; 6], sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let l4 = craft::tcp(dport, sport, flags, b"");
    craft::ether_with(BACK_MAC, mac, &[], ethertype::IPV4, &craft::with_l4_checksum(craft::ipv4(VIP, CLIENT, proto::TCP, &l4), 20))
}

#[test]
fn a_syn_and_its_endpoints_answer_meet_in_the_handshake_table_across_workers() {
    use sluice_dataplane::handshake::{Answer, Handshakes};
    const TCP_RST: u8 = 0x04;
    let p = Publisher::new(with_endpoints(1, 3, 0));
    let table = Arc::new(Handshakes::new(4096));
    // Two workers: one takes the clients' SYNs, the other the endpoints'
    // answers (as RSS may spread them).
    let with_table = |p: &Publisher<Snapshot>| {
        let w = Worker::new(MemIo::new(3, 3), p.reader(), Arc::new(WorkerCounters::new(8, 1000)), &config());
        H { w: w.with_handshakes(Arc::clone(&table)), drained: 0 }
    };
    let (mut front, mut back) = (with_table(&p), with_table(&p));
    let sent = send_flows_flags(&mut front, 2000..2030, 8080, proto::TCP, TCP_SYN, 1000);
    assert_eq!(front.counters().handshakes_sampled.get(), 30);
    // Endpoint 0 answers with RSTs (nothing listens), the others accept.
    let rst_mac = ep_mac(4, 0, 1);
    let answers: Vec<Vec<u8>> = sent.iter().map(|(&s, &mac)| from_endpoint(mac, s, 8080, if mac == rst_mac { TCP_RST | TCP_ACK } else { TCP_SYN | TCP_ACK })).collect();
    feed(&mut back, 1, &answers);
    while back.poll(1001) > 0 {}
    assert_eq!(drain(&mut back, 0).len(), 30, "every answer goes on to the gateway");
    let mut out = Vec::new();
    assert_eq!(table.sweep(u32::MAX, &mut out), 0, "every slot freed");
    assert_eq!(out.len(), 30);
    for o in &out {
        assert_eq!(o.service, 4);
        let want = if o.endpoint == 0 { Answer::Reset } else { Answer::SynAck };
        assert_eq!(o.answer, want, "{o:?}");
    }
    let resets = sent.values().filter(|&&m| m == rst_mac).count();
    assert!(resets > 0 && resets < 30, "the flows spread: {resets} to endpoint 0");
    assert_eq!(out.iter().filter(|o| o.answer == Answer::Reset).count(), resets);
    // Established traffic (an ACK) and an answer to nobody's SYN record nothing.
    send_flows(&mut front, 2000..2010, 8080, proto::TCP, 1002);
    feed(&mut back, 1, &[from_endpoint(ep_mac(4, 1, 1), 3000, 8080, TCP_SYN | TCP_ACK)]);
    while back.poll(1003) > 0 {}
    assert_eq!(table.sweep(0, &mut out), 0);
    assert_eq!(out.len(), 30);
    assert_conserved(&mut front);
    assert_conserved(&mut back);
}

/// A snapshot of one service of 500 endpoints (`algorithm`, with flow
/// state) behind a UDP route (port 53) and a TCP route (port 80) of the
/// VIP, and that service: with 500 endpoints, the records and table
/// entries packets go to are far apart.
fn many_endpoints(algorithm: Algorithm) -> (Snapshot, Arc<sluice_dataplane::service::Service>) {
    use sluice_dataplane::service::{EndpointSpec, Service, ServiceSpec};
    use sluice_dataplane::snapshot::{NextHop, PortInfo};
    let eps = (0..500u16)
        .map(|id| EndpointSpec {
            id,
            incarnation: 1,
            weight: 1,
            draining: false,
            addr: Addr::v4([192, 168, (id >> 8) as u8, id as u8]),
            port: 1,
            mac: ep_mac(1, id, 1),
            delivery: Delivery::L2,
            counter: u32::from(id),
        })
        .collect();
    let spec = ServiceSpec { name: "many".into(), key: 0, algorithm, flow_table: true, limit: 1024, table_size: 0, endpoints: eps };
    let routes = [route("udp", 0, Addr::v4(VIP), Some(53), &[proto::UDP]), route("tcp", 0, Addr::v4(VIP), Some(80), &[proto::TCP])];
    let ports = vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 0 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 0 }];
    let snap = Snapshot::new(1, &routes, vec![Arc::new(Service::build(&spec).unwrap())], ports, Some(NextHop { port: 0, mac: GW_MAC }), None);
    let svc = Arc::clone(&snap.services[0]);
    (snap, svc)
}

/// The addresses the look-ahead stages request for the burst `bufs`.
fn requests_of(pl: &mut sluice_dataplane::pipeline::Pipeline, snap: &Snapshot, ctr: &WorkerCounters, bufs: &[MemBuf]) -> HashSet<usize> {
    let asked = std::cell::RefCell::new(HashSet::new());
    pl.prefetch_burst(snap, ctr, bufs, |a| {
        asked.borrow_mut().insert(a as usize);
    });
    asked.into_inner()
}

/// Processes the burst `bufs` after its look-ahead stages (each packet
/// must go to an endpoint of `svc`): how many went to an endpoint whose
/// record and counters were among the requests `asked`.
fn process_requested(
    pl: &mut sluice_dataplane::pipeline::Pipeline,
    snap: &Snapshot,
    svc: &sluice_dataplane::service::Service,
    ctr: &WorkerCounters,
    bufs: &mut [MemBuf],
    asked: &HashSet<usize>,
    round: usize,
) -> usize {
    let mut requested = 0;
    for (i, b) in bufs.iter_mut().enumerate() {
        let v = pl.process_ahead(i, snap, 0, b, 1, ctr, true);
        assert!(matches!(v, sluice_dataplane::verdict::Verdict::Forward(1)), "round {round} packet {i}: {v:?}");
        let mac = dst_mac(b);
        let ep = svc.endpoints().find(|e| ep_mac(1, e.id, 1) == mac).expect("sent to an endpoint");
        let record = svc.endpoint_addr(svc.position(ep)) as usize;
        let counters = std::ptr::from_ref(&ctr.endpoints[ep.counter as usize]) as usize;
        requested += usize::from(asked.contains(&record) && asked.contains(&counters));
    }
    requested
}

/// The look-ahead stages work out the draws the packets of a random
/// service will make, in their order, without changing the generator: the
/// endpoint each new flow (a UDP flow without a pin, a SYN) goes to had its
/// record and counters requested before the packet was processed. With 500
/// endpoints and 32 packets a burst, a wrong guess of the draws would leave
/// most chosen endpoints unrequested.
#[test]
fn the_look_ahead_stages_request_the_endpoints_random_draws_pick() {
    use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
    let (snap, svc) = many_endpoints(Algorithm::Random);
    let ctr = WorkerCounters::new(1, 500);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 42);
    let (mut drawn, mut requested) = (0, 0);
    // New UDP flows, SYNs of new TCP flows, then the same SYNs again (they
    // have pins now, and a SYN draws all the same).
    for round in 0..3u16 {
        let frames: Vec<Vec<u8>> = (0..32u16)
            .map(|i| match round {
                0 => to_vip(2000 + i, 53, proto::UDP),
                _ => to_vip_flags(3000 + i, 80, proto::TCP, TCP_SYN),
            })
            .collect();
        let mut bufs: Vec<MemBuf> = frames.iter().map(|f| MemBuf::new(f)).collect();
        let asked = requests_of(&mut pl, &snap, &ctr, &bufs);
        drawn += bufs.len();
        requested += process_requested(&mut pl, &snap, &svc, &ctr, &mut bufs, &asked, usize::from(round));
    }
    assert_eq!(requested, drawn, "every endpoint a draw picked was requested ahead, with its counters");
}

/// The look-ahead stages with a Maglev service that keeps flow state: a
/// new flow (a UDP flow without a pin, a SYN) has the endpoint its table
/// entry names requested, with its counters; an established flow (the same
/// flows again, pinned) has its pinned endpoint and counters requested and
/// not its table entry, which it does not read (a miss of every packet with
/// large tables otherwise).
#[test]
fn the_look_ahead_stages_leave_the_table_of_an_established_flow_alone() {
    use sluice_dataplane::hash::flow_hash;
    use sluice_dataplane::parse::{parse_into, Parsed};
    use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
    let (snap, svc) = many_endpoints(Algorithm::Maglev);
    let table = svc.table.as_ref().expect("a Maglev table");
    let ctr = WorkerCounters::new(1, 500);
    let mut pl = Pipeline::new(&PipelineConfig::default(), 42);
    // Rounds: new UDP flows, new TCP flows (ACKs), SYNs of new TCP flows,
    // then each again (established; a SYN takes the table all the same).
    let rounds: [(u16, u16, u8, u8, bool); 6] = [
        (2000, 53, proto::UDP, TCP_ACK, false),
        (3000, 80, proto::TCP, TCP_ACK, false),
        (4000, 80, proto::TCP, TCP_SYN, false),
        (2000, 53, proto::UDP, TCP_ACK, true),
        (3000, 80, proto::TCP, TCP_ACK, true),
        (4000, 80, proto::TCP, TCP_SYN, false),
    ];
    for (round, &(first, dport, protocol, flags, established)) in rounds.iter().enumerate() {
        let frames: Vec<Vec<u8>> = (0..32u16).map(|i| to_vip_flags(first + i, dport, protocol, flags)).collect();
        let mut bufs: Vec<MemBuf> = frames.iter().map(|f| MemBuf::new(f)).collect();
        let asked = requests_of(&mut pl, &snap, &ctr, &bufs);
        let entries = frames
            .iter()
            .filter(|f| {
                let mut p = Parsed::default();
                parse_into(f, &mut p).expect("the frame parses");
                asked.contains(&(table.entry_addr(flow_hash(&p.flow)) as usize))
            })
            .count();
        let sent = bufs.len();
        let requested = process_requested(&mut pl, &snap, &svc, &ctr, &mut bufs, &asked, round);
        assert_eq!(requested, sent, "round {round}: every endpoint a packet went to was requested ahead, with its counters");
        let want = if established { 0 } else { sent };
        assert_eq!(entries, want, "round {round}: table entries requested (established: {established})");
    }
}
