//! Sluice's fast path, in pure Rust: what a worker does to each packet.
//!
//! No I/O, no DPDK types, no locks and no allocation per packet. The worker
//! loop moves bursts through the [`io::PacketIo`] trait.
#![forbid(unsafe_code)]

pub mod addr;
pub mod checksum;
pub mod chunked;
pub mod classify;
pub mod counters;
pub mod craft;
pub mod flow;
pub mod fragment;
pub mod handshake;
pub mod hash;
pub mod icmp;
pub mod io;
pub mod latency;
pub mod maglev;
pub mod memio;
pub mod parse;
pub mod pipeline;
pub mod rcu;
pub mod rewrite;
pub mod service;
pub mod snapshot;
pub mod steer;
pub mod sync;
pub mod verdict;
pub mod worker;
