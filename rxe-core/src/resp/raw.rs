//! Raw packet QP receives: a whole Ethernet frame fills one receive WQE, as it came (no network
//! header before it, no transport state).

use super::{post_recv_cqe, put_back_recv, recv_cqe, take_recv};
use crate::mem::*;
use crate::qp::*;
use crate::shared::{Drop, Resources};
use crate::verbs::*;

pub(crate) fn recv(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    frame: &[u8],
) -> Result<(), Drop> {
    if !matches!(q.state(), QpState::Rtr | QpState::Rts) {
        return Err(Drop::WrongQpState);
    }
    let Some(w) = take_recv(q, res) else {
        return Err(Drop::NoReceiveWqe);
    };
    let mut cqe = recv_cqe(q, w.wr_id, WcStatus::Success, WcOpcode::Recv, 0);
    if frame.len() as u64 > w.len {
        cqe.status = WcStatus::LocLenErr;
        post_recv_cqe(q, res, cqe, false);
        return Ok(());
    }
    let r = copy_to_sges(&res.objs().keys, mem, q.pd, &w.sges, 0, frame);
    if let Err(MemError::NotPresent(f)) = r {
        // As a UD datagram: the frame is lost, its receive kept, the page asked for.
        res.page_fault(q.qpn, f);
        put_back_recv(q, w);
        return Err(Drop::PageFault);
    }
    if r.is_err() {
        cqe.status = WcStatus::LocProtErr;
    } else {
        cqe.byte_len = frame.len() as u32;
    }
    post_recv_cqe(q, res, cqe, false);
    Ok(())
}
