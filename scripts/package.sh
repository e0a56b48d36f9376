#!/usr/bin/env bash
# Builds Sluice's Debian package from the release binaries:
#   scripts/package.sh [OUT_DIR]     (default target/debian)
# with the binaries in $BIN_DIR, or else built for release (cargo build -p
# sluice -p sluice-controller)
# prints the path of sluice_<version>_<arch>.deb. It holds
#   /usr/bin/sluice, /usr/bin/sluice-controller,
#   /lib/systemd/system/sluice.service (Type=notify, watchdog, capabilities),
#   /usr/lib/sysctl.d/60-sluice-hugepages.conf,
#   /etc/sluice/sluice.yaml (the demo's configuration, a conffile),
#   /usr/share/sluice/{crds,k8s,monitoring}/ (CRDs, manifests, dashboard and
#   alerting rules) and /usr/share/doc/sluice/.
# The service is not enabled on install: edit /etc/sluice/sluice.yaml, then
# `systemctl enable --now sluice`. Needs dpkg-deb (Debian's dpkg).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/debian}

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)
[ -n "$version" ] || { echo "package: no version in Cargo.toml's [workspace.package]" >&2; exit 1; }
if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR
else
  # The binaries as released: without the features the tests build in.
  cargo build --release --locked -p sluice -p sluice-controller
  bin=${CARGO_TARGET_DIR:-target}/release
fi
[ -x "$bin/sluice" ] && [ -x "$bin/sluice-controller" ] || { echo "package: no sluice and sluice-controller in $bin" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/sluice_${version}_${arch}"
install -Dm755 "$bin/sluice" "$root/usr/bin/sluice"
install -Dm755 "$bin/sluice-controller" "$root/usr/bin/sluice-controller"
strip --strip-unneeded "$root/usr/bin/sluice" "$root/usr/bin/sluice-controller"
install -Dm644 configs/package/sluice.service "$root/lib/systemd/system/sluice.service"
install -Dm644 configs/package/60-sluice-hugepages.conf "$root/usr/lib/sysctl.d/60-sluice-hugepages.conf"
install -Dm644 configs/demo.yaml "$root/etc/sluice/sluice.yaml"
install -d "$root/usr/share/sluice/crds" "$root/usr/share/sluice/monitoring" "$root/usr/share/doc/sluice/examples"
install -m644 configs/k8s/crds/*.yaml "$root/usr/share/sluice/crds/"
cp -r configs/k8s "$root/usr/share/sluice/k8s"
install -m644 configs/monitoring/sluice-dashboard.json configs/monitoring/sluice-rules.yaml "$root/usr/share/sluice/monitoring/"
install -m644 README.md "$root/usr/share/doc/sluice/README.md"
install -m644 docs/configuration.md "$root/usr/share/doc/sluice/configuration.md"
install -m644 configs/*.yaml "$root/usr/share/doc/sluice/examples/"

# Runtime dependencies: the packages that own the shared libraries the
# binaries load (DPDK itself is linked in).
libs=$(ldd "$root/usr/bin/sluice" "$root/usr/bin/sluice-controller" | awk '/=> \//{print $3}' | sort -u)
deps=()
for l in $libs; do
  p=$(dpkg -S "$l" 2>/dev/null || dpkg -S "/usr$l" 2>/dev/null || dpkg -S "${l#/usr}" 2>/dev/null || true)
  p=${p%%:*}
  [ -n "$p" ] || { echo "package: no Debian package owns $l" >&2; exit 1; }
  v=$(dpkg-query -W -f='${Version}' "$p")
  deps+=("$p (>= ${v%%-*})")
done
depends=$(printf '%s\n' "${deps[@]}" | sort -u | paste -sd, | sed 's/,/, /g')

install -d "$root/DEBIAN"
size=$(du -sk "$root" | cut -f1)
cat > "$root/DEBIAN/control" <<CONTROL
Package: sluice
Version: $version
Architecture: $arch
Maintainer: Sluice developers <sluice@localhost>
Installed-Size: $size
Depends: $depends, iproute2
Recommends: bird2
Suggests: prometheus
Section: net
Priority: optional
Description: kernel-bypass L3/L4 load balancer on DPDK
 Sluice balances TCP, UDP and SCTP flows to endpoints with Maglev or
 random selection, keeps established flows on their endpoint across
 changes and across appliances, and is driven by a file, xDS or the
 Kubernetes Gateway API; it announces its VIPs with BIRD (BGP, BFD).
 This package holds the appliance (sluice), the Kubernetes controller
 (sluice-controller), a systemd unit, the CRDs, a Grafana dashboard and
 Prometheus alerting rules.
CONTROL
echo /etc/sluice/sluice.yaml > "$root/DEBIAN/conffiles"
cat > "$root/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
POSTINST
cat > "$root/DEBIAN/postrm" <<'POSTRM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
POSTRM
cat > "$root/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
  systemctl stop sluice.service || true
fi
PRERM
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/postrm" "$root/DEBIAN/prerm"

mkdir -p "$out"
deb="$out/sluice_${version}_${arch}.deb"
dpkg-deb --root-owner-group --build "$root" "$deb" >/dev/null
echo "$deb"
