//! The controller against an API server: watches, the Lease, and the
//! writes of one [`super::plan`] at a time.
//!
//! Each kind is watched by kube-runtime's watcher (list, watch, relist on
//! 410, reconnect with backoff); a list replaces its kind only once
//! complete, an error removes nothing. Nothing is written before every
//! kind is listed, nor by a replica that does not hold the Lease. After a
//! change (debounced), the leader writes what differs from what the
//! objects show: slices and Deployments by server-side apply under
//! [`FIELD_MANAGER`], deletions of what it owns and no longer wants, the
//! Gateways' conditions, and an event on a Service that fills up or has
//! room again. What it wrote is kept as written until the watch shows a
//! newer version, so identifiers are never decided from a stale slice.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};
use serde_json::{json, Value as Json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::gateway::{APP_MANAGED_BY_LABEL, GATEWAY_LABEL};
use sluice_core::config::manifests::ENDPOINT_IDS;
use sluice_core::ground::lock;
use super::lease::{self, LeaseConfig};
use super::{gateway_conditions, is_subset, observed_conditions, plan, Full, Key, Plan, Settings, Store, FIELD_MANAGER, MANAGED_BY, MANAGED_BY_LABEL};

/// How long to wait for more changes after one.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How often failed writes are tried again.
const RETRY: Duration = Duration::from_secs(2);

/// The kinds watched.
pub const KINDS: [&str; 6] = ["Gateway", "Service", "Pod", "EndpointSlice", "Deployment", "ConfigMap"];

/// Why the controller cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The kubeconfig.
    #[error("cannot read the kubeconfig {0}: {1}")]
    Kubeconfig(String, String),
    /// In-cluster configuration.
    #[error("not running in a cluster (no --kubeconfig given): {0}")]
    InCluster(String),
    /// The client.
    #[error("cannot make a Kubernetes client: {0}")]
    Client(String),
}

/// How the controller runs against an API server.
#[derive(Clone, Debug)]
pub struct Options {
    /// A kubeconfig; the in-cluster service account when unset.
    pub kubeconfig: Option<PathBuf>,
    /// The one namespace watched; every namespace when unset.
    pub namespace: Option<String>,
    /// How it decides.
    pub settings: Settings,
    /// The election.
    pub lease: LeaseConfig,
}

/// What the controller is doing (for logs and tests).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Status {
    /// Every kind has been listed.
    pub synced: bool,
    /// This replica holds the Lease.
    pub leader: bool,
    /// Writes sent (applies, deletes, status patches, events).
    pub writes: u64,
    /// Writes that failed.
    pub write_errors: u64,
    /// The last error.
    pub last_error: Option<String>,
    /// Pods left out, by `namespace/service`, with the reason.
    pub ignored: BTreeMap<String, Vec<String>>,
    /// Services that are full, by `namespace/service`.
    pub full: BTreeMap<String, Full>,
}

/// A client from a kubeconfig, or the in-cluster service account.
pub async fn client(kubeconfig: Option<&PathBuf>) -> Result<Client, ControllerError> {
    let config = match kubeconfig {
        Some(path) => {
            let name = path.display().to_string();
            let kc = Kubeconfig::read_from(path).map_err(|e| ControllerError::Kubeconfig(name.clone(), e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| ControllerError::Kubeconfig(name, e.to_string()))?
        }
        None => Config::incluster().map_err(|e| ControllerError::InCluster(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| ControllerError::Client(e.to_string()))
}

fn resources() -> [ApiResource; 6] {
    [
        ApiResource::erase::<gateway_api::gateways::Gateway>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<Pod>(&()),
        ApiResource::erase::<EndpointSlice>(&()),
        ApiResource::erase::<Deployment>(&()),
        ApiResource::erase::<ConfigMap>(&()),
    ]
}

fn api(client: &Client, ns: Option<&str>, ar: &ApiResource) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    }
}

type Item = (usize, Result<Event<DynamicObject>, watcher::Error>);

fn watches(client: &Client, ns: Option<&str>) -> BoxStream<'static, Item> {
    let streams: Vec<BoxStream<'static, Item>> = resources()
        .into_iter()
        .enumerate()
        .map(|(i, ar)| {
            let wc = match KINDS[i] {
                "EndpointSlice" => watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}")),
                "Deployment" => watcher::Config::default().labels(&format!("{APP_MANAGED_BY_LABEL}={MANAGED_BY}")),
                _ => watcher::Config::default(),
            };
            watcher::watcher(api(client, ns, &ar), wc).default_backoff().map(move |e| (i, e)).boxed()
        })
        .collect();
    stream::select_all(streams).boxed()
}

fn to_json(i: usize, o: &DynamicObject) -> Json {
    let ar = &resources()[i];
    let mut v = serde_json::to_value(o).unwrap_or(Json::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), Json::String(ar.api_version.clone()));
        m.insert("kind".into(), Json::String(ar.kind.clone()));
    }
    v
}

fn rv(o: &Json) -> Option<u64> {
    o.pointer("/metadata/resourceVersion").and_then(Json::as_str).and_then(|s| s.parse().ok())
}

fn key(o: &Json) -> Key {
    let m = |k: &str| o.pointer(&format!("/metadata/{k}")).and_then(Json::as_str).unwrap_or("").to_owned();
    (m("namespace"), m("name"))
}

struct Task {
    opts: Options,
    client: Client,
    store: Store,
    buffers: [Option<Vec<Json>>; 6],
    listed: [bool; 6],
    /// What this replica wrote, by kind and key, with its resourceVersion:
    /// older versions from the watch are not taken in.
    written: BTreeMap<(usize, Key), u64>,
    /// The last Full published per Service (events are sent on change).
    full: BTreeMap<Key, Full>,
    recorder: Recorder,
    status: Arc<Mutex<Status>>,
    failed: bool,
    /// The pods left out that were logged (by Service, pod and reason):
    /// each is said once while it stays left out.
    said: std::collections::BTreeSet<String>,
}

/// Runs the controller until `cancel`; `status` is kept current.
pub async fn run(opts: Options, status: Arc<Mutex<Status>>, cancel: CancellationToken) -> Result<(), ControllerError> {
    let client = client(opts.kubeconfig.as_ref()).await?;
    let (leader_tx, mut leader_rx) = watch::channel(false);
    let election = tokio::spawn(lease::run(client.clone(), opts.lease.clone(), leader_tx, cancel.clone()));
    let reporter = Reporter { controller: FIELD_MANAGER.into(), instance: Some(opts.lease.identity.clone()) };
    let mut task = Task {
        recorder: Recorder::new(client.clone(), reporter),
        store: Store::default(),
        buffers: Default::default(),
        listed: [false; 6],
        written: BTreeMap::new(),
        full: BTreeMap::new(),
        status,
        failed: false,
        said: std::collections::BTreeSet::new(),
        client: client.clone(),
        opts,
    };
    let mut events = watches(&client, task.opts.namespace.as_deref());
    let mut dirty = false;
    let deadline = tokio::time::sleep(DEBOUNCE);
    tokio::pin!(deadline);
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            item = events.next() => {
                let Some((i, ev)) = item else { break };
                if task.event(i, ev) && !dirty {
                    dirty = true;
                    deadline.as_mut().reset(tokio::time::Instant::now() + DEBOUNCE);
                }
            }
            changed = leader_rx.changed() => {
                if changed.is_err() {
                    break;
                }
                let leads = *leader_rx.borrow_and_update();
                lock(&task.status).leader = leads;
                if leads {
                    task.full.clear(); // a new leader says again what is full
                    dirty = true;
                    deadline.as_mut().reset(tokio::time::Instant::now() + DEBOUNCE);
                }
            }
            () = &mut deadline, if dirty => {
                dirty = false;
                if *leader_rx.borrow() {
                    task.reconcile().await;
                }
            }
            _ = retry.tick(), if task.failed => {
                if *leader_rx.borrow() {
                    task.reconcile().await;
                }
            }
        }
    }
    let _ = election.await; // releases the Lease
    Ok(())
}

impl Task {
    /// Takes in one watch event; true when the objects may have changed.
    fn event(&mut self, i: usize, ev: Result<Event<DynamicObject>, watcher::Error>) -> bool {
        let kind = KINDS[i];
        let changed = match ev {
            Err(e) => {
                warn!(kind, error = %e, "watch failed; retrying with backoff");
                lock(&self.status).last_error = Some(format!("watching {kind}s: {e}"));
                false
            }
            Ok(Event::Init) => {
                self.buffers[i] = Some(Vec::new());
                false
            }
            Ok(Event::InitApply(o)) => {
                self.buffers[i].get_or_insert_with(Vec::new).push(to_json(i, &o));
                false
            }
            Ok(Event::InitDone) => {
                let objs = self.buffers[i].take().unwrap_or_default();
                debug!(kind, count = objs.len(), "listed");
                let objs: Vec<Json> = objs
                    .into_iter()
                    .map(|o| match (self.written.get(&(i, key(&o))), rv(&o)) {
                        (Some(w), Some(r)) if r < *w => self.store.get(kind, &key(&o).0, &key(&o).1).cloned().unwrap_or(o),
                        _ => o,
                    })
                    .collect();
                self.store.replace(kind, objs);
                self.listed[i] = true;
                true
            }
            Ok(Event::Apply(o)) => {
                let o = to_json(i, &o);
                if let (Some(w), Some(r)) = (self.written.get(&(i, key(&o))), rv(&o)) {
                    if r < *w {
                        return false; // older than what this replica wrote
                    }
                }
                self.store.apply(o);
                true
            }
            Ok(Event::Delete(o)) => {
                let o = to_json(i, &o);
                self.store.delete(kind, &key(&o));
                self.written.remove(&(i, key(&o)));
                true
            }
        };
        lock(&self.status).synced = self.listed.iter().all(|l| *l);
        changed
    }

    fn wrote(&mut self, i: usize, obj: Json) {
        if let Some(r) = rv(&obj) {
            self.written.insert((i, key(&obj)), r);
        }
        self.store.apply(obj);
    }

    fn count(&self, ok: bool, what: &str, e: Option<&kube::Error>) {
        let mut st = lock(&self.status);
        st.writes += 1;
        if !ok {
            st.write_errors += 1;
            st.last_error = Some(format!("{what}: {}", e.map(ToString::to_string).unwrap_or_default()));
        }
    }

    async fn apply(&mut self, i: usize, obj: &Json) -> bool {
        let ar = resources()[i].clone();
        let (ns, name) = key(obj);
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &ar);
        let res = api.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(obj)).await;
        let what = format!("applying {} {ns}/{name}", KINDS[i]);
        match res {
            Ok(o) => {
                info!(kind = KINDS[i], %ns, %name, "applied");
                self.count(true, &what, None);
                self.wrote(i, to_json(i, &o));
                true
            }
            Err(e) => {
                warn!(error = %e, "{what} failed");
                self.count(false, &what, Some(&e));
                false
            }
        }
    }

    async fn delete(&mut self, i: usize, k: &Key) -> bool {
        let ar = resources()[i].clone();
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &k.0, &ar);
        let res = api.delete(&k.1, &DeleteParams::background()).await;
        let what = format!("deleting {} {}/{}", KINDS[i], k.0, k.1);
        match res {
            Ok(_) => {
                info!(kind = KINDS[i], ns = %k.0, name = %k.1, "deleted");
                self.count(true, &what, None);
                self.store.delete(KINDS[i], k);
                self.written.remove(&(i, k.clone()));
                true
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {
                self.store.delete(KINDS[i], k);
                true
            }
            Err(e) => {
                warn!(error = %e, "{what} failed");
                self.count(false, &what, Some(&e));
                false
            }
        }
    }

    /// Writes what differs from the plan.
    async fn reconcile(&mut self) {
        if !self.listed.iter().all(|l| *l) {
            return; // nothing is written from a partial view
        }
        let p = plan(&self.store, &self.opts.settings);
        if !self.keep_ids(&p).await {
            // An identifier not kept yet is not written in a slice: try again.
            self.failed = true;
            return;
        }
        let slices = self.write_slices(&p).await;
        let deployments = self.write_deployments(&p).await;
        let conditions = self.write_conditions(&p).await;
        let full = full_services(&p);
        let events = self.publish_full(&full).await;
        self.failed = !(slices && deployments && conditions && events);
        self.publish_status(&p, full);
    }

    /// Keeps each Service's endpoint identifiers in its annotation, before
    /// any slice uses them: they outlive the slices (a Gateway deleted or
    /// of another class for a while), this controller and its leader.
    /// True when every Service keeps them.
    async fn keep_ids(&mut self, p: &Plan) -> bool {
        let mut unkept = false;
        for (k, ids) in &p.service_ids {
            let have = self.store.get("Service", &k.0, &k.1).and_then(|s| s.pointer("/metadata/annotations")).and_then(|a| a.get(ENDPOINT_IDS)).and_then(Json::as_str);
            if have == Some(ids.as_str()) {
                continue;
            }
            let body = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": k.1, "namespace": k.0, "annotations": {ENDPOINT_IDS: ids}}});
            if !self.apply(1, &body).await {
                unkept = true;
            }
        }
        !unkept
    }

    /// Writes the slices: first the ones to hold (a new endpoint is never
    /// missing while another's leaves), then deletes the owned ones not
    /// wanted (except those of frozen Services). True when every write
    /// succeeded.
    async fn write_slices(&mut self, p: &Plan) -> bool {
        let mut ok = true;
        for (k, want) in &p.slices {
            let same = self.store.get("EndpointSlice", &k.0, &k.1).is_some_and(|have| is_subset(want, have));
            if !same && !self.apply(3, want).await {
                ok = false;
            }
        }
        let stale: Vec<Key> = self
            .store
            .of("EndpointSlice")
            .filter(|(k, s)| {
                let svc = s.pointer("/metadata/labels").and_then(|l| l.get(sluice_core::config::manifests::SERVICE_NAME_LABEL)).and_then(Json::as_str).unwrap_or("");
                s.pointer("/metadata/labels").and_then(|l| l.get(MANAGED_BY_LABEL)).and_then(Json::as_str) == Some(MANAGED_BY)
                    && !p.slices.contains_key(*k)
                    && !p.frozen_services.contains(&(k.0.clone(), svc.to_owned()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if !self.delete(3, &k).await {
                ok = false;
            }
        }
        ok
    }

    /// Writes the Deployments to hold, then deletes the owned ones not
    /// wanted (except those of frozen Gateways). True when every write
    /// succeeded.
    async fn write_deployments(&mut self, p: &Plan) -> bool {
        let mut ok = true;
        for (k, want) in &p.deployments {
            let same = self.store.get("Deployment", &k.0, &k.1).is_some_and(|have| is_subset(want, have));
            if !same && !self.apply(4, want).await {
                ok = false;
            }
        }
        let stale: Vec<Key> = self
            .store
            .of("Deployment")
            .filter(|(k, d)| {
                let labels = d.pointer("/metadata/labels");
                let gw = labels.and_then(|l| l.get(GATEWAY_LABEL)).and_then(Json::as_str).unwrap_or("");
                labels.and_then(|l| l.get(APP_MANAGED_BY_LABEL)).and_then(Json::as_str) == Some(MANAGED_BY)
                    && !p.deployments.contains_key(*k)
                    && !p.frozen_gateways.contains(&(k.0.clone(), gw.to_owned()))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if !self.delete(4, &k).await {
                ok = false;
            }
        }
        ok
    }

    /// Writes the controller's conditions of each Gateway whose observed
    /// ones differ. True when every write succeeded.
    async fn write_conditions(&mut self, p: &Plan) -> bool {
        let mut ok = true;
        let now = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second()).map(|t| t.to_string()).unwrap_or_default();
        for (k, report) in &p.gateways {
            let Some(gw) = self.store.get("Gateway", &k.0, &k.1).cloned() else { continue };
            let conds = gateway_conditions(&self.store, &gw, report, &now);
            if observed_conditions(&gw) == conds {
                continue;
            }
            let ar = resources()[0].clone();
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &k.0, &ar);
            let body = json!({"apiVersion": ar.api_version, "kind": "Gateway", "metadata": {"name": k.1, "namespace": k.0}, "status": {"conditions": conds}});
            let what = format!("writing the status of Gateway {}/{}", k.0, k.1);
            match api.patch_status(&k.1, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await {
                Ok(o) => {
                    self.count(true, &what, None);
                    self.wrote(0, to_json(0, &o));
                }
                Err(e) => {
                    warn!(error = %e, "{what} failed");
                    self.count(false, &what, Some(&e));
                    ok = false;
                }
            }
        }
        ok
    }

    /// Publishes an event on each Service that filled up or has room
    /// again since the last one published, and remembers what it said.
    /// True when every event was published.
    async fn publish_full(&mut self, full: &BTreeMap<Key, Full>) -> bool {
        let mut ok = true;
        let changed: Vec<(Key, Option<Full>)> = full
            .iter()
            .filter(|(k, f)| self.full.get(*k) != Some(*f))
            .map(|(k, f)| (k.clone(), Some(f.clone())))
            .chain(self.full.keys().filter(|k| !full.contains_key(*k)).map(|k| (k.clone(), None)))
            .collect();
        for (k, f) in changed {
            let uid = self.store.get("Service", &k.0, &k.1).and_then(|s| s.pointer("/metadata/uid")).and_then(Json::as_str).map(str::to_owned);
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some(k.0.clone()),
                name: Some(k.1.clone()),
                uid,
                ..ObjectReference::default()
            };
            let ev = full_event(f.as_ref());
            let what = format!("publishing an event on Service {}/{}", k.0, k.1);
            match self.recorder.publish(&ev, &reference).await {
                Ok(()) => {
                    self.count(true, &what, None);
                    match f {
                        Some(f) => self.full.insert(k, f),
                        None => self.full.remove(&k),
                    };
                }
                Err(e) => {
                    warn!(error = %e, "{what} failed");
                    self.count(false, &what, Some(&e));
                    ok = false;
                }
            }
        }
        ok
    }

    /// Publishes in [`Status`] the full Services and the pods left out,
    /// and logs each pod left out once while it stays left out.
    fn publish_status(&mut self, p: &Plan, full: BTreeMap<Key, Full>) {
        let mut st = lock(&self.status);
        st.full = full.into_iter().map(|(k, f)| (format!("{}/{}", k.0, k.1), f)).collect();
        st.ignored = BTreeMap::new();
        let mut said = std::collections::BTreeSet::new();
        for i in &p.ignored {
            let line = format!("{}: {}: {}", i.pod, i.reason, i.message);
            let key = format!("{}/{line}", i.service);
            if !self.said.contains(&key) {
                info!(service = %i.service, pod = %i.pod, reason = i.reason, "pod left out of the Service's endpoints: {}", i.message);
            }
            said.insert(key);
            st.ignored.entry(i.service.clone()).or_default().push(line);
        }
        drop(st);
        self.said = said;
    }
}

/// The Services that are full, by `(namespace, service)`, over every
/// Gateway of the plan.
fn full_services(p: &Plan) -> BTreeMap<Key, Full> {
    let mut full: BTreeMap<Key, Full> = BTreeMap::new();
    for (k, r) in &p.gateways {
        for (svc, f) in &r.full {
            full.insert((k.0.clone(), svc.clone()), f.clone());
        }
    }
    full
}

/// The event said on a Service that filled up (`Some`, with what is left
/// out) or has room again (`None`).
fn full_event(f: Option<&Full>) -> KubeEvent {
    match f {
        Some(f) => KubeEvent {
            type_: EventType::Warning,
            reason: "EndpointLimitReached".into(),
            // An event's note is at most 1 kB.
            note: Some(super::truncate(&format!("all {} endpoint identifiers are taken; left out: {} (sluice.io/endpoint-limit raises the limit)", f.limit, f.pods.join(", ")), 1000)),
            action: "AllocateEndpointIdentifier".into(),
            secondary: None,
        },
        None => KubeEvent {
            type_: EventType::Normal,
            reason: "EndpointLimitCleared".into(),
            note: Some("every selected pod on the Gateway's networks has an endpoint identifier".into()),
            action: "AllocateEndpointIdentifier".into(),
            secondary: None,
        },
    }
}
