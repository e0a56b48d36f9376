//! What an operator applies to install Sluice on a cluster, checked
//! without one.
//!
//! - `sluice controller --dry-run` writes what applies (no owner
//!   reference without the owner's uid, nothing only the server fills
//!   in) and reads the List documents `kubectl get -o yaml` writes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};
use sluice::config::yaml;
use sluice::controller::{dryrun, Settings};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
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
