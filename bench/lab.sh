#!/usr/bin/env bash
# The memif loopback lab, in one command: two DPDK processes on this machine,
#
#   sluice gen (memif server: port A sends, ports A and B receive)
#     --net_memif A--> sluice run (memif client ports front/back, one VIP per
#                      family, N endpoints on back with static MACs)
#     --net_memif B--> back to sluice gen
#
# and every frame accounted for: what the generator sent = what it received
# + what the appliance counted as dropped (by reason, from its /metrics),
# each memif hop checked too (sent = received on the other side), printed as
# a table; exits non-zero when anything is unaccounted for.
#
#   bench/lab.sh             # full run: the appliance's maximum (a max-rate run,
#                            # then a ramp), loss and latency p50/p99/p99.9 at 50,
#                            # 80 and 95 % of it (round trip, from the generator, and
#                            # through the appliance's worker, from its /latency),
#                            # and the generator's Mpps per core
#                            # against dpdk-testpmd txonly on net_null; results in
#                            # bench/results/lab.json
#   SMOKE=1 bench/lab.sh     # CI: two short runs (paced, then max rate), asserts
#                            # the accounting only, never a rate or a latency
#   SECS=10 ENDPOINTS=8 FLOWS=10000 bench/lab.sh
#
# Env: SLUICE (binary, default target/release/sluice), SECS (seconds per
# measured run, 5), RAMP_SECS (2), ENDPOINTS (per family, 4), FLOWS (4096),
# PROTO (tcp-syn,tcp-data,udp), SIZES (64), FRAGMENTS (percent of UDP flows,
# 10), OUT (bench/results/lab.json), BUSY_POLL (the appliance's
# dpdk.busyPoll, default false), KEEP (keep the work directory).
#
# Needs root (DPDK), python3, curl, a release build (cargo build --release
# -p sluice) and, for the full run, dpdk-testpmd (Debian package dpdk).
# Both processes use --no-huge; the generator polls on core 1, the
# appliance's worker on core 0 (its control thread on core 1).
set -euo pipefail
cd "$(dirname "$0")/.."

SLUICE=${SLUICE:-target/release/sluice}
SECS=${SECS:-5}
RAMP_SECS=${RAMP_SECS:-2}
ENDPOINTS=${ENDPOINTS:-4}
FLOWS=${FLOWS:-4096}
PROTO=${PROTO:-tcp-syn,tcp-data,udp}
SIZES=${SIZES:-64}
FRAGMENTS=${FRAGMENTS:-10}
OUT=${OUT:-bench/results/lab.json}
BUSY_POLL=${BUSY_POLL:-false}   # the appliance's dpdk.busyPoll (false: its default idle back-off)
SMOKE=${SMOKE:-}

[ -x "$SLUICE" ] || { echo "$SLUICE not built (cargo build --release -p sluice)" >&2; exit 1; }
command -v curl >/dev/null || { echo "curl not found" >&2; exit 1; }

WORK=$(mktemp -d /tmp/sluice-lab-XXXXXX)
TAG="lab$$"
SPID=
GPID=
cleanup() {
  [ -n "$GPID" ] && kill -INT "$GPID" 2>/dev/null && wait "$GPID" 2>/dev/null
  [ -n "$SPID" ] && kill -INT "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  if [ -n "${KEEP:-}" ]; then echo "kept: $WORK" >&2; else rm -rf "$WORK"; fi
  rm -rf /var/run/dpdk/"$TAG"-*
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

FRONT_MAC=02:51:00:00:00:01
BACK_MAC=02:51:00:00:00:02
VIPS=20.0.0.1,fd00:20::1

# The appliance's configuration: memif clients of the generator's sockets.
write_config() { # yaml admin
  {
    echo "dpdk:"
    echo '  lcores: "0,1"'
    echo "  memoryMB: 1024"
    echo "  hugepages: false"
    echo "  filePrefix: $TAG-run"
    echo "  mbufs: 16383"
    echo "  descriptors: 1024"
    echo '  extraArgs: ["--main-lcore=1"]'
    echo "  busyPoll: $BUSY_POLL"
    echo "  latencyHistogram: true"
    echo "ports:"
    echo "  - name: front"
    echo "    device: net_memif0,role=client,socket=$WORK/front.sock,socket-abstract=no,mac=$FRONT_MAC"
    echo "    addresses: [10.100.0.1/24, fd00:100::1/64]"
    echo '    kernelInterface: ""'
    echo "  - name: back"
    echo "    device: net_memif1,role=client,socket=$WORK/back.sock,socket-abstract=no,mac=$BACK_MAC"
    echo "    addresses: [10.200.0.1/24, fd00:200::1/64]"
    echo '    kernelInterface: ""'
    echo "admin:"
    echo "  listen: $2"
    echo "services:"
    for fam in 4 6; do
      echo "  - name: lab$fam"
      echo "    endpoints:"
      for e in $(seq 0 $((ENDPOINTS - 1))); do
        if [ $fam = 4 ]; then a="10.200.0.$((10 + e))"; else a="fd00:200::$((10 + e))"; fi
        printf '      - {id: %d, address: "%s", mac: "02:ee:00:00:0%d:%02x"}\n' "$e" "$a" "$fam" "$e"
      done
    done
    echo "routes:"
    echo '  - {name: lab4, service: lab4, priority: 10, vips: ["20.0.0.1"], protocols: [TCP, UDP], destinationPorts: ["80", "443"]}'
    echo '  - {name: lab6, service: lab6, priority: 10, vips: ["fd00:20::1"], protocols: [TCP, UDP], destinationPorts: ["80", "443"]}'
  } >"$1"
}

# CPU seconds (user + system) of a process so far.
cpu_secs() { awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f\n", ($14 + $15) / hz }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# One run: gen at RATE for SECS seconds through a fresh appliance.
# Writes $WORK/NAME.gen.json, NAME.metrics, NAME.acct.json; prints the table.
lab_run() { # name rate secs
  local name=$1 rate=$2 secs=$3 admin yaml="$WORK/$1.yaml" glog="$WORK/$1.gen.log" slog="$WORK/$1.sluice.log"
  admin="127.0.0.1:$(free_port)"
  write_config "$yaml" "$admin"
  rm -f "$WORK/front.sock" "$WORK/back.sock"
  "$SLUICE" gen -q --json "$WORK/$name.gen.json" \
    --port "net_memif0,role=server,socket=$WORK/front.sock,socket-abstract=no" --port "net_memif1,role=server,socket=$WORK/back.sock,socket-abstract=no" \
    --dst-mac "$FRONT_MAC" --vips "$VIPS" --dports 80,443 --proto "$PROTO" --sizes "$SIZES" \
    --fragments "$FRAGMENTS" --flows "$FLOWS" --rate "$rate" --duration "$secs" --drain-ms 500 \
    --wait-link 60 --wait-ready "$admin" --lcores 0,1 --memory-mb 1024 --file-prefix "$TAG-gen" --mbufs 16383 \
    >"$glog" 2>&1 &
  GPID=$!
  for _ in $(seq 1 100); do [ -S "$WORK/front.sock" ] && [ -S "$WORK/back.sock" ] && break; sleep 0.1; done
  [ -S "$WORK/back.sock" ] || { cat "$glog" >&2; echo "the generator made no memif socket" >&2; return 1; }
  "$SLUICE" --log info run --config "$yaml" >"$slog" 2>&1 &
  SPID=$!
  # The generator starts once the appliance is ready; sample its CPU from then.
  local c0=0 t0 i
  for i in $(seq 1 600); do
    curl -sf --max-time 1 "http://$admin/readyz" >/dev/null 2>&1 && break
    kill -0 "$SPID" 2>/dev/null || { cat "$slog" >&2; echo "sluice run exited" >&2; SPID=; return 1; }
    sleep 0.1
  done
  c0=$(cpu_secs "$SPID"); t0=$(date +%s.%N)
  if ! wait "$GPID"; then GPID=; cat "$glog" >&2; echo "sluice gen failed" >&2; return 1; fi
  GPID=
  local c1 t1
  c1=$(cpu_secs "$SPID"); t1=$(date +%s.%N)
  curl -sf --max-time 5 "http://$admin/metrics" >"$WORK/$name.metrics"
  curl -sf --max-time 5 "http://$admin/latency" >"$WORK/$name.latency.json"
  kill -INT "$SPID"
  wait "$SPID" || { cat "$slog" >&2; echo "sluice run failed at shutdown" >&2; SPID=; return 1; }
  SPID=
  grep -q 'mbufs_in_use=0' "$slog" || { cat "$slog" >&2; echo "the appliance did not get every mbuf back" >&2; return 1; }
  python3 - "$WORK/$name.gen.json" "$WORK/$name.metrics" "$name" "$rate" "$c0" "$c1" "$t0" "$t1" "$WORK/$name.latency.json" >"$WORK/$name.acct.json" <<'PY'
import json, re, sys
gen = json.load(open(sys.argv[1]))
name, rate = sys.argv[3], sys.argv[4]
c0, c1, t0, t1 = map(float, sys.argv[5:9])
worker_lat = json.load(open(sys.argv[9]))["all"]
m = {}
for line in open(sys.argv[2]):
    if line.startswith("#"):
        continue
    mm = re.match(r'^(\w+)(?:\{(.*)\})?\s+(\S+)$', line.strip())
    if not mm:
        continue
    labels = dict(re.findall(r'(\w+)="([^"]*)"', mm.group(2) or ""))
    m.setdefault(mm.group(1), []).append((labels, float(mm.group(3))))
def total(metric, **want):
    return int(sum(v for l, v in m.get(metric, []) if all(l.get(k) == x for k, x in want.items())))
drops = {}
for l, v in m.get("sluice_drops_total", []):
    if v:
        drops[l["reason"]] = drops.get(l["reason"], 0) + int(v)
a = {
    "front_rx": total("sluice_port_rx_packets_total", port="front", side="port"),
    "front_rx_missed": total("sluice_port_rx_missed_total", port="front", side="port"),
    "front_rx_nombuf": total("sluice_port_rx_nombuf_total", port="front", side="port"),
    "tx_back": total("sluice_port_tx_packets_total", port="back", side="port"),
    "tx_front": total("sluice_port_tx_packets_total", port="front", side="port"),
    "worker_rx": total("sluice_worker_rx_packets_total"),
    "worker_tx": total("sluice_worker_tx_packets_total"),
    "held_fragments": total("sluice_worker_held_fragments_total"),
}
gport = {p["device"]: p for p in gen["ports"]}
sent, received = gen["sent"], gen["received"]
dropped = sum(drops.values())
below = a["front_rx_missed"] + a["front_rx_nombuf"]
unaccounted = sent - received - dropped - below
# DPDK 22.11's net_memif reports zero port counters in the client role
# (the appliance's side here), so each hop is checked with the appliance's
# worker counters: what its workers received from and sent to the ports.
hop_in = sent - a["worker_rx"] - below           # memif A: generator -> appliance
gen_rx_all = gport["net_memif1"]["rx_packets"] + gport["net_memif0"]["rx_packets"]
hop_out = a["worker_tx"] - gen_rx_all             # memif B (and A back): appliance -> generator
rows = [
    ("generator sent (memif A)", sent),
    ("appliance workers received", a["worker_rx"]),
    ("appliance lost below DPDK (missed, no mbuf)", below),
] + [(f"appliance dropped: {r}", n) for r, n in sorted(drops.items())] + [
    ("appliance workers sent", a["worker_tx"]),
    ("generator ports received (DPDK)", gen_rx_all),
    ("generator received (stamped)", gen["received"]),
    ("generator received, not its frames", gen["unstamped_received"]),
    ("sent - received - dropped - lost below DPDK", unaccounted),
    ("memif A: generator sent - appliance received", hop_in),
    ("memif B: appliance sent - generator ports received", hop_out),
]
w = max(len(r[0]) for r in rows)
print(f"-- {name}: rate {rate}, {gen['seconds']:.2f} s, offered {gen['offered_pps']/1e6:.3f} Mpps, "
      f"delivered {gen['delivered_pps']/1e6:.3f} Mpps", file=sys.stderr)
for label, n in rows:
    print(f"   {label:<{w}}  {n:>14}", file=sys.stderr)
lat = gen.get("latency_us") or {}
cpu = (c1 - c0) / (t1 - t0) * 100 if t1 > t0 else 0.0
run = {
    "system": "sluice", "mode": name, "port": "net_memif",
    "offered_pps": round(gen["offered_pps"]), "delivered_pps": round(gen["delivered_pps"]),
    "lost": gen["lost"], "loss_ratio": gen["loss_ratio"],
    "latency_us": {k: lat.get(k) for k in ("p50", "p99", "p999")},
    "worker_latency_us": {k: worker_lat.get(k) for k in ("p50", "p99", "p999", "max", "packets")},
    "worker_latency_note": "appliance /latency: from a burst's arrival at the worker to its poll round's last transmit (no ring wait, no memif transfer)",
    "cpu_pct": round(cpu, 1), "cpu_note": "appliance process (worker + control), from readiness to the generator's exit",
    "target_pps": gen["target_pps"], "sent": sent, "received": received, "reordered": gen["reordered"],
    "duplicates": gen["duplicates"], "tx_full": gen["tx_full"], "late_skipped": gen["late_skipped"],
    "appliance_drops": drops, "appliance": a, "unaccounted": unaccounted, "memif_a_diff": hop_in, "memif_b_diff": hop_out,
    "endpoints": gen["endpoints"], "flows": gen["flows"], "mean_frame_bytes": gen["mean_frame_bytes"],
}
print(json.dumps(run))
bad = [k for k, v in (("unaccounted", unaccounted), ("memif A", hop_in), ("memif B", hop_out)) if v != 0]
if gen_rx_all != received + gen["unstamped_received"]:
    bad.append("generator ports received != generator counted")
if worker_lat.get("packets") != a["worker_rx"]:
    bad.append(f"worker latency histogram counted {worker_lat.get('packets')} packets, the workers received {a['worker_rx']}")
if gen["duplicates"] or gen["unknown_flow"]:
    bad.append("duplicate or unknown frames")
if bad:
    print(f"   NOT ACCOUNTED FOR: {', '.join(bad)}", file=sys.stderr)
    sys.exit(1)
print("   every frame accounted for", file=sys.stderr)
PY
  cat "$WORK/$name.acct.json"
}

field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

machine_json() {
  python3 - "$(lscpu | sed -n 's/^Model name: *//p' | head -1)" "$(nproc)" "$(uname -r)" \
    "$(pkg-config --modversion libdpdk 2>/dev/null || echo unknown)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" <<'PY'
import json, sys
import datetime
k = ["cpu_model", "cores", "kernel", "dpdk", "git_rev", "loadavg"]
d = dict(zip(k, sys.argv[1:]))
d["cores"] = int(d["cores"])
d["loadavg"] = d["loadavg"].split()
d["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps(d))
PY
}

runs=()
if [ -n "$SMOKE" ]; then
  echo "lab smoke: accounting only (gen -> sluice run -> gen over net_memif)"
  lab_run smoke-paced 50k 1 >/dev/null
  lab_run smoke-max max 1 >/dev/null
  echo "lab smoke: every frame accounted for"
  exit 0
fi

MACHINE=$(machine_json)
echo "lab: $ENDPOINTS endpoints per family, $FLOWS flows ($PROTO, sizes $SIZES, $FRAGMENTS% of UDP flows fragmented); load $(cut -d' ' -f1-3 /proc/loadavg)"

# 1. The appliance's maximum: a max-rate run (the generator is held back by
#    the memif ring, so it offers what the appliance takes), then a ramp of
#    paced runs below it; the maximum is the highest delivered rate among
#    runs that lost under 0.1 %.
lab_run max max "$SECS" >"$WORK/max.run"
runs+=("$(cat "$WORK/max.run")")
m0=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read())["delivered_pps"])' "$WORK/max.run")
best=0
for pct in 60 70 80 90 100; do
  r=$(( m0 * pct / 100 ))
  lab_run "ramp-$pct" "$r" "$RAMP_SECS" >"$WORK/ramp-$pct.run"
  runs+=("$(cat "$WORK/ramp-$pct.run")")
  best=$(python3 -c 'import json,sys; d=json.loads(open(sys.argv[1]).read()); b=int(sys.argv[2]); print(max(b, d["delivered_pps"]) if d["loss_ratio"] < 0.001 else b)' "$WORK/ramp-$pct.run" "$best")
done
[ "$best" -gt 0 ] || best=$(( m0 * 60 / 100 ))
echo "lab: appliance maximum (loss < 0.1 %): $best pps (max-rate run delivered $m0)"

# 2. Loss and latency at 50, 80 and 95 % of the maximum.
for pct in 50 80 95; do
  lab_run "load-$pct" $(( best * pct / 100 )) "$SECS" >"$WORK/load-$pct.run"
  runs+=("$(cat "$WORK/load-$pct.run")")
  python3 - "$WORK/load-$pct.run" "$pct" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
l = d["latency_us"]
print(f"lab: {sys.argv[2]}% load: offered {d['offered_pps']} pps, lost {d['lost']} ({d['loss_ratio'] * 100:.3f} %), "
      f"p50 {l['p50']} us, p99 {l['p99']} us, p99.9 {l['p999']} us")
PY
done

# 3. Generator Mpps per core against dpdk-testpmd txonly, same port kind
#    (net_null, which swallows), one sending core each, 64-byte frames.
if command -v dpdk-testpmd >/dev/null; then
  read -r gpps tpps < <(SLUICE="$SLUICE" SECS="$SECS" ROUNDS=1 RAW=1 bench/gen_vs_txonly.sh)
  ratio=$(python3 -c "import sys; g,t=float(sys.argv[1]),float(sys.argv[2]); print(f'{g/t:.3f}' if t else 'null')" "$gpps" "$tpps")
  echo "lab: generator on net_null: sluice gen $(python3 -c "print(f'{$gpps/1e6:.3f}')") Mpps/core, testpmd txonly $(python3 -c "print(f'{$tpps/1e6:.3f}')") Mpps/core, ratio $ratio"
  runs+=("$(printf '{"system":"sluice-gen","mode":"txonly","port":"net_null","offered_pps":%d,"delivered_pps":%d,"lost":0,"latency_us":null,"cpu_pct":100,"mpps_per_core":%.4f,"frame_bytes":64}' "${gpps%.*}" "${gpps%.*}" "$(python3 -c "print($gpps/1e6)")")")
  runs+=("$(printf '{"system":"testpmd","mode":"txonly","port":"net_null","offered_pps":%d,"delivered_pps":%d,"lost":0,"latency_us":null,"cpu_pct":100,"mpps_per_core":%.4f,"frame_bytes":64,"gen_over_testpmd":%s}' "$tpps" "$tpps" "$(python3 -c "print($tpps/1e6)")" "$ratio")")
else
  echo "lab: dpdk-testpmd not found: generator vs testpmd left out" >&2
fi

mkdir -p "$(dirname "$OUT")"
{
  printf '{"bench":"lab","command":"%s","date":"%s","machine":%s,"settings":{"busy_poll":%s,"secs":%s,"ramp_secs":%s,"endpoints_per_family":%s,"flows":%s,"proto":"%s","sizes":"%s","fragments_pct":%s},"maximum_pps":%s,"runs":[' \
    "SECS=$SECS RAMP_SECS=$RAMP_SECS ENDPOINTS=$ENDPOINTS FLOWS=$FLOWS PROTO=$PROTO SIZES=$SIZES FRAGMENTS=$FRAGMENTS BUSY_POLL=$BUSY_POLL bench/lab.sh" \
    "$(date -u +%FT%TZ)" "$MACHINE" "$BUSY_POLL" "$SECS" "$RAMP_SECS" "$ENDPOINTS" "$FLOWS" "$PROTO" "$SIZES" "$FRAGMENTS" "$best"
  (IFS=,; echo -n "${runs[*]}")
  echo ']}'
} >"$OUT.tmp"
python3 -m json.tool "$OUT.tmp" >"$OUT"
rm -f "$OUT.tmp"
echo "written: $OUT"
