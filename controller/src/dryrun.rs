//! `sluice-controller --dry-run DIR`: the controller's decisions on a
//! directory of manifests, without a cluster. The objects are read as the
//! appliance reads a manifests directory
//! ([`sluice_core::config::manifests::read_dir`]); objects without a namespace
//! are in the one given. The output is YAML: the EndpointSlices the
//! controller would write (identifiers read back from the controller's
//! slices found in DIR, as from a cluster), then, with `deployments`, the
//! Deployments, with what it left out as comments.

use std::path::Path;

use serde_json::{json, Value as Json};

use super::{plan, Settings, Store};
use sluice_core::config::manifests;
use sluice_core::crd::to_yaml;

/// Why a directory of manifests cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The problems reading it, one a line.
    #[error("{}", .0.join("\n"))]
    Manifests(Vec<String>),
}

/// The objects of `dir` (Lists read as their items), in `namespace`
/// unless they name one.
pub fn load(dir: &Path, namespace: &str) -> Result<Store, LoadError> {
    let objects = manifests::read_dir(dir).map_err(|ps| LoadError::Manifests(ps.iter().map(ToString::to_string).collect()))?;
    let mut store = Store::default();
    for o in objects {
        let v = o.value.to_json();
        // `kubectl get -o yaml` writes a List (`kind: List`, or `PodList`
        // and the like) of the objects.
        let items = match (v.get("kind").and_then(Json::as_str), v.get("items").and_then(Json::as_array)) {
            (Some(k), Some(items)) if k.ends_with("List") => items.clone(),
            _ => vec![v],
        };
        for mut v in items {
            if !v.is_object() || v.get("kind").and_then(Json::as_str).is_none() {
                continue;
            }
            if v.pointer("/metadata/namespace").and_then(Json::as_str).is_none() {
                v["metadata"]["namespace"] = json!(namespace);
            }
            store.apply(v);
        }
    }
    Ok(store)
}

/// The YAML the dry run prints for `store`.
pub fn render(store: &Store, settings: &Settings, deployments: bool) -> String {
    let p = plan(store, settings);
    let mut out = String::new();
    for (k, r) in &p.gateways {
        out.push_str(&format!("# Gateway {}/{}", k.0, k.1));
        match &r.invalid {
            Some(why) => out.push_str(&format!(": not handled: {why}\n")),
            None => out.push('\n'),
        }
        for (svc, f) in &r.full {
            out.push_str(&format!("#   Service {svc} is full ({} identifiers); left out: {}\n", f.limit, f.pods.join(", ")));
        }
        for (svc, why) in &r.invalid_services {
            out.push_str(&format!("#   Service {svc} is not handled: {why}\n"));
        }
    }
    for i in &p.ignored {
        if i.reason != "ServiceFull" {
            out.push_str(&format!("#   pod {} is not an endpoint of {}: {}: {}\n", i.pod, i.service, i.reason, i.message));
        }
    }
    if p.gateways.is_empty() {
        out.push_str(&format!("# no Gateway of class {:?}: nothing to write\n", settings.gateway_class));
    }
    for s in p.slices.values() {
        out.push_str("---\n");
        out.push_str(&to_yaml(s));
    }
    if deployments {
        for d in p.deployments.values() {
            out.push_str("---\n");
            out.push_str(&to_yaml(d));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::config::manifests::ENDPOINT_IDS;
    use sluice_core::config::yaml;

    const DIR: &str = "../configs/k8s/controller/examples";

    #[test]
    fn the_examples_give_slices_that_read_back_as_the_appliance_reads_them() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(DIR);
        let store = load(&dir, "default").unwrap();
        let text = render(&store, &Settings::defaults().unwrap(), false);
        let (docs, err) = yaml::documents(&text, &mut yaml::Budget::default());
        assert!(err.is_none(), "{text}");
        let slices: Vec<Json> = docs.iter().map(yaml::Value::to_json).filter(|d| !d.is_null()).collect();
        let names: Vec<&str> = slices.iter().map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, vec!["service-a-sluice-v4", "service-a-sluice-v6"], "{text}");
        let ids: std::collections::BTreeMap<String, u32> = serde_json::from_str(slices[0]["metadata"]["annotations"][ENDPOINT_IDS].as_str().unwrap()).unwrap();
        // target-a's IPv6 address took 1: identifiers are unique across families.
        assert_eq!(ids, [("169.111.100.2".to_owned(), 0), ("169.111.100.3".to_owned(), 2)].into(), "{text}");
        assert!(text.contains("#   pod target-c is not an endpoint of default/service-a: OutsideSubnets"), "{text}");
        // The appliance serves what the controller writes.
        let mut all = store.clone();
        for s in slices {
            all.apply(s);
        }
        let objects: Vec<manifests::Object> = all.of("EndpointSlice").chain(all.of("Service")).chain(all.of("Gateway")).chain(all.of("L34Route")).map(|(_, o)| manifests::Object::from_api(o)).collect();
        let scope = manifests::Scope::manifests("sllb-a");
        let m = manifests::map(&objects, &scope, &Default::default(), "t", "t");
        let d = m.desired();
        assert_eq!(d.endpoints.len(), 3, "{:?}", m.whole);
    }
}
