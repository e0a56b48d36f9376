#!/usr/bin/env python3
"""Sends UDP frames as fast as one core allows, straight onto an interface.

  udp_blast.py IFACE DST_MAC SRC_IP DST_IP DST_PORT COUNT

Builds an Ethernet/IPv4/UDP frame (source port varies, so the frames are
many flows) and writes COUNT of them with an AF_PACKET socket. Prints a
JSON object: {"sent": n, "seconds": s, "pps": r}.
"""
import json
import socket
import struct
import sys
import time


def checksum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


iface, dst_mac, src_ip, dst_ip, dport, count = sys.argv[1:7]
dport, count = int(dport), int(count)
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((iface, 0))
src_mac = s.getsockname()[4]
dst = bytes.fromhex(dst_mac.replace(":", ""))
payload = b"blast" * 8
frames = []
for sport in range(20000, 20256):
    udp = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                     socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    frames.append(dst + src_mac + b"\x08\x00" + ip + udp)
sent = 0
t0 = time.time()
n = len(frames)
while sent < count:
    try:
        s.send(frames[sent % n])
        sent += 1
    except OSError:
        # The interface's queue is full: the kernel refused it, so it was
        # not sent; try again.
        time.sleep(0)
dt = time.time() - t0
print(json.dumps({"sent": sent, "seconds": dt, "pps": sent / dt if dt else 0}))
