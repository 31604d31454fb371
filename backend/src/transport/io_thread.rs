//! `--io-thread`: the UDP socket's work on a second core. The worker thread runs the engine
//! and the guest's rings; the I/O thread makes every `sendmmsg` and `recvmmsg` and verifies
//! every received ICRC. Between them there is no lock on the packet path: send batches go
//! over a bounded channel and come back empty over another, received packets go through an
//! [`Inbox`] (the same-host shortcut's), and each side wakes the other only when it sleeps.
//!
//! ```text
//!  worker: engine ─► UdpTransport::push (route, ICRC) ─► batch of 32 ─► channel (8 batches)
//!  I/O:    channel ─► sendmmsg / GSO ─► empty batch back ─► worker
//!  I/O:    recvmmsg ─► ICRC check ─► Inbox (+ eventfd) ─► worker: engine
//! ```
//!
//! Backpressure keeps the socket's: a full socket buffer stops the I/O thread taking
//! batches, a full channel stops the worker's pump ([`crate::device::model::Pump::Blocked`]) until
//! the I/O thread has taken a batch and woken it. A full inbox stops the I/O thread reading
//! the socket until the worker has taken half of it: packets wait in the socket buffer, which
//! drops what does not fit, as it would with no thread between.
//!
//! A batch of a few packets (an ACK, a lone small message) the worker sends itself when the
//! I/O thread sleeps with nothing in hand, rather than wake it: it then leaves as it would
//! without the thread. Larger batches always go to the thread. What it costs: received
//! packets cross one more thread, and each hand-over to a sleeping thread is a wake-up
//! (docs/benchmarks.md, "I/O thread").

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::sync::lock;
use crate::transport::same_host::Inbox;
use crate::transport::socket::{TxBatch, UdpIo, RX_BATCH};
use crate::transport::stats::TransportStats;

/// Send batches the channel to the I/O thread holds: 8 × 32 = 256 packets on their way to
/// the socket, about 1 MiB at 4 KiB each. Batches in circulation (the channel's, the one
/// being filled, the one the thread sends, those coming back) stay allocated: about 3 MiB
/// per device once it has been busy.
pub const CHANNEL_BATCHES: usize = 8;
/// Batches of at most this many packets the worker sends itself when the I/O thread sleeps
/// with nothing in hand ([`TxOffload::io_idle`]): an ACK or a lone small message leaves
/// without a wake-up of the other thread; anything larger is handed over.
pub const INLINE_MAX: usize = 4;
/// Datagrams the I/O thread receives before it looks at the send channel again.
const RX_ROUND: usize = 256;

/// What the two threads share.
struct Link {
    /// The I/O thread is about to sleep (or sleeps) in epoll: a sender must wake it.
    io_sleeping: AtomicBool,
    /// Batches sent and not yet taken (an over-count for a moment is harmless).
    queued: AtomicUsize,
    /// The worker found the channel full and waits to be woken when there is room.
    worker_waiting: AtomicBool,
    /// The I/O thread holds packets the socket did not take (it waits for room).
    io_holding: AtomicBool,
    /// Wakes the I/O thread (a batch came, or it is asked to stop).
    io_wake: EventFd,
    stop: AtomicBool,
    /// Received packets, for the worker; its eventfd wakes the worker (packets, or room in
    /// the channel).
    inbox: Arc<Inbox>,
    stats: IoStats,
}

impl Link {
    fn new() -> io::Result<Arc<Link>> {
        Ok(Arc::new(Link {
            io_sleeping: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            worker_waiting: AtomicBool::new(false),
            io_holding: AtomicBool::new(false),
            io_wake: EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
            stop: AtomicBool::new(false),
            inbox: Inbox::standalone()?,
            stats: IoStats::default(),
        }))
    }
}

/// The I/O thread's counters (the `"io_thread"` object of the counters).
#[derive(Debug, Default)]
pub struct IoStats {
    /// Send batches handed to the I/O thread.
    pub tx_batches: AtomicU64,
    /// Times the worker found the channel full and waited.
    pub tx_channel_full: AtomicU64,
    /// Times the worker woke the I/O thread (it was sleeping).
    pub io_wakeups: AtomicU64,
    /// Batches the worker sent itself: the I/O thread was asleep with nothing in hand.
    pub tx_inline: AtomicU64,
    /// Times the I/O thread stopped reading the socket because the inbox was full.
    pub rx_full: AtomicU64,
}

/// The worker's end: hands send batches to the I/O thread.
pub struct TxOffload {
    to_io: SyncSender<TxBatch>,
    back: Receiver<TxBatch>,
    link: Arc<Link>,
    /// The I/O thread's half, for its counters (the worker never sends through it).
    io: Arc<Mutex<UdpIo>>,
    /// An empty batch the worker had in hand when the channel was full.
    kept: Option<TxBatch>,
}

/// Why [`TxOffload::send`] gave a batch back.
pub enum Refused {
    /// The channel is full: try again when woken.
    Full(TxBatch),
    /// The I/O thread is gone (the device is stopping): the packets are lost.
    Gone(TxBatch),
}

impl TxOffload {
    /// The inbox the I/O thread puts received packets in.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.link.inbox
    }

    /// The I/O thread's transport counters.
    pub fn io_stats(&self) -> TransportStats {
        lock(&self.io).stats
    }

    /// An empty batch: one the I/O thread gave back, or a new one.
    pub fn spare(&mut self) -> TxBatch {
        if let Some(b) = self.kept.take() {
            return b;
        }
        match self.back.try_recv() {
            Ok(mut b) => {
                b.pending.clear();
                b
            }
            Err(_) => TxBatch::new(),
        }
    }

    /// Whether the I/O thread sleeps with nothing in hand and nothing queued for it: the
    /// worker may then send a batch itself, in order, instead of waking it. Only the worker
    /// hands batches over, so nothing can overtake the batch it sends.
    pub fn io_idle(&self) -> bool {
        let l = &self.link;
        l.io_sleeping.load(Ordering::SeqCst)
            && l.queued.load(Ordering::SeqCst) == 0
            && !l.io_holding.load(Ordering::SeqCst)
    }

    /// Counts a batch the worker sent itself.
    pub fn sent_inline(&self) {
        self.link.stats.tx_inline.fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps an empty batch for the next [`Self::spare`].
    pub fn keep(&mut self, b: TxBatch) {
        self.kept = Some(b);
    }

    /// Hands `batch` to the I/O thread (waking it if it sleeps), or gives it back.
    pub fn send(&self, batch: TxBatch) -> Result<(), Refused> {
        let l = &self.link;
        l.queued.fetch_add(1, Ordering::SeqCst);
        let batch = match self.to_io.try_send(batch) {
            Ok(()) => {
                self.sent();
                return Ok(());
            }
            Err(TrySendError::Disconnected(b)) => {
                l.queued.fetch_sub(1, Ordering::SeqCst);
                return Err(Refused::Gone(b));
            }
            Err(TrySendError::Full(b)) => b,
        };
        // Full: ask to be woken, then look once more (the I/O thread may have taken every
        // batch before it saw the request).
        l.worker_waiting.store(true, Ordering::SeqCst);
        match self.to_io.try_send(batch) {
            Ok(()) => {
                l.worker_waiting.store(false, Ordering::SeqCst);
                self.sent();
                Ok(())
            }
            Err(TrySendError::Full(b)) => {
                l.queued.fetch_sub(1, Ordering::SeqCst);
                l.stats.tx_channel_full.fetch_add(1, Ordering::Relaxed);
                Err(Refused::Full(b))
            }
            Err(TrySendError::Disconnected(b)) => {
                l.queued.fetch_sub(1, Ordering::SeqCst);
                Err(Refused::Gone(b))
            }
        }
    }

    fn sent(&self) {
        let l = &self.link;
        l.stats.tx_batches.fetch_add(1, Ordering::Relaxed);
        if l.io_sleeping.swap(false, Ordering::SeqCst) {
            l.stats.io_wakeups.fetch_add(1, Ordering::Relaxed);
            let _ = l.io_wake.write(1);
        }
    }
}

/// The I/O thread of one device; dropping it stops and joins the thread.
pub struct IoThread {
    link: Arc<Link>,
    /// The socket half the thread sends and receives with (its counters are the device's).
    io: Arc<Mutex<UdpIo>>,
    thread: Option<JoinHandle<()>>,
}

impl IoThread {
    /// Starts the thread on a half of the socket `t` of its own
    /// ([`UdpIo::io_half`]); returns it and the worker's end, which hands it send batches
    /// ([`crate::transport::udp::UdpTransport::start_io_thread`]).
    pub fn start(t: &UdpIo) -> io::Result<(IoThread, TxOffload)> {
        let io = Arc::new(Mutex::new(t.io_half()?));
        let (to_io, from_worker) = mpsc::sync_channel(CHANNEL_BATCHES);
        let (to_worker, back) = mpsc::channel();
        let link = Link::new()?;
        let mut run = Run {
            link: link.clone(),
            io: io.clone(),
            from_worker,
            to_worker,
            epoll: Epoll::new()?,
            interest: EventSet::empty(),
            rx_pause: crate::clock::RxBackoff::default(),
            rx_full: false,
            port_wait: None,
        };
        let thread = std::thread::Builder::new()
            .name("vur-io".into())
            .spawn(move || run.run())?;
        let offload = TxOffload {
            to_io,
            back,
            link: link.clone(),
            io: io.clone(),
            kept: None,
        };
        Ok((
            IoThread {
                link,
                io,
                thread: Some(thread),
            },
            offload,
        ))
    }

    /// The inbox received packets wait in; its fd wakes the worker.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.link.inbox
    }

    /// The I/O thread's socket half (for its counters).
    pub fn transport(&self) -> &Arc<Mutex<UdpIo>> {
        &self.io
    }

    /// The counters as the members of a JSON object.
    pub fn render(&self) -> String {
        let s = &self.link.stats;
        let i = &self.link.inbox.stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "\"tx_batches\":{},\"tx_inline\":{},\"tx_channel_full\":{},\"io_wakeups\":{},\"rx_packets\":{},\"rx_dropped\":{},\"rx_full\":{},\"rx_waiting\":{}",
            r(&s.tx_batches),
            r(&s.tx_inline),
            r(&s.tx_channel_full),
            r(&s.io_wakeups),
            r(&i.rx_packets),
            r(&i.rx_dropped),
            r(&s.rx_full),
            self.link.inbox.len()
        )
    }
}

impl IoThread {
    /// Asks the thread to stop (it does at its next wake-up, at once if it sleeps).
    pub fn stop(&self) {
        self.link.stop.store(true, Ordering::SeqCst);
        let _ = self.link.io_wake.write(1);
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::error!("the I/O thread panicked");
            }
        }
    }
}

/// A worker's end with no I/O thread behind it, and the channel's other end (tests of the
/// worker's side: a full channel, a thread that is gone).
#[cfg(test)]
pub(crate) fn offload_without_thread(t: &UdpIo) -> io::Result<(TxOffload, Receiver<TxBatch>)> {
    let (to_io, from_worker) = mpsc::sync_channel(CHANNEL_BATCHES);
    let (_to_worker, back) = mpsc::channel();
    let link = Link::new()?;
    let off = TxOffload {
        to_io,
        back,
        link,
        io: Arc::new(Mutex::new(t.io_half()?)),
        kept: None,
    };
    Ok((off, from_worker))
}

#[cfg(test)]
impl TxOffload {
    /// Whether the worker asked to be woken when the channel has room.
    pub(crate) fn waits(&self) -> bool {
        self.link.worker_waiting.load(Ordering::SeqCst)
    }
}

const TOKEN_SOCKET: u64 = 0;
const TOKEN_WAKE: u64 = 1;
const TOKEN_ROOM: u64 = 2;
/// A source-port socket that is full ([`UdpIo::blocked_port_fd`]), for its writability.
const TOKEN_PORT: u64 = 3;

/// The I/O thread's state.
struct Run {
    link: Arc<Link>,
    io: Arc<Mutex<UdpIo>>,
    from_worker: Receiver<TxBatch>,
    to_worker: Sender<TxBatch>,
    epoll: Epoll,
    /// The socket's epoll interest now (IN while receiving, OUT while blocked).
    interest: EventSet,
    rx_pause: crate::clock::RxBackoff,
    /// The inbox was full: the socket is not read until the worker has made room.
    rx_full: bool,
    /// A duplicate of the source-port socket that is full, in the epoll for EPOLLOUT.
    port_wait: Option<OwnedFd>,
}

impl Run {
    fn run(&mut self) {
        // Started with its transport, before the daemon dropped its privileges: drop this
        // thread's own (the socket is open; nothing here needs one).
        if let Err(e) = crate::sys::drop_privileges() {
            log::error!("I/O thread: dropping the privileges: {e}");
            return;
        }
        if let Err(e) = self.run_loop() {
            log::error!("I/O thread: {e}");
        }
        // Whatever the worker sends from now on comes back as Gone.
    }

    fn run_loop(&mut self) -> io::Result<()> {
        let ep = &self.epoll;
        let sock = lock(&self.io).fd();
        let add =
            |fd, events, token| ep.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token));
        add(self.link.io_wake.as_raw_fd(), EventSet::IN, TOKEN_WAKE)?;
        add(sock, EventSet::empty(), TOKEN_SOCKET)?;
        add(self.link.inbox.room_fd(), EventSet::IN, TOKEN_ROOM)?;
        let mut events = [EpollEvent::default(); 4];
        loop {
            if self.link.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let now = crate::clock::now();
            if self.rx_pause.until.is_some_and(|u| now >= u) {
                self.rx_pause.until = None;
            }
            let blocked = self.send();
            self.link.io_holding.store(blocked, Ordering::SeqCst);
            let receiving = self.rx_pause.until.is_none() && !self.rx_full;
            if receiving {
                self.receive();
            }
            // Full: the bound socket (its OUT interest), or a source-port socket (its own).
            let port = if blocked {
                lock(&self.io).blocked_port_fd()
            } else {
                None
            };
            self.wait_port(port)?;
            let mut want = EventSet::empty();
            if blocked && port.is_none() {
                want |= EventSet::OUT;
            }
            if self.rx_pause.until.is_none() && !self.rx_full {
                want |= EventSet::IN;
            }
            if want != self.interest {
                let ev = EpollEvent::new(want, TOKEN_SOCKET);
                self.epoll.ctl(ControlOperation::Modify, sock, ev)?;
                self.interest = want;
            }
            // Sleep, unless a batch came meanwhile (the worker wakes a sleeper only).
            self.link.io_sleeping.store(true, Ordering::SeqCst);
            let timeout = if self.link.queued.load(Ordering::SeqCst) > 0 && !blocked {
                0
            } else {
                match self.rx_pause.until {
                    Some(u) => (u.0.saturating_sub(crate::clock::now().0) / 1_000_000 + 1)
                        .min(i32::MAX as u64) as i32,
                    None => -1,
                }
            };
            let woken = self.epoll.wait(timeout, &mut events);
            self.link.io_sleeping.store(false, Ordering::SeqCst);
            let n = match woken {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
                Err(e) => return Err(e),
            };
            // The eventfd only when it woke us: no system call per wake-up by the socket.
            if events[..n].iter().any(|e| e.data() == TOKEN_WAKE) {
                let _ = self.link.io_wake.read();
            }
            if events[..n].iter().any(|e| e.data() == TOKEN_ROOM) {
                self.rx_full = self.link.inbox.room_taken();
            }
        }
    }

    /// Sends what waits: first what the socket did not take before, then the batches the
    /// worker handed over, until the socket is full or there are none. True if the socket
    /// is full.
    fn send(&mut self) -> bool {
        let mut t = lock(&self.io);
        if t.tx_blocked_now() {
            t.send_held();
        }
        while !t.tx_blocked_now() {
            let b = match self.from_worker.try_recv() {
                Ok(b) => b,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            };
            self.link.queued.fetch_sub(1, Ordering::SeqCst);
            let empty = t.send_batch(b);
            let _ = self.to_worker.send(empty);
            if self.link.worker_waiting.swap(false, Ordering::SeqCst) {
                // Room in the channel: the worker's next pump hands its batch over.
                self.link.inbox.signal();
            }
        }
        t.tx_blocked_now()
    }

    /// Waits for the writability of source-port socket `port` (a duplicate of it, in the
    /// epoll until the next round), or of none.
    fn wait_port(&mut self, port: Option<RawFd>) -> io::Result<()> {
        if let Some(d) = self.port_wait.take() {
            self.epoll.ctl(
                ControlOperation::Delete,
                d.as_raw_fd(),
                EpollEvent::default(),
            )?;
        }
        let Some(p) = port else {
            return Ok(());
        };
        let d = crate::sys::dup_cloexec(p)?;
        self.epoll.ctl(
            ControlOperation::Add,
            d.as_raw_fd(),
            EpollEvent::new(EventSet::OUT, TOKEN_PORT),
        )?;
        self.port_wait = Some(d);
        Ok(())
    }

    /// Receives up to [`RX_ROUND`] datagrams into the inbox and wakes the worker.
    fn receive(&mut self) {
        let mut t = lock(&self.io);
        let inbox = &self.link.inbox;
        let mut total = 0;
        while total < RX_ROUND {
            if inbox.wait_for_room(RX_BATCH) {
                self.rx_full = true;
                self.link.stats.rx_full.fetch_add(1, Ordering::Relaxed);
                break;
            }
            let n = t.recv_batch();
            for i in 0..n {
                if let Some((meta, bytes)) = t.packet(i) {
                    inbox.put_packet(meta, bytes);
                }
            }
            total += n;
            if n < RX_BATCH {
                break;
            }
        }
        if total > 0 {
            inbox.signal();
        }
        if t.rx_failing() {
            let until = self.rx_pause.fail(crate::clock::now());
            log::warn!(
                "udp socket: {} receive errors so far; not reading it for {} ms",
                t.stats.rx_errors,
                until.0.saturating_sub(crate::clock::now().0) / 1_000_000
            );
        } else {
            self.rx_pause.ok();
        }
    }
}
