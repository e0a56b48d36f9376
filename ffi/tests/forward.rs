//! Forwarding through the safe API on virtual devices: counts match, every
//! mbuf is accounted for while in flight and back in its pool afterwards;
//! port ownership, statistics readers and MTU fallback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_dataplane::io::{Burst, PacketBuf};
use sluice_ffi::{ring_port, Eal, Error, Mbuf, Mempool, Port, PortConfig, Ring, DEFAULT_DATA_ROOM};

fn eal_args() -> Vec<String> {
    let vdevs = ["net_null0", "net_null1", "net_null2", "net_null3", "net_null9"].map(|d| format!("--vdev={d}"));
    common::eal_args(&common::file_prefix("fwd"), 256, "0", &vdevs)
}

/// Runs `f` on this process's main lcore. Tests are serialised there.
fn on_main<R: Send + 'static>(f: impl FnOnce(&Eal) -> R + Send + 'static) -> R {
    common::on_main(eal_args, f)
}

fn small() -> PortConfig {
    PortConfig { rx_desc: 256, tx_desc: 256, ..PortConfig::default() }
}

#[test]
fn null_pair_forwards_and_returns_every_mbuf() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_null", 4095, 0, DEFAULT_DATA_ROOM).unwrap();
        let start = pool.available();
        assert_eq!(start, pool.capacity());
        {
            let p0 = sluice_ffi::port_by_name(eal, "net_null0").unwrap();
            let p1 = sluice_ffi::port_by_name(eal, "net_null1").unwrap();
            let mut a = Port::start(eal, p0, &small(), &pool).unwrap();
            let mut b = Port::start(eal, p1, &small(), &pool).unwrap();
            assert_eq!(a.info().driver, "net_null");
            assert!(a.link().unwrap().up);
            let (mut arx, mut atx) = (a.take_rx_queue(0).unwrap(), a.take_tx_queue(0).unwrap());
            let (mut brx, mut btx) = (b.take_rx_queue(0).unwrap(), b.take_tx_queue(0).unwrap());
            assert!(a.take_rx_queue(0).is_none(), "a queue is handed out once");

            // net_null allocates on receive and frees on transmit, and the
            // pool has no per-lcore cache: the pool's in-use count is
            // exactly what the burst holds, at every step.
            let mut burst = Burst::new();
            let (mut ab, mut ba, mut sent) = (0u64, 0u64, 0u64);
            for _ in 0..2000 {
                ab += arx.rx_burst(&mut burst) as u64;
                assert_eq!(pool.in_use() as usize, burst.len());
                sent += btx.tx_burst(&mut burst) as u64;
                assert_eq!(pool.in_use(), 0);
                ba += brx.rx_burst(&mut burst) as u64;
                assert_eq!(pool.in_use() as usize, burst.len());
                sent += atx.tx_burst(&mut burst) as u64;
                assert_eq!(pool.available(), start);
            }
            assert!(ab > 0 && ba > 0);
            assert_eq!(ab + ba, sent, "net_null accepts every packet");
            let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
            assert_eq!(sa.ipackets, ab);
            assert_eq!(sb.opackets, ab);
            assert_eq!(sb.ipackets, ba);
            assert_eq!(sa.opackets, ba);
            assert!(!a.xstats().unwrap().is_empty());
        }
        assert_eq!(pool.available(), start, "every mbuf is back in the pool");
        assert_eq!(pool.in_use(), 0);
    });
}

#[test]
fn ring_ports_carry_exact_frames() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_ring", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
        let start = pool.available();
        let rings: Vec<Arc<Ring>> = (0..4).map(|i| Ring::new(eal, &format!("fwd_r{i}"), 1024).unwrap()).collect();
        // Every mbuf out of the pool is in a ring or a burst (ring ports
        // hold none of their own).
        let in_rings = |rings: &[Arc<Ring>]| rings.iter().map(|r| r.count() as usize).sum::<usize>();
        {
            let pa = ring_port(eal, "ring_a", &rings[0..1], &rings[1..2]).unwrap();
            let pb = ring_port(eal, "ring_b", &rings[2..3], &rings[3..4]).unwrap();
            let mut a = Port::start(eal, pa, &small(), &pool).unwrap();
            let mut b = Port::start(eal, pb, &small(), &pool).unwrap();
            let mut arx = a.take_rx_queue(0).unwrap();
            let mut btx = b.take_tx_queue(0).unwrap();

            const N: u32 = 500;
            let mut burst = Burst::new();
            let mut injected = 0;
            while injected < N {
                while !burst.is_full() && injected < N {
                    let mut m = pool.alloc().expect("pool has room");
                    let d = m.append(64).unwrap();
                    d.fill(0);
                    d[..4].copy_from_slice(&injected.to_be_bytes());
                    burst.push(m);
                    injected += 1;
                }
                let n = burst.len();
                assert_eq!(rings[0].enqueue(&mut burst), n, "the ring has room");
                assert!(burst.is_empty());
            }
            assert_eq!(rings[0].count(), N);
            assert_eq!(pool.in_use(), N);
            let mut seen = Vec::new();
            let mut out = Burst::new();
            for _ in 0..100 {
                arx.rx_burst(&mut burst);
                assert_eq!(pool.in_use() as usize, in_rings(&rings) + burst.len());
                for m in burst.iter_mut() {
                    m.data_mut()[4] = 0xab;
                }
                btx.tx_burst(&mut burst);
                assert_eq!(pool.in_use() as usize, in_rings(&rings));
                while rings[3].dequeue(&mut out) > 0 {
                    for m in out.iter() {
                        let d = PacketBuf::data(m);
                        assert_eq!(d.len(), 64);
                        assert_eq!(d[4], 0xab);
                        seen.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
                    }
                    assert_eq!(pool.in_use() as usize, in_rings(&rings) + out.len());
                    sluice_ffi::free_burst(&mut out);
                }
            }
            assert_eq!(seen, (0..N).collect::<Vec<_>>(), "every frame, in order, once");
            assert_eq!(b.stats().unwrap().opackets, u64::from(N));
            assert_eq!(in_rings(&rings), 0);
        }
        assert_eq!(pool.available(), start, "every mbuf is back in the pool");
    });
}

#[test]
fn a_ring_port_keeps_its_rings_after_the_caller_drops_them() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_keep", 255, 0, DEFAULT_DATA_ROOM).unwrap();
        let (rx, tx) = (Ring::new(eal, "keep_rx", 64).unwrap(), Ring::new(eal, "keep_tx", 64).unwrap());
        let id = ring_port(eal, "ring_keep", &[Arc::clone(&rx)], &[Arc::clone(&tx)]).unwrap();
        let mut port = Port::start(eal, id, &small(), &pool).unwrap();
        let mut burst = Burst::new();
        for _ in 0..8 {
            burst.push(pool.alloc().unwrap());
        }
        assert_eq!(rx.enqueue(&mut burst), 8);
        assert_eq!(eal.holders().rings, 2);
        drop((rx, tx));
        assert_eq!(eal.holders().rings, 0, "the port's rings are not counted as the caller's");
        // The port still receives from the ring the caller let go of.
        let mut q = port.take_rx_queue(0).unwrap();
        assert_eq!(q.rx_burst(&mut burst), 8);
        sluice_ffi::free_burst(&mut burst);
        let mut out = port.take_tx_queue(0).unwrap();
        burst.push(pool.alloc().unwrap());
        assert_eq!(out.tx_burst(&mut burst), 1);
        assert_eq!(pool.in_use(), 1, "one mbuf waits in the transmit ring");
        drop((q, out, port));
        assert_eq!(pool.in_use(), 0, "closing the port freed its rings with the mbuf in them");
    });
}

#[test]
fn prepend_and_adj_move_the_frame_start() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_adj", 63, 0, DEFAULT_DATA_ROOM).unwrap();
        {
            let mut m = pool.alloc().unwrap();
            m.append(10).unwrap().copy_from_slice(b"0123456789");
            let head = m.headroom();
            assert!(PacketBuf::prepend(&mut m, 4));
            PacketBuf::data_mut(&mut m)[..4].copy_from_slice(b"abcd");
            assert_eq!(m.data(), b"abcd0123456789");
            assert_eq!(m.pkt_len(), 14);
            assert!(!PacketBuf::prepend(&mut m, head));
            assert!(PacketBuf::adj(&mut m, 6));
            assert_eq!(m.data(), b"23456789");
            assert!(!PacketBuf::adj(&mut m, 9));
            assert_eq!(pool.in_use(), 1);
        }
        assert_eq!(pool.in_use(), 0);
    });
}

#[test]
fn raw_mbufs_are_as_their_last_user_left_them_until_reset_to_a_frame() {
    on_main(|eal| {
        // One mbuf, no cache: the one freed is the one allocated next.
        let pool = Mempool::new(eal, "fwd_raw", 1, 0, DEFAULT_DATA_ROOM).unwrap();
        {
            let mut m = pool.alloc().unwrap();
            m.append(100).unwrap();
            assert!(PacketBuf::adj(&mut m, 30));
        }
        let mut burst: Burst<Mbuf> = Burst::new();
        assert_eq!(pool.alloc_raw_bulk(&mut burst, 2), 0, "all or none");
        assert_eq!(pool.alloc_raw_bulk(&mut burst, 1), 1);
        let m = &mut burst[0];
        assert_eq!((m.headroom(), m.len()), (128 + 30, 70), "not reset");
        let room = usize::from(DEFAULT_DATA_ROOM) - 128;
        assert!(!m.reset_to(room + 1));
        assert_eq!((m.headroom(), m.len()), (128 + 30, 70), "a refused reset changes nothing");
        assert!(m.reset_to(60));
        assert_eq!((m.headroom(), m.len(), m.pkt_len()), (128, 60, 60));
        assert!(m.reset_to(room));
        assert_eq!(m.tailroom(), 0);
        assert_eq!(pool.in_use(), 1);
        drop(burst);
        assert_eq!(pool.in_use(), 0);
    });
}

#[test]
fn unknown_port_names_the_known_ones() {
    on_main(|eal| {
        // net_null9 is never started, so no other test closes it.
        let e = sluice_ffi::port_by_name(eal, "net_nope0").unwrap_err().to_string();
        assert!(e.contains("net_nope0") && e.contains("net_null9"), "{e}");
        assert!(matches!(Eal::init(&["--no-huge"]), Err(Error::EalAlreadyInitialised)));
    });
}

#[test]
fn a_device_is_owned_by_one_port_at_a_time() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_own", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
        let id = sluice_ffi::port_by_name(eal, "net_null3").unwrap();
        let first = Port::start(eal, id, &small(), &pool).unwrap();
        let e = Port::start(eal, id, &small(), &pool).unwrap_err().to_string();
        assert!(e.contains("already started by another Port") && e.contains("net_null3"), "{e}");
        assert_eq!(eal.holders().ports, 1);
        assert!(first.link().unwrap().up, "the refused start left the first Port's device alone");
    });
}

#[test]
fn a_stats_reader_keeps_the_device_open_while_the_port_closes() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_reader", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
        let id = sluice_ffi::port_by_name(eal, "net_null2").unwrap();
        let mut port = Port::start(eal, id, &small(), &pool).unwrap();
        let reader = port.stats_reader();
        assert_eq!(reader.id(), id);
        let (mut rx, mut tx) = (port.take_rx_queue(0).unwrap(), port.take_tx_queue(0).unwrap());
        let mut burst = Burst::new();
        let got = rx.rx_burst(&mut burst) as u64;
        assert_eq!(tx.tx_burst(&mut burst) as u64, got);

        // Another thread reads while this one drops the Port and its queues.
        let reads = Arc::new(AtomicUsize::new(0));
        let dropped = Arc::new(AtomicBool::new(false));
        let admin = {
            let (reader, reads, dropped) = (reader.clone(), Arc::clone(&reads), Arc::clone(&dropped));
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut after_drop = 0;
                for _ in 0..200_000 {
                    let s = reader.stats();
                    let l = reader.link();
                    match (s, l) {
                        (Ok(s), Ok(l)) => {
                            assert_eq!((s.ipackets, s.opackets), (got, got));
                            assert!(l.up, "the device is still started");
                        }
                        (s, l) => failures.push(format!("{:?} {:?}", s.err(), l.err())),
                    }
                    reads.fetch_add(1, Ordering::SeqCst);
                    if dropped.load(Ordering::SeqCst) {
                        after_drop += 1;
                        if after_drop == 1000 {
                            break;
                        }
                    }
                }
                (failures, after_drop)
            })
        };
        while reads.load(Ordering::SeqCst) < 100 && !admin.is_finished() {
            std::thread::yield_now();
        }
        drop((rx, tx, port));
        dropped.store(true, Ordering::SeqCst);
        let (failures, after_drop) = admin.join().unwrap();
        assert!(failures.is_empty(), "reads failed: {failures:?}");
        assert_eq!(after_drop, 1000, "the reader kept reading after the Port was dropped");

        assert!(!reader.xstats().unwrap().is_empty());
        assert_eq!(sluice_ffi::port_by_name(eal, "net_null2").unwrap(), id, "still open");
        assert_eq!(eal.holders().ports, 1);
        drop(reader);
        assert_eq!(eal.holders().ports, 0);
        assert!(sluice_ffi::port_by_name(eal, "net_null2").is_err(), "closed with the last reader");
        assert_eq!(pool.in_use(), 0);
    });
}

fn ring_pair(eal: &Eal, tag: &str) -> [Arc<Ring>; 2] {
    [0, 1].map(|i| Ring::new(eal, &format!("{tag}{i}"), 64).unwrap())
}

#[test]
fn a_driver_without_mtu_support_is_accepted_when_its_mtu_is_large_enough() {
    on_main(|eal| {
        let pool = Mempool::new(eal, "fwd_mtu", 255, 0, DEFAULT_DATA_ROOM).unwrap();
        // The ring driver cannot change its MTU (ENOTSUP); DPDK's default is 1500.
        let [rx, tx] = ring_pair(eal, "mtu_ok");
        let id = ring_port(eal, "ring_mtu_ok", &[rx], &[tx]).unwrap();
        let port = Port::start(eal, id, &PortConfig { mtu: Some(1400), ..small() }, &pool).unwrap();
        assert_eq!(port.mtu().unwrap(), 1500);

        let [rx, tx] = ring_pair(eal, "mtu_big");
        let id = ring_port(eal, "ring_mtu_big", &[rx], &[tx]).unwrap();
        let e = Port::start(eal, id, &PortConfig { mtu: Some(9000), ..small() }, &pool).unwrap_err();
        assert!(
            matches!(&e, Error::Mtu { device, requested: 9000, actual: 1500, .. } if device == "net_ring_ring_mtu_big"),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(msg.contains("net_ring_ring_mtu_big") && msg.contains("9000") && msg.contains("1500"), "{msg}");
    });
}
