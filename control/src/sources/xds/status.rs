//! What the xDS source tells the admin endpoint and `sluice status`: the
//! connection, what each resource type last accepted, the NACKs, and the
//! services it defines. Written by the source task only, read by anyone
//! through the shared `Arc<Mutex<XdsStatus>>`.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

use crate::config::xds::Mode;

/// Seconds since the Unix epoch.
pub(crate) fn now() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The connection to the management server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectionState {
    /// Not started yet.
    #[default]
    Idle,
    /// Connecting (or waiting to reconnect).
    Connecting,
    /// The stream is open.
    Connected,
    /// The last attempt failed; waiting before the next one.
    Backoff,
    /// Stopped (shutdown).
    Stopped,
}

/// A refused response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Nack {
    /// Type URL of the response.
    pub(crate) type_url: String,
    /// Its version (SotW `version_info`, delta `system_version_info`).
    pub version: String,
    /// Its nonce.
    pub(crate) nonce: String,
    /// The `error_detail` message sent back.
    pub error: String,
    /// When (seconds since the Unix epoch).
    pub(crate) at: u64,
}

/// One resource type.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize)]
pub struct TypeStatus {
    /// The last accepted version (SotW `version_info`; delta
    /// `system_version_info`, informational).
    pub version: String,
    /// The nonce of the last response (accepted or not) on this stream.
    pub(crate) nonce: String,
    /// Resources of this type held.
    pub(crate) resources: usize,
    /// Responses acknowledged.
    pub(crate) acks: u64,
    /// Responses refused.
    pub nacks: u64,
    /// Of those, refused for the same reason as the one before.
    pub repeated_nacks: u64,
}

/// The xDS source's status.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize)]
pub struct XdsStatus {
    /// The management server (`host:port`).
    pub(crate) server: String,
    /// `sotw` or `delta`.
    pub(crate) mode: Mode,
    /// Plaintext, TLS or mutual TLS.
    pub transport: String,
    /// The node id sent.
    pub(crate) node_id: String,
    /// The connection.
    pub state: ConnectionState,
    /// Since when the stream has been open (seconds since the Unix epoch).
    pub(crate) connected_since: Option<u64>,
    /// Why the last connection attempt or stream failed.
    pub last_error: Option<String>,
    /// When it did.
    pub(crate) last_error_at: Option<u64>,
    /// Streams opened after the first.
    pub reconnects: u64,
    /// By type URL.
    pub types: BTreeMap<String, TypeStatus>,
    /// Responses refused, all types.
    pub nacks: u64,
    /// The last one refused.
    pub last_nack: Option<Nack>,
    /// When the last accepted change was applied (seconds since the Unix epoch).
    pub last_update: Option<u64>,
    /// L4 services defined (clusters with `io.cilium.l4lb` metadata, warm).
    pub services: usize,
    /// Endpoints defined in them (taking flows or draining).
    pub endpoints: usize,
    /// Clusters waiting for their endpoints.
    pub warming: Vec<String>,
    /// Clusters not served: another cluster, first by name, claims their
    /// VIP, port and protocol.
    pub refused: Vec<String>,
    /// Clusters without L4 metadata, ignored.
    pub ignored_clusters: usize,
    /// From a response's arrival to its state being published.
    pub(crate) to_live: Latency,
}

/// A latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize)]
pub(crate) struct Latency {
    /// Changes measured.
    pub(crate) count: u64,
    /// Median.
    pub(crate) p50_us: u64,
    /// 99th percentile.
    pub(crate) p99_us: u64,
    /// Largest.
    pub(crate) max_us: u64,
}

impl Latency {
    /// The summary of `h`.
    pub(crate) fn of(h: &hdrhistogram::Histogram<u64>) -> Latency {
        Latency { count: h.len(), p50_us: h.value_at_quantile(0.5), p99_us: h.value_at_quantile(0.99), max_us: h.max() }
    }
}
