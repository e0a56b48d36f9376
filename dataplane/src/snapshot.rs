//! The snapshot: one immutable structure with everything a worker needs
//! to forward (routes, services, ports, gateways), published by the control
//! thread through [`crate::rcu`] and read by workers once per burst.

use std::sync::Arc;

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
}

/// A next hop on a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// Output port index.
    pub port: u8,
    /// Its MAC.
    pub mac: [u8; 6],
}

/// Everything workers read.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Increases with every publication.
    pub generation: u64,
    /// Routes.
    pub classifier: Classifier,
    /// Services, indexed by [`RouteSpec::service`].
    pub services: Vec<Arc<Service>>,
    /// Ports, by index.
    pub ports: Vec<PortInfo>,
    /// Where IPv4 return traffic (from a VIP) goes.
    pub gateway_v4: Option<NextHop>,
    /// Where IPv6 return traffic goes.
    pub gateway_v6: Option<NextHop>,
    /// Services by stable key, sorted: (key, index).
    by_key: Vec<(u32, u32)>,
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
        let mut by_key: Vec<(u32, u32)> = services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.key, u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        by_key.sort_unstable();
        Snapshot {
            generation,
            classifier: Classifier::build(routes),
            services,
            ports,
            gateway_v4,
            gateway_v6,
            by_key,
        }
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
            + self.by_key.capacity() * 8
    }
}
