#!/usr/bin/env python3
"""Answers every TCP SYN that comes out of a tun device with a SYN-ACK, as
an endpoint behind the appliance does (seen from the control side's
sockets): the kernel's side of the handshake then runs in this process,
which writes the answers into the device, as the DPDK worker does into the
appliance's exception interface. Everything else (the ACKs, the RSTs) is
read and dropped.

Usage: tun_responder.py IFNAME   (creates the tun device; runs until killed)
"""
import fcntl
import os
import struct
import sys

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000


def csum(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return ~s & 0xFFFF


def main():
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", sys.argv[1].encode(), IFF_TUN | IFF_NO_PI))
    print("ready", flush=True)
    while True:
        p = os.read(fd, 2048)
        if len(p) < 40 or p[0] >> 4 != 4 or p[9] != 6:
            continue
        ihl = (p[0] & 15) * 4
        t = p[ihl:]
        if t[13] & 0x12 != 0x02:  # SYN without ACK only
            continue
        src, dst = p[12:16], p[16:20]
        sport, dport, seq = struct.unpack("!HHI", t[:8])
        tcp = struct.pack("!HHIIBBHHH", dport, sport, 0x1000, (seq + 1) & 0xFFFFFFFF, 5 << 4, 0x12, 65535, 0, 0)
        tcp = tcp[:16] + struct.pack("!H", csum(dst + src + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, dst, src)
        ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
        os.write(fd, ip + tcp)


main()
