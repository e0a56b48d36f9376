//! Stopping and starting whatever the control side is doing: a stop during
//! a compilation abandons it (nothing is published after "stopping"), and
//! a configuration path that is not a regular file (a FIFO) is refused at
//! once instead of blocking the start. Each appliance runs in a namespace
//! of its own (its admin port is private) on net_null ports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sluice_tests::{privileged, sluice_bin, wait_until, Netns, Proc};

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A machine section on net_null ports, with room for big tables.
fn machine(prefix: &str) -> String {
    format!(
        r#"dpdk: {{lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: {prefix}, mbufs: 4095, descriptors: 512}}
ports:
  - {{name: front, device: "net_null0,no-rx=1", addresses: [10.100.0.1/24], kernelInterface: ""}}
  - {{name: back, device: "net_null1,no-rx=1", addresses: [10.200.0.1/16], kernelInterface: ""}}
capacity: {{services: 4096, endpoints: 65536, tableMemoryMB: 4096}}
"#
    )
}

/// `n` services of 8 endpoints (with static MACs: nothing to resolve) and
/// tables of `table` slots, each with a route.
fn services(n: usize, table: u32) -> String {
    let mut s = String::from("services:\n");
    for i in 0..n {
        s.push_str(&format!("  - name: s{i}\n    endpointLimit: 8\n    tableSize: {table}\n    endpoints:\n"));
        for e in 0..8 {
            let k = i * 8 + e;
            s.push_str(&format!("      - {{id: {e}, address: 10.200.{}.{}, mac: \"02:00:00:00:{:02x}:{:02x}\"}}\n", k / 250, 1 + k % 250, k / 250, k % 250));
        }
    }
    s.push_str("routes:\n");
    for i in 0..n {
        s.push_str(&format!("  - {{name: r{i}, service: s{i}, vips: [20.0.{}.{}], protocols: [TCP], destinationPorts: [\"80\"]}}\n", i / 250, 1 + i % 250));
    }
    s
}

fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Starts the appliance with its log (stderr) in `log`.
fn start(ns: &Netns, cfg: &Path, log: &Path, filter: &str) -> Proc {
    let cmd = format!("exec {} --log {filter} run --config {} 2> {}", sluice_bin().display(), cfg.display(), log.display());
    ns.spawn(&["sh", "-c", &cmd])
}

fn read(log: &Path) -> String {
    std::fs::read_to_string(log).unwrap_or_default()
}

/// A reload that compiles hundreds of big tables is in flight when SIGTERM
/// comes: the appliance stops at once, and publishes nothing after it said
/// it stops.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_stop_during_a_compilation_abandons_it_and_publishes_nothing_after_stopping() {
    privileged();
    let ns = Netns::new("stc");
    let dir = tempdir("stop-compile");
    let (cfg, log) = (dir.join("appliance.yaml"), dir.join("sluice.log"));
    let prefix = format!("stc{}", std::process::id());
    write(&cfg, &format!("{}{}", machine(&prefix), services(1, 524_287)));
    let mut lb = start(&ns, &cfg, &log, "info,sluice::reconcile=debug");
    if !wait_until(Duration::from_secs(60), || read(&log).contains("running; SIGHUP")) {
        panic!("the appliance did not start:\n{}", read(&log));
    }
    // One big table took this long at start: the reload below compiles
    // enough of them to take 30 times as long.
    let first = read(&log);
    let compile_us: u64 = first
        .lines()
        .find(|l| l.contains("snapshot published"))
        .and_then(|l| l.split("compile_us=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("the start's publication says how long it compiled");
    let n = usize::try_from((30 * 1_000_000 / compile_us.max(1)).clamp(40, 1500)).unwrap();
    eprintln!("one table of 524,287 slots compiled in {compile_us} us at start: the reload compiles {n}");
    let before = first.len();
    write(&cfg, &format!("{}{}", machine(&prefix), services(n, 524_287)));
    if !wait_until(Duration::from_secs(60), || read(&log)[before..].contains("applying")) {
        panic!("the reload was not picked up:\n{}", &read(&log)[before..]);
    }
    let t0 = Instant::now();
    let (code, _, _) = lb.stop("TERM", Duration::from_secs(120));
    let took = t0.elapsed();
    let text = read(&log);
    eprintln!("SIGTERM during the compilation: exited after {} ms", took.as_millis());
    let stopping = text.find("SIGTERM: stopping").unwrap_or_else(|| panic!("no stop in the log:\n{text}"));
    let after = &text[stopping..];
    assert!(!after.contains("snapshot published"), "a snapshot was published after stopping:\n{}", &text[before..]);
    assert!(!after.contains("configuration applied"), "a change was applied after stopping:\n{}", &text[before..]);
    assert!(after.contains("the change in flight is abandoned"), "{}", &text[before..]);
    assert_eq!(code, Some(0), "clean exit:\n{}", &text[before..]);
    assert!(took < Duration::from_secs(10), "stopped within 10 s: {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A FIFO in place of the configuration file: `sluice run` and `sluice
/// check` refuse it at once, naming what it is (nothing waits for a writer).
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_fifo_as_the_configuration_is_refused_at_once() {
    privileged();
    let ns = Netns::new("stf");
    let dir = tempdir("stop-fifo");
    let fifo = dir.join("appliance.yaml");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let link = dir.join("link.yaml");
    std::os::unix::fs::symlink(&fifo, &link).unwrap();
    for (cmd, path) in [("run", &fifo), ("check", &fifo), ("run", &link)] {
        let mut p = ns.spawn(&[sluice_bin().to_str().unwrap(), cmd, "--config", path.to_str().unwrap()]);
        let ended = wait_until(Duration::from_secs(10), || !p.running());
        let (code, out, err) = p.stop("KILL", Duration::from_secs(5));
        assert!(ended, "`sluice {cmd} --config {}` still waits after 10 s", path.display());
        assert_ne!(code, Some(0));
        assert!(format!("{out}{err}").contains("not a regular file (a FIFO): refused"), "sluice {cmd}: {out}{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
