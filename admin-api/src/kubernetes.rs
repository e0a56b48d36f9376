//! The Kubernetes source's part of `/status`: whether it reaches the API,
//! what it watches, what it serves or why not, and the objects it left out.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The Kubernetes source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kubernetes {
    /// The Gateway served.
    pub gateway: String,
    /// The namespace watched.
    pub namespace: String,
    /// The API server answers.
    pub connected: bool,
    /// Its version, as it last answered.
    pub server_version: Option<String>,
    /// Every kind has been listed at least once (before that, nothing is
    /// served from Kubernetes).
    pub synced: bool,
    /// Kinds not listed yet.
    pub waiting_for: Vec<String>,
    /// Objects watched, per kind.
    pub watched: BTreeMap<String, usize>,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// When it happened (seconds since the epoch).
    pub last_error_at: Option<u64>,
    /// When the objects last changed as the API told (seconds since the epoch).
    pub last_sync_at: Option<u64>,
    /// When a state was last served (seconds since the epoch).
    pub last_applied_at: Option<u64>,
    /// What is served, or why nothing is.
    pub serving: String,
    /// What is not served from Kubernetes, and why.
    pub not_served: Vec<String>,
    /// Objects left out, and why.
    pub refused: Vec<Refused>,
    /// The GatewayRouters of the Gateway.
    pub routers: Vec<Router>,
    /// Status writes sent.
    pub status_writes: u64,
    /// Status writes that failed.
    pub status_write_errors: u64,
}

/// An object left out, or served with a setting kept.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// `kubernetes: Kind/namespace/name`.
    pub object: String,
    /// The condition reason.
    pub reason: String,
    /// Why.
    pub message: String,
}

/// A GatewayRouter of the Gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Router {
    /// Its name.
    pub name: String,
    /// Its spec, as the object has it.
    pub spec: RouterSpec,
}

/// A GatewayRouter's spec (the custom resource's field names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouterSpec {
    /// The router's address.
    pub address: String,
    /// The interface it is reached through.
    pub interface: String,
    /// BGP settings, when the object sets any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<Bgp>,
}

/// BGP towards a router, as its GatewayRouter sets it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bgp {
    /// The Gateway's AS number.
    #[serde(default, rename = "localASN", skip_serializing_if = "Option::is_none")]
    pub local_asn: Option<u32>,
    /// The router's AS number.
    #[serde(default, rename = "remoteASN", skip_serializing_if = "Option::is_none")]
    pub remote_asn: Option<u32>,
    /// Hold time (`24s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_time: Option<String>,
    /// Local TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_port: Option<u16>,
    /// The router's TCP port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_port: Option<u16>,
    /// BFD supervision of the session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bfd: Option<Bfd>,
}

/// BFD towards a router, as its GatewayRouter sets it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bfd {
    /// On or off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<bool>,
    /// Least interval between BFD packets sent (`300ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx: Option<String>,
    /// Least interval between BFD packets received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rx: Option<String>,
    /// Packets missed before the session is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiplier: Option<u32>,
}
