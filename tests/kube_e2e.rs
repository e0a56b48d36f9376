//! The Kubernetes source end to end, in network namespaces
//! (scripts/topology.sh): `sluice run` on af_packet ports takes its
//! services from the Kubernetes API instead of its file. The API is the
//! fake API server (`sluice-fake-apiserver`, the test's own), run in the
//! appliance's namespace, serving a directory of manifests the test edits,
//! reached through the kubeconfig it writes.
//!
//! - real TCP connections to the VIP of the L34Route complete, each
//!   backend of the EndpointSlice taking a share; the Gateway's status
//!   lists the VIP;
//! - an endpoint leaving the EndpointSlice moves only its flows:
//!   long-lived connections to the others survive, those to an endpoint
//!   turned terminating-but-serving (DRAINING) in the same change included,
//!   and new connections avoid both;
//! - with `siblings.kubernetesPods`, the siblings are the other pods of the
//!   Gateway's Deployment (its own pod and another Gateway's left out),
//!   followed as pods come and go;
//! - the API server going away leaves traffic flowing to what was served,
//!   and `sluice status` (and `/status`, `/metrics`) says the source is not
//!   connected, with the last error;
//! - SIGINT stops the appliance cleanly; no namespace is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use sluice_tests::topology::{root, stop_cleanly, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

const NS: &str = "tenant-e2e";
const GATEWAY: &str = "sllb-e2e";

/// A directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const GATEWAY_YAML: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: sllb-e2e
spec:
  gatewayClassName: meridio-experiment/stateless-load-balancer
  listeners:
  - name: all
    port: 4000
    protocol: TCP
";

const SERVICE_YAML: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: web
  labels:
    service.kubernetes.io/service-proxy-name: sllb-e2e
  annotations:
    service.cilium.io/lb-algorithm: maglev
spec:
  clusterIP: None
";

const ROUTE_YAML: &str = "\
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: L34Route
metadata:
  name: web-tcp
spec:
  parentRefs:
  - name: sllb-e2e
  backendRefs:
  - name: web
    port: 1
  priority: 10
  destinationCIDRs:
  - 20.0.0.1/32
  destinationPorts:
  - \"80\"
  protocols:
  - TCP
";

const SLICE_YAML: &str = "\
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-x7k2p
  labels:
    kubernetes.io/service-name: web
  annotations:
    sluice.io/endpoint-ids: '{\"10.200.0.11\": 0, \"10.200.0.12\": 1, \"10.200.0.13\": 2}'
addressType: IPv4
endpoints:
- addresses: [10.200.0.11]
  conditions: {ready: true}
- addresses: [10.200.0.12]
  conditions: {ready: true}
- addresses: [10.200.0.13]
  conditions: {ready: true}
";

/// The demo configuration without its inline services and routes, taking
/// them from the Kubernetes API instead, with the other pods of the
/// Gateway's Deployment as siblings.
fn appliance_config(prefix: &str) -> String {
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let cut = demo.find("\nservices:\n").expect("configs/demo.yaml has inline services");
    let end = demo[..cut].rfind("\n# One source of services").unwrap_or(cut);
    format!(
        "{}\nkubernetes:\n  gateway: {GATEWAY}\n  namespace: {NS}\n  kubeconfig: kubeconfig\n\
         siblings:\n  listen: {SYNC_LISTEN}\n  kubernetesPods: true\n  keyFile: sync.key\n  startupWaitMs: 2000\n",
        demo[..end].replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"))
    )
}

/// Where the appliance listens for its siblings (in its namespace).
const SYNC_LISTEN: &str = "127.0.0.1:7946";

/// A pod of Gateway `gateway`'s Deployment at `ip`.
fn pod_yaml(name: &str, gateway: &str, ip: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    sluice.io/gateway: {gateway}\n\
         spec:\n  containers: [{{name: lb, image: sluice}}]\nstatus:\n  phase: Running\n  podIP: {ip}\n  podIPs: [{{ip: {ip}}}]\n"
    )
}

/// The addresses of the siblings `/status` shows.
fn sibling_addresses(st: &serde_json::Value) -> Vec<String> {
    st["sync"]["peers"].as_array().into_iter().flatten().map(|p| p["address"].as_str().unwrap_or("").to_owned()).collect()
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn endpointslice_changes_move_real_traffic_and_losing_the_api_keeps_it_flowing() {
    privileged();
    let prefix = format!("ke{}", std::process::id());
    let topo = Topology::up(&prefix);
    let backend = root().join("scripts/backend.py");
    let _backends: Vec<Proc> = (1..=3)
        .map(|i| topo.spawn(&format!("be{i}"), &["python3", backend.to_str().unwrap(), &format!("be{i}"), "20.0.0.1", "20.0.0.2"]))
        .collect();

    let dir = TempDir(std::env::temp_dir().join(format!("sluice-{prefix}")));
    let _ = std::fs::remove_dir_all(&dir.0);
    let manifests = dir.0.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for (file, text) in [("gateway.yaml", GATEWAY_YAML), ("service.yaml", SERVICE_YAML), ("route.yaml", ROUTE_YAML), ("slice.yaml", SLICE_YAML)] {
        std::fs::write(manifests.join(file), text).unwrap();
    }
    // The Deployment's pods: this appliance's own (its listen address),
    // another one, and a pod of another Gateway.
    for (file, name, gateway, ip) in [("pod-self.yaml", "lb-self", GATEWAY, "127.0.0.1"), ("pod-other.yaml", "lb-other", GATEWAY, "127.0.0.2"), ("pod-elsewhere.yaml", "lb-x", "sllb-x", "127.0.0.3")] {
        std::fs::write(manifests.join(file), pod_yaml(name, gateway, ip)).unwrap();
    }
    std::fs::write(dir.0.join("sync.key"), "0123456789abcdef0123456789abcdef\n").unwrap();

    // The API server, in the appliance's namespace (on its loopback, a port
    // of its choosing), and the kubeconfig reaching it.
    let kubeconfig = dir.0.join("kubeconfig");
    let mut api = topo.spawn(
        "lb",
        &[
            env!("CARGO_BIN_EXE_sluice-fake-apiserver"),
            "--dir",
            manifests.to_str().unwrap(),
            "--namespace",
            NS,
            "--kubeconfig-out",
            kubeconfig.to_str().unwrap(),
        ],
    );
    let written = || std::fs::read_to_string(&kubeconfig).is_ok_and(|t| t.contains("current-context"));
    if !wait_until(Duration::from_secs(20), written) {
        let (code, out, err) = api.stop("TERM", Duration::from_secs(5));
        panic!("the fake API server did not start (exit {code:?}):\n{out}\n{err}");
    }
    let kc = std::fs::read_to_string(&kubeconfig).unwrap();
    let server = kc.split("server: \"").nth(1).and_then(|r| r.split('"').next()).expect("a server in the kubeconfig").to_owned();

    let cfg = dir.0.join("appliance.yaml");
    std::fs::write(&cfg, appliance_config(&prefix)).unwrap();
    let bin = sluice_bin();
    let check = Command::new(&bin).args(["check", "--config", cfg.to_str().unwrap()]).output().unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{said}{}", String::from_utf8_lossy(&check.stderr));
    assert!(said.contains(&format!("Kubernetes: services also from Gateway {NS}/{GATEWAY}")), "{said}");
    assert!(said.contains("siblings: listening on 127.0.0.1:7946, sharing pins with the other pods of the Gateway's Deployment"), "{said}");
    let mut lb = topo.spawn("lb", &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);

    let ready = wait_until(Duration::from_secs(45), || {
        topo.output("lb", &[bin.to_str().unwrap(), "status", "--json"]).status.success()
            && topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 3 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not serve the Kubernetes objects (exit {code:?}):\n{out}\n{err}");
    }
    let st = topo.status();
    let k = &st["kubernetes"];
    assert_eq!(k["connected"], true, "{k}");
    assert_eq!(k["synced"], true, "{k}");
    assert_eq!(k["watched"]["EndpointSlice"], 1, "{k}");
    assert_eq!(k["watched"]["L34Route"], 1, "{k}");
    assert_eq!(st["sources"]["kubernetes"]["accepted"], true, "{st}");

    // Its siblings are the Deployment's other pods: lb-other (nobody
    // answers there), not itself, not the other Gateway's pod; then
    // lb-other goes and lb-third comes.
    assert!(
        wait_until(Duration::from_secs(20), || { let st = topo.status(); sibling_addresses(&st) == ["127.0.0.2:7946"] && st["sync"]["settled"] == true }),
        "the siblings from the pods: {}",
        topo.status()["sync"]
    );
    std::fs::remove_file(manifests.join("pod-other.yaml")).unwrap();
    std::fs::write(manifests.join("pod-third.yaml"), pod_yaml("lb-third", GATEWAY, "127.0.0.4")).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || sibling_addresses(&topo.status()) == ["127.0.0.4:7946"]),
        "the siblings follow the pods: {}",
        topo.status()["sync"]
    );
    let text = String::from_utf8(topo.output("lb", &[bin.to_str().unwrap(), "status"]).stdout).unwrap();
    assert!(text.contains("127.0.0.4:7946"), "`sluice status` shows the sibling: {text}");

    // A connection without the key is refused and counted; the workers
    // drop nothing for it (their drops are the same after the traffic below).
    let drops_before = topo.status()["drops"].clone();
    // The appliance closes on it, with a reset when it left bytes unread.
    let garbage = "import socket\ns = socket.create_connection(('127.0.0.1', 7946), timeout=5)\ns.sendall(b'x' * 64)\ntry:\n    s.recv(100)\nexcept ConnectionResetError:\n    pass\n";
    let out = topo.output("lb", &["python3", "-c", garbage]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        wait_until(Duration::from_secs(10), || topo.status()["sync"]["refused"].as_u64().unwrap_or(0) >= 1),
        "the keyless connection is counted: {}",
        topo.status()["sync"]
    );

    // The appliance's status on the Gateway, as the API server holds it.
    let gateways = |t: &Topology| t.json("lb", &["curl", "-sf", &format!("{server}/apis/gateway.networking.k8s.io/v1/namespaces/{NS}/gateways")]);
    assert!(
        wait_until(Duration::from_secs(20), || gateways(&topo)["items"][0]["status"]["addresses"] == serde_json::json!([{"type": "IPAddress", "value": "20.0.0.1"}])),
        "the Gateway's status lists the VIP: {}",
        gateways(&topo)
    );

    // Real TCP connections, all complete, spread over the slice's endpoints.
    let counts = topo.client(&["short", "20.0.0.1", "300", "16"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    for b in ["be1", "be2", "be3"] {
        let n = counts.get(b).copied().unwrap_or(0);
        assert!(n >= 60, "{b} got {n} of 300 connections: {counts:?}");
    }
    assert_eq!(topo.status()["drops"], drops_before, "no worker drop moved for the refused sibling nor the traffic");

    // Long-lived connections; then 10.200.0.13 (be3) leaves the
    // EndpointSlice and 10.200.0.12 (be2) is terminating but still serving:
    // DRAINING, so its connections stay and new ones avoid it.
    let held = topo.hold("20.0.0.1", &dir.0.join("hold.json"));
    let generation = topo.status()["generation"].as_u64().unwrap();
    let without_be3 = SLICE_YAML.replacen("- addresses: [10.200.0.13]\n  conditions: {ready: true}\n", "", 1).replacen(
        "- addresses: [10.200.0.12]\n  conditions: {ready: true}\n",
        "- addresses: [10.200.0.12]\n  conditions: {ready: false, serving: true, terminating: true}\n",
        1,
    );
    assert_eq!(without_be3.matches("terminating: true").count(), 1, "{without_be3}");
    std::fs::write(manifests.join("slice.yaml"), &without_be3).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || topo.status()["generation"].as_u64().unwrap() > generation),
        "the EndpointSlice change came through the watch"
    );
    let st = topo.status();
    assert_eq!(st["sources"]["kubernetes"]["accepted"], true, "{st}");
    assert_eq!(st["sources"]["kubernetes"]["rebuilt"], serde_json::json!(["web"]), "only the changed service was rebuilt");
    assert_eq!(st["endpoints"].as_array().unwrap().len(), 2, "{st}");

    let states: Vec<(String, String)> = st["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["address"].as_str().unwrap_or("").to_owned(), e["state"].as_str().unwrap_or("").to_owned()))
        .collect();
    assert!(states.contains(&("10.200.0.12".to_owned(), "draining".to_owned())), "be2 drains: {states:?}");

    // be2's connections survive (only_moved checks every backend but be3).
    held.only_moved("be3");
    let after = topo.client(&["short", "20.0.0.1", "120", "16"]);
    assert_eq!(after.get("failed"), None, "{after:?}");
    assert_eq!(after.get("be3"), None, "no new connection to the removed endpoint: {after:?}");
    assert_eq!(after.get("be2"), None, "no new connection to the draining endpoint: {after:?}");

    // The API server goes away: the source says so, nothing is flushed.
    let (_, _, api_err) = api.stop("TERM", Duration::from_secs(10));
    assert!(
        wait_until(Duration::from_secs(20), || topo.status()["kubernetes"]["connected"] == false),
        "the source noticed the API server is gone: {}\n{api_err}",
        topo.status()["kubernetes"]
    );
    let st = topo.status();
    let last_error = st["kubernetes"]["last_error"].as_str().unwrap_or("").to_owned();
    assert!(!last_error.is_empty(), "{}", st["kubernetes"]);
    assert_eq!(st["endpoints"].as_array().unwrap().len(), 2, "what was served stays: {st}");
    let text = String::from_utf8(topo.output("lb", &[bin.to_str().unwrap(), "status"]).stdout).unwrap();
    assert!(text.contains(&format!("kubernetes: Gateway {NS}/{GATEWAY} | NOT CONNECTED")), "{text}");
    assert!(text.contains("  last error at "), "{text}");
    let still = topo.client(&["short", "20.0.0.1", "120", "16"]);
    assert_eq!(still.get("failed"), None, "traffic keeps flowing without the API: {still:?}");
    assert_eq!(still.get("be3"), None, "{still:?}");
    assert_eq!(still.values().sum::<u64>(), 120);

    let metrics = String::from_utf8(topo.output("lb", &["curl", "-sf", "127.0.0.1:9091/metrics"]).stdout).unwrap();
    for line in ["sluice_kube_connected{} 0", "sluice_kube_synced{} 1", "sluice_kube_objects_watched{kind=\"EndpointSlice\"} 1"] {
        assert!(metrics.lines().any(|l| l == line), "{line} in:\n{metrics}");
    }
    let writes: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("sluice_kube_status_writes_total{} "))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(writes >= 2, "the Gateway's and the route's status were written: {writes}");

    stop_cleanly(&mut lb);
    topo.remove();
}
