#!/usr/bin/env bash
# Packets per second of `sluice forward` against `dpdk-testpmd --forward-mode=io`
# on the same pair of virtual devices, the same EAL arguments, one forwarding
# lcore each, alternating in the same run. Prints each round and the ratio of
# the medians (sluice / testpmd).
#
#   bench/forward_vs_testpmd.sh                 # net_null pair, 3 rounds of 5 s
#   ROUNDS=5 SECS=10 bench/forward_vs_testpmd.sh
#   VDEVS="--vdev=net_ring0 --vdev=net_ring1" bench/forward_vs_testpmd.sh
#
# Needs root (DPDK), dpdk-testpmd (Debian package dpdk) and a release build
# (cargo build --release -p sluice).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-5}
WARM=${WARM:-2}
VDEVS=${VDEVS:-"--vdev=net_null0 --vdev=net_null1"}
LCORES=${LCORES:-0,1}
SLUICE=${SLUICE:-target/release/sluice}
EAL="--no-huge -m 1024 --no-pci --no-telemetry -l $LCORES"

command -v dpdk-testpmd >/dev/null || { echo "dpdk-testpmd not found (apt-get install dpdk)" >&2; exit 1; }
[ -x "$SLUICE" ] || { echo "$SLUICE not built (cargo build --release -p sluice)" >&2; exit 1; }

# Million packets per second sent by testpmd over SECS seconds after WARM.
testpmd_mpps() {
  # shellcheck disable=SC2086
  { sleep "$WARM"; echo "show port stats all"; sleep "$SECS"; echo "show port stats all"; sleep 0.3; echo "stop"; echo "quit"; } |
    dpdk-testpmd $EAL --file-prefix="bench-tp-$$" $VDEVS -- -i --forward-mode=io --auto-start \
      --nb-cores=1 --burst=32 --rxd=1024 --txd=1024 --mbcache=256 --total-num-mbufs=8191 2>/dev/null |
    awk '/Tx-pps:/ { v[n++] = $2 } END { if (n < 4) exit 1; printf "%.3f\n", (v[n-1] + v[n-2]) / 1e6 }'
}

sluice_mpps() {
  # shellcheck disable=SC2086
  "$SLUICE" --log warn forward --json --warmup "$WARM" --duration "$((WARM + SECS))" -- \
    $EAL --file-prefix="bench-sl-$$" $VDEVS |
    python3 -c 'import json,sys; r=json.load(sys.stdin); assert r["mbufs_in_use_after"]==0; print("%.3f" % r["mpps"])'
}

median() { sort -g | awk '{ a[n++] = $1 } END { print (n % 2) ? a[int(n/2)] : (a[n/2-1] + a[n/2]) / 2 }'; }

echo "forward benchmark: $VDEVS, EAL $EAL, $ROUNDS rounds of ${SECS}s after ${WARM}s warm-up"
tp=(); sl=()
for r in $(seq 1 "$ROUNDS"); do
  t=$(testpmd_mpps); s=$(sluice_mpps)
  tp+=("$t"); sl+=("$s")
  printf 'round %d: testpmd io %8.3f Mpps   sluice forward %8.3f Mpps   ratio %.3f\n' "$r" "$t" "$s" "$(echo "$s / $t" | bc -l)"
done
mt=$(printf '%s\n' "${tp[@]}" | median); ms=$(printf '%s\n' "${sl[@]}" | median)
printf 'median: testpmd io %.3f Mpps, sluice forward %.3f Mpps\n' "$mt" "$ms"
printf 'ratio sluice/testpmd: %.3f\n' "$(echo "$ms / $mt" | bc -l)"
