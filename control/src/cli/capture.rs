//! `sluice capture`: writes what a DPDK port receives to a pcap file
//! (classic libpcap format, readable by tshark and tcpdump), up to a count,
//! optionally only frames to or from given VIPs.
//!
//! It opens its port as `sluice run` and `sluice gen` do (a PCI device, or a
//! virtual device such as net_af_packet on a mirror interface, net_memif,
//! net_pcap), polls it on the main lcore and writes each kept frame with a
//! timestamp taken from the TSC. Frames the port could not take (no
//! descriptor, no mbuf) are DPDK's counters, reported at the end; every mbuf
//! is freed after its frame is written or filtered out.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::{DataLink, Endianness, TsResolution};
use serde::Serialize;
use sluice_dataplane::addr::Addr;
use sluice_dataplane::io::Burst;
use sluice_dataplane::parse::{parse, parse_ip, proto, Frame};
use sluice_ffi::{Eal, RxQueue};

use super::gen::{eal_args, start_ports, stop_on_signals, EalFlags};

/// Write what a port receives to a pcap file.
///
/// Examples:
///   sluice capture --port net_af_packet0,iface=mirror0 -w vip.pcap --vip 20.0.0.1 -c 1000
///   sluice capture --port net_memif0,role=client,socket=/tmp/lb.sock -w all.pcap --duration 10
///   tshark -r vip.pcap
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct CaptureArgs {
    /// The port to capture on, as `sluice run` names devices (PCI address
    /// or virtual device with its arguments).
    #[arg(long, value_name = "DEVICE")]
    port: String,

    /// The pcap file to write.
    #[arg(long, short = 'w', value_name = "FILE")]
    out: PathBuf,

    /// Stop after this many frames are written (0: no limit).
    #[arg(long, short = 'c', default_value_t = 1000, value_name = "N")]
    count: u64,

    /// Keep only frames whose source or destination address is one of
    /// these, outside or inside IP-in-IP (comma separated). Default: every
    /// frame.
    #[arg(long = "vip", value_delimiter = ',', value_name = "IP,...")]
    vips: Vec<IpAddr>,

    /// Stop after this many seconds. Default: at the count, or SIGINT/SIGTERM.
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,

    /// Bytes of each frame written, at most (the rest is cut; the pcap
    /// records the original length).
    #[arg(long, default_value_t = 65535, value_name = "BYTES")]
    snaplen: u32,

    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    dpdk: EalFlags,
}

/// True when `frame` is IP to or from one of `vips` (outer header, or the
/// inner one of IPIP / IPv6-in-IP), or `vips` is empty.
pub(crate) fn keep(frame: &[u8], vips: &[Addr]) -> bool {
    if vips.is_empty() {
        return true;
    }
    let Ok(Frame::Ip(p)) = parse(frame) else { return false };
    if vips.contains(&p.flow.src) || vips.contains(&p.flow.dst) {
        return true;
    }
    if matches!(p.flow.proto, proto::IPIP | proto::IPV6) {
        if let Ok(inner) = parse_ip(frame, usize::from(p.l4)) {
            return vips.contains(&inner.flow.src) || vips.contains(&inner.flow.dst);
        }
    }
    false
}

#[derive(Debug, Serialize)]
struct Summary {
    file: String,
    written: u64,
    filtered_out: u64,
    received: u64,
    port_rx_missed: u64,
    port_rx_nombuf: u64,
    seconds: f64,
    mbufs_in_use_after: u32,
}

/// Runs `sluice capture`.
pub fn run(args: &CaptureArgs) -> Result<ExitCode> {
    if args.snaplen == 0 {
        bail!("--snaplen must be at least 1");
    }
    let vips: Vec<Addr> = args.vips.iter().map(|v| Addr::from(*v)).collect();
    let ports = [args.port.clone()];
    let eal = Eal::init(&eal_args(&args.dpdk, &ports, "capture"))?;
    let (pool, mut ports) = start_ports(&eal, &args.dpdk, &ports, "capture_pool")?;
    let mut rxq = ports[0].take_rx_queue(0).context("rx queue 0")?;
    let mut w = pcap_writer(args)?;

    let stop = stop_on_signals()?;
    let hz = u128::from(eal.tsc_hz().max(1));
    let counts = poll(args, &vips, &mut rxq, &mut w, &ports[0].info().name, hz, &stop)?;
    let mut out = w.into_writer();
    out.flush().with_context(|| format!("writing {}", args.out.display()))?;
    drop(out);
    let stats = ports[0].stats()?;
    drop(rxq);
    ports.clear();
    let summary = Summary {
        file: args.out.display().to_string(),
        written: counts.written,
        filtered_out: counts.filtered,
        received: counts.received,
        port_rx_missed: stats.imissed,
        port_rx_nombuf: stats.rx_nombuf,
        seconds: counts.start.elapsed().as_secs_f64(),
        mbufs_in_use_after: pool.in_use(),
    };
    report(&summary, args.json)
}

/// Creates `--out` and writes the pcap header: Ethernet frames, nanosecond
/// timestamps, this machine's byte order, `--snaplen`.
fn pcap_writer(args: &CaptureArgs) -> Result<PcapWriter<BufWriter<File>>> {
    let file = File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let header = PcapHeader {
        snaplen: args.snaplen,
        datalink: DataLink::ETHERNET,
        ts_resolution: TsResolution::NanoSecond,
        endianness: Endianness::native(),
        ..PcapHeader::default()
    };
    PcapWriter::with_header(BufWriter::new(file), header).context("writing the pcap header")
}

/// What the poll loop counted, and when it began.
struct Counts {
    written: u64,
    filtered: u64,
    received: u64,
    start: Instant,
}

/// Polls `rxq` until `--count` frames are written, `--duration` passes or
/// `stop` is set, writing each frame `keep` accepts to `w`. Timestamps are
/// the wall clock at the start plus the TSC ticks since (at `hz`), which is
/// cheaper per burst than reading the wall clock. Every mbuf is freed.
fn poll(
    args: &CaptureArgs,
    vips: &[Addr],
    rxq: &mut RxQueue,
    w: &mut PcapWriter<BufWriter<File>>,
    port: &str,
    hz: u128,
    stop: &AtomicBool,
) -> Result<Counts> {
    let wall0 = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let (tsc0, start) = (sluice_ffi::tsc(), Instant::now());
    let end = args.duration.map(|d| start + Duration::from_secs_f64(d.max(0.0)));
    let snap = usize::try_from(args.snaplen).unwrap_or(usize::MAX);
    let (mut written, mut filtered, mut received) = (0u64, 0u64, 0u64);
    let mut burst = Burst::new();
    tracing::info!(port = %port, file = %args.out.display(), count = args.count, "capturing; SIGINT or SIGTERM stops");
    'poll: while !stop.load(Ordering::Relaxed) && end.is_none_or(|e| Instant::now() < e) {
        if rxq.rx_burst(&mut burst) == 0 {
            // Nothing: a short nap (the receive ring holds what comes meanwhile).
            std::thread::sleep(Duration::from_micros(50));
            continue;
        }
        let ticks = u128::from(sluice_ffi::tsc().saturating_sub(tsc0));
        let at = wall0 + Duration::from_nanos(u64::try_from(ticks * 1_000_000_000 / hz).unwrap_or(u64::MAX));
        for m in burst.drain(..) {
            received += 1;
            let data = m.data();
            if args.count != 0 && written >= args.count {
                continue;
            }
            if !keep(data, vips) {
                filtered += 1;
                continue;
            }
            let orig = u32::try_from(data.len()).unwrap_or(u32::MAX);
            w.write_packet(&PcapPacket::new(at, orig, &data[..data.len().min(snap)]))
                .with_context(|| format!("writing {}", args.out.display()))?;
            written += 1;
        }
        if args.count != 0 && written >= args.count {
            break 'poll;
        }
    }
    Ok(Counts { written, filtered, received, start })
}

/// Prints `summary` (JSON on stdout with `json`, a line on stderr
/// otherwise); the exit code is 1 when mbufs leaked.
fn report(summary: &Summary, json: bool) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string(summary)?);
    } else {
        eprintln!(
            "capture: {} frames written to {} ({} received, {} filtered out; port missed {}, no mbuf {})",
            summary.written, summary.file, summary.received, summary.filtered_out, summary.port_rx_missed, summary.port_rx_nombuf
        );
    }
    if summary.mbufs_in_use_after != 0 {
        tracing::error!(in_use = summary.mbufs_in_use_after, "mbuf leak");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_dataplane::craft;
    use sluice_dataplane::parse::ethertype;

    #[test]
    fn vip_filter_sees_outer_and_inner_addresses() {
        let vip: Addr = "20.0.0.1".parse::<IpAddr>().unwrap().into();
        let to = craft::frame_v4(&[], [1, 1, 1, 1], [20, 0, 0, 1], proto::UDP, &craft::udp(1, 2, b"x"));
        let from = craft::frame_v4(&[], [20, 0, 0, 1], [1, 1, 1, 1], proto::UDP, &craft::udp(1, 2, b"x"));
        let other = craft::frame_v4(&[], [1, 1, 1, 1], [20, 0, 0, 2], proto::UDP, &craft::udp(1, 2, b"x"));
        let ipip = craft::ether(&[], ethertype::IPV4, &craft::ipv4([9, 9, 9, 9], [10, 0, 0, 9], proto::IPIP, &to[14..]));
        let arp = craft::ether(&[], ethertype::ARP, &[0u8; 28]);
        assert!(keep(&to, &[vip]) && keep(&from, &[vip]) && keep(&ipip, &[vip]));
        assert!(!keep(&other, &[vip]) && !keep(&arp, &[vip]));
        assert!(keep(&other, &[]) && keep(&arp, &[]), "no filter keeps everything");
    }
}
