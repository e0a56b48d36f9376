//! xDS end to end, in network namespaces (scripts/topology.sh with IPV6=1):
//! the test management server (`sluice-xds-server`, in the appliance's
//! namespace) drives `sluice run`, and real TCP connections to an IPv4 and
//! an IPv6 VIP follow the endpoints it announces:
//!
//! - add: a third endpoint starts taking new connections;
//! - weight change: an endpoint with weight 4 takes about 4/6 of them;
//! - DRAINING: established connections to the draining endpoint survive
//!   (the clusters remember flows), new ones avoid it;
//! - removal: only the removed endpoint's connections move, the others'
//!   survive;
//! - the server going away changes nothing in the data plane, and its
//!   return with the same resources rebuilds nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use sluice_tests::topology::{tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, tool_bin, wait_until, Proc};

const CONFIG: &str = r#"
dpdk: {lcores: "0,1", memoryMB: 512, hugepages: false, filePrefix: PREFIX, mbufs: 8191, descriptors: 512}
ports:
  - {name: front, device: "net_af_packet0,iface=lbf", addresses: [10.100.0.1/24, "fd00:100::1/64"], kernelInterface: sl-front}
  - {name: back, device: "net_af_packet1,iface=lbb", addresses: [10.200.0.1/24, "fd00:200::1/64"], kernelInterface: sl-back}
gateways:
  - {address: 10.100.0.2, port: front}
  - {address: "fd00:100::2", port: front}
xds-control-plane:
  enabled: true
  server-address: "127.0.0.1:18000"
  node-id: e2e
"#;

const CLA: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// An endpoint as the server announces it: backend number, weight, health.
#[derive(Clone, Copy)]
struct Ep(u8, u32, &'static str);

/// The resources: one cluster per family, each with the same endpoints.
fn resources(version: u32, eps: &[Ep]) -> String {
    let cluster = |name: &str, vip: &str| {
        json!({
            "name": name, "type": "EDS", "lb_policy": "MAGLEV",
            "eds_cluster_config": {"service_name": name},
            "metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": vip, "port": 80, "protocol": "TCP", "flowTable": true}}}
        })
    };
    let cla = |name: &str, six: bool| {
        let lb: Vec<Value> = eps
            .iter()
            .map(|Ep(n, w, h)| {
                let a = if six { format!("fd00:200::1{n}") } else { format!("10.200.0.1{n}") };
                json!({"endpoint": {"address": {"socket_address": {"address": a, "port_value": 80}}},
                       "load_balancing_weight": w, "health_status": h})
            })
            .collect();
        json!({"cluster_name": name, "endpoints": [{"lb_endpoints": lb}]})
    };
    json!({
        "version": format!("v{version}"),
        "clusters": [cluster("web4", "20.0.0.1"), cluster("web6", "fd00:20::1")],
        "assignments": [cla("web4", false), cla("web6", true)],
    })
    .to_string()
}

/// Replaces the file at once (the server never reads half of it).
fn publish(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

struct Rig {
    topo: Topology,
    dir: PathBuf,
    resources: PathBuf,
    lb: Proc,
    server: Option<Proc>,
    /// Servers started so far; the latest one's events file.
    starts: u32,
    events: PathBuf,
    version: u32,
}

impl Rig {
    fn status(&self) -> Value {
        self.topo.json("lb", &[sluice_bin().to_str().unwrap(), "status", "--json"])
    }

    /// Starts the server, its requests and responses going to a file of
    /// its own ([`Rig::events`]).
    fn start_server(&mut self) {
        let bin = tool_bin("sluice-xds-server");
        self.starts += 1;
        self.events = self.dir.join(format!("events-{}.jsonl", self.starts));
        let _ = std::fs::remove_file(&self.events);
        self.server = Some(self.topo.spawn(
            "lb",
            &[
                bin.to_str().unwrap(),
                "--listen",
                "127.0.0.1:18000",
                "--file",
                self.resources.to_str().unwrap(),
                "--events",
                self.events.to_str().unwrap(),
            ],
        ));
    }

    /// What the latest server received and sent so far (the lines it has
    /// written whole).
    fn events(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.events).unwrap_or_default();
        text.lines().map_while(|l| serde_json::from_str(l).ok()).collect()
    }

    fn fail(&mut self, what: &str) -> ! {
        let st = self.status();
        let (code, out, err) = self.lb.stop("INT", Duration::from_secs(10));
        let server = self.server.as_mut().map(|s| s.stop("INT", Duration::from_secs(5)));
        panic!("{what}\nstatus: {st}\nappliance (exit {code:?}):\n{out}\n{err}\nserver: {server:?}");
    }

    /// Publishes `eps` as the next version and waits until the appliance
    /// applied it.
    fn announce(&mut self, eps: &[Ep]) {
        self.version += 1;
        publish(&self.resources, &resources(self.version, eps));
        let want = format!("v{}", self.version);
        let applied = wait_until(Duration::from_secs(20), || {
            let st = self.status();
            st["xds"]["types"][CLA]["version"] == want.as_str()
        });
        if !applied {
            self.fail(&format!("version {want} was not applied"));
        }
    }

    fn short(&self, vip: &str, n: u32) -> HashMap<String, u64> {
        let counts = self.topo.client(&["short", vip, &n.to_string(), "8"]);
        assert_eq!(counts.get("failed"), None, "{vip}: {counts:?}");
        assert_eq!(counts.values().sum::<u64>(), u64::from(n), "{vip}: {counts:?}");
        counts
    }
}

fn get(c: &HashMap<String, u64>, b: &str) -> u64 {
    c.get(b).copied().unwrap_or(0)
}

fn held(path: &Path) -> HashMap<String, [u64; 2]> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn tcp_follows_what_the_management_server_announces() {
    privileged();
    let prefix = format!("xe{}", std::process::id());
    let topo = Topology::up_dual_stack(&prefix);
    let _backends = topo.backends(&["20.0.0.1", "fd00:20::1"]);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    std::fs::write(&cfg, CONFIG.replace("PREFIX", &prefix)).unwrap();
    let resources_file = dir.join("resources.json");
    let two = [Ep(1, 1, "HEALTHY"), Ep(2, 1, "HEALTHY")];
    publish(&resources_file, &resources(1, &two));
    let lb = topo.spawn("lb", &[sluice_bin().to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let mut rig = Rig { topo, dir, resources: resources_file, lb, server: None, starts: 0, events: PathBuf::new(), version: 1 };
    rig.start_server();

    // Initial sync: two endpoints per VIP.
    let ready = wait_until(Duration::from_secs(30), || {
        let st = rig.status();
        st["xds"]["state"] == "connected"
            && st["endpoints"].as_array().is_some_and(|e| e.len() == 4 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        rig.fail("the appliance did not serve the xDS endpoints");
    }
    for vip in ["20.0.0.1", "fd00:20::1"] {
        let c = rig.short(vip, 120);
        assert!(get(&c, "be1") >= 30 && get(&c, "be2") >= 30 && get(&c, "be3") == 0, "{vip}: {c:?}");
    }

    // Add: the third endpoint takes new connections.
    let three = [Ep(1, 1, "HEALTHY"), Ep(2, 1, "HEALTHY"), Ep(3, 1, "HEALTHY")];
    rig.announce(&three);
    for vip in ["20.0.0.1", "fd00:20::1"] {
        let c = rig.short(vip, 240);
        assert!(["be1", "be2", "be3"].iter().all(|b| get(&c, b) >= 40), "{vip}: all three take connections: {c:?}");
    }

    // Weight change: be1 at 4 of 6.
    let heavy = [Ep(1, 4, "HEALTHY"), Ep(2, 1, "HEALTHY"), Ep(3, 1, "HEALTHY")];
    rig.announce(&heavy);
    for vip in ["20.0.0.1", "fd00:20::1"] {
        let c = rig.short(vip, 300);
        let (b1, b2, b3) = (get(&c, "be1"), get(&c, "be2"), get(&c, "be3"));
        assert!(b1 > 2 * b2 && b1 > 2 * b3 && b2 > 0 && b3 > 0, "{vip}: weight 4 of 6 for be1: {c:?}");
    }

    // Long-lived connections on both VIPs; then be3 drains, then be2 leaves.
    let outs: Vec<(&str, PathBuf)> = [("20.0.0.1", "hold4.json"), ("fd00:20::1", "hold6.json")]
        .into_iter()
        .map(|(vip, f)| (vip, rig.dir.join(f)))
        .collect();
    let _holds: Vec<Proc> = outs.iter().map(|(vip, out)| rig.topo.hold_for(vip, 48, 25, out)).collect();
    let opened = wait_until(Duration::from_secs(20), || {
        outs.iter().all(|(_, o)| PathBuf::from(format!("{}.ready", o.display())).exists())
    });
    assert!(opened, "long-lived connections opened");
    let draining = [Ep(1, 4, "HEALTHY"), Ep(2, 1, "HEALTHY"), Ep(3, 1, "DRAINING")];
    rig.announce(&draining);
    for vip in ["20.0.0.1", "fd00:20::1"] {
        let c = rig.short(vip, 120);
        assert_eq!(get(&c, "be3"), 0, "{vip}: no new connection to the draining endpoint: {c:?}");
    }
    let generation = rig.status()["generation"].as_u64().unwrap();
    let removed = [Ep(1, 4, "HEALTHY"), Ep(3, 1, "DRAINING")];
    rig.announce(&removed);
    assert!(rig.status()["generation"].as_u64().unwrap() > generation);
    assert!(wait_until(Duration::from_secs(40), || outs.iter().all(|(_, o)| o.exists())), "long-lived connections finished");
    for (vip, out) in &outs {
        let h = held(out);
        let [ok3, broken3] = h.get("be3").copied().unwrap_or_else(|| panic!("{vip}: no connection landed on be3: {h:?}"));
        assert!(ok3 > 0 && broken3 == 0, "{vip}: connections to the draining endpoint survive: {h:?}");
        let [ok1, broken1] = h["be1"];
        assert!(ok1 > 0 && broken1 == 0, "{vip}: connections to be1 survive: {h:?}");
        let [ok2, broken2] = h.get("be2").copied().unwrap_or_else(|| panic!("{vip}: no connection landed on be2, so none could move: {h:?}"));
        assert!(ok2 == 0 && broken2 > 0, "{vip}: the removed endpoint's connections moved: {h:?}");
    }

    // The server goes away: nothing changes in the data plane.
    let before = rig.status();
    let (_code, _out, _err) = rig.server.take().unwrap().stop("INT", Duration::from_secs(5));
    assert!(
        wait_until(Duration::from_secs(15), || rig.status()["xds"]["state"] != "connected"),
        "the appliance noticed the server left"
    );
    for vip in ["20.0.0.1", "fd00:20::1"] {
        let c = rig.short(vip, 60);
        assert_eq!(get(&c, "be1"), 60, "{vip}: only be1 takes new connections, as before: {c:?}");
    }
    assert!(rig.status()["xds"]["last_error"].is_string(), "the lost connection is reported");
    // It comes back with the same resources: reconnect, no rebuild.
    rig.start_server();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let st = rig.status();
            st["xds"]["state"] == "connected" && st["xds"]["reconnects"].as_u64() > Some(0)
        }),
        "reconnected"
    );
    // The reconnected client's requests for both types are the event to
    // wait for (the server may answer with nothing: the client holds its
    // version), and any response sent must have been acknowledged (applied
    // or refused) before the generation is compared.
    let mut events = Vec::new();
    let settled = wait_until(Duration::from_secs(30), || {
        events = rig.events();
        let requested = |t: &str| events.iter().any(|e| e["event"] == "request" && e["type_url"] == t && e["node"] == "e2e");
        let acknowledged = |nonce: &Value| {
            events.iter().any(|e| e["event"] == "request" && e["nonce"] == *nonce && (e["kind"] == "ack" || e["kind"] == "nack"))
        };
        requested(CLUSTER) && requested(CLA) && events.iter().filter(|e| e["event"] == "response").all(|r| acknowledged(&r["nonce"]))
    });
    if !settled {
        rig.fail(&format!("the reconnected client's requests did not reach the server, or a response was not acknowledged: {events:?}"));
    }
    let holding = format!("v{}", rig.version);
    let requests: Vec<&Value> = events.iter().filter(|e| e["event"] == "request").collect();
    assert!(requests.iter().all(|e| e["version"] == holding.as_str()), "the client asked holding version {holding}: {events:?}");
    let after = rig.status();
    assert_eq!(after["generation"], before["generation"], "an unchanged state rebuilds nothing");

    let (code, _, err) = rig.lb.stop("INT", Duration::from_secs(20));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("mbufs_in_use=0"), "{err}");
    let dir = rig.dir.clone();
    drop(rig);
    let _ = std::fs::remove_dir_all(&dir);
}
