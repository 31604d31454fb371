#!/usr/bin/env bash
# The differential wire test: crafted RoCEv2 sequences (RC responder and requester, UC, UD, SRQ,
# memory windows, FLUSH, ATOMIC_WRITE, malformed and corrupted packets) sent by `rxe-diff` on
# the host to Linux rxe and to the virtio-rdma device, both in one guest; what each answers,
# completes and leaves in memory is compared case by case (vur_interop::diff).
#
#   sudo tests/vm/differential.test.sh [--case TEXT]
#
# In the guest: rxe0 on eth1 (10.78.0.2, on the test bridge), vrdma0 on eth0 (the daemon's
# address 10.77.0.2), tests/vm/diff-target.py serving both. On the host (this test's
# namespace): the daemon on 10.77.0.2, rxe-diff on 10.78.0.1. Fails on any difference that is
# not a documented exception (and on an exception that no longer differs), and when the daemon
# keeps objects afterwards. Writes the table to $VUR_DIFF_TABLE when set (docs/interop.md).
# Env: VUR_DAEMON, VUR_IMAGES, VUR_QEMU, VUR_DIFF_TABLE, VUR_DIFF_KEEP=1 (keep the artifacts).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source=/dev/null
. "$repo/scripts/lib/cargo.sh"
t_start=$SECONDS
log() { printf '[differential %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
only=()
case ${1:-} in
--case) [[ -n ${2:-} ]] || { echo "usage: $0 [--case TEXT]" >&2; exit 2; }; only=(--case "$2") ;;
"") ;;
*) echo "usage: $0 [--case TEXT]" >&2; exit 2 ;;
esac
vm_require differential python3
vm_device_prereqs differential
if ! vm_in_netns; then
    log "building rxe-diff"
    (cd "$repo" && vur_cargo build -q -p vur-interop --bin rxe-diff)
fi
vm_netns differential "$@"
diff_bin=$repo/target/debug/rxe-diff
[[ -x $diff_bin ]] || { echo "FAIL: $diff_bin not built"; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-diff.XXXXXX")
dpid='' vmpid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $vmpid ]]; then kill "$vmpid" 2>/dev/null || true; wait "$vmpid" 2>/dev/null || true; fi
    if [[ -n $dpid ]]; then kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; fi
    if ((rc == 0)) && [[ -z ${VUR_DIFF_KEEP:-} ]]; then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

addr=10.77.0.2 mac=52:54:00:77:00:02 rxe_mac=52:54:00:78:00:02
rxe_ip=10.78.0.2 host_ip=10.78.0.1 port=18600
"$here/net.sh" up vurtapA
ip addr add "$host_ip/24" dev vurbr0
vm_start_daemon "$work" "$addr" "$mac" || exit 1
dpid=$REPLY

cat >"$work/guest.sh" <<EOF
#!/bin/bash
rxe_mac=$rxe_mac rxe_ip=$rxe_ip port=$port host_ip=$host_ip
EOF
cat >>"$work/guest.sh" <<'EOF'
# Runs inside the guest (tests/vm/differential.test.sh): rxe0 on the NIC with $rxe_mac, then
# diff-target.py for the host's rxe-diff.
nic=''
for n in /sys/class/net/*; do [[ $(cat "$n/address") == "$rxe_mac" ]] && nic=${n##*/}; done
[[ -n $nic ]] || { echo "DIFF-FAIL no NIC with MAC $rxe_mac"; exit 1; }
ip link set "$nic" up && ip addr add "$rxe_ip/24" dev "$nic"
# vrdma0's GID is eth0's address, and eth0 is attached to nothing: ib_core resolves the host's
# address through it all the same, so give it a neighbour entry (the MAC is not used)
ip neigh replace "$host_ip" lladdr 02:00:00:00:00:01 dev eth0 nud permanent
modprobe rdma_rxe && rdma link add rxe0 type rxe netdev "$nic" ||
    { echo "DIFF-FAIL could not create rxe0 on $nic"; exit 1; }
for dev in vrdma0 rxe0; do
    for _ in $(seq 100); do vur-gid v4 "$dev" >/dev/null 2>&1 && break; sleep 0.1; done
    vur-gid v4 "$dev" >/dev/null || { echo "DIFF-FAIL no IPv4 RoCE v2 GID on $dev"; exit 1; }
done
python3 -u /vur-scenario/diff-target.py --listen "$rxe_ip:$port" 2>&1 | tee /vur/target.log
rc=${PIPESTATUS[0]}
touch /vur/target-done
for _ in $(seq 300); do [[ -f /vur/counters-read ]] && break; sleep 0.1; done
exit "$rc"
EOF

log "booting the guest"
"$here/run-vm.sh" --name diff --qemu "$qemu" --images "$images" --rdma-sock "$work/rdma.sock" \
    --nic-no-peer --mac "$mac" --ip "$addr/24" --no-rxe --tap2 vurtapA --mac2 "$rxe_mac" \
    --shared "$work" --smp 2 --file "$here/diff-target.py" \
    --scenario "$work/guest.sh" --timeout 1200 >"$work/run-vm.log" 2>&1 &
vmpid=$!

fail=0
mkdir -p "$work/transcripts"
t1=$SECONDS
"$diff_bin" --local-ip "$host_ip" --control "$rxe_ip:$port" \
    --target "rxe0=$rxe_ip" --target "vrdma0=$addr" "${only[@]}" \
    --table "$work/table.md" --transcripts "$work/transcripts" | tee "$work/rxe-diff.log" ||
    fail=1
log "rxe-diff ended in $((SECONDS - t1)) s"

for _ in $(seq 600); do [[ -f $work/target-done ]] && break; sleep 0.1; done
vm_daemon_counters "$work/counters.sock" >"$work/counters.json" 2>&1 || true
touch "$work/counters-read"
vm_rc=0
wait "$vmpid" || vm_rc=$?
vmpid=''
if ((vm_rc != 0)); then
    tail -n 40 "$work/run-vm.log"
    log "FAIL: the guest ended with rc=$vm_rc"
    fail=1
fi
if [[ -s $work/counters.json ]]; then
    msg=$(vm_daemon_leaks differential "$work/counters.json") || fail=1
    log "$msg"
    # the corrupted-ICRC cases sent this many packets to the device: each must be counted
    corrupted=$(sed -n 's/.* corrupted packets sent to each target: \([0-9]*\).*/\1/p' "$work/rxe-diff.log")
    python3 - "$work/counters.json" "${corrupted:-0}" <<'PY' || fail=1
import json, sys
t = json.load(open(sys.argv[1])).get("transport", {})
want = int(sys.argv[2])
# A corrupted packet for no live QP is dropped before the ID solve (rx_icrc_no_qp), any other
# after it (rx_icrc_bad); rxe-diff's good packets hold for ID 0 (rx_icrc_ok) wherever they go.
bad = t.get("rx_icrc_bad", 0) + t.get("rx_icrc_no_qp", 0)
print(f"[differential] daemon: rx_packets={t.get('rx_packets')} tx_packets={t.get('tx_packets')} "
      f"rx_icrc_bad={t.get('rx_icrc_bad')} rx_icrc_no_qp={t.get('rx_icrc_no_qp')} (corrupted packets sent: {want})")
if bad != want or not t.get("rx_packets"):
    print("[differential] FAIL: the daemon did not count exactly the corrupted packets as bad ICRCs")
    sys.exit(1)
PY
else
    log "FAIL: no counters read from the daemon"
    fail=1
fi
kill -0 "$dpid" 2>/dev/null || { log "FAIL: the daemon died"; tail -20 "$work/daemon.log"; fail=1; }
[[ -z ${VUR_DIFF_TABLE:-} ]] || cp "$work/table.md" "$VUR_DIFF_TABLE"
if ((fail)); then
    log "FAIL in $((SECONDS - t_start)) s (table: $work/table.md, transcripts: $work/transcripts)"
    exit 1
fi
log "PASS in $((SECONDS - t_start)) s"
