//! Test support shared by the DPDK test binaries of this crate.
//!
//! DPDK allows one EAL per process and only its main lcore may launch
//! tasks, while the test harness runs each test on a thread of its own. So
//! a binary whose tests share an EAL gives it to one thread that plays the
//! main lcore ([`on_main`]); binaries that shut the EAL down have a single
//! test that owns it. Also: veth pairs that delete themselves, and a
//! watchdog that fails a test that hangs instead of hanging with it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::Duration;

use sluice_ffi::Eal;

type Job = Box<dyn FnOnce(&Eal) + Send>;

static MAIN: OnceLock<mpsc::Sender<Job>> = OnceLock::new();

/// A `--file-prefix` unique to this process and `tag`. Also removes the
/// runtime directories that test processes of this crate no longer running
/// left behind: a binary whose tests share an EAL never shuts it down (the
/// process ends with it up), and DPDK does not remove them.
pub fn file_prefix(tag: &str) -> String {
    sweep_dead_runtime_dirs();
    format!("sluice-ffi-{tag}-{}", std::process::id())
}

/// DPDK's candidate roots for runtime directories.
fn runtime_roots() -> Vec<PathBuf> {
    [
        Some(PathBuf::from("/var/run/dpdk")),
        std::env::var_os("XDG_RUNTIME_DIR").map(|d| PathBuf::from(d).join("dpdk")),
        Some(PathBuf::from("/tmp/dpdk")),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Removes `sluice-ffi-<tag>-<pid>` runtime directories whose process is
/// gone.
fn sweep_dead_runtime_dirs() {
    for root in runtime_roots() {
        let Ok(entries) = std::fs::read_dir(&root) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("sluice-ffi-")).and_then(|n| n.rsplit('-').next()) else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !std::path::Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// EAL arguments of these tests: no hugepages, `mb` MiB, no PCI, no
/// telemetry, lcores `lcores`, EAL warnings only, the file prefix `prefix`,
/// then `more` (vdevs).
pub fn eal_args(prefix: &str, mb: u32, lcores: &str, more: &[String]) -> Vec<String> {
    let mut v: Vec<String> = ["--no-huge", "-m", &mb.to_string(), "--no-pci", "--no-telemetry", "-l", lcores, "--log-level=lib.eal:warning"]
        .map(String::from)
        .to_vec();
    v.push(format!("--file-prefix={prefix}"));
    v.extend(more.iter().cloned());
    v
}

/// Runs `f` on the thread that initialised this process's EAL (with the
/// arguments `args` gives, the first time) and returns its result; a panic
/// in `f` is raised again here.
pub fn on_main<R: Send + 'static>(args: fn() -> Vec<String>, f: impl FnOnce(&Eal) -> R + Send + 'static) -> R {
    let jobs = MAIN.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        std::thread::Builder::new()
            .name("main-lcore".into())
            .spawn(move || {
                let eal = match Eal::init(&args()) {
                    Ok(e) => e,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                for job in rx {
                    job(&eal);
                }
            })
            .expect("spawn the main-lcore thread");
        if let Err(e) = ready_rx.recv().expect("the main-lcore thread reports") {
            panic!("EAL init: {e}");
        }
        tx
    });
    let (tx, rx) = mpsc::channel();
    let job: Job = Box::new(move |eal| {
        let _ = tx.send(catch_unwind(AssertUnwindSafe(|| f(eal))));
    });
    jobs.send(job).expect("the main-lcore thread is running");
    match rx.recv().expect("the main-lcore thread answers") {
        Ok(r) => r,
        Err(panic) => resume_unwind(panic),
    }
}

/// DPDK's runtime directory for `prefix` (which holds `mp_socket` while the
/// EAL is up: `rte_eal_cleanup` removes it).
pub fn runtime_dir(prefix: &str) -> PathBuf {
    runtime_roots()
        .into_iter()
        .map(|d| d.join(prefix))
        .find(|d| d.exists())
        .unwrap_or_else(|| panic!("no DPDK runtime directory for {prefix}"))
}

/// Fails the test process if it is not dropped within `secs` seconds: a
/// hang becomes a failure.
pub struct Watchdog {
    done: mpsc::Sender<()>,
}

impl Watchdog {
    pub fn new(secs: u64, what: &'static str) -> Watchdog {
        let (done, rx) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(Duration::from_secs(secs)) {
                eprintln!("watchdog: {what} did not finish within {secs} s");
                std::process::exit(101);
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.done.send(());
    }
}

/// A veth pair without IP addresses, deleted on drop.
pub struct Veth {
    pub a: String,
    pub b: String,
}

fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {}", args.join(" "));
}

impl Veth {
    /// Creates `<tag>a<pid>` and `<tag>b<pid>` and sets them up.
    pub fn new(tag: &str) -> Veth {
        let pid = std::process::id();
        let v = Veth { a: format!("{tag}a{pid}"), b: format!("{tag}b{pid}") };
        assert!(v.a.len() <= 15, "interface name {} too long", v.a);
        ip(&["link", "add", &v.a, "type", "veth", "peer", "name", &v.b]);
        for i in [&v.a, &v.b] {
            // No IPv6 link-local address either: af_packet only copies frames.
            let _ = Command::new("sysctl").args(["-q", "-w", &format!("net.ipv6.conf.{i}.disable_ipv6=1")]).status();
            ip(&["link", "set", i, "up"]);
        }
        v
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.a]).status();
    }
}

/// The flags (`ip -j link show`) and MTU of kernel interface `ifname`.
pub fn link_state(ifname: &str) -> (Vec<String>, u32) {
    let out = Command::new("ip").args(["-j", "link", "show", "dev", ifname]).output().expect("run ip");
    assert!(out.status.success(), "ip -j link show dev {ifname}");
    let json = String::from_utf8(out.stdout).unwrap();
    let flags_at = json.find("\"flags\":[").unwrap_or_else(|| panic!("no flags in {json}")) + "\"flags\":[".len();
    let flags_end = flags_at + json[flags_at..].find(']').unwrap();
    let flags = json[flags_at..flags_end]
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_owned())
        .filter(|f| !f.is_empty())
        .collect();
    let mtu_at = json.find("\"mtu\":").unwrap_or_else(|| panic!("no mtu in {json}")) + "\"mtu\":".len();
    let mtu: String = json[mtu_at..].chars().take_while(char::is_ascii_digit).collect();
    (flags, mtu.parse().unwrap())
}

/// True when `ifname` is in promiscuous mode.
pub fn promiscuous(ifname: &str) -> bool {
    link_state(ifname).0.iter().any(|f| f == "PROMISC")
}
