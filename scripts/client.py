#!/usr/bin/env python3
"""Traffic for the demo and the end-to-end test (runs in the client namespace).

  client.py short VIP N [CONCURRENCY]   N short TCP connections; prints a JSON
                                        object {backend: count, "failed": n}
  client.py udp VIP N                   N UDP queries; same output
  client.py hold VIP N SECONDS FILE     opens N long-lived connections, sends a
                                        line on each every 0.2 s for SECONDS,
                                        writes {backend: [ok, broken]} to FILE
  client.py load VIP RATE               short connections at RATE per second,
                                        forever (for the demo)
"""
import json
import os
import socket
import sys
import threading
import time
from collections import Counter


def one(vip, port=80, timeout=3.0):
    with socket.create_connection((vip, port), timeout=timeout) as c:
        f = c.makefile("rb")
        name = f.readline().strip().decode()
        c.sendall(b"ping\n")
        if not f.readline().startswith(name.encode() + b" ping"):
            raise OSError("bad echo")
        return name


def short(vip, n, conc=16):
    counts = Counter()
    lock = threading.Lock()
    todo = iter(range(n))

    def work():
        while True:
            with lock:
                if next(todo, None) is None:
                    return
            try:
                name = one(vip)
            except OSError:
                name = "failed"
            with lock:
                counts[name] += 1

    ts = [threading.Thread(target=work) for _ in range(conc)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return dict(counts)


def udp(vip, n):
    counts = Counter()
    s = socket.socket(socket.AF_INET6 if ":" in vip else socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2.0)
    for i in range(n):
        s.sendto(b"q%d" % i, (vip, 53))
        try:
            d, _ = s.recvfrom(2048)
            counts[d.split(b" ")[0].decode()] += 1
        except OSError:
            counts["failed"] += 1
    return dict(counts)


def hold(vip, n, secs, out):
    conns = []
    for _ in range(n):
        c = socket.create_connection((vip, 80), timeout=3.0)
        f = c.makefile("rb")
        conns.append([c, f, f.readline().strip().decode(), True])
    with open(out + ".ready", "w") as fh:
        json.dump(Counter(x[2] for x in conns), fh)
    end = time.time() + secs
    while time.time() < end:
        for x in conns:
            if not x[3]:
                continue
            try:
                x[0].sendall(b"ping\n")
                if not x[1].readline().startswith(x[2].encode()):
                    x[3] = False
            except OSError:
                x[3] = False
        time.sleep(0.2)
    res = {}
    for _, _, name, ok in conns:
        r = res.setdefault(name, [0, 0])
        r[0 if ok else 1] += 1
    # Written whole, then renamed: the test waits for the file to exist and
    # reads it at once (it read an empty file once, mid-write).
    with open(out + ".tmp", "w") as fh:
        json.dump(res, fh)
    os.replace(out + ".tmp", out)


def load(vip, rate):
    def try_one():
        try:
            one(vip)
        except OSError:
            pass

    while True:
        t = time.time()
        for _ in range(rate):
            threading.Thread(target=try_one, daemon=True).start()
        time.sleep(max(0.0, 1.0 - (time.time() - t)))


if __name__ == "__main__":
    mode, vip = sys.argv[1], sys.argv[2]
    if mode == "short":
        print(json.dumps(short(vip, int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 16)))
    elif mode == "udp":
        print(json.dumps(udp(vip, int(sys.argv[3]))))
    elif mode == "hold":
        hold(vip, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    elif mode == "load":
        load(vip, int(sys.argv[3]))
    else:
        sys.exit(__doc__)
