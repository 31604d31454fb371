#!/usr/bin/env python3
"""The guest side of tests/vm/differential.test.sh: one queue pair at a time, on any RDMA
device, set up and inspected on the host's request (pyverbs, stock rdma-core).

    diff-target.py --listen IP[:PORT]          (port default 18600)

One TCP client at a time; requests and replies are lines of words, "key=value" after the
first word. Requests:

    setup dev=D type=rc|uc|ud dgid=IP peer_qpn=N psn=N sq_psn=N mtu=256|1024|4096
          recvs=N recv_len=N srq=0|1 mr_len=N mr=LW,RW,RR,RA,MB,FG qp=RW,RR,RA
          rd_atomic=N rnr_timer=N retry=N rnr_retry=N timeout=N qkey=N mw=0|1 self_ip=IP
        -> "ok qpn=N rkey=N va=N mw_rkey=N"   (a queue pair in RTS, receives posted,
           the MR filled with its pattern; mw=1 binds a type 2 window over the MR)
    post opcode=SEND|SEND_IMM|SEND_INV|WRITE|WRITE_IMM|READ|CAS|FAA len=N raddr=N rkey=N
         imm=N compare=N swap=N
        -> "ok" (one signaled work request on the queue pair)
    result
        -> "wc status=S opcode=O len=N imm=N flags=F src_qp=Q" per completion (CQ drained for
           a moment; on a UD receive also "grh ..." with the IPv4 header's fields, addresses
           named PEER (dgid) and SELF (self_ip)), then "qp state=S", "mr sha=HEX" (GRHs
           zeroed), "end"; the queue pair and everything of it is destroyed
    bye

Errors answer "err WHAT" and leave the target ready for the next setup.
"""
import hashlib
import ipaddress
import socket
import subprocess
import sys
import time

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GID, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR, MW, MWBindInfo
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
from pyverbs.wr import RecvWR, SGE, SendWR

ACCESS = {
    "LW": e.IBV_ACCESS_LOCAL_WRITE,
    "RW": e.IBV_ACCESS_REMOTE_WRITE,
    "RR": e.IBV_ACCESS_REMOTE_READ,
    "RA": e.IBV_ACCESS_REMOTE_ATOMIC,
    "MB": e.IBV_ACCESS_MW_BIND,
    "FG": getattr(e, "IBV_ACCESS_FLUSH_GLOBAL", 1 << 8),
}
MTU = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024, 4096: e.IBV_MTU_4096}
STATES = {
    e.IBV_QPS_RESET: "RESET", e.IBV_QPS_INIT: "INIT", e.IBV_QPS_RTR: "RTR",
    e.IBV_QPS_RTS: "RTS", e.IBV_QPS_SQD: "SQD", e.IBV_QPS_SQE: "SQE", e.IBV_QPS_ERR: "ERR",
}
OPS = {
    "SEND": e.IBV_WR_SEND, "SEND_IMM": e.IBV_WR_SEND_WITH_IMM, "SEND_INV": e.IBV_WR_SEND_WITH_INV,
    "WRITE": e.IBV_WR_RDMA_WRITE, "WRITE_IMM": e.IBV_WR_RDMA_WRITE_WITH_IMM,
    "READ": e.IBV_WR_RDMA_READ, "CAS": e.IBV_WR_ATOMIC_CMP_AND_SWP,
    "FAA": e.IBV_WR_ATOMIC_FETCH_AND_ADD,
}
WC_STATUSES = {
    getattr(e, "IBV_WC_" + n): n for n in (
        "SUCCESS LOC_LEN_ERR LOC_QP_OP_ERR LOC_EEC_OP_ERR LOC_PROT_ERR WR_FLUSH_ERR MW_BIND_ERR "
        "BAD_RESP_ERR LOC_ACCESS_ERR REM_INV_REQ_ERR REM_ACCESS_ERR REM_OP_ERR RETRY_EXC_ERR "
        "RNR_RETRY_EXC_ERR LOC_RDD_VIOL_ERR REM_INV_RD_REQ_ERR REM_ABORT_ERR INV_EECN_ERR "
        "INV_EEC_STATE_ERR FATAL_ERR RESP_TIMEOUT_ERR GENERAL_ERR").split()
    if hasattr(e, "IBV_WC_" + n)
}
WC_OPCODES = {
    e.IBV_WC_SEND: "SEND", e.IBV_WC_RDMA_WRITE: "RDMA_WRITE", e.IBV_WC_RDMA_READ: "RDMA_READ",
    e.IBV_WC_COMP_SWAP: "COMP_SWAP", e.IBV_WC_FETCH_ADD: "FETCH_ADD",
    e.IBV_WC_BIND_MW: "BIND_MW", e.IBV_WC_LOCAL_INV: "LOCAL_INV", e.IBV_WC_RECV: "RECV",
    e.IBV_WC_RECV_RDMA_WITH_IMM: "RECV_RDMA_WITH_IMM",
}


def pattern(n):
    """The MR's initial contents: bytes the host can predict (i*7+3 mod 251)."""
    return bytes((i * 7 + 3) % 251 for i in range(n))


def flags(spec, table):
    v = 0
    for f in filter(None, spec.split(",")):
        v |= table[f]
    return v


def v4_gid(ip):
    """The IPv4-mapped GID of ip in the form pyverbs takes (eight groups of hex)."""
    b = b"\0" * 10 + b"\xff\xff" + ipaddress.IPv4Address(ip).packed
    return ":".join(b[i:i + 2].hex() for i in range(0, 16, 2))


def gid_index(dev):
    return int(subprocess.check_output(["vur-gid", "v4", dev], text=True).strip())


class Target:
    def __init__(self):
        self.objs = []  # closed in reverse order by teardown()

    def setup(self, a):
        self.type = a["type"]
        self.peer_ip, self.self_ip = a.get("dgid"), a.get("self_ip")
        self.ctx = self.keep(Context(name=a["dev"]))
        self.pd = self.keep(PD(self.ctx))
        self.mr_len = int(a.get("mr_len", 4096))
        self.mr = self.keep(MR(self.pd, self.mr_len, flags(a.get("mr", "LW"), ACCESS)))
        self.mr.write(pattern(self.mr_len), self.mr_len)
        self.cq = self.keep(CQ(self.ctx, 256, None, None, 0))
        self.srq = None
        recvs = int(a.get("recvs", 4))
        if a.get("srq") == "1":
            self.srq = self.keep(SRQ(self.pd, SrqInitAttr(SrqAttr(max_wr=64, max_sge=1))))
        qpt = {"rc": e.IBV_QPT_RC, "uc": e.IBV_QPT_UC, "ud": e.IBV_QPT_UD}[self.type]
        cap = QPCap(max_send_wr=16, max_recv_wr=64, max_send_sge=1, max_recv_sge=1)
        init = QPInitAttr(qp_type=qpt, scq=self.cq, rcq=self.cq, srq=self.srq, cap=cap)
        attr = QPAttr(port_num=1)
        if self.type == "ud":
            attr.qkey = int(a.get("qkey", 0x11111111))
            attr.pkey_index = 0
            attr.sq_psn = int(a.get("sq_psn", 0))
        else:
            attr.qp_access_flags = flags(a.get("qp", "RW,RR,RA"), ACCESS)
        self.qp = self.keep(QP(self.pd, init, attr))  # RC/UC: INIT; UD: RTS
        # receives before RTR, so nothing arriving early finds an empty queue
        self.recv_len = recv_len = int(a.get("recv_len", 1024))
        for i in range(recvs):
            off = (i * recv_len) % self.mr_len
            ln = min(recv_len, self.mr_len - off)
            wr = RecvWR(wr_id=100 + i, num_sge=1, sg=[SGE(self.mr.buf + off, ln, self.mr.lkey)])
            (self.srq or self.qp).post_recv(wr)
        if self.type != "ud":
            gi = gid_index(a["dev"])
            gr = GlobalRoute(dgid=GID(v4_gid(a["dgid"])), sgid_index=gi)
            attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
            attr.path_mtu = MTU[int(a.get("mtu", 1024))]
            attr.dest_qp_num = int(a["peer_qpn"])
            attr.rq_psn = int(a["psn"])
            attr.max_dest_rd_atomic = int(a.get("rd_atomic", 4))
            attr.min_rnr_timer = int(a.get("rnr_timer", 1))
            self.qp.to_rtr(attr)
            attr.sq_psn = int(a.get("sq_psn", 0))
            attr.timeout = int(a.get("timeout", 17))
            attr.retry_cnt = int(a.get("retry", 7))
            attr.rnr_retry = int(a.get("rnr_retry", 7))
            attr.max_rd_atomic = int(a.get("rd_atomic", 4))
            self.qp.to_rts(attr)
        self.mw_rkey = 0
        if a.get("mw") == "1":
            self.mw = self.keep(MW(self.pd, e.IBV_MW_TYPE_2))
            wr = SendWR(wr_id=1, opcode=e.IBV_WR_BIND_MW, send_flags=e.IBV_SEND_SIGNALED)
            wr.set_bind_wr(self.mw, MWBindInfo(self.mr, self.mr.buf, self.mr_len,
                                               e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ))
            self.qp.post_send(wr)
            wcs = self.poll(1, 2.0)
            if len(wcs) != 1 or wcs[0].status != e.IBV_WC_SUCCESS:
                raise RuntimeError(f"BIND_MW did not complete: {[w.status for w in wcs]}")
            self.mw_rkey = wr.rkey

    def keep(self, o):
        self.objs.append(o)
        return o

    def post(self, a):
        op = OPS[a["opcode"]]
        ln = int(a.get("len", 0))
        wr = SendWR(wr_id=1, opcode=op, num_sge=1 if ln else 0,
                    sg=[SGE(self.mr.buf, ln, self.mr.lkey)] if ln else None,
                    send_flags=e.IBV_SEND_SIGNALED)
        if op in (e.IBV_WR_RDMA_WRITE, e.IBV_WR_RDMA_WRITE_WITH_IMM, e.IBV_WR_RDMA_READ):
            wr.set_wr_rdma(int(a["rkey"]), int(a["raddr"]))
        if op in (e.IBV_WR_ATOMIC_CMP_AND_SWP, e.IBV_WR_ATOMIC_FETCH_AND_ADD):
            wr.set_wr_atomic(int(a["rkey"]), int(a["raddr"]), int(a.get("compare", 0)),
                             int(a.get("swap", 0)))
        if op in (e.IBV_WR_SEND_WITH_IMM, e.IBV_WR_RDMA_WRITE_WITH_IMM, e.IBV_WR_SEND_WITH_INV):
            wr.imm_data = int(a.get("imm", 0))
        self.qp.post_send(wr)

    def poll(self, want, secs):
        out, end = [], time.monotonic() + secs
        while time.monotonic() < end:
            n, wcs = self.cq.poll(16)
            out += wcs[:n]
            if want and len(out) >= want:
                break
            if not n:
                time.sleep(0.005)
        return out

    def result(self):
        lines = []
        self.grh_at = []
        for wc in self.poll(0, 0.3):
            st = WC_STATUSES.get(wc.status, wc.status)
            op = WC_OPCODES.get(wc.opcode, str(wc.opcode)) if wc.status == e.IBV_WC_SUCCESS else "-"
            fl = []
            if wc.wc_flags & e.IBV_WC_WITH_IMM:
                fl.append("IMM")
            if wc.wc_flags & e.IBV_WC_WITH_INV:
                fl.append("INV")
            if wc.wc_flags & e.IBV_WC_IP_CSUM_OK:
                fl.append("IP_CSUM_OK")
            # the GRH flag only means something on a UD receive (its buffer starts with the
            # GRH); rxe sets it on every receive, the device on UD ones
            if wc.wc_flags & e.IBV_WC_GRH and self.type == "ud":
                fl.append("GRH")
            lines.append(f"wc wr_id={wc.wr_id} status={st} opcode={op} "
                         f"len={wc.byte_len if wc.status == e.IBV_WC_SUCCESS else '-'} "
                         f"imm={wc.imm_data if fl else '-'} flags={','.join(fl) or '-'} "
                         f"src_qp={wc.src_qp if self.type == 'ud' else '-'}")
            if self.type == "ud" and wc.status == e.IBV_WC_SUCCESS and wc.wr_id >= 100:
                off = (wc.wr_id - 100) * self.recv_len % self.mr_len
                self.grh_at.append(off)
                lines.append("grh " + self.grh(off))
        qattr, _ = self.qp.query(e.IBV_QP_STATE)
        lines.append(f"qp state={STATES.get(qattr.qp_state, qattr.qp_state)}")
        mem = bytearray(self.mr.read(self.mr_len, 0))
        for off in self.grh_at:  # reported field by field above
            mem[off:off + 40] = bytes(40)
        lines.append("mr sha=" + hashlib.sha256(mem).hexdigest()[:16])
        return lines

    def grh(self, off):
        """The 40 bytes a UD receive starts with, field by field (RoCEv2 over IPv4: 20 unused
        bytes, then the IPv4 header)."""
        g = self.mr.read(40, off)
        if any(g[:20]):
            return "v6-or-other hex=" + g.hex()
        ip = g[20:]
        words = sum(int.from_bytes(ip[i:i + 2], "big") for i in range(0, 20, 2))
        while words >> 16:
            words = (words & 0xffff) + (words >> 16)
        name = {self.peer_ip: "PEER", self.self_ip: "SELF"}
        src, dst = (".".join(map(str, ip[i:i + 4])) for i in (12, 16))
        return (f"ver_ihl={ip[0]:#x} tos={ip[1]:#x} tot_len={int.from_bytes(ip[2:4], 'big')} "
                f"id={int.from_bytes(ip[4:6], 'big'):#x} frag={int.from_bytes(ip[6:8], 'big'):#x} "
                f"ttl={ip[8]} proto={ip[9]} csum={'ok' if words == 0xffff else 'BAD'} "
                f"src={name.get(src, src)} dst={name.get(dst, dst)}")

    def teardown(self):
        for o in reversed(self.objs):
            try:
                o.close()
            except Exception as ex:  # report, but keep closing the rest
                print(f"diff-target: close {type(o).__name__}: {ex}", file=sys.stderr)
        self.objs = []


def serve(conn):
    f = conn.makefile("rw", buffering=1)
    t = None
    for line in f:
        words = line.split()
        if not words:
            continue
        cmd, a = words[0], dict(w.split("=", 1) for w in words[1:] if "=" in w)
        try:
            if cmd == "setup":
                if t:
                    t.teardown()
                t = Target()
                try:
                    t.setup(a)
                except Exception:
                    t.teardown()
                    t = None
                    raise
                f.write(f"ok qpn={t.qp.qp_num} rkey={t.mr.rkey} va={t.mr.buf} mw_rkey={t.mw_rkey}\n")
            elif cmd == "post":
                t.post(a)
                f.write("ok\n")
            elif cmd == "result":
                for ln in t.result():
                    f.write(ln + "\n")
                t.teardown()
                t = None
                f.write("end\n")
            elif cmd == "bye":
                f.write("ok\n")
                break
            else:
                f.write(f"err unknown request {cmd}\n")
        except Exception as ex:
            f.write(f"err {type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}\n")
    if t:
        t.teardown()


def main():
    if len(sys.argv) != 3 or sys.argv[1] != "--listen":
        sys.exit(__doc__)
    host, _, port = sys.argv[2].partition(":")
    s = socket.create_server((host, int(port or 18600)))
    print(f"diff-target: listening on {host}:{port or 18600}", flush=True)
    conn, _ = s.accept()
    serve(conn)
    conn.close()


if __name__ == "__main__":
    main()
