//! Test fixtures shared by the control side's unit tests: an endpoint and
//! a snapshot of one service, as the compiler would make them.

use std::sync::Arc;

use sluice_dataplane::addr::Addr;
use sluice_dataplane::service::{Algorithm, Delivery, EndpointSpec, Service, ServiceSpec};
use sluice_dataplane::snapshot::{PortInfo, Snapshot};

/// Endpoint `id` of `incarnation` at `addr`, weight 1, delivered at layer 2,
/// counted under its identifier.
pub(crate) fn endpoint(id: u16, incarnation: u32, addr: impl Into<Addr>) -> EndpointSpec {
    EndpointSpec {
        id,
        incarnation,
        weight: 1,
        draining: false,
        addr: addr.into(),
        port: 0,
        mac: [2, 0, 0, 0, 0, 1],
        delivery: Delivery::L2,
        counter: u32::from(id),
    }
}

/// The spec of service "web" of `key`, by `algorithm`, with a flow table
/// or not, at most 16 endpoints, its table of the default size.
pub(crate) fn web(key: u32, algorithm: Algorithm, flow_table: bool, endpoints: Vec<EndpointSpec>) -> ServiceSpec {
    ServiceSpec { name: "web".into(), key, algorithm, flow_table, limit: 16, table_size: 0, endpoints }
}

/// A snapshot (generation 1, one port, no route) of the one service `spec`.
pub(crate) fn one_service(spec: &ServiceSpec) -> Snapshot {
    Snapshot::new(1, &[], vec![Arc::new(Service::build(spec).unwrap())], vec![PortInfo::default()], None, None)
}
