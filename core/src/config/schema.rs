//! The configuration's keys, declared once: each key's path, kind (with
//! its bounds), default and meaning. The parser takes from this table the
//! keys a mapping may hold ([`super::node::Node::section`]) and the bounds
//! of every number ([`super::node::Node::bounded`],
//! [`super::node::Node::duration`]); `docs/configuration.md` is generated
//! from it ([`reference`]), and the tests below check that the two agree:
//! every documented default is the one applied, every documented key is
//! read, every bound is enforced where it is written, and the committed
//! reference is the generated one.

// The table's bounds are written as i64 from the narrower constants.
#![allow(clippy::cast_possible_wrap, clippy::cast_lossless)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::OnceLock;

use super::bounds as b;
use super::router::bounds as rb;
use super::siblings::{RECORDS_PER_SECOND, STARTUP_WAIT_MS};
use crate::model::limits as l;

/// What a key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A mapping of the keys below it.
    Section,
    /// A list of mappings of the keys below it (one mapping counts as a
    /// list of one).
    Sections,
    /// `true` or `false`.
    Bool,
    /// A whole number within `lo..=hi`.
    Int(i64, i64),
    /// A duration with its unit (`300ms`, `90s`, `2m`), within `lo..=hi`
    /// milliseconds.
    Duration(u64, u64),
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Text of the form described.
    Text(&'static str),
    /// A list of values of the form described (one value counts as a list
    /// of one).
    List(&'static str),
    /// No longer read: what replaced it (refused where written).
    Removed(&'static str),
}

/// A key's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Default {
    /// None: the key is required, or its absence means what its meaning
    /// says.
    None,
    /// This value, written as in the file (checked by the tests: writing
    /// it changes nothing).
    Value(&'static str),
    /// Computed as described.
    Said(&'static str),
}

/// One key of the configuration.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// Its path from the file's top: `dpdk.memoryMB`, `services[].name`
    /// (`[]`: each element of a list).
    pub path: &'static str,
    /// What it holds.
    pub kind: Kind,
    /// Whether its mapping must have it.
    pub required: bool,
    /// Its default.
    pub default: Default,
    /// What it means.
    pub doc: &'static str,
    /// A value it may take (YAML), other than its default; for a section,
    /// a whole one (flow style) that parses on its own.
    pub example: &'static str,
    /// For a key that applies only beside certain others: its mapping
    /// with those (flow style), where the tests put it. For a mapping
    /// whose least form is more than its required keys: that form.
    pub within: &'static str,
}

const fn key(path: &'static str, kind: Kind, doc: &'static str) -> Key {
    Key { path, kind, required: false, default: Default::None, doc, example: "", within: "" }
}

impl Key {
    const fn required(mut self) -> Key {
        self.required = true;
        self
    }
    const fn default(mut self, v: &'static str) -> Key {
        self.default = Default::Value(v);
        self
    }
    const fn said(mut self, v: &'static str) -> Key {
        self.default = Default::Said(v);
        self
    }
    const fn example(mut self, v: &'static str) -> Key {
        self.example = v;
        self
    }
    const fn within(mut self, v: &'static str) -> Key {
        self.within = v;
        self
    }

    /// Its last name (`memoryMB` of `dpdk.memoryMB`).
    /// An annotation's name is its whole path.
    pub fn name(&self) -> &'static str {
        if self.path.contains('/') {
            return self.path;
        }
        self.path.rsplit('.').next().unwrap_or(self.path).trim_end_matches("[]")
    }
}

/// A table of keys, with its lookups.
pub struct Table {
    /// The keys, in the reference's order.
    pub keys: &'static [Key],
    index: OnceLock<Index>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Table({} keys)", self.keys.len())
    }
}

struct Index {
    by_path: HashMap<String, usize>,
    children: HashMap<String, Vec<&'static str>>,
}

/// `services[0].endpoints[1].weight` and `services[].endpoints[].weight`
/// alike become `services.endpoints.weight`.
pub(crate) fn normalize(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut in_index = false;
    for c in path.chars() {
        match c {
            '[' => in_index = true,
            ']' => in_index = false,
            c if !in_index => out.push(c),
            _ => {}
        }
    }
    out
}

impl Table {
    const fn new(keys: &'static [Key]) -> Table {
        Table { keys, index: OnceLock::new() }
    }

    fn index(&self) -> &Index {
        self.index.get_or_init(|| {
            let mut by_path = HashMap::new();
            let mut children: HashMap<String, Vec<&'static str>> = HashMap::new();
            for (i, k) in self.keys.iter().enumerate() {
                let p = normalize(k.path);
                let parent = if k.path.contains('/') {
                    String::new()
                } else {
                    p.rsplit_once('.').map_or(String::new(), |(a, _)| a.to_owned())
                };
                children.entry(parent).or_default().push(k.name());
                by_path.insert(p, i);
            }
            Index { by_path, children }
        })
    }

    /// The key at `path` (indices or `[]` in it are ignored).
    pub fn get(&self, path: &str) -> Option<&'static Key> {
        let i = *self.index().by_path.get(&normalize(path))?;
        Some(&self.keys[i])
    }

    /// The names a mapping at `path` may hold.
    pub fn children(&self, path: &str) -> &[&'static str] {
        self.index().children.get(&normalize(path)).map_or(&[], Vec::as_slice)
    }
}

const ALGORITHMS: &[&str] = &["maglev", "random"];
const DELIVERIES: &[&str] = &["l2", "ipip"];

/// The appliance's configuration file.
pub static FILE: Table = Table::new(&[
    // dpdk
    key("dpdk", Kind::Section, "The DPDK environment (EAL) of the appliance's process. Takes effect at restart."),
    key("dpdk.lcores", Kind::Text("a core list: 0,1 or 0-3 or 0,2-5, or lcores placed on CPUs: 0@0,1@0,2@1"), "Cores (EAL `-l`): the first runs the control thread, the others a poll-mode worker each; one core (`0`) runs one worker with the control thread beside it. Written `lcore@cpu` (EAL `--lcores`), lcores share CPUs: `0@0,1@0,2@1` runs two workers on a two-CPU machine, the first sharing its CPU with the control thread.").default("\"0,1\"").example("\"0\""),
    key("dpdk.memoryMB", Kind::Int(b::MEMORY_MB.0, b::MEMORY_MB.1), "DPDK memory in MB (EAL `-m`); the packet buffers must fit (about 2.3 KB each).").default("512").example("1024"),
    key("dpdk.hugepages", Kind::Bool, "Use hugepages (reserve them first: the package's sysctl.d drop-in does); false runs with `--no-huge` (laptops, CI).").default("false").example("true"),
    key("dpdk.filePrefix", Kind::Text("a name"), "EAL `--file-prefix`: one per DPDK process on the machine; also names BIRD's run directory.").default("sluice").example("edge-a"),
    key("dpdk.mbufs", Kind::Int(b::MBUFS.0, b::MBUFS.1), "Packet buffers; enough to fill every receive ring (ports x workers x descriptors) and within `memoryMB`.").default("8191").example("4095"),
    key("dpdk.descriptors", Kind::Int(b::DESCRIPTORS.0, b::DESCRIPTORS.1), "Receive and transmit descriptors per queue.").default("1024").example("512"),
    key("dpdk.extraArgs", Kind::List("EAL arguments"), "More EAL arguments, passed as they are.").default("[]").example("[\"--log-level=7\"]"),
    key("dpdk.busyPoll", Kind::Bool, "Workers poll without pause (dedicated cores). Otherwise a worker that finds nothing for 256 rounds pauses 1, 2, 4 ... microseconds.").default("false").example("true"),
    key("dpdk.idlePauseMaxMicros", Kind::Int(b::IDLE_PAUSE_MAX_MICROS.0, b::IDLE_PAUSE_MAX_MICROS.1), "The longest such pause, in microseconds; the receive rings must hold what arrives meanwhile.").default("2000").example("500"),
    key("dpdk.rxInterrupts", Kind::Bool, "Pauses of 1 ms and more wait on the ports' receive interrupts (so the first packet ends them) where every port of the worker has them (net_tap, vfio-bound NICs).").default("true").example("false"),
    key("dpdk.latencyHistogram", Kind::Bool, "Workers time each packet through them (admin `/latency`, metric `sluice_latency_seconds`).").default("false").example("true"),
    key("dpdk.stallExitSeconds", Kind::Int(b::STALL_EXIT_SECONDS.0, b::STALL_EXIT_SECONDS.1), "A worker that has not polled for 1 s is reported (`sluice_worker_stalled`, `/healthz` 503); after this many seconds the process exits with status 3 for its supervisor to restart it.").default("10").example("30"),
    // ports
    key("ports", Kind::Sections, "The network ports, each a PCI device bound to vfio-pci or a DPDK virtual device. Takes effect at restart.").required().example("[{name: front, device: net_null0, addresses: [10.0.0.1/24]}]").within("{name: front, device: net_null0, addresses: [10.0.0.1/24]}"),
    key("ports[].name", Kind::Text("a name"), "The port's name, used by `gateways` and in metrics.").required().example("front"),
    key("ports[].device", Kind::Text("a PCI address (0000:3b:00.0) or a DPDK virtual device with its arguments (net_af_packet0,iface=eth1)"), "The device.").required().example("net_null0"),
    key("ports[].addresses", Kind::List("interface addresses: 10.0.0.1/24, 2001:db8::1/64"), "The appliance's own addresses on this network (answered by the kernel through the exception path).").default("[]").example("[10.0.0.1/24, 10.9.0.1/24]"),
    key("ports[].mtu", Kind::Int(l::MTU_MIN as i64, l::MTU_MAX as i64), "The port's MTU; at least 1280 with an IPv6 address.").default("1500").example("9000"),
    key("ports[].vlan", Kind::Int(1, 4094), "Serve this 802.1Q VLAN: only frames tagged with it are taken and every frame sent is tagged. Unset: tagged frames are dropped (`vlan_not_served`).").example("100"),
    key("ports[].kernelInterface", Kind::Text("an interface name, at most 15 characters"), "The kernel interface of the exception path (ARP/ND, BGP, ICMP to the appliance).").said("sl<index>-<name>").example("sl-front"),
    // gateways
    key("gateways", Kind::Sections, "Where return traffic (from the endpoints, source a VIP) goes: one gateway per address family."),
    key("gateways[].address", Kind::Text("an IP address"), "The gateway's address.").required().example("10.0.0.254"),
    key("gateways[].port", Kind::Text("a port's name"), "The port it is reached on.").required().example("front"),
    key("gateways[].mac", Kind::Text("a unicast MAC: aa:bb:cc:dd:ee:ff"), "Its MAC; resolved by the kernel when unset.").example("02:00:00:00:00:fe"),
    // defaults
    key("defaults", Kind::Section, "Settings of every service that does not set its own."),
    key("defaults.algorithm", Kind::OneOf(ALGORITHMS), "maglev: consistent hashing; random: a random endpoint, remembered per flow.").default("maglev").example("random"),
    key("defaults.endpointLimit", Kind::Int(l::ENDPOINT_LIMIT_MIN as i64, l::ENDPOINT_LIMIT_MAX as i64), "Endpoint identifiers are 0..limit-1.").default("32").example("64"),
    key("defaults.flowTable", Kind::Bool, "Pin each flow to its endpoint, so that established flows survive endpoint and weight changes; false is stateless (a change of a Maglev table moves about 1/N of the flows).").default("true").example("false"),
    key("defaults.delivery", Kind::OneOf(DELIVERIES), "l2: NAT-less, the endpoint on a port's subnet; ipip: IP-in-IP to the endpoint.").default("l2").example("ipip"),
    // flowTable
    key("flowTable", Kind::Section, "The flow table of each worker. Takes effect at restart."),
    key("flowTable.entries", Kind::Int(b::FLOW_ENTRIES.0, b::FLOW_ENTRIES.1), "Entries per worker (72 bytes each).").default("65536").example("1024"),
    key("flowTable.tcpEstablishedSeconds", Kind::Int(b::FLOW_TIMEOUT_SECONDS.0, b::FLOW_TIMEOUT_SECONDS.1), "Seconds a TCP flow is remembered without traffic.").default("3600").example("7200"),
    key("flowTable.tcpClosingSeconds", Kind::Int(b::FLOW_TIMEOUT_SECONDS.0, b::FLOW_TIMEOUT_SECONDS.1), "The same after a FIN or an RST.").default("60").example("30"),
    key("flowTable.udpSeconds", Kind::Int(b::FLOW_TIMEOUT_SECONDS.0, b::FLOW_TIMEOUT_SECONDS.1), "The same for UDP.").default("300").example("120"),
    key("flowTable.otherSeconds", Kind::Int(b::FLOW_TIMEOUT_SECONDS.0, b::FLOW_TIMEOUT_SECONDS.1), "The same for any other protocol.").default("60").example("30"),
    key("flowTable.idleSeconds", Kind::Removed("one timeout per protocol state: tcpEstablishedSeconds (default 3600), tcpClosingSeconds (60), udpSeconds (300), otherSeconds (60)"), "Replaced."),
    // capacity
    key("capacity", Kind::Section, "Room for services, endpoints and their lookup tables."),
    key("capacity.services", Kind::Int(b::SERVICES.0, b::SERVICES.1), "Service counter slots (16 bytes each per worker). Takes effect at restart.").default("4096").example("1024"),
    key("capacity.endpoints", Kind::Int(b::ENDPOINTS.0, b::ENDPOINTS.1), "Endpoint counter slots (16 bytes each per worker). Takes effect at restart.").default("65536").example("4096"),
    key("capacity.tableMemoryMB", Kind::Int(l::TABLE_MEMORY_MB_MIN as i64, l::TABLE_MEMORY_MB_MAX as i64), "All services' lookup tables together (a table takes tableSize bytes, twice that above 256 endpoints).").default("512").example("64"),
    // admin
    key("admin", Kind::Section, "The admin HTTP endpoint: /metrics, /status, /healthz, /readyz. Takes effect at restart."),
    key("admin.listen", Kind::Text("address:port: 127.0.0.1:9091, [::1]:9091"), "Where it listens; any address but loopback exposes it to the network (a warning at start).").default("\"127.0.0.1:9091\"").example("\"[::1]:9191\""),
    key("admin.maxConnections", Kind::Int(b::ADMIN_CONNECTIONS.0, b::ADMIN_CONNECTIONS.1), "Connections served at once.").default("16").example("64"),
    key("admin.requestTimeoutSeconds", Kind::Int(b::ADMIN_TIMEOUT_SECONDS.0, b::ADMIN_TIMEOUT_SECONDS.1), "Seconds to read a request and answer it.").default("10").example("30"),
    // services
    key("services", Kind::Sections, "Inline services: each a set of endpoints that routes send traffic to."),
    key("services[].name", Kind::Text("a name: letters, digits, '-', '_', '.'"), "The service's name, used by routes and in metrics.").required().example("web"),
    key("services[].algorithm", Kind::OneOf(ALGORITHMS), "As `defaults.algorithm`, for this service.").said("defaults.algorithm").example("random"),
    key("services[].endpointLimit", Kind::Int(l::ENDPOINT_LIMIT_MIN as i64, l::ENDPOINT_LIMIT_MAX as i64), "As `defaults.endpointLimit`, for this service.").said("defaults.endpointLimit").example("16"),
    key("services[].tableSize", Kind::Int(1, l::TABLE_SIZE_MAX as i64), "The Maglev table's size: a prime, at least the endpoint limit.").said("the prime above 200 x endpointLimit, at most 65537").example("251"),
    key("services[].flowTable", Kind::Bool, "As `defaults.flowTable`, for this service.").said("defaults.flowTable").example("false"),
    key("services[].delivery", Kind::OneOf(DELIVERIES), "As `defaults.delivery`, for this service.").said("defaults.delivery").example("ipip"),
    key("services[].healthCheck", Kind::Section, "An active check of each endpoint: an endpoint that fails it takes no new flows (its established ones stay). See docs/health.md.").example("{protocol: tcp, port: 80}"),
    key("services[].healthCheck.protocol", Kind::OneOf(&["tcp", "http", "https", "udp", "dns"]), "What the check speaks.").required().example("tcp"),
    key("services[].healthCheck.port", Kind::Int(1, 65535), "The port it checks.").required().example("8080"),
    key("services[].healthCheck.target", Kind::OneOf(&["endpoint", "vip"]), "endpoint: the endpoint's own address; vip: the service's VIP, through the endpoint (not http and https).").default("endpoint").example("vip"),
    key("services[].healthCheck.intervalMs", Kind::Int(l::CHECK_INTERVAL_MS_MIN as i64, l::CHECK_INTERVAL_MS_MAX as i64), "Milliseconds between checks.").default("2000").example("1000"),
    key("services[].healthCheck.timeoutMs", Kind::Int(l::CHECK_TIMEOUT_MS_MIN as i64, l::CHECK_INTERVAL_MS_MAX as i64), "Milliseconds a check may take, at most intervalMs.").default("1000").example("500"),
    key("services[].healthCheck.rise", Kind::Int(1, l::CHECK_COUNT_MAX as i64), "Passes in a row that bring an endpoint in.").default("2").example("3"),
    key("services[].healthCheck.fall", Kind::Int(1, l::CHECK_COUNT_MAX as i64), "Failures in a row that take it out.").default("3").example("5"),
    key("services[].healthCheck.path", Kind::Text("an HTTP path"), "The path requested (http and https checks).").default("/").example("/healthz").within("{protocol: http, port: 80}"),
    key("services[].healthCheck.host", Kind::Text("a host name"), "The Host header (http and https checks); the endpoint's address when unset.").example("app.example.com").within("{protocol: http, port: 80}"),
    key("services[].healthCheck.expectStatus", Kind::List("statuses or ranges: 200, 200-299"), "The statuses that pass (http and https checks).").said("200-399").example("[200, 204]").within("{protocol: http, port: 80}"),
    key("services[].healthCheck.send", Kind::Text("text"), "The datagram a udp check sends (or sendHex).").example("ping").within("{protocol: udp, port: 53}"),
    key("services[].healthCheck.expect", Kind::Text("text"), "The reply's expected start (udp checks; or expectHex); any reply when unset.").example("pong").within("{protocol: udp, port: 53, send: ping}"),
    key("services[].healthCheck.sendHex", Kind::Text("hex, two digits a byte"), "send, in hex.").example("\"0a 0b\"").within("{protocol: udp, port: 53}"),
    key("services[].healthCheck.expectHex", Kind::Text("hex, two digits a byte"), "expect, in hex.").example("\"0c\"").within("{protocol: udp, port: 53, send: ping}"),
    key("services[].healthCheck.query", Kind::Text("a DNS name"), "The name a dns check asks for.").default(".").example("example.com").within("{protocol: dns, port: 53}"),
    key("services[].endpoints", Kind::Sections, "The service's endpoints."),
    key("services[].endpoints[].id", Kind::Int(0, l::ENDPOINT_LIMIT_MAX as i64 - 1), "Its identifier, below the service's endpoint limit: Maglev places an endpoint by it, so it is what keeps flows in place across changes.").required().example("0"),
    key("services[].endpoints[].address", Kind::Text("an IP address"), "Its address.").required().example("10.0.0.5"),
    key("services[].endpoints[].weight", Kind::Int(0, l::WEIGHT_MAX as i64), "Its share of new flows relative to the others; 0 takes none.").default("1").example("3"),
    key("services[].endpoints[].draining", Kind::Bool, "Takes no new flows; established ones stay.").default("false").example("true"),
    key("services[].endpoints[].mac", Kind::Text("a unicast MAC"), "Its MAC (l2 delivery); resolved by the kernel when unset.").example("02:00:00:00:00:05"),
    // routes
    key("routes", Kind::Sections, "Inline routes: which packets go to which service (the highest priority that matches wins).").example("[{name: web, service: web, vips: [10.1.0.1]}]").within("{name: web, service: web, vips: [10.1.0.1]}"),
    key("routes[].name", Kind::Text("a name"), "The route's name.").required().example("web"),
    key("routes[].service", Kind::Text("a service's name"), "The service it sends to.").required().example("web"),
    key("routes[].priority", Kind::Int(i32::MIN as i64, i32::MAX as i64), "Among routes that match a packet, the highest wins.").default("0").example("10"),
    key("routes[].vips", Kind::List("addresses: 10.1.0.1, 10.1.0.1/32, 2001:db8::1/128"), "The VIPs (destination addresses) it matches; it or destinationCIDRs is required.").example("[10.1.0.9]"),
    key("routes[].destinationCIDRs", Kind::List("addresses, as vips"), "Another name for vips (the Meridio flow's).").example("[10.1.0.1/32]"),
    key("routes[].sourceCIDRs", Kind::List("prefixes: 192.0.2.0/24"), "Sources it matches; any when unset.").example("[192.0.2.0/24]"),
    key("routes[].sourcePorts", Kind::List("ports or ranges: 80, 8000-8080, any"), "Source ports it matches (with protocols); any when unset.").example("[\"1024-65535\"]").within("{name: web, service: web, vips: [10.1.0.1], protocols: [tcp]}"),
    key("routes[].destinationPorts", Kind::List("ports or ranges: 80, 8000-8080, any"), "Destination ports it matches (with protocols); any when unset.").example("[80, 443]").within("{name: web, service: web, vips: [10.1.0.1], protocols: [tcp]}"),
    key("routes[].protocols", Kind::List("tcp, udp, sctp"), "Protocols it matches; any when unset.").example("[tcp]"),
    key("routes[].byteMatches", Kind::List("proto[offset:len] & mask = value: tcp[13:1] & 0x02 = 0x02"), "Bytes of the transport header it matches, as in Meridio and nfqlb.").example("[\"tcp[13:1] & 0x02 = 0x02\"]"),
    // manifests
    key("manifests", Kind::Section, "Another source: a directory of Kubernetes-style manifests (Gateway, L34Route, Service, EndpointSlice, GatewayRouter), read at start and at each reload. See configs/manifests.yaml.").example("{directory: manifests, gateway: sllb-a}"),
    key("manifests.directory", Kind::Text("a path (relative: from this file)"), "The directory.").required().example("manifests"),
    key("manifests.gateway", Kind::Text("a name"), "The Gateway served: only its routes are taken.").required().example("sllb-a"),
    // xDS
    key("xds-control-plane", Kind::Section, "Another source: an xDS control plane (Envoy's ADS: clusters and load assignments, listeners). See docs/xds.md.").example("{enabled: true, server-address: \"127.0.0.1:18000\"}").within("{enabled: true, server-address: \"127.0.0.1:18000\"}"),
    key("xds-control-plane.enabled", Kind::Bool, "Whether the source is used (false: the section is only checked).").required().example("true"),
    key("xds-control-plane.server-address", Kind::Text("host:port: xds.example.com:18000, [::1]:18000"), "The control plane; required when enabled.").example("\"127.0.0.1:18001\""),
    key("xds-control-plane.ca-cert-path", Kind::Text("a path"), "TLS: the CA the server's certificate is verified with; plain text when unset."),
    key("xds-control-plane.client-cert-path", Kind::Text("a path"), "Mutual TLS: the client certificate (with client-key-path and ca-cert-path)."),
    key("xds-control-plane.client-key-path", Kind::Text("a path"), "Mutual TLS: its key."),
    key("xds-control-plane.node-id", Kind::Text("printable ASCII without spaces"), "The node id sent to the control plane.").said("this machine's host name").example("lb-7"),
    key("xds-control-plane.node-cluster", Kind::Text("printable ASCII without spaces"), "The node cluster sent to the control plane.").default("sluice").example("edge"),
    key("xds-control-plane.mode", Kind::OneOf(&["sotw", "delta"]), "State of the world, or incremental (delta) xDS.").default("sotw").example("delta"),
    // kubernetes
    key("kubernetes", Kind::Section, "Another source: one Gateway of one namespace, watched from the Kubernetes API. See docs/kubernetes.md.").example("{gateway: sllb-a, namespace: default}"),
    key("kubernetes.gateway", Kind::Text("a name"), "The Gateway served.").required().example("sllb-a"),
    key("kubernetes.namespace", Kind::Text("a namespace name"), "The only namespace watched.").required().example("default"),
    key("kubernetes.kubeconfig", Kind::Text("a path"), "A kubeconfig file; the in-cluster service account when unset.").example("kubeconfig"),
    key("kubernetes.gatewayClass", Kind::Text("a GatewayClass name"), "The class the Gateway must have.").default("meridio-experiment/stateless-load-balancer").example("sluice"),
    key("kubernetes.algorithmConfiguration", Kind::OneOf(&["annotation", "global"]), "annotation: a Service's lb-algorithm annotation chooses; global: every Service takes defaults.algorithm.").default("annotation").example("global"),
    key("kubernetes.allowAlgorithmChange", Kind::Bool, "Whether a live Service may change its algorithm (the design refuses it).").default("false").example("true"),
    // bird
    key("bird", Kind::Section, "The BGP/BFD speaker (BIRD 2) that announces the VIPs to the gatewayRouters. See docs/bgp.md."),
    key("bird.mode", Kind::OneOf(&["supervised", "external"]), "supervised: the appliance runs BIRD; external: it drives a BIRD already running on `socket`.").default("supervised").example("external"),
    key("bird.binary", Kind::Text("a path"), "BIRD's binary.").default("/usr/sbin/bird").example("/usr/local/sbin/bird"),
    key("bird.socket", Kind::Text("a path, at most 107 bytes"), "BIRD's control socket.").said("/run/sluice-<filePrefix>/bird.ctl").example("/run/bird/bird.ctl"),
    key("bird.configFile", Kind::Text("a path"), "Where the appliance writes BIRD's configuration.").said("/run/sluice-<filePrefix>/bird.conf").example("/etc/bird/bird.conf"),
    key("bird.routerId", Kind::Text("a non-zero IPv4 address"), "BGP router ID.").said("the first IPv4 address of the ports").example("192.0.2.1"),
    key("bird.withdrawWaitMs", Kind::Int(rb::WITHDRAW_WAIT_MS.0, rb::WITHDRAW_WAIT_MS.1), "At a stop, milliseconds between withdrawing the VIPs and closing the ports, for the routers to move traffic away.").default("2000").example("500"),
    // gatewayRouters
    key("gatewayRouters", Kind::Sections, "The datacenter routers the VIPs are announced to, over BGP with BFD.").example("[{name: tor, address: 10.0.0.254, interface: sl0-front, bgp: {localASN: 65001, remoteASN: 65000}}]"),
    key("gatewayRouters[].name", Kind::Text("a name"), "The router's name.").required().example("tor"),
    key("gatewayRouters[].address", Kind::Text("an IP address on a port's network"), "Its address.").required().example("10.0.0.254"),
    key("gatewayRouters[].interface", Kind::Text("a port's kernelInterface"), "The interface it is reached on.").required().example("sl0-front"),
    key("gatewayRouters[].bgp", Kind::Section, "The BGP session.").required().example("{localASN: 65001, remoteASN: 65000}"),
    key("gatewayRouters[].bgp.localASN", Kind::Int(rb::ASN.0, rb::ASN.1), "The appliance's AS number.").required().example("65001"),
    key("gatewayRouters[].bgp.remoteASN", Kind::Int(rb::ASN.0, rb::ASN.1), "The router's AS number.").required().example("65000"),
    key("gatewayRouters[].bgp.holdTime", Kind::Duration(rb::HOLD_MS.0, rb::HOLD_MS.1), "BGP hold time, whole seconds.").default("90s").example("30s"),
    key("gatewayRouters[].bgp.localPort", Kind::Int(rb::PORT.0, rb::PORT.1), "The appliance's BGP port.").default("179").example("10179"),
    key("gatewayRouters[].bgp.remotePort", Kind::Int(rb::PORT.0, rb::PORT.1), "The router's BGP port.").default("179").example("10179"),
    key("gatewayRouters[].bgp.bfd", Kind::Section, "BFD on the session."),
    key("gatewayRouters[].bgp.bfd.switch", Kind::Bool, "Whether BFD runs.").default("true").example("false"),
    key("gatewayRouters[].bgp.bfd.minTx", Kind::Duration(rb::BFD_INTERVAL_MS.0, rb::BFD_INTERVAL_MS.1), "Least interval between BFD packets sent.").default("300ms").example("100ms"),
    key("gatewayRouters[].bgp.bfd.minRx", Kind::Duration(rb::BFD_INTERVAL_MS.0, rb::BFD_INTERVAL_MS.1), "Least interval between BFD packets received.").default("300ms").example("100ms"),
    key("gatewayRouters[].bgp.bfd.multiplier", Kind::Int(rb::MULTIPLIER.0, rb::MULTIPLIER.1), "Packets missed before the session is down.").default("3").example("5"),
    // siblings
    key("siblings", Kind::Section, "Other appliances behind the same routers (ECMP): they share flow pins, so a flow keeps its endpoint when the routers move it to another appliance. See docs/flows.md. Takes effect at restart.").example("{listen: \"10.0.0.1:7946\", peers: [\"10.0.0.2:7946\"], keyFile: sibling.key}").within("{listen: \"10.0.0.1:7946\", peers: [\"10.0.0.2:7946\"], keyFile: sibling.key}"),
    key("siblings.listen", Kind::Text("address:port"), "Where this appliance listens for its siblings.").required().example("\"10.0.0.1:7946\""),
    key("siblings.peers", Kind::List("address:port"), "The siblings (at most 64); required unless kubernetesPods.").example("[\"10.0.0.3:7946\"]"),
    key("siblings.kubernetesPods", Kind::Bool, "Follow the pods of the Kubernetes Gateway's Deployment as siblings (needs the kubernetes section).").default("false"),
    key("siblings.keyFile", Kind::Text("a path: a file of 32 to 4096 bytes"), "The key the siblings share (authenticates and encrypts their records).").required().example("sibling.key"),
    key("siblings.startupWaitMs", Kind::Int(STARTUP_WAIT_MS.0, STARTUP_WAIT_MS.1), "At start, milliseconds to wait for the siblings' pins before serving.").default("5000").example("1000"),
    key("siblings.maxRecordsPerSecond", Kind::Int(RECORDS_PER_SECOND.0, RECORDS_PER_SECOND.1), "Pins sent per second at most.").default("200000").example("1000"),
    key("siblings.gate", Kind::Bool, "Withdraw the VIPs while this appliance's tables disagree with its siblings'.").default("false").example("true"),
    // health
    key("health", Kind::Section, "Passive health: what the endpoints' TCP handshakes decide. See docs/health.md. Takes effect at restart."),
    key("health.passive", Kind::Bool, "An endpoint whose handshakes fail takes no new flows for a while.").default("true").example("false"),
    key("health.fall", Kind::Int(b::HEALTH_FALL.0, b::HEALTH_FALL.1), "Failed handshakes in a row that take an endpoint out.").default("5").example("10"),
    key("health.ejectionSeconds", Kind::Int(b::HEALTH_EJECTION_SECONDS.0, b::HEALTH_EJECTION_SECONDS.1), "Seconds it is out the first time; twice as long each time again, up to ten times this or 300 s.").default("30").example("60"),
]);

/// The annotations of a Service (manifests and Kubernetes sources).
pub static ANNOTATIONS: Table = Table::new(&[
    key("sluice.io/lb-algorithm", Kind::OneOf(ALGORITHMS), "The service's algorithm (with `algorithmConfiguration: annotation`).").said("defaults.algorithm").example("random"),
    key("service.cilium.io/lb-algorithm", Kind::OneOf(ALGORITHMS), "Cilium's name for the same; wins over sluice.io/lb-algorithm.").said("defaults.algorithm").example("random"),
    key("sluice.io/endpoint-limit", Kind::Int(l::ENDPOINT_LIMIT_MIN as i64, l::ENDPOINT_LIMIT_MAX as i64), "As a service's endpointLimit.").said("defaults.endpointLimit").example("\"64\""),
    key("sluice.io/table-size", Kind::Int(1, l::TABLE_SIZE_MAX as i64), "As a service's tableSize (a prime).").said("the prime above 200 x endpointLimit, at most 65537").example("\"251\""),
    key("sluice.io/flow-table", Kind::Bool, "As a service's flowTable.").said("defaults.flowTable").example("\"false\""),
    key("sluice.io/delivery", Kind::OneOf(DELIVERIES), "As a service's delivery.").said("defaults.delivery").example("ipip"),
    key("sluice.io/health-check", Kind::Text("a YAML or JSON mapping of services[].healthCheck's keys"), "As a service's healthCheck.").example("'{protocol: http, port: 8080, path: /healthz}'"),
    key("sluice.io/endpoint-ids", Kind::Text("a JSON mapping of each address to its identifier"), "On an EndpointSlice, not a Service: each endpoint's identifier (as services[].endpoints[].id); required for every endpoint of the slice.").required().example("'{\"10.0.0.5\": 0, \"10.0.0.6\": 1}'"),
]);

/// A complete configuration of the reference, with what it shows.
#[derive(Debug)]
pub struct Example {
    /// What it shows.
    pub title: &'static str,
    /// The file.
    pub text: &'static str,
}

/// The reference's examples; the tests parse each (in a directory holding
/// `sibling.key` and an empty `manifests/`).
pub const EXAMPLES: &[Example] = &[
    Example {
        title: "One VIP, two backends",
        text: "\
dpdk: {lcores: \"0,1\", filePrefix: sluice}          # the first core runs the control side, the others workers
ports:
  - {name: front, device: \"net_af_packet0,iface=eth1\", addresses: [10.100.0.1/24], kernelInterface: sl-front}
  - {name: back, device: \"net_af_packet1,iface=eth2\", addresses: [10.200.0.1/24], kernelInterface: sl-back}
gateways:
  - {address: 10.100.0.2, port: front}             # return traffic and the default next hop
services:
  - name: web
    endpoints: [{id: 0, address: 10.200.0.11}, {id: 1, address: 10.200.0.12}]
routes:
  - {name: web, service: web, vips: [20.0.0.1], protocols: [TCP], destinationPorts: [\"80\"]}
",
    },
    Example {
        title: "Health checks, weights and draining",
        text: "\
ports: [{name: front, device: net_null0, addresses: [10.0.0.1/24]}]
gateways: [{address: 10.0.0.254, port: front}]
services:
  - name: api
    healthCheck: {protocol: http, port: 8080, path: /healthz, intervalMs: 1000, timeoutMs: 500}
    endpoints:
      - {id: 0, address: 10.0.0.11, weight: 2}
      - {id: 1, address: 10.0.0.12}
      - {id: 2, address: 10.0.0.13, draining: true}
routes:
  - {name: api, service: api, vips: [20.0.0.2], protocols: [tcp], destinationPorts: [443]}
",
    },
    Example {
        title: "Announced over BGP with BFD, shared with a sibling",
        text: "\
ports: [{name: front, device: \"0000:3b:00.0\", addresses: [10.0.0.1/24]}]
gateways: [{address: 10.0.0.254, port: front}]
bird: {withdrawWaitMs: 2000}
gatewayRouters:
  - name: tor
    address: 10.0.0.254
    interface: sl0-front
    bgp: {localASN: 65001, remoteASN: 65000, holdTime: 30s, bfd: {minTx: 100ms, minRx: 100ms}}
siblings: {listen: \"10.0.0.1:7946\", peers: [\"10.0.0.2:7946\"], keyFile: sibling.key}
services:
  - {name: dns, endpoints: [{id: 0, address: 10.0.0.21}, {id: 1, address: 10.0.0.22}]}
routes:
  - {name: dns, service: dns, vips: [20.0.0.53], protocols: [udp], destinationPorts: [53]}
",
    },
    Example {
        title: "Services from an xDS control plane and from manifests",
        text: "\
ports: [{name: front, device: net_null0, addresses: [10.0.0.1/24]}]
xds-control-plane: {enabled: true, server-address: \"xds.example.com:18000\", node-id: lb-1, mode: delta}
manifests: {directory: manifests, gateway: sllb-a}
",
    },
    Example {
        title: "Services from a Kubernetes Gateway",
        text: "\
ports: [{name: front, device: net_null0, addresses: [10.0.0.1/24]}]
kubernetes: {gateway: sllb-a, namespace: default}
",
    },
];

fn kind_text(k: &Kind) -> String {
    match k {
        Kind::Section => "mapping".into(),
        Kind::Sections => "list of mappings".into(),
        Kind::Bool => "true or false".into(),
        Kind::Int(lo, hi) => format!("whole number, {lo}..={hi}"),
        Kind::Duration(lo, hi) => format!("duration (ms, s, m), {lo}ms..={hi}ms"),
        Kind::OneOf(words) => words.join(" or "),
        Kind::Text(form) => form.to_string(),
        Kind::List(form) => format!("list of {form}"),
        Kind::Removed(_) => "removed".into(),
    }
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|")
}

fn table_md(out: &mut String, keys: &[Key]) {
    out.push_str("| Key | Type | Default | Meaning |\n|---|---|---|---|\n");
    for k in keys {
        let default = match (k.required, k.default) {
            (true, _) => "required".to_owned(),
            (false, Default::Value(v)) => format!("`{v}`"),
            (false, Default::Said(s)) => cell(s),
            (false, Default::None) => "unset".to_owned(),
        };
        let mut meaning = cell(k.doc);
        if let Kind::Removed(by) = k.kind {
            let _ = write!(meaning, " Refused: replaced by {}.", cell(by));
        }
        if !k.example.is_empty() && !matches!(k.kind, Kind::Section | Kind::Sections) {
            let _ = write!(meaning, " Example: `{}`.", cell(k.example));
        }
        let _ = writeln!(out, "| `{}` | {} | {} | {} |", k.path, cell(&kind_text(&k.kind)), default, meaning);
    }
}

/// `docs/configuration.md`.
pub fn reference() -> String {
    let mut out = String::from(
        "<!-- Generated from core/src/config/schema.rs: edit the table there, then run\n     \
         SLUICE_WRITE_REFERENCE=1 cargo test -p sluice-core --lib config::schema. -->\n\
         # Configuration reference\n\n\
         The appliance reads one YAML file (`sluice run --config FILE`; check it with `sluice check --config FILE`).\n\
         Every key is below, with its type, bounds, default and meaning. A key not listed is refused\n\
         (with the closest known name), and every problem is reported at once as `file:line:column: path: reason`.\n\
         `SIGHUP` (or `systemctl reload sluice`) reloads the file: the sections marked *takes effect at restart*\n\
         keep their running values until then (the reload says so), the others change in place.\n\n\
         A list of one element may be written as that element. Numbers may be quoted.\n\n## Examples\n\n",
    );
    for e in EXAMPLES {
        let _ = write!(out, "### {}\n\n```yaml\n{}```\n\n", e.title, e.text);
    }
    out.push_str("## Keys\n\n");
    let keys = FILE.keys;
    let mut i = 0;
    while i < keys.len() {
        let top = keys[i];
        let end = keys[i + 1..].iter().position(|k| !k.path.starts_with(&format!("{}.", top.path)) && !k.path.starts_with(&format!("{}[]", top.path))).map_or(keys.len(), |p| i + 1 + p);
        let _ = write!(out, "### `{}`\n\n{}", top.path, top.doc);
        if top.required {
            out.push_str(" Required.");
        }
        if !top.example.is_empty() {
            let _ = write!(out, " Example: `{}`.", cell(top.example));
        }
        out.push_str("\n\n");
        if end > i + 1 {
            table_md(&mut out, &keys[i + 1..end]);
            out.push('\n');
        }
        i = end;
    }
    out.push_str(
        "## Annotations\n\n\
         Services of the manifests directory and of the Kubernetes source take their settings from these annotations\n\
         (values are strings, as in Kubernetes), bounded as the same settings written inline; EndpointSlices carry\n\
         their endpoints' identifiers in one.\n\n",
    );
    table_md(&mut out, ANNOTATIONS.keys);
    out
}

#[cfg(test)]
mod tests {
    //! Walks of the table against the parser. Documents are built from the
    //! table: each key under the mappings its path needs, those mappings
    //! with their required keys (or their example), in flow style, one
    //! top-level key a line, so that adding a key moves no position the
    //! configuration records.

    use std::path::{Path, PathBuf};

    use super::*;
    use crate::config::{parse_str, ApplianceConfig};
    use crate::problem::Problem;

    /// A YAML tree in the order built.
    #[derive(Clone, Debug)]
    enum Tree {
        Map(Vec<(String, Tree)>),
        List(Vec<Tree>),
        Raw(String),
    }

    impl Tree {
        fn render(&self) -> String {
            match self {
                Tree::Map(kv) => format!("{{{}}}", kv.iter().map(|(k, v)| format!("{k}: {}", v.render())).collect::<Vec<_>>().join(", ")),
                Tree::List(items) => format!("[{}]", items.iter().map(Tree::render).collect::<Vec<_>>().join(", ")),
                Tree::Raw(s) => s.clone(),
            }
        }

        fn document(&self) -> String {
            let Tree::Map(kv) = self else { unreachable!() };
            kv.iter().map(|(k, v)| format!("{k}: {}\n", v.render())).collect()
        }

        fn entry(&mut self, name: &str) -> Option<&mut Tree> {
            let Tree::Map(kv) = self else { return None };
            kv.iter_mut().find(|(k, _)| k == name).map(|(_, v)| v)
        }

        fn remove(&mut self, name: &str) {
            if let Tree::Map(kv) = self {
                kv.retain(|(k, _)| k != name);
            }
        }

        fn set(&mut self, name: &str, v: Tree) {
            let Tree::Map(kv) = self else { panic!("{name}: not in a mapping") };
            match kv.iter_mut().find(|(k, _)| k == name) {
                Some(slot) => slot.1 = v,
                None => kv.push((name.to_owned(), v)),
            }
        }
    }

    /// A mapping at `path` holding the required keys of the table.
    fn filled(path: &str) -> Tree {
        let mut m = Tree::Map(Vec::new());
        for name in FILE.children(path) {
            let child = if path.is_empty() { (*name).to_owned() } else { format!("{path}.{name}") };
            let k = FILE.get(&child).unwrap();
            if k.required {
                m.set(name, least(k, &child));
            }
        }
        m
    }

    /// The least value of `k` at `path`: for a mapping, one of its
    /// required keys only; otherwise its example.
    fn least(k: &Key, path: &str) -> Tree {
        match k.kind {
            Kind::Section if !k.within.is_empty() => Tree::Raw(k.within.to_owned()),
            Kind::Sections if !k.within.is_empty() => Tree::List(vec![Tree::Raw(k.within.to_owned())]),
            Kind::Section => filled(path),
            Kind::Sections => Tree::List(vec![filled(path)]),
            _ => Tree::Raw(k.example.to_owned()),
        }
    }

    /// A value for `k` at `path`: its example, or for a mapping one filled.
    fn value_of(k: &Key, path: &str) -> Tree {
        match k.kind {
            Kind::Section if k.example.is_empty() => filled(path),
            Kind::Sections if k.example.is_empty() => Tree::List(vec![filled(path)]),
            _ => Tree::Raw(k.example.to_owned()),
        }
    }

    /// The least document in which `k` may be written, and the mapping
    /// (by its chain of names) where it goes.
    fn around(k: &Key) -> (Tree, Vec<String>) {
        around_path(k.path, k.within)
    }

    /// As [`around`], for a key at `path` (which the table need not
    /// have), with `within` for its mapping.
    fn around_path(path: &str, within: &str) -> (Tree, Vec<String>) {
        let mut root = filled("");
        let parts: Vec<&str> = path.split('.').collect();
        let mut chain = Vec::new();
        let mut prefix = String::new();
        for (i, part) in parts[..parts.len() - 1].iter().enumerate() {
            let name = part.trim_end_matches("[]");
            prefix = if prefix.is_empty() { (*part).to_owned() } else { format!("{prefix}.{part}") };
            let parent_key = FILE.get(&prefix).unwrap();
            let node = walk(&mut root, &chain);
            if node.entry(name).is_none() {
                node.set(name, least(parent_key, &prefix));
            }
            chain.push(name.to_owned());
            let last = i == parts.len() - 2;
            if last && !within.is_empty() {
                let within = Tree::Raw(within.to_owned());
                let node = walk(&mut root, &chain[..chain.len() - 1]);
                node.set(name, if part.ends_with("[]") { Tree::List(vec![within]) } else { within });
            }
        }
        // Without the key itself, which a least form may hold.
        let own = parts[parts.len() - 1].trim_end_matches("[]");
        walk(&mut root, &chain).remove(own);
        (root, chain)
    }

    /// The mapping at `chain` (the first element of each list on the way),
    /// parsing raw text into a tree where it is written into.
    fn walk<'t>(mut t: &'t mut Tree, chain: &[String]) -> &'t mut Tree {
        for name in chain {
            t = t.entry(name).unwrap();
            if let Tree::Raw(text) = t {
                *t = raw_tree(text);
            }
            if let Tree::List(items) = t {
                t = &mut items[0];
            }
            if let Tree::Raw(text) = t {
                *t = raw_tree(text);
            }
        }
        t
    }

    /// Flow-style YAML as a tree (scalars raw, in JSON's spelling, which
    /// YAML reads alike).
    fn raw_tree(text: &str) -> Tree {
        fn from(v: &serde_json::Value) -> Tree {
            match v {
                serde_json::Value::Object(m) => Tree::Map(m.iter().map(|(k, v)| (k.clone(), from(v))).collect()),
                serde_json::Value::Array(items) => Tree::List(items.iter().map(from).collect()),
                other => Tree::Raw(other.to_string()),
            }
        }
        let v = crate::config::yaml::document(text, &mut crate::config::yaml::Budget::default()).unwrap();
        from(&v.to_json())
    }

    struct Dir(PathBuf);

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A directory the examples' relative paths resolve in.
    fn dir() -> Dir {
        let d = std::env::temp_dir().join(format!("sluice-schema-{}-{:?}", std::process::id(), std::thread::current().id()));
        std::fs::create_dir_all(d.join("manifests")).unwrap();
        std::fs::write(d.join("sibling.key"), "0123456789abcdef0123456789abcdef\n").unwrap();
        Dir(d)
    }

    fn parse(d: &Dir, text: &str) -> Result<ApplianceConfig, Vec<Problem>> {
        parse_str(text, &d.0.join("c.yaml"))
    }

    fn shown(r: &Result<ApplianceConfig, Vec<Problem>>) -> String {
        match r {
            Ok(_) => "ok".into(),
            Err(p) => p.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"),
        }
    }

    #[test]
    fn every_example_parses() {
        let d = dir();
        for e in EXAMPLES {
            let r = parse(&d, e.text);
            assert!(r.is_ok(), "example {:?}:\n{}", e.title, shown(&r));
        }
    }

    #[test]
    fn documented_defaults_are_the_defaults() {
        let d = dir();
        let mut checked = 0;
        for k in FILE.keys {
            let Default::Value(v) = k.default else { continue };
            let (base, chain) = around(k);
            let mut with = base.clone();
            walk(&mut with, &chain).set(k.name(), Tree::Raw(v.to_owned()));
            let (a, b) = (parse(&d, &base.document()), parse(&d, &with.document()));
            assert!(a.is_ok(), "{}: the document without it:\n{}\n{}", k.path, base.document(), shown(&a));
            assert!(b.is_ok(), "{}: the document with {v}:\n{}\n{}", k.path, with.document(), shown(&b));
            assert_eq!(a.unwrap(), b.unwrap(), "{}: writing the documented default {v} changes the configuration", k.path);
            checked += 1;
        }
        assert!(checked > 60, "{checked}");
    }

    #[test]
    fn every_documented_key_is_read() {
        let d = dir();
        for k in FILE.keys {
            if k.required || k.example.is_empty() || matches!(k.kind, Kind::Removed(_)) {
                continue;
            }
            let (base, chain) = around(k);
            let mut with = base.clone();
            let v = value_of(k, k.path);
            walk(&mut with, &chain).set(k.name(), v);
            let (a, b) = (parse(&d, &base.document()), parse(&d, &with.document()));
            assert!(b.is_ok(), "{}: its example does not parse:\n{}\n{}", k.path, with.document(), shown(&b));
            assert_ne!(a.map_err(|p| shown(&Err(p))), Ok(b.unwrap()), "{}: writing {} changes nothing: is it read?\n{}", k.path, k.example, with.document());
        }
    }

    /// Whether the reference says that `k` takes effect at restart: its
    /// own meaning or its top-level section's says so.
    fn at_restart(k: &Key) -> bool {
        const SAYS: &str = "Takes effect at restart.";
        let top = k.path.split(['.', '[']).next().unwrap_or("");
        k.doc.contains(SAYS) || FILE.get(top).is_some_and(|t| t.doc.contains(SAYS))
    }

    /// A reload refuses to change what the reference says takes effect at
    /// restart, and changes everything else in place.
    #[test]
    fn what_takes_effect_at_restart_is_what_the_reference_says() {
        let d = dir();
        for k in FILE.keys {
            if k.required || k.example.is_empty() || matches!(k.kind, Kind::Removed(_) | Kind::Section | Kind::Sections) {
                continue;
            }
            let (base, chain) = around(k);
            let mut with = base.clone();
            walk(&mut with, &chain).set(k.name(), value_of(k, k.path));
            // Without it, a mapping may not parse (a udp check needs send).
            let Ok(a) = parse(&d, &base.document()) else { continue };
            let b = parse(&d, &with.document()).unwrap_or_else(|p| panic!("{}: {}", k.path, shown(&Err(p))));
            let refused = b.start_only_changes(&a);
            assert_eq!(!refused.is_empty(), at_restart(k), "{}: a reload writing {} is refused: {refused:?}", k.path, k.example);
        }
    }

    #[test]
    fn removed_keys_are_refused_with_what_replaced_them() {
        let d = dir();
        for k in FILE.keys {
            let Kind::Removed(by) = k.kind else { continue };
            let (mut doc, chain) = around(k);
            walk(&mut doc, &chain).set(k.name(), Tree::Raw("1".into()));
            let got = shown(&parse(&d, &doc.document()));
            assert!(got.contains(k.path) && got.contains(by), "{}: {got}", k.path);
        }
    }

    #[test]
    fn bounds_are_enforced_where_written() {
        let d = dir();
        for k in FILE.keys {
            let (lo, hi, text): (i64, i64, fn(i64) -> String) = match k.kind {
                Kind::Int(lo, hi) => (lo, hi, |v| v.to_string()),
                Kind::Duration(lo, hi) => (lo as i64, hi as i64, |v| format!("{v}ms")),
                _ => continue,
            };
            let (base, chain) = around(k);
            let at = |v: i64| {
                let mut doc = base.clone();
                walk(&mut doc, &chain).set(k.name(), Tree::Raw(text(v)));
                let out = shown(&parse(&d, &doc.document()));
                out.lines().any(|l| l.contains(&format!("{}: ", normalize(k.path).rsplit('.').next().unwrap())) && l.contains("out of range"))
            };
            assert!(!at(lo) && !at(hi), "{}: {lo} or {hi} refused as out of range", k.path);
            if lo > i64::MIN && !(lo == 0 && matches!(k.kind, Kind::Duration(..))) {
                assert!(at(lo - 1), "{}: {} accepted", k.path, lo - 1);
            }
            if hi < i64::MAX {
                assert!(at(hi + 1), "{}: {} accepted", k.path, hi + 1);
            }
        }
    }

    #[test]
    fn every_mapping_of_the_table_refuses_other_keys() {
        let d = dir();
        for k in FILE.keys.iter().filter(|k| matches!(k.kind, Kind::Section | Kind::Sections)) {
            let (mut doc, mut chain) = around_path(&format!("{}.notAKey", k.path), "");
            walk(&mut doc, &chain).set("notAKey", Tree::Raw("1".into()));
            chain.push("notAKey".into());
            let got = shown(&parse(&d, &doc.document()));
            assert!(got.contains("notAKey: unknown field"), "{}: {got}", k.path);
        }
    }

    #[test]
    fn the_committed_reference_is_the_generated_one() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
        let want = reference();
        if std::env::var_os("SLUICE_WRITE_REFERENCE").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/configuration.md is not the reference core/src/config/schema.rs generates: \
             run SLUICE_WRITE_REFERENCE=1 cargo test -p sluice-core --lib config::schema"
        );
    }
}
