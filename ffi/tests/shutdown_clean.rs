//! `Eal::shutdown` succeeds once every mempool, port, ring and task is gone,
//! and the EAL counts each kind of holder while it lives.
//!
//! One test: shutting the EAL down ends it for the process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use sluice_ffi::{ring_port, Eal, Holders, Mempool, Port, PortConfig, Ring, DEFAULT_DATA_ROOM};

#[test]
fn shutdown_cleans_up_once_every_holder_is_gone() {
    let prefix = common::file_prefix("down-clean");
    let eal = Eal::init(&common::eal_args(&prefix, 128, "0,1", &["--vdev=net_null0".to_owned()])).unwrap();
    let runtime = common::runtime_dir(&prefix);
    let mp_socket = runtime.join("mp_socket");
    assert!(mp_socket.exists());
    assert!(eal.holders().is_empty());

    let pool = Mempool::new(&eal, "clean", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let ring = Ring::new(&eal, "clean_r", 64).unwrap();
    let id = sluice_ffi::port_by_name(&eal, "net_null0").unwrap();
    let cfg = PortConfig { rx_desc: 64, tx_desc: 64, ..PortConfig::default() };
    let mut port = Port::start(&eal, id, &cfg, &pool).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let worker = eal.worker_lcores()[0];
    let task = eal
        .launch(worker, Arc::clone(&stop), |stop| {
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
            7
        })
        .unwrap();
    assert_eq!(eal.holders(), Holders { pools: 1, leaked_pools: 0, ports: 1, rings: 1, tasks: 1 });

    stop.store(true, Ordering::SeqCst);
    assert_eq!(task.wait().unwrap(), 7);
    assert_eq!(eal.holders().tasks, 0);

    let queue = port.take_rx_queue(0).unwrap();
    let reader = port.stats_reader();
    drop(port);
    assert_eq!(eal.holders().ports, 1, "the queue and the reader keep the port open");
    drop(queue);
    assert_eq!(eal.holders().ports, 1);
    drop(reader);
    assert_eq!(eal.holders().ports, 0);

    // A ring port started and closed, its rings dropped by the caller first.
    let (rx, tx) = (Ring::new(&eal, "clean_rx", 64).unwrap(), Ring::new(&eal, "clean_tx", 64).unwrap());
    let rid = ring_port(&eal, "clean_ring", &[rx], &[tx]).unwrap();
    assert_eq!(eal.holders().rings, 1);
    let rport = Port::start(&eal, rid, &cfg, &pool).unwrap();
    drop(rport);

    let m = pool.alloc().unwrap();
    drop(m);
    drop(ring);
    drop(pool);
    assert!(eal.holders().is_empty(), "{}", eal.holders());
    assert!(mp_socket.exists(), "nothing cleaned the EAL up yet");
    eal.shutdown().unwrap();
    assert!(!mp_socket.exists(), "rte_eal_cleanup ran");
    assert!(!runtime.exists(), "the shutdown removed the runtime directory {}", runtime.display());
}
