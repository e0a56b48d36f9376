#!/usr/bin/env bash
# Sluice side by side with the kernel's load balancers in network namespaces
# (nftlb DSR, plain nftables jhash, HAProxy TCP, IPVS mh where the kernel has
# it), the same topology and traffic for each; see bench/compare_ns.py for
# what is measured and how CPU is attributed.
#
#   bench/compare_ns.sh              # as root; every system, about 7 minutes;
#                                    # writes bench/results/compare_ns.json
#   QUICK=1 bench/compare_ns.sh      # a few seconds per system (smoke run;
#                                    # writes /tmp/compare_ns-quick.json)
#   SYSTEMS="nftlb-dsr haproxy-tcp" OUT=/tmp/x.json bench/compare_ns.sh
#
# Then `cargo run --release -p sluice-bench --bin lab_report` puts the
# numbers into README.md and bench/results/charts/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet -p sluice -p sluice-bench --bin sluice --bin cmp_load --bin cmp_backend
exec python3 bench/compare_ns.py
