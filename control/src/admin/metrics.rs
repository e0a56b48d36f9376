//! `/metrics`: a Prometheus collector that reads the workers' counters,
//! the ports' statistics and the reconciler's record at scrape time.
//!
//! Counters are exposed without copying them into a registry: each scrape
//! encodes what the workers have counted so far (OpenMetrics text).

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::verdict::DropReason;

use super::{health, AdminCounters};
use super::state::{PortStats, Shared};
use crate::ground::lock;
use crate::compile::EndpointStatus;

type Labels = Vec<(&'static str, Cow<'static, str>)>;

/// Reads everything at scrape time.
pub(super) struct SluiceCollector {
    shared: Arc<Shared>,
    admin: Arc<AdminCounters>,
}

impl fmt::Debug for SluiceCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SluiceCollector").finish_non_exhaustive()
    }
}

/// A registry with the collector.
pub(super) fn registry(shared: Arc<Shared>, admin: Arc<AdminCounters>) -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(SluiceCollector { shared, admin }));
    r
}

/// The text exposition of `r`.
pub(super) fn render(r: &Registry) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut s, r);
    s
}

/// How a metric family's values are typed.
enum Kind {
    Counter,
    Gauge,
}

/// A value: whole numbers stay whole in the exposition.
#[derive(Clone, Copy)]
enum V {
    U(u64),
    F(f64),
}

/// Writes one metric family: `rows` of (labels, value).
fn family(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    kind: Kind,
    rows: impl IntoIterator<Item = (Labels, V)>,
) -> fmt::Result {
    let t = match kind {
        Kind::Counter => ConstCounter::<u64>::default().metric_type(),
        Kind::Gauge => ConstGauge::<u64>::new(0).metric_type(),
    };
    let mut m = enc.encode_descriptor(name, help, None, t)?;
    for (labels, v) in rows {
        let e = m.encode_family(&labels)?;
        match (&kind, v) {
            (Kind::Counter, V::U(x)) => ConstCounter::new(x).encode(e)?,
            (Kind::Counter, V::F(x)) => ConstCounter::new(x).encode(e)?,
            (Kind::Gauge, V::U(x)) => ConstGauge::new(x).encode(e)?,
            (Kind::Gauge, V::F(x)) => ConstGauge::new(x).encode(e)?,
        }
    }
    Ok(())
}

fn one(v: V) -> Vec<(Labels, V)> {
    vec![(Vec::new(), v)]
}

fn s(v: impl Into<Cow<'static, str>>) -> Cow<'static, str> {
    v.into()
}

fn f(v: u64) -> V {
    V::U(v)
}

/// A metric read from a worker's counters: (name, help, reader).
type WorkerMetric = (&'static str, &'static str, fn(&WorkerCounters) -> u64);
/// A metric read from a port's statistics.
type PortMetric = (&'static str, &'static str, fn(&PortStats) -> u64);

const WORKER_COUNTERS: [WorkerMetric; 24] = [
    ("rx_packets", "Packets received from ports.", |w| w.rx_packets.get()),
    ("rx_bytes", "Bytes received from ports.", |w| w.rx_bytes.get()),
    ("tx_packets", "Packets sent.", |w| w.tx_packets.get()),
    ("balanced_packets", "Packets load-balanced to an endpoint.", |w| w.balanced.get()),
    ("returned_packets", "Return traffic sent to the gateway.", |w| w.returned.get()),
    ("exception_packets", "Packets handed to the kernel.", |w| w.exception.get()),
    ("from_kernel_packets", "Packets the kernel sent out of a port.", |w| w.from_kernel.get()),
    ("held_fragments", "Later IP fragments held for their first fragment.", |w| w.stashed.get()),
    ("busy_polls", "Poll rounds that received packets.", |w| w.busy_polls.get()),
    ("idle_polls", "Poll rounds that received nothing.", |w| w.idle_polls.get()),
    ("idle_pauses", "Pauses after poll rounds that received nothing (sleeps, or waits on receive interrupts: interrupt_waits); 0 with dpdk.busyPoll.", |w| w.idle_pauses.get()),
    ("interrupt_waits", "Idle pauses spent waiting on the ports' receive interrupts instead of asleep (dpdk.rxInterrupts).", |w| w.interrupt_waits.get()),
    ("interrupt_wakeups", "Interrupt waits that a receive interrupt ended early: traffic woke the worker.", |w| w.interrupt_wakeups.get()),
    ("flow_evictions", "Live flow-table entries evicted to make room.", |w| w.flow_evictions.get()),
    ("icmp_too_big", "ICMP fragmentation-needed / packet-too-big errors sent to the sources of packets that do not fit their output (a tunnel, or a port's MTU).", |w| w.icmp_too_big.get()),
    ("fragmented_packets", "IPv4 packets larger than their output's MTU sent as fragments.", |w| w.fragmented.get()),
    ("fragments_sent", "The fragments those packets were sent as.", |w| w.fragments.get()),
    ("steered_out_packets", "Packets handed to the worker that owns their flow.", |w| w.steered_out.get()),
    ("steered_in_packets", "Packets received from another worker that handed over their flow.", |w| w.steered_in.get()),
    ("sync_exported", "Pins pushed to the sibling sync ring: flows in table slots a change moved.", |w| w.sync_exported.get()),
    ("sync_ring_full", "Pins not exported because the sibling sync ring was full (tried again at the flow's next packet).", |w| w.sync_ring_full.get()),
    ("sync_pin_hits", "Flows without a pin here that followed a pin a sibling shared.", |w| w.sync_pin_hits.get()),
    ("handshakes_sampled", "TCP SYNs to endpoints recorded in the handshake table for passive health.", |w| w.handshakes_sampled.get()),
    ("handshakes_unsampled", "TCP SYNs to endpoints not recorded: their slot of the handshake table held another handshake.", |w| w.handshakes_unsampled.get()),
];

const PORT_COUNTERS: [PortMetric; 8] = [
    ("rx_packets", "Packets the port received (DPDK).", |s| s.ipackets),
    ("tx_packets", "Packets the port sent (DPDK).", |s| s.opackets),
    ("rx_bytes", "Bytes the port received (DPDK).", |s| s.ibytes),
    ("tx_bytes", "Bytes the port sent (DPDK).", |s| s.obytes),
    ("rx_missed", "Packets the device dropped for want of receive descriptors (DPDK imissed).", |s| s.imissed),
    ("rx_errors", "Erroneous received packets.", |s| s.ierrors),
    ("tx_errors", "Failed transmissions.", |s| s.oerrors),
    ("rx_nombuf", "Receive failures for want of an mbuf.", |s| s.rx_nombuf),
];

impl Collector for SluiceCollector {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> fmt::Result {
        let sh = &*self.shared;
        let now = Instant::now();
        let build: Labels = vec![("version", s(env!("CARGO_PKG_VERSION"))), ("dpdk", s(sluice_ffi::dpdk_version()))];
        family(&mut e, "sluice_build_info", "Version of Sluice and of the DPDK it runs on.", Kind::Gauge, vec![(build, f(1))])?;
        family(&mut e, "sluice_uptime_seconds", "Seconds since start.", Kind::Gauge, one(V::F(sh.started.elapsed().as_secs_f64())))?;
        let healthy = health::unhealthy(sh, now).is_empty();
        let ready = health::unready(sh, now).is_empty();
        family(&mut e, "sluice_healthy", "1 while every worker polls and follows the published snapshot.", Kind::Gauge, one(f(u64::from(healthy))))?;
        family(&mut e, "sluice_ready", "1 while the appliance serves its current configuration.", Kind::Gauge, one(f(u64::from(ready))))?;
        let a = &self.admin;
        family(&mut e, "sluice_admin_requests", "Admin requests answered.", Kind::Counter, one(f(a.requests.load(Ordering::Relaxed))))?;
        family(&mut e, "sluice_admin_connections_refused", "Admin connections closed because the connection cap was reached.", Kind::Counter, one(f(a.over_cap.load(Ordering::Relaxed))))?;
        family(&mut e, "sluice_admin_connection_errors", "Admin connections that ended in a protocol error or a timeout.", Kind::Counter, one(f(a.failed.load(Ordering::Relaxed))))?;
        family(&mut e, "sluice_mempool_mbufs_in_use", "Packet buffers taken from the pool.", Kind::Gauge, one(f(u64::from(sh.pool.in_use()))))?;
        family(&mut e, "sluice_mempool_mbufs", "Packet buffers in the pool.", Kind::Gauge, one(f(u64::from(sh.pool.capacity()))))?;

        control_metrics(&mut e, sh)?;
        xds_metrics(&mut e, sh)?;
        sync_metrics(&mut e, sh)?;
        health_metrics(&mut e, sh)?;
        bird_metrics(&mut e, sh)?;
        kube_metrics(&mut e, sh)?;
        worker_metrics(&mut e, sh, now)?;
        latency_metrics(&mut e, sh)?;
        port_metrics(&mut e, sh)
    }
}

/// The snapshot, the sources and the model: what the reconciler last did.
fn control_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    let st = sh.control();
    family(e, "sluice_snapshot_generation", "Generation of the snapshot published last.", Kind::Gauge, one(f(st.generation)))?;
    family(e, "sluice_snapshot_publish_seconds", "Time the last compile and publish took.", Kind::Gauge, one(V::F(st.publish_seconds)))?;
    family(e, "sluice_snapshot_publishes", "Snapshots published.", Kind::Counter, one(f(st.publishes)))?;
    family(e, "sluice_services", "Services in the published snapshot.", Kind::Gauge, one(f(st.services.len() as u64)))?;
    family(e, "sluice_snapshots_pending", "Replaced snapshots waiting for every worker to move on.", Kind::Gauge, one(f(st.snapshots_pending as u64)))?;
    family(e, "sluice_next_hops_unresolved", "Next hops whose MAC the kernel has not resolved.", Kind::Gauge, one(f(st.unresolved as u64)))?;
    let (ok, rejected) = st.reload_totals();
    family(
        e,
        "sluice_config_reloads",
        "Source states (configuration file, manifests, ...) by result.",
        Kind::Counter,
        vec![(vec![("result", s("ok"))], f(ok)), (vec![("result", s("rejected"))], f(rejected))],
    )?;
    family(
        e,
        "sluice_source_accepted",
        "1 when a source's last state is the one being served.",
        Kind::Gauge,
        st.sources.iter().map(|(n, v)| (vec![("source", s(n.clone()))], f(u64::from(v.accepted)))),
    )?;

    let svc = |n: &str| vec![("service", s(n.to_owned()))];
    family(
        e,
        "sluice_service_packets",
        "Packets forwarded to a service's endpoints.",
        Kind::Counter,
        st.services.iter().map(|v| (svc(&v.name), f(sh.service_count(&st, v.slot).0))),
    )?;
    family(
        e,
        "sluice_service_bytes",
        "Bytes forwarded to a service's endpoints.",
        Kind::Counter,
        st.services.iter().map(|v| (svc(&v.name), f(sh.service_count(&st, v.slot).1))),
    )?;
    family(
        e,
        "sluice_service_ready",
        "1 when a service has an endpoint taking new flows.",
        Kind::Gauge,
        st.services.iter().map(|v| (svc(&v.name), f(u64::from(v.ready)))),
    )?;
    let ep = |x: &EndpointStatus| -> Labels {
        vec![("service", s(x.service.to_string())), ("id", s(x.id.to_string())), ("address", s(x.address.to_string()))]
    };
    family(
        e,
        "sluice_endpoint_packets",
        "Packets forwarded to an endpoint.",
        Kind::Counter,
        st.all_endpoints().map(|x| (ep(x), f(sh.endpoint_count(&st, x.counter).0))),
    )?;
    family(
        e,
        "sluice_endpoint_bytes",
        "Bytes forwarded to an endpoint.",
        Kind::Counter,
        st.all_endpoints().map(|x| (ep(x), f(sh.endpoint_count(&st, x.counter).1))),
    )?;
    family(
        e,
        "sluice_endpoint_state",
        "1 for an endpoint's current state.",
        Kind::Gauge,
        st.all_endpoints().map(|x| {
            let mut l = ep(x);
            l.push(("state", s(x.state.name())));
            (l, f(1))
        }),
    )?;
    Ok(())
}

/// The xDS source, while its section is set.
fn xds_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    if let Some(x) = sh.xds() {
        use crate::sources::xds::status::ConnectionState;
        family(e, "sluice_xds_connected", "1 while the ADS stream to the xDS management server is open.", Kind::Gauge, one(f(u64::from(x.state == ConnectionState::Connected))))?;
        family(e, "sluice_xds_reconnects", "ADS streams opened after the first.", Kind::Counter, one(f(x.reconnects)))?;
        family(e, "sluice_xds_nacks", "xDS responses refused (NACK), by type.", Kind::Counter, x.types.iter().map(|(t, v)| (vec![("type_url", s(t.clone()))], f(v.nacks))))?;
        family(e, "sluice_xds_nacks_repeated", "xDS responses refused for the same reason as the one before (logged once per interval), by type.", Kind::Counter, x.types.iter().map(|(t, v)| (vec![("type_url", s(t.clone()))], f(v.repeated_nacks))))?;
        family(e, "sluice_xds_acks", "xDS responses accepted (ACK), by type.", Kind::Counter, x.types.iter().map(|(t, v)| (vec![("type_url", s(t.clone()))], f(v.acks))))?;
        family(
            e,
            "sluice_xds_accepted_version",
            "The version of each type last accepted (as a label).",
            Kind::Gauge,
            x.types.iter().map(|(t, v)| (vec![("type_url", s(t.clone())), ("version", s(v.version.clone()))], f(1))),
        )?;
        family(e, "sluice_xds_last_update_timestamp_seconds", "When the last accepted xDS change was applied.", Kind::Gauge, one(f(x.last_update.unwrap_or(0))))?;
        family(e, "sluice_xds_services", "L4 services the xDS source defines.", Kind::Gauge, one(f(x.services as u64)))?;
        #[allow(clippy::cast_precision_loss)]
        let secs = |us: u64| V::F(us as f64 / 1e6);
        family(
            e,
            "sluice_xds_to_live_seconds",
            "From an xDS response's arrival to its state being published, by quantile.",
            Kind::Gauge,
            vec![
                (vec![("quantile", s("0.5"))], secs(x.to_live.p50_us)),
                (vec![("quantile", s("0.99"))], secs(x.to_live.p99_us)),
                (vec![("quantile", s("1"))], secs(x.to_live.max_us)),
            ],
        )?;
    }
    Ok(())
}

/// Passive health: each endpoint's handshakes and state.
fn health_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    let Some(h) = sh.health() else { return Ok(()) };
    if !h.passive {
        return check_metrics(e, &h.checks);
    }
    family(e, "sluice_health_handshakes_swept", "TCP handshakes passive health took from the workers' table.", Kind::Counter, one(f(h.outcomes)))?;
    family(
        e,
        "sluice_health_handshakes_discounted",
        "Handshakes not counted against their endpoint: unanswered while this appliance dropped received packets, or of a service whose answers do not come back through it.",
        Kind::Counter,
        one(f(h.discounted)),
    )?;
    let ep = |x: &sluice_admin_api::health::EndpointHealth| -> Labels { vec![("service", s(x.service.clone())), ("endpoint", s(x.id.to_string()))] };
    let by = |outcome: &'static str, get: fn(&sluice_admin_api::health::EndpointHealth) -> u64| {
        h.endpoints.iter().map(move |x| {
            let mut l = ep(x);
            l.push(("outcome", s(outcome)));
            (l, f(get(x)))
        })
    };
    let outcomes: Vec<(Labels, V)> = by("succeeded", |x| x.succeeded)
        .chain(by("reset", |x| x.reset))
        .chain(by("retransmitted", |x| x.retransmitted))
        .chain(by("unanswered", |x| x.unanswered))
        .collect();
    family(e, "sluice_health_endpoint_handshakes", "An endpoint's TCP handshakes seen through this appliance, by outcome (succeeded: SYN-ACK; reset: RST; retransmitted: the client's SYN again before an answer; unanswered).", Kind::Counter, outcomes)?;
    family(
        e,
        "sluice_health_endpoint_ejected",
        "1 while passive health keeps an endpoint out of new flows (it drains).",
        Kind::Gauge,
        h.endpoints.iter().map(|x| (ep(x), f(u64::from(x.state == "ejected")))),
    )?;
    family(
        e,
        "sluice_health_endpoint_held",
        "1 while passive health would take an endpoint out but the limit keeps it in (at most half of a service's endpoints out, never its last ready one).",
        Kind::Gauge,
        h.endpoints.iter().map(|x| (ep(x), f(u64::from(x.state == "held")))),
    )?;
    family(
        e,
        "sluice_health_endpoint_handshake_median_seconds",
        "Median SYN to SYN-ACK time of an endpoint's last handshakes, as this appliance saw them.",
        Kind::Gauge,
        h.endpoints.iter().filter_map(|x| Some((ep(x), V::F(f64::from(x.handshake_median_us?) / 1e6)))),
    )?;
    check_metrics(e, &h.checks)
}

/// Active checks: each checked endpoint's checks and state.
fn check_metrics(e: &mut DescriptorEncoder<'_>, c: &sluice_admin_api::health::Checks) -> fmt::Result {
    family(e, "sluice_health_checks", "Active checks run.", Kind::Counter, one(f(c.run)))?;
    family(e, "sluice_health_checks_failed", "Active checks that failed.", Kind::Counter, one(f(c.failed)))?;
    family(
        e,
        "sluice_health_checks_late",
        "Active checks started more than a tenth of their interval after they were due (too many running at once).",
        Kind::Counter,
        one(f(c.late)),
    )?;
    family(e, "sluice_health_checks_in_flight", "Active checks running now.", Kind::Gauge, one(f(c.in_flight as u64)))?;
    let ep = |x: &sluice_admin_api::health::CheckedEndpoint| -> Labels { vec![("service", s(x.service.clone())), ("endpoint", s(x.id.to_string()))] };
    let outcomes: Vec<(Labels, V)> = c
        .endpoints
        .iter()
        .flat_map(|x| {
            let (mut ok, mut failed) = (ep(x), ep(x));
            ok.push(("outcome", s("succeeded")));
            failed.push(("outcome", s("failed")));
            [(ok, f(x.checks - x.failures)), (failed, f(x.failures))]
        })
        .collect();
    family(e, "sluice_health_endpoint_checks", "An endpoint's active checks, by outcome.", Kind::Counter, outcomes)?;
    family(
        e,
        "sluice_health_endpoint_down",
        "1 while an endpoint's active check keeps it out of new flows (it drains); the limit may hold it in (sluice_health_endpoint_check_held).",
        Kind::Gauge,
        c.endpoints.iter().map(|x| (ep(x), f(u64::from(x.state == "down")))),
    )?;
    family(
        e,
        "sluice_health_endpoint_check_held",
        "1 while an endpoint's active check fails but the limit keeps it in (at most half of a service's endpoints out, never its last ready one).",
        Kind::Gauge,
        c.endpoints.iter().map(|x| (ep(x), f(u64::from(x.state == "held")))),
    )
}

/// Sibling sync, with a `siblings:` section.
fn sync_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    if let Some(y) = sh.sync() {
        family(e, "sluice_sync_pins_held", "Pins this appliance exported, held for its siblings until their lifetime ends.", Kind::Gauge, one(f(y.pins_held)))?;
        family(e, "sluice_sync_pins_synced", "Pins received from siblings that this appliance's snapshot maps, in the workers' table.", Kind::Gauge, one(f(y.pins_synced)))?;
        family(e, "sluice_sync_sent", "Pin records sent to siblings.", Kind::Counter, one(f(y.sent)))?;
        family(e, "sluice_sync_received", "Pin records received from siblings.", Kind::Counter, one(f(y.received)))?;
        family(e, "sluice_sync_refused", "Sibling connections refused for a wrong key, and frames refused for a wrong MAC.", Kind::Counter, one(f(y.refused)))?;
        family(e, "sluice_sync_rate_dropped", "Pin records dropped by the per-sibling rate bound (siblings.maxRecordsPerSecond).", Kind::Counter, one(f(y.rate_dropped)))?;
        family(e, "sluice_sync_unknown", "Pin records naming a service or endpoint this appliance did not have when they arrived (kept, used once a snapshot has it), or not decoded.", Kind::Counter, one(f(y.unknown)))?;
        family(e, "sluice_sync_stale", "Exported pins whose endpoint changed before they were sent, not sent.", Kind::Counter, one(f(y.stale)))?;
        family(e, "sluice_sync_overflows", "Sibling connections closed because their queue overflowed.", Kind::Counter, one(f(y.overflows)))?;
        family(e, "sluice_sync_settled", "1 once start-up took every reachable sibling's pins or siblings.startupWaitMs passed.", Kind::Gauge, one(f(u64::from(y.settled))))?;
        let a = &y.agreement;
        family(e, "sluice_sync_services_mismatched", "Services whose table digest differs on a sibling compared (another digest, or the sibling lacks the service).", Kind::Gauge, one(f(a.mismatched)))?;
        family(e, "sluice_sync_services_minority", "Services whose table digest is in the minority among the reachable siblings, this appliance included.", Kind::Gauge, one(f(a.minority)))?;
        family(e, "sluice_sync_services_withdrawn", "Services whose VIPs are withdrawn because their table differs from the siblings' majority (siblings.gate).", Kind::Gauge, one(f(a.withdrawn)))?;
        family(e, "sluice_sync_siblings_compared", "Siblings whose table digests are compared with this appliance's.", Kind::Gauge, one(f(a.siblings_compared)))?;
        let peer = |p: &crate::sync::PeerStatus| -> Labels { vec![("peer", s(p.address.clone()))] };
        family(e, "sluice_sync_peer_connected", "1 while this appliance takes a sibling's pins.", Kind::Gauge, y.peers.iter().map(|p| (peer(p), f(u64::from(p.connected)))))?;
        family(e, "sluice_sync_peer_in_sync", "1 once a sibling sent its full set on the current connection.", Kind::Gauge, y.peers.iter().map(|p| (peer(p), f(u64::from(p.in_sync)))))?;
        family(e, "sluice_sync_peer_subscribed", "1 while a sibling takes this appliance's pins.", Kind::Gauge, y.peers.iter().map(|p| (peer(p), f(u64::from(p.subscribed)))))?;
        family(e, "sluice_sync_peer_lag", "Pin records queued for a sibling and not yet sent.", Kind::Gauge, y.peers.iter().map(|p| (peer(p), f(p.lag))))?;
        family(e, "sluice_sync_peer_services_mismatched", "Services whose table digest differs on a sibling.", Kind::Gauge, y.peers.iter().filter(|p| p.digests.is_some()).map(|p| (peer(p), f(p.mismatched))))?;
        family(
            e,
            "sluice_sync_peer_last_heard_seconds",
            "Seconds since a sibling last sent anything on this appliance's connection to it.",
            Kind::Gauge,
            y.peers.iter().filter_map(|p| Some((peer(p), V::F(p.last_heard_seconds?)))),
        )?;
    }
    Ok(())
}

/// The BIRD driver, while a gateway router is configured.
fn bird_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    if let Some(b) = sh.bird() {
        family(e, "sluice_bird_up", "1 while BIRD answers on its control socket.", Kind::Gauge, one(f(u64::from(b.connected))))?;
        family(e, "sluice_bird_restarts", "Times the supervised bird was started again after it ended.", Kind::Counter, one(f(b.restarts)))?;
        family(e, "sluice_bird_configurations", "BIRD configurations applied.", Kind::Counter, one(f(b.configured)))?;
        family(e, "sluice_bird_configuration_failures", "BIRD configurations that could not be applied.", Kind::Counter, one(f(b.configure_failures)))?;
        family(
            e,
            "sluice_bird_configuration_refused",
            "1 while BIRD refuses the configuration Sluice generated (it runs its previous one).",
            Kind::Gauge,
            one(f(u64::from(b.refused.is_some()))),
        )?;
        family(e, "sluice_bird_refused_commands", "Commands BIRD refused while Sluice read its state.", Kind::Counter, one(f(b.refused_commands)))?;
        let router = |x: &crate::routing::bird::SessionStatus| -> Labels {
            vec![("router", s(x.router.clone())), ("neighbor", s(x.neighbor.clone()))]
        };
        family(e, "sluice_bgp_session_up", "1 while the BGP session with a gateway router is Established.", Kind::Gauge, b.sessions.iter().map(|x| (router(x), f(u64::from(x.bgp_state == "Established")))))?;
        family(
            e,
            "sluice_bgp_session_state",
            "1 for the BGP session state of a gateway router (from BIRD's show protocols).",
            Kind::Gauge,
            b.sessions.iter().map(|x| {
                let mut l = router(x);
                l.push(("state", s(x.bgp_state.clone())));
                (l, f(1))
            }),
        )?;
        family(
            e,
            "sluice_bfd_session_up",
            "1 while the BFD session with a gateway router is Up (routers with BFD only).",
            Kind::Gauge,
            b.sessions.iter().filter(|x| x.bfd).map(|x| (router(x), f(u64::from(x.bfd_state.as_deref() == Some("Up"))))),
        )?;
        family(
            e,
            "sluice_vip_announced",
            "1 while a VIP is announced to the gateway routers, 0 while it is withdrawn; the reason is a label.",
            Kind::Gauge,
            b.vips.iter().map(|v| (vec![("vip", s(v.vip.to_string())), ("reason", s(v.reason.clone()))], f(u64::from(v.announced)))),
        )?;
    }
    Ok(())
}

/// The Kubernetes source, while its section is set.
fn kube_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    if let Some(k) = sh.kube() {
        family(e, "sluice_kube_connected", "1 while the Kubernetes API server answers.", Kind::Gauge, one(f(u64::from(k.connected))))?;
        family(e, "sluice_kube_synced", "1 once every watched kind has been listed (nothing is served from Kubernetes before).", Kind::Gauge, one(f(u64::from(k.synced))))?;
        family(
            e,
            "sluice_kube_objects_watched",
            "Objects the Kubernetes source sees, by kind.",
            Kind::Gauge,
            k.watched.iter().map(|(kind, n)| (vec![("kind", s(kind.clone()))], f(*n as u64))),
        )?;
        family(e, "sluice_kube_status_writes", "Status writes sent to the API server.", Kind::Counter, one(f(k.status_writes)))?;
        family(e, "sluice_kube_status_write_errors", "Status writes that failed.", Kind::Counter, one(f(k.status_write_errors)))?;
        family(e, "sluice_kube_refused_objects", "Objects left out (or served with a setting kept), with a reason in their status.", Kind::Gauge, one(f(k.refused.len() as u64)))?;
        family(e, "sluice_kube_last_applied_timestamp_seconds", "When a state from Kubernetes was last served (0: never).", Kind::Gauge, one(f(k.last_applied_at.unwrap_or(0))))?;
    }
    Ok(())
}

/// The workers: their counters, time, stalls and drops.
fn worker_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared, now: Instant) -> fmt::Result {
    let worker = |w: &super::state::WorkerEntry| vec![("worker", s(w.lcore.to_string()))];
    for (name, help, get) in WORKER_COUNTERS {
        let full = format!("sluice_worker_{name}");
        family(e, &full, help, Kind::Counter, sh.workers.iter().map(|w| (worker(w), f(get(&w.counters)))))?;
    }
    #[allow(clippy::cast_precision_loss)] // seconds as a float
    let secs = |cycles: u64| V::F(if sh.cycles_hz == 0 { 0.0 } else { cycles as f64 / sh.cycles_hz as f64 });
    family(
        e,
        "sluice_worker_busy_seconds",
        "Time a worker spent in poll rounds that received packets.",
        Kind::Counter,
        sh.workers.iter().map(|w| (worker(w), secs(w.counters.busy_cycles.get()))),
    )?;
    family(
        e,
        "sluice_worker_idle_seconds",
        "Time a worker spent in poll rounds that received nothing.",
        Kind::Counter,
        sh.workers.iter().map(|w| (worker(w), secs(w.counters.idle_cycles.get()))),
    )?;
    family(
        e,
        "sluice_worker_rx_interrupts",
        "1 when a worker's idle pauses wait on receive interrupts (every port queue it polls has them; dpdk.rxInterrupts), 0 when it sleeps.",
        Kind::Gauge,
        sh.workers.iter().map(|w| (worker(w), f(w.counters.interrupts_armed.get()))),
    )?;
    let silent = health::silent_for(sh, now);
    family(
        e,
        "sluice_worker_stalled",
        "1 while a worker has not polled for more than a second (the process exits after dpdk.stallExitSeconds).",
        Kind::Gauge,
        sh.workers.iter().zip(&silent).map(|(w, d)| (worker(w), f(u64::from(*d > health::STALL)))),
    )?;
    family(
        e,
        "sluice_worker_flow_entries",
        "Live entries of a worker's flow table, counted once a second (flows pinned to their endpoint: flowTable services).",
        Kind::Gauge,
        sh.workers.iter().map(|w| (worker(w), f(w.counters.flow_entries.get()))),
    )?;
    family(
        e,
        "sluice_worker_flow_capacity",
        "Entries a worker's flow table holds at most (flowTable.entries, rounded up); beyond it live flows are evicted (flow_evictions).",
        Kind::Gauge,
        sh.workers.iter().map(|w| (worker(w), f(w.counters.flow_capacity.get()))),
    )?;
    family(
        e,
        "sluice_worker_snapshot_generation",
        "Snapshot generation a worker uses.",
        Kind::Gauge,
        sh.workers.iter().map(|w| (worker(w), f(w.counters.generation.get()))),
    )?;
    family(
        e,
        "sluice_drops",
        "Dropped packets, by worker and reason.",
        Kind::Counter,
        sh.workers.iter().flat_map(|w| {
            DropReason::ALL.iter().map(move |r| {
                (vec![("worker", s(w.lcore.to_string())), ("reason", s(r.name()))], f(w.counters.drops[r.index()].get()))
            })
        }),
    )?;
    Ok(())
}

/// Each packet's time through the workers, as quantiles since start,
/// while the workers record it (`dpdk.latencyHistogram: true`; `/latency`
/// gives the same figures in microseconds).
fn latency_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    let Some(v) = super::latency::view(sh) else { return Ok(()) };
    let quantiles = |p: &super::latency::Percentiles| -> [(&'static str, f64); 5] {
        [("0.5", p.p50), ("0.9", p.p90), ("0.99", p.p99), ("0.999", p.p999), ("1", p.max)].map(|(q, us)| (q, us / 1e6))
    };
    family(
        e,
        "sluice_latency_seconds",
        "A packet's time through the workers (from its burst's arrival to its poll round's last transmit), every worker's packets since start, by quantile (1: the longest).",
        Kind::Gauge,
        quantiles(&v.all).map(|(q, x)| (vec![("quantile", s(q))], V::F(x))),
    )?;
    family(
        e,
        "sluice_worker_latency_seconds",
        "A packet's time through one worker since start, by quantile (1: the longest).",
        Kind::Gauge,
        v.workers.iter().flat_map(|w| {
            quantiles(&w.percentiles).map(|(q, x)| (vec![("worker", s(w.lcore.to_string())), ("quantile", s(q))], V::F(x)))
        }),
    )?;
    family(e, "sluice_latency_packets", "Packets whose time through the workers was recorded.", Kind::Counter, one(f(v.all.packets)))
}

/// The ports: their counters, loss below DPDK and link.
fn port_metrics(e: &mut DescriptorEncoder<'_>, sh: &Shared) -> fmt::Result {
    let stats: Vec<(Labels, PortStats)> = sh
        .ports
        .iter()
        .flat_map(|p| {
            let mut v = Vec::new();
            if let Some(st) = p.port.stats() {
                v.push((vec![("port", s(p.meta.name.clone())), ("side", s("port"))], st));
            }
            if let Some(st) = p.tap.as_ref().and_then(|t| t.stats()) {
                v.push((vec![("port", s(p.meta.name.clone())), ("side", s("kernel"))], st));
            }
            v
        })
        .collect();
    for (name, help, get) in PORT_COUNTERS {
        let full = format!("sluice_port_{name}");
        family(e, &full, help, Kind::Counter, stats.iter().map(|(l, st)| (l.clone(), f(get(st)))))?;
    }
    family(
        e,
        "sluice_port_rx_lost_below_dpdk",
        "Frames a port lost before DPDK received them (device or kernel ring full), by where the figure comes from.",
        Kind::Counter,
        sh.ports.iter().map(|p| {
            let l = lock(&p.loss);
            (vec![("port", s(p.meta.name.clone())), ("source", s(l.source.clone()))], f(l.below_dpdk))
        }),
    )?;
    family(
        e,
        "sluice_port_rx_lost_below_dpdk_exact",
        "1 when sluice_port_rx_lost_below_dpdk counts every frame lost up to its last sample; 0 while it is a lower bound (frames arriving).",
        Kind::Gauge,
        sh.ports.iter().map(|p| (vec![("port", s(p.meta.name.clone()))], f(u64::from(lock(&p.loss).exact)))),
    )?;
    family(
        e,
        "sluice_port_kernel_settings_restored",
        "Times the kernel interface under a net_af_packet or net_af_xdp port was found forwarding IPv4 or filtering reverse paths loosely again (a write of net.ipv4.ip_forward sets every interface's forwarding), the kernel answering the traffic DPDK reads, and was set back.",
        Kind::Counter,
        sh.ports.iter().map(|p| (vec![("port", s(p.meta.name.clone()))], f(p.kernel_settings_restored.load(Ordering::Relaxed)))),
    )?;
    family(
        e,
        "sluice_port_exception_dropped",
        "Frames the kernel sent to the appliance through a port's exception interface (ARP and neighbour probes, BGP, BFD, ICMP) and dropped because the interface's transmit queue was full: the workers read them too slowly.",
        Kind::Counter,
        sh.ports
            .iter()
            .filter(|p| !p.meta.kernel_interface.is_empty())
            .map(|p| (vec![("port", s(p.meta.name.clone()))], f(p.exception_dropped.load(Ordering::Relaxed)))),
    )?;
    family(
        e,
        "sluice_port_link_up",
        "1 when a port's link is up.",
        Kind::Gauge,
        sh.ports.iter().filter_map(|p| Some((vec![("port", s(p.meta.name.clone()))], f(u64::from(p.port.link_up()?))))),
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use sluice_dataplane::counters::WorkerCounters;
    use sluice_dataplane::latency::{histogram, SharedLatency};

    use super::*;
    use crate::admin::state::{IdlePool, WorkerEntry};

    /// The value of the sample `series` (name and labels as written).
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn latency_quantiles_are_exported_in_seconds_only_while_the_workers_record() {
        let entry = |lcore, latency| WorkerEntry { lcore, counters: Arc::new(WorkerCounters::new(1, 1)), latency };
        let render_of = |sh: Shared| render(&registry(Arc::new(sh), Arc::default()));
        let off = render_of(Shared::new("c.yaml".into(), Vec::new(), Arc::new(IdlePool), vec![entry(1, None)], 2_000_000_000));
        assert!(!off.contains("latency"), "{off}");

        // Worker 1: 100 packets at 4 us (2 GHz ticks), one at 1 ms.
        let l = Arc::new(SharedLatency::default());
        let mut h = histogram();
        h.record_n(8_000, 100).unwrap();
        h.record(2_000_000).unwrap();
        l.add(&h);
        let on = render_of(Shared::new("c.yaml".into(), Vec::new(), Arc::new(IdlePool), vec![entry(1, Some(l)), entry(2, None)], 2_000_000_000));
        let near = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() <= want * 0.01 + 1e-8);
        assert!(near(sample(&on, r#"sluice_latency_seconds{quantile="0.5"}"#), 4e-6), "{on}");
        assert!(near(sample(&on, r#"sluice_latency_seconds{quantile="1"}"#), 1e-3), "{on}");
        assert!(near(sample(&on, r#"sluice_worker_latency_seconds{worker="1",quantile="0.99"}"#), 4e-6), "{on}");
        assert_eq!(sample(&on, "sluice_latency_packets_total{}"), Some(101.0), "{on}");
        assert!(!on.contains(r#"worker_latency_seconds{worker="2""#), "a worker that does not record has no series: {on}");
    }
}
