#!/usr/bin/env python3
"""Sends UDP frames out of an interface at a paced rate (bursts every
millisecond) through an AF_PACKET socket; prints how many were sent.

    paced_udp.py IFACE DST_MAC SRC_IP DST_IP DPORT RATE_PPS SECONDS
"""
import socket
import struct
import sys
import time


def csum(b: bytes) -> int:
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def main() -> None:
    iface, dmac, sip, dip, dport, rate, secs = sys.argv[1:8]
    rate, secs, dport = int(rate), float(secs), int(dport)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    src_mac = open(f"/sys/class/net/{iface}/address").read().strip()
    eth = bytes.fromhex(dmac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) + b"\x08\x00"
    frames = []
    for k in range(256):
        udp = struct.pack("!HHHH", 10000 + k, dport, 8 + 18, 0) + bytes(18)
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), k, 0, 64, 17, 0,
                         socket.inet_aton(sip), socket.inet_aton(dip))
        ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
        frames.append(eth + ip + udp)
    per_ms = max(1, rate // 1000)
    sent = 0
    start = time.perf_counter()
    tick = 0
    while True:
        now = time.perf_counter() - start
        if now >= secs:
            break
        due = int(now * 1000) + 1
        while tick < due:
            for _ in range(per_ms):
                try:
                    s.send(frames[sent & 255])
                    sent += 1
                except OSError:
                    pass
            tick += 1
        time.sleep(0.0002)
    print(sent)


if __name__ == "__main__":
    main()
