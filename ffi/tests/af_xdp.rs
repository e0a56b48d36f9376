//! `net_af_xdp` on a veth without hugepages: every frame the port takes
//! leaves the interface. The PMD registers the pool with the kernel as one
//! area of `mbufs x mbuf size` bytes from its first mbuf; a pool laid out
//! page by page (`Mempool::new` under `--no-huge`: 2.4 KiB mbufs 4 KiB
//! apart) has mbufs beyond that area, and the kernel dropped every frame
//! sent from one of them without a count anywhere (the appliance's next-hop
//! ARP requests among them: 8 s to resolve a backend). `Mempool::packed`
//! is the pool the appliance makes without hugepages.
//!
//! One test: it owns this process's EAL, and the veth pair (without
//! addresses) must exist before the EAL starts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sluice_dataplane::io::{Burst, BURST};
use sluice_ffi::{Eal, Mbuf, Mempool, Port, PortConfig, DEFAULT_DATA_ROOM};

/// Frames the kernel counted as received on `ifname`.
fn rx_packets(ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/rx_packets")).unwrap().trim().parse().unwrap()
}

/// A 60-byte broadcast frame of the local experimental ethertype.
fn frame(m: &mut Mbuf, n: u32) {
    let d = m.append(60).expect("room for 60 bytes");
    d.fill(0);
    d[..6].copy_from_slice(&[0xff; 6]);
    d[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    d[12..14].copy_from_slice(&[0x88, 0xb5]);
    d[14..18].copy_from_slice(&n.to_be_bytes());
}

#[test]
fn every_frame_an_af_xdp_port_takes_leaves_the_veth() {
    let _watchdog = common::Watchdog::new(60, "af_xdp frames");
    let veth = common::Veth::new("sfx");
    let prefix = common::file_prefix("afx");
    let eal = Eal::init(&common::eal_args(&prefix, 128, "0", &[format!("--vdev=net_af_xdp0,iface={}", veth.a)])).unwrap();
    let runtime = common::runtime_dir(&prefix);

    // The PMD fills its receive ring with 1,024 of them at start.
    const MBUFS: u32 = 4095;
    let pool = Mempool::packed(&eal, "afx", MBUFS, 0, DEFAULT_DATA_ROOM).unwrap();
    let id = sluice_ffi::port_by_name(&eal, "net_af_xdp0").unwrap();
    let cfg = PortConfig { rx_desc: 1024, tx_desc: 1024, promiscuous: false, mtu: None, ..PortConfig::default() };
    let mut port = Port::start(&eal, id, &cfg, &pool).unwrap();
    assert_eq!(port.info().driver, "net_af_xdp");
    let mut tx = port.take_tx_queue(0).unwrap();

    // Twice as many frames as the pool has mbufs, in bursts: every mbuf
    // of the pool is sent from at least once.
    let before = rx_packets(&veth.b);
    let (mut offered, mut sent) = (0u32, 0u64);
    let mut burst: Burst<Mbuf> = Burst::new();
    while offered < 2 * MBUFS {
        let n = pool.alloc_bulk(&mut burst, BURST);
        assert_eq!(n, BURST, "the pool has mbufs to spare (sent ones come back)");
        for m in burst.iter_mut() {
            frame(m, offered);
            offered += 1;
        }
        sent += tx.tx_burst(&mut burst) as u64;
    }
    assert!(sent >= u64::from(MBUFS), "the port took most frames ({sent} of {offered})");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while rx_packets(&veth.b) - before < sent && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let received = rx_packets(&veth.b) - before;
    assert!(received >= sent, "the port took {sent} frames and {received} reached the other end of the veth");

    // No EAL shutdown: the PMD keeps the mbufs of its fill ring when the
    // port closes, so the pool (and the EAL with it) stays until the
    // process ends (Mempool's drop says so).
    drop(tx);
    drop(port);
    drop(eal);
    let _ = std::fs::remove_dir_all(runtime);
}
