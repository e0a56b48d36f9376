//! The Kubernetes source against a fake API server started by the test
//! (`sluice_tests::fake_apiserver`) that speaks the list and watch
//! protocol: lists with resourceVersion, ADDED/MODIFIED/DELETED, bookmarks,
//! 410 Gone, dropped connections, the server going away, and the status
//! PATCHes the source sends. The reconciler is stood in for by the model's
//! own checks, as the real one makes them.
//!
//! With `SLUICE_TEST_KUBECONFIG` set, `against_a_real_api_server` also
//! applies the CRDs and the example objects to that cluster and waits for
//! the appliance's status on them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value as Json};
use sluice::config::kubernetes::{AlgorithmConfiguration, KubeConfig, DEFAULT_GATEWAY_CLASS};
use sluice::config::manifests;
use sluice::model::{Defaults, Desired, Model, Origin};
use sluice::sources::kube::{self, KubeStatus};
use sluice::sources::SourceMsg;
use sluice_tests::fake_apiserver::{read_manifests, FakeApi};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// The namespace of the source's Gateway, and another one whose objects it
/// must never see; each test creates them (through the API) first.
const NS: &str = "sluice-kubesource-a";
const OTHER_NS: &str = "sluice-kubesource-b";
/// Longest wait for something the source does promptly (a guard against
/// hangs, not a performance claim).
const PROMPT: Duration = Duration::from_secs(20);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn normal(mut d: Desired) -> Desired {
    for r in &mut d.routes {
        r.origin = Origin::default();
    }
    for s in &mut d.services {
        s.origin = Origin::default();
    }
    let mut eps = d.endpoints.to_vec();
    for e in &mut eps {
        e.origin = Arc::default();
    }
    d.routes.sort_by(|a, b| a.name.cmp(&b.name));
    d.services.sort_by(|a, b| a.name.cmp(&b.name));
    eps.sort_by(|a, b| (&a.service, a.id).cmp(&(&b.service, b.id)));
    d.endpoints = eps.into();
    d
}

/// What the stand-in reconciler saw: each state it accepted, and every message.
#[derive(Debug, Default)]
struct Seen {
    accepted: Vec<Desired>,
    messages: usize,
}

/// A reconciler stand-in: checks each state as the model does and answers.
fn reconciler(mut rx: mpsc::Receiver<SourceMsg>) -> Arc<Mutex<Seen>> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let s = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            s.lock().unwrap().messages += 1;
            if let SourceMsg::Desired { source, desired, reply, .. } = m {
                assert_eq!(source, kube::SOURCE);
                let mut model = Model::default();
                model.set(&source, desired.clone());
                let outcome = model.resolve(&Defaults::default()).map(|_| ());
                if outcome.is_ok() {
                    s.lock().unwrap().accepted.push(desired);
                }
                if let Some(r) = reply {
                    let _ = r.send(outcome);
                }
            }
        }
    });
    seen
}

struct Running {
    api: FakeApi,
    seen: Arc<Mutex<Seen>>,
    status: watch::Receiver<KubeStatus>,
    cancel: CancellationToken,
    _dir: TempDir,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> TempDir {
    let d = std::env::temp_dir().join(format!("sluice-kubetest-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TempDir(d)
}

fn cfg(kubeconfig: PathBuf) -> KubeConfig {
    KubeConfig {
        gateway: "sllb-a".into(),
        namespace: NS.into(),
        kubeconfig: Some(kubeconfig),
        gateway_class: DEFAULT_GATEWAY_CLASS.into(),
        algorithm_configuration: AlgorithmConfiguration::Annotation,
        allow_algorithm_change: false,
    }
}

/// The fake server holding `configs/manifests` (and the same objects in
/// another namespace, which must never be seen), and the source running
/// against it.
async fn start(tag: &str) -> Running {
    let api = FakeApi::start_new().await;
    create_namespaces(&api, tag, &[NS, OTHER_NS]).await;
    api.set_bookmark_every(Duration::from_millis(200));
    for o in read_manifests(&root().join("configs/manifests"), NS).unwrap() {
        api.apply(o.clone());
        let mut other = o;
        other["metadata"]["namespace"] = json!(OTHER_NS);
        other["spec"]["destinationCIDRs"] = json!(["40.0.0.1/32"]);
        if other["kind"] == "L34Route" || other["kind"] == "Gateway" || other["kind"] == "Service" {
            api.apply(other);
        }
    }
    run_against(api, tag)
}

/// Creates the Namespaces `names` with `POST /api/v1/namespaces`, as a
/// client does on a real API server (which refuses objects in a namespace
/// that does not exist, as the fake one does).
async fn create_namespaces(api: &FakeApi, tag: &str, names: &[&str]) {
    use ::kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let dir = tempdir(&format!("{tag}-ns"));
    let kc = dir.0.join("kubeconfig");
    std::fs::write(&kc, api.kubeconfig("default")).unwrap();
    let client = sluice_controller::client::client(Some(&kc)).await.unwrap();
    let r = ApiResource { group: String::new(), version: "v1".into(), api_version: "v1".into(), kind: "Namespace".into(), plural: "namespaces".into() };
    let namespaces: Api<DynamicObject> = Api::all_with(client, &r);
    for name in names {
        let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})).unwrap();
        namespaces.create(&PostParams::default(), &obj).await.unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
    }
}

fn run_against(api: FakeApi, tag: &str) -> Running {
    let dir = tempdir(tag);
    let kc = dir.0.join("kubeconfig");
    std::fs::write(&kc, api.kubeconfig(NS)).unwrap();
    let (tx, rx) = mpsc::channel(16);
    let seen = reconciler(rx);
    let (status_tx, status) = watch::channel(KubeStatus::default());
    let cancel = CancellationToken::new();
    tokio::spawn(kube::run(cfg(kc), Defaults::default(), tx, status_tx, cancel.clone()));
    Running { api, seen, status, cancel, _dir: dir }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = tokio::time::Instant::now();
    while !f() {
        assert!(t0.elapsed() < PROMPT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every watch of the source has been handed three bookmarks
/// from after the last change on the server: what that change brought
/// back through the watches (the source's own status writes) was handed
/// over before them, and the source has had two bookmark periods to act.
async fn settled(r: &Running) {
    let rv = r.api.resource_version();
    until("three bookmarks after the last change on every watch", || {
        sluice::sources::kube::sync::KINDS.iter().all(|k| r.api.bookmarks(k).iter().filter(|&&b| b >= rv).count() >= 3)
    })
    .await;
}

impl Running {
    fn last(&self) -> Option<Desired> {
        self.seen.lock().unwrap().accepted.last().cloned()
    }

    fn accepted(&self) -> usize {
        self.seen.lock().unwrap().accepted.len()
    }

    fn status(&self) -> KubeStatus {
        self.status.borrow().clone()
    }

    fn lists(&self, plural: &str) -> usize {
        self.api.seen().iter().filter(|s| s.method == "GET" && !s.is_watch() && s.path.ends_with(plural)).count()
    }

    fn route_condition(&self, name: &str) -> Option<Json> {
        let r = self.api.get("L34Route", NS, name)?;
        r.pointer("/status/parents/0/conditions/0").cloned()
    }

    fn service_a_slice(&self) -> Json {
        self.api.get("EndpointSlice", NS, "service-a-abc12").unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_serves_the_gateway_follows_changes_and_writes_status() {
    let r = start("follow").await;
    // The first state is what the same objects give from a directory.
    until("a first state", || r.accepted() >= 1).await;
    // The source sums up what it serves once the reconciler has answered:
    // the status is read after that.
    until("the first state's summary", || !r.status().serving.starts_with("nothing from Kubernetes yet")).await;
    let from_dir = manifests::load(&root().join("configs/manifests"), "sllb-a").unwrap();
    assert_eq!(normal(r.last().unwrap()), normal(from_dir.clone()));
    let st = r.status();
    assert!(st.connected && st.synced, "{st:?}");
    assert_eq!(st.watched["L34Route"], 2, "only its namespace: {st:?}");
    assert_eq!(st.serving, "2 route(s), 1 service(s), 3 endpoint(s)");

    // Status: the Gateway's addresses and conditions, each route Accepted,
    // written with server-side apply under one field manager.
    until("the Gateway's status", || {
        r.api.get("Gateway", NS, "sllb-a").and_then(|g| g.pointer("/status/addresses").cloned())
            == Some(json!([{"type": "IPAddress", "value": "20.0.0.1"}, {"type": "IPAddress", "value": "20.0.0.2"}]))
    })
    .await;
    until("route status", || r.route_condition("vip-20-0-0-2-syn-only").is_some_and(|c| c["status"] == "True")).await;
    let gw = r.api.get("Gateway", NS, "sllb-a").unwrap();
    let conds = gw.pointer("/status/conditions").unwrap();
    assert_eq!((conds[0]["type"].as_str(), conds[0]["status"].as_str()), (Some("Accepted"), Some("True")));
    assert_eq!((conds[1]["type"].as_str(), conds[1]["status"].as_str()), (Some("Programmed"), Some("True")));
    let patches: Vec<_> = r.api.seen().into_iter().filter(|s| s.method == "PATCH").collect();
    assert!(!patches.is_empty(), "the status came by PATCH");
    assert!(patches.iter().all(|p| p.content_type == "application/apply-patch+yaml"
        && p.query.get("fieldManager").map(String::as_str) == Some("sluice")
        && p.query.get("force").map(String::as_str) == Some("true")), "{patches:#?}");
    assert!(patches.iter().all(|p| p.path.ends_with("/status") && p.path.contains(&format!("/namespaces/{NS}/"))));
    assert!(r.api.get("Gateway", OTHER_NS, "sllb-a").unwrap().get("status").is_none_or(Json::is_null), "never another namespace's");

    // Written only when it changes: bookmarks and our own writes coming
    // back through the watch write nothing more.
    let writes = |r: &Running| r.api.seen().iter().filter(|s| s.method == "PATCH").count();
    let n = writes(&r);
    settled(&r).await;
    assert_eq!(writes(&r), n, "status is written once, then left alone");
    let watches: Vec<_> = r.api.seen().into_iter().filter(|s| s.is_watch()).collect();
    assert!(watches.iter().all(|w| w.query.get("allowWatchBookmarks").map(String::as_str) == Some("true")));
    assert!(watches.iter().any(|w| w.query.get("labelSelector").map(String::as_str) == Some("service.kubernetes.io/service-proxy-name=sllb-a")));
    assert!(watches.iter().any(|w| w.query.get("fieldSelector").map(String::as_str) == Some("metadata.name=sllb-a")));

    // MODIFIED: an endpoint leaves its slice.
    let mut slice = r.service_a_slice();
    slice["endpoints"].as_array_mut().unwrap().remove(1);
    r.api.apply(slice);
    until("the endpoint gone", || r.last().is_some_and(|d| d.endpoints.len() == 2)).await;
    assert!(r.last().unwrap().endpoints.iter().all(|e| e.address.to_string() != "10.200.0.12"));

    // ADDED: a wrong route is refused with its reason, the others stay.
    let before = r.accepted();
    r.api.apply(json!({
        "apiVersion": "meridio.experiment.gateway.api.poc/v1alpha1", "kind": "L34Route",
        "metadata": {"name": "to-nowhere", "namespace": NS},
        "spec": {"parentRefs": [{"name": "sllb-a"}], "backendRefs": [{"name": "nope", "port": 1}], "destinationCIDRs": ["20.0.0.9/32"]}
    }));
    until("the refusal in the route's status", || r.route_condition("to-nowhere").is_some_and(|c| c["reason"] == "BackendNotFound")).await;
    let c = r.route_condition("to-nowhere").unwrap();
    assert_eq!(c["status"], "False");
    assert!(c["message"].as_str().unwrap().contains("route to an unknown service \"nope\""), "{c}");
    assert_eq!(r.accepted(), before, "the state served did not change");
    assert!(r.status().refused.iter().any(|x| x.object == format!("kubernetes: L34Route/{NS}/to-nowhere")));

    // DELETED: a route goes, and with it its VIP from the Gateway's status.
    r.api.delete("L34Route", NS, "vip-20-0-0-2-syn-only");
    until("the route gone", || r.last().is_some_and(|d| d.routes.len() == 1)).await;
    until("the VIP gone from the Gateway", || {
        r.api.get("Gateway", NS, "sllb-a").and_then(|g| g.pointer("/status/addresses").cloned()) == Some(json!([{"type": "IPAddress", "value": "20.0.0.1"}]))
    })
    .await;

    // GatewayRouters are parsed and kept for the routing side.
    r.api.apply(json!({
        "apiVersion": "meridio.experiment.gateway.api.poc/v1alpha1", "kind": "GatewayRouter",
        "metadata": {"name": "gateway-a-v4", "namespace": NS, "labels": {"service.kubernetes.io/service-proxy-name": "sllb-a"}},
        "spec": {"address": "169.254.100.150", "interface": "vlan-100", "bgp": {"localASN": 8103, "remoteASN": 4_248_829_953_u32, "holdTime": "24s"}}
    }));
    until("the router", || r.status().routers.iter().any(|x| x.name == "gateway-a-v4" && x.spec.interface == "vlan-100")).await;
    r.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gatewayrouter_crd_the_rest_is_served_and_status_says_what_is_not() {
    let api = FakeApi::start_new().await;
    create_namespaces(&api, "nocrd", &[NS]).await;
    api.set_kind_installed("GatewayRouter", false);
    for o in read_manifests(&root().join("configs/manifests"), NS).unwrap() {
        api.apply(o);
    }
    let r = run_against(api, "nocrd");
    until("a state served without GatewayRouters", || r.accepted() >= 1).await;
    let from_dir = manifests::load(&root().join("configs/manifests"), "sllb-a").unwrap();
    assert_eq!(normal(r.last().unwrap()), normal(from_dir));
    until("the summary", || !r.status().serving.starts_with("nothing from Kubernetes yet")).await;
    let st = r.status();
    assert_eq!(st.not_served.len(), 1, "{st:?}");
    assert!(st.not_served[0].contains("no GatewayRouter resource") && st.not_served[0].contains("CRD"), "{st:?}");
    assert!(st.serving.contains("not served: "), "{}", st.serving);

    // The CRD installed: its objects are followed and nothing is missing.
    r.api.set_kind_installed("GatewayRouter", true);
    r.api.apply(json!({
        "apiVersion": "meridio.experiment.gateway.api.poc/v1alpha1", "kind": "GatewayRouter",
        "metadata": {"name": "gateway-a-v4", "namespace": NS, "labels": {"service.kubernetes.io/service-proxy-name": "sllb-a"}},
        "spec": {"address": "169.254.100.150", "interface": "vlan-100", "bgp": {"localASN": 8103, "remoteASN": 4_248_829_953_u32, "holdTime": "24s"}}
    }));
    until("the router, once its CRD is there", || {
        let st = r.status();
        st.not_served.is_empty() && st.routers.iter().any(|x| x.name == "gateway-a-v4")
    })
    .await;
    r.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_deleted_or_of_another_class_is_no_longer_served_and_its_status_cleared() {
    let r = start("gone").await;
    until("the first state", || r.last().is_some_and(|d| d.routes.len() == 2)).await;
    until("route status", || r.route_condition("vip-20-0-0-1-web").is_some_and(|c| c["status"] == "True")).await;
    let gw = r.api.get("Gateway", NS, "sllb-a").unwrap();

    // The API unreachable: nothing is sent, what is served stays.
    let sent = r.seen.lock().unwrap().messages;
    r.api.stop();
    until("the source sees the API gone", || !r.status().connected).await;
    assert_eq!(r.seen.lock().unwrap().messages, sent, "nothing sent while the API is unreachable");
    r.api.start().await;
    until("the source sees the API back", || r.status().connected).await;
    assert_eq!(r.last().unwrap().routes.len(), 2);

    // Deleted (a DELETED event): its VIPs are no longer served, and the
    // routes no longer say they are accepted by it.
    r.api.delete("Gateway", NS, "sllb-a");
    until("nothing served after the Gateway's deletion", || r.last().is_some_and(|d| d.routes.is_empty() && d.services.is_empty() && d.endpoints.is_empty())).await;
    until("the routes' status for it cleared", || r.route_condition("vip-20-0-0-1-web").is_none()).await;
    until("the summary", || r.status().serving.starts_with("nothing from Kubernetes")).await;

    // Back: served again.
    let mut back = gw.clone();
    if let Some(st) = back.as_object_mut() {
        st.remove("status");
    }
    r.api.apply(back.clone());
    until("served again", || r.last().is_some_and(|d| d.routes.len() == 2)).await;
    until("its status written again", || {
        r.api.get("Gateway", NS, "sllb-a").and_then(|g| g.pointer("/status/conditions/0/message").cloned()) == Some(json!("served by Sluice"))
    })
    .await;

    // Another class: not served, and the conditions Sluice wrote go.
    back["spec"]["gatewayClassName"] = json!("someone-else/lb");
    r.api.apply(back);
    until("nothing served after the class change", || r.last().is_some_and(|d| d.routes.is_empty())).await;
    until("the Gateway's conditions and addresses cleared", || {
        let g = r.api.get("Gateway", NS, "sllb-a").unwrap();
        let conds = g.pointer("/status/conditions").and_then(Json::as_array).cloned().unwrap_or_default();
        !conds.iter().any(|c| c["type"] == "Accepted" || c["type"] == "Programmed") && g.pointer("/status/addresses").is_none()
    })
    .await;
    until("the routes' status for it cleared", || r.route_condition("vip-20-0-0-1-web").is_none()).await;
    r.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_object_gets_an_event_once_per_generation() {
    let r = start("events").await;
    until("the first state", || r.last().is_some_and(|d| d.routes.len() == 2)).await;
    let mut route = json!({
        "apiVersion": "meridio.experiment.gateway.api.poc/v1alpha1", "kind": "L34Route",
        "metadata": {"name": "to-nowhere", "namespace": NS},
        "spec": {"parentRefs": [{"name": "sllb-a"}], "backendRefs": [{"name": "nope", "port": 1}], "destinationCIDRs": ["20.0.0.9/32"]}
    });
    r.api.apply(route.clone());
    // How many times an Event on the route was published (an event seen
    // again is the same object with a series count).
    let told = |r: &Running| -> Vec<(String, i64)> {
        r.api
            .objects()
            .get("Event")
            .map(|m| {
                m.values()
                    .filter(|e| e["regarding"]["name"] == "to-nowhere")
                    .map(|e| (e["reason"].as_str().unwrap_or("").to_owned(), e["series"]["count"].as_i64().unwrap_or(1)))
                    .collect()
            })
            .unwrap_or_default()
    };
    until("an event on the refused route", || !told(&r).is_empty()).await;
    assert_eq!(told(&r), vec![("BackendNotFound".to_owned(), 1)]);
    let ev = r.api.objects()["Event"].values().find(|e| e["regarding"]["name"] == "to-nowhere").cloned().unwrap();
    assert_eq!(ev["apiVersion"], "events.k8s.io/v1");
    assert_eq!((ev["type"].as_str(), ev["regarding"]["kind"].as_str()), (Some("Warning"), Some("L34Route")));
    assert!(ev["note"].as_str().unwrap().contains("route to an unknown service \"nope\""), "{ev}");

    // Another change, the route as it was: nothing more said about it.
    let mut slice = r.service_a_slice();
    slice["endpoints"].as_array_mut().unwrap().remove(1);
    r.api.apply(slice);
    until("the other change served", || r.last().is_some_and(|d| d.endpoints.len() == 2)).await;
    until("its status written", || r.route_condition("to-nowhere").is_some()).await;
    assert_eq!(told(&r), vec![("BackendNotFound".to_owned(), 1)], "said once for this generation");

    // A new generation, still wrong: said again.
    route["spec"]["backendRefs"] = json!([{"name": "nope-either", "port": 1}]);
    r.api.apply(route);
    until("the new generation's event", || told(&r).iter().map(|(_, n)| n).sum::<i64>() >= 2).await;
    r.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_resume_and_410_gone_relists() {
    let r = start("resume").await;
    until("a first state", || r.accepted() >= 1).await;
    let lists = r.lists("endpointslices");
    let watch_rvs = |r: &Running| -> Vec<u64> {
        r.api.seen().iter().filter(|s| s.is_watch() && s.path.ends_with("endpointslices")).filter_map(|s| s.query.get("resourceVersion")?.parse().ok()).collect()
    };
    // Bookmarks move the version a watch resumes from: one past the
    // version the watch started at has been handed over.
    until("a bookmark past the watch's first version", || {
        watch_rvs(&r).first().is_some_and(|&from| r.api.bookmarks("EndpointSlice").iter().any(|&b| b > from))
    })
    .await;
    let first = watch_rvs(&r);

    // Dropped connections: the watches come back from where they were,
    // without listing again, and changes keep arriving.
    r.api.drop_watches();
    until("watching again", || watch_rvs(&r).len() > first.len()).await;
    assert!(watch_rvs(&r).last() > first.first(), "resumed from a later version (a bookmark's): {:?}", watch_rvs(&r));
    assert_eq!(r.lists("endpointslices"), lists, "no relist after a dropped connection");
    let mut slice = r.service_a_slice();
    slice["endpoints"].as_array_mut().unwrap().remove(0);
    r.api.apply(slice);
    until("the change after the drop", || r.last().is_some_and(|d| d.endpoints.len() == 2)).await;

    // 410 Gone: while the watches are cut, an object changes and the
    // history is compacted; the source lists again and sees the change.
    r.api.stop();
    let mut slice = r.service_a_slice();
    slice["endpoints"].as_array_mut().unwrap().remove(0);
    r.api.apply(slice);
    r.api.compact();
    r.api.start().await;
    until("a relist", || r.lists("endpointslices") > lists).await;
    until("the change seen through the relist", || r.last().is_some_and(|d| d.endpoints.len() == 1)).await;
    until("connected again", || r.status().connected).await;
    r.cancel.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_api_never_flushes_and_a_restart_without_it_says_why() {
    let r = start("down").await;
    until("a first state", || r.accepted() >= 1).await;
    settled(&r).await;
    let messages = r.seen.lock().unwrap().messages;
    r.api.stop();
    until("the source to notice", || !r.status().connected).await;
    assert_eq!(r.seen.lock().unwrap().messages, messages, "nothing is sent when the API goes away");
    let st = r.status();
    assert!(st.last_error.is_some(), "{st:?}");
    assert_eq!(st.serving, "2 route(s), 1 service(s), 3 endpoint(s)", "still serving what it served");

    // Back: it reconnects and serves changes made meanwhile. What it sent
    // in between is counted: the change only, so nothing was sent while
    // the API was away (a flush, or the state sent again).
    r.api.start().await;
    until("connected again", || r.status().connected).await;
    r.api.delete("L34Route", NS, "vip-20-0-0-2-syn-only");
    until("a change after the return", || r.last().is_some_and(|d| d.routes.len() == 1)).await;
    assert_eq!(r.seen.lock().unwrap().messages, messages + 1, "only the change was sent since the API went away");
    r.cancel.cancel();

    // A restart with the API down: nothing is sent, and the status says why.
    let api = FakeApi::start_new().await;
    api.stop();
    let r = run_against(api, "restart-down");
    // Checked once the source has tried and failed: with the API down
    // from the start nothing can be listed, so nothing can come later.
    until("an error", || r.status().last_error.is_some()).await;
    let st = r.status();
    assert!(!st.connected && !st.synced, "{st:?}");
    assert_eq!(st.waiting_for.len(), 5, "{st:?}");
    assert!(st.serving.starts_with("nothing from Kubernetes yet"), "{st:?}");
    assert_eq!(r.seen.lock().unwrap().messages, 0, "nothing sent before every kind is listed");
    r.cancel.cancel();
}

/// Against a real cluster, when `SLUICE_TEST_KUBECONFIG` names one (with
/// the Gateway API CRDs installed and kubectl on the PATH): applies the CRDs
/// and the example objects of configs/k8s, runs the source, and waits for
/// its status on the Gateway and the routes. Opt in:
/// `SLUICE_TEST_KUBECONFIG=... cargo test --test kube_source -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SLUICE_TEST_KUBECONFIG: a real API server"]
async fn against_a_real_api_server() {
    let kc = std::env::var("SLUICE_TEST_KUBECONFIG").expect("SLUICE_TEST_KUBECONFIG names the real API server's kubeconfig");
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new("kubectl").arg("--kubeconfig").arg(&kc).args(args).output().expect("kubectl");
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let k8s = root().join("configs/k8s");
    kubectl(&["apply", "-f", k8s.join("crds").to_str().unwrap()]);
    kubectl(&["wait", "--for=condition=Established", "crd/l34routes.meridio.experiment.gateway.api.poc", "--timeout=60s"]);
    let _ = std::process::Command::new("kubectl").arg("--kubeconfig").arg(&kc).args(["create", "namespace", NS]).output();
    kubectl(&["apply", "-n", NS, "-f", k8s.join("examples").to_str().unwrap()]);
    // (The example GatewayClass has a valid name, not the design's, which
    // the API server refuses: see configs/k8s/examples/gatewayclass.yaml.)
    let (tx, rx) = mpsc::channel(16);
    let seen = reconciler(rx);
    let (status_tx, status) = watch::channel(KubeStatus::default());
    let cancel = CancellationToken::new();
    tokio::spawn(kube::run(cfg(PathBuf::from(&kc)), Defaults::default(), tx, status_tx, cancel.clone()));
    let t0 = tokio::time::Instant::now();
    loop {
        let out = kubectl(&["get", "gateway", "sllb-a", "-n", NS, "-o", "jsonpath={.status.addresses[*].value}"]);
        if out.contains("20.0.0.1") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "no status on the Gateway: {:?}", *status.borrow());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let route = kubectl(&["get", "l34route", "vip-20-0-0-1-multi-ports-a", "-n", NS, "-o", "jsonpath={.status.parents[0].conditions[0].status}"]);
    assert_eq!(route, "True");
    assert!(!seen.lock().unwrap().accepted.is_empty());
    cancel.cancel();
}

/// The `sluice-fake-apiserver` binary serves a directory and follows its
/// edits: the source sees a file edit as a change of the object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_apiserver_binary_follows_its_directory() {
    use std::io::{BufRead, BufReader};
    let dir = tempdir("bin");
    let manifests = dir.0.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for f in std::fs::read_dir(root().join("configs/manifests")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, manifests.join(f.file_name().unwrap())).unwrap();
    }
    let kc = dir.0.join("kubeconfig");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-fake-apiserver"))
        .args(["--dir", manifests.to_str().unwrap(), "--namespace", NS, "--kubeconfig-out", kc.to_str().unwrap()])
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
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _child = Kill(child);
    assert!(line.starts_with("listening on http://127.0.0.1:"), "{line}");

    let (tx, rx) = mpsc::channel(16);
    let seen = reconciler(rx);
    let (status_tx, _status) = watch::channel(KubeStatus::default());
    let cancel = CancellationToken::new();
    tokio::spawn(kube::run(cfg(kc), Defaults::default(), tx, status_tx, cancel.clone()));
    let last = || seen.lock().unwrap().accepted.last().cloned();
    until("a first state", || last().is_some()).await;
    assert_eq!(normal(last().unwrap()), normal(manifests::load(&root().join("configs/manifests"), "sllb-a").unwrap()));

    let slice = manifests.join("endpointslice.yaml");
    let text = std::fs::read_to_string(&slice).unwrap().replace("- addresses: [10.200.0.12]\n  conditions: {ready: true}\n", "");
    std::fs::write(&slice, text).unwrap();
    until("the edit served", || last().is_some_and(|d| d.endpoints.len() == 2)).await;
    cancel.cancel();
}

/// The fake API server, as a real one, refuses an object in a namespace
/// that does not exist (404), and takes it once the Namespace is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fake_apiserver_refuses_objects_in_a_namespace_that_does_not_exist() {
    use ::kube::api::{Api, ApiResource, DynamicObject, PostParams};
    let api = FakeApi::start_new().await;
    let dir = tempdir("nons");
    let kc = dir.0.join("kubeconfig");
    std::fs::write(&kc, api.kubeconfig(NS)).unwrap();
    let client = sluice_controller::client::client(Some(&kc)).await.unwrap();
    let r = ApiResource { group: String::new(), version: "v1".into(), api_version: "v1".into(), kind: "ConfigMap".into(), plural: "configmaps".into() };
    let configmaps: Api<DynamicObject> = Api::namespaced_with(client, NS, &r);
    let cm: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}})).unwrap();
    match configmaps.create(&PostParams::default(), &cm).await {
        Err(::kube::Error::Api(e)) if e.code == 404 => {}
        other => panic!("a create into a namespace that does not exist: {other:?}"),
    }
    assert!(api.get("ConfigMap", NS, "c").is_none());
    create_namespaces(&api, "nons", &[NS]).await;
    configmaps.create(&PostParams::default(), &cm).await.unwrap();
    assert!(api.get("ConfigMap", NS, "c").is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_services_health_check_annotation_configures_its_active_check() {
    let r = start("check").await;
    until("the first state", || r.last().is_some_and(|d| d.services.len() == 1)).await;
    assert_eq!(r.last().unwrap().services[0].check, None);
    let mut svc = r.api.get("Service", NS, "service-a").unwrap();
    svc["metadata"]["annotations"]["sluice.io/health-check"] = json!("{protocol: tcp, port: 80, intervalMs: 1000, fall: 2}");
    r.api.apply(svc.clone());
    until("the check served", || r.last().is_some_and(|d| d.services.first().is_some_and(|s| s.check.is_some()))).await;
    let check = r.last().unwrap().services[0].check.clone().unwrap();
    assert_eq!(check.to_string(), "tcp/80 every 1000ms, timeout 1000ms, rise 2, fall 2");

    // A wrong one refuses the Service, with the reason in the status.
    svc["metadata"]["annotations"]["sluice.io/health-check"] = json!("{protocol: tcp, port: 80, rise: 0}");
    r.api.apply(svc);
    until("the refusal", || r.status().refused.iter().any(|x| x.object.contains("service-a"))).await;
    let st = r.status();
    let why = st.refused.iter().find(|x| x.object.contains("service-a")).unwrap();
    assert!(format!("{why:?}").contains("sluice.io/health-check.rise: 0 is out of range 1..=100"), "{why:?}");
    r.cancel.cancel();
}
