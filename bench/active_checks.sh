#!/usr/bin/env bash
# What active checks cost the control side (issue: 10,000 endpoints checked
# every 2 s within 10 % of a core). In a network namespace of its own,
# 10.77.0.0/16 is routed into a tun device whose other end,
# bench/tun_responder.py on core 1, answers every SYN with a SYN-ACK:
# bench/examples/active_checks checks 10,000 of its addresses from core 0.
# As in the appliance, where the checks leave through the exception
# interface (a tap) and the endpoints' answers are written into it by the
# worker, the checking thread pays for its sockets and what it sends, and
# the kernel's processing of the answers runs in the writer. Then the same
# on loopback, where the checking thread pays for both ends of every
# handshake (an upper bound).
#
#   bench/active_checks.sh                 # ENDPOINTS=10000 SECS=20
#
# Needs root, iproute2, python3, taskset and a release build of the example
# (cargo build --release -p sluice-bench --example active_checks).
set -euo pipefail
cd "$(dirname "$0")/.."
ENDPOINTS=${ENDPOINTS:-10000}
SECS=${SECS:-20}
BIN=${BIN:-$PWD/target/release/examples/active_checks}
NS="sl-ac-$$"
RPID=
cleanup() {
  [ -n "$RPID" ] && kill "$RPID" 2>/dev/null || true
  ip netns del "$NS" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$NS"
ip netns exec "$NS" ip link set lo up
ip netns exec "$NS" taskset -c 1 python3 bench/tun_responder.py actun > /tmp/$NS.responder 2>&1 &
RPID=$!
for _ in $(seq 50); do grep -q ready /tmp/$NS.responder 2>/dev/null && break; sleep 0.1; done
rm -f /tmp/$NS.responder
ip netns exec "$NS" ip addr add 10.76.0.1/24 dev actun
ip netns exec "$NS" ip link set actun up
ip netns exec "$NS" ip route add 10.77.0.0/16 dev actun
echo "== through a tun device, answered from core 1"
ip netns exec "$NS" taskset -c 0 "$BIN" "$ENDPOINTS" "$SECS" 10.77.0.0 9090
echo "== on loopback, both ends of each handshake on the checking thread"
taskset -c 0 "$BIN" "$ENDPOINTS" "$SECS"
