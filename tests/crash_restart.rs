//! Crash-only: an appliance that announces its VIPs over BGP is killed with
//! SIGKILL, and `sluice run` starts it again without any cleanup by hand:
//! it serves and is announced again, and nothing of the killed one is left
//! (its supervised `bird` died with it and held none of DPDK's files).
//!
//! The demo topology, with a BIRD in the client's namespace as the DC
//! gateway: the client reaches the VIP only through the route that gateway
//! learns over BGP (with BFD) from the appliance.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::topology::{root, stop_cleanly, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

const VIP: &str = "20.0.0.1";

fn appliance_config(prefix: &str, dir: &Path) -> String {
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let head = demo[..demo.find("\ndefaults:").unwrap()].replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"));
    format!(
        r#"{head}
bird: {{socket: {dir}/bird.ctl, configFile: {dir}/bird.conf, withdrawWaitMs: 500}}
gatewayRouters:
  - name: dc-gw
    address: 10.100.0.2
    interface: front
    bgp: {{localASN: 8103, remoteASN: 65001, holdTime: 9s, bfd: {{switch: true, minTx: 100ms, minRx: 100ms, multiplier: 3}}}}
services:
  - name: web
    endpoints:
      - {{id: 0, address: 10.200.0.11}}
      - {{id: 1, address: 10.200.0.12}}
      - {{id: 2, address: 10.200.0.13}}
routes:
  - {{name: web-tcp, service: web, vips: [{VIP}], protocols: [TCP], destinationPorts: ["80"]}}
"#,
        dir = dir.display()
    )
}

const GATEWAY: &str = "router id 10.100.0.2;\nlog stderr all;\nprotocol device { scan time 2; }\n\
    protocol bfd { interface \"c0\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }\n\
    protocol kernel { ipv4 { export all; }; }\n\
    protocol bgp lb { local 10.100.0.2 as 65001; neighbor 10.100.0.1 as 8103; bfd on; connect retry time 1; error wait time 1, 5; ipv4 { import all; export none; }; }\n";

fn status(topo: &Topology) -> Value {
    topo.json("lb", &[sluice_bin().to_str().unwrap(), "status", "--json"])
}

/// The VIP is announced (as the appliance reports it and in the gateway's
/// FIB) and TCP connections to it go through.
fn serving(topo: &Topology) -> bool {
    let st = status(topo);
    let announced = st["bird"]["vips"].as_array().is_some_and(|v| v.iter().any(|v| v["vip"] == VIP && v["announced"] == true));
    let route = String::from_utf8_lossy(&topo.output("client", &["ip", "-4", "route", "show", VIP]).stdout).contains("10.100.0.1");
    if !(announced && route) {
        return false;
    }
    let script = root().join("scripts/client.py");
    let r = topo.json("client", &["python3", script.to_str().unwrap(), "short", VIP, "20", "4"]);
    r.as_object().is_some_and(|m| m.get("failed").is_none() && m.values().filter_map(Value::as_u64).sum::<u64>() == 20)
}

fn start(topo: &Topology, config: &Path) -> Proc {
    topo.spawn("lb", &[sluice_bin().to_str().unwrap(), "run", "--config", config.to_str().unwrap()])
}

fn fail(mut lb: Proc, what: &str) -> ! {
    let (code, _, err) = lb.stop("INT", Duration::from_secs(20));
    panic!("{what} (appliance exit {code:?}):\n{err}");
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_killed_appliance_starts_again_serving_and_announced_with_nothing_of_it_left() {
    privileged();
    let prefix = format!("cr{}", std::process::id());
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&[VIP]);
    // Only BGP takes the client to the VIP.
    topo.output("client", &["ip", "route", "del", "20.0.0.0/24"]);
    let dir = std::env::temp_dir().join(format!("sluice-{prefix}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let gw_conf = dir.join("gw.conf");
    std::fs::write(&gw_conf, GATEWAY).unwrap();
    let gw_sock = dir.join("gw.ctl");
    let _gw = topo.spawn("client", &["bird", "-f", "-c", gw_conf.to_str().unwrap(), "-s", gw_sock.to_str().unwrap()]);
    let config = dir.join("appliance.yaml");
    std::fs::write(&config, appliance_config(&prefix, &dir)).unwrap();

    let lb = start(&topo, &config);
    if !wait_until(Duration::from_secs(60), || serving(&topo)) {
        fail(lb, "the first run did not serve and announce the VIP");
    }
    let old_bird = status(&topo)["bird"]["pid"].as_u64().expect("the supervised bird's pid");
    let old_bird_cmdline = std::fs::read(format!("/proc/{old_bird}/cmdline")).unwrap();
    let old_sluice = lb.id().unwrap();

    let mut lb = lb;
    let (code, _, _) = lb.stop("KILL", Duration::from_secs(10));
    assert_eq!(code, None, "killed by SIGKILL");
    let t0 = Instant::now();
    let lb = start(&topo, &config);
    if !wait_until(Duration::from_secs(60), || serving(&topo)) {
        fail(lb, "started again after SIGKILL, the appliance did not serve and announce the VIP within 60 s");
    }
    let back = t0.elapsed();
    eprintln!("after SIGKILL, `sluice run` again: serving and announced after {} ms", back.as_millis());

    // Nothing of the killed appliance is left: its bird is gone, and the
    // namespace holds the new appliance and its new bird only.
    let same = std::fs::read(format!("/proc/{old_bird}/cmdline")).is_ok_and(|c| c == old_bird_cmdline);
    assert!(!same, "the killed appliance's bird (pid {old_bird}) still runs");
    let new_bird = status(&topo)["bird"]["pid"].as_u64().expect("the new bird's pid");
    let new_sluice = u64::from(lb.id().unwrap());
    let pids = std::process::Command::new("ip").args(["netns", "pids", &topo.ns("lb")]).output().unwrap().stdout;
    let strays: Vec<String> = String::from_utf8_lossy(&pids)
        .split_whitespace()
        .filter_map(|p| p.parse::<u64>().ok())
        .filter(|p| *p != new_bird && *p != new_sluice)
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok().map(|c| format!("{p}: {}", String::from_utf8_lossy(&c).replace('\0', " "))))
        .collect();
    assert!(strays.is_empty(), "processes other than the new appliance ({new_sluice}) and its bird ({new_bird}) in its namespace (the killed one was {old_sluice}): {strays:?}");
    assert!(back < Duration::from_secs(30), "serving and announced again within 30 s, took {back:?}");

    let mut lb = lb;
    let (code, _, err) = lb.stop("TERM", Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert!(!dir.join("bird.pid").exists(), "the pidfile goes with a clean stop");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A step of the bring-up that fails has the steps before it undone, and
/// the next start serves. Here the sixth of nine: the kernel refuses the
/// front port's IPv6 address (IPv6 is off in the appliance's namespace)
/// once the ports and their exception taps are up. The process exits with
/// status 2 (an error) within the test's bound, names the step, stops the ports (their
/// taps leave the namespace) and shuts DPDK down; with IPv6 back on, the
/// same configuration starts and serves.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_start_that_fails_at_a_step_undoes_the_steps_before_it_and_the_next_start_serves() {
    privileged();
    let prefix = format!("bu{}", std::process::id());
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&[VIP]);
    let dir = std::env::temp_dir().join(format!("sluice-{prefix}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let config_text = demo
        .replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"))
        .replace("addresses: [10.100.0.1/24]", "addresses: [10.100.0.1/24, fd00:100::1/64]");
    assert!(config_text.contains("fd00:100::1/64"), "the demo's front port takes the IPv6 address");
    let config = dir.join("appliance.yaml");
    std::fs::write(&config, config_text).unwrap();
    let ipv6 = |off: &str| {
        for key in ["net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"] {
            let o = topo.output("lb", &["sysctl", "-qw", &format!("{key}={off}")]);
            assert!(o.status.success(), "sysctl {key}={off}: {}", String::from_utf8_lossy(&o.stderr));
        }
    };
    let taps = || {
        let links = topo.json("lb", &["ip", "-j", "link", "show"]);
        links.as_array().unwrap().iter().filter_map(|l| l["ifname"].as_str()).filter(|n| n.starts_with("sl-")).map(str::to_owned).collect::<Vec<_>>()
    };

    ipv6("1");
    let mut lb = start(&topo, &config);
    let exited = wait_until(Duration::from_secs(60), || !lb.running());
    let (code, _, err) = lb.stop("KILL", Duration::from_secs(10));
    assert!(exited, "a failed start must end the process; it still ran after 60 s:\n{err}");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("starting the exception interfaces"), "the error names the step:\n{err}");
    assert!(err.contains("undoing the steps before it"), "{err}");
    assert!(!err.contains("mbufs not returned") && !err.contains("DPDK could not be cleaned up"), "{err}");
    assert_eq!(taps(), Vec::<String>::new(), "the ports stopped and their exception taps went with them:\n{err}");

    ipv6("0");
    let t0 = Instant::now();
    let mut lb = start(&topo, &config);
    let ready = wait_until(Duration::from_secs(60), || topo.status()["ready"] == true);
    eprintln!("started again after the failed start: ready after {} ms", t0.elapsed().as_millis());
    if !ready {
        fail(lb, "after the failed start, the same configuration did not become ready within 60 s");
    }
    let r = topo.client(&["short", VIP, "20", "4"]);
    eprintln!("connections per backend: {r:?}");
    assert!(!r.contains_key("failed") && r.values().sum::<u64>() == 20, "served after the failed start: {r:?}");
    stop_cleanly(&mut lb);
    let _ = std::fs::remove_dir_all(&dir);
}
