//! The whole engine under hostile input: two simulated nodes with connected RC (one with an
//! SRQ), UC and UD QP pairs, a GSI QP, XRC (on each node an XRC domain with one XRC SRQ, an
//! XRC INI QP connected to the other node's XRC TGT QP and an XRC TGT QP connected to the other
//! node's INI), MRs, a type 1 and a type 2 memory window, a fast-reg MR and a multicast group,
//! all on one PD and one CQ per node, driven by a sequence of operations decoded from the fuzz
//! input:
//! inject arbitrary bytes as a packet (dest QPN rewritten to a real QP, GSI, multicast or
//! anything), deliver / drop / duplicate / corrupt the packets the engine sent, advance the
//! clock, post sends and receives, modify QPs.
//!
//! Invariants (a violation panics, i.e. is a crash):
//! - the engine never panics;
//! - every CQE's wr_id was posted on that QP (or on the SRQ the QP uses; for the XRC SRQ, the
//!   CQE's QP is the node's XRC TGT QP), as a send or a receive as the CQE's opcode says, on
//!   that node, and completes at most once;
//! - the XRC TGT QP refuses every send WR (`VerbError::Invalid`);
//! - after `handle_timeout(now)`, `poll_timeout()` is `None` or later than `now`;
//! - every packet the engine emits parses with `wire::Packet::new_checked` and fits the buffer;
//! - every page fault names the node's on-demand-paging MR and a page of its table.
//!
//! # Input format
//!
//! A sequence of operations, each an opcode byte (taken modulo 11) and its operands; a missing
//! operand ends the input. Multi-byte numbers are little-endian.
//!
//! | op | operands | operation |
//! |----|----------|-----------|
//! | 0  | `to sel addr len:u16 bytes[len]` | Inject `bytes` into node `to&1`. `sel%10`: 0 keep the dest QPN, 1 RC QP, 2 RC QP with SRQ, 3 UC QP, 4 UD QP, 5 GSI, 6 multicast (QPN 0xffffff, destination GID the group), 7 the next 3 bytes, 8 XRC INI QP, 9 XRC TGT QP. `addr%4`: 0 from the peer's GID, 1 from our own GID, 2 to a stranger's GID, 3 from the IPv4 GID in the next 4 bytes. |
//! | 1  | `how amount` | `how` even: advance the clock to the earliest timer; odd: by `(amount+1) << (how/2 % 32)` ns. Then `handle_timeout` on both nodes. |
//! | 2  | `node qp menu size flags key off` | Post a send WR (menu below) on node `node&1`, QP `qp%7` (RC, RC+SRQ, UC, UD, GSI, XRC INI, XRC TGT; the XRC TGT must refuse it). |
//! | 3  | `node qp size` | Post a receive of `size%6` (0, 8, 64, 256, 1024 or 4096 bytes) on node `node&1`, QP `qp%7` (the RC+SRQ choice posts to the SRQ, the XRC INI and XRC TGT choices to the XRC SRQ). |
//! | 4  | `n` | Deliver the `n%16+1` oldest packets in flight. |
//! | 5  | `i action x y` | On in-flight packet `i % len`: `action%4` 0 drop, 1 duplicate, 2 deliver now (reordered), 3 deliver with byte `x % len` XORed with `y`. |
//! | 6  | `node qp state` | Modify QP `qp%7` to `state%6` (RESET INIT RTR RTS SQD ERR) with the attributes `Sim::connect` uses (the setup's, which are those for the XRC QPs: an XRC INI's are RC's without the responder's, an XRC TGT's RC's without the requester's but the timeout); `state >= 128`: the state bit only. |
//! | 7  | `rounds` | Run the network for `rounds%32+1` rounds: deliver everything in flight, or when nothing is, jump to the next timer. |
//! | 8  | `node solicited` | Arm the node's CQ. |
//! | 10 | `node page action` | On node `node&1`'s on-demand-paging MR (16 KiB over a buffer of its own, every right, no page mapped at first): `action%3` 0 maps page `page%5` writable, 1 read-only, 2 unmaps it; then wakes the QPs waiting for a page. Faults are not answered otherwise. |
//! | 9  | | Toggle memory mode: the nodes reach each other in memory, as two devices of one process do: RC packets leave in segments of up to 16 KiB (`poll_transmit_segments`) and everything delivered from then on, injected bytes too, arrives through `handle_packet_in_memory`. Packets in flight stay what they were built as. |
//!
//! Send menu (`menu%14`): SEND, SEND+imm, SEND+invalidate, WRITE, WRITE+imm, READ, CMP_SWP,
//! FETCH_ADD, ATOMIC_WRITE, FLUSH, LOCAL_INV, BIND_MW (type 2), REG_MR (fast reg), inline SEND.
//! `size%8` picks 0, 1, 8, 64, 256, 257, 700 or 4096 bytes; `key%7` the peer's MR key, its type 1
//! MW, its type 2 MW, its fast-reg MR, our own MR key, a bogus key or the peer's on-demand MR
//! (the local SGE is then on our own on-demand MR); `off*64` is the offset into
//! the peer's 16 KiB buffer (+1 if `flags & 16`, misaligning it). `flags`: bit 0 signaled, 1
//! solicited, 2 fence; for UD bits 5..6 pick the destination (peer UD QP, GSI, multicast, a
//! bogus QPN) and bit 7 a wrong Q_Key; on the XRC QPs bits 6..7 pick the XRCETH's SRQ (0 or 1
//! the peer's XRC SRQ, 2 an SRQ number no node has, 3 the peer's regular SRQ: the last two
//! are invalid requests); for FLUSH bit 5 is the selectivity and bit 6 the
//! placement; for REG_MR bit 3 registers the page `u64::MAX - 0xff` instead of a real one and
//! bit 5 the length `u64::MAX`.
//!
//! Packets the engine sends go into an in-flight queue (at most 256; the oldest falls off);
//! nothing is delivered unless an operation says so.

#![no_main]

use std::collections::VecDeque;

use libfuzzer_sys::fuzz_target;
use rxe_core::device::{Device, DeviceConfig, RecvMeta};
use rxe_core::mem::{Backing, MwType, VecMemory, ODP_PRESENT, ODP_WRITABLE};
use rxe_core::qp::GSI_QKEY;
use rxe_core::sim::MEM_BASE;
use rxe_core::verbs::*;
use rxe_core::wire::Packet;
use rxe_core::{Gid, Instant, QpInit, Qpn};

/// Memory of each node (the setup allocates about 40 KiB of it).
const MEM_LEN: usize = 96 << 10;
/// Pages in the table of each node's on-demand-paging MR (16 KiB at offset 0x10 of its buffer).
const ODP_PAGES: u64 = 5;
const BUF_LEN: u64 = 16 << 10;
const RECV_LEN: u32 = 1024;
const SQ_PSN: [u32; 2] = [0x100, 0x200];
const QKEY: u32 = 0x1111;
const MAX_IN_FLIGHT: usize = 256;
/// More packets than this from one `poll_transmit` drain is a livelock.
const MAX_PUMP: usize = 8192;

fn mcast_gid() -> Gid {
    Gid::from_ipv4([239, 1, 2, 3])
}

/// QP roles, in the order of the `qp%7` selectors.
const RC: usize = 0;
const RC_SRQ: usize = 1;
const UC: usize = 2;
const UD: usize = 3;
const GSI: usize = 4;
const XRC_INI: usize = 5;
const XRC_TGT: usize = 6;
const ROLES: usize = 7;
/// An SRQ number no node has (an XRC send naming it is an invalid request).
const BOGUS_SRQN: u32 = 0xdead;

/// The objects of one node.
#[derive(Clone, Copy, Default)]
struct Res {
    pd: u32,
    cq: u32,
    srq: u32,
    /// The XRC SRQ (in `pd`, completing on `cq`) of the node's XRC domain.
    xsrq: u32,
    qp: [Qpn; ROLES],
    /// A 16 KiB buffer registered with every access right, and its key.
    buf: u64,
    key: u32,
    mw1: u32,
    mw2: u32,
    /// The type 2 MW's current rkey (after the setup's bind).
    mw2_rkey: u32,
    frmr: u32,
    frmr_key: u32,
    /// A page-aligned page for fast registration.
    page: u64,
    /// Receive buffers.
    rbuf: u64,
    /// The on-demand-paging MR: its buffer (page aligned; the MR starts 0x10 in) and key.
    /// Node 0's is an explicit MR over the buffer, node 1's an implicit one (the whole
    /// address space), whose page for the buffer's first is `obase` (0 for node 0's table).
    obuf: u64,
    okey: u32,
    obase: u64,
}

/// Who a wr_id was posted to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Qp(Qpn),
    Srq(u32),
}

#[derive(Clone, Copy, Debug)]
struct Owner {
    node: usize,
    target: Target,
    recv: bool,
}

struct InFlight {
    to: usize,
    meta: RecvMeta,
    bytes: Vec<u8>,
}

/// One host, as in `rxe_core::sim` but with 64 KiB of memory instead of 64 MiB: the
/// simulator's big vectors made mmap/munmap a third of every execution.
struct Node {
    dev: Device,
    mem: VecMemory,
    gid: Gid,
    /// Next free byte of `mem`.
    brk: u64,
}

impl Node {
    /// Allocates `len` bytes (8-byte aligned).
    fn alloc(&mut self, len: usize) -> u64 {
        let a = self.brk;
        self.brk = (self.brk + len as u64 + 7) & !7;
        assert!(self.brk <= MEM_BASE + MEM_LEN as u64);
        a
    }
}

struct World {
    nodes: [Node; 2],
    now: Instant,
    res: [Res; 2],
    wire: VecDeque<InFlight>,
    /// Indexed by wr_id (handed out sequentially from 0); `None` once completed.
    posted: Vec<Option<Owner>>,
    next_wr: u64,
    buf: Vec<u8>,
    /// Op 9: the nodes reach each other in memory (segments).
    in_memory: bool,
}

/// Memory mode's segment payload (op 9).
const SEGMENT: usize = 16 << 10;

/// A cursor over the input.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
    /// Up to `n` bytes (fewer at the end of the input).
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (a, b) = self.0.split_at(n.min(self.0.len()));
        self.0 = b;
        a
    }
}

fn conn_attr(w: &World, node: usize, role: usize) -> QpAttr {
    let peer = &w.res[1 - node];
    QpAttr {
        // Both placement types, so that FLUSHes reach the R_Key checks.
        qp_access_flags: Access::LOCAL_WRITE
            .union(Access::REMOTE)
            .union(Access::FLUSH_GLOBAL)
            .union(Access::FLUSH_PERSISTENT),
        path_mtu: Mtu::M256,
        // An XRC INI QP talks to the peer's TGT QP and the other way round.
        dest_qp_num: peer.qp[match role {
            XRC_INI => XRC_TGT,
            XRC_TGT => XRC_INI,
            r => r,
        }]
        .0,
        rq_psn: SQ_PSN[1 - node],
        sq_psn: SQ_PSN[node],
        max_dest_rd_atomic: 4,
        max_rd_atomic: 4,
        min_rnr_timer: 1,
        timeout: 10,
        retry_cnt: 3,
        rnr_retry: 3,
        qkey: if role == GSI { GSI_QKEY } else { QKEY },
        av: Av {
            dgid: w.nodes[1 - node].gid,
            sgid_index: 0,
            hop_limit: 64,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The attribute mask `Sim::connect` (or a UD setup) uses to reach `state`.
fn conn_mask(role: usize, state: QpState) -> u32 {
    let ud = role == UD || role == GSI;
    // The responder's attributes: RC and XRC TGT (an XRC INI has none).
    let rc = role == RC || role == RC_SRQ || role == XRC_TGT;
    // The requester's: RC and XRC INI (an XRC TGT only has a PSN and a timeout).
    let req = role == RC || role == RC_SRQ || role == XRC_INI;
    let m = AttrMask::STATE;
    m | match state {
        QpState::Init if ud => AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY,
        QpState::Init => AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS,
        QpState::Rtr if ud => 0,
        QpState::Rtr => {
            let m = AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
            if rc {
                m | AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER
            } else {
                m
            }
        }
        QpState::Rts if req => {
            AttrMask::SQ_PSN
                | AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC
        }
        QpState::Rts if role == XRC_TGT => AttrMask::SQ_PSN | AttrMask::TIMEOUT,
        QpState::Rts => AttrMask::SQ_PSN,
        _ => 0,
    }
}

impl World {
    fn new() -> World {
        let cfg = DeviceConfig {
            max_qp: 16,
            max_mr: 64,
            max_cq: 8,
            max_pd: 8,
            max_srq: 4,
            max_ah: 8,
            gid_table_len: 4,
            port_mtu: Mtu::M1024,
            ..Default::default()
        };
        let node = |i: u8| {
            let mut dev = Device::new(DeviceConfig {
                mac: [2, 0, 0, 0, 0, i + 1],
                ..cfg.clone()
            });
            let gid = Gid::from_ipv4([10, 0, 0, i + 1]);
            dev.add_gid(0, gid).unwrap();
            Node {
                dev,
                mem: VecMemory::new(MEM_BASE, MEM_LEN),
                gid,
                brk: MEM_BASE,
            }
        };
        let mut w = World {
            now: Instant(1_000_000),
            nodes: [node(0), node(1)],
            res: [Res::default(); 2],
            wire: VecDeque::new(),
            posted: Vec::new(),
            next_wr: 0,
            buf: vec![0; SEGMENT + rxe_core::device::SEGMENT_HEADROOM],
            in_memory: false,
        };
        for n in 0..2 {
            let d = &mut w.nodes[n].dev;
            let pd = d.alloc_pd().unwrap();
            let cq = d.create_cq(128).unwrap();
            let srq = d.create_srq(pd, 32, 2, 0).unwrap();
            let xrcd = d.alloc_xrcd().unwrap();
            let xsrq = d.create_srq_xrc(pd, xrcd, cq, 32, 2, 0).unwrap();
            let cap = QpCap {
                max_send_wr: 32,
                max_recv_wr: 32,
                max_send_sge: 2,
                max_recv_sge: 2,
                max_inline_data: 256,
            };
            let mut qp = [Qpn(0); ROLES];
            for (role, t) in [QpType::Rc, QpType::Rc, QpType::Uc, QpType::Ud, QpType::Gsi]
                .into_iter()
                .enumerate()
            {
                qp[role] = d
                    .create_qp(QpInit {
                        qp_type: t,
                        pd,
                        send_cq: cq,
                        recv_cq: cq,
                        srq: (role == RC_SRQ).then_some(srq),
                        xrcd: None,
                        cap,
                        sq_sig_all: false,
                    })
                    .unwrap();
            }
            // An XRC INI QP has a send queue only; an XRC TGT QP no queue, PD or CQ at all.
            qp[XRC_INI] = d
                .create_qp(QpInit {
                    qp_type: QpType::XrcIni,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    xrcd: None,
                    cap: QpCap {
                        max_recv_wr: 0,
                        max_recv_sge: 0,
                        ..cap
                    },
                    sq_sig_all: false,
                })
                .unwrap();
            qp[XRC_TGT] = d.create_qp(QpInit::xrc_tgt(xrcd)).unwrap();
            d.attach_mcast(qp[UD], mcast_gid()).unwrap();
            w.res[n] = Res {
                pd,
                cq,
                srq,
                xsrq,
                qp,
                ..Default::default()
            };
        }
        for n in 0..2 {
            for role in 0..ROLES {
                for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
                    let mut a = conn_attr(&w, n, role);
                    a.qp_state = st;
                    let qpn = w.res[n].qp[role];
                    w.nodes[n]
                        .dev
                        .modify_qp(qpn, &a, AttrMask(conn_mask(role, st)))
                        .unwrap();
                }
            }
        }
        for n in 0..2 {
            // Every right an MR can have (none can be made persistent).
            let all = Access(
                Access::ALL.0
                    & !(Access::ZERO_BASED.0 | Access::ON_DEMAND.0 | Access::FLUSH_PERSISTENT.0),
            );
            let pd = w.res[n].pd;
            let nd = &mut w.nodes[n];
            let buf = nd.alloc(BUF_LEN as usize);
            let page = (nd.alloc(8192) + 4095) & !4095;
            let rbuf = nd.alloc(8 * RECV_LEN as usize);
            let obuf = (nd.alloc(BUF_LEN as usize + 8192) + 4095) & !4095;
            let rc = w.res[n].qp[RC];
            let d = &mut nd.dev;
            let back = Backing::Contiguous { base: buf };
            let key = d.reg_mr(pd, buf, BUF_LEN, all, back).unwrap();
            let odp = Backing::Odp {
                key: 0,
                page_offset: 0x10,
                entries: vec![0; ODP_PAGES as usize],
            };
            w.res[n].okey = if n == 0 {
                d.reg_mr(pd, obuf + 0x10, BUF_LEN, all, odp).unwrap()
            } else {
                w.res[n].obase = obuf >> 12;
                let implicit = Backing::OdpImplicit {
                    key: 0,
                    entries: Default::default(),
                };
                d.reg_mr(pd, 0, u64::MAX, all, implicit).unwrap()
            };
            w.res[n].obuf = obuf;
            let mw1 = d.alloc_mw(pd, MwType::Type1).unwrap();
            let mw1 = d
                .bind_mw_type1(rc, mw1, key, buf, 4096, Access::REMOTE)
                .unwrap();
            let mw2 = d.alloc_mw(pd, MwType::Type2).unwrap();
            let mw2_rkey = (mw2 & !0xff) | 0x42;
            let frmr = d.alloc_mr(pd, 4).unwrap();
            let frmr_key = (frmr & !0xff) | 0x77;
            let r = &mut w.res[n];
            (r.buf, r.key, r.mw1, r.mw2, r.mw2_rkey) = (buf, key, mw1, mw2, mw2_rkey);
            (r.frmr, r.frmr_key, r.page, r.rbuf) = (frmr, frmr_key, page, rbuf);
        }
        // Bind the type 2 window over the second 4 KiB of the buffer and fast-register the
        // page, through work requests on the RC QP; pre-post receives everywhere.
        for n in 0..2 {
            let r = w.res[n];
            let bind = SendOp::BindMw {
                mw_rkey: r.mw2,
                new_rkey: r.mw2_rkey,
                mr_lkey: r.key,
                addr: r.buf + 4096,
                length: 4096,
                access: Access::REMOTE,
            };
            let reg = SendOp::RegMr {
                lkey: r.frmr,
                key: r.frmr_key,
                access: Access::LOCAL_WRITE.union(Access::REMOTE),
                iova: 0x5000_0000,
                length: 4096,
                page_shift: 12,
                page_offset: 0,
                pages: vec![r.page],
            };
            for op in [bind, reg] {
                w.post_send(n, RC, SendWr::new(0, op, vec![]));
            }
            for role in [RC, RC_SRQ, UC, UD, GSI, XRC_TGT] {
                for _ in 0..2 {
                    w.post_recv(n, role, RECV_LEN);
                }
            }
        }
        w.pump();
        w.check_cqs();
        w
    }

    fn wr_id(&mut self, node: usize, target: Target, recv: bool) -> u64 {
        let id = self.next_wr;
        self.next_wr += 1;
        debug_assert_eq!(self.posted.len() as u64, id);
        self.posted.push(Some(Owner { node, target, recv }));
        id
    }

    fn post_recv(&mut self, node: usize, role: usize, len: u32) {
        let r = self.res[node];
        let id = self.next_wr;
        let wr = RecvWr {
            wr_id: id,
            sg_list: vec![Sge {
                addr: r.rbuf + (id % 8) * RECV_LEN as u64,
                length: len,
                lkey: r.key,
            }]
            .into(),
        };
        let d = &mut self.nodes[node].dev;
        let (ok, target) = if role == RC_SRQ {
            (d.post_srq_recv(r.srq, wr).is_ok(), Target::Srq(r.srq))
        } else if role == XRC_INI || role == XRC_TGT {
            (d.post_srq_recv(r.xsrq, wr).is_ok(), Target::Srq(r.xsrq))
        } else {
            let q = r.qp[role];
            (d.post_recv(q, wr).is_ok(), Target::Qp(q))
        };
        if ok {
            self.wr_id(node, target, true);
        }
    }

    /// Posts `wr` (its wr_id is replaced by a fresh one).
    fn post_send(&mut self, node: usize, role: usize, mut wr: SendWr) {
        let q = self.res[node].qp[role];
        wr.wr_id = self.next_wr;
        let r = self.nodes[node].dev.post_send(q, wr);
        if role == XRC_TGT {
            // An XRC TGT QP has no send queue.
            assert_eq!(
                r,
                Err(VerbError::Invalid),
                "node {node}: send on the XRC TGT QP"
            );
        }
        if r.is_ok() {
            self.wr_id(node, Target::Qp(q), false);
        }
        // Local operations run, and a QP in ERR completes at once: check right away.
        self.check_cqs();
    }

    /// Drains `poll_transmit` on both nodes into the in-flight queue, checking every packet.
    fn pump(&mut self) {
        for n in 0..2 {
            for k in 0.. {
                assert!(k < MAX_PUMP, "node {n}: poll_transmit never runs dry");
                let node = &mut self.nodes[n];
                let tx = if self.in_memory {
                    node.dev
                        .poll_transmit_segments(self.now, &mut node.mem, &mut self.buf, &|_| true)
                } else {
                    // A wire's packets: no more room than a path-MTU packet needs.
                    node.dev
                        .poll_transmit(self.now, &mut node.mem, &mut self.buf[..8192])
                };
                let Some(tx) = tx else {
                    break;
                };
                assert!(tx.len <= self.buf.len(), "{tx:?}");
                let bytes = self.buf[..tx.len].to_vec();
                if let Err(e) = Packet::new_checked(&bytes[..]) {
                    panic!(
                        "node {n} emitted a packet that does not parse ({e}): {tx:?} {bytes:02x?}"
                    );
                }
                if self.wire.len() >= MAX_IN_FLIGHT {
                    self.wire.pop_front();
                }
                self.wire.push_back(InFlight {
                    to: 1 - n,
                    meta: RecvMeta {
                        src: tx.src,
                        dst: tx.dst,
                        sport: tx.sport,
                        traffic_class: tx.traffic_class,
                        hop_limit: tx.hop_limit,
                        flow_label: tx.flow_label,
                    },
                    bytes,
                });
            }
        }
    }

    fn check_cqs(&mut self) {
        for n in 0..2 {
            let cq = self.res[n].cq;
            while let Some(c) = self.nodes[n].dev.poll_cq(cq) {
                let slot = usize::try_from(c.wr_id)
                    .ok()
                    .and_then(|i| self.posted.get_mut(i));
                let Some(o) = slot.and_then(Option::take) else {
                    panic!("node {n}: CQE for a wr_id never posted or completed before: {c:?}");
                };
                assert_eq!(o.node, n, "{c:?} {o:?}");
                assert_eq!(o.recv, c.opcode as u8 >= 128, "{c:?} {o:?}");
                match o.target {
                    Target::Qp(q) => assert_eq!(q, c.qp_num, "{c:?} {o:?}"),
                    // The XRC SRQ's only user is the node's TGT QP, whose `srq` changes with
                    // each request (and is gone after a reset): name it outright.
                    Target::Srq(s) if s == self.res[n].xsrq => {
                        assert_eq!(c.qp_num, self.res[n].qp[XRC_TGT], "{c:?} {o:?}");
                    }
                    Target::Srq(s) => {
                        let qs = self.nodes[n].dev.qp(c.qp_num).and_then(|q| q.srq);
                        assert_eq!(qs, Some(s), "{c:?} {o:?}");
                    }
                }
            }
            while self.nodes[n].dev.poll_event().is_some() {}
            while let Some(f) = self.nodes[n].dev.poll_page_fault() {
                assert_eq!(f.key, self.res[n].okey, "node {n}: {f:?}");
                // Node 1's implicit MR covers every address: a packet whose VA was corrupted
                // in flight may ask for any page of it. Node 0's table has ODP_PAGES.
                if n == 0 {
                    assert!(f.page < ODP_PAGES, "node {n}: {f:?}");
                }
            }
        }
    }

    fn deliver(&mut self, p: InFlight) {
        let node = &mut self.nodes[p.to];
        let _ = if self.in_memory {
            node.dev
                .handle_packet_in_memory(self.now, &p.meta, &p.bytes, &mut node.mem)
        } else {
            node.dev
                .handle_packet(self.now, &p.meta, &p.bytes, &mut node.mem)
        };
    }

    fn timers(&mut self) {
        for n in 0..2 {
            let d = &mut self.nodes[n].dev;
            d.handle_timeout(self.now);
            if let Some(t) = d.poll_timeout() {
                assert!(
                    t > self.now,
                    "node {n}: poll_timeout {t:?} not after handle_timeout({:?})",
                    self.now
                );
            }
        }
    }

    fn next_timer(&mut self) -> Option<Instant> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.dev.poll_timeout())
            .min()
    }

    fn inject(&mut self, inp: &mut Input) -> Option<()> {
        let to = (inp.u8()? & 1) as usize;
        let sel = inp.u8()? % 10;
        let addr = inp.u8()? % 4;
        let len = inp.u16()? as usize;
        let rnd_qpn = if sel == 7 {
            Some(u32::from_le_bytes([inp.u8()?, inp.u8()?, inp.u8()?, 0]))
        } else {
            None
        };
        let rnd_gid = if addr == 3 {
            Some(Gid::from_ipv4([inp.u8()?, inp.u8()?, inp.u8()?, inp.u8()?]))
        } else {
            None
        };
        let mut bytes = inp.bytes(len).to_vec();
        let r = &self.res[to];
        let qpn = match sel {
            0 => None,
            1..=5 => Some(r.qp[sel as usize - 1].0),
            6 => Some(Qpn::MULTICAST.0),
            7 => rnd_qpn,
            _ => Some(r.qp[XRC_INI + sel as usize - 8].0),
        };
        if let (Some(q), true) = (qpn, bytes.len() >= 8) {
            bytes[5..8].copy_from_slice(&q.to_be_bytes()[1..]);
        }
        let own = self.nodes[to].gid;
        let peer = self.nodes[1 - to].gid;
        let (src, mut dst) = match addr {
            0 => (peer, own),
            1 => (own, own),
            2 => (peer, Gid::from_ipv4([10, 9, 9, 9])),
            _ => (rnd_gid.unwrap_or(peer), own),
        };
        if sel == 6 {
            dst = mcast_gid();
        }
        let meta = RecvMeta {
            src,
            dst,
            hop_limit: 64,
            ..Default::default()
        };
        self.deliver(InFlight { to, meta, bytes });
        Some(())
    }

    fn send_op(&mut self, inp: &mut Input) -> Option<()> {
        let node = (inp.u8()? & 1) as usize;
        let role = (inp.u8()? % ROLES as u8) as usize;
        let menu = inp.u8()? % 14;
        let size = [0u32, 1, 8, 64, 256, 257, 700, 4096][(inp.u8()? % 8) as usize];
        let flags = inp.u8()?;
        let key_sel = inp.u8()? % 7;
        let off = inp.u8()? as u64 * 64 % BUF_LEN + (flags as u64 >> 4 & 1);
        let me = self.res[node];
        let peer = self.res[1 - node];
        let rkey = [
            peer.key,
            peer.mw1,
            peer.mw2_rkey,
            peer.frmr_key,
            me.key,
            0x00de_ad42,
            peer.okey,
        ][key_sel as usize];
        let remote_addr = match key_sel {
            3 => 0x5000_0000 + off % 4096,
            6 => peer.obuf + 0x10 + off,
            _ => peer.buf + off,
        };
        let local = vec![if key_sel == 6 {
            Sge {
                addr: me.obuf + 0x10 + 8192,
                length: size,
                lkey: me.okey,
            }
        } else {
            Sge {
                addr: me.buf + 8192,
                length: size,
                lkey: me.key,
            }
        }];
        let op = match menu {
            0 | 13 => SendOp::Send,
            1 => SendOp::SendWithImm(0x1234_5678),
            2 => SendOp::SendWithInv(rkey),
            3 => SendOp::Write { remote_addr, rkey },
            4 => SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: 7,
            },
            5 => SendOp::Read { remote_addr, rkey },
            6 => SendOp::CompSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 1,
            },
            7 => SendOp::FetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            8 => SendOp::AtomicWrite { remote_addr, rkey },
            9 => SendOp::Flush {
                remote_addr,
                rkey,
                len: size,
                selectivity: flags >> 5 & 1,
                placement: 1 + (flags >> 6 & 1),
            },
            10 => SendOp::LocalInv {
                rkey: [me.mw2_rkey, me.frmr_key, me.key][key_sel as usize % 3],
            },
            11 => SendOp::BindMw {
                mw_rkey: me.mw2,
                new_rkey: me.mw2_rkey,
                mr_lkey: me.key,
                addr: me.buf + 4096,
                length: size as u64,
                access: Access::REMOTE,
            },
            // The guest chooses the page addresses and the length: try an unaligned page at the
            // top of the address space and an absurd length too.
            _ => SendOp::RegMr {
                lkey: me.frmr,
                key: me.frmr_key,
                access: Access::LOCAL_WRITE.union(Access::REMOTE),
                iova: 0x5000_0000 + (off & 0xff8),
                length: if flags & 0x20 == 0 {
                    size as u64
                } else {
                    u64::MAX
                },
                page_shift: 12,
                page_offset: off & 0xff8,
                pages: vec![if flags & 8 == 0 {
                    me.page
                } else {
                    u64::MAX - 0xff
                }],
            },
        };
        let atomic = matches!(
            op,
            SendOp::CompSwap { .. } | SendOp::FetchAdd { .. } | SendOp::AtomicWrite { .. }
        );
        let sg = if atomic {
            vec![Sge {
                length: 8,
                ..local[0]
            }]
        } else if op.is_local() || matches!(op, SendOp::Flush { .. }) {
            vec![]
        } else {
            local
        };
        let mut wr = SendWr::new(0, op, sg);
        let bit = |b: u8, f: u32| if flags >> b & 1 == 1 { f } else { 0 };
        wr.flags = bit(0, SEND_SIGNALED) | bit(1, SEND_SOLICITED) | bit(2, SEND_FENCE);
        if menu == 13 {
            wr.flags |= SEND_INLINE;
            wr.inline_data = vec![0x5a; size.min(256) as usize];
        }
        if role == UD || role == GSI {
            let (dgid, remote_qpn) = match flags >> 5 & 3 {
                0 => (self.nodes[1 - node].gid, peer.qp[UD]),
                1 => (self.nodes[1 - node].gid, Qpn::GSI),
                2 => (mcast_gid(), Qpn::MULTICAST),
                _ => (self.nodes[1 - node].gid, Qpn(0x77)),
            };
            wr.ud = Some(UdDest {
                av: Av {
                    dgid,
                    sgid_index: 0,
                    hop_limit: 64,
                    ..Default::default()
                },
                remote_qpn,
                remote_qkey: if flags & 0x80 != 0 {
                    0xbad
                } else if remote_qpn == Qpn::GSI {
                    GSI_QKEY
                } else {
                    QKEY
                },
            });
        }
        if role == XRC_INI || role == XRC_TGT {
            // The peer's XRC SRQ, or (bit 7) one that makes the request invalid: with bit 6
            // the peer's regular SRQ, without it a number that is no SRQ.
            wr.xrc_remote_srqn = Some(match flags >> 6 {
                2 => BOGUS_SRQN,
                3 => peer.srq,
                _ => peer.xsrq,
            });
        }
        self.post_send(node, role, wr);
        Some(())
    }

    fn modify(&mut self, inp: &mut Input) -> Option<()> {
        let node = (inp.u8()? & 1) as usize;
        let role = (inp.u8()? % ROLES as u8) as usize;
        let s = inp.u8()?;
        let state = [
            QpState::Reset,
            QpState::Init,
            QpState::Rtr,
            QpState::Rts,
            QpState::Sqd,
            QpState::Err,
        ][(s & 0x7f) as usize % 6];
        let mut a = conn_attr(self, node, role);
        a.qp_state = state;
        let mask = if s >= 128 {
            AttrMask::STATE
        } else {
            conn_mask(role, state)
        };
        let q = self.res[node].qp[role];
        let _ = self.nodes[node].dev.modify_qp(q, &a, AttrMask(mask));
        Some(())
    }

    fn step(&mut self, inp: &mut Input) -> Option<()> {
        match inp.u8()? % 11 {
            0 => self.inject(inp)?,
            1 => {
                let how = inp.u8()?;
                let amount = inp.u8()? as u64;
                let to = if how % 2 == 0 {
                    self.next_timer().unwrap_or(self.now)
                } else {
                    self.now.plus_ns((amount + 1) << (how / 2 % 32))
                };
                self.now = self.now.max(to);
                self.timers();
            }
            2 => self.send_op(inp)?,
            3 => {
                let node = (inp.u8()? & 1) as usize;
                let role = (inp.u8()? % ROLES as u8) as usize;
                let len = [0u32, 8, 64, 256, 1024, 4096][(inp.u8()? % 6) as usize];
                self.post_recv(node, role, len);
            }
            4 => {
                let n = inp.u8()? % 16 + 1;
                for _ in 0..n {
                    let Some(p) = self.wire.pop_front() else {
                        break;
                    };
                    self.deliver(p);
                }
            }
            5 => {
                let i = inp.u8()? as usize;
                let action = inp.u8()? % 4;
                let x = inp.u8()? as usize;
                let y = inp.u8()?;
                if self.wire.is_empty() {
                    return Some(());
                }
                let i = i % self.wire.len();
                match action {
                    0 => {
                        self.wire.remove(i);
                    }
                    1 => {
                        let p = &self.wire[i];
                        let c = InFlight {
                            to: p.to,
                            meta: p.meta,
                            bytes: p.bytes.clone(),
                        };
                        self.wire.push_back(c);
                    }
                    _ => {
                        let mut p = self.wire.remove(i).expect("in range");
                        if action == 3 && !p.bytes.is_empty() {
                            let k = x % p.bytes.len();
                            p.bytes[k] ^= y;
                        }
                        self.deliver(p);
                    }
                }
            }
            6 => self.modify(inp)?,
            7 => {
                let rounds = inp.u8()? % 32 + 1;
                for _ in 0..rounds {
                    if self.wire.is_empty() {
                        let Some(t) = self.next_timer() else { break };
                        self.now = self.now.max(t);
                        self.timers();
                    } else {
                        for p in std::mem::take(&mut self.wire) {
                            self.deliver(p);
                        }
                    }
                    self.pump();
                    self.check_cqs();
                }
            }
            9 => self.in_memory = !self.in_memory,
            10 => {
                let n = (inp.u8()? & 1) as usize;
                let page = inp.u8()? as u64 % ODP_PAGES;
                let at = self.res[n].obuf + (page << 12);
                let e = match inp.u8()? % 3 {
                    0 => at | ODP_PRESENT | ODP_WRITABLE,
                    1 => at | ODP_PRESENT,
                    _ => 0,
                };
                let d = &mut self.nodes[n].dev;
                d.odp_update(self.res[n].okey, self.res[n].obase + page, &[e])
                    .unwrap();
                d.odp_wake();
            }
            _ => {
                let n = (inp.u8()? & 1) as usize;
                let sol = inp.u8()? & 1 == 1;
                let cq = self.res[n].cq;
                let _ = self.nodes[n].dev.req_notify_cq(cq, sol);
            }
        }
        Some(())
    }
}

fuzz_target!(|data: &[u8]| {
    let mut w = World::new();
    let mut inp = Input(data);
    while w.step(&mut inp).is_some() {
        w.pump();
        w.check_cqs();
    }
    w.pump();
    w.check_cqs();
});
