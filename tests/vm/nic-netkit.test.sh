#!/usr/bin/env bash
# The daemon's NIC mode on netkit, inside the trixie guest (kernel 6.12 has netkit; this host's
# kernel may not) — the host-built binary, passed in through /vur:
#   1. `vhost-user-rdma link add nk0 --peer nk1 --kind netkit --peer-netns t1`: a netkit pair
#      in L2 mode through rtnetlink, the peer in namespace t1, both up; `link del` removes it.
#   2. the daemon on nk0 with --net-socket, and a virtio-net guest on it (vur-nic-guest: a
#      vhost-user frontend that answers ARP and ping for 10.80.0.2): ping from t1 through nk1
#      goes both ways through the daemon's packet sockets on netkit and the guest's rings;
#      the RoCE socket takes none of it;
#   3. the daemon against Linux rxe over a netkit pair: rxe0 on nk0, the daemon's raw transport
#      on nk1 (namespace t1), the stock ibv_rc_pingpong against vur-pingpong (a test guest on
#      the daemon, every buffer checked) in both roles;
#      Then daemon to daemon on the same pair: a second daemon on nk0, vur-pingpong on each;
#   4. daemon to daemon over a netkit pair, as a benchmark: `vur-bench --only raw --link
#      netkit` (udp daemons and raw daemons on the same pair, side by side).
#
#   sudo tests/vm/nic-netkit.test.sh
#
# Env: VUR_NETKIT_BENCH_ROUNDS (step 4's rounds, default 3; tests/run.sh runs 1: the checks
# hold with one, the measurement wants more).
#
# Runs in a network namespace of its own (tests/vm/net.sh exec). Prints "SKIP: <reason>" and
# exits 77 without root, QEMU or the guest image (a failure under CI=true). Uses
# target/release/vhost-user-rdma (VUR_DAEMON to choose another).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
log() { printf '[nic-netkit %s] %s\n' "$(date +%T)" "$*"; }
fail() { printf '[nic-netkit %s] FAIL: %s\n' "$(date +%T)" "$*"; exit 1; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require nic-netkit
if ! vm_in_netns && [[ -z ${VUR_DAEMON:-} ]]; then
    t=$SECONDS
    log "building vhost-user-rdma and vur-nic-guest (release)"
    (cd "$repo" && vur_cargo build -q --release -p vhost-user-rdma -p vur-testguest --bin vhost-user-rdma \
        --bin vur-nic-guest --bin vur-pingpong --bin vur-bench)
    log "built in $((SECONDS - t)) s"
fi
vm_netns nic-netkit "$@"

bin=${VUR_DAEMON:-$repo/target/release/vhost-user-rdma}
probe=$repo/target/release/vur-nic-guest
pp=$repo/target/release/vur-pingpong
bench=$repo/target/release/vur-bench
for b in "$bin" "$probe" "$pp" "$bench"; do [[ -x $b ]] || fail "$b not built"; done
shared=$(mktemp -d "${TMPDIR:-/tmp}/vur-nic-netkit.XXXXXX")
cleanup() {
    local rc=$?
    if ((rc == 0)); then rm -rf "$shared"; else log "artifacts kept in $shared"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cp "$bin" "$probe" "$pp" "$bench" "$shared/"

cat >"$shared/nic-netkit-guest.sh" <<'EOF'
#!/bin/bash
# Runs inside the guest (tests/vm/nic-netkit.test.sh).
set -uo pipefail
say() { echo "NKVM $*"; }
bad() { echo "NKVM-FAIL $*"; exit 1; }
d=/vur/vhost-user-rdma
counter() { # counter SECTION KEY: from the daemon's counters socket
    python3 -c 'import json, socket, sys
s = socket.socket(socket.AF_UNIX); s.connect("/tmp/c.sock")
d = json.loads(b"".join(iter(lambda: s.recv(65536), b"")))
print(d.get(sys.argv[1], {}).get(sys.argv[2], -1))' "$1" "$2"
}
say "kernel $(uname -r)"
# --- 1. the pair, through rtnetlink -------------------------------------------------------
ip netns add t1
$d link add nk0 --peer nk1 --kind netkit --peer-netns t1 || bad "link add (netkit) failed"
info=$(ip -d link show nk0)
say "nk0: $(echo "$info" | grep -o 'netkit.*' | head -1)"
[[ $info == *netkit* && $info == *"mode l2"* && $info == *link/ether* ]] || bad "nk0 is not a netkit device in L2 mode: $info"
[[ $info == *",UP"* ]] || bad "nk0 is not up"
ip -n t1 link show nk1 >/dev/null || bad "nk1 is not in namespace t1"
[[ -z $(ip link show nk1 2>/dev/null) ]] || bad "nk1 is here too"
out=$($d link add nk0 --peer nk9 --kind netkit 2>&1) && bad "a second nk0 was made"
say "the same name again: $out"
# --- 2. the daemon on netkit --------------------------------------------------------------
ip -n t1 link set nk1 up
ip -n t1 addr add 10.80.0.1/24 dev nk1
# vur-nic-guest has no RDMA device to add its address as a GID: the address is given.
$d --socket-path /tmp/r.sock --net-socket /tmp/n.sock --iface nk0 --mac 02:80:00:00:00:02 \
    --net-addr 10.80.0.2 --counters-socket /tmp/c.sock 2>/tmp/daemon.log &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/c.sock && -S /tmp/n.sock ]] && break; sleep 0.1; done
[[ -S /tmp/n.sock ]] || { cat /tmp/daemon.log; bad "the daemon did not come up on nk0"; }
/vur/vur-nic-guest --net-socket /tmp/n.sock --ip 10.80.0.2 --mac 02:80:00:00:00:02 \
    --pings 3 --seconds 60 >/tmp/guest.out 2>&1 &
gpid=$!
ip netns exec t1 ping -c 3 -i 0.3 -W 10 10.80.0.2 >/tmp/ping.out 2>&1
prc=$?
wait $gpid
grc=$?
say "$(tail -1 /tmp/ping.out)"
say "$(cat /tmp/guest.out)"
say "net: rx_frames $(counter net rx_frames), tx_frames $(counter net tx_frames); RoCE socket: rx_packets $(counter transport rx_packets)"
((prc == 0 && grc == 0)) || { cat /tmp/ping.out /tmp/daemon.log; bad "ping through netkit and the daemon's virtio-net failed"; }
(($(counter net tx_frames) >= 4)) || bad "the guest's answers did not leave through the daemon"
(($(counter transport rx_packets) == 0)) || bad "the RoCE socket took a frame that is not RoCE"
kill -TERM $pid
wait $pid || { cat /tmp/daemon.log; bad "the daemon did not end cleanly on SIGTERM"; }
[[ ! -e /tmp/n.sock ]] || bad "the daemon left its virtio-net socket behind"
$d link del nk0 || bad "link del failed"
[[ -z $(ip link show nk0 2>/dev/null) ]] || bad "nk0 is still there"
# --- 3. the daemon against Linux rxe over netkit ------------------------------------------
# rxe0 on nk0 (10.80.0.1); in t1 the daemon's raw transport on nk1 takes RoCE for 10.80.0.2
# (and answers ARP for it), t1's kernel holds 10.80.0.3 for the tools' TCP exchange.
$d link add nk0 --peer nk1 --kind netkit --peer-netns t1 || bad "link add (netkit) failed"
ip addr add 10.80.0.1/24 dev nk0
ip -n t1 link set nk1 up
ip -n t1 addr add 10.80.0.3/24 dev nk1
modprobe rdma_rxe 2>/dev/null
rdma link add rxe0 type rxe netdev nk0 || bad "rdma link add rxe0 on netkit failed"
gi=''
for _ in $(seq 50); do
    for f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
        n=${f##*/}
        [[ $(cat "$f" 2>/dev/null) == 0000:0000:0000:0000:0000:ffff:0a50:0001 ]] || continue
        [[ $(cat "/sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$n" 2>/dev/null) == "RoCE v2" ]] && { gi=$n; break; }
    done
    [[ -n $gi ]] && break
    sleep 0.1
done
[[ -n $gi ]] || bad "rxe0 has no RoCE v2 GID for 10.80.0.1"
ip netns exec t1 $d --socket-path /tmp/r3.sock --iface nk1 --raw-addr 10.80.0.2 \
    --counters-socket /tmp/c3.sock 2>/tmp/d3.log &
pid=$!
for _ in $(seq 100); do [[ -S /tmp/c3.sock && -S /tmp/r3.sock ]] && break; sleep 0.1; done
[[ -S /tmp/r3.sock ]] || { cat /tmp/d3.log; bad "the daemon did not come up on nk1"; }
mac0=$(cat /sys/class/net/nk0/address)
say "rxe0 on nk0 ($mac0, GID index $gi), the daemon on nk1 in t1"
pp="/vur/vur-pingpong --socket /tmp/r3.sock --ip 10.80.0.2 --dmac $mac0 -s 4096 -n 200 --timeout 120"
# rxe serves, the daemon connects
timeout 150 ibv_rc_pingpong -d rxe0 -g "$gi" -s 4096 -n 200 >/tmp/pp1.tool 2>&1 &
tpid=$!
ip netns exec t1 $pp --server 10.80.0.1 >/tmp/pp1.ours 2>&1
orc=$?
wait $tpid
trc=$?
say "rxe serves: ibv_rc_pingpong rc=$trc ($(tail -1 /tmp/pp1.tool)); vur-pingpong rc=$orc ($(tail -1 /tmp/pp1.ours))"
((trc == 0 && orc == 0)) || { cat /tmp/pp1.tool /tmp/pp1.ours /tmp/d3.log; bad "ibv_rc_pingpong on rxe0 serving the daemon over netkit failed"; }
# the daemon serves, rxe connects
ip netns exec t1 $pp -p 18516 >/tmp/pp2.ours 2>&1 &
opid=$!
for _ in $(seq 100); do ip netns exec t1 ss -Hltn 'sport = :18516' | grep -q . && break; sleep 0.1; done
timeout 150 ibv_rc_pingpong -d rxe0 -g "$gi" -p 18516 -s 4096 -n 200 10.80.0.3 >/tmp/pp2.tool 2>&1
trc=$?
wait $opid
orc=$?
say "the daemon serves: ibv_rc_pingpong rc=$trc ($(tail -1 /tmp/pp2.tool)); vur-pingpong rc=$orc ($(tail -1 /tmp/pp2.ours))"
((trc == 0 && orc == 0)) || { cat /tmp/pp2.tool /tmp/pp2.ours /tmp/d3.log; bad "ibv_rc_pingpong on rxe0 against the daemon's server over netkit failed"; }
grep -q "verified 200 buffers" /tmp/pp1.ours && grep -q "verified 200 buffers" /tmp/pp2.ours ||
    bad "vur-pingpong did not check every buffer"
icrc_ok=$(python3 -c 'import json, socket
s = socket.socket(socket.AF_UNIX); s.connect("/tmp/c3.sock")
t = json.loads(b"".join(iter(lambda: s.recv(65536), b""))).get("transport", {})
print(t.get("rx_icrc_ok", -1), t.get("rx_icrc_bad", -1), t.get("tx_packets", -1))')
read -r ok badc tx <<<"$icrc_ok"
say "daemon on nk1: rx_icrc_ok=$ok rx_icrc_bad=$badc tx_packets=$tx; rxe0: $(rdma statistic show link rxe0/1 2>/dev/null | grep -o 'sent_pkts [0-9]*\|rcvd_pkts [0-9]*' | tr '\n' ' ')"
((ok >= 800 && badc == 0 && tx >= 800)) || bad "the daemon's counters do not show the traffic"
# daemon to daemon: a second daemon's raw transport on nk0 for 10.80.0.4 (rxe0's kernel does
# not hold that address: the frames are the daemon's alone)
$d --socket-path /tmp/r4.sock --iface nk0 --raw-addr 10.80.0.4 --counters-socket /tmp/c4.sock 2>/tmp/d4.log &
pid4=$!
for _ in $(seq 100); do [[ -S /tmp/r4.sock ]] && break; sleep 0.1; done
[[ -S /tmp/r4.sock ]] || { cat /tmp/d4.log; bad "the second daemon did not come up on nk0"; }
mac1=$(ip -n t1 -br link show nk1 | awk '{print $3}')
ip netns exec t1 $pp -p 18517 --peer-is-ours >/tmp/pp3.srv 2>&1 &
opid=$!
for _ in $(seq 100); do ip netns exec t1 ss -Hltn 'sport = :18517' | grep -q . && break; sleep 0.1; done
/vur/vur-pingpong --socket /tmp/r4.sock --ip 10.80.0.4 --dmac "$mac1" --server 10.80.0.3 -p 18517 \
    -s 4096 -n 200 --timeout 120 --peer-is-ours >/tmp/pp3.cli 2>&1
crc=$?
wait $opid
src=$?
say "daemon to daemon over netkit: server rc=$src ($(tail -1 /tmp/pp3.srv)); client rc=$crc ($(tail -1 /tmp/pp3.cli))"
((src == 0 && crc == 0)) || { cat /tmp/pp3.srv /tmp/pp3.cli /tmp/d3.log /tmp/d4.log; bad "vur-pingpong between two daemons over netkit failed"; }
kill -TERM $pid4
wait $pid4 || { cat /tmp/d4.log; bad "the daemon on nk0 did not end cleanly"; }
kill -TERM $pid
wait $pid || { cat /tmp/d3.log; bad "the daemon on nk1 did not end cleanly"; }
rdma link del rxe0
$d link del nk0 || bad "link del failed"
# --- 4. daemon to daemon over netkit: the raw-vs-udp table ---------------------------------
/vur/vur-bench --only raw --link netkit --rounds "$NK_BENCH_ROUNDS" --iters 500 --write-bytes 33554432 >/tmp/bench.out 2>&1 ||
    { cat /tmp/bench.out; bad "vur-bench --only raw --link netkit failed"; }
sed 's/^/NKVM bench: /' /tmp/bench.out | grep -v '^NKVM bench: round'
grep -q '^netkit, 2 namespaces' /tmp/bench.out || bad "no netkit table from vur-bench"
say "PASS"
EOF
chmod +x "$shared/nic-netkit-guest.sh"

images=${VUR_IMAGES:-$images}
log "booting the guest (image $images)"
rc=0
"$here/run-vm.sh" --name nk --images "$images" --shared "$shared" --no-rxe \
    --env NK_BENCH_ROUNDS="${VUR_NETKIT_BENCH_ROUNDS:-3}" --scenario "$shared/nic-netkit-guest.sh" --timeout 900 >"$shared/run.log" 2>&1 || rc=$?
tr -d '\r' <"$shared/nk.console.log" | grep -a '^NKVM' || true
((rc == 0)) || { tail -30 "$shared/run.log"; fail "the guest scenario ended with rc=$rc"; }
grep -aq '^NKVM PASS' "$shared/nk.console.log" || fail "no PASS from the guest"
log "PASS"
