//! Harness for end-to-end tests: network namespaces joined by veth pairs,
//! processes that are killed when the test ends, and the `sluice` binary.
//!
//! Everything a test creates is removed when its guard drops, also when the
//! test fails. Names carry the test process id, so runs do not collide.
//!
//! A test that needs root carries
//! `#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]`
//! and calls [`privileged`] first: where it cannot run it is counted as
//! ignored, never as passed (see [`privileged`]).
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)] // test harness: failing loudly is the point

pub mod fake_apiserver;
pub mod http;
pub mod prometheus;
pub mod topology;
pub mod xds_server;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Panics with a clear message unless the tests run as root.
///
/// A test that needs root (network namespaces, DPDK, BIRD) says so twice:
///
/// ```ignore
/// #[test]
/// #[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
/// fn forwards_real_traffic() {
///     privileged();
///     // ...
/// }
/// ```
///
/// The attribute makes the runner count the test as ignored, with its
/// reason, where it cannot run: `cfg(sluice_unprivileged)` is set by this
/// crate's build script when it is built by a user other than root or with
/// `SLUICE_SKIP_PRIVILEGED=1` (CI refuses that variable). The call fails
/// the test when it runs without root anyway (a binary built as root, run
/// by someone else): a test that did not run never shows as passed.
pub fn privileged() {
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|u| u.split_whitespace().nth(1)).map(str::to_owned));
    if euid.as_deref() == Some("0") {
        return;
    }
    panic!(
        "this test needs root (network namespaces and DPDK): run it as root, or build the tests as another user or \
         with SLUICE_SKIP_PRIVILEGED=1 to have it counted as ignored"
    );
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &[&str]) -> Output {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `sluice` binary: `$SLUICE_BIN`, else next to this test's target dir.
pub fn sluice_bin() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/sluice
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("sluice");
    assert!(
        bin.exists(),
        "{} not found: build it first (`cargo build --release -p sluice` for release tests) or set SLUICE_BIN",
        bin.display()
    );
    // `cargo test -p sluice-tests` does not build the `sluice` binary: a
    // test would run the one built before the last change to its sources.
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).expect("the binary's modification time");
    if let Some(newer) = newer_source(built) {
        panic!(
            "{} is older than {}: build it again (`cargo build --release -p sluice` for release tests) or set SLUICE_BIN",
            bin.display(),
            newer.display()
        );
    }
    bin
}

/// A source file of the crates the `sluice` binary is built from that
/// changed after `built`, if any.
fn newer_source(built: std::time::SystemTime) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent()?.to_path_buf();
    let mut dirs: Vec<PathBuf> = ["control/src", "core/src", "lab/src", "dataplane/src", "ffi/src", "ffi/csrc"].iter().map(|d| root.join(d)).collect();
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = e.path();
            match e.metadata() {
                Ok(m) if m.is_dir() => dirs.push(path),
                Ok(m) if m.modified().is_ok_and(|t| t > built) => return Some(path),
                _ => {}
            }
        }
    }
    None
}

/// A program of this crate (e.g. `sluice-xds-server`), next to `sluice`.
pub fn tool_bin(name: &str) -> PathBuf {
    let bin = sluice_bin().with_file_name(name);
    assert!(bin.exists(), "{} not found: build it first (`cargo build --release -p sluice-tests`)", bin.display());
    bin
}

/// A network namespace, deleted (with its interfaces) on drop.
#[derive(Debug)]
pub struct Netns {
    /// Its name under /run/netns.
    pub name: String,
}

impl Netns {
    /// Creates `slt<pid>-<tag>`, with loopback up.
    pub fn new(tag: &str) -> Netns {
        let name = format!("slt{}-{tag}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    fn exec_args<'a>(&'a self, cmd: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", self.name.as_str()];
        v.extend_from_slice(cmd);
        v
    }

    /// Runs a command inside, panicking if it fails.
    pub fn run(&self, cmd: &[&str]) -> Output {
        run(&self.exec_args(cmd))
    }

    /// Runs a command inside and returns its output whatever the status.
    pub fn output(&self, cmd: &[&str]) -> Output {
        let args = self.exec_args(cmd);
        Command::new(args[0]).args(&args[1..]).output().expect("spawn ip netns exec")
    }

    /// Starts a command inside; it is killed when the guard drops.
    pub fn spawn(&self, cmd: &[&str]) -> Proc {
        Proc::spawn(&self.exec_args(cmd))
    }

    /// Sets a sysctl inside.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.run(&["sysctl", "-qw", &format!("{key}={value}")]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill what still runs inside, then delete the namespace.
        if let Ok(o) = Command::new("ip").args(["netns", "pids", &self.name]).output() {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Creates a veth pair `a` (in `ns_a`) <-> `b` (in `ns_b`), both up, with
/// checksum and segmentation offloads off so every frame is complete and
/// MTU-sized (DPDK's af_packet sees frames as the kernel hands them over).
pub fn veth(ns_a: &Netns, a: &str, ns_b: &Netns, b: &str) {
    run(&["ip", "link", "add", a, "netns", &ns_a.name, "type", "veth", "peer", "name", b, "netns", &ns_b.name]);
    for (ns, dev) in [(ns_a, a), (ns_b, b)] {
        ns.run(&["ip", "link", "set", dev, "up"]);
        let _ = ns.output(&["ethtool", "-K", dev, "tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]);
    }
}

/// A process that is killed (if still running) when dropped.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    what: String,
}

impl Proc {
    /// Starts `cmd` with its output captured.
    pub fn spawn(cmd: &[&str]) -> Proc {
        let child = Command::new(cmd[0])
            .args(&cmd[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc { child: Some(child), what: cmd.join(" ") }
    }

    /// Sends `signal` (e.g. "INT") and waits up to `timeout` for the exit;
    /// returns the exit code and everything the process printed.
    pub fn stop(&mut self, signal: &str, timeout: Duration) -> (Option<i32>, String, String) {
        let mut child = self.child.take().expect("process already stopped");
        let _ = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).output();
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break Some(s);
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (mut out, mut err) = (String::new(), String::new());
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        (status.and_then(|s| s.code()), out, err)
    }

    /// Its process id, while it has not been stopped.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// What was started.
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A classic pcap file (microsecond timestamps, Ethernet) of `frames`,
/// `gap_us` apart from time 0, written with pcap-file.
pub fn pcap(frames: &[Vec<u8>], gap_us: u32) -> Vec<u8> {
    let mut w = pcap_file::pcap::PcapWriter::new(Vec::new()).expect("a pcap header in memory");
    for (i, f) in (0u64..).zip(frames) {
        let at = Duration::from_micros(i * u64::from(gap_us));
        let len = u32::try_from(f.len()).expect("a frame below 4 GiB");
        w.write_packet(&pcap_file::pcap::PcapPacket::new(at, len, f)).expect("a packet in memory");
    }
    w.into_writer()
}

/// Polls `f` every 50 ms until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A tiny Python program (Python 3 is part of the test dependencies) run
/// inside a namespace: traffic generators and sinks for the tests.
pub fn python(ns: &Netns, program: &str, args: &[&str]) -> Proc {
    let mut cmd = vec!["python3", "-c", program];
    cmd.extend_from_slice(args);
    ns.spawn(&cmd)
}

/// The frames of a classic pcap file, read with pcap-file.
pub fn read_pcap(path: &std::path::Path) -> Vec<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut r = pcap_file::pcap::PcapReader::new(std::io::BufReader::new(file)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut v = Vec::new();
    while let Some(p) = r.next_packet() {
        v.push(p.unwrap_or_else(|e| panic!("{}: {e}", path.display())).data.into_owned());
    }
    v
}

/// tcpdump on an interface of a namespace, writing a pcap file: the view
/// from outside the appliance of what it sent there.
#[derive(Debug)]
pub struct Tcpdump {
    proc: Proc,
    path: PathBuf,
}

impl Tcpdump {
    /// Starts `tcpdump -i IFACE -w PATH FILTER` in the namespace named `ns`
    /// and returns once it captures (tcpdump opens its output file after
    /// the capture is active).
    pub fn start(ns: &str, iface: &str, filter: &str, path: &std::path::Path) -> Tcpdump {
        let _ = std::fs::remove_file(path);
        let p = path.to_str().expect("a UTF-8 path");
        let mut proc =
            Proc::spawn(&["ip", "netns", "exec", ns, "tcpdump", "-i", iface, "-n", "-U", "--immediate-mode", "-s", "256", "-w", p, filter]);
        let up = wait_until(Duration::from_secs(10), || path.exists());
        if !up {
            let (code, out, err) = proc.stop("INT", Duration::from_secs(5));
            panic!("tcpdump on {iface} did not start (exit {code:?}):\n{out}\n{err}");
        }
        Tcpdump { proc, path: path.to_owned() }
    }

    /// Frames written so far (whole records after the file's header; tcpdump
    /// writes the file in this machine's byte order).
    pub fn count(&self) -> usize {
        let bytes = std::fs::read(&self.path).unwrap_or_default();
        let mut at = 24;
        let mut n = 0;
        while let Some(rec) = bytes.get(at..at + 16) {
            let caplen = u32::from_ne_bytes([rec[8], rec[9], rec[10], rec[11]]) as usize;
            if bytes.len() < at + 16 + caplen {
                break;
            }
            at += 16 + caplen;
            n += 1;
        }
        n
    }

    /// Waits up to `timeout` until it has written `n` frames; returns how
    /// many it has.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> usize {
        let mut seen = 0;
        wait_until(timeout, || {
            seen = self.count();
            seen >= n
        });
        seen
    }

    /// Stops it (SIGINT, checking it exits 0) and returns the frames it
    /// captured.
    pub fn frames(mut self) -> Vec<Vec<u8>> {
        let (code, out, err) = self.proc.stop("INT", Duration::from_secs(10));
        assert_eq!(code, Some(0), "tcpdump on {}:\n{out}\n{err}", self.path.display());
        read_pcap(&self.path)
    }
}
