//! A small xDS management server for tests, with the snapshot-cache
//! semantics of go-control-plane: per-node snapshots with a version;
//! every stream gets the snapshot of its node (or the default one), is
//! answered when it asks for a version other than the snapshot's or for
//! names it did not have, and again whenever the snapshot changes; a
//! response is not followed by another of its type until the client
//! acknowledges it (a request carrying its nonce); requests with a stale
//! nonce are ignored; a NACK is recorded and the refused version is not
//! sent again (only a new snapshot is), unless [`XdsServer::set_resend_nacked`]
//! asks for go-control-plane v0.11's state-of-the-world behaviour: a NACK
//! carries the version the client last accepted, which is not the
//! snapshot's, so the refused version is sent again at once. (A delta
//! resource the client refused is not sent again in either case: the
//! server records what it sent as held.) Both aggregated variants are
//! served: state of the world and incremental (delta), with per-resource
//! versions that are hashes of the resource as written, removals, and
//! `initial_resource_versions` honoured.
//!
//! As go-control-plane's cache in ADS mode, a named state-of-the-world
//! request is answered only when it names every resource of its type in
//! the snapshot.
//!
//! Resources are written as JSON (or YAML) in the field names of Envoy's
//! proto3 JSON form, for the fields an L4 load balancer uses (see
//! [`cluster`] and [`assignment`]), and converted to the Envoy messages.
//!
//! Every request is logged ([`XdsServer::requests`]) so tests can check
//! what the client sent: versions, nonces, names, NACK messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy, MaglevLbConfig};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address, Address, HealthStatus, Locality, Metadata, SocketAddress};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{AggregatedDiscoveryService, AggregatedDiscoveryServiceServer};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource};
use envoy_types::pb::google::protobuf::{value::Kind, Any, ListValue, Struct, UInt32Value, UInt64Value, Value as PbValue};
use futures_util::Stream;
use prost::{Message, Name};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};

/// Type URL of clusters.
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of cluster load assignments.
pub const CLA_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

// ---- resources from JSON ----------------------------------------------------

fn fields<'a>(v: &'a Value, what: &str, known: &[&str]) -> Result<&'a serde_json::Map<String, Value>, String> {
    let m = v.as_object().ok_or_else(|| format!("{what}: expected an object, found {v}"))?;
    for k in m.keys() {
        if !known.contains(&k.as_str()) {
            return Err(format!("{what}: unknown field {k:?} (known: {})", known.join(", ")));
        }
    }
    Ok(m)
}

fn str_of(v: &Value, what: &str) -> Result<String, String> {
    v.as_str().map(str::to_owned).ok_or_else(|| format!("{what}: expected a string, found {v}"))
}

fn u64_of(v: &Value, what: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => n.as_u64().ok_or_else(|| format!("{what}: {n} is not a whole number")),
        Value::String(s) => s.parse().map_err(|_| format!("{what}: {s:?} is not a whole number")),
        _ => Err(format!("{what}: expected a number, found {v}")),
    }
}

/// Any JSON as a `google.protobuf.Value`.
pub fn pb_value(v: &Value) -> PbValue {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(ListValue { values: a.iter().map(pb_value).collect() }),
        Value::Object(o) => Kind::StructValue(pb_struct(o)),
    };
    PbValue { kind: Some(kind) }
}

fn pb_struct(o: &serde_json::Map<String, Value>) -> Struct {
    Struct { fields: o.iter().map(|(k, v)| (k.clone(), pb_value(v))).collect() }
}

fn metadata(v: &Value, what: &str) -> Result<Metadata, String> {
    let m = fields(v, what, &["filter_metadata"])?;
    let mut out = Metadata::default();
    if let Some(fm) = m.get("filter_metadata") {
        let fm = fm.as_object().ok_or_else(|| format!("{what}.filter_metadata: expected an object"))?;
        for (k, v) in fm {
            let o = v.as_object().ok_or_else(|| format!("{what}.filter_metadata.{k}: expected an object"))?;
            out.filter_metadata.insert(k.clone(), pb_struct(o));
        }
    }
    Ok(out)
}

fn enum_by_name<T>(v: &Value, what: &str, from: impl Fn(&str) -> Option<T>) -> Result<T, String> {
    let s = str_of(v, what)?;
    from(&s).ok_or_else(|| format!("{what}: unknown value {s:?}"))
}

/// A `Cluster` from its JSON form. Fields: `name`, `type` (`EDS`,
/// `STATIC`, `STRICT_DNS`, ...), `lb_policy` (`MAGLEV`, `RANDOM`, ...),
/// `eds_cluster_config.service_name`, `maglev_lb_config.table_size`,
/// `metadata.filter_metadata`, `load_assignment`.
pub fn cluster(v: &Value) -> Result<Cluster, String> {
    let m = fields(v, "cluster", &["name", "type", "lb_policy", "eds_cluster_config", "maglev_lb_config", "metadata", "load_assignment", "connect_timeout"])?;
    let mut c = Cluster { name: str_of(m.get("name").ok_or("cluster: missing name")?, "cluster.name")?, ..Cluster::default() };
    if let Some(t) = m.get("type") {
        let t = enum_by_name(t, "cluster.type", DiscoveryType::from_str_name)?;
        c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(t as i32));
    }
    if let Some(p) = m.get("lb_policy") {
        c.lb_policy = enum_by_name(p, "cluster.lb_policy", LbPolicy::from_str_name)? as i32;
    }
    if let Some(e) = m.get("eds_cluster_config") {
        let e = fields(e, "cluster.eds_cluster_config", &["service_name", "eds_config"])?;
        let service_name = e.get("service_name").map(|s| str_of(s, "service_name")).transpose()?.unwrap_or_default();
        c.eds_cluster_config = Some(EdsClusterConfig { service_name, ..EdsClusterConfig::default() });
    }
    if let Some(mg) = m.get("maglev_lb_config") {
        let mg = fields(mg, "cluster.maglev_lb_config", &["table_size"])?;
        let table_size = mg.get("table_size").map(|t| u64_of(t, "table_size")).transpose()?.map(|value| UInt64Value { value });
        c.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig { table_size }));
    }
    if let Some(md) = m.get("metadata") {
        c.metadata = Some(metadata(md, "cluster.metadata")?);
    }
    if let Some(la) = m.get("load_assignment") {
        c.load_assignment = Some(assignment(la)?);
    }
    Ok(c)
}

/// A `ClusterLoadAssignment` from its JSON form: `cluster_name`,
/// `endpoints[]` of `{priority, locality, lb_endpoints[]}`, each
/// `lb_endpoint` with `endpoint.address.socket_address.{address,
/// port_value}`, `health_status` (`HEALTHY`, `DRAINING`, ...),
/// `load_balancing_weight` and `metadata.filter_metadata`.
pub fn assignment(v: &Value) -> Result<ClusterLoadAssignment, String> {
    let m = fields(v, "assignment", &["cluster_name", "endpoints"])?;
    let mut cla = ClusterLoadAssignment {
        cluster_name: str_of(m.get("cluster_name").ok_or("assignment: missing cluster_name")?, "cluster_name")?,
        ..ClusterLoadAssignment::default()
    };
    for (i, loc) in m.get("endpoints").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let what = format!("assignment.endpoints[{i}]");
        let l = fields(loc, &what, &["priority", "locality", "lb_endpoints", "load_balancing_weight"])?;
        let mut out = LocalityLbEndpoints {
            priority: l.get("priority").map(|p| u64_of(p, "priority")).transpose()?.unwrap_or(0).try_into().map_err(|_| "priority too large")?,
            ..LocalityLbEndpoints::default()
        };
        if let Some(loc) = l.get("locality") {
            let lo = fields(loc, "locality", &["region", "zone", "sub_zone"])?;
            let g = |k: &str| lo.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
            out.locality = Some(Locality { region: g("region"), zone: g("zone"), sub_zone: g("sub_zone") });
        }
        if let Some(w) = l.get("load_balancing_weight") {
            out.load_balancing_weight = Some(UInt32Value { value: u64_of(w, "load_balancing_weight")?.try_into().map_err(|_| "weight too large")? });
        }
        for (j, e) in l.get("lb_endpoints").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let what = format!("{what}.lb_endpoints[{j}]");
            let f = fields(e, &what, &["endpoint", "health_status", "load_balancing_weight", "metadata"])?;
            let ep = f.get("endpoint").ok_or_else(|| format!("{what}: missing endpoint"))?;
            let sa = ep
                .pointer("/address/socket_address")
                .ok_or_else(|| format!("{what}: missing endpoint.address.socket_address"))?;
            let s = fields(sa, &what, &["address", "port_value", "protocol"])?;
            let port = s.get("port_value").map(|p| u64_of(p, "port_value")).transpose()?.unwrap_or(0);
            let mut lb = LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(address::Address::SocketAddress(SocketAddress {
                            address: str_of(s.get("address").ok_or_else(|| format!("{what}: missing address"))?, "address")?,
                            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::try_from(port).map_err(|_| "port too large")?)),
                            ..SocketAddress::default()
                        })),
                    }),
                    ..Endpoint::default()
                })),
                ..LbEndpoint::default()
            };
            if let Some(h) = f.get("health_status") {
                lb.health_status = enum_by_name(h, "health_status", HealthStatus::from_str_name)? as i32;
            }
            if let Some(w) = f.get("load_balancing_weight") {
                lb.load_balancing_weight = Some(UInt32Value { value: u64_of(w, "load_balancing_weight")?.try_into().map_err(|_| "weight too large")? });
            }
            if let Some(md) = f.get("metadata") {
                lb.metadata = Some(metadata(md, "metadata")?);
            }
            out.lb_endpoints.push(lb);
        }
        cla.endpoints.push(out);
    }
    Ok(cla)
}

/// A resource as served: its name, its version (a hash of its JSON form,
/// so the same resource written again keeps its version) and its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Res {
    /// Name.
    pub name: String,
    /// Version (delta).
    pub version: String,
    /// The packed message.
    pub any: Any,
}

fn fnv(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// What one node is served.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The version of every type (SotW `version_info`).
    pub version: String,
    /// Clusters by name.
    pub clusters: BTreeMap<String, Res>,
    /// Assignments by name.
    pub assignments: BTreeMap<String, Res>,
}

impl Snapshot {
    /// A snapshot from JSON resources (see [`cluster`] and [`assignment`]).
    pub fn new(version: &str, clusters: &[Value], assignments: &[Value]) -> Result<Snapshot, String> {
        let mut s = Snapshot { version: version.to_owned(), ..Snapshot::default() };
        for c in clusters {
            let pb = cluster(c)?;
            s.add_cluster_with(pb, &c.to_string());
        }
        for a in assignments {
            let pb = assignment(a)?;
            s.add_assignment_with(pb, &a.to_string());
        }
        Ok(s)
    }

    /// Adds a cluster built in code (its version: a hash of `tag`).
    pub fn add_cluster_with(&mut self, c: Cluster, tag: &str) {
        let any = Any { type_url: Cluster::type_url(), value: c.encode_to_vec() };
        self.clusters.insert(c.name.clone(), Res { name: c.name, version: fnv(tag.as_bytes()), any });
    }

    /// Adds an assignment built in code (its version: a hash of `tag`).
    pub fn add_assignment_with(&mut self, a: ClusterLoadAssignment, tag: &str) {
        let any = Any { type_url: ClusterLoadAssignment::type_url(), value: a.encode_to_vec() };
        self.assignments.insert(a.cluster_name.clone(), Res { name: a.cluster_name, version: fnv(tag.as_bytes()), any });
    }

    /// Adds a resource as raw bytes (for input that does not decode).
    pub fn add_raw(&mut self, type_url: &str, name: &str, type_url_in_any: &str, bytes: Vec<u8>) {
        let r = Res { name: name.to_owned(), version: fnv(&bytes), any: Any { type_url: type_url_in_any.to_owned(), value: bytes } };
        if type_url == CLUSTER_TYPE {
            self.clusters.insert(name.to_owned(), r);
        } else {
            self.assignments.insert(name.to_owned(), r);
        }
    }

    fn of(&self, type_url: &str) -> &BTreeMap<String, Res> {
        if type_url == CLUSTER_TYPE {
            &self.clusters
        } else {
            &self.assignments
        }
    }

    /// Reads `{version, clusters, assignments, nodes: {id: {...}}}` (JSON,
    /// or YAML through the appliance's reader): the default snapshot and
    /// per-node ones.
    pub fn from_document(doc: &Value) -> Result<BTreeMap<String, Snapshot>, String> {
        let one = |v: &Value, what: &str| -> Result<Snapshot, String> {
            let m = fields(v, what, &["version", "clusters", "assignments", "nodes"])?;
            let version = m.get("version").map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            let list = |k: &str| m.get(k).and_then(Value::as_array).cloned().unwrap_or_default();
            Snapshot::new(&version.unwrap_or_else(|| "1".into()), &list("clusters"), &list("assignments"))
        };
        let mut out = BTreeMap::new();
        out.insert(DEFAULT_NODE.to_owned(), one(doc, "document")?);
        if let Some(nodes) = doc.get("nodes").and_then(Value::as_object) {
            for (id, v) in nodes {
                out.insert(id.clone(), one(v, &format!("nodes.{id}"))?);
            }
        }
        Ok(out)
    }
}

/// The snapshot key that serves every node without its own.
pub const DEFAULT_NODE: &str = "*";

// ---- the log ------------------------------------------------------------------

/// What a request was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// The first request of its type on a stream.
    Initial,
    /// Acknowledges the response with its nonce.
    Ack,
    /// Refuses it.
    Nack(String),
    /// Anything else (a subscription change).
    Other,
}

/// One request received.
#[derive(Clone, Debug)]
pub struct Logged {
    /// Stream number (1, 2, ... in order of opening).
    pub stream: u64,
    /// `true` for a delta stream.
    pub delta: bool,
    /// The node id (from the stream's first request).
    pub node: String,
    /// Type URL.
    pub type_url: String,
    /// SotW `version_info`.
    pub version_info: String,
    /// `response_nonce`.
    pub nonce: String,
    /// SotW `resource_names`, or delta `resource_names_subscribe`.
    pub names: Vec<String>,
    /// Delta `resource_names_unsubscribe`.
    pub unsubscribe: Vec<String>,
    /// Delta `initial_resource_versions`.
    pub initial_versions: BTreeMap<String, String>,
    /// What it was.
    pub kind: RequestKind,
    /// Whether its nonce was stale (ignored).
    pub stale: bool,
    /// The node's client features.
    pub client_features: Vec<String>,
    /// When it came.
    pub at: std::time::Instant,
}

/// One response sent.
#[derive(Clone, Debug)]
pub struct Sent {
    /// Stream number.
    pub stream: u64,
    /// Type URL.
    pub type_url: String,
    /// Version (SotW) or system version (delta).
    pub version: String,
    /// Nonce.
    pub nonce: String,
    /// Resource names.
    pub names: Vec<String>,
    /// Delta removals.
    pub removed: Vec<String>,
    /// When it was handed to the stream.
    pub at: std::time::Instant,
}

/// What the server did, in order, for a watcher ([`XdsServer::events`]).
#[derive(Clone, Debug)]
pub enum Event {
    /// A request received.
    Request(Logged),
    /// A response sent.
    Response(Sent),
}

#[derive(Default)]
struct Shared {
    /// Shared with the streams: a response reads them without copying
    /// (or later freeing) 20,000 resources on the server's one thread.
    snapshots: BTreeMap<String, Arc<Snapshot>>,
    requests: Vec<Logged>,
    sent: Vec<Sent>,
    streams: u64,
    /// Types in the order a snapshot change is pushed (delta and SotW).
    order: Vec<&'static str>,
    /// SotW: a NACKed version is sent again at once (go-control-plane).
    resend_nacked: bool,
    /// Watchers of requests and responses (closed ones are dropped).
    watchers: Vec<mpsc::UnboundedSender<Event>>,
}

/// The management server: a snapshot cache that outlives the listeners
/// serving it (stop one and serve again to play a restart).
#[derive(Clone)]
pub struct XdsServer {
    shared: Arc<Mutex<Shared>>,
    changed: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for XdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdsServer").finish_non_exhaustive()
    }
}

impl Default for XdsServer {
    fn default() -> Self {
        XdsServer::new()
    }
}

/// TLS for the server: its certificate and key, and the CA its clients'
/// certificates must chain to (mutual TLS) if any.
#[derive(Clone, Debug)]
pub struct ServerTls {
    /// PEM certificate chain.
    pub cert_pem: String,
    /// PEM key.
    pub key_pem: String,
    /// PEM CA for client certificates; `None`: no client certificate asked.
    pub client_ca_pem: Option<String>,
}

/// A listener serving the cache; stops on [`Running::stop`] or drop.
#[derive(Debug)]
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    cancel: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Closes every stream and the listener, and waits for them.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

type Out<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

struct Service {
    server: XdsServer,
    cancel: CancellationToken,
}

impl XdsServer {
    /// An empty cache (streams wait until their node has a snapshot).
    pub fn new() -> XdsServer {
        let (tx, _) = watch::channel(0);
        let shared = Shared { order: vec![CLUSTER_TYPE, CLA_TYPE], ..Shared::default() };
        XdsServer { shared: Arc::new(Mutex::new(shared)), changed: Arc::new(tx) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets the snapshot of `node` ([`DEFAULT_NODE`] for every node without
    /// its own); streams are told at once.
    pub fn set_snapshot(&self, node: &str, s: Snapshot) {
        self.lock().snapshots.insert(node.to_owned(), Arc::new(s));
        self.changed.send_modify(|g| *g += 1);
    }

    /// Replaces every snapshot.
    pub fn set_all(&self, all: BTreeMap<String, Snapshot>) {
        self.lock().snapshots = all.into_iter().map(|(n, s)| (n, Arc::new(s))).collect();
        self.changed.send_modify(|g| *g += 1);
    }

    /// The order in which types are pushed after a change (default:
    /// clusters, then assignments).
    pub fn set_push_order(&self, order: &[&'static str]) {
        self.lock().order = order.to_vec();
    }

    /// State of the world: answer a NACK as go-control-plane v0.11 does,
    /// with the refused version again at once (the NACK names the version
    /// the client last accepted, not the snapshot's); by default the
    /// refused version is not sent again until the snapshot changes.
    pub fn set_resend_nacked(&self, on: bool) {
        self.lock().resend_nacked = on;
    }

    fn resend_nacked(&self) -> bool {
        self.lock().resend_nacked
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.lock().requests.clone()
    }

    /// Every response sent so far.
    pub fn sent(&self) -> Vec<Sent> {
        self.lock().sent.clone()
    }

    /// The version and time of the last response of type `type_url` sent
    /// (without copying every response, as [`Self::sent`] does).
    pub fn last_sent(&self, type_url: &str) -> Option<(String, std::time::Instant)> {
        self.lock().sent.iter().rev().find(|s| s.type_url == type_url).map(|s| (s.version.clone(), s.at))
    }

    /// The NACK messages received, by type.
    pub fn nacks(&self) -> Vec<(String, String)> {
        self.lock()
            .requests
            .iter()
            .filter_map(|r| match &r.kind {
                RequestKind::Nack(m) => Some((r.type_url.clone(), m.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every request received and response sent from now on, in order:
    /// what a test waits for when the server may have nothing to send (a
    /// client reconnecting with the version it holds).
    pub fn events(&self) -> mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().watchers.push(tx);
        rx
    }

    /// Streams opened so far.
    pub fn streams(&self) -> u64 {
        self.lock().streams
    }

    fn snapshot_for(&self, node: &str) -> Option<Arc<Snapshot>> {
        let g = self.lock();
        g.snapshots.get(node).or_else(|| g.snapshots.get(DEFAULT_NODE)).cloned()
    }

    /// Serves the cache on `addr` (use port 0), with TLS if given.
    pub async fn serve(&self, addr: SocketAddr, tls: Option<ServerTls>) -> std::io::Result<Running> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let cancel = CancellationToken::new();
        let mut builder = Server::builder();
        if let Some(t) = tls {
            let mut cfg = ServerTlsConfig::new().identity(Identity::from_pem(t.cert_pem, t.key_pem));
            if let Some(ca) = t.client_ca_pem {
                cfg = cfg.client_ca_root(Certificate::from_pem(ca));
            }
            builder = builder.tls_config(cfg).map_err(std::io::Error::other)?;
        }
        let svc = AggregatedDiscoveryServiceServer::new(Service { server: self.clone(), cancel: cancel.clone() });
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let c = cancel.clone();
        let task = tokio::spawn(async move {
            let _ = builder.add_service(svc).serve_with_incoming_shutdown(incoming, c.cancelled_owned()).await;
        });
        Ok(Running { addr, cancel, task: Some(task) })
    }

    fn log(&self, l: Logged) {
        let mut g = self.lock();
        g.watchers.retain(|w| w.send(Event::Request(l.clone())).is_ok());
        g.requests.push(l);
    }

    fn next_stream(&self) -> u64 {
        let mut g = self.lock();
        g.streams += 1;
        g.streams
    }

    fn order(&self) -> Vec<&'static str> {
        self.lock().order.clone()
    }

    fn record_sent(&self, s: Sent) {
        let mut g = self.lock();
        g.watchers.retain(|w| w.send(Event::Response(s.clone())).is_ok());
        g.sent.push(s);
    }
}

fn type_key(t: &str) -> Option<&'static str> {
    match t {
        CLUSTER_TYPE => Some(CLUSTER_TYPE),
        CLA_TYPE => Some(CLA_TYPE),
        _ => None,
    }
}

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> Out<T> {
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) }))
}

// ---- state of the world -------------------------------------------------------------

#[derive(Default)]
struct SotwType {
    /// Requested on this stream.
    requested: bool,
    /// Named subscriptions (empty and never named: wildcard).
    names: BTreeSet<String>,
    named: bool,
    /// The version the client has, as far as the server knows.
    client_version: String,
    /// Names the client was sent at `client_version`.
    client_names: BTreeSet<String>,
    /// The latest nonce sent for this type.
    nonce: Option<String>,
    /// That response waits for its ACK or NACK.
    awaiting: bool,
}

struct SotwStream {
    server: XdsServer,
    id: u64,
    node: String,
    types: HashMap<&'static str, SotwType>,
    nonce: u64,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
}

impl SotwStream {
    fn request(&mut self, r: DiscoveryRequest) {
        if self.node.is_empty() {
            if let Some(n) = &r.node {
                self.node = n.id.clone();
            }
        }
        let features = r.node.as_ref().map(|n| n.client_features.clone()).unwrap_or_default();
        let Some(t) = type_key(&r.type_url) else { return };
        let st = self.types.entry(t).or_default();
        // A nonce other than the latest one sent is stale: ignored.
        let stale = !r.response_nonce.is_empty() && st.nonce.as_deref() != Some(r.response_nonce.as_str());
        let kind = if let Some(e) = &r.error_detail {
            RequestKind::Nack(e.message.clone())
        } else if !r.response_nonce.is_empty() && st.awaiting && !stale {
            RequestKind::Ack
        } else if !st.requested {
            RequestKind::Initial
        } else {
            RequestKind::Other
        };
        self.server.log(Logged {
            stream: self.id,
            delta: false,
            node: self.node.clone(),
            type_url: r.type_url.clone(),
            version_info: r.version_info.clone(),
            nonce: r.response_nonce.clone(),
            names: r.resource_names.clone(),
            unsubscribe: Vec::new(),
            initial_versions: BTreeMap::new(),
            kind: kind.clone(),
            stale,
            client_features: features,
            at: std::time::Instant::now(),
        });
        if stale {
            return;
        }
        if !st.requested || (matches!(kind, RequestKind::Nack(_)) && self.server.resend_nacked()) {
            // The client holds what it says it holds.
            st.client_version = r.version_info.clone();
        }
        // Otherwise the client has what was sent last: acknowledged, or
        // refused (a refused version is not sent again; a new one is).
        st.requested = true;
        st.awaiting = false;
        if !r.resource_names.is_empty() {
            st.named = true;
        }
        st.names = r.resource_names.iter().cloned().collect();
        self.respond(t);
    }

    fn wildcard(st: &SotwType) -> bool {
        !st.named
    }

    /// Responds for type `t` if the client lacks something.
    fn respond(&mut self, t: &'static str) {
        let Some(snap) = self.server.snapshot_for(&self.node) else { return };
        let st = self.types.entry(t).or_default();
        if !st.requested || st.awaiting {
            return;
        }
        // go-control-plane's snapshot cache in ADS mode answers a named
        // request only when it names every resource of the snapshot (it
        // expects the client to ask again, as Envoy does for every EDS
        // cluster): so does this one.
        if !Self::wildcard(st) && snap.of(t).keys().any(|n| !st.names.contains(n)) {
            return;
        }
        let wanted: Vec<&Res> = snap.of(t).values().filter(|r| Self::wildcard(st) || st.names.contains(&r.name)).collect();
        let names: BTreeSet<String> = wanted.iter().map(|r| r.name.clone()).collect();
        let new_names = !Self::wildcard(st) && names.iter().any(|n| !st.client_names.contains(n));
        if st.client_version == snap.version && !new_names {
            return;
        }
        // An unsubscription from everything named is answered with nothing.
        if !Self::wildcard(st) && st.names.is_empty() {
            return;
        }
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        st.nonce = Some(nonce.clone());
        st.awaiting = true;
        st.client_version = snap.version.clone();
        st.client_names = names.clone();
        let resp = DiscoveryResponse {
            version_info: snap.version.clone(),
            resources: wanted.iter().map(|r| r.any.clone()).collect(),
            type_url: t.to_owned(),
            nonce: nonce.clone(),
            ..DiscoveryResponse::default()
        };
        self.server.record_sent(Sent {
            stream: self.id,
            type_url: t.to_owned(),
            version: snap.version.clone(),
            nonce,
            names: names.into_iter().collect(),
            removed: Vec::new(),
            at: std::time::Instant::now(),
        });
        let _ = self.out.try_send(Ok(resp));
    }
}

// ---- incremental ----------------------------------------------------------------------

#[derive(Default)]
struct DeltaType {
    requested: bool,
    wildcard: bool,
    names: BTreeSet<String>,
    /// What the client has: name -> version.
    client: BTreeMap<String, String>,
    /// Subscribed names the client was told do not exist.
    told_absent: BTreeSet<String>,
}

struct DeltaStream {
    server: XdsServer,
    id: u64,
    node: String,
    types: HashMap<&'static str, DeltaType>,
    nonce: u64,
    out: mpsc::Sender<Result<DeltaDiscoveryResponse, Status>>,
}

impl DeltaStream {
    fn request(&mut self, r: DeltaDiscoveryRequest) {
        if self.node.is_empty() {
            if let Some(n) = &r.node {
                self.node = n.id.clone();
            }
        }
        let features = r.node.as_ref().map(|n| n.client_features.clone()).unwrap_or_default();
        let Some(t) = type_key(&r.type_url) else { return };
        let st = self.types.entry(t).or_default();
        let kind = if let Some(e) = &r.error_detail {
            RequestKind::Nack(e.message.clone())
        } else if !r.response_nonce.is_empty() {
            RequestKind::Ack
        } else if !st.requested {
            RequestKind::Initial
        } else {
            RequestKind::Other
        };
        // An ACK or NACK that changes no subscription asks for nothing new:
        // answering it would find nothing to send (the versions the client
        // holds were recorded when the response went out; a newer snapshot
        // is pushed by the watch). As go-control-plane's delta server, it is
        // not compared with the whole snapshot again: that takes a few ms per
        // ACK at 10,000 assignments, on the core the appliance under test
        // shares with this server in the benchmarks.
        let answer = !st.requested
            || !r.resource_names_subscribe.is_empty()
            || !r.resource_names_unsubscribe.is_empty()
            || matches!(kind, RequestKind::Other);
        self.server.log(Logged {
            stream: self.id,
            delta: true,
            node: self.node.clone(),
            type_url: r.type_url.clone(),
            version_info: String::new(),
            nonce: r.response_nonce.clone(),
            names: r.resource_names_subscribe.clone(),
            unsubscribe: r.resource_names_unsubscribe.clone(),
            initial_versions: r.initial_resource_versions.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            kind,
            stale: false,
            client_features: features,
            at: std::time::Instant::now(),
        });
        if !st.requested {
            st.requested = true;
            st.client = r.initial_resource_versions.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
            if r.resource_names_subscribe.is_empty() && r.resource_names_unsubscribe.is_empty() {
                st.wildcard = true;
            }
        }
        for n in &r.resource_names_subscribe {
            if n == "*" {
                st.wildcard = true;
            } else {
                st.names.insert(n.clone());
                // Subscribing again asks for it again.
                if !r.initial_resource_versions.contains_key(n) {
                    st.client.remove(n);
                }
                st.told_absent.remove(n);
            }
        }
        for n in &r.resource_names_unsubscribe {
            if n == "*" {
                st.wildcard = false;
            } else {
                st.names.remove(n);
                st.client.remove(n);
                st.told_absent.remove(n);
            }
        }
        if answer {
            self.respond(t);
        }
    }

    fn respond(&mut self, t: &'static str) {
        let Some(snap) = self.server.snapshot_for(&self.node) else { return };
        let st = self.types.entry(t).or_default();
        if !st.requested {
            return;
        }
        let all = snap.of(t);
        let subscribed = |n: &str| st.wildcard || st.names.contains(n);
        let changed: Vec<&Res> =
            all.values().filter(|r| subscribed(&r.name) && st.client.get(&r.name) != Some(&r.version)).collect();
        let mut removed: Vec<String> = st.client.keys().filter(|n| !all.contains_key(*n) && subscribed(n)).cloned().collect();
        for n in &st.names {
            if !all.contains_key(n) && !st.client.contains_key(n) && !st.told_absent.contains(n) {
                removed.push(n.clone());
            }
        }
        removed.sort();
        removed.dedup();
        if changed.is_empty() && removed.is_empty() {
            return;
        }
        for r in &changed {
            st.client.insert(r.name.clone(), r.version.clone());
        }
        for n in &removed {
            st.client.remove(n);
            if st.names.contains(n) {
                st.told_absent.insert(n.clone());
            }
        }
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        let resp = DeltaDiscoveryResponse {
            system_version_info: snap.version.clone(),
            resources: changed
                .iter()
                .map(|r| Resource { name: r.name.clone(), version: r.version.clone(), resource: Some(r.any.clone()), ..Resource::default() })
                .collect(),
            type_url: t.to_owned(),
            removed_resources: removed.clone(),
            nonce: nonce.clone(),
            ..DeltaDiscoveryResponse::default()
        };
        self.server.record_sent(Sent {
            stream: self.id,
            type_url: t.to_owned(),
            version: snap.version.clone(),
            nonce,
            names: changed.iter().map(|r| r.name.clone()).collect(),
            removed,
            at: std::time::Instant::now(),
        });
        let _ = self.out.try_send(Ok(resp));
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Service {
    type StreamAggregatedResourcesStream = Out<DiscoveryResponse>;
    type DeltaAggregatedResourcesStream = Out<DeltaDiscoveryResponse>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let server = self.server.clone();
        let cancel = self.cancel.clone();
        let mut changed = server.changed.subscribe();
        let mut s = SotwStream { id: server.next_stream(), server, node: String::new(), types: HashMap::new(), nonce: 0, out: tx };
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => break,
                    m = inbound.message() => match m {
                        Ok(Some(r)) => s.request(r),
                        _ => break,
                    },
                    r = changed.changed() => {
                        if r.is_err() { break; }
                        for t in s.server.order() {
                            s.respond(t);
                        }
                    }
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let server = self.server.clone();
        let cancel = self.cancel.clone();
        let mut changed = server.changed.subscribe();
        let mut s = DeltaStream { id: server.next_stream(), server, node: String::new(), types: HashMap::new(), nonce: 0, out: tx };
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => break,
                    m = inbound.message() => match m {
                        Ok(Some(r)) => s.request(r),
                        _ => break,
                    },
                    r = changed.changed() => {
                        if r.is_err() { break; }
                        for t in s.server.order() {
                            s.respond(t);
                        }
                    }
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }
}

// ---- documents ------------------------------------------------------------------------

/// A YAML or JSON document as JSON (YAML read by the appliance's own
/// bounded reader).
pub fn document(text: &str) -> Result<Value, String> {
    use sluice::config::yaml::{self, Data};
    fn conv(v: &yaml::Value) -> Result<Value, String> {
        Ok(match v.data() {
            Data::Null => Value::Null,
            Data::Bool(b) => Value::Bool(*b),
            Data::Int(i) => Value::from(*i),
            Data::Number(s) => s.parse::<f64>().map(Value::from).map_err(|_| format!("{s:?} is not a number"))?,
            Data::Str(s) => Value::String(s.clone()),
            Data::Seq(items) => Value::Array(items.iter().map(conv).collect::<Result<_, _>>()?),
            Data::Map(pairs) => {
                let mut m = serde_json::Map::new();
                for (k, v) in pairs {
                    let k = match k.data() {
                        Data::Str(s) | Data::Number(s) => s.clone(),
                        Data::Int(i) => i.to_string(),
                        _ => return Err("keys must be strings".into()),
                    };
                    m.insert(k, conv(v)?);
                }
                Value::Object(m)
            }
            Data::Tagged(t, _) => return Err(format!("tag {t:?} is not supported")),
        })
    }
    let v = yaml::document(text, &mut yaml::Budget::default()).map_err(|e| match e.pos { Some(p) => format!("{}:{}: {}", p.line, p.column, e.message), None => e.message })?;
    conv(&v)
}
