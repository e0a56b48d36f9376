#!/usr/bin/env python3
"""A demo and test backend: answers on every address (VIPs included).

TCP port 80: sends "<name>\\n" on accept, then echoes every line back
prefixed with its name, until the client closes. UDP port 53 on each VIP:
answers each datagram with "<name> <datagram>" (a UDP server behind a
NAT-less load balancer must answer from the VIP, hence one socket per VIP).
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


for v in sys.argv[2:]:
    threading.Thread(target=udp, args=(v,), daemon=True).start()
tcp()
