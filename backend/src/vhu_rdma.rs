//! The `VhostUserBackend` implementation, and nothing else: it dispatches vring kicks, UDP
//! readiness and timer expiry to the device model and moves bytes between virtqueues and the
//! model. All events of one frontend connection run on one worker thread.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::{VIRTIO_F_NOTIFY_ON_EMPTY, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::abi::{self, NUM_QUEUES, VQ_CTRL, VQ_DOORBELL, VQ_EVENT};
use crate::guest_mem::GuestMemoryMmap;
use crate::model::Model;
use crate::transport::{UdpTransport, RX_BATCH};

/// Epoll ids of the extra fds (ids up to `NUM_QUEUES` are reserved by vhost-user-backend).
pub const UDP_EVENT: u16 = NUM_QUEUES as u16 + 1;
pub const TIMER_EVENT: u16 = NUM_QUEUES as u16 + 2;

/// Queue size the device offers.
pub const QUEUE_SIZE: usize = 1024;
/// Largest device-readable part of a control request or doorbell chain.
const MAX_REQUEST: usize = 64 << 10;
/// Datagrams handled per UDP wake-up before the engine is pumped (the socket is
/// level-triggered: what is left wakes us again).
const RX_LIMIT: usize = 256;

type GM = GuestMemoryAtomic<GuestMemoryMmap>;

/// Engine time: CLOCK_MONOTONIC in nanoseconds.
pub fn now() -> rxe_core::Instant {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    rxe_core::Instant(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// How soon after a frontend's memory table the device checks, unkicked, whether the frontend
/// is a reconnecting guest whose device state was lost.
const STATE_CHECK_NS: u64 = 50_000_000;

/// A non-blocking CLOCK_MONOTONIC timerfd armed with absolute deadlines.
pub struct Timer {
    fd: OwnedFd,
    /// The deadline the kernel holds, so re-arming with the same one costs no syscall.
    armed: Mutex<Option<rxe_core::Instant>>,
}

impl Timer {
    pub fn new() -> io::Result<Timer> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Timer {
            // SAFETY: `fd` was just created and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: Mutex::new(None),
        })
    }
    /// Arms for `at` (engine time), or disarms with `None`.
    pub fn arm(&self, at: Option<rxe_core::Instant>) {
        let mut armed = lock(&self.armed);
        if *armed == at {
            return;
        }
        *armed = at;
        let mut v: libc::itimerspec =
            // SAFETY: itimerspec is plain integers; all-zero is a valid (disarmed) value.
            unsafe { std::mem::zeroed() };
        if let Some(t) = at {
            let ns = t.0.max(1);
            v.it_value.tv_sec = (ns / 1_000_000_000) as libc::time_t;
            v.it_value.tv_nsec = (ns % 1_000_000_000) as libc::c_long;
        }
        // SAFETY: the fd is a timerfd we own; `v` is a valid itimerspec.
        unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &v,
                std::ptr::null_mut(),
            )
        };
    }
    fn consume(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from a non-blocking timerfd we own.
        unsafe { libc::read(self.fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        // It fired: the kernel holds no deadline any more.
        *lock(&self.armed) = None;
    }
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

pub struct VhuRdma {
    model: Arc<Mutex<Model>>,
    transport: Arc<Mutex<UdpTransport>>,
    mem: Mutex<Option<GM>>,
    event_idx: AtomicBool,
    /// Whether this connection was checked for a guest that used an earlier device instance.
    state_checked: AtomicBool,
    timer: Timer,
    /// Exit-event consumer fds handed to vhost-user-backend, which registers them in its
    /// epoll with `into_raw_fd()` and never closes them; closed in [`Self::close_exit_fds`]
    /// once the daemon (and its worker threads) are gone.
    exit_fds: Mutex<Vec<RawFd>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not take the daemon down with poisoned locks.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl VhuRdma {
    pub fn new(model: Arc<Mutex<Model>>, transport: Arc<Mutex<UdpTransport>>) -> io::Result<Self> {
        Ok(VhuRdma {
            model,
            transport,
            mem: Mutex::new(None),
            event_idx: AtomicBool::new(false),
            state_checked: AtomicBool::new(false),
            timer: Timer::new()?,
            exit_fds: Mutex::new(Vec::new()),
        })
    }

    /// Closes the exit-event fds vhost-user-backend leaks. Call only after the
    /// `VhostUserDaemon` that used this backend was dropped (its threads joined).
    pub fn close_exit_fds(&self) {
        for fd in lock(&self.exit_fds).drain(..) {
            // SAFETY: `fd` came from an EventConsumer we created, whose ownership
            // vhost-user-backend took with `into_raw_fd()` and abandoned; its epoll (the only
            // user) is closed, so nothing else refers to it.
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }

    pub fn timer_fd(&self) -> RawFd {
        self.timer.fd()
    }

    /// Runs `f` over every available chain of `vring`, with EVENT_IDX's disable → process →
    /// enable loop, then signals the guest if it asked for it.
    fn process_queue(
        &self,
        vring: &VringRwLock,
        mem: &GM,
        mut f: impl FnMut(&GuestMemoryMmap, &[u8], &[(u64, u32)]) -> u32,
    ) -> io::Result<()> {
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let mut any = false;
        loop {
            if event_idx {
                let _ = vring.disable_notification();
            }
            let guard = mem.memory();
            let chains: Vec<_> = {
                let mut st = vring.get_mut();
                match st.get_queue_mut().iter(guard.clone()) {
                    Ok(it) => it.collect(),
                    Err(e) => {
                        log::warn!("virtqueue error: {e}");
                        return Ok(());
                    }
                }
            };
            for chain in chains {
                let head = chain.head_index();
                let mut readable = Vec::new();
                let mut writable = Vec::new();
                let mut ok = true;
                for d in chain {
                    if d.is_write_only() {
                        writable.push((d.addr().0, d.len()));
                    } else if writable.is_empty() {
                        let start = readable.len();
                        let n = d.len() as usize;
                        if start + n > MAX_REQUEST {
                            ok = false;
                            break;
                        }
                        readable.resize(start + n, 0);
                        if guard.read_slice(&mut readable[start..], d.addr()).is_err() {
                            ok = false;
                            break;
                        }
                    } else {
                        // Readable after writable: malformed per the virtio spec.
                        ok = false;
                        break;
                    }
                }
                let used = if ok {
                    f(&guard, &readable, &writable)
                } else {
                    0
                };
                let _ = vring.add_used(head, used);
                any = true;
            }
            if !event_idx || !vring.enable_notification().unwrap_or(false) {
                break;
            }
        }
        if any && vring.needs_notification().unwrap_or(true) {
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    /// Writes `data` across writable descriptors; returns bytes written.
    fn write_out(mem: &GuestMemoryMmap, writable: &[(u64, u32)], data: &[u8]) -> u32 {
        let mut done = 0usize;
        for &(addr, len) in writable {
            if done == data.len() {
                break;
            }
            let n = (len as usize).min(data.len() - done);
            if mem
                .write_slice(&data[done..done + n], vm_memory::GuestAddress(addr))
                .is_err()
            {
                break;
            }
            done += n;
        }
        done as u32
    }

    fn deliver_events(&self, vring: &VringRwLock, mem: &GM, model: &mut Model) -> io::Result<()> {
        if model.events.is_empty() {
            return Ok(());
        }
        let guard = mem.memory();
        let mut delivered = false;
        while !model.events.is_empty() {
            let chain = {
                let mut st = vring.get_mut();
                let q = st.get_queue_mut();
                match q.pop_descriptor_chain(guard.clone()) {
                    Some(c) => c,
                    None => break,
                }
            };
            let head = chain.head_index();
            let writable: Vec<(u64, u32)> =
                chain.writable().map(|d| (d.addr().0, d.len())).collect();
            let room: u64 = writable.iter().map(|w| w.1 as u64).sum();
            let used = if room >= std::mem::size_of::<abi::Event>() as u64 {
                let e = model.events.pop_front().expect("non-empty");
                Self::write_out(&guard, &writable, vm_memory::ByteValued::as_slice(&e))
            } else {
                0
            };
            let _ = vring.add_used(head, used);
            delivered = true;
        }
        if delivered && vring.needs_notification().unwrap_or(true) {
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

impl VhostUserBackend for VhuRdma {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        (1 << VIRTIO_F_VERSION_1)
            | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
            | (1 << VIRTIO_RING_F_INDIRECT_DESC)
            | (1 << VIRTIO_RING_F_EVENT_IDX)
            | vhost::vhost_user::message::VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::RESET_DEVICE
    }

    fn reset_device(&self) {
        log::info!("device reset");
        lock(&self.model).reset();
        self.timer.arm(None);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let cs = lock(&self.model).config_space();
        let b = vm_memory::ByteValued::as_slice(&cs);
        let start = (offset as usize).min(b.len());
        let end = start.saturating_add(size as usize).min(b.len());
        let mut v = b[start..end].to_vec();
        v.resize(size as usize, 0);
        v
    }

    fn update_memory(&self, mem: GM) -> io::Result<()> {
        *lock(&self.mem) = Some(mem);
        // A reconnecting guest may not kick for a long time (its applications wait for
        // completions the lost device will never write): look at the rings soon on our own.
        if !self.state_checked.load(Ordering::Relaxed) {
            self.timer.arm(Some(now().plus_ns(STATE_CHECK_NS)));
        }
        Ok(())
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // A driver reset stops every queue; stopping the control queue resets the device
        // (the guest may reuse the memory of every ring after a reset).
        if queue_index == VQ_CTRL as u32 {
            log::info!("control queue stopped: device reset");
            lock(&self.model).reset();
            self.timer.arm(None);
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let (c, n) =
            new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()?;
        lock(&self.exit_fds).push(c.as_raw_fd());
        Some((c, n))
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        let Some(mem) = lock(&self.mem).clone() else {
            // No memory table yet: nothing can be read. Drain the timer so it stops firing.
            match device_event {
                TIMER_EVENT => self.timer.consume(),
                UDP_EVENT => {
                    let mut t = lock(&self.transport);
                    while t.recv_batch() > 0 {}
                }
                _ => {}
            }
            return Ok(());
        };
        let mut model = lock(&self.model);
        let ctrl_ready = vrings[VQ_CTRL as usize].get_ref().get_queue().ready();
        if (device_event <= VQ_EVENT || (device_event == TIMER_EVENT && ctrl_ready))
            && !self.state_checked.swap(true, Ordering::Relaxed)
        {
            // The first kick of this connection, or the timer armed when its memory table
            // came. A control queue that does not start at 0 is a running guest reconnecting
            // (the VMM restores the ring positions): everything it created lives in a device
            // instance that is gone. Say so (DEVICE_FATAL) rather than let its QPs stop
            // without a word.
            let base = vrings[VQ_CTRL as usize].get_mut().get_queue().next_avail();
            if base != 0 {
                log::warn!(
                    "frontend reconnected with control queue at {base}: device state was lost"
                );
                model.device_fatal();
            }
        }
        match device_event {
            VQ_CTRL => {
                self.process_queue(&vrings[VQ_CTRL as usize], &mem, |g, req, wr| {
                    let cap: usize = wr.iter().map(|w| w.1 as usize).sum();
                    if cap < std::mem::size_of::<abi::RespHdr>() {
                        return 0;
                    }
                    let (h, body) = model.handle_ctrl(g, req, cap);
                    let mut out = vm_memory::ByteValued::as_slice(&h).to_vec();
                    out.extend_from_slice(&body);
                    Self::write_out(g, wr, &out)
                })?;
            }
            VQ_DOORBELL => {
                self.process_queue(&vrings[VQ_DOORBELL as usize], &mem, |g, req, _| {
                    for c in req.chunks_exact(std::mem::size_of::<abi::Doorbell>()) {
                        if let Some(db) = abi::read_struct::<abi::Doorbell>(c) {
                            model.doorbell(g, &db);
                        }
                    }
                    0
                })?;
            }
            VQ_EVENT => {}
            UDP_EVENT => {
                let g = mem.memory();
                let mut t = lock(&self.transport);
                let mut total = 0;
                while total < RX_LIMIT {
                    let n = t.recv_batch();
                    let at = now();
                    for i in 0..n {
                        if let Some((meta, bytes)) = t.packet(i) {
                            model.handle_packet(&g, at, &meta, bytes);
                        }
                    }
                    total += n;
                    if n < RX_BATCH {
                        break;
                    }
                }
            }
            TIMER_EVENT => {
                self.timer.consume();
                model.handle_timeout(now());
            }
            _ => log::warn!("unexpected event id {device_event}"),
        }
        {
            let g = mem.memory();
            let mut t = lock(&self.transport);
            model.pump(&g, now(), &mut *t);
        }
        self.deliver_events(&vrings[VQ_EVENT as usize], &mem, &mut model)?;
        let mut next = model.poll_timeout();
        if !self.state_checked.load(Ordering::Relaxed) {
            // the rings are not set up yet: look again
            let check = now().plus_ns(STATE_CHECK_NS);
            next = Some(next.map_or(check, |t| t.min(check)));
        }
        self.timer.arm(next);
        Ok(())
    }
}
