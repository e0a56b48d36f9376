#!/usr/bin/env bash
# The demo and test topology, in network namespaces named <prefix>-*:
#
#   [client] c0 10.100.0.2 ──── lbf ┐                 (no IP on lbf/lbb: DPDK
#                                   ├ [lb] sluice      af_packet owns them; the
#   [net] br0 ── nlb ────────── lbb ┘                  taps sluice creates carry
#          ├── nb1 ── [be1] b0 10.200.0.11, VIP on lo   10.100.0.1 and 10.200.0.1)
#          ├── nb2 ── [be2] b0 10.200.0.12, VIP on lo
#          └── nb3 ── [be3] b0 10.200.0.13, VIP on lo
#
# Clients reach the VIPs 20.0.0.0/24 through 10.100.0.1; backends own the
# VIPs on their loopback and send replies (source = VIP) back through
# 10.200.0.1, as in the Meridio data plane. The client is also the
# appliance's gateway for return traffic.
#
# With IPV6=1 the same again over IPv6: client fd00:100::2/64 reaching
# fd00:20::/64 through fd00:100::1, backends fd00:200::1N/64 with the IPv6
# VIPs ($VIPS6) on loopback and fd00:200::1 as their default route.
#
#   scripts/topology.sh up PREFIX      # create
#   scripts/topology.sh down PREFIX    # delete everything PREFIX-*
set -euo pipefail
cmd=${1:-}; P=${2:-sld}
VIPS=${VIPS:-"20.0.0.1/32 20.0.0.2/32"}
VIPS6=${VIPS6:-"fd00:20::1/128 fd00:20::2/128"}
IPV6=${IPV6:-0}

ns() { ip netns exec "$P-$1" "${@:2}"; }
offloads_off() { ns "$1" ethtool -K "$2" tx off rx off tso off gso off gro off >/dev/null 2>&1 || true; }
veth() { # ns1 if1 ns2 if2
  ip link add "$2" netns "$P-$1" type veth peer name "$4" netns "$P-$3"
  ns "$1" ip link set "$2" up; ns "$3" ip link set "$4" up
  offloads_off "$1" "$2"; offloads_off "$3" "$4"
}

down() {
  for n in $(ip netns list | awk '{print $1}' | grep -E "^$P-(client|lb|net|be[0-9]+)$" || true); do
    for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$n" 2>/dev/null || true
  done
}

up() {
  down
  for n in client lb net be1 be2 be3; do
    ip netns add "$P-$n"
    ns "$n" ip link set lo up
    if [ "$IPV6" = 1 ]; then
      # Addresses usable at once (no duplicate detection in a test rig).
      ns "$n" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
    else
      ns "$n" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    fi
  done
  veth client c0 lb lbf
  veth net nlb lb lbb
  ns net ip link add br0 type bridge
  ns net ip link set br0 up
  ns net ip link set nlb master br0
  ns client ip addr add 10.100.0.2/24 dev c0
  ns client ip route add 20.0.0.0/24 via 10.100.0.1
  if [ "$IPV6" = 1 ]; then
    ns client ip addr add fd00:100::2/64 dev c0 nodad
    ns client ip route add fd00:20::/64 via fd00:100::1
  fi
  for i in 1 2 3; do
    veth net "nb$i" "be$i" b0
    ns net ip link set "nb$i" master br0
    ns "be$i" ip addr add "10.200.0.1$i/24" dev b0
    for v in $VIPS; do ns "be$i" ip addr add "$v" dev lo; done
    ns "be$i" ip route add default via 10.200.0.1
    if [ "$IPV6" = 1 ]; then
      ns "be$i" ip addr add "fd00:200::1$i/64" dev b0 nodad
      for v in $VIPS6; do ns "be$i" ip addr add "$v" dev lo; done
      ns "be$i" ip -6 route add default via fd00:200::1
    fi
    ns "be$i" sysctl -qw net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 \
      net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.b0.rp_filter=0
  done
}

case "$cmd" in
  up) up ;;
  down) down ;;
  *) echo "usage: $0 up|down PREFIX" >&2; exit 2 ;;
esac
