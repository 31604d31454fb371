//! Threads that drive engine shards (`--shard-threads`): with `--engine-shards N`, shards
//! 1 to N-1 of a device each run on a thread of their own, beside the device's vhost-user
//! worker, which serves the virtqueues and shard 0.
//!
//! Each shard has a UDP socket of its own in a group the kernel steers by destination QPN
//! ([`crate::transport::steer`]), so the packets of a shard's QPs arrive on its thread and nowhere
//! else. The thread receives them into its shard, runs the shard's timers, and sends what
//! the shard has to send from its own socket; completions go into the guest's CQ rings
//! under each CQ's lock. What only the device's worker can do it asks of it by waking it:
//! hand the guest events (the event queue is the worker's). Doorbells and control commands
//! for a shard's QPs come from the worker, which takes the shard's lock for them and then
//! wakes the shard's thread to send what they started.
//!
//! ```text
//!   vhost-user worker ── control, doorbell, event vq; shard 0; socket 0
//!        │  ▲ kick (doorbell pulled WQEs)      │ wake (events to deliver)
//!        ▼  │                                  ▼
//!   shard thread k ── shard k; socket k (packets of QPNs ≡ k mod N); its timerfd
//! ```

use std::io;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use vm_memory::GuestAddressSpace;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::clock::{now, RxBackoff, Timer};
use crate::device::model::{Pump, ShardHandle, TX_BUDGET};
use crate::memory::guest_mem::GuestMemoryMmap;
use crate::sync::lock;
use crate::transport::udp::{TransportStats, UdpTransport};
use crate::worker::receive::receive_batch;

/// Where the device's worker keeps the guest's memory (`None` before the frontend's table).
pub type MemorySlot = Arc<Mutex<Option<vm_memory::GuestMemoryAtomic<GuestMemoryMmap>>>>;

/// Datagrams received per wake-up before the shard is pumped (the socket is
/// level-triggered: what is left wakes the thread again).
const RX_LIMIT: usize = 256;

const SOCKET: u64 = 0;
const TIMER: u64 = 1;
const KICK: u64 = 2;
const STOP: u64 = 3;
/// A full source-port socket ([`UdpTransport::blocked_port_fd`]), for its writability.
const PORT: u64 = 4;

/// A shard's socket, kept by the device across frontends, and what it counted.
pub struct ShardLink {
    /// The transport; taken by the shard's thread while it runs.
    transport: Mutex<Option<UdpTransport>>,
    /// Its counters as of the thread's last pass.
    stats: Mutex<TransportStats>,
}

impl ShardLink {
    pub fn new(t: UdpTransport) -> Self {
        ShardLink {
            stats: Mutex::new(t.all_stats()),
            transport: Mutex::new(Some(t)),
        }
    }

    pub fn stats(&self) -> TransportStats {
        *lock(&self.stats)
    }
}

/// The counters of the transport and of every shard's socket, added up.
pub fn all_stats(t: TransportStats, links: &[Arc<ShardLink>]) -> TransportStats {
    links.iter().fold(t, |t, l| t.plus(&l.stats()))
}

/// The threads of one frontend's shards; dropping stops and joins them (the sockets go back
/// to their links).
pub struct ShardWorkers {
    stop: Arc<EventFd>,
    threads: Vec<JoinHandle<()>>,
}

/// What a shard's thread works with.
struct Worker {
    shard: ShardHandle,
    /// The shard's socket, and where the thread leaves its counters.
    link: Arc<ShardLink>,
    /// The guest's memory, as the device's worker keeps it.
    mem: MemorySlot,
    /// Every shard's kick (index = shard; shard 0's is the device's worker's wake-up).
    kicks: Arc<Vec<Arc<EventFd>>>,
    stop: Arc<EventFd>,
    timer: Timer,
}

impl ShardWorkers {
    /// How to wake the thread of each of `shards` shards (index = shard): `wake`, the
    /// device's worker's wake-up, for shard 0, a new eventfd for each other one.
    pub fn kicks(wake: Arc<EventFd>, shards: usize) -> io::Result<Arc<Vec<Arc<EventFd>>>> {
        let mut kicks = vec![wake];
        for _ in 1..shards {
            kicks.push(Arc::new(EventFd::new(
                libc::EFD_NONBLOCK | libc::EFD_CLOEXEC,
            )?));
        }
        Ok(Arc::new(kicks))
    }

    /// Starts a thread for each of `shards` on its link (`links[k - 1]` for shard `k`),
    /// woken by `kicks[k]` ([`Self::kicks`]), reading the guest's memory from `mem`.
    pub fn start(
        shards: Vec<ShardHandle>,
        links: &[Arc<ShardLink>],
        kicks: &Arc<Vec<Arc<EventFd>>>,
        mem: &MemorySlot,
    ) -> io::Result<Self> {
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?);
        let mut w = ShardWorkers {
            stop: stop.clone(),
            threads: Vec::new(),
        };
        for shard in shards {
            let k = shard.index();
            let link = links.get(k - 1).cloned().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "no socket for the shard")
            })?;
            let worker = Worker {
                shard,
                link,
                mem: mem.clone(),
                kicks: kicks.clone(),
                stop: stop.clone(),
                timer: Timer::new()?,
            };
            let t = std::thread::Builder::new()
                .name(format!("vur-shard{k}"))
                .spawn(move || worker.run())?;
            // Pushed at once: a failure starting the next thread stops this one (drop).
            w.threads.push(t);
        }
        Ok(w)
    }
}

impl Drop for ShardWorkers {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Worker {
    fn run(self) {
        let Some(mut t) = lock(&self.link.transport).take() else {
            log::error!("shard {}: its socket is in use", self.shard.index());
            return;
        };
        if let Err(e) = self.serve(&mut t) {
            log::error!("shard {}: {e}", self.shard.index());
        }
        *lock(&self.link.stats) = t.all_stats();
        *lock(&self.link.transport) = Some(t);
    }

    fn serve(&self, t: &mut UdpTransport) -> io::Result<()> {
        let ep = Epoll::new()?;
        let sock = t.fd();
        let add = |fd, ev, id| ep.ctl(ControlOperation::Add, fd, EpollEvent::new(ev, id));
        add(sock, EventSet::IN, SOCKET)?;
        add(self.timer.fd(), EventSet::IN, TIMER)?;
        let kick = &self.kicks[self.shard.index()];
        add(kick.as_raw_fd(), EventSet::IN, KICK)?;
        add(self.stop.as_raw_fd(), EventSet::IN, STOP)?;
        let mut events = [EpollEvent::default(); 4];
        // Work left after a pump's budget: look again without sleeping.
        let mut more = false;
        // Waiting for the socket to take what it refused (EPOLLOUT registered).
        let mut writable_wait = false;
        // Or for a source-port socket that is full (a descriptor of ours, in the epoll).
        let mut port_wait: Option<std::os::fd::OwnedFd> = None;
        let mut rx = RxBackoff::default();
        loop {
            let n = match ep.wait(if more { 0 } else { -1 }, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for e in &events[..n] {
                match e.data() {
                    TIMER => self.timer.consume(),
                    KICK => {
                        let _ = kick.read();
                    }
                    STOP => return Ok(()),
                    _ => {}
                }
            }
            if rx.until.is_some_and(|u| now() >= u) {
                rx.until = None;
                writable_wait = false;
                add(sock, EventSet::IN, SOCKET)?;
            }
            let Some(mem) = lock(&self.mem).clone() else {
                // No guest memory yet (or any more): nothing can be delivered.
                t.drop_unattached(RX_LIMIT);
                more = false;
                continue;
            };
            let g = mem.memory();
            let events_before = self.shard.events_raised();
            let mut touched = 0u64;
            if rx.until.is_none() {
                touched |= self.receive(t, &g);
                if t.rx_failing() {
                    let until = rx.fail(now());
                    log::warn!(
                        "shard {} socket: {} receive errors so far; not reading it for a while",
                        self.shard.index(),
                        t.all_stats().rx_errors
                    );
                    ep.ctl(
                        ControlOperation::Delete,
                        sock,
                        EpollEvent::new(EventSet::IN, SOCKET),
                    )?;
                    rx.until = Some(until);
                } else {
                    rx.ok();
                }
            }
            let at = now();
            if self.shard.poll_timeout().is_some_and(|d| d <= at) {
                self.shard.handle_timeout(at);
            }
            let p = self.shard.pump(&g, now(), t, TX_BUDGET);
            more = p == Pump::Budget;
            // Full: the bound socket (its OUT interest), or a source-port socket (its own).
            let port = if p == Pump::Blocked {
                t.blocked_port_fd()
            } else {
                None
            };
            if let Some(d) = port_wait.take() {
                ep.ctl(
                    ControlOperation::Delete,
                    d.as_raw_fd(),
                    EpollEvent::default(),
                )?;
            }
            if let Some(fd) = port {
                let d = crate::sys::dup_cloexec(fd)?;
                add(d.as_raw_fd(), EventSet::OUT, PORT)?;
                port_wait = Some(d);
            }
            let blocked = p == Pump::Blocked && port.is_none();
            if blocked != writable_wait && rx.until.is_none() {
                let ev = if blocked {
                    EventSet::IN | EventSet::OUT
                } else {
                    EventSet::IN
                };
                ep.ctl(ControlOperation::Modify, sock, EpollEvent::new(ev, SOCKET))?;
                writable_wait = blocked;
            }
            // Events for the guest, or work in another shard: wake whoever delivers it.
            if self.shard.events_raised() != events_before {
                touched |= 1;
            }
            touched &= !(1 << self.shard.index());
            for (k, fd) in self.kicks.iter().enumerate() {
                if touched & (1 << k) != 0 {
                    let _ = fd.write(1);
                }
            }
            let mut next = self.shard.poll_timeout();
            if let Some(u) = rx.until {
                next = Some(next.map_or(u, |n| n.min(u)));
            }
            self.timer.arm(next);
            *lock(&self.link.stats) = t.all_stats();
        }
    }

    /// Receives up to [`RX_LIMIT`] datagrams into the engine; returns the shards they went
    /// to, a bit each.
    fn receive(&self, t: &mut UdpTransport, g: &GuestMemoryMmap) -> u64 {
        let mut touched = 0;
        receive_batch(t, RX_LIMIT, |at, meta, bytes| {
            touched |= self.shard.handle_packet(g, at, meta, bytes);
        });
        touched
    }
}
