//! The walk-through of a newcomer, as far as a test can go: install the
//! Debian package (`scripts/package.sh`), configure one VIP with two
//! backends from the configuration reference alone, send traffic and see it
//! on the installed dashboard's panels through a real Prometheus:
//!
//! - it builds, and `dpkg -i` installs it: the binaries in `/usr/bin`, the
//!   systemd unit (which `systemd-analyze verify` finds nothing to say
//!   about), the hugepages drop-in, the default configuration (which
//!   `sluice check` accepts), the CRDs, the dashboard and the rules;
//! - `/usr/bin/sluice`, configured with the first example of
//!   `docs/configuration.md` (one VIP, two backends; the README shows the
//!   same), passes real TCP connections in the demo's network namespaces
//!   with only the capabilities the unit's `CapabilityBoundingSet` leaves
//!   it (`setpriv --bounding-set`);
//! - Prometheus scraping it answers the installed dashboard's queries with
//!   that traffic: packets per service and endpoint, and the flow table
//!   holding the connections' pins;
//! - `dpkg -r` removes the binaries and keeps the edited configuration;
//!   `dpkg -P` removes the rest.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use sluice_tests::topology::{root, stop_cleanly, tempdir, Topology};
use sluice_tests::prometheus::{self, as_sent, panel_query, query, values_by};
use sluice_tests::{privileged, sluice_bin, wait_until};

fn run(cmd: &[&str]) -> Output {
    Command::new(cmd[0]).args(&cmd[1..]).output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn ok(cmd: &[&str]) -> String {
    let out = run(cmd);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{cmd:?}:\n{text}");
    text
}

fn installed() -> bool {
    run(&["dpkg-query", "-W", "-f=${Status}", "sluice"]).stdout.starts_with(b"install ok")
}

/// The first YAML example after `heading` in the file at `path` (from the
/// repository's top).
fn example(path: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let section = &text[text.find(heading).unwrap_or_else(|| panic!("{path}: no {heading:?}"))..];
    let start = section.find("```yaml\n").expect("a YAML example") + "```yaml\n".len();
    section[start..start + section[start..].find("```").unwrap()].to_owned()
}

/// Purges the package however the test ends.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = run(&["dpkg", "-P", "sluice"]);
    }
}

/// The capabilities of the unit's `CapabilityBoundingSet`, as `setpriv`
/// takes them: `-all,+net_admin,...`.
fn bounding_set(unit: &str) -> String {
    let caps = unit.lines().find_map(|l| l.strip_prefix("CapabilityBoundingSet=")).expect("the unit sets CapabilityBoundingSet");
    let ambient = unit.lines().find_map(|l| l.strip_prefix("AmbientCapabilities=")).expect("the unit sets AmbientCapabilities");
    assert_eq!(caps, ambient, "the ambient set is the bounding set");
    let mut s = "-all".to_owned();
    for c in caps.split_whitespace() {
        s.push_str(",+");
        s.push_str(&c.strip_prefix("CAP_").expect("CAP_ names").to_lowercase());
    }
    s
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: dpkg, network namespaces and DPDK")]
fn a_newcomer_installs_the_package_configures_from_the_reference_and_sees_traffic_on_the_dashboard() {
    privileged();
    assert!(!installed(), "a sluice package is installed on this machine: this test installs and purges its own");
    let prefix = format!("pk{}", std::process::id());
    let dir = tempdir(&prefix);
    let bin_dir = sluice_bin().parent().unwrap().to_owned();
    let built = Command::new(root().join("scripts/package.sh")).arg(&dir).env("BIN_DIR", &bin_dir).output().unwrap();
    assert!(built.status.success(), "scripts/package.sh:\n{}", String::from_utf8_lossy(&built.stderr));
    let deb = String::from_utf8(built.stdout).unwrap().trim().to_owned();
    assert!(deb.ends_with(".deb") && Path::new(&deb).exists(), "{deb}");

    let _purge = Purge;
    ok(&["dpkg", "-i", &deb]);
    assert!(installed());
    for f in [
        "/usr/bin/sluice",
        "/usr/bin/sluice-controller",
        "/lib/systemd/system/sluice.service",
        "/usr/lib/sysctl.d/60-sluice-hugepages.conf",
        "/etc/sluice/sluice.yaml",
        "/usr/share/sluice/crds/l34routes.yaml",
        "/usr/share/sluice/monitoring/sluice-dashboard.json",
        "/usr/share/sluice/monitoring/sluice-rules.yaml",
    ] {
        assert!(Path::new(f).exists(), "{f} installed");
    }
    assert!(ok(&["/usr/bin/sluice", "--version"]).contains(env!("CARGO_PKG_VERSION")));
    let verify = run(&["systemd-analyze", "verify", "/lib/systemd/system/sluice.service"]);
    let said = format!("{}{}", String::from_utf8_lossy(&verify.stdout), String::from_utf8_lossy(&verify.stderr));
    assert!(verify.status.success() && said.trim().is_empty(), "systemd-analyze verify:\n{said}");
    ok(&["/usr/bin/sluice", "check", "--config", "/etc/sluice/sluice.yaml"]);

    // The installed binary, the installed configuration, the unit's capabilities.
    let unit = std::fs::read_to_string("/lib/systemd/system/sluice.service").unwrap();
    let caps = bounding_set(&unit);
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&["20.0.0.1"]);
    topo.backends_listen(&[80], &[]);
    let installed_cfg = std::fs::read_to_string("/etc/sluice/sluice.yaml").unwrap();
    let cfg = dir.join("sluice.yaml");
    let reference = example("docs/configuration.md", "\n### One VIP, two backends");
    assert_eq!(example("README.md", "\n## Configure"), reference, "the README shows the reference's first example");
    let example = reference.replace("iface=eth1", "iface=lbf").replace("iface=eth2", "iface=lbb").replace("filePrefix: sluice}", &format!("filePrefix: {prefix}}}"));
    assert!(example.contains("iface=lbf") && example.contains(&prefix), "the reference's example moved:\n{example}");
    std::fs::write(&cfg, example).unwrap();
    let mut lb = topo.spawn("lb", &["setpriv", "--bounding-set", &caps, "--", "/usr/bin/sluice", "run", "--config", cfg.to_str().unwrap()]);
    let ready = wait_until(Duration::from_secs(30), || {
        let out = topo.output("lb", &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "127.0.0.1:9091/readyz"]);
        out.stdout == b"200"
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("/usr/bin/sluice with {caps} did not become ready (exit {code:?}):\n{out}\n{err}");
    }
    // Prometheus scrapes it from before the traffic, as it would.
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("/usr/share/sluice/monitoring/sluice-dashboard.json").unwrap()).unwrap();
    let mut prometheus = prometheus::start(&topo, &dir, Some(Path::new("/usr/share/sluice/monitoring/sluice-rules.yaml")));
    let counts = topo.client(&["short", "20.0.0.1", "150", "8"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    assert_eq!(counts.values().sum::<u64>(), 150, "{counts:?}");
    assert!(["be1", "be2"].iter().all(|b| counts.get(*b).is_some_and(|n| *n > 0)), "both backends take connections: {counts:?}");
    assert_eq!(counts.get("be3"), None, "be3 is not in the example: {counts:?}");

    // The installed dashboard, through Prometheus: the traffic per service
    // and per endpoint, and the flow table holding the connections' pins
    // (closed connections stay pinned for flowTable.tcpClosingSeconds).
    let panel = |title: &str, label: &str| {
        let q = as_sent(&panel_query(&dashboard, title));
        query(&topo, &q).map(|d| values_by(&d, label)).unwrap_or_else(|e| panic!("{title}: {e}"))
    };
    let shown = wait_until(Duration::from_secs(20), || {
        let web = panel("Packets per service", "service");
        let endpoints = panel("Packets per endpoint", "address");
        let flows = panel("Flow table use", "worker");
        web.iter().any(|(s, v)| s == "web" && *v > 0.0)
            && ["10.200.0.11", "10.200.0.12"].iter().all(|a| endpoints.iter().any(|(e, v)| e == a && *v > 0.0))
            && flows.iter().any(|(_, v)| *v > 0.0)
    });
    assert!(
        shown,
        "the dashboard shows the traffic: per service {:?}, per endpoint {:?}, flow table use {:?}",
        panel("Packets per service", "service"),
        panel("Packets per endpoint", "address"),
        panel("Flow table use", "worker")
    );
    // The gauge is a census that walks the table a few buckets a poll
    // round and publishes each whole pass: a pass that began while the
    // connections were being made counts only some of them, the next
    // counts them all.
    let entries = || query(&topo, "sum(sluice_worker_flow_entries)").map(|d| values_by(&d, "")).unwrap();
    let pinned = wait_until(Duration::from_secs(20), || entries().first().is_some_and(|(_, v)| *v >= 150.0));
    assert!(pinned, "150 connections' pins: {:?}", entries());
    let _ = prometheus.stop("TERM", Duration::from_secs(10));
    stop_cleanly(&mut lb);
    topo.remove();

    // Remove: the binaries go, the edited configuration stays; purge: it goes too.
    std::fs::write("/etc/sluice/sluice.yaml", format!("{installed_cfg}\n# edited\n")).unwrap();
    ok(&["dpkg", "-r", "sluice"]);
    assert!(!Path::new("/usr/bin/sluice").exists() && !Path::new("/lib/systemd/system/sluice.service").exists());
    assert!(Path::new("/etc/sluice/sluice.yaml").exists(), "dpkg -r keeps a conffile");
    ok(&["dpkg", "-P", "sluice"]);
    assert!(!Path::new("/etc/sluice/sluice.yaml").exists(), "dpkg -P removes it");
    let _ = std::fs::remove_dir_all(&dir);
}
