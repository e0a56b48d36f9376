#!/usr/bin/env bash
# The Sluice demo, from nothing: installs what is missing, builds, creates the
# namespace topology of scripts/topology.sh (a client, the appliance on
# af_packet ports, three NAT-less backends), runs `sluice run`, sends real
# TCP connections to the VIP and shows how they spread, live. Halfway
# through it removes one backend from the configuration: only that
# backend's share moves. Everything is removed at the end (or on Ctrl-C).
#
#   scripts/demo.sh                 # 40 s, as root
#   DURATION=0 scripts/demo.sh      # until Ctrl-C
#   RATE=200 scripts/demo.sh        # connections per second
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${DURATION:-40}
RATE=${RATE:-50}
P=sldemo
CFG=$(mktemp /tmp/sluice-demo-XXXX.yaml)
LOG=/tmp/sluice-demo.log

scripts/setup.sh
cargo build --release -p sluice --quiet
BIN=$PWD/target/release/sluice

pids=()
cleanup() {
  trap - EXIT INT TERM
  ip netns exec "$P-lb" pkill -INT -f "sluice run --config $CFG" 2>/dev/null || true
  sleep 1
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  scripts/topology.sh down "$P"
  rm -f "$CFG"
  echo "demo: cleaned up (appliance log: $LOG)"
}
trap cleanup EXIT INT TERM

scripts/topology.sh up "$P"
for i in 1 2 3; do
  ip netns exec "$P-be$i" python3 scripts/backend.py "be$i" 20.0.0.1 20.0.0.2 >/dev/null 2>&1 &
  pids+=($!)
done
sed "s/filePrefix: sluice-demo/filePrefix: $P/" configs/demo.yaml > "$CFG"
ip netns exec "$P-lb" "$BIN" run --config "$CFG" >"$LOG" 2>&1 &
pids+=($!)

status() { ip netns exec "$P-lb" "$BIN" status "$@"; }
for _ in $(seq 1 60); do
  if status --json 2>/dev/null | grep -q '"state": "ready"'; then break; fi
  sleep 0.5
done
status >/dev/null || { echo "demo: the appliance did not start; see $LOG" >&2; tail -20 "$LOG" >&2; exit 1; }

ip netns exec "$P-client" python3 scripts/client.py load 20.0.0.1 "$RATE" &
pids+=($!)

start=$(date +%s); removed=0
while :; do
  now=$(date +%s); t=$((now - start))
  if [ "$DURATION" -gt 0 ] && [ "$t" -ge "$DURATION" ]; then break; fi
  if [ "$removed" = 0 ] && [ "$DURATION" -gt 0 ] && [ "$t" -ge $((DURATION / 2)) ]; then
    # Drop endpoint 2 (be3) from service web by editing the configuration:
    # Sluice notices the change and rebuilds only that service's table.
    python3 - "$CFG" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
open(p, "w").write(s.replace("      - {id: 2, address: 10.200.0.13}\n  - name: dns", "  - name: dns", 1))
PY
    removed=1
  fi
  clear 2>/dev/null || true
  echo "Sluice demo: $RATE TCP connections/s from the client namespace to 20.0.0.1:80 ($t s; Ctrl-C stops)"
  if [ "$removed" = 1 ]; then echo ">>> endpoint 2 (be3) was removed from service web: only its flows moved"; fi
  echo
  status | sed -n '1,2p;/^WORKERS/,$p'
  sleep 2
done
echo
echo "demo: final distribution"
status | sed -n '/^SERVICES/,$p'
