//! Per-worker state: the flow table (which endpoint each flow is pinned
//! to) and the fragment table (which endpoint the first fragment of a
//! datagram went to). Both are fixed-size set-associative tables, allocated
//! once when the worker starts, as zeroed memory: a page becomes resident
//! when a flow first lands in it; nothing here allocates afterwards.
//!
//! The flow table is laid out for the cache:
//! - a bucket is one 64-byte line of 8 ways, each a 16-bit signature (hash
//!   bits the bucket index does not use; 0 = empty, a real 0 is stored as
//!   1), a 16-bit deadline (the expiry second modulo 2^16) and a 32-bit
//!   [`FlowPin`];
//! - the full key of way `w` of bucket `b` ([`FlowKey`]: the 5-tuple and the
//!   service, as six words) is line `b * 8 + w` of the keys, a line of its
//!   own, read only when a signature matches: a miss reads one line, a hit
//!   two, and two flows never share a pin (a signature only filters);
//! - both are arrays of 64-byte-aligned lines ([`Lines`]): the zeroed
//!   memory they come from starts 16 bytes past a page, where 64-byte
//!   records would each straddle two lines and a hit read four;
//! - a way is live while `deadline - now` (modulo 2^16) is in
//!   `1..=MAX_TIMEOUT`; [`FlowTable::advance`] clears expired ways long
//!   before the modulo could make one look live again;
//! - one pass over a bucket ([`FlowTable::probe`]) finds the flow's way or
//!   the way an insert takes: the first empty or expired one, otherwise the
//!   live way nearest its deadline (the least recently used, as a use
//!   moves the deadline), which is counted as an eviction.
//!
//! The bucket and the signature come from [`flow_hash`] (the hash Maglev
//! uses: every version computes the same) mixed with the service key.

use crate::addr::Addr;
use crate::hash::flow_hash;
use crate::maglev::EndpointId;
use crate::parse::Flow;

/// Ways of a flow-table bucket.
pub const FLOW_WAYS: usize = 8;

/// Entries per fragment-table bucket.
const FRAG_WAYS: usize = 4;

/// The longest idle timeout a flow may have, in seconds. An expired way
/// reads as expired until `2^16 - MAX_TIMEOUT` seconds after its deadline.
pub const MAX_TIMEOUT: u16 = 16384;

/// Seconds within which [`FlowTable::advance`] visits every bucket once:
/// well inside the `2^16 - MAX_TIMEOUT` seconds an expired way reads as
/// expired.
const SWEEP_PERIOD: u64 = 16384;

/// TCP flags that end a connection.
const TCP_FIN: u8 = 0x01;
const TCP_RST: u8 = 0x04;

/// Which endpoint of which service a datagram was given (the fragment
/// table's entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, bytemuck::Zeroable)]
pub struct Pin {
    /// The service's stable key.
    pub service: u32,
    /// The endpoint identifier.
    pub endpoint: EndpointId,
    /// The endpoint's incarnation, so a reused identifier is not mistaken
    /// for the endpoint that had it before.
    pub incarnation: u32,
    /// Where the endpoint was in its service's records when pinned: looked
    /// at first (it moves only when endpoints come or go).
    pub at: u16,
}

/// What a flow's protocol says of its lifetime: it chooses the idle timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FlowState {
    /// Neither TCP nor UDP.
    #[default]
    Other = 0,
    /// UDP.
    Udp = 1,
    /// TCP, no FIN or RST seen.
    TcpOpen = 2,
    /// TCP after a FIN or an RST.
    TcpClosing = 3,
}

impl FlowState {
    /// The state of a flow of protocol `proto` after a packet with TCP
    /// flags `tcp_flags`, when it was `was` (`None`: a new flow). A closing
    /// TCP flow stays closing.
    #[inline(always)]
    pub fn after(was: Option<FlowState>, proto: u8, tcp_flags: u8) -> FlowState {
        match proto {
            6 if tcp_flags & (TCP_FIN | TCP_RST) != 0 || was == Some(FlowState::TcpClosing) => FlowState::TcpClosing,
            6 => FlowState::TcpOpen,
            17 => FlowState::Udp,
            _ => FlowState::Other,
        }
    }

    #[inline(always)]
    fn from_bits(b: u32) -> FlowState {
        match b & 3 {
            0 => FlowState::Other,
            1 => FlowState::Udp,
            2 => FlowState::TcpOpen,
            _ => FlowState::TcpClosing,
        }
    }
}

/// Idle timeouts in seconds, per [`FlowState`]; each in `1..=MAX_TIMEOUT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowTimeouts {
    /// TCP, established.
    pub tcp_established: u16,
    /// TCP after a FIN or an RST.
    pub tcp_closing: u16,
    /// UDP.
    pub udp: u16,
    /// Any other protocol.
    pub other: u16,
}

impl Default for FlowTimeouts {
    fn default() -> Self {
        FlowTimeouts { tcp_established: 3600, tcp_closing: 60, udp: 300, other: 60 }
    }
}

impl FlowTimeouts {
    /// The timeout of a flow in state `s`.
    #[inline(always)]
    pub fn of(&self, s: FlowState) -> u16 {
        match s {
            FlowState::Other => self.other,
            FlowState::Udp => self.udp,
            FlowState::TcpOpen => self.tcp_established,
            FlowState::TcpClosing => self.tcp_closing,
        }
    }

    fn clamped(self) -> FlowTimeouts {
        let c = |s: u16| s.clamp(1, MAX_TIMEOUT);
        FlowTimeouts { tcp_established: c(self.tcp_established), tcp_closing: c(self.tcp_closing), udp: c(self.udp), other: c(self.other) }
    }
}

/// Bits of an endpoint's incarnation a [`FlowPin`] keeps.
pub const PIN_INCARNATION_BITS: u32 = 12;

/// The mark of change epoch `epoch` of a service (see
/// [`crate::service::SlotChanges`]) that a [`FlowPin`] keeps in 2 bits:
/// 0 for epoch 0 (a table that never changed), else `epoch % 3 + 1`.
#[inline]
#[allow(clippy::cast_possible_truncation)] // below 3
pub fn sync_mark(epoch: u32) -> u8 {
    if epoch == 0 {
        0
    } else {
        (epoch % 3) as u8 + 1
    }
}

/// A flow's pin, in 32 bits: the endpoint identifier (16 bits, stable while
/// the endpoint stays in its service, unlike its position), the low
/// [`PIN_INCARNATION_BITS`] bits of its incarnation, the [`FlowState`]
/// (2 bits), and its sync mark (2 bits, not set by this table): the
/// [`sync_mark`] of its service's change epoch when the pin was made or
/// last checked for export to sibling appliances. A pin whose mark differs
/// from its service's was made under an older table: it is checked (and
/// exported when a sibling's table would send it elsewhere) once, and
/// takes the current mark, which stands for the pin's "exported" bit
/// being cleared at every change without a walk over the table. The mark
/// repeats every 3 epochs: a pin silent through exactly a multiple of 3
/// changes of its service is not checked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowPin(u32);

impl FlowPin {
    const INC_SHIFT: u32 = 16;
    const INC_MASK: u32 = (1 << PIN_INCARNATION_BITS) - 1;
    const STATE_SHIFT: u32 = 28;
    const MARK_SHIFT: u32 = 30;

    /// The pin of endpoint `endpoint` of incarnation `incarnation`, for a
    /// flow in state `state`.
    #[inline(always)]
    pub fn new(endpoint: EndpointId, incarnation: u32, state: FlowState) -> FlowPin {
        FlowPin(u32::from(endpoint) | (incarnation & Self::INC_MASK) << Self::INC_SHIFT | (state as u32) << Self::STATE_SHIFT)
    }

    /// The endpoint identifier.
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // the low 16 bits
    pub fn endpoint(self) -> EndpointId {
        self.0 as u16
    }

    /// True when `incarnation` agrees with the one pinned (in the bits kept).
    #[inline(always)]
    pub fn is_incarnation(self, incarnation: u32) -> bool {
        (self.0 >> Self::INC_SHIFT) & Self::INC_MASK == incarnation & Self::INC_MASK
    }

    /// The flow's state.
    #[inline(always)]
    pub fn state(self) -> FlowState {
        FlowState::from_bits(self.0 >> Self::STATE_SHIFT)
    }

    /// The same pin in state `s`.
    #[inline(always)]
    #[must_use]
    pub fn with_state(self, s: FlowState) -> FlowPin {
        FlowPin(self.0 & !(3 << Self::STATE_SHIFT) | (s as u32) << Self::STATE_SHIFT)
    }

    /// Its sync mark (see [`sync_mark`]).
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // 2 bits
    pub fn sync_mark(self) -> u8 {
        (self.0 >> Self::MARK_SHIFT) as u8
    }

    /// The same pin with sync mark `mark` (its low 2 bits).
    #[inline(always)]
    #[must_use]
    pub fn with_sync_mark(self, mark: u8) -> FlowPin {
        FlowPin(self.0 & !(3 << Self::MARK_SHIFT) | (u32::from(mark) & 3) << Self::MARK_SHIFT)
    }
}

/// A flow-table entry's full key: the 5-tuple and the service, in 64
/// bytes. Not declared 64-byte aligned (nor is [`Bucket`]): the allocator
/// would then write zeros over the whole table instead of handing out
/// untouched zeroed pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, bytemuck::Zeroable)]
#[repr(C)]
pub struct FlowKey {
    /// The flow.
    pub flow: Flow,
    /// The service's stable key.
    pub service: u32,
}

/// One flow-table bucket: 64 bytes, a cache line's worth.
#[derive(Clone, Copy, Debug, Default, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C)]
struct Bucket {
    sig: [u16; FLOW_WAYS],
    deadline: [u16; FLOW_WAYS],
    pin: [u32; FLOW_WAYS],
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64 && std::mem::size_of::<FlowKey>() == 64);

/// Words of a cache line.
const LINE_WORDS: usize = 8;

/// A cache line, as words.
type Line = [u64; LINE_WORDS];

/// Zeroed cache lines, each 64-byte aligned: a zeroed slice of words one
/// line longer than asked, used from its first word on a line boundary.
/// The slice is allocated as zeroed memory (untouched pages, see the
/// module's comment) with the words' alignment only: an allocation
/// declared 64-byte aligned would be written over whole.
#[derive(Debug)]
struct Lines {
    words: Box<[u64]>,
    /// The first word on a line boundary.
    start: usize,
    len: usize,
}

impl Lines {
    fn zeroed(len: usize) -> Lines {
        let words: Box<[u64]> = bytemuck::zeroed_slice_box(len * LINE_WORDS + LINE_WORDS - 1);
        // Words are 8-byte aligned: how many words past a line the slice starts.
        let past = (words.as_ptr() as usize / 8) % LINE_WORDS;
        Lines { words, start: (LINE_WORDS - past) % LINE_WORDS, len }
    }

    #[inline(always)]
    fn all(&self) -> &[Line] {
        bytemuck::cast_slice(&self.words[self.start..self.start + self.len * LINE_WORDS])
    }

    #[inline(always)]
    fn all_mut(&mut self) -> &mut [Line] {
        bytemuck::cast_slice_mut(&mut self.words[self.start..self.start + self.len * LINE_WORDS])
    }

    #[inline(always)]
    fn get(&self, i: usize) -> &Line {
        &self.all()[i]
    }

    #[inline(always)]
    fn get_mut(&mut self, i: usize) -> &mut Line {
        &mut self.all_mut()[i]
    }

    /// Bytes held (the extra line included).
    fn bytes(&self) -> usize {
        std::mem::size_of_val(&*self.words)
    }
}

/// True when two lines hold the same words: compared whole, without a
/// branch per word (nor a call to `memcmp`).
#[inline(always)]
fn same_line(a: &Line, b: &Line) -> bool {
    a.iter().zip(b).fold(0, |d, (x, y)| d | (x ^ y)) == 0
}

/// A key as the table holds it: the 5-tuple and the service in six words
/// of a line (the other two zero).
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // the halves of 128-bit addresses
fn key_line(k: &FlowKey) -> Line {
    let (s, d) = (k.flow.src.0, k.flow.dst.0);
    let rest = u64::from(k.flow.sport) | u64::from(k.flow.dport) << 16 | u64::from(k.flow.proto) << 32;
    [s as u64, (s >> 64) as u64, d as u64, (d >> 64) as u64, rest, u64::from(k.service), 0, 0]
}

/// Remaining seconds of a way with `deadline` at `now` (modulo 2^16);
/// live when in `1..=MAX_TIMEOUT`.
#[inline(always)]
#[allow(clippy::cast_possible_truncation)] // seconds modulo 2^16
fn remaining(deadline: u16, now: u32) -> u16 {
    deadline.wrapping_sub(now as u16)
}

#[inline(always)]
fn is_live(sig: u16, r: u16) -> bool {
    sig != 0 && r != 0 && r <= MAX_TIMEOUT
}

/// Where a probed flow is (a hit) or would go (a miss), as found by one
/// pass over its bucket. Valid until the table changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    bucket: usize,
    way: usize,
    sig: u16,
    /// The flow's own way.
    hit: bool,
    /// A miss that replaces a live way.
    evicts: bool,
}

/// Counters of a table's behaviour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Live entries replaced to make room.
    pub evictions: u64,
}

/// Buckets [`FlowTable::census`] walks a call: 64 cache lines.
pub const CENSUS_STEP: usize = 64;

/// A count of live entries in progress.
#[derive(Clone, Copy, Debug, Default)]
struct Census {
    /// The next bucket to count (0: no count under way).
    cursor: usize,
    /// Live entries counted so far.
    live: usize,
    /// The last complete count.
    last: usize,
    /// The second the count under way (or the last) started.
    started: u32,
}

/// The flow table of one worker.
#[derive(Debug)]
pub struct FlowTable {
    /// [`Bucket`]s.
    buckets: Lines,
    /// Keys ([`key_line`]), `FLOW_WAYS` lines a bucket.
    keys: Lines,
    mask: usize,
    timeouts: FlowTimeouts,
    /// The latest second given to [`FlowTable::advance`].
    now: u32,
    /// The next bucket the sweep visits, and the bucket-seconds it owes.
    cursor: usize,
    owed: u64,
    /// Something was stored since the table was last cleared.
    written: bool,
    /// The count of live entries [`FlowTable::census`] makes.
    census: Census,
    /// What happened so far.
    pub stats: TableStats,
}

impl FlowTable {
    /// A table of at least `capacity` entries (rounded up to a power of two
    /// of buckets) whose entries expire after the idle `timeouts` of their
    /// state (clamped to `1..=MAX_TIMEOUT`).
    pub fn new(capacity: usize, timeouts: FlowTimeouts) -> FlowTable {
        let buckets = capacity.div_ceil(FLOW_WAYS).next_power_of_two().max(1);
        FlowTable {
            buckets: Lines::zeroed(buckets),
            keys: Lines::zeroed(buckets * FLOW_WAYS),
            mask: buckets - 1,
            timeouts: timeouts.clamped(),
            now: 0,
            cursor: 0,
            owed: 0,
            written: false,
            census: Census::default(),
            stats: TableStats::default(),
        }
    }

    /// The live entries as last counted: a count that walks
    /// [`CENSUS_STEP`] buckets a call and starts again at most once a
    /// second (`now`), so that a worker can keep it with a call each poll
    /// round at a cost it does not feel. An untouched table is not walked
    /// (its pages stay unmapped).
    pub fn census(&mut self, now: u32) -> usize {
        let c = &mut self.census;
        if !self.written {
            *c = Census { started: now, ..Census::default() };
            return 0;
        }
        if c.cursor == 0 {
            if c.started == now {
                return c.last;
            }
            c.started = now;
            c.live = 0;
        }
        let end = (c.cursor + CENSUS_STEP).min(self.buckets.len);
        for l in &self.buckets.all()[c.cursor..end] {
            let b: &Bucket = bytemuck::cast_ref(l);
            c.live += (0..FLOW_WAYS).filter(|&w| is_live(b.sig[w], remaining(b.deadline[w], now))).count();
        }
        if end == self.buckets.len {
            c.last = c.live;
            c.cursor = 0;
        } else {
            c.cursor = end;
        }
        c.last
    }

    /// Number of entries it holds at most.
    pub fn capacity(&self) -> usize {
        self.buckets.len * FLOW_WAYS
    }

    #[inline(always)]
    fn bucket(&self, b: usize) -> &Bucket {
        bytemuck::cast_ref(self.buckets.get(b))
    }

    #[inline(always)]
    fn bucket_mut(&mut self, b: usize) -> &mut Bucket {
        bytemuck::cast_mut(self.buckets.get_mut(b))
    }

    /// Bytes of memory its buckets and keys take (resident or not).
    pub fn bytes(&self) -> usize {
        self.buckets.bytes() + self.keys.bytes()
    }

    /// The timeouts in force.
    pub fn timeouts(&self) -> FlowTimeouts {
        self.timeouts
    }

    /// The bucket index and signature of a flow of `service` whose
    /// [`flow_hash`] is `hash`.
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // masked to the table size; the top 16 bits
    pub fn place(&self, hash: u64, service: u32) -> (usize, u16) {
        let h = hash ^ u64::from(service).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((h as usize) & self.mask, ((h >> 48) as u16).max(1))
    }

    /// Where the bucket of a flow lives (for a prefetch; not read).
    #[inline(always)]
    pub fn bucket_addr(&self, hash: u64, service: u32) -> *const u8 {
        self.buckets.all().as_ptr().wrapping_add(self.place(hash, service).0).cast()
    }

    /// Where the key of the flow of `service` whose [`flow_hash`] is `hash`
    /// would be, when a way of its bucket has its signature, and that way's
    /// pin (for prefetches once the bucket is in the cache: reads the bucket
    /// only; the key is not compared, so the way may be another flow's or
    /// expired).
    #[inline(always)]
    pub fn way_hint(&self, hash: u64, service: u32) -> Option<(*const u8, FlowPin)> {
        let (b, sig) = self.place(hash, service);
        let bucket = self.bucket(b);
        let w = bucket.sig.iter().position(|&s| s == sig)?;
        Some((self.keys.all().as_ptr().wrapping_add(b * FLOW_WAYS + w).cast(), FlowPin(bucket.pin[w])))
    }

    /// One pass over the bucket of `key` (whose [`flow_hash`] is `hash`) at
    /// second `now`: its pin when it has a live entry, and the slot it has
    /// or would take.
    #[inline]
    pub fn probe(&self, key: &FlowKey, hash: u64, now: u32) -> (Slot, Option<FlowPin>) {
        let (b, sig) = self.place(hash, key.service);
        let bucket = self.bucket(b);
        let kl = key_line(key);
        let (mut victim, mut nearest) = (0, u16::MAX);
        for w in 0..FLOW_WAYS {
            let r = remaining(bucket.deadline[w], now);
            if !is_live(bucket.sig[w], r) {
                if nearest != 0 {
                    (victim, nearest) = (w, 0);
                }
                continue;
            }
            if bucket.sig[w] == sig && same_line(self.keys.get(b * FLOW_WAYS + w), &kl) {
                return (Slot { bucket: b, way: w, sig, hit: true, evicts: false }, Some(FlowPin(bucket.pin[w])));
            }
            if r < nearest {
                (victim, nearest) = (w, r);
            }
        }
        (Slot { bucket: b, way: victim, sig, hit: false, evicts: nearest != 0 }, None)
    }

    /// The pin of `key`, if it has one (nothing changes).
    #[inline]
    pub fn peek(&self, key: &FlowKey, hash: u64, now: u32) -> Option<FlowPin> {
        self.probe(key, hash, now).1
    }

    /// Gives `key` the pin `pin` at `slot` (found by [`FlowTable::probe`]
    /// for this key, with nothing changed since), with the deadline of its
    /// state from `now`.
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // seconds modulo 2^16
    pub fn set(&mut self, slot: Slot, key: &FlowKey, pin: FlowPin, now: u32) {
        let deadline = (now as u16).wrapping_add(self.timeouts.of(pin.state()));
        let b = self.bucket_mut(slot.bucket);
        b.sig[slot.way] = slot.sig;
        b.deadline[slot.way] = deadline;
        b.pin[slot.way] = pin.0;
        if !slot.hit {
            self.stats.evictions += u64::from(slot.evicts);
            *self.keys.get_mut(slot.bucket * FLOW_WAYS + slot.way) = key_line(key);
            self.written = true;
        }
    }

    /// Looks `key` up and, when found, refreshes it in the state a packet
    /// with TCP flags `tcp_flags` leaves it in; otherwise inserts `pin()`
    /// (a convenience over [`FlowTable::advance`], [`FlowTable::probe`] and
    /// [`FlowTable::set`]).
    pub fn lookup_or_insert(&mut self, key: &FlowKey, now: u32, tcp_flags: u8, pin: impl FnOnce() -> FlowPin) -> FlowPin {
        self.advance(now);
        let hash = flow_hash(&key.flow);
        let (slot, found) = self.probe(key, hash, now);
        let p = match found {
            Some(p) => p.with_state(FlowState::after(Some(p.state()), key.flow.proto, tcp_flags)),
            None => pin(),
        };
        self.set(slot, key, p, now);
        p
    }

    /// Moves the table's clock to `now` (seconds, not going back) and
    /// clears the expired ways of the buckets due: every bucket once per
    /// `SWEEP_PERIOD` seconds, or all at once after `MAX_TIMEOUT` seconds
    /// or more (every entry has expired then). Call it before the table is
    /// used at a new second: an expired way then never reads as live.
    #[inline(always)]
    pub fn advance(&mut self, now: u32) {
        if now > self.now {
            self.sweep(now);
        }
    }

    #[cold]
    #[allow(clippy::cast_possible_truncation)] // at most the number of buckets
    fn sweep(&mut self, now: u32) {
        let elapsed = u64::from(now - self.now);
        self.now = now;
        if elapsed >= u64::from(MAX_TIMEOUT) {
            if self.written {
                for l in self.buckets.all_mut() {
                    let b: &mut Bucket = bytemuck::cast_mut(l);
                    if b.sig != [0; FLOW_WAYS] {
                        b.sig = [0; FLOW_WAYS];
                    }
                }
                self.written = false;
            }
            self.owed = 0;
            return;
        }
        let n = self.buckets.len as u64;
        self.owed = self.owed.saturating_add(elapsed * n);
        let due = (self.owed / SWEEP_PERIOD + 1).min(n);
        self.owed = self.owed.saturating_sub(due * SWEEP_PERIOD);
        for _ in 0..due {
            let cursor = self.cursor;
            let b = self.bucket_mut(cursor);
            for w in 0..FLOW_WAYS {
                if b.sig[w] != 0 && !is_live(b.sig[w], remaining(b.deadline[w], now)) {
                    b.sig[w] = 0;
                }
            }
            self.cursor = (self.cursor + 1) & self.mask;
        }
    }

    /// Live entries (walks the whole table: for status, not the fast path).
    pub fn len(&self, now: u32) -> usize {
        self.buckets
            .all()
            .iter()
            .map(|l| {
                let b: &Bucket = bytemuck::cast_ref(l);
                (0..FLOW_WAYS).filter(|&w| is_live(b.sig[w], remaining(b.deadline[w], now))).count()
            })
            .sum()
    }

    /// True when no entry is live.
    pub fn is_empty(&self, now: u32) -> bool {
        self.len(now) == 0
    }
}

/// Identifies one IP datagram's fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, bytemuck::Zeroable)]
pub struct FragKey {
    /// Source address.
    pub src: Addr,
    /// Destination address.
    pub dst: Addr,
    /// Fragment identification.
    pub id: u32,
    /// Transport protocol.
    pub proto: u8,
}

#[derive(Clone, Copy, Debug, Default, bytemuck::Zeroable)]
struct FragEntry {
    key: FragKey,
    pin: Pin,
    /// Creation time in milliseconds; 0 = empty.
    born: u64,
}

/// Where the first fragment of recent datagrams went, per worker.
#[derive(Debug)]
pub struct FragTable {
    entries: Box<[[FragEntry; FRAG_WAYS]]>,
    mask: usize,
    ttl_ms: u64,
    /// What happened so far.
    pub stats: TableStats,
}

impl FragTable {
    /// A table of at least `capacity` entries, each valid `ttl_ms`.
    pub fn new(capacity: usize, ttl_ms: u64) -> FragTable {
        let buckets = capacity.div_ceil(FRAG_WAYS).next_power_of_two().max(1);
        FragTable {
            entries: bytemuck::zeroed_slice_box(buckets),
            mask: buckets - 1,
            ttl_ms: ttl_ms.max(1),
            stats: TableStats::default(),
        }
    }

    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // masked to the table size
    fn bucket(&self, k: &FragKey) -> usize {
        let f = Flow { src: k.src, dst: k.dst, sport: (k.id >> 16) as u16, dport: k.id as u16, proto: k.proto };
        flow_hash(&f) as usize & self.mask
    }

    /// Where the datagram's first fragment went; `now` in ms (> 0).
    #[inline]
    pub fn lookup(&self, k: &FragKey, now: u64) -> Option<Pin> {
        let b = self.bucket(k);
        self.entries[b]
            .iter()
            .find(|e| e.born != 0 && now.saturating_sub(e.born) <= self.ttl_ms && e.key == *k)
            .map(|e| e.pin)
    }

    /// Records where the first fragment went.
    #[inline]
    pub fn insert(&mut self, k: &FragKey, pin: Pin, now: u64) {
        let b = self.bucket(k);
        let now = now.max(1);
        let ttl = self.ttl_ms;
        let bucket = &mut self.entries[b];
        let mut victim = 0;
        let mut oldest = u64::MAX;
        for (i, e) in bucket.iter().enumerate() {
            if e.born == 0 || now.saturating_sub(e.born) > ttl || e.key == *k {
                victim = i;
                oldest = 0;
                break;
            }
            if e.born < oldest {
                victim = i;
                oldest = e.born;
            }
        }
        if oldest != 0 {
            self.stats.evictions += 1;
        }
        bucket[victim] = FragEntry { key: *k, pin, born: now };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn flow(i: u32) -> Flow {
        Flow { src: Addr::v4(i.to_be_bytes()), dst: Addr::v4([20, 0, 0, 1]), sport: 1000, dport: 80, proto: 6 }
    }

    fn key(i: u32) -> FlowKey {
        FlowKey { flow: flow(i), service: 7 }
    }

    fn pin(e: u16) -> Pin {
        Pin { service: 7, endpoint: e, incarnation: 1, at: e }
    }

    fn tcp(e: u16) -> FlowPin {
        FlowPin::new(e, 1, FlowState::TcpOpen)
    }

    /// Inserts (or re-pins) `k` with `p` at `now`, as the pipeline does.
    fn put(t: &mut FlowTable, k: &FlowKey, p: FlowPin, now: u32) {
        t.advance(now);
        let (slot, _) = t.probe(k, flow_hash(&k.flow), now);
        t.set(slot, k, p, now);
    }

    fn peek(t: &FlowTable, k: &FlowKey, now: u32) -> Option<FlowPin> {
        t.peek(k, flow_hash(&k.flow), now)
    }

    #[test]
    fn a_pin_keeps_its_fields_apart() {
        let p = FlowPin::new(65535, 0xffff_fabc, FlowState::TcpClosing);
        assert_eq!((p.endpoint(), p.state(), p.sync_mark()), (65535, FlowState::TcpClosing, 0));
        assert!(p.is_incarnation(0xabc) && p.is_incarnation(0x1abc), "12 bits are kept");
        assert!(!p.is_incarnation(0xabd));
        let q = p.with_sync_mark(3).with_state(FlowState::Udp);
        assert_eq!((q.endpoint(), q.state(), q.sync_mark()), (65535, FlowState::Udp, 3));
        assert!(q.is_incarnation(0xabc));
        assert_eq!(q.with_sync_mark(1).with_state(FlowState::TcpOpen).sync_mark(), 1);
        assert_eq!(q.with_sync_mark(0).with_state(FlowState::TcpClosing), p);
        let z = FlowPin::new(0, 0, FlowState::Other);
        assert_eq!((z.endpoint(), z.state(), z.sync_mark()), (0, FlowState::Other, 0));
        assert_eq!((0..7).map(sync_mark).collect::<Vec<_>>(), [0, 2, 3, 1, 2, 3, 1], "epoch 0 has no mark; the others take turns");
    }

    #[test]
    fn a_zeroed_table_is_empty() {
        let (z, d): (FragEntry, FragEntry) = (bytemuck::Zeroable::zeroed(), FragEntry::default());
        assert_eq!(format!("{z:?}"), format!("{d:?}"));
        let t = FlowTable::new(64, FlowTimeouts::default());
        assert_eq!((t.capacity(), t.len(1)), (64, 0));
        assert_eq!(peek(&t, &FlowKey::default(), 1), None, "the all-zero key is not found in an empty table");
        assert_eq!(peek(&t, &FlowKey::default(), 0), None);
    }

    /// The census counts what `len` counts, a few buckets a call, once a
    /// second: expired entries leave it at the next second's count.
    #[test]
    fn the_census_counts_live_entries_a_step_at_a_time() {
        let mut t = FlowTable::new(CENSUS_STEP * FLOW_WAYS * 4, FlowTimeouts { udp: 5, ..FlowTimeouts::default() });
        assert_eq!(t.census(1), 0, "nothing stored");
        let udp = FlowPin::new(1, 0, FlowState::Udp);
        for i in 0..300 {
            let k = FlowKey { flow: Flow { proto: 17, ..flow(i) }, ..key(i) };
            put(&mut t, &k, udp, 1);
        }
        for i in 300..500 {
            put(&mut t, &key(i), tcp(1), 1);
        }
        let live = t.len(1);
        assert!(live > 400, "{live}");
        let buckets = t.capacity() / FLOW_WAYS;
        let calls = buckets.div_ceil(CENSUS_STEP);
        for _ in 0..calls - 1 {
            assert_eq!(t.census(2), 0, "the first count is not done yet");
        }
        assert_eq!(t.census(2), live, "after {calls} calls");
        assert_eq!(t.census(2), live, "no new count within the second");
        let later = 1 + 5 + 1;
        let tcp_left = t.len(later);
        assert!(tcp_left <= 200 && tcp_left + 250 < live, "the UDP flows expired: {tcp_left} of {live}");
        let mut got = 0;
        for _ in 0..calls {
            got = t.census(later);
        }
        assert_eq!(got, tcp_left);
    }

    /// Resident kilobytes of this process (Linux).
    fn rss_kib() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/self/status").ok()?;
        s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()
    }

    /// Every bucket and every key is one cache line, not two halves: the
    /// zeroed memory they come from is not 64-byte aligned itself.
    #[test]
    fn buckets_and_keys_are_whole_cache_lines() {
        for n in [8usize, 1024, 65536, 262_144, 1 << 20] {
            let t = FlowTable::new(n, FlowTimeouts::default());
            for (what, l) in [("buckets", &t.buckets), ("keys", &t.keys)] {
                assert_eq!(l.all().as_ptr() as usize % 64, 0, "{what} of a table of {n}");
                assert!(l.all().len() == l.len && l.len > 0, "{what}");
            }
            assert_eq!(t.keys.len, t.buckets.len * FLOW_WAYS);
        }
    }

    #[test]
    fn a_table_is_resident_only_where_flows_landed() {
        // 2^19 buckets and 2^22 keys: hundreds of MB of table, of which
        // only the pages of the ways written become resident.
        // With transparent hugepages always on, the kernel may back a
        // touched page with a 2 MiB page: fewer flows then, so that the
        // pages they land in (at most 32 MiB) still stay far below the
        // table's size.
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").is_ok_and(|s| s.contains("[always]"));
        let flows = if thp { 8 } else { 1000 };
        let before = rss_kib().expect("VmRSS in /proc/self/status");
        let mut t = FlowTable::new(4 << 20, FlowTimeouts::default());
        let size_kib = ((t.buckets.bytes() + t.keys.bytes()) / 1024) as u64;
        assert!(size_kib >= 256 * 1024, "{size_kib} KiB");
        for i in 0..flows {
            put(&mut t, &key(i), tcp(1), 1);
        }
        // Cleared after an idle period: only written buckets are written again.
        t.advance(1 + u32::from(MAX_TIMEOUT));
        assert_eq!(t.len(1 + u32::from(MAX_TIMEOUT)), 0);
        for i in 0..flows {
            put(&mut t, &key(i), tcp(1), 2 + u32::from(MAX_TIMEOUT));
        }
        let grown = rss_kib().unwrap_or(0).saturating_sub(before);
        // 1,000 flows touch at most 2,000 pages (8 MiB); other tests of
        // this binary allocate a little meanwhile.
        assert!(grown < 64 * 1024, "the table of {size_kib} KiB made the process {grown} KiB bigger ({flows} flows)");
        assert_eq!(t.len(2 + u32::from(MAX_TIMEOUT)), flows as usize);
    }

    #[test]
    fn each_state_has_its_own_idle_timeout() {
        let to = FlowTimeouts { tcp_established: 100, tcp_closing: 10, udp: 30, other: 5 };
        let mut t = FlowTable::new(1024, to);
        let k = key(1);
        assert_eq!(t.lookup_or_insert(&k, 1000, 0x02, || tcp(3)), tcp(3));
        assert_eq!(peek(&t, &k, 1099), Some(tcp(3)));
        assert_eq!(peek(&t, &FlowKey { service: 8, ..k }, 1050), None, "another service's flow");
        assert_eq!(peek(&t, &k, 1100), None, "idle for 100 s");
        assert_eq!(t.lookup_or_insert(&k, 1050, 0x10, || tcp(4)), tcp(3), "refreshed, not replaced");
        assert_eq!(peek(&t, &k, 1149), Some(tcp(3)));
        let closing = t.lookup_or_insert(&k, 1060, 0x11, || tcp(4));
        assert_eq!((closing.endpoint(), closing.state()), (3, FlowState::TcpClosing), "a FIN");
        assert_eq!(peek(&t, &k, 1069), Some(closing));
        assert_eq!(peek(&t, &k, 1070), None, "closing flows live 10 s");
        let mut t = FlowTable::new(1024, to);
        t.lookup_or_insert(&k, 1000, 0x04, || tcp(3).with_state(FlowState::after(None, 6, 0x04)));
        assert_eq!(t.lookup_or_insert(&k, 1005, 0x10, || tcp(4)).state(), FlowState::TcpClosing, "closing stays closing");
        assert_eq!(peek(&t, &k, 1015), None);
        let u = FlowKey { flow: Flow { proto: 17, ..flow(2) }, service: 7 };
        let o = FlowKey { flow: Flow { proto: 47, ..flow(3) }, service: 7 };
        t.lookup_or_insert(&u, 2000, 0, || FlowPin::new(1, 1, FlowState::after(None, 17, 0)));
        t.lookup_or_insert(&o, 2000, 0, || FlowPin::new(1, 1, FlowState::after(None, 47, 0)));
        assert!(peek(&t, &u, 2029).is_some() && peek(&t, &u, 2030).is_none(), "UDP lives 30 s");
        assert!(peek(&t, &o, 2004).is_some() && peek(&t, &o, 2005).is_none(), "others live 5 s");
    }

    #[test]
    fn an_expired_way_never_reads_as_live_again() {
        // Deadlines are kept modulo 2^16: after any sequence of clock steps
        // the sweep has cleared what expired.
        for step in [1u32, 7, 999, 16_383, 16_384, 40_000, 65_535, 65_536, 70_000] {
            let mut t = FlowTable::new(64 * 1024, FlowTimeouts::default());
            let ks: Vec<FlowKey> = (0..50).map(key).collect();
            for k in &ks {
                put(&mut t, k, tcp(1), 10);
            }
            let mut now = 10;
            while now < 400_000 {
                now += step;
                t.advance(now);
                let live = ks.iter().filter(|k| peek(&t, k, now).is_some()).count();
                let want = if now < 3610 { 50 } else { 0 };
                assert_eq!(live, want, "steps of {step} s, at {now}");
            }
        }
    }

    #[test]
    fn a_full_bucket_gives_up_the_way_nearest_its_deadline() {
        let mut t = FlowTable::new(8, FlowTimeouts { tcp_established: 100, ..FlowTimeouts::default() });
        assert_eq!(t.capacity(), 8);
        for i in 0..8u16 {
            put(&mut t, &key(i.into()), tcp(i), 1 + u32::from(i));
        }
        assert_eq!(t.stats.evictions, 0);
        t.lookup_or_insert(&key(0), 9, 0x10, || tcp(99));
        put(&mut t, &key(8), tcp(8), 10);
        assert_eq!(t.stats.evictions, 1);
        assert_eq!(peek(&t, &key(1), 10), None, "flow 1 had the nearest deadline");
        assert_eq!(peek(&t, &key(0), 10), Some(tcp(0)), "flow 0 was refreshed at 9");
        assert_eq!(t.len(10), 8);
        // An expired way is taken before a live one is evicted.
        t.lookup_or_insert(&key(2), 100, 0x11, || tcp(99)); // closing: 60 s
        put(&mut t, &key(9), tcp(9), 170);
        assert_eq!(t.stats.evictions, 1);
        assert_eq!(peek(&t, &key(2), 170), None);
    }

    #[test]
    fn bounded_with_lru_eviction() {
        let mut t = FlowTable::new(64, FlowTimeouts::default());
        for i in 0..10_000u32 {
            put(&mut t, &key(i), tcp(1), 1 + i / 100);
        }
        assert!(t.len(200) <= 64);
        assert!(t.stats.evictions >= 10_000 - 64);
        let recent = (9_900..10_000u32).filter(|&i| peek(&t, &key(i), 200).is_some()).count();
        let old = (0..100u32).filter(|&i| peek(&t, &key(i), 200).is_some()).count();
        assert!(recent > old, "recent {recent} old {old}");
    }

    #[test]
    fn flows_that_share_a_signature_keep_their_own_pins() {
        let mut t = FlowTable::new(16, FlowTimeouts::default());
        let mut seen = HashMap::new();
        let (a, b) = (0..100_000u32)
            .find_map(|i| {
                let k = key(i);
                seen.insert(t.place(flow_hash(&k.flow), k.service), i).map(|j| (key(j), k))
            })
            .expect("two flows with the same bucket and signature");
        put(&mut t, &a, tcp(1), 5);
        assert_eq!(peek(&t, &b, 5), None, "a signature alone does not find a flow");
        put(&mut t, &b, tcp(2), 5);
        assert_eq!((peek(&t, &a, 6), peek(&t, &b, 6)), (Some(tcp(1)), Some(tcp(2))));
        assert_eq!(t.len(6), 2);
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Clock moves on by this many seconds.
        Advance(u32),
        /// A packet of flow k with these TCP flags: refreshes its pin if it has one.
        Packet(u32, u8),
        /// Flow k (re)pinned to endpoint e.
        Pin(u32, u16),
    }

    const KEYS: u32 = 24;

    fn model_key(i: u32) -> FlowKey {
        let proto = [6, 17, 1][(i % 3) as usize];
        FlowKey { flow: Flow { proto, ..flow(i / 2) }, service: i % 2 }
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        let dt = prop_oneof![4 => 0..4u32, 2 => 0..60u32, 1 => Just(16_384u32), 1 => 16_000..70_000u32];
        let op = prop_oneof![
            1 => dt.prop_map(Op::Advance),
            3 => (0..KEYS, prop_oneof![Just(0u8), Just(0x10), Just(0x11), Just(0x04)]).prop_map(|(k, f)| Op::Packet(k, f)),
            3 => (0..KEYS, any::<u16>()).prop_map(|(k, e)| Op::Pin(k, e)),
        ];
        proptest::collection::vec(op, 1..300)
    }

    proptest! {
        /// The table agrees with a map of the same expiry rules: what is
        /// live, its pin, and which flow a full bucket gives up (one of
        /// those nearest their deadline, counted).
        #[test]
        fn agrees_with_a_map(ops in ops(), capacity in prop_oneof![Just(8usize), Just(16), Just(1024)]) {
            let to = FlowTimeouts { tcp_established: 40, tcp_closing: 5, udp: 20, other: 3 };
            let mut t = FlowTable::new(capacity, to);
            let mut model: HashMap<u32, (FlowPin, u64)> = HashMap::new();
            let mut now = 1u32;
            let mut evictions = 0;
            for op in ops {
                t.advance(now);
                match op {
                    Op::Advance(dt) => {
                        now += dt;
                        t.advance(now);
                        model.retain(|_, (_, d)| *d > u64::from(now));
                    }
                    Op::Packet(i, flags) => {
                        let k = model_key(i);
                        let (slot, found) = t.probe(&k, flow_hash(&k.flow), now);
                        prop_assert_eq!(found, model.get(&i).map(|e| e.0));
                        if let Some(p) = found {
                            let p = p.with_state(FlowState::after(Some(p.state()), k.flow.proto, flags));
                            t.set(slot, &k, p, now);
                            model.insert(i, (p, u64::from(now) + u64::from(to.of(p.state()))));
                        }
                    }
                    Op::Pin(i, e) => {
                        let k = model_key(i);
                        let p = FlowPin::new(e, 1, FlowState::after(None, k.flow.proto, 0));
                        let (slot, found) = t.probe(&k, flow_hash(&k.flow), now);
                        prop_assert_eq!(found, model.get(&i).map(|e| e.0));
                        let bucket = t.place(flow_hash(&k.flow), k.service).0;
                        let mates: Vec<u32> = model.keys().copied().filter(|&j| j != i && t.place(flow_hash(&model_key(j).flow), j % 2).0 == bucket).collect();
                        t.set(slot, &k, p, now);
                        if found.is_none() && mates.len() == FLOW_WAYS {
                            let nearest = mates.iter().map(|j| model[j].1).min().unwrap_or(0);
                            let gone: Vec<u32> = mates.iter().copied().filter(|&j| peek(&t, &model_key(j), now).is_none()).collect();
                            prop_assert_eq!(gone.len(), 1, "one flow gives way");
                            prop_assert_eq!(model[&gone[0]].1, nearest, "the nearest deadline goes");
                            model.remove(&gone[0]);
                            evictions += 1;
                        }
                        model.insert(i, (p, u64::from(now) + u64::from(to.of(p.state()))));
                    }
                }
                prop_assert_eq!(t.stats.evictions, evictions);
                for i in 0..KEYS {
                    prop_assert_eq!(peek(&t, &model_key(i), now), model.get(&i).map(|e| e.0), "flow {} at {}", i, now);
                }
                prop_assert_eq!(t.len(now), model.len());
            }
        }
    }

    #[test]
    fn fragments_follow_their_first() {
        let mut f = FragTable::new(256, 5000);
        let k = FragKey { src: Addr::v4([1, 2, 3, 4]), dst: Addr::v4([20, 0, 0, 1]), id: 42, proto: 17 };
        assert_eq!(f.lookup(&k, 10), None);
        f.insert(&k, pin(9), 10);
        assert_eq!(f.lookup(&k, 4000), Some(pin(9)));
        assert_eq!(f.lookup(&FragKey { id: 43, ..k }, 4000), None);
        assert_eq!(f.lookup(&k, 6000), None, "expired");
    }
}
