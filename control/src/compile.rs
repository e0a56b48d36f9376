//! From the resolved model to a dataplane snapshot.
//!
//! The compiler places each endpoint (which port, which next hop, which
//! MAC), keeps stable counter slots and incarnations across compilations,
//! and caches each service's compiled form with the spec it came from: a
//! service whose spec did not change is reused as it is, so only changed
//! services' tables are rebuilt.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::RouteSpec;
use sluice_dataplane::service::{Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{NextHop, PortInfo, Snapshot};

use crate::config::{GatewayConfig, IfAddr};
use crate::model::{DeliveryMode, EndpointDef, Resolved};

/// A port as the compiler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoPort {
    /// Name.
    pub name: String,
    /// Its MAC.
    pub mac: [u8; 6],
    /// IP MTU.
    pub mtu: u16,
    /// The appliance's addresses on it.
    pub addresses: Vec<IfAddr>,
}

/// Ports and gateways.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Ports, by index.
    pub ports: Vec<TopoPort>,
    /// Gateways.
    pub gateways: Vec<GatewayConfig>,
}

impl Topology {
    fn port_index(&self, name: &str) -> Option<u8> {
        self.ports.iter().position(|p| p.name == name).and_then(|i| u8::try_from(i).ok())
    }

    /// The port whose subnet holds `a`, and the appliance's address there.
    pub fn on_link(&self, a: Addr) -> Option<(u8, Addr)> {
        self.ports.iter().enumerate().find_map(|(i, p)| {
            let ifa = p.addresses.iter().find(|x| x.addr.is_v4() == a.is_v4() && x.network().contains(a))?;
            Some((u8::try_from(i).ok()?, ifa.addr))
        })
    }

    fn gateway(&self, v4: bool) -> Option<&GatewayConfig> {
        self.gateways.iter().find(|g| g.address.is_v4() == v4)
    }
}

/// MACs the kernel resolved (ARP/ND on the exception interfaces).
pub trait Neighbors {
    /// The MAC of `addr` on port `port`, when resolved.
    fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]>;
}

impl Neighbors for HashMap<(u8, Addr), [u8; 6]> {
    fn mac(&self, port: u8, addr: Addr) -> Option<[u8; 6]> {
        self.get(&(port, addr)).copied()
    }
}

/// Why an endpoint does or does not take traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointState {
    /// In the table.
    Ready,
    /// Established flows only.
    Draining,
    /// Waiting for the next hop's MAC.
    Unresolved,
    /// Cannot be reached as configured (the reason).
    Unreachable(String),
}

impl EndpointState {
    /// Short name for status and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            EndpointState::Ready => "ready",
            EndpointState::Draining => "draining",
            EndpointState::Unresolved => "unresolved",
            EndpointState::Unreachable(_) => "unreachable",
        }
    }
}

/// One endpoint after compilation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointStatus {
    /// Service.
    pub service: String,
    /// Identifier.
    pub id: u32,
    /// Address.
    pub address: Addr,
    /// Weight.
    pub weight: u32,
    /// Next-hop MAC, when known.
    pub mac: Option<[u8; 6]>,
    /// Output port.
    pub port: Option<String>,
    /// State.
    pub state: EndpointState,
    /// Counter slot.
    pub counter: u32,
}

/// A compilation's result.
#[derive(Debug)]
pub struct Compiled {
    /// The snapshot to publish.
    pub snapshot: Snapshot,
    /// Services whose tables were (re)built.
    pub rebuilt: Vec<String>,
    /// Every endpoint.
    pub endpoints: Vec<EndpointStatus>,
    /// Services by counter slot: (slot, name).
    pub service_slots: Vec<(u32, String)>,
    /// Counter slots handed out by this compilation (their counters start over).
    pub new_slots: NewSlots,
    /// Next hops whose MAC is missing: (port, address).
    pub unresolved: Vec<(u8, Addr)>,
    /// Every next hop in use (resolved or not): (port, address).
    pub next_hops: Vec<(u8, Addr)>,
}

/// Counter slots given out for the first time (or again) by a compilation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct NewSlots {
    /// Service slots.
    pub services: Vec<u32>,
    /// Endpoint slots.
    pub endpoints: Vec<u32>,
}

/// Stable small integers for keys, reused first-freed-first.
#[derive(Debug)]
struct Slots<K> {
    map: HashMap<K, u32>,
    free: VecDeque<u32>,
    next: u32,
    cap: u32,
}

impl<K: Hash + Eq + Clone> Slots<K> {
    fn new(cap: u32) -> Self {
        Slots { map: HashMap::new(), free: VecDeque::new(), next: 0, cap }
    }

    /// The slot of `k`, allocating one (and noting it in `new` and in
    /// `journal`, so that [`Slots::undo`] can give it back) when needed.
    fn get(&mut self, k: &K, new: &mut Vec<u32>, journal: &mut Vec<(K, bool)>) -> Option<u32> {
        if let Some(&s) = self.map.get(k) {
            return Some(s);
        }
        let (s, recycled) = match self.free.pop_front() {
            Some(s) => (s, true),
            None if self.next < self.cap => {
                self.next += 1;
                (self.next - 1, false)
            }
            None => return None,
        };
        self.map.insert(k.clone(), s);
        journal.push((k.clone(), recycled));
        new.push(s);
        Some(s)
    }

    /// Gives back, newest first, the slots handed out as `journal` records.
    fn undo(&mut self, journal: Vec<(K, bool)>) {
        for (k, recycled) in journal.into_iter().rev() {
            if let Some(s) = self.map.remove(&k) {
                if recycled {
                    self.free.push_front(s);
                } else {
                    self.next -= 1;
                }
            }
        }
    }

    /// Frees the slots of keys not in `live`.
    fn retain(&mut self, live: &std::collections::HashSet<K>) {
        let gone: Vec<K> = self.map.keys().filter(|k| !live.contains(k)).cloned().collect();
        for k in gone {
            if let Some(s) = self.map.remove(&k) {
                self.free.push_back(s);
            }
        }
    }
}

/// What one compilation changed, to undo it if it fails.
#[derive(Default)]
struct Journal {
    services: Vec<(String, bool)>,
    endpoints: Vec<((String, Addr), bool)>,
    next_incarnation: u32,
    cache: Vec<(String, (ServiceSpec, Arc<Service>))>,
}

/// Keeps what compilations share.
#[derive(Debug)]
pub struct Compiler {
    cache: HashMap<String, (ServiceSpec, Arc<Service>)>,
    service_slots: Slots<String>,
    endpoint_slots: Slots<(String, Addr)>,
    incarnations: HashMap<(String, Addr, u32), u32>,
    next_incarnation: u32,
    generation: u64,
}

impl Compiler {
    /// A compiler with `max_services` service and `max_endpoints` endpoint
    /// counter slots.
    pub fn new(max_services: u32, max_endpoints: u32) -> Compiler {
        Compiler {
            cache: HashMap::new(),
            service_slots: Slots::new(max_services),
            endpoint_slots: Slots::new(max_endpoints),
            incarnations: HashMap::new(),
            next_incarnation: 1,
            generation: 0,
        }
    }

    /// Compiles `r` for `topo`, with MACs from `neigh`. All or nothing: a
    /// compilation that fails leaves the compiler as it was (no counter
    /// slot, incarnation, cached table or generation is kept from it).
    pub fn compile(&mut self, r: &Resolved, topo: &Topology, neigh: &dyn Neighbors) -> Result<Compiled, String> {
        let mut j = Journal { next_incarnation: self.next_incarnation, ..Journal::default() };
        match self.try_compile(r, topo, neigh, &mut j) {
            Ok(c) => {
                for (name, entry) in j.cache {
                    self.cache.insert(name, entry);
                }
                self.cache.retain(|k, _| r.services.contains_key(k));
                Ok(c)
            }
            Err(e) => {
                self.service_slots.undo(j.services);
                self.endpoint_slots.undo(j.endpoints);
                self.next_incarnation = j.next_incarnation;
                Err(e)
            }
        }
    }

    fn try_compile(&mut self, r: &Resolved, topo: &Topology, neigh: &dyn Neighbors, j: &mut Journal) -> Result<Compiled, String> {
        let mut new = NewSlots::default();
        let mut endpoints = Vec::new();
        let mut unresolved = Vec::new();
        let mut hops = Vec::new();
        let mut services = Vec::new();
        let mut index: HashMap<&str, u32> = HashMap::new();
        let mut rebuilt = Vec::new();
        let mut service_slots = Vec::new();
        let mut live_eps = std::collections::HashSet::new();
        let mut live_inc = HashMap::new();
        for (name, s) in &r.services {
            let key = self.service_slots.get(name, &mut new.services, &mut j.services).ok_or_else(|| {
                format!("more than {} services: raise capacity.services", self.service_slots.cap)
            })?;
            service_slots.push((key, name.clone()));
            let mut specs = Vec::new();
            for e in &s.endpoints {
                live_eps.insert((name.clone(), e.address));
                let counter = self.endpoint_slots.get(&(name.clone(), e.address), &mut new.endpoints, &mut j.endpoints).ok_or_else(|| {
                    format!("more than {} endpoints: raise capacity.endpoints", self.endpoint_slots.cap)
                })?;
                let ikey = (name.clone(), e.address, e.id);
                let incarnation = match self.incarnations.get(&ikey) {
                    Some(&i) => i,
                    None => {
                        self.next_incarnation = self.next_incarnation.wrapping_add(1).max(1);
                        self.next_incarnation
                    }
                };
                live_inc.insert(ikey, incarnation);
                let (placed, status) = place(e, s.delivery, topo, neigh, &mut unresolved, &mut hops);
                endpoints.push(EndpointStatus {
                    service: name.clone(),
                    id: e.id,
                    address: e.address,
                    weight: e.weight,
                    mac: placed.map(|p| p.mac),
                    port: placed.map(|p| topo.ports[usize::from(p.port)].name.clone()),
                    state: if status == EndpointState::Ready && e.draining { EndpointState::Draining } else { status },
                    counter,
                });
                if let Some(pl) = placed {
                    specs.push(EndpointSpec {
                        id: u16::try_from(e.id).map_err(|_| format!("endpoint identifier {} too large", e.id))?,
                        incarnation,
                        weight: e.weight,
                        draining: e.draining,
                        addr: e.address,
                        port: pl.port,
                        mac: pl.mac,
                        delivery: pl.delivery,
                        counter,
                    });
                }
            }
            let spec = ServiceSpec {
                name: name.clone(),
                key,
                algorithm: s.algorithm,
                flow_table: s.flow_table,
                limit: s.limit,
                table_size: s.table_size,
                endpoints: specs,
            };
            let svc = match self.cache.get(name) {
                Some((old, svc)) if *old == spec => Arc::clone(svc),
                _ => {
                    let svc = Arc::new(Service::build(&spec).map_err(|e| format!("service {name:?}: {e}"))?);
                    j.cache.push((name.clone(), (spec, Arc::clone(&svc))));
                    rebuilt.push(name.clone());
                    svc
                }
            };
            index.insert(name, u32::try_from(services.len()).unwrap_or(u32::MAX));
            services.push(svc);
        }
        self.service_slots.retain(&r.services.keys().cloned().collect());
        self.endpoint_slots.retain(&live_eps);
        self.incarnations = live_inc;

        let routes: Vec<RouteSpec> = r
            .routes
            .iter()
            .filter_map(|rt| {
                Some(RouteSpec {
                    name: rt.name.clone(),
                    priority: rt.priority,
                    service: *index.get(rt.service.as_str())?,
                    matches: rt.matches.clone(),
                })
            })
            .collect();

        let mut gw = |v4: bool| -> Option<NextHop> {
            let g = topo.gateway(v4)?;
            let port = topo.port_index(&g.port)?;
            if g.mac.is_none() {
                hops.push((port, g.address));
            }
            let mac = g.mac.or_else(|| neigh.mac(port, g.address));
            if mac.is_none() {
                unresolved.push((port, g.address));
            }
            Some(NextHop { port, mac: mac? })
        };
        let (gateway_v4, gateway_v6) = (gw(true), gw(false));
        self.generation += 1;
        let ports = topo.ports.iter().map(|p| PortInfo { mac: p.mac, mtu: p.mtu }).collect();
        let snapshot = Snapshot::new(self.generation, &routes, services, ports, gateway_v4, gateway_v6);
        unresolved.sort();
        unresolved.dedup();
        hops.sort();
        hops.dedup();
        Ok(Compiled { snapshot, rebuilt, endpoints, service_slots, new_slots: new, unresolved, next_hops: hops })
    }
}

#[derive(Clone, Copy)]
struct Placed {
    port: u8,
    mac: [u8; 6],
    delivery: Delivery,
}

/// Where and how an endpoint is reached.
fn place(
    e: &EndpointDef,
    mode: DeliveryMode,
    topo: &Topology,
    neigh: &dyn Neighbors,
    unresolved: &mut Vec<(u8, Addr)>,
    hops: &mut Vec<(u8, Addr)>,
) -> (Option<Placed>, EndpointState) {
    let link = topo.on_link(e.address);
    // The next hop, and its MAC when the configuration gives it (the
    // endpoint's own `mac`, or the gateway's).
    let (port, hop, delivery, static_mac) = match (mode, link) {
        (DeliveryMode::L2, Some((port, _))) => (port, e.address, Delivery::L2, e.mac),
        (DeliveryMode::L2, None) => {
            return (None, EndpointState::Unreachable(format!(
                "{} is on no port's subnet (l2 delivery needs the endpoint on a shared segment; use delivery: ipip for routed endpoints)",
                e.address
            )));
        }
        (DeliveryMode::IpIp, Some((port, src))) => (port, e.address, Delivery::IpIp { src }, e.mac),
        (DeliveryMode::IpIp, None) => {
            let Some(g) = topo.gateway(e.address.is_v4()) else {
                return (None, EndpointState::Unreachable(format!("{} is off-link and there is no gateway for its family", e.address)));
            };
            let Some(port) = topo.port_index(&g.port) else {
                return (None, EndpointState::Unreachable(format!("gateway port {:?} is unknown", g.port)));
            };
            let Some(src) = topo.ports[usize::from(port)].addresses.iter().find(|a| a.addr.is_v4() == e.address.is_v4()) else {
                return (None, EndpointState::Unreachable(format!("port {:?} has no address to tunnel from", g.port)));
            };
            (port, g.address, Delivery::IpIp { src: src.addr }, g.mac)
        }
    };
    if static_mac.is_none() {
        hops.push((port, hop));
    }
    match static_mac.or_else(|| neigh.mac(port, hop)) {
        Some(mac) => (Some(Placed { port, mac, delivery }), EndpointState::Ready),
        None => {
            unresolved.push((port, hop));
            (None, EndpointState::Unresolved)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Defaults, Desired, Model, Origin, RouteDef, ServiceDef};
    use sluice_dataplane::classify::RouteMatch;

    fn topo() -> Topology {
        let ifa = |s: &str| {
            let (a, l) = s.split_once('/').unwrap();
            IfAddr { addr: a.parse().unwrap(), prefix: l.parse().unwrap() }
        };
        Topology {
            ports: vec![
                TopoPort { name: "front".into(), mac: [2, 0, 0, 0, 0, 1], mtu: 1500, addresses: vec![ifa("10.100.0.1/24")] },
                TopoPort { name: "back".into(), mac: [2, 0, 0, 0, 0, 2], mtu: 1500, addresses: vec![ifa("10.200.0.1/24")] },
            ],
            gateways: vec![GatewayConfig { address: "10.100.0.2".parse().unwrap(), port: "front".into(), mac: None }],
        }
    }

    fn ep(svc: &str, id: u32, a: &str) -> EndpointDef {
        EndpointDef { service: svc.into(), id, address: a.parse().unwrap(), weight: 1, draining: false, mac: None, origin: Origin::default() }
    }

    fn resolved(eps: Vec<EndpointDef>) -> Resolved {
        let mut m = Model::default();
        m.set(
            "t",
            Desired {
                services: vec![
                    ServiceDef { name: "web".into(), ..Default::default() },
                    ServiceDef { name: "dns".into(), ..Default::default() },
                ],
                endpoints: eps,
                routes: vec![RouteDef {
                    name: "r".into(),
                    service: "web".into(),
                    priority: 0,
                    matches: RouteMatch { vips: vec!["20.0.0.1".parse().unwrap()], ..RouteMatch::default() },
                    origin: Origin::default(),
                }],
            },
        );
        m.resolve(&Defaults::default()).unwrap()
    }

    #[test]
    fn only_changed_services_are_rebuilt_and_slots_are_stable() {
        let mut neigh: HashMap<(u8, Addr), [u8; 6]> = HashMap::new();
        neigh.insert((1, "10.200.0.11".parse().unwrap()), [2, 0xee, 0, 0, 0, 11]);
        neigh.insert((0, "10.100.0.2".parse().unwrap()), [2, 0xcc, 0, 0, 0, 2]);
        let mut c = Compiler::new(16, 64);
        let r1 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.12"), ep("dns", 0, "10.200.0.11")]);
        let a = c.compile(&r1, &topo(), &neigh).unwrap();
        assert_eq!(a.rebuilt, vec!["dns".to_string(), "web".to_string()]);
        assert_eq!(a.unresolved, vec![(1, "10.200.0.12".parse().unwrap())]);
        let states: Vec<&str> = a.endpoints.iter().map(|e| e.state.name()).collect();
        assert_eq!(states, vec!["ready", "ready", "unresolved"]);
        assert!(a.snapshot.gateway_v4.is_some());

        // The missing MAC arrives: only "web" changes.
        neigh.insert((1, "10.200.0.12".parse().unwrap()), [2, 0xee, 0, 0, 0, 12]);
        let b = c.compile(&r1, &topo(), &neigh).unwrap();
        assert_eq!(b.rebuilt, vec!["web".to_string()]);
        assert!(Arc::ptr_eq(&a.snapshot.services[0], &b.snapshot.services[0]), "dns reused");
        assert_eq!(b.snapshot.generation, a.snapshot.generation + 1);
        assert_eq!(a.service_slots, b.service_slots);
        assert!(b.new_slots.services.is_empty() && b.new_slots.endpoints.is_empty());

        // Identifier 1 goes to another address: a new incarnation.
        let r2 = resolved(vec![ep("web", 0, "10.200.0.11"), ep("web", 1, "10.200.0.13"), ep("dns", 0, "10.200.0.11")]);
        neigh.insert((1, "10.200.0.13".parse().unwrap()), [2, 0xee, 0, 0, 0, 13]);
        let c2 = c.compile(&r2, &topo(), &neigh).unwrap();
        let web = &c2.snapshot.services[1];
        let old = &b.snapshot.services[1];
        assert_ne!(web.endpoint(1).unwrap().incarnation, old.endpoint(1).unwrap().incarnation);
        assert_eq!(web.endpoint(0).unwrap().incarnation, old.endpoint(0).unwrap().incarnation);
        assert_eq!(c2.new_slots.endpoints.len(), 1);
    }

    #[test]
    fn a_compile_that_fails_leaves_no_slot_behind() {
        // Found: a compile failing on capacity kept the counter slots it had
        // handed out; the slot (recycled from a removed service) was then
        // not reported as new, so the service showed its previous owner's
        // counts.
        let one = |names: &[&str]| {
            let mut m = Model::default();
            m.set(
                "t",
                Desired { services: names.iter().map(|n| ServiceDef { name: (*n).into(), ..Default::default() }).collect(), ..Default::default() },
            );
            m.resolve(&Defaults::default()).unwrap()
        };
        let none = HashMap::new();
        let mut c = Compiler::new(2, 64);
        let a = c.compile(&one(&["a"]), &topo(), &none).unwrap();
        assert_eq!(a.new_slots.services, vec![0]);
        let b = c.compile(&one(&["b"]), &topo(), &none).unwrap();
        assert_eq!(b.new_slots.services, vec![1], "a's slot is freed only after this compile");
        let generation = b.snapshot.generation;
        // "c" takes a's old slot, then "d" and "e" overflow: the compile fails.
        assert!(c.compile(&one(&["c", "d", "e"]), &topo(), &none).unwrap_err().contains("capacity.services"));
        let c2 = c.compile(&one(&["c"]), &topo(), &none).unwrap();
        assert_eq!(c2.new_slots.services, vec![0], "c's slot is new to it, so its counters start over");
        assert_eq!(c2.rebuilt, vec!["c".to_string()]);
        assert_eq!(c2.snapshot.generation, generation + 1, "a failed compile publishes no generation");
    }

    #[test]
    fn routed_endpoints_use_the_gateways_static_mac() {
        // Found by tests/xds_tables.rs: with a gateway whose MAC is given in
        // the configuration (no kernel interface to resolve it), every
        // IP-in-IP endpoint behind it stayed "unresolved".
        let mut t = topo();
        t.gateways[0].mac = Some([2, 0, 0, 0, 1, 0xfe]);
        let mut m = Model::default();
        m.set(
            "t",
            Desired {
                services: vec![ServiceDef { name: "web".into(), delivery: Some(DeliveryMode::IpIp), ..Default::default() }],
                endpoints: vec![ep("web", 0, "10.50.0.1"), ep("web", 1, "10.50.0.2")],
                ..Default::default()
            },
        );
        let r = m.resolve(&Defaults::default()).unwrap();
        let out = Compiler::new(16, 64).compile(&r, &t, &HashMap::new()).unwrap();
        let states: Vec<&str> = out.endpoints.iter().map(|e| e.state.name()).collect();
        assert_eq!(states, vec!["ready", "ready"]);
        assert!(out.unresolved.is_empty(), "{:?}", out.unresolved);
        let web = &out.snapshot.services[0];
        assert_eq!(web.endpoint(0).unwrap().mac, [2, 0, 0, 0, 1, 0xfe]);
    }

    #[test]
    fn unreachable_endpoints_say_why() {
        let mut c = Compiler::new(16, 64);
        let r = resolved(vec![ep("web", 0, "192.168.9.9")]);
        let out = c.compile(&r, &topo(), &HashMap::new()).unwrap();
        match &out.endpoints[0].state {
            EndpointState::Unreachable(why) => assert!(why.contains("on no port's subnet"), "{why}"),
            s => panic!("{s:?}"),
        }
        let mut tiny = Compiler::new(1, 64);
        assert!(tiny.compile(&r, &topo(), &HashMap::new()).unwrap_err().contains("capacity.services"));
    }
}
