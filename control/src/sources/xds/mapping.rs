//! From Envoy `Cluster` and `ClusterLoadAssignment` resources to the
//! model's services, routes and endpoints (the Cilium CFP "xDS-controlled
//! standalone L4 load balancer").
//!
//! # Clusters
//!
//! A `Cluster` whose `metadata.filter_metadata` has the key
//! [`METADATA_KEY`] (`io.cilium.l4lb`) is an L4 service; every other
//! cluster is ignored (not refused: the server may serve Envoy proxies
//! too). The struct under the key:
//!
//! | key | value | |
//! |---|---|---|
//! | `vip` | one IPv4 or IPv6 address (`10.1.2.3`, `2001:db8::1`, or with `/32`, `/128`) | required |
//! | `port` | 1-65535 | required |
//! | `protocol` | `TCP`, `UDP` or `SCTP` (any case) | required |
//! | `endpointLimit` | identifiers are `0..endpointLimit` (1-65536) | default `defaults.endpointLimit` |
//! | `flowTable` | `true`/`false`: remember flows | default `defaults.flowTable` |
//! | `delivery` | `l2` or `ipip` | default `defaults.delivery` |
//!
//! Any other key is refused (a typo must not pass silently). The service
//! is named after the cluster (Envoy names such as
//! `outbound|80||web.default` are accepted); it gets one route, named
//! after the cluster too, matching the VIP, the destination port and the
//! protocol.
//!
//! Natively from the cluster: `lb_policy` `MAGLEV` or `RANDOM` (or the
//! same policies through `load_balancing_policy`'s typed extensions
//! `envoy.extensions.load_balancing_policies.maglev.v3.Maglev` /
//! `random.v3.Random`) choose the service's algorithm; any other policy,
//! or none, takes the appliance default. `maglev_lb_config.table_size`
//! (or the Maglev extension's `table_size`) is the lookup-table size: a
//! prime, at most [`limits::TABLE_SIZE_MAX`].
//!
//! Endpoints come from EDS for a cluster of type `EDS` (the
//! `ClusterLoadAssignment` named by `eds_cluster_config.service_name`, or
//! by the cluster's name when that is empty), or from the cluster's own
//! `load_assignment` for a `STATIC` cluster. DNS and original-destination
//! clusters are refused.
//!
//! # Endpoints
//!
//! Each `lb_endpoints[]` entry is a socket address with an IP address (no
//! host names, no named ports). Its port must be the service's port, or 0:
//! Sluice forwards without address or port translation. Its
//! `load_balancing_weight` is the endpoint's weight (default 1); its
//! identifier is chosen by [`super::identity`] over *all* the assignment's
//! endpoints, whatever their health and priority, so that health changes
//! and fail-over never move an identifier. An endpoint's metadata may give
//! it explicitly: `filter_metadata["io.cilium.l4lb"].id`.
//!
//! Health and priority decide which endpoints take new flows:
//! - `HEALTHY` and `UNKNOWN` endpoints are *serving*; only the serving
//!   endpoints of the lowest priority that has any take new flows (priority
//!   N+1 is used only when N has no serving endpoint). Serving endpoints of
//!   other priorities are left out.
//! - `DEGRADED` endpoints are a last resort: they take new flows only when
//!   no priority has a serving endpoint, and then only those of the lowest
//!   priority that has degraded ones (Envoy too sends traffic to degraded
//!   hosts only when healthy ones are lacking).
//! - `DRAINING` endpoints, at any priority, are kept as draining: no new
//!   flows, established ones continue.
//! - `UNHEALTHY` and `TIMEOUT` endpoints are left out.
//!
//! Locality weights, overprovisioning and drop overloads are not used
//! (the client says so to the server with the client feature
//! `envoy.lb.does_not_support_overprovisioning`).
//!
//! # Warming
//!
//! As Envoy warms clusters, an EDS cluster is applied once its assignment
//! has arrived; until then a new cluster is left out and a changed one
//! keeps its previous definition. An assignment the server says does not
//! exist (a delta removal), or that has not arrived [`super::client`]'s
//! warming timeout after the subscription, counts as an empty one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType, LbConfig, LbPolicy};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::address;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Metadata};
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::extensions::load_balancing_policies::maglev::v3::Maglev;
use envoy_types::pb::envoy::extensions::load_balancing_policies::random::v3::Random;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use imbl::{OrdMap, OrdSet};
use prost::{Message, Name};
use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::{PortRange, RouteMatch};
use sluice_dataplane::maglev::{is_prime, next_prime};
use sluice_dataplane::parse::proto;
use sluice_dataplane::service::Algorithm;

use super::identity::{self, Key};
use crate::config::fields::mapped_v4;
use crate::model::{limits, valid_name, CheckDef, Defaults, DeliveryMode, Desired, EndpointDef, Endpoints, Origin, Probe, RouteDef, ServiceDef};

/// The metadata key that marks an L4 service (clusters) or carries an
/// endpoint's identifier (endpoints).
pub(crate) const METADATA_KEY: &str = "io.cilium.l4lb";
/// `Origin.file` of everything this source defines.
pub(crate) const ORIGIN: &str = "xds";

/// The keys of a cluster's [`METADATA_KEY`] struct.
pub(crate) const CLUSTER_KEYS: &[&str] = &["vip", "port", "protocol", "endpointLimit", "flowTable", "delivery"];
/// The keys of an endpoint's [`METADATA_KEY`] struct.
pub(crate) const ENDPOINT_KEYS: &[&str] = &["id"];

/// Where a cluster's endpoints come from.
#[derive(Clone, Debug, PartialEq)]
pub enum EndpointsFrom {
    /// The `ClusterLoadAssignment` of this name, over EDS.
    Eds(String),
    /// The cluster's own `load_assignment`.
    Inline(Cla),
}

/// An L4 service, as a cluster describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct L4Cluster {
    /// Cluster (and service) name.
    pub name: String,
    /// Its endpoints' source.
    pub endpoints: EndpointsFrom,
    /// The VIP.
    pub vip: Addr,
    /// Destination port.
    pub port: u16,
    /// Transport protocol number.
    pub protocol: u8,
    /// From `lb_policy`.
    pub algorithm: Option<Algorithm>,
    /// From the Maglev settings.
    pub table_size: Option<u32>,
    /// `endpointLimit`.
    pub limit: Option<u32>,
    /// `flowTable`.
    pub flow_table: Option<bool>,
    /// `delivery`.
    pub delivery: Option<DeliveryMode>,
    /// From `health_checks`.
    pub check: Option<CheckDef>,
}

impl L4Cluster {
    /// The EDS resource name it needs, if any.
    #[cfg(test)]
    pub(crate) fn eds_name(&self) -> Option<&str> {
        match &self.endpoints {
            EndpointsFrom::Eds(n) => Some(n),
            EndpointsFrom::Inline(_) => None,
        }
    }
}

/// An endpoint's health, as far as new flows are concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// `HEALTHY` or `UNKNOWN`.
    Serving,
    /// `DEGRADED`: a last resort.
    Degraded,
    /// `DRAINING`: established flows only.
    Draining,
    /// `UNHEALTHY` or `TIMEOUT`: left out.
    Out,
}

/// One endpoint of an assignment.
#[derive(Clone, Debug, PartialEq)]
pub struct LbEndpoint {
    /// Its address.
    pub address: Addr,
    /// Its port (0 when not given).
    pub port: u32,
    /// Weight.
    pub weight: u32,
    /// Health.
    pub health: Health,
    /// Its locality's priority.
    pub priority: u32,
    /// An identifier from its metadata.
    pub id: Option<u32>,
    /// Where it is in the assignment: (i, j) of
    /// `endpoints[i].lb_endpoints[j]` (written out only for a message).
    pub at: (u32, u32),
}

impl LbEndpoint {
    /// `endpoints[i].lb_endpoints[j]`.
    pub(crate) fn path(&self) -> EndpointPath {
        EndpointPath(self.at)
    }
}

/// `endpoints[i].lb_endpoints[j]`, as a message shows it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EndpointPath(pub (u32, u32));

impl std::fmt::Display for EndpointPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "endpoints[{}].lb_endpoints[{}]", self.0 .0, self.0 .1)
    }
}

/// A `ClusterLoadAssignment`, checked.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Cla {
    /// Every endpoint of every locality.
    pub endpoints: Vec<LbEndpoint>,
}

/// What is known of an EDS resource.
#[derive(Clone, Debug, PartialEq)]
pub enum ClaState {
    /// Received (shared: an assignment that did not change is the same
    /// allocation from one state to the next, and its service is not
    /// mapped again).
    Known(Arc<Cla>),
    /// The server said it does not exist, or it did not come in time: no
    /// endpoints.
    Absent,
}

/// One service as this source defines it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MappedService {
    /// The service.
    pub(crate) service: ServiceDef,
    /// Its route.
    pub(crate) route: RouteDef,
    /// Its endpoints, by identifier: the run the model and the resolved
    /// model share.
    pub endpoints: Arc<[EndpointDef]>,
    /// The VIP, port and protocol the route matches.
    pub(crate) key: (Addr, u16, u8),
}

/// A mapped service and what it was mapped from: the cluster, its
/// assignment (none when inline or absent) and the defaults. A later state
/// whose cluster and assignment are the same allocations, under the same
/// defaults, reuses it without mapping again, so a change to one cluster
/// costs one mapping, not one per cluster.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The service.
    pub(crate) mapped: Arc<MappedService>,
    cluster: Arc<L4Cluster>,
    cla: Option<Arc<Cla>>,
    defaults: Defaults,
}

impl Applied {
    /// True when mapping `cluster` with `cla` under `defaults` again would
    /// give this service: the inputs are the ones it was mapped from.
    fn mapped_from(&self, cluster: &Arc<L4Cluster>, cla: Option<&Arc<Cla>>, defaults: &Defaults) -> bool {
        let same_cla = match (&self.cla, cla) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        same_cla && Arc::ptr_eq(&self.cluster, cluster) && self.defaults == *defaults
    }
}

/// Two applied services are equal when they define the same service,
/// whatever they were mapped from.
impl PartialEq for Applied {
    fn eq(&self, other: &Self) -> bool {
        self.mapped == other.mapped
    }
}

impl Eq for Applied {}

impl std::ops::Deref for Applied {
    type Target = MappedService;
    fn deref(&self) -> &MappedService {
        &self.mapped
    }
}

/// The services of a state, and the clusters still warming. Its maps are
/// persistent ([`imbl`]): a state made from the previous one by
/// [`update`] shares everything that did not change with it, so a change
/// to one cluster costs that cluster, not one step per cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Built {
    /// By name.
    pub services: OrdMap<String, Applied>,
    /// Clusters waiting for their assignment.
    pub(crate) warming: OrdSet<String>,
    /// How many services were mapped anew (the others were reused).
    pub mapped: usize,
    /// The services that differ from the previous state (added, removed or
    /// changed), in name order.
    pub changed: Vec<String>,
    /// Every L4 cluster held (warm, warming or refused) by the VIP, port
    /// and protocol it claims: the first by name is the one served.
    claims: OrdMap<(Addr, u16, u8), OrdSet<String>>,
    /// The claim of each L4 cluster held.
    claimed: OrdMap<String, (Addr, u16, u8)>,
    /// The service served on each VIP, port and protocol (a warming cluster
    /// that moved serves its previous one until it is warm).
    owners: OrdMap<(Addr, u16, u8), String>,
    /// The clusters refused because another one, first by name, claims
    /// their VIP, port and protocol.
    pub(crate) refused: OrdMap<String, Refusal>,
    /// Endpoints of every service.
    endpoints: usize,
}

impl Built {
    /// The desired state: everything in name order.
    pub fn desired(&self) -> Desired {
        let mut d = Desired::default();
        d.services.reserve(self.services.len());
        d.routes.reserve(self.services.len());
        let mut runs = Vec::with_capacity(self.services.len());
        for s in self.services.values() {
            d.services.push(s.service.clone());
            d.routes.push(s.route.clone());
            runs.push(Arc::clone(&s.endpoints));
        }
        // Each service's endpoints as the run this mapping holds (shared).
        d.endpoints = Endpoints::from_runs(runs);
        d
    }

    /// How many endpoints the services have in all.
    pub(crate) fn endpoints(&self) -> usize {
        self.endpoints
    }
}

/// Why a cluster is not served although it maps: another cluster, first
/// by name, claims its VIP, port and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The cluster served in its place.
    pub(crate) by: String,
    /// The message (it names both).
    pub(crate) message: String,
}

/// Why a value of a cluster or of an endpoint is refused. Each message is
/// part of what the NACK's `error_detail` says (after the resource and the
/// field that carries the value), so its text stays as it is.
#[derive(Debug, thiserror::Error)]
pub(crate) enum MappingError {
    /// A metadata number that is not a whole number.
    #[error("{key}: {value} is not a whole number in {lo}..={hi}")]
    NotWhole {
        /// The metadata key.
        key: String,
        /// The number given.
        value: f64,
        /// The least accepted.
        lo: u64,
        /// The largest accepted.
        hi: u64,
    },
    /// A metadata string that is not a whole number.
    #[error("{key}: {value:?} is not a whole number in {lo}..={hi}")]
    NotWholeText {
        /// The metadata key.
        key: String,
        /// The string given.
        value: String,
        /// The least accepted.
        lo: u64,
        /// The largest accepted.
        hi: u64,
    },
    /// A metadata value that should be a number.
    #[error("{key}: expected a number, found {found}")]
    NotNumber {
        /// The metadata key.
        key: String,
        /// What kind of value came.
        found: &'static str,
    },
    /// A whole number outside its range.
    #[error("{key}: {value} is out of range {lo}..={hi}")]
    OutOfRange {
        /// The metadata key.
        key: String,
        /// The number given.
        value: u64,
        /// The least accepted.
        lo: u64,
        /// The largest accepted.
        hi: u64,
    },
    /// A metadata value that should be a string.
    #[error("{key}: expected a string, found {found}")]
    NotString {
        /// The metadata key.
        key: String,
        /// What kind of value came.
        found: &'static str,
    },
    /// A metadata value that should be true or false.
    #[error("{key}: expected true or false, found {found}")]
    NotBool {
        /// The metadata key.
        key: String,
        /// What kind of value came.
        found: &'static str,
    },
    /// A VIP written as an IPv4-mapped IPv6 address (the message says so).
    #[error("vip: {0}")]
    VipMappedV4(String),
    /// A VIP that is not an IP address.
    #[error("vip: {0:?} is not an IP address")]
    VipNotAddress(String),
    /// A VIP with a prefix length that makes it more than one address.
    #[error("vip: {0:?} is not a single address (a VIP is one address, or a /32 or /128)")]
    VipNotSingle(String),
    /// A protocol other than TCP, UDP and SCTP.
    #[error("protocol: unknown protocol {0:?} (expected TCP, UDP or SCTP)")]
    UnknownProtocol(String),
    /// A delivery mode that is not one.
    #[error("delivery: {0}")]
    Delivery(<DeliveryMode as std::str::FromStr>::Err),
    /// A metadata key that is not known (the message, with a close one if any).
    #[error("{0}")]
    UnknownKey(String),
    /// A Maglev table size above [`limits::TABLE_SIZE_MAX`].
    #[error("Maglev table size {0} is above the largest, {max}", max = limits::TABLE_SIZE_MAX)]
    TableTooLarge(u64),
    /// A Maglev table size that is not a prime.
    #[error("Maglev table size {size} is not a prime (the next prime is {next})")]
    TableNotPrime {
        /// The size given.
        size: u32,
        /// The next prime above it.
        next: u32,
    },
    /// A Maglev load-balancing policy extension that does not decode.
    #[error("load_balancing_policy: Maglev: {0}")]
    MaglevPolicy(prost::DecodeError),
    /// An endpoint given by name.
    #[error("named endpoint {0:?} is not supported")]
    NamedEndpoint(String),
    /// An `lb_endpoints[]` entry without an endpoint.
    #[error("no endpoint")]
    NoEndpoint,
    /// An endpoint on a pipe.
    #[error("a pipe is not an endpoint address")]
    Pipe,
    /// An endpoint on an Envoy internal address.
    #[error("an Envoy internal address is not an endpoint address")]
    InternalAddress,
    /// An endpoint without an address.
    #[error("no address")]
    NoAddress,
    /// An endpoint address written as an IPv4-mapped IPv6 address (the
    /// message says so).
    #[error("{0}")]
    MappedV4(String),
    /// An endpoint address that is not an IP address.
    #[error("{0:?} is not an IP address (host names are not resolved)")]
    NotAddress(String),
    /// An endpoint port above 65535.
    #[error("port {0} is out of range 0..=65535")]
    PortOutOfRange(u32),
    /// An endpoint port given by name.
    #[error("named port {0:?} is not supported")]
    NamedPort(String),
    /// An endpoint weight above [`limits::WEIGHT_MAX`].
    #[error("load_balancing_weight {0} is above the largest, {max}", max = limits::WEIGHT_MAX)]
    WeightTooLarge(u32),
    /// A `health_status` this version of the protocol does not have.
    #[error("unknown health_status {0}")]
    UnknownHealth(i32),
    /// The problems of an endpoint's [`METADATA_KEY`] struct.
    #[error("{}", .0.join("; "))]
    EndpointMetadata(Vec<String>),
}

/// A `google.protobuf.Value`'s kind, for messages.
fn kind(v: &Value) -> &'static str {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => "null",
        Some(Kind::NumberValue(_)) => "a number",
        Some(Kind::StringValue(_)) => "a string",
        Some(Kind::BoolValue(_)) => "a boolean",
        Some(Kind::StructValue(_)) => "a struct",
        Some(Kind::ListValue(_)) => "a list",
    }
}

/// A whole number within `lo..=hi`, written as a number or a string of digits.
fn int(v: &Value, key: &str, lo: u64, hi: u64) -> Result<u64, MappingError> {
    let n = match &v.kind {
        Some(Kind::NumberValue(f)) if f.fract() == 0.0 && *f >= 0.0 && *f <= 9.007_199_254_740_992e15 => {
            // Whole and below 2^53: exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = *f as u64;
            n
        }
        Some(Kind::NumberValue(f)) => return Err(MappingError::NotWhole { key: key.to_owned(), value: *f, lo, hi }),
        Some(Kind::StringValue(s)) => {
            s.trim().parse::<u64>().map_err(|_| MappingError::NotWholeText { key: key.to_owned(), value: s.clone(), lo, hi })?
        }
        _ => return Err(MappingError::NotNumber { key: key.to_owned(), found: kind(v) }),
    };
    if !(lo..=hi).contains(&n) {
        return Err(MappingError::OutOfRange { key: key.to_owned(), value: n, lo, hi });
    }
    Ok(n)
}

fn string<'a>(v: &'a Value, key: &str) -> Result<&'a str, MappingError> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Ok(s),
        _ => Err(MappingError::NotString { key: key.to_owned(), found: kind(v) }),
    }
}

fn boolean(v: &Value, key: &str) -> Result<bool, MappingError> {
    match &v.kind {
        Some(Kind::BoolValue(b)) => Ok(*b),
        Some(Kind::StringValue(s)) if s == "true" || s == "false" => Ok(s == "true"),
        _ => Err(MappingError::NotBool { key: key.to_owned(), found: kind(v) }),
    }
}

/// The VIP: one address, optionally as a /32 or /128.
pub(crate) fn vip(s: &str) -> Result<Addr, MappingError> {
    let s = s.trim();
    if let Some(why) = mapped_v4(s) {
        return Err(MappingError::VipMappedV4(why));
    }
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: Addr = a.parse().map_err(|_| MappingError::VipNotAddress(s.to_owned()))?;
    match len {
        None => Ok(addr),
        Some(l) if l == if addr.is_v4() { "32" } else { "128" } => Ok(addr),
        Some(_) => Err(MappingError::VipNotSingle(s.to_owned())),
    }
}

fn protocol(s: &str) -> Result<u8, MappingError> {
    match s.trim().to_ascii_uppercase().as_str() {
        "TCP" => Ok(proto::TCP),
        "UDP" => Ok(proto::UDP),
        "SCTP" => Ok(proto::SCTP),
        _ => Err(MappingError::UnknownProtocol(s.to_owned())),
    }
}

/// `key` is not one of `known`: the message, with a close one if any.
fn unknown_key(key: &str, known: &[&str]) -> String {
    match known.iter().find(|k| k.eq_ignore_ascii_case(key) || edit1(k, key)) {
        Some(k) => format!("unknown key {key:?} (did you mean {k:?}?)"),
        None => format!("unknown key {key:?} (known: {})", known.join(", ")),
    }
}

/// One insertion, deletion or substitution apart.
fn edit1(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let (short, long) = if a.len() <= b.len() { (&a, &b) } else { (&b, &a) };
    match long.len() - short.len() {
        0 => short.iter().zip(long.iter()).filter(|(x, y)| x != y).count() <= 1,
        1 => (0..long.len()).any(|skip| {
            long.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, c)| c).eq(short.iter())
        }),
        _ => false,
    }
}

/// The struct under [`METADATA_KEY`], if any.
fn l4_metadata<'a>(m: Option<&'a Metadata>, errors: &mut Vec<String>) -> Option<&'a Struct> {
    let m = m?;
    if m.typed_filter_metadata.contains_key(METADATA_KEY) && !m.filter_metadata.contains_key(METADATA_KEY) {
        errors.push(format!("{METADATA_KEY} is in typed_filter_metadata: write it in filter_metadata (a plain struct)"));
    }
    m.filter_metadata.get(METADATA_KEY)
}

/// The values of a cluster's [`METADATA_KEY`] struct, each `None` when
/// absent or refused.
#[derive(Debug, Default)]
struct ClusterKeys {
    /// `vip`.
    vip: Option<Addr>,
    /// `port`.
    port: Option<u16>,
    /// `protocol`, as its number.
    protocol: Option<u8>,
    /// `endpointLimit`.
    limit: Option<u32>,
    /// `flowTable`.
    flow_table: Option<bool>,
    /// `delivery`.
    delivery: Option<DeliveryMode>,
}

/// The values of the cluster's [`METADATA_KEY`] struct `md`, key by key in
/// name order (so that its problems come in the same order on every
/// appliance); the problems of each key, then the required keys missing,
/// are added to `errors`.
fn cluster_keys(md: &Struct, errors: &mut Vec<String>) -> ClusterKeys {
    let mut out = ClusterKeys::default();
    let mut keys: Vec<&String> = md.fields.keys().collect();
    keys.sort();
    for k in keys {
        let v = &md.fields[k];
        let r: Result<(), MappingError> = match k.as_str() {
            "vip" => string(v, k).and_then(vip).map(|a| out.vip = Some(a)),
            "port" => int(v, k, 1, 65535).map(|p| out.port = u16::try_from(p).ok()),
            "protocol" => string(v, k).and_then(protocol).map(|p| out.protocol = Some(p)),
            "endpointLimit" => int(v, k, u64::from(limits::ENDPOINT_LIMIT_MIN), u64::from(limits::ENDPOINT_LIMIT_MAX))
                .map(|l| out.limit = u32::try_from(l).ok()),
            "flowTable" => boolean(v, k).map(|b| out.flow_table = Some(b)),
            "delivery" => string(v, k).and_then(|s| s.parse::<DeliveryMode>().map_err(MappingError::Delivery)).map(|d| out.delivery = Some(d)),
            other => Err(MappingError::UnknownKey(unknown_key(other, CLUSTER_KEYS))),
        };
        if let Err(e) = r {
            errors.push(format!("{METADATA_KEY}.{e}"));
        }
    }
    for (key, missing) in [("vip", out.vip.is_none()), ("port", out.port.is_none()), ("protocol", out.protocol.is_none())] {
        if missing && !md.fields.contains_key(key) {
            errors.push(format!("{METADATA_KEY}: missing key {key:?}"));
        }
    }
    out
}

/// The cluster as an L4 service; `Ok(None)` when it is not one.
pub(crate) fn decode_cluster(c: &Cluster) -> Result<Option<L4Cluster>, Vec<String>> {
    let mut errors = Vec::new();
    let Some(md) = l4_metadata(c.metadata.as_ref(), &mut errors) else {
        return if errors.is_empty() { Ok(None) } else { Err(errors) };
    };
    let keys = cluster_keys(md, &mut errors);
    if !valid_name(&c.name) {
        errors.push(format!(
            "{:?} is not a usable service name (printable ASCII without spaces or quotes, 1 to {} characters)",
            c.name,
            limits::NAME_MAX_LEN
        ));
    }
    let (algorithm, table_size) = match lb_policy(c) {
        Ok(x) => x,
        Err(e) => {
            errors.push(e.to_string());
            (None, None)
        }
    };
    let endpoints = cluster_endpoints(c, &mut errors);
    let check = match (keys.port, keys.protocol) {
        (Some(port), Some(protocol)) => health_check(c, port, protocol, &mut errors),
        _ => None,
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    match (keys.vip, keys.port, keys.protocol, endpoints) {
        (Some(vip), Some(port), Some(protocol), Some(endpoints)) => Ok(Some(L4Cluster {
            name: c.name.clone(),
            endpoints,
            vip,
            port,
            protocol,
            algorithm,
            table_size,
            limit: keys.limit,
            flow_table: keys.flow_table,
            delivery: keys.delivery,
            check,
        })),
        _ => Err(vec!["incomplete io.cilium.l4lb metadata".into()]),
    }
}

/// The active check of L4 cluster `c` (`health_checks`, at most one), on
/// the service's port: `http_health_check` (path, `host`, else the
/// endpoint's address, `expected_statuses`, else 200 as in Envoy), over TLS
/// where the cluster's transport socket is TLS ([`tls`]);
/// `tcp_health_check` without payloads, a connection; `custom_health_check`
/// named [`DNS_CHECKER`], a DNS query (for the name a `StringValue` config
/// holds, else `.`); on a UDP service,
/// `tcp_health_check`'s `send` and `receive` are a UDP datagram and the
/// bytes its answer must hold (Envoy has no UDP checker). `interval`,
/// `timeout` (at most the interval), `healthy_threshold` (rise) and
/// `unhealthy_threshold` (fall) as given, else Sluice's defaults; bounded
/// as the file's. Several `receive` payloads are one block of bytes, in
/// that order; Envoy's jitter and other intervals are not read.
fn health_check(c: &Cluster, port: u16, protocol: u8, errors: &mut Vec<String>) -> Option<CheckDef> {
    let h = match c.health_checks.as_slice() {
        [] => return None,
        [h] => h,
        _ => {
            errors.push("health_checks: Sluice runs one active check per service; this cluster has several".into());
            return None;
        }
    };
    let probe = probe_of(h, tls(c, h), protocol, errors)?;
    let mut check = CheckDef::new(probe, port);
    let ms = |d: &envoy_types::pb::google::protobuf::Duration| u32::try_from(d.seconds.saturating_mul(1000).saturating_add(i64::from(d.nanos / 1_000_000))).unwrap_or(u32::MAX);
    check.interval_ms = h.interval.as_ref().map_or(check.interval_ms, ms);
    // A timeout longer than the interval (Envoy allows it) is cut to it.
    check.timeout_ms = h.timeout.as_ref().map_or(check.timeout_ms, ms).min(check.interval_ms);
    check.rise = h.healthy_threshold.map_or(check.rise, |v| v.value);
    check.fall = h.unhealthy_threshold.map_or(check.fall, |v| v.value);
    let problems = check.problems();
    if problems.is_empty() {
        Some(check)
    } else {
        errors.extend(problems.into_iter().map(|p| format!("health_checks: {p}")));
        None
    }
}

/// The name of the custom health checker that is a DNS query (Envoy has
/// none of its own).
pub(crate) const DNS_CHECKER: &str = "sluice.health_checkers.dns";

/// Whether check `h` of cluster `c` runs over TLS. Envoy's checks use the
/// cluster's transport socket; with `transport_socket_match_criteria`, that
/// of the first of the cluster's `transport_socket_matches` whose `match`
/// fields the criteria all hold, else the cluster's. A socket is TLS when it
/// is named `envoy.transport_sockets.tls` or its config is an
/// `UpstreamTlsContext`.
fn tls(c: &Cluster, h: &envoy_types::pb::envoy::config::core::v3::HealthCheck) -> bool {
    use envoy_types::pb::envoy::config::core::v3::transport_socket::ConfigType;
    let matched = h.transport_socket_match_criteria.as_ref().and_then(|criteria| {
        c.transport_socket_matches
            .iter()
            .find(|m| m.r#match.as_ref().is_none_or(|m| m.fields.iter().all(|(k, v)| criteria.fields.get(k) == Some(v))))
            .map(|m| m.transport_socket.as_ref())
    });
    matched.unwrap_or(c.transport_socket.as_ref()).is_some_and(|t| {
        t.name == "envoy.transport_sockets.tls"
            || matches!(&t.config_type, Some(ConfigType::TypedConfig(any)) if any.type_url.ends_with("/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"))
    })
}

/// The probe of health check `h` (HTTP over TLS if `tls`) on a service of
/// `protocol`.
fn probe_of(h: &envoy_types::pb::envoy::config::core::v3::HealthCheck, tls: bool, protocol: u8, errors: &mut Vec<String>) -> Option<Probe> {
    use envoy_types::pb::envoy::config::core::v3::health_check::custom_health_check::ConfigType;
    use envoy_types::pb::envoy::config::core::v3::health_check::HealthChecker;
    use envoy_types::pb::google::protobuf::StringValue;
    let bytes = payload_bytes;
    let probe = match &h.health_checker {
        Some(HealthChecker::HttpHealthCheck(_)) if protocol == proto::UDP => {
            errors.push("health_checks: an HTTP check of a UDP service (use a TCP check with payloads: a UDP datagram and its answer)".into());
            return None;
        }
        Some(HealthChecker::HttpHealthCheck(x)) => {
            let mut statuses = Vec::new();
            for r in &x.expected_statuses {
                match (u16::try_from(r.start), r.end.checked_sub(1).map(u16::try_from)) {
                    (Ok(lo), Some(Ok(hi))) if r.end > r.start => statuses.push((lo, hi)),
                    _ => errors.push(format!("health_checks: expected status range [{}, {}) is empty or out of range", r.start, r.end)),
                }
            }
            if statuses.is_empty() {
                statuses.push((200, 200));
            }
            let path = if x.path.is_empty() { "/".to_owned() } else { x.path.clone() };
            Probe::Http { path, host: (!x.host.is_empty()).then(|| x.host.clone()), statuses, tls }
        }
        Some(HealthChecker::TcpHealthCheck(x)) if protocol == proto::UDP => {
            let send = match x.send.as_ref().map(bytes).transpose() {
                Ok(s) => s.unwrap_or_default(),
                Err(e) => {
                    errors.push(e);
                    return None;
                }
            };
            let mut expect = Vec::new();
            for r in &x.receive {
                match bytes(r) {
                    Ok(b) => expect.extend(b),
                    Err(e) => errors.push(e),
                }
            }
            Probe::Udp { send, expect }
        }
        Some(HealthChecker::TcpHealthCheck(x)) if x.send.is_none() && x.receive.is_empty() => Probe::Tcp,
        Some(HealthChecker::TcpHealthCheck(_)) => {
            errors.push("health_checks: a TCP check with payloads is not supported (a connection is the check)".into());
            return None;
        }
        Some(HealthChecker::GrpcHealthCheck(_)) => {
            errors.push("health_checks: gRPC checks are not supported (use an HTTP or TCP check)".into());
            return None;
        }
        Some(HealthChecker::CustomHealthCheck(x)) if x.name == DNS_CHECKER => match &x.config_type {
            None => Probe::Dns { name: ".".to_owned() },
            Some(ConfigType::TypedConfig(any)) if any.type_url == StringValue::type_url() => match StringValue::decode(any.value.as_slice()) {
                Ok(v) if v.value.is_empty() => Probe::Dns { name: ".".to_owned() },
                Ok(v) => Probe::Dns { name: v.value },
                Err(e) => {
                    errors.push(format!("health_checks: {DNS_CHECKER}'s config does not decode: {e}"));
                    return None;
                }
            },
            Some(ConfigType::TypedConfig(any)) => {
                errors.push(format!("health_checks: {DNS_CHECKER}'s config is a {}, where a google.protobuf.StringValue (the name to query) is expected", any.type_url));
                return None;
            }
        },
        Some(HealthChecker::CustomHealthCheck(x)) => {
            errors.push(format!("health_checks: custom check {:?} is not supported (use an HTTP or TCP check, or {DNS_CHECKER:?})", x.name));
            return None;
        }
        None => {
            errors.push("health_checks: no health_checker".into());
            return None;
        }
    };
    Some(probe)
}

/// A payload's bytes (`text` is hex).
fn payload_bytes(p: &envoy_types::pb::envoy::config::core::v3::health_check::Payload) -> Result<Vec<u8>, String> {
    use envoy_types::pb::envoy::config::core::v3::health_check::payload;
    match &p.payload {
        Some(payload::Payload::Binary(b)) => Ok(b.clone()),
        Some(payload::Payload::Text(t)) => {
            let t = t.trim();
            if t.len() % 2 != 0 || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("health_checks: payload {t:?} is not hex"));
            }
            Ok((0..t.len()).step_by(2).filter_map(|i| u8::from_str_radix(&t[i..i + 2], 16).ok()).collect())
        }
        None => Ok(Vec::new()),
    }
}

/// Where the endpoints of L4 cluster `c` come from, by its type: EDS, or
/// its own assignment when it is static. `None`, with the problem added to
/// `errors`, for a type an L4 service cannot have or an inline assignment
/// that is refused.
fn cluster_endpoints(c: &Cluster, errors: &mut Vec<String>) -> Option<EndpointsFrom> {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32 => eds_name(c).map(EndpointsFrom::Eds),
        None | Some(ClusterDiscoveryType::Type(0)) => match c.load_assignment.as_ref().map(decode_cla).transpose() {
            Ok(cla) => Some(EndpointsFrom::Inline(cla.unwrap_or_default())),
            Err(es) => {
                errors.extend(es.into_iter().map(|e| format!("load_assignment.{e}")));
                None
            }
        },
        Some(ClusterDiscoveryType::Type(t)) => {
            let name = DiscoveryType::try_from(t).map(|d| d.as_str_name().to_owned()).unwrap_or_else(|_| t.to_string());
            errors.push(format!("cluster type {name} is not supported for an L4 service: use EDS or STATIC"));
            None
        }
        Some(ClusterDiscoveryType::ClusterType(ref ct)) => {
            errors.push(format!("custom cluster type {:?} is not supported for an L4 service: use EDS or STATIC", ct.name));
            None
        }
    }
}

fn table_size(n: u64) -> Result<u32, MappingError> {
    let Some(m) = u32::try_from(n).ok().filter(|m| *m <= limits::TABLE_SIZE_MAX) else {
        return Err(MappingError::TableTooLarge(n));
    };
    if !is_prime(m) {
        return Err(MappingError::TableNotPrime { size: m, next: next_prime(m) });
    }
    Ok(m)
}

/// The algorithm and table size the cluster asks for.
fn lb_policy(c: &Cluster) -> Result<(Option<Algorithm>, Option<u32>), MappingError> {
    let legacy_size = match &c.lb_config {
        Some(LbConfig::MaglevLbConfig(m)) => m.table_size.map(|t| table_size(t.value)).transpose()?,
        _ => None,
    };
    if let Some(policy) = &c.load_balancing_policy {
        for p in &policy.policies {
            let Some(any) = p.typed_extension_config.as_ref().and_then(|t| t.typed_config.as_ref()) else { continue };
            if any.type_url == Maglev::type_url() {
                let m = Maglev::decode(any.value.as_slice()).map_err(MappingError::MaglevPolicy)?;
                let size = m.table_size.map(|t| table_size(t.value)).transpose()?;
                return Ok((Some(Algorithm::Maglev), size.or(legacy_size)));
            }
            if any.type_url == Random::type_url() {
                return Ok((Some(Algorithm::Random), None));
            }
        }
    }
    Ok(match LbPolicy::try_from(c.lb_policy) {
        Ok(LbPolicy::Maglev) => (Some(Algorithm::Maglev), legacy_size),
        Ok(LbPolicy::Random) => (Some(Algorithm::Random), None),
        _ => (None, legacy_size),
    })
}

/// The assignment an EDS cluster names (its `eds_cluster_config.service_name`,
/// or its own name), L4 service or not; `None` for other cluster types.
pub(crate) fn eds_name(c: &Cluster) -> Option<String> {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32 => {
            let n = c.eds_cluster_config.as_ref().map(|e| e.service_name.as_str()).unwrap_or_default();
            Some(if n.is_empty() { c.name.clone() } else { n.to_owned() })
        }
        _ => None,
    }
}

/// The assignment, checked.
pub(crate) fn decode_cla(c: &ClusterLoadAssignment) -> Result<Cla, Vec<String>> {
    let mut errors = Vec::new();
    // Exactly as many as it lists: pushing one by one leaves room for 16
    // where 10 came (100,000 endpoints: 7.7 MB held, 4.8 MB needed).
    let mut out = Cla { endpoints: Vec::with_capacity(c.endpoints.iter().map(|l| l.lb_endpoints.len()).sum()) };
    for (i, loc) in (0u32..).zip(&c.endpoints) {
        for (j, e) in (0u32..).zip(&loc.lb_endpoints) {
            match lb_endpoint(e, loc.priority, (i, j)) {
                Ok(ep) => out.endpoints.push(ep),
                Err(why) => errors.push(format!("{}: {why}", EndpointPath((i, j)))),
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn lb_endpoint(
    e: &envoy_types::pb::envoy::config::endpoint::v3::LbEndpoint,
    priority: u32,
    at: (u32, u32),
) -> Result<LbEndpoint, MappingError> {
    let endpoint = match &e.host_identifier {
        Some(HostIdentifier::Endpoint(ep)) => ep,
        Some(HostIdentifier::EndpointName(n)) => return Err(MappingError::NamedEndpoint(n.clone())),
        None => return Err(MappingError::NoEndpoint),
    };
    let sa = match endpoint.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(sa)) => sa,
        Some(address::Address::Pipe(_)) => return Err(MappingError::Pipe),
        Some(address::Address::EnvoyInternalAddress(_)) => return Err(MappingError::InternalAddress),
        None => return Err(MappingError::NoAddress),
    };
    if let Some(why) = mapped_v4(&sa.address) {
        return Err(MappingError::MappedV4(why));
    }
    let address: Addr = sa.address.trim().parse().map_err(|_| MappingError::NotAddress(sa.address.clone()))?;
    let port = match &sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) if *p <= 65535 => *p,
        Some(PortSpecifier::PortValue(p)) => return Err(MappingError::PortOutOfRange(*p)),
        Some(PortSpecifier::NamedPort(n)) => return Err(MappingError::NamedPort(n.clone())),
        None => 0,
    };
    let weight = e.load_balancing_weight.map_or(1, |w| w.value);
    if weight > limits::WEIGHT_MAX {
        return Err(MappingError::WeightTooLarge(weight));
    }
    let health = match HealthStatus::try_from(e.health_status) {
        Ok(HealthStatus::Healthy | HealthStatus::Unknown) => Health::Serving,
        Ok(HealthStatus::Degraded) => Health::Degraded,
        Ok(HealthStatus::Draining) => Health::Draining,
        Ok(HealthStatus::Unhealthy | HealthStatus::Timeout) => Health::Out,
        Err(_) => return Err(MappingError::UnknownHealth(e.health_status)),
    };
    let mut errors = Vec::new();
    let mut id = None;
    if let Some(md) = l4_metadata(e.metadata.as_ref(), &mut errors) {
        for (k, v) in &md.fields {
            match k.as_str() {
                "id" => match int(v, k, 0, u64::from(limits::ENDPOINT_LIMIT_MAX) - 1) {
                    Ok(n) => id = u32::try_from(n).ok(),
                    Err(e) => errors.push(format!("metadata {METADATA_KEY}.{e}")),
                },
                other => errors.push(format!("metadata {METADATA_KEY}: {}", unknown_key(other, ENDPOINT_KEYS))),
            }
        }
    }
    if !errors.is_empty() {
        return Err(MappingError::EndpointMetadata(errors));
    }
    Ok(LbEndpoint { address, port, weight, health, priority, id, at })
}

/// [`ORIGIN`], shared by every origin this source gives (one allocation,
/// not one per endpoint).
static ORIGIN_FILE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(ORIGIN));

fn origin(path: String) -> Origin {
    Origin { file: Arc::clone(&ORIGIN_FILE), pos: None, path: path.into() }
}

/// The problems of the endpoints of `cla` (named `cla_name` in messages)
/// as endpoints of cluster `c`: a port other than the service's (Sluice
/// does not translate ports), then two endpoints on one address.
fn endpoint_problems(c: &L4Cluster, cla: &Cla, cla_name: &str) -> Vec<String> {
    let mut errors = Vec::new();
    for e in &cla.endpoints {
        if e.port != 0 && e.port != u32::from(c.port) {
            errors.push(format!(
                "{cla_name}: {}: port {} is not the service's port {}: Sluice forwards without port translation (use {} or 0)",
                e.path(), e.port, c.port, c.port
            ));
        }
    }
    let mut seen: BTreeMap<Addr, EndpointPath> = BTreeMap::new();
    for e in &cla.endpoints {
        if let Some(first) = seen.insert(e.address, e.path()) {
            errors.push(format!("{cla_name}: {}: address {} is also at {first}: one endpoint per address", e.path(), e.address));
        }
    }
    errors
}

/// The service of cluster `c` with the endpoints of `cla`.
pub(crate) fn map_service(c: &L4Cluster, cla: &Cla, defaults: &Defaults) -> Result<MappedService, Vec<String>> {
    let limit = c.limit.unwrap_or(defaults.limit);
    let cla_name = match &c.endpoints {
        EndpointsFrom::Eds(n) => format!("ClusterLoadAssignment {n:?}"),
        EndpointsFrom::Inline(_) => format!("Cluster {:?} load_assignment", c.name),
    };
    let errors = endpoint_problems(c, cla, &cla_name);
    if !errors.is_empty() {
        return Err(errors);
    }
    let keys: Vec<Key> = cla.endpoints.iter().map(|e| e.id.map_or(Key::Address(e.address), Key::Explicit)).collect();
    let ids = identity::assign(&keys, limit).map_err(|e| vec![format!("{cla_name} for cluster {:?}: {e}", c.name)])?;

    let serving = cla.endpoints.iter().filter(|e| e.health == Health::Serving).map(|e| e.priority).min();
    let degraded = cla.endpoints.iter().filter(|e| e.health == Health::Degraded).map(|e| e.priority).min();
    let service = Arc::new(c.name.clone());
    // One origin for all of them (the assignment): an endpoint's origin is
    // shown only for problems the mapping refuses first (duplicates), and
    // one allocation per endpoint would be 8 MB with 100,000 endpoints.
    let endpoint_origin = Arc::new(origin(cla_name.clone()));
    let mut endpoints: Vec<EndpointDef> = Vec::with_capacity(cla.endpoints.len());
    for (e, id) in cla.endpoints.iter().zip(ids) {
        let (take, draining) = match e.health {
            Health::Serving => (Some(e.priority) == serving, false),
            Health::Degraded => (serving.is_none() && Some(e.priority) == degraded, false),
            Health::Draining => (true, true),
            Health::Out => (false, false),
        };
        if take {
            endpoints.push(EndpointDef {
                service: service.clone(),
                id,
                address: e.address,
                weight: e.weight,
                draining,
                mac: None,
                origin: endpoint_origin.clone(),
            });
        }
    }
    endpoints.sort_by_key(|e| e.id);
    let o = origin(format!("Cluster {:?}", c.name));
    Ok(MappedService {
        service: ServiceDef {
            name: c.name.clone(),
            algorithm: c.algorithm,
            limit: Some(limit),
            table_size: c.table_size,
            flow_table: c.flow_table,
            delivery: c.delivery,
            check: c.check.clone().map(Arc::new),
            origin: o.clone(),
        },
        route: RouteDef {
            name: c.name.clone(),
            service: c.name.clone(),
            priority: 0,
            matches: Arc::new(RouteMatch {
                vips: vec![c.vip],
                dst_ports: vec![PortRange::single(c.port)],
                protocols: vec![c.protocol],
                ..RouteMatch::default()
            }),
            origin: o,
        },
        endpoints: endpoints.into(),
        key: (c.vip, c.port, c.protocol),
    })
}

fn proto_name(p: u8) -> &'static str {
    crate::config::fields::protocol_name(p)
}

/// The services of `clusters` with the assignments in `clas`, made from
/// `prev` (see [`update`]): every cluster of either is looked at.
pub fn build<'a>(
    clusters: impl IntoIterator<Item = (&'a String, &'a Arc<L4Cluster>)>,
    clas: &OrdMap<String, ClaState>,
    prev: &Built,
    defaults: &Defaults,
) -> Result<Built, Vec<String>> {
    let clusters: BTreeMap<&str, (&'a String, &'a Arc<L4Cluster>)> = clusters.into_iter().map(|(n, c)| (n.as_str(), (n, c))).collect();
    let mut names: BTreeSet<&String> = clusters.values().map(|(n, _)| *n).collect();
    names.extend(prev.services.keys());
    names.extend(prev.warming.iter());
    names.extend(prev.claimed.keys());
    update(prev, names, |n| clusters.get(n).map(|(_, c)| *c), clas, defaults)
}

/// `prev` with the clusters named in `names` (in name order, each once)
/// as `cluster` and `clas` now have them; every other service is kept as it
/// is in `prev`. A named cluster that `cluster` does not know is gone; one
/// whose assignment is not there yet is warming (left out, or as it is in
/// `prev`). A service whose cluster and assignment did not change is
/// reused as it is.
///
/// Of the clusters that claim one VIP, port and protocol, the first by
/// name is served and the others are refused ([`Built::refused`]), whatever
/// the order they came in and whether the first is warm yet: appliances
/// that hold the same clusters serve the same ones. A refused cluster is no
/// error here (the others are served); it is served as soon as it is the
/// first of its claim. An `Err` is a cluster that cannot be mapped with its
/// endpoints.
pub fn update<'a>(
    prev: &Built,
    names: impl IntoIterator<Item = &'a String>,
    cluster: impl Fn(&str) -> Option<&'a Arc<L4Cluster>>,
    clas: &OrdMap<String, ClaState>,
    defaults: &Defaults,
) -> Result<Built, Vec<String>> {
    let mut out = Built::carried_from(prev);
    // The claims first: a cluster that takes or leaves a VIP, port and
    // protocol may change which of its other claimants is served.
    let todo = out.claim(names, &cluster);
    let mut errors = Vec::new();
    let now = out.place(prev, todo, &cluster, clas, defaults, &mut errors);
    out.commit(prev, now);
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

/// What each cluster looked at by [`update`] serves now, by name (`None`:
/// nothing), in name order.
type Placed = Vec<(String, Option<Applied>)>;

impl Built {
    /// `prev` as the start of the state [`update`] makes from it: all of it
    /// but its count of services mapped and its list of changed names.
    fn carried_from(prev: &Built) -> Built {
        // Field by field: `..prev.clone()` would also copy the previous
        // state's list of changed names (10,000 after a bulk load), only to
        // drop it, in the first change after it.
        Built {
            services: prev.services.clone(),
            warming: prev.warming.clone(),
            mapped: 0,
            changed: Vec::new(),
            claims: prev.claims.clone(),
            claimed: prev.claimed.clone(),
            owners: prev.owners.clone(),
            refused: prev.refused.clone(),
            endpoints: prev.endpoints,
        }
    }

    /// Moves the claim of each cluster of `names` to the VIP, port and
    /// protocol it claims now (`cluster`; none when it is gone). Returns the
    /// clusters to look at again: those named, and every claimant and the
    /// owner of each claim that changed (which of them is served may have
    /// changed).
    fn claim<'a>(&mut self, names: impl IntoIterator<Item = &'a String>, cluster: &impl Fn(&str) -> Option<&'a Arc<L4Cluster>>) -> BTreeSet<String> {
        let mut todo: BTreeSet<String> = BTreeSet::new();
        let mut touched: BTreeSet<(Addr, u16, u8)> = BTreeSet::new();
        for name in names {
            let now = cluster(name).map(|c| (c.vip, c.port, c.protocol));
            let was = self.claimed.get(name).copied();
            if now != was {
                if let Some(k) = was {
                    let mut set = self.claims.get(&k).cloned().unwrap_or_default();
                    set.remove(name);
                    if set.is_empty() {
                        self.claims.remove(&k);
                    } else {
                        self.claims.insert(k, set);
                    }
                    touched.insert(k);
                }
                match now {
                    Some(k) => {
                        let mut set = self.claims.get(&k).cloned().unwrap_or_default();
                        set.insert(name.clone());
                        self.claims.insert(k, set);
                        self.claimed.insert(name.clone(), k);
                        touched.insert(k);
                    }
                    None => {
                        self.claimed.remove(name);
                    }
                }
            }
            todo.insert(name.clone());
        }
        for k in &touched {
            if let Some(set) = self.claims.get(k) {
                todo.extend(set.iter().cloned());
            }
            if let Some(n) = self.owners.get(k) {
                todo.insert(n.clone());
            }
        }
        todo
    }

    /// Why cluster `name`, which claims `key`, is refused: another cluster,
    /// first by name, claims it too. `None` when `name` is the first.
    fn claimed_by_another(&self, name: &str, key: (Addr, u16, u8)) -> Option<Refusal> {
        let first = self.claims.get(&key).and_then(|set| set.get_min()).filter(|first| **first != name)?;
        let (vip, port, p) = key;
        let why = format!(
            "Cluster {name:?}: {vip}:{port}/{} is already claimed by cluster {first:?} (of the clusters that share a VIP, port and protocol, the first by name is served)",
            proto_name(p)
        );
        Some(Refusal { by: first.clone(), message: why })
    }

    /// Serves, refuses or keeps warming each cluster of `todo` (see
    /// [`update`]): a service whose cluster and assignment did not change
    /// is reused, the others are mapped again. Returns what each name now
    /// serves, to be taken by [`Built::commit`]; the clusters that cannot
    /// be mapped go to `errors`.
    fn place<'a>(
        &mut self,
        prev: &Built,
        todo: BTreeSet<String>,
        cluster: &impl Fn(&str) -> Option<&'a Arc<L4Cluster>>,
        clas: &OrdMap<String, ClaState>,
        defaults: &Defaults,
        errors: &mut Vec<String>,
    ) -> Placed {
        let empty = Cla::default();
        let mut now: Placed = Vec::with_capacity(todo.len());
        for name in todo {
            let Some(c) = cluster(&name) else {
                self.warming.remove(&name);
                self.refused.remove(&name);
                now.push((name, None));
                continue;
            };
            let key = (c.vip, c.port, c.protocol);
            if let Some(refusal) = self.claimed_by_another(&name, key) {
                self.refused.insert(name.clone(), refusal);
                self.warming.remove(&name);
                now.push((name, None));
                continue;
            }
            self.refused.remove(&name);
            let old = prev.services.get(&name);
            match assignment(c, clas, &empty) {
                Some((_, shared)) if old.is_some_and(|a| a.mapped_from(c, shared, defaults)) => {
                    self.warming.remove(&name);
                }
                Some((cla, shared)) => {
                    self.warming.remove(&name);
                    match map_service(c, cla, defaults) {
                        Ok(s) => {
                            self.mapped += 1;
                            let a = Applied { mapped: Arc::new(s), cluster: Arc::clone(c), cla: shared.cloned(), defaults: *defaults };
                            now.push((name, Some(a)));
                        }
                        Err(es) => errors.extend(es.into_iter().map(|e| format!("Cluster {name:?}: {e}"))),
                    }
                }
                None => {
                    // Warming: a served one keeps its previous definition,
                    // unless that is on a VIP, port and protocol another
                    // cluster now claims.
                    if old.is_some_and(|a| a.key != key && self.claims.contains_key(&a.key)) {
                        now.push((name.clone(), None));
                    }
                    self.warming.insert(name);
                }
            }
        }
        now
    }

    /// Takes what each cluster now serves (`now`, from [`Built::place`])
    /// into the state, keeping the endpoint count, the owners of the claims
    /// and the names that changed (from `prev`) up to date. A service mapped
    /// again equal to the one served is no change (it is still taken, so
    /// that nothing keeps the inputs it replaces).
    fn commit(&mut self, prev: &Built, now: Placed) {
        for (name, a) in now {
            let differs = prev.services.get(&name) != a.as_ref();
            if differs {
                if let Some(old) = prev.services.get(&name) {
                    self.endpoints -= old.endpoints.len();
                    if self.owners.get(&old.key) == Some(&name) {
                        self.owners.remove(&old.key);
                    }
                }
                self.changed.push(name.clone());
            }
            match a {
                Some(a) => {
                    if differs {
                        self.endpoints += a.endpoints.len();
                        self.owners.insert(a.key, name.clone());
                    }
                    self.services.insert(name, a);
                }
                None => {
                    self.services.remove(&name);
                }
            }
        }
    }
}

/// An assignment as mapping takes it, and the shared allocation it is when
/// it came over EDS (what [`Applied`] remembers it was mapped from).
type Assignment<'c> = (&'c Cla, Option<&'c Arc<Cla>>);

/// The assignment of cluster `c`: its own for a static cluster, the one
/// received, or `empty` for one the server says does not exist (or that
/// did not come in time); `None` while it is awaited (the cluster is
/// warming).
fn assignment<'c>(c: &'c L4Cluster, clas: &'c OrdMap<String, ClaState>, empty: &'c Cla) -> Option<Assignment<'c>> {
    match &c.endpoints {
        EndpointsFrom::Inline(cla) => Some((cla, None)),
        EndpointsFrom::Eds(n) => match clas.get(n) {
            Some(ClaState::Known(cla)) => Some((&**cla, Some(cla))),
            Some(ClaState::Absent) => Some((empty, None)),
            None => None,
        },
    }
}

#[cfg(test)]
pub(crate) mod tests;
