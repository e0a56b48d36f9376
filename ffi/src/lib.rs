//! The only crate of Sluice that talks to DPDK.
//!
//! `sys` holds the raw bindings (generated at build time from the system's
//! DPDK, found with pkg-config) and the C shim's wrappers for DPDK's
//! `static inline` functions. Above them, safe owning types: [`Eal`],
//! [`Mempool`], [`Port`] with its [`RxQueue`]/[`TxQueue`], [`Mbuf`],
//! [`Ring`]. Every `unsafe` block of the project lives in this crate.

pub mod eal;
pub mod error;
pub mod io;
pub mod mbuf;
pub mod mempool;
pub mod port;
pub mod ring;
pub mod sys;

pub use eal::{current_lcore, dpdk_version, Eal, LcoreId, LcoreTask};
pub use error::{Error, Result};
pub use io::QueueIo;
pub use mbuf::{free_burst, Mbuf};
pub use mempool::{Mempool, DEFAULT_DATA_ROOM};
pub use port::{
    port_by_name, port_info, port_link, port_stats, ports, Link, MacAddr, Port, PortConfig, PortId, PortInfo, PortStats,
    QueueId, RxQueue, TxQueue,
};
pub use ring::{ring_port, Ring};

/// Version of the DPDK this crate was built against (from pkg-config).
pub const BUILT_AGAINST_DPDK: &str = env!("SLUICE_DPDK_VERSION");
