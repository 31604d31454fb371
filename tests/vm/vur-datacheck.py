#!/usr/bin/env python3
"""Every byte the guest's RDMA stack moves, checked: a pyverbs peer pair for the test guests.

    vur-datacheck.py -d DEV -g GID-INDEX [-m MTU] [-u ACK-TIMEOUT] [-n N] [-t rc,uc,ud,srq] [--dmabuf] -p PORT [SERVER]

Without SERVER it listens on PORT (TCP, any address) and serves one client; with SERVER it
connects to SERVER:PORT. The two sides set their QPs up over that TCP connection (as the
ibv_*_pingpong examples do) and then, for each transport, move N messages of every operation in
BOTH directions:

    rc   SEND (every other one with immediate), RDMA WRITE (every fourth one, and the last of
         each batch, with immediate), RDMA READ
    uc   SEND (with and without immediate), RDMA WRITE (with and without immediate)
    ud   SEND (with and without immediate), up to the path MTU
    srq  SEND over two RC QPs into one shared receive queue

Payloads come from SHAKE-128 keyed by the run's nonce, the transport, the operation, the
direction, the message index and its length (0xff mapped to 0xfe): no period, and a different
payload for every message. Sizes run from 1 B to 64 KiB across the path MTU (-m, default 1024). Some messages
leave from two SGEs, and some receive WRs and READ sinks have two SGEs with a gap between them.

Every receive buffer, WRITE target and READ sink (the whole 64 KiB + 256 B of it) is poisoned
with 0xff before each operation, a byte no payload has (asserted for each message), so every
byte that is not placed differs from the byte that must be there. After the operation every
byte of the buffer is checked: the payload where it belongs, the poison everywhere else (no
byte beyond the message, or in the gap between two SGEs, written).
Every work request must get exactly one completion, with success, the opcode, byte_len and
immediate data it must have (UD: the GRH flag and the sender's QPN; SRQ: per QP in order).

With --dmabuf every buffer of this side is a dma-buf MR (ibv_reg_dmabuf_mr): a udmabuf
exported from a sealed memfd, the MR starting DMABUF_OFFSET bytes into it (inside its second
page), its bytes written and read through the memfd's own mapping, which holds the very pages
the device moves. The other side may or may not do the same (Linux rxe cannot).

One line per transport on success, the host's assertion:
    DATACHECK ok transport=rc role=server dev=vrdma0 mem=mr ops=send:96,... messages=N bytes=M
(messages and bytes of both directions; each one was checked by the side that received it,
and its sender heard so). On the first difference both sides print
    DATACHECK FAIL transport=rc op=send dir=client->server message=I len=L offset=O: ...
and exit 1. Runs in the test guests (tests/vm/pair-guest.sh) with python3-pyverbs.
"""
import argparse
import fcntl
import hashlib
import json
import mmap
import os
import random
import select
import socket
import struct
import sys
import time

BATCH = 16  # messages per batch (WRs outstanding at once)
MAX_LEN = 65536
SLOT = MAX_LEN + 256  # a buffer: the largest message, the gap of a two-SGE send, and slack
IMM_SLOT = 64  # the receive buffer of a WRITE with immediate (no data may land there)
GRH = 40
SIZES = [1, 3, 64, 255, 1000, 1023, 1024, 1025, 2047, 3000, 4096, 4097, 9000, 16383, 32768, 65536]
SEND_GAP = 128  # between the two SGEs of a two-SGE send, and of a two-SGE receive
WAIT = 60.0  # seconds a completion or the peer may take: only catches a hang
# Payload bytes are never 0xff: a buffer is poisoned with 0xff before each operation, so every
# byte that was not placed differs from what must be there, whichever message lands in it (an
# SRQ's buffers take the messages of two QPs in the order they come).
POISON = b"\xff"
POISON_SLOT = POISON * SLOT
NO_FF = bytes(range(255)) + b"\xfe"
SEND_FILLER = 0xEE  # between the two SGEs of a two-SGE send: must never arrive
MTUS = [256, 512, 1024, 2048, 4096]
OPS = {"rc": ["send", "write", "read"], "uc": ["send", "write"], "ud": ["send"], "srq": ["send"]}
PAGE = 4096
DMABUF_OFFSET = PAGE + 256  # where a --dmabuf MR starts in its dma-buf
# <linux/udmabuf.h>: _IOW('u', 0x42, struct udmabuf_create {u32 memfd, flags; u64 offset, size})
UDMABUF_CREATE = (1 << 30) | (24 << 16) | (ord("u") << 8) | 0x42
UDMABUF_FLAGS_CLOEXEC = 1


def import_pyverbs():
    """pyverbs, imported once the TCP connection is up: its import takes seconds under TCG,
    and so both sides import at once instead of the client after the server."""
    global e, AH, AHAttr, GID, GlobalRoute, CQ, Context, MR, PD, QP, QPAttr, QPCap, QPInitAttr
    global SRQ, SrqAttr, SrqInitAttr, SGE, RecvWR, SendWR, MTU_ENUM, MTU_BYTES, WC_STATUS, DmaBufMR
    import pyverbs.enums as e
    from pyverbs.addr import AH, AHAttr, GID, GlobalRoute
    from pyverbs.cq import CQ
    from pyverbs.device import Context
    from pyverbs.mr import MR, DmaBufMR
    from pyverbs.pd import PD
    from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
    from pyverbs.wr import SGE, RecvWR, SendWR
    MTU_ENUM = {256: e.IBV_MTU_256, 512: e.IBV_MTU_512, 1024: e.IBV_MTU_1024,
                2048: e.IBV_MTU_2048, 4096: e.IBV_MTU_4096}
    MTU_BYTES = {v: k for k, v in MTU_ENUM.items()}
    WC_STATUS = {getattr(e, n): n for n in dir(e) if n.startswith("IBV_WC_") and n.endswith(("_ERR", "SUCCESS"))}


class Fail(Exception):
    pass


class UdmabufMR:
    """--dmabuf: an MR over a dma-buf, seen by the checks as they see an MR (buf, lkey, rkey,
    write, read). udmabuf exports the pages of a sealed memfd; pyverbs registers bytes
    DMABUF_OFFSET .. DMABUF_OFFSET + length of it with that offset as the IOVA; write and read
    go through the memfd's own mapping."""

    def __init__(self, pd, length, access):
        size = (DMABUF_OFFSET + length + PAGE - 1) // PAGE * PAGE
        self.memfd = os.memfd_create("vur-datacheck", os.MFD_ALLOW_SEALING)
        self.fd = self.map = self.mr = None
        try:
            os.ftruncate(self.memfd, size)
            fcntl.fcntl(self.memfd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            try:
                udev = os.open("/dev/udmabuf", os.O_RDWR)
            except OSError as x:
                raise Fail(f"--dmabuf: /dev/udmabuf: {x}")
            try:
                req = bytearray(struct.pack("=IIQQ", self.memfd, UDMABUF_FLAGS_CLOEXEC, 0, size))
                self.fd = fcntl.ioctl(udev, UDMABUF_CREATE, req, True)
            except OSError as x:
                raise Fail(f"--dmabuf: UDMABUF_CREATE of {size} bytes: {x}")
            finally:
                os.close(udev)
            self.map = mmap.mmap(self.memfd, size)
            try:
                self.mr = DmaBufMR(pd, length, access, dmabuf=self.fd, offset=DMABUF_OFFSET)
            except Exception as x:
                raise Fail(f"--dmabuf: ibv_reg_dmabuf_mr of {length} bytes at offset {DMABUF_OFFSET}: {x}")
        except BaseException:
            self.close()
            raise
        self.buf, self.lkey, self.rkey = DMABUF_OFFSET, self.mr.lkey, self.mr.rkey

    def write(self, data, length, offset=0):
        o = DMABUF_OFFSET + offset
        self.map[o:o + length] = bytes(data[:length])

    def read(self, length, offset=0):
        o = DMABUF_OFFSET + offset
        return self.map[o:o + length]

    def close(self):
        if self.mr is not None:
            self.mr.close()
            self.mr = None
        if self.map is not None:
            self.map.close()
            self.map = None
        for fd in (self.fd, self.memfd):
            if fd is not None:
                os.close(fd)
        self.fd = self.memfd = None


class Ctl:
    """The out-of-band TCP connection: one JSON object a line."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def send(self, **msg):
        self.sock.sendall(json.dumps(msg).encode() + b"\n")

    def _line(self, timeout):
        end = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.sock], [], [], left)
            if not r:
                continue
            chunk = self.sock.recv(65536)
            if not chunk:
                raise Fail("the peer closed the control connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        msg = json.loads(line)
        if "fail" in msg:
            raise Fail(f"the peer failed: {msg['fail']}")
        return msg

    def recv(self, what):
        msg = self._line(WAIT)
        if msg is None:
            raise Fail(f"timeout after {WAIT:.0f} s waiting for the peer's {what}")
        if msg.get("m") != what:
            raise Fail(f"protocol: expected {what} from the peer, got {msg}")
        return msg

    def check_peer(self):
        """Raises Fail when the peer has reported a failure (does not wait; what else came
        stays for recv)."""
        if select.select([self.sock], [], [], 0)[0]:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise Fail("the peer closed the control connection")
            self.buf += chunk
        for line in self.buf.split(b"\n")[:-1]:
            msg = json.loads(line)
            if "fail" in msg:
                raise Fail(f"the peer failed: {msg['fail']}")


def payload(key, n):
    return hashlib.shake_128(repr(key).encode()).digest(n).translate(NO_FF)


def imm_of(key):
    return int.from_bytes(payload(("imm",) + key, 4), "little")


def first_diff(a, b):
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            return i
    return min(len(a), len(b))


class Transport:
    """One transport's objects on this side: CQs, MR, QP(s), SRQ, AH."""

    def __init__(self, run, name):
        self.run, self.name = run, name
        ctx, pd = run.ctx, run.pd
        self.scq = CQ(ctx, 4 * BATCH, None, None, 0)
        self.rcq = CQ(ctx, 4 * BATCH, None, None, 0)
        # [rx slots: receive buffers, WRITE targets, READ sinks][tx slots: sources][imm buffers]
        self.tx_base = BATCH * SLOT
        self.imm_base = 2 * BATCH * SLOT
        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        size = 2 * BATCH * SLOT + BATCH * IMM_SLOT
        self.mr = UdmabufMR(pd, size, access) if run.args.dmabuf else MR(pd, size, access)
        self.srq = None
        qpt = {"rc": e.IBV_QPT_RC, "srq": e.IBV_QPT_RC, "uc": e.IBV_QPT_UC, "ud": e.IBV_QPT_UD}[name]
        sge = min(2, run.max_sge)
        if name == "srq":
            self.srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=2 * BATCH, max_sge=sge)))
        cap = QPCap(max_send_wr=2 * BATCH, max_recv_wr=2 * BATCH, max_send_sge=sge, max_recv_sge=sge)
        init = QPInitAttr(qp_type=qpt, scq=self.scq, rcq=self.rcq, srq=self.srq, cap=cap)
        attr = QPAttr(port_num=1)
        attr.pkey_index = 0
        if name == "ud":
            attr.qkey = run.qkey
        elif name == "uc":
            attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE
        else:
            attr.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        self.qps = [QP(pd, init, attr) for _ in range(2 if name == "srq" else 1)]
        self.psns = [random.getrandbits(24) for _ in self.qps]
        self.ah = None
        self.peer = None

    def info(self):
        return {"qpns": [q.qp_num for q in self.qps], "psns": self.psns, "rkey": self.mr.rkey,
                "addr": self.mr.buf}

    def connect(self, peer):
        run = self.run
        self.peer = peer
        gr = GlobalRoute(dgid=GID(val=run.peer_gid), sgid_index=run.gid_index, hop_limit=64)
        ah_attr = AHAttr(port_num=1, is_global=1, gr=gr)
        if self.name == "ud":
            self.ah = AH(run.pd, attr=ah_attr)
            return
        for qp, psn, rqpn, rpsn in zip(self.qps, self.psns, peer["qpns"], peer["psns"]):
            attr = QPAttr(port_num=1)
            attr.path_mtu = MTU_ENUM[run.mtu]
            attr.dest_qp_num = rqpn
            attr.rq_psn = rpsn
            attr.sq_psn = psn
            attr.ah_attr = ah_attr
            attr.max_dest_rd_atomic = run.rd_atom
            attr.max_rd_atomic = run.init_rd_atom
            attr.min_rnr_timer = 12
            attr.timeout = run.ack_timeout
            attr.retry_cnt = 7
            attr.rnr_retry = 7
            qp.to_rts(attr)

    def close(self):
        for o in [self.ah] + self.qps + [self.srq, self.mr, self.scq, self.rcq]:
            if o is not None:
                o.close()


class Run:
    def __init__(self, args, ctl, role):
        self.args, self.ctl, self.role = args, ctl, role
        self.peer_role = "client" if role == "server" else "server"
        self.ctx = Context(name=args.dev)
        self.pd = PD(self.ctx)
        dattr = self.ctx.query_device()
        port = self.ctx.query_port(1)
        self.gid_index = args.gid_index
        self.gid = str(self.ctx.query_gid(1, args.gid_index))
        self.max_sge = min(dattr.max_sge, dattr.max_srq_sge)
        self.rd_atom = max(1, min(16, dattr.max_qp_rd_atom))
        self.init_rd_atom = max(1, min(16, dattr.max_qp_init_rd_atom))
        self.mtu = min(args.mtu, MTU_BYTES[port.active_mtu])
        self.ack_timeout = args.ack_timeout
        self.qkey = 0x11111111
        self.wr_id = 0
        self.counts = {}
        self.moved = [0, 0]  # messages, bytes (both directions)

    def hello(self):
        me = {"m": "hello", "gid": self.gid, "mtu": self.mtu, "transports": self.args.transports,
              "n": self.args.n}
        if self.role == "server":
            me["nonce"] = random.getrandbits(64)
        self.ctl.send(**me)
        peer = self.ctl.recv("hello")
        for k in ("transports", "n"):
            if peer[k] != me[k]:
                raise Fail(f"the peer runs with {k}={peer[k]}, this side with {me[k]}")
        self.peer_gid = peer["gid"]
        self.mtu = min(self.mtu, peer["mtu"])
        self.nonce = me["nonce"] if self.role == "server" else peer["nonce"]

    def next_wr_id(self):
        self.wr_id += 1
        return self.wr_id

    # ---- completions

    def wait_wcs(self, cq, want, what):
        """Polls CQ until every wr_id in WANT (a dict wr_id -> anything) completed once; returns
        the WCs in completion order. A completion for a WR not outstanding, or a second one for
        the same WR, fails."""
        out, left = [], dict(want)
        end = time.monotonic() + WAIT
        idle = 0
        while left:
            n, wcs = cq.poll(len(left))
            for wc in wcs:
                if wc.wr_id not in left:
                    raise Fail(f"{what}: a completion for wr_id {wc.wr_id}, which is not outstanding "
                               f"(a duplicate, or one never posted), status {WC_STATUS.get(wc.status, wc.status)}")
                if wc.status != e.IBV_WC_SUCCESS:
                    raise Fail(f"{what}: {left[wc.wr_id]} completed with status "
                               f"{WC_STATUS.get(wc.status, wc.status)} (vendor_err {wc.vendor_err})")
                del left[wc.wr_id]
                out.append(wc)
            if n:
                idle = 0
                continue
            if time.monotonic() > end:
                raise Fail(f"{what}: {len(left)} of {len(want)} completions missing after {WAIT:.0f} s "
                           f"(first missing: {next(iter(left.values()))})")
            self.ctl.check_peer()
            idle += 1
            if idle > 50:
                time.sleep(0.001)
        return out

    def no_more_wcs(self, tp, what):
        for cq in (tp.scq, tp.rcq):
            n, wcs = cq.poll(4)
            if n:
                wc = wcs[0]
                raise Fail(f"{what}: {n} completion(s) beyond one per WR, first wr_id {wc.wr_id} "
                           f"status {WC_STATUS.get(wc.status, wc.status)}")

    # ---- buffers

    def sizes(self, tp, op, n):
        cap = self.mtu if tp.name == "ud" else MAX_LEN
        s = [x for x in SIZES if x <= cap]
        salt = len(op) + len(tp.name)
        return [s[(i * 5 + salt) % len(s)] for i in range(n)]

    def recv_layout(self, k, size, ud):
        """The SGEs (offset in the slot, length) of receive WR / READ sink number K of a batch,
        for a message of SIZE bytes: one SGE, or (every fourth, when the device has two) two
        with a gap of poison between them."""
        if ud or self.max_sge < 2 or k % 4 != 3 or size < 2:
            return [(0, SLOT)]
        first = [1, 100, 1000, 1024, 4000][k % 5] % size or 1
        return [(0, first), (first + SEND_GAP, SLOT - first - SEND_GAP)]

    def placed(self, layout, stream_len):
        """Where a stream of STREAM_LEN bytes scattered over LAYOUT lands: (stream offset,
        slot offset, length) pieces."""
        pieces, s = [], 0
        for off, ln in layout:
            take = min(ln, stream_len - s)
            if take <= 0:
                break
            pieces.append((s, off, take))
            s += take
        if s != stream_len:
            raise Fail(f"internal: {stream_len} bytes do not fit {layout}")
        return pieces

    def poison(self, base, pieces, expect, skip=0):
        """Poisons the slot at BASE before the operation that must fill PIECES of it with EXPECT
        (after SKIP bytes of a UD GRH): every byte POISON, which no payload byte is."""
        if POISON[0] in expect:
            raise Fail("internal: the poison occurs in the payload")
        self.cur_tp.mr.write(POISON_SLOT, SLOT, base)

    def verify(self, base, pieces, expect, what, skip=0):
        """Reads the slot at BASE back: EXPECT where PIECES place it (the first SKIP bytes of
        the stream, a UD GRH, not checked), the poison everywhere else."""
        got = self.cur_tp.mr.read(SLOT, base)
        want = bytearray(POISON_SLOT)
        for s, off, ln in pieces:
            a, b = max(s, skip), s + ln
            if s < skip:
                g = min(ln, skip - s)
                want[off:off + g] = got[off:off + g]
            if b > a:
                want[off + a - s:off + b - s] = expect[a - skip:b - skip]
        if got == want:
            return
        o = first_diff(got, want)
        bad = sum(1 for x, y in zip(got, want) if x != y)
        msg_off = None
        for s, off, ln in pieces:
            if off <= o < off + ln:
                msg_off = s + o - off - skip
        if msg_off is None:
            where = f"buffer offset {o}, beyond the message: the poison was overwritten"
        else:
            kind = "never placed (still the poison)" if got[o] == POISON[0] else "wrong"
            where = f"offset {msg_off}: {kind}"
        raise Fail(f"{what}: {where}: got 0x{got[o]:02x}, expected 0x{want[o]:02x}; "
                   f"{bad} byte(s) of the {SLOT}-byte buffer differ")

    # ---- operations

    def run_op(self, tp, op, src):
        """N messages of OP whose data go from SRC (a role) to the other side."""
        dst = "client" if src == "server" else "server"
        direction = f"{src}->{dst}"
        n = self.args.n
        sizes = self.sizes(tp, op, n)
        # who posts the WRs: the data's source for SEND and WRITE, its destination for READ
        active = dst if op == "read" else src
        for b0 in range(0, n, BATCH):
            idx = list(range(b0, min(n, b0 + BATCH)))
            keys = [(self.nonce, tp.name, op, direction, i, sizes[i]) for i in idx]
            data = [payload(k, sizes[i]) for k, i in zip(keys, idx)]
            whats = [f"transport={tp.name} op={op} dir={direction} message={i} len={sizes[i]}" for i in idx]
            if op == "send":
                imm = [imm_of(k) if i % 2 else None for k, i in zip(keys, idx)]
            elif op == "write":
                imm = [imm_of(k) if (i % 4 == 3 or j == len(idx) - 1) else None
                       for j, (k, i) in enumerate(zip(keys, idx))]
            else:
                imm = [None] * len(idx)
            if self.role == active:
                self.ctl.recv("ready")
                self.post_batch(tp, op, idx, sizes, data, imm, whats)
                if op == "read":
                    self.ctl.send(m="checked")
                else:
                    self.ctl.send(m="sent")
                    self.ctl.recv("checked")
            else:
                self.serve_batch(tp, op, idx, sizes, data, imm, whats)
            for i, x in zip(idx, imm):
                name = op + ("_imm" if x is not None else "")
                self.counts[(tp.name, name)] = self.counts.get((tp.name, name), 0) + 1
                self.moved[0] += 1
                self.moved[1] += sizes[i]

    def post_batch(self, tp, op, idx, sizes, data, imm, whats):
        """The active side of a batch: post the WRs, take their completions (READ: and check
        the sinks)."""
        want, sinks = {}, []
        peer = tp.peer
        for k, i in enumerate(idx):
            ln, d = sizes[i], data[k]
            if op == "read":
                base = k * SLOT
                pieces = self.placed(self.recv_layout(k, ln, False), ln)
                self.poison(base, pieces, d)
                sges = [SGE(tp.mr.buf + base + off, n, tp.mr.lkey) for _, off, n in pieces]
                sinks.append((base, pieces, d, whats[k]))
                wr = SendWR(wr_id=self.next_wr_id(), opcode=e.IBV_WR_RDMA_READ, num_sge=len(sges),
                            sg=sges, send_flags=e.IBV_SEND_SIGNALED)
                wr.set_wr_rdma(peer["rkey"], peer["addr"] + tp.tx_base + k * SLOT)
            else:
                base = tp.tx_base + k * SLOT
                if i % 3 == 2 and ln >= 2 and self.max_sge >= 2:
                    a = 1 + (i * 131) % (ln - 1)
                    img = bytearray([SEND_FILLER]) * SLOT
                    img[0:a] = d[:a]
                    img[a + SEND_GAP:ln + SEND_GAP] = d[a:]
                    tp.mr.write(bytes(img), SLOT, base)
                    sges = [SGE(tp.mr.buf + base, a, tp.mr.lkey),
                            SGE(tp.mr.buf + base + a + SEND_GAP, ln - a, tp.mr.lkey)]
                else:
                    tp.mr.write(d, ln, base)
                    sges = [SGE(tp.mr.buf + base, ln, tp.mr.lkey)]
                if op == "send":
                    opc = e.IBV_WR_SEND if imm[k] is None else e.IBV_WR_SEND_WITH_IMM
                else:
                    opc = e.IBV_WR_RDMA_WRITE if imm[k] is None else e.IBV_WR_RDMA_WRITE_WITH_IMM
                wr = SendWR(wr_id=self.next_wr_id(), opcode=opc, num_sge=len(sges), sg=sges,
                            send_flags=e.IBV_SEND_SIGNALED, imm_data=imm[k] or 0)
                if op == "write":
                    wr.set_wr_rdma(peer["rkey"], peer["addr"] + k * SLOT)
                if tp.name == "ud":
                    wr.set_wr_ud(tp.ah, peer["qpns"][0], self.qkey)
            qp = tp.qps[i % len(tp.qps)]
            qp.post_send(wr, None)
            want[wr.wr_id] = whats[k]
        wcs = self.wait_wcs(tp.scq, want, f"transport={tp.name} op={op} (sender)")
        wc_op = {"send": e.IBV_WC_SEND, "write": e.IBV_WC_RDMA_WRITE, "read": e.IBV_WC_RDMA_READ}[op]
        order = list(want)
        for j, wc in enumerate(wcs):
            what = want[wc.wr_id]
            if wc.opcode != wc_op:
                raise Fail(f"{what}: send completion opcode {wc.opcode}, expected {wc_op}")
            if tp.name in ("rc", "uc") and wc.wr_id != order[j]:
                raise Fail(f"{what}: completed out of order (wr_id {wc.wr_id} where {order[j]} was next)")
            if op == "read":
                k = order.index(wc.wr_id)
                if wc.byte_len != sizes[idx[k]]:
                    raise Fail(f"{what}: READ completion byte_len {wc.byte_len}, expected {sizes[idx[k]]}")
        for base, pieces, d, what in sinks:
            self.verify(base, pieces, d, what + " (READ sink)")

    def serve_batch(self, tp, op, idx, sizes, data, imm, whats):
        """The passive side of a batch: buffers poisoned and receives posted (SEND, WRITE), or
        sources filled (READ); then the completions and every byte checked."""
        ud = tp.name == "ud"
        skip = GRH if ud else 0
        if op == "read":
            for k, i in enumerate(idx):
                tp.mr.write(data[k], sizes[i], tp.tx_base + k * SLOT)
            self.ctl.send(m="ready")
            self.ctl.recv("checked")
            return
        rq = tp.srq or tp.qps[0]
        posted = {}  # wr_id -> (its buffer k, its SGE layout)
        if op == "send":
            for k, i in enumerate(idx):
                layout = self.recv_layout(k, sizes[i], ud)
                pieces = self.placed(layout, sizes[i] + skip)
                self.poison(k * SLOT, pieces, data[k], skip)
                wr = RecvWR(wr_id=self.next_wr_id(), num_sge=len(layout),
                            sg=[SGE(tp.mr.buf + k * SLOT + off, ln, tp.mr.lkey) for off, ln in layout])
                rq.post_recv(wr, None)
                posted[wr.wr_id] = (k, layout)
        else:  # write: targets poisoned, a receive for each WRITE with immediate
            for k, i in enumerate(idx):
                self.poison(k * SLOT, [(0, 0, sizes[i])], data[k])
            for k, i in enumerate(idx):
                if imm[k] is not None:
                    base = tp.imm_base + k * IMM_SLOT
                    tp.mr.write(POISON * IMM_SLOT, IMM_SLOT, base)
                    wr = RecvWR(wr_id=self.next_wr_id(), num_sge=1,
                                sg=[SGE(tp.mr.buf + base, IMM_SLOT, tp.mr.lkey)])
                    rq.post_recv(wr, None)
                    posted[wr.wr_id] = (k, None)
        self.ctl.send(m="ready")
        wcs = self.wait_wcs(tp.rcq, {w: f"receive wr_id {w}" for w in posted},
                            f"transport={tp.name} op={op} (receiver)")
        if op == "send":
            order = list(posted)
            next_on = {}  # SRQ: per QP, the messages in order
            for q, qp in enumerate(tp.qps):
                next_on[qp.qp_num] = [k for k, i in enumerate(idx) if i % len(tp.qps) == q]
            checks = []
            for j, wc in enumerate(wcs):
                if tp.srq is None:
                    if wc.wr_id != order[j]:
                        raise Fail(f"{whats[j]}: landed in receive wr_id {wc.wr_id}, "
                                   f"expected {order[j]} (the receive queue is in order)")
                    k = j
                else:
                    q = next_on.get(wc.qp_num)
                    if not q:
                        raise Fail(f"transport=srq: a receive completion on QP {wc.qp_num}, "
                                   f"which had no message (left)")
                    k = q.pop(0)
                slot_k, layout = posted[wc.wr_id]
                what = whats[k] + f" (receive buffer {slot_k})"
                ln = sizes[idx[k]]
                self.check_recv_wc(tp, wc, what, ln + skip, imm[k], e.IBV_WC_RECV)
                checks.append((slot_k, layout, ln, k, what))
                if tp.srq is None and wc.qp_num != tp.qps[0].qp_num:
                    raise Fail(f"{what}: completion names QP {wc.qp_num}, not {tp.qps[0].qp_num}")
            # the sender's completions, then the bytes
            self.ctl.recv("sent")
            for slot_k, layout, ln, k, what in checks:
                self.verify(slot_k * SLOT, self.placed(layout, ln + skip), data[k], what, skip)
        else:
            imms = [k for k in range(len(idx)) if imm[k] is not None]
            for j, wc in enumerate(wcs):
                k = imms[j]
                what = whats[k]
                if posted[wc.wr_id][0] != k:
                    raise Fail(f"{what}: its immediate completed receive wr_id {wc.wr_id}, out of order")
                self.check_recv_wc(tp, wc, what, sizes[idx[k]], imm[k], e.IBV_WC_RECV_RDMA_WITH_IMM)
            self.ctl.recv("sent")
            for k, i in enumerate(idx):
                self.verify(k * SLOT, [(0, 0, sizes[i])], data[k], whats[k] + " (WRITE target)")
            for k in imms:
                got = tp.mr.read(IMM_SLOT, tp.imm_base + k * IMM_SLOT)
                if got != POISON * IMM_SLOT:
                    raise Fail(f"{whats[k]}: the receive buffer of the WRITE with immediate was written")
        self.no_more_wcs(tp, f"transport={tp.name} op={op}")
        self.ctl.send(m="checked")

    def check_recv_wc(self, tp, wc, what, byte_len, imm, opcode):
        if wc.opcode != opcode:
            raise Fail(f"{what}: receive completion opcode {wc.opcode}, expected {opcode}")
        if wc.byte_len != byte_len:
            raise Fail(f"{what}: byte_len {wc.byte_len}, expected {byte_len}")
        has_imm = bool(wc.wc_flags & e.IBV_WC_WITH_IMM)
        if imm is None and has_imm:
            raise Fail(f"{what}: completion with immediate data 0x{wc.imm_data:08x}, sent without")
        if imm is not None and (not has_imm or wc.imm_data != imm):
            raise Fail(f"{what}: immediate data {'0x%08x' % wc.imm_data if has_imm else 'missing'}, "
                       f"expected 0x{imm:08x}")
        if tp.name == "ud":
            if not wc.wc_flags & e.IBV_WC_GRH:
                raise Fail(f"{what}: UD completion without the GRH flag")
            if wc.src_qp != tp.peer["qpns"][0]:
                raise Fail(f"{what}: UD completion from QP {wc.src_qp}, expected {tp.peer['qpns'][0]}")

    def transport(self, name):
        tp = Transport(self, name)
        self.cur_tp = tp
        try:
            self.ctl.send(m="qp", **tp.info())
            tp.connect(self.ctl.recv("qp"))
            # both sides' QPs are ready before anything is sent to them
            self.ctl.send(m="rts")
            self.ctl.recv("rts")
            before = (self.moved[0], self.moved[1])
            for op in OPS[name]:
                for src in ("client", "server"):
                    self.run_op(tp, op, src)
            self.ctl.send(m="end")
            self.ctl.recv("end")
            self.no_more_wcs(tp, f"transport={name} at the end")
            ops = ",".join(f"{o}:{c}" for (t, o), c in self.counts.items() if t == name)
            mem = "dmabuf" if self.args.dmabuf else "mr"
            print(f"DATACHECK ok transport={name} role={self.role} dev={self.args.dev} mem={mem} mtu={self.mtu} "
                  f"ops={ops} messages={self.moved[0] - before[0]} bytes={self.moved[1] - before[1]}",
                  flush=True)
        finally:
            tp.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-d", dest="dev", required=True, help="RDMA device (vrdma0, rxe0)")
    ap.add_argument("-g", dest="gid_index", type=int, required=True, help="GID index")
    ap.add_argument("-m", dest="mtu", type=int, default=1024, choices=MTUS, help="path MTU")
    ap.add_argument("-u", dest="ack_timeout", type=int, default=20, help="RC ACK timeout exponent")
    ap.add_argument("-n", type=int, default=48, help="messages per operation and direction")
    ap.add_argument("-t", dest="transports", default="rc,uc,ud,srq", help="transports, in order")
    ap.add_argument("-p", dest="port", type=int, default=18600, help="TCP port")
    ap.add_argument("--dmabuf", action="store_true",
                    help="this side's buffers are dma-buf MRs (udmabuf; ibv_reg_dmabuf_mr)")
    ap.add_argument("server", nargs="?", help="the server's address (client side)")
    args = ap.parse_args()
    args.transports = args.transports.split(",")
    for t in args.transports:
        if t not in OPS:
            ap.error(f"unknown transport {t} ({','.join(OPS)})")
    t0 = time.monotonic()
    if args.server:
        role = "client"
        sock = None
        for _ in range(100):  # the server listens before its client starts; a few retries
            try:
                sock = socket.create_connection((args.server, args.port), timeout=WAIT)
                break
            except ConnectionRefusedError:
                time.sleep(0.1)
        if sock is None:
            sys.exit(f"DATACHECK FAIL nothing listens on {args.server}:{args.port}")
    else:
        role = "server"
        lsock = socket.create_server(("", args.port))
        lsock.settimeout(WAIT * 2)
        sock, _ = lsock.accept()
        lsock.close()
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ctl = Ctl(sock)
    try:
        import_pyverbs()
        run = Run(args, ctl, role)
        run.hello()
        for t in args.transports:
            run.transport(t)
    except Fail as x:
        print(f"DATACHECK FAIL {x}", flush=True)
        try:
            ctl.send(fail=str(x))
        except OSError:
            pass
        sys.exit(1)
    print(f"DATACHECK done role={role} in {time.monotonic() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
