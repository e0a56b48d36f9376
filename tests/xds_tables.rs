//! Two `sluice run` processes fed by one management server, each through its
//! own history of updates (endpoints added in opposite orders, clusters
//! arriving at different times, removals in between), end with the same
//! clusters and must then pick the same endpoint for every slot of every
//! table: ECMP across appliances is safe. Compared from what the admin
//! endpoint shows operators (`/tables`: per service, the SHA-256 of the
//! endpoint address of every slot, and the slots per endpoint), and one
//! flow explained by both (`/explain`).
//!
//! And from outside the appliances, in the first test: new flows to every
//! VIP, sent to each appliance's port `a` (an af_packet port on a veth
//! pair in a namespace of the test's own), leave it IP-in-IP towards the
//! gateway, captured on the pair's other end: each flow goes to the
//! endpoint its appliance's `/explain` names, and to the same endpoint from
//! both. A data plane forwarding with another table than the one reported
//! (a stale one of the right size, say) fails there.
//!
//! Endpoints behind a gateway with a static MAC (IP-in-IP delivery), the
//! server on loopback; ports on `net_null` except that af_packet port.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};
use serde_json::{json, Value};
use sluice_dataplane::craft;
use sluice_dataplane::parse::{ethertype, proto};
use sluice_tests::topology::tempdir;
use sluice_tests::{pcap, privileged, sluice_bin, tool_bin, veth, wait_until, Netns, Proc, Tcpdump};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` from the admin endpoint at `port`: the status line and the body.
fn answer(port: u16, path: &str) -> Option<(String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let (head, body) = buf.split_once("\r\n\r\n")?;
    let chunked = head.lines().any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked");
    let body = if chunked { dechunk(body)? } else { body.to_owned() };
    Some((head.lines().next().unwrap_or("").to_owned(), body))
}

/// The body of a chunked answer (the admin endpoint streams `/tables`).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let n = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.push_str(after.get(..n)?);
        rest = after.get(n..)?.strip_prefix("\r\n")?;
    }
}

/// GET `path` from the admin endpoint at `port`: the body, if 200.
fn get(port: u16, path: &str) -> Option<String> {
    answer(port, path).and_then(|(status, body)| status.starts_with("HTTP/1.1 200").then_some(body))
}

/// The status line the admin endpoint answers `path` with.
fn status_line(port: u16, path: &str) -> String {
    answer(port, path).map(|(status, _)| status).unwrap_or_default()
}

fn json_at(port: u16, path: &str) -> Value {
    get(port, path).and_then(|b| serde_json::from_str(&b).ok()).unwrap_or(Value::Null)
}

/// One service's cluster: name, VIP, policy.
fn cluster(name: &str, vip: &str, policy: &str) -> Value {
    json!({
        "name": name, "type": "EDS", "lb_policy": policy,
        "eds_cluster_config": {"service_name": name},
        "metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": vip, "port": 80, "protocol": "TCP", "delivery": "ipip", "endpointLimit": 64}}}
    })
}

/// An assignment with `(address, weight)` endpoints, in the order given.
fn cla(name: &str, eps: &[(String, u32)]) -> Value {
    let lb: Vec<Value> = eps
        .iter()
        .map(|(a, w)| json!({"endpoint": {"address": {"socket_address": {"address": a, "port_value": 80}}}, "load_balancing_weight": w}))
        .collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]})
}

fn v4(n: usize) -> Vec<(String, u32)> {
    (1..=n).map(|i| (format!("10.50.{}.{}", i / 200, i % 200 + 1), 1 + u32::try_from(i % 3).unwrap())).collect()
}

fn v6(n: usize) -> Vec<(String, u32)> {
    (1..=n).map(|i| (format!("2001:db8:50::{i:x}"), 1)).collect()
}

/// The final state: the same for both appliances.
fn final_state() -> (Vec<Value>, Vec<Value>) {
    (
        vec![cluster("alpha", "20.0.0.1", "MAGLEV"), cluster("beta", "2001:db8:20::1", "MAGLEV"), cluster("gamma", "20.0.0.3", "MAGLEV")],
        vec![cla("alpha", &v4(40)), cla("beta", &v6(17)), cla("gamma", &v4(5))],
    )
}

/// Appliance `a` gets the final state at once; `b` gets there in steps:
/// the endpoints in reverse order, a few at a time, with others present and
/// then removed, and its clusters one after the other.
fn steps() -> Vec<(Vec<Value>, Vec<Value>)> {
    let mut alpha = v4(40);
    alpha.reverse();
    let mut beta = v6(17);
    beta.reverse();
    let mut gamma = v4(5);
    gamma.reverse();
    let extra: Vec<(String, u32)> = (1..=6).map(|i| (format!("10.60.0.{i}"), 2)).collect();
    let with_extra = |mut v: Vec<(String, u32)>| {
        v.splice(0..0, extra.clone());
        v
    };
    let (clusters, assignments) = final_state();
    vec![
        (vec![cluster("gamma", "20.0.0.3", "MAGLEV")], vec![cla("gamma", &with_extra(gamma[..2].to_vec()))]),
        (
            vec![cluster("gamma", "20.0.0.3", "MAGLEV"), cluster("alpha", "20.0.0.1", "MAGLEV")],
            vec![cla("gamma", &with_extra(gamma.clone())), cla("alpha", &alpha[..13])],
        ),
        (
            clusters.clone(),
            vec![cla("gamma", &gamma), cla("alpha", &with_extra(alpha[..29].to_vec())), cla("beta", &beta[..9])],
        ),
        (clusters.clone(), vec![cla("gamma", &gamma), cla("alpha", &alpha), cla("beta", &beta)]),
        (clusters, assignments),
    ]
}

fn write_resources(path: &Path, version: usize, b: &(Vec<Value>, Vec<Value>)) {
    let (fc, fa) = final_state();
    let doc = json!({
        "nodes": {
            "a": {"version": "1", "clusters": fc, "assignments": fa},
            "b": {"version": format!("{version}"), "clusters": b.0, "assignments": b.1},
        }
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn config(dir: &Path, tag: &str, admin: u16, xds: u16, mode: &str) -> PathBuf {
    config_on(dir, tag, admin, xds, mode, "net_null0")
}

/// [`config`] with port `a` (where flows come in, and leave IP-in-IP for
/// the gateway) on `device`.
fn config_on(dir: &Path, tag: &str, admin: u16, xds: u16, mode: &str, device: &str) -> PathBuf {
    let pid = std::process::id();
    let text = format!(
        r#"
dpdk: {{lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: xt{pid}{tag}, mbufs: 2047, descriptors: 256}}
ports:
  - {{name: a, device: "{device}", addresses: [10.1.0.1/24, "2001:db8:1::1/64"], kernelInterface: ""}}
  - {{name: b, device: net_null1, addresses: [10.2.0.1/24], kernelInterface: ""}}
gateways:
  - {{address: 10.1.0.254, port: a, mac: "{GATEWAY_MAC}"}}
  - {{address: "2001:db8:1::fe", port: a, mac: "{GATEWAY_MAC}"}}
admin: {{listen: "127.0.0.1:{admin}"}}
xds-control-plane:
  enabled: true
  server-address: "127.0.0.1:{xds}"
  node-id: {tag}
  mode: {mode}
"#
    );
    let p = dir.join(format!("{tag}.yaml"));
    std::fs::write(&p, text).unwrap();
    p
}

/// The tables as an appliance shows them, keyed by service.
fn tables(port: u16) -> Value {
    json_at(port, "/tables")
}

/// The gateway's MAC: where the appliances send IP-in-IP frames.
const GATEWAY_MAC: &str = "02:00:00:00:01:fe";

/// The MAC of the veth end an appliance's port `a` opens: new flows are
/// sent to it.
const PORT_MAC: [u8; 6] = [0x02, 0x5a, 0, 0, 0, 0x0a];

/// Runs `f` on a thread that joined namespace `ns`: the sockets it opens
/// and the processes it starts are in there.
fn in_netns<T: Send>(ns: &Netns, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            let file = File::open(format!("/run/netns/{}", ns.name)).unwrap();
            setns(&file, CloneFlags::CLONE_NEWNET).unwrap();
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A new flow: its VIP and source port (the source address is fixed).
type FlowKey = (IpAddr, u16);

const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x99, 0, 0, 0, 0, 7);

/// The first packet (a SYN) of new TCP flows to port 80 of each VIP:
/// alpha's 160, gamma's 40, beta's (IPv6) 100.
fn flows() -> Vec<(FlowKey, Vec<u8>)> {
    let src_mac = [0x02, 0x5a, 0, 0, 0, 0x01];
    let mut v = Vec::new();
    for (vip, n) in [("20.0.0.1", 160u16), ("20.0.0.3", 40), ("2001:db8:20::1", 100)] {
        let vip: IpAddr = vip.parse().unwrap();
        for sport in 20_000..20_000 + n {
            let syn = craft::tcp(sport, 80, 0x02, b"");
            let frame = match vip {
                IpAddr::V4(d) => {
                    let ip = craft::with_l4_checksum(craft::ipv4(CLIENT4.octets(), d.octets(), proto::TCP, &syn), 20);
                    craft::ether_with(PORT_MAC, src_mac, &[], ethertype::IPV4, &ip)
                }
                IpAddr::V6(d) => {
                    let ip = craft::with_l4_checksum(craft::ipv6(CLIENT6.octets(), d.octets(), proto::TCP, &syn), 40);
                    craft::ether_with(PORT_MAC, src_mac, &[], ethertype::IPV6, &ip)
                }
            };
            v.push(((vip, sport), frame));
        }
    }
    v
}

/// Sends the frames of a pcap file out of an interface, a few at a time
/// (the appliance's receive ring is not the subject here); prints how many.
const REPLAY: &str = r#"
import socket, struct, sys, time
data = open(sys.argv[2], "rb").read()
order = "<" if data[:4] == b"\xd4\xc3\xb2\xa1" else ">"
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
at, n = 24, 0
while at + 16 <= len(data):
    size = struct.unpack(order + "I", data[at + 8:at + 12])[0]
    s.send(data[at + 16:at + 16 + size])
    at, n = at + 16 + size, n + 1
    if n % 16 == 0:
        time.sleep(0.002)
print(n)
"#;

/// What an appliance sent towards the gateway, read off the wire: for each
/// flow, the outer destination of its IP-in-IP frame (the endpoint), and
/// the frames that were not IP-in-IP.
fn delivered(frames: &[Vec<u8>]) -> (BTreeMap<FlowKey, Vec<IpAddr>>, usize) {
    let (mut out, mut other) = (BTreeMap::<FlowKey, Vec<IpAddr>>::new(), 0);
    for f in frames {
        let Some((outer, inner)) = ipip(f) else {
            other += 1;
            continue;
        };
        let (dst, l4) = match inner.first().map(|b| b >> 4) {
            Some(4) if inner.len() >= 24 => (IpAddr::from(<[u8; 4]>::try_from(&inner[16..20]).unwrap()), &inner[usize::from(inner[0] & 0xf) * 4..]),
            Some(6) if inner.len() >= 44 => (IpAddr::from(<[u8; 16]>::try_from(&inner[24..40]).unwrap()), &inner[40..]),
            _ => {
                other += 1;
                continue;
            }
        };
        let sport = u16::from_be_bytes([l4[0], l4[1]]);
        out.entry((dst, sport)).or_default().push(outer);
    }
    (out, other)
}

/// The outer destination and the inner packet of an IP-in-IP frame
/// (IPv4 or IPv6 outside, either inside).
fn ipip(f: &[u8]) -> Option<(IpAddr, &[u8])> {
    match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
        ethertype::IPV4 if matches!(f.get(23), Some(4 | 41)) => {
            let ihl = usize::from(f[14] & 0xf) * 4;
            Some((IpAddr::from(<[u8; 4]>::try_from(f.get(30..34)?).ok()?), f.get(14 + ihl..)?))
        }
        ethertype::IPV6 if matches!(f.get(20), Some(4 | 41)) => Some((IpAddr::from(<[u8; 16]>::try_from(f.get(38..54)?).ok()?), f.get(54..)?)),
        _ => None,
    }
}

/// The endpoint address the appliance at admin port `port` says a new
/// flow gets (`/explain`).
fn explained(port: u16, (vip, sport): FlowKey) -> Option<IpAddr> {
    // Brackets and colons percent-encoded: an IPv6 `[address]:port`.
    let enc = |a: std::net::SocketAddr| a.to_string().replace('[', "%5B").replace(']', "%5D").replace(':', "%3A");
    let src = match vip {
        IpAddr::V4(_) => std::net::SocketAddr::new(CLIENT4.into(), sport),
        IpAddr::V6(_) => std::net::SocketAddr::new(CLIENT6.into(), sport),
    };
    let q = format!("/explain?proto=tcp&src={}&dst={}", enc(src), enc(std::net::SocketAddr::new(vip, 80)));
    json_at(port, &q)["endpoint"][1].as_str()?.parse().ok()
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn two_appliances_pick_the_same_endpoint_for_every_slot_whatever_the_order() {
    privileged();
    // A namespace of the test's own (everything runs in there): each
    // appliance's port `a` on one end of a veth pair, whose other end
    // sends the flows and captures what comes out.
    let ns = Netns::new("xdstables");
    ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    let port_mac = PORT_MAC.map(|b| format!("{b:02x}")).join(":");
    for t in ["a", "b"] {
        veth(&ns, &format!("xt{t}0"), &ns, &format!("xt{t}1"));
        ns.run(&["ip", "link", "set", "dev", &format!("xt{t}0"), "address", &port_mac]);
    }
    in_netns(&ns, || same_tables_and_same_forwarding(&ns));
}

fn same_tables_and_same_forwarding(ns: &Netns) {
    let dir = tempdir(&format!("xds-tables-{}", std::process::id()));
    let resources = dir.join("resources.json");
    let steps = steps();
    write_resources(&resources, 1, &steps[0]);
    let xds = free_port();
    let _server = Proc::spawn(&[
        tool_bin("sluice-xds-server").to_str().unwrap(),
        "--listen",
        &format!("127.0.0.1:{xds}"),
        "--file",
        resources.to_str().unwrap(),
    ]);
    let (pa, pb) = (free_port(), free_port());
    let bin = sluice_bin();
    let cfg_a = config_on(&dir, "a", pa, xds, "sotw", "net_af_packet0,iface=xta0");
    let cfg_b = config_on(&dir, "b", pb, xds, "delta", "net_af_packet0,iface=xtb0");
    let mut a = Proc::spawn(&[bin.to_str().unwrap(), "run", "--config", cfg_a.to_str().unwrap()]);
    let mut b = Proc::spawn(&[bin.to_str().unwrap(), "run", "--config", cfg_b.to_str().unwrap()]);
    let mut fail = |what: String| -> ! {
        let (ca, oa, ea) = a.stop("INT", Duration::from_secs(10));
        let (cb, ob, eb) = b.stop("INT", Duration::from_secs(10));
        panic!("{what}\na (exit {ca:?}):\n{oa}\n{ea}\nb (exit {cb:?}):\n{ob}\n{eb}");
    };

    // b walks through its history, each step applied before the next.
    let services_of = |port: u16| json_at(port, "/status")["xds"]["services"].as_u64();
    let endpoints_of = |port: u16| json_at(port, "/status")["xds"]["endpoints"].as_u64();
    for (i, step) in steps.iter().enumerate() {
        write_resources(&resources, i + 1, step);
        let want_eps: usize = step.1.iter().map(|c| c["endpoints"][0]["lb_endpoints"].as_array().unwrap().len()).sum();
        let ok = wait_until(Duration::from_secs(30), || {
            services_of(pb) == Some(step.0.len() as u64) && endpoints_of(pb) == Some(want_eps as u64)
        });
        if !ok {
            fail(format!("b did not apply step {}: {}", i + 1, json_at(pb, "/status")["xds"]));
        }
    }
    if !wait_until(Duration::from_secs(30), || services_of(pa) == Some(3) && endpoints_of(pa) == Some(62)) {
        fail(format!("a did not apply the final state: {}", json_at(pa, "/status")["xds"]));
    }

    let (ta, tb) = (tables(pa), tables(pb));
    let list = ta.as_array().unwrap_or_else(|| fail(format!("no tables from a: {ta}")));
    assert_eq!(list.len(), 3, "{ta}");
    for t in list {
        assert!(t["size"].as_u64().unwrap() >= 251, "a table was built: {t}");
    }
    assert_eq!(ta, tb, "both appliances have the same tables (digest of every slot's endpoint address)");
    // Whole dumps too, run by run.
    for svc in ["alpha", "beta", "gamma"] {
        let (da, db) = (json_at(pa, &format!("/tables/{svc}")), json_at(pb, &format!("/tables/{svc}")));
        assert!(da["runs"].as_array().is_some_and(|r| !r.is_empty()), "{da}");
        assert_eq!(da, db, "{svc}");
        // Without the runs: the same summary, and the summary of /tables.
        let mut summary = da.clone();
        summary.as_object_mut().map(|o| o.remove("runs"));
        assert_eq!(json_at(pa, &format!("/tables/{svc}?runs=false")), summary, "{svc}");
        assert!(list.contains(&summary), "{svc}: {summary}");
    }
    // And a flow explained by both goes to the same endpoint.
    let q = "/explain?proto=tcp&src=198.51.100.7:40000&dst=20.0.0.1:80";
    let (ea, eb) = (json_at(pa, q), json_at(pb, q));
    assert!(ea.to_string().contains("10.50."), "{ea}");
    assert_eq!(ea, eb);

    // From outside: the same new flows sent to each leave it for the
    // endpoint its /explain names, the same from both.
    let sent = flows();
    let input = dir.join("flows.pcap");
    std::fs::write(&input, pcap(&sent.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>(), 0)).unwrap();
    let mut seen = Vec::new();
    for (t, port) in [("a", pa), ("b", pb)] {
        let dump = Tcpdump::start(&ns.name, &format!("xt{t}1"), &format!("ether dst {GATEWAY_MAC}"), &dir.join(format!("{t}-out.pcap")));
        let o = Command::new("python3").args(["-c", REPLAY, &format!("xt{t}1"), input.to_str().unwrap()]).output().unwrap();
        if !o.status.success() || String::from_utf8_lossy(&o.stdout).trim() != sent.len().to_string() {
            fail(format!("sending the flows to {t}: {o:?}"));
        }
        let got = dump.wait_for(sent.len(), Duration::from_secs(20));
        let (out, other) = delivered(&dump.frames());
        let missing: Vec<&FlowKey> = sent.iter().map(|(k, _)| k).filter(|k| !out.contains_key(*k)).take(5).collect();
        if got < sent.len() || !missing.is_empty() || other > 0 {
            fail(format!("{t} sent {got} frames to the gateway for {} flows ({other} not IP-in-IP); flows not seen, such as {missing:?}", sent.len()));
        }
        // Each flow went to one endpoint, the one the appliance names.
        let mut wrong = Vec::new();
        for (k, outer) in &out {
            let said = explained(port, *k);
            if outer.len() != 1 || said != Some(outer[0]) {
                wrong.push(format!("{}:{} sent to {outer:?}, explained as {said:?}", k.0, k.1));
            }
        }
        if !wrong.is_empty() {
            fail(format!("{t} forwarded {} of {} flows elsewhere than its /explain says, such as {:?}", wrong.len(), out.len(), &wrong[..wrong.len().min(5)]));
        }
        seen.push(out);
    }
    let differ: Vec<String> =
        seen[0].iter().filter(|(k, e)| seen[1].get(*k) != Some(*e)).map(|(k, e)| format!("{}:{} to {e:?} by a, {:?} by b", k.0, k.1, seen[1].get(k))).collect();
    if !differ.is_empty() {
        fail(format!("a and b sent {} of {} flows to different endpoints, such as {:?}", differ.len(), seen[0].len(), &differ[..differ.len().min(5)]));
    }
    let endpoints: std::collections::BTreeSet<&IpAddr> = seen[0].values().flatten().collect();
    eprintln!("{} flows, seen on the wire, went to the same {} endpoints from both appliances, as each one's /explain says", seen[0].len(), endpoints.len());

    // /status lists endpoints up to a limit and narrows to one service.
    let all = json_at(pa, "/status?endpoints=all");
    let total = all["endpoints_total"].as_u64().expect("endpoints_total");
    assert_eq!(all["endpoints"].as_array().map(|e| e.len() as u64), Some(total), "{all}");
    assert_eq!(all["endpoints_omitted"], 0);
    let two = json_at(pa, "/status?endpoints=2");
    assert_eq!(two["endpoints"].as_array().map(Vec::len), Some(2));
    assert_eq!(two["endpoints_omitted"].as_u64(), Some(total - 2));
    let alpha = json_at(pa, "/status?service=alpha");
    let names: Vec<&Value> = alpha["services"].as_array().expect("services").iter().map(|s| &s["name"]).collect();
    assert_eq!(names, [&Value::from("alpha")]);
    let eps = alpha["endpoints"].as_array().expect("endpoints");
    assert!(!eps.is_empty() && eps.iter().all(|e| e["service"] == "alpha"), "{alpha}");
    assert_eq!(Some(eps.len() as u64), alpha["endpoints_total"].as_u64());
    assert!(status_line(pa, "/status?service=nope").starts_with("HTTP/1.1 404"));
    assert!(status_line(pa, "/status?endpoints=many").starts_with("HTTP/1.1 400"));

    let (ca, _, erra) = a.stop("INT", Duration::from_secs(20));
    let (cb, _, errb) = b.stop("INT", Duration::from_secs(20));
    assert_eq!((ca, cb), (Some(0), Some(0)), "{erra}\n{errb}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The addresses of service `svc`'s endpoints as appliance `port` serves them, sorted.
fn served_addresses(port: u16, svc: &str) -> Vec<String> {
    let v = json_at(port, &format!("/status?service={svc}&endpoints=all"));
    let mut out: Vec<String> = v["endpoints"].as_array().into_iter().flatten().filter_map(|e| e["address"].as_str().map(str::to_owned)).collect();
    out.sort();
    out
}

/// A server (go-control-plane v0.11's SotW NACK behaviour: the refused
/// version sent again at once) serves one state to a SotW and a delta
/// appliance: a cluster on another's VIP, port and protocol (refused by
/// both), then the fix, which removes it and changes another service's
/// endpoints. With the assignments pushed before the clusters and after,
/// both appliances end with the same tables, serving the new endpoints.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_sotw_and_a_delta_appliance_agree_after_a_conflict_and_its_fix_in_either_push_order() {
    privileged();
    for (round, order) in ["assignments-first", "clusters-first"].into_iter().enumerate() {
        let dir = tempdir(&format!("xds-fix-{}-{round}", std::process::id()));
        let resources = dir.join("resources.json");
        let write = |version: usize, clusters: &[Value], assignments: &[Value]| {
            let doc = json!({"version": format!("{version}"), "clusters": clusters, "assignments": assignments});
            let tmp = resources.with_extension("tmp");
            std::fs::write(&tmp, doc.to_string()).unwrap();
            std::fs::rename(&tmp, &resources).unwrap();
        };
        let good = vec![cluster("alpha", "20.0.0.1", "MAGLEV"), cluster("beta", "2001:db8:20::1", "MAGLEV")];
        let (alpha, beta_old) = (v4(40), v6(17));
        let beta_new: Vec<(String, u32)> = v6(24)[5..].to_vec();
        write(1, &good, &[cla("alpha", &alpha), cla("beta", &beta_old)]);
        let xds = free_port();
        let _server = Proc::spawn(&[
            tool_bin("sluice-xds-server").to_str().unwrap(),
            "--listen",
            &format!("127.0.0.1:{xds}"),
            "--file",
            resources.to_str().unwrap(),
            "--push-order",
            order,
            "--resend-nacked",
        ]);
        let (pa, pb) = (free_port(), free_port());
        let bin = sluice_bin();
        let mut a = Proc::spawn(&[bin.to_str().unwrap(), "run", "--config", config(&dir, &format!("fa{round}"), pa, xds, "sotw").to_str().unwrap()]);
        let mut b = Proc::spawn(&[bin.to_str().unwrap(), "run", "--config", config(&dir, &format!("fb{round}"), pb, xds, "delta").to_str().unwrap()]);
        let mut fail = |what: String| -> ! {
            let (ca, oa, ea) = a.stop("INT", Duration::from_secs(10));
            let (cb, ob, eb) = b.stop("INT", Duration::from_secs(10));
            panic!("{order}: {what}\na (exit {ca:?}):\n{oa}\n{ea}\nb (exit {cb:?}):\n{ob}\n{eb}");
        };
        let xds_of = |port: u16| json_at(port, "/status")["xds"].clone();
        let both = |cond: &dyn Fn(&Value) -> bool| wait_until(Duration::from_secs(30), || cond(&xds_of(pa)) && cond(&xds_of(pb)));
        if !both(&|x| x["services"] == 2 && x["endpoints"] == 57) {
            fail(format!("the good state: {} / {}", xds_of(pa), xds_of(pb)));
        }

        // A second cluster on alpha's VIP, port and protocol.
        let mut clash = good.clone();
        clash.push(cluster("alpha-two", "20.0.0.1", "MAGLEV"));
        write(2, &clash, &[cla("alpha", &alpha), cla("beta", &beta_old), cla("alpha-two", &v4(3))]);
        if !both(&|x| x["refused"] == json!(["alpha-two"]) && x["nacks"].as_u64() > Some(0) && x["services"] == 2) {
            fail(format!("the conflict: {} / {}", xds_of(pa), xds_of(pb)));
        }
        for x in [xds_of(pa), xds_of(pb)] {
            let why = x["last_nack"]["error"].as_str().unwrap_or_default().to_owned();
            assert!(why.contains("Cluster \"alpha-two\": 20.0.0.1:80/TCP is already claimed by cluster \"alpha\""), "{order}: {x}");
        }

        // The fix: alpha-two goes, beta's endpoints change.
        write(3, &good, &[cla("alpha", &alpha), cla("beta", &beta_new)]);
        let mut want: Vec<String> = beta_new.iter().map(|(a, _)| a.clone()).collect();
        want.sort();
        let ok = wait_until(Duration::from_secs(30), || {
            served_addresses(pa, "beta") == want && served_addresses(pb, "beta") == want && [pa, pb].iter().all(|p| xds_of(*p)["refused"] == json!([]))
        });
        if !ok {
            fail(format!(
                "the fix: beta on a {:?}, on b {:?}, want {want:?}\n{} / {}",
                served_addresses(pa, "beta"),
                served_addresses(pb, "beta"),
                xds_of(pa),
                xds_of(pb)
            ));
        }
        let (ta, tb) = (tables(pa), tables(pb));
        assert_eq!(ta.as_array().map(Vec::len), Some(2), "{order}: {ta}");
        assert_eq!(ta, tb, "{order}: both appliances have the same tables");

        let (ca, _, erra) = a.stop("INT", Duration::from_secs(20));
        let (cb, _, errb) = b.stop("INT", Duration::from_secs(20));
        assert_eq!((ca, cb), (Some(0), Some(0)), "{order}: {erra}\n{errb}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
