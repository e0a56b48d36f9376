#!/usr/bin/env python3
"""Writes seeds for the `worker` fuzz target (fuzz/fuzz_targets/worker.rs):
sequences of 4-byte records [op, a, b, c] that reach each VIP and each kind
of frame, on both workers and both ports, with polls between.

Usage: fuzz_seeds_worker.py OUT_DIR
"""
import os
import sys

POLL0, POLL1 = bytes([13, 0, 25, 0]), bytes([13, 1, 25, 0])


def rec(op, a, b, c):
    return bytes([op, a, b, c])


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {}
    # One seed per template, both workers, small and too-big sizes, DF on.
    for op, name in [(0, "tcp4"), (1, "udp4"), (2, "sctp4"), (3, "sctp6"), (4, "tcp6"),
                     (9, "icmp4_error"), (10, "icmp6_error"), (11, "return")]:
        body = b""
        for a in (0, 1, 7, 200):
            for c in (0x08, 0x09, 0xe8, 0xf9, 0x0a):
                body += rec(op, a, a ^ 0x5a, c)
        seeds[name] = body + POLL0 + POLL1
    # Fragments: later ones first on one worker, the first on the other.
    for first, later, name in [(5, 6, "frag4"), (7, 8, "frag6")]:
        body = b""
        for a in (1, 2, 3):
            body += rec(later, a, 40 + a, 0x10) + rec(later, a, 40 + a, 0x28) + rec(first, a, 40 + a, 0x11)
        seeds[name] = body + POLL0 + POLL1 + POLL0
    # A flow, its fragments and an ICMP error about it, a snapshot swap, a clock step.
    seeds["mixed"] = (rec(1, 3, 9, 0x00) + rec(5, 3, 77, 0x21) + rec(6, 3, 77, 0x10) + POLL0
                      + rec(14, 0, 0, 0) + rec(9, 3, 9, 0x01) + rec(0, 2, 8, 0xf8) + rec(15, 20, 0xff, 0)
                      + POLL1 + rec(13, 0, 255, 0) + rec(12, 6, 0, 0) + bytes(range(6)) + POLL0 + POLL1)
    for name, body in seeds.items():
        with open(os.path.join(out, "seed-" + name), "wb") as f:
            f.write(body)


if __name__ == "__main__":
    main()
