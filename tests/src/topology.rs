//! The demo topology of `scripts/topology.sh` (client, appliance, three
//! backends in network namespaces named `<prefix>-*`) for end-to-end tests,
//! torn down when the guard drops (also when the test fails), and the
//! traffic and status helpers the tests share.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;

use crate::{run, sluice_bin, wait_until, Proc};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// The namespaces of one prefix; removed on drop.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
}

impl Topology {
    /// Creates the namespaces (`scripts/topology.sh up PREFIX`).
    pub fn up(prefix: &str) -> Topology {
        // The guard first: a failing `up` leaves nothing behind either.
        let t = Topology { prefix: prefix.to_owned() };
        run(&[root().join("scripts/topology.sh").to_str().unwrap(), "up", prefix]);
        t
    }

    /// IPv4 and IPv6 (`IPV6=1`: client fd00:100::2, backends fd00:200::1N,
    /// IPv6 VIPs fd00:20::1 and fd00:20::2 on the backends' loopback).
    pub fn up_dual_stack(prefix: &str) -> Topology {
        let t = Topology { prefix: prefix.to_owned() };
        let st = Command::new(root().join("scripts/topology.sh")).args(["up", prefix]).env("IPV6", "1").status().unwrap();
        assert!(st.success(), "scripts/topology.sh up {prefix} (IPV6=1) failed");
        t
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `ip -j -s link show dev DEV` in namespace `n`.
    pub fn link(&self, n: &str, dev: &str) -> Value {
        self.json(n, &["ip", "-j", "-s", "link", "show", "dev", dev])[0].clone()
    }

    /// Starts one backend (scripts/backend.py) per backend namespace,
    /// answering on `vips`.
    pub fn backends(&self, vips: &[&str]) -> Vec<Proc> {
        let script = root().join("scripts/backend.py");
        (1..=3)
            .map(|i| {
                let name = format!("be{i}");
                let mut cmd = vec!["python3", script.to_str().unwrap(), name.as_str()];
                cmd.extend_from_slice(vips);
                self.spawn(&name, &cmd)
            })
            .collect()
    }

    /// Waits (up to 10 s) until something in each of be1..be3 listens on
    /// each of the TCP ports `tcp` and has a socket bound to each of the UDP
    /// ports `udp`: a test whose first health checks must pass starts the
    /// appliance only then. Panics when they do not.
    pub fn backends_listen(&self, tcp: &[u16], udp: &[u16]) {
        let bound = |n: &str, flags: &str, port: u16| {
            let sport = format!(":{port}");
            !self.output(n, &["ss", flags, "sport", "=", &sport]).stdout.iter().all(u8::is_ascii_whitespace)
        };
        let listen = |n: &str| tcp.iter().all(|p| bound(n, "-Hltn", *p)) && udp.iter().all(|p| bound(n, "-Hlun", *p));
        let all = || (1..=3).all(|i| listen(&format!("be{i}")));
        assert!(wait_until(Duration::from_secs(10), all), "the backends do not listen on TCP {tcp:?} and UDP {udp:?}");
    }

    /// Starts `client.py hold VIP N SECONDS FILE` without waiting: the file
    /// gets `{backend: [ok, broken]}` at the end, `FILE.ready` once every
    /// connection is open.
    pub fn hold_for(&self, vip: &str, n: u32, seconds: u32, out: &Path) -> Proc {
        let script = root().join("scripts/client.py");
        let (n, secs) = (n.to_string(), seconds.to_string());
        self.spawn("client", &["python3", script.to_str().unwrap(), "hold", vip, &n, &secs, out.to_str().unwrap()])
    }

    /// The namespace `n` (`client`, `lb`, `net`, `be1`...).
    pub fn ns(&self, n: &str) -> String {
        format!("{}-{n}", self.prefix)
    }

    /// Starts `cmd` in namespace `n`.
    pub fn spawn(&self, n: &str, cmd: &[&str]) -> Proc {
        let ns = self.ns(n);
        let mut args = vec!["ip", "netns", "exec", ns.as_str()];
        args.extend_from_slice(cmd);
        Proc::spawn(&args)
    }

    /// Runs `cmd` in namespace `n` to its end.
    pub fn output(&self, n: &str, cmd: &[&str]) -> Output {
        Command::new("ip").args(["netns", "exec", &self.ns(n)]).args(cmd).output().unwrap()
    }

    /// Runs `cmd` in namespace `n` and reads what it prints as JSON
    /// (`Value::Null` when it prints none, e.g. before the appliance answers).
    pub fn json(&self, n: &str, cmd: &[&str]) -> Value {
        serde_json::from_slice(&self.output(n, cmd).stdout).unwrap_or(Value::Null)
    }

    /// `scripts/client.py ARGS` in the client namespace: connections per backend (and `failed`).
    pub fn client(&self, args: &[&str]) -> HashMap<String, u64> {
        let script = root().join("scripts/client.py");
        let mut cmd = vec!["python3", script.to_str().unwrap()];
        cmd.extend_from_slice(args);
        let v = self.json("client", &cmd);
        v.as_object()
            .unwrap_or_else(|| panic!("client.py {args:?} printed no object: {v}"))
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
            .collect()
    }

    /// `sluice status --json` in the appliance's namespace.
    pub fn status(&self) -> Value {
        self.json("lb", &[sluice_bin().to_str().unwrap(), "status", "--json"])
    }
}

/// Long-lived TCP connections from the client (`client.py hold`).
#[derive(Debug)]
pub struct Held {
    _client: Proc,
    out: PathBuf,
}

impl Topology {
    /// Opens 60 connections to `vip` that send a line every 0.2 s for 10 s;
    /// returns once they are open. `out` receives their outcome.
    pub fn hold(&self, vip: &str, out: &Path) -> Held {
        let script = root().join("scripts/client.py");
        let client = self.spawn("client", &["python3", script.to_str().unwrap(), "hold", vip, "60", "10", out.to_str().unwrap()]);
        let ready = PathBuf::from(format!("{}.ready", out.display()));
        assert!(wait_until(Duration::from_secs(20), || ready.exists()), "long-lived connections opened");
        Held { _client: client, out: out.to_owned() }
    }

    /// Removes the namespaces and checks that none is left.
    pub fn remove(self) {
        let prefix = self.prefix.clone();
        drop(self);
        let left = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
        assert!(!left.contains(&prefix), "namespaces left behind:\n{left}");
    }
}

impl Held {
    /// Waits for the connections to end; checks that the flows of backend
    /// `moved` moved (some had landed there, none of them survived) and
    /// that no connection to another was disturbed.
    pub fn only_moved(&self, moved: &str) {
        assert!(wait_until(Duration::from_secs(30), || self.out.exists()), "long-lived connections finished");
        let held = held_outcome(&self.out);
        let landed = held.get(moved).map_or(0, |[ok, broken]| ok + broken);
        assert!(landed > 0, "no connection landed on {moved}, so none could move: {held:?}");
        for (b, [ok, broken]) in &held {
            if b == moved {
                assert_eq!(*ok, 0, "flows of the removed endpoint moved: {held:?}");
            } else {
                assert_eq!(*broken, 0, "{b}: {broken} established connections were disturbed: {held:?}; when and why: {}", held_why(&self.out));
                assert!(*ok > 0);
            }
        }
    }
}

/// What `client.py hold` or `udphold` wrote to `out`: flows by backend,
/// [survived, broken].
pub fn held_outcome(out: &Path) -> HashMap<String, [u64; 2]> {
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

/// When and why each broken flow of `out` broke (`out.why`), for messages.
pub fn held_why(out: &Path) -> String {
    std::fs::read_to_string(format!("{}.why", out.display())).unwrap_or_else(|e| format!("({e})"))
}

/// Stops `sluice run` with SIGINT; checks it exits 0 with every mbuf back.
pub fn stop_cleanly(lb: &mut Proc) {
    let (code, _out, err) = lb.stop("INT", Duration::from_secs(15));
    assert_eq!(code, Some(0), "clean exit on SIGINT:\n{err}");
    assert!(err.contains("mbufs_in_use=0"), "every mbuf back in the pool:\n{err}");
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ = Command::new(root().join("scripts/topology.sh")).args(["down", &self.prefix]).output();
    }
}

/// A fresh directory under the system's temporary directory.
pub fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-{tag}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}
