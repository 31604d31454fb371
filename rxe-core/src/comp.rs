//! The completer (Linux `rxe_comp.c`): processes ACKs, NAKs, READ responses and atomic ACKs
//! at the requester, runs the retransmission and RNR timers, and turns finished WQEs into
//! completions in send-queue order. Also the flush of both queues when a QP enters ERR.

use crate::mem::*;
use crate::qp::*;
use crate::shared::{Drop, Resources};
use crate::types::{Instant, Psn};
use crate::verbs::*;
use crate::wire::{NakCode, OpFlags, Opcode, Packet, Syndrome, Transport};

fn rearm(q: &mut Qp, now: Instant) {
    q.comp.retrans_at = match ack_timeout_ns(q.attr.timeout) {
        Some(t) if q.req.max_psn.after(q.comp.psn) => Some(now.plus_ns(t)),
        _ => None,
    };
}

/// Spends one of `retry_cnt`'s retries: IBTA semantics (7 means seven), or rxe's "7 retries
/// for ever" when the device is configured so.
fn use_retry(q: &mut Qp, res: &Resources) {
    if !(res.cfg.infinite_retry_cnt && q.attr.retry_cnt == 7) {
        q.comp.retry_cnt -= 1;
    }
}

fn reset_retry(q: &mut Qp) {
    q.comp.retry_cnt = q.attr.retry_cnt;
    q.comp.rnr_retry = q.attr.rnr_retry;
    q.comp.started_retry = false;
    q.comp.rnr_psn = None;
}

/// Completes (successfully) every non-read WQE whose PSNs are all before `psn`, i.e. covered by
/// a cumulative ACK of `psn - 1`. Returns the first Pending READ/atomic that the ACK skips over
/// (its response was lost and it must be retried).
fn ack_through(q: &mut Qp, acked: Psn) -> Option<Psn> {
    let mut seq = q.sq_head;
    while let Some(w) = q.wqe_mut(seq) {
        if w.state == WqeState::Pending {
            if w.last_psn.after(acked) {
                break;
            }
            if w.wr.op.is_read_or_atomic() {
                return Some(w.first_psn);
            }
            w.state = WqeState::Done(WcStatus::Success);
        } else if w.state == WqeState::Posted {
            break;
        }
        seq += 1;
    }
    if acked.next().after(q.comp.psn) {
        q.comp.psn = acked.next();
    }
    None
}

/// Acknowledges through `acked`; if that skips a READ/atomic whose response never came, the
/// requester goes back to it. Returns whether it did.
fn ack_or_retry(q: &mut Qp, acked: Psn) -> bool {
    match ack_through(q, acked) {
        Some(p) => {
            q.retry_from(p);
            true
        }
        None => false,
    }
}

/// The oldest WQE still waiting for a response.
fn oldest_pending(q: &Qp) -> Option<u64> {
    (q.sq_head..q.sq_tail()).find(|s| q.wqe(*s).is_some_and(|w| w.state == WqeState::Pending))
}

/// Handles a response packet arriving at the requester side of `q`: rxe's completer walk,
/// `check_psn` (with `get_wqe`) → `do_read` / `do_atomic` / `check_ack` → `complete_ack`.
pub(crate) fn handle_response(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    now: Instant,
    pkt: &Packet<&[u8]>,
) -> Result<(), Drop> {
    let class = match q.qp_type {
        QpType::Rc => Transport::Rc,
        QpType::XrcIni => Transport::Xrc,
        _ => return Err(Drop::Unexpected),
    };
    if pkt.opcode().transport() != class {
        return Err(Drop::Unexpected);
    }
    if !matches!(q.state(), QpState::Rts | QpState::Sqd) {
        return Err(Drop::WrongQpState);
    }
    let psn = Psn::new(pkt.bth().psn());
    let Some(seq) = check_psn(q, pkt, psn)? else {
        return Ok(());
    };
    if pkt.flags().contains(OpFlags::READ) {
        // READ responses (also the empty one for FLUSH / ATOMIC_WRITE).
        return do_read(q, res, mem, now, pkt, psn, seq);
    }
    if pkt.opcode().rc_op() == Opcode::RC_ATOMIC_ACKNOWLEDGE {
        return do_atomic(q, res, mem, now, pkt, psn, seq);
    }
    // RC_ACKNOWLEDGE.
    check_ack(q, res, now, pkt, psn)
}

/// rxe's `check_psn()`: drops a ghost or a duplicate, and returns the oldest WQE waiting for a
/// response that the packet answers (None: the packet restarted an earlier READ/atomic).
#[inline]
fn check_psn(q: &mut Qp, pkt: &Packet<&[u8]>, psn: Psn) -> Result<Option<u64>, Drop> {
    if !psn.before(q.req.max_psn) {
        // A ghost: it answers a PSN never sent (forged, or a peer that lost track). IBTA
        // drops it silently; acting on it would complete as successful work the peer never
        // saw and move the completer past everything the peer will really acknowledge.
        q.counters.ghost_responses += 1;
        return Err(Drop::Ghost);
    }
    let data_response = pkt.flags().intersects(OpFlags::READ.union(OpFlags::ATOMIC));
    loop {
        let Some(seq) = oldest_pending(q) else {
            // Nothing outstanding: a late duplicate.
            q.counters.duplicates += 1;
            return Err(Drop::Duplicate);
        };
        let w = q.wqe(seq).expect("pending wqe");
        if psn.before(w.first_psn) {
            q.counters.duplicates += 1;
            return Err(Drop::Duplicate);
        }
        // A READ response or atomic ACK beyond a SEND/WRITE still waiting for its ACK
        // implicitly acknowledges it (IBTA 9.7.5.1.3); then look again.
        if data_response && psn.after(w.last_psn) && !w.wr.op.is_read_or_atomic() {
            if ack_or_retry(q, psn.sub(1)) {
                return Ok(None);
            }
            continue;
        }
        return Ok(Some(seq));
    }
}

/// A READ response (or the empty one of a FLUSH / ATOMIC_WRITE) for WQE `seq`: the one it
/// expects next is taken, an earlier one is a duplicate, a later one means one went missing.
#[inline]
fn do_read(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    now: Instant,
    pkt: &Packet<&[u8]>,
    psn: Psn,
    seq: u64,
) -> Result<(), Drop> {
    let w = q.wqe(seq).expect("pending wqe");
    let first_psn = w.first_psn;
    let expected = match w.wr.op {
        SendOp::Read { .. } => first_psn.add(w.read_done / q.mtu()),
        SendOp::Flush { .. } | SendOp::AtomicWrite { .. } => first_psn,
        _ => return Err(Drop::Unexpected),
    };
    if psn.before(expected) {
        q.counters.duplicates += 1;
        return Err(Drop::Duplicate);
    }
    if psn.after(expected) {
        // A response went missing: ask again from what we have, once per loss — the rest
        // of the burst that follows it says nothing new.
        if !q.comp.started_retry {
            q.comp.started_retry = true;
            q.retry_from(expected);
        }
        return Err(Drop::OutOfSequence);
    }
    if let SendOp::Read { .. } = w.wr.op {
        read_data(q, res, mem, pkt, psn, seq)?;
    } else {
        let w = q.wqe_mut(seq).expect("pending wqe");
        w.state = WqeState::Done(WcStatus::Success);
        q.comp.psn = psn.next();
        q.req.rd_atomic = q.req.rd_atomic.saturating_sub(1);
    }
    complete_ack(q, now, psn);
    Ok(())
}

/// Places the payload of the expected READ response where the READ's SGEs say; the last one
/// finishes the WQE.
#[inline]
fn read_data(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
    seq: u64,
) -> Result<(), Drop> {
    let w = q.wqe(seq).expect("pending wqe");
    let mtu = q.mtu();
    let flags = pkt.flags();
    let payload = pkt.payload();
    let done = w.read_done;
    let end = flags.contains(OpFlags::LAST);
    // From a device in memory, a response may be a segment of whole path MTUs.
    let segments = res.rx_in_memory;
    let plen = payload.len() as u64;
    let ok_len = if end {
        done as u64 + plen == w.len as u64
    } else if segments {
        plen > 0 && plen.is_multiple_of(mtu as u64) && done as u64 + plen < w.len as u64
    } else {
        plen == mtu as u64
    };
    if !ok_len || (plen > mtu as u64 && !segments) {
        finish_error(q, res, seq, WcStatus::BadRespErr);
        return Err(Drop::Unexpected);
    }
    let placed = copy_to_sges(
        &res.objs().keys,
        mem,
        q.pd,
        &w.wr.sg_list,
        done as u64,
        payload,
    );
    if let Err(e) = placed {
        return Err(place_failed(q, res, seq, e));
    }
    let w = q.wqe_mut(seq).expect("pending wqe");
    w.read_done += payload.len() as u32;
    if end {
        w.state = WqeState::Done(WcStatus::Success);
        q.req.rd_atomic = q.req.rd_atomic.saturating_sub(1);
    }
    q.comp.psn = psn.add((plen.div_ceil(mtu as u64).max(1)) as u32);
    Ok(())
}

/// A READ response or atomic ACK for WQE `seq` that could not be placed: a bad SGE fails the
/// WQE (LOC_PROT_ERR); a page of an on-demand-paging MR not mapped drops the response and
/// stops the requester, which asks again once the page is mapped ([`crate::Device::odp_wake`]).
fn place_failed(q: &mut Qp, res: &mut Resources, seq: u64, e: MemError) -> Drop {
    if let MemError::NotPresent(f) = e {
        res.page_fault(q.qpn, f);
        q.req.odp_wait = true;
        q.req.odp_retry = true;
        return Drop::PageFault;
    }
    finish_error(q, res, seq, WcStatus::LocProtErr);
    Drop::Unexpected
}

/// An atomic ACK for WQE `seq`: the original value goes where the atomic's SGE says.
#[inline]
fn do_atomic(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    now: Instant,
    pkt: &Packet<&[u8]>,
    psn: Psn,
    seq: u64,
) -> Result<(), Drop> {
    let w = q.wqe(seq).expect("pending wqe");
    let orig = pkt.atomic_ack_eth().map(|a| a.orig()).unwrap_or(0);
    if !matches!(w.wr.op, SendOp::CompSwap { .. } | SendOp::FetchAdd { .. }) || psn != w.first_psn {
        return Err(Drop::Unexpected);
    }
    let v = orig.to_le_bytes();
    let placed = copy_to_sges(&res.objs().keys, mem, q.pd, &w.wr.sg_list, 0, &v);
    if let Err(e) = placed {
        return Err(place_failed(q, res, seq, e));
    }
    q.wqe_mut(seq).expect("pending wqe").state = WqeState::Done(WcStatus::Success);
    q.req.rd_atomic = q.req.rd_atomic.saturating_sub(1);
    q.comp.psn = psn.next();
    complete_ack(q, now, psn);
    Ok(())
}

/// After a READ response or atomic ACK at `psn`: earlier non-read WQEs are implicitly
/// acknowledged by the response, the retries are whole again and the timer restarts.
#[inline]
fn complete_ack(q: &mut Qp, now: Instant, psn: Psn) {
    ack_through(q, psn.sub(1));
    reset_retry(q);
    rearm(q, now);
}

/// rxe's `check_ack()`: an ACK, RNR NAK or NAK by its AETH syndrome.
#[inline]
fn check_ack(
    q: &mut Qp,
    res: &mut Resources,
    now: Instant,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Result<(), Drop> {
    let Some(aeth) = pkt.aeth() else {
        return Err(Drop::Unexpected);
    };
    match aeth.syndrome() {
        Syndrome::Ack(_) => {
            if psn.before(q.comp.psn.sub(1)) {
                q.counters.duplicates += 1;
                return Err(Drop::Duplicate);
            }
            // An ACK past a READ/atomic whose response never came restarts it.
            ack_or_retry(q, psn);
            reset_retry(q);
            rearm(q, now);
            Ok(())
        }
        Syndrome::RnrNak(timer) => {
            rnr_nak(q, res, now, psn, timer);
            Ok(())
        }
        Syndrome::Nak(code) => {
            nak(q, res, now, psn, code);
            Ok(())
        }
        Syndrome::Reserved(_) => Err(Drop::Unexpected),
    }
}

/// An RNR NAK at `psn`: after what it acknowledges, the requester waits for the RNR timer and
/// resends from `psn`, or the WQE fails once `rnr_retry` is spent.
fn rnr_nak(q: &mut Qp, res: &mut Resources, now: Instant, psn: Psn, timer: u8) {
    q.counters.rnr_naks_received += 1;
    if ack_or_retry(q, psn.sub(1)) {
        return;
    }
    let Some(seq) = oldest_pending(q) else {
        return;
    };
    if q.comp.rnr_retry == 0 {
        finish_error(q, res, seq, WcStatus::RnrRetryExcErr);
        return;
    }
    if q.comp.rnr_retry != 7 {
        q.comp.rnr_retry -= 1;
    }
    q.retry_from(psn);
    q.comp.rnr_psn = Some(psn);
    q.req.rnr_until = Some(now.plus_ns(rnr_timer_ns(timer)));
    q.comp.retrans_at = None;
}

/// A NAK at `psn`: after what it acknowledges, a PSN sequence error resends from `psn` (one
/// retry spent); every other code fails the WQE with its status.
fn nak(q: &mut Qp, res: &mut Resources, now: Instant, psn: Psn, code: NakCode) {
    q.counters.naks_received += 1;
    if ack_or_retry(q, psn.sub(1)) {
        return;
    }
    let Some(seq) = oldest_pending(q) else {
        return;
    };
    match code {
        NakCode::PsnSeqError => {
            q.counters.seq_naks_received += 1;
            if q.comp.rnr_psn == Some(psn) {
                // The responder NAKs the rest of a burst whose head it RNR-NAKed:
                // the same event, handled by the RNR backoff (before or after its
                // timer fired). Spending a retry on it would end an RNR-only stall
                // with RetryExcErr once retry_cnt is finite (IBTA), though
                // rnr_retry 7 means "for ever".
                return;
            }
            if q.comp.retry_cnt == 0 {
                finish_error(q, res, seq, WcStatus::RetryExcErr);
                return;
            }
            use_retry(q, res);
            q.counters.completer_retries += 1;
            q.retry_from(psn);
            rearm(q, now);
        }
        NakCode::InvalidRequest => finish_error(q, res, seq, WcStatus::RemInvReqErr),
        NakCode::RemoteAccessError => finish_error(q, res, seq, WcStatus::RemAccessErr),
        NakCode::RemoteOperationalError => finish_error(q, res, seq, WcStatus::RemOpErr),
        NakCode::InvalidRdRequest => finish_error(q, res, seq, WcStatus::RemInvRdReqErr),
        NakCode::Other(_) => finish_error(q, res, seq, WcStatus::BadRespErr),
    }
}

/// The retransmission timer fired.
pub(crate) fn retransmit_timeout(q: &mut Qp, res: &mut Resources, now: Instant) {
    q.comp.retrans_at = None;
    if !matches!(q.state(), QpState::Rts | QpState::Sqd) || !q.req.max_psn.after(q.comp.psn) {
        return;
    }
    q.counters.timeouts += 1;
    let Some(seq) = oldest_pending(q) else { return };
    if q.comp.retry_cnt == 0 {
        finish_error(q, res, seq, WcStatus::RetryExcErr);
        return;
    }
    use_retry(q, res);
    q.counters.completer_retries += 1;
    let psn = q.comp.psn;
    q.retry_from(psn);
    rearm(q, now);
}

/// Finishes WQE `seq` with an error status and moves the QP to ERR.
fn finish_error(q: &mut Qp, res: &mut Resources, seq: u64, status: WcStatus) {
    if let Some(w) = q.wqe_mut(seq) {
        w.state = WqeState::Done(status);
    }
    q.counters.errors += 1;
    match status {
        WcStatus::RetryExcErr => q.counters.retry_exceeded += 1,
        WcStatus::RnrRetryExcErr => q.counters.rnr_retry_exceeded += 1,
        _ => {}
    }
    crate::complete::set_error(q, res);
}
