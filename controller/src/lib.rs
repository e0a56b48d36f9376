//! `sluice-controller`: the design's Controller-Manager, a process of its
//! own, not linked to DPDK (it shares only `sluice-core` with the
//! appliance). For the Gateways of its GatewayClass it keeps
//! (1) the EndpointSlices of their Services, built from the pods'
//! addresses on the Gateways' secondary networks, each endpoint with an
//! identifier that never changes while it stays ([`slices`], [`ids`]), and
//! (2) each Gateway's SLLBR Deployment, from the operator's Resource
//! Template and the Gateway's parametersRef ([`gateway`]).
//!
//! Deciding is a pure function of the objects ([`plan`] over a [`Store`]):
//! the same code runs on a directory of manifests (`--dry-run`,
//! [`dryrun`]) and against an API server ([`client`]), where one replica
//! at a time writes, the holder of a Lease ([`lease`]).
//!
//! Invariants:
//! - identifiers are kept in each Service's `sluice.io/endpoint-ids`
//!   annotation (written before the slices that use them) and read back
//!   from it and from the slices, so a restart, a new leader or a Gateway
//!   deleted and re-created gives every endpoint the identifier it had;
//! - what this controller owns is marked by labels
//!   ([`MANAGED_BY_LABEL`] on slices, [`gateway::APP_MANAGED_BY_LABEL`] and
//!   [`gateway::GATEWAY_LABEL`] on Deployments) and owner references; it
//!   deletes only what it owns and no longer wants;
//! - a wrong object (a Gateway's bad annotations or parametersRef, a
//!   Service's bad limit) freezes only what depends on it: its slices or
//!   Deployment stay as they are, and a condition or an event says why.
//!
//! The Gateway's `Accepted` and `Programmed` conditions and its addresses
//! are the appliance's (its Kubernetes source); the controller writes
//! its own, domain-prefixed ([`COND_ACCEPTED`], [`COND_PROGRAMMED`],
//! [`COND_ENDPOINTS`]), under its own field manager, so the two writers
//! never undo each other.

#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
// No function over 80 lines (clippy.toml's threshold), tests aside.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod cli;
pub mod client;
pub mod dryrun;
pub mod gateway;
mod ids;
pub mod lease;
mod slices;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value as Json};

use sluice_core::config::kubernetes::DEFAULT_GATEWAY_CLASS;
use sluice_core::config::manifests::PROXY_NAME_LABEL;
use gateway::{ParametersError, SllbrConfig, Template, TemplateError};
use slices::Ignored;

/// The managed-by label of the EndpointSlices (Kubernetes' convention).
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Its value, and that of the Deployments' managed-by label.
pub const MANAGED_BY: &str = "sluice-controller.sluice.io";
/// The field manager of every write.
pub const FIELD_MANAGER: &str = "sluice-controller";
/// The Gateway's configuration is read (parametersRef, networks, subnets).
pub const COND_ACCEPTED: &str = "sluice.io/ControllerAccepted";
/// The SLLBR Deployment is there with an available replica.
pub const COND_PROGRAMMED: &str = "sluice.io/SLLBRProgrammed";
/// Every pod the Gateway's Services select has an endpoint identifier:
/// none is left out for a network reason and no Service is full.
pub const COND_ENDPOINTS: &str = "sluice.io/EndpointsAdmitted";
/// Default endpoint limit of a Service without `sluice.io/endpoint-limit`
/// (the appliance's default).
pub const DEFAULT_LIMIT: u32 = 32;

/// `(namespace, name)`.
pub type Key = (String, String);

/// The objects the controller sees, by kind then key, as JSON (with
/// `kind` and `apiVersion`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Store {
    by_kind: BTreeMap<String, BTreeMap<Key, Json>>,
}

fn key_of(obj: &Json) -> Key {
    let m = |k: &str| obj.pointer(&format!("/metadata/{k}")).and_then(Json::as_str).unwrap_or("").to_owned();
    let ns = m("namespace");
    (if ns.is_empty() { "default".to_owned() } else { ns }, m("name"))
}

impl Store {
    /// Adds or replaces an object (its kind from `kind`).
    pub fn apply(&mut self, obj: Json) {
        let kind = obj["kind"].as_str().unwrap_or("").to_owned();
        self.by_kind.entry(kind).or_default().insert(key_of(&obj), obj);
    }

    /// Removes an object.
    pub fn delete(&mut self, kind: &str, key: &Key) {
        if let Some(m) = self.by_kind.get_mut(kind) {
            m.remove(key);
        }
    }

    /// Replaces every object of `kind`.
    pub fn replace(&mut self, kind: &str, objs: Vec<Json>) {
        self.by_kind.insert(kind.to_owned(), objs.into_iter().map(|o| (key_of(&o), o)).collect());
    }

    /// The objects of `kind`.
    pub fn of<'a>(&'a self, kind: &str) -> impl Iterator<Item = (&'a Key, &'a Json)> + 'a {
        self.by_kind.get(kind).into_iter().flat_map(BTreeMap::iter)
    }

    /// One object.
    pub fn get(&self, kind: &str, ns: &str, name: &str) -> Option<&Json> {
        self.by_kind.get(kind)?.get(&(ns.to_owned(), name.to_owned()))
    }

    /// How many objects of `kind`.
    pub fn count(&self, kind: &str) -> usize {
        self.by_kind.get(kind).map_or(0, BTreeMap::len)
    }
}

/// How the controller decides.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The GatewayClass whose Gateways are handled.
    pub gateway_class: String,
    /// The endpoint limit of a Service that names none.
    pub default_limit: u32,
    /// The Resource Template of the SLLBR Deployments.
    pub template: Template,
}

impl Settings {
    /// The design's class, the appliance's default limit, the built-in template.
    pub fn defaults() -> Result<Settings, TemplateError> {
        Ok(Settings { gateway_class: DEFAULT_GATEWAY_CLASS.to_owned(), default_limit: DEFAULT_LIMIT, template: Template::default_template()? })
    }
}

/// A Service that admits no more endpoints.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Full {
    /// Its limit.
    pub limit: u32,
    /// The pods left out.
    pub pods: Vec<String>,
}

/// What is known of one Gateway of our class.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GatewayReport {
    /// Why its configuration cannot be read (its Deployment and its
    /// Services' slices are then left as they are).
    pub invalid: Option<String>,
    /// Its Deployment.
    pub deployment: Option<Key>,
    /// Its Services that are full, by name.
    pub full: BTreeMap<String, Full>,
    /// Its Services that are not handled, and why.
    pub invalid_services: BTreeMap<String, String>,
    /// Pods its Services select that are not endpoints for a network
    /// reason (no Multus status, not on the Gateway's networks, outside
    /// its subnets), by Service: `pod: reason: why`.
    pub left_out: BTreeMap<String, Vec<String>>,
}

/// Everything the controller wants, from one look at the objects.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The EndpointSlices to hold.
    pub slices: BTreeMap<Key, Json>,
    /// The Deployments to hold.
    pub deployments: BTreeMap<Key, Json>,
    /// Services whose slices are left as they are.
    pub frozen_services: BTreeSet<Key>,
    /// Gateways whose Deployment is left as it is.
    pub frozen_gateways: BTreeSet<Key>,
    /// The Gateways of our class.
    pub gateways: BTreeMap<Key, GatewayReport>,
    /// Pods selected by a Service that are not its endpoints, and why.
    pub ignored: Vec<Ignored>,
    /// The identifiers each Service keeps in its `sluice.io/endpoint-ids`
    /// annotation (written before its slices, so that they outlive them).
    pub service_ids: BTreeMap<Key, String>,
}

/// Whether `gw` is of the class handled.
pub fn ours(gw: &Json, settings: &Settings) -> bool {
    gw.pointer("/spec/gatewayClassName").and_then(Json::as_str) == Some(settings.gateway_class.as_str())
}

/// What the controller wants, given `store`.
pub fn plan(store: &Store, settings: &Settings) -> Plan {
    let mut out = Plan::default();
    for (gkey, gw) in store.of("Gateway") {
        if !ours(gw, settings) {
            continue;
        }
        let mut report = GatewayReport::default();
        let config: Result<Option<SllbrConfig>, ParametersError> = gateway::gateway_config(store, gw);
        let nets = slices::gateway_networks(gw);
        let services: Vec<(&Key, &Json)> = store
            .of("Service")
            .filter(|(k, s)| k.0 == gkey.0 && s.pointer("/metadata/labels").and_then(|l| l.get(PROXY_NAME_LABEL)).and_then(Json::as_str) == Some(gkey.1.as_str()))
            .collect();
        let dkey = (gkey.0.clone(), settings.template.name_for(&gkey.1, &gkey.0));
        match &config {
            Ok(c) => {
                out.deployments.insert(dkey.clone(), gateway::deployment(&settings.template, gw, c.as_ref()));
            }
            Err(e) => {
                report.invalid = Some(e.to_string());
                out.frozen_gateways.insert(gkey.clone());
            }
        }
        report.deployment = Some(dkey);
        match nets {
            Ok(nets) => {
                for (skey, svc) in services {
                    let s = slices::service_slices(store, skey, svc, &nets, settings.default_limit);
                    if let Some(why) = s.invalid {
                        report.invalid_services.insert(skey.1.clone(), why);
                        out.frozen_services.insert(skey.clone());
                        continue;
                    }
                    if let Some(limit) = s.full {
                        let pods = s.ignored.iter().filter(|i| i.reason == "ServiceFull").map(|i| i.pod.clone()).collect();
                        report.full.insert(skey.1.clone(), Full { limit, pods });
                    }
                    for i in s.ignored.iter().filter(|i| matches!(i.reason, "NoNetworkStatus" | "NotOnNetwork" | "OutsideSubnets")) {
                        report.left_out.entry(skey.1.clone()).or_default().push(format!("{}: {}: {}", i.pod, i.reason, i.message));
                    }
                    for (name, slice) in s.slices {
                        out.slices.insert((skey.0.clone(), name), slice);
                    }
                    out.service_ids.insert(skey.clone(), s.ids);
                    out.ignored.extend(s.ignored);
                }
            }
            Err(e) => {
                let why = match report.invalid.take() {
                    Some(other) => format!("{other}; {e}"),
                    None => e.to_string(),
                };
                report.invalid = Some(why);
                out.frozen_services.extend(services.into_iter().map(|(k, _)| k.clone()));
            }
        }
        out.gateways.insert(gkey.clone(), report);
    }
    out
}

/// One condition, keeping the observed transition time when its status,
/// reason and message are unchanged (so replicas and restarts write the
/// same bytes).
pub fn condition(observed: &Json, t: &str, ok: bool, reason: &str, message: &str, generation: &Json, now: &str) -> Json {
    let status = if ok { "True" } else { "False" };
    let message = truncate(message, CONDITION_MESSAGE_MAX);
    let message = message.as_str();
    let before = observed.as_array().and_then(|c| c.iter().find(|c| c["type"] == t));
    let since = match before {
        Some(b) if b["status"] == status && b["reason"] == reason && b["message"] == message => b["lastTransitionTime"].as_str().unwrap_or(now).to_owned(),
        _ => now.to_owned(),
    };
    json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": since, "observedGeneration": generation})
}

/// The controller's conditions on Gateway `gw`, as of `now` (RFC 3339).
pub fn gateway_conditions(store: &Store, gw: &Json, report: &GatewayReport, now: &str) -> Vec<Json> {
    let observed = gw.pointer("/status/conditions").cloned().unwrap_or(Json::Null);
    let generation = gw.pointer("/metadata/generation").cloned().unwrap_or(Json::Null);
    let cond = |t: &str, ok: bool, reason: &str, message: String| condition(&observed, t, ok, reason, &message, &generation, now);
    let accepted = match &report.invalid {
        None => cond(COND_ACCEPTED, true, "Accepted", "the Gateway's configuration is read".into()),
        Some(why) => cond(COND_ACCEPTED, false, "InvalidParameters", format!("{why} (what was deployed for it stays as it is)")),
    };
    let dep = report.deployment.as_ref().and_then(|k| store.get("Deployment", &k.0, &k.1));
    let dname = report.deployment.as_ref().map(|k| k.1.clone()).unwrap_or_default();
    let programmed = match dep {
        None => cond(COND_PROGRAMMED, false, "Pending", format!("Deployment {dname} is not there yet")),
        Some(d) => {
            let want = d.pointer("/spec/replicas").and_then(Json::as_i64).unwrap_or(1);
            let available = d.pointer("/status/availableReplicas").and_then(Json::as_i64).unwrap_or(0);
            if available > 0 || want == 0 {
                cond(COND_PROGRAMMED, true, "Programmed", format!("Deployment {dname}: {available} of {want} replica(s) available"))
            } else {
                cond(COND_PROGRAMMED, false, "Pending", format!("Deployment {dname}: no replica available yet (of {want})"))
            }
        }
    };
    let mut problems: Vec<String> = report
        .full
        .iter()
        .map(|(s, f)| format!("Service {s} is full ({} endpoint identifiers; left out: {})", f.limit, f.pods.join(", ")))
        .collect();
    problems.extend(report.invalid_services.iter().map(|(s, why)| format!("Service {s} is not handled: {why}")));
    let left_out: Vec<String> = report.left_out.iter().map(|(s, pods)| format!("Service {s} leaves out pods it selects: {}", pods.join("; "))).collect();
    let endpoints = if problems.is_empty() && left_out.is_empty() {
        cond(COND_ENDPOINTS, true, "Admitted", "every endpoint of the Gateway's Services has an identifier".into())
    } else if problems.is_empty() {
        cond(COND_ENDPOINTS, false, "PodsLeftOut", left_out.join("; "))
    } else if report.full.is_empty() {
        cond(COND_ENDPOINTS, false, "InvalidService", problems.iter().chain(&left_out).cloned().collect::<Vec<_>>().join("; "))
    } else {
        cond(COND_ENDPOINTS, false, "EndpointLimitReached", problems.iter().chain(&left_out).cloned().collect::<Vec<_>>().join("; "))
    };
    vec![accepted, programmed, endpoints]
}

/// The controller's conditions as a Gateway shows them (to tell whether
/// writing would change anything).
pub fn observed_conditions(gw: &Json) -> Vec<Json> {
    gw.pointer("/status/conditions")
        .and_then(Json::as_array)
        .map(|c| c.iter().filter(|c| matches!(c["type"].as_str(), Some(COND_ACCEPTED | COND_PROGRAMMED | COND_ENDPOINTS))).cloned().collect())
        .unwrap_or_default()
}

/// Longest condition message (the API's bound).
pub const CONDITION_MESSAGE_MAX: usize = 32768;

/// `s` cut to at most `max` bytes (on a character boundary, with `...`).
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max.saturating_sub(3);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &s[..cut])
}

/// Whether every field of `want` is in `have` with the same value (arrays:
/// the same length, element by element): what an API server that fills in
/// defaults still agrees with.
pub fn is_subset(want: &Json, have: &Json) -> bool {
    match (want, have) {
        (Json::Object(w), Json::Object(h)) => w.iter().all(|(k, v)| match h.get(k) {
            Some(x) => is_subset(v, x),
            // An API server leaves out what is empty.
            None => v.is_null() || v.as_array().is_some_and(Vec::is_empty) || v.as_object().is_some_and(serde_json::Map::is_empty),
        }),
        (Json::Array(w), Json::Array(h)) => w.len() == h.len() && w.iter().zip(h).all(|(a, b)| is_subset(a, b)),
        (Json::Number(a), Json::Number(b)) => a.as_f64() == b.as_f64(),
        (Json::Array(w), Json::Null) => w.is_empty(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subset_tolerates_defaults_but_not_changes() {
        let want = json!({"a": 1, "b": [{"x": "y"}], "c": []});
        assert!(is_subset(&want, &json!({"a": 1, "b": [{"x": "y", "z": 2}], "d": true})));
        assert!(!is_subset(&want, &json!({"a": 2, "b": [{"x": "y"}]})));
        assert!(!is_subset(&want, &json!({"a": 1, "b": [{"x": "y"}, {"x": "w"}]})));
        assert!(!is_subset(&json!({"a": 1}), &json!({})));
        assert!(!is_subset(&json!({"a": [1]}), &json!({})));
    }

    #[test]
    fn long_messages_are_cut_within_the_apis_bounds() {
        let long = "é".repeat(20_000);
        let c = condition(&Json::Null, COND_ENDPOINTS, false, "EndpointLimitReached", &long, &json!(1), "T");
        let m = c["message"].as_str().unwrap();
        assert!(m.len() <= CONDITION_MESSAGE_MAX && m.ends_with("..."), "{}", m.len());
        assert_eq!(truncate("short", 10), "short");
    }

    #[test]
    fn a_condition_keeps_its_time_unless_it_changes() {
        let before = json!([{"type": COND_ACCEPTED, "status": "True", "reason": "Accepted", "message": "m", "lastTransitionTime": "T0"}]);
        let gen = json!(3);
        assert_eq!(condition(&before, COND_ACCEPTED, true, "Accepted", "m", &gen, "T1")["lastTransitionTime"], "T0");
        assert_eq!(condition(&before, COND_ACCEPTED, false, "InvalidParameters", "m", &gen, "T1")["lastTransitionTime"], "T1");
    }
}
