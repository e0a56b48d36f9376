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
mod client;
pub mod render;
pub mod supervisor;

use serde::Serialize;

pub use announce::{decide, Driver, DriverHandle, Servable, VipState, WithdrawError};
pub use client::{BfdSession, Client, Protocol};

/// The BIRD driver's status channel (`None` while no gateway router is
/// configured); only the driver writes it.
pub(crate) type StatusRx = tokio::sync::watch::Receiver<Option<BirdStatus>>;

/// Errors of the BIRD driver.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BirdError {
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
pub(crate) struct SessionStatus {
    /// The GatewayRouter.
    pub(crate) router: String,
    /// Its BIRD protocol.
    pub(crate) protocol: String,
    /// The gateway's address.
    pub(crate) neighbor: String,
    /// The interface.
    pub(crate) interface: String,
    /// The protocol's state (up, start, down; empty before BIRD answered).
    pub(crate) state: String,
    /// The BGP session state (Established, Active, Connect, Idle, Down).
    pub(crate) bgp_state: String,
    /// BIRD's info column (errors included).
    pub(crate) info: String,
    /// Since when.
    pub(crate) since: String,
    /// BFD asked for.
    pub(crate) bfd: bool,
    /// The BFD session's state, when BFD is on and BIRD reports one.
    pub(crate) bfd_state: Option<String>,
}

/// What the BIRD driver reports (`/status`, `sluice status`, `/metrics`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct BirdStatus {
    /// supervised or external.
    pub(crate) mode: String,
    /// The control socket.
    pub(crate) socket: String,
    /// The configuration file.
    pub(crate) config_file: String,
    /// BIRD answers on its socket.
    pub(crate) connected: bool,
    /// The supervised `bird`'s process id, while it runs.
    pub(crate) pid: Option<u32>,
    /// BIRD's greeting (its version).
    pub(crate) version: String,
    /// Times the supervised `bird` was started.
    pub(crate) starts: u64,
    /// Times it was started again after dying.
    pub(crate) restarts: u64,
    /// How it ended last time.
    pub(crate) last_exit: Option<String>,
    /// The last thing that went wrong, if it is still wrong.
    pub(crate) error: Option<String>,
    /// Configurations applied.
    pub(crate) configured: u64,
    /// Configurations refused or not applied.
    pub(crate) configure_failures: u64,
    /// BIRD's words when it refused the configuration Sluice wants it to
    /// run (it keeps running its previous one); `None` once it took one.
    pub(crate) refused: Option<String>,
    /// Commands BIRD refused while its state was read.
    pub(crate) refused_commands: u64,
    /// When the last configuration was applied (seconds since the epoch).
    pub(crate) configured_at: Option<u64>,
    /// Every VIP has been withdrawn for shutdown.
    pub(crate) withdrawn_for_shutdown: bool,
    /// The BGP sessions.
    pub(crate) sessions: Vec<SessionStatus>,
    /// The BFD sessions.
    pub(crate) bfd: Vec<BfdSession>,
    /// Each VIP, announced or not, and why: announced means BIRD runs a
    /// configuration with it and exports it on an Established session.
    pub(crate) vips: Vec<VipState>,
    /// Return-path gateways learned over BGP (default routes), used for the
    /// families the configuration names no gateway for.
    pub(crate) learned_gateways: Vec<String>,
}
