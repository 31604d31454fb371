//! The requester (Linux `rxe_req.c`): turns send WQEs into request packets — segmentation by
//! path MTU, AckReq every 64 packets and at the end of a message, the READ/atomic window,
//! fences, and local operations (fast-reg, invalidate, MW bind) executed in order.

use crate::icrc::{rc_udp_sport, ud_udp_sport};
use crate::mem::*;
use crate::qp::*;
use crate::shared::{Resources, Transmit};
use crate::types::{Gid, Instant, Psn};
use crate::verbs::*;
use crate::wire::{self, BthRepr, ExtRepr, Opcode};

/// Validates and queues a send WR. QPs in ERR complete it at once with a flush error.
/// Queues a work request that already failed (the backend could not decode it): it completes
/// with `status` in send-queue order and the QP moves to ERR, as a local QP operation error does.
pub(crate) fn post_failed(
    q: &mut Qp,
    res: &mut Resources,
    wr_id: u64,
    opcode: WcOpcode,
    status: WcStatus,
) -> Result<(), VerbError> {
    if matches!(q.state(), QpState::Reset | QpState::Init | QpState::Rtr) {
        return Err(VerbError::BadState);
    }
    q.sq.push_back(SendWqe::done(wr_id, opcode, status, 0, true));
    q.counters.errors += 1;
    crate::complete::set_error(q, res);
    crate::complete::drain(q, res);
    Ok(())
}

#[inline]
pub(crate) fn post_send(q: &mut Qp, res: &mut Resources, wr: SendWr) -> Result<(), VerbError> {
    if matches!(q.qp_type, QpType::XrcTgt | QpType::RawPacket) {
        // A responder alone has no send queue; a raw packet QP's frames are sent by
        // `Device::raw_send`, not queued.
        return Err(VerbError::Invalid);
    }
    match q.state() {
        QpState::Reset | QpState::Init | QpState::Rtr => return Err(VerbError::BadState),
        _ => {}
    }
    if q.sq.len() as u32 >= q.cap.max_send_wr {
        return Err(VerbError::NoResources);
    }
    let inline = wr.flags & SEND_INLINE != 0;
    if wr.sg_list.len() as u32 > q.cap.max_send_sge {
        return Err(VerbError::Invalid);
    }
    if inline && wr.inline_data.len() as u32 > q.cap.max_inline_data {
        return Err(VerbError::Invalid);
    }
    let ud = matches!(q.qp_type, QpType::Ud | QpType::Gsi);
    let ok_for_type = match (&wr.op, q.qp_type) {
        (SendOp::Send | SendOp::SendWithImm(_), _) => true,
        (_, QpType::Ud | QpType::Gsi) => false,
        (SendOp::Write { .. } | SendOp::WriteWithImm { .. }, _) => true,
        (SendOp::LocalInv { .. } | SendOp::RegMr { .. } | SendOp::BindMw { .. }, _) => true,
        (_, QpType::Uc) => false,
        // XRC has no FLUSH or ATOMIC_WRITE opcodes.
        (SendOp::Flush { .. } | SendOp::AtomicWrite { .. }, QpType::XrcIni) => false,
        _ => true,
    };
    if !ok_for_type || (ud && wr.ud.is_none()) {
        return Err(VerbError::Invalid);
    }
    // An XRC INI message names the remote XRC SRQ (24 bits); no other QP's does.
    let xrc = q.qp_type == QpType::XrcIni;
    let needs_srqn = xrc && !wr.op.is_local();
    match wr.xrc_remote_srqn {
        Some(n) if needs_srqn && n <= 0xff_ffff => {}
        None if !needs_srqn => {}
        _ => return Err(VerbError::Invalid),
    }
    let len = match &wr.op {
        // A FLUSH carries no data (IBTA oA19-2): its SGEs, if any, are not looked at, and its
        // length is what the completion reports (rxe's `dma.length`).
        SendOp::Flush { len, .. } => *len as u64,
        _ if inline => wr.inline_data.len() as u64,
        _ => sge_total(&wr.sg_list),
    };
    let mtu = if ud {
        res.cfg.port_mtu.bytes()
    } else {
        q.mtu()
    };
    match &wr.op {
        // Its length goes into the RETH as it is: the responder judges it (C9-94), as rxe's.
        SendOp::Flush { .. } => {}
        _ if len > 1 << 31 => return Err(VerbError::Invalid),
        SendOp::Send | SendOp::SendWithImm(_) if ud && len > mtu as u64 => {
            return Err(VerbError::Invalid)
        }
        SendOp::CompSwap { remote_addr, .. }
        | SendOp::FetchAdd { remote_addr, .. }
        | SendOp::AtomicWrite { remote_addr, .. }
            if remote_addr & 7 != 0 || len != 8 =>
        {
            return Err(VerbError::Invalid)
        }
        _ => {}
    }
    if let Some(u) = &wr.ud {
        if res.gid(u.av.sgid_index).is_none() {
            return Err(VerbError::Invalid);
        }
    }
    let signaled = q.sq_sig_all || wr.flags & SEND_SIGNALED != 0;
    let flushed = q.state() == QpState::Err;
    q.reg_mr_list_bytes += wr.op.page_list_bytes();
    let wc_opcode = wr.op.wc_opcode();
    q.sq.push_back(SendWqe {
        wc_opcode,
        wr,
        state: if flushed {
            WqeState::Done(WcStatus::WrFlushErr)
        } else {
            WqeState::Posted
        },
        first_psn: Psn::default(),
        last_psn: Psn::default(),
        len: len as u32,
        signaled,
        read_done: 0,
    });
    if flushed {
        crate::complete::drain(q, res);
    }
    Ok(())
}

/// Binds an MW to an MR range (the checks of IBTA 10.6.7 / `rxe_mw.c`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn bind_mw(
    keys: &mut KeyTable,
    pd: u32,
    qpn: u32,
    mw_rkey: u32,
    new_rkey: u32,
    mr_lkey: u32,
    addr: u64,
    length: u64,
    access: Access,
    expect: Option<MwType>,
) -> Result<(), WcStatus> {
    // The MW is named by index; its variant byte is what the bind changes.
    let (mw_type, mw_pd, mw_state, old_mr) = match keys.get_by_index(mw_rkey) {
        Some((KeyObj::Mw(mw), k)) if (*k == mw_rkey as u8 || mw.mw_type == MwType::Type2) => {
            (mw.mw_type, mw.pd, mw.state, mw.mr_key)
        }
        _ => return Err(WcStatus::MwBindErr),
    };
    if expect.is_some_and(|e| e != mw_type) || mw_pd != pd {
        return Err(WcStatus::MwBindErr);
    }
    if mw_type == MwType::Type2 && mw_state == KeyState::Valid {
        return Err(WcStatus::MwBindErr);
    }
    if new_rkey >> 8 != mw_rkey >> 8 {
        return Err(WcStatus::MwBindErr);
    }
    if access.0 & !(Access::REMOTE.0 | Access::ZERO_BASED.0) != 0 {
        return Err(WcStatus::MwBindErr);
    }
    // Zero length binds (type 1) just invalidate.
    if length > 0 {
        match keys.get(mr_lkey) {
            Some(KeyObj::Mr(mr)) => {
                if mr.pd != pd
                    || mr.state != KeyState::Valid
                    || !mr.access.contains(Access::MW_BIND)
                {
                    return Err(WcStatus::MwBindErr);
                }
                // Remote write/atomic through a window need local write on the MR.
                if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
                    && !mr.access.contains(Access::LOCAL_WRITE)
                {
                    return Err(WcStatus::MwBindErr);
                }
                let end = addr.checked_add(length).ok_or(WcStatus::MwBindErr)?;
                if mr.kind != MrKind::Dma
                    && (addr < mr.iova || end > mr.iova.saturating_add(mr.length))
                {
                    return Err(WcStatus::MwBindErr);
                }
            }
            _ => return Err(WcStatus::MwBindErr),
        }
    }
    if mw_state == KeyState::Valid {
        if let Some(KeyObj::Mr(mr)) = keys.get_mut(old_mr) {
            mr.bound_mws = mr.bound_mws.saturating_sub(1);
        }
    }
    if length > 0 {
        if let Some(KeyObj::Mr(mr)) = keys.get_mut(mr_lkey) {
            mr.bound_mws += 1;
        }
    }
    if let Some((KeyObj::Mw(mw), k)) = keys.get_by_index(mw_rkey) {
        *k = new_rkey as u8;
        mw.state = if length > 0 {
            KeyState::Valid
        } else {
            KeyState::Free
        };
        mw.mr_key = mr_lkey;
        mw.addr = addr;
        mw.length = length;
        mw.access = access;
        mw.qpn = qpn;
    }
    Ok(())
}

fn local_op(q: &Qp, res: &mut Resources, op: SendOp) -> WcStatus {
    let r = match op {
        SendOp::LocalInv { rkey } => res
            .objs_mut()
            .keys
            .invalidate(q.pd, rkey, Some(q.qpn.0))
            .map_err(|_| WcStatus::LocQpOpErr),
        SendOp::RegMr {
            lkey,
            key,
            access,
            iova,
            length,
            page_shift,
            page_offset,
            pages,
        } => {
            let pd = q.pd;
            let max = res.cfg.max_registered_bytes;
            let mut guard = res.objs_mut();
            let o = &mut *guard;
            let used = o.registered_bytes;
            match o.keys.get_by_index(lkey) {
                Some((KeyObj::Mr(mr), k)) if mr.pd == pd && mr.state == KeyState::Free => {
                    // A fast-registration MR holds the registered-bytes budget for the length
                    // it maps last (until it maps another or is deregistered), as a user MR
                    // does for its own: a mapping beyond the budget fails.
                    let fits = (used - mr.length)
                        .checked_add(length)
                        .is_some_and(|t| t <= max);
                    match mr.kind {
                        MrKind::FastReg { max_pages }
                            if pages.len() as u32 <= max_pages
                                && iova.checked_add(length).is_some()
                                && check_page_list(page_offset, length, page_shift, &pages)
                                    .is_ok()
                                && access.0 & !Access::ALL.0 == 0
                                && fits =>
                        {
                            o.registered_bytes = used - mr.length + length;
                            *k = key as u8;
                            mr.iova = iova;
                            mr.length = length;
                            mr.access = access;
                            mr.backing = Backing::Pages {
                                page_shift,
                                page_offset,
                                pages,
                            };
                            mr.state = KeyState::Valid;
                            Ok(())
                        }
                        _ => Err(WcStatus::LocQpOpErr),
                    }
                }
                _ => Err(WcStatus::LocQpOpErr),
            }
        }
        SendOp::BindMw {
            mw_rkey,
            new_rkey,
            mr_lkey,
            addr,
            length,
            access,
        } => bind_mw(
            &mut res.objs_mut().keys,
            q.pd,
            q.qpn.0,
            mw_rkey,
            new_rkey,
            mr_lkey,
            addr,
            length,
            access,
            // librxe binds both types with a BIND_MW work request.
            None,
        ),
        _ => Ok(()),
    };
    match r {
        Ok(()) => WcStatus::Success,
        Err(s) => s,
    }
}

/// Builds the next request packet of `q` into `buf`.
pub(crate) fn next_request(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    now: Instant,
    buf: &mut [u8],
    in_memory: &dyn Fn(&Gid) -> bool,
) -> Option<Transmit> {
    loop {
        let st = q.state();
        let mid_message = q.req.offset != 0;
        if !(st == QpState::Rts || (st == QpState::Sqd && mid_message))
            || q.req.rnr_until.is_some()
            || q.req.odp_wait
        {
            return None;
        }
        if q.req.cur < q.sq_head {
            q.req.cur = q.sq_head;
            q.req.offset = 0;
        }
        let cur = q.req.cur;
        let wqe = q.wqe(cur)?;
        if let WqeState::Done(_) = wqe.state {
            q.req.cur += 1;
            continue;
        }
        let rc = q.qp_type.is_rc_requester();
        if wqe.wr.flags & SEND_FENCE != 0 && q.req.rd_atomic > 0 {
            return None;
        }
        if wqe.wr.op.is_local() {
            // A REG_MR's page list moves from the WQE to the MR (no copy); what stays in the
            // WQE is only looked at for its kind.
            let w = q.wqe_mut(cur).expect("wqe present");
            let pages = match &mut w.wr.op {
                SendOp::RegMr { pages, .. } => core::mem::take(pages),
                _ => Vec::new(),
            };
            let mut op = w.wr.op.clone();
            q.reg_mr_list_bytes = q.reg_mr_list_bytes.saturating_sub(pages.len() as u64 * 8);
            if let SendOp::RegMr { pages: p, .. } = &mut op {
                *p = pages;
            }
            let status = local_op(q, res, op);
            let w = q.wqe_mut(cur).expect("wqe present");
            w.state = WqeState::Done(status);
            q.req.cur += 1;
            if status != WcStatus::Success {
                crate::complete::set_error(q, res);
                return None;
            }
            continue;
        }
        let rd_atomic = wqe.wr.op.is_read_or_atomic();
        if rc && rd_atomic && q.req.offset == 0 && q.req.rd_atomic >= q.attr.max_rd_atomic as u32 {
            return None;
        }
        let next_psn = if wqe.state == WqeState::Posted {
            q.req.max_psn
        } else {
            q.req.psn
        };
        if rc && next_psn.diff(q.comp.psn) >= MAX_UNACKED_PSNS {
            return None;
        }
        return build(q, res, mem, now, cur, buf, in_memory);
    }
}

/// What [`build`] decided for the packet it sends.
struct Plan {
    seq: u64,
    op: Opcode,
    psn: Psn,
    /// Where in the message the packet starts (for READ: the response data not yet received).
    offset: u32,
    /// The message's length.
    len: u32,
    /// Payload bytes the packet carries.
    payload: u32,
    /// The PSNs the packet stands for (a READ request: its responses').
    npsn: u32,
    last: bool,
    mtu: u32,
}

fn build(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    now: Instant,
    seq: u64,
    buf: &mut [u8],
    in_memory: &dyn Fn(&Gid) -> bool,
) -> Option<Transmit> {
    let mut ext = ExtRepr::default();
    let p = plan(q, res, seq, buf.len(), in_memory, &mut ext)?;
    let wqe = q.wqe(seq)?;
    let (dest_qp, sport, av) = destination(q, wqe, &mut ext);
    let wr_flags = wqe.wr.flags;
    let end = p.last || p.npsn > 1 || p.op.flags().contains(crate::wire::OpFlags::LAST);
    let noack_pkts = q.req.noack_pkts;
    let ack_req = ack_req(q, p.payload, p.mtu, end);
    let bth = BthRepr {
        solicited: end && wr_flags & SEND_SOLICITED != 0,
        ..BthRepr::new(p.op, dest_qp, p.psn.get(), ack_req)
    };
    let (total, range) = wire::emit(buf, &bth, &ext, p.payload as usize).ok()?;
    if p.payload > 0 && copy_payload(q, res, mem, &p, &mut buf[range]).is_none() {
        // Nothing was sent: the packet is built again the same way later.
        q.req.noack_pkts = noack_pkts;
        return None;
    }
    let src = res.gid(av.sgid_index)?;
    advance(q, res, now, &p);
    Some(Transmit {
        len: total,
        src,
        dst: av.dgid,
        sport,
        traffic_class: av.traffic_class,
        hop_limit: if av.hop_limit == 0 { 64 } else { av.hop_limit },
        flow_label: av.flow_label,
        dmac: av.dmac,
        qpn: q.qpn,
    })
}

/// The next packet of WQE `seq`: its PSN, where in the message it starts, how much it
/// carries, and its opcode with the header extensions in `ext`.
#[inline]
fn plan(
    q: &Qp,
    res: &Resources,
    seq: u64,
    buf_len: usize,
    in_memory: &dyn Fn(&Gid) -> bool,
    ext: &mut ExtRepr,
) -> Option<Plan> {
    let ud = matches!(q.qp_type, QpType::Ud | QpType::Gsi);
    let mtu = if ud {
        res.cfg.port_mtu.bytes()
    } else {
        q.mtu()
    };
    let base = match q.qp_type {
        QpType::Rc => 0x00,
        QpType::Uc => 0x20,
        QpType::XrcIni => Opcode::XRC_BASE,
        _ => 0x60,
    };
    let wqe = q.wqe(seq)?;
    // A message sent before keeps its PSNs: a resend starts from the packet at `offset`
    // (for READ: from the first response not yet received). New messages take fresh PSNs.
    let (psn, offset) = match (wqe.state, &wqe.wr.op) {
        (WqeState::Pending, SendOp::Read { .. }) => {
            (wqe.first_psn.add(wqe.read_done / mtu), wqe.read_done)
        }
        (WqeState::Pending, _) => (wqe.first_psn.add(q.req.offset / mtu), q.req.offset),
        _ => (q.req.max_psn, 0),
    };
    let len = wqe.len;
    let remaining = len - offset.min(len);
    // A packet carries one path MTU of payload; a segment to a device reached in memory
    // carries several, and takes the PSNs of the packets it stands for.
    let seg = if q.qp_type == QpType::Rc && remaining > mtu && in_memory(&q.attr.av.dgid) {
        crate::shared::segment_payload(buf_len, mtu)
    } else {
        mtu
    };
    let last = remaining <= seg;
    let at = Position::of(offset == 0, last);
    let (op, payload, npsn) = opcode(wqe, at, offset, remaining.min(seg), mtu, ext)?;
    ext.xrc_srqn = wqe.wr.xrc_remote_srqn.unwrap_or(0);
    // ONLY opcodes of UD are SEND_ONLY (0x64) / SEND_ONLY_WITH_IMMEDIATE (0x65).
    let op = if op.0 < 0x1c {
        op.with_transport(base)
    } else {
        op
    };
    Some(Plan {
        seq,
        op,
        psn,
        offset,
        len,
        payload,
        npsn,
        last,
        mtu,
    })
}

/// A packet's place in its message, which picks its opcode from a [`Positions`] row.
#[derive(Clone, Copy)]
enum Position {
    First = 0,
    Middle = 1,
    Last = 2,
    Only = 3,
}

impl Position {
    #[inline]
    fn of(first: bool, last: bool) -> Position {
        match (first, last) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, false) => Position::Middle,
            (false, true) => Position::Last,
        }
    }
}

/// The RC opcodes of a multi-packet operation by [`Position`] (IBTA table 38); UC and UD take
/// the same operation in their class.
type Positions = [Opcode; 4];

use Opcode as O;
const SEND: Positions = [
    O::RC_SEND_FIRST,
    O::RC_SEND_MIDDLE,
    O::RC_SEND_LAST,
    O::RC_SEND_ONLY,
];
const SEND_IMM: Positions = [
    O::RC_SEND_FIRST,
    O::RC_SEND_MIDDLE,
    O::RC_SEND_LAST_WITH_IMMEDIATE,
    O::RC_SEND_ONLY_WITH_IMMEDIATE,
];
const SEND_INV: Positions = [
    O::RC_SEND_FIRST,
    O::RC_SEND_MIDDLE,
    O::RC_SEND_LAST_WITH_INVALIDATE,
    O::RC_SEND_ONLY_WITH_INVALIDATE,
];
const WRITE: Positions = [
    O::RC_RDMA_WRITE_FIRST,
    O::RC_RDMA_WRITE_MIDDLE,
    O::RC_RDMA_WRITE_LAST,
    O::RC_RDMA_WRITE_ONLY,
];
const WRITE_IMM: Positions = [
    O::RC_RDMA_WRITE_FIRST,
    O::RC_RDMA_WRITE_MIDDLE,
    O::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE,
    O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
];

/// The RC opcode of a packet of `wqe` at `at`, the payload bytes it carries (of `plen` the
/// window allows) and the PSNs it stands for; its header extensions go into `ext`. None for
/// an operation that sends no packet.
#[inline]
fn opcode(
    wqe: &SendWqe,
    at: Position,
    offset: u32,
    plen: u32,
    mtu: u32,
    ext: &mut ExtRepr,
) -> Option<(Opcode, u32, u32)> {
    let len = wqe.len;
    let remaining = len - offset.min(len);
    let sel = |row: Positions| row[at as usize];
    Some(match &wqe.wr.op {
        SendOp::Send => (sel(SEND), plen, 1),
        SendOp::SendWithImm(imm) => {
            ext.imm = *imm;
            (sel(SEND_IMM), plen, 1)
        }
        SendOp::SendWithInv(rkey) => {
            ext.ieth = *rkey;
            (sel(SEND_INV), plen, 1)
        }
        SendOp::Write { remote_addr, rkey } => {
            ext.reth = (*remote_addr, *rkey, len);
            (sel(WRITE), plen, 1)
        }
        SendOp::WriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            ext.reth = (*remote_addr, *rkey, len);
            ext.imm = *imm;
            (sel(WRITE_IMM), plen, 1)
        }
        SendOp::Read { remote_addr, rkey } => {
            // A retried READ asks only for what has not arrived yet.
            ext.reth = (remote_addr.wrapping_add(offset as u64), *rkey, remaining);
            (O::RC_RDMA_READ_REQUEST, 0, remaining.div_ceil(mtu).max(1))
        }
        SendOp::CompSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            ext.atomic = (*remote_addr, *rkey, *swap, *compare);
            (O::RC_COMPARE_SWAP, 0, 1)
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            ext.atomic = (*remote_addr, *rkey, *add, 0);
            (O::RC_FETCH_ADD, 0, 1)
        }
        SendOp::AtomicWrite { remote_addr, rkey } => {
            ext.reth = (*remote_addr, *rkey, 8);
            (O::RC_ATOMIC_WRITE, 8, 1)
        }
        SendOp::Flush {
            remote_addr,
            rkey,
            len,
            selectivity,
            placement,
        } => {
            ext.reth = (*remote_addr, *rkey, *len);
            ext.feth = (*selectivity, *placement);
            (O::RC_FLUSH, 0, 1)
        }
        _ => return None,
    })
}

/// Where the packet goes: the destination QP, UDP source port and address vector of the QP,
/// or for UD those of the work request (and its DETH in `ext`).
#[inline]
fn destination(q: &Qp, wqe: &SendWqe, ext: &mut ExtRepr) -> (u32, u16, Av) {
    let ud = matches!(q.qp_type, QpType::Ud | QpType::Gsi);
    match &wqe.wr.ud {
        Some(u) if ud => {
            // As rxe: the GSI QP always sends the GSI Q_Key; others send the WR's Q_Key as given
            // (rxe does not apply the IBTA "controlled Q_Key" high-bit rule).
            let qkey = if q.qp_type == QpType::Gsi {
                GSI_QKEY
            } else {
                u.remote_qkey
            };
            ext.deth = (qkey, q.qpn.0);
            (u.remote_qpn.0, ud_udp_sport(q.qpn.0), u.av)
        }
        _ => (
            q.attr.dest_qp_num,
            rc_udp_sport(q.attr.av.flow_label, q.qpn.0, q.attr.dest_qp_num),
            q.attr.av,
        ),
    }
}

/// AckReq: RC asks for an ACK at the end of a message and at least every
/// [`MAX_PKT_PER_ACK`] packets.
#[inline]
fn ack_req(q: &mut Qp, payload: u32, mtu: u32, end: bool) -> bool {
    q.qp_type.is_rc_requester() && {
        // Counted in PSNs: a segment asks for its ACK as the packets it stands for would,
        // so a message larger than the window of unacknowledged PSNs keeps moving.
        q.req.noack_pkts += payload.div_ceil(mtu).max(1);
        if q.req.noack_pkts > MAX_PKT_PER_ACK || end {
            q.req.noack_pkts = 0;
            true
        } else {
            false
        }
    }
}

/// Copies the packet's payload from the WQE's inline data or its SGEs into `dst`; a bad SGE
/// fails the WQE with LOC_PROT_ERR and moves the QP to ERR. A page of an on-demand-paging
/// MR not mapped stops the requester until it is (nothing is sent, nothing fails).
#[inline]
fn copy_payload(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    p: &Plan,
    dst: &mut [u8],
) -> Option<()> {
    let wqe = q.wqe(p.seq)?;
    let copy = if wqe.wr.flags & SEND_INLINE != 0 {
        wqe.wr
            .inline_data
            .get(p.offset as usize..(p.offset + p.payload) as usize)
            .map(|s| dst.copy_from_slice(s))
            .ok_or(MemError::Length)
    } else {
        copy_from_sges(
            &res.objs().keys,
            mem,
            q.pd,
            &wqe.wr.sg_list,
            p.offset as u64,
            dst,
        )
    };
    if let Err(MemError::NotPresent(f)) = copy {
        res.page_fault(q.qpn, f);
        q.req.odp_wait = true;
        return None;
    }
    if copy.is_err() {
        let w = q.wqe_mut(p.seq).expect("wqe present");
        w.state = WqeState::Done(WcStatus::LocProtErr);
        crate::complete::set_error(q, res);
        return None;
    }
    Some(())
}

/// The bookkeeping after a packet is built: the message's PSN range, the next PSN, the next
/// packet or WQE, the READ/atomic window and the retransmission timer.
#[inline]
fn advance(q: &mut Qp, res: &mut Resources, now: Instant, p: &Plan) {
    let rc = q.qp_type.is_rc_requester();
    let w = q.wqe_mut(p.seq).expect("wqe present");
    if w.state == WqeState::Posted {
        // The PSN range of the whole message is fixed when its first packet goes out; a
        // retransmission reuses it.
        let pkts = match w.wr.op {
            SendOp::Read { .. } => p.npsn,
            SendOp::Send
            | SendOp::SendWithImm(_)
            | SendOp::SendWithInv(_)
            | SendOp::Write { .. }
            | SendOp::WriteWithImm { .. } => p.len.div_ceil(p.mtu).max(1),
            _ => 1,
        };
        w.first_psn = p.psn;
        w.last_psn = p.psn.add(pkts - 1);
        w.state = WqeState::Pending;
    }
    let is_rd_atomic = w.wr.op.is_read_or_atomic();
    let done = p.last || p.npsn > 1 || is_rd_atomic;
    if done && !rc {
        // UC and UD complete once the last packet is out.
        w.state = WqeState::Done(WcStatus::Success);
    }
    // A segment (payload over one path MTU) stands for as many packets.
    let npsn = if p.payload > p.mtu {
        res.port.tx_segments += 1;
        p.payload.div_ceil(p.mtu)
    } else {
        p.npsn
    };
    q.req.psn = p.psn.add(npsn);
    if q.req.psn.after(q.req.max_psn) {
        q.req.max_psn = q.req.psn;
    }
    if done {
        q.req.cur += 1;
        q.req.offset = 0;
        if is_rd_atomic {
            q.req.rd_atomic += 1;
        }
    } else {
        q.req.offset = p.offset + p.payload;
    }
    if rc {
        if let Some(t) = ack_timeout_ns(q.attr.timeout) {
            q.comp.retrans_at = Some(now.plus_ns(t));
        }
    }
}
