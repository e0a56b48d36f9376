//! The kernel side of the exception path, spoken over rtnetlink instead of
//! iproute2.
//!
//! Each port may have a kernel interface (the DPDK tap of its exception
//! path) that carries the appliance's own addresses and the port's MAC, so
//! the kernel answers ARP/ND, speaks BGP and ICMP, and resolves next hops.
//! [`links`] configures such an interface and reads interface counters;
//! [`neighbours`] keeps the next hops Sluice forwards to resolved by the
//! kernel and publishes their MACs as they change.
//!
//! Every function here runs on the control side's tokio runtime and talks
//! to the network namespace its netlink socket was opened in: the one of
//! the thread that called [`connect`] or [`neighbours::Neighbours::spawn`]
//! (re-opened sockets use the thread the task then runs on; the appliance
//! lives in one namespace, so that is the same one).

pub mod bird;
mod links;
mod neighbours;

use std::net::IpAddr;

pub use links::{configure_interface, exception_queue_len, keep_left_to_dpdk, leave_to_dpdk, link_counters, mac_str, take_down, LinkCounters};
pub use neighbours::{NeighMap, Neighbours};

/// Errors of the kernel side of the exception path.
#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    /// Called outside a tokio runtime.
    #[error("netlink needs a tokio runtime, and none is running on this thread")]
    NoRuntime,
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink route socket: {0}")]
    Socket(#[source] std::io::Error),
    /// No interface of that name in this network namespace.
    #[error("no interface {iface:?} in this network namespace")]
    NoInterface {
        /// Interface name.
        iface: String,
    },
    /// The kernel refused or failed an operation on an interface.
    #[error("{op} on interface {iface:?}: {source}")]
    Netlink {
        /// Interface name.
        iface: String,
        /// What was being done, with its argument.
        op: String,
        /// The kernel's (or rtnetlink's) error.
        #[source]
        source: rtnetlink::Error,
    },
    /// The kernel answered with something this module does not understand.
    #[error("{op} on interface {iface:?}: unexpected answer from the kernel: {what}")]
    Unexpected {
        /// Interface name.
        iface: String,
        /// What was being done.
        op: String,
        /// What came back.
        what: String,
    },
    /// A netlink socket of its own could not be opened or used.
    #[error("{op} on interface {iface:?}: {source}")]
    Io {
        /// Interface name.
        iface: String,
        /// What was being done.
        op: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A sysctl of the interface could not be set.
    #[error("interface {iface:?}: cannot write {path}: {source}")]
    Sysctl {
        /// Interface name.
        iface: String,
        /// The procfs path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The interface reports no link statistics.
    #[error("interface {iface:?} reports no link statistics")]
    NoStats {
        /// Interface name.
        iface: String,
    },
    /// More kernel interfaces than port indices.
    #[error("{0} kernel interfaces given, but port indices stop at 256")]
    TooManyPorts(usize),
    /// A prefix length beyond the address family's width.
    #[error("address {addr}/{prefix} for interface {iface:?}: prefix too long")]
    BadPrefix {
        /// Interface name.
        iface: String,
        /// The address.
        addr: IpAddr,
        /// Its prefix length.
        prefix: u8,
    },
    /// The neighbour task is not connected to the kernel right now.
    #[error("the neighbour task has no netlink connection right now (it is reconnecting)")]
    Disconnected,
    /// The neighbour task has stopped.
    #[error("the neighbour task has stopped")]
    Stopped,
}

impl RoutingError {
    fn netlink(iface: &str, op: impl Into<String>, source: rtnetlink::Error) -> RoutingError {
        RoutingError::Netlink { iface: iface.to_owned(), op: op.into(), source }
    }

    /// The errno the kernel answered with, if this is a kernel refusal.
    pub(crate) fn errno(&self) -> Option<i32> {
        match self {
            RoutingError::Netlink { source, .. } => errno(source),
            _ => None,
        }
    }
}

/// The (positive) errno of a kernel refusal.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| c.get().saturating_neg()),
        _ => None,
    }
}

/// Opens a netlink route socket in the calling thread's network namespace
/// and drives it on the current tokio runtime. The connection task ends
/// when the last clone of the handle is dropped.
pub fn connect() -> Result<rtnetlink::Handle, RoutingError> {
    let rt = tokio::runtime::Handle::try_current().map_err(|_| RoutingError::NoRuntime)?;
    let (conn, handle, _unsolicited) = rtnetlink::new_connection().map_err(RoutingError::Socket)?;
    rt.spawn(conn);
    Ok(handle)
}
