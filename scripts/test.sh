#!/usr/bin/env bash
# Installs what is missing, builds Sluice once in release mode, lints it and
# runs every test (unit, property, DPDK, and end-to-end in network namespaces).
# Needs root: DPDK and the namespace tests require it.
set -euo pipefail
cd "$(dirname "$0")/.."

# A skipped test must not pass for a run one: CI runs every test as root.
if [ -n "${SLUICE_SKIP_PRIVILEGED:-}" ]; then
    echo "SLUICE_SKIP_PRIVILEGED is set: it marks the tests that need root as ignored; CI runs them all (unset it and run as root)" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "run as root: built by another user, the tests that need root are counted as ignored" >&2
    exit 1
fi

scripts/setup.sh
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}

echo "== build (release)"
cargo build --release --workspace --all-targets --locked

echo "== clippy"
cargo clippy --release --workspace --all-targets --locked -- -D warnings

echo "== tests"
cargo test --release --workspace --locked -- --test-threads="${TEST_THREADS:-2}"

echo "== benchmark smoke (checks that the harness and the appliance forward; never judges a rate)"
SMOKE=1 bench/pipeline_vs_testpmd.sh

echo "== Maglev A/B smoke (the harness builds and runs; a dataplane without uncommitted changes builds the same entries as its HEAD)"
ab=$(bench/maglev_ab.sh HEAD 1 m6421_n10)
echo "$ab"
if git diff --quiet HEAD -- dataplane; then grep -q "same entries: true" <<<"$ab"; else grep -q "same entries:" <<<"$ab"; fi

echo "== README performance section matches bench/results (lab_report --check)"
target/release/lab_report --check

echo "== lab smoke (sluice gen -> sluice run -> sluice gen over net_memif; asserts accounting only)"
SMOKE=1 bench/lab.sh

echo "== fuzz (bounded)"
FUZZ_SECONDS="${FUZZ_SECONDS:-30}" scripts/fuzz.sh

echo "== all tests passed"
