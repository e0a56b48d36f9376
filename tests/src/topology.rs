//! The demo's topology (scripts/topology.sh) for end-to-end tests: a
//! client, the appliance's namespace `lb` and three backends `be1..be3`,
//! under a prefix unique to the test. Torn down when the guard drops, also
//! when the test fails.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::{run, Proc};

/// The repository's root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_owned()
}

/// The namespaces of scripts/topology.sh under a prefix.
#[derive(Debug)]
pub struct Topology {
    prefix: String,
}

impl Topology {
    /// IPv4 only.
    pub fn up(prefix: &str) -> Topology {
        run(&[root().join("scripts/topology.sh").to_str().expect("utf-8 path"), "up", prefix]);
        Topology { prefix: prefix.to_owned() }
    }

    /// IPv4 and IPv6 (`IPV6=1`: client fd00:100::2, backends fd00:200::1N,
    /// IPv6 VIPs fd00:20::1 and fd00:20::2 on the backends' loopback).
    pub fn up_dual_stack(prefix: &str) -> Topology {
        let st = Command::new(root().join("scripts/topology.sh")).args(["up", prefix]).env("IPV6", "1").status().expect("topology.sh");
        assert!(st.success(), "scripts/topology.sh up {prefix} (IPV6=1) failed");
        Topology { prefix: prefix.to_owned() }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The full name of namespace `n` (client, lb, be1...).
    pub fn ns(&self, n: &str) -> String {
        format!("{}-{n}", self.prefix)
    }

    /// Starts `cmd` in namespace `n`; killed when the guard drops.
    pub fn spawn(&self, n: &str, cmd: &[&str]) -> Proc {
        let ns = self.ns(n);
        let mut args = vec!["ip", "netns", "exec", ns.as_str()];
        args.extend_from_slice(cmd);
        Proc::spawn(&args)
    }

    /// Runs `cmd` in namespace `n`, whatever its exit status.
    pub fn output(&self, n: &str, cmd: &[&str]) -> Output {
        Command::new("ip").args(["netns", "exec", &self.ns(n)]).args(cmd).output().expect("ip netns exec")
    }

    /// Runs `cmd` in namespace `n` and parses what it prints as JSON
    /// (`Value::Null` when it prints none).
    pub fn json(&self, n: &str, cmd: &[&str]) -> Value {
        serde_json::from_slice(&self.output(n, cmd).stdout).unwrap_or(Value::Null)
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
                let mut cmd = vec!["python3", script.to_str().expect("utf-8 path"), name.as_str()];
                cmd.extend_from_slice(vips);
                self.spawn(&name, &cmd)
            })
            .collect()
    }

    /// Runs scripts/client.py in the client namespace: `{backend: count}`.
    pub fn client(&self, args: &[&str]) -> HashMap<String, u64> {
        let script = root().join("scripts/client.py");
        let mut cmd = vec!["python3", script.to_str().expect("utf-8 path")];
        cmd.extend_from_slice(args);
        let v = self.json("client", &cmd);
        v.as_object()
            .unwrap_or_else(|| panic!("client.py {args:?} printed no object: {v}"))
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
            .collect()
    }

    /// Starts `client.py hold VIP N SECONDS FILE`; the file gets
    /// `{backend: [ok, broken]}` at the end, `FILE.ready` once every
    /// connection is open.
    pub fn hold(&self, vip: &str, n: u32, seconds: u32, out: &Path) -> Proc {
        let script = root().join("scripts/client.py");
        let (n, secs) = (n.to_string(), seconds.to_string());
        self.spawn(
            "client",
            &["python3", script.to_str().expect("utf-8 path"), "hold", vip, &n, &secs, out.to_str().expect("utf-8 path")],
        )
    }
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
    std::fs::create_dir_all(&d).expect("create a temporary directory");
    d
}
