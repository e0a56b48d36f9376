//! The appliance configuration file (YAML): the machine (DPDK, ports,
//! gateways), defaults, the admin endpoint, and two sources of services:
//! inline `services`/`routes`, and a directory of Kubernetes-style
//! manifests (Gateway, L34Route, Service, EndpointSlice).
//!
//! Parsing never stops at the first problem: every one is collected with
//! its file and path, so `sluice check` can list them all.

// Integers are range-checked by `Node::int` before any narrowing cast.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

pub mod fields;
pub mod manifests;
pub mod node;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde_yaml::Value;
use sluice_dataplane::addr::{Addr, Cidr};
use sluice_dataplane::classify::RouteMatch;

use crate::model::{Defaults, DeliveryMode, Desired, EndpointDef, Origin, RouteDef, ServiceDef};
use node::{Node, Problem, Problems};

/// DPDK EAL settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpdkConfig {
    /// Cores (`-l`): the first runs the control thread, the others workers.
    pub lcores: String,
    /// Memory in MB (`-m`).
    pub memory_mb: u32,
    /// Use hugepages (else `--no-huge`).
    pub hugepages: bool,
    /// Runtime directory prefix (`--file-prefix`).
    pub file_prefix: String,
    /// Mbufs in the packet pool.
    pub mbufs: u32,
    /// Receive and transmit descriptors per queue.
    pub descriptors: u16,
    /// More EAL arguments, passed as they are.
    pub extra_args: Vec<String>,
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
    /// Kernel interface for the exception path (ARP/ND, BGP, ICMP to the
    /// appliance); empty for none.
    pub kernel_interface: String,
}

impl PortConfig {
    /// True for a PCI device (passed with `-a`), false for a vdev.
    pub fn is_pci(&self) -> bool {
        let d = self.device.split(',').next().unwrap_or("");
        d.contains(':') && d.chars().all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
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
    /// Seconds a flow is remembered without traffic.
    pub flow_idle_secs: u32,
    /// Admin HTTP listen address.
    pub admin: SocketAddr,
    /// Service counter slots.
    pub max_services: u32,
    /// Endpoint counter slots.
    pub max_endpoints: u32,
    /// Inline services, endpoints and routes.
    pub inline: Desired,
    /// Manifests, if any.
    pub manifests: Option<ManifestsConfig>,
}

const TOP: &[&str] = &[
    "dpdk", "ports", "gateways", "defaults", "flowTable", "admin", "capacity", "services", "routes", "manifests",
];

/// Reads and checks the file (not the manifests it points to).
pub fn load(path: &Path) -> Result<ApplianceConfig, Vec<Problem>> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![Problem { file: file.clone(), path: String::new(), message: format!("cannot read: {e}") }])?;
    let v: Value = serde_yaml::from_str(&text).map_err(|e| {
        vec![Problem { file: file.clone(), path: String::new(), message: format!("not valid YAML: {e}") }]
    })?;
    parse(&v, path)
}

/// Checks a parsed document read from `path`.
pub fn parse(v: &Value, path: &Path) -> Result<ApplianceConfig, Vec<Problem>> {
    let file = path.display().to_string();
    let root = Node::root(v, &file);
    let mut p = Problems::default();
    root.mapping(&mut p, TOP);

    let dpdk = root
        .field("dpdk", |n| dpdk(n, &mut p))
        .unwrap_or_else(dpdk_defaults);
    let mut ports = Vec::new();
    root.required(&mut p, "ports", |n, p| n.each(p, |n, p| ports.extend(port(n, p, ports.len()))));
    for (i, a) in ports.iter().enumerate() {
        if ports[..i].iter().any(|b| b.name == a.name) {
            p.add(&file, &format!("ports[{i}].name"), format!("port name {:?} is used twice", a.name));
        }
        if ports[..i].iter().any(|b| b.device_name() == a.device_name()) {
            p.add(&file, &format!("ports[{i}].device"), format!("device {:?} is used twice", a.device_name()));
        }
    }
    let mut gateways = Vec::new();
    root.field("gateways", |n| n.each(&mut p, |n, p| gateways.extend(gateway(n, p, &ports))));
    for fam in [true, false] {
        if gateways.iter().filter(|g| g.address.is_v4() == fam).count() > 1 {
            p.add(&file, "gateways", format!("more than one {} gateway", if fam { "IPv4" } else { "IPv6" }));
        }
    }
    let defaults = root.field("defaults", |n| defaults(n, &mut p)).unwrap_or_default();
    let (mut flow_entries, mut flow_idle_secs) = (65536usize, 300u32);
    root.field("flowTable", |n| {
        n.mapping(&mut p, &["entries", "idleSeconds"]);
        n.field("entries", |n| n.int(&mut p, 16, 1 << 26).map(|e| flow_entries = e as usize));
        n.field("idleSeconds", |n| n.int(&mut p, 1, 86400).map(|e| flow_idle_secs = e as u32));
    });
    let mut admin: SocketAddr = ([127, 0, 0, 1], 9091).into();
    root.field("admin", |n| {
        n.mapping(&mut p, &["listen"]);
        n.field("listen", |n| n.parse::<SocketAddr>(&mut p, "an address:port").map(|a| admin = a));
    });
    let (mut max_services, mut max_endpoints) = (4096u32, 65536u32);
    root.field("capacity", |n| {
        n.mapping(&mut p, &["services", "endpoints"]);
        n.field("services", |n| n.int(&mut p, 1, 1 << 20).map(|e| max_services = e as u32));
        n.field("endpoints", |n| n.int(&mut p, 1, 1 << 24).map(|e| max_endpoints = e as u32));
    });

    let mut inline = Desired::default();
    root.field("services", |n| n.each(&mut p, |n, p| service(n, p, &mut inline)));
    root.field("routes", |n| n.each(&mut p, |n, p| inline.routes.extend(route_inline(n, p))));
    let manifests = root.field("manifests", |n| {
        n.mapping(&mut p, &["directory", "gateway"]);
        let dir = n.required(&mut p, "directory", |n, p| n.string(p))?;
        let gateway = n.required(&mut p, "gateway", fields::name)??;
        let base = path.parent().unwrap_or(Path::new("."));
        Some(ManifestsConfig { directory: base.join(dir?), gateway })
    });

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
        flow_idle_secs,
        admin,
        max_services,
        max_endpoints,
        inline,
        manifests: manifests.flatten(),
    })
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
    }
}

fn dpdk(n: Node<'_>, p: &mut Problems) -> DpdkConfig {
    let mut d = dpdk_defaults();
    n.mapping(p, &["lcores", "memoryMB", "hugepages", "filePrefix", "mbufs", "descriptors", "extraArgs"]);
    n.field("lcores", |n| {
        if let Some(s) = n.string(p) {
            let ok = !s.is_empty() && s.split(',').all(|part| {
                let mut it = part.splitn(2, '-');
                it.all(|x| x.trim().parse::<u32>().is_ok())
            });
            if ok {
                d.lcores = s;
            } else {
                n.bad(p, format!("{s:?} is not a core list (like 0,1 or 0-3)"));
            }
        }
    });
    n.field("memoryMB", |n| n.int(p, 64, 1 << 20).map(|v| d.memory_mb = v as u32));
    n.field("hugepages", |n| n.boolean(p).map(|v| d.hugepages = v));
    n.field("filePrefix", |n| fields::name(n, p).map(|v| d.file_prefix = v));
    n.field("mbufs", |n| n.int(p, 1023, 1 << 24).map(|v| d.mbufs = v as u32));
    n.field("descriptors", |n| n.int(p, 64, 16384).map(|v| d.descriptors = v as u16));
    n.field("extraArgs", |n| n.each(p, |n, p| d.extra_args.extend(n.string(p))));
    d
}

fn if_addr(n: Node<'_>, p: &mut Problems) -> Option<IfAddr> {
    let s = n.string(p)?;
    let bad = |p: &mut Problems| {
        n.bad(p, format!("{s:?} is not an interface address (like 10.0.0.1/24 or 2001:db8::1/64)"));
        None
    };
    let Some((a, l)) = s.trim().split_once('/') else { return bad(p) };
    let (Ok(addr), Ok(prefix)) = (a.parse::<Addr>(), l.parse::<u8>()) else { return bad(p) };
    if prefix > if addr.is_v4() { 32 } else { 128 } {
        return bad(p);
    }
    Some(IfAddr { addr, prefix })
}

fn port(n: Node<'_>, p: &mut Problems, index: usize) -> Option<PortConfig> {
    n.mapping(p, &["name", "device", "addresses", "mtu", "kernelInterface"]);
    let name = n.required(p, "name", fields::name).flatten();
    let device = n.required(p, "device", |n, p| n.string(p)).flatten();
    let mut addresses = Vec::new();
    n.field("addresses", |n| n.each(p, |n, p| addresses.extend(if_addr(n, p))));
    let mtu = n.field("mtu", |n| n.int(p, 576, 9600)).flatten().unwrap_or(1500) as u16;
    let default_if = format!("sl{index}-{}", name.as_deref().unwrap_or(""));
    let kernel_interface = n.field("kernelInterface", |n| n.string(p)).flatten().unwrap_or(default_if);
    if kernel_interface.len() > 15 {
        n.bad(p, format!("kernel interface name {kernel_interface:?} is longer than 15 characters (set kernelInterface)"));
    }
    Some(PortConfig { name: name?, device: device?, addresses, mtu, kernel_interface: kernel_interface.chars().take(15).collect() })
}

fn gateway(n: Node<'_>, p: &mut Problems, ports: &[PortConfig]) -> Option<GatewayConfig> {
    n.mapping(p, &["address", "port", "mac"]);
    let address = n.required(p, "address", |n, p| n.parse::<Addr>(p, "an IP address")).flatten();
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
    n.mapping(p, &["algorithm", "endpointLimit", "flowTable", "delivery"]);
    n.field("algorithm", |n| n.parse(p, "an algorithm").map(|a| d.algorithm = a));
    n.field("endpointLimit", |n| n.int(p, 1, 65536).map(|v| d.limit = v as u32));
    n.field("flowTable", |n| n.boolean(p).map(|v| d.flow_table = v));
    n.field("delivery", |n| n.parse::<DeliveryMode>(p, "a delivery").map(|v| d.delivery = v));
    d
}

fn origin(n: &Node<'_>) -> Origin {
    Origin { file: n.file().to_owned(), path: n.path().to_owned() }
}

/// Service settings shared by the inline form and manifests' annotations
/// are parsed by their callers; this is the inline form.
fn service(n: Node<'_>, p: &mut Problems, out: &mut Desired) {
    n.mapping(p, &["name", "algorithm", "endpointLimit", "tableSize", "flowTable", "delivery", "endpoints"]);
    let Some(name) = n.required(p, "name", fields::name).flatten() else { return };
    let def = ServiceDef {
        name: name.clone(),
        algorithm: n.field("algorithm", |n| n.parse(p, "an algorithm")).flatten(),
        limit: n.field("endpointLimit", |n| n.int(p, 1, 65536)).flatten().map(|v| v as u32),
        table_size: n.field("tableSize", |n| n.int(p, 1, 1 << 22)).flatten().map(|v| v as u32),
        flow_table: n.field("flowTable", |n| n.boolean(p)).flatten(),
        delivery: n.field("delivery", |n| n.parse::<DeliveryMode>(p, "a delivery")).flatten(),
        origin: origin(&n),
    };
    out.services.push(def);
    n.field("endpoints", |n| {
        n.each(p, |n, p| {
            n.mapping(p, &["id", "address", "weight", "draining", "mac"]);
            let id = n.required(p, "id", |n, p| n.int(p, 0, 65535)).flatten();
            let address = n.required(p, "address", |n, p| n.parse::<Addr>(p, "an IP address")).flatten();
            let weight = n.field("weight", |n| n.int(p, 0, 1 << 20)).flatten().unwrap_or(1);
            let draining = n.field("draining", |n| n.boolean(p)).flatten().unwrap_or(false);
            let mac = n.field("mac", |n| fields::mac(n, p)).flatten();
            if let (Some(id), Some(address)) = (id, address) {
                out.endpoints.push(EndpointDef {
                    service: name.clone(),
                    id: id as u32,
                    address,
                    weight: weight as u32,
                    draining,
                    mac,
                    origin: origin(&n),
                });
            }
        })
    });
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
    let mut r = RouteDef {
        name,
        service,
        priority: n.field("priority", |n| n.int(p, i64::from(i32::MIN), i64::from(i32::MAX))).flatten().unwrap_or(0) as i32,
        matches: RouteMatch { vips, ..RouteMatch::default() },
        origin: origin(&n),
    };
    n.field("sourceCIDRs", |n| n.each(p, |n, p| r.matches.src_cidrs.extend(fields::cidr(n, p))));
    n.field("sourcePorts", |n| n.each(p, |n, p| r.matches.src_ports.extend(fields::port_range(n, p))));
    n.field("destinationPorts", |n| n.each(p, |n, p| r.matches.dst_ports.extend(fields::port_range(n, p))));
    n.field("protocols", |n| n.each(p, |n, p| r.matches.protocols.extend(fields::protocol(n, p))));
    n.field("byteMatches", |n| n.each(p, |n, p| r.matches.byte_matches.extend(fields::byte_match(n, p))));
    r.matches.protocols.sort_unstable();
    if r.matches.protocols.windows(2).any(|w| w[0] == w[1]) {
        n.bad(p, "a protocol is listed twice");
    }
    let has_ports = [&r.matches.src_ports, &r.matches.dst_ports].iter().any(|l| !l.is_empty() && !l.contains(&sluice_dataplane::classify::PortRange::ANY));
    if has_ports && r.matches.protocols.is_empty() {
        n.bad(p, "ports are set but protocols are not: ports mean nothing without TCP, UDP or SCTP");
    }
    for b in &r.matches.byte_matches {
        if !r.matches.protocols.is_empty() && !r.matches.protocols.contains(&b.proto) {
            n.bad(p, format!(
                "a byte match is about {} but the route does not carry it: it would never apply",
                fields::protocol_name(b.proto)
            ));
        }
    }
    Some(r)
}

fn route_inline(n: Node<'_>, p: &mut Problems) -> Option<RouteDef> {
    n.mapping(
        p,
        &[
            "name", "service", "priority", "vips", "destinationCIDRs", "sourceCIDRs", "sourcePorts", "destinationPorts",
            "protocols", "byteMatches",
        ],
    );
    let name = n.required(p, "name", fields::name).flatten();
    let service = n.required(p, "service", fields::name).flatten();
    let r = route_fields(n, p, name.clone().unwrap_or_default(), service.clone().unwrap_or_default());
    name?;
    service?;
    r
}
