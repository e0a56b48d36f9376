//! Any bytes through the whole pipeline of a small appliance (IPv4 and
//! IPv6 VIPs, L2 and IP-in-IP endpoints, a random service with a flow
//! table): a verdict for every frame, no panic, and a forwarded frame
//! still parses.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::{PortRange, RouteMatch, RouteSpec};
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::io::PacketBuf;
use sluice_dataplane::memio::MemBuf;
use sluice_dataplane::parse::{parse, proto};
use sluice_dataplane::pipeline::{Pipeline, PipelineConfig};
use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};
use sluice_dataplane::verdict::Verdict;

fn snapshot() -> Snapshot {
    let ep = |id: u16, delivery| EndpointSpec {
        id,
        incarnation: 1,
        weight: 1,
        draining: id == 2,
        addr: Addr::v4([10, 0, 0, id as u8]),
        port: 1,
        mac: [2, 0, 0, 0, 9, id as u8],
        delivery,
        counter: u32::from(id),
    };
    let svc = |key, algorithm, delivery| {
        Arc::new(
            Service::build(&ServiceSpec {
                name: format!("s{key}"),
                key,
                algorithm,
                flow_table: true,
                limit: 8,
                table_size: 0,
                endpoints: (0..3).map(|i| ep(i, delivery)).collect(),
            })
            .unwrap(),
        )
    };
    let route = |name: &str, service, vip: &str, protocols: Vec<u8>| RouteSpec {
        name: name.into(),
        priority: 1,
        service,
        matches: RouteMatch {
            vips: vec![vip.parse().unwrap()],
            dst_ports: vec![PortRange { lo: 0, hi: 1024 }],
            protocols,
            ..RouteMatch::default()
        }.into(),
    };
    Snapshot::new(
        1,
        &[
            route("v4", 0, "20.0.0.1", vec![proto::TCP, proto::UDP, proto::SCTP]),
            route("v6", 1, "2001:db8::1", vec![]),
        ],
        vec![
            svc(0, Algorithm::Maglev, Delivery::L2),
            svc(1, Algorithm::Random, Delivery::IpIp { src: "fd00::1".parse().unwrap() }),
        ],
        vec![PortInfo { mac: [2, 0, 0, 0, 1, 0], mtu: 1500, vlan: 0 }, PortInfo { mac: [2, 0, 0, 0, 1, 1], mtu: 1500, vlan: 0 }],
        Some(NextHop { port: 0, mac: [2, 0, 0, 0, 0xf, 0xf] }),
        Some(NextHop { port: 0, mac: [2, 0, 0, 0, 0xf, 0xf] }),
    )
}

static SNAP: OnceLock<Snapshot> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let snap = SNAP.get_or_init(snapshot);
    let ctr = WorkerCounters::new(2, 8);
    let mut pl = Pipeline::new(&PipelineConfig { flow_entries: 64, frag_entries: 64, ..Default::default() }, 1);
    // The first byte picks the input port; every frame claims to be for us.
    let Some((&port, rest)) = data.split_first() else { return };
    let port = port % 2;
    let mut frame = rest.to_vec();
    if frame.len() >= 6 {
        frame[..6].copy_from_slice(&snap.ports[usize::from(port)].mac);
    }
    let mut b = MemBuf::new(&frame);
    if let Verdict::Forward(o) = pl.process(snap, port, &mut b, 1, &ctr) {
        assert!(usize::from(o) < snap.ports.len());
        assert!(parse(b.data()).is_ok(), "a forwarded frame parses");
    }
});
