//! Per-worker state: the flow table (which endpoint an established flow
//! uses) and the fragment table (which endpoint the first fragment of a
//! datagram went to). Both are fixed-size set-associative tables, allocated
//! once when the worker starts: a lookup or insert touches one bucket, never
//! allocates, and evicts the least recently used entry of a full bucket.

use crate::addr::Addr;
use crate::hash::flow_hash;
use crate::maglev::EndpointId;
use crate::parse::Flow;

/// Entries per bucket.
const WAYS: usize = 4;

/// Which endpoint of which service a flow (or datagram) was given.
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

#[derive(Clone, Copy, Debug, Default, bytemuck::Zeroable)]
struct FlowEntry {
    flow: Flow,
    pin: Pin,
    /// Last use, in seconds; 0 = empty.
    last: u32,
}

/// Counters of a table's behaviour.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Live entries replaced to make room.
    pub evictions: u64,
}

/// The flow table of one worker.
#[derive(Debug)]
pub struct FlowTable {
    entries: Box<[[FlowEntry; WAYS]]>,
    mask: usize,
    idle_secs: u32,
    /// What happened so far.
    pub stats: TableStats,
}

impl FlowTable {
    /// A table of at least `capacity` entries (rounded up to a power of two)
    /// whose entries expire after `idle_secs` without traffic.
    pub fn new(capacity: usize, idle_secs: u32) -> FlowTable {
        let buckets = capacity.div_ceil(WAYS).next_power_of_two().max(1);
        FlowTable {
            // Zeroed (= empty) memory: a bucket's page becomes resident
            // when a flow first lands in it.
            entries: bytemuck::zeroed_slice_box(buckets),
            mask: buckets - 1,
            idle_secs: idle_secs.max(1),
            stats: TableStats::default(),
        }
    }

    /// Where the bucket of (`flow`, `service`) lives (for a prefetch; not read).
    #[inline(always)]
    pub fn bucket_addr(&self, flow: &Flow, service: u32) -> *const u8 {
        self.entries.as_ptr().wrapping_add(self.bucket(flow, service)).cast()
    }

    /// Number of entries it holds at most.
    pub fn capacity(&self) -> usize {
        self.entries.len() * WAYS
    }

    #[inline(always)]
    #[allow(clippy::cast_possible_truncation)] // masked to the table size
    fn bucket(&self, flow: &Flow, service: u32) -> usize {
        (flow_hash(flow) ^ u64::from(service).wrapping_mul(0x9e37_79b9_7f4a_7c15)) as usize & self.mask
    }

    #[inline(always)]
    fn live(&self, e: &FlowEntry, now: u32) -> bool {
        e.last != 0 && now.wrapping_sub(e.last) <= self.idle_secs
    }

    /// The pin of `flow` in `service`, refreshing it; `now` in seconds (> 0).
    #[inline]
    pub fn lookup(&mut self, flow: &Flow, service: u32, now: u32) -> Option<Pin> {
        let b = self.bucket(flow, service);
        let idle = self.idle_secs;
        for e in &mut self.entries[b] {
            if e.last != 0 && now.wrapping_sub(e.last) <= idle && e.pin.service == service && e.flow == *flow {
                e.last = now;
                return Some(e.pin);
            }
        }
        None
    }

    /// The pin of `flow`, without refreshing it (for ICMP errors).
    #[inline]
    pub fn peek(&self, flow: &Flow, service: u32, now: u32) -> Option<Pin> {
        let b = self.bucket(flow, service);
        self.entries[b].iter().find(|e| self.live(e, now) && e.pin.service == service && e.flow == *flow).map(|e| e.pin)
    }

    /// Records `pin` for `flow`.
    #[inline]
    pub fn insert(&mut self, flow: &Flow, pin: Pin, now: u32) {
        let b = self.bucket(flow, pin.service);
        let now = now.max(1);
        let mut victim = 0;
        let mut oldest = u32::MAX;
        for (i, e) in self.entries[b].iter().enumerate() {
            if e.last != 0 && e.pin.service == pin.service && e.flow == *flow {
                victim = i;
                oldest = 0;
                break;
            }
            if !self.live(e, now) {
                victim = i;
                oldest = 0;
            } else if oldest != 0 && e.last < oldest {
                victim = i;
                oldest = e.last;
            }
        }
        if oldest != 0 {
            self.stats.evictions += 1;
        }
        self.entries[b][victim] = FlowEntry { flow: *flow, pin, last: now };
    }

    /// Live entries (walks the whole table: for status, not the fast path).
    pub fn len(&self, now: u32) -> usize {
        self.entries.iter().flatten().filter(|e| self.live(e, now)).count()
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
    entries: Box<[[FragEntry; WAYS]]>,
    mask: usize,
    ttl_ms: u64,
    /// What happened so far.
    pub stats: TableStats,
}

impl FragTable {
    /// A table of at least `capacity` entries, each valid `ttl_ms`.
    pub fn new(capacity: usize, ttl_ms: u64) -> FragTable {
        let buckets = capacity.div_ceil(WAYS).next_power_of_two().max(1);
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

    fn flow(i: u32) -> Flow {
        Flow { src: Addr::v4(i.to_be_bytes()), dst: Addr::v4([20, 0, 0, 1]), sport: 1000, dport: 80, proto: 6 }
    }

    fn pin(e: u16) -> Pin {
        Pin { service: 7, endpoint: e, incarnation: 1, at: e }
    }

    #[test]
    fn a_zeroed_entry_is_an_empty_default_one() {
        let (z, d): (FlowEntry, FlowEntry) = (bytemuck::Zeroable::zeroed(), FlowEntry::default());
        assert_eq!(format!("{z:?}"), format!("{d:?}"));
        let (z, d): (FragEntry, FragEntry) = (bytemuck::Zeroable::zeroed(), FragEntry::default());
        assert_eq!(format!("{z:?}"), format!("{d:?}"));
        let t = FlowTable::new(64, 10);
        assert_eq!(t.len(1), 0);
        assert_eq!(t.peek(&Flow::default(), 0, 1), None, "the all-zero flow is not found in an empty table");
    }

    /// Resident kilobytes of this process (Linux).
    fn rss_kib() -> Option<u64> {
        let s = std::fs::read_to_string("/proc/self/status").ok()?;
        s.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()
    }

    #[test]
    fn a_table_is_resident_only_where_flows_landed() {
        // 2^20 buckets: hundreds of MB of table, of which only the pages of
        // the buckets written become resident.
        // With transparent hugepages always on, the kernel may back a
        // touched bucket with a 2 MiB page: fewer flows then, so that the
        // pages they land in (at most 16 MiB) still stay far below the
        // table's size.
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").is_ok_and(|s| s.contains("[always]"));
        let flows = if thp { 8 } else { 1000 };
        let before = rss_kib().expect("VmRSS in /proc/self/status");
        let mut t = FlowTable::new(4 << 20, 10);
        let size_kib = (std::mem::size_of_val(&*t.entries) / 1024) as u64;
        assert!(size_kib >= 256 * 1024, "{size_kib} KiB");
        for i in 0..flows {
            t.insert(&flow(i), pin(1), 1);
        }
        let grown = rss_kib().unwrap_or(0).saturating_sub(before);
        // 1,000 flows touch at most 1,000 pages (4 MiB); other tests of
        // this binary allocate a little meanwhile.
        assert!(grown < 64 * 1024, "the table of {size_kib} KiB made the process {grown} KiB bigger ({flows} flows)");
        assert_eq!(t.len(1), flows as usize);
    }

    #[test]
    fn remembers_refreshes_and_expires() {
        let mut t = FlowTable::new(1024, 10);
        assert_eq!(t.lookup(&flow(1), 7, 100), None);
        t.insert(&flow(1), pin(3), 100);
        assert_eq!(t.lookup(&flow(1), 7, 105), Some(pin(3)));
        assert_eq!(t.lookup(&flow(1), 8, 105), None, "another service's flow");
        assert_eq!(t.lookup(&flow(1), 7, 115), Some(pin(3)), "refreshed at 105");
        assert_eq!(t.peek(&flow(1), 7, 126), None, "idle for 11 s");
        t.insert(&flow(1), pin(4), 130);
        assert_eq!(t.peek(&flow(1), 7, 131), Some(pin(4)));
        assert_eq!(t.len(131), 1);
    }

    #[test]
    fn bounded_with_lru_eviction() {
        let mut t = FlowTable::new(64, 1000);
        assert_eq!(t.capacity(), 64);
        for i in 0..10_000u32 {
            t.insert(&flow(i), pin(1), 1 + i / 100);
        }
        assert!(t.len(200) <= 64);
        assert!(t.stats.evictions >= 10_000 - 64);
        // The most recent flows survive.
        let recent = (9_900..10_000u32).filter(|&i| t.peek(&flow(i), 7, 200).is_some()).count();
        let old = (0..100u32).filter(|&i| t.peek(&flow(i), 7, 200).is_some()).count();
        assert!(recent > old, "recent {recent} old {old}");
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
