#!/usr/bin/env bash
# Builds the container image the Kubernetes manifests (configs/k8s/) name,
# sluice:<version>, with Debian's buildah, from the repository:
#   scripts/image.sh
# One image for the appliance and the controller: a Debian 12 (minbase)
# root with the Debian package of scripts/package.sh (binaries from
# $BIN_DIR, or built for release) and bird2 installed by apt, entry point
# /usr/bin/sluice, command `run --config /etc/sluice/sluice.yaml` (the
# controller's Deployment runs `sluice-controller` instead). Tagged
# localhost/sluice:<version> and docker.io/library/sluice:<version>, the
# names `image: sluice:<version>` resolves to.
#
# Needs root, buildah and debootstrap (apt-get install -y buildah debootstrap)
# and the Debian mirror of /etc/apt/sources.list.d/debian.sources. The base
# root is kept in target/image-cache/ between runs.
set -euo pipefail
cd "$(dirname "$0")/.."

for tool in buildah debootstrap; do
  command -v "$tool" > /dev/null || { echo "image: $tool is missing: apt-get install -y buildah debootstrap" >&2; exit 1; }
done
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
arch=$(dpkg --print-architecture)

# The manifests must name the image this builds.
named=$(grep -rhoE 'image: sluice:[^ "]+' configs/k8s | sort -u | sed 's/^image: //')
if [ "$named" != "sluice:$version" ]; then
  echo "image: configs/k8s names $(echo "$named" | tr '\n' ' ')but this builds sluice:$version" >&2
  exit 1
fi

work=$(mktemp -d)
ctr=
cleanup() {
  [ -n "$ctr" ] && buildah rm "$ctr" > /dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

deb=$(scripts/package.sh "$work")

cache=target/image-cache/debian-bookworm-minbase-$arch.tar
if [ ! -f "$cache" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  debootstrap --variant=minbase bookworm "$work/base" "${mirror:-http://deb.debian.org/debian}" > "$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  mkdir -p "$(dirname "$cache")"
  tar -C "$work/base" -cf "$cache.part" . && mv "$cache.part" "$cache"
fi

ctr=$(buildah from scratch)
mnt=$(buildah mount "$ctr")
tar -C "$mnt" -xf "$cache"
# The host's Debian sources (with updates and security), and its resolver
# while apt runs.
rm -f "$mnt/etc/apt/sources.list"
cp /etc/apt/sources.list.d/debian.sources "$mnt/etc/apt/sources.list.d/"
cp /etc/resolv.conf "$mnt/etc/resolv.conf"
cp "$deb" "$mnt/tmp/sluice.deb"
in_root() { chroot "$mnt" env DEBIAN_FRONTEND=noninteractive PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
in_root apt-get update -qq
in_root apt-get install -y -qq --no-install-recommends /tmp/sluice.deb bird2 > "$work/apt.log" 2>&1 \
  || { tail -20 "$work/apt.log" >&2; exit 1; }
# What the image must run: the appliance, its checker on the packaged
# configuration, the controller and BIRD.
in_root sluice --version > /dev/null
in_root sluice check --config /etc/sluice/sluice.yaml > /dev/null
in_root sluice-controller --help > /dev/null
in_root bird --version > /dev/null 2>&1
in_root apt-get clean
rm -rf "$mnt/var/lib/apt/lists/"* "$mnt/tmp/sluice.deb" "$mnt/etc/resolv.conf"
buildah umount "$ctr" > /dev/null

buildah config \
  --entrypoint '["/usr/bin/sluice"]' --cmd 'run --config /etc/sluice/sluice.yaml' \
  --label org.opencontainers.image.title=sluice --label "org.opencontainers.image.version=$version" \
  "$ctr"
buildah commit -q "$ctr" "localhost/sluice:$version" > /dev/null
buildah tag "localhost/sluice:$version" "docker.io/library/sluice:$version"
echo "localhost/sluice:$version"
