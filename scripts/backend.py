#!/usr/bin/env python3
"""A demo and test backend: answers on every address (VIPs included).

TCP port 80: sends "<name>\\n" on accept, then echoes every line back
prefixed with its name, until the client closes. UDP port 53 on each VIP:
answers each datagram with "<name> <datagram>" (a UDP server behind a
NAT-less load balancer must answer from the VIP, hence one socket per VIP).
For active health checks, on every address: TCP port 8080 answers HTTP
`GET /healthz` with 200 (any other path 404), UDP port 5353 answers DNS
queries (NXDOMAIN: a well-formed answer).
Usage: backend.py NAME VIP...
"""
import socket
import sys
import threading

NAME = sys.argv[1].encode()


def tcp_client(c):
    try:
        c.sendall(NAME + b"\n")
        f = c.makefile("rb")
        for line in f:
            c.sendall(NAME + b" " + line)
    except OSError:
        pass
    finally:
        c.close()


def tcp():
    try:
        # Both families on one socket where the namespace has IPv6.
        s = socket.socket(socket.AF_INET6)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", 80))
    except OSError:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", 80))
    s.listen(512)
    while True:
        c, _ = s.accept()
        threading.Thread(target=tcp_client, args=(c,), daemon=True).start()


def udp(vip):
    s = socket.socket(socket.AF_INET6 if ":" in vip else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((vip, 53))
    while True:
        d, a = s.recvfrom(2048)
        s.sendto(NAME + b" " + d, a)


def bind_any(kind, port):
    """A socket on `port` of every address, both families where there are."""
    try:
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("::", port))
    except OSError:
        s = socket.socket(socket.AF_INET, kind)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
    return s


def http_check(c):
    try:
        c.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            d = c.recv(4096)
            if not d:
                return
            head += d
        path = head.split(b" ")[1] if head.count(b" ") >= 2 else b""
        status = b"200 OK" if path == b"/healthz" else b"404 Not Found"
        c.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Length: 3\r\nConnection: close\r\n\r\n" + NAME[:3])
    except OSError:
        pass
    finally:
        c.close()


def http():
    s = bind_any(socket.SOCK_STREAM, 8080)
    s.listen(512)
    while True:
        c, _ = s.accept()
        threading.Thread(target=http_check, args=(c,), daemon=True).start()


def dns():
    s = bind_any(socket.SOCK_DGRAM, 5353)
    while True:
        d, a = s.recvfrom(2048)
        if len(d) < 12 or d[2] & 0x80:
            continue
        # The query back as a response: QR, RA, NXDOMAIN; the question kept.
        s.sendto(d[:2] + bytes([0x80 | (d[2] & 0x01), 0x83]) + d[4:], a)


for v in sys.argv[2:]:
    threading.Thread(target=udp, args=(v,), daemon=True).start()
threading.Thread(target=http, daemon=True).start()
threading.Thread(target=dns, daemon=True).start()
tcp()
