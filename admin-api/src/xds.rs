//! The xDS source's part of `/status`: the connection to the management
//! server, what each resource type last accepted, the NACKs, and the
//! services it defines.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The xDS source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xds {
    /// The management server (`host:port`).
    pub server: String,
    /// The variant of the protocol spoken.
    pub mode: Mode,
    /// Plaintext, TLS or mutual TLS.
    pub transport: String,
    /// The node id sent.
    pub node_id: String,
    /// The connection.
    pub state: Connection,
    /// Since when the stream has been open (seconds since the epoch).
    pub connected_since: Option<u64>,
    /// Why the last connection attempt or stream failed.
    pub last_error: Option<String>,
    /// When it did (seconds since the epoch).
    pub last_error_at: Option<u64>,
    /// Streams opened after the first.
    pub reconnects: u64,
    /// Each resource type, by type URL.
    pub types: BTreeMap<String, TypeStatus>,
    /// Responses refused, all types.
    pub nacks: u64,
    /// The last one refused.
    pub last_nack: Option<Nack>,
    /// When the last accepted change was applied (seconds since the epoch).
    pub last_update: Option<u64>,
    /// L4 services defined.
    pub services: usize,
    /// Endpoints defined in them.
    pub endpoints: usize,
    /// Clusters waiting for their endpoints.
    pub warming: Vec<String>,
    /// Clusters not served: another cluster claims their VIP, port and
    /// protocol.
    pub refused: Vec<String>,
    /// Clusters without L4 metadata, ignored.
    pub ignored_clusters: usize,
    /// From a response's arrival to its state being published.
    pub to_live: Latency,
}

/// The variant of the aggregated discovery service spoken.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// State of the world.
    #[default]
    Sotw,
    /// Incremental.
    Delta,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Sotw => "sotw",
            Mode::Delta => "delta",
        })
    }
}

/// The connection to the management server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Connection {
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

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Connection::Idle => "idle",
            Connection::Connecting => "connecting",
            Connection::Connected => "connected",
            Connection::Backoff => "backoff",
            Connection::Stopped => "stopped",
        })
    }
}

/// A refused response.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    /// Type URL of the response.
    pub type_url: String,
    /// Its version.
    pub version: String,
    /// Its nonce.
    pub nonce: String,
    /// The `error_detail` message sent back.
    pub error: String,
    /// When (seconds since the epoch).
    pub at: u64,
}

/// One resource type.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeStatus {
    /// The last accepted version.
    pub version: String,
    /// The nonce of the last response on this stream.
    pub nonce: String,
    /// Resources of this type held.
    pub resources: usize,
    /// Responses acknowledged.
    pub acks: u64,
    /// Responses refused.
    pub nacks: u64,
    /// Of those, refused for the same reason as the one before.
    pub repeated_nacks: u64,
}

/// A latency distribution, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Latency {
    /// Changes measured.
    pub count: u64,
    /// Median.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Largest.
    pub max_us: u64,
}
