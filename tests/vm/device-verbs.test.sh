#!/usr/bin/env bash
# One guest with the virtio-rdma device: QEMU's vhost-user-rdma-pci served by the
# vhost-user-rdma daemon, the guest's virtio_rdma driver (vrdma0) and unmodified rdma-core.
# In the guest: `ibv_devinfo -v` must show vrdma0 PORT_ACTIVE with sane caps, then the
# libibverbs examples and perftest run between two processes on that one device (the
# daemon's udp transport sends to itself).
#
#   sudo tests/vm/device-verbs.test.sh [TOOL...]     default: every tool below
#
# Tools: devinfo rc rc_events uc ud srq (libibverbs examples with --chk: their server looks at
# byte 0 of each page, and a step whose output says "invalid data" fails; rc_events sleeps on
# completion events; every byte is checked between guests by tests/vm/guest-pair.test.sh's
# datacheck), send_lat send_bw write_lat write_bw read_bw atomic_bw (perftest), odp
# (ibv_rc_pingpong --odp --chk: both buffers on-demand-paging MRs, docs/virtio-rdma.md §5.10),
# write_bw_odp (ib_write_bw --odp),
# rping (rdma_cm: the CM runs over the driver's kernel QP1), resize_cq (pyverbs: ibv_resize_cq
# with completions in flight), mr_iova (ibv_reg_mr_iova: an MR whose IOVA is not its address,
# pyverbs and ctypes), kverbs (kernel fast registration: the vrdma_selftest module),
# rxe_shared (Linux rxe on the same eth0 as vrdma0, both busy: rxe must never take vrdma0 for
# one of its devices), port (the port follows the link under the daemon's transport: the host
# takes the namespace's lo, which holds the daemon's address, down and up on the guest's word;
# the kernel's ports/1/state and ibv_asyncwatch see DOWN and PORT_ERR, then ACTIVE and
# PORT_ACTIVE), stats (after the tools before it: `rdma statistic` and ports/1/hw_counters/ show
# the daemon's counters under rxe's names, the packets the tools sent counted);
# compare (not in the default set): ib_send_lat and ib_write_bw over vrdma0 and over Linux rxe
# in the same guest (rxe0 on a second NIC with an address of its own).
# rdma-core's own test suite, side by side with rxe: tests/vm/pyverbs.test.sh.
# Prints "SKIP: <reason>" and exits 0 when not root, or the patched QEMU, the image with
# virtio_rdma.ko or the daemon binary is missing; under CI=true that is a failure.
# Everything runs in a network namespace of its own (tests/vm/net.sh exec): the daemon's
# UDP socket is bound to an address on that namespace's loopback, which is also the guest's
# eth0 address (a NIC attached to nothing), so the guest's RoCEv2 GID is the daemon's.
# Env: VUR_DEVICE_ITERS (default 200), VUR_COMPARE_ITERS (default 1000; 30 000 with
# VUR_COMPARE_TRACE), VUR_COMPARE_TRACE=1 (compare: the host traces vrdma0's two latency runs
# with tests/vm/latency-trace.py, the stages printed and kept in trace.NAME.txt),
# VUR_DEVICE_KEEP=1 (keep the artifacts), VUR_DAEMON (daemon binary), VUR_IMAGES, VUR_QEMU,
# VUR_DRIVER_KO (a virtio_rdma.ko to load instead of the image's: driver development
# without repacking the image), VUR_SELFTEST_KO (likewise for vrdma_selftest.ko).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
iters=${VUR_DEVICE_ITERS:-200}
addr=10.77.0.2
mac=52:54:00:77:00:02
t_start=$SECONDS

log() { printf '[device-verbs %s] %s\n' "$(date +%T)" "$*"; }
# shellcheck source=tests/vm/lib.sh
. "$here/lib.sh"
vm_require device-verbs
vm_device_prereqs device-verbs

vm_netns device-verbs "$@"

work=$(mktemp -d "${TMPDIR:-/tmp}/vur-device-verbs.XXXXXX")
dpid=''
# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    local rc=$?
    if [[ -n $dpid ]] && kill -0 "$dpid" 2>/dev/null; then
        kill "$dpid" 2>/dev/null || true
        wait "$dpid" 2>/dev/null || true
    fi
    if ((rc == 0)) && [[ -z ${VUR_DEVICE_KEEP:-} ]]; then rm -rf "$work"; else log "artifacts kept in $work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The namespace's own loopback carries the daemon's address (nothing else sees it).
log "daemon: $daemon --udp-addr $addr:4791 --mac $mac"
vm_start_daemon "$work" "$addr" "$mac" || exit 1
dpid=$REPLY

tools=("$@")
((${#tools[@]})) || tools=(devinfo rc rc_events uc ud srq send_lat send_bw write_lat write_bw read_bw atomic_bw odp write_bw_odp rping resize_cq mr_iova kverbs rxe_shared port stats)
reload=0
[[ -z ${VUR_SELFTEST_KO:-} ]] || cp "$VUR_SELFTEST_KO" "$work/vrdma_selftest.ko"
if [[ -n ${VUR_DRIVER_KO:-} ]]; then
    cp "$VUR_DRIVER_KO" "$work/virtio_rdma.ko"
    reload=1
fi
cat >"$work/device-guest.sh" <<EOF
#!/bin/bash
# Runs inside the guest (tests/vm/device-verbs.test.sh).
iters=$iters
cmp_iters=${VUR_COMPARE_ITERS:-$( ((${VUR_COMPARE_TRACE:-0})) && echo 30000 || echo 1000)}
trace=${VUR_COMPARE_TRACE:-0}
tools=(${tools[*]})
reload=$reload
EOF
cat >>"$work/device-guest.sh" <<'EOF'
dev=vrdma0
fail=0
if ((reload)); then
    rmmod virtio_rdma && insmod /vur/virtio_rdma.ko ${VUR_DRIVER_PARAMS:-} ||
        { echo "DV-FAIL reloading virtio_rdma"; exit 1; }
    echo "DV driver reloaded from VUR_DRIVER_KO"
fi
report() { echo "DV $1 rc=$2${3:+ $3}"; [[ $2 == 0 ]] || fail=1; }

if [[ ! -e /sys/class/infiniband/$dev ]]; then
    echo "DV-FAIL no $dev; virtio devices: $(cat /sys/bus/virtio/devices/*/device | tr '\n' ' ')"
    dmesg | grep -i -E 'virtio_rdma|vrdma|infiniband' | tail -20
    exit 1
fi
gid=''
for _ in $(seq 50); do gid=$(vur-gid v4 "$dev") && break; sleep 0.1; done
[[ -n $gid ]] || { echo "DV-FAIL no IPv4 RoCE v2 GID on $dev within 5 s"; exit 1; }
echo "DV gid-index-v4=$gid gid=$(cat /sys/class/infiniband/$dev/ports/1/gids/$gid)"

# wait_listen, wait_cm_listen
wait_tag=DV
# shellcheck source=tests/vm/guest-wait.sh
. /vur-scenario/guest-wait.sh

# pair NAME SECONDS SERVER-CMD... -- CLIENT-ARGS...: server in the background, client
# against 127.0.0.1, both bounded by SECONDS. A libibverbs example's --chk finding ("invalid
# data in page N", after which it exits 0) fails the pair.
pair() {
    local name=$1 secs=$2 srv=() cli=() s=0 c=0 t0
    shift 2
    while (($#)) && [[ $1 != -- ]]; do srv+=("$1"); shift; done
    shift
    cli=("$@")
    timeout "$secs" "${srv[@]}" >"/tmp/$name.server" 2>&1 &
    local spid=$!
    wait_listen 18515 || true
    t0=${EPOCHREALTIME/./}
    timeout "$secs" "${srv[@]}" "${cli[@]}" 127.0.0.1 >"/tmp/$name.client" 2>&1 || c=$?
    wait "$spid" || s=$?
    echo "== $name server (rc=$s)"; tail -n 25 "/tmp/$name.server"
    echo "== $name client (rc=$c)"; tail -n 25 "/tmp/$name.client"
    if grep -q 'invalid data' "/tmp/$name.server" "/tmp/$name.client"; then
        echo "DV-FAIL $name: 'invalid data' in its output (--chk found a wrong byte)"
        ((s != 0)) || s=97
    fi
    report "$name" $((s | c)) "server=$s client=$c wall=$(((${EPOCHREALTIME/./} - t0) / 1000))ms"
}

for t in "${tools[@]}"; do
    case $t in
    devinfo)
        ibv_devinfo -v -d "$dev" >/tmp/devinfo 2>&1
        rc=$?
        cat /tmp/devinfo
        grep -q 'state:.*PORT_ACTIVE' /tmp/devinfo || rc=1
        grep -q 'link_layer:.*Ethernet' /tmp/devinfo || rc=1
        grep -qE 'max_qp:[[:space:]]+[1-9]' /tmp/devinfo || rc=1
        report devinfo $rc "$(grep -E 'state:|active_mtu|max_qp:|max_cqe:|max_mr_size' /tmp/devinfo | tr -s ' \t' ' ' | tr '\n' ';')"
        echo "DV gids: $(grep -E 'GID\[' /tmp/devinfo | tr -s ' \t' ' ' | tr '\n' ';')"
        echo "DV driver: $(dmesg | grep -E 'virtio_rdma.*(sends from|paired)|GID add failed' | sed 's/^\[[^]]*\] //' | tr '\n' ';')"
        ;;
    rc) pair rc 60 ibv_rc_pingpong -d "$dev" -g "$gid" -n "$iters" -c -- ;;
    rc_events) pair rc_events 60 ibv_rc_pingpong -d "$dev" -g "$gid" -n "$iters" -e -c -- ;;
    uc) pair uc 120 ibv_uc_pingpong -d "$dev" -g "$gid" -n "$iters" -c -- ;;
    ud) pair ud 120 ibv_ud_pingpong -d "$dev" -g "$gid" -n "$iters" -s 1024 -c -- ;;
    srq) pair srq 120 ibv_srq_pingpong -d "$dev" -g "$gid" -n "$iters" -c -- ;;
    send_lat) pair send_lat 180 ib_send_lat -d "$dev" -x "$gid" -F -n "$iters" -s 64 -- ;;
    write_bw) pair write_bw 180 ib_write_bw -d "$dev" -x "$gid" -F -n "$iters" -s 4096 -- ;;
    send_bw) pair send_bw 180 ib_send_bw -d "$dev" -x "$gid" -F -n "$iters" -s 4096 -- ;;
    write_lat) pair write_lat 180 ib_write_lat -d "$dev" -x "$gid" -F -n "$iters" -s 64 -- ;;
    read_bw) pair read_bw 180 ib_read_bw -d "$dev" -x "$gid" -F -n "$iters" -s 4096 -- ;;
    atomic_bw) pair atomic_bw 180 ib_atomic_bw -d "$dev" -x "$gid" -F -n "$iters" -- ;;
    odp) pair odp 60 ibv_rc_pingpong -d "$dev" -g "$gid" -n "$iters" -o -c -- ;;
    write_bw_odp) pair write_bw_odp 180 ib_write_bw -d "$dev" -x "$gid" -F -n "$iters" -s 4096 --odp -- ;;
    rping)
        # rdma_cm: addresses resolved through eth0, the CM's MADs on the kernel's QP1
        timeout 60 rping -s -a "$VUR_ADDR" -p 7174 -C 20 -v >/tmp/rping.server 2>&1 &
        spid=$!
        wait_cm_listen 7174 || true
        c=0 s=0
        timeout 60 rping -c -a "$VUR_ADDR" -p 7174 -C 20 -v -V >/tmp/rping.client 2>&1 || c=$?
        wait "$spid" || s=$?
        echo "== rping server (rc=$s)"; tail -n 4 /tmp/rping.server
        echo "== rping client (rc=$c)"; tail -n 4 /tmp/rping.client
        report rping $((s | c)) "server=$s client=$c pings=$(grep -c 'ping data' /tmp/rping.client)"
        ;;
    resize_cq)
        # ibv_resize_cq through librxe with completions in the ring (pyverbs, one RC QP
        # connected to itself): none may be lost, the new ring is mapped from the response.
        python3 - "$dev" "$gid" >/tmp/resize_cq.log 2>&1 <<'PY'
import sys, time
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR
ctx = d.Context(name=sys.argv[1])
gidx = int(sys.argv[2])
pd, cq = PD(ctx), CQ(ctx, 15)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, sq_sig_all=1,
                       cap=QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)))
mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
a = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
a.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE
qp.to_init(a)
a = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
a.dest_qp_num, a.rq_psn, a.max_dest_rd_atomic, a.min_rnr_timer = qp.qp_num, 0, 1, 12
a.ah_attr = AHAttr(gr=GlobalRoute(dgid=ctx.query_gid(1, gidx), sgid_index=gidx), is_global=1, port_num=1)
qp.to_rtr(a)
a = QPAttr(qp_state=e.IBV_QPS_RTS)
a.timeout, a.retry_cnt, a.rnr_retry, a.sq_psn, a.max_rd_atomic = 14, 7, 7, 0, 1
qp.to_rts(a)
for i in range(5):
    qp.post_recv(RecvWR(wr_id=100 + i, num_sge=1, sg=[SGE(mr.buf, 64, mr.lkey)]))
    qp.post_send(SendWR(wr_id=i, num_sge=1, sg=[SGE(mr.buf + 64, 64, mr.lkey)], opcode=e.IBV_WR_SEND))
time.sleep(1)
cq.resize(63)
got, end = [], time.time() + 10
while len(got) < 10 and time.time() < end:
    n, wcs = cq.poll(16)
    got += [(w.wr_id, w.status) for w in wcs[:n]]
print("resize_cq: cqe", cq.cqe, "completions", sorted(got))
sys.exit(0 if sorted(i for i, _ in got) == list(range(5)) + list(range(100, 105))
         and all(st == 0 for _, st in got) and cq.cqe == 63 else 1)
PY
        rc=$?
        cat /tmp/resize_cq.log
        report resize_cq $rc
        ;;
    mr_iova)
        # ibv_reg_mr_iova with an IOVA that is not the buffer's address: a buffer 0x456 bytes
        # into its page registered as IOVA 0x1000_0456; RDMA WRITE and READ through it (a
        # pyverbs QP against a QP, PD and MR made with ctypes: pyverbs' MR takes no IOVA) hit
        # exactly the buffer's bytes, and one byte before or past the MR is a remote access
        # error. Then IOVA 0x1000_0123, not congruent to the buffer: the device takes it
        # (RegUserMr's page_offset), but ib_uverbs_reg_mr refuses such IOVAs with EINVAL
        # before any driver sees them (Linux rxe alike), so EINVAL passes; if a kernel lets
        # it through, it gets the same checks.
        python3 - "$dev" "$gid" >/tmp/mr_iova.log 2>&1 <<'PY'
import ctypes as C, hashlib, mmap, sys, time
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR
dev, gidx = sys.argv[1], int(sys.argv[2])
OFF, LEN = 0x456, 0x2000
ACC = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
v = C.CDLL("libibverbs.so.1", use_errno=True)
class Gid(C.Union): _fields_ = [("raw", C.c_uint8 * 16), ("g", C.c_uint64 * 2)]
class Cap(C.Structure): _fields_ = [(n, C.c_uint32) for n in (
    "max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data")]
class InitAttr(C.Structure): _fields_ = [("qp_context", C.c_void_p), ("send_cq", C.c_void_p),
    ("recv_cq", C.c_void_p), ("srq", C.c_void_p), ("cap", Cap), ("qp_type", C.c_int),
    ("sq_sig_all", C.c_int)]
class Grh(C.Structure): _fields_ = [("dgid", Gid), ("flow_label", C.c_uint32),
    ("sgid_index", C.c_uint8), ("hop_limit", C.c_uint8), ("traffic_class", C.c_uint8)]
class Ah(C.Structure): _fields_ = [("grh", Grh), ("dlid", C.c_uint16)] + [(n, C.c_uint8) for n in (
    "sl", "src_path_bits", "static_rate", "is_global", "port_num")]
class Attr(C.Structure): _fields_ = [(n, C.c_uint32) for n in (
    "qp_state", "cur_qp_state", "path_mtu", "path_mig_state", "qkey", "rq_psn", "sq_psn",
    "dest_qp_num", "qp_access_flags")] + [("cap", Cap), ("ah_attr", Ah), ("alt_ah_attr", Ah),
    ("pkey_index", C.c_uint16), ("alt_pkey_index", C.c_uint16)] + [(n, C.c_uint8) for n in (
    "en_sqd_async_notify", "sq_draining", "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer",
    "port_num", "timeout", "retry_cnt", "rnr_retry", "alt_port_num", "alt_timeout")] + [
    ("rate_limit", C.c_uint32)]
class Mr(C.Structure): _fields_ = [("context", C.c_void_p), ("pd", C.c_void_p), ("addr", C.c_void_p),
    ("length", C.c_size_t), ("handle", C.c_uint32), ("lkey", C.c_uint32), ("rkey", C.c_uint32)]
class Qp(C.Structure): _fields_ = [("context", C.c_void_p), ("qp_context", C.c_void_p),
    ("pd", C.c_void_p), ("send_cq", C.c_void_p), ("recv_cq", C.c_void_p), ("srq", C.c_void_p),
    ("handle", C.c_uint32), ("qp_num", C.c_uint32)]
assert C.sizeof(Attr) == 144 and C.sizeof(InitAttr) == 64
v.ibv_get_device_list.restype = C.POINTER(C.c_void_p)
v.ibv_get_device_list.argtypes = [C.POINTER(C.c_int)]
v.ibv_get_device_name.restype, v.ibv_get_device_name.argtypes = C.c_char_p, [C.c_void_p]
v.ibv_open_device.restype, v.ibv_open_device.argtypes = C.c_void_p, [C.c_void_p]
v.ibv_alloc_pd.restype, v.ibv_alloc_pd.argtypes = C.c_void_p, [C.c_void_p]
v.ibv_reg_mr_iova.restype = C.POINTER(Mr)
v.ibv_reg_mr_iova.argtypes = [C.c_void_p, C.c_void_p, C.c_size_t, C.c_uint64, C.c_int]
v.ibv_create_cq.restype = C.c_void_p
v.ibv_create_cq.argtypes = [C.c_void_p, C.c_int, C.c_void_p, C.c_void_p, C.c_int]
v.ibv_create_qp.restype, v.ibv_create_qp.argtypes = C.POINTER(Qp), [C.c_void_p, C.POINTER(InitAttr)]
v.ibv_modify_qp.argtypes = [C.c_void_p, C.POINTER(Attr), C.c_int]
v.ibv_query_gid.argtypes = [C.c_void_p, C.c_uint8, C.c_int, C.POINTER(Gid)]

n = C.c_int()
lst = v.ibv_get_device_list(C.byref(n))
raw = next(lst[i] for i in range(n.value) if v.ibv_get_device_name(lst[i]).decode() == dev)
pctx = v.ibv_open_device(raw)
ppd = v.ibv_alloc_pd(pctx)
pcq = v.ibv_create_cq(pctx, 16, None, None, 0)
gid = Gid()
assert v.ibv_query_gid(pctx, 1, gidx, C.byref(gid)) == 0
buf = mmap.mmap(-1, 4 * 4096)
base = C.addressof(C.c_char.from_buffer(buf))

ctx = d.Context(name=dev)
pd, cq = PD(ctx), CQ(ctx, 16)
local = MR(pd, LEN, ACC)

def passive_qp():
    ia = InitAttr(send_cq=pcq, recv_cq=pcq, qp_type=e.IBV_QPT_RC, sq_sig_all=1,
                  cap=Cap(4, 4, 1, 1, 0))
    q = v.ibv_create_qp(ppd, C.byref(ia))
    assert q, "ibv_create_qp"
    return q

def modify(q, a, mask):
    rc = v.ibv_modify_qp(q, C.byref(a), mask)
    assert rc == 0, f"ibv_modify_qp {mask:#x}: {rc}"

def connect():
    q = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, sq_sig_all=1,
                          cap=QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)))
    p = passive_qp()
    a = Attr(qp_state=e.IBV_QPS_INIT, port_num=1, qp_access_flags=ACC)
    modify(p, a, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS)
    a = Attr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024, dest_qp_num=q.qp_num,
             max_dest_rd_atomic=1, min_rnr_timer=12)
    a.ah_attr.is_global, a.ah_attr.port_num = 1, 1
    a.ah_attr.grh.dgid, a.ah_attr.grh.sgid_index, a.ah_attr.grh.hop_limit = gid, gidx, 64
    modify(p, a, e.IBV_QP_STATE | e.IBV_QP_AV | e.IBV_QP_PATH_MTU | e.IBV_QP_DEST_QPN |
           e.IBV_QP_RQ_PSN | e.IBV_QP_MAX_DEST_RD_ATOMIC | e.IBV_QP_MIN_RNR_TIMER)
    a = Attr(qp_state=e.IBV_QPS_RTS, timeout=14, retry_cnt=7, rnr_retry=7, max_rd_atomic=1)
    modify(p, a, e.IBV_QP_STATE | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY |
           e.IBV_QP_SQ_PSN | e.IBV_QP_MAX_QP_RD_ATOMIC)
    qa = QPAttr(qp_state=e.IBV_QPS_INIT, port_num=1)
    qa.qp_access_flags = ACC
    q.to_init(qa)
    qa = QPAttr(qp_state=e.IBV_QPS_RTR, path_mtu=e.IBV_MTU_1024)
    qa.dest_qp_num, qa.rq_psn, qa.max_dest_rd_atomic, qa.min_rnr_timer = p.contents.qp_num, 0, 1, 12
    qa.ah_attr = AHAttr(gr=GlobalRoute(dgid=ctx.query_gid(1, gidx), sgid_index=gidx),
                        is_global=1, port_num=1)
    q.to_rtr(qa)
    qa = QPAttr(qp_state=e.IBV_QPS_RTS)
    qa.timeout, qa.retry_cnt, qa.rnr_retry, qa.sq_psn, qa.max_rd_atomic = 14, 7, 7, 0, 1
    q.to_rts(qa)
    return q

def rdma(q, opcode, rkey, addr, length):
    wr = SendWR(wr_id=1, opcode=opcode, num_sge=1, sg=[SGE(local.buf, length, local.lkey)])
    wr.set_wr_rdma(rkey, addr)
    q.post_send(wr)
    end = time.time() + 20
    while time.time() < end:
        n, wcs = cq.poll(1)
        if n:
            return wcs[0].status
        time.sleep(0.01)
    return None

fails = []
def check(what, ok):
    print("mr_iova:", what, "ok" if ok else "FAIL")
    ok or fails.append(what)

# The payload: SHAKE-128 (no period: a byte placed at the wrong offset differs); the target
# and the sink are poisoned with its complement before each operation, so every byte that
# is not placed differs from the byte that must be there.
INV = bytes(range(255, -1, -1))

def through(iova, rkey):
    data = hashlib.shake_128(f"mr_iova {iova:#x}".encode()).digest(LEN)
    buf[:] = bytes(len(buf))
    buf[OFF:OFF + LEN] = data.translate(INV)
    buf[OFF - 1:OFF] = buf[OFF + LEN:OFF + LEN + 1] = b"\x5a"
    local.write(data, LEN)
    q = connect()
    check(f"{iova:#x}: write the whole MR", rdma(q, e.IBV_WR_RDMA_WRITE, rkey, iova, LEN) == 0
          and bytes(buf[OFF:OFF + LEN]) == data)
    check(f"{iova:#x}: bytes around the MR untouched",
          buf[OFF - 1:OFF] == b"\x5a" and buf[OFF + LEN:OFF + LEN + 1] == b"\x5a")
    local.write(data[0x100:].translate(INV), LEN - 0x100)
    check(f"{iova:#x}: read across both page boundaries",
          rdma(q, e.IBV_WR_RDMA_READ, rkey, iova + 0x100, LEN - 0x100) == 0
          and local.read(LEN - 0x100, 0) == data[0x100:])
    for what, addr, length, want in [
            ("write one byte before", iova - 1, 1, e.IBV_WC_REM_ACCESS_ERR),
            ("write past the end", iova + LEN - 1, 2, e.IBV_WC_REM_ACCESS_ERR),
            ("write the last byte", iova + LEN - 1, 1, 0)]:
        before = bytes(buf[:])
        local.write(b"\xee" * 4, 4)
        st = rdma(connect(), e.IBV_WR_RDMA_WRITE, rkey, addr, length)
        changed = [i for i in range(len(before)) if before[i] != buf[i]]
        check(f"{iova:#x}: {what}: status {st}",
              st == want and changed == ([] if want else [OFF + LEN - 1]))

for iova in (0x1000_0456, 0x1000_0123):
    pmr = v.ibv_reg_mr_iova(ppd, base + OFF, LEN, iova, ACC)
    if not pmr:
        err = C.get_errno()
        incongruent = (iova ^ (base + OFF)) & 0xfff
        check(f"IOVA {iova:#x}: ibv_reg_mr_iova errno {err}"
              + (" (ib_uverbs_reg_mr refuses an IOVA not congruent to the address)"
                 if incongruent else ""), incongruent and err == 22)
        continue
    print(f"mr_iova: {LEN:#x} bytes at page offset {OFF:#x} registered as IOVA {iova:#x}")
    through(iova, pmr.contents.rkey)
sys.exit(1 if fails else 0)
PY
        rc=$?
        sed 's/^/DV /' /tmp/mr_iova.log
        report mr_iova $rc
        ;;
    kverbs)
        # Kernel verbs no user tool reaches (fast registration): the vrdma_selftest module
        # from guest-driver-patches/linux/selftest runs its test at load and prints the verdict.
        ko=/vur/vrdma_selftest.ko
        [[ -f $ko ]] || ko=$(modinfo -n vrdma_selftest 2>/dev/null)
        if [[ -z $ko || ! -f $ko ]]; then
            echo "DV-FAIL kverbs: no vrdma_selftest.ko"; fail=1; continue
        fi
        insmod "$ko" devname="$dev" 2>/dev/null
        v=$(dmesg | grep -a 'vrdma_selftest: \(PASS\|FAIL\)' | tail -1 | sed 's/^\[[^]]*\] //')
        echo "DV $v"
        [[ $v == *PASS* ]] && report kverbs 0 || report kverbs 1
        ;;
    rxe_shared)
        # Linux rxe on the very netdev vrdma0 is paired with (eth0), both devices busy at once:
        # rxe resolves its device by netdev on every packet and netdev event, and must never
        # find this one (the kernel is booted with oops=panic: any oops ends the run).
        modprobe rdma_rxe && rdma link add rxe0 type rxe netdev eth0 ||
            { echo "DV-FAIL rxe_shared: rdma link add rxe0 on eth0 failed"; fail=1; continue; }
        rgid=''
        for _ in $(seq 100); do rgid=$(vur-gid v4 rxe0) && break; sleep 0.1; done
        ip link set eth0 mtu 1400 && ip link set eth0 mtu 1500 # netdev events with both present
        timeout 120 ibv_rc_pingpong -d rxe0 -g "$rgid" -n "$iters" -p 18600 -c >/tmp/rxe_shared.rs 2>&1 &
        p1=$!
        pair rxe_shared_vrdma0 120 ibv_rc_pingpong -d "$dev" -g "$gid" -n "$iters" -c --
        wait_listen 18600 || true
        timeout 120 ibv_rc_pingpong -d rxe0 -g "$rgid" -n "$iters" -p 18600 -c 127.0.0.1 >/tmp/rxe_shared.rc 2>&1
        c=$?
        wait "$p1"; s=$?
        if grep -q 'invalid data' /tmp/rxe_shared.rs /tmp/rxe_shared.rc; then
            echo "DV-FAIL rxe_shared: 'invalid data' in rxe0's pingpong output"
            ((s != 0)) || s=97
        fi
        rdma link delete rxe0
        report rxe_shared $((s | c)) "rxe0 server=$s client=$c"
        ;;
    compare)
        # The same perftest runs over vrdma0 and over Linux rxe, same sizes, same guest: the
        # ratio is the figure (TCG makes absolute values moot). rxe0 goes on the second NIC
        # (found by its MAC) with an address of its own.
        nic=''
        for n in /sys/class/net/*; do [[ $(cat "$n/address") == 52:54:00:79:00:02 ]] && nic=${n##*/}; done
        ip link set "$nic" up && ip addr add 10.79.0.2/24 dev "$nic" && modprobe rdma_rxe &&
            rdma link add rxe0 type rxe netdev "$nic" || { echo "DV-FAIL compare: no rxe0"; fail=1; continue; }
        rgid=''
        for _ in $(seq 100); do rgid=$(vur-gid v4 rxe0) && break; sleep 0.1; done
        [[ -n $rgid ]] || { echo "DV-FAIL compare: no rxe0 IPv4 GID"; fail=1; continue; }
        cmp_rc=0
        # trace_on NAME: with VUR_COMPARE_TRACE=1 the host traces the next run of vrdma0
        # (tests/vm/latency-trace.py); it says when it is ready.
        trace_on() {
            ((trace)) && [[ $1 == *"$dev" ]] || return 0
            touch "/vur/trace.$1.want"
            for _ in $(seq 150); do [[ -f /vur/trace.$1.on ]] && return 0; sleep 0.1; done
            echo "DV-FAIL compare: the host's tracer did not start for $1 within 15 s"; fail=1
        }
        for d in "$dev:$gid" "rxe0:$rgid"; do
            trace_on "send_lat_${d%%:*}"
            pair "send_lat_${d%%:*}" 180 ib_send_lat -d "${d%%:*}" -x "${d#*:}" -F -n "$cmp_iters" -s 64 -- || true
            trace_on "send_lat_ev_${d%%:*}"
            pair "send_lat_ev_${d%%:*}" 180 ib_send_lat -d "${d%%:*}" -x "${d#*:}" -F -n "$cmp_iters" -s 64 -e -- || true
            pair "write_bw_${d%%:*}" 180 ib_write_bw -d "${d%%:*}" -x "${d#*:}" -F -n "$cmp_iters" -s 65536 -- || true
        done
        lat() { awk '/^ *64 +[0-9]+ /{print $6; exit}' "/tmp/send_lat_$1.client"; }
        bw() { awk '/^ *65536 +[0-9]+ /{print $4; exit}' "/tmp/write_bw_$1.client"; }
        lat_ev() { awk '/^ *64 +[0-9]+ /{print $6; exit}' "/tmp/send_lat_ev_$1.client"; }
        echo "DV-CMP ib_send_lat 64 B t_avg usec: vrdma0 $(lat $dev) rxe0 $(lat rxe0)"
        echo "DV-CMP ib_send_lat -e 64 B t_avg usec: vrdma0 $(lat_ev $dev) rxe0 $(lat_ev rxe0)"
        echo "DV-CMP ib_write_bw 64 KiB BW average MiB/s: vrdma0 $(bw $dev) rxe0 $(bw rxe0)"
        ;;
    port)
        st() { cat "/sys/class/infiniband/$dev/ports/1/state"; }
        stdbuf -oL ibv_asyncwatch -d "$dev" >/tmp/asyncwatch 2>&1 &
        apid=$!
        # It listens once it holds the device's uverbs file open.
        for _ in $(seq 100); do
            ls -l "/proc/$apid/fd" 2>/dev/null | grep -q uverbs && break
            sleep 0.05
        done
        s0=$(st)
        touch /vur/port-down
        for _ in $(seq 300); do [[ $(st) == *DOWN* ]] && break; sleep 0.05; done
        s1=$(st)
        touch /vur/port-up
        for _ in $(seq 300); do [[ $(st) == *ACTIVE* ]] && break; sleep 0.05; done
        s2=$(st)
        for _ in $(seq 100); do grep -q PORT_ACTIVE /tmp/asyncwatch && break; sleep 0.05; done
        kill "$apid" 2>/dev/null; wait "$apid" 2>/dev/null
        rc=0
        [[ $s0 == *ACTIVE* && $s1 == *DOWN* && $s2 == *ACTIVE* ]] || rc=1
        grep -q 'PORT_ERR' /tmp/asyncwatch && grep -q 'PORT_ACTIVE' /tmp/asyncwatch || rc=1
        ((rc == 0)) || { echo "== ibv_asyncwatch"; cat /tmp/asyncwatch; }
        report port $rc "state: $s0 -> $s1 -> $s2; events: $(grep -oE 'IBV_EVENT_PORT_[A-Z]+' /tmp/asyncwatch | tr '\n' ' ')"
        ;;
    stats)
        rdma statistic show link "$dev/1" >/tmp/stats 2>&1
        rc=$?
        hw=/sys/class/infiniband/$dev/ports/1/hw_counters
        sent=$(cat "$hw/sent_pkts" 2>/dev/null || echo none)
        rcvd=$(cat "$hw/rcvd_pkts" 2>/dev/null || echo none)
        for n in sent_pkts rcvd_pkts duplicate_request out_of_seq_request rcvd_rnr_err \
            send_rnr_err rcvd_seq_err retry_exceeded_err retry_rnr_exceeded_err \
            completer_retry_err link_downed; do
            grep -qw "$n" /tmp/stats || { echo "DV-FAIL rdma statistic: no $n"; rc=1; }
        done
        # Every tool before this one sent packets through the port (a port tool before it
        # took it down once).
        [[ $sent =~ ^[0-9]+$ && $rcvd =~ ^[0-9]+$ ]] && ((sent > 0 && rcvd > 0)) || rc=1
        [[ " ${tools[*]} " != *" port "* ]] || [[ $(cat "$hw/link_downed") == 1 ]] || rc=1
        ((rc == 0)) || cat /tmp/stats
        report stats $rc "$(tr -s ' \n\t' ' ' <"/tmp/stats" | head -c 400)"
        ;;
    *) echo "DV unknown tool $t"; fail=1 ;;
    esac
done
# Let the host read the daemon's counters while this guest is still connected (every tool
# has exited: only the kernel's own objects, QP1 and its CQ, may remain).
touch /vur/tools-done
for _ in $(seq 300); do [[ -f /vur/counters-read ]] && break; sleep 0.1; done
[[ -f /vur/counters-read ]] || echo "DV note: the host did not read the counters within 30 s"
if ((fail)); then
    echo "== dmesg (virtio_rdma, infiniband)"
    dmesg | grep -iE 'virtio_rdma|vrdma|infiniband|ib_|rdma' | tail -40
fi
exit $fail
EOF

vm_timeout=900
nic2=()
if [[ " ${tools[*]} " == *" compare "* ]]; then
    "$here/net.sh" up vurtapA
    nic2=(--tap2 vurtapA --mac2 52:54:00:79:00:02)
fi
log "booting guest (qemu $qemu, image $images)"
vm_rc=0
(
    for _ in $(seq 9000); do [[ -f $work/tools-done ]] && break; sleep 0.1; done
    [[ -f $work/tools-done ]] && vm_daemon_counters "$work/counters.sock" >"$work/counters.json" 2>&1
    touch "$work/counters-read"
) &
watcher=$!
# The port tool: lo (the daemon's address) down when the guest asks, up when it asks again
# (or after 30 s, so that the namespace never stays without it).
(
    for _ in $(seq 9000); do
        [[ -f $work/port-down || -f $work/tools-done ]] && break
        sleep 0.1
    done
    [[ -f $work/port-down ]] || exit 0
    ip link set lo down && log "port: lo down"
    for _ in $(seq 300); do [[ -f $work/port-up ]] && break; sleep 0.1; done
    ip link set lo up && log "port: lo up"
) &
porter=$!
# VUR_COMPARE_TRACE=1: when the guest asks (trace.NAME.want), trace QEMU and the daemon for
# 2 s from 2 s after the run starts (past perftest's connection set-up): trace.NAME.txt.
tracer=''
if ((${VUR_COMPARE_TRACE:-0})); then
    (
        while [[ ! -f $work/tools-done ]]; do
            for w in "$work"/trace.*.want; do
                [[ -f $w ]] || continue
                n=${w%.want}
                rm -f "$w"
                qpid=$(pgrep -f -n "qemu-system.*$work/rdma.sock") || qpid=''
                touch "$n.on"
                sleep 2
                if [[ -n $qpid ]]; then
                    python3 "$here/latency-trace.py" --qemu "$qpid" --daemon "$dpid" --seconds 2 --keep "$n.perf" >"$n.txt" 2>&1
                else
                    echo "latency-trace: no QEMU process found" >"$n.txt"
                fi
                log "trace ${n##*/trace.}:"
                sed 's/^/  /' "$n.txt"
            done
            sleep 0.1
        done
    ) &
    tracer=$!
fi
"$here/run-vm.sh" --name dv --qemu "$qemu" --images "$images" --rdma-sock "$work/rdma.sock" \
    --nic-no-peer --mac "$mac" --ip "$addr/24" --no-rxe "${nic2[@]}" --shared "$work" --smp "${VUR_DEVICE_SMP:-2}" \
    --scenario "$work/device-guest.sh" --file "$here/guest-wait.sh" --timeout "$vm_timeout" ${VUR_DRIVER_PARAMS:+--env "VUR_DRIVER_PARAMS=$VUR_DRIVER_PARAMS"} || vm_rc=$?

tr -d '\r' <"$work/dv.console.log" |
    grep -a -E '^DV|^\[vur-init|usec/iter|t_avg|BW average|^ *[0-9]+ +[0-9]+ +[0-9.]+' || true
grep -a '^DV-CMP' "$work/dv.console.log" | tr -d '\r' >"$work/compare.txt" || true
kill "$watcher" 2>/dev/null || true
wait "$watcher" 2>/dev/null || true
kill "$porter" 2>/dev/null || true
wait "$porter" 2>/dev/null || true
if [[ -n $tracer ]]; then kill "$tracer" 2>/dev/null || true; wait "$tracer" 2>/dev/null || true; fi
ip link set lo up
leak=0
if [[ -s $work/counters.json ]]; then
    msg=$(vm_daemon_leaks device-verbs "$work/counters.json") || leak=1
    log "$msg"
    log "device counters: $(python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1])).get("device",{})))' "$work/counters.json" 2>&1)"
    # The ODP tools' MRs were on demand: their pages came through PAGE_FAULT and UPDATE_ODP.
    if [[ " ${tools[*]} " =~ \ (odp|write_bw_odp)\  ]]; then
        odp=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))
print(c["port"]["odp_faults"], c["device"]["odp_updates"])' "$work/counters.json")
        log "ODP: page faults and UPDATE_ODP maps: $odp"
        [[ $odp =~ ^[1-9][0-9]*\ [1-9][0-9]*$ ]] || { log "FAIL: the ODP tools mapped no page on demand"; leak=1; }
    fi
else
    log "note: no counters read (the guest did not reach the end of its tools)"
fi
if ! kill -0 "$dpid" 2>/dev/null; then
    log "FAIL: the daemon died"; tail -20 "$work/daemon.log"; exit 1
fi
if ((vm_rc == 0 && leak == 0)); then
    log "PASS (${tools[*]}) in $((SECONDS - t_start)) s"
else
    log "FAIL: guest rc=$vm_rc (console: $work/dv.console.log, daemon: $work/daemon.log)"
    tail -20 "$work/daemon.log"
    exit 1
fi
