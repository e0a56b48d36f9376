//! BIRD2: announcing the VIPs the appliance can serve to the DC gateways.
//!
//! - [`render`]: the configuration, from the GatewayRouters and the VIPs to
//!   announce (typed input, deterministic text, checked by `bird -p`).
//! - [`client`]: BIRD's control socket (`configure check`, `configure`,
//!   `show protocols`, `show bfd sessions`, `down`).
//! - [`supervisor`]: runs Sluice's own `bird`, restarting it with backoff
//!   when it dies, or leaves an external one alone.
//! - [`announce`]: which VIPs may be announced (workers forward, and the
//!   VIP's service has a ready endpoint) and the driver task that keeps
//!   BIRD's configuration equal to that, withdraws everything before a
//!   graceful shutdown, and reports sessions, BFD and VIPs.
//!
//! The driver is one more reconciler on the control runtime: it follows the
//! accepted settings and the reconciler's published services, and only it
//! writes BIRD's configuration.

pub mod announce;
pub mod client;
pub mod render;
pub mod supervisor;

use serde::Serialize;

pub use announce::{decide, Driver, DriverHandle, Servable, VipState, WithdrawError};
pub use client::{BfdSession, Client, Protocol};

/// The BIRD driver's status channel (`None` while no gateway router is
/// configured); only the driver writes it.
pub type StatusRx = tokio::sync::watch::Receiver<Option<BirdStatus>>;

/// Errors of the BIRD driver.
#[derive(Debug, thiserror::Error)]
pub enum BirdError {
    /// The control socket could not be reached.
    #[error("cannot connect to BIRD's control socket {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Reading or writing the socket failed.
    #[error("BIRD's control socket: {0}")]
    Io(#[source] std::io::Error),
    /// BIRD closed the socket.
    #[error("BIRD closed its control socket")]
    Closed,
    /// No answer in time.
    #[error("BIRD did not answer in time ({what})")]
    Timeout {
        /// What was waited for.
        what: String,
    },
    /// BIRD answered something this client does not understand.
    #[error("BIRD's control socket: {0}")]
    Protocol(String),
    /// BIRD refused a command.
    #[error("BIRD refused {command:?} ({code:04}): {message}")]
    Refused {
        /// The command.
        command: String,
        /// BIRD's reply code.
        code: u16,
        /// BIRD's words.
        message: String,
    },
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `bird` could not be started.
    #[error("cannot start {binary}: {source}")]
    Spawn {
        /// The program.
        binary: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A BGP session, as `show protocols` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SessionStatus {
    /// The GatewayRouter.
    pub router: String,
    /// Its BIRD protocol.
    pub protocol: String,
    /// The gateway's address.
    pub neighbor: String,
    /// The interface.
    pub interface: String,
    /// The protocol's state (up, start, down; empty before BIRD answered).
    pub state: String,
    /// The BGP session state (Established, Active, Connect, Idle, Down).
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

/// What the BIRD driver reports (`/status`, `sluice status`, `/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BirdStatus {
    /// supervised or external.
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
    /// run (it keeps running its previous one); `None` once it took one.
    pub refused: Option<String>,
    /// Commands BIRD refused while its state was read.
    pub refused_commands: u64,
    /// When the last configuration was applied (seconds since the epoch).
    pub configured_at: Option<u64>,
    /// Every VIP has been withdrawn for shutdown.
    pub withdrawn_for_shutdown: bool,
    /// The BGP sessions.
    pub sessions: Vec<SessionStatus>,
    /// The BFD sessions.
    pub bfd: Vec<BfdSession>,
    /// Each VIP, announced or not, and why: announced means BIRD runs a
    /// configuration with it and exports it on an Established session.
    pub vips: Vec<VipState>,
    /// Return-path gateways learned over BGP (default routes), used for the
    /// families the configuration names no gateway for.
    pub learned_gateways: Vec<String>,
}
