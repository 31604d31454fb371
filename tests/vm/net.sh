#!/usr/bin/env bash
# Test network for the VM test bed: a network namespace of its own with one bridge and taps,
# no uplink, no NAT. Nothing of it exists in, or sends from, the host's root namespace.
#
#   sudo tests/vm/net.sh exec [--name N] -- CMD [ARG...]
#        create namespace vur-N-<pid> (N defaults to "net"), bring its loopback up, run CMD in
#        it with VUR_NETNS set to its name, then stop whatever CMD left running in it, delete
#        the namespace and return CMD's exit code (also on failure, INT and TERM)
#   tests/vm/net.sh up   [TAP...]   inside such a namespace: bridge $VUR_BRIDGE (default
#                                   vurbr0) with 10.77.0.1/24 + fd77::1/64 and the taps
#                                   (default: vurtapA vurtapB), all up
#   tests/vm/net.sh down [TAP...]   delete the taps and the bridge (missing ones are fine)
#   tests/vm/net.sh status          show the namespace, the bridge and its ports
#
# The names and addresses are local to the namespace, so two test runs at once do not meet.
# `up` refuses to run outside a namespace that `exec` made: the test addresses never appear
# in the root namespace. The guests get 10.77.0.2.. / fd77::2.. (tests/vm/run-vm.sh --ip).
# Env: VUR_BRIDGE, VUR_NET4 (default 10.77.0.1/24), VUR_NET6 (default fd77::1/64), VUR_MTU.
set -euo pipefail

bridge=${VUR_BRIDGE:-vurbr0}
net4=${VUR_NET4:-10.77.0.1/24}
net6=${VUR_NET6:-fd77::1/64}
mtu=${VUR_MTU:-1500}

log() { printf '[net] %s\n' "$*" >&2; }
die() { printf '[net] error: %s\n' "$*" >&2; exit 1; }

# The namespace this process is in, when it is one that `exec` made ("" otherwise).
own_netns() {
    local ns
    ns=$(ip netns identify $$ 2>/dev/null || true)
    [[ -n $ns && $ns == "${VUR_NETNS:-}" && $ns == vur-* ]] && echo "$ns"
    return 0
}

cmd=${1:-}
shift || true

if [[ $cmd == exec ]]; then
    [[ $(id -u) -eq 0 ]] || die "needs root (ip netns add)"
    name=net
    while (($#)); do
        case $1 in
        --name) name=$2; shift 2 ;;
        --) shift; break ;;
        *) break ;;
        esac
    done
    (($#)) || die "usage: $0 exec [--name N] -- CMD [ARG...]"
    ns=vur-$name-$$
    ip netns add "$ns"
    # shellcheck disable=SC2317 # invoked from the EXIT trap
    cleanup() {
        local pids p
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        if [[ -n $pids ]]; then
            log "stopping what is left in $ns: $(echo $pids)"
            for p in $pids; do kill "$p" 2>/dev/null || true; done
            for _ in $(seq 20); do
                [[ -z $(ip netns pids "$ns" 2>/dev/null) ]] && break
                sleep 0.1
            done
            for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        fi
        ip netns del "$ns" 2>/dev/null || true
    }
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    ip -n "$ns" link set lo up
    rc=0
    VUR_NETNS=$ns ip netns exec "$ns" "$@" || rc=$?
    exit "$rc"
fi

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
    local ns
    ns=$(own_netns)
    [[ -n $ns ]] || die "refusing to put $net4 in the root network namespace: run inside '$0 exec -- ...'"
    down
    log "namespace $ns: bridge $bridge $net4 $net6 mtu $mtu"
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
down) [[ -n $(own_netns) ]] || die "not inside a test namespace: nothing of ours to delete here"; down ;;
status)
    echo "namespace: $(own_netns)"
    ip -br addr show dev "$bridge" 2>/dev/null || echo "no bridge $bridge"
    ip -br link show master "$bridge" 2>/dev/null || true
    ;;
*) die "usage: $0 exec [--name N] -- CMD... | up|down|status [TAP...]" ;;
esac
