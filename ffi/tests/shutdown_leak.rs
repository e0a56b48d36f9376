//! A mempool dropped while one of its mbufs is out is leaked with its hold
//! on the EAL: `rte_eal_cleanup` never runs under the live mbuf, which can
//! still be used and freed safely.
//!
//! One test: shutting the EAL down ends it for the process.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use sluice_ffi::{Eal, Error, Holders, Mempool, Ring, DEFAULT_DATA_ROOM};

#[test]
fn a_leaked_pool_keeps_the_eal_up_under_its_mbufs() {
    let prefix = common::file_prefix("down-leak");
    let eal = Eal::init(&common::eal_args(&prefix, 128, "0", &[])).unwrap();
    let runtime = common::runtime_dir(&prefix);
    let mp_socket = runtime.join("mp_socket");
    assert!(mp_socket.exists());

    let pool = Mempool::new(&eal, "leak", 63, 0, DEFAULT_DATA_ROOM).unwrap();
    let mut m = pool.alloc().unwrap();
    let ring = Ring::new(&eal, "leak_r", 64).unwrap();
    drop(pool);
    assert_eq!(eal.holders(), Holders { pools: 0, leaked_pools: 1, ports: 0, rings: 1, tasks: 0 });
    drop(ring);

    let e = eal.shutdown().unwrap_err();
    assert!(matches!(e, Error::EalInUse { holders } if holders.leaked_pools == 1), "{e:?}");
    assert!(e.to_string().contains("1 leaked mempool"), "{e}");
    assert!(mp_socket.exists(), "no cleanup under a live mbuf");

    // The mbuf's memory is still there.
    m.append(4).unwrap().copy_from_slice(b"live");
    assert_eq!(m.data(), b"live");
    drop(m);
    assert!(mp_socket.exists(), "a leaked pool keeps the EAL for the rest of the process");
    let _ = std::fs::remove_dir_all(runtime);
}
