#!/usr/bin/env bash
# Wire interop with Linux rdma_rxe: the unmodified ibv_{rc,uc,ud}_pingpong in a trixie guest
# against rxe-peer (rxe-core on a UDP socket) on the host, each side as server and as client,
# IPv4 and IPv6 GIDs, path MTU 1024 and 4096. Every case checks data (rxe-peer compares every
# buffer that comes back byte for byte; the tool must exit 0), and a capture on the bridge is
# checked frame by frame: tshark decodes it, and tests/vm/icrc-check.py recomputes the ICRC of
# every frame each side sent with two implementations that share no code with rxe-core.
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
host4=10.77.0.1 guest4=10.77.0.2 host6=fd77::1 guest6=fd77::2

log() { printf '[interop %s] %s\n' "$(date +%T)" "$*"; }
missing() {
    if [[ ${CI:-} == true ]]; then
        echo "FAIL: $* (CI=true: prerequisites must be installed)"
        exit 1
    fi
    echo "SKIP: $*"
    exit 0
}
[[ $(id -u) -eq 0 ]] || missing "interop-pingpong needs root (tap device, bridge)"
command -v qemu-system-x86_64 >/dev/null || missing "interop-pingpong: qemu-system-x86_64 not installed (images/host-setup.sh)"
command -v dumpcap >/dev/null || missing "interop-pingpong: dumpcap not installed (images/host-setup.sh)"
images=${VUR_IMAGES:-$("$repo/images/build.sh" --print-dir)}
[[ -f $images/vmlinuz && -f $images/initrd.img ]] || missing "interop-pingpong: no guest image in $images (sudo images/build.sh)"

t_start=$SECONDS
log "building rxe-peer"
(cd "$repo" && cargo build -q -p vur-interop --bin rxe-peer)
peer=$repo/target/debug/rxe-peer

# Cases: number, role of the TOOL in the guest, transport, IP family, tool arguments.
# rxe-peer takes the other role with the same size and MTU.
cases=(
    "1 server rc 4 -s 4096 -m 1024"
    "2 client rc 4 -s 4096 -m 1024"
    "3 server rc 4 -s 64 -m 1024"
    "4 server rc 4 -s 12000 -m 4096"
    "5 client rc 4 -s 12000 -m 4096"
    "6 server uc 4 -s 4096 -m 1024"
    "7 client uc 4 -s 4096 -m 1024"
    "8 server ud 4 -s 1024"
    "9 client ud 4 -s 2048"
    "10 server rc 6 -s 4096 -m 1024"
    "11 client rc 6 -s 4096 -m 1024"
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
while read -r n role kind fam args; do
    port=$((18600 + n))
    if [[ $fam == 6 ]]; then gid=$g6 host=$host6; else gid=$g4 host=$host4; fi
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
    echo "INTEROP case=$n tool=$role kind=$kind ipv$fam rc=$rc: $cmd"
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
    read -r n role kind fam args <<<"$c"
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
    host_rc[$n]=$rc
    ((rc == 0)) || host_fail=$((host_fail + 1))
    log "case $n: tool=$role $kind ipv$fam $args -> rxe-peer rc=$rc"
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
printf '%-4s %-7s %-5s %-4s %-22s %-9s %-9s\n' case tool kind ip args tool-rc peer-rc
for c in "${cases[@]}"; do
    read -r n role kind fam args <<<"$c"
    grc=$(cat "$shared/case-$n.guest-rc" 2>/dev/null || echo '?')
    printf '%-4s %-7s %-5s v%-3s %-22s %-9s %-9s\n' "$n" "$role" "$kind" "$fam" "$args" "$grc" "${host_rc[$n]}"
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
