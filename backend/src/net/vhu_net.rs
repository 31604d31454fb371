//! The guest's virtio-net device (vhost-user-net, `--net-socket`): with it the daemon is a
//! paravirtual RoCE NIC on one host interface. Frames the guest transmits go out of the
//! interface as they are if its policy lets them ([`crate::net::net_policy`]: its MAC and
//! addresses, no tags, offloads as negotiated; refusals counted); frames arriving on it for
//! the guest's MAC or a group go to the guest, except RoCEv2 to the guest's addresses, which
//! the raw transport takes for the engine ([`crate::net::net_port`]).
//! The guest's own stack answers ARP and ND, so its GIDs are simply its addresses.
//!
//! Queues: 0 receive, 1 transmit (one pair). Offered: VERSION_1, mergeable receive buffers,
//! checksum offload and TSO both ways (the packet socket carries the virtio-net header), event
//! index, indirect descriptors. The MAC and link status are the VMM's (QEMU `mac=`).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use vhost::vhost_user::message::VhostUserProtocolFeatures;
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::virtio_config::{VIRTIO_F_NOTIFY_ON_EMPTY, VIRTIO_F_VERSION_1};
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_MTU, VIRTIO_NET_HDR_F_DATA_VALID,
    VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_ECN, VIRTIO_NET_HDR_GSO_NONE,
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{EventConsumer, EventNotifier};
use vmm_sys_util::eventfd::EventFd;

use crate::memory::guest_mem::GuestMemoryMmap;
use crate::net::net_policy::{rx_wanted, Refusal};
use crate::net::net_port::{NetPort, MAX_FRAME, VNET_HDR};
use crate::sync::lock;

type GM = GuestMemoryAtomic<GuestMemoryMmap>;

pub const NET_QUEUES: usize = 2;
const RXQ: usize = 0;
const TXQ: usize = 1;
/// The packet socket has frames (edge-triggered: read until it has none).
pub const PORT_EVENT: u16 = NET_QUEUES as u16 + 1;
/// A visit stopped at its budget: go on.
pub const MORE_EVENT: u16 = NET_QUEUES as u16 + 2;
pub const NET_QUEUE_SIZE: usize = 1024;
/// Frames one visit of a queue moves before other events get a turn.
const BUDGET: usize = 256;
/// Length of the guest's header with VERSION_1 or mergeable buffers (`num_buffers` last).
const HDR_MRG: usize = 12;

pub use crate::net::stats::NetStats;

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// The features the device offers (the VMM adds MAC and STATUS of its own; MTU is the
/// VMM's too — QEMU's `host_mtu` — and offered here so that it passes: the MTU itself comes
/// with NET_SET_MTU, checked against the host interface's by [`crate::net::vhost_proxy`]).
/// VHOST_USER_F_PROTOCOL_FEATURES too: QEMU's vhost-user-net does not start without it (and
/// the connection goes through [`crate::net::vhost_proxy`] for the ring enable QEMU sends early).
pub fn net_features() -> u64 {
    (1 << VIRTIO_F_VERSION_1)
        | (1 << VIRTIO_F_NOTIFY_ON_EMPTY)
        | (1 << VIRTIO_RING_F_INDIRECT_DESC)
        | (1 << VIRTIO_RING_F_EVENT_IDX)
        | (1 << VIRTIO_NET_F_MRG_RXBUF)
        | (1 << VIRTIO_NET_F_MTU)
        | (1 << VIRTIO_NET_F_CSUM)
        | (1 << VIRTIO_NET_F_GUEST_CSUM)
        | (1 << VIRTIO_NET_F_HOST_TSO4)
        | (1 << VIRTIO_NET_F_HOST_TSO6)
        | (1 << VIRTIO_NET_F_HOST_ECN)
        | (1 << VIRTIO_NET_F_GUEST_TSO4)
        | (1 << VIRTIO_NET_F_GUEST_TSO6)
        | (1 << VIRTIO_NET_F_GUEST_ECN)
        | vhost::vhost_user::message::VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
}

/// What a received frame's header must become for a guest that acked `acked`: `None` drops
/// the frame (a segmentation offload the guest cannot take). A checksum the guest cannot
/// finish is finished here (`frame` is the Ethernet frame behind the header).
pub fn rx_header(hdr: &mut [u8; VNET_HDR], frame: &mut [u8], acked: u64) -> Option<bool> {
    let has = |f: u32| acked & (1 << f) != 0;
    let mut csum_done = false;
    let gso = hdr[1] & !(VIRTIO_NET_HDR_GSO_ECN as u8);
    if gso != VIRTIO_NET_HDR_GSO_NONE as u8 {
        let ok = match gso as u32 {
            VIRTIO_NET_HDR_GSO_TCPV4 => has(VIRTIO_NET_F_GUEST_TSO4),
            VIRTIO_NET_HDR_GSO_TCPV6 => has(VIRTIO_NET_F_GUEST_TSO6),
            _ => false,
        };
        let ecn_ok = hdr[1] & VIRTIO_NET_HDR_GSO_ECN as u8 == 0 || has(VIRTIO_NET_F_GUEST_ECN);
        if !ok || !ecn_ok || !has(VIRTIO_NET_F_GUEST_CSUM) {
            return None;
        }
    }
    if !has(VIRTIO_NET_F_GUEST_CSUM) {
        if hdr[0] & VIRTIO_NET_HDR_F_NEEDS_CSUM as u8 != 0 {
            let start = u16::from_le_bytes([hdr[6], hdr[7]]) as usize;
            let off = u16::from_le_bytes([hdr[8], hdr[9]]) as usize;
            finish_checksum(frame, start, off)?;
            csum_done = true;
        }
        hdr[0] &= !((VIRTIO_NET_HDR_F_NEEDS_CSUM | VIRTIO_NET_HDR_F_DATA_VALID) as u8);
    }
    Some(csum_done)
}

/// Finishes a partial checksum (the field at `start + off` holds the pseudo-header sum): the
/// one's complement of the sum from `start` to the end, as the kernel's skb_checksum_help.
fn finish_checksum(frame: &mut [u8], start: usize, off: usize) -> Option<()> {
    let at = start.checked_add(off)?;
    if at + 2 > frame.len() || start > frame.len() {
        return None;
    }
    let sum = crate::transport::raw::sum16(0, &frame[start..]);
    // All ones for a zero: the same in one's complement, and UDP may not carry 0.
    let c = match !(sum as u16) {
        0 => 0xffff,
        c => c,
    };
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Some(())
}

/// Scratch space of the worker thread.
struct NetIo {
    rx: Vec<u8>,
    /// Length of a received frame in `rx` still to be delivered (the guest had no room).
    rx_held: Option<usize>,
    tx: Vec<u8>,
}

/// The vhost-user-net backend of one frontend.
pub struct VhuNet {
    port: Arc<NetPort>,
    mem: Mutex<Option<GM>>,
    acked: AtomicU64,
    io: Mutex<NetIo>,
    more: EventFd,
    pub stats: Arc<NetStats>,
    exit_fds: Mutex<Vec<RawFd>>,
    event_idx: AtomicBool,
    /// The refusals logged on this connection (a bit per [`Refusal`]): each cause once.
    logged: AtomicU32,
}

/// How placing a frame in the receive queue went.
enum Place {
    /// Placed in this many buffers.
    Done(usize),
    /// Not enough buffers yet.
    NoRoom,
    /// The frame cannot be placed: bigger than the buffers the queue can hold.
    Dropped,
    /// The guest's buffers are bad (outside its memory, or device-readable): this many were
    /// returned empty.
    Fault(usize),
}

impl VhuNet {
    pub fn new(port: Arc<NetPort>, stats: Arc<NetStats>) -> io::Result<Self> {
        Ok(VhuNet {
            port,
            mem: Mutex::new(None),
            acked: AtomicU64::new(0),
            io: Mutex::new(NetIo {
                rx: vec![0; VNET_HDR + MAX_FRAME],
                rx_held: None,
                tx: vec![0; VNET_HDR + MAX_FRAME],
            }),
            more: EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
            stats,
            exit_fds: Mutex::new(Vec::new()),
            event_idx: AtomicBool::new(false),
            logged: AtomicU32::new(0),
        })
    }

    /// Counts a refused transmit; the first of each cause on a connection is logged.
    fn refused(&self, r: Refusal, frame: &[u8]) {
        bump(&self.stats.tx_refused[r.index()]);
        let bit = 1 << r.index();
        if self.logged.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
            let head = &frame[..frame.len().min(34)];
            log::warn!(
                "virtio-net: the guest's frame refused ({r:?}; counted in net.{}, logged once \
                 per connection): {head:02x?}",
                r.counter()
            );
        }
    }

    pub fn port_fd(&self) -> RawFd {
        self.port.fd()
    }

    pub fn more_fd(&self) -> RawFd {
        self.more.as_raw_fd()
    }

    /// Closes the exit eventfds the daemon's worker threads were given (their consumers
    /// live in the epoll handlers, which the daemon drops).
    pub fn close_exit_fds(&self) {
        crate::sys::close_exit_fds(&self.exit_fds);
    }

    fn hdr_len(&self) -> usize {
        let a = self.acked.load(Ordering::Relaxed);
        if a & ((1 << VIRTIO_F_VERSION_1) | (1 << VIRTIO_NET_F_MRG_RXBUF)) != 0 {
            HDR_MRG
        } else {
            VNET_HDR
        }
    }

    /// Moves what the guest made available on the transmit queue to the interface.
    fn transmit(&self, vring: &VringRwLock, mem: &GuestMemoryMmap) -> io::Result<()> {
        let hdr_len = self.hdr_len();
        let acked = self.acked.load(Ordering::Relaxed);
        let learned = self.port.learned();
        let mut io = lock(&self.io);
        let tx = &mut io.tx;
        let mut used = 0usize;
        let mut st = vring.get_mut();
        let q = st.get_queue_mut();
        // One more look after re-arming the guest's kicks (it may have added meanwhile), but
        // only one: a ring whose index the guest made nonsense reads as "more" for ever.
        let mut rechecked = false;
        loop {
            let Some(chain) = q.pop_descriptor_chain(mem) else {
                if !rechecked && q.enable_notification(mem).map_err(io::Error::other)? {
                    rechecked = true;
                    continue;
                }
                break;
            };
            let head = chain.head_index();
            let len = match chain.reader(mem) {
                Ok(mut r) => {
                    let n = r.available_bytes();
                    if n < hdr_len + 14 || n - hdr_len > MAX_FRAME {
                        bump(&self.stats.tx_bad);
                        None
                    } else {
                        let mut skip = [0u8; HDR_MRG - VNET_HDR];
                        let ok = io::Read::read_exact(&mut r, &mut tx[..VNET_HDR]).is_ok()
                            && io::Read::read_exact(&mut r, &mut skip[..hdr_len - VNET_HDR])
                                .is_ok()
                            && io::Read::read_exact(
                                &mut r,
                                &mut tx[VNET_HDR..VNET_HDR + n - hdr_len],
                            )
                            .is_ok();
                        if ok {
                            Some(n - hdr_len)
                        } else {
                            bump(&self.stats.faults);
                            None
                        }
                    }
                }
                Err(_) => {
                    bump(&self.stats.faults);
                    None
                }
            };
            let len = len.and_then(|len| {
                let (h, f) = tx.split_at_mut(VNET_HDR);
                let h: &mut [u8; VNET_HDR] = h.try_into().ok()?;
                match self.port.policy().check_tx(h, &f[..len], acked, &learned) {
                    Ok(()) => Some(len),
                    Err(r) => {
                        self.refused(r, &f[..len]);
                        None
                    }
                }
            });
            if let Some(len) = len {
                match self.port.send(&tx[..VNET_HDR + len]) {
                    Ok(()) => {
                        bump(&self.stats.tx_frames);
                        add(&self.stats.tx_bytes, len as u64);
                    }
                    Err(e) => {
                        bump(&self.stats.tx_dropped);
                        log::debug!("virtio-net transmit of {len} bytes: {e}");
                    }
                }
            }
            q.add_used(mem, head, 0).map_err(io::Error::other)?;
            used += 1;
            if used >= BUDGET {
                let _ = self.more.write(1);
                break;
            }
        }
        if used > 0 && q.needs_notification(mem).map_err(io::Error::other)? {
            drop(st);
            vring.signal_used_queue()?;
        }
        Ok(())
    }

    /// Moves frames from the interface to the guest's receive buffers until the socket has
    /// none, the guest has no room, or the budget is spent.
    fn receive(&self, vring: &VringRwLock, mem: &GuestMemoryMmap) -> io::Result<()> {
        let acked = self.acked.load(Ordering::Relaxed);
        let hdr_len = self.hdr_len();
        let mergeable = acked & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let mut io = lock(&self.io);
        let mut placed = 0usize;
        let mut st = vring.get_mut();
        let q = st.get_queue_mut();
        let mut frames = 0;
        let mut rechecked = false;
        while frames < BUDGET {
            // Every frame counts, dropped ones too: a flood of bad frames yields as well.
            frames += 1;
            let n = match io.rx_held.take() {
                Some(n) => n,
                None => match self.port.recv(&mut io.rx) {
                    Ok(Some(n)) => {
                        if n > io.rx.len() || n < VNET_HDR + 14 {
                            bump(&self.stats.rx_dropped);
                            continue;
                        }
                        if !rx_wanted(self.port.policy(), &io.rx[VNET_HDR..n]) {
                            bump(&self.stats.rx_not_for_guest);
                            continue;
                        }
                        let (h, f) = io.rx.split_at_mut(VNET_HDR);
                        let h: &mut [u8; VNET_HDR] = h.try_into().expect("header");
                        match rx_header(h, &mut f[..n - VNET_HDR], acked) {
                            Some(done) => {
                                if done {
                                    bump(&self.stats.rx_csum_done);
                                }
                            }
                            None => {
                                bump(&self.stats.rx_dropped);
                                continue;
                            }
                        }
                        n
                    }
                    Ok(None) => break,
                    Err(e) => {
                        bump(&self.stats.rx_errors);
                        log::debug!("virtio-net receive: {e}");
                        break;
                    }
                },
            };
            match place(q, mem, &io.rx[..n], hdr_len, mergeable) {
                Place::Done(k) => {
                    placed += k;
                    bump(&self.stats.rx_frames);
                    add(&self.stats.rx_bytes, (n - VNET_HDR) as u64);
                }
                Place::Dropped => bump(&self.stats.rx_dropped),
                Place::Fault(k) => {
                    placed += k;
                    bump(&self.stats.faults);
                }
                Place::NoRoom => {
                    // Keep the frame; the guest's next kick (re-armed here) brings it in. One
                    // more look if it added buffers meanwhile (only one: see `transmit`).
                    io.rx_held = Some(n);
                    if !rechecked && q.enable_notification(mem).map_err(io::Error::other)? {
                        rechecked = true;
                        continue;
                    }
                    bump(&self.stats.rx_no_buffer);
                    break;
                }
            }
        }
        if frames >= BUDGET && io.rx_held.is_none() {
            let _ = self.more.write(1);
        }
        if placed > 0 && q.needs_notification(mem).map_err(io::Error::other)? {
            drop(st);
            vring.signal_used_queue()?;
        }
        Ok(())
    }
}

/// Most buffers one frame may take (a 64 KiB frame in 1 KiB buffers).
const MAX_CHAINS: usize = 64;

/// Places `buf` (a [`VNET_HDR`]-byte header, then the frame) in the receive queue `q`: the
/// guest's `hdr_len`-byte header, then the frame, across as many buffers as it needs when
/// they are mergeable (`num_buffers` says how many), else in one. Buffers taken are given
/// back untouched when there are not enough yet.
fn place(
    q: &mut virtio_queue::Queue,
    mem: &GuestMemoryMmap,
    buf: &[u8],
    hdr_len: usize,
    mergeable: bool,
) -> Place {
    let frame = &buf[VNET_HDR..];
    let total = hdr_len + frame.len();
    let mut chains: [Option<virtio_queue::DescriptorChain<&GuestMemoryMmap>>; MAX_CHAINS] =
        std::array::from_fn(|_| None);
    let max = if mergeable {
        MAX_CHAINS.min(q.size() as usize)
    } else {
        1
    };
    let mut heads = [0u16; MAX_CHAINS];
    let mut n = 0;
    let mut cap = 0usize;
    let mut bad = false;
    while cap < total {
        if n == max {
            for _ in 0..n {
                q.go_to_previous_position();
            }
            return Place::Dropped;
        }
        let Some(c) = q.pop_descriptor_chain(mem) else {
            for _ in 0..n {
                q.go_to_previous_position();
            }
            return Place::NoRoom;
        };
        for d in c.clone() {
            if !d.is_write_only() {
                bad = true;
            }
            cap = cap.saturating_add(d.len() as usize);
        }
        heads[n] = c.head_index();
        chains[n] = Some(c);
        n += 1;
        if bad {
            break;
        }
    }
    let mut hdr = [0u8; HDR_MRG];
    hdr[..VNET_HDR].copy_from_slice(&buf[..VNET_HDR]);
    hdr[VNET_HDR..].copy_from_slice(&(n as u16).to_le_bytes());
    let parts: [&[u8]; 2] = [&hdr[..hdr_len], frame];
    let (mut part, mut off) = (0usize, 0usize);
    let mut lens = [0u32; MAX_CHAINS];
    'chains: for (i, slot) in chains.iter_mut().take(n).enumerate() {
        let Some(c) = slot.take() else { break };
        if bad {
            break;
        }
        for d in c {
            let (mut addr, mut room) = (d.addr().0, d.len() as usize);
            while room > 0 && part < parts.len() {
                let s = parts[part];
                let k = room.min(s.len() - off);
                if mem
                    .write_slice(&s[off..off + k], GuestAddress(addr))
                    .is_err()
                {
                    bad = true;
                    break 'chains;
                }
                addr += k as u64;
                room -= k;
                off += k;
                lens[i] += k as u32;
                if off == s.len() {
                    part += 1;
                    off = 0;
                }
            }
            if part == parts.len() {
                break;
            }
        }
    }
    // Used entries in the order taken; nothing but the frame is reported written.
    for (i, head) in heads.iter().take(n).enumerate() {
        let len = if bad { 0 } else { lens[i] };
        if q.add_used(mem, *head, len).is_err() {
            bad = true;
        }
    }
    if bad {
        Place::Fault(n)
    } else {
        Place::Done(n)
    }
}

impl VhuNet {
    /// Whether queue `i` is set up and enabled: nothing is read or written on another.
    fn live(vrings: &[VringRwLock], i: usize) -> bool {
        vrings.get(i).is_some_and(|v| {
            let s = v.get_ref();
            s.get_queue().ready() && s.is_enabled()
        })
    }

    /// Frames arriving while the guest has no receive queue are dropped (as a NIC whose
    /// driver is down), a budget's worth per wake-up.
    fn drop_arrivals(&self) {
        let mut io = lock(&self.io);
        for _ in 0..BUDGET {
            match self.port.recv(&mut io.rx) {
                Ok(Some(_)) => bump(&self.stats.rx_no_queue),
                Ok(None) => return,
                Err(_) => {
                    bump(&self.stats.rx_errors);
                    return;
                }
            }
        }
        let _ = self.more.write(1);
    }

    fn rx(&self, vrings: &[VringRwLock], mem: Option<&GuestMemoryMmap>) -> io::Result<()> {
        match mem {
            Some(m) if Self::live(vrings, RXQ) => self.receive(&vrings[RXQ], m),
            _ => {
                lock(&self.io).rx_held = None;
                self.drop_arrivals();
                Ok(())
            }
        }
    }

    fn tx(&self, vrings: &[VringRwLock], mem: Option<&GuestMemoryMmap>) -> io::Result<()> {
        match mem {
            Some(m) if Self::live(vrings, TXQ) => self.transmit(&vrings[TXQ], m),
            _ => Ok(()),
        }
    }
}

impl VhostUserBackend for VhuNet {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NET_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        NET_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        net_features()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn acked_features(&self, features: u64) {
        self.acked.store(features, Ordering::Relaxed);
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: GM) -> io::Result<()> {
        *lock(&self.mem) = Some(mem);
        Ok(())
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        if queue_index as usize == RXQ {
            // The held frame was for buffers a reset guest no longer has.
            lock(&self.io).rx_held = None;
        }
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        crate::sys::exit_event(&self.exit_fds)
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        let gm = lock(&self.mem).clone();
        let guard = gm.as_ref().map(|g| g.memory());
        let mem = guard.as_deref();
        match device_event {
            e if e as usize == RXQ => self.rx(vrings, mem),
            e if e as usize == TXQ => self.tx(vrings, mem),
            PORT_EVENT => self.rx(vrings, mem),
            MORE_EVENT => {
                let _ = self.more.read();
                self.tx(vrings, mem)?;
                self.rx(vrings, mem)
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame holding an IPv4 UDP datagram with `payload`, its checksum field
    /// holding only the pseudo-header sum (as the kernel leaves it for CHECKSUM_PARTIAL).
    fn partial_udp(payload: &[u8]) -> (Vec<u8>, u16) {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let udp_len = 8 + payload.len();
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        f.extend_from_slice(&ip);
        let mut udp = vec![0x12, 0x34, 0x56, 0x78, 0, 0, 0, 0];
        udp[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        udp.extend_from_slice(payload);
        // The full checksum, for comparison: pseudo header + UDP header + data.
        let mut sum: u32 = 0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 17 + udp_len as u32;
        let mut pseudo = sum;
        for c in udp.chunks(2) {
            sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        while pseudo > 0xffff {
            pseudo = (pseudo & 0xffff) + (pseudo >> 16);
        }
        udp[6..8].copy_from_slice(&(pseudo as u16).to_be_bytes());
        f.extend_from_slice(&udp);
        (f, !(sum as u16))
    }

    fn hdr(flags: u8, gso: u8, start: u16, off: u16) -> [u8; VNET_HDR] {
        let mut h = [0u8; VNET_HDR];
        h[0] = flags;
        h[1] = gso;
        h[6..8].copy_from_slice(&start.to_le_bytes());
        h[8..10].copy_from_slice(&off.to_le_bytes());
        h
    }

    const ALL: u64 = u64::MAX;

    #[test]
    fn a_partial_checksum_is_finished_for_a_guest_without_guest_csum() {
        for payload in [&b"odd"[..], b"even", b""] {
            let (mut f, want) = partial_udp(payload);
            let mut h = hdr(VIRTIO_NET_HDR_F_NEEDS_CSUM as u8, 0, 34, 6);
            assert_eq!(rx_header(&mut h, &mut f, 0), Some(true));
            assert_eq!(u16::from_be_bytes([f[40], f[41]]), want, "{payload:?}");
            assert_eq!(h[0], 0, "no flag left for the guest");
        }
        // A guest with GUEST_CSUM finishes it itself: frame and header untouched.
        let (mut f, _) = partial_udp(b"x");
        let before = f.clone();
        let mut h = hdr(VIRTIO_NET_HDR_F_NEEDS_CSUM as u8, 0, 34, 6);
        assert_eq!(rx_header(&mut h, &mut f, ALL), Some(false));
        assert_eq!(f, before);
        assert_eq!(h[0], VIRTIO_NET_HDR_F_NEEDS_CSUM as u8);
        // A checksum field outside the frame: dropped, nothing written.
        let (mut f, _) = partial_udp(b"x");
        let before = f.clone();
        for (start, off) in [(34, 500), (u16::MAX, u16::MAX), (60, 0)] {
            let mut h = hdr(VIRTIO_NET_HDR_F_NEEDS_CSUM as u8, 0, start, off);
            assert_eq!(rx_header(&mut h, &mut f, 0), None, "{start}+{off}");
            assert_eq!(f, before);
        }
    }

    #[test]
    fn segmentation_offloads_reach_only_a_guest_that_took_them() {
        let (mut f, _) = partial_udp(b"x");
        let tso4 = VIRTIO_NET_HDR_GSO_TCPV4 as u8;
        let csum = VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
        let only = |bits: &[u32]| bits.iter().fold(0u64, |a, b| a | 1 << b);
        let mut h = hdr(csum, tso4, 34, 16);
        assert_eq!(rx_header(&mut h, &mut f, ALL), Some(false));
        for acked in [
            0,
            only(&[VIRTIO_NET_F_GUEST_CSUM]),
            only(&[VIRTIO_NET_F_GUEST_TSO4]),
            only(&[VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO6]),
        ] {
            let mut h = hdr(csum, tso4, 34, 16);
            assert_eq!(rx_header(&mut h, &mut f, acked), None, "acked {acked:#x}");
        }
        let ecn = tso4 | VIRTIO_NET_HDR_GSO_ECN as u8;
        let mut h = hdr(csum, ecn, 34, 16);
        let no_ecn = only(&[VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4]);
        assert_eq!(rx_header(&mut h, &mut f, no_ecn), None);
        let mut h = hdr(csum, 3 /* UDP */, 34, 6);
        assert_eq!(rx_header(&mut h, &mut f, ALL), None, "UFO is not offered");
    }

    #[test]
    fn offered_features() {
        let f = net_features();
        for want in [
            VIRTIO_F_VERSION_1,
            VIRTIO_NET_F_MRG_RXBUF,
            VIRTIO_NET_F_CSUM,
            VIRTIO_NET_F_GUEST_CSUM,
            VIRTIO_NET_F_HOST_TSO4,
            VIRTIO_NET_F_GUEST_TSO4,
            VIRTIO_RING_F_EVENT_IDX,
        ] {
            assert_ne!(f & (1 << want), 0, "feature {want}");
        }
        // MAC and link status are the VMM's; multiqueue is not offered.
        assert_ne!(
            f & (1 << 30),
            0,
            "QEMU's vhost-user-net needs protocol features"
        );
        for not in [5u32, 16, 22] {
            assert_eq!(f & (1 << not), 0, "feature {not}");
        }
    }
}
