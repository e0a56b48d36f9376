//! Software steering between workers.
//!
//! The NIC spreads packets over workers by RSS, which hashes addresses
//! (and ports, when there are any): the later fragments of a datagram (no
//! ports) and ICMP errors about a flow (a router's addresses outside) land
//! on another worker than the flow's packets. Where a worker's state decides
//! the endpoint — the fragment table, the flow table of a `random` service
//! or of a Maglev service that keeps one — that worker must see them all.
//!
//! Every flow has an owner that every worker computes alike from the
//! packet alone: [`owner`] of (client address, VIP), for an ICMP error of
//! the flow it is about. A worker hands a packet it does not own to the
//! owner through that worker's bounded lock-free queue (multi-producer,
//! [`crossbeam_queue::ArrayQueue`]); the owner drains its queue every poll
//! and never steers a packet again. A full queue is a counted drop.
//!
//! Packets left in queues when the workers stop are drained and freed by
//! the workers' shutdown; whatever a queue still holds when it is dropped
//! is freed with it (an mbuf returns to its pool).

use std::fmt;
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use crate::addr::Addr;
use crate::hash::{flow_hash, reduce};
use crate::parse::Flow;

/// A packet on its way to the worker that owns its flow, with what that
/// worker needs to process it as if it had received it.
#[derive(Debug)]
pub struct Steered<P> {
    /// The packet, as received.
    pub pkt: P,
    /// The port it came in on.
    pub port: u8,
    /// The output of that port's exception path, if any.
    pub exception: Option<usize>,
}

/// The queues between a set of workers: one per destination worker.
pub struct Steering<P> {
    queues: Box<[ArrayQueue<Steered<P>>]>,
}

impl<P> fmt::Debug for Steering<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steering").field("workers", &self.queues.len()).field("queued", &self.queued()).finish()
    }
}

impl<P> Steering<P> {
    /// Queues for `workers` workers, each holding up to
    /// `capacity_per_worker` packets (at least 1).
    pub fn new(workers: usize, capacity_per_worker: usize) -> Arc<Steering<P>> {
        let cap = capacity_per_worker.max(1);
        Arc::new(Steering { queues: (0..workers).map(|_| ArrayQueue::new(cap)).collect() })
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.queues.len()
    }

    /// Queues `s` for worker `to`; gives it back when that queue is full
    /// (or there is no such worker).
    #[inline]
    pub fn push(&self, to: usize, s: Steered<P>) -> Result<(), Steered<P>> {
        match self.queues.get(to) {
            Some(q) => q.push(s),
            None => Err(s),
        }
    }

    /// The next packet queued for worker `at`.
    #[inline]
    pub fn pop(&self, at: usize) -> Option<Steered<P>> {
        self.queues.get(at)?.pop()
    }

    /// Packets in all queues right now.
    pub fn queued(&self) -> usize {
        self.queues.iter().map(ArrayQueue::len).sum()
    }
}

/// The worker (of `workers`) that owns the flows between `client` and
/// `vip`: the same for every packet of a flow, its fragments and the ICMP
/// errors about it, whichever worker computes it.
#[inline(always)]
pub fn owner(client: Addr, vip: Addr, workers: u16) -> u16 {
    let h = flow_hash(&Flow { src: client, dst: vip, ..Flow::default() });
    // reduce() maps onto 0..workers, so the value fits.
    u16::try_from(reduce(h, u32::from(workers))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_spread_and_stay() {
        let vip = Addr::v4([20, 0, 0, 1]);
        let mut seen = [0u32; 4];
        for i in 0..4000u32 {
            let c = Addr::v4((0x0a00_0000 + i).to_be_bytes());
            let o = owner(c, vip, 4);
            assert_eq!(o, owner(c, vip, 4));
            seen[usize::from(o)] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        assert_eq!(owner(vip, vip, 1), 0);
    }

    #[test]
    fn bounded_queues_give_back_what_does_not_fit() {
        let s: Arc<Steering<u32>> = Steering::new(2, 2);
        let item = |pkt| Steered { pkt, port: 0, exception: None };
        assert!(s.push(1, item(1)).is_ok() && s.push(1, item(2)).is_ok());
        assert_eq!(s.push(1, item(3)).map_err(|e| e.pkt), Err(3), "full");
        assert_eq!(s.push(2, item(4)).map_err(|e| e.pkt), Err(4), "no such worker");
        assert_eq!(s.queued(), 2);
        assert_eq!(s.pop(0).map(|e| e.pkt), None);
        assert_eq!(s.pop(1).map(|e| e.pkt), Some(1));
        assert_eq!(s.pop(1).map(|e| e.pkt), Some(2));
        assert_eq!(s.workers(), 2);
    }
}
