//! Real kernel interfaces behind `net_af_packet`: promiscuous mode is
//! set back to what it was when the port closes, and
//! the MTU set before start reaches the interface. Ends with a clean
//! `Eal::shutdown`.
//!
//! One test: it owns this process's EAL, on its own thread, and the veth
//! pair (without addresses) must exist before the EAL starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sluice_ffi::{Eal, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};

#[test]
fn af_packet_port_restores_promiscuous_mode_and_sets_the_mtu() {
    let veth = common::Veth::new("sfp");
    assert!(!common::promiscuous(&veth.a), "a new veth is not promiscuous");
    assert_eq!(common::link_state(&veth.a).1, 1500);
    // The other end was made promiscuous by someone else before Sluice.
    let st = std::process::Command::new("ip").args(["link", "set", &veth.b, "promisc", "on"]).status().unwrap();
    assert!(st.success());
    assert!(common::promiscuous(&veth.b));

    let prefix = common::file_prefix("afp");
    let vdevs = [
        format!("--vdev=net_af_packet0,iface={}", veth.a),
        format!("--vdev=net_af_packet1,iface={}", veth.b),
        format!("--vdev=net_af_packet2,iface={}", veth.b),
    ];
    let eal = Eal::init(&common::eal_args(&prefix, 128, "0", &vdevs)).unwrap();
    let runtime = common::runtime_dir(&prefix);
    let mp_socket = runtime.join("mp_socket");
    assert!(mp_socket.exists());

    let pool = Mempool::new(&eal, "afp", 2047, 0, DEFAULT_DATA_ROOM).unwrap();
    let id = sluice_ffi::port_by_name(&eal, "net_af_packet0").unwrap();
    let cfg = PortConfig { rx_desc: 128, tx_desc: 128, promiscuous: true, mtu: Some(1400), ..PortConfig::default() };
    let port = Port::start(&eal, id, &cfg, &pool).unwrap();
    assert_eq!(port.info().driver, "net_af_packet");
    assert!(common::promiscuous(&veth.a), "Port::start turned promiscuous mode on");
    assert_eq!(port.mtu().unwrap(), 1400);
    assert_eq!(common::link_state(&veth.a).1, 1400, "the PMD set the kernel interface's MTU");

    let reader = port.stats_reader();
    drop(port);
    assert!(common::promiscuous(&veth.a), "a statistics reader keeps the device open and as it was");
    drop(reader);
    assert!(!common::promiscuous(&veth.a), "promiscuous mode is off again once the port is closed");

    let id = sluice_ffi::port_by_name(&eal, "net_af_packet1").unwrap();
    let other = Port::start(&eal, id, &PortConfig { mtu: None, ..cfg }, &pool).unwrap();
    assert!(common::promiscuous(&veth.b));
    drop(other);
    assert!(common::promiscuous(&veth.b), "promiscuous mode that was on before the port started stays on");

    // DPDK's start turns the kernel's flag off when the port is not to be
    // promiscuous; closing the port puts it back.
    let id = sluice_ffi::port_by_name(&eal, "net_af_packet2").unwrap();
    let plain = Port::start(&eal, id, &PortConfig { mtu: None, promiscuous: false, ..cfg }, &pool).unwrap();
    assert!(!common::promiscuous(&veth.b));
    drop(plain);
    assert!(common::promiscuous(&veth.b), "promiscuous mode is as it was before the port started");

    drop(pool);
    assert!(eal.holders().is_empty(), "{}", eal.holders());
    eal.shutdown().unwrap();
    assert!(!mp_socket.exists(), "rte_eal_cleanup ran");
    let _ = std::fs::remove_dir_all(runtime);
}
