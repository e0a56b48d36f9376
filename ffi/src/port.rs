//! Ethernet ports: lookup, configuration, start/stop, queues, MAC, MTU,
//! link, statistics and extended statistics.
//!
//! [`Port::start`] configures N receive and M transmit queues (RSS across
//! the receive queues when the device has it), sets the MTU, starts the
//! device and turns promiscuous mode on if asked. One `Port` at a time owns
//! a device. Each queue is handed out once ([`Port::take_rx_queue`]) so that
//! exactly one thread polls it.
//!
//! Link state and statistics are read through the `Port` or through a
//! [`PortStatsReader`] taken from it (`Send + Sync`, for other threads);
//! never by bare [`PortId`], which could name a device being closed, or
//! another device that reused the number. Reads of one port are serialised.
//!
//! The device stays open while the `Port`, any queue taken from it or any
//! statistics reader exists; when the last goes, promiscuous mode is set
//! back to what it was before [`Port::start`] (which turns it on if asked;
//! DPDK's start itself turns a kernel interface's promiscuous mode off),
//! then the device is stopped and closed (returning the mbufs it held to
//! their pool). Each of them keeps the EAL up.

use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use sluice_dataplane::io::{Burst, BURST};

use crate::eal::{probed_port, Eal};
use crate::error::{call_error, strerror, Error, Result};
pub use crate::ids::{PortId, QueueId};
use crate::keep::{Holder, KeepAlive};
use crate::mbuf::{burst_u16, burst_u32, Mbuf};
use crate::mempool::Mempool;
use crate::sys;

/// A 48-bit Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", b[0], b[1], b[2], b[3], b[4], b[5])
    }
}

/// RSS hash types Sluice asks for: IPv4/IPv6 addresses, TCP/UDP/SCTP ports.
pub const RSS_HASH_TYPES: u64 = sys::RTE_ETH_RSS_IP as u64
    | sys::RTE_ETH_RSS_TCP as u64
    | sys::RTE_ETH_RSS_UDP as u64
    | sys::RTE_ETH_RSS_SCTP as u64;

/// How to set up a port.
#[derive(Clone, Debug)]
pub struct PortConfig {
    /// Receive queues (one per worker).
    pub rx_queues: u16,
    /// Transmit queues (one per thread that sends on the port).
    pub tx_queues: u16,
    /// Receive descriptors per queue (adjusted to the device's limits).
    pub rx_desc: u16,
    /// Transmit descriptors per queue (adjusted to the device's limits).
    pub tx_desc: u16,
    /// Spread receive queues with RSS when there are several and the device supports it.
    pub rss: bool,
    /// Receive frames for every destination MAC.
    pub promiscuous: bool,
    /// MTU to set before the device starts, if any. A driver that cannot
    /// change its MTU is accepted when its MTU is at least this.
    pub mtu: Option<u16>,
    /// Ask the device for receive interrupts, so that an idle poller can
    /// sleep until traffic comes ([`RxQueue::arm_interrupt`]). A device
    /// that fails to start with them is started again without.
    pub rx_interrupts: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            rss: true,
            promiscuous: true,
            mtu: None,
            rx_interrupts: false,
        }
    }
}

/// What a device is and can do.
#[derive(Clone, Debug)]
pub struct PortInfo {
    /// The port number.
    pub id: PortId,
    /// The device name (`net_null0`, a PCI address, ...).
    pub name: String,
    /// The driver (`net_null`, `net_ice`, ...).
    pub driver: String,
    /// Maximum receive queues.
    pub max_rx_queues: u16,
    /// Maximum transmit queues.
    pub max_tx_queues: u16,
    /// RSS hash types the device supports (0: no RSS).
    pub rss_offloads: u64,
    /// NUMA socket of the device (-1 when unknown).
    pub socket: i32,
    /// Smallest MTU the device accepts.
    pub min_mtu: u16,
    /// Largest MTU the device accepts.
    pub max_mtu: u16,
    /// The kernel interface the device is bound to (af_packet, tap...), 0
    /// when none.
    pub if_index: u32,
}

/// Link state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Link {
    /// Up or down.
    pub up: bool,
    /// Speed in Mb/s (0 when unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Basic port counters (`rte_eth_stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Packets the NIC dropped because receive queues were full.
    pub imissed: u64,
    /// Erroneous received packets.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// Receive failures for want of an mbuf.
    pub rx_nombuf: u64,
}

fn port_name(id: u16) -> Option<String> {
    let mut buf = [0 as std::ffi::c_char; sys::RTE_ETH_NAME_MAX_LEN as usize];
    // SAFETY: `buf` has RTE_ETH_NAME_MAX_LEN bytes as the call requires.
    let ret = unsafe { sys::rte_eth_dev_get_name_by_port(id, buf.as_mut_ptr()) };
    if ret != 0 {
        return None;
    }
    // SAFETY: on success the buffer holds a NUL-terminated name.
    Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// Every port the EAL probed, in order.
pub fn ports(_eal: &Eal) -> Vec<PortId> {
    let mut v = Vec::new();
    // SAFETY: the EAL is initialised; rte_eth_find_next only reads device state.
    let mut p = unsafe { sys::rte_eth_find_next(0) };
    while u32::from(p) < sys::RTE_MAX_ETHPORTS {
        v.push(PortId(p));
        // SAFETY: as above.
        p = unsafe { sys::rte_eth_find_next(p + 1) };
    }
    v
}

/// The port named `name` (e.g. `net_null0`, or a PCI address).
pub fn port_by_name(eal: &Eal, name: &str) -> Result<PortId> {
    if let Some(id) = probed_port(name)? {
        return Ok(id);
    }
    let known: Vec<String> = ports(eal).iter().filter_map(|p| port_name(p.0)).collect();
    Err(Error::NoSuchPort { name: name.to_owned(), known: if known.is_empty() { "none".into() } else { known.join(", ") } })
}

/// What the device behind `id` is and can do.
pub fn port_info(_eal: &Eal, id: PortId) -> Result<PortInfo> {
    let mut info = sys::rte_eth_dev_info::default();
    // SAFETY: `info` is a valid out structure.
    let ret = unsafe { sys::rte_eth_dev_info_get(id.0, &mut info) };
    if ret != 0 {
        return Err(call_error("rte_eth_dev_info_get", id.to_string(), ret));
    }
    let driver = if info.driver_name.is_null() {
        String::new()
    } else {
        // SAFETY: the driver name is a static NUL-terminated string.
        unsafe { CStr::from_ptr(info.driver_name) }.to_string_lossy().into_owned()
    };
    // SAFETY: plain query of a valid port.
    let socket = unsafe { sys::rte_eth_dev_socket_id(id.0) };
    Ok(PortInfo {
        id,
        name: port_name(id.0).unwrap_or_default(),
        driver,
        max_rx_queues: info.max_rx_queues,
        max_tx_queues: info.max_tx_queues,
        rss_offloads: info.flow_type_rss_offloads,
        socket,
        min_mtu: info.min_mtu,
        max_mtu: info.max_mtu,
        if_index: info.if_index,
    })
}

/// Whether kernel interface `if_index` is in promiscuous mode as set by a
/// user (`ip link set promisc on`); false when there is none or it cannot
/// be read. DPDK's own flag starts off for kernel-backed drivers whatever
/// the kernel says.
fn kernel_promiscuous(if_index: u32) -> bool {
    if if_index == 0 {
        return false;
    }
    // SAFETY: ifreq is plain C data, valid when all zero.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: `ifr_name` has IFNAMSIZ bytes, as if_indextoname requires.
    if unsafe { libc::if_indextoname(if_index, ifr.ifr_name.as_mut_ptr()) }.is_null() {
        return false;
    }
    // SAFETY: plain socket creation; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `ifr`
    // into `ifr.ifr_ifru`; `fd` is an open socket.
    let ret = unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) };
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    // SAFETY: on success the kernel set the `ifru_flags` member.
    ret == 0 && i32::from(unsafe { ifr.ifr_ifru.ifru_flags }) & libc::IFF_PROMISC != 0
}

/// A port owned by one [`Port`]; keeps the EAL up and releases the claim
/// when dropped (after the device is closed).
struct PortClaim {
    id: PortId,
    keep: KeepAlive,
}

impl PortClaim {
    fn new(eal: &Eal, id: PortId, name: &str) -> Result<PortClaim> {
        if !eal.shared().claim_port(id) {
            return Err(Error::PortConfig { port: id, reason: format!("device {name} is already started by another Port") });
        }
        Ok(PortClaim { id, keep: eal.keep(Holder::Port) })
    }
}

impl Drop for PortClaim {
    fn drop(&mut self) {
        self.keep.shared().unclaim_port(self.id);
    }
}

/// The open device, shared by the `Port`, its queues and its readers.
struct PortInner {
    id: PortId,
    /// `rte_eth_dev_start` succeeded.
    started: bool,
    /// The promiscuous mode to set again before closing, when Sluice (or
    /// DPDK's start) changed it.
    restore_promisc: Option<bool>,
    /// Serialises control-path reads (statistics, link) of this port.
    ctl: Mutex<()>,
    _pool: Arc<Mempool>,
    /// Started with receive interrupts requested.
    rx_interrupts: bool,
    /// Dropped last: the EAL outlives the close above.
    claim: PortClaim,
}

impl Drop for PortInner {
    fn drop(&mut self) {
        match self.restore_promisc {
            // SAFETY: valid, started port; nothing polls it any more.
            Some(false) => unsafe { sys::rte_eth_promiscuous_disable(self.id.0) },
            // SAFETY: as above.
            Some(true) => unsafe { sys::rte_eth_promiscuous_enable(self.id.0) },
            None => 0,
        };
        // SAFETY: the Port handle, every queue and every reader are gone, so
        // nothing polls or reads the device; stopping and closing it releases
        // the mbufs it holds back to the pool (kept alive by `_pool` until
        // after this); the EAL is up (`claim` holds a keep-alive).
        unsafe {
            if self.started {
                sys::rte_eth_dev_stop(self.id.0);
            }
            sys::rte_eth_dev_close(self.id.0);
        }
        // A ring port no longer uses its rings.
        self.claim.keep.shared().release_ring_port(self.id);
    }
}

impl PortInner {
    fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.ctl.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn link(&self) -> Result<Link> {
        let _g = self.lock();
        let mut l = sys::rte_eth_link::default();
        // SAFETY: open port (we hold it) and a valid out structure.
        let ret = unsafe { sys::rte_eth_link_get_nowait(self.id.0, &mut l) };
        if ret != 0 {
            return Err(call_error("rte_eth_link_get_nowait", self.id.to_string(), ret));
        }
        Ok(Link { up: l.link_status() != 0, speed_mbps: l.link_speed, full_duplex: l.link_duplex() != 0 })
    }

    fn stats(&self) -> Result<PortStats> {
        let _g = self.lock();
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: open port (we hold it) and a valid out structure.
        let ret = unsafe { sys::rte_eth_stats_get(self.id.0, &mut s) };
        if ret != 0 {
            return Err(call_error("rte_eth_stats_get", self.id.to_string(), ret));
        }
        Ok(PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    fn reset_stats(&self) -> Result<()> {
        let _g = self.lock();
        // SAFETY: open port (we hold it).
        let ret = unsafe { sys::rte_eth_stats_reset(self.id.0) };
        if ret != 0 {
            return Err(call_error("rte_eth_stats_reset", self.id.to_string(), ret));
        }
        Ok(())
    }

    fn xstats(&self) -> Result<Vec<(String, u64)>> {
        let _g = self.lock();
        let id = self.id.0;
        // SAFETY: open port; a null array with size 0 asks for the count.
        let n = unsafe { sys::rte_eth_xstats_get_names(id, std::ptr::null_mut(), 0) };
        let Ok(count) = usize::try_from(n) else {
            return Err(call_error("rte_eth_xstats_get_names", self.id.to_string(), n));
        };
        let mut names = vec![sys::rte_eth_xstat_name { name: [0; 64] }; count];
        let mut values = vec![sys::rte_eth_xstat::default(); count];
        let size = u32::try_from(count).unwrap_or(u32::MAX);
        // SAFETY: open port; `names` has `count` elements.
        let got = unsafe { sys::rte_eth_xstats_get_names(id, names.as_mut_ptr(), size) };
        if got < 0 {
            return Err(call_error("rte_eth_xstats_get_names", self.id.to_string(), got));
        }
        // SAFETY: open port; `values` has `count` elements.
        let got = unsafe { sys::rte_eth_xstats_get(id, values.as_mut_ptr(), size) };
        if got < 0 {
            return Err(call_error("rte_eth_xstats_get", self.id.to_string(), got));
        }
        let got = usize::try_from(got).unwrap_or(0).min(count);
        Ok(values[..got]
            .iter()
            .filter_map(|v| {
                let name = names.get(usize::try_from(v.id).ok()?)?;
                // SAFETY: DPDK NUL-terminates names within their 64 bytes.
                let s = unsafe { CStr::from_ptr(name.name.as_ptr()) }.to_string_lossy().into_owned();
                Some((s, v.value))
            })
            .collect())
    }

    fn mtu(&self) -> Result<u16> {
        let _g = self.lock();
        current_mtu(self.id)
    }
}

/// The MTU DPDK records for a device (what the driver was last set to, or
/// its default).
fn current_mtu(id: PortId) -> Result<u16> {
    let mut mtu: u16 = 0;
    // SAFETY: valid port and out pointer.
    let ret = unsafe { sys::rte_eth_dev_get_mtu(id.0, &mut mtu) };
    if ret != 0 {
        return Err(call_error("rte_eth_dev_get_mtu", id.to_string(), ret));
    }
    Ok(mtu)
}

/// Sets the MTU of configured port `id` to `want`. A driver that cannot
/// change it (ENOTSUP) is accepted when its current MTU is at least `want`.
fn set_mtu(id: PortId, info: &PortInfo, want: u16) -> Result<()> {
    // SAFETY: configured, not yet started port.
    let ret = unsafe { sys::rte_eth_dev_set_mtu(id.0, want) };
    if ret == 0 {
        return Ok(());
    }
    let actual = current_mtu(id)?;
    let err = |reason: String| Error::Mtu { port: id, device: info.name.clone(), requested: want, actual, reason };
    if ret == -libc::ENOTSUP {
        if actual >= want {
            return Ok(());
        }
        return Err(err(format!("driver {} cannot change the MTU", info.driver)));
    }
    Err(err(format!(
        "rte_eth_dev_set_mtu failed: {} (the device accepts {} to {})",
        strerror(-ret),
        info.min_mtu,
        info.max_mtu
    )))
}

/// `rte_eth_dev_configure` of a port not started.
fn configure(id: PortId, info: &PortInfo, cfg: &PortConfig, conf: &sys::rte_eth_conf) -> Result<()> {
    // SAFETY: valid port id and configuration structure.
    let ret = unsafe { sys::rte_eth_dev_configure(id.0, cfg.rx_queues, cfg.tx_queues, conf) };
    if ret != 0 {
        return Err(call_error("rte_eth_dev_configure", format!("{id} {}", info.name), ret));
    }
    Ok(())
}

/// Sets up the queues of a configured port, receiving into `pool`, and its MTU.
fn set_up_queues(id: PortId, info: &PortInfo, cfg: &PortConfig, pool: &Arc<Mempool>) -> Result<()> {
    let (mut nrx, mut ntx) = (cfg.rx_desc, cfg.tx_desc);
    // SAFETY: valid port and out pointers.
    let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id.0, &mut nrx, &mut ntx) };
    if ret != 0 {
        return Err(call_error("rte_eth_dev_adjust_nb_rx_tx_desc", id.to_string(), ret));
    }
    // SOCKET_ID_ANY (-1) as the unsigned value DPDK expects.
    let socket = u32::try_from(info.socket).unwrap_or(u32::MAX);
    for q in 0..cfg.rx_queues {
        // SAFETY: configured port; null rxconf means the driver default;
        // the pool outlives the port (held by its `PortInner`).
        let ret = unsafe { sys::rte_eth_rx_queue_setup(id.0, q, nrx, socket, std::ptr::null(), pool.as_ptr()) };
        if ret != 0 {
            return Err(call_error("rte_eth_rx_queue_setup", format!("{id} q{q}"), ret));
        }
    }
    for q in 0..cfg.tx_queues {
        // SAFETY: configured port; null txconf means the driver default.
        let ret = unsafe { sys::rte_eth_tx_queue_setup(id.0, q, ntx, socket, std::ptr::null()) };
        if ret != 0 {
            return Err(call_error("rte_eth_tx_queue_setup", format!("{id} q{q}"), ret));
        }
    }
    if let Some(mtu) = cfg.mtu {
        set_mtu(id, info, mtu)?;
    }
    Ok(())
}

/// A configured, started Ethernet port.
pub struct Port {
    inner: Arc<PortInner>,
    info: PortInfo,
    rss: bool,
    rx: Vec<Option<RxQueue>>,
    tx: Vec<Option<TxQueue>>,
}

impl fmt::Debug for Port {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Port")
            .field("id", &self.inner.id)
            .field("name", &self.info.name)
            .field("driver", &self.info.driver)
            .field("rx_queues", &self.rx.len())
            .field("tx_queues", &self.tx.len())
            .field("rss", &self.rss)
            .finish()
    }
}

impl Port {
    /// Configures `id` as `cfg` asks, receiving into `pool`, sets its MTU,
    /// starts it and turns promiscuous mode on if asked. A device is owned
    /// by one `Port` at a time; on error it is closed again if it was
    /// configured.
    pub fn start(eal: &Eal, id: PortId, cfg: &PortConfig, pool: &Arc<Mempool>) -> Result<Port> {
        let info = port_info(eal, id)?;
        let bad = |reason: String| Error::PortConfig { port: id, reason };
        if cfg.rx_queues == 0 || cfg.tx_queues == 0 {
            return Err(bad("a port needs at least one receive and one transmit queue".into()));
        }
        if cfg.rx_queues > info.max_rx_queues {
            return Err(bad(format!(
                "{} receive queues asked, device {} ({}) has at most {}",
                cfg.rx_queues, info.name, info.driver, info.max_rx_queues
            )));
        }
        if cfg.tx_queues > info.max_tx_queues {
            return Err(bad(format!(
                "{} transmit queues asked, device {} ({}) has at most {}",
                cfg.tx_queues, info.name, info.driver, info.max_tx_queues
            )));
        }
        let claim = PortClaim::new(eal, id, &info.name)?;
        let mut conf = sys::rte_eth_conf::default();
        let rss_hf = RSS_HASH_TYPES & info.rss_offloads;
        let rss = cfg.rss && cfg.rx_queues > 1 && rss_hf != 0;
        if rss {
            conf.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
        }
        // Receive interrupts where asked; a device that refuses them, here
        // or at the start below, is set up again without (its worker then
        // sleeps its pauses instead of waiting on them).
        let mut rx_interrupts = cfg.rx_interrupts;
        conf.intr_conf.set_rxq(u32::from(rx_interrupts));
        if let Err(e) = configure(id, &info, cfg, &conf) {
            if !rx_interrupts {
                return Err(e);
            }
            rx_interrupts = false;
            conf.intr_conf.set_rxq(0);
            configure(id, &info, cfg, &conf)?;
        }
        // From here on, dropping `inner` closes the device (stopping it
        // first once it is started).
        let mut inner = PortInner {
            id,
            started: false,
            restore_promisc: None,
            ctl: Mutex::new(()),
            _pool: Arc::clone(pool),
            rx_interrupts,
            claim,
        };
        set_up_queues(id, &info, cfg, pool)?;
        // Read before the start, which replays DPDK's own flag onto the
        // device: for kernel-backed drivers it starts off, whatever the
        // kernel interface had.
        // SAFETY: configured port; a plain query.
        let promisc_before = unsafe { sys::rte_eth_promiscuous_get(id.0) } == 1 || kernel_promiscuous(info.if_index);
        // SAFETY: every queue is set up.
        let mut ret = unsafe { sys::rte_eth_dev_start(id.0) };
        if ret != 0 && inner.rx_interrupts {
            conf.intr_conf.set_rxq(0);
            inner.rx_interrupts = false;
            configure(id, &info, cfg, &conf)?;
            set_up_queues(id, &info, cfg, pool)?;
            // SAFETY: every queue is set up again.
            ret = unsafe { sys::rte_eth_dev_start(id.0) };
        }
        if ret != 0 {
            return Err(call_error("rte_eth_dev_start", format!("{id} {}", info.name), ret));
        }
        inner.started = true;
        if cfg.promiscuous {
            // SAFETY: started port. Devices without the feature return an
            // error, which is harmless: they already receive everything.
            unsafe { sys::rte_eth_promiscuous_enable(id.0) };
        }
        // SAFETY: started port; a plain query.
        let promisc_now = unsafe { sys::rte_eth_promiscuous_get(id.0) } == 1;
        inner.restore_promisc = (promisc_now != promisc_before).then_some(promisc_before);
        let inner = Arc::new(inner);
        let rx = (0..cfg.rx_queues)
            .map(|q| Some(RxQueue { port: Arc::clone(&inner), queue: QueueId(q), _not_sync: PhantomData }))
            .collect();
        let tx = (0..cfg.tx_queues)
            .map(|q| Some(TxQueue { port: Arc::clone(&inner), queue: QueueId(q), _not_sync: PhantomData }))
            .collect();
        Ok(Port { inner, info, rss, rx, tx })
    }

    /// The port number.
    pub fn id(&self) -> PortId {
        self.inner.id
    }

    /// What the device is.
    pub fn info(&self) -> &PortInfo {
        &self.info
    }

    /// Whether RSS spreads the receive queues.
    pub fn rss_enabled(&self) -> bool {
        self.rss
    }

    /// Takes receive queue `q` (once).
    pub fn take_rx_queue(&mut self, q: u16) -> Option<RxQueue> {
        self.rx.get_mut(usize::from(q))?.take()
    }

    /// Takes transmit queue `q` (once).
    pub fn take_tx_queue(&mut self, q: u16) -> Option<TxQueue> {
        self.tx.get_mut(usize::from(q))?.take()
    }

    /// The port's own MAC address.
    pub fn mac(&self) -> Result<MacAddr> {
        let mut a = sys::rte_ether_addr::default();
        // SAFETY: valid port and out structure.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.inner.id.0, &mut a) };
        if ret != 0 {
            return Err(call_error("rte_eth_macaddr_get", self.inner.id.to_string(), ret));
        }
        Ok(MacAddr(a.addr_bytes))
    }

    /// The device's MTU (as DPDK records it).
    pub fn mtu(&self) -> Result<u16> {
        self.inner.mtu()
    }

    /// The link state, without waiting.
    pub fn link(&self) -> Result<Link> {
        self.inner.link()
    }

    /// Basic counters.
    pub fn stats(&self) -> Result<PortStats> {
        self.inner.stats()
    }

    /// Clears the basic counters.
    pub fn reset_stats(&self) -> Result<()> {
        self.inner.reset_stats()
    }

    /// The driver's extended counters, by name.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>> {
        self.inner.xstats()
    }

    /// A reader of this port's link state and counters for another thread.
    /// The device stays open (started) while a reader exists.
    pub fn stats_reader(&self) -> PortStatsReader {
        PortStatsReader { port: Arc::clone(&self.inner) }
    }
}

/// Reads one port's link state and counters from any thread; cheap to
/// clone. Keeps the device open (not stopped or closed) while it exists.
#[derive(Clone)]
pub struct PortStatsReader {
    port: Arc<PortInner>,
}

impl fmt::Debug for PortStatsReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PortStatsReader({})", self.port.id)
    }
}

impl PortStatsReader {
    /// The port.
    pub fn id(&self) -> PortId {
        self.port.id
    }

    /// The link state, without waiting.
    pub fn link(&self) -> Result<Link> {
        self.port.link()
    }

    /// Basic counters.
    pub fn stats(&self) -> Result<PortStats> {
        self.port.stats()
    }

    /// The driver's extended counters, by name.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>> {
        self.port.xstats()
    }
}

/// A receive queue, polled by one thread.
pub struct RxQueue {
    port: Arc<PortInner>,
    queue: QueueId,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl fmt::Debug for RxQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RxQueue({}/{})", self.port.id, self.queue)
    }
}

impl RxQueue {
    /// The port.
    pub fn port(&self) -> PortId {
        self.port.id
    }

    /// The queue number.
    pub fn queue(&self) -> QueueId {
        self.queue
    }

    /// Receives up to the burst's free capacity; returns how many were added.
    #[inline]
    pub fn rx_burst(&mut self, burst: &mut Burst<Mbuf>) -> usize {
        let len = burst.len();
        let room = BURST - len;
        if room == 0 {
            return 0;
        }
        // SAFETY: the slots after `len` are free capacity for `room` mbuf
        // pointers (Mbuf is repr(transparent) over a non-null pointer);
        // this thread is the only one polling this queue (RxQueue is !Sync
        // and handed out once); the port is started and alive (`port`).
        unsafe {
            let dst = burst.as_mut_ptr().add(len).cast::<*mut sys::rte_mbuf>();
            let n = sys::sluice_rx_burst(self.port.id.0, self.queue.0, dst, burst_u16(room));
            burst.set_len(len + usize::from(n));
            usize::from(n)
        }
    }
}

impl RxQueue {
    /// Registers this queue's receive interrupt with the calling thread's
    /// DPDK epoll instance, for [`wait_for_rx`]: true when the device gives
    /// one (it was started with `rx_interrupts` and its driver has them).
    /// Call on the thread that polls the queue, once.
    pub fn arm_interrupt(&self) -> bool {
        if !self.port.rx_interrupts {
            return false;
        }
        // A device without receive interrupts answers with an error log
        // line ("Rx Intr handle unset"): asked of every device, that is no
        // error, so logging is quiet for the question.
        // SAFETY: plain reads and writes of EAL's log level.
        let level = unsafe { sys::rte_log_get_global_level() };
        // SAFETY: as above.
        unsafe { sys::rte_log_set_global_level(sys::RTE_LOG_EMERG) };
        // SAFETY: started port, valid queue; RTE_EPOLL_PER_THREAD names the
        // calling thread's epoll instance (created by EAL on first use); no
        // user data.
        let ret = unsafe {
            sys::rte_eth_dev_rx_intr_ctl_q(
                self.port.id.0,
                self.queue.0,
                sys::RTE_EPOLL_PER_THREAD,
                sys::RTE_INTR_EVENT_ADD as i32,
                std::ptr::null_mut(),
            )
        };
        // SAFETY: as above.
        unsafe { sys::rte_log_set_global_level(level) };
        ret == 0
    }

    /// Turns the queue's receive interrupt on or off. Devices whose
    /// interrupt is always on (a tap's file descriptor) have no switch.
    pub fn set_interrupt(&self, on: bool) {
        // SAFETY: started port, valid queue. The result is ignored: ENOTSUP
        // means the interrupt needs no switching.
        unsafe {
            if on {
                sys::rte_eth_dev_rx_intr_enable(self.port.id.0, self.queue.0);
            } else {
                sys::rte_eth_dev_rx_intr_disable(self.port.id.0, self.queue.0);
            }
        }
    }
}

/// Waits up to `timeout_ms` milliseconds for a receive interrupt of a
/// queue armed on the calling thread ([`RxQueue::arm_interrupt`]): true
/// when one came (a packet arrived), false on timeout.
pub fn wait_for_rx(timeout_ms: u32) -> bool {
    const EVENTS: i32 = 8;
    let mut events = [sys::rte_epoll_event::default(); EVENTS as usize];
    // SAFETY: the calling thread's epoll instance; `events` has room for
    // the count given. EAL acknowledges each interrupt before returning.
    let n = unsafe {
        sys::rte_epoll_wait(
            sys::RTE_EPOLL_PER_THREAD,
            events.as_mut_ptr(),
            EVENTS,
            i32::try_from(timeout_ms).unwrap_or(i32::MAX),
        )
    };
    n > 0
}

/// A transmit queue, used by one thread.
pub struct TxQueue {
    port: Arc<PortInner>,
    queue: QueueId,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl fmt::Debug for TxQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TxQueue({}/{})", self.port.id, self.queue)
    }
}

impl TxQueue {
    /// The port.
    pub fn port(&self) -> PortId {
        self.port.id
    }

    /// The queue number.
    pub fn queue(&self) -> QueueId {
        self.queue
    }

    /// Sends the burst and empties it; mbufs the device did not take are
    /// freed in bulk. Returns how many were sent.
    #[inline]
    pub fn tx_burst(&mut self, burst: &mut Burst<Mbuf>) -> usize {
        let len = burst.len();
        if len == 0 {
            return 0;
        }
        // SAFETY: the first `len` slots are owned mbuf pointers; the device
        // takes ownership of the first `sent`; the rest are freed in bulk
        // below; set_len(0) then forgets all of them without a second free.
        // This thread is the only user of the queue (TxQueue is !Sync).
        unsafe {
            let ptrs = burst.as_mut_ptr().cast::<*mut sys::rte_mbuf>();
            let sent = usize::from(sys::sluice_tx_burst(self.port.id.0, self.queue.0, ptrs, burst_u16(len)));
            if sent < len {
                sys::rte_pktmbuf_free_bulk(ptrs.add(sent), burst_u32(len - sent));
            }
            burst.set_len(0);
            sent
        }
    }
}
