//! rxe's `execute()`, one function per operation: SEND, RDMA WRITE, RDMA READ, the atomics,
//! ATOMIC_WRITE and FLUSH. Each runs once the walk's checks before it have passed, checks its
//! R_Key where rxe does ([`check_rkey`]), then places the data or queues the answer.

use super::duplicate::add_resource;
use super::{
    access_error, bump_msn, check_rkey, complete_send, complete_write, invalid_request, mem_exec,
    push_out, put_back_recv, Exec,
};
use crate::mem::*;
use crate::qp::*;
use crate::shared::{lock, Resources};
use crate::types::Psn;
use crate::verbs::*;
use crate::wire::{NakCode, OpFlags, Opcode, Packet};

/// Places `data` at `va` through a region whose key checked out.
#[inline]
fn place(region: &Region<'_>, mem: &mut dyn Memory, va: u64, data: &[u8]) -> Result<(), Exec> {
    region.write(mem, va, data).map_err(mem_exec)
}

/// Keeps `r` for replays, counts the message, and queues its answer.
#[inline]
fn answer(q: &mut Qp, r: Resource, out: RespOut) {
    add_resource(q, r);
    bump_msn(q);
    push_out(q, out);
}

/// SEND: the payload goes into the receive WQE its first packet claimed
/// ([`super::check_resource`]); the last packet completes it.
#[inline]
pub(super) fn send(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
) -> Result<(), Exec> {
    let payload = pkt.payload();
    let plen = payload.len();
    let last = pkt.flags().contains(OpFlags::LAST);
    let pd = q.pd;
    let Some(InMsg::Send { wqe, offset }) = q.resp.in_msg.as_mut() else {
        return Err(invalid_request());
    };
    if *offset + plen as u64 > wqe.len {
        return Err(Exec::Err {
            nak: NakCode::InvalidRequest,
            status: WcStatus::LocLenErr,
        });
    }
    if plen > 0 {
        match copy_to_sges(&res.objs().keys, mem, pd, &wqe.sges, *offset, payload) {
            Ok(()) => {}
            Err(MemError::NotPresent(f)) => {
                // The first packet gives its receive WQE back: the SEND starts again.
                if *offset == 0 {
                    if let Some(InMsg::Send { wqe, .. }) = q.resp.in_msg.take() {
                        put_back_recv(q, wqe);
                    }
                }
                return Err(Exec::Fault(f));
            }
            Err(_) => {
                return Err(Exec::Err {
                    nak: NakCode::RemoteOperationalError,
                    status: WcStatus::LocProtErr,
                })
            }
        }
    }
    *offset += plen as u64;
    q.resp.last_op = (!last).then_some(pkt.opcode());
    if !last {
        return Ok(());
    }
    let Some(InMsg::Send { wqe, offset }) = q.resp.in_msg.take() else {
        unreachable!()
    };
    complete_send(q, res, pkt, wqe, offset)
}

/// The first packet of an RDMA WRITE: its R_Key over the whole DMA length (a zero-length
/// WRITE names no memory), and the message the next packets continue.
#[inline]
fn start_write(q: &mut Qp, res: &Resources, pkt: &Packet<&[u8]>) -> Result<(), Exec> {
    let reth = pkt.reth().expect("first write has RETH");
    let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len() as u64);
    if len > 0 {
        check_rkey(&res.objs().keys, q, rkey, va, len, Access::REMOTE_WRITE)?;
    }
    q.resp.in_msg = Some(InMsg::Write {
        va,
        rkey,
        resid: len,
        total: len,
    });
    Ok(())
}

/// RDMA WRITE: each packet is placed through the message's R_Key at the address it has reached;
/// the last one of a WRITE with immediate completes a receive WQE.
#[inline]
pub(super) fn write(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
) -> Result<(), Exec> {
    let f = pkt.flags();
    let payload = pkt.payload();
    let plen = payload.len() as u64;
    let last = f.contains(OpFlags::LAST);
    if f.contains(OpFlags::FIRST) {
        start_write(q, res, pkt)?;
    }
    let Some(InMsg::Write {
        va,
        rkey,
        resid,
        total,
        ..
    }) = q.resp.in_msg.as_mut()
    else {
        return Err(invalid_request());
    };
    if plen > *resid || (last && plen != *resid) {
        return Err(invalid_request());
    }
    let (cva, crkey, total) = (*va, *rkey, *total);
    if plen > 0 {
        let o = res.objs();
        let region = check_rkey(&o.keys, q, crkey, cva, plen, Access::REMOTE_WRITE)?;
        if let Err(e) = place(&region, mem, cva, payload) {
            // A first packet that could not be placed starts the WRITE again.
            if f.contains(OpFlags::FIRST) {
                q.resp.in_msg = None;
            }
            return Err(e);
        }
    }
    if let Some(InMsg::Write { va, resid, .. }) = q.resp.in_msg.as_mut() {
        *va += plen;
        *resid -= plen;
    }
    q.resp.last_op = (!last).then_some(pkt.opcode());
    if last {
        q.resp.in_msg = None;
        bump_msn(q);
        if let Some(imm) = pkt.imm() {
            return complete_write(q, res, pkt, imm, total);
        }
    }
    Ok(())
}

/// RDMA READ: its R_Key over the whole length (a zero-length READ names no memory), a
/// responder resource for replays, and the responses, which take the READ's PSNs.
#[inline]
pub(super) fn read(
    q: &mut Qp,
    res: &mut Resources,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Result<(), Exec> {
    let reth = pkt.reth().expect("read has RETH");
    let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
    if len > 0 {
        check_rkey(
            &res.objs().keys,
            q,
            rkey,
            va,
            len as u64,
            Access::REMOTE_READ,
        )?;
    }
    let n = len.div_ceil(q.mtu()).max(1);
    answer(
        q,
        Resource::Read {
            first_psn: psn,
            last_psn: psn.add(n - 1),
            va,
            rkey,
            pd: q.pd,
            len,
        },
        RespOut::Read {
            psn,
            va,
            rkey,
            pd: q.pd,
            len,
            offset: 0,
            first: true,
        },
    );
    q.resp.psn = psn.add(n);
    Ok(())
}

/// CMP_SWAP and FETCH_ADD on the 8 bytes at the AtomicETH's address; the original value goes
/// back in the atomic ACK.
#[inline]
pub(super) fn atomic(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Result<(), Exec> {
    let a = pkt.atomic_eth().expect("atomic has AtomicETH");
    let va = a.va();
    let o = res.objs();
    let region = check_rkey(&o.keys, q, a.rkey(), va, 8, Access::REMOTE_ATOMIC)?;
    // One atomic at a time in the whole device: QPs of other shards may target the
    // same address.
    let _one = lock(&res.shared.atomics);
    // Both the read and the write must find their page, or neither happens.
    region.fault_in(va, 8, true).map_err(mem_exec)?;
    let mut cur = [0u8; 8];
    region.read(mem, va, &mut cur).map_err(mem_exec)?;
    let orig = u64::from_le_bytes(cur);
    let new = if pkt.opcode().rc_op() == Opcode::RC_COMPARE_SWAP {
        if orig == a.compare() {
            a.swap_add()
        } else {
            orig
        }
    } else {
        orig.wrapping_add(a.swap_add())
    };
    place(&region, mem, va, &new.to_le_bytes())?;
    answer(
        q,
        Resource::Atomic { psn, orig },
        RespOut::AtomicAck { psn, orig },
    );
    Ok(())
}

/// ATOMIC_WRITE: the 8-byte payload placed at the RETH's address, answered by an empty READ
/// response.
#[inline]
pub(super) fn atomic_write(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Result<(), Exec> {
    let reth = pkt.reth().expect("atomic write has RETH");
    let va = reth.va();
    {
        let o = res.objs();
        let region = check_rkey(&o.keys, q, reth.rkey(), va, 8, Access::REMOTE_WRITE)?;
        place(&region, mem, va, pkt.payload())?;
    }
    answer(q, Resource::Empty { psn }, RespOut::EmptyReadResp { psn });
    Ok(())
}

/// FLUSH, answered by an empty READ response.
#[inline]
pub(super) fn flush(
    q: &mut Qp,
    res: &mut Resources,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Result<(), Exec> {
    // rxe's order: the DMA length (C9-94, in `check_length`), then the R_Key with the memory
    // rights of the placement type (`check_rkey`), then the placement itself (`process_flush`).
    let reth = pkt.reth().expect("flush has RETH");
    let feth = pkt.feth().expect("flush has FETH");
    let placement = feth.placement_type();
    let need = Access::for_flush(placement);
    // Level "memory region" flushes the MR the key names, whatever the RETH's address and
    // length; every other level (rxe reads the field so) the RETH's range.
    let covered = if feth.selectivity() == flush::MR {
        match res
            .objs()
            .keys
            .lookup_remote_mr(q.pd, q.qpn.0, reth.rkey(), need)
        {
            Ok((_, len)) => len,
            Err(_) => return Err(access_error()),
        }
    } else {
        let len = reth.dma_len() as u64;
        check_rkey(&res.objs().keys, q, reth.rkey(), reth.va(), len, need)?;
        len
    };
    // Global visibility needs nothing more: the requests before this one were placed in
    // memory, in order, before it was taken, and ordinary memory is coherent. Persistence
    // cannot be given (no MR is persistent memory, `Device::reg_mr`), so a persistent
    // flush of a non-empty range fails, as rxe's fails where it cannot flush to pmem (a
    // DMA MR); an empty range succeeds there too.
    if placement & flush::PERSISTENT != 0 && covered > 0 {
        return Err(access_error());
    }
    answer(q, Resource::Empty { psn }, RespOut::EmptyReadResp { psn });
    Ok(())
}
