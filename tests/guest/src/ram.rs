//! Guest RAM as the VMM holds it (memfd regions, a page allocator) and the virtually
//! contiguous views a guest process has of scattered guest pages.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU16, AtomicU32};
use std::sync::Arc;

use vhost::VhostUserMemoryRegionInfo;

use crate::error::{Error, Result};

/// Guest-physical address of the first byte of guest RAM (not 0, to catch offset/GPA mix-ups).
pub const GPA_BASE: u64 = 0x4000_0000;
pub const PAGE: u64 = 4096;
/// Bytes at the start of RAM used for virtqueues, command buffers and page-list arrays
/// (physically contiguous allocations); the rest is a pool of scattered pages.
const CONTIG: u64 = 8 << 20;

// ---------------------------------------------------------------------------------------------
// Guest RAM

/// One region of guest RAM: a memfd of its own, mapped once in this process (the VMM's view).
struct RamRegion {
    gpa: u64,
    size: u64,
    fd: OwnedFd,
    base: *mut u8,
}

impl RamRegion {
    /// `sealed`: sealed against shrinking and growing, as QEMU's memory-backend-memfd seals
    /// its memfds by default (`seal=on`), which is what udmabuf asks of a memfd.
    fn new(gpa: u64, size: u64, sealed: bool) -> Result<RamRegion> {
        // SAFETY: valid NUL-terminated name; the result is checked.
        let fd = unsafe {
            libc::memfd_create(
                c"vur-guest-ram".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS with an int argument on our own fd.
        if sealed && unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: a fresh shared mapping of the memfd; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        Ok(RamRegion {
            gpa,
            size,
            fd,
            base: base.cast(),
        })
    }

    fn contains(&self, gpa: u64) -> bool {
        gpa >= self.gpa && gpa - self.gpa < self.size
    }

    /// The region as a vhost-user memory table entry (offset 0 of its own memfd).
    fn info(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: self.gpa,
            memory_size: self.size,
            userspace_addr: self.base as u64,
            mmap_offset: 0,
            mmap_handle: self.fd.as_raw_fd(),
        }
    }
}

/// Guest RAM: memfd-backed regions, each mapped once linearly (what the "hypervisor" sees),
/// plus a page allocator. [`GuestRam::new`] makes one region at [`GPA_BASE`];
/// [`GuestRam::with_regions`] lays out several, some of them plugged later ([`GuestRam::plug`]),
/// as a VMM with a hole below 4 GiB and hotplugged memory does.
pub struct GuestRam {
    regions: Vec<RamRegion>,
    plugged: std::sync::Mutex<Vec<bool>>,
    contig_next: std::sync::Mutex<u64>,
    pool: std::sync::Mutex<Vec<u64>>,
}

// SAFETY: the mappings are shared memory accessed only through raw pointers with explicit
// atomics/volatile copies; the allocator state is behind mutexes.
unsafe impl Send for GuestRam {}
// SAFETY: as above.
unsafe impl Sync for GuestRam {}

impl Drop for GuestRam {
    fn drop(&mut self) {
        for r in &self.regions {
            // SAFETY: `base` is the mapping of `size` bytes made in `RamRegion::new`, unmapped
            // once here.
            unsafe { libc::munmap(r.base.cast(), r.size as usize) };
        }
    }
}

/// Shuffles `pages` (a fixed xorshift sequence) so consecutive allocations are not
/// physically contiguous.
fn shuffle(pages: &mut [u64]) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in (1..pages.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        pages.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

impl GuestRam {
    /// One region of `size` bytes at [`GPA_BASE`].
    pub fn new(size: u64) -> Result<Arc<GuestRam>> {
        Self::new_sealed(size, true)
    }

    /// [`GuestRam::new`], its memfd sealed as QEMU seals its own (`sealed`) or not.
    pub fn new_sealed(size: u64, sealed: bool) -> Result<Arc<GuestRam>> {
        let size = size.max(CONTIG + (1 << 20)) & !(PAGE - 1);
        Self::layout(&[(GPA_BASE, size)], 1, sealed)
    }

    /// Regions at `(gpa, size)` (page-aligned, ascending, not overlapping; the first holds
    /// the physically contiguous allocations and must be larger than 8 MiB). The first
    /// `plugged` regions are RAM from the start; the others exist (this process has them
    /// mapped) but hold no pages until [`GuestRam::plug`]ged.
    pub fn with_regions(layout: &[(u64, u64)], plugged: usize) -> Result<Arc<GuestRam>> {
        Self::layout(layout, plugged, true)
    }

    fn layout(layout: &[(u64, u64)], plugged: usize, sealed: bool) -> Result<Arc<GuestRam>> {
        assert!(!layout.is_empty() && (1..=layout.len()).contains(&plugged));
        assert!(
            layout[0].1 > CONTIG,
            "the first region holds the contiguous area"
        );
        let mut end = 0;
        for &(gpa, size) in layout {
            assert!(gpa.is_multiple_of(PAGE) && size.is_multiple_of(PAGE) && size > 0);
            assert!(gpa >= end, "regions ascending and apart");
            end = gpa + size;
        }
        let regions = layout
            .iter()
            .map(|&(gpa, size)| RamRegion::new(gpa, size, sealed))
            .collect::<Result<Vec<_>>>()?;
        let mut pool: Vec<u64> = Vec::new();
        for (i, r) in regions.iter().enumerate().take(plugged) {
            let skip = if i == 0 { CONTIG / PAGE } else { 0 };
            pool.extend((skip..r.size / PAGE).map(|p| r.gpa + p * PAGE));
        }
        shuffle(&mut pool);
        let contig = regions[0].gpa;
        let mut state = vec![false; regions.len()];
        state[..plugged].fill(true);
        Ok(Arc::new(GuestRam {
            regions,
            plugged: std::sync::Mutex::new(state),
            contig_next: std::sync::Mutex::new(contig),
            pool: std::sync::Mutex::new(pool),
        }))
    }

    /// Bytes of RAM in every region, plugged or not.
    pub fn size(&self) -> u64 {
        self.regions.iter().map(|r| r.size).sum()
    }

    /// The memory table a VMM gives the backend: one entry per plugged region.
    pub fn memory_regions(&self) -> Vec<VhostUserMemoryRegionInfo> {
        let plugged = self.plugged.lock().expect("lock");
        self.regions
            .iter()
            .zip(plugged.iter())
            .filter(|(_, &p)| p)
            .map(|(r, _)| r.info())
            .collect()
    }

    /// Plugs region `i` (memory hotplug): its pages join the pool, at the end, so the next
    /// allocations come from it. Returns its memory table entry.
    pub fn plug(&self, i: usize) -> VhostUserMemoryRegionInfo {
        let r = &self.regions[i];
        let mut plugged = self.plugged.lock().expect("lock");
        if !plugged[i] {
            plugged[i] = true;
            let mut pages: Vec<u64> = (0..r.size / PAGE).map(|p| r.gpa + p * PAGE).collect();
            shuffle(&mut pages);
            self.pool.lock().expect("lock").extend(pages);
        }
        r.info()
    }

    /// The region `gpa` falls in: (its first GPA, its size).
    pub fn region_of(&self, gpa: u64) -> Option<(u64, u64)> {
        self.regions
            .iter()
            .find(|r| r.contains(gpa))
            .map(|r| (r.gpa, r.size))
    }

    fn region(&self, gpa: u64) -> Option<&RamRegion> {
        self.regions.iter().find(|r| r.contains(gpa))
    }

    /// Pointer to `len` bytes at `gpa` in the linear mapping of its region.
    pub fn ptr(&self, gpa: u64, len: u64) -> *mut u8 {
        let r = self.region(gpa);
        assert!(
            r.is_some_and(|r| gpa + len <= r.gpa + r.size),
            "GPA {gpa:#x}+{len} outside guest RAM"
        );
        let r = r.expect("checked");
        // SAFETY: in bounds of the region's mapping, checked above.
        unsafe { r.base.add((gpa - r.gpa) as usize) }
    }

    pub fn write(&self, gpa: u64, data: &[u8]) {
        let p = self.ptr(gpa, data.len() as u64);
        // SAFETY: `p..p+len` is inside the mapping; the device may access the same bytes
        // concurrently, which for plain data is what shared guest memory means.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) };
    }

    pub fn read(&self, gpa: u64, out: &mut [u8]) {
        let p = self.ptr(gpa, out.len() as u64);
        // SAFETY: as in `write`.
        unsafe { std::ptr::copy_nonoverlapping(p, out.as_mut_ptr(), out.len()) };
    }

    pub fn atomic_u16(&self, gpa: u64) -> &AtomicU16 {
        assert!(gpa.is_multiple_of(2));
        // SAFETY: aligned, in bounds, lives as long as `self`; shared memory is accessed
        // atomically on both sides.
        unsafe { &*(self.ptr(gpa, 2) as *const AtomicU16) }
    }

    pub fn atomic_u32(&self, gpa: u64) -> &AtomicU32 {
        assert!(gpa.is_multiple_of(4));
        // SAFETY: as in `atomic_u16`.
        unsafe { &*(self.ptr(gpa, 4) as *const AtomicU32) }
    }

    /// Writes a page-list array (levels 0) for `pages`; returns its GPA.
    pub fn page_list(&self, pages: &[u64]) -> Result<u64> {
        let gpa = self.alloc_contig(8 * pages.len() as u64, 8)?;
        let b: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.write(gpa, &b);
        Ok(gpa)
    }

    /// Physically contiguous, zeroed allocation (virtqueues, command buffers, page lists).
    pub fn alloc_contig(&self, len: u64, align: u64) -> Result<u64> {
        let mut n = self.contig_next.lock().expect("lock");
        let a = (*n + align - 1) & !(align - 1);
        if a + len > self.regions[0].gpa + CONTIG {
            return Err(Error::NoMemory);
        }
        *n = a + len;
        self.write(a, &vec![0u8; len as usize]);
        Ok(a)
    }

    /// `n` scattered pages.
    pub fn alloc_pages(&self, n: usize) -> Result<Vec<u64>> {
        let mut p = self.pool.lock().expect("lock");
        if p.len() < n {
            return Err(Error::NoMemory);
        }
        let at = p.len() - n;
        Ok(p.split_off(at))
    }

    pub fn free_pages(&self, pages: &[u64]) {
        self.pool.lock().expect("lock").extend_from_slice(pages);
    }

    /// Maps `pages` contiguously into this process (a "user" view of scattered pages).
    pub fn map_pages(self: &Arc<Self>, pages: &[u64]) -> Result<VaMap> {
        let len = pages.len() * PAGE as usize;
        // SAFETY: reserving address space; checked for MAP_FAILED.
        let va = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if va == libc::MAP_FAILED {
            return Err(io::Error::last_os_error().into());
        }
        for (i, &g) in pages.iter().enumerate() {
            let region = self.region(g).expect("a page of guest RAM");
            // SAFETY: MAP_FIXED over our own reservation, one page of the memfd per slot.
            let r = unsafe {
                libc::mmap(
                    va.cast::<u8>().add(i * PAGE as usize).cast(),
                    PAGE as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    region.fd.as_raw_fd(),
                    (g - region.gpa) as i64,
                )
            };
            if r == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                // SAFETY: unmapping the reservation made above.
                unsafe { libc::munmap(va, len) };
                return Err(e.into());
            }
        }
        Ok(VaMap {
            ptr: va.cast(),
            len,
            pages: pages.to_vec(),
            ram: self.clone(),
        })
    }
}

/// A virtually contiguous view of guest pages, as a guest process would have it.
pub struct VaMap {
    ptr: *mut u8,
    len: usize,
    pub pages: Vec<u64>,
    ram: Arc<GuestRam>,
}

// SAFETY: the mapping is plain shared memory owned by this value.
unsafe impl Send for VaMap {}

impl Drop for VaMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the range mapped in `map_pages`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        self.ram.free_pages(&self.pages);
    }
}

impl VaMap {
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len);
        // SAFETY: in bounds of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) };
    }
    pub fn read(&self, off: usize, out: &mut [u8]) {
        assert!(off + out.len() <= self.len);
        // SAFETY: in bounds of the mapping.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), out.len()) };
    }
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(off, &mut v);
        v
    }
    pub fn atomic_u32(&self, off: usize) -> &AtomicU32 {
        assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: aligned, in bounds, lives as long as `self`.
        unsafe { &*(self.ptr.add(off) as *const AtomicU32) }
    }
    pub fn u64_at(&self, off: usize) -> u64 {
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }
}
