//! Rings in guest memory in the Linux rxe user ABI (`struct rxe_queue_buf`), and the entries
//! that travel through them: send WQEs and receive WQEs in, `ib_uverbs_wc` out.
//!
//! The device never trusts the header fields the driver wrote (`log2_elem_size`,
//! `index_mask`): it uses the sizes from the create command. Indices read from the guest are
//! masked with the ring's own mask, so an absurd index names some slot of the ring and never
//! memory outside it. Every WQE field is validated before the engine sees it.

use std::sync::atomic::Ordering;

use rxe_core::mem::Backing;
use rxe_core::verbs::*;
use rxe_core::{Gid, Qpn};
use vm_memory::ByteValued;

use crate::abi::{self, ring as hdr, swqe, wr_op, QueueDesc, Status, UverbsWc};
use crate::memory::guest_mem::{resolve_page_list, Fault, GuestMemoryMmap, PagedBuf};

/// Largest ring the device accepts, in slots.
pub const MAX_SLOTS: u32 = 1 << 16;
/// Largest slot.
pub const MAX_LOG2_ELEM: u32 = 14;
/// Largest ring in bytes.
pub const MAX_RING_BYTES: u64 = 256 << 20;

/// A ring buffer mapped through a page list.
#[derive(Clone, Debug)]
pub struct Ring {
    pub buf: PagedBuf,
    pub num_slots: u32,
    pub log2_elem: u32,
}

impl Ring {
    /// Validates a queue descriptor and resolves its pages. `min_elem` is the smallest slot the
    /// queue's contents need; `min_capacity` the number of entries it must hold.
    pub fn new(
        mem: &GuestMemoryMmap,
        d: &QueueDesc,
        min_elem: usize,
        min_capacity: u32,
    ) -> Result<Ring, Status> {
        if d.reserved != 0
            || !d.num_slots.is_power_of_two()
            || !(2..=MAX_SLOTS).contains(&d.num_slots)
            || d.log2_elem_size > MAX_LOG2_ELEM
            || (1usize << d.log2_elem_size) < min_elem
            || d.num_slots - 1 < min_capacity
        {
            return Err(Status::Invalid);
        }
        let len = hdr::DATA + ((d.num_slots as u64) << d.log2_elem_size);
        if len > MAX_RING_BYTES {
            return Err(Status::Invalid);
        }
        let page = 1u64 << d.pages.page_shift.clamp(12, 30);
        let need = len.div_ceil(page);
        if (d.pages.num_pages as u64) < need {
            return Err(Status::Invalid);
        }
        let pages = resolve_page_list(mem, &d.pages, need as u32)?;
        Ok(Ring {
            buf: PagedBuf {
                pages: pages.into(),
                shift: d.pages.page_shift as u32,
                len,
            },
            num_slots: d.num_slots,
            log2_elem: d.log2_elem_size,
        })
    }

    pub fn mask(&self) -> u32 {
        self.num_slots - 1
    }
    pub fn elem_size(&self) -> usize {
        1 << self.log2_elem
    }
    fn slot_off(&self, idx: u32) -> u64 {
        hdr::DATA + (((idx & self.mask()) as u64) << self.log2_elem)
    }

    /// The other side's index (acquire), masked.
    pub fn load_index(&self, mem: &GuestMemoryMmap, off: u64) -> Result<u32, Fault> {
        Ok(self.buf.load_u32(mem, off, Ordering::Acquire)? & self.mask())
    }
    /// Publishes our index (release).
    pub fn store_index(&self, mem: &GuestMemoryMmap, off: u64, v: u32) -> Result<(), Fault> {
        self.buf
            .store_u32(mem, off, v & self.mask(), Ordering::Release)
    }

    pub fn read_slot(&self, mem: &GuestMemoryMmap, idx: u32, out: &mut [u8]) -> Result<(), Fault> {
        let n = out.len().min(self.elem_size());
        self.buf.read(mem, self.slot_off(idx), &mut out[..n])
    }
    pub fn write_slot(&self, mem: &GuestMemoryMmap, idx: u32, data: &[u8]) -> Result<(), Fault> {
        if data.len() > self.elem_size() {
            return Err(Fault);
        }
        self.buf.write(mem, self.slot_off(idx), data)
    }

    /// Initialises the header the way the rxe kernel driver does (for a fresh ring; used by
    /// RESIZE_CQ on the new ring).
    pub fn init_header(&self, mem: &GuestMemoryMmap) -> Result<(), Fault> {
        self.buf
            .store_u32(mem, hdr::LOG2_ELEM_SIZE, self.log2_elem, Ordering::Relaxed)?;
        self.buf
            .store_u32(mem, hdr::INDEX_MASK, self.mask(), Ordering::Relaxed)?;
        self.store_index(mem, hdr::PRODUCER_INDEX, 0)?;
        self.store_index(mem, hdr::CONSUMER_INDEX, 0)
    }
}

/// Size a send-queue slot needs for the given caps.
pub fn send_wqe_size(max_sge: u32, max_inline: u32) -> usize {
    swqe::SIZE + (max_sge as usize * abi::SGE_SIZE).max(max_inline as usize)
}
/// Size a receive-queue slot needs.
pub fn recv_wqe_size(max_sge: u32) -> usize {
    abi::rwqe::SIZE + max_sge as usize * abi::SGE_SIZE
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// Why a WQE was refused (becomes an error completion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BadWqe {
    Opcode,
    NumSge,
    Length,
    Ah,
    PageList,
}

/// What the decoder needs to know about the QP.
#[derive(Clone, Copy, Debug)]
pub struct SqCaps {
    pub max_sge: u32,
    pub max_inline: u32,
    pub ud: bool,
    /// An XRC INI QP: every WQE names its remote XRC SRQ (`swqe::XRC_SRQN`).
    pub xrc: bool,
}

fn sges(slot: &[u8], base: usize, n: u32) -> SgList {
    (0..n as usize)
        .map(|i| {
            let o = base + i * abi::SGE_SIZE;
            Sge {
                addr: u64_at(slot, o),
                length: u32_at(slot, o + 8),
                lkey: u32_at(slot, o + 12),
            }
        })
        .collect()
}

/// Reads an `rxe_av` (88 bytes at `off`).
pub fn decode_av(slot: &[u8], off: usize) -> Av {
    let mut dgid = [0u8; 16];
    dgid.copy_from_slice(&slot[off + abi::av::DGID..off + abi::av::DGID + 16]);
    let mut dmac = [0u8; 6];
    dmac.copy_from_slice(&slot[off + abi::av::DMAC..off + abi::av::DMAC + 6]);
    Av {
        dgid: Gid(dgid),
        sgid_index: slot[off + abi::av::SGID_INDEX],
        flow_label: u32_at(slot, off + abi::av::FLOW_LABEL) & 0xf_ffff,
        traffic_class: slot[off + abi::av::TRAFFIC_CLASS],
        hop_limit: slot[off + abi::av::HOP_LIMIT],
        dmac,
    }
}

/// Decodes one send WQE slot (the slot is `elem_size` bytes). `ah` resolves an AH number;
/// `mem` resolves fast-registration page lists.
pub fn decode_send_wqe(
    slot: &[u8],
    caps: SqCaps,
    ah: &dyn Fn(u32) -> Option<Av>,
    mem: &GuestMemoryMmap,
) -> Result<SendWr, (u64, BadWqe)> {
    if slot.len() < swqe::SIZE {
        return Err((0, BadWqe::Length));
    }
    let wr_id = u64_at(slot, swqe::WR_ID);
    let bad = |e| (wr_id, e);
    let opcode = u32_at(slot, swqe::OPCODE);
    let mut flags = u32_at(slot, swqe::SEND_FLAGS)
        & (SEND_FENCE | SEND_SIGNALED | SEND_SOLICITED | SEND_INLINE);
    let ex = u32_at(slot, swqe::EX);
    let imm = u32::from_be_bytes(ex.to_le_bytes());
    let rdma = || {
        (
            u64_at(slot, swqe::RDMA_REMOTE_ADDR),
            u32_at(slot, swqe::RDMA_RKEY),
        )
    };
    let atomic_addr = u64_at(slot, swqe::ATOMIC_REMOTE_ADDR);
    let atomic_rkey = u32_at(slot, swqe::ATOMIC_RKEY);
    let op = match opcode {
        wr_op::SEND => SendOp::Send,
        wr_op::SEND_WITH_IMM => SendOp::SendWithImm(imm),
        wr_op::SEND_WITH_INV => SendOp::SendWithInv(ex),
        wr_op::RDMA_WRITE => {
            let (remote_addr, rkey) = rdma();
            SendOp::Write { remote_addr, rkey }
        }
        wr_op::RDMA_WRITE_WITH_IMM => {
            let (remote_addr, rkey) = rdma();
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            }
        }
        wr_op::RDMA_READ => {
            let (remote_addr, rkey) = rdma();
            SendOp::Read { remote_addr, rkey }
        }
        wr_op::ATOMIC_CMP_AND_SWP => SendOp::CompSwap {
            remote_addr: atomic_addr,
            rkey: atomic_rkey,
            compare: u64_at(slot, swqe::ATOMIC_COMPARE_ADD),
            swap: u64_at(slot, swqe::ATOMIC_SWAP),
        },
        wr_op::ATOMIC_FETCH_AND_ADD => SendOp::FetchAdd {
            remote_addr: atomic_addr,
            rkey: atomic_rkey,
            add: u64_at(slot, swqe::ATOMIC_COMPARE_ADD),
        },
        wr_op::ATOMIC_WRITE => {
            let (remote_addr, rkey) = rdma();
            SendOp::AtomicWrite { remote_addr, rkey }
        }
        // librxe's ibv_wr_flush fills `wr.flush` but for its length, which it puts in
        // dma.length (and dma.resid; the address also in iova): rxe sends dma.resid in the
        // RETH and reports dma.length in the completion. No SGEs.
        wr_op::FLUSH => SendOp::Flush {
            remote_addr: u64_at(slot, swqe::FLUSH_REMOTE_ADDR),
            rkey: u32_at(slot, swqe::FLUSH_RKEY),
            len: u32_at(slot, swqe::DMA_LENGTH),
            selectivity: slot[swqe::FLUSH_LEVEL],
            placement: slot[swqe::FLUSH_TYPE],
        },
        wr_op::LOCAL_INV => SendOp::LocalInv { rkey: ex },
        wr_op::BIND_MW => SendOp::BindMw {
            mw_rkey: u32_at(slot, swqe::MW_MW_RKEY),
            new_rkey: u32_at(slot, swqe::MW_RKEY),
            mr_lkey: u32_at(slot, swqe::MW_MR_LKEY),
            addr: u64_at(slot, swqe::MW_ADDR),
            length: u64_at(slot, swqe::MW_LENGTH),
            // Only remote rights (and zero-based) mean something for a window; rxe ignores
            // the rest, and librxe users pass LOCAL_WRITE along (pyverbs' MW tests do).
            access: Access(
                u32_at(slot, swqe::MW_ACCESS) & (Access::REMOTE.0 | Access::ZERO_BASED.0),
            ),
        },
        wr_op::REG_MR => decode_reg_mr(slot, mem).map_err(bad)?,
        _ => return Err(bad(BadWqe::Opcode)),
    };
    let num_sge = u32_at(slot, swqe::DMA_NUM_SGE);
    let length = u32_at(slot, swqe::DMA_LENGTH);
    let room = slot.len().saturating_sub(swqe::DMA_DATA);
    // librxe's ibv_wr_atomic_write puts the 8 bytes in dma.atomic_wr (where inline data
    // goes) with no SGE and no INLINE flag; rxe sends them from there.
    let atomic_wr = (opcode == wr_op::ATOMIC_WRITE && num_sge == 0 && length == 8)
        .then(|| slot.get(swqe::DMA_DATA..swqe::DMA_DATA + 8))
        .flatten();
    // A FLUSH carries no data (oA19-2): rxe never looks at its SGEs or inline flag.
    let no_data = op.is_local() || matches!(op, SendOp::Flush { .. });
    if matches!(op, SendOp::Flush { .. }) {
        flags &= !SEND_INLINE;
    }
    let (sg_list, inline_data) = if let Some(d) = atomic_wr {
        // to the engine these 8 bytes are inline data
        flags |= SEND_INLINE;
        (SgList::new(), d.to_vec())
    } else if flags & SEND_INLINE != 0 && !no_data {
        if length > caps.max_inline || length as usize > room {
            return Err(bad(BadWqe::Length));
        }
        let d = &slot[swqe::DMA_DATA..swqe::DMA_DATA + length as usize];
        (SgList::new(), d.to_vec())
    } else if no_data {
        (SgList::new(), Vec::new())
    } else {
        if num_sge > caps.max_sge || num_sge as usize * abi::SGE_SIZE > room {
            return Err(bad(BadWqe::NumSge));
        }
        (sges(slot, swqe::DMA_DATA, num_sge), Vec::new())
    };
    let ud = if caps.ud && !op.is_local() {
        let ah_num = u32_at(slot, swqe::UD_AH_NUM);
        let av = if ah_num != 0 {
            ah(ah_num).ok_or(bad(BadWqe::Ah))?
        } else {
            decode_av(slot, swqe::UD_AV)
        };
        Some(UdDest {
            av,
            remote_qpn: Qpn(u32_at(slot, swqe::UD_REMOTE_QPN) & 0xff_ffff),
            remote_qkey: u32_at(slot, swqe::UD_REMOTE_QKEY),
        })
    } else {
        None
    };
    // Local operations (LOCAL_INV, BIND_MW, REG_MR) send nothing: no SRQ.
    let xrc_remote_srqn =
        (caps.xrc && !op.is_local()).then(|| u32_at(slot, swqe::XRC_SRQN) & 0xff_ffff);
    Ok(SendWr {
        wr_id,
        op,
        flags,
        sg_list,
        inline_data,
        ud,
        xrc_remote_srqn,
    })
}

/// The REG_MR part of a send WQE: its page list resolved in guest memory.
#[inline]
fn decode_reg_mr(slot: &[u8], mem: &GuestMemoryMmap) -> Result<SendOp, BadWqe> {
    let page_shift = slot[swqe::REG_PAGE_SHIFT];
    let length = u64_at(slot, swqe::REG_LENGTH);
    let iova = u64_at(slot, swqe::REG_IOVA);
    let d = abi::PageListDesc {
        gpa: u64_at(slot, swqe::REG_PAGE_LIST),
        num_pages: u32_at(slot, swqe::REG_NUM_PAGES),
        page_shift,
        levels: slot[swqe::REG_LEVELS],
        reserved: 0,
    };
    let flags = slot[swqe::REG_FLAGS];
    if flags & !abi::reg_flags::PAGE_OFFSET != 0 {
        return Err(BadWqe::PageList);
    }
    let pages = resolve_page_list(mem, &d, 1 << 20).map_err(|_| BadWqe::PageList)?;
    // page_shift is 12 ..= 30 here (resolve_page_list checked it). Without the flag,
    // the first byte is where the IOVA falls in a page (the rule before the flag); the
    // engine refuses an offset beyond the first page.
    let page_offset = if flags & abi::reg_flags::PAGE_OFFSET != 0 {
        u32_at(slot, swqe::REG_PAGE_OFFSET) as u64
    } else {
        iova & ((1u64 << page_shift) - 1)
    };
    Ok(SendOp::RegMr {
        lkey: u32_at(slot, swqe::REG_MR_LKEY),
        key: u32_at(slot, swqe::REG_KEY),
        access: Access(u32_at(slot, swqe::REG_ACCESS)),
        iova,
        length,
        page_shift,
        page_offset,
        pages,
    })
}

/// Decodes one receive WQE slot.
pub fn decode_recv_wqe(slot: &[u8], max_sge: u32) -> Result<RecvWr, (u64, BadWqe)> {
    if slot.len() < abi::rwqe::SIZE {
        return Err((0, BadWqe::Length));
    }
    let wr_id = u64_at(slot, abi::rwqe::WR_ID);
    let n = u32_at(slot, abi::rwqe::DMA_NUM_SGE);
    let room = slot.len().saturating_sub(abi::rwqe::DMA_SGE);
    if n > max_sge || n as usize * abi::SGE_SIZE > room {
        return Err((wr_id, BadWqe::NumSge));
    }
    Ok(RecvWr {
        wr_id,
        sg_list: sges(slot, abi::rwqe::DMA_SGE, n),
    })
}

/// Encodes an engine completion as the `ib_uverbs_wc` librxe reads.
pub fn encode_cqe(c: &Cqe) -> UverbsWc {
    let ex = if c.wc_flags & WC_WITH_IMM != 0 {
        // imm_data is __be32: the wire bytes, unchanged.
        u32::from_le_bytes(c.imm_or_inv.to_be_bytes())
    } else {
        c.imm_or_inv
    };
    UverbsWc {
        wr_id: c.wr_id,
        status: c.status as u32,
        opcode: c.opcode as u32,
        vendor_err: c.vendor_err,
        byte_len: c.byte_len,
        ex,
        qp_num: c.qp_num.0,
        src_qp: c.src_qp.0,
        wc_flags: c.wc_flags,
        pkey_index: c.pkey_index,
        slid: c.slid,
        sl: c.sl,
        dlid_path_bits: c.dlid_path_bits,
        port_num: 1,
        reserved: 0,
    }
}

/// An error completion for a WQE the device refused.
pub fn error_cqe(wr_id: u64, qpn: u32, opcode: u32, status: WcStatus) -> UverbsWc {
    UverbsWc {
        wr_id,
        status: status as u32,
        opcode,
        qp_num: qpn,
        port_num: 1,
        ..Default::default()
    }
}

pub fn cqe_bytes(wc: &UverbsWc) -> &[u8] {
    wc.as_slice()
}

/// Memory-region backing from resolved pages, the MR's first byte `page_offset` bytes into
/// the first.
pub fn pages_backing(page_shift: u8, page_offset: u64, pages: Vec<u64>) -> Backing {
    Backing::Pages {
        page_shift,
        page_offset,
        pages,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn put(slot: &mut [u8], off: usize, v: &[u8]) {
        slot[off..off + v.len()].copy_from_slice(v);
    }

    /// A FLUSH slot as librxe's `ibv_wr_flush` fills it: `wr.flush` without its length, which
    /// goes into `dma.length`/`dma.resid`, and the address again in `iova`; no SGEs. Here
    /// `wr.flush.length` holds a decoy: neither librxe nor rxe use it.
    fn flush_slot(flags: u32, num_sge: u32) -> Vec<u8> {
        let mut s = vec![0u8; 256];
        put(&mut s, swqe::WR_ID, &0x1234u64.to_le_bytes());
        put(&mut s, swqe::OPCODE, &wr_op::FLUSH.to_le_bytes());
        put(&mut s, swqe::SEND_FLAGS, &flags.to_le_bytes());
        put(
            &mut s,
            swqe::FLUSH_REMOTE_ADDR,
            &0x7f00_1000u64.to_le_bytes(),
        );
        put(&mut s, swqe::FLUSH_LENGTH, &77u32.to_le_bytes());
        put(&mut s, swqe::FLUSH_RKEY, &0x1a2bu32.to_le_bytes());
        s[swqe::FLUSH_TYPE] = flush::PERSISTENT;
        s[swqe::FLUSH_LEVEL] = flush::MR;
        put(&mut s, swqe::IOVA, &0x7f00_1000u64.to_le_bytes());
        put(&mut s, swqe::DMA_LENGTH, &12_345_678u32.to_le_bytes());
        put(&mut s, swqe::DMA_RESID, &12_345_678u32.to_le_bytes());
        put(&mut s, swqe::DMA_NUM_SGE, &num_sge.to_le_bytes());
        s
    }

    #[test]
    fn flush_wqes_decode_as_librxe_writes_them() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x10_0000), 0x1000)]).unwrap();
        let caps = SqCaps {
            max_sge: 1,
            max_inline: 16,
            ud: false,
            xrc: false,
        };
        let want = SendOp::Flush {
            remote_addr: 0x7f00_1000,
            rkey: 0x1a2b,
            len: 12_345_678,
            selectivity: flush::MR,
            placement: flush::PERSISTENT,
        };
        let w = decode_send_wqe(&flush_slot(SEND_SIGNALED, 0), caps, &|_| None, &mem).unwrap();
        assert_eq!((w.wr_id, &w.op, w.flags), (0x1234, &want, SEND_SIGNALED));
        assert!(w.sg_list.is_empty() && w.inline_data.is_empty());
        // A FLUSH carries no data: SGE counts and the inline flag (with a length far beyond
        // the inline limit) are not looked at.
        let w = decode_send_wqe(
            &flush_slot(SEND_SIGNALED | SEND_INLINE, 99),
            caps,
            &|_| None,
            &mem,
        )
        .unwrap();
        assert_eq!((&w.op, w.flags), (&want, SEND_SIGNALED));
        assert!(w.sg_list.is_empty() && w.inline_data.is_empty());
    }
}
