#!/usr/bin/env bash
# What an idle worker costs and how fast it wakes, on ports that have
# receive interrupts (two net_tap devices), in three modes measured in the
# same run: waiting on the receive interrupts (dpdk.rxInterrupts, the
# default), sleeping the bounded pauses (rxInterrupts: false), and busy
# polling (dpdk.busyPoll: true, the baseline).
#
# `sluice run` runs in namespace A with the front tap's kernel end (the
# client); the back tap's kernel end moves to namespace B, which holds the
# service's endpoint (its MAC, its address, the VIP on loopback: NAT-less
# delivery). Per mode: the appliance's CPU over SECS idle seconds, then
# COUNT datagrams GAP seconds apart (the worker is idle before each), each
# carrying its send time: the one-way time client -> appliance -> endpoint
# (p50/p99, same clock), what arrived, and the interrupt wake-ups.
#
#   bench/wake_latency.sh                  # SECS=10 COUNT=200 GAP=0.01
#   MODES="interrupts sleep" bench/wake_latency.sh
#
# Results: bench/results/wake_latency.json (and printed). Needs root,
# iproute2, python3, curl and a release build.
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-10}
COUNT=${COUNT:-200}
GAP=${GAP:-0.01}
MODES=${MODES:-"interrupts sleep busy"}
SLUICE=${SLUICE:-$PWD/target/release/sluice}
OUT=${OUT:-bench/results/wake_latency.json}
A="sl-wake-a-$$"
B="sl-wake-b-$$"
WORK=$(mktemp -d /tmp/sluice-wake-XXXXXX)
ADMIN=19391
SPID=

cleanup() {
  [ -n "$SPID" ] && kill -INT "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

cat > "$WORK/recv.py" <<'PY'
import json, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('20.0.0.1', 53))
s.settimeout(3)
lat = []
try:
    while True:
        d, _ = s.recvfrom(100)
        lat.append(time.time_ns() - int(d))
except socket.timeout:
    pass
lat.sort()
n = len(lat)
q = lambda f: round(lat[min(n - 1, int(n * f))] / 1000, 1) if n else None
print(json.dumps({"received": n, "p50_us": q(0.5), "p99_us": q(0.99), "max_us": q(1.0)}))
PY
cat > "$WORK/send.py" <<'PY'
import socket, sys, time
count, gap = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    s.sendto(str(time.time_ns()).encode(), ('20.0.0.1', 53))
    time.sleep(gap)
PY

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# A worker metric's value (the whole page is read: no SIGPIPE under pipefail).
metric() { { ip netns exec "$A" curl -s --max-time 5 "http://127.0.0.1:$ADMIN/metrics" || true; } | awk -v m="$1" '$1 ~ "^"m"[{]" && !seen {print $2; seen = 1}'; }

echo "{\"bench\":\"wake_latency\",\"date\":\"$(date -u +%FT%TZ)\",\"commit\":\"$(git rev-parse --short HEAD 2>/dev/null || echo none)\",\"secs\":$SECS,\"count\":$COUNT,\"gap_s\":$GAP,\"loadavg\":\"$(cut -d' ' -f1-3 /proc/loadavg)\",\"modes\":[" > "$WORK/out.json"
first=1
for mode in $MODES; do
  case $mode in
    interrupts) extra="" ;;
    sleep) extra=", rxInterrupts: false" ;;
    busy) extra=", busyPoll: true" ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  for ns in "$A" "$B"; do
    ip netns del "$ns" 2>/dev/null || true
    ip netns add "$ns"
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  done
  cat > "$WORK/c.yaml" <<YAML
dpdk: {lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: sl-wake-$$, mbufs: 2047, descriptors: 256$extra}
ports:
  - {name: front, device: "net_tap0,iface=slw0,mac=02:00:00:00:01:01", addresses: [10.1.0.1/24], kernelInterface: ""}
  - {name: back, device: "net_tap1,iface=slw1", addresses: [10.2.0.1/24], kernelInterface: ""}
admin: {listen: "127.0.0.1:$ADMIN"}
services:
  - name: dns
    endpoints:
      - {id: 0, address: 10.2.0.11, mac: "02:00:00:00:02:0b"}
routes:
  - {name: dns, service: dns, vips: [20.0.0.1], protocols: [UDP], destinationPorts: ["53"]}
YAML
  ip netns exec "$A" "$SLUICE" run --config "$WORK/c.yaml" > "$WORK/$mode.log" 2>&1 &
  SPID=$!
  for _ in $(seq 100); do [ -n "$(metric sluice_worker_idle_polls_total)" ] && break; sleep 0.1; done
  ip netns exec "$A" ip link set slw1 netns "$B"
  ip netns exec "$A" ip addr add 10.1.0.2/24 dev slw0
  ip netns exec "$A" ip route add 20.0.0.0/24 via 10.1.0.1
  ip netns exec "$A" ip neigh replace 10.1.0.1 lladdr 02:00:00:00:01:01 dev slw0 nud permanent
  ip netns exec "$B" ip link set slw1 address 02:00:00:00:02:0b
  ip netns exec "$B" ip link set slw1 up
  ip netns exec "$B" ip addr add 10.2.0.11/24 dev slw1
  ip netns exec "$B" ip addr add 20.0.0.1/32 dev lo
  ip netns exec "$B" sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.slw1.rp_filter=0
  sleep 1
  hz=$(getconf CLK_TCK)
  t0=$(cpu_ticks $SPID)
  sleep "$SECS"
  t1=$(cpu_ticks $SPID)
  cpu=$(echo "scale=2; 100 * ($t1 - $t0) / $hz / $SECS" | bc)
  rss=$(awk '/VmRSS/ {print $2}' /proc/$SPID/status)
  woken0=$(metric sluice_worker_interrupt_wakeups_total)
  ip netns exec "$B" python3 "$WORK/recv.py" > "$WORK/recv.out" &
  RPID=$!
  sleep 0.5
  ip netns exec "$A" python3 "$WORK/send.py" "$COUNT" "$GAP"
  wait $RPID
  woken=$(( $(metric sluice_worker_interrupt_wakeups_total) - woken0 ))
  armed=$(metric sluice_worker_rx_interrupts)
  kill -INT $SPID; wait $SPID || true; SPID=
  r=$(cat "$WORK/recv.out")
  echo "== $mode: idle CPU ${cpu}% of one core, RSS ${rss} KiB; rx_interrupts=$armed; $r; interrupt wake-ups $woken"
  [ $first = 1 ] || echo "," >> "$WORK/out.json"
  first=0
  echo "{\"mode\":\"$mode\",\"idle_cpu_pct\":$cpu,\"rss_kib\":$rss,\"rx_interrupts\":$armed,\"interrupt_wakeups\":$woken,\"one_way\":$r}" >> "$WORK/out.json"
done
echo "]}" >> "$WORK/out.json"
python3 - "$WORK/out.json" "$OUT" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
base = next((m for m in d["modes"] if m["mode"] == "busy"), None)
for m in d["modes"]:
    if base and base["one_way"]["p50_us"] and m["one_way"]["p50_us"]:
        m["p50_over_busy"] = round(m["one_way"]["p50_us"] / base["one_way"]["p50_us"], 2)
        print(f'{m["mode"]}: one-way p50 {m["one_way"]["p50_us"]} us = {m["p50_over_busy"]} x busy polling; idle CPU {m["idle_cpu_pct"]} %')
json.dump(d, open(sys.argv[2], "w"), indent=1)
print("wrote", sys.argv[2])
PY
