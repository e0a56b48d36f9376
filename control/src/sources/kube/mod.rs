//! The Kubernetes API as a source: Sluice as the stateless load balancer
//! (SLLB) of one Meridio 2.x Gateway.
//!
//! In its namespace only (the design's multi-tenancy), the source watches
//! the Gateway by name (its class must be the configured one), the
//! `L34Route`s whose parent it is, the Services labelled
//! `service.kubernetes.io/service-proxy-name: <gateway>`, their
//! EndpointSlices, and the `GatewayRouter`s with the same label (parsed and
//! kept in [`KubeStatus::routers`] for the routing side). The objects go
//! through the same mapping as a manifests directory
//! ([`crate::config::manifests::map`]): the same objects give the same
//! model either way.
//!
//! - [`crd`]: the custom resources and their CRDs (`sluice crds`).
//! - [`sync`]: objects in, desired state and status out (no cluster).
//! - [`pods`]: the other pods of the Gateway's Deployment, as sibling
//!   appliances (`siblings.kubernetesPods`).
//! - [`client`]: list + watch with resourceVersion and bookmarks, relist
//!   on 410 Gone, reconnects with backoff (kube-runtime's watcher), the
//!   tries with the reconciler, and the status writes.
//!
//! Invariants: nothing is sent before every kind has been listed once (a
//! restart with the API down serves nothing new, and [`KubeStatus`] says
//! why); losing the API never sends anything (the objects last seen stay
//! as they are, so the data plane keeps what it serves); a wrong object is
//! left out and reported, the others are served.
//!
//! Status is written with server-side apply under one field manager
//! ([`FIELD_MANAGER`]), only when it differs from what the object shows.
//! Replicas of the appliance for one Gateway see the same objects and
//! compute the same status; a condition keeps the transition time it
//! already shows unless its status, reason or message changes, so their
//! writes are the same bytes and converge instead of fighting.

mod client;
pub use sluice_core::crd;
pub mod pods;
pub mod sync;

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::config::kubernetes::{AlgorithmConfiguration, KubeConfig};
pub use client::run;

/// The source's name in the model and in `sluice status`.
pub const SOURCE: &str = "kubernetes";
/// The field manager of every status write.
pub(crate) const FIELD_MANAGER: &str = "sluice";

/// What the Kubernetes source is doing, for `sluice status` and `/metrics`.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct KubeStatus {
    /// The Gateway served.
    pub(crate) gateway: String,
    /// The namespace watched.
    pub(crate) namespace: String,
    /// The API server answers (asked every few seconds; a watch error
    /// clears it until the next answer).
    pub connected: bool,
    /// Its version, as it last answered.
    pub(crate) server_version: Option<String>,
    /// Every kind has been listed at least once (before that, nothing is sent).
    pub synced: bool,
    /// Kinds not listed yet.
    pub waiting_for: Vec<String>,
    /// Objects watched, per kind.
    pub watched: BTreeMap<String, usize>,
    /// The last error, if any.
    pub last_error: Option<String>,
    /// When it happened (seconds since the epoch).
    pub(crate) last_error_at: Option<u64>,
    /// When the objects last changed as the API told (seconds since the epoch).
    pub(crate) last_sync_at: Option<u64>,
    /// When a state was last served (seconds since the epoch).
    pub(crate) last_applied_at: Option<u64>,
    /// What is served, or why nothing is.
    pub serving: String,
    /// What is not served from Kubernetes, and why (a custom resource
    /// whose CRD is not installed): the appliance serves the rest and is
    /// not ready while this is not empty.
    pub not_served: Vec<String>,
    /// Objects left out, and why.
    pub refused: Vec<RefusedObject>,
    /// The GatewayRouters of the Gateway, for the routing side.
    pub routers: Vec<RouterEntry>,
    /// Status writes sent.
    pub(crate) status_writes: u64,
    /// Status writes that failed.
    pub(crate) status_write_errors: u64,
}

/// An object left out, or served with a setting kept.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RefusedObject {
    /// `kubernetes: Kind/namespace/name`.
    pub object: String,
    /// The condition reason.
    pub(crate) reason: String,
    /// Why.
    pub(crate) message: String,
}

/// A GatewayRouter of the Gateway.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RouterEntry {
    /// Its name.
    pub name: String,
    /// Its spec.
    pub spec: crd::GatewayRouterSpec,
}

/// Why the source could not start talking to the API.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeError {
    /// The kubeconfig file.
    #[error("cannot read the kubeconfig {0}: {1}")]
    Kubeconfig(String, String),
    /// In-cluster configuration.
    #[error("not running in a cluster (no kubeconfig given): {0}")]
    InCluster(String),
    /// The client.
    #[error("cannot make a Kubernetes client: {0}")]
    Client(String),
}
