//! The per-frontend worker: what one frontend connection's worker thread does with the
//! events [`crate::vhu_rdma::Worker`] dispatches to it — vring kicks, UDP readiness, timer
//! expiry — moving bytes between the virtqueues and the device model. It owns the model's
//! and the transport's handles, the guest's memory, the timer and the poll state.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use vhost_user_backend::{VhostUserBackend, VringEpollHandler, VringRwLock, VringT};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;

use crate::abi::{self, NUM_QUEUES, VQ_CTRL, VQ_DOORBELL, VQ_EVENT};
use crate::clock::{now, RxBackoff, Timer};
use crate::device::model::{Model, Pump, TX_BUDGET};
use crate::memory::guest_mem::GuestMemoryMmap;
use crate::sync::lock;
use crate::transport::link_watch::LinkWatch;
use crate::transport::sink::PacketSink;
use crate::transport::udp::TransportStats;
use crate::transport::Transport;
use crate::worker::counters_desk::CountersDesk;
use crate::worker::poll::{bump, PollWindow, WorkerStats};
use crate::worker::receive::receive_batch;
use crate::worker::shard_worker::ShardLink;

/// The queues a poll session polls (and whose kicks it suppresses): the guest's work.
const POLLED_QUEUES: [u16; 2] = [VQ_DOORBELL, VQ_CTRL];
/// A poll session looks whether another event of the worker waits (a counters reader, the
/// daemon stopping) once every this many passes.
const POLL_EVENT_CHECK: u32 = 64;
/// virtio's VRING_AVAIL_F_NO_INTERRUPT.
const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// Epoll ids of the extra fds (ids up to `NUM_QUEUES` are reserved by vhost-user-backend).
pub const UDP_EVENT: u16 = NUM_QUEUES as u16 + 1;
pub const TIMER_EVENT: u16 = NUM_QUEUES as u16 + 2;
/// The engine has work left after a pump's packet budget: come back after the other events.
pub const WORK_EVENT: u16 = NUM_QUEUES as u16 + 3;
/// The UDP socket, for writability, registered only while the transport is blocked.
pub const UDP_WRITABLE_EVENT: u16 = NUM_QUEUES as u16 + 4;
/// A counters reader waits for a rendering ([`CountersDesk::render_counters`]).
pub const COUNTERS_EVENT: u16 = NUM_QUEUES as u16 + 5;
/// Packets wait in the same-host inbox (`--same-host`, [`crate::transport::same_host`]).
pub const SAME_HOST_EVENT: u16 = NUM_QUEUES as u16 + 6;
/// Packets the I/O thread received wait in its inbox, or its send channel has room again
/// (`--io-thread`, [`crate::transport::io_thread`]).
pub const IO_EVENT: u16 = NUM_QUEUES as u16 + 7;
/// The link under the transport changed ([`crate::transport::link_watch`]).
pub const LINK_EVENT: u16 = NUM_QUEUES as u16 + 8;

/// Largest device-readable part of a control request or doorbell chain.
const MAX_REQUEST: usize = 64 << 10;
/// Datagrams handled per UDP wake-up before the engine is pumped (the socket is
/// level-triggered: what is left wakes us again).
const RX_LIMIT: usize = 256;
/// Packets a pump sends before it looks at the control queue again (64 KiB of WRITE at a
/// 4096-byte path MTU is 16).
const CTRL_SLICE: usize = 64;
/// Control commands the worker serves in one turn; more wait for its next turn, after the
/// events that wait (received packets, timers, doorbells): a guest that queues slow commands,
/// or keeps its control queue from ever being empty, holds its worker from the data path for
/// at most this many commands at a time.
const CTRL_TURN: usize = 32;
/// Least time between two returns of freed heap to the kernel (`heap::trim_at_most_every`).
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

pub type GM = GuestMemoryAtomic<GuestMemoryMmap>;
type Chain =
    virtio_queue::DescriptorChain<vm_memory::atomic::GuestMemoryLoadGuard<GuestMemoryMmap>>;

/// The queues' names, by index.
const QUEUE_NAMES: [&str; NUM_QUEUES] = ["control", "doorbell", "event"];

/// How soon after a frontend's memory table the device checks, unkicked, whether the frontend
/// is a reconnecting guest whose device state was lost.
const STATE_CHECK_NS: u64 = 50_000_000;

/// Moves a started queue whose base (SET_VRING_BASE) is ahead of the used index guest memory
/// holds back to that used index; returns (base, used index) when it did.
///
/// This device uses every queue's buffers in the order they were made available and uses each
/// one as soon as it takes it, so the entries between the used index and the base are buffers
/// the guest made available that no device instance used: a control request the guest still
/// waits for, doorbells whose buffers it never got back, the event buffers it posted. QEMU
/// reconnects at the used index (nothing to do); cloud-hypervisor without IN_ORDER or inflight
/// tracking reconnects at the avail index, which would leave them unused for good — the event
/// queue without a buffer for the DEVICE_FATAL the guest must get. Nothing is moved unless
/// used ≤ base ≤ avail index within one ring's size.
pub fn resume_at_used(vring: &VringRwLock, mem: &GuestMemoryMmap) -> Option<(u16, u16)> {
    let mut st = vring.get_mut();
    let q = st.get_queue_mut();
    if !q.ready() {
        return None;
    }
    let base = q.next_avail();
    let used = q.used_idx(mem, Ordering::Acquire).ok()?.0;
    let avail = q.avail_idx(mem, Ordering::Acquire).ok()?.0;
    let pending = avail.wrapping_sub(used);
    if base == used || q.next_used() != used || pending > q.size() {
        return None;
    }
    if base.wrapping_sub(used) > pending {
        return None;
    }
    q.set_next_avail(used);
    Some((base, used))
}

/// How the worker renders the transport's and the model's counters (the members of a JSON
/// object): [`crate::counters::render_body`], given from above.
pub type RenderBody = fn(&TransportStats, Option<&Model>) -> String;

/// The worker thread's epoll, as far as the worker changes it: listeners added and removed
/// (the UDP socket's readability during a back-off, its writability while the transport
/// waits for room).
pub trait Listeners: Send + Sync {
    fn listen(&self, fd: RawFd, ev: EventSet, id: u64, on: bool) -> io::Result<()>;
}

impl<T: VhostUserBackend> Listeners for VringEpollHandler<T>
where
    VringEpollHandler<T>: Send + Sync,
{
    fn listen(&self, fd: RawFd, ev: EventSet, id: u64, on: bool) -> io::Result<()> {
        if on {
            self.register_listener(fd, ev, id)
        } else {
            self.unregister_listener(fd, ev, id)
        }
    }
}

/// One frontend connection's worker: the model, the transport, the guest's memory and queues,
/// the timer, the poll state and the counters' desk. All its methods run on the worker thread
/// (or, for [`Self::try_drive`], on another device's thread holding this model's lock).
pub struct Worker {
    model: Arc<Mutex<Model>>,
    transport: Arc<Mutex<Transport>>,
    /// The guest's memory, once the frontend gave its table; the shard threads read it too.
    mem: Arc<Mutex<Option<GM>>>,
    event_idx: AtomicBool,
    /// Whether this connection was checked for a guest that used an earlier device instance.
    state_checked: AtomicBool,
    /// Per queue: whether its position was checked against the used index
    /// ([`resume_at_used`]) on this connection.
    resumed: [AtomicBool; NUM_QUEUES],
    /// Whether [`Self::check_queues_once`] ran.
    queues_checked: AtomicBool,
    timer: Timer,
    /// Signalled when a pump stopped at its packet budget, or by a shard's thread with
    /// events for the guest ([`WORK_EVENT`]).
    work: Arc<EventFd>,
    /// `--shard-threads`: every shard's wake-up (index = shard; 0 is `work`), empty without.
    shard_kicks: Mutex<Arc<Vec<Arc<EventFd>>>>,
    /// `--shard-threads`: the shards' sockets, for the counters.
    shard_links: Mutex<Vec<Arc<ShardLink>>>,
    /// The queues, as the worker's first event gave them: for another device's thread that
    /// runs this one's side of a same-host batch ([`crate::transport::same_host::Driver`]).
    vrings: Mutex<Vec<VringRwLock>>,
    /// A duplicate of the UDP socket's fd, in the epoll for EPOLLOUT while the transport waits
    /// for room ([`UDP_WRITABLE_EVENT`]); a separate fd because the socket itself is there
    /// for EPOLLIN.
    tx_wait: OwnedFd,
    /// Instead of `tx_wait`: a duplicate of the source-port socket that is full
    /// ([`Transport::blocked_port_fd`]).
    tx_wait_port: Mutex<Option<OwnedFd>>,
    /// The multicast groups the model publishes, when the transport joins them.
    mcast: Option<Arc<crate::transport::mcast::Groups>>,
    /// Whether `tx_wait` (or `tx_wait_port`) is in the epoll.
    tx_waiting: AtomicBool,
    /// Where counters readers wait for the worker's rendering.
    counters: Arc<CountersDesk>,
    render: RenderBody,
    /// The receive path's back-off from a socket that keeps failing.
    rx_pause: Mutex<RxBackoff>,
    /// The worker's epoll, to add and remove `tx_wait` (weak: it holds the backend).
    epoll: Mutex<Option<Weak<dyn Listeners>>>,
    /// Exit-event consumer fds handed to vhost-user-backend, which registers them in its
    /// epoll with `into_raw_fd()` and never closes them; closed in [`Self::close_exit_fds`]
    /// once the daemon (and its worker threads) are gone.
    exit_fds: Mutex<Vec<RawFd>>,
    /// `--poll-us`.
    poll_us: u32,
    /// [`Self::process_queue`]'s buffers, kept between visits: the chains taken, a request's
    /// readable bytes, a chain's writable buffers.
    scratch_heads: Mutex<Vec<Chain>>,
    scratch_readable: Mutex<Vec<u8>>,
    scratch_writable: Mutex<Vec<(u64, u32)>>,
    /// Poll mode's adaptive window.
    window: Mutex<PollWindow>,
    /// Polling and notification counters.
    wstats: WorkerStats,
    /// Whether the driver acknowledged VIRTIO_F_NOTIFY_ON_EMPTY.
    notify_on_empty: AtomicBool,
    /// What other ports of this process sent this one (`--same-host`).
    inbox: Option<Arc<crate::transport::same_host::Inbox>>,
    /// What the I/O thread received (`--io-thread`); its eventfd also says the send channel
    /// has room again.
    io_inbox: Option<Arc<crate::transport::same_host::Inbox>>,
    /// The link the device's port stands on, shared by the device's connections.
    link: Mutex<Option<Arc<Mutex<LinkWatch>>>>,
    /// The UDP socket is left alone for failing ([`Self::rx_health`]): the port is DOWN.
    socket_failing: AtomicBool,
}

impl Worker {
    /// A backend for one frontend connection; `poll_us` is `--poll-us` (0: no polling).
    pub fn new(
        model: Arc<Mutex<Model>>,
        transport: Arc<Mutex<Transport>>,
        poll_us: u32,
        render: RenderBody,
    ) -> io::Result<Self> {
        let (udp_fd, inbox, io_inbox, mcast) = {
            let t = lock(&transport);
            (t.fd(), t.same_host_inbox(), t.io_inbox(), t.groups())
        };
        let tx_wait = crate::sys::dup_cloexec(udp_fd)?;
        Ok(Worker {
            work: Arc::new(EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?),
            shard_kicks: Mutex::default(),
            shard_links: Mutex::default(),
            vrings: Mutex::default(),
            tx_wait,
            tx_wait_port: Mutex::default(),
            mcast,
            tx_waiting: AtomicBool::new(false),
            rx_pause: Mutex::new(RxBackoff::default()),
            counters: Arc::new(CountersDesk::new()?),
            render,
            epoll: Mutex::new(None),
            model,
            transport,
            mem: Arc::default(),
            event_idx: AtomicBool::new(false),
            state_checked: AtomicBool::new(false),
            resumed: Default::default(),
            queues_checked: AtomicBool::new(false),
            scratch_heads: Mutex::default(),
            scratch_readable: Mutex::default(),
            scratch_writable: Mutex::default(),
            timer: Timer::new()?,
            exit_fds: Mutex::new(Vec::new()),
            poll_us,
            window: Mutex::new(PollWindow::new(poll_us)),
            wstats: WorkerStats::default(),
            notify_on_empty: AtomicBool::new(false),
            inbox,
            io_inbox,
            link: Mutex::default(),
            socket_failing: AtomicBool::new(false),
        })
    }

    /// Closes the exit-event fds vhost-user-backend leaks. Call only after the
    /// `VhostUserDaemon` that used this backend was dropped (its threads joined).
    pub fn close_exit_fds(&self) {
        crate::sys::close_exit_fds(&self.exit_fds);
    }

    pub fn timer_fd(&self) -> RawFd {
        self.timer.fd()
    }

    /// The guest's memory, once the frontend gave its table.
    pub fn memory(&self) -> Option<GM> {
        lock(&self.mem).clone()
    }

    /// Where the guest's memory is kept, for the shard threads (`--shard-threads`).
    pub fn memory_slot(&self) -> Arc<Mutex<Option<GM>>> {
        self.mem.clone()
    }

    /// Where counters readers ask for a rendering.
    pub fn counters_desk(&self) -> Arc<CountersDesk> {
        self.counters.clone()
    }

    /// The eventfd that wakes the worker to pump and hand the guest its events.
    pub fn wake_fd(&self) -> Arc<EventFd> {
        self.work.clone()
    }

    /// `--shard-threads`: how to wake the thread of each shard (index = shard).
    pub fn set_shard_kicks(&self, kicks: Arc<Vec<Arc<EventFd>>>) {
        *lock(&self.shard_kicks) = kicks;
    }

    /// `--shard-threads`: the shards' sockets, whose counters add to the transport's.
    pub fn set_shard_links(&self, links: Vec<Arc<ShardLink>>) {
        *lock(&self.shard_links) = links;
    }

    /// Wakes the threads of the shards the model worked on (a doorbell pulled WQEs into
    /// them, a control command moved their QPs, a packet for them came on this socket).
    fn kick_touched(&self, model: &Model) {
        let t = model.take_touched();
        if t == 0 {
            return;
        }
        for (k, fd) in lock(&self.shard_kicks).iter().enumerate() {
            if t & (1 << k) != 0 {
                let _ = fd.write(1);
            }
        }
    }

    pub fn work_fd(&self) -> RawFd {
        self.work.as_raw_fd()
    }

    pub fn counters_fd(&self) -> RawFd {
        self.counters.fd()
    }

    /// The I/O thread's inbox's eventfd, with `--io-thread`.
    pub fn io_fd(&self) -> Option<RawFd> {
        self.io_inbox.as_ref().map(|i| i.fd())
    }

    /// The same-host inbox's eventfd, with `--same-host`.
    pub fn same_host_fd(&self) -> Option<RawFd> {
        self.inbox.as_ref().map(|i| i.fd())
    }

    /// The link under the transport: the port's state follows it from now on (this
    /// connection's model takes its state now, without an event).
    pub fn set_link_watch(&self, w: Option<Arc<Mutex<LinkWatch>>>) {
        if let Some(w) = &w {
            lock(w).read();
        }
        *lock(&self.link) = w;
        self.sync_port(&mut lock(&self.model), false);
    }

    /// The link watch's netlink socket, for the worker's epoll ([`LINK_EVENT`]).
    pub fn link_fd(&self) -> Option<RawFd> {
        lock(&self.link).as_ref().map(|w| lock(w).fd())
    }

    /// Reads what the link watch says; the port follows.
    fn link_changed(&self, model: &mut Model, tell: bool) {
        if let Some(w) = lock(&self.link).as_ref() {
            lock(w).read();
        }
        self.sync_port(model, tell);
    }

    /// The port is ACTIVE while its link is up and its socket is not failing.
    fn sync_port(&self, model: &mut Model, tell: bool) {
        let link_up = lock(&self.link).as_ref().is_none_or(|w| lock(w).up());
        let active = link_up && !self.socket_failing.load(Ordering::Relaxed);
        if active != model.port_active() {
            match (link_up, active) {
                (_, true) => log::info!("port ACTIVE: its link is up and its socket works"),
                (false, _) => log::warn!("port DOWN: the link under the transport is down"),
                (true, false) => log::warn!("port DOWN: the socket keeps failing"),
            }
        }
        model.set_port_active(active, tell);
    }

    /// Renders the counters for the readers waiting (worker thread).
    fn publish_counters(&self, model: &Model) {
        self.counters.take_request();
        let links = lock(&self.shard_links).clone();
        let t = crate::worker::shard_worker::all_stats(lock(&self.transport).stats(), &links);
        let mut body = (self.render)(&t, Some(model));
        if !links.is_empty() {
            // What each shard's own socket carried (shard 0's is the transport's).
            body.push_str(",\"shard_sockets\":{");
            for (i, l) in links.iter().enumerate() {
                let s = l.stats();
                if i > 0 {
                    body.push(',');
                }
                body.push_str(&format!(
                    "\"shard{}\":{{\"rx_packets\":{},\"tx_packets\":{}}}",
                    i + 1,
                    s.rx_packets,
                    s.tx_packets
                ));
            }
            body.push('}');
        }
        let w = lock(&self.window).window_ns();
        body.push_str(",\"worker\":{");
        body.push_str(&self.wstats.render(self.poll_us, w));
        body.push('}');
        self.counters.publish(body);
    }

    /// The epoll handler of the worker thread, for the writability wait.
    pub fn set_epoll_handler(&self, h: Weak<dyn Listeners>) {
        *lock(&self.epoll) = Some(h);
    }

    /// Acts on why the pump stopped: more work now, or wait for the socket to drain.
    fn after_pump(&self, p: Pump) {
        match p {
            Pump::Idle => {}
            Pump::Budget => {
                let _ = self.work.write(1);
            }
            // The I/O thread wakes the worker (IO_EVENT) when its channel has room.
            Pump::Blocked if self.io_inbox.is_some() => {}
            Pump::Blocked => self.wait_writable(true),
        }
    }

    /// After a receive: a socket that gave up on errors is left out of the epoll for a while
    /// (longer each time it fails again, up to [`RxBackoff::MAX_NS`]) instead of waking the
    /// worker at once, level-triggered, for ever.
    /// Returns whether the socket's health changed (the port follows it).
    fn rx_health(&self, t: &Transport) -> bool {
        let mut p = lock(&self.rx_pause);
        if !t.rx_failing() {
            p.ok();
            return self.socket_failing.swap(false, Ordering::Relaxed);
        }
        let until = p.fail(now());
        drop(p);
        log::warn!(
            "udp socket: {} receive errors so far; not reading it for {} ms",
            t.stats().rx_errors,
            until.0.saturating_sub(now().0) / 1_000_000
        );
        self.udp_listen(t.fd(), false);
        self.timer.arm(Some(until));
        !self.socket_failing.swap(true, Ordering::Relaxed)
    }

    /// Takes the UDP socket back into the epoll once its back-off is over (the timer is
    /// armed for it; a device reset keeps it armed).
    fn rx_resume_due(&self) {
        let mut p = lock(&self.rx_pause);
        if p.until.is_some_and(|u| now() >= u) {
            p.until = None;
            drop(p);
            let fd = lock(&self.transport).fd();
            self.udp_listen(fd, true);
        }
    }

    fn epoll_handler(&self) -> Option<Arc<dyn Listeners>> {
        lock(&self.epoll).as_ref().and_then(Weak::upgrade)
    }

    fn udp_listen(&self, fd: RawFd, on: bool) {
        let Some(h) = self.epoll_handler() else {
            return;
        };
        if let Err(e) = h.listen(fd, EventSet::IN, UDP_EVENT as u64, on) {
            log::warn!("udp socket epoll: {e}");
        }
    }

    /// After control commands: the multicast sockets the transport opened wait with the
    /// bound socket (its receive event), those it left stop waiting, then close.
    fn sync_groups(&self) {
        let (added, gone) = lock(&self.transport).sync_groups();
        if added.is_empty() && gone.is_empty() {
            return;
        }
        let Some(h) = self.epoll_handler() else {
            return;
        };
        for fd in added {
            if let Err(e) = h.listen(fd, EventSet::IN, UDP_EVENT as u64, true) {
                log::warn!("multicast socket: {e}");
            }
        }
        for fd in gone {
            let _ = h.listen(fd.as_raw_fd(), EventSet::IN, UDP_EVENT as u64, false);
        }
    }

    /// Adds (or removes) the EPOLLOUT interest in the UDP socket that is full: the bound one,
    /// or the source-port socket the transport names.
    fn wait_writable(&self, on: bool) {
        if self.tx_waiting.load(Ordering::Relaxed) == on {
            return;
        }
        let Some(h) = self.epoll_handler() else {
            return;
        };
        let mut port = lock(&self.tx_wait_port);
        if on {
            let full = lock(&self.transport).blocked_port_fd();
            // A descriptor of our own keeps the socket in the epoll however long it waits.
            *port = full.and_then(|p| crate::sys::dup_cloexec(p).ok());
        }
        let fd = port.as_ref().unwrap_or(&self.tx_wait).as_raw_fd();
        match h.listen(fd, EventSet::OUT, UDP_WRITABLE_EVENT as u64, on) {
            Ok(()) => self.tx_waiting.store(on, Ordering::Relaxed),
            Err(e) => log::warn!("udp writability wait: {e}"),
        }
        if !on {
            port.take();
        }
    }

    /// The first time this connection touches queue `index` once it is set up (started by
    /// its kick fd): resume it at the used index ([`resume_at_used`]).
    fn resume_once(&self, index: u16, vrings: &[VringRwLock], mem: &GM) {
        let i = index as usize;
        if self.resumed[i].load(Ordering::Relaxed) {
            return;
        }
        {
            let st = vrings[i].get_ref();
            if !st.get_queue().ready() || !st.is_enabled() {
                return;
            }
        }
        self.resumed[i].store(true, Ordering::Relaxed);
        if let Some((base, used)) = resume_at_used(&vrings[i], &mem.memory()) {
            log::warn!(
                "queue {index}: the frontend gave base {base}, the ring's used index is {used}: \
                 resuming at {used}, {} buffers the guest made available were never used",
                base.wrapping_sub(used)
            );
        }
    }

    /// Once per connection, when the guest's first command is served: say which queues the
    /// frontend did not set up (a kick of the control queue before the others are set up is
    /// no use of it yet).
    fn check_queues_once(&self, vrings: &[VringRwLock]) {
        if self.queues_checked.swap(true, Ordering::Relaxed) {
            return;
        }
        let missing: Vec<&str> = vrings
            .iter()
            .zip(QUEUE_NAMES)
            .filter(|(v, _)| !v.get_ref().get_queue().ready())
            .map(|(_, n)| n)
            .collect();
        if !missing.is_empty() {
            log::warn!(
                "the guest uses the control queue but the frontend did not set up the {} \
                 queue(s): the device needs {NUM_QUEUES} queues (control, doorbell, event); \
                 give the VMM three queue sizes",
                missing.join(" and ")
            );
        }
    }

    /// Runs `f` over every available chain of queue `index`, but at most `max` of them,
    /// then signals the guest if it asked for it; returns whether a chain was used. With
    /// `rearm`, EVENT_IDX's disable → process → enable loop; without, the guest's kicks are
    /// left as they are (a poll session suppressed them and re-enables them before the worker
    /// sleeps). Chains left over `max` wait for the worker's next turn (WORK_EVENT), after the
    /// other events: the guest's kicks stay suppressed till then.
    fn process_queue(
        &self,
        index: u16,
        vrings: &[VringRwLock],
        mem: &GM,
        rearm: bool,
        max: usize,
        mut f: impl FnMut(&GuestMemoryMmap, &[u8], &[(u64, u32)]) -> u32,
    ) -> io::Result<bool> {
        let vring = &vrings[index as usize];
        let event_idx = rearm && self.event_idx.load(Ordering::Relaxed);
        let mut any = false;
        let mut left = max;
        loop {
            if event_idx {
                let _ = vring.disable_notification();
            }
            let guard = mem.memory();
            // the heads first (the queue's lock is not held while `f` runs), into buffers
            // kept between visits: a visit allocates nothing once they have grown
            let mut heads = std::mem::take(&mut *lock(&self.scratch_heads));
            let mut readable = std::mem::take(&mut *lock(&self.scratch_readable));
            let mut writable = std::mem::take(&mut *lock(&self.scratch_writable));
            heads.clear();
            {
                let mut st = vring.get_mut();
                match st.get_queue_mut().iter(guard.clone()) {
                    Ok(it) => heads.extend(it.take(left)),
                    Err(e) => {
                        crate::warn_limited!("virtqueue {index}: {e}");
                        return Ok(any);
                    }
                }
            }
            left -= heads.len();
            for chain in heads.drain(..) {
                let head = chain.head_index();
                readable.clear();
                writable.clear();
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
            *lock(&self.scratch_heads) = heads;
            *lock(&self.scratch_readable) = readable;
            *lock(&self.scratch_writable) = writable;
            if left == 0 {
                // Its turn is over: the rest after the events that wait (a guest that keeps
                // its queue full does not keep the worker from its packets). Kicks stay
                // suppressed while chains wait.
                if Self::has_avail(vring, mem)
                    || (event_idx && vring.enable_notification().unwrap_or(false))
                {
                    let _ = self.work.write(1);
                }
                break;
            }
            if !event_idx || !vring.enable_notification().unwrap_or(false) {
                break;
            }
        }
        if any {
            self.notify(index, vring, &mem.memory())?;
        }
        Ok(any)
    }

    /// After used buffers were added to queue `index`: an interrupt (the call eventfd) if the
    /// driver wants one — EVENT_IDX's used_event, or without EVENT_IDX the avail ring's
    /// VRING_AVAIL_F_NO_INTERRUPT flag (overridden, with VIRTIO_F_NOTIFY_ON_EMPTY, once the
    /// avail ring is empty). Counted either way.
    fn notify(&self, index: u16, vring: &VringRwLock, mem: &GuestMemoryMmap) -> io::Result<()> {
        let want = if self.event_idx.load(Ordering::Relaxed) {
            vring.needs_notification().unwrap_or(true)
        } else {
            // The used ring's writes before the flag's read.
            fence(Ordering::SeqCst);
            let st = vring.get_ref();
            let q = st.get_queue();
            let flags: u16 = mem
                .load(vm_memory::GuestAddress(q.avail_ring()), Ordering::Acquire)
                .map(u16::from_le)
                .unwrap_or(0);
            flags & VRING_AVAIL_F_NO_INTERRUPT == 0
                || (self.notify_on_empty.load(Ordering::Relaxed)
                    && q.avail_idx(mem, Ordering::Acquire)
                        .is_ok_and(|i| i.0 == q.next_avail()))
        };
        let i = index as usize;
        if want {
            bump(&self.wstats.interrupts[i]);
            vring.signal_used_queue()
        } else {
            bump(&self.wstats.interrupts_suppressed[i]);
            Ok(())
        }
    }

    /// Whether the guest made control commands available that the worker has not taken (a
    /// load of the avail index; false before the queue is ready).
    fn ctrl_pending(&self, vrings: &[VringRwLock], mem: &GM) -> bool {
        let st = vrings[VQ_CTRL as usize].get_ref();
        let q = st.get_queue();
        q.ready()
            && q.avail_idx(&*mem.memory(), Ordering::Acquire)
                .is_ok_and(|i| i.0 != q.next_avail())
    }

    /// Serves the control or doorbell queue; returns whether it used a chain.
    fn serve_queue(
        &self,
        index: u16,
        vrings: &[VringRwLock],
        mem: &GM,
        model: &mut Model,
        rearm: bool,
    ) -> io::Result<bool> {
        self.resume_once(index, vrings, mem);
        if index == VQ_CTRL {
            // A command sees the work the guest posted before it: the doorbells already on
            // their ring are taken first, and one slice of what they started is sent (a UD
            // SEND completes there), so that a RESIZE_CQ after six posted SENDs counts their
            // completions, as on a device whose doorbell writes reach it before the command.
            if Self::has_avail(&vrings[VQ_DOORBELL as usize], mem)
                && self.serve_queue(VQ_DOORBELL, vrings, mem, model, rearm)?
            {
                bump(&self.wstats.doorbells_first);
                // With shard threads the doorbells' shards are pumped here too, not left to
                // their threads: the command must find what they complete at once.
                let p = self.pump_slice(mem, model, CTRL_SLICE, true);
                self.after_pump(p);
            }
            let used =
                self.process_queue(VQ_CTRL, vrings, mem, rearm, CTRL_TURN, |g, req, wr| {
                    let cap: usize = wr.iter().map(|w| w.1 as usize).sum();
                    if cap < std::mem::size_of::<abi::RespHdr>() {
                        return 0;
                    }
                    let (h, body) = model.handle_ctrl(g, req, cap);
                    // A group is joined (or left) before the command that changed it answers:
                    // once ATTACH_MCAST returns, the group's next datagram reaches the member.
                    if self.mcast.as_ref().is_some_and(|g| g.pending()) {
                        self.sync_groups();
                    }
                    let mut out = vm_memory::ByteValued::as_slice(&h).to_vec();
                    out.extend_from_slice(&body);
                    Self::write_out(g, wr, &out)
                })?;
            if used {
                self.check_queues_once(vrings);
            }
            Ok(used)
        } else {
            self.process_queue(VQ_DOORBELL, vrings, mem, rearm, usize::MAX, |g, req, _| {
                for c in req.chunks_exact(std::mem::size_of::<abi::Doorbell>()) {
                    if let Some(db) = abi::read_struct::<abi::Doorbell>(c) {
                        model.doorbell(g, &db);
                    }
                }
                0
            })
        }
    }

    /// Receives up to [`RX_LIMIT`] datagrams into the engine; returns how many.
    fn receive_socket(&self, model: &mut Model, mem: &GM) -> usize {
        let g = mem.memory();
        let mut t = lock(&self.transport);
        let total = receive_batch(&mut *t, RX_LIMIT, |at, meta, bytes| {
            model.handle_packet(&g, at, meta, bytes);
        });
        if self.rx_health(&t) {
            drop(t);
            self.sync_port(model, true);
        }
        total
    }

    /// Takes up to [`RX_LIMIT`] packets from `inbox` into the engine: what other ports of
    /// this process sent (`--same-host`), or what the I/O thread received (`--io-thread`);
    /// returns how many.
    fn receive_inbox(
        &self,
        inbox: Option<&Arc<crate::transport::same_host::Inbox>>,
        model: &mut Model,
        mem: &GM,
    ) -> usize {
        let Some(inbox) = inbox else {
            return 0;
        };
        let g = mem.memory();
        let at = now();
        // The same-host inbox holds what other devices of this process built for it, in
        // segments; the I/O thread's holds what arrived on the socket.
        let in_memory = self.inbox.as_ref().is_some_and(|i| Arc::ptr_eq(i, inbox));
        inbox.drain(RX_LIMIT, |meta, bytes, src| {
            model.handle_packet_refs(&g, at, meta, bytes, src, in_memory);
        })
    }

    /// Sends what the engine has to send and hands the guest the events it has to get.
    /// Runs the engine for up to [`TX_BUDGET`] packets, in slices of [`CTRL_SLICE`]: between
    /// two slices the control commands the guest made available meanwhile are served, so a
    /// command waits behind at most one slice of bulk data (`rearm` as for
    /// [`Self::serve_queue`]: false only inside a poll session, which re-arms the guest's
    /// kicks before the worker sleeps). Then delivers the events.
    fn pump_and_deliver(
        &self,
        vrings: &[VringRwLock],
        mem: &GM,
        model: &mut Model,
        rearm: bool,
    ) -> io::Result<Pump> {
        let mut left = TX_BUDGET;
        let p = loop {
            let slice = left.min(CTRL_SLICE);
            let p = self.pump_slice(mem, model, slice, false);
            left -= slice;
            if p != Pump::Budget || left == 0 {
                break p;
            }
            if self.ctrl_pending(vrings, mem) {
                bump(&self.wstats.ctrl_first);
                self.serve_queue(VQ_CTRL, vrings, mem, model, rearm)?;
            }
        };
        self.after_pump(p);
        self.deliver_events(vrings, mem, model)?;
        Ok(p)
    }

    /// Runs the engine for up to `budget` packets into the transport. With `--same-host` the
    /// transport holds this guest's memory meanwhile, for the packets that leave with
    /// references into it ([`crate::memory::payload_ref`]).
    /// With `everywhere`, the shards other threads drive too (`--shard-threads`).
    fn pump_slice(&self, mem: &GM, model: &mut Model, budget: usize, everywhere: bool) -> Pump {
        let g = mem.memory();
        let mut t = lock(&self.transport);
        if self.inbox.is_some() {
            t.set_payload_source(Some(g.clone().into_inner()));
        }
        let p = model.pump_shards(&g, now(), &mut *t, budget, everywhere);
        if self.inbox.is_some() {
            // The batch ends with this device's lock still held: every inbox it put references
            // into is handed its packets or has them sealed (`same_host::Inbox::signal`), so
            // no reference outlives the lock that keeps the memory's rights as they were.
            // (The pump flushed already; this makes it a rule here, not a habit there.)
            crate::transport::sink::PacketSink::flush(&mut *t);
            t.set_payload_source(None);
        }
        p
    }

    /// Whether queue `index` is set up and the guest made buffers available that the device
    /// did not take yet.
    fn has_avail(vring: &VringRwLock, mem: &GM) -> bool {
        let st = vring.get_ref();
        let q = st.get_queue();
        q.ready()
            && st.is_enabled()
            && q.avail_idx(&*mem.memory(), Ordering::Acquire)
                .is_ok_and(|i| i.0 != q.next_avail())
    }

    /// Asks the guest not to kick `vring`: VRING_USED_F_NO_NOTIFY, or with EVENT_IDX an
    /// avail event index the guest's avail index has already passed (it kicks when it moves
    /// onto that index, i.e. not before 65 536 more buffers).
    fn suppress(vring: &VringRwLock, mem: &GM) {
        let mut st = vring.get_mut();
        if !st.get_queue().ready() || !st.is_enabled() {
            return;
        }
        let g = mem.memory();
        let q = st.get_queue_mut();
        if q.event_idx_enabled() {
            let Some(at) = q.used_ring().checked_add(4 + 8 * q.size() as u64) else {
                return;
            };
            let behind = q.next_avail().wrapping_sub(1);
            let _ = g.store(
                behind.to_le(),
                vm_memory::GuestAddress(at),
                Ordering::Relaxed,
            );
        } else {
            let _ = q.disable_notification(&*g);
        }
    }

    /// Asks the guest to kick `vring` again; returns whether it made buffers available in
    /// the meantime (which the device must then take: the guest saw its kicks suppressed).
    fn rearm(vring: &VringRwLock) -> bool {
        {
            let st = vring.get_ref();
            if !st.get_queue().ready() || !st.is_enabled() {
                return false;
            }
        }
        vring.enable_notification().unwrap_or(false)
    }

    /// One pass of a poll session over the polled queues, the socket and the timers; returns
    /// whether it found work from the guest or the network.
    fn poll_once(&self, vrings: &[VringRwLock], mem: &GM) -> io::Result<bool> {
        let mut model = lock(&self.model);
        let mut found = false;
        for q in POLLED_QUEUES {
            if Self::has_avail(&vrings[q as usize], mem) {
                found |= self.serve_queue(q, vrings, mem, &mut model, false)?;
            }
        }
        // With an I/O thread the socket is its own: the worker polls its inbox.
        if self.io_inbox.is_none() && lock(&self.rx_pause).until.is_none() {
            found |= self.receive_socket(&mut model, mem) > 0;
        }
        found |= self.receive_inbox(self.io_inbox.as_ref(), &mut model, mem) > 0;
        found |= self.receive_inbox(self.inbox.as_ref(), &mut model, mem) > 0;
        let t = now();
        let due = model.poll_timeout().is_some_and(|d| d <= t);
        if due {
            model.handle_timeout(t);
        }
        // With an I/O thread, a pump that stopped at a full channel goes on once the thread
        // took a batch: its wake-up came through the inbox just drained, with no packet.
        let tx_room = self.io_inbox.is_some() && lock(&self.transport).blocked();
        if found || due || tx_room || model.has_events() {
            // A full socket (Pump::Blocked) ends the session: the epoll waits for room.
            self.pump_and_deliver(vrings, mem, &mut model, false)?;
        }
        self.kick_touched(&model);
        if found {
            // Keep the avail event index behind the guest as the device moves on.
            for q in POLLED_QUEUES {
                if self.event_idx.load(Ordering::Relaxed) {
                    Self::suppress(&vrings[q as usize], mem);
                }
            }
        }
        Ok(found)
    }

    /// Whether another event of the worker waits: a counters reader or the daemon stopping
    /// (which a poll session must not hold up).
    fn other_events_pending(&self) -> bool {
        let mut fds: Vec<libc::pollfd> = lock(&self.exit_fds)
            .iter()
            .chain(std::iter::once(&self.counters.fd()))
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a live array of `fds.len()` pollfds; a zero timeout never blocks.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
        r > 0
    }

    /// A poll session: with the guest's kicks on the polled queues suppressed, polls them
    /// and the socket until `window_ns` pass without work (or another event waits), then
    /// re-enables the kicks and looks once more, as virtio requires: buffers made available
    /// before the guest could see the kicks enabled are taken now, not at a kick that never
    /// comes. A window of 0 only does the latter.
    fn poll_session(&self, vrings: &[VringRwLock], mem: &GM, window_ns: u64) -> io::Result<()> {
        if window_ns > 0 {
            bump(&self.wstats.poll_sessions);
            for q in POLLED_QUEUES {
                Self::suppress(&vrings[q as usize], mem);
            }
            let mut deadline = now().0.saturating_add(window_ns);
            let mut pass = 0u32;
            loop {
                pass = pass.wrapping_add(1);
                bump(&self.wstats.polls);
                let found = self.poll_once(vrings, mem)?;
                let t = now().0;
                if found {
                    bump(&self.wstats.poll_hits);
                    deadline = t.saturating_add(window_ns);
                }
                if (!found && t >= deadline) || self.tx_waiting.load(Ordering::Relaxed) {
                    break;
                }
                if pass.is_multiple_of(POLL_EVENT_CHECK) && self.other_events_pending() {
                    break;
                }
                if !found {
                    // Let a thread waiting for this CPU (the peer daemon, a vCPU) run first:
                    // polling must not hold up the work it waits for.
                    // SAFETY: plain syscall without arguments.
                    unsafe { libc::sched_yield() };
                }
            }
        }
        loop {
            let mut more = false;
            for q in POLLED_QUEUES {
                more |= Self::rearm(&vrings[q as usize]);
            }
            if !more {
                return Ok(());
            }
            self.poll_once(vrings, mem)?;
        }
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

    fn deliver_events(
        &self,
        vrings: &[VringRwLock],
        mem: &GM,
        model: &mut Model,
    ) -> io::Result<()> {
        if !model.has_events() {
            return Ok(());
        }
        self.resume_once(VQ_EVENT, vrings, mem);
        let guard = mem.memory();
        let vring = &vrings[VQ_EVENT as usize];
        let mut delivered = false;
        while model.has_events() {
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
            let fits = room >= std::mem::size_of::<abi::Event>() as u64;
            // A buffer too small for an event is returned empty; the event waits for the next.
            let used = match if fits { model.pop_event() } else { None } {
                Some(e) => Self::write_out(&guard, &writable, vm_memory::ByteValued::as_slice(&e)),
                None => 0,
            };
            let _ = vring.add_used(head, used);
            delivered = true;
        }
        if delivered {
            self.notify(VQ_EVENT, vring, &guard)?;
        }
        Ok(())
    }

    /// Another device of the process (`--same-host`) put packets in this one's inbox: if
    /// this device's worker is idle, this device's side runs on the sender's thread — the
    /// packets into the engine, what they start sent, events to the guest — as the worker
    /// would for SAME_HOST_EVENT, without waking it.
    pub fn try_drive(&self) -> bool {
        // In poll mode the worker re-arms the guest's kicks between polls without the
        // device's lock; its queues are its own then (and it is awake anyway).
        if self.poll_us > 0 {
            return false;
        }
        let Ok(mut model) = self.model.try_lock() else {
            return false;
        };
        let Some(mem) = lock(&self.mem).clone() else {
            return false;
        };
        let vrings = lock(&self.vrings).clone();
        if vrings.len() != NUM_QUEUES {
            return false;
        }
        if self.receive_inbox(self.inbox.as_ref(), &mut model, &mem) == 0 {
            return true;
        }
        if let Err(e) = self.pump_and_deliver(&vrings, &mem, &mut model, true) {
            log::warn!("same-host batch on the sender's thread: {e}");
        }
        self.kick_touched(&model);
        // The engine's timers (acknowledgements, retransmissions) from this batch.
        self.timer.arm_sooner(model.poll_timeout());
        true
    }

    /// Whether the driver acknowledged VIRTIO_F_NOTIFY_ON_EMPTY.
    pub fn set_notify_on_empty(&self, on: bool) {
        self.notify_on_empty.store(on, Ordering::Relaxed);
    }

    pub fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    /// An exit event for vhost-user-backend, its consumer fd kept for
    /// [`Self::close_exit_fds`].
    pub fn exit_event(
        &self,
    ) -> Option<(
        vmm_sys_util::event::EventConsumer,
        vmm_sys_util::event::EventNotifier,
    )> {
        crate::sys::exit_event(&self.exit_fds)
    }

    /// The device's config space.
    pub fn config_space(&self) -> abi::ConfigSpace {
        lock(&self.model).config_space()
    }

    /// A device reset: the model forgets the guest's objects; a receive back-off keeps its
    /// timer.
    pub fn reset(&self) {
        lock(&self.model).reset();
        self.timer.arm(lock(&self.rx_pause).until);
    }

    /// The frontend's memory table.
    pub fn set_memory(&self, mem: GM) {
        *lock(&self.mem) = Some(mem);
        // A reconnecting guest may not kick for a long time (its applications wait for
        // completions the lost device will never write): look at the rings soon on our own.
        if !self.state_checked.load(Ordering::Relaxed) {
            self.timer.arm(Some(now().plus_ns(STATE_CHECK_NS)));
        }
    }

    /// Serves one event of the worker's epoll: a queue's kick or one of the extra fds.
    pub fn handle(&self, device_event: u16, vrings: &[VringRwLock]) -> io::Result<()> {
        self.rx_resume_due();
        let Some(mem) = lock(&self.mem).clone() else {
            self.drain_without_memory(device_event);
            return Ok(());
        };
        if let Some(k) = self.wstats.kicks.get(device_event as usize) {
            bump(k);
        }
        if self.inbox.is_some() {
            let mut v = lock(&self.vrings);
            if v.is_empty() {
                v.extend(vrings.iter().cloned());
            }
        }
        let woke_at = now();
        let mut model = lock(&self.model);
        self.check_reconnect(device_event, vrings, &mut model);
        // Whether a poll session follows work on the queues: they are then processed without
        // re-enabling the guest's kicks, which the session does before the worker sleeps.
        let polling = lock(&self.window).window_ns() > 0;
        // Control commands go before bulk work: a kick of the control queue that came while
        // the worker was busy waits behind at most the one event at hand, not behind every
        // packet and doorbell event the same epoll wake-up returned before it.
        // (With the guest's kicks re-armed: no poll session need follow this event.)
        if device_event == WORK_EVENT {
            // Before the control commands: a turn of them that leaves some asks for another.
            let _ = self.work.read();
        }
        if device_event != VQ_CTRL && self.ctrl_pending(vrings, &mem) {
            bump(&self.wstats.ctrl_first);
            self.serve_queue(VQ_CTRL, vrings, &mem, &mut model, true)?;
        }
        let worked = self.dispatch(device_event, vrings, &mem, &mut model, polling)?;
        self.pump_and_deliver(vrings, &mem, &mut model, true)?;
        self.kick_touched(&model);
        self.follow_gids(&mut model);
        if self.mcast.as_ref().is_some_and(|g| g.pending()) {
            self.sync_groups();
        }
        if worked && lock(&self.window).enabled() {
            let window = {
                let mut w = lock(&self.window);
                w.woke(woke_at.0);
                w.window_ns()
            };
            if polling || window > 0 {
                drop(model);
                // A session that finds the window shrunk to 0 only re-enables the kicks.
                self.poll_session(vrings, &mem, if polling { window } else { 0 })?;
                model = lock(&self.model);
            }
            lock(&self.window).sleeping(now().0);
        }
        self.arm_next(&mut model);
        Ok(())
    }

    /// No memory table yet: nothing can be read. Drains what woke the worker so that it
    /// stops firing.
    fn drain_without_memory(&self, device_event: u16) {
        match device_event {
            TIMER_EVENT => self.timer.consume(),
            WORK_EVENT => {
                let _ = self.work.read();
            }
            UDP_WRITABLE_EVENT => self.wait_writable(false),
            COUNTERS_EVENT => self.publish_counters(&lock(&self.model)),
            UDP_EVENT => {
                // Nothing to deliver to: drop (and count) what a wake-up brings, no more;
                // the socket is level-triggered and the rest wakes us again.
                let mut t = lock(&self.transport);
                t.drop_unattached(RX_LIMIT);
                if self.rx_health(&t) {
                    drop(t);
                    self.sync_port(&mut lock(&self.model), false);
                }
            }
            LINK_EVENT => self.link_changed(&mut lock(&self.model), false),
            SAME_HOST_EVENT => {
                if let Some(i) = &self.inbox {
                    i.discard(RX_LIMIT);
                }
            }
            IO_EVENT => {
                if let Some(i) = &self.io_inbox {
                    i.discard(RX_LIMIT);
                }
            }
            _ => {}
        }
    }

    /// The first kick of this connection, or the timer armed when its memory table came:
    /// a control queue that does not start at 0 is a running guest reconnecting (the VMM
    /// restores the ring positions), and everything it created lives in a device instance
    /// that is gone. Say so (DEVICE_FATAL) rather than let its QPs stop without a word.
    fn check_reconnect(&self, device_event: u16, vrings: &[VringRwLock], model: &mut Model) {
        let ctrl_ready = vrings[VQ_CTRL as usize].get_ref().get_queue().ready();
        if (device_event <= VQ_EVENT || (device_event == TIMER_EVENT && ctrl_ready))
            && !self.state_checked.swap(true, Ordering::Relaxed)
        {
            let base = vrings[VQ_CTRL as usize].get_mut().get_queue().next_avail();
            if base != 0 {
                log::warn!(
                    "frontend reconnected with control queue at {base}: device state was lost"
                );
                model.device_fatal();
            }
        }
    }

    /// What the event itself asks for; returns whether it brought work (a used chain, a
    /// received packet) that a poll session may follow.
    fn dispatch(
        &self,
        device_event: u16,
        vrings: &[VringRwLock],
        mem: &GM,
        model: &mut Model,
        polling: bool,
    ) -> io::Result<bool> {
        Ok(match device_event {
            VQ_CTRL | VQ_DOORBELL => {
                self.serve_queue(device_event, vrings, mem, model, !polling)?
            }
            VQ_EVENT => {
                self.resume_once(VQ_EVENT, vrings, mem);
                false
            }
            UDP_EVENT => self.receive_socket(model, mem) > 0,
            SAME_HOST_EVENT => self.receive_inbox(self.inbox.as_ref(), model, mem) > 0,
            IO_EVENT => self.receive_inbox(self.io_inbox.as_ref(), model, mem) > 0,
            TIMER_EVENT => {
                self.timer.consume();
                model.handle_timeout(now());
                false
            }
            // Its eventfd was read before the control commands were served.
            WORK_EVENT => false,
            // The pump below sends what waited first.
            UDP_WRITABLE_EVENT => {
                self.wait_writable(false);
                false
            }
            COUNTERS_EVENT => {
                self.publish_counters(model);
                false
            }
            LINK_EVENT => {
                self.link_changed(model, true);
                false
            }
            _ => {
                log::warn!("unexpected event id {device_event}");
                false
            }
        })
    }

    /// Beside the guest's virtio-net, RoCE is taken for exactly the guest's GIDs.
    fn follow_gids(&self, model: &mut Model) {
        let Some(gids) = model.take_changed_gids() else {
            return;
        };
        if let Err(e) = lock(&self.transport).follow_gids(&gids) {
            // (the guest chooses the list: its length is not the log's)
            let shown = &gids[..gids.len().min(4)];
            crate::warn_limited!(
                "taking RoCE for the guest's {} GIDs ({shown:?}{}): {e}",
                gids.len(),
                if gids.len() > shown.len() { " ..." } else { "" }
            );
        }
    }

    /// Arms the timer for what comes next: the engine's timers, the end of a receive
    /// back-off, the reconnect check, the heap's return to the kernel.
    fn arm_next(&self, model: &mut Model) {
        let mut next = model.poll_timeout();
        if let Some(until) = lock(&self.rx_pause).until {
            next = Some(next.map_or(until, |t| t.min(until)));
        }
        if !self.state_checked.load(Ordering::Relaxed) {
            // the rings are not set up yet: look again
            let check = now().plus_ns(STATE_CHECK_NS);
            next = Some(next.map_or(check, |t| t.min(check)));
        }
        // Objects were freed: give their heap back to the kernel, at most every TRIM_EVERY;
        // one freed within that time is given back when the timer comes, so that nothing
        // stays resident once the guest is quiet.
        if model.released() {
            if crate::heap::trim_at_most_every(TRIM_EVERY) {
                model.clear_released();
            } else {
                let at = now().plus_ns(TRIM_EVERY.as_nanos() as u64);
                next = Some(next.map_or(at, |t| t.min(at)));
            }
        }
        self.timer.arm(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const SIZE: u16 = 16;

    /// A started ring of 16 entries in fresh guest memory whose guest made `avail` buffers
    /// (heads 0, 1, …) available, of which `used` were used; the frontend set `base`.
    fn ring(avail: u16, used: u16, base: u16) -> (VringRwLock, GuestMemoryMmap) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        for i in 0..SIZE {
            let d = DESC + 16 * i as u64;
            mem.write_obj(0x8000 + 0x100 * i as u64, GuestAddress(d))
                .unwrap();
            mem.write_obj(16u32, GuestAddress(d + 8)).unwrap();
            mem.write_obj(2u16, GuestAddress(d + 12)).unwrap(); // device-writable
        }
        for n in 0..avail {
            let slot = AVAIL + 4 + 2 * (n % SIZE) as u64;
            mem.write_obj(n % SIZE, GuestAddress(slot)).unwrap();
        }
        mem.write_obj(avail, GuestAddress(AVAIL + 2)).unwrap();
        mem.write_obj(used, GuestAddress(USED + 2)).unwrap();
        let v = VringRwLock::new(GuestMemoryAtomic::new(mem.clone()), SIZE).unwrap();
        v.set_queue_size(SIZE);
        v.set_queue_info(DESC, AVAIL, USED).unwrap();
        // SET_VRING_ADDR takes the used index from guest memory, SET_VRING_BASE the base.
        v.set_queue_next_used(v.queue_used_idx().unwrap());
        v.set_queue_next_avail(base);
        v.set_queue_ready(true);
        (v, mem)
    }

    fn heads(v: &VringRwLock, mem: &GuestMemoryMmap) -> Vec<u16> {
        let mut st = v.get_mut();
        st.get_queue_mut()
            .iter(mem)
            .unwrap()
            .map(|c| c.head_index())
            .collect()
    }

    /// cloud-hypervisor's reconnect: base at the avail index (5), two buffers used before.
    /// The three the guest still waits on are taken again, in order.
    #[test]
    fn base_at_the_avail_index_resumes_at_the_used_index() {
        let (v, mem) = ring(5, 2, 5);
        assert_eq!(resume_at_used(&v, &mem), Some((5, 2)));
        assert_eq!(v.queue_next_avail(), 2);
        assert_eq!(heads(&v, &mem), [2, 3, 4]);
    }

    /// The same across the 16-bit wrap of the indices.
    #[test]
    fn resume_across_the_index_wrap() {
        let (v, mem) = ring(3, 65534, 3);
        assert_eq!(resume_at_used(&v, &mem), Some((3, 65534)));
        assert_eq!(heads(&v, &mem).len(), 5);
    }

    /// QEMU's reconnect (base at the used index) and a fresh guest (all at 0): unchanged.
    #[test]
    fn base_at_the_used_index_is_left_alone() {
        let (v, mem) = ring(5, 2, 2);
        assert_eq!(resume_at_used(&v, &mem), None);
        assert_eq!(heads(&v, &mem), [2, 3, 4]);
        let (v, mem) = ring(0, 0, 0);
        assert_eq!(resume_at_used(&v, &mem), None);
        assert_eq!(v.queue_next_avail(), 0);
    }

    /// Bases and indices that cannot come from one ring are not acted on: a base past the
    /// avail index, more outstanding than the ring holds, a queue not started.
    #[test]
    fn inconsistent_positions_are_left_alone() {
        let (v, mem) = ring(5, 2, 9);
        assert_eq!(resume_at_used(&v, &mem), None);
        assert_eq!(v.queue_next_avail(), 9);
        let (v, mem) = ring(40, 2, 40);
        assert_eq!(resume_at_used(&v, &mem), None);
        let (v, mem) = ring(5, 2, 5);
        v.set_queue_ready(false);
        assert_eq!(resume_at_used(&v, &mem), None);
        assert_eq!(v.queue_next_avail(), 5);
    }

    /// A socket that keeps failing is left alone longer each time, up to a second; one
    /// receive that works ends the back-off.
    #[test]
    fn a_failing_socket_is_left_alone_longer_each_time() {
        let mut b = RxBackoff::default();
        let t = rxe_core::Instant(1_000_000_000);
        let waits: Vec<u64> = (0..12).map(|_| b.fail(t).0 - t.0).collect();
        assert_eq!(waits[..4], [1_000_000, 2_000_000, 4_000_000, 8_000_000]);
        assert_eq!(*waits.last().unwrap(), RxBackoff::MAX_NS);
        b.ok();
        assert_eq!(b.fail(t).0 - t.0, RxBackoff::MIN_NS);
    }
}
