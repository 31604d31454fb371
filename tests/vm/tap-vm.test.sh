#!/usr/bin/env bash
# The eBPF tcx tap (vhost-user-rdma tap) inside the trixie guest (kernel 6.12: tcx and netkit),
# on Linux rxe's own traffic — the host-built binary, passed in through /vur:
#   1. eth0: the tap on the guest's eth0 while ibv_rc_pingpong on rxe0 (Linux rxe) talks to
#      rxe-peer on the host bridge. Egress frames = rxe0's sent_pkts, ingress frames = its
#      rcvd_pkts (hw_counters), and = what rxe-peer received / sent.
#   2. netkit: a netkit pair in L2 mode (nk0 here, nk1 in a guest namespace), Linux rxe on nk0
#      (rxenk), rxe-peer in the namespace on nk1, ibv_rc_pingpong over rxenk; a tap on nk0 (the
#      primary) and one on nk1 (the peer, in its namespace); then ib_write_bw, ib_read_bw and
#      ib_atomic_bw (both kinds) on rxenk against rxe-perftest on nk1. Frame counts against
#      rxenk's hw_counters and the peers', and every opcode those tools use is there.
# On the host, afterwards: tshark decodes every frame of both captures as RoCE, none
# malformed; every ICRC is right (tests/vm/icrc-check.py); the headers the kernel program
# parsed (--decode) equal tshark's decoding field by field (tests/vm/tap-headers.py).
#
#   sudo tests/vm/tap-vm.test.sh
#
# Runs in a network namespace of its own (tests/vm/net.sh exec). Prints "SKIP: <reason>" and
# exits 77 without root, QEMU, the guest image, clang, tshark or python3 (a failure under
# CI=true). Env: VUR_TAP_VM_ITERS (pingpong iterations, default 200), VUR_IMAGES,
# VUR_TAP_PROFILE=debug uses the debug binaries (default release, as tests/run.sh builds).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
iters=${VUR_TAP_VM_ITERS:-200}
profile=${VUR_TAP_PROFILE:-release}
tap=vurtapT

log() { printf '[tap-vm %s] %s\n' "$(date +%T)" "$*"; }
fail() { printf '[tap-vm %s] FAIL: %s\n' "$(date +%T)" "$*"; exit 1; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require tap-vm clang tshark /usr/bin/python3
[[ $iters =~ ^[1-9][0-9]*$ ]] || fail "VUR_TAP_VM_ITERS=$iters: want a positive number"
if ! vm_in_netns; then
    t=$SECONDS
    flag=--release
    [[ $profile == debug ]] && flag=
    log "building vhost-user-rdma and rxe-peer ($profile)"
    # shellcheck disable=SC2086 # $flag is empty or one word
    (cd "$repo" && vur_cargo build -q $flag -p vhost-user-rdma -p vur-interop --bins)
    log "built in $((SECONDS - t)) s"
fi
vm_netns tap-vm "$@"

bin=$repo/target/$profile/vhost-user-rdma
peer=$repo/target/$profile/rxe-peer
[[ -x $bin && -x $peer && -x ${peer%/*}/rxe-perftest ]] || fail "$bin, $peer or rxe-perftest not built"
t_start=$SECONDS
shared=$(mktemp -d "${TMPDIR:-/tmp}/vur-tap-vm.XXXXXX")
vm_pid=''
cleanup() {
    local rc=$? p
    # Only children still running: a PID of one that already ended may belong to another
    # process by now.
    for p in $(jobs -pr); do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    "$here/net.sh" down "$tap" >/dev/null 2>&1 || true
    if ((rc == 0)); then rm -rf "$shared"; else log "artifacts kept in $shared"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$here/net.sh" up "$tap"
cp "$bin" "$peer" "${peer%/*}/rxe-perftest" "$shared/"
"${peer%/*}/rxe-perftest" --payload-file >"$shared/payload.txt"

cat >"$shared/tap-vm-guest.sh" <<EOF
#!/bin/bash
# Runs inside the guest (tests/vm/tap-vm.test.sh).
set -uo pipefail
iters=$iters
host=$host4
EOF
cat >>"$shared/tap-vm-guest.sh" <<'EOF'
say() { echo "TAPVM $*"; }
bad() { echo "TAPVM-FAIL $*"; exit 1; }
# wait_for FILE TENTHS
wait_for() { local i; for ((i = 0; i < $2; i++)); do [[ -e $1 ]] && return 0; sleep 0.1; done; return 1; }
counters() { local d=/sys/class/infiniband/$1/ports/1/hw_counters; echo "$(cat $d/sent_pkts) $(cat $d/rcvd_pkts)"; }

# start_tap NAME IF [NETNS]: the host-built tap on IF (in namespace NETNS), pcapng + --decode
# in /vur; waits (<= 20 s) until it is attached. Sets $tap_pid.
start_tap() {
    local in=()
    [[ -z ${3:-} ]] || in=(ip netns exec "$3")
    "${in[@]}" /vur/vhost-user-rdma tap --iface "$2" --write "/vur/$1.pcapng" --decode "/vur/$1.txt" 2>"/vur/$1.err" &
    tap_pid=$!
    for _ in $(seq 200); do
        grep -qs '^tap: attached' "/vur/$1.err" && return 0
        kill -0 $tap_pid 2>/dev/null || break
        sleep 0.1
    done
    cat "/vur/$1.err"
    bad "$1: the tap did not attach to $2 within 20 s"
}
# wait_frames NAME PID N: until the tap has written N frames (its progress line on SIGUSR1),
# at most 20 s: a frame rxe counted has passed the hook, but may still wait in the tap's ring.
wait_frames() {
    local got=0
    for _ in $(seq 200); do
        kill -USR1 "$2"
        sleep 0.1
        got=$(sed -n 's/^tap: progress: \([0-9]*\) frames written.*/\1/p' "/vur/$1.err" | tail -1)
        ((${got:-0} >= $3)) && return 0
    done
    say "$1: the tap wrote ${got:-0} frames within 20 s, want $3"
}
# frames BEFORE AFTER: the packets rxe sent and received between two `counters` readings.
frames() {
    local s0 r0 s1 r1
    read -r s0 r0 <<<"$1"
    read -r s1 r1 <<<"$2"
    echo $((s1 - s0 + r1 - r0))
}
# stop_tap NAME [PID]: SIGINT, at most 10 s to exit 0.
stop_tap() {
    local tap_pid=${2:-$tap_pid}
    kill -INT $tap_pid
    for _ in $(seq 100); do kill -0 $tap_pid 2>/dev/null || break; sleep 0.1; done
    kill -0 $tap_pid 2>/dev/null && { kill -9 $tap_pid; bad "$1: the tap still runs 10 s after SIGINT"; }
    wait $tap_pid || { cat "/vur/$1.err"; bad "$1: the tap failed"; }
    say "$1: $(grep '^tap: done' "/vur/$1.err")"
}

say "kernel $(uname -r); $(ldd --version | head -1)"
/vur/vhost-user-rdma tap --version || bad "the host-built tap does not run here"

# --- 1. eth0, Linux rxe (rxe0) against rxe-peer on the host ---------------------------------
gid=$(vur-gid v4) || bad "no IPv4 RoCE v2 GID on rxe0"
wait_for /vur/eth0.listening 600 || bad "rxe-peer on the host never listened"
start_tap eth0 eth0
before=$(counters rxe0)
rc=0
timeout 120 ibv_rc_pingpong -d rxe0 -g "$gid" -n "$iters" -s 4096 -m 1024 "$host" >/tmp/eth0.log 2>&1 || rc=$?
echo $rc >/vur/eth0.tool-rc.tmp && mv /vur/eth0.tool-rc.tmp /vur/eth0.tool-rc
wait_for /vur/eth0.host-rc 300 || say "eth0: rxe-peer on the host did not finish within 30 s"
after=$(counters rxe0)
wait_frames eth0 "$tap_pid" "$(frames "$before" "$after")"
stop_tap eth0
echo "$before $after" >/vur/eth0.counters
sed 's/^/    /' /tmp/eth0.log
say "eth0: ibv_rc_pingpong rc=$rc, rxe0 sent_pkts/rcvd_pkts before and after: $(cat /vur/eth0.counters)"
((rc == 0)) || bad "eth0: ibv_rc_pingpong failed"

# --- 2. netkit in L2 mode, Linux rxe on nk0, rxe-peer in a namespace on nk1 -------------------
ip link add nk0 type netkit mode l2 peer name nk1 || bad "cannot create a netkit pair"
ip netns add nkpeer
ip link set nk1 netns nkpeer
ip addr add 10.77.10.1/24 dev nk0
ip link set nk0 up
ip -n nkpeer link set lo up
ip -n nkpeer addr add 10.77.10.2/24 dev nk1
ip -n nkpeer link set nk1 up
say "netkit: $(ip -d link show nk0 | grep -o 'netkit.*' | head -1)"
rdma link add rxenk type rxe netdev nk0 || bad "cannot add rxe on nk0"
gid=''
for _ in $(seq 50); do gid=$(vur-gid v4 rxenk 2>/dev/null) && break; sleep 0.1; done
[[ -n $gid ]] || bad "no IPv4 RoCE v2 GID on rxenk within 5 s"
ping -c1 -W2 10.77.10.2 >/dev/null || bad "no answer from 10.77.10.2 over netkit"
start_tap netkit-peer nk1 nkpeer
peer_tap=$tap_pid
start_tap netkit nk0
before=$(counters rxenk)
rm -f /tmp/nk.tool-rc
ip netns exec nkpeer timeout 150 /vur/rxe-peer --local-ip 10.77.10.2 rc -n "$iters" -s 4096 -m 1024 \
    --tool-done /tmp/nk.tool-rc >/vur/netkit.peer 2>&1 &
ppid=$!
for _ in $(seq 100); do ip netns exec nkpeer ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
rc=0
timeout 120 ibv_rc_pingpong -d rxenk -g "$gid" -n "$iters" -s 4096 -m 1024 10.77.10.2 >/tmp/nk.log 2>&1 || rc=$?
echo $rc >/tmp/nk.tool-rc
prc=0
wait $ppid || prc=$?
sed 's/^/    /' /tmp/nk.log
say "netkit: ibv_rc_pingpong rc=$rc, rxe-peer rc=$prc"
((rc == 0 && prc == 0)) || { cat /vur/netkit.peer; bad "netkit: pingpong failed"; }
# RDMA WRITE, READ and both atomics of Linux rxe: perftest against rxe-perftest on nk1.
i=0
for t in "write_bw|ib_write_bw|8192" "read_bw|ib_read_bw|8192" "atomic_bw -A FETCH_AND_ADD|ib_atomic_bw -A FETCH_AND_ADD|8" \
    "atomic_bw -A CMP_AND_SWAP|ib_atomic_bw -A CMP_AND_SWAP|8"; do
    IFS='|' read -r ours tool size <<<"$t"
    i=$((i + 1))
    port=$((18800 + i))
    # shellcheck disable=SC2086 # $ours is words
    ip netns exec nkpeer timeout 90 /vur/rxe-perftest --local-ip 10.77.10.2 $ours -p $port -n 50 -s $size \
        -m 1024 --timeout 60 >/vur/netkit.perftest-$i 2>&1 &
    ppid=$!
    for _ in $(seq 100); do ip netns exec nkpeer ss -ltn | grep -q ":$port " && break; sleep 0.1; done
    rc=0
    # shellcheck disable=SC2086 # $tool is words
    timeout 90 $tool -d rxenk -x "$gid" -F -n 50 -s $size -p $port --payload_file_path /vur/payload.txt \
        10.77.10.2 </dev/null >/tmp/nk-$i.log 2>&1 || rc=$?
    prc=0
    wait $ppid || prc=$?
    say "netkit: $tool -s $size rc=$rc, rxe-perftest rc=$prc: $(grep -m1 '^packets:' /vur/netkit.perftest-$i)"
    ((rc == 0 && prc == 0)) || { cat /tmp/nk-$i.log /vur/netkit.perftest-$i; bad "netkit: $tool failed"; }
done
after=$(counters rxenk)
wait_frames netkit "$tap_pid" "$(frames "$before" "$after")"
wait_frames netkit-peer "$peer_tap" "$(frames "$before" "$after")"
stop_tap netkit
stop_tap netkit-peer $peer_tap
echo "$before $after" >/vur/netkit.counters
say "netkit: rxenk sent_pkts/rcvd_pkts before and after: $(cat /vur/netkit.counters)"
say "done"
EOF

log "host: rxe-peer on $host4 listening for the guest's ibv_rc_pingpong ($iters x 4096 B)"
timeout 300 "$peer" --local-ip "$host4" rc -n "$iters" -s 4096 -m 1024 --timeout 120 \
    --tool-done "$shared/eth0.tool-rc" >"$shared/eth0.peer" 2>&1 &
peer_pid=$!
for _ in $(seq 100); do ss -ltn | grep -q ':18515 ' && break; sleep 0.1; done
ss -ltn | grep -q ':18515 ' || fail "rxe-peer did not listen on 18515 within 10 s"
touch "$shared/eth0.listening"

log "booting guest (image $images)"
"$here/run-vm.sh" --name tapvm --tap "$tap" --ip "$guest4/24" --ip6 "$guest6/64" --mem 1024 \
    --scenario "$shared/tap-vm-guest.sh" --shared "$shared" --images "$images" --timeout 400 \
    >"$shared/run-vm.log" 2>&1 &
vm_pid=$!
# rxe-peer ends when the guest's pingpong is done; if the guest ends first (a failure there),
# stop waiting for it.
while kill -0 "$peer_pid" 2>/dev/null && kill -0 "$vm_pid" 2>/dev/null; do sleep 0.2; done
kill -0 "$peer_pid" 2>/dev/null && kill "$peer_pid"
peer_rc=0
wait "$peer_pid" || peer_rc=$?
echo "$peer_rc" >"$shared/eth0.host-rc"
vm_rc=0
wait "$vm_pid" || vm_rc=$?
grep -a '^TAPVM\|^    ' "$shared/tapvm.console.log" | tr -d '\r' || true
if ((vm_rc != 0)); then
    tail -20 "$shared/run-vm.log"
    fail "guest scenario rc=$vm_rc (console: $shared/tapvm.console.log)"
fi
((peer_rc == 0)) || { cat "$shared/eth0.peer"; fail "rxe-peer on the host: rc $peer_rc"; }
grep -E '^verified|^counters' "$shared/eth0.peer" | sed 's/^/  [host rxe-peer] /'

# fields FILE [-Y FILTER] FIELDS...: tshark's field output, one line per frame.
count() {
    local f=$1
    shift
    tshark -n -r "$f" "$@" -T fields -e frame.number 2>/dev/null | wc -l
}
# check NAME IF SRC_A SRC_B PEERS [COUNTERS]: the capture against the rxe counters (of NAME,
# or of COUNTERS: then the tap is on the far side, and its directions are swapped) and the
# packets the host-built peers sent and received (their logs: the files PEERS names).
check() {
    local name=$1 ifname=$2 a=$3 b=$4 peers=$5 s0 r0 s1 r1 eg in total roce mal psent precv
    read -r s0 r0 s1 r1 <"$shared/${6:-$name}.counters"
    [[ -z ${6:-} ]] || read -r r0 s0 r1 s1 <"$shared/$6.counters"
    eg=$(count "$shared/$name.pcapng" -Y 'frame.interface_id == 1')
    in=$(count "$shared/$name.pcapng" -Y 'frame.interface_id == 0')
    # rxe-peer: "...; N packets sent, M received"; rxe-perftest: "packets: sent=N received=M".
    # shellcheck disable=SC2086 # $peers is a glob
    read -r psent precv < <(sed -n -e 's/.*; \([0-9]*\) packets sent, \([0-9]*\) received.*/\1 \2/p' \
        -e 's/^packets: sent=\([0-9]*\) received=\([0-9]*\).*/\1 \2/p' $peers | awk '{s += $1; r += $2} END {print s + 0, r + 0}')
    log "$name: tap on $ifname: egress $eg frames, ingress $in; rxe sent_pkts +$((s1 - s0)), rcvd_pkts +$((r1 - r0)); the peers on the other side sent $psent, received $precv"
    ((eg == s1 - s0 && in == r1 - r0)) || fail "$name: frame counts differ from rxe's hw_counters"
    if [[ -z ${6:-} ]]; then
        ((eg == precv && in == psent)) || fail "$name: frame counts differ from rxe-peer's"
    else
        ((eg == psent && in == precv)) || fail "$name: frame counts differ from rxe-peer's"
    fi
    total=$(count "$shared/$name.pcapng")
    roce=$(count "$shared/$name.pcapng" -Y infiniband)
    mal=$(count "$shared/$name.pcapng" -Y _ws.malformed)
    log "$name: $total frames, $roce decode as RoCE, $mal malformed"
    ((total > 0 && roce == total && mal == 0)) || fail "$name: not every frame is well-formed RoCE"
    [[ $(tshark -n -r "$shared/$name.pcapng" -T fields -e frame.interface_name 2>/dev/null | sort -u | tr '\n' ' ') == "$ifname " ]] ||
        fail "$name: frames on other interfaces than $ifname"
    tshark -r "$shared/$name.pcapng" -w "$shared/$name.pcap" -F pcap 2>/dev/null || fail "tshark could not convert $name.pcapng"
    /usr/bin/python3 "$here/icrc-check.py" "$shared/$name.pcap" --expect-src "$a" --expect-src "$b" |
        sed "s/^/  [$name icrc] /"
    [[ ${PIPESTATUS[0]} == 0 ]] || fail "$name: ICRC check failed"
    /usr/bin/python3 "$here/tap-headers.py" tshark "$shared/$name.txt" "$shared/$name.pcapng" |
        sed "s/^/  [$name headers] /"
    [[ ${PIPESTATUS[0]} == 0 ]] || fail "$name: the kernel's parse differs from tshark's"
}
check eth0 eth0 "$guest4" "$host4" "$shared/eth0.peer"
check netkit nk0 10.77.10.1 10.77.10.2 "$shared/netkit.peer $shared/netkit.perftest-*"
check netkit-peer nk1 10.77.10.1 10.77.10.2 "$shared/netkit.peer $shared/netkit.perftest-*" netkit
ops=$(tshark -n -r "$shared/netkit.pcapng" -T fields -e infiniband.bth.opcode 2>/dev/null | sort -n | uniq -c | awk '{printf "%s:%s ", $2, $1}')
log "netkit: opcodes (opcode:frames) $ops"
for op in 0 1 2 6 7 8 12 13 14 15 17 18 19 20; do # SEND F/M/L, WRITE F/M/L, READ req + resp F/M/L, ACK, ATOMIC ACK, CMP_SWAP, FETCH_ADD
    [[ " $ops" == *" $op:"* ]] || fail "netkit: opcode $op of Linux rxe missing from the capture"
done
log "PASS in $((SECONDS - t_start)) s"
