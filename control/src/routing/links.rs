//! Kernel interfaces by name: configuring the exception path's interface
//! (MAC, MTU, up, exactly the given addresses) and reading an interface's
//! counters.
//!
//! [`configure_interface`] is idempotent: it reads the link first and only
//! changes what differs, so a second call with the same arguments takes the
//! link neither down nor up. The interface belongs to Sluice: addresses on
//! it that were not asked for are removed, except IPv6 link-local ones
//! (the kernel's own, needed by ND and link-local BGP sessions).
//!
//! Duplicate address detection is off for the interface's IPv6 addresses,
//! the link-local one included (`accept_dad=0`): they are the appliance's
//! own, and while the link-local address is tentative the kernel sends no
//! neighbour solicitation at all, so IPv6 next hops would stay unresolved
//! for the first seconds after the link comes up.
//!
//! The interface's transmit queue holds every probe the kernel sends for
//! as many next hops as the appliance may have ([`exception_queue_len`]).
//! The kernel resolves every next hop it is given at once, and probes each
//! unresolved one again every second, three times in all, before it
//! fails it and starts over: with the default 1,000, 100,000 next hops
//! make it drop most of its ARP requests before DPDK reads them, and
//! resolution takes minutes. With room for one probe per next hop, runs
//! in which the answers came late enough for the kernel to probe again
//! (165,942 and 200,994 probes for 100,000 next hops) lost 1 and 12,240.
//!
//! The queue is the tap's own ring, one per queue DPDK reads: the interface
//! gets no queueing discipline (`noqueue`) before its queue grows. A DPDK
//! tap has 256 transmit queues, and the default discipline keeps three
//! rings of the queue's length for each, allocated and cleared when the
//! length changes, all under the kernel's routing lock (rtnl, one for the
//! whole host): 400 MB per interface for 65,536 next hops, while every
//! routing daemon on the host, BIRD and its BFD sessions included, waits. The tap's ring costs a pointer per slot up front and
//! memory for frames only while they wait in it.

use std::collections::HashSet;
use std::net::IpAddr;

use futures_util::{StreamExt, TryStreamExt};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST};
use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage};
use rtnetlink::packet_core::DefaultNla;
use rtnetlink::packet_route::link::{AfSpecInet, AfSpecUnspec, LinkAttribute, LinkFlags, LinkMessage, Stats64};
use rtnetlink::packet_route::tc::{TcAttribute, TcHandle, TcMessage};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr};
use rtnetlink::{Handle, LinkUnspec};

use super::{errno, RoutingError};

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn mac_str(m: &[u8; 6]) -> String {
    format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
}

/// An interface's kernel counters (rtnetlink `IFLA_STATS64`), totals since
/// the interface was created. Drivers that do not count a kind leave it 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Received frames dropped by the kernel (no buffer, unknown protocol...).
    pub(crate) rx_dropped: u64,
    /// Bad frames received.
    pub(crate) rx_errors: u64,
    /// Frames the device missed (receive ring full).
    pub(crate) rx_missed_errors: u64,
    /// Receive ring overflows.
    pub(crate) rx_over_errors: u64,
    /// Frames sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Frames dropped on transmit.
    pub(crate) tx_dropped: u64,
    /// Transmit errors.
    pub(crate) tx_errors: u64,
}

impl From<&Stats64> for LinkCounters {
    fn from(s: &Stats64) -> LinkCounters {
        LinkCounters {
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
            rx_dropped: s.rx_dropped,
            rx_errors: s.rx_errors,
            rx_missed_errors: s.rx_missed_errors,
            rx_over_errors: s.rx_over_errors,
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            tx_dropped: s.tx_dropped,
            tx_errors: s.tx_errors,
        }
    }
}

/// The kernel's description of interface `name`.
pub(crate) async fn get_link(h: &Handle, name: &str) -> Result<LinkMessage, RoutingError> {
    let mut answers = h.link().get().match_name(name).execute();
    match answers.try_next().await {
        Ok(Some(link)) => Ok(link),
        Ok(None) => Err(RoutingError::NoInterface { iface: name.to_owned() }),
        // ENODEV: no such interface.
        Err(e) if errno(&e) == Some(libc::ENODEV) => Err(RoutingError::NoInterface { iface: name.to_owned() }),
        Err(e) => Err(RoutingError::netlink(name, "reading the link", e)),
    }
}

/// Reads interface `name`'s kernel counters.
pub async fn link_counters(h: &Handle, name: &str) -> Result<LinkCounters, RoutingError> {
    let link = get_link(h, name).await?;
    counters_of(&link).ok_or_else(|| RoutingError::NoStats { iface: name.to_owned() })
}

/// The counters in a link message, if it carries them.
pub(crate) fn counters_of(link: &LinkMessage) -> Option<LinkCounters> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Stats64(s) => Some(LinkCounters::from(s)),
        _ => None,
    })
}

/// Turns off duplicate address detection on interface `name` (procfs, in
/// the calling thread's network namespace; a plain write, not a tokio
/// blocking task, which could run in another namespace). Without IPv6 on
/// the interface there is nothing to do. Where `/proc/sys` cannot be
/// written (a container without `privileged`) this is warned about and
/// left: the addresses Sluice gives the interface skip detection anyway
/// (`nodad`), only the kernel's link-local one is tentative for its first
/// second or two.
fn no_dad(name: &str) -> Result<(), RoutingError> {
    // Dots in interface names are slashes in sysctl paths (eth0.100).
    let path = format!("/proc/sys/net/ipv6/conf/{}/accept_dad", name.replace('.', "/"));
    write_sysctl(name, path, "0", "IPv6 next hops on it resolve only once its link-local address has passed duplicate address detection, a second or two after the link comes up")
}

/// Writes `value` to the sysctl at `path` (of interface `name`). A sysctl
/// that does not exist (the interface has no IPv6) is nothing to do. Where
/// `/proc/sys` is read-only or not ours (a container without `privileged`,
/// a user namespace) the write is warned about with `otherwise`, what the
/// kernel then does, and the appliance goes on: it must start there.
fn write_sysctl(name: &str, path: String, value: &str, otherwise: &str) -> Result<(), RoutingError> {
    match std::fs::write(&path, value) {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::ReadOnlyFilesystem | std::io::ErrorKind::PermissionDenied) => {
            tracing::warn!(
                interface = name,
                path,
                value,
                error = %e,
                "cannot write this sysctl here (/proc/sys is read-only in a container without privileged): {otherwise}; set it before Sluice starts (in Kubernetes, the tuning CNI plugin of the interface's attachment sets an interface's sysctls)"
            );
            Ok(())
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(RoutingError::Sysctl { iface: name.to_owned(), path, source: e }),
        _ => Ok(()),
    }
}

/// `IFLA_INET_CONF`: IPv4's per-interface settings in `IFLA_AF_SPEC`.
const IFLA_INET_CONF: u16 = 1;
/// `IPV4_DEVCONF_FORWARDING`, `net.ipv4.conf.<if>.forwarding`.
const IPV4_DEVCONF_FORWARDING: u16 = 1;
/// `IPV4_DEVCONF_RP_FILTER`, `net.ipv4.conf.<if>.rp_filter`.
const IPV4_DEVCONF_RP_FILTER: u16 = 8;
/// What an interface DPDK reads from keeps of IPv4: forwarding off, strict
/// reverse-path filtering.
const LEFT_TO_DPDK: [(u16, u32); 2] = [(IPV4_DEVCONF_FORWARDING, 0), (IPV4_DEVCONF_RP_FILTER, 1)];

/// Sets IPv4 settings of interface `name`, each an `IPV4_DEVCONF_*` number
/// and its value, through netlink (`RTM_SETLINK` with `IFLA_AF_SPEC` →
/// `AF_INET` → `IFLA_INET_CONF`), which changes what
/// `/proc/sys/net/ipv4/conf/<name>/` shows and needs only `CAP_NET_ADMIN`
/// in the namespace: a container without `privileged` has `/proc/sys`
/// read-only. A blocking socket opened in the calling thread's namespace.
fn set_ipv4_conf(name: &str, what: &str, settings: &[(u16, u32)]) -> Result<(), RoutingError> {
    // The nested settings: a 4-byte attribute header (length 8, type) and
    // the value each, in the host's byte order.
    let mut conf = Vec::with_capacity(settings.len() * 8);
    for &(kind, value) in settings {
        conf.extend_from_slice(&8u16.to_ne_bytes());
        conf.extend_from_slice(&kind.to_ne_bytes());
        conf.extend_from_slice(&value.to_ne_bytes());
    }
    // By name: the kernel looks the interface up when the index is 0.
    let mut link = LinkMessage::default();
    link.attributes.push(LinkAttribute::IfName(name.to_owned()));
    link.attributes.push(LinkAttribute::AfSpecUnspec(vec![AfSpecUnspec::Inet(vec![AfSpecInet::Other(DefaultNla::new(
        IFLA_INET_CONF,
        conf,
    ))])]));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::SetLink(link));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK;
    req.header.sequence_number = 1;
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    let io = |source| RoutingError::Io { iface: name.to_owned(), op: what.to_owned(), source };
    let mut socket = Socket::new(NETLINK_ROUTE).map_err(io)?;
    socket.bind_auto().map_err(io)?;
    socket.connect(&SocketAddr::new(0, 0)).map_err(io)?;
    socket.send(&buf, 0).map_err(io)?;
    let (answer, _) = socket.recv_from_full().map_err(io)?;
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&answer) {
        Ok(NetlinkMessage { payload: NetlinkPayload::Error(e), .. }) if e.code.is_none() => Ok(()),
        // No such interface: nothing to set (DPDK's port on it says so).
        Ok(NetlinkMessage { payload: NetlinkPayload::Error(e), .. }) if e.code.is_some_and(|c| c.get() == -libc::ENODEV) => Ok(()),
        Ok(NetlinkMessage { payload: NetlinkPayload::Error(e), .. }) => {
            Err(RoutingError::netlink(name, what, rtnetlink::Error::NetlinkError(e)))
        }
        other => Err(RoutingError::Unexpected { iface: name.to_owned(), op: what.to_owned(), what: format!("{other:?}") }),
    }
}

/// Makes the kernel leave interface `name` to DPDK: a `net_af_packet` or
/// `net_af_xdp` port only copies (or takes) frames, and a kernel that also
/// handled them would answer them itself.
///
/// - IPv4 forwarding goes off on the interface. A host that forwards
///   (every Kubernetes node, and the pods' namespaces inherit it) routed
///   each SYN to a VIP, found no route and sent the client "net
///   unreachable" through the exception interface, before the backend's
///   SYN-ACK: connections failed. With forwarding off on the interface the
///   kernel drops what is not its own without a word.
/// - Strict reverse-path filtering: the kernel takes a packet to any of its
///   addresses on any interface, so a SYN-ACK to the exception interface's
///   address, seen here before it comes through the tap, found no socket
///   (BIRD binds its sessions to the tap) and was answered with a reset:
///   the appliance's own IPv4 connections (BGP) were reset at once. Strict
///   filtering drops everything that arrives here for the kernel, since
///   nothing is routed through this interface; it only holds while
///   `conf/all/rp_filter` is not 2 (the kernel applies the larger of the
///   two), which is warned about.
/// - IPv6 goes off on the interface (IPv6 sends "unreachable" for what it
///   cannot route, even with forwarding off).
///
/// The IPv4 settings are set through netlink, which works where
/// `/proc/sys` is read-only (a container without `privileged`); IPv6 has no
/// such way, and is left on with a warning there. In the calling thread's
/// namespace.
pub fn leave_to_dpdk(name: &str) -> Result<(), RoutingError> {
    set_ipv4_conf(
        name,
        "turning IPv4 forwarding off and reverse-path filtering to strict",
        &LEFT_TO_DPDK,
    )?;
    // Dots in interface names are slashes in sysctl paths (eth0.100).
    let path = format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", name.replace('.', "/"));
    write_sysctl(name, path, "1", "the kernel also handles the IPv6 frames DPDK reads on this interface and answers what it cannot route with \"unreachable\"")?;
    if std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter").is_ok_and(|v| v.trim() == "2") {
        tracing::warn!(
            interface = name,
            "net.ipv4.conf.all.rp_filter is 2 (loose), which overrides the strict filter set on this interface: the kernel answers IPv4 packets that DPDK reads here (it resets the appliance's own BGP connections); set net.ipv4.conf.all.rp_filter to 0 or 1"
        );
    }
    Ok(())
}

/// Whether interface `name` still has the IPv4 settings [`leave_to_dpdk`]
/// gave it (forwarding off, strict reverse-path filtering), setting them
/// again where not; true when it had to. Writing `net.ipv4.ip_forward` or
/// `conf.all.forwarding` sets every interface's forwarding: a container
/// runtime starting on the host does, and the kernel then answers the VIPs'
/// traffic again. Reads procfs and writes through netlink, in the calling
/// thread's namespace.
pub fn keep_left_to_dpdk(name: &str) -> Result<bool, RoutingError> {
    let dir = name.replace('.', "/");
    let read = |key: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{dir}/{key}")).ok().and_then(|v| v.trim().parse::<u32>().ok())
    };
    if read("forwarding").is_none_or(|v| v == 0) && read("rp_filter").is_none_or(|v| v == 1) {
        return Ok(false);
    }
    set_ipv4_conf(
        name,
        "turning IPv4 forwarding off and reverse-path filtering to strict again",
        &LEFT_TO_DPDK,
    )?;
    Ok(true)
}

/// The kernel's default transmit queue of a tap interface, in frames.
const QUEUE_DEFAULT: u32 = 1000;
/// Room in the exception interface's transmit queue beside the next hops'
/// probes: the kernel's own traffic (BGP, BFD, ICMP) sent meanwhile.
const QUEUE_HEADROOM: u32 = 1024;
/// The largest transmit queue asked for (8 MiB of slots per queue).
const QUEUE_MAX: u32 = 1 << 20;
/// Probes the kernel sends for a next hop before it fails it, a second
/// apart: `mcast_solicit`, 3 by default (the appliance leaves it alone).
const PROBES: u32 = 3;

/// The transmit queue, in frames, that an exception interface needs for
/// `next_hops` next hops resolving at once: every probe of each (the
/// kernel may send them all before DPDK reads the first), plus headroom.
pub fn exception_queue_len(next_hops: u32) -> u32 {
    next_hops.saturating_mul(PROBES).saturating_add(QUEUE_HEADROOM).clamp(QUEUE_DEFAULT, QUEUE_MAX)
}

/// The link's MAC, MTU, transmit queue length and whether it is
/// administratively up.
fn link_state(link: &LinkMessage) -> (Option<&[u8]>, Option<u32>, Option<u32>, bool) {
    let mut mac = None;
    let mut mtu = None;
    let mut qlen = None;
    for a in &link.attributes {
        match a {
            LinkAttribute::Address(m) => mac = Some(m.as_slice()),
            LinkAttribute::Mtu(m) => mtu = Some(*m),
            LinkAttribute::TxQueueLen(q) => qlen = Some(*q),
            _ => {}
        }
    }
    (mac, mtu, qlen, link.header.flags.contains(LinkFlags::Up))
}

/// The local address and prefix of an address message.
fn address_of(m: &AddressMessage) -> Option<(IpAddr, u8)> {
    // IPv4 keeps the interface's own address in IFA_LOCAL (IFA_ADDRESS is
    // the peer on point-to-point links); IPv6 only sends IFA_ADDRESS.
    let local = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let addr = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    local.or(addr).map(|ip| (ip, m.header.prefix_len))
}

fn is_v6_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
}

/// Which of `existing` to delete so that the interface carries `wanted`
/// (IPv6 link-local addresses are kept).
pub(crate) fn stale_addresses(existing: &[(IpAddr, u8)], wanted: &[(IpAddr, u8)]) -> Vec<(IpAddr, u8)> {
    let want: HashSet<&(IpAddr, u8)> = wanted.iter().collect();
    existing.iter().filter(|a| !want.contains(a) && !is_v6_link_local(a.0)).copied().collect()
}

/// Takes exception interface `name` down when the appliance stops. The
/// kernel then drops every neighbour entry of the interface in that one
/// request (the managed ones Sluice asked for included, however many) and
/// stops probing them, and the frames waiting in its transmit queue. An
/// interface that is gone already is no failure.
pub async fn take_down(h: &Handle, name: &str) -> Result<(), RoutingError> {
    let link = match get_link(h, name).await {
        Ok(link) => link,
        Err(RoutingError::NoInterface { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let msg = LinkUnspec::new_with_index(link.header.index).down().build();
    match h.link().set(msg).execute().await {
        Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(()),
        r => r.map_err(|e| RoutingError::netlink(name, "taking the link down", e)),
    }
}

/// Makes `noqueue` the root queueing discipline of interface `index`: its
/// frames go straight to the device (for a tap, to the ring DPDK reads).
async fn no_queueing_discipline(h: &Handle, index: u32) -> Result<(), rtnetlink::Error> {
    let index = i32::try_from(index).map_err(|_| rtnetlink::Error::InvalidNla(format!("interface index {index}")))?;
    let mut msg = TcMessage::with_index(index);
    msg.header.parent = TcHandle::ROOT;
    msg.attributes.push(TcAttribute::Kind("noqueue".into()));
    let mut req = NetlinkMessage::from(RouteNetlinkMessage::NewQueueDiscipline(msg));
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE;
    let mut answers = h.clone().request(req)?;
    while let Some(answer) = answers.next().await {
        if let NetlinkPayload::Error(e) = answer.payload {
            if e.code.is_some() {
                return Err(rtnetlink::Error::NetlinkError(e));
            }
        }
    }
    Ok(())
}

/// Gives kernel interface `name` the port's MAC and MTU and a transmit
/// queue of at least `queue` frames, brings it up, and makes `addrs` its
/// addresses (IPv6 ones without duplicate address detection: the port's
/// addresses are the appliance's own). The link is taken down only to
/// change its MAC.
pub async fn configure_interface(
    h: &Handle,
    name: &str,
    mac: [u8; 6],
    mtu: u16,
    queue: u32,
    addrs: &[(IpAddr, u8)],
) -> Result<(), RoutingError> {
    for &(addr, prefix) in addrs {
        let width = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > width {
            return Err(RoutingError::BadPrefix { iface: name.to_owned(), addr, prefix });
        }
    }
    let link = get_link(h, name).await?;
    no_dad(name)?;
    let index = link.header.index;
    let (cur_mac, cur_mtu, cur_queue, up) = link_state(&link);
    let set = |msg: LinkMessage, op: String| async move {
        h.link().set(msg).execute().await.map_err(|e| RoutingError::netlink(name, op, e))
    };
    let mac_changes = cur_mac != Some(&mac[..]);
    if mac_changes {
        if up {
            set(LinkUnspec::new_with_index(index).down().build(), "taking the link down".into()).await?;
        }
        let msg = LinkUnspec::new_with_index(index).address(mac.to_vec()).mtu(u32::from(mtu)).build();
        set(msg, format!("setting MAC {} and MTU {mtu}", mac_str(&mac))).await?;
    } else if cur_mtu != Some(u32::from(mtu)) {
        set(LinkUnspec::new_with_index(index).mtu(u32::from(mtu)).build(), format!("setting MTU {mtu}")).await?;
    }
    if cur_queue.is_none_or(|q| q < queue) {
        no_queueing_discipline(h, index).await.map_err(|e| RoutingError::netlink(name, "removing its queueing discipline", e))?;
        set(LinkUnspec::new_with_index(index).txqueuelen(queue).build(), format!("setting the transmit queue to {queue} frames"))
            .await?;
    }
    if mac_changes || !up {
        set(LinkUnspec::new_with_index(index).up().build(), "bringing the link up".into()).await?;
    }

    let existing: Vec<AddressMessage> = h
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(|e| RoutingError::netlink(name, "listing addresses", e))?;
    let present: Vec<(IpAddr, u8)> = existing.iter().filter_map(address_of).collect();
    // Delete before adding: removing a primary IPv4 address can take the
    // secondaries of its subnet with it.
    for stale in stale_addresses(&present, addrs) {
        let Some(msg) = existing.iter().find(|m| address_of(m) == Some(stale)) else { continue };
        match h.address().del(msg.clone()).execute().await {
            // EADDRNOTAVAIL: already gone with its primary.
            Err(e) if errno(&e) != Some(libc::EADDRNOTAVAIL) => {
                return Err(RoutingError::netlink(name, format!("removing address {}/{}", stale.0, stale.1), e));
            }
            _ => {}
        }
    }
    for &(addr, prefix) in addrs {
        let mut req = h.address().add(index, addr, prefix).replace();
        if addr.is_ipv6() {
            let m = req.message_mut();
            m.header.flags |= AddressHeaderFlags::Nodad;
            m.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        req.execute().await.map_err(|e| RoutingError::netlink(name, format!("setting address {addr}/{prefix}"), e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::address::AddressHeader;
    use rtnetlink::packet_route::AddressFamily;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_exception_queue_holds_every_probe_of_every_next_hop() {
        assert_eq!(exception_queue_len(0), 1024);
        assert_eq!(exception_queue_len(65_536), 197_632);
        assert_eq!(exception_queue_len(100_000), 301_024);
        assert_eq!(exception_queue_len(349_184), 1 << 20);
        assert_eq!(exception_queue_len(4_194_304), 1 << 20);
        assert_eq!(exception_queue_len(u32::MAX), 1 << 20);
    }

    #[test]
    fn mac_is_lower_case_colon_separated() {
        assert_eq!(mac_str(&[0x02, 0, 0xab, 0x0c, 0xde, 0xff]), "02:00:ab:0c:de:ff");
    }

    #[test]
    fn stale_addresses_keep_wanted_and_v6_link_local() {
        let existing = [(ip("10.0.0.1"), 24), (ip("10.0.0.9"), 24), (ip("fe80::1"), 64), (ip("2001:db8::1"), 64)];
        let wanted = [(ip("10.0.0.1"), 24), (ip("2001:db8::1"), 64), (ip("2001:db8::2"), 64)];
        assert_eq!(stale_addresses(&existing, &wanted), vec![(ip("10.0.0.9"), 24)]);
    }

    #[test]
    fn same_address_with_another_prefix_is_stale() {
        let existing = [(ip("10.0.0.1"), 16)];
        assert_eq!(stale_addresses(&existing, &[(ip("10.0.0.1"), 24)]), vec![(ip("10.0.0.1"), 16)]);
        assert!(stale_addresses(&existing, &[(ip("10.0.0.1"), 16)]).is_empty());
    }

    #[test]
    fn ipv4_address_is_the_local_one() {
        let mut m = AddressMessage::default();
        m.header = AddressHeader { family: AddressFamily::Inet, prefix_len: 32, ..m.header };
        m.attributes.push(AddressAttribute::Address(ip("192.0.2.2")));
        m.attributes.push(AddressAttribute::Local(ip("192.0.2.1")));
        assert_eq!(address_of(&m), Some((ip("192.0.2.1"), 32)));
        let mut v6 = AddressMessage::default();
        v6.header.prefix_len = 64;
        v6.attributes.push(AddressAttribute::Address(ip("2001:db8::5")));
        assert_eq!(address_of(&v6), Some((ip("2001:db8::5"), 64)));
    }

    #[test]
    fn counters_come_from_stats64() {
        let mut link = LinkMessage::default();
        assert_eq!(counters_of(&link), None);
        let mut s = Stats64::default();
        (s.rx_packets, s.rx_bytes, s.rx_missed_errors, s.tx_packets, s.tx_dropped) = (7, 700, 3, 5, 1);
        link.attributes.push(LinkAttribute::Stats64(s));
        let c = counters_of(&link).unwrap();
        assert_eq!((c.rx_packets, c.rx_bytes, c.rx_missed_errors, c.tx_packets, c.tx_dropped), (7, 700, 3, 5, 1));
    }
}
