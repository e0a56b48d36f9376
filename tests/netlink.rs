//! `sluice::routing` against a real kernel: a veth pair between two network
//! namespaces, `configure_interface` and `link_counters` on one end, and
//! the neighbour reconciler resolving, following and forgetting the other
//! end's MAC.
//!
//! The routing functions talk to the namespace of the thread that opens
//! their netlink sockets, so the test body runs on a thread that enters
//! namespace "a" (`setns` through nix's safe wrapper: it changes that
//! thread only) and drives a current-thread tokio runtime there, so every
//! socket, also ones the reconciler reopens, lives in "a". Commands that
//! check the result run through `ip netns exec` as usual.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test: failing loudly is the point

use std::fs::File;
use std::future::Future;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};
use serde_json::Value;
use sluice::routing::{self, Neighbours, RoutingError};
use sluice_dataplane::addr::Addr;
use sluice_tests::{privileged, veth, Netns};
use tokio::sync::watch;

const MAC_A: [u8; 6] = [0x02, 0x5e, 0x00, 0x00, 0x00, 0x0a];
const MAC_B2: &str = "02:5e:00:00:00:b2";

fn json(ns: &Netns, cmd: &[&str]) -> Value {
    let out = ns.run(cmd);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn link(ns: &Netns, dev: &str) -> Value {
    json(ns, &["ip", "-j", "-s", "link", "show", "dev", dev])[0].clone()
}

fn mac_of(ns: &Netns, dev: &str) -> [u8; 6] {
    let s = link(ns, dev)["address"].as_str().unwrap().to_owned();
    let b: Vec<u8> = s.split(':').map(|p| u8::from_str_radix(p, 16).unwrap()).collect();
    b.try_into().unwrap()
}

/// `(local, prefixlen, nodad)` of each address on `dev`.
fn addrs(ns: &Netns, dev: &str) -> Vec<(String, u64, bool)> {
    let v = json(ns, &["ip", "-j", "addr", "show", "dev", dev]);
    v[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["local"].as_str().unwrap().to_owned(),
                a["prefixlen"].as_u64().unwrap(),
                a["nodad"].as_bool() == Some(true),
            )
        })
        .collect()
}

/// Addresses of the managed neighbour entries on `dev`.
fn managed(ns: &Netns, dev: &str) -> Vec<String> {
    let v = json(ns, &["ip", "-j", "-d", "neigh", "show", "dev", dev]);
    v.as_array()
        .unwrap()
        .iter()
        .filter(|n| n.get("managed").is_some())
        .map(|n| n["dst"].as_str().unwrap().to_owned())
        .collect()
}

/// Runs `fut` to its end on a thread of its own inside `ns` (the test's
/// other threads stay where they are).
fn inside<F: Future + Send>(ns: &Netns, fut: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(format!("/run/netns/{}", ns.name)).unwrap();
            setns(&file, CloneFlags::CLONE_NEWNET).unwrap();
            tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(fut)
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

fn addr(s: &str) -> Addr {
    s.parse::<IpAddr>().unwrap().into()
}

/// Waits (bounded) until the published map satisfies `f`; returns the time
/// since `start`.
async fn published(
    rx: &mut watch::Receiver<routing::NeighMap>,
    start: Instant,
    what: &str,
    f: impl FnMut(&routing::NeighMap) -> bool,
) -> Duration {
    let outcome = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(f)).await.map(|r| r.is_ok());
    match outcome {
        Ok(true) => start.elapsed(),
        Ok(false) => panic!("{what}: the reconciler stopped"),
        Err(_) => panic!("{what}: not published within 30 s; map is {:?}", *rx.borrow()),
    }
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn routing_over_a_veth_pair() {
    privileged();
    let pid = std::process::id();
    let a = Netns::new("nla");
    let b = Netns::new("nlb");
    let (ia, ib) = (format!("snl{pid}a"), format!("snl{pid}b"));
    veth(&a, &ia, &b, &ib);
    b.run(&["ip", "addr", "add", "10.77.0.2/24", "dev", &ib]);
    b.run(&["ip", "addr", "add", "fd00:77::2/64", "dev", &ib, "nodad"]);
    // The peer announces a MAC change (gratuitous ARP, unsolicited NA), as
    // a host taking over an address does.
    b.sysctl(&format!("net.ipv4.conf.{ib}.arp_notify"), "1");
    b.sysctl(&format!("net.ipv6.conf.{ib}.ndisc_notify"), "1");
    // Fast neighbour timers on "a", so that a vanished peer turns FAILED
    // within seconds instead of a minute. (The kernel re-probes managed
    // entries on a global timer, the initial namespace's
    // neigh.default.interval_probe_time_ms, 5 s, which this test leaves
    // alone.)
    for fam in ["ipv4", "ipv6"] {
        a.sysctl(&format!("net.{fam}.neigh.{ia}.base_reachable_time_ms"), "500");
        a.sysctl(&format!("net.{fam}.neigh.{ia}.delay_first_probe_time"), "1");
        a.sysctl(&format!("net.{fam}.neigh.{ia}.retrans_time_ms"), "200");
    }

    inside(&a, body(&a, &b, &ia, &ib));
}

async fn body(a: &Netns, b: &Netns, ia: &str, ib: &str) {
    let h = routing::connect().unwrap();

    // configure_interface: MAC, MTU, up, exactly these addresses.
    a.run(&["ip", "link", "set", "dev", ia, "down"]);
    a.run(&["ip", "addr", "add", "10.99.0.1/24", "dev", ia]);
    let want = [("10.77.0.1".parse().unwrap(), 24), ("fd00:77::1".parse().unwrap(), 64)];
    routing::configure_interface(&h, ia, MAC_A, 1400, 5000, &want).await.unwrap();
    let l = link(a, ia);
    assert_eq!(l["txqlen"], 5000, "the transmit queue holds a probe per next hop");
    assert_eq!(l["address"], "02:5e:00:00:00:0a");
    assert_eq!(l["mtu"], 1400);
    assert!(l["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{l}");
    let dad = a.run(&["cat", &format!("/proc/sys/net/ipv6/conf/{ia}/accept_dad")]).stdout;
    assert_eq!(String::from_utf8_lossy(&dad).trim(), "0");
    let mut got: Vec<_> = addrs(a, ia).into_iter().filter(|(ip, _, _)| !ip.starts_with("fe80:")).collect();
    got.sort();
    assert_eq!(got, vec![("10.77.0.1".into(), 24, false), ("fd00:77::1".into(), 64, true)]);
    // A second call changes nothing, and does not bounce the link.
    let carrier_changes = || a.run(&["cat", &format!("/sys/class/net/{ia}/carrier_changes")]).stdout;
    let changes = carrier_changes();
    routing::configure_interface(&h, ia, MAC_A, 1400, 5000, &want).await.unwrap();
    assert_eq!(carrier_changes(), changes);
    let mut again: Vec<_> = addrs(a, ia).into_iter().filter(|(ip, _, _)| !ip.starts_with("fe80:")).collect();
    again.sort();
    assert_eq!(again, got);
    let missing = routing::configure_interface(&h, "snl-none", MAC_A, 1400, 5000, &want).await;
    assert!(matches!(missing, Err(RoutingError::NoInterface { .. })), "{missing:?}");

    // link_counters: pings show up on both directions.
    let before = routing::link_counters(&h, ia).await.unwrap();
    a.run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.77.0.2"]);
    let after = routing::link_counters(&h, ia).await.unwrap();
    assert!(after.tx_packets >= before.tx_packets + 3, "{before:?} -> {after:?}");
    assert!(after.rx_packets >= before.rx_packets + 3, "{before:?} -> {after:?}");
    assert!(after.rx_bytes >= before.rx_bytes + 3 * 98, "{before:?} -> {after:?}");
    assert!(after.tx_bytes > before.tx_bytes);
    assert!(matches!(routing::link_counters(&h, "snl-none").await, Err(RoutingError::NoInterface { .. })));

    // Neighbours: start from an empty table, so that resolution is real.
    a.run(&["ip", "neigh", "flush", "dev", ia]);
    let (peer4, peer6) = (addr("10.77.0.2"), addr("fd00:77::2"));
    let mac_b = mac_of(b, ib);
    let (n, mut rx) = Neighbours::spawn(vec![String::new(), ia.to_owned()]).unwrap();
    // A next hop of port 0 (no kernel interface) and one of a port that
    // does not exist are ignored.
    let start = Instant::now();
    n.want(&[(1, peer4), (1, peer6), (0, addr("10.77.0.3")), (5, addr("10.77.0.4"))]);
    let took4 = published(&mut rx, start, "IPv4 resolution", |m| m.get(&(1, peer4)) == Some(&mac_b)).await;
    let took6 = published(&mut rx, start, "IPv6 resolution", |m| m.get(&(1, peer6)) == Some(&mac_b)).await;
    eprintln!("from want(): IPv4 next hop published after {took4:?}, IPv6 after {took6:?}");
    assert_eq!(rx.borrow().len(), 2);
    let mut m = managed(a, ia);
    m.sort();
    assert_eq!(m, vec!["10.77.0.2".to_owned(), "fd00:77::2".to_owned()]);

    // The peer changes its MAC and announces it. A gratuitous ARP
    // overrides the entry however recently it was updated (the kernel's
    // ARP locktime holds back other replies only, `arp_is_garp`), and an
    // unsolicited NA with the override flag has no locktime: there is no
    // timer to wait out first. Were an announcement ignored, the entry
    // would still be probed again and follow within the wait below.
    let start = Instant::now();
    b.run(&["ip", "link", "set", "dev", ib, "address", MAC_B2]);
    let new_mac = mac_of(b, ib);
    assert_ne!(new_mac, mac_b);
    let took = published(&mut rx, start, "MAC change", |m| {
        m.get(&(1, peer4)) == Some(&new_mac) && m.get(&(1, peer6)) == Some(&new_mac)
    })
    .await;
    eprintln!("from `ip link set address` starting: new MAC published after {took:?}");

    // Wanting less deletes the managed entry that is no longer wanted.
    n.want(&[(1, peer4)]);
    n.settle().await.unwrap();
    assert_eq!(managed(a, ia), vec!["10.77.0.2".to_owned()]);
    assert!(!rx.borrow().contains_key(&(1, peer6)));
    n.want(&[(1, peer4), (1, peer6)]);
    published(&mut rx, Instant::now(), "re-resolution", |m| m.len() == 2).await;

    // The peer's addresses go away: both next hops turn unresolved.
    let start = Instant::now();
    b.run(&["ip", "addr", "flush", "dev", ib]);
    let took = published(&mut rx, start, "failure", routing::NeighMap::is_empty).await;
    eprintln!("vanished peer unpublished after {took:?} (kernel probe timers)");
    let mut m = managed(a, ia);
    m.sort();
    assert_eq!(m, vec!["10.77.0.2".to_owned(), "fd00:77::2".to_owned()], "managed entries stay while unresolved");

    // The interface is deleted and created again under a new index (a
    // restarted tap): the reconciler follows it and resolves again (on the
    // kernel's schedule: entries wanted while the link is down are probed
    // again by its managed-entry timer).
    let start = Instant::now();
    a.run(&["ip", "link", "del", "dev", ia]);
    veth(a, ia, b, ib);
    b.run(&["ip", "addr", "add", "10.77.0.2/24", "dev", ib]);
    b.run(&["ip", "addr", "add", "fd00:77::2/64", "dev", ib, "nodad"]);
    routing::configure_interface(&h, ia, MAC_A, 1400, 1000, &want).await.unwrap();
    let mac_b = mac_of(b, ib);
    let took = published(&mut rx, start, "resolution on the new interface", |m| {
        m.get(&(1, peer4)) == Some(&mac_b) && m.get(&(1, peer6)) == Some(&mac_b)
    })
    .await;
    eprintln!("from deleting the interface: resolved again on the new one after {took:?}");
    let mut m = managed(a, ia);
    m.sort();
    assert_eq!(m, vec!["10.77.0.2".to_owned(), "fd00:77::2".to_owned()]);

    // clear() removes every managed entry before returning.
    n.clear().await.unwrap();
    assert!(managed(a, ia).is_empty(), "{:?}", managed(a, ia));
    assert!(rx.borrow().is_empty());
    drop(n);
}

/// The host's `net.ipv4.neigh.default.gc_thresh3`, read from the initial
/// network namespace (the test's main thread): namespaces have no copy.
fn host_neighbour_limit() -> usize {
    std::fs::read_to_string("/proc/sys/net/ipv4/neigh/default/gc_thresh3").unwrap().trim().parse().unwrap()
}

/// More next hops than the kernel's neighbour table limit (`gc_thresh3`,
/// one for the whole host) all resolve: the entries Sluice asks for are
/// outside the count that limit caps, and the limit is left as it is.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn next_hops_beyond_the_hosts_neighbour_table_limit_all_resolve() {
    privileged();
    let limit = host_neighbour_limit();
    assert!(limit <= 65_536, "gc_thresh3 = {limit}: the test adds 1000 entries more than that, too many above 65,536");
    let (resolved, _) = resolve_and_clear("ng", limit + 1000, Duration::from_secs(60));
    eprintln!("{} next hops (gc_thresh3 = {limit}) resolved in {resolved:?}", limit + 1000);
    assert_eq!(host_neighbour_limit(), limit, "the host's limit is left alone");
}

/// 100,000 next hops resolve and are removed again, on a runtime of one
/// thread (the task's socket is read only when the task waits): their
/// notifications overrun a socket's buffer many times over, which must
/// cost a table dump, not a request left waiting for an answer the kernel
/// dropped with them.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_hundred_thousand_next_hops_resolve_and_clear_despite_lost_notifications() {
    privileged();
    let (resolved, cleared) = resolve_and_clear("nh", 100_000, Duration::from_secs(60));
    eprintln!("100000 next hops resolved in {resolved:?}, cleared in {cleared:?}");
}

/// `hops` next hops on a veth whose peer answers ARP for all of them:
/// every one is published with the peer's MAC within `within`, then
/// `clear()` removes every managed entry within `within`. Returns both times.
fn resolve_and_clear(tag: &str, hops: usize, within: Duration) -> (Duration, Duration) {
    assert!(hops < 1 << 17, "{hops} next hops: the peer answers for 10.82.0.0/15 only");
    let pid = std::process::id();
    let a = Netns::new(&format!("{tag}a"));
    let b = Netns::new(&format!("{tag}b"));
    let (ia, ib) = (format!("s{tag}{pid}a"), format!("s{tag}{pid}b"));
    veth(&a, &ia, &b, &ib);
    a.run(&["ip", "addr", "add", "10.80.0.1/14", "dev", &ia]);
    b.run(&["ip", "addr", "add", "10.80.0.2/14", "dev", &ib]);
    // "b" answers ARP for every address of 10.82.0.0/15.
    b.run(&["ip", "route", "add", "local", "10.82.0.0/15", "dev", "lo", "table", "main"]);
    let hop = |i: usize| {
        let i = u32::try_from(i).unwrap();
        Addr::from(std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 82, 0, 1)) + i))
    };
    let mut times = (Duration::ZERO, Duration::ZERO);
    inside(&a, async {
        let mac_b = mac_of(&b, &ib);
        let (n, mut rx) = Neighbours::spawn(vec![ia.clone()]).unwrap();
        let wanted: Vec<(u8, Addr)> = (0..hops).map(|i| (0, hop(i))).collect();
        let start = Instant::now();
        n.want(&wanted);
        let outcome = tokio::time::timeout(within, rx.wait_for(|m| m.len() == hops)).await.map(|r| r.is_ok());
        let resolved = rx.borrow().len();
        assert_eq!(outcome, Ok(true), "{resolved} of {hops} next hops resolved within {within:?}");
        times.0 = start.elapsed();
        assert!(rx.borrow().values().all(|m| *m == mac_b));
        let start = Instant::now();
        let cleared = tokio::time::timeout(within, n.clear()).await;
        assert!(matches!(cleared, Ok(Ok(()))), "clear() within {within:?}: {cleared:?}");
        times.1 = start.elapsed();
        let left = managed(&a, &ia);
        assert!(left.is_empty(), "{} managed entries left, the first {:?}", left.len(), left.first());
        drop(n);
    });
    times
}

/// The stop's way out of 100,000 unanswered next hops: the neighbour task
/// is stopped where it is and the interface taken down, one request, and
/// the kernel has dropped every managed entry of it (deleting them one by
/// one takes seconds while the kernel keeps probing them). Nothing answers
/// ARP on the other end, so every entry stays INCOMPLETE and is re-probed.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn unanswered_next_hops_go_with_their_interface_taken_down() {
    privileged();
    let pid = std::process::id();
    let a = Netns::new("nda");
    let b = Netns::new("ndb");
    let (ia, ib) = (format!("snd{pid}a"), format!("snd{pid}b"));
    veth(&a, &ia, &b, &ib);
    a.run(&["ip", "addr", "add", "10.84.0.1/14", "dev", &ia]);
    let hops = 100_000u32;
    let first = u32::from(std::net::Ipv4Addr::new(10, 85, 0, 1));
    inside(&a, async {
        let (n, _rx) = Neighbours::spawn(vec![ia.clone()]).unwrap();
        let wanted: Vec<(u8, Addr)> = (0..hops).map(|i| (0, Addr::from(std::net::Ipv4Addr::from(first + i)))).collect();
        n.want(&wanted);
        // Bounded: until the kernel holds a good share of them.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut held = 0;
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            held = managed(&a, &ia).len();
            if held >= 20_000 {
                break;
            }
        }
        assert!(held >= 20_000, "only {held} managed entries after 60 s");
        let start = Instant::now();
        n.stop();
        let h = routing::connect().unwrap();
        routing::take_down(&h, &ia).await.unwrap();
        let took = start.elapsed();
        let left = managed(&a, &ia);
        eprintln!("{held}+ managed entries, all INCOMPLETE: the interface taken down in {took:?}, {} left", left.len());
        assert!(left.is_empty(), "{} managed entries left after the interface went down, the first {:?}", left.len(), left.first());
        assert!(took < Duration::from_secs(2), "taking the interface down took {took:?}");
        // An interface that is gone already is no failure.
        let gone = format!("snd{pid}x");
        routing::take_down(&h, &gone).await.unwrap();
    });
}

/// An exception interface is a DPDK tap: a multiqueue tap with 256
/// transmit queues. Giving it a transmit queue for the default capacity
/// (65,536 next hops) must not hold the kernel's routing lock (rtnl, one
/// for the whole host) for long: every routing daemon on the host, BIRD
/// included, waits on it meanwhile, and BFD sessions at 100 ms x 3 go
/// down. With the default queueing discipline (a pfifo_fast of three rings
/// per transmit queue) the kernel allocates and clears 400 MB for it, the
/// lock held throughout.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_tap_gets_its_exception_queue_without_holding_the_routing_lock_for_long() {
    privileged();
    let pid = std::process::id();
    let a = Netns::new("nqa");
    let tap = format!("snq{pid}");
    a.run(&["ip", "tuntap", "add", "dev", &tap, "mode", "tap", "multi_queue"]);
    // Up, as DPDK leaves it.
    a.run(&["ip", "link", "set", &tap, "up"]);
    let details = json(&a, &["ip", "-j", "-d", "link", "show", "dev", &tap]);
    assert_eq!(details[0]["num_tx_queues"], 256, "{details}");
    let queue = routing::exception_queue_len(65_536);
    let took = inside(&a, async {
        let h = routing::connect().unwrap();
        let start = Instant::now();
        routing::configure_interface(&h, &tap, MAC_A, 1500, queue, &[]).await.unwrap();
        start.elapsed()
    });
    let l = link(&a, &tap);
    eprintln!("a tap's transmit queue raised to {queue} frames in {took:?}: {l}");
    assert!(l["txqlen"].as_u64().unwrap() >= u64::from(queue), "{l}");
    assert!(took < Duration::from_millis(500), "configuring the interface took {took:?} (the routing lock held throughout)");
}
