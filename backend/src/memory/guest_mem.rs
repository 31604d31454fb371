//! Guest memory access: the engine's [`Memory`] over guest-physical memory, page lists, and
//! ring buffers described by page lists.
//!
//! Every access is bounds-checked by vm-memory against the regions the frontend gave us; a GPA
//! outside them is an error, never a fault. Ring indices are read and written with atomic
//! loads and stores of the right ordering (acquire for the other side's index, release for
//! ours), so the guest sees entries before it sees the index that publishes them.

use std::sync::atomic::Ordering;

use rxe_core::mem::{MemError, Memory};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

use crate::abi::{PageListDesc, Status};

pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// A guest-memory access outside the guest's regions or the ring's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault;

/// Largest page list the device resolves (2^26 4 KiB pages = 256 GiB). What it may keep is
/// bounded by the page-list budget (`model::PageListBudget`), charged before a list is read.
pub const MAX_PAGES: u32 = 1 << 26;
/// Size of an indirect list page.
const LIST_PAGE: u64 = 4096;
const LIST_ENTRIES: u64 = LIST_PAGE / 8;

/// Guest-physical memory as the engine sees it.
pub struct GuestRam<'a>(pub &'a GuestMemoryMmap);

impl Memory for GuestRam<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.0
            .read_slice(buf, GuestAddress(addr))
            .map_err(|_| MemError::OutOfRange)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.0
            .write_slice(data, GuestAddress(addr))
            .map_err(|_| MemError::OutOfRange)
    }
}

/// True when `[gpa, gpa+len)` is entirely guest memory.
pub fn in_guest(mem: &GuestMemoryMmap, gpa: u64, len: u64) -> bool {
    let Ok(len) = usize::try_from(len) else {
        return false;
    };
    gpa.checked_add(len as u64).is_some() && mem.check_range(GuestAddress(gpa), len)
}

fn read_u64s(mem: &GuestMemoryMmap, gpa: u64, n: u64, out: &mut Vec<u64>) -> Result<(), Status> {
    let bytes = n.checked_mul(8).ok_or(Status::Invalid)?;
    if !in_guest(mem, gpa, bytes) {
        return Err(Status::BadAddress);
    }
    out.reserve(n as usize);
    // Through a small buffer: the list is held once (in `out`), not twice.
    let mut buf = [0u8; 4096];
    let mut done = 0u64;
    while done < bytes {
        let k = (bytes - done).min(buf.len() as u64) as usize;
        mem.read_slice(&mut buf[..k], GuestAddress(gpa + done))
            .map_err(|_| Status::BadAddress)?;
        out.extend(
            buf[..k]
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))),
        );
        done += k as u64;
    }
    Ok(())
}

/// Resolves a page list to the GPAs of its data pages and checks that every data page is
/// aligned and lies in guest memory.
pub fn resolve_page_list(
    mem: &GuestMemoryMmap,
    d: &PageListDesc,
    max_pages: u32,
) -> Result<Vec<u64>, Status> {
    if !(12..=30).contains(&d.page_shift) || d.levels > 2 || d.reserved != 0 {
        return Err(Status::Invalid);
    }
    if d.num_pages == 0 || d.num_pages > max_pages.min(MAX_PAGES) {
        return Err(Status::Invalid);
    }
    // counts[0] data pages; counts[k] entries at indirection level k (list pages of level
    // k-1); the top array at `gpa` holds counts[levels] contiguous entries.
    let mut counts = vec![d.num_pages as u64];
    for _ in 0..d.levels {
        let last = *counts.last().expect("non-empty");
        counts.push(last.div_ceil(LIST_ENTRIES));
    }
    let mut ptrs = Vec::new();
    read_u64s(mem, d.gpa, counts[d.levels as usize], &mut ptrs)?;
    for lvl in (0..d.levels as usize).rev() {
        let mut next = Vec::with_capacity(counts[lvl] as usize);
        let mut remaining = counts[lvl];
        for &lp in &ptrs {
            if lp & (LIST_PAGE - 1) != 0 {
                return Err(Status::Invalid);
            }
            let take = remaining.min(LIST_ENTRIES);
            read_u64s(mem, lp, take, &mut next)?;
            remaining -= take;
        }
        ptrs = next;
    }
    check_pages(mem, ptrs, d.page_shift)
}

fn check_pages(mem: &GuestMemoryMmap, pages: Vec<u64>, shift: u8) -> Result<Vec<u64>, Status> {
    let size = 1u64 << shift;
    for &p in &pages {
        if p & (size - 1) != 0 {
            return Err(Status::Invalid);
        }
        if !in_guest(mem, p, size) {
            return Err(Status::BadAddress);
        }
    }
    Ok(pages)
}

/// A buffer of `len` bytes spread over guest pages (a ring, an rxe_queue_buf). The page list
/// is shared: a clone (the worker takes one per ring visit) allocates nothing.
#[derive(Clone, Debug)]
pub struct PagedBuf {
    pub pages: std::sync::Arc<[u64]>,
    pub shift: u32,
    pub len: u64,
}

impl PagedBuf {
    fn extents(
        &self,
        off: u64,
        len: usize,
        mut f: impl FnMut(u64, std::ops::Range<usize>) -> Result<(), Fault>,
    ) -> Result<(), Fault> {
        let end = off.checked_add(len as u64).ok_or(Fault)?;
        if end > self.len {
            return Err(Fault);
        }
        let mask = (1u64 << self.shift) - 1;
        let mut pos = off;
        let mut done = 0usize;
        while done < len {
            let page = *self.pages.get((pos >> self.shift) as usize).ok_or(Fault)?;
            let n = ((mask + 1 - (pos & mask)) as usize).min(len - done);
            f(page + (pos & mask), done..done + n)?;
            done += n;
            pos += n as u64;
        }
        Ok(())
    }

    pub fn read(&self, mem: &GuestMemoryMmap, off: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.extents(off, buf.len(), |gpa, r| {
            mem.read_slice(&mut buf[r], GuestAddress(gpa))
                .map_err(|_| Fault)
        })
    }

    pub fn write(&self, mem: &GuestMemoryMmap, off: u64, data: &[u8]) -> Result<(), Fault> {
        self.extents(off, data.len(), |gpa, r| {
            mem.write_slice(&data[r], GuestAddress(gpa))
                .map_err(|_| Fault)
        })
    }

    fn gpa_of_word(&self, off: u64) -> Option<u64> {
        if !off.is_multiple_of(4) || off + 4 > self.len {
            return None;
        }
        let page = *self.pages.get((off >> self.shift) as usize)?;
        Some(page + (off & ((1u64 << self.shift) - 1)))
    }

    pub fn load_u32(&self, mem: &GuestMemoryMmap, off: u64, order: Ordering) -> Result<u32, Fault> {
        let gpa = self.gpa_of_word(off).ok_or(Fault)?;
        mem.load::<u32>(GuestAddress(gpa), order).map_err(|_| Fault)
    }

    pub fn store_u32(
        &self,
        mem: &GuestMemoryMmap,
        off: u64,
        v: u32,
        order: Ordering,
    ) -> Result<(), Fault> {
        let gpa = self.gpa_of_word(off).ok_or(Fault)?;
        mem.store(v, GuestAddress(gpa), order).map_err(|_| Fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0x10_0000), 0x40_0000)]).unwrap()
    }

    fn put_u64s(m: &GuestMemoryMmap, gpa: u64, v: &[u64]) {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        m.write_slice(&b, GuestAddress(gpa)).unwrap();
    }

    #[test]
    fn flat_and_indirect_page_lists() {
        let m = mem();
        let data: Vec<u64> = (0..600).map(|i| 0x10_0000 + 0x1000 * (i % 700)).collect();
        // Flat.
        put_u64s(&m, 0x3f_0000, &data[..3]);
        let d = PageListDesc {
            gpa: 0x3f_0000,
            num_pages: 3,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        };
        assert_eq!(resolve_page_list(&m, &d, 1 << 20).unwrap(), &data[..3]);
        // One level: two list pages (512 + 88 entries).
        put_u64s(&m, 0x30_0000, &data[..512]);
        put_u64s(&m, 0x30_1000, &data[512..]);
        put_u64s(&m, 0x30_2000, &[0x30_0000, 0x30_1000]);
        let d1 = PageListDesc {
            gpa: 0x30_2000,
            num_pages: 600,
            levels: 1,
            ..d
        };
        assert_eq!(resolve_page_list(&m, &d1, 1 << 20).unwrap(), data);
        // Two levels: a top array with one pointer to a list page of list pages.
        put_u64s(&m, 0x30_3000, &[0x30_0000, 0x30_1000]);
        put_u64s(&m, 0x30_4000, &[0x30_3000]);
        let d2 = PageListDesc {
            gpa: 0x30_4000,
            levels: 2,
            ..d1
        };
        assert_eq!(resolve_page_list(&m, &d2, 1 << 20).unwrap(), data);
        // A data page outside memory.
        put_u64s(&m, 0x3f_0000, &[0x10_0000, 0x9000_0000]);
        let bad = PageListDesc { num_pages: 2, ..d };
        assert_eq!(
            resolve_page_list(&m, &bad, 1 << 20),
            Err(Status::BadAddress)
        );
        // The list itself outside memory; misaligned page; absurd counts.
        let out = PageListDesc {
            gpa: 0xffff_ffff_ffff_fff0,
            ..d
        };
        assert_eq!(
            resolve_page_list(&m, &out, 1 << 20),
            Err(Status::BadAddress)
        );
        put_u64s(&m, 0x3f_0000, &[0x10_0010]);
        let mis = PageListDesc { num_pages: 1, ..d };
        assert_eq!(resolve_page_list(&m, &mis, 1 << 20), Err(Status::Invalid));
        let huge = PageListDesc {
            num_pages: u32::MAX,
            ..d
        };
        assert_eq!(resolve_page_list(&m, &huge, u32::MAX), Err(Status::Invalid));
    }

    #[test]
    fn paged_buf_crosses_pages() {
        let m = mem();
        let b = PagedBuf {
            pages: vec![0x20_0000, 0x10_0000].into(),
            shift: 12,
            len: 0x2000,
        };
        let data: Vec<u8> = (0..64u8).collect();
        b.write(&m, 0xfe0, &data).unwrap();
        let mut back = [0u8; 64];
        b.read(&m, 0xfe0, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
        let mut first = [0u8; 32];
        m.read_slice(&mut first, GuestAddress(0x20_0fe0)).unwrap();
        assert_eq!(&first[..], &data[..32]);
        assert!(b.read(&m, 0x1ff0, &mut back).is_err());
        b.store_u32(&m, 0x1080, 7, Ordering::Release).unwrap();
        assert_eq!(b.load_u32(&m, 0x1080, Ordering::Acquire).unwrap(), 7);
        assert!(b.load_u32(&m, 0x1081, Ordering::Acquire).is_err());
    }
}
