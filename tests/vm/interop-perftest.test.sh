#!/usr/bin/env bash
# Wire interop with Linux rdma_rxe: the unmodified perftest 25.01 tools (ib_send_lat,
# ib_write_bw, ib_read_bw, ib_atomic_bw -A CMP_AND_SWAP / FETCH_AND_ADD) in a trixie guest
# against rxe-perftest (rxe-core on a UDP socket, perftest's out-of-band TCP exchange) on the
# host, each tool as server and as client, IPv4 and IPv6 GIDs.
#
# Data is checked, not just exit codes:
# - the tool runs with --payload_file_path (the pattern `rxe-perftest --payload-file` prints),
#   so its buffer content is known: rxe-perftest compares every READ completion and every
#   ib_send_lat receive with it, checks that an ib_write_bw client's writes (and nothing else)
#   landed in its target buffer, predicts every value an atomic returns (fetch-add: a
#   sequence per slot growing by the add value; compare-swap: matching compares swap, every
#   fourth compare is made to miss and must leave the slot alone) and, as atomic server, the
#   final value of every slot after the tool's fetch-adds (+1 each) / compare-swaps (0 → 0);
# - the tool's result table must show the requested size and iterations (as a bandwidth
#   server the tool prints the report rxe-perftest sent, i.e. our completion count), and as
#   bandwidth server rxe-perftest checks the size and iterations the tool client reports;
# - a capture on the bridge is checked frame by frame: tshark decodes it, and
#   tests/vm/icrc-check.py recomputes the ICRC of every frame each side sent; every opcode
#   the tests need must appear from both sides.
#
#   sudo tests/vm/interop-perftest.test.sh [--repeat N]
#
# --repeat N runs every case N times and prints a pass count per case. Runs in a network
# namespace of its own (tests/vm/net.sh exec). Prints "SKIP: <reason>" and exits 77 when not
# root or QEMU / the image is missing (a failure under CI=true). Env: VUR_INTEROP_ITERS (default 100), VUR_INTEROP_KEEP=1 keeps the artifacts,
# VUR_PERFTEST_CASES="N ..." runs only those cases, VUR_PERFTEST_DEBUG=1 uses a debug build of
# rxe-perftest (slower to drain its socket: expect more drops and retransmissions).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
iters=${VUR_INTEROP_ITERS:-100}
export VUR_BRIDGE=${VUR_BRIDGE:-vurbr0}
export VUR_MTU=9000
tap=vurtapP

log() { printf '[perftest %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_repeat_arg "$@"
vm_require interop-perftest dumpcap tshark

t_start=$SECONDS
# A release build: in the bandwidth cases the guest sends long back-to-back bursts (100
# outstanding 64 KiB READ responses in case 6), and an unoptimised engine drains its UDP
# socket slowly enough for the kernel to drop datagrams (recovered by retransmission, but
# slow under TCG; see VUR_PERFTEST_DEBUG).
if [[ ${VUR_PERFTEST_DEBUG:-} == 1 ]]; then
    profile=(); peer=$repo/target/debug/rxe-perftest
else
    profile=(--release); peer=$repo/target/release/rxe-perftest
fi
if ! vm_in_netns; then
    log "building rxe-perftest"
    (cd "$repo" && vur_cargo build -q "${profile[@]}" -p vur-interop --bin rxe-perftest)
fi
vm_netns perftest "$@"
[[ -x $peer ]] || { echo "FAIL: $peer not built"; exit 1; }

# Cases: number, role of the TOOL in the guest, test, IP family of the GIDs, size, then
# extra arguments for rxe-perftest after "|" (our offered MTU; the tool offers the guest's
# active MTU, 4096, and both use the smaller). The tool gets -A for atomics; -s everywhere.
cases=(
    "1 server send_lat 4 64 |-m 4096"
    "2 client send_lat 4 3000 |-m 1024"
    "3 server write_bw 4 65536 |-m 4096"
    "4 client write_bw 4 65536 |-m 4096"
    "5 client write_bw 4 500 |-m 1024"
    "6 server read_bw 4 65536 |-m 4096"
    "7 client read_bw 4 65536 |-m 1024"
    "8 server read_bw 4 100 |-m 4096"
    "9 server atomic_cs 4 8 |-m 4096"
    "10 client atomic_cs 4 8 |-m 4096"
    "11 server atomic_fa 4 8 |-m 4096"
    "12 client atomic_fa 4 8 |-m 4096"
    "13 server write_bw 6 512 |-m 1024"
    "14 client read_bw 6 4096 |-m 4096"
    "15 client send_lat 6 64 |-m 4096"
    "16 server atomic_fa 6 8 |-m 1024"
)
# VUR_PERFTEST_CASES="3 6" runs only those cases (the capture checks then only want the
# opcodes of a full run when every case ran).
vm_select_cases cases VUR_PERFTEST_CASES
# --repeat: every case N times (numbered N.r, each with its own port).
if ((repeat > 1)); then
    rep=()
    for c in "${cases[@]}"; do
        for ((r = 1; r <= repeat; r++)); do rep+=("${c%% *}.$r ${c#* }"); done
    done
    cases=("${rep[@]}")
fi
port_of() { # case id N or N.r -> a port of its own
    local n=${1%%.*} r=1
    [[ $1 != *.* ]] || r=${1#*.}
    echo $((18700 + 100 * (r - 1) + n))
}
tool_of() { # test name -> "tool binary + its test arguments"
    case $1 in
        send_lat) echo ib_send_lat ;;
        write_bw) echo ib_write_bw ;;
        read_bw) echo ib_read_bw ;;
        atomic_cs) echo "ib_atomic_bw -A CMP_AND_SWAP" ;;
        atomic_fa) echo "ib_atomic_bw -A FETCH_AND_ADD" ;;
    esac
}
ours_of() { # test name -> rxe-perftest test arguments
    case $1 in
        atomic_cs) echo "atomic_bw -A CMP_AND_SWAP" ;;
        atomic_fa) echo "atomic_bw -A FETCH_AND_ADD" ;;
        *) echo "$1" ;;
    esac
}

shared=$(mktemp -d "${TMPDIR:-/tmp}/vur-perftest.XXXXXX")
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

"$peer" --payload-file >"$shared/payload.txt"
"$here/net.sh" up "$tap"
dumpcap -q -P -i "$VUR_BRIDGE" -f "udp port 4791" -w "$shared/interop.pcap" 2>"$shared/dumpcap.log" &
cap_pid=$!

: >"$shared/cases"
for c in "${cases[@]}"; do
    read -r n role test fam size _ <<<"${c%%|*}"
    echo "$n $(port_of "$n") $role $fam $size $(tool_of "$test")" >>"$shared/cases"
done
cat >"$shared/interop-guest.sh" <<EOF
#!/bin/bash
# Runs inside the guest (tests/vm/interop-perftest.test.sh).
set -uo pipefail
iters=$iters host4=$host4
EOF
cat >>"$shared/interop-guest.sh" <<'EOF'
g4=$(vur-gid v4) || { echo "INTEROP-FAIL no IPv4 RoCE v2 GID"; exit 1; }
g6=''
for _ in $(seq 50); do g6=$(vur-gid v6) && break; sleep 0.2; done
[[ -n $g6 ]] || { echo "INTEROP-FAIL no IPv6 RoCE v2 GID"; exit 1; }
ibv_devinfo -d rxe0 | grep -E 'active_mtu|state'
fails=0
while read -r n port role fam size tool; do
    if [[ $fam == 6 ]]; then gid=$g6; else gid=$g4; fi
    # perftest's out-of-band TCP is IPv4 whatever the GID.
    cmd="$tool -d rxe0 -x $gid -F -n $iters -s $size -p $port --payload_file_path /vur/payload.txt"
    if [[ $role == server ]]; then
        # shellcheck disable=SC2086 # cmd is words
        timeout 60 $cmd </dev/null >/vur/case-$n.tool.log 2>&1 &
        pid=$!
        for _ in $(seq 200); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
        touch /vur/case-$n.ready
        rc=0; wait $pid || rc=$?
    else
        for _ in $(seq 600); do [[ -f /vur/case-$n.listening ]] && break; sleep 0.1; done
        # shellcheck disable=SC2086 # cmd is words
        rc=0; timeout 60 $cmd $host4 </dev/null >/vur/case-$n.tool.log 2>&1 || rc=$?
    fi
    echo "INTEROP case=$n tool=$role ipv$fam rc=$rc: $cmd"
    sed 's/^/    /' /vur/case-$n.tool.log
    echo "$rc" >/vur/case-$n.guest-rc
    ((rc == 0)) || fails=$((fails + 1))
done </vur/cases
exit $fails
EOF

log "booting guest"
"$here/run-vm.sh" --name interop --tap "$tap" --ip "$guest4/24" --ip6 "$guest6/64" --mtu 9000 \
    --scenario "$shared/interop-guest.sh" --shared "$shared" --images "$images" --timeout $((120 + 40 * ${#cases[@]})) \
    >"$shared/run-vm.log" 2>&1 &
vm_pid=$!

host_fail=0
declare -A host_rc
for c in "${cases[@]}"; do
    read -r n role test fam size _ <<<"${c%%|*}"
    extra=${c#*|}
    port=$(port_of "$n")
    # The RoCE address follows the GID family; the TCP exchange is always IPv4.
    if [[ $fam == 6 ]]; then local_ip=$host6; else local_ip=$host4; fi
    read -r -a ours <<<"$(ours_of "$test")"
    read -r -a more <<<"$extra"
    args=(--local-ip "$local_ip" "${ours[@]}" -p "$port" -n "$iters" -s "$size" --timeout 60 "${more[@]}")
    if [[ $role == server ]]; then
        for _ in $(seq 1200); do
            [[ -f $shared/case-$n.ready ]] && break
            kill -0 "$vm_pid" 2>/dev/null || break
            sleep 0.1
        done
        rc=0
        timeout 75 "$peer" "${args[@]}" --server "$guest4" >"$shared/host-case-$n.log" 2>&1 || rc=$?
    else
        timeout 75 "$peer" "${args[@]}" --listen "$host4" >"$shared/host-case-$n.log" 2>&1 &
        peer_pid=$!
        for _ in $(seq 100); do ss -ltn | grep -q "$host4:$port " && break; sleep 0.05; done
        touch "$shared/case-$n.listening"
        rc=0
        wait "$peer_pid" || rc=$?
        peer_pid=''
    fi
    host_rc[$n]=$rc
    ((rc == 0)) || host_fail=$((host_fail + 1))
    log "case $n: tool=$role $test ipv$fam -s $size $extra -> rxe-perftest rc=$rc"
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

# The tool's result table: the first numeric line after the "#bytes" header starts with
# bytes, iterations.
table() { awk '/#bytes/ { h = 1; next } h && $1 ~ /^[0-9]+$/ { print $1, $2; exit }' "$1" 2>/dev/null; }
echo
table_fail=0
declare -A pass total
printf '%-4s %-7s %-10s %-4s %-6s %-8s %-8s %-8s %-16s %-22s %s\n' case tool test ip size our-mtu tool-rc peer-rc 'tool bytes/iters' 'our compl/verified' 'rxe-perftest counters'
for c in "${cases[@]}"; do
    read -r n role test fam size _ <<<"${c%%|*}"
    extra=${c#*|}
    grc=$(cat "$shared/case-$n.guest-rc" 2>/dev/null || echo '?')
    tab=$(table "$shared/case-$n.tool.log")
    [[ -n $tab ]] || tab='- -'
    read -r tbytes titers <<<"$tab"
    if [[ $tbytes != "$size" || $titers != "$iters" ]]; then
        table_fail=$((table_fail + 1))
        tab="$tab (want $size $iters)"
        host_rc[$n]="${host_rc[$n]}*"
    fi
    res=$(sed -n 's/^RESULT .*completions=\([0-9]*\) verified=\([0-9]*\).*/\1\/\2/p' "$shared/host-case-$n.log" 2>/dev/null)
    cnt=$(sed -n 's/^counters: //p' "$shared/host-case-$n.log" 2>/dev/null | sed 's/rnr_naks_[a-z]*=0 //g; s/ dropped=[0-9]*//')
    printf '%-4s %-7s %-10s v%-3s %-6s %-8s %-8s %-8s %-16s %-22s %s\n' "$n" "$role" "$test" "$fam" "$size" "${extra#-m }" \
        "$grc" "${host_rc[$n]}" "$tab" "${res:--}" "$cnt"
    base=${n%%.*}
    total[$base]=$((${total[$base]:-0} + 1))
    [[ $grc != 0 || ${host_rc[$n]} != 0 ]] || pass[$base]=$((${pass[$base]:-0} + 1))
done
echo
if ((repeat > 1)); then
    echo "pass count per case ($repeat repetitions):"
    for b in $(printf '%s\n' "${!total[@]}" | sort -n); do echo "  case $b: ${pass[$b]:-0}/${total[$b]}"; done
    echo
fi

log "checking the capture"
cap_rc=0
expect=()
for c in "${cases[@]}"; do
    read -r _ _ _ fam _ <<<"$c"
    if [[ $fam == 6 ]]; then expect+=(--expect-src "$host6" --expect-src "$guest6"); else expect+=(--expect-src "$host4" --expect-src "$guest4"); fi
done
/usr/bin/python3 "$here/icrc-check.py" "$shared/interop.pcap" "${expect[@]}" || cap_rc=$?
tshark -r "$shared/interop.pcap" -T fields -E occurrence=f -e ip.src -e ipv6.src -e infiniband.bth.opcode 2>/dev/null |
    awk '{print $1, $2}' | sort | uniq -c | sort -k2,2 -k3,3n >"$shared/opcodes.txt" || true
cat "$shared/opcodes.txt"
# Opcodes each side must have sent (IBTA numbers; see the cases): SEND first/middle/last/only,
# WRITE first/middle/last/only, READ request, READ response first/middle/last/only, ACK,
# atomic ACK, CMP_SWAP, FETCH_ADD.
want_ops=(
    "$host4 0 1 2 4 6 7 8 12 13 14 15 17 18 19 20"
    "$guest4 0 1 2 4 6 7 8 10 12 13 14 15 16 17 18 19 20"
    "$host6 4 10 16 17 20"
    "$guest6 4 12 17 18"
)
[[ -z ${VUR_PERFTEST_CASES:-} ]] || want_ops=()
for w in "${want_ops[@]}"; do
    read -r src ops <<<"$w"
    for op in $ops; do
        if ! awk -v s="$src" -v o="$op" '$2 == s && $3 == o { f = 1 } END { exit !f }' "$shared/opcodes.txt"; then
            log "capture: no opcode $op from $src"
            cap_rc=1
        fi
    done
done
bad=$(tshark -r "$shared/interop.pcap" -Y '_ws.malformed || _ws.expert.severity >= "error"' \
    -o udp.ignore_ipv6_zero_checksum:TRUE --disable-protocol rpcordma 2>/dev/null | wc -l)
log "tshark: $bad malformed or error frames"
((bad == 0)) || cap_rc=1

if ((vm_rc == 0 && host_fail == 0 && table_fail == 0 && cap_rc == 0)); then
    log "PASS: ${#cases[@]} cases, both sides, in $((SECONDS - t_start)) s"
else
    log "FAIL: guest rc=$vm_rc, host failures=$host_fail, result tables wrong=$table_fail, capture rc=$cap_rc (logs in $shared)"
    tail -30 "$shared/run-vm.log" || true
    exit 1
fi
