//! The alerting rules and the Grafana dashboard in `configs/monitoring/`,
//! checked with Debian's Prometheus (Grafana itself is not available here):
//!
//! - `promtool check rules` passes, and so do the rules' unit tests
//!   (`promtool test rules`: each alert fires on what should raise it and
//!   stays quiet on its near miss);
//! - the dashboard is JSON with a `schemaVersion` and queries in
//!   `panels[].targets[].expr`;
//! - a real Prometheus scrapes a running appliance that has every source
//!   and subsystem set (file, xDS, Kubernetes, BIRD with a gateway router,
//!   siblings, passive health and an active check, the latency histogram;
//!   the remote peers do not answer, so their metrics show them down), with
//!   the rules loaded. Every dashboard query and every rule runs over that
//!   data without error, and names only metrics the live `/metrics`
//!   exports (a family declared there, with or without samples yet);
//! - the traffic the test sends shows on the dashboard's traffic panels,
//!   and in the last minute `/status` and `sluice status` report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use sluice_tests::topology::{root, stop_cleanly, tempdir, Topology};
use sluice_tests::prometheus::{self, as_sent, dashboard_queries, query};
use sluice_tests::{privileged, sluice_bin, wait_until};

fn monitoring() -> PathBuf {
    root().join("configs/monitoring")
}

fn promtool(args: &[&str], dir: &Path) -> String {
    let out = Command::new("promtool").args(args).current_dir(dir).output().expect("promtool (Debian's prometheus package; scripts/setup.sh installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

#[test]
fn promtool_passes_the_rules_and_their_unit_tests() {
    let dir = monitoring();
    let checked = promtool(&["check", "rules", "sluice-rules.yaml"], &dir);
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = promtool(&["test", "rules", "sluice-rules.test.yaml"], &dir);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// The metric names (`sluice_...`) an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("sluice_") {
        let start = i + at;
        let mut end = start;
        while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
            end += 1;
        }
        // Not a label value or part of a longer identifier.
        let before = start.checked_sub(1).map(|j| b[j]);
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'"') {
            names.insert(expr[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// The series names a text exposition declares: every sample's name, and
/// every family's (`_total` for a counter) even before it has a sample.
fn exported(metrics: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for l in metrics.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let mut w = t.split_whitespace();
            let (name, kind) = (w.next().unwrap_or(""), w.next().unwrap_or(""));
            names.insert(if kind == "counter" { format!("{name}_total") } else { name.to_owned() });
        } else if !l.starts_with('#') && !l.is_empty() {
            names.insert(l.split(['{', ' ']).next().unwrap_or("").to_owned());
        }
    }
    names
}

#[test]
fn metric_names_are_read_from_queries_and_expositions() {
    let q = r#"sum by (service) (rate(sluice_service_packets_total{instance=~"$instance"}[$__rate_interval])) / sluice_mempool_mbufs"#;
    assert_eq!(metric_names(q), BTreeSet::from(["sluice_service_packets_total".to_owned(), "sluice_mempool_mbufs".to_owned()]));
    assert!(metric_names(r#"up{job="sluice_x"}"#).is_empty(), "a label value is not a metric");
    let text = "# HELP sluice_a A.\n# TYPE sluice_a counter\n# HELP sluice_b B.\n# TYPE sluice_b gauge\nsluice_b{x=\"1\"} 2\n# EOF\n";
    assert_eq!(exported(text), BTreeSet::from(["sluice_a_total".to_owned(), "sluice_b".to_owned()]));
}

/// The demo's configuration with every source and subsystem that exports
/// metrics set; the remote peers (xDS server, API server, gateway router,
/// sibling) are addresses where nothing answers.
fn config(prefix: &str, dir: &Path) -> String {
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {server: \"http://127.0.0.1:6443\"}\ncontexts:\n- name: none\n  context: {cluster: none, user: none}\ncurrent-context: none\nusers:\n- name: none\n  user: {}\n",
    )
    .unwrap();
    let key = dir.join("sync.key");
    std::fs::write(&key, format!("{}\n", "k".repeat(32))).unwrap();
    let demo = std::fs::read_to_string(root().join("configs/demo.yaml")).unwrap();
    let demo = demo.replace("filePrefix: sluice-demo", &format!("filePrefix: {prefix}")).replace("latencyHistogram: false", "latencyHistogram: true");
    assert!(demo.contains("latencyHistogram: true"), "the demo's dpdk section moved");
    let web = demo.find("  - name: web\n").expect("web");
    let demo = format!(
        "{}\n    healthCheck: {{protocol: tcp, port: 80, intervalMs: 500, timeoutMs: 300, rise: 2, fall: 3}}{}",
        &demo[..web + "  - name: web".len()],
        &demo[web + "  - name: web".len()..]
    );
    let services = demo.find("\nservices:\n").expect("services");
    let d = dir.display();
    let extra = format!(
        "
bird: {{socket: {d}/bird.ctl, configFile: {d}/bird.conf, withdrawWaitMs: 500}}
gatewayRouters:
  - name: dc-gw
    address: 10.100.0.2
    interface: front
    bgp: {{localASN: 8103, remoteASN: 65001, holdTime: 9s, bfd: {{switch: true}}}}
xds-control-plane:
  enabled: true
  server-address: \"10.100.0.2:18000\"
kubernetes:
  gateway: sllb-a
  namespace: default
  kubeconfig: {kubeconfig}
siblings:
  listen: 127.0.0.1:7946
  peers: [127.0.0.1:7947]
  keyFile: {key}
  startupWaitMs: 0
",
        kubeconfig = kubeconfig.display(),
        key = key.display()
    );
    format!("{}{}{}", &demo[..services], extra, &demo[services..])
}

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn every_dashboard_query_and_rule_runs_on_a_live_appliance_through_prometheus() {
    privileged();
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(monitoring().join("sluice-dashboard.json")).unwrap()).expect("the dashboard is JSON");
    assert!(dashboard["schemaVersion"].as_u64().is_some(), "the dashboard has a schemaVersion");
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() >= 30, "{} queries", queries.len());
    let rules_text = std::fs::read_to_string(monitoring().join("sluice-rules.yaml")).unwrap();
    let rules: Vec<String> = rules_text.lines().filter_map(|l| l.trim().strip_prefix("expr: ")).map(str::to_owned).collect();
    assert!(rules.len() >= 10, "{} rules", rules.len());

    let prefix = format!("mo{}", std::process::id());
    let topo = Topology::up(&prefix);
    let _backends = topo.backends(&["20.0.0.1"]);
    topo.backends_listen(&[80], &[]);
    let dir = tempdir(&prefix);
    let cfg = dir.join("appliance.yaml");
    std::fs::write(&cfg, config(&prefix, &dir)).unwrap();
    let check = topo.output("lb", &[sluice_bin().to_str().unwrap(), "check", "--config", cfg.to_str().unwrap()]);
    assert!(check.status.success(), "sluice check: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    let mut lb = topo.spawn("lb", &[sluice_bin().to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let serving = wait_until(Duration::from_secs(30), || {
        topo.status()["endpoints"].as_array().is_some_and(|e| e.iter().filter(|e| e["state"] == "ready").count() == 6)
    });
    if !serving {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not serve (exit {code:?}):\n{out}\n{err}");
    }

    let mut prometheus = prometheus::start(&topo, &dir, Some(&monitoring().join("sluice-rules.yaml")));

    // Traffic, then two more scrapes.
    let counts = topo.client(&["short", "20.0.0.1", "200", "8"]);
    assert_eq!(counts.get("failed"), None, "{counts:?}");
    std::thread::sleep(Duration::from_secs(3));

    // The last minute, as the appliance counts it: every connection's
    // packets (SYN, ACK, request, FIN, ACK at least) balanced.
    let minute = &topo.status()["last_minute"];
    let (rx, balanced) = (minute["rx_packets"].as_u64().unwrap_or(0), minute["balanced"].as_u64().unwrap_or(0));
    assert!(balanced >= 200 * 5 && rx >= balanced, "{minute}");
    assert!(minute["seconds"].as_f64().is_some_and(|s| s > 0.0 && s <= 60.0), "{minute}");
    let text = String::from_utf8(topo.output("lb", &[sluice_bin().to_str().unwrap(), "status"]).stdout).unwrap();
    assert!(text.lines().nth(2).is_some_and(|l| l.starts_with("last ") && l.contains(" received, ") && l.contains(" balanced, ")), "{text}");

    let metrics = String::from_utf8(topo.output("lb", &["curl", "-sf", "127.0.0.1:9091/metrics"]).stdout).unwrap();
    let live = exported(&metrics);
    for family in ["sluice_xds_connected", "sluice_kube_connected", "sluice_bird_up", "sluice_sync_settled", "sluice_health_checks_total", "sluice_latency_seconds"] {
        assert!(live.contains(family), "the appliance exports {family} with its section set:\n{metrics}");
    }
    let mut problems = Vec::new();
    for q in queries.iter().chain(&rules) {
        let missing: Vec<String> = metric_names(q).into_iter().filter(|n| !live.contains(n)).collect();
        if !missing.is_empty() {
            problems.push(format!("{q}: names {missing:?}, which the appliance does not export"));
        }
        if let Err(e) = query(&topo, &as_sent(q)) {
            problems.push(e);
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));

    // The traffic panel shows the connections just made.
    let traffic = queries.iter().find(|q| q.contains("sluice_service_packets_total")).expect("a panel of packets per service");
    let web = query(&topo, &as_sent(traffic)).unwrap()["result"].as_array().unwrap().iter().find(|r| r["metric"]["service"] == "web").cloned();
    let rate: f64 = web.as_ref().and_then(|r| r["value"][1].as_str()).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(rate > 0.0, "web's packets per second on the dashboard: {web:?}");

    // Prometheus evaluated every rule without error.
    let rules_state = topo.json("lb", &["curl", "-sS", &format!("http://{}/api/v1/rules", prometheus::LISTEN)]);
    let evaluated: Vec<Value> = rules_state["data"]["groups"].as_array().into_iter().flatten().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect();
    assert_eq!(evaluated.len(), rules.len(), "{rules_state}");
    for r in &evaluated {
        assert_eq!(r["health"], "ok", "rule {} evaluated with an error: {r}", r["name"]);
    }
    // The xDS server does not answer: the alert that says so is pending or firing.
    let xds = evaluated.iter().find(|r| r["name"] == "SluiceXdsDisconnected").unwrap();
    assert!(xds["alerts"].as_array().is_some_and(|a| !a.is_empty()), "{xds}");

    let _ = prometheus.stop("TERM", Duration::from_secs(10));
    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}
