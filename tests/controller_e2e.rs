//! `sluice-controller` end to end, in network namespaces
//! (scripts/topology.sh): the fake API server (`sluice-fake-apiserver`)
//! serves a directory of manifests holding a Gateway, a Service, an
//! L34Route and three Pod objects whose Multus network-status puts them on
//! the backends' addresses; `sluice-controller` writes the Service's
//! EndpointSlice from them; `sluice run` serves what the slice says.
//!
//! - real TCP connections to the VIP complete, each backend taking a share;
//! - deleting one Pod object moves only its flows: the controller drops it
//!   from the slice, long-lived connections to the others keep their
//!   backend, new ones avoid the deleted one;
//! - the controller stops cleanly on SIGTERM; no namespace is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::Duration;

use sluice_tests::topology::{root, stop_cleanly, Topology};
use sluice_tests::{privileged, sluice_bin, tool_bin, wait_until, Proc};

const NS: &str = "tenant-ctrl";
const GATEWAY: &str = "sllb-ctrl";

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
  name: sllb-ctrl
spec:
  gatewayClassName: meridio-experiment/stateless-load-balancer
  listeners:
  - name: all
    port: 4000
    protocol: TCP
  infrastructure:
    annotations:
      k8s.v1.cni.cncf.io/networks: '[{\"name\":\"backends\",\"interface\":\"net1\"}]'
      meridio-experiment/networks: '[{\"name\":\"backends\",\"interface\":\"net1\"}]'
      meridio-experiment/network-subnets: '[\"10.200.0.0/24\"]'
";

const SERVICE_YAML: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: web
  labels:
    service.kubernetes.io/service-proxy-name: sllb-ctrl
  annotations:
    service.cilium.io/lb-algorithm: maglev
spec:
  clusterIP: None
  selector:
    app: web
    meridio-experiment/dummy-service-selector: \"true\"
---
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: L34Route
metadata:
  name: web-tcp
spec:
  parentRefs:
  - name: sllb-ctrl
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

/// Pod `be{i}`, on the backends' network at 10.200.0.1{i}.
fn pod_yaml(i: u32) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: be{i}
  creationTimestamp: \"2025-01-01T00:00:0{i}Z\"
  labels: {{app: web}}
  annotations:
    k8s.v1.cni.cncf.io/network-status: '[{{\"name\": \"cbr0\", \"interface\": \"eth0\", \"ips\": [\"10.244.0.{i}\"], \"default\": true}}, {{\"name\": \"{NS}/backends\", \"interface\": \"net1\", \"ips\": [\"10.200.0.1{i}\"]}}]'
spec:
  containers: [{{name: web, image: example}}]
status:
  phase: Running
  conditions: [{{type: Ready, status: \"True\"}}]
"
    )
}

/// The demo configuration without its inline services and routes, taking
/// them from the Kubernetes API instead.
fn appliance_config(prefix: &str) -> String {
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let cut = demo.find("\nservices:\n").expect("configs/demo.yaml has inline services");
    let end = demo[..cut].rfind("\n# One source of services").unwrap_or(cut);
    format!(
        "{}\nkubernetes:\n  gateway: {GATEWAY}\n  namespace: {NS}\n  kubeconfig: kubeconfig\n",
        demo[..end].replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}"))
    )
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn deleting_a_backend_pod_moves_only_its_traffic() {
    privileged();
    let prefix = format!("kc{}", std::process::id());
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&["20.0.0.1", "20.0.0.2"]);

    let dir = TempDir(std::env::temp_dir().join(format!("sluice-{prefix}")));
    let _ = std::fs::remove_dir_all(&dir.0);
    let manifests = dir.0.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    std::fs::write(manifests.join("gateway.yaml"), GATEWAY_YAML).unwrap();
    std::fs::write(manifests.join("service.yaml"), SERVICE_YAML).unwrap();
    for i in 1..=3 {
        std::fs::write(manifests.join(format!("pod-be{i}.yaml")), pod_yaml(i)).unwrap();
    }

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
    let controller_bin = tool_bin("sluice-controller");
    let mut controller = topo.spawn(
        "lb",
        &[
            controller_bin.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            NS,
            "--lease-namespace",
            NS,
            "--identity",
            "e2e",
        ],
    );

    // The controller's slice, as the API server holds it.
    let slice = |t: &Topology| t.json("lb", &["curl", "-sf", &format!("{server}/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices/web-sluice-v4")]);
    let ids = |t: &Topology| slice(t)["metadata"]["annotations"]["sluice.io/endpoint-ids"].as_str().map(str::to_owned).unwrap_or_default();
    if !wait_until(Duration::from_secs(30), || ids(&topo) == r#"{"10.200.0.11":0,"10.200.0.12":1,"10.200.0.13":2}"#) {
        let (code, out, err) = controller.stop("TERM", Duration::from_secs(5));
        panic!("the controller did not write the slice ({}) (exit {code:?}):\n{out}\n{err}", slice(&topo));
    }

    let cfg = dir.0.join("appliance.yaml");
    std::fs::write(&cfg, appliance_config(&prefix)).unwrap();
    let bin = sluice_bin();
    let mut lb: Proc = topo.spawn("lb", &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let ready = wait_until(Duration::from_secs(45), || {
        topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 3 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not serve the controller's slice (exit {code:?}):\n{out}\n{err}\n{}", topo.status());
    }

    // Real TCP connections, spread over the three pods' addresses.
    let counts = topo.client(&["short", "20.0.0.1", "300", "16"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    for b in ["be1", "be2", "be3"] {
        let n = counts.get(b).copied().unwrap_or(0);
        assert!(n >= 60, "{b} got {n} of 300 connections: {counts:?}");
    }

    // Long-lived connections; then the Pod object be2 is deleted.
    let held = topo.hold("20.0.0.1", &dir.0.join("hold.json"));
    std::fs::remove_file(manifests.join("pod-be2.yaml")).unwrap();
    assert!(
        wait_until(Duration::from_secs(20), || ids(&topo) == r#"{"10.200.0.11":0,"10.200.0.13":2}"#),
        "the controller dropped the deleted pod only, the others keep their identifiers: {}",
        slice(&topo)
    );
    assert!(
        wait_until(Duration::from_secs(20), || topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 2)),
        "the appliance follows the slice: {}",
        topo.status()
    );
    held.only_moved("be2");
    let after = topo.client(&["short", "20.0.0.1", "120", "16"]);
    assert_eq!(after.get("failed"), None, "{after:?}");
    assert_eq!(after.get("be2"), None, "no new connection to the deleted pod: {after:?}");
    assert!(after.contains_key("be1") && after.contains_key("be3"), "{after:?}");

    let (code, _out, err) = controller.stop("TERM", Duration::from_secs(10));
    assert_eq!(code, Some(0), "the controller stops cleanly on SIGTERM:\n{err}");
    assert!(err.contains("Lease released"), "{err}");
    stop_cleanly(&mut lb);
    let _ = api.stop("TERM", Duration::from_secs(5));
    topo.remove();
}
