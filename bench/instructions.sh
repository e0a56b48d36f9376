#!/usr/bin/env bash
# Instructions per packet of each pipeline stage, counted by callgrind
# (valgrind): repeatable whatever else the machine does. Each figure is the
# difference between runs of 300k and 100k packets, divided by 200k, so
# set-up cost cancels out; "refresh" (copying the frame back in) is part of
# "rewrite" and "process".
#   bench/instructions.sh            # 1, 100 and 10000 routes
# ("classify" is the lookup the pipeline makes, the port hash first;
# "interval" the VIP hash and the interval search alone, its baseline.)
# The last rows keep per-flow state (the default configuration's), for
# established flows (ACKs): "process+flows" one packet at a time,
# "staged+flows" bursts of 32 through the look-ahead stages then processed
# (what a worker does when its tables are large), and the same for SYNs of
# a random service ("staged+rnd-syn": every packet draws).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
cargo build --release -q -p sluice-bench --example stage_loop
BIN=target/release/examples/stage_loop
count() { env ${EXTRA:-} STAGE=$1 N=$2 ROUTES=$3 valgrind --tool=callgrind --callgrind-out-file=/dev/null "$BIN" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'; }
per_packet() { local a b; a=$(count "$1" 100000 "$2"); b=$(count "$1" 300000 "$2"); echo $(( (b - a) / 200000 )); }
printf '%-8s %8s %8s %8s\n' stage 1-route 100 10000
for s in none parse classify interval hash refresh rewrite process; do
  printf '%-8s %8s %8s %8s\n' "$s" "$(per_packet $s 1)" "$(per_packet $s 100)" "$(per_packet $s 10000)"
done
row() { printf '%-14s %8s %8s %8s\n' "$1" "$(EXTRA=$3 per_packet $2 1)" "$(EXTRA=$3 per_packet $2 100)" "$(EXTRA=$3 per_packet $2 10000)"; }
row process+flows process FLOW_TABLE=1
row staged+flows staged FLOW_TABLE=1
row staged+rnd-syn staged "FLOW_TABLE=1 ALGORITHM=random SYN=1"
