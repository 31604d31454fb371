//! The completion tail (Linux `rxe_comp.c`'s `do_complete` and the flush of `rxe_qp.c`): send
//! WQEs become completions in send-queue order, a QP in ERR flushes both queues, and a transport
//! error moves the QP there. The requester, responder, completer and device all end here.

use crate::qp::*;
use crate::shared::{lock, Resources};
use crate::verbs::*;

/// Moves the QP to ERR after a transport error: async event, then flush.
pub(crate) fn set_error(q: &mut Qp, res: &mut Resources) {
    if q.state() == QpState::Err {
        return;
    }
    q.attr.qp_state = QpState::Err;
    res.events.push_back(AsyncEvent::QpFatal { qpn: q.qpn });
    if q.srq.is_some() {
        res.events
            .push_back(AsyncEvent::QpLastWqeReached { qpn: q.qpn });
    }
    flush(q, res);
}

/// In ERR: every outstanding WQE on both queues completes with a flush error.
pub(crate) fn flush(q: &mut Qp, res: &mut Resources) {
    q.comp.retrans_at = None;
    q.req.rnr_until = None;
    q.resp.out.clear();
    // A receive WQE the responder took for a multi-packet SEND still in progress is the
    // oldest of the QP's receives: it is flushed first, as rxe flushes it from the head of
    // its receive queue (and, taken from an SRQ, it is this QP's to complete, IBTA 10.2.9.5),
    // never dropped without a completion.
    let in_progress = match q.resp.in_msg.take() {
        Some(InMsg::Send { wqe, .. }) => Some(wqe.wr_id),
        _ => None,
    };
    for w in q.sq.iter_mut() {
        if !matches!(w.state, WqeState::Done(_)) {
            w.state = WqeState::Done(WcStatus::WrFlushErr);
        }
    }
    drain(q, res);
    if let Some(wr_id) = in_progress {
        let cqe = Cqe::new(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, q.qpn);
        // A full CQ is in error already; the completion is lost with the others.
        let _ = res.post_cqe(&q.cq_objs[1], q.recv_cq, cqe, false);
    }
    while let Some(r) = q.rq.pop_front() {
        let cqe = Cqe::new(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, q.qpn);
        if res.post_cqe(&q.cq_objs[1], q.recv_cq, cqe, false).is_err() {
            break;
        }
    }
}

/// Emits completions for finished WQEs at the head of the send queue, in order.
pub(crate) fn drain(q: &mut Qp, res: &mut Resources) {
    let done =
        q.sq.iter()
            .take_while(|w| matches!(w.state, WqeState::Done(_)))
            .count();
    let mut overflow = false;
    if done > 0 {
        // The run's completions go to the CQ under one lock; the WQEs are dropped in place.
        let mut cq = None;
        let mut list_bytes = 0;
        for w in q.sq.range(..done) {
            let WqeState::Done(status) = w.state else {
                break;
            };
            if status != WcStatus::Success || w.signaled {
                let byte_len = if status == WcStatus::Success {
                    w.len
                } else {
                    0
                };
                let cqe = Cqe {
                    byte_len,
                    ..Cqe::new(w.wr.wr_id, status, w.wc_opcode, q.qpn)
                };
                let cq = cq.get_or_insert_with(|| lock(&q.cq_objs[0]));
                if res.push_cqe(cq, q.send_cq, cqe, false).is_err() {
                    overflow = true;
                }
            }
            list_bytes += w.wr.op.page_list_bytes();
        }
        drop(cq);
        q.sq.drain(..done);
        q.sq_head += done as u64;
        q.reg_mr_list_bytes = q.reg_mr_list_bytes.saturating_sub(list_bytes);
    }
    if q.state() == QpState::Sqd && q.en_sqd_notify_due() {
        q.drained_notified = true;
        res.events.push_back(AsyncEvent::SqDrained { qpn: q.qpn });
    }
    if overflow && q.state() != QpState::Err {
        set_error(q, res);
    }
}

impl Qp {
    fn en_sqd_notify_due(&self) -> bool {
        self.attr.en_sqd_async_notify
            && !self.drained_notified
            && self.req.offset == 0
            && !self.sq.iter().any(|w| w.state == WqeState::Pending)
    }
}
