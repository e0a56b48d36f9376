//! The appliance end to end, in network namespaces (scripts/topology.sh):
//! a client, `sluice run` on af_packet ports, three NAT-less backends.
//!
//! - hundreds of real TCP connections to the VIP complete, each backend
//!   taking a share; UDP works;
//! - removing one endpoint from the configuration (file change) moves only
//!   its flows: long-lived connections to the others survive;
//! - a broken configuration is rejected and the last good one keeps
//!   serving;
//! - SIGINT stops it with exit status 0 and every mbuf back in the pool;
//! - no namespace is left behind;
//! - in a namespace that forwards IPv4 (as a Kubernetes node's pods inherit
//!   it) the kernel leaves the VIPs' traffic to the appliance, and with
//!   `/proc/sys` read-only (an unprivileged container) it starts and serves;
//! - frames the kernel drops on their way to the appliance (an exception
//!   interface's queue full) are counted in its metrics.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use sluice_tests::topology::{root, stop_cleanly, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn load_balances_real_traffic_and_reloads_without_disturbing_other_flows() {
    privileged();
    let prefix = format!("sa{}", std::process::id());
    let topo = Topology::up(&prefix);
    let backend = root().join("scripts/backend.py");
    let _backends: Vec<Proc> = (1..=3)
        .map(|i| topo.spawn(&format!("be{i}"), &["python3", backend.to_str().unwrap(), &format!("be{i}"), "20.0.0.1", "20.0.0.2"]))
        .collect();

    let Demo { mut lb, dir, cfg, base } = start_demo(&topo, &prefix, &[]);

    // Hundreds of real TCP connections, all complete, spread over the backends.
    let counts = topo.client(&["short", "20.0.0.1", "450", "16"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    for b in ["be1", "be2", "be3"] {
        let n = counts.get(b).copied().unwrap_or(0);
        assert!(n >= 90, "{b} got {n} of 450 connections: {counts:?}");
    }
    // UDP too (each query from the same socket: one flow, one backend).
    let udp = topo.client(&["udp", "20.0.0.1", "100"]);
    assert_eq!(udp.values().sum::<u64>(), 100);
    assert_eq!(udp.get("failed"), None, "{udp:?}");

    // Long-lived connections; then endpoint 2 (be3) leaves the web service.
    let held = topo.hold("20.0.0.1", &dir.join("hold.json"));
    let generation = topo.status()["generation"].as_u64().unwrap();
    let without_be3 = base.replacen("      - {id: 2, address: 10.200.0.13}\n  - name: dns", "  - name: dns", 1);
    assert_ne!(without_be3, base);
    std::fs::write(&cfg, &without_be3).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || topo.status()["generation"].as_u64().unwrap() > generation),
        "the file change was picked up"
    );
    let st = topo.status();
    assert_eq!(st["sources"]["file"]["accepted"], true);
    assert_eq!(st["sources"]["file"]["rebuilt"], serde_json::json!(["web"]), "only the changed service was rebuilt");
    assert_eq!(st["sources"]["file"]["rebuilt_count"], 1);

    held.only_moved("be3");
    let after = topo.client(&["short", "20.0.0.1", "120", "16"]);
    assert_eq!(after.get("failed"), None, "{after:?}");
    assert_eq!(after.get("be3"), None, "no new connection to the removed endpoint: {after:?}");

    // A broken configuration is rejected; traffic goes on.
    std::fs::write(&cfg, without_be3.replace("vips: [20.0.0.1]", "vips: [20.0.0.0/24]")).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || topo.status()["sources"]["file"]["accepted"] == false),
        "the broken file was noticed"
    );
    let problems = topo.status()["sources"]["file"]["problems"].to_string();
    assert!(problems.contains("is not a /32 or /128"), "{problems}");
    let still = topo.client(&["short", "20.0.0.1", "30", "8"]);
    assert_eq!(still.values().sum::<u64>(), 30);
    assert_eq!(still.get("failed"), None);

    // Metrics carry the traffic.
    let metrics = String::from_utf8(topo.output("lb", &["curl", "-sf", "127.0.0.1:9091/metrics"]).stdout).unwrap();
    assert!(metrics.contains("sluice_config_reloads_total{result=\"rejected\"} 1"), "{metrics}");
    let web: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_service_packets_total{service=\"web\"} "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(web > 3000, "web packets counted: {web}");

    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A namespace that forwards IPv4: the kernel, which sees every frame DPDK
/// reads through `net_af_packet`, routed each SYN to a VIP, found no route
/// and answered "net unreachable" through the exception interface; the
/// client gave up before the backend's SYN-ACK came. Forwarding turned on
/// again while it runs (a container runtime starting on the host writes
/// `net.ipv4.ip_forward`, which sets every interface's) is set back, and
/// counted.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn connections_complete_when_the_namespace_forwards_ipv4() {
    privileged();
    let prefix = format!("sf{}", std::process::id());
    let (topo, mut lb, dir, _backends) = started_in_a_forwarding_namespace(&prefix, &[]);
    all_connections_complete(&topo, 200);

    let restored = || {
        let m = topo.output("lb", &["curl", "-sf", "127.0.0.1:9091/metrics"]);
        String::from_utf8_lossy(&m.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("sluice_port_kernel_settings_restored_total{port=\"front\"} ")?.parse::<u64>().ok())
    };
    assert_eq!(restored(), Some(0));
    // Off and on again, as a runtime starting on a host that did not
    // forward turns it on (a write of the value it holds changes nothing).
    let out = topo.output("lb", &["sysctl", "-qw", "net.ipv4.ip_forward=0", "net.ipv4.ip_forward=1"]);
    assert!(out.status.success(), "{out:?}");
    assert!(wait_until(Duration::from_secs(5), || restored() == Some(1)), "forwarding on lbf was not set back: {:?}", restored());
    let lbf = topo.output("lb", &["cat", "/proc/sys/net/ipv4/conf/lbf/forwarding"]);
    assert_eq!(String::from_utf8_lossy(&lbf.stdout).trim(), "0");
    all_connections_complete(&topo, 200);

    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A pod as Kubernetes makes it without `privileged`: forwarding on (the
/// node forwards, the namespace inherits it) and `/proc/sys` mounted
/// read-only. The appliance wrote its interfaces' settings there and did not
/// start at all.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn starts_and_serves_with_proc_sys_read_only() {
    privileged();
    let prefix = format!("sr{}", std::process::id());
    let read_only = ["unshare", "--mount", "--propagation", "private", "sh", "-c", "mount -o bind,ro /proc/sys /proc/sys && exec \"$@\"", "sh"];
    let (topo, mut lb, dir, _backends) = started_in_a_forwarding_namespace(&prefix, &read_only);
    all_connections_complete(&topo, 200);
    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sends 1,000 frames (EtherType 0x88b5, for local experiments) onto the
/// interface named by the first argument; prints how many the kernel
/// refused.
const SEND_1000: &str = "import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
frame = bytes.fromhex('020000000099') + s.getsockname()[4] + bytes.fromhex('88b5') + bytes(46)
refused = 0
for _ in range(1000):
    try:
        s.send(frame)
    except OSError:
        refused += 1
print(refused)
";

/// The kernel drops a frame it sends through a port's exception interface
/// when the interface's queue is full (the workers read too slowly): the
/// appliance counts what the kernel counts. Here the appliance is stopped
/// (SIGSTOP) and the queue holds one frame while 1,000 frames are sent, so
/// that at least 999 are dropped. Before, only `ip -s link` showed them.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn frames_the_kernel_drops_on_the_way_to_the_appliance_are_counted() {
    privileged();
    let prefix = format!("sx{}", std::process::id());
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&["20.0.0.1", "20.0.0.2"]);
    topo.backends_listen(&[80], &[]);
    let Demo { mut lb, dir, .. } = start_demo(&topo, &prefix, &[]);
    let counted = || {
        let m = topo.output("lb", &["curl", "-sf", "127.0.0.1:9091/metrics"]);
        String::from_utf8_lossy(&m.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("sluice_port_exception_dropped_total{port=\"back\"} ")?.parse::<u64>().ok())
    };
    let kernel = || topo.link("lb", "sl-back")["stats64"]["tx"]["dropped"].as_u64().unwrap();
    let before = kernel();
    assert!(wait_until(Duration::from_secs(5), || counted() == Some(kernel())), "{:?} counted, {} by the kernel", counted(), kernel());

    let out = topo.output("lb", &["ip", "link", "set", "dev", "sl-back", "txqueuelen", "1"]);
    assert!(out.status.success(), "{out:?}");
    let pid = lb.id().unwrap().to_string();
    let signal = |s: &str| assert!(std::process::Command::new("kill").args([s, &pid]).status().unwrap().success());
    signal("-STOP");
    // Each send the kernel refuses (ENOBUFS) is a frame it dropped.
    let out = topo.output("lb", &["python3", "-c", SEND_1000, "sl-back"]);
    signal("-CONT");
    assert!(out.status.success(), "{out:?}");
    let refused: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let after = kernel();
    assert!(refused >= 999, "{refused} of the 1,000 frames refused; with a queue of one frame and nobody reading, all but one");
    assert!(after - before >= refused, "the kernel counted {} dropped, {refused} refused", after - before);
    // Room again, so that the kernel's own frames (ARP) are not dropped
    // while the figures are compared.
    let out = topo.output("lb", &["ip", "link", "set", "dev", "sl-back", "txqueuelen", "10000"]);
    assert!(out.status.success(), "{out:?}");
    let same = wait_until(Duration::from_secs(5), || counted() == Some(kernel()));
    assert!(same, "sluice_port_exception_dropped_total{{port=\"back\"}} is {:?}, the kernel counts {}", counted(), kernel());
    assert!(counted() >= Some(after));

    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The demo in namespaces of `prefix` whose appliance namespace forwards
/// IPv4, the appliance started under `wrap` (a command that runs the rest of
/// its arguments) and ready: the topology, the appliance, its directory and
/// the backends.
fn started_in_a_forwarding_namespace(prefix: &str, wrap: &[&str]) -> (Topology, Proc, PathBuf, Vec<Proc>) {
    let topo = Topology::up(prefix);
    let out = topo.output("lb", &["sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"]);
    assert!(out.status.success(), "{out:?}");
    let backends = topo.backends(&["20.0.0.1", "20.0.0.2"]);
    topo.backends_listen(&[80], &[]);
    let Demo { lb, dir, .. } = start_demo(&topo, prefix, wrap);
    (topo, lb, dir, backends)
}

/// The appliance of [`start_demo`]: the process, its directory, its
/// configuration file and what was first written there.
struct Demo {
    lb: Proc,
    dir: PathBuf,
    cfg: PathBuf,
    base: String,
}

/// Starts `sluice run` with the demo's configuration (DPDK prefix `prefix`)
/// in the appliance's namespace of `topo`, under `wrap` (a command that runs
/// the rest of its arguments; none: directly), and waits until its six
/// endpoints are ready; panics with its output when they are not in 30 s.
fn start_demo(topo: &Topology, prefix: &str, wrap: &[&str]) -> Demo {
    let dir = tempdir(prefix);
    let cfg = dir.join("appliance.yaml");
    let base = std::fs::read_to_string(root().join("configs/demo.yaml"))
        .unwrap()
        .replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    std::fs::write(&cfg, &base).unwrap();
    let bin = sluice_bin();
    let mut cmd = wrap.to_vec();
    cmd.extend([bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let mut lb = topo.spawn("lb", &cmd);
    let ready = wait_until(Duration::from_secs(30), || {
        topo.output("lb", &[bin.to_str().unwrap(), "status", "--json"]).status.success()
            && topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 6 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not become ready (exit {code:?}):\n{out}\n{err}");
    }
    Demo { lb, dir, cfg, base }
}

/// `n` short connections to the VIP from the client: every one completes.
fn all_connections_complete(topo: &Topology, n: u64) {
    let counts = topo.client(&["short", "20.0.0.1", &n.to_string(), "16"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    assert_eq!(counts.values().sum::<u64>(), n, "{counts:?}");
}

fn tempdir(prefix: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-{prefix}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
