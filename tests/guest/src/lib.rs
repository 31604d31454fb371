//! A test guest for vhost-user-rdma. It plays two parts, following docs/virtio-rdma.md:
//!
//! - **the VMM**: a vhost-user frontend on the daemon's unix socket, guest RAM in memfds the
//!   daemon maps, and the three split virtqueues it drives ([`Guest::connect`]);
//! - **the guest driver + librxe**: control commands on vq 0, rings in the Linux rxe user ABI
//!   that it fills and reads itself (send WQEs, receive WQEs, `ib_uverbs_wc`), doorbells on
//!   vq 1, events on vq 2, behind a small verbs-like API.
//!
//! User buffers and rings are mapped into this process the way a guest process sees them:
//! a contiguous virtual range backed by scattered guest-physical pages (each page `mmap`ed
//! from the memfd at its own offset), so page lists are really exercised.

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{fence, AtomicU16, AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rxe_core::verbs::*;
use rxe_core::Gid;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vmm_sys_util::eventfd::EventFd;

pub mod cloud_hypervisor;
pub mod net;
pub mod netns;
pub mod scale;

pub use vhost_user_rdma::abi;
use vhost_user_rdma::abi::{op, ring as hdr, Status};

/// Guest-physical address of the first byte of guest RAM (not 0, to catch offset/GPA mix-ups).
pub const GPA_BASE: u64 = 0x4000_0000;
pub const PAGE: u64 = 4096;
/// Bytes at the start of RAM used for virtqueues, command buffers and page-list arrays
/// (physically contiguous allocations); the rest is a pool of scattered pages.
const CONTIG: u64 = 8 << 20;

#[derive(Debug)]
pub enum Error {
    Io(io::Error),
    Vhost(vhost::Error),
    /// The device answered with a non-OK status.
    Status(Status),
    /// The device returned an unknown status code.
    BadStatus(u32),
    Timeout(&'static str),
    NoMemory,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for Error {}
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(e)
    }
}
impl From<vhost::Error> for Error {
    fn from(e: vhost::Error) -> Self {
        Error::Vhost(e)
    }
}

pub type Result<T> = std::result::Result<T, Error>;

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
    fn new(gpa: u64, size: u64) -> Result<RamRegion> {
        // SAFETY: valid NUL-terminated name; the result is checked.
        let fd = unsafe { libc::memfd_create(c"vur-guest-ram".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our fd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) } != 0 {
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
        let size = size.max(CONTIG + (1 << 20)) & !(PAGE - 1);
        Self::with_regions(&[(GPA_BASE, size)], 1)
    }

    /// Regions at `(gpa, size)` (page-aligned, ascending, not overlapping; the first holds
    /// the physically contiguous allocations and must be larger than 8 MiB). The first
    /// `plugged` regions are RAM from the start; the others exist (this process has them
    /// mapped) but hold no pages until [`GuestRam::plug`]ged.
    pub fn with_regions(layout: &[(u64, u64)], plugged: usize) -> Result<Arc<GuestRam>> {
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
            .map(|&(gpa, size)| RamRegion::new(gpa, size))
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

// ---------------------------------------------------------------------------------------------
// Split virtqueue, driver side

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;

pub struct Virtq {
    ram: Arc<GuestRam>,
    pub size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    free: Vec<u16>,
    avail_idx: u16,
    last_used: u16,
    event_idx: bool,
    /// Whether to ask for used-buffer notifications (EVENT_IDX's used_event; without
    /// EVENT_IDX, VRING_AVAIL_F_NO_INTERRUPT when false).
    interrupts: bool,
    /// Buffers added with a kick, and without one because the device suppressed it
    /// (VRING_USED_F_NO_NOTIFY, or EVENT_IDX's avail event index).
    pub kicks: u64,
    pub kicks_suppressed: u64,
    pub kick: EventFd,
    pub call: EventFd,
}

impl Virtq {
    /// A split virtqueue of `size` entries in the contiguous area of `ram`.
    pub fn new(ram: &Arc<GuestRam>, size: u16, event_idx: bool) -> Result<Virtq> {
        let n = size as u64;
        let desc = ram.alloc_contig(16 * n, 4096)?;
        let avail = ram.alloc_contig(6 + 2 * n, 4096)?;
        let used = ram.alloc_contig(6 + 8 * n, 4096)?;
        Ok(Virtq {
            ram: ram.clone(),
            size,
            desc,
            avail,
            used,
            free: (0..size).rev().collect(),
            avail_idx: 0,
            last_used: 0,
            event_idx,
            interrupts: true,
            kicks: 0,
            kicks_suppressed: 0,
            kick: EventFd::new(libc::EFD_NONBLOCK)?,
            call: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    /// Puts the rings at position `base` (avail and used idx), as a VMM restoring a running
    /// guest's queues does.
    fn start_at(&mut self, base: u16) {
        self.avail_idx = base;
        self.last_used = base;
        self.ram.write(self.avail + 2, &base.to_le_bytes());
        self.ram.write(self.used + 2, &base.to_le_bytes());
    }

    fn config(&self) -> VringConfigData {
        let va = |g| self.ram.ptr(g, 1) as u64;
        VringConfigData {
            queue_max_size: self.size,
            queue_size: self.size,
            flags: 0,
            desc_table_addr: va(self.desc),
            used_ring_addr: va(self.used),
            avail_ring_addr: va(self.avail),
            log_addr: None,
        }
    }

    /// Adds a chain of (gpa, len, device-writable) buffers; returns the head, or None if the
    /// table is full.
    pub fn add(&mut self, bufs: &[(u64, u32, bool)]) -> Option<u16> {
        self.add_kick(bufs, true)
    }

    /// [`Self::add`] without the kick the device may want: it finds the chain when it looks
    /// at the ring for another reason.
    pub fn add_unkicked(&mut self, bufs: &[(u64, u32, bool)]) -> Option<u16> {
        self.add_kick(bufs, false)
    }

    /// [`Self::add`], kicking the device only when `kick` (and it wants kicks).
    pub fn add_kick(&mut self, bufs: &[(u64, u32, bool)], kick: bool) -> Option<u16> {
        if bufs.is_empty() || self.free.len() < bufs.len() {
            return None;
        }
        let ids: Vec<u16> = (0..bufs.len())
            .map(|_| self.free.pop().expect("checked"))
            .collect();
        for (i, &(gpa, len, w)) in bufs.iter().enumerate() {
            let mut flags = if w { VIRTQ_DESC_F_WRITE } else { 0 };
            let next = if i + 1 < bufs.len() {
                flags |= VIRTQ_DESC_F_NEXT;
                ids[i + 1]
            } else {
                0
            };
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&gpa.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.to_le_bytes());
            self.ram.write(self.desc + 16 * ids[i] as u64, &d);
        }
        let slot = self.avail + 4 + 2 * (self.avail_idx % self.size) as u64;
        self.ram.atomic_u16(slot).store(ids[0], Ordering::Relaxed);
        let old = self.avail_idx;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        fence(Ordering::Release);
        self.ram
            .atomic_u16(self.avail + 2)
            .store(self.avail_idx, Ordering::Release);
        fence(Ordering::SeqCst);
        if kick && self.needs_kick(old) {
            self.kicks += 1;
            let _ = self.kick.write(1);
        } else {
            self.kicks_suppressed += 1;
        }
        Some(ids[0])
    }

    /// Asks for used-buffer notifications or not. With EVENT_IDX that is the used_event
    /// index [`Virtq::poll_used`] moves (or leaves behind); without, the avail ring's
    /// VRING_AVAIL_F_NO_INTERRUPT flag.
    fn set_interrupts(&mut self, on: bool) {
        self.interrupts = on;
        if !self.event_idx {
            self.ram
                .atomic_u16(self.avail)
                .store(if on { 0 } else { 1 }, Ordering::Release);
        }
    }

    fn needs_kick(&self, old: u16) -> bool {
        if self.event_idx {
            let ev = self
                .ram
                .atomic_u16(self.used + 4 + 8 * self.size as u64)
                .load(Ordering::Acquire);
            // vring_need_event(event, new, old)
            self.avail_idx.wrapping_sub(ev).wrapping_sub(1) < self.avail_idx.wrapping_sub(old)
        } else {
            self.ram.atomic_u16(self.used).load(Ordering::Acquire) & 1 == 0
        }
    }

    /// The next used element (head, len), freeing its chain.
    pub fn poll_used(&mut self) -> Option<(u16, u32)> {
        let idx = self.ram.atomic_u16(self.used + 2).load(Ordering::Acquire);
        if idx == self.last_used {
            if self.event_idx && self.interrupts {
                // Ask for an interrupt on the next used buffer.
                self.ram
                    .atomic_u16(self.avail + 4 + 2 * self.size as u64)
                    .store(self.last_used, Ordering::Release);
            }
            return None;
        }
        let e = self.used + 4 + 8 * (self.last_used % self.size) as u64;
        let id = self.ram.atomic_u32(e).load(Ordering::Acquire) as u16;
        let len = self.ram.atomic_u32(e + 4).load(Ordering::Acquire);
        self.last_used = self.last_used.wrapping_add(1);
        if self.event_idx && self.interrupts {
            self.ram
                .atomic_u16(self.avail + 4 + 2 * self.size as u64)
                .store(self.last_used, Ordering::Release);
        }
        // Free the chain.
        let mut d = id;
        for _ in 0..self.size {
            self.free.push(d);
            let mut b = [0u8; 2];
            self.ram.read(self.desc + 16 * d as u64 + 12, &mut b);
            if u16::from_le_bytes(b) & VIRTQ_DESC_F_NEXT == 0 {
                break;
            }
            self.ram.read(self.desc + 16 * d as u64 + 14, &mut b);
            d = u16::from_le_bytes(b);
        }
        Some((id, len))
    }

    /// Waits for the next used element.
    pub fn wait_used(&mut self, timeout: Duration) -> Option<(u16, u32)> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(u) = self.poll_used() {
                return Some(u);
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut p = libc::pollfd {
                fd: self.call.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis().clamp(1, 50) as i32) };
            let _ = self.call.read();
        }
    }
}

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
    fn new(g: &Guest, num_slots: u32, elem: usize) -> Result<QueueBuf> {
        let log2 = elem.next_power_of_two().trailing_zeros().max(6);
        let len = hdr::DATA + ((num_slots as u64) << log2);
        let n = len.div_ceil(PAGE) as usize;
        let pages = g.ram.alloc_pages(n)?;
        let map = g.ram.map_pages(&pages)?;
        let list_gpa = g.page_list(&pages)?;
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

// ---------------------------------------------------------------------------------------------
// The guest

/// Options of [`Guest::connect`].
#[derive(Clone, Debug)]
pub struct GuestOpts {
    pub mem_size: u64,
    pub queue_size: u16,
    pub event_idx: bool,
    pub event_bufs: u16,
    /// Ring position every virtqueue starts at (SET_VRING_BASE, avail and used idx): non-zero
    /// plays a VMM reconnecting a running guest to a restarted daemon.
    pub vring_base: u16,
}

impl Default for GuestOpts {
    fn default() -> Self {
        GuestOpts {
            mem_size: 64 << 20,
            queue_size: 256,
            event_idx: true,
            event_bufs: 64,
            vring_base: 0,
        }
    }
}

/// A device worker [`Guest::hold_worker`] holds: the blocking eventfd its interrupt write
/// waits on.
#[must_use = "the worker stays held until Guest::release_worker"]
pub struct WorkerHold(EventFd);

pub struct Guest {
    pub ram: Arc<GuestRam>,
    fe: Frontend,
    ctrl: Virtq,
    db: Virtq,
    ev: Virtq,
    ctrl_req: u64,
    ctrl_resp: u64,
    db_bufs: u64,
    ev_bufs: u64,
    /// How many event buffers `ev_bufs` holds.
    ev_n: u16,
    seq: u64,
    pending_events: VecDeque<abi::Event>,
    pub config: abi::ConfigSpace,
    pub timeout: Duration,
    /// New QPs are kernel QPs (CREATE_QP_KERNEL, true by default): this guest plays the
    /// kernel driver, whose QPs alone may post REG_MR. False plays librxe-mapped QPs.
    pub kernel_qps: bool,
    /// Doorbells kick the doorbell queue (true by default). False plays a driver whose kicks
    /// the device suppressed: the entries wait on the ring until the device looks at it.
    pub kick_doorbells: bool,
}

const CTRL_BUF: u64 = 8192;

impl Guest {
    /// Connects to a daemon's vhost-user socket (retrying for up to 10 s while it starts) and
    /// brings the device up: features, memory table, three vrings, config space.
    pub fn connect(socket: &Path, opts: GuestOpts) -> Result<Guest> {
        let end = Instant::now() + Duration::from_secs(10);
        let mut fe = loop {
            match Frontend::connect(socket, abi::NUM_QUEUES as u64) {
                Ok(f) => break f,
                Err(e) if Instant::now() < end => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let ram = GuestRam::new(opts.mem_size)?;
        fe.set_owner()?;
        let features = fe.get_features()?;
        let mut want = (1u64 << 32) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if opts.event_idx {
            want |= 1 << 29;
        }
        let acked = features & want;
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            let pf = fe.get_protocol_features()?;
            fe.set_protocol_features(
                pf & (VhostUserProtocolFeatures::CONFIG
                    | VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::RESET_DEVICE),
            )?;
        }
        fe.set_features(acked)?;
        let event_idx = acked & (1 << 29) != 0;
        fe.set_mem_table(&ram.memory_regions())?;
        let mut qs = Vec::new();
        for i in 0..abi::NUM_QUEUES {
            let mut q = Virtq::new(&ram, opts.queue_size, event_idx)?;
            q.start_at(opts.vring_base);
            fe.set_vring_num(i, q.size)?;
            fe.set_vring_addr(i, &q.config())?;
            fe.set_vring_base(i, opts.vring_base)?;
            fe.set_vring_call(i, &q.call)?;
            fe.set_vring_kick(i, &q.kick)?;
            fe.set_vring_enable(i, true)?;
            qs.push(q);
        }
        let sz = std::mem::size_of::<abi::ConfigSpace>() as u32;
        let (_, payload) = fe.get_config(
            0,
            sz,
            VhostUserConfigFlags::WRITABLE,
            &vec![0u8; sz as usize],
        )?;
        let config =
            abi::read_struct::<abi::ConfigSpace>(&payload).ok_or(Error::Timeout("config"))?;
        Guest::assemble(fe, ram, qs, config, opts.event_bufs)
    }

    /// The guest driver's side of a device whose vrings `qs` (control, doorbell, event) a
    /// frontend has set up: buffers for control requests and doorbells, and `event_bufs`
    /// event buffers posted.
    fn assemble(
        fe: Frontend,
        ram: Arc<GuestRam>,
        mut qs: Vec<Virtq>,
        config: abi::ConfigSpace,
        event_bufs: u16,
    ) -> Result<Guest> {
        assert_eq!(qs.len(), abi::NUM_QUEUES);
        let ev = qs.pop().expect("3 queues");
        let mut db = qs.pop().expect("3 queues");
        // Doorbells are fire-and-forget: no used-buffer interrupts (EVENT_IDX used_event stays
        // behind, or VRING_AVAIL_F_NO_INTERRUPT); finished buffers are reclaimed by polling.
        db.set_interrupts(false);
        let ctrl = qs.pop().expect("3 queues");
        let ctrl_req = ram.alloc_contig(CTRL_BUF, 4096)?;
        let ctrl_resp = ram.alloc_contig(CTRL_BUF, 4096)?;
        let db_bufs = ram.alloc_contig(16 * db.size as u64, 4096)?;
        let ev_bufs = ram.alloc_contig(16 * event_bufs as u64, 4096)?;
        let mut g = Guest {
            ram,
            fe,
            ctrl,
            db,
            ev,
            ctrl_req,
            ctrl_resp,
            db_bufs,
            ev_bufs,
            ev_n: event_bufs,
            seq: 0,
            pending_events: VecDeque::new(),
            config,
            timeout: Duration::from_secs(10),
            kernel_qps: true,
            kick_doorbells: true,
        };
        for i in 0..event_bufs as u64 {
            g.ev.add(&[(g.ev_bufs + 16 * i, 16, true)]);
        }
        Ok(g)
    }

    /// Closes the vhost-user connection (the daemon must drop all state and serve again).
    pub fn disconnect(self) {
        drop(self);
    }

    /// VHOST_USER_RESET_DEVICE.
    pub fn reset_device(&mut self) -> Result<()> {
        Ok(self.fe.reset_device()?)
    }

    /// Writes a page-list array (levels 0) for `pages`; returns its GPA.
    pub fn page_list(&self, pages: &[u64]) -> Result<u64> {
        let gpa = self.ram.alloc_contig(8 * pages.len() as u64, 8)?;
        let b: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
        self.ram.write(gpa, &b);
        Ok(gpa)
    }

    /// Sends a control request made of `parts` (device-readable) with `resp_len` bytes of
    /// device-writable response room; returns (status, response body).
    pub fn raw_cmd(&mut self, req: &[u8], resp_len: u32) -> Result<(u32, Vec<u8>)> {
        assert!(req.len() as u64 <= CTRL_BUF && resp_len as u64 <= CTRL_BUF);
        self.ram.write(self.ctrl_req, req);
        self.ram
            .write(self.ctrl_resp, &vec![0xEE; resp_len as usize]);
        let mut chain = Vec::new();
        if !req.is_empty() {
            chain.push((self.ctrl_req, req.len() as u32, false));
        }
        if resp_len > 0 {
            chain.push((self.ctrl_resp, resp_len, true));
        }
        self.raw_chain(&chain)?;
        let mut out = vec![0u8; resp_len as usize];
        self.ram.read(self.ctrl_resp, &mut out);
        let h: abi::RespHdr = abi::read_struct(&out).unwrap_or_default();
        let body = out
            .get(16..16 + (h.len as usize).min(out.len().saturating_sub(16)))
            .unwrap_or_default()
            .to_vec();
        Ok((h.status, body))
    }

    /// Puts a control command (header + `cmd`, room for the response) on the control queue
    /// without kicking it; [`Self::wait_unkicked_cmd`] waits for it. One at a time.
    pub fn post_unkicked_cmd(&mut self, opcode: u32, cmd: &[u8]) -> Result<u16> {
        self.seq += 1;
        let h = abi::CtrlHdr {
            opcode,
            flags: 0,
            seq: self.seq,
        };
        let mut req = vm_memory::ByteValued::as_slice(&h).to_vec();
        req.extend_from_slice(cmd);
        self.ram.write(self.ctrl_req, &req);
        self.ram.write(self.ctrl_resp, &[0xEE; 16]);
        let chain = [
            (self.ctrl_req, req.len() as u32, false),
            (self.ctrl_resp, 16 + 256, true),
        ];
        self.ctrl.add_unkicked(&chain).ok_or(Error::NoMemory)
    }

    /// Waits up to `timeout` for the command [`Self::post_unkicked_cmd`] put on the queue;
    /// returns its status.
    pub fn wait_unkicked_cmd(&mut self, head: u16, timeout: Duration) -> Result<u32> {
        loop {
            match self.ctrl.wait_used(timeout) {
                Some((id, _)) if id == head => {
                    let mut out = [0u8; 16];
                    self.ram.read(self.ctrl_resp, &mut out);
                    let h: abi::RespHdr = abi::read_struct(&out).unwrap_or_default();
                    return Ok(h.status);
                }
                Some(_) => continue,
                None => return Err(Error::Timeout("an unkicked control command")),
            }
        }
    }

    /// Holds the device's worker until [`Self::release_worker`], for a test that needs the
    /// device busy for as long as it says, whatever the timing (the part of a guest that keeps
    /// its worker busy with slow control commands). The control queue's interrupt eventfd is
    /// swapped for a blocking one filled to its maximum and a QUERY_DEVICE sent: the worker
    /// answers it and then blocks in its interrupt write, its device lock held, until the
    /// release reads the eventfd. When this returns the answer is on the used ring, so the
    /// worker holds the device's lock from then on. Meanwhile nothing else may use the control
    /// queue, and the device's counters cannot be read (its worker renders them).
    pub fn hold_worker(&mut self) -> Result<WorkerHold> {
        let hold = EventFd::new(libc::EFD_CLOEXEC)?;
        // An eventfd counts up to 2^64 - 2; a write that would pass it blocks.
        hold.write(u64::MAX - 1)?;
        self.fe.set_vring_call(0, &hold)?;
        // vhost-user messages are handled in order: an answered request means the call
        // eventfd was swapped before the command below is taken.
        self.fe.get_features()?;
        let head = self.post_unkicked_cmd(op::QUERY_DEVICE, &[])?;
        let _ = self.ctrl.kick.write(1);
        let status = self.wait_unkicked_cmd(head, self.timeout)?;
        if status != Status::Ok as u32 {
            return Err(Error::BadStatus(status));
        }
        Ok(WorkerHold(hold))
    }

    /// Lets the worker [`Self::hold_worker`] held go on, and proves it was held: its
    /// interrupt write, which could not complete before this read the eventfd, shows up after
    /// it (within the guest's timeout); the control queue gets its own eventfd back.
    pub fn release_worker(&mut self, hold: WorkerHold) -> Result<()> {
        let hold = hold.0;
        hold.read()?;
        let mut p = libc::pollfd {
            fd: hold.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } != 1 {
            return Err(Error::Timeout(
                "the held worker's interrupt write (the worker was not held)",
            ));
        }
        self.fe.set_vring_call(0, &self.ctrl.call)?;
        self.fe.get_features()?;
        Ok(())
    }

    /// Submits an arbitrary descriptor chain on the control queue and waits for it.
    pub fn raw_chain(&mut self, chain: &[(u64, u32, bool)]) -> Result<u32> {
        let head = self.ctrl.add(chain).ok_or(Error::NoMemory)?;
        loop {
            match self.ctrl.wait_used(self.timeout) {
                Some((id, len)) if id == head => return Ok(len),
                Some(_) => continue,
                None => return Err(Error::Timeout("control queue")),
            }
        }
    }

    /// A control command: header + `cmd`, response struct returned.
    pub fn cmd(&mut self, opcode: u32, cmd: &[u8]) -> Result<Vec<u8>> {
        self.seq += 1;
        let h = abi::CtrlHdr {
            opcode,
            flags: 0,
            seq: self.seq,
        };
        let mut req = vm_memory::ByteValued::as_slice(&h).to_vec();
        req.extend_from_slice(cmd);
        let (status, body) = self.raw_cmd(&req, 16 + 256)?;
        match Status::from_u32(status) {
            Some(Status::Ok) => Ok(body),
            Some(s) => Err(Error::Status(s)),
            None => Err(Error::BadStatus(status)),
        }
    }

    fn cmd_t<C: vm_memory::ByteValued, R: vm_memory::ByteValued + Default>(
        &mut self,
        opcode: u32,
        c: &C,
    ) -> Result<R> {
        let b = self.cmd(opcode, c.as_slice())?;
        abi::read_struct(&b).ok_or(Error::BadStatus(u32::MAX))
    }

    fn handle(&mut self, opcode: u32, h: u32) -> Result<()> {
        self.cmd(
            opcode,
            vm_memory::ByteValued::as_slice(&abi::Handle {
                handle: h,
                reserved: 0,
            }),
        )
        .map(|_| ())
    }

    // ---------------------------------------------------------------- verbs

    pub fn query_device(&mut self) -> Result<abi::ConfigSpace> {
        let b = self.cmd(op::QUERY_DEVICE, &[])?;
        abi::read_struct(&b).ok_or(Error::BadStatus(u32::MAX))
    }

    pub fn query_port(&mut self) -> Result<abi::RespQueryPort> {
        self.cmd_t(
            op::QUERY_PORT,
            &abi::CmdQueryPort {
                port_num: 1,
                reserved: 0,
            },
        )
    }

    pub fn add_gid(&mut self, index: u32, gid: Gid) -> Result<()> {
        self.cmd(
            op::ADD_GID,
            vm_memory::ByteValued::as_slice(&abi::CmdAddGid {
                index,
                gid_type: abi::GID_TYPE_ROCE_UDP_ENCAP,
                gid: gid.0,
            }),
        )
        .map(|_| ())
    }

    pub fn del_gid(&mut self, index: u32) -> Result<()> {
        self.handle(op::DEL_GID, index)
    }

    pub fn alloc_pd(&mut self) -> Result<u32> {
        let h: abi::Handle =
            abi::read_struct(&self.cmd(op::CREATE_PD, &[])?).ok_or(Error::BadStatus(u32::MAX))?;
        Ok(h.handle)
    }

    pub fn dealloc_pd(&mut self, pd: u32) -> Result<()> {
        self.handle(op::DESTROY_PD, pd)
    }

    /// Allocates a user buffer of `len` bytes on scattered pages.
    pub fn alloc_buf(&self, len: usize) -> Result<VaMap> {
        let n = (len as u64).div_ceil(PAGE).max(1) as usize;
        let pages = self.ram.alloc_pages(n)?;
        self.ram.map_pages(&pages)
    }

    /// Registers a fresh buffer of `len` bytes (page list with indirection when it is large).
    pub fn reg_mr(&mut self, pd: u32, len: usize, access: Access) -> Result<Mr> {
        let buf = self.alloc_buf(len)?;
        let iova = buf.addr();
        self.reg_mr_at(pd, buf, 0, len, access, iova)
    }

    /// `ibv_reg_mr_iova`: registers `len` bytes starting `offset` bytes into a fresh buffer
    /// under an IOVA of the caller's choosing, congruent to the buffer or not.
    pub fn reg_mr_iova(
        &mut self,
        pd: u32,
        offset: usize,
        len: usize,
        access: Access,
        iova: u64,
    ) -> Result<Mr> {
        let buf = self.alloc_buf(offset + len)?;
        self.reg_mr_at(pd, buf, offset, len, access, iova)
    }

    /// The page-list array of `pages` (levels 0 up to 512 pages, else one level of 4 KiB list
    /// pages): (GPA, levels).
    pub fn page_list_levels(&self, pages: &[u64]) -> Result<(u64, u8)> {
        if pages.len() <= 512 {
            return Ok((self.page_list(pages)?, 0));
        }
        let mut tops = Vec::new();
        for chunk in pages.chunks(512) {
            let lp = self.ram.alloc_contig(PAGE, PAGE)?;
            let b: Vec<u8> = chunk.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.ram.write(lp, &b);
            tops.push(lp);
        }
        Ok((self.page_list(&tops)?, 1))
    }

    fn reg_mr_at(
        &mut self,
        pd: u32,
        buf: VaMap,
        offset: usize,
        len: usize,
        access: Access,
        iova: u64,
    ) -> Result<Mr> {
        // The pages that hold bytes offset .. offset+len (at least one), as ib_umem pins them.
        let first = offset / PAGE as usize;
        let end = (offset + len).div_ceil(PAGE as usize).max(first + 1);
        let pages = buf.pages[first..end].to_vec();
        let (gpa, levels) = self.page_list_levels(&pages)?;
        let r: abi::RespMr = self.cmd_t(
            op::REG_USER_MR,
            &abi::CmdRegUserMr {
                pdn: pd,
                access: access.0,
                iova,
                length: len as u64,
                pages: abi::PageListDesc {
                    gpa,
                    num_pages: pages.len() as u32,
                    page_shift: 12,
                    levels,
                    reserved: 0,
                },
                page_offset: (offset % PAGE as usize) as u32,
                reserved: 0,
            },
        )?;
        Ok(Mr {
            lkey: r.lkey,
            rkey: r.rkey,
            buf,
            len,
            iova,
            offset,
        })
    }

    pub fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.handle(op::DEREG_MR, mr.lkey)
    }

    pub fn alloc_mw(&mut self, pd: u32, mw_type: u32) -> Result<u32> {
        let r: abi::RespMr = self.cmd_t(op::ALLOC_MW, &abi::CmdAllocMw { pdn: pd, mw_type })?;
        Ok(r.rkey)
    }

    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<()> {
        self.handle(op::DEALLOC_MW, rkey)
    }

    pub fn create_cq(&mut self, cqe: u32) -> Result<Cq> {
        let slots = (cqe + 1).next_power_of_two();
        let ring = QueueBuf::new(self, slots, abi::CQE_SIZE)?;
        let r: abi::RespCreateCq = self.cmd_t(
            op::CREATE_CQ,
            &abi::CmdCreateCq {
                cqe,
                flags: 0,
                queue: ring.desc(),
            },
        )?;
        Ok(Cq {
            cqn: r.cqn,
            cqe: r.cqe,
            ring,
        })
    }

    /// RESIZE_CQ: a new ring of `cqe` entries; the device moves unconsumed entries into it.
    /// On error the old ring stays in use.
    pub fn resize_cq(&mut self, cq: &mut Cq, cqe: u32) -> Result<()> {
        let slots = (cqe + 1).next_power_of_two();
        let ring = QueueBuf::new(self, slots, abi::CQE_SIZE)?;
        let r: abi::RespCreateCq = self.cmd_t(
            op::RESIZE_CQ,
            &abi::CmdResizeCq {
                cqn: cq.cqn,
                cqe,
                queue: ring.desc(),
            },
        )?;
        cq.cqe = r.cqe;
        cq.ring = ring;
        Ok(())
    }

    /// RESIZE_SRQ: a new ring for `srq` with `max_wr`; returns the device's max_wr. On
    /// success the SRQ uses the new ring (the device moved the receives it had not taken).
    pub fn resize_srq(&mut self, srq: &mut Srq, max_wr: u32) -> Result<u32> {
        let ring = QueueBuf::new(
            self,
            (max_wr + 1).next_power_of_two(),
            abi::rwqe::SIZE + srq.max_sge as usize * abi::SGE_SIZE,
        )?;
        let r: abi::RespQuerySrq = self.cmd_t(
            op::RESIZE_SRQ,
            &abi::CmdResizeSrq {
                srqn: srq.srqn,
                max_wr,
                queue: ring.desc(),
            },
        )?;
        srq.ring = ring;
        Ok(r.max_wr)
    }

    /// ALLOC_MR: a fast-registration MR; returns its key.
    pub fn alloc_mr(&mut self, pd: u32, max_num_sg: u32) -> Result<u32> {
        let r: abi::RespMr = self.cmd_t(
            op::ALLOC_MR,
            &abi::CmdAllocMr {
                pdn: pd,
                max_num_sg,
            },
        )?;
        Ok(r.lkey)
    }

    /// BIND_MW (type 1 windows): returns the window's new rkey.
    pub fn bind_mw_type1(
        &mut self,
        qp: &Qp,
        mw_rkey: u32,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<u32> {
        let r: abi::RespMr = self.cmd_t(
            op::BIND_MW,
            &abi::CmdBindMw {
                qpn: qp.qpn,
                mw_rkey,
                mr_lkey,
                access: access.0,
                addr,
                length,
            },
        )?;
        Ok(r.rkey)
    }

    /// MODIFY_SRQ.
    pub fn modify_srq(&mut self, srq: &Srq, attr_mask: u32, max_wr: u32, limit: u32) -> Result<()> {
        self.cmd(
            op::MODIFY_SRQ,
            vm_memory::ByteValued::as_slice(&abi::CmdModifySrq {
                srqn: srq.srqn,
                attr_mask,
                max_wr,
                srq_limit: limit,
            }),
        )
        .map(|_| ())
    }

    /// Posts a REG_MR work request (the contract's kernel-only fast registration): maps
    /// `iova … iova+length` of MR `lkey` under the new `key` onto the guest pages `pages`,
    /// the first byte `page_offset` bytes into the first page (the PAGE_OFFSET flag), or
    /// where `iova` falls in a page (`None`: no flag).
    #[allow(clippy::too_many_arguments)]
    pub fn post_reg_mr(
        &mut self,
        qp: &Qp,
        wr_id: u64,
        lkey: u32,
        key: u32,
        access: Access,
        iova: u64,
        length: u64,
        pages: &[u64],
        page_offset: Option<u32>,
    ) -> Result<()> {
        let list = abi::PageListDesc {
            gpa: self.page_list(pages)?,
            num_pages: pages.len() as u32,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        };
        let slot = reg_mr_slot(
            qp,
            wr_id,
            lkey,
            key,
            access,
            iova,
            length,
            &list,
            page_offset,
        )?;
        self.post_raw_send_slot(qp, &slot)
    }

    /// Writes a send WQE slot into the SQ ring without a doorbell; returns the new producer
    /// index (for [`Guest::doorbell`]).
    pub fn write_send_slot(&mut self, qp: &Qp, slot: &[u8]) -> Result<u32> {
        let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        let prod = sq.producer().load(Ordering::Relaxed);
        sq.map
            .write(sq.slot_off(prod), &slot[..slot.len().min(sq.elem_size())]);
        let next = (prod + 1) & sq.mask();
        sq.producer().store(next, Ordering::Release);
        Ok(next)
    }

    pub fn destroy_cq(&mut self, cq: Cq) -> Result<()> {
        self.handle(op::DESTROY_CQ, cq.cqn)
    }

    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32, limit: u32) -> Result<Srq> {
        let ring = QueueBuf::new(
            self,
            (max_wr + 1).next_power_of_two(),
            abi::rwqe::SIZE + max_sge as usize * abi::SGE_SIZE,
        )?;
        let r: abi::RespCreateSrq = self.cmd_t(
            op::CREATE_SRQ,
            &abi::CmdCreateSrq {
                pdn: pd,
                max_wr,
                max_sge,
                srq_limit: limit,
                queue: ring.desc(),
            },
        )?;
        Ok(Srq {
            srqn: r.srqn,
            ring,
            max_sge,
        })
    }

    pub fn destroy_srq(&mut self, srq: Srq) -> Result<()> {
        self.handle(op::DESTROY_SRQ, srq.srqn)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create_qp(
        &mut self,
        qp_type: QpType,
        pd: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        cap: QpCap,
    ) -> Result<Qp> {
        let sq = if cap.max_send_wr > 0 {
            let elem = abi::swqe::SIZE
                + (cap.max_send_sge as usize * abi::SGE_SIZE).max(cap.max_inline_data as usize);
            Some(QueueBuf::new(
                self,
                (cap.max_send_wr + 1).next_power_of_two(),
                elem,
            )?)
        } else {
            None
        };
        let rq = if srq.is_none() && cap.max_recv_wr > 0 {
            let elem = abi::rwqe::SIZE + cap.max_recv_sge as usize * abi::SGE_SIZE;
            Some(QueueBuf::new(
                self,
                (cap.max_recv_wr + 1).next_power_of_two(),
                elem,
            )?)
        } else {
            None
        };
        let t = match qp_type {
            QpType::Rc => abi::qp_type::RC,
            QpType::Uc => abi::qp_type::UC,
            QpType::Ud => abi::qp_type::UD,
            QpType::Gsi => abi::qp_type::GSI,
        };
        let r: abi::RespCreateQp = self.cmd_t(
            op::CREATE_QP,
            &abi::CmdCreateQp {
                qp_type: t,
                pdn: pd,
                send_cqn: send_cq.cqn,
                recv_cqn: recv_cq.cqn,
                srqn: srq.map_or(0, |s| s.srqn),
                flags: if srq.is_some() {
                    abi::CREATE_QP_HAS_SRQ
                } else {
                    0
                } | if self.kernel_qps {
                    abi::CREATE_QP_KERNEL
                } else {
                    0
                },
                max_send_wr: cap.max_send_wr,
                max_recv_wr: cap.max_recv_wr,
                max_send_sge: cap.max_send_sge,
                max_recv_sge: cap.max_recv_sge,
                max_inline_data: cap.max_inline_data,
                reserved: 0,
                sq: sq.as_ref().map(|q| q.desc()).unwrap_or_default(),
                rq: rq.as_ref().map(|q| q.desc()).unwrap_or_default(),
            },
        )?;
        Ok(Qp {
            qpn: r.qpn,
            qp_type,
            sq,
            rq,
            cap,
        })
    }

    pub fn destroy_qp(&mut self, qp: Qp) -> Result<()> {
        self.handle(op::DESTROY_QP, qp.qpn)
    }

    pub fn modify_qp(&mut self, qp: &Qp, attr: &QpAttr, mask: u32) -> Result<()> {
        let w = abi::QpAttrs {
            qpn: qp.qpn,
            attr_mask: mask,
            qp_state: attr.qp_state as u32,
            cur_qp_state: attr.cur_qp_state as u32,
            path_mtu: attr.path_mtu as u32,
            qkey: attr.qkey,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            dest_qp_num: attr.dest_qp_num,
            qp_access_flags: attr.qp_access_flags.0,
            pkey_index: attr.pkey_index,
            en_sqd_async_notify: attr.en_sqd_async_notify as u8,
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            port_num: attr.port_num,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            ah: abi::AhAttr {
                dgid: attr.av.dgid.0,
                flow_label: attr.av.flow_label,
                sgid_index: attr.av.sgid_index,
                hop_limit: attr.av.hop_limit,
                traffic_class: attr.av.traffic_class,
                dmac: attr.av.dmac,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        self.cmd(op::MODIFY_QP, vm_memory::ByteValued::as_slice(&w))
            .map(|_| ())
    }

    pub fn query_qp(&mut self, qp: &Qp) -> Result<abi::QpAttrs> {
        self.cmd_t(
            op::QUERY_QP,
            &abi::QpAttrs {
                qpn: qp.qpn,
                ..Default::default()
            },
        )
    }

    pub fn create_ah(&mut self, pd: u32, av: &Av) -> Result<u32> {
        let h: abi::Handle = self.cmd_t(
            op::CREATE_AH,
            &abi::CmdCreateAh {
                pdn: pd,
                reserved: 0,
                attr: abi::AhAttr {
                    dgid: av.dgid.0,
                    flow_label: av.flow_label,
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                    dmac: av.dmac,
                    port_num: 1,
                    ..Default::default()
                },
            },
        )?;
        Ok(h.handle)
    }

    // ---------------------------------------------------------------- data path (librxe's part)

    /// Rings a doorbell.
    pub fn doorbell(&mut self, kind: u32, object: u32, index: u32) -> Result<()> {
        // Reclaim finished doorbells first.
        while self.db.poll_used().is_some() {}
        let end = Instant::now() + self.timeout;
        loop {
            // The buffer slot follows the descriptor that will be used: pick by free list top.
            let Some(&d) = self.db.free.last() else {
                if Instant::now() > end {
                    return Err(Error::Timeout("doorbell queue"));
                }
                self.db.wait_used(Duration::from_millis(10));
                continue;
            };
            let gpa = self.db_bufs + 16 * d as u64;
            let e = abi::Doorbell {
                kind,
                object,
                index,
                reserved: 0,
            };
            self.ram.write(gpa, vm_memory::ByteValued::as_slice(&e));
            let kick = self.kick_doorbells;
            self.db
                .add_kick(&[(gpa, 16, false)], kick)
                .ok_or(Error::NoMemory)?;
            return Ok(());
        }
    }

    /// Writes `wr` into the SQ ring as an `rxe_send_wqe`, publishes it, rings the doorbell.
    pub fn post_send(&mut self, qp: &Qp, wr: &SendWr) -> Result<()> {
        self.post_send_ah(qp, wr, 0)
    }

    /// As `post_send`, with a UD destination named by an AH number (0: AV inline).
    pub fn post_send_ah(&mut self, qp: &Qp, wr: &SendWr, ah_num: u32) -> Result<()> {
        let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        if sq.is_full() {
            return Err(Error::NoMemory);
        }
        let prod = sq.producer().load(Ordering::Relaxed);
        let slot = encode_send_wqe(wr, ah_num, sq.elem_size());
        sq.map.write(sq.slot_off(prod), &slot);
        sq.producer()
            .store((prod + 1) & sq.mask(), Ordering::Release);
        self.doorbell(abi::doorbell::SQ, qp.qpn, (prod + 1) & sq.mask())
    }

    /// Writes a raw slot into the SQ (for malformed-WQE tests) and rings the doorbell.
    pub fn post_raw_send_slot(&mut self, qp: &Qp, slot: &[u8]) -> Result<()> {
        let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        let prod = sq.producer().load(Ordering::Relaxed);
        sq.map
            .write(sq.slot_off(prod), &slot[..slot.len().min(sq.elem_size())]);
        sq.producer()
            .store((prod + 1) & sq.mask(), Ordering::Release);
        self.doorbell(abi::doorbell::SQ, qp.qpn, (prod + 1) & sq.mask())
    }

    /// Writes a receive WQE into the RQ ring (no doorbell: librxe does not ring one).
    pub fn post_recv(&mut self, qp: &Qp, wr: &RecvWr) -> Result<()> {
        let rq = qp.rq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        post_recv_ring(rq, wr)
    }

    pub fn post_srq_recv(&mut self, srq: &Srq, wr: &RecvWr) -> Result<()> {
        post_recv_ring(&srq.ring, wr)
    }

    /// Reads up to `max` completions from the CQ ring.
    pub fn poll_cq(&mut self, cq: &Cq, max: usize) -> Vec<Wc> {
        let r = &cq.ring;
        let mut out = Vec::new();
        let mut cons = r.consumer().load(Ordering::Relaxed);
        let prod = r.producer().load(Ordering::Acquire);
        while cons != prod && out.len() < max {
            let mut b = [0u8; abi::CQE_SIZE];
            r.map.read(r.slot_off(cons), &mut b);
            out.push(abi::read_struct(&b).expect("48 bytes"));
            cons = (cons + 1) & r.mask();
        }
        r.consumer().store(cons, Ordering::Release);
        out
    }

    /// Polls until `n` completions arrived or the timeout passed.
    pub fn wait_cq(&mut self, cq: &Cq, n: usize, timeout: Duration) -> Vec<Wc> {
        let end = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut spins = 0u32;
        while out.len() < n {
            let got = self.poll_cq(cq, n - out.len());
            if got.is_empty() {
                if Instant::now() > end {
                    break;
                }
                spins += 1;
                if spins > 200 {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    std::hint::spin_loop();
                }
            } else {
                spins = 0;
            }
            out.extend(got);
        }
        out
    }

    /// Arms the CQ (the notify word); returns true if completions may have been missed (the
    /// ring is not empty), as `IB_CQ_REPORT_MISSED_EVENTS` does.
    pub fn req_notify_cq(&mut self, cq: &Cq, solicited_only: bool) -> bool {
        let w = if solicited_only {
            hdr::NOTIFY_SOLICITED
        } else {
            hdr::NOTIFY_NEXT_COMP
        };
        cq.ring.notify().store(w, Ordering::Release);
        fence(Ordering::SeqCst);
        cq.ring.producer().load(Ordering::Acquire) != cq.ring.consumer().load(Ordering::Relaxed)
    }

    /// Doorbell kicks so far: (buffers added with a kick, added without one because the
    /// device had kicks suppressed).
    pub fn doorbell_kicks(&self) -> (u64, u64) {
        (self.db.kicks, self.db.kicks_suppressed)
    }

    /// Events delivered so far (reposting their buffers).
    pub fn poll_events(&mut self) -> Vec<abi::Event> {
        while let Some((id, len)) = self.ev.poll_used() {
            let gpa = self.ev_bufs + 16 * id as u64;
            if len >= 16 {
                let mut b = [0u8; 16];
                self.ram.read(gpa, &mut b);
                if let Some(e) = abi::read_struct(&b) {
                    self.pending_events.push_back(e);
                }
            }
            self.ev.add(&[(gpa, 16, true)]);
        }
        self.pending_events.drain(..).collect()
    }

    /// Waits until an event matching `f` arrives.
    pub fn wait_event(
        &mut self,
        timeout: Duration,
        f: impl Fn(&abi::Event) -> bool,
    ) -> Option<abi::Event> {
        let end = Instant::now() + timeout;
        let mut seen = Vec::new();
        let r = loop {
            let evs = self.poll_events();
            let mut hit = None;
            for e in evs {
                if hit.is_none() && f(&e) {
                    hit = Some(e);
                } else {
                    seen.push(e);
                }
            }
            if hit.is_some() {
                break hit;
            }
            if Instant::now() > end {
                break None;
            }
            if let Some((id, len)) = self.ev.wait_used(Duration::from_millis(20)) {
                // Keep it for the next poll_events round and repost the buffer.
                let gpa = self.ev_bufs + 16 * id as u64;
                let mut b = [0u8; 16];
                self.ram.read(gpa, &mut b);
                if len >= 16 {
                    if let Some(e) = abi::read_struct(&b) {
                        self.pending_events.push_back(e);
                    }
                }
                self.ev.add(&[(gpa, 16, true)]);
            }
        };
        for e in seen.into_iter().rev() {
            self.pending_events.push_front(e);
        }
        r
    }
}

fn post_recv_ring(rq: &QueueBuf, wr: &RecvWr) -> Result<()> {
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

// ---------------------------------------------------------------------------------------------
// Daemon processes and two-node setups

/// A running daemon process (killed with SIGTERM on drop).
pub struct Daemon {
    /// The process; shared by the devices of one process ([`Daemon::spawn_two`]), and
    /// stopped when the last of them is dropped.
    child: Arc<Mutex<Child>>,
    pub socket: PathBuf,
    pub counters: PathBuf,
    pub addr: SocketAddr,
    dir: PathBuf,
    launch: Launch,
}

/// How a [`Daemon`] process is started (kept for [`Daemon::restart`]).
#[derive(Clone)]
struct Launch {
    bin: PathBuf,
    socket: PathBuf,
    counters: PathBuf,
    addr: SocketAddr,
    extra: Vec<String>,
    cpus: Option<Vec<usize>>,
    /// Where stderr goes ([`Daemon::spawn_logged`]), else inherited.
    log: Option<PathBuf>,
}

impl Daemon {
    /// Starts `bin` bound to `addr`.
    pub fn spawn(bin: &Path, addr: SocketAddr, extra: &[&str]) -> io::Result<Daemon> {
        Self::spawn_on(bin, addr, extra, None)
    }

    /// As [`Daemon::spawn`], with the daemon's stderr (its log, at `RUST_LOG=info`) kept in a
    /// file for [`Daemon::log`].
    pub fn spawn_logged(bin: &Path, addr: SocketAddr, extra: &[&str]) -> io::Result<Daemon> {
        Self::spawn_with(bin, addr, extra, None, true)
    }

    /// Starts `bin` bound to `addr`, restricted to the CPUs in `cpus` if given.
    pub fn spawn_on(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> io::Result<Daemon> {
        Self::spawn_with(bin, addr, extra, cpus, false)
    }

    fn spawn_with(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
        logged: bool,
    ) -> io::Result<Daemon> {
        Self::spawn_in(Self::new_dir()?, bin, addr, extra, cpus, logged)
    }

    /// As [`Self::spawn_with`], its sockets (and log) in `dir`.
    fn spawn_in(
        dir: PathBuf,
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
        logged: bool,
    ) -> io::Result<Daemon> {
        let launch = Launch {
            bin: bin.to_path_buf(),
            socket: dir.join("rdma.sock"),
            counters: dir.join("counters.sock"),
            addr,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            cpus: cpus.map(|c| c.to_vec()),
            log: logged.then(|| dir.join("daemon.log")),
        };
        Ok(Daemon {
            child: Arc::new(Mutex::new(launch.start()?)),
            socket: launch.socket.clone(),
            counters: launch.counters.clone(),
            addr,
            dir,
            launch,
        })
    }

    /// Starts one daemon process serving two devices (`--socket-path` and `--udp-addr`
    /// twice) on `a` and `b`, with `extra` (`--same-host`, say): one [`Daemon`] per device,
    /// both of the same process, restricted to `cpus` if given.
    pub fn spawn_two(
        bin: &Path,
        a: SocketAddr,
        b: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> io::Result<(Daemon, Daemon)> {
        let dir = Self::new_dir()?;
        let (b_sock, b_counters) = (dir.join("rdma-b.sock"), dir.join("counters-b.sock"));
        let (b_sock, b_counters) = (
            b_sock.display().to_string(),
            b_counters.display().to_string(),
        );
        let mut all = extra.to_vec();
        all.extend(["--socket-path", &b_sock, "--udp-addr"]);
        let b_addr = b.to_string();
        all.extend([b_addr.as_str(), "--counters-socket", &b_counters]);
        let first = Self::spawn_in(dir, bin, a, &all, cpus, false)?;
        let second = Daemon {
            child: first.child.clone(),
            socket: b_sock.into(),
            counters: b_counters.into(),
            addr: b,
            dir: first.dir.clone(),
            launch: first.launch.clone(),
        };
        Ok((first, second))
    }

    /// A fresh directory for a daemon's sockets and log.
    fn new_dir() -> io::Result<PathBuf> {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vur-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Kills the daemon the way a crash does (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let mut c = lock(&self.child);
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Starts the daemon again, same binary, arguments, socket and address (a restarted
    /// daemon); the old process must be gone ([`Daemon::kill`], [`Daemon::terminate`]).
    pub fn restart(&mut self) -> io::Result<()> {
        *lock(&self.child) = self.launch.start()?;
        Ok(())
    }

    /// What the daemon logged so far ([`Daemon::spawn_logged`] only; empty otherwise).
    pub fn log(&self) -> String {
        self.launch
            .log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        lock(&self.child).id()
    }

    /// The counters JSON (waits up to 5 s for the socket to appear).
    pub fn counters(&self) -> io::Result<String> {
        use std::io::Read;
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match std::os::unix::net::UnixStream::connect(&self.counters) {
                Ok(mut s) => {
                    let mut out = String::new();
                    s.read_to_string(&mut out)?;
                    return Ok(out);
                }
                Err(e) if Instant::now() > end => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Number of open fds of the daemon process.
    pub fn fd_count(&self) -> io::Result<usize> {
        Ok(std::fs::read_dir(format!("/proc/{}/fd", self.pid()))?.count())
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(lock(&self.child).try_wait(), Ok(None))
    }

    /// SIGTERM and wait (bounded); returns the exit status code if it exited.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = lock(&self.child);
        if let Ok(Some(s)) = c.try_wait() {
            return s.code();
        }
        // SAFETY: signalling our own child by pid (not reaped: try_wait said it runs).
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(s)) = c.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

/// `$VUR_DAEMON_ARGS`: arguments for every daemon of a run (e.g. `--engine-shards 3`: the
/// whole suite against a device in shards), but for an option the test gives itself
/// (`extra`), whose value stands.
fn run_args(extra: &[String]) -> Vec<String> {
    merge_args(&std::env::var("VUR_DAEMON_ARGS").unwrap_or_default(), extra)
}

/// The words of `env` but the options `extra` names (each with its value, if it has one).
fn merge_args(env: &str, extra: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = env.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let name = w.split('=').next().unwrap_or(w);
        let own = name.starts_with("--")
            && extra
                .iter()
                .any(|e| e == name || e.starts_with(&format!("{name}=")));
        let value = (!w.contains('=') && words.peek().is_some_and(|v| !v.starts_with("--")))
            .then(|| words.next())
            .flatten();
        if !own {
            out.push(w.to_string());
            out.extend(value.map(str::to_string));
        }
    }
    out
}

impl Launch {
    /// Starts the process on this socket, address and arguments.
    fn start(&self) -> io::Result<Child> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--socket-path")
            .arg(&self.socket)
            .arg("--udp-addr")
            .arg(self.addr.to_string());
        // Peers on the daemon's own port unless the caller names another (two daemons on
        // one address, e.g. ::1, each sending to the other's port).
        if !self
            .extra
            .iter()
            .any(|a| a == "--peer-port" || a.starts_with("--peer-port="))
        {
            cmd.arg("--peer-port").arg(self.addr.port().to_string());
        }
        cmd.arg("--counters-socket")
            .arg(&self.counters)
            .args(&self.extra)
            .args(run_args(&self.extra))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null());
        if let Some(log) = &self.log {
            cmd.env("RUST_LOG", "info");
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?;
            cmd.stderr(f);
        }
        if let Some(cpus) = &self.cpus {
            let set = cpu_set(cpus);
            // SAFETY: the closure runs in the child between fork and exec and only calls
            // sched_setaffinity (async-signal-safe) on a set built before the fork.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.spawn()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // The last device of the process stops it.
        if Arc::strong_count(&self.child) > 1 {
            return;
        }
        if self.is_alive() {
            self.terminate();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, so the bit is inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// Restricts the calling thread to the CPUs in `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Extracts `"key":<number>` from the counters JSON (first occurrence after `section`).
pub fn json_u64(json: &str, section: &str, key: &str) -> Option<u64> {
    let from = if section.is_empty() {
        0
    } else {
        json.find(&format!("\"{section}\""))?
    };
    let pat = format!("\"{key}\":");
    let at = json[from..].find(&pat)? + from + pat.len();
    let end = json[at..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(json.len(), |e| at + e);
    json[at..end].parse().ok()
}

/// Two loopback addresses unique to this process and call: 127.X.Y.1 and 127.X.Y.2.
pub fn loopback_pair(port: u16) -> (SocketAddr, SocketAddr) {
    static N: AtomicU8 = AtomicU8::new(0);
    let x = 64 + (std::process::id() % 128) as u8;
    let y = N.fetch_add(1, Ordering::Relaxed);
    (
        SocketAddr::new(Ipv4Addr::new(127, x, y, 1).into(), port),
        SocketAddr::new(Ipv4Addr::new(127, x, y, 2).into(), port),
    )
}

/// Finds the daemon binary: `$VUR_DAEMON`, or `vhost-user-rdma` / `vur-daemon` next to the
/// running executable (or one directory up, for test executables in `deps/`).
pub fn find_daemon() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VUR_DAEMON") {
        return Some(p.into());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    for d in [dir, dir.parent()?] {
        for n in ["vhost-user-rdma", "vur-daemon"] {
            let p = d.join(n);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

/// One node: a daemon and the test guest attached to it, with GID 0 set to its address.
pub struct Node {
    pub daemon: Daemon,
    pub guest: Guest,
    pub gid: Gid,
    /// The MAC peers put in their address vectors for this node (what the raw transport
    /// sends frames to; zero for the udp transport, which has no use for it).
    pub mac: [u8; 6],
}

impl Node {
    pub fn start(bin: &Path, addr: SocketAddr, extra: &[&str]) -> Result<Node> {
        Self::start_on(bin, addr, extra, None)
    }

    /// As [`Node::start`], with the daemon restricted to `cpus`.
    pub fn start_on(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> Result<Node> {
        Self::start_with(bin, addr, extra, cpus, GuestOpts::default())
    }

    /// As [`Node::start_on`], with the guest's options (memory size, queues).
    pub fn start_with(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
        opts: GuestOpts,
    ) -> Result<Node> {
        let daemon = Daemon::spawn_on(bin, addr, extra, cpus)?;
        Self::attach(daemon, opts)
    }

    /// A test guest on `daemon`'s socket, with the daemon's address as GID 0.
    fn attach(daemon: Daemon, opts: GuestOpts) -> Result<Node> {
        let mut guest = Guest::connect(&daemon.socket, opts)?;
        let gid = Gid::from_ip(daemon.addr.ip());
        guest.add_gid(0, gid)?;
        Ok(Node {
            daemon,
            guest,
            gid,
            mac: [0; 6],
        })
    }

    /// Two nodes on one daemon process serving two devices ([`Daemon::spawn_two`]).
    pub fn start_two(
        bin: &Path,
        a: SocketAddr,
        b: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> Result<(Node, Node)> {
        let (da, db) = Daemon::spawn_two(bin, a, b, extra, cpus)?;
        Ok((
            Self::attach(da, GuestOpts::default())?,
            Self::attach(db, GuestOpts::default())?,
        ))
    }
}

/// Where a UD send goes: the QP `qpn` with Q_Key `qkey` at `dgid` (source GID index 0, hop
/// limit 64).
pub fn ud_dest(dgid: Gid, qpn: u32, qkey: u32) -> UdDest {
    UdDest {
        av: Av {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            ..Default::default()
        },
        remote_qpn: rxe_core::Qpn(qpn),
        remote_qkey: qkey,
    }
}

/// What [`connect_qps`] builds on one side.
pub struct End {
    pub pd: u32,
    pub cq: Cq,
    pub qp: Qp,
}

/// Connection options.
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    pub qp_type: QpType,
    pub mtu: Mtu,
    pub cap: QpCap,
    pub cqe: u32,
    pub access: Access,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            qp_type: QpType::Rc,
            mtu: Mtu::M1024,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 128,
            },
            cqe: 1023,
            access: Access::LOCAL_WRITE.union(Access::REMOTE),
            // 268 ms (4.096 µs × 2^16), seven retries: a test fails on RETRY_EXC_ERR only when
            // a daemon made no progress for about 1.9 s, not when a loaded machine kept it
            // off the CPU for 120 ms (with 2^12: one failure in a full run under load). Tests
            // of retry exhaustion set their own.
            timeout: 16,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
        }
    }
}

/// Moves a QP through INIT → RTR → RTS towards `(dgid, dqpn)`, the way ibv_rc_pingpong does.
pub fn bring_up(g: &mut Guest, qp: &Qp, dgid: Gid, dqpn: u32, o: &ConnOpts) -> Result<()> {
    bring_up_l2(g, qp, dgid, [0; 6], dqpn, o)
}

/// As [`bring_up`], with the destination MAC the driver resolved for `dgid` in the address
/// vector (the raw transport puts it on the frames).
pub fn bring_up_l2(
    g: &mut Guest,
    qp: &Qp,
    dgid: Gid,
    dmac: [u8; 6],
    dqpn: u32,
    o: &ConnOpts,
) -> Result<()> {
    let ud = matches!(qp.qp_type, QpType::Ud | QpType::Gsi);
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: o.access,
        qkey: 0x1111_1111,
        ..Default::default()
    };
    let m = AttrMask::STATE
        | AttrMask::PKEY_INDEX
        | AttrMask::PORT
        | if ud {
            AttrMask::QKEY
        } else {
            AttrMask::ACCESS_FLAGS
        };
    g.modify_qp(qp, &a, m)?;
    a.qp_state = QpState::Rtr;
    let mut m = AttrMask::STATE;
    if !ud {
        a.path_mtu = o.mtu;
        a.dest_qp_num = dqpn;
        a.rq_psn = 0x100;
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = o.min_rnr_timer;
        a.av = Av {
            dgid,
            sgid_index: 0,
            hop_limit: 64,
            dmac,
            ..Default::default()
        };
        m |= AttrMask::AV | AttrMask::PATH_MTU | AttrMask::DEST_QPN | AttrMask::RQ_PSN;
        if qp.qp_type == QpType::Rc {
            m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
        }
    }
    g.modify_qp(qp, &a, m)?;
    a.qp_state = QpState::Rts;
    a.sq_psn = 0x100;
    a.timeout = o.timeout;
    a.retry_cnt = o.retry_cnt;
    a.rnr_retry = o.rnr_retry;
    a.max_rd_atomic = 16;
    let mut m = AttrMask::STATE | AttrMask::SQ_PSN;
    if qp.qp_type == QpType::Rc {
        m |= AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
    }
    g.modify_qp(qp, &a, m)
}

/// Creates a PD, a CQ and a QP on each node and connects the QPs (each address vector with
/// the other node's MAC).
pub fn connect_qps(a: &mut Node, b: &mut Node, o: &ConnOpts) -> Result<(End, End)> {
    let mk = |n: &mut Node| -> Result<End> {
        let pd = n.guest.alloc_pd()?;
        let cq = n.guest.create_cq(o.cqe)?;
        let qp = n.guest.create_qp(o.qp_type, pd, &cq, &cq, None, o.cap)?;
        Ok(End { pd, cq, qp })
    };
    let ea = mk(a)?;
    let eb = mk(b)?;
    bring_up_l2(&mut a.guest, &ea.qp, b.gid, b.mac, eb.qp.qpn, o)?;
    bring_up_l2(&mut b.guest, &eb.qp, a.gid, a.mac, ea.qp.qpn, o)?;
    Ok((ea, eb))
}

// ---------------------------------------------------------------------------------------------
// Measurements shared by the demo and the bench

pub mod perf {
    use super::*;

    const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

    /// How the benchmarks wait for a completion.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum WaitMode {
        /// Busy-poll the CQ ring (`ibv_rc_pingpong` without `-e`).
        Spin,
        /// Poll briefly, then arm the CQ and sleep until the device's COMPLETION event
        /// (`ibv_rc_pingpong -e`): leaves the CPU to the daemons.
        Event,
    }

    /// Waits for one successful completion on `cq`.
    pub fn wait_one(g: &mut Guest, cq: &Cq, mode: WaitMode, timeout: Duration) -> Result<Wc> {
        match mode {
            WaitMode::Spin => spin_one(g, cq, timeout),
            WaitMode::Event => event_one(g, cq, timeout),
        }
    }

    /// Polls a little, then arms the CQ and blocks on the event queue.
    pub fn event_one(g: &mut Guest, cq: &Cq, timeout: Duration) -> Result<Wc> {
        let end = Instant::now() + timeout;
        loop {
            for _ in 0..64 {
                if let Some(w) = g.poll_cq(cq, 1).pop() {
                    if w.status != 0 {
                        return Err(Error::BadStatus(w.status));
                    }
                    return Ok(w);
                }
                std::hint::spin_loop();
            }
            if g.req_notify_cq(cq, false) {
                continue; // missed events: the ring is not empty
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout("completion"));
            }
            let cqn = cq.cqn;
            g.wait_event(left, |e| {
                e.kind == abi::event::KIND_COMPLETION && e.object == cqn
            });
        }
    }

    /// Busy-polls `cq` until one completion arrives.
    pub fn spin_one(g: &mut Guest, cq: &Cq, timeout: Duration) -> Result<Wc> {
        let end = Instant::now() + timeout;
        let mut i = 0u32;
        loop {
            if let Some(w) = g.poll_cq(cq, 1).pop() {
                if w.status != 0 {
                    return Err(Error::BadStatus(w.status));
                }
                return Ok(w);
            }
            i = i.wrapping_add(1);
            if i.is_multiple_of(1024) && Instant::now() > end {
                return Err(Error::Timeout("completion"));
            }
            std::hint::spin_loop();
        }
    }

    /// RC SEND ping-pong of `size` bytes, busy-polling; returns the mean half round trip.
    pub fn rc_pingpong(a: &mut Node, b: &mut Node, size: u32, iters: u32) -> Result<Duration> {
        rc_pingpong_wait(a, b, size, iters, WaitMode::Spin)
    }

    /// RC SEND ping-pong of `size` bytes; returns the mean half round trip.
    pub fn rc_pingpong_wait(
        a: &mut Node,
        b: &mut Node,
        size: u32,
        iters: u32,
        mode: WaitMode,
    ) -> Result<Duration> {
        let (ea, eb) = connect_qps(a, b, &ConnOpts::default())?;
        let ma = a.guest.reg_mr(ea.pd, 4096, ALL)?;
        let mb = b.guest.reg_mr(eb.pd, 4096, ALL)?;
        let t = Duration::from_secs(10);
        let warm = 100;
        let mut start = Instant::now();
        for i in 0..iters + warm {
            if i == warm {
                start = Instant::now();
            }
            b.guest.post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: 1,
                    sg_list: vec![mb.sge(0, 4096)].into(),
                },
            )?;
            a.guest.post_recv(
                &ea.qp,
                &RecvWr {
                    wr_id: 2,
                    sg_list: vec![ma.sge(2048, 2048)].into(),
                },
            )?;
            a.guest
                .post_send(&ea.qp, &SendWr::new(3, SendOp::Send, vec![ma.sge(0, size)]))?;
            wait_one(&mut b.guest, &eb.cq, mode, t)?; // recv at b
            b.guest
                .post_send(&eb.qp, &SendWr::new(4, SendOp::Send, vec![mb.sge(0, size)]))?;
            wait_one(&mut a.guest, &ea.cq, mode, t)?; // send done or recv at a
            wait_one(&mut a.guest, &ea.cq, mode, t)?;
            wait_one(&mut b.guest, &eb.cq, mode, t)?; // send done at b
        }
        Ok(start.elapsed() / (2 * iters))
    }

    /// RC WRITE stream of `size`-byte messages with `depth` outstanding; returns bytes/s.
    pub fn rc_write_bw(
        a: &mut Node,
        b: &mut Node,
        size: u32,
        total: u64,
        depth: u32,
    ) -> Result<f64> {
        // The largest path MTU the port allows (4096 with a netdev MTU >= 4176).
        let mtu = Mtu::from_enum(a.guest.config.active_mtu).unwrap_or(Mtu::M1024);
        let o = ConnOpts {
            cqe: 4095,
            mtu,
            ..Default::default()
        };
        let (ea, eb) = connect_qps(a, b, &o)?;
        let ma = a.guest.reg_mr(ea.pd, size as usize, ALL)?;
        let mb = b.guest.reg_mr(eb.pd, size as usize, ALL)?;
        let n = total.div_ceil(size as u64);
        let (mut posted, mut done) = (0u64, 0u64);
        let t = Duration::from_secs(30);
        let start = Instant::now();
        while done < n {
            while posted < n && posted - done < depth as u64 {
                let wr = SendWr::new(
                    posted,
                    SendOp::Write {
                        remote_addr: mb.addr(0),
                        rkey: mb.rkey,
                    },
                    vec![ma.sge(0, size)],
                );
                a.guest.post_send(&ea.qp, &wr)?;
                posted += 1;
            }
            let w = a.guest.wait_cq(&ea.cq, 1, t);
            if w.is_empty() {
                return Err(Error::Timeout("write completion"));
            }
            if w[0].status != 0 {
                return Err(Error::BadStatus(w[0].status));
            }
            done += 1;
            done += a.guest.poll_cq(&ea.cq, 64).len() as u64;
        }
        let _ = eb;
        Ok((n * size as u64) as f64 / start.elapsed().as_secs_f64())
    }

    /// [`rc_write_bw`] over `qps` RC pairs at once, `total` bytes spread evenly over them,
    /// `depth` outstanding on each; bytes/s from the first post to the last completion.
    pub fn rc_write_bw_qps(
        a: &mut Node,
        b: &mut Node,
        qps: usize,
        size: u32,
        total: u64,
        depth: u32,
    ) -> Result<f64> {
        // The largest path MTU the port allows (4096 with a netdev MTU >= 4176).
        let mtu = Mtu::from_enum(a.guest.config.active_mtu).unwrap_or(Mtu::M1024);
        let o = ConnOpts {
            cqe: 4095,
            mtu,
            ..Default::default()
        };
        let mut ends = Vec::new();
        for _ in 0..qps.max(1) {
            let (ea, eb) = connect_qps(a, b, &o)?;
            let ma = a.guest.reg_mr(ea.pd, size as usize, ALL)?;
            let mb = b.guest.reg_mr(eb.pd, size as usize, ALL)?;
            ends.push((ea, ma, mb));
        }
        let per = total.div_ceil(size as u64).div_ceil(ends.len() as u64);
        let mut posted = vec![0u64; ends.len()];
        let mut done = vec![0u64; ends.len()];
        let t = Duration::from_secs(30);
        let start = Instant::now();
        let end = start + t;
        while done.iter().any(|&d| d < per) {
            if Instant::now() > end {
                return Err(Error::Timeout("write completions"));
            }
            for (i, (ea, ma, mb)) in ends.iter().enumerate() {
                while posted[i] < per && posted[i] - done[i] < depth as u64 {
                    let wr = SendWr::new(
                        posted[i],
                        SendOp::Write {
                            remote_addr: mb.addr(0),
                            rkey: mb.rkey,
                        },
                        vec![ma.sge(0, size)],
                    );
                    a.guest.post_send(&ea.qp, &wr)?;
                    posted[i] += 1;
                }
                for w in a.guest.poll_cq(&ea.cq, 64) {
                    if w.status != 0 {
                        return Err(Error::BadStatus(w.status));
                    }
                    done[i] += 1;
                }
            }
        }
        let n = per * ends.len() as u64;
        Ok((n * size as u64) as f64 / start.elapsed().as_secs_f64())
    }

    /// The reference of the same-host WRITE row: `total` bytes copied with memcpy in blocks
    /// of `size`, from one page-aligned buffer of `size` bytes to another (what a WRITE of one
    /// registered buffer into another moves); bytes/s. Page-aligned as the benchmark's MRs
    /// are: two heap blocks side by side would put the destination a few bytes past the
    /// source's offset in its page, where `rep movsb` stalls on 4 KiB aliasing (20x slower
    /// here), which is no baseline.
    pub fn memcpy_bw(size: usize, total: u64) -> f64 {
        let mut src = vec![0u8; size + 4096];
        let mut dst = vec![0u8; size + 4096];
        let align = |v: &Vec<u8>| (4096 - v.as_ptr() as usize % 4096) % 4096;
        let (so, d0) = (align(&src), align(&dst));
        for (i, b) in src[so..so + size].iter_mut().enumerate() {
            *b = i as u8;
        }
        let n = total.div_ceil(size as u64);
        let start = Instant::now();
        for _ in 0..n {
            dst[d0..d0 + size].copy_from_slice(std::hint::black_box(&src[so..so + size]));
            std::hint::black_box(&mut dst);
        }
        (n * size as u64) as f64 / start.elapsed().as_secs_f64().max(1e-9)
    }

    /// Round trips of a control command (QUERY_PORT) on the device of `a`: `n` with nothing
    /// else to do, then `n` while `a` keeps `depth` RC WRITEs of `size` bytes in flight to
    /// `b` (one command after each top-up of the send queue). Returns the sorted round trips,
    /// idle and under load: whether the control queue waits behind bulk data.
    pub fn ctrl_under_write(
        a: &mut Node,
        b: &mut Node,
        size: u32,
        depth: u32,
        n: usize,
    ) -> Result<(Vec<Duration>, Vec<Duration>)> {
        let mtu = Mtu::from_enum(a.guest.config.active_mtu).unwrap_or(Mtu::M1024);
        let o = ConnOpts {
            cqe: 4095,
            mtu,
            ..Default::default()
        };
        let (ea, eb) = connect_qps(a, b, &o)?;
        let ma = a.guest.reg_mr(ea.pd, size as usize, ALL)?;
        let mb = b.guest.reg_mr(eb.pd, size as usize, ALL)?;
        let timed = |g: &mut Guest| -> Result<Duration> {
            let t0 = Instant::now();
            g.query_port()?;
            Ok(t0.elapsed())
        };
        let mut idle = Vec::with_capacity(n);
        for _ in 0..n {
            idle.push(timed(&mut a.guest)?);
        }
        let mut loaded = Vec::with_capacity(n);
        let (mut posted, mut done) = (0u64, 0u64);
        let t = Duration::from_secs(30);
        while loaded.len() < n {
            while posted - done < depth as u64 {
                let wr = SendWr::new(
                    posted,
                    SendOp::Write {
                        remote_addr: mb.addr(0),
                        rkey: mb.rkey,
                    },
                    vec![ma.sge(0, size)],
                );
                a.guest.post_send(&ea.qp, &wr)?;
                posted += 1;
            }
            loaded.push(timed(&mut a.guest)?);
            let w = a.guest.wait_cq(&ea.cq, 1, t);
            if w.is_empty() {
                return Err(Error::Timeout("write completion"));
            }
            if w[0].status != 0 {
                return Err(Error::BadStatus(w[0].status));
            }
            done += 1;
            done += a.guest.poll_cq(&ea.cq, 64).len() as u64;
        }
        // the rest of the WRITEs, so that the QPs go down quiet
        while done < posted {
            let w = a.guest.wait_cq(&ea.cq, 1, t);
            if w.is_empty() {
                return Err(Error::Timeout("write completion"));
            }
            done += w.len() as u64;
        }
        let _ = eb;
        idle.sort();
        loaded.sort();
        Ok((idle, loaded))
    }

    /// 64-byte RC SENDs with `depth` outstanding; returns messages/s.
    pub fn rc_msg_rate(
        a: &mut Node,
        b: &mut Node,
        size: u32,
        count: u64,
        depth: u32,
    ) -> Result<f64> {
        let o = ConnOpts {
            cqe: 4095,
            cap: QpCap {
                max_send_wr: 512,
                max_recv_wr: 1024,
                ..ConnOpts::default().cap
            },
            ..Default::default()
        };
        let (ea, eb) = connect_qps(a, b, &o)?;
        let ma = a.guest.reg_mr(ea.pd, 4096, ALL)?;
        let mb = b.guest.reg_mr(eb.pd, 4096, ALL)?;
        let (mut posted, mut done, mut recvd, mut rposted) = (0u64, 0u64, 0u64, 0u64);
        let t = Instant::now() + Duration::from_secs(60);
        let start = Instant::now();
        while recvd < count {
            if Instant::now() > t {
                return Err(Error::Timeout("message rate"));
            }
            while rposted < count && rposted - recvd < 1000 {
                b.guest.post_recv(
                    &eb.qp,
                    &RecvWr {
                        wr_id: rposted,
                        sg_list: vec![mb.sge(0, 4096)].into(),
                    },
                )?;
                rposted += 1;
            }
            while posted < count && posted - done < depth as u64 && posted < rposted {
                let mut wr = SendWr::new(posted, SendOp::Send, vec![]);
                wr.flags |= SEND_INLINE;
                wr.inline_data = vec![0x5a; size as usize];
                a.guest.post_send(&ea.qp, &wr)?;
                posted += 1;
            }
            for w in a.guest.poll_cq(&ea.cq, 256) {
                if w.status != 0 {
                    return Err(Error::BadStatus(w.status));
                }
                done += 1;
            }
            recvd += b.guest.poll_cq(&eb.cq, 256).len() as u64;
        }
        let _ = ma;
        Ok(count as f64 / start.elapsed().as_secs_f64())
    }

    /// Plain UDP ping-pong between two sockets on loopback (two threads); mean half round trip.
    pub fn udp_pingpong(size: usize, iters: u32) -> io::Result<Duration> {
        let (x, y) = loopback_pair(0);
        let a = std::net::UdpSocket::bind(x)?;
        let b = std::net::UdpSocket::bind(y)?;
        let (aa, ba) = (a.local_addr()?, b.local_addr()?);
        let echo = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            for _ in 0..iters + 100 {
                if b.recv(&mut buf).is_err() {
                    return;
                }
                let _ = b.send_to(&buf[..size], aa);
            }
        });
        let mut buf = vec![0u8; 2048];
        a.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut start = Instant::now();
        for i in 0..iters + 100 {
            if i == 100 {
                start = Instant::now();
            }
            a.send_to(&buf[..size], ba)?;
            a.recv(&mut buf)?;
        }
        let d = start.elapsed() / (2 * iters);
        let _ = echo.join();
        Ok(d)
    }

    /// A stream of `count` UDP datagrams of `size` bytes between two loopback sockets (the
    /// receiver in a thread); datagrams received per second.
    pub fn udp_stream_rate(size: usize, count: u64) -> io::Result<f64> {
        let (x, y) = loopback_pair(0);
        let a = std::net::UdpSocket::bind(x)?;
        let b = std::net::UdpSocket::bind(y)?;
        let ba = b.local_addr()?;
        b.set_read_timeout(Some(Duration::from_millis(200)))?;
        let rx = std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let mut n = 0u64;
            let mut first = None;
            let mut last = Instant::now();
            while n < count {
                if b.recv(&mut buf).is_err() {
                    break;
                }
                last = Instant::now();
                first.get_or_insert(last);
                n += 1;
            }
            (n, first.map_or(Duration::ZERO, |f| last - f))
        });
        let buf = vec![0x5au8; size];
        for _ in 0..count {
            a.send_to(&buf, ba)?;
        }
        let (n, d) = rx
            .join()
            .map_err(|_| io::Error::other("receiver panicked"))?;
        Ok(n as f64 / d.as_secs_f64().max(1e-9))
    }

    /// A TCP loopback stream of `total` bytes in `chunk` writes; bytes/s.
    pub fn tcp_stream(chunk: usize, total: u64) -> io::Result<f64> {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let addr = l.local_addr()?;
        let rx = std::thread::spawn(move || -> io::Result<u64> {
            let (mut s, _) = l.accept()?;
            let mut buf = vec![0u8; 1 << 16];
            let mut n = 0u64;
            loop {
                let r = s.read(&mut buf)?;
                if r == 0 {
                    return Ok(n);
                }
                n += r as u64;
            }
        });
        let mut s = std::net::TcpStream::connect(addr)?;
        let buf = vec![0x5au8; chunk];
        let start = Instant::now();
        let mut sent = 0u64;
        while sent < total {
            s.write_all(&buf)?;
            sent += chunk as u64;
        }
        drop(s);
        let got = rx
            .join()
            .map_err(|_| io::Error::other("receiver panicked"))??;
        Ok(got as f64 / start.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::merge_args;

    #[test]
    fn run_arguments_yield_to_the_tests_own() {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let env = "--engine-shards 3 --io-thread --poll-us=20 --mtu 9000";
        assert_eq!(
            merge_args(env, &own(&["--engine-shards", "2"])),
            own(&["--io-thread", "--poll-us=20", "--mtu", "9000"])
        );
        assert_eq!(
            merge_args(env, &own(&["--poll-us", "5", "--mtu=1500"])),
            own(&["--engine-shards", "3", "--io-thread"])
        );
        assert_eq!(merge_args("", &own(&["--io-thread"])), Vec::<String>::new());
    }
}
