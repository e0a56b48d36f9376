//! The data plane's half of sharing flow pins with sibling appliances:
//!
//! - [`PinRecord`]: a pin as it leaves a worker and travels to siblings,
//!   48 bytes, with an explicit encoding for the wire;
//! - [`SyncRing`]: the bounded ring each worker pushes its records into
//!   (one producer, the worker; one consumer, the control side's sync
//!   task). A full ring is counted by the worker and never waited on;
//! - [`SyncedPins`]: the pins received from siblings, a read-only hash
//!   table built off the fast path and published to the workers through
//!   [`crate::rcu`] (its own publisher, not the snapshot's: records arrive
//!   all the time while the snapshot changes with the configuration, and a
//!   worker learns of each by its own generation).
//!
//! What a worker exports, and when, is the pipeline's business
//! ([`crate::pipeline`]): a flow whose pin its service's current table no
//! longer agrees with, once per change of that table.

use std::fmt;

use crossbeam_queue::ArrayQueue;

use crate::addr::Addr;
use crate::flow::{FlowKey, FlowState, MAX_TIMEOUT};
use crate::maglev::EndpointId;
use crate::parse::Flow;

/// Records a worker's ring holds by default: enough for the flows a change
/// of one large service moves on a busy worker between two drains.
pub const SYNC_RING_CAPACITY: usize = 8192;

/// Bytes of an encoded [`PinRecord`].
pub const RECORD_LEN: usize = 48;

/// One flow's pin, as exported to sibling appliances: the flow and its
/// service, the endpoint it is pinned to (identifier and the low 16 bits
/// of its incarnation: pins compare 12), its state and the seconds it has
/// left without traffic. The in-memory layout is 48 bytes; the wire form
/// ([`PinRecord::encode`]) is 48 bytes too, every field big-endian:
///
/// ```text
///  0  src address (16, IPv4 as ::ffff:a.b.c.d)    36  endpoint id (2)
/// 16  dst address (16)                            38  incarnation, low 16 bits (2)
/// 32  service key (4)                             40  source port (2)
///                                                 42  destination port (2)
///                                                 44  lifetime, seconds (2)
///                                                 46  protocol (1)
///                                                 47  flow state (1)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(C)]
pub struct PinRecord {
    /// Client address.
    pub src: Addr,
    /// VIP.
    pub dst: Addr,
    /// The service's key.
    pub service: u32,
    /// The endpoint's identifier.
    pub endpoint: EndpointId,
    /// The low 16 bits of the endpoint's incarnation.
    pub incarnation: u16,
    /// Client port.
    pub sport: u16,
    /// VIP port.
    pub dport: u16,
    /// Seconds the pin lives without traffic, from when it was exported
    /// (`1..=MAX_TIMEOUT`).
    pub lifetime: u16,
    /// IP protocol.
    pub proto: u8,
    /// The flow's [`FlowState`], as its number.
    pub state: u8,
}

const _: () = assert!(std::mem::size_of::<PinRecord>() == RECORD_LEN);

/// Why bytes are not a [`PinRecord`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A record is exactly 48 bytes.
    #[error("a pin record is {RECORD_LEN} bytes, not {0}")]
    Length(usize),
    /// The lifetime is outside `1..=MAX_TIMEOUT`.
    #[error("pin lifetime {0} s is outside 1..={MAX_TIMEOUT}")]
    Lifetime(u16),
    /// The state is not one of a flow of that protocol.
    #[error("flow state {state} is not one of protocol {proto}")]
    State {
        /// The state's number.
        state: u8,
        /// The protocol.
        proto: u8,
    },
}

impl PinRecord {
    /// The record of `key` pinned to `endpoint` of `incarnation`, in
    /// state `state`, living `lifetime` more seconds.
    #[allow(clippy::cast_possible_truncation)] // the low 16 bits of the incarnation
    pub fn new(key: &FlowKey, endpoint: EndpointId, incarnation: u32, state: FlowState, lifetime: u16) -> PinRecord {
        let f = &key.flow;
        PinRecord {
            src: f.src,
            dst: f.dst,
            service: key.service,
            endpoint,
            incarnation: incarnation as u16,
            sport: f.sport,
            dport: f.dport,
            lifetime,
            proto: f.proto,
            state: state as u8,
        }
    }

    /// The flow and service it is about.
    pub fn key(&self) -> FlowKey {
        FlowKey {
            flow: Flow { src: self.src, dst: self.dst, sport: self.sport, dport: self.dport, proto: self.proto },
            service: self.service,
        }
    }

    /// The flow's state.
    pub fn flow_state(&self) -> FlowState {
        match self.state {
            1 => FlowState::Udp,
            2 => FlowState::TcpOpen,
            3 => FlowState::TcpClosing,
            _ => FlowState::Other,
        }
    }

    /// True when `incarnation` agrees with the one exported, in the 16 bits
    /// kept.
    #[allow(clippy::cast_possible_truncation)] // the low 16 bits
    pub fn is_incarnation(&self, incarnation: u32) -> bool {
        self.incarnation == incarnation as u16
    }

    /// The wire form.
    pub fn encode(&self) -> [u8; RECORD_LEN] {
        let mut b = [0u8; RECORD_LEN];
        b[0..16].copy_from_slice(&self.src.0.to_be_bytes());
        b[16..32].copy_from_slice(&self.dst.0.to_be_bytes());
        b[32..36].copy_from_slice(&self.service.to_be_bytes());
        b[36..38].copy_from_slice(&self.endpoint.to_be_bytes());
        b[38..40].copy_from_slice(&self.incarnation.to_be_bytes());
        b[40..42].copy_from_slice(&self.sport.to_be_bytes());
        b[42..44].copy_from_slice(&self.dport.to_be_bytes());
        b[44..46].copy_from_slice(&self.lifetime.to_be_bytes());
        b[46] = self.proto;
        b[47] = self.state;
        b
    }

    /// The record `bytes` encode, checked: 48 bytes, a lifetime a pin may
    /// have, a state a flow of its protocol may be in.
    pub fn decode(bytes: &[u8]) -> Result<PinRecord, RecordError> {
        let b: &[u8; RECORD_LEN] = bytes.try_into().map_err(|_| RecordError::Length(bytes.len()))?;
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let mut a = [0u8; 16];
        a.copy_from_slice(&b[0..16]);
        let src = Addr(u128::from_be_bytes(a));
        a.copy_from_slice(&b[16..32]);
        let dst = Addr(u128::from_be_bytes(a));
        let r = PinRecord {
            src,
            dst,
            service: u32::from_be_bytes([b[32], b[33], b[34], b[35]]),
            endpoint: u16_at(36),
            incarnation: u16_at(38),
            sport: u16_at(40),
            dport: u16_at(42),
            lifetime: u16_at(44),
            proto: b[46],
            state: b[47],
        };
        if r.lifetime == 0 || r.lifetime > MAX_TIMEOUT {
            return Err(RecordError::Lifetime(r.lifetime));
        }
        let fits = match r.proto {
            6 => r.state == FlowState::TcpOpen as u8 || r.state == FlowState::TcpClosing as u8,
            17 => r.state == FlowState::Udp as u8,
            _ => r.state == FlowState::Other as u8,
        };
        if !fits {
            return Err(RecordError::State { state: r.state, proto: r.proto });
        }
        Ok(r)
    }
}

/// A worker's ring of exported pins: bounded, allocated once, lock-free;
/// one producer (the worker) and one consumer (the sync task).
pub struct SyncRing {
    queue: ArrayQueue<PinRecord>,
}

impl fmt::Debug for SyncRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncRing").field("capacity", &self.queue.capacity()).field("len", &self.queue.len()).finish()
    }
}

impl SyncRing {
    /// A ring of `capacity` records (at least 1).
    pub fn new(capacity: usize) -> SyncRing {
        SyncRing { queue: ArrayQueue::new(capacity.max(1)) }
    }

    /// Adds a record; false (and nothing added) when the ring is full.
    #[inline]
    pub fn push(&self, r: PinRecord) -> bool {
        self.queue.push(r).is_ok()
    }

    /// Takes the oldest record.
    pub fn pop(&self) -> Option<PinRecord> {
        self.queue.pop()
    }

    /// Moves up to `max` records into `out`, oldest first; returns how many.
    pub fn drain_into(&self, out: &mut Vec<PinRecord>, max: usize) -> usize {
        let mut n = 0;
        while n < max {
            let Some(r) = self.queue.pop() else { break };
            out.push(r);
            n += 1;
        }
        n
    }

    /// Records waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True when no record waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Records it holds at most.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }
}

/// A pin received from a sibling, as the workers look it up: the endpoint
/// (identifier and incarnation, as this appliance numbers them) and until
/// when it holds, in the milliseconds of the workers' clock (the `now_ms`
/// they are given).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SyncedPin {
    /// The endpoint's identifier.
    pub endpoint: EndpointId,
    /// Its incarnation.
    pub incarnation: u32,
    /// It holds while `now_ms < deadline_ms`; 0 marks an empty slot.
    pub deadline_ms: u64,
}

/// The pins received from siblings: an open-addressing hash table (linear
/// probing, at most half full) keyed by flow and service, built once and
/// read only. Lookups allocate nothing; an empty table answers without
/// reading memory.
#[derive(Clone, Default)]
pub struct SyncedPins {
    keys: Box<[FlowKey]>,
    pins: Box<[SyncedPin]>,
    mask: usize,
    len: usize,
}

impl fmt::Debug for SyncedPins {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncedPins").field("len", &self.len).field("slots", &self.pins.len()).finish()
    }
}

/// The first slot of a flow of `service` whose [`crate::hash::flow_hash`]
/// is `hash`, in a table of `mask + 1` slots (mixed with the service as
/// the flow table is, but with the high bits: the flow table's bucket uses
/// the low ones).
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // masked to the table size
fn home(hash: u64, service: u32, mask: usize) -> usize {
    let h = hash ^ u64::from(service).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h.rotate_right(24) as usize) & mask
}

impl SyncedPins {
    /// The table of `pins` (flow and service, pin); of two pins of one
    /// flow the later is kept. Pins with `deadline_ms` 0 are left out.
    pub fn build(pins: impl IntoIterator<Item = (FlowKey, SyncedPin)>) -> SyncedPins {
        let pins: Vec<(FlowKey, SyncedPin)> = pins.into_iter().filter(|(_, p)| p.deadline_ms != 0).collect();
        if pins.is_empty() {
            return SyncedPins::default();
        }
        let slots = (pins.len() * 2).next_power_of_two();
        let mask = slots - 1;
        let mut t = SyncedPins {
            keys: vec![FlowKey::default(); slots].into_boxed_slice(),
            pins: vec![SyncedPin::default(); slots].into_boxed_slice(),
            mask,
            len: 0,
        };
        for (k, p) in pins {
            let mut i = home(crate::hash::flow_hash(&k.flow), k.service, mask);
            loop {
                if t.pins[i].deadline_ms == 0 {
                    t.len += 1;
                    break;
                }
                if t.keys[i] == k {
                    break;
                }
                i = (i + 1) & mask;
            }
            t.keys[i] = k;
            t.pins[i] = p;
        }
        t
    }

    /// The pin of `key` (whose flow hash is `hash`) still holding at
    /// `now_ms`.
    #[inline]
    pub fn lookup(&self, key: &FlowKey, hash: u64, now_ms: u64) -> Option<SyncedPin> {
        if self.len == 0 {
            return None;
        }
        let mut i = home(hash, key.service, self.mask);
        loop {
            let p = *self.pins.get(i)?;
            if p.deadline_ms == 0 {
                return None;
            }
            if self.keys.get(i) == Some(key) {
                return (now_ms < p.deadline_ms).then_some(p);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Pins held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of heap memory used.
    pub fn heap_bytes(&self) -> usize {
        self.pins.len() * (std::mem::size_of::<FlowKey>() + std::mem::size_of::<SyncedPin>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::flow_hash;
    use proptest::prelude::*;

    fn key(i: u32, proto: u8) -> FlowKey {
        FlowKey {
            flow: Flow { src: Addr::v4(i.to_be_bytes()), dst: Addr::v4([20, 0, 0, 1]), sport: u16::try_from(1000 + i % 7).unwrap_or(0), dport: 80, proto },
            service: i % 3,
        }
    }

    #[test]
    fn a_record_is_48_bytes_in_memory_and_on_the_wire() {
        let k = FlowKey {
            flow: Flow { src: Addr::v6([0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]), dst: Addr::v4([20, 0, 0, 1]), sport: 0x1234, dport: 443, proto: 6 },
            service: 0x0102_0304,
        };
        let r = PinRecord::new(&k, 0xbeef, 0x0007_0abc, FlowState::TcpOpen, 3600);
        assert_eq!(std::mem::size_of::<PinRecord>(), 48);
        let b = r.encode();
        assert_eq!(&b[0..4], &[0x20, 1, 0xd, 0xb8]);
        assert_eq!(&b[16..32], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 20, 0, 0, 1], "IPv4 as mapped");
        assert_eq!(&b[32..48], &[1, 2, 3, 4, 0xbe, 0xef, 0x0a, 0xbc, 0x12, 0x34, 0x01, 0xbb, 0x0e, 0x10, 6, 2]);
        assert_eq!(PinRecord::decode(&b), Ok(r));
        assert_eq!(r.key(), k);
        assert_eq!(r.flow_state(), FlowState::TcpOpen);
        assert!(r.is_incarnation(0x0abc) && r.is_incarnation(0x0001_0abc) && !r.is_incarnation(0x0abd));
    }

    #[test]
    fn bad_records_are_refused() {
        let r = PinRecord::new(&key(1, 17), 3, 1, FlowState::Udp, 300);
        let b = r.encode();
        assert_eq!(PinRecord::decode(&b[..47]), Err(RecordError::Length(47)));
        assert_eq!(PinRecord::decode(&[0; 49]), Err(RecordError::Length(49)));
        for (lifetime, ok) in [(0u16, false), (1, true), (MAX_TIMEOUT, true), (MAX_TIMEOUT + 1, false)] {
            let got = PinRecord::decode(&PinRecord { lifetime, ..r }.encode());
            assert_eq!(got.is_ok(), ok, "lifetime {lifetime}: {got:?}");
        }
        assert_eq!(PinRecord::decode(&PinRecord { state: 2, ..r }.encode()), Err(RecordError::State { state: 2, proto: 17 }));
        assert_eq!(PinRecord::decode(&PinRecord { state: 1, proto: 6, ..r }.encode()), Err(RecordError::State { state: 1, proto: 6 }));
        assert_eq!(PinRecord::decode(&PinRecord { state: 4, proto: 47, ..r }.encode()), Err(RecordError::State { state: 4, proto: 47 }));
        assert!(PinRecord::decode(&PinRecord { state: 0, proto: 47, ..r }.encode()).is_ok());
    }

    proptest! {
        #[test]
        fn records_round_trip(src in any::<u128>(), dst in any::<u128>(), service in any::<u32>(), endpoint in any::<u16>(),
                              incarnation in any::<u32>(), sport in any::<u16>(), dport in any::<u16>(),
                              lifetime in 1..=MAX_TIMEOUT, proto in prop_oneof![Just(6u8), Just(17), any::<u8>()], closing in any::<bool>()) {
            let state = FlowState::after(None, proto, if closing { 1 } else { 0 });
            let k = FlowKey { flow: Flow { src: Addr(src), dst: Addr(dst), sport, dport, proto }, service };
            let r = PinRecord::new(&k, endpoint, incarnation, state, lifetime);
            let back = PinRecord::decode(&r.encode());
            prop_assert_eq!(back, Ok(r));
            prop_assert_eq!(r.key(), k);
            prop_assert_eq!(r.flow_state(), state);
        }

        /// Any 48 bytes decode to a record that encodes back to them, or
        /// are refused.
        #[test]
        fn decoding_is_checked(b in proptest::collection::vec(any::<u8>(), RECORD_LEN)) {
            if let Ok(r) = PinRecord::decode(&b) {
                let back = r.encode();
                prop_assert_eq!(back.as_slice(), b.as_slice());
            }
        }
    }

    #[test]
    fn a_full_ring_refuses_and_keeps_what_it_has() {
        let ring = SyncRing::new(4);
        let rec = |i: u32| PinRecord::new(&key(i, 17), 1, 1, FlowState::Udp, 300);
        assert!((0..4).all(|i| ring.push(rec(i))));
        assert!(!ring.push(rec(4)), "full");
        assert_eq!((ring.len(), ring.capacity()), (4, 4));
        let mut out = Vec::new();
        assert_eq!(ring.drain_into(&mut out, 3), 3);
        assert_eq!(out, (0..3).map(rec).collect::<Vec<_>>(), "oldest first");
        assert!(ring.push(rec(5)));
        assert_eq!(ring.pop(), Some(rec(3)));
        assert_eq!(ring.pop(), Some(rec(5)));
        assert!(ring.is_empty() && ring.pop().is_none());
    }

    #[test]
    fn synced_pins_are_found_by_flow_and_service_until_their_deadline() {
        let pin = |e: u16| SyncedPin { endpoint: e, incarnation: 7, deadline_ms: 10_000 };
        let keys: Vec<FlowKey> = (0..1000).map(|i| key(i, 6)).collect();
        let t = SyncedPins::build(keys.iter().enumerate().map(|(i, k)| (*k, pin(u16::try_from(i).unwrap_or(0)))));
        assert_eq!(t.len(), 1000);
        for (i, k) in keys.iter().enumerate() {
            let h = flow_hash(&k.flow);
            assert_eq!(t.lookup(k, h, 9_999), Some(pin(u16::try_from(i).unwrap_or(0))), "flow {i}");
            assert_eq!(t.lookup(k, h, 10_000), None, "past its deadline");
            let other = FlowKey { service: k.service + 3, ..*k };
            assert_eq!(t.lookup(&other, h, 1), None, "another service's flow");
        }
        let absent = key(5000, 6);
        assert_eq!(t.lookup(&absent, flow_hash(&absent.flow), 1), None);
        // The later of two pins of one flow; empty deadlines left out.
        let t = SyncedPins::build([(keys[0], pin(1)), (keys[1], SyncedPin { deadline_ms: 0, ..pin(2) }), (keys[0], pin(3))]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup(&keys[0], flow_hash(&keys[0].flow), 1), Some(pin(3)));
        assert_eq!(t.lookup(&keys[1], flow_hash(&keys[1].flow), 1), None);
        let empty = SyncedPins::build([]);
        assert!(empty.is_empty() && empty.lookup(&keys[0], 0, 0).is_none());
    }
}
