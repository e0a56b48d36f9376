//! Property tests of the parser: crafted frames parse back to what was
//! put in them, and damaged frames yield a verdict, never a panic.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::cast_possible_truncation)]

use proptest::prelude::*;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::craft;
use sluice_dataplane::parse::{ethertype, parse, proto, v4, Fragment, Frame};

#[derive(Debug, Clone)]
struct Spec {
    vlans: Vec<u16>,
    v6: bool,
    src: [u8; 16],
    dst: [u8; 16],
    protocol: u8,
    sport: u16,
    dport: u16,
    ttl: u8,
    payload: Vec<u8>,
    /// IPv4 fragment: (id, first?) — a first fragment or a later one.
    frag: Option<(u16, bool)>,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        proptest::collection::vec(0u16..4096, 0..=2),
        any::<bool>(),
        any::<[u8; 16]>(),
        any::<[u8; 16]>(),
        prop_oneof![Just(proto::TCP), Just(proto::UDP), Just(proto::SCTP), Just(47u8)],
        any::<u16>(),
        any::<u16>(),
        1u8..=255,
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::option::of((any::<u16>(), any::<bool>())),
    )
        .prop_map(|(vlans, v6, src, dst, protocol, sport, dport, ttl, payload, frag)| Spec {
            vlans,
            v6,
            src,
            dst,
            protocol,
            sport,
            dport,
            ttl,
            payload,
            frag: if v6 { None } else { frag },
        })
}

fn l4(s: &Spec) -> Vec<u8> {
    match s.protocol {
        proto::TCP => craft::tcp(s.sport, s.dport, 0x18, &s.payload),
        proto::UDP => craft::udp(s.sport, s.dport, &s.payload),
        proto::SCTP => craft::sctp(s.sport, s.dport, &s.payload),
        _ => s.payload.clone(),
    }
}

fn frame(s: &Spec) -> Vec<u8> {
    let l4 = l4(s);
    if s.v6 {
        let mut ip = craft::ipv6(s.src, s.dst, s.protocol, &l4);
        ip[7] = s.ttl;
        craft::ether(&s.vlans, ethertype::IPV6, &ip)
    } else {
        let (src, dst) = (s.src[..4].try_into().unwrap(), s.dst[..4].try_into().unwrap());
        let (id, fragf, body) = match s.frag {
            Some((id, true)) => (id, v4::MF, l4.clone()),
            Some((id, false)) => (id, 3, l4.clone()),
            None => (0, 0, l4.clone()),
        };
        craft::ether(&s.vlans, ethertype::IPV4, &craft::ipv4_full(src, dst, s.protocol, s.ttl, id, fragf, &[], &body))
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn crafted_frames_parse_back(s in spec()) {
        let f = frame(&s);
        let Ok(Frame::Ip(p)) = parse(&f) else { panic!("{s:?} did not parse: {:?}", parse(&f)) };
        let (src, dst) = if s.v6 {
            (Addr::v6(s.src), Addr::v6(s.dst))
        } else {
            (Addr::v4(s.src[..4].try_into().unwrap()), Addr::v4(s.dst[..4].try_into().unwrap()))
        };
        prop_assert_eq!((p.flow.src, p.flow.dst, p.flow.proto, p.v6, p.ttl), (src, dst, s.protocol, s.v6, s.ttl));
        prop_assert_eq!(usize::from(p.vlans), s.vlans.len());
        prop_assert_eq!(&p.vlan_ids[..s.vlans.len()], &s.vlans[..]);
        prop_assert_eq!(usize::from(p.ip_end), f.len());
        let later = matches!(s.frag, Some((_, false)));
        let ports = !later && matches!(s.protocol, proto::TCP | proto::UDP | proto::SCTP);
        prop_assert_eq!(p.has_ports, ports);
        if ports {
            prop_assert_eq!((p.flow.sport, p.flow.dport), (s.sport, s.dport));
        }
        match s.frag {
            Some((id, first)) => {
                prop_assert_eq!(p.frag, if first { Fragment::First } else { Fragment::Later });
                prop_assert_eq!(p.frag_id, u32::from(id));
            }
            None => prop_assert_eq!(p.frag, Fragment::No),
        }
    }

    #[test]
    fn damaged_frames_never_panic(s in spec(), cut in any::<prop::sample::Index>(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4)) {
        let mut f = frame(&s);
        for (at, x) in flips {
            let i = at.index(f.len());
            f[i] ^= x;
        }
        let n = cut.index(f.len() + 1);
        let _ = parse(&f[..n]);
        let _ = parse(&f);
    }
}
