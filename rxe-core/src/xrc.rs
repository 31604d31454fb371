//! XRC (eXtended Reliable Connected, IBTA annex A14): XRC domains, XRC SRQs, the checks of
//! the two XRC QP types, and the binding of an XRC TGT QP to the SRQ each request names.
//!
//! An XRC INI QP is an RC requester whose packets carry XRC opcodes and an XRCETH naming the
//! remote XRC SRQ; an XRC TGT QP is an RC responder in an XRC domain, with no PD, CQ or receive
//! queue of its own. For each request the TGT looks up the SRQ in the XRCETH (it must be an XRC
//! SRQ of the TGT's domain) and, for that packet, takes its receive WQEs from it, posts the
//! receive completion to its CQ and checks R_Keys against its PD: [`bind_tgt`] points the QP's
//! `srq`, `pd`, `recv_cq` and receive CQ at the SRQ's before the RC responder walks the packet.
//! A request whose XRCETH names no such SRQ is an invalid request (the walk's `check_op_valid`
//! NAKs it as RC would).

use std::sync::{Arc, Mutex};

use crate::qp::Qp;
use crate::shared::{lock, read, Cq, QpInit, Resources, SrqXrc};
use crate::verbs::*;
use crate::wire::Packet;

/// Releases what an XRC SRQ holds (its CQ and its domain) once it is out of the table.
pub(crate) fn release_srq(o: &mut crate::shared::Objects, x: SrqXrc) {
    lock(&x.cq).users -= 1;
    if let Some(d) = o.xrcds.get_mut(x.xrcd) {
        d.users -= 1;
    }
}

/// The `create_qp` rules of the XRC types (and that no other type names a domain): an INI QP
/// has a send queue only, a TGT QP no queue at all, and only a TGT QP is in a domain.
pub(crate) fn check_init(init: &QpInit) -> Result<(), VerbError> {
    let c = &init.cap;
    let ok = match init.qp_type {
        QpType::XrcIni => init.xrcd.is_none() && init.srq.is_none() && c.max_recv_wr == 0,
        QpType::XrcTgt => {
            init.xrcd.is_some()
                && init.srq.is_none()
                && c.max_send_wr == 0
                && c.max_recv_wr == 0
                && c.max_inline_data == 0
        }
        _ => init.xrcd.is_none(),
    };
    if ok {
        Ok(())
    } else {
        Err(VerbError::Invalid)
    }
}

/// The send and receive CQ of a new XRC TGT QP (or of a raw packet QP with no queue): one
/// private CQ no completion ever goes to, not in the device's table (the user never sees it).
/// A TGT's receive one is replaced by the CQ of the SRQ each request names ([`bind_tgt`]).
pub(crate) fn tgt_placeholder_cqs() -> [Arc<Mutex<Cq>>; 2] {
    let c = Arc::new(Mutex::new(Cq::default()));
    [c.clone(), c]
}

/// Takes one user of domain `xrcd` (for a new TGT QP), or `NotFound`.
pub(crate) fn xrcd_ref(
    o: &mut crate::shared::Objects,
    xrcd: u32,
    delta: i32,
) -> Result<(), VerbError> {
    let x = o.xrcds.get_mut(xrcd).ok_or(VerbError::NotFound)?;
    x.users = x.users.wrapping_add_signed(delta);
    Ok(())
}

/// Points XRC TGT QP `q` at the XRC SRQ the request `pkt` names: its receive WQEs, its CQ and
/// its PD serve this packet. False (and `q` unchanged) when the XRCETH names no SRQ, an SRQ
/// that is not XRC or one of another domain, or, in the middle of a message, an SRQ other than
/// the one the message started on: the request is then invalid.
pub(crate) fn bind_tgt(q: &mut Qp, res: &Resources, pkt: &Packet<&[u8]>) -> bool {
    let Some(srqn) = pkt.xrceth() else {
        return false;
    };
    let mid_message = q.resp.in_msg.is_some() || q.resp.last_op.is_some();
    if mid_message && q.srq != Some(srqn) {
        return false;
    }
    let Some(s) = read(&res.shared.srqs).get(srqn).cloned() else {
        return false;
    };
    let (pd, cqn, cq) = {
        let g = lock(&s);
        match &g.xrc {
            Some(x) if Some(x.xrcd) == q.xrcd => (g.pd, x.cqn, x.cq.clone()),
            _ => return false,
        }
    };
    q.srq = Some(srqn);
    q.srq_obj = Some(s);
    q.pd = pd;
    q.recv_cq = cqn;
    q.cq_objs[1] = cq;
    true
}
