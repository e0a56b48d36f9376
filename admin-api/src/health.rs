//! Health's part of `/status`: what the TCP handshakes this appliance saw
//! say of each endpoint (passive health), what the active checks say, and
//! which endpoints they took out of new flows.
//!
//! The health task fills these types itself (they are its status channel's
//! value).

use serde::{Deserialize, Serialize};

fn on() -> bool {
    true
}

/// Passive health and active checks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// Passive health is on (`health.passive`); the fields below up to
    /// [`Health::endpoints`] are its. (Absent from an appliance older than
    /// active checks, whose health was passive only.)
    #[serde(default = "on")]
    pub passive: bool,
    /// Failed handshakes in a row (with no success between) that take an
    /// endpoint out of new flows.
    pub fall: u32,
    /// Seconds an endpoint stays out the first time; each time again
    /// within [`Health::forgive_seconds`] doubles it, up to
    /// [`Health::max_ejection_seconds`].
    pub ejection_seconds: f64,
    /// The longest time out.
    pub max_ejection_seconds: f64,
    /// Seconds without a failure after which an endpoint's past time outs
    /// are forgotten.
    pub forgive_seconds: f64,
    /// Milliseconds after which a SYN with no answer counts as unanswered.
    pub unanswered_after_ms: u64,
    /// Handshakes taken from the workers' table.
    pub outcomes: u64,
    /// Sweeps of the table so far.
    pub sweeps: u64,
    /// Handshakes not counted against their endpoint (a SYN unanswered
    /// while this appliance dropped received packets, or of a service
    /// whose answers do not come back through this appliance).
    pub discounted: u64,
    /// Services whose endpoints' answers came back through this appliance
    /// within the last minute: passive health judges only their endpoints.
    pub covered_services: Vec<String>,
    /// Every endpoint a handshake was seen with, by service and identifier.
    pub endpoints: Vec<EndpointHealth>,
    /// The active checks.
    #[serde(default)]
    pub checks: Checks,
}

/// The active checks of every service that has one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Checks {
    /// Checks run so far.
    pub run: u64,
    /// Checks that failed.
    pub failed: u64,
    /// Checks started later than due by more than a tenth of their
    /// interval (too many at once: see [`Checks::max_in_flight`]).
    pub late: u64,
    /// Checks running now.
    pub in_flight: usize,
    /// The most that run at once.
    pub max_in_flight: usize,
    /// Every checked endpoint, by service and identifier.
    pub endpoints: Vec<CheckedEndpoint>,
}

/// One endpoint, as its active check sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckedEndpoint {
    /// Its service.
    pub service: String,
    /// Its identifier.
    pub id: u32,
    /// Its address.
    pub address: String,
    /// `tcp`, `http`, `udp` or `dns`, and the port: `tcp/80`.
    pub check: String,
    /// `up`; `down` (out of new flows); `held` (down, but the limit keeps
    /// it in: never more than half of a service's endpoints, never its
    /// last ready one).
    pub state: String,
    /// Checks run.
    pub checks: u64,
    /// Of which failed.
    pub failures: u64,
    /// Successes since the last failure.
    pub successes_in_a_row: u32,
    /// Failures since the last success.
    pub failures_in_a_row: u32,
    /// The last check's time, milliseconds, when it succeeded.
    pub last_ms: Option<f64>,
    /// Why the last failed check failed.
    pub last_error: Option<String>,
}

/// One endpoint, as its handshakes show it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointHealth {
    /// Its service.
    pub service: String,
    /// Its identifier.
    pub id: u32,
    /// Its address.
    pub address: String,
    /// `healthy`, `ejected` (out of new flows), or `held` (would be out,
    /// but the limit keeps it: never more than half of a service's
    /// endpoints, never its last ready one).
    pub state: String,
    /// SYN-ACKs.
    pub succeeded: u64,
    /// RSTs answering a SYN (nothing listening).
    pub reset: u64,
    /// SYNs the client sent again before an answer came.
    pub retransmitted: u64,
    /// SYNs without an answer within the bound.
    pub unanswered: u64,
    /// Failures since the last success.
    pub failures_in_a_row: u32,
    /// Times it was taken out.
    pub ejections: u32,
    /// Seconds until it is back in new flows, while out.
    pub back_in_seconds: Option<f64>,
    /// Median SYN to SYN-ACK time of its last handshakes, microseconds.
    pub handshake_median_us: Option<u32>,
    /// Their 90th percentile, microseconds.
    pub handshake_p90_us: Option<u32>,
}
