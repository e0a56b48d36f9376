//! `/status`: what the appliance does, as one JSON document (rendered as
//! tables by `sluice status`).

use std::time::Instant;

use serde::Serialize;
use sluice_admin_api as api;
use sluice_dataplane::verdict::DropReason;

use super::state::{ControlState, Shared};
use super::{api as convert, health};
use crate::ground::lock;

/// Endpoints `/status` lists unless asked for more (`?endpoints=all`):
/// 100,000 of them make a 30 MB document that `sluice status` would print
/// as 100,000 rows.
pub(super) const ENDPOINTS_LISTED: usize = 1000;

/// What `/status` lists: every service or one (`?service=NAME`), and up to
/// how many endpoints (`?endpoints=N`, `all`; [`ENDPOINTS_LISTED`] unless
/// said).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct StatusQuery {
    /// Only this service, its routes and its endpoints.
    pub(crate) service: Option<String>,
    /// Most endpoints listed; `None` lists all.
    pub(crate) endpoints: Option<usize>,
}

impl Default for StatusQuery {
    fn default() -> Self {
        StatusQuery { service: None, endpoints: Some(ENDPOINTS_LISTED) }
    }
}

/// Why a `/status` query string is refused; each message says what is
/// accepted instead.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum StatusQueryError {
    /// `service=` without a name.
    #[error("service is a service's name")]
    EmptyService,
    /// `endpoints=` with this value, neither a number nor `all`.
    #[error("endpoints is a number or all, not {0:?}")]
    BadEndpoints(String),
    /// A parameter `/status` does not take.
    #[error("unknown parameter {0:?}: /status takes service=NAME and endpoints=N|all")]
    UnknownParameter(String),
}

impl StatusQuery {
    /// From the query string's parameters; an unknown one or a bad value
    /// is an error that says what is accepted.
    pub(super) fn from_params<'a>(params: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<StatusQuery, StatusQueryError> {
        let mut q = StatusQuery::default();
        for (k, v) in params {
            match k {
                "service" if !v.is_empty() => q.service = Some(v.to_owned()),
                "service" => return Err(StatusQueryError::EmptyService),
                "endpoints" if v == "all" => q.endpoints = None,
                "endpoints" => q.endpoints = Some(v.parse().map_err(|_| StatusQueryError::BadEndpoints(v.to_owned()))?),
                other => return Err(StatusQueryError::UnknownParameter(other.to_owned())),
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
            convert::service(m, packets, bytes)
        }))
    }
}

impl Serialize for EndpointsOf<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let Listing { sh, st, query } = self.0;
        let listed = st.all_endpoints().filter(|e| query.shows(&e.service)).take(query.endpoints.unwrap_or(usize::MAX));
        s.collect_seq(listed.map(|e| {
            let (packets, bytes) = sh.endpoint_count(st, e.counter);
            let port = e.port.and_then(|i| sh.ports.get(usize::from(i))).map(|p| p.meta.name.as_str());
            convert::endpoint(e, port, packets, bytes)
        }))
    }
}

/// The `/status` document as the server writes it: services and endpoints
/// written as they are read.
type StatusView<'a> = api::Status<ServicesOf<'a>, Vec<api::Route<'a>>, EndpointsOf<'a>>;

/// The service asked for is not served.
#[derive(Debug)]
pub(super) struct NoService(pub String);

/// Each worker's counters and recent load, as `/status` shows them.
fn worker_views(sh: &Shared) -> Vec<api::Worker> {
    let live = lock(&sh.liveness).clone();
    #[allow(clippy::cast_precision_loss)] // rates and shares
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    sh
        .workers
        .iter()
        .zip(&live)
        .map(|(w, l)| {
            let c = &w.counters;
            api::Worker {
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
        .collect()
}

/// The `/status` document, listing what `query` asks for.
pub(super) fn status(sh: &Shared, query: &StatusQuery) -> Result<String, NoService> {
    let now = Instant::now();
    let not_healthy = health::unhealthy(sh, now);
    let not_ready = health::unready(sh, now);
    let drops = DropReason::ALL
        .iter()
        .map(|r| (r.name().to_owned(), sh.workers.iter().map(|w| w.counters.drops[r.index()].get()).sum::<u64>()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let ports = sh.ports.iter().map(convert::port).collect();
    let totals = super::window::Totals::read(sh);
    let last_minute = Some(lock(&sh.window).last_minute(now, &totals));
    let workers = worker_views(sh);
    let xds = sh.xds().map(convert::xds);
    let bird = sh.bird().map(convert::bird);
    let kubernetes = sh.kube().map(convert::kubernetes);
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
        health: sh.health(),
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
        sources: st.sources.iter().map(|(name, s)| (name.clone(), convert::source(s))).collect(),
        last_minute,
        mbufs_in_use: sh.pool.in_use(),
        mbufs: sh.pool.capacity(),
        ports,
        workers,
        drops,
        services: ServicesOf(Listing { sh, st: &st, query }),
        routes: st.routes.iter().filter(|r| query.shows(&r.service)).map(convert::route).collect(),
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
    use crate::admin::state::{IdlePool, PortLoss, ServiceMeta, WorkerEntry};
    use crate::compile::{EndpointState, EndpointStatus};
    use crate::reconcile::{RouteMeta, SourceStatus};

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
            kernel_settings_restored: std::sync::atomic::AtomicU64::new(0),
            exception_dropped: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Service "web" with an endpoint that is ready through port 0 and one
    /// that is unreachable.
    fn serve_web(sh: &Shared) {
        let mut st = sh.control();
        st.services.push(ServiceMeta {
            name: "web".into(),
            slot: 0,
            algorithm: "maglev",
            flow_table: false,
            limit: 32,
            table_size: 6421,
            ready: true,
            check: None,
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

    #[test]
    fn status_lists_services_and_endpoints_as_their_own_fields() {
        // An endpoint names its output port by index: status shows its name.
        let sh = Shared::new("c.yaml".into(), vec![port("p0")], Arc::new(IdlePool), Vec::<WorkerEntry>::new(), 1);
        serve_web(&sh);
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

    #[test]
    fn the_status_document_reads_back_whole_into_the_api_type() {
        use crate::routing::bird::{BirdStatus, SessionStatus, VipState};
        let worker = WorkerEntry { lcore: 3, counters: Arc::new(sluice_dataplane::counters::WorkerCounters::new(1, 2)), latency: None };
        let sh = Shared::new("c.yaml".into(), vec![port("p0")], Arc::new(IdlePool), vec![worker], 1000);
        serve_web(&sh);
        {
            let mut st = sh.control();
            Arc::make_mut(&mut st.routes).push(RouteMeta { name: "r".into(), service: "web".into(), priority: 2, vips: vec!["20.0.0.1".parse().unwrap()] });
            let source = SourceStatus { trigger: "SIGHUP".into(), problems: vec!["bad port".into()], rebuilt: vec!["web".into()], rebuilt_count: 1, ..Default::default() };
            st.sources.insert("file".into(), source);
        }
        *lock(&sh.ports[0].loss) = PortLoss { below_dpdk: 3, source: "imissed".into(), exact: false };
        let c = &sh.workers[0].counters;
        c.rx_packets.add(10);
        c.busy_polls.add(4);
        c.busy_cycles.add(250);
        c.drops[DropReason::ALL[0].index()].add(1);
        let bird = BirdStatus {
            pid: Some(7),
            sessions: vec![SessionStatus { bfd: true, ..Default::default() }],
            vips: vec![VipState { vip: "20.0.0.1".parse().unwrap(), announced: false, reason: "withdrawn".into(), since: 5 }],
            ..Default::default()
        };
        let (_tx, rx) = tokio::sync::watch::channel(Some(bird));
        sh.bird.set(rx).unwrap();

        let text = status(&sh, &StatusQuery::default()).unwrap();
        let written: serde_json::Value = serde_json::from_str(&text).unwrap();
        let doc: api::Status = serde_json::from_str(&text).unwrap();
        assert_eq!(serde_json::to_value(&doc).unwrap(), written, "the API type holds every field of the document");
        // The values are where the reader looks for them.
        assert_eq!((doc.endpoints[0].mac, doc.endpoints[0].port.as_deref()), (Some(api::Mac([2, 0, 0, 0, 0, 0x0a])), Some("p0")));
        assert_eq!((doc.endpoints[1].state, doc.endpoints[1].reason.as_deref()), (api::EndpointState::Unreachable, Some("no route")));
        assert_eq!((doc.workers[0].lcore, doc.workers[0].rx_packets, doc.workers[0].packets_per_busy_poll), (3, 10, 2.5));
        assert_eq!(doc.drops, vec![(DropReason::ALL[0].name().to_owned(), 1)]);
        assert_eq!((doc.ports[0].lost_below_dpdk.below_dpdk, doc.ports[0].link_up), (3, None));
        assert_eq!((doc.routes[0].priority, &doc.sources["file"].problems), (2, &vec!["bad port".to_owned()]));
        assert_eq!(doc.bird.map(|b| (b.pid, b.sessions.len(), b.vips[0].since)), Some((Some(7), 1, 5)));
        assert!(doc.xds.is_none() && doc.kubernetes.is_none());
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
                    check: None,
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
        let err = |p: &[(&str, &str)]| StatusQuery::from_params(p.iter().copied()).unwrap_err().to_string();
        assert_eq!(err(&[("endpoints", "many")]), "endpoints is a number or all, not \"many\"");
        assert_eq!(err(&[("endpoints", "-1")]), "endpoints is a number or all, not \"-1\"");
        assert!(err(&[("service", "")]).contains("service's name"));
        assert!(err(&[("verbose", "1")]).contains("unknown parameter \"verbose\""));
    }
}
