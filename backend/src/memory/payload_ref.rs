//! Payload references: how a packet between two devices of one process (`--same-host`)
//! carries its payload with one copy, from the sender's guest memory straight into the
//! receiver's.
//!
//! The engine copies payload through [`Memory`]: the requester (or a READ responder) reads
//! guest memory into the packet it builds, the receiver writes the packet's payload into its
//! guest memory. On the sending side [`DeferringRam`] does not perform a large read into the
//! packet buffer: it checks it as the read would be checked and notes where the bytes are
//! ([`PayloadRef`]). Either the sink then resolves the notes (the read happens, as before)
//! or the packet goes to another device of the process with the notes and a hold on the
//! sender's guest memory, and there [`RefRam`] serves the engine's writes of those bytes by
//! copying from the sender's guest memory directly.
//!
//! Only RC packets travel with references: an RC send buffer stays the sender's until the
//! responder has acknowledged it, i.e. after the copy; UC and UD sends complete when they
//! leave, and may be reused at once.

use std::cell::RefCell;

use rxe_core::mem::{MemError, Memory};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use crate::memory::guest_mem::{in_guest, GuestMemoryMmap, GuestRam};

/// Reads smaller than this are copied at once (bookkeeping would cost more than the copy).
pub const MIN_REF: usize = 256;

/// `len` bytes of the packet at `off` are the guest's bytes at `gpa`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadRef {
    pub gpa: u64,
    pub off: u32,
    pub len: u32,
}

/// The sender's memory for [`rxe_core::Device::poll_transmit`]: reads of [`MIN_REF`] bytes or
/// more into the packet buffer `buf` are checked and noted, not performed.
pub struct DeferringRam<'a> {
    ram: GuestRam<'a>,
    /// The packet buffer: start address and length.
    buf: (usize, usize),
    refs: &'a RefCell<Vec<PayloadRef>>,
}

impl<'a> DeferringRam<'a> {
    pub fn new(mem: &'a GuestMemoryMmap, buf: &[u8], refs: &'a RefCell<Vec<PayloadRef>>) -> Self {
        refs.borrow_mut().clear();
        DeferringRam {
            ram: GuestRam(mem),
            buf: (buf.as_ptr() as usize, buf.len()),
            refs,
        }
    }
}

/// Where `s` lies in the buffer `(start, len)`, if it lies wholly inside.
fn offset_in(buf: (usize, usize), s: *const u8, len: usize) -> Option<usize> {
    let off = (s as usize).checked_sub(buf.0)?;
    (off.checked_add(len)? <= buf.1).then_some(off)
}

impl Memory for DeferringRam<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if buf.len() >= MIN_REF {
            if let Some(off) = offset_in(self.buf, buf.as_ptr(), buf.len()) {
                if !in_guest(self.ram.0, addr, buf.len() as u64) {
                    return Err(MemError::OutOfRange);
                }
                self.refs.borrow_mut().push(PayloadRef {
                    gpa: addr,
                    off: off as u32,
                    len: buf.len() as u32,
                });
                return Ok(());
            }
        }
        self.ram.read(addr, buf)
    }
    /// Never deferred: the page may be the driver's again once the engine lets go of the
    /// MR's table (an on-demand-paging MR, docs/virtio-rdma.md §5.10).
    fn read_now(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.ram.read(addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.ram.write(addr, data)
    }
}

/// The ranges of a packet of `len` bytes that `refs` do not stand for, in order: the bytes
/// the packet itself holds. The engine notes its reads in packet order; references out of
/// order (or overlapping) give the whole packet, one range.
pub fn unreferenced(
    len: usize,
    refs: &[PayloadRef],
) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let ordered = refs
        .windows(2)
        .all(|w| w[0].off as usize + w[0].len as usize <= w[1].off as usize);
    let refs = if ordered { refs } else { &[][..] };
    let mut p = 0usize;
    let mut i = 0usize;
    let mut whole = !ordered;
    std::iter::from_fn(move || {
        if whole {
            whole = false;
            p = len;
            return Some(0..len);
        }
        while p < len {
            let (a, b) = match refs.get(i) {
                Some(r) => (
                    (r.off as usize).min(len),
                    (r.off as usize + r.len as usize).min(len),
                ),
                None => (len, len),
            };
            i += 1;
            let gap = p..a.max(p);
            p = p.max(b);
            if !gap.is_empty() {
                return Some(gap);
            }
            if a == len {
                break;
            }
        }
        None
    })
}

/// Copies the bytes of the packet `roce` that `refs` do not stand for into `dst` (as long),
/// at the same offsets; the referenced ones are left for [`resolve`].
pub fn copy_unreferenced(roce: &[u8], refs: &[PayloadRef], dst: &mut [u8]) {
    let len = roce.len().min(dst.len());
    for r in unreferenced(len, refs) {
        dst[r.clone()].copy_from_slice(&roce[r]);
    }
}

/// Performs the reads `refs` noted: the packet in `pkt` then holds its whole payload.
pub fn resolve(mem: &GuestMemoryMmap, refs: &[PayloadRef], pkt: &mut [u8]) {
    for r in refs {
        let (off, len) = (r.off as usize, r.len as usize);
        if let Some(dst) = pkt.get_mut(off..off + len) {
            // Checked when noted, on this same memory.
            let _ = mem.read_slice(dst, GuestAddress(r.gpa));
        }
    }
}

/// Copies `len` bytes from `src` at `src_gpa` to `dst` at `dst_gpa`, region by region; either
/// range outside its guest's memory is an error, and nothing outside them is touched.
pub fn copy_between(
    src: &GuestMemoryMmap,
    src_gpa: u64,
    dst: &GuestMemoryMmap,
    dst_gpa: u64,
    len: usize,
) -> Result<(), MemError> {
    if !in_guest(src, src_gpa, len as u64) || !in_guest(dst, dst_gpa, len as u64) {
        return Err(MemError::OutOfRange);
    }
    let mut done = 0usize;
    while done < len {
        let (s, so) = src
            .to_region_addr(GuestAddress(src_gpa + done as u64))
            .ok_or(MemError::OutOfRange)?;
        let (d, dof) = dst
            .to_region_addr(GuestAddress(dst_gpa + done as u64))
            .ok_or(MemError::OutOfRange)?;
        let n = (len - done)
            .min((s.len() - so.0) as usize)
            .min((d.len() - dof.0) as usize);
        let from = s.get_slice(so, n).map_err(|_| MemError::OutOfRange)?;
        let to = d.get_slice(dof, n).map_err(|_| MemError::OutOfRange)?;
        from.copy_to_volatile_slice(to);
        done += n;
    }
    Ok(())
}

/// The receiver's memory for [`rxe_core::Device::handle_packet`] of a packet that came with
/// references: a write of bytes of the packet that a reference covers copies them from the
/// sender's guest memory instead; every other access is the receiver's guest memory's.
pub struct RefRam<'a> {
    ram: GuestRam<'a>,
    src: &'a GuestMemoryMmap,
    refs: &'a [PayloadRef],
    pkt: (usize, usize),
}

impl<'a> RefRam<'a> {
    pub fn new(
        mem: &'a GuestMemoryMmap,
        src: &'a GuestMemoryMmap,
        refs: &'a [PayloadRef],
        pkt: &[u8],
    ) -> Self {
        RefRam {
            ram: GuestRam(mem),
            src,
            refs,
            pkt: (pkt.as_ptr() as usize, pkt.len()),
        }
    }
}

impl Memory for RefRam<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.ram.read(addr, buf)
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let Some(start) = offset_in(self.pkt, data.as_ptr(), data.len()) else {
            return self.ram.write(addr, data);
        };
        let end = start + data.len();
        // The destination first, whole: a write that does not fit changes nothing.
        if !in_guest(self.ram.0, addr, data.len() as u64) {
            return Err(MemError::OutOfRange);
        }
        let mut p = start;
        while p < end {
            let at = addr + (p - start) as u64;
            let covering = self.refs.iter().find(|r| {
                let o = r.off as usize;
                o <= p && p < o + r.len as usize
            });
            match covering {
                Some(r) => {
                    let n = (r.off as usize + r.len as usize).min(end) - p;
                    let from = r.gpa + (p - r.off as usize) as u64;
                    copy_between(self.src, from, self.ram.0, at, n)?;
                    p += n;
                }
                None => {
                    // Up to the next reference (or the end): bytes the packet holds.
                    let q = self
                        .refs
                        .iter()
                        .map(|r| r.off as usize)
                        .filter(|&o| o > p)
                        .min()
                        .unwrap_or(end)
                        .min(end);
                    self.ram.write(at, &data[p - start..q - start])?;
                    p = q;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreferenced_ranges_are_the_gaps_between_references() {
        let r = |off, len| PayloadRef { gpa: 0, off, len };
        let gaps = |len, refs: &[PayloadRef]| {
            unreferenced(len, refs)
                .map(|g| (g.start, g.end))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            gaps(40, &[r(10, 5), r(20, 10)]),
            [(0, 10), (15, 20), (30, 40)]
        );
        assert_eq!(gaps(40, &[r(0, 40)]), []);
        assert_eq!(gaps(40, &[r(0, 10), r(10, 30)]), []);
        assert_eq!(gaps(40, &[]), [(0, 40)]);
        // Out of order or overlapping: the whole packet.
        assert_eq!(gaps(40, &[r(20, 5), r(10, 5)]), [(0, 40)]);
        assert_eq!(gaps(40, &[r(10, 10), r(15, 10)]), [(0, 40)]);
        // A reference past the end (never noted so) covers nothing beyond it.
        assert_eq!(gaps(40, &[r(30, 20)]), [(0, 30)]);
        let roce: Vec<u8> = (0..40).collect();
        let mut dst = [0xffu8; 40];
        copy_unreferenced(&roce, &[r(10, 20)], &mut dst);
        assert_eq!(dst[..10], roce[..10]);
        assert!(dst[10..30].iter().all(|&b| b == 0xff));
        assert_eq!(dst[30..], roce[30..]);
    }

    fn ram(base: u64, len: usize, fill: impl Fn(usize) -> u8) -> GuestMemoryMmap {
        let m = GuestMemoryMmap::from_ranges(&[(GuestAddress(base), len)]).unwrap();
        let bytes: Vec<u8> = (0..len).map(fill).collect();
        m.write_slice(&bytes, GuestAddress(base)).unwrap();
        m
    }

    /// A large read into the packet buffer is noted, not made; small reads and reads into
    /// other buffers are made; a noted read outside guest memory fails as the read would.
    /// Resolving the notes gives the packet the read would have built; a receiver's write of
    /// the packet's bytes copies the referenced ones from the sender's memory and the others
    /// from the packet, and touches nothing outside the target range.
    #[test]
    fn references_stand_for_the_reads_they_replace() {
        let a = ram(0x10000, 0x4000, |i| (i * 7 % 251) as u8);
        let b = ram(0x20000, 0x4000, |_| 0xee);
        let refs = RefCell::new(Vec::new());
        let mut pkt = vec![0u8; 1200];
        let mut small = [0u8; 16];
        {
            let d = DeferringRam::new(&a, &pkt, &refs);
            d.read(0x10100, &mut small).unwrap();
            let (head, rest) = pkt.split_at_mut(100);
            d.read(0x10000, &mut head[20..40]).unwrap(); // small: made
            d.read(0x10400, &mut rest[..1000]).unwrap(); // large: noted
            assert_eq!(
                d.read(0x13f00, &mut rest[..512]),
                Err(MemError::OutOfRange),
                "past the end of guest memory"
            );
        }
        assert_eq!(
            small[..],
            (0x100..0x110)
                .map(|i| (i * 7 % 251) as u8)
                .collect::<Vec<_>>()[..]
        );
        assert_eq!(pkt[20], 0);
        assert_eq!(pkt[120], 0);
        assert_eq!(
            refs.borrow()[..],
            [PayloadRef {
                gpa: 0x10400,
                off: 100,
                len: 1000
            }]
        );
        // What the receiver writes at 0x20010: bytes 20..1100 of the packet (20..100 held,
        // 100..1100 referenced).
        let mut whole = pkt.clone();
        resolve(&a, &refs.borrow(), &mut whole);
        assert_eq!(
            whole[100..1100],
            (0x400..0x7e8)
                .map(|i| (i * 7 % 251) as u8)
                .collect::<Vec<_>>()[..]
        );
        let refs = refs.into_inner();
        let mut r = RefRam::new(&b, &a, &refs, &pkt);
        r.write(0x20010, &pkt[20..1100]).unwrap();
        let mut got = vec![0u8; 0x10 + 1080 + 16];
        b.read_slice(&mut got, GuestAddress(0x20000)).unwrap();
        assert!(got[..0x10].iter().all(|&x| x == 0xee));
        assert_eq!(got[0x10..0x10 + 1080], whole[20..1100]);
        assert!(got[0x10 + 1080..].iter().all(|&x| x == 0xee));
        // A target range that does not fit: an error, and no byte changed.
        assert_eq!(r.write(0x23f00, &pkt[100..1100]), Err(MemError::OutOfRange));
        let mut tail = vec![0u8; 0x100];
        b.read_slice(&mut tail, GuestAddress(0x23f00)).unwrap();
        assert!(tail.iter().all(|&x| x == 0xee));
        // A write from elsewhere (a UD GRH built on the stack) is an ordinary write.
        r.write(0x21000, &[1, 2, 3]).unwrap();
        let mut g = [0u8; 3];
        b.read_slice(&mut g, GuestAddress(0x21000)).unwrap();
        assert_eq!(g, [1, 2, 3]);
    }

    /// A read of an on-demand page (`read_now`) is made at once however large: its page may
    /// be the driver's again once the engine lets go of the MR's table.
    #[test]
    fn reads_of_on_demand_pages_are_never_deferred() {
        let a = ram(0x10000, 0x4000, |i| (i * 7 % 251) as u8);
        let refs = RefCell::new(Vec::new());
        let mut pkt = vec![0u8; 1200];
        {
            let d = DeferringRam::new(&a, &pkt, &refs);
            d.read_now(0x10400, &mut pkt[100..1100]).unwrap();
        }
        assert!(refs.borrow().is_empty(), "{:?}", refs.borrow());
        assert_eq!(
            pkt[100..1100],
            (0x400..0x7e8)
                .map(|i| (i * 7 % 251) as u8)
                .collect::<Vec<_>>()[..]
        );
    }

    /// A copy across the sender's and the receiver's region boundaries goes region by region;
    /// a source range outside guest memory is refused before any byte moves.
    #[test]
    fn copies_cross_region_boundaries() {
        let a = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
        ])
        .unwrap();
        let data: Vec<u8> = (0..0x2000).map(|i| (i % 253) as u8).collect();
        a.write_slice(&data, GuestAddress(0)).unwrap();
        let b = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0x8000), 0x800),
            (GuestAddress(0x8800), 0x1800),
        ])
        .unwrap();
        copy_between(&a, 0x200, &b, 0x8100, 0x1c00).unwrap();
        let mut got = vec![0u8; 0x1c00];
        b.read_slice(&mut got, GuestAddress(0x8100)).unwrap();
        assert_eq!(got[..], data[0x200..0x1e00]);
        assert_eq!(
            copy_between(&a, 0x1f00, &b, 0x8000, 0x200),
            Err(MemError::OutOfRange)
        );
        let mut first = [0u8; 4];
        b.read_slice(&mut first, GuestAddress(0x8000)).unwrap();
        assert_eq!(first, [0; 4]);
    }
}
