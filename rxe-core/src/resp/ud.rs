//! UD and GSI receives: no PSN sequence and no acknowledgement; each packet fills one receive
//! WQE, behind the 40-byte network header (the GRH, or 20 zero bytes and the IPv4 header).

use super::{post_recv_cqe, put_back_recv, recv_cqe, take_recv};
use crate::mem::*;
use crate::qp::*;
use crate::shared::{Drop, RecvMeta, Resources};
use crate::types::{Psn, Qpn};
use crate::verbs::*;
use crate::wire::Packet;

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
            let sum = crate::wire::ip::ones_sum(0, &h[..20]);
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

/// A UD (or GSI) receive: the Q_Key, a receive WQE, and the network header before the payload.
pub(super) fn recv(
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
    if let Err(MemError::NotPresent(f)) = r {
        // UD does not come again: the datagram is lost, its receive WQE kept, the page
        // asked for.
        res.page_fault(q.qpn, f);
        put_back_recv(q, w);
        return Err(Drop::PageFault);
    }
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
