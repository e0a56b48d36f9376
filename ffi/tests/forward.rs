//! Forwarding through the safe API on virtual devices: counts match and
//! every mbuf is back in its pool afterwards.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use sluice_dataplane::io::{Burst, PacketBuf};
use sluice_ffi::{ring_port, Eal, Mempool, Port, PortConfig, Ring, DEFAULT_DATA_ROOM};

static EAL: OnceLock<Eal> = OnceLock::new();
static SERIAL: Mutex<()> = Mutex::new(());

fn eal() -> (&'static Eal, MutexGuard<'static, ()>) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let eal = EAL.get_or_init(|| {
        let prefix = format!("--file-prefix=sluice-ffi-test-{}", std::process::id());
        Eal::init(&[
            "--no-huge",
            "-m",
            "256",
            "--no-pci",
            "--no-telemetry",
            "-l",
            "0",
            "--log-level=lib.eal:warning",
            &prefix,
            "--vdev=net_null0",
            "--vdev=net_null1",
            "--vdev=net_null9",
        ])
        .expect("EAL init on net_null vdevs")
    });
    (eal, guard)
}

#[test]
fn null_pair_forwards_and_returns_every_mbuf() {
    let (eal, _g) = eal();
    let pool = Mempool::new(eal, "fwd_null", 4095, 0, DEFAULT_DATA_ROOM).unwrap();
    let start = pool.available();
    assert_eq!(start, pool.capacity());
    {
        let p0 = sluice_ffi::port_by_name(eal, "net_null0").unwrap();
        let p1 = sluice_ffi::port_by_name(eal, "net_null1").unwrap();
        let cfg = PortConfig { rx_desc: 256, tx_desc: 256, ..PortConfig::default() };
        let mut a = Port::start(eal, p0, &cfg, &pool).unwrap();
        let mut b = Port::start(eal, p1, &cfg, &pool).unwrap();
        assert_eq!(a.info().driver, "net_null");
        assert!(a.link().unwrap().up);
        let (mut arx, mut atx) = (a.take_rx_queue(0).unwrap(), a.take_tx_queue(0).unwrap());
        let (mut brx, mut btx) = (b.take_rx_queue(0).unwrap(), b.take_tx_queue(0).unwrap());
        assert!(a.take_rx_queue(0).is_none(), "a queue is handed out once");

        let mut burst = Burst::new();
        let (mut ab, mut ba, mut sent) = (0u64, 0u64, 0u64);
        for _ in 0..2000 {
            ab += arx.rx_burst(&mut burst) as u64;
            sent += btx.tx_burst(&mut burst) as u64;
            ba += brx.rx_burst(&mut burst) as u64;
            sent += atx.tx_burst(&mut burst) as u64;
        }
        assert!(ab > 0 && ba > 0);
        assert_eq!(ab + ba, sent, "net_null accepts every packet");
        let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
        assert_eq!(sa.ipackets, ab);
        assert_eq!(sb.opackets, ab);
        assert_eq!(sb.ipackets, ba);
        assert_eq!(sa.opackets, ba);
        assert!(!a.xstats().unwrap().is_empty());
        assert!(pool.in_use() > 0 || pool.available() == start);
    }
    assert_eq!(pool.available(), start, "every mbuf is back in the pool");
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn ring_ports_carry_exact_frames() {
    let (eal, _g) = eal();
    let pool = Mempool::new(eal, "fwd_ring", 1023, 0, DEFAULT_DATA_ROOM).unwrap();
    let start = pool.available();
    let rings: Vec<Arc<Ring>> =
        (0..4).map(|i| Ring::new(eal, &format!("fwd_r{i}"), 1024).unwrap()).collect();
    {
        let pa = ring_port(eal, "ring_a", &rings[0..1], &rings[1..2]).unwrap();
        let pb = ring_port(eal, "ring_b", &rings[2..3], &rings[3..4]).unwrap();
        let cfg = PortConfig { rx_desc: 256, tx_desc: 256, ..PortConfig::default() };
        let mut a = Port::start(eal, pa, &cfg, &pool).unwrap();
        let mut b = Port::start(eal, pb, &cfg, &pool).unwrap();
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
        let mut seen = Vec::new();
        let mut out = Burst::new();
        for _ in 0..100 {
            arx.rx_burst(&mut burst);
            for m in burst.iter_mut() {
                m.data_mut()[4] = 0xab;
            }
            btx.tx_burst(&mut burst);
            while rings[3].dequeue(&mut out) > 0 {
                for m in out.iter() {
                    let d = PacketBuf::data(m);
                    assert_eq!(d.len(), 64);
                    assert_eq!(d[4], 0xab);
                    seen.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
                }
                sluice_ffi::free_burst(&mut out);
            }
        }
        assert_eq!(seen, (0..N).collect::<Vec<_>>(), "every frame, in order, once");
        assert_eq!(b.stats().unwrap().opackets, u64::from(N));
    }
    assert_eq!(pool.available(), start, "every mbuf is back in the pool");
}

#[test]
fn prepend_and_adj_move_the_frame_start() {
    let (eal, _g) = eal();
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
    }
    assert_eq!(pool.in_use(), 0);
}

#[test]
fn unknown_port_names_the_known_ones() {
    let (eal, _g) = eal();
    // net_null9 is never started, so no other test closes it.
    let e = sluice_ffi::port_by_name(eal, "net_nope0").unwrap_err().to_string();
    assert!(e.contains("net_nope0") && e.contains("net_null9"), "{e}");
    assert!(matches!(Eal::init(&["--no-huge"]), Err(sluice_ffi::Error::EalAlreadyInitialised)));
}
