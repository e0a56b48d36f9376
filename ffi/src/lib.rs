//! The only crate of Sluice that talks to DPDK.
//!
//! `sys` holds the raw bindings (generated at build time from the system's
//! DPDK, found with pkg-config) and the C shim's wrappers for DPDK's
//! `static inline` functions. Above them, safe owning types: [`Eal`],
//! [`Mempool`], [`Port`] with its [`RxQueue`]/[`TxQueue`] and
//! [`PortStatsReader`], [`Mbuf`], [`Ring`]. Every `unsafe` block of the
//! project lives in this crate.
//!
//! Who may do what, enforced by the types:
//! - [`Eal`] is the one handle to the EAL and stays on the main lcore
//!   (`!Send + !Sync`): mempools, rings and ports are created, and tasks
//!   launched on worker lcores ([`Eal::launch`], with a stop flag) and
//!   waited for ([`LcoreTask`], also `!Send`), there only.
//! - Mempools, rings and open ports hold an internal keep-alive of the EAL,
//!   so `rte_eal_cleanup` ([`Eal::shutdown`], or the drop of the last
//!   holder) never runs under them; a mempool dropped with mbufs still out
//!   is leaked with its keep-alive, so it never runs under an [`Mbuf`]
//!   either. An `Mbuf` is a bare pointer: no per-packet reference counting.
//! - A port's counters are read through the [`Port`] or a
//!   [`PortStatsReader`] (any thread), which keep the device open; there is
//!   no read by bare [`PortId`].
//!
//! The modules stand in layers, each importing only those below it: `sys`;
//! the plain ids (`ids`), the keep-alive registry (`keep`) and `mbuf`;
//! `error`; `eal`; `mempool` and `ring`; `port`; `io`. `heap` (the C
//! heap's statistics and trim) and `process` (what children inherit) stand
//! apart: they use no DPDK.

pub mod eal;
pub mod heap;
pub mod error;
mod ids;
pub mod io;
mod keep;
pub mod mbuf;
pub mod mempool;
pub mod port;
pub mod process;
pub mod ring;
pub mod sys;

pub use eal::{current_lcore, dpdk_version, tsc, Eal, LcoreTask};
pub use error::{Error, Result};
pub use ids::{LcoreId, PortId, QueueId};
pub use io::QueueIo;
pub use keep::Holders;
pub use mbuf::{free_burst, Mbuf};
pub use mempool::{Mempool, DEFAULT_DATA_ROOM, MBUF_HEADROOM};
pub use port::{
    port_by_name, port_info, ports, Link, MacAddr, Port, PortConfig, PortInfo, PortStats, PortStatsReader, RxQueue,
    TxQueue,
};
pub use ring::{ring_port, Ring};

/// Version of the DPDK this crate was built against (from pkg-config).
pub const BUILT_AGAINST_DPDK: &str = env!("SLUICE_DPDK_VERSION");
