//! Idle workers wait on their ports' receive interrupts (`dpdk.rxInterrupts`,
//! on by default) where every port they poll has them: here two `net_tap`
//! ports, whose kernel ends are in a namespace of the test's own. Traffic
//! sent after idle gaps wakes the worker through the interrupt (the
//! `interrupt_wakeups` counter) and is balanced, none lost. A device without
//! receive interrupts (`net_null`), or the switch turned off, leaves the
//! worker sleeping its bounded pauses, as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sluice_tests::{privileged, python, sluice_bin, wait_until, Netns, Proc, Tcpdump};

/// The DPDK side's MAC on the front tap (given to the tap PMD).
const FRONT_MAC: &str = "02:00:00:00:01:01";

/// The endpoint's MAC (in the configuration).
const ENDPOINT_MAC: &str = "02:00:00:00:02:0b";

fn config(dir: &std::path::Path, tag: &str, admin: u16, ports: &str, dpdk_extra: &str) -> std::path::PathBuf {
    let cfg = dir.join(format!("{tag}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            r#"dpdk: {{lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: slintr{tag}{pid}, mbufs: 2047, descriptors: 256{dpdk_extra}}}
ports:
{ports}
admin: {{listen: "127.0.0.1:{admin}"}}
services:
  - name: dns
    endpoints:
      - {{id: 0, address: 10.2.0.11, mac: "02:00:00:00:02:0b"}}
routes:
  - {{name: dns, service: dns, vips: [20.0.0.1], protocols: [UDP], destinationPorts: ["53"]}}
"#,
            pid = std::process::id(),
        ),
    )
    .unwrap();
    cfg
}

/// The value of the worker metric `name` (`sluice_worker_<name>...`), if served.
fn metric(ns: &Netns, admin: u16, name: &str) -> Option<u64> {
    let o = ns.output(&["curl", "-s", "--max-time", "5", &format!("http://127.0.0.1:{admin}/metrics")]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let prefix = format!("sluice_worker_{name}{{");
    let prefix_total = format!("sluice_worker_{name}_total{{");
    text.lines()
        .find(|l| l.starts_with(&prefix) || l.starts_with(&prefix_total))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn start(ns: &Netns, cfg: &std::path::Path, admin: u16) -> Proc {
    let bin = sluice_bin();
    let lb = ns.spawn(&[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    assert!(
        wait_until(Duration::from_secs(30), || metric(ns, admin, "idle_pauses").is_some_and(|n| n > 0)),
        "the appliance did not come up and idle"
    );
    lb
}

fn taps() -> String {
    format!(
        "  - {{name: front, device: \"net_tap0,iface=sli0,mac={FRONT_MAC}\", addresses: [10.1.0.1/24], kernelInterface: \"\"}}\n  - {{name: back, device: \"net_tap1,iface=sli1\", addresses: [10.2.0.1/24], kernelInterface: \"\"}}"
    )
}

/// A namespace of the test's own, without IPv6 chatter (router
/// solicitations, MLD) on the taps, so the only frames are the test's; and
/// an empty directory for the configurations.
fn setup(tag: &str) -> (Netns, std::path::PathBuf) {
    let ns = Netns::new(tag);
    ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    let dir = std::env::temp_dir().join(format!("sluice-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (ns, dir)
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn traffic_after_idle_wakes_the_worker_through_the_receive_interrupt() {
    privileged();
    let (ns, dir) = setup("intr");
    let admin = 19301;
    let cfg = config(&dir, "on", admin, &taps(), "");
    let mut lb = start(&ns, &cfg, admin);
    let armed = metric(&ns, admin, "rx_interrupts");
    assert!(
        wait_until(Duration::from_secs(10), || metric(&ns, admin, "interrupt_waits").is_some_and(|n| n > 0)),
        "no pause waited on the interrupts"
    );
    // The kernel end of the front tap sends to the VIP through the appliance.
    ns.run(&["ip", "addr", "add", "10.1.0.2/24", "dev", "sli0"]);
    ns.run(&["ip", "route", "add", "20.0.0.0/24", "via", "10.1.0.1"]);
    ns.run(&["ip", "neigh", "replace", "10.1.0.1", "lladdr", FRONT_MAC, "dev", "sli0", "nud", "permanent"]);
    // What leaves the back port, seen from its kernel end: frames to the
    // endpoint's MAC.
    let dump = Tcpdump::start(&ns.name, "sli1", &format!("ether dst {ENDPOINT_MAC} and udp dst port 53"), &dir.join("back.pcap"));
    let woken_before = metric(&ns, admin, "interrupt_wakeups").unwrap_or(0);
    let balanced_before = metric(&ns, admin, "balanced_packets").unwrap_or(0);
    // 20 datagrams, 30 ms apart: the worker is deep in its pauses (2 ms
    // each, waiting on the interrupt) when each arrives.
    let mut send = python(
        &ns,
        "import socket, sys, time\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for i in range(20):\n\
         \x20   s.sendto(b'x' * 32, ('20.0.0.1', 53))\n\
         \x20   time.sleep(0.03)\n",
        &[],
    );
    let all = wait_until(Duration::from_secs(10), || {
        metric(&ns, admin, "balanced_packets").is_some_and(|n| n >= balanced_before + 20)
    });
    let (sent, sout, serr) = send.stop("0", Duration::from_secs(10));
    let balanced = metric(&ns, admin, "balanced_packets").unwrap_or(0) - balanced_before;
    let woken = metric(&ns, admin, "interrupt_wakeups").unwrap_or(0) - woken_before;
    // Every datagram balanced has been sent to the tap by the time the
    // counter shows it; the kernel hands it to tcpdump within this wait.
    let out_frames = dump.wait_for(20, Duration::from_secs(5));
    let frames = dump.frames();
    let (code, _out, err) = lb.stop("INT", Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(sent, Some(0), "the sender's exit status:\n{sout}\n{serr}");
    assert_eq!(armed, Some(1), "both taps have receive interrupts: the worker waits on them\n{err}");
    assert!(all && balanced == 20, "every datagram balanced: {balanced} of 20\n{err}");
    let to_vip = frames.iter().filter(|f| f.len() > 42 && f[30..34] == [20, 0, 0, 1] && f[36..38] == 53u16.to_be_bytes()).count();
    assert_eq!(
        (frames.len(), to_vip),
        (20, 20),
        "the back port's kernel end saw every datagram to the VIP sent to the endpoint's MAC ({out_frames} when last looked)\n{err}"
    );
    assert!(woken >= 10, "most datagrams arrived during a wait and ended it: {woken} wake-ups for 20\n{err}");
    assert_eq!(code, Some(0), "clean stop:\n{err}");
    assert!(err.contains("rx_interrupts=true"), "the idle policy says so in the log:\n{err}");
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn without_interrupts_the_worker_sleeps_its_pauses() {
    privileged();
    let (ns, dir) = setup("nointr");
    let null = "  - {name: front, device: \"net_null0,no-rx=1\", addresses: [10.1.0.1/24], kernelInterface: \"\"}\n  - {name: back, device: \"net_null1,no-rx=1\", addresses: [10.2.0.1/24], kernelInterface: \"\"}";
    for (tag, ports, extra) in [("off", taps(), ", rxInterrupts: false"), ("null", null.to_owned(), "")] {
        let admin = if tag == "off" { 19302 } else { 19303 };
        let cfg = config(&dir, tag, admin, &ports, extra);
        let mut lb = start(&ns, &cfg, admin);
        // Many pauses taken: had any waited on an interrupt it would show.
        let mut pauses = None;
        wait_until(Duration::from_secs(10), || {
            pauses = metric(&ns, admin, "idle_pauses");
            pauses.is_some_and(|p| p > 100)
        });
        let (armed, waits) = (metric(&ns, admin, "rx_interrupts"), metric(&ns, admin, "interrupt_waits"));
        let (code, _out, err) = lb.stop("INT", Duration::from_secs(10));
        assert_eq!(armed, Some(0), "{tag}: the worker sleeps\n{err}");
        assert_eq!(waits, Some(0), "{tag}: no pause waited on interrupts\n{err}");
        assert!(pauses.is_some_and(|p| p > 100), "{tag}: the idle worker pauses: {pauses:?}\n{err}");
        assert_eq!(code, Some(0), "{tag}: clean stop:\n{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
