//! A small stand-in for the Kubernetes API server, speaking the list and
//! watch protocol for the kinds Sluice watches, so that the Kubernetes
//! source can be tested without a cluster (there is none on the machines
//! this project is built on).
//!
//! What it does, as the API server does:
//! - `GET` of a collection lists it, with the collection's
//!   `resourceVersion`, in one namespace, filtered by `labelSelector`
//!   (`key=value`, comma-separated) and `fieldSelector` (`metadata.name`,
//!   `metadata.namespace`);
//! - `GET ...?watch=true&resourceVersion=N` streams `ADDED`, `MODIFIED`
//!   and `DELETED` events after `N` (an object that stops or starts
//!   matching the selector is `DELETED` or `ADDED`), `BOOKMARK`s when
//!   `allowWatchBookmarks=true`, and ends after `timeoutSeconds`;
//!   a version older than the compacted history gets `410 Gone`
//!   (an `ERROR` event with a `Status` of code 410);
//! - `GET /version` answers;
//! - `PATCH .../{name}/status`: server-side apply replaces the status
//!   fields it names, `conditions` merged by `type` (as the Gateway API's
//!   list-map), and removes those its field manager applied before and
//!   leaves out now; a merge patch merges; the resourceVersion is bumped;
//! - collections across namespaces (`/api/v1/pods`), `GET` of one object,
//!   `POST` (create; 409 when it exists), `PUT` (replace; 409 when the
//!   body's resourceVersion is not the stored one), `PATCH` (server-side
//!   apply creates or merges: metadata labels and annotations by key, the
//!   other fields replaced; a merge patch merges) and `DELETE`, for every
//!   kind, Pods, Deployments, ConfigMaps, Leases and Events among them;
//!   Namespaces (created with `POST /api/v1/namespaces`): a create into a
//!   namespace that has none is refused with 404, as the API server
//!   refuses it ([`FakeApi::apply`] of such an object panics), so a test
//!   creates the namespaces it uses first.
//!   There is no garbage collector: owner references are stored, not
//!   followed.
//!
//! Faults on demand: [`FakeApi::set_kind_installed`] answers 404 for a
//! kind (its CRD missing), [`FakeApi::drop_watches`] ends every open watch (the
//! connection drops), [`FakeApi::compact`] forgets the history (the next
//! watch from an old version gets 410), [`FakeApi::stop`] and
//! [`FakeApi::start`] take the server off the network and back on the
//! same port.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: failing loudly is the point

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value as Json};
use tokio::net::TcpListener;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// The kinds served: URL prefix, plural, kind, apiVersion.
pub const RESOURCES: [(&str, &str, &str, &str); 14] = [
    ("/apis/gateway.networking.k8s.io/v1", "gateways", "Gateway", "gateway.networking.k8s.io/v1"),
    ("/apis/meridio.experiment.gateway.api.poc/v1alpha1", "l34routes", "L34Route", "meridio.experiment.gateway.api.poc/v1alpha1"),
    ("/api/v1", "services", "Service", "v1"),
    ("/apis/discovery.k8s.io/v1", "endpointslices", "EndpointSlice", "discovery.k8s.io/v1"),
    ("/apis/meridio.experiment.gateway.api.poc/v1alpha1", "gatewayrouters", "GatewayRouter", "meridio.experiment.gateway.api.poc/v1alpha1"),
    ("/api/v1", "pods", "Pod", "v1"),
    ("/apis/apps/v1", "deployments", "Deployment", "apps/v1"),
    ("/api/v1", "configmaps", "ConfigMap", "v1"),
    ("/apis/coordination.k8s.io/v1", "leases", "Lease", "coordination.k8s.io/v1"),
    ("/apis/events.k8s.io/v1", "events", "Event", "events.k8s.io/v1"),
    ("/api/v1", "namespaces", "Namespace", "v1"),
    ("/api/v1", "serviceaccounts", "ServiceAccount", "v1"),
    ("/apis/rbac.authorization.k8s.io/v1", "roles", "Role", "rbac.authorization.k8s.io/v1"),
    ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", "rbac.authorization.k8s.io/v1"),
];

/// A request the server received.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Method.
    pub method: String,
    /// Path.
    pub path: String,
    /// Query, decoded into pairs.
    pub query: BTreeMap<String, String>,
    /// `Content-Type`.
    pub content_type: String,
    /// Body, as JSON when it is.
    pub body: Json,
}

impl Seen {
    /// True for a watch request.
    pub fn is_watch(&self) -> bool {
        matches!(self.query.get("watch").map(String::as_str), Some("true" | "1"))
    }
}

/// One change, kept in the history.
#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    kind: &'static str,
    before: Option<Json>,
    after: Option<Json>,
}

#[derive(Debug)]
struct State {
    rv: u64,
    /// Kind → (namespace, name) → object.
    objects: BTreeMap<&'static str, BTreeMap<(String, String), Json>>,
    history: Vec<Change>,
    /// Watches from before this version get 410 Gone.
    compacted: u64,
    seen: Vec<Seen>,
    bookmark_every: Duration,
    /// Kinds answered with 404, as for a CRD that is not installed.
    absent: std::collections::BTreeSet<&'static str>,
    /// Per object, the status fields each field manager applied
    /// (`conditions/<type>` or a status key).
    status_owners: BTreeMap<(&'static str, String, String), BTreeMap<String, std::collections::BTreeSet<String>>>,
    /// (kind, resourceVersion) of every bookmark handed to a watch, in order.
    bookmarks: Vec<(&'static str, u64)>,
}

/// The fake API server; stopped when dropped.
#[derive(Debug)]
pub struct FakeApi {
    state: Arc<Mutex<State>>,
    changes: broadcast::Sender<Change>,
    /// Ends every open watch when sent to.
    drops: broadcast::Sender<()>,
    addr: SocketAddr,
    server: Mutex<Option<JoinHandle<()>>>,
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

type Body = BoxBody<Bytes, Infallible>;

fn full(status: StatusCode, v: &Json) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str, message: &str) -> Json {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code})
}

fn kind_of(obj: &Json) -> Option<&'static str> {
    RESOURCES.iter().find(|r| obj["kind"] == r.2).map(|r| r.2)
}

/// Whether `obj` is in namespace `ns` (any when `None`) and matches the selectors.
fn matches(obj: &Json, ns: Option<&str>, labels: &[(String, String)], fields: &[(String, String)]) -> bool {
    ns.is_none_or(|ns| obj["metadata"]["namespace"] == ns)
        && labels.iter().all(|(k, v)| obj["metadata"]["labels"][k] == v.as_str())
        && fields.iter().all(|(k, v)| match k.as_str() {
            "metadata.name" => obj["metadata"]["name"] == v.as_str(),
            "metadata.namespace" => obj["metadata"]["namespace"] == v.as_str(),
            _ => false,
        })
}

fn selector(q: &BTreeMap<String, String>, key: &str) -> Vec<(String, String)> {
    q.get(key)
        .map(|s| s.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.trim_end_matches('=').to_owned(), v.to_owned())).collect())
        .unwrap_or_default()
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let h = std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match h {
                    Some(c) => {
                        out.push(c);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl FakeApi {
    /// Starts on a free loopback port.
    pub async fn start_new() -> FakeApi {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts listening on `addr`.
    pub async fn start_on(addr: SocketAddr) -> FakeApi {
        let listener = TcpListener::bind(addr).await.unwrap_or_else(|e| panic!("cannot listen on {addr}: {e}"));
        let addr = listener.local_addr().unwrap();
        let api = FakeApi {
            state: Arc::new(Mutex::new(State {
                rv: 1,
                objects: BTreeMap::new(),
                history: Vec::new(),
                compacted: 0,
                seen: Vec::new(),
                bookmark_every: Duration::from_millis(300),
                absent: std::collections::BTreeSet::new(),
                status_owners: BTreeMap::new(),
                bookmarks: Vec::new(),
            })),
            changes: broadcast::channel(4096).0,
            drops: broadcast::channel(16).0,
            addr,
            server: Mutex::new(None),
        };
        api.serve(listener);
        api
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that reaches it, with `namespace` as the context's.
    pub fn kubeconfig(&self, namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: fake\n  user: {{}}\n\
             contexts:\n- name: fake\n  context: {{cluster: fake, user: fake, namespace: {namespace}}}\ncurrent-context: fake\n",
            self.url()
        )
    }

    fn serve(&self, listener: TcpListener) {
        let (state, changes, drops) = (Arc::clone(&self.state), self.changes.clone(), self.drops.clone());
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (state, changes, drops) = (Arc::clone(&state), changes.clone(), drops.clone());
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (state, changes, drops) = (Arc::clone(&state), changes.clone(), drops.clone());
                        async move { Ok::<_, Infallible>(handle(req, state, changes, drops).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        *self.server.lock().unwrap() = Some(task);
    }

    /// Takes the server off the network: open connections are cut, new
    /// ones refused.
    pub fn stop(&self) {
        if let Some(t) = self.server.lock().unwrap().take() {
            t.abort();
        }
        let _ = self.drops.send(());
    }

    /// Puts it back on the same port.
    pub async fn start(&self) {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!("rebinding {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot bind {} again: {e}", self.addr),
            }
        };
        self.serve(listener);
    }

    /// Ends every open watch.
    pub fn drop_watches(&self) {
        let _ = self.drops.send(());
    }

    /// Forgets the history: every watch from a version up to now gets 410 Gone.
    pub fn compact(&self) {
        let mut s = lock(&self.state);
        s.compacted = s.rv + 1;
        s.history.clear();
    }

    /// Whether the Namespace `name` exists.
    pub fn has_namespace(&self, name: &str) -> bool {
        has_namespace(&lock(&self.state), name)
    }

    /// Answers every request about `kind` with 404, as for a custom
    /// resource whose CRD is not installed (`present` again: installed).
    pub fn set_kind_installed(&self, kind: &str, present: bool) {
        let Some(k) = RESOURCES.iter().find(|r| r.2 == kind).map(|r| r.2) else { panic!("not a kind served: {kind}") };
        let mut s = lock(&self.state);
        if present {
            s.absent.remove(k);
        } else {
            s.absent.insert(k);
        }
    }

    /// How often watches that asked for them get bookmarks.
    pub fn set_bookmark_every(&self, every: Duration) {
        lock(&self.state).bookmark_every = every;
    }

    /// Adds or replaces an object (it must have `kind`, `metadata.name` and
    /// `metadata.namespace`, a namespace that exists); its resourceVersion,
    /// uid and creation time are the server's. Returns the new
    /// resourceVersion.
    pub fn apply(&self, obj: Json) -> u64 {
        let kind = kind_of(&obj).unwrap_or_else(|| panic!("not a kind served: {obj}"));
        let mut s = lock(&self.state);
        if kind != "Namespace" {
            let ns = obj["metadata"]["namespace"].as_str().unwrap_or("default");
            assert!(has_namespace(&s, ns), "namespaces {ns:?} not found: create it before {obj}");
        }
        let change = store(&mut s, kind, obj);
        drop(s);
        let rv = change.rv;
        let _ = self.changes.send(change);
        rv
    }

    /// Deletes an object; true when it was there.
    pub fn delete(&self, kind: &str, namespace: &str, name: &str) -> bool {
        let Some(kind) = RESOURCES.iter().find(|r| r.2 == kind).map(|r| r.2) else { return false };
        let mut s = lock(&self.state);
        let Some(change) = remove(&mut s, kind, namespace, name) else { return false };
        drop(s);
        let _ = self.changes.send(change);
        true
    }

    /// The object, as stored.
    pub fn get(&self, kind: &str, namespace: &str, name: &str) -> Option<Json> {
        lock(&self.state).objects.get(kind)?.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// Every object, by kind then (namespace, name).
    pub fn objects(&self) -> BTreeMap<&'static str, BTreeMap<(String, String), Json>> {
        lock(&self.state).objects.clone()
    }

    /// The requests received so far.
    pub fn seen(&self) -> Vec<Seen> {
        lock(&self.state).seen.clone()
    }

    /// The resourceVersions of the bookmarks handed so far to watches of
    /// `kind` (e.g. "EndpointSlice"): a watch ends with what it was given,
    /// so a client has read everything before such a bookmark.
    pub fn bookmarks(&self, kind: &str) -> Vec<u64> {
        lock(&self.state).bookmarks.iter().filter(|(k, _)| *k == kind).map(|&(_, rv)| rv).collect()
    }

    /// The current resourceVersion (of the last change).
    pub fn resource_version(&self) -> u64 {
        lock(&self.state).rv
    }
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stores `obj` (added or replaced): its resourceVersion, uid, creation
/// time and generation are the server's; a replaced object keeps its
/// status unless `obj` has one.
fn has_namespace(s: &State, name: &str) -> bool {
    s.objects.get("Namespace").is_some_and(|m| m.contains_key(&(String::new(), name.to_owned())))
}

fn store(s: &mut State, kind: &'static str, mut obj: Json) -> Change {
    s.rv += 1;
    let rv = s.rv;
    let ns = if kind == "Namespace" { "" } else { obj["metadata"]["namespace"].as_str().unwrap_or("default") };
    let key = (ns.to_owned(), obj["metadata"]["name"].as_str().unwrap_or("").to_owned());
    if kind == "Namespace" {
        if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
    } else {
        obj["metadata"]["namespace"] = json!(key.0);
    }
    let before = s.objects.get(kind).and_then(|m| m.get(&key)).cloned();
    let meta = &mut obj["metadata"];
    meta["resourceVersion"] = json!(rv.to_string());
    match &before {
        Some(b) => {
            meta["uid"] = b["metadata"]["uid"].clone();
            meta["creationTimestamp"] = b["metadata"]["creationTimestamp"].clone();
            let generation = b["metadata"]["generation"].as_i64().unwrap_or(1);
            let spec_changed = b.get("spec") != obj.get("spec");
            obj["metadata"]["generation"] = json!(if spec_changed { generation + 1 } else { generation });
            if obj.get("status").is_none() {
                if let Some(st) = b.get("status") {
                    obj["status"] = st.clone();
                }
            }
        }
        None => {
            meta["uid"] = json!(format!("uid-{}-{rv}", key.1));
            if meta.get("creationTimestamp").is_none_or(Json::is_null) {
                meta["creationTimestamp"] = json!(format!("2025-01-01T00:00:{:02}Z", rv % 60));
            }
            meta["generation"] = json!(1);
        }
    }
    s.objects.entry(kind).or_default().insert(key, obj.clone());
    let change = Change { rv, kind, before, after: Some(obj) };
    s.history.push(change.clone());
    change
}

/// Removes an object, when it is there.
fn remove(s: &mut State, kind: &'static str, namespace: &str, name: &str) -> Option<Change> {
    let before = s.objects.get_mut(kind).and_then(|m| m.remove(&(namespace.to_owned(), name.to_owned())))?;
    s.rv += 1;
    let change = Change { rv: s.rv, kind, before: Some(before), after: None };
    s.history.push(change.clone());
    Some(change)
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Json, patch: &Json) {
    match patch {
        Json::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            for (k, v) in p {
                if v.is_null() {
                    if let Some(m) = target.as_object_mut() {
                        m.remove(k);
                    }
                } else {
                    merge_patch(&mut target[k.as_str()], v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Server-side apply of status `st` by `manager` onto `obj`: what that
/// manager applied before and leaves out now is removed (unless another
/// manager applied it since), and what it applies is its own.
fn own_status(s: &mut State, kind: &'static str, ns: &str, name: &str, manager: &str, st: &Json, obj: &mut Json) {
    let mut fields = std::collections::BTreeSet::new();
    for (k, v) in st.as_object().into_iter().flatten() {
        if k == "conditions" {
            fields.extend(v.as_array().into_iter().flatten().filter_map(|c| c["type"].as_str()).map(|t| format!("conditions/{t}")));
        } else {
            fields.insert(k.clone());
        }
    }
    let owners = s.status_owners.entry((kind, ns.to_owned(), name.to_owned())).or_default();
    let before = owners.insert(manager.to_owned(), fields.clone()).unwrap_or_default();
    for (m, f) in owners.iter_mut() {
        if m != manager {
            f.retain(|x| !fields.contains(x));
        }
    }
    for gone in before.difference(&fields) {
        if owners.iter().any(|(m, f)| m != manager && f.contains(gone)) {
            continue;
        }
        let Some(status) = obj.get_mut("status").and_then(Json::as_object_mut) else { continue };
        match gone.strip_prefix("conditions/") {
            Some(t) => {
                if let Some(c) = status.get_mut("conditions").and_then(Json::as_array_mut) {
                    c.retain(|c| c["type"] != t);
                }
            }
            None => {
                status.remove(gone);
            }
        }
    }
}

/// Server-side apply of `patch` onto `obj`, as far as this fake goes:
/// labels and annotations by key, `conditions` lists by `type`, other
/// fields replaced.
fn apply_patch(obj: &mut Json, patch: &Json) {
    let Some(p) = patch.as_object() else { return };
    for (k, v) in p {
        match k.as_str() {
            "metadata" => {
                for (mk, mv) in v.as_object().into_iter().flatten() {
                    match mk.as_str() {
                        "labels" | "annotations" => {
                            for (lk, lv) in mv.as_object().into_iter().flatten() {
                                obj["metadata"][mk.as_str()][lk.as_str()] = lv.clone();
                            }
                        }
                        "resourceVersion" | "uid" | "creationTimestamp" | "generation" | "managedFields" => {}
                        _ => obj["metadata"][mk.as_str()] = mv.clone(),
                    }
                }
            }
            "status" => {
                for (sk, sv) in v.as_object().into_iter().flatten() {
                    if sk == "conditions" {
                        let mut conds: Vec<Json> = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
                        for c in sv.as_array().into_iter().flatten() {
                            match conds.iter_mut().find(|x| x["type"] == c["type"]) {
                                Some(x) => *x = c.clone(),
                                None => conds.push(c.clone()),
                            }
                        }
                        obj["status"]["conditions"] = Json::Array(conds);
                    } else {
                        obj["status"][sk.as_str()] = sv.clone();
                    }
                }
            }
            _ => obj[k.as_str()] = v.clone(),
        }
    }
}

async fn handle(req: Request<Incoming>, state: Arc<Mutex<State>>, changes: broadcast::Sender<Change>, drops: broadcast::Sender<()>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query: BTreeMap<String, String> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect();
    let content_type = req.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Json = serde_json::from_slice(&bytes).unwrap_or_else(|_| Json::String(String::from_utf8_lossy(&bytes).into_owned()));
    lock(&state).seen.push(Seen { method: method.to_string(), path: path.clone(), query: query.clone(), content_type: content_type.clone(), body: body.clone() });

    if path == "/version" {
        return full(StatusCode::OK, &json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0-sluice-fake", "platform": "linux/amd64"}));
    }
    // /<prefix>/namespaces/<ns>/<plural>[/<name>[/status]], or /<prefix>/<plural> (every namespace)
    let Some((prefix, _, kind, api_version)) = RESOURCES
        .iter()
        .find(|r| {
            let rest = path.strip_prefix(r.0).unwrap_or("");
            let parts: Vec<&str> = rest.split('/').collect();
            (parts.len() == 2 && parts[0].is_empty() && parts[1] == r.1) || (parts.len() >= 4 && parts[1] == "namespaces" && parts[3] == r.1)
        })
        .copied()
    else {
        return full(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("no such resource: {path}")));
    };
    if lock(&state).absent.contains(kind) {
        return full(StatusCode::NOT_FOUND, &status(404, "NotFound", "the server could not find the requested resource"));
    }
    let parts: Vec<&str> = path[prefix.len()..].split('/').skip(1).collect();
    let (ns, rest): (Option<String>, Vec<&str>) = if parts[0] == "namespaces" && parts.len() >= 3 { (Some(parts[1].to_owned()), parts[3..].to_vec()) } else { (None, Vec::new()) };
    let name = rest.first().copied();
    let sub = rest.get(1).copied();
    let is_apply = content_type.starts_with("application/apply-patch");
    let send = |change: Change| {
        let _ = changes.send(change);
    };
    let missing_namespace = |ns: &str| {
        let s = lock(&state);
        (!has_namespace(&s, ns)).then(|| full(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("namespaces {ns:?} not found"))))
    };
    match (method, ns.as_deref(), name, sub) {
        (Method::POST, None, None, _) if kind == "Namespace" => {
            let mut obj = body.clone();
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!(api_version);
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            let mut s = lock(&state);
            if name.is_empty() || s.objects.get(kind).is_some_and(|m| m.contains_key(&(String::new(), name.clone()))) {
                return full(StatusCode::CONFLICT, &status(409, "AlreadyExists", &format!("namespaces {name:?} already exists")));
            }
            let change = store(&mut s, kind, obj);
            drop(s);
            let out = change.after.clone().unwrap_or(Json::Null);
            send(change);
            full(StatusCode::CREATED, &out)
        }
        (Method::POST | Method::PATCH, Some(ns), _, _) if missing_namespace(ns).is_some() && !lock(&state).objects.get(kind).is_some_and(|m| name.is_some_and(|n| m.contains_key(&(ns.to_owned(), n.to_owned())))) => {
            missing_namespace(ns).unwrap_or_else(|| full(StatusCode::NOT_FOUND, &Json::Null))
        }
        (Method::GET, ns, None, _) if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) => watch(&state, &changes, &drops, kind, api_version, ns, &query),
        (Method::GET, ns, None, _) => {
            let (labels, fields) = (selector(&query, "labelSelector"), selector(&query, "fieldSelector"));
            let s = lock(&state);
            let items: Vec<Json> = s.objects.get(kind).into_iter().flat_map(|m| m.values()).filter(|o| matches(o, ns, &labels, &fields)).cloned().collect();
            full(StatusCode::OK, &json!({"kind": format!("{kind}List"), "apiVersion": api_version, "metadata": {"resourceVersion": s.rv.to_string()}, "items": items}))
        }
        (Method::GET, Some(ns), Some(name), None) => match lock(&state).objects.get(kind).and_then(|m| m.get(&(ns.to_owned(), name.to_owned()))) {
            Some(o) => full(StatusCode::OK, o),
            None => full(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("{kind} {name:?} not found"))),
        },
        (Method::POST, Some(ns), None, _) => {
            let mut obj = body.clone();
            obj["metadata"]["namespace"] = json!(ns);
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!(api_version);
            let mut s = lock(&state);
            if obj["metadata"]["name"].as_str().is_none_or(str::is_empty) {
                let base = obj["metadata"]["generateName"].as_str().unwrap_or("x").to_owned();
                obj["metadata"]["name"] = json!(format!("{base}{}", s.rv + 1));
            }
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_owned();
            if s.objects.get(kind).is_some_and(|m| m.contains_key(&(ns.to_owned(), name.clone()))) {
                return full(StatusCode::CONFLICT, &status(409, "AlreadyExists", &format!("{kind} {name:?} already exists")));
            }
            let change = store(&mut s, kind, obj);
            drop(s);
            let out = change.after.clone().unwrap_or(Json::Null);
            send(change);
            full(StatusCode::CREATED, &out)
        }
        (Method::PUT, Some(ns), Some(name), None) => {
            let mut s = lock(&state);
            let Some(have) = s.objects.get(kind).and_then(|m| m.get(&(ns.to_owned(), name.to_owned()))).cloned() else {
                return full(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("{kind} {name:?} not found")));
            };
            let want = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
            if !want.is_empty() && Some(want) != have["metadata"]["resourceVersion"].as_str() {
                return full(StatusCode::CONFLICT, &status(409, "Conflict", &format!("Operation cannot be fulfilled on {kind} {name:?}: the object has been modified")));
            }
            let mut obj = body.clone();
            obj["metadata"]["namespace"] = json!(ns);
            obj["metadata"]["name"] = json!(name);
            obj["kind"] = json!(kind);
            obj["apiVersion"] = json!(api_version);
            let change = store(&mut s, kind, obj);
            drop(s);
            let out = change.after.clone().unwrap_or(Json::Null);
            send(change);
            full(StatusCode::OK, &out)
        }
        (Method::PATCH, Some(ns), Some(name), sub) if sub.is_none() || sub == Some("status") => {
            let mut s = lock(&state);
            let have = s.objects.get(kind).and_then(|m| m.get(&(ns.to_owned(), name.to_owned()))).cloned();
            let mut obj = match (have, is_apply && sub.is_none()) {
                (Some(h), _) => h,
                (None, true) => json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": ns}}),
                (None, false) => return full(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("{kind} {name:?} not found"))),
            };
            match sub {
                Some(_) => {
                    let Some(st) = body.get("status") else {
                        return full(StatusCode::BAD_REQUEST, &status(400, "BadRequest", "no status in the patch"));
                    };
                    if is_apply {
                        apply_patch(&mut obj, &json!({"status": st}));
                        let manager = query.get("fieldManager").cloned().unwrap_or_default();
                        own_status(&mut s, kind, ns, name, &manager, st, &mut obj);
                    } else {
                        merge_patch(&mut obj["status"], st);
                    }
                }
                None if is_apply => {
                    let mut b = body.clone();
                    if let Some(m) = b.as_object_mut() {
                        m.remove("status");
                    }
                    apply_patch(&mut obj, &b);
                }
                None => {
                    let mut b = body.clone();
                    if let Some(m) = b.as_object_mut() {
                        m.remove("status");
                    }
                    merge_patch(&mut obj, &b);
                }
            }
            obj["metadata"]["namespace"] = json!(ns);
            obj["metadata"]["name"] = json!(name);
            let change = store(&mut s, kind, obj);
            drop(s);
            let out = change.after.clone().unwrap_or(Json::Null);
            send(change);
            full(StatusCode::OK, &out)
        }
        (Method::DELETE, Some(ns), Some(name), None) => {
            let mut s = lock(&state);
            let Some(change) = remove(&mut s, kind, ns, name) else {
                return full(StatusCode::NOT_FOUND, &status(404, "NotFound", &format!("{kind} {name:?} not found")));
            };
            drop(s);
            let out = change.before.clone().unwrap_or(Json::Null);
            send(change);
            full(StatusCode::OK, &out)
        }
        _ => full(StatusCode::METHOD_NOT_ALLOWED, &status(405, "MethodNotAllowed", "not served by the fake")),
    }
}

fn event(t: &str, obj: &Json) -> Bytes {
    let mut line = json!({"type": t, "object": obj}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// The event a watch with these filters sees for a change, if any.
fn seen_as(c: &Change, ns: Option<&str>, labels: &[(String, String)], fields: &[(String, String)]) -> Option<Bytes> {
    let was = c.before.as_ref().is_some_and(|b| matches(b, ns, labels, fields));
    let is = c.after.as_ref().is_some_and(|a| matches(a, ns, labels, fields));
    match (was, is, &c.after) {
        (false, true, Some(a)) => Some(event("ADDED", a)),
        (true, true, Some(a)) => Some(event("MODIFIED", a)),
        (true, false, Some(a)) => Some(event("DELETED", a)),
        (true, _, None) => Some(event("DELETED", c.before.as_ref()?)),
        _ => None,
    }
}

fn watch(
    state: &Arc<Mutex<State>>,
    changes: &broadcast::Sender<Change>,
    drops: &broadcast::Sender<()>,
    kind: &'static str,
    api_version: &'static str,
    ns: Option<&str>,
    q: &BTreeMap<String, String>,
) -> Response<Body> {
    let from: u64 = q.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
    let (labels, fields) = (selector(q, "labelSelector"), selector(q, "fieldSelector"));
    let bookmarks = q.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let timeout = Duration::from_secs(q.get("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(300));
    let s = lock(state);
    if from < s.compacted {
        let gone = event("ERROR", &status(410, "Expired", &format!("too old resource version: {from} ({})", s.compacted)));
        return Response::builder().status(200).body(Full::new(gone).boxed()).unwrap();
    }
    let backlog: Vec<Bytes> = s.history.iter().filter(|c| c.rv > from && c.kind == kind).filter_map(|c| seen_as(c, ns, &labels, &fields)).collect();
    let mut live = changes.subscribe();
    let mut dropped = drops.subscribe();
    let every = s.bookmark_every;
    let state = Arc::clone(state);
    let ns = ns.map(str::to_owned);
    drop(s);
    let deadline = tokio::time::Instant::now() + timeout;
    let live = async_stream(move |tx| async move {
        for b in backlog {
            if tx.send(b).await.is_err() {
                return;
            }
        }
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            let out = tokio::select! {
                _ = dropped.recv() => return,
                () = tokio::time::sleep_until(deadline) => return,
                c = live.recv() => match c {
                    Ok(c) if c.kind == kind && c.rv > from => seen_as(&c, ns.as_deref(), &labels, &fields),
                    Ok(_) => None,
                    Err(_) => return, // fell behind: the client watches again
                },
                _ = tick.tick(), if bookmarks => {
                    let rv = lock(&state).rv;
                    if tx.send(event("BOOKMARK", &json!({"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": rv.to_string()}}))).await.is_err() {
                        return;
                    }
                    lock(&state).bookmarks.push((kind, rv));
                    None
                }
            };
            if let Some(b) = out {
                if tx.send(b).await.is_err() {
                    return;
                }
            }
        }
    });
    let body = StreamBody::new(live.map(|b| Ok::<_, Infallible>(Frame::data(b))));
    Response::builder().status(200).header("content-type", "application/json").body(BodyExt::boxed(body)).unwrap()
}

/// A stream fed by a task through a channel; the task ends when the
/// stream is dropped.
fn async_stream<F, Fut>(f: F) -> impl futures_util::Stream<Item = Bytes> + Send + 'static
where
    F: FnOnce(tokio::sync::mpsc::Sender<Bytes>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(f(tx));
    let guard = AbortOnDrop(task);
    futures_util::stream::unfold((rx, guard), |(mut rx, guard)| async move { rx.recv().await.map(|b| (b, (rx, guard))) })
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The objects of a directory of manifests (`.yaml`/`.yml`), as JSON, in
/// `namespace` unless they name their own.
pub fn read_manifests(dir: &std::path::Path, namespace: &str) -> Result<Vec<Json>, String> {
    let objects = sluice::config::manifests::read_dir(dir).map_err(|ps| ps.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))?;
    Ok(objects
        .into_iter()
        .map(|o| o.value.to_json())
        .filter(|v| kind_of(v).is_some())
        .map(|mut v| {
            if v["metadata"]["namespace"].is_null() && v["kind"] != "Namespace" {
                v["metadata"]["namespace"] = json!(namespace);
            }
            v
        })
        .collect())
}

/// The objects a directory put on the server: kind, namespace, name.
pub type Synced = std::collections::BTreeSet<(&'static str, String, String)>;

/// Makes the server hold `objects` (by kind, namespace and name), leaving
/// alone those that did not change, and deleting those of `synced` (what
/// earlier calls put there) that are gone; what others wrote (a
/// controller's slices, Leases, Events, annotations on these objects)
/// stays. Namespaces come first; an object whose namespace does not exist
/// is refused, as the API server refuses it: the returned messages say which.
pub fn sync_objects(api: &FakeApi, objects: &[Json], synced: &mut Synced) -> Vec<String> {
    let have = api.objects();
    let key = |v: &Json| {
        let k = kind_of(v).unwrap_or("");
        let ns = if k == "Namespace" { String::new() } else { v["metadata"]["namespace"].as_str().unwrap_or("").to_owned() };
        (k, ns, v["metadata"]["name"].as_str().unwrap_or("").to_owned())
    };
    let mut refused = Vec::new();
    let (namespaces, rest): (Vec<&Json>, Vec<&Json>) = objects.iter().partition(|o| kind_of(o) == Some("Namespace"));
    for o in namespaces.into_iter().chain(rest) {
        let (k, ns, name) = key(o);
        if k != "Namespace" && !api.has_namespace(&ns) {
            refused.push(format!("{k} {ns}/{name}: namespaces {ns:?} not found"));
            continue;
        }
        let held = have.get(k).and_then(|m| m.get(&(ns, name)));
        // Annotations others added (a controller's) stay, as `kubectl
        // apply` leaves them.
        let theirs: serde_json::Map<String, Json> = held
            .and_then(|h| h["metadata"]["annotations"].as_object())
            .map(|a| a.iter().filter(|(key, _)| o["metadata"]["annotations"].get(key.as_str()).is_none()).map(|(key, v)| (key.clone(), v.clone())).collect())
            .unwrap_or_default();
        let same = held.is_some_and(|h| {
            let strip = |v: &Json| {
                let mut v = v.clone();
                if let Some(m) = v["metadata"].as_object_mut() {
                    for f in ["resourceVersion", "uid", "creationTimestamp", "generation"] {
                        m.remove(f);
                    }
                    if let Some(a) = m.get_mut("annotations").and_then(Json::as_object_mut) {
                        a.retain(|key, _| !theirs.contains_key(key));
                        if a.is_empty() {
                            m.remove("annotations");
                        }
                    }
                }
                if let Some(m) = v.as_object_mut() {
                    m.remove("status");
                }
                v
            };
            strip(h) == strip(o)
        });
        if !same {
            let mut o = o.clone();
            for (key, v) in theirs {
                o["metadata"]["annotations"][key.as_str()] = v;
            }
            api.apply(o);
        }
    }
    let now: Synced = objects.iter().map(key).filter(|k| !k.0.is_empty()).collect();
    for (k, ns, name) in synced.difference(&now) {
        if have.get(k).is_some_and(|m| m.contains_key(&(ns.clone(), name.clone()))) {
            api.delete(k, ns, name);
        }
    }
    *synced = now;
    refused
}
