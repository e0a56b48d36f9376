#!/usr/bin/env bash
# Footprint of an idle `sluice run` with the demo configuration, and what
# the step from idle to a paced rate costs.
#
# In a network namespace of its own (the demo's veth ends lbf/lbb, their
# peers lbf-p/lbb-p), `sluice run --config configs/demo.yaml` (its own file
# prefix, and endpoint MACs made static so that no backend is needed) runs
# idle for SECS seconds: prints its CPU use (whole process and per thread,
# in % of one core) and resident memory. Then bench/paced_udp.py sends UDP
# to the demo's dns VIP at RATE packets/s (1 ms bursts) for STEP seconds,
# starting while the workers are idle: prints what was sent, what the worker
# took in and balanced, and the difference (lost before the worker saw it).
# The same is done with dpdk.busyPoll: true, in the same run, as the baseline.
#
#   bench/idle_footprint.sh               # SECS=10 STEP=2 RATE=100000
#   MODES="backoff" SECS=30 bench/idle_footprint.sh
#   LCORES=0 bench/idle_footprint.sh      # one core
#
# Needs root, iproute2, python3, curl and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-10}
STEP=${STEP:-2}
RATE=${RATE:-100000}
IDLE_MAX=${IDLE_MAX:-2000}  # dpdk.idlePauseMaxMicros
LCORES=${LCORES:-0,1}       # dpdk.lcores ("0": one core for the worker and the control runtime)
MODES=${MODES:-"backoff busy"}
SLUICE=${SLUICE:-$PWD/target/release/sluice}
NS="sl-idle-$$"
WORK=$(mktemp -d /tmp/sluice-idle-XXXXXX)
SPID=

cleanup() {
  [ -n "$SPID" ] && kill -INT "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  ip netns del "$NS" 2>/dev/null || true
  rm -rf "$WORK" /var/run/dpdk/sl-idle-$$
}
trap cleanup EXIT

in_ns() { ip netns exec "$NS" "$@"; }

ip netns add "$NS"
in_ns ip link set lo up
for p in lbf lbb; do
  in_ns ip link add "$p" type veth peer name "$p-p"
  in_ns ip link set "$p" up
  in_ns ip link set "$p-p" up
done

metric() { in_ns curl -sf --max-time 2 "http://127.0.0.1:9091/metrics" | awk -v m="^$1" '$0 ~ m { s += $2 } END { printf "%d\n", s }'; }

# utime+stime of a process or thread, in clock ticks.
ticks() { awk '{ print $14 + $15 }' "$1"; }

for mode in $MODES; do
  busy=false; [ "$mode" = busy ] && busy=true
  sed -e "s/filePrefix: sluice-demo/filePrefix: sl-idle-$$/" \
      -e "s/lcores: \"0,1\"/lcores: \"$LCORES\"/" -e "s/busyPoll: false /busyPoll: $busy /" -e "s/idlePauseMaxMicros: [0-9]* /idlePauseMaxMicros: $IDLE_MAX /" \
      -e 's/{id: \([0-9]\), address: \(10.200.0.1[0-9]\)}/{id: \1, address: \2, mac: "02:00:00:00:c8:0\1"}/' \
      configs/demo.yaml >"$WORK/demo.yaml"
  grep -q "busyPoll: $busy" "$WORK/demo.yaml" || { echo "could not set busyPoll in the demo config" >&2; exit 1; }
  ip netns exec "$NS" "$SLUICE" --log info run --config "$WORK/demo.yaml" >"$WORK/sluice.log" 2>&1 &
  SPID=$!
  for _ in $(seq 1 100); do
    in_ns curl -sf --max-time 1 http://127.0.0.1:9091/readyz >/dev/null 2>&1 && break
    sleep 0.2
  done
  # The PID of sluice itself (ip netns exec execs it).
  pid=$SPID
  sleep 2
  declare -A t0=()
  for t in /proc/"$pid"/task/*; do t0[$t]=$(ticks "$t/stat"); done
  p0=$(ticks /proc/"$pid"/stat); s0=$(date +%s.%N)
  sleep "$SECS"
  p1=$(ticks /proc/"$pid"/stat); s1=$(date +%s.%N)
  hz=$(getconf CLK_TCK)
  cpu=$(echo "($p1 - $p0) / $hz / ($s1 - $s0) * 100" | bc -l)
  printf '%-8s idle %ss: CPU %.2f %% of one core; %s\n' "$mode" "$SECS" "$cpu" \
    "$(grep -E '^(VmRSS|RssAnon|RssFile|RssShmem)' /proc/"$pid"/status | tr -s ' \t' ' ' | tr '\n' ';')"
  for t in /proc/"$pid"/task/*; do
    [ -n "${t0[$t]:-}" ] || continue
    d=$(( $(ticks "$t/stat") - ${t0[$t]} ))
    [ "$d" -gt 0 ] && printf '         thread %-16s %.2f %%\n' "$(cat "$t/comm")" "$(echo "$d / $hz / ($s1 - $s0) * 100" | bc -l)"
  done
  unset t0
  # The largest resident mappings.
  awk '/^[0-9a-f]+-[0-9a-f]+ / { name = ($6 == "" ? "[anon]" : $6) } /^Rss:/ { rss[name] += $2 }
       END { for (n in rss) printf "%d %s\n", rss[n], n }' /proc/"$pid"/smaps | sort -rn | head -6 |
    awk '{ printf "         rss %6d kB  %s\n", $1, $2 }' || true

  # The step: from idle to RATE.
  rx0=$(metric sluice_worker_rx_packets_total); fw0=$(metric sluice_worker_balanced_packets_total)
  mac=$(grep -o 'port=front[^\n]*' "$WORK/sluice.log" | grep -o 'mac=[0-9a-f:]*' | head -1 | cut -d= -f2 || true)
  [ -n "$mac" ] || mac=$(in_ns cat /sys/class/net/lbf/address)
  sent=$(in_ns python3 bench/paced_udp.py lbf-p "$mac" 10.100.0.2 20.0.0.1 53 "$RATE" "$STEP")
  sleep 1
  rx1=$(metric sluice_worker_rx_packets_total); fw1=$(metric sluice_worker_balanced_packets_total)
  drops=$(metric sluice_drops_total)
  printf '%-8s step from idle to %s pps for %ss: sent %d, worker took in %d, balanced %d, dropped by sluice %d, not balanced (lost) %d\n' \
    "$mode" "$RATE" "$STEP" "$sent" "$((rx1 - rx0))" "$((fw1 - fw0))" "$drops" "$((sent - (fw1 - fw0)))"
  kill -INT "$SPID"; wait "$SPID" || { cat "$WORK/sluice.log" >&2; echo "sluice run failed" >&2; }
  SPID=
done
