//! Kubernetes-style manifests as a source of services, with the kinds and
//! field names of the Meridio 2.x design: `Gateway`, `L34Route` (routes),
//! `Service` (with `service.kubernetes.io/service-proxy-name` naming the
//! Gateway) and `EndpointSlice` (endpoints; their identifiers in the
//! `sluice.io/endpoint-ids` annotation). The same YAML an operator applies
//! to a cluster runs the appliance standalone.
//!
//! Service settings come from annotations: `sluice.io/lb-algorithm` (or
//! Cilium's `service.cilium.io/lb-algorithm`), `sluice.io/endpoint-limit`,
//! `sluice.io/table-size`, `sluice.io/flow-table`, `sluice.io/delivery`,
//! bounded as the same settings written inline (annotation values are
//! strings, as in Kubernetes). `sluice.io/health-check` holds the fields
//! of the file's `healthCheck` as a YAML (or JSON) mapping in one string:
//! `'{protocol: http, port: 8080, path: /healthz, intervalMs: 1000}'`.
//!
//! The mapping ([`map`]) is the one way from these objects to the model,
//! whichever way they arrive: read from a directory here, or watched from
//! the Kubernetes API ([`crate::sources::kube`], whose objects are
//! converted to the same value tree without positions). It works object
//! by object: each object's definitions and problems are kept apart, so
//! that a directory is taken whole or not at all ([`Mapping::into_result`])
//! while the API source leaves out only the objects that are wrong
//! ([`Mapping::desired`]).
//!
//! The directory holds at most [`MAX_FILES`] files of [`MAX_TOTAL_BYTES`]
//! together; all of them share one [`yaml::Budget`] (values, aliases,
//! documents).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::node::Node;
use super::schema;
use crate::problem::{Problem, Problems};
use super::yaml::{self, Budget, Value};
use super::{fields, route_fields};
use crate::model::{DeliveryMode, Desired, EndpointDef, Origin, RouteDef, ServiceDef};
use sluice_dataplane::classify::RouteMatch;
use sluice_dataplane::parse::proto;

/// Label naming the Gateway a Service runs in.
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the Gateway a Deployment and its pods serve (the
/// controller sets it; an appliance finds its siblings' pods by it).
pub const GATEWAY_LABEL: &str = "sluice.io/gateway";
/// Sluice's per-service algorithm annotation.
pub(crate) const SLUICE_ALGORITHM: &str = "sluice.io/lb-algorithm";
/// Cilium's per-service algorithm annotation (wins over Sluice's).
pub(crate) const CILIUM_ALGORITHM: &str = "service.cilium.io/lb-algorithm";
/// Annotation mapping endpoint addresses to identifiers (a JSON object).
pub const ENDPOINT_IDS: &str = "sluice.io/endpoint-ids";
/// Most manifest files in the directory.
pub(crate) const MAX_FILES: usize = 1000;
/// Most bytes in all the files together (each is also at most
/// [`yaml::MAX_FILE_BYTES`]).
pub(crate) const MAX_TOTAL_BYTES: u64 = 64 << 20;

/// The manifest files of `dir` (`.yaml`, `.yml`), sorted; at most
/// [`MAX_FILES`].
pub fn files(dir: &Path) -> Result<Vec<PathBuf>, Problem> {
    let name = dir.display().to_string();
    let rd = std::fs::read_dir(dir)
        .map_err(|e| Problem::new(name.clone(), "", format!("cannot read the manifests directory: {e}")))?;
    let mut v: Vec<PathBuf> = Vec::new();
    for e in rd {
        let path = match e {
            Ok(e) => e.path(),
            Err(e) => return Err(Problem::new(name, "", format!("cannot read the manifests directory: {e}"))),
        };
        if !path.extension().is_some_and(|x| x == "yaml" || x == "yml") {
            continue;
        }
        if v.len() == MAX_FILES {
            return Err(Problem::new(name, "", format!("more than {MAX_FILES} manifest files: refused")));
        }
        v.push(path);
    }
    v.sort();
    Ok(v)
}

/// One object as the mapping reads it: a document of a manifest file, or
/// an object watched from the Kubernetes API (converted with
/// [`Value::from_json`], so it has no positions).
#[derive(Clone, Debug)]
pub struct Object {
    /// Where it came from: the file, or `kubernetes: Kind/namespace/name`
    /// for an API object (unique per object: problems carry it, so a
    /// source can tell which of its objects a refusal is about).
    pub(crate) file: String,
    /// Its path in that origin (`[doc 2] Service/web`; empty for an API
    /// object).
    pub(crate) path: String,
    /// The object.
    pub value: Value,
}

impl Object {
    /// An object read from the Kubernetes API.
    pub fn from_api(value: &serde_json::Value) -> Object {
        let kind = value.get("kind").and_then(serde_json::Value::as_str).unwrap_or("?");
        let meta = value.get("metadata");
        let field = |k: &str| meta.and_then(|m| m.get(k)).and_then(serde_json::Value::as_str).unwrap_or("?");
        Object { file: api_origin(kind, field("namespace"), field("name")), path: String::new(), value: Value::from_json(value) }
    }

    fn kind(&self) -> &str {
        self.value.get("kind").and_then(Value::as_str).unwrap_or("")
    }

    fn name(&self) -> Option<&str> {
        meta(&self.value, "name").and_then(Value::as_str)
    }

    fn created(&self) -> String {
        meta(&self.value, "creationTimestamp").and_then(Value::as_str).unwrap_or("").to_owned()
    }

    fn node(&self) -> Node<'_> {
        Node::at(&self.value, &self.file, &self.path)
    }

    /// The path of `rest` inside the object.
    fn sub(&self, rest: &str) -> String {
        if self.path.is_empty() {
            rest.to_owned()
        } else {
            format!("{}.{rest}", self.path)
        }
    }
}

/// The origin of an API object: `kubernetes: Kind/namespace/name`.
pub fn api_origin(kind: &str, namespace: &str, name: &str) -> String {
    format!("kubernetes: {kind}/{namespace}/{name}")
}

fn meta<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.get("metadata")?.get(key)
}

fn label<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    meta(v, "labels")?.get(key)?.as_str()
}

/// The documents of `file` but empty ones, each with its path: its index
/// in the file, kind and name (`[doc 2] Service/web`).
fn named(file: &str, values: Vec<Value>) -> impl Iterator<Item = Object> + '_ {
    values.into_iter().enumerate().filter(|(_, v)| !v.is_null()).map(move |(i, value)| {
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("?");
        let name = meta(&value, "name").and_then(Value::as_str).unwrap_or("?");
        Object { file: file.to_owned(), path: format!("[doc {i}] {kind}/{name}"), value }
    })
}

/// Which objects are this appliance's, and how they are read.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a> {
    /// The Gateway served.
    pub gateway: &'a str,
    /// The class the Gateway must have (`None`: any).
    pub gateway_class: Option<&'a str>,
    /// Honour the per-service algorithm annotations (`annotation`), or
    /// leave every service to the default (`global`).
    pub algorithm_annotations: bool,
}

impl<'a> Scope<'a> {
    /// The scope of a manifests directory: any class, annotations honoured.
    pub fn manifests(gateway: &'a str) -> Scope<'a> {
        Scope { gateway, gateway_class: None, algorithm_annotations: true }
    }
}

/// Reads every manifest in `dir` and keeps what belongs to `gateway`.
pub fn load(dir: &Path, gateway: &str) -> Result<Desired, Vec<Problem>> {
    let objects = read_dir(dir)?;
    map(&objects, &Scope::manifests(gateway), &BTreeMap::new(), &dir.display().to_string(), "the manifests").into_result()
}

/// The objects of every manifest in `dir`, in file order.
pub fn read_dir(dir: &Path) -> Result<Vec<Object>, Vec<Problem>> {
    let mut p = Problems::default();
    let mut docs = Vec::new();
    let mut budget = Budget::default();
    let mut bytes = 0u64;
    for f in files(dir).map_err(|e| vec![e])? {
        let file = f.display().to_string();
        if !std::fs::metadata(&f).is_ok_and(|m| m.is_file()) {
            p.add(&file, None, "", "not a regular file");
            continue;
        }
        let text = match yaml::read(&f, yaml::MAX_FILE_BYTES) {
            Ok(t) => t,
            Err(e) => {
                p.add(&file, None, "", e.to_string());
                continue;
            }
        };
        bytes += text.len() as u64;
        if bytes > MAX_TOTAL_BYTES {
            p.add(&file, None, "", format!("the manifests are larger than {} MiB together: refused", MAX_TOTAL_BYTES >> 20));
            break;
        }
        let (values, err) = yaml::documents(&text, &mut budget);
        docs.extend(named(&file, values));
        if let Some((i, e)) = err {
            p.add(&file, e.pos, &format!("[doc {i}]"), e.message);
            if e.limit {
                break;
            }
        }
    }
    if p.is_empty() {
        Ok(docs)
    } else {
        Err(p.0)
    }
}

/// The kinds of object that give the model something.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `L34Route`: a route.
    Route,
    /// `Service`: a service's settings.
    Service,
    /// `EndpointSlice`: endpoints of a service.
    Slice,
}

/// Why an object is left out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Its own fields are wrong (a bad CIDR, a bad annotation...).
    Invalid,
    /// A route matching the same traffic with the same priority sends it
    /// elsewhere; the older route (then the first by name) wins.
    Conflicted,
    /// The Service it belongs to, or sends to, is left out.
    BackendRefused,
    /// The appliance refused it (the problems the reconciler gave).
    Refused,
    /// A route whose parentRef names the Gateway served in another
    /// namespace: it is not attached here.
    NotAllowed,
}

impl Reason {
    /// The reason as a condition states it.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Invalid => "UnsupportedValue",
            Reason::Conflicted => "Conflicted",
            Reason::BackendRefused => "BackendNotFound",
            Reason::Refused => "Refused",
            Reason::NotAllowed => "NotAllowedByListeners",
        }
    }
}

/// Why an object is left out, and every problem about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The kind of reason.
    pub reason: Reason,
    /// The problems.
    pub problems: Vec<Problem>,
}

impl Refusal {
    /// The problems as one message.
    pub fn message(&self) -> String {
        self.problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    }
}

/// What one object of this Gateway gives.
#[derive(Clone, Debug)]
pub struct Mapped {
    /// Its kind.
    pub kind: Kind,
    /// Its name.
    pub name: String,
    /// Its origin ([`Object::file`]).
    pub origin: String,
    /// Its creation time as the API wrote it (empty in files).
    pub(crate) created: String,
    /// The Service it belongs to (a slice) or sends to (a route).
    pub service: Option<String>,
    /// What it defines.
    pub(crate) desired: Desired,
    /// Why it is left out, if it is.
    pub refusal: Option<Refusal>,
}

/// What the objects define for a Gateway, object by object.
#[derive(Clone, Debug, Default)]
pub struct Mapping {
    /// Problems about the whole (no such Gateway, another class): nothing
    /// is served.
    pub whole: Vec<Problem>,
    /// This Gateway's objects.
    pub objects: Vec<Mapped>,
}

impl Mapping {
    /// Everything or nothing (a manifests directory): the objects'
    /// definitions when no object has a problem of its own, else every
    /// problem.
    pub(crate) fn into_result(self) -> Result<Desired, Vec<Problem>> {
        let mut problems = self.whole.clone();
        for m in &self.objects {
            if let Some(r) = &m.refusal {
                if matches!(r.reason, Reason::Invalid | Reason::Conflicted | Reason::Refused) {
                    problems.extend(r.problems.iter().cloned());
                }
            }
        }
        if problems.is_empty() {
            Ok(self.desired())
        } else {
            Err(problems)
        }
    }

    /// The definitions of the objects that are not left out.
    pub fn desired(&self) -> Desired {
        let mut out = Desired::default();
        for m in self.objects.iter().filter(|m| m.refusal.is_none()) {
            out.routes.extend(m.desired.routes.iter().cloned());
            out.services.extend(m.desired.services.iter().cloned());
            out.endpoints.append(&m.desired.endpoints);
        }
        out
    }

    /// The object from `origin`.
    pub fn get(&self, origin: &str) -> Option<&Mapped> {
        self.objects.iter().find(|m| m.origin == origin)
    }
}

/// The annotation `key` of an object as a node, when it is there and is a
/// string (as Kubernetes requires).
fn annotation<'d>(d: &'d Object, key: &str, path: &'d mut String, p: &mut Problems) -> Option<Node<'d>> {
    let v = meta(&d.value, "annotations")?.get(key)?;
    *path = d.sub(&format!("metadata.annotations.{key}"));
    let mut n = Node::at(v, &d.file, path);
    if let Some(k) = schema::ANNOTATIONS.get(key) {
        n = n.with_schema(&schema::ANNOTATIONS, k.path);
    }
    if v.as_str().is_none() {
        n.bad(p, format!("annotation values are strings: quote it (found {})", v.kind()));
        return None;
    }
    Some(n)
}

/// What `objects` define for the Gateway of `scope`: the one mapping from
/// objects to the model, whichever way they arrived. Objects in `excluded`
/// (by origin) are left out with the refusal given; Services left out take
/// their EndpointSlices and routes with them; of two routes that conflict,
/// the newer is left out. `whole` names the collection in problems about
/// it (the directory, or the API) and `among` says what it holds.
pub fn map(objects: &[Object], scope: &Scope<'_>, excluded: &BTreeMap<String, Refusal>, whole: &str, among: &str) -> Mapping {
    let mut out = Mapping::default();
    let gateway = scope.gateway;
    let gw = objects.iter().find(|d| d.kind() == "Gateway" && d.name() == Some(gateway));
    let gw_namespace = gw.and_then(|g| meta(&g.value, "namespace")).and_then(Value::as_str);
    check_gateway(gw, scope, whole, among, &mut out.whole);

    // Services of this Gateway first: EndpointSlices are kept only for them.
    for d in objects.iter().filter(|d| d.kind() == "Service") {
        if label(&d.value, PROXY_NAME_LABEL) != Some(gateway) {
            continue;
        }
        out.objects.push(service(d, scope));
    }
    let ours: BTreeMap<String, ()> = out.objects.iter().map(|m| (m.name.clone(), ())).collect();

    for d in objects {
        let mut p = Problems::default();
        let n = d.node();
        match d.kind() {
            "L34Route" => {
                if let Some(m) = route(d, gateway, gw_namespace) {
                    out.objects.push(m);
                }
            }
            "EndpointSlice" => {
                let Some(svc) = label(&d.value, SERVICE_NAME_LABEL) else { continue };
                if !ours.contains_key(svc) {
                    continue;
                }
                let mut desired = Desired::default();
                endpoint_slice(d, n, svc, &mut p, &mut desired);
                out.objects.push(Mapped {
                    kind: Kind::Slice,
                    name: d.name().unwrap_or("").to_owned(),
                    origin: d.file.clone(),
                    created: d.created(),
                    service: Some(svc.to_owned()),
                    desired,
                    refusal: refusal(Reason::Invalid, p),
                });
            }
            "Gateway" | "GatewayClass" | "Service" | "GatewayRouter" => {}
            k if d.value.get("apiVersion").and_then(Value::as_str).is_some_and(|a| a.contains("meridio") || a.contains("gateway.networking")) => {
                n.bad(&mut p, format!("unknown kind {k:?} (Gateway, GatewayClass, L34Route, GatewayRouter)"));
                out.whole.extend(p.0);
            }
            _ => {}
        }
    }

    for m in &mut out.objects {
        if m.refusal.is_none() {
            if let Some(r) = excluded.get(&m.origin) {
                m.refusal = Some(r.clone());
            }
        }
    }
    cascade(&mut out);
    conflicts(&mut out);
    out
}

/// Adds to `problems` what makes the Gateway of `scope` unusable: it is
/// not among the objects (`gw` is `None`; `whole` names the collection,
/// `among` says what it holds), or it has another class than `scope` asks.
fn check_gateway(gw: Option<&Object>, scope: &Scope<'_>, whole: &str, among: &str, problems: &mut Vec<Problem>) {
    let gateway = scope.gateway;
    match gw {
        None => problems.push(Problem::new(whole, "", format!("no Gateway named {gateway:?} among {among}"))),
        Some(g) => {
            if let Some(class) = scope.gateway_class {
                let have = g.value.get("spec").and_then(|s| s.get("gatewayClassName")).and_then(Value::as_str);
                if have != Some(class) {
                    let mut p = Problems::default();
                    g.node().bad(&mut p, format!(
                        "Gateway {gateway:?} has class {:?}, not {class:?}: it is not this appliance's",
                        have.unwrap_or("")
                    ));
                    problems.extend(p.0);
                }
            }
        }
    }
}

/// Sluice's per-service health check annotation.
pub const HEALTH_CHECK: &str = "sluice.io/health-check";

/// The check an `sluice.io/health-check` annotation's string holds: a
/// mapping (YAML or JSON) of the file's `healthCheck` fields, read with a
/// small budget; its problems are reported at the annotation (positions
/// inside the string would point into the wrong text).
fn health_check_annotation(n: Node<'_>, p: &mut Problems) -> Option<crate::model::CheckDef> {
    let text = n.v.as_str().unwrap_or_default();
    let v = match yaml::document(text, &mut Budget::new(64, 0, 1)) {
        Ok(v) => Value::from_json(&v.to_json()),
        Err(e) => {
            n.bad(p, format!("not a YAML mapping of health check fields: {}", e.message));
            return None;
        }
    };
    fields::health_check(Node::at(&v, n.file(), n.path()).with_schema(&schema::FILE, "services[].healthCheck"), p)
}

fn refusal(reason: Reason, p: Problems) -> Option<Refusal> {
    (!p.is_empty()).then_some(Refusal { reason, problems: p.0 })
}

fn service(d: &Object, scope: &Scope<'_>) -> Mapped {
    let mut p = Problems::default();
    let n = d.node();
    let name = n.required(&mut p, "metadata", |n, p| n.required(p, "name", fields::name)).flatten().flatten();
    let origin = Origin { file: d.file.as_str().into(), pos: n.pos(), path: d.path.as_str().into() };
    let mut s = ServiceDef { name: name.clone().unwrap_or_default(), origin, ..Default::default() };
    let mut path = String::new();
    if scope.algorithm_annotations {
        for key in [SLUICE_ALGORITHM, CILIUM_ALGORITHM] {
            if let Some(a) = annotation(d, key, &mut path, &mut p) {
                s.algorithm = a.parse(&mut p, "an algorithm").or(s.algorithm);
            }
        }
    }
    if let Some(n) = annotation(d, "sluice.io/endpoint-limit", &mut path, &mut p) {
        s.limit = fields::endpoint_limit(n, &mut p);
    }
    if let Some(n) = annotation(d, "sluice.io/table-size", &mut path, &mut p) {
        s.table_size = fields::table_size(n, &mut p);
    }
    if let Some(n) = annotation(d, "sluice.io/flow-table", &mut path, &mut p) {
        s.flow_table = n.boolean(&mut p);
    }
    if let Some(n) = annotation(d, "sluice.io/delivery", &mut path, &mut p) {
        s.delivery = n.parse::<DeliveryMode>(&mut p, "a delivery");
    }
    if let Some(n) = annotation(d, HEALTH_CHECK, &mut path, &mut p) {
        s.check = health_check_annotation(n, &mut p).map(std::sync::Arc::new);
    }
    let desired = Desired { services: name.is_some().then_some(s).into_iter().collect(), ..Default::default() };
    Mapped {
        kind: Kind::Service,
        name: name.unwrap_or_else(|| d.name().unwrap_or("").to_owned()),
        origin: d.file.clone(),
        created: d.created(),
        service: None,
        desired,
        refusal: refusal(Reason::Invalid, p),
    }
}

/// An L34Route, when a parentRef names `gateway`. A parentRef's namespace
/// is the route's unless it names one; when it is not the Gateway's
/// (`gw_namespace`), the route is not attached (`NotAllowedByListeners`):
/// a route attaches to the Gateway of its own namespace only.
fn route(d: &Object, gateway: &str, gw_namespace: Option<&str>) -> Option<Mapped> {
    let mut p = Problems::default();
    let n = d.node();
    let route_namespace = meta(&d.value, "namespace").and_then(Value::as_str);
    let Some(name) = d.name() else {
        // Whose it is cannot be told without a name only when it has no
        // parent of ours either: then it is not ours.
        let ours = n.v.get("spec").and_then(|s| s.get("parentRefs")).is_some_and(|refs| parent_names(refs).iter().any(|x| x == gateway));
        if !ours {
            return None;
        }
        n.bad(&mut p, "missing metadata.name");
        return Some(route_mapped(d, "", None, Desired::default(), refusal(Reason::Invalid, p)));
    };
    let mut desired = Desired::default();
    let mut backend = None;
    let mut mine = true;
    let mut elsewhere: Option<String> = None;
    n.required(&mut p, "spec", |spec, p| {
        spec.mapping(
            p,
            &[
                "parentRefs", "backendRefs", "priority", "destinationCIDRs", "sourceCIDRs", "sourcePorts",
                "destinationPorts", "protocols", "byteMatches",
            ],
        );
        let parents = parent_refs(spec, p, route_namespace);
        if !parents.iter().any(|(x, _)| x == gateway) {
            mine = false; // another Gateway's route
            return;
        }
        if !parents.iter().any(|(x, ns)| x == gateway && ns.as_deref() == gw_namespace) {
            let named = parents.iter().find(|(x, _)| x == gateway).and_then(|(_, ns)| ns.clone()).unwrap_or_default();
            elsewhere = Some(format!(
                "its parentRef names Gateway {gateway:?} of namespace {named:?}, not the one served here (namespace {:?}): \
                 a route attaches to the Gateway of its own namespace",
                gw_namespace.unwrap_or("")
            ));
            return;
        }
        if parents.len() != 1 {
            spec.bad(p, "an L34Route has exactly one parentRef");
        }
        let mut backends = Vec::new();
        spec.required(p, "backendRefs", |n, p| n.each(p, |n, p| backends.extend(n.required(p, "name", fields::name).flatten())));
        if backends.len() != 1 {
            spec.bad(p, format!("an L34Route has exactly one backendRef (found {})", backends.len()));
            return;
        }
        backend = Some(backends[0].clone());
        // The fields it shares with the file's routes[] are declared there.
        let spec = spec.with_schema(&schema::FILE, "routes[]");
        if let Some(r) = route_fields(spec, p, name.to_owned(), backends[0].clone()) {
            desired.routes.push(r);
        }
    });
    if !mine {
        return None;
    }
    if let Some(why) = elsewhere {
        let not_allowed = Refusal { reason: Reason::NotAllowed, problems: vec![Problem::new(d.file.clone(), d.sub("spec.parentRefs"), why)] };
        return Some(route_mapped(d, name, None, Desired::default(), Some(not_allowed)));
    }
    Some(route_mapped(d, name, backend, desired, refusal(Reason::Invalid, p)))
}

/// What route `d`, named `name`, gives: `desired` sending to `service`,
/// or the `refusal` that leaves it out.
fn route_mapped(d: &Object, name: &str, service: Option<String>, desired: Desired, refusal: Option<Refusal>) -> Mapped {
    Mapped { kind: Kind::Route, name: name.to_owned(), origin: d.file.clone(), created: d.created(), service, desired, refusal }
}

/// The Gateways an L34Route's `parentRefs` (in its `spec`) name, each
/// with its namespace: the one the ref names, else the route's own
/// (`route_namespace`).
fn parent_refs(spec: Node<'_>, p: &mut Problems, route_namespace: Option<&str>) -> Vec<(String, Option<String>)> {
    let mut parents = Vec::new();
    spec.field("parentRefs", |n| {
        n.each(p, |n, p| {
            if let Some(name) = n.required(p, "name", |n, p| n.string(p)).flatten() {
                let ns = n.v.get("namespace").and_then(Value::as_str).or(route_namespace);
                parents.push((name, ns.map(str::to_owned)));
            }
        })
    });
    parents
}

fn parent_names(refs: &Value) -> Vec<String> {
    match refs.data() {
        yaml::Data::Seq(items) => items.iter().filter_map(|r| r.get("name")?.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    }
}

/// Services left out take their slices and the routes to them along.
fn cascade(out: &mut Mapping) {
    let refused: BTreeMap<String, String> = out
        .objects
        .iter()
        .filter(|m| m.kind == Kind::Service)
        .filter_map(|m| Some((m.name.clone(), m.refusal.as_ref()?.message())))
        .collect();
    for m in &mut out.objects {
        if m.refusal.is_some() || m.kind == Kind::Service {
            continue;
        }
        let Some(why) = m.service.as_ref().and_then(|s| refused.get(s).map(|w| (s, w))) else { continue };
        let what = if m.kind == Kind::Route { "the Service it sends to" } else { "its Service" };
        m.refusal = Some(Refusal {
            reason: Reason::BackendRefused,
            problems: vec![Problem::new(m.origin.clone(), "", format!("{what}, {:?}, is left out: {}", why.0, why.1))],
        });
    }
}

/// Of two routes with the same priority that match common traffic and
/// send it to different services, the older (then the first by name)
/// wins and the other is left out: which one a packet takes would
/// otherwise depend on their names.
fn conflicts(out: &mut Mapping) {
    let routes: Vec<(usize, &RouteDef, &str)> = out
        .objects
        .iter()
        .enumerate()
        .filter(|(_, m)| m.kind == Kind::Route && m.refusal.is_none())
        .filter_map(|(i, m)| Some((i, m.desired.routes.first()?, m.created.as_str())))
        .collect();
    let mut losers: Vec<(usize, Problem)> = Vec::new();
    for (a, ra, ca) in &routes {
        for (b, rb, cb) in &routes {
            if a == b || ra.priority != rb.priority || ra.service == rb.service || !overlap(&ra.matches, &rb.matches) {
                continue;
            }
            // `b` wins over `a` when it is older, or as old and first by name.
            if (*cb, rb.name.as_str()) < (*ca, ra.name.as_str()) {
                losers.push((*a, ra.origin.problem(format!(
                    "conflicts with L34Route {:?}: same priority {} and common traffic, sent to {:?} there and {:?} here; \
                     the older route wins (give them different priorities)",
                    rb.name, ra.priority, rb.service, ra.service
                ))));
                break;
            }
        }
    }
    for (i, problem) in losers {
        out.objects[i].refusal = Some(Refusal { reason: Reason::Conflicted, problems: vec![problem] });
    }
}

/// True when some packet could match both.
pub(crate) fn overlap(a: &RouteMatch, b: &RouteMatch) -> bool {
    fn any_or<T>(x: &[T], y: &[T], f: impl Fn(&T, &T) -> bool) -> bool {
        x.is_empty() || y.is_empty() || x.iter().any(|p| y.iter().any(|q| f(p, q)))
    }
    if !a.vips.iter().any(|v| b.vips.contains(v)) {
        return false;
    }
    if !any_or(&a.src_cidrs, &b.src_cidrs, |x, y| x.overlaps(y))
        || !any_or(&a.src_ports, &b.src_ports, |x, y| x.lo <= y.hi && y.lo <= x.hi)
        || !any_or(&a.dst_ports, &b.dst_ports, |x, y| x.lo <= y.hi && y.lo <= x.hi)
        || !any_or(&a.protocols, &b.protocols, |x, y| x == y)
    {
        return false;
    }
    // Common protocols; a byte match only speaks of its own protocol.
    let all = [proto::TCP, proto::UDP, proto::SCTP];
    let pick = |l: &[u8]| if l.is_empty() { all.to_vec() } else { l.to_vec() };
    let common: Vec<u8> = pick(&a.protocols).into_iter().filter(|p| pick(&b.protocols).contains(p)).collect();
    let other = a.protocols.is_empty() && b.protocols.is_empty(); // ICMP and the like: no byte match applies
    let disjoint_on = |p: u8| {
        a.byte_matches.iter().filter(|x| x.proto == p).any(|x| {
            b.byte_matches.iter().filter(|y| y.proto == p && y.offset == x.offset && y.len == x.len).any(|y| (x.value ^ y.value) & x.mask & y.mask != 0)
        })
    };
    other || common.iter().any(|&p| !disjoint_on(p))
}

fn endpoint_slice(d: &Object, n: Node<'_>, svc: &str, p: &mut Problems, out: &mut Desired) {
    let mut path = String::new();
    let ids: BTreeMap<String, u32> = match annotation(d, ENDPOINT_IDS, &mut path, p) {
        Some(a) => match serde_json::from_str::<BTreeMap<String, u32>>(a.v.as_str().unwrap_or_default()) {
            Ok(m) => m,
            Err(e) => {
                a.bad(p, format!("not a JSON object of address to identifier: {e}"));
                return;
            }
        },
        None => BTreeMap::new(),
    };
    // One name for all the slice's endpoints, which are one run.
    let shared = std::sync::Arc::new(svc.to_owned());
    let mut eps = Vec::new();
    n.field("endpoints", |n| {
        n.each(p, |e, p| {
            let Some(addr) = e.required(p, "addresses", |a, p| {
                let mut first = None;
                a.each(p, |a, p| {
                    if first.is_none() {
                        first = fields::addr(a, p);
                    }
                });
                first
            }).flatten() else { return };
            let cond = |key: &str| e.v.get("conditions").and_then(|c| c.get(key)).and_then(Value::as_bool);
            let terminating = cond("terminating").unwrap_or(false);
            let serving = cond("serving").unwrap_or(cond("ready").unwrap_or(true));
            let ready = cond("ready").unwrap_or(true);
            let draining = terminating && serving;
            if !ready && !draining {
                return; // not ready: not an endpoint for now
            }
            let Some(&id) = ids.get(&addr.to_string()) else {
                e.bad(p, format!("endpoint {addr} has no identifier in the {ENDPOINT_IDS} annotation"));
                return;
            };
            eps.push(EndpointDef {
                service: std::sync::Arc::clone(&shared),
                id,
                address: addr,
                weight: 1,
                draining,
                mac: None,
                origin: std::sync::Arc::new(Origin { file: e.file().into(), pos: e.pos(), path: e.path().into() }),
            });
        })
    });
    out.endpoints.push_run(eps);
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCS: &str = r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {name: sllb-a}
spec: {gatewayClassName: meridio-experiment/stateless-load-balancer, listeners: [{name: all, port: 4000, protocol: TCP}]}
---
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: L34Route
metadata: {name: vip-20-0-0-1-multi-ports-a}
spec:
  parentRefs: [{name: sllb-a}]
  backendRefs: [{name: service-a, port: 1}]
  priority: 10
  destinationCIDRs: [20.0.0.1/32]
  sourceCIDRs: [0.0.0.0/0]
  sourcePorts: [0-65535]
  destinationPorts: ["4000", "4001"]
  protocols: [TCP]
---
apiVersion: meridio.experiment.gateway.api.poc/v1alpha1
kind: L34Route
metadata: {name: other-gateway}
spec: {parentRefs: [{name: sllb-b}], backendRefs: [{name: x}], destinationCIDRs: [30.0.0.1/32]}
---
apiVersion: v1
kind: Service
metadata:
  name: service-a
  labels: {service.kubernetes.io/service-proxy-name: sllb-a}
  annotations: {service.cilium.io/lb-algorithm: random}
spec: {clusterIP: None, selector: {app: example}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: service-a-1
  labels: {kubernetes.io/service-name: service-a}
  annotations: {sluice.io/endpoint-ids: '{"169.111.100.2": 0, "169.111.100.3": 1, "169.111.100.4": 2}'}
addressType: IPv4
endpoints:
- addresses: [169.111.100.2]
  conditions: {ready: true}
- addresses: [169.111.100.3]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [169.111.100.4]
  conditions: {ready: false}
"#;

    /// The mapping of a manifests directory: the definitions, or every problem.
    fn from_docs(docs: &[Object], gateway: &str, p: &mut Problems) -> Desired {
        match map(docs, &Scope::manifests(gateway), &BTreeMap::new(), "d", "the manifests").into_result() {
            Ok(d) => d,
            Err(e) => {
                p.0.extend(e);
                Desired::default()
            }
        }
    }

    fn docs(text: &str) -> Vec<Object> {
        let (values, err) = yaml::documents(text, &mut Budget::default());
        assert!(err.is_none(), "{err:?}");
        named("m.yaml", values).collect()
    }

    #[test]
    fn the_seed_example_becomes_a_route_a_service_and_endpoints() {
        let mut p = Problems::default();
        let d = from_docs(&docs(DOCS), "sllb-a", &mut p);
        assert!(p.is_empty(), "{:?}", p.0);
        assert_eq!(d.routes.len(), 1, "the other Gateway's route is not ours");
        let r = &d.routes[0];
        assert_eq!((r.service.as_str(), r.priority, r.matches.dst_ports.len()), ("service-a", 10, 2));
        assert_eq!(d.services[0].algorithm, Some(sluice_dataplane::service::Algorithm::Random));
        let eps: Vec<(u32, bool)> = d.endpoints.iter().map(|e| (e.id, e.draining)).collect();
        assert_eq!(eps, vec![(0, false), (1, true)], "terminating+serving drains, not ready is left out");
    }

    #[test]
    fn missing_gateway_and_identifiers_are_reported() {
        let mut p = Problems::default();
        let text = DOCS.replace(r#"'{"169.111.100.2": 0, "169.111.100.3": 1, "169.111.100.4": 2}'"#, r#"'{"169.111.100.3": 1}'"#);
        from_docs(&docs(&text), "sllb-z", &mut p);
        assert!(p.0.iter().any(|e| e.message.contains("no Gateway named \"sllb-z\"")));
        let mut p = Problems::default();
        from_docs(&docs(&text), "sllb-a", &mut p);
        assert!(p.0.iter().any(|e| e.message.contains("169.111.100.2 has no identifier")), "{:?}", p.0);
    }

    /// Every Service annotation of the reference is read (its example
    /// changes the service) and bounded as the reference says.
    #[test]
    fn every_documented_annotation_is_read_and_bounded() {
        let with = |annotations: &str| {
            let text = format!(
                "kind: Gateway\nmetadata: {{name: g}}\n---\nkind: Service\nmetadata:\n  name: s\n  \
                 labels: {{service.kubernetes.io/service-proxy-name: g}}\n  annotations: {{{annotations}}}\n"
            );
            let mut p = Problems::default();
            let d = from_docs(&docs(&text), "g", &mut p);
            (d, p.0.iter().map(ToString::to_string).collect::<Vec<_>>())
        };
        let (plain, none) = with("");
        assert!(none.is_empty(), "{none:?}");
        let mut read = 0;
        for k in schema::ANNOTATIONS.keys.iter().filter(|k| k.path != ENDPOINT_IDS) {
            let (d, p) = with(&format!("{}: {}", k.path, k.example));
            assert!(p.is_empty(), "{}: {p:?}", k.path);
            assert_ne!(d.services, plain.services, "{}: its example {} changes nothing", k.path, k.example);
            read += 1;
            if let schema::Kind::Int(lo, hi) = k.kind {
                for v in [lo - 1, hi + 1] {
                    let (_, p) = with(&format!("{}: \"{v}\"", k.path));
                    assert!(p.iter().any(|m| m.contains(&format!("{v} is out of range {lo}..={hi}"))), "{}: {v}: {p:?}", k.path);
                }
            }
        }
        assert_eq!(read, schema::ANNOTATIONS.keys.len() - 1);
    }

    #[test]
    fn annotations_are_bounded_where_written() {
        let text = r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {name: g}
---
apiVersion: v1
kind: Service
metadata:
  name: s
  labels: {service.kubernetes.io/service-proxy-name: g}
  annotations:
    sluice.io/endpoint-limit: "70000"
    sluice.io/table-size: "4294967291"
    sluice.io/flow-table: "yes"
    sluice.io/delivery: "gre"
    sluice.io/lb-algorithm: "rr"
---
apiVersion: v1
kind: Service
metadata:
  name: t
  labels: {service.kubernetes.io/service-proxy-name: g}
  annotations: {sluice.io/endpoint-limit: 32, sluice.io/table-size: "6400"}
"#;
        let mut p = Problems::default();
        from_docs(&docs(text), "g", &mut p);
        let got: Vec<String> = p.0.iter().map(ToString::to_string).collect();
        let a = "m.yaml:{}: [doc 1] Service/s.metadata.annotations.sluice.io";
        let at = |pos: &str, rest: &str| format!("{}/{rest}", a.replace("{}", pos));
        assert_eq!(got, [
            at("16:29", "lb-algorithm: \"rr\" is not an algorithm: unknown load-balancing algorithm \"rr\" (expected maglev or random)"),
            at("12:31", "endpoint-limit: 70000 is out of range 1..=65536"),
            at("13:27", "table-size: 4294967291 is out of range 1..=16777213"),
            at("14:27", "flow-table: \"yes\" is not true or false"),
            at("15:25", "delivery: \"gre\" is not a delivery: unknown delivery \"gre\" (expected l2 or ipip)"),
            "m.yaml:23:43: [doc 2] Service/t.metadata.annotations.sluice.io/endpoint-limit: annotation values are strings: quote it (found a number)".to_owned(),
            "m.yaml:23:69: [doc 2] Service/t.metadata.annotations.sluice.io/table-size: table size 6400 is not a prime (the next prime is 6421)".to_owned(),
        ]);
    }

    #[test]
    fn a_health_check_annotation_holds_the_files_fields() {
        let text = r#"
apiVersion: gateway.networking.k8s.io/v1beta1
kind: Gateway
metadata: {name: g}
---
apiVersion: v1
kind: Service
metadata:
  name: s
  labels: {service.kubernetes.io/service-proxy-name: g}
  annotations: {sluice.io/health-check: '{protocol: http, port: 8080, path: /healthz, intervalMs: 1000, fall: 2}'}
"#;
        let mut p = Problems::default();
        let d = from_docs(&docs(text), "g", &mut p);
        assert!(p.is_empty(), "{:?}", p.0);
        let c = d.services[0].check.as_deref().unwrap();
        assert_eq!(c.probe, crate::model::Probe::Http { path: "/healthz".into(), host: None, statuses: vec![(200, 399)], tls: false });
        assert_eq!((c.port, c.interval_ms, c.timeout_ms, c.rise, c.fall), (8080, 1000, 1000, 2, 2));
        let mut p = Problems::default();
        let d = from_docs(&docs(&text.replace("path: /healthz, ", "target: vip, ").replace("protocol: http", "protocol: tcp")), "g", &mut p);
        assert!(p.is_empty(), "{:?}", p.0);
        assert_eq!(d.services[0].check.as_deref().unwrap().target, crate::model::CheckTarget::Vip, "a check of the VIP by annotation");
        for (value, want) in [
            ("'{protocol: http, port: 8080, intervalMs: 5}'", "sluice.io/health-check.intervalMs: 5 is out of range 100..=3600000"),
            ("'{protocol: tcp, port: 80, rise: 1, fal: 2}'", "sluice.io/health-check.fal: unknown field (did you mean \"fall\"?)"),
            ("'[tcp, 80]'", "sluice.io/health-check: expected a mapping, found a list"),
            ("'{protocol: https, port: 443, target: vip}'", "sluice.io/health-check: a check of the VIP (target: vip) is a tcp, udp or dns check; an https check goes to the endpoint's own address"),
        ] {
            let mut p = Problems::default();
            from_docs(&docs(&text.replace("'{protocol: http, port: 8080, path: /healthz, intervalMs: 1000, fall: 2}'", value)), "g", &mut p);
            let got: Vec<String> = p.0.iter().map(ToString::to_string).collect();
            assert!(got.iter().any(|g| g.ends_with(want)), "{value}: {got:?}");
        }
    }
}
