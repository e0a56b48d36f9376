#!/usr/bin/env bash
# Fuzzes the parser, the pipeline and two steering workers for a bounded
# time each. The parser and pipeline corpora are seeded with every frame of
# the pcap fixtures; the worker corpus with sequences that reach each VIP
# and kind of frame (scripts/fuzz_seeds_worker.py). Needs cargo-fuzz (installed here if
# missing). cargo-fuzz uses nightly-only compiler flags; on a stable
# toolchain they are enabled with RUSTC_BOOTSTRAP=1.
#   scripts/fuzz.sh            # 60 s per target
#   FUZZ_SECONDS=600 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${FUZZ_SECONDS:-60}
FIXTURES=${FIXTURES:-../shared/fixtures/pcap/tcpdump}

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for t in parse pipeline; do
  mkdir -p "fuzz/corpus/$t"
  python3 scripts/pcap_frames.py "fuzz/corpus/$t" "$FIXTURES"/*.pcap >/dev/null
done
mkdir -p fuzz/corpus/worker
python3 scripts/fuzz_seeds_worker.py fuzz/corpus/worker
export RUSTC_BOOTSTRAP=1
for t in parse pipeline worker; do
  echo "== fuzz $t for ${SECS}s"
  cargo fuzz run --release "$t" "fuzz/corpus/$t" -- -max_total_time="$SECS" -rss_limit_mb=2048 -print_final_stats=1 2>&1 |
    grep -E "^#[0-9]+.*(DONE|INITED)|stat::number_of_executed_units|ERROR|panicked|SUMMARY" || true
  if [ -n "$(ls fuzz/artifacts/$t 2>/dev/null)" ]; then
    echo "fuzz $t found a crash: fuzz/artifacts/$t" >&2
    exit 1
  fi
done
echo "== fuzzing clean"
