//! `sluice gen`: a DPDK traffic generator on any port Sluice can open.
//!
//! It sends a flow mix (or frames replayed from a pcap) on one port at a
//! rate for a duration, receives on every port it opened, and reports what
//! came back: sent, received, lost, reordered, per-endpoint share and
//! latency (timestamps carried in the frames). A progress line goes to
//! stderr once a second; the report is JSON on stdout (or in a file).
//!
//! The per-packet work is `sluice_lab`'s generator over
//! `sluice_lab::GenQueues`; this module sets up the EAL and ports (the
//! same `Port::start` as `sluice run`), runs the loop on a worker lcore
//! (or the main one), watches, and writes the report.

use std::fs::File;
use std::io::{BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sluice_ffi::{Eal, LcoreId, Mempool, Port, PortConfig, QueueIo, DEFAULT_DATA_ROOM};
use sluice_lab::mix::{self, Datagram, MAX_FRAME};
use sluice_lab::{self as core, Control, EndpointBy, GenQueues, Generator, Kind, Lanes, MixSpec, Pacer, Receiver, Schedule, Timing};

use crate::appliance::eal::{device_args, memory_arg};

/// Send a flow mix or a pcap on a port, receive what comes back, report.
///
/// The first --port sends; every --port receives. Frames carry a flow id, a
/// sequence number and a timestamp at the end of their IP packet, so the
/// report has lost, reordered, per-endpoint share and latency. The report
/// is JSON on stdout (or in --json FILE); a progress line goes to stderr
/// once a second.
///
/// Examples (no NIC, no hugepages):
///   sluice gen --port net_null0 --dst-mac 02:00:00:00:00:02 --duration 5
///   sluice gen --port net_memif0,role=server,socket=/tmp/lb.sock \
///       --port net_memif1,role=server,socket=/tmp/back.sock \
///       --dst-mac 02:51:00:00:00:01 --vips 20.0.0.1,fd00::20 --dports 80,443 \
///       --proto tcp-syn,udp --flows 10000 --rate 1M --duration 10
///   sluice gen --port net_tap0,iface=gen0 --pcap trace.pcap --pcap-timing
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct GenArgs {
    /// A port to open, as `sluice run` names devices: a PCI address
    /// (0000:3b:00.0) or a virtual device with its arguments (net_memif0,
    /// net_af_packet0,iface=veth0, net_tap0, net_ring0, net_null0, ...).
    /// Repeat for more; the first sends. Devices already opened by EAL
    /// arguments after `--` may be named here without arguments.
    #[arg(long = "port", value_name = "DEVICE", required = true)]
    ports: Vec<String>,

    /// Destination MAC of generated frames (the appliance's port).
    /// Required unless --pcap is given.
    #[arg(long, value_name = "MAC")]
    dst_mac: Option<String>,

    /// Source MAC of generated frames. Default: the sending port's MAC.
    #[arg(long, value_name = "MAC")]
    src_mac: Option<String>,

    /// Number of flows (distinct 5-tuples), 1..=4000000.
    #[arg(long, default_value_t = 1024)]
    flows: u32,

    /// Destination addresses (VIPs), comma separated; IPv4 and IPv6 may be
    /// mixed (flow i goes to VIP i mod count).
    #[arg(long, value_delimiter = ',', default_value = "20.0.0.1", value_name = "IP,...")]
    vips: Vec<IpAddr>,

    /// Destination ports, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "80", value_name = "PORT,...")]
    dports: Vec<u16>,

    /// Transports, comma separated: tcp-syn (SYN only), tcp-data (ACK+PSH
    /// with payload), udp. Flow i uses transport i mod count.
    #[arg(long = "proto", value_delimiter = ',', default_value = "udp", value_name = "KIND,...")]
    protos: Vec<String>,

    /// Frame sizes in bytes including the 4-byte FCS, 64..=1518, comma
    /// separated (flow i uses size i mod count). A frame too small for its
    /// headers and the 20-byte stamp is made just large enough (IPv4 TCP:
    /// 78, IPv6 TCP: 98).
    #[arg(long, value_delimiter = ',', default_value = "64", value_name = "BYTES,...")]
    sizes: Vec<u16>,

    /// Percent of UDP flows sent as two IP fragments per datagram, 0..=100.
    #[arg(long, default_value_t = 0, value_name = "PERCENT")]
    fragments: u8,

    /// Source addresses of IPv4 flows: this address plus 1, 2, ...
    #[arg(long, default_value = "30.0.0.0", value_name = "IPV4")]
    clients_v4: Ipv4Addr,

    /// Source addresses of IPv6 flows: this address plus 1, 2, ...
    #[arg(long, default_value = "fd00:30::", value_name = "IPV6")]
    clients_v6: Ipv6Addr,

    /// Frames per second: a number with an optional k/M/G suffix (250k,
    /// 1.5M), `line` (the sending port's link speed at the mean frame size,
    /// 20 bytes of preamble and gap each), or `max` (as fast as the port
    /// takes them). With --pcap-timing, ignored.
    #[arg(long, default_value = "max", value_name = "PPS|line|max")]
    rate: String,

    /// Seconds to send; then the generator receives for --drain-ms more
    /// and reports. SIGINT or SIGTERM ends sending early.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    duration: f64,

    /// Stop after this many datagrams (frames, except fragmented ones) even
    /// if the duration has not passed.
    #[arg(long, value_name = "N")]
    count: Option<u64>,

    /// Milliseconds to keep receiving after sending stops, for frames in flight.
    #[arg(long, default_value_t = 500, value_name = "MS")]
    drain_ms: u64,

    /// Replay the frames of this pcap (classic libpcap format), looped,
    /// instead of a flow mix. Frames are sent unchanged (no stamp): lost
    /// is then what was sent minus every frame received.
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,

    /// With --pcap: send at the file's own timing (looped) instead of --rate.
    #[arg(long, requires = "pcap")]
    pcap_timing: bool,

    /// With --pcap: read at most this many frames from the file.
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    pcap_max: usize,

    /// How the endpoint of a received frame is told: auto (destination
    /// MAC, or the outer destination address of IPIP / IPv6-in-IP), mac,
    /// or ip (outermost destination address, e.g. for GUE).
    #[arg(long, default_value = "auto", value_name = "auto|mac|ip")]
    endpoint_by: String,

    /// Seconds to wait for every port's link to come up (a memif peer to
    /// connect) before sending.
    #[arg(long, default_value_t = 30.0, value_name = "SECS")]
    wait_link: f64,

    /// After the links are up, also wait (within --wait-link) until the
    /// appliance whose admin endpoint listens at this address answers
    /// `GET /readyz` with 200, so that nothing is sent before it serves.
    #[arg(long, value_name = "HOST:PORT")]
    wait_ready: Option<String>,

    /// Write the JSON report to this file instead of stdout.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,

    /// No progress line.
    #[arg(long, short)]
    quiet: bool,

    #[command(flatten)]
    dpdk: EalFlags,
}

/// The DPDK side of `sluice gen` and `sluice capture`.
#[derive(Debug, clap::Args)]
pub struct EalFlags {
    /// EAL cores (-l). The loop runs on the second core listed, or on the
    /// only one.
    #[arg(long, default_value = "0,1", value_name = "LIST")]
    pub(crate) lcores: String,

    /// EAL memory in MB (-m).
    #[arg(long, default_value_t = 1024, value_name = "MB")]
    pub(crate) memory_mb: u32,

    /// Use hugepages (default: --no-huge). DPDK unlinks their files once
    /// mapped (--huge-unlink), so the pages are freed when the command ends.
    #[arg(long)]
    pub(crate) hugepages: bool,

    /// EAL --file-prefix. Default: sluice-<command>-<pid>.
    #[arg(long, value_name = "NAME")]
    pub(crate) file_prefix: Option<String>,

    /// Mbufs in the packet pool.
    #[arg(long, default_value_t = 16383)]
    pub(crate) mbufs: u32,

    /// Receive and transmit descriptors per queue.
    #[arg(long, default_value_t = 1024)]
    pub(crate) descriptors: u16,

    /// More EAL arguments (after `--`), as they are.
    #[arg(last = true, value_name = "EAL_ARGS")]
    pub(crate) eal: Vec<String>,
}

/// Parses a rate: a number with an optional k/M/G suffix.
fn parse_pps(s: &str) -> Result<u64> {
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1e3),
        Some('m' | 'M') => (&s[..s.len() - 1], 1e6),
        Some('g' | 'G') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num.trim().parse().with_context(|| format!("--rate {s:?}: not a number, `line` or `max`"))?;
    let pps = v * mult;
    if !(1.0..=1e10).contains(&pps) {
        bail!("--rate {s:?}: out of range (1 to 10G frames per second)");
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // checked range
    Ok(pps.round() as u64)
}

/// Parses `aa:bb:cc:dd:ee:ff`.
fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        bail!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)");
    }
    let mut m = [0u8; 6];
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).with_context(|| format!("{s:?} is not a MAC address"))?;
    }
    Ok(m)
}

fn parse_kind(s: &str) -> Result<Kind> {
    Ok(match s.trim() {
        "tcp-syn" | "syn" => Kind::TcpSyn,
        "tcp-data" | "tcp" => Kind::TcpData,
        "udp" => Kind::Udp,
        other => bail!("--proto {other:?}: one of tcp-syn, tcp-data, udp"),
    })
}

fn parse_endpoint_by(s: &str) -> Result<EndpointBy> {
    Ok(match s {
        "auto" => EndpointBy::Auto,
        "mac" => EndpointBy::Mac,
        "ip" => EndpointBy::OuterIp,
        other => bail!("--endpoint-by {other:?}: one of auto, mac, ip"),
    })
}

/// The EAL arguments that open `ports` (device specs) with `d`; `what`
/// names the default file prefix.
pub fn eal_args(d: &EalFlags, ports: &[String], what: &str) -> Vec<String> {
    let mut a = vec!["-l".to_owned(), d.lcores.clone(), "-m".to_owned(), d.memory_mb.to_string()];
    a.extend(memory_arg(d.hugepages, &d.eal).map(String::from));
    let prefix = d.file_prefix.clone().unwrap_or_else(|| format!("sluice-{what}-{}", std::process::id()));
    a.push(format!("--file-prefix={prefix}"));
    a.push("--no-telemetry".into());
    let given = d.eal.join(" ");
    let opened_after_dashes = |name: &str| given.contains(name);
    let devices: Vec<&String> = ports.iter().filter(|p| p.contains(',') || !opened_after_dashes(p)).collect();
    if !devices.iter().any(|d| crate::config::is_pci_device(d)) && !given.contains("-a ") && !given.contains("--allow") {
        a.push("--no-pci".into());
    }
    for dev in devices {
        a.extend(device_args(dev));
    }
    a.extend(d.eal.iter().cloned());
    a
}

/// Starts every port of `devices` with one queue each, receiving into a
/// new pool of `d.mbufs`.
pub(crate) fn start_ports(eal: &Eal, d: &EalFlags, devices: &[String], pool_name: &str) -> Result<(Arc<Mempool>, Vec<Port>)> {
    let cache = if d.mbufs >= 4096 { 256 } else { 0 };
    let pool = Mempool::new(eal, pool_name, d.mbufs, cache, DEFAULT_DATA_ROOM)
        .context("creating the packet pool (lower --mbufs, or raise --memory-mb)")?;
    let cfg = PortConfig { rx_desc: d.descriptors, tx_desc: d.descriptors, rss: false, ..PortConfig::default() };
    let mut ports = Vec::new();
    for dev in devices {
        let name = dev.split(',').next().unwrap_or(dev);
        let id = sluice_ffi::port_by_name(eal, name)?;
        let p = Port::start(eal, id, &cfg, &pool).with_context(|| format!("starting port {dev}"))?;
        tracing::info!(port = %p.id(), name = %p.info().name, driver = %p.info().driver, mac = %p.mac()?, "port started");
        ports.push(p);
    }
    Ok((pool, ports))
}

/// Frames of a pcap file, with their offsets from the first (ns).
fn read_pcap(path: &PathBuf, max: usize, room: usize) -> Result<(Vec<Vec<u8>>, Vec<u64>)> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut r = pcap_file::pcap::PcapReader::new(BufReader::new(f))
        .with_context(|| format!("{}: not a pcap file (classic libpcap format)", path.display()))?;
    let (mut frames, mut at) = (Vec::new(), Vec::new());
    let mut first: Option<Duration> = None;
    while let Some(p) = r.next_packet() {
        let p = p.with_context(|| format!("reading {}", path.display()))?;
        if frames.len() >= max {
            tracing::warn!(max, "pcap has more frames than --pcap-max; the rest are left out");
            break;
        }
        if p.data.len() > room || p.data.len() < 14 {
            bail!("{}: frame {} has {} bytes (a frame must be 14..={room})", path.display(), frames.len(), p.data.len());
        }
        let t0 = *first.get_or_insert(p.timestamp);
        at.push(u64::try_from(p.timestamp.saturating_sub(t0).as_nanos()).unwrap_or(u64::MAX));
        frames.push(p.data.into_owned());
    }
    if frames.is_empty() {
        bail!("{}: no frames", path.display());
    }
    Ok((frames, at))
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: f64,
    p99: f64,
    p999: f64,
    min: f64,
    max: f64,
    mean: f64,
    samples: u64,
}

#[derive(Debug, Serialize)]
struct EndpointShare {
    endpoint: String,
    packets: u64,
    share: f64,
}

#[derive(Debug, Serialize)]
struct PortReport {
    device: String,
    driver: String,
    mac: String,
    rx_packets: u64,
    tx_packets: u64,
    rx_missed: u64,
    rx_nombuf: u64,
    tx_errors: u64,
}

/// The report (the JSON `sluice gen` writes).
#[derive(Debug, Serialize)]
struct Report {
    mode: &'static str,
    flows: u32,
    /// Target rate in frames per second (0: as fast as the port takes them;
    /// null: the pcap's own timing).
    target_pps: Option<u64>,
    mean_frame_bytes: f64,
    /// Seconds from the first frame sent to the end of sending.
    seconds: f64,
    sent: u64,
    sent_bytes: u64,
    datagrams: u64,
    received: u64,
    received_bytes: u64,
    lost: u64,
    loss_ratio: f64,
    reordered: u64,
    duplicates: u64,
    unstamped_received: u64,
    unknown_flow: u64,
    tx_full: u64,
    alloc_failed: u64,
    late_skipped: u64,
    clock_skew: u64,
    offered_pps: f64,
    delivered_pps: f64,
    latency_us: Option<Latency>,
    endpoints: Vec<EndpointShare>,
    endpoint_overflow: u64,
    ports: Vec<PortReport>,
    lcore: u32,
    mbufs_in_use_after: u32,
}

fn latency(r: &Receiver) -> Option<Latency> {
    let h = &r.latency;
    if h.is_empty() {
        return None;
    }
    #[allow(clippy::cast_precision_loss)] // nanoseconds as float microseconds
    let us = |ns: u64| ns as f64 / 1000.0;
    Some(Latency {
        p50: us(h.value_at_quantile(0.5)),
        p99: us(h.value_at_quantile(0.99)),
        p999: us(h.value_at_quantile(0.999)),
        min: us(h.min()),
        max: us(h.max()),
        mean: h.mean() / 1000.0,
        samples: h.len(),
    })
}

/// Waits until every port's link is up, or fails after `secs`.
fn wait_links(ports: &[Port], secs: f64, stop: &AtomicBool) -> Result<()> {
    let end = Instant::now() + Duration::from_secs_f64(secs.max(0.0));
    loop {
        let down: Vec<&str> = ports
            .iter()
            .filter(|p| !p.link().map(|l| l.up).unwrap_or(false))
            .map(|p| p.info().name.as_str())
            .collect();
        if down.is_empty() {
            return Ok(());
        }
        if Instant::now() >= end || stop.load(Ordering::Relaxed) {
            bail!("link down after {secs} s on {} (is the peer running?)", down.join(", "));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// True when `GET /readyz` at `addr` answers 200.
fn ready_once(addr: &str) -> bool {
    use std::io::Read;
    let Ok(mut addrs) = std::net::ToSocketAddrs::to_socket_addrs(addr) else { return false };
    let Some(sa) = addrs.next() else { return false };
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&sa, Duration::from_millis(500)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(format!("GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

/// Waits until the appliance at `addr` is ready, or fails at `by`.
fn wait_ready(addr: &str, by: Instant, stop: &AtomicBool) -> Result<()> {
    while !ready_once(addr) {
        if Instant::now() >= by || stop.load(Ordering::Relaxed) {
            bail!("the appliance at {addr} did not answer GET /readyz with 200 in time");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Runs `sluice gen`.
pub fn run(args: &GenArgs) -> Result<ExitCode> {
    if !(args.duration > 0.0 && args.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
    }
    let by = parse_endpoint_by(&args.endpoint_by)?;
    let kinds: Vec<Kind> = args.protos.iter().map(|k| parse_kind(k)).collect::<Result<_>>()?;
    if args.pcap.is_none() && args.dst_mac.is_none() {
        bail!("--dst-mac is required for a flow mix: the MAC of the appliance's port the frames go to");
    }
    let rate = args.rate.trim();
    if args.pcap.is_some() && args.pcap_timing && rate != "max" {
        tracing::warn!("--rate is ignored with --pcap-timing");
    }

    let eal = Eal::init(&eal_args(&args.dpdk, &args.ports, "gen"))?;
    for line in eal.startup_log().lines().filter(|l| !l.trim().is_empty()) {
        tracing::debug!(target: "dpdk", "{line}");
    }
    let room = usize::from(DEFAULT_DATA_ROOM) - 128;
    let (pool, mut ports) = start_ports(&eal, &args.dpdk, &args.ports, "gen_pool")?;
    let own_mac = ports[0].mac()?.0;

    let ToSend { datagrams, flows, mean, recorded } = to_send(args, kinds, own_mac, room)?;
    let frames = core::Plan::new(&datagrams)?;
    drop(datagrams);
    debug_assert!(usize::from(MAX_FRAME) <= room);

    let hz = eal.tsc_hz();
    let target_pps = target_pps(rate, recorded.is_some() && args.pcap_timing, &ports[0], mean)?;

    let stop_signal = stop_on_signals()?;
    wait_until_ready(args, &ports, &stop_signal)?;

    let io = gen_queues(&mut ports, &pool)?;
    let inputs = ports.len();
    let receiver = Receiver::new(flows, hz, by).context("latency histogram")?;
    let drain = args.drain_ms.saturating_mul(hz) / 1000;
    let ctl = Arc::new(Control::default());
    let result: Arc<Mutex<Option<Outcome>>> = Arc::new(Mutex::new(None));
    let job = Job {
        io,
        receiver,
        ctl: Arc::clone(&ctl),
        result: Arc::clone(&result),
        frames,
        recorded,
        hz,
        target_pps,
        flows,
        limit: args.count,
        lanes: Lanes { out: 0, inputs, drain },
    };
    let lcore = drive(&eal, args, job, &ctl, &stop_signal)?;

    let Some(outcome) = result.lock().unwrap_or_else(PoisonError::into_inner).take() else {
        bail!("the generator ended without a result");
    };
    let port_reports = port_reports(&ports)?;
    drop(ports);
    let plan = Plan { stamped: args.pcap.is_none(), flows, target_pps, mean, lcore };
    let report = build_report(outcome, &plan, port_reports, &pool);
    write_report(&report, args.json.as_deref())
}

/// A flag that SIGINT and SIGTERM set, so that a command polling it ends
/// its loop and closes its ports (and counts its mbufs) instead of dying.
pub(crate) fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    Ok(stop)
}

/// Waits for every link (within `--wait-link`) and, with `--wait-ready`,
/// for the appliance to serve, so that nothing is sent into the void; then
/// zeroes the ports' counters so that the report counts this run only.
fn wait_until_ready(args: &GenArgs, ports: &[Port], stop_signal: &AtomicBool) -> Result<()> {
    let ready_by = Instant::now() + Duration::from_secs_f64(args.wait_link.max(0.0));
    wait_links(ports, args.wait_link, stop_signal)?;
    if let Some(addr) = &args.wait_ready {
        wait_ready(addr, ready_by, stop_signal)?;
    }
    for p in ports {
        p.reset_stats()?;
    }
    Ok(())
}

/// Takes queue 0 of every port for receiving and of the first for sending,
/// with `pool` for the frames the generator allocates.
fn gen_queues(ports: &mut [Port], pool: &Arc<Mempool>) -> Result<GenQueues> {
    let mut io = QueueIo::default();
    for p in ports.iter_mut() {
        io.rx.push(p.take_rx_queue(0).context("rx queue 0")?);
    }
    io.tx.push(ports[0].take_tx_queue(0).context("tx queue 0")?);
    Ok(GenQueues { io, pool: Arc::clone(pool) })
}

/// What the loop leaves behind: the generator, the receiver, and the
/// seconds sending lasted.
type Outcome = (Generator, Receiver, f64);

/// Everything the generator loop owns, moved to the lcore it runs on.
struct Job {
    io: GenQueues,
    receiver: Receiver,
    ctl: Arc<Control>,
    /// Where the loop leaves its [`Outcome`] for the main lcore.
    result: Arc<Mutex<Option<Outcome>>>,
    /// The frames to send, laid out for the sender.
    frames: core::Plan,
    /// From a capture: when each frame was recorded (nanoseconds).
    recorded: Option<Vec<u64>>,
    hz: u64,
    target_pps: Option<u64>,
    flows: u32,
    limit: Option<u64>,
    lanes: Lanes,
}

impl Job {
    /// Sends and receives until sending ends and the drain passes, then
    /// closes the queues (so that their mbufs are back in the pool) and
    /// leaves the outcome in `result`.
    fn run(self) {
        let Job { mut io, receiver, ctl, result, frames, recorded, hz, target_pps, flows, limit, lanes } = self;
        let start = sluice_ffi::tsc();
        let timing = timing_for(recorded, target_pps, hz, start);
        let mut gen = Generator::new(frames, flows, timing, limit);
        let mut rx = receiver;
        core::run(&mut io, lanes, &mut gen, &mut rx, &ctl, sluice_ffi::tsc);
        // Sending lasted from `start` to the drain's start.
        #[allow(clippy::cast_precision_loss)]
        let secs = (sluice_ffi::tsc().saturating_sub(start).saturating_sub(lanes.drain)) as f64 / hz as f64;
        drop(io);
        *result.lock().unwrap_or_else(PoisonError::into_inner) = Some((gen, rx, secs));
    }
}

/// When frames are due from TSC tick `start`: at the capture's own pace
/// when `recorded` is given and there is no target rate (one pass lasting
/// the capture plus its mean gap), else at `target_pps` (0: no pacing).
fn timing_for(recorded: Option<Vec<u64>>, target_pps: Option<u64>, hz: u64, start: u64) -> Timing {
    match (recorded, target_pps) {
        (Some(at), None) => {
            let ticks: Vec<u64> =
                at.iter().map(|ns| u64::try_from(u128::from(*ns) * u128::from(hz) / 1_000_000_000).unwrap_or(u64::MAX)).collect();
            // One pass lasts as long as the capture plus its mean gap.
            let last = ticks.last().copied().unwrap_or(0);
            let gap = last / (ticks.len() as u64).max(1);
            Timing::Recorded(Schedule::new(ticks, last + gap.max(1), start))
        }
        (_, pps) => Timing::Rate(Pacer::new(hz, pps.unwrap_or(0), start, 4096)),
    }
}

/// Runs `job` on the first worker lcore while this thread watches it (or,
/// with no worker, on the main lcore while a thread watches), and returns
/// the lcore it ran on. Watching sleeps; waiting for an lcore spins.
fn drive(eal: &Eal, args: &GenArgs, job: Job, ctl: &Arc<Control>, stop_signal: &Arc<AtomicBool>) -> Result<LcoreId> {
    let worker = eal.worker_lcores().first().copied();
    let lcore = worker.unwrap_or_else(|| eal.main_lcore());
    tracing::info!(%lcore, flows = job.flows, datagrams = job.frames.datagrams(), target_pps = ?job.target_pps, "generating");
    let (duration, quiet) = (args.duration, args.quiet);
    match worker {
        Some(l) => {
            let task = eal.launch(l, Arc::new(AtomicBool::new(false)), move |_| {
                job.run();
                0
            })?;
            // Watch from here, sleeping: waiting for the lcore spins.
            watch(ctl, stop_signal, duration, quiet);
            let rc = task.wait()?;
            if rc != 0 {
                bail!("the generator task on lcore {l} failed ({rc})");
            }
        }
        None => {
            let watcher = {
                let (ctl, stop_signal) = (Arc::clone(ctl), Arc::clone(stop_signal));
                std::thread::spawn(move || watch(&ctl, &stop_signal, duration, quiet))
            };
            job.run();
            let _ = watcher.join();
        }
    }
    Ok(lcore)
}

/// Each port's counters at the end of the run.
fn port_reports(ports: &[Port]) -> Result<Vec<PortReport>> {
    ports
        .iter()
        .map(|p| {
            let s = p.stats()?;
            Ok(PortReport {
                device: p.info().name.clone(),
                driver: p.info().driver.clone(),
                mac: p.mac()?.to_string(),
                rx_packets: s.ipackets,
                tx_packets: s.opackets,
                rx_missed: s.imissed,
                rx_nombuf: s.rx_nombuf,
                tx_errors: s.oerrors,
            })
        })
        .collect::<Result<Vec<_>>>()
}

/// How the run was set up, as the report repeats it.
#[derive(Debug)]
struct Plan {
    /// A flow mix (frames carry stamps), not a pcap.
    stamped: bool,
    flows: u32,
    target_pps: Option<u64>,
    mean: f64,
    lcore: LcoreId,
}

/// The report of a finished run from the loop's `outcome` and the ports'
/// counters; `pool` is read last, with the ports closed, for leaked mbufs.
fn build_report(outcome: Outcome, plan: &Plan, port_reports: Vec<PortReport>, pool: &Mempool) -> Report {
    let (gen, rx, secs) = outcome;
    let c = gen.counters;
    let stamped = plan.stamped;
    let received = if stamped { rx.received } else { rx.received + rx.unstamped };
    let lost = c.sent.saturating_sub(received);
    #[allow(clippy::cast_precision_loss)]
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let per_sec = |n: u64| if secs > 0.0 { ratio(n, 1) / secs } else { 0.0 };
    let endpoints = rx
        .endpoints()
        .into_iter()
        .map(|(e, n)| EndpointShare { endpoint: e.to_string(), packets: n, share: ratio(n, rx.received) })
        .collect();
    Report {
        mode: if stamped { "mix" } else { "pcap" },
        flows: plan.flows,
        target_pps: plan.target_pps,
        mean_frame_bytes: plan.mean,
        seconds: secs,
        sent: c.sent,
        sent_bytes: c.sent_bytes,
        datagrams: c.datagrams,
        received,
        received_bytes: rx.received_bytes,
        lost,
        loss_ratio: ratio(lost, c.sent),
        reordered: rx.reordered,
        duplicates: rx.duplicates,
        unstamped_received: rx.unstamped,
        unknown_flow: rx.unknown_flow,
        tx_full: c.tx_full,
        alloc_failed: c.alloc_failed,
        late_skipped: gen.skipped(),
        clock_skew: rx.clock_skew,
        offered_pps: per_sec(c.sent),
        delivered_pps: per_sec(received),
        latency_us: latency(&rx),
        endpoints,
        endpoint_overflow: rx.endpoint_overflow(),
        ports: port_reports,
        lcore: plan.lcore.0,
        mbufs_in_use_after: pool.in_use(),
    }
}

/// Writes `report` as JSON to `path` (or stdout); the exit code is 1 when
/// mbufs leaked.
fn write_report(report: &Report, path: Option<&Path>) -> Result<ExitCode> {
    let json = serde_json::to_string_pretty(report)?;
    match path {
        Some(path) => std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{json}")?;
        }
    }
    if report.mbufs_in_use_after != 0 {
        tracing::error!(in_use = report.mbufs_in_use_after, "mbuf leak");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// What to send: the datagrams, how many flows they make, their mean
/// frame size and, from a capture, when each was recorded (nanoseconds).
struct ToSend {
    datagrams: Vec<Datagram>,
    flows: u32,
    mean: f64,
    recorded: Option<Vec<u64>>,
}

/// The frames of `--pcap`, or the flow mix the arguments describe.
fn to_send(args: &GenArgs, kinds: Vec<Kind>, own_mac: [u8; 6], room: usize) -> Result<ToSend> {
    if let Some(path) = &args.pcap {
        let (frames, at) = read_pcap(path, args.pcap_max, room)?;
        let flows = u32::try_from(frames.len()).context("too many pcap frames")?;
        let datagrams: Vec<Datagram> = frames.into_iter().zip(0u32..).map(|(f, i)| mix::raw(i, f)).collect();
        let mean = mix::mean_frame_size(&datagrams);
        return Ok(ToSend { datagrams, flows, mean, recorded: Some(at) });
    }
    let spec = MixSpec {
        flows: args.flows,
        vips: args.vips.clone(),
        ports: args.dports.clone(),
        kinds,
        sizes: args.sizes.clone(),
        fragment_percent: args.fragments,
        src_mac: match &args.src_mac {
            Some(m) => parse_mac(m)?,
            None => own_mac,
        },
        dst_mac: parse_mac(args.dst_mac.as_deref().unwrap_or_default())?,
        client_v4: args.clients_v4,
        client_v6: args.clients_v6,
    };
    let datagrams = core::build(&spec)?;
    let mean = mix::mean_frame_size(&datagrams);
    Ok(ToSend { datagrams, flows: args.flows, mean, recorded: None })
}

/// Frames per second to send (`Some(0)`: as fast as the port takes them;
/// `None`: at the capture's own pace, `recorded_pace`), from `--rate`:
/// `max`, `line` (the link speed of `port` at frames of `mean` bytes) or a
/// number.
fn target_pps(rate: &str, recorded_pace: bool, port: &Port, mean: f64) -> Result<Option<u64>> {
    Ok(match rate {
        _ if recorded_pace => None,
        "max" => Some(0),
        "line" => {
            let speed = port.link()?.speed_mbps;
            if speed == 0 {
                bail!("--rate line: port {} reports no link speed; give a rate in frames per second", port.info().name);
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
            let pps = (f64::from(speed) * 1e6 / ((mean + 20.0) * 8.0)) as u64;
            Some(pps)
        }
        r => Some(parse_pps(r)?),
    })
}

/// Ends sending after `duration` or at a signal, and prints progress once
/// a second, until the loop has returned.
fn watch(ctl: &Control, signal: &AtomicBool, duration: f64, quiet: bool) {
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(duration);
    let mut last = (start, 0u64, 0u64);
    let mut next_line = start + Duration::from_secs(1);
    while !ctl.finished.load(Ordering::Acquire) {
        let now = Instant::now();
        if now >= end || signal.load(Ordering::Relaxed) {
            ctl.stop_tx.store(true, Ordering::Relaxed);
        }
        if !quiet && now >= next_line {
            let (sent, recv) = (ctl.sent.load(Ordering::Relaxed), ctl.received.load(Ordering::Relaxed));
            let dt = (now - last.0).as_secs_f64();
            #[allow(clippy::cast_precision_loss)]
            let rate = |a: u64, b: u64| (a.saturating_sub(b)) as f64 / dt / 1e6;
            eprintln!(
                "gen {:6.1}s  sent {sent:>12} ({:7.3} Mpps)  received {recv:>12} ({:7.3} Mpps)  not back {:>10}  tx-full {}{}",
                (now - start).as_secs_f64(),
                rate(sent, last.1),
                rate(recv, last.2),
                sent.saturating_sub(recv),
                ctl.tx_full.load(Ordering::Relaxed),
                if ctl.tx_done.load(Ordering::Relaxed) { "  (draining)" } else { "" },
            );
            last = (now, sent, recv);
            next_line += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_pps("250k").unwrap(), 250_000);
        assert_eq!(parse_pps("1.5M").unwrap(), 1_500_000);
        assert_eq!(parse_pps("1000").unwrap(), 1000);
        assert!(parse_pps("0").is_err());
        assert!(parse_pps("fast").is_err());
    }

    #[test]
    fn macs_and_kinds() {
        assert_eq!(parse_mac("02:51:00:00:00:0a").unwrap(), [2, 0x51, 0, 0, 0, 10]);
        assert!(parse_mac("02:51:00:00:00").is_err());
        assert!(parse_mac("02:51:00:00:00:zz").is_err());
        assert_eq!(parse_kind("tcp-syn").unwrap(), Kind::TcpSyn);
        assert!(parse_kind("icmp").is_err());
    }
}
