//! The xDS source end to end: a test management server (snapshot cache,
//! state of the world and delta, on 127.0.0.1:0), the xDS source, and a
//! real reconciler (no DPDK: the snapshot goes to a publisher nobody
//! reads), checked through what the reconciler serves, what the source
//! reports and what the server received (versions, nonces, NACKs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::admin::state::{PoolProbe, Reconciled, Shared, SourceStatus, WorkerEntry};
use sluice::compile::{TopoPort, Topology};
use sluice::config::IfAddr;
use sluice::reconcile::{NeighMap, Reconciler, Settings};
use sluice::config::xds::{ServerAddress, TlsPaths};
use sluice::sources::xds::status::ConnectionState;
use sluice::sources::xds::{self, Mode, XdsConfig, XdsStatus};
use sluice_dataplane::rcu::Publisher;
use sluice_dataplane::snapshot::Snapshot as DpSnapshot;
use sluice_tests::xds_server::{RequestKind, ServerTls, Snapshot, XdsServer, CLA_TYPE, CLUSTER_TYPE, DEFAULT_NODE};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Longest any condition is waited for (a guard against hangs, not a timing claim).
const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug)]
struct Pool;
impl PoolProbe for Pool {
    fn in_use(&self) -> u32 {
        0
    }
    fn capacity(&self) -> u32 {
        1
    }
}

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("sluice-xds-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One appliance's control side: a real reconciler and the xDS source.
struct Appliance {
    shared: Arc<Shared>,
    status: watch::Receiver<XdsStatus>,
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: TempDir,
}

/// What is served, by service: (address, identifier) sorted by address.
type Served = BTreeMap<String, Vec<(String, u32)>>;

impl Appliance {
    async fn start(tag: &str, cfg: XdsConfig, inline: &str) -> Appliance {
        let dir = TempDir::new(&format!("appliance-{tag}"));
        let text = format!("ports: [{{name: p, device: net_null0, addresses: [10.0.0.1/16, \"2001:db8::1/64\"]}}]\n{inline}");
        let path = dir.write("c.yaml", &text);
        let state = sluice::sources::read(&path).unwrap();
        let defaults = state.config.defaults;
        let shared = Arc::new(Shared::new("c.yaml".into(), Vec::new(), Arc::new(Pool), Vec::<WorkerEntry>::new(), 1));
        let topo = Topology {
            ports: vec![TopoPort {
                name: "p".into(),
                mac: [2, 0, 0, 0, 0, 9],
                mtu: 1500,
                vlan: 0,
                addresses: vec![
                    IfAddr { addr: "10.0.0.1".parse().unwrap(), prefix: 16 },
                    IfAddr { addr: "2001:db8::1".parse().unwrap(), prefix: 64 },
                ],
            }],
            gateways: vec![],
        };
        let (settings_tx, _settings_rx) = watch::channel(Settings::of(&state.config));
        let mut r = Reconciler::new(sluice::sources::Loaded::of(state).unwrap(), topo, Publisher::new(DpSnapshot::default()), Vec::new(), settings_tx);
        shared.reconciled.set(Reconciled { published: r.publications(), status: r.status() }).unwrap();
        r.start().unwrap();
        let (_neigh_tx, neigh_rx) = watch::channel(NeighMap::new());
        let (tx, rx) = mpsc::channel(16);
        let cancel = CancellationToken::new();
        let (status_tx, status) = watch::channel(XdsStatus::default());
        let mut tasks = Vec::new();
        {
            let c = cancel.clone();
            tasks.push(tokio::spawn(async move {
                let _keep = _neigh_tx;
                r.run(rx, neigh_rx, c).await;
            }));
        }
        tasks.push(tokio::spawn(xds::run(cfg, defaults, tx, status_tx, cancel.clone())));
        Appliance { shared, status, cancel, tasks, _dir: dir }
    }

    fn served(&self) -> Served {
        let st = self.shared.control();
        let mut out: Served = st.services.iter().map(|s| (s.name.clone(), Vec::new())).collect();
        for e in st.all_endpoints() {
            out.entry(e.service.to_string()).or_default().push((e.address.to_string(), e.id));
        }
        for v in out.values_mut() {
            v.sort();
        }
        out
    }

    fn source(&self) -> SourceStatus {
        self.shared.control().sources.get("xds").cloned().unwrap_or_default()
    }

    fn publishes(&self) -> u64 {
        self.shared.control().publishes
    }

    fn status(&self) -> XdsStatus {
        self.status.borrow().clone()
    }

    /// Both types recorded as accepted at `version`. Served is published
    /// before the outcome is recorded (versions, counts, then the ACK):
    /// wait for this before reading them.
    fn recorded(&self, version: &str) -> bool {
        let st = self.status();
        [CLUSTER_TYPE, CLA_TYPE].iter().all(|t| st.types.get(*t).is_some_and(|v| v.version == version))
    }

    /// Stops the reconciler and the source; each must end, without a
    /// panic, within [`WAIT`].
    async fn stop(self) {
        self.cancel.cancel();
        for t in self.tasks {
            tokio::time::timeout(WAIT, t).await.expect("a task stops when cancelled").expect("a task ends without a panic");
        }
    }
}

async fn wait(what: &str, mut cond: impl FnMut() -> bool, dump: impl Fn() -> String) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < WAIT, "timed out waiting for {what}\n{}", dump());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn xds_cfg(addr: SocketAddr, mode: Mode, node: &str) -> XdsConfig {
    XdsConfig {
        server: ServerAddress { host: addr.ip().to_string(), port: addr.port() },
        tls: None,
        node_id: node.into(),
        node_cluster: "test".into(),
        mode,
    }
}

fn l4(name: &str, vip: &str, port: u64, proto: &str) -> Value {
    json!({
        "name": name, "type": "EDS", "lb_policy": "MAGLEV",
        "eds_cluster_config": {"service_name": name},
        "metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": vip, "port": port, "protocol": proto}}}
    })
}

fn cla(name: &str, addrs: &[&str]) -> Value {
    let eps: Vec<Value> = addrs.iter().map(|a| json!({"endpoint": {"address": {"socket_address": {"address": a, "port_value": 0}}}})).collect();
    json!({"cluster_name": name, "endpoints": [{"lb_endpoints": eps}]})
}

fn snap(version: &str, clusters: &[Value], clas: &[Value]) -> Snapshot {
    Snapshot::new(version, clusters, clas).unwrap()
}

fn base_clusters() -> Vec<Value> {
    vec![
        l4("web", "20.0.0.1", 80, "TCP"),
        l4("db", "2001:db8:f::1", 3306, "TCP"),
        json!({"name": "envoy-only", "type": "EDS"}),
    ]
}

/// The assignments, with one for the cluster that is not an L4 service
/// (served to Envoy proxies; host names are fine there).
fn base_clas() -> Vec<Value> {
    vec![cla("web", &["10.0.0.10", "10.0.0.11"]), cla("db", &["2001:db8::10"]), cla("envoy-only", &["backend.internal"])]
}

fn addrs(s: &Served, svc: &str) -> Vec<String> {
    s.get(svc).map(|v| v.iter().map(|(a, _)| a.clone()).collect()).unwrap_or_default()
}

async fn serve(server: &XdsServer) -> sluice_tests::xds_server::Running {
    server.serve("127.0.0.1:0".parse().unwrap(), None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_initial_sync_then_add_change_and_remove() {
    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, snap("1", &base_clusters(), &base_clas()));
    let running = serve(&server).await;
    let a = Appliance::start("sotw-sync", xds_cfg(running.addr, Mode::Sotw, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:?}\nrequests {:#?}", a.served(), a.status(), server.requests());
    wait("the initial sync", || a.served().len() == 2 && addrs(&a.served(), "web").len() == 2 && addrs(&a.served(), "db").len() == 1, dump).await;
    wait("both versions recorded", || a.recorded("1"), dump).await;
    let st = a.status();
    assert_eq!(st.state, ConnectionState::Connected);
    assert_eq!((st.types[CLUSTER_TYPE].version.as_str(), st.types[CLA_TYPE].version.as_str()), ("1", "1"));
    assert_eq!((st.services, st.endpoints, st.ignored_clusters, st.nacks), (2, 3, 1, 0));
    assert_eq!(a.source().accepted_total, 1, "clusters wait for their endpoints: one state for the initial sync");
    {
        let meta = a.shared.control();
        let web = meta.services.iter().find(|s| s.name == "web").unwrap();
        assert_eq!(web.algorithm, "maglev");
        let route = meta.routes.iter().find(|r| r.name == "db").unwrap();
        assert_eq!(route.vips, ["2001:db8:f::1".parse::<std::net::IpAddr>().unwrap()]);
    }
    // The client's requests: wildcard clusters, assignments by name,
    // node and client features, ACKs echoing version and nonce.
    let reqs = server.requests();
    let cds0 = reqs.iter().find(|r| r.type_url == CLUSTER_TYPE).unwrap();
    assert_eq!((cds0.kind.clone(), cds0.names.len(), cds0.version_info.as_str(), cds0.node.as_str()), (RequestKind::Initial, 0, "", "lb-1"));
    assert!(cds0.client_features.contains(&"envoy.lb.does_not_support_overprovisioning".to_owned()));
    let eds = reqs.iter().find(|r| r.type_url == CLA_TYPE).unwrap();
    assert_eq!(eds.names, ["db", "envoy-only", "web"], "every EDS cluster's assignment, as Envoy asks");
    wait("both ACKs", || server.requests().iter().filter(|r| r.kind == RequestKind::Ack && r.version_info == "1").count() == 2, dump).await;
    let ids_before = a.served()["web"].clone();

    // Add an endpoint and a UDP service; the others keep their identifiers.
    let mut clusters = base_clusters();
    clusters.push(l4("dns", "20.0.0.53", 53, "udp"));
    let clas = vec![cla("web", &["10.0.0.10", "10.0.0.11", "10.0.0.12"]), cla("db", &["2001:db8::10"]), cla("dns", &["10.0.0.53"])];
    server.set_snapshot(DEFAULT_NODE, snap("2", &clusters, &clas));
    wait("v2", || addrs(&a.served(), "web").len() == 3 && a.served().contains_key("dns"), dump).await;
    let web = a.served()["web"].clone();
    for e in &ids_before {
        assert!(web.contains(e), "{e:?} kept its identifier: {web:?}");
    }
    let eds_now = server.requests().into_iter().rfind(|r| r.type_url == CLA_TYPE).unwrap();
    assert_eq!(eds_now.names, ["db", "dns", "envoy-only", "web"]);

    // Remove a cluster and an endpoint.
    let clusters: Vec<Value> = clusters.into_iter().filter(|c| c["name"] != "db").collect();
    let clas = vec![cla("web", &["10.0.0.10", "10.0.0.12"]), cla("dns", &["10.0.0.53"])];
    server.set_snapshot(DEFAULT_NODE, snap("3", &clusters, &clas));
    wait("v3", || !a.served().contains_key("db") && addrs(&a.served(), "web") == ["10.0.0.10", "10.0.0.12"], dump).await;
    wait("the db assignment unsubscribed", || server.requests().iter().rev().find(|r| r.type_url == CLA_TYPE).unwrap().names == ["dns", "envoy-only", "web"], dump).await;
    assert_eq!(a.status().nacks, 0);
    assert!(a.status().last_update.is_some());
    a.stop().await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_bad_inputs_are_nacked_and_the_last_good_state_is_kept() {
    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, snap("good", &base_clusters(), &base_clas()));
    let running = serve(&server).await;
    // The file defines a service named "taken": a cluster of that name conflicts.
    let inline = "services: [{name: taken, endpoints: [{id: 0, address: 10.0.0.99}]}]\nroutes: [{name: taken, service: taken, vips: [30.0.0.1]}]\n";
    let a = Appliance::start("sotw-nack", xds_cfg(running.addr, Mode::Sotw, "lb-1"), inline).await;
    let dump = || format!("served {:?}\nstatus {:#?}", a.served(), a.status());
    wait("the initial sync", || addrs(&a.served(), "web").len() == 2, dump).await;
    wait("its ACKs", || a.recorded("good"), dump).await;
    let good = a.served();
    let accepted = a.source().accepted_total;

    let with = |extra_cluster: Value, extra_cla: Value| {
        let mut c = base_clusters();
        c.push(extra_cluster);
        let mut e = base_clas();
        e.push(extra_cla);
        (c, e)
    };
    let mut maglev_bad = l4("m", "20.0.0.9", 80, "TCP");
    maglev_bad["maglev_lb_config"] = json!({"table_size": 65536});
    let mut small_table = l4("small", "20.0.0.10", 80, "TCP");
    small_table["maglev_lb_config"] = json!({"table_size": 7});
    let many: Vec<String> = (0..33).map(|i| format!("10.0.1.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    type Case<'a> = (&'a str, (Vec<Value>, Vec<Value>), &'a str);
    let cases: Vec<Case<'_>> = vec![
        ("bad VIP", with(l4("x", "20.0.0.300", 80, "TCP"), cla("x", &["10.0.0.20"])), "Cluster \"x\": io.cilium.l4lb.vip: \"20.0.0.300\" is not an IP address"),
        ("VIP not one address", with(l4("x", "20.0.0.0/24", 80, "TCP"), cla("x", &["10.0.0.20"])), "is not a single address"),
        ("port out of range", with(l4("x", "20.0.0.2", 70000, "TCP"), cla("x", &["10.0.0.20"])), "io.cilium.l4lb.port: 70000 is out of range 1..=65535"),
        ("unknown protocol", with(l4("x", "20.0.0.2", 80, "QUIC"), cla("x", &["10.0.0.20"])), "unknown protocol \"QUIC\""),
        ("table size not a prime", with(maglev_bad, cla("m", &["10.0.0.20"])), "Maglev table size 65536 is not a prime (the next prime is 65537)"),
        ("shared VIP:port:protocol", with(l4("xdup", "20.0.0.1", 80, "tcp"), cla("xdup", &["10.0.0.20"])), "20.0.0.1:80/TCP is already claimed by cluster \"web\""),
        ("more endpoints than the limit", with(l4("x", "20.0.0.2", 80, "TCP"), cla("x", &many)), "33 endpoints are more than the service's endpoint limit of 32"),
        // Refused by the reconciler, not the mapping.
        ("a name another source owns", with(l4("taken", "20.0.0.3", 80, "TCP"), cla("taken", &["10.0.0.20"])), "service \"taken\" is already defined at"),
        ("a table smaller than the limit", with(small_table, cla("small", &["10.0.0.20"])), "table size 7 is smaller than the endpoint limit 32"),
    ];
    for (i, (what, (clusters, clas), want)) in cases.into_iter().enumerate() {
        let version = format!("bad{i}");
        let nacks_before = a.status().nacks;
        server.set_snapshot(DEFAULT_NODE, snap(&version, &clusters, &clas));
        wait(what, || a.status().nacks > nacks_before && server.nacks().len() == i + 1, dump).await;
        let st = a.status();
        let nack = st.last_nack.clone().unwrap();
        assert!(nack.error.contains(want), "{what}: {:?} lacks {want:?}", nack.error);
        assert_eq!(nack.version, version, "{what}");
        // The server got the NACK: the version last accepted for its type,
        // the refused response's nonce, the reason.
        let req = server.requests().into_iter().rev().find(|r| matches!(r.kind, RequestKind::Nack(_))).unwrap();
        let RequestKind::Nack(msg) = &req.kind else { unreachable!() };
        assert!(msg.contains(want), "{what}: {msg}");
        let sent = server.sent().into_iter().rev().find(|s| s.type_url == req.type_url && s.nonce == req.nonce).unwrap();
        assert_eq!(sent.version, version, "{what}: the NACK names the refused response");
        assert_eq!(req.version_info, st.types[&req.type_url].version, "{what}: NACK = previous version");
        assert_eq!(a.served(), good, "{what}: the last good state is served");
        assert_eq!(a.source().accepted_total, accepted, "{what}: nothing new accepted");
    }
    // Bytes that are no Cluster, and a resource of the wrong type.
    for (i, (type_in_any, bytes, want)) in [
        (CLUSTER_TYPE, vec![0xff, 0xff, 0xff], "cannot decode a Cluster"),
        (CLA_TYPE, Vec::new(), "a resource of type \"type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\" in a response of type"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut s = snap(&format!("raw{i}"), &base_clusters(), &base_clas());
        s.add_raw(CLUSTER_TYPE, "raw", type_in_any, bytes);
        let before = server.nacks().len();
        server.set_snapshot(DEFAULT_NODE, s);
        wait("a NACK of undecodable input", || server.nacks().len() > before, dump).await;
        let msg = server.nacks().last().unwrap().1.clone();
        assert!(msg.contains(want), "{msg}");
        assert_eq!(a.served(), good);
    }

    // A good state is accepted again, with the new cluster.
    let (clusters, clas) = with(l4("x", "20.0.0.2", 80, "TCP"), cla("x", &["10.0.0.20"]));
    server.set_snapshot(DEFAULT_NODE, snap("fixed", &clusters, &clas));
    wait("the fixed state", || a.served().contains_key("x"), dump).await;
    wait("its ACKs", || a.recorded("fixed"), dump).await;
    a.stop().await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_server_restart_reconnects_without_flush_or_rebuild() {
    server_restart(Mode::Sotw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_server_restart_reconnects_without_flush_or_rebuild() {
    server_restart(Mode::Delta).await;
}

async fn server_restart(mode: Mode) {
    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, snap("1", &base_clusters(), &base_clas()));
    let running = serve(&server).await;
    let addr = running.addr;
    let a = Appliance::start(&format!("restart-{mode}"), xds_cfg(addr, mode, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}\nrequests {:#?}", a.served(), a.status(), server.requests());
    wait("the initial sync", || a.served().len() == 2 && addrs(&a.served(), "web").len() == 2, dump).await;
    wait("ACKs", || server.requests().iter().filter(|r| r.kind == RequestKind::Ack).count() >= 2, dump).await;
    let (served, publishes, accepted) = (a.served(), a.publishes(), a.source().accepted_total);

    running.stop().await;
    wait("the source to notice", || a.status().state != ConnectionState::Connected, dump).await;
    // Nothing sent while away is also counted after the return, below.
    assert_eq!(a.served(), served, "no flush while the server is away");
    assert_eq!((a.publishes(), a.source().accepted_total), (publishes, accepted), "nothing sent while disconnected");
    assert!(a.status().last_error.is_some());

    let running = server.serve(addr, None).await.unwrap();
    wait("both subscriptions on a second stream", || {
        let r = server.requests();
        [CLUSTER_TYPE, CLA_TYPE].iter().all(|t| r.iter().any(|x| x.stream == 2 && x.type_url == *t))
    }, dump).await;
    let second: Vec<_> = server.requests().into_iter().filter(|r| r.stream == 2).collect();
    let cds = second.iter().find(|r| r.type_url == CLUSTER_TYPE).unwrap();
    let eds = second.iter().find(|r| r.type_url == CLA_TYPE).unwrap();
    match mode {
        Mode::Sotw => {
            assert_eq!((cds.version_info.as_str(), cds.nonce.as_str()), ("1", ""), "resubscribed with the version held, no nonce");
            assert_eq!((eds.version_info.as_str(), eds.names.clone()), ("1", vec!["db".to_owned(), "envoy-only".to_owned(), "web".to_owned()]));
            // The server resends the assignments (new names on a new stream,
            // as go-control-plane does); the same state is only acknowledged.
            wait("the resent assignments acknowledged", || server.requests().iter().any(|r| r.stream == 2 && r.kind == RequestKind::Ack), dump).await;
        }
        Mode::Delta => {
            assert_eq!(cds.initial_versions.keys().cloned().collect::<Vec<_>>(), ["db", "envoy-only", "web"], "every cluster held");
            assert_eq!(eds.initial_versions.keys().cloned().collect::<Vec<_>>(), ["db", "envoy-only", "web"]);
            assert_eq!(eds.names, ["db", "envoy-only", "web"]);
        }
    }
    assert_eq!(a.served(), served);
    let st = a.status();
    assert_eq!((st.state, st.reconnects), (ConnectionState::Connected, 1));

    // The new stream carries changes. Once one is served, everything the
    // source did since the server went away is counted: the change alone
    // (nothing flushed, no rebuild for the unchanged state it got back).
    let clas = vec![cla("web", &["10.0.0.10", "10.0.0.11", "10.0.0.12"]), cla("db", &["2001:db8::10"])];
    server.set_snapshot(DEFAULT_NODE, snap("2", &base_clusters(), &clas));
    wait("a change after the restart", || addrs(&a.served(), "web").len() == 3, dump).await;
    assert_eq!((a.publishes(), a.source().accepted_total), (publishes + 1, accepted + 1), "the change alone since the server went away");
    if mode == Mode::Delta {
        let sent: Vec<_> = server.sent().into_iter().filter(|s| s.stream == 2).collect();
        assert!(!sent.is_empty() && sent.iter().all(|s| s.version == "2"), "the second stream carried the change alone: {sent:#?}");
    }
    a.stop().await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_add_change_remove_and_nack() {
    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, snap("1", &base_clusters(), &base_clas()));
    let running = serve(&server).await;
    let a = Appliance::start("delta", xds_cfg(running.addr, Mode::Delta, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}\nsent {:#?}\nrequests {:#?}", a.served(), a.status(), server.sent(), server.requests());
    wait("the initial sync", || a.served().len() == 2 && addrs(&a.served(), "db").len() == 1, dump).await;
    let reqs = server.requests();
    let cds0 = reqs.iter().find(|r| r.type_url == CLUSTER_TYPE).unwrap();
    assert!(cds0.delta && cds0.names.is_empty() && cds0.kind == RequestKind::Initial, "a wildcard subscription");
    wait("ACKs with the nonces", || server.requests().iter().filter(|r| r.kind == RequestKind::Ack).count() >= 2, dump).await;

    // Change one endpoint set: only that assignment is sent.
    let clas = vec![cla("web", &["10.0.0.10", "10.0.0.13"]), cla("db", &["2001:db8::10"])];
    let sent_before = server.sent().len();
    server.set_snapshot(DEFAULT_NODE, snap("2", &base_clusters(), &clas));
    wait("the change", || addrs(&a.served(), "web") == ["10.0.0.10", "10.0.0.13"], dump).await;
    let new: Vec<_> = server.sent().into_iter().skip(sent_before).collect();
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].names, ["web"]);

    // A bad update is NACKed; the state stays.
    let mut bad = base_clusters();
    bad[0] = l4("web", "20.0.0.1/8", 80, "TCP");
    let served = a.served();
    server.set_snapshot(DEFAULT_NODE, snap("3", &bad, &clas));
    wait("the NACK", || a.status().nacks == 1 && server.nacks().len() == 1, dump).await;
    assert!(server.nacks()[0].1.contains("is not a single address"));
    assert_eq!(a.served(), served);

    // A cluster update refused only once mapped: "late"'s assignment is
    // subscribed to ahead of the mapping, then taken back with the NACK,
    // and its assignment, sent meanwhile, is ignored.
    let mut unmappable = base_clusters();
    unmappable.push(l4("late", "20.0.0.9", 9, "TCP"));
    unmappable.push(json!({
        "name": "inline", "type": "STATIC", "load_assignment": cla("inline", &["10.0.0.99", "10.0.0.99"]),
        "metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": "20.0.0.8", "port": 80, "protocol": "TCP"}}}
    }));
    let mut late_clas = clas.clone();
    late_clas.push(cla("late", &["10.0.0.90"]));
    server.set_snapshot(DEFAULT_NODE, snap("3b", &unmappable, &late_clas));
    wait("the NACK of the unmappable cluster", || a.status().nacks == 2 && server.nacks().len() == 2, dump).await;
    assert!(server.nacks()[1].1.contains("one endpoint per address"), "{}", server.nacks()[1].1);
    wait("late unsubscribed", || server.requests().iter().any(|r| r.unsubscribe == ["late"]), dump).await;
    let reqs = server.requests();
    let ahead = reqs.iter().position(|r| r.type_url == CLA_TYPE && r.names == ["late"]).expect("late subscribed to ahead");
    let nack = reqs.iter().rposition(|r| r.type_url == CLUSTER_TYPE && matches!(r.kind, RequestKind::Nack(_))).expect("the NACK");
    assert!(ahead < nack, "subscribed to before the clusters were refused");
    assert_eq!(a.served(), served);
    assert!(a.status().types[CLUSTER_TYPE].version != "3b");

    // The assignment is removed before its cluster: the service stays, empty.
    let no_db_cla = vec![cla("web", &["10.0.0.10", "10.0.0.13"])];
    server.set_snapshot(DEFAULT_NODE, snap("4", &base_clusters(), &no_db_cla));
    wait("db without endpoints", || a.served().get("db").is_some_and(Vec::is_empty), dump).await;
    let removal = server.sent().into_iter().rev().find(|s| s.type_url == CLA_TYPE).unwrap();
    assert_eq!(removal.removed, ["db"]);
    // Then the cluster goes.
    let clusters: Vec<Value> = base_clusters().into_iter().filter(|c| c["name"] != "db").collect();
    server.set_snapshot(DEFAULT_NODE, snap("5", &clusters, &no_db_cla));
    wait("db gone", || !a.served().contains_key("db"), dump).await;
    wait("db unsubscribed", || server.requests().iter().any(|r| r.unsubscribe == ["db"]), dump).await;

    // A cluster and its assignment removed together, the cluster first:
    // the assignment's removal comes after the unsubscription is decided
    // and is ignored.
    let mut clusters = clusters;
    clusters.push(l4("tmp", "20.0.0.7", 7, "UDP"));
    let mut clas = no_db_cla.clone();
    clas.push(cla("tmp", &["10.0.0.70"]));
    server.set_snapshot(DEFAULT_NODE, snap("6", &clusters, &clas));
    wait("tmp", || addrs(&a.served(), "tmp") == ["10.0.0.70"], dump).await;
    let clusters: Vec<Value> = clusters.into_iter().filter(|c| c["name"] != "tmp").collect();
    server.set_snapshot(DEFAULT_NODE, snap("7", &clusters, &no_db_cla));
    wait("tmp gone", || !a.served().contains_key("tmp"), dump).await;
    wait("both removals acknowledged", || {
        let sent = server.sent();
        let acks = server.requests().into_iter().filter(|r| r.kind == RequestKind::Ack).map(|r| r.nonce).collect::<Vec<_>>();
        sent.iter().filter(|s| s.removed == ["tmp"]).all(|s| acks.contains(&s.nonce)) && sent.iter().filter(|s| s.removed == ["tmp"]).count() == 2
    }, dump).await;
    assert_eq!(a.status().nacks, 2, "a removal of what is not held is no error");

    // Removed before the cluster, pushed in the other order.
    server.set_push_order(&[CLA_TYPE, CLUSTER_TYPE]);
    let mut clusters2 = clusters.clone();
    clusters2.push(l4("tmp2", "20.0.0.8", 8, "UDP"));
    let mut clas2 = no_db_cla.clone();
    clas2.push(cla("tmp2", &["10.0.0.80"]));
    server.set_snapshot(DEFAULT_NODE, snap("8", &clusters2, &clas2));
    wait("tmp2", || addrs(&a.served(), "tmp2") == ["10.0.0.80"], dump).await;
    server.set_snapshot(DEFAULT_NODE, snap("9", &clusters, &no_db_cla));
    wait("tmp2 gone", || !a.served().contains_key("tmp2"), dump).await;
    assert_eq!(a.status().nacks, 2);
    a.stop().await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_appliances_choose_the_same_endpoint_identifiers_whatever_the_order() {
    let server = XdsServer::new();
    let all = ["10.0.0.10", "10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14", "10.0.0.15"];
    let clusters = [l4("web", "20.0.0.1", 80, "TCP")];
    // lb-1 sees the endpoints arrive one by one, then some leave and come
    // back; lb-2 gets the final set at once, in another order.
    server.set_snapshot("lb-1", snap("a0", &clusters, &[cla("web", &all[..1])]));
    let mut reversed = all;
    reversed.reverse();
    server.set_snapshot("lb-2", snap("b0", &clusters, &[cla("web", &reversed)]));
    let running = serve(&server).await;
    let a = Appliance::start("ecmp-1", xds_cfg(running.addr, Mode::Sotw, "lb-1"), "").await;
    let b = Appliance::start("ecmp-2", xds_cfg(running.addr, Mode::Delta, "lb-2"), "").await;
    let dump = || format!("a {:?}\nb {:?}", a.served(), b.served());
    for n in 2..=all.len() {
        server.set_snapshot("lb-1", snap(&format!("a{n}"), &clusters, &[cla("web", &all[..n])]));
        wait("lb-1 grows", || addrs(&a.served(), "web").len() == n, dump).await;
    }
    server.set_snapshot("lb-1", snap("a-drop", &clusters, &[cla("web", &[all[0], all[2], all[4]])]));
    wait("lb-1 shrinks", || addrs(&a.served(), "web").len() == 3, dump).await;
    server.set_snapshot("lb-1", snap("a-back", &clusters, &[cla("web", &[all[5], all[3], all[1], all[0], all[2], all[4]])]));
    wait("lb-1 complete", || addrs(&a.served(), "web").len() == 6, dump).await;
    wait("lb-2 complete", || addrs(&b.served(), "web").len() == 6, dump).await;
    assert_eq!(a.served(), b.served(), "same endpoint, same identifier, on both");
    a.stop().await;
    b.stop().await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_appliance_serves_its_file_while_the_server_is_unreachable() {
    // A port nobody listens on (bound, then released).
    let addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let inline = "services: [{name: local, endpoints: [{id: 0, address: 10.0.0.99}]}]\nroutes: [{name: local, service: local, vips: [30.0.0.1]}]\n";
    let a = Appliance::start("unreachable", xds_cfg(addr, Mode::Sotw, "lb-1"), inline).await;
    let dump = || format!("served {:?}\nstatus {:#?}", a.served(), a.status());
    wait("a failed attempt", || a.status().last_error.is_some(), dump).await;
    assert!(a.status().last_error.unwrap().contains("cannot connect to 127.0.0.1:"), "{:?}", a.status().last_error);
    assert_eq!(a.served().keys().collect::<Vec<_>>(), ["local"]);
    assert!(!a.shared.control().sources.contains_key("xds"), "nothing sent");
    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, snap("1", &base_clusters(), &base_clas()));
    let running = server.serve(addr, None).await.unwrap();
    wait("the sync once the server is up", || a.served().len() == 3, dump).await;
    a.stop().await;
    running.stop().await;
}

// ---- TLS -----------------------------------------------------------------------------

struct Pki {
    ca_pem: String,
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let issuer = rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate().unwrap()).unwrap();
        Pki { ca_pem: issuer.pem(), issuer }
    }

    /// A certificate for `names` signed by this CA: (cert, key) PEM.
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let p = rcgen::CertificateParams::new(names.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_generated_certificates_and_a_wrong_ca_refused() {
    let pki = Pki::new("sluice test CA");
    let other = Pki::new("somebody else's CA");
    let (srv_cert, srv_key) = pki.leaf(&["127.0.0.1", "localhost"]);
    let (cli_cert, cli_key) = pki.leaf(&["lb-1"]);
    let dir = TempDir::new("mtls");
    let ca = dir.write("ca.crt", &pki.ca_pem);
    let wrong_ca = dir.write("wrong-ca.crt", &other.ca_pem);
    let (cc, ck) = (dir.write("client.crt", &cli_cert), dir.write("client.key", &cli_key));
    let (oc, ok) = {
        let (c, k) = other.leaf(&["intruder"]);
        (dir.write("other.crt", &c), dir.write("other.key", &k))
    };

    let server = XdsServer::new();
    server.set_snapshot(DEFAULT_NODE, snap("1", &base_clusters(), &base_clas()));
    let tls = ServerTls { cert_pem: srv_cert, key_pem: srv_key, client_ca_pem: Some(pki.ca_pem.clone()) };
    let running = server.serve("127.0.0.1:0".parse().unwrap(), Some(tls)).await.unwrap();
    let with = |ca: &Path, cert: &Path, key: &Path| {
        let mut c = xds_cfg(running.addr, Mode::Sotw, "lb-1");
        c.tls = Some(TlsPaths { ca: ca.to_owned(), client: Some((cert.to_owned(), key.to_owned())) });
        c
    };

    let good = Appliance::start("mtls-good", with(&ca, &cc, &ck), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}", good.served(), good.status());
    wait("the sync over mutual TLS", || good.served().len() == 2, dump).await;
    assert_eq!(good.status().transport, "mutual TLS");

    // The server's certificate is not signed by the CA this appliance trusts.
    let wrong = Appliance::start("mtls-wrong-ca", with(&wrong_ca, &cc, &ck), "").await;
    let dump = || format!("status {:#?}", wrong.status());
    wait("a refused handshake", || wrong.status().last_error.is_some(), dump).await;
    let e = wrong.status().last_error.unwrap();
    assert!(e.contains("invalid peer certificate: UnknownIssuer (the server's certificate is not signed by the CA of ca-cert-path)"), "{e}");
    assert!(wrong.served().is_empty());
    assert_ne!(wrong.status().state, ConnectionState::Connected);

    // The server refuses a client certificate its CA did not sign.
    let intruder = Appliance::start("mtls-intruder", with(&ca, &oc, &ok), "").await;
    let dump = || format!("status {:#?}", intruder.status());
    wait("a refused client", || intruder.status().last_error.is_some(), dump).await;
    assert!(intruder.served().is_empty(), "{:?}", intruder.status());

    // A missing file is reported, and retried: once it is there, it works.
    let later = dir.0.join("later.crt");
    let missing = Appliance::start("mtls-missing", with(&later, &cc, &ck), "").await;
    let dump = || format!("status {:#?}", missing.status());
    wait("the missing CA reported", || missing.status().last_error.is_some_and(|e| e.contains("cannot read the CA certificate")), dump).await;
    std::fs::write(&later, &pki.ca_pem).unwrap();
    wait("the sync once the file is there", || missing.served().len() == 2, dump).await;

    for a in [good, wrong, intruder, missing] {
        a.stop().await;
    }
    running.stop().await;
}

// ---- the server as a program -------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_program_serves_a_file_and_follows_its_changes() {
    use std::io::BufRead;
    let dir = TempDir::new("bin");
    let yaml = |version: &str, web: &[&str]| {
        let eps: String = web.iter().map(|a| format!("          - endpoint: {{address: {{socket_address: {{address: \"{a}\", port_value: 80}}}}}}\n")).collect();
        format!(
            "version: \"{version}\"\nclusters:\n  - name: web\n    type: EDS\n    lb_policy: RANDOM\n    eds_cluster_config: {{service_name: web}}\n    metadata:\n      filter_metadata:\n        io.cilium.l4lb: {{vip: 20.0.0.1, port: 80, protocol: TCP}}\nassignments:\n  - cluster_name: web\n    endpoints:\n      - lb_endpoints:\n{eps}"
        )
    };
    let file = dir.write("resources.yaml", &yaml("1", &["10.0.0.10"]));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-xds-server"))
        .args(["--listen", "127.0.0.1:0", "--file"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let child = Kill(child);
    let line = tokio::task::spawn_blocking(move || {
        let mut l = String::new();
        std::io::BufReader::new(stdout).read_line(&mut l).unwrap();
        l
    });
    let line = tokio::time::timeout(WAIT, line).await.expect("the server starts").unwrap();
    let addr: SocketAddr = line.trim().strip_prefix("listening on ").expect("listening on ADDR").parse().unwrap();
    let a = Appliance::start("bin", xds_cfg(addr, Mode::Delta, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}", a.served(), a.status());
    wait("the file's state", || addrs(&a.served(), "web") == ["10.0.0.10"], dump).await;
    assert_eq!(a.shared.control().services[0].algorithm, "random");
    std::fs::write(&file, yaml("2", &["10.0.0.10", "10.0.0.11"])).unwrap();
    wait("the edited file's state", || addrs(&a.served(), "web").len() == 2, dump).await;
    a.stop().await;
    drop(child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_whose_assignment_never_comes_is_served_empty_after_the_warming_timeout() {
    let server = XdsServer::new();
    let mut clusters = base_clusters();
    clusters.push(l4("ghost", "20.0.0.66", 66, "TCP"));
    server.set_snapshot(DEFAULT_NODE, snap("1", &clusters, &base_clas()));
    let running = serve(&server).await;
    let sotw = Appliance::start("ghost-sotw", xds_cfg(running.addr, Mode::Sotw, "lb-1"), "").await;
    let delta = Appliance::start("ghost-delta", xds_cfg(running.addr, Mode::Delta, "lb-2"), "").await;
    let dump = || format!("sotw {:?} {:#?}\ndelta {:?} {:#?}", sotw.served(), sotw.status(), delta.served(), delta.status());
    // Delta: the server says at once that the assignment does not exist.
    wait("delta: ghost without endpoints", || delta.served().get("ghost").is_some_and(Vec::is_empty), dump).await;
    // SotW has no such answer: the cluster warms, then goes in empty.
    // Served is published before the status (see `recorded`): what is
    // warming is read once the status has caught up.
    wait("sotw: the others", || sotw.served().len() == 2 && sotw.recorded("1"), dump).await;
    assert_eq!(sotw.status().warming, ["ghost"]);
    let t0 = Instant::now();
    let deadline = xds::client::WARMING_TIMEOUT + WAIT;
    while !(sotw.served().get("ghost").is_some_and(Vec::is_empty) && sotw.status().warming.is_empty()) {
        assert!(t0.elapsed() < deadline, "{}", dump());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It may still come.
    let mut clas = base_clas();
    clas.push(cla("ghost", &["10.0.0.66"]));
    server.set_snapshot(DEFAULT_NODE, snap("2", &clusters, &clas));
    wait("ghost's endpoints", || addrs(&sotw.served(), "ghost") == ["10.0.0.66"] && addrs(&delta.served(), "ghost") == ["10.0.0.66"], dump).await;
    sotw.stop().await;
    delta.stop().await;
    running.stop().await;
}

/// The requests of stream kind `delta` that NACK a response of type `t`.
fn nacks_of(server: &XdsServer, delta: bool, t: &str) -> Vec<sluice_tests::xds_server::Logged> {
    server.requests().into_iter().filter(|r| r.delta == delta && r.type_url == t && matches!(r.kind, RequestKind::Nack(_))).collect()
}

/// A cluster on `vip`:80/TCP with the assignment of its own name.
fn on(name: &str, vip: &str) -> Value {
    l4(name, vip, 80, "TCP")
}

/// A server that sends a cluster on a VIP, port and protocol another one
/// claims, then the fix (the extra cluster removed, another service's
/// endpoints changed), to a SotW and a delta appliance, pushing the
/// assignments before the clusters or after, and answering a SotW NACK
/// with the refused version again at once (go-control-plane v0.11): both
/// appliances end with the new endpoints and the same services.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_then_its_fix_converge_in_both_modes_whatever_the_push_order() {
    for order in [[CLA_TYPE, CLUSTER_TYPE], [CLUSTER_TYPE, CLA_TYPE]] {
        let server = XdsServer::new();
        server.set_resend_nacked(true);
        server.set_push_order(&order);
        let good_clusters = vec![on("web", "20.0.0.1"), on("api", "20.0.0.2")];
        server.set_snapshot(DEFAULT_NODE, snap("1", &good_clusters, &[cla("web", &["10.0.0.10"]), cla("api", &["10.0.0.20"])]));
        let running = serve(&server).await;
        let s = Appliance::start("fix-sotw", xds_cfg(running.addr, Mode::Sotw, "lb-s"), "").await;
        let d = Appliance::start("fix-delta", xds_cfg(running.addr, Mode::Delta, "lb-d"), "").await;
        let dump = || format!("order {order:?}\nsotw {:?} {:#?}\ndelta {:?} {:#?}\nsent {:#?}", s.served(), s.status(), d.served(), d.status(), server.sent());
        wait("the initial sync", || addrs(&s.served(), "api") == ["10.0.0.20"] && addrs(&d.served(), "api") == ["10.0.0.20"], dump).await;

        // A second cluster on web's VIP, port and protocol: refused by both.
        let mut clash = good_clusters.clone();
        clash.push(on("web-two", "20.0.0.1"));
        server.set_snapshot(DEFAULT_NODE, snap("2", &clash, &[cla("web", &["10.0.0.10"]), cla("api", &["10.0.0.20"]), cla("web-two", &["10.0.0.99"])]));
        wait("both NACK", || !nacks_of(&server, false, CLUSTER_TYPE).is_empty() && !nacks_of(&server, true, CLUSTER_TYPE).is_empty(), dump).await;
        for r in nacks_of(&server, false, CLUSTER_TYPE).into_iter().chain(nacks_of(&server, true, CLUSTER_TYPE)) {
            let RequestKind::Nack(m) = &r.kind else { unreachable!() };
            assert!(m.contains("Cluster \"web-two\": 20.0.0.1:80/TCP is already claimed by cluster \"web\""), "the NACK names both: {m}");
        }
        wait("web-two refused by both", || s.status().refused == ["web-two"] && d.status().refused == ["web-two"], dump).await;

        // The fix: web-two goes, api's endpoints change.
        server.set_snapshot(DEFAULT_NODE, snap("3", &good_clusters, &[cla("web", &["10.0.0.10"]), cla("api", &["10.0.0.21", "10.0.0.22"])]));
        let fixed = |a: &Appliance| addrs(&a.served(), "api") == ["10.0.0.21", "10.0.0.22"] && a.status().refused.is_empty();
        wait("the SotW appliance serves the fix", || fixed(&s), dump).await;
        wait("the delta appliance serves the fix", || fixed(&d), dump).await;
        assert_eq!(s.served(), d.served(), "{}", dump());
        assert_eq!(addrs(&d.served(), "web"), ["10.0.0.10"]);
        s.stop().await;
        d.stop().await;
        running.stop().await;
    }
}

/// Of clusters claiming one VIP, port and protocol, the first by name is
/// served, whichever came first and in either mode, by appliances started
/// before or while the conflict stands; meanwhile the endpoints of other
/// services still change (a SotW appliance subscribes to the refused
/// cluster's assignment too, as go-control-plane's ADS cache answers only
/// a request that names every assignment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_clusters_on_one_vip_the_first_by_name_is_served_and_nothing_else_is_blocked() {
    let server = XdsServer::new();
    server.set_resend_nacked(true);
    let base = vec![on("web", "20.0.0.1"), on("api", "20.0.0.2")];
    let clas = |api: &[&str], aaa: bool| {
        let mut v = vec![cla("web", &["10.0.0.10"]), cla("api", api)];
        if aaa {
            v.push(cla("aaa", &["10.0.0.30"]));
        }
        v
    };
    server.set_snapshot(DEFAULT_NODE, snap("1", &base, &clas(&["10.0.0.20"], false)));
    let running = serve(&server).await;
    let s = Appliance::start("first-sotw", xds_cfg(running.addr, Mode::Sotw, "lb-s"), "").await;
    let d = Appliance::start("first-delta", xds_cfg(running.addr, Mode::Delta, "lb-d"), "").await;
    let dump = || format!("sotw {:?} {:#?}\ndelta {:?} {:#?}", s.served(), s.status(), d.served(), d.status());
    wait("the initial sync", || addrs(&s.served(), "web") == ["10.0.0.10"] && addrs(&d.served(), "web") == ["10.0.0.10"], dump).await;

    // "aaa" comes later on web's VIP: it is served, web is refused.
    let mut clash = base.clone();
    clash.push(on("aaa", "20.0.0.1"));
    server.set_snapshot(DEFAULT_NODE, snap("2", &clash, &clas(&["10.0.0.20"], true)));
    let aaa_first = |a: &Appliance| addrs(&a.served(), "aaa") == ["10.0.0.30"] && !a.served().contains_key("web") && a.status().refused == ["web"];
    wait("aaa served by the SotW appliance", || aaa_first(&s), dump).await;
    wait("aaa served by the delta appliance", || aaa_first(&d), dump).await;
    for delta in [false, true] {
        let n = nacks_of(&server, delta, CLUSTER_TYPE);
        let RequestKind::Nack(m) = &n.last().expect("a NACK").kind else { unreachable!() };
        assert!(m.contains("Cluster \"web\": 20.0.0.1:80/TCP is already claimed by cluster \"aaa\""), "{m}");
    }
    assert!(s.status().warming.is_empty() && d.status().warming.is_empty(), "{}", dump());

    // Another service's endpoints change while the conflict stands.
    server.set_snapshot(DEFAULT_NODE, snap("3", &clash, &clas(&["10.0.0.23"], true)));
    wait("api changes on the SotW appliance", || addrs(&s.served(), "api") == ["10.0.0.23"], dump).await;
    wait("api changes on the delta appliance", || addrs(&d.served(), "api") == ["10.0.0.23"], dump).await;

    // Appliances started now agree with those that saw it happen.
    let s2 = Appliance::start("first-sotw-late", xds_cfg(running.addr, Mode::Sotw, "lb-s2"), "").await;
    let d2 = Appliance::start("first-delta-late", xds_cfg(running.addr, Mode::Delta, "lb-d2"), "").await;
    wait("the late SotW appliance", || s2.served() == s.served() && s2.status().refused == ["web"], dump).await;
    wait("the late delta appliance", || d2.served() == d.served() && d2.status().refused == ["web"], dump).await;
    assert_eq!(s.served(), d.served());

    // aaa goes: web is served again.
    server.set_snapshot(DEFAULT_NODE, snap("4", &base, &clas(&["10.0.0.23"], false)));
    for a in [&s, &d, &s2, &d2] {
        wait("web again", || addrs(&a.served(), "web") == ["10.0.0.10"] && !a.served().contains_key("aaa") && a.status().refused.is_empty(), dump).await;
    }
    for a in [s, d, s2, d2] {
        a.stop().await;
    }
    running.stop().await;
}

/// A server that sends a refused SotW version again at once is answered
/// at most once a second for that version, and the repeats are counted;
/// the appliance still takes a new version at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_version_sent_again_at_once_is_nacked_at_most_once_a_second() {
    let server = XdsServer::new();
    server.set_resend_nacked(true);
    server.set_snapshot(DEFAULT_NODE, snap("good", &base_clusters(), &base_clas()));
    let running = serve(&server).await;
    let a = Appliance::start("nack-pace", xds_cfg(running.addr, Mode::Sotw, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}", a.served(), a.status());
    wait("the initial sync", || a.recorded("good"), dump).await;
    let mut bad = base_clusters();
    bad[0] = l4("web", "20.0.0.1/8", 80, "TCP");
    server.set_snapshot(DEFAULT_NODE, snap("bad", &bad, &base_clas()));
    wait("four NACKs of the bad version", || nacks_of(&server, false, CLUSTER_TYPE).len() >= 4, dump).await;
    let nacks = nacks_of(&server, false, CLUSTER_TYPE);
    let sent_bad = server.sent().iter().filter(|s| s.type_url == CLUSTER_TYPE && s.version == "bad").count();
    assert!(sent_bad >= 4, "the server sent the refused version again: {sent_bad}");
    for w in nacks.windows(2) {
        let gap = w[1].at - w[0].at;
        assert!(gap >= Duration::from_millis(950), "NACKs {gap:?} apart");
    }
    let st = a.status();
    assert!(st.types[CLUSTER_TYPE].repeated_nacks >= 3, "{st:#?}");
    assert_eq!(st.types[CLUSTER_TYPE].nacks, st.types[CLUSTER_TYPE].repeated_nacks + 1, "{st:#?}");
    // A fixed version is taken without waiting for the pace.
    let mut fixed = base_clusters();
    fixed.push(l4("new", "20.0.0.5", 80, "TCP"));
    let mut clas = base_clas();
    clas.push(cla("new", &["10.0.0.50"]));
    server.set_snapshot(DEFAULT_NODE, snap("fixed", &fixed, &clas));
    wait("the fixed version", || addrs(&a.served(), "new") == ["10.0.0.50"] && a.recorded("fixed"), dump).await;
    a.stop().await;
    running.stop().await;
}

/// Delta: an assignment refused for its cluster (its endpoints use a port
/// the cluster does not) is not sent again by the server; it is accepted
/// once the cluster changes to that port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_an_assignment_refused_for_its_cluster_is_taken_once_the_cluster_is_fixed() {
    let server = XdsServer::new();
    let with_port = |addr: &str, port: u64| {
        json!({"cluster_name": "web", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": addr, "port_value": port}}}}]}]})
    };
    server.set_snapshot(DEFAULT_NODE, snap("1", &[l4("web", "20.0.0.1", 80, "TCP")], &[with_port("10.0.0.10", 0)]));
    let running = serve(&server).await;
    let a = Appliance::start("delta-look-again", xds_cfg(running.addr, Mode::Delta, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}\nsent {:#?}", a.served(), a.status(), server.sent());
    wait("the initial sync", || addrs(&a.served(), "web") == ["10.0.0.10"], dump).await;
    server.set_snapshot(DEFAULT_NODE, snap("2", &[l4("web", "20.0.0.1", 80, "TCP")], &[with_port("10.0.0.11", 8080)]));
    wait("the NACK", || nacks_of(&server, true, CLA_TYPE).len() == 1, dump).await;
    assert_eq!(addrs(&a.served(), "web"), ["10.0.0.10"]);
    // The cluster moves to port 8080; the assignment is not sent again.
    let sent_before = server.sent().len();
    server.set_snapshot(DEFAULT_NODE, snap("3", &[l4("web", "20.0.0.1", 8080, "TCP")], &[with_port("10.0.0.11", 8080)]));
    wait("the new endpoints", || addrs(&a.served(), "web") == ["10.0.0.11"], dump).await;
    assert!(server.sent()[sent_before..].iter().all(|s| s.type_url == CLUSTER_TYPE), "{}", dump());
    assert_eq!(a.served()["web"].len(), 1);
    a.stop().await;
    running.stop().await;
}

/// `web` (from [`l4`]) with `health_checks` set to `checks`.
fn web_checked(checks: Vec<envoy_types::pb::envoy::config::core::v3::HealthCheck>) -> envoy_types::pb::envoy::config::cluster::v3::Cluster {
    let mut c = sluice_tests::xds_server::cluster(&l4("web", "20.0.0.1", 80, "TCP")).unwrap();
    c.health_checks = checks;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_health_checks_configure_the_services_active_check() {
    use envoy_types::pb::envoy::config::core::v3::health_check::{HealthChecker, HttpHealthCheck, GrpcHealthCheck};
    use envoy_types::pb::envoy::config::core::v3::HealthCheck;
    use envoy_types::pb::envoy::r#type::v3::Int64Range;
    use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
    let http = HealthCheck {
        interval: Some(PbDuration { seconds: 1, nanos: 0 }),
        timeout: Some(PbDuration { seconds: 0, nanos: 500_000_000 }),
        healthy_threshold: Some(UInt32Value { value: 2 }),
        unhealthy_threshold: Some(UInt32Value { value: 4 }),
        health_checker: Some(HealthChecker::HttpHealthCheck(HttpHealthCheck {
            path: "/healthz".into(),
            expected_statuses: vec![Int64Range { start: 200, end: 300 }],
            ..HttpHealthCheck::default()
        })),
        ..HealthCheck::default()
    };
    let server = XdsServer::new();
    let mut s = snap("1", &base_clusters(), &base_clas());
    s.add_cluster_with(web_checked(vec![http.clone()]), "web-http");
    server.set_snapshot(DEFAULT_NODE, s);
    let running = serve(&server).await;
    let a = Appliance::start("xds-checks", xds_cfg(running.addr, Mode::Sotw, "lb-1"), "").await;
    let dump = || format!("served {:?}\nstatus {:#?}", a.served(), a.status());
    let check = |name: &str| a.shared.control().services.iter().find(|s| s.name == name).and_then(|s| s.check.clone());
    wait("web with its check", || check("web").is_some(), dump).await;
    assert_eq!(check("web").unwrap(), "http/80 GET /healthz every 1000ms, timeout 500ms, rise 2, fall 4");
    assert_eq!(check("db"), None, "no health_checks, no check");

    // A gRPC check is refused with the reason; the check served stays.
    let mut grpc = http.clone();
    grpc.health_checker = Some(HealthChecker::GrpcHealthCheck(GrpcHealthCheck::default()));
    let mut s = snap("2", &base_clusters(), &base_clas());
    s.add_cluster_with(web_checked(vec![grpc]), "web-grpc");
    server.set_snapshot(DEFAULT_NODE, s);
    wait("a NACK", || !server.nacks().is_empty(), dump).await;
    assert!(server.nacks()[0].1.contains("gRPC checks are not supported"), "{:?}", server.nacks());
    assert!(check("web").is_some());
    // An interval under the bound is refused the same way.
    let mut fast = http.clone();
    fast.interval = Some(PbDuration { seconds: 0, nanos: 50_000_000 });
    let mut s = snap("3", &base_clusters(), &base_clas());
    s.add_cluster_with(web_checked(vec![fast]), "web-fast");
    server.set_snapshot(DEFAULT_NODE, s);
    wait("a second NACK", || server.nacks().len() == 2, dump).await;
    assert!(server.nacks()[1].1.contains("health check interval 50 ms is outside 100..=3600000"), "{:?}", server.nacks());

    // Over TLS where the cluster's transport socket is TLS, as Envoy's checks are.
    let mut tls = web_checked(vec![http.clone()]);
    tls.transport_socket = Some(envoy_types::pb::envoy::config::core::v3::TransportSocket { name: "envoy.transport_sockets.tls".into(), config_type: None });
    let mut s = snap("4", &base_clusters(), &base_clas());
    s.add_cluster_with(tls, "web-https");
    server.set_snapshot(DEFAULT_NODE, s);
    wait("web checked over TLS", || check("web").is_some_and(|c| c.starts_with("https/80 ")), dump).await;
    assert_eq!(check("web").unwrap(), "https/80 GET /healthz every 1000ms, timeout 500ms, rise 2, fall 4");

    // Without health_checks, no check.
    server.set_snapshot(DEFAULT_NODE, snap("5", &base_clusters(), &base_clas()));
    wait("web without a check", || check("web").is_none(), dump).await;
    a.stop().await;
    running.stop().await;
}
