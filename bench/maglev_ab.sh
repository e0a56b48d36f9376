#!/usr/bin/env bash
# Maglev table builds of this tree's dataplane against another revision's,
# in one process (bench/maglev_ab/main.rs): batches alternate between the
# two, and the median of the paired ratios new / old is printed per case,
# with whether both build the same entries. Use it for a change to
# dataplane/src/maglev.rs on a noisy host, where two criterion runs a
# minute apart differ by more than the change.
#
#   bench/maglev_ab.sh [REV] [ROUNDS] [CASE]   # REV: git revision of "old" (default HEAD)
#
# Builds in target/maglev_ab (a workspace of the two dataplane crates and
# the harness, made in a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:-HEAD}
ROUNDS=${2:-21}
CASE=${3:-}
root=$PWD
w=$(mktemp -d /tmp/maglev_ab.XXXXXX)
trap 'rm -rf "$w"' EXIT
mkdir -p "$w/mgb/src" "$w/.cargo" "$w/from"
git archive "$REV" dataplane | tar -x -C "$w/from"
mv "$w/from/dataplane" "$w/dataplane_old"
sed -i 's/^name = "sluice-dataplane"$/name = "sluice-dataplane-old"/' "$w/dataplane_old/Cargo.toml"
cp -r dataplane "$w/dataplane"
sed 's/^members = .*/members = ["dataplane", "dataplane_old", "mgb"]/' Cargo.toml > "$w/Cargo.toml"
cp Cargo.lock "$w/"
cp .cargo/config.toml "$w/.cargo/"
cat > "$w/mgb/Cargo.toml" <<TOML
[package]
name = "mgb"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
new = { package = "sluice-dataplane", path = "../dataplane" }
old = { package = "sluice-dataplane-old", path = "../dataplane_old" }
TOML
cp bench/maglev_ab/main.rs "$w/mgb/src/main.rs"
echo "== maglev A/B: old = $REV ($(git rev-parse --short "$REV")), new = this tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- dataplane || echo ', with its uncommitted changes')), $ROUNDS rounds, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
(cd "$w" && CARGO_TARGET_DIR="$root/target/maglev_ab" cargo build --quiet --release -p mgb)
"$root/target/maglev_ab/release/mgb" "$ROUNDS" $CASE
