//! `sluice-controller` against an API server: the fake one of
//! `sluice_tests::fake_apiserver`, started by each test, and, with
//! `SLUICE_TEST_KUBECONFIG` set, a real one (in a namespace the test
//! creates and deletes; the cluster needs the Gateway API CRDs).
//!
//! The controller runs in-process ([`sluice_controller::client::run`]);
//! the test writes objects and reads what the controller wrote through a
//! Kubernetes client, as any client would.
//!
//! - pods with Multus network-status annotations give the expected
//!   EndpointSlices; deleting one pod frees only its identifier; a pod
//!   arriving later takes the freed one; a restarted controller reads the
//!   identifiers back and has nothing to write;
//! - the Deployment of a Gateway has the template's fields and follows its
//!   parametersRef ConfigMap; a wrong ConfigMap leaves it as it was and the
//!   Gateway's condition says why; deleting the Gateway removes it;
//! - a full Service says so in an event and in the Gateway's condition;
//! - a second controller does not write while the first holds the Lease,
//!   and takes over when the first stops.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value as Json};
use sluice_controller::client::{self, Options, Status};
use sluice_controller::lease::LeaseConfig;
use sluice_controller::{Settings, COND_ACCEPTED, COND_ENDPOINTS};
use sluice_tests::fake_apiserver::FakeApi;
use tokio_util::sync::CancellationToken;

/// Longest wait for something the controller does promptly (a guard
/// against hangs, not a performance claim).
const PROMPT: Duration = Duration::from_secs(30);

/// Where the test runs: an API server, a namespace, a kubeconfig file.
struct Env {
    _fake: Option<FakeApi>,
    kubeconfig: PathBuf,
    ns: String,
    client: Client,
    real: bool,
}

impl Env {
    async fn fake(tag: &str) -> Env {
        let fake = FakeApi::start_new().await;
        let ns = format!("ctrl-{tag}");
        let kubeconfig = std::env::temp_dir().join(format!("sluice-ctrl-{}-{tag}.kubeconfig", std::process::id()));
        std::fs::write(&kubeconfig, fake.kubeconfig(&ns)).unwrap();
        let client = client::client(Some(&kubeconfig)).await.unwrap();
        create_namespace(&client, &ns).await;
        Env { _fake: Some(fake), kubeconfig, ns, client, real: false }
    }

    async fn real(tag: &str) -> Env {
        let path = std::env::var_os("SLUICE_TEST_KUBECONFIG").expect("SLUICE_TEST_KUBECONFIG names the real API server's kubeconfig");
        let kubeconfig = PathBuf::from(path);
        let client = client::client(Some(&kubeconfig)).await.unwrap();
        let ns = format!("sluice-ctrl-{tag}-{}", std::process::id());
        create_namespace(&client, &ns).await;
        Env { _fake: None, kubeconfig, ns, client, real: true }
    }

    fn api(&self, kind: &str) -> kube::Api<DynamicObject> {
        let r = match kind {
            "Gateway" => ar("gateway.networking.k8s.io/v1", "Gateway", "gateways"),
            "Service" => ar("v1", "Service", "services"),
            "Pod" => ar("v1", "Pod", "pods"),
            "ConfigMap" => ar("v1", "ConfigMap", "configmaps"),
            "EndpointSlice" => ar("discovery.k8s.io/v1", "EndpointSlice", "endpointslices"),
            "Deployment" => ar("apps/v1", "Deployment", "deployments"),
            "Event" => ar("events.k8s.io/v1", "Event", "events"),
            "Lease" => ar("coordination.k8s.io/v1", "Lease", "leases"),
            other => panic!("{other}"),
        };
        kube::Api::namespaced_with(self.client.clone(), &self.ns, &r)
    }

    /// Creates `obj` (in the test's namespace); its status, if any, is
    /// written too (an API server ignores it on create).
    async fn create(&self, obj: Json) {
        let kind = obj["kind"].as_str().unwrap().to_owned();
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let mut o: DynamicObject = serde_json::from_value(obj.clone()).unwrap();
        o.metadata.namespace = Some(self.ns.clone());
        let api = self.api(&kind);
        api.create(&PostParams::default(), &o).await.unwrap_or_else(|e| panic!("creating {kind} {name}: {e}"));
        if let Some(st) = obj.get("status") {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": st}))).await.unwrap();
        }
    }

    async fn update(&self, obj: Json) {
        let kind = obj["kind"].as_str().unwrap().to_owned();
        let name = obj["metadata"]["name"].as_str().unwrap().to_owned();
        let mut o = obj.clone();
        o["metadata"]["namespace"] = json!(self.ns);
        self.api(&kind).patch(&name, &PatchParams::apply("sluice-test").force(), &Patch::Apply(&o)).await.unwrap();
    }

    async fn delete(&self, kind: &str, name: &str) {
        self.api(kind).delete(name, &DeleteParams::default()).await.unwrap();
    }

    async fn get(&self, kind: &str, name: &str) -> Option<Json> {
        self.api(kind).get_opt(name).await.unwrap().map(|o| serde_json::to_value(o).unwrap())
    }

    async fn list(&self, kind: &str) -> Vec<Json> {
        self.api(kind).list(&Default::default()).await.unwrap().items.into_iter().map(|o| serde_json::to_value(o).unwrap()).collect()
    }

    /// Starts a controller; stopped with the token.
    fn controller(&self, identity: &str) -> (Arc<Mutex<Status>>, CancellationToken, tokio::task::JoinHandle<()>) {
        let mut lease = LeaseConfig::new(self.ns.clone(), "sluice-controller".into(), identity.into());
        lease.duration = Duration::from_secs(3);
        lease.renew_deadline = Duration::from_secs(2);
        lease.retry = Duration::from_millis(250);
        let opts = Options { kubeconfig: Some(self.kubeconfig.clone()), namespace: Some(self.ns.clone()), settings: Settings::defaults().unwrap(), lease };
        let status = Arc::new(Mutex::new(Status::default()));
        let cancel = CancellationToken::new();
        let (s, c) = (Arc::clone(&status), cancel.clone());
        let task = tokio::spawn(async move { client::run(opts, s, c).await.unwrap() });
        (status, cancel, task)
    }

    async fn cleanup(self) {
        if self.real {
            let api: kube::Api<DynamicObject> = kube::Api::all_with(self.client.clone(), &ar("v1", "Namespace", "namespaces"));
            let _ = api.delete(&self.ns, &DeleteParams::default()).await;
        } else {
            let _ = std::fs::remove_file(&self.kubeconfig);
        }
    }
}

/// Creates the Namespace `ns` (the fake API server, as a real one, refuses
/// objects in a namespace that does not exist).
async fn create_namespace(client: &Client, ns: &str) {
    let api: kube::Api<DynamicObject> = kube::Api::all_with(client.clone(), &ar("v1", "Namespace", "namespaces"));
    let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap_or_else(|e| panic!("creating namespace {ns}: {e}"));
}

fn ar(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource { group: group.into(), version: version.into(), api_version: api_version.into(), kind: kind.into(), plural: plural.into() }
}

async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = tokio::time::Instant::now() + PROMPT;
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{what}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

fn gateway(config: Option<&str>) -> Json {
    let mut g = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
        "metadata": {"name": "sllb-a"},
        "spec": {"gatewayClassName": "meridio-experiment/stateless-load-balancer",
            "listeners": [{"name": "all", "port": 4000, "protocol": "TCP"}],
            "infrastructure": {"annotations": {
                "k8s.v1.cni.cncf.io/networks": r#"[{"name":"vlan-100","interface":"vlan-100"},{"name":"macvlan-nad-1","interface":"net1"}]"#,
                "meridio-experiment/networks": r#"[{"name":"macvlan-nad-1","interface":"net1"}]"#,
                "meridio-experiment/network-subnets": r#"["169.111.100.0/24"]"#}}}});
    if let Some(c) = config {
        g["spec"]["infrastructure"]["parametersRef"] = json!({"group": "", "kind": "ConfigMap", "name": c});
    }
    g
}

fn service(limit: Option<u32>) -> Json {
    let mut s = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "service-a", "labels": {"service.kubernetes.io/service-proxy-name": "sllb-a"}},
        "spec": {"clusterIP": "None", "selector": {"app": "target", "meridio-experiment/dummy-service-selector": "true"}, "ports": [{"name": "web", "port": 80, "protocol": "TCP"}]}});
    if let Some(l) = limit {
        s["metadata"]["annotations"] = json!({"sluice.io/endpoint-limit": l.to_string()});
    }
    s
}

fn pod(ns: &str, name: &str, ip: &str) -> Json {
    let status = json!([
        {"name": "cbr0", "interface": "eth0", "ips": ["10.244.0.9"], "default": true},
        {"name": format!("{ns}/macvlan-nad-1"), "interface": "net1", "ips": [ip]},
    ]);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "target"}, "annotations": {"k8s.v1.cni.cncf.io/network-status": status.to_string()}},
        "spec": {"containers": [{"name": "app", "image": "example"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn ids(slice: &Json) -> std::collections::BTreeMap<String, u32> {
    serde_json::from_str(slice["metadata"]["annotations"]["sluice.io/endpoint-ids"].as_str().unwrap_or("{}")).unwrap()
}

async fn slice_ids(env: &Env) -> Result<std::collections::BTreeMap<String, u32>, String> {
    let s = env.get("EndpointSlice", "service-a-sluice-v4").await.ok_or("no slice yet")?;
    Ok(ids(&s))
}

fn map(v: &[(&str, u32)]) -> std::collections::BTreeMap<String, u32> {
    v.iter().map(|(k, i)| ((*k).to_owned(), *i)).collect()
}

/// Pods → slices; a deleted pod frees only its identifier; a restart
/// changes nothing.
async fn slices_scenario(env: &Env) {
    env.create(gateway(None)).await;
    env.create(service(None)).await;
    for (i, name) in ["target-1", "target-2", "target-3"].iter().enumerate() {
        env.create(pod(&env.ns, name, &format!("169.111.100.{}", i + 2))).await;
        // Creation order decides identifiers: give each pod its own second.
        if env.real {
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    env.create(pod(&env.ns, "elsewhere", "169.111.200.9")).await;
    let (status, stop, task) = env.controller("first");
    let want = map(&[("169.111.100.2", 0), ("169.111.100.3", 1), ("169.111.100.4", 2)]);
    eventually("the slice lists the three pods", || async {
        let got = slice_ids(env).await?;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    let s = env.get("EndpointSlice", "service-a-sluice-v4").await.unwrap();
    assert_eq!(s["addressType"], "IPv4");
    assert_eq!(s["metadata"]["labels"]["kubernetes.io/service-name"], "service-a");
    assert_eq!(s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"], "sluice-controller.sluice.io");
    assert_eq!(s["metadata"]["ownerReferences"][0]["kind"], "Service");
    assert_eq!(s["ports"], json!([{"name": "web", "port": 80, "protocol": "TCP"}]));
    let eps = s["endpoints"].as_array().unwrap();
    assert_eq!(eps.len(), 3);
    assert!(eps.iter().all(|e| e["conditions"]["ready"] == true), "{s}");
    // The pass records what it left out after its writes: wait for it.
    let key = format!("{}/service-a", env.ns);
    eventually("the pod outside the subnets is listed as ignored", || async {
        let ignored = status.lock().unwrap().ignored.clone();
        match ignored.get(&key) {
            Some(i) if i.iter().any(|i| i.starts_with("elsewhere: OutsideSubnets")) => Ok(()),
            _ => Err(format!("{ignored:?}")),
        }
    })
    .await;

    // Deleting a pod frees its identifier only.
    env.delete("Pod", "target-2").await;
    let want = map(&[("169.111.100.2", 0), ("169.111.100.4", 2)]);
    eventually("the slice drops the deleted pod only", || async {
        let got = slice_ids(env).await?;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    // A new pod takes the freed identifier; nobody else moves.
    env.create(pod(&env.ns, "target-4", "169.111.100.5")).await;
    let want = map(&[("169.111.100.2", 0), ("169.111.100.4", 2), ("169.111.100.5", 1)]);
    eventually("the new pod takes the freed identifier", || async {
        let got = slice_ids(env).await?;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;

    // A restarted controller reads the identifiers back: nothing to write.
    stop.cancel();
    task.await.unwrap();
    let (status, stop, task) = env.controller("second");
    // A pass records what it left out after its writes: once the pod
    // outside the subnets is listed, the first pass is over.
    eventually("the new controller leads and has made a pass", || async {
        let s = status.lock().unwrap().clone();
        let passed = s.ignored.get(&key).is_some_and(|i| i.iter().any(|i| i.starts_with("elsewhere: OutsideSubnets")));
        if s.leader && s.synced && passed { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    assert_eq!(slice_ids(env).await.unwrap(), want);
    let s = status.lock().unwrap().clone();
    assert_eq!((s.writes, s.write_errors), (0, 0), "a restart writes nothing: {s:?}");
    stop.cancel();
    task.await.unwrap();
}

const CONFIG: &str = "apiVersion: meridio.experiment.gateway.api.poc/v1alpha1\nkind: SLLBRConfig\nreplicas: 2\n\
sllb:\n  resources:\n    requests: {memory: 64Mi, cpu: 250m}\n    limits: {memory: 128Mi, cpu: 500m}\n";

fn config_map(text: &str) -> Json {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sllb-a-config"}, "data": {"config.conf": text}})
}

fn condition(gw: &Json, t: &str) -> Option<Json> {
    gw["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == t).cloned()
}

/// The Deployment follows the template and the parametersRef ConfigMap.
async fn deployment_scenario(env: &Env) {
    env.create(config_map(CONFIG)).await;
    env.create(gateway(Some("sllb-a-config"))).await;
    let (_status, stop, task) = env.controller("only");
    eventually("the Deployment appears", || async { env.get("Deployment", "sllbr-sllb-a").await.map(|_| ()).ok_or_else(|| "not yet".into()) }).await;
    let d = env.get("Deployment", "sllbr-sllb-a").await.unwrap();
    let template = sluice_controller::gateway::DEFAULT_TEMPLATE;
    assert!(template.contains("image: sluice:0.1.0"));
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["metadata"]["labels"]["sluice.io/gateway"], "sllb-a");
    assert_eq!(d["metadata"]["ownerReferences"][0]["kind"], "Gateway");
    assert_eq!(d["metadata"]["ownerReferences"][0]["name"], "sllb-a");
    let pod = &d["spec"]["template"];
    assert!(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"].as_str().unwrap().contains("macvlan-nad-1"));
    let c = &pod["spec"]["containers"][0];
    assert_eq!((c["name"].as_str(), c["image"].as_str()), (Some("stateless-load-balancer"), Some("sluice:0.1.0")));
    assert_eq!(c["resources"]["limits"]["cpu"], "500m");
    assert_eq!(pod["spec"]["volumes"][0]["configMap"]["name"], "sluice-sllb-a");
    eventually("the Gateway says its configuration is read", || async {
        let gw = env.get("Gateway", "sllb-a").await.unwrap();
        match condition(&gw, COND_ACCEPTED) {
            Some(c) if c["status"] == "True" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // The ConfigMap changes: so does the Deployment.
    env.update(config_map(&CONFIG.replace("replicas: 2", "replicas: 3"))).await;
    eventually("the Deployment follows the ConfigMap", || async {
        let d = env.get("Deployment", "sllbr-sllb-a").await.unwrap();
        if d["spec"]["replicas"] == 3 { Ok(()) } else { Err(d["spec"]["replicas"].to_string()) }
    })
    .await;
    // A wrong one: the Deployment stays, the Gateway says why.
    env.update(config_map("replicas: many\n")).await;
    eventually("the Gateway says the configuration is wrong", || async {
        let gw = env.get("Gateway", "sllb-a").await.unwrap();
        match condition(&gw, COND_ACCEPTED) {
            Some(c) if c["status"] == "False" && c["reason"] == "InvalidParameters" && c["message"].as_str().unwrap_or("").contains("replicas: \"many\" is not a number") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(env.get("Deployment", "sllbr-sllb-a").await.unwrap()["spec"]["replicas"], 3);

    // The Gateway goes: so does its Deployment (the controller deletes what
    // it owns; a real cluster's garbage collector would too).
    env.delete("Gateway", "sllb-a").await;
    eventually("the Deployment goes with the Gateway", || async {
        match env.get("Deployment", "sllbr-sllb-a").await {
            None => Ok(()),
            Some(d) if d["metadata"]["deletionTimestamp"].is_string() => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_give_slices_and_a_deleted_pod_frees_only_its_identifier() {
    let env = Env::fake("slices").await;
    slices_scenario(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployment_of_a_gateway_follows_the_template_and_its_parameters() {
    let env = Env::fake("deploy").await;
    deployment_scenario(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_service_says_so_in_an_event_and_a_condition() {
    let env = Env::fake("full").await;
    env.create(gateway(None)).await;
    env.create(service(Some(1))).await;
    env.create(pod(&env.ns, "target-1", "169.111.100.2")).await;
    env.create(pod(&env.ns, "target-2", "169.111.100.3")).await;
    let (status, stop, task) = env.controller("only");
    eventually("an event says the Service is full", || async {
        let evs = env.list("Event").await;
        match evs.iter().find(|e| e["reason"] == "EndpointLimitReached") {
            Some(e) if e["regarding"]["name"] == "service-a" && e["type"] == "Warning" => Ok(()),
            _ => Err(format!("{evs:?}")),
        }
    })
    .await;
    let ev = env.list("Event").await.into_iter().find(|e| e["reason"] == "EndpointLimitReached").unwrap();
    assert!(ev["note"].as_str().unwrap().contains("all 1 endpoint identifiers are taken; left out: target-2"), "{ev}");
    eventually("the Gateway's condition says so", || async {
        let gw = env.get("Gateway", "sllb-a").await.unwrap();
        match condition(&gw, COND_ENDPOINTS) {
            Some(c) if c["status"] == "False" && c["reason"] == "EndpointLimitReached" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(slice_ids(&env).await.unwrap(), map(&[("169.111.100.2", 0)]));
    // The status is set at the end of the pass that published the event.
    let key = format!("{}/service-a", env.ns);
    eventually("the status lists the pod left out", || async {
        let full = status.lock().unwrap().full.clone();
        if full.get(&key).map(|f| f.pods.clone()) == Some(vec!["target-2".to_owned()]) { Ok(()) } else { Err(format!("{full:?}")) }
    })
    .await;
    // The first leaves: the second gets in, and the Service has room again.
    env.delete("Pod", "target-1").await;
    eventually("the waiting pod gets the identifier", || async {
        let got = slice_ids(&env).await?;
        if got == map(&[("169.111.100.3", 0)]) { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    eventually("an event says there is room again", || async {
        let evs = env.list("Event").await;
        if evs.iter().any(|e| e["reason"] == "EndpointLimitCleared") { Ok(()) } else { Err(format!("{evs:?}")) }
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_left_out_for_network_reasons_are_named_in_the_gateways_condition() {
    let env = Env::fake("leftout").await;
    env.create(gateway(None)).await;
    env.create(service(None)).await;
    env.create(pod(&env.ns, "target-1", "169.111.100.2")).await;
    env.create(pod(&env.ns, "elsewhere", "169.111.200.9")).await;
    let mut unattached = pod(&env.ns, "unattached", "169.111.100.3");
    unattached["metadata"]["annotations"] = json!({});
    env.create(unattached).await;
    let (_status, stop, task) = env.controller("first");
    eventually("the Gateway's condition names the pods left out and why", || async {
        let gw = env.get("Gateway", "sllb-a").await.unwrap();
        match condition(&gw, COND_ENDPOINTS) {
            Some(c) if c["status"] == "False"
                && c["reason"] == "PodsLeftOut"
                && c["message"].as_str().is_some_and(|m| m.contains("elsewhere: OutsideSubnets") && m.contains("unattached: NoNetworkStatus")) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(slice_ids(&env).await.unwrap(), map(&[("169.111.100.2", 0)]));
    // Gone: every pod selected is an endpoint again.
    env.delete("Pod", "elsewhere").await;
    env.delete("Pod", "unattached").await;
    eventually("the condition says every endpoint is admitted", || async {
        let gw = env.get("Gateway", "sllb-a").await.unwrap();
        match condition(&gw, COND_ENDPOINTS) {
            Some(c) if c["status"] == "True" && c["reason"] == "Admitted" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_controller_does_not_write_while_the_first_holds_the_lease() {
    let env = Env::fake("lease").await;
    env.create(gateway(None)).await;
    env.create(service(None)).await;
    env.create(pod(&env.ns, "target-1", "169.111.100.2")).await;
    let (first, stop_first, first_task) = env.controller("first");
    eventually("the first leads and writes", || async {
        let ok = first.lock().unwrap().leader;
        if ok && slice_ids(&env).await? == map(&[("169.111.100.2", 0)]) { Ok(()) } else { Err("not yet".into()) }
    })
    .await;
    let (second, stop_second, second_task) = env.controller("second");
    eventually("the second has looked", || async {
        if second.lock().unwrap().synced { Ok(()) } else { Err("not synced".into()) }
    })
    .await;
    // Changes while the first leads: only the first writes.
    let before = first.lock().unwrap().writes;
    env.create(pod(&env.ns, "target-2", "169.111.100.3")).await;
    eventually("the first writes the change", || async {
        if slice_ids(&env).await?.len() == 2 { Ok(()) } else { Err("not yet".into()) }
    })
    .await;
    // The first renews the Lease every 250 ms (a renewal changes its
    // resourceVersion): 16 renewals seen span more than the 3 s the
    // second would wait before taking over a Lease left unrenewed.
    let (mut renewals, deadline) = (std::collections::BTreeSet::new(), tokio::time::Instant::now() + PROMPT);
    while renewals.len() <= 16 {
        assert!(tokio::time::Instant::now() < deadline, "{} renewals of the Lease seen", renewals.len());
        let lease = env.get("Lease", "sluice-controller").await.expect("the Lease");
        assert_eq!(lease["spec"]["holderIdentity"], "first", "the Lease changed hands: {lease}");
        renewals.insert(lease["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_owned());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s2 = second.lock().unwrap().clone();
    assert!(!s2.leader, "{s2:?}");
    assert_eq!(s2.writes, 0, "the second wrote while the first held the Lease: {s2:?}");
    assert!(first.lock().unwrap().writes > before);
    let lease = env.get("Lease", "sluice-controller").await.unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "first");

    // The first stops (and releases the Lease): the second takes over.
    stop_first.cancel();
    first_task.await.unwrap();
    eventually("the second leads", || async {
        if second.lock().unwrap().leader { Ok(()) } else { Err("not yet".into()) }
    })
    .await;
    env.delete("Pod", "target-1").await;
    eventually("the second writes the change", || async {
        let got = slice_ids(&env).await?;
        if got == map(&[("169.111.100.3", 1)]) { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    assert!(second.lock().unwrap().writes > 0);
    stop_second.cancel();
    second_task.await.unwrap();
    env.cleanup().await;
}

/// The Maglev table the appliance builds for endpoints with these
/// identifiers (default size for the default limit), as a digest of the
/// address of every slot.
fn table_digest(ids: &std::collections::BTreeMap<String, u32>) -> u64 {
    use sluice_dataplane::maglev::{default_size, Table};
    use std::hash::{Hash, Hasher};
    let limit = 32;
    let eps: Vec<(u16, u32)> = ids.values().map(|&id| (u16::try_from(id).unwrap(), 1)).collect();
    let by_id: std::collections::BTreeMap<u16, &str> = ids.iter().map(|(a, &id)| (u16::try_from(id).unwrap(), a.as_str())).collect();
    let table = Table::build(default_size(limit), limit, &eps).unwrap().unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for i in 0..table.size() as usize {
        by_id[&table.entries().get(i)].hash(&mut h);
    }
    h.finish()
}

/// Every endpoint keeps its identifier (and the table its slots) when
/// its Gateway is deleted and re-created and when the controller restarts.
async fn identity_scenario(env: &Env) {
    env.create(gateway(None)).await;
    env.create(service(None)).await;
    for (i, name) in ["target-1", "target-2", "target-3"].iter().enumerate() {
        env.create(pod(&env.ns, name, &format!("169.111.100.{}", i + 2))).await;
        if env.real {
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
    }
    let (_status, stop, task) = env.controller("first");
    let first = map(&[("169.111.100.2", 0), ("169.111.100.3", 1), ("169.111.100.4", 2)]);
    eventually("the slice lists the three pods", || async {
        let got = slice_ids(env).await?;
        if got == first { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    // The first pod leaves, a new one takes its identifier: the
    // identifiers are no longer in the pods' order.
    env.delete("Pod", "target-1").await;
    env.create(pod(&env.ns, "target-4", "169.111.100.5")).await;
    let want = map(&[("169.111.100.3", 1), ("169.111.100.4", 2), ("169.111.100.5", 0)]);
    eventually("the new pod takes the freed identifier", || async {
        let got = slice_ids(env).await?;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    let digest = table_digest(&want);

    // The Gateway goes: its Services' slices go with it.
    env.delete("Gateway", "sllb-a").await;
    eventually("the slices of the deleted Gateway are gone", || async {
        match env.get("EndpointSlice", "service-a-sluice-v4").await {
            None => Ok(()),
            Some(s) => Err(format!("still there: {s}")),
        }
    })
    .await;
    // It comes back: every endpoint has the identifier it had.
    env.create(gateway(None)).await;
    eventually("the re-created Gateway's slice has the same identifiers", || async {
        let got = slice_ids(env).await?;
        if got == want { Ok(()) } else { Err(format!("{got:?}")) }
    })
    .await;
    assert_eq!(table_digest(&slice_ids(env).await.unwrap()), digest);

    // A restarted controller, with the slices gone meanwhile, finds them too.
    stop.cancel();
    task.await.unwrap();
    env.delete("EndpointSlice", "service-a-sluice-v4").await;
    let (status, stop, task) = env.controller("second");
    eventually("the restarted controller writes the slice again, with the same identifiers", || async {
        let got = slice_ids(env).await?;
        if got == want { Ok(()) } else { Err(format!("{got:?} ({:?})", status.lock().unwrap().last_error)) }
    })
    .await;
    assert_eq!(table_digest(&slice_ids(env).await.unwrap()), digest, "the service's table changed");
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_keep_their_identifiers_across_gateway_recreation_and_restarts() {
    let env = Env::fake("identity").await;
    identity_scenario(&env).await;
    env.cleanup().await;
}

/// Opt in: `SLUICE_TEST_KUBECONFIG=... cargo test --test controller_api -- --ignored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs SLUICE_TEST_KUBECONFIG: a real API server"]
async fn against_a_real_api_server() {
    let env = Env::real("slices").await;
    slices_scenario(&env).await;
    env.cleanup().await;
    let env = Env::real("deploy").await;
    deployment_scenario(&env).await;
    env.cleanup().await;
    let env = Env::real("identity").await;
    identity_scenario(&env).await;
    env.cleanup().await;
}
