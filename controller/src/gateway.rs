//! The SLLBR workload of each Gateway: a Deployment built from the
//! operator's Resource Template and the Gateway's configuration (a pure
//! function of the objects).
//!
//! The template is a Deployment (`configs/k8s/controller/sllbr-template.yaml`
//! by default, or a file the operator mounts, from a ConfigMap); every
//! string in it may say `${GATEWAY}` and `${NAMESPACE}`. The controller
//! adds what ties the copy to its Gateway and nothing else: the namespace,
//! the `sluice.io/gateway` label (on the Deployment, its selector and its
//! pods), the managed-by label, the Gateway as controlling owner (deleting
//! the Gateway deletes it), the Gateway's `spec.infrastructure` labels and
//! annotations (Multus' `k8s.v1.cni.cncf.io/networks` among them) on the
//! pods, and what the Gateway's `infrastructure.parametersRef` ConfigMap
//! says (key `config.conf`, an `SLLBRConfig`: `replicas`,
//! `sllb.resources`, `router.resources`, `nodeSelector`, `affinity`).

use serde_json::{json, Map, Value as Json};

use super::Store;
use sluice_core::config::yaml;

pub use sluice_core::config::manifests::GATEWAY_LABEL;
/// The managed-by label of the Deployments.
pub(crate) const APP_MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The key of the parametersRef ConfigMap holding the configuration.
pub(crate) const CONFIG_KEY: &str = "config.conf";
/// The container that gets `sllb.resources`.
pub(crate) const SLLB_CONTAINER: &str = "stateless-load-balancer";
/// The container that gets `router.resources`.
pub(crate) const ROUTER_CONTAINER: &str = "router";
/// The default Resource Template.
pub const DEFAULT_TEMPLATE: &str = include_str!("../../configs/k8s/controller/sllbr-template.yaml");
/// Most replicas a configuration may ask for.
pub(crate) const MAX_REPLICAS: i64 = 1000;

/// Why a Resource Template cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The text is not YAML (the parser's position and message).
    #[error("{0}")]
    Yaml(String),
    /// It is some other object than a Deployment (its kind and apiVersion, as JSON).
    #[error("the template is not an apps/v1 Deployment (kind {kind}, apiVersion {api_version})")]
    NotADeployment {
        /// The object's `kind`.
        kind: Json,
        /// The object's `apiVersion`.
        api_version: Json,
    },
    /// The Deployment's pods would have no container.
    #[error("the template has no containers (spec.template.spec.containers)")]
    NoContainers,
    /// The Deployment has no name to give each Gateway's copy.
    #[error("the template has no metadata.name (say `sllbr-${{GATEWAY}}`, say)")]
    NoName,
    /// The template built into the binary is wrong.
    #[error("the built-in template: {0}")]
    BuiltIn(Box<TemplateError>),
}

/// Why a Gateway's `SLLBRConfig` (its parametersRef ConfigMap's text)
/// cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// The text is not YAML (the parser's position and message).
    #[error("{0}")]
    Yaml(String),
    /// The document is not a mapping.
    #[error("not a mapping")]
    NotAMapping,
    /// Its `kind` is another one (as JSON).
    #[error("kind {0} is not SLLBRConfig")]
    Kind(Json),
    /// `replicas` is not a number in range (the value, as JSON).
    #[error("replicas: {0} is not a number in 0..={MAX_REPLICAS}")]
    Replicas(Json),
    /// `sllb` or `router` (named) is not a mapping.
    #[error("{0}: not a mapping")]
    ContainerNotAMapping(String),
    /// `sllb` or `router` (first) has a field (second) other than `resources`.
    #[error("{0}: unknown field {1:?} (resources)")]
    ContainerField(String, String),
    /// Resources (at the path given) are not a mapping.
    #[error("{0}: not a mapping of requests and limits")]
    ResourcesNotAMapping(String),
    /// Resources (at the path given) have a field other than requests and limits.
    #[error("{0}: unknown field {1:?} (requests, limits)")]
    ResourcesField(String, String),
    /// Requests or limits (at the path given) are not a mapping.
    #[error("{0}: not a mapping of resource to quantity")]
    QuantitiesNotAMapping(String),
    /// A resource (at the path given) is neither a string nor a number (as JSON).
    #[error("{0}: not a quantity: {1}")]
    NotAQuantityValue(String, Json),
    /// A resource (at the path given) is a string that is no quantity.
    #[error("{0}: {1:?} is not a quantity (e.g. 250m, 64Mi, 2)")]
    NotAQuantity(String, String),
    /// `nodeSelector` is not a mapping of strings.
    #[error("nodeSelector: not a mapping of label to value")]
    NodeSelector,
    /// `affinity` is not a mapping.
    #[error("affinity: not a mapping")]
    Affinity,
    /// A field the configuration does not have.
    #[error("unknown field {0:?} (replicas, sllb, router, nodeSelector, affinity)")]
    UnknownField(String),
}

/// Why the configuration a Gateway names through its parametersRef cannot
/// be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParametersError {
    /// It names something other than a core ConfigMap (its kind and group).
    #[error("parametersRef names a {0} (group {1:?}): only a ConfigMap (core group) is read")]
    NotAConfigMap(String, String),
    /// The ConfigMap (namespace, name) is not there.
    #[error("parametersRef: no ConfigMap {0}/{1}")]
    NoConfigMap(String, String),
    /// The ConfigMap (namespace, name) has no [`CONFIG_KEY`].
    #[error("ConfigMap {0}/{1} has no {CONFIG_KEY:?}")]
    NoConfigKey(String, String),
    /// The ConfigMap's (namespace, name) configuration is wrong.
    #[error("ConfigMap {0}/{1}, {CONFIG_KEY}: {2}")]
    Config(String, String, ConfigError),
}

/// A Resource Template, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct Template(Json);

impl Template {
    /// Reads a template from YAML text (one Deployment).
    pub(crate) fn parse(text: &str) -> Result<Template, TemplateError> {
        let v = yaml::document(text, &mut yaml::Budget::default()).map_err(|e| TemplateError::Yaml(yaml_error(&e)))?.to_json();
        if v["kind"] != "Deployment" || v["apiVersion"] != "apps/v1" {
            return Err(TemplateError::NotADeployment { kind: v["kind"].clone(), api_version: v["apiVersion"].clone() });
        }
        if v.pointer("/spec/template/spec/containers").and_then(Json::as_array).is_none_or(Vec::is_empty) {
            return Err(TemplateError::NoContainers);
        }
        if v.pointer("/metadata/name").and_then(Json::as_str).is_none_or(str::is_empty) {
            return Err(TemplateError::NoName);
        }
        Ok(Template(v))
    }

    /// The default template.
    pub(crate) fn default_template() -> Result<Template, TemplateError> {
        Template::parse(DEFAULT_TEMPLATE).map_err(|e| TemplateError::BuiltIn(Box::new(e)))
    }

    /// The Deployment's name for Gateway `gw` in `ns`.
    pub(crate) fn name_for(&self, gw: &str, ns: &str) -> String {
        substitute(&self.0["metadata"]["name"], gw, ns).as_str().unwrap_or_default().to_owned()
    }
}

fn yaml_error(e: &yaml::YamlError) -> String {
    match e.pos {
        Some(p) => format!("{}:{}: {}", p.line, p.column, e.message),
        None => e.message.clone(),
    }
}

fn substitute(v: &Json, gw: &str, ns: &str) -> Json {
    match v {
        Json::String(s) => Json::String(s.replace("${GATEWAY}", gw).replace("${NAMESPACE}", ns)),
        Json::Array(a) => Json::Array(a.iter().map(|x| substitute(x, gw, ns)).collect()),
        Json::Object(m) => Json::Object(m.iter().map(|(k, x)| (k.clone(), substitute(x, gw, ns))).collect()),
        other => other.clone(),
    }
}

/// What a Gateway's parametersRef configuration says.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SllbrConfig {
    /// Replicas.
    pub(crate) replicas: Option<i64>,
    /// Resources of the load-balancer container.
    pub(crate) sllb_resources: Option<Json>,
    /// Resources of the router container.
    pub(crate) router_resources: Option<Json>,
    /// Node selector of the pods.
    pub(crate) node_selector: Option<Json>,
    /// Affinity of the pods.
    pub(crate) affinity: Option<Json>,
}

fn resources(v: &Json, at: &str) -> Result<Json, ConfigError> {
    let m = v.as_object().ok_or_else(|| ConfigError::ResourcesNotAMapping(at.to_owned()))?;
    for (k, q) in m {
        if k != "requests" && k != "limits" {
            return Err(ConfigError::ResourcesField(at.to_owned(), k.clone()));
        }
        let q = q.as_object().ok_or_else(|| ConfigError::QuantitiesNotAMapping(format!("{at}.{k}")))?;
        for (r, n) in q {
            let s = match n {
                Json::String(s) => s.clone(),
                Json::Number(n) => n.to_string(),
                _ => return Err(ConfigError::NotAQuantityValue(format!("{at}.{k}.{r}"), n.clone())),
            };
            let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
            if digits.is_empty() || digits.parse::<f64>().is_err() || s.len() - digits.len() > 2 {
                return Err(ConfigError::NotAQuantity(format!("{at}.{k}.{r}"), s));
            }
        }
    }
    Ok(v.clone())
}

/// Reads an `SLLBRConfig` (YAML text).
pub(crate) fn parse_config(text: &str) -> Result<SllbrConfig, ConfigError> {
    let v = yaml::document(text, &mut yaml::Budget::default()).map_err(|e| ConfigError::Yaml(yaml_error(&e)))?.to_json();
    let Some(m) = v.as_object() else { return Err(ConfigError::NotAMapping) };
    let mut c = SllbrConfig::default();
    for (k, x) in m {
        match k.as_str() {
            "apiVersion" => {}
            "kind" if x == "SLLBRConfig" => {}
            "kind" => return Err(ConfigError::Kind(x.clone())),
            "replicas" => match x.as_i64() {
                Some(n) if (0..=MAX_REPLICAS).contains(&n) => c.replicas = Some(n),
                _ => return Err(ConfigError::Replicas(x.clone())),
            },
            "sllb" | "router" => {
                let Some(sub) = x.as_object() else { return Err(ConfigError::ContainerNotAMapping(k.clone())) };
                for (sk, sx) in sub {
                    if sk != "resources" {
                        return Err(ConfigError::ContainerField(k.clone(), sk.clone()));
                    }
                    let r = Some(resources(sx, &format!("{k}.resources"))?);
                    if k == "sllb" {
                        c.sllb_resources = r;
                    } else {
                        c.router_resources = r;
                    }
                }
            }
            "nodeSelector" if x.as_object().is_some_and(|m| m.values().all(Json::is_string)) => c.node_selector = Some(x.clone()),
            "nodeSelector" => return Err(ConfigError::NodeSelector),
            "affinity" if x.is_object() => c.affinity = Some(x.clone()),
            "affinity" => return Err(ConfigError::Affinity),
            other => return Err(ConfigError::UnknownField(other.to_owned())),
        }
    }
    Ok(c)
}

/// The configuration `gw` names through `spec.infrastructure.parametersRef`
/// (none when it names none), or why it cannot be had.
pub(crate) fn gateway_config(store: &Store, gw: &Json) -> Result<Option<SllbrConfig>, ParametersError> {
    let Some(r) = gw.pointer("/spec/infrastructure/parametersRef") else { return Ok(None) };
    let ns = gw.pointer("/metadata/namespace").and_then(Json::as_str).unwrap_or("default");
    let kind = r.get("kind").and_then(Json::as_str).unwrap_or("");
    let group = r.get("group").and_then(Json::as_str).unwrap_or("");
    let name = r.get("name").and_then(Json::as_str).unwrap_or("");
    if kind != "ConfigMap" || !group.is_empty() {
        return Err(ParametersError::NotAConfigMap(kind.to_owned(), group.to_owned()));
    }
    let cm = store.get("ConfigMap", ns, name).ok_or_else(|| ParametersError::NoConfigMap(ns.to_owned(), name.to_owned()))?;
    let text = cm.pointer("/data").and_then(|d| d.get(CONFIG_KEY)).and_then(Json::as_str).ok_or_else(|| ParametersError::NoConfigKey(ns.to_owned(), name.to_owned()))?;
    parse_config(text).map(Some).map_err(|e| ParametersError::Config(ns.to_owned(), name.to_owned(), e))
}

fn merge_into(target: &mut Json, path: &[&str], add: &Map<String, Json>) {
    let mut t = target;
    for p in path {
        if !t[*p].is_object() {
            t[*p] = json!({});
        }
        t = &mut t[*p];
    }
    if let Some(m) = t.as_object_mut() {
        for (k, v) in add {
            m.insert(k.clone(), v.clone());
        }
    }
}

/// The Deployment of Gateway `gw` from `template` and its configuration.
pub(crate) fn deployment(template: &Template, gw: &Json, config: Option<&SllbrConfig>) -> Json {
    let name = gw.pointer("/metadata/name").and_then(Json::as_str).unwrap_or_default();
    let ns = gw.pointer("/metadata/namespace").and_then(Json::as_str).unwrap_or("default");
    let mut d = substitute(&template.0, name, ns);
    d["metadata"]["namespace"] = json!(ns);
    for key in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields"] {
        if let Some(m) = d["metadata"].as_object_mut() {
            m.remove(key);
        }
    }
    if let Some(m) = d.as_object_mut() {
        m.remove("status");
    }
    let ours: Map<String, Json> = [(GATEWAY_LABEL.to_owned(), json!(name))].into_iter().collect();
    let mut meta_labels = ours.clone();
    meta_labels.insert(APP_MANAGED_BY_LABEL.into(), json!(super::MANAGED_BY));
    let infra_labels = gw.pointer("/spec/infrastructure/labels").and_then(Json::as_object).cloned().unwrap_or_default();
    let infra_annotations = gw.pointer("/spec/infrastructure/annotations").and_then(Json::as_object).cloned().unwrap_or_default();
    merge_into(&mut d, &["metadata", "labels"], &infra_labels);
    merge_into(&mut d, &["metadata", "labels"], &meta_labels);
    merge_into(&mut d, &["spec", "selector", "matchLabels"], &ours);
    merge_into(&mut d, &["spec", "template", "metadata", "labels"], &infra_labels);
    merge_into(&mut d, &["spec", "template", "metadata", "labels"], &ours);
    merge_into(&mut d, &["spec", "template", "metadata", "annotations"], &infra_annotations);
    // An owner reference needs the owner's uid, which only the server
    // knows (a dry run over files has none): without it there is none.
    if let Some(uid) = gw.pointer("/metadata/uid").and_then(Json::as_str).filter(|u| !u.is_empty()) {
        d["metadata"]["ownerReferences"] = json!([{
            "apiVersion": gw.get("apiVersion").cloned().unwrap_or(json!("gateway.networking.k8s.io/v1")),
            "kind": "Gateway", "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true,
        }]);
    } else if let Some(m) = d["metadata"].as_object_mut() {
        m.remove("ownerReferences");
    }
    if let Some(c) = config {
        if let Some(r) = c.replicas {
            d["spec"]["replicas"] = json!(r);
        }
        if let Some(s) = &c.node_selector {
            d["spec"]["template"]["spec"]["nodeSelector"] = s.clone();
        }
        if let Some(a) = &c.affinity {
            d["spec"]["template"]["spec"]["affinity"] = a.clone();
        }
        if let Some(containers) = d.pointer_mut("/spec/template/spec/containers").and_then(Json::as_array_mut) {
            for ct in containers {
                let r = match ct["name"].as_str() {
                    Some(SLLB_CONTAINER) => &c.sllb_resources,
                    Some(ROUTER_CONTAINER) => &c.router_resources,
                    _ => &None,
                };
                if let Some(r) = r {
                    ct["resources"] = r.clone();
                }
            }
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_CONFIG: &str = "apiVersion: meridio.experiment.gateway.api.poc/v1alpha1\nkind: SLLBRConfig\nreplicas: 2\n\
sllb:\n  resources:\n    requests:\n      memory: \"64Mi\"\n      cpu: \"250m\"\n    limits:\n      memory: \"128Mi\"\n      cpu: \"500m\"\n\
router:\n  resources:\n    requests:\n      memory: \"64Mi\"\n      cpu: \"250m\"\n    limits:\n      memory: \"128Mi\"\n      cpu: \"500m\"\n";

    fn gw() -> Json {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
            "metadata": {"name": "sllb-a", "namespace": "t", "uid": "uid-gw"},
            "spec": {"gatewayClassName": "meridio-experiment/stateless-load-balancer",
                "infrastructure": {"labels": {"team": "a"}, "annotations": {
                    "k8s.v1.cni.cncf.io/networks": r#"[{"name":"vlan-100","interface":"vlan-100"},{"name":"macvlan-nad-1","interface":"net1"}]"#,
                    "meridio-experiment/networks": r#"[{"name":"macvlan-nad-1","interface":"net1"}]"#},
                    "parametersRef": {"group": "", "kind": "ConfigMap", "name": "sllb-a-config"}}}})
    }

    fn cm(text: &str) -> Json {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sllb-a-config", "namespace": "t"}, "data": {CONFIG_KEY: text}})
    }

    #[test]
    fn the_deployment_has_the_templates_fields_and_the_gateways() {
        let t = Template::default_template().unwrap();
        let mut store = Store::default();
        store.apply(cm(SEED_CONFIG));
        let c = gateway_config(&store, &gw()).unwrap().unwrap();
        assert_eq!(c.replicas, Some(2));
        let d = deployment(&t, &gw(), Some(&c));
        assert_eq!(d["metadata"]["name"], "sllbr-sllb-a");
        assert_eq!(d["metadata"]["namespace"], "t");
        assert_eq!(d["metadata"]["labels"][GATEWAY_LABEL], "sllb-a");
        assert_eq!(d["metadata"]["labels"]["team"], "a");
        assert_eq!(d["metadata"]["ownerReferences"][0], json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "name": "sllb-a", "uid": "uid-gw", "controller": true, "blockOwnerDeletion": true}));
        assert_eq!(d["spec"]["replicas"], 2);
        assert_eq!(d["spec"]["selector"]["matchLabels"][GATEWAY_LABEL], "sllb-a");
        let pod = &d["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"][GATEWAY_LABEL], "sllb-a");
        assert!(pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"].as_str().unwrap().contains("vlan-100"));
        let sllb = pod["spec"]["containers"].as_array().unwrap().iter().find(|c| c["name"] == SLLB_CONTAINER).unwrap();
        assert_eq!(sllb["resources"]["limits"]["cpu"], "500m");
        // The template's own fields, with the placeholders filled in.
        let tv = &t.0;
        assert_eq!(pod["spec"]["serviceAccountName"], tv["spec"]["template"]["spec"]["serviceAccountName"]);
        assert_eq!(pod["spec"]["securityContext"], tv["spec"]["template"]["spec"]["securityContext"]);
        assert!(d.to_string().contains("sluice-sllb-a") && !d.to_string().contains("${GATEWAY}"));
        // The API's own type reads it.
        let typed: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(d).unwrap();
        assert_eq!(typed.spec.unwrap().replicas, Some(2));
    }

    #[test]
    fn an_operator_template_is_used_as_written() {
        let t = Template::parse("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: lb-${GATEWAY}-${NAMESPACE}\n  labels: {tier: edge}\n\
spec:\n  replicas: 3\n  selector: {matchLabels: {app: lb}}\n  template:\n    metadata: {labels: {app: lb}}\n    spec:\n      containers:\n      - {name: x, image: \"img:${GATEWAY}\"}\n").unwrap();
        let d = deployment(&t, &gw(), None);
        assert_eq!(d["metadata"]["name"], "lb-sllb-a-t");
        assert_eq!(t.name_for("sllb-a", "t"), "lb-sllb-a-t");
        assert_eq!(d["metadata"]["labels"]["tier"], "edge");
        assert_eq!(d["spec"]["replicas"], 3);
        assert_eq!(d["spec"]["selector"]["matchLabels"], json!({"app": "lb", GATEWAY_LABEL: "sllb-a"}));
        assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "img:sllb-a");
        assert!(Template::parse("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").unwrap_err().to_string().contains("not an apps/v1 Deployment"));
        assert!(Template::parse("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {}\n").unwrap_err().to_string().contains("no containers"));
    }

    #[test]
    fn the_shipped_manifests_carry_the_default_template_and_the_designs_grants() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/k8s/controller");
        let text = std::fs::read_to_string(dir.join("controller.yaml")).unwrap();
        let (docs, err) = yaml::documents(&text, &mut yaml::Budget::default());
        assert!(err.is_none());
        let docs: Vec<Json> = docs.iter().map(yaml::Value::to_json).collect();
        let cm = docs.iter().find(|d| d["kind"] == "ConfigMap").unwrap();
        let copy = Template::parse(cm["data"]["sllbr-template.yaml"].as_str().unwrap()).unwrap();
        assert_eq!(copy, Template::default_template().unwrap(), "controller.yaml's template is sllbr-template.yaml");
        // The ClusterRole: the design's list for the Controller-Manager, plus
        // ConfigMaps (parametersRef), events, the owners' finalizers and the
        // Services' identifier annotation; Leases only in a Role.
        let rbac = std::fs::read_to_string(dir.join("rbac.yaml")).unwrap();
        let (docs, _) = yaml::documents(&rbac, &mut yaml::Budget::default());
        let docs: Vec<Json> = docs.iter().map(yaml::Value::to_json).collect();
        let role = docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap();
        let mut grants: Vec<String> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| {
                let verbs: Vec<&str> = r["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
                r["resources"].as_array().unwrap().iter().map(move |x| format!("{}: {}", x.as_str().unwrap(), verbs.join(",")))
            })
            .collect();
        grants.sort();
        assert_eq!(grants, vec![
            "configmaps: get,list,watch",
            "deployments: create,delete,get,list,patch,update,watch",
            "endpointslices: create,delete,get,list,patch,update,watch",
            "events: create,patch",
            "gateways/finalizers: update",
            "gateways/status: patch,update",
            "gateways: get,list,watch",
            "l34routes: get,list,watch",
            "pods: get,list,watch",
            "services/finalizers: update",
            "services: get,list,patch,watch",
        ]);
        let lease = docs.iter().find(|d| d["kind"] == "Role").unwrap();
        assert_eq!(lease["rules"], json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]));
    }

    #[test]
    fn a_wrong_or_missing_configuration_says_why() {
        let store = Store::default();
        assert_eq!(gateway_config(&store, &gw()).unwrap_err().to_string(), "parametersRef: no ConfigMap t/sllb-a-config");
        for (text, why) in [
            ("replicas: -1\n", "replicas: -1 is not a number in 0..=1000"),
            ("replicas: 2\nreplica: 3\n", "unknown field \"replica\""),
            ("sllb:\n  resources:\n    requests: {cpu: lots}\n", "sllb.resources.requests.cpu: \"lots\" is not a quantity"),
            ("kind: Other\n", "kind \"Other\" is not SLLBRConfig"),
        ] {
            let mut s = Store::default();
            s.apply(cm(text));
            let e = gateway_config(&s, &gw()).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        let mut g = gw();
        g["spec"]["infrastructure"]["parametersRef"] = json!({"group": "example.com", "kind": "Params", "name": "p"});
        assert!(gateway_config(&store, &g).unwrap_err().to_string().contains("only a ConfigMap"));
        g["spec"]["infrastructure"].as_object_mut().unwrap().remove("parametersRef");
        assert_eq!(gateway_config(&store, &g).unwrap(), None);
    }
}
