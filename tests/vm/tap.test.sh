#!/usr/bin/env bash
# The eBPF tcx tap (vhost-user-rdma tap, docs/tap.md) on a veth pair between two network
# namespaces, with two rxe-peer engines talking RoCEv2 across it (no VM needed):
#   1. RC, unfiltered, pcapng: every frame decodes as RoCE (tshark), egress frames = what the
#      local peer sent, ingress frames = what the remote peer sent, the expected opcodes appear,
#      every ICRC is right (tests/vm/icrc-check.py, full snap length), and both peers exit 0
#      with every buffer verified (the tap does not disturb traffic).
#   1b. The same with --attach netlink (a direct-action filter on the clsact qdisc, what
#      kernels before 6.6 offer): frame counts, RoCE and ICRCs; the filters go with the tap.
#   2. UD, pcap, plus a live tap (--write - | tshark -r -) with --opcode ud --count; UC with
#      --opcode uc; RC over IPv6 with --ip; raw frames with one and two VLAN tags, seen on
#      egress (tags in the frame) and on the far ingress (outer tag offloaded, put back); RC on
#      lo (the udp transport's interface), every frame seen once each way (and no PSN repeat
#      counted for that); RC with random loss both ways (a tc-BPF dropper on the far veth: the
#      host has no netem): frame counts, NAKs against the client's counters, PSN repeats seen
#      when the peers retransmitted; the same from a tap that keeps no BTH bytes (--snaplen 42:
#      the summary comes from the headers the kernel parsed), and a tap filtering on the AETH
#      syndrome in the kernel (--aeth nak,rnr) holds exactly the NAK frames.
#   3. In-kernel filters, four taps on the same interface at once (tcx multi-program): --qpn of
#      the RC QP, --qpn and --ip of crafted RoCE frames to an address nobody listens on, and
#      --opcode ack; each capture holds exactly the frames it should.
#   4. A reader that stalls (SIGSTOP) with a small ring: the frames lost to the full ring are
#      counted, and written + lost = what the peers sent.
#   5. The extension headers parsed in the kernel (--decode): crafted frames of every RC, UC,
#      UD and RD opcode, CNP, FLUSH, ATOMIC_WRITE and frames cut inside a header, with random
#      field values, against the values sent (tests/vm/tap-headers.py) and against tshark; RDMA
#      WRITE, READ and both atomics between two rxe-perftest engines with --snaplen headers,
#      every field against tshark, no payload kept.
#   6. Bad input (unknown interface, bad QPN, bad opcode class, ...) exits 2.
#
#   sudo tests/vm/tap.test.sh
#
# Runs in a network namespace of its own (tests/vm/net.sh exec) and makes a second one for the
# far end of the veth; the 10.77.9.0/24 addresses exist only there. Prints "SKIP: <reason>"
# and exits 77 without root, clang, tshark or python3 (a failure under CI=true).
# Env: VUR_TAP_ITERS (RC messages, default 300), VUR_TAP_LOSS (percent, default 3),
# VUR_TAP_KEEP=1 keeps the captures,
# VUR_TAP_PROFILE=debug uses the debug binaries (default release, as tests/run.sh builds).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
iters=${VUR_TAP_ITERS:-300}
profile=${VUR_TAP_PROFILE:-release}

log() { printf '[tap %s] %s\n' "$(date +%T)" "$*"; }
fail() { printf '[tap %s] FAIL: %s\n' "$(date +%T)" "$*"; exit 1; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
[[ $(id -u) -eq 0 ]] || vm_missing "tap: needs root (network namespaces, eBPF tcx)"
for c in ip clang tshark /usr/bin/python3; do
    command -v "$c" >/dev/null || vm_missing "tap: $c not installed (images/host-setup.sh)"
done
if ! vm_in_netns; then
    t=$SECONDS
    flag=--release
    [[ $profile == debug ]] && flag=
    log "building vhost-user-rdma and rxe-peer ($profile)"
    # shellcheck disable=SC2086 # $flag is empty or one word
    (cd "$repo" && vur_cargo build -q $flag -p vhost-user-rdma -p vur-interop --bins)
    log "built in $((SECONDS - t)) s"
fi
vm_netns tap "$@"

bin=$repo/target/$profile/vhost-user-rdma
peer=$repo/target/$profile/rxe-peer
[[ -x $bin && -x $peer && -x ${peer%/*}/rxe-perftest ]] || fail "$bin, $peer or rxe-perftest not built"
t_start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/vur-tap.XXXXXX")
far=vur-tapfar-$$
cleanup() {
    local p
    # Only children still running: a PID of one that already ended may belong to another
    # process by now.
    for p in $(jobs -pr); do kill "$p" 2>/dev/null || true; done
    for p in $(ip netns pids "$far" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$far" 2>/dev/null || true
    if [[ ${VUR_TAP_KEEP:-} == 1 ]]; then log "captures kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

log "namespace $VUR_NETNS: veth vtapA 10.77.9.1/24 fd77:9::1/64 <-> vtapB 10.77.9.2/24 (+ .3) fd77:9::2/64 in $far"
ip netns add "$far"
ip -n "$far" link set lo up
ip link add vtapA type veth peer name vtapB netns "$far"
ip addr add 10.77.9.1/24 dev vtapA
ip -n "$far" addr add 10.77.9.2/24 dev vtapB
ip -n "$far" addr add 10.77.9.3/24 dev vtapB
ip addr add fd77:9::1/64 dev vtapA nodad
ip -n "$far" addr add fd77:9::2/64 dev vtapB nodad
ip link set vtapA up
ip -n "$far" link set vtapB up

# start_tap NAME ARGS...: the tap on $tap_if (default vtapA; in namespace $tap_netns if set) in
# the background, its stderr in $work/NAME.err;
# returns once it says it is attached (at most 20 s). Sets $tap_pid.
start_tap() {
    local name=$1 i
    shift
    if [[ -n ${tap_netns:-} ]]; then
        ip netns exec "$tap_netns" "$bin" tap --iface "${tap_if:-vtapA}" "$@" 2>"$work/$name.err" &
    else
        "$bin" tap --iface "${tap_if:-vtapA}" "$@" 2>"$work/$name.err" &
    fi
    tap_pid=$!
    for i in $(seq 200); do
        grep -qs '^tap: attached' "$work/$name.err" && return 0
        kill -0 "$tap_pid" 2>/dev/null || break
        sleep 0.1
    done
    cat "$work/$name.err"
    fail "tap $name did not attach within 20 s"
}

# stop_tap PID NAME [drops-ok]: SIGINT, then at most 10 s for it to drain and exit 0; no frame
# may have been lost to a full ring buffer unless drops-ok.
stop_tap() {
    local pid=$1 name=$2 drops=${3:-} i rc=0
    kill -INT "$pid"
    for i in $(seq 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && { kill -9 "$pid"; fail "tap $name still running 10 s after SIGINT"; }
    wait "$pid" || rc=$?
    ((rc == 0)) || { cat "$work/$name.err"; fail "tap $name exited $rc"; }
    grep '^tap: done' "$work/$name.err" | sed "s/^/  [$name] /"
    [[ -n $drops ]] || grep -q ' 0 lost to a full ring buffer' "$work/$name.err" ||
        fail "tap $name lost frames to a full ring"
}

# wait_tap PID NAME N [matched]: until tap NAME has written (or, with "matched", its kernel
# program has matched) at least N frames, at most 20 s; fails saying what it waited for.
# The tap prints its progress on SIGUSR1: the frames of a run that ended may still wait in the
# receiving side's softirq, so a test waits for them here rather than sleeping.
wait_tap() {
    local pid=$1 name=$2 want=$3 what=${4:-written} i got=0 re
    re='s/^tap: progress: \([0-9]*\) frames written; in kernel: \([0-9]*\) matched.*/'
    [[ $what == matched ]] && re+='\2/p' || re+='\1/p'
    for ((i = 0; i < 200; i++)); do
        kill -USR1 "$pid"
        sleep 0.1
        got=$(sed -n "$re" "$work/$name.err" | tail -1)
        ((${got:-0} >= want)) && return 0
    done
    fail "tap $name: ${got:-0} frames $what within 20 s, want $want"
}

# run_pair NAME KIND ARGS...: rxe-peer server in $far (here with same_ns=1) ($ip_b, default
# 10.77.9.2), client here ($ip_a, default 10.77.9.1), both must exit 0 with every
# buffer verified and the run complete. Sets $sent_a / $sent_b (packets each side sent).
run_pair() {
    local name=$1 kind=$2 spid rc=0 f a=${ip_a:-10.77.9.1} b=${ip_b:-10.77.9.2}
    shift 2
    local where=(ip netns exec "$far")
    [[ ${same_ns:-} == 1 ]] && where=()
    "${where[@]}" timeout 120 "$peer" --local-ip "$b" "$kind" --peer-is-rxe-peer "$@" \
        >"$work/$name.server" 2>&1 &
    spid=$!
    timeout 120 "$peer" --local-ip "$a" "$kind" --server "$b" --peer-is-rxe-peer "$@" \
        >"$work/$name.client" 2>&1 || rc=$?
    wait "$spid" || rc=$((rc ? rc : $?))
    for f in client server; do
        if ((rc != 0)) || ! grep -q '^end: complete' "$work/$name.$f"; then
            cat "$work/$name.client" "$work/$name.server"
            fail "$name: rxe-peer did not finish cleanly (rc $rc)"
        fi
        grep -E '^verified|^counters' "$work/$name.$f" | sed "s/^/  [$name $f] /"
    done
    sent_a=$(sed -n 's/.*; \([0-9]*\) packets sent.*/\1/p' "$work/$name.client")
    sent_b=$(sed -n 's/.*; \([0-9]*\) packets sent.*/\1/p' "$work/$name.server")
    [[ -n $sent_a && -n $sent_b ]] || fail "$name: no packet counts in rxe-peer's output"
}

# fields FILE [-Y FILTER] FIELDS...: tshark's field output, one line per frame.
fields() {
    local f=$1 x args=()
    shift
    if [[ ${1:-} == -Y ]]; then args=(-Y "$2"); shift 2; fi
    for x in "$@"; do args+=(-e "$x"); done
    tshark -n -r "$f" -T fields "${args[@]}" 2>/dev/null
}
count() { fields "$@" frame.number | wc -l; }

# check_roce FILE [SRC_A SRC_B]: every frame decodes as RoCE, none malformed, every ICRC right,
# and both sources (default 10.77.9.1 and 10.77.9.2) sent frames.
check_roce() {
    local f=$1 a=${2:-10.77.9.1} b=${3:-10.77.9.2} total roce bad pcap
    total=$(count "$f")
    roce=$(count "$f" -Y infiniband)
    bad=$(count "$f" -Y '_ws.malformed')
    log "  $(basename "$f"): $total frames, $roce decode as RoCE (infiniband), $bad malformed"
    ((total > 0 && roce == total && bad == 0)) || fail "$f: not every frame is well-formed RoCE"
    pcap=$f
    if [[ $f == *.pcapng ]]; then
        pcap=${f%.pcapng}.pcap
        tshark -r "$f" -w "$pcap" -F pcap 2>/dev/null || fail "tshark could not convert $f to pcap"
    fi
    if ! /usr/bin/python3 "$here/icrc-check.py" "$pcap" --expect-src "$a" --expect-src "$b" \
        >"$pcap.icrc" 2>&1; then
        sed 's/^/  [icrc] /' "$pcap.icrc"
        fail "$f: ICRC check failed"
    fi
    sed 's/^/  [icrc] /' "$pcap.icrc"
}

# --- 1. RC, unfiltered, pcapng -------------------------------------------------------------
log "1. RC: $iters messages of 4096 B at path MTU 1024, tap unfiltered -> pcapng"
start_tap rc --write "$work/rc.pcapng"
rc_tap=$tap_pid
t=$SECONDS
run_pair rc rc -n "$iters" -s 4096 -m 1024
log "  RC run: $((SECONDS - t)) s; client sent $sent_a packets, server sent $sent_b"
wait_tap "$rc_tap" rc $((sent_a + sent_b))
stop_tap "$rc_tap" rc
egress=$(count "$work/rc.pcapng" -Y 'frame.interface_id == 1')
ingress=$(count "$work/rc.pcapng" -Y 'frame.interface_id == 0')
log "  egress frames $egress (client sent $sent_a), ingress frames $ingress (server sent $sent_b)"
((egress == sent_a && ingress == sent_b)) || fail "RC: frame counts differ from rxe-peer's"
check_roce "$work/rc.pcapng"
ops=$(fields "$work/rc.pcapng" infiniband.bth.opcode | sort -n | uniq -c | awk '{printf "%s:%s ", $2, $1}')
log "  opcodes (opcode:frames): $ops"
for op in 0 1 2 17; do # SEND_FIRST, SEND_MIDDLE, SEND_LAST, ACKNOWLEDGE
    [[ " $ops" == *" $op:"* ]] || fail "RC: opcode $op missing"
done
sends=$(count "$work/rc.pcapng" -Y 'infiniband.bth.opcode == 2')
# (more than one per message only if the run had to retransmit)
((sends >= 2 * iters)) || fail "RC: $sends SEND_LAST frames, want at least $((2 * iters))"
grep -m2 -E '^tap: [0-9.]+s [0-9]+ frames \|' "$work/rc.err" | sed 's/^/  [summary] /'
grep -qE 'RC_SEND_FIRST=[0-9]+ .*\| retransmits=[0-9]+ naks=[0-9]+ rnr_naks=[0-9]+ cnps=[0-9]+ ring_drops=0' \
    "$work/rc.err" || fail "RC: no summary line with the counts"
# PSN repeats the tap saw vs the retransmissions the peers counted: none seen when none sent.
tap_retx=$(sed -n 's/.* retransmits=\([0-9]*\) .*/\1/p' "$work/rc.err" | awk '{n += $1} END {print n + 0}')
peer_retx=$(cat "$work/rc.client" "$work/rc.server" | sed -n 's/^counters: retransmits=\([0-9]*\) .*/\1/p' |
    awk '{n += $1} END {print n + 0}')
log "  retransmits: the tap saw $tap_retx PSN repeats, the peers counted $peer_retx"
((peer_retx > 0 || tap_retx == 0)) || fail "RC: the tap reports retransmits the peers did not make"

# --- 1b. the netlink (tc clsact) attachment ------------------------------------------------
log "1b. RC with --attach netlink (the tc clsact filter kernels before 6.6 have): 100 messages"
start_tap nl --attach netlink --write "$work/nl.pcapng"
nl_tap=$tap_pid
grep -q '(tc ingress and egress)' "$work/nl.err" || fail "netlink: the tap did not say it attached with tc"
tc filter show dev vtapA ingress | grep -q 'bpf.*direct-action' ||
    fail "netlink: no bpf filter on vtapA's clsact ingress: $(tc filter show dev vtapA ingress)"
run_pair nl rc -n 100 -s 4096 -m 1024
wait_tap "$nl_tap" nl $((sent_a + sent_b))
stop_tap "$nl_tap" nl
egress=$(count "$work/nl.pcapng" -Y 'frame.interface_id == 1')
ingress=$(count "$work/nl.pcapng" -Y 'frame.interface_id == 0')
log "  egress frames $egress (client sent $sent_a), ingress frames $ingress (server sent $sent_b)"
((egress == sent_a && ingress == sent_b)) || fail "netlink: frame counts differ from rxe-peer's"
check_roce "$work/nl.pcapng"
[[ -z $(tc filter show dev vtapA ingress) && -z $(tc filter show dev vtapA egress) ]] ||
    fail "netlink: the tap's filters stayed after it ended"
log "  the filters went with the tap (the clsact qdisc stays, as after tc)"

# --- 2. UD, pcap, plus a live tap ----------------------------------------------------------
log "2. UD: 200 messages of 1024 B, tap unfiltered -> pcap, live tap --opcode ud --count 50 | tshark -r -"
start_tap ud --write "$work/ud.pcap"
ud_tap=$tap_pid
"$bin" tap --iface vtapA --write - --opcode ud --count 50 --quiet 2>"$work/live.err" |
    tshark -n -r - -T fields -e infiniband.bth.opcode >"$work/live.txt" 2>/dev/null &
live_pid=$!
for _ in $(seq 200); do grep -qs '^tap: attached' "$work/live.err" && break; sleep 0.1; done
grep -qs '^tap: attached' "$work/live.err" || fail "live tap did not attach within 20 s"
run_pair ud ud -n 200 -s 1024 -m 1024
wait_tap "$ud_tap" ud $((sent_a + sent_b))
stop_tap "$ud_tap" ud
for _ in $(seq 100); do kill -0 "$live_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$live_pid" 2>/dev/null && fail "live tap | tshark still running 10 s after the run (--count 50)"
wait "$live_pid" || fail "live tap | tshark failed: $(cat "$work/live.err")"
total=$(count "$work/ud.pcap")
log "  ud.pcap: $total frames (sent $sent_a + $sent_b); live: $(wc -l <"$work/live.txt") frames, opcodes $(sort -u "$work/live.txt" | tr '\n' ' ')"
((total == sent_a + sent_b)) || fail "UD: frame count differs from rxe-peer's"
check_roce "$work/ud.pcap"
[[ $(fields "$work/ud.pcap" infiniband.bth.opcode | sort -u) == 100 ]] || fail "UD: opcodes other than UD SEND_ONLY (100)"
[[ $(wc -l <"$work/live.txt") -eq 50 && $(sort -u "$work/live.txt") == 100 ]] || fail "live: want 50 UD SEND_ONLY frames"

log "2b. UC: 100 messages of 4096 B at path MTU 1024, tap --opcode uc -> pcapng"
start_tap uc --write "$work/uc.pcapng" --opcode uc
uc_tap=$tap_pid
run_pair uc uc -n 100 -s 4096 -m 1024
wait_tap "$uc_tap" uc $((sent_a + sent_b))
stop_tap "$uc_tap" uc
total=$(count "$work/uc.pcapng")
ops=$(fields "$work/uc.pcapng" infiniband.bth.opcode | sort -n | uniq -c | awk '{printf "%s:%s ", $2, $1}')
log "  uc.pcapng: $total frames (sent $sent_a + $sent_b), opcodes (opcode:frames) $ops"
((total == sent_a + sent_b)) || fail "UC: frame count differs from rxe-peer's"
[[ $ops == "32:200 33:400 34:200 " ]] || fail "UC: want UC SEND_FIRST, MIDDLE x2, LAST (32, 33, 34) per message"
check_roce "$work/uc.pcapng"

log "2c. RC over IPv6: 100 messages of 4096 B, tap --ip fd77:9::2 -> pcapng"
start_tap v6 --write "$work/v6.pcapng" --ip fd77:9::2
v6_tap=$tap_pid
ip_a=fd77:9::1 ip_b=fd77:9::2 run_pair v6 rc -n 100 -s 4096 -m 1024
wait_tap "$v6_tap" v6 $((sent_a + sent_b))
stop_tap "$v6_tap" v6
total=$(count "$work/v6.pcapng")
v6=$(count "$work/v6.pcapng" -Y 'ipv6 && infiniband')
log "  v6.pcapng: $total frames, $v6 RoCE over IPv6 (sent $sent_a + $sent_b)"
((total == sent_a + sent_b && v6 == total)) || fail "IPv6: frame count differs from rxe-peer's"
check_roce "$work/v6.pcapng" fd77:9::1 fd77:9::2

log "2d. VLAN: 10 frames tagged 77 and 10 tagged 100 (802.1ad) + 77 to QP 0xcd, taps --qpn 0xcd on vtapA (egress) and on vtapB (ingress)"
start_tap vlana --write "$work/vlana.pcap" --qpn 0xcd
vlana=$tap_pid
tap_netns=$far tap_if=vtapB start_tap vlanb --write "$work/vlanb.pcap" --qpn 0xcd
vlanb=$tap_pid
# Raw Ethernet frames (AF_PACKET) to the broadcast MAC: IPv4 10.77.9.1 -> 10.77.9.3, UDP 4791,
# BTH RC SEND_ONLY to QP 0xcd. The receiving veth moves the outer tag out of band (VLAN
# offload) before tcx ingress, so the tap on vtapB sees it there and must put it back.
/usr/bin/python3 - <<'EOF'
import socket, struct
def csum(b):
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xFFFF)
    return ~(s + (s >> 16)) & 0xFFFF
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("vtapA", 0))
for tags in ([(0x8100, 77)], [(0x88A8, 100), (0x8100, 77)]):
    for i in range(10):
        roce = struct.pack("!BBHII", 0x04, 0x40, 0xFFFF, 0xCD, i) + bytes(16) + bytes(4)
        udp = struct.pack("!HHHH", 0xC000, 4791, 8 + len(roce), 0) + roce
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0,
                         socket.inet_aton("10.77.9.1"), socket.inet_aton("10.77.9.3"))
        ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
        eth = b"\xff" * 6 + b"\x02\x00\x00\x00\x00\x01"
        for tpid, vid in tags:
            eth += struct.pack("!HH", tpid, vid)
        s.send(eth + b"\x08\x00" + ip + udp)
EOF
wait_tap "$vlana" vlana 20
wait_tap "$vlanb" vlanb 20
stop_tap "$vlana" vlana
stop_tap "$vlanb" vlanb
for f in vlana vlanb; do
    n=$(count "$work/$f.pcap")
    single=$(count "$work/$f.pcap" -Y 'vlan.id == 77 && !ieee8021ad && infiniband.bth.destqp == 0xcd')
    double=$(count "$work/$f.pcap" -Y 'ieee8021ad.id == 100 && vlan.id == 77 && infiniband.bth.destqp == 0xcd')
    log "  $f: $n frames: $single tagged 77, $double tagged 100 + 77"
    ((n == 20 && single == 10 && double == 10)) || fail "$f: VLAN frames missing or without their tags"
done

log "2e. lo: RC between 127.0.0.1 and 127.0.0.2 in this namespace, tap on lo and vtapA (each frame seen on lo egress and on lo ingress)"
tap_if=lo start_tap lo --iface vtapA --write "$work/lo.pcapng" # two interfaces: 4 IDBs
lo_tap=$tap_pid
same_ns=1 ip_a=127.0.0.1 ip_b=127.0.0.2 run_pair lo rc -n 50 -s 4096 -m 1024
wait_tap "$lo_tap" lo $((2 * (sent_a + sent_b)))
stop_tap "$lo_tap" lo
egress=$(count "$work/lo.pcapng" -Y 'frame.interface_id == 1 && infiniband')
ingress=$(count "$work/lo.pcapng" -Y 'frame.interface_id == 0 && infiniband')
log "  lo.pcapng: egress $egress, ingress $ingress (peers sent $sent_a + $sent_b)"
((egress == sent_a + sent_b && ingress == sent_a + sent_b)) || fail "lo: frame counts differ from rxe-peer's"
names=$(fields "$work/lo.pcapng" frame.interface_name frame.interface_description | sort -u | tr '\t\n' ' ')
log "  interfaces of the frames: $names"
[[ $names == "lo lo tcx egress lo lo tcx ingress " ]] || fail "lo: frames on other interfaces than lo"
check_roce "$work/lo.pcapng" 127.0.0.1 127.0.0.2
# Every frame passes lo twice (egress, then ingress): that is no PSN repeat.
tap_retx=$(sed -n 's/.* retransmits=\([0-9]*\) .*/\1/p' "$work/lo.err" | awk '{n += $1} END {print n + 0}')
peer_retx=$(cat "$work/lo.client" "$work/lo.server" | sed -n 's/^counters: retransmits=\([0-9]*\) .*/\1/p' |
    awk '{n += $1} END {print n + 0}')
log "  retransmits: the tap saw $tap_retx PSN repeats, the peers counted $peer_retx"
((peer_retx > 0 || tap_retx == 0)) || fail "lo: the tap counts the second sight of a frame on lo as a retransmit"

loss=${VUR_TAP_LOSS:-3}
log "2f. RC with loss: ${loss}% of RoCE frames dropped at random on the far veth both ways (tc-BPF); $iters messages"
# A tc-BPF dropper on vtapB (the host kernel has no netem): client -> server frames are dropped
# after the tap saw them on vtapA egress, server -> client frames before it sees them.
cat >"$work/drop.c" <<'EOF'
typedef unsigned int __u32;
typedef unsigned char __u8;
struct __sk_buff { __u32 len; };
static long (*bpf_skb_load_bytes)(const void *skb, __u32 offset, void *to, __u32 len) = (void *)26;
static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;
__attribute__((section("classifier"), used)) int drop_roce(struct __sk_buff *skb)
{
	__u8 h[2];
	/* Ethernet + IPv4 without options: the UDP destination port is at 36. */
	if (bpf_skb_load_bytes(skb, 36, h, 2) || h[0] != 0x12 || h[1] != 0xb7)
		return -1; /* TC_ACT_UNSPEC */
	return bpf_get_prandom_u32() % 100 < PERCENT ? 2 /* TC_ACT_SHOT */ : -1;
}
char _license[] __attribute__((section("license"), used)) = "BSD";
EOF
clang -O2 -target bpf -DPERCENT="$loss" -c "$work/drop.c" -o "$work/drop.o"
ip netns exec "$far" tc qdisc add dev vtapB clsact
for dir in ingress egress; do
    ip netns exec "$far" tc filter add dev vtapB "$dir" bpf da obj "$work/drop.o" sec classifier
done
start_tap loss --write "$work/loss.pcapng"
loss_tap=$tap_pid
# The same frames with only Ethernet + IPv4 + UDP kept (no BTH in the bytes): its summary
# can only come from the headers the kernel parsed. And a tap that keeps only NAKs and RNR
# NAKs, filtered in the kernel on the AETH syndrome.
start_tap lossnohdr --write "$work/lossnohdr.pcap" --snaplen 42
lossnohdr_tap=$tap_pid
start_tap lossnak --write "$work/lossnak.pcap" --aeth nak,rnr
lossnak_tap=$tap_pid
run_pair loss rc -n "$iters" -s 4096 -m 1024
recv_a=$(sed -n 's/.* packets sent, \([0-9]*\) received.*/\1/p' "$work/loss.client")
counter() { sed -n "s/^counters: .*\\b$2=\\([0-9]*\\).*/\\1/p" "$work/loss.$1"; }
wait_tap "$loss_tap" loss $((sent_a + recv_a))
wait_tap "$lossnohdr_tap" lossnohdr $((sent_a + recv_a))
wait_tap "$lossnak_tap" lossnak $(($(counter client naks_sent) + $(counter client naks_received)))
stop_tap "$loss_tap" loss
stop_tap "$lossnohdr_tap" lossnohdr
stop_tap "$lossnak_tap" lossnak
ip netns exec "$far" tc qdisc del dev vtapB clsact
egress=$(count "$work/loss.pcapng" -Y 'frame.interface_id == 1')
ingress=$(count "$work/loss.pcapng" -Y 'frame.interface_id == 0')
log "  egress frames $egress (client sent $sent_a), ingress frames $ingress (client received $recv_a, server sent $sent_b)"
((egress == sent_a && ingress == recv_a)) || fail "loss: frame counts differ from rxe-peer's"
tap_retx=$(sed -n 's/.* retransmits=\([0-9]*\) .*/\1/p' "$work/loss.err" | awk '{n += $1} END {print n + 0}')
tap_naks=$(sed -n 's/.* naks=\([0-9]*\) .*/\1/p' "$work/loss.err" | awk '{n += $1} END {print n + 0}')
c_retx=$(counter client retransmits) s_retx=$(counter server retransmits)
c_nsent=$(counter client naks_sent) c_nrecv=$(counter client naks_received)
log "  tap: $tap_retx PSN repeats, $tap_naks NAKs; client: retransmits $c_retx naks_sent $c_nsent naks_received $c_nrecv; server: retransmits $s_retx"
# Every NAK the client sent passed the tap, and so did every NAK the client received.
((tap_naks == c_nsent + c_nrecv)) || fail "loss: the tap saw $tap_naks NAKs, the client sent $c_nsent and received $c_nrecv"
((c_retx + s_retx == 0 || tap_retx > 0)) || fail "loss: the peers retransmitted but the tap saw no PSN repeat"
check_roce "$work/loss.pcapng"
# sums NAME KEY: the per-second summary lines' KEY=N added up.
sums() { sed -n "s/.* $2=\([0-9]*\).*/\1/p" "$work/$1.err" | awk '{n += $1} END {print n + 0}'; }
# opcounts NAME: "OPNAME=N ..." over all summary lines, sorted.
opcounts() {
    grep -E '^tap: [0-9.]+s [0-9]+ frames \|' "$work/$1.err" | sed 's/ | retransmits=.*//; s/^[^|]*| //' |
        tr ' ' '\n' | awk -F= 'NF == 2 {n[$1] += $2} END {for (k in n) print k "=" n[k]}' | sort | tr '\n' ' '
}
nohdr_naks=$(sums lossnohdr naks) nohdr_retx=$(sums lossnohdr retransmits)
log "  --snaplen 42 (no BTH in the bytes): $nohdr_naks NAKs, $nohdr_retx PSN repeats; opcodes $(opcounts lossnohdr)"
[[ $(count "$work/lossnohdr.pcap" -Y 'frame.cap_len != 42') == 0 ]] || fail "--snaplen 42 kept more than 42 bytes"
((nohdr_naks == tap_naks && nohdr_retx == tap_retx)) ||
    fail "--snaplen 42: the summary from the kernel's headers differs from the full capture's ($nohdr_naks/$tap_naks NAKs, $nohdr_retx/$tap_retx repeats)"
[[ $(opcounts lossnohdr) == "$(opcounts loss)" ]] || fail "--snaplen 42: per-opcode counts differ from the full capture's"
grep -q " of the matched $tap_naks NAKs, 0 RNR NAKs" "$work/lossnohdr.err" || fail "--snaplen 42: the kernel's NAK counter is not $tap_naks"
nak_frames=$(count "$work/loss.pcapng" -Y 'infiniband.aeth.syndrome >= 32 && infiniband.aeth.syndrome < 128 && !(infiniband.aeth.syndrome >= 64 && infiniband.aeth.syndrome < 96)')
n=$(count "$work/lossnak.pcap")
other=$(count "$work/lossnak.pcap" -Y '!(infiniband.aeth.syndrome >= 96 && infiniband.aeth.syndrome < 128) && !(infiniband.aeth.syndrome >= 32 && infiniband.aeth.syndrome < 64)')
log "  --aeth nak,rnr: $n frames, $other others (tshark finds $nak_frames NAK / RNR NAK frames in the full capture)"
((n == nak_frames && n == c_nsent + c_nrecv && other == 0)) || fail "--aeth nak,rnr captured the wrong frames"

# --- 3. in-kernel filters, four taps at once -----------------------------------------------
crafted=20
log "3. filters: taps --qpn 0x11, --qpn 0xab, --ip 10.77.9.3, --opcode ack at once; $crafted crafted frames to QP 0xab at 10.77.9.3, then RC"
start_tap q11 --write "$work/q11.pcap" --qpn 0x11
q11=$tap_pid
start_tap qab --write "$work/qab.pcap" --qpn 0xab
qab=$tap_pid
start_tap ip3 --write "$work/ip3.pcap" --ip 10.77.9.3
ip3=$tap_pid
start_tap ack --write "$work/ack.pcap" --opcode ack
ack=$tap_pid
# RC SEND_ONLY to QP 0xab, PSN i, at an address where no RoCE endpoint listens.
/usr/bin/python3 - "$crafted" <<'EOF'
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("10.77.9.1", 0))
for i in range(int(sys.argv[1])):
    bth = struct.pack("!BBHI I", 0x04, 0x40, 0xFFFF, 0xAB, i)
    s.sendto(bth + bytes(16) + b"\0\0\0\0", ("10.77.9.3", 4791))
EOF
run_pair filt rc -n 50 -s 4096 -m 1024
wait_tap "$q11" q11 $((sent_a + sent_b))
wait_tap "$qab" qab "$crafted"
wait_tap "$ip3" ip3 "$crafted"
for p in "$q11 q11" "$qab qab" "$ip3 ip3"; do
    # shellcheck disable=SC2086 # pid and name
    stop_tap $p
done
# the ACKs among the frames to QP 0x11, all of which the --opcode ack tap must have seen
wait_tap "$ack" ack "$(count "$work/q11.pcap" -Y 'infiniband.bth.opcode == 17')"
stop_tap "$ack" ack
n=$(count "$work/q11.pcap")
other=$(count "$work/q11.pcap" -Y 'infiniband.bth.destqp != 0x11')
log "  --qpn 0x11: $n frames (peers sent $((sent_a + sent_b))), $other to another QP"
((n == sent_a + sent_b && other == 0)) || fail "--qpn 0x11 captured the wrong frames"
check_roce "$work/q11.pcap"
for f in qab ip3; do
    n=$(count "$work/$f.pcap")
    other=$(count "$work/$f.pcap" -Y 'infiniband.bth.destqp != 0xab || ip.dst != 10.77.9.3')
    log "  $f: $n frames (crafted $crafted), $other others"
    ((n == crafted && other == 0)) || fail "$f filter captured the wrong frames"
done
n=$(count "$work/ack.pcap")
other=$(count "$work/ack.pcap" -Y 'infiniband.bth.opcode != 17')
acks=$(count "$work/q11.pcap" -Y 'infiniband.bth.opcode == 17')
log "  --opcode ack: $n frames (ACKs in the --qpn 0x11 capture: $acks), $other other opcodes"
((n == acks && n > 0 && other == 0)) || fail "--opcode ack captured the wrong frames"

# --- 4. a full ring buffer is counted, not hidden ---------------------------------------------
log "4. ring full: tap with a 64 KiB ring stopped (SIGSTOP) during an RC run of 100 messages"
start_tap full --write "$work/full.pcap" --ring-kib 64
full=$tap_pid
kill -STOP "$full"
run_pair full rc -n 100 -s 4096 -m 1024
kill -CONT "$full"
wait_tap "$full" full $((sent_a + sent_b)) matched
stop_tap "$full" full drops-ok
read -r written matched lost < <(sed -n 's/.*: \([0-9]*\) frames written; in kernel: \([0-9]*\) matched, [0-9]* filtered out, \([0-9]*\) lost.*/\1 \2 \3/p' "$work/full.err")
n=$(count "$work/full.pcap")
log "  peers sent $((sent_a + sent_b)); tap: $written written ($n in the file), $matched matched, $lost lost to the full ring"
((lost > 0 && written + lost == matched && matched == sent_a + sent_b && n == written)) ||
    fail "ring-full accounting does not add up"
grep -q "ring_drops=$lost" "$work/full.err" || fail "no summary line reports ring_drops=$lost"

# --- 5. headers parsed in the kernel ---------------------------------------------------------
log "5. headers: crafted frames of every opcode with random fields (tap --decode vs the crafter's own values and vs tshark)"
start_tap crafted --ip 10.77.9.3 --decode "$work/crafted.txt" --write "$work/crafted.pcap"
crafted_tap=$tap_pid
/usr/bin/python3 "$here/tap-headers.py" craft "$work/crafted.want" --src 10.77.9.1 --dst 10.77.9.3 |
    tee "$work/crafted.out" | sed 's/^/  /'
wait_tap "$crafted_tap" crafted "$(sed -n 's/^sent \([0-9]*\) crafted frames.*/\1/p' "$work/crafted.out")"
stop_tap "$crafted_tap" crafted
/usr/bin/python3 "$here/tap-headers.py" expect "$work/crafted.txt" "$work/crafted.want" --prefix "vtapA egress" |
    sed 's/^/  [crafted] /'
[[ ${PIPESTATUS[0]} == 0 ]] || fail "the kernel's parse of the crafted frames differs from what was sent"
/usr/bin/python3 "$here/tap-headers.py" tshark "$work/crafted.txt" "$work/crafted.pcap" | sed 's/^/  [crafted] /'
[[ ${PIPESTATUS[0]} == 0 ]] || fail "the kernel's parse of the crafted frames differs from tshark's"

log "5b. headers: RDMA WRITE, READ, FETCH_ADD, CMP_SWAP between two engines, tap --snaplen headers --decode"
start_tap hdrs --snaplen headers --decode "$work/hdrs.txt" --write "$work/hdrs.pcapng"
hdrs_tap=$tap_pid
# perftest PEERNAME TEST ARGS...: rxe-perftest server in $far, client here; both exit 0.
perftest() {
    local name=$1 spid rc=0
    shift
    ip netns exec "$far" timeout 60 "$repo/target/$profile/rxe-perftest" --local-ip 10.77.9.2 \
        --peer-is-rxe-perftest "$@" >"$work/$name.server" 2>&1 &
    spid=$!
    # (the client retries its connection until the server listens)
    timeout 60 "$repo/target/$profile/rxe-perftest" --local-ip 10.77.9.1 --server 10.77.9.2 \
        --peer-is-rxe-perftest "$@" >"$work/$name.client" 2>&1 || rc=$?
    wait "$spid" || rc=$((rc ? rc : $?))
    ((rc == 0)) || { cat "$work/$name.client" "$work/$name.server"; fail "rxe-perftest $*: rc $rc"; }
    grep -h '^packets:' "$work/$name.client" | sed "s/^/  [$name client] /"
}
perftest write write_bw -n 50 -s 8192 -m 1024
perftest read read_bw -n 50 -s 8192 -m 1024
perftest fadd atomic_bw -n 50 -A FETCH_AND_ADD
perftest cswap atomic_bw -n 50 -A CMP_AND_SWAP
# (no wait: what follows compares the tap's two outputs with each other and looks for
# opcodes, which every frame either peer received carries; the drain at SIGINT keeps all)
stop_tap "$hdrs_tap" hdrs
/usr/bin/python3 "$here/tap-headers.py" tshark "$work/hdrs.txt" "$work/hdrs.pcapng" | sed 's/^/  [hdrs] /'
[[ ${PIPESTATUS[0]} == 0 ]] || fail "the kernel's parse of the engines' traffic differs from tshark's"
ops=$(fields "$work/hdrs.pcapng" infiniband.bth.opcode | sort -n | uniq -c | awk '{printf "%s:%s ", $2, $1}')
log "  opcodes (opcode:frames): $ops"
for op in 6 7 8 12 13 14 15 17 18 19 20; do # WRITE F/M/L, READ req + resp F/M/L, ACK, ATOMIC ACK, CMP_SWAP, FETCH_ADD
    [[ " $ops" == *" $op:"* ]] || fail "headers: opcode $op missing"
done
# --snaplen headers: each frame kept up to the end of its transport headers, payload cut.
long=$(count "$work/hdrs.pcapng" -Y 'frame.cap_len > 82')
cut=$(count "$work/hdrs.pcapng" -Y 'frame.cap_len < frame.len')
log "  --snaplen headers: $long frames longer than Ethernet + IPv4 + UDP + BTH + AtomicETH (82 B), $cut frames cut"
((long == 0 && cut > 0)) || fail "--snaplen headers kept payload"

# --- 6. bad input --------------------------------------------------------------------------
log "6. bad input exits 2 with a message"
for args in "--iface no-such-if0" "--iface vtapA --qpn 0x1000000" "--iface vtapA --opcode bogus" \
    "--iface vtapA --aeth nack" "--iface vtapA --snaplen head" "--iface vtapA --write - --decode -" \
    "--iface vtapA --snaplen 0" "--iface vtapA --ring-kib 3" "--iface vtapA --iface vtapA" "--iface"; do
    rc=0
    # shellcheck disable=SC2086 # word-split on purpose
    "$bin" tap $args >/dev/null 2>"$work/bad.err" || rc=$?
    log "  tap $args -> rc $rc: $(grep -m1 -v '^$' "$work/bad.err")"
    ((rc == 2)) || fail "tap $args: exit $rc, want 2"
done

log "PASS in $((SECONDS - t_start)) s"
