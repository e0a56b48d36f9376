//! The xDS source: L4 services from any xDS management server (Envoy's
//! go-control-plane, java-control-plane, Istio, ...), so that a fleet of
//! appliances follows one control plane (the Cilium CFP "xDS-controlled
//! standalone L4 load balancer").
//!
//! - [`crate::config::xds`]: the `xds-control-plane` section of the
//!   configuration file, and [`crate::config::tls`] its TLS files.
//! - [`client`]: the ADS stream (state of the world or incremental), ACK
//!   and NACK, reconnection with backoff.
//! - [`mapping`]: `Cluster` + `ClusterLoadAssignment` → services, routes,
//!   endpoints; what the metadata may say.
//! - [`identity`]: endpoint identifiers from the endpoints themselves, the
//!   same on every appliance.
//! - [`tls`]: TLS and mutual TLS to the server, from the section's files.
//! - [`status`]: what the source reports.
//!
//! Invariants: the source owns everything under the source name
//! [`SOURCE`] and sends it whole; it acknowledges a response only once
//! the reconciler serves the state it leads to; it never sends a state
//! because the server went away (the last good state keeps serving while
//! it reconnects); an unchanged state is never sent twice.
//!
//! # Running it
//!
//! ```ignore
//! let (status, status_rx) = watch::channel(XdsStatus::default());
//! tasks.spawn(sources::xds::run(cfg, defaults, src_tx.clone(), status, cancel.clone()));
//! // status_rx: what the source reports, for whoever shows it
//! ```

pub mod client;
mod identity;
pub mod mapping;
pub mod status;
mod tls;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

pub use crate::config::xds::{Mode, XdsConfig};
pub use status::XdsStatus;

use crate::model::Defaults;
use crate::sources::SourceMsg;

/// The source name of everything xDS defines.
pub(crate) const SOURCE: &str = "xds";

/// Runs the xDS source until `cancel` fires or the reconciler is gone.
///
/// It connects to `cfg.server` (retrying with capped exponential backoff
/// and jitter while the server is unreachable; nothing changes in what is
/// served meanwhile), subscribes to clusters and their assignments, and
/// sends each accepted state to the reconciler on `tx` as
/// `SourceMsg::Desired { source: "xds", reply: Some(..), .. }`, waiting for
/// the answer before acknowledging. `defaults` gives the endpoint limit of
/// services whose metadata sets none (identifiers are chosen within it).
/// `status` carries what it reports: the ACKs and NACKs it sent, its
/// connection, what it holds.
pub async fn run(
    cfg: XdsConfig,
    defaults: Defaults,
    tx: mpsc::Sender<SourceMsg>,
    status: watch::Sender<XdsStatus>,
    cancel: CancellationToken,
) {
    client::run(cfg, defaults, tx, status, cancel).await;
}
