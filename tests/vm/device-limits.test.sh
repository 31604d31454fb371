#!/usr/bin/env bash
# The daemon's per-guest limits reach the guest as errors, never as a hang: a daemon started
# with small limits (--max-qp, --max-cq, --max-mr, --max-pd, --max-srq,
# --max-registered-bytes), and a guest that creates objects until the device refuses. Every
# refusal must be ENOMEM and come after exactly the limit less what the guest's kernel holds
# (counted with `rdma resource`), ibv_devinfo must show exactly the limits, and after
# everything is freed the same objects can be made again.
#
#   sudo tests/vm/device-limits.test.sh
#
# Env: VUR_DAEMON, VUR_IMAGES, VUR_QEMU, VUR_DRIVER_KO.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
t_start=$SECONDS
log() { printf '[device-limits %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require device-limits
vm_device_prereqs device-limits
vm_netns device-limits "$@"

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-device-limits.XXXXXX")
dpid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $dpid ]]; then kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true; fi
    if ((rc == 0)); then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

addr=10.77.0.2 mac=52:54:00:77:00:02
# The guest's kernel keeps objects of its own on the device (ib_mad's PD, CQ and QP1): the
# guest counts them (rdma resource) and expects exactly the limit minus those.
limits=(--max-qp 12 --max-cq 12 --max-mr 16 --max-pd 6 --max-srq 4 --max-registered-bytes 32M)
# (the object counts, for the guest: "qp 12" ...; the last pair is the byte budget)
for ((i = 0; i < ${#limits[@]} - 2; i += 2)); do echo "${limits[i]#--max-} ${limits[i + 1]}"; done >"$work/limits"
log "daemon: ${limits[*]}"
vm_start_daemon "$work" "$addr" "$mac" "${limits[@]}" || exit 1
dpid=$REPLY
[[ -z ${VUR_DRIVER_KO:-} ]] || cp "$VUR_DRIVER_KO" "$work/virtio_rdma.ko"

cat >"$work/guest.sh" <<'EOF'
#!/bin/bash
# Runs inside the guest (tests/vm/device-limits.test.sh).
if [[ -f /vur/virtio_rdma.ko ]]; then
    rmmod virtio_rdma && insmod /vur/virtio_rdma.ko || { echo "DL FAIL reloading virtio_rdma"; exit 1; }
    for _ in $(seq 100); do [[ -e /sys/class/infiniband/vrdma0 ]] && break; sleep 0.1; done
fi
ibv_devinfo -v -d vrdma0 | grep -E 'max_(qp|cq|mr|pd|srq|mr_size):' | tr -s ' \t' ' ' | sed 's/^/DL devinfo:/'
# What the guest's kernel holds on the device before the test makes anything. Two rules of the
# device (docs/virtio-rdma.md, "Limits"): the GSI QP (QPN 1) is not counted in max_qp; and a
# kernel PD has an MR that `rdma resource` does not list (ib_alloc_pd's DMA MR, made because
# the device has no local DMA lkey), counted in max_mr.
kpds=$(rdma resource show pd dev vrdma0 2>/dev/null | grep -c pdn)
for o in pd cq qp mr srq; do
    case $o in
    qp) n=$(rdma resource show qp link vrdma0/1 2>/dev/null | grep lqpn | grep -vc 'lqpn 1 ') ;;
    mr) n=$(($(rdma resource show mr dev vrdma0 2>/dev/null | grep -c mrn) + kpds)) ;;
    *) n=$(rdma resource show "$o" dev vrdma0 2>/dev/null | grep -c "${o}n") ;;
    esac
    echo "$o $n"
done >/tmp/held
sed 's/^/DL held by the kernel: /' /tmp/held
timeout 120 python3 - <<'PY'
import errno, sys
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqInitAttr, SrqAttr

ctx = d.Context(name="vrdma0")
attr = ctx.query_device()
fail = 0
# The daemon's limits (the host wrote them) and what the guest's kernel holds already.
limits = dict((k, int(v)) for k, v in (l.split() for l in open("/vur/limits")))
held = dict((k, int(v)) for k, v in (l.split() for l in open("/tmp/held")))

# ibv_devinfo (query_device) advertises exactly the daemon's limits.
for k in limits:
    got = getattr(attr, f"max_{k}")
    ok = got == limits[k]
    print(f"DL devinfo max_{k} = {got}: " + ("ok" if ok else f"FAIL, the daemon's limit is {limits[k]}"))
    fail |= not ok

def fill(what, make, want):
    """Make objects until the device refuses: the refusal must be ENOMEM and come after
    exactly `want` objects (the limit minus what the kernel holds)."""
    global fail
    objs = []
    try:
        for _ in range(want + 4):
            objs.append(make())
        print(f"DL FAIL {what}: {len(objs)} made, no refusal (want {want})")
        fail = 1
    except PyverbsRDMAError as ex:
        ok = ex.error_code == errno.ENOMEM and len(objs) == want
        print(f"DL {what}: {len(objs)} made (want {want}), then errno {ex.error_code} "
              + ("ok" if ok else "FAIL: want ENOMEM after exactly that many"))
        fail |= not ok
    return objs

def room(k):
    return limits[k] - held[k]

pds = fill("pd", lambda: PD(ctx), room("pd"))
pd = pds[0]
cqs = fill("cq", lambda: CQ(ctx, 4), room("cq"))
cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
qps = fill("qp", lambda: QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cqs[0], rcq=cqs[0], cap=cap)), room("qp"))
srqs = fill("srq", lambda: SRQ(pd, SrqInitAttr(SrqAttr(max_wr=4, max_sge=1))), room("srq"))
mrs = fill("mr", lambda: MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE), room("mr"))
for o in mrs:
    o.close()
# registered bytes: 32 MiB in all (the small MRs are gone); one 24 MiB MR fits, a second
# one does not
big = fill("24 MiB mr", lambda: MR(pd, 24 << 20, e.IBV_ACCESS_LOCAL_WRITE), 1)
for objs in (big, srqs, qps):
    for o in objs:
        o.close()
for o in cqs[1:]:
    o.close()
# everything back: the same again
try:
    again = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cqs[0], rcq=cqs[0], cap=cap)) for _ in range(len(qps))]
    m = MR(pd, 24 << 20, e.IBV_ACCESS_LOCAL_WRITE)
    print(f"DL again: {len(again)} QPs and a 24 MiB MR after freeing: ok")
    m.close()
    for q in again:
        q.close()
except PyverbsRDMAError as ex:
    print(f"DL FAIL again: errno {ex.error_code} after freeing everything")
    fail = 1
sys.exit(fail)
PY
rc=$?
echo "DL python rc=$rc"
touch /vur/tools-done
for _ in $(seq 300); do [[ -f /vur/counters-read ]] && break; sleep 0.1; done
exit $rc
EOF

(
    for _ in $(seq 3000); do [[ -f $work/tools-done ]] && break; sleep 0.1; done
    [[ -f $work/tools-done ]] && vm_daemon_counters "$work/counters.sock" >"$work/counters.json" 2>&1
    touch "$work/counters-read"
) &
watcher=$!
vm_rc=0
"$here/run-vm.sh" --name dl --qemu "$qemu" --images "$images" --rdma-sock "$work/rdma.sock" \
    --nic-no-peer --mac "$mac" --ip "$addr/24" --no-rxe --shared "$work" \
    --scenario "$work/guest.sh" --timeout 300 >"$work/run-vm.log" 2>&1 || vm_rc=$?
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
tr -d '\r' <"$work/dl.console.log" | grep -a -E '^DL|Traceback|Error' || true
fail=0
((vm_rc == 0)) || { tail -n 30 "$work/run-vm.log"; fail=1; }
if [[ -s $work/counters.json ]]; then
    msg=$(vm_daemon_leaks device-limits "$work/counters.json") || fail=1
    log "$msg"
else
    log "FAIL: no counters from the daemon"
    fail=1
fi
kill -0 "$dpid" 2>/dev/null || { log "FAIL: the daemon died"; tail -20 "$work/daemon.log"; fail=1; }
((fail == 0)) || { log "FAIL in $((SECONDS - t_start)) s"; exit 1; }
log "PASS in $((SECONDS - t_start)) s"
