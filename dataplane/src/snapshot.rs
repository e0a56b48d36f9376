//! The snapshot: one immutable structure with everything a worker needs
//! to forward (routes, services, ports, gateways), published by the control
//! thread through [`crate::rcu`] and read by workers once per burst.

use std::sync::Arc;

use crate::addr::Addr;
use crate::chunked::Chunked;
use crate::classify::{Classifier, RouteSpec};
use crate::service::Service;

/// An output port as the pipeline sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PortInfo {
    /// Its MAC: source of rewritten frames, and the destination that marks
    /// a frame as meant for the appliance.
    pub mac: [u8; 6],
    /// IP MTU (encapsulated packets above it are dropped).
    pub mtu: u16,
    /// The 802.1Q VLAN the port serves (0: none). Such a port takes only
    /// frames tagged with it and tags what it sends; a port without a VLAN
    /// takes only untagged (or priority-tagged, VLAN 0) frames.
    pub vlan: u16,
}

/// A next hop on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// Output port index.
    pub port: u8,
    /// Its MAC.
    pub mac: [u8; 6],
}

/// Services by index, in chunks that successive snapshots share: a
/// snapshot that changes a few services copies the chunk pointers and the
/// chunks of the changed services only.
pub type Services = Chunked<Arc<Service>>;

/// Lists by index, in one: (start, length) of each index's list, and the
/// lists one after the other.
type Spans = (Vec<(u32, u32)>, Vec<u32>);

/// Everything workers read.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Increases with every publication.
    pub generation: u64,
    /// Routes (shared by successive snapshots while the routes stay).
    pub classifier: Arc<Classifier>,
    /// Services, indexed by [`RouteSpec::service`].
    pub services: Services,
    /// Ports, by index.
    pub ports: Vec<PortInfo>,
    /// Where IPv4 return traffic (from a VIP) goes.
    pub gateway_v4: Option<NextHop>,
    /// Where IPv6 return traffic goes.
    pub gateway_v6: Option<NextHop>,
    /// Services by stable key, sorted: (key, index). Shared by successive
    /// snapshots while no service comes, goes or changes its key (a
    /// lookup reads it as it would read a `Vec`).
    by_key: Arc<[(u32, u32)]>,
    /// Per VIP index: the range of `return_keys` holding who may send
    /// return traffic from that VIP.
    return_spans: Arc<[(u32, u32)]>,
    /// Sorted per VIP: [`return_key`] of every endpoint (input port and
    /// MAC) of every service the VIP routes to. Shared with `return_spans`
    /// by successive snapshots while a change leaves them the same (a
    /// change of endpoints behind the same next hop, or of weights).
    return_keys: Arc<[u64]>,
    /// Per VIP index: the routes (indices) that match it. Made with the
    /// classifier and shared as it is, while the routes stay the same.
    vip_routes: Arc<Vec<Vec<u32>>>,
    /// Per service index: the VIPs (indices) routed to it, sorted, as
    /// spans of one list; made and shared as `vip_routes` is.
    service_vips: Arc<Spans>,
    /// The appliance's own addresses (every port's): return traffic to
    /// one of them (an endpoint's answer to a check of the VIP) is the
    /// kernel's, not the gateway's.
    pub own: Arc<[Addr]>,
}

/// One 64-bit key for (input port, source MAC).
#[inline(always)]
fn return_key(port: u8, mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([0, port, mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]])
}

/// Services by stable key, sorted: (key, index).
fn by_key(services: &Services) -> Arc<[(u32, u32)]> {
    let mut by_key: Vec<(u32, u32)> =
        services.iter().enumerate().map(|(i, s)| (s.key, u32::try_from(i).unwrap_or(u32::MAX))).collect();
    by_key.sort_unstable();
    by_key.into()
}

/// Appends one list, sorted and without duplicates, and its span: one VIP's
/// return keys, one service's VIPs.
fn push_keys<T: Ord + Copy>(spans: &mut Vec<(u32, u32)>, keys: &mut Vec<T>, mut a: Vec<T>) {
    a.sort_unstable();
    a.dedup();
    push_sorted(spans, keys, &a);
}

/// Appends one list already sorted and without duplicates, and its span.
fn push_sorted<T: Copy>(spans: &mut Vec<(u32, u32)>, keys: &mut Vec<T>, a: &[T]) {
    let start = u32::try_from(keys.len()).unwrap_or(u32::MAX);
    spans.push((start, u32::try_from(a.len()).unwrap_or(0)));
    keys.extend_from_slice(a);
}

/// The list at index `i` of lists kept as spans of one (empty when there is
/// none).
#[inline(always)]
fn span<'a, T>(spans: &[(u32, u32)], list: &'a [T], i: usize) -> &'a [T] {
    let Some(&(start, len)) = spans.get(i) else { return &[] };
    list.get(start as usize..start as usize + len as usize).unwrap_or_default()
}

impl Snapshot {
    /// Assembles a snapshot. Routes name services by index into `services`.
    pub fn new(
        generation: u64,
        routes: &[RouteSpec],
        services: Vec<Arc<Service>>,
        ports: Vec<PortInfo>,
        gateway_v4: Option<NextHop>,
        gateway_v6: Option<NextHop>,
    ) -> Snapshot {
        Snapshot::with_classifier(generation, routes, Arc::new(Classifier::build(routes)), services, ports, gateway_v4, gateway_v6)
    }

    /// [`Snapshot::new`] with the classifier of `routes` already built
    /// (`Classifier::build(routes)`, kept from an earlier snapshot whose
    /// routes were the same): a change to endpoints only costs no
    /// classifier build.
    pub fn with_classifier(
        generation: u64,
        routes: &[RouteSpec],
        classifier: Arc<Classifier>,
        services: Vec<Arc<Service>>,
        ports: Vec<PortInfo>,
        gateway_v4: Option<NextHop>,
        gateway_v6: Option<NextHop>,
    ) -> Snapshot {
        let services = Services::from(services);
        let by_key = by_key(&services);
        // Who may send return traffic from each VIP: the endpoints (as the
        // port and MAC their frames come from) of the services it routes to.
        let mut allowed: Vec<Vec<u64>> = vec![Vec::new(); classifier.vips().len()];
        let mut vip_routes: Vec<Vec<u32>> = vec![Vec::new(); classifier.vips().len()];
        let mut vips_of: Vec<Vec<u32>> = vec![Vec::new(); services.len()];
        for (ri, r) in routes.iter().enumerate() {
            for v in &r.matches.vips {
                let Some(i) = classifier.vip_index(*v).filter(|i| *i < allowed.len()) else { continue };
                vip_routes[i].push(u32::try_from(ri).unwrap_or(u32::MAX));
                if let Some(v) = vips_of.get_mut(r.service as usize) {
                    v.push(u32::try_from(i).unwrap_or(u32::MAX));
                }
                let Some(svc) = services.get(r.service as usize) else { continue };
                allowed[i].extend(svc.endpoints().map(|e| return_key(e.port, e.mac)));
            }
        }
        let mut return_spans = Vec::with_capacity(allowed.len());
        let mut return_keys = Vec::new();
        for a in allowed {
            push_keys(&mut return_spans, &mut return_keys, a);
        }
        let (mut spans, mut vips) = (Vec::with_capacity(vips_of.len()), Vec::new());
        for v in vips_of {
            push_keys(&mut spans, &mut vips, v);
        }
        let service_vips = Arc::new((spans, vips));
        Snapshot {
            generation,
            classifier,
            services,
            ports,
            gateway_v4,
            gateway_v6,
            by_key,
            return_spans: return_spans.into(),
            return_keys: return_keys.into(),
            vip_routes: Arc::new(vip_routes),
            service_vips,
            own: Arc::from([]),
        }
    }

    /// This snapshot with the services at the given indices replaced
    /// (`changed`: index, new service with the same key), as
    /// [`Snapshot::with_classifier`] would assemble it from the same
    /// `routes` (those this one was made from) with the new services: only
    /// the return traffic of the VIPs routed to a changed service is worked
    /// out again, the rest is copied.
    pub fn with_changed(
        &self,
        generation: u64,
        routes: &[RouteSpec],
        changed: &[(usize, Arc<Service>)],
        ports: Vec<PortInfo>,
        gateway_v4: Option<NextHop>,
        gateway_v6: Option<NextHop>,
    ) -> Snapshot {
        let mut services = self.services.clone();
        let mut same_keys = true;
        // The VIPs routed to a changed service (not a pass over every route).
        let mut vips: Vec<usize> = Vec::new();
        let (spans, service_vips) = &*self.service_vips;
        for (i, svc) in changed {
            if let Some(slot) = services.get_mut(*i) {
                same_keys &= slot.key == svc.key;
                *slot = Arc::clone(svc);
                vips.extend(span(spans, service_vips, *i).iter().map(|&v| v as usize));
            }
        }
        let by_key = if same_keys { Arc::clone(&self.by_key) } else { by_key(&services) };
        vips.sort_unstable();
        vips.dedup();
        // The routes of those VIPs only (not a pass over every route).
        let fresh: Vec<Vec<u64>> = vips
            .iter()
            .map(|&v| {
                let mut keys = Vec::new();
                for &ri in self.vip_routes.get(v).map(Vec::as_slice).unwrap_or_default() {
                    let Some(svc) = routes.get(ri as usize).and_then(|r| services.get(r.service as usize)) else { continue };
                    keys.extend(svc.endpoints().map(|e| return_key(e.port, e.mac)));
                }
                keys.sort_unstable();
                keys.dedup();
                keys
            })
            .collect();
        let (return_spans, return_keys) =
            if vips.iter().zip(&fresh).all(|(&v, a)| span(&self.return_spans, &self.return_keys, v) == a.as_slice()) {
                (Arc::clone(&self.return_spans), Arc::clone(&self.return_keys))
            } else {
                let mut return_spans = Vec::with_capacity(self.return_spans.len());
                let mut return_keys = Vec::with_capacity(self.return_keys.len());
                let mut fresh = vips.iter().zip(&fresh).peekable();
                for i in 0..self.return_spans.len() {
                    let list = match fresh.next_if(|(v, _)| **v == i) {
                        Some((_, a)) => a.as_slice(),
                        None => span(&self.return_spans, &self.return_keys, i),
                    };
                    push_sorted(&mut return_spans, &mut return_keys, list);
                }
                (return_spans.into(), return_keys.into())
            };
        Snapshot {
            generation,
            classifier: Arc::clone(&self.classifier),
            services,
            ports,
            gateway_v4,
            gateway_v6,
            by_key,
            return_spans,
            return_keys,
            vip_routes: Arc::clone(&self.vip_routes),
            service_vips: Arc::clone(&self.service_vips),
            own: Arc::clone(&self.own),
        }
    }

    /// This snapshot with `own` as the appliance's own addresses.
    pub fn with_own(self, own: Arc<[Addr]>) -> Snapshot {
        Snapshot { own, ..self }
    }

    /// True when `a` is one of the appliance's own addresses.
    #[inline(always)]
    pub fn is_own(&self, a: Addr) -> bool {
        self.own.contains(&a)
    }

    /// The VIPs routed to the service of index `service`, in VIP order.
    pub fn vips_of(&self, service: usize) -> impl Iterator<Item = Addr> + '_ {
        let (spans, vips) = &*self.service_vips;
        span(spans, vips, service).iter().filter_map(|&v| self.classifier.vips().get(v as usize).copied())
    }

    /// True when a frame from `mac` received on port `port` may carry
    /// return traffic from the VIP of index `vip` (from
    /// [`Classifier::vip_index`]): it comes from an endpoint of a service
    /// that VIP routes to.
    #[inline]
    pub fn return_allowed(&self, vip: usize, port: u8, mac: [u8; 6]) -> bool {
        span(&self.return_spans, &self.return_keys, vip).binary_search(&return_key(port, mac)).is_ok()
    }

    /// The service with stable key `key`.
    #[inline]
    pub fn service_by_key(&self, key: u32) -> Option<&Service> {
        let i = self.by_key.binary_search_by_key(&key, |&(k, _)| k).ok()?;
        self.services.get(self.by_key[i].1 as usize).map(|s| &**s)
    }

    /// Bytes of heap memory used by routes and services.
    pub fn heap_bytes(&self) -> usize {
        self.classifier.heap_bytes()
            + self.services.iter().map(|s| s.heap_bytes() + std::mem::size_of::<Service>()).sum::<usize>()
            + self.by_key.len() * 8
            + self.return_spans.len() * 8
            + self.return_keys.len() * 8
            + (self.service_vips.0.capacity() * 8 + self.service_vips.1.capacity() * 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::Addr;
    use crate::classify::RouteMatch;
    use crate::service::{Algorithm, Delivery, EndpointSpec, ServiceSpec};

    fn svc(key: u32, macs: &[(u8, [u8; 6])], delivery: Delivery) -> Arc<Service> {
        let endpoints = macs
            .iter()
            .enumerate()
            .map(|(i, &(port, mac))| EndpointSpec {
                id: u16::try_from(i).unwrap_or(0),
                incarnation: 1,
                weight: 1,
                draining: i == 1,
                addr: Addr::v4([10, 0, 0, 1]),
                port,
                mac,
                delivery,
                counter: 0,
            })
            .collect();
        let spec = ServiceSpec {
            name: format!("s{key}"),
            key,
            algorithm: Algorithm::Maglev,
            flow_table: false,
            limit: 8,
            table_size: 0,
            endpoints,
        };
        Arc::new(Service::build(&spec).unwrap_or_else(|e| panic!("{e}")))
    }

    fn route(service: u32, vips: &[&str]) -> RouteSpec {
        RouteSpec {
            name: format!("r{service}"),
            priority: 0,
            service,
            matches: RouteMatch {
                vips: vips.iter().map(|v| v.parse().unwrap_or_default()).collect(),
                ..RouteMatch::default()
            }.into(),
        }
    }

    #[test]
    fn replacing_services_gives_what_assembling_them_gives() {
        let (a, b, c, d) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb], [2, 0, 0, 0, 0, 0xc], [2, 0, 0, 0, 0, 0xd]);
        let routes = [route(0, &["20.0.0.1"]), route(1, &["20.0.0.1", "2001:db8::1"]), route(2, &["20.0.0.2"]), route(3, &["20.0.0.3"])];
        let before = vec![
            svc(0, &[(1, a)], Delivery::L2),
            svc(1, &[(1, b)], Delivery::L2),
            svc(2, &[(1, c)], Delivery::L2),
            svc(3, &[(1, d)], Delivery::L2),
        ];
        let old = Snapshot::new(1, &routes, before.clone(), vec![PortInfo::default(); 2], None, None);
        let changed = vec![(1, svc(1, &[(1, c), (2, d)], Delivery::L2)), (3, svc(3, &[], Delivery::L2))];
        let mut after = before;
        for (i, s) in &changed {
            after[*i] = Arc::clone(s);
        }
        let whole = Snapshot::with_classifier(2, &routes, Arc::clone(&old.classifier), after, vec![PortInfo::default(); 2], None, None);
        let part = old.with_changed(2, &routes, &changed, vec![PortInfo::default(); 2], None, None);
        assert_eq!(format!("{part:?}"), format!("{whole:?}"));
        let vip = |s: &str| part.classifier.vip_index(s.parse().unwrap_or_default()).unwrap_or(usize::MAX);
        assert!(part.return_allowed(vip("20.0.0.1"), 2, d), "the new endpoint of service 1");
        assert!(!part.return_allowed(vip("20.0.0.1"), 1, b), "its old one");
        assert!(part.return_allowed(vip("20.0.0.2"), 1, c), "unchanged");
        assert!(!part.return_allowed(vip("20.0.0.3"), 1, d), "service 3 has none left");
    }

    /// A change that leaves every VIP's return keys as they were (here a
    /// service whose endpoints come and go behind one next hop, the same
    /// port and MAC) shares them and the keys' index with the snapshot it
    /// was made from; one that changes them does not. Both give what a
    /// whole assembly gives.
    #[test]
    fn a_change_shares_the_return_keys_it_leaves_alone() {
        let (a, b) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
        let routes = [route(0, &["20.0.0.1"]), route(1, &["20.0.0.2", "2001:db8::2"])];
        let ipip = Delivery::IpIp { src: Addr::v4([10, 0, 0, 254]) };
        let before = vec![svc(0, &[(1, a)], ipip), svc(1, &[(1, b), (1, b)], ipip)];
        let old = Snapshot::new(1, &routes, before.clone(), vec![PortInfo::default(); 2], None, None);
        for (fresh, shared) in [(svc(1, &[(1, b)], ipip), true), (svc(1, &[(1, a), (1, b)], ipip), false)] {
            let mut after = before.clone();
            after[1] = Arc::clone(&fresh);
            let whole = Snapshot::with_classifier(2, &routes, Arc::clone(&old.classifier), after, vec![PortInfo::default(); 2], None, None);
            let part = old.with_changed(2, &routes, &[(1, fresh)], vec![PortInfo::default(); 2], None, None);
            assert_eq!(format!("{part:?}"), format!("{whole:?}"));
            assert_eq!(Arc::ptr_eq(&part.return_keys, &old.return_keys), shared);
            assert_eq!(Arc::ptr_eq(&part.return_spans, &old.return_spans), shared);
            assert!(Arc::ptr_eq(&part.by_key, &old.by_key), "no key changed");
        }
    }

    /// 200 services (four chunks, the last one short): replacing one gives
    /// the services a whole assembly gives, copies only its chunk, and
    /// leaves the snapshot it was made from as it was.
    #[test]
    fn a_change_shares_every_chunk_but_its_own() {
        let n = 200u32;
        let routes: Vec<RouteSpec> = (0..n).map(|i| route(i, &[&format!("20.0.{}.{}", i / 250, i % 250 + 1)])).collect();
        let before: Vec<Arc<Service>> = (0..n).map(|i| svc(i, &[(1, [2, 0, 0, 0, 0, 1])], Delivery::L2)).collect();
        let old = Snapshot::new(1, &routes, before.clone(), vec![PortInfo::default(); 2], None, None);
        assert_eq!(old.services.len(), 200);
        assert_eq!(old.services.chunks().len(), 4);
        let fresh = svc(130, &[(1, [2, 0, 0, 0, 0, 2])], Delivery::L2);
        let new = old.with_changed(2, &routes, &[(130, Arc::clone(&fresh))], vec![PortInfo::default(); 2], None, None);
        for c in [0, 1, 3] {
            assert!(Arc::ptr_eq(&old.services.chunks()[c], &new.services.chunks()[c]), "chunk {c} is shared");
        }
        assert!(!Arc::ptr_eq(&old.services.chunks()[2], &new.services.chunks()[2]), "the changed service's chunk is a copy");
        assert!(Arc::ptr_eq(&new.services[130], &fresh));
        assert!(Arc::ptr_eq(&old.services[130], &before[130]), "the old snapshot is unchanged");
        let mut after = before.clone();
        after[130] = fresh;
        for (i, (a, b)) in new.services.iter().zip(&after).enumerate() {
            assert!(Arc::ptr_eq(a, b), "service {i}");
        }
        assert_eq!(new.services.iter().count(), 200);
        assert!(new.services.get(200).is_none());
        assert!(Services::default().is_empty() && Services::default().get(0).is_none());
        // Keys are in index order: searching by key finds what a slice search finds.
        for key in [0, 63, 64, 199, 250] {
            let want = after.binary_search_by(|s| s.key.cmp(&key)).map_err(|_| ());
            assert_eq!(new.services.binary_search_by(|s| s.key.cmp(&key)).map_err(|_| ()), want, "key {key}");
        }
        assert_eq!(new.services.binary_search_by(|s| s.key.cmp(&250)), Err(200));
    }

    #[test]
    fn return_traffic_is_allowed_from_the_endpoints_of_the_vips_services_only() {
        let (a, b, hop, c) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb], [2, 0, 0, 0, 0, 0x7], [2, 0, 0, 0, 0, 0xc]);
        let ipip = Delivery::IpIp { src: Addr::v4([192, 0, 2, 1]) };
        let snap = Snapshot::new(
            1,
            &[route(0, &["20.0.0.1"]), route(1, &["20.0.0.1", "2001:db8::1"]), route(2, &["20.0.0.2"])],
            vec![svc(0, &[(1, a), (1, b)], Delivery::L2), svc(1, &[(2, hop)], ipip), svc(2, &[(1, c)], Delivery::L2)],
            vec![PortInfo::default(); 3],
            None,
            None,
        );
        let vip = |s: &str| snap.classifier.vip_index(s.parse().unwrap_or_default()).unwrap_or(usize::MAX);
        let v1 = vip("20.0.0.1");
        assert!(snap.return_allowed(v1, 1, a));
        assert!(snap.return_allowed(v1, 1, b), "draining endpoints still answer their flows");
        assert!(snap.return_allowed(v1, 2, hop), "a routed reply comes from the tunnel's next hop");
        assert!(!snap.return_allowed(v1, 2, a), "right MAC, wrong port");
        assert!(!snap.return_allowed(v1, 1, c), "endpoint of another VIP's service");
        assert!(snap.return_allowed(vip("2001:db8::1"), 2, hop));
        assert!(!snap.return_allowed(vip("2001:db8::1"), 1, a));
        assert!(snap.return_allowed(vip("20.0.0.2"), 1, c));
        assert!(!snap.return_allowed(usize::MAX, 1, c));
    }
}
