#!/usr/bin/env bash
# Wire interop with Linux rdma_rxe: the unmodified ibv_{rc,uc,ud}_pingpong in a trixie guest
# against rxe-peer (rxe-core on a UDP socket) on the host side, each side as server and as
# client, IPv4 and IPv6 GIDs, path MTU 1024 and 4096. Every case checks data (rxe-peer compares
# every buffer that comes back byte for byte; the tool must exit 0), and a capture on the bridge
# is checked frame by frame: tshark decodes it, and tests/vm/icrc-check.py recomputes the ICRC
# of every frame each side sent with two implementations that share no code with rxe-core.
# RC cases also run under netem loss, reordering and duplication in each direction; they must
# complete byte-exact with the recovery visible in rxe-peer's counters.
#
#   sudo tests/vm/interop-pingpong.test.sh [--repeat N]
#
# --repeat N runs every fault case N times, each with its own netem seed, and prints a pass
# count per case (the other cases run once).
#
# How a run ends (docs/interop.md, "End of a lossy run"): the tool exits after its last
# completion, so rxe-peer stays on the wire until the guest reports the tool's exit code (it
# must answer a retransmission if its last ACK was lost), and when the tool's ACK of our last
# SEND was lost, that SEND ends with RetryExcErr after the tool exited 0 — the one accepted
# non-success, reported as such. A run that stops making progress fails within --stall
# seconds (10) saying what it waited for; the guest then stops the tool, prints rxe's
# counters, and keeps a capture of eth0 (and of ifb0, the ingress netem) of every fault run.
# One stall is expected: Linux rxe 6.12's completer can lose a SEND whose ACK arrives while
# it retransmits that SEND (docs/interop.md); tests/vm/rxe-stall-check.py must find that
# exact signature in the guest's captures, and the run is then counted as stalled by the rxe
# bug, not as passed and not as failed.
#
# Runs in a network namespace of its own (tests/vm/net.sh exec). Prints "SKIP: <reason>" and
# exits 77 when not root or QEMU / the image is missing (a failure under CI=true).
# Env: VUR_INTEROP_ITERS (default 100), VUR_INTEROP_CASES="N ..." runs only those cases,
# VUR_INTEROP_KEEP=1 keeps the artifacts.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
iters=${VUR_INTEROP_ITERS:-100}
export VUR_BRIDGE=${VUR_BRIDGE:-vurbr0}
export VUR_MTU=9000
tap=vurtapI
stall=10

log() { printf '[interop %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_repeat_arg "$@"
vm_require interop-pingpong dumpcap tshark
if ! vm_in_netns; then
    log "building rxe-peer"
    (cd "$repo" && vur_cargo build -q -p vur-interop --bin rxe-peer)
fi
vm_netns pingpong "$@"
peer=$repo/target/debug/rxe-peer
[[ -x $peer ]] || { echo "FAIL: $peer not built"; exit 1; }

t_start=$SECONDS
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
vm_select_cases cases VUR_INTEROP_CASES
# Runs: every case once, fault cases --repeat times. A run is "IDX N R SEED ..." with its own
# port and netem seed.
runs=()
for c in "${cases[@]}"; do
    read -r n _ _ _ faults _ <<<"$c"
    k=1
    [[ $faults == - ]] || k=$repeat
    for ((r = 1; r <= k; r++)); do runs+=("$((${#runs[@]} + 1)) $r $((1000 * r + n)) $c"); done
done
log "${#runs[@]} runs of ${#cases[@]} cases (fault cases x$repeat), $iters iterations each"

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

printf '%s\n' "${runs[@]}" >"$shared/runs"
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
hw=/sys/class/infiniband/rxe0/ports/1/hw_counters
counters() { # the rxe counters that are not zero, one line
    local f out=''
    for f in "$hw"/*; do [[ $(cat "$f") == 0 ]] || out+=" $(basename "$f")=$(cat "$f")"; done
    echo "${out:- (all zero)}"
}
fails=0
netem() { # SEED EGRESS|INGRESS netem parameters with commas for spaces, or "-"
    /usr/sbin/tc qdisc del dev eth0 root 2>/dev/null
    /usr/sbin/tc qdisc del dev eth0 ingress 2>/dev/null
    /usr/bin/ip link del ifb0 2>/dev/null
    [[ $2 == - ]] && return 0
    local seed=$1 eg=${2%%|*} in=${2#*|}
    if [[ $eg != - ]]; then
        # shellcheck disable=SC2086 # parameters are words
        /usr/sbin/tc qdisc add dev eth0 root netem ${eg//,/ } seed $seed || return 1
    fi
    if [[ $in != - ]]; then
        /usr/bin/ip link add ifb0 type ifb && /usr/bin/ip link set ifb0 up &&
            /usr/sbin/tc qdisc add dev eth0 handle ffff: ingress &&
            /usr/sbin/tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0 &&
            # shellcheck disable=SC2086 # parameters are words
            /usr/sbin/tc qdisc add dev ifb0 root netem ${in//,/ } seed $((seed + 1)) || return 1
    fi
}
# wait_for FILE TENTHS: bounded wait for a file the host writes.
wait_for() { local i; for ((i = 0; i < $2; i++)); do [[ -e $1 ]] && return 0; sleep 0.1; done; return 1; }
while read -r idx r seed n role kind fam faults args; do
    port=$((18600 + idx))
    id="run=$idx case=$n rep=$r"
    if [[ $fam == 6 ]]; then gid=$g6 host=$host6; else gid=$g4 host=$host4; fi
    if ! netem "$seed" "$faults"; then
        echo "INTEROP $id could not set up netem $faults"
        echo 99 >/vur/run-$idx.guest-rc.tmp && mv /vur/run-$idx.guest-rc.tmp /vur/run-$idx.guest-rc
        fails=$((fails + 1))
        continue
    fi
    caps=()
    if [[ $faults != - ]]; then
        tcpdump -q -n -i eth0 -w /vur/run-$idx.guest-eth0.pcap udp port 4791 2>/tmp/cap-eth0.err &
        caps+=($!)
        capifs=(eth0)
        if /usr/bin/ip link show ifb0 >/dev/null 2>&1; then
            tcpdump -q -n -i ifb0 -w /vur/run-$idx.guest-ifb0.pcap udp port 4791 2>/tmp/cap-ifb0.err &
            caps+=($!)
            capifs+=(ifb0)
        fi
        # tcpdump says "listening on IF" once its socket is attached: from then on it sees
        # every packet (rxe-stall-check reads the whole capture)
        for c in "${capifs[@]}"; do
            for ((w = 0; w < 300; w++)); do
                grep -q 'listening on' "/tmp/cap-$c.err" 2>/dev/null && break
                sleep 0.1
            done
            grep -q 'listening on' "/tmp/cap-$c.err" ||
                echo "INTEROP $id tcpdump on $c did not attach within 30 s: $(cat "/tmp/cap-$c.err")"
        done
    fi
    before=$(counters)
    cmd="ibv_${kind}_pingpong -d rxe0 -g $gid -n $iters -p $port $args"
    rc=0 why=''
    if [[ $role == client ]] && ! wait_for /vur/run-$idx.listening 600; then
        rc=97 why="rxe-peer never listened"
    else
        # shellcheck disable=SC2086 # cmd is words
        if [[ $role == client ]]; then set -- $cmd $host; else set -- $cmd; fi
        timeout 120 "$@" </dev/null >/tmp/run-$idx.log 2>&1 &
        pid=$!
        if [[ $role == server ]]; then
            for _ in $(seq 200); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
            touch /vur/run-$idx.ready
        fi
        # The tool must end by itself; once rxe-peer has finished it gets 5 s more.
        grace=0
        while kill -0 $pid 2>/dev/null; do
            if [[ -e /vur/run-$idx.host-rc ]]; then
                grace=$((grace + 1))
                if ((grace > 50)); then
                    why="tool still running 5 s after rxe-peer finished (rxe-peer rc $(cat /vur/run-$idx.host-rc))"
                    kill $pid 2>/dev/null
                    break
                fi
            fi
            sleep 0.1
        done
        wait $pid || rc=$?
        [[ -z $why ]] || rc=96
    fi
    echo "$rc" >/vur/run-$idx.guest-rc.tmp && mv /vur/run-$idx.guest-rc.tmp /vur/run-$idx.guest-rc
    wait_for /vur/run-$idx.host-rc 300 || why+=" (rxe-peer never finished)"
    for p in "${caps[@]}"; do kill -INT $p 2>/dev/null; wait $p 2>/dev/null; done
    touch /vur/run-$idx.guest-done
    stats=''
    [[ $faults == - ]] || stats=$(/usr/sbin/tc -s qdisc show | awk '/qdisc netem/ {d = $2 " " $5} /Sent/ && d {print d ": sent " $4 " pkts, dropped " $7; d = ""}' | tr '\n' ';')
    netem 0 -
    echo "INTEROP $id tool=$role kind=$kind ipv$fam faults=$faults rc=$rc ${why:+($why) }: $cmd"
    [[ -z $stats ]] || echo "    netem: $stats"
    sed 's/^/    /' /tmp/run-$idx.log
    if ((rc != 0)); then
        echo "    rxe counters before: $before"
        echo "    rxe counters after:  $(counters)"
        fails=$((fails + 1))
    fi
done </vur/runs
# The host side judges every run (it knows what a stall was); the guest only reports.
echo "INTEROP guest: $fails run(s) with a non-zero tool exit"
exit 0
EOF

log "booting guest"
"$here/run-vm.sh" --name interop --tap "$tap" --ip "$guest4/24" --ip6 "$guest6/64" --mtu 9000 \
    --scenario "$shared/interop-guest.sh" --shared "$shared" --images "$images" \
    --timeout $((120 + 40 * ${#runs[@]})) >"$shared/run-vm.log" 2>&1 &
vm_pid=$!

# wait_file FILE TENTHS: bounded wait for a file the guest writes, while the guest lives.
wait_file() {
    local i
    for ((i = 0; i < $2; i++)); do
        [[ -e $1 ]] && return 0
        kill -0 "$vm_pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

declare -A host_rc known
for run in "${runs[@]}"; do
    read -r idx r seed n role kind fam faults args <<<"$run"
    port=$((18600 + idx))
    # The tools listen for the out-of-band exchange on IPv4 only (getaddrinfo(NULL) picks
    # 0.0.0.0 first), whatever the GID: the exchange goes to the guest's IPv4 address.
    if [[ $fam == 6 ]]; then local_ip=$host6; else local_ip=$host4; fi
    # shellcheck disable=SC2206 # args are words
    pargs=(--local-ip "$local_ip" "$kind" -p "$port" -n "$iters" $args --timeout 120 --stall "$stall"
        --tool-done "$shared/run-$idx.guest-rc")
    rc=0
    if [[ $role == server ]]; then
        # Boot (first run) or the previous run's end in the guest, then the tool's listen.
        if wait_file "$shared/run-$idx.ready" 1800; then
            timeout 150 "$peer" "${pargs[@]}" --server "$guest4" >"$shared/host-run-$idx.log" 2>&1 || rc=$?
        else
            echo "the tool never listened (guest alive: $(kill -0 "$vm_pid" 2>/dev/null && echo yes || echo no))" >"$shared/host-run-$idx.log"
            rc=97
        fi
    else
        timeout 150 "$peer" "${pargs[@]}" >"$shared/host-run-$idx.log" 2>&1 &
        peer_pid=$!
        for _ in $(seq 100); do ss -ltn | grep -q ":$port " && break; sleep 0.05; done
        touch "$shared/run-$idx.listening"
        wait "$peer_pid" || rc=$?
        peer_pid=''
    fi
    echo "$rc" >"$shared/run-$idx.host-rc"
    # Faults must show in our counters: retransmissions or NAKs for loss and reordering,
    # duplicates for duplication.
    counters=$(grep '^counters:' "$shared/host-run-$idx.log" || true)
    get() { sed -n "s/.* $1=\([0-9]*\).*/\1/p" <<<" $counters"; }
    # Every datagram from rxe had its ICRC checked (IPv4: solved for the unseen IP ID) and
    # none failed: nothing on this wire corrupts.
    if ((rc == 0)) && [[ $(get rx_icrc_bad) != 0 || $(get rx_icrc_ok) == 0 ]]; then
        log "run $idx (case $n): ICRC check: rx_icrc_ok=$(get rx_icrc_ok) rx_icrc_bad=$(get rx_icrc_bad)"
        rc=95
    fi
    if ((rc == 0)) && [[ $faults != - ]]; then
        recovered=$(($(get retransmits) + $(get naks_sent) + $(get naks_received) + $(get duplicates)))
        if [[ $faults == *duplicate* ]] && (($(get duplicates) == 0)); then
            log "run $idx (case $n): duplication left no trace in the counters"
            rc=98
        elif ((recovered == 0)); then
            log "run $idx (case $n): faults $faults left no trace in the counters"
            rc=98
        fi
    fi
    # The tool's exit code is the other half of the verdict.
    wait_file "$shared/run-$idx.guest-rc" 100 || true
    grc=$(cat "$shared/run-$idx.guest-rc" 2>/dev/null || echo '?')
    # A stall where the tool stopped sending may be the rxe completer bug of docs/interop.md
    # ("A Linux rxe 6.12 requester that never completes a SEND"): accepted only when the
    # guest's own captures show its exact signature.
    if ((rc != 0)) && [[ $faults != - && $grc == 96 ]] &&
        grep -q "stalled: .* waiting for the tool's SEND #[0-9]*; counters" "$shared/host-run-$idx.log"; then
        wait_file "$shared/run-$idx.guest-done" 100 || true
        ifb=()
        [[ ! -f $shared/run-$idx.guest-ifb0.pcap ]] || ifb=("$shared/run-$idx.guest-ifb0.pcap")
        if /usr/bin/python3 "$here/rxe-stall-check.py" --tool "$guest4" "$shared/run-$idx.guest-eth0.pcap" "${ifb[@]}" \
            >"$shared/run-$idx.stall-check" 2>&1; then
            known[$idx]=1
        fi
        sed 's/^/    /' "$shared/run-$idx.stall-check" >>"$shared/host-run-$idx.log"
    fi
    host_rc[$idx]=$rc
    log "run $idx: case $n rep $r tool=$role $kind ipv$fam faults=$faults $args -> rxe-peer rc=$rc, tool rc=$grc"
    sed 's/^/    /' "$shared/host-run-$idx.log"
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
declare -A pass total rxebug
fail_runs=0
printf '%-4s %-4s %-4s %-7s %-5s %-4s %-20s %-34s %-7s %-7s %s\n' run case rep tool kind ip args faults tool-rc peer-rc 'end / rxe-peer counters'
for run in "${runs[@]}"; do
    read -r idx r seed n role kind fam faults args <<<"$run"
    grc=$(cat "$shared/run-$idx.guest-rc" 2>/dev/null || echo '?')
    cnt=$(sed -n 's/^counters: //p' "$shared/host-run-$idx.log" 2>/dev/null | sed 's/rnr_naks_[a-z]*=0 //g; s/ dropped=[0-9]*//; s/ rx_icrc_bad=0//')
    endl=$(sed -n 's/^end: \([a-z]*\).*/\1/p' "$shared/host-run-$idx.log" 2>/dev/null)
    [[ $endl != last ]] || endl='last-SEND-after-tool-left'
    [[ -z ${known[$idx]:-} ]] || endl='rxe-completer-bug'
    printf '%-4s %-4s %-4s %-7s %-5s v%-3s %-20s %-34s %-7s %-7s %s\n' "$idx" "$n" "$r" "$role" "$kind" "$fam" "$args" "$faults" "$grc" "${host_rc[$idx]}" "${endl:-} $cnt"
    total[$n]=$((${total[$n]:-0} + 1))
    if [[ $grc == 0 && ${host_rc[$idx]} == 0 ]]; then
        pass[$n]=$((${pass[$n]:-0} + 1))
    elif [[ -n ${known[$idx]:-} ]]; then
        rxebug[$n]=$((${rxebug[$n]:-0} + 1))
    else
        fail_runs=$((fail_runs + 1))
    fi
done
echo
if ((repeat > 1)); then
    echo "pass count per case ($repeat repetitions of each fault case):"
    for c in "${cases[@]}"; do
        read -r n role kind fam faults _ <<<"$c"
        b=''
        [[ -z ${rxebug[$n]:-} ]] || b=" + ${rxebug[$n]} stalled by the rxe completer bug (docs/interop.md)"
        printf '  case %-3s %-7s %-3s v%s %-34s %s/%s%s\n' "$n" "$role" "$kind" "$fam" "$faults" "${pass[$n]:-0}" "${total[$n]}" "$b"
    done
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
    awk '{print $1, $2}' | sort | uniq -c | sort -rn | head -30 || true
bad=$(tshark -r "$shared/interop.pcap" -Y '_ws.malformed || _ws.expert.severity >= "error"' \
    -o udp.ignore_ipv6_zero_checksum:TRUE --disable-protocol rpcordma 2>/dev/null | wc -l)
log "tshark: $bad malformed or error frames"
((bad == 0)) || cap_rc=1

if ((vm_rc == 0 && fail_runs == 0 && cap_rc == 0)); then
    nbug=0
    for k in "${rxebug[@]}"; do nbug=$((nbug + k)); done
    log "PASS: ${#runs[@]} runs of ${#cases[@]} cases, both sides ($nbug stalled by the documented rxe completer bug), in $((SECONDS - t_start)) s"
else
    log "FAIL: guest rc=$vm_rc, failed runs=$fail_runs, capture rc=$cap_rc (logs and guest captures in $shared)"
    tail -30 "$shared/run-vm.log" || true
    exit 1
fi
