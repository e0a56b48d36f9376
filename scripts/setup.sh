#!/usr/bin/env bash
# Installs everything Sluice needs to build, test and run its demo on Debian 12.
# Idempotent: packages already present are left alone; apt-get update runs once,
# and only when something is missing.
set -euo pipefail

PKGS=(
  # build: DPDK headers/libs, libclang for bindgen, a C compiler for the shim
  dpdk dpdk-dev libdpdk-dev libclang-dev pkg-config build-essential
  # network test topology and inspection
  iproute2 iputils-ping tcpdump ethtool procps
  # reading the pcaps sluice capture writes (tests/capture.rs uses it when present)
  tshark
  # traffic and peers for the end-to-end tests and demo
  socat netcat-openbsd python3 bird2 curl bc
  # monitoring: promtool and a real scraper for configs/monitoring (tests/monitoring.rs)
  prometheus
  # the container image (scripts/image.sh, tests/image.rs)
  buildah debootstrap debian-archive-keyring gnupg fuse-overlayfs
  # benchmarks (instruction counts; bench/compare_ns.sh: the kernel load balancers)
  valgrind nftables nftlb haproxy ipvsadm
)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  # bird2 starts a system daemon on install; Sluice runs its own instance.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now bird >/dev/null 2>&1 || true; fi
  pkill -x bird >/dev/null 2>&1 || true
  # haproxy, nftlb and prometheus start system daemons on install too;
  # bench/compare_ns.sh and tests/monitoring.rs run their own instances.
  if command -v systemctl >/dev/null 2>&1; then systemctl disable --now haproxy nftlb prometheus >/dev/null 2>&1 || true; fi
  pkill -x prometheus >/dev/null 2>&1 || true
else
  echo "setup: all packages present"
fi

pkg-config --modversion libdpdk >/dev/null || { echo "setup: libdpdk not visible to pkg-config" >&2; exit 1; }
echo "setup: DPDK $(pkg-config --modversion libdpdk)"
