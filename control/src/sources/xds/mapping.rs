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
use crate::model::{limits, valid_name, Defaults, DeliveryMode, Desired, EndpointDef, Endpoints, Origin, RouteDef, ServiceDef};

/// The metadata key that marks an L4 service (clusters) or carries an
/// endpoint's identifier (endpoints).
pub const METADATA_KEY: &str = "io.cilium.l4lb";
/// `Origin.file` of everything this source defines.
pub const ORIGIN: &str = "xds";

/// The keys of a cluster's [`METADATA_KEY`] struct.
pub const CLUSTER_KEYS: &[&str] = &["vip", "port", "protocol", "endpointLimit", "flowTable", "delivery"];
/// The keys of an endpoint's [`METADATA_KEY`] struct.
pub const ENDPOINT_KEYS: &[&str] = &["id"];

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
}

impl L4Cluster {
    /// The EDS resource name it needs, if any.
    pub fn eds_name(&self) -> Option<&str> {
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
    pub fn path(&self) -> EndpointPath {
        EndpointPath(self.at)
    }
}

/// `endpoints[i].lb_endpoints[j]`, as a message shows it.
#[derive(Clone, Copy, Debug)]
pub struct EndpointPath(pub (u32, u32));

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
    pub service: ServiceDef,
    /// Its route.
    pub route: RouteDef,
    /// Its endpoints, by identifier: the run the model and the resolved
    /// model share.
    pub endpoints: Arc<[EndpointDef]>,
    /// The VIP, port and protocol the route matches.
    pub key: (Addr, u16, u8),
}

/// A mapped service and what it was mapped from: the cluster, its
/// assignment (none when inline or absent) and the defaults. A later state
/// whose cluster and assignment are the same allocations, under the same
/// defaults, reuses it without mapping again, so a change to one cluster
/// costs one mapping, not one per cluster.
#[derive(Clone, Debug)]
pub struct Applied {
    /// The service.
    pub mapped: Arc<MappedService>,
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
    pub warming: OrdSet<String>,
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
    pub refused: OrdMap<String, Refusal>,
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
    pub fn endpoints(&self) -> usize {
        self.endpoints
    }
}

/// Why a cluster is not served although it maps: another cluster, first
/// by name, claims its VIP, port and protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The cluster served in its place.
    pub by: String,
    /// The message (it names both).
    pub message: String,
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
fn int(v: &Value, key: &str, lo: u64, hi: u64) -> Result<u64, String> {
    let n = match &v.kind {
        Some(Kind::NumberValue(f)) if f.fract() == 0.0 && *f >= 0.0 && *f <= 9.007_199_254_740_992e15 => {
            // Whole and below 2^53: exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let n = *f as u64;
            n
        }
        Some(Kind::NumberValue(f)) => return Err(format!("{key}: {f} is not a whole number in {lo}..={hi}")),
        Some(Kind::StringValue(s)) => {
            s.trim().parse::<u64>().map_err(|_| format!("{key}: {s:?} is not a whole number in {lo}..={hi}"))?
        }
        _ => return Err(format!("{key}: expected a number, found {}", kind(v))),
    };
    if !(lo..=hi).contains(&n) {
        return Err(format!("{key}: {n} is out of range {lo}..={hi}"));
    }
    Ok(n)
}

fn string<'a>(v: &'a Value, key: &str) -> Result<&'a str, String> {
    match &v.kind {
        Some(Kind::StringValue(s)) => Ok(s),
        _ => Err(format!("{key}: expected a string, found {}", kind(v))),
    }
}

fn boolean(v: &Value, key: &str) -> Result<bool, String> {
    match &v.kind {
        Some(Kind::BoolValue(b)) => Ok(*b),
        Some(Kind::StringValue(s)) if s == "true" || s == "false" => Ok(s == "true"),
        _ => Err(format!("{key}: expected true or false, found {}", kind(v))),
    }
}

/// The VIP: one address, optionally as a /32 or /128.
pub fn vip(s: &str) -> Result<Addr, String> {
    let s = s.trim();
    if let Some(why) = mapped_v4(s) {
        return Err(format!("vip: {why}"));
    }
    let (a, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let addr: Addr = a.parse().map_err(|_| format!("vip: {s:?} is not an IP address"))?;
    match len {
        None => Ok(addr),
        Some(l) if l == if addr.is_v4() { "32" } else { "128" } => Ok(addr),
        Some(_) => Err(format!("vip: {s:?} is not a single address (a VIP is one address, or a /32 or /128)")),
    }
}

fn protocol(s: &str) -> Result<u8, String> {
    match s.trim().to_ascii_uppercase().as_str() {
        "TCP" => Ok(proto::TCP),
        "UDP" => Ok(proto::UDP),
        "SCTP" => Ok(proto::SCTP),
        _ => Err(format!("protocol: unknown protocol {s:?} (expected TCP, UDP or SCTP)")),
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

/// The cluster as an L4 service; `Ok(None)` when it is not one.
pub fn decode_cluster(c: &Cluster) -> Result<Option<L4Cluster>, Vec<String>> {
    let mut errors = Vec::new();
    let Some(md) = l4_metadata(c.metadata.as_ref(), &mut errors) else {
        return if errors.is_empty() { Ok(None) } else { Err(errors) };
    };
    let mut vip_v = None;
    let mut port = None;
    let mut proto_v = None;
    let (mut limit, mut flow_table, mut delivery) = (None, None, None);
    let mut keys: Vec<&String> = md.fields.keys().collect();
    keys.sort();
    for k in keys {
        let v = &md.fields[k];
        let r: Result<(), String> = match k.as_str() {
            "vip" => string(v, k).and_then(vip).map(|a| vip_v = Some(a)),
            "port" => int(v, k, 1, 65535).map(|p| port = u16::try_from(p).ok()),
            "protocol" => string(v, k).and_then(protocol).map(|p| proto_v = Some(p)),
            "endpointLimit" => int(v, k, u64::from(limits::ENDPOINT_LIMIT_MIN), u64::from(limits::ENDPOINT_LIMIT_MAX))
                .map(|l| limit = u32::try_from(l).ok()),
            "flowTable" => boolean(v, k).map(|b| flow_table = Some(b)),
            "delivery" => string(v, k).and_then(|s| s.parse::<DeliveryMode>().map_err(|e| format!("delivery: {e}"))).map(|d| delivery = Some(d)),
            other => Err(unknown_key(other, CLUSTER_KEYS)),
        };
        if let Err(e) = r {
            errors.push(format!("{METADATA_KEY}.{e}"));
        }
    }
    for (key, missing) in [("vip", vip_v.is_none()), ("port", port.is_none()), ("protocol", proto_v.is_none())] {
        if missing && !md.fields.contains_key(key) {
            errors.push(format!("{METADATA_KEY}: missing key {key:?}"));
        }
    }
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
            errors.push(e);
            (None, None)
        }
    };
    let endpoints = match c.cluster_discovery_type {
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
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    match (vip_v, port, proto_v, endpoints) {
        (Some(vip), Some(port), Some(protocol), Some(endpoints)) => Ok(Some(L4Cluster {
            name: c.name.clone(),
            endpoints,
            vip,
            port,
            protocol,
            algorithm,
            table_size,
            limit,
            flow_table,
            delivery,
        })),
        _ => Err(vec!["incomplete io.cilium.l4lb metadata".into()]),
    }
}

fn table_size(n: u64) -> Result<u32, String> {
    let Some(m) = u32::try_from(n).ok().filter(|m| *m <= limits::TABLE_SIZE_MAX) else {
        return Err(format!("Maglev table size {n} is above the largest, {}", limits::TABLE_SIZE_MAX));
    };
    if !is_prime(m) {
        return Err(format!("Maglev table size {m} is not a prime (the next prime is {})", next_prime(m)));
    }
    Ok(m)
}

/// The algorithm and table size the cluster asks for.
fn lb_policy(c: &Cluster) -> Result<(Option<Algorithm>, Option<u32>), String> {
    let legacy_size = match &c.lb_config {
        Some(LbConfig::MaglevLbConfig(m)) => m.table_size.map(|t| table_size(t.value)).transpose()?,
        _ => None,
    };
    if let Some(policy) = &c.load_balancing_policy {
        for p in &policy.policies {
            let Some(any) = p.typed_extension_config.as_ref().and_then(|t| t.typed_config.as_ref()) else { continue };
            if any.type_url == Maglev::type_url() {
                let m = Maglev::decode(any.value.as_slice()).map_err(|e| format!("load_balancing_policy: Maglev: {e}"))?;
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
pub fn eds_name(c: &Cluster) -> Option<String> {
    match c.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32 => {
            let n = c.eds_cluster_config.as_ref().map(|e| e.service_name.as_str()).unwrap_or_default();
            Some(if n.is_empty() { c.name.clone() } else { n.to_owned() })
        }
        _ => None,
    }
}

/// The assignment, checked.
pub fn decode_cla(c: &ClusterLoadAssignment) -> Result<Cla, Vec<String>> {
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
) -> Result<LbEndpoint, String> {
    let endpoint = match &e.host_identifier {
        Some(HostIdentifier::Endpoint(ep)) => ep,
        Some(HostIdentifier::EndpointName(n)) => return Err(format!("named endpoint {n:?} is not supported")),
        None => return Err("no endpoint".into()),
    };
    let sa = match endpoint.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(sa)) => sa,
        Some(address::Address::Pipe(_)) => return Err("a pipe is not an endpoint address".into()),
        Some(address::Address::EnvoyInternalAddress(_)) => return Err("an Envoy internal address is not an endpoint address".into()),
        None => return Err("no address".into()),
    };
    if let Some(why) = mapped_v4(&sa.address) {
        return Err(why);
    }
    let address: Addr = sa.address.trim().parse().map_err(|_| format!("{:?} is not an IP address (host names are not resolved)", sa.address))?;
    let port = match &sa.port_specifier {
        Some(PortSpecifier::PortValue(p)) if *p <= 65535 => *p,
        Some(PortSpecifier::PortValue(p)) => return Err(format!("port {p} is out of range 0..=65535")),
        Some(PortSpecifier::NamedPort(n)) => return Err(format!("named port {n:?} is not supported")),
        None => 0,
    };
    let weight = e.load_balancing_weight.map_or(1, |w| w.value);
    if weight > limits::WEIGHT_MAX {
        return Err(format!("load_balancing_weight {weight} is above the largest, {}", limits::WEIGHT_MAX));
    }
    let health = match HealthStatus::try_from(e.health_status) {
        Ok(HealthStatus::Healthy | HealthStatus::Unknown) => Health::Serving,
        Ok(HealthStatus::Degraded) => Health::Degraded,
        Ok(HealthStatus::Draining) => Health::Draining,
        Ok(HealthStatus::Unhealthy | HealthStatus::Timeout) => Health::Out,
        Err(_) => return Err(format!("unknown health_status {}", e.health_status)),
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
        return Err(errors.join("; "));
    }
    Ok(LbEndpoint { address, port, weight, health, priority, id, at })
}

/// [`ORIGIN`], shared by every origin this source gives (one allocation,
/// not one per endpoint).
static ORIGIN_FILE: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(ORIGIN));

fn origin(path: String) -> Origin {
    Origin { file: Arc::clone(&ORIGIN_FILE), pos: None, path: path.into() }
}

/// The service of cluster `c` with the endpoints of `cla`.
pub fn map_service(c: &L4Cluster, cla: &Cla, defaults: &Defaults) -> Result<MappedService, Vec<String>> {
    let limit = c.limit.unwrap_or(defaults.limit);
    let cla_name = match &c.endpoints {
        EndpointsFrom::Eds(n) => format!("ClusterLoadAssignment {n:?}"),
        EndpointsFrom::Inline(_) => format!("Cluster {:?} load_assignment", c.name),
    };
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
    // Field by field: `..prev.clone()` would also copy the previous
    // state's list of changed names (10,000 after a bulk load), only to
    // drop it, in the first change after it.
    let mut out = Built {
        services: prev.services.clone(),
        warming: prev.warming.clone(),
        mapped: 0,
        changed: Vec::new(),
        claims: prev.claims.clone(),
        claimed: prev.claimed.clone(),
        owners: prev.owners.clone(),
        refused: prev.refused.clone(),
        endpoints: prev.endpoints,
    };
    // The claims first: a cluster that takes or leaves a VIP, port and
    // protocol may change which of its other claimants is served.
    let mut todo: BTreeSet<String> = BTreeSet::new();
    let mut touched: BTreeSet<(Addr, u16, u8)> = BTreeSet::new();
    for name in names {
        let now = cluster(name).map(|c| (c.vip, c.port, c.protocol));
        let was = out.claimed.get(name).copied();
        if now != was {
            if let Some(k) = was {
                let mut set = out.claims.get(&k).cloned().unwrap_or_default();
                set.remove(name);
                if set.is_empty() {
                    out.claims.remove(&k);
                } else {
                    out.claims.insert(k, set);
                }
                touched.insert(k);
            }
            match now {
                Some(k) => {
                    let mut set = out.claims.get(&k).cloned().unwrap_or_default();
                    set.insert(name.clone());
                    out.claims.insert(k, set);
                    out.claimed.insert(name.clone(), k);
                    touched.insert(k);
                }
                None => {
                    out.claimed.remove(name);
                }
            }
        }
        todo.insert(name.clone());
    }
    for k in &touched {
        if let Some(set) = out.claims.get(k) {
            todo.extend(set.iter().cloned());
        }
        if let Some(n) = out.owners.get(k) {
            todo.insert(n.clone());
        }
    }
    let mut errors = Vec::new();
    let empty = Cla::default();
    let mut now: Vec<(String, Option<Applied>)> = Vec::with_capacity(todo.len());
    for name in todo {
        let Some(c) = cluster(&name) else {
            out.warming.remove(&name);
            out.refused.remove(&name);
            now.push((name, None));
            continue;
        };
        let key = (c.vip, c.port, c.protocol);
        if let Some(first) = out.claims.get(&key).and_then(|set| set.get_min()).filter(|first| **first != name) {
            let (vip, port, p) = key;
            let why = format!(
                "Cluster {name:?}: {vip}:{port}/{} is already claimed by cluster {first:?} (of the clusters that share a VIP, port and protocol, the first by name is served)",
                proto_name(p)
            );
            out.refused.insert(name.clone(), Refusal { by: first.clone(), message: why });
            out.warming.remove(&name);
            now.push((name, None));
            continue;
        }
        out.refused.remove(&name);
        let cla = match &c.endpoints {
            EndpointsFrom::Inline(cla) => Some((cla, None)),
            EndpointsFrom::Eds(n) => match clas.get(n) {
                Some(ClaState::Known(cla)) => Some((&**cla, Some(cla))),
                Some(ClaState::Absent) => Some((&empty, None)),
                None => None,
            },
        };
        let old = prev.services.get(&name);
        match cla {
            Some((_, shared)) if old.is_some_and(|a| a.mapped_from(c, shared, defaults)) => {
                out.warming.remove(&name);
            }
            Some((cla, shared)) => {
                out.warming.remove(&name);
                match map_service(c, cla, defaults) {
                    Ok(s) => {
                        out.mapped += 1;
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
                if old.is_some_and(|a| a.key != key && out.claims.contains_key(&a.key)) {
                    now.push((name.clone(), None));
                }
                out.warming.insert(name);
            }
        }
    }
    // Which services change. A service mapped again equal to the one
    // served is no change (it is still taken, so that nothing keeps the
    // inputs it replaces).
    for (name, a) in now {
        let differs = prev.services.get(&name) != a.as_ref();
        if differs {
            if let Some(old) = prev.services.get(&name) {
                out.endpoints -= old.endpoints.len();
                if out.owners.get(&old.key) == Some(&name) {
                    out.owners.remove(&old.key);
                }
            }
            out.changed.push(name.clone());
        }
        match a {
            Some(a) => {
                if differs {
                    out.endpoints += a.endpoints.len();
                    out.owners.insert(a.key, name.clone());
                }
                out.services.insert(name, a);
            }
            None => {
                out.services.remove(&name);
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
pub(crate) mod tests;
