#!/usr/bin/env bash
# The whole load balancer against DPDK's ceiling, in one run: for each case,
# `dpdk-testpmd --forward-mode=io` (the ceiling) and `sluice run` (the real
# appliance: its worker loop, snapshot, counters and flow tables) on the same
# virtual devices, the same lcores and EAL arguments, alternating round by
# round. The front port replays a generated pcap forever
# (net_pcap0,rx_pcap=FILE,infinite_rx=1), the back port swallows
# (net_null1,no-rx=1); one forwarding lcore each, or WORKERS of them (each
# front queue replaying the same file: net_pcap gives one receive queue per
# rx_pcap), with testpmd on as many forwarding lcores and queues.
#
# Cases (bench/gen_pipeline_case.py): 1 route; 100 routes (10 VIPs x 10
# ports, 100 services); 10,000 routes (500 VIPs x 20 ports) over 1,000
# services x 25 endpoints with 100,000 flows (r10000) or 1,000,000 flows
# (r10000x1m, not in the default set: its pcap takes a minute to make and
# 3.3 GB of mbufs); each IPv4 and IPv6, maglev and random. The frames are
# TCP SYNs: with per-flow state (the default) each packet is a new
# connection, taking the service's choice again. A case name ending in -ack
# (e.g. r10000-v4-random-ack, not in the default set) sends ACKs instead:
# established connections, each following its pin once the pcap has been
# through once. Prints Mpps (per
# core with one worker) and the ratio sluice/testpmd (of the medians)
# for each, and writes them as JSON under bench/results/.
#
# What bounds the ratio is measured in the same rounds: testpmd's own
# forwarding modes that touch each packet (REFS, default "mac 5tswap": `mac`
# writes the two Ethernet addresses, the least any forwarder that is not a
# wire does; `5tswap` parses L2-L4 and swaps the addresses and ports) on the
# same ports, with their ratio to io and sluice's ratio to them.
#
#   bench/pipeline_vs_testpmd.sh                  # every case, 3 rounds of 4 s
#   ROUNDS=5 SECS=10 bench/pipeline_vs_testpmd.sh
#   CASES="r1-v4-maglev r10000-v6-random" bench/pipeline_vs_testpmd.sh
#   CASES="r10000-v4-maglev-ack r10000-v4-random-ack" bench/pipeline_vs_testpmd.sh
#   SMOKE=1 bench/pipeline_vs_testpmd.sh          # CI: two small cases, 1 s,
#                                                 # checks that both forward, never the rates
#   SLUICE_BASE=/tmp/sluice-before bench/pipeline_vs_testpmd.sh
#                                                 # also another build, same rounds: after/before
#   STATELESS_BASE=1 bench/pipeline_vs_testpmd.sh # also the same build with defaults.flowTable:
#                                                 # false, same rounds: with flow state/without
#   REFS= bench/pipeline_vs_testpmd.sh            # testpmd io only (no reference modes)
#   WORKERS=2 bench/pipeline_vs_testpmd.sh        # two workers against testpmd with two
#                                                 # forwarding lcores; LCORES defaults to
#                                                 # 0@0,1@0,2@1 then (EAL --lcores: the main
#                                                 # lcore and the first worker share CPU 0)
#
# Needs root (DPDK), dpdk-testpmd (Debian package dpdk), python3, curl and a
# release build (cargo build --release -p sluice).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
SECS=${SECS:-4}
WARM=${WARM:-1}
WORKERS=${WORKERS:-1}
if [ "$WORKERS" = 1 ]; then LCORES=${LCORES:-0,1}; else LCORES=${LCORES:-0@0,1@0,2@1}; fi
# EAL takes lcores placed on CPUs (lcore@cpu) as --lcores, a plain list as -l.
case "$LCORES" in *@*) LFLAG=--lcores ;; *) LFLAG=-l ;; esac
SLUICE=${SLUICE:-target/release/sluice}
SLUICE_WORKER=${SLUICE_WORKER:-}   # body of the config's worker: mapping, e.g. 'busyPoll: true'
ALL="r1-v4-maglev r1-v6-maglev r100-v4-maglev r100-v6-maglev r10000-v4-maglev r10000-v6-maglev
     r1-v4-random r1-v6-random r100-v4-random r100-v6-random r10000-v4-random r10000-v6-random"
if [ -n "${SMOKE:-}" ]; then
  CASES=${CASES:-"r1-v4-maglev r100-v6-random"}; ROUNDS=1; SECS=1; WARM=1; REFS=${REFS-}
fi
REFS=${REFS-mac 5tswap}
CASES=${CASES:-$ALL}
OUT=${OUT:-bench/results/pipeline_vs_testpmd-$(date -u +%Y%m%dT%H%M%SZ).json}
SMOKE_TMP=
if [ -n "${SMOKE:-}" ] && [ -z "${SMOKE_OUT:-}" ]; then SMOKE_TMP=$(mktemp /tmp/sluice-smoke-XXXXXX.json); OUT=$SMOKE_TMP; fi
[ -n "${SMOKE_OUT:-}" ] && OUT=$SMOKE_OUT

command -v dpdk-testpmd >/dev/null || { echo "dpdk-testpmd not found (apt-get install dpdk)" >&2; exit 1; }
[ -x "$SLUICE" ] || { echo "$SLUICE not built (cargo build --release -p sluice)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sluice-pvt-XXXXXX)
SPID=
cleanup() {
  [ -n "$SPID" ] && kill -INT "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  rm -rf "$WORK" /var/run/dpdk/pvt-sl-$$ /var/run/dpdk/pvt-tp-$$ ${SMOKE_TMP:+"$SMOKE_TMP"}
}
trap cleanup EXIT

# A TCP port on loopback that was free a moment ago (for the admin endpoint).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# case name -> generator arguments
case_args() {
  local r fam alg tcp
  IFS=- read -r r fam alg tcp <<<"$1"
  case "${tcp:-syn}" in syn | ack) ;; *) echo "unknown case $1 (the last part is syn or ack)" >&2; return 1 ;; esac
  case "$r" in
    r1) echo "--routes 1 --per-vip 1 --services 1 --flows 4096" ;;
    r100) echo "--routes 100 --per-vip 10 --services 100 --flows 4096" ;;
    r10000) echo "--routes 10000 --per-vip 20 --services 1000 --flows 100000" ;;
    r10000x1m) echo "--routes 10000 --per-vip 20 --services 1000 --flows 1000000" ;;
    *) echo "unknown case $1" >&2; return 1 ;;
  esac | sed "s/\$/ --endpoints 25 --family ${fam#v} --algorithm $alg --tcp ${tcp:-syn}/"
}

# The EAL arguments sluice derives from a configuration, for testpmd.
eal_of() {
  local mem mbufs
  mem=$(awk '/memoryMB:/ {print $2}' "$1"); mbufs=$(awk '/mbufs:/ {print $2}' "$1")
  local rx i
  rx=$(for i in $(seq 1 "$WORKERS"); do printf 'rx_pcap=%s,' "$2"; done)
  echo "$LFLAG $LCORES -m $mem --no-huge --no-telemetry --no-pci --vdev=net_pcap0,${rx}infinite_rx=1 --vdev=net_null1,no-rx=1 MBUFS=$mbufs"
}

testpmd_mpps() { # yaml pcap prefix [forward mode, default io]
  local eal mbufs fifo="$WORK/tp.in" log="$WORK/tp.log" i
  eal=$(eal_of "$1" "$2"); mbufs=${eal##*MBUFS=}; eal=${eal% MBUFS=*}
  rm -f "$fifo"; mkfifo "$fifo"
  # shellcheck disable=SC2086
  dpdk-testpmd $eal --file-prefix="$3" -- -i --forward-mode="${4:-io}" --auto-start \
    --nb-cores="$WORKERS" --rxq="$WORKERS" --txq="$WORKERS" --burst=32 --rxd=1024 --txd=1024 --mbcache=256 --total-num-mbufs="$mbufs" <"$fifo" >"$log" 2>&1 &
  local tp=$!
  exec 7>"$fifo"
  # Sample only once it forwards (loading a large pcap takes a while).
  for i in $(seq 1 600); do
    grep -q "testpmd>" "$log" && break
    kill -0 "$tp" 2>/dev/null || break
    sleep 0.1
  done
  sleep "$WARM"; echo "show port stats all" >&7; sleep "$SECS"; echo "show port stats all" >&7; sleep 0.3
  echo "stop" >&7; echo "quit" >&7; exec 7>&-
  wait "$tp" || true
  awk '/Tx-pps:/ { v[n++] = $2 } END { if (n < 4) exit 1; printf "%.3f\n", (v[n-1] + v[n-2]) / 1e6 }' "$log" ||
    { tail -20 "$log" >&2; echo "testpmd gave no rates" >&2; return 1; }
}

# Sum of a worker counter over workers, from /metrics.
metric() { { curl -sf --max-time 2 "http://$1/metrics" || true; } | awk -v m="^sluice_worker_$2_total" '$0 ~ m { s += $2 } END { printf "%d\n", s }'; }

# Mpps `sluice run` sends over SECS seconds after WARM; also checks that it
# dropped nothing, returned every mbuf and logged the MAC the pcap uses.
sluice_mpps() { # yaml admin [binary]
  local log="$WORK/sluice.log" t0 t1 c0 c1 i
  "${3:-$SLUICE}" --log info run --config "$1" >"$log" 2>&1 &
  SPID=$!
  for i in $(seq 1 300); do
    [ "$(metric "$2" tx_packets 2>/dev/null)" -gt 0 ] && break
    kill -0 "$SPID" 2>/dev/null || { cat "$log" >&2; echo "sluice run exited" >&2; SPID=; return 1; }
    sleep 0.1
  done
  sleep "$WARM"
  t0=$(date +%s.%N); c0=$(metric "$2" tx_packets)
  sleep "$SECS"
  t1=$(date +%s.%N); c1=$(metric "$2" tx_packets)
  local rx bal drops
  rx=$(metric "$2" rx_packets); bal=$(metric "$2" balanced_packets)
  # With more than one worker, a worker hands the packets of flows another
  # owns to that one (dataplane/src/steer.rs); each front queue replays every
  # flow, so half of them go across, and at this overload the owner's queue
  # overflows: those drops are counted under steer_queue_full, reported here
  # (share of received) and written to the JSON. Any other drop fails.
  drops=$(curl -sf "http://$2/metrics" | awk '/^sluice_drops_total/ && !/reason="steer_queue_full"/ { s += $2 } END { printf "%d\n", s }')
  steer=$(curl -sf "http://$2/metrics" | awk '/^sluice_drops_total/ && /reason="steer_queue_full"/ { s += $2 } END { printf "%d\n", s }')
  if [ "$WORKERS" = 1 ]; then drops=$((drops + steer)); fi
  kill -INT "$SPID"; wait "$SPID" || { cat "$log" >&2; echo "sluice run failed at shutdown" >&2; SPID=; return 1; }
  SPID=
  grep -q 'mbufs_in_use=0' "$log" || { cat "$log" >&2; echo "mbufs not returned" >&2; return 1; }
  grep -q 'port=front.*mac=02:70:63:61:70:00' "$log" || { cat "$log" >&2; echo "net_pcap MAC is not the generator's" >&2; return 1; }
  [ "$drops" -eq 0 ] || { echo "sluice dropped $drops packets (rx $rx, balanced $bal)" >&2; return 1; }
  if [ "$WORKERS" != 1 ]; then
    echo "$steer $rx" | awk '{ printf "%.4f\n", $2 ? $1 / $2 : 0 }' >>"$WORK/steer${3:+-base}"
    echo "  (sluice: $steer of $rx received dropped at a full steering queue)" >&2
  fi
  echo "$c0 $c1 $t0 $t1" | awk '{ printf "%.3f\n", ($2 - $1) / ($4 - $3) / 1e6 }'
}

median() { sort -g | awk '{ a[n++] = $1 } END { print (n % 2) ? a[int(n/2)] : (a[n/2-1] + a[n/2]) / 2 }'; }

echo "pipeline vs testpmd: $WORKERS worker(s), lcores $LCORES, $ROUNDS round(s) of ${SECS}s after ${WARM}s warm-up; load: $(cut -d' ' -f1-3 /proc/loadavg)"
json_cases=()
for c in $CASES; do
  args=$(case_args "$c")
  admin="127.0.0.1:$(free_port)"
  # shellcheck disable=SC2086
  python3 bench/gen_pipeline_case.py $args --out "$WORK/$c" --prefix "pvt-sl-$$" --admin "$admin" \
    --lcores "$LCORES" --queues "$WORKERS" ${SLUICE_WORKER:+--worker "$SLUICE_WORKER"} >/dev/null
  base_yaml="$WORK/$c.yaml"
  if [ -n "${STATELESS_BASE:-}" ]; then
    # shellcheck disable=SC2086
    python3 bench/gen_pipeline_case.py $args --out "$WORK/$c-stateless" --prefix "pvt-sl-$$" --admin "$admin" \
      --lcores "$LCORES" --queues "$WORKERS" ${SLUICE_WORKER:+--worker "$SLUICE_WORKER"} --stateless >/dev/null
    base_yaml="$WORK/$c-stateless.yaml"
  fi
  tp=(); sl=(); bs=(); declare -A rf=()
  rm -f "$WORK/steer" "$WORK/steer-base"
  for r in $(seq 1 "$ROUNDS"); do
    t=$(testpmd_mpps "$WORK/$c.yaml" "$WORK/$c.pcap" "pvt-tp-$$")
    s=$(sluice_mpps "$WORK/$c.yaml" "$admin")
    tp+=("$t"); sl+=("$s")
    printf '%-18s round %d: testpmd io %7.3f Mpps   sluice run %7.3f Mpps   ratio %.3f' "$c" "$r" "$t" "$s" "$(echo "$s / $t" | bc -l)"
    for m in $REFS; do
      x=$(testpmd_mpps "$WORK/$c.yaml" "$WORK/$c.pcap" "pvt-tp-$$" "$m"); rf[$m]+="$x "
      printf '   testpmd %s %7.3f' "$m" "$x"
    done
    if [ -n "${SLUICE_BASE:-}${STATELESS_BASE:-}" ]; then
      b=$(sluice_mpps "$base_yaml" "$admin" "${SLUICE_BASE:-$SLUICE}"); bs+=("$b")
      printf '   base %7.3f Mpps   ratio %.3f' "$b" "$(echo "$b / $t" | bc -l)"
    fi
    echo
  done
  mt=$(printf '%s\n' "${tp[@]}" | median); ms=$(printf '%s\n' "${sl[@]}" | median)
  ratio=$(echo "$ms / $mt" | bc -l)
  printf '%-18s median: testpmd io %7.3f Mpps   sluice run %7.3f Mpps   ratio %.3f' "$c" "$mt" "$ms" "$ratio"
  base_json=
  if [ -n "${SLUICE_BASE:-}${STATELESS_BASE:-}" ]; then
    mb=$(printf '%s\n' "${bs[@]}" | median)
    printf '   base %7.3f (ratio %.3f)   sluice/base %.3f' "$mb" "$(echo "$mb / $mt" | bc -l)" "$(echo "$ms / $mb" | bc -l)"
    base_json=$(printf ',"base_mpps":[%s],"base_median":%s,"base_ratio":%.4f' "$(IFS=,; echo "${bs[*]}")" "$mb" "$(echo "$mb / $mt" | bc -l)")
  fi
  refs_json=()
  for m in $REFS; do
    # shellcheck disable=SC2086
    mr=$(printf '%s\n' ${rf[$m]} | median)
    printf '\n%-18s median: testpmd %-6s %7.3f Mpps   of io %.3f   sluice/%s %.3f' "$c" "$m" "$mr" "$(echo "$mr / $mt" | bc -l)" "$m" "$(echo "$ms / $mr" | bc -l)"
    # shellcheck disable=SC2086
    refs_json+=("$(printf '"%s":{"mpps":[%s],"median":%s,"of_io":%.4f,"sluice_ratio":%.4f}' "$m" "$(echo ${rf[$m]} | tr ' ' ,)" "$mr" "$(echo "$mr / $mt" | bc -l)" "$(echo "$ms / $mr" | bc -l)")")
  done
  [ ${#refs_json[@]} -gt 0 ] && base_json+=$(IFS=,; printf ',"testpmd_refs":{%s}' "${refs_json[*]}")
  [ -s "$WORK/steer" ] && base_json+=$(printf ',"steer_dropped_share":[%s]' "$(paste -sd, "$WORK/steer")")
  [ -s "$WORK/steer-base" ] && base_json+=$(printf ',"base_steer_dropped_share":[%s]' "$(paste -sd, "$WORK/steer-base")")
  echo
  json_cases+=("$(printf '{"case":"%s","args":"%s","testpmd_mpps":[%s],"sluice_mpps":[%s],"testpmd_median":%s,"sluice_median":%s,"ratio":%.4f%s}' \
    "$c" "$args" "$(IFS=,; echo "${tp[*]}")" "$(IFS=,; echo "${sl[*]}")" "$mt" "$ms" "$ratio" "$base_json")")
done
mkdir -p "$(dirname "$OUT")"
{
  printf '{"bench":"pipeline_vs_testpmd","date":"%s","commit":"%s","workers":%s,"lcores":"%s","rounds":%s,"secs":%s,"warm":%s,"loadavg":"%s","cases":[' \
    "$(date -u +%FT%TZ)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$WORKERS" "$LCORES" "$ROUNDS" "$SECS" "$WARM" "$(cut -d' ' -f1-3 /proc/loadavg)"
  (IFS=,; echo -n "${json_cases[*]}")
  echo ']}'
} >"$OUT"
python3 -m json.tool "$OUT" >/dev/null
echo "written: $OUT"
