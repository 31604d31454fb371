//! Rings in the rxe user ABI (`struct rxe_queue_buf`) and the verbs objects that own them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rxe_core::verbs::*;

use vhost_user_rdma::abi;
use vhost_user_rdma::abi::ring as hdr;

use crate::error::Result;
use crate::ram::{GuestRam, VaMap, PAGE};

// ---------------------------------------------------------------------------------------------
// Rings in the rxe user ABI

/// A queue buffer (`struct rxe_queue_buf`) as the driver allocates and librxe maps it.
pub struct QueueBuf {
    pub map: VaMap,
    pub num_slots: u32,
    pub log2: u32,
    /// Page-list array GPA (levels 0).
    pub list_gpa: u64,
}

impl QueueBuf {
    pub(crate) fn new(ram: &Arc<GuestRam>, num_slots: u32, elem: usize) -> Result<QueueBuf> {
        let log2 = elem.next_power_of_two().trailing_zeros().max(6);
        let len = hdr::DATA + ((num_slots as u64) << log2);
        let n = len.div_ceil(PAGE) as usize;
        let pages = ram.alloc_pages(n)?;
        let map = ram.map_pages(&pages)?;
        let list_gpa = ram.page_list(&pages)?;
        map.write(0, &vec![0u8; map.len()]);
        map.atomic_u32(hdr::LOG2_ELEM_SIZE as usize)
            .store(log2, Ordering::Relaxed);
        map.atomic_u32(hdr::INDEX_MASK as usize)
            .store(num_slots - 1, Ordering::Relaxed);
        Ok(QueueBuf {
            map,
            num_slots,
            log2,
            list_gpa,
        })
    }
    pub fn desc(&self) -> abi::QueueDesc {
        abi::QueueDesc {
            pages: abi::PageListDesc {
                gpa: self.list_gpa,
                num_pages: self.map.pages.len() as u32,
                page_shift: 12,
                levels: 0,
                reserved: 0,
            },
            num_slots: self.num_slots,
            log2_elem_size: self.log2,
            reserved: 0,
        }
    }
    pub fn mask(&self) -> u32 {
        self.num_slots - 1
    }
    pub fn producer(&self) -> &AtomicU32 {
        self.map.atomic_u32(hdr::PRODUCER_INDEX as usize)
    }
    pub fn consumer(&self) -> &AtomicU32 {
        self.map.atomic_u32(hdr::CONSUMER_INDEX as usize)
    }
    pub fn notify(&self) -> &AtomicU32 {
        self.map.atomic_u32(hdr::CQ_NOTIFY as usize)
    }
    pub fn slot_off(&self, idx: u32) -> usize {
        hdr::DATA as usize + (((idx & self.mask()) as usize) << self.log2)
    }
    pub fn elem_size(&self) -> usize {
        1 << self.log2
    }
    pub fn is_full(&self) -> bool {
        let p = self.producer().load(Ordering::Relaxed);
        let c = self.consumer().load(Ordering::Acquire);
        (p.wrapping_add(1).wrapping_sub(c)) & self.mask() == 0
    }
}

pub struct Cq {
    pub cqn: u32,
    pub cqe: u32,
    pub ring: QueueBuf,
}

pub struct Qp {
    pub qpn: u32,
    pub qp_type: QpType,
    pub sq: Option<QueueBuf>,
    pub rq: Option<QueueBuf>,
    pub cap: QpCap,
}

pub struct Srq {
    pub srqn: u32,
    pub ring: QueueBuf,
    pub max_sge: u32,
}

/// A registered user buffer: bytes `offset .. offset+len` of `buf`, at IOVA `iova`.
pub struct Mr {
    pub lkey: u32,
    pub rkey: u32,
    pub buf: VaMap,
    pub len: usize,
    /// IOVA of the MR's first byte (this process's virtual address of it, unless registered
    /// with [`Guest::reg_mr_iova`]).
    pub iova: u64,
    /// Where the MR starts in `buf`.
    pub offset: usize,
}

impl Mr {
    /// The IOVA of byte `off` of the MR.
    pub fn addr(&self, off: usize) -> u64 {
        self.iova + off as u64
    }
    /// Writes `data` at byte `off` of the MR.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.buf.write(self.offset + off, data)
    }
    /// Bytes `off .. off+len` of the MR.
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        self.buf.to_vec(self.offset + off, len)
    }
    pub fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            length: len,
            lkey: self.lkey,
        }
    }
}

/// A work completion as read from the CQ ring.
pub type Wc = abi::UverbsWc;
