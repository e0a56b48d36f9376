#!/usr/bin/env python3
"""Resident memory of `sluice run` across reloads of a large configuration.

Writes a configuration of SERVICES services x 10 endpoints (ipip, one VIP
each; net_null ports, no namespaces, nothing sent), starts `sluice run` on
it, then rewrites the file RELOADS times, each time with one endpoint
address changed, waits until the admin endpoint's /tables shows it, waits
PAUSE seconds (an operator's reloads come seconds apart) and reads VmRSS.
Prints one line per reload and writes a JSON summary: RSS at the first
load (the baseline), after each reload, and the ratio of the last reading
to the baseline.

    bench/reload_memory.py                                  # 10,000 services, 12 reloads
    bench/reload_memory.py --services 2000 --reloads 20 --out /tmp/r.json
    bench/reload_memory.py --sluice /path/to/other/sluice   # A/B two builds

Needs root (DPDK, --no-huge) and a release build.
"""
import argparse
import ipaddress
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HEAD = """
dpdk: {{lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: rm{pid}, mbufs: 2047, descriptors: 256}}
ports:
  - {{name: a, device: net_null0, addresses: [10.1.0.1/24], kernelInterface: ""}}
  - {{name: b, device: net_null1, addresses: [10.2.0.1/24], kernelInterface: ""}}
gateways:
  - {{address: 10.1.0.254, port: a, mac: "02:00:00:00:01:fe"}}
admin: {{listen: "127.0.0.1:{admin}"}}
capacity: {{services: 16384, endpoints: 262144}}
"""


def vip(i):
    return str(ipaddress.IPv4Address(0x0B000001 + i))


def endpoint(i, j):
    return str(ipaddress.IPv4Address(0x0A400001 + i * 32 + j))


def changed(k):
    return str(ipaddress.IPv4Address(0x0A620000 + k))


def write(path, n, admin, k):
    """The configuration of reload k (0: the first): endpoint 0 of service k mod n moved."""
    s = [HEAD.format(pid=os.getpid(), admin=admin), "services:\n"]
    for i in range(n):
        s.append(f"  - name: svc{i}\n    delivery: ipip\n    endpoints:\n")
        for j in range(10):
            a = changed(k) if (k and j == 0 and i == k % n) else endpoint(i, j)
            s.append(f"      - {{id: {j}, address: {a}}}\n")
    s.append("routes:\n")
    for i in range(n):
        s.append(f'  - {{name: r{i}, service: svc{i}, vips: [{vip(i)}], protocols: [TCP], destinationPorts: ["80"]}}\n')
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("".join(s))
    os.rename(tmp, path)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def shows(admin, service, address):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/tables/svc{service}", timeout=5) as r:
            return address in r.read().decode()
    except OSError:
        return False


def until(what, f, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if f():
            return
        time.sleep(0.05)
    sys.exit(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sluice", default="target/release/sluice")
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--reloads", type=int, default=12)
    ap.add_argument("--pause", type=float, default=1.5, help="seconds between a reload being live and the reading")
    ap.add_argument("--admin", type=int, default=19555)
    ap.add_argument("--out", default="bench/results/reload_memory.json")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="sluice-reload-")
    cfg = os.path.join(d, "sluice.yaml")
    write(cfg, a.services, a.admin, 0)
    log = open(os.path.join(d, "sluice.log"), "w")
    app = subprocess.Popen([a.sluice, "run", "--config", cfg], stdout=subprocess.DEVNULL, stderr=log)
    try:
        until("the first load", lambda: shows(a.admin, a.services - 1, endpoint(a.services - 1, 9)), 300)
        time.sleep(a.pause)
        base = rss_mib(app.pid)
        print(f"loaded {a.services} services: {base:.0f} MiB", flush=True)
        readings = []
        for k in range(1, a.reloads + 1):
            t0 = time.monotonic()
            write(cfg, a.services, a.admin, k)
            until(f"reload {k}", lambda: shows(a.admin, k % a.services, changed(k)), 300)
            live_s = time.monotonic() - t0
            time.sleep(a.pause)
            r = rss_mib(app.pid)
            readings.append(round(r, 1))
            print(f"reload {k}: live in {live_s:.2f} s, {r:.0f} MiB", flush=True)
    finally:
        app.send_signal(signal.SIGINT)
        app.wait(timeout=60)
    out = {
        "services": a.services,
        "endpoints_per_service": 10,
        "reloads": a.reloads,
        "pause_s": a.pause,
        "rss_mib_first_load": round(base, 1),
        "rss_mib_after_each_reload": readings,
        "ratio_last_to_first_load": round(readings[-1] / base, 3) if readings else None,
        "sluice": a.sluice,
    }
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps({k: out[k] for k in ("rss_mib_first_load", "ratio_last_to_first_load")}))


if __name__ == "__main__":
    main()
