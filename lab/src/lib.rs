//! Sluice's lab tools, out of the data plane and its DPDK door: the core of
//! `sluice gen`, a traffic generator that sends a flow mix (or replayed
//! frames) at a rate and accounts for what comes back.
//!
//! - [`mix`]: the flow mix, built once into frame templates.
//! - [`stamp`]: the sequence number, flow id and timestamp each generated
//!   frame carries at the end of its IP packet.
//! - [`pace`]: how many frames are due now (a rate, or recorded times).
//! - [`rx`]: what came back: received, reordered, duplicates, per endpoint,
//!   latency.
//! - [`engine`]: the loop over a [`engine::GenIo`] (DPDK queues in
//!   [`queues`], memory in tests).
//!
//! Like the data plane: nothing per packet allocates, locks or logs.
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]

mod engine;
pub mod mix;
mod pace;
mod queues;
mod rx;
mod stamp;

pub use engine::{run, Control, GenIo, Generator, Lanes, Timing, TxCounters};
pub use queues::GenQueues;
pub use mix::{build, Datagram, Kind, MixError, MixSpec, Plan, PlanError};
pub use pace::{Pacer, Schedule};
pub use rx::{Endpoint, EndpointBy, Receiver};

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test numbers
mod tests {
    use std::collections::VecDeque;
    use std::net::Ipv4Addr;
    use std::sync::atomic::Ordering;

    use super::*;
    use sluice_dataplane::checksum;
    use sluice_dataplane::io::{Burst, PacketBuf, PacketIo};
    use sluice_dataplane::memio::MemBuf;
    use sluice_dataplane::parse::{parse, Frame};

    /// Output 0 loops back to input 0, losing every `drop_every`-th frame
    /// and swapping each pair of frames when `swap`; allocation fails
    /// after `alloc_budget` buffers.
    struct Loop {
        queue: VecDeque<MemBuf>,
        count: u64,
        drop_every: u64,
        swap: bool,
        alloc_budget: u64,
        freed: u64,
        seen: Vec<Vec<u8>>,
    }

    impl PacketIo for Loop {
        type Buf = MemBuf;
        fn rx(&mut self, _input: usize, burst: &mut Burst<MemBuf>) -> usize {
            let mut n = 0;
            while !burst.is_full() {
                let Some(b) = self.queue.pop_front() else { break };
                burst.push(b);
                n += 1;
            }
            n
        }
        fn tx(&mut self, _output: usize, burst: &mut Burst<MemBuf>) -> usize {
            let n = burst.len();
            let mut kept: Vec<MemBuf> = Vec::new();
            for b in burst.drain(..) {
                self.count += 1;
                self.seen.push(b.data().to_vec());
                if self.drop_every == 0 || self.count % self.drop_every != 0 {
                    kept.push(b);
                }
            }
            if self.swap {
                for pair in kept.chunks_mut(2) {
                    pair.reverse();
                }
            }
            self.queue.extend(kept);
            n
        }
        fn free(&mut self, burst: &mut Burst<MemBuf>) {
            self.freed += burst.len() as u64;
            burst.clear();
        }
    }

    impl GenIo for Loop {
        fn alloc(&mut self, burst: &mut Burst<MemBuf>, n: usize) -> usize {
            let n = n.min(usize::try_from(self.alloc_budget).unwrap_or(usize::MAX));
            for _ in 0..n {
                burst.push(MemBuf::new(&[0xee; 2048]));
            }
            self.alloc_budget -= n as u64;
            n
        }
        fn set_len(&self, buf: &mut MemBuf, len: usize) -> bool {
            buf.truncate(len)
        }
    }

    fn lo(drop_every: u64, swap: bool) -> Loop {
        Loop { queue: VecDeque::new(), count: 0, drop_every, swap, alloc_budget: u64::MAX, freed: 0, seen: Vec::new() }
    }

    fn spec(kinds: Vec<Kind>, fragment_percent: u8) -> MixSpec {
        MixSpec {
            flows: 10,
            vips: vec!["20.0.0.1".parse().unwrap(), "fd00::20".parse().unwrap()],
            ports: vec![80],
            kinds,
            sizes: vec![64, 301],
            fragment_percent,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            client_v4: Ipv4Addr::new(30, 0, 0, 0),
            client_v6: "fd00:30::".parse().unwrap(),
        }
    }

    /// Runs `datagrams` sends through `io` with a clock that ticks 1 per read.
    fn go(io: &mut Loop, s: &MixSpec, limit: u64) -> (Generator, Receiver) {
        let ds = build(s).unwrap();
        let mut g = Generator::new(Plan::new(&ds).unwrap(), s.flows, Timing::Rate(Pacer::new(1000, 0, 0, 0)), Some(limit));
        let mut r = Receiver::new(s.flows, 1000, EndpointBy::Auto).unwrap();
        let ctl = Control::default();
        let mut t = 0u64;
        run(io, Lanes { out: 0, inputs: 1, drain: 50 }, &mut g, &mut r, &ctl, || {
            t += 1;
            t
        });
        assert!(ctl.tx_done.load(Ordering::Relaxed));
        (g, r)
    }

    #[test]
    fn loopback_accounts_for_every_frame() {
        let s = spec(vec![Kind::TcpSyn, Kind::TcpData, Kind::Udp], 50);
        let mut io = lo(0, false);
        let (g, r) = go(&mut io, &s, 1000);
        assert_eq!(g.counters.datagrams, 1000);
        // Flows 2, 5 and 8 of 10 are UDP (i % 3 == 2), all fragmented
        // (i % 100 < 50): 2 frames each.
        assert_eq!(g.counters.sent, 1000 + 1000 / 10 * 3);
        assert_eq!(r.received, g.counters.sent);
        assert_eq!((r.reordered, r.duplicates, r.unstamped), (0, 0, 0));
        assert_eq!(g.counters.tx_full + g.counters.alloc_failed, 0);
        assert_eq!(r.endpoints(), vec![(Endpoint::Mac([2, 0, 0, 0, 0, 2]), g.counters.sent)]);
        assert_eq!(io.freed, g.counters.sent);
    }

    #[test]
    fn lost_and_reordered_frames_are_counted() {
        let s = spec(vec![Kind::Udp], 0);
        let mut io = lo(10, true);
        let (g, r) = go(&mut io, &s, 1000);
        assert_eq!(g.counters.sent, 1000);
        assert_eq!(g.counters.sent - r.received, 100);
        // Swapping neighbours reverses frames of different flows (round
        // robin), so per-flow order only breaks where a swap lands two
        // frames of one flow together: with 10 flows, never.
        assert_eq!(r.reordered, 0);
        let s1 = MixSpec { flows: 1, ..s };
        let mut io = lo(0, true);
        let (g, r) = go(&mut io, &s1, 1000);
        assert_eq!(r.received, g.counters.sent);
        assert_eq!(r.reordered, 500, "every second frame of the one flow came after its successor");
    }

    #[test]
    fn sent_frames_keep_valid_checksums_and_unique_fragment_ids() {
        let s = spec(vec![Kind::TcpData, Kind::Udp], 100);
        let mut io = lo(0, false);
        let _ = go(&mut io, &s, 200);
        let mut checked = 0;
        for f in &io.seen {
            let Ok(Frame::Ip(p)) = parse(f) else { panic!("unparsable frame") };
            let ip = &f[usize::from(p.l3)..usize::from(p.ip_end)];
            if !p.v6 {
                assert_eq!(checksum::sum(&ip[..20]), 0xffff, "IPv4 header checksum");
            }
            if p.frag == sluice_dataplane::parse::Fragment::No {
                let l4 = usize::from(p.l4 - p.l3);
                assert_eq!(sluice_dataplane::craft::with_l4_checksum(ip.to_vec(), l4), ip, "transport checksum");
                checked += 1;
            }
        }
        assert!(checked > 50);
        // Both fragments of a datagram share its id; successive datagrams of a flow differ.
        let ids: Vec<u32> = io
            .seen
            .iter()
            .filter_map(|f| match parse(f) {
                Ok(Frame::Ip(p)) if p.frag != sluice_dataplane::parse::Fragment::No && p.flow.src.to_string() == "fd00:30::2" => {
                    Some(p.frag_id)
                }
                _ => None,
            })
            .collect();
        assert!(ids.len() >= 4);
        assert_eq!(ids[0], ids[1]);
        assert_ne!(ids[1], ids[2]);
        assert_eq!(ids[2], ids[3]);
    }

    /// Unfragmented mixes take the one-frame path: every frame leaves with
    /// valid checksums and its flow's next sequence number, as the
    /// fragment path's frames do.
    #[test]
    fn one_frame_datagrams_leave_with_valid_checksums_and_their_flows_sequence() {
        let s = spec(vec![Kind::TcpSyn, Kind::TcpData, Kind::Udp], 0);
        assert!(Plan::new(&build(&s).unwrap()).unwrap().single);
        let mut io = lo(0, false);
        let (g, r) = go(&mut io, &s, 95);
        assert_eq!((g.counters.sent, r.received), (95, 95));
        let mut next = [0u32; 10];
        for f in &io.seen {
            let Ok(Frame::Ip(p)) = parse(f) else { panic!("unparsable frame") };
            let ip = &f[usize::from(p.l3)..usize::from(p.ip_end)];
            if !p.v6 {
                assert_eq!(checksum::sum(&ip[..20]), 0xffff, "IPv4 header checksum");
            }
            let l4 = usize::from(p.l4 - p.l3);
            assert_eq!(sluice_dataplane::craft::with_l4_checksum(ip.to_vec(), l4), ip, "transport checksum");
            let st = stamp::read(&f[f.len() - stamp::STAMP_LEN..]).unwrap();
            assert_eq!(st.seq, next[st.flow as usize], "flow {}", st.flow);
            next[st.flow as usize] += 1;
        }
        assert_eq!(next.iter().sum::<u32>(), 95);
    }

    #[test]
    fn allocation_failures_are_counted_not_sent() {
        let s = spec(vec![Kind::Udp], 0);
        let mut io = lo(0, false);
        io.alloc_budget = 100;
        let ds = build(&s).unwrap();
        let mut g = Generator::new(Plan::new(&ds).unwrap(), s.flows, Timing::Rate(Pacer::new(1000, 0, 0, 0)), Some(200));
        let mut r = Receiver::new(s.flows, 1000, EndpointBy::Auto).unwrap();
        let ctl = Control::default();
        let mut t = 0u64;
        let mut rounds = 0;
        run(&mut io, Lanes { out: 0, inputs: 1, drain: 5 }, &mut g, &mut r, &ctl, || {
            t += 1;
            rounds += 1;
            if rounds > 10_000 {
                ctl.stop.store(true, Ordering::Relaxed);
            }
            t
        });
        assert_eq!(g.counters.sent, 100);
        assert!(g.counters.alloc_failed > 0);
        assert_eq!(r.received, 100);
    }
}
