//! Synthetic appliances for benchmarks: many VIPs, routes and services,
//! and bursts of frames that hit them; and ([`report`]) the README's
//! performance section and charts, generated from the results files.
#![forbid(unsafe_code)]

use std::sync::Arc;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::{PortRange, RouteMatch, RouteSpec};
use sluice_dataplane::craft;
use sluice_dataplane::hash::hash_u64;
use sluice_dataplane::maglev::EndpointId;
use sluice_dataplane::parse::{ethertype, proto};
use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};

/// MAC of the receiving port.
pub const FRONT_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 0];
/// MAC of the port towards endpoints.
pub const BACK_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 1];

/// Address of VIP number `i`.
pub fn vip(i: u32) -> [u8; 4] {
    let b = i.to_be_bytes();
    [20, b[1], b[2], b[3]]
}

/// A service of `n` L2 endpoints, identifiers below `limit`.
pub fn service(key: u32, n: u16, limit: u32, algorithm: Algorithm) -> Service {
    service_with(key, n, limit, algorithm, false)
}

/// [`service`], keeping per-flow state in the worker's flow table when
/// `flow_table`.
#[allow(clippy::cast_possible_truncation)] // synthetic addresses
pub fn service_with(key: u32, n: u16, limit: u32, algorithm: Algorithm, flow_table: bool) -> Service {
    let eps = (0..n)
        .map(|i| EndpointSpec {
            id: i,
            incarnation: 1,
            weight: 1,
            draining: false,
            addr: Addr::v4([10, (key >> 8) as u8, key as u8, i as u8]),
            port: 1,
            mac: [0x02, 0xee, (key >> 8) as u8, key as u8, 0, i as u8],
            delivery: Delivery::L2,
            counter: key * u32::from(n) + u32::from(i),
        })
        .collect();
    let spec = ServiceSpec {
        name: format!("svc-{key}"),
        key,
        algorithm,
        flow_table,
        limit,
        table_size: 0,
        endpoints: eps,
    };
    Service::build(&spec).unwrap_or_else(|e| panic!("service {key}: {e}"))
}

/// A route set: `routes` routes over `routes / ports_per_vip` VIPs, each
/// VIP with TCP routes on `ports_per_vip` ports, spread over `services`
/// services of `endpoints` endpoints each.
#[derive(Debug)]
pub struct Appliance {
    /// The snapshot.
    pub snapshot: Snapshot,
    /// (VIP, port) of every route.
    pub targets: Vec<([u8; 4], u16)>,
}

/// Builds an [`Appliance`] of Maglev services without flow state.
pub fn appliance(routes: u32, ports_per_vip: u32, services: u32, endpoints: u16) -> Appliance {
    appliance_with(routes, ports_per_vip, services, endpoints, Algorithm::Maglev, false)
}

/// Builds an [`Appliance`] whose services use `algorithm`, with per-flow
/// state when `flow_table`.
#[allow(clippy::cast_possible_truncation)] // synthetic ports
pub fn appliance_with(routes: u32, ports_per_vip: u32, services: u32, endpoints: u16, algorithm: Algorithm, flow_table: bool) -> Appliance {
    let svcs: Vec<Arc<Service>> =
        (0..services).map(|k| Arc::new(service_with(k, endpoints, 32, algorithm, flow_table))).collect();
    let mut specs = Vec::new();
    let mut targets = Vec::new();
    for r in 0..routes {
        let v = vip(r / ports_per_vip);
        let port = 1000 + (r % ports_per_vip) as u16 * 7;
        specs.push(RouteSpec {
            name: format!("route-{r:05}"),
            priority: (r % 3) as i32,
            service: r % services,
            matches: RouteMatch {
                vips: vec![Addr::v4(v)],
                src_cidrs: vec!["0.0.0.0/0".parse().unwrap_or_else(|_| unreachable!())],
                src_ports: vec![PortRange::ANY],
                dst_ports: vec![PortRange::single(port)],
                protocols: vec![proto::TCP],
                byte_matches: vec![],
            }.into(),
        });
        targets.push((v, port));
    }
    let snapshot = Snapshot::new(
        1,
        &specs,
        svcs,
        vec![PortInfo { mac: FRONT_MAC, mtu: 1500, vlan: 0 }, PortInfo { mac: BACK_MAC, mtu: 1500, vlan: 0 }],
        Some(NextHop { port: 0, mac: [2, 0, 0, 0, 0xf, 0xf] }),
        None,
    );
    Appliance { snapshot, targets }
}

/// `n` TCP frames (ACKs: established flows) from varied clients to random
/// route targets.
pub fn frames(a: &Appliance, n: usize, seed: u64) -> Vec<Vec<u8>> {
    frames_with_flags(a, n, seed, 0x10)
}

/// [`frames`] with TCP flags `flags` (0x02: SYNs, new connections).
#[allow(clippy::cast_possible_truncation)] // synthetic addresses and ports
pub fn frames_with_flags(a: &Appliance, n: usize, seed: u64, flags: u8) -> Vec<Vec<u8>> {
    (0..n as u64)
        .map(|i| {
            let h = hash_u64(i, seed);
            let (v, port) = a.targets[(h % a.targets.len() as u64) as usize];
            let client = [198, 51, (h >> 8) as u8, (h >> 16) as u8];
            let tcp = craft::tcp(1024 + (h >> 24) as u16 % 60000, port, flags, &[0; 6]);
            let ip = craft::with_l4_checksum(craft::ipv4(client, v, proto::TCP, &tcp), 20);
            craft::ether_with(FRONT_MAC, [2, 0xcc, 0, 0, 0, 1], &[], ethertype::IPV4, &ip)
        })
        .collect()
}

/// `n` return frames (ACKs from the VIP: replies of established flows),
/// each from the endpoint of its service that the route's first service
/// has at index `h % endpoints`, on the back port, to varied clients.
#[allow(clippy::cast_possible_truncation)] // synthetic addresses and ports
pub fn return_frames(a: &Appliance, n: usize, seed: u64, endpoints: u16) -> Vec<Vec<u8>> {
    (0..n as u64)
        .map(|i| {
            let h = hash_u64(i, seed);
            let (v, port) = a.targets[0];
            let client = [198, 51, (h >> 8) as u8, (h >> 16) as u8];
            let tcp = craft::tcp(port, 1024 + (h >> 24) as u16 % 60000, 0x10, &[0; 6]);
            let ip = craft::with_l4_checksum(craft::ipv4(v, client, proto::TCP, &tcp), 20);
            let mac = [0x02, 0xee, 0, 0, 0, (h % u64::from(endpoints.max(1))) as u8];
            craft::ether_with(BACK_MAC, mac, &[], ethertype::IPV4, &ip)
        })
        .collect()
}

/// Identifier list 0..n with weight 1.
pub fn uniform(n: u16) -> Vec<(EndpointId, u32)> {
    (0..n).map(|i| (i, 1)).collect()
}

/// The textbook Maglev population (Eisenbud et al., NSDI 2016, pseudocode
/// 1), unweighted, for comparison with Sluice's: endpoints take turns, each
/// walking its permutation `offset + j * skip mod m` (kept incrementally,
/// no modulo per probe) to its next *free* entry. `m` must be a prime.
/// Returns the identifier of each entry.
#[allow(clippy::cast_possible_truncation)] // reductions modulo m < 2^32
pub fn textbook_maglev(m: u32, endpoints: &[EndpointId]) -> Vec<EndpointId> {
    const EMPTY: EndpointId = EndpointId::MAX;
    let mut ids = endpoints.to_vec();
    ids.sort_unstable();
    let mut walk: Vec<(u32, u32)> = ids
        .iter()
        .map(|&id| {
            let offset = (hash_u64(u64::from(id), 0x6f66_6673_6574) % u64::from(m)) as u32;
            let skip = (hash_u64(u64::from(id), 0x736b_6970) % u64::from(m - 1)) as u32 + 1;
            (offset, skip)
        })
        .collect();
    let mut entry = vec![EMPTY; m as usize];
    if ids.is_empty() {
        return entry;
    }
    let mut filled = 0u32;
    'fill: loop {
        for (k, &id) in ids.iter().enumerate() {
            let (pos, skip) = &mut walk[k];
            while entry[*pos as usize] != EMPTY {
                *pos += *skip;
                if *pos >= m {
                    *pos -= m;
                }
            }
            entry[*pos as usize] = id;
            filled += 1;
            if filled == m {
                break 'fill;
            }
        }
    }
    entry
}

pub mod report;
