//! Work queue entries as librxe and the kernel driver write them into the rings.

use std::sync::atomic::Ordering;

use rxe_core::verbs::*;

use vhost_user_rdma::abi;
use vhost_user_rdma::abi::Status;

use crate::error::{Error, Result};
use crate::rings::{Qp, QueueBuf};

pub(crate) fn post_recv_ring(rq: &QueueBuf, wr: &RecvWr) -> Result<()> {
    if rq.is_full() {
        return Err(Error::NoMemory);
    }
    let prod = rq.producer().load(Ordering::Relaxed);
    let mut slot = vec![0u8; rq.elem_size()];
    slot[0..8].copy_from_slice(&wr.wr_id.to_le_bytes());
    let total: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
    slot[abi::rwqe::DMA_LENGTH..abi::rwqe::DMA_LENGTH + 4]
        .copy_from_slice(&(total as u32).to_le_bytes());
    slot[20..24].copy_from_slice(&(total as u32).to_le_bytes()); // resid
    slot[abi::rwqe::DMA_NUM_SGE..abi::rwqe::DMA_NUM_SGE + 4]
        .copy_from_slice(&(wr.sg_list.len() as u32).to_le_bytes());
    for (i, s) in wr.sg_list.iter().enumerate() {
        let o = abi::rwqe::DMA_SGE + i * abi::SGE_SIZE;
        slot[o..o + 8].copy_from_slice(&s.addr.to_le_bytes());
        slot[o + 8..o + 12].copy_from_slice(&s.length.to_le_bytes());
        slot[o + 12..o + 16].copy_from_slice(&s.lkey.to_le_bytes());
    }
    rq.map.write(rq.slot_off(prod), &slot);
    rq.producer()
        .store((prod + 1) & rq.mask(), Ordering::Release);
    Ok(())
}

/// A REG_MR work request slot (the contract's kernel-only fast registration, §6.2): maps
/// `iova … iova+length` of MR `lkey` under the new `key` through the page list `list`, the
/// first byte `page_offset` bytes into the first page (the PAGE_OFFSET flag) or where `iova`
/// falls in a page (`None`).
#[allow(clippy::too_many_arguments)]
pub fn reg_mr_slot(
    qp: &Qp,
    wr_id: u64,
    lkey: u32,
    key: u32,
    access: Access,
    iova: u64,
    length: u64,
    list: &abi::PageListDesc,
    page_offset: Option<u32>,
) -> Result<Vec<u8>> {
    use abi::swqe as o;
    let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
    let mut wr = SendWr::new(wr_id, SendOp::LocalInv { rkey: 0 }, vec![]);
    wr.flags = SEND_SIGNALED;
    let mut slot = encode_send_wqe(&wr, 0, sq.elem_size());
    slot[o::OPCODE..o::OPCODE + 4].copy_from_slice(&abi::wr_op::REG_MR.to_le_bytes());
    slot[o::EX..o::EX + 4].copy_from_slice(&[0; 4]);
    slot[o::REG_IOVA..o::REG_IOVA + 8].copy_from_slice(&iova.to_le_bytes());
    slot[o::REG_LENGTH..o::REG_LENGTH + 8].copy_from_slice(&length.to_le_bytes());
    slot[o::REG_MR_LKEY..o::REG_MR_LKEY + 4].copy_from_slice(&lkey.to_le_bytes());
    slot[o::REG_KEY..o::REG_KEY + 4].copy_from_slice(&key.to_le_bytes());
    slot[o::REG_ACCESS..o::REG_ACCESS + 4].copy_from_slice(&access.0.to_le_bytes());
    slot[o::REG_PAGE_SHIFT] = list.page_shift;
    slot[o::REG_LEVELS] = list.levels;
    slot[o::REG_PAGE_LIST..o::REG_PAGE_LIST + 8].copy_from_slice(&list.gpa.to_le_bytes());
    slot[o::REG_NUM_PAGES..o::REG_NUM_PAGES + 4].copy_from_slice(&list.num_pages.to_le_bytes());
    if let Some(off) = page_offset {
        slot[o::REG_FLAGS] = abi::reg_flags::PAGE_OFFSET;
        slot[o::REG_PAGE_OFFSET..o::REG_PAGE_OFFSET + 4].copy_from_slice(&off.to_le_bytes());
    }
    Ok(slot)
}

/// Encodes a send work request as librxe does (`struct rxe_send_wqe`).
pub fn encode_send_wqe(wr: &SendWr, ah_num: u32, elem: usize) -> Vec<u8> {
    use abi::{swqe as o, wr_op};
    let mut s = vec![0u8; elem];
    let put32 =
        |s: &mut Vec<u8>, off: usize, v: u32| s[off..off + 4].copy_from_slice(&v.to_le_bytes());
    let put64 =
        |s: &mut Vec<u8>, off: usize, v: u64| s[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put64(&mut s, o::WR_ID, wr.wr_id);
    if let Some(srqn) = wr.xrc_remote_srqn {
        put32(&mut s, o::XRC_SRQN, srqn);
    }
    let imm_raw = |v: u32| u32::from_le_bytes(v.to_be_bytes());
    let (opcode, ex) = match &wr.op {
        SendOp::Send => (wr_op::SEND, 0),
        SendOp::SendWithImm(i) => (wr_op::SEND_WITH_IMM, imm_raw(*i)),
        SendOp::SendWithInv(k) => (wr_op::SEND_WITH_INV, *k),
        SendOp::Write { .. } => (wr_op::RDMA_WRITE, 0),
        SendOp::WriteWithImm { imm, .. } => (wr_op::RDMA_WRITE_WITH_IMM, imm_raw(*imm)),
        SendOp::Read { .. } => (wr_op::RDMA_READ, 0),
        SendOp::CompSwap { .. } => (wr_op::ATOMIC_CMP_AND_SWP, 0),
        SendOp::FetchAdd { .. } => (wr_op::ATOMIC_FETCH_AND_ADD, 0),
        SendOp::AtomicWrite { .. } => (wr_op::ATOMIC_WRITE, 0),
        SendOp::Flush { .. } => (wr_op::FLUSH, 0),
        SendOp::LocalInv { rkey } => (wr_op::LOCAL_INV, *rkey),
        SendOp::BindMw { .. } => (wr_op::BIND_MW, 0),
        SendOp::RegMr { .. } => (wr_op::REG_MR, 0),
    };
    put32(&mut s, o::OPCODE, opcode);
    put32(&mut s, o::SEND_FLAGS, wr.flags);
    put32(&mut s, o::EX, ex);
    match &wr.op {
        SendOp::Write { remote_addr, rkey }
        | SendOp::WriteWithImm {
            remote_addr, rkey, ..
        }
        | SendOp::Read { remote_addr, rkey }
        | SendOp::AtomicWrite { remote_addr, rkey } => {
            put64(&mut s, o::RDMA_REMOTE_ADDR, *remote_addr);
            put32(&mut s, o::RDMA_RKEY, *rkey);
        }
        SendOp::CompSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            put64(&mut s, o::ATOMIC_REMOTE_ADDR, *remote_addr);
            put64(&mut s, o::ATOMIC_COMPARE_ADD, *compare);
            put64(&mut s, o::ATOMIC_SWAP, *swap);
            put32(&mut s, o::ATOMIC_RKEY, *rkey);
        }
        SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            put64(&mut s, o::ATOMIC_REMOTE_ADDR, *remote_addr);
            put64(&mut s, o::ATOMIC_COMPARE_ADD, *add);
            put32(&mut s, o::ATOMIC_RKEY, *rkey);
        }
        SendOp::BindMw {
            mw_rkey,
            new_rkey,
            mr_lkey,
            addr,
            length,
            access,
        } => {
            put64(&mut s, o::MW_ADDR, *addr);
            put64(&mut s, o::MW_LENGTH, *length);
            put32(&mut s, o::MW_MR_LKEY, *mr_lkey);
            put32(&mut s, o::MW_MW_RKEY, *mw_rkey);
            put32(&mut s, o::MW_RKEY, *new_rkey);
            put32(&mut s, o::MW_ACCESS, access.0);
        }
        _ => {}
    }
    if let Some(ud) = &wr.ud {
        put32(&mut s, o::UD_REMOTE_QPN, ud.remote_qpn.0);
        put32(&mut s, o::UD_REMOTE_QKEY, ud.remote_qkey);
        put32(&mut s, o::UD_AH_NUM, ah_num);
        if ah_num == 0 {
            let a = o::UD_AV;
            s[a + abi::av::PORT_NUM] = 1;
            s[a + abi::av::NETWORK_TYPE] = if ud.av.dgid.ipv4().is_some() { 1 } else { 2 };
            s[a + abi::av::DMAC..a + abi::av::DMAC + 6].copy_from_slice(&ud.av.dmac);
            s[a + abi::av::DGID..a + abi::av::DGID + 16].copy_from_slice(&ud.av.dgid.0);
            put32(&mut s, a + abi::av::FLOW_LABEL, ud.av.flow_label);
            s[a + abi::av::SGID_INDEX] = ud.av.sgid_index;
            s[a + abi::av::HOP_LIMIT] = ud.av.hop_limit;
            s[a + abi::av::TRAFFIC_CLASS] = ud.av.traffic_class;
        }
    }
    let inline = wr.flags & SEND_INLINE != 0;
    let length: u64 = if inline {
        wr.inline_data.len() as u64
    } else {
        wr.sg_list.iter().map(|x| x.length as u64).sum()
    };
    put32(&mut s, o::DMA_LENGTH, length as u32);
    put32(&mut s, o::DMA_RESID, length as u32);
    put32(
        &mut s,
        o::DMA_NUM_SGE,
        if inline { 1 } else { wr.sg_list.len() as u32 },
    );
    if inline {
        s[o::DMA_DATA..o::DMA_DATA + wr.inline_data.len()].copy_from_slice(&wr.inline_data);
    } else {
        for (i, g) in wr.sg_list.iter().enumerate() {
            let b = o::DMA_DATA + i * abi::SGE_SIZE;
            put64(&mut s, b, g.addr);
            put32(&mut s, b + 8, g.length);
            put32(&mut s, b + 12, g.lkey);
        }
    }
    s
}
