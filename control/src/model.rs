//! The flat internal model (the Cilium control-plane seed): routes,
//! services and endpoints as plain definitions, each owned by the source
//! that wrote it. Endpoints are kept apart from services, so they may
//! arrive before or after their service and from another source.
//!
//! [`Model::resolve`] merges every source and checks the whole: names are
//! unique, references resolve, identifiers are unique and below the
//! service's limit. Every problem is reported, with where it came from.

use std::collections::{BTreeMap, HashMap, HashSet};

use sluice_dataplane::addr::Addr;
use sluice_dataplane::classify::RouteMatch;
use sluice_dataplane::maglev::{default_size, is_prime, next_prime};
use sluice_dataplane::service::Algorithm;

use crate::config::node::{Problem, Problems};

/// Where a definition came from: a file and a path inside it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Origin {
    /// File.
    pub file: String,
    /// Path in the file.
    pub path: String,
}

impl Origin {
    fn problem(&self, message: impl Into<String>) -> Problem {
        Problem { file: self.file.clone(), path: self.path.clone(), message: message.into() }
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

impl std::str::FromStr for DeliveryMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "l2" => Ok(DeliveryMode::L2),
            "ipip" => Ok(DeliveryMode::IpIp),
            other => Err(format!("unknown delivery {other:?} (expected l2 or ipip)")),
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
    /// What it matches.
    pub matches: RouteMatch,
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
    /// Where it came from.
    pub origin: Origin,
}

/// An endpoint of a service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointDef {
    /// The service.
    pub service: String,
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
    /// Where it came from.
    pub origin: Origin,
}

/// Everything one source wants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Routes.
    pub routes: Vec<RouteDef>,
    /// Services.
    pub services: Vec<ServiceDef>,
    /// Endpoints.
    pub endpoints: Vec<EndpointDef>,
}

/// Appliance-wide defaults for services.
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
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults { algorithm: Algorithm::Maglev, limit: 32, flow_table: false, delivery: DeliveryMode::L2 }
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
    /// Endpoints, by identifier.
    pub endpoints: Vec<EndpointDef>,
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
}

impl Model {
    /// Replaces everything `source` owns with `desired` (upsert and prune).
    pub fn set(&mut self, source: &str, desired: Desired) {
        self.sources.insert(source.to_owned(), desired);
    }

    /// Drops everything `source` owns.
    pub fn remove(&mut self, source: &str) {
        self.sources.remove(source);
    }

    /// What `source` owns.
    pub fn get(&self, source: &str) -> Option<&Desired> {
        self.sources.get(source)
    }

    /// Puts back what [`Model::get`] returned: `source` owns `desired`, or
    /// nothing.
    pub fn put(&mut self, source: &str, desired: Option<Desired>) {
        match desired {
            Some(d) => self.set(source, d),
            None => self.remove(source),
        }
    }

    /// Merges the sources and checks the result.
    pub fn resolve(&self, defaults: &Defaults) -> Result<Resolved, Vec<Problem>> {
        let mut p = Problems::default();
        let mut services: BTreeMap<String, ResolvedService> = BTreeMap::new();
        let mut owners: HashMap<String, &Origin> = HashMap::new();
        for d in self.sources.values() {
            for s in &d.services {
                if let Some(first) = owners.get(&s.name) {
                    p.0.push(s.origin.problem(format!(
                        "service {:?} is already defined at {}: {}",
                        s.name, first.file, first.path
                    )));
                    continue;
                }
                owners.insert(s.name.clone(), &s.origin);
                let limit = s.limit.unwrap_or(defaults.limit);
                if limit == 0 || limit > 65536 {
                    p.0.push(s.origin.problem(format!("endpoint limit {limit} is outside 1..=65536")));
                    continue;
                }
                let table_size = match s.table_size {
                    None => default_size(limit),
                    Some(m) if !is_prime(m) => {
                        p.0.push(s.origin.problem(format!(
                            "table size {m} is not a prime (the next prime is {})",
                            next_prime(m)
                        )));
                        continue;
                    }
                    Some(m) if m < limit => {
                        p.0.push(s.origin.problem(format!("table size {m} is smaller than the endpoint limit {limit}")));
                        continue;
                    }
                    Some(m) => m,
                };
                services.insert(
                    s.name.clone(),
                    ResolvedService {
                        name: s.name.clone(),
                        algorithm: s.algorithm.unwrap_or(defaults.algorithm),
                        limit,
                        table_size,
                        flow_table: s.flow_table.unwrap_or(defaults.flow_table),
                        delivery: s.delivery.unwrap_or(defaults.delivery),
                        endpoints: Vec::new(),
                    },
                );
            }
        }

        let mut ids: HashMap<(&str, u32), &Origin> = HashMap::new();
        let mut addrs: HashSet<(&str, Addr)> = HashSet::new();
        for d in self.sources.values() {
            for e in &d.endpoints {
                let Some(svc) = services.get_mut(&e.service) else {
                    if !owners.contains_key(&e.service) {
                        p.0.push(e.origin.problem(format!("endpoint of an unknown service {:?}", e.service)));
                    }
                    continue;
                };
                if e.id >= svc.limit {
                    p.0.push(e.origin.problem(format!(
                        "endpoint identifier {} is beyond the limit of service {:?} (identifiers are 0..{})",
                        e.id,
                        e.service,
                        svc.limit - 1
                    )));
                    continue;
                }
                if let Some(first) = ids.get(&(e.service.as_str(), e.id)) {
                    p.0.push(e.origin.problem(format!(
                        "duplicate endpoint identifier {} in service {:?} (also at {}: {})",
                        e.id, e.service, first.file, first.path
                    )));
                    continue;
                }
                if !addrs.insert((e.service.as_str(), e.address)) {
                    p.0.push(e.origin.problem(format!("endpoint {} appears twice in service {:?}", e.address, e.service)));
                    continue;
                }
                ids.insert((e.service.as_str(), e.id), &e.origin);
                svc.endpoints.push(e.clone());
            }
        }
        for s in services.values_mut() {
            s.endpoints.sort_by_key(|e| e.id);
        }

        let mut routes: Vec<RouteDef> = Vec::new();
        let mut route_names: HashMap<&str, &Origin> = HashMap::new();
        for d in self.sources.values() {
            for r in &d.routes {
                if let Some(first) = route_names.get(r.name.as_str()) {
                    p.0.push(r.origin.problem(format!(
                        "route {:?} is already defined at {}: {}",
                        r.name, first.file, first.path
                    )));
                    continue;
                }
                route_names.insert(&r.name, &r.origin);
                if !services.contains_key(&r.service) {
                    p.0.push(r.origin.problem(if owners.contains_key(&r.service) {
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
        if p.is_empty() {
            Ok(Resolved { routes, services })
        } else {
            Err(p.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(path: &str) -> Origin {
        Origin { file: "t.yaml".into(), path: path.into() }
    }

    fn svc(name: &str) -> ServiceDef {
        ServiceDef { name: name.into(), origin: origin(&format!("services.{name}")), ..Default::default() }
    }

    fn ep(service: &str, id: u32, a: &str) -> EndpointDef {
        EndpointDef {
            service: service.into(),
            id,
            address: a.parse().unwrap(),
            weight: 1,
            draining: false,
            mac: None,
            origin: origin(&format!("endpoints.{a}")),
        }
    }

    fn route(name: &str, service: &str) -> RouteDef {
        RouteDef {
            name: name.into(),
            service: service.into(),
            priority: 1,
            matches: RouteMatch { vips: vec!["20.0.0.1".parse().unwrap()], ..RouteMatch::default() },
            origin: origin(&format!("routes.{name}")),
        }
    }

    #[test]
    fn sources_merge_and_endpoints_may_come_from_elsewhere() {
        let mut m = Model::default();
        m.set("file", Desired { services: vec![svc("web")], routes: vec![route("r", "web")], endpoints: vec![ep("web", 1, "10.0.0.2")] });
        m.set("k8s", Desired { endpoints: vec![ep("web", 0, "10.0.0.1")], ..Default::default() });
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
                endpoints: vec![ep("web", 0, "10.0.0.1"), ep("web", 0, "10.0.0.2"), ep("small", 2, "10.0.0.3"), ep("ghost", 0, "10.0.0.4")],
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
}
