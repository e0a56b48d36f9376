//! The ADS client: one `AggregatedDiscoveryService` stream, state of the
//! world or incremental, subscribed to every Cluster (wildcard) and to the
//! ClusterLoadAssignments the L4 clusters name.
//!
//! Each response is decoded and merged into what is held of both types;
//! the clusters it changes, or whose assignments it changes, are mapped
//! again ([`super::mapping::update`]; the held state and the services are
//! persistent maps, so the cost is that of the change, not of everything
//! held), and the result goes to the reconciler: the changed endpoints
//! alone when that is all that changed, otherwise the source's whole
//! desired state. A response is acknowledged only when the
//! reconciler answers that the state is served. A response that cannot be
//! decoded or mapped, or that the reconciler refuses, is NACKed with every
//! reason in `error_detail`, and what was held before stays (the
//! reconciler keeps serving it). A state identical to the one served is
//! not sent again (nothing is rebuilt), only acknowledged.
//!
//! Clusters that claim one VIP, port and protocol are held all the same
//! (their assignments subscribed to): the first by name is served, the
//! others are refused ([`mapping::update`]), and the Cluster response that
//! holds them is NACKed with a reason naming both while the rest of it is
//! served. So the outcome does not depend on the order things came in, and
//! appliances that hold the same clusters serve the same ones.
//!
//! NACKs of one version of a type are paced ([`NACK_INTERVAL`]): a server
//! that sends a refused version again at once (go-control-plane does in
//! state of the world) is not answered as fast as both can go; a reason
//! that repeats is logged once per [`NACK_LOG_INTERVAL`] and counted. ACKs
//! are never held. In delta, resources of a refused response are looked at
//! again after each later response (the server does not send them again),
//! so one refused for what else was held is taken once that is fixed.
//!
//! Conventions followed (xDS protocol; go-control-plane and
//! java-control-plane behave so):
//! - SotW: the first request of a type on a stream carries the last
//!   accepted `version_info` and no nonce; every later request echoes the
//!   latest nonce of its type; an ACK carries the response's version, a
//!   NACK the previous accepted version and `error_detail`. Clusters are
//!   a wildcard subscription (empty `resource_names`, never changed);
//!   assignments are requested by name, the list re-sent whenever the
//!   clusters change it. As Envoy, the client asks for the assignment of
//!   every EDS cluster, L4 service or not (go-control-plane's snapshot
//!   cache in ADS mode answers a named EDS request only when it names
//!   every assignment of the snapshot); only the L4 services' assignments
//!   are decoded and checked. Assignments not asked for are ignored; a
//!   response naming a resource twice is NACKed.
//! - Delta: the first request of a type carries
//!   `initial_resource_versions` (every resource held, with its version);
//!   ACK and NACK carry only the nonce (and `error_detail`);
//!   subscription changes carry `resource_names_subscribe` /
//!   `_unsubscribe` and no nonce. `removed_resources` deletes a cluster,
//!   or marks an assignment as not existing (its cluster then has no
//!   endpoints); removals of what is not held are ignored, so they may
//!   come before or after their cluster's removal.
//! - The node (`id`, `cluster`, user agent, client feature
//!   `envoy.lb.does_not_support_overprovisioning`) is sent in every
//!   request.
//!
//! Losing the server never changes what is served: nothing is sent to the
//! reconciler until a new response is accepted. The client reconnects with
//! exponential backoff and jitter ([`Backoff`]: soon after a short outage,
//! at most every 30 s in a long one), and resubscribes with what
//! it holds, so a server with the same state sends nothing new (or the
//! same state, which is acknowledged without a rebuild).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use imbl::ordmap::DiffItem;
use imbl::OrdMap;
use prost::Message;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tracing::{debug, info, warn};

use crate::config::xds::{Mode, XdsConfig};
use super::mapping::{self, Built, ClaState, L4Cluster};
use super::status::{self, ConnectionState, Nack, XdsStatus};
use super::{tls, SOURCE};
use crate::ground::micros;
use crate::model::Defaults;
use crate::sources::SourceMsg;

/// Type URL of clusters.
pub(crate) const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// Type URL of cluster load assignments.
pub(crate) const CLA_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Type URL of the `Resource` wrapper (TTL, SotW with resources wrapped).
const RESOURCE_TYPE: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// The client feature that tells the server locality overprovisioning is
/// not applied.
pub(crate) const CLIENT_FEATURES: &[&str] = &["envoy.lb.does_not_support_overprovisioning"];

/// Bound of the first reconnection delay of an outage.
pub(crate) const BACKOFF_FIRST: Duration = Duration::from_millis(250);
/// Largest reconnection delay early in an outage ([`BACKOFF_SHORT_FOR`]):
/// a server that restarts is found again within about a second.
pub(crate) const BACKOFF_SHORT_MAX: Duration = Duration::from_secs(1);
/// How long an outage counts as short.
pub(crate) const BACKOFF_SHORT_FOR: Duration = Duration::from_secs(30);
/// Largest reconnection delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// TCP keep-alive: a server that vanished without closing the connection
/// is noticed within idle + interval x retries. (Not HTTP/2 pings: gRPC
/// servers refuse pings more often than their enforcement policy allows,
/// five minutes by default in grpc-go, with GOAWAY "too_many_pings".)
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_RETRIES: u32 = 3;
/// How long an assignment is waited for before its cluster is applied
/// without endpoints (the protocol's recommended 15 s, as Envoy's
/// `initial_fetch_timeout`).
pub const WARMING_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest response accepted.
pub(crate) const MAX_MESSAGE_BYTES: usize = 64 << 20;
/// Longest `error_detail` message sent back.
const MAX_ERROR_DETAIL: usize = 16 << 10;
/// Least time between two NACKs of one version of one type: a server that
/// sends a refused version again at once (go-control-plane does) is
/// answered at this pace, not as fast as both can go. ACKs are never held.
pub(crate) const NACK_INTERVAL: Duration = Duration::from_secs(1);
/// A NACK reason that repeats the previous one of its type is logged once
/// per this interval (and counted, [`status::TypeStatus::repeated_nacks`]).
pub(crate) const NACK_LOG_INTERVAL: Duration = Duration::from_secs(30);
/// `google.rpc.Code.INVALID_ARGUMENT`.
const INVALID_ARGUMENT: i32 = 3;

/// The reconnection delays of one outage: the bound starts at
/// [`BACKOFF_FIRST`] and doubles with each failed attempt, up to
/// [`BACKOFF_SHORT_MAX`] for the first [`BACKOFF_SHORT_FOR`] of the outage
/// and [`BACKOFF_MAX`] after; each delay is drawn between half the bound
/// and the bound (jitter, so that a fleet does not reconnect in step).
#[derive(Clone, Debug, Default)]
pub(crate) struct Backoff {
    /// When the outage began (its first failure).
    since: Option<Instant>,
    /// The bound of the last delay.
    bound: Option<Duration>,
}

impl Backoff {
    /// The server answered: the outage is over.
    pub(crate) fn reset(&mut self) {
        *self = Backoff::default();
    }

    /// The delay before the next attempt after a failure at `now`, with
    /// `random` any number (uniform) for the jitter.
    pub(crate) fn next(&mut self, now: Instant, random: u64) -> Duration {
        let since = *self.since.get_or_insert(now);
        let cap = if now.saturating_duration_since(since) < BACKOFF_SHORT_FOR { BACKOFF_SHORT_MAX } else { BACKOFF_MAX };
        let bound = self.bound.map_or(BACKOFF_FIRST, |b| b.saturating_mul(2)).min(cap);
        self.bound = Some(bound);
        let half = bound / 2;
        let span = u64::try_from((bound - half).as_nanos()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_nanos(random % span)
    }
}

/// A random number (for jitter).
fn random() -> u64 {
    std::collections::hash_map::RandomState::new().build_hasher().finish()
}

/// An error and its causes, on one line.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// An accepted cluster.
#[derive(Clone, Debug, PartialEq)]
struct HeldCluster {
    /// Its L4 service, when it has the metadata (shared: an unchanged
    /// cluster is the same allocation in every state that holds it).
    l4: Option<Arc<L4Cluster>>,
    /// The assignment it names, when it is an EDS cluster (L4 or not).
    eds: Option<String>,
}

/// The clusters that name one assignment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct EdsUsers {
    /// The L4 services, in name order.
    l4: Vec<String>,
    /// How many other clusters.
    others: usize,
}

/// Every accepted resource. The maps are persistent ([`imbl`]): the state a
/// response would make is the held one plus what the response changes, in
/// the time of those changes, and the two share everything else.
#[derive(Clone, Debug, Default)]
struct Resources {
    /// Every cluster by name.
    clusters: OrdMap<String, HeldCluster>,
    /// Delta: each cluster's version.
    cluster_versions: OrdMap<String, String>,
    /// The assignments L4 clusters use, by EDS name.
    clas: OrdMap<String, ClaState>,
    /// Delta: each assignment's version (every assignment subscribed to).
    cla_versions: OrdMap<String, String>,
    /// Every assignment the clusters name (L4 or not: the subscription is
    /// Envoy's, so a server that answers an EDS request only when it names
    /// every assignment of the snapshot, go-control-plane's ADS mode,
    /// answers), with the clusters naming it.
    eds: OrdMap<String, EdsUsers>,
    /// How many clusters are L4 services.
    l4: usize,
    /// How many assignments of `clas` were received.
    known: usize,
}

/// The keys that differ between two maps (added, removed or changed), in
/// order; what the maps share is skipped without being looked at.
fn changed_keys<'a, V: PartialEq>(old: &'a OrdMap<String, V>, new: &'a OrdMap<String, V>) -> impl Iterator<Item = &'a String> + 'a {
    old.diff(new).map(|d| match d {
        DiffItem::Add(k, _) | DiffItem::Remove(k, _) => k,
        DiffItem::Update { new: (k, _), .. } => k,
    })
}

impl Resources {
    /// Adds (`add`) or takes away cluster `name` as a user of its assignment.
    fn link(&mut self, name: &str, c: &HeldCluster, add: bool) {
        let Some(eds) = &c.eds else { return };
        let mut u = self.eds.get(eds).cloned().unwrap_or_default();
        match (&c.l4, add) {
            (Some(_), true) => {
                if let Err(i) = u.l4.binary_search_by(|n| n.as_str().cmp(name)) {
                    u.l4.insert(i, name.to_owned());
                }
            }
            (Some(_), false) => u.l4.retain(|n| n != name),
            (None, true) => u.others += 1,
            (None, false) => u.others = u.others.saturating_sub(1),
        }
        if u.l4.is_empty() && u.others == 0 {
            self.eds.remove(eds);
        } else {
            self.eds.insert(eds.clone(), u);
        }
    }

    /// Holds cluster `name` as `c` (an equal cluster held already stays as
    /// it is).
    fn insert_cluster(&mut self, name: String, c: HeldCluster) {
        if let Some(old) = self.clusters.get(&name) {
            if *old == c {
                return;
            }
            let old = old.clone();
            self.l4 -= usize::from(old.l4.is_some());
            self.link(&name, &old, false);
        }
        self.l4 += usize::from(c.l4.is_some());
        self.link(&name, &c, true);
        self.clusters.insert(name, c);
    }

    /// Drops cluster `name` (nothing when it is not held).
    fn remove_cluster(&mut self, name: &str) {
        if let Some(old) = self.clusters.remove(name) {
            self.l4 -= usize::from(old.l4.is_some());
            self.link(name, &old, false);
        }
        self.cluster_versions.remove(name);
    }

    /// Holds exactly `clusters` (SotW).
    fn set_clusters(&mut self, clusters: BTreeMap<String, HeldCluster>) {
        let gone: Vec<String> = self.clusters.keys().filter(|n| !clusters.contains_key(*n)).cloned().collect();
        for n in gone {
            self.remove_cluster(&n);
        }
        for (n, c) in clusters {
            self.insert_cluster(n, c);
        }
    }

    fn set_cla(&mut self, name: String, state: ClaState) {
        self.known += usize::from(matches!(state, ClaState::Known(_)));
        if let Some(ClaState::Known(_)) = self.clas.insert(name, state) {
            self.known -= 1;
        }
    }

    /// Whether a cluster names assignment `name`.
    fn is_eds(&self, name: &str) -> bool {
        self.eds.contains_key(name)
    }

    /// Whether an L4 service names assignment `name` (then it is decoded,
    /// checked and waited for).
    fn is_l4_eds(&self, name: &str) -> bool {
        self.eds.get(name).is_some_and(|u| !u.l4.is_empty())
    }

    /// True when assignment `name` is held with its endpoints.
    fn holds_known(&self, name: &str) -> bool {
        matches!(self.clas.get(name), Some(ClaState::Known(_)))
    }

    /// The assignments whose users, state or version differ in `next` (one
    /// may come up to three times).
    fn eds_changed<'a>(&'a self, next: &'a Resources) -> impl Iterator<Item = &'a String> + 'a {
        changed_keys(&self.eds, &next.eds)
            .chain(changed_keys(&self.clas, &next.clas))
            .chain(changed_keys(&self.cla_versions, &next.cla_versions))
    }

    /// The clusters whose service may differ in `next`: the clusters that
    /// changed, and the L4 services of the assignments that changed.
    fn clusters_changed(&self, next: &Resources) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = changed_keys(&self.clusters, &next.clusters).cloned().collect();
        for k in changed_keys(&self.clas, &next.clas) {
            if let Some(u) = next.eds.get(k) {
                out.extend(u.l4.iter().cloned());
            }
        }
        out
    }

    /// Drops the assignments no cluster needs any more, of those that
    /// changed since `prev` (which needed none it did not name).
    fn prune(&mut self, prev: &Resources) {
        let (mut clas, mut versions) = (Vec::new(), Vec::new());
        for n in prev.eds_changed(self) {
            if !self.is_l4_eds(n) && self.clas.contains_key(n) {
                clas.push(n.clone());
            }
            if !self.is_eds(n) && self.cla_versions.contains_key(n) {
                versions.push(n.clone());
            }
        }
        for n in clas {
            if let Some(ClaState::Known(_)) = self.clas.remove(&n) {
                self.known -= 1;
            }
        }
        for n in versions {
            self.cla_versions.remove(&n);
        }
    }
}

/// Why a state was not applied.
enum Refused {
    /// Its problems.
    Problems(Vec<String>),
    /// The reconciler is gone (shutting down).
    Stopped,
}

/// How a session ended.
enum End {
    /// The reconciler is gone: stop.
    Stopped,
    /// The connection or stream failed.
    Failed {
        /// Why.
        error: String,
        /// Whether the server answered anything (resets the backoff).
        answered: bool,
    },
}

/// The source's state, kept across streams.
struct Client {
    cfg: XdsConfig,
    defaults: Defaults,
    tx: mpsc::Sender<SourceMsg>,
    status: watch::Sender<XdsStatus>,
    held: Resources,
    /// SotW: the last accepted `version_info` per type.
    versions: HashMap<&'static str, String>,
    /// The services served, by cluster name (the desired state the
    /// reconciler accepted last is made of them: it is not kept twice).
    applied: Built,
    /// Assignments subscribed to and not received, since when.
    waiting: BTreeMap<String, Instant>,
    /// When the response being handled arrived.
    received: Instant,
    /// From a response's arrival to its state being published, in
    /// microseconds (changes that were published only).
    to_live: Option<hdrhistogram::Histogram<u64>>,
    /// SotW: the digest of each assignment held, as the last accepted
    /// response carried it. Every response repeats every assignment; one
    /// whose bytes are those of an assignment held is not decoded again.
    sotw_clas: Digests,
    /// Per type: the last NACK reason logged.
    nack_log: HashMap<&'static str, NackLog>,
}

/// A digest of a resource's encoded bytes: two SipHash passes with fixed,
/// different keys (128 bits, the same in every run). Equal digests are
/// taken for equal bytes.
fn digest(bytes: &[u8]) -> u128 {
    let mut a = std::hash::DefaultHasher::new();
    let mut b = std::hash::DefaultHasher::new();
    a.write_u8(0);
    b.write_u8(1);
    a.write(bytes);
    b.write(bytes);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// The pace of NACKs on one stream: a NACK that refuses the same version
/// of a type as the previous NACK of that type goes [`NACK_INTERVAL`] after
/// it at the earliest; meanwhile it is held (and dropped if a newer
/// response of its type comes first: that one is answered instead).
struct Pacer<R> {
    /// Per type: the version the last NACK refused, and when it went (or goes).
    last: HashMap<&'static str, (String, Instant)>,
    /// Per type: a NACK held back, and when it may go.
    held: HashMap<&'static str, (Instant, R)>,
}

impl<R> Default for Pacer<R> {
    fn default() -> Self {
        Pacer { last: HashMap::new(), held: HashMap::new() }
    }
}

impl<R> Pacer<R> {
    /// A response of type `t` came: a NACK held for an earlier one is moot.
    fn superseded(&mut self, t: &'static str) {
        self.held.remove(t);
    }

    /// NACK `req` of version `version` of type `t`, at `now`: returned when
    /// it may go now, otherwise held.
    fn nack(&mut self, t: &'static str, version: &str, now: Instant, req: R) -> Option<R> {
        let at = match self.last.get(t) {
            Some((v, when)) if v == version => (*when + NACK_INTERVAL).max(now),
            _ => now,
        };
        self.last.insert(t, (version.to_owned(), at));
        if at <= now {
            Some(req)
        } else {
            self.held.insert(t, (at, req));
            None
        }
    }

    /// When the first held NACK may go.
    fn deadline(&self) -> Option<Instant> {
        self.held.values().map(|(at, _)| *at).min()
    }

    /// The held NACKs that may go at `now`.
    fn due(&mut self, now: Instant) -> Vec<R> {
        let due: Vec<&'static str> = self.held.iter().filter(|(_, (at, _))| *at <= now).map(|(t, _)| *t).collect();
        due.into_iter().filter_map(|t| self.held.remove(t).map(|(_, r)| r)).collect()
    }
}

/// What the log said last of the NACKs of one type.
struct NackLog {
    /// The reason logged.
    message: String,
    /// When.
    at: Instant,
    /// NACKs with that reason since, not logged.
    repeated: u64,
}

/// The resources of a delta response: name, version, resource.
type Items = Vec<(String, String, Any)>;

/// Delta resources refused on this stream. The server does not send a
/// resource again that it sent once (it counts it as held), so one refused
/// for what else was held (a cluster whose port its endpoints do not use,
/// say) is looked at again after each later response, until it is
/// accepted or a newer word on it comes.
#[derive(Default)]
struct Pending {
    /// By name: version and resource.
    resources: BTreeMap<String, (String, Any)>,
    /// Removals.
    removed: BTreeSet<String>,
    /// The system version of the last response refused.
    version: String,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.removed.is_empty()
    }

    /// A newer response says something of `names`: what was refused of
    /// them is moot.
    fn forget<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        for n in names {
            self.resources.remove(n);
            self.removed.remove(n);
        }
    }

    /// Keeps what a refused response carried.
    fn hold(&mut self, items: Items, removed: &[String], version: &str) {
        for (name, v, any) in items {
            self.removed.remove(&name);
            self.resources.insert(name, (v, any));
        }
        for n in removed {
            self.resources.remove(n);
            self.removed.insert(n.clone());
        }
        version.clone_into(&mut self.version);
    }

    /// Everything held, as one response of type `t`.
    fn response(&self, t: &'static str) -> DeltaDiscoveryResponse {
        DeltaDiscoveryResponse {
            system_version_info: self.version.clone(),
            type_url: t.into(),
            resources: self
                .resources
                .iter()
                .map(|(name, (version, any))| Resource {
                    name: name.clone(),
                    version: version.clone(),
                    resource: Some(any.clone()),
                    ..Resource::default()
                })
                .collect(),
            removed_resources: self.removed.iter().cloned().collect(),
            ..DeltaDiscoveryResponse::default()
        }
    }
}

/// Per-stream protocol state.
#[derive(Default)]
struct Stream {
    /// The latest nonce per type.
    nonces: HashMap<&'static str, String>,
    /// The assignment names subscribed on this stream (what was held of
    /// them then), once any request for assignments was sent.
    eds: Option<OrdMap<String, EdsUsers>>,
    /// Whether any response came.
    answered: bool,
}

/// Most services whose endpoints alone changed that are sent as a change
/// to endpoints; beyond, the whole state costs no more.
const MAX_ENDPOINT_CHANGES: usize = 64;

/// When `next` differs from `applied` in the endpoints of a few services
/// only (the same clusters, each mapping to the same service and route),
/// those services with their endpoints.
fn endpoint_changes(applied: &Built, next: &Built) -> Option<Vec<(String, Arc<[crate::model::EndpointDef]>)>> {
    if applied.services.is_empty() || next.changed.len() > MAX_ENDPOINT_CHANGES {
        return None;
    }
    let mut changes = Vec::with_capacity(next.changed.len());
    for name in &next.changed {
        let (Some(was), Some(now)) = (applied.services.get(name), next.services.get(name)) else {
            return None;
        };
        if was.service != now.service || was.route != now.route || was.key != now.key {
            return None;
        }
        changes.push((name.clone(), Arc::clone(&now.endpoints)));
    }
    Some(changes)
}

fn type_key(t: &str) -> Option<&'static str> {
    match t {
        CLUSTER_TYPE => Some(CLUSTER_TYPE),
        CLA_TYPE => Some(CLA_TYPE),
        _ => None,
    }
}

/// The `error_detail` of a NACK: every problem, bounded.
fn error_detail(problems: &[String]) -> RpcStatus {
    let mut message = String::new();
    for (i, p) in problems.iter().enumerate() {
        if message.len() + p.len() + 2 > MAX_ERROR_DETAIL {
            message.push_str(&format!("; and {} more", problems.len() - i));
            break;
        }
        if i > 0 {
            message.push_str("; ");
        }
        message.push_str(p);
    }
    RpcStatus { code: INVALID_ARGUMENT, message, details: Vec::new() }
}

/// Why a resource did not decode, or the server could not be reached.
/// The decoding messages are part of a NACK's `error_detail`, the others
/// of the status's last error: their text stays as it is.
#[derive(Debug, thiserror::Error)]
enum ClientError {
    /// A `Cluster` that does not decode.
    #[error("cannot decode a Cluster: {0}")]
    DecodeCluster(prost::DecodeError),
    /// A `ClusterLoadAssignment` that does not decode.
    #[error("cannot decode a ClusterLoadAssignment: {0}")]
    DecodeCla(prost::DecodeError),
    /// The section's TLS files could not be read or used.
    #[error("{0}")]
    Tls(crate::config::tls::TlsError),
    /// The server's URI is not one.
    #[error("{uri}: {why}")]
    Uri {
        /// The URI.
        uri: String,
        /// Why, with its causes.
        why: String,
    },
    /// tonic refused the TLS settings.
    #[error("TLS settings: {0}")]
    TlsSettings(String),
    /// The connection failed.
    #[error("cannot connect to {server}: {why}{hint}")]
    Connect {
        /// The server, as the configuration names it.
        server: String,
        /// Why, with its causes.
        why: String,
        /// What a TLS failure means for the operator (empty when nothing
        /// more can be said).
        hint: String,
    },
}

fn decode_cluster_any(any: &Any) -> Result<Cluster, ClientError> {
    Cluster::decode(any.value.as_slice()).map_err(ClientError::DecodeCluster)
}

fn decode_cla_any(any: &Any) -> Result<ClusterLoadAssignment, ClientError> {
    ClusterLoadAssignment::decode(any.value.as_slice()).map_err(ClientError::DecodeCla)
}

/// The SotW resources of a response, unwrapped (`Resource` wrappers with a
/// resource inside are opened; heartbeats without one are skipped). Taken
/// out of the response, not copied.
fn sotw_resources(resp: &mut DiscoveryResponse, type_url: &str) -> Result<Vec<Any>, Vec<String>> {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for (i, any) in std::mem::take(&mut resp.resources).into_iter().enumerate() {
        if any.type_url == RESOURCE_TYPE {
            match Resource::decode(any.value.as_slice()) {
                Ok(r) => match r.resource {
                    Some(inner) if inner.type_url == type_url => out.push(inner),
                    Some(inner) => errors.push(format!("resources[{i}]: a resource of type {:?} in a response of type {type_url:?}", inner.type_url)),
                    None => {}
                },
                Err(e) => errors.push(format!("resources[{i}]: cannot decode a Resource: {e}")),
            }
            continue;
        }
        if any.type_url == type_url {
            out.push(any);
        } else {
            errors.push(format!("resources[{i}]: a resource of type {:?} in a response of type {type_url:?}", any.type_url));
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// The name of each assignment held, by the digest of its bytes as the
/// last accepted SotW response carried it. The names are shared, not
/// copied: a response of 10,000 assignments makes no string for those
/// that come again as they were. (Fresh strings would outlive each
/// response, scattered among its freed buffers: they lengthen the time
/// from a SotW response to its publication and the heap the appliance
/// keeps after many changes, both shown by `xds_scale --mode sotw`.)
type Digests = HashMap<u128, Arc<str>>;

/// The assignments of a SotW response into `next` (what is held, `held`,
/// becoming what the response makes): each one decoded and checked, but
/// for one whose bytes are those of an assignment held (`known`: the
/// digests of the assignments held, as they came), which is that
/// assignment. Returns the digests of the assignments the response holds,
/// and how many it decoded.
fn sotw_assignments(held: &Resources, known: &Digests, anys: &[Any], next: &mut Resources, errors: &mut Vec<String>) -> (Digests, usize) {
    let mut seen = HashSet::with_capacity(anys.len());
    let mut kept = HashMap::with_capacity(anys.len());
    let mut decoded = 0;
    for a in anys {
        let d = digest(&a.value);
        // Held already (`next` starts as what is held), or decoded.
        let (name, fresh): (Arc<str>, _) = match known.get(&d).filter(|n| held.holds_known(n)) {
            Some(name) => (Arc::clone(name), None),
            None => {
                decoded += 1;
                match decode_cla_any(a) {
                    Ok(c) => (c.cluster_name.as_str().into(), Some(c)),
                    Err(e) => {
                        errors.push(e.to_string());
                        continue;
                    }
                }
            }
        };
        if !seen.insert(Arc::clone(&name)) {
            errors.push(format!("ClusterLoadAssignment {name:?} appears twice in the response"));
            continue;
        }
        let Some(c) = fresh else {
            kept.insert(d, name);
            continue;
        };
        if !held.is_eds(&name) {
            debug!(name = %name, "assignment not subscribed to: ignored");
            continue;
        }
        if !held.is_l4_eds(&name) {
            continue; // an assignment of a cluster that is not an L4 service
        }
        match mapping::decode_cla(&c) {
            Ok(cla) => {
                next.set_cla(name.to_string(), ClaState::Known(Arc::new(cla)));
                kept.insert(d, name);
            }
            Err(es) => errors.extend(es.into_iter().map(|e| format!("ClusterLoadAssignment {name:?}: {e}"))),
        }
    }
    (kept, decoded)
}

/// Cluster `c` (sent as `name`) as held, or `None` with its problems added
/// to `errors`. Each cluster is held as soon as it is decoded, not after
/// all of them: a decoded `Cluster` has most of Envoy's fields, and a
/// list of 10,000 of them (its pushes and the copies as it grows) would be
/// about a fifth of the time a bulk load spends on its clusters.
fn held_cluster(name: &str, c: &Cluster, errors: &mut Vec<String>) -> Option<HeldCluster> {
    match mapping::decode_cluster(c) {
        Ok(l4) => Some(HeldCluster { l4: l4.map(Arc::new), eds: mapping::eds_name(c) }),
        Err(es) => {
            errors.extend(es.into_iter().map(|e| format!("Cluster {name:?}: {e}")));
            None
        }
    }
}

impl Client {
    fn node(&self) -> Node {
        Node {
            id: self.cfg.node_id.clone(),
            cluster: self.cfg.node_cluster.clone(),
            user_agent_name: "sluice".into(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(env!("CARGO_PKG_VERSION").into())),
            client_features: CLIENT_FEATURES.iter().map(|s| (*s).to_owned()).collect(),
            ..Node::default()
        }
    }

    /// Changes the status and publishes it.
    fn status(&self, change: impl FnOnce(&mut XdsStatus)) {
        self.status.send_modify(change);
    }

    /// Publishes what is held to the status.
    fn held_to_status(&self) {
        self.status(|st| {
            st.services = self.applied.services.len();
            st.endpoints = self.applied.endpoints();
            st.warming = self.applied.warming.iter().cloned().collect();
            st.refused = self.applied.refused.keys().cloned().collect();
            st.ignored_clusters = self.held.clusters.len() - self.held.l4;
            st.types.entry(CLUSTER_TYPE.into()).or_default().resources = self.held.clusters.len();
            st.types.entry(CLA_TYPE.into()).or_default().resources = self.held.known;
        });
    }

    /// Maps `next`, has the reconciler serve it, and holds it. Only what
    /// differs from what is held is looked at.
    async fn apply(&mut self, mut next: Resources, trigger: &str) -> Result<(), Refused> {
        next.prune(&self.held);
        let t0 = Instant::now();
        let names = self.held.clusters_changed(&next);
        let cluster = |n: &str| next.clusters.get(n).and_then(|c| c.l4.as_ref());
        let mut built = mapping::update(&self.applied, &names, cluster, &next.clas, &self.defaults).map_err(Refused::Problems)?;
        if built.changed.is_empty() {
            debug!(trigger, "xDS state unchanged: nothing to rebuild");
        } else {
            let map_us = micros(t0.elapsed());
            let t1 = Instant::now();
            let (reply, answer) = oneshot::channel();
            let (source, trigger_, reply) = (SOURCE.to_owned(), trigger.to_owned(), Some(reply));
            let msg = match endpoint_changes(&self.applied, &built) {
                Some(changes) => SourceMsg::Endpoints { source, changes, trigger: trigger_, reply },
                None => SourceMsg::Desired { source, desired: built.desired(), trigger: trigger_, reply },
            };
            let desired_us = micros(t1.elapsed());
            if self.tx.send(msg).await.is_err() {
                return Err(Refused::Stopped);
            }
            match answer.await {
                Ok(Ok(())) => {}
                Ok(Err(problems)) => return Err(Refused::Problems(problems.iter().map(ToString::to_string).collect())),
                Err(_) => return Err(Refused::Stopped),
            }
            let us = micros(self.received.elapsed());
            let summary = self.to_live.as_mut().map(|h| {
                h.saturating_record(us.max(1));
                status::Latency::of(h)
            });
            self.status(|st| {
                st.last_update = Some(status::now());
                if let Some(l) = summary {
                    st.to_live = l;
                }
            });
            // Where the time from the response to the publication went:
            // received_us in all, map_us and desired_us here, the rest in
            // the reconciler (its "snapshot published" line).
            info!(
                trigger,
                services = built.services.len(),
                changed = built.changed.len(),
                mapped = built.mapped,
                warming = built.warming.len(),
                received_us = us,
                map_us,
                desired_us,
                "xDS state applied"
            );
        }
        // The assignments waited for: those the L4 services name and that
        // did not come (kept up to date for the ones that changed).
        let now = Instant::now();
        for n in self.held.eds_changed(&next) {
            if next.is_l4_eds(n) && !next.clas.contains_key(n) {
                if !self.waiting.contains_key(n) {
                    self.waiting.insert(n.clone(), now);
                }
            } else {
                self.waiting.remove(n);
            }
        }
        self.held = next;
        // Held without its list of changed names (what changed from the
        // state before it; 10,000 after a bulk load), which nothing reads
        // again: dropped here, not in the next change.
        built.changed = Vec::new();
        self.applied = built;
        self.held_to_status();
        Ok(())
    }

    fn record_ack(&self, type_url: &'static str, version: &str, nonce: &str) {
        self.status(|st| {
            let t = st.types.entry(type_url.into()).or_default();
            t.version = version.to_owned();
            t.nonce = nonce.to_owned();
            t.acks += 1;
        });
    }

    /// Records a refusal and logs it: a reason that repeats the previous
    /// one of its type is logged once per [`NACK_LOG_INTERVAL`] (with how
    /// many times it came since) and counted.
    fn record_nack(&mut self, type_url: &'static str, version: &str, nonce: &str, problems: &[String]) -> RpcStatus {
        let detail = error_detail(problems);
        let now = Instant::now();
        let repeated = match self.nack_log.get_mut(type_url) {
            Some(l) if l.message == detail.message => {
                l.repeated += 1;
                if now.duration_since(l.at) >= NACK_LOG_INTERVAL {
                    warn!(type_url, version, nonce, error = %detail.message, repeated = l.repeated, "xDS response refused (NACK) again; the last good state stays");
                    l.at = now;
                    l.repeated = 0;
                } else {
                    debug!(type_url, version, nonce, "xDS response refused (NACK) again, for the same reason");
                }
                true
            }
            _ => {
                warn!(type_url, version, nonce, error = %detail.message, "xDS response refused (NACK); the last good state stays");
                self.nack_log.insert(type_url, NackLog { message: detail.message.clone(), at: now, repeated: 0 });
                false
            }
        };
        self.status(|st| {
            let t = st.types.entry(type_url.into()).or_default();
            t.nonce = nonce.to_owned();
            t.nacks += 1;
            t.repeated_nacks += u64::from(repeated);
            st.nacks += 1;
            st.last_nack = Some(Nack {
                type_url: type_url.into(),
                version: version.into(),
                nonce: nonce.into(),
                error: detail.message.clone(),
                at: status::now(),
            });
        });
        detail
    }

    /// The clusters refused for a VIP, port and protocol another one claims,
    /// as problems of Cluster response `t`: all of them in state of the
    /// world (a response holds every cluster), those the response names
    /// (refused, or served in their place) in delta. The state is served
    /// without them all the same.
    fn refusals(&self, t: &'static str, named: Option<&BTreeSet<String>>) -> Result<(), Refused> {
        if t != CLUSTER_TYPE {
            return Ok(());
        }
        let problems: Vec<String> = self
            .applied
            .refused
            .iter()
            .filter(|(n, r)| named.is_none_or(|names| names.contains(*n) || names.contains(&r.by)))
            .map(|(_, r)| r.message.clone())
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Refused::Problems(problems))
        }
    }

    /// Assignments not received within [`WARMING_TIMEOUT`] count as absent.
    async fn expire_warming(&mut self) -> Result<(), Refused> {
        let now = Instant::now();
        let expired: Vec<String> =
            self.waiting.iter().filter(|(_, t)| now.duration_since(**t) >= WARMING_TIMEOUT).map(|(n, _)| n.clone()).collect();
        if expired.is_empty() {
            return Ok(());
        }
        for n in &expired {
            self.waiting.remove(n);
        }
        warn!(assignments = ?expired, "no ClusterLoadAssignment within {}s: their clusters are applied without endpoints", WARMING_TIMEOUT.as_secs());
        let mut next = self.held.clone();
        for n in expired {
            next.set_cla(n, ClaState::Absent);
        }
        match self.apply(next, "warming timeout").await {
            Ok(()) => Ok(()),
            Err(Refused::Problems(p)) => {
                warn!(problems = ?p, "applying clusters without endpoints after the warming timeout was refused");
                Ok(())
            }
            Err(Refused::Stopped) => Err(Refused::Stopped),
        }
    }

    fn next_warming_deadline(&self) -> Option<Instant> {
        self.waiting.values().min().map(|t| *t + WARMING_TIMEOUT)
    }

    async fn connect(&self) -> Result<Channel, ClientError> {
        let tls = match &self.cfg.tls {
            Some(paths) => Some(tls::client_config(paths, &self.cfg.server.host).map_err(ClientError::Tls)?),
            None => None,
        };
        let uri = self.cfg.server.uri(tls.is_some());
        let mut ep = Endpoint::from_shared(uri.clone())
            .map_err(|e| ClientError::Uri { why: chain(&e), uri })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .tcp_keepalive(Some(KEEPALIVE_IDLE))
            .tcp_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .tcp_keepalive_retries(Some(KEEPALIVE_RETRIES));
        if let Some(t) = tls {
            ep = ep.tls_config(t).map_err(|e| ClientError::TlsSettings(chain(&e)))?;
        }
        ep.connect().await.map_err(|e| {
            let why = chain(&e);
            let hint = tls_hint(&why, &self.cfg.server.host);
            ClientError::Connect { server: self.cfg.server.to_string(), why, hint }
        })
    }

    /// One connection and stream, until it fails or the reconciler stops.
    async fn session(&mut self, first: &mut bool) -> End {
        self.status(|st| st.state = ConnectionState::Connecting);
        let channel = match self.connect().await {
            Ok(c) => c,
            Err(error) => return End::Failed { error: error.to_string(), answered: false },
        };
        self.status(|st| {
            st.state = ConnectionState::Connected;
            st.connected_since = Some(status::now());
            if !*first {
                st.reconnects += 1;
            }
        });
        *first = false;
        // Assignments still awaited are asked for again on this stream: the
        // warming timeout counts from now, not from before the outage.
        let now = Instant::now();
        for t in self.waiting.values_mut() {
            *t = now;
        }
        info!(server = %self.cfg.server, mode = %self.cfg.mode, "connected to the xDS server");
        let client = AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        match self.cfg.mode {
            Mode::Sotw => self.sotw(client).await,
            Mode::Delta => self.delta(client).await,
        }
    }

    /// With mutual TLS, a server that refuses the client certificate
    /// closes the connection once the handshake looked done to the client.
    fn refused_hint(&self) -> &'static str {
        match &self.cfg.tls {
            Some(t) if t.client.is_some() => " (with mutual TLS this is how a server refuses a client certificate it does not trust)",
            _ => "",
        }
    }

    // ---- state of the world -------------------------------------------

    fn sotw_request(&self, type_url: &'static str, s: &Stream, names: Vec<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: self.versions.get(type_url).cloned().unwrap_or_default(),
            node: Some(self.node()),
            resource_names: names,
            type_url: type_url.into(),
            response_nonce: s.nonces.get(type_url).cloned().unwrap_or_default(),
            ..DiscoveryRequest::default()
        }
    }

    /// Sends the assignment names the clusters need, if they changed.
    async fn sotw_subscribe(&self, s: &mut Stream, out: &mpsc::Sender<DiscoveryRequest>) -> bool {
        let held = &self.held.eds;
        let same = match &s.eds {
            Some(sent) => sent.diff(held).all(|d| matches!(d, DiffItem::Update { .. })),
            None => held.is_empty(),
        };
        if same {
            return true;
        }
        let names: Vec<String> = held.keys().cloned().collect();
        debug!(names = ?names, "subscribing to assignments");
        let req = self.sotw_request(CLA_TYPE, s, names);
        s.eds = Some(held.clone());
        out.send(req).await.is_ok()
    }

    async fn sotw(&mut self, mut client: AggregatedDiscoveryServiceClient<Channel>) -> End {
        let (out, rx) = mpsc::channel::<DiscoveryRequest>(64);
        let mut s = Stream::default();
        let _ = out.send(self.sotw_request(CLUSTER_TYPE, &s, Vec::new())).await;
        self.sotw_subscribe(&mut s, &out).await;
        let requests = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let mut inbound = match client.stream_aggregated_resources(requests).await {
            Ok(r) => r.into_inner(),
            Err(e) => return End::Failed { error: format!("opening the ADS stream: {}{}", status_text(&e), self.refused_hint()), answered: false },
        };
        let mut pacer: Pacer<DiscoveryRequest> = Pacer::default();
        loop {
            let deadline = self.next_warming_deadline();
            let msg = tokio::select! {
                m = inbound.message() => m,
                () = sleep_until(deadline) => {
                    if let Err(Refused::Stopped) = self.expire_warming().await {
                        return End::Stopped;
                    }
                    continue;
                }
                () = sleep_until(pacer.deadline()) => {
                    for r in pacer.due(Instant::now()) {
                        if out.send(r).await.is_err() {
                            return End::Failed { error: "the ADS stream closed".into(), answered: true };
                        }
                    }
                    continue;
                }
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => return End::Failed { error: "the server closed the ADS stream".into(), answered: s.answered },
                Err(e) => return End::Failed { error: format!("ADS stream: {}", status_text(&e)), answered: s.answered },
            };
            s.answered = true;
            self.received = Instant::now();
            if let Err(end) = self.sotw_response(resp, &mut s, &out, &mut pacer).await {
                return end;
            }
        }
    }

    /// Handles SotW response `resp`: applies it, answers it (an ACK, or a
    /// NACK paced by `pacer`) and sends the assignment names it leads to.
    /// `Err` is how the session ends.
    async fn sotw_response(
        &mut self,
        mut resp: DiscoveryResponse,
        s: &mut Stream,
        out: &mpsc::Sender<DiscoveryRequest>,
        pacer: &mut Pacer<DiscoveryRequest>,
    ) -> Result<(), End> {
        let Some(t) = type_key(&resp.type_url) else {
            let nonce = resp.nonce.clone();
            warn!(type_url = %resp.type_url, "response of a type not subscribed to");
            let req = DiscoveryRequest {
                node: Some(self.node()),
                type_url: resp.type_url.clone(),
                response_nonce: nonce,
                error_detail: Some(error_detail(&[format!("Sluice does not subscribe to {}", resp.type_url)])),
                ..DiscoveryRequest::default()
            };
            if out.send(req).await.is_err() {
                return Err(End::Failed { error: "the ADS stream closed".into(), answered: true });
            }
            return Ok(());
        };
        s.nonces.insert(t, resp.nonce.clone());
        pacer.superseded(t);
        let trigger = format!("xDS {} version {:?}", short(t), resp.version_info);
        let outcome = match self.sotw_next(t, &mut resp) {
            Ok((next, digests)) => {
                let applied = self.apply(next, &trigger).await;
                if let (Ok(()), Some(mut d)) = (&applied, digests) {
                    // Of the assignments held now (a pruned one is gone).
                    d.retain(|_, n| self.held.holds_known(n));
                    self.sotw_clas = d;
                }
                applied.and_then(|()| self.refusals(t, None))
            }
            Err(p) => Err(Refused::Problems(p)),
        };
        let reply = self.sotw_reply(t, &resp, s, outcome, pacer)?;
        let sent = match reply {
            Some(r) => out.send(r).await.is_ok(),
            None => true,
        };
        if !sent || !self.sotw_subscribe(s, out).await {
            return Err(End::Failed { error: "the ADS stream closed".into(), answered: true });
        }
        Ok(())
    }

    /// The answer to SotW response `resp` of type `t` given `outcome`,
    /// recorded: an ACK with its version, or a NACK with the previous
    /// accepted version and every problem (`None` while `pacer` holds it
    /// back). `Err` when the reconciler is gone.
    fn sotw_reply(
        &mut self,
        t: &'static str,
        resp: &DiscoveryResponse,
        s: &Stream,
        outcome: Result<(), Refused>,
        pacer: &mut Pacer<DiscoveryRequest>,
    ) -> Result<Option<DiscoveryRequest>, End> {
        Ok(match outcome {
            Ok(()) => {
                self.versions.insert(t, resp.version_info.clone());
                self.record_ack(t, &resp.version_info, &resp.nonce);
                let names = if t == CLA_TYPE { s.eds.iter().flat_map(|e| e.keys().cloned()).collect() } else { Vec::new() };
                Some(self.sotw_request(t, s, names))
            }
            Err(Refused::Stopped) => return Err(End::Stopped),
            Err(Refused::Problems(p)) => {
                let previous = self.versions.get(t).cloned().unwrap_or_default();
                let detail = self.record_nack(t, &resp.version_info, &resp.nonce, &p);
                let names = if t == CLA_TYPE { s.eds.iter().flat_map(|e| e.keys().cloned()).collect() } else { Vec::new() };
                let nack = DiscoveryRequest { version_info: previous, error_detail: Some(detail), ..self.sotw_request(t, s, names) };
                pacer.nack(t, &resp.version_info, Instant::now(), nack)
            }
        })
    }

    /// What would be held after SotW response `resp` of type `t`, and for
    /// assignments the digest of each one it holds (to keep once applied).
    #[allow(clippy::type_complexity)]
    fn sotw_next(&self, t: &'static str, resp: &mut DiscoveryResponse) -> Result<(Resources, Option<Digests>), Vec<String>> {
        let anys = sotw_resources(resp, t)?;
        let mut errors = Vec::new();
        let mut next = self.held.clone();
        let mut digests = None;
        if t == CLUSTER_TYPE {
            let mut held = BTreeMap::new();
            for a in &anys {
                match decode_cluster_any(a) {
                    Ok(c) if held.contains_key(&c.name) => errors.push(format!("Cluster {:?} appears twice in the response", c.name)),
                    Ok(c) => {
                        if let Some(h) = held_cluster(&c.name, &c, &mut errors) {
                            held.insert(c.name, h);
                        }
                    }
                    Err(e) => errors.push(e.to_string()),
                }
            }
            next.set_clusters(held);
        } else {
            let (kept, _) = sotw_assignments(&self.held, &self.sotw_clas, &anys, &mut next, &mut errors);
            digests = Some(kept);
        }
        if errors.is_empty() {
            Ok((next, digests))
        } else {
            Err(errors)
        }
    }

    // ---- incremental ---------------------------------------------------

    fn delta_request(&self, type_url: &'static str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest { node: Some(self.node()), type_url: type_url.into(), ..DeltaDiscoveryRequest::default() }
    }

    /// Subscribes to the assignment names the clusters now need and
    /// unsubscribes from the others.
    async fn delta_subscribe(&self, s: &mut Stream, out: &mpsc::Sender<DeltaDiscoveryRequest>) -> bool {
        let held = &self.held.eds;
        let (mut subscribe, mut unsubscribe) = (Vec::new(), Vec::new());
        for d in s.eds.clone().unwrap_or_default().diff(held) {
            match d {
                DiffItem::Add(k, _) => subscribe.push(k.clone()),
                DiffItem::Remove(k, _) => unsubscribe.push(k.clone()),
                DiffItem::Update { .. } => {}
            }
        }
        s.eds = Some(held.clone());
        if subscribe.is_empty() && unsubscribe.is_empty() {
            return true;
        }
        let req = DeltaDiscoveryRequest {
            resource_names_subscribe: subscribe,
            resource_names_unsubscribe: unsubscribe,
            ..self.delta_request(CLA_TYPE)
        };
        debug!(subscribe = ?req.resource_names_subscribe, unsubscribe = ?req.resource_names_unsubscribe, "assignment subscriptions");
        out.send(req).await.is_ok()
    }

    /// Subscribes to the assignments that clusters `next` name and that are
    /// not subscribed to yet, before `next` is applied: the server prepares
    /// them while this appliance maps the clusters. Unsubscribing waits for
    /// the outcome ([`Client::delta_subscribe`]), which also takes these
    /// back if `next` is refused.
    async fn subscribe_ahead(&self, next: &Resources, s: &mut Stream, out: &mpsc::Sender<DeltaDiscoveryRequest>) -> bool {
        let mut subscribed = s.eds.clone().unwrap_or_default();
        let mut subscribe = Vec::new();
        for (k, users) in &next.eds {
            if !subscribed.contains_key(k) {
                subscribed.insert(k.clone(), users.clone());
                subscribe.push(k.clone());
            }
        }
        if subscribe.is_empty() {
            return true;
        }
        s.eds = Some(subscribed);
        debug!(subscribe = ?subscribe, "assignment subscriptions ahead of the clusters");
        out.send(DeltaDiscoveryRequest { resource_names_subscribe: subscribe, ..self.delta_request(CLA_TYPE) }).await.is_ok()
    }

    /// The first requests of a delta stream, queued before it opens: every
    /// cluster (wildcard) with the versions held, then, when clusters name
    /// any, their assignments with the versions held.
    async fn delta_first(&self, s: &mut Stream, out: &mpsc::Sender<DeltaDiscoveryRequest>) {
        let first = DeltaDiscoveryRequest {
            initial_resource_versions: self.held.cluster_versions.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            ..self.delta_request(CLUSTER_TYPE)
        };
        let _ = out.send(first).await;
        if !self.held.eds.is_empty() {
            let req = DeltaDiscoveryRequest {
                resource_names_subscribe: self.held.eds.keys().cloned().collect(),
                initial_resource_versions: self
                    .held
                    .cla_versions
                    .iter()
                    .filter(|(k, _)| self.held.is_eds(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                ..self.delta_request(CLA_TYPE)
            };
            let _ = out.send(req).await;
            s.eds = Some(self.held.eds.clone());
        }
    }

    async fn delta(&mut self, mut client: AggregatedDiscoveryServiceClient<Channel>) -> End {
        let (out, rx) = mpsc::channel::<DeltaDiscoveryRequest>(64);
        let mut s = Stream::default();
        self.delta_first(&mut s, &out).await;
        let requests = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
        let mut inbound = match client.delta_aggregated_resources(requests).await {
            Ok(r) => r.into_inner(),
            Err(e) => return End::Failed { error: format!("opening the delta ADS stream: {}{}", status_text(&e), self.refused_hint()), answered: false },
        };
        let mut pacer: Pacer<DeltaDiscoveryRequest> = Pacer::default();
        let mut pending: BTreeMap<&'static str, Pending> = BTreeMap::new();
        loop {
            let deadline = self.next_warming_deadline();
            let msg = tokio::select! {
                m = inbound.message() => m,
                () = sleep_until(deadline) => {
                    if let Err(Refused::Stopped) = self.expire_warming().await {
                        return End::Stopped;
                    }
                    continue;
                }
                () = sleep_until(pacer.deadline()) => {
                    for r in pacer.due(Instant::now()) {
                        if out.send(r).await.is_err() {
                            return End::Failed { error: "the delta ADS stream closed".into(), answered: true };
                        }
                    }
                    continue;
                }
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => return End::Failed { error: "the server closed the delta ADS stream".into(), answered: s.answered },
                Err(e) => return End::Failed { error: format!("delta ADS stream: {}", status_text(&e)), answered: s.answered },
            };
            s.answered = true;
            self.received = Instant::now();
            if let Err(end) = self.delta_response(resp, &mut s, &out, &mut pacer, &mut pending).await {
                return end;
            }
        }
    }

    /// Handles delta response `resp`: applies it, answers it (an ACK, or a
    /// NACK paced by `pacer`), looks again at what was refused before
    /// (`pending`) and sends the subscriptions it all leads to. `Err` is
    /// how the session ends.
    async fn delta_response(
        &mut self,
        mut resp: DeltaDiscoveryResponse,
        s: &mut Stream,
        out: &mpsc::Sender<DeltaDiscoveryRequest>,
        pacer: &mut Pacer<DeltaDiscoveryRequest>,
        pending: &mut BTreeMap<&'static str, Pending>,
    ) -> Result<(), End> {
        let Some(t) = type_key(&resp.type_url) else {
            warn!(type_url = %resp.type_url, "response of a type not subscribed to");
            let req = DeltaDiscoveryRequest {
                node: Some(self.node()),
                type_url: resp.type_url.clone(),
                response_nonce: resp.nonce.clone(),
                error_detail: Some(error_detail(&[format!("Sluice does not subscribe to {}", resp.type_url)])),
                ..DeltaDiscoveryRequest::default()
            };
            if out.send(req).await.is_err() {
                return Err(End::Failed { error: "the delta ADS stream closed".into(), answered: true });
            }
            return Ok(());
        };
        s.nonces.insert(t, resp.nonce.clone());
        pacer.superseded(t);
        let outcome = self.delta_apply(t, &mut resp, s, out, pending).await?;
        let reply = self.delta_reply(t, &resp, outcome, pacer)?;
        let sent = match reply {
            Some(r) => out.send(r).await.is_ok(),
            None => true,
        };
        if !sent {
            return Err(End::Failed { error: "the delta ADS stream closed".into(), answered: true });
        }
        if let Err(Refused::Stopped) = self.look_again(pending, s).await {
            return Err(End::Stopped);
        }
        if !self.delta_subscribe(s, out).await {
            return Err(End::Failed { error: "the delta ADS stream closed".into(), answered: true });
        }
        Ok(())
    }

    /// Applies delta response `resp` of type `t`, once the assignments its
    /// clusters name are subscribed to ahead. What was refused of its
    /// resources before is moot; what it carries is kept in `pending` when
    /// it is refused for its problems. The outcome, or `Err` (the end of
    /// the session) when the stream closed.
    async fn delta_apply(
        &mut self,
        t: &'static str,
        resp: &mut DeltaDiscoveryResponse,
        s: &mut Stream,
        out: &mpsc::Sender<DeltaDiscoveryRequest>,
        pending: &mut BTreeMap<&'static str, Pending>,
    ) -> Result<Result<(), Refused>, End> {
        let trigger = format!("xDS delta {} {:?}", short(t), resp.system_version_info);
        let named: BTreeSet<String> =
            if t == CLUSTER_TYPE { resp.resources.iter().map(|r| r.name.clone()).collect() } else { BTreeSet::new() };
        if let Some(p) = pending.get_mut(t) {
            p.forget(resp.resources.iter().map(|r| &r.name).chain(&resp.removed_resources));
        }
        let (outcome, refused) = match self.delta_next(t, resp, s) {
            Ok((next, items)) => {
                if t == CLUSTER_TYPE && !self.subscribe_ahead(&next, s, out).await {
                    return Err(End::Failed { error: "the delta ADS stream closed".into(), answered: true });
                }
                match self.apply(next, &trigger).await {
                    Ok(()) => (self.refusals(t, Some(&named)), None),
                    Err(e) => (Err(e), Some(items)),
                }
            }
            Err((p, items)) => (Err(Refused::Problems(p)), Some(items)),
        };
        if let (Err(Refused::Problems(_)), Some(items)) = (&outcome, refused) {
            pending.entry(t).or_default().hold(items, &resp.removed_resources, &resp.system_version_info);
        }
        Ok(outcome)
    }

    /// The answer to delta response `resp` of type `t` given `outcome`,
    /// recorded: an ACK, or a NACK with every problem (`None` while `pacer`
    /// holds it back). `Err` when the reconciler is gone.
    fn delta_reply(
        &mut self,
        t: &'static str,
        resp: &DeltaDiscoveryResponse,
        outcome: Result<(), Refused>,
        pacer: &mut Pacer<DeltaDiscoveryRequest>,
    ) -> Result<Option<DeltaDiscoveryRequest>, End> {
        Ok(match outcome {
            Ok(()) => {
                self.versions.insert(t, resp.system_version_info.clone());
                self.record_ack(t, &resp.system_version_info, &resp.nonce);
                Some(DeltaDiscoveryRequest { response_nonce: resp.nonce.clone(), ..self.delta_request(t) })
            }
            Err(Refused::Stopped) => return Err(End::Stopped),
            Err(Refused::Problems(p)) => {
                let detail = self.record_nack(t, &resp.system_version_info, &resp.nonce, &p);
                let nack = DeltaDiscoveryRequest { response_nonce: resp.nonce.clone(), error_detail: Some(detail), ..self.delta_request(t) };
                pacer.nack(t, &resp.system_version_info, Instant::now(), nack)
            }
        })
    }

    /// Looks again at the delta resources refused on this stream (clusters
    /// first, then assignments): what the state now held lets through is
    /// applied (it was NACKed already: nothing is sent to the server but
    /// the subscriptions it leads to, afterwards). What was refused of a
    /// type is taken or refused together, as the responses were.
    async fn look_again(&mut self, pending: &mut BTreeMap<&'static str, Pending>, s: &Stream) -> Result<(), Refused> {
        for t in [CLUSTER_TYPE, CLA_TYPE] {
            let Some(p) = pending.get_mut(t).filter(|p| !p.is_empty()) else { continue };
            let mut r = p.response(t);
            let trigger = format!("xDS delta {} {:?}, refused before, looked at again", short(t), r.system_version_info);
            let what: Vec<String> = r.resources.iter().map(|x| x.name.clone()).chain(r.removed_resources.iter().cloned()).collect();
            let next = match self.delta_next(t, &mut r, s) {
                Ok((next, _)) => next,
                Err((why, _)) => {
                    debug!(type_url = t, resources = ?what, ?why, "xDS resources refused before are still refused");
                    continue;
                }
            };
            // (Not subscribed to ahead: a set refused again would churn the
            // subscriptions with every response.)
            match self.apply(next, &trigger).await {
                Ok(()) => {
                    info!(type_url = t, resources = ?what, "xDS resources refused before are accepted now");
                    pending.remove(t);
                }
                Err(Refused::Stopped) => return Err(Refused::Stopped),
                Err(Refused::Problems(why)) => debug!(type_url = t, resources = ?what, ?why, "xDS resources refused before are still refused"),
            }
        }
        Ok(())
    }

    /// What would be held after delta response `resp` of type `t` (its
    /// resources are taken out of it, not copied).
    fn delta_next(&self, t: &'static str, resp: &mut DeltaDiscoveryResponse, s: &Stream) -> Result<(Resources, Items), (Vec<String>, Items)> {
        let mut errors = Vec::new();
        let mut next = self.held.clone();
        let resources = std::mem::take(&mut resp.resources);
        let mut seen: HashSet<&str> = HashSet::with_capacity(resources.len());
        let repeated: Vec<bool> = resources.iter().map(|r| !seen.insert(&r.name)).collect();
        let mut items: Vec<(String, String, Any)> = Vec::with_capacity(resources.len());
        for (i, (r, repeated)) in resources.into_iter().zip(repeated).enumerate() {
            if repeated {
                errors.push(format!("{} {:?} appears twice in the response", short(t), r.name));
                continue;
            }
            match r.resource {
                Some(any) if any.type_url == t => items.push((r.name, r.version, any)),
                Some(any) => errors.push(format!("resources[{i}] ({:?}): a resource of type {:?} in a response of type {t:?}", r.name, any.type_url)),
                None => {} // a TTL heartbeat
            }
        }
        if t == CLUSTER_TYPE {
            // (Names are distinct: repeated ones are refused above.)
            for (name, version, any) in &items {
                match decode_cluster_any(any) {
                    Ok(c) if c.name == *name || c.name.is_empty() => {
                        if let Some(h) = held_cluster(name, &c, &mut errors) {
                            next.cluster_versions.insert(name.clone(), version.clone());
                            next.insert_cluster(name.clone(), h);
                        }
                    }
                    Ok(c) => errors.push(format!("Cluster {:?} is sent under the name {name:?}", c.name)),
                    Err(e) => errors.push(format!("{name:?}: {e}")),
                }
            }
            for name in &resp.removed_resources {
                next.remove_cluster(name);
            }
        } else {
            for (name, version, any) in &items {
                if !s.eds.as_ref().is_some_and(|e| e.contains_key(name)) {
                    debug!(%name, "assignment not subscribed to: ignored");
                    continue;
                }
                if !self.held.is_l4_eds(name) {
                    // An assignment of a cluster that is not an L4 service:
                    // held by version only (for initial_resource_versions).
                    next.cla_versions.insert(name.clone(), version.clone());
                    continue;
                }
                match decode_cla_any(any) {
                    Ok(c) if c.cluster_name == *name || c.cluster_name.is_empty() => match mapping::decode_cla(&c) {
                        Ok(cla) => {
                            next.set_cla(name.clone(), ClaState::Known(Arc::new(cla)));
                            next.cla_versions.insert(name.clone(), version.clone());
                        }
                        Err(es) => errors.extend(es.into_iter().map(|e| format!("ClusterLoadAssignment {name:?}: {e}"))),
                    },
                    Ok(c) => errors.push(format!("ClusterLoadAssignment {:?} is sent under the name {name:?}", c.cluster_name)),
                    Err(e) => errors.push(format!("{name:?}: {e}")),
                }
            }
            for name in &resp.removed_resources {
                if self.held.is_l4_eds(name) {
                    next.set_cla(name.clone(), ClaState::Absent);
                }
                next.cla_versions.remove(name);
            }
        }
        if errors.is_empty() {
            Ok((next, items))
        } else {
            Err((errors, items))
        }
    }
}

/// What a rustls verification error means for the operator.
fn tls_hint(why: &str, host: &str) -> String {
    if why.contains("UnknownIssuer") {
        " (the server's certificate is not signed by the CA of ca-cert-path)".into()
    } else if why.contains("NotValidForName") {
        format!(" (the server's certificate is not valid for {host:?}, the host of server-address)")
    } else if why.contains("Expired") || why.contains("NotValidYet") {
        " (the server's certificate is outside its validity period)".into()
    } else {
        String::new()
    }
}

fn short(t: &str) -> &'static str {
    if t == CLUSTER_TYPE {
        "Cluster"
    } else {
        "ClusterLoadAssignment"
    }
}

fn status_text(s: &tonic::Status) -> String {
    use std::error::Error;
    let mut out = format!("{:?}: {}", s.code(), s.message());
    let mut cur = s.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = c.source();
    }
    out
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Runs the source until `cancel` (see [`super::run`]).
pub async fn run(
    cfg: XdsConfig,
    defaults: Defaults,
    tx: mpsc::Sender<SourceMsg>,
    status: watch::Sender<XdsStatus>,
    cancel: CancellationToken,
) {
    status.send_modify(|st| {
        st.server = cfg.server.to_string();
        st.mode = cfg.mode;
        st.node_id = cfg.node_id.clone();
        st.transport = match &cfg.tls {
            None => "plaintext".into(),
            Some(t) if t.client.is_some() => "mutual TLS".into(),
            Some(_) => "TLS".into(),
        };
        st.state = ConnectionState::Connecting;
    });
    let mut c = Client {
        cfg,
        defaults,
        tx,
        status,
        held: Resources::default(),
        versions: HashMap::new(),
        applied: Built::default(),
        waiting: BTreeMap::new(),
        received: Instant::now(),
        // Up to an hour, three significant digits (valid bounds: never None).
        to_live: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).ok(),
        sotw_clas: HashMap::new(),
        nack_log: HashMap::new(),
    };
    let mut backoff = Backoff::default();
    let mut first = true;
    loop {
        let end = tokio::select! {
            () = cancel.cancelled() => break,
            e = c.session(&mut first) => e,
        };
        match end {
            End::Stopped => break,
            End::Failed { error, answered } => {
                if answered {
                    backoff.reset();
                }
                let delay = backoff.next(Instant::now(), random());
                warn!(server = %c.cfg.server, %error, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "xDS server unreachable; serving the last good state");
                c.status(|st| {
                    st.state = ConnectionState::Backoff;
                    st.connected_since = None;
                    st.last_error = Some(error);
                    st.last_error_at = Some(status::now());
                });
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    c.status(|st| {
        st.state = ConnectionState::Stopped;
        st.connected_since = None;
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::xds::mapping::{Cla, EndpointsFrom};

    fn held(name: &str, eds: &str, l4: bool) -> HeldCluster {
        let c = L4Cluster {
            name: name.into(),
            endpoints: EndpointsFrom::Eds(eds.into()),
            vip: sluice_dataplane::addr::Addr::from(std::net::Ipv4Addr::new(10, 0, 0, 1)),
            port: 80,
            protocol: 6,
            algorithm: None,
            table_size: None,
            limit: None,
            flow_table: None,
            delivery: None,
            check: None,
        };
        HeldCluster { l4: l4.then(|| Arc::new(c)), eds: Some(eds.into()) }
    }

    /// An outage of five minutes, each attempt refused at once: the first
    /// retry within 250 ms, the bound doubling, every delay at most 1 s for
    /// the first 30 s and at most 30 s after (reached by doubling, not at a
    /// jump); the server answering starts the next outage afresh. The clock
    /// is the test's.
    #[test]
    fn reconnection_delays_through_an_outage() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut random = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let t0 = Instant::now();
        for outage in 0..2 {
            let mut b = Backoff::default();
            let start = t0 + Duration::from_secs(1000 * outage);
            let mut t = start;
            let mut delays: Vec<(Duration, Duration)> = Vec::new();
            while t - start < Duration::from_secs(300) {
                let d = b.next(t, random());
                delays.push((t - start, d));
                t += d + Duration::from_millis(1);
            }
            assert!(delays[0].1 <= Duration::from_millis(250), "first retry: {:?}", delays[0]);
            assert!(delays[1].1 <= Duration::from_millis(500) && delays[2].1 <= Duration::from_secs(1), "{delays:?}");
            for w in delays.windows(2) {
                let ((_, a), (at, d)) = (w[0], w[1]);
                assert!(d <= a * 4, "doubling (with jitter): {a:?} then {d:?}");
                if at < BACKOFF_SHORT_FOR {
                    assert!(d <= Duration::from_secs(1), "{d:?} at {at:?}");
                } else {
                    assert!(d <= BACKOFF_MAX, "{d:?} at {at:?}");
                }
            }
            assert!(delays.iter().filter(|(at, _)| *at < BACKOFF_SHORT_FOR).count() >= 30, "about a second apart at most: {delays:?}");
            assert!(delays.iter().any(|(_, d)| *d >= Duration::from_secs(15)), "the long cap is reached: {delays:?}");
            // The jitter spreads the delays.
            let early: BTreeSet<Duration> = delays.iter().filter(|(at, _)| *at < BACKOFF_SHORT_FOR).map(|(_, d)| *d).collect();
            assert!(early.len() > 10, "{early:?}");
            b.reset();
            assert!(b.next(t, random()) <= Duration::from_millis(250), "after the server answered");
        }
    }

    /// A NACK of the version the previous NACK refused waits until a second
    /// after it; another version, or a response that supersedes the held
    /// NACK, does not wait.
    #[test]
    fn nacks_of_one_version_are_paced() {
        let t0 = Instant::now();
        let mut p: Pacer<u32> = Pacer::default();
        assert_eq!(p.nack(CLUSTER_TYPE, "v1", t0, 1), Some(1));
        let t1 = t0 + Duration::from_millis(3);
        assert_eq!(p.nack(CLUSTER_TYPE, "v1", t1, 2), None, "held");
        assert_eq!(p.deadline(), Some(t0 + NACK_INTERVAL));
        assert!(p.due(t0 + Duration::from_millis(999)).is_empty());
        assert_eq!(p.due(t0 + NACK_INTERVAL), [2]);
        assert_eq!(p.deadline(), None);
        // The next one of v1 a second after that one.
        let t2 = t0 + NACK_INTERVAL + Duration::from_millis(5);
        assert_eq!(p.nack(CLUSTER_TYPE, "v1", t2, 3), None);
        assert_eq!(p.deadline(), Some(t0 + NACK_INTERVAL * 2));
        // A newer response of the type: the held NACK is dropped.
        p.superseded(CLUSTER_TYPE);
        assert_eq!(p.deadline(), None);
        // Another version, or another type: at once.
        assert_eq!(p.nack(CLUSTER_TYPE, "v2", t2, 4), Some(4));
        assert_eq!(p.nack(CLA_TYPE, "v2", t2, 5), Some(5));
    }

    /// SotW repeats every assignment in every response: one that comes
    /// again as it was held is not decoded again, and the state is the one
    /// decoding everything gives; one no longer held is decoded.
    #[test]
    fn a_sotw_assignment_that_comes_again_as_it_was_is_not_decoded_again() {
        use crate::sources::xds::mapping::tests::{cla, healthy};
        use prost::Message;
        let any = |name: &str, addr: &str| Any { type_url: CLA_TYPE.into(), value: cla(name, &[healthy(addr)]).encode_to_vec() };
        let mut held = Resources::default();
        for i in 0..3 {
            held.insert_cluster(format!("c{i}"), self::held(&format!("c{i}"), &format!("e{i}"), true));
        }
        let first = [any("e0", "10.0.0.1"), any("e1", "10.0.0.2"), any("e2", "10.0.0.3")];
        let (mut next, mut errors) = (held.clone(), Vec::new());
        let (known, decoded) = sotw_assignments(&held, &HashMap::new(), &first, &mut next, &mut errors);
        assert_eq!((decoded, known.len()), (3, 3));
        assert!(errors.is_empty(), "{errors:?}");
        let held = next;
        let second = [any("e0", "10.0.0.1"), any("e1", "10.0.0.9"), any("e2", "10.0.0.3")];
        let mut next = held.clone();
        let (again, decoded) = sotw_assignments(&held, &known, &second, &mut next, &mut errors);
        assert_eq!(decoded, 1, "only the changed one");
        let mut all = held.clone();
        let (every, decoded) = sotw_assignments(&held, &HashMap::new(), &second, &mut all, &mut errors);
        assert_eq!(decoded, 3);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(again, every, "the same digests");
        assert!(next.clas.len() == 3 && next.clas.iter().all(|(k, v)| all.clas.get(k) == Some(v)), "the same assignments");
        // Twice in one response, as it was held: refused as before.
        let twice = [any("e0", "10.0.0.1"), any("e0", "10.0.0.1")];
        sotw_assignments(&held, &known, &twice, &mut held.clone(), &mut errors);
        assert_eq!(errors, ["ClusterLoadAssignment \"e0\" appears twice in the response"]);
        // No longer held as known: decoded.
        let mut gone = held.clone();
        gone.set_cla("e0".into(), ClaState::Absent);
        let (_, decoded) = sotw_assignments(&gone, &known, &first[..1], &mut gone.clone(), &mut Vec::new());
        assert_eq!(decoded, 1);
    }

    /// The index of who names which assignment, the counts and the pruning
    /// are kept up to date from the changes alone: after random changes
    /// they are what a pass over every cluster gives.
    #[test]
    fn what_is_held_is_kept_as_a_pass_over_everything_would_make_it() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut r = Resources::default();
        for step in 0..2000 {
            let prev = r.clone();
            let mut seen = BTreeSet::new();
            for _ in 0..1 + next() % 4 {
                let (n, e) = (format!("c{}", next() % 10), format!("e{}", next() % 6));
                if !seen.insert(n.clone()) {
                    continue;
                }
                match next() % 6 {
                    0 => r.remove_cluster(&n),
                    1 | 2 => {
                        r.insert_cluster(n.clone(), held(&n, &e, next() % 3 != 0));
                        r.cluster_versions.insert(n, format!("v{step}"));
                    }
                    3 => r.set_cla(e.clone(), ClaState::Absent),
                    4 => r.set_cla(e.clone(), ClaState::Known(Arc::new(Cla::default()))),
                    _ => {
                        r.cla_versions.insert(e, format!("v{step}"));
                    }
                }
            }
            r.prune(&prev);
            // A pass over everything.
            let mut eds: BTreeMap<String, EdsUsers> = BTreeMap::new();
            for (n, c) in &r.clusters {
                let u = eds.entry(c.eds.clone().unwrap_or_default()).or_default();
                if c.l4.is_some() {
                    u.l4.push(n.clone());
                } else {
                    u.others += 1;
                }
            }
            assert_eq!(r.eds.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<BTreeMap<_, _>>(), eds, "step {step}");
            assert_eq!(r.l4, r.clusters.values().filter(|c| c.l4.is_some()).count(), "step {step}");
            assert_eq!(r.known, r.clas.values().filter(|c| matches!(c, ClaState::Known(_))).count(), "step {step}");
            assert!(r.clas.keys().all(|k| eds.get(k).is_some_and(|u| !u.l4.is_empty())), "step {step}: an assignment no L4 service names is held");
            assert!(r.cla_versions.keys().all(|k| eds.contains_key(k)), "step {step}: a version of an assignment nobody names is held");
            assert!(r.cluster_versions.keys().all(|k| r.clusters.contains_key(k)), "step {step}");
        }
        assert!(!r.clusters.is_empty() && !r.clas.is_empty(), "the walk ends with something held");
    }
}
