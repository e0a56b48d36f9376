//! The DC gateways the appliance peers with (the seed's `GatewayRouter`),
//! and how this appliance's BIRD is run.
//!
//! A [`GatewayRouter`] carries the seed's fields with the seed's names
//! (`address`, `interface`, `bgp.localASN`, `bgp.remoteASN`, `bgp.holdTime`,
//! `bgp.localPort`, `bgp.remotePort`, `bgp.bfd.{switch,minTx,minRx,multiplier}`),
//! so it can be read from the configuration file (`gatewayRouters:`), from
//! a manifest of kind `GatewayRouter`, or deserialized with serde.
//!
//! [`resolve`] ties each router to a port: its `interface` names a port or
//! the port's kernel interface (the exception-path tap BIRD speaks through),
//! the port must have an address of the router's family on the router's
//! subnet (the DC gateway is directly connected). BFD is on unless a router
//! turns it off (`bfd: {switch: false}`), with timers of its own: routers
//! on one interface may differ. Every problem is reported where it is
//! written.

// Integers are range-checked by `Node::int` before any narrowing cast.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sluice_dataplane::addr::Addr;

use crate::config::node::Node;
use crate::config::yaml::Value;
use crate::config::{fields, PortConfig};
use crate::model::Origin;
use crate::problem::Problems;

/// A length of time written with its unit: `300ms`, `24s`, `2m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval {
    /// Milliseconds.
    pub ms: u64,
}

impl Interval {
    /// `ms` milliseconds.
    pub(crate) const fn ms(ms: u64) -> Interval {
        Interval { ms }
    }

    /// Whole seconds (rounded down).
    pub fn secs(self) -> u64 {
        self.ms / 1000
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ms % 60_000 == 0 && self.ms > 0 {
            write!(f, "{}m", self.ms / 60_000)
        } else if self.ms % 1000 == 0 {
            write!(f, "{}s", self.ms / 1000)
        } else {
            write!(f, "{}ms", self.ms)
        }
    }
}

/// Why a duration was not understood.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// It does not start with a whole number.
    #[error("a duration is a whole number with a unit (300ms, 24s, 2m)")]
    NotANumber,
    /// A number without a unit.
    #[error("the unit is missing (ms, s or m)")]
    NoUnit,
    /// A unit other than `ms`, `s` or `m`.
    #[error("unknown unit {0:?} (ms, s or m)")]
    UnknownUnit(String),
    /// More milliseconds than a `u64` holds.
    #[error("too long")]
    TooLong,
}

impl FromStr for Interval {
    type Err = IntervalError;
    fn from_str(s: &str) -> Result<Interval, IntervalError> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num.parse().map_err(|_| IntervalError::NotANumber)?;
        let scale = match unit.trim() {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "" => return Err(IntervalError::NoUnit),
            u => return Err(IntervalError::UnknownUnit(u.to_owned())),
        };
        n.checked_mul(scale).map(Interval::ms).ok_or(IntervalError::TooLong)
    }
}

impl Serialize for Interval {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Interval {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Interval, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// BFD supervision of a BGP session (seed: `bgp.bfd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bfd {
    /// BFD on or off: on by default, as in the seed's example, so that a
    /// frozen appliance is left within the detection time rather than the
    /// hold time. A router that runs no BFD still peers (BIRD takes a
    /// session down only when its BFD goes from Up to Down).
    pub switch: bool,
    /// Desired minimum transmit interval.
    pub min_tx: Interval,
    /// Required minimum receive interval.
    pub min_rx: Interval,
    /// Detection multiplier.
    pub multiplier: u8,
}

impl Default for Bfd {
    fn default() -> Bfd {
        Bfd { switch: true, min_tx: Interval::ms(300), min_rx: Interval::ms(300), multiplier: 3 }
    }
}

/// The BGP session with a DC gateway (seed: `bgp`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bgp {
    /// This appliance's AS number.
    #[serde(rename = "localASN")]
    pub local_asn: u32,
    /// The gateway's AS number.
    #[serde(rename = "remoteASN")]
    pub remote_asn: u32,
    /// Hold time (whole seconds, 3 s to 65535 s).
    #[serde(rename = "holdTime")]
    pub hold_time: Interval,
    /// TCP port this side listens on.
    #[serde(rename = "localPort")]
    pub local_port: u16,
    /// TCP port of the gateway.
    #[serde(rename = "remotePort")]
    pub remote_port: u16,
    /// BFD.
    pub bfd: Bfd,
}

/// A DC gateway to announce the VIPs to (seed: `GatewayRouter`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GatewayRouter {
    /// Its name (`metadata.name` in a manifest).
    pub name: String,
    /// The gateway's address; its family chooses the BGP channel.
    pub address: IpAddr,
    /// The port (or its kernel interface) the gateway is reached on.
    pub(crate) interface: String,
    /// BGP settings.
    pub bgp: Bgp,
}

/// A router tied to the appliance's ports: what BIRD needs to peer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouterConfig {
    /// The router as written.
    pub router: GatewayRouter,
    /// The port the gateway is on.
    pub port: String,
    /// The kernel interface BIRD speaks through.
    pub kernel_interface: String,
    /// The appliance's address on the gateway's subnet.
    pub local: IpAddr,
    /// Where it was written.
    pub origin: Origin,
}

impl RouterConfig {
    /// True for an IPv4 gateway.
    pub fn is_v4(&self) -> bool {
        self.router.address.is_ipv4()
    }
}

/// Bounds of the numbers a GatewayRouter sets.
pub(crate) mod bounds {
    /// AS numbers (0 is reserved).
    pub(crate) const ASN: (i64, i64) = (1, 4_294_967_295);
    /// TCP ports.
    pub(crate) const PORT: (i64, i64) = (1, 65535);
    /// Hold time in milliseconds (BGP: 0 or at least 3 s; BIRD: at most 65535 s).
    pub(crate) const HOLD_MS: (u64, u64) = (3000, 65_535_000);
    /// BFD intervals in milliseconds.
    pub(crate) const BFD_INTERVAL_MS: (u64, u64) = (10, 60_000);
    /// BFD detection multiplier.
    pub(crate) const MULTIPLIER: (i64, i64) = (1, 255);
    /// Milliseconds to wait after withdrawing every VIP before stopping.
    pub(crate) const WITHDRAW_WAIT_MS: (i64, i64) = (0, 60_000);
    /// GatewayRouters at most.
    pub(crate) const ROUTERS: usize = 64;
}

/// How BIRD is run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BirdMode {
    /// Sluice starts `bird` and restarts it when it dies.
    Supervised,
    /// A `bird` started by someone else listens on the socket; Sluice only
    /// writes its configuration file and reconfigures it.
    External,
}

/// The `bird:` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BirdConfig {
    /// Supervised or external.
    pub mode: BirdMode,
    /// The `bird` program (supervised mode).
    pub binary: PathBuf,
    /// BIRD's control socket.
    pub socket: PathBuf,
    /// The configuration file Sluice writes.
    pub config_file: PathBuf,
    /// BGP router ID (default: the first IPv4 address of a port).
    pub(crate) router_id: Option<Ipv4Addr>,
    /// How long to wait after withdrawing every VIP, before the workers
    /// stop, for the withdrawal to reach the routers.
    pub withdraw_wait_ms: u64,
}

impl BirdConfig {
    /// Defaults for an appliance whose DPDK file prefix is `prefix`: files
    /// under `/run/sluice-PREFIX/`, so two appliances on a host do not meet.
    pub(crate) fn defaults(prefix: &str) -> BirdConfig {
        let dir = PathBuf::from(format!("/run/sluice-{prefix}"));
        BirdConfig {
            mode: BirdMode::Supervised,
            binary: PathBuf::from("/usr/sbin/bird"),
            socket: dir.join("bird.ctl"),
            config_file: dir.join("bird.conf"),
            router_id: None,
            withdraw_wait_ms: 2000,
        }
    }
}

/// Everything about routing the configuration sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutingConfig {
    /// How BIRD is run.
    pub bird: BirdConfig,
    /// The router ID BIRD uses.
    pub router_id: Option<Ipv4Addr>,
    /// The DC gateways, tied to ports.
    pub routers: Vec<RouterConfig>,
}

/// An interval within the bounds the schema declares for it.
fn interval(n: Node<'_>, p: &mut Problems) -> Option<Interval> {
    let Some((lo, hi)) = n.duration_bounds() else {
        n.bad(p, "no bounds are declared here (a fault of the parser: please report it)");
        return None;
    };
    let i: Interval = n.parse(p, "a duration")?;
    if !(lo..=hi).contains(&i.ms) {
        n.bad(p, format!("{i} is out of range {}..={}", Interval::ms(lo), Interval::ms(hi)));
        return None;
    }
    Some(i)
}

fn bfd(n: Node<'_>, p: &mut Problems) -> Option<Bfd> {
    n.section(p);
    let mut b = Bfd::default();
    n.field("switch", |n| n.boolean(p).map(|v| b.switch = v));
    n.field("minTx", |n| interval(n, p).map(|v| b.min_tx = v));
    n.field("minRx", |n| interval(n, p).map(|v| b.min_rx = v));
    n.field("multiplier", |n| n.bounded(p).map(|v| b.multiplier = v as u8));
    Some(b)
}

fn bgp(n: Node<'_>, p: &mut Problems) -> Option<Bgp> {
    n.section(p);
    let local_asn = n.required(p, "localASN", |n, p| n.bounded(p)).flatten();
    let remote_asn = n.required(p, "remoteASN", |n, p| n.bounded(p)).flatten();
    let hold_time = n.field("holdTime", |n| interval(n, p)).unwrap_or(Some(Interval::ms(90_000)));
    if let Some(h) = hold_time.filter(|h| h.ms % 1000 != 0) {
        let at = n.v.get("holdTime").map(Value::pos).or(n.pos());
        p.add(n.file(), at, &format!("{}.holdTime", n.path()), format!("hold time {h} is not whole seconds"));
    }
    let local_port = n.field("localPort", |n| n.bounded(p)).unwrap_or(Some(179));
    let remote_port = n.field("remotePort", |n| n.bounded(p)).unwrap_or(Some(179));
    let bfd = n.field("bfd", |n| bfd(n, p)).unwrap_or(Some(Bfd::default()));
    Some(Bgp {
        local_asn: local_asn? as u32,
        remote_asn: remote_asn? as u32,
        hold_time: hold_time?,
        local_port: local_port? as u16,
        remote_port: remote_port? as u16,
        bfd: bfd?,
    })
}

/// The fields of a GatewayRouter (its `spec` in a manifest), named `name`.
pub(crate) fn router_spec(n: Node<'_>, p: &mut Problems, name: String) -> Option<GatewayRouter> {
    // The file's gatewayRouters[] without the name, which is the manifest's.
    let n = n.with_schema(&super::schema::FILE, "gatewayRouters[]");
    n.mapping(p, &["address", "interface", "bgp"]);
    router_spec_fields(n, p, name)
}

/// One entry of the file's `gatewayRouters:` list.
fn router_inline(n: Node<'_>, p: &mut Problems) -> Option<(GatewayRouter, Origin)> {
    n.section(p);
    let name = n.required(p, "name", fields::name).flatten();
    // The same fields as a manifest's spec, with the name beside them.
    let spec = router_spec_fields(n, p, name.clone().unwrap_or_default());
    name?;
    Some((spec?, Origin { file: n.file().into(), pos: n.pos(), path: n.path().into() }))
}

fn router_spec_fields(n: Node<'_>, p: &mut Problems, name: String) -> Option<GatewayRouter> {
    let address = n.required(p, "address", fields::addr).flatten();
    let interface = n.required(p, "interface", |n, p| n.string(p)).flatten();
    let bgp = n.required(p, "bgp", bgp).flatten();
    Some(GatewayRouter { name, address: address?.to_ip(), interface: interface?, bgp: bgp? })
}

/// The `gatewayRouters:` list of the configuration file.
pub(crate) fn parse_list(n: Node<'_>, p: &mut Problems) -> Vec<(GatewayRouter, Origin)> {
    let mut out = Vec::new();
    n.each(p, |n, p| out.extend(router_inline(n, p)));
    out
}

/// The `bird:` section of `root`; `prefix` is the DPDK file prefix (for
/// default paths), `base` the directory relative paths start from.
pub(crate) fn parse_bird(root: &Node<'_>, p: &mut Problems, prefix: &str, base: &Path) -> BirdConfig {
    let mut b = BirdConfig::defaults(prefix);
    root.field("bird", |n| bird_fields(n, p, base, &mut b));
    b
}

fn bird_fields(n: Node<'_>, p: &mut Problems, base: &Path, b: &mut BirdConfig) {
    n.section(p);
    n.field("mode", |n| match n.string(p).as_deref().map(str::trim) {
        Some("supervised") => b.mode = BirdMode::Supervised,
        Some("external") => b.mode = BirdMode::External,
        Some(m) => n.bad(p, format!("{m:?} is not a mode (supervised or external)")),
        None => {}
    });
    let path = |n: Node<'_>, p: &mut Problems| -> Option<PathBuf> {
        let s = n.string(p)?;
        if s.trim().is_empty() || s.contains(['"', '\n', '\0']) {
            n.bad(p, format!("{s:?} is not a usable path"));
            return None;
        }
        Some(base.join(s.trim()))
    };
    n.field("binary", |n| path(n, p).map(|v| b.binary = v));
    n.field("socket", |n| {
        let s = path(n, p)?;
        // sockaddr_un.sun_path holds 108 bytes with the terminating NUL.
        if s.as_os_str().len() > 107 {
            n.bad(p, format!("socket path {} is longer than 107 bytes, the most a Unix socket may have", s.display()));
            return None;
        }
        b.socket = s;
        Some(())
    });
    n.field("configFile", |n| path(n, p).map(|v| b.config_file = v));
    n.field("routerId", |n| {
        let a = fields::addr(n, p)?;
        match a.to_ip() {
            IpAddr::V4(v) if !v.is_unspecified() => b.router_id = Some(v),
            _ => n.bad(p, format!("router ID {a} is not a non-zero IPv4 address")),
        }
        Some(())
    });
    n.field("withdrawWaitMs", |n| n.bounded(p).map(|v| b.withdraw_wait_ms = v as u64));
}

/// Adds the GatewayRouters of the configuration's manifests directory to
/// those of the file, and checks them all together.
pub fn add_manifest_routers(config: &mut crate::config::ApplianceConfig) -> Result<(), Vec<crate::problem::Problem>> {
    let Some(m) = &config.manifests else { return Ok(()) };
    let mut p = Problems::default();
    let more = from_manifests(&m.directory, &m.gateway, &mut p);
    if more.is_empty() && p.is_empty() {
        return Ok(());
    }
    let r = &mut config.routing;
    let mut all: Vec<(GatewayRouter, Origin)> = r.routers.drain(..).map(|x| (x.router, x.origin)).collect();
    all.extend(more);
    let (id, routers) = resolve(all, &config.ports, r.bird.router_id, &mut p);
    r.router_id = id;
    r.routers = routers;
    if p.is_empty() {
        Ok(())
    } else {
        Err(p.0)
    }
}

/// The longest symbol (protocol name) BIRD 2 accepts: longer ones are
/// refused with "Symbol too long".
pub(crate) const BIRD_SYMBOL_MAX: usize = 64;

/// The BIRD protocol name of a router: `gw_` and its name with every
/// character but letters and digits as `_`. A name that does not fit in
/// [`BIRD_SYMBOL_MAX`] is cut and ends with `_` and ten hex digits of a
/// hash of the whole name (FNV-1a, the same on every appliance and every
/// run), so names that fit keep their protocol (and session) as they were.
pub fn protocol_name(router: &str) -> String {
    let mut s = String::from("gw_");
    s.extend(router.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }));
    if s.len() <= BIRD_SYMBOL_MAX {
        return s;
    }
    let hash = router.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let tail = format!("_{:010x}", hash >> 24);
    // Only ASCII was pushed, so any length is a character boundary.
    s.truncate(BIRD_SYMBOL_MAX - tail.len());
    s.push_str(&tail);
    s
}

/// Whether `a` is the network or broadcast address of the IPv4 subnet of
/// `local` (a /31 has neither, RFC 3021; IPv6 has no broadcast, and its
/// subnet-router anycast address may well be the router's).
fn not_a_host(a: IpAddr, local: &crate::config::IfAddr) -> Option<&'static str> {
    let (IpAddr::V4(a), IpAddr::V4(l)) = (a, local.addr.to_ip()) else { return None };
    if local.prefix >= 31 {
        return None;
    }
    let mask = u32::MAX.checked_shl(32 - u32::from(local.prefix)).unwrap_or(0);
    let (a, net) = (u32::from(a), u32::from(l) & mask);
    if a == net {
        Some("network")
    } else if a == net | !mask {
        Some("broadcast")
    } else {
        None
    }
}

fn problem_at(p: &mut Problems, o: &Origin, field: &str, message: String) {
    let path = if field.is_empty() { o.path.to_string() } else { format!("{}.{field}", o.path) };
    p.add(&o.file, o.pos, &path, message);
}

/// Where router `r` (written at `o`) is reached: the port its interface
/// names and that port's address on its subnet. `None` (reported) when
/// its name, interface or address is not usable, or is taken by one of the
/// routers already tied (`out`).
fn tie<'p>(r: &GatewayRouter, o: &Origin, ports: &'p [PortConfig], out: &[RouterConfig], p: &mut Problems) -> Option<(&'p PortConfig, &'p crate::config::IfAddr)> {
    if let Some(prev) = out.iter().find(|x| x.router.name == r.name) {
        problem_at(p, o, "name", format!("gateway router {:?} is defined twice (first at {})", r.name, prev.origin));
        return None;
    }
    if let Some(prev) = out.iter().find(|x| protocol_name(&x.router.name) == protocol_name(&r.name)) {
        problem_at(p, o, "name", format!(
            "gateway routers {:?} and {:?} have the same BIRD protocol name {}: rename one",
            prev.router.name, r.name, protocol_name(&r.name)
        ));
        return None;
    }
    let Some(port) = ports.iter().find(|x| x.name == r.interface || (!x.kernel_interface.is_empty() && x.kernel_interface == r.interface)) else {
        let known: Vec<String> = ports.iter().map(|x| format!("{} ({})", x.name, x.kernel_interface)).collect();
        problem_at(p, o, "interface", format!("{:?} is neither a port nor a port's kernel interface (ports: {})", r.interface, known.join(", ")));
        return None;
    };
    if port.kernel_interface.is_empty() {
        problem_at(p, o, "interface", format!("port {:?} has no kernel interface: BIRD cannot reach the gateway through it", port.name));
        return None;
    }
    let addr = Addr::from(r.address);
    if r.address.is_unspecified() || r.address.is_multicast() || r.address.is_loopback() {
        problem_at(p, o, "address", format!("{} is not a router's address", r.address));
        return None;
    }
    if port.addresses.iter().any(|a| a.addr == addr) {
        problem_at(p, o, "address", format!("{} is the appliance's own address on port {:?}", r.address, port.name));
        return None;
    }
    let Some(local) = port.addresses.iter().find(|a| a.addr.is_v4() == addr.is_v4() && a.network().contains(addr)) else {
        let fam: Vec<String> = port.addresses.iter().filter(|a| a.addr.is_v4() == addr.is_v4()).map(ToString::to_string).collect();
        problem_at(p, o, "address", format!(
            "{} is not on a subnet of port {:?} ({}): the DC gateway must be directly connected",
            r.address,
            port.name,
            if fam.is_empty() { "it has no address of that family".to_owned() } else { fam.join(", ") }
        ));
        return None;
    };
    if let Some(why) = not_a_host(r.address, local) {
        problem_at(p, o, "address", format!("{} is the {why} address of port {:?}'s subnet {local}, not a router's address", r.address, port.name));
        return None;
    }
    if let Some(prev) = out.iter().find(|x| x.router.address == r.address) {
        problem_at(p, o, "address", format!(
            "{} is also the address of gateway router {:?} ({}): one router, one session",
            r.address, prev.router.name, prev.origin
        ));
        return None;
    }
    Some((port, local))
}

/// Ties routers to ports and checks them together; `router_id` is the one
/// written in the `bird:` section, if any.
pub(crate) fn resolve(
    routers: Vec<(GatewayRouter, Origin)>,
    ports: &[PortConfig],
    router_id: Option<Ipv4Addr>,
    p: &mut Problems,
) -> (Option<Ipv4Addr>, Vec<RouterConfig>) {
    let mut out: Vec<RouterConfig> = Vec::new();
    if routers.len() > bounds::ROUTERS {
        if let Some((_, o)) = routers.get(bounds::ROUTERS) {
            problem_at(p, o, "", format!("more than {} gateway routers", bounds::ROUTERS));
        }
        return (router_id, out);
    }
    for (r, o) in routers {
        let Some((port, local)) = tie(&r, &o, ports, &out, p) else { continue };
        out.push(RouterConfig { port: port.name.clone(), kernel_interface: port.kernel_interface.clone(), local: local.addr.to_ip(), router: r, origin: o });
    }
    let first_v4 = ports.iter().flat_map(|x| &x.addresses).find(|a| a.addr.is_v4()).map(|a| a.addr.to_ip());
    let id = router_id.or(match first_v4 {
        Some(IpAddr::V4(v)) => Some(v),
        _ => None,
    });
    if id.is_none() {
        if let Some(r) = out.first() {
            problem_at(p, &r.origin, "", "no router ID: no port has an IPv4 address, so set bird.routerId".into());
        }
    }
    (id, out)
}

/// The GatewayRouters of the manifests in `dir` that belong to `gateway`
/// (label `service.kubernetes.io/service-proxy-name`), with their origins.
pub(crate) fn from_manifests(dir: &Path, gateway: &str, p: &mut Problems) -> Vec<(GatewayRouter, Origin)> {
    use crate::config::{manifests, yaml};
    let mut out = Vec::new();
    let files = match manifests::files(dir) {
        Ok(f) => f,
        Err(e) => {
            p.0.push(e);
            return out;
        }
    };
    let mut budget = yaml::Budget::default();
    for f in files {
        let file = f.display().to_string();
        // The services loader reports unreadable and invalid files; this
        // one only looks at the documents it can read.
        let Ok(text) = yaml::read(&f, yaml::MAX_FILE_BYTES) else { continue };
        let (values, _) = yaml::documents(&text, &mut budget);
        for (i, v) in values.iter().enumerate() {
            if v.get("kind").and_then(Value::as_str) != Some("GatewayRouter") {
                continue;
            }
            let meta = v.get("metadata");
            let name = meta.and_then(|m| m.get("name")).and_then(Value::as_str).unwrap_or("?").to_owned();
            let path = format!("[doc {i}] GatewayRouter/{name}");
            let n = Node::at(v, &file, &path);
            let proxy = meta
                .and_then(|m| m.get("labels"))
                .and_then(|l| l.get(manifests::PROXY_NAME_LABEL))
                .and_then(Value::as_str);
            if proxy != Some(gateway) {
                continue;
            }
            if name == "?" || !crate::model::simple_name(&name) {
                n.bad(p, "missing or invalid metadata.name");
                continue;
            }
            let origin = Origin { file: file.as_str().into(), pos: n.pos(), path: path.as_str().into() };
            if let Some(r) = n.required(p, "spec", |spec, p| router_spec(spec, p, name.clone())).flatten() {
                out.push((r, origin));
            }
        }
    }
    out
}

/// What the routing tests (here and, in the appliance, BIRD's renderer)
/// start from.
#[doc(hidden)]
#[allow(clippy::unwrap_used)] // a fixture that does not parse is a broken test
pub mod testing {
    use super::*;
    use crate::config::yaml::{document, Budget};
    use crate::config::IfAddr;

    /// Two ports: `front` on the DC gateways' VLAN, with both families,
    /// and `back`.
    pub(crate) fn ports() -> Vec<PortConfig> {
        let a = |s: &str, l| IfAddr { addr: s.parse().unwrap(), prefix: l };
        let port = |name: &str, device: &str, addresses, kernel_interface: &str| PortConfig {
            name: name.into(),
            device: device.into(),
            addresses,
            mtu: 1500,
            vlan: 0,
            kernel_interface: kernel_interface.into(),
        };
        vec![
            port("front", "net_null0", vec![a("169.254.100.1", 24), a("fd00:100::1", 64)], "vlan-100"),
            port("back", "net_null1", vec![a("10.0.0.1", 24)], "sl1-back"),
        ]
    }

    /// The `gatewayRouters` of a configuration text, resolved on
    /// [`ports`], or the problems (as printed).
    pub fn check(text: &str) -> Result<(Option<Ipv4Addr>, Vec<RouterConfig>), Vec<String>> {
        check_on(text, &ports())
    }

    /// As [`check`], on `ports`.
    pub(crate) fn check_on(text: &str, ports: &[PortConfig]) -> Result<(Option<Ipv4Addr>, Vec<RouterConfig>), Vec<String>> {
        let v = document(text, &mut Budget::default()).unwrap();
        let mut p = Problems::default();
        let list = Node::config_root(&v, "c.yaml").field("gatewayRouters", |n| parse_list(n, &mut p)).unwrap_or_default();
        let out = resolve(list, ports, None, &mut p);
        if p.is_empty() {
            Ok(out)
        } else {
            Err(p.0.iter().map(ToString::to_string).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::check;
    use super::*;

    #[test]
    fn the_seed_example_reads_with_its_names() {
        let text = r"
gatewayRouters:
  - name: gateway-a-v4
    address: 169.254.100.150
    interface: vlan-100
    bgp:
      localASN: 8103
      remoteASN: 4248829953
      holdTime: 24s
      localPort: 10179
      remotePort: 10179
      bfd: {switch: true, minTx: 300ms, minRx: 300ms, multiplier: 5}
  - {name: gateway-a-v6, address: 'fd00:100::150', interface: front, bgp: {localASN: 8103, remoteASN: 4248829953}}
";
        let (id, rs) = check(text).unwrap();
        assert_eq!(id, Some(Ipv4Addr::new(169, 254, 100, 1)));
        assert_eq!(rs.len(), 2);
        let a = &rs[0];
        assert_eq!((a.kernel_interface.as_str(), a.local.to_string().as_str()), ("vlan-100", "169.254.100.1"));
        assert_eq!(a.router.bgp, Bgp {
            local_asn: 8103,
            remote_asn: 4_248_829_953,
            hold_time: Interval::ms(24_000),
            local_port: 10179,
            remote_port: 10179,
            bfd: Bfd { switch: true, min_tx: Interval::ms(300), min_rx: Interval::ms(300), multiplier: 5 },
        });
        let b = &rs[1];
        assert_eq!((b.kernel_interface.as_str(), b.local.to_string().as_str()), ("vlan-100", "fd00:100::1"));
        assert_eq!((b.router.bgp.hold_time, b.router.bgp.local_port, b.router.bgp.bfd), (Interval::ms(90_000), 179, Bfd::default()));

        // serde speaks the seed's names too (the Kubernetes source uses them).
        let json = serde_json::to_value(&a.router).unwrap();
        assert_eq!(json["bgp"]["localASN"], 8103);
        assert_eq!(json["bgp"]["holdTime"], "24s");
        assert_eq!(json["bgp"]["bfd"]["minTx"], "300ms");
        let back: GatewayRouter = serde_json::from_value(json).unwrap();
        assert_eq!(back, a.router);
    }

    #[test]
    fn problems_are_reported_where_written() {
        let text = r"
gatewayRouters:
  - {name: a, address: 169.254.100.2, interface: nope, bgp: {localASN: 1, remoteASN: 1}}
  - {name: b, address: 10.9.9.9, interface: front, bgp: {localASN: 1, remoteASN: 2, holdTime: 2s, bfd: {minTx: 5ms, multiplier: 0, swich: true}}}
  - {name: c, address: 169.254.100.1, interface: front, bgp: {localASN: 0, remoteASN: 2, holdTime: 24, localPort: 0}}
  - {name: d, address: 'fd00:100::9', interface: front, bgp: {localASN: 1, remoteASN: 2, holdTime: 3500ms}}
  - {name: e, address: 169.254.100.3, interface: front, bgp: {localASN: 1, remoteASN: 2, bfd: {switch: true}}}
  - {name: f, address: 169.254.100.4, interface: front, bgp: {localASN: 1, remoteASN: 2, bfd: {switch: true, minRx: 1s}}}
  - {name: e, address: 169.254.100.5, interface: front, bgp: {localASN: 1, remoteASN: 2}}
  - {name: g.h, address: 169.254.100.6, interface: front, bgp: {localASN: 1, remoteASN: 2}}
  - {name: g-h, address: 169.254.100.7, interface: front, bgp: {localASN: 1, remoteASN: 2}}
";
        let got = check(text).unwrap_err();
        let want = [
            "c.yaml:4:95: gatewayRouters[1].bgp.holdTime: 2s is out of range 3s..=65535s",
            "c.yaml:4:132: gatewayRouters[1].bgp.bfd.swich: unknown field (did you mean \"switch\"?)",
            "c.yaml:4:112: gatewayRouters[1].bgp.bfd.minTx: 5ms is out of range 10ms..=1m",
            "c.yaml:4:129: gatewayRouters[1].bgp.bfd.multiplier: 0 is out of range 1..=255",
            "c.yaml:5:73: gatewayRouters[2].bgp.localASN: 0 is out of range 1..=4294967295",
            "c.yaml:5:100: gatewayRouters[2].bgp.holdTime: \"24\" is not a duration: the unit is missing (ms, s or m)",
            "c.yaml:5:115: gatewayRouters[2].bgp.localPort: 0 is out of range 1..=65535",
            "c.yaml:6:100: gatewayRouters[3].bgp.holdTime: hold time 3500ms is not whole seconds",
            "c.yaml:3:5: gatewayRouters[0].interface: \"nope\" is neither a port nor a port's kernel interface (ports: front (vlan-100), back (sl1-back))",
            "c.yaml:9:5: gatewayRouters[6].name: gateway router \"e\" is defined twice (first at c.yaml:7:5: gatewayRouters[4])",
            "c.yaml:11:5: gatewayRouters[8].name: gateway routers \"g.h\" and \"g-h\" have the same BIRD protocol name gw_g_h: rename one",
        ];
        assert_eq!(got, want);
        let text = "gatewayRouters:\n  - {name: x, address: 10.9.9.9, interface: front, bgp: {localASN: 1, remoteASN: 2}}\n  - {name: y, address: 169.254.100.1, interface: front, bgp: {localASN: 1, remoteASN: 2}}\n";
        assert_eq!(check(text).unwrap_err(), [
            "c.yaml:2:5: gatewayRouters[0].address: 10.9.9.9 is not on a subnet of port \"front\" (169.254.100.1/24): the DC gateway must be directly connected",
            "c.yaml:3:5: gatewayRouters[1].address: 169.254.100.1 is the appliance's own address on port \"front\"",
        ]);
    }

    #[test]
    fn network_broadcast_and_shared_addresses_are_refused() {
        // front is 169.254.100.1/24: .0 and .255 are no router's address.
        let text = "gatewayRouters:
  - {name: net, address: 169.254.100.0, interface: front, bgp: {localASN: 1, remoteASN: 2}}
  - {name: bcast, address: 169.254.100.255, interface: front, bgp: {localASN: 1, remoteASN: 2}}
  - {name: a, address: 169.254.100.2, interface: front, bgp: {localASN: 1, remoteASN: 2}}
  - {name: b, address: 169.254.100.2, interface: vlan-100, bgp: {localASN: 1, remoteASN: 3}}
  - {name: v6, address: 'fd00:100::', interface: front, bgp: {localASN: 1, remoteASN: 2}}
";
        assert_eq!(check(text).unwrap_err(), [
            "c.yaml:2:5: gatewayRouters[0].address: 169.254.100.0 is the network address of port \"front\"'s subnet 169.254.100.1/24, not a router's address",
            "c.yaml:3:5: gatewayRouters[1].address: 169.254.100.255 is the broadcast address of port \"front\"'s subnet 169.254.100.1/24, not a router's address",
            "c.yaml:5:5: gatewayRouters[3].address: 169.254.100.2 is also the address of gateway router \"a\" (c.yaml:4:5: gatewayRouters[2]): one router, one session",
        ]);
        // A /31 (RFC 3021) has no network or broadcast address: both ends are usable.
        let mut ports = super::testing::ports();
        ports[1].addresses = vec![crate::config::IfAddr { addr: "10.0.0.0".parse().unwrap(), prefix: 31 }];
        let text = "gatewayRouters:\n  - {name: p2p, address: 10.0.0.1, interface: back, bgp: {localASN: 1, remoteASN: 2}}\n";
        assert_eq!(super::testing::check_on(text, &ports).map(|(_, r)| r.len()), Ok(1));
        ports[1].addresses = vec![crate::config::IfAddr { addr: "10.0.0.1".parse().unwrap(), prefix: 31 }];
        let text = "gatewayRouters:\n  - {name: p2p, address: 10.0.0.0, interface: back, bgp: {localASN: 1, remoteASN: 2}}\n";
        assert_eq!(super::testing::check_on(text, &ports).map(|(_, r)| r.len()), Ok(1));
    }

    #[test]
    fn intervals() {
        assert_eq!("300ms".parse::<Interval>(), Ok(Interval::ms(300)));
        assert_eq!(" 24s".parse::<Interval>(), Ok(Interval::ms(24_000)));
        assert_eq!("2m".parse::<Interval>(), Ok(Interval::ms(120_000)));
        assert!("1.5s".parse::<Interval>().unwrap_err().to_string().contains("unknown unit"));
        assert!("s".parse::<Interval>().unwrap_err().to_string().contains("whole number"));
        assert!("99999999999999999999m".parse::<Interval>().is_err());
        assert_eq!(Interval::ms(1500).to_string(), "1500ms");
        assert_eq!(Interval::ms(24_000).to_string(), "24s");
    }

    #[test]
    fn protocol_names() {
        assert_eq!(protocol_name("gateway-a.v4"), "gw_gateway_a_v4");
        // The longest name that fits keeps its protocol name as it is.
        let fits = "a".repeat(BIRD_SYMBOL_MAX - 3);
        assert_eq!(protocol_name(&fits), format!("gw_{fits}"));
        // Longer ones: a stable prefix and a hash of the whole name.
        let long = format!("{}-{}", "dc-gateway-router".repeat(5), "x".repeat(15));
        let other = format!("{}-{}", "dc-gateway-router".repeat(5), "y".repeat(15));
        let (a, b) = (protocol_name(&long), protocol_name(&other));
        assert_eq!(a.len(), BIRD_SYMBOL_MAX);
        assert_eq!(a, protocol_name(&long), "deterministic");
        assert_eq!(a, "gw_dc_gateway_routerdc_gateway_routerdc_gateway_route_95b9477e34");
        assert_eq!(a[..53], b[..53], "the same prefix");
        assert_ne!(a, b, "told apart by the hash");
        assert_eq!(protocol_name(&format!("{fits}b")).len(), BIRD_SYMBOL_MAX);
    }
}
