//! Kubernetes-style manifests as a source of services, with the kinds and
//! field names of the Meridio 2.x design: `Gateway`, `L34Route` (routes),
//! `Service` (with `service.kubernetes.io/service-proxy-name` naming the
//! Gateway) and `EndpointSlice` (endpoints; their identifiers in the
//! `sluice.io/endpoint-ids` annotation). The same YAML an operator applies
//! to a cluster runs the appliance standalone.
//!
//! Service settings come from annotations: `sluice.io/lb-algorithm` (or
//! Cilium's `service.cilium.io/lb-algorithm`), `sluice.io/endpoint-limit`,
//! `sluice.io/table-size`, `sluice.io/flow-table`, `sluice.io/delivery`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml::Value;
use sluice_dataplane::addr::Addr;

use super::node::{Node, Problem, Problems};
use super::{fields, route_fields};
use crate::model::{DeliveryMode, Desired, EndpointDef, Origin, ServiceDef};

/// Label naming the Gateway a Service runs in.
pub const PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Annotation mapping endpoint addresses to identifiers (a JSON object).
pub const ENDPOINT_IDS: &str = "sluice.io/endpoint-ids";

/// The manifest files of `dir`, sorted.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>, Problem> {
    let rd = std::fs::read_dir(dir).map_err(|e| Problem {
        file: dir.display().to_string(),
        path: String::new(),
        message: format!("cannot read the manifests directory: {e}"),
    })?;
    let mut v: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
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

fn annotation<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    meta(v, "annotations")?.get(key)?.as_str()
}

/// Reads every manifest in `dir` and keeps what belongs to `gateway`.
pub fn load(dir: &Path, gateway: &str) -> Result<Desired, Vec<Problem>> {
    let mut p = Problems::default();
    let mut docs = Vec::new();
    for f in files(dir).map_err(|e| vec![e])? {
        let file = f.display().to_string();
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) => {
                p.add(&file, "", format!("cannot read: {e}"));
                continue;
            }
        };
        for (i, d) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            match Value::deserialize(d) {
                Ok(Value::Null) => {}
                Ok(value) => {
                    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("?");
                    let name = meta(&value, "name").and_then(Value::as_str).unwrap_or("?");
                    docs.push(Doc { file: file.clone(), path: format!("[doc {i}] {kind}/{name}"), value });
                }
                Err(e) => p.add(&file, &format!("[doc {i}]"), format!("not valid YAML: {e}")),
            }
        }
    }
    let out = from_docs(&docs, gateway, &mut p);
    if p.is_empty() {
        Ok(out)
    } else {
        Err(p.0)
    }
}

fn from_docs(docs: &[Doc], gateway: &str, p: &mut Problems) -> Desired {
    let mut out = Desired::default();
    let kind = |d: &Doc| d.value.get("kind").and_then(Value::as_str).unwrap_or("").to_owned();
    let name_of = |d: &Doc| meta(&d.value, "name").and_then(Value::as_str).map(str::to_owned);

    if !docs.iter().any(|d| kind(d) == "Gateway" && name_of(d).as_deref() == Some(gateway)) {
        let file = docs.first().map_or("(manifests)".to_owned(), |d| d.file.clone());
        p.add(&file, "", format!("no Gateway named {gateway:?} among the manifests"));
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
        let ann = |key: &str| annotation(&d.value, key);
        let bad = |p: &mut Problems, key: &str, why: String| p.add(&d.file, &format!("{}.metadata.annotations.{key}", d.path), why);
        let mut s = ServiceDef { name: name.clone(), origin: Origin { file: d.file.clone(), path: d.path.clone() }, ..Default::default() };
        for key in ["sluice.io/lb-algorithm", "service.cilium.io/lb-algorithm"] {
            if let Some(a) = ann(key) {
                match a.parse() {
                    Ok(a) => s.algorithm = Some(a),
                    Err(e) => bad(p, key, e),
                }
            }
        }
        let num = |p: &mut Problems, key: &str| -> Option<u32> {
            let v = ann(key)?;
            match v.trim().parse() {
                Ok(n) => Some(n),
                Err(_) => {
                    bad(p, key, format!("{v:?} is not a whole number"));
                    None
                }
            }
        };
        s.limit = num(p, "sluice.io/endpoint-limit");
        s.table_size = num(p, "sluice.io/table-size");
        if let Some(v) = ann("sluice.io/flow-table") {
            match v {
                "true" | "false" => s.flow_table = Some(v == "true"),
                _ => bad(p, "sluice.io/flow-table", format!("{v:?} is not true or false")),
            }
        }
        if let Some(v) = ann("sluice.io/delivery") {
            match v.parse::<DeliveryMode>() {
                Ok(m) => s.delivery = Some(m),
                Err(e) => bad(p, "sluice.io/delivery", e),
            }
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
    let ids: BTreeMap<String, u32> = match annotation(&d.value, ENDPOINT_IDS) {
        Some(text) => match serde_json::from_str::<BTreeMap<String, u32>>(text) {
            Ok(m) => m,
            Err(e) => {
                p.add(&d.file, &format!("{}.metadata.annotations.{ENDPOINT_IDS}", d.path), format!(
                    "not a JSON object of address to identifier: {e}"
                ));
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
                        first = a.parse::<Addr>(p, "an IP address");
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
                origin: Origin { file: e.file().to_owned(), path: e.path().to_owned() },
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
        serde_yaml::Deserializer::from_str(text)
            .enumerate()
            .map(|(i, d)| Doc { file: "m.yaml".into(), path: format!("[doc {i}]"), value: Value::deserialize(d).unwrap() })
            .collect()
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
}
