#!/usr/bin/env python3
"""Sluice side by side with the kernel's load balancers (bench/compare_ns.sh runs this).

One topology (scripts/topology.sh: client, LB, a bridge, three backends that
hold the VIP 20.0.0.1 on loopback), built afresh for each system, and the same
traffic against each:

  sluice-af_packet  `sluice run` on net_af_packet ports (lbf/lbb without IP)
  sluice-af_xdp     `sluice run` on net_af_xdp ports with busy polling
  nftlb-dsr         nftlb, mode dsr: netdev ingress on lbf, MAC rewrite, fwd to lbb
  nftables-jhash    plain nftables: a jhash of (source, source port) as a mark,
                    one routing table per mark with the backend as next hop
  haproxy-tcp       HAProxy in TCP mode (a full proxy: VIP local in the LB
                    namespace; no UDP)
  ipvs-mh           ipvsadm, scheduler mh with mh-port, direct routing (only
                    where the kernel has ip_vs and ip_vs_mh; skipped with the
                    reason otherwise)

Measured for each: TCP connections/s with latency percentiles (closed loop,
cmp_load tcp), UDP delivered and lost at fixed offered rates (cmp_load udp;
delivered = datagrams that reached the backends' UDP layer, from each backend
namespace's /proc/net/snmp), CPU (see cpu_method in the output), the spread over
backends, and what happens to established TCP connections when backend be3 is
removed (scripts/client.py hold).

Environment: QUICK=1 (a few seconds per system), OUT (results file),
SYSTEMS (space-separated subset), SLUICE, CMP_LOAD, CMP_BACKEND (binaries),
LB_NICE (nice of the user-space load balancers, default 0),
SLUICE_IDLE_PAUSE_US, SLUICE_BUSY_POLL=1, SLUICE_LCORES (Sluice's settings).
"""
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
QUICK = os.environ.get("QUICK") == "1"
P = "slcmp%d" % (os.getpid() % 1000000)
TOPO = os.path.join(ROOT, "scripts/topology.sh")
SLUICE = os.environ.get("SLUICE", os.path.join(ROOT, "target/release/sluice"))
CMP_LOAD = os.environ.get("CMP_LOAD", os.path.join(ROOT, "target/release/cmp_load"))
CMP_BACKEND = os.environ.get("CMP_BACKEND", os.path.join(ROOT, "target/release/cmp_backend"))
CLIENT_PY = os.path.join(ROOT, "scripts/client.py")
VIP = "20.0.0.1"
BACKENDS = {"be1": "10.200.0.11", "be2": "10.200.0.12", "be3": "10.200.0.13"}
REMOVED = "be3"
# The LB runs on core LB_CPU; the client, the backends and every softirq of
# their interfaces (RPS) on the other core.
LB_CPU = 1
REST_CPU = 0

if QUICK:
    TCP_SECONDS, TCP_WORKERS = 3, 8
    UDP_RATES, UDP_SECONDS, UDP_FLOWS = [20000], 2, 64
    HOLD_N, HOLD_SECONDS = 24, 4
else:
    TCP_SECONDS, TCP_WORKERS = 10, 16
    UDP_RATES, UDP_SECONDS, UDP_FLOWS = [10000, 25000, 50000, 100000, 200000], 5, 64
    HOLD_N, HOLD_SECONDS = 60, 10

# Sluice's workers pause when idle (1, 2, 4 ... up to this many microseconds):
# the setting for a shared core. The default (2000) adds up to 2 ms per packet
# at low rates; a latency-minded appliance on a shared core sets less.
SLUICE_IDLE_PAUSE_US = int(os.environ.get("SLUICE_IDLE_PAUSE_US", "50"))
SLUICE_BUSY_POLL = os.environ.get("SLUICE_BUSY_POLL") == "1"
# The user-space load balancers (sluice, haproxy) run at this nice value
# (default 0: ordinary jobs). On a shared machine -20 puts them ahead of other
# jobs on their core, as the kernel's softirq is; but it also puts them ahead
# of ksoftirqd there, which delivers the frames af_packet and af_xdp read, so
# at high packet rates the kernel's half of Sluice's ports starves.
LB_NICE = int(os.environ.get("LB_NICE", "0"))
# Sluice's EAL cores: the first runs the control runtime, the others workers
# ("1": one worker with the control runtime beside it on the LB core).
SLUICE_LCORES = os.environ.get("SLUICE_LCORES", str(LB_CPU))

ALL_SYSTEMS = ["sluice-af_packet", "sluice-af_xdp", "nftlb-dsr", "nftables-jhash", "haproxy-tcp", "ipvs-mh"]
TMP = tempfile.mkdtemp(prefix="sluice-cmp-")
procs = []


def log(*a):
    print("compare_ns:", *a, file=sys.stderr, flush=True)


def sh(cmd, check=True, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s%s" % (" ".join(cmd), r.returncode, r.stdout, r.stderr))
    return r


def ns(n):
    return "%s-%s" % (P, n)


def nsx(n, *cmd, cpu=None, check=True):
    pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
    return sh(pre + ["ip", "netns", "exec", ns(n)] + list(cmd), check=check)


def spawn(n, *cmd, cpu=None, out=subprocess.DEVNULL, nice=0):
    pre = ["taskset", "-c", str(cpu)] if cpu is not None else []
    if nice:
        pre += ["nice", "-n", str(nice)]
    p = subprocess.Popen(pre + ["ip", "netns", "exec", ns(n)] + list(cmd), stdout=out, stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def stop(p, sig=signal.SIGTERM, wait=15):
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in procs:
        procs.remove(p)


def cleanup():
    for p in list(procs):
        stop(p, signal.SIGKILL, 5)
    sh([TOPO, "down", P], check=False)
    shutil.rmtree(TMP, ignore_errors=True)


def on_signal(signum, _frame):
    cleanup()
    sys.exit(128 + signum)


# ---- measurement helpers -------------------------------------------------

def cpu_times():
    """Per-CPU counters of /proc/stat in seconds: {cpu: {field: s}}."""
    hz = os.sysconf("SC_CLK_TCK")
    names = ["user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"]
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            m = re.match(r"^cpu(\d*) (.*)", line)
            if not m:
                continue
            vals = [int(x) / hz for x in m.group(2).split()[: len(names)]]
            out[m.group(1) or "all"] = dict(zip(names, vals))
    return out


def proc_cpu(pid):
    """utime + stime of a process (all its threads) in seconds."""
    if pid is None:
        return 0.0
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """CPU used between start() and stop(): see CPU_METHOD."""

    def __init__(self, lb_pid):
        self.lb_pid = lb_pid

    def start(self):
        self.t0, self.c0, self.p0 = time.monotonic(), cpu_times(), proc_cpu(self.lb_pid)

    def stop(self):
        dt = time.monotonic() - self.t0
        c1 = cpu_times()
        d = {k: {f: c1[k][f] - self.c0[k][f] for f in c1[k]} for k in c1}
        busy = lambda x: sum(v for f, v in x.items() if f not in ("idle", "iowait"))
        lb = d[str(LB_CPU)]
        lb_proc = proc_cpu(self.lb_pid) - self.p0
        lb_cpu = lb_proc + lb["irq"] + lb["softirq"]
        return {
            "seconds": dt,
            "cpu_pct": 100 * lb_cpu / dt,
            "lb_process_cpu_pct": 100 * lb_proc / dt,
            "lb_core_softirq_pct": 100 * lb["softirq"] / dt,
            "other_core_softirq_pct": 100 * d[str(REST_CPU)]["softirq"] / dt,
            "machine_cpu_pct": 100 * busy(d["all"]) / dt,
            "lb_cpu_core_seconds": lb_cpu,
            "machine_cpu_core_seconds": busy(d["all"]),
        }


CPU_METHOD = (
    "The load balancer is pinned to core %d (sluice's lcore, haproxy's one thread, and through RPS "
    "the receive softirq of the LB namespace's veths lbf/lbb); the client, the backends and the softirq "
    "of their interfaces are pinned to core %d. cpu_pct (the LB's CPU) = user + system time of the LB "
    "process (/proc/PID/stat; none for the in-kernel systems) + irq and softirq time of core %d "
    "(/proc/stat). sluice and haproxy run at nice settings.user_space_lb_nice. Other jobs on a shared machine add nothing to it unless they raise softirq on that "
    "core. The kernel's tick accounting also charges a softirq tick to the task it interrupted, so for "
    "sluice and haproxy part of the softirq may be counted twice: their cpu_pct errs high, never low. "
    "machine_cpu_pct is every core's busy time (/proc/stat), other jobs included. AF_XDP on veth runs "
    "the receive side's XDP in the sender's NAPI context (the client's core) unless the busy-polling "
    "socket gets there first: other_core_softirq_pct shows it." % (LB_CPU, REST_CPU, LB_CPU)
)


def udp_arrived():
    """Datagrams that reached each backend's UDP layer (delivered + refused for buffer or port)."""
    out = {}
    for b in BACKENDS:
        txt = nsx(b, "cat", "/proc/net/snmp").stdout.splitlines()
        hdr, val = [l.split()[1:] for l in txt if l.startswith("Udp:")][:2]
        u = dict(zip(hdr, map(int, val)))
        out[b] = {"arrived": u["InDatagrams"] + u["NoPorts"] + u["InErrors"], "rcvbuf_errors": u["RcvbufErrors"]}
    return out


def tcp_run(system, lb_pid):
    w = CpuWindow(lb_pid)
    w.start()
    r = nsx("client", CMP_LOAD, "tcp", VIP + ":80", str(TCP_WORKERS), str(TCP_SECONDS), cpu=REST_CPU)
    cpu = w.stop()
    res = json.loads(r.stdout)
    run = {"system": system, "mode": "tcp_crr", "workers": TCP_WORKERS}
    run.update(res)
    run.update(cpu)
    lb_core = cpu["lb_cpu_core_seconds"]
    run["connections_per_lb_core_s"] = res["connections"] / lb_core if lb_core > 0 else None
    run["connections_per_machine_core_s"] = res["connections"] / cpu["machine_cpu_core_seconds"]
    log("%s tcp: %.0f conn/s, p99 %d us, failed %d, LB cpu %.1f %%, spread %s"
        % (system, res["connections_per_s"], res["latency_us"]["p99"], res["failed"], cpu["cpu_pct"], res["per_backend"]))
    return run


def sluice_losses():
    """Sluice's own account of what it lost: below DPDK (the kernel interface's
    counters) and its drops by reason."""
    try:
        j = json.loads(nsx("lb", SLUICE, "status", "--json", check=False).stdout)
    except ValueError:
        return None
    below = sum((p.get("lost_below_dpdk") or {}).get("below_dpdk", 0) for p in j.get("ports", []))
    drops = sum(n for _, n in j.get("drops", []))
    return {"lost_below_dpdk": below, "dropped": drops}


def udp_run(system, lb_pid, rate):
    own0 = sluice_losses() if system.startswith("sluice") else None
    before = udp_arrived()
    w = CpuWindow(lb_pid)
    w.start()
    r = nsx("client", CMP_LOAD, "udp", VIP + ":53", str(rate), str(UDP_SECONDS), str(UDP_FLOWS), cpu=REST_CPU)
    cpu = w.stop()
    time.sleep(0.5)  # what is still on its way
    after = udp_arrived()
    res = json.loads(r.stdout)
    per = {b: after[b]["arrived"] - before[b]["arrived"] for b in BACKENDS}
    delivered = sum(per.values())
    run = {
        # offered_pps: what the sender managed (a blocked send() slows it below the target).
        "system": system, "mode": "udp", "offered_pps": res["offered_pps"], "offered_pps_target": rate,
        "sent": res["sent"], "send_errors": res["errors"], "delivered": delivered,
        "delivered_pps": delivered / res["seconds"], "lost": res["sent"] - delivered,
        "backend_rcvbuf_drops": sum(after[b]["rcvbuf_errors"] - before[b]["rcvbuf_errors"] for b in BACKENDS),
        "per_backend": per, "flows": UDP_FLOWS,
    }
    if own0 is not None:
        own1 = sluice_losses()
        if own1 is not None:
            run["sluice_lost_below_dpdk"] = own1["lost_below_dpdk"] - own0["lost_below_dpdk"]
            run["sluice_dropped"] = own1["dropped"] - own0["dropped"]
    run.update(cpu)
    lb_core = cpu["lb_cpu_core_seconds"]
    run["packets_per_lb_core_s"] = delivered / lb_core if lb_core > 0 else None
    log("%s udp @%d (achieved %.0f): delivered %.0f pps, lost %d of %d, LB cpu %.1f %%"
        % (system, rate, res["offered_pps"], run["delivered_pps"], run["lost"], res["sent"], cpu["cpu_pct"]))
    return run


def hold_run(system, remove):
    """HOLD_N long-lived connections, backend be3 removed once they are open."""
    out = os.path.join(TMP, "hold-%s.json" % system)
    p = spawn("client", "python3", CLIENT_PY, "hold", VIP, str(HOLD_N), str(HOLD_SECONDS), out, cpu=REST_CPU)
    deadline = time.time() + 30
    while not os.path.exists(out + ".ready"):
        if p.poll() is not None or time.time() > deadline:
            stop(p)
            raise RuntimeError("%s: the long-lived connections did not open" % system)
        time.sleep(0.1)
    how = remove()
    p.wait(HOLD_SECONDS + 30)
    procs.remove(p)
    with open(out) as f:
        held = json.load(f)
    run = {"system": system, "mode": "remove_backend", "connections": HOLD_N, "removed": REMOVED, "how": how,
           "per_backend": {b: {"kept": v[0], "broken": v[1]} for b, v in held.items()}}
    run["broken_on_removed"] = held.get(REMOVED, [0, 0])[1]
    run["kept_on_removed"] = held.get(REMOVED, [0, 0])[0]
    run["broken_on_others"] = sum(v[1] for b, v in held.items() if b != REMOVED)
    run["kept_on_others"] = sum(v[0] for b, v in held.items() if b != REMOVED)
    log("%s remove %s: others kept %d broke %d; removed's kept %d broke %d" % (
        system, REMOVED, run["kept_on_others"], run["broken_on_others"], run["kept_on_removed"], run["broken_on_removed"]))
    return run


# ---- topology ------------------------------------------------------------

def topology_up():
    sh([TOPO, "up", P])
    sh(["ip", "netns", "exec", ns("client"), "sysctl", "-qw", "net.ipv4.tcp_tw_reuse=1",
        "net.ipv4.ip_local_port_range=1024 65000"])
    rps = lambda n, dev, cpu: nsx(n, "sh", "-c", "echo %x > /sys/class/net/%s/queues/rx-0/rps_cpus" % (1 << cpu, dev))
    rps("lb", "lbf", LB_CPU)
    rps("lb", "lbb", LB_CPU)
    rps("net", "nlb", REST_CPU)
    rps("client", "c0", REST_CPU)
    for b in BACKENDS:
        spawn(b, CMP_BACKEND, b, VIP, cpu=REST_CPU)
    time.sleep(0.3)


def kernel_lb_addresses(forward=True):
    nsx("lb", "ip", "addr", "add", "10.100.0.1/24", "dev", "lbf")
    nsx("lb", "ip", "addr", "add", "10.200.0.1/24", "dev", "lbb")
    nsx("lb", "sysctl", "-qw", "net.ipv4.ip_forward=%d" % int(forward), "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.lbf.rp_filter=0", "net.ipv4.conf.lbb.rp_filter=0", "net.ipv4.tcp_tw_reuse=1",
        "net.ipv4.ip_local_port_range=1024 65000")


def mac(n, dev):
    return nsx(n, "cat", "/sys/class/net/%s/address" % dev).stdout.strip()


# ---- systems: each returns (lb_pid or None, remove function, extra facts) ----

def sluice_config(path, driver, endpoints):
    eps = "\n".join("      - {id: %d, address: %s}" % (i, a) for i, (b, a) in enumerate(BACKENDS.items()) if b in endpoints)
    if driver == "af_xdp":
        dev = "net_af_xdp%d,iface=%s,busy_budget=64"
    else:
        dev = "net_af_packet%d,iface=%s"
    txt = """dpdk:
  lcores: "%s"
  memoryMB: 256
  hugepages: false
  filePrefix: %s
  mbufs: 8191
  descriptors: 1024
  busyPoll: %s
  idlePauseMaxMicros: %d
ports:
  - name: front
    device: %s
    addresses: [10.100.0.1/24]
    kernelInterface: sl-front
  - name: back
    device: %s
    addresses: [10.200.0.1/24]
    kernelInterface: sl-back
gateways:
  - address: 10.100.0.2
    port: front
admin:
  listen: 127.0.0.1:9091
services:
  - name: web
    endpoints:
%s
  - name: dns
    endpoints:
%s
routes:
  - {name: web-tcp, service: web, vips: [%s], protocols: [TCP], destinationPorts: ["80"]}
  - {name: dns-udp, service: dns, vips: [%s], protocols: [UDP], destinationPorts: ["53"]}
""" % (SLUICE_LCORES, P, "true" if SLUICE_BUSY_POLL else "false", SLUICE_IDLE_PAUSE_US, dev % (0, "lbf"), dev % (1, "lbb"), eps, eps, VIP, VIP)
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(txt)
    os.replace(tmp, path)


def start_sluice(system, driver):
    if driver == "af_xdp":
        # Preferred busy polling (DPDK's af_xdp guide): the softirq defers to
        # the polling socket.
        for dev in ("lbf", "lbb"):
            nsx("lb", "sh", "-c", "echo 2 > /sys/class/net/%s/napi_defer_hard_irqs && "
                "echo 200000 > /sys/class/net/%s/gro_flush_timeout" % (dev, dev))
    cfg = os.path.join(TMP, "sluice-%s.yaml" % driver)
    sluice_config(cfg, driver, BACKENDS)
    logf = open(os.path.join(TMP, "sluice-%s.log" % driver), "w")
    p = spawn("lb", SLUICE, "run", "--config", cfg, cpu=LB_CPU, out=logf, nice=LB_NICE)
    for _ in range(120):
        st = nsx("lb", SLUICE, "status", "--json", check=False).stdout
        if '"state": "ready"' in st or '"state":"ready"' in st:
            break
        if p.poll() is not None:
            break
        time.sleep(0.5)
    if p.poll() is not None or '"ready"' not in st:
        stop(p, signal.SIGINT)
        logf.close()
        with open(logf.name) as f:
            raise RuntimeError("%s: sluice did not become ready:\n%s" % (system, f.read()[-3000:]))

    # Endpoints whose MAC the kernel has not resolved yet are left out of the
    # tables: measure once every one is in (and say how long that took).
    t0, unresolved = time.monotonic(), None
    while time.monotonic() - t0 < 30:
        try:
            unresolved = json.loads(nsx("lb", SLUICE, "status", "--json", check=False).stdout)["next_hops_unresolved"]
        except (ValueError, KeyError):
            unresolved = None
        if unresolved == 0:
            break
        time.sleep(0.2)
    resolved = {"next_hops_unresolved": unresolved, "waited_for_next_hops_s": round(time.monotonic() - t0, 2)}

    def remove():
        sluice_config(cfg, driver, [b for b in BACKENDS if b != REMOVED])
        return "endpoint removed from the configuration file (sluice reloads on the edit)"

    def finish():
        st = nsx("lb", SLUICE, "status", "--json", check=False).stdout
        stop(p, signal.SIGINT)
        logf.close()
        try:
            j = json.loads(st)
            return {"sluice_status_drops": j.get("drops"), "sluice_status_ports": j.get("ports")}
        except ValueError:
            return {}

    return p.pid, remove, finish, {"device": "net_%s" % driver, "sluice_busy_poll": SLUICE_BUSY_POLL,
                                    "sluice_idle_pause_max_us": SLUICE_IDLE_PAUSE_US,
                                    "lcores": SLUICE_LCORES, "config": "maglev, no flow table", **resolved}


def start_nftlb(system):
    kernel_lb_addresses()
    bmac = {b: mac(b, "b0") for b in BACKENDS}
    lbb_mac = mac("lb", "lbb")

    def farms(state_of):
        fs = []
        for name, proto, port in (("web", "tcp", "80"), ("dns", "udp", "53")):
            fs.append({
                "name": name, "family": "ipv4", "virtual-addr": VIP, "virtual-ports": port, "mode": "dsr",
                "protocol": proto, "scheduler": "hash", "sched-param": "srcip srcport", "state": "up",
                "iface": "lbf", "oface": "lbb", "ether-addr": lbb_mac,
                "backends": [{"name": b, "ip-addr": a, "ether-addr": bmac[b], "weight": "1", "state": state_of(b)}
                             for b, a in BACKENDS.items()],
            })
        return {"farms": fs}

    def apply(conf):
        path = os.path.join(TMP, "nftlb.json")
        with open(path, "w") as f:
            json.dump(conf, f)
        nsx("lb", "nftlb", "-e", "-c", path)

    apply(farms(lambda b: "up"))
    rules = nsx("lb", "nft", "list", "ruleset").stdout

    def remove():
        apply(farms(lambda b: "down" if b == REMOVED else "up"))
        return "backend state down, nftlb -e re-applied"

    return None, remove, lambda: {"nft_ruleset": rules}, {"nftlb": "mode dsr, scheduler hash (srcip srcport)"}


NFT_RULES = """table ip cmp
delete table ip cmp
table ip cmp {
  chain pre {
    type filter hook prerouting priority -150; policy accept;
    ip daddr %(vip)s tcp dport 80 meta mark set jhash ip saddr . tcp sport mod %(n)d seed 0x5eed offset 1
    ip daddr %(vip)s udp dport 53 meta mark set jhash ip saddr . udp sport mod %(n)d seed 0x5eed offset 1
  }
}
"""


def start_nftables(system):
    kernel_lb_addresses()
    for i, a in enumerate(BACKENDS.values(), 1):
        nsx("lb", "ip", "route", "add", VIP + "/32", "via", a, "dev", "lbb", "table", str(100 + i))

    def apply(backends):
        path = os.path.join(TMP, "cmp.nft")
        with open(path, "w") as f:
            f.write(NFT_RULES % {"vip": VIP, "n": len(backends)})
        nsx("lb", "nft", "-f", path)

    # Mark i (1..3) routes to backend i; with be3 gone the hash yields 1..2 only.
    for i in range(1, len(BACKENDS) + 1):
        nsx("lb", "ip", "rule", "add", "fwmark", str(i), "table", str(100 + i))
    apply(list(BACKENDS))
    rules = nsx("lb", "nft", "list", "ruleset").stdout

    def remove():
        apply([b for b in BACKENDS if b != REMOVED])
        nsx("lb", "ip", "rule", "del", "fwmark", "3")
        return "hash modulus 3 -> 2 (nft -f, atomic)"

    return None, remove, lambda: {"nft_ruleset": rules}, {"nftables": "prerouting mark = jhash(saddr . sport) mod N; ip rule fwmark -> table with the backend as next hop"}


def start_haproxy(system):
    kernel_lb_addresses(forward=True)
    nsx("lb", "ip", "addr", "add", VIP + "/32", "dev", "lo")
    sock = os.path.join(TMP, "haproxy.sock")
    cfg = os.path.join(TMP, "haproxy.cfg")
    servers = "\n".join("  server %s %s:80" % (b, a) for b, a in BACKENDS.items())
    with open(cfg, "w") as f:
        f.write("""global
  nbthread 1
  maxconn 9000
  stats socket %s mode 600 level admin
defaults
  mode tcp
  timeout connect 3s
  timeout client 30s
  timeout server 30s
frontend web
  bind %s:80
  default_backend web
backend web
  balance roundrobin
%s
""" % (sock, VIP, servers))
    logf = open(os.path.join(TMP, "haproxy.log"), "w")
    p = spawn("lb", "haproxy", "-db", "-f", cfg, cpu=LB_CPU, out=logf, nice=LB_NICE)
    for _ in range(50):
        if os.path.exists(sock):
            break
        time.sleep(0.1)
    if p.poll() is not None or not os.path.exists(sock):
        logf.close()
        with open(logf.name) as f:
            raise RuntimeError("%s: haproxy did not start:\n%s" % (system, f.read()[-2000:]))

    def remove():
        nsx("lb", "sh", "-c", "echo 'set server web/%s state maint' | socat stdio unix-connect:%s" % (REMOVED, sock))
        return "set server web/%s state maint (runtime API)" % REMOVED

    def finish():
        stop(p)
        logf.close()
        return {}

    ver = sh(["haproxy", "-v"]).stdout.splitlines()[0]
    return p.pid, remove, finish, {"haproxy": ver, "balance": "roundrobin", "nbthread": 1}


def ipvs_unavailable():
    """None when IPVS with mh works here, else why not."""
    if shutil.which("ipvsadm") is None:
        return "ipvsadm not installed"
    if shutil.which("modprobe"):
        sh(["modprobe", "ip_vs"], check=False)
        sh(["modprobe", "ip_vs_mh"], check=False)
    r = sh(["ipvsadm", "-Ln"], check=False)
    if r.returncode != 0:
        return "this kernel has no IPVS: ipvsadm -Ln: %s" % (r.stderr.strip().splitlines() or ["?"])[0]
    if not os.path.exists("/sys/module/ip_vs_mh") and shutil.which("modprobe") is None:
        return "ip_vs present but ip_vs_mh cannot be loaded (no modprobe)"
    return None


def start_ipvs(system):
    kernel_lb_addresses(forward=False)
    nsx("lb", "ip", "addr", "add", VIP + "/32", "dev", "lo")
    for proto, port in (("-t", "80"), ("-u", "53")):
        nsx("lb", "ipvsadm", "-A", proto, "%s:%s" % (VIP, port), "-s", "mh", "-b", "mh-port")
        for a in BACKENDS.values():
            nsx("lb", "ipvsadm", "-a", proto, "%s:%s" % (VIP, port), "-r", "%s:%s" % (a, port), "-g")

    def remove():
        nsx("lb", "ipvsadm", "-d", "-t", VIP + ":80", "-r", BACKENDS[REMOVED] + ":80")
        return "ipvsadm -d (real server deleted)"

    table = nsx("lb", "ipvsadm", "-Ln").stdout
    return None, remove, lambda: {"ipvsadm": table}, {"ipvs": "mh, mh-port, direct routing"}


STARTERS = {
    "sluice-af_packet": lambda s: start_sluice(s, "af_packet"),
    "sluice-af_xdp": lambda s: start_sluice(s, "af_xdp"),
    "nftlb-dsr": start_nftlb,
    "nftables-jhash": start_nftables,
    "haproxy-tcp": start_haproxy,
    "ipvs-mh": start_ipvs,
}


def run_system(system):
    topology_up()
    try:
        lb_pid, remove, finish, facts = STARTERS[system](system)
        time.sleep(1)
        # Warm-up: the client and the backends resolve their neighbours.
        nsx("client", CMP_LOAD, "tcp", VIP + ":80", "2", "1", cpu=REST_CPU)
        runs = [tcp_run(system, lb_pid)]
        if system == "haproxy-tcp":
            runs.append({"system": system, "mode": "udp", "skipped": "HAProxy balances TCP (and HTTP), not UDP"})
        else:
            for rate in UDP_RATES:
                runs.append(udp_run(system, lb_pid, rate))
        runs.append(hold_run(system, remove))
        facts.update(finish())
        facts["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
        runs[0]["facts"] = facts
        return runs
    finally:
        for p in list(procs):
            stop(p, signal.SIGKILL, 5)
        sh([TOPO, "down", P], check=False)


def machine():
    lscpu = sh(["lscpu"]).stdout
    model = re.search(r"Model name:\s*(.*)", lscpu)
    rev = sh(["git", "-C", ROOT, "rev-parse", "HEAD"], check=False).stdout.strip()
    dirty = sh(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], check=False).stdout.strip()
    pkgs = {}
    for pkg in ("nftlb", "nftables", "haproxy", "ipvsadm"):
        r = sh(["dpkg-query", "-W", "-f=${Version}", pkg], check=False)
        pkgs[pkg] = r.stdout if r.returncode == 0 else None
    return {
        "cpu_model": model.group(1).strip() if model else platform.processor(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "dpdk": sh(["pkg-config", "--modversion", "libdpdk"], check=False).stdout.strip(),
        "git_rev": rev + ("-dirty" if dirty else ""),
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "packages": pkgs,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main():
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    systems = os.environ.get("SYSTEMS", " ".join(ALL_SYSTEMS)).split()
    out = os.environ.get("OUT") or (os.path.join(TMP, "..", "compare_ns-quick.json") if QUICK
                                    else os.path.join(ROOT, "bench/results/compare_ns.json"))
    res = {
        "bench": "compare_ns",
        "command": "%sbench/compare_ns.sh" % ("QUICK=1 " if QUICK else ""),
        "machine": machine(),
        "settings": {"tcp_seconds": TCP_SECONDS, "tcp_workers": TCP_WORKERS, "udp_rates": UDP_RATES,
                     "udp_seconds": UDP_SECONDS, "udp_flows": UDP_FLOWS, "hold_connections": HOLD_N,
                     "sluice_busy_poll": SLUICE_BUSY_POLL, "sluice_idle_pause_max_us": SLUICE_IDLE_PAUSE_US,
                     "user_space_lb_nice": LB_NICE, "sluice_lcores": SLUICE_LCORES,
                     "hold_seconds": HOLD_SECONDS, "lb_core": LB_CPU, "other_core": REST_CPU},
        "cpu_method": CPU_METHOD,
        "runs": [],
    }
    try:
        for s in systems:
            if s == "ipvs-mh":
                why = ipvs_unavailable()
                if why:
                    log("ipvs-mh skipped:", why)
                    res["runs"].append({"system": "ipvs-mh", "skipped": why})
                    continue
            log("---", s)
            try:
                res["runs"].extend(run_system(s))
            except Exception as e:  # one system failing must not lose the others
                log("%s failed: %s" % (s, e))
                res["runs"].append({"system": s, "failed": str(e)[-2000:]})
        res["machine"]["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
        out = os.path.abspath(out)
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
            f.write("\n")
        log("results in", out)
    finally:
        cleanup()
    return 1 if any(isinstance(r.get("failed"), str) for r in res["runs"]) else 0


if __name__ == "__main__":
    sys.exit(main())
