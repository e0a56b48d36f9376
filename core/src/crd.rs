//! The custom resources of the Meridio 2.x design, `L34Route` and
//! `GatewayRouter` (group `meridio.experiment.gateway.api.poc`, version
//! `v1alpha1`), as Rust types from which their CRDs are generated, with
//! the design's constraints as schema validation so the API server refuses
//! what the appliance would: destinations are /32 or /128 only, exactly
//! one parentRef and one backendRef, ports and port ranges, the protocol
//! enum and the byte-match syntax.
//!
//! The appliance does not read objects through these types: it reads them
//! through the one mapping of [`crate::config::manifests`], as a manifests
//! directory does. They generate the CRDs (`sluice crds`), and give the
//! status written to routes its shape; `GatewayRouter`s are parsed into
//! them and handed to the routing side.

use std::borrow::Cow;
use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt};
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// The API group of the custom resources (the derives below spell it out).
#[cfg(test)]
const GROUP: &str = "meridio.experiment.gateway.api.poc";
/// Their version.
#[cfg(test)]
const VERSION: &str = "v1alpha1";

/// One IPv4 octet (0-255), for the patterns below.
const OCTET: &str = "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])";
/// A port number (0-65535).
const PORT: &str = "(6553[0-5]|655[0-2][0-9]|65[0-4][0-9][0-9]|6[0-4][0-9][0-9][0-9]|[1-5][0-9][0-9][0-9][0-9]|[0-9]{1,4})";

/// `a.b.c.d/32` or an IPv6 address `/128` (the format `cidr` makes the
/// API server check that the IPv6 part is an address).
pub(crate) fn host_cidr_pattern() -> String {
    format!("^({OCTET}\\.){{3}}{OCTET}/32$|^[0-9a-fA-F:.]*:[0-9a-fA-F:.]*/128$")
}

/// A port, a range `lo-hi`, or `any`.
pub(crate) fn port_range_pattern() -> String {
    format!("^({PORT}(-{PORT})?|any)$")
}

/// `proto[offset:length] & mask = value`, as the appliance reads it.
pub(crate) const BYTE_MATCH_PATTERN: &str =
    r"^(tcp|udp|sctp) *\[ *(0x[0-9a-fA-F]+|[0-9]+) *: *(1|2|4) *\]( *& *(0x[0-9a-fA-F]+|[0-9]+))? *= *(0x[0-9a-fA-F]+|[0-9]+) *$";

/// A duration as Go writes it (`24s`, `300ms`, `1m30s`).
pub(crate) const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$";

macro_rules! string_type {
    ($(#[$doc:meta])* $name:ident, $schema:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }
            fn inline_schema() -> bool {
                true
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

string_type!(
    /// A destination: one address, `/32` or `/128`.
    HostCidr,
    json_schema!({"type": "string", "format": "cidr", "pattern": host_cidr_pattern()})
);
string_type!(
    /// A source prefix.
    SourceCidr,
    json_schema!({"type": "string", "format": "cidr"})
);
string_type!(
    /// A port, a range `lo-hi` or `any`.
    PortRange,
    json_schema!({"type": "string", "pattern": port_range_pattern()})
);
string_type!(
    /// `proto[offset:length] & mask = value`.
    ByteMatch,
    json_schema!({"type": "string", "pattern": BYTE_MATCH_PATTERN, "maxLength": 128})
);
string_type!(
    /// A duration (`24s`, `300ms`).
    GoDuration,
    json_schema!({"type": "string", "pattern": DURATION_PATTERN})
);
string_type!(
    /// An IP address.
    IpAddress,
    json_schema!({"type": "string", "pattern": format!("^({OCTET}\\.){{3}}{OCTET}$|^[0-9a-fA-F:.]*:[0-9a-fA-F:.]*$")})
);

/// A transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) enum Protocol {
    /// TCP.
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

/// The Gateway a route is configured in.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ParentReference {
    /// Group of the parent (`gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) group: Option<String>,
    /// Kind of the parent (`Gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) kind: Option<String>,
    /// Name of the Gateway.
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
    /// Namespace of the Gateway (the route's own when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) namespace: Option<String>,
}

/// The Service a route sends to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct BackendReference {
    /// Name of the Service.
    #[schemars(length(min = 1, max = 253))]
    pub(crate) name: String,
    /// Must be set, is ignored (Gateway API requires it for Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub(crate) port: Option<i32>,
}

/// Steers Layer 3 and 4 traffic to a Service of a Gateway.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "meridio.experiment.gateway.api.poc",
    version = "v1alpha1",
    kind = "L34Route",
    plural = "l34routes",
    namespaced,
    status = "L34RouteStatus",
    printcolumn = r#"{"name":"Priority","type":"integer","jsonPath":".spec.priority"}"#,
    printcolumn = r#"{"name":"Destinations","type":"string","jsonPath":".spec.destinationCIDRs"}"#,
    printcolumn = r#"{"name":"Backend","type":"string","jsonPath":".spec.backendRefs[0].name"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct L34RouteSpec {
    /// The Gateway the route is configured in: exactly one.
    #[schemars(length(min = 1, max = 1))]
    pub(crate) parent_refs: Vec<ParentReference>,
    /// The Service traffic is sent to: exactly one.
    #[schemars(length(min = 1, max = 1))]
    pub(crate) backend_refs: Vec<BackendReference>,
    /// Higher wins among routes matching the same traffic.
    #[serde(default)]
    pub priority: i32,
    /// The VIPs: single addresses only (`/32`, `/128`).
    #[serde(rename = "destinationCIDRs")]
    #[schemars(length(min = 1, max = 64))]
    pub(crate) destination_cidrs: Vec<HostCidr>,
    /// Source prefixes (any when unset).
    #[serde(default, rename = "sourceCIDRs", skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub(crate) source_cidrs: Option<Vec<SourceCidr>>,
    /// Source ports and ranges (any when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub(crate) source_ports: Option<Vec<PortRange>>,
    /// Destination ports and ranges (any when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub(crate) destination_ports: Option<Vec<PortRange>>,
    /// Transport protocols (any when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 3))]
    pub(crate) protocols: Option<Vec<Protocol>>,
    /// Matches on bytes of the transport header, all of which must hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub(crate) byte_matches: Option<Vec<ByteMatch>>,
}

/// What a Gateway's implementation says of a route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct L34RouteStatus {
    /// One entry per parent Gateway whose implementation looked at it.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub(crate) parents: Vec<RouteParentStatus>,
}

/// What one Gateway's implementation says of a route (as Gateway API's
/// `RouteParentStatus`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RouteParentStatus {
    /// The parent.
    pub(crate) parent_ref: ParentReference,
    /// The controller that wrote this entry.
    pub(crate) controller_name: String,
    /// `Accepted`, and why not.
    #[serde(default)]
    #[schemars(length(max = 8))]
    pub(crate) conditions: Vec<Condition>,
}

/// How a Gateway reaches an external router (a DC gateway): its address,
/// the interface, and the routing and supervision protocols.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "meridio.experiment.gateway.api.poc",
    version = "v1alpha1",
    kind = "GatewayRouter",
    plural = "gatewayrouters",
    namespaced,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".spec.address"}"#,
    printcolumn = r#"{"name":"Interface","type":"string","jsonPath":".spec.interface"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRouterSpec {
    /// The router's address.
    pub address: IpAddress,
    /// The interface it is reached through.
    #[schemars(length(min = 1, max = 15))]
    pub interface: String,
    /// BGP settings (defaults when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpSpec>,
}

/// BGP towards the router.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpSpec {
    /// The Gateway's AS number.
    #[serde(default, rename = "localASN", skip_serializing_if = "Option::is_none")]
    pub local_asn: Option<u32>,
    /// The router's AS number.
    #[serde(default, rename = "remoteASN", skip_serializing_if = "Option::is_none")]
    pub remote_asn: Option<u32>,
    /// Hold time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<GoDuration>,
    /// Local TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub local_port: Option<u16>,
    /// The router's TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub remote_port: Option<u16>,
    /// BFD supervision of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<BfdSpec>,
}

/// BFD settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BfdSpec {
    /// On or off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<bool>,
    /// Least interval between BFD packets sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx: Option<GoDuration>,
    /// Least interval between BFD packets received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rx: Option<GoDuration>,
    /// Packets missed before the session is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 255))]
    pub multiplier: Option<u32>,
}

/// The CRDs, each with the file name it is kept under.
pub(crate) fn crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![("l34routes.yaml", L34Route::crd()), ("gatewayrouters.yaml", GatewayRouter::crd())]
}

/// Why the CRDs could not be rendered or written.
#[derive(Debug, thiserror::Error)]
pub enum CrdError {
    /// A CRD is not JSON (cannot happen with these types).
    #[error("cannot render the CRD {0}: {1}")]
    Render(&'static str, serde_json::Error),
    /// Writing failed.
    #[error("cannot write {0}: {1}")]
    Write(String, std::io::Error),
}

/// The CRD files: names and YAML text.
pub fn render() -> Result<Vec<(&'static str, String)>, CrdError> {
    crds()
        .into_iter()
        .map(|(file, crd)| {
            let v = serde_json::to_value(&crd).map_err(|e| CrdError::Render(file, e))?;
            let mut text = String::from("# Generated by `sluice crds` from control/src/sources/kube/crd.rs: do not edit.\n");
            text.push_str(&to_yaml(&v));
            Ok((file, text))
        })
        .collect()
}

/// Writes the CRD files into `dir`; returns the paths written.
pub fn write(dir: &Path) -> Result<Vec<String>, CrdError> {
    std::fs::create_dir_all(dir).map_err(|e| CrdError::Write(dir.display().to_string(), e))?;
    let mut out = Vec::new();
    for (file, text) in render()? {
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(|e| CrdError::Write(path.display().to_string(), e))?;
        out.push(path.display().to_string());
    }
    Ok(out)
}

/// Block-style YAML of a JSON value. Scalars are written as JSON (a JSON
/// string is a YAML double-quoted string); keys too unless they are plain
/// words.
pub fn to_yaml(v: &serde_json::Value) -> String {
    let mut out = String::new();
    emit(&mut out, v, 0);
    out
}

fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && !matches!(k, "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n");
    if plain {
        k.to_owned()
    } else {
        serde_json::Value::String(k.to_owned()).to_string()
    }
}

fn is_block(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::Object(m) => !m.is_empty(),
        serde_json::Value::Array(a) => !a.is_empty(),
        _ => false,
    }
}

fn emit(out: &mut String, v: &serde_json::Value, indent: usize) {
    use serde_json::Value as J;
    let pad = " ".repeat(indent);
    match v {
        J::Object(m) if !m.is_empty() => {
            for (k, x) in m {
                out.push_str(&pad);
                out.push_str(&key(k));
                out.push(':');
                if is_block(x) {
                    out.push('\n');
                    emit(out, x, indent + 2);
                } else {
                    out.push(' ');
                    out.push_str(&x.to_string());
                    out.push('\n');
                }
            }
        }
        J::Array(a) if !a.is_empty() => {
            for x in a {
                out.push_str(&pad);
                out.push('-');
                if is_block(x) {
                    // The first line of the item goes after the dash.
                    let mut inner = String::new();
                    emit(&mut inner, x, indent + 2);
                    out.push_str(&inner[indent + 1..]);
                } else {
                    out.push(' ');
                    out.push_str(&x.to_string());
                    out.push('\n');
                }
            }
        }
        other => {
            out.push_str(&pad);
            out.push_str(&other.to_string());
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::node::Node;
    use crate::config::{fields, yaml};
    use crate::problem::Problems;

    fn re(p: &str) -> regex_lite::Regex {
        regex_lite::Regex::new(p).unwrap()
    }

    /// What the appliance's own parser says of `text`.
    fn ours(text: &str, f: fn(Node<'_>, &mut Problems) -> bool) -> bool {
        let v = yaml::Value::from_json(&serde_json::Value::String(text.to_owned()));
        let mut p = Problems::default();
        f(Node::root(&v, "t"), &mut p) && p.is_empty()
    }

    #[test]
    fn the_schema_accepts_what_the_appliance_accepts_and_refuses_the_rest() {
        let host = re(&host_cidr_pattern());
        for ok in ["20.0.0.1/32", "255.255.255.255/32", "0.0.0.0/32", "2001:db8::1/128", "::1/128"] {
            assert!(host.is_match(ok), "{ok}");
            assert!(ours(ok, |n, p| fields::vip(n, p).is_some()), "{ok}");
        }
        for bad in ["20.0.0.0/24", "20.0.0.1", "256.0.0.1/32", "2001:db8::/64", "20.0.0.1/32 ", "x/32"] {
            assert!(!host.is_match(bad), "{bad}");
        }
        let ports = re(&port_range_pattern());
        for ok in ["0", "80", "4000", "65535", "0-65535", "8000-8080", "any"] {
            assert!(ports.is_match(ok), "{ok}");
            assert!(ours(ok, |n, p| fields::port_range(n, p).is_some()), "{ok}");
        }
        for bad in ["65536", "-1", "80-", "80-70000", "http", "1-2-3", ""] {
            assert!(!ports.is_match(bad), "{bad}");
        }
        let bytes = re(BYTE_MATCH_PATTERN);
        for ok in ["tcp[13:1] & 0x02 = 0x02", "sctp[8:4] = 0x01020304", "udp[0:2]=53"] {
            assert!(bytes.is_match(ok), "{ok}");
            assert!(ours(ok, |n, p| fields::byte_match(n, p).is_some()), "{ok}");
        }
        for bad in ["tcp[13:3] = 1", "icmp[0:1] = 1", "tcp[13:1] & 2", "tcp[13:1] = ", "tcp 13:1 = 2"] {
            assert!(!bytes.is_match(bad), "{bad}");
            assert!(!ours(bad, |n, p| fields::byte_match(n, p).is_some()), "{bad}");
        }
        let d = re(DURATION_PATTERN);
        assert!(d.is_match("24s") && d.is_match("300ms") && d.is_match("1m30s"));
        assert!(!d.is_match("24") && !d.is_match("s"));
    }

    #[test]
    fn the_crd_says_exactly_one_parent_and_one_backend_and_the_protocols() {
        let crd = serde_json::to_value(L34Route::crd()).unwrap();
        assert_eq!(crd["spec"]["group"], GROUP);
        assert_eq!(crd["spec"]["names"]["kind"], "L34Route");
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], VERSION);
        assert!(v["subresources"]["status"].is_object(), "status is a subresource");
        let spec = &v["schema"]["openAPIV3Schema"]["properties"]["spec"];
        for list in ["parentRefs", "backendRefs"] {
            assert_eq!((&spec["properties"][list]["minItems"], &spec["properties"][list]["maxItems"]), (&1.into(), &1.into()), "{list}");
        }
        let protocols = &spec["properties"]["protocols"]["items"]["enum"];
        assert_eq!(protocols, &serde_json::json!(["TCP", "UDP", "SCTP"]));
        assert_eq!(spec["properties"]["destinationCIDRs"]["items"]["pattern"], host_cidr_pattern());
        assert_eq!(spec["properties"]["destinationPorts"]["items"]["pattern"], port_range_pattern());
        assert_eq!(spec["properties"]["byteMatches"]["items"]["pattern"], BYTE_MATCH_PATTERN);
        let required = spec["required"].as_array().unwrap();
        for r in ["parentRefs", "backendRefs", "destinationCIDRs"] {
            assert!(required.contains(&r.into()), "{r} is required");
        }
        let router = serde_json::to_value(GatewayRouter::crd()).unwrap();
        assert_eq!(router["spec"]["names"]["kind"], "GatewayRouter");
    }

    #[test]
    fn the_seed_examples_fit_the_types() {
        let route: L34Route = serde_json::from_value(serde_json::json!({
            "apiVersion": "meridio.experiment.gateway.api.poc/v1alpha1", "kind": "L34Route",
            "metadata": {"name": "vip-20-0-0-1-multi-ports-a"},
            "spec": {"parentRefs": [{"name": "sllb-a"}], "backendRefs": [{"name": "service-a", "port": 1}],
                     "priority": 10, "destinationCIDRs": ["20.0.0.1/32"], "sourceCIDRs": ["0.0.0.0/0"],
                     "sourcePorts": ["0-65535"], "destinationPorts": ["4000", "4001"], "protocols": ["TCP"]}
        }))
        .unwrap();
        assert_eq!(route.spec.destination_cidrs, vec![HostCidr("20.0.0.1/32".into())]);
        let router: GatewayRouter = serde_json::from_value(serde_json::json!({
            "apiVersion": "meridio.experiment.gateway.api.poc/v1alpha1", "kind": "GatewayRouter",
            "metadata": {"name": "gateway-a-v4", "labels": {"service.kubernetes.io/service-proxy-name": "sllb-a"}},
            "spec": {"address": "169.254.100.150", "interface": "vlan-100",
                     "bgp": {"localASN": 8103, "remoteASN": 4_248_829_953_u32, "holdTime": "24s", "localPort": 10179,
                             "remotePort": 10179, "bfd": {"switch": true, "minTx": "300ms", "minRx": "300ms", "multiplier": 5}}}
        }))
        .unwrap();
        assert_eq!(router.spec.bgp.unwrap().remote_asn, Some(4_248_829_953));
    }

    #[test]
    fn yaml_output_reads_back_as_the_same_json() {
        for (file, crd) in crds() {
            let v = serde_json::to_value(&crd).unwrap();
            let back = yaml::document(&to_yaml(&v), &mut yaml::Budget::default()).unwrap().to_json();
            assert_eq!(back, v, "{file}");
        }
        let tricky = serde_json::json!({"a": [], "b": {}, "c": [[1, 2], {"x": "y: z"}], "true": "no", "": null, "d-e": ["- x"]});
        let back = yaml::document(&to_yaml(&tricky), &mut yaml::Budget::default()).unwrap().to_json();
        assert_eq!(back, tricky);
    }

    #[test]
    fn the_crd_files_in_configs_are_current() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/k8s/crds");
        for (file, text) in render().unwrap() {
            let have = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            assert!(have == text, "configs/k8s/crds/{file} is not current: run `sluice crds --out configs/k8s/crds`");
        }
    }
}
