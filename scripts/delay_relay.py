#!/usr/bin/env python3
"""A user-space relay between two interfaces that delays TCP SYN-ACKs (this
kernel has no netem): for the passive-health test of a slow endpoint.

  delay_relay.py BACKEND_IFACE OTHER_IFACE DELAY_MS SECONDS

Every frame received on one interface is sent out of the other (both
directions, as a wire would); IPv4 TCP frames with SYN and ACK set that
come from BACKEND_IFACE wait DELAY_MS first. Runs for SECONDS, then exits.
Writes "ready" to stdout once both sockets are bound, and at the end a JSON
object {"relayed": n, "delayed": n}.
"""
import heapq
import json
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def is_syn_ack(f):
    if len(f) < 34 or f[12:14] != b"\x08\x00" or f[23] != 6:
        return False
    l4 = 14 + (f[14] & 0x0F) * 4
    return len(f) > l4 + 13 and f[l4 + 13] & 0x12 == 0x12


def open_raw(iface):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.setblocking(False)
    return s


def main():
    backend, other, delay_ms, secs = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
    a, b = open_raw(backend), open_raw(other)
    peer = {a: b, b: a}
    print("ready", flush=True)
    queue = []  # (due, seq, socket, frame)
    seq = relayed = delayed = 0
    end = time.monotonic() + secs
    while time.monotonic() < end:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, out, frame = heapq.heappop(queue)
            out.send(frame)
            relayed += 1
        wait = min(0.05, queue[0][0] - now) if queue else 0.05
        ready, _, _ = select.select([a, b], [], [], max(0.0, wait))
        for s in ready:
            while True:
                try:
                    frame, addr = s.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:
                    continue
                if s is a and is_syn_ack(frame):
                    seq += 1
                    delayed += 1
                    heapq.heappush(queue, (time.monotonic() + delay_ms / 1000.0, seq, peer[s], frame))
                else:
                    peer[s].send(frame)
                    relayed += 1
    print(json.dumps({"relayed": relayed, "delayed": delayed}), flush=True)


if __name__ == "__main__":
    main()
