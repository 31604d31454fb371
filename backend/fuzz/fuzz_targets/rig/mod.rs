//! A guest for the device model, without a socket: guest memory laid out with rings, page
//! lists and MRs, the objects created through control commands, work requests written into
//! the rings the way librxe writes them, and the model's packets looped back into it. The fuzz
//! targets drive it with operations decoded from their input, and it checks after every
//! operation what the device may and may not have done:
//!
//! - it wrote guest memory only where it may: CQ rings (the current ring of each CQ, never an
//!   old one after RESIZE_CQ), the consumer-index word of SQ, RQ and SRQ rings, and MRs that
//!   grant local write; never a page list, a send or receive slot, or a page no object names;
//! - every work request completes at most once, on its QP's CQ, under its QP's number (unless
//!   the guest scribbled over that QP's ring or that CQ's ring, which makes its completions
//!   the guest's own doing);
//! - resources stay within the configured limits (page-list bytes, objects, pending events)
//!   and the work of one operation is bounded (WQEs taken ≤ ring slots, CQEs written ≤ CQ
//!   room, packets sent by a pump ≤ its budget);
//! - at the end, every work request of an intact QP completes once the QP is moved to the
//!   error state, and once every object is destroyed the page-list budget is back to zero.

#![allow(dead_code)]

use std::collections::HashMap;

use rxe_core::device::{DeviceConfig, RecvMeta, Transmit};
use rxe_core::verbs::*;
use rxe_core::{Gid, Instant};
use vhost_user_rdma::abi::{self, op, ring as hdr, swqe, wr_op};
use vhost_user_rdma::device::model::{Model, ModelConfig, MAX_PENDING_EVENTS};
use vhost_user_rdma::memory::guest_mem::GuestMemoryMmap;
use vhost_user_rdma::transport::sink::FnSink;
use vm_memory::{ByteValued, Bytes, GuestAddress};

pub const BASE: u64 = 0x10000;
pub const PAGE: u64 = 4096;
pub const PAGES: u64 = 64;
pub const MEM: u64 = PAGES * PAGE;

/// Page numbers of the fixed layout.
const LISTS: u64 = 0; // 2 pages of page lists
const CQ_AREAS: u64 = 2; // 3 CQs x 2 areas x 2 pages
const QP_RINGS: u64 = 14; // 6 QPs x (3 SQ + 1 RQ) pages
const SRQ_RING: u64 = 38; // 1 page
const MR_RW: u64 = 39; // 8 pages, local write + remote rights
const MR_RO: u64 = 47; // 2 pages, remote read only
/// Pages 49.. belong to no object: the device must never write them.
const FREE: u64 = 49;

pub const NCQ: usize = 3;
pub const NQP: usize = 6;
const SQ_SLOTS: u32 = 16;
const SQ_LOG2: u32 = 9;
const RQ_SLOTS: u32 = 16;
const RQ_LOG2: u32 = 7;
const MAX_WR: u32 = 8;
const MAX_SGE: u32 = 2;
const MAX_INLINE: u32 = 64;
/// Tag of the work-request ids the rig writes.
const TAG: u64 = 0xC0DE << 48;

pub fn gpa(page: u64) -> u64 {
    BASE + page * PAGE
}

fn put32(s: &mut [u8], o: usize, v: u32) {
    s[o..o + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(s: &mut [u8], o: usize, v: u64) {
    s[o..o + 8].copy_from_slice(&v.to_le_bytes());
}

/// Reads fuzz input a byte at a time; zeros past the end.
pub struct Input<'a>(pub &'a [u8]);

impl Input<'_> {
    pub fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A ring as the rig knows it: where it lies and its geometry.
#[derive(Clone, Copy, Debug)]
struct RingArea {
    gpa: u64,
    pages: u32,
    slots: u32,
    log2: u32,
}

impl RingArea {
    fn len(&self) -> u64 {
        hdr::DATA + ((self.slots as u64) << self.log2)
    }
    fn slot(&self, i: u32) -> u64 {
        self.gpa + hdr::DATA + (((i & (self.slots - 1)) as u64) << self.log2)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WrState {
    Outstanding,
    Done,
    /// Its QP was destroyed or reset: a completion may still be in a CQ ring, or none.
    Abandoned,
}

#[derive(Clone, Copy, Debug)]
struct Wr {
    qp: usize,
    recv: bool,
    srq: bool,
    state: WrState,
}

struct Qp {
    qpn: u32,
    qp_type: QpType,
    send_cq: usize,
    recv_cq: usize,
    srq: bool,
    sq: RingArea,
    rq: RingArea,
    /// The guest wrote over its rings, or moved it to RESET: its completions prove nothing.
    tainted: bool,
    alive: bool,
}

struct Cq {
    cqn: u32,
    /// Area 0 or 1 of this CQ (RESIZE_CQ moves to the other).
    area: usize,
    ring: RingArea,
    tainted: bool,
}

pub struct Rig {
    pub mem: GuestMemoryMmap,
    pub m: Model,
    cfg: ModelConfig,
    pd: u32,
    cqs: Vec<Cq>,
    qps: Vec<Qp>,
    srqn: u32,
    srq: RingArea,
    srq_tainted: bool,
    mr_rw: (u32, u32),
    mr_ro: (u32, u32),
    wrs: HashMap<u64, Wr>,
    next_wr: u64,
    /// QPNs of destroyed QPs, and whether the guest had meddled with them: QPNs come round
    /// again, and a completion left in a CQ ring may name an old QP by a number a new one has.
    retired: HashMap<u32, bool>,
    pub now: u64,
    /// Packets the model sent, waiting to be delivered back to it.
    pub wire: Vec<(Transmit, Vec<u8>)>,
    gid: Gid,
    snap: Vec<u8>,
    /// A range the current operation handed the device (RESIZE_CQ's new ring).
    extra: Option<(u64, u64)>,
    seq: u64,
    /// The input asked for something the rig cannot set up (not a finding).
    pub broken: bool,
}

fn qp_type_of(i: usize) -> QpType {
    match i / 2 {
        0 => QpType::Rc,
        1 => QpType::Uc,
        _ => QpType::Ud,
    }
}

impl Rig {
    pub fn new() -> Rig {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(BASE), MEM as usize)]).unwrap();
        let cfg = ModelConfig {
            dev: DeviceConfig {
                max_qp: 16,
                max_cq: 8,
                max_cqe: 63,
                max_qp_wr: 16,
                max_sge: 4,
                max_inline: 128,
                max_srq_wr: 16,
                max_registered_bytes: 1 << 20,
                seed: Some(7),
                ..DeviceConfig::default()
            },
            max_page_list_bytes: 1 << 16,
            ..ModelConfig::default()
        };
        let m = Model::new(cfg.clone());
        let gid = Gid::from_ip(std::net::Ipv4Addr::new(10, 0, 0, 1).into());
        let mut r = Rig {
            mem,
            m,
            cfg,
            pd: 0,
            cqs: Vec::new(),
            qps: Vec::new(),
            srqn: 0,
            srq: RingArea {
                gpa: gpa(SRQ_RING),
                pages: 1,
                slots: RQ_SLOTS,
                log2: RQ_LOG2,
            },
            srq_tainted: false,
            mr_rw: (0, 0),
            mr_ro: (0, 0),
            wrs: HashMap::new(),
            next_wr: 0,
            retired: HashMap::new(),
            now: 1_000_000,
            wire: Vec::new(),
            gid,
            snap: vec![0; MEM as usize],
            extra: None,
            seq: 0,
            broken: false,
        };
        r.setup();
        r
    }

    // -------------------------------------------------------------- control commands

    fn ctrl<T: ByteValued>(&mut self, opcode: u32, c: &T) -> Result<Vec<u8>, u32> {
        self.ctrl_raw(opcode, c.as_slice())
    }

    fn ctrl_raw(&mut self, opcode: u32, c: &[u8]) -> Result<Vec<u8>, u32> {
        self.seq += 1;
        let h = abi::CtrlHdr {
            opcode,
            flags: 0,
            seq: self.seq,
        };
        let mut req = h.as_slice().to_vec();
        req.extend_from_slice(c);
        let (h, body) = self.m.handle_ctrl(&self.mem, &req, 4096);
        if h.status == abi::Status::Ok as u32 {
            Ok(body)
        } else {
            Err(h.status)
        }
    }

    /// Writes a page list (levels 0) for `pages` at `at`.
    fn list(&self, at: u64, pages: &[u64]) -> abi::PageListDesc {
        let b: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.mem.write_slice(&b, GuestAddress(at)).unwrap();
        abi::PageListDesc {
            gpa: at,
            num_pages: pages.len() as u32,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        }
    }

    fn queue(&self, list_at: u64, r: &RingArea) -> abi::QueueDesc {
        let pages: Vec<u64> = (0..r.pages as u64).map(|i| r.gpa + i * PAGE).collect();
        // A fresh ring: header as the driver initialises it, indices 0.
        let zero = vec![0u8; (r.pages as u64 * PAGE) as usize];
        self.mem.write_slice(&zero, GuestAddress(r.gpa)).unwrap();
        self.store(r.gpa + hdr::LOG2_ELEM_SIZE, r.log2);
        self.store(r.gpa + hdr::INDEX_MASK, r.slots - 1);
        abi::QueueDesc {
            pages: self.list(list_at, &pages),
            num_slots: r.slots,
            log2_elem_size: r.log2,
            reserved: 0,
        }
    }

    fn load(&self, at: u64) -> u32 {
        self.mem.read_obj::<u32>(GuestAddress(at)).unwrap()
    }
    fn store(&self, at: u64, v: u32) {
        self.mem.write_obj(v, GuestAddress(at)).unwrap();
    }

    fn cq_area(i: usize, area: usize) -> u64 {
        gpa(CQ_AREAS + (i as u64 * 2 + area as u64) * 2)
    }
    fn list_slot(n: u64) -> u64 {
        // 16 slots of 512 bytes (64 entries each) over the two list pages.
        gpa(LISTS) + (n % 16) * 512
    }

    fn setup(&mut self) {
        self.add_gid();
        let pd: abi::Handle =
            abi::read_struct(&self.ctrl_raw(op::CREATE_PD, &[]).unwrap()).unwrap();
        self.pd = pd.handle;
        for i in 0..NCQ {
            let ring = RingArea {
                gpa: Self::cq_area(i, 0),
                pages: 1,
                slots: 16,
                log2: 6,
            };
            let q = self.queue(Self::list_slot(i as u64), &ring);
            let r: abi::RespCreateCq = abi::read_struct(
                &self
                    .ctrl(
                        op::CREATE_CQ,
                        &abi::CmdCreateCq {
                            cqe: 15,
                            flags: 0,
                            queue: q,
                        },
                    )
                    .unwrap(),
            )
            .unwrap();
            self.cqs.push(Cq {
                cqn: r.cqn,
                area: 0,
                ring,
                tainted: false,
            });
        }
        let q = self.queue(Self::list_slot(3), &self.srq.clone());
        let r: abi::RespCreateSrq = abi::read_struct(
            &self
                .ctrl(
                    op::CREATE_SRQ,
                    &abi::CmdCreateSrq {
                        pdn: self.pd,
                        max_wr: MAX_WR,
                        max_sge: MAX_SGE,
                        srq_limit: 0,
                        queue: q,
                    },
                )
                .unwrap(),
        )
        .unwrap();
        self.srqn = r.srqn;
        self.mr_rw = self.reg_mr(MR_RW, 8, Access::LOCAL_WRITE.union(Access::REMOTE), 4);
        self.mr_ro = self.reg_mr(MR_RO, 2, Access::REMOTE_READ, 5);
        for i in 0..NQP {
            let t = qp_type_of(i);
            let sq = RingArea {
                gpa: gpa(QP_RINGS + i as u64 * 4),
                pages: 3,
                slots: SQ_SLOTS,
                log2: SQ_LOG2,
            };
            let rq = RingArea {
                gpa: gpa(QP_RINGS + i as u64 * 4 + 3),
                pages: 1,
                slots: RQ_SLOTS,
                log2: RQ_LOG2,
            };
            self.qps.push(Qp {
                qpn: 0,
                qp_type: t,
                send_cq: i % NCQ,
                recv_cq: (i + 1) % NCQ,
                // The second RC QP takes its receives from the SRQ.
                srq: i == 1,
                sq,
                rq,
                tainted: false,
                alive: false,
            });
        }
        for i in 0..NQP {
            self.create_qp(i);
        }
        for i in 0..NQP {
            self.bring_up(i);
        }
    }

    fn reg_mr(&mut self, page: u64, n: u64, access: Access, slot: u64) -> (u32, u32) {
        let pages: Vec<u64> = (0..n).map(|i| gpa(page) + i * PAGE).collect();
        let c = abi::CmdRegUserMr {
            pdn: self.pd,
            access: access.0,
            iova: gpa(page),
            length: n * PAGE,
            pages: self.list(Self::list_slot(slot), &pages),
            page_offset: 0,
            reserved: 0,
        };
        let r: abi::RespMr = abi::read_struct(&self.ctrl(op::REG_USER_MR, &c).unwrap()).unwrap();
        (r.lkey, r.rkey)
    }

    fn create_qp(&mut self, i: usize) {
        let q = &self.qps[i];
        let (t, scq, rcq, srq, sq, rq) = (q.qp_type, q.send_cq, q.recv_cq, q.srq, q.sq, q.rq);
        let sqd = self.queue(Self::list_slot(6 + i as u64), &sq);
        let rqd = if srq {
            abi::QueueDesc::default()
        } else {
            // RQ lists after the SQ lists, in the second half of each slot.
            self.queue(Self::list_slot(6 + i as u64) + 256, &rq)
        };
        let c = abi::CmdCreateQp {
            qp_type: match t {
                QpType::Rc => abi::qp_type::RC,
                QpType::Uc => abi::qp_type::UC,
                _ => abi::qp_type::UD,
            },
            pdn: self.pd,
            send_cqn: self.cqs[scq].cqn,
            recv_cqn: self.cqs[rcq].cqn,
            srqn: if srq { self.srqn } else { 0 },
            flags: if srq { abi::CREATE_QP_HAS_SRQ } else { 0 },
            max_send_wr: MAX_WR,
            max_recv_wr: if srq { 0 } else { MAX_WR },
            max_send_sge: MAX_SGE,
            max_recv_sge: if srq { 0 } else { MAX_SGE },
            max_inline_data: MAX_INLINE,
            xrcdn: 0,
            sq: sqd,
            rq: rqd,
        };
        match self.ctrl(op::CREATE_QP, &c) {
            Ok(b) => {
                let r: abi::RespCreateQp = abi::read_struct(&b).unwrap();
                let q = &mut self.qps[i];
                q.qpn = r.qpn;
                q.alive = true;
                q.tainted = false;
            }
            Err(_) => {
                // Out of QPs or page-list budget (a leak would show here first).
                self.broken = true;
                self.qps[i].alive = false;
            }
        }
    }

    fn modify(&mut self, i: usize, a: &abi::QpAttrs) -> bool {
        let mut a = *a;
        a.qpn = self.qps[i].qpn;
        self.ctrl(op::MODIFY_QP, &a).is_ok()
    }

    /// INIT → RTR → RTS towards the QP's partner (the other of its pair).
    fn bring_up(&mut self, i: usize) {
        if !self.qps[i].alive {
            return;
        }
        let ud = self.qps[i].qp_type == QpType::Ud;
        let peer = self.qps[i ^ 1].qpn;
        let mut a = abi::QpAttrs {
            attr_mask: AttrMask::STATE
                | AttrMask::PKEY_INDEX
                | AttrMask::PORT
                | if ud {
                    AttrMask::QKEY
                } else {
                    AttrMask::ACCESS_FLAGS
                },
            qp_state: QpState::Init as u32,
            qkey: 0x1111,
            qp_access_flags: Access::LOCAL_WRITE.union(Access::REMOTE).0,
            port_num: 1,
            ..Default::default()
        };
        self.modify(i, &a);
        a.qp_state = QpState::Rtr as u32;
        a.attr_mask = AttrMask::STATE;
        let rc = self.qps[i].qp_type == QpType::Rc;
        if !ud {
            a.path_mtu = Mtu::M256 as u32;
            a.dest_qp_num = peer;
            a.rq_psn = 0x10;
            a.ah.dgid = self.gid.0;
            a.ah.hop_limit = 64;
            a.attr_mask |=
                AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        }
        if rc {
            a.max_dest_rd_atomic = 4;
            a.min_rnr_timer = 1;
            a.attr_mask |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
        self.modify(i, &a);
        a.qp_state = QpState::Rts as u32;
        a.attr_mask = AttrMask::STATE | AttrMask::SQ_PSN;
        a.sq_psn = 0x10;
        if rc {
            a.timeout = 10;
            a.retry_cnt = 3;
            a.rnr_retry = 3;
            a.max_rd_atomic = 4;
            a.attr_mask |= AttrMask::TIMEOUT
                | AttrMask::RETRY_CNT
                | AttrMask::RNR_RETRY
                | AttrMask::MAX_QP_RD_ATOMIC;
        }
        self.modify(i, &a);
    }

    fn add_gid(&mut self) {
        let c = abi::CmdAddGid {
            index: 0,
            gid_type: abi::GID_TYPE_ROCE_UDP_ENCAP,
            gid: self.gid.0,
        };
        let _ = self.ctrl(op::ADD_GID, &c);
    }

    // -------------------------------------------------------------- what the device may write

    /// The byte ranges the device may write now.
    fn writable(&self) -> Vec<(u64, u64)> {
        let mut v = Vec::new();
        for c in &self.cqs {
            v.push((c.ring.gpa, c.ring.gpa + c.ring.len()));
        }
        for q in self.qps.iter().filter(|q| q.alive) {
            let ci = q.sq.gpa + hdr::CONSUMER_INDEX;
            v.push((ci, ci + 4));
            if !q.srq {
                let ci = q.rq.gpa + hdr::CONSUMER_INDEX;
                v.push((ci, ci + 4));
            }
        }
        let ci = self.srq.gpa + hdr::CONSUMER_INDEX;
        v.push((ci, ci + 4));
        v.push((gpa(MR_RW), gpa(MR_RW + 8)));
        v.extend(self.extra);
        v
    }

    /// Takes the snapshot the next [`Self::check_writes`] compares against.
    pub fn snapshot(&mut self) {
        self.mem
            .read_slice(&mut self.snap, GuestAddress(BASE))
            .unwrap();
    }

    /// Every byte the device changed since the snapshot lies where it may write.
    pub fn check_writes(&self, what: &str) {
        let ok = self.writable();
        let mut now = vec![0u8; MEM as usize];
        self.mem.read_slice(&mut now, GuestAddress(BASE)).unwrap();
        for (p, (a, b)) in now
            .chunks_exact(PAGE as usize)
            .zip(self.snap.chunks_exact(PAGE as usize))
            .enumerate()
        {
            if a == b {
                continue;
            }
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                let at = BASE + p as u64 * PAGE + k as u64;
                if x != y && !ok.iter().any(|&(s, e)| (s..e).contains(&at)) {
                    panic!(
                        "{what}: the device wrote {y:#04x} → {x:#04x} at GPA {at:#x} (page {p}), \
                         outside what it may write: {ok:x?}"
                    );
                }
            }
        }
    }

    /// Limits that hold after every operation.
    pub fn check_limits(&self, what: &str) {
        let l = self.m.page_lists();
        assert!(l.used <= l.cap, "{what}: page lists {l:?} beyond the cap");
        let (q, c, s) = self.m.object_counts();
        let d = &self.cfg.dev;
        assert!(
            q as u32 <= d.max_qp && c as u32 <= d.max_cq && s as u32 <= d.max_srq,
            "{what}: objects ({q}, {c}, {s}) beyond the limits"
        );
        assert!(
            self.m.events_len() <= MAX_PENDING_EVENTS,
            "{what}: {} events pending",
            self.m.events_len()
        );
        // The engine holds at most max_send_wr of a QP's send WQEs, whatever its ring says.
        for q in self.qps.iter().filter(|q| q.alive) {
            let n = self.m.with_qp_dev(q.qpn, |d| {
                d.sq_outstanding(rxe_core::Qpn(q.qpn)).unwrap_or(0)
            });
            assert!(
                n <= MAX_WR as usize,
                "{what}: qp {:#x} holds {n} send WQEs",
                q.qpn
            );
        }
    }

    // -------------------------------------------------------------- the guest's side

    fn new_wr(&mut self, qp: usize, recv: bool, srq: bool) -> u64 {
        self.next_wr += 1;
        let id = TAG | self.next_wr;
        self.wrs.insert(
            id,
            Wr {
                qp,
                recv,
                srq,
                state: WrState::Outstanding,
            },
        );
        id
    }

    /// An SGE into one of the MRs (or, bit 7 of `sel`, a key of the input's choosing).
    fn sge(&self, inp: &mut Input, slot: &mut [u8], at: usize) {
        let sel = inp.u8();
        let off = (inp.u16() as u64) % (8 * PAGE);
        let len = (inp.u16() as u32) % 2048;
        let (addr, key) = match sel & 3 {
            0 | 1 => (gpa(MR_RW) + off, self.mr_rw.0),
            2 => (gpa(MR_RO) + off % (2 * PAGE), self.mr_ro.0),
            _ => (gpa(MR_RW) + off, inp.u32()),
        };
        put64(slot, at, addr);
        put32(slot, at + 8, len);
        put32(slot, at + 12, key);
    }

    /// Writes a send WQE for QP `i` into its SQ and publishes it (librxe's post_send).
    pub fn post_send(&mut self, i: usize, inp: &mut Input) -> Option<()> {
        let q = &self.qps[i];
        if !q.alive {
            return None;
        }
        let sq = q.sq;
        let ud = q.qp_type == QpType::Ud;
        let peer = self.qps[i ^ 1].qpn;
        let prod = self.load(sq.gpa + hdr::PRODUCER_INDEX) & (sq.slots - 1);
        let cons = self.load(sq.gpa + hdr::CONSUMER_INDEX) & (sq.slots - 1);
        if (prod + 1) & (sq.slots - 1) == cons {
            return None; // full, as librxe sees it
        }
        let mut s = vec![0u8; 1 << sq.log2];
        let kind = inp.u8();
        let opcode = match kind % 11 {
            0..=2 => wr_op::SEND,
            3 => wr_op::SEND_WITH_IMM,
            4 => wr_op::RDMA_WRITE,
            5 => wr_op::RDMA_WRITE_WITH_IMM,
            6 => wr_op::RDMA_READ,
            7 => wr_op::ATOMIC_FETCH_AND_ADD,
            8 => wr_op::ATOMIC_CMP_AND_SWP,
            9 => wr_op::ATOMIC_WRITE,
            _ => wr_op::SEND_WITH_INV,
        };
        let id = self.new_wr(i, false, false);
        put64(&mut s, swqe::WR_ID, id);
        put32(&mut s, swqe::OPCODE, opcode);
        let mut flags = SEND_SIGNALED;
        if kind & 0x10 != 0 {
            flags |= SEND_SOLICITED;
        }
        if kind & 0x20 != 0 {
            flags |= SEND_FENCE;
        }
        let inline = kind & 0x40 != 0;
        if inline {
            flags |= SEND_INLINE;
        }
        put32(&mut s, swqe::SEND_FLAGS, flags);
        put32(&mut s, swqe::EX, inp.u32());
        // Remote address and key: into an MR, or anywhere the input says.
        let raddr = if kind & 0x80 != 0 {
            inp.u32() as u64 | BASE
        } else {
            (gpa(MR_RW) + (inp.u16() as u64 % (8 * PAGE))) & !7
        };
        let rkey = match inp.u8() % 4 {
            0 | 1 => self.mr_rw.1,
            2 => self.mr_ro.1,
            _ => inp.u32(),
        };
        if ud {
            put32(&mut s, swqe::UD_REMOTE_QPN, peer);
            put32(&mut s, swqe::UD_REMOTE_QKEY, 0x1111);
            s[swqe::UD_AV + abi::av::DGID..swqe::UD_AV + abi::av::DGID + 16]
                .copy_from_slice(&self.gid.0);
            s[swqe::UD_AV + abi::av::HOP_LIMIT] = 64;
        } else if matches!(
            opcode,
            wr_op::ATOMIC_FETCH_AND_ADD | wr_op::ATOMIC_CMP_AND_SWP
        ) {
            put64(&mut s, swqe::ATOMIC_REMOTE_ADDR, raddr);
            put64(&mut s, swqe::ATOMIC_COMPARE_ADD, inp.u32() as u64);
            put64(&mut s, swqe::ATOMIC_SWAP, inp.u32() as u64);
            put32(&mut s, swqe::ATOMIC_RKEY, rkey);
        } else {
            put64(&mut s, swqe::RDMA_REMOTE_ADDR, raddr);
            put32(&mut s, swqe::RDMA_RKEY, rkey);
        }
        if inline {
            let n = (inp.u8() as u32) % (MAX_INLINE + 1);
            put32(&mut s, swqe::DMA_LENGTH, n);
            let d = inp.bytes(n as usize);
            s[swqe::DMA_DATA..swqe::DMA_DATA + d.len()].copy_from_slice(&d);
        } else {
            let n = (inp.u8() as u32) % (MAX_SGE + 1);
            let mut total = 0u32;
            for k in 0..n as usize {
                self.sge(inp, &mut s, swqe::DMA_DATA + k * abi::SGE_SIZE);
                total += u32::from_le_bytes(
                    s[swqe::DMA_DATA + k * 16 + 8..swqe::DMA_DATA + k * 16 + 12]
                        .try_into()
                        .unwrap(),
                );
            }
            put32(&mut s, swqe::DMA_NUM_SGE, n);
            put32(&mut s, swqe::DMA_LENGTH, total);
            put32(&mut s, swqe::DMA_RESID, total);
        }
        self.mem
            .write_slice(&s, GuestAddress(sq.slot(prod)))
            .unwrap();
        self.store(sq.gpa + hdr::PRODUCER_INDEX, (prod + 1) & (sq.slots - 1));
        Some(())
    }

    /// Writes a receive WQE into QP `i`'s RQ (or the SRQ) and publishes it.
    pub fn post_recv(&mut self, i: usize, inp: &mut Input) -> Option<()> {
        let q = &self.qps[i];
        if !q.alive {
            return None;
        }
        let srq = q.srq;
        let ring = if srq { self.srq } else { q.rq };
        let prod = self.load(ring.gpa + hdr::PRODUCER_INDEX) & (ring.slots - 1);
        let cons = self.load(ring.gpa + hdr::CONSUMER_INDEX) & (ring.slots - 1);
        if (prod + 1) & (ring.slots - 1) == cons {
            return None;
        }
        let mut s = vec![0u8; 1 << ring.log2];
        let id = self.new_wr(i, true, srq);
        put64(&mut s, abi::rwqe::WR_ID, id);
        let n = 1 + (inp.u8() as u32) % MAX_SGE;
        for k in 0..n as usize {
            self.sge(inp, &mut s, abi::rwqe::DMA_SGE + k * abi::SGE_SIZE);
        }
        put32(&mut s, abi::rwqe::DMA_NUM_SGE, n);
        self.mem
            .write_slice(&s, GuestAddress(ring.slot(prod)))
            .unwrap();
        self.store(
            ring.gpa + hdr::PRODUCER_INDEX,
            (prod + 1) & (ring.slots - 1),
        );
        Some(())
    }

    /// The guest writes `data` at `off` in one of its objects (rings, lists, MRs).
    pub fn scribble(&mut self, target: u8, off: u16, data: &[u8]) {
        let (start, len) = match target % 8 {
            0 | 1 => {
                let i = (off as usize >> 8) % NQP;
                self.qps[i].tainted = true;
                (self.qps[i].sq.gpa, self.qps[i].sq.len())
            }
            2 => {
                let i = (off as usize >> 8) % NQP;
                self.qps[i].tainted = true;
                (self.qps[i].rq.gpa, self.qps[i].rq.len())
            }
            3 => {
                self.srq_tainted = true;
                (self.srq.gpa, self.srq.len())
            }
            4 => {
                let i = (off as usize >> 8) % NCQ;
                self.cqs[i].tainted = true;
                (self.cqs[i].ring.gpa, self.cqs[i].ring.len())
            }
            5 => (gpa(LISTS), 2 * PAGE),
            _ => (gpa(MR_RW), 10 * PAGE),
        };
        let at = off as u64 % len;
        let n = (data.len() as u64).min(len - at) as usize;
        self.mem
            .write_slice(&data[..n], GuestAddress(start + at))
            .unwrap();
    }

    // -------------------------------------------------------------- the device's side

    fn stats_work(&self) -> u64 {
        let s = self.m.stats();
        s.sq_wqes + s.rq_wqes + s.bad_wqes
    }

    /// Runs `f` on the model and checks what it wrote and how much work it did.
    pub fn device(&mut self, what: &str, f: impl FnOnce(&mut Rig)) {
        self.snapshot();
        let (work0, cqes0) = (self.stats_work(), self.m.stats().cqes);
        f(self);
        self.check_writes(what);
        self.check_limits(what);
        let slots: u64 = self.qps.len() as u64 * (SQ_SLOTS + RQ_SLOTS) as u64 + 16;
        let room: u64 = self.cqs.iter().map(|c| c.ring.slots as u64).sum();
        let work = self.stats_work() - work0;
        let cqes = self.m.stats().cqes - cqes0;
        // One pump pulls at most every ring twice (after completions made room); a CQE
        // needs room in its ring, which only the guest makes.
        assert!(
            work <= 4 * slots,
            "{what}: {work} WQEs taken (rings hold {slots})"
        );
        assert!(
            cqes <= room,
            "{what}: {cqes} CQEs written, CQ rings hold {room}"
        );
    }

    pub fn doorbell(&mut self, kind: u32, object: u32) {
        let db = abi::Doorbell {
            kind,
            object,
            index: 0,
            reserved: 0,
        };
        self.device("doorbell", |r| r.m.doorbell(&r.mem, &db));
    }

    pub fn qpn(&self, i: usize) -> u32 {
        self.qps[i % NQP].qpn
    }
    pub fn cqn(&self, i: usize) -> u32 {
        self.cqs[i % NCQ].cqn
    }
    pub fn srqn(&self) -> u32 {
        self.srqn
    }

    pub fn pump(&mut self, budget: usize) {
        self.device("pump", |r| {
            let now = Instant(r.now);
            let mut out = Vec::new();
            let mut sink = FnSink::new(|t: &Transmit, b: &mut [u8]| out.push((*t, b.to_vec())));
            r.m.pump_budget(&r.mem, now, &mut sink, budget);
            drop(sink);
            assert!(out.len() <= budget, "pump sent {} > {budget}", out.len());
            // The wire keeps a bounded backlog.
            r.wire.extend(out);
            if r.wire.len() > 256 {
                r.wire.drain(..r.wire.len() - 256);
            }
        });
    }

    pub fn meta(t: &Transmit) -> RecvMeta {
        RecvMeta::from(t)
    }

    /// Delivers packet `k` of the wire (taken off it unless `dup`), with `flip` applied: a
    /// byte offset and an xor mask.
    pub fn deliver(&mut self, k: usize, dup: bool, flip: Option<(usize, u8)>, cut: usize) {
        if self.wire.is_empty() {
            return;
        }
        let k = k % self.wire.len();
        let (t, mut b) = if dup {
            self.wire[k].clone()
        } else {
            self.wire.remove(k)
        };
        if let Some((at, x)) = flip {
            let at = at % b.len();
            b[at] ^= x;
        }
        b.truncate(b.len().saturating_sub(cut));
        self.receive(&Self::meta(&t), &b);
    }

    /// A packet from the network, as the transport hands it over.
    pub fn receive(&mut self, meta: &RecvMeta, b: &[u8]) {
        self.device("packet", |r| {
            r.m.handle_packet(&r.mem, Instant(r.now), meta, b)
        });
    }

    pub fn loopback_meta(&self) -> RecvMeta {
        RecvMeta {
            src: self.gid,
            dst: self.gid,
            sport: 0xc000,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }
    }

    pub fn advance(&mut self, ns: u64) {
        self.now += ns;
        self.device("timeout", |r| r.m.handle_timeout(Instant(r.now)));
    }

    /// The guest reads up to `n` CQEs of CQ `i` and checks each.
    pub fn consume(&mut self, i: usize, n: usize) {
        let c = &self.cqs[i % NCQ];
        let (ring, tainted, cqn) = (c.ring, c.tainted, i % NCQ);
        let prod = self.load(ring.gpa + hdr::PRODUCER_INDEX) & (ring.slots - 1);
        let mut cons = self.load(ring.gpa + hdr::CONSUMER_INDEX) & (ring.slots - 1);
        let mut k = 0;
        while cons != prod && k < n {
            let mut b = [0u8; abi::CQE_SIZE];
            self.mem
                .read_slice(&mut b, GuestAddress(ring.slot(cons)))
                .unwrap();
            let w: abi::UverbsWc = abi::read_struct(&b).unwrap();
            if !tainted {
                self.check_cqe(cqn, &w);
            }
            cons = (cons + 1) & (ring.slots - 1);
            k += 1;
        }
        self.store(ring.gpa + hdr::CONSUMER_INDEX, cons);
    }

    fn check_cqe(&mut self, cq: usize, w: &abi::UverbsWc) {
        // The QP the device names.
        let Some(qi) = self.qps.iter().position(|q| q.alive && q.qpn == w.qp_num) else {
            // A QP destroyed since (its completion was written before), or a number the
            // guest's scribbles made up. A work request of ours completes here at most once;
            // one of an RQ only if its QP was destroyed (or the guest meddled), one of the SRQ
            // also if the destroyed QP had taken it.
            let srq_tainted = self.srq_tainted;
            if let Some(wr) = self.wrs.get_mut(&w.wr_id) {
                let meddled = self.qps[wr.qp].tainted || (wr.srq && srq_tainted);
                assert!(
                    meddled
                        || wr.state == WrState::Abandoned
                        || (wr.srq && wr.state == WrState::Outstanding),
                    "CQE {w:?} of wr {wr:?} under qpn {}, which is no live QP",
                    w.qp_num
                );
                wr.state = WrState::Done;
            }
            return;
        };
        if self.qps[qi].tainted {
            if let Some(wr) = self.wrs.get_mut(&w.wr_id) {
                wr.state = WrState::Done;
            }
            return;
        }
        let recv = w.opcode & 0x80 != 0;
        let reused = self.retired.get(&w.qp_num).copied();
        let Some(wr) = self.wrs.get_mut(&w.wr_id) else {
            // Unless an old QP of this number, which the guest meddled with, left it.
            assert!(
                reused == Some(true),
                "CQE {w:?} on intact qp {qi}: wr_id never posted"
            );
            return;
        };
        if wr.state == WrState::Abandoned {
            // Left by a destroyed QP (perhaps under the number this one has now): once.
            wr.state = WrState::Done;
            return;
        }
        let wr_qp = wr.qp;
        let srq_ok = wr.srq && self.qps[qi].srq && !self.srq_tainted;
        if wr.srq && self.srq_tainted {
            wr.state = WrState::Done;
            return;
        }
        assert!(
            wr_qp == qi || srq_ok,
            "CQE {w:?} on qp {qi} for a work request of qp {wr_qp}"
        );
        assert_eq!(wr.recv, recv, "CQE {w:?}: send/receive mix-up for {wr:?}");
        assert!(
            wr.state != WrState::Done,
            "CQE {w:?}: work request {wr:?} completed twice"
        );
        wr.state = WrState::Done;
        let q = &self.qps[qi];
        let want = if recv { q.recv_cq } else { q.send_cq };
        assert_eq!(cq, want, "CQE {w:?} of qp {qi} in the wrong CQ");
    }

    pub fn arm(&mut self, i: usize, solicited: bool) {
        let c = &self.cqs[i % NCQ];
        let w = if solicited {
            hdr::NOTIFY_SOLICITED
        } else {
            hdr::NOTIFY_NEXT_COMP
        };
        self.store(c.ring.gpa + hdr::CQ_NOTIFY, w);
        let cqn = c.cqn;
        self.doorbell(abi::doorbell::CQ, cqn);
    }

    /// RESIZE_CQ into the CQ's other area, of `slots` slots (2..=64).
    pub fn resize(&mut self, i: usize, slots_log2: u8, cqe: u32) {
        let i = i % NCQ;
        let slots = 1u32 << (1 + slots_log2 % 6);
        let area = 1 - self.cqs[i].area;
        let new = RingArea {
            gpa: Self::cq_area(i, area),
            pages: 2,
            slots,
            log2: 6,
        };
        // The guest sets up the new ring first (its own writes).
        let q = self.queue(Self::list_slot(12 + i as u64), &new);
        let cqn = self.cqs[i].cqn;
        let mut ok = false;
        self.extra = Some((new.gpa, new.gpa + new.len()));
        self.device("resize_cq", |r| {
            let c = abi::CmdResizeCq {
                cqn,
                cqe: cqe % 80,
                queue: q,
            };
            ok = r.ctrl(op::RESIZE_CQ, &c).is_ok();
            if ok {
                let cq = &mut r.cqs[i];
                cq.area = area;
                cq.ring = new;
            }
        });
        self.extra = None;
    }

    /// Moves QP `i` to `state` (RESET … ERR), or brings it up again from RESET.
    pub fn modify_state(&mut self, i: usize, state: u8) {
        let i = i % NQP;
        if !self.qps[i].alive {
            return;
        }
        match state % 4 {
            0 => {
                let a = abi::QpAttrs {
                    attr_mask: AttrMask::STATE,
                    qp_state: QpState::Err as u32,
                    ..Default::default()
                };
                self.device("modify to ERR", |r| {
                    r.modify(i, &a);
                });
            }
            1 => {
                // RESET forgets the QP's work requests without completions (and its rings'
                // indices start over): the rig treats the QP as the guest's mess from here.
                self.qps[i].tainted = true;
                let a = abi::QpAttrs {
                    attr_mask: AttrMask::STATE,
                    qp_state: QpState::Reset as u32,
                    ..Default::default()
                };
                self.device("modify to RESET", |r| {
                    r.modify(i, &a);
                });
                self.abandon(i);
            }
            2 => self.device("bring up", |r| r.bring_up(i)),
            _ => {
                let a = abi::QpAttrs {
                    attr_mask: AttrMask::STATE,
                    qp_state: QpState::Sqd as u32,
                    ..Default::default()
                };
                self.device("modify to SQD", |r| {
                    r.modify(i, &a);
                });
            }
        }
    }

    fn abandon(&mut self, i: usize) {
        for w in self.wrs.values_mut() {
            if w.qp == i && !w.srq && w.state == WrState::Outstanding {
                w.state = WrState::Abandoned;
            }
        }
    }

    /// Destroys QP `i` and creates it anew on fresh rings, brought up to RTS.
    pub fn churn(&mut self, i: usize) {
        let i = i % NQP;
        if self.qps[i].alive {
            let qpn = self.qps[i].qpn;
            let h = abi::Handle {
                handle: qpn,
                reserved: 0,
            };
            self.device("destroy_qp", |r| {
                r.ctrl(op::DESTROY_QP, &h).expect("destroy a live QP");
            });
            self.qps[i].alive = false;
            let t = self.qps[i].tainted;
            *self.retired.entry(qpn).or_default() |= t;
            self.abandon(i);
        }
        self.create_qp(i);
        self.device("bring up", |r| r.bring_up(i));
    }

    /// The end of a run: every QP still intact to ERR and drained, its work requests all
    /// completed once; then every object destroyed and the page-list budget back to zero.
    pub fn finish(&mut self) {
        // One QP at a time, the CQs read in between, so that the flushes fit the rings.
        for i in 0..NQP {
            if self.qps[i].alive {
                self.modify_state(i, 0);
            }
            for _ in 0..4 {
                self.pump(1024);
                for c in 0..NCQ {
                    self.consume(c, 64);
                }
            }
        }
        // A CQ that overflowed lost completions (rxe drops them the same way), and a ring
        // that faulted put its QP in error without them: then only "at most once" holds.
        let clean = self.m.stats().cq_overflows == 0 && self.m.stats().ring_faults == 0;
        if clean && !self.broken {
            let mut ids: Vec<_> = self.wrs.iter().collect();
            ids.sort_by_key(|(id, _)| **id);
            let left: Vec<(u64, Wr)> = ids
                .iter()
                .filter(|(_, w)| w.state == WrState::Outstanding)
                .map(|(id, w)| (**id, **w))
                .collect();
            for (id, w) in ids {
                let q = &self.qps[w.qp];
                let intact = q.alive
                    && !q.tainted
                    && !self.cqs[if w.recv { q.recv_cq } else { q.send_cq }].tainted;
                // SRQ receives belong to the SRQ, which a QP in ERR does not flush.
                if intact && !w.srq {
                    assert!(
                        w.state != WrState::Outstanding,
                        "work request {id:#x} {w:?} never completed (qp {:#x} state {:?}; \
                         SQ prod/cons {}/{}, RQ prod/cons {}/{}; {:?}; outstanding: {left:x?})",
                        q.qpn,
                        self.m.with_qp_dev(q.qpn, |d| d
                            .query_qp(rxe_core::Qpn(q.qpn))
                            .map(|a| a.0.qp_state)),
                        self.load(q.sq.gpa + hdr::PRODUCER_INDEX),
                        self.load(q.sq.gpa + hdr::CONSUMER_INDEX),
                        self.load(q.rq.gpa + hdr::PRODUCER_INDEX),
                        self.load(q.rq.gpa + hdr::CONSUMER_INDEX),
                        self.m.stats()
                    );
                }
            }
        }
        // Tear everything down: the budget must come back to zero.
        for i in 0..NQP {
            if self.qps[i].alive {
                let h = abi::Handle {
                    handle: self.qps[i].qpn,
                    reserved: 0,
                };
                self.ctrl(op::DESTROY_QP, &h).expect("destroy qp");
                self.qps[i].alive = false;
            }
        }
        let h = abi::Handle {
            handle: self.srqn,
            reserved: 0,
        };
        self.ctrl(op::DESTROY_SRQ, &h).expect("destroy srq");
        for k in [self.mr_rw.0, self.mr_ro.0] {
            let h = abi::Handle {
                handle: k,
                reserved: 0,
            };
            self.ctrl(op::DEREG_MR, &h).expect("dereg mr");
        }
        for i in 0..NCQ {
            let h = abi::Handle {
                handle: self.cqs[i].cqn,
                reserved: 0,
            };
            self.ctrl(op::DESTROY_CQ, &h).expect("destroy cq");
        }
        assert_eq!(self.m.object_counts(), (0, 0, 0), "objects left");
        assert_eq!(
            self.m.page_lists().used,
            0,
            "page-list bytes still charged with every object gone"
        );
    }

    /// Real traffic on every QP, pumped onto the wire (not delivered).
    pub fn prologue(&mut self) {
        let r = self;
        for k in 0..4u16 {
            let _ = r.post_recv(1, &mut Input(&recv_args(0x4000 + k * 0x400, 0x400)));
            let _ = r.post_recv(0, &mut Input(&recv_args(0x5000 + k * 0x400, 0x400)));
            let _ = r.post_recv(3, &mut Input(&recv_args(0x6000 + k * 0x400, 0x400)));
            let _ = r.post_recv(5, &mut Input(&recv_args(0x7000 + k * 0x100, 0x100)));
        }
        let srqn = r.srqn();
        r.doorbell(abi::doorbell::SRQ, srqn);
        // SEND, SEND_IMM, WRITE, WRITE_IMM, READ, FETCH_ADD, CMP_SWP, ATOMIC_WRITE.
        for (i, kind) in [0u8, 3, 4, 5, 6, 7, 8, 9].into_iter().enumerate() {
            let len = if kind >= 7 {
                8
            } else {
                0x180 + 0x40 * i as u16
            };
            let _ = r.post_send(0, &mut Input(&send_args(kind, 0x100 * i as u16, len)));
        }
        for kind in [0u8, 6] {
            let _ = r.post_send(1, &mut Input(&send_args(kind, 0x1000, 0x200)));
        }
        for kind in [0u8, 3, 4] {
            let _ = r.post_send(2, &mut Input(&send_args(kind, 0x1800, 0x200)));
        }
        let _ = r.post_send(4, &mut Input(&send_args(0, 0x1c00, 0xc0)));
        for q in [0, 1, 2, 4] {
            let qpn = r.qpn(q);
            r.doorbell(abi::doorbell::SQ, qpn);
        }
        r.pump(1024);
        // What the mutations start from: the first packet of every message above (a rig that
        // sends nothing would make every run pass).
        assert!(r.wire.len() >= 12, "{} packets on the wire", r.wire.len());
    }

    /// One operation from the input; false at its end.
    pub fn step(&mut self, inp: &mut Input) -> bool {
        if inp.is_empty() {
            return false;
        }
        let op = inp.u8();
        let arg = inp.u8() as usize;
        match op % 16 {
            0 | 1 => {
                let _ = self.post_send(arg % NQP, inp);
                if op & 0x10 != 0 {
                    let qpn = self.qpn(arg);
                    self.doorbell(abi::doorbell::SQ, qpn);
                }
            }
            2 => {
                let _ = self.post_recv(arg % NQP, inp);
                if op & 0x10 != 0 {
                    let (kind, obj) = if self.qps[arg % NQP].srq {
                        (abi::doorbell::SRQ, self.srqn)
                    } else {
                        (abi::doorbell::RQ, self.qpn(arg))
                    };
                    self.doorbell(kind, obj);
                }
            }
            3 => {
                // A doorbell for any object, or for a number that names none.
                let kind = 1 + (arg as u32 % 5);
                let obj = match op >> 4 {
                    0..=4 => self.qpn(arg),
                    5..=9 => self.cqn(arg),
                    10..=12 => self.srqn,
                    _ => inp.u32(),
                };
                self.doorbell(kind, obj);
            }
            4 | 5 => self.pump([1, 4, 64, 1024][arg % 4]),
            6..=8 => {
                let dup = op & 0x10 != 0;
                let flip = (op & 0x20 != 0).then(|| (inp.u16() as usize, inp.u8() | 1));
                let cut = if op & 0x40 != 0 {
                    inp.u8() as usize % 64
                } else {
                    0
                };
                self.deliver(arg, dup, flip, cut);
            }
            9 => self.advance(1 << (arg % 32)),
            10 => self.consume(arg, 1 + (op as usize >> 4)),
            11 => self.arm(arg, op & 0x10 != 0),
            12 => {
                let cqe = inp.u8() as u32;
                self.resize(arg, op >> 4, cqe);
            }
            13 => {
                let n = 1 + (inp.u8() as usize % 16);
                let data = inp.bytes(n);
                let off = inp.u16();
                self.scribble(arg as u8, off, &data);
            }
            14 => self.modify_state(arg, op >> 4),
            _ => {
                if op & 0x10 != 0 {
                    self.churn(arg);
                } else {
                    // A packet of the input's own, to one of the QPs.
                    let n = 12 + inp.u8() as usize;
                    let mut b = inp.bytes(n);
                    if b.len() >= 12 {
                        let q = self.qpn(arg).to_be_bytes();
                        b[5..8].copy_from_slice(&q[1..4]);
                    }
                    let meta = self.loopback_meta();
                    self.receive(&meta, &b);
                }
            }
        }
        true
    }
}

/// Bytes for `Rig::post_send`: opcode kind `kind`, one SGE of `len` bytes at `off`.
pub fn send_args(kind: u8, off: u16, len: u16) -> Vec<u8> {
    let mut v = vec![kind, 1, 2, 3, 4]; // kind, ex
    v.extend((0x800u16 + off).to_le_bytes()); // remote offset in the writable MR
    v.push(0); // its key
    if kind == 7 || kind == 8 {
        v.extend([5, 0, 0, 0, 6, 0, 0, 0]); // add / compare, swap
    }
    v.extend([1, 0]); // one SGE, into the writable MR
    v.extend(off.to_le_bytes());
    v.extend(len.to_le_bytes());
    v
}

pub fn recv_args(off: u16, len: u16) -> Vec<u8> {
    let mut v = vec![0, 0];
    v.extend(off.to_le_bytes());
    v.extend(len.to_le_bytes());
    v
}

/// Runs a whole input: setup, at most `max_ops` operations, the end-of-run checks.
pub fn run(data: &[u8], max_ops: usize) {
    let mut r = Rig::new();
    let mut inp = Input(data);
    for _ in 0..max_ops {
        if !r.step(&mut inp) {
            break;
        }
    }
    r.finish();
}

/// Runs a whole input of the rx_place target: the prologue's traffic on the wire, then at
/// most `max_ops` deliveries (mutated), pumps, timers, CQ reads and rig operations.
pub fn run_rx(data: &[u8], max_ops: usize) {
    let mut r = Rig::new();
    r.prologue();
    let mut inp = Input(data);
    for _ in 0..max_ops {
        if inp.is_empty() {
            break;
        }
        let op = inp.u8();
        match op % 8 {
            0..=3 => {
                if r.wire.is_empty() {
                    continue;
                }
                let k = inp.u8() as usize % r.wire.len();
                let (t, mut b) = if op & 0x80 != 0 {
                    r.wire[k].clone()
                } else {
                    r.wire.remove(k)
                };
                for _ in 0..(op >> 4) & 3 {
                    let at = inp.u16() as usize % b.len();
                    b[at] ^= inp.u8();
                }
                if op & 0x40 != 0 {
                    // A 32-bit field of the input's choosing, big-endian as on the wire.
                    let at = inp.u8() as usize % b.len().saturating_sub(3).max(1);
                    let v = inp.u32().to_be_bytes();
                    let n = (b.len() - at).min(4);
                    b[at..at + n].copy_from_slice(&v[..n]);
                }
                if op & 0x08 != 0 {
                    let cut = inp.u8() as usize;
                    if cut & 0x80 != 0 {
                        b.extend(inp.bytes(cut & 0x3f));
                    } else {
                        b.truncate(b.len().saturating_sub(cut));
                    }
                }
                r.receive(&Rig::meta(&t), &b);
            }
            4 => r.pump([1, 16, 1024][inp.u8() as usize % 3]),
            5 => r.advance(1 << (inp.u8() % 32)),
            6 => r.consume(inp.u8() as usize, 1 + (op as usize >> 3)),
            _ => {
                // More traffic from the input (rig::Rig::step's operations).
                r.step(&mut inp);
            }
        }
    }
    r.finish();
}
