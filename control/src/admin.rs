//! The admin endpoint on localhost: `/metrics` (Prometheus text format),
//! `/status` (JSON), `/healthz`. It reads the workers' counters, the
//! ports' statistics and what the control thread last recorded; it never
//! touches the fast path.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use serde::Serialize;
use sluice_dataplane::counters::WorkerCounters;
use sluice_dataplane::verdict::DropReason;
use sluice_ffi::{LcoreId, Mempool, PortId, PortStatsReader};

use crate::compile::EndpointStatus;
use crate::kernel::mac_str;

/// A port as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct PortMeta {
    /// Config name.
    pub name: String,
    /// DPDK device.
    pub device: String,
    /// Kernel interface of its exception path ("" for none).
    pub kernel_interface: String,
    /// MAC.
    pub mac: String,
    /// DPDK port number.
    #[serde(skip)]
    pub id: PortId,
    /// DPDK port number of its exception tap.
    #[serde(skip)]
    pub tap: Option<PortId>,
}

/// A service as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceMeta {
    /// Name.
    pub name: String,
    /// Counter slot.
    #[serde(skip)]
    pub slot: u32,
    /// Algorithm.
    pub algorithm: String,
    /// Flow table.
    pub flow_table: bool,
    /// Endpoint limit.
    pub limit: u32,
    /// Table size.
    pub table_size: u32,
    /// At least one endpoint takes new flows.
    pub ready: bool,
}

/// A route as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RouteMeta {
    /// Name.
    pub name: String,
    /// Service.
    pub service: String,
    /// Priority.
    pub priority: i32,
    /// VIPs.
    pub vips: Vec<String>,
}

/// What the last reload did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ReloadStatus {
    /// Accepted.
    pub ok: bool,
    /// When (seconds since the epoch).
    pub at: u64,
    /// Problems, when rejected.
    pub problems: Vec<String>,
    /// Services whose tables were rebuilt.
    pub rebuilt: Vec<String>,
}

/// What the control thread records for the admin endpoint.
#[derive(Debug, Default)]
pub struct ControlState {
    /// Generation published last.
    pub generation: u64,
    /// Seconds the last compile-and-publish took.
    pub publish_seconds: f64,
    /// Publications.
    pub publishes: u64,
    /// Reloads accepted and rejected.
    pub reloads_ok: u64,
    /// Reloads rejected.
    pub reloads_failed: u64,
    /// The last reload.
    pub last_reload: ReloadStatus,
    /// Services.
    pub services: Vec<ServiceMeta>,
    /// Routes.
    pub routes: Vec<RouteMeta>,
    /// Endpoints.
    pub endpoints: Vec<EndpointStatus>,
    /// Counter values at the time a slot was (re)assigned: (packets, bytes).
    pub service_base: HashMap<u32, (u64, u64)>,
    /// Same, for endpoint slots.
    pub endpoint_base: HashMap<u32, (u64, u64)>,
    /// Snapshots replaced but not yet freed.
    pub snapshots_pending: usize,
}

/// Everything the admin thread reads.
#[derive(Debug)]
pub struct Shared {
    /// Start time.
    pub started: Instant,
    /// Statistics readers of every port and exception tap (they keep the
    /// devices open while this exists).
    pub port_readers: Vec<PortStatsReader>,
    /// Ports.
    pub ports: Vec<PortMeta>,
    /// The packet pool.
    pub pool: Arc<Mempool>,
    /// Workers and their counters.
    pub workers: Vec<(LcoreId, Arc<WorkerCounters>)>,
    /// Control state.
    pub state: Mutex<ControlState>,
    /// The configuration file.
    pub config_path: String,
}

impl Shared {
    /// The statistics reader of port `id`.
    fn port_reader(&self, id: PortId) -> Option<&PortStatsReader> {
        self.port_readers.iter().find(|r| r.id() == id)
    }

    /// Sum over workers of (packets, bytes) of a service slot.
    fn service_totals(&self, slot: u32) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(p, b), (_, w)| match w.services.get(slot as usize) {
            Some(c) => (p + c.packets.get(), b + c.bytes.get()),
            None => (p, b),
        })
    }

    /// Sum over workers of (packets, bytes) of an endpoint slot.
    fn endpoint_totals(&self, slot: u32) -> (u64, u64) {
        self.workers.iter().fold((0, 0), |(p, b), (_, w)| match w.endpoints.get(slot as usize) {
            Some(c) => (p + c.packets.get(), b + c.bytes.get()),
            None => (p, b),
        })
    }

    /// Records current totals of new slots as their starting point.
    pub fn baseline(&self, st: &mut ControlState, services: &[u32], endpoints: &[u32]) {
        for &s in services {
            st.service_base.insert(s, self.service_totals(s));
        }
        for &s in endpoints {
            st.endpoint_base.insert(s, self.endpoint_totals(s));
        }
    }

    fn service_count(&self, st: &ControlState, slot: u32) -> (u64, u64) {
        let (p, b) = self.service_totals(slot);
        let (bp, bb) = st.service_base.get(&slot).copied().unwrap_or((0, 0));
        (p.saturating_sub(bp), b.saturating_sub(bb))
    }

    fn endpoint_count(&self, st: &ControlState, slot: u32) -> (u64, u64) {
        let (p, b) = self.endpoint_totals(slot);
        let (bp, bb) = st.endpoint_base.get(&slot).copied().unwrap_or((0, 0));
        (p.saturating_sub(bp), b.saturating_sub(bb))
    }
}

/// A metric read from a worker's counters: (name, help, reader).
type WorkerMetric = (&'static str, &'static str, fn(&WorkerCounters) -> u64);
/// A metric read from a port's statistics.
type PortMetric = (&'static str, &'static str, fn(&sluice_ffi::PortStats) -> u64);

fn esc(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The Prometheus text exposition.
pub fn metrics(sh: &Shared) -> String {
    let st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
    let mut o = String::new();
    let head = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    head(&mut o, "sluice_build_info", "gauge", "Version of Sluice and of the DPDK it runs on.");
    let _ = writeln!(
        o,
        "sluice_build_info{{version=\"{}\",dpdk=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION"),
        esc(&sluice_ffi::dpdk_version())
    );
    head(&mut o, "sluice_uptime_seconds", "gauge", "Seconds since start.");
    let _ = writeln!(o, "sluice_uptime_seconds {:.3}", sh.started.elapsed().as_secs_f64());
    head(&mut o, "sluice_snapshot_generation", "gauge", "Generation of the snapshot published last.");
    let _ = writeln!(o, "sluice_snapshot_generation {}", st.generation);
    head(&mut o, "sluice_snapshot_publish_seconds", "gauge", "Time the last compile and publish took.");
    let _ = writeln!(o, "sluice_snapshot_publish_seconds {:.6}", st.publish_seconds);
    head(&mut o, "sluice_snapshot_publishes_total", "counter", "Snapshots published.");
    let _ = writeln!(o, "sluice_snapshot_publishes_total {}", st.publishes);
    head(&mut o, "sluice_snapshots_pending", "gauge", "Replaced snapshots waiting for every worker to move on.");
    let _ = writeln!(o, "sluice_snapshots_pending {}", st.snapshots_pending);
    head(&mut o, "sluice_config_reloads_total", "counter", "Configuration reloads, by result.");
    let _ = writeln!(o, "sluice_config_reloads_total{{result=\"ok\"}} {}", st.reloads_ok);
    let _ = writeln!(o, "sluice_config_reloads_total{{result=\"rejected\"}} {}", st.reloads_failed);
    head(&mut o, "sluice_mempool_mbufs_in_use", "gauge", "Packet buffers taken from the pool.");
    let _ = writeln!(o, "sluice_mempool_mbufs_in_use {}", sh.pool.in_use());
    head(&mut o, "sluice_mempool_mbufs", "gauge", "Packet buffers in the pool.");
    let _ = writeln!(o, "sluice_mempool_mbufs {}", sh.pool.capacity());

    let worker_counters: [WorkerMetric; 12] = [
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
        ("flow_evictions", "Live flow-table entries evicted to make room.", |w| w.flow_evictions.get()),
        ("snapshot_generation", "Snapshot generation in use.", |w| w.generation.get()),
    ];
    for (name, help, f) in worker_counters {
        let full = format!("sluice_worker_{name}{}", if name == "snapshot_generation" { "" } else { "_total" });
        head(&mut o, &full, if name == "snapshot_generation" { "gauge" } else { "counter" }, help);
        for (l, w) in &sh.workers {
            let _ = writeln!(o, "{full}{{worker=\"{}\"}} {}", l.0, f(w));
        }
    }
    head(&mut o, "sluice_drops_total", "counter", "Dropped packets, by worker and reason.");
    for (l, w) in &sh.workers {
        for r in DropReason::ALL {
            let _ = writeln!(o, "sluice_drops_total{{worker=\"{}\",reason=\"{}\"}} {}", l.0, r.name(), w.drops[r.index()].get());
        }
    }

    head(&mut o, "sluice_service_packets_total", "counter", "Packets forwarded to a service's endpoints.");
    for s in &st.services {
        let _ = writeln!(o, "sluice_service_packets_total{{service=\"{}\"}} {}", esc(&s.name), sh.service_count(&st, s.slot).0);
    }
    head(&mut o, "sluice_service_bytes_total", "counter", "Bytes forwarded to a service's endpoints.");
    for s in &st.services {
        let _ = writeln!(o, "sluice_service_bytes_total{{service=\"{}\"}} {}", esc(&s.name), sh.service_count(&st, s.slot).1);
    }
    head(&mut o, "sluice_service_ready", "gauge", "1 when a service has an endpoint taking new flows.");
    for s in &st.services {
        let _ = writeln!(o, "sluice_service_ready{{service=\"{}\"}} {}", esc(&s.name), u8::from(s.ready));
    }
    let ep_label = |e: &EndpointStatus| format!("service=\"{}\",id=\"{}\",address=\"{}\"", esc(&e.service), e.id, e.address);
    head(&mut o, "sluice_endpoint_packets_total", "counter", "Packets forwarded to an endpoint.");
    for e in &st.endpoints {
        let _ = writeln!(o, "sluice_endpoint_packets_total{{{}}} {}", ep_label(e), sh.endpoint_count(&st, e.counter).0);
    }
    head(&mut o, "sluice_endpoint_bytes_total", "counter", "Bytes forwarded to an endpoint.");
    for e in &st.endpoints {
        let _ = writeln!(o, "sluice_endpoint_bytes_total{{{}}} {}", ep_label(e), sh.endpoint_count(&st, e.counter).1);
    }
    head(&mut o, "sluice_endpoint_state", "gauge", "1 for an endpoint's current state.");
    for e in &st.endpoints {
        let _ = writeln!(o, "sluice_endpoint_state{{{},state=\"{}\"}} 1", ep_label(e), e.state.name());
    }

    let port_stats: [PortMetric; 8] = [
        ("rx_packets", "Packets the port received.", |s| s.ipackets),
        ("tx_packets", "Packets the port sent.", |s| s.opackets),
        ("rx_bytes", "Bytes the port received.", |s| s.ibytes),
        ("tx_bytes", "Bytes the port sent.", |s| s.obytes),
        ("rx_missed", "Packets the NIC dropped for want of receive descriptors.", |s| s.imissed),
        ("rx_errors", "Erroneous received packets.", |s| s.ierrors),
        ("tx_errors", "Failed transmissions.", |s| s.oerrors),
        ("rx_nombuf", "Receive failures for want of an mbuf.", |s| s.rx_nombuf),
    ];
    let stats: Vec<(String, String, sluice_ffi::PortStats)> = sh
        .ports
        .iter()
        .flat_map(|p| {
            let mut v = vec![(p.name.clone(), "port".to_owned(), p.id)];
            if let Some(t) = p.tap {
                v.push((p.name.clone(), "kernel".to_owned(), t));
            }
            v
        })
        .filter_map(|(n, side, id)| Some((n, side, sh.port_reader(id)?.stats().ok()?)))
        .collect();
    for (name, help, f) in port_stats {
        let full = format!("sluice_port_{name}_total");
        head(&mut o, &full, "counter", help);
        for (n, side, s) in &stats {
            let _ = writeln!(o, "{full}{{port=\"{}\",side=\"{side}\"}} {}", esc(n), f(s));
        }
    }
    o
}

#[derive(Serialize)]
struct WorkerStatus {
    lcore: u32,
    rx_packets: u64,
    tx_packets: u64,
    balanced: u64,
    exception: u64,
    drops: u64,
    busy_polls: u64,
    idle_polls: u64,
    generation: u64,
}

#[derive(Serialize)]
struct EndpointView {
    service: String,
    id: u32,
    address: String,
    weight: u32,
    mac: Option<String>,
    port: Option<String>,
    state: String,
    reason: Option<String>,
    packets: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct ServiceView {
    #[serde(flatten)]
    meta: ServiceMeta,
    packets: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct PortView {
    #[serde(flatten)]
    meta: PortMeta,
    link_up: Option<bool>,
    rx_packets: u64,
    tx_packets: u64,
    rx_missed: u64,
}

#[derive(Serialize)]
struct StatusView {
    version: String,
    dpdk: String,
    config: String,
    uptime_seconds: f64,
    generation: u64,
    publish_seconds: f64,
    snapshots_pending: usize,
    last_reload: ReloadStatus,
    mbufs_in_use: u32,
    mbufs: u32,
    ports: Vec<PortView>,
    workers: Vec<WorkerStatus>,
    drops: Vec<(String, u64)>,
    services: Vec<ServiceView>,
    routes: Vec<RouteMeta>,
    endpoints: Vec<EndpointView>,
}

/// The `/status` document.
pub fn status(sh: &Shared) -> String {
    let st = sh.state.lock().unwrap_or_else(|e| e.into_inner());
    let drops = DropReason::ALL
        .iter()
        .map(|r| (r.name().to_owned(), sh.workers.iter().map(|(_, w)| w.drops[r.index()].get()).sum::<u64>()))
        .filter(|(_, n)| *n > 0)
        .collect();
    let view = StatusView {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        dpdk: sluice_ffi::dpdk_version(),
        config: sh.config_path.clone(),
        uptime_seconds: sh.started.elapsed().as_secs_f64(),
        generation: st.generation,
        publish_seconds: st.publish_seconds,
        snapshots_pending: st.snapshots_pending,
        last_reload: st.last_reload.clone(),
        mbufs_in_use: sh.pool.in_use(),
        mbufs: sh.pool.capacity(),
        ports: sh
            .ports
            .iter()
            .map(|p| {
                let s = sh.port_reader(p.id).and_then(|r| r.stats().ok()).unwrap_or_default();
                PortView {
                    meta: p.clone(),
                    link_up: sh.port_reader(p.id).and_then(|r| r.link().ok()).map(|l| l.up),
                    rx_packets: s.ipackets,
                    tx_packets: s.opackets,
                    rx_missed: s.imissed,
                }
            })
            .collect(),
        workers: sh
            .workers
            .iter()
            .map(|(l, w)| WorkerStatus {
                lcore: l.0,
                rx_packets: w.rx_packets.get(),
                tx_packets: w.tx_packets.get(),
                balanced: w.balanced.get(),
                exception: w.exception.get(),
                drops: w.total_drops(),
                busy_polls: w.busy_polls.get(),
                idle_polls: w.idle_polls.get(),
                generation: w.generation.get(),
            })
            .collect(),
        drops,
        services: st
            .services
            .iter()
            .map(|s| {
                let (packets, bytes) = sh.service_count(&st, s.slot);
                ServiceView { meta: s.clone(), packets, bytes }
            })
            .collect(),
        routes: st.routes.clone(),
        endpoints: st
            .endpoints
            .iter()
            .map(|e| {
                let (packets, bytes) = sh.endpoint_count(&st, e.counter);
                EndpointView {
                    service: e.service.clone(),
                    id: e.id,
                    address: e.address.to_string(),
                    weight: e.weight,
                    mac: e.mac.as_ref().map(mac_str),
                    port: e.port.clone(),
                    state: e.state.name().to_owned(),
                    reason: match &e.state {
                        crate::compile::EndpointState::Unreachable(r) => Some(r.clone()),
                        _ => None,
                    },
                    packets,
                    bytes,
                }
            })
            .collect(),
    };
    serde_json::to_string_pretty(&view).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Answers one admin request.
pub fn respond(req: tiny_http::Request, sh: &Shared) {
    {
        let (code, ctype, body) = match (req.method(), req.url()) {
            (tiny_http::Method::Get, "/metrics") => (200, "text/plain; version=0.0.4", metrics(sh)),
            (tiny_http::Method::Get, "/status") => (200, "application/json", status(sh)),
            (tiny_http::Method::Get, "/healthz") => (200, "text/plain", "ok\n".to_owned()),
            (tiny_http::Method::Get, _) => (404, "text/plain", "not found: try /metrics, /status or /healthz\n".to_owned()),
            _ => (405, "text/plain", "only GET\n".to_owned()),
        };
        let header = tiny_http::Header::from_bytes(&b"Content-Type"[..], ctype.as_bytes());
        let mut resp = tiny_http::Response::from_string(body).with_status_code(code);
        if let Ok(h) = header {
            resp = resp.with_header(h);
        }
        let _ = req.respond(resp);
    }
}

/// Seconds since the epoch.
pub fn now_epoch() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
