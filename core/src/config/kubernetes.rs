//! The `kubernetes:` section: the appliance serves one Gateway of one
//! namespace, watched from the Kubernetes API
//! ([`crate::sources::kube`]).
//!
//! ```yaml
//! kubernetes:
//!   gateway: sllb-a                  # the Gateway served
//!   namespace: default               # the only namespace watched
//!   kubeconfig: /etc/sluice/kubeconfig  # optional: in-cluster when unset
//!   gatewayClass: meridio-experiment/stateless-load-balancer  # optional
//!   algorithmConfiguration: annotation  # or global
//!   allowAlgorithmChange: false      # optional
//! ```

use std::path::{Path, PathBuf};

use super::fields;
use super::node::Node;
use crate::problem::Problems;

/// The GatewayClass served unless the section names another (the design's).
pub const DEFAULT_GATEWAY_CLASS: &str = "meridio-experiment/stateless-load-balancer";

/// Whether Services choose their own algorithm (Cilium's
/// `bpf-lb-algorithm-configuration`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AlgorithmConfiguration {
    /// Every Service takes the appliance default; annotations are ignored.
    Global,
    /// A Service's `service.cilium.io/lb-algorithm` (or
    /// `sluice.io/lb-algorithm`) annotation chooses, when it is set.
    #[default]
    Annotation,
}

/// Why an algorithm configuration was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlgorithmConfigurationError {
    /// A name that is neither `global` nor `annotation`.
    #[error("unknown algorithm configuration {0:?} (expected global or annotation)")]
    Unknown(String),
}

impl std::str::FromStr for AlgorithmConfiguration {
    type Err = AlgorithmConfigurationError;
    fn from_str(s: &str) -> Result<Self, AlgorithmConfigurationError> {
        match s {
            "global" => Ok(AlgorithmConfiguration::Global),
            "annotation" => Ok(AlgorithmConfiguration::Annotation),
            other => Err(AlgorithmConfigurationError::Unknown(other.to_owned())),
        }
    }
}

/// The `kubernetes:` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeConfig {
    /// The Gateway served.
    pub gateway: String,
    /// The namespace watched (the only one: multi-tenancy by namespace).
    pub namespace: String,
    /// A kubeconfig file (relative paths are from the configuration
    /// file); the in-cluster service account when unset.
    pub kubeconfig: Option<PathBuf>,
    /// The class the Gateway must have.
    pub gateway_class: String,
    /// Whether Services choose their algorithm.
    pub algorithm_configuration: AlgorithmConfiguration,
    /// Whether a live Service may change its algorithm (the design refuses it).
    pub allow_algorithm_change: bool,
}

/// Checks the section; `path` is the configuration file's.
pub(crate) fn parse(n: Node<'_>, p: &mut Problems, path: &Path) -> Option<KubeConfig> {
    n.section(p);
    let gateway = n.required(p, "gateway", fields::name).flatten();
    let namespace = n.required(p, "namespace", |n, p| {
        let s = n.string(p)?;
        if !dns_label(&s) {
            n.bad(p, format!("{s:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"));
            return None;
        }
        Some(s)
    }).flatten();
    let base = path.parent().unwrap_or(Path::new("."));
    let kubeconfig = n.field("kubeconfig", |n| n.string(p).map(|s| base.join(s))).flatten();
    let gateway_class = n.field("gatewayClass", |n| n.string(p)).flatten().unwrap_or_else(|| DEFAULT_GATEWAY_CLASS.to_owned());
    let algorithm_configuration =
        n.field("algorithmConfiguration", |n| n.parse(p, "an algorithm configuration")).flatten().unwrap_or_default();
    let allow_algorithm_change = n.field("allowAlgorithmChange", |n| n.boolean(p)).flatten().unwrap_or(false);
    Some(KubeConfig {
        gateway: gateway?,
        namespace: namespace?,
        kubeconfig,
        gateway_class,
        algorithm_configuration,
        allow_algorithm_change,
    })
}

/// A DNS label (RFC 1123), as Kubernetes names namespaces.
fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<KubeConfig, Vec<String>> {
        let v = crate::config::yaml::document(text, &mut crate::config::yaml::Budget::default()).unwrap();
        let mut p = Problems::default();
        let c = parse(Node::root(&v, "c.yaml").with_schema(&crate::config::schema::FILE, "kubernetes"), &mut p, Path::new("/etc/sluice/c.yaml"));
        if p.is_empty() {
            Ok(c.unwrap())
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }

    #[test]
    fn defaults_and_errors() {
        let c = one("{gateway: sllb-a, namespace: tenant-a}").unwrap();
        assert_eq!(c.gateway_class, DEFAULT_GATEWAY_CLASS);
        assert_eq!(c.algorithm_configuration, AlgorithmConfiguration::Annotation);
        assert_eq!((c.kubeconfig, c.allow_algorithm_change), (None, false));
        let c = one("{gateway: g, namespace: n, kubeconfig: kc, algorithmConfiguration: global, allowAlgorithmChange: true}").unwrap();
        assert_eq!(c.kubeconfig, Some(PathBuf::from("/etc/sluice/kc")));
        assert_eq!(c.algorithm_configuration, AlgorithmConfiguration::Global);
        assert!(c.allow_algorithm_change);
        assert_eq!(one("{gateway: g, namespace: Tenant_A, algorithmConfiguration: all, gatway: x}").unwrap_err(), [
            "c.yaml:1:64: gatway: unknown field (did you mean \"gateway\"?)",
            "c.yaml:1:25: namespace: \"Tenant_A\" is not a namespace name (lowercase letters, digits and '-', at most 63)",
            "c.yaml:1:59: algorithmConfiguration: \"all\" is not an algorithm configuration: unknown algorithm configuration \"all\" (expected global or annotation)",
        ]);
    }
}
