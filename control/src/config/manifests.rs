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
//! strings, as in Kubernetes).
//!
//! The directory holds at most [`MAX_FILES`] files of [`MAX_TOTAL_BYTES`]
//! together; all of them share one [`yaml::Budget`] (values, aliases,
//! documents).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::node::Node;
use crate::problem::{Problem, Problems};
use super::yaml::{self, Budget, Value};
use super::{fields, route_fields};
use crate::model::{DeliveryMode, Desired, EndpointDef, Origin, ServiceDef};

/// Label naming the Gateway a Service runs in.
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Annotation mapping endpoint addresses to identifiers (a JSON object).
pub const ENDPOINT_IDS: &str = "sluice.io/endpoint-ids";
/// Most manifest files in the directory.
pub const MAX_FILES: usize = 1000;
/// Most bytes in all the files together (each is also at most
/// [`yaml::MAX_FILE_BYTES`]).
pub const MAX_TOTAL_BYTES: u64 = 64 << 20;

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

struct Doc {
    file: String,
    path: String,
    value: Value,
}

fn meta<'v>(v: &'v Value, key: &str) -> Option<&'v Value> {
    v.get("metadata")?.get(key)
}

fn label<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    meta(v, "labels")?.get(key)?.as_str()
}

/// The documents of `file` but empty ones, each with its path: its index
/// in the file, kind and name (`[doc 2] Service/web`).
fn named(file: &str, values: Vec<Value>) -> impl Iterator<Item = Doc> + '_ {
    values.into_iter().enumerate().filter(|(_, v)| !v.is_null()).map(move |(i, value)| {
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("?");
        let name = meta(&value, "name").and_then(Value::as_str).unwrap_or("?");
        Doc { file: file.to_owned(), path: format!("[doc {i}] {kind}/{name}"), value }
    })
}

/// Reads every manifest in `dir` and keeps what belongs to `gateway`.
pub fn load(dir: &Path, gateway: &str) -> Result<Desired, Vec<Problem>> {
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
                p.add(&file, None, "", e);
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
    if !p.is_empty() {
        return Err(p.0);
    }
    let out = from_docs(&docs, &dir.display().to_string(), gateway, &mut p);
    if p.is_empty() {
        Ok(out)
    } else {
        Err(p.0)
    }
}

/// The annotation `key` of a document as a node, when it is there and is a
/// string (as Kubernetes requires).
fn annotation<'d>(d: &'d Doc, key: &str, path: &'d mut String, p: &mut Problems) -> Option<Node<'d>> {
    let v = meta(&d.value, "annotations")?.get(key)?;
    *path = format!("{}.metadata.annotations.{key}", d.path);
    let n = Node::at(v, &d.file, path);
    if v.as_str().is_none() {
        n.bad(p, format!("annotation values are strings: quote it (found {})", v.kind()));
        return None;
    }
    Some(n)
}

/// What the documents read from directory `dir` define for `gateway`.
fn from_docs(docs: &[Doc], dir: &str, gateway: &str, p: &mut Problems) -> Desired {
    let mut out = Desired::default();
    let kind = |d: &Doc| d.value.get("kind").and_then(Value::as_str).unwrap_or("").to_owned();
    let name_of = |d: &Doc| meta(&d.value, "name").and_then(Value::as_str).map(str::to_owned);

    if !docs.iter().any(|d| kind(d) == "Gateway" && name_of(d).as_deref() == Some(gateway)) {
        p.add(dir, None, "", format!("no Gateway named {gateway:?} among the manifests"));
    }

    // Services of this Gateway first: EndpointSlices are kept only for them.
    let mut ours: BTreeMap<String, ()> = BTreeMap::new();
    for d in docs.iter().filter(|d| kind(d) == "Service") {
        if label(&d.value, PROXY_NAME_LABEL) != Some(gateway) {
            continue;
        }
        let n = Node::at(&d.value, &d.file, &d.path);
        let Some(name) = n.required(p, "metadata", |n, p| n.required(p, "name", fields::name)).flatten().flatten()
        else {
            continue;
        };
        let origin = Origin { file: d.file.clone(), pos: Some(n.pos()), path: d.path.clone() };
        let mut s = ServiceDef { name: name.clone(), origin, ..Default::default() };
        let mut path = String::new();
        for key in ["sluice.io/lb-algorithm", "service.cilium.io/lb-algorithm"] {
            if let Some(a) = annotation(d, key, &mut path, p) {
                s.algorithm = a.parse(p, "an algorithm").or(s.algorithm);
            }
        }
        if let Some(n) = annotation(d, "sluice.io/endpoint-limit", &mut path, p) {
            s.limit = fields::endpoint_limit(n, p);
        }
        if let Some(n) = annotation(d, "sluice.io/table-size", &mut path, p) {
            s.table_size = fields::table_size(n, p);
        }
        if let Some(n) = annotation(d, "sluice.io/flow-table", &mut path, p) {
            s.flow_table = n.boolean(p);
        }
        if let Some(n) = annotation(d, "sluice.io/delivery", &mut path, p) {
            s.delivery = n.parse::<DeliveryMode>(p, "a delivery");
        }
        ours.insert(name, ());
        out.services.push(s);
    }

    for d in docs {
        let n = Node::at(&d.value, &d.file, &d.path);
        match kind(d).as_str() {
            "L34Route" => {
                let Some(name) = name_of(d) else {
                    n.bad(p, "missing metadata.name");
                    continue;
                };
                n.required(p, "spec", |spec, p| {
                    spec.mapping(
                        p,
                        &[
                            "parentRefs", "backendRefs", "priority", "destinationCIDRs", "sourceCIDRs", "sourcePorts",
                            "destinationPorts", "protocols", "byteMatches",
                        ],
                    );
                    let mut parents = Vec::new();
                    spec.field("parentRefs", |n| {
                        n.each(p, |n, p| parents.extend(n.required(p, "name", |n, p| n.string(p)).flatten()))
                    });
                    if !parents.iter().any(|x| x == gateway) {
                        return; // another Gateway's route
                    }
                    if parents.len() != 1 {
                        spec.bad(p, "an L34Route has exactly one parentRef");
                    }
                    let mut backends = Vec::new();
                    spec.required(p, "backendRefs", |n, p| {
                        n.each(p, |n, p| backends.extend(n.required(p, "name", fields::name).flatten()))
                    });
                    if backends.len() != 1 {
                        spec.bad(p, format!("an L34Route has exactly one backendRef (found {})", backends.len()));
                        return;
                    }
                    if let Some(r) = route_fields(spec, p, name.clone(), backends[0].clone()) {
                        out.routes.push(r);
                    }
                });
            }
            "EndpointSlice" => {
                let Some(svc) = label(&d.value, SERVICE_NAME_LABEL) else { continue };
                if !ours.contains_key(svc) {
                    continue;
                }
                endpoint_slice(d, n, svc, p, &mut out);
            }
            "Gateway" | "GatewayClass" | "Service" | "GatewayRouter" => {}
            k if d.value.get("apiVersion").and_then(Value::as_str).is_some_and(|a| a.contains("meridio") || a.contains("gateway.networking")) => {
                n.bad(p, format!("unknown kind {k:?} (Gateway, GatewayClass, L34Route, GatewayRouter)"));
            }
            _ => {}
        }
    }
    out
}

fn endpoint_slice(d: &Doc, n: Node<'_>, svc: &str, p: &mut Problems, out: &mut Desired) {
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
            out.endpoints.push(EndpointDef {
                service: svc.to_owned(),
                id,
                address: addr,
                weight: 1,
                draining,
                mac: None,
                origin: Origin { file: e.file().to_owned(), pos: Some(e.pos()), path: e.path().to_owned() },
            });
        })
    });
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

    fn docs(text: &str) -> Vec<Doc> {
        let (values, err) = yaml::documents(text, &mut Budget::default());
        assert!(err.is_none(), "{err:?}");
        named("m.yaml", values).collect()
    }

    #[test]
    fn the_seed_example_becomes_a_route_a_service_and_endpoints() {
        let mut p = Problems::default();
        let d = from_docs(&docs(DOCS), "d", "sllb-a", &mut p);
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
        from_docs(&docs(&text), "d", "sllb-z", &mut p);
        assert!(p.0.iter().any(|e| e.message.contains("no Gateway named \"sllb-z\"")));
        let mut p = Problems::default();
        from_docs(&docs(&text), "d", "sllb-a", &mut p);
        assert!(p.0.iter().any(|e| e.message.contains("169.111.100.2 has no identifier")), "{:?}", p.0);
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
        from_docs(&docs(text), "d", "g", &mut p);
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
}
