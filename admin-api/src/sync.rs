//! Sibling sync's part of `/status`: the pins this appliance shares with
//! the other appliances behind the same routers, and each sibling.
//!
//! The sync task fills these types itself (they are its status channel's
//! value), so there is nothing to convert and nothing to forget.

use serde::{Deserialize, Serialize};

/// Sibling sync, with a `siblings:` section.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sync {
    /// Pins exported by this appliance's workers, held until their lifetime ends.
    pub pins_held: u64,
    /// Pins received from siblings that this appliance's last snapshot
    /// maps (its services and endpoints), in the workers' table.
    pub pins_synced: u64,
    /// Records sent to siblings.
    pub sent: u64,
    /// Records received from siblings (before the rate bound).
    pub received: u64,
    /// Connections whose handshake proved a wrong key, and frames whose MAC
    /// was wrong.
    pub refused: u64,
    /// Records dropped by the per-sibling rate bound.
    pub rate_dropped: u64,
    /// Records whose service or endpoint this appliance did not know when
    /// they arrived (kept, and used once a snapshot knows them), and
    /// records that do not decode (ignored).
    pub unknown: u64,
    /// Exported pins whose endpoint changed before they were drained.
    pub stale: u64,
    /// Sibling connections closed because their queue overflowed.
    pub overflows: u64,
    /// Start-up is over: every reachable peer sent its full set, or
    /// `startupWaitMs` passed.
    pub settled: bool,
    /// Peers that had not sent their full set when start-up ended by time.
    pub not_heard: Vec<String>,
    /// Every configured peer, then any other sibling connected to us.
    pub peers: Vec<Peer>,
}

/// One sibling.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Peer {
    /// Its listen address (as configured, or as it named itself).
    pub address: String,
    /// Our connection to it is up (we take its pins).
    pub connected: bool,
    /// It sent its full set since our connection opened.
    pub in_sync: bool,
    /// Seconds since it last sent anything (`None`: never).
    pub last_heard_seconds: Option<f64>,
    /// It is connected to us (takes our pins).
    pub subscribed: bool,
    /// Records queued for it and not yet sent.
    pub lag: u64,
}
