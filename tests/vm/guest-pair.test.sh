#!/usr/bin/env bash
# Two guests, the RDMA tools across them (tests/vm/pair-guest.sh runs in both, in lock step):
#
#   devices  two guests with the virtio-rdma device, each served by its own vhost-user-rdma
#            daemon on the udp transport: the server always on guest "a", the client on "b"
#   rxe      a guest with the virtio-rdma device against a guest running Linux rdma_rxe on its
#            virtio-net: every tool in both directions
#
#   sudo tests/vm/guest-pair.test.sh [devices|rxe|all] [TOOL...]     default: all, every tool
#
# Tools: rc uc ud srq (libibverbs examples with --chk data checks), send_lat send_bw write_lat
# write_bw read_bw atomic_bw (perftest), rping (rdma_cm with data verification, the CM over
# each side's QP1).
#
# Addresses (all inside the test's own network namespace, tests/vm/net.sh exec):
#   10.77.0.0/24  RoCE. A daemon's udp transport is bound to an address on the namespace's
#                 loopback (a 10.77.0.2, b 10.77.0.3); its guest's eth0, the netdev the
#                 virtio-rdma port pairs with, holds the same address and is attached to
#                 nothing. The rxe guest (10.77.0.4) is on the bridge (vurbr0, 10.77.0.1/24),
#                 and the host answers its ARP for 10.77.0.2: that is where the daemon is.
#   10.78.0.0/24  out of band (the tools' TCP exchange): every guest's NIC on the bridge.
# In devices mode an eBPF tap (vhost-user-rdma tap) on the namespace's loopback captures the
# daemons' traffic; the capture must hold every packet they sent (VUR_PAIR_TAP=0: no tap).
# Env: VUR_PAIR_ITERS (default 200), VUR_PAIR_KEEP=1 (keep the logs), VUR_DAEMON, VUR_IMAGES, VUR_QEMU.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t_start=$SECONDS
log() { printf '[guest-pair %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require guest-pair
vm_device_prereqs guest-pair
vm_netns guest-pair "$@"

modes=(devices rxe)
case ${1:-all} in
devices | rxe) modes=("$1"); shift ;;
all) shift || true ;;
-*) echo "usage: $0 [devices|rxe|all] [TOOL...]" >&2; exit 2 ;;
esac
all_tools=(rc uc ud srq send_lat send_bw write_lat write_bw read_bw atomic_bw rping ucmatose udaddy rdma_server send_lat_cm nvme)
tools=("$@")
((${#tools[@]})) || tools=("${all_tools[@]}")
for t in "${tools[@]}"; do
    [[ " ${all_tools[*]} " == *" $t "* ]] || { echo "unknown tool $t (${all_tools[*]})" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-guest-pair.XXXXXX")
pids=()
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$? p
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    if ((rc == 0)) && [[ -z ${VUR_PAIR_KEEP:-} ]]; then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$here/net.sh" up vurtapA vurtapB
iters=${VUR_PAIR_ITERS:-200}

# daemon NAME ADDR MAC: start the daemon of guest NAME (directory $dir/daemon-NAME)
daemon() {
    vm_start_daemon "$dir/daemon-$1" "$2" "$3" || return 1
    daemons+=("$1:$REPLY")
    pids+=("$REPLY")
}

# guest NAME RUN-VM-ARGS... : boot one guest of the pair (background); its exit code lands
# in $dir/NAME.rc
guest() {
    local name=$1
    shift
    { "$here/run-vm.sh" --name "$name" --qemu "$qemu" --images "$images" --shared "$dir/share" \
        --scenario "$here/pair-guest.sh" --timeout 1200 --env "PAIR_ITERS=$iters" \
        --env "PAIR_STEPS=$steps" "$@" >"$dir/$name.run.log" 2>&1; echo $? >"$dir/$name.rc"; } &
    vm_pids+=($!)
}

run_mode() {
    local mode=$1 t fail=0 n
    dir=$work/$mode
    mkdir -p "$dir/share/sync"
    steps=''
    vm_pids=()
    daemons=()
    case $mode in
    devices)
        for t in "${tools[@]}"; do steps+="${steps:+,}$t@a"; done
        daemon a 10.77.0.2 52:54:00:77:00:02 || return 1
        daemon b 10.77.0.3 52:54:00:77:00:03 || return 1
        guest a --rdma-sock "$dir/daemon-a/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:02 \
            --ip 10.77.0.2/24 --no-rxe --tap2 vurtapA --mac2 52:54:00:78:00:02 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.0.2/24 --env PAIR_OOB_MAC=52:54:00:78:00:02 \
            --env PAIR_PEER_OOB=10.78.0.3 --env PAIR_PEER_ROCE=10.77.0.3 \
            --env PAIR_PEER_MAC=52:54:00:77:00:03
        guest b --rdma-sock "$dir/daemon-b/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:03 \
            --ip 10.77.0.3/24 --no-rxe --tap2 vurtapB --mac2 52:54:00:78:00:03 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.0.3/24 --env PAIR_OOB_MAC=52:54:00:78:00:03 \
            --env PAIR_PEER_OOB=10.78.0.2 --env PAIR_PEER_ROCE=10.77.0.2 \
            --env PAIR_PEER_MAC=52:54:00:77:00:02
        ;;
    rxe)
        for t in "${tools[@]}"; do steps+="${steps:+,}$t@dev,$t@rxe"; done
        daemon dev 10.77.0.2 52:54:00:77:00:02 || return 1
        guest dev --rdma-sock "$dir/daemon-dev/rdma.sock" --nic-no-peer --mac 52:54:00:77:00:02 \
            --ip 10.77.0.2/24 --no-rxe --tap2 vurtapA --mac2 52:54:00:78:00:02 \
            --env PAIR_DEV=vrdma0 --env PAIR_OOB=10.78.0.2/24 --env PAIR_OOB_MAC=52:54:00:78:00:02 \
            --env PAIR_PEER_OOB=10.78.0.4 --env PAIR_PEER_ROCE=10.77.0.4 \
            --env PAIR_PEER_MAC=52:54:00:77:00:04
        guest rxe --tap vurtapB --mac 52:54:00:77:00:04 --ip 10.77.0.4/24 \
            --env PAIR_DEV=rxe0 --env PAIR_OOB=10.78.0.4/24 --env PAIR_OOB_MAC=52:54:00:77:00:04 \
            --env PAIR_PEER_OOB=10.78.0.2 --env PAIR_PEER_ROCE=10.77.0.2
        ;;
    esac
    # devices: the daemons' RoCE crosses the namespace's loopback; tap it (docs/tap.md) and
    # hold the capture against the daemons' own counters afterwards.
    tap_pid=''
    if [[ $mode == devices && ${VUR_PAIR_TAP:-1} == 1 ]]; then
        "$daemon" tap --iface lo --write "$dir/lo.pcapng" --snaplen 96 2>"$dir/tap.err" &
        tap_pid=$!
        pids+=("$tap_pid")
        for _ in $(seq 200); do
            grep -qs '^tap: attached' "$dir/tap.err" && break
            kill -0 "$tap_pid" 2>/dev/null || break
            sleep 0.1
        done
        grep -qs '^tap: attached' "$dir/tap.err" ||
            { cat "$dir/tap.err"; log "$mode: FAIL: the tap on lo did not attach within 20 s"; return 1; }
    fi
    log "$mode: two guests booting; steps: $steps"
    # The daemons' counters once both guests have run every tool (they are still connected).
    (
        for _ in $(seq 12000); do
            n=$(find "$dir/share/sync" -maxdepth 1 -name 'tools-done.*' | wc -l)
            ((n >= 2)) && break
            sleep 0.1
        done
        for d in "${daemons[@]}"; do
            vm_daemon_counters "$dir/daemon-${d%%:*}/counters.sock" >"$dir/${d%%:*}.counters.json" 2>&1 || true
        done
        touch "$dir/share/sync/counters-read"
    ) &
    local watcher=$!
    wait "${vm_pids[@]}" || true
    kill "$watcher" 2>/dev/null || true
    wait "$watcher" 2>/dev/null || true
    for n in "$dir"/share/*.console.log; do
        tr -d '\r' <"$n" | grep -a -E '^PAIR |^\[vur-init' || true
    done
    if [[ -n $tap_pid ]]; then
        tap_check "$mode" "$tap_pid" || fail=1
    fi
    for n in "$dir"/*.rc; do
        local g rc
        g=$(basename "$n" .rc)
        rc=$(cat "$n")
        log "$mode: guest $g rc=$rc"
        if ((rc != 0)); then
            fail=1
            tail -n 45 "$dir/$g.run.log"
        fi
    done
    for d in "${daemons[@]}"; do
        local g=${d%%:*} pid=${d#*:} msg
        if ! kill -0 "$pid" 2>/dev/null; then
            log "$mode: FAIL: the daemon of guest $g died"
            tail -20 "$dir/daemon-$g/daemon.log"
            fail=1
            continue
        fi
        if [[ -s $dir/$g.counters.json ]]; then
            msg=$(vm_daemon_leaks "$mode/$g" "$dir/$g.counters.json" "$(cat "$dir/share/sync/objects.$g" 2>/dev/null)") || fail=1
            log "$msg"
            msg=$(vm_daemon_traffic "$mode/$g" "$dir/$g.counters.json") || fail=1
            log "$msg"
        else
            log "$mode: FAIL: no counters from the daemon of guest $g (its guest did not reach the end)"
            fail=1
        fi
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    ip addr flush dev lo scope global 2>/dev/null || true
    return "$fail"
}

# tap_check MODE PID: stop the tap on lo; every packet the daemons sent must be in the capture
# once as egress (written + lost to a full ring), and decode as RoCE. Reads the daemons'
# counters again: they outlive the guests.
tap_check() {
    local mode=$1 pid=$2 tx=0 d n egress total roce lost
    kill -INT "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; log "$mode: FAIL: the tap still ran 10 s after SIGINT"; return 1; }
    wait "$pid" || { cat "$dir/tap.err"; log "$mode: FAIL: the tap failed"; return 1; }
    for d in "${daemons[@]}"; do
        n=$(vm_daemon_counters "$dir/daemon-${d%%:*}/counters.sock" |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["transport"]["tx_packets"])') ||
            { log "$mode: FAIL: no counters from daemon ${d%%:*} after the run"; return 1; }
        tx=$((tx + n))
    done
    total=$(tshark -n -r "$dir/lo.pcapng" -T fields -e frame.number 2>/dev/null | wc -l)
    egress=$(tshark -n -r "$dir/lo.pcapng" -Y 'frame.interface_id == 1' -T fields -e frame.number 2>/dev/null | wc -l)
    roce=$(tshark -n -r "$dir/lo.pcapng" -Y infiniband -T fields -e frame.number 2>/dev/null | wc -l)
    lost=$(sed -n 's/.* \([0-9][0-9]*\) lost to a full ring buffer.*/\1/p' "$dir/tap.err" | tail -1)
    log "$mode: tap on lo: $total frames ($egress egress, $roce decode as RoCE), ${lost:-?} lost to a full ring; the daemons sent $tx"
    grep '^tap: done' "$dir/tap.err" | sed "s/^/  /"
    ((roce == total && egress + ${lost:-0} == tx && egress > 0)) ||
        { log "$mode: FAIL: the capture does not hold what the daemons sent"; return 1; }
}

failed=()
for m in "${modes[@]}"; do
    t0=$SECONDS
    if run_mode "$m"; then
        log "$m: PASS (${tools[*]}) in $((SECONDS - t0)) s"
    else
        log "$m: FAIL in $((SECONDS - t0)) s (logs: $work/$m)"
        failed+=("$m")
    fi
done
if ((${#failed[@]})); then
    log "FAIL: ${failed[*]} in $((SECONDS - t_start)) s"
    exit 1
fi
log "PASS: ${modes[*]} in $((SECONDS - t_start)) s"
