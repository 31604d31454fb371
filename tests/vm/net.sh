#!/usr/bin/env bash
# Test network for the VM test bed: one bridge with taps, no uplink, no NAT.
#
#   sudo tests/vm/net.sh up   [TAP...]   create bridge $VUR_BRIDGE (default vurbr0) with
#                                        10.77.0.1/24 + fd77::1/64 and the taps
#                                        (default: vurtapA vurtapB), all up
#   sudo tests/vm/net.sh down [TAP...]   delete the taps and the bridge (missing ones are fine)
#   tests/vm/net.sh status               show the bridge and its ports
#
# The guests get 10.77.0.2.. / fd77::2.. (tests/vm/run-vm.sh --ip). Nothing is routed or
# NATed: traffic stays between the host bridge address and the guests this test made.
# Env: VUR_BRIDGE, VUR_NET4 (default 10.77.0.1/24), VUR_NET6 (default fd77::1/64), VUR_MTU.
set -euo pipefail

bridge=${VUR_BRIDGE:-vurbr0}
net4=${VUR_NET4:-10.77.0.1/24}
net6=${VUR_NET6:-fd77::1/64}
mtu=${VUR_MTU:-1500}

log() { printf '[net] %s\n' "$*"; }
die() { printf '[net] error: %s\n' "$*" >&2; exit 1; }

cmd=${1:-}
shift || true
taps=("$@")
((${#taps[@]})) || taps=(vurtapA vurtapB)

exists() { ip link show dev "$1" >/dev/null 2>&1; }

down() {
    local t
    for t in "${taps[@]}"; do
        if exists "$t"; then
            log "delete tap $t"
            ip link del dev "$t" || true
        fi
    done
    if exists "$bridge"; then
        log "delete bridge $bridge"
        ip link del dev "$bridge" || true
    fi
}

up() {
    [[ $(id -u) -eq 0 ]] || die "needs root (ip link add)"
    # Refuse to shadow an address range that something else on this host already uses.
    local other
    other=$(ip -o -4 addr show to "${net4%/*}/${net4#*/}" | awk -v b="$bridge" '$2 != b {print $2}' | head -1)
    [[ -z $other ]] || die "${net4} already used by interface $other"
    down
    log "bridge $bridge $net4 $net6 mtu $mtu"
    ip link add name "$bridge" type bridge stp_state 0 forward_delay 0 mcast_snooping 0
    sysctl -q -w "net.ipv6.conf.$bridge.accept_dad=0" "net.ipv6.conf.$bridge.accept_ra=0" || true
    ip link set dev "$bridge" mtu "$mtu" up
    ip addr add "$net4" dev "$bridge"
    ip -6 addr add "$net6" dev "$bridge" nodad
    local t
    for t in "${taps[@]}"; do
        log "tap $t -> $bridge"
        ip tuntap add dev "$t" mode tap
        ip link set dev "$t" mtu "$mtu" master "$bridge" up
    done
}

case $cmd in
up) up ;;
down) down ;;
status)
    ip -br addr show dev "$bridge" 2>/dev/null || echo "no bridge $bridge"
    ip -br link show master "$bridge" 2>/dev/null || true
    ;;
*) die "usage: $0 up|down|status [TAP...]" ;;
esac
