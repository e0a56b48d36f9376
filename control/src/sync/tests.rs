//! Sync tasks over loopback TCP: two appliances, and a hand-driven peer
//! for what a well-behaved one never sends.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::config::siblings::SharedKey;
use sluice_dataplane::flow::FlowState;
use sluice_dataplane::hash::flow_hash;
use sluice_dataplane::parse::Flow;
use sluice_dataplane::rcu::Reader;
use crate::fixture::{endpoint, one_service, web};
use sluice_dataplane::service::{Algorithm, EndpointSpec};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
const WAIT: Duration = Duration::from_secs(20);

/// A snapshot with one Maglev service "web" of key `key`, endpoints 1..=3
/// (10.0.1.1..3) of incarnations `inc + id`; each appliance numbers them
/// its own way.
fn snapshot(key: u32, inc: u32) -> Arc<Snapshot> {
    let endpoints = (1..=3u16).map(|id| endpoint(id, inc + u32::from(id), Addr::v4([10, 0, 1, u8::try_from(id).unwrap()]))).collect();
    Arc::new(one_service(&web(key, Algorithm::Maglev, true, endpoints)))
}

fn flow(i: u32) -> Flow {
    Flow { src: Addr::v4([192, 0, 2, u8::try_from(i % 250).unwrap()]), dst: Addr::v4([20, 0, 0, 1]), sport: u16::try_from(10_000 + i).unwrap(), dport: 80, proto: 6 }
}

struct Node {
    ring: Arc<SyncRing>,
    synced: Reader<SyncedPins>,
    status: watch::Receiver<SyncStatus>,
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    published: watch::Sender<Published>,
    gated: watch::Receiver<Gated>,
}

fn cfg(listen: SocketAddr, peers: Vec<SocketAddr>, key: &[u8], rate: u32) -> SiblingsConfig {
    SiblingsConfig {
        listen,
        peers,
        kubernetes_pods: false,
        key_file: "k".into(),
        key: SharedKey(key.to_vec()),
        startup_wait_ms: 3000,
        max_records_per_second: rate,
        gate: false,
    }
}

async fn node(listen: SocketAddr, peers: Vec<SocketAddr>, key: &[u8], snap: Arc<Snapshot>, rate: u32) -> Node {
    node_following(listen, peers, None, key, snap, rate).await
}

/// A node that also takes its peers from `discovered`.
async fn node_following(listen: SocketAddr, peers: Vec<SocketAddr>, discovered: Option<Discovered>, key: &[u8], snap: Arc<Snapshot>, rate: u32) -> Node {
    node_with(cfg(listen, peers, key, rate), discovered, snap).await
}

async fn node_with(cfg: SiblingsConfig, discovered: Option<Discovered>, snap: Arc<Snapshot>) -> Node {
    let ring = Arc::new(SyncRing::new(1024));
    let publisher = Publisher::new(SyncedPins::default());
    let synced = publisher.reader();
    let (tx, rx) = watch::channel(Published { snapshot: snap, ..Published::default() });
    let mut sync = SyncTask::bind(cfg, vec![Arc::clone(&ring)], publisher, rx, Instant::now()).await.unwrap();
    if let Some(d) = discovered {
        sync = sync.follow(d);
    }
    let addr = sync.local_addr().unwrap();
    let status = sync.status();
    let gated = sync.gated();
    let stop = CancellationToken::new();
    let task = tokio::spawn(sync.run(stop.clone()));
    Node { ring, synced, status, addr, stop, task, published: tx, gated }
}

/// A port free on loopback (bound, then let go).
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

async fn until(status: &mut watch::Receiver<SyncStatus>, what: &str, f: impl Fn(&SyncStatus) -> bool) -> SyncStatus {
    let r = tokio::time::timeout(WAIT, status.wait_for(|s| f(s))).await.map(|r| r.map(|s| s.clone()));
    match r {
        Ok(Ok(s)) => s,
        _ => panic!("{what}: not reached in {WAIT:?}; last status {:#?}", *status.borrow()),
    }
}

/// The workers' table of `b` (a node of `snapshot(9, 200)`) once it holds
/// `n` pins, checked: flows 0..n, each pinned to endpoint `1 + i % 3` with
/// b's incarnation.
async fn synced_table(b: &mut Node, n: u32) -> &SyncedPins {
    let deadline = Instant::now() + WAIT;
    while b.synced.read().len() < n as usize {
        assert!(Instant::now() < deadline, "b's synced pins: {:?}", b.synced.last());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t = b.synced.read();
    for i in 0..n {
        let ep = 1 + u16::try_from(i % 3).unwrap();
        let k = FlowKey { flow: flow(i), service: 9 };
        let p = t.lookup(&k, flow_hash(&k.flow), 0).unwrap_or_else(|| panic!("flow {i} not synced"));
        assert_eq!((p.endpoint, p.incarnation), (ep, 200 + u32::from(ep)), "flow {i}");
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_appliances_exchange_pins_in_their_own_numbering() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let mut a = node(a_addr, vec![b_addr], KEY, snapshot(5, 100), 200_000).await;
    let mut b = node(b_addr, vec![a_addr], KEY, snapshot(9, 200), 200_000).await;
    for i in 0..100u32 {
        let ep = 1 + u16::try_from(i % 3).unwrap();
        let k = FlowKey { flow: flow(i), service: 5 };
        assert!(a.ring.push(PinRecord::new(&k, ep, 100 + u32::from(ep), FlowState::TcpOpen, 3600)));
    }
    // One exported to an endpoint since given to another incarnation: stale.
    assert!(a.ring.push(PinRecord::new(&FlowKey { flow: flow(500), service: 5 }, 1, 7, FlowState::TcpOpen, 3600)));
    let sa = until(&mut a.status, "a holds its pins, b took them", |s| s.pins_held == 100 && s.peers.iter().any(|p| p.subscribed && p.lag == 0) && s.sent >= 100).await;
    assert_eq!(sa.stale, 1, "{sa:#?}");
    let sb = until(&mut b.status, "b synced a's pins", |s| s.pins_synced == 100).await;
    assert_eq!((sb.refused, sb.rate_dropped, sb.unknown), (0, 0, 0), "{sb:#?}");
    assert!(sb.settled && sb.not_heard.is_empty(), "{sb:#?}");
    let peer = &sb.peers[0];
    assert!(peer.connected && peer.in_sync && peer.address == a_addr.to_string(), "{sb:#?}");
    // The workers' table holds them under b's key and incarnations; the
    // rebuild is published after the status counted them.
    let t = synced_table(&mut b, 100).await;
    for i in 0..100u32 {
        let k = FlowKey { flow: flow(i), service: 9 };
        let p = t.lookup(&k, flow_hash(&k.flow), 0).unwrap();
        assert!(p.deadline_ms >= 3_500_000, "its lifetime: {p:?}");
        assert!(t.lookup(&FlowKey { service: 5, ..k }, flow_hash(&k.flow), 0).is_none(), "a's key means nothing here");
    }
    for n in [a, b] {
        n.stop.cancel();
        n.task.await.unwrap();
    }
}

/// Peers a discovery gives (the pods of a Gateway's Deployment) are
/// followed as they come and go, and an appliance does not settle before
/// the discovery listed them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_siblings_are_followed_as_they_come_and_go() {
    let (a_addr, b_addr, c_addr) = (free_port(), free_port(), free_port());
    let b = node(b_addr, vec![], KEY, snapshot(5, 100), 200_000).await;
    let c = node(c_addr, vec![], KEY, snapshot(7, 300), 200_000).await;
    for i in 0..20u32 {
        let ep = 1 + u16::try_from(i % 3).unwrap();
        assert!(b.ring.push(PinRecord::new(&FlowKey { flow: flow(i), service: 5 }, ep, 100 + u32::from(ep), FlowState::TcpOpen, 3600)));
    }
    let (found, discovered) = watch::channel(None);
    let mut a = node_following(a_addr, vec![], Some(discovered), KEY, snapshot(9, 200), 200_000).await;
    // Not listed yet: nothing dialled, not settled, and the status says why.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sa = a.status.borrow().clone();
    assert!(!sa.settled && sa.peers.is_empty(), "{sa:#?}");
    // Listed: b (and a itself, which is left out) are the siblings.
    found.send_replace(Some(vec![a_addr, b_addr]));
    let sa = until(&mut a.status, "a settled on b's pins", |s| s.settled && s.pins_synced == 20).await;
    assert!(sa.not_heard.is_empty(), "{sa:#?}");
    assert_eq!(sa.peers.iter().map(|p| (p.address.clone(), p.connected, p.in_sync)).collect::<Vec<_>>(), [(b_addr.to_string(), true, true)]);
    synced_table(&mut a, 20).await;
    // b's pod goes, c's comes: b is let go, c dialled.
    found.send_replace(Some(vec![c_addr]));
    let sa = until(&mut a.status, "a follows c alone", |s| s.peers.len() == 1 && s.peers[0].address == c_addr.to_string() && s.peers[0].in_sync).await;
    assert_eq!(sa.pins_synced, 20, "the pins b gave stay until their lifetime ends: {sa:#?}");
    let mut b = b;
    until(&mut b.status, "b no longer sends to a", |s| s.peers.iter().all(|p| !p.subscribed)).await;
    for n in [a, b, c] {
        n.stop.cancel();
        n.task.await.unwrap();
    }
}

/// A discovery that never lists holds the start for `startupWaitMs`, then
/// the appliance announces anyway and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_that_never_lists_holds_the_start_only_up_to_the_wait() {
    let (_found, discovered) = watch::channel(None);
    let mut a = node_following(free_port(), vec![], Some(discovered), KEY, snapshot(9, 200), 200_000).await;
    let sa = until(&mut a.status, "settled after the wait", |s| s.settled).await;
    assert_eq!(sa.not_heard, [NOT_LISTED], "{sa:#?}");
    a.stop.cancel();
    a.task.await.unwrap();
}

/// An appliance that takes its siblings' pins before its own snapshot
/// knows their service (it starts, or its sibling applied the change
/// first) keeps them and uses them once a snapshot does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_that_arrive_before_the_snapshot_knows_them_are_used_once_it_does() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let a = node(a_addr, vec![], KEY, snapshot(5, 100), 200_000).await;
    let empty = Arc::new(Snapshot::new(1, &[], vec![], vec![], None, None));
    let mut b = node(b_addr, vec![a_addr], KEY, empty, 200_000).await;
    for i in 0..30u32 {
        let ep = 1 + u16::try_from(i % 3).unwrap();
        assert!(a.ring.push(PinRecord::new(&FlowKey { flow: flow(i), service: 5 }, ep, 100 + u32::from(ep), FlowState::TcpOpen, 3600)));
    }
    let sb = until(&mut b.status, "b took a's pins, not knowing their service", |s| s.received == 30 && s.unknown == 30).await;
    assert_eq!(sb.pins_synced, 0, "{sb:#?}");
    b.published.send_replace(Published { snapshot: snapshot(9, 200), ..Published::default() });
    until(&mut b.status, "b maps them with its snapshot", |s| s.pins_synced == 30).await;
    synced_table(&mut b, 30).await;
    for n in [a, b] {
        n.stop.cancel();
        n.task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_key_is_refused_and_counted_on_both_sides() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let mut a = node(a_addr, vec![b_addr], KEY, snapshot(5, 100), 200_000).await;
    let mut b = node(b_addr, vec![a_addr], b"another key that is 32 bytes long!", snapshot(9, 200), 200_000).await;
    assert!(a.ring.push(PinRecord::new(&FlowKey { flow: flow(1), service: 5 }, 1, 101, FlowState::TcpOpen, 3600)));
    let sa = until(&mut a.status, "a refuses b", |s| s.refused >= 2).await;
    let sb = until(&mut b.status, "b refuses a", |s| s.refused >= 2).await;
    for s in [&sa, &sb] {
        assert!(s.peers.iter().all(|p| !p.connected && !p.subscribed), "{s:#?}");
        assert_eq!(s.pins_synced, 0, "{s:#?}");
    }
    assert_eq!(sa.sent, 0, "{sa:#?}");
    for n in [a, b] {
        n.stop.cancel();
        n.task.await.unwrap();
    }
}

/// A peer driven by hand: it accepts one connection, completes the
/// handshake with `key`, then runs `then` on the stream and session.
async fn fake_peer<F, Fut>(key: &'static [u8], then: F) -> (SocketAddr, tokio::task::JoinHandle<()>)
where
    F: FnOnce(TcpStream, wire::Session) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let h = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let (session, _, _) = wire::accept(&mut s, key).await.unwrap();
        then(s, session).await;
    });
    (addr, h)
}

fn records(from: u32, n: u32, service: u32) -> Vec<u8> {
    (from..from + n)
        .map(|i| {
            let ep = 1 + u16::try_from(i % 3).unwrap();
            PinRecord::new(&FlowKey { flow: flow(i), service }, ep, 0, FlowState::TcpOpen, 600)
        })
        .flat_map(|r| PinRecord { incarnation: address_tag(Addr::v4([10, 0, 1, u8::try_from(r.endpoint).unwrap()])), ..r }.encode())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_with_a_wrong_mac_is_refused_and_counted() {
    let tag = service_tag("web");
    let (peer, h) = fake_peer(KEY, move |mut s, session| async move {
        let mut forged = wire::Session { key: [9; wire::MAC_LEN], seq: session.seq };
        wire::write_frame(&mut s, &mut forged, Kind::Records, &records(0, 10, tag)).await.unwrap();
        s.flush().await.unwrap();
        // The connection is closed by the other side.
        let mut b = [0u8; 1];
        let _ = tokio::io::AsyncReadExt::read(&mut s, &mut b).await;
    })
    .await;
    let mut b = node(free_port(), vec![peer], KEY, snapshot(9, 200), 200_000).await;
    let s = until(&mut b.status, "the forged frame refused", |s| s.refused >= 1).await;
    assert_eq!((s.received, s.pins_synced), (0, 0), "nothing of the frame taken: {s:#?}");
    h.await.unwrap();
    b.stop.cancel();
    b.task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_above_the_rate_bound_are_dropped_and_counted() {
    let tag = service_tag("web");
    let (peer, h) = fake_peer(KEY, move |mut s, mut session| async move {
        // 1,000 records at once to a sibling that takes 100 per second.
        for k in 0..4u32 {
            wire::write_frame(&mut s, &mut session, Kind::Records, &records(k * 250, 250, tag)).await.unwrap();
        }
        wire::write_frame(&mut s, &mut session, Kind::InSync, &[]).await.unwrap();
        s.flush().await.unwrap();
        let mut b = [0u8; 1];
        let _ = tokio::io::AsyncReadExt::read(&mut s, &mut b).await;
    })
    .await;
    let mut b = node(free_port(), vec![peer], KEY, snapshot(9, 200), 100).await;
    let s = until(&mut b.status, "1,000 received", |s| s.received == 1000 && s.peers[0].in_sync).await;
    let s = until(&mut b.status, "the pins taken", |x| x.pins_synced + x.rate_dropped == 1000 && x.received == s.received).await;
    assert!(s.rate_dropped >= 850, "about 900 dropped: {s:#?}");
    assert_eq!((s.refused, s.unknown), (0, 0), "{s:#?}");
    println!("rate bound 100/s, 1000 sent at once: {} taken, {} dropped", s.pins_synced, s.rate_dropped);
    b.stop.cancel();
    b.task.await.unwrap();
    h.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_gets_the_full_set_then_the_marker() {
    let mut a = node(free_port(), vec![], KEY, snapshot(5, 100), 200_000).await;
    for i in 0..300u32 {
        let ep = 1 + u16::try_from(i % 3).unwrap();
        assert!(a.ring.push(PinRecord::new(&FlowKey { flow: flow(i), service: 5 }, ep, 100 + u32::from(ep), FlowState::TcpOpen, 300)));
    }
    until(&mut a.status, "a holds its pins", |s| s.pins_held == 300).await;
    // The same sibling twice, as before and after a restart: each time the
    // whole set, then the marker, then nothing but new pins.
    for round in 0..2 {
        let mut s = TcpStream::connect(a.addr).await.unwrap();
        let mut session = wire::dial(&mut s, KEY, "127.0.0.1:1", wire::VERSION).await.unwrap();
        let mut buf = Vec::new();
        let mut got = std::collections::HashSet::new();
        loop {
            match wire::read_frame(&mut s, &mut session, &mut buf).await.unwrap() {
                Kind::Records => {
                    for c in buf.chunks_exact(RECORD_LEN) {
                        let r = PinRecord::decode(c).unwrap();
                        assert_eq!(r.service, service_tag("web"));
                        assert_eq!(r.incarnation, address_tag(Addr::v4([10, 0, 1, u8::try_from(r.endpoint).unwrap()])));
                        assert!(r.lifetime <= 300 && r.lifetime >= 250, "{r:?}");
                        got.insert(map_key(&r.key()));
                    }
                }
                Kind::InSync => break,
                Kind::Keepalive | Kind::Digests | Kind::DigestsEnd | Kind::Health | Kind::HealthEnd => {}
            }
        }
        assert_eq!(got.len(), 300 + round as usize, "round {round}: the full set (and the pin added after round 0) before the marker");
        let st = until(&mut a.status, "subscribed", |x| x.peers.iter().any(|p| p.address == "127.0.0.1:1" && p.subscribed && p.lag == 0)).await;
        assert_eq!(st.peers.len(), 1, "{st:#?}");
        // A new pin follows.
        assert!(a.ring.push(PinRecord::new(&FlowKey { flow: flow(1000 + round), service: 5 }, 2, 102, FlowState::TcpOpen, 300)));
        loop {
            match wire::read_frame(&mut s, &mut session, &mut buf).await.unwrap() {
                Kind::Records => {
                    assert_eq!(buf.len(), RECORD_LEN);
                    assert_eq!(PinRecord::decode(&buf).unwrap().key().flow, flow(1000 + round));
                    break;
                }
                Kind::Keepalive | Kind::Digests | Kind::DigestsEnd | Kind::Health | Kind::HealthEnd => {}
                Kind::InSync => panic!("one marker per connection"),
            }
        }
        drop(s);
        until(&mut a.status, "unsubscribed", |x| x.peers.is_empty()).await;
    }
    a.stop.cancel();
    a.task.await.unwrap();
}

/// `snapshot(key, inc)` with endpoint 3's weight `w`.
fn weighted(key: u32, inc: u32, w: u32) -> Arc<Snapshot> {
    let s = snapshot(key, inc);
    let endpoints = s.services[0]
        .endpoints()
        .map(|e| EndpointSpec { weight: if e.id == 3 { w } else { 1 }, ..endpoint(e.id, e.incarnation, e.addr) })
        .collect();
    Arc::new(one_service(&web(key, Algorithm::Maglev, true, endpoints)))
}

/// Three siblings, gating on, each numbering its services its own way;
/// one is given another weight: all three see the mismatch, only that
/// one is in the minority and, after the hold, withdraws; given the same
/// weight again, it agrees and withdraws nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_siblings_see_a_table_that_differs_and_only_its_owner_withdraws() {
    let addrs = [free_port(), free_port(), free_port()];
    let mut nodes = Vec::new();
    for (k, a) in addrs.iter().enumerate() {
        let peers = addrs.iter().filter(|p| *p != a).copied().collect();
        let c = SiblingsConfig { gate: true, ..cfg(*a, peers, KEY, 200_000) };
        let key = 5 + u32::try_from(k).unwrap();
        nodes.push(node_with(c, None, snapshot(key, 100 * key)).await);
    }
    for n in &mut nodes {
        let st = until(&mut n.status, "every sibling's digests compared, all agree", |s| s.agreement.siblings_compared == 2).await;
        assert_eq!((st.agreement.services, st.agreement.mismatched), (1, 0), "{st:#?}");
        assert!(st.peers.iter().all(|p| p.digests == Some(1) && p.mismatched == 0), "{st:#?}");
    }
    let changed = Instant::now();
    nodes[2].published.send_replace(Published { snapshot: weighted(7, 700, 3), ..Published::default() });
    for (k, n) in nodes.iter_mut().enumerate() {
        let st = until(&mut n.status, "the mismatch shows", |s| s.agreement.mismatched == 1).await;
        let m = &st.agreement.services_mismatched[0];
        assert_eq!(m.service, "web");
        assert_eq!(m.minority, k == 2, "appliance {k}: {st:#?}");
        assert_eq!((m.differ.len(), m.agree), if k == 2 { (2, 1) } else { (1, 2) }, "{st:#?}");
    }
    let seen = changed.elapsed();
    assert!(seen < Duration::from_secs(1), "seen by all in {seen:?}");
    let g = tokio::time::timeout(WAIT, nodes[2].gated.wait_for(|g| g.contains_key("web"))).await.unwrap().unwrap().clone();
    let withdrawn = changed.elapsed();
    assert!(g["web"].contains("in the minority"), "{g:?}");
    assert!(withdrawn >= agree::GATE_AFTER, "held {withdrawn:?} before withdrawing");
    for n in &nodes[..2] {
        assert!(n.gated.borrow().is_empty(), "the majority withdraws nothing");
    }
    let st = until(&mut nodes[2].status, "withdrawn in the status", |s| s.agreement.withdrawn == 1).await;
    assert!(st.agreement.services_mismatched[0].withdrawn, "{st:#?}");
    // The same weight again: the same table as the others', nothing withdrawn.
    nodes[2].published.send_replace(Published { snapshot: snapshot(7, 700), ..Published::default() });
    tokio::time::timeout(WAIT, nodes[2].gated.wait_for(|g| g.is_empty())).await.unwrap().unwrap();
    for n in &mut nodes {
        until(&mut n.status, "all agree again", |s| s.agreement.mismatched == 0 && s.agreement.siblings_compared == 2).await;
    }
    eprintln!("mismatch seen by all three {seen:?} after the change; withdrawn after {withdrawn:?}");
    for n in nodes {
        n.stop.cancel();
        n.task.await.unwrap();
    }
}

/// An appliance that starts with another table than its two siblings'
/// withdraws the service at once (it never announces it), where one that
/// agreed before waits [`agree::GATE_AFTER`] (above); the siblings keep it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_started_with_another_table_withdraws_at_once() {
    let addrs = [free_port(), free_port(), free_port()];
    let peers = |k: usize| addrs.iter().filter(|p| **p != addrs[k]).copied().collect::<Vec<_>>();
    let mut nodes = Vec::new();
    for (k, a) in addrs.iter().enumerate().take(2) {
        let key = 5 + u32::try_from(k).unwrap();
        nodes.push(node_with(SiblingsConfig { gate: true, ..cfg(*a, peers(k), KEY, 200_000) }, None, snapshot(key, 100 * key)).await);
    }
    for n in &mut nodes {
        until(&mut n.status, "the other sibling's digests compared", |s| s.agreement.siblings_compared == 1).await;
    }
    let started = Instant::now();
    let mut late = node_with(SiblingsConfig { gate: true, ..cfg(addrs[2], peers(2), KEY, 200_000) }, None, weighted(7, 700, 3)).await;
    let st = until(&mut late.status, "both siblings compared", |s| s.agreement.siblings_compared == 2 && s.agreement.minority == 1).await;
    let compared = started.elapsed();
    let g = tokio::time::timeout(WAIT, late.gated.wait_for(|g| g.contains_key("web"))).await.unwrap().unwrap().clone();
    let withdrawn = started.elapsed();
    eprintln!("started with another table: compared {compared:?}, withdrawn {withdrawn:?} after its start ({st:?})");
    assert!(g["web"].contains("in the minority"), "{g:?}");
    assert!(withdrawn < agree::GATE_AFTER, "withdrawn {withdrawn:?} after its start: a new appliance must not wait as for a rollout");
    for n in &nodes {
        assert!(n.gated.borrow().is_empty(), "the majority withdraws nothing");
    }
    nodes.push(late);
    for n in nodes {
        n.stop.cancel();
        n.task.await.unwrap();
    }
}

/// Agreement is a digest equal to a sibling's: winning a tie of two
/// alone, by being newer, is not; a service that never agreed is withdrawn
/// at once when in the minority, one that agreed after [`agree::GATE_AFTER`].
#[test]
fn a_tie_won_by_being_newer_is_not_agreement() {
    let names: HashMap<u32, String> = [(1, "web".to_owned()), (2, "dns".to_owned())].into();
    let m = |service: &str, agree: usize, minority: bool| agree::Mismatch {
        service: service.into(),
        digest: [0; 32],
        differ: vec!["b".into()],
        absent: vec![],
        agree,
        minority,
        largest: Some((1, [1; 32])),
    };
    let mut none = Agreement::default();
    none.note_agreed(&names);
    assert!(none.agreed.is_empty(), "no sibling compared, nothing agreed");
    let mut a = Agreement { compared: 1, mismatched: vec![m("web", 1, false)], ..Agreement::default() };
    a.note_agreed(&names);
    assert_eq!(a.agreed, HashSet::from(["dns".to_owned()]), "web differs from its one sibling and is only the newer: not agreed");
    let now = Instant::now();
    a.mismatched = vec![m("web", 1, true), m("dns", 2, true)];
    a.minority_since = [("web".to_owned(), now), ("dns".to_owned(), now)].into();
    assert_eq!(a.gated(now).into_keys().collect::<Vec<_>>(), ["web"], "never agreed: at once");
    assert_eq!(a.gated(now + agree::GATE_AFTER).len(), 2);
    a.note_agreed(&[(1, "web".to_owned())].into());
    assert!(a.agreed.is_empty(), "a service that left is forgotten");
}

/// Without `siblings.gate` the mismatch shows and nothing is withdrawn;
/// a sibling's set is dropped when its connection ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gate_a_mismatch_only_shows_and_a_lost_sibling_stops_counting() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let mut a = node(a_addr, vec![b_addr], KEY, snapshot(5, 100), 200_000).await;
    let b = node(b_addr, vec![a_addr], KEY, weighted(9, 200, 4), 200_000).await;
    let st = until(&mut a.status, "the mismatch shows", |s| s.agreement.mismatched == 1).await;
    let m = &st.agreement.services_mismatched[0];
    // One against one, at the same time or not: exactly one is in the
    // minority; the status says which.
    assert!(!m.withdrawn && !st.agreement.gate, "{st:#?}");
    assert_eq!(st.peers[0].mismatched, 1, "{st:#?}");
    tokio::time::sleep(agree::GATE_AFTER + Duration::from_millis(300)).await;
    assert!(a.gated.borrow().is_empty(), "nothing withdrawn without the gate");
    b.stop.cancel();
    b.task.await.unwrap();
    let st = until(&mut a.status, "b no longer compared", |s| s.agreement.siblings_compared == 0).await;
    assert_eq!(st.agreement.mismatched, 0, "{st:#?}");
    a.stop.cancel();
    a.task.await.unwrap();
}

/// A sibling of protocol version 1 closes a handshake of version 2: the
/// dialer dials it again with version 1 and takes its pins (no digests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_of_the_previous_version_is_dialled_with_it() {
    use tokio::io::AsyncReadExt;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let old = listener.local_addr().unwrap();
    let tag = service_tag("web");
    let fake = tokio::spawn(async move {
        let mut refused = 0u32;
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut head = [0u8; 5];
            s.read_exact(&mut head).await.unwrap();
            if head[4] != wire::OLDEST {
                // What a listener of version 1 does with another version.
                refused += 1;
                continue;
            }
            let (r, w) = s.into_split();
            let mut s = tokio::io::join(std::io::Cursor::new(head.to_vec()).chain(r), w);
            let (mut session, _, version) = wire::accept(&mut s, KEY).await.unwrap();
            assert_eq!(version, wire::OLDEST);
            wire::write_frame(&mut s, &mut session, Kind::Records, &records(0, 5, tag)).await.unwrap();
            wire::write_frame(&mut s, &mut session, Kind::InSync, &[]).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(WAIT).await;
            return refused;
        }
    });
    let mut b = node(free_port(), vec![old], KEY, snapshot(9, 200), 200_000).await;
    let st = until(&mut b.status, "b took the old sibling's pins", |s| s.pins_synced == 5 && s.peers.iter().all(|p| p.in_sync)).await;
    assert_eq!(st.peers[0].digests, None, "no digests from version 1: {st:#?}");
    assert_eq!(st.agreement.siblings_compared, 0, "{st:#?}");
    b.stop.cancel();
    b.task.await.unwrap();
    fake.abort();
}

/// One appliance's health verdicts reach its sibling in the sibling's
/// terms (its numbering: the same service and endpoint names), end when
/// it clears them, and end when it goes away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_verdicts_cross_to_the_sibling_and_end_with_their_maker() {
    let (a_addr, b_addr) = (free_port(), free_port());
    let wire_up = |c: SiblingsConfig, snap| async move {
        let (own_tx, own_rx) = watch::channel(Ejected::new());
        let (sib_tx, sib_rx) = watch::channel(Ejected::new());
        let ring = Arc::new(SyncRing::new(16));
        let (tx, rx) = watch::channel(Published { snapshot: snap, ..Published::default() });
        let sync = SyncTask::bind(c, vec![ring], Publisher::new(SyncedPins::default()), rx, Instant::now()).await.unwrap().share_health(own_rx, sib_tx);
        let status = sync.status();
        let stop = CancellationToken::new();
        let task = tokio::spawn(sync.run(stop.clone()));
        (own_tx, sib_rx, status, stop, task, tx)
    };
    let (a_own, a_sib, _a_status, a_stop, a_task, _a_pub) = wire_up(cfg(a_addr, vec![b_addr], KEY, 200_000), snapshot(5, 100)).await;
    let (_b_own, mut b_sib, mut b_status, b_stop, b_task, _b_pub) = wire_up(cfg(b_addr, vec![a_addr], KEY, 200_000), snapshot(9, 200)).await;
    until(&mut b_status, "connected both ways", |s| s.peers.iter().any(|p| p.connected && p.subscribed)).await;
    let made = Instant::now();
    a_own.send_replace(BTreeMap::from([("web".to_owned(), std::collections::BTreeSet::from([2, 3])), ("nope".to_owned(), std::collections::BTreeSet::from([1]))]));
    let got = tokio::time::timeout(WAIT, b_sib.wait_for(|e| !e.is_empty())).await.unwrap().unwrap().clone();
    let took = made.elapsed();
    assert_eq!(got, BTreeMap::from([("web".to_owned(), std::collections::BTreeSet::from([2, 3]))]), "the service b does not have is left out");
    let st = until(&mut b_status, "in b's status", |s| s.health_from_siblings.len() == 2).await;
    assert_eq!(st.health_from_siblings, ["web/2", "web/3"]);
    assert!(a_sib.borrow().is_empty(), "b has no verdict of its own: a takes nothing back");
    a_own.send_replace(BTreeMap::from([("web".to_owned(), std::collections::BTreeSet::from([3]))]));
    tokio::time::timeout(WAIT, b_sib.wait_for(|e| e.get("web").is_some_and(|ids| ids.len() == 1))).await.unwrap().unwrap();
    // a goes: its verdicts no longer count.
    a_stop.cancel();
    a_task.await.unwrap();
    tokio::time::timeout(WAIT, b_sib.wait_for(BTreeMap::is_empty)).await.unwrap().unwrap();
    eprintln!("a verdict reached the sibling in {took:?}");
    b_stop.cancel();
    b_task.await.unwrap();
}
