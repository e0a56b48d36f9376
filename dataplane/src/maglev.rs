//! Weighted Maglev lookup tables, as a pure function of (table size,
//! endpoints as (identifier, weight)).
//!
//! Each endpoint walks its own permutation of the table, as in Maglev
//! (Eisenbud et al., NSDI 2016, section 3.4: `offset + j * skip mod M`, M
//! prime). Population differs from the paper in one way: the paper lets an
//! endpoint skip ahead to its next *free* slot in every round, which makes
//! the table very sensitive to any change (removing one of 100 endpoints
//! moves about 2.6/100 of the entries at M = 100 N). Here an endpoint looks at
//! exactly one slot per round, its next one by rank, and takes it only if
//! free; every endpoint stops at a quota of its weighted share plus 2%. The
//! result is the stable assignment of slots to endpoints by rank, which
//! moves far fewer entries when the set changes, and whose balance is
//! bounded by the quota rather than by chance.
//!
//! Invariants:
//! - Deterministic: the same inputs give a byte-identical table in every
//!   process and on every appliance; input order does not matter.
//! - Balanced: each endpoint owns close to `M * weight / total_weight` entries.
//! - Minimal disruption: removing one of N endpoints remaps about 1/N of
//!   the entries, almost only those it owned.
//! - Compact: up to 256 names, an entry takes as many bits as the largest
//!   name needs, packed end to end; beyond, two bytes. Names are
//!   identifiers (5 bits for the default limit of 32), or, as services
//!   build them, positions among the service's endpoints (4 bits for 10
//!   endpoints, whatever the limit).

use std::fmt;

use pulp::{Arch, Simd, WithSimd};

use crate::hash::{hash_u64, reduce};

/// An endpoint identifier (0..limit-1 within a service).
pub type EndpointId = u16;

const SEED_OFFSET: u64 = 0x6d61_676c_6576_6f66; // "maglevof"
const SEED_SKIP: u64 = 0x6d61_676c_6576_736b; // "maglevsk"

/// The entries of a lookup table: endpoint identifiers, or positions of
/// endpoints in their service (see [`Table::build_positions`]).
#[derive(Clone, PartialEq, Eq)]
pub enum Entries {
    /// Identifiers below 256, `bits` bits each (1 to 8), packed end to end
    /// from bit 0 of byte 0 (little-endian bit order).
    Packed(Packed),
    /// Two bytes per entry.
    U16(Box<[u16]>),
}

/// Entries of `bits` bits each, packed end to end: entry `i` is bits
/// `i * bits ..` of `data`, read as a little-endian `u16` from byte
/// `i * bits / 8` (an entry never spans more than two bytes; one byte of
/// padding ends the data, so the last entry reads two).
#[derive(Clone, PartialEq, Eq)]
pub struct Packed {
    bits: u32,
    len: u32,
    /// `(1 << bits) - 1`.
    mask: u16,
    data: Box<[u8]>,
}

/// Bits per entry for identifiers below `limit`: up to 256, as few as
/// hold `limit - 1` (at least one), packed; beyond, 16.
pub fn entry_bits(limit: u32) -> u32 {
    if limit <= 256 {
        (u32::BITS - limit.saturating_sub(1).leading_zeros()).max(1)
    } else {
        16
    }
}

/// Bytes of the entries of a table of `size` entries for names below
/// `limit`: the most a service's table of that size takes (it names
/// endpoints by position, and a service has at most `limit` endpoints).
pub fn entries_bytes(limit: u32, size: u32) -> u64 {
    match entry_bits(limit) {
        16 => u64::from(size) * 2,
        bits => (u64::from(size) * u64::from(bits)).div_ceil(8) + 1,
    }
}

impl Packed {
    /// The entries `name(o)` for each `o` of `owners` (each name below
    /// `1 << bits`), packed: eight entries at a time, which take exactly
    /// `bits` bytes, written as one word (the next group's word overwrites
    /// what lies beyond).
    #[inline(always)]
    fn named<T: Copy>(bits: u32, owners: &[T], mut name: impl FnMut(T) -> u16) -> Packed {
        let bytes = (owners.len() * bits as usize).div_ceil(8) + 1;
        let mut data = vec![0u8; bytes + 8];
        for (at, group) in (0..).step_by(bits as usize).zip(owners.chunks(8)) {
            let mut acc = 0u64;
            for (k, &o) in (0u32..).zip(group) {
                acc |= u64::from(name(o)) << (k * bits);
            }
            if let Some(word) = data.get_mut(at..at + 8) {
                word.copy_from_slice(&acc.to_le_bytes());
            }
        }
        data.truncate(bytes);
        Packed { bits, len: u32::try_from(owners.len()).unwrap_or(u32::MAX), mask: (1u16 << bits) - 1, data: data.into_boxed_slice() }
    }

    /// The byte entry `i` starts in, and its first bit there.
    #[inline(always)]
    fn bit_of(&self, i: usize) -> (usize, usize) {
        let bit = i * self.bits as usize;
        (bit >> 3, bit & 7)
    }

    /// Entry `i` (below `len`; 0 beyond).
    #[inline(always)]
    fn get(&self, i: usize) -> EndpointId {
        let (b, shift) = self.bit_of(i);
        let w = match self.data.get(b..b + 2) {
            Some(&[lo, hi]) => u16::from_le_bytes([lo, hi]),
            _ => 0,
        };
        (w >> shift) & self.mask
    }

    /// Sets entry `i` (below `len`) to `name` (below `1 << bits`).
    fn set(&mut self, i: usize, name: u16) {
        let (b, shift) = self.bit_of(i);
        if let Some(w) = self.data.get_mut(b..b + 2) {
            let old = u16::from_le_bytes([w[0], w[1]]);
            let new = (old & !(self.mask << shift)) | ((name & self.mask) << shift);
            w.copy_from_slice(&new.to_le_bytes());
        }
    }

    /// Where entry `i` starts.
    #[inline(always)]
    fn addr(&self, i: usize) -> *const u8 {
        self.data.as_ptr().wrapping_add(self.bit_of(i).0)
    }

    /// Bits per entry.
    pub fn bits(&self) -> u32 {
        self.bits
    }
}

impl fmt::Debug for Packed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Packed(len {}, {} bits)", self.len, self.bits)
    }
}

impl fmt::Debug for Entries {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entries::Packed(p) => write!(f, "Entries::{p:?}"),
            Entries::U16(e) => write!(f, "Entries::U16(len {})", e.len()),
        }
    }
}

impl Entries {
    /// Number of entries (M).
    pub fn len(&self) -> usize {
        match self {
            Entries::Packed(p) => p.len as usize,
            Entries::U16(e) => e.len(),
        }
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The identifier at entry `i`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> EndpointId {
        match self {
            Entries::Packed(p) => p.get(i),
            Entries::U16(e) => e[i],
        }
    }

    /// Bytes of heap memory used.
    pub fn heap_bytes(&self) -> usize {
        match self {
            Entries::Packed(p) => p.data.len(),
            Entries::U16(e) => e.len() * 2,
        }
    }

    /// Sets entry `i` (below the length) to `name` (which fits).
    fn set(&mut self, i: usize, name: u16) {
        match self {
            Entries::Packed(p) => p.set(i, name),
            Entries::U16(e) => {
                if let Some(x) = e.get_mut(i) {
                    *x = name;
                }
            }
        }
    }
}

/// A built table: entry `reduce(hash, M)` names the endpoint for a flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    entries: Entries,
}

/// Why a table cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TableError {
    /// M must be a prime (so every skip generates a full permutation).
    NotPrime(u32),
    /// An identifier is not below the limit.
    IdBeyondLimit {
        /// The identifier.
        id: EndpointId,
        /// The limit.
        limit: u32,
    },
    /// The same identifier appears twice.
    DuplicateId(EndpointId),
    /// The limit is 0 or above 65536.
    BadLimit(u32),
    /// An endpoint is missing from the order that names entries by
    /// position (see [`Table::build_positions`]).
    NotInOrder(EndpointId),
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TableError::NotPrime(m) => write!(f, "table size {m} is not a prime (next prime: {})", next_prime(*m)),
            TableError::IdBeyondLimit { id, limit } => {
                write!(f, "endpoint identifier {id} is not below the service's limit {limit}")
            }
            TableError::DuplicateId(id) => write!(f, "endpoint identifier {id} appears twice"),
            TableError::BadLimit(l) => write!(f, "endpoint limit {l} is outside 1..=65536"),
            TableError::NotInOrder(id) => write!(f, "endpoint identifier {id} is not among the service's endpoints"),
        }
    }
}

impl std::error::Error for TableError {}

/// True when `n` is prime.
pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    if n % 2 == 0 {
        return n == 2;
    }
    let mut d = 3u32;
    while u64::from(d) * u64::from(d) <= u64::from(n) {
        if n % d == 0 {
            return false;
        }
        d += 2;
    }
    true
}

/// The smallest prime >= `n`.
pub fn next_prime(n: u32) -> u32 {
    let mut m = n.max(2);
    while !is_prime(m) {
        m += 1;
    }
    m
}

/// The default table size for a service whose identifiers are below
/// `limit`: the smallest prime >= 200 x limit (at most 65537). At that
/// size a full service moves at most about 1.2/N of its flows when one of
/// its N endpoints leaves (see the tests), for 5 bits per entry at the
/// default limit of 32.
pub fn default_size(limit: u32) -> u32 {
    next_prime((limit.saturating_mul(200)).min(65537))
}

/// Share of the table above its weighted share that an endpoint may take.
pub const BALANCE_SLACK: f64 = 0.02;

/// Most replica walkers a table is built with; beyond it weights are
/// scaled down (each endpoint keeps at least one).
pub const MAX_REPLICAS: u32 = 8192;

/// One walk through a permutation of the table, on behalf of an endpoint.
#[derive(Clone, Copy)]
struct Walker {
    pos: u32,
    skip: u32,
    endpoint: u16,
    /// Slots claimed in the current batch of rounds (see [`fill_with`]).
    claimed: u32,
}

impl Table {
    /// Builds the table of size `m` (a prime) for `endpoints` given as
    /// (identifier, weight), identifiers below `limit`. Endpoints with
    /// weight 0 get no entries. An empty (or all-zero) set gives `None`.
    pub fn build(m: u32, limit: u32, endpoints: &[(EndpointId, u32)]) -> Result<Option<Table>, TableError> {
        Table::build_naming(m, limit, endpoints, None)
    }

    /// [`Table::build`], but each entry names its endpoint by position in
    /// `order` (identifiers, ascending, each once, holding every one of
    /// `endpoints`): entries take the bits `order.len()` positions need,
    /// fewer than the limit's when the service has fewer endpoints than
    /// its limit, and a service keeps its endpoints in a dense array.
    /// Same table as [`Table::build`], named differently.
    pub fn build_positions(m: u32, limit: u32, endpoints: &[(EndpointId, u32)], order: &[EndpointId]) -> Result<Option<Table>, TableError> {
        Table::build_naming(m, limit, endpoints, Some(order))
    }

    fn build_naming(m: u32, limit: u32, endpoints: &[(EndpointId, u32)], order: Option<&[EndpointId]>) -> Result<Option<Table>, TableError> {
        if !is_prime(m) {
            return Err(TableError::NotPrime(m));
        }
        if limit == 0 || limit > 65536 {
            return Err(TableError::BadLimit(limit));
        }
        let mut eps: Vec<(EndpointId, u32)> = endpoints.to_vec();
        eps.sort_unstable();
        for w in eps.windows(2) {
            if w[0].0 == w[1].0 {
                return Err(TableError::DuplicateId(w[0].0));
            }
        }
        if let Some(&(id, _)) = eps.iter().find(|(id, _)| u32::from(*id) >= limit) {
            return Err(TableError::IdBeyondLimit { id, limit });
        }
        eps.retain(|&(_, w)| w > 0);
        if eps.is_empty() {
            return Ok(None);
        }
        // What an entry says of each endpoint of `eps`: its identifier, or
        // its position in `order`; and how many names there are.
        let (names, count) = match order {
            None => (eps.iter().map(|e| e.0).collect::<Vec<_>>(), limit),
            Some(order) => {
                let mut names = Vec::with_capacity(eps.len());
                for &(id, _) in &eps {
                    let at = order.binary_search(&id).map_err(|_| TableError::NotInOrder(id))?;
                    // `order` holds distinct identifiers, at most 65536.
                    names.push(u16::try_from(at).unwrap_or(u16::MAX));
                }
                (names, u32::try_from(order.len()).unwrap_or(u32::MAX))
            }
        };
        // Names are below the count, so they fit.
        Ok(Some(Table { entries: populate(m, &eps, count, &names) }))
    }

    /// Table size M.
    pub fn size(&self) -> u32 {
        u32::try_from(self.entries.len()).unwrap_or(u32::MAX)
    }

    /// The endpoint for a flow hash.
    #[inline(always)]
    pub fn lookup(&self, hash: u64) -> EndpointId {
        self.entries.get(reduce(hash, self.size()) as usize)
    }

    /// Where the entry for a flow hash lives (for a prefetch; not read).
    #[inline(always)]
    pub fn entry_addr(&self, hash: u64) -> *const u8 {
        let i = reduce(hash, self.size()) as usize;
        match &self.entries {
            Entries::Packed(p) => p.addr(i),
            Entries::U16(e) => e.as_ptr().wrapping_add(i).cast(),
        }
    }

    /// The entries.
    pub fn entries(&self) -> &Entries {
        &self.entries
    }

    /// Bytes of heap memory used.
    pub fn heap_bytes(&self) -> usize {
        self.entries.heap_bytes()
    }

    /// Entries owned by each name (identifier or position), indexed by
    /// name; names are below `n`.
    pub fn counts(&self, n: u32) -> Vec<u32> {
        let mut c = vec![0u32; n as usize];
        for i in 0..self.entries.len() {
            c[usize::from(self.entries.get(i))] += 1;
        }
        c
    }
}

/// The entries for `count` names, `name(o)` for each of `owners`.
#[inline(always)]
fn named<T: Copy>(count: u32, owners: &[T], mut name: impl FnMut(T) -> u16) -> Entries {
    match entry_bits(count) {
        16 => Entries::U16(owners.iter().map(|&o| name(o)).collect()),
        bits => Entries::Packed(Packed::named(bits, owners, name)),
    }
}

/// Quota of each endpoint: its weighted share plus [`BALANCE_SLACK`],
/// rounded down, and never below the share rounded up (so quotas always
/// add up to at least M).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // bounded by m
fn quotas(m: u32, eps: &[(EndpointId, u32)]) -> Vec<u32> {
    let total: u64 = eps.iter().map(|e| u64::from(e.1)).sum();
    eps.iter()
        .map(|&(_, w)| {
            let share = f64::from(m) * f64::from(w) / total as f64;
            let q = (share * (1.0 + BALANCE_SLACK)).floor().max(share.ceil());
            (q as u32).clamp(1, m)
        })
        .collect()
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Replica walkers per endpoint: weights divided by their gcd, scaled down
/// proportionally (at least one each) when they add up to more than
/// [`MAX_REPLICAS`].
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // bounded by MAX_REPLICAS
fn replicas(eps: &[(EndpointId, u32)]) -> Vec<u32> {
    let g = eps.iter().fold(0, |g, e| gcd(g, e.1)).max(1);
    let r: Vec<u32> = eps.iter().map(|e| e.1 / g).collect();
    let total: u64 = r.iter().map(|&x| u64::from(x)).sum();
    if total <= u64::from(MAX_REPLICAS) {
        return r;
    }
    let scale = f64::from(MAX_REPLICAS) / total as f64;
    r.iter().map(|&x| ((f64::from(x) * scale).round() as u32).max(1)).collect()
}

/// When the free slots times the active walkers fall to this many times M,
/// [`populate`] stops probing and finishes with [`finish_by_events`]: the last
/// free slots are where a probing walker mostly finds taken ones (the
/// last 1 % of a table takes 60 % of the probes at M = 65537, N = 1000).
/// A probe costs about as much as a few dozen first-visit steps of
/// [`Visits::first_of`] (one slot, one walker, in vector lanes): at 8,
/// about 1,300 of 65537 slots go by events at N = 1000 (5,200 at N =
/// 100). Against a scalar event finish from a threshold of 1, this one
/// takes about 0.8 of the time at 8 (0.7 at N = 100) when probes miss the
/// caches, about the same when they hit, and 1.2 (1.3) at 32
/// (`bench/maglev_ab.sh`).
const EVENT_TAIL: u64 = 8;

/// The population, as entries naming each endpoint of `eps` (sorted,
/// non-empty, weights > 0) by `names` (below `count`).
///
/// Each endpoint walks its permutation with one walker per replica (weight
/// unit), all walkers taking turns in a fixed order, one slot per turn,
/// taking the slot only when it is free. An endpoint at its quota stops.
///
/// Both ways of computing it run compiled for the widest vectors the CPU
/// has ([`Population`]).
fn populate(m: u32, eps: &[(EndpointId, u32)], count: u32, names: &[u16]) -> Entries {
    if eps.len() == 1 {
        // One endpoint owns every entry. (The walk would find the same,
        // slowly: one walker is below the event threshold from the start,
        // so every entry would go through the event queue; 0.4 ms at
        // M = 6421, the whole cold compile of 10,000 one-endpoint services
        // three times over.)
        return named(count, &vec![0u16; m as usize], |o| names[usize::from(o)]);
    }
    let reps = replicas(eps);
    let walkers = reps.iter().map(|&r| r as usize).sum::<usize>();
    let first_visits_from = (walkers <= FIRST_VISITS_MAX && m < FIRST_VISITS_M).then(|| guess_late(m, walkers));
    Arch::new().dispatch(Population { m, eps, reps: &reps, count, names, first_visits_from })
}

/// A population ([`fill_by_first_visits`] for a few walkers, else
/// [`fill_with`] and the naming), compiled for the widest vectors the CPU
/// has (chosen when the table is built, by `pulp`: AVX-512, AVX2, else the
/// SSE4.1 the build assumes). Its passes over every slot are plain integer
/// loops the compiler vectorizes, so each width computes the same entries
/// (test `every_vector_width_builds_the_same_table`). At M = 6421 and 10
/// walkers, the first-visit pass takes about 4 µs with AVX-512 against 10
/// with SSE4.1, the whole build about 0.8 of the time; probing gains less
/// (about 0.93 of the time at M = 65537 and 1,000 endpoints).
struct Population<'a> {
    m: u32,
    eps: &'a [(EndpointId, u32)],
    reps: &'a [u32],
    count: u32,
    names: &'a [u16],
    /// By first visits, the late ones from this key on (see
    /// [`guess_late`]); `None`: by probing.
    first_visits_from: Option<u32>,
}

impl WithSimd for Population<'_> {
    type Output = Entries;

    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> Entries {
        let Population { m, eps, reps, count, names, first_visits_from } = self;
        match first_visits_from {
            Some(from) => fill_by_first_visits(m, eps, reps, count, names, from),
            None => named(count, &fill_with(m, eps, reps, EVENT_TAIL), |o| names[usize::from(o)]),
        }
    }
}

/// For each entry, the index into `eps` of the endpoint that owns it.
#[cfg(test)]
fn fill(m: u32, eps: &[(EndpointId, u32)]) -> Vec<u16> {
    let (count, names) = positions(eps);
    owners(&populate(m, eps, count, &names))
}

/// Names that are positions in `eps`, and how many.
#[cfg(test)]
fn positions(eps: &[(EndpointId, u32)]) -> (u32, Vec<u16>) {
    (u32::try_from(eps.len()).unwrap_or(u32::MAX), (0..u16::try_from(eps.len()).unwrap_or(u16::MAX)).collect())
}

/// The names of all entries.
#[cfg(test)]
fn owners(e: &Entries) -> Vec<u16> {
    (0..e.len()).map(|i| e.get(i)).collect()
}

/// Most walkers (replicas in all) for which [`populate`] computes every slot's
/// first visit ([`fill_by_first_visits`]) instead of probing: that costs M
/// x walkers steps of a few vector instructions, probing about M x ln
/// walkers probes of a random bitmap access each.
const FIRST_VISITS_MAX: usize = 24;

/// Table sizes below which a first visit fits a `u32` key (and two do).
const FIRST_VISITS_M: u32 = 1 << 23;

/// Spans of rounds [`full_span`] counts first visits in.
const SPANS: usize = 64;

/// Slots a walker steps through at once in [`first_visits`]: the lanes of
/// its inner loop, which the compiler turns into vector code.
const LANES: usize = 16;

/// [`populate`] for a few walkers (at most [`FIRST_VISITS_MAX`], M below
/// [`FIRST_VISITS_M`]), from the definition's other side: a slot goes to
/// its first visitor, the walker that reaches it in the fewest rounds
/// (earliest in turn order among those reaching it in the same round),
/// unless that walker's endpoint filled up before.
///
/// The first visits come from [`first_visits`]. One pass names each slot
/// after its first visitor's endpoint, counts each walker's first visits
/// and keeps the late ones, those from key `from` on (see [`guess_late`];
/// any `from` gives the same table). When no endpoint has more first
/// visits than its quota before them, every earlier first visit claims its
/// slot; otherwise the first visits are counted by endpoint in [`SPANS`]
/// spans of rounds, and the late ones are those from the first span in
/// which an endpoint goes beyond its quota. The late ones are walked in
/// (round, turn) order up to the first visit beyond an endpoint's room;
/// the rest goes by events from the top of that round, as [`fill_with`]
/// finishes ([`Visits::hand_out`]), with the first visits already known,
/// and the slots it hands to another endpoint are named again.
#[allow(clippy::cast_possible_truncation)] // rounds below M < 2^23
#[inline(always)]
fn fill_by_first_visits(m: u32, eps: &[(EndpointId, u32)], reps: &[u32], count: u32, names: &[u16], from: u32) -> Entries {
    let md = Modulus::new(m);
    let mut walkers = walkers(m, eps, reps);
    let inverse: Vec<u64> = walkers.iter().map(|w| md.inverse(u64::from(w.skip))).collect();
    let best = first_visits(m, md, &walkers, &inverse);
    // The endpoint and the name of each turn (keys name turns below 256).
    let mut endpoint_at = [0u16; 256];
    let mut name_at = [0u16; 256];
    for ((e, n), w) in endpoint_at.iter_mut().zip(&mut name_at).zip(&walkers) {
        *e = w.endpoint;
        *n = names[usize::from(w.endpoint)];
    }
    let endpoint_of = |key: u32| usize::from(endpoint_at[(key & 0xff) as usize]);
    // Each slot to its first visitor's endpoint, in one pass that also
    // counts the first visits of each turn; then the late ones, the keys
    // from `from` on, in a pass of their own. (Kept in the naming pass,
    // without a branch, their count would live on the stack, and each slot
    // wait for the store of the one before: about 1.09 times this build's
    // time at M = 6421 and 10 endpoints. Named by a closure without the
    // count, the naming is vectorized with a lane insert per entry: about
    // 1.15 times the time of naming and counting in one pass.)
    let mut by_turn = [0u32; 256];
    let mut entries = named(count, &best, |k| {
        by_turn[(k & 0xff) as usize] += 1;
        name_at[(k & 0xff) as usize]
    });
    let mut late = Vec::with_capacity(best.len() / 8);
    late.extend(best.iter().copied().filter(|&k| k >= from));
    let mut room = quotas(m, eps);
    // The first visits of each endpoint before the late ones.
    let below = |late: &[u32]| {
        let mut turns = by_turn;
        for &k in late {
            turns[(k & 0xff) as usize] -= 1;
        }
        let mut below = vec![0u32; eps.len()];
        for (&e, &c) in endpoint_at.iter().zip(&turns).take(walkers.len()) {
            below[usize::from(e)] += c;
        }
        below
    };
    // When no endpoint has more first visits than its quota before the
    // late ones, each of those claims its slot. Otherwise the first visits
    // are counted by endpoint in [`SPANS`] spans of rounds, and the late
    // ones are those from the first span in which an endpoint goes beyond
    // its quota.
    let mut before = below(&late);
    if before.iter().zip(&room).any(|(b, r)| b > r) {
        let from = full_span(m, &best, &endpoint_at, &room);
        late.clear();
        late.extend(best.iter().copied().filter(|&k| k >= from));
        before = below(&late);
    }
    for (r, b) in room.iter_mut().zip(&before) {
        *r -= b;
    }
    // The late ones in (round, turn) order, until an endpoint has no room:
    // the round of that visit is the first one not handed out as it is.
    late.sort_unstable();
    let mut claims = 0;
    for &k in &late {
        let e = endpoint_of(k);
        if room[e] == 0 {
            break;
        }
        room[e] -= 1;
        claims += 1;
    }
    let Some(&stop) = late.get(claims) else {
        return entries;
    };
    // Events from the top of its round; its turns before that visit are
    // done (the events only look at later visits).
    let full_round = stop >> 8;
    let first: Vec<u64> = late[claims..].iter().map(|&k| (u64::from((k >> 8) - full_round) << 32) | u64::from(k & 0xff)).collect();
    // The walkers at the top of that round.
    for w in &mut walkers {
        w.pos = w.after(md, u64::from(full_round));
    }
    Visits::new(m, &walkers, inverse).hand_out(first, &mut room, |slot, e| entries.set(slot as usize, names[usize::from(e)]));
    entries
}

/// Each slot's first visit, as a key `r << 8 | t`: the least, over the
/// walkers `t` (at most 256), of the rounds `r` walker `t` takes to reach
/// it, ties to the earliest turn.
///
/// Walker `t` starting at `pos` with `skip` reaches slot `s` after `r_t(s)
/// = (s - pos) / skip mod M` rounds, so `r_t(s + 1) = r_t(s) + 1 / skip mod
/// M`: each walker adds a constant to a key per slot, and each slot keeps
/// the least key, in a loop without branches or random accesses, two
/// walkers a pass (half the loads and stores of the slots' keys).
#[allow(clippy::cast_possible_truncation)] // rounds below M < 2^23
#[inline(always)]
fn first_visits(m: u32, md: Modulus, walkers: &[Walker], inverse: &[u64]) -> Vec<u32> {
    // Keys (r << 8 | t) stay below 2 * (M << 8) < 2^32.
    let mk = m << 8;
    // Each walker's keys for the first LANES slots, and what a step of
    // LANES slots adds to them.
    let lanes: Vec<([u32; LANES], u32)> = (0u32..)
        .zip(walkers.iter().zip(inverse))
        .map(|(t, (w, &inv))| {
            let r0 = |s: u64| md.mul(md.reduce(s + u64::from(m - w.pos)), inv);
            // Below M, so below 2^23: the conversions hold.
            let key: [u32; LANES] = std::array::from_fn(|j| ((r0(j as u64) as u32) << 8) | t);
            (key, (md.mul(LANES as u64 % u64::from(m), inv) as u32) << 8)
        })
        .collect();
    let mut best = vec![u32::MAX; m as usize];
    for pair in lanes.chunks(2) {
        // Copies, kept in registers; an odd walker out goes with itself.
        let (mut ka, sa) = pair[0];
        let (mut kb, sb) = pair.get(1).copied().unwrap_or(pair[0]);
        let mut chunks = best.chunks_exact_mut(LANES);
        for chunk in &mut chunks {
            for ((b, a), k) in chunk.iter_mut().zip(&mut ka).zip(&mut kb) {
                *b = (*b).min(*a).min(*k);
                let n = *a + sa;
                *a = n.min(n.wrapping_sub(mk));
                let n = *k + sb;
                *k = n.min(n.wrapping_sub(mk));
            }
        }
        for ((b, a), k) in chunks.into_remainder().iter_mut().zip(&ka).zip(&kb) {
            *b = (*b).min(*a).min(*k);
        }
    }
    best
}

/// A key from which about one first visit in twenty comes, for `walkers`
/// walkers: a slot's first visit is the least of their rounds, each about
/// uniform below M, so it comes at round `r` or later with probability
/// `(1 - r / M)^walkers`. Only speed depends on it: fewer late visits to
/// sort, but more often an endpoint beyond its quota before them, and a
/// pass to count spans. (At M = 6421 and 10 endpoints: 1 in 10 late, no
/// count in 2,000 random sets; 1 in 25, 8 %; both 0.75 to 0.8 of the
/// time of counting spans every time.)
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)] // below M < 2^23
fn guess_late(m: u32, walkers: usize) -> u32 {
    let round = f64::from(m) * (1.0 - 0.05f64.powf(1.0 / walkers as f64));
    (round as u32).min(m) << 8
}

/// The first key of the first of [`SPANS`] spans of rounds in which an
/// endpoint has more first visits than its `room`.
#[allow(clippy::cast_possible_truncation)] // spans below 64
fn full_span(m: u32, best: &[u32], endpoint_at: &[u16; 256], room: &[u32]) -> u32 {
    let shift = (u32::BITS - (m - 1).leading_zeros()).saturating_sub(6);
    let span = |key: u32| ((key >> 8) >> shift) as usize;
    let mut by_span = vec![0u32; room.len() * SPANS];
    for &k in best {
        by_span[usize::from(endpoint_at[(k & 0xff) as usize]) * SPANS + span(k)] += 1;
    }
    let full_span = by_span
        .chunks_exact(SPANS)
        .zip(room)
        .filter_map(|(spans, &r)| {
            let mut seen = 0;
            spans.iter().position(|&n| {
                seen += n;
                seen > r
            })
        })
        .min()
        .unwrap_or(SPANS);
    ((full_span as u32) << shift) << 8
}

/// [`populate`], switching to events when free slots x active walkers <=
/// `tail` x M (0: probe to the end; the tests compare the two).
///
/// The probe loop has no data-dependent branch in its source: a probe
/// that claims nothing writes its owner into a sink entry past the table
/// and adds zero to the counts. Walkers of an endpoint that reached its
/// quota are swept out at the end of the round (they could claim nothing
/// more, and the turn order of the others is unchanged).
///
/// Rounds go in batches in which no endpoint can reach its quota (each of
/// its walkers claims at most one slot a round): there a probe claims a
/// free slot without looking at the quota, and each walker counts its
/// claims, charged to its endpoint after the batch. The result is the
/// same; a probe costs about a third less.
#[inline(always)]
fn fill_with(m: u32, eps: &[(EndpointId, u32)], reps: &[u32], tail: u64) -> Vec<u16> {
    let mut room = quotas(m, eps);
    let mut active = walkers(m, eps, reps);
    // Occupancy as a bitmap (8 KiB for M = 65537): the probe loop's only
    // random read, kept in L1.
    let mut used = vec![0u64; (m as usize).div_ceil(64)];
    // Owners as indices into `eps`, plus the sink entry at index m.
    let mut owner = vec![0u16; m as usize + 1];
    let sink = m as usize;
    // The free slots a round's walkers reach, as (turn, slot).
    let mut open = vec![(0u32, 0u32); active.len()];
    let mut filled = 0u32;
    let to_events = |filled: u32, walkers: usize| u64::from(m - filled) * walkers as u64 <= tail * u64::from(m);
    // Batches until one would be a single round: from then on endpoints
    // are near their quotas, and rounds go one at a time.
    let mut batching = true;
    while filled < m {
        if to_events(filled, active.len()) {
            owner.truncate(m as usize);
            finish_by_events(m, &active, &mut room, &used, &mut owner);
            return owner;
        }
        let safe = if batching { safe_rounds(reps, &room) } else { 0 };
        batching = safe > 1;
        if batching {
            // `safe` rounds (or until the switch to events) with room for
            // every claim.
            for _ in 0..safe {
                if filled == m || to_events(filled, active.len()) {
                    break;
                }
                for w in &mut active {
                    let slot = w.pos;
                    let next = w.pos + w.skip;
                    w.pos = if next >= m { next - m } else { next };
                    let word = &mut used[(slot >> 6) as usize];
                    let claim = (!*word >> (slot & 63)) & 1;
                    *word |= claim << (slot & 63);
                    let mask = 0usize.wrapping_sub(claim as usize);
                    owner[sink ^ ((sink ^ slot as usize) & mask)] = w.endpoint;
                    w.claimed += claim as u32;
                    filled += claim as u32;
                }
            }
            for w in &mut active {
                room[usize::from(w.endpoint)] -= w.claimed;
                w.claimed = 0;
            }
            active.retain(|w| room[usize::from(w.endpoint)] != 0);
            continue;
        }
        // A round in two stages. First every walker steps, and the slots
        // free at the top of the round are noted (most are taken by now:
        // these probes only read). Then those are claimed in turn order,
        // each looked at again (an earlier turn may have claimed it this
        // round) and only while its endpoint has room. (In one stage, every
        // probe would write the bitmap and an owner entry, a sink one when
        // it claims nothing: 1.19-1.27 times this build's time at M =
        // 65537, N = 1000, `bench/maglev_ab.sh`. The batches above stay in
        // one stage: there most probes claim, and two stages would take
        // N = 100 to 1.23 times its time.)
        let mut seen = 0;
        for (turn, w) in (0u32..).zip(&mut active) {
            let slot = w.pos;
            let next = w.pos + w.skip;
            w.pos = if next >= m { next - m } else { next };
            let free = (!used[(slot >> 6) as usize] >> (slot & 63)) & 1;
            if let Some(c) = open.get_mut(seen) {
                *c = (turn, slot);
            }
            seen += free as usize;
        }
        let mut newly_full = false;
        for &(turn, slot) in &open[..seen] {
            let endpoint = active[turn as usize].endpoint;
            let e = usize::from(endpoint);
            let word = &mut used[(slot >> 6) as usize];
            // 1 when the slot is still free and the endpoint has room,
            // else 0, computed without a branch.
            let claim = (!*word >> (slot & 63)) & 1 & u64::from(room[e] != 0);
            *word |= claim << (slot & 63);
            let mask = 0usize.wrapping_sub(claim as usize);
            owner[sink ^ ((sink ^ slot as usize) & mask)] = endpoint;
            room[e] -= claim as u32;
            filled += claim as u32;
            newly_full |= (claim != 0) & (room[e] == 0);
        }
        if newly_full {
            active.retain(|w| room[usize::from(w.endpoint)] != 0);
        }
    }
    owner.truncate(m as usize);
    owner
}

impl Walker {
    /// The slot this walker reaches after `rounds` rounds (< M).
    fn after(&self, md: Modulus, rounds: u64) -> u32 {
        // rounds < m and skip < m < 2^24: below 2^48.
        u32::try_from(md.reduce(u64::from(self.pos) + rounds * u64::from(self.skip))).unwrap_or(0)
    }
}

/// How far `slot` lies ahead of `pos` around a table of `m` slots.
fn ahead(m: u32, pos: u32, slot: u32) -> u32 {
    if slot >= pos {
        slot - pos
    } else {
        slot + m - pos
    }
}

/// The walkers of `eps` with `reps` replicas each, in turn order: by
/// endpoint, then by replica.
fn walkers(m: u32, eps: &[(EndpointId, u32)], reps: &[u32]) -> Vec<Walker> {
    let mut out = Vec::with_capacity(reps.iter().map(|&r| r as usize).sum());
    for (i, (&(id, _), &r)) in eps.iter().zip(reps).enumerate() {
        for k in 0..r {
            let key = (u64::from(k) << 16) | u64::from(id);
            out.push(Walker {
                pos: reduce(hash_u64(key, SEED_OFFSET), m),
                skip: reduce(hash_u64(key, SEED_SKIP), m - 1) + 1,
                // Indices into `eps` are below the limit (<= 65536).
                endpoint: u16::try_from(i).unwrap_or(u16::MAX),
                claimed: 0,
            });
        }
    }
    out
}

/// Rounds that every active walker can probe without its endpoint reaching
/// its quota: the least, over endpoints with room (and so with walkers),
/// of room / walkers.
fn safe_rounds(reps: &[u32], room: &[u32]) -> u32 {
    reps.iter().zip(room).filter(|(_, &r)| r > 0).map(|(&w, &r)| r / w.max(1)).min().unwrap_or(0)
}

/// Reduction modulo a table size (< 2^24) of values below 2^48, by a
/// precomputed reciprocal instead of a division.
#[derive(Clone, Copy)]
struct Modulus {
    m: u64,
    reciprocal: u64,
}

impl Modulus {
    fn new(m: u32) -> Self {
        Modulus { m: u64::from(m), reciprocal: u64::MAX / u64::from(m) }
    }

    /// `a mod m`.
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // the high half of a u128 product
    fn reduce(self, a: u64) -> u64 {
        let q = ((u128::from(a) * u128::from(self.reciprocal)) >> 64) as u64;
        // q is floor(a / m) or one less (a < 2^48): one correction.
        let r = a - q * self.m;
        if r >= self.m {
            r - self.m
        } else {
            r
        }
    }

    /// `a * b mod m` for `a`, `b` < m.
    #[inline(always)]
    fn mul(self, a: u64, b: u64) -> u64 {
        self.reduce(a * b)
    }

    /// The inverse of `a` (0 < a < m, m prime): a^(m-2) mod m.
    fn inverse(self, a: u64) -> u64 {
        let (mut base, mut e, mut acc) = (a, self.m - 2, 1u64);
        while e > 0 {
            if e & 1 == 1 {
                acc = self.mul(acc, base);
            }
            base = self.mul(base, base);
            e >>= 1;
        }
        acc
    }
}

/// Finishes a population the probing left at the top of a round, with the
/// same result as probing on: instead of probing, computes when each
/// walker would next reach each free slot (walker at `pos` with `skip`
/// reaches slot `s` after `(s - pos) / skip mod M` rounds; every slot is
/// reached within M rounds), and hands out slots in the order the probes
/// would have found them, (round, turn order) (see [`Visits::hand_out`]).
#[inline(always)]
fn finish_by_events(m: u32, active: &[Walker], room: &mut [u32], used: &[u64], owner: &mut [u16]) {
    let md = Modulus::new(m);
    let visits = Visits::new(m, active, active.iter().map(|w| md.inverse(u64::from(w.skip))).collect());
    let mut free: Vec<u32> = Vec::new();
    for (base, &word) in (0u32..).step_by(64).zip(used) {
        let mut open = !word;
        while open != 0 {
            let s = base + open.trailing_zeros();
            if s >= m {
                break;
            }
            free.push(s);
            open &= open - 1;
        }
    }
    visits.hand_out(visits.first_of(&free), room, |slot, e| owner[slot as usize] = e);
}

/// When walkers at the top of a round visit slots: a visit is one `u64`,
/// `rounds << 32 | turn` (rounds from now, turn = index into the walkers),
/// and names its slot (a walker reaches one slot a round).
///
/// Where M and the walkers allow (M << turn bits below 2^32: every table
/// of the default sizes), visits are computed as `u32` keys `rounds <<
/// shift | turn`, with Shoup's multiplication by a precomputed constant
/// instead of a 64-bit reduction, in loops over many slots (or walkers)
/// at once that the compiler vectorizes; otherwise one at a time, in 64
/// bits. Both give the same visits (test
/// `compact_visits_are_the_wide_ones`).
struct Visits<'a> {
    m: u32,
    md: Modulus,
    active: &'a [Walker],
    /// The walkers' positions and the inverses of their skips, as plain
    /// arrays, so that the loops over them are running minima.
    pos: Vec<u32>,
    inverse: Vec<u64>,
    /// Bits of the turn in a `u32` key, when keys fit.
    shift: Option<u32>,
    /// The inverses as `u32`, and Shoup's constants for them,
    /// `floor(inverse * 2^32 / M)` (empty unless keys fit).
    inverse32: Vec<u32>,
    shoup: Vec<u32>,
}

/// Rounds until a walker at `pos` reaches `slot`: `(slot - pos) * inverse
/// mod m` (all below `m` < 2^31), by Shoup's multiplication with `shoup =
/// floor(inverse * 2^32 / m)`, without a branch.
#[allow(clippy::cast_possible_truncation)] // the high half of a 64-bit product
#[inline(always)]
fn rounds32(m: u32, pos: u32, inverse: u32, shoup: u32, slot: u32) -> u32 {
    // How far ahead: slot - pos, or that plus m when it wrapped.
    let d = slot.wrapping_sub(pos);
    let ahead = d.min(d.wrapping_add(m));
    let q = ((u64::from(ahead) * u64::from(shoup)) >> 32) as u32;
    // Below 2m: one correction.
    let r = ahead.wrapping_mul(inverse).wrapping_sub(q.wrapping_mul(m));
    r.min(r.wrapping_sub(m))
}

impl<'a> Visits<'a> {
    #[allow(clippy::cast_possible_truncation)] // inverses below m < 2^31; Shoup's constants below 2^32
    fn new(m: u32, active: &'a [Walker], inverse: Vec<u64>) -> Self {
        debug_assert!(active.is_sorted_by_key(|w| w.endpoint), "walkers in turn order, by endpoint");
        let turn_bits = usize::BITS - active.len().saturating_sub(1).leading_zeros();
        let shift = (m < 1 << 31 && (u64::from(m) << turn_bits) < 1 << 32).then_some(turn_bits);
        let (inverse32, shoup) = match shift {
            Some(_) => inverse.iter().map(|&i| (i as u32, ((i << 32) / u64::from(m)) as u32)).unzip(),
            None => (Vec::new(), Vec::new()),
        };
        Visits { m, md: Modulus::new(m), active, pos: active.iter().map(|w| w.pos).collect(), inverse, shift, inverse32, shoup }
    }

    /// Rounds until walker `turn` reaches `slot`.
    fn rounds_to(&self, turn: usize, slot: u32) -> u64 {
        self.md.mul(u64::from(ahead(self.m, self.pos[turn], slot)), self.inverse[turn])
    }

    /// A `u32` key (see [`Visits`]) as a visit.
    #[inline(always)]
    fn visit(shift: u32, key: u32) -> u64 {
        (u64::from(key >> shift) << 32) | u64::from(key & ((1u32 << shift) - 1))
    }

    /// The first visit of each of `slots`.
    #[allow(clippy::cast_possible_truncation)] // turns below 2^shift
    #[inline(always)]
    fn first_of(&self, slots: &[u32]) -> Vec<u64> {
        let Some(shift) = self.shift else {
            return slots.iter().map(|&s| self.wide_next(s, None, |_| true)).collect();
        };
        let mut best = vec![u32::MAX; slots.len()];
        for (turn, ((&p, &inv), &sh)) in (0u32..).zip(self.pos.iter().zip(&self.inverse32).zip(&self.shoup)) {
            for (b, &s) in best.iter_mut().zip(slots) {
                *b = (*b).min((rounds32(self.m, p, inv, sh, s) << shift) | turn);
            }
        }
        best.into_iter().map(|k| Visits::visit(shift, k)).collect()
    }

    /// The first visit of `slot` after `after` (if any) by a walker whose
    /// turn is open (`open(turn)`), one walker at a time in 64 bits.
    fn wide_next(&self, slot: u32, after: Option<u64>, open: impl Fn(usize) -> bool) -> u64 {
        let mut best = u64::MAX;
        for turn in (0..self.active.len()).filter(|&t| open(t)) {
            let v = (self.rounds_to(turn, slot) << 32) | turn as u64;
            if after.is_none_or(|a| v > a) {
                best = best.min(v);
            }
        }
        best
    }

    /// The first visit of `slot` after `visit` by a walker whose turn is
    /// open (`closed[turn]` 0, not all ones).
    #[allow(clippy::cast_possible_truncation)] // rounds below M, turns below 2^shift
    #[inline(always)]
    fn next_open(&self, slot: u32, visit: u64, closed: &[u32]) -> Option<u64> {
        let Some(shift) = self.shift else {
            return Some(self.wide_next(slot, Some(visit), |t| closed[t] == 0)).filter(|&v| v != u64::MAX);
        };
        let after = (((visit >> 32) as u32) << shift) | (visit & 0xffff_ffff) as u32;
        let mut best = u32::MAX;
        for (t, (((&p, &inv), &sh), &c)) in (0u32..).zip(self.pos.iter().zip(&self.inverse32).zip(&self.shoup).zip(closed)) {
            let k = (rounds32(self.m, p, inv, sh, slot) << shift) | t | c;
            best = best.min(if k > after { k } else { u32::MAX });
        }
        (best != u32::MAX).then(|| Visits::visit(shift, best))
    }

    /// The slot a visit names.
    fn slot_of(&self, visit: u64) -> u32 {
        self.active[(visit & 0xffff_ffff) as usize].after(self.md, visit >> 32)
    }

    /// Hands out the free slots whose first visits are `first` (one each),
    /// in the order of the visits, to the visitor's endpoint. A slot whose
    /// first visitor belongs to an endpoint that filled up meanwhile goes
    /// to the next visitor with room, as a probing walker of a full
    /// endpoint claims nothing. The first visits are sorted once, and only
    /// the visits that replace a full endpoint's go through a heap.
    #[inline(always)]
    fn hand_out(&self, mut first: Vec<u64>, room: &mut [u32], mut assign: impl FnMut(u32, u16)) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;

        // Per turn, all ones when its endpoint is full, else 0 (a key or'ed
        // with it is never the least). The walkers are in turn order, by
        // endpoint ([`walkers`]), so an endpoint's turns are a run of them.
        let mut closed: Vec<u32> = self.active.iter().map(|w| if room[usize::from(w.endpoint)] == 0 { u32::MAX } else { 0 }).collect();
        first.sort_unstable();
        let mut later: BinaryHeap<Reverse<u64>> = BinaryHeap::new();
        let mut next_first = 0;
        loop {
            let visit = match (first.get(next_first), later.peek()) {
                (Some(&a), Some(&Reverse(b))) if b < a => later.pop().map_or(a, |Reverse(b)| b),
                (Some(&a), _) => {
                    next_first += 1;
                    a
                }
                (None, Some(_)) => later.pop().map_or(0, |Reverse(b)| b),
                (None, None) => break,
            };
            let slot = self.slot_of(visit);
            let turn = (visit & 0xffff_ffff) as usize;
            let endpoint = self.active[turn].endpoint;
            let e = usize::from(endpoint);
            if room[e] != 0 {
                room[e] -= 1;
                assign(slot, endpoint);
                if room[e] == 0 {
                    let from = self.active.partition_point(|w| w.endpoint < endpoint);
                    for (c, _) in closed[from..].iter_mut().zip(&self.active[from..]).take_while(|(_, w)| w.endpoint == endpoint) {
                        *c = u32::MAX;
                    }
                }
                continue;
            }
            // Its endpoint is full: the next visit by a walker with room.
            let next = self.next_open(slot, visit, &closed);
            if let Some(v) = next {
                later.push(Reverse(v));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uniform(n: u16) -> Vec<(EndpointId, u32)> {
        (0..n).map(|i| (i, 1)).collect()
    }

    #[test]
    fn primes() {
        assert!(is_prime(65537) && is_prime(2) && is_prime(251) && !is_prime(1) && !is_prime(65535));
        assert_eq!(next_prime(6400), 6421);
        assert_eq!(default_size(32), 6421);
        assert_eq!(default_size(1000), 65537);
    }

    #[test]
    fn empty_and_single() {
        assert_eq!(Table::build(251, 8, &[]).unwrap(), None);
        assert_eq!(Table::build(251, 8, &[(3, 0)]).unwrap(), None, "weight 0 gets nothing");
        let t = Table::build(251, 8, &[(5, 1)]).unwrap().unwrap();
        assert!((0..251).all(|i| t.entries().get(i) == 5));
        assert_eq!(t.lookup(12345), 5);
    }

    #[test]
    fn rejects_bad_input() {
        assert_eq!(Table::build(100, 8, &[(0, 1)]), Err(TableError::NotPrime(100)));
        assert_eq!(Table::build(251, 8, &[(8, 1)]), Err(TableError::IdBeyondLimit { id: 8, limit: 8 }));
        assert_eq!(Table::build(251, 8, &[(1, 1), (1, 2)]), Err(TableError::DuplicateId(1)));
        assert_eq!(Table::build(251, 0, &[]), Err(TableError::BadLimit(0)));
        assert!(TableError::NotPrime(100).to_string().contains("101"));
    }

    fn ids(t: &Table) -> Vec<EndpointId> {
        owners(t.entries())
    }

    #[test]
    fn entry_width_follows_the_limit() {
        assert_eq!([1, 2, 3, 4, 5, 32, 33, 129, 256, 257].map(entry_bits), [1, 1, 2, 2, 3, 5, 6, 8, 8, 16]);
        let wide = Table::build(1009, 257, &uniform(10)).unwrap().unwrap();
        assert!(matches!(wide.entries(), Entries::U16(_)));
        assert_eq!(wide.heap_bytes(), 2018);
        // Every packed width holds the same table, and takes what
        // `entries_bytes` says (which the model budgets with).
        for limit in [10, 16, 17, 32, 100, 128, 200, 256] {
            let t = Table::build(1009, limit, &uniform(10)).unwrap().unwrap();
            let Entries::Packed(p) = t.entries() else { panic!("limit {limit}: not packed") };
            assert_eq!(p.bits(), entry_bits(limit));
            assert_eq!(t.heap_bytes() as u64, entries_bytes(limit, 1009));
            assert_eq!(ids(&t), ids(&wide), "limit {limit}");
        }
        assert_eq!(entries_bytes(32, 6421), 4015);
        assert_eq!(entries_bytes(257, 1009), 2018);
    }

    #[test]
    fn positions_name_the_same_table_in_the_bits_the_endpoints_need() {
        // Ten takers spread over a limit of 32, and two that take nothing
        // (draining: in the order, not in the table).
        let takers: Vec<(EndpointId, u32)> = [1u16, 4, 6, 9, 13, 17, 22, 25, 28, 31].iter().map(|&i| (i, 1 + u32::from(i % 3))).collect();
        let mut order: Vec<EndpointId> = takers.iter().map(|e| e.0).chain([0, 30]).collect();
        order.sort_unstable();
        let by_id = Table::build(6421, 32, &takers).unwrap().unwrap();
        let by_pos = Table::build_positions(6421, 32, &takers, &order).unwrap().unwrap();
        let Entries::Packed(p) = by_pos.entries() else { panic!("not packed") };
        assert_eq!((p.bits(), entry_bits(32)), (4, 5), "12 positions need 4 bits, 32 identifiers 5");
        assert_eq!(by_pos.heap_bytes() as u64, entries_bytes(12, 6421));
        assert!(by_pos.heap_bytes() as u64 <= entries_bytes(32, 6421), "the budget by limit holds");
        let named: Vec<EndpointId> = ids(&by_pos).iter().map(|&at| order[usize::from(at)]).collect();
        assert_eq!(named, ids(&by_id), "the same endpoint at every entry");
        assert!(!named.contains(&0) && !named.contains(&30));
        // Beyond 256 identifiers, a small service still packs.
        let wide = Table::build_positions(1009, 1000, &[(700, 1), (999, 1)], &[700, 999]).unwrap().unwrap();
        assert!(matches!(wide.entries(), Entries::Packed(_)));
        assert_eq!(Table::build_positions(1009, 32, &[(5, 1)], &[4, 6]), Err(TableError::NotInOrder(5)));
    }

    #[test]
    fn packed_entries_keep_every_bit_of_every_identifier() {
        // Identifiers with every bit pattern, across byte boundaries, for
        // each width: a wrong shift or mask shows here.
        for bits in 1..=8u32 {
            let n: u16 = 1 << bits;
            let owners: Vec<u16> = (0..1000u16).map(|i| i.wrapping_mul(37) % n).collect();
            // Names in reverse: each entry names its owner as given.
            let names: Vec<u16> = (0..n).rev().collect();
            let want: Vec<u16> = owners.iter().map(|&o| names[usize::from(o)]).collect();
            let mut p = Packed::named(bits, &owners, |o| names[usize::from(o)]);
            assert_eq!(p.data.len(), (1000 * bits as usize).div_ceil(8) + 1);
            assert_eq!((0..1000).map(|i| p.get(i)).collect::<Vec<_>>(), want, "{bits} bits");
            // Setting an entry changes it alone.
            let mut want = want;
            for i in [0usize, 1, 7, 8, 9, 500, 998, 999] {
                let name = (want[i] + 1) % n;
                p.set(i, name);
                want[i] = name;
                assert_eq!((0..1000).map(|i| p.get(i)).collect::<Vec<_>>(), want, "{bits} bits, set {i}");
            }
        }
    }

    #[test]
    fn deterministic_whatever_the_input_order() {
        let mut eps: Vec<(EndpointId, u32)> = (0..100).map(|i| (i * 3, 1 + u32::from(i % 4))).collect();
        let a = Table::build(65537, 1000, &eps).unwrap().unwrap();
        eps.reverse();
        let b = Table::build(65537, 1000, &eps).unwrap().unwrap();
        assert_eq!(a.entries(), b.entries());
        // A known prefix: tables must not change between versions either.
        let t = Table::build(13, 4, &uniform(3)).unwrap().unwrap();
        let first: Vec<u16> = (0..13).map(|i| t.entries().get(i)).collect();
        assert_eq!(first, GOLDEN_13_3.to_vec());
    }

    // Recorded from this implementation; a change means appliances of
    // different versions would disagree on flows.
    const GOLDEN_13_3: [u16; 13] = [1, 0, 2, 2, 0, 1, 0, 2, 1, 0, 2, 1, 0];

    #[test]
    fn balanced_when_m_is_100_times_n() {
        for n in [10u16, 100, 650] {
            let m = next_prime(u32::from(n) * 100);
            let t = Table::build(m, u32::from(n), &uniform(n)).unwrap().unwrap();
            let c = t.counts(u32::from(n));
            let mean = f64::from(m) / f64::from(n);
            let max = f64::from(*c.iter().max().unwrap());
            assert!(max / mean <= 1.02, "n={n} m={m}: max/mean {}", max / mean);
            // Below too: an endpoint left out (or starved) leaves the
            // others' maximum within 2 % when N is large, not their minimum.
            // The fill caps endpoints from above only: the least loaded
            // sits lower than the most loaded sits above (about 0.8 of
            // the mean at N = 650; the tables are fixed, so no flake).
            let min = f64::from(*c.iter().min().unwrap());
            assert!(min / mean >= 0.75, "n={n} m={m}: min/mean {}", min / mean);
        }
    }

    /// Fraction of entries (= of flows, hashes being uniform) that changed owner.
    fn moved(a: &Table, b: &Table) -> f64 {
        let m = a.entries().len();
        let changed = (0..m).filter(|&i| a.entries().get(i) != b.entries().get(i)).count();
        changed as f64 / m as f64
    }

    #[test]
    fn one_of_n_leaving_moves_about_one_nth() {
        // Default sizing (200 x N) for small services, M = 65537 for large ones.
        for (n, m) in [(5u16, 1009), (10, 2003), (25, 5003), (50, 65537), (100, 65537)] {
            let all = uniform(n);
            let before = Table::build(m, 65536, &all).unwrap().unwrap();
            for gone in (0..n).step_by(usize::from(n / 10).max(1)) {
                let rest: Vec<_> = all.iter().copied().filter(|e| e.0 != gone).collect();
                let after = Table::build(m, 65536, &rest).unwrap().unwrap();
                let f = moved(&before, &after);
                let share = f64::from(before.counts(65536)[usize::from(gone)]) / f64::from(m);
                assert!(f <= 1.2 / f64::from(n), "n={n} m={m} removing {gone}: moved {:.3}/N", f * f64::from(n));
                assert!(f >= share, "the leaver's entries all move");
                // Adding it back is the same change in reverse.
                assert_eq!(moved(&after, &before), f);
            }
        }
    }

    #[test]
    fn compact_visits_are_the_wide_ones() {
        // The u32 keys with Shoup's multiplication name the same visits as
        // the 64-bit reduction, for first visits and for the next visit
        // by an open walker after any visit.
        for (m, n) in [(13u32, 3u16), (251, 7), (6421, 24), (65537, 1000), (131_071, 20), (65537, 8192)] {
            let eps = uniform(n);
            let reps = replicas(&eps);
            let walkers = walkers(m, &eps, &reps);
            let md = Modulus::new(m);
            let inverse: Vec<u64> = walkers.iter().map(|w| md.inverse(u64::from(w.skip))).collect();
            let compact = Visits::new(m, &walkers, inverse.clone());
            assert!(compact.shift.is_some(), "m {m} n {n}");
            let mut wide = Visits::new(m, &walkers, inverse);
            wide.shift = None;
            let slots: Vec<u32> = (0..m).step_by((m as usize / 300).max(1)).chain([m - 1]).collect();
            let first = compact.first_of(&slots);
            assert!(first == wide.first_of(&slots), "m {m} n {n}");
            let closed: Vec<u32> = (0..walkers.len()).map(|t| if hash_u64(t as u64, 9) % 3 == 0 { u32::MAX } else { 0 }).collect();
            for (&s, &v) in slots.iter().zip(&first) {
                assert_eq!(compact.slot_of(v), s);
                let later = (v >> 32) + hash_u64(u64::from(s), 5) % u64::from(m);
                for after in [v, (later.min(u64::from(m) - 1) << 32) | (v & 0xffff)] {
                    assert_eq!(compact.next_open(s, after, &closed), wide.next_open(s, after, &closed), "m {m} n {n} slot {s}");
                }
            }
        }
    }

    #[test]
    fn finishing_by_events_gives_the_probing_result() {
        // Probing to the end is the definition; the event finish must give
        // the same table for any sizes, weights and switch point.
        let mut cases: Vec<(u32, Vec<(EndpointId, u32)>)> =
            vec![(13, uniform(3)), (251, uniform(7)), (65537, uniform(1000)), (131_071, uniform(20))];
        for seed in 0..40u64 {
            let n = 1 + (hash_u64(seed, 1) % 300) as u16;
            let m = next_prime(u32::from(n) * (2 + (hash_u64(seed, 2) % 200) as u32)).min(65537);
            let eps = (0..n).map(|i| (i * 2, 1 + (hash_u64(u64::from(i), seed) % 5) as u32)).collect();
            cases.push((m, eps));
        }
        for (m, eps) in cases {
            let reps = replicas(&eps);
            let probed = fill_with(m, &eps, &reps, 0);
            for tail in [1, 2, 8, 1000] {
                assert!(fill_with(m, &eps, &reps, tail) == probed, "m {m} n {} tail {tail}", eps.len());
            }
        }
    }

    /// The population by its definition, plainly: walkers take turns, one
    /// slot each per round, claiming it when free and their endpoint is
    /// below its quota.
    fn fill_by_definition(m: u32, eps: &[(EndpointId, u32)]) -> Vec<u16> {
        let mut room = quotas(m, eps);
        let mut walkers: Vec<(u32, u32, usize)> = Vec::new();
        for (i, (&(id, _), &r)) in eps.iter().zip(&replicas(eps)).enumerate() {
            for k in 0..r {
                let key = (u64::from(k) << 16) | u64::from(id);
                walkers.push((reduce(hash_u64(key, SEED_OFFSET), m), reduce(hash_u64(key, SEED_SKIP), m - 1) + 1, i));
            }
        }
        let mut owner: Vec<Option<u16>> = vec![None; m as usize];
        let mut filled = 0;
        while filled < m {
            for (pos, skip, e) in &mut walkers {
                let slot = *pos as usize;
                *pos = (*pos + *skip) % m;
                if owner[slot].is_none() && room[*e] > 0 {
                    owner[slot] = Some(u16::try_from(*e).unwrap());
                    room[*e] -= 1;
                    filled += 1;
                }
            }
        }
        owner.into_iter().map(Option::unwrap).collect()
    }

    #[test]
    fn the_population_is_its_definition() {
        // Batched probing and the event finish are ways of computing the
        // definition faster; every table must be the one it gives.
        let mut cases: Vec<(u32, Vec<(EndpointId, u32)>)> = vec![
            (13, uniform(3)),
            (6421, (0..10).map(|i| (i * 3, 1)).collect()),
            (6421, (0..32).map(|i| (i, 1 + u32::from(i % 3))).collect()),
            (65537, uniform(100)),
            (65537, (0..50).map(|i| (i, if i == 0 { 1000 } else { 1 })).collect()),
        ];
        for seed in 0..60u64 {
            let n = 2 + (hash_u64(seed, 3) % 60) as u16;
            let m = next_prime(u32::from(n) * (2 + (hash_u64(seed, 4) % 300) as u32)).min(65537);
            let eps = (0..n).map(|i| (i * 3, 1 + (hash_u64(u64::from(i), seed) % 7) as u32)).collect();
            cases.push((m, eps));
        }
        for (m, eps) in cases {
            assert!(fill(m, &eps) == fill_by_definition(m, &eps), "m {m} n {}", eps.len());
        }
    }

    #[test]
    fn first_visits_give_the_definition() {
        // Every slot to its first visitor, and by events once an endpoint
        // is full: the same table as the walk, for tables smaller than the
        // lanes, one walker to the most, weights, and both regimes (at M =
        // 6421, four endpoints mostly stay within their quotas, sixteen
        // mostly do not).
        let mut cases: Vec<(u32, Vec<(EndpointId, u32)>)> = vec![
            (2, uniform(2)),
            (3, vec![(0, 1), (5, 2)]),
            (13, uniform(3)),
            (17, uniform(17)),
            (31, vec![(4, 1)]),
            (6421, uniform(4)),
            (6421, (0..10).map(|i| (i * 3, 1)).collect()),
            (6421, (0..16).map(|i| (i * 2 + 1, 1)).collect()),
            (6421, (0..8).map(|i| (i, 1 + u32::from(i % 3))).collect()),
            (65537, uniform(24)),
        ];
        for seed in 0..80u64 {
            let n = 1 + (hash_u64(seed, 5) % 12) as u16;
            let m = next_prime(u32::from(n) * (1 + (hash_u64(seed, 6) % 400) as u32)).min(65537);
            let eps: Vec<(EndpointId, u32)> = (0..n).map(|i| (i * 5, 1 + (hash_u64(u64::from(i), seed) % 2) as u32)).collect();
            cases.push((m, eps));
        }
        for (m, eps) in cases {
            let reps = replicas(&eps);
            assert!(reps.iter().sum::<u32>() as usize <= FIRST_VISITS_MAX, "m {m} n {}", eps.len());
            let want = fill_by_definition(m, &eps);
            let (count, names) = positions(&eps);
            // Whatever the late visits are taken from: all of them, none
            // (so spans are counted whenever an endpoint goes beyond its
            // quota), or as many as the guess takes.
            for from in [0, u32::MAX, guess_late(m, reps.iter().sum::<u32>() as usize)] {
                let got = owners(&fill_by_first_visits(m, &eps, &reps, count, &names, from));
                assert!(got == want, "m {m} n {} late from {from}", eps.len());
            }
        }
    }

    #[test]
    fn every_vector_width_builds_the_same_table() {
        // The population runs compiled for the widest vectors the CPU has
        // (AVX-512, AVX2 or the build's SSE4.1); each width the CPU can run
        // gives the entries of the baseline build. (On a CPU without AVX2
        // only the baseline runs.)
        use pulp::Scalar;
        #[cfg(target_arch = "x86_64")]
        use pulp::x86::{V3, V4};
        let mut cases: Vec<(u32, Vec<(EndpointId, u32)>)> = vec![
            (6421, (0..10).map(|i| (i * 3, 1)).collect()),
            (6421, (0..20).map(|i| (i * 3, 1)).collect()),
            (6421, (0..8).map(|i| (i, 1 + u32::from(i % 3))).collect()),
            (6421, uniform(32)),
            (65537, uniform(300)),
            (65537, (0..200).map(|i| (i, 1 + u32::from(i % 8))).collect()),
        ];
        for seed in 0..20u64 {
            let n = 2 + (hash_u64(seed, 7) % 40) as u16;
            let m = next_prime(u32::from(n) * (50 + (hash_u64(seed, 8) % 200) as u32)).min(65537);
            cases.push((m, (0..n).map(|i| (i * 3, 1 + (hash_u64(u64::from(i), seed) % 3) as u32)).collect()));
        }
        for (m, eps) in cases {
            let base = populate_on(Scalar::new(), m, &eps);
            assert!(owners(&base) == fill(m, &eps), "m {m} n {}: the baseline differs from populate", eps.len());
            #[cfg(target_arch = "x86_64")]
            {
                if let Some(v3) = V3::try_new() {
                    assert!(populate_on(v3, m, &eps) == base, "m {m} n {}: AVX2", eps.len());
                }
                if let Some(v4) = V4::try_new() {
                    assert!(populate_on(v4, m, &eps) == base, "m {m} n {}: AVX-512", eps.len());
                }
            }
        }
    }

    /// [`populate`] compiled for `simd`'s instructions.
    fn populate_on<S: Simd>(simd: S, m: u32, eps: &[(EndpointId, u32)]) -> Entries {
        let reps = replicas(eps);
        let (count, names) = positions(eps);
        let walkers = reps.iter().sum::<u32>() as usize;
        let first_visits_from = (walkers <= FIRST_VISITS_MAX).then(|| guess_late(m, walkers));
        simd.vectorize(Population { m, eps, reps: &reps, count, names: &names, first_visits_from })
    }

    #[test]
    fn one_endpoint_fills_the_table_as_the_walk_would() {
        for (m, id, w) in [(13u32, 0u16, 1u32), (251, 7, 3), (6421, 31, 1), (65537, 1000, 8)] {
            let walked = fill_with(m, &[(id, w)], &replicas(&[(id, w)]), 0);
            assert!(walked.iter().all(|&o| o == 0));
            assert!(fill(m, &[(id, w)]) == walked, "m {m}");
            let t = Table::build(m, 1024, &[(id, w)]).unwrap().unwrap();
            assert!((0..64u64).all(|h| t.lookup(hash_u64(h, 9)) == id));
        }
    }

    #[test]
    fn modulus_reduces_like_the_remainder() {
        for m in [2u32, 13, 6421, 65537, 16_777_213] {
            let md = Modulus::new(m);
            for a in [0u64, 1, 12, u64::from(m) - 1, u64::from(m), u64::from(m) * u64::from(m) - 1, (1 << 48) - 1] {
                assert_eq!(md.reduce(a), a % u64::from(m), "{a} mod {m}");
            }
            if m > 2 {
                for a in 1..u64::from(m).min(500) {
                    assert_eq!(md.mul(a, md.inverse(a)), 1, "inverse of {a} mod {m}");
                }
            }
        }
    }

    #[test]
    fn quotas_cover_the_table_and_cap_the_share() {
        for (m, eps) in [(13u32, uniform(5)), (101, uniform(100)), (65537, vec![(0, 1), (1, 1_000_000)])] {
            let q = quotas(m, &eps);
            assert!(q.iter().map(|&x| u64::from(x)).sum::<u64>() >= u64::from(m));
        }
        let t = Table::build(1009, 8, &uniform(8)).unwrap().unwrap();
        let c = t.counts(8);
        assert_eq!(c.iter().sum::<u32>(), 1009);
        assert!(f64::from(*c.iter().max().unwrap()) <= 1009.0 / 8.0 * 1.02);
    }

    #[test]
    fn weights_are_respected_within_two_percent() {
        let eps: Vec<(EndpointId, u32)> = vec![(0, 1), (1, 2), (2, 3), (3, 10), (4, 1), (5, 7)];
        let m = 65537;
        let t = Table::build(m, 8, &eps).unwrap().unwrap();
        let c = t.counts(8);
        let total: u32 = eps.iter().map(|e| e.1).sum();
        for &(id, w) in &eps {
            let want = f64::from(m) * f64::from(w) / f64::from(total);
            let got = f64::from(c[usize::from(id)]);
            assert!((got - want).abs() / want <= 0.02, "id {id} weight {w}: {got} entries, want {want:.0}");
        }
    }
}
