//! What an operator applies to install Sluice on a cluster, checked
//! without one: the shipped RBAC against what the controller writes.
//!
//! - The controller writes owner references with `blockOwnerDeletion`
//!   (EndpointSlices owned by their Service, Deployments by their
//!   Gateway); under the OwnerReferencesPermissionEnforcement admission
//!   plugin that needs `update` on the owner's `finalizers` subresource.
//!   The test finds the owners from the controller's own plan and checks
//!   the ClusterRole grants it; no rule of any shipped role uses a
//!   wildcard.
//! - `sluice controller --dry-run` writes what applies (no owner
//!   reference without the owner's uid, nothing only the server fills
//!   in) and reads the List documents `kubectl get -o yaml` writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};
use sluice::config::yaml;
use sluice::controller::{dryrun, plan, Settings};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The documents of a YAML file, as JSON (empty ones left out).
fn documents(file: &Path) -> Vec<Json> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let (docs, err) = yaml::documents(&text, &mut yaml::Budget::default());
    assert!(err.is_none(), "{}: {err:?}", file.display());
    docs.iter().map(yaml::Value::to_json).filter(|d| !d.is_null()).collect()
}

/// The plural of a kind the controller owns objects through.
fn plural(kind: &str) -> String {
    format!("{}s", kind.to_lowercase())
}

fn strings(v: &Json) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(Json::as_str).map(str::to_owned).collect()
}

#[test]
fn the_controller_may_block_its_owners_deletion_and_no_rule_is_a_wildcard() {
    // The owners of what the controller writes, from its own plan over
    // the examples (given uids, as an API server's objects have).
    let mut store = dryrun::load(&root().join("configs/k8s/controller/examples"), "default").unwrap();
    let objects: Vec<Json> = ["Gateway", "Service", "Pod", "ConfigMap"]
        .iter()
        .flat_map(|k| store.of(k).map(|(_, o)| o.clone()).collect::<Vec<_>>())
        .collect();
    for mut o in objects {
        let name = o["metadata"]["name"].as_str().unwrap().to_owned();
        o["metadata"]["uid"] = json!(format!("uid-{name}"));
        store.apply(o);
    }
    let p = plan(&store, &Settings::defaults().unwrap());
    assert!(!p.slices.is_empty() && !p.deployments.is_empty(), "the examples give slices and a Deployment");
    let mut owners: BTreeSet<(String, String)> = BTreeSet::new();
    for o in p.slices.values().chain(p.deployments.values()) {
        for r in o.pointer("/metadata/ownerReferences").and_then(Json::as_array).into_iter().flatten() {
            if r["blockOwnerDeletion"] == true {
                let group = r["apiVersion"].as_str().unwrap().rsplit_once('/').map_or("", |(g, _)| g).to_owned();
                owners.insert((group, plural(r["kind"].as_str().unwrap())));
            }
        }
    }
    assert_eq!(owners, [("".to_owned(), "services".to_owned()), ("gateway.networking.k8s.io".to_owned(), "gateways".to_owned())].into());

    let rbac = documents(&root().join("configs/k8s/controller/rbac.yaml"));
    let role = rbac.iter().find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "sluice-controller").expect("the controller's ClusterRole");
    let rules = role["rules"].as_array().unwrap();
    for (group, resource) in &owners {
        let sub = format!("{resource}/finalizers");
        let granted = rules.iter().any(|r| {
            strings(&r["apiGroups"]).contains(group) && strings(&r["resources"]).contains(&sub) && strings(&r["verbs"]).iter().any(|v| v == "update")
        });
        assert!(granted, "the ClusterRole does not grant update on {group:?} {sub}: OwnerReferencesPermissionEnforcement refuses the owner references with blockOwnerDeletion");
    }

    for file in ["configs/k8s/controller/rbac.yaml", "configs/k8s/rbac.yaml"] {
        for d in documents(&root().join(file)) {
            if !matches!(d["kind"].as_str(), Some("Role" | "ClusterRole")) {
                continue;
            }
            for r in d["rules"].as_array().into_iter().flatten() {
                for field in ["apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"] {
                    assert!(!strings(&r[field]).iter().any(|x| x.contains('*')), "{file}: {} {}: a wildcard in {field}: {r}", d["kind"], d["metadata"]["name"]);
                }
            }
        }
    }
}

/// The documents of the dry run's output.
fn output(store: &sluice::controller::Store) -> Vec<Json> {
    let text = dryrun::render(store, &Settings::defaults().unwrap(), true);
    let (docs, err) = yaml::documents(&text, &mut yaml::Budget::default());
    assert!(err.is_none(), "{text}");
    docs.iter().map(yaml::Value::to_json).filter(|d| !d.is_null()).collect()
}

#[test]
fn the_output_applies_and_lists_from_kubectl_are_read() {
    let dir = root().join("configs/k8s/controller/examples");
    let store = dryrun::load(&dir, "default").unwrap();
    // Files have no uids: an owner reference without one is refused by
    // the API server, so none is written.
    let out = output(&store);
    assert!(out.len() >= 3, "{out:?}");
    for d in &out {
        for r in d.pointer("/metadata/ownerReferences").and_then(Json::as_array).into_iter().flatten() {
            assert!(r.get("uid").and_then(Json::as_str).is_some_and(|u| !u.is_empty()), "an owner reference without uid: {d}");
        }
        for f in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"] {
            assert!(d["metadata"].get(f).is_none(), "{f} is the server's: {d}");
        }
        assert!(d.get("status").is_none(), "{d}");
    }

    // What `kubectl get -o yaml` writes: one List of the objects, with
    // what the server filled in; read as the objects themselves.
    let mut items = Vec::new();
    for kind in ["Gateway", "Service", "Pod", "ConfigMap", "L34Route"] {
        for (_, o) in store.of(kind) {
            let mut o = o.clone();
            let name = o["metadata"]["name"].as_str().unwrap().to_owned();
            o["metadata"]["uid"] = json!(format!("uid-{name}"));
            o["metadata"]["resourceVersion"] = json!("42");
            items.push(o);
        }
    }
    let list = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items});
    let tmp = std::env::temp_dir().join(format!("sluice-dryrun-list-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::write(tmp.join("all.yaml"), sluice::sources::kube::crd::to_yaml(&list)).unwrap();
    let from_list = dryrun::load(&tmp, "default").unwrap();
    let _ = std::fs::remove_dir_all(&tmp);
    let out = output(&from_list);
    let slice = out.iter().find(|d| d["kind"] == "EndpointSlice").expect("slices from the List");
    assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], "uid-service-a", "{slice}");
    let dep = out.iter().find(|d| d["kind"] == "Deployment").expect("a Deployment from the List");
    assert_eq!(dep["metadata"]["ownerReferences"][0]["uid"], "uid-sllb-a", "{dep}");
    assert_eq!(out.len(), output(&store).len());
}
