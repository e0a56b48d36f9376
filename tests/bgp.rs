//! Attracting traffic with BGP and BFD, end to end in network namespaces.
//!
//! A second BIRD plays the DC gateway (`gw`): it peers with each
//! appliance's BIRD over the appliance's exception path (the DPDK tap),
//! with BFD, installs what it learns in its kernel with ECMP
//! (`merge paths on`, `fib_multipath_hash_policy=1`), and routes the
//! client's traffic to the VIPs through the appliances.
//!
//! ```text
//!  [client] c0 ── gc [gw] gbr 10.100.0.2 ─┬─ lbf [lb0] 10.100.0.1 ── lbb ─┐
//!                                          └─ lbf [lb1] 10.100.0.3 ── lbb ─┤ br0 [net] ── be1..be3 (VIP on lo)
//!                      gb 10.200.0.254 (ECMP test: the backends' return path) ┘
//! ```
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_tests::topology::{held_outcome, held_why};
use sluice_tests::{privileged, sluice_bin, veth, wait_until, Netns, Proc};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_owned()
}

/// One appliance: its namespace, process and configuration file.
struct Appliance {
    ns: Netns,
    proc: Option<Proc>,
    config: PathBuf,
    front: (String, String),
}

struct Rig {
    dir: PathBuf,
    v6: bool,
    gw: Netns,
    client: Netns,
    _net: Netns,
    _backends: Vec<Netns>,
    lbs: Vec<Appliance>,
    _procs: Vec<Proc>,
}

const VIP4: &str = "20.0.0.1";
const VIP6: &str = "fd00:20::1";

fn front4(k: usize) -> String {
    format!("10.100.0.{}", 1 + 2 * k)
}
fn front6(k: usize) -> String {
    format!("fd00:100::{}", 1 + 2 * k)
}

fn no_dad_or_no_v6(ns: &Netns, v6: bool) {
    if v6 {
        ns.sysctl("net.ipv6.conf.all.accept_dad", "0");
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0");
    } else {
        ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    }
}

/// The endpoints of the IPv4 service.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Eps {
    /// Three, identified as on every appliance.
    Same,
    /// The same three, but each with another identifier: the tables disagree.
    Rotated,
    /// None.
    Gone,
    /// The first two of the three, with the same identifiers.
    Two,
}

/// With `learn`, the configuration names no gateway: the return path's
/// next hop is the default route the DC gateway announces over BGP.
fn appliance_config(prefix: &str, k: usize, v6: bool, dir: &Path, eps: Eps, learn: bool) -> String {
    let (f4, f6) = (front4(k), front6(k));
    let eps4 = match eps {
        Eps::Same => "[{id: 0, address: 10.200.0.11}, {id: 1, address: 10.200.0.12}, {id: 2, address: 10.200.0.13}]",
        Eps::Rotated => "[{id: 0, address: 10.200.0.12}, {id: 1, address: 10.200.0.13}, {id: 2, address: 10.200.0.11}]",
        Eps::Gone => "[]",
        Eps::Two => "[{id: 0, address: 10.200.0.11}, {id: 1, address: 10.200.0.12}]",
    };
    let mut s = format!(
        r#"dpdk: {{lcores: "0,1", memoryMB: 512, hugepages: false, filePrefix: {prefix}l{k}, mbufs: 8191, descriptors: 512}}
ports:
  - {{name: front, device: "net_af_packet0,iface=lbf", addresses: [{f4}/24{a6f}], kernelInterface: sl-front}}
  - {{name: back, device: "net_af_packet1,iface=lbb", addresses: [10.200.0.{b}/24{a6b}], kernelInterface: sl-back}}
{g4}{g6}bird: {{socket: {dir}/lb{k}/bird.ctl, configFile: {dir}/lb{k}/bird.conf, withdrawWaitMs: 1000}}
gatewayRouters:
  - name: dc-gw-v4
    address: 10.100.0.2
    interface: front
    bgp: {{localASN: 8103, remoteASN: 65001, holdTime: 9s, bfd: {{switch: true, minTx: 100ms, minRx: 100ms, multiplier: 3}}}}
{r6}services:
  - name: web4
    endpoints: {eps4}
{s6}routes:
  - {{name: web4, service: web4, vips: [{VIP4}], protocols: [TCP, UDP], destinationPorts: ["80", "53"]}}
{rt6}"#,
        b = 1 + k,
        dir = dir.display(),
        a6f = if v6 { format!(", \"{f6}/64\"") } else { String::new() },
        a6b = if v6 { format!(", \"fd00:200::{}/64\"", 1 + k) } else { String::new() },
        g4 = if learn { "" } else { "gateways:\n  - {address: 10.100.0.2, port: front}\n" },
        g6 = if v6 && !learn { "  - {address: \"fd00:100::2\", port: front}\n" } else { "" },
        r6 = if v6 {
            "  - name: dc-gw-v6\n    address: \"fd00:100::2\"\n    interface: sl-front\n    bgp: {localASN: 8103, remoteASN: 65001, holdTime: 9s, bfd: {switch: true, minTx: 100ms, minRx: 100ms, multiplier: 3}}\n"
        } else {
            ""
        },
        s6 = if v6 {
            "  - name: web6\n    endpoints: [{id: 0, address: \"fd00:200::11\"}, {id: 1, address: \"fd00:200::12\"}, {id: 2, address: \"fd00:200::13\"}]\n"
        } else {
            ""
        },
        rt6 = if v6 {
            format!("  - {{name: web6, service: web6, vips: [\"{VIP6}\"], protocols: [TCP, UDP], destinationPorts: [\"80\", \"53\"]}}\n")
        } else {
            String::new()
        },
    );
    s.push('\n');
    s
}

/// The gateway's configuration. It logs to `log` (a file: its stderr is
/// never read), with protocol states and events traced and times as
/// seconds since the epoch with milliseconds, which [`Rig::gw_events`] reads.
fn gw_config(n: usize, v6: bool, export_default: bool, log: &Path) -> String {
    let mut s = format!(
        "router id 10.100.0.2;\nlog \"{}\" all;\ntimeformat log \"%s.%3f\";\ndebug protocols {{ states, events }};\n",
        log.display()
    );
    s.push_str(
        "protocol device { scan time 2; }\n\
         protocol bfd { interface \"gbr\" { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; }; }\n\
         protocol kernel { ipv4 { export all; }; merge paths on; }\n",
    );
    if v6 {
        s.push_str("protocol kernel { ipv6 { export all; }; merge paths on; }\n");
    }
    let (export4, export6) = if export_default {
        s.push_str("protocol static { ipv4; route 0.0.0.0/0 via 10.50.0.2; }\nprotocol static { ipv6; route ::/0 via fd00:50::2; }\n");
        ("where net = 0.0.0.0/0", "where net = ::/0")
    } else {
        ("none", "none")
    };
    for k in 0..n {
        s.push_str(&format!(
            "protocol bgp lb{k} {{ local 10.100.0.2 as 65001; neighbor {} as 8103; bfd on; connect retry time 1; error wait time 1, 5; ipv4 {{ import all; export {export4}; }}; }}\n",
            front4(k)
        ));
        if v6 {
            s.push_str(&format!(
                "protocol bgp lb{k}v6 {{ local fd00:100::2 as 65001; neighbor {} as 8103; bfd on; connect retry time 1; error wait time 1, 5; ipv6 {{ import all; export {export6}; }}; }}\n",
                front6(k)
            ));
        }
    }
    s
}

impl Rig {
    /// `n` appliances; with `dsr` the backends answer through the gateway
    /// directly (so replies do not depend on the appliance that is stopped).
    fn new(tag: &str, n: usize, v6: bool, dsr: bool, last: Eps) -> Rig {
        let dir = std::env::temp_dir().join(format!("sluice-bgp-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let gw = Netns::new(&format!("{tag}gw"));
        let client = Netns::new(&format!("{tag}cl"));
        let net = Netns::new(&format!("{tag}net"));
        for ns in [&gw, &client, &net] {
            no_dad_or_no_v6(ns, v6);
        }
        gw.run(&["ip", "link", "add", "gbr", "type", "bridge"]);
        gw.run(&["ip", "link", "set", "gbr", "up"]);
        gw.run(&["ip", "addr", "add", "10.100.0.2/24", "dev", "gbr"]);
        for (k, v) in [
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.fib_multipath_hash_policy", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
        ] {
            gw.sysctl(k, v);
        }
        veth(&gw, "gc", &client, "c0");
        gw.run(&["ip", "addr", "add", "10.50.0.1/24", "dev", "gc"]);
        client.run(&["ip", "addr", "add", "10.50.0.2/24", "dev", "c0"]);
        client.run(&["ip", "route", "add", "default", "via", "10.50.0.1"]);
        if v6 {
            gw.sysctl("net.ipv6.conf.all.forwarding", "1");
            gw.sysctl("net.ipv6.fib_multipath_hash_policy", "1");
            gw.run(&["ip", "addr", "add", "fd00:100::2/64", "dev", "gbr", "nodad"]);
            gw.run(&["ip", "addr", "add", "fd00:50::1/64", "dev", "gc", "nodad"]);
            client.run(&["ip", "addr", "add", "fd00:50::2/64", "dev", "c0", "nodad"]);
            client.run(&["ip", "-6", "route", "add", "default", "via", "fd00:50::1"]);
        }
        net.run(&["ip", "link", "add", "br0", "type", "bridge"]);
        net.run(&["ip", "link", "set", "br0", "up"]);
        if dsr {
            veth(&gw, "gb", &net, "ngw");
            net.run(&["ip", "link", "set", "ngw", "master", "br0"]);
            gw.run(&["ip", "addr", "add", "10.200.0.254/24", "dev", "gb"]);
        }
        let mut lbs = Vec::new();
        for k in 0..n {
            let ns = Netns::new(&format!("{tag}lb{k}"));
            no_dad_or_no_v6(&ns, v6);
            veth(&gw, &format!("ga{k}"), &ns, "lbf");
            gw.run(&["ip", "link", "set", &format!("ga{k}"), "master", "gbr"]);
            veth(&net, &format!("na{k}"), &ns, "lbb");
            net.run(&["ip", "link", "set", &format!("na{k}"), "master", "br0"]);
            let config = dir.join(format!("lb{k}.yaml"));
            let eps = if k + 1 == n { last } else { Eps::Same };
            std::fs::write(&config, appliance_config(&format!("bgp{}{tag}", std::process::id()), k, v6, &dir, eps, !dsr)).unwrap();
            lbs.push(Appliance { ns, proc: None, config, front: (front4(k), front6(k)) });
        }
        let mut procs = Vec::new();
        let mut backends = Vec::new();
        for i in 1..=3 {
            let be = Netns::new(&format!("{tag}be{i}"));
            no_dad_or_no_v6(&be, v6);
            veth(&net, &format!("nb{i}"), &be, "b0");
            net.run(&["ip", "link", "set", &format!("nb{i}"), "master", "br0"]);
            be.run(&["ip", "addr", "add", &format!("10.200.0.1{i}/24"), "dev", "b0"]);
            be.run(&["ip", "addr", "add", &format!("{VIP4}/32"), "dev", "lo"]);
            be.run(&["ip", "route", "add", "default", "via", if dsr { "10.200.0.254" } else { "10.200.0.1" }]);
            for (k, v) in [("net.ipv4.conf.all.arp_ignore", "1"), ("net.ipv4.conf.all.arp_announce", "2"), ("net.ipv4.conf.all.rp_filter", "0"), ("net.ipv4.conf.b0.rp_filter", "0")] {
                be.sysctl(k, v);
            }
            let mut vips = vec![VIP4];
            if v6 {
                be.run(&["ip", "addr", "add", &format!("fd00:200::1{i}/64"), "dev", "b0", "nodad"]);
                be.run(&["ip", "addr", "add", &format!("{VIP6}/128"), "dev", "lo"]);
                be.run(&["ip", "-6", "route", "add", "default", "via", "fd00:200::1"]);
                vips.push(VIP6);
            }
            let backend = root().join("scripts/backend.py");
            let name = format!("be{i}");
            let mut cmd = vec!["python3", backend.to_str().unwrap(), name.as_str()];
            cmd.extend_from_slice(&vips);
            procs.push(be.spawn(&cmd));
            backends.push(be);
        }
        let gw_conf = dir.join("gw.conf");
        std::fs::write(&gw_conf, gw_config(n, v6, !dsr, &dir.join("gw.log"))).unwrap();
        let sock = dir.join("gw.ctl");
        procs.push(gw.spawn(&["bird", "-f", "-c", gw_conf.to_str().unwrap(), "-s", sock.to_str().unwrap()]));
        Rig { dir, v6, gw, client, _net: net, _backends: backends, lbs, _procs: procs }
    }

    fn start(&mut self, k: usize) {
        self.start_with(k, &[]);
    }

    /// Starts appliance `k` with `env` (`NAME=value`) in its environment.
    fn start_with(&mut self, k: usize, env: &[&str]) {
        let bin = sluice_bin();
        let lb = &mut self.lbs[k];
        let mut cmd = vec!["env"];
        cmd.extend_from_slice(env);
        cmd.extend_from_slice(&[bin.to_str().unwrap(), "run", "--config", lb.config.to_str().unwrap()]);
        lb.proc = Some(lb.ns.spawn(&cmd));
    }

    /// An admin endpoint's answer: status code and body.
    fn admin(&self, k: usize, path: &str) -> (String, String) {
        let url = format!("http://127.0.0.1:9091{path}");
        let out = self.lbs[k].ns.output(&["curl", "-s", "-m", "2", "-w", "\n%{http_code}", &url]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
        (code.to_owned(), body.to_owned())
    }

    fn birdc(&self, cmd: &str) -> String {
        let sock = self.dir.join("gw.ctl");
        let mut args = vec!["birdc", "-s", sock.to_str().unwrap()];
        args.extend(cmd.split(' '));
        String::from_utf8_lossy(&self.gw.output(&args).stdout).into_owned()
    }

    /// The size of the gateway's log, to read only what follows.
    fn gw_log_len(&self) -> u64 {
        std::fs::metadata(self.dir.join("gw.log")).map_or(0, |m| m.len())
    }

    /// The gateway's log entries for protocol `proto` after byte `from`:
    /// (milliseconds since the epoch, message).
    fn gw_events(&self, from: u64, proto: &str) -> Vec<(u128, String)> {
        let log = std::fs::read(self.dir.join("gw.log")).unwrap_or_default();
        let text = String::from_utf8_lossy(log.get(usize::try_from(from).unwrap()..).unwrap_or_default());
        let tag = format!("{proto}: ");
        text.lines()
            .filter_map(|l| {
                // "1795931450.872 <TRACE> lb0: Started"
                let (time, rest) = l.split_once(' ')?;
                let (secs, ms) = time.split_once('.')?;
                let at = secs.parse::<u128>().ok()? * 1000 + ms.parse::<u128>().ok()?;
                let msg = rest.split_once("> ")?.1.strip_prefix(tag.as_str())?;
                Some((at, msg.to_owned()))
            })
            .collect()
    }

    /// The gateway's kernel route to `vip` ("" when there is none).
    fn gw_route(&self, vip: &str) -> String {
        let fam = if vip.contains(':') { "-6" } else { "-4" };
        String::from_utf8_lossy(&self.gw.output(&["ip", fam, "route", "show", vip]).stdout).trim().to_owned()
    }

    fn status(&self, k: usize) -> Value {
        let bin = sluice_bin();
        let out = self.lbs[k].ns.output(&[bin.to_str().unwrap(), "status", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    /// Every session of appliance `k` Established with BFD Up, as Sluice
    /// reports it and as the gateway sees it, and its VIPs in the gateway's FIB.
    fn peered(&self, k: usize) -> bool {
        let st = self.status(k);
        // Sessions to routers other than the gateway (named `plain`) are not counted.
        let sessions: Vec<Value> = st["bird"]["sessions"].as_array().cloned().unwrap_or_default().into_iter().filter(|s| s["router"] != "plain").collect();
        let want = if self.v6 { 2 } else { 1 };
        let ours = sessions.len() == want && sessions.iter().all(|s| s["bgp_state"] == "Established" && s["bfd_state"] == "Up");
        let bfd = self.birdc("show bfd sessions");
        let (f4, f6) = &self.lbs[k].front;
        let theirs = bfd.lines().any(|l| l.starts_with(f4.as_str()) && l.contains(" Up ")) && (!self.v6 || bfd.lines().any(|l| l.starts_with(f6.as_str()) && l.contains(" Up ")));
        let routes = self.gw_route(VIP4).contains(f4.as_str()) && (!self.v6 || self.gw_route(VIP6).contains(f6.as_str()));
        ours && theirs && routes
    }

    fn client(&self, args: &[&str]) -> Value {
        let script = root().join("scripts/client.py");
        let mut cmd = vec!["python3", script.to_str().unwrap()];
        cmd.extend_from_slice(args);
        let out = self.client.output(&cmd);
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("client {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
    }

    fn fail(&mut self, what: &str) -> ! {
        let mut logs = String::new();
        for (k, lb) in self.lbs.iter_mut().enumerate() {
            if let Some(mut p) = lb.proc.take() {
                let (code, _, err) = p.stop("INT", Duration::from_secs(10));
                logs.push_str(&format!("--- appliance {k} (exit {code:?}):\n{err}\n"));
            }
        }
        let log = std::fs::read_to_string(self.dir.join("gw.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(80)..].join("\n");
        panic!("{what}\n--- gateway:\n{}{}\n--- gateway's log (last 80 lines):\n{tail}\n{logs}", self.birdc("show protocols"), self.birdc("show route"));
    }

    /// Replaces appliance `k`'s configuration file (atomically, as an editor would).
    fn rewrite(&self, k: usize, text: &str) {
        let tmp = self.lbs[k].config.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.lbs[k].config).unwrap();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for lb in &mut self.lbs {
            if let Some(mut p) = lb.proc.take() {
                let _ = p.stop("INT", Duration::from_secs(10));
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn no_failures(v: &Value, what: &str) {
    let m = v.as_object().unwrap_or_else(|| panic!("{what}: {v}"));
    assert!(m.get("failed").is_none(), "{what}: {v}");
    assert!(m.len() >= 2, "{what}: spread over the backends: {v}");
}

/// One dual-stack appliance whose file names no gateway (the return
/// path follows the default routes the DC gateway announces): peering with
/// BFD up, both VIPs learned and
/// reachable through it; a VIP whose service loses its last endpoint is
/// withdrawn; a killed `bird` is restarted and peers again; SIGTERM
/// withdraws every VIP before the data plane stops.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn announce_withdraw_recover_and_drain_dual_stack() {
    privileged();
    let mut rig = Rig::new("b1", 1, true, false, Eps::Same);
    rig.start(0);
    if !wait_until(Duration::from_secs(60), || rig.peered(0)) {
        rig.fail("no BGP session with BFD up, or the VIPs were not learned");
    }
    eprintln!("gateway FIB: {} | {}", rig.gw_route(VIP4), rig.gw_route(VIP6));
    // No gateway in the file: the return path's next hops come from BGP.
    let learned = wait_until(Duration::from_secs(10), || rig.status(0)["bird"]["learned_gateways"].as_array().is_some_and(|g| g.len() == 2));
    if !learned {
        rig.fail("the default routes announced by the gateway were not taken as return-path gateways");
    }
    eprintln!("learned gateways: {}", rig.status(0)["bird"]["learned_gateways"]);
    for vip in [VIP4, VIP6] {
        let r = rig.client(&["short", vip, "100", "8"]);
        no_failures(&r, vip);
        let u = rig.client(&["udp", vip, "30"]);
        assert!(u.get("failed").is_none(), "{vip} UDP: {u}");
    }
    let st = rig.status(0);
    let balanced: u64 = st["workers"].as_array().unwrap().iter().map(|w| w["balanced"].as_u64().unwrap()).sum();
    assert!(balanced >= 200, "the client's traffic went through the appliance: {balanced}");
    let returned: u64 = st["workers"].as_array().unwrap().iter().map(|w| w["returned"].as_u64().unwrap()).sum();
    assert!(returned >= 200, "replies went back through the appliance to the learned gateways: {returned}");

    // The IPv4 service loses its last endpoint: only its VIP is withdrawn.
    let prefix = format!("bgp{}b1", std::process::id());
    let t0 = Instant::now();
    rig.rewrite(0, &appliance_config(&prefix, 0, true, &rig.dir, Eps::Gone, true));
    if !wait_until(Duration::from_secs(5), || rig.gw_route(VIP4).is_empty()) {
        rig.fail("the VIP of a service without endpoints was not withdrawn");
    }
    eprintln!("withdrawn from the gateway's FIB {} ms after the configuration lost the last endpoint", t0.elapsed().as_millis());
    assert!(!rig.gw_route(VIP6).is_empty(), "the other VIP stays");
    let st = rig.status(0);
    let v4 = st["bird"]["vips"].as_array().unwrap().iter().find(|v| v["vip"] == VIP4).cloned().unwrap();
    assert_eq!(v4["announced"], false);
    assert_eq!(v4["reason"], "withdrawn: no ready endpoint in service web4");
    rig.rewrite(0, &appliance_config(&prefix, 0, true, &rig.dir, Eps::Same, true));
    if !wait_until(Duration::from_secs(10), || !rig.gw_route(VIP4).is_empty()) {
        rig.fail("the VIP was not announced again");
    }

    // bird is killed: Sluice notices, restarts it, and it peers again.
    let pid = rig.status(0)["bird"]["pid"].as_u64().expect("the supervised bird's pid");
    let t0 = Instant::now();
    sluice_tests::run(&["kill", "-9", &pid.to_string()]);
    let recovered = wait_until(Duration::from_secs(60), || {
        let st = rig.status(0);
        st["bird"]["restarts"].as_u64().unwrap_or(0) >= 1 && st["bird"]["pid"].as_u64().is_some_and(|p| p != pid) && rig.peered(0)
    });
    if !recovered {
        rig.fail("a killed bird was not restarted and peered again");
    }
    eprintln!("bird killed: restarted and peered again, VIPs back, after {} ms", t0.elapsed().as_millis());
    let st = rig.status(0);
    assert!(st["bird"]["last_exit"].as_str().unwrap().contains("SIGKILL"), "{}", st["bird"]);

    // SIGTERM: the gateway loses the VIPs while the appliance still runs.
    let gone = Arc::new(AtomicBool::new(false));
    let withdrawn_at = {
        let gone = Arc::clone(&gone);
        let gw = rig.gw.name.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(20) {
                let r4 = Command::new("ip").args(["netns", "exec", &gw, "ip", "-4", "route", "show", VIP4]).output().unwrap();
                let r6 = Command::new("ip").args(["netns", "exec", &gw, "ip", "-6", "route", "show", VIP6]).output().unwrap();
                if r4.stdout.is_empty() && r6.stdout.is_empty() {
                    gone.store(true, Ordering::SeqCst);
                    return Some(t0.elapsed());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            None
        })
    };
    let t0 = Instant::now();
    let (code, _, err) = rig.lbs[0].proc.take().unwrap().stop("TERM", Duration::from_secs(30));
    let exited = t0.elapsed();
    let withdrawn = withdrawn_at.join().unwrap().expect("the VIPs left the gateway's FIB");
    eprintln!("SIGTERM: VIPs gone from the gateway after {} ms, appliance exited after {} ms", withdrawn.as_millis(), exited.as_millis());
    assert_eq!(code, Some(0), "{err}");
    assert!(withdrawn < exited, "withdrawn before the appliance stopped");
    let at = |s: &str| err.find(s).unwrap_or_else(|| panic!("{s:?} not in the log:\n{err}"));
    assert!(at("every VIP withdrawn; waiting for the routers") < at("bird stopped"));
    assert!(at("bird stopped") < at("stopped forwarded="), "the workers stop last:\n{err}");
    assert!(err.contains("mbufs_in_use=0"));
    // The appliance's BIRD shut its protocols down (the log order above
    // shows it was stopped, not killed): the gateway ends the sessions on
    // whichever of its goodbyes it processes first, the BGP Cease
    // ("Administrative shutdown") or BFD's AdminDown ("BFD session down");
    // which one wins is a race inside BIRD (either is seen, depending on
    // the host's kernel and timing).
    let t0 = Instant::now();
    let ended = |p: &str| p.contains("Administrative shutdown") || p.contains("BFD session down");
    while !ended(&rig.birdc("show protocols")) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = rig.birdc("show protocols");
    assert!(ended(&p), "{p}");
}

/// The gateway's link to the appliance flaps again and again (BFD takes
/// each session down in ~300 ms): every time the link is back, each
/// session, IPv4 and IPv6, is Established again within a few seconds of
/// the gateway accepting connections again, however many flaps came
/// before. After each failure a BIRD waits its `error wait time`, doubled
/// with each failure in a row up to its maximum, and refuses connections
/// meanwhile: the appliance's is at most 2 s; the gateway's (`1, 5` here)
/// is its own, so the time is counted from the gateway's own log: from the
/// later of its link coming back and its error wait ending ("Started"), to
/// "BGP session established". The appliance has to make the connection:
/// the gateway's own attempt comes only after its `connect delay time`
/// (BIRD's default, 5 s less up to a quarter).
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn sessions_reconnect_within_seconds_after_each_flap() {
    privileged();
    /// The gateway's protocols: the appliance's IPv4 and IPv6 sessions.
    const SESSIONS: [(&str, &str); 2] = [("lb0", "IPv4"), ("lb0v6", "IPv6")];
    let mut rig = Rig::new("b4", 1, true, false, Eps::Same);
    rig.start(0);
    if !wait_until(Duration::from_secs(60), || rig.peered(0)) {
        rig.fail("no BGP session with BFD up, or the VIPs were not learned");
    }
    let established = |rig: &Rig| {
        let p = rig.birdc("show protocols");
        SESSIONS.iter().all(|(n, _)| p.lines().any(|l| l.starts_with(&format!("{n} ")) && l.contains("Established")))
    };
    let appliance_down = |rig: &Rig| {
        let st = rig.status(0);
        let s = st["bird"]["sessions"].as_array().cloned().unwrap_or_default();
        s.len() == 2 && s.iter().all(|s| s["bgp_state"] != "Established")
    };
    // Per flap and session: (from the link coming back, from the gateway accepting) in ms.
    let mut took: Vec<[(u128, u128); 2]> = Vec::new();
    for flap in 1..=5 {
        rig.gw.run(&["ip", "link", "set", "ga0", "down"]);
        // The link stays down until both ends have taken the sessions down.
        if !wait_until(Duration::from_secs(10), || !established(&rig) && appliance_down(&rig)) {
            rig.fail(&format!("flap {flap}: the sessions did not go down with the link"));
        }
        let mark = rig.gw_log_len();
        let up = std::time::SystemTime::now();
        rig.gw.run(&["ip", "link", "set", "ga0", "up"]);
        if !wait_until(Duration::from_secs(60), || established(&rig)) {
            rig.fail(&format!("flap {flap}: the sessions did not come back within 60 s"));
        }
        let up_ms = up.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
        let mut this = [(0, 0); 2];
        for (k, (proto, family)) in SESSIONS.iter().enumerate() {
            // The first "Started" after the link came back: the gateway
            // accepts from then on; the first "established" after it.
            let mut seen = None;
            let logged = wait_until(Duration::from_secs(5), || {
                let ev = rig.gw_events(mark, proto);
                let started = ev.iter().find(|e| e.1 == "Started").map(|e| e.0);
                let est = started.and_then(|s| ev.iter().find(|e| e.0 >= s && e.1 == "BGP session established").map(|e| e.0));
                seen = started.zip(est);
                seen.is_some()
            });
            let Some((started, est)) = seen.filter(|_| logged) else {
                rig.fail(&format!("flap {flap}: the gateway's log has no \"Started\" then \"BGP session established\" for {proto} ({family})"))
            };
            this[k] = (est.saturating_sub(up_ms), est.saturating_sub(started.max(up_ms)));
        }
        took.push(this);
    }
    for (k, (_, family)) in SESSIONS.iter().enumerate() {
        let from_link: Vec<u128> = took.iter().map(|t| t[k].0).collect();
        let from_accepting: Vec<u128> = took.iter().map(|t| t[k].1).collect();
        eprintln!("{family} session Established again, per flap: {from_link:?} ms after the link came back, {from_accepting:?} ms after the gateway accepted again");
    }
    // The appliance tries again every second or so (`connect delay time 1`,
    // or a SYN retransmitted within `connect retry time 2`), so a session
    // is back within about 2 s of the gateway accepting; waiting for the
    // gateway's own connection (its `connect delay time`, 5 s) is a failure.
    let slowest = took.iter().flatten().map(|t| t.1).max().unwrap();
    if slowest > 3000 {
        rig.fail(&format!("a session took {slowest} ms to come back after the gateway accepted again; expected within about 2 s"));
    }
}

/// Two routers on the appliance's front interface: the DC gateway, which
/// runs BFD, named with BFD timers of its own but no `switch`, and a second
/// router that runs no BFD at all, named without any `bfd`. BFD is on by
/// default: the gateway's BFD session comes Up with the appliance; the
/// session to the router without BFD is Established all the same (its BFD
/// never answers, which BIRD does not count as a failure) and it learns
/// the VIP.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn bfd_is_on_by_default_and_a_router_without_bfd_still_peers() {
    privileged();
    let mut rig = Rig::new("b6", 1, false, false, Eps::Same);
    // The second router: its own namespace on the gateway's bridge, a BIRD
    // with no BFD protocol.
    let plain = Netns::new("b6rt");
    no_dad_or_no_v6(&plain, false);
    veth(&rig.gw, "gr", &plain, "r0");
    rig.gw.run(&["ip", "link", "set", "gr", "master", "gbr"]);
    plain.run(&["ip", "addr", "add", "10.100.0.4/24", "dev", "r0"]);
    let conf = rig.dir.join("plain.conf");
    std::fs::write(
        &conf,
        "router id 10.100.0.4;\nlog stderr all;\nprotocol device { scan time 2; }\nprotocol kernel { ipv4 { export all; }; }\n\
         protocol bgp lb0 { local 10.100.0.4 as 65002; neighbor 10.100.0.1 as 8103; ipv4 { import all; export none; }; }\n",
    )
    .unwrap();
    let sock = rig.dir.join("plain.ctl");
    let mut plain_bird = plain.spawn(&["bird", "-f", "-c", conf.to_str().unwrap(), "-s", sock.to_str().unwrap()]);
    let prefix = format!("bgp{}b6", std::process::id());
    let text = appliance_config(&prefix, 0, false, &rig.dir, Eps::Same, true)
        .replace("bfd: {switch: true, minTx: 100ms", "bfd: {minTx: 100ms")
        .replace("services:\n", "  - {name: plain, address: 10.100.0.4, interface: front, bgp: {localASN: 8103, remoteASN: 65002}}\nservices:\n");
    assert!(text.contains("bfd: {minTx: 100ms") && text.contains("name: plain"), "{text}");
    rig.rewrite(0, &text);
    rig.start(0);
    let session = |st: &Value, name: &str| st["bird"]["sessions"].as_array().and_then(|s| s.iter().find(|x| x["router"] == name).cloned()).unwrap_or(Value::Null);
    let plain_route = || String::from_utf8_lossy(&plain.output(&["ip", "-4", "route", "show", VIP4]).stdout).trim().to_owned();
    let t0 = Instant::now();
    let both = wait_until(Duration::from_secs(60), || {
        let st = rig.status(0);
        rig.peered(0) && session(&st, "plain")["bgp_state"] == "Established" && plain_route().contains("10.100.0.1")
    });
    if !both {
        let (_, _, log) = plain_bird.stop("TERM", Duration::from_secs(5));
        let st = rig.status(0);
        rig.fail(&format!("both routers were not peered, the gateway with BFD Up: {}\n--- router without BFD:\n{log}", st["bird"]));
    }
    eprintln!("both peered {} ms after start; router without BFD: {}", t0.elapsed().as_millis(), session(&rig.status(0), "plain"));
    let st = rig.status(0);
    let gw = session(&st, "dc-gw-v4");
    assert_eq!((gw["bfd"].as_bool(), gw["bfd_state"].as_str()), (Some(true), Some("Up")), "{gw}");
    let p = session(&st, "plain");
    assert_eq!(p["bfd"], true, "BFD is asked for by default: {p}");
    assert_ne!(p["bfd_state"], "Up", "the router without BFD never answers BFD: {p}");
    let _ = plain_bird.stop("TERM", Duration::from_secs(5));
}

/// A worker stops polling (the test hook: SIGUSR2 freezes the appliance's
/// only worker), so the appliance can send nothing, its withdrawal
/// included. With BFD on by default the gateway drops the VIP within about
/// a second all the same; the stall is reported once (log line,
/// `sluice_worker_stalled`, `/healthz` 503); after `dpdk.stallExitSeconds`
/// the process exits with status 3, and a new `sluice run` peers again.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_stalled_worker_is_left_by_the_gateway_reported_and_ends_the_process() {
    privileged();
    const EXIT_AFTER: u64 = 4;
    let mut rig = Rig::new("b7", 1, false, false, Eps::Same);
    let prefix = format!("bgp{}b7", std::process::id());
    let text = appliance_config(&prefix, 0, false, &rig.dir, Eps::Same, true)
        .replace(", bfd: {switch: true, minTx: 100ms, minRx: 100ms, multiplier: 3}", "")
        .replace("descriptors: 512}", &format!("descriptors: 512, stallExitSeconds: {EXIT_AFTER}}}"));
    assert!(!text.contains("bfd:") && text.contains("stallExitSeconds"), "{text}");
    rig.rewrite(0, &text);
    rig.start_with(0, &["SLUICE_TEST_HOOKS=1"]);
    if !wait_until(Duration::from_secs(60), || rig.peered(0)) {
        rig.fail("no BGP session with BFD (on by default) up, or the VIP was not learned");
    }
    assert_eq!(rig.admin(0, "/healthz").0, "200");
    let pid = rig.lbs[0].proc.as_ref().and_then(Proc::id).unwrap();
    let t0 = Instant::now();
    sluice_tests::run(&["kill", "-USR2", &pid.to_string()]);
    let left = wait_until(Duration::from_secs(12), || rig.gw_route(VIP4).is_empty());
    let left_after = t0.elapsed();
    if !left {
        rig.fail("the gateway still routes the VIP to the stalled appliance");
    }
    // BFD's detection time (300 ms x 3 by default), not the hold time (9 s
    // here: the gateway would wait 6 to 9 s for the next keepalive).
    if left_after > Duration::from_secs(3) {
        rig.fail(&format!("the gateway dropped the VIP {} ms after the stall: that is the hold time, not BFD's detection time", left_after.as_millis()));
    }
    let reported = wait_until(Duration::from_secs(5), || rig.admin(0, "/healthz").0 == "503");
    let reported_after = t0.elapsed();
    if !reported {
        rig.fail("/healthz did not report the stalled worker");
    }
    let (_, why) = rig.admin(0, "/healthz");
    assert!(why.contains("has not polled"), "{why}");
    let (_, metrics) = rig.admin(0, "/metrics");
    assert!(metrics.lines().any(|l| l.starts_with("sluice_worker_stalled{") && l.ends_with(" 1")), "{metrics}");
    let proc = rig.lbs[0].proc.as_mut().unwrap();
    let exited = wait_until(Duration::from_secs(EXIT_AFTER + 10), || !proc.running());
    let exited_after = t0.elapsed();
    let (code, _, err) = rig.lbs[0].proc.take().unwrap().stop("KILL", Duration::from_secs(5));
    eprintln!(
        "worker stalled: the gateway dropped the VIP after {} ms, /healthz 503 after {} ms, the process exited ({code:?}) after {} ms",
        left_after.as_millis(),
        reported_after.as_millis(),
        exited_after.as_millis()
    );
    assert!(exited, "still running {} s after the stall:\n{err}", exited_after.as_secs());
    assert_eq!(code, Some(3), "{err}");
    assert!(exited_after >= Duration::from_secs(EXIT_AFTER), "exited before dpdk.stallExitSeconds: {exited_after:?}");
    assert_eq!(err.matches("worker stalled").count(), 1, "reported once:\n{err}");
    assert!(err.contains("exiting for the supervisor"), "{err}");

    // The supervisor's restart: a new process starts, peers and announces.
    let t1 = Instant::now();
    rig.start(0);
    if !wait_until(Duration::from_secs(60), || rig.peered(0)) {
        rig.fail("after the exit, a new sluice run did not peer again");
    }
    eprintln!("started again: peered, the VIP back in the gateway's FIB, after {} ms", t1.elapsed().as_millis());
}

/// A GatewayRouter name of 100 characters (BIRD takes protocol names of
/// at most 64): the appliance peers under a protocol name cut to fit with
/// a hash, announces the VIP, and withdraws it when its service loses its
/// endpoints; the status says what BIRD did each time.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_hundred_character_router_name_announces_and_withdraws() {
    privileged();
    let long = format!("dc-gateway-router-{}", "x".repeat(82));
    assert_eq!(long.len(), 100);
    let mut rig = Rig::new("b5", 1, false, false, Eps::Same);
    let prefix = format!("bgp{}b5", std::process::id());
    let dir = rig.dir.clone();
    let config = |eps| appliance_config(&prefix, 0, false, &dir, eps, true).replace("name: dc-gw-v4", &format!("name: {long}"));
    rig.rewrite(0, &config(Eps::Same));
    rig.start(0);
    if !wait_until(Duration::from_secs(60), || rig.peered(0)) {
        rig.fail("no BGP session with BFD up for the router with a long name, or the VIP was not learned");
    }
    let st = rig.status(0);
    let session = &st["bird"]["sessions"][0];
    assert_eq!(session["router"], long.as_str());
    let protocol = session["protocol"].as_str().unwrap().to_owned();
    assert!(protocol.len() <= 64 && protocol.starts_with("gw_dc_gateway_router_x"), "{protocol}");
    let vip = |st: &Value| st["bird"]["vips"].as_array().unwrap().iter().find(|v| v["vip"] == VIP4).cloned().unwrap();
    let announced = wait_until(Duration::from_secs(10), || vip(&rig.status(0))["announced"] == true);
    assert!(announced, "{}", rig.status(0)["bird"]);
    eprintln!("router {long:?} peers as BIRD protocol {protocol}; VIP: {}", vip(&rig.status(0)));

    let t0 = Instant::now();
    rig.rewrite(0, &config(Eps::Gone));
    if !wait_until(Duration::from_secs(10), || rig.gw_route(VIP4).is_empty()) {
        rig.fail("the VIP was not withdrawn from the gateway");
    }
    eprintln!("withdrawn from the gateway's FIB {} ms after the service lost its endpoints", t0.elapsed().as_millis());
    let withdrawn = wait_until(Duration::from_secs(5), || vip(&rig.status(0))["reason"] == "withdrawn: no ready endpoint in service web4");
    assert!(withdrawn, "{}", vip(&rig.status(0)));
    assert_eq!(rig.status(0)["bird"]["refused"], Value::Null);
}

/// Two appliances announce the same VIP and the gateway spreads `N`
/// long-lived TCP connections over both with ECMP; the second appliance
/// (whose endpoints are `second`) is stopped gracefully while they run.
/// Returns how many connections survived and how many broke.
fn ecmp_graceful_stop(tag: &str, second: Eps) -> (u64, u64) {
    let mut rig = Rig::new(tag, 2, false, true, second);
    rig.start(0);
    rig.start(1);
    let both = wait_until(Duration::from_secs(90), || {
        let r = rig.gw_route(VIP4);
        rig.peered(0) && rig.peered(1) && r.contains("nexthop via 10.100.0.1") && r.contains("nexthop via 10.100.0.3")
    });
    if !both {
        rig.fail("the gateway has no ECMP route over both appliances");
    }
    eprintln!("gateway FIB: {}", rig.gw_route(VIP4).replace('\n', " "));
    let out = rig.dir.join("hold.json");
    let script = root().join("scripts/client.py");
    let mut hold = rig.client.spawn(&["python3", script.to_str().unwrap(), "hold", VIP4, &N.to_string(), "15", out.to_str().unwrap()]);
    let ready = PathBuf::from(format!("{}.ready", out.display()));
    if !wait_until(Duration::from_secs(20), || ready.exists()) {
        let (_, o, e) = hold.stop("KILL", Duration::from_secs(1));
        rig.fail(&format!("the connections could not be opened: {o}{e}"));
    }
    let balanced = |rig: &Rig, k: usize| -> u64 {
        rig.status(k)["workers"].as_array().map_or(0, |w| w.iter().map(|w| w["balanced"].as_u64().unwrap_or(0)).sum())
    };
    let both = wait_until(Duration::from_secs(10), || balanced(&rig, 0) > 0 && balanced(&rig, 1) > 0);
    let (a, b) = (balanced(&rig, 0), balanced(&rig, 1));
    eprintln!("packets balanced before the stop: appliance 0: {a}, appliance 1: {b}");
    assert!(both, "ECMP uses both appliances: {a} / {b}");

    let (code, _, err) = rig.lbs[1].proc.take().unwrap().stop("TERM", Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    // Withdrawn before the process ended: the gateway no longer routes to
    // appliance 1. Its BIRD may be re-installing the route with the one
    // next hop left at this instant, so that one is awaited.
    let mut r = rig.gw_route(VIP4);
    assert!(!r.contains("10.100.0.3"), "appliance 1 is still routed to after it stopped: {r}");
    let left = wait_until(Duration::from_secs(5), || {
        r = rig.gw_route(VIP4);
        r.contains("10.100.0.1") && !r.contains("10.100.0.3")
    });
    assert!(left, "only appliance 0 is left: {r}");

    // The client holds its connections for 15 s in all, then reports.
    let done = wait_until(Duration::from_secs(40), || out.exists() && !hold.running());
    assert!(done, "the client did not finish");
    let res = held_outcome(&out);
    let (ok, broken) = res.values().fold((0, 0), |(o, b), [ok, broken]| (o + ok, b + broken));
    eprintln!("long-lived connections: {ok} survived, {broken} broke (of {N}); per backend [ok, broken]: {res:?}");
    if broken > 0 {
        eprintln!("when (s after the first round) and why they broke: {}", held_why(&out));
    }
    assert_eq!(ok + broken, N as u64);
    (ok, broken)
}

/// Long-lived connections held open over both appliances.
const N: usize = 64;

/// Identical tables: the flows that move land on the same backend, so
/// every connection survives the graceful stop of one appliance.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn ecmp_two_appliances_long_lived_tcp_survives_a_graceful_stop() {
    privileged();
    let (_, broken) = ecmp_graceful_stop("b2", Eps::Same);
    assert_eq!(broken, 0, "every connection survives");
}

/// The control: the second appliance identifies the same endpoints
/// differently, so its table disagrees; the flows that move from it break,
/// the others do not. (This is what the test above would see if tables
/// were not built from endpoint identifiers alone.)
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn ecmp_with_disagreeing_tables_breaks_the_flows_that_move() {
    privileged();
    let (ok, broken) = ecmp_graceful_stop("b3", Eps::Rotated);
    assert!(broken > 0 && ok > 0, "{ok} survived, {broken} broke");
}

/// Appliance `k`'s `siblings:` section: the two appliances share pins over
/// a link of their own (10.99.0.0/24), with the key in `dir`.
fn siblings(k: usize, dir: &Path) -> String {
    format!(
        "siblings: {{listen: \"10.99.0.{}:7946\", peers: [\"10.99.0.{}:7946\"], keyFile: {}, startupWaitMs: 5000}}\n",
        1 + k,
        2 - k,
        dir.join("sync.key").display()
    )
}

/// Appliance `k`'s sync peers (one: the other appliance), as its status
/// shows them.
fn sync_peers(rig: &Rig, k: usize) -> Vec<Value> {
    rig.status(k)["sync"]["peers"].as_array().cloned().unwrap_or_default()
}

/// Both ways between the two appliances: connected, in sync, and nothing
/// queued.
fn synced(rig: &Rig) -> bool {
    (0..2).all(|k| {
        let p = sync_peers(rig, k);
        p.len() == 1 && p[0]["connected"] == true && p[0]["in_sync"] == true && p[0]["subscribed"] == true && p[0]["lag"] == 0
    })
}

/// Every appliance in the gateway's ECMP route, peered, and (with sync)
/// in sync with the other.
fn both_routed(rig: &Rig, sync: bool) -> bool {
    let r = rig.gw_route(VIP4);
    rig.peered(0) && rig.peered(1) && r.contains("nexthop via 10.100.0.1") && r.contains("nexthop via 10.100.0.3") && (!sync || synced(rig))
}

/// Only appliance `k` in the gateway's route.
fn only(rig: &Rig, k: usize) -> bool {
    let r = rig.gw_route(VIP4);
    r.contains(&front4(k)) && !r.contains(&front4(1 - k))
}

/// Long-lived TCP connections and UDP flows over two appliances behind
/// ECMP, each appliance with flow state (the default); an endpoint is
/// added on both while they run. With `sync`, the appliances are siblings;
/// then appliance 1 is stopped gracefully and started again, appliance 0
/// is killed with SIGKILL and started again. Without `sync`, only the
/// graceful stop. Returns the TCP and UDP outcomes (survived, broke).
fn ecmp_add_then_stop(tag: &str, sync: bool) -> ((u64, u64), (u64, u64)) {
    let mut rig = Rig::new(tag, 2, false, true, Eps::Two);
    let prefix = format!("bgp{}{tag}", std::process::id());
    std::fs::write(rig.dir.join("sync.key"), "a shared key of more than 32 bytes, for the test\n").unwrap();
    veth(&rig.lbs[0].ns, "sy", &rig.lbs[1].ns, "sy");
    for k in 0..2 {
        rig.lbs[k].ns.run(&["ip", "addr", "add", &format!("10.99.0.{}/24", 1 + k), "dev", "sy"]);
    }
    let dir = rig.dir.clone();
    let config = |k: usize, eps: Eps| {
        let text = appliance_config(&prefix, k, false, &dir, eps, false);
        if sync {
            text + &siblings(k, &dir)
        } else {
            text
        }
    };
    for k in 0..2 {
        rig.rewrite(k, &config(k, Eps::Two));
    }
    rig.start(0);
    rig.start(1);
    if !wait_until(Duration::from_secs(90), || both_routed(&rig, sync)) {
        let st = format!("{} / {}", rig.status(0)["sync"], rig.status(1)["sync"]);
        rig.fail(&format!("the gateway has no ECMP route over both appliances, or they are not in sync: {st}"));
    }

    let script = root().join("scripts/client.py");
    let (tcp, udp) = (rig.dir.join("hold.json"), rig.dir.join("udphold.json"));
    let mut hold = rig.client.spawn(&["python3", script.to_str().unwrap(), "hold", VIP4, &SIBLING_TCP.to_string(), "300", tcp.to_str().unwrap()]);
    let mut udphold = rig.client.spawn(&["python3", script.to_str().unwrap(), "udphold", VIP4, &SIBLING_UDP.to_string(), "300", udp.to_str().unwrap()]);
    let rounds = |out: &Path| -> u64 { std::fs::read_to_string(format!("{}.rounds", out.display())).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0) };
    // A few rounds of each on every flow: `at` rounds more than now.
    let after = |n: u64| {
        let (t, u) = (rounds(&tcp) + n, rounds(&udp) + n);
        wait_until(Duration::from_secs(60), || rounds(&tcp) >= t && rounds(&udp) >= u)
    };
    if !wait_until(Duration::from_secs(20), || rounds(&tcp) > 0 && rounds(&udp) > 0) {
        let (_, o, e) = hold.stop("KILL", Duration::from_secs(1));
        rig.fail(&format!("the flows could not be opened: {o}{e}"));
    }
    let balanced = |rig: &Rig, k: usize| -> u64 {
        rig.status(k)["workers"].as_array().map_or(0, |w| w.iter().map(|w| w["balanced"].as_u64().unwrap_or(0)).sum())
    };
    let used = wait_until(Duration::from_secs(10), || balanced(&rig, 0) > 0 && balanced(&rig, 1) > 0);
    assert!(used, "ECMP uses both appliances: {} / {}", balanced(&rig, 0), balanced(&rig, 1));

    // An endpoint added on both: about a third of the table's slots
    // change, and with them the choice for the flows pinned there.
    let generation = |rig: &Rig, k: usize| rig.status(k)["generation"].as_u64().unwrap_or(0);
    let before = [generation(&rig, 0), generation(&rig, 1)];
    for k in 0..2 {
        rig.rewrite(k, &config(k, Eps::Same));
    }
    assert!(wait_until(Duration::from_secs(10), || generation(&rig, 0) > before[0] && generation(&rig, 1) > before[1]), "both appliances took the new endpoint");
    // Every flow sent under the new tables; then nothing left to send.
    assert!(after(3), "the flows go on");
    if sync {
        if !wait_until(Duration::from_secs(10), || synced(&rig)) {
            rig.fail("the pins of the change were not sent (sync lag)");
        }
        for k in 0..2 {
            eprintln!("after the change, appliance {k}'s sync: {}", rig.status(k)["sync"]);
        }
    }

    // Appliance 1 stopped gracefully: its flows go to appliance 0.
    let (code, _, err) = rig.lbs[1].proc.take().unwrap().stop("TERM", Duration::from_secs(30));
    assert_eq!(code, Some(0), "{err}");
    assert!(wait_until(Duration::from_secs(5), || only(&rig, 0)), "only appliance 0 is routed to: {}", rig.gw_route(VIP4));
    assert!(after(5), "the flows go on");
    if sync {
        eprintln!("after appliance 1 stopped, appliance 0's sync: {}", rig.status(0)["sync"]);
        // Appliance 1 again: it takes appliance 0's pins before announcing.
        rig.start(1);
        if !wait_until(Duration::from_secs(60), || both_routed(&rig, true)) {
            rig.fail("appliance 1 did not come back into the ECMP route in sync");
        }
        assert!(after(5), "the flows go on");
        eprintln!("appliance 1 back; its sync: {}", rig.status(1)["sync"]);
        // Appliance 0 killed: its flows go to appliance 1 (the gateway's
        // BFD notices), then it is started again.
        let (code, _, _) = rig.lbs[0].proc.take().unwrap().stop("KILL", Duration::from_secs(10));
        assert_eq!(code, None, "killed by SIGKILL");
        assert!(wait_until(Duration::from_secs(10), || only(&rig, 1)), "only appliance 1 is routed to: {}", rig.gw_route(VIP4));
        assert!(after(5), "the flows go on");
        rig.start(0);
        if !wait_until(Duration::from_secs(60), || both_routed(&rig, true)) {
            rig.fail("appliance 0 did not come back into the ECMP route in sync after SIGKILL");
        }
        assert!(after(5), "the flows go on");
        for k in 0..2 {
            eprintln!("at the end, appliance {k}'s sync: {}", rig.status(k)["sync"]);
        }
    }

    for out in [&tcp, &udp] {
        std::fs::write(format!("{}.stop", out.display()), "").unwrap();
    }
    let done = wait_until(Duration::from_secs(40), || tcp.exists() && udp.exists() && !hold.running() && !udphold.running());
    assert!(done, "the clients did not finish");
    let mut outcome = Vec::new();
    for (what, out, n) in [("TCP connections", &tcp, SIBLING_TCP), ("UDP flows", &udp, SIBLING_UDP)] {
        let res = held_outcome(out);
        let (ok, broken) = res.values().fold((0, 0), |(o, b), [ok, broken]| (o + ok, b + broken));
        eprintln!("{what}: {ok} survived, {broken} broke (of {n}); per backend [ok, broken]: {res:?}");
        if broken > 0 {
            eprintln!("when (s after the first round) and why they broke: {}", held_why(out));
        }
        assert_eq!(ok + broken, n as u64);
        outcome.push((ok, broken));
    }
    (outcome[0], outcome[1])
}

/// Long-lived TCP connections and UDP flows held over two sibling appliances.
const SIBLING_TCP: usize = 48;
const SIBLING_UDP: usize = 24;

/// Two sibling appliances behind ECMP, an endpoint added: every flow (all
/// endpoints stay) survives one appliance stopping gracefully, starting
/// again, the other killed with SIGKILL and starting again.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn siblings_keep_every_flow_through_an_added_endpoint_a_stop_a_kill_and_restarts() {
    privileged();
    let (tcp, udp) = ecmp_add_then_stop("b8", true);
    assert_eq!((tcp.1, udp.1), (0, 0), "every flow survives: TCP {tcp:?}, UDP {udp:?} (survived, broke)");
}

/// The control: the same without siblings. The flows of appliance 1 in
/// the slots the new endpoint took reach appliance 0's new choice and
/// break when appliance 1 stops (the others survive).
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn without_siblings_an_added_endpoint_then_a_stop_breaks_the_flows_that_move() {
    privileged();
    let (tcp, udp) = ecmp_add_then_stop("b9", false);
    assert!(tcp.1 > 0 && tcp.0 > 0, "TCP: {} survived, {} broke", tcp.0, tcp.1);
    eprintln!("UDP without siblings: {} survived, {} broke", udp.0, udp.1);
}

/// Three sibling appliances behind ECMP with `siblings.gate: true`, their
/// sync link a bridge of its own (10.99.0.0/24): the rig, and each
/// appliance's configuration with endpoint 2's weight and, optionally, an
/// active check of the service.
struct Siblings3 {
    rig: Rig,
    _link: Netns,
    prefix: String,
}

/// The service's active check in [`Siblings3::config`]: HTTP on the
/// backends' port 8080, every 300 ms, out after 2 failures, back after 2.
const CHECK: &str = "    healthCheck: {protocol: http, port: 8080, path: /healthz, intervalMs: 300, timeoutMs: 200, rise: 2, fall: 2}\n";

impl Siblings3 {
    fn new(tag: &str, check: bool) -> Siblings3 {
        let rig = Rig::new(tag, 3, false, true, Eps::Same);
        let prefix = format!("bgp{}{tag}", std::process::id());
        std::fs::write(rig.dir.join("sync.key"), "a shared key of more than 32 bytes, for the test\n").unwrap();
        let link = Netns::new(&format!("{tag}sy"));
        link.run(&["ip", "link", "add", "syb", "type", "bridge"]);
        link.run(&["ip", "link", "set", "syb", "up"]);
        for k in 0..3 {
            veth(&link, &format!("s{k}"), &rig.lbs[k].ns, "sy");
            link.run(&["ip", "link", "set", &format!("s{k}"), "master", "syb"]);
            rig.lbs[k].ns.run(&["ip", "addr", "add", &format!("10.99.0.{}/24", 1 + k), "dev", "sy"]);
        }
        let mut me = Siblings3 { rig, _link: link, prefix };
        for k in 0..3 {
            me.rig.rewrite(k, &me.config(k, 1, check));
        }
        for k in 0..3 {
            me.rig.start(k);
        }
        if !wait_until(Duration::from_secs(120), || (0..3).all(|k| me.rig.peered(k)) && me.routed(&[0, 1, 2]) && me.all_agree()) {
            let st: Vec<String> = (0..3).map(|k| me.agreement(k).to_string()).collect();
            me.rig.fail(&format!("the gateway has no ECMP route over the three appliances, or they do not agree: {st:?}"));
        }
        eprintln!("gateway FIB: {}", me.rig.gw_route(VIP4).replace('\n', " "));
        me
    }

    fn config(&self, k: usize, weight: u32, check: bool) -> String {
        let dir = &self.rig.dir;
        let mut text = appliance_config(&self.prefix, k, false, dir, Eps::Same, false)
            .replace("{id: 2, address: 10.200.0.13}", &format!("{{id: 2, address: 10.200.0.13, weight: {weight}}}"));
        if check {
            text = text.replace("    endpoints: [{id: 0, address: 10.200.0.11}", &format!("{CHECK}    endpoints: [{{id: 0, address: 10.200.0.11}}"));
        }
        let peers: Vec<String> = (0..3).filter(|j| *j != k).map(|j| format!("\"10.99.0.{}:7946\"", 1 + j)).collect();
        text + &format!(
            "siblings: {{listen: \"10.99.0.{}:7946\", peers: [{}], keyFile: {}, startupWaitMs: 5000, gate: true}}\n",
            1 + k,
            peers.join(", "),
            dir.join("sync.key").display()
        )
    }

    fn agreement(&self, k: usize) -> Value {
        self.rig.status(k)["sync"]["agreement"].clone()
    }

    /// Exactly the appliances `ks` in the gateway's route.
    fn routed(&self, ks: &[usize]) -> bool {
        let r = self.rig.gw_route(VIP4);
        (0..3).all(|k| r.contains(&format!("nexthop via {}", front4(k))) == ks.contains(&k))
    }

    fn all_agree(&self) -> bool {
        (0..3).all(|k| {
            let a = self.agreement(k);
            a["siblings_compared"] == 2 && a["mismatched"] == 0
        })
    }

    /// Appliance `k`'s table of web4: its digest and endpoint addresses.
    fn table(&self, k: usize) -> (String, Vec<String>) {
        let bin = sluice_bin();
        let out = self.rig.lbs[k].ns.output(&[bin.to_str().unwrap(), "tables", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let t = v.as_array().and_then(|a| a.iter().find(|t| t["service"] == "web4")).cloned().unwrap_or(Value::Null);
        let eps = t["endpoints"].as_array().map(|e| e.iter().map(|x| x[1].as_str().unwrap_or_default().to_owned()).collect()).unwrap_or_default();
        (t["digest"].as_str().unwrap_or_default().to_owned(), eps)
    }
}

/// Appliance 2 is given another weight for one endpoint. The mismatch
/// shows in all three (reported: the time from appliance 2's new
/// generation), appliance 2 alone is in the minority, and the gateway
/// (BIRD, a real BGP speaker) drops its path and keeps the two others'.
/// Given the same weight again, it agrees and is routed to again. Stopped
/// and started again with the other weight, it never announces: from its
/// start until 3 s after its BGP session is up, the gateway never routes
/// to it.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn three_siblings_one_with_another_weight_is_seen_by_all_and_only_its_path_is_dropped() {
    privileged();
    let mut f = Siblings3::new("ba", false);
    // Appliance 2: endpoint 2 weighs 3.
    let generation = |rig: &Rig, k: usize| rig.status(k)["generation"].as_u64().unwrap_or(0);
    let before = generation(&f.rig, 2);
    let written = Instant::now();
    f.rig.rewrite(2, &f.config(2, 3, false));
    assert!(wait_until(Duration::from_secs(10), || generation(&f.rig, 2) > before), "appliance 2 took its new configuration");
    let applied = Instant::now();
    let mut seen = [None; 3];
    let all_seen = wait_until(Duration::from_secs(10), || {
        for (k, s) in seen.iter_mut().enumerate() {
            if s.is_none() && f.agreement(k)["mismatched"] == 1 {
                *s = Some(applied.elapsed());
            }
        }
        seen.iter().all(Option::is_some)
    });
    if !all_seen {
        let st: Vec<String> = (0..3).map(|k| f.agreement(k).to_string()).collect();
        f.rig.fail(&format!("the mismatch does not show in all three: {seen:?} {st:?}"));
    }
    let last = seen.iter().flatten().max().copied().unwrap();
    eprintln!(
        "mismatch shown by appliances 0, 1, 2 at {:?} after appliance 2's new generation was seen ({:?} after the file was written; each status read takes a process start)",
        seen,
        applied.duration_since(written)
    );
    // The status is read by starting `sluice status` in each namespace in
    // turn: a margin of three reads over the second claimed.
    assert!(last < Duration::from_secs(3), "shown by all within the margin: {last:?}");
    for k in 0..3 {
        let a = f.agreement(k);
        let m = &a["services_mismatched"][0];
        assert_eq!(m["service"], "web4", "{a}");
        assert_eq!(m["minority"], k == 2, "appliance {k}: {a}");
    }

    // Gating: the gateway drops appliance 2's path and keeps the others'.
    if !wait_until(Duration::from_secs(15), || f.routed(&[0, 1])) {
        f.rig.fail(&format!("the gateway still routes to appliance 2: {} / {}", f.rig.gw_route(VIP4), f.rig.status(2)["bird"]["vips"]));
    }
    eprintln!("appliance 2's path dropped {:?} after its new generation; gateway FIB: {}", applied.elapsed(), f.rig.gw_route(VIP4).replace('\n', " "));
    let vips = f.rig.status(2)["bird"]["vips"].clone();
    assert!(vips[0]["reason"].as_str().unwrap_or_default().contains("siblings.gate"), "{vips}");
    for k in 0..2 {
        let v = f.rig.status(k)["bird"]["vips"].clone();
        assert_eq!(v[0]["announced"], true, "appliance {k} keeps announcing: {v}");
    }

    // The same weight again: it agrees and is routed to again.
    let back = Instant::now();
    f.rig.rewrite(2, &f.config(2, 1, false));
    if !wait_until(Duration::from_secs(30), || f.routed(&[0, 1, 2]) && f.all_agree()) {
        f.rig.fail("appliance 2 did not come back after agreeing again");
    }
    eprintln!("appliance 2 routed to again {:?} after its file was restored", back.elapsed());

    // Started again with the other weight: never announced.
    let (code, _, err) = f.rig.lbs[2].proc.take().unwrap().stop("INT", Duration::from_secs(30));
    assert_eq!(code, Some(0), "appliance 2 stops cleanly: {err}");
    if !wait_until(Duration::from_secs(15), || f.routed(&[0, 1])) {
        f.rig.fail("the gateway still routes to appliance 2 after it stopped");
    }
    f.rig.rewrite(2, &f.config(2, 3, false));
    let started = Instant::now();
    f.rig.start(2);
    let via2 = format!("nexthop via {}", front4(2));
    // Its BGP session with the gateway is up (`Rig::peered` also wants its route).
    let session_up = |rig: &Rig| {
        let st = rig.status(2);
        st["bird"]["sessions"].as_array().is_some_and(|s| s.iter().any(|x| x["router"] != "plain") && s.iter().filter(|x| x["router"] != "plain").all(|x| x["bgp_state"] == "Established"))
    };
    let mut peered: Option<Instant> = None;
    while peered.is_none_or(|t| t.elapsed() < Duration::from_secs(3)) {
        let route = f.rig.gw_route(VIP4);
        if route.contains(&via2) {
            f.rig.fail(&format!("appliance 2, started with another weight, was routed to {:?} after its start: {route}", started.elapsed()));
        }
        if peered.is_none() && session_up(&f.rig) {
            peered = Some(Instant::now());
            eprintln!("appliance 2 peered with the gateway {:?} after its start, not routed to", started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(90) {
            f.rig.fail("appliance 2 did not peer with the gateway after its start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let vips = f.rig.status(2)["bird"]["vips"].clone();
    assert!(vips[0]["reason"].as_str().unwrap_or_default().contains("siblings.gate"), "{vips}");
    assert_eq!(f.agreement(2)["services_mismatched"][0]["minority"], true);
}

/// Only appliance 0's active checks fail for backend 3 (backend 3 drops
/// its checks, nft): appliance 0's verdict is shared, the two others take
/// backend 3 out as well, the three tables stay alike (no mismatch, no
/// path dropped), and backend 3 comes back on all three once appliance 0's
/// checks pass again.
#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn one_siblings_health_verdict_is_applied_by_all_and_the_tables_stay_alike() {
    privileged();
    let mut f = Siblings3::new("bh", true);
    let (digest, eps) = f.table(0);
    assert_eq!(eps.len(), 3, "{eps:?}");
    let be3 = &f.rig._backends[2];
    for cmd in [
        "add table inet hc",
        "add chain inet hc in { type filter hook input priority 0 ; }",
        "add rule inet hc in ip saddr 10.200.0.1 tcp dport 8080 drop",
    ] {
        let out = be3.output(&["nft", cmd]);
        assert!(out.status.success(), "nft {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let cut = Instant::now();
    let out_on_all = || (0..3).all(|k| !f.table(k).1.iter().any(|a| a == "10.200.0.13"));
    let mut disagreed = 0;
    let gone = wait_until(Duration::from_secs(15), || {
        disagreed += (0..3).filter(|&k| f.agreement(k)["withdrawn"] != 0).count();
        out_on_all()
    });
    if !gone {
        let st: Vec<String> = (0..3).map(|k| format!("{} {:?}", f.rig.status(k)["sync"], f.table(k))).collect();
        f.rig.fail(&format!("backend 3 is not out on all three: {st:?}"));
    }
    eprintln!("backend 3 out of the three tables {:?} after appliance 0's checks were cut", cut.elapsed());
    let tables: Vec<(String, Vec<String>)> = (0..3).map(|k| f.table(k)).collect();
    assert!(tables.iter().all(|t| t.0 == tables[0].0 && t.0 != digest), "the same new table on all three: {tables:?}");
    for k in 1..3 {
        let y = f.rig.status(k)["sync"].clone();
        assert_eq!(y["health_from_siblings"], serde_json::json!(["web4/2"]), "appliance {k} took appliance 0's verdict: {y}");
    }
    assert!(f.all_agree(), "no mismatch");
    assert_eq!(disagreed, 0, "nothing withdrawn meanwhile");
    assert!(f.routed(&[0, 1, 2]), "every path kept: {}", f.rig.gw_route(VIP4));

    // Appliance 0's checks pass again: backend 3 back on all three.
    let out = be3.output(&["nft", "delete", "table", "inet", "hc"]);
    assert!(out.status.success());
    let healed = Instant::now();
    if !wait_until(Duration::from_secs(15), || (0..3).all(|k| f.table(k) == (digest.clone(), eps.clone()))) {
        f.rig.fail("backend 3 did not come back on all three");
    }
    eprintln!("backend 3 back in the three tables {:?} after appliance 0's checks passed again", healed.elapsed());
    assert!(f.all_agree() && f.routed(&[0, 1, 2]));
}
