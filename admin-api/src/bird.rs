//! The BIRD driver's part of `/status`: BIRD itself, each BGP and BFD
//! session, and each VIP, announced or not.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// The BIRD driver.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bird {
    /// `supervised` or `external`.
    pub mode: String,
    /// The control socket.
    pub socket: String,
    /// The configuration file.
    pub config_file: String,
    /// BIRD answers on its socket.
    pub connected: bool,
    /// The supervised `bird`'s process id, while it runs.
    pub pid: Option<u32>,
    /// BIRD's greeting (its version).
    pub version: String,
    /// Times the supervised `bird` was started.
    pub starts: u64,
    /// Times it was started again after dying.
    pub restarts: u64,
    /// How it ended last time.
    pub last_exit: Option<String>,
    /// The last thing that went wrong, if it is still wrong.
    pub error: Option<String>,
    /// Configurations applied.
    pub configured: u64,
    /// Configurations refused or not applied.
    pub configure_failures: u64,
    /// BIRD's words when it refused the configuration Sluice wants it to
    /// run; `None` once it took one.
    pub refused: Option<String>,
    /// Commands BIRD refused while its state was read.
    pub refused_commands: u64,
    /// When the last configuration was applied (seconds since the epoch).
    pub configured_at: Option<u64>,
    /// Every VIP has been withdrawn for shutdown.
    pub withdrawn_for_shutdown: bool,
    /// The BGP sessions.
    pub sessions: Vec<Session>,
    /// The BFD sessions.
    pub bfd: Vec<BfdSession>,
    /// Each VIP, announced or not, and why.
    pub vips: Vec<Vip>,
    /// Return-path gateways learned over BGP.
    pub learned_gateways: Vec<String>,
}

/// A BGP session, as `show protocols` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// The GatewayRouter.
    pub router: String,
    /// Its BIRD protocol.
    pub protocol: String,
    /// The gateway's address.
    pub neighbor: String,
    /// The interface.
    pub interface: String,
    /// The protocol's state (empty before BIRD answered).
    pub state: String,
    /// The BGP session state.
    pub bgp_state: String,
    /// BIRD's info column (errors included).
    pub info: String,
    /// Since when.
    pub since: String,
    /// BFD asked for.
    pub bfd: bool,
    /// The BFD session's state, when BFD is on and BIRD reports one.
    pub bfd_state: Option<String>,
}

/// A row of `show bfd sessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BfdSession {
    /// The neighbour.
    pub address: IpAddr,
    /// The interface.
    pub interface: String,
    /// Up, Down, Init, AdminDown.
    pub state: String,
    /// Since when.
    pub since: String,
}

/// A VIP, announced or not, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vip {
    /// The VIP.
    pub vip: IpAddr,
    /// Exported to the gateways.
    pub announced: bool,
    /// Why (or why not).
    pub reason: String,
    /// Since when it has been so (seconds since the epoch).
    pub since: u64,
}
