//! Memory: the [`Memory`] trait through which the engine reaches the bytes behind MRs, and the
//! MR / MW objects with their key, access and bounds checks.
//!
//! Keys are `index << 8 | key`: the upper 24 bits index the key table (shared by MRs and MWs,
//! so a key names exactly one object) and the low byte is the consumer-owned variant that
//! fast-reg and bind change.

use std::collections::BTreeMap;

use crate::verbs::{Access, Sge, WcStatus};

/// Why a memory access failed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MemError {
    /// The address range is not backed (outside guest memory, say).
    OutOfRange,
    /// No such key, or the key's variant byte does not match.
    BadKey,
    /// The key exists but does not grant the access.
    Access,
    /// A different PD, or an MW bound to a different QP.
    Protection,
    /// The object is not in a usable state (invalidated, not bound, ...).
    State,
    /// A length beyond what the SGEs/MR can hold.
    Length,
    /// Misaligned atomic.
    Alignment,
    /// A page of an on-demand-paging MR is not mapped (or mapped read-only for a write):
    /// not an error of the request, the access waits for the driver to map the page.
    NotPresent(PageFault),
}

/// A page an on-demand-paging MR needs mapped: the MR's key, the page's index in its page
/// table, and whether the access writes (a page mapped read-only must be mapped again
/// writable: the guest may have mapped a shared zero or copy-on-write page for a read).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub struct PageFault {
    pub key: u32,
    pub page: u64,
    pub write: bool,
}

/// An on-demand-paging MR's page-table entry: the page's address with these bits; 0 is a
/// page not mapped.
pub const ODP_PRESENT: u64 = 1;
/// See [`ODP_PRESENT`]: the page may be written.
pub const ODP_WRITABLE: u64 = 2;
/// An entry the driver could not map (the address is not mapped in its process, say): an
/// access fails as one outside the MR's memory would, instead of waiting.
pub const ODP_FAILED: u64 = 4;
/// The page size of on-demand-paging MRs (their page tables have an entry per 4 KiB).
pub const ODP_PAGE_SHIFT: u8 = 12;

/// Byte access to the memory behind registrations: guest-physical memory in the daemon,
/// a vector in tests. Implementations must bound-check every access.
pub trait Memory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError>;
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError>;
    /// A read that happens now, never later: for pages the driver can take back at any time
    /// (on-demand-paging MRs), whose bytes may not be copied after the engine lets go of
    /// the page table. An implementation that defers reads must not defer these.
    fn read_now(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.read(addr, buf)
    }
}

/// A flat memory starting at `base`, for tests and simulations.
#[derive(Clone, Debug)]
pub struct VecMemory {
    pub base: u64,
    pub bytes: Vec<u8>,
}

impl VecMemory {
    pub fn new(base: u64, len: usize) -> Self {
        VecMemory {
            base,
            bytes: vec![0; len],
        }
    }
    fn range(&self, addr: u64, len: usize) -> Result<core::ops::Range<usize>, MemError> {
        let off = addr.checked_sub(self.base).ok_or(MemError::OutOfRange)?;
        let off = usize::try_from(off).map_err(|_| MemError::OutOfRange)?;
        let end = off.checked_add(len).ok_or(MemError::OutOfRange)?;
        if end > self.bytes.len() {
            return Err(MemError::OutOfRange);
        }
        Ok(off..end)
    }
    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        let r = self.range(addr, len).expect("test memory range");
        &self.bytes[r]
    }
    pub fn slice_mut(&mut self, addr: u64, len: usize) -> &mut [u8] {
        let r = self.range(addr, len).expect("test memory range");
        &mut self.bytes[r]
    }
}

impl Memory for VecMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.bytes[r]);
        Ok(())
    }
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
        let r = self.range(addr, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
}

/// Validates a page list for an MR of `length` bytes whose first byte is `page_offset`
/// bytes into the first page: a page size from 512 B to 1 GiB, an offset inside the first
/// page, no overflow anywhere, every page aligned to the page size and ending below 2^64,
/// and enough pages to cover the range.
pub fn check_page_list(
    page_offset: u64,
    length: u64,
    page_shift: u8,
    pages: &[u64],
) -> Result<(), MemError> {
    if !(9..=30).contains(&page_shift) {
        return Err(MemError::Alignment);
    }
    let size = 1u64 << page_shift;
    let mask = size - 1;
    if page_offset > mask {
        return Err(MemError::Alignment);
    }
    let need = page_offset
        .checked_add(length)
        .ok_or(MemError::Length)?
        .div_ceil(size);
    if (pages.len() as u64) < need {
        return Err(MemError::Length);
    }
    if pages
        .iter()
        .any(|&p| p & mask != 0 || p.checked_add(size).is_none())
    {
        return Err(MemError::Alignment);
    }
    Ok(())
}

/// How an MR's IOVA range maps to memory addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// IOVA `iova + x` lives at `base + x` (DMA MRs, physically contiguous buffers).
    Contiguous { base: u64 },
    /// A page list: byte `x` of the MR (IOVA `iova + x`) lives at
    /// `pages[(page_offset + x) >> shift] + ((page_offset + x) & mask)`. `page_offset` is where
    /// the MR's first byte sits in the first page; it need not equal `iova & mask` (an IOVA
    /// chosen apart from the buffer's address, `ibv_reg_mr_iova`).
    Pages {
        page_shift: u8,
        page_offset: u64,
        pages: Vec<u64>,
    },
    /// A fast-reg MR not yet registered.
    Empty,
    /// An on-demand-paging MR: 4 KiB pages mapped and unmapped by the driver at any time.
    /// Byte `x` lives in entry `(page_offset + x) >> 12`, an address with [`ODP_PRESENT`]
    /// (and [`ODP_WRITABLE`]) or 0 for a page not mapped; an access to one fails with
    /// [`MemError::NotPresent`] naming `key`, the MR's own key.
    Odp {
        key: u32,
        page_offset: u64,
        entries: Vec<u64>,
    },
    /// An implicit on-demand-paging MR (`ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND)`): IOVA 0
    /// onwards, the whole address space. IOVA `x` lives in entry `x >> 12`; only the pages
    /// the driver mapped (or failed) have one, an absent entry is a page not mapped.
    OdpImplicit {
        key: u32,
        entries: BTreeMap<u64, u64>,
    },
}

impl Backing {
    /// Whether the MR's pages are mapped on demand (explicitly or implicitly).
    pub fn on_demand(&self) -> bool {
        matches!(self, Backing::Odp { .. } | Backing::OdpImplicit { .. })
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MrKind {
    User,
    Dma,
    /// Allocated for fast registration with room for `max_pages`.
    FastReg {
        max_pages: u32,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeyState {
    Valid,
    /// Invalidated (fast-reg MR or MW): must be re-registered / re-bound.
    Free,
}

#[derive(Clone, Debug)]
pub struct Mr {
    pub pd: u32,
    pub kind: MrKind,
    pub iova: u64,
    pub length: u64,
    pub access: Access,
    pub backing: Backing,
    pub state: KeyState,
    /// Number of MWs bound to this MR; it cannot be deregistered while any are.
    pub bound_mws: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MwType {
    Type1,
    Type2,
}

#[derive(Clone, Debug)]
pub struct Mw {
    pub pd: u32,
    pub mw_type: MwType,
    pub state: KeyState,
    /// Full lkey of the MR it is bound to.
    pub mr_key: u32,
    pub addr: u64,
    pub length: u64,
    pub access: Access,
    /// Type 2 windows are tied to the QP that bound them.
    pub qpn: u32,
}

#[derive(Clone, Debug)]
pub enum KeyObj {
    Mr(Mr),
    Mw(Mw),
}

#[derive(Clone, Debug)]
struct Slot {
    key: u8,
    obj: Option<KeyObj>,
}

/// The key table shared by MRs and MWs.
#[derive(Debug, Default)]
pub struct KeyTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    pub max: u32,
    /// Draws the key bytes; `None` steps them by 0x11 ([`KeyTable::new`]).
    rng: Option<crate::types::Rng>,
}

/// A resolved reference to registered memory: translate IOVAs through it.
#[derive(Clone, Copy, Debug)]
pub struct Region<'a> {
    pub iova: u64,
    pub length: u64,
    backing: &'a Backing,
    mr_iova: u64,
}

impl KeyTable {
    /// A table whose key bytes follow a fixed sequence (0x11, 0x22, … per index).
    pub fn new(max: u32) -> Self {
        KeyTable {
            slots: Vec::new(),
            free: Vec::new(),
            max,
            rng: None,
        }
    }

    /// A table whose key bytes are drawn from a generator seeded with `seed`.
    pub fn with_seed(max: u32, seed: u64) -> Self {
        KeyTable {
            rng: Some(crate::types::Rng::new(seed)),
            ..Self::new(max)
        }
    }

    /// The next key byte of a slot whose last one was `last`: never the same again, so a
    /// stale key from a freed index does not match (rxe's `rxe_get_next_key()`).
    fn next_key(&mut self, last: u8) -> u8 {
        match &mut self.rng {
            Some(r) => loop {
                let k = r.next_u64() as u8;
                if k != last {
                    break k;
                }
            },
            None => last.wrapping_add(0x11),
        }
    }

    /// Inserts an object, returning its key (index starts at 1 so key 0 is never valid).
    pub fn insert(&mut self, obj: KeyObj) -> Option<u32> {
        let idx = if let Some(i) = self.free.pop() {
            i
        } else {
            if self.slots.len() as u32 >= self.max {
                return None;
            }
            self.slots.push(Slot { key: 0, obj: None });
            self.slots.len() as u32
        };
        let last = self.slots[idx as usize - 1].key;
        let key = self.next_key(last);
        let s = &mut self.slots[idx as usize - 1];
        s.key = key;
        s.obj = Some(obj);
        Some(idx << 8 | key as u32)
    }

    pub fn remove(&mut self, key: u32) -> Option<KeyObj> {
        let idx = key >> 8;
        let s = self.slots.get_mut((idx as usize).wrapping_sub(1))?;
        if s.key != key as u8 {
            return None;
        }
        let o = s.obj.take()?;
        self.free.push(idx);
        Some(o)
    }

    /// Looks an object up by the index only (the variant byte is checked by `get`).
    pub fn get_by_index(&mut self, key: u32) -> Option<(&mut KeyObj, &mut u8)> {
        let s = self.slots.get_mut(((key >> 8) as usize).wrapping_sub(1))?;
        let Slot { key: k, obj } = s;
        obj.as_mut().map(|o| (o, k))
    }

    pub fn get(&self, key: u32) -> Option<&KeyObj> {
        let s = self.slots.get(((key >> 8) as usize).wrapping_sub(1))?;
        if s.key != key as u8 {
            return None;
        }
        s.obj.as_ref()
    }

    pub fn get_mut(&mut self, key: u32) -> Option<&mut KeyObj> {
        let s = self.slots.get_mut(((key >> 8) as usize).wrapping_sub(1))?;
        if s.key != key as u8 {
            return None;
        }
        s.obj.as_mut()
    }

    pub fn count(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    fn region_of_mr(mr: &Mr) -> Region<'_> {
        Region {
            iova: mr.iova,
            length: mr.length,
            backing: &mr.backing,
            mr_iova: mr.iova,
        }
    }

    /// The checks every use of an MR makes: same PD, valid, access granted, range inside.
    fn check_mr<'a>(
        mr: &'a Mr,
        pd: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Region<'a>, MemError> {
        if mr.pd != pd {
            return Err(MemError::Protection);
        }
        if mr.state != KeyState::Valid {
            return Err(MemError::State);
        }
        if !mr.access.contains(access) {
            return Err(MemError::Access);
        }
        check_range(mr.iova, mr.length, addr, len, mr.kind == MrKind::Dma)?;
        Ok(Self::region_of_mr(mr))
    }

    /// Resolves an lkey for a local access of `len` bytes at `addr`.
    pub fn lookup_local(
        &self,
        pd: u32,
        lkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Region<'_>, MemError> {
        match self.get(lkey) {
            Some(KeyObj::Mr(mr)) => Self::check_mr(mr, pd, addr, len, access),
            _ => Err(MemError::BadKey),
        }
    }

    /// Resolves an rkey for a remote access arriving on QP `qpn` in PD `pd`.
    pub fn lookup_remote(
        &self,
        pd: u32,
        qpn: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Result<Region<'_>, MemError> {
        match self.get(rkey) {
            Some(KeyObj::Mr(mr)) => Self::check_mr(mr, pd, addr, len, access),
            Some(KeyObj::Mw(mw)) => {
                let mr = self.check_mw(mw, pd, qpn, access)?;
                check_range(mw.addr, mw.length, addr, len, false)?;
                Ok(Region {
                    iova: mw.addr,
                    length: mw.length,
                    backing: &mr.backing,
                    mr_iova: mr.iova,
                })
            }
            None => Err(MemError::BadKey),
        }
    }

    /// Resolves an rkey as [`Self::lookup_remote`] does, without an address range: the key,
    /// PD (or the window's QP), state and access checks only. Returns the IOVA range of the
    /// memory region behind it (for a window, the MR it is bound to): what a FLUSH of
    /// selectivity level "memory region" covers (rxe flushes `mw->mr` whole).
    pub fn lookup_remote_mr(
        &self,
        pd: u32,
        qpn: u32,
        rkey: u32,
        access: Access,
    ) -> Result<(u64, u64), MemError> {
        let mr = match self.get(rkey) {
            Some(KeyObj::Mr(mr)) => {
                if mr.pd != pd {
                    return Err(MemError::Protection);
                }
                if mr.state != KeyState::Valid {
                    return Err(MemError::State);
                }
                if !mr.access.contains(access) {
                    return Err(MemError::Access);
                }
                mr
            }
            Some(KeyObj::Mw(mw)) => self.check_mw(mw, pd, qpn, access)?,
            None => return Err(MemError::BadKey),
        };
        Ok((mr.iova, mr.length))
    }

    /// Invalidates an rkey: fast-reg MRs and type 2 MWs (local invalidate, or SEND with
    /// invalidate at the responder).
    pub(crate) fn invalidate(
        &mut self,
        pd: u32,
        rkey: u32,
        qpn: Option<u32>,
    ) -> Result<(), WcStatus> {
        let mut unbind = None;
        match self.get_mut(rkey) {
            Some(KeyObj::Mr(mr)) if matches!(mr.kind, MrKind::FastReg { .. }) && mr.pd == pd => {
                if mr.bound_mws > 0 {
                    return Err(WcStatus::MwBindErr);
                }
                mr.state = KeyState::Free;
            }
            Some(KeyObj::Mw(mw))
                if mw.mw_type == MwType::Type2 && mw.pd == pd && mw.state == KeyState::Valid =>
            {
                if qpn.is_some_and(|n| n != mw.qpn) {
                    return Err(WcStatus::MwBindErr);
                }
                mw.state = KeyState::Free;
                unbind = Some(mw.mr_key);
            }
            _ => return Err(WcStatus::MwBindErr),
        }
        if let Some(Some(KeyObj::Mr(mr))) = unbind.map(|k| self.get_mut(k)) {
            mr.bound_mws = mr.bound_mws.saturating_sub(1);
        }
        Ok(())
    }

    /// The checks a remote access through a window makes (bound, its QP or PD, its rights);
    /// returns the MR it is bound to, which must be valid.
    fn check_mw(&self, mw: &Mw, pd: u32, qpn: u32, access: Access) -> Result<&Mr, MemError> {
        if mw.state != KeyState::Valid {
            return Err(MemError::State);
        }
        if mw.mw_type == MwType::Type2 && mw.qpn != qpn {
            return Err(MemError::Protection);
        }
        if mw.mw_type == MwType::Type1 && mw.pd != pd {
            return Err(MemError::Protection);
        }
        if !mw.access.contains(access) {
            return Err(MemError::Access);
        }
        match self.get(mw.mr_key) {
            Some(KeyObj::Mr(mr)) if mr.state == KeyState::Valid => Ok(mr),
            _ => Err(MemError::State),
        }
    }
}

fn check_range(
    base: u64,
    length: u64,
    addr: u64,
    len: u64,
    unbounded: bool,
) -> Result<(), MemError> {
    if unbounded {
        return addr.checked_add(len).map(|_| ()).ok_or(MemError::Length);
    }
    let end = addr.checked_add(len).ok_or(MemError::Length)?;
    if addr < base || end > base.checked_add(length).ok_or(MemError::Length)? {
        return Err(MemError::Length);
    }
    Ok(())
}

impl Region<'_> {
    /// Visits the memory extents backing `[addr, addr+len)`; the range was checked at lookup.
    fn for_each_extent(
        &self,
        addr: u64,
        len: usize,
        write: bool,
        mut f: impl FnMut(u64, core::ops::Range<usize>) -> Result<(), MemError>,
    ) -> Result<(), MemError> {
        let x = addr.wrapping_sub(self.mr_iova);
        match self.backing {
            Backing::Odp {
                key,
                page_offset,
                entries,
            } => odp_extents(*key, *page_offset, x, len, write, f, |page| {
                usize::try_from(page)
                    .ok()
                    .and_then(|i| entries.get(i).copied())
                    .ok_or(MemError::OutOfRange)
            }),
            Backing::OdpImplicit { key, entries } => {
                odp_extents(*key, 0, x, len, write, f, |page| {
                    Ok(entries.get(&page).copied().unwrap_or(0))
                })
            }
            Backing::Contiguous { base } => {
                f(base.checked_add(x).ok_or(MemError::OutOfRange)?, 0..len)
            }
            Backing::Pages {
                page_shift,
                page_offset,
                pages,
            } => {
                let start = page_offset.checked_add(x).ok_or(MemError::OutOfRange)?;
                page_runs(start, len, *page_shift as u32, f, |page| {
                    usize::try_from(page)
                        .ok()
                        .and_then(|i| pages.get(i).copied())
                        .ok_or(MemError::OutOfRange)
                })
            }
            Backing::Empty => Err(MemError::State),
        }
    }

    pub fn read(&self, mem: &dyn Memory, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if self.backing.on_demand() {
            return self.for_each_extent(addr, buf.len(), false, |pa, r| {
                mem.read_now(pa, &mut buf[r])
            });
        }
        self.for_each_extent(addr, buf.len(), false, |pa, r| mem.read(pa, &mut buf[r]))
    }

    pub fn write(&self, mem: &mut dyn Memory, addr: u64, data: &[u8]) -> Result<(), MemError> {
        self.for_each_extent(addr, data.len(), true, |pa, r| mem.write(pa, &data[r]))
    }

    /// The first page of `[addr, addr+len)` an access would fault on, if any: checked
    /// before an operation that must not stop half-way (an atomic reads, then writes).
    pub fn fault_in(&self, addr: u64, len: usize, write: bool) -> Result<(), MemError> {
        self.for_each_extent(addr, len, write, |_, _| Ok(()))
    }
}

/// [`Region::for_each_extent`] for an on-demand-paging MR: entry by entry, a run of
/// adjacent present pages being one extent. A page not present (or not writable for a
/// write) anywhere in the range stops the walk with [`MemError::NotPresent`] before any
/// byte of the range moves.
fn odp_extents(
    key: u32,
    page_offset: u64,
    x: u64,
    len: usize,
    write: bool,
    f: impl FnMut(u64, core::ops::Range<usize>) -> Result<(), MemError>,
    entry: impl Fn(u64) -> Result<u64, MemError>,
) -> Result<(), MemError> {
    let shift = ODP_PAGE_SHIFT as u32;
    let mask = (1u64 << shift) - 1;
    let start = page_offset.checked_add(x).ok_or(MemError::OutOfRange)?;
    let end = start.checked_add(len as u64).ok_or(MemError::OutOfRange)?;
    if len > 0 {
        for page in start >> shift..=(end - 1) >> shift {
            let e = entry(page)?;
            if e == ODP_FAILED {
                return Err(MemError::OutOfRange);
            }
            if e & ODP_PRESENT == 0 || (write && e & ODP_WRITABLE == 0) {
                return Err(MemError::NotPresent(PageFault { key, page, write }));
            }
        }
    }
    page_runs(start, len, shift, f, |page| Ok(entry(page)? & !mask))
}

/// Visits the memory extents of `len` bytes from byte `start` of a page list (`shift` its
/// page size), `page(i)` giving page `i`'s address: pages that follow each other in memory
/// make one extent, so a buffer the guest's pages happen to back contiguously is one call.
#[inline]
fn page_runs(
    start: u64,
    len: usize,
    shift: u32,
    mut f: impl FnMut(u64, core::ops::Range<usize>) -> Result<(), MemError>,
    page: impl Fn(u64) -> Result<u64, MemError>,
) -> Result<(), MemError> {
    let mask = (1u64 << shift) - 1;
    let mut pos = start;
    let mut done = 0usize;
    let mut run: Option<(u64, usize)> = None;
    while done < len {
        let pa = page(pos >> shift)?;
        let in_page = pos & mask;
        let n = ((mask + 1 - in_page) as usize).min(len - done);
        let at = pa.checked_add(in_page).ok_or(MemError::OutOfRange)?;
        run = match run {
            Some((start, from)) if start.checked_add((done - from) as u64) == Some(at) => {
                Some((start, from))
            }
            Some((start, from)) => {
                f(start, from..done)?;
                Some((at, done))
            }
            None => Some((at, done)),
        };
        done += n;
        pos += n as u64;
    }
    if let Some((start, from)) = run {
        f(start, from..done)?;
    }
    Ok(())
}

impl KeyTable {
    /// Maps (`entries[i]` an address with [`ODP_PRESENT`], maybe [`ODP_WRITABLE`]), unmaps
    /// (0) or marks as failed ([`ODP_FAILED`]) pages `first …` of the on-demand-paging MR `key`. An unknown key, an MR that is
    /// not on demand, a range past its table or an entry with other low bits: `Err`, and
    /// nothing changes.
    pub fn odp_update(&mut self, key: u32, first: u64, new: &[u64]) -> Result<(), MemError> {
        let mask = (1u64 << ODP_PAGE_SHIFT) - 1;
        let ok = |e: u64| {
            e == 0
                || e == ODP_FAILED
                || (e & ODP_PRESENT != 0
                    && e & mask & !(ODP_PRESENT | ODP_WRITABLE) == 0
                    && (e & !mask).checked_add(mask + 1).is_some())
        };
        match self.get_mut(key) {
            Some(KeyObj::Mr(Mr {
                backing: Backing::Odp { entries, .. },
                ..
            })) => {
                let first = usize::try_from(first).map_err(|_| MemError::Length)?;
                let end = first.checked_add(new.len()).ok_or(MemError::Length)?;
                let dst = entries.get_mut(first..end).ok_or(MemError::Length)?;
                if !new.iter().all(|&e| ok(e)) {
                    return Err(MemError::Alignment);
                }
                dst.copy_from_slice(new);
            }
            Some(KeyObj::Mr(Mr {
                backing: Backing::OdpImplicit { entries, .. },
                ..
            })) => {
                // Pages of the 64-bit IOVA space: 2^52 of them.
                let end = first
                    .checked_add(new.len() as u64)
                    .ok_or(MemError::Length)?;
                if end > 1 << (64 - ODP_PAGE_SHIFT) {
                    return Err(MemError::Length);
                }
                if !new.iter().all(|&e| ok(e)) {
                    return Err(MemError::Alignment);
                }
                for (page, &e) in (first..end).zip(new) {
                    if e == 0 {
                        entries.remove(&page);
                    } else {
                        entries.insert(page, e);
                    }
                }
            }
            _ => return Err(MemError::BadKey),
        }
        Ok(())
    }

    /// The page-table entries an on-demand-paging MR holds: its table's length, or for an
    /// implicit one the pages it has an entry for (mapped or failed). `None`: not such an MR.
    pub fn odp_entries(&self, key: u32) -> Option<u64> {
        match self.get(key) {
            Some(KeyObj::Mr(Mr {
                backing: Backing::Odp { entries, .. },
                ..
            })) => Some(entries.len() as u64),
            Some(KeyObj::Mr(Mr {
                backing: Backing::OdpImplicit { entries, .. },
                ..
            })) => Some(entries.len() as u64),
            _ => None,
        }
    }
}

/// Visits the pieces of `[offset, offset+len)` of an SGE list, checking every SGE's lkey with
/// `access`; `f` gets the resolved region, the address and the range of the flat buffer.
fn walk_sges(
    keys: &KeyTable,
    pd: u32,
    sges: &[Sge],
    mut offset: u64,
    len: usize,
    access: Access,
    mut f: impl FnMut(Region<'_>, u64, core::ops::Range<usize>) -> Result<(), MemError>,
) -> Result<(), MemError> {
    let mut done = 0usize;
    for sge in sges {
        if done == len {
            break;
        }
        let l = sge.length as u64;
        if offset >= l {
            offset -= l;
            continue;
        }
        let n = ((l - offset) as usize).min(len - done);
        let addr = sge.addr.checked_add(offset).ok_or(MemError::Length)?;
        let region = keys.lookup_local(pd, sge.lkey, addr, n as u64, access)?;
        f(region, addr, done..done + n)?;
        done += n;
        offset = 0;
    }
    if done != len {
        return Err(MemError::Length);
    }
    Ok(())
}

/// Scatters `src` into an SGE list from `offset` bytes in (needs local write access).
pub fn copy_to_sges(
    keys: &KeyTable,
    mem: &mut dyn Memory,
    pd: u32,
    sges: &[Sge],
    offset: u64,
    src: &[u8],
) -> Result<(), MemError> {
    walk_sges(
        keys,
        pd,
        sges,
        offset,
        src.len(),
        Access::LOCAL_WRITE,
        |r, a, rg| r.write(mem, a, &src[rg]),
    )
}

/// Gathers from an SGE list, `offset` bytes in, into `dst`.
pub fn copy_from_sges(
    keys: &KeyTable,
    mem: &dyn Memory,
    pd: u32,
    sges: &[Sge],
    offset: u64,
    dst: &mut [u8],
) -> Result<(), MemError> {
    walk_sges(keys, pd, sges, offset, dst.len(), Access(0), |r, a, rg| {
        r.read(mem, a, &mut dst[rg])
    })
}

/// Sum of SGE lengths, saturating (a guest may send absurd values).
pub fn sge_total(sges: &[Sge]) -> u64 {
    sges.iter().map(|s| s.length as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mr(iova: u64, length: u64, backing: Backing) -> KeyObj {
        KeyObj::Mr(Mr {
            pd: 1,
            kind: MrKind::User,
            iova,
            length,
            access: Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
            backing,
            state: KeyState::Valid,
            bound_mws: 0,
        })
    }

    #[test]
    fn page_list_translation() {
        let mut mem = VecMemory::new(0, 0x10000);
        let mut t = KeyTable::new(16);
        // IOVA 0x7000_0800.. spans two 4 KiB pages placed out of order.
        let k = t
            .insert(mr(
                0x7000_0800,
                0x1000,
                Backing::Pages {
                    page_shift: 12,
                    page_offset: 0x800,
                    pages: vec![0x5000, 0x2000],
                },
            ))
            .unwrap();
        let data: Vec<u8> = (0..0x1000u32).map(|i| i as u8).collect();
        let r = t
            .lookup_remote(1, 0, k, 0x7000_0800, 0x1000, Access::REMOTE_WRITE)
            .unwrap();
        r.write(&mut mem, 0x7000_0800, &data).unwrap();
        assert_eq!(mem.slice(0x5800, 0x800), &data[..0x800]);
        assert_eq!(mem.slice(0x2000, 0x800), &data[0x800..]);
        assert_eq!(
            t.lookup_remote(1, 0, k, 0x7000_0800, 0x1001, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemError::Length
        );
        assert_eq!(
            t.lookup_remote(1, 0, k, 0x7000_0800, 1, Access::REMOTE_READ)
                .unwrap_err(),
            MemError::Access
        );
        assert_eq!(
            t.lookup_remote(2, 0, k, 0x7000_0800, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemError::Protection
        );
        assert_eq!(
            t.lookup_remote(1, 0, k ^ 1, 0x7000_0800, 1, Access::REMOTE_WRITE)
                .unwrap_err(),
            MemError::BadKey
        );
        assert!(t.remove(k).is_some());
        assert!(t.get(k).is_none());
        let k2 = t.insert(mr(0, 1, Backing::Contiguous { base: 0 })).unwrap();
        assert_eq!(k2 >> 8, k >> 8);
        assert_ne!(k2, k, "a reused index gets a fresh key byte");
    }

    /// Pages that follow each other in memory are one access, pages that do not are apart.
    #[test]
    fn contiguous_pages_are_one_extent() {
        /// Memory that records its accesses.
        struct Log(VecMemory, Vec<(u64, usize)>);
        impl Memory for Log {
            fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemError> {
                self.0.read(addr, buf)
            }
            fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemError> {
                self.1.push((addr, data.len()));
                self.0.write(addr, data)
            }
        }
        let mut mem = Log(VecMemory::new(0, 0x10000), Vec::new());
        let mut t = KeyTable::new(4);
        let pages = vec![0x1000, 0x2000, 0x3000, 0x8000, 0x9000, 0x4000];
        let k = t
            .insert(mr(
                0,
                0x6000,
                Backing::Pages {
                    page_shift: 12,
                    page_offset: 0,
                    pages,
                },
            ))
            .unwrap();
        let r = t
            .lookup_remote(1, 0, k, 0, 0x6000, Access::REMOTE_WRITE)
            .unwrap();
        let data: Vec<u8> = (0..0x5000u32).map(|i| (i * 7) as u8).collect();
        r.write(&mut mem, 0x800, &data).unwrap();
        assert_eq!(mem.1, [(0x1800, 0x2800), (0x8000, 0x2000), (0x4000, 0x800)]);
        assert_eq!(mem.0.slice(0x1800, 0x2800), &data[..0x2800]);
        assert_eq!(mem.0.slice(0x8000, 0x2000), &data[0x2800..0x4800]);
        assert_eq!(mem.0.slice(0x4000, 0x800), &data[0x4800..]);
    }

    #[test]
    fn pages_outside_memory_are_errors() {
        let mut mem = VecMemory::new(0, 0x1000);
        let mut t = KeyTable::new(4);
        let k = t
            .insert(mr(
                0,
                0x2000,
                Backing::Pages {
                    page_shift: 12,
                    page_offset: 0,
                    pages: vec![0, u64::MAX - 0xfff],
                },
            ))
            .unwrap();
        let r = t
            .lookup_remote(1, 0, k, 0, 0x2000, Access::REMOTE_WRITE)
            .unwrap();
        assert_eq!(
            r.write(&mut mem, 0x800, &[1u8; 0x1000]).unwrap_err(),
            MemError::OutOfRange
        );
    }

    /// An IOVA not congruent to the buffer (`ibv_reg_mr_iova`): IOVA 0x1000_0123 names the
    /// byte 0x456 into the first page, whatever `iova mod page` says.
    #[test]
    fn page_offset_apart_from_the_iova() {
        let mut mem = VecMemory::new(0, 0x10000);
        let mut t = KeyTable::new(16);
        let iova = 0x1000_0123u64;
        let len = 0x2000u64;
        // 0x456 + 0x2000 bytes: three pages, out of order.
        let pages = vec![0x9000, 0x3000, 0x6000];
        assert_eq!(check_page_list(0x456, len, 12, &pages), Ok(()));
        assert_eq!(
            check_page_list(0x456, len, 12, &pages[..2]),
            Err(MemError::Length),
            "0x456 + 0x2000 bytes need three pages"
        );
        assert_eq!(
            check_page_list(0x1000, 1, 12, &pages),
            Err(MemError::Alignment),
            "an offset beyond the first page"
        );
        let k = t
            .insert(mr(
                iova,
                len,
                Backing::Pages {
                    page_shift: 12,
                    page_offset: 0x456,
                    pages,
                },
            ))
            .unwrap();
        let data: Vec<u8> = (0..len as u32).map(|i| (i * 7 + 1) as u8).collect();
        let r = t
            .lookup_remote(1, 0, k, iova, len, Access::REMOTE_WRITE)
            .unwrap();
        r.write(&mut mem, iova, &data).unwrap();
        // 0x1000 - 0x456 = 0xbaa bytes in the first page, a full page, the rest.
        assert_eq!(mem.slice(0x9456, 0xbaa), &data[..0xbaa]);
        assert_eq!(mem.slice(0x3000, 0x1000), &data[0xbaa..0x1baa]);
        assert_eq!(mem.slice(0x6000, 0x456), &data[0x1baa..]);
        assert_eq!(mem.slice(0x9455, 1), &[0], "the byte before the MR");
        assert_eq!(mem.slice(0x6456, 1), &[0], "the byte after the MR");
        // Reads at both ends.
        let mut b = [0u8; 2];
        r.read(&mem, iova, &mut b).unwrap();
        assert_eq!(b, [data[0], data[1]]);
        r.read(&mem, iova + len - 2, &mut b).unwrap();
        assert_eq!(&b, &data[data.len() - 2..]);
        // Bounds: one byte before, one byte past the end.
        for (addr, n) in [(iova - 1, 1), (iova + len - 1, 2), (iova + len, 1)] {
            assert_eq!(
                t.lookup_remote(1, 0, k, addr, n, Access::REMOTE_WRITE)
                    .unwrap_err(),
                MemError::Length,
                "{addr:#x}+{n}"
            );
        }
        assert!(t
            .lookup_remote(1, 0, k, iova + len - 1, 1, Access::REMOTE_WRITE)
            .is_ok());
    }
}
