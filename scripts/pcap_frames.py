#!/usr/bin/env python3
"""Splits classic pcap files into one file per frame (a fuzzing seed corpus).

Raw-IP link types (101, 228, 229) get an Ethernet header so that every seed
is a frame as the parser sees it.  Usage: pcap_frames.py OUT_DIR PCAP...
"""
import os
import struct
import sys


def frames(path):
    d = open(path, "rb").read()
    magic = d[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        return
    linktype = struct.unpack(e + "I", d[20:24])[0]
    off = 24
    while off + 16 <= len(d):
        incl = struct.unpack(e + "I", d[off + 8 : off + 12])[0]
        pkt = d[off + 16 : off + 16 + incl]
        off += 16 + incl
        if linktype == 1:
            yield pkt
        elif linktype in (101, 228, 229):
            v6 = linktype == 229 or (linktype == 101 and pkt[:1] and pkt[0] >> 4 == 6)
            yield b"\x02\x00\x00\x00\x01\x00" + b"\x02\x00\x00\x00\x00\x01" + (b"\x86\xdd" if v6 else b"\x08\x00") + pkt


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    for p in sys.argv[2:]:
        for i, f in enumerate(frames(p)):
            name = "%s-%03d" % (os.path.basename(p).rsplit(".", 1)[0], i)
            with open(os.path.join(out, name), "wb") as fh:
                fh.write(f)
            n += 1
    print("%d seed frames in %s" % (n, out))


if __name__ == "__main__":
    main()
