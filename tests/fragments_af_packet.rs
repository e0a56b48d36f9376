//! Fragmented datagrams across af_packet ports, end to end (scripts/topology.sh).
//!
//! DPDK's af_packet driver has the kernel reassemble IPv4 fragments before
//! it sees them (its packet socket joins a fanout group with the defrag
//! flag). The client sends 3,000-byte UDP payloads (3,028-byte datagrams)
//! that its kernel fragments at MTU 1500; the appliance receives each one
//! whole and must send it to one backend fragmented again to the back
//! port's MTU. Each backend socket records what it receives (length and
//! digest) and echoes it; the echo, fragmented by the backend's kernel,
//! comes back through the appliance (reassembled again) to the client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::time::Duration;

use sluice_tests::topology::{stop_cleanly, tempdir, Topology};
use sluice_tests::{privileged, sluice_bin, wait_until, Proc};

const CONFIG: &str = r#"
dpdk: {lcores: "0,1", memoryMB: 512, hugepages: false, filePrefix: PREFIX, descriptors: 512}
ports:
  - {name: front, device: "net_af_packet0,iface=lbf", addresses: [10.100.0.1/24], kernelInterface: sl-front}
  - {name: back, device: "net_af_packet1,iface=lbb", addresses: [10.200.0.1/24], kernelInterface: sl-back}
gateways:
  - {address: 10.100.0.2, port: front}
services:
  - name: big
    endpoints: [{id: 0, address: 10.200.0.11}, {id: 1, address: 10.200.0.12}, {id: 2, address: 10.200.0.13}]
routes:
  - {name: big, service: big, vips: [20.0.0.1], protocols: [UDP], destinationPorts: ["7000"]}
"#;

/// The backend: receives on VIP:7000, appends `LEN SHA256` for each
/// datagram to the file, echoes the datagram back.
const BACKEND: &str = r#"
import hashlib, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 0)  # IP_MTU_DISCOVER = IP_PMTUDISC_DONT: no DF
s.bind(("20.0.0.1", 7000))
with open(sys.argv[1], "a") as out:
    while True:
        d, peer = s.recvfrom(65535)
        out.write("%d %s\n" % (len(d), hashlib.sha256(d).hexdigest()))
        out.flush()
        s.sendto(d, peer)
"#;

/// The client: sends N payloads of SIZE bytes (each different) to
/// VIP:7000 without DF, printing `sent LEN SHA256` for each, then `echo
/// LEN SHA256` for each echo it gets back within the time limit.
const CLIENT: &str = r#"
import hashlib, socket, sys, time
n, size = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 10, 0)
s.settimeout(0.2)
for i in range(n):
    d = bytes((i * 7 + k) % 251 for k in range(size))
    print("sent", len(d), hashlib.sha256(d).hexdigest(), flush=True)
    s.sendto(d, ("20.0.0.1", 7000))
end = time.time() + 5
got = 0
while got < n and time.time() < end:
    try:
        d = s.recv(65535)
    except socket.timeout:
        continue
    got += 1
    print("echo", len(d), hashlib.sha256(d).hexdigest(), flush=True)
"#;

const DATAGRAMS: usize = 5;
const PAYLOAD: usize = 3000;

#[test]
#[cfg_attr(sluice_unprivileged, ignore = "needs root: network namespaces and DPDK")]
fn a_datagram_the_kernel_reassembled_reaches_one_backend_fragmented_again() {
    privileged();
    let prefix = format!("fr{}", std::process::id());
    let topo = Topology::up(&prefix);
    let dir = tempdir(&prefix);
    let logs: Vec<_> = (1..=3).map(|i| dir.join(format!("be{i}.log"))).collect();
    let _backends: Vec<Proc> = (1..=3)
        .map(|i| topo.spawn(&format!("be{i}"), &["python3", "-c", BACKEND, logs[i - 1].to_str().unwrap()]))
        .collect();
    let cfg = dir.join("appliance.yaml");
    std::fs::write(&cfg, CONFIG.replace("PREFIX", &prefix)).unwrap();
    let bin = sluice_bin();
    let mut lb = topo.spawn("lb", &[bin.to_str().unwrap(), "run", "--config", cfg.to_str().unwrap()]);
    let ready = wait_until(Duration::from_secs(30), || {
        topo.status()["endpoints"].as_array().is_some_and(|e| e.len() == 3 && e.iter().all(|e| e["state"] == "ready"))
    });
    if !ready {
        let (code, out, err) = lb.stop("INT", Duration::from_secs(5));
        panic!("the appliance did not become ready (exit {code:?}):\n{out}\n{err}");
    }

    let (n, size) = (DATAGRAMS.to_string(), PAYLOAD.to_string());
    let client = topo.output("client", &["python3", "-c", CLIENT, &n, &size]);
    assert!(client.status.success(), "client: {}", String::from_utf8_lossy(&client.stderr));
    let read = || -> Vec<Vec<String>> {
        logs.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default().lines().map(str::to_owned).collect()).collect()
    };
    // The echoes came back (or the time ran out); what the backends saw is
    // on file by then, but wait for it anyway in case an echo was lost.
    wait_until(Duration::from_secs(5), || read().iter().map(Vec::len).sum::<usize>() >= DATAGRAMS);
    let seen = read();
    let drops = topo.status()["drops"].clone();

    let printed = String::from_utf8(client.stdout).unwrap();
    let lines = |tag: &str| -> Vec<String> { printed.lines().filter_map(|l| l.strip_prefix(tag)).map(str::to_owned).collect() };
    let want = lines("sent ");
    assert_eq!(want.len(), DATAGRAMS);
    assert!(want.iter().all(|w| w.starts_with(&format!("{PAYLOAD} "))), "{want:?}");
    let mut at: HashMap<&str, Vec<usize>> = HashMap::new();
    for (b, lines) in seen.iter().enumerate() {
        for l in lines {
            assert!(want.contains(l), "backend be{} received a datagram that was not sent: {l} (drops {drops})", b + 1);
            at.entry(l.as_str()).or_default().push(b + 1);
        }
    }
    for (i, w) in want.iter().enumerate() {
        let got = at.get(w.as_str()).cloned().unwrap_or_default();
        assert_eq!(got.len(), 1, "datagram {i} ({w}) reached backends {got:?}, expected exactly one (drops {drops})");
    }
    let mut sorted = lines("echo ");
    sorted.sort();
    let mut expected = want.clone();
    expected.sort();
    assert_eq!(sorted, expected, "the echoes, fragmented by the backends, came back whole through the appliance (drops {drops})");

    let st = topo.status();
    let workers = st["workers"].as_array().unwrap();
    let sum = |k: &str| workers.iter().map(|w| w[k].as_u64().unwrap_or(0)).sum::<u64>();
    assert_eq!(sum("fragmented"), 2 * DATAGRAMS as u64, "each datagram and each echo was fragmented once: {st}");
    stop_cleanly(&mut lb);
    topo.remove();
    let _ = std::fs::remove_dir_all(&dir);
}
