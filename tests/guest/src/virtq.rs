//! A split virtqueue, driver side.

use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::VringConfigData;
use vmm_sys_util::eventfd::EventFd;

use crate::error::Result;
use crate::ram::GuestRam;

// ---------------------------------------------------------------------------------------------
// Split virtqueue, driver side

const VIRTQ_DESC_F_NEXT: u16 = 1;
const VIRTQ_DESC_F_WRITE: u16 = 2;

pub struct Virtq {
    ram: Arc<GuestRam>,
    pub size: u16,
    desc: u64,
    pub(crate) avail: u64,
    pub(crate) used: u64,
    pub(crate) free: Vec<u16>,
    pub(crate) avail_idx: u16,
    last_used: u16,
    event_idx: bool,
    /// Whether to ask for used-buffer notifications (EVENT_IDX's used_event; without
    /// EVENT_IDX, VRING_AVAIL_F_NO_INTERRUPT when false).
    pub(crate) interrupts: bool,
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
    pub(crate) fn start_at(&mut self, base: u16) {
        self.avail_idx = base;
        self.last_used = base;
        self.ram.write(self.avail + 2, &base.to_le_bytes());
        self.ram.write(self.used + 2, &base.to_le_bytes());
    }

    pub(crate) fn config(&self) -> VringConfigData {
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
    pub(crate) fn set_interrupts(&mut self, on: bool) {
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
