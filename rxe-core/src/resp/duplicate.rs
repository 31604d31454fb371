//! The responder resources (rxe's `resp_res`): what a READ, an atomic, an ATOMIC_WRITE or a
//! FLUSH keeps so that a duplicate of it is answered again, not executed again; duplicate
//! requests (IBTA 9.9.2.2, rxe's `duplicate_request()`); and the READ responses, which serve
//! a first answer and a replay alike from the READ's resource (rxe's `read_reply()`).

use super::{push_out, queue_ack, ACK};
use crate::mem::*;
use crate::qp::*;
use crate::shared::{Drop, Resources};
use crate::types::{Gid, Psn};
use crate::verbs::*;
use crate::wire::{OpFlags, Opcode, Packet};

/// The PSNs a resource answers for.
fn resource_psns(r: &Resource) -> (Psn, Psn) {
    match *r {
        Resource::Read {
            first_psn,
            last_psn,
            ..
        } => (first_psn, last_psn),
        Resource::Atomic { psn, .. } | Resource::Empty { psn } => (psn, psn),
    }
}

/// Drops the queued responses (READ data, atomic ACK, empty READ response) that answer the
/// resource spanning `first..=last`: its replay is replaced, or the resource itself is gone.
fn unqueue_resource(q: &mut Qp, (first, last): (Psn, Psn)) {
    q.resp.out.retain(|(o, _)| {
        let psn = match *o {
            RespOut::Read { psn, .. }
            | RespOut::AtomicAck { psn, .. }
            | RespOut::EmptyReadResp { psn } => psn,
            RespOut::Ack { .. } => return true,
        };
        psn.before(first) || psn.after(last)
    });
}

/// Keeps `r` for replays, in place of the oldest resource when all are taken (rxe's
/// `get_new_resource()`). A requester that keeps to its max_rd_atomic has had the oldest
/// answered in full by then; for one that does not, what is still queued of it goes too, so
/// the queued READ data never exceeds one message per resource.
pub(super) fn add_resource(q: &mut Qp, r: Resource) {
    let cap = q.attr.max_dest_rd_atomic.max(1) as usize;
    while q.resp.resources.len() >= cap {
        if let Some(old) = q.resp.resources.pop_front() {
            unqueue_resource(q, resource_psns(&old));
        }
    }
    q.resp.resources.push_back(r);
}

/// A request with a PSN before the expected one (IBTA 9.9.2.2 / rxe `duplicate_request`).
/// Always dropped: a SEND or WRITE is acknowledged again, anything else answered again from
/// its resource.
pub(super) fn duplicate(q: &mut Qp, pkt: &Packet<&[u8]>) -> Drop {
    q.counters.duplicates += 1;
    q.counters.duplicate_requests += 1;
    let psn = Psn::new(pkt.bth().psn());
    let f = pkt.flags();
    if f.contains(OpFlags::SEND) || f.contains(OpFlags::WRITE) {
        let prev = q.resp.psn.sub(1);
        queue_ack(q, prev, ACK);
        return Drop::Duplicate;
    }
    let found = q.resp.resources.iter().rev().find_map(|r| {
        let span = resource_psns(r);
        let out = match *r {
            Resource::Read {
                first_psn,
                last_psn,
                va,
                rkey,
                pd,
                len,
            } if !psn.before(first_psn) && !psn.after(last_psn) => {
                let reth = pkt.reth()?;
                let (iova, l) = (reth.va(), reth.dma_len() as u64);
                (op_is(pkt, Opcode::RC_RDMA_READ_REQUEST)
                    && reth.rkey() == rkey
                    && iova >= va
                    && iova.checked_add(l)? <= va + len as u64)
                    .then_some(RespOut::Read {
                        psn,
                        va: iova,
                        rkey,
                        pd,
                        len: l as u32,
                        offset: 0,
                        // As rxe (`duplicate_request()`: `rdatm_res_state_replay` unless the PSN
                        // is the READ's first): a replay from inside the message continues it
                        // with MIDDLE … LAST (LAST alone for its last packet), one from its start
                        // begins with FIRST (or ONLY).
                        first: psn == first_psn,
                    })
            }
            Resource::Atomic { psn: p, orig } if p == psn && f.contains(OpFlags::ATOMIC) => {
                Some(RespOut::AtomicAck { psn, orig })
            }
            Resource::Empty { psn: p }
                if p == psn && f.intersects(OpFlags::FLUSH.union(OpFlags::ATOMIC_WRITE)) =>
            {
                Some(RespOut::EmptyReadResp { psn })
            }
            _ => None,
        };
        out.map(|o| (span, o))
    });
    if let Some((span, out)) = found {
        // One replay per resource, as rxe keeps one replay state per resource: the newest
        // duplicate is what the requester waits for, so it replaces whatever of the resource
        // is still queued (the original answer or an earlier replay).
        unqueue_resource(q, span);
        push_out(q, out);
    }
    Drop::Duplicate
}

/// The packet's operation is `op` (an RC opcode; XRC carries the same operations).
fn op_is(pkt: &Packet<&[u8]>, op: Opcode) -> bool {
    pkt.opcode().rc_op() == op
}

/// The opcode and payload length of the next READ response of a READ of `len` bytes that has
/// sent `offset`.
#[inline]
pub(super) fn read_segment(
    q: &Qp,
    len: u32,
    offset: u32,
    first: bool,
    buf_len: usize,
    in_memory: &dyn Fn(&Gid) -> bool,
) -> (Opcode, u32) {
    let mtu = q.mtu();
    // To a device reached in memory, a segment of several path MTUs.
    let seg = if len - offset > mtu && q.qp_type == QpType::Rc && in_memory(&q.attr.av.dgid) {
        crate::shared::segment_payload(buf_len, mtu)
    } else {
        mtu
    };
    let n = (len - offset).min(seg);
    let last = offset + n == len;
    let op = match (first, last) {
        (true, true) => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        (true, false) => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
        (false, false) => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
        (false, true) => Opcode::RC_RDMA_READ_RESPONSE_LAST,
    };
    (op, n)
}

/// Fills `dst`, the payload of the READ response `out`, from the READ's memory, and queues the
/// rest of the READ after it. None when that memory is gone.
#[inline]
pub(super) fn read_data(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    dst: &mut [u8],
    out: RespOut,
    msn: u32,
) -> Option<()> {
    let RespOut::Read {
        psn,
        va,
        rkey,
        pd,
        len,
        offset,
        ..
    } = out
    else {
        return Some(());
    };
    let mtu = q.mtu();
    let plen = dst.len() as u32;
    if plen > 0 {
        let addr = va + offset as u64;
        let ok = res
            .objs()
            .keys
            .lookup_remote(pd, q.qpn.0, rkey, addr, plen as u64, Access::REMOTE_READ)
            .and_then(|r| r.read(mem, addr, dst));
        if let Err(MemError::NotPresent(f)) = ok {
            // A page of an on-demand-paging MR: the response waits, first in line, until
            // the page is mapped ([`crate::Device::odp_wake`]).
            res.page_fault(q.qpn, f);
            q.resp.out.push_front((out, msn));
            q.resp.odp_wait = true;
            return None;
        }
        if ok.is_err() {
            // The MR went away under an in-progress READ: stop answering it; the requester
            // times out.
            q.counters.errors += 1;
            return None;
        }
    }
    if plen > mtu {
        res.port.tx_segments += 1;
    }
    if offset + plen < len {
        q.resp.out.push_front((
            RespOut::Read {
                psn: psn.add(plen.div_ceil(mtu).max(1)),
                va,
                rkey,
                pd,
                len,
                offset: offset + plen,
                first: false,
            },
            msn,
        ));
    }
    Some(())
}
