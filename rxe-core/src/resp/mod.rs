//! The responder (Linux `rxe_resp.c`): PSN and opcode-sequence checks, receive WQE and
//! responder-resource checks, R_Key validation, execution of SEND / WRITE / READ / atomics /
//! FLUSH / ATOMIC_WRITE, duplicate handling from the responder resources, and the ACKs, NAKs
//! and READ responses that go back.
//!
//! An RC or UC request walks rxe's states, one function each, in rxe's order:
//! [`handle_request`] → `check_psn` → `check_op_seq` → `check_op_valid` → `check_resource` →
//! `check_length` → `execute` (one function per operation in [`execute`](mod@execute), each
//! checking its R_Key with `check_rkey` where rxe does) → `complete` (the receive CQE) →
//! `acknowledge`. A step passes the packet on or stops it with an [`Exec`]; the order is
//! wire-visible, as it decides which NAK and which completion status a bad request gets.
//! Duplicates leave the walk at `check_psn` for [`duplicate`]; UD receives are [`ud`].

mod duplicate;
mod execute;
mod raw;
mod ud;

pub(crate) use raw::recv as raw_recv;

use crate::icrc::rc_udp_sport;
use crate::mem::*;
use crate::qp::*;
use crate::shared::lock;
use crate::shared::{Drop, RecvMeta, Resources, Transmit};
use crate::types::{Gid, Psn};
use crate::verbs::*;
use crate::wire::{self, BthRepr, ExtRepr, NakCode, OpFlags, Opcode, Packet, Syndrome, Transport};

const ACK: u8 = Syndrome::ACK;

fn nak(code: NakCode) -> u8 {
    Syndrome::Nak(code).to_byte()
}

fn queue_ack(q: &mut Qp, psn: Psn, syndrome: u8) {
    let msn = q.resp.msn;
    if syndrome == ACK {
        // A cumulative ACK replaces one still waiting to go out.
        if let Some((
            RespOut::Ack {
                psn: p,
                syndrome: ACK,
            },
            m,
        )) = q.resp.out.back_mut()
        {
            *p = psn;
            *m = msn;
            return;
        }
    } else {
        q.counters.naks_sent += 1;
    }
    push_out(q, RespOut::Ack { psn, syndrome });
}

/// Queues a response carrying the current MSN, unless [`MAX_RESP_OUT`] already wait.
fn push_out(q: &mut Qp, out: RespOut) {
    if q.resp.out.len() >= MAX_RESP_OUT {
        q.counters.responses_dropped += 1;
        return;
    }
    let msn = q.resp.msn;
    q.resp.out.push_back((out, msn));
}

/// One more message done: the MSN the next responses carry.
#[inline]
fn bump_msn(q: &mut Qp) {
    q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
}

/// Takes a receive WQE from the SRQ or the RQ; raises the SRQ limit event when it drops below.
fn take_recv(q: &mut Qp, res: &mut Resources) -> Option<RecvWqe> {
    match q.srq {
        Some(s) => {
            let (w, limit) = {
                let mut srq = lock(q.srq_obj.as_ref()?);
                let w = srq.queue.pop_front()?;
                let limit = srq.limit > 0 && (srq.queue.len() as u32) < srq.limit;
                if limit {
                    srq.limit = 0;
                }
                (w, limit)
            };
            if limit {
                res.events
                    .push_back(AsyncEvent::SrqLimitReached { srqn: s });
            }
            Some(w)
        }
        None => q.rq.pop_front(),
    }
}

fn recv_available(q: &Qp) -> bool {
    match q.srq {
        Some(_) => q
            .srq_obj
            .as_ref()
            .is_some_and(|s| !lock(s).queue.is_empty()),
        None => !q.rq.is_empty(),
    }
}

fn put_back_recv(q: &mut Qp, w: RecvWqe) {
    match &q.srq_obj {
        Some(s) => lock(s).queue.push_front(w),
        None => q.rq.push_front(w),
    }
}

fn recv_cqe(q: &Qp, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> Cqe {
    Cqe {
        byte_len,
        ..Cqe::new(wr_id, status, opcode, q.qpn)
    }
}

fn post_recv_cqe(q: &mut Qp, res: &mut Resources, mut cqe: Cqe, solicited: bool) {
    cqe.solicited = solicited;
    if res
        .post_cqe(&q.cq_objs[1], q.recv_cq, cqe, solicited)
        .is_err()
    {
        q.resp.goto_error = true;
    }
}

/// Handles a request packet arriving at `q`.
pub(crate) fn handle_request(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    meta: &RecvMeta,
    pkt: &Packet<&[u8]>,
) -> Result<(), Drop> {
    if !matches!(
        q.state(),
        QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
    ) {
        return Err(Drop::WrongQpState);
    }
    let t = pkt.opcode().transport();
    let ok = match q.qp_type {
        QpType::Rc => t == Transport::Rc,
        QpType::Uc => t == Transport::Uc,
        QpType::Ud | QpType::Gsi => t == Transport::Ud,
        QpType::XrcTgt => t == Transport::Xrc,
        // A requester alone: it takes no requests; a raw packet QP takes frames, not RoCE.
        QpType::XrcIni | QpType::RawPacket => false,
    };
    if !ok {
        return Err(Drop::Unexpected);
    }
    if q.qp_type == QpType::XrcTgt {
        q.resp.xrc_bad = !crate::xrc::bind_tgt(q, res, pkt);
    }
    if !q.resp.comm_est {
        q.resp.comm_est = true;
        if q.state() == QpState::Rtr && q.is_connected() {
            res.events.push_back(AsyncEvent::CommEst { qpn: q.qpn });
        }
    }
    match q.qp_type {
        QpType::Ud | QpType::Gsi => ud::recv(q, res, mem, meta, pkt),
        QpType::Rc | QpType::XrcTgt => rc_recv(q, res, mem, pkt),
        QpType::Uc => uc_recv(q, res, mem, pkt),
        QpType::XrcIni | QpType::RawPacket => Err(Drop::Unexpected),
    }
}

/// Why the walk stopped a request packet.
enum Exec {
    /// RNR: no receive WQE; the packet is not consumed.
    Rnr,
    /// Fatal for the message: NAK (RC) / drop (UC), and for RC the QP goes to error.
    Err { nak: NakCode, status: WcStatus },
    /// A page of an on-demand-paging MR is not mapped: the packet is not consumed (nothing
    /// of it counts), the page is asked for, and the requester sends it again.
    Fault(PageFault),
}

/// A memory access under a key that checked out failed: a page to fault in, or an
/// operational error.
fn mem_exec(e: MemError) -> Exec {
    match e {
        MemError::NotPresent(f) => Exec::Fault(f),
        _ => operational_error(),
    }
}

/// The responder's "invalid request" outcome: NAK 0x61, the claimed receive WQE (if any)
/// completing with REM_INV_REQ_ERR.
fn invalid_request() -> Exec {
    Exec::Err {
        nak: NakCode::InvalidRequest,
        status: WcStatus::RemInvReqErr,
    }
}

/// An R_Key violation: NAK 0x63, REM_ACCESS_ERR.
fn access_error() -> Exec {
    Exec::Err {
        nak: NakCode::RemoteAccessError,
        status: WcStatus::RemAccessErr,
    }
}

/// Memory that failed under a key that checked out: NAK 0x64, REM_OP_ERR.
fn operational_error() -> Exec {
    Exec::Err {
        nak: NakCode::RemoteOperationalError,
        status: WcStatus::RemOpErr,
    }
}

fn rc_recv(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
) -> Result<(), Drop> {
    if q.resp.goto_error {
        // A fatal NAK is on its way out; the QP takes no more requests.
        return Err(Drop::WrongQpState);
    }
    let psn = check_psn(q, pkt)?;
    match walk(q, res, mem, pkt, psn) {
        Ok(()) => Ok(()),
        Err(Exec::Rnr) => {
            q.counters.rnr_naks_sent += 1;
            let syn = Syndrome::RnrNak(q.attr.min_rnr_timer).to_byte();
            push_out(q, RespOut::Ack { psn, syndrome: syn });
            Err(Drop::NoReceiveWqe)
        }
        Err(Exec::Fault(f)) => {
            res.page_fault(q.qpn, f);
            // A SEND or WRITE is refused for now with an RNR NAK, as a receiver short of a
            // buffer does; IBTA has no NAK for a READ or an atomic, which are dropped and
            // come again when the requester's timer fires.
            let fl = pkt.flags();
            if fl.contains(OpFlags::SEND) || fl.contains(OpFlags::WRITE) {
                q.counters.rnr_naks_sent += 1;
                let syn = Syndrome::RnrNak(q.attr.min_rnr_timer).to_byte();
                push_out(q, RespOut::Ack { psn, syndrome: syn });
            }
            Err(Drop::PageFault)
        }
        Err(Exec::Err { nak: code, status }) => {
            q.counters.errors += 1;
            abort_message(q, res, status);
            queue_ack(q, psn, nak(code));
            q.resp.goto_error = true;
            res.events.push_back(match code {
                NakCode::RemoteAccessError => AsyncEvent::QpAccessErr { qpn: q.qpn },
                _ => AsyncEvent::QpReqErr { qpn: q.qpn },
            });
            Err(Drop::Unexpected)
        }
    }
}

/// RC (rxe's `check_psn()`): the expected PSN goes on; one past it is NAKed once (PSN sequence
/// error) and dropped; one before it is a duplicate.
#[inline]
fn check_psn(q: &mut Qp, pkt: &Packet<&[u8]>) -> Result<Psn, Drop> {
    let psn = Psn::new(pkt.bth().psn());
    let diff = psn.diff(q.resp.psn);
    if diff > 0 {
        if !q.resp.sent_psn_nak {
            q.resp.sent_psn_nak = true;
            q.counters.out_of_seq_requests += 1;
            let exp = q.resp.psn;
            queue_ack(q, exp, nak(NakCode::PsnSeqError));
        }
        return Err(Drop::OutOfSequence);
    }
    if diff < 0 {
        return Err(duplicate::duplicate(q, pkt));
    }
    q.resp.sent_psn_nak = false;
    Ok(psn)
}

fn uc_recv(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
) -> Result<(), Drop> {
    let psn = check_psn_uc(q, pkt)?;
    match walk(q, res, mem, pkt, psn) {
        Ok(()) => Ok(()),
        Err(Exec::Rnr) => {
            q.resp.drop_msg = !pkt.flags().contains(OpFlags::LAST);
            Err(Drop::NoReceiveWqe)
        }
        Err(Exec::Err { .. }) => {
            abort_uc(q);
            q.resp.drop_msg = !pkt.flags().contains(OpFlags::LAST);
            Err(Drop::Unexpected)
        }
        Err(Exec::Fault(f)) => {
            // UC cannot ask for the packet again: the message is lost, the page asked for.
            res.page_fault(q.qpn, f);
            abort_uc(q);
            q.resp.drop_msg = !pkt.flags().contains(OpFlags::LAST);
            Err(Drop::PageFault)
        }
    }
}

/// UC's `check_psn()`: no NAKs and no duplicates; a gap drops the message it falls in, and a
/// message that starts after one begins afresh.
#[inline]
fn check_psn_uc(q: &mut Qp, pkt: &Packet<&[u8]>) -> Result<Psn, Drop> {
    let psn = Psn::new(pkt.bth().psn());
    let start = pkt.flags().contains(OpFlags::FIRST);
    if psn != q.resp.psn || q.resp.drop_msg {
        if !start {
            // A gap inside a message: UC drops the whole message.
            q.resp.drop_msg = true;
            q.resp.psn = psn.next();
            abort_uc(q);
            return Err(Drop::OutOfSequence);
        }
        abort_uc(q);
        q.resp.drop_msg = false;
    }
    q.resp.psn = psn.next();
    Ok(psn)
}

/// UC: a message in progress is abandoned; its receive WQE goes back for the next message.
fn abort_uc(q: &mut Qp) {
    q.resp.last_op = None;
    if let Some(InMsg::Send { wqe, .. }) = q.resp.in_msg.take() {
        put_back_recv(q, wqe);
    }
}

/// RC: a message in progress fails; its receive WQE completes with `status`.
fn abort_message(q: &mut Qp, res: &mut Resources, status: WcStatus) {
    q.resp.last_op = None;
    if let Some(InMsg::Send { wqe, .. }) = q.resp.in_msg.take() {
        let cqe = recv_cqe(q, wqe.wr_id, status, WcOpcode::Recv, 0);
        post_recv_cqe(q, res, cqe, false);
    }
}

/// The operation a request asks for, tested in this order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    Write,
    Read,
    Atomic,
    AtomicWrite,
    Flush,
    /// None the responder executes: an invalid request.
    Other,
}

impl Op {
    #[inline]
    fn of(pkt: &Packet<&[u8]>) -> Op {
        let f = pkt.flags();
        if f.contains(OpFlags::SEND) {
            Op::Send
        } else if f.contains(OpFlags::WRITE) {
            Op::Write
        } else if pkt.opcode().rc_op() == Opcode::RC_RDMA_READ_REQUEST {
            Op::Read
        } else if f.contains(OpFlags::ATOMIC) {
            Op::Atomic
        } else if f.contains(OpFlags::ATOMIC_WRITE) {
            Op::AtomicWrite
        } else if f.contains(OpFlags::FLUSH) {
            Op::Flush
        } else {
            Op::Other
        }
    }
}

/// Each of these keeps a responder resource for its replay and is answered by a response of
/// its own, not by an ACK.
#[inline]
fn keeps_resource(f: OpFlags) -> bool {
    f.intersects(
        OpFlags::READ
            .union(OpFlags::ATOMIC)
            .union(OpFlags::ATOMIC_WRITE)
            .union(OpFlags::FLUSH),
    )
}

/// A WRITE with immediate: it needs a receive WQE, claimed before any data moves.
#[inline]
fn claims_recv_for_write(f: OpFlags) -> bool {
    f.contains(OpFlags::RWR) && f.contains(OpFlags::WRITE)
}

/// The walk of one in-sequence request packet, from `check_op_seq` to `acknowledge`.
#[inline]
fn walk(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Result<(), Exec> {
    check_op_seq(q, pkt)?;
    check_op_valid(q, pkt)?;
    check_resource(q, res, pkt)?;
    let op = Op::of(pkt);
    let r = check_length(q, res, pkt, op).and_then(|span| execute(q, res, mem, pkt, psn, op, span));
    // rxe claims the receive WQE of a WRITE with immediate at `check_resource`, so on RC an
    // error found from there on (length, R_Key) completes it with the error, as for a SEND.
    if let Err(Exec::Err { status, .. }) = r {
        if claims_recv_for_write(pkt.flags()) && q.qp_type.is_rc_responder() {
            if let Some(w) = take_recv(q, res) {
                let cqe = recv_cqe(q, w.wr_id, status, WcOpcode::RecvRdmaWithImm, 0);
                post_recv_cqe(q, res, cqe, false);
            }
        }
    }
    r
}

/// Is the opcode allowed to follow the last one (None: between messages)? IBTA 9.8.3 opcode
/// sequence.
#[inline]
fn check_op_seq(q: &Qp, pkt: &Packet<&[u8]>) -> Result<(), Exec> {
    let f = pkt.opcode().flags();
    let ok = match q.resp.last_op {
        None => f.contains(OpFlags::FIRST),
        Some(l) => {
            let lf = l.flags();
            !f.contains(OpFlags::FIRST)
                && ((lf.contains(OpFlags::SEND) && f.contains(OpFlags::SEND))
                    || (lf.contains(OpFlags::WRITE) && f.contains(OpFlags::WRITE)))
        }
    };
    if !ok {
        return Err(invalid_request());
    }
    Ok(())
}

/// Operation permitted on this QP? (rxe's `check_qp_attr_access`: a FLUSH needs the QP
/// rights of its placement type, else it is an invalid request, not an access error.)
#[inline]
fn check_op_valid(q: &Qp, pkt: &Packet<&[u8]>) -> Result<(), Exec> {
    // XRC TGT: an XRCETH naming no XRC SRQ of the QP's domain (IBTA A14: invalid request).
    if q.resp.xrc_bad {
        return Err(invalid_request());
    }
    let f = pkt.flags();
    let qa = q.attr.qp_access_flags;
    let allowed = if f.contains(OpFlags::WRITE) || f.contains(OpFlags::ATOMIC_WRITE) {
        qa.contains(Access::REMOTE_WRITE)
    } else if f.contains(OpFlags::READ) {
        qa.contains(Access::REMOTE_READ)
    } else if f.contains(OpFlags::ATOMIC) {
        qa.contains(Access::REMOTE_ATOMIC)
    } else if let Some(feth) = pkt.feth() {
        qa.contains(Access::for_flush(feth.placement_type()))
    } else {
        true
    };
    if !allowed {
        return Err(invalid_request());
    }
    Ok(())
}

/// The receive WQE and the responder resource a request needs.
#[inline]
fn check_resource(q: &mut Qp, res: &mut Resources, pkt: &Packet<&[u8]>) -> Result<(), Exec> {
    let f = pkt.flags();
    // The receive WQE of a SEND is taken before its length is checked, as rxe does
    // (`check_resource()` before `check_length()`): no WQE is an RNR NAK whatever the packet
    // holds, and a malformed first packet consumes the WQE, which then completes with the
    // error (REM_INV_REQ_ERR for a bad length) instead of being flushed without a reason.
    if f.contains(OpFlags::SEND) && f.contains(OpFlags::FIRST) {
        let Some(w) = take_recv(q, res) else {
            return Err(Exec::Rnr);
        };
        q.resp.in_msg = Some(InMsg::Send { wqe: w, offset: 0 });
    }
    // Each of these keeps a responder resource for its replay, so none is taken without
    // any. (rxe leaves FLUSH out of this check and then uses a resource it has not got.)
    if keeps_resource(f) && q.attr.max_dest_rd_atomic == 0 {
        return Err(invalid_request());
    }
    // WRITE with immediate needs a receive WQE: check before any data moves, so an RNR NAK
    // leaves nothing half done. rxe claims that WQE at this point too (see [`walk`]).
    if claims_recv_for_write(f) && !recv_available(q) {
        return Err(Exec::Rnr);
    }
    Ok(())
}

/// rxe's `check_length()`: the payload against the path MTU, then, before any R_Key is looked
/// at, a DMA length beyond max_msg_sz (C9-94) or an atomic address not 8-byte aligned is an
/// invalid request. Returns the PSNs the packet stands for.
#[inline]
fn check_length(q: &Qp, res: &Resources, pkt: &Packet<&[u8]>, op: Op) -> Result<u32, Exec> {
    let f = pkt.flags();
    let mtu = q.mtu() as usize;
    let plen = pkt.payload().len();
    // From another device in memory, an RC packet may be a segment of whole path MTUs
    // (`Device::poll_transmit_segments`); the message's own bounds still hold below.
    let segments = res.rx_in_memory && q.qp_type == QpType::Rc;
    let ok_len = if f.contains(OpFlags::ONLY) || f.contains(OpFlags::LAST) {
        plen <= mtu || segments
    } else if segments {
        plen > 0 && plen.is_multiple_of(mtu)
    } else {
        plen == mtu
    };
    // The PSNs this packet stands for.
    let span = plen.div_ceil(mtu).max(1) as u32;
    if f.contains(OpFlags::PAYLOAD) && !ok_len {
        return Err(invalid_request());
    }
    let bad = match op {
        // As for READ: the WRITE's length is judged on its first packet.
        Op::Write if f.contains(OpFlags::FIRST) => {
            pkt.reth().expect("first write has RETH").dma_len() > MAX_MSG_SZ
        }
        Op::Read => pkt.reth().expect("read has RETH").dma_len() > MAX_MSG_SZ,
        Op::Atomic => pkt.atomic_eth().expect("atomic has AtomicETH").va() & 7 != 0,
        Op::AtomicWrite => pkt.reth().expect("atomic write has RETH").va() & 7 != 0,
        Op::Flush => pkt.reth().expect("flush has RETH").dma_len() > MAX_MSG_SZ,
        Op::Send | Op::Write | Op::Other => false,
    };
    if bad {
        return Err(invalid_request());
    }
    Ok(span)
}

/// rxe's `check_rkey()`: the R_Key, its PD (or its window's QP), state, rights and range for
/// `len` bytes at `va`; any violation is a remote access error. Each operation calls it where
/// rxe checks: on a WRITE's first packet for the whole message and again as each packet is
/// placed, on a READ for the whole READ, on an atomic for the 8 bytes it then holds.
#[inline]
fn check_rkey<'k>(
    keys: &'k KeyTable,
    q: &Qp,
    rkey: u32,
    va: u64,
    len: u64,
    access: Access,
) -> Result<Region<'k>, Exec> {
    keys.lookup_remote(q.pd, q.qpn.0, rkey, va, len, access)
        .map_err(|_| access_error())
}

/// rxe's `execute()`: the operation, then the acknowledgement (a READ is acknowledged by its
/// responses).
#[inline]
fn execute(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
    op: Op,
    span: u32,
) -> Result<(), Exec> {
    match op {
        Op::Send => execute::send(q, res, mem, pkt)?,
        Op::Write => execute::write(q, res, mem, pkt)?,
        Op::Read => return execute::read(q, res, pkt, psn),
        Op::Atomic => execute::atomic(q, res, mem, pkt, psn)?,
        Op::AtomicWrite => execute::atomic_write(q, res, mem, pkt, psn)?,
        Op::Flush => execute::flush(q, res, pkt, psn)?,
        Op::Other => return Err(invalid_request()),
    }
    acknowledge(q, pkt, psn, span);
    Ok(())
}

/// The last packet of a SEND: its receive WQE completes (rxe's `do_complete()`), after the
/// key a SEND with invalidate names is invalidated.
#[inline]
fn complete_send(
    q: &mut Qp,
    res: &mut Resources,
    pkt: &Packet<&[u8]>,
    wqe: RecvWqe,
    len: u64,
) -> Result<(), Exec> {
    let mut cqe = recv_cqe(q, wqe.wr_id, WcStatus::Success, WcOpcode::Recv, len as u32);
    if let Some(imm) = pkt.imm() {
        cqe.wc_flags |= WC_WITH_IMM;
        cqe.imm_or_inv = imm;
    }
    if let Some(rkey) = pkt.ieth() {
        if res.objs_mut().keys.invalidate(q.pd, rkey, None).is_err() {
            let cqe = recv_cqe(q, wqe.wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, 0);
            post_recv_cqe(q, res, cqe, false);
            return Err(invalid_request());
        }
        cqe.wc_flags |= WC_WITH_INV;
        cqe.imm_or_inv = rkey;
    }
    bump_msn(q);
    post_recv_cqe(q, res, cqe, pkt.bth().solicited());
    Ok(())
}

/// The last packet of a WRITE with immediate: a receive WQE completes with `total` bytes.
#[inline]
fn complete_write(
    q: &mut Qp,
    res: &mut Resources,
    pkt: &Packet<&[u8]>,
    imm: u32,
    total: u64,
) -> Result<(), Exec> {
    let Some(w) = take_recv(q, res) else {
        return Err(Exec::Rnr);
    };
    let mut cqe = recv_cqe(
        q,
        w.wr_id,
        WcStatus::Success,
        WcOpcode::RecvRdmaWithImm,
        total as u32,
    );
    cqe.wc_flags |= WC_WITH_IMM;
    cqe.imm_or_inv = imm;
    post_recv_cqe(q, res, cqe, pkt.bth().solicited());
    Ok(())
}

/// rxe's `acknowledge()`: the next expected PSN, and an ACK when the requester asks for one
/// (a READ, an atomic, an ATOMIC_WRITE or a FLUSH is answered by its own response).
#[inline]
fn acknowledge(q: &mut Qp, pkt: &Packet<&[u8]>, psn: Psn, span: u32) {
    q.resp.psn = psn.add(span);
    if pkt.bth().ack_req() && !keeps_resource(pkt.flags()) && q.qp_type.is_rc_responder() {
        queue_ack(q, psn.add(span - 1), ACK);
    }
}

/// Builds the next response packet of `q` (ACK, NAK, READ response, atomic ACK) into `buf`.
#[inline]
pub(crate) fn next_response(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    buf: &mut [u8],
    in_memory: &dyn Fn(&Gid) -> bool,
) -> Option<Transmit> {
    if q.resp.odp_wait {
        return None;
    }
    let (out, msn) = q.resp.out.pop_front()?;
    let mut ext = ExtRepr {
        aeth: (ACK, msn),
        ..Default::default()
    };
    let (op, psn, plen) = match out {
        RespOut::Ack { psn, syndrome } => {
            ext.aeth.0 = syndrome;
            (Opcode::RC_ACKNOWLEDGE, psn, 0)
        }
        RespOut::AtomicAck { psn, orig } => {
            ext.atomic_orig = orig;
            (Opcode::RC_ATOMIC_ACKNOWLEDGE, psn, 0)
        }
        RespOut::EmptyReadResp { psn } => (Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn, 0),
        RespOut::Read {
            psn,
            len,
            offset,
            first,
            ..
        } => {
            let (op, n) = duplicate::read_segment(q, len, offset, first, buf.len(), in_memory);
            (op, psn, n)
        }
    };
    // An XRC TGT answers with the same responses in the XRC class.
    let op = match q.qp_type {
        QpType::XrcTgt => op.with_transport(Opcode::XRC_BASE),
        _ => op,
    };
    let bth = BthRepr::new(op, q.attr.dest_qp_num, psn.get(), false);
    let (total, range) = wire::emit(buf, &bth, &ext, plen as usize).ok()?;
    if matches!(out, RespOut::Read { .. }) {
        duplicate::read_data(q, res, mem, &mut buf[range], out, msn)?;
    }
    let src = res.gid(q.attr.av.sgid_index)?;
    if q.resp.out.is_empty() && q.resp.goto_error {
        crate::complete::set_error(q, res);
    }
    Some(Transmit {
        len: total,
        src,
        dst: q.attr.av.dgid,
        sport: rc_udp_sport(q.attr.av.flow_label, q.qpn.0, q.attr.dest_qp_num),
        traffic_class: q.attr.av.traffic_class,
        hop_limit: if q.attr.av.hop_limit == 0 {
            64
        } else {
            q.attr.av.hop_limit
        },
        flow_label: q.attr.av.flow_label,
        dmac: q.attr.av.dmac,
        qpn: q.qpn,
    })
}
