#!/usr/bin/env bash
# Wire interop with Linux rdma_rxe: the unmodified ibv_{rc,uc,ud}_pingpong in a trixie guest
# against rxe-peer (rxe-core on a UDP socket) on the host, each side as server and as client,
# IPv4 and IPv6 GIDs, path MTU 1024 and 4096. Every case checks data (rxe-peer compares every
# buffer that comes back byte for byte; the tool must exit 0), and a capture on the bridge is
# checked frame by frame: tshark decodes it, and tests/vm/icrc-check.py recomputes the ICRC of
# every frame each side sent with two implementations that share no code with rxe-core.
# RC cases also run under netem loss, reordering and duplication in each direction; they must
# complete byte-exact with the recovery visible in rxe-peer's counters.
#
#   sudo tests/vm/interop-pingpong.test.sh
#
# Prints "SKIP: <reason>" when not root or QEMU / the image is missing (a failure under
# CI=true). Env: VUR_INTEROP_ITERS (default 100), VUR_INTEROP_KEEP=1 keeps the artifacts.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
iters=${VUR_INTEROP_ITERS:-100}
export VUR_BRIDGE=${VUR_BRIDGE:-vurbr0}
export VUR_MTU=9000
tap=vurtapI

log() { printf '[interop %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require interop-pingpong dumpcap tshark

t_start=$SECONDS
log "building rxe-peer"
(cd "$repo" && cargo build -q -p vur-interop --bin rxe-peer)
peer=$repo/target/debug/rxe-peer

# Cases: number, role of the TOOL in the guest, transport, IP family, faults, tool arguments.
# rxe-peer takes the other role with the same size and MTU. Faults are netem parameters
# (commas for spaces) applied in the guest as "EGRESS|INGRESS": egress on eth0 (guest -> host),
# ingress through ifb0 (host -> guest); "-" for none. The host has no netem, the guest does.
cases=(
    "1 server rc 4 - -s 4096 -m 1024"
    "2 client rc 4 - -s 4096 -m 1024"
    "3 server rc 4 - -s 64 -m 1024"
    "4 server rc 4 - -s 12000 -m 4096"
    "5 client rc 4 - -s 12000 -m 4096"
    "6 server uc 4 - -s 4096 -m 1024"
    "7 client uc 4 - -s 4096 -m 1024"
    "8 server ud 4 - -s 1024"
    "9 client ud 4 - -s 2048"
    "10 server rc 6 - -s 4096 -m 1024"
    "11 client rc 6 - -s 4096 -m 1024"
    "12 server rc 4 loss,5%|loss,5% -s 4096 -m 1024"
    "13 client rc 4 loss,5%|loss,5% -s 4096 -m 1024"
    "14 server rc 4 loss,10%|- -s 4096 -m 1024"
    "15 server rc 4 -|loss,10% -s 4096 -m 1024"
    "16 client rc 4 delay,1ms,reorder,30%,50%|delay,1ms,reorder,30%,50% -s 4096 -m 1024"
    "17 server rc 4 duplicate,10%|duplicate,10% -s 4096 -m 1024"
)

shared=$(mktemp -d "${TMPDIR:-/tmp}/vur-interop.XXXXXX")
vm_pid='' cap_pid='' peer_pid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    for p in $peer_pid $cap_pid $vm_pid; do
        if kill -0 "$p" 2>/dev/null; then kill "$p" 2>/dev/null || true; fi
    done
    wait 2>/dev/null || true
    "$here/net.sh" down "$tap" >/dev/null 2>&1 || true
    if ((rc == 0)) && [[ ${VUR_INTEROP_KEEP:-} != 1 ]]; then rm -rf "$shared"; else log "artifacts kept in $shared"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$here/net.sh" up "$tap"
dumpcap -q -P -i "$VUR_BRIDGE" -f "udp port 4791" -w "$shared/interop.pcap" 2>"$shared/dumpcap.log" &
cap_pid=$!

printf '%s\n' "${cases[@]}" >"$shared/cases"
cat >"$shared/interop-guest.sh" <<EOF
#!/bin/bash
# Runs inside the guest (tests/vm/interop-pingpong.test.sh).
set -uo pipefail
iters=$iters host4=$host4 host6=$host6
EOF
cat >>"$shared/interop-guest.sh" <<'EOF'
g4=$(vur-gid v4) || { echo "INTEROP-FAIL no IPv4 RoCE v2 GID"; exit 1; }
g6=''
for _ in $(seq 50); do g6=$(vur-gid v6) && break; sleep 0.2; done
[[ -n $g6 ]] || { echo "INTEROP-FAIL no IPv6 RoCE v2 GID"; exit 1; }
ibv_devinfo -d rxe0 | grep -E 'active_mtu|state'
fails=0
netem() { # EGRESS|INGRESS netem parameters with commas for spaces, or "-"
    /usr/sbin/tc qdisc del dev eth0 root 2>/dev/null
    /usr/sbin/tc qdisc del dev eth0 ingress 2>/dev/null
    /usr/bin/ip link del ifb0 2>/dev/null
    [[ $1 == - ]] && return 0
    local eg=${1%%|*} in=${1#*|}
    if [[ $eg != - ]]; then
        # shellcheck disable=SC2086 # parameters are words
        /usr/sbin/tc qdisc add dev eth0 root netem ${eg//,/ } || return 1
    fi
    if [[ $in != - ]]; then
        /usr/bin/ip link add ifb0 type ifb && /usr/bin/ip link set ifb0 up &&
            /usr/sbin/tc qdisc add dev eth0 handle ffff: ingress &&
            /usr/sbin/tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0 &&
            # shellcheck disable=SC2086 # parameters are words
            /usr/sbin/tc qdisc add dev ifb0 root netem ${in//,/ } || return 1
    fi
    /usr/sbin/tc -s qdisc show | sed 's/^/    netem: /'
}
while read -r n role kind fam faults args; do
    port=$((18600 + n))
    if [[ $fam == 6 ]]; then gid=$g6 host=$host6; else gid=$g4 host=$host4; fi
    if ! netem "$faults"; then
        echo "INTEROP case=$n could not set up netem $faults"
        echo 99 >/vur/case-$n.guest-rc
        fails=$((fails + 1))
        continue
    fi
    cmd="ibv_${kind}_pingpong -d rxe0 -g $gid -n $iters -p $port $args"
    if [[ $role == server ]]; then
        # shellcheck disable=SC2086 # cmd is words
        timeout 150 $cmd </dev/null >/tmp/case-$n.log 2>&1 &
        pid=$!
        for _ in $(seq 200); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
        touch /vur/case-$n.ready
        rc=0; wait $pid || rc=$?
    else
        for _ in $(seq 1500); do [[ -f /vur/case-$n.listening ]] && break; sleep 0.1; done
        # shellcheck disable=SC2086 # cmd is words
        rc=0; timeout 150 $cmd $host </dev/null >/tmp/case-$n.log 2>&1 || rc=$?
    fi
    [[ $faults == - ]] || /usr/sbin/tc -s qdisc show | grep -E 'qdisc netem|Sent' | sed 's/^/    after: /'
    netem -
    echo "INTEROP case=$n tool=$role kind=$kind ipv$fam faults=$faults rc=$rc: $cmd"
    sed 's/^/    /' /tmp/case-$n.log
    echo "$rc" >/vur/case-$n.guest-rc
    ((rc == 0)) || fails=$((fails + 1))
done </vur/cases
exit $fails
EOF

log "booting guest"
"$here/run-vm.sh" --name interop --tap "$tap" --ip "$guest4/24" --ip6 "$guest6/64" --mtu 9000 \
    --scenario "$shared/interop-guest.sh" --shared "$shared" --images "$images" --timeout 1500 \
    >"$shared/run-vm.log" 2>&1 &
vm_pid=$!

host_fail=0
declare -A host_rc
for c in "${cases[@]}"; do
    read -r n role kind fam faults args <<<"$c"
    port=$((18600 + n))
    # The tools listen for the out-of-band exchange on IPv4 only (getaddrinfo(NULL) picks
    # 0.0.0.0 first), whatever the GID: the exchange goes to the guest's IPv4 address.
    if [[ $fam == 6 ]]; then local_ip=$host6; else local_ip=$host4; fi
    if [[ $role == server ]]; then
        for _ in $(seq 3000); do
            [[ -f $shared/case-$n.ready ]] && break
            kill -0 "$vm_pid" 2>/dev/null || break
            sleep 0.1
        done
        rc=0
        # shellcheck disable=SC2086 # args are words
        timeout 170 "$peer" --local-ip "$local_ip" "$kind" --server "$guest4" -p "$port" -n "$iters" $args \
            --timeout 150 >"$shared/host-case-$n.log" 2>&1 || rc=$?
    else
        # shellcheck disable=SC2086 # args are words
        timeout 170 "$peer" --local-ip "$local_ip" "$kind" -p "$port" -n "$iters" $args --timeout 150 \
            >"$shared/host-case-$n.log" 2>&1 &
        peer_pid=$!
        for _ in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
        touch "$shared/case-$n.listening"
        rc=0
        wait "$peer_pid" || rc=$?
        peer_pid=''
    fi
    # Faults must show in our counters: retransmissions or NAKs for loss and reordering,
    # duplicates for duplication.
    counters=$(grep '^counters:' "$shared/host-case-$n.log" || true)
    if ((rc == 0)) && [[ $faults != - ]]; then
        get() { sed -n "s/.*$1=\([0-9]*\).*/\1/p" <<<"$counters"; }
        recovered=$(($(get retransmits) + $(get naks_sent) + $(get naks_received) + $(get duplicates)))
        if [[ $faults == *duplicate* ]] && (($(get duplicates) == 0)); then
            log "case $n: duplication left no trace in the counters"
            rc=98
        elif ((recovered == 0)); then
            log "case $n: faults $faults left no trace in the counters"
            rc=98
        fi
    fi
    host_rc[$n]=$rc
    ((rc == 0)) || host_fail=$((host_fail + 1))
    log "case $n: tool=$role $kind ipv$fam faults=$faults $args -> rxe-peer rc=$rc"
    sed 's/^/    /' "$shared/host-case-$n.log"
done

vm_rc=0
wait "$vm_pid" || vm_rc=$?
vm_pid=''
sleep 1
kill "$cap_pid" 2>/dev/null || true
wait "$cap_pid" 2>/dev/null || true
cap_pid=''

grep -a '^INTEROP\|^    ' "$shared/interop.console.log" | tr -d '\r' || true

echo
printf '%-4s %-7s %-5s %-4s %-20s %-34s %-8s %-8s %s\n' case tool kind ip args faults tool-rc peer-rc 'rxe-peer counters'
for c in "${cases[@]}"; do
    read -r n role kind fam faults args <<<"$c"
    grc=$(cat "$shared/case-$n.guest-rc" 2>/dev/null || echo '?')
    cnt=$(sed -n 's/^counters: //p' "$shared/host-case-$n.log" 2>/dev/null | sed 's/rnr_naks_[a-z]*=0 //g; s/ dropped=[0-9]*//')
    printf '%-4s %-7s %-5s v%-3s %-20s %-34s %-8s %-8s %s\n' "$n" "$role" "$kind" "$fam" "$args" "$faults" "$grc" "${host_rc[$n]}" "$cnt"
done
echo

log "checking the capture"
cap_rc=0
/usr/bin/python3 "$here/icrc-check.py" "$shared/interop.pcap" --expect-src "$host4" --expect-src "$guest4" \
    --expect-src "$host6" --expect-src "$guest6" || cap_rc=$?
tshark -r "$shared/interop.pcap" -T fields -e ip.src -e ipv6.src -e infiniband.bth.opcode 2>/dev/null |
    awk '{print $1, $2}' | sort | uniq -c | sort -rn | head -30 || true
bad=$(tshark -r "$shared/interop.pcap" -Y '_ws.malformed || _ws.expert.severity >= "error"' \
    -o udp.ignore_ipv6_zero_checksum:TRUE --disable-protocol rpcordma 2>/dev/null | wc -l)
log "tshark: $bad malformed or error frames"
((bad == 0)) || cap_rc=1

if ((vm_rc == 0 && host_fail == 0 && cap_rc == 0)); then
    log "PASS: ${#cases[@]} cases, both sides, in $((SECONDS - t_start)) s"
else
    log "FAIL: guest rc=$vm_rc, host failures=$host_fail, capture rc=$cap_rc (logs in $shared)"
    tail -30 "$shared/run-vm.log" || true
    exit 1
fi
