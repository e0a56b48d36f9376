//! The EndpointSlices of a Gateway's Services, built from the pods'
//! addresses on the Gateway's secondary networks (no cluster needed: a
//! pure function of the objects).
//!
//! For each Service labelled `service.kubernetes.io/service-proxy-name:
//! <gateway>` (a Gateway of our class, in the Service's namespace), the
//! pods of its namespace matching its selector (the design's dummy
//! selector label is not matched) are endpoints when their Multus
//! `k8s.v1.cni.cncf.io/network-status` annotation shows an address on one
//! of the Gateway's networks (`meridio-experiment/networks`) inside one of
//! its subnets (`meridio-experiment/network-subnets`): one per family, the
//! first such. A pod that gives none is left out with its reason
//! ([`Ignored`]).
//!
//! Identifiers come from [`super::ids::allocate`], read back from the
//! Service's own slices; a full Service admits no more endpoints and says
//! which were left out. Each family gets its slices, `<service>-sluice-v4`
//! (`-v6`), one more (`-2`, `-3`...) per [`MAX_ENDPOINTS`] identifiers, so
//! an endpoint's slice follows from its identifier alone and never changes
//! while it stays. Slices carry the managed-by label, the Service as owner
//! and the identifiers in [`ENDPOINT_IDS`], which the appliance reads.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use serde_json::{json, Value as Json};

use super::ids::{self, Previous};
use super::{Key, Store, MANAGED_BY, MANAGED_BY_LABEL};
use sluice_core::config::manifests::{ENDPOINT_IDS, PROXY_NAME_LABEL, SERVICE_NAME_LABEL};
use sluice_core::model::limits;

/// Multus's annotation on a pod: its attachments and their addresses.
pub(crate) const NETWORK_STATUS: &str = "k8s.v1.cni.cncf.io/network-status";
/// The Gateway's networks towards the endpoints (JSON list of `{name, interface}`).
pub(crate) const GATEWAY_NETWORKS: &str = "meridio-experiment/networks";
/// The Gateway's subnets the endpoint addresses are in (JSON list of CIDRs).
pub(crate) const GATEWAY_SUBNETS: &str = "meridio-experiment/network-subnets";
/// The selector label the design uses to keep Kubernetes' own EndpointSlice
/// controller away; it is not matched.
pub(crate) const DUMMY_SELECTOR: &str = "meridio-experiment/dummy-service-selector";
/// The Service annotation giving its endpoint limit.
pub(crate) const ENDPOINT_LIMIT: &str = "sluice.io/endpoint-limit";
/// Most endpoints in one slice (the API's own bound).
pub(crate) const MAX_ENDPOINTS: u32 = 1000;

/// A network the Gateway names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Network {
    /// `namespace/name` of the NetworkAttachmentDefinition.
    pub(crate) name: String,
    /// The interface in the pod, when the Gateway names one.
    pub(crate) interface: Option<String>,
}

/// The networks and subnets of a Gateway, from its infrastructure annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Networks {
    /// The networks (none: the Gateway names none, no pod is an endpoint).
    pub(crate) networks: Vec<Network>,
    /// The subnets (none: any address on those networks).
    pub(crate) subnets: Vec<Cidr>,
}

/// Why a text is not a CIDR (each variant carries the text).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CidrError {
    /// There is no `/length`.
    #[error("{0:?} is not a CIDR (address/length)")]
    NoLength(String),
    /// The address does not parse.
    #[error("{0:?}: {1}")]
    Address(String, std::net::AddrParseError),
    /// The length does not parse.
    #[error("{0:?}: bad length: {1}")]
    Length(String, std::num::ParseIntError),
    /// The length (second) is more than the family's (third).
    #[error("{0:?}: length {1} is more than {2}")]
    TooLong(String, u8, u8),
}

/// What is wrong with a Gateway's networks or subnets annotations.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NetworksError {
    /// [`GATEWAY_NETWORKS`] is not JSON.
    #[error("{GATEWAY_NETWORKS}: not JSON: {0}")]
    NetworksNotJson(serde_json::Error),
    /// [`GATEWAY_NETWORKS`] is JSON but not a list.
    #[error("{GATEWAY_NETWORKS}: not a list of {{name, interface}}")]
    NetworksNotAList,
    /// An entry of [`GATEWAY_NETWORKS`] (as JSON) is a mapping without a name.
    #[error("{GATEWAY_NETWORKS}: an entry without a name: {0}")]
    NoName(Json),
    /// An entry of [`GATEWAY_NETWORKS`] (as JSON) is neither a name nor a mapping.
    #[error("{GATEWAY_NETWORKS}: not a network: {0}")]
    NotANetwork(Json),
    /// [`GATEWAY_SUBNETS`] is not a JSON list of strings.
    #[error("{GATEWAY_SUBNETS}: not a JSON list of CIDRs: {0}")]
    SubnetsNotAList(serde_json::Error),
    /// An entry of [`GATEWAY_SUBNETS`] is not a CIDR.
    #[error("{GATEWAY_SUBNETS}: {0}")]
    Subnet(CidrError),
}

/// Why a Service's [`ENDPOINT_LIMIT`] annotation is wrong (carries its text).
#[derive(Debug, thiserror::Error)]
#[error("{ENDPOINT_LIMIT}: {0:?} is not a number in {min}..={max}", min = limits::ENDPOINT_LIMIT_MIN, max = limits::ENDPOINT_LIMIT_MAX)]
pub(crate) struct LimitError(String);

/// A prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cidr {
    /// Its address.
    pub(crate) addr: IpAddr,
    /// Its length.
    pub(crate) len: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n` or `x::y/n`.
    pub(crate) fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (a, l) = s.split_once('/').ok_or_else(|| CidrError::NoLength(s.to_owned()))?;
        let addr: IpAddr = a.parse().map_err(|e| CidrError::Address(s.to_owned(), e))?;
        let len: u8 = l.parse().map_err(|e| CidrError::Length(s.to_owned(), e))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if len > max {
            return Err(CidrError::TooLong(s.to_owned(), len, max));
        }
        Ok(Cidr { addr, len })
    }

    /// Whether `ip` is inside.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = if self.len == 0 { 0 } else { u32::MAX << (32 - u32::from(self.len)) };
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = if self.len == 0 { 0 } else { u128::MAX << (128 - u32::from(self.len)) };
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// `name` as `namespace/name` (a Multus network without a namespace is
/// in the pod's).
fn qualified(name: &str, namespace: &str) -> String {
    if name.contains('/') {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

/// The infrastructure annotation `key` of a Gateway.
pub(crate) fn infra_annotation<'a>(gw: &'a Json, key: &str) -> Option<&'a str> {
    gw.pointer("/spec/infrastructure/annotations").and_then(|a| a.get(key)).and_then(Json::as_str)
}

/// The networks and subnets a Gateway names; an error says what is wrong.
pub(crate) fn gateway_networks(gw: &Json) -> Result<Networks, NetworksError> {
    let ns = gw.pointer("/metadata/namespace").and_then(Json::as_str).unwrap_or("default");
    let mut out = Networks::default();
    if let Some(text) = infra_annotation(gw, GATEWAY_NETWORKS) {
        let v: Json = serde_json::from_str(text).map_err(NetworksError::NetworksNotJson)?;
        let list = v.as_array().ok_or(NetworksError::NetworksNotAList)?;
        for n in list {
            // Multus also accepts a bare name.
            let (name, interface) = match n {
                Json::String(s) => (s.as_str(), None),
                Json::Object(_) => (
                    n.get("name").and_then(Json::as_str).ok_or_else(|| NetworksError::NoName(n.clone()))?,
                    n.get("interface").and_then(Json::as_str).map(str::to_owned),
                ),
                _ => return Err(NetworksError::NotANetwork(n.clone())),
            };
            let name = match n.get("namespace").and_then(Json::as_str) {
                Some(nns) => format!("{nns}/{name}"),
                None => qualified(name, ns),
            };
            out.networks.push(Network { name, interface });
        }
    }
    if let Some(text) = infra_annotation(gw, GATEWAY_SUBNETS) {
        let v: Vec<String> = serde_json::from_str(text).map_err(NetworksError::SubnetsNotAList)?;
        for s in v {
            out.subnets.push(Cidr::parse(&s).map_err(NetworksError::Subnet)?);
        }
    }
    Ok(out)
}

/// Why a pod selected by a Service is not one of its endpoints.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Ignored {
    /// `namespace/service`.
    pub(crate) service: String,
    /// The pod's name.
    pub(crate) pod: String,
    /// A short reason (`NoNetworkStatus`, `NotOnNetwork`, `OutsideSubnets`,
    /// `ServiceFull`, `Finished`).
    pub(crate) reason: &'static str,
    /// Why, in words.
    pub(crate) message: String,
}

/// The addresses of `pod` on `nets`, one per family (the first in the
/// annotation's order), or why there is none.
pub(crate) fn pod_addresses(pod: &Json, nets: &Networks) -> Result<Vec<IpAddr>, (&'static str, String)> {
    let ns = pod.pointer("/metadata/namespace").and_then(Json::as_str).unwrap_or("default");
    let Some(text) = pod.pointer("/metadata/annotations").and_then(|a| a.get(NETWORK_STATUS)).and_then(Json::as_str) else {
        return Err(("NoNetworkStatus", format!("no {NETWORK_STATUS} annotation (not attached by Multus yet)")));
    };
    let status: Vec<Json> = serde_json::from_str(text).map_err(|e| ("NoNetworkStatus", format!("{NETWORK_STATUS}: not a JSON list: {e}")))?;
    let wanted = |n: &Json| {
        let Some(name) = n.get("name").and_then(Json::as_str) else { return false };
        let name = qualified(name, ns);
        let iface = n.get("interface").and_then(Json::as_str);
        nets.networks.iter().any(|w| w.name == name && w.interface.as_deref().is_none_or(|i| Some(i) == iface))
    };
    let on: Vec<&Json> = status.iter().filter(|n| wanted(n)).collect();
    if on.is_empty() {
        let names: Vec<String> = nets.networks.iter().map(|n| n.name.clone()).collect();
        return Err(("NotOnNetwork", format!("not attached to the Gateway's network(s) {}", names.join(", "))));
    }
    let mut out: Vec<IpAddr> = Vec::new();
    let mut seen_any = Vec::new();
    for n in on {
        for ip in n.get("ips").and_then(Json::as_array).into_iter().flatten().filter_map(Json::as_str) {
            // Some plugins write a prefix length.
            let Ok(ip) = ip.split('/').next().unwrap_or(ip).parse::<IpAddr>() else { continue };
            seen_any.push(ip);
            let inside = nets.subnets.is_empty() || nets.subnets.iter().any(|c| c.contains(ip));
            if inside && !out.iter().any(|o| o.is_ipv4() == ip.is_ipv4()) {
                out.push(ip);
            }
        }
    }
    if out.is_empty() {
        let subnets: Vec<String> = nets.subnets.iter().map(ToString::to_string).collect();
        let have: Vec<String> = seen_any.iter().map(ToString::to_string).collect();
        return Err(("OutsideSubnets", format!(
            "no address in the Gateway's subnet(s) {} (has {})",
            subnets.join(", "),
            if have.is_empty() { "none".to_owned() } else { have.join(", ") }
        )));
    }
    Ok(out)
}

/// Whether `pod`'s labels match `svc`'s selector (without the dummy label;
/// an empty selector selects nothing, as in Kubernetes).
pub(crate) fn selects(svc: &Json, pod: &Json) -> bool {
    let Some(sel) = svc.pointer("/spec/selector").and_then(Json::as_object) else { return false };
    let sel: Vec<(&String, &Json)> = sel.iter().filter(|(k, _)| k.as_str() != DUMMY_SELECTOR).collect();
    if sel.is_empty() {
        return false;
    }
    let labels = pod.pointer("/metadata/labels");
    sel.iter().all(|(k, v)| labels.and_then(|l| l.get(k.as_str())) == Some(v))
}

/// The endpoint limit of `svc` (its annotation, else `default`), or why
/// the annotation is wrong.
pub(crate) fn limit_of(svc: &Json, default: u32) -> Result<u32, LimitError> {
    match svc.pointer("/metadata/annotations").and_then(|a| a.get(ENDPOINT_LIMIT)).and_then(Json::as_str) {
        None => Ok(default),
        Some(s) => match s.trim().parse::<u32>() {
            Ok(n) if (limits::ENDPOINT_LIMIT_MIN..=limits::ENDPOINT_LIMIT_MAX).contains(&n) => Ok(n),
            _ => Err(LimitError(s.to_owned())),
        },
    }
}

/// The identifiers of a Service's endpoints: first as kept on the Service
/// itself (its [`ENDPOINT_IDS`] annotation, which outlives its slices:
/// a Gateway deleted and re-created, or its class changed and changed
/// back, finds them there), then as the slices this controller wrote for
/// it hold them.
pub(crate) fn previous_ids(store: &Store, svc: &Key) -> Previous {
    let mut out = Previous::new();
    let kept = store.get("Service", &svc.0, &svc.1).into_iter();
    for s in kept.chain(owned_slices(store, svc)) {
        let Some(text) = s.pointer("/metadata/annotations").and_then(|a| a.get(ENDPOINT_IDS)).and_then(Json::as_str) else { continue };
        let Ok(m) = serde_json::from_str::<BTreeMap<String, u32>>(text) else { continue };
        for (a, id) in m {
            if let Ok(ip) = a.parse::<IpAddr>() {
                out.entry(ip).or_insert(id);
            }
        }
    }
    out
}

/// The slices of `svc` this controller manages.
pub(crate) fn owned_slices<'a>(store: &'a Store, svc: &'a Key) -> impl Iterator<Item = &'a Json> + 'a {
    store.of("EndpointSlice").filter(move |(k, s)| {
        k.0 == svc.0
            && s.pointer("/metadata/labels").and_then(|l| l.get(SERVICE_NAME_LABEL)).and_then(Json::as_str) == Some(svc.1.as_str())
            && s.pointer("/metadata/labels").and_then(|l| l.get(MANAGED_BY_LABEL)).and_then(Json::as_str) == Some(MANAGED_BY)
    }).map(|(_, s)| s)
}

/// An endpoint of a Service.
#[derive(Clone, Debug)]
struct Endpoint<'a> {
    addr: IpAddr,
    pod: &'a Json,
}

/// What [`service_slices`] decided for one Service.
#[derive(Clone, Debug, Default)]
pub(crate) struct ServiceSlices {
    /// The slices to hold, by name.
    pub(crate) slices: BTreeMap<String, Json>,
    /// Pods left out, and why.
    pub(crate) ignored: Vec<Ignored>,
    /// The limit, when the Service is full (some endpoint left out).
    pub(crate) full: Option<u32>,
    /// The Service's own problem (a bad limit annotation): nothing is
    /// written for it.
    pub(crate) invalid: Option<String>,
    /// Every admitted endpoint's identifier, as the Service keeps them
    /// (its [`ENDPOINT_IDS`] annotation: address → identifier, JSON).
    pub(crate) ids: String,
}

/// Pods in the order endpoints are admitted: oldest first, then by name.
fn admission_order(pods: &mut [&Json]) {
    let key = |p: &Json| {
        (
            p.pointer("/metadata/creationTimestamp").and_then(Json::as_str).unwrap_or("").to_owned(),
            p.pointer("/metadata/name").and_then(Json::as_str).unwrap_or("").to_owned(),
        )
    };
    pods.sort_by_key(|p| key(p));
}

fn condition_true(pod: &Json, t: &str) -> bool {
    pod.pointer("/status/conditions")
        .and_then(Json::as_array)
        .is_some_and(|c| c.iter().any(|c| c["type"] == t && c["status"] == "True"))
}

/// The slices of Service `svc` (key `key`) of a Gateway with networks `nets`.
pub(crate) fn service_slices(store: &Store, key: &Key, svc: &Json, nets: &Networks, default_limit: u32) -> ServiceSlices {
    let mut out = ServiceSlices::default();
    let limit = match limit_of(svc, default_limit) {
        Ok(l) => l,
        Err(e) => {
            out.invalid = Some(e.to_string());
            return out;
        }
    };
    let service = format!("{}/{}", key.0, key.1);
    let mut pods: Vec<&Json> = store.of("Pod").filter(|(k, p)| k.0 == key.0 && selects(svc, p)).map(|(_, p)| p).collect();
    admission_order(&mut pods);
    let mut endpoints: Vec<Endpoint<'_>> = Vec::new();
    for pod in pods {
        let name = pod.pointer("/metadata/name").and_then(Json::as_str).unwrap_or("").to_owned();
        if matches!(pod.pointer("/status/phase").and_then(Json::as_str), Some("Succeeded" | "Failed")) {
            out.ignored.push(Ignored { service: service.clone(), pod: name, reason: "Finished", message: "the pod has finished".into() });
            continue;
        }
        match pod_addresses(pod, nets) {
            Ok(addrs) => endpoints.extend(addrs.into_iter().map(|addr| Endpoint { addr, pod })),
            Err((reason, message)) => out.ignored.push(Ignored { service: service.clone(), pod: name, reason, message }),
        }
    }
    let previous = previous_ids(store, key);
    let candidates: Vec<IpAddr> = endpoints.iter().map(|e| e.addr).collect();
    let alloc = ids::allocate(&previous, limit, &candidates);
    let kept: BTreeMap<String, u32> = alloc.ids.iter().map(|(a, id)| (a.to_string(), *id)).collect();
    out.ids = serde_json::to_string(&kept).unwrap_or_default();
    if !alloc.full.is_empty() {
        out.full = Some(limit);
        for a in &alloc.full {
            let pod = endpoints.iter().find(|e| e.addr == *a).and_then(|e| e.pod.pointer("/metadata/name")).and_then(Json::as_str).unwrap_or("");
            out.ignored.push(Ignored {
                service: service.clone(),
                pod: pod.to_owned(),
                reason: "ServiceFull",
                message: format!("{a}: the Service is full (all {limit} endpoint identifiers are taken; {ENDPOINT_LIMIT} raises it)"),
            });
        }
    }
    // One family at a time, in identifier order, chunked by identifier.
    let mut groups: BTreeMap<(bool, u32), Vec<(u32, &Endpoint<'_>)>> = BTreeMap::new();
    let mut done = BTreeSet::new();
    for e in &endpoints {
        let Some(&id) = alloc.ids.get(&e.addr) else { continue };
        if !done.insert(e.addr) {
            continue;
        }
        groups.entry((e.addr.is_ipv4(), id / MAX_ENDPOINTS)).or_default().push((id, e));
    }
    let families: BTreeSet<bool> = groups.keys().map(|(v4, _)| *v4).collect();
    for (v4, chunk) in groups.keys().copied().collect::<Vec<_>>() {
        let mut members = groups.remove(&(v4, chunk)).unwrap_or_default();
        members.sort_by_key(|(id, _)| *id);
        let name = slice_name(&key.1, v4, chunk);
        out.slices.insert(name.clone(), slice(key, svc, &name, v4, &members));
    }
    if families.is_empty() {
        // No endpoint: one empty slice says so (as Kubernetes' own
        // controller keeps one), in the Service's family.
        let v4 = svc.pointer("/spec/ipFamilies/0").and_then(Json::as_str).is_none_or(|f| f != "IPv6");
        let name = slice_name(&key.1, v4, 0);
        out.slices.insert(name.clone(), slice(key, svc, &name, v4, &[]));
    }
    out
}

/// The name of a Service's slice for a family and identifier chunk.
pub(crate) fn slice_name(service: &str, v4: bool, chunk: u32) -> String {
    let fam = if v4 { "v4" } else { "v6" };
    if chunk == 0 {
        format!("{service}-sluice-{fam}")
    } else {
        format!("{service}-sluice-{fam}-{}", chunk + 1)
    }
}

fn slice(key: &Key, svc: &Json, name: &str, v4: bool, members: &[(u32, &Endpoint<'_>)]) -> Json {
    let ids: BTreeMap<String, u32> = members.iter().map(|(id, e)| (e.addr.to_string(), *id)).collect();
    let endpoints: Vec<Json> = members
        .iter()
        .map(|(_, e)| {
            let p = e.pod;
            let terminating = p.pointer("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null());
            let serving = condition_true(p, "Ready");
            let mut ep = json!({
                "addresses": [e.addr.to_string()],
                "conditions": {"ready": serving && !terminating, "serving": serving, "terminating": terminating},
                "targetRef": {
                    "kind": "Pod",
                    "namespace": key.0,
                    "name": p.pointer("/metadata/name").cloned().unwrap_or(Json::Null),
                },
            });
            if let Some(uid) = p.pointer("/metadata/uid").filter(|u| u.is_string()) {
                ep["targetRef"]["uid"] = uid.clone();
            }
            if let Some(node) = p.pointer("/spec/nodeName").and_then(Json::as_str) {
                ep["nodeName"] = json!(node);
            }
            ep
        })
        .collect();
    let ports: Vec<Json> = svc
        .pointer("/spec/ports")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .map(|p| {
            let port = p.get("targetPort").filter(|t| t.is_u64()).or_else(|| p.get("port")).cloned().unwrap_or(Json::Null);
            let mut o = json!({"port": port, "protocol": p.get("protocol").cloned().unwrap_or(json!("TCP"))});
            if let Some(n) = p.get("name").and_then(Json::as_str) {
                o["name"] = json!(n);
            }
            o
        })
        .collect();
    // An owner reference needs the owner's uid, which only the server
    // knows (a dry run over files has none): without it there is none.
    let owners: Vec<Json> = svc
        .pointer("/metadata/uid")
        .and_then(Json::as_str)
        .filter(|u| !u.is_empty())
        .map(|uid| json!({"apiVersion": "v1", "kind": "Service", "name": key.1, "uid": uid, "controller": true, "blockOwnerDeletion": true}))
        .into_iter()
        .collect();
    let mut labels = json!({SERVICE_NAME_LABEL: key.1, MANAGED_BY_LABEL: MANAGED_BY});
    if let Some(gw) = svc.pointer("/metadata/labels").and_then(|l| l.get(PROXY_NAME_LABEL)) {
        labels[PROXY_NAME_LABEL] = gw.clone();
    }
    let mut out = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": key.0,
            "labels": labels,
            "annotations": {ENDPOINT_IDS: serde_json::to_string(&ids).unwrap_or_default()},
        },
        "addressType": if v4 { "IPv4" } else { "IPv6" },
        "endpoints": endpoints,
        "ports": ports,
    });
    if !owners.is_empty() {
        out["metadata"]["ownerReferences"] = Json::Array(owners);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;

    fn gateway() -> Json {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "sllb-a", "namespace": "t"},
            "spec": {"gatewayClassName": "meridio-experiment/stateless-load-balancer", "infrastructure": {"annotations": {
                GATEWAY_NETWORKS: r#"[{"name":"macvlan-nad-1","interface":"net1"}]"#,
                GATEWAY_SUBNETS: r#"["169.111.100.0/24", "fd00:100::/64"]"#}}}})
    }

    fn service(limit: Option<&str>) -> Json {
        let mut s = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "svc", "namespace": "t", "uid": "uid-svc", "labels": {PROXY_NAME_LABEL: "sllb-a"}},
            "spec": {"clusterIP": "None", "selector": {"app": "web", DUMMY_SELECTOR: "true"}}});
        if let Some(l) = limit {
            s["metadata"]["annotations"] = json!({ENDPOINT_LIMIT: l});
        }
        s
    }

    /// A ready pod `name` created at second `at`, on `net` with `ips`.
    fn pod(name: &str, at: u32, net: &str, ips: &[&str]) -> Json {
        let status = json!([
            {"name": "cbr0", "interface": "eth0", "ips": ["10.244.0.9"], "default": true},
            {"name": net, "interface": "net1", "ips": ips},
        ]);
        json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "t", "uid": format!("uid-{name}"), "creationTimestamp": format!("2025-01-01T00:00:{at:02}Z"),
                "labels": {"app": "web"}, "annotations": {NETWORK_STATUS: status.to_string()}},
            "spec": {"nodeName": "node-1"},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn store(objs: &[Json]) -> Store {
        let mut s = Store::default();
        for o in objs {
            s.apply(o.clone());
        }
        s
    }

    fn key() -> Key {
        ("t".to_owned(), "svc".to_owned())
    }

    fn run(s: &Store, svc: &Json) -> ServiceSlices {
        service_slices(s, &key(), svc, &gateway_networks(&gateway()).unwrap(), 32)
    }

    fn ids_of(slice: &Json) -> BTreeMap<String, u32> {
        serde_json::from_str(slice["metadata"]["annotations"][ENDPOINT_IDS].as_str().unwrap()).unwrap()
    }

    /// Writes the slices into the store, as the API would hold them.
    fn write(s: &mut Store, out: &ServiceSlices) {
        let old: Vec<Key> = owned_slices(s, &key()).map(|o| (o["metadata"]["namespace"].as_str().unwrap().into(), o["metadata"]["name"].as_str().unwrap().into())).collect();
        for k in old {
            s.delete("EndpointSlice", &k);
        }
        for sl in out.slices.values() {
            s.apply(sl.clone());
        }
    }

    #[test]
    fn selected_pods_on_the_network_become_endpoints_with_identifiers() {
        let s = store(&[
            pod("b", 2, "t/macvlan-nad-1", &["169.111.100.3"]),
            pod("a", 1, "macvlan-nad-1", &["169.111.100.2/24"]),
        ]);
        let out = run(&s, &service(None));
        assert!(out.ignored.is_empty(), "{:?}", out.ignored);
        let sl = &out.slices["svc-sluice-v4"];
        assert_eq!(ids_of(sl), [("169.111.100.2".to_owned(), 0), ("169.111.100.3".to_owned(), 1)].into());
        assert_eq!(sl["addressType"], "IPv4");
        assert_eq!(sl["metadata"]["labels"][SERVICE_NAME_LABEL], "svc");
        assert_eq!(sl["metadata"]["labels"][MANAGED_BY_LABEL], MANAGED_BY);
        assert_eq!(sl["metadata"]["ownerReferences"][0]["uid"], "uid-svc");
        assert_eq!(sl["endpoints"][0]["targetRef"]["name"], "a");
        assert_eq!(sl["endpoints"][0]["conditions"], json!({"ready": true, "serving": true, "terminating": false}));
        // The API's own type reads it.
        let typed: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(sl.clone()).unwrap();
        assert_eq!(typed.endpoints.len(), 2);
    }

    #[test]
    fn pods_without_the_network_or_outside_the_subnets_are_ignored_with_a_reason() {
        let mut no_status = pod("c", 3, "x", &[]);
        no_status["metadata"]["annotations"] = json!({});
        let mut other_app = pod("d", 4, "macvlan-nad-1", &["169.111.100.9"]);
        other_app["metadata"]["labels"]["app"] = json!("db");
        let mut wrong_iface = pod("e", 5, "macvlan-nad-1", &["169.111.100.8"]);
        wrong_iface["metadata"]["annotations"][NETWORK_STATUS] = json!(json!([{"name": "t/macvlan-nad-1", "interface": "net7", "ips": ["169.111.100.8"]}]).to_string());
        let mut done = pod("f", 6, "macvlan-nad-1", &["169.111.100.7"]);
        done["status"]["phase"] = json!("Succeeded");
        let s = store(&[
            pod("a", 1, "macvlan-nad-1", &["169.111.100.2"]),
            pod("b", 2, "other-net", &["169.111.100.3"]),
            pod("g", 7, "macvlan-nad-1", &["169.111.200.3"]),
            no_status,
            other_app,
            wrong_iface,
            done,
        ]);
        let out = run(&s, &service(None));
        let reasons: Vec<(&str, &str)> = out.ignored.iter().map(|i| (i.pod.as_str(), i.reason)).collect();
        assert_eq!(reasons, vec![("b", "NotOnNetwork"), ("c", "NoNetworkStatus"), ("e", "NotOnNetwork"), ("f", "Finished"), ("g", "OutsideSubnets")]);
        let g = out.ignored.iter().find(|i| i.pod == "g").unwrap();
        assert_eq!(g.message, "no address in the Gateway's subnet(s) 169.111.100.0/24, fd00:100::/64 (has 169.111.200.3)");
        assert_eq!(ids_of(&out.slices["svc-sluice-v4"]), [("169.111.100.2".to_owned(), 0)].into());
    }

    #[test]
    fn dual_stack_pods_give_one_slice_per_family_with_unique_identifiers() {
        let s = store(&[
            pod("a", 1, "macvlan-nad-1", &["169.111.100.2", "fd00:100::2", "fd00:100::22"]),
            pod("b", 2, "macvlan-nad-1", &["fd00:100::3"]),
        ]);
        let out = run(&s, &service(None));
        assert_eq!(out.slices.keys().collect::<Vec<_>>(), vec!["svc-sluice-v4", "svc-sluice-v6"]);
        assert_eq!(ids_of(&out.slices["svc-sluice-v4"]), [("169.111.100.2".to_owned(), 0)].into());
        assert_eq!(ids_of(&out.slices["svc-sluice-v6"]), [("fd00:100::2".to_owned(), 1), ("fd00:100::3".to_owned(), 2)].into());
        assert_eq!(out.slices["svc-sluice-v6"]["addressType"], "IPv6");
    }

    #[test]
    fn identifiers_survive_updates_and_restarts_and_are_freed_by_leaving() {
        let mut s = store(&[
            pod("a", 1, "macvlan-nad-1", &["169.111.100.2"]),
            pod("b", 2, "macvlan-nad-1", &["169.111.100.3"]),
            pod("c", 3, "macvlan-nad-1", &["169.111.100.4"]),
        ]);
        let first = run(&s, &service(None));
        write(&mut s, &first);
        // b leaves; a newer pod comes: it gets b's identifier, nobody else moves.
        s.delete("Pod", &("t".into(), "b".into()));
        s.apply(pod("d", 9, "macvlan-nad-1", &["169.111.100.5"]));
        let second = run(&s, &service(None));
        assert_eq!(
            ids_of(&second.slices["svc-sluice-v4"]),
            [("169.111.100.2".to_owned(), 0), ("169.111.100.4".to_owned(), 2), ("169.111.100.5".to_owned(), 1)].into()
        );
        write(&mut s, &second);
        // A restarted controller has only the store: the same answer.
        let again = run(&s, &service(None));
        assert_eq!(again.slices, second.slices);
        // An older pod arriving later does not take anyone's identifier.
        s.apply(pod("z", 0, "macvlan-nad-1", &["169.111.100.9"]));
        let third = run(&s, &service(None));
        assert_eq!(ids_of(&third.slices["svc-sluice-v4"])["169.111.100.9"], 3);
    }

    #[test]
    fn a_full_service_takes_no_more_endpoints_and_says_so() {
        let mut s = store(&[pod("a", 1, "macvlan-nad-1", &["169.111.100.2"]), pod("b", 2, "macvlan-nad-1", &["169.111.100.3"])]);
        let out = run(&s, &service(Some("1")));
        assert_eq!(out.full, Some(1));
        assert_eq!(ids_of(&out.slices["svc-sluice-v4"]), [("169.111.100.2".to_owned(), 0)].into());
        assert_eq!(out.ignored.len(), 1);
        assert_eq!((out.ignored[0].pod.as_str(), out.ignored[0].reason), ("b", "ServiceFull"));
        assert!(out.ignored[0].message.contains("all 1 endpoint identifiers are taken"), "{}", out.ignored[0].message);
        write(&mut s, &out);
        // The first leaves: the waiting one gets in.
        s.delete("Pod", &("t".into(), "a".into()));
        let out = run(&s, &service(Some("1")));
        assert_eq!(out.full, None);
        assert_eq!(ids_of(&out.slices["svc-sluice-v4"]), [("169.111.100.3".to_owned(), 0)].into());
        // A wrong limit: the Service is not handled.
        assert!(run(&s, &service(Some("0"))).invalid.unwrap().contains("is not a number in 1..=65536"));
    }

    #[test]
    fn readiness_and_termination_come_from_the_pod() {
        let mut a = pod("a", 1, "macvlan-nad-1", &["169.111.100.2"]);
        a["status"]["conditions"][0]["status"] = json!("False");
        let mut b = pod("b", 2, "macvlan-nad-1", &["169.111.100.3"]);
        b["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:10:00Z");
        let out = run(&store(&[a, b]), &service(None));
        let eps = &out.slices["svc-sluice-v4"]["endpoints"];
        assert_eq!(eps[0]["conditions"], json!({"ready": false, "serving": false, "terminating": false}));
        assert_eq!(eps[1]["conditions"], json!({"ready": false, "serving": true, "terminating": true}));
    }

    #[test]
    fn no_endpoint_gives_one_empty_slice_and_many_give_chunks_by_identifier() {
        let out = run(&store(&[]), &service(None));
        assert_eq!(out.slices["svc-sluice-v4"]["endpoints"], json!([]));
        assert_eq!(ids_of(&out.slices["svc-sluice-v4"]), BTreeMap::new());
        let pods: Vec<Json> = (0..1005u32).map(|i| pod(&format!("p{i:04}"), 1, "macvlan-nad-1", &[&format!("fd00:100::{:x}", i + 1)])).collect();
        let out = service_slices(&store(&pods), &key(), &service(Some("2000")), &gateway_networks(&gateway()).unwrap(), 32);
        assert_eq!(out.slices.keys().collect::<Vec<_>>(), vec!["svc-sluice-v6", "svc-sluice-v6-2"]);
        assert_eq!(out.slices["svc-sluice-v6"]["endpoints"].as_array().unwrap().len(), 1000);
        assert_eq!(ids_of(&out.slices["svc-sluice-v6-2"]).values().copied().collect::<Vec<_>>(), vec![1000, 1001, 1002, 1003, 1004]);
    }

    #[test]
    fn gateway_annotations_are_checked() {
        let mut gw = gateway();
        let nets = gateway_networks(&gw).unwrap();
        assert_eq!(nets.networks, vec![Network { name: "t/macvlan-nad-1".into(), interface: Some("net1".into()) }]);
        gw["spec"]["infrastructure"]["annotations"][GATEWAY_SUBNETS] = json!(r#"["169.111.100.0/33"]"#);
        assert_eq!(gateway_networks(&gw).unwrap_err().to_string(), "meridio-experiment/network-subnets: \"169.111.100.0/33\": length 33 is more than 32");
        gw["spec"]["infrastructure"]["annotations"][GATEWAY_NETWORKS] = json!("[{");
        assert!(gateway_networks(&gw).unwrap_err().to_string().starts_with("meridio-experiment/networks: not JSON"));
        assert!(Cidr::parse("10.0.0.0/8").unwrap().contains("10.9.9.9".parse().unwrap()));
        assert!(!Cidr::parse("10.0.0.0/8").unwrap().contains("11.0.0.1".parse().unwrap()));
        assert!(Cidr::parse("::/0").unwrap().contains("fd00::1".parse().unwrap()));
    }
}
