#!/usr/bin/env python3
"""Traffic for the demo and the end-to-end test (runs in the client namespace).

  client.py short VIP N [CONCURRENCY]   N short TCP connections; prints a JSON
                                        object {backend: count, "failed": n}
  client.py udp VIP N                   N UDP queries; same output
  client.py hold VIP N SECONDS FILE     opens N long-lived connections, sends a
                                        line on each every 0.2 s for SECONDS (or
                                        until FILE.stop exists), writes
                                        {backend: [ok, broken]} to FILE, the
                                        rounds done so far to FILE.rounds, and
                                        when and why each broken one broke to
                                        FILE.why
  client.py udphold VIP N SECONDS FILE  the same with N UDP flows (one socket
                                        each, to port 53): a flow is broken when
                                        an answer comes from another backend than
                                        its first, or none to 4 tries of 1 s; FILE gets
                                        {backend: [ok, broken]} by first backend
  client.py load VIP RATE               short connections at RATE per second,
                                        forever (for the demo)
  client.py stream VIP RATE SECONDS FILE
                                        short connections at RATE per second (one
                                        thread each) for SECONDS or until FILE.stop
                                        exists; appends "<start time> <backend>" or
                                        "<start time> failed <why>" per connection
                                        to FILE as each ends
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
        conns.append([c, f, f.readline().strip().decode()])
    with open(out + ".ready", "w") as fh:
        json.dump(Counter(x[2] for x in conns), fh)

    def step(x):
        x[0].sendall(b"ping\n")
        line = x[1].readline()
        if not line:
            raise OSError("closed by the peer")
        if not line.startswith(x[2].encode()):
            raise OSError("answered by " + line.split(b" ")[0].decode(errors="replace"))
        return x[2]

    keep(conns, step, secs, out, [x[2] for x in conns])


def keep(flows, step, secs, out, names=None):
    """Runs `step` on every flow still whole every 0.2 s for `secs` (or until
    out.stop exists); `step` returns the flow's backend or raises OSError when
    the flow broke. Writes {backend: [ok, broken]} to `out`, the rounds done
    so far to out.rounds, and, for each broken flow, when (seconds since the
    first round) and why to out.why. `names` are the flows' backends when
    known before the first round."""
    names = names or [None] * len(flows)
    why = {}
    start = time.time()
    end = start + secs
    rounds = 0
    while time.time() < end and not os.path.exists(out + ".stop"):
        for i, x in enumerate(flows):
            if i in why:
                continue
            t = time.time()
            try:
                names[i] = step(x)
            except OSError as e:
                why[i] = {"at": round(t - start, 2), "after": round(time.time() - t, 2), "why": str(e) or type(e).__name__,
                          "port": x[0].getsockname()[1]}
        rounds += 1
        write_whole(out + ".rounds", rounds)
        time.sleep(0.2)
    res = {}
    for i, name in enumerate(names):
        r = res.setdefault(name or "none", [0, 0])
        r[1 if i in why else 0] += 1
    write_whole(out + ".why", {"%s/%d" % (names[i] or "none", i): w for i, w in why.items()})
    write_whole(out, res)


def write_whole(path, value):
    # Written whole, then renamed: the test waits for the file to exist and
    # reads it at once (written in place, it could be read empty, mid-write).
    with open(path + ".tmp", "w") as fh:
        json.dump(value, fh)
    os.replace(path + ".tmp", path)


def udphold(vip, n, secs, out):
    family = socket.AF_INET6 if ":" in vip else socket.AF_INET
    flows = []
    for i in range(n):
        s = socket.socket(family, socket.SOCK_DGRAM)
        s.settimeout(1.0)
        flows.append([s, i, None])

    def step(x):
        # A datagram lost (an appliance gone before the router knows) is
        # sent again: a flow breaks when another backend answers, or none
        # does in 4 tries.
        for attempt in range(4):
            x[0].sendto(b"u%d" % x[1], (vip, 53))
            try:
                d, _ = x[0].recvfrom(2048)
                break
            except socket.timeout:
                if attempt == 3:
                    raise
        name = d.split(b" ")[0].decode()
        if x[2] is None:
            x[2] = name
        elif name != x[2]:
            raise OSError("answered by " + name)
        return x[2]

    keep(flows, step, secs, out)


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


def stream(vip, rate, secs, out):
    lock = threading.Lock()
    f = open(out, "a", buffering=1)

    def try_one(t):
        try:
            line = f"{t:.3f} {one(vip, timeout=2.0)}"
        except OSError as e:
            line = f"{t:.3f} failed {type(e).__name__}"
        with lock:
            f.write(line + "\n")

    end = time.time() + secs
    gap = 1.0 / rate
    nxt = time.time()
    while time.time() < end and not os.path.exists(out + ".stop"):
        threading.Thread(target=try_one, args=(time.time(),), daemon=True).start()
        nxt += gap
        time.sleep(max(0.0, nxt - time.time()))
    time.sleep(2.5)
    f.close()


if __name__ == "__main__":
    mode, vip = sys.argv[1], sys.argv[2]
    if mode == "short":
        print(json.dumps(short(vip, int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else 16)))
    elif mode == "udp":
        print(json.dumps(udp(vip, int(sys.argv[3]))))
    elif mode == "hold":
        hold(vip, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    elif mode == "udphold":
        udphold(vip, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    elif mode == "load":
        load(vip, int(sys.argv[3]))
    elif mode == "stream":
        stream(vip, int(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
    else:
        sys.exit(__doc__)
