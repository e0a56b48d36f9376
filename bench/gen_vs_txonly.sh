#!/usr/bin/env bash
# The generator's rate on one core against dpdk-testpmd txonly, on net_null
# (which frees what it is given), 64-byte UDP frames, 1,024 flows, in
# alternating rounds, with an optional second build of sluice (SLUICE_BASE)
# in the same rounds. bench/lab.sh's last step is one round of it (RAW=1).
#
#   bench/gen_vs_txonly.sh
#   SLUICE_BASE=/tmp/sluice-before ROUNDS=3 bench/gen_vs_txonly.sh
#
# Prints Mpps per round and the ratios gen / txonly (and gen / base);
# with RAW=1, only "<gen pps> <txonly pps>" per round (bench/lab.sh reads it).
# Env: SLUICE (target/release/sluice), SLUICE_BASE (none), SECS (5),
# ROUNDS (3), RAW. Needs root, dpdk-testpmd (Debian package dpdk) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

SLUICE=${SLUICE:-target/release/sluice}
SLUICE_BASE=${SLUICE_BASE:-}
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
RAW=${RAW:-}
[ -x "$SLUICE" ] || { echo "$SLUICE not built (cargo build --release -p sluice)" >&2; exit 1; }
command -v dpdk-testpmd >/dev/null || { echo "dpdk-testpmd not found (apt-get install dpdk)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sluice-genvs-XXXXXX)
TAG="gv$$"
trap 'rm -rf "$WORK" /var/run/dpdk/"$TAG"-*' EXIT

gen() { # binary -> frames per second
  "$1" gen -q --json "$WORK/g.json" --port net_null0,no-rx=1 --dst-mac 02:51:00:00:00:01 \
    --vips 20.0.0.1 --proto udp --sizes 64 --flows 1024 --rate max --duration "$SECS" --drain-ms 0 \
    --lcores 0,1 --file-prefix "$TAG-gen" --mbufs 16383 2>"$WORK/g.log"
  python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['offered_pps'])" "$WORK/g.json"
}

txonly() { # -> frames per second
  local fifo="$WORK/tp.in" t
  rm -f "$fifo"; mkfifo "$fifo"
  dpdk-testpmd -l 0,1 --no-huge -m 1024 --no-pci --no-telemetry --file-prefix="$TAG-tp" --vdev=net_null0,no-rx=1 -- \
    -i --forward-mode=txonly --txpkts=60 --burst=32 --nb-cores=1 --total-num-mbufs=16383 --auto-start <"$fifo" >"$WORK/tp.log" 2>&1 &
  t=$!
  exec 7>"$fifo"
  for _ in $(seq 1 300); do grep -q "testpmd>" "$WORK/tp.log" && break; kill -0 "$t" 2>/dev/null || break; sleep 0.1; done
  sleep 1; echo "show port stats all" >&7; sleep "$SECS"; echo "show port stats all" >&7; sleep 0.3
  echo "stop" >&7; echo "quit" >&7; exec 7>&-
  wait "$t" || true
  awk '/Tx-pps:/ { v = $2 } END { print v + 0 }' "$WORK/tp.log"
}

ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.3f}' if b else 'n/a')" "$1" "$2"; }
mpps() { python3 -c "import sys; print(f'{float(sys.argv[1]) / 1e6:.2f}')" "$1"; }

if [ -n "$RAW" ]; then
  for _ in $(seq 1 "$ROUNDS"); do echo "$(gen "$SLUICE") $(txonly)"; done
  exit 0
fi

echo "gen_vs_txonly: $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg), ${SECS} s per run"
for r in $(seq 1 "$ROUNDS"); do
  g=$(gen "$SLUICE")
  line="round $r: gen $(mpps "$g") Mpps"
  if [ -n "$SLUICE_BASE" ]; then
    b=$(gen "$SLUICE_BASE")
    line+=", base $(mpps "$b") Mpps"
  fi
  t=$(txonly)
  line+=", txonly $(mpps "$t") Mpps; gen / txonly $(ratio "$g" "$t")"
  [ -n "$SLUICE_BASE" ] && line+=", base / txonly $(ratio "$b" "$t"), gen / base $(ratio "$g" "$b")"
  echo "$line"
done
