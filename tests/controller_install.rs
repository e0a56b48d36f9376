//! What an operator applies to install Sluice on a cluster, checked
//! without one: the shipped RBAC against what the controller writes, and
//! the README's install commands in their order.
//!
//! - The controller writes owner references with `blockOwnerDeletion`
//!   (EndpointSlices owned by their Service, Deployments by their
//!   Gateway); under the OwnerReferencesPermissionEnforcement admission
//!   plugin that needs `update` on the owner's `finalizers` subresource.
//!   The test finds the owners from the controller's own plan and checks
//!   the ClusterRole grants it; no rule of any shipped role uses a
//!   wildcard.
//! - `sluice-controller --dry-run` writes what applies (no owner
//!   reference without the owner's uid, nothing only the server fills
//!   in) and reads the List documents `kubectl get -o yaml` writes.
//! - The README's controller install, command by command, in order, on
//!   the fake API server refusing creates into a namespace that does not
//!   exist (and, for what it does not serve, a model of a fresh cluster:
//!   a cluster-scoped object needs its kind, a custom kind its CRD
//!   applied before); at the end, every kind the controller watches is
//!   installed, the Gateway API's at v1.2 or later (`spec.infrastructure`).
//! - The `sluice-controller` binary does not link DPDK: no `rte_` symbol and
//!   no DPDK library (or a DPDK driver's) among the libraries it needs.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kube::api::{ApiResource, DynamicObject, PostParams};
use serde_json::{json, Value as Json};
use sluice::config::yaml;
use sluice_controller::{dryrun, plan, Settings};
use sluice_tests::fake_apiserver::{FakeApi, RESOURCES};
use sluice_tests::tool_bin;

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

/// What of DPDK a binary links: its symbols named `rte_*` (DPDK is linked
/// statically) and the shared libraries it needs that are DPDK's or its
/// drivers' (`librte_*`, `libnuma`, `libibverbs`, `libmlx*`).
fn dpdk_in(bin: &Path) -> (usize, Vec<String>) {
    let out = |cmd: &str, args: &[&str]| {
        let o = std::process::Command::new(cmd).args(args).arg(bin).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
        assert!(o.status.success(), "{cmd} {}: {}", bin.display(), String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let symbols = out("nm", &["--defined-only"]).lines().filter(|l| l.split_whitespace().last().is_some_and(|s| s.starts_with("rte_"))).count();
    let libraries = out("readelf", &["-d"])
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| l.split('[').nth(1).map(|s| s.trim_end_matches(']').to_owned()))
        .filter(|lib| ["librte_", "libnuma", "libibverbs", "libmlx"].iter().any(|p| lib.starts_with(p)))
        .collect();
    (symbols, libraries)
}

#[test]
fn the_controller_does_not_link_dpdk() {
    let appliance = dpdk_in(&sluice_tests::sluice_bin());
    assert!(appliance.0 > 100, "the check sees DPDK where it is: {} rte_ symbols in sluice", appliance.0);
    let controller = dpdk_in(&tool_bin("sluice-controller"));
    assert_eq!(controller, (0, Vec::new()), "sluice-controller links DPDK: (rte_ symbols, libraries)");
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
fn output(store: &sluice_controller::Store) -> Vec<Json> {
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

/// Kinds a fresh cluster has, namespaced or not.
const BUILT_IN: [&str; 15] = [
    "Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "ConfigMap",
    "Deployment", "Service", "Pod", "EndpointSlice", "Lease", "Event", "Secret",
];
/// Cluster-scoped kinds among them and the Gateway API's.
const CLUSTER_SCOPED: [&str; 5] = ["Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "GatewayClass"];

/// The `kubectl` command lines of the README's controller section, in order.
fn readme_commands() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = text.find("### The controller").expect("the README's controller section");
    let rest = &text[start..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    rest[..end]
        .lines()
        .map(|l| l.split(" #").next().unwrap_or("").trim())
        .filter(|l| l.starts_with("kubectl "))
        .map(str::to_owned)
        .collect()
}

/// The Gateway API version of a release's install manifest URL.
fn gateway_api_version(url: &str) -> Option<(u32, u32)> {
    let rest = url.strip_prefix("https://github.com/kubernetes-sigs/gateway-api/releases/download/v")?;
    let (version, file) = rest.split_once('/')?;
    if !file.ends_with("-install.yaml") {
        return None;
    }
    let mut it = version.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// The files a `-f` names: a file, or a directory's YAML files in order.
fn files_of(arg: &str) -> Vec<PathBuf> {
    let p = root().join(arg);
    if p.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()).filter(|f| f.extension().is_some_and(|x| x == "yaml" || x == "yml")).collect();
        v.sort();
        v
    } else {
        assert!(p.is_file(), "the README applies {arg}, which is not in the repository");
        vec![p]
    }
}

fn resource(kind: &str) -> Option<ApiResource> {
    let r = RESOURCES.iter().find(|r| r.2 == kind)?;
    let (group, version) = r.3.split_once('/').unwrap_or(("", r.3));
    Some(ApiResource { group: group.into(), version: version.into(), api_version: r.3.into(), kind: kind.into(), plural: r.1.into() })
}

/// Walks the README's controller install on a fresh cluster; the problems.
async fn walk(commands: &[String]) -> Vec<String> {
    let api = FakeApi::start_new().await;
    for ns in ["default", "kube-system", "kube-public"] {
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}));
    }
    let kubeconfig = std::env::temp_dir().join(format!("sluice-install-{}.kubeconfig", std::process::id()));
    std::fs::write(&kubeconfig, api.kubeconfig("default")).unwrap();
    let client = sluice_controller::client::client(Some(&kubeconfig)).await.unwrap();
    let _ = std::fs::remove_file(&kubeconfig);

    let mut kinds: BTreeSet<String> = BUILT_IN.iter().map(|k| (*k).to_owned()).collect();
    let mut problems = Vec::new();
    for cmd in commands {
        let words: Vec<&str> = cmd.split_whitespace().collect();
        if words.get(1) != Some(&"apply") {
            continue;
        }
        let mut namespace = "default".to_owned();
        let mut files: Vec<&str> = Vec::new();
        let mut i = 2;
        while i < words.len() {
            match words[i] {
                "-n" | "--namespace" => namespace = words.get(i + 1).copied().unwrap_or("").to_owned(),
                "-f" | "--filename" => files.extend(words.get(i + 1).copied()),
                _ => {
                    i += 1;
                    continue;
                }
            }
            i += 2;
        }
        for f in files {
            if f.starts_with("https://") {
                match gateway_api_version(f) {
                    Some(v) if v >= (1, 2) => kinds.extend(["Gateway", "GatewayClass", "HTTPRoute", "GRPCRoute", "ReferenceGrant"].map(str::to_owned)),
                    Some((a, b)) => problems.push(format!("{cmd}: the Gateway API v{a}.{b} has no spec.infrastructure (v1.2 or later)")),
                    None => problems.push(format!("{cmd}: an URL the walk does not know: {f}")),
                }
                continue;
            }
            for file in files_of(f) {
                for d in documents(&file) {
                    let kind = d["kind"].as_str().unwrap_or("").to_owned();
                    let name = d["metadata"]["name"].as_str().unwrap_or("").to_owned();
                    let what = format!("{cmd}: {} {kind}/{name}", file.strip_prefix(root()).unwrap_or(&file).display());
                    if !kinds.contains(&kind) {
                        problems.push(format!("{what}: no such kind yet (its CRD is not installed before it)"));
                        continue;
                    }
                    if kind == "CustomResourceDefinition" {
                        kinds.extend(d["spec"]["names"]["kind"].as_str().map(str::to_owned));
                    }
                    let Some(ar) = resource(&kind) else { continue };
                    let obj: DynamicObject = serde_json::from_value(d.clone()).unwrap();
                    let res = if CLUSTER_SCOPED.contains(&kind.as_str()) {
                        kube::Api::<DynamicObject>::all_with(client.clone(), &ar).create(&PostParams::default(), &obj).await
                    } else {
                        let ns = d["metadata"]["namespace"].as_str().unwrap_or(&namespace).to_owned();
                        kube::Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ar).create(&PostParams::default(), &obj).await
                    };
                    if let Err(e) = res {
                        problems.push(format!("{what}: {e}"));
                    }
                }
            }
        }
    }
    for k in sluice_controller::client::KINDS {
        if !kinds.contains(k) {
            problems.push(format!("the controller watches {k}s, which no command installs (a prerequisite is missing)"));
        }
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readmes_controller_install_works_on_a_fresh_cluster() {
    let commands = readme_commands();
    assert!(commands.iter().any(|c| c.contains("configs/k8s/controller/controller.yaml")), "{commands:#?}");
    let problems = walk(&commands).await;
    assert!(problems.is_empty(), "the README's controller install fails:\n{}", problems.join("\n"));

    // The walk catches what it checks: a namespaced object before its
    // Namespace, a missing prerequisite.
    let late: Vec<String> = vec!["kubectl apply -f configs/k8s/controller/rbac.yaml".into()];
    let problems = walk(&late).await;
    assert!(problems.iter().any(|p| p.contains("ServiceAccount/sluice-controller") && p.contains("namespaces \"sluice-system\" not found")), "{problems:#?}");
    assert!(problems.iter().any(|p| p.contains("watches Gateways")), "{problems:#?}");
}
