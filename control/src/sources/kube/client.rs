//! The Kubernetes source's task: watches, tries with the reconciler,
//! status writes, and [`KubeStatus`].
//!
//! Each kind is watched by kube-runtime's watcher (list, then watch from
//! the list's resourceVersion with bookmarks; a relist on 410 Gone; a
//! reconnect with exponential backoff after any error). A list replaces
//! the objects of its kind only once it is complete, and an error never
//! removes anything, so losing the API leaves the objects last seen, and
//! the data plane what it serves.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, Config};
use serde_json::{json, Value as Json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::sync::{observed_part, Objects, Outcome, Plan, Statuses, Sync, KINDS};
use super::{crd, KubeConfig, KubeError, KubeStatus, RefusedObject, RouterEntry, FIELD_MANAGER, SOURCE};
use crate::ground::now_epoch;
use crate::config::manifests::{api_origin, PROXY_NAME_LABEL};
use crate::model::{Defaults, Desired};
use crate::sources::SourceMsg;

/// How long to wait for more changes after one (a rollout changes many
/// objects at once).
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Most tries of one change with the reconciler (each leaves out the
/// objects the last refusal was about).
const MAX_TRIES: usize = 8;
/// How often status is written again when a write failed, and the client
/// made again when it could not be.
const RETRY: Duration = Duration::from_secs(5);
/// How often the API server is asked whether it is there.
const PROBE: Duration = Duration::from_secs(3);
/// Kinds of Sluice's own CRDs: without them the rest is still served.
const OPTIONAL: [&str; 2] = ["L34Route", "GatewayRouter"];

/// A client for `cfg`: its kubeconfig, or the in-cluster service account.
pub(super) async fn client(cfg: &KubeConfig) -> Result<Client, KubeError> {
    let config = match &cfg.kubeconfig {
        Some(path) => {
            let name = path.display().to_string();
            let kc = Kubeconfig::read_from(path).map_err(|e| KubeError::Kubeconfig(name.clone(), e.to_string()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Kubeconfig(name, e.to_string()))?
        }
        None => Config::incluster().map_err(|e| KubeError::InCluster(e.to_string()))?,
    };
    Client::try_from(config).map_err(|e| KubeError::Client(e.to_string()))
}

/// The API resource of each watched kind, in [`KINDS`] order.
fn resources() -> [ApiResource; 5] {
    [
        ApiResource::erase::<gateway_api::gateways::Gateway>(&()),
        ApiResource::erase::<crd::L34Route>(&()),
        ApiResource::erase::<Service>(&()),
        ApiResource::erase::<EndpointSlice>(&()),
        ApiResource::erase::<crd::GatewayRouter>(&()),
    ]
}

type Item = (usize, Result<Event<DynamicObject>, watcher::Error>);

fn watches(client: &Client, cfg: &KubeConfig) -> BoxStream<'static, Item> {
    let by_label = format!("{PROXY_NAME_LABEL}={}", cfg.gateway);
    let streams: Vec<BoxStream<'static, Item>> = resources()
        .into_iter()
        .enumerate()
        .map(|(i, ar)| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &cfg.namespace, &ar);
            let wc = match KINDS[i] {
                "Gateway" => watcher::Config::default().fields(&format!("metadata.name={}", cfg.gateway)),
                "Service" | "GatewayRouter" => watcher::Config::default().labels(&by_label),
                _ => watcher::Config::default(),
            };
            watcher::watcher(api, wc).default_backoff().map(move |e| (i, e)).boxed()
        })
        .collect();
    stream::select_all(streams).boxed()
}

/// An object as the mapping reads it: with its kind and apiVersion (list
/// items may lack them).
fn to_json(i: usize, o: DynamicObject) -> Json {
    let ar = &resources()[i];
    let mut v = serde_json::to_value(&o).unwrap_or(Json::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), Json::String(ar.api_version.clone()));
        m.insert("kind".into(), Json::String(ar.kind.clone()));
    }
    v
}

/// The objects without what changes when only status is written, to tell
/// whether the desired state could have changed.
fn inputs(objects: &Objects) -> BTreeMap<&'static str, Vec<Json>> {
    objects
        .by_kind
        .iter()
        .map(|(k, m)| {
            let v = m
                .values()
                .map(|o| {
                    let mut o = o.clone();
                    if let Some(map) = o.as_object_mut() {
                        map.remove("status");
                    }
                    if let Some(meta) = o.get_mut("metadata").and_then(Json::as_object_mut) {
                        for f in ["resourceVersion", "managedFields", "generation"] {
                            meta.remove(f);
                        }
                    }
                    o
                })
                .collect();
            (*k, v)
        })
        .collect()
}

struct Task {
    cfg: KubeConfig,
    tx: mpsc::Sender<SourceMsg>,
    status: watch::Sender<KubeStatus>,
    sync: Sync,
    objects: Objects,
    /// Lists under way, per kind.
    buffers: [Option<BTreeMap<String, Json>>; 5],
    listed: [bool; 5],
    errors: [Option<String>; 5],
    /// Kinds the API does not have (their CRD is not installed), and why
    /// that matters: taken as having no objects until it has them.
    absent: [Option<String>; 5],
    /// The inputs of the last round of tries.
    last_inputs: Option<BTreeMap<&'static str, Vec<Json>>>,
    /// The last plan (for status).
    plan: Option<Plan>,
    /// What was last written to each object's status, with the object's
    /// resourceVersion when it was written.
    written: HashMap<String, (Json, String)>,
    /// A status write failed: try again.
    write_failed: bool,
    /// Publishes the Events on refused objects.
    recorder: Recorder,
    /// The refusals reported (logged, and an Event on the object): by
    /// origin, uid, generation and reason, so each is said once per
    /// generation of the object.
    reported: HashSet<String>,
}

/// Runs the Kubernetes source until `cancel`: watches the objects of
/// `cfg`, sends their desired state to the reconciler through `tx` (as
/// source [`SOURCE`]), writes their status, and keeps `status` current.
/// `defaults` are the appliance's service defaults (the algorithm a
/// Service without an annotation has).
pub async fn run(
    cfg: KubeConfig,
    defaults: Defaults,
    tx: mpsc::Sender<SourceMsg>,
    status: watch::Sender<KubeStatus>,
    cancel: CancellationToken,
) {
    status.send_modify(|st| {
        st.gateway = cfg.gateway.clone();
        st.namespace = cfg.namespace.clone();
        st.waiting_for = KINDS.iter().map(|k| (*k).to_owned()).collect();
        st.serving = "nothing from Kubernetes yet: waiting for the first list of every kind".into();
    });
    let client = loop {
        match client(&cfg).await {
            Ok(c) => break c,
            Err(e) => {
                warn!(error = %e, "Kubernetes source cannot start; trying again");
                status.send_modify(|st| {
                    st.last_error = Some(e.to_string());
                    st.last_error_at = Some(now_epoch());
                });
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(RETRY) => {}
                }
            }
        }
    };
    let mut task = Task {
        sync: Sync::new(cfg.clone(), defaults),
        cfg,
        tx,
        status,
        objects: Objects::default(),
        buffers: Default::default(),
        listed: [false; 5],
        errors: Default::default(),
        absent: Default::default(),
        last_inputs: None,
        plan: None,
        written: HashMap::new(),
        write_failed: false,
        recorder: Recorder::new(client.clone(), Reporter { controller: FIELD_MANAGER.into(), instance: std::env::var("POD_NAME").ok() }),
        reported: HashSet::new(),
    };
    let probe = tokio::spawn(probe(client.clone(), task.status.clone(), cancel.clone()));
    let _stop_probe = AbortOnDrop(probe);
    let mut events = watches(&client, &task.cfg);
    let mut dirty = false;
    let deadline = tokio::time::sleep(DEBOUNCE);
    tokio::pin!(deadline);
    let mut retry = tokio::time::interval(RETRY);
    retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            item = events.next() => {
                let Some((i, ev)) = item else { return };
                if task.event(i, ev) && !dirty {
                    dirty = true;
                    deadline.as_mut().reset(tokio::time::Instant::now() + DEBOUNCE);
                }
            }
            () = &mut deadline, if dirty => {
                dirty = false;
                if !task.reconcile(&client).await {
                    return; // the reconciler is gone: shutting down
                }
            }
            _ = retry.tick(), if task.write_failed => task.write_status(&client).await,
        }
    }
}

/// Asks the API server its version every [`PROBE`]: whether it can be
/// reached (a watch that resumed quietly says nothing until something
/// changes). A watch error marks the source disconnected until the next
/// probe that succeeds.
async fn probe(client: Client, status: watch::Sender<KubeStatus>, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(PROBE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let res = tokio::time::timeout(PROBE, client.apiserver_version()).await;
        status.send_modify(|st| match res {
            Ok(Ok(v)) => {
                st.connected = true;
                st.server_version = Some(v.git_version);
            }
            Ok(Err(e)) => {
                st.connected = false;
                st.last_error = Some(format!("reaching the API server: {e}"));
                st.last_error_at = Some(now_epoch());
            }
            Err(_) => {
                st.connected = false;
                st.last_error = Some(format!("reaching the API server: no answer in {}s", PROBE.as_secs()));
                st.last_error_at = Some(now_epoch());
            }
        });
    }
}

/// `s` cut to at most `max` bytes, on a character boundary, with `...`.
fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut at = max.saturating_sub(3);
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    format!("{}...", &s[..at])
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Task {
    /// Takes in one watch event; true when the objects may have changed.
    fn event(&mut self, i: usize, ev: Result<Event<DynamicObject>, watcher::Error>) -> bool {
        let kind = KINDS[i];
        let changed = match ev {
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if s.is_not_found() && OPTIONAL.contains(&kind) => {
                // The CRD is not installed: everything else is served, and
                // status and readiness say what is not. The watcher keeps
                // trying, so installing it later is followed.
                let first = self.absent[i].is_none();
                let why = format!(
                    "the API has no {kind} resource (is its CRD installed? `kubectl apply -f configs/k8s/crds/`): {}",
                    if kind == "GatewayRouter" { "no BGP/BFD peering from Kubernetes" } else { "no routes from Kubernetes" }
                );
                if first {
                    warn!(kind, "{why}; serving the rest");
                }
                self.absent[i] = Some(why);
                self.buffers[i] = None;
                let had = self.objects.count(kind) > 0 || !self.listed[i];
                self.objects.replace(kind, BTreeMap::new());
                self.listed[i] = true;
                first || had
            }
            Err(e) => {
                let msg = format!("watching {kind}s: {e}");
                warn!(error = %msg, "Kubernetes watch failed; retrying with backoff (what is served stays)");
                self.errors[i] = Some(msg.clone());
                self.status.send_modify(|st| {
                    st.last_error = Some(msg);
                    st.last_error_at = Some(now_epoch());
                    st.connected = false;
                });
                return false;
            }
            Ok(Event::Init) => {
                self.buffers[i] = Some(BTreeMap::new());
                false
            }
            Ok(Event::InitApply(o)) => {
                let v = to_json(i, o);
                let name = v.pointer("/metadata/name").and_then(Json::as_str).unwrap_or("").to_owned();
                self.buffers[i].get_or_insert_with(BTreeMap::new).insert(name, v);
                false
            }
            Ok(Event::InitDone) => {
                let objs = self.buffers[i].take().unwrap_or_default();
                debug!(kind, count = objs.len(), "listed");
                if self.absent[i].take().is_some() {
                    info!(kind, "the API has the resource now");
                }
                self.objects.replace(kind, objs);
                self.listed[i] = true;
                true
            }
            Ok(Event::Apply(o)) => {
                self.objects.apply(kind, to_json(i, o));
                true
            }
            Ok(Event::Delete(o)) => {
                self.objects.delete(kind, o.metadata.name.as_deref().unwrap_or(""));
                true
            }
        };
        let recovered = self.errors[i].take().is_some();
        self.status.send_modify(|st| {
            if recovered && self.errors.iter().all(Option::is_none) {
                st.connected = true;
            }
            st.synced = self.listed.iter().all(|l| *l);
            st.not_served = self.absent.iter().flatten().cloned().collect();
            st.waiting_for = KINDS.iter().zip(self.listed).filter(|(_, l)| !l).map(|(k, _)| (*k).to_owned()).collect();
            st.watched = KINDS.iter().map(|k| ((*k).to_owned(), self.objects.count(k))).collect();
            if changed {
                st.last_sync_at = Some(now_epoch());
            }
        });
        changed
    }

    /// Decides and sends after a change; false when the reconciler is gone.
    async fn reconcile(&mut self, client: &Client) -> bool {
        if !self.listed.iter().all(|l| *l) {
            return true; // nothing is sent from a partial view
        }
        self.routers();
        let inputs = inputs(&self.objects);
        if self.last_inputs.as_ref() == Some(&inputs) && self.plan.is_some() {
            // Only status changed (often our own write): write what differs.
            self.write_status(client).await;
            return true;
        }
        self.last_inputs = Some(inputs);
        self.sync.new_round();
        let mut plan = self.sync.plan(&self.objects);
        for attempt in 1..=MAX_TRIES {
            if !plan.mapping.whole.is_empty() {
                let problems = plan.mapping.whole.clone();
                if let Some(why) = self.sync.not_ours(&self.objects).filter(|_| *self.sync.served() != Desired::default()) {
                    // The API said so (a list, or a DELETED: losing it
                    // changes no object): its VIPs are no longer served.
                    let (reply, answer) = oneshot::channel();
                    let msg = SourceMsg::Desired { source: SOURCE.into(), desired: Desired::default(), trigger: "kubernetes".into(), reply: Some(reply) };
                    if self.tx.send(msg).await.is_err() {
                        return false;
                    }
                    match answer.await {
                        Err(_) => return false,
                        Ok(Ok(())) => {
                            info!(%why, "nothing served from Kubernetes any more");
                            self.sync.withdrawn();
                            self.status.send_modify(|st| st.last_applied_at = Some(now_epoch()));
                        }
                        Ok(Err(ps)) => warn!(%why, problems = ?ps, "withdrawing the Gateway's state was refused"),
                    }
                }
                self.sync.outcome = Outcome::Refused(problems.clone());
                let msg = SourceMsg::Rejected { source: SOURCE.into(), problems, trigger: "kubernetes".into() };
                if self.tx.send(msg).await.is_err() {
                    return false;
                }
                break;
            }
            if self.sync.outcome == Outcome::Applied && plan.desired == *self.sync.served() {
                self.sync.applied(&plan, &self.objects);
                break; // served already
            }
            let (reply, answer) = oneshot::channel();
            let msg = SourceMsg::Desired { source: SOURCE.into(), desired: plan.desired.clone(), trigger: "kubernetes".into(), reply: Some(reply) };
            if self.tx.send(msg).await.is_err() {
                return false;
            }
            match answer.await {
                Err(_) => return false,
                Ok(Ok(())) => {
                    info!(attempt, routes = plan.desired.routes.len(), services = plan.desired.services.len(), "Kubernetes state served");
                    self.sync.applied(&plan, &self.objects);
                    self.status.send_modify(|st| st.last_applied_at = Some(now_epoch()));
                    break;
                }
                Ok(Err(problems)) => {
                    if attempt == MAX_TRIES || !self.sync.refused(&plan, &problems) {
                        self.sync.outcome = Outcome::Refused(problems);
                        break;
                    }
                    plan = self.sync.plan(&self.objects);
                }
            }
        }
        self.plan = Some(plan);
        self.summarise();
        self.report_refusals().await;
        self.write_status(client).await;
        true
    }

    /// Says why each object left out is left out, once per generation of
    /// the object: a log line and an Event (`events.k8s.io/v1`) on it.
    async fn report_refusals(&mut self) {
        let Some(plan) = &self.plan else { return };
        let mut refusals: Vec<(String, String, String)> = plan
            .mapping
            .objects
            .iter()
            .filter_map(|m| m.refusal.as_ref().map(|r| (m.origin.clone(), r.reason.as_str().to_owned(), r.message())))
            .collect();
        refusals.extend(plan.kept.iter().map(|(o, why)| (o.clone(), "AlgorithmChangeRefused".to_owned(), why.clone())));
        let mut now = HashSet::new();
        for (origin, reason, message) in refusals {
            let Some((kind, name)) = origin.strip_prefix("kubernetes: ").and_then(|r| r.split_once('/')).and_then(|(k, r)| Some((k, r.split_once('/')?.1))) else { continue };
            let Some(kind) = KINDS.iter().copied().find(|k| *k == kind) else { continue };
            let Some(obj) = self.objects.by_kind.get(kind).and_then(|m| m.get(name)) else { continue };
            let uid = obj.pointer("/metadata/uid").and_then(Json::as_str).map(str::to_owned);
            let generation = obj.pointer("/metadata/generation").and_then(Json::as_i64).unwrap_or(0);
            let key = format!("{origin}|{}|{generation}|{reason}", uid.as_deref().unwrap_or(""));
            now.insert(key.clone());
            if self.reported.contains(&key) {
                continue;
            }
            warn!(object = %origin, generation, %reason, %message, "left out");
            let reference = ObjectReference {
                api_version: obj.get("apiVersion").and_then(Json::as_str).map(str::to_owned),
                kind: Some(kind.to_owned()),
                namespace: Some(self.cfg.namespace.clone()),
                name: Some(name.to_owned()),
                uid,
                ..ObjectReference::default()
            };
            let ev = KubeEvent {
                type_: EventType::Warning,
                reason,
                // An event's note is at most 1 kB.
                note: Some(cut(&message, 1000)),
                action: "Serve".into(),
                secondary: None,
            };
            match self.recorder.publish(&ev, &reference).await {
                Ok(()) => {
                    self.reported.insert(key);
                }
                Err(e) => {
                    warn!(object = %origin, error = %e, "publishing an event failed");
                    self.status.send_modify(|st| {
                        st.last_error = Some(format!("publishing an event on {origin}: {e}"));
                        st.last_error_at = Some(now_epoch());
                    });
                    // Logged once all the same.
                    self.reported.insert(key);
                }
            }
        }
        self.reported.retain(|k| now.contains(k));
    }

    /// The GatewayRouters, parsed; the ones that do not parse are listed as refused.
    fn routers(&mut self) {
        let mut routers = Vec::new();
        let mut bad = Vec::new();
        for o in self.objects.of("GatewayRouter") {
            let name = o.pointer("/metadata/name").and_then(Json::as_str).unwrap_or("").to_owned();
            match serde_json::from_value::<crd::GatewayRouterSpec>(o.get("spec").cloned().unwrap_or(Json::Null)) {
                Ok(spec) => routers.push(RouterEntry { name, spec }),
                Err(e) => bad.push(RefusedObject {
                    object: api_origin("GatewayRouter", &self.cfg.namespace, &name),
                    reason: "UnsupportedValue".into(),
                    message: format!("spec: {e}"),
                }),
            }
        }
        self.status.send_modify(|st| {
            st.routers = routers;
            st.refused.retain(|r| !r.object.starts_with("kubernetes: GatewayRouter/"));
            st.refused.extend(bad);
        });
    }

    fn summarise(&self) {
        let Some(plan) = &self.plan else { return };
        let served = self.sync.served();
        self.status.send_modify(|st| {
            st.serving = match &self.sync.outcome {
                Outcome::Applied => format!(
                    "{} route(s), {} service(s), {} endpoint(s)",
                    served.routes.len(),
                    served.services.len(),
                    served.endpoints.len()
                ),
                Outcome::Pending(why) => format!("nothing from Kubernetes yet: {why}"),
                Outcome::Refused(ps) if *served == Desired::default() => {
                    format!("nothing from Kubernetes: {}", ps.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
                }
                Outcome::Refused(ps) => format!(
                    "refused, still serving the last good state ({} route(s)): {}",
                    served.routes.len(),
                    ps.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
                ),
            };
            if !st.not_served.is_empty() {
                let not = st.not_served.join("; ");
                st.serving.push_str(&format!("; not served: {not}"));
            }
            st.refused.retain(|r| r.object.starts_with("kubernetes: GatewayRouter/"));
            for m in &plan.mapping.objects {
                if let Some(r) = &m.refusal {
                    st.refused.push(RefusedObject { object: m.origin.clone(), reason: r.reason.as_str().into(), message: r.message() });
                }
            }
            for (origin, why) in &plan.kept {
                st.refused.push(RefusedObject { object: origin.clone(), reason: "AlgorithmChangeRefused".into(), message: why.clone() });
            }
        });
    }

    /// Writes the status that differs from what the objects show.
    async fn write_status(&mut self, client: &Client) {
        let Some(plan) = &self.plan else { return };
        let now = k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())
            .map(|t| t.to_string())
            .unwrap_or_default();
        let Statuses { gateway, routes } = self.sync.status(&self.objects, plan, &now);
        let mut writes: Vec<(usize, String, Json)> = Vec::new();
        if let Some(st) = gateway {
            writes.push((0, self.cfg.gateway.clone(), st));
        }
        writes.extend(routes.into_iter().map(|(name, st)| (1, name, st)));
        let live: std::collections::HashSet<String> =
            writes.iter().map(|(i, name, _)| api_origin(KINDS[*i], &self.cfg.namespace, name)).collect();
        self.written.retain(|origin, _| live.contains(origin));
        let mut failed = false;
        for (i, name, st) in writes {
            if !self.write_one_status(client, i, name, st).await {
                failed = true;
            }
        }
        if !self.clear_stale_status(client).await {
            failed = true;
        }
        self.write_failed = failed;
    }

    /// Writes `st` as the status of object `name` of kind `KINDS[i]`
    /// unless the object shows it already or it was written for the
    /// object's current resourceVersion. False when the write failed.
    async fn write_one_status(&mut self, client: &Client, i: usize, name: String, st: Json) -> bool {
        let kind = KINDS[i];
        let Some(obj) = self.objects.by_kind.get(kind).and_then(|m| m.get(&name)) else { return true };
        if observed_part(kind, obj) == st {
            return true;
        }
        let rv = obj.pointer("/metadata/resourceVersion").and_then(Json::as_str).unwrap_or("").to_owned();
        let origin = api_origin(kind, &self.cfg.namespace, &name);
        if self.written.get(&origin) == Some(&(st.clone(), rv.clone())) {
            return true; // written; the watch has not shown it yet
        }
        let res = patch_status(client, &self.cfg.namespace, i, &name, &st).await;
        self.status.send_modify(|st| st.status_writes += 1);
        match res {
            Ok(_) => {
                debug!(%origin, "status written");
                self.written.insert(origin, (st, rv));
                true
            }
            Err(e) => {
                warn!(%origin, error = %e, "writing status failed; trying again");
                self.status.send_modify(|s| {
                    s.status_write_errors += 1;
                    s.last_error = Some(format!("writing the status of {origin}: {e}"));
                    s.last_error_at = Some(now_epoch());
                });
                false
            }
        }
    }

    /// Clears what this appliance wrote in the status of the objects of a
    /// Gateway that is no longer its own. False when a write failed.
    async fn clear_stale_status(&mut self, client: &Client) -> bool {
        let mut ok = true;
        for (kind, name) in self.sync.stale_status(&self.objects) {
            let Some(i) = KINDS.iter().position(|k| *k == kind) else { continue };
            let rv = self.objects.by_kind.get(kind).and_then(|m| m.get(&name)).and_then(|o| o.pointer("/metadata/resourceVersion")).and_then(Json::as_str).unwrap_or("").to_owned();
            let origin = api_origin(kind, &self.cfg.namespace, &name);
            if self.written.get(&origin) == Some(&(json!({}), rv.clone())) {
                continue; // cleared; the watch has not shown it yet
            }
            let res = patch_status(client, &self.cfg.namespace, i, &name, &json!({})).await;
            self.status.send_modify(|st| st.status_writes += 1);
            match res {
                Ok(_) => {
                    info!(%origin, "status written for a Gateway that is not this appliance's cleared");
                    self.written.insert(origin, (json!({}), rv));
                }
                Err(e) => {
                    warn!(%origin, error = %e, "clearing status failed; trying again");
                    self.status.send_modify(|s| {
                        s.status_write_errors += 1;
                        s.last_error = Some(format!("clearing the status of {origin}: {e}"));
                        s.last_error_at = Some(now_epoch());
                    });
                    ok = false;
                }
            }
        }
        ok
    }
}

/// Applies `status` as the status of object `name` of kind `KINDS[i]` in
/// `ns`, under [`FIELD_MANAGER`] (forced: the fields are this appliance's).
async fn patch_status(client: &Client, ns: &str, i: usize, name: &str, status: &Json) -> Result<DynamicObject, kube::Error> {
    let ar = &resources()[i];
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    let body = json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": name, "namespace": ns},
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body)).await
}
