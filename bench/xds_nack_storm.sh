#!/usr/bin/env bash
# What a bad xDS snapshot held by the server costs the appliance.
#
# `sluice-xds-server --resend-nacked` answers a state-of-the-world NACK as
# go-control-plane v0.11 does: with the refused version again at once. A
# `sluice run` (net_null ports, no namespaces, SotW, or delta with MODE=delta)
# follows it. The appliance's CPU time (utime + stime of the whole process,
# /proc/PID/stat) is read over SECS seconds with a good snapshot served (the
# baseline, same run), then over SECS seconds with a bad one (a cluster with
# an invalid VIP, and one on another's VIP, port and protocol); printed in %
# of one core, with the NACKs the server received and the log lines the
# appliance wrote in each window.
#
#   bench/xds_nack_storm.sh                # SECS=10, MODE=sotw
#   SECS=30 MODE=delta bench/xds_nack_storm.sh
#
# Needs root (DPDK), curl, bc, python3 and a release build (made here).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${SECS:-10}
MODE=${MODE:-sotw}
cargo build --release -q -p sluice -p sluice-tests --bins
SLUICE=$PWD/target/release/sluice
SERVER=$PWD/target/release/sluice-xds-server
WORK=$(mktemp -d /tmp/sluice-nack-storm-XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
XDS=$(free_port); ADMIN=$(free_port)
SPID=; APID=
cleanup() {
  [ -n "$APID" ] && kill -INT "$APID" 2>/dev/null && wait "$APID" 2>/dev/null
  [ -n "$SPID" ] && kill -TERM "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null
  rm -rf "$WORK" /var/run/dpdk/nack$$
}
trap cleanup EXIT

# resources VERSION BAD: the good state, or it with the bad clusters.
resources() {
  python3 - "$1" "$2" >"$WORK/resources.tmp" <<'PY'
import json, sys
version, bad = sys.argv[1], sys.argv[2] == "1"
def cluster(name, vip):
    return {"name": name, "type": "EDS", "lb_policy": "MAGLEV", "eds_cluster_config": {"service_name": name},
            "metadata": {"filter_metadata": {"io.cilium.l4lb": {"vip": vip, "port": 80, "protocol": "TCP", "delivery": "ipip"}}}}
def cla(name, n, base):
    eps = [{"endpoint": {"address": {"socket_address": {"address": f"10.{base}.{i // 200}.{i % 200 + 1}", "port_value": 80}}}} for i in range(n)]
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": eps}]}
clusters = [cluster(f"svc{i}", f"20.0.{i // 200}.{i % 200 + 1}") for i in range(50)]
clas = [cla(f"svc{i}", 8, 50 + i % 100) for i in range(50)]
if bad:
    clusters.append(cluster("svc0-two", "20.0.0.1"))
    clas.append(cla("svc0-two", 2, 49))
    clusters.append(cluster("wrong", "20.0.9.0/24"))
print(json.dumps({"version": version, "clusters": clusters, "assignments": clas}))
PY
  mv "$WORK/resources.tmp" "$WORK/resources.json"
}

status() { curl -sf --max-time 2 "http://127.0.0.1:$ADMIN/status" | python3 -c "import json,sys; x=json.load(sys.stdin)['xds']; print(x['$1'])"; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

resources good 0
"$SERVER" --listen "127.0.0.1:$XDS" --file "$WORK/resources.json" --resend-nacked >"$WORK/server.log" 2>&1 &
SPID=$!
cat >"$WORK/sluice.yaml" <<YAML
dpdk: {lcores: "0,1", memoryMB: 256, hugepages: false, filePrefix: nack$$, mbufs: 2047, descriptors: 256}
ports:
  - {name: a, device: net_null0, addresses: [10.1.0.1/24], kernelInterface: ""}
  - {name: b, device: net_null1, addresses: [10.2.0.1/24], kernelInterface: ""}
gateways:
  - {address: 10.1.0.254, port: a, mac: "02:00:00:00:01:fe"}
admin: {listen: "127.0.0.1:$ADMIN"}
xds-control-plane:
  enabled: true
  server-address: "127.0.0.1:$XDS"
  node-id: bench
  mode: $MODE
YAML
"$SLUICE" --log info run --config "$WORK/sluice.yaml" >"$WORK/sluice.log" 2>&1 &
APID=$!
for _ in $(seq 1 150); do
  [ "$(status services 2>/dev/null || true)" = 50 ] && break
  sleep 0.2
done
[ "$(status services)" = 50 ] || { cat "$WORK/sluice.log" >&2; echo "the appliance did not take the good state" >&2; exit 1; }
sleep 2
hz=$(getconf CLK_TCK)

# window LABEL: CPU, NACKs and log lines over SECS seconds.
window() {
  local n0 l0 p0 s0 p1 s1
  n0=$(status nacks); l0=$(wc -l <"$WORK/sluice.log")
  declare -A t0=()
  for t in /proc/"$APID"/task/*; do t0[$t]=$(awk '{ print $14 + $15 }' "$t/stat"); done
  p0=$(ticks "$APID"); s0=$(date +%s.%N)
  sleep "$SECS"
  p1=$(ticks "$APID"); s1=$(date +%s.%N)
  for t in /proc/"$APID"/task/*; do
    [ -n "${t0[$t]:-}" ] || continue
    d=$(( $(awk '{ print $14 + $15 }' "$t/stat") - ${t0[$t]} ))
    printf '    thread %-16s %6.2f %%\n' "$(cat "$t/comm")" "$(echo "$d / $hz / ($s1 - $s0) * 100" | bc -l)"
  done
  printf '%-28s CPU %5.2f %% of one core over %.1f s; NACKs %d; log lines %d\n' "$1" \
    "$(echo "($p1 - $p0) / $hz / ($s1 - $s0) * 100" | bc -l)" "$(echo "$s1 - $s0" | bc -l)" \
    "$(( $(status nacks) - n0 ))" "$(( $(wc -l <"$WORK/sluice.log") - l0 ))"
}

echo "== $MODE, load $(cut -d' ' -f1-3 /proc/loadavg)"
window "good snapshot (baseline)"
resources bad 1
for _ in $(seq 1 50); do
  [ "$(status nacks)" -gt 0 ] && break
  sleep 0.2
done
[ "$(status nacks)" -gt 0 ] || { echo "no NACK of the bad snapshot" >&2; exit 1; }
window "bad snapshot held"
echo "repeated NACKs counted: $(status types | tr -d '\n')" | head -c 600; echo
