//! What happens to a packet: sent out of an output, handed to the kernel
//! (exception path), held back (an early IP fragment), or dropped for a
//! named reason. Every drop is counted under its reason.

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DropReason {
    /// Shorter than an Ethernet header.
    EthTruncated,
    /// Longer than 65535 bytes.
    FrameTooLong,
    /// Unicast to another MAC than the port's (seen in promiscuous mode).
    NotOurMac,
    /// More than two VLAN tags.
    VlanTooDeep,
    /// IPv4 header cut short by the end of the frame.
    Ipv4Truncated,
    /// IPv4 ethertype but the version field is not 4.
    Ipv4BadVersion,
    /// IPv4 header length below 20 bytes.
    Ipv4BadHeaderLength,
    /// IPv4 total length smaller than the header, or larger than the frame.
    Ipv4BadTotalLength,
    /// IPv4 header checksum does not verify.
    Ipv4BadChecksum,
    /// IPv6 header cut short by the end of the frame.
    Ipv6Truncated,
    /// IPv6 ethertype but the version field is not 6.
    Ipv6BadVersion,
    /// IPv6 payload length larger than the frame.
    Ipv6BadPayloadLength,
    /// IPv6 jumbogram (payload length 0 with a hop-by-hop jumbo option): unsupported.
    Ipv6Jumbo,
    /// IPv6 extension header chain truncated or longer than 8 headers.
    Ipv6BadExtensionHeader,
    /// TCP, UDP, SCTP or ICMP header shorter than its minimum.
    L4Truncated,
    /// TCP data offset below 5 words or beyond the segment.
    TcpBadDataOffset,
    /// UDP length field smaller than 8 or larger than the datagram.
    UdpBadLength,
    /// ICMP error whose embedded packet is too short to identify the flow.
    IcmpErrorTruncated,
    /// TTL or hop limit would reach zero.
    TtlExpired,
    /// Addressed to a VIP, but no route matches.
    NoRoute,
    /// The route's service has no endpoint that can take the flow.
    NoEndpoint,
    /// A later IP fragment arrived first and the hold-back area was full.
    FragmentStashFull,
    /// A held-back IP fragment whose first fragment never came.
    FragmentTimeout,
    /// Not enough headroom in the buffer to add the encapsulation header.
    EncapNoHeadroom,
    /// The encapsulated packet would exceed the output's MTU.
    EncapTooBig,
    /// Return traffic from a VIP, but no gateway next hop is configured.
    NoGateway,
    /// The output queue was full.
    TxQueueFull,
    /// Meant for the kernel, but the port has no exception path.
    NoExceptionPath,
    /// Sent to an output the worker does not have (a configuration error).
    NoSuchOutput,
    /// Source is a VIP, but the frame did not come from an endpoint of a
    /// service that VIP routes to (wrong input port or source MAC).
    ReturnNotFromEndpoint,
    /// IPv6 with an IPv4-mapped address (`::ffff:0:0/96`) as source or
    /// destination, or in the packet an ICMPv6 error embeds.
    Ipv6MappedAddress,
    /// Too big to encapsulate, and the ICMP error that would say so is over
    /// the worker's rate limit.
    IcmpRateLimited,
    /// The queue to the worker that owns the flow was full (or there is no
    /// such worker).
    SteerQueueFull,
    /// Still in a steering queue when the workers stopped.
    SteeredAtShutdown,
    /// IPv6 Hop-by-Hop Options header after another extension header
    /// (RFC 8200 4.1 allows it only right after the IPv6 header).
    Ipv6HopByHopNotFirst,
    /// IPv4 without DF too big for its tunnel once encapsulated: the
    /// appliance does not fragment, and no ICMP error is due (docs/ports.md:
    /// "Tunnels and the MTU").
    EncapTooBigNoDf,
    /// 802.1Q/802.1ad-tagged frame on a port that serves no VLAN, or a
    /// frame not of the port's VLAN (untagged, another VLAN, or stacked tags).
    VlanNotServed,
    /// IPv4 without DF larger than its output's MTU, and no packet buffer
    /// for one of its fragments (the datagram is dropped whole).
    FragmentNoBuffer,
    /// Larger than its output's MTU and not to be fragmented (DF set, or
    /// IPv6), and the ICMP error that would say so may not be sent (about
    /// an ICMP error, a later fragment, or a source that cannot take one).
    TooBigForOutput,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 39] = [
        DropReason::EthTruncated,
        DropReason::FrameTooLong,
        DropReason::NotOurMac,
        DropReason::VlanTooDeep,
        DropReason::Ipv4Truncated,
        DropReason::Ipv4BadVersion,
        DropReason::Ipv4BadHeaderLength,
        DropReason::Ipv4BadTotalLength,
        DropReason::Ipv4BadChecksum,
        DropReason::Ipv6Truncated,
        DropReason::Ipv6BadVersion,
        DropReason::Ipv6BadPayloadLength,
        DropReason::Ipv6Jumbo,
        DropReason::Ipv6BadExtensionHeader,
        DropReason::L4Truncated,
        DropReason::TcpBadDataOffset,
        DropReason::UdpBadLength,
        DropReason::IcmpErrorTruncated,
        DropReason::TtlExpired,
        DropReason::NoRoute,
        DropReason::NoEndpoint,
        DropReason::FragmentStashFull,
        DropReason::FragmentTimeout,
        DropReason::EncapNoHeadroom,
        DropReason::EncapTooBig,
        DropReason::NoGateway,
        DropReason::TxQueueFull,
        DropReason::NoExceptionPath,
        DropReason::NoSuchOutput,
        DropReason::ReturnNotFromEndpoint,
        DropReason::Ipv6MappedAddress,
        DropReason::IcmpRateLimited,
        DropReason::SteerQueueFull,
        DropReason::SteeredAtShutdown,
        DropReason::Ipv6HopByHopNotFirst,
        DropReason::EncapTooBigNoDf,
        DropReason::VlanNotServed,
        DropReason::FragmentNoBuffer,
        DropReason::TooBigForOutput,
    ];

    /// Number of reasons.
    pub const COUNT: usize = Self::ALL.len();

    /// Counter index.
    #[inline(always)]
    pub fn index(self) -> usize {
        self as usize
    }

    /// Snake-case name, as used in metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::EthTruncated => "eth_truncated",
            DropReason::FrameTooLong => "frame_too_long",
            DropReason::NotOurMac => "not_our_mac",
            DropReason::VlanTooDeep => "vlan_too_deep",
            DropReason::Ipv4Truncated => "ipv4_truncated",
            DropReason::Ipv4BadVersion => "ipv4_bad_version",
            DropReason::Ipv4BadHeaderLength => "ipv4_bad_header_length",
            DropReason::Ipv4BadTotalLength => "ipv4_bad_total_length",
            DropReason::Ipv4BadChecksum => "ipv4_bad_checksum",
            DropReason::Ipv6Truncated => "ipv6_truncated",
            DropReason::Ipv6BadVersion => "ipv6_bad_version",
            DropReason::Ipv6BadPayloadLength => "ipv6_bad_payload_length",
            DropReason::Ipv6Jumbo => "ipv6_jumbo",
            DropReason::Ipv6BadExtensionHeader => "ipv6_bad_extension_header",
            DropReason::L4Truncated => "l4_truncated",
            DropReason::TcpBadDataOffset => "tcp_bad_data_offset",
            DropReason::UdpBadLength => "udp_bad_length",
            DropReason::IcmpErrorTruncated => "icmp_error_truncated",
            DropReason::TtlExpired => "ttl_expired",
            DropReason::NoRoute => "no_route",
            DropReason::NoEndpoint => "no_endpoint",
            DropReason::FragmentStashFull => "fragment_stash_full",
            DropReason::FragmentTimeout => "fragment_timeout",
            DropReason::EncapNoHeadroom => "encap_no_headroom",
            DropReason::EncapTooBig => "encap_too_big",
            DropReason::NoGateway => "no_gateway",
            DropReason::TxQueueFull => "tx_queue_full",
            DropReason::NoExceptionPath => "no_exception_path",
            DropReason::NoSuchOutput => "no_such_output",
            DropReason::ReturnNotFromEndpoint => "return_not_from_endpoint",
            DropReason::Ipv6MappedAddress => "ipv6_mapped_address",
            DropReason::IcmpRateLimited => "icmp_rate_limited",
            DropReason::SteerQueueFull => "steer_queue_full",
            DropReason::SteeredAtShutdown => "steered_at_shutdown",
            DropReason::Ipv6HopByHopNotFirst => "ipv6_hop_by_hop_not_first",
            DropReason::EncapTooBigNoDf => "encap_too_big_no_df",
            DropReason::VlanNotServed => "vlan_not_served",
            DropReason::FragmentNoBuffer => "fragment_no_buffer",
            DropReason::TooBigForOutput => "too_big_for_output",
        }
    }
}

/// What the pipeline decided for one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Rewritten in place; send it out of this output port.
    Forward(u8),
    /// Not load-balancer traffic: hand it to the kernel through the
    /// exception path of the port it came in on.
    Exception,
    /// A later IP fragment whose first fragment has not been seen: hold it.
    Stash,
    /// Another worker owns the packet's flow (or datagram): hand it over
    /// to the worker of this index.
    Steer(u16),
    /// Drop it, counting the reason.
    Drop(DropReason),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indexes_follow_the_table() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{r:?}");
        }
        let mut names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT, "names are unique");
    }
}
