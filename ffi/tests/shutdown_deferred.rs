//! `Eal::shutdown` refuses while anything holds the EAL and names it; the
//! EAL is then cleaned up when the last holder, a ring here, is dropped.
//!
//! One test: shutting the EAL down ends it for the process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sluice_ffi::{Eal, Error, Holders, Mempool, Port, PortConfig, Ring, DEFAULT_DATA_ROOM};

#[test]
fn shutdown_refuses_while_held_and_the_last_holder_cleans_up() {
    let prefix = common::file_prefix("down-defer");
    let eal = Eal::init(&common::eal_args(&prefix, 128, "0,1", &["--vdev=net_null0".to_owned()])).unwrap();
    let runtime = common::runtime_dir(&prefix);
    let mp_socket = runtime.join("mp_socket");
    assert!(mp_socket.exists());

    let pool = Mempool::new(&eal, "defer", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let ring = Ring::new(&eal, "defer_r", 64).unwrap();
    let id = sluice_ffi::port_by_name(&eal, "net_null0").unwrap();
    let port = Port::start(&eal, id, &PortConfig { rx_desc: 64, tx_desc: 64, ..PortConfig::default() }, &pool).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let task = eal
        .launch(eal.worker_lcores()[0], Arc::clone(&stop), |stop| {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            0
        })
        .unwrap();

    let e = eal.shutdown().unwrap_err();
    let expected = Holders { pools: 1, leaked_pools: 0, ports: 1, rings: 1, tasks: 1 };
    assert!(matches!(e, Error::EalInUse { holders } if holders == expected), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("1 mempool, 1 open port, 1 ring, 1 launched task"), "{msg}");
    assert!(mp_socket.exists(), "a refused shutdown does not clean up");

    // Holders outlive the Eal handle and still work.
    drop(task);
    assert!(stop.load(Ordering::SeqCst), "dropping the task stopped it");
    assert!(port.stats().is_ok());
    drop(port);
    let m = pool.alloc().unwrap();
    drop(m);
    drop(pool);
    assert!(mp_socket.exists(), "the ring still holds the EAL");
    assert_eq!(ring.count(), 0);
    drop(ring);
    assert!(!mp_socket.exists(), "the last holder cleaned the EAL up");
    assert!(!runtime.exists(), "the last holder removed the runtime directory {}", runtime.display());
}
