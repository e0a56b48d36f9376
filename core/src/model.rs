//! The flat internal model (the Cilium control-plane seed): routes,
//! services and endpoints as plain definitions, each owned by the source
//! that wrote it. Endpoints are kept apart from services, so they may
//! arrive before or after their service and from another source.
//!
//! [`Model::resolve`] merges every source and checks the whole: names are
//! valid and unique, references resolve, identifiers are unique and below
//! the service's limit, and every number is within [`limits`], whichever
//! source wrote it (a file, or a peer on the network). Every problem is
//! reported, with where it came from.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::RouteMatch;
use sluice_dataplane::maglev::{default_size, is_prime, next_prime};
use sluice_dataplane::service::Algorithm;

use crate::problem::{Pos, Problem, Problems};

/// The bounds of every number a user or a peer can set, shared by every
/// source (the configuration file, manifests and their annotations,
/// remote sources) and enforced again by [`Model::resolve`].
pub mod limits {
    /// Smallest endpoint limit (identifiers are `0..limit`).
    pub const ENDPOINT_LIMIT_MIN: u32 = 1;
    /// Largest endpoint limit: identifiers are the dataplane's `u16`.
    pub const ENDPOINT_LIMIT_MAX: u32 = 65536;
    /// Largest lookup-table size: the largest prime below 2^24 (16 MiB of
    /// one-byte entries, 32 MiB of two-byte ones). A table is never
    /// smaller than its service's endpoint limit.
    pub const TABLE_SIZE_MAX: u32 = 16_777_213;
    /// Heaviest endpoint weight (0 takes no new flows).
    pub const WEIGHT_MAX: u32 = 1 << 20;
    /// Default budget of all services' lookup tables together, in MiB
    /// (`capacity.tableMemoryMB`).
    pub(crate) const TABLE_MEMORY_MB_DEFAULT: u32 = 512;
    /// Smallest `capacity.tableMemoryMB`.
    pub(crate) const TABLE_MEMORY_MB_MIN: u32 = 1;
    /// Largest `capacity.tableMemoryMB`.
    pub(crate) const TABLE_MEMORY_MB_MAX: u32 = 65536;
    /// Longest name (services, routes, ports), as a DNS name.
    pub const NAME_MAX_LEN: usize = 253;
    /// Smallest port MTU (IPv4's minimum datagram size).
    pub(crate) const MTU_MIN: u16 = 576;
    /// Smallest MTU of a port with an IPv6 address (RFC 8200).
    pub(crate) const MTU_MIN_IPV6: u16 = 1280;
    /// Largest port MTU (jumbo frames).
    pub(crate) const MTU_MAX: u16 = 9600;
    /// A byte match reads bytes before this offset of the transport header
    /// (`offset + length`): none beyond the largest MTU.
    pub(crate) const BYTE_MATCH_END_MAX: u32 = MTU_MAX as u32;
    /// Shortest interval between two health checks of an endpoint, ms.
    pub const CHECK_INTERVAL_MS_MIN: u32 = 100;
    /// Longest, ms (an hour).
    pub const CHECK_INTERVAL_MS_MAX: u32 = 3_600_000;
    /// Default interval, ms.
    pub const CHECK_INTERVAL_MS_DEFAULT: u32 = 2000;
    /// Shortest timeout of a check, ms (at most its interval).
    pub const CHECK_TIMEOUT_MS_MIN: u32 = 10;
    /// Default timeout, ms.
    pub const CHECK_TIMEOUT_MS_DEFAULT: u32 = 1000;
    /// Default successes in a row that bring an endpoint back.
    pub const CHECK_RISE_DEFAULT: u32 = 2;
    /// Default failures in a row that take it out.
    pub const CHECK_FALL_DEFAULT: u32 = 3;
    /// Largest rise or fall.
    pub const CHECK_COUNT_MAX: u32 = 100;
    /// Longest text of a check (an HTTP path or host, a UDP datagram).
    pub const CHECK_TEXT_MAX: usize = 512;

    /// Bytes of a lookup table of `size` entries for a service of at most
    /// `limit` endpoints: the most the dataplane's `maglev::Entries` take
    /// (fewer endpoints may take fewer bits an entry), so the budget holds
    /// whatever endpoints come.
    pub(crate) fn table_bytes(limit: u32, size: u32) -> u64 {
        sluice_dataplane::maglev::entries_bytes(limit, size)
    }
}

/// True for a name the model accepts from any source (and can use as a
/// metrics label): printable ASCII without spaces, quotes or backslashes,
/// 1 to [`limits::NAME_MAX_LEN`] long. Control planes name things with
/// `:`, `/`, `|` or `@` (Envoy clusters like `outbound|80||web.default`);
/// the configuration file asks for the stricter [`simple_name`].
pub fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= limits::NAME_MAX_LEN && s.bytes().all(|c| c.is_ascii_graphic() && !b"\"'\\`".contains(&c))
}

/// A name as the configuration file writes it: ASCII letters, digits, `-`,
/// `_`, `.`; 1 to [`limits::NAME_MAX_LEN`] long.
pub(crate) fn simple_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= limits::NAME_MAX_LEN && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Where a definition came from: a file, the place in it, a path inside it.
/// Shared strings: a definition is copied from a source's state to the
/// resolved model without copying where it came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Origin {
    /// File (or source).
    pub file: Arc<str>,
    /// Line and column, when known.
    pub pos: Option<Pos>,
    /// Path in the file.
    pub path: Arc<str>,
}

impl Origin {
    /// A problem about what came from here.
    pub fn problem(&self, message: impl Into<String>) -> Problem {
        Problem::at(self.file.to_string(), self.pos, self.path.to_string(), message)
    }
}

/// `file:line:column: path`, as in problems.
impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.file)?;
        if let Some(p) = self.pos {
            write!(f, ":{}:{}", p.line, p.column)?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        Ok(())
    }
}

/// How packets reach a service's endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum DeliveryMode {
    /// NAT-less layer 2 (the endpoint is on a port's subnet and owns the VIP).
    #[default]
    L2,
    /// IP-in-IP to the endpoint's address.
    IpIp,
}

/// Why a delivery mode was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    /// A name that is neither `l2` nor `ipip`.
    #[error("unknown delivery {0:?} (expected l2 or ipip)")]
    Unknown(String),
}

impl std::str::FromStr for DeliveryMode {
    type Err = DeliveryError;
    fn from_str(s: &str) -> Result<Self, DeliveryError> {
        match s {
            "l2" => Ok(DeliveryMode::L2),
            "ipip" => Ok(DeliveryMode::IpIp),
            other => Err(DeliveryError::Unknown(other.to_owned())),
        }
    }
}

impl std::fmt::Display for DeliveryMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeliveryMode::L2 => "l2",
            DeliveryMode::IpIp => "ipip",
        })
    }
}

/// A route (L34Route).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDef {
    /// Unique name.
    pub name: String,
    /// The service it sends to.
    pub service: String,
    /// Higher wins.
    pub priority: i32,
    /// What it matches, shared by every layer that keeps the route (a
    /// source's state, the model, the resolved model, the compiler's
    /// classifier cache): 144 bytes and up to six lists once, not four
    /// times.
    pub matches: Arc<RouteMatch>,
    /// Where it came from.
    pub origin: Origin,
}

/// A service's own settings; unset ones take the appliance defaults.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ServiceDef {
    /// Unique name.
    pub name: String,
    /// Algorithm.
    pub algorithm: Option<Algorithm>,
    /// Endpoint identifier limit.
    pub limit: Option<u32>,
    /// Lookup-table size (prime).
    pub table_size: Option<u32>,
    /// Remember flows in a flow table.
    pub flow_table: Option<bool>,
    /// Delivery.
    pub delivery: Option<DeliveryMode>,
    /// Its endpoints' active health check, when one is configured.
    pub check: Option<Arc<CheckDef>>,
    /// Where it came from.
    pub origin: Origin,
}

/// What an active health check sends and what it takes for a success.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Probe {
    /// A TCP connection is accepted (then closed).
    Tcp,
    /// An HTTP/1.1 `GET path` answered with a status in one of `statuses`
    /// (inclusive ranges); over TLS with `tls` (HTTPS: the endpoint's
    /// certificate is not verified, its handshake is).
    Http {
        /// The path asked for.
        path: String,
        /// The `Host` header (default the endpoint's address).
        host: Option<String>,
        /// Statuses that are a success, as inclusive ranges.
        statuses: Vec<(u16, u16)>,
        /// Over TLS (`https`).
        tls: bool,
    },
    /// A UDP datagram `send` is answered by one containing `expect` (any
    /// answer when empty).
    Udp {
        /// The datagram sent.
        send: Vec<u8>,
        /// Bytes the answer must contain.
        expect: Vec<u8>,
    },
    /// A DNS query (UDP) for `name`, type A, answered by any well-formed
    /// DNS response to it, whatever its code.
    Dns {
        /// The name asked for.
        name: String,
    },
}

impl Probe {
    /// Its name in configuration and status.
    pub fn name(&self) -> &'static str {
        match self {
            Probe::Tcp => "tcp",
            Probe::Http { tls: false, .. } => "http",
            Probe::Http { tls: true, .. } => "https",
            Probe::Udp { .. } => "udp",
            Probe::Dns { .. } => "dns",
        }
    }
}

/// An active health check of a service's endpoints: every `interval_ms`
/// (spread over the interval and jittered), from the appliance's own
/// address to the endpoint's address and `port`. `fall` failures in a row
/// take an endpoint out of new flows, `rise` successes in a row bring it
/// back.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CheckDef {
    /// What is sent and expected.
    pub probe: Probe,
    /// The endpoint's port checked.
    pub port: u16,
    /// Milliseconds between two checks of an endpoint.
    pub interval_ms: u32,
    /// Milliseconds a check may take.
    pub timeout_ms: u32,
    /// Successes in a row that bring an endpoint back.
    pub rise: u32,
    /// Failures in a row that take it out.
    pub fall: u32,
    /// Where the check is addressed.
    pub target: CheckTarget,
}

/// Where a check is addressed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CheckTarget {
    /// The endpoint's own address.
    #[default]
    Endpoint,
    /// A VIP of the service (the lowest routed to it of the endpoint's
    /// family), through the endpoint: for NAT-less endpoints that listen on
    /// the VIP only. TCP, UDP and DNS checks: a SYN or a datagram to the
    /// VIP sent to the endpoint's MAC, whose answer comes back from the VIP.
    Vip,
}

/// `http/8080 GET /healthz every 500ms, timeout 300ms, rise 2, fall 3`.
impl std::fmt::Display for CheckDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.probe.name(), self.port)?;
        match &self.probe {
            Probe::Http { path, .. } => write!(f, " GET {path}")?,
            Probe::Dns { name } => write!(f, " {name} A")?,
            Probe::Udp { .. } | Probe::Tcp => {}
        }
        if self.target == CheckTarget::Vip {
            write!(f, " to the VIP")?;
        }
        write!(f, " every {}ms, timeout {}ms, rise {}, fall {}", self.interval_ms, self.timeout_ms, self.rise, self.fall)
    }
}

impl CheckDef {
    /// A check of `probe` on `port` with the default timing (2 s interval,
    /// 1 s timeout, rise 2, fall 3).
    pub fn new(probe: Probe, port: u16) -> CheckDef {
        CheckDef {
            probe,
            port,
            interval_ms: limits::CHECK_INTERVAL_MS_DEFAULT,
            timeout_ms: limits::CHECK_TIMEOUT_MS_DEFAULT,
            rise: limits::CHECK_RISE_DEFAULT,
            fall: limits::CHECK_FALL_DEFAULT,
            target: CheckTarget::Endpoint,
        }
    }

    /// What is wrong with it, whichever source wrote it: every number
    /// within [`limits`], the timeout within the interval.
    pub fn problems(&self) -> Vec<String> {
        use limits::*;
        let mut out = Vec::new();
        if self.port == 0 {
            out.push("a health check needs a port (1..65535)".to_owned());
        }
        if !(CHECK_INTERVAL_MS_MIN..=CHECK_INTERVAL_MS_MAX).contains(&self.interval_ms) {
            out.push(format!("health check interval {} ms is outside {CHECK_INTERVAL_MS_MIN}..={CHECK_INTERVAL_MS_MAX}", self.interval_ms));
        }
        if !(CHECK_TIMEOUT_MS_MIN..=self.interval_ms.max(CHECK_TIMEOUT_MS_MIN)).contains(&self.timeout_ms) {
            out.push(format!(
                "health check timeout {} ms is outside {CHECK_TIMEOUT_MS_MIN}..=the interval ({} ms)",
                self.timeout_ms, self.interval_ms
            ));
        }
        for (what, n) in [("rise", self.rise), ("fall", self.fall)] {
            if !(1..=CHECK_COUNT_MAX).contains(&n) {
                out.push(format!("health check {what} {n} is outside 1..={CHECK_COUNT_MAX}"));
            }
        }
        if self.target == CheckTarget::Vip && matches!(self.probe, Probe::Http { .. }) {
            out.push(format!("a check of the VIP (target: vip) is a tcp, udp or dns check; an {} check goes to the endpoint's own address", self.probe.name()));
        }
        match &self.probe {
            Probe::Http { path, host, statuses, .. } => {
                // RFC 3986's path and query characters (and %-escapes).
                let uri_char = |c: u8| c.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@/?%".contains(&c);
                if !path.starts_with('/') || path.len() > CHECK_TEXT_MAX || !path.bytes().all(uri_char) {
                    out.push(format!("health check path {path:?} must start with / and hold only a URI's path and query characters, at most {CHECK_TEXT_MAX} bytes"));
                }
                if host.as_ref().is_some_and(|h| h.is_empty() || h.len() > CHECK_TEXT_MAX || !h.bytes().all(|c| c.is_ascii_graphic())) {
                    out.push(format!("health check host {host:?} must be printable ASCII without spaces, 1 to {CHECK_TEXT_MAX} bytes"));
                }
                if statuses.is_empty() || statuses.iter().any(|&(lo, hi)| !(100..=599).contains(&lo) || !(lo..=599).contains(&hi)) {
                    out.push(format!("health check statuses {statuses:?} must be ranges within 100..=599"));
                }
            }
            Probe::Udp { send, expect } => {
                if send.is_empty() || send.len() > CHECK_TEXT_MAX || expect.len() > CHECK_TEXT_MAX {
                    out.push(format!("a UDP health check sends 1 to {CHECK_TEXT_MAX} bytes and expects at most as many"));
                }
            }
            Probe::Dns { name } => {
                let labels_ok = name == "." || name.trim_end_matches('.').split('.').all(|l| !l.is_empty() && l.len() <= 63 && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
                if name.is_empty() || name.len() > 253 || !labels_ok {
                    out.push(format!("health check query {name:?} is not a DNS name"));
                }
            }
            Probe::Tcp => {}
        }
        out
    }
}

/// An endpoint of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointDef {
    /// The service (shared by its endpoints), behind a thin pointer: an
    /// endpoint takes 48 bytes in each layer, not 64.
    pub service: Arc<String>,
    /// Identifier, stable while the endpoint is in the service.
    pub id: u32,
    /// Address.
    pub address: Addr,
    /// Relative weight.
    pub weight: u32,
    /// Draining: no new flows.
    pub draining: bool,
    /// Its MAC when known statically (else resolved by the kernel).
    pub mac: Option<[u8; 6]>,
    /// Where it came from, shared: the endpoints of one assignment have
    /// one origin, and each layer's copy of an endpoint (a source's state,
    /// the model, the resolved model) is 64 bytes, not 96.
    pub origin: Arc<Origin>,
}

/// Everything one source wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Routes.
    pub routes: Vec<RouteDef>,
    /// Services.
    pub services: Vec<ServiceDef>,
    /// Endpoints.
    pub endpoints: Endpoints,
}

/// A source's endpoints, in runs that are shared whole: the xDS source
/// hands over one run per service, the one its mapping holds, and the
/// resolved model takes a run as its service's endpoints when the run is
/// all of them (in identifier order, every one admitted). With 100,000
/// endpoints, one allocation then serves the three layers that held a
/// copy each (4.8 MB a copy). Equal when the endpoints are, however split.
#[derive(Clone, Debug, Default)]
pub struct Endpoints {
    runs: Vec<Arc<[EndpointDef]>>,
    len: usize,
}

impl Endpoints {
    /// The endpoints of `runs`, in that order (empty runs are left out).
    pub fn from_runs(runs: impl IntoIterator<Item = Arc<[EndpointDef]>>) -> Endpoints {
        let runs: Vec<Arc<[EndpointDef]>> = runs.into_iter().filter(|r| !r.is_empty()).collect();
        let len = runs.iter().map(|r| r.len()).sum();
        Endpoints { runs, len }
    }

    /// The runs.
    pub(crate) fn runs(&self) -> &[Arc<[EndpointDef]>] {
        &self.runs
    }

    /// Every endpoint, run after run.
    pub fn iter(&self) -> impl Iterator<Item = &EndpointDef> + '_ {
        self.runs.iter().flat_map(|r| r.iter())
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.len
    }

    /// None at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of every endpoint, to change.
    pub fn to_vec(&self) -> Vec<EndpointDef> {
        self.iter().cloned().collect()
    }

    /// Adds `run` (nothing when it is empty).
    pub(crate) fn push_run(&mut self, run: Vec<EndpointDef>) {
        if !run.is_empty() {
            self.len += run.len();
            self.runs.push(run.into());
        }
    }

    /// Adds the runs of `other` (shared, not copied).
    pub fn append(&mut self, other: &Endpoints) {
        self.runs.extend(other.runs.iter().cloned());
        self.len += other.len;
    }

    /// True when every run holds one service's endpoints and the runs are
    /// in service-name order, each service in one run: a service's run is
    /// then found by binary search.
    fn by_service(&self) -> bool {
        self.runs.iter().all(|r| r.iter().all(|e| e.service == r[0].service)) && self.runs.windows(2).all(|w| w[0][0].service < w[1][0].service)
    }

    /// In a source whose runs are by service: where `service`'s run is,
    /// or would be.
    fn run_of(&self, service: &str) -> Result<usize, usize> {
        self.runs.binary_search_by(|r| r[0].service.as_str().cmp(service))
    }
}

impl From<Vec<EndpointDef>> for Endpoints {
    fn from(v: Vec<EndpointDef>) -> Endpoints {
        Endpoints::from_runs([Arc::from(v)])
    }
}

impl FromIterator<EndpointDef> for Endpoints {
    fn from_iter<I: IntoIterator<Item = EndpointDef>>(it: I) -> Endpoints {
        Endpoints::from(it.into_iter().collect::<Vec<_>>())
    }
}

impl PartialEq for Endpoints {
    fn eq(&self, other: &Endpoints) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl Eq for Endpoints {}

/// Appliance-wide defaults for services, and their shared budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Defaults {
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Endpoint limit.
    pub limit: u32,
    /// Flow table on.
    pub flow_table: bool,
    /// Delivery.
    pub delivery: DeliveryMode,
    /// Memory all services' lookup tables may take together, in MiB
    /// (`capacity.tableMemoryMB`).
    pub table_memory_mb: u32,
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            algorithm: Algorithm::Maglev,
            limit: 32,
            flow_table: true,
            delivery: DeliveryMode::L2,
            table_memory_mb: limits::TABLE_MEMORY_MB_DEFAULT,
        }
    }
}

/// A service with every setting decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedService {
    /// Name.
    pub name: String,
    /// Algorithm.
    pub algorithm: Algorithm,
    /// Limit.
    pub limit: u32,
    /// Table size.
    pub table_size: u32,
    /// Flow table.
    pub flow_table: bool,
    /// Delivery.
    pub delivery: DeliveryMode,
    /// Endpoints, by identifier: shared with the compiler, which keeps
    /// what it compiled from (not a copy).
    pub endpoints: Arc<[EndpointDef]>,
    /// Its endpoints' active health check.
    pub check: Option<Arc<CheckDef>>,
}

/// The merged, checked model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    /// Routes, by name.
    pub routes: Vec<RouteDef>,
    /// Services, by name.
    pub services: BTreeMap<String, ResolvedService>,
}

impl Resolved {
    /// Number of endpoints in all services.
    pub fn endpoint_count(&self) -> usize {
        self.services.values().map(|s| s.endpoints.len()).sum()
    }
}

/// Definitions by source.
#[derive(Clone, Debug, Default)]
pub struct Model {
    sources: BTreeMap<String, Desired>,
    /// The sources whose endpoints are in service-name order (the xDS
    /// source's are): a service's endpoints are found by binary search.
    by_service: BTreeSet<String>,
}

impl Model {
    /// Replaces everything `source` owns with `desired` (upsert and prune);
    /// returns what it owned before.
    pub fn set(&mut self, source: &str, desired: Desired) -> Option<Desired> {
        if desired.endpoints.by_service() {
            self.by_service.insert(source.to_owned());
        } else {
            self.by_service.remove(source);
        }
        self.sources.insert(source.to_owned(), desired)
    }

    /// Drops everything `source` owns.
    pub fn remove(&mut self, source: &str) {
        self.sources.remove(source);
        self.by_service.remove(source);
    }

    /// What `source` owns.
    pub fn get(&self, source: &str) -> Option<&Desired> {
        self.sources.get(source)
    }

    /// Puts back what [`Model::get`] returned: `source` owns `desired`, or
    /// nothing.
    pub fn put(&mut self, source: &str, desired: Option<Desired>) {
        match desired {
            Some(d) => {
                self.set(source, d);
            }
            None => self.remove(source),
        }
    }

    /// Replaces the endpoints `source` gives `service` with `endpoints`,
    /// leaving everything else it owns; returns the ones it had (put them
    /// back with the same call), or `None` when `source` owns nothing.
    pub fn set_endpoints(&mut self, source: &str, service: &str, endpoints: Arc<[EndpointDef]>) -> Option<Arc<[EndpointDef]>> {
        let d = self.sources.get_mut(source)?;
        let eps = &mut d.endpoints;
        if self.by_service.contains(source) && endpoints.iter().all(|e| e.service.as_str() == service) {
            // The service's run, replaced in place: still by service.
            let (added, old) = (endpoints.len(), match eps.run_of(service) {
                Ok(i) if endpoints.is_empty() => eps.runs.remove(i),
                Ok(i) => std::mem::replace(&mut eps.runs[i], endpoints),
                Err(_) if endpoints.is_empty() => Arc::new([]),
                Err(i) => {
                    eps.runs.insert(i, endpoints);
                    Arc::new([])
                }
            });
            eps.len = eps.len + added - old.len();
            return Some(old);
        }
        // Sources send a service's endpoints together: its run is replaced
        // where it was (or the new ones go last), and stragglers elsewhere
        // are taken out too.
        let of = |e: &EndpointDef| e.service.as_str() == service;
        let mut all = eps.to_vec();
        let old: Vec<EndpointDef> = match all.iter().position(of) {
            None => {
                all.extend(endpoints.iter().cloned());
                Vec::new()
            }
            Some(start) => {
                let end = start + all[start..].iter().take_while(|e| of(e)).count();
                let mut old: Vec<EndpointDef> = all.splice(start..end, endpoints.iter().cloned()).collect();
                let rest = start + endpoints.len();
                if all[rest..].iter().any(of) {
                    let tail = all.split_off(rest);
                    let (theirs, others): (Vec<EndpointDef>, Vec<EndpointDef>) = tail.into_iter().partition(|e| of(e));
                    old.extend(theirs);
                    all.extend(others);
                }
                old
            }
        };
        *eps = all.into();
        // Searched from end to end from now on (as a source whose order is
        // its own: put in order, its endpoints would move).
        self.by_service.remove(source);
        Some(old.into())
    }

    /// The endpoints of `svc` (a service of the last resolution) gathered
    /// and checked from every source as [`Model::resolve`] does: after a
    /// change to endpoints only, which moves no other service, route or
    /// budget, the same as resolving everything again.
    pub fn resolve_endpoints(&self, svc: &ResolvedService) -> Result<Arc<[EndpointDef]>, Vec<Problem>> {
        let mut p = Problems::default();
        let mut eps = Vec::new();
        let mut whole = Whole::default();
        for (source, d) in &self.sources {
            let runs = if self.by_service.contains(source) {
                d.endpoints.run_of(&svc.name).ok().and_then(|i| d.endpoints.runs.get(i..=i)).unwrap_or_default()
            } else {
                d.endpoints.runs()
            };
            for run in runs {
                for e in run.iter().filter(|e| *e.service == *svc.name) {
                    whole.saw(run);
                    admit(e, svc.limit, &mut eps, &mut p);
                }
            }
        }
        check_endpoints(&svc.name, &mut eps, &mut Vec::new(), &mut p);
        if p.is_empty() {
            Ok(whole.share(eps))
        } else {
            Err(p.0)
        }
    }

    /// Merges the sources and checks the result.
    pub fn resolve(&self, defaults: &Defaults) -> Result<Resolved, Vec<Problem>> {
        let mut p = Problems::default();
        let mut owners: HashMap<&str, &Origin> = HashMap::new();
        let mut services = self.resolve_services(defaults, &mut owners, &mut p);
        self.gather_endpoints(&mut services, &owners, &mut p);
        let mut addrs: Vec<(Addr, usize)> = Vec::new();
        for (s, eps, _) in services.values_mut() {
            check_endpoints(&s.name, eps, &mut addrs, &mut p);
        }
        let routes = self.resolve_routes(&services, &owners, &mut p);
        if p.is_empty() {
            let services = services
                .into_iter()
                .map(|(name, (mut s, eps, whole))| {
                    s.endpoints = whole.share(eps);
                    (name, s)
                })
                .collect();
            Ok(Resolved { routes, services })
        } else {
            Err(p.0)
        }
    }

    /// The services of every source with their settings decided, each
    /// still without endpoints. A service whose name is invalid or taken,
    /// or whose limit or table size is out of bounds, is reported and left
    /// out; the first that takes the lookup tables of all over the budget
    /// is reported (once). `owners` records where each name was first
    /// defined, those left out included: what refers to them is then told
    /// apart from what refers to no service at all.
    fn resolve_services<'a>(&'a self, defaults: &Defaults, owners: &mut HashMap<&'a str, &'a Origin>, p: &mut Problems) -> BTreeMap<String, Gathering<'a>> {
        use limits::{ENDPOINT_LIMIT_MAX, ENDPOINT_LIMIT_MIN};
        let mut services: BTreeMap<String, Gathering<'a>> = BTreeMap::new();
        let budget = u64::from(defaults.table_memory_mb) << 20;
        let mut table_memory = 0u64;
        let mut over_budget = false;
        for d in self.sources.values() {
            for s in &d.services {
                if !valid_name(&s.name) {
                    p.push(s.origin.problem(format!("{:?} is not a valid service name", s.name)));
                    continue;
                }
                if let Some(first) = owners.get(s.name.as_str()) {
                    p.push(s.origin.problem(format!("service {:?} is already defined at {first}", s.name)));
                    continue;
                }
                owners.insert(&s.name, &s.origin);
                let limit = s.limit.unwrap_or(defaults.limit);
                if !(ENDPOINT_LIMIT_MIN..=ENDPOINT_LIMIT_MAX).contains(&limit) {
                    p.push(s.origin.problem(format!(
                        "endpoint limit {limit} is outside {ENDPOINT_LIMIT_MIN}..={ENDPOINT_LIMIT_MAX}"
                    )));
                    continue;
                }
                let Some(table_size) = checked_table_size(s, limit, p) else { continue };
                let mut problems = s.check.as_ref().map(|c| c.problems()).unwrap_or_default();
                if s.check.as_ref().is_some_and(|c| c.target == CheckTarget::Vip) && s.delivery.unwrap_or(defaults.delivery) == DeliveryMode::IpIp {
                    problems.push(format!(
                        "service {:?} is delivered by IP-in-IP: a check of the VIP (target: vip) goes to endpoints delivered at layer 2 (delivery: l2)",
                        s.name
                    ));
                }
                if !problems.is_empty() {
                    for m in problems {
                        p.push(s.origin.problem(m));
                    }
                    continue;
                }
                table_memory += limits::table_bytes(limit, table_size);
                if table_memory > budget && !over_budget {
                    over_budget = true;
                    p.push(s.origin.problem(format!(
                        "service {:?} takes the lookup tables of all services to {} MiB, over the budget of {} MiB \
                         (capacity.tableMemoryMB; this service's table: {table_size} entries of {} bits)",
                        s.name,
                        table_memory.div_ceil(1 << 20),
                        defaults.table_memory_mb,
                        sluice_dataplane::maglev::entry_bits(limit),
                    )));
                }
                services.insert(
                    s.name.clone(),
                    (
                        ResolvedService {
                            name: s.name.clone(),
                            algorithm: s.algorithm.unwrap_or(defaults.algorithm),
                            limit,
                            table_size,
                            flow_table: s.flow_table.unwrap_or(defaults.flow_table),
                            delivery: s.delivery.unwrap_or(defaults.delivery),
                            endpoints: Arc::new([]),
                            check: s.check.clone(),
                        },
                        Vec::new(),
                        Whole::default(),
                    ),
                );
            }
        }
        services
    }

    /// Gives each of `services` the endpoints every source sends it, each
    /// within its service's limits (else reported); an endpoint of a
    /// service in no source's definitions is reported, one of a service
    /// left out with errors (in `owners`) is only dropped.
    fn gather_endpoints<'a>(&'a self, services: &mut BTreeMap<String, Gathering<'a>>, owners: &HashMap<&str, &Origin>, p: &mut Problems) {
        // Endpoints come grouped by service (every source sends them so):
        // the service is looked up again only when it changes, and
        // duplicates are found per service once all are in.
        let mut current: Option<(&str, Option<&mut Gathering<'a>>)> = None;
        for run in self.sources.values().flat_map(|d| d.endpoints.runs()) {
            for (i, e) in run.iter().enumerate() {
                if current.as_ref().is_none_or(|(n, _)| *n != e.service.as_str()) {
                    let mut svc = services.get_mut(e.service.as_str());
                    if let Some((_, eps, _)) = svc.as_mut() {
                        // Room for the service's run of endpoints at once.
                        eps.reserve(run[i..].iter().take_while(|x| x.service == e.service).count());
                    }
                    current = Some((e.service.as_str(), svc));
                }
                let Some((_, Some((svc, eps, whole)))) = current.as_mut() else {
                    if !owners.contains_key(e.service.as_str()) {
                        p.push(e.origin.problem(format!("endpoint of an unknown service {:?}", e.service)));
                    }
                    continue;
                };
                whole.saw(run);
                admit(e, svc.limit, eps, p);
            }
        }
    }

    /// The routes of every source that can be served, by name: a route
    /// whose name is invalid or taken, whose match cannot be served, or
    /// that sends to a service not among `services` (unknown, or left out
    /// with errors as `owners` tells) is reported and left out.
    fn resolve_routes(&self, services: &BTreeMap<String, Gathering<'_>>, owners: &HashMap<&str, &Origin>, p: &mut Problems) -> Vec<RouteDef> {
        // As many as the sources give (not twice as many, as growing by
        // doubling may leave: 1.5 MiB for 10,000 routes).
        let mut routes: Vec<RouteDef> = Vec::with_capacity(self.sources.values().map(|d| d.routes.len()).sum());
        let mut route_names: HashMap<&str, &Origin> = HashMap::new();
        for d in self.sources.values() {
            for r in &d.routes {
                if !valid_name(&r.name) {
                    p.push(r.origin.problem(format!("{:?} is not a valid route name", r.name)));
                    continue;
                }
                if let Some(first) = route_names.get(r.name.as_str()) {
                    p.push(r.origin.problem(format!("route {:?} is already defined at {first}", r.name)));
                    continue;
                }
                route_names.insert(&r.name, &r.origin);
                if let Err(why) = check_match(&r.matches) {
                    p.push(r.origin.problem(why.to_string()));
                    continue;
                }
                if !services.contains_key(&r.service) {
                    p.push(r.origin.problem(if owners.contains_key(r.service.as_str()) {
                        format!("route to service {:?}, which has errors", r.service)
                    } else {
                        format!("route to an unknown service {:?}", r.service)
                    }));
                    continue;
                }
                routes.push(r.clone());
            }
        }
        routes.sort_by(|a, b| a.name.cmp(&b.name));
        routes
    }
}

/// The lookup-table size of service `s`, whose endpoint limit is `limit`:
/// its own when it is a prime within bounds and not below the limit, the
/// default for the limit when it sets none; `None` (reported) otherwise.
fn checked_table_size(s: &ServiceDef, limit: u32, p: &mut Problems) -> Option<u32> {
    use limits::TABLE_SIZE_MAX;
    match s.table_size {
        None => Some(default_size(limit)),
        Some(m) if m > TABLE_SIZE_MAX => {
            p.push(s.origin.problem(format!("table size {m} is above the largest, {TABLE_SIZE_MAX}")));
            None
        }
        Some(m) if !is_prime(m) => {
            p.push(s.origin.problem(format!(
                "table size {m} is not a prime (the next prime is {})",
                next_prime(m)
            )));
            None
        }
        Some(m) if m < limit => {
            p.push(s.origin.problem(format!("table size {m} is smaller than the endpoint limit {limit}")));
            None
        }
        Some(m) => Some(m),
    }
}

/// A service being resolved, with the endpoints it is given so far and
/// the run they came from.
type Gathering<'a> = (ResolvedService, Vec<EndpointDef>, Whole<'a>);

/// The one run a service's endpoints all came from, if one did.
#[derive(Default)]
struct Whole<'a> {
    run: Option<&'a Arc<[EndpointDef]>>,
    seen: usize,
    mixed: bool,
}

impl<'a> Whole<'a> {
    /// One of the service's endpoints came from `run`.
    fn saw(&mut self, run: &'a Arc<[EndpointDef]>) {
        match self.run {
            _ if self.mixed => {}
            None => (self.run, self.seen) = (Some(run), 1),
            Some(r) if Arc::ptr_eq(r, run) => self.seen += 1,
            Some(_) => (self.run, self.mixed) = (None, true),
        }
    }

    /// The service's endpoints `eps` (checked, by identifier), shared: the
    /// run they all came from when they are all of it as it is (no other
    /// source added any, none was refused, it was in identifier order),
    /// else a new run.
    fn share(self, eps: Vec<EndpointDef>) -> Arc<[EndpointDef]> {
        match self.run {
            Some(r) if !self.mixed && self.seen == r.len() && **r == *eps => Arc::clone(r),
            _ => eps.into(),
        }
    }
}

/// Adds endpoint `e` to the endpoints `eps` of its service, whose limit is
/// `limit`, when it is within the service's limits, else says why not.
fn admit(e: &EndpointDef, limit: u32, eps: &mut Vec<EndpointDef>, p: &mut Problems) {
    if e.id >= limit {
        p.push(e.origin.problem(format!(
            "endpoint identifier {} is beyond the limit of service {:?} (identifiers are 0..{})",
            e.id,
            e.service,
            limit - 1
        )));
    } else if e.weight > limits::WEIGHT_MAX {
        p.push(e.origin.problem(format!("endpoint weight {} is above the largest, {}", e.weight, limits::WEIGHT_MAX)));
    } else {
        eps.push(e.clone());
    }
}

/// Orders the endpoints `eps` of service `name` by identifier and reports
/// identifiers and addresses that appear twice (`addrs`: scratch space).
fn check_endpoints(name: &str, eps: &mut [EndpointDef], addrs: &mut Vec<(Addr, usize)>, p: &mut Problems) {
    // Stable: of two with one identifier, the first defined stays first.
    eps.sort_by_key(|e| e.id);
    for w in eps.windows(2) {
        if w[0].id == w[1].id {
            p.push(w[1].origin.problem(format!(
                "duplicate endpoint identifier {} in service {:?} (also at {})",
                w[1].id, name, w[0].origin
            )));
        }
    }
    if eps.len() > 1 {
        addrs.clear();
        addrs.extend(eps.iter().enumerate().map(|(i, e)| (e.address, i)));
        addrs.sort_unstable();
        for w in addrs.windows(2) {
            if w[0].0 == w[1].0 {
                let e = &eps[w[1].1];
                p.push(e.origin.problem(format!("endpoint {} appears twice in service {:?}", e.address, name)));
            }
        }
    }
}

/// Why a route's match cannot be served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MatchError {
    /// A port range whose first port is above its last.
    #[error("port range {0}-{1} is reversed")]
    ReversedPorts(u16, u16),
    /// A byte match of a width the classifier does not read.
    #[error("a byte match reads {0} bytes: 1, 2 or 4")]
    ByteWidth(u8),
    /// A byte match past the largest packet.
    #[error("a byte match reads up to byte {0} of the transport header, beyond the largest packet ({max})", max = limits::BYTE_MATCH_END_MAX)]
    BytePastEnd(u32),
    /// A mask or value wider than the bytes read.
    #[error("byte match mask {mask:#x} or value {value:#x} does not fit {len} byte(s)")]
    ByteFit {
        /// The mask.
        mask: u32,
        /// The value.
        value: u32,
        /// Bytes read.
        len: u8,
    },
}

/// What the configuration layer checks of a route's match, checked again
/// for sources that bypass it.
fn check_match(m: &RouteMatch) -> Result<(), MatchError> {
    for r in m.src_ports.iter().chain(&m.dst_ports) {
        if r.lo > r.hi {
            return Err(MatchError::ReversedPorts(r.lo, r.hi));
        }
    }
    for b in &m.byte_matches {
        let full = match b.len {
            1 => 0xff,
            2 => 0xffff,
            4 => u32::MAX,
            l => return Err(MatchError::ByteWidth(l)),
        };
        let end = u32::from(b.offset) + u32::from(b.len);
        if end > limits::BYTE_MATCH_END_MAX {
            return Err(MatchError::BytePastEnd(end));
        }
        if b.mask & !full != 0 || b.value & !b.mask != 0 {
            return Err(MatchError::ByteFit { mask: b.mask, value: b.value, len: b.len });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(path: &str) -> Origin {
        Origin { file: "t.yaml".into(), pos: None, path: path.into() }
    }

    fn svc(name: &str) -> ServiceDef {
        ServiceDef { name: name.into(), origin: origin(&format!("services.{name}")), ..Default::default() }
    }

    fn ep(service: &str, id: u32, a: &str) -> EndpointDef {
        EndpointDef {
            service: Arc::new(service.to_owned()),
            id,
            address: a.parse().unwrap(),
            weight: 1,
            draining: false,
            mac: None,
            origin: Arc::new(origin(&format!("endpoints.{a}"))),
        }
    }

    /// Endpoints in runs of one service each, as the xDS source gives them.
    fn by_service(v: Vec<EndpointDef>) -> Endpoints {
        let mut runs: Vec<Vec<EndpointDef>> = Vec::new();
        for e in v {
            match runs.last_mut() {
                Some(r) if r[0].service == e.service => r.push(e),
                _ => runs.push(vec![e]),
            }
        }
        Endpoints::from_runs(runs.into_iter().map(Arc::from))
    }

    fn route(name: &str, service: &str) -> RouteDef {
        RouteDef {
            name: name.into(),
            service: service.into(),
            priority: 1,
            matches: RouteMatch { vips: vec!["20.0.0.1".parse().unwrap()], ..RouteMatch::default() }.into(),
            origin: origin(&format!("routes.{name}")),
        }
    }

    #[test]
    fn an_endpoint_definition_is_48_bytes_and_shares_its_origin_and_service() {
        // Each of the three layers (a source's state, the model, the
        // resolved model) keeps a copy of every endpoint: 100,000 of them,
        // 4.6 MiB more a layer at 64 bytes (a fat `Arc<str>` for the
        // service).
        assert_eq!(std::mem::size_of::<EndpointDef>(), 48);
        let a = ep("web", 0, "10.0.0.1");
        let b = a.clone();
        assert!(std::sync::Arc::ptr_eq(&a.origin, &b.origin), "a copy shares where it came from");
        assert!(std::sync::Arc::ptr_eq(&a.service, &b.service), "and its service's name");
    }

    #[test]
    fn a_check_of_the_vip_is_refused_where_endpoints_are_delivered_by_ip_in_ip() {
        let check = |target| Some(Arc::new(CheckDef { target, ..CheckDef::new(Probe::Tcp, 80) }));
        let resolve = |delivery, target| {
            let mut m = Model::default();
            let s = ServiceDef { delivery, check: check(target), ..svc("web") };
            m.set("t", Desired { services: vec![s], routes: vec![route("r", "web")], endpoints: Endpoints::default() });
            m.resolve(&Defaults::default()).map(|_| ()).map_err(|p| p.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
        };
        assert!(resolve(None, CheckTarget::Vip).is_ok(), "layer 2 by default");
        assert!(resolve(Some(DeliveryMode::IpIp), CheckTarget::Endpoint).is_ok());
        let e = resolve(Some(DeliveryMode::IpIp), CheckTarget::Vip).unwrap_err();
        assert!(e.contains("service \"web\" is delivered by IP-in-IP: a check of the VIP (target: vip) goes to endpoints delivered at layer 2"), "{e}");
    }

    #[test]
    fn a_route_match_is_shared_by_every_layer_not_copied() {
        let mut m = Model::default();
        let d = Desired { services: vec![svc("web")], routes: vec![route("r", "web")], endpoints: Endpoints::default() };
        let given = Arc::clone(&d.routes[0].matches);
        m.set("t", d);
        let r = m.resolve(&Defaults::default()).unwrap();
        assert!(Arc::ptr_eq(&r.routes[0].matches, &given));
        assert_eq!(Arc::strong_count(&given), 3, "the source's copy, the model's and the resolution's: one match");
    }

    #[test]
    fn a_change_to_endpoints_resolves_like_the_whole_model() {
        let mut m = Model::default();
        m.set(
            "xds",
            Desired {
                services: vec![svc("a"), svc("b"), svc("c")],
                routes: vec![route("ra", "a"), route("rb", "b"), route("rc", "c")],
                endpoints: by_service(vec![ep("a", 0, "10.0.0.1"), ep("b", 0, "10.0.1.1"), ep("b", 1, "10.0.1.2"), ep("c", 0, "10.0.2.1")]),
            },
        );
        // Another source adds to b; one of xds's endpoints of c comes late.
        m.set("k8s", Desired { endpoints: vec![ep("b", 5, "10.0.1.5")].into(), ..Default::default() });
        let first = m.resolve(&Defaults::default()).unwrap();

        // b's endpoints from xds change (in place, between a's and c's).
        let old = m.set_endpoints("xds", "b", vec![ep("b", 2, "10.0.1.3"), ep("b", 0, "10.0.1.1")].into()).unwrap();
        assert_eq!(old.iter().map(|e| e.id).collect::<Vec<_>>(), vec![0, 1]);
        let whole = m.resolve(&Defaults::default()).unwrap();
        let b = m.resolve_endpoints(&first.services["b"]).unwrap();
        assert_eq!(b, whole.services["b"].endpoints);
        assert_eq!(b.iter().map(|e| e.id).collect::<Vec<_>>(), vec![0, 2, 5], "by identifier, the other source's too");
        let ids: Vec<(String, u32)> = m.get("xds").unwrap().endpoints.iter().map(|e| (e.service.to_string(), e.id)).collect();
        assert_eq!(ids, [("a", 0), ("b", 2), ("b", 0), ("c", 0)].map(|(s, i)| (s.to_owned(), i)));

        // A service with no endpoints from xds gets some, and loses them.
        assert_eq!(m.set_endpoints("xds", "c", Arc::new([])).unwrap().len(), 1);
        assert!(m.resolve_endpoints(&first.services["c"]).unwrap().is_empty());
        assert!(m.set_endpoints("xds", "c", vec![ep("c", 3, "10.0.2.3")].into()).unwrap().is_empty());
        assert_eq!(m.resolve_endpoints(&first.services["c"]).unwrap(), m.resolve(&Defaults::default()).unwrap().services["c"].endpoints);
        assert!(m.by_service.contains("xds"), "xds's endpoints stay in service order (found by binary search)");
        assert!(m.get("xds").unwrap().endpoints.by_service());

        // What resolve refuses, this refuses with the same words.
        m.set_endpoints("xds", "a", vec![ep("a", 0, "10.0.0.1"), ep("a", 0, "10.0.0.9"), ep("a", 40, "10.0.0.8")].into()).unwrap();
        let mut whole: Vec<String> = m.resolve(&Defaults::default()).unwrap_err().iter().map(ToString::to_string).collect();
        let mut one: Vec<String> = m.resolve_endpoints(&first.services["a"]).unwrap_err().iter().map(ToString::to_string).collect();
        whole.sort();
        one.sort();
        assert_eq!(one, whole);
        assert_eq!(one.len(), 2, "{one:?}");

        // Endpoints a source did not send together are all replaced.
        m.set("k8s", Desired { endpoints: vec![ep("b", 5, "10.0.1.5"), ep("c", 7, "10.0.2.7"), ep("b", 6, "10.0.1.6")].into(), ..Default::default() });
        assert!(!m.by_service.contains("k8s"), "not in service order: searched from end to end");
        let old = m.set_endpoints("k8s", "b", vec![ep("b", 8, "10.0.1.8")].into()).unwrap();
        assert_eq!(old.iter().map(|e| e.id).collect::<Vec<_>>(), vec![5, 6]);
        let ids: Vec<u32> = m.get("k8s").unwrap().endpoints.iter().map(|e| e.id).collect();
        assert_eq!(ids, vec![8, 7]);
        assert!(m.set_endpoints("nobody", "b", Arc::new([])).is_none());
    }

    /// A service's endpoints that are one run of one source, whole, are
    /// that run in the resolved model (shared, not copied); anything else
    /// is gathered into a new one.
    #[test]
    fn a_service_given_one_whole_run_shares_it() {
        let mut m = Model::default();
        let d = Desired {
            services: vec![svc("a"), svc("b"), svc("c")],
            routes: vec![route("ra", "a"), route("rb", "b"), route("rc", "c")],
            endpoints: by_service(vec![ep("a", 0, "10.0.0.1"), ep("a", 1, "10.0.0.2"), ep("b", 1, "10.0.1.2"), ep("b", 0, "10.0.1.1"), ep("c", 0, "10.0.2.1")]),
        };
        let run = |d: &Desired, i: usize| Arc::clone(&d.endpoints.runs()[i]);
        let (a, b, c) = (run(&d, 0), run(&d, 1), run(&d, 2));
        m.set("xds", d);
        let r = m.resolve(&Defaults::default()).unwrap();
        assert!(Arc::ptr_eq(&r.services["a"].endpoints, &a), "a: its run, whole and in order");
        assert!(!Arc::ptr_eq(&r.services["b"].endpoints, &b), "b: put in identifier order, a new run");
        assert_eq!(r.services["b"].endpoints.iter().map(|e| e.id).collect::<Vec<_>>(), vec![0, 1]);
        assert!(Arc::ptr_eq(&r.services["c"].endpoints, &c));
        assert!(Arc::ptr_eq(&m.resolve_endpoints(&r.services["a"]).unwrap(), &a), "a change's resolution shares it too");

        // Another source adds to c: gathered anew, from both.
        m.set("k8s", Desired { endpoints: vec![ep("c", 5, "10.0.2.5")].into(), ..Default::default() });
        let r = m.resolve(&Defaults::default()).unwrap();
        assert!(!Arc::ptr_eq(&r.services["c"].endpoints, &c));
        assert_eq!(r.services["c"].endpoints.len(), 2);
        assert!(!Arc::ptr_eq(&m.resolve_endpoints(&r.services["c"]).unwrap(), &c));

        // A run of several services is no service's whole run.
        let mut flat = Model::default();
        flat.set("file", Desired {
            services: vec![svc("a"), svc("b")],
            routes: vec![route("ra", "a"), route("rb", "b")],
            endpoints: vec![ep("a", 0, "10.0.0.1"), ep("b", 0, "10.0.1.1")].into(),
        });
        let r = flat.resolve(&Defaults::default()).unwrap();
        assert_eq!((r.services["a"].endpoints.len(), r.services["b"].endpoints.len()), (1, 1));
        assert!(!Arc::ptr_eq(&r.services["a"].endpoints, &flat.get("file").unwrap().endpoints.runs()[0]));
        assert!(!flat.by_service.contains("file"));
    }

    #[test]
    fn sources_merge_and_endpoints_may_come_from_elsewhere() {
        let mut m = Model::default();
        m.set("file", Desired { services: vec![svc("web")], routes: vec![route("r", "web")], endpoints: vec![ep("web", 1, "10.0.0.2")].into() });
        m.set("k8s", Desired { endpoints: vec![ep("web", 0, "10.0.0.1")].into(), ..Default::default() });
        let r = m.resolve(&Defaults::default()).unwrap();
        let web = &r.services["web"];
        assert_eq!(web.endpoints.iter().map(|e| e.id).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(web.table_size, default_size(32));
        m.remove("k8s");
        assert_eq!(m.resolve(&Defaults::default()).unwrap().endpoint_count(), 1, "pruned with its source");
    }

    #[test]
    fn every_problem_is_reported_with_its_origin() {
        let mut m = Model::default();
        let mut small = svc("small");
        small.limit = Some(2);
        let mut bad_m = svc("badm");
        bad_m.table_size = Some(100);
        m.set(
            "a",
            Desired {
                services: vec![svc("web"), small, bad_m],
                routes: vec![route("r1", "web"), route("r2", "nope"), route("r3", "badm")],
                endpoints: vec![ep("web", 0, "10.0.0.1"), ep("web", 0, "10.0.0.2"), ep("small", 2, "10.0.0.3"), ep("ghost", 0, "10.0.0.4")].into(),
            },
        );
        m.set("b", Desired { services: vec![svc("web")], routes: vec![route("r1", "web")], ..Default::default() });
        let errs: Vec<String> = m.resolve(&Defaults::default()).unwrap_err().iter().map(ToString::to_string).collect();
        let want = [
            "t.yaml: services.badm: table size 100 is not a prime (the next prime is 101)",
            "t.yaml: services.web: service \"web\" is already defined at t.yaml: services.web",
            "t.yaml: endpoints.10.0.0.2: duplicate endpoint identifier 0 in service \"web\"",
            "t.yaml: endpoints.10.0.0.3: endpoint identifier 2 is beyond the limit of service \"small\" (identifiers are 0..1)",
            "t.yaml: endpoints.10.0.0.4: endpoint of an unknown service \"ghost\"",
            "t.yaml: routes.r2: route to an unknown service \"nope\"",
            "t.yaml: routes.r3: route to service \"badm\", which has errors",
            "t.yaml: routes.r1: route \"r1\" is already defined at t.yaml: routes.r1",
        ];
        for w in want {
            assert!(errs.iter().any(|e| e.starts_with(w)), "missing {w:?} in {errs:#?}");
        }
    }

    #[test]
    fn numbers_from_any_source_are_bounded() {
        // As a remote source would hand them over, with no configuration
        // layer in between.
        use sluice_dataplane::classify::{ByteMatch, PortRange};
        let mut huge = svc("huge");
        huge.table_size = Some(4_294_967_291); // a prime: 16 GiB to build
        let mut wide = svc("wide");
        wide.limit = Some(65537);
        let mut none = svc("none");
        none.limit = Some(0);
        let mut odd = svc("x");
        odd.name = "a\"b".into();
        let mut heavy = ep("web", 0, "10.0.0.1");
        heavy.weight = limits::WEIGHT_MAX + 1;
        let mut far = route("far", "web");
        Arc::make_mut(&mut far.matches).byte_matches = vec![ByteMatch { proto: 6, offset: 65535, len: 4, mask: u32::MAX, value: 0 }];
        let mut reversed = route("reversed", "web");
        Arc::make_mut(&mut reversed.matches).dst_ports = vec![PortRange { lo: 90, hi: 80 }];
        let mut m = Model::default();
        m.set(
            "xds",
            Desired {
                services: vec![svc("web"), huge, wide, none, odd],
                endpoints: vec![heavy].into(),
                routes: vec![far, reversed],
            },
        );
        let errs: Vec<String> = m.resolve(&Defaults::default()).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(errs, [
            "t.yaml: services.huge: table size 4294967291 is above the largest, 16777213",
            "t.yaml: services.wide: endpoint limit 65537 is outside 1..=65536",
            "t.yaml: services.none: endpoint limit 0 is outside 1..=65536",
            "t.yaml: services.x: \"a\\\"b\" is not a valid service name",
            "t.yaml: endpoints.10.0.0.1: endpoint weight 1048577 is above the largest, 1048576",
            "t.yaml: routes.far: a byte match reads up to byte 65539 of the transport header, beyond the largest packet (9600)",
            "t.yaml: routes.reversed: port range 90-80 is reversed",
        ]);
    }

    #[test]
    fn lookup_tables_share_one_memory_budget() {
        assert!(is_prime(limits::TABLE_SIZE_MAX) && !(limits::TABLE_SIZE_MAX + 1..1 << 24).any(is_prime), "the largest prime below 2^24");
        assert_eq!((limits::table_bytes(32, 1000), limits::table_bytes(256, 1000), limits::table_bytes(257, 1000)), (626, 1001, 2000), "as maglev::Entries");
        let defaults = Defaults { table_memory_mb: 1, ..Defaults::default() };
        let names: Vec<String> = (0..300).map(|i| format!("s{i:03}")).collect();
        let mut m = Model::default();
        m.set("a", Desired { services: names.iter().map(|n| svc(n)).collect(), ..Default::default() });
        // 4015 bytes each (6421 entries of 5 bits, limit 32): the 262nd
        // crosses 1 MiB.
        let errs: Vec<String> = m.resolve(&defaults).unwrap_err().iter().map(ToString::to_string).collect();
        assert_eq!(errs, [
            "t.yaml: services.s261: service \"s261\" takes the lookup tables of all services to 2 MiB, over the budget of 1 MiB \
             (capacity.tableMemoryMB; this service's table: 6421 entries of 5 bits)",
        ]);
        m.set("a", Desired { services: names[..261].iter().map(|n| svc(n)).collect(), ..Default::default() });
        assert!(m.resolve(&defaults).is_ok(), "261 tables fit");
    }
}
