//! From the watched objects to a desired state and back to their status,
//! without a cluster: the part of the Kubernetes source that decides.
//!
//! [`Sync::plan`] maps the objects through the one mapping of
//! [`crate::config::manifests`] (objects whose own fields are wrong, and
//! what depends on them, are left out), applies the algorithm rules
//! (`global` or `annotation`; a live Service keeps its algorithm unless
//! changes are allowed) and gives the desired state to send. When the
//! reconciler refuses it, [`Sync::refused`] finds the objects the problems
//! are about by their origin (`kubernetes: Kind/namespace/name`) and
//! leaves them out for the next try; the caller tries again a bounded
//! number of times. [`Sync::status`] gives the status of the Gateway and
//! of each of its routes from the outcome.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value as Json};
use sluice_dataplane::service::Algorithm;

use crate::config::kubernetes::{AlgorithmConfiguration, KubeConfig};
use crate::config::manifests::{self, Kind, Mapping, Object, Reason, Refusal, Scope};
use crate::model::{Defaults, Desired};
use crate::problem::Problem;

/// The controller name written in route status (the design's GatewayClass
/// controller).
pub(crate) const CONTROLLER: &str = "meridio-experiment/stateless-load-balancer";
/// Longest condition message (the API's limit).
const MESSAGE_MAX: usize = 32768;
/// Most entries of a Gateway's `status.addresses` (Gateway API's limit).
pub(crate) const MAX_ADDRESSES: usize = 16;
/// The message of the Gateway's `Accepted` condition this appliance writes.
const ACCEPTED_MESSAGE: &str = "served by Sluice";
/// How a condition says the algorithm of a live Service was kept.
pub(crate) const SETTINGS_CONDITION: &str = "sluice.io/ServiceSettings";

/// The kinds watched, in the order they are listed in status.
pub const KINDS: [&str; 5] = ["Gateway", "L34Route", "Service", "EndpointSlice", "GatewayRouter"];

/// The objects watched, by kind then name, as the API gave them (with
/// `apiVersion` and `kind` set).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Objects {
    /// Kind → name → object.
    pub(crate) by_kind: BTreeMap<&'static str, BTreeMap<String, Json>>,
}

impl Objects {
    /// Adds or replaces an object of `kind`.
    pub(crate) fn apply(&mut self, kind: &'static str, obj: Json) {
        let name = obj.pointer("/metadata/name").and_then(Json::as_str).unwrap_or("").to_owned();
        self.by_kind.entry(kind).or_default().insert(name, obj);
    }

    /// Removes an object of `kind`.
    pub(crate) fn delete(&mut self, kind: &'static str, name: &str) {
        if let Some(m) = self.by_kind.get_mut(kind) {
            m.remove(name);
        }
    }

    /// Replaces every object of `kind` (after a list).
    pub(crate) fn replace(&mut self, kind: &'static str, objs: BTreeMap<String, Json>) {
        self.by_kind.insert(kind, objs);
    }

    /// The objects of `kind`.
    pub(crate) fn of(&self, kind: &str) -> impl Iterator<Item = &Json> {
        self.by_kind.get(kind).into_iter().flat_map(BTreeMap::values)
    }

    /// How many objects of `kind`.
    pub(crate) fn count(&self, kind: &str) -> usize {
        self.by_kind.get(kind).map_or(0, BTreeMap::len)
    }

    /// The objects as the mapping reads them.
    pub(crate) fn for_mapping(&self) -> Vec<Object> {
        KINDS.iter().flat_map(|k| self.of(k)).map(Object::from_api).collect()
    }
}

/// What became of the last state sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing sent yet.
    Pending(String),
    /// Served.
    Applied,
    /// Not sent or refused as a whole (the last served state stays): why.
    Refused(Vec<Problem>),
}

/// One attempt: the mapping and what it sends.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The objects, mapped.
    pub(crate) mapping: Mapping,
    /// What to send (the objects not left out).
    pub(crate) desired: Desired,
    /// Services whose algorithm was kept, by origin: why.
    pub(crate) kept: BTreeMap<String, String>,
}

/// The decisions of the Kubernetes source, kept between changes.
#[derive(Debug)]
pub(crate) struct Sync {
    cfg: KubeConfig,
    defaults: Defaults,
    /// The algorithm each live Service was first served with, by uid
    /// (then name): a change is refused unless allowed.
    pins: BTreeMap<String, Algorithm>,
    /// Objects the reconciler refused in this round of tries.
    excluded: BTreeMap<String, Refusal>,
    /// What is being served (the last state the reconciler applied).
    served: Desired,
    /// Routes served, by origin.
    served_routes: BTreeSet<String>,
    /// What became of the last state.
    pub(crate) outcome: Outcome,
}

impl Sync {
    /// Nothing served yet.
    pub(crate) fn new(cfg: KubeConfig, defaults: Defaults) -> Sync {
        Sync {
            cfg,
            defaults,
            pins: BTreeMap::new(),
            excluded: BTreeMap::new(),
            served: Desired::default(),
            served_routes: BTreeSet::new(),
            outcome: Outcome::Pending("nothing listed from the API yet".into()),
        }
    }

    /// What is being served.
    pub(crate) fn served(&self) -> &Desired {
        &self.served
    }

    /// Starts a new round of tries (the objects changed): every object is
    /// given its chance again.
    pub(crate) fn new_round(&mut self) {
        self.excluded.clear();
    }

    /// Maps `objects` with what the reconciler refused in this round left out.
    pub(crate) fn plan(&self, objects: &Objects) -> Plan {
        let scope = Scope {
            gateway: &self.cfg.gateway,
            gateway_class: Some(&self.cfg.gateway_class),
            algorithm_annotations: self.cfg.algorithm_configuration == AlgorithmConfiguration::Annotation,
        };
        let whole = format!("kubernetes: namespace {}", self.cfg.namespace);
        let among = format!("the Gateways of namespace {:?}", self.cfg.namespace);
        let mapping = manifests::map(&objects.for_mapping(), &scope, &self.excluded, &whole, &among);
        let mut desired = mapping.desired();
        let mut kept = BTreeMap::new();
        if !self.cfg.allow_algorithm_change {
            let uids = uids(objects);
            for s in &mut desired.services {
                let now = s.algorithm.unwrap_or(self.defaults.algorithm);
                let Some(&pinned) = pin_key(&uids, &s.name).and_then(|k| self.pins.get(&k)) else { continue };
                if pinned != now {
                    kept.insert(s.origin.file.to_string(), format!(
                        "the load-balancing algorithm of a live Service does not change: still {pinned}, not {now} \
                         (recreate the Service to change it, or set kubernetes.allowAlgorithmChange)"
                    ));
                    s.algorithm = Some(pinned);
                }
            }
        }
        Plan { mapping, desired, kept }
    }

    /// The reconciler refused `plan` with `problems`: leaves out the
    /// objects they are about. False when none of them is one of ours
    /// (trying again would not help).
    pub(crate) fn refused(&mut self, plan: &Plan, problems: &[Problem]) -> bool {
        let mut by_origin: BTreeMap<&str, Vec<Problem>> = BTreeMap::new();
        for p in problems {
            if plan.mapping.get(&p.file).is_some_and(|m| m.refusal.is_none()) {
                by_origin.entry(p.file.as_str()).or_default().push(p.clone());
            }
        }
        if by_origin.is_empty() {
            return false;
        }
        for (origin, problems) in by_origin {
            self.excluded.insert(origin.to_owned(), Refusal { reason: reason_of(&problems), problems });
        }
        true
    }

    /// Why the Gateway is not this appliance's to serve, when it is not:
    /// gone from the objects (which only a successful list or a watch's
    /// DELETED removes), or of another class.
    pub(crate) fn not_ours(&self, objects: &Objects) -> Option<String> {
        let Some(gw) = objects.by_kind.get("Gateway").and_then(|m| m.get(&self.cfg.gateway)) else {
            return Some(format!("the Gateway {:?} is gone", self.cfg.gateway));
        };
        let class = gw.pointer("/spec/gatewayClassName").and_then(Json::as_str).unwrap_or("");
        (class != self.cfg.gateway_class).then(|| format!("the Gateway {:?} has class {class:?}, not {:?}", self.cfg.gateway, self.cfg.gateway_class))
    }

    /// The objects showing status this appliance wrote for its Gateway
    /// while that Gateway is not its own (gone, or of another class): the
    /// Gateway's conditions, the routes' entries for it. Written again
    /// empty, under the same field manager, they go.
    pub(crate) fn stale_status(&self, objects: &Objects) -> Vec<(&'static str, String)> {
        if self.not_ours(objects).is_none() {
            return Vec::new();
        }
        let mut out = Vec::new();
        if let Some(gw) = objects.by_kind.get("Gateway").and_then(|m| m.get(&self.cfg.gateway)) {
            let conds = gw.pointer("/status/conditions").and_then(Json::as_array);
            if conds.is_some_and(|c| c.iter().any(|c| c["type"] == "Accepted" && c["message"] == ACCEPTED_MESSAGE)) {
                out.push(("Gateway", self.cfg.gateway.clone()));
            }
        }
        for r in objects.of("L34Route") {
            if our_parent(r).is_some_and(|p| p.pointer("/parentRef/name").and_then(Json::as_str) == Some(self.cfg.gateway.as_str())) {
                out.push(("L34Route", r.pointer("/metadata/name").and_then(Json::as_str).unwrap_or("").to_owned()));
            }
        }
        out
    }

    /// Nothing is served any more (the Gateway is not ours).
    pub(crate) fn withdrawn(&mut self) {
        self.served = Desired::default();
        self.served_routes.clear();
    }

    /// `plan` was applied: it is what is served now.
    pub(crate) fn applied(&mut self, plan: &Plan, objects: &Objects) {
        self.served = plan.desired.clone();
        self.served_routes = plan
            .mapping
            .objects
            .iter()
            .filter(|m| m.kind == Kind::Route && m.refusal.is_none())
            .map(|m| m.origin.clone())
            .collect();
        let uids = uids(objects);
        let mut pins = BTreeMap::new();
        for s in &plan.desired.services {
            if let Some(k) = pin_key(&uids, &s.name) {
                let first = self.pins.get(&k).copied().unwrap_or(s.algorithm.unwrap_or(self.defaults.algorithm));
                pins.insert(k, if self.cfg.allow_algorithm_change { s.algorithm.unwrap_or(self.defaults.algorithm) } else { first });
            }
        }
        self.pins = pins;
        self.outcome = Outcome::Applied;
    }

    /// The status of the Gateway (when it is this appliance's) and of each
    /// of its routes, by object name, as of `now` (RFC 3339).
    pub(crate) fn status(&self, objects: &Objects, plan: &Plan, now: &str) -> Statuses {
        let mut out = Statuses::default();
        let Some(gw) = objects.by_kind.get("Gateway").and_then(|m| m.get(&self.cfg.gateway)) else { return out };
        if gw.pointer("/spec/gatewayClassName").and_then(Json::as_str) != Some(self.cfg.gateway_class.as_str()) {
            return out; // another class: not ours to speak for
        }
        let mut vips: Vec<sluice_dataplane::addr::Addr> = self.served.routes.iter().flat_map(|r| r.matches.vips.iter().copied()).collect();
        vips.sort_unstable_by_key(|a| (!a.is_v4(), a.0));
        vips.dedup();
        let more = match vips.len().checked_sub(MAX_ADDRESSES) {
            Some(n) if n > 0 => format!(" ({} VIPs: status.addresses lists the first {MAX_ADDRESSES})", vips.len()),
            _ => String::new(),
        };
        vips.truncate(MAX_ADDRESSES);
        let routes: Vec<_> = plan.mapping.objects.iter().filter(|m| m.kind == Kind::Route && !m.name.is_empty()).collect();
        let refused: Vec<String> = routes.iter().filter(|m| !self.served_routes.contains(&m.origin)).map(|m| m.name.clone()).collect();
        let generation = gw.pointer("/metadata/generation").cloned().unwrap_or(Json::Null);
        let observed = gw.pointer("/status/conditions").cloned().unwrap_or(Json::Null);
        let cond = |t: &str, ok: bool, reason: &str, message: String| condition(&observed, t, ok, reason, &message, &generation, now);
        let programmed = match &self.outcome {
            Outcome::Applied if refused.is_empty() => cond("Programmed", true, "Programmed", format!("{} L34Route(s) served{more}", self.served_routes.len())),
            Outcome::Applied => cond("Programmed", true, "Programmed", format!(
                "{} L34Route(s) served{more}; left out (see their status): {}",
                self.served_routes.len(),
                refused.join(", ")
            )),
            Outcome::Pending(why) => cond("Programmed", false, "Pending", why.clone()),
            Outcome::Refused(ps) => cond("Programmed", false, "Invalid", format!(
                "the appliance refused the Gateway's objects and serves what it served before: {}",
                join(ps)
            )),
        };
        out.gateway = Some(json!({
            "addresses": vips.iter().map(|v| json!({"type": "IPAddress", "value": v.to_string()})).collect::<Vec<_>>(),
            "conditions": [cond("Accepted", true, "Accepted", ACCEPTED_MESSAGE.into()), programmed],
        }));
        for m in routes {
            let Some(obj) = objects.by_kind.get("L34Route").and_then(|r| r.get(&m.name)) else { continue };
            let generation = obj.pointer("/metadata/generation").cloned().unwrap_or(Json::Null);
            let observed = our_parent(obj).and_then(|p| p.get("conditions").cloned()).unwrap_or(Json::Null);
            let mut conditions = vec![if self.served_routes.contains(&m.origin) {
                condition(&observed, "Accepted", true, "Accepted", "served", &generation, now)
            } else if let Some(r) = &m.refusal {
                condition(&observed, "Accepted", false, r.reason.as_str(), &r.message(), &generation, now)
            } else {
                let why = match &self.outcome {
                    Outcome::Refused(ps) => format!("the appliance refused the state it is part of: {}", join(ps)),
                    Outcome::Pending(why) => why.clone(),
                    Outcome::Applied => "not served yet".to_owned(),
                };
                condition(&observed, "Accepted", false, "Pending", &why, &generation, now)
            }];
            if let Some(why) = m.service.as_ref().and_then(|s| plan.kept.iter().find(|(o, _)| service_name(o) == Some(s))).map(|(_, w)| w) {
                conditions.push(condition(&observed, SETTINGS_CONDITION, false, "AlgorithmChangeRefused", why, &generation, now));
            }
            out.routes.insert(m.name.clone(), json!({"parents": [{
                "parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": self.cfg.gateway},
                "controllerName": CONTROLLER,
                "conditions": conditions,
            }]}));
        }
        out
    }
}

/// The status to write: the Gateway's (addresses and conditions) and each
/// route's, by name.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Statuses {
    /// The Gateway's, when it is this appliance's.
    pub(crate) gateway: Option<Json>,
    /// Each route's.
    pub(crate) routes: BTreeMap<String, Json>,
}

/// The part of an object's observed status that [`Sync::status`] writes,
/// to tell whether writing would change anything.
pub(crate) fn observed_part(kind: &str, obj: &Json) -> Json {
    match kind {
        "Gateway" => {
            let conds: Vec<Json> = obj
                .pointer("/status/conditions")
                .and_then(Json::as_array)
                .map(|c| c.iter().filter(|c| matches!(c["type"].as_str(), Some("Accepted" | "Programmed"))).cloned().collect())
                .unwrap_or_default();
            json!({"addresses": obj.pointer("/status/addresses").cloned().unwrap_or(json!([])), "conditions": conds})
        }
        _ => match our_parent(obj) {
            Some(p) => json!({"parents": [p]}),
            None => Json::Null,
        },
    }
}

fn our_parent(route: &Json) -> Option<Json> {
    route.pointer("/status/parents")?.as_array()?.iter().find(|p| p["controllerName"] == CONTROLLER).cloned()
}

/// A condition; its transition time is the observed one when nothing
/// but the time would change, so that replicas writing the same status
/// write the same bytes.
fn condition(observed: &Json, t: &str, ok: bool, reason: &str, message: &str, generation: &Json, now: &str) -> Json {
    let status = if ok { "True" } else { "False" };
    let mut message = message.to_owned();
    if message.len() > MESSAGE_MAX {
        let mut cut = MESSAGE_MAX - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    let before = observed.as_array().and_then(|c| c.iter().find(|c| c["type"] == t));
    let since = match before {
        Some(b) if b["status"] == status && b["reason"] == reason && b["message"] == message.as_str() => {
            b["lastTransitionTime"].as_str().unwrap_or(now).to_owned()
        }
        _ => now.to_owned(),
    };
    let mut c = json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": since});
    if !generation.is_null() {
        c["observedGeneration"] = generation.clone();
    }
    c
}

fn join(ps: &[Problem]) -> String {
    ps.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

fn reason_of(problems: &[Problem]) -> Reason {
    if problems.iter().any(|p| p.message.starts_with("route to ")) {
        Reason::BackendRefused
    } else {
        Reason::Refused
    }
}

/// Service name → uid.
fn uids(objects: &Objects) -> BTreeMap<String, String> {
    objects
        .of("Service")
        .filter_map(|s| {
            let name = s.pointer("/metadata/name")?.as_str()?.to_owned();
            let uid = s.pointer("/metadata/uid").and_then(Json::as_str).unwrap_or("").to_owned();
            Some((name, uid))
        })
        .collect()
}

fn pin_key(uids: &BTreeMap<String, String>, name: &str) -> Option<String> {
    uids.get(name).map(|uid| format!("{name}/{uid}"))
}

/// The name of the Service whose origin is `origin`.
fn service_name(origin: &str) -> Option<&str> {
    origin.strip_prefix("kubernetes: Service/")?.split_once('/').map(|(_, n)| n)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::kubernetes::DEFAULT_GATEWAY_CLASS;
    use crate::model::{Model, Origin};

    fn fixtures() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sources/kube/testdata")
    }

    fn manifests_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/manifests")
    }

    fn cfg() -> KubeConfig {
        KubeConfig {
            gateway: "sllb-a".into(),
            namespace: "tenant-a".into(),
            kubeconfig: None,
            gateway_class: DEFAULT_GATEWAY_CLASS.into(),
            algorithm_configuration: AlgorithmConfiguration::Annotation,
            allow_algorithm_change: false,
        }
    }

    /// The objects of manifest files as the API would give them: in the
    /// namespace, with a uid.
    fn from_files(files: &[&Path]) -> Objects {
        let mut out = Objects::default();
        for f in files {
            let objs = if f.is_dir() {
                manifests::read_dir(f).unwrap()
            } else {
                let dir = tempdir(f);
                manifests::read_dir(&dir).unwrap()
            };
            for o in objs {
                let mut v = o.value.to_json();
                let Some(kind) = KINDS.iter().find(|k| v["kind"] == **k) else { continue };
                let name = v["metadata"]["name"].as_str().unwrap().to_owned();
                v["metadata"]["namespace"] = json!("tenant-a");
                v["metadata"]["uid"] = json!(format!("uid-{name}"));
                out.apply(kind, v);
            }
        }
        out
    }

    /// A directory holding only `file`.
    fn tempdir(file: &Path) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-kube-{}-{}", std::process::id(), file.file_stem().unwrap().to_string_lossy()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(file, dir.join(file.file_name().unwrap())).unwrap();
        dir
    }

    /// `d` without where its parts came from, in a fixed order.
    fn normal(mut d: Desired) -> Desired {
        for r in &mut d.routes {
            r.origin = Origin::default();
        }
        for s in &mut d.services {
            s.origin = Origin::default();
        }
        let mut eps = d.endpoints.to_vec();
        for e in &mut eps {
            e.origin = std::sync::Arc::default();
        }
        d.routes.sort_by(|a, b| a.name.cmp(&b.name));
        d.services.sort_by(|a, b| a.name.cmp(&b.name));
        eps.sort_by(|a, b| (&a.service, a.id).cmp(&(&b.service, b.id)));
        d.endpoints = eps.into();
        d
    }

    /// Tries `sync`'s plan with the model's checks as the reconciler would,
    /// leaving out what they refuse, until a state is accepted.
    fn settle(sync: &mut Sync, objects: &Objects) -> Plan {
        sync.new_round();
        let mut plan = sync.plan(objects);
        for _ in 0..8 {
            let mut m = Model::default();
            m.set("kubernetes", plan.desired.clone());
            match m.resolve(&Defaults::default()) {
                Ok(_) => {
                    sync.applied(&plan, objects);
                    return plan;
                }
                Err(ps) => {
                    assert!(sync.refused(&plan, &ps), "problems about no object of ours: {ps:?}");
                    plan = sync.plan(objects);
                }
            }
        }
        panic!("no state accepted after 8 tries");
    }

    fn accepted(st: &Statuses, route: &str) -> (String, String, String) {
        let c = &st.routes[route]["parents"][0]["conditions"][0];
        assert_eq!(c["type"], "Accepted");
        (c["status"].as_str().unwrap().into(), c["reason"].as_str().unwrap().into(), c["message"].as_str().unwrap().into())
    }

    const NOW: &str = "2025-06-01T12:00:00Z";

    #[test]
    fn the_same_objects_give_the_same_model_from_files_and_from_the_api() {
        let from_dir = manifests::load(&manifests_dir(), "sllb-a").unwrap();
        assert_eq!((from_dir.routes.len(), from_dir.services.len(), from_dir.endpoints.len()), (2, 1, 3));
        let objects = from_files(&[&manifests_dir()]);
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = settle(&mut sync, &objects);
        assert_eq!(normal(plan.desired.clone()), normal(from_dir));
        assert!(plan.desired.routes[0].origin.file.starts_with("kubernetes: L34Route/tenant-a/"), "{:?}", plan.desired.routes[0].origin);
    }

    #[test]
    fn wrong_objects_are_left_out_and_the_others_served() {
        // A directory holding the bad objects is refused whole, every problem listed...
        let bad = fixtures().join("bad.yaml");
        let problems = manifests::load(&tempdir(&bad), "sllb-a").unwrap_err();
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(text.iter().any(|p| p.contains("VIP 20.0.0.0/24 is not a /32")), "{text:#?}");
        assert!(text.iter().any(|p| p.contains("endpoint-limit: 0 is out of range")), "{text:#?}");

        // ...while from the API the same objects are left out one by one and
        // the rest gives exactly the model of the good objects alone.
        let objects = from_files(&[&manifests_dir(), &bad]);
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = settle(&mut sync, &objects);
        assert_eq!(normal(plan.desired.clone()), normal(manifests::load(&manifests_dir(), "sllb-a").unwrap()));

        let st = sync.status(&objects, &plan, NOW);
        assert_eq!(accepted(&st, "vip-20-0-0-1-web"), ("True".into(), "Accepted".into(), "served".into()));
        assert_eq!(accepted(&st, "vip-20-0-0-2-syn-only").0, "True");
        let (s, reason, msg) = accepted(&st, "bad-cidr");
        assert_eq!((s.as_str(), reason.as_str()), ("False", "UnsupportedValue"));
        assert_eq!(msg, "kubernetes: L34Route/tenant-a/bad-cidr: spec.destinationCIDRs[0]: VIP 20.0.0.0/24 is not a /32 or /128: a route's destinations are single addresses");
        let (s, reason, msg) = accepted(&st, "unknown-backend");
        assert_eq!((s.as_str(), reason.as_str()), ("False", "BackendNotFound"));
        assert!(msg.contains("route to an unknown service \"nope\""), "{msg}");
        let (s, reason, msg) = accepted(&st, "to-service-b");
        assert_eq!((s.as_str(), reason.as_str()), ("False", "BackendNotFound"));
        assert!(msg.contains("\"service-b\", is left out") && msg.contains("endpoint-limit: 0 is out of range"), "{msg}");
        assert!(!st.routes.contains_key("other-gateway"), "another Gateway's route gets no status from us");

        let slice = plan.mapping.get("kubernetes: EndpointSlice/tenant-a/service-a-dup").unwrap();
        let r = slice.refusal.as_ref().unwrap();
        assert_eq!(r.reason, Reason::Refused);
        assert!(r.message().contains("duplicate endpoint identifier 0 in service \"service-a\""), "{}", r.message());
        assert_eq!(plan.mapping.get("kubernetes: EndpointSlice/tenant-a/service-b-1").unwrap().refusal.as_ref().unwrap().reason, Reason::BackendRefused);

        let gw = st.gateway.unwrap();
        assert_eq!(gw["addresses"], json!([{"type": "IPAddress", "value": "20.0.0.1"}, {"type": "IPAddress", "value": "20.0.0.2"}]));
        assert_eq!(gw["conditions"][0]["type"], "Accepted");
        assert_eq!(gw["conditions"][1]["status"], "True");
        assert_eq!(gw["conditions"][1]["message"], "2 L34Route(s) served; left out (see their status): bad-cidr, to-service-b, unknown-backend");
    }

    fn service(objects: &mut Objects, uid: &str, algorithm: Option<&str>) {
        let mut s = objects.by_kind["Service"]["service-a"].clone();
        s["metadata"]["uid"] = json!(uid);
        match algorithm {
            Some(a) => s["metadata"]["annotations"]["service.cilium.io/lb-algorithm"] = json!(a),
            None => {
                s["metadata"]["annotations"].as_object_mut().unwrap().remove("service.cilium.io/lb-algorithm");
            }
        }
        objects.apply("Service", s);
    }

    #[test]
    fn a_live_service_keeps_its_algorithm_unless_changes_are_allowed() {
        let mut objects = from_files(&[&manifests_dir()]);
        let mut sync = Sync::new(cfg(), Defaults::default());
        let algo = |p: &Plan| p.desired.services[0].algorithm;
        assert_eq!(algo(&settle(&mut sync, &objects)), Some(Algorithm::Maglev));

        service(&mut objects, "uid-service-a", Some("random"));
        let plan = settle(&mut sync, &objects);
        assert_eq!(algo(&plan), Some(Algorithm::Maglev), "the change is refused: still maglev");
        let st = sync.status(&objects, &plan, NOW);
        let c = &st.routes["vip-20-0-0-1-web"]["parents"][0]["conditions"];
        assert_eq!((c[0]["status"].as_str(), c[1]["type"].as_str(), c[1]["reason"].as_str()), (Some("True"), Some(SETTINGS_CONDITION), Some("AlgorithmChangeRefused")));
        assert!(c[1]["message"].as_str().unwrap().contains("still maglev, not random"));
        // Removing the annotation leaves the default, maglev: no change.
        service(&mut objects, "uid-service-a", None);
        assert_eq!(algo(&settle(&mut sync, &objects)), None);

        // A recreated Service (a new uid) takes the annotation it has.
        service(&mut objects, "uid-2", Some("random"));
        let plan = settle(&mut sync, &objects);
        assert_eq!(algo(&plan), Some(Algorithm::Random));
        assert!(plan.kept.is_empty());

        // Allowed: the change goes through.
        let mut sync = Sync::new(KubeConfig { allow_algorithm_change: true, ..cfg() }, Defaults::default());
        settle(&mut sync, &objects);
        service(&mut objects, "uid-2", Some("maglev"));
        assert_eq!(algo(&settle(&mut sync, &objects)), Some(Algorithm::Maglev));

        // Global: annotations are ignored, every Service takes the default.
        let mut sync = Sync::new(KubeConfig { algorithm_configuration: AlgorithmConfiguration::Global, ..cfg() }, Defaults::default());
        service(&mut objects, "uid-3", Some("random"));
        assert_eq!(algo(&settle(&mut sync, &objects)), None);
    }

    #[test]
    fn of_two_conflicting_routes_the_older_wins() {
        let mut objects = from_files(&[&manifests_dir()]);
        let mut svc = objects.by_kind["Service"]["service-a"].clone();
        svc["metadata"]["name"] = json!("service-c");
        objects.apply("Service", svc);
        let mut newer = objects.by_kind["L34Route"]["vip-20-0-0-1-web"].clone();
        newer["metadata"]["name"] = json!("a-newer-route");
        newer["metadata"]["creationTimestamp"] = json!("2030-01-01T00:00:00Z");
        newer["spec"]["backendRefs"][0]["name"] = json!("service-c");
        newer["spec"]["destinationPorts"] = json!(["70-90"]);
        objects.apply("L34Route", newer.clone());
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = settle(&mut sync, &objects);
        let st = sync.status(&objects, &plan, NOW);
        let (s, reason, msg) = accepted(&st, "a-newer-route");
        assert_eq!((s.as_str(), reason.as_str()), ("False", "Conflicted"));
        assert!(msg.contains("conflicts with L34Route \"vip-20-0-0-1-web\": same priority 10"), "{msg}");
        assert_eq!(accepted(&st, "vip-20-0-0-1-web").0, "True");

        // Disjoint traffic (other ports, or another priority) is no conflict.
        for change in [json!({"destinationPorts": ["81"]}), json!({"priority": 11})] {
            let mut r = newer.clone();
            for (k, v) in change.as_object().unwrap() {
                r["spec"][k] = v.clone();
            }
            objects.apply("L34Route", r);
            let plan = settle(&mut sync, &objects);
            assert!(plan.mapping.objects.iter().all(|m| m.refusal.is_none()), "{change}");
        }
    }

    #[test]
    fn status_is_only_ours_and_keeps_its_transition_times() {
        let mut objects = from_files(&[&manifests_dir()]);
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = sync.plan(&objects);
        let st = sync.status(&objects, &plan, NOW);
        let gw = st.gateway.clone().unwrap();
        assert_eq!((gw["conditions"][1]["status"].as_str(), gw["conditions"][1]["reason"].as_str()), (Some("False"), Some("Pending")));
        assert_eq!(gw["addresses"], json!([]), "nothing served yet");

        let plan = settle(&mut sync, &objects);
        let st = sync.status(&objects, &plan, NOW);
        // The objects now show what was written: nothing differs, even later.
        let mut gw = objects.by_kind["Gateway"]["sllb-a"].clone();
        gw["status"] = st.gateway.clone().unwrap();
        objects.apply("Gateway", gw.clone());
        for (name, s) in &st.routes {
            let mut r = objects.by_kind["L34Route"][name].clone();
            r["status"] = s.clone();
            objects.apply("L34Route", r);
        }
        let later = sync.status(&objects, &plan, "2025-06-01T13:00:00Z");
        assert_eq!(observed_part("Gateway", &objects.by_kind["Gateway"]["sllb-a"]), later.gateway.unwrap());
        for (name, s) in &later.routes {
            assert_eq!(&observed_part("L34Route", &objects.by_kind["L34Route"][name]), s, "{name}");
        }

        // Another class: not ours, no status at all, and nothing served.
        gw["spec"]["gatewayClassName"] = json!("someone-else");
        objects.apply("Gateway", gw);
        let plan = sync.plan(&objects);
        assert!(plan.mapping.whole[0].message.contains("has class \"someone-else\", not \"meridio-experiment/stateless-load-balancer\""));
        assert_eq!(sync.status(&objects, &plan, NOW), Statuses::default());
        objects.delete("Gateway", "sllb-a");
        assert!(sync.plan(&objects).mapping.whole[0].message.contains("no Gateway named \"sllb-a\""));
    }
    #[test]
    fn the_k8s_examples_are_what_the_appliance_serves() {
        let k8s = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/k8s");
        let objects = from_files(&[&k8s.join("examples")]);
        let route: crate::sources::kube::crd::L34Route = serde_json::from_value(objects.by_kind["L34Route"]["vip-20-0-0-1-multi-ports-a"].clone()).unwrap();
        assert_eq!(route.spec.priority, 10);
        let router: crate::sources::kube::crd::GatewayRouter = serde_json::from_value(objects.by_kind["GatewayRouter"]["gateway-a-v4"].clone()).unwrap();
        assert_eq!(router.spec.interface, "vlan-100");
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = settle(&mut sync, &objects);
        assert!(plan.mapping.whole.is_empty(), "{:?}", plan.mapping.whole);
        assert_eq!((plan.desired.routes.len(), plan.desired.services.len()), (1, 1));
        assert_eq!(sync.status(&objects, &plan, NOW).gateway.unwrap()["addresses"], json!([{"type": "IPAddress", "value": "20.0.0.1"}]));

        // The appliance configuration of the Deployment checks.
        let deployment = std::fs::read_to_string(k8s.join("deployment.yaml")).unwrap();
        let (docs, err) = crate::config::yaml::documents(&deployment, &mut crate::config::yaml::Budget::default());
        assert!(err.is_none());
        let text = docs[0].get("data").unwrap().get("sluice.yaml").unwrap().as_str().unwrap().to_owned();
        let c = crate::config::parse_str(&text, Path::new("sluice.yaml")).unwrap();
        assert_eq!(c.kubernetes.unwrap().gateway, "sllb-a");
    }

    #[test]
    fn a_parent_ref_to_the_gateway_of_another_namespace_is_not_attached() {
        let mut objects = from_files(&[&manifests_dir()]);
        let mut r = objects.by_kind["L34Route"]["vip-20-0-0-1-web"].clone();
        r["spec"]["parentRefs"] = json!([{"name": "sllb-a", "namespace": "default"}]);
        objects.apply("L34Route", r.clone());
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = settle(&mut sync, &objects);
        assert!(!plan.desired.routes.iter().any(|x| x.name == "vip-20-0-0-1-web"), "served by the Gateway of tenant-a: {:?}", plan.desired.routes);
        let st = sync.status(&objects, &plan, NOW);
        let (s, reason, msg) = accepted(&st, "vip-20-0-0-1-web");
        assert_eq!((s.as_str(), reason.as_str()), ("False", "NotAllowedByListeners"), "{msg}");
        assert!(msg.contains("of namespace \"default\""), "{msg}");
        assert_eq!(accepted(&st, "vip-20-0-0-2-syn-only").0, "True");

        // Naming the route's own namespace, or none, attaches it.
        for parent in [json!({"name": "sllb-a", "namespace": "tenant-a"}), json!({"name": "sllb-a"})] {
            r["spec"]["parentRefs"] = json!([parent]);
            objects.apply("L34Route", r.clone());
            let plan = settle(&mut sync, &objects);
            assert!(plan.desired.routes.iter().any(|x| x.name == "vip-20-0-0-1-web"), "{parent}");
        }
    }

    #[test]
    fn a_gateway_lists_at_most_16_addresses_and_says_so() {
        let mut objects = from_files(&[&manifests_dir()]);
        let route = objects.by_kind["L34Route"]["vip-20-0-0-1-web"].clone();
        for i in 0..20 {
            let mut r = route.clone();
            r["metadata"]["name"] = json!(format!("r{i:02}"));
            r["spec"]["destinationCIDRs"] = json!([format!("21.0.0.{i}/32")]);
            objects.apply("L34Route", r);
        }
        let mut sync = Sync::new(cfg(), Defaults::default());
        let plan = settle(&mut sync, &objects);
        let gw = sync.status(&objects, &plan, NOW).gateway.unwrap();
        let addrs = gw["addresses"].as_array().unwrap();
        assert_eq!(addrs.len(), MAX_ADDRESSES);
        assert_eq!((addrs[0]["value"].as_str(), addrs[15]["value"].as_str()), (Some("20.0.0.1"), Some("21.0.0.13")), "in address order");
        assert_eq!(gw["conditions"][1]["message"], "22 L34Route(s) served (22 VIPs: status.addresses lists the first 16)");
    }

}
