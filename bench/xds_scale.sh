#!/usr/bin/env bash
# xDS at scale against a real `sluice run` (net_null ports, no namespaces):
# time from the management server sending N clusters x E endpoints to the
# snapshot being live, resident memory, and single-endpoint changes to live
# (p50/p99), in state-of-the-world and delta modes, with the same changes
# made as file edits as the baseline measured in the same run.
#
#   bench/xds_scale.sh                      # 10,000 clusters x 10 endpoints, 200 changes
#   CLUSTERS=1000 CHANGES=20 bench/xds_scale.sh   # a short run
#   PORTS=idle bench/xds_scale.sh           # the appliance's worker idle (default: traffic)
#
# Results: bench/results/xds_scale-<mode>.json (and printed). Needs root (DPDK).
set -euo pipefail
cd "$(dirname "$0")/.."
CLUSTERS=${CLUSTERS:-10000}
ENDPOINTS=${ENDPOINTS:-10}
CHANGES=${CHANGES:-200}
cargo build --release -p sluice -p sluice-tests --bins
cargo build --release -p sluice-bench --example xds_scale
mkdir -p bench/results
for mode in ${MODES:-sotw delta}; do
  echo "== $mode: $CLUSTERS clusters x $ENDPOINTS endpoints, $CHANGES changes (load: $(cut -d' ' -f1-3 /proc/loadavg))"
  target/release/examples/xds_scale --sluice target/release/sluice --clusters "$CLUSTERS" \
    --endpoints "$ENDPOINTS" --changes "$CHANGES" --mode "$mode" --ports "${PORTS:-traffic}" --out "bench/results/xds_scale-$mode.json"
done
