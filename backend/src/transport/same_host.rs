//! The same-host shortcut (`--same-host`): when one daemon serves several frontends (one
//! `--socket-path` and `--udp-addr` each), a packet one of them sends to another's address
//! goes from one worker to the other through memory, never through the kernel: no socket
//! send or receive, no ICRC (no wire to protect), one wake-up per batch instead of one
//! datagram per packet.
//!
//! The engines are the same on both sides, so RC keeps its semantics: PSNs, ACKs, NAKs,
//! retries and completions are the packets they always are, and a full inbox loses a packet
//! the way a full socket buffer does (the requester retransmits).
//!
//! An RC payload may cross as a reference into the sender's guest memory
//! ([`crate::memory::payload_ref`]), but only for as long as the sender's batch lasts: the sender
//! holds its device's lock from the moment its engine builds the packet to the end of the
//! batch, so nothing revokes the memory (DEREG_MR, an invalidation, an error completion, a
//! QP reset, a device reset, a disconnect — all need that lock) while the reference lives.
//! At the end of its batch the sender hands its packets to each receiver ([`Inbox::signal`]):
//! a receiver whose worker is idle takes them at once, on the sender's thread, copying
//! straight from the sender's memory; for one that cannot take them all now, the referenced
//! bytes are copied into the waiting packets first ([`Inbox::seal`]), as on a wire. So what a
//! receiver gets is what the sender's memory held while its rights were valid, however long
//! the receiver keeps its worker busy.
//!
//! ```text
//!  worker A: engine ─► UdpTransport::push ─► dst is a same-host port? ─► Inbox B (+ eventfd)
//!  worker B: SAME_HOST_EVENT ─► Inbox::drain ─► engine B
//! ```

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use rxe_core::device::{RecvMeta, Transmit};
use vmm_sys_util::eventfd::EventFd;

use crate::memory::guest_mem::GuestMemoryMmap;
use crate::memory::payload_ref::PayloadRef;
use crate::sync::lock;

/// Packets an inbox holds at most (16 MiB of 4 KiB packets); beyond, a packet is dropped
/// and counted, as a full socket buffer would drop it.
pub const INBOX_CAP: usize = 4096;
/// Payload bytes the sealed packets of an inbox hold at most ([`Inbox::seal`]), as a socket
/// buffer's size bounds what waits in it: a receiver that never takes its packets does not
/// make the daemon hold up to [`INBOX_CAP`] segments of payload (4 GiB of 1 MiB segments).
/// A packet that does not fit is dropped and counted; the requester retransmits.
pub const SEALED_CAP: usize = 16 << 20;
/// Spare buffers an inbox keeps for senders to fill, so that a steady stream allocates
/// nothing.
const POOL_CAP: usize = 1024;

/// One packet in an inbox: what the receiver's engine needs (BTH … ICRC slot, and where it
/// came from). With payload references, `buf` holds only the bytes the references do not
/// stand for, one after the other ([`crate::memory::payload_ref::unreferenced`]), `len` is the
/// packet's, and `src` keeps the sender's guest memory mapped until the receiver has copied
/// the rest: a 64 KiB segment is a few dozen bytes here.
struct Parcel {
    meta: RecvMeta,
    buf: Vec<u8>,
    len: usize,
    refs: Vec<PayloadRef>,
    src: Option<Arc<GuestMemoryMmap>>,
    /// Its payload was copied in by [`Inbox::seal`] (and counts in `Inbox::sealed_bytes`).
    sealed: bool,
}

impl Parcel {
    /// Lays the packet out in `whole` (at least `len` bytes) at its own offsets: the bytes
    /// it carries where no reference stands; the referenced ranges keep what `whole` held.
    #[inline]
    fn unpack_into(&self, whole: &mut [u8]) {
        let mut at = 0;
        for g in crate::memory::payload_ref::unreferenced(self.len, &self.refs) {
            let n = g.len();
            whole[g].copy_from_slice(&self.buf[at..at + n]);
            at += n;
        }
    }
}

/// An empty parcel's buffers, kept for the next one.
type Spare = (Vec<u8>, Vec<PayloadRef>);

/// The receiving side of an inbox, run on the sender's thread ([`Inbox::signal`]).
pub trait Driver: Send + Sync {
    /// If the device's worker is not busy (its lock is free): takes what waits in its
    /// inbox into its engine and sends what that starts, on the calling thread; returns
    /// whether it did. The worker need not wake for it.
    fn try_drive(&self) -> bool;
}

/// The counters of one port's shortcut traffic (the `"same_host"` object of the counters).
#[derive(Debug, Default)]
pub struct SameHostStats {
    /// Packets this port put into another port's inbox.
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Of those, the packets that carried payload references, and the payload bytes they
    /// referred to instead of carrying ([`crate::memory::payload_ref`]).
    pub tx_ref_packets: AtomicU64,
    pub tx_ref_bytes: AtomicU64,
    /// Packets taken from this port's inbox into its engine.
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Packets dropped at this port's inbox: it was full, or no frontend was connected.
    pub rx_dropped: AtomicU64,
    /// Batches a sender's thread handed into this port's engine itself, its worker idle
    /// ([`Driver`]): wake-ups saved.
    pub rx_driven: AtomicU64,
    /// Packets whose referenced payload was copied into them at the end of the sender's batch,
    /// this port's worker busy ([`Inbox::seal`]): they cost a second copy.
    pub rx_sealed: AtomicU64,
}

/// A port's inbox: packets other ports sent it, and the eventfd that wakes its worker.
pub struct Inbox {
    queue: Mutex<VecDeque<Parcel>>,
    pool: Mutex<Vec<Spare>>,
    /// Where [`Self::drain`] lays a packet with references out at its own offsets (its
    /// referenced bytes left as they are: the receiver copies them from the sender). Its lock
    /// is also the copy's: [`Self::drain`] holds it from taking a parcel out of the queue to
    /// the end of the receiver's copy, [`Self::seal`] takes it first, so a sender that sealed
    /// knows no copy from its memory is under way either.
    unpacked: Mutex<Vec<u8>>,
    /// Parcels with references in the queue or being copied by [`Self::drain`] (changed under
    /// the queue's lock, or after the copy): [`Self::seal`] has nothing to do at 0.
    with_refs: AtomicUsize,
    /// What the sealed packets waiting hold (at most [`SEALED_CAP`]); changed under the
    /// queue's lock.
    sealed_bytes: AtomicUsize,
    /// Set when the eventfd was written and the worker has not drained since: a sender
    /// writes the eventfd only on the edge, not per packet.
    signalled: AtomicBool,
    /// The device that takes this inbox's packets, asked to take them on the sender's thread
    /// before its worker is woken (`--same-host`; none for an I/O thread's inbox).
    driver: Mutex<Option<Weak<dyn Driver>>>,
    event: EventFd,
    /// A receiver that stopped for a full inbox ([`Self::wait_for_room`]) waits on `room`,
    /// written by [`Self::drain`] once half the inbox is free.
    room_wanted: AtomicBool,
    room: EventFd,
    pub stats: SameHostStats,
}

impl Inbox {
    fn new() -> io::Result<Inbox> {
        Ok(Inbox {
            queue: Mutex::new(VecDeque::new()),
            pool: Mutex::new(Vec::new()),
            unpacked: Mutex::new(Vec::new()),
            with_refs: AtomicUsize::new(0),
            sealed_bytes: AtomicUsize::new(0),
            signalled: AtomicBool::new(false),
            driver: Mutex::new(None),
            event: EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
            room_wanted: AtomicBool::new(false),
            room: EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
            stats: SameHostStats::default(),
        })
    }

    /// The fd the worker waits on (readable while packets wait).
    pub fn fd(&self) -> RawFd {
        self.event.as_raw_fd()
    }

    /// An inbox of its own, not a hub's port (`--io-thread`'s received packets).
    pub fn standalone() -> io::Result<Arc<Inbox>> {
        Ok(Arc::new(Inbox::new()?))
    }

    /// Puts a copy of a received packet in; false if the inbox is full (dropped, counted).
    /// The worker is woken by [`Self::signal`].
    pub fn put_packet(&self, meta: RecvMeta, bytes: &[u8]) -> bool {
        self.put(meta, bytes, &[], None)
    }

    /// The device whose worker drains this inbox, asked first by [`Self::signal`].
    pub fn set_driver(&self, d: Weak<dyn Driver>) {
        *lock(&self.driver) = Some(d);
    }

    /// Hands the packets to the receiving device: on this thread when its worker is not
    /// busy (run to completion: no wake-up, [`Driver`]), else by waking the worker if it was
    /// not woken since it last drained. What is left waiting is sealed first
    /// ([`Self::seal`]): the caller (a sender at the end of its batch) may let its memory go
    /// once this returns.
    pub fn signal(&self) {
        let d = lock(&self.driver).as_ref().and_then(Weak::upgrade);
        if d.is_some_and(|d| d.try_drive()) && self.is_empty() {
            self.stats.rx_driven.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.seal();
        self.wake();
    }

    /// Wakes the worker, unless it was woken since it last drained.
    fn wake(&self) {
        if !self.signalled.swap(true, Ordering::AcqRel) {
            let _ = self.event.write(1);
        }
    }

    /// Copies the referenced bytes of every waiting packet into the packet and lets go of the
    /// sender's memory, after any copy [`Self::drain`] has under way: when this returns, no
    /// reference into any sender's memory is left in the inbox nor used. A packet taken later
    /// carries what the sender's memory held now, while the sender's batch (and so its rights
    /// over that memory) still runs, as a packet on a wire would.
    pub fn seal(&self) {
        if self.with_refs.load(Ordering::Acquire) == 0 {
            return;
        }
        let _copy = lock(&self.unpacked);
        let mut q = lock(&self.queue);
        let mut dropped = Vec::new();
        q.retain_mut(|p| {
            if p.refs.is_empty() {
                return true;
            }
            self.with_refs.fetch_sub(1, Ordering::Release);
            let held = self.sealed_bytes.load(Ordering::Relaxed);
            if held + p.len > SEALED_CAP {
                // As a full socket buffer drops: the requester retransmits.
                dropped.push((std::mem::take(&mut p.buf), std::mem::take(&mut p.refs)));
                return false;
            }
            let (mut whole, spare_refs) = lock(&self.pool).pop().unwrap_or_default();
            whole.clear();
            whole.resize(p.len, 0);
            p.unpack_into(&mut whole);
            if let Some(src) = p.src.take() {
                crate::memory::payload_ref::resolve(&src, &p.refs, &mut whole);
            }
            let old = std::mem::replace(&mut p.buf, whole);
            let refs = std::mem::replace(&mut p.refs, spare_refs);
            self.recycle((old, refs));
            p.refs.clear();
            p.sealed = true;
            self.sealed_bytes.store(held + p.len, Ordering::Relaxed);
            self.stats.rx_sealed.fetch_add(1, Ordering::Relaxed);
            true
        });
        drop(q);
        self.stats
            .rx_dropped
            .fetch_add(dropped.len() as u64, Ordering::Relaxed);
        for d in dropped {
            self.recycle(d);
        }
    }

    /// Puts a copy of `bytes` (BTH … ICRC slot) in, but for the ranges `refs` stand for
    /// (in `src`); false if the inbox is full (dropped). The worker is not woken here: the
    /// sender calls [`Link::flush`] at the end of its batch, one wake-up per batch.
    fn put(
        &self,
        meta: RecvMeta,
        bytes: &[u8],
        refs: &[PayloadRef],
        src: Option<&Arc<GuestMemoryMmap>>,
    ) -> bool {
        let (mut buf, mut r) = lock(&self.pool).pop().unwrap_or_default();
        r.clear();
        r.extend_from_slice(refs);
        buf.clear();
        // The referenced bytes are not copied: the receiver takes them from `src`.
        for g in crate::memory::payload_ref::unreferenced(bytes.len(), refs) {
            buf.extend_from_slice(&bytes[g]);
        }
        {
            let mut q = lock(&self.queue);
            if q.len() >= INBOX_CAP {
                drop(q);
                self.stats.rx_dropped.fetch_add(1, Ordering::Relaxed);
                self.recycle((buf, r));
                return false;
            }
            if !refs.is_empty() {
                self.with_refs.fetch_add(1, Ordering::Relaxed);
            }
            q.push_back(Parcel {
                meta,
                buf,
                len: bytes.len(),
                refs: r,
                src: src.filter(|_| !refs.is_empty()).cloned(),
                sealed: false,
            });
        }
        true
    }

    fn recycle(&self, spare: Spare) {
        let mut p = lock(&self.pool);
        if p.len() < POOL_CAP {
            p.push(spare);
        }
    }

    /// Hands up to `max` waiting packets to `f` in the order they came, each with the
    /// sender's memory and the references into it if it has any (only while the sender's
    /// batch runs: [`Self::seal`]); returns how many. What is left (more than `max`) keeps the
    /// eventfd readable.
    pub fn drain(
        &self,
        max: usize,
        mut f: impl FnMut(&RecvMeta, &[u8], Option<(&GuestMemoryMmap, &[PayloadRef])>),
    ) -> usize {
        let _ = self.event.read();
        self.signalled.store(false, Ordering::Release);
        let mut n = 0;
        while n < max {
            // The copy's lock before the parcel leaves the queue: a sender sealing waits for
            // this copy from its memory to end.
            let mut whole = lock(&self.unpacked);
            let Some(p) = lock(&self.queue).pop_front().inspect(|p| {
                if p.sealed {
                    self.sealed_bytes.fetch_sub(p.len, Ordering::Relaxed);
                }
            }) else {
                break;
            };
            self.stats.rx_packets.fetch_add(1, Ordering::Relaxed);
            self.stats
                .rx_bytes
                .fetch_add(p.len as u64, Ordering::Relaxed);
            if p.refs.is_empty() {
                f(&p.meta, &p.buf, None);
            } else {
                if whole.len() < p.len {
                    whole.resize(p.len, 0);
                }
                p.unpack_into(&mut whole);
                // Every byte a reference stands for is written from the sender's memory
                // (RefRam), never from `whole`, whose bytes there are an earlier packet's.
                f(
                    &p.meta,
                    &whole[..p.len],
                    p.src.as_deref().map(|m| (m, &p.refs[..])),
                );
                self.with_refs.fetch_sub(1, Ordering::Release);
            }
            drop(whole);
            // The sender's memory is let go here, not when the buffers are reused.
            drop(p.src);
            self.recycle((p.buf, p.refs));
            n += 1;
        }
        let left = lock(&self.queue).len();
        if n == max && left > 0 {
            self.wake();
        }
        if left <= INBOX_CAP / 2 && self.room_wanted.swap(false, Ordering::AcqRel) {
            let _ = self.room.write(1);
        }
        n
    }

    /// Whether `n` more packets fit. If not, the caller is to stop taking packets in until
    /// [`Self::room_fd`] is readable (then [`Self::room_taken`]): a receiver that has a
    /// socket leaves its packets there (its buffer drops, as it would with no inbox between)
    /// rather than drop them here.
    pub fn wait_for_room(&self, n: usize) -> bool {
        if lock(&self.queue).len() + n <= INBOX_CAP {
            return false;
        }
        self.room_wanted.store(true, Ordering::SeqCst);
        // The worker may have drained in between: look again after saying so.
        if lock(&self.queue).len() + n <= INBOX_CAP {
            self.room_wanted.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Readable when a receiver that waited for room may take packets in again.
    pub fn room_fd(&self) -> RawFd {
        self.room.as_raw_fd()
    }

    /// Consumes the room notification; true if the receiver still waits (none came).
    pub fn room_taken(&self) -> bool {
        let _ = self.room.read();
        self.room_wanted.load(Ordering::SeqCst)
    }

    /// Drops up to `max` waiting packets (no frontend to take them); returns how many.
    pub fn discard(&self, max: usize) -> usize {
        let n = self.drain(max, |_, _, _| {});
        self.stats.rx_packets.fetch_sub(n as u64, Ordering::Relaxed);
        self.stats.rx_dropped.fetch_add(n as u64, Ordering::Relaxed);
        n
    }

    /// Packets waiting.
    pub fn len(&self) -> usize {
        lock(&self.queue).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The counters as the members of a JSON object.
    pub fn render(&self) -> String {
        let s = &self.stats;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "\"tx_packets\":{},\"tx_bytes\":{},\"tx_ref_packets\":{},\"tx_ref_bytes\":{},\"rx_packets\":{},\"rx_bytes\":{},\"rx_dropped\":{},\"rx_driven\":{},\"rx_sealed\":{},\"waiting\":{}",
            r(&s.tx_packets),
            r(&s.tx_bytes),
            r(&s.tx_ref_packets),
            r(&s.tx_ref_bytes),
            r(&s.rx_packets),
            r(&s.rx_bytes),
            r(&s.rx_dropped),
            r(&s.rx_driven),
            r(&s.rx_sealed),
            self.len()
        )
    }
}

/// The ports of one daemon process, by IP address.
#[derive(Default)]
pub struct Hub {
    ports: RwLock<HashMap<IpAddr, Arc<Inbox>>>,
}

impl Hub {
    pub fn new() -> Arc<Hub> {
        Arc::new(Hub::default())
    }

    /// Adds the port that answers to `ip`; its inbox.
    pub fn register(&self, ip: IpAddr) -> io::Result<Arc<Inbox>> {
        let mut ports = self.ports.write().unwrap_or_else(|e| e.into_inner());
        if ports.contains_key(&ip) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{ip} already has a same-host port"),
            ));
        }
        let inbox = Arc::new(Inbox::new()?);
        ports.insert(ip, inbox.clone());
        Ok(inbox)
    }

    /// The inbox of the port at `ip`, if one is in this process.
    pub fn port(&self, ip: &IpAddr) -> Option<Arc<Inbox>> {
        self.ports
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(ip)
            .cloned()
    }
}

/// A port's view of the hub: where it sends (other ports of the process) and what it counts.
pub struct Link {
    hub: Arc<Hub>,
    own: Arc<Inbox>,
    own_ip: IpAddr,
    /// The last destination looked up, so that a stream to one peer takes the hub's lock
    /// once.
    last: Option<(IpAddr, Arc<Inbox>)>,
    /// The inbox that got packets since the last [`Self::flush`] (another one is woken at
    /// once when the destination changes).
    unsignalled: Option<Arc<Inbox>>,
}

impl Link {
    pub fn new(hub: Arc<Hub>, own_ip: IpAddr) -> io::Result<Link> {
        let own = hub.register(own_ip)?;
        Ok(Link {
            hub,
            own,
            own_ip,
            last: None,
            unsignalled: None,
        })
    }

    /// This port's inbox.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.own
    }

    /// The inbox of the port at `ip`, if it is another port of this process.
    fn peer(&mut self, ip: IpAddr) -> Option<Arc<Inbox>> {
        if ip == self.own_ip {
            return None;
        }
        match &self.last {
            Some((l, i)) if *l == ip => Some(i.clone()),
            _ => {
                let i = self.hub.port(&ip)?;
                self.last = Some((ip, i.clone()));
                Some(i)
            }
        }
    }

    /// Wakes the port that got packets since the last flush: the end of the sender's batch.
    pub fn flush(&mut self) {
        if let Some(i) = self.unsignalled.take() {
            i.signal();
        }
    }

    /// Whether a packet to `ip` goes to another port of this process.
    pub fn reaches(&mut self, ip: IpAddr) -> bool {
        self.peer(ip).is_some()
    }

    /// [`Self::reaches`] without remembering the answer (for a shared borrow).
    pub fn reaches_now(&self, ip: IpAddr) -> bool {
        ip != self.own_ip
            && match &self.last {
                Some((l, _)) if *l == ip => true,
                _ => self.hub.port(&ip).is_some(),
            }
    }

    /// Delivers `roce` (BTH … ICRC slot) to the port at `t.dst` if it is in this process
    /// (and not this port: a packet to oneself goes through the socket, as before); returns
    /// false if it is not, and the caller sends it on the wire.
    pub fn deliver(&mut self, t: &Transmit, roce: &[u8]) -> bool {
        self.deliver_refs(t, roce, &[], None)
    }

    /// [`Self::deliver`] for a packet whose bytes `refs` are in `src` (the sender's guest
    /// memory), not in `roce`.
    pub fn deliver_refs(
        &mut self,
        t: &Transmit,
        roce: &[u8],
        refs: &[PayloadRef],
        src: Option<&Arc<GuestMemoryMmap>>,
    ) -> bool {
        let Some(inbox) = self.peer(t.dst.to_ip()) else {
            return false;
        };
        let meta = RecvMeta::from(t);
        if inbox.put(meta, roce, refs, src) {
            match &self.unsignalled {
                Some(u) if Arc::ptr_eq(u, &inbox) => {}
                _ => {
                    self.flush();
                    self.unsignalled = Some(inbox);
                }
            }
            let s = &self.own.stats;
            s.tx_packets.fetch_add(1, Ordering::Relaxed);
            s.tx_bytes.fetch_add(roce.len() as u64, Ordering::Relaxed);
            if !refs.is_empty() {
                let n: u64 = refs.iter().map(|r| r.len as u64).sum();
                s.tx_ref_packets.fetch_add(1, Ordering::Relaxed);
                s.tx_ref_bytes.fetch_add(n, Ordering::Relaxed);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rxe_core::{Gid, Qpn};

    /// Whether `fd` is readable now.
    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn tx(src: IpAddr, dst: IpAddr, len: usize) -> Transmit {
        Transmit {
            len,
            src: Gid::from_ip(src),
            dst: Gid::from_ip(dst),
            sport: 49152,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            dmac: [0; 6],
            qpn: Qpn(0x11),
        }
    }

    /// Packets to another port of the hub arrive there in order with their metadata; to an
    /// address of no port, or to the port itself, they are left to the wire; a full inbox
    /// drops and counts; the eventfd is readable exactly while packets wait.
    #[test]
    fn packets_go_to_the_port_of_their_address_in_order() {
        let hub = Hub::new();
        let a_ip: IpAddr = "127.0.0.1".parse().unwrap();
        let b_ip: IpAddr = "127.0.0.2".parse().unwrap();
        let mut a = Link::new(hub.clone(), a_ip).unwrap();
        let b = Link::new(hub.clone(), b_ip).unwrap();
        assert!(
            Link::new(hub.clone(), b_ip).is_err(),
            "one port per address"
        );
        assert!(!a.deliver(&tx(a_ip, a_ip, 4), b"self"));
        assert!(!a.deliver(&tx(a_ip, "127.0.0.3".parse().unwrap(), 4), b"away"));
        assert!(!readable(b.inbox().fd()));
        for i in 0..5u8 {
            assert!(a.deliver(&tx(a_ip, b_ip, 3), &[i; 3]));
        }
        assert!(
            !readable(b.inbox().fd()),
            "woken at the end of the batch, not before"
        );
        a.flush();
        assert!(readable(b.inbox().fd()));
        let mut got = Vec::new();
        assert_eq!(
            b.inbox().drain(3, |m, p, _| {
                assert_eq!(m.src, Gid::from_ip(a_ip));
                assert_eq!(m.dst, Gid::from_ip(b_ip));
                assert_eq!(m.sport, 49152);
                got.push(p.to_vec());
            }),
            3
        );
        assert!(readable(b.inbox().fd()), "two still wait");
        assert_eq!(b.inbox().drain(100, |_, p, _| got.push(p.to_vec())), 2);
        assert_eq!(got, (0..5u8).map(|i| vec![i; 3]).collect::<Vec<_>>());
        assert!(!readable(b.inbox().fd()));
        for _ in 0..INBOX_CAP + 3 {
            a.deliver(&tx(a_ip, b_ip, 1), &[7]);
        }
        a.flush();
        assert_eq!(b.inbox().len(), INBOX_CAP);
        assert_eq!(b.inbox().stats.rx_dropped.load(Ordering::Relaxed), 3);
        assert_eq!(b.inbox().discard(INBOX_CAP), INBOX_CAP);
        assert_eq!(
            b.inbox().stats.rx_dropped.load(Ordering::Relaxed),
            3 + INBOX_CAP as u64
        );
        assert_eq!(b.inbox().stats.rx_packets.load(Ordering::Relaxed), 5);
        assert_eq!(
            a.inbox().stats.tx_packets.load(Ordering::Relaxed),
            5 + INBOX_CAP as u64
        );
        assert!(!readable(b.inbox().fd()));
    }

    /// A packet with references waits in the inbox of a receiver that could not take it
    /// (no driver here: a busy worker) only as long as the sender's batch: the end of the
    /// batch (flush) copies the referenced bytes into it and lets go of the sender's memory,
    /// so what the sender writes afterwards (its memory revoked and reused) is not what the
    /// receiver gets. Before the flush the references are still the sender's to use.
    #[test]
    fn waiting_references_are_sealed_at_the_end_of_the_senders_batch() {
        use vm_memory::{Bytes, GuestAddress};
        let hub = Hub::new();
        let a_ip: IpAddr = "127.0.0.1".parse().unwrap();
        let b_ip: IpAddr = "127.0.0.2".parse().unwrap();
        let mut a = Link::new(hub.clone(), a_ip).unwrap();
        let b = Link::new(hub.clone(), b_ip).unwrap();
        let mem =
            Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0x1000), 0x2000)]).unwrap());
        mem.write_slice(&[b'O'; 0x2000], GuestAddress(0x1000))
            .unwrap();
        // 16 header bytes, then 1000 bytes the reference stands for, then 4 trailer bytes.
        let mut pkt = vec![0u8; 1020];
        pkt[..16].fill(b'h');
        pkt[1016..].fill(b't');
        let refs = [PayloadRef {
            gpa: 0x1800,
            off: 16,
            len: 1000,
        }];
        for _ in 0..3 {
            assert!(a.deliver_refs(&tx(a_ip, b_ip, pkt.len()), &pkt, &refs, Some(&mem)));
        }
        // Mid-batch, a receiver takes one with its references.
        assert_eq!(
            b.inbox().drain(1, |_, p, src| {
                let (_, r) = src.expect("references while the sender's batch runs");
                assert_eq!(r, &refs[..]);
                assert_eq!((&p[..16], &p[1016..]), (&[b'h'; 16][..], &b"tttt"[..]));
            }),
            1
        );
        assert_eq!(Arc::strong_count(&mem), 3, "two parcels hold the memory");
        a.flush();
        assert_eq!(Arc::strong_count(&mem), 1, "sealed: nothing holds it");
        assert_eq!(b.inbox().stats.rx_sealed.load(Ordering::Relaxed), 2);
        // The sender's memory revoked and reused.
        mem.write_slice(&[b'S'; 0x2000], GuestAddress(0x1000))
            .unwrap();
        let mut got = Vec::new();
        assert_eq!(
            b.inbox().drain(10, |_, p, src| {
                assert!(src.is_none(), "sealed parcels carry their payload");
                got.push(p.to_vec());
            }),
            2
        );
        let mut want = pkt.clone();
        want[16..1016].fill(b'O');
        assert_eq!(got, vec![want.clone(), want]);
    }

    /// Sealed packets hold their payload, so they are bounded in bytes too ([`SEALED_CAP`]):
    /// 20 segments of 1 MiB waiting for a busy receiver, 16 are sealed and 4 dropped (counted,
    /// the requester retransmits); once the receiver takes them, there is room again.
    #[test]
    fn sealed_payload_is_bounded_in_bytes() {
        use vm_memory::GuestAddress;
        let hub = Hub::new();
        let a_ip: IpAddr = "127.0.0.1".parse().unwrap();
        let b_ip: IpAddr = "127.0.0.2".parse().unwrap();
        let mut a = Link::new(hub.clone(), a_ip).unwrap();
        let b = Link::new(hub.clone(), b_ip).unwrap();
        let mem = Arc::new(GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap());
        let seg = 1 << 20;
        let pkt = vec![0u8; seg];
        let refs = [PayloadRef {
            gpa: 0,
            off: 16,
            len: (seg - 16) as u32,
        }];
        let mut send = |n: usize| {
            for _ in 0..n {
                a.deliver_refs(&tx(a_ip, b_ip, seg), &pkt, &refs, Some(&mem));
            }
            a.flush();
        };
        send(20);
        let st = &b.inbox().stats;
        assert_eq!(b.inbox().len(), 16, "16 MiB of sealed payload");
        assert_eq!(st.rx_dropped.load(Ordering::Relaxed), 4);
        assert_eq!(st.rx_sealed.load(Ordering::Relaxed), 16);
        assert_eq!(Arc::strong_count(&mem), 1);
        assert_eq!(b.inbox().drain(100, |_, p, _| assert_eq!(p.len(), seg)), 16);
        send(3);
        assert_eq!(b.inbox().len(), 3, "room again");
        assert_eq!(st.rx_dropped.load(Ordering::Relaxed), 4);
    }

    /// A receiver that would overfill the inbox is told to wait, and its room eventfd turns
    /// readable once the worker has drained half of the inbox, not before.
    #[test]
    fn a_receiver_waits_for_room_and_is_woken_at_half() {
        let inbox = Inbox::standalone().unwrap();
        let meta = RecvMeta::default();
        for _ in 0..INBOX_CAP - 10 {
            assert!(inbox.put_packet(meta, &[1]));
        }
        assert!(!inbox.wait_for_room(10), "exactly full fits");
        assert!(inbox.wait_for_room(32));
        assert!(!readable(inbox.room_fd()));
        inbox.drain(INBOX_CAP / 2 - 20, |_, _, _| {});
        assert!(!readable(inbox.room_fd()), "more than half still waits");
        inbox.drain(20, |_, _, _| {});
        assert!(readable(inbox.room_fd()), "half free");
        assert!(!inbox.room_taken(), "the receiver goes on");
        assert!(!readable(inbox.room_fd()));
        assert_eq!(inbox.stats.rx_dropped.load(Ordering::Relaxed), 0);
    }
}
