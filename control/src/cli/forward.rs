//! `sluice forward`: every packet received on one port goes out of the
//! other, unchanged (DPDK's "io" forwarding). It proves the bindings end to
//! end and is the speed baseline the load balancer is measured against.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use sluice_dataplane::io::Burst;
use sluice_ffi::{Eal, LcoreId, LcoreTask, Mempool, Port, PortConfig, PortId, RxQueue, TxQueue, DEFAULT_DATA_ROOM};

use super::gen::stop_on_signals;

/// Forward every packet between two ports unchanged (io mode).
///
/// Runs on the first worker lcore (or the main one when there is no worker)
/// until the duration ends or SIGINT/SIGTERM arrives, then prints the rate
/// measured after the warm-up, and checks that every mbuf came back.
///
/// Example (no NIC, no hugepages):
///   sluice forward --duration 5 -- --no-huge -m 1024 --no-pci -l 0,1 --vdev=net_null0 --vdev=net_null1
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct ForwardArgs {
    /// The two ports, by DPDK device name (e.g. net_null0,net_null1 or PCI
    /// addresses). Default: the first two ports the EAL found.
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    ports: Vec<String>,

    /// Stop after this many seconds. Default: run until SIGINT or SIGTERM.
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,

    /// Seconds at the start that the measured rate leaves out.
    #[arg(long, default_value_t = 1.0, value_name = "SECS")]
    warmup: f64,

    /// Mbufs in the packet pool.
    #[arg(long, default_value_t = 8191)]
    pool_size: u32,

    /// Receive and transmit descriptors per queue.
    #[arg(long, default_value_t = 1024)]
    descriptors: u16,

    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,

    /// DPDK EAL arguments (after `--`).
    #[arg(last = true, value_name = "EAL_ARGS")]
    eal: Vec<String>,
}

#[derive(Debug, Serialize)]
struct PortReport {
    name: String,
    rx_packets: u64,
    tx_packets: u64,
    rx_missed: u64,
    rx_nombuf: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    /// Packets sent on both ports during the measured interval.
    packets: u64,
    /// Length of the measured interval.
    seconds: f64,
    /// Million packets per second forwarded (both directions together).
    mpps: f64,
    /// Packets the worker freed because a transmit queue was full.
    tx_dropped: u64,
    /// Lcore that forwarded.
    lcore: u32,
    /// Mbufs not back in the pool after the ports were closed (should be 0).
    mbufs_in_use_after: u32,
    ports: Vec<PortReport>,
}

fn resolve_ports(eal: &Eal, names: &[String]) -> Result<[PortId; 2]> {
    let ids: Vec<PortId> = if names.is_empty() {
        sluice_ffi::ports(eal)
    } else {
        names.iter().map(|n| sluice_ffi::port_by_name(eal, n)).collect::<Result<_, _>>()?
    };
    match ids.as_slice() {
        [a, b] | [a, b, ..] if names.is_empty() || ids.len() == 2 => {
            if a == b {
                bail!("--ports names the same port twice");
            }
            Ok([*a, *b])
        }
        _ if !names.is_empty() => bail!("--ports takes exactly two port names, got {}", names.len()),
        _ => bail!(
            "forwarding needs two ports and the EAL found {}; add devices with --vdev=... or -a <PCI> after `--`",
            ids.len()
        ),
    }
}

/// One direction's queues.
struct Lane {
    rx: RxQueue,
    tx: TxQueue,
}

fn forward_loop(mut lanes: [Lane; 2], stop: &AtomicBool, dropped: &AtomicU64) {
    let mut burst = Burst::new();
    let mut lost = 0u64;
    while !stop.load(Ordering::Relaxed) {
        for lane in &mut lanes {
            if lane.rx.rx_burst(&mut burst) > 0 {
                let n = burst.len();
                lost += (n - lane.tx.tx_burst(&mut burst)) as u64;
            }
        }
    }
    dropped.store(lost, Ordering::Relaxed);
}

fn sum_tx(ports: &[Port; 2]) -> Result<u64> {
    Ok(ports[0].stats()?.opackets + ports[1].stats()?.opackets)
}

/// Runs `sluice forward`.
pub fn run(args: &ForwardArgs) -> Result<ExitCode> {
    if args.eal.is_empty() {
        bail!("no EAL arguments: pass them after `--`, e.g. `sluice forward -- --no-huge -m 1024 --no-pci -l 0,1 --vdev=net_null0 --vdev=net_null1`");
    }
    if args.warmup < 0.0 || args.duration.is_some_and(|d| d <= args.warmup) {
        bail!("--duration must be longer than --warmup ({}s)", args.warmup);
    }
    let eal = Eal::init(&args.eal)?;
    for line in eal.startup_log().lines().filter(|l| !l.trim().is_empty()) {
        tracing::debug!(target: "dpdk", "{line}");
    }
    let [a, b] = resolve_ports(&eal, &args.ports)?;
    let pool = Mempool::new(&eal, "forward_pool", args.pool_size, 256, DEFAULT_DATA_ROOM)
        .context("creating the packet pool (lower --pool-size, or give the EAL more memory with -m)")?;
    let cfg = PortConfig { rx_desc: args.descriptors, tx_desc: args.descriptors, ..PortConfig::default() };
    let mut ports = [Port::start(&eal, a, &cfg, &pool)?, Port::start(&eal, b, &cfg, &pool)?];
    for p in &ports {
        tracing::info!(port = %p.id(), name = %p.info().name, driver = %p.info().driver, mac = %p.mac()?, "port started");
    }
    let lanes = crossed_lanes(&mut ports)?;

    let stop = stop_on_signals()?;
    let dropped = Arc::new(AtomicU64::new(0));
    let (lcore, task) = launch(&eal, args, lanes, &stop, &dropped)?;
    tracing::info!(%lcore, ports = %format!("{a}<->{b}"), "forwarding; SIGINT or SIGTERM stops");

    let (t0, c0, t1, c1) = if task.is_some() {
        sleep_unless(&stop, args.warmup);
        let (t0, c0) = (Instant::now(), sum_tx(&ports)?);
        match args.duration {
            Some(d) => sleep_unless(&stop, d - args.warmup),
            None => sleep_unless(&stop, f64::INFINITY),
        }
        (t0, c0, Instant::now(), sum_tx(&ports)?)
    } else {
        // Forwarding ran inline to the end; measure over the whole run.
        let now = Instant::now();
        (now, 0, now, sum_tx(&ports)?)
    };
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = task {
        t.wait()?;
    }
    let seconds = (t1 - t0).as_secs_f64();
    let packets = c1 - c0;
    let port_reports = port_reports(&ports)?;
    drop(ports);
    let report = Report {
        packets,
        seconds,
        mpps: if seconds > 0.0 { packets as f64 / seconds / 1e6 } else { 0.0 },
        tx_dropped: dropped.load(Ordering::Relaxed),
        lcore: lcore.0,
        mbufs_in_use_after: pool.in_use(),
        ports: port_reports,
    };
    print_report(&report, args.json)
}

/// Takes queue 0 of both ports and crosses them: what `ports[0]` receives
/// goes out of `ports[1]`, and the other way.
fn crossed_lanes(ports: &mut [Port; 2]) -> Result<[Lane; 2]> {
    let take = |p: &mut Port| -> Result<(RxQueue, TxQueue)> {
        Ok((p.take_rx_queue(0).context("rx queue 0")?, p.take_tx_queue(0).context("tx queue 0")?))
    };
    let (arx, atx) = take(&mut ports[0])?;
    let (brx, btx) = take(&mut ports[1])?;
    Ok([Lane { rx: arx, tx: btx }, Lane { rx: brx, tx: atx }])
}

/// Starts forwarding `lanes` on the first worker lcore and returns that
/// lcore and its task; with no worker, forwards on the main lcore to the
/// end (a helper thread ends it at `--duration`) and returns no task.
fn launch(eal: &Eal, args: &ForwardArgs, lanes: [Lane; 2], stop: &Arc<AtomicBool>, dropped: &Arc<AtomicU64>) -> Result<(LcoreId, Option<LcoreTask>)> {
    match eal.worker_lcores().first().copied() {
        Some(l) => {
            let dropped = Arc::clone(dropped);
            let task = eal.launch(l, Arc::clone(stop), move |stop| {
                forward_loop(lanes, stop, &dropped);
                0
            })?;
            Ok((l, Some(task)))
        }
        None => {
            let lcore = eal.main_lcore();
            tracing::warn!("no worker lcore (-l lists one core): forwarding on the main lcore");
            let (stop2, dropped2) = (Arc::clone(stop), Arc::clone(dropped));
            // The timer below runs on a helper thread instead.
            std::thread::spawn({
                let stop = Arc::clone(stop);
                let (warmup, duration) = (args.warmup, args.duration);
                move || timer(&stop, warmup, duration)
            });
            forward_loop(lanes, &stop2, &dropped2);
            Ok((lcore, None))
        }
    }
}

/// Each port's counters at the end of the run.
fn port_reports(ports: &[Port; 2]) -> Result<Vec<PortReport>> {
    ports
        .iter()
        .map(|p| {
            let s = p.stats()?;
            Ok(PortReport {
                name: p.info().name.clone(),
                rx_packets: s.ipackets,
                tx_packets: s.opackets,
                rx_missed: s.imissed,
                rx_nombuf: s.rx_nombuf,
            })
        })
        .collect::<Result<Vec<_>>>()
}

/// Prints `report` (one JSON object with `json`, lines otherwise) on
/// stdout; the exit code is 1 when mbufs leaked.
fn print_report(report: &Report, json: bool) -> Result<ExitCode> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!(
            "forwarded {} packets in {:.3} s: {:.2} Mpps on lcore {} ({} dropped at tx)",
            report.packets, report.seconds, report.mpps, report.lcore, report.tx_dropped
        );
        for p in &report.ports {
            println!(
                "  {}: rx {} tx {} missed {} no-mbuf {}",
                p.name, p.rx_packets, p.tx_packets, p.rx_missed, p.rx_nombuf
            );
        }
        println!("  mbufs still in use after close: {}", report.mbufs_in_use_after);
    }
    if report.mbufs_in_use_after != 0 {
        tracing::error!(in_use = report.mbufs_in_use_after, "mbuf leak");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

fn sleep_unless(stop: &AtomicBool, secs: f64) {
    let end = (secs.is_finite()).then(|| Instant::now() + Duration::from_secs_f64(secs.max(0.0)));
    while !stop.load(Ordering::Relaxed) {
        let step = match end {
            Some(e) => {
                let now = Instant::now();
                if now >= e {
                    return;
                }
                (e - now).min(Duration::from_millis(50))
            }
            None => Duration::from_millis(50),
        };
        std::thread::sleep(step);
    }
}

fn timer(stop: &AtomicBool, warmup: f64, duration: Option<f64>) {
    match duration {
        Some(d) => {
            sleep_unless(stop, d.max(warmup));
            stop.store(true, Ordering::Relaxed);
        }
        None => sleep_unless(stop, f64::INFINITY),
    }
}
