//! A small appliance for pipeline tests: two ports (front to clients and
//! gateway, back to endpoints), IPv4 and IPv6 VIPs, L2 and IP-in-IP
//! endpoints.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::{PortRange, RouteMatch, RouteSpec};
use sluice_dataplane::parse::proto;
use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};

pub const FRONT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x00];
pub const BACK_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x01];
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0f, 0x0f];
pub const CLIENT: [u8; 4] = [198, 51, 100, 7];
pub const VIP: [u8; 4] = [20, 0, 0, 1];
pub const VIP6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0];
pub const CLIENT6: [u8; 16] = [0x20, 1, 0x0d, 0xb8, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];
pub const APPLIANCE6: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
pub const APPLIANCE4: [u8; 4] = [192, 168, 1, 1];

/// MAC of endpoint `id` of service `svc` in generation `generation`.
pub fn ep_mac(svc: u8, id: u16, generation: u16) -> [u8; 6] {
    let g = generation.to_be_bytes();
    let i = id.to_be_bytes();
    [0x02, 0xee, svc, g[1], i[0], i[1]]
}

pub fn endpoint(svc: u8, id: u16, generation: u16, delivery: Delivery) -> EndpointSpec {
    EndpointSpec {
        id,
        incarnation: 1,
        weight: 1,
        draining: false,
        addr: if matches!(delivery, Delivery::IpIp { src } if !src.is_v4()) {
            let mut a = APPLIANCE6;
            a[15] = 0x10 + u8::try_from(id).unwrap();
            Addr::v6(a)
        } else {
            Addr::v4([192, 168, 1, 10 + u8::try_from(id).unwrap()])
        },
        port: 1,
        mac: ep_mac(svc, id, generation),
        delivery,
        counter: u32::from(svc) * 100 + u32::from(id),
    }
}

pub fn service(name: &str, key: u32, algorithm: Algorithm, flow_table: bool, eps: Vec<EndpointSpec>) -> Arc<Service> {
    Arc::new(
        Service::build(&ServiceSpec {
            name: name.into(),
            key,
            algorithm,
            flow_table,
            limit: 32,
            table_size: 0,
            endpoints: eps,
        })
        .unwrap(),
    )
}

pub fn route(name: &str, service: u32, vip: Addr, dport: Option<u16>, protocols: &[u8]) -> RouteSpec {
    RouteSpec {
        name: name.into(),
        priority: 10,
        service,
        matches: RouteMatch {
            vips: vec![vip],
            dst_ports: dport.map(|p| vec![PortRange::single(p)]).unwrap_or_default(),
            protocols: protocols.to_vec(),
            ..RouteMatch::default()
        }.into(),
    }
}

/// Services: 0 "web" (maglev, 3 L2 endpoints), 1 "dns" (random), 2 "web6"
/// (IPv6-in-IPv6), 3 "empty", 4 "sticky" (maglev + flow table), 5 "tunnel4"
/// (IPv4-in-IPv4, TCP and UDP port 8443).
pub fn appliance(generation: u64) -> Snapshot {
    let g = u16::try_from(generation % 256).unwrap();
    let l2 = |s: u8, n: u16| (0..n).map(|i| endpoint(s, i, g, Delivery::L2)).collect::<Vec<_>>();
    let ipip6 = (0..2).map(|i| endpoint(2, i, g, Delivery::IpIp { src: Addr::v6(APPLIANCE6) })).collect();
    let services = vec![
        service("web", 0, Algorithm::Maglev, false, l2(0, 3)),
        service("dns", 1, Algorithm::Random, true, l2(1, 4)),
        service("web6", 2, Algorithm::Maglev, false, ipip6),
        service("empty", 3, Algorithm::Maglev, false, vec![]),
        service("sticky", 4, Algorithm::Maglev, true, l2(4, 3)),
        service("tunnel4", 5, Algorithm::Maglev, false, (0..2).map(|i| endpoint(5, i, g, Delivery::IpIp { src: Addr::v4(APPLIANCE4) })).collect()),
    ];
    let routes = vec![
        route("web", 0, Addr::v4(VIP), Some(80), &[proto::TCP]),
        route("dns", 1, Addr::v4(VIP), Some(53), &[proto::UDP]),
        route("web6", 2, Addr::v6(VIP6), Some(443), &[proto::TCP]),
        route("empty", 3, Addr::v4(VIP), Some(9), &[proto::TCP]),
        route("sticky", 4, Addr::v4(VIP), Some(8080), &[proto::TCP]),
        route("tunnel4", 5, Addr::v4(VIP), Some(8443), &[proto::TCP, proto::UDP]),
    ];
    Snapshot::new(
        generation,
        &routes,
        services,
        vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 0 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 0 }],
        Some(NextHop { port: 0, mac: GW_MAC }),
        None,
    )
    .with_own(std::sync::Arc::from([Addr::v4(APPLIANCE4), Addr::v6(APPLIANCE6)]))
}
