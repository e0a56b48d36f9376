//! The appliance configuration file (YAML): the machine (DPDK, ports,
//! gateways), defaults, the admin endpoint, and two sources of services:
//! inline `services`/`routes`, and a directory of Kubernetes-style
//! manifests (Gateway, L34Route, Service, EndpointSlice).
//!
//! Parsing never stops at the first problem: every one is collected with
//! its file, line, column and path, so `sluice check` can list them all.
//! Every number has bounds (those shared with other sources are in
//! [`crate::model::limits`]); the file itself is bounded as
//! [`yaml`] describes.

// Integers are range-checked by `Node::int` before any narrowing cast.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

pub mod fields;
pub mod kubernetes;
pub mod manifests;
pub mod node;
pub mod router;
pub mod schema;
pub mod siblings;
pub mod tls;
pub mod xds;
pub mod yaml;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use sluice_dataplane::addr::{Addr, Cidr};
use sluice_dataplane::classify::RouteMatch;
use sluice_dataplane::flow::FlowTimeouts;

use crate::model::{limits, Defaults, DeliveryMode, Desired, EndpointDef, Origin, RouteDef, ServiceDef};
use crate::problem::{Pos, Problem, Problems};
use node::Node;
use xds::XdsConfig;
use yaml::Value;

/// Bounds of the numbers only the configuration file sets.
pub mod bounds {
    /// DPDK memory (`dpdk.memoryMB`).
    pub(crate) const MEMORY_MB: (i64, i64) = (64, 1 << 20);
    /// Packet buffers (`dpdk.mbufs`).
    pub(crate) const MBUFS: (i64, i64) = (1023, 1 << 24);
    /// Bytes of memory one packet buffer takes at least: the mbuf header
    /// (128), its data room (2048 + 128 headroom) and the mempool's
    /// per-object header (64).
    pub(crate) const MBUF_BYTES: u64 = 128 + 2048 + 128 + 64;
    /// Descriptors per queue (`dpdk.descriptors`).
    pub(crate) const DESCRIPTORS: (i64, i64) = (64, 16384);
    /// A worker's longest pause when idle, in microseconds
    /// (`dpdk.idlePauseMaxMicros`): far below the liveness check's second.
    pub(crate) const IDLE_PAUSE_MAX_MICROS: (i64, i64) = (1, 100_000);
    /// Seconds a worker may go without polling before the process exits
    /// (`dpdk.stallExitSeconds`): above the second after which it is
    /// reported, and short enough for a supervisor to restart it soon.
    pub(crate) const STALL_EXIT_SECONDS: (i64, i64) = (2, 600);
    /// Flow-table entries per worker (`flowTable.entries`); an entry takes
    /// 72 bytes (8 in its bucket, 64 for its key), so at most 1.125 GiB per
    /// worker.
    pub(crate) const FLOW_ENTRIES: (i64, i64) = (16, 1 << 24);
    /// Seconds a flow is remembered without traffic, per protocol state
    /// (`flowTable.tcpEstablishedSeconds` and the others): up to the flow
    /// table's longest timeout.
    pub(crate) const FLOW_TIMEOUT_SECONDS: (i64, i64) = (1, sluice_dataplane::flow::MAX_TIMEOUT as i64);
    /// Service counter slots (`capacity.services`): 16 bytes each per worker.
    pub(crate) const SERVICES: (i64, i64) = (1, 1 << 20);
    /// Endpoint counter slots (`capacity.endpoints`): 16 bytes each per worker.
    pub(crate) const ENDPOINTS: (i64, i64) = (1, 1 << 22);
    /// Failed handshakes in a row that take an endpoint out (`health.fall`).
    pub(crate) const HEALTH_FALL: (i64, i64) = (1, 1000);
    /// An endpoint's first time out, in seconds (`health.ejectionSeconds`).
    pub(crate) const HEALTH_EJECTION_SECONDS: (i64, i64) = (1, 3600);
    /// Devices (ports and their exception taps) DPDK supports: its
    /// `RTE_MAX_ETHPORTS` (Debian's DPDK 22.11; the appliance's tests check
    /// that the linked DPDK agrees).
    pub const DPDK_DEVICES: usize = 32;
    /// Cores DPDK numbers: its `RTE_MAX_LCORE` (checked as above).
    pub const DPDK_CORES: u32 = 128;
    /// Simultaneous admin connections (`admin.maxConnections`).
    pub(crate) const ADMIN_CONNECTIONS: (i64, i64) = (1, 1024);
    /// Seconds an admin request may take (`admin.requestTimeoutSeconds`).
    pub(crate) const ADMIN_TIMEOUT_SECONDS: (i64, i64) = (1, 300);
}

/// Passive health (`health:`): what the endpoints' TCP handshakes decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassiveHealthConfig {
    /// On (`health.passive`, default true).
    pub enabled: bool,
    /// Failed handshakes in a row that take an endpoint out of new flows
    /// (`health.fall`, default 5).
    pub fall: u32,
    /// Seconds it is out the first time (`health.ejectionSeconds`, default
    /// 30); twice as long each time again, up to ten times this or 300 s.
    pub ejection_secs: u32,
}

impl Default for PassiveHealthConfig {
    fn default() -> Self {
        PassiveHealthConfig { enabled: true, fall: 5, ejection_secs: 30 }
    }
}

/// DPDK EAL settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpdkConfig {
    /// Cores (`-l`): the first runs the control thread, the others workers;
    /// a single core runs one worker with the control runtime beside it.
    pub lcores: String,
    /// Memory in MB (`-m`).
    pub memory_mb: u32,
    /// Use hugepages (else `--no-huge`); DPDK unlinks their files once
    /// mapped (`--huge-unlink`, unless `extra_args` say otherwise).
    pub hugepages: bool,
    /// Runtime directory prefix (`--file-prefix`).
    pub file_prefix: String,
    /// Mbufs in the packet pool.
    pub mbufs: u32,
    /// Receive and transmit descriptors per queue.
    pub descriptors: u16,
    /// More EAL arguments, passed as they are.
    pub extra_args: Vec<String>,
    /// Workers poll without ever pausing (`dpdk.busyPoll`): dedicated cores.
    pub busy_poll: bool,
    /// The longest pause of a worker that finds nothing, in microseconds
    /// (`dpdk.idlePauseMaxMicros`).
    pub idle_pause_max_us: u32,
    /// Idle workers wait on their ports' receive interrupts, where every
    /// port they poll has them, instead of sleeping (`dpdk.rxInterrupts`).
    pub rx_interrupts: bool,
    /// Workers keep a histogram of each packet's time through them
    /// (`dpdk.latencyHistogram`), served at the admin endpoint's `/latency`.
    pub latency_histogram: bool,
    /// A worker that has not polled for this many seconds makes the
    /// process exit non-zero, so that its supervisor starts it again
    /// (`dpdk.stallExitSeconds`).
    pub stall_exit_secs: u32,
}

/// An address of the appliance on a port, with its prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfAddr {
    /// The address.
    pub addr: Addr,
    /// Prefix length (0-32 or 0-128).
    pub prefix: u8,
}

impl IfAddr {
    /// The subnet.
    pub fn network(&self) -> Cidr {
        let len128 = if self.addr.is_v4() { 96 + u32::from(self.prefix) } else { u32::from(self.prefix) };
        let mask = if len128 == 0 { 0 } else { !0u128 << (128 - len128) };
        Cidr::new(Addr(self.addr.0 & mask), self.prefix).unwrap_or(Cidr::host(self.addr))
    }
}

impl std::fmt::Display for IfAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A port (NIC, VF or virtual device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortConfig {
    /// Name used elsewhere in the configuration.
    pub name: String,
    /// DPDK device: a PCI address, or a virtual device with its arguments
    /// (`net_af_packet0,iface=eth1`).
    pub device: String,
    /// The appliance's addresses on this port's network.
    pub addresses: Vec<IfAddr>,
    /// IP MTU.
    pub mtu: u16,
    /// The 802.1Q VLAN the port serves (0: none, untagged): it takes only
    /// frames tagged with it and tags everything it sends.
    pub vlan: u16,
    /// Kernel interface for the exception path (ARP/ND, BGP, ICMP to the
    /// appliance); empty for none.
    pub kernel_interface: String,
}

/// True when `device` (a name with optional `,key=value` arguments) is a
/// PCI address such as `0000:3b:00.0`, false for a virtual device.
pub fn is_pci_device(device: &str) -> bool {
    let d = device.split(',').next().unwrap_or("");
    d.contains(':') && d.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
}

impl PortConfig {
    /// True for a PCI device (passed with `-a`), false for a vdev.
    pub fn is_pci(&self) -> bool {
        is_pci_device(&self.device)
    }

    /// The DPDK device name (without arguments).
    pub fn device_name(&self) -> &str {
        self.device.split(',').next().unwrap_or(&self.device)
    }
}

/// Where return traffic goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Its address.
    pub address: Addr,
    /// The port it is on.
    pub port: String,
    /// Its MAC, when not resolved by the kernel.
    pub mac: Option<[u8; 6]>,
}

/// Manifests directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestsConfig {
    /// Directory of `.yaml`/`.yml` files (relative paths are from the config file).
    pub directory: PathBuf,
    /// The Gateway whose objects this appliance serves.
    pub gateway: String,
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApplianceConfig {
    /// Where it was read from.
    pub path: PathBuf,
    /// DPDK.
    pub dpdk: DpdkConfig,
    /// Ports.
    pub ports: Vec<PortConfig>,
    /// Gateways (at most one per family).
    pub gateways: Vec<GatewayConfig>,
    /// Service defaults.
    pub defaults: Defaults,
    /// Flow-table entries per worker.
    pub flow_entries: usize,
    /// Seconds a flow is remembered without traffic, per protocol state.
    pub flow_timeouts: FlowTimeouts,
    /// Admin HTTP listen address (loopback by default: anything else
    /// exposes `/metrics` and `/status` to the network).
    pub admin: SocketAddr,
    /// Most admin connections served at once (`admin.maxConnections`).
    pub admin_max_connections: u32,
    /// Seconds an admin request may take, reading and answering
    /// (`admin.requestTimeoutSeconds`).
    pub admin_request_timeout_secs: u32,
    /// Service counter slots.
    pub max_services: u32,
    /// Endpoint counter slots.
    pub max_endpoints: u32,
    /// Inline services, endpoints and routes.
    pub inline: Desired,
    /// Manifests, if any.
    pub manifests: Option<ManifestsConfig>,
    /// The xDS management server to follow (`xds-control-plane`), when
    /// enabled.
    pub xds: Option<XdsConfig>,
    /// BIRD and the DC gateways to announce VIPs to (`bird`,
    /// `gatewayRouters`; manifests add theirs in [`crate::sources::read`]).
    pub routing: router::RoutingConfig,
    /// The Kubernetes API as a source, if set (`kubernetes:`).
    pub kubernetes: Option<kubernetes::KubeConfig>,
    /// The sibling appliances to share flow pins with (`siblings:`), if any.
    pub siblings: Option<siblings::SiblingsConfig>,
    /// Passive health (`health:`, on by default): the workers record the
    /// endpoints' TCP handshakes, and an endpoint that stops answering
    /// drains.
    pub passive_health: PassiveHealthConfig,
    /// Where the settings only a restart applies are written.
    pub(crate) keys: KeyPositions,
}

/// The sections whose settings only a restart applies.
const START_ONLY: &[&str] = &["dpdk", "ports", "admin", "flowTable", "capacity", "siblings", "health"];

/// Where the file writes each setting that only a restart applies (its
/// sections, their keys, each port), to point a problem about one at it.
/// Positions are not part of what the configuration says: two files that
/// differ only in layout compare equal.
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyPositions(std::sync::Arc<Vec<(String, Pos)>>);

impl PartialEq for KeyPositions {
    fn eq(&self, _: &KeyPositions) -> bool {
        true
    }
}

impl Eq for KeyPositions {}

impl KeyPositions {
    fn of(v: &Value) -> KeyPositions {
        let mut keys = vec![(String::new(), v.pos())];
        for &section in START_ONLY {
            let Some(s) = v.get(section) else { continue };
            keys.push((section.to_owned(), s.pos()));
            match s.data() {
                yaml::Data::Map(m) => keys.extend(m.iter().filter_map(|(k, v)| Some((format!("{section}.{}", k.as_str()?), v.pos())))),
                yaml::Data::Seq(items) => keys.extend(items.iter().enumerate().map(|(i, v)| (format!("{section}[{i}]"), v.pos()))),
                _ => {}
            }
        }
        KeyPositions(std::sync::Arc::new(keys))
    }

    /// Where `path` is written; when it is not, where its section is, else
    /// the start of the file.
    pub(crate) fn at(&self, path: &str) -> Option<Pos> {
        let find = |p: &str| self.0.iter().find(|(k, _)| k == p).map(|(_, at)| *at);
        let section = path.split(['.', '[']).next().unwrap_or("");
        find(path).or_else(|| find(section)).or_else(|| find(""))
    }
}

impl ApplianceConfig {
    /// Why the running appliance, started with `running`, cannot take this
    /// configuration on a reload: each setting that only a restart applies
    /// and that differs, at the place the file writes it (or its section).
    /// Empty when the file may be reloaded.
    pub fn start_only_changes(&self, running: &ApplianceConfig) -> Vec<Problem> {
        fn text<T: std::fmt::Debug>(v: &T) -> String {
            format!("{v:?}")
        }
        let (was, now) = (running, self);
        let (a, b) = (&was.dpdk, &now.dpdk);
        let pairs: Vec<(&str, String, String)> = vec![
            ("dpdk.lcores", text(&a.lcores), text(&b.lcores)),
            ("dpdk.memoryMB", text(&a.memory_mb), text(&b.memory_mb)),
            ("dpdk.hugepages", text(&a.hugepages), text(&b.hugepages)),
            ("dpdk.filePrefix", text(&a.file_prefix), text(&b.file_prefix)),
            ("dpdk.mbufs", text(&a.mbufs), text(&b.mbufs)),
            ("dpdk.descriptors", text(&a.descriptors), text(&b.descriptors)),
            ("dpdk.extraArgs", text(&a.extra_args), text(&b.extra_args)),
            ("dpdk.busyPoll", text(&a.busy_poll), text(&b.busy_poll)),
            ("dpdk.idlePauseMaxMicros", text(&a.idle_pause_max_us), text(&b.idle_pause_max_us)),
            ("dpdk.rxInterrupts", text(&a.rx_interrupts), text(&b.rx_interrupts)),
            ("dpdk.latencyHistogram", text(&a.latency_histogram), text(&b.latency_histogram)),
            ("dpdk.stallExitSeconds", text(&a.stall_exit_secs), text(&b.stall_exit_secs)),
        ];
        let port = |p: Option<&PortConfig>| {
            p.map_or_else(
                || "no port".to_owned(),
                |p| {
                    let addrs: Vec<String> = p.addresses.iter().map(ToString::to_string).collect();
                    let vlan = if p.vlan == 0 { String::new() } else { format!(", vlan {}", p.vlan) };
                    format!(
                        "{} on {:?} (mtu {}{vlan}, addresses [{}], kernelInterface {:?})",
                        p.name,
                        p.device,
                        p.mtu,
                        addrs.join(", "),
                        p.kernel_interface
                    )
                },
            )
        };
        let ports: Vec<(String, String, String)> = (0..was.ports.len().max(now.ports.len()))
            .filter(|&i| was.ports.get(i) != now.ports.get(i))
            .map(|i| (format!("ports[{i}]"), port(was.ports.get(i)), port(now.ports.get(i))))
            .collect();
        let rest: Vec<(&str, String, String)> = vec![
            ("admin.listen", was.admin.to_string(), now.admin.to_string()),
            ("admin.maxConnections", text(&was.admin_max_connections), text(&now.admin_max_connections)),
            ("admin.requestTimeoutSeconds", text(&was.admin_request_timeout_secs), text(&now.admin_request_timeout_secs)),
            ("flowTable.entries", text(&was.flow_entries), text(&now.flow_entries)),
            ("flowTable.tcpEstablishedSeconds", text(&was.flow_timeouts.tcp_established), text(&now.flow_timeouts.tcp_established)),
            ("flowTable.tcpClosingSeconds", text(&was.flow_timeouts.tcp_closing), text(&now.flow_timeouts.tcp_closing)),
            ("flowTable.udpSeconds", text(&was.flow_timeouts.udp), text(&now.flow_timeouts.udp)),
            ("flowTable.otherSeconds", text(&was.flow_timeouts.other), text(&now.flow_timeouts.other)),
            ("capacity.services", text(&was.max_services), text(&now.max_services)),
            ("capacity.endpoints", text(&was.max_endpoints), text(&now.max_endpoints)),
            ("siblings", text(&was.siblings), text(&now.siblings)),
            ("health.passive", text(&was.passive_health.enabled), text(&now.passive_health.enabled)),
            ("health.fall", text(&was.passive_health.fall), text(&now.passive_health.fall)),
            ("health.ejectionSeconds", text(&was.passive_health.ejection_secs), text(&now.passive_health.ejection_secs)),
        ];
        let file = self.path.display().to_string();
        pairs
            .into_iter()
            .map(|(k, a, b)| (k.to_owned(), a, b))
            .chain(ports)
            .chain(rest.into_iter().map(|(k, a, b)| (k.to_owned(), a, b)))
            .filter(|(_, a, b)| a != b)
            .map(|(key, a, b)| {
                Problem::at(
                    file.clone(),
                    self.keys.at(&key),
                    key,
                    format!("{a} -> {b} takes effect at restart: the running appliance keeps {a} (restart it, or put back {a} to reload the rest)"),
                )
            })
            .collect()
    }

    /// A compilation failure of this configuration's model as a problem:
    /// one about capacity is placed at the key that raises it.
    pub fn compile_problem(&self, message: String, capacity_key: Option<&str>) -> Problem {
        let file = self.path.display().to_string();
        match capacity_key {
            Some(key) => Problem::at(file, self.keys.at(key), key, format!("{message} (it takes effect at restart)")),
            None => Problem::new(file, "", message),
        }
    }
}

/// Reads and checks the file (not the manifests it points to).
pub fn load(path: &Path) -> Result<ApplianceConfig, Vec<Problem>> {
    let file = path.display().to_string();
    let text = yaml::read(path, yaml::MAX_FILE_BYTES).map_err(|e| vec![Problem::new(file.clone(), "", e.to_string())])?;
    parse_str(&text, path)
}

/// Checks the text of a file read from `path`.
pub fn parse_str(text: &str, path: &Path) -> Result<ApplianceConfig, Vec<Problem>> {
    let file = path.display().to_string();
    let v = yaml::document(text, &mut yaml::Budget::default()).map_err(|e| vec![Problem::at(file, e.pos, "", e.message)])?;
    parse(&v, path)
}

/// Checks a parsed document read from `path`.
pub(crate) fn parse(v: &Value, path: &Path) -> Result<ApplianceConfig, Vec<Problem>> {
    let file = path.display().to_string();
    let root = Node::config_root(v, &file);
    let mut p = Problems::default();
    root.section(&mut p);

    let dpdk = root.field("dpdk", |n| dpdk(n, &mut p)).unwrap_or_else(dpdk_defaults);
    let ports = ports_section(&root, &mut p);
    let mbufs_at = v.get("dpdk").and_then(|d| d.get("mbufs").or(Some(d))).map_or(v.pos(), Value::pos);
    dpdk_fits(&mut p, &file, mbufs_at, &dpdk, ports.len());
    let gateways = gateways_section(&root, &mut p, &ports);
    let mut defaults = root.field("defaults", |n| defaults(n, &mut p)).unwrap_or_default();
    let (flow_entries, flow_timeouts) = flow_table_section(&root, &mut p);
    let (admin, admin_max_connections, admin_request_timeout_secs) = admin_section(&root, &mut p);
    let (max_services, max_endpoints) = capacity_section(&root, &mut p, &mut defaults);

    let mut inline = Desired::default();
    root.field("services", |n| n.each(&mut p, |n, p| service(n, p, &mut inline)));
    root.field("routes", |n| n.each(&mut p, |n, p| inline.routes.extend(route_inline(n, p))));
    let manifests = root.field("manifests", |n| manifests_section(n, &mut p, path));
    let xds = root.field("xds-control-plane", |n| xds::parse(n, &mut p, path.parent().unwrap_or(Path::new(".")))).flatten();
    let routing = routing(&root, &mut p, &dpdk.file_prefix, &ports, path);
    let kubernetes = root.field("kubernetes", |n| kubernetes::parse(n, &mut p, path)).flatten();
    let siblings = root.field("siblings", |n| siblings::parse(n, &mut p, path)).flatten();
    let mut passive_health = PassiveHealthConfig::default();
    root.field("health", |n| {
        let h = &mut passive_health;
        n.section(&mut p);
        n.field("passive", |n| n.boolean(&mut p).map(|v| h.enabled = v));
        n.field("fall", |n| n.bounded(&mut p).map(|v| h.fall = v as u32));
        n.field("ejectionSeconds", |n| n.bounded(&mut p).map(|v| h.ejection_secs = v as u32));
    });
    if siblings.as_ref().is_some_and(|s| s.kubernetes_pods) && kubernetes.is_none() {
        root.field("siblings", |n| {
            n.field("kubernetesPods", |n| n.bad(&mut p, "the pods of a Gateway's Deployment need a `kubernetes:` section (the Gateway and namespace)"));
        });
    }

    if !p.is_empty() {
        return Err(p.0);
    }
    Ok(ApplianceConfig {
        path: path.to_owned(),
        dpdk,
        ports,
        gateways,
        defaults,
        flow_entries,
        flow_timeouts,
        admin,
        admin_max_connections,
        admin_request_timeout_secs,
        max_services,
        max_endpoints,
        inline,
        manifests: manifests.flatten(),
        xds,
        routing,
        kubernetes,
        siblings,
        passive_health,
        keys: KeyPositions::of(v),
    })
}

/// The `ports:` list (required), each port checked against those before
/// it, and the devices they take against the most DPDK supports.
fn ports_section(root: &Node<'_>, p: &mut Problems) -> Vec<PortConfig> {
    let mut ports = Vec::new();
    root.required(p, "ports", |n, p| {
        n.each(p, |n, p| {
            if let Some(pc) = port(n, p, &ports) {
                ports.push(pc);
            }
        });
        let devices = ports.len() + ports.iter().filter(|x| !x.kernel_interface.is_empty()).count();
        if devices > bounds::DPDK_DEVICES {
            n.bad(p, format!(
                "{} ports and {} exception taps are more devices than DPDK supports ({})",
                ports.len(),
                devices - ports.len(),
                bounds::DPDK_DEVICES
            ));
        }
    });
    ports
}

/// The `gateways:` list, each on one of `ports`, at most one per family.
fn gateways_section(root: &Node<'_>, p: &mut Problems, ports: &[PortConfig]) -> Vec<GatewayConfig> {
    let mut gateways = Vec::new();
    root.field("gateways", |n| {
        n.each(p, |n, p| gateways.extend(gateway(n, p, ports)));
        for fam in [true, false] {
            if gateways.iter().filter(|g: &&GatewayConfig| g.address.is_v4() == fam).count() > 1 {
                n.bad(p, format!("more than one {} gateway", if fam { "IPv4" } else { "IPv6" }));
            }
        }
    });
    gateways
}

/// The `flowTable:` section: the entries per worker and the timeouts per
/// protocol state, defaults where unset.
fn flow_table_section(root: &Node<'_>, p: &mut Problems) -> (usize, FlowTimeouts) {
    let (mut flow_entries, mut flow_timeouts) = (65536usize, FlowTimeouts::default());
    root.field("flowTable", |n| {
        n.section(p);
        n.field("entries", |n| n.bounded(p).map(|e| flow_entries = e as usize));
        let t = &mut flow_timeouts;
        for (key, to) in [
            ("tcpEstablishedSeconds", &mut t.tcp_established),
            ("tcpClosingSeconds", &mut t.tcp_closing),
            ("udpSeconds", &mut t.udp),
            ("otherSeconds", &mut t.other),
        ] {
            n.field(key, |n| n.bounded(p).map(|e| *to = e as u16));
        }
    });
    (flow_entries, flow_timeouts)
}

/// The `admin:` section: the listen address (never an IPv4-mapped one),
/// the most connections served at once and the seconds a request may
/// take, defaults where unset.
fn admin_section(root: &Node<'_>, p: &mut Problems) -> (SocketAddr, u32, u32) {
    let mut admin: SocketAddr = ([127, 0, 0, 1], 9091).into();
    let (mut admin_max_connections, mut admin_request_timeout_secs) = (16u32, 10u32);
    root.field("admin", |n| {
        n.section(p);
        n.field("listen", |n| {
            let s = n.string(p)?;
            let host = s.trim().strip_prefix('[').and_then(|h| h.split_once(']')).map_or("", |(h, _)| h);
            if let Some(why) = fields::mapped_v4(host) {
                n.bad(p, why);
                return None;
            }
            n.parse::<SocketAddr>(p, "an address:port (127.0.0.1:9091, [::1]:9091)").map(|a| admin = a)
        });
        n.field("maxConnections", |n| n.bounded(p).map(|v| admin_max_connections = v as u32));
        n.field("requestTimeoutSeconds", |n| n.bounded(p).map(|v| admin_request_timeout_secs = v as u32));
    });
    (admin, admin_max_connections, admin_request_timeout_secs)
}

/// The `capacity:` section: the service and endpoint counter slots
/// (defaults where unset), and the lookup tables' memory budget, which
/// goes into `defaults`.
fn capacity_section(root: &Node<'_>, p: &mut Problems, defaults: &mut Defaults) -> (u32, u32) {
    let (mut max_services, mut max_endpoints) = (4096u32, 65536u32);
    root.field("capacity", |n| {
        n.section(p);
        n.field("services", |n| n.bounded(p).map(|e| max_services = e as u32));
        n.field("endpoints", |n| n.bounded(p).map(|e| max_endpoints = e as u32));
        n.field("tableMemoryMB", |n| n.bounded(p).map(|e| defaults.table_memory_mb = e as u32));
    });
    (max_services, max_endpoints)
}

/// The `manifests:` section at `n`: the directory (relative to the
/// configuration file at `path`) and the Gateway served; `None` when
/// either is missing or wrong (the gateway is not looked at when the
/// directory is missing).
fn manifests_section(n: Node<'_>, p: &mut Problems, path: &Path) -> Option<ManifestsConfig> {
    n.section(p);
    let dir = n.required(p, "directory", |n, p| n.string(p))?;
    let gateway = n.required(p, "gateway", fields::name)??;
    let base = path.parent().unwrap_or(Path::new("."));
    Some(ManifestsConfig { directory: base.join(dir?), gateway })
}

/// The `bird:` section and the `gatewayRouters:` list, checked against the ports.
fn routing(root: &Node<'_>, p: &mut Problems, prefix: &str, ports: &[PortConfig], path: &Path) -> router::RoutingConfig {
    let base = path.parent().unwrap_or(Path::new("."));
    let bird = router::parse_bird(root, p, prefix, base);
    let list = root.field("gatewayRouters", |n| router::parse_list(n, p)).unwrap_or_default();
    let (router_id, routers) = router::resolve(list, ports, bird.router_id, p);
    router::RoutingConfig { bird, router_id, routers }
}

fn dpdk_defaults() -> DpdkConfig {
    DpdkConfig {
        lcores: "0,1".into(),
        memory_mb: 512,
        hugepages: false,
        file_prefix: "sluice".into(),
        mbufs: 8191,
        descriptors: 1024,
        extra_args: Vec::new(),
        busy_poll: false,
        idle_pause_max_us: 2000,
        rx_interrupts: true,
        latency_histogram: false,
        stall_exit_secs: 10,
    }
}

fn dpdk(n: Node<'_>, p: &mut Problems) -> DpdkConfig {
    let mut d = dpdk_defaults();
    n.section(p);
    n.field("lcores", |n| {
        if let Some(s) = n.string(p) {
            match cores(&s) {
                Ok(_) => d.lcores = s,
                Err(why) => n.bad(p, why.to_string()),
            }
        }
    });
    n.field("memoryMB", |n| n.bounded(p).map(|v| d.memory_mb = v as u32));
    n.field("hugepages", |n| n.boolean(p).map(|v| d.hugepages = v));
    n.field("filePrefix", |n| fields::name(n, p).map(|v| d.file_prefix = v));
    n.field("mbufs", |n| n.bounded(p).map(|v| d.mbufs = v as u32));
    n.field("descriptors", |n| n.bounded(p).map(|v| d.descriptors = v as u16));
    n.field("extraArgs", |n| n.each(p, |n, p| d.extra_args.extend(n.string(p))));
    n.field("busyPoll", |n| n.boolean(p).map(|v| d.busy_poll = v));
    n.field("idlePauseMaxMicros", |n| n.bounded(p).map(|v| d.idle_pause_max_us = v as u32));
    n.field("rxInterrupts", |n| n.boolean(p).map(|v| d.rx_interrupts = v));
    n.field("latencyHistogram", |n| n.boolean(p).map(|v| d.latency_histogram = v));
    n.field("stallExitSeconds", |n| n.bounded(p).map(|v| d.stall_exit_secs = v as u32));
    d
}

/// The lcores of a core list (`0,1`, `0-3`, `0,2-5`), or of lcores placed
/// on CPUs as EAL's `--lcores` writes them (`0@0,1@0,2@1`: lcores 0 and 1
/// share CPU 0, lcore 2 runs on CPU 1), or why it is not a usable one:
/// each lcore once, below DPDK's `RTE_MAX_LCORE`, each CPU a number. One
/// lcore runs a worker with the control runtime beside it; with more, the
/// first runs the control runtime and the others workers.
pub fn cores(s: &str) -> Result<Vec<u32>, CoresError> {
    let max = bounds::DPDK_CORES;
    let mut cores: Vec<u32> = Vec::new();
    for part in s.split(',') {
        let part = match part.split_once('@') {
            Some((lcore, cpu)) => {
                let (Ok(_), Ok(_)) = (lcore.trim().parse::<u32>(), cpu.trim().parse::<u32>()) else {
                    return Err(CoresError::NotAList(s.to_owned()));
                };
                lcore
            }
            None => part,
        };
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (Ok(a), Ok(b)) = (a.trim().parse::<u32>(), b.trim().parse::<u32>()) else {
            return Err(CoresError::NotAList(s.to_owned()));
        };
        if a > b {
            return Err(CoresError::Reversed(a, b));
        }
        if b >= max {
            return Err(CoresError::BeyondLimit(b));
        }
        for c in a..=b {
            if cores.contains(&c) {
                return Err(CoresError::Twice(c));
            }
            cores.push(c);
        }
    }
    Ok(cores)
}

/// Whether a core list (`dpdk.lcores`) places its lcores on CPUs
/// (`0@0,1@0,2@1`): EAL takes it as `--lcores` then, as `-l` otherwise.
pub fn cores_are_placed(s: &str) -> bool {
    s.contains('@')
}

/// Why a core list (`dpdk.lcores`) cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoresError {
    /// It is not a list of cores and core ranges.
    #[error("{0:?} is not a core list (like 0,1 or 0-3, or 0@0,1@0,2@1 to place lcores on CPUs)")]
    NotAList(String),
    /// A range whose first core is above its last.
    #[error("core range {0}-{1} is reversed (write {1}-{0})")]
    Reversed(u32, u32),
    /// A core DPDK does not number.
    #[error("core {0} is beyond DPDK's limit (cores are 0..{last})", last = bounds::DPDK_CORES - 1)]
    BeyondLimit(u32),
    /// A core listed twice.
    #[error("core {0} is listed twice")]
    Twice(u32),
}

/// Checks that the packet buffers fit the memory and fill the receive
/// rings of `ports` ports; a problem is about `mbufs`, at `at`.
fn dpdk_fits(p: &mut Problems, file: &str, at: Pos, d: &DpdkConfig, ports: usize) {
    let need_mb = (u64::from(d.mbufs) * bounds::MBUF_BYTES).div_ceil(1 << 20);
    if need_mb > u64::from(d.memory_mb) {
        p.add(file, Some(at), "dpdk.mbufs", format!(
            "{} mbufs take at least {need_mb} MB, more than dpdk.memoryMB ({})",
            d.mbufs, d.memory_mb
        ));
    }
    let workers = cores(&d.lcores).map_or(0, |c| c.len().saturating_sub(1).max(1)) as u64;
    let rx = ports as u64 * workers * u64::from(d.descriptors);
    if rx > u64::from(d.mbufs) {
        p.add(file, Some(at), "dpdk.mbufs", format!(
            "{} mbufs cannot fill the receive rings: {ports} port(s) x {workers} worker(s) x {} descriptors need {rx}",
            d.mbufs, d.descriptors
        ));
    }
}

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn if_addr(n: Node<'_>, p: &mut Problems) -> Option<IfAddr> {
    let s = n.string(p)?;
    let bad = |p: &mut Problems| {
        n.bad(p, format!("{s:?} is not an interface address (like 10.0.0.1/24 or 2001:db8::1/64)"));
        None
    };
    if let Some(why) = fields::mapped_v4(&s) {
        n.bad(p, why);
        return None;
    }
    let Some((a, l)) = s.trim().split_once('/') else { return bad(p) };
    let (Ok(addr), Ok(prefix)) = (a.parse::<Addr>(), l.parse::<u8>()) else { return bad(p) };
    if prefix > if addr.is_v4() { 32 } else { 128 } {
        return bad(p);
    }
    Some(IfAddr { addr, prefix })
}

fn port(n: Node<'_>, p: &mut Problems, before: &[PortConfig]) -> Option<PortConfig> {
    n.section(p);
    let name = n.required(p, "name", |n, p| {
        let name = fields::name(n, p)?;
        if before.iter().any(|b| b.name == name) {
            n.bad(p, format!("port name {name:?} is used twice"));
        }
        Some(name)
    });
    let device = n.required(p, "device", |n, p| {
        let device = n.string(p)?;
        let dev_name = device.split(',').next().unwrap_or("");
        if before.iter().any(|b| b.device_name() == dev_name) {
            n.bad(p, format!("device {dev_name:?} is used twice"));
        }
        Some(device)
    });
    let mut addresses = Vec::new();
    n.field("addresses", |n| n.each(p, |n, p| addresses.extend(if_addr(n, p))));
    let mtu = n.field("mtu", |n| n.bounded(p)).flatten().unwrap_or(1500) as u16;
    if mtu < limits::MTU_MIN_IPV6 {
        if let Some(a) = addresses.iter().find(|a| !a.addr.is_v4()) {
            let at = n.v.get("mtu").map_or(n.v.pos(), Value::pos);
            p.add(n.file(), Some(at), &child(n.path(), "mtu"), format!(
                "MTU {mtu} is below {}, the least IPv6 allows, and the port has IPv6 address {a}",
                limits::MTU_MIN_IPV6
            ));
        }
    }
    let vlan = n.field("vlan", |n| n.bounded(p)).flatten().map_or(0, |v| v as u16);
    let default_if = format!("sl{}-{}", before.len(), name.clone().flatten().as_deref().unwrap_or(""));
    let kernel_interface = n.field("kernelInterface", |n| n.string(p)).flatten().unwrap_or(default_if);
    if kernel_interface.len() > 15 {
        n.bad(p, format!("kernel interface name {kernel_interface:?} is longer than 15 characters (set kernelInterface)"));
    }
    Some(PortConfig {
        name: name??,
        device: device??,
        addresses,
        mtu,
        vlan,
        kernel_interface: kernel_interface.chars().take(15).collect(),
    })
}

fn gateway(n: Node<'_>, p: &mut Problems, ports: &[PortConfig]) -> Option<GatewayConfig> {
    n.section(p);
    let address = n.required(p, "address", fields::addr).flatten();
    let port = n
        .required(p, "port", |n, p| {
            let s = n.string(p)?;
            if !ports.iter().any(|x| x.name == s) {
                n.bad(p, format!("unknown port {s:?}"));
                return None;
            }
            Some(s)
        })
        .flatten();
    let mac = n.field("mac", |n| fields::mac(n, p)).flatten();
    Some(GatewayConfig { address: address?, port: port?, mac })
}

fn defaults(n: Node<'_>, p: &mut Problems) -> Defaults {
    let mut d = Defaults::default();
    n.section(p);
    n.field("algorithm", |n| n.parse(p, "an algorithm").map(|a| d.algorithm = a));
    n.field("endpointLimit", |n| fields::endpoint_limit(n, p).map(|v| d.limit = v));
    n.field("flowTable", |n| n.boolean(p).map(|v| d.flow_table = v));
    n.field("delivery", |n| n.parse::<DeliveryMode>(p, "a delivery").map(|v| d.delivery = v));
    d
}

fn origin(n: &Node<'_>) -> Origin {
    Origin { file: n.file().into(), pos: n.pos(), path: n.path().into() }
}

/// Service settings shared by the inline form and manifests' annotations
/// are parsed by their callers; this is the inline form.
fn service(n: Node<'_>, p: &mut Problems, out: &mut Desired) {
    n.section(p);
    let Some(name) = n.required(p, "name", fields::name).flatten() else { return };
    let def = ServiceDef {
        name: name.clone(),
        algorithm: n.field("algorithm", |n| n.parse(p, "an algorithm")).flatten(),
        limit: n.field("endpointLimit", |n| fields::endpoint_limit(n, p)).flatten(),
        table_size: n.field("tableSize", |n| fields::table_size(n, p)).flatten(),
        flow_table: n.field("flowTable", |n| n.boolean(p)).flatten(),
        delivery: n.field("delivery", |n| n.parse::<DeliveryMode>(p, "a delivery")).flatten(),
        check: n.field("healthCheck", |n| fields::health_check(n, p)).flatten().map(std::sync::Arc::new),
        origin: origin(&n),
    };
    out.services.push(def);
    // One name for all the service's endpoints, which are one run.
    let shared = std::sync::Arc::new(name);
    let mut eps = Vec::new();
    n.field("endpoints", |n| {
        n.each(p, |n, p| {
            n.section(p);
            let id = n.required(p, "id", |n, p| n.bounded(p)).flatten();
            let address = n.required(p, "address", fields::addr).flatten();
            let weight = n.field("weight", |n| n.bounded(p)).flatten().unwrap_or(1);
            let draining = n.field("draining", |n| n.boolean(p)).flatten().unwrap_or(false);
            let mac = n.field("mac", |n| fields::mac(n, p)).flatten();
            if let (Some(id), Some(address)) = (id, address) {
                eps.push(EndpointDef {
                    service: std::sync::Arc::clone(&shared),
                    id: id as u32,
                    address,
                    weight: weight as u32,
                    draining,
                    mac,
                    origin: std::sync::Arc::new(origin(&n)),
                });
            }
        })
    });
    out.endpoints.push_run(eps);
}

/// Route fields common to the inline form and L34Route's spec.
pub(crate) fn route_fields(n: Node<'_>, p: &mut Problems, name: String, service: String) -> Option<RouteDef> {
    let mut vips = Vec::new();
    let mut have_dst = false;
    for key in ["vips", "destinationCIDRs"] {
        n.field(key, |n| {
            have_dst = true;
            n.each(p, |n, p| vips.extend(fields::vip(n, p)));
        });
    }
    if !have_dst {
        n.bad(p, "missing field \"destinationCIDRs\" (the VIPs)");
    }
    let priority = n.field("priority", |n| n.bounded(p)).flatten().unwrap_or(0) as i32;
    let mut m = RouteMatch { vips, ..RouteMatch::default() };
    n.field("sourceCIDRs", |n| n.each(p, |n, p| m.src_cidrs.extend(fields::cidr(n, p))));
    n.field("sourcePorts", |n| n.each(p, |n, p| m.src_ports.extend(fields::port_range(n, p))));
    n.field("destinationPorts", |n| n.each(p, |n, p| m.dst_ports.extend(fields::port_range(n, p))));
    n.field("protocols", |n| n.each(p, |n, p| m.protocols.extend(fields::protocol(n, p))));
    n.field("byteMatches", |n| n.each(p, |n, p| m.byte_matches.extend(fields::byte_match(n, p))));
    m.protocols.sort_unstable();
    if m.protocols.windows(2).any(|w| w[0] == w[1]) {
        n.bad(p, "a protocol is listed twice");
    }
    let has_ports = [&m.src_ports, &m.dst_ports].iter().any(|l| !l.is_empty() && !l.contains(&sluice_dataplane::classify::PortRange::ANY));
    if has_ports && m.protocols.is_empty() {
        n.bad(p, "ports are set but protocols are not: ports mean nothing without TCP, UDP or SCTP");
    }
    for b in &m.byte_matches {
        if !m.protocols.is_empty() && !m.protocols.contains(&b.proto) {
            n.bad(p, format!(
                "a byte match is about {} but the route does not carry it: it would never apply",
                fields::protocol_name(b.proto)
            ));
        }
    }
    Some(RouteDef { name, service, priority, matches: std::sync::Arc::new(m), origin: origin(&n) })
}

fn route_inline(n: Node<'_>, p: &mut Problems) -> Option<RouteDef> {
    n.section(p);
    let name = n.required(p, "name", fields::name).flatten();
    let service = n.required(p, "service", fields::name).flatten();
    let r = route_fields(n, p, name.clone().unwrap_or_default(), service.clone().unwrap_or_default());
    name?;
    service?;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACHINE: &str = "dpdk: {lcores: \"0,1\"}\nports:\n  - {name: front, device: net_null0, addresses: [10.0.0.1/24]}\n";

    fn problems(text: &str) -> Vec<String> {
        parse_str(text, Path::new("c.yaml")).unwrap_err().iter().map(ToString::to_string).collect()
    }

    #[test]
    fn mapped_addresses_are_refused_everywhere() {
        let text = r#"
dpdk: {lcores: "0,1"}
ports:
  - {name: front, device: net_null0, addresses: ["::ffff:10.0.0.1/120"]}
gateways:
  - {address: "::ffff:10.0.0.2", port: front}
admin: {listen: "[::ffff:127.0.0.1]:9091"}
services:
  - name: web
    endpoints: [{id: 0, address: "::ffff:10.0.0.3"}]
routes:
  - {name: r, service: web, destinationCIDRs: ["::ffff:20.0.0.1/128"], sourceCIDRs: ["::ffff:10.0.0.0/104"]}
"#;
        let got = problems(text);
        let want = [
            "c.yaml:4:50: ports[0].addresses[0]: \"::ffff:10.0.0.1/120\" is an IPv4-mapped IPv6 address: write the IPv4 form, 10.0.0.1/24",
            "c.yaml:6:15: gateways[0].address: \"::ffff:10.0.0.2\" is an IPv4-mapped IPv6 address: write the IPv4 form, 10.0.0.2",
            "c.yaml:7:17: admin.listen: \"::ffff:127.0.0.1\" is an IPv4-mapped IPv6 address: write the IPv4 form, 127.0.0.1",
            "c.yaml:10:34: services[0].endpoints[0].address: \"::ffff:10.0.0.3\" is an IPv4-mapped IPv6 address: write the IPv4 form, 10.0.0.3",
            "c.yaml:12:48: routes[0].destinationCIDRs[0]: \"::ffff:20.0.0.1/128\" is an IPv4-mapped IPv6 address: write the IPv4 form, 20.0.0.1/32",
            "c.yaml:12:86: routes[0].sourceCIDRs[0]: \"::ffff:10.0.0.0/104\" is an IPv4-mapped IPv6 address: write the IPv4 form, 10.0.0.0/8",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn endpoint_and_gateway_macs_are_unicast() {
        let text = r#"
dpdk: {lcores: "0,1"}
ports:
  - {name: front, device: net_null0, addresses: [10.0.0.1/24]}
gateways:
  - {address: 10.0.0.2, port: front, mac: "01:00:5e:00:00:01"}
services:
  - name: web
    endpoints:
      - {id: 0, address: 10.0.0.3, mac: "ff:ff:ff:ff:ff:ff"}
      - {id: 1, address: 10.0.0.4, mac: "00:00:00:00:00:00"}
      - {id: 2, address: 10.0.0.5, mac: "33:33:00:00:00:01"}
      - {id: 3, address: 10.0.0.6, mac: "02:00:00:00:00:06"}
"#;
        assert_eq!(problems(text), [
            "c.yaml:6:43: gateways[0].mac: \"01:00:5e:00:00:01\" is a multicast MAC: a next hop needs a unicast MAC (the low bit of the first byte clear)",
            "c.yaml:10:41: services[0].endpoints[0].mac: \"ff:ff:ff:ff:ff:ff\" is the broadcast MAC: a next hop needs a unicast MAC (the low bit of the first byte clear)",
            "c.yaml:11:41: services[0].endpoints[1].mac: \"00:00:00:00:00:00\" is the all-zero MAC: a next hop needs a unicast MAC (the low bit of the first byte clear)",
            "c.yaml:12:41: services[0].endpoints[2].mac: \"33:33:00:00:00:01\" is a multicast MAC: a next hop needs a unicast MAC (the low bit of the first byte clear)",
        ]);
    }

    #[test]
    fn ports_are_checked_where_they_are_written() {
        let text = r#"
dpdk: {lcores: "0,1", mbufs: 1023, descriptors: 1024}
ports:
  - {name: a, device: "net_null0", addresses: ["2001:db8::1/64"], mtu: 1279}
  - {name: a, device: "net_null0,size=64", mtu: 576}
gateways:
  - {address: 10.0.0.9, port: a}
  - {address: 10.0.0.10, port: a}
"#;
        let got = problems(text);
        let want = [
            "c.yaml:4:72: ports[0].mtu: MTU 1279 is below 1280, the least IPv6 allows, and the port has IPv6 address 2001:db8::1/64",
            "c.yaml:5:12: ports[1].name: port name \"a\" is used twice",
            "c.yaml:5:23: ports[1].device: device \"net_null0\" is used twice",
            "c.yaml:2:30: dpdk.mbufs: 1023 mbufs cannot fill the receive rings: 2 port(s) x 1 worker(s) x 1024 descriptors need 2048",
            "c.yaml:7:3: gateways: more than one IPv4 gateway",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn idle_policy_fields() {
        let port = "ports: [{name: a, device: net_null0}]\n";
        let c = parse_str(&format!("dpdk: {{busyPoll: true, idlePauseMaxMicros: 50, latencyHistogram: true, rxInterrupts: false}}\n{port}"), Path::new("c.yaml")).unwrap();
        assert!(c.dpdk.busy_poll && c.dpdk.latency_histogram && !c.dpdk.rx_interrupts);
        assert_eq!(c.dpdk.idle_pause_max_us, 50);
        let d = parse_str(port, Path::new("c.yaml")).unwrap();
        assert_eq!((d.dpdk.busy_poll, d.dpdk.idle_pause_max_us, d.dpdk.latency_histogram), (false, 2000, false));
        assert!(d.dpdk.rx_interrupts, "on by default");
        assert_eq!(problems(&format!("dpdk: {{busyPoll: 1, idlePauseMaxMicros: 0, latencyHistogram: 2, rxInterrupts: 3}}\n{port}")).len(), 4);
        assert_eq!(problems(&format!("dpdk: {{idlePauseMaxMicros: 100001}}\n{port}")).len(), 1);
        assert_eq!(d.dpdk.stall_exit_secs, 10);
        assert_eq!(parse_str(&format!("dpdk: {{stallExitSeconds: 3}}\n{port}"), Path::new("c.yaml")).unwrap().dpdk.stall_exit_secs, 3);
        assert_eq!(problems(&format!("dpdk: {{stallExitSeconds: 1}}\n{port}")), ["c.yaml:1:26: dpdk.stallExitSeconds: 1 is out of range 2..=600"]);
    }

    #[test]
    fn core_lists() {
        assert_eq!(cores("0,1"), Ok(vec![0, 1]));
        assert_eq!(cores(" 0-3, 8"), Ok(vec![0, 1, 2, 3, 8]));
        assert_eq!(cores("3-1").unwrap_err().to_string(), "core range 3-1 is reversed (write 1-3)");
        assert_eq!(cores("0,1,1").unwrap_err().to_string(), "core 1 is listed twice");
        assert_eq!(cores("0-4294967295").unwrap_err().to_string(), "core 4294967295 is beyond DPDK's limit (cores are 0..127)");
        assert!(cores("0;1").unwrap_err().to_string().contains("not a core list"));
        assert_eq!(cores("5"), Ok(vec![5]), "one core: a worker, the control runtime beside it");
        // Lcores placed on CPUs (EAL's --lcores): two workers and the
        // control side on two CPUs.
        assert_eq!(cores("0@0,1@0,2@1"), Ok(vec![0, 1, 2]));
        assert!(cores_are_placed("0@0,1@0,2@1") && !cores_are_placed("0-2"));
        assert_eq!(cores("0@0,0@1").unwrap_err().to_string(), "core 0 is listed twice");
        for bad in ["0-2@1", "(0-2)@1", "1@", "@1", "1@x"] {
            assert!(cores(bad).unwrap_err().to_string().contains("not a core list"), "{bad}");
        }
        // Defaults count too: 9 ports x 1 worker x 1024 descriptors > 8191 mbufs.
        let ports: String = (0..9).map(|i| format!("  - {{name: p{i}, device: net_null{i}}}\n")).collect();
        assert_eq!(problems(&format!("ports:\n{ports}")), [
            "c.yaml:1:1: dpdk.mbufs: 8191 mbufs cannot fill the receive rings: 9 port(s) x 1 worker(s) x 1024 descriptors need 9216",
        ]);
    }

    #[test]
    fn passive_health_is_on_unless_turned_off_and_takes_effect_at_restart() {
        assert_eq!(parse_str(MACHINE, Path::new("c.yaml")).unwrap().passive_health, PassiveHealthConfig::default());
        let off = parse_str(&format!("{MACHINE}health: {{passive: false}}\n"), Path::new("c.yaml")).unwrap();
        assert!(!off.passive_health.enabled);
        let tuned = parse_str(&format!("{MACHINE}health: {{fall: 3, ejectionSeconds: 5}}\n"), Path::new("c.yaml")).unwrap();
        assert_eq!(tuned.passive_health, PassiveHealthConfig { enabled: true, fall: 3, ejection_secs: 5 });
        let on = parse_str(MACHINE, Path::new("c.yaml")).unwrap();
        let change = off.start_only_changes(&on);
        assert_eq!(change.len(), 1, "{change:?}");
        assert!(change[0].to_string().contains("health.passive"), "{}", change[0]);
        let bad = problems(&format!("{MACHINE}health: {{passive: maybe, active: true, fall: 0, ejectionSeconds: 3601}}\n"));
        assert_eq!(bad.len(), 4, "{bad:?}");
    }

    #[test]
    fn admin_and_capacity() {
        let c = parse_str(MACHINE, Path::new("c.yaml")).unwrap();
        assert!(c.admin.ip().is_loopback(), "loopback by default");
        assert_eq!((c.admin_max_connections, c.admin_request_timeout_secs), (16, 10));
        assert_eq!(c.defaults.table_memory_mb, limits::TABLE_MEMORY_MB_DEFAULT);
        let text = format!(
            "{MACHINE}admin: {{listen: \"0.0.0.0:9091\", maxConnections: 4, requestTimeoutSeconds: 30}}\ncapacity: {{tableMemoryMB: 64}}\n"
        );
        let c = parse_str(&text, Path::new("c.yaml")).unwrap();
        assert!(!c.admin.ip().is_loopback());
        assert_eq!((c.admin_max_connections, c.admin_request_timeout_secs, c.defaults.table_memory_mb), (4, 30, 64));
        let ipv6 = format!("{MACHINE}admin: {{listen: \"[::1]:9091\"}}\n");
        assert!(parse_str(&ipv6, Path::new("c.yaml")).unwrap().admin.ip().is_loopback());
        let bad = format!(
            "{MACHINE}admin: {{maxConnections: 0, requestTimeoutSeconds: 301}}\ncapacity: {{tableMemoryMB: 65537, endpoints: 4194305}}\nflowTable: {{entries: 16777217}}\n"
        );
        assert_eq!(problems(&bad), [
            "c.yaml:6:22: flowTable.entries: 16777217 is out of range 16..=16777216",
            "c.yaml:4:25: admin.maxConnections: 0 is out of range 1..=1024",
            "c.yaml:4:51: admin.requestTimeoutSeconds: 301 is out of range 1..=300",
            "c.yaml:5:45: capacity.endpoints: 4194305 is out of range 1..=4194304",
            "c.yaml:5:27: capacity.tableMemoryMB: 65537 is out of range 1..=65536",
        ]);
    }

    #[test]
    fn flow_timeouts_per_state_replace_idle_seconds() {
        let c = parse_str(MACHINE, Path::new("c.yaml")).unwrap();
        assert_eq!(c.flow_timeouts, FlowTimeouts { tcp_established: 3600, tcp_closing: 60, udp: 300, other: 60 });
        assert!(c.defaults.flow_table, "flows are pinned by default");
        let text = format!("{MACHINE}flowTable: {{tcpEstablishedSeconds: 7200, tcpClosingSeconds: 30, udpSeconds: 120, otherSeconds: 10}}\n");
        let c = parse_str(&text, Path::new("c.yaml")).unwrap();
        assert_eq!(c.flow_timeouts, FlowTimeouts { tcp_established: 7200, tcp_closing: 30, udp: 120, other: 10 });
        let old = format!("{MACHINE}flowTable: {{idleSeconds: 300, udpSeconds: 16385}}\n");
        let p = problems(&old);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().any(|m| m.contains("flowTable.udpSeconds: 16385 is out of range 1..=16384")), "{p:?}");
        assert!(
            p.iter().any(|m| m.contains("flowTable.idleSeconds: replaced by one timeout per protocol state: tcpEstablishedSeconds")),
            "{p:?}"
        );
    }

    #[test]
    fn service_numbers_are_bounded_where_written() {
        let text = format!(
            "{MACHINE}services:\n  - {{name: a, endpointLimit: 65537, tableSize: 16777259}}\n  - {{name: b, tableSize: 4294967291, endpoints: [{{id: 65536, address: 10.0.0.5, weight: 1048577}}]}}\n"
        );
        assert_eq!(problems(&text), [
            "c.yaml:5:30: services[0].endpointLimit: 65537 is out of range 1..=65536",
            "c.yaml:5:48: services[0].tableSize: 16777259 is out of range 1..=16777213",
            "c.yaml:6:26: services[1].tableSize: 4294967291 is out of range 1..=16777213",
            "c.yaml:6:55: services[1].endpoints[0].id: 65536 is out of range 0..=65535",
            "c.yaml:6:89: services[1].endpoints[0].weight: 1048577 is out of range 0..=1048576",
        ]);
    }

    #[test]
    fn unreadable_and_invalid_files() {
        let e = load(Path::new("/nonexistent/c.yaml")).unwrap_err();
        assert_eq!(e.len(), 1);
        assert!(e[0].to_string().starts_with("/nonexistent/c.yaml: cannot read: "), "no position: {}", e[0]);
        assert_eq!(problems("a: [1\n"), ["c.yaml:2:1: not valid YAML: while parsing a flow sequence, expected ',' or ']'"]);
        assert_eq!(problems(""), ["c.yaml:1:1: expected a mapping, found nothing", "c.yaml:1:1: missing field \"ports\""]);
    }

    #[test]
    fn a_port_may_serve_one_vlan() {
        let c = parse_str("dpdk: {lcores: \"0,1\"}\nports:\n  - {name: a, device: net_null0, vlan: 100}\n  - {name: b, device: net_null1}\n", Path::new("c.yaml")).unwrap();
        assert_eq!((c.ports[0].vlan, c.ports[1].vlan), (100, 0), "none by default");
        for bad in ["0", "4095", "x"] {
            let got = problems(&format!("dpdk: {{lcores: \"0,1\"}}\nports:\n  - {{name: a, device: net_null0, vlan: {bad}}}\n"));
            assert!(got.len() == 1 && got[0].starts_with("c.yaml:3:40: ports[0].vlan: "), "{bad}: {got:?}");
        }
    }
}
