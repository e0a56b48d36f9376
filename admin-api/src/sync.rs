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
    /// How this appliance's tables compare with the siblings'.
    #[serde(default)]
    pub agreement: Agreement,
    /// Endpoints out of new flows here because a sibling's health wants
    /// them out, as `service/identifier` (the first 100).
    #[serde(default)]
    pub health_from_siblings: Vec<String>,
    /// Siblings' verdicts on endpoints this appliance does not have (or
    /// has at another address), now.
    #[serde(default)]
    pub health_unknown: u64,
}

/// The comparison of this appliance's table digests with its siblings'.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Agreement {
    /// This appliance's services (each table's digest is sent to the siblings).
    pub services: u64,
    /// Siblings connected whose digests were compared.
    pub siblings_compared: u64,
    /// Services on which a sibling compared differs (another digest, or
    /// without the service).
    pub mismatched: u64,
    /// Of those, services on which this appliance is in the minority.
    pub minority: u64,
    /// `siblings.gate`: a service in the minority has its VIPs withdrawn.
    pub gate: bool,
    /// Services whose VIPs are withdrawn for it now.
    pub withdrawn: u64,
    /// The services that differ (the first 100 by name).
    pub services_mismatched: Vec<Mismatch>,
}

/// One service on which a sibling differs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// The service.
    pub service: String,
    /// This appliance's digest of its table (as `sluice tables` shows it).
    pub digest: String,
    /// Siblings with another digest.
    pub differ: Vec<String>,
    /// Siblings without the service (they do not vote).
    pub absent: Vec<String>,
    /// Appliances with this digest, this one included.
    pub agree: u64,
    /// This appliance is in the minority.
    pub minority: bool,
    /// Its VIPs are withdrawn for it (`siblings.gate`).
    pub withdrawn: bool,
    /// In words.
    pub why: String,
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
    /// Services in its last digest set (`None`: no set, as from a sibling
    /// of the previous protocol version).
    #[serde(default)]
    pub digests: Option<u64>,
    /// Services on which it differs from this appliance.
    #[serde(default)]
    pub mismatched: u64,
    /// Endpoints its health wants out, in its last set (`None`: no set).
    #[serde(default)]
    pub health: Option<u64>,
}
