#!/usr/bin/env python3
"""Hammers an admin endpoint with hostile requests for a bounded time.

  admin_hammer.py HOST:PORT SECONDS

Rounds of: a request declaring a huge body, a megabyte of headers, garbage
request lines, slow clients that send half a request and hold the
connection, bursts of concurrent scrapes, and ordinary requests. Prints one
JSON object with what it sent and what came back.
"""
import json
import random
import socket
import sys
import threading
import time
from collections import Counter

host, port = sys.argv[1].rsplit(":", 1)
port = int(port)
secs = float(sys.argv[2])
seen = Counter()
lock = threading.Lock()


def note(key):
    with lock:
        seen[key] += 1


def raw(data, timeout=3.0):
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(data)
            buf = b""
            while len(buf) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                buf += chunk
            return buf.split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as e:
        return "error:" + type(e).__name__


def huge_body():
    note("huge_body:" + raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999999\r\n\r\n"))


def huge_headers():
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 60) for i in range(16000))
    note("huge_headers:" + raw(b"GET /status HTTP/1.1\r\nHost: x\r\n" + pad + b"\r\n"))


def garbage():
    junk = random.choice([b"\x00\x01\x02\r\n\r\n", b"GET\r\n\r\n", b"BREW /pot HTCPCP/1.0\r\n\r\n",
                          b"GET / HTTP/9.9\r\n\r\n", bytes(random.getrandbits(8) for _ in range(512))])
    note("garbage:" + raw(junk, timeout=2.0))


def slow():
    socks = []
    for _ in range(40):
        try:
            s = socket.create_connection((host, port), timeout=2.0)
            s.sendall(b"GET /metr")
            socks.append(s)
        except OSError:
            note("slow:connect_failed")
    time.sleep(3.0)
    for s in socks:
        s.close()
    note("slow:held_%d" % len(socks))


def burst():
    ts = [threading.Thread(target=lambda: note("burst:" + raw(
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=10.0))) for _ in range(100)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def ordinary():
    note("ordinary:" + raw(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout=10.0))


end = time.time() + secs
threads = []
while time.time() < end:
    f = random.choice([huge_body, huge_headers, garbage, slow, burst, ordinary, ordinary])
    t = threading.Thread(target=f)
    t.start()
    threads.append(t)
    threads = [t for t in threads if t.is_alive()]
    time.sleep(0.05)
for t in threads:
    t.join()
print(json.dumps(dict(seen), sort_keys=True))
