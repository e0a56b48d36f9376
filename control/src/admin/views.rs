//! `/status`: what the appliance does, as one JSON document (rendered as
//! tables by `sluice status`).

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;
use sluice_dataplane::verdict::DropReason;

use super::health;
use crate::ground::lock;
use super::state::{ControlState, PortLoss, PortMeta, RouteMeta, ServiceMeta, Shared, SourceStatus};
use sluice_dataplane::addr::Addr;
use crate::compile::EndpointState;

#[derive(Serialize)]
struct WorkerView {
    lcore: u32,
    rx_packets: u64,
    tx_packets: u64,
    balanced: u64,
    returned: u64,
    exception: u64,
    drops: u64,
    busy_polls: u64,
    idle_polls: u64,
    busy_seconds: f64,
    idle_seconds: f64,
    busy_percent_recent: f64,
    packets_per_busy_poll: f64,
    icmp_too_big: u64,
    fragmented: u64,
    fragments: u64,
    steered_out: u64,
    steered_in: u64,
    generation: u64,
}

/// A value written with its `Display` form (no `String` made for it).
struct Shown<T>(T);

impl<T: std::fmt::Display> Serialize for Shown<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

#[derive(Serialize)]
struct EndpointView<'a> {
    service: &'a str,
    id: u32,
    address: Shown<Addr>,
    weight: u32,
    mac: Option<Shown<sluice_ffi::MacAddr>>,
    port: Option<&'a str>,
    state: &'static str,
    reason: Option<&'a str>,
    packets: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct ServiceView<'a> {
    #[serde(flatten)]
    meta: &'a ServiceMeta,
    packets: u64,
    bytes: u64,
}

/// Endpoints `/status` lists unless asked for more (`?endpoints=all`):
/// 100,000 of them make a 30 MB document that `sluice status` would print
/// as 100,000 rows.
pub const ENDPOINTS_LISTED: usize = 1000;

/// What `/status` lists: every service or one (`?service=NAME`), and up to
/// how many endpoints (`?endpoints=N`, `all`; [`ENDPOINTS_LISTED`] unless
/// said).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusQuery {
    /// Only this service, its routes and its endpoints.
    pub service: Option<String>,
    /// Most endpoints listed; `None` lists all.
    pub endpoints: Option<usize>,
}

impl Default for StatusQuery {
    fn default() -> Self {
        StatusQuery { service: None, endpoints: Some(ENDPOINTS_LISTED) }
    }
}

impl StatusQuery {
    /// From the query string's parameters; an unknown one or a bad value
    /// is an error that says what is accepted.
    pub fn from_params<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<StatusQuery, String> {
        let mut q = StatusQuery::default();
        for (k, v) in params {
            match k {
                "service" if !v.is_empty() => q.service = Some(v.to_owned()),
                "service" => return Err("service is a service's name".into()),
                "endpoints" if v == "all" => q.endpoints = None,
                "endpoints" => q.endpoints = Some(v.parse().map_err(|_| format!("endpoints is a number or all, not {v:?}"))?),
                other => return Err(format!("unknown parameter {other:?}: /status takes service=NAME and endpoints=N|all")),
            }
        }
        Ok(q)
    }

    fn shows(&self, service: &str) -> bool {
        self.service.as_deref().is_none_or(|s| s == service)
    }
}

/// The services, endpoints and routes of the status, written as they are
/// read from the control state: with 10,000 services of 10 endpoints, a
/// view of each made first would be 20 MB and 500,000 allocations per
/// request.
#[derive(Clone, Copy)]
struct Listing<'a> {
    sh: &'a Shared,
    st: &'a ControlState,
    query: &'a StatusQuery,
}

struct ServicesOf<'a>(Listing<'a>);
struct EndpointsOf<'a>(Listing<'a>);

impl Serialize for ServicesOf<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Listing { sh, st, query } = self.0;
        s.collect_seq(st.services.iter().filter(|m| query.shows(&m.name)).map(|m| {
            let (packets, bytes) = sh.service_count(st, m.slot);
            ServiceView { meta: m, packets, bytes }
        }))
    }
}

impl Serialize for EndpointsOf<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Listing { sh, st, query } = self.0;
        let listed = st.all_endpoints().filter(|e| query.shows(&e.service)).take(query.endpoints.unwrap_or(usize::MAX));
        s.collect_seq(listed.map(|e| {
            let (packets, bytes) = sh.endpoint_count(st, e.counter);
            EndpointView {
                service: &e.service,
                id: e.id,
                address: Shown(e.address),
                weight: e.weight,
                mac: e.mac.map(|m| Shown(sluice_ffi::MacAddr(m))),
                port: e.port.and_then(|i| sh.ports.get(usize::from(i))).map(|p| p.meta.name.as_str()),
                state: e.state.name(),
                reason: match &e.state {
                    EndpointState::Unreachable(r) => Some(r.as_str()),
                    _ => None,
                },
                packets,
                bytes,
            }
        }))
    }
}


#[derive(Serialize)]
struct PortView {
    #[serde(flatten)]
    meta: PortMeta,
    link_up: Option<bool>,
    rx_packets: u64,
    tx_packets: u64,
    rx_missed: u64,
    rx_nombuf: u64,
    lost_below_dpdk: PortLoss,
    kernel_rx_packets: u64,
    kernel_tx_packets: u64,
}

#[derive(Serialize)]
struct StatusView<'a> {
    version: String,
    dpdk: String,
    config: String,
    uptime_seconds: f64,
    healthy: bool,
    ready: bool,
    not_healthy: Vec<String>,
    not_ready: Vec<String>,
    generation: u64,
    publish_seconds: f64,
    snapshots_pending: usize,
    next_hops_unresolved: usize,
    sources: BTreeMap<String, SourceStatus>,
    xds: Option<crate::sources::xds::XdsStatus>,
    bird: Option<crate::routing::bird::BirdStatus>,
    kubernetes: Option<crate::sources::kube::KubeStatus>,
    sync: Option<crate::sync::SyncStatus>,
    mbufs_in_use: u32,
    mbufs: u32,
    ports: Vec<PortView>,
    workers: Vec<WorkerView>,
    drops: Vec<(String, u64)>,
    services: ServicesOf<'a>,
    routes: Vec<&'a RouteMeta>,
    /// Endpoints in the document (see [`StatusQuery`]).
    endpoints: EndpointsOf<'a>,
    /// Endpoints there are (of the service asked for, or in all).
    endpoints_total: usize,
    /// Endpoints left out of the list (`?endpoints=all` lists them).
    endpoints_omitted: usize,
}

/// The service asked for is not served.
#[derive(Debug)]
pub struct NoService(pub String);

/// The `/status` document, listing what `query` asks for.
pub fn status(sh: &Shared, query: &StatusQuery) -> Result<String, NoService> {
    let now = Instant::now();
    let not_healthy = health::unhealthy(sh, now);
    let not_ready = health::unready(sh, now);
    let drops = DropReason::ALL
        .iter()
        .map(|r| (r.name().to_owned(), sh.workers.iter().map(|w| w.counters.drops[r.index()].get()).sum::<u64>()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let ports = sh
        .ports
        .iter()
        .map(|p| {
            let s = p.port.stats().unwrap_or_default();
            let k = p.tap.as_ref().and_then(|t| t.stats()).unwrap_or_default();
            PortView {
                meta: p.meta.clone(),
                link_up: p.port.link_up(),
                rx_packets: s.ipackets,
                tx_packets: s.opackets,
                rx_missed: s.imissed,
                rx_nombuf: s.rx_nombuf,
                lost_below_dpdk: lock(&p.loss).clone(),
                kernel_rx_packets: k.ipackets,
                kernel_tx_packets: k.opackets,
            }
        })
        .collect();
    let live = lock(&sh.liveness).clone();
    #[allow(clippy::cast_precision_loss)] // rates and shares
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let workers = sh
        .workers
        .iter()
        .zip(&live)
        .map(|(w, l)| {
            let c = &w.counters;
            WorkerView {
                busy_seconds: ratio(c.busy_cycles.get(), sh.cycles_hz),
                idle_seconds: ratio(c.idle_cycles.get(), sh.cycles_hz),
                busy_percent_recent: 100.0 * l.busy_share,
                packets_per_busy_poll: ratio(c.rx_packets.get() + c.steered_in.get(), c.busy_polls.get()),
                icmp_too_big: c.icmp_too_big.get(),
                fragmented: c.fragmented.get(),
                fragments: c.fragments.get(),
                steered_out: c.steered_out.get(),
                steered_in: c.steered_in.get(),
                lcore: w.lcore,
                rx_packets: c.rx_packets.get(),
                tx_packets: c.tx_packets.get(),
                balanced: c.balanced.get(),
                returned: c.returned.get(),
                exception: c.exception.get(),
                drops: c.total_drops(),
                busy_polls: c.busy_polls.get(),
                idle_polls: c.idle_polls.get(),
                generation: c.generation.get(),
            }
        })
        .collect();
    let xds = sh.xds();
    let bird = sh.bird();
    let kubernetes = sh.kube();
    let st = sh.control();
    if let Some(name) = &query.service {
        if !st.services.iter().any(|m| &m.name == name) {
            return Err(NoService(name.clone()));
        }
    }
    let endpoints_total = match &query.service {
        None => st.endpoints.iter().map(|s| s.len()).sum(),
        Some(_) => st.all_endpoints().filter(|e| query.shows(&e.service)).count(),
    };
    let endpoints_omitted = endpoints_total.saturating_sub(query.endpoints.unwrap_or(usize::MAX));
    let view = StatusView {
        xds,
        bird,
        kubernetes,
        sync: sh.sync(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        dpdk: sluice_ffi::dpdk_version(),
        config: sh.config_path.clone(),
        uptime_seconds: sh.started.elapsed().as_secs_f64(),
        healthy: not_healthy.is_empty(),
        ready: not_ready.is_empty(),
        not_healthy,
        not_ready,
        generation: st.generation,
        publish_seconds: st.publish_seconds,
        snapshots_pending: st.snapshots_pending,
        next_hops_unresolved: st.unresolved,
        sources: st.sources.clone(),
        mbufs_in_use: sh.pool.in_use(),
        mbufs: sh.pool.capacity(),
        ports,
        workers,
        drops,
        services: ServicesOf(Listing { sh, st: &st, query }),
        routes: st.routes.iter().filter(|r| query.shows(&r.service)).collect(),
        endpoints: EndpointsOf(Listing { sh, st: &st, query }),
        endpoints_total,
        endpoints_omitted,
    };
    Ok(serde_json::to_string_pretty(&view).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::admin::state::{IdlePool, WorkerEntry};
    use crate::compile::EndpointStatus;

    /// A port that answers no probe.
    #[derive(Debug)]
    struct Silent;

    impl crate::admin::state::PortProbe for Silent {
        fn stats(&self) -> Option<crate::admin::state::PortStats> {
            None
        }
        fn link_up(&self) -> Option<bool> {
            None
        }
        fn xstats(&self) -> Vec<(String, u64)> {
            Vec::new()
        }
    }

    fn port(name: &str) -> crate::admin::state::PortEntry {
        crate::admin::state::PortEntry {
            meta: crate::admin::state::PortMeta {
                name: name.into(),
                device: "net_null0".into(),
                driver: "net_null".into(),
                kernel_interface: String::new(),
                mac: "02:00:00:00:00:01".into(),
                mtu: 1500,
            },
            port: Arc::new(Silent),
            tap: None,
            loss: std::sync::Mutex::default(),
        }
    }

    #[test]
    fn status_lists_services_and_endpoints_as_their_own_fields() {
        // An endpoint names its output port by index: status shows its name.
        let sh = Shared::new("c.yaml".into(), vec![port("p0")], Arc::new(IdlePool), Vec::<WorkerEntry>::new(), 1);
        {
            let mut st = sh.control();
            st.services.push(ServiceMeta {
                name: "web".into(),
                slot: 0,
                algorithm: "maglev",
                flow_table: false,
                limit: 32,
                table_size: 6421,
                ready: true,
            });
            let ep = |id: u32, addr: &str, state: EndpointState| EndpointStatus {
                service: Arc::new("web".to_owned()),
                id,
                address: addr.parse().unwrap(),
                weight: 2,
                mac: (state == EndpointState::Ready).then_some([2, 0, 0, 0, 0, 0x0a]),
                port: (state == EndpointState::Ready).then_some(0),
                state,
                counter: id,
                hop: None,
            };
            st.endpoints = vec![Arc::from(vec![
                ep(0, "10.0.0.5", EndpointState::Ready),
                ep(1, "2001:db8::6", EndpointState::Unreachable(Arc::new("no route".into()))),
            ])]
            .into();
        }
        let v: serde_json::Value = serde_json::from_str(&status(&sh, &StatusQuery::default()).unwrap()).unwrap();
        assert_eq!(
            v["services"],
            serde_json::json!([{"name": "web", "algorithm": "maglev", "flow_table": false, "limit": 32, "table_size": 6421,
                "ready": true, "packets": 0, "bytes": 0}])
        );
        assert_eq!(
            v["endpoints"],
            serde_json::json!([
                {"service": "web", "id": 0, "address": "10.0.0.5", "weight": 2, "mac": "02:00:00:00:00:0a", "port": "p0",
                    "state": "ready", "reason": null, "packets": 0, "bytes": 0},
                {"service": "web", "id": 1, "address": "2001:db8::6", "weight": 2, "mac": null, "port": null,
                    "state": "unreachable", "reason": "no route", "packets": 0, "bytes": 0},
            ])
        );
    }

    /// `n` services of `per` endpoints each, "s0".."s{n-1}", with a route each.
    fn shared_with(n: usize, per: u32) -> Shared {
        let sh = Shared::new("c.yaml".into(), Vec::new(), Arc::new(IdlePool), Vec::<WorkerEntry>::new(), 1);
        {
            let mut st = sh.control();
            let mut eps = Vec::new();
            for i in 0..n {
                let name = format!("s{i}");
                st.services.push(ServiceMeta {
                    name: name.clone(),
                    slot: u32::try_from(i).unwrap(),
                    algorithm: "maglev",
                    flow_table: false,
                    limit: 32,
                    table_size: 6421,
                    ready: true,
                });
                Arc::make_mut(&mut st.routes).push(RouteMeta { name: format!("r{i}"), service: name.clone(), priority: 0, vips: vec![format!("10.9.0.{i}").parse().unwrap()] });
                let service = Arc::new(name);
                let list: Vec<EndpointStatus> = (0..per)
                    .map(|id| EndpointStatus {
                        service: Arc::clone(&service),
                        id,
                        address: format!("10.0.{i}.{id}").parse().unwrap(),
                        weight: 1,
                        mac: None,
                        port: None,
                        state: EndpointState::Ready,
                        counter: id,
                        hop: None,
                    })
                    .collect();
                eps.push(Arc::from(list));
            }
            st.endpoints = eps.into();
        }
        sh
    }

    fn doc(sh: &Shared, params: &[(&str, &str)]) -> serde_json::Value {
        let q = StatusQuery::from_params(params.iter().copied()).unwrap();
        serde_json::from_str(&status(sh, &q).unwrap()).unwrap()
    }

    #[test]
    fn status_lists_a_thousand_endpoints_unless_asked_and_says_how_many_it_left_out() {
        // 120 services x 10: 1,200 endpoints.
        let sh = shared_with(120, 10);
        let v = doc(&sh, &[]);
        assert_eq!(v["endpoints"].as_array().unwrap().len(), ENDPOINTS_LISTED);
        assert_eq!((v["endpoints_total"].as_u64(), v["endpoints_omitted"].as_u64()), (Some(1200), Some(200)));
        assert_eq!(v["services"].as_array().unwrap().len(), 120, "every service is listed");
        let v = doc(&sh, &[("endpoints", "all")]);
        assert_eq!(v["endpoints"].as_array().unwrap().len(), 1200);
        assert_eq!(v["endpoints_omitted"], 0);
        let v = doc(&sh, &[("endpoints", "5")]);
        assert_eq!(v["endpoints"].as_array().unwrap().len(), 5);
        assert_eq!(v["endpoints_omitted"], 1195);
    }

    #[test]
    fn status_of_one_service_lists_its_routes_and_endpoints_only() {
        let sh = shared_with(120, 10);
        let v = doc(&sh, &[("service", "s117")]);
        let names = |k: &str, f: &str| v[k].as_array().unwrap().iter().map(|x| x[f].as_str().unwrap().to_owned()).collect::<Vec<_>>();
        assert_eq!(names("services", "name"), ["s117"]);
        assert_eq!(names("routes", "name"), ["r117"]);
        assert_eq!(names("endpoints", "service"), vec!["s117"; 10]);
        assert_eq!(v["endpoints"][3]["address"], "10.0.117.3");
        assert_eq!((v["endpoints_total"].as_u64(), v["endpoints_omitted"].as_u64()), (Some(10), Some(0)));
        let Err(NoService(name)) = status(&sh, &StatusQuery { service: Some("nope".into()), endpoints: None }) else { panic!("an unknown service") };
        assert_eq!(name, "nope");
    }

    #[test]
    fn status_parameters_are_checked() {
        assert_eq!(StatusQuery::from_params([]), Ok(StatusQuery::default()));
        assert_eq!(
            StatusQuery::from_params([("service", "web"), ("endpoints", "all")]),
            Ok(StatusQuery { service: Some("web".into()), endpoints: None })
        );
        let err = |p: &[(&str, &str)]| StatusQuery::from_params(p.iter().copied()).unwrap_err();
        assert_eq!(err(&[("endpoints", "many")]), "endpoints is a number or all, not \"many\"");
        assert_eq!(err(&[("endpoints", "-1")]), "endpoints is a number or all, not \"-1\"");
        assert!(err(&[("service", "")]).contains("service's name"));
        assert!(err(&[("verbose", "1")]).contains("unknown parameter \"verbose\""));
    }
}
