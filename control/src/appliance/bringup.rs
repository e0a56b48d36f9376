//! Bring-up of the machine: the packet pool, the ports with the MTU the
//! configuration asks for, their exception taps and the kernel side of
//! each tap (MAC, MTU, addresses).

use std::sync::Arc;

use anyhow::{Context, Result};
use sluice_ffi::{Eal, Mempool, Port, PortConfig as FfiPortConfig};
use tracing::info;

use super::eal::{data_room, tap_device};
use crate::config::{ApplianceConfig, PortConfig};

/// A started port and its exception tap.
#[derive(Debug)]
pub(super) struct PortUp {
    /// Its configuration.
    pub(crate) cfg: PortConfig,
    /// The port.
    pub(crate) port: Port,
    /// Its exception tap, when it has a kernel interface.
    pub(crate) tap: Option<Port>,
    /// Its MAC.
    pub(crate) mac: [u8; 6],
}

/// The packet pool and every port, started.
#[derive(Debug)]
pub(super) struct Machine {
    /// The pool every port receives into.
    pub(crate) pool: Arc<Mempool>,
    /// Ports, in configuration order.
    pub(crate) ports: Vec<PortUp>,
}

/// Starts the pool, the ports and their taps, each with one queue per worker.
pub(super) fn start(eal: &Eal, cfg: &ApplianceConfig, workers: u16) -> Result<Machine> {
    let cache = if cfg.dpdk.mbufs >= 4096 { 256 } else { 0 };
    // Without hugepages no device reads the pool by physical address, and
    // mbufs packed across pages are what net_af_xdp needs (Mempool::packed).
    let make = if cfg.dpdk.hugepages { Mempool::new } else { Mempool::packed };
    // Large enough for a whole af_packet ring frame: a datagram the kernel
    // reassembled (eal::AF_PACKET_FRAME).
    let room = data_room(&cfg.ports);
    let pool = make(eal, "sluice_pool", cfg.dpdk.mbufs, cache, room)
        .context("creating the packet pool (lower dpdk.mbufs or raise dpdk.memoryMB)")?;
    info!(mbufs = cfg.dpdk.mbufs, data_room = room, "packet pool created");
    let mut ports = Vec::new();
    for (i, pc) in cfg.ports.iter().enumerate() {
        let id = sluice_ffi::port_by_name(eal, pc.device_name())?;
        let q = FfiPortConfig {
            rx_queues: workers,
            tx_queues: workers,
            rx_desc: cfg.dpdk.descriptors,
            tx_desc: cfg.dpdk.descriptors,
            mtu: Some(pc.mtu),
            rx_interrupts: cfg.dpdk.rx_interrupts && !cfg.dpdk.busy_poll,
            ..FfiPortConfig::default()
        };
        let port = Port::start(eal, id, &q, &pool)
            .with_context(|| format!("starting port {:?} ({}) with MTU {}", pc.name, pc.device, pc.mtu))?;
        let mac = port.mac()?;
        info!(port = %pc.name, device = %pc.device, driver = %port.info().driver, %mac, mtu = pc.mtu, rss = port.rss_enabled(), "port started");
        let tap = if pc.kernel_interface.is_empty() {
            None
        } else {
            let tid = sluice_ffi::port_by_name(eal, &tap_device(i))?;
            let tq = FfiPortConfig { rx_desc: 256, tx_desc: 256, promiscuous: false, mtu: None, ..q.clone() };
            let t = Port::start(eal, tid, &tq, &pool).with_context(|| format!("starting the exception tap of port {:?}", pc.name))?;
            Some(t)
        };
        ports.push(PortUp { cfg: pc.clone(), port, tap, mac: mac.0 });
    }
    Ok(Machine { pool, ports })
}
