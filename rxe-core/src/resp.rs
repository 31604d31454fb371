//! The responder (Linux `rxe_resp.c`): PSN and opcode-sequence checks, receive WQE and
//! responder-resource checks, R_Key validation, execution of SEND / WRITE / READ / atomics /
//! FLUSH / ATOMIC_WRITE, duplicate handling from the responder resources, and the ACKs, NAKs
//! and READ responses that go back.

use crate::device::lock;
use crate::device::{Drop, RecvMeta, Resources, Transmit};
use crate::icrc::rc_udp_sport;
use crate::mem::*;
use crate::qp::*;
use crate::types::{Gid, Psn, Qpn};
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
    };
    if !ok {
        return Err(Drop::Unexpected);
    }
    if !q.resp.comm_est {
        q.resp.comm_est = true;
        if q.state() == QpState::Rtr && q.is_connected() {
            res.events.push_back(AsyncEvent::CommEst { qpn: q.qpn });
        }
    }
    match q.qp_type {
        QpType::Ud | QpType::Gsi => ud_recv(q, res, mem, meta, pkt),
        QpType::Rc => rc_recv(q, res, mem, pkt),
        QpType::Uc => uc_recv(q, res, mem, pkt),
    }
}

/// The 40-byte network header a UD receive buffer gets first: for IPv4, 20 zero bytes and the
/// IPv4 header; for IPv6, the IPv6 header.
fn grh(meta: &RecvMeta, pkt_len: usize) -> ([u8; 40], u8) {
    let mut g = [0u8; 40];
    let udp_len = 8 + pkt_len;
    match (meta.src.ipv4(), meta.dst.ipv4()) {
        (Some(s), Some(d)) => {
            let h = &mut g[20..];
            h[0] = 0x45;
            h[1] = meta.traffic_class;
            h[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
            h[6] = 0x40; // DF
            h[8] = meta.hop_limit;
            h[9] = 17;
            h[12..16].copy_from_slice(&s);
            h[16..20].copy_from_slice(&d);
            let mut sum = 0u32;
            for c in h.chunks(2) {
                sum += u16::from_be_bytes([c[0], c[1]]) as u32;
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
            (g, 2)
        }
        _ => {
            let w =
                0x6000_0000u32 | ((meta.traffic_class as u32) << 20) | (meta.flow_label & 0xf_ffff);
            g[0..4].copy_from_slice(&w.to_be_bytes());
            g[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
            g[6] = 17;
            g[7] = meta.hop_limit;
            g[8..24].copy_from_slice(&meta.src.0);
            g[24..40].copy_from_slice(&meta.dst.0);
            (g, 3)
        }
    }
}

fn ud_recv(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    meta: &RecvMeta,
    pkt: &Packet<&[u8]>,
) -> Result<(), Drop> {
    let deth = pkt.deth().ok_or(Drop::Unexpected)?;
    if deth.qkey() != q.attr.qkey {
        return Err(Drop::BadQkey);
    }
    let Some(w) = take_recv(q, res) else {
        return Err(Drop::NoReceiveWqe);
    };
    let payload = pkt.payload();
    let mut cqe = recv_cqe(q, w.wr_id, WcStatus::Success, WcOpcode::Recv, 0);
    let total = 40 + payload.len() as u64;
    if total > w.len {
        cqe.status = WcStatus::LocLenErr;
        post_recv_cqe(q, res, cqe, false);
        return Ok(());
    }
    let (g, nht) = grh(meta, pkt.as_bytes().len());
    let r = {
        let keys = &res.objs().keys;
        copy_to_sges(keys, mem, q.pd, &w.sges, 0, &g)
            .and_then(|_| copy_to_sges(keys, mem, q.pd, &w.sges, 40, payload))
    };
    if r.is_err() {
        cqe.status = WcStatus::LocProtErr;
        post_recv_cqe(q, res, cqe, false);
        return Ok(());
    }
    cqe.byte_len = total as u32;
    cqe.src_qp = Qpn(deth.src_qp());
    cqe.wc_flags = WC_GRH;
    cqe.network_hdr_type = nht;
    if let Some(imm) = pkt.imm() {
        cqe.wc_flags |= WC_WITH_IMM;
        cqe.imm_or_inv = imm;
    }
    q.resp.psn = Psn::new(pkt.bth().psn()).next();
    post_recv_cqe(q, res, cqe, pkt.bth().solicited());
    Ok(())
}

/// Is `op` allowed to follow `last` (None: between messages)? IBTA 9.8.3 opcode sequence.
fn op_sequence_ok(last: Option<Opcode>, op: Opcode) -> bool {
    let f = op.flags();
    match last {
        None => f.contains(OpFlags::FIRST),
        Some(l) => {
            let lf = l.flags();
            !f.contains(OpFlags::FIRST)
                && ((lf.contains(OpFlags::SEND) && f.contains(OpFlags::SEND))
                    || (lf.contains(OpFlags::WRITE) && f.contains(OpFlags::WRITE)))
        }
    }
}

/// Outcome of executing one in-sequence request packet.
enum Exec {
    Ok,
    /// RNR: no receive WQE; the packet is not consumed.
    Rnr,
    /// Fatal for the message: NAK (RC) / drop (UC), and for RC the QP goes to error.
    Err {
        nak: NakCode,
        status: WcStatus,
    },
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
    let psn = Psn::new(pkt.bth().psn());
    let diff = psn.diff(q.resp.psn);
    if diff > 0 {
        if !q.resp.sent_psn_nak {
            q.resp.sent_psn_nak = true;
            let exp = q.resp.psn;
            queue_ack(q, exp, nak(NakCode::PsnSeqError));
        }
        return Err(Drop::OutOfSequence);
    }
    if diff < 0 {
        return duplicate(q, res, pkt);
    }
    q.resp.sent_psn_nak = false;
    match execute(q, res, mem, pkt, psn) {
        Exec::Ok => Ok(()),
        Exec::Rnr => {
            q.counters.rnr_naks_sent += 1;
            let syn = Syndrome::RnrNak(q.attr.min_rnr_timer).to_byte();
            push_out(q, RespOut::Ack { psn, syndrome: syn });
            Err(Drop::NoReceiveWqe)
        }
        Exec::Err { nak: code, status } => {
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

fn uc_recv(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
) -> Result<(), Drop> {
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
    match execute(q, res, mem, pkt, psn) {
        Exec::Ok => Ok(()),
        Exec::Rnr => {
            q.resp.drop_msg = !pkt.flags().contains(OpFlags::LAST);
            Err(Drop::NoReceiveWqe)
        }
        Exec::Err { .. } => {
            abort_uc(q);
            q.resp.drop_msg = !pkt.flags().contains(OpFlags::LAST);
            Err(Drop::Unexpected)
        }
    }
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

/// The responder's "invalid request" outcome: NAK 0x61, the claimed receive WQE (if any)
/// completing with REM_INV_REQ_ERR.
fn invalid_request() -> Exec {
    Exec::Err {
        nak: NakCode::InvalidRequest,
        status: WcStatus::RemInvReqErr,
    }
}

fn execute(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Exec {
    let op = pkt.opcode();
    let f = pkt.flags();
    if !op_sequence_ok(q.resp.last_op, op) {
        return invalid_request();
    }
    // Operation permitted on this QP? (rxe's `check_qp_attr_access`: a FLUSH needs the QP
    // rights of its placement type, else it is an invalid request, not an access error.)
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
        return invalid_request();
    }
    // The receive WQE of a SEND is taken before its length is checked, as rxe does
    // (`check_resource()` before `check_length()`): no WQE is an RNR NAK whatever the packet
    // holds, and a malformed first packet consumes the WQE, which then completes with the
    // error (REM_INV_REQ_ERR for a bad length) instead of being flushed without a reason.
    if f.contains(OpFlags::SEND) && f.contains(OpFlags::FIRST) {
        let Some(w) = take_recv(q, res) else {
            return Exec::Rnr;
        };
        q.resp.in_msg = Some(InMsg::Send { wqe: w, offset: 0 });
    }
    // Each of these keeps a responder resource for its replay, so none is taken without
    // any. (rxe leaves FLUSH out of this check and then uses a resource it has not got.)
    let rd_atomic = f.intersects(
        OpFlags::READ
            .union(OpFlags::ATOMIC)
            .union(OpFlags::ATOMIC_WRITE)
            .union(OpFlags::FLUSH),
    );
    if rd_atomic && q.attr.max_dest_rd_atomic == 0 {
        return invalid_request();
    }
    // WRITE with immediate needs a receive WQE: check before any data moves, so an RNR NAK
    // leaves nothing half done. rxe claims that WQE at this point too, so on RC an error
    // found from here on (length, R_Key) completes it with the error, as for a SEND.
    let rwr_write = f.contains(OpFlags::RWR) && f.contains(OpFlags::WRITE);
    if rwr_write && !recv_available(q) {
        return Exec::Rnr;
    }
    let r = execute_checked(q, res, mem, pkt, psn);
    if let Exec::Err { status, .. } = r {
        if rwr_write && q.qp_type == QpType::Rc {
            if let Some(w) = take_recv(q, res) {
                let cqe = recv_cqe(q, w.wr_id, status, WcOpcode::RecvRdmaWithImm, 0);
                post_recv_cqe(q, res, cqe, false);
            }
        }
    }
    r
}

/// [`execute`] once the operation is allowed and its receive WQE (if any) claimed: lengths,
/// keys, and the operation itself.
fn execute_checked(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    pkt: &Packet<&[u8]>,
    psn: Psn,
) -> Exec {
    let op = pkt.opcode();
    let f = pkt.flags();
    let acc_err = Exec::Err {
        nak: NakCode::RemoteAccessError,
        status: WcStatus::RemAccessErr,
    };
    let mtu = q.mtu() as usize;
    let payload = pkt.payload();
    let plen = payload.len();
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
        return invalid_request();
    }
    let rd_atomic = f.intersects(
        OpFlags::READ
            .union(OpFlags::ATOMIC)
            .union(OpFlags::ATOMIC_WRITE)
            .union(OpFlags::FLUSH),
    );
    let last = f.contains(OpFlags::LAST);
    let pd = q.pd;
    let qpn = q.qpn.0;

    if f.contains(OpFlags::SEND) {
        let Some(InMsg::Send { wqe, offset }) = q.resp.in_msg.as_mut() else {
            return invalid_request();
        };
        if *offset + plen as u64 > wqe.len {
            return Exec::Err {
                nak: NakCode::InvalidRequest,
                status: WcStatus::LocLenErr,
            };
        }
        if plen > 0 && copy_to_sges(&res.objs().keys, mem, pd, &wqe.sges, *offset, payload).is_err()
        {
            return Exec::Err {
                nak: NakCode::RemoteOperationalError,
                status: WcStatus::LocProtErr,
            };
        }
        *offset += plen as u64;
        q.resp.last_op = (!last).then_some(op);
        if last {
            let Some(InMsg::Send { wqe, offset }) = q.resp.in_msg.take() else {
                unreachable!()
            };
            let mut cqe = recv_cqe(
                q,
                wqe.wr_id,
                WcStatus::Success,
                WcOpcode::Recv,
                offset as u32,
            );
            if let Some(imm) = pkt.imm() {
                cqe.wc_flags |= WC_WITH_IMM;
                cqe.imm_or_inv = imm;
            }
            if let Some(rkey) = pkt.ieth() {
                if res.objs_mut().keys.invalidate(pd, rkey, None).is_err() {
                    let cqe = recv_cqe(q, wqe.wr_id, WcStatus::RemInvReqErr, WcOpcode::Recv, 0);
                    post_recv_cqe(q, res, cqe, false);
                    return invalid_request();
                }
                cqe.wc_flags |= WC_WITH_INV;
                cqe.imm_or_inv = rkey;
            }
            q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
            post_recv_cqe(q, res, cqe, pkt.bth().solicited());
        }
    } else if f.contains(OpFlags::WRITE) {
        if f.contains(OpFlags::FIRST) {
            let reth = pkt.reth().expect("first write has RETH");
            let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len() as u64);
            // rxe's `check_length()`, before the R_Key: beyond max_msg_sz is an invalid
            // request (C9-94), as for READ.
            if len > MAX_MSG_SZ as u64 {
                return invalid_request();
            }
            if len > 0
                && res
                    .objs()
                    .keys
                    .lookup_remote(pd, qpn, rkey, va, len, Access::REMOTE_WRITE)
                    .is_err()
            {
                return acc_err;
            }
            q.resp.in_msg = Some(InMsg::Write {
                va,
                rkey,
                resid: len,
                total: len,
            });
        }
        let Some(InMsg::Write {
            va,
            rkey,
            resid,
            total,
            ..
        }) = q.resp.in_msg.as_mut()
        else {
            return invalid_request();
        };
        if plen as u64 > *resid || (last && plen as u64 != *resid) {
            return invalid_request();
        }
        let (cva, crkey, total) = (*va, *rkey, *total);
        if plen > 0 {
            let o = res.objs();
            let r = o
                .keys
                .lookup_remote(pd, qpn, crkey, cva, plen as u64, Access::REMOTE_WRITE);
            match r {
                Ok(region) => {
                    if region.write(mem, cva, payload).is_err() {
                        return Exec::Err {
                            nak: NakCode::RemoteOperationalError,
                            status: WcStatus::RemOpErr,
                        };
                    }
                }
                Err(_) => return acc_err,
            }
        }
        if let Some(InMsg::Write { va, resid, .. }) = q.resp.in_msg.as_mut() {
            *va += plen as u64;
            *resid -= plen as u64;
        }
        q.resp.last_op = (!last).then_some(op);
        if last {
            q.resp.in_msg = None;
            q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
            if let Some(imm) = pkt.imm() {
                let Some(w) = take_recv(q, res) else {
                    return Exec::Rnr;
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
            }
        }
    } else if op == Opcode::RC_RDMA_READ_REQUEST {
        let reth = pkt.reth().expect("read has RETH");
        let (va, rkey, len) = (reth.va(), reth.rkey(), reth.dma_len());
        // rxe's `check_length()`, before the R_Key: beyond max_msg_sz is an invalid request.
        if len > MAX_MSG_SZ {
            return invalid_request();
        }
        if len > 0
            && res
                .objs()
                .keys
                .lookup_remote(pd, qpn, rkey, va, len as u64, Access::REMOTE_READ)
                .is_err()
        {
            return acc_err;
        }
        let n = len.div_ceil(mtu as u32).max(1);
        add_resource(
            q,
            Resource::Read {
                first_psn: psn,
                last_psn: psn.add(n - 1),
                va,
                rkey,
                len,
            },
        );
        q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
        push_out(
            q,
            RespOut::Read {
                psn,
                va,
                rkey,
                len,
                offset: 0,
                first: true,
            },
        );
        q.resp.psn = psn.add(n);
        return Exec::Ok;
    } else if f.contains(OpFlags::ATOMIC) {
        let a = pkt.atomic_eth().expect("atomic has AtomicETH");
        let (va, rkey) = (a.va(), a.rkey());
        if va & 7 != 0 {
            return invalid_request();
        }
        let o = res.objs();
        let region = match o
            .keys
            .lookup_remote(pd, qpn, rkey, va, 8, Access::REMOTE_ATOMIC)
        {
            Ok(r) => r,
            Err(_) => return acc_err,
        };
        // One atomic at a time in the whole device: QPs of other shards may target the
        // same address.
        let _one = crate::device::lock(&res.shared.atomics);
        let mut cur = [0u8; 8];
        if region.read(mem, va, &mut cur).is_err() {
            return Exec::Err {
                nak: NakCode::RemoteOperationalError,
                status: WcStatus::RemOpErr,
            };
        }
        let orig = u64::from_le_bytes(cur);
        let new = if op == Opcode::RC_COMPARE_SWAP {
            if orig == a.compare() {
                a.swap_add()
            } else {
                orig
            }
        } else {
            orig.wrapping_add(a.swap_add())
        };
        if region.write(mem, va, &new.to_le_bytes()).is_err() {
            return Exec::Err {
                nak: NakCode::RemoteOperationalError,
                status: WcStatus::RemOpErr,
            };
        }
        add_resource(q, Resource::Atomic { psn, orig });
        q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
        push_out(q, RespOut::AtomicAck { psn, orig });
    } else if f.contains(OpFlags::ATOMIC_WRITE) {
        let reth = pkt.reth().expect("atomic write has RETH");
        let (va, rkey) = (reth.va(), reth.rkey());
        if va & 7 != 0 {
            return invalid_request();
        }
        match res
            .objs()
            .keys
            .lookup_remote(pd, qpn, rkey, va, 8, Access::REMOTE_WRITE)
        {
            Ok(region) => {
                if region.write(mem, va, payload).is_err() {
                    return Exec::Err {
                        nak: NakCode::RemoteOperationalError,
                        status: WcStatus::RemOpErr,
                    };
                }
            }
            Err(_) => return acc_err,
        }
        add_resource(q, Resource::Empty { psn });
        q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
        push_out(q, RespOut::EmptyReadResp { psn });
    } else if f.contains(OpFlags::FLUSH) {
        // rxe's order: the DMA length (C9-94), then the R_Key with the memory rights of the
        // placement type (`check_rkey`), then the placement itself (`process_flush`).
        let reth = pkt.reth().expect("flush has RETH");
        let feth = pkt.feth().expect("flush has FETH");
        if reth.dma_len() > MAX_MSG_SZ {
            return invalid_request();
        }
        let placement = feth.placement_type();
        let need = Access::for_flush(placement);
        // Level "memory region" flushes the MR the key names, whatever the RETH's address and
        // length; every other level (rxe reads the field so) the RETH's range.
        let covered = if feth.selectivity() == flush::MR {
            match res.objs().keys.lookup_remote_mr(pd, qpn, reth.rkey(), need) {
                Ok((_, len)) => len,
                Err(_) => return acc_err,
            }
        } else {
            let len = reth.dma_len() as u64;
            match res
                .objs()
                .keys
                .lookup_remote(pd, qpn, reth.rkey(), reth.va(), len, need)
            {
                Ok(_) => len,
                Err(_) => return acc_err,
            }
        };
        // Global visibility needs nothing more: the requests before this one were placed in
        // memory, in order, before it was taken, and ordinary memory is coherent. Persistence
        // cannot be given (no MR is persistent memory, `Device::reg_mr`), so a persistent
        // flush of a non-empty range fails, as rxe's fails where it cannot flush to pmem (a
        // DMA MR); an empty range succeeds there too.
        if placement & flush::PERSISTENT != 0 && covered > 0 {
            return acc_err;
        }
        add_resource(q, Resource::Empty { psn });
        q.resp.msn = (q.resp.msn + 1) & 0xff_ffff;
        push_out(q, RespOut::EmptyReadResp { psn });
    } else {
        return invalid_request();
    }
    q.resp.psn = psn.add(span);
    if pkt.bth().ack_req() && !rd_atomic && q.qp_type == QpType::Rc {
        queue_ack(q, psn.add(span - 1), ACK);
    }
    Exec::Ok
}

/// Keeps `r` for replays, in place of the oldest resource when all are taken (rxe's
/// `get_new_resource()`). A requester that keeps to its max_rd_atomic has had the oldest
/// answered in full by then; for one that does not, what is still queued of it goes too, so
/// the queued READ data never exceeds one message per resource.
fn add_resource(q: &mut Qp, r: Resource) {
    let cap = q.attr.max_dest_rd_atomic.max(1) as usize;
    while q.resp.resources.len() >= cap {
        if let Some(old) = q.resp.resources.pop_front() {
            unqueue_resource(q, resource_psns(&old));
        }
    }
    q.resp.resources.push_back(r);
}

/// A request with a PSN before the expected one (IBTA 9.9.2.2 / rxe `duplicate_request`).
fn duplicate(q: &mut Qp, _res: &mut Resources, pkt: &Packet<&[u8]>) -> Result<(), Drop> {
    q.counters.duplicates += 1;
    let psn = Psn::new(pkt.bth().psn());
    let f = pkt.flags();
    if f.contains(OpFlags::SEND) || f.contains(OpFlags::WRITE) {
        let prev = q.resp.psn.sub(1);
        queue_ack(q, prev, ACK);
        return Err(Drop::Duplicate);
    }
    let found = q.resp.resources.iter().rev().find_map(|r| {
        let span = resource_psns(r);
        let out = match *r {
            Resource::Read {
                first_psn,
                last_psn,
                va,
                rkey,
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
    Err(Drop::Duplicate)
}

fn op_is(pkt: &Packet<&[u8]>, op: Opcode) -> bool {
    pkt.opcode() == op
}

/// Builds the next response packet of `q` (ACK, NAK, READ response, atomic ACK) into `buf`.
pub(crate) fn next_response(
    q: &mut Qp,
    res: &mut Resources,
    mem: &mut dyn Memory,
    buf: &mut [u8],
    in_memory: &dyn Fn(&Gid) -> bool,
) -> Option<Transmit> {
    let (out, msn) = q.resp.out.pop_front()?;
    let mtu = q.mtu();
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
            // To a device reached in memory, a segment of several path MTUs.
            let seg = if len - offset > mtu && in_memory(&q.attr.av.dgid) {
                crate::device::segment_payload(buf.len(), mtu)
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
            (op, psn, n)
        }
    };
    let bth = BthRepr::new(op, q.attr.dest_qp_num, psn.get(), false);
    let (total, range) = wire::emit(buf, &bth, &ext, plen as usize).ok()?;
    if let RespOut::Read {
        psn,
        va,
        rkey,
        len,
        offset,
        ..
    } = out
    {
        if plen > 0 {
            let addr = va + offset as u64;
            let ok = res
                .objs()
                .keys
                .lookup_remote(q.pd, q.qpn.0, rkey, addr, plen as u64, Access::REMOTE_READ)
                .and_then(|r| r.read(mem, addr, &mut buf[range]));
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
                    len,
                    offset: offset + plen,
                    first: false,
                },
                msn,
            ));
        }
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
