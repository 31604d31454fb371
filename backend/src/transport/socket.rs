//! The socket half of the `udp` transport ([`crate::transport::udp`]): one UDP socket's
//! `sendmmsg` (with UDP GSO runs) and `recvmmsg` (with UDP GRO), its socket options, and the
//! ICRC check of what it receives. With `--io-thread` the I/O thread drives a half of its own
//! ([`UdpIo::io_half`]); the worker's [`crate::transport::udp::UdpTransport`] routes and
//! builds the packets.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use rxe_core::device::RecvMeta;
use rxe_core::Gid;

use crate::sys::{setsockopt, sockaddr_from, sockaddr_to};
use crate::transport::egress::EgressPolicy;
use crate::transport::live_qpns::LiveQpns;
use crate::transport::mcast::GroupSockets;
use crate::transport::sport::SourcePorts;
use crate::transport::stats::TransportStats;

/// Packets sent with one `sendmmsg`.
pub const TX_BATCH: usize = 32;
/// Datagrams received with one `recvmmsg`.
pub const RX_BATCH: usize = 32;
/// Room per packet: a 4096-byte path MTU plus every RoCE header and the ICRC.
pub(super) const TX_SLOT: usize = 4096 + 256;
/// Distance between two send slots: whole pages, so that every slot starts at the same
/// offset in its page ([`TX_PAGE_OFFSET`]).
pub(super) const TX_STRIDE: usize = 8192;
/// Where in its page each send slot starts. The engine copies a packet's payload from guest
/// memory to just behind its headers (12–40 bytes into the slot); a slot at the start of a
/// page would put it 12–40 bytes past a page-aligned source's offset in the page, where the
/// CPU's `rep movsb` copy stalls on 4 KiB aliasing (3.4× slower here for 4 KiB copies). Half
/// a page away from the usual buffer alignment the copy runs at full speed.
const TX_PAGE_OFFSET: usize = 2048;
/// Room per received datagram (larger ones are truncated and dropped).
const RX_SLOT: usize = 9216;
/// One GSO send carries at most this many UDP payload bytes (the IPv6 payload length is 16
/// bits and holds the UDP header too; a 4 KiB path MTU fits 15 segments) ...
const GSO_MAX_BYTES: usize = 65_000;
/// ... and at most this many segments (the kernel's UDP_MAX_SEGMENTS is 64 or more).
const GSO_MAX_SEGS: usize = 64;
/// `UDP_SEGMENT` (linux/udp.h): the cmsg and socket option carrying the GSO segment size.
const UDP_SEGMENT: i32 = 103;
/// `UDP_GRO` (linux/udp.h): the socket option that has the kernel hand over coalesced runs
/// of datagrams, and the cmsg carrying their segment size.
const UDP_GRO: i32 = 104;
/// Room per received message with GRO on: a whole coalesced run (at most 64 KiB).
const GRO_SLOT: usize = 1 << 16;
/// Messages one `recvmmsg` takes with GRO on: each may hold a run of up to 64 datagrams, so
/// one receive call hands over at most 8 × 64 = 512 (8 × 15 = 120 at path MTU 4096), not
/// [`RX_BATCH`] × 64.
const RX_BATCH_GRO: usize = 8;
/// GSO sends refused in a row, each for a reason that says the path cannot do GSO (EINVAL,
/// EIO, EOPNOTSUPP), after which the transport stops trying; a GSO send that goes through
/// resets the count (one peer behind a smaller path MTU or an IPsec route does not turn GSO
/// off for the others).
pub(super) const GSO_REFUSALS_OFF: u32 = 8;
/// Room for one `UDP_SEGMENT` cmsg (CMSG_SPACE of a u16), as u64s for the alignment.
const GSO_CMSG_WORDS: usize = 3;
/// Socket errors one receive call takes (each counted) before it gives up and reports the
/// socket as failing ([`UdpIo::rx_failing`]).
pub const RX_ERROR_LIMIT: u32 = 16;
/// `UDP_NO_CHECK6_TX` / `UDP_NO_CHECK6_RX` (linux/udp.h).
pub(super) const UDP_NO_CHECK6_TX: i32 = 101;
const UDP_NO_CHECK6_RX: i32 = 102;

/// A batch of packets for the socket: slot `i` of `buf` starts at `base + i * TX_STRIDE`
/// ([`UdpIo::slot`]), `pending[i]` is its length, destination and UDP source port.
pub struct TxBatch {
    pub(crate) buf: Vec<u8>,
    pub(crate) base: usize,
    pub(crate) pending: Vec<(usize, SocketAddr, u16)>,
}

impl TxBatch {
    /// An empty send batch: [`TX_BATCH`] slots, each starting [`TX_PAGE_OFFSET`] into a page.
    pub(crate) fn new() -> TxBatch {
        let buf = vec![0u8; TX_BATCH * TX_STRIDE + 4096];
        // The heap block never moves (the vector is never grown), so neither do the slots.
        let base = (TX_PAGE_OFFSET + 4096 - buf.as_ptr() as usize % 4096) % 4096;
        TxBatch {
            buf,
            base,
            pending: Vec::with_capacity(TX_BATCH),
        }
    }
}

/// One UDP socket's sending and receiving (see the module documentation).
pub struct UdpIo {
    pub(super) sock: UdpSocket,
    pub(super) local: SocketAddr,
    /// How received ICRCs are checked ([`verify_icrc`]); its solver also serves the send
    /// side (with GSO) to put a packet's ID, its index in its run, into its ICRC.
    icrc: Box<RxIcrc>,
    pub(super) egress: EgressPolicy,
    pub stats: TransportStats,
    /// Packets waiting for `sendmmsg`: `TX_BATCH` slots of `TX_SLOT` bytes, slot `i` at
    /// `tx_base + i * TX_STRIDE` ([`UdpIo::slot`]).
    pub(super) tx_buf: Vec<u8>,
    tx_base: usize,
    pub(super) tx_pending: Vec<(usize, SocketAddr, u16)>,
    /// The sockets that send from the packets' own source ports ([`SourcePorts`]).
    pub(super) ports: Box<SourcePorts>,
    /// The multicast groups joined (the worker's half; [`crate::transport::mcast`]).
    pub(super) groups: Option<Box<GroupSockets>>,
    /// The last `sendmmsg` found the socket buffer full; `tx_pending` holds what it did not
    /// take, sent first once the socket is writable again.
    pub(super) tx_blocked: bool,
    /// With `tx_blocked`: the source-port socket that was full ([`Self::blocked_port_fd`]),
    /// none when it was the bound one.
    blocked_port: Option<RawFd>,
    /// Runs of equal-length packets to one destination leave as one UDP GSO send.
    gso: bool,
    /// GSO sends refused in a row ([`GSO_REFUSALS_OFF`]).
    gso_refusals: u32,
    /// The last receive gave up after [`RX_ERROR_LIMIT`] errors in a row.
    rx_failing: bool,
    pub(super) rx: RxBatch,
}

/// How one pass of `sendmmsg` calls ended ([`UdpIo::send_runs`]).
enum Pass {
    /// Every message went (or its packet was lost to its own error).
    Sent,
    /// The socket buffer is full.
    Blocked,
    /// A GSO send failed: the rest go one by one.
    GsoRefused,
}

/// `recvmmsg` state: buffers, source addresses, and the datagrams found in them.
pub(super) struct RxBatch {
    /// `RX_BATCH` slots of `slot` bytes.
    buf: Vec<u8>,
    /// [`RX_SLOT`], or [`GRO_SLOT`] with GRO on.
    slot: usize,
    names: Vec<libc::sockaddr_storage>,
    name_lens: Vec<libc::socklen_t>,
    /// The `UDP_GRO` cmsg of each message (GRO on).
    cmsgs: Vec<[u64; GSO_CMSG_WORDS]>,
    /// The datagrams of the last batch: one per message, or a coalesced message's segments.
    segs: Vec<RxSeg>,
    /// Whether the socket coalesces runs (`UDP_GRO` set).
    pub(super) gro: bool,
}

impl RxBatch {
    /// Buffers for [`RX_BATCH`] datagrams, or with `gro` for [`RX_BATCH_GRO`] coalesced runs.
    fn new(gro: bool) -> RxBatch {
        let (n, slot) = if gro {
            (RX_BATCH_GRO, GRO_SLOT)
        } else {
            (RX_BATCH, RX_SLOT)
        };
        RxBatch {
            buf: vec![0; n * slot],
            slot,
            // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
            names: vec![unsafe { std::mem::zeroed() }; RX_BATCH],
            name_lens: vec![0; RX_BATCH],
            cmsgs: vec![[0; GSO_CMSG_WORDS]; RX_BATCH],
            segs: Vec::with_capacity(RX_BATCH),
            gro,
        }
    }

    /// No buffers: a transport half that does not receive ([`UdpIo::recv_batch`]
    /// then takes nothing).
    fn none() -> RxBatch {
        RxBatch {
            buf: Vec::new(),
            slot: RX_SLOT,
            names: Vec::new(),
            name_lens: Vec::new(),
            cmsgs: Vec::new(),
            segs: Vec::new(),
            gro: false,
        }
    }
}

/// A datagram of the last receive batch: where it is in `RxBatch::buf`.
#[derive(Clone, Copy)]
struct RxSeg {
    slot: u16,
    off: u32,
    len: u32,
    truncated: bool,
    /// Its place in a coalesced run (0 for a datagram alone): the IPv4 ID a GSO sender that
    /// follows this transport's rule gave it.
    index: u16,
    /// The multicast group it was sent to (a group socket's, [`crate::transport::mcast`]);
    /// `None`: the bound socket's address.
    group: Option<SocketAddr>,
}

pub(super) fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    setsockopt(fd, level, name, &v)
}

impl UdpIo {
    /// The socket half on the bound socket `sock`: non-blocking, with the options the ICRC
    /// rules need (path MTU discovery on, so DF and IPv4 ID 0; UDP checksum 0).
    pub(super) fn open(
        sock: UdpSocket,
        strict_icrc: bool,
        ids: std::sync::Arc<std::sync::Mutex<rxe_core::icrc::Ipv4IdWindows>>,
    ) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
        let addr = sock.local_addr()?;
        match addr {
            SocketAddr::V4(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )?;
                // Checksum 0, as rxe sends (the ICRC masks the field either way).
                setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1)?;
            }
            SocketAddr::V6(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_DO,
                )?;
                setsockopt_int(fd, libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, 1)?;
                setsockopt_int(fd, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)?;
            }
        }
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
        let local = sock.local_addr()?;
        let b = TxBatch::new();
        Ok(UdpIo {
            sock,
            local,
            icrc: Box::new(RxIcrc {
                strict: strict_icrc,
                solver: rxe_core::icrc::Ipv4IdSolver::new(),
                ids,
                epoch: std::time::Instant::now(),
                qpns: None,
            }),
            egress: EgressPolicy::default(),
            stats: TransportStats::default(),
            tx_buf: b.buf,
            tx_base: b.base,
            tx_pending: b.pending,
            ports: Box::new(SourcePorts::new(
                local,
                crate::transport::sport::DEFAULT_CAP,
            )),
            tx_blocked: false,
            blocked_port: None,
            groups: None,
            gso: false,
            gso_refusals: 0,
            rx_failing: false,
            rx: RxBatch::new(false),
        })
    }

    /// The I/O thread's half of this socket (`--io-thread`): the same socket (a duplicate
    /// fd), address, GSO and ICRC rules, with its own send and receive buffers and counters.
    pub(crate) fn io_half(&self) -> io::Result<UdpIo> {
        let b = TxBatch::new();
        Ok(UdpIo {
            sock: self.sock.try_clone()?,
            local: self.local,
            icrc: Box::new(RxIcrc {
                strict: self.icrc.strict,
                solver: rxe_core::icrc::Ipv4IdSolver::new(),
                ids: std::sync::Arc::clone(&self.icrc.ids),
                epoch: self.icrc.epoch,
                qpns: self.icrc.qpns.clone(),
            }),
            egress: self.egress.clone(),
            stats: TransportStats::default(),
            tx_buf: b.buf,
            tx_base: b.base,
            tx_pending: b.pending,
            ports: Box::new(self.ports.sibling()),
            tx_blocked: false,
            blocked_port: None,
            groups: None,
            gso: self.gso,
            gso_refusals: 0,
            rx_failing: false,
            rx: RxBatch::new(self.rx.gro),
        })
    }

    /// Lets the receive buffers go: the worker's half with an I/O thread, whose socket's
    /// datagrams are the thread's ([`Self::recv_batch`] then takes nothing).
    pub(super) fn stop_receiving(&mut self) {
        self.rx = RxBatch::none();
    }

    /// Swaps the pending batch with `b` (the worker's half handing it to the I/O thread).
    pub(super) fn swap_batch(&mut self, b: &mut TxBatch) {
        std::mem::swap(&mut self.tx_buf, &mut b.buf);
        std::mem::swap(&mut self.tx_base, &mut b.base);
        std::mem::swap(&mut self.tx_pending, &mut b.pending);
    }

    /// Whether packets the socket did not take wait (the I/O thread's half).
    pub(crate) fn tx_blocked_now(&self) -> bool {
        self.tx_blocked
    }

    /// While blocked: the source-port socket whose buffer is full, to wait for its
    /// writability ([`crate::transport::sport`]; it stays open at least until the next send);
    /// `None` when the bound socket is the full one, or nothing is blocked.
    pub(crate) fn blocked_port_fd(&self) -> Option<RawFd> {
        self.blocked_port.filter(|_| self.tx_blocked)
    }

    /// Sends what the socket did not take before (the I/O thread's half).
    pub(crate) fn send_held(&mut self) {
        self.send_pending();
    }

    /// Sends `b` (the I/O thread's half; nothing may be held, [`Self::tx_blocked_now`]);
    /// what the socket does not take stays held. Returns an empty batch.
    pub(crate) fn send_batch(&mut self, mut b: TxBatch) -> TxBatch {
        debug_assert!(self.tx_pending.is_empty());
        self.swap_batch(&mut b);
        b.pending.clear();
        self.send_pending();
        b
    }

    /// Sends runs of packets as UDP GSO segments from now on, and takes coalesced runs
    /// (UDP GRO) on receive, if the kernel knows UDP GSO (4.18 and later); returns whether it
    /// will. (IPv4: the module comment says how the ICRC covers a segment's IP ID.) Turns
    /// the UDP checksum on, which the kernel requires of a GSO send. A kernel without UDP GRO
    /// (before 5.0) leaves receive as it was.
    pub fn enable_gso(&mut self) -> io::Result<bool> {
        // A kernel that does not know UDP_SEGMENT would ignore the cmsg and send a run as
        // one datagram: ask it first (a segment size of 0 is "no default").
        if setsockopt_int(self.fd(), libc::IPPROTO_UDP, UDP_SEGMENT, 0).is_err() {
            return Ok(false);
        }
        if self.local.is_ipv4() {
            setsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 0)?;
        } else {
            setsockopt_int(self.fd(), libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, 0)?;
        }
        self.gso = true;
        self.ports.set_checksum(true);
        if setsockopt_int(self.fd(), libc::IPPROTO_UDP, UDP_GRO, 1).is_ok() {
            self.rx = RxBatch::new(true);
        }
        Ok(true)
    }

    /// Whether runs of packets leave as UDP GSO sends ([`Self::enable_gso`], until the kernel
    /// refuses one).
    pub fn gso(&self) -> bool {
        self.gso
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The device's live QPs: an IPv4 packet whose ICRC needs the ID solve is solved only
    /// when it is for one of them (or QP1, or multicast).
    pub fn set_live_qpns(&mut self, q: std::sync::Arc<LiveQpns>) {
        self.icrc.qpns = Some(q);
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The GID of the bound address.
    pub fn gid(&self) -> Gid {
        Gid::from_ip(self.local.ip())
    }

    /// The bytes of send slot `i`.
    pub(super) fn slot(&self, i: usize) -> std::ops::Range<usize> {
        let at = self.tx_base + i * TX_STRIDE;
        at..at + TX_SLOT
    }

    /// Sends the queued packets with as few `sendmmsg` calls as the kernel allows; with GSO,
    /// each run of packets [`Self::gso_run`] finds is one message of that call. A full socket
    /// buffer leaves what it did not take in the batch, in order ([`Self::tx_blocked`]).
    pub(super) fn send_pending(&mut self) {
        let n = self.tx_pending.len();
        if n == 0 {
            self.tx_blocked = false;
            return;
        }
        let mut names: [libc::sockaddr_storage; TX_BATCH] =
            // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
            unsafe { std::mem::zeroed() };
        let mut iov: [libc::iovec; TX_BATCH] =
            // SAFETY: iovec is a pointer and a length; all-zero is a valid (empty) value.
            unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; TX_BATCH] =
            // SAFETY: mmsghdr is plain data and pointers; all-zero is a valid (empty) value.
            unsafe { std::mem::zeroed() };
        let mut cmsgs = [[0u64; GSO_CMSG_WORDS]; TX_BATCH];
        // The packets each message carries: (first, count).
        let mut runs = [(0usize, 0usize); TX_BATCH];
        let mut name_lens: [libc::socklen_t; TX_BATCH] = [0; TX_BATCH];
        for (i, &(_, dst, _)) in self.tx_pending.iter().enumerate() {
            name_lens[i] = sockaddr_from(dst, &mut names[i]);
        }
        // IPv4: the IP ID each packet's ICRC was computed for (0 outside this function).
        let mut ids = [0u16; TX_BATCH];
        // The headers point into these arrays through pointers taken once, so that no later
        // borrow of an array invalidates what an earlier header holds.
        let (names_p, iov_p, cmsgs_p) = (names.as_mut_ptr(), iov.as_mut_ptr(), cmsgs.as_mut_ptr());
        // Packets sent (or lost) so far; a GSO refusal sends the rest one by one.
        let mut done = 0usize;
        let mut gso = self.gso;
        while done < n {
            let m = self.plan_runs(done, gso, &mut runs, &mut ids);
            for i in done..n {
                let r = self.slot(i);
                let base = self.tx_buf[r].as_mut_ptr().cast();
                // SAFETY: `i < n <= TX_BATCH`: inside `iov`, written through the pointer the
                // headers use.
                unsafe {
                    (*iov_p.add(i)).iov_base = base;
                    (*iov_p.add(i)).iov_len = self.tx_pending[i].0;
                }
            }
            for (j, &(i, count)) in runs[..m].iter().enumerate() {
                let hdr = &mut msgs[j].msg_hdr;
                // SAFETY: `i < n <= TX_BATCH` and `j <= i`: inside `names`, `iov` and `cmsgs`,
                // which outlive every use of the headers; the kernel reads `count` iovecs from
                // `iov_p + i`, and `i + count <= n`.
                unsafe {
                    hdr.msg_name = names_p.add(i).cast();
                    hdr.msg_iov = iov_p.add(i);
                }
                hdr.msg_namelen = name_lens[i];
                hdr.msg_iovlen = count;
                if count > 1 {
                    // SAFETY: as above; nothing else refers to `cmsgs[j]` meanwhile.
                    let c = unsafe { &mut *cmsgs_p.add(j) };
                    hdr.msg_controllen = gso_cmsg(c, self.tx_pending[i].0 as u16);
                    hdr.msg_control = (c as *mut [u64; GSO_CMSG_WORDS]).cast();
                } else {
                    hdr.msg_control = std::ptr::null_mut();
                    hdr.msg_controllen = 0;
                }
            }
            match self.send_runs(&mut msgs[..m], &runs[..m], &mut done) {
                Pass::Sent => {}
                Pass::GsoRefused => gso = false,
                Pass::Blocked => {
                    for i in done..n {
                        self.set_ip_id(&mut ids, i, 0);
                    }
                    self.keep_unsent(done);
                    return;
                }
            }
        }
        self.tx_pending.clear();
        self.tx_blocked = false;
    }

    /// Groups the pending packets from `done` on into this pass's messages (`runs`: first
    /// packet and count): runs of [`Self::gso_run`] with `gso`, else one packet each. A
    /// packet's ICRC first takes the IPv4 ID the kernel will write (its index in its GSO
    /// run). Returns how many messages.
    fn plan_runs(
        &mut self,
        done: usize,
        gso: bool,
        runs: &mut [(usize, usize); TX_BATCH],
        ids: &mut [u16; TX_BATCH],
    ) -> usize {
        let n = self.tx_pending.len();
        let mut m = 0usize;
        let mut i = done;
        while i < n {
            let count = if gso { self.gso_run(i) } else { 1 };
            for k in 0..count {
                let id = if count > 1 { k as u16 } else { 0 };
                self.set_ip_id(ids, i + k, id);
            }
            runs[m] = (i, count);
            m += 1;
            i += count;
        }
        m
    }

    /// Sends the messages `msgs` (carrying `runs`) with `sendmmsg` until all went, the socket
    /// is full, or a GSO send failed; `done` follows the packets sent or lost. A packet's own
    /// error loses it (the engine's retransmission covers it) and the rest go on.
    fn send_runs(
        &mut self,
        msgs: &mut [libc::mmsghdr],
        runs: &[(usize, usize)],
        done: &mut usize,
    ) -> Pass {
        let m = msgs.len();
        let mut sent = 0usize;
        while sent < m {
            // The messages from `sent` on that leave from one source port: one call.
            let sport = self.tx_pending[runs[sent].0].2;
            let end = sent
                + runs[sent..]
                    .iter()
                    .take_while(|&&(i, _)| self.tx_pending[i].2 == sport)
                    .count();
            let Some(fd) = self.sender(sport) else {
                // This half could not bind the port its packets' ICRCs were computed for:
                // they are lost (the engine's retransmission covers them).
                for &(first, count) in &runs[sent..end] {
                    self.stats.tx_dropped += count as u64;
                    *done = first + count;
                }
                sent = end;
                continue;
            };
            // SAFETY: `msgs[sent..end]` are initialised headers whose name, iovec, control
            // and data pointers point into the caller's arrays and `self.tx_buf`, all
            // alive and unmoved for the duration of the call.
            let r = unsafe {
                libc::sendmmsg(
                    fd,
                    msgs[sent..end].as_mut_ptr(),
                    (end - sent) as libc::c_uint,
                    0,
                )
            };
            if r > 0 {
                for &(first, count) in &runs[sent..sent + r as usize] {
                    for &(len, _, _) in &self.tx_pending[first..first + count] {
                        self.stats.tx_packets += 1;
                        self.stats.tx_bytes += len as u64;
                    }
                    if count > 1 {
                        self.stats.tx_gso_sends += 1;
                        self.stats.tx_gso_segments += count as u64;
                        self.gso_refusals = 0;
                    }
                    *done = first + count;
                }
                sent += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            if r < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if r < 0 && e.kind() == io::ErrorKind::WouldBlock {
                // The socket buffer is full: keep the rest, in order, for when it drains
                // (with an I/O thread: for it to send when the socket has room).
                self.stats.tx_blocked += 1;
                self.tx_blocked = true;
                self.blocked_port = (fd != self.sock.as_raw_fd()).then_some(fd);
                return Pass::Blocked;
            }
            let (first, count) = runs[sent];
            if count > 1 {
                // The GSO send failed: send these packets (and the rest of this batch)
                // one by one, where an error is the packet's own. A refusal that says the
                // path cannot do GSO counts; enough of them in a row turn it off.
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINVAL | libc::EIO | libc::EOPNOTSUPP)
                ) {
                    self.stats.tx_gso_refused += 1;
                    self.gso_refusals += 1;
                    if self.gso_refusals >= GSO_REFUSALS_OFF && self.gso {
                        log::warn!("udp transport: the kernel refused {GSO_REFUSALS_OFF} GSO sends in a row ({e}); sending packets one by one from now on");
                        self.gso = false;
                    }
                }
                *done = first;
                return Pass::GsoRefused;
            }
            // An error of this packet (an ICMP error reported on this call, a route that
            // refuses it) loses it: the engine's retransmission covers it. Try the rest.
            self.stats.tx_dropped += 1;
            let to = self.tx_pending[first].1;
            super::log_send_error("udp transport", &to, Some(to.ip()), &e);
            *done = first + 1;
            sent += 1;
        }
        Pass::Sent
    }

    /// At most `cap` sockets for the packets' own source ports ([`SourcePorts`]).
    pub(super) fn set_source_ports(&mut self, cap: usize) {
        let mut p = SourcePorts::new(self.local, cap);
        p.set_checksum(self.gso);
        *self.ports = p;
    }

    /// The UDP source port a packet the engine gave port `want` leaves from: its own, or,
    /// when no socket can send from it, the bound socket's (counted).
    pub(super) fn source_port(&mut self, want: u16) -> u16 {
        let fd = self.ports.fd(want);
        self.stats.tx_sport_sockets = self.ports.opened;
        self.stats.tx_sport_open = self.ports.open_now() as u64;
        if fd.is_some() {
            return want;
        }
        if self.ports.wants(want) {
            self.stats.tx_sport_fallback += 1;
        }
        self.local.port()
    }

    /// The socket that sends from `sport`: the bound one for its own port; `None` when this
    /// half cannot bind `sport`.
    fn sender(&mut self, sport: u16) -> Option<RawFd> {
        if sport == self.local.port() {
            return Some(self.sock.as_raw_fd());
        }
        let fd = self.ports.fd(sport);
        self.stats.tx_sport_sockets = self.ports.opened;
        self.stats.tx_sport_open = self.ports.open_now() as u64;
        fd
    }

    /// Makes the ICRC of pending packet `i` (computed for the IPv4 ID `ids[i]`) one for ID
    /// `id`: the ICRC is affine in the ID's bits ([`rxe_core::icrc::Ipv4IdBasis`]). IPv6
    /// has no ID: nothing to do.
    fn set_ip_id(&mut self, ids: &mut [u16; TX_BATCH], i: usize, id: u16) {
        if ids[i] == id || !self.local.is_ipv4() {
            return;
        }
        let len = self.tx_pending[i].0;
        let at = self.slot(i).start;
        let roce = &mut self.tx_buf[at..at + len];
        let b = self
            .icrc
            .solver
            .basis(len, rxe_core::icrc::covers_twice(roce));
        let delta = b.contribution(ids[i]) ^ b.contribution(id);
        let icrc = &mut roce[len - 4..];
        let v = u32::from_le_bytes([icrc[0], icrc[1], icrc[2], icrc[3]]) ^ delta;
        icrc.copy_from_slice(&v.to_le_bytes());
        ids[i] = id;
    }

    /// How many packets from `first` on can leave as one GSO send: the same destination and
    /// source port, the same length as the first (the last of the run may be shorter), within
    /// [`GSO_MAX_BYTES`] and [`GSO_MAX_SEGS`].
    fn gso_run(&self, first: usize) -> usize {
        let (len, dst, sport) = self.tx_pending[first];
        let mut bytes = len;
        let mut count = 1;
        for &(l, d, s) in &self.tx_pending[first + 1..] {
            if d != dst
                || s != sport
                || l > len
                || bytes + l > GSO_MAX_BYTES
                || count == GSO_MAX_SEGS
            {
                break;
            }
            bytes += l;
            count += 1;
            if l < len {
                break;
            }
        }
        count
    }

    /// Moves the packets from `done` on to the front of the batch.
    pub(super) fn keep_unsent(&mut self, done: usize) {
        for i in done..self.tx_pending.len() {
            let (len, _, _) = self.tx_pending[i];
            let from = self.slot(i).start;
            let to = self.slot(i - done).start;
            self.tx_buf.copy_within(from..from + len, to);
        }
        self.tx_pending.drain(..done);
    }

    /// Receives up to [`RX_BATCH`] datagrams with one `recvmmsg` (with GRO: up to
    /// [`RX_BATCH_GRO`] messages, each a datagram or a coalesced run of them); returns how
    /// many datagrams arrived (0 when nothing is waiting). Read them with [`Self::packet`].
    pub fn recv_batch(&mut self) -> usize {
        if self.rx.buf.is_empty() {
            // The worker's half with an I/O thread: the socket's datagrams are the thread's.
            return 0;
        }
        self.recv_bound();
        if self.groups.is_some() {
            self.recv_groups();
        }
        self.rx.segs.len()
    }

    /// Datagrams of the joined multicast groups, into the slots the bound socket's left
    /// free (group traffic is light: one `recvfrom` each).
    fn recv_groups(&mut self) {
        let Some(groups) = &self.groups else {
            return;
        };
        let rx = &mut self.rx;
        let slots = rx.buf.len() / rx.slot;
        let mut slot = rx.segs.last().map_or(0, |s| s.slot as usize + 1);
        for (group, fd) in groups.sockets() {
            while slot < slots {
                let buf = &mut rx.buf[slot * rx.slot..(slot + 1) * rx.slot];
                let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                // SAFETY: `buf` and `rx.names[slot]` are live and writable for the lengths
                // given; MSG_TRUNC only makes the result the datagram's whole length.
                let r = unsafe {
                    libc::recvfrom(
                        fd,
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                        (&mut rx.names[slot] as *mut libc::sockaddr_storage).cast(),
                        &mut len,
                    )
                };
                if r < 0 {
                    // Nothing more waits there (or an error the next wake-up meets again).
                    break;
                }
                rx.name_lens[slot] = len;
                rx.segs.push(RxSeg {
                    slot: slot as u16,
                    off: 0,
                    len: (r as usize).min(rx.slot) as u32,
                    truncated: r as usize > rx.slot,
                    index: 0,
                    group: Some(group),
                });
                slot += 1;
            }
        }
    }

    /// [`Self::recv_batch`] on the bound socket.
    fn recv_bound(&mut self) -> usize {
        let mut iov: [libc::iovec; RX_BATCH] =
            // SAFETY: iovec is a pointer and a length; all-zero is a valid (empty) value.
            unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; RX_BATCH] =
            // SAFETY: mmsghdr is plain data and pointers; all-zero is a valid (empty) value.
            unsafe { std::mem::zeroed() };
        let rx = &mut self.rx;
        rx.segs.clear();
        let slot = rx.slot;
        let vlen = if rx.gro { RX_BATCH_GRO } else { RX_BATCH };
        for i in 0..vlen {
            iov[i].iov_base = rx.buf[i * slot..].as_mut_ptr().cast();
            iov[i].iov_len = slot;
            msgs[i].msg_hdr.msg_name = (&mut rx.names[i] as *mut libc::sockaddr_storage).cast();
            msgs[i].msg_hdr.msg_namelen =
                std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            if rx.gro {
                msgs[i].msg_hdr.msg_control = rx.cmsgs[i].as_mut_ptr().cast();
                msgs[i].msg_hdr.msg_controllen = std::mem::size_of_val(&rx.cmsgs[i]);
            }
        }
        let mut errors = 0;
        let n = loop {
            // SAFETY: every header points at a live, writable buffer of the size it names
            // (`rx.buf` slots, `rx.names` and `rx.cmsgs` entries) that stays put during the
            // call.
            let r = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    msgs.as_mut_ptr(),
                    vlen as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {
                    self.rx_failing = false;
                    return 0;
                }
                // ICMP errors surface here (ECONNREFUSED on a closed peer port): not fatal,
                // and they consume the error: try again, a bounded number of times.
                _ => {
                    self.stats.rx_errors += 1;
                    errors += 1;
                    if errors >= RX_ERROR_LIMIT {
                        self.rx_failing = true;
                        return 0;
                    }
                }
            }
        };
        self.rx_failing = false;
        for (i, m) in msgs.iter().enumerate().take(n) {
            let truncated = m.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            rx.name_lens[i] = m.msg_hdr.msg_namelen;
            let len = m.msg_len as usize;
            let seg = if rx.gro {
                gro_segment_size(&m.msg_hdr)
            } else {
                0
            };
            if seg == 0 || seg >= len || truncated {
                rx.segs.push(RxSeg {
                    slot: i as u16,
                    off: 0,
                    len: len as u32,
                    truncated,
                    index: 0,
                    group: None,
                });
                continue;
            }
            self.stats.rx_gro_runs += 1;
            for off in (0..len).step_by(seg) {
                self.stats.rx_gro_segments += 1;
                rx.segs.push(RxSeg {
                    slot: i as u16,
                    off: off as u32,
                    len: seg.min(len - off) as u32,
                    truncated: false,
                    index: (off / seg) as u16,
                    group: None,
                });
            }
        }
        rx.segs.len()
    }

    /// Whether the last [`Self::recv_batch`] gave up on errors: the socket keeps failing,
    /// and the caller should leave it alone for a while.
    pub fn rx_failing(&self) -> bool {
        self.rx_failing
    }

    /// Receives and drops at most `max` datagrams (no guest memory to take them); returns
    /// how many.
    pub fn drop_unattached(&mut self, max: usize) -> usize {
        let mut total = 0;
        while total < max {
            let n = self.recv_batch();
            self.stats.rx_unattached += n as u64;
            total += n;
            if n < RX_BATCH {
                break;
            }
        }
        total
    }

    /// Datagram `i` of the last [`Self::recv_batch`], checked (length, ICRC); `None` if it
    /// was dropped (counted).
    pub fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])> {
        let seg = *self.rx.segs.get(i)?;
        let (n, slot) = (seg.len as usize, seg.slot as usize);
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += n as u64;
        let src = sockaddr_to(&self.rx.names[slot], self.rx.name_lens[slot])?;
        if n < 12 + 4 || seg.truncated {
            self.stats.rx_short += 1;
            return None;
        }
        let at = slot * self.rx.slot + seg.off as usize;
        let bytes = &self.rx.buf[at..at + n];
        // A group's datagram went to the group: its ICRC covers that address.
        let to = seg.group.unwrap_or(self.local);
        if !verify_icrc(
            &mut self.icrc,
            &self.egress,
            &mut self.stats,
            to,
            src,
            bytes,
            seg.index,
        ) {
            return None;
        }
        let mut meta = self.meta(src);
        meta.dst = Gid::from_ip(to.ip());
        Some((meta, &self.rx.buf[at..at + n]))
    }

    fn meta(&self, src: SocketAddr) -> RecvMeta {
        RecvMeta {
            src: Gid::from_ip(src.ip().to_canonical()),
            dst: self.gid(),
            sport: src.port(),
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }
    }

    /// Receives one datagram into `buf`; `None` when nothing is waiting. Packets that fail
    /// the checks are counted and skipped. Not with GRO on ([`Self::enable_gso`]): a
    /// coalesced run would come whole; the daemon reads with [`Self::recv_batch`].
    #[cfg(test)]
    pub(super) fn recv(&mut self, buf: &mut [u8]) -> Option<(RecvMeta, usize)> {
        debug_assert!(
            !self.rx.gro,
            "recv() reads one datagram; with GRO use recv_batch()"
        );
        let mut errors = 0;
        loop {
            let (n, src) = match self.sock.recv_from(buf) {
                Ok(v) => v,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP errors surface here (ECONNREFUSED on a closed peer port): not fatal.
                Err(_) => {
                    self.stats.rx_errors += 1;
                    errors += 1;
                    if errors >= RX_ERROR_LIMIT {
                        return None;
                    }
                    continue;
                }
            };
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += n as u64;
            if n < 12 + 4 {
                self.stats.rx_short += 1;
                continue;
            }
            if !verify_icrc(
                &mut self.icrc,
                &self.egress,
                &mut self.stats,
                self.local,
                src,
                &buf[..n],
                0,
            ) {
                continue;
            }
            return Some((self.meta(src), n));
        }
    }
}

/// The segment size a `UDP_GRO` cmsg of a received message gives (0: not a coalesced run).
fn gro_segment_size(h: &libc::msghdr) -> usize {
    // SAFETY: `h` is a header recvmmsg filled: its control pointer and length describe the
    // live cmsg buffer it wrote (or are empty), which CMSG_FIRSTHDR/CMSG_NXTHDR walk within.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP
                && (*c).cmsg_type == UDP_GRO
                && (*c).cmsg_len as usize >= libc::CMSG_LEN(4) as usize
            {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
                return usize::try_from(v).unwrap_or(0);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    0
}

/// Writes a `UDP_SEGMENT` cmsg carrying `seg` into `buf`; returns its length (CMSG_SPACE).
fn gso_cmsg(buf: &mut [u64; GSO_CMSG_WORDS], seg: u16) -> usize {
    // SAFETY: CMSG_SPACE and CMSG_LEN are pure arithmetic.
    let (space, len) = unsafe { (libc::CMSG_SPACE(2) as usize, libc::CMSG_LEN(2) as usize) };
    debug_assert!(space <= std::mem::size_of_val(buf));
    let hdr = libc::cmsghdr {
        cmsg_len: len as _,
        cmsg_level: libc::SOL_UDP,
        cmsg_type: UDP_SEGMENT,
    };
    let hl = std::mem::size_of::<libc::cmsghdr>();
    // SAFETY: `buf` is at least CMSG_SPACE(2) bytes and 8-byte aligned, the alignment of a
    // cmsghdr; the header and the u16 after it (at CMSG_DATA, i.e. `hl` bytes in) fit.
    unsafe {
        let p = buf.as_mut_ptr().cast::<u8>();
        std::ptr::write(p.cast::<libc::cmsghdr>(), hdr);
        std::ptr::write_unaligned(p.add(hl).cast::<u16>(), seg);
    }
    space
}

/// The receive side's ICRC rules and state.
struct RxIcrc {
    /// `--strict-icrc`: the exact ID only.
    strict: bool,
    /// The IPv4 ID bases of the packet lengths seen.
    solver: rxe_core::icrc::Ipv4IdSolver,
    /// The IPv4 ID sequences learned per source address (shared by the sockets of a steered
    /// group and by the two halves of a transport with an I/O thread).
    ids: std::sync::Arc<std::sync::Mutex<rxe_core::icrc::Ipv4IdWindows>>,
    /// The windows' clock starts here.
    epoch: std::time::Instant,
    /// The device's live QPs: a packet for none of them is not solved.
    qpns: Option<std::sync::Arc<LiveQpns>>,
}

/// Checks a received datagram's ICRC and counts the verdict; false when it must be dropped.
/// `id`: the IPv4 ID tried first and exactly (its index in a GRO run, 0 for a datagram
/// alone). Otherwise, unless strict, an IPv4 packet that passes the cheap checks (a source
/// the egress policy allows, a BTH the engine would look at: [`rxe_core::icrc::worth_solving`])
/// and for a live QP of the device ([`LiveQpns`], when set) is solved for its ID, and accepted only if that ID lies in a window of its source's ID
/// sequence ([`rxe_core::icrc::Ipv4IdWindows`]); outside, it is dropped and its ID learned.
fn verify_icrc(
    icrc: &mut RxIcrc,
    egress: &EgressPolicy,
    stats: &mut TransportStats,
    local: SocketAddr,
    src: SocketAddr,
    roce: &[u8],
    id: u16,
) -> bool {
    match check_icrc(local, src, roce.len(), roce, id) {
        IcrcCheck::Ok => {
            stats.rx_icrc_ok += 1;
            return true;
        }
        IcrcCheck::Unverifiable if !icrc.strict => {}
        IcrcCheck::Unverifiable | IcrcCheck::Bad => {
            stats.rx_icrc_bad += 1;
            return false;
        }
    }
    let IpAddr::V4(from) = src.ip().to_canonical() else {
        stats.rx_icrc_bad += 1;
        return false;
    };
    if !egress.allows(IpAddr::V4(from)) || !rxe_core::icrc::worth_solving(roce) {
        stats.rx_icrc_bad += 1;
        return false;
    }
    if let Some(q) = &icrc.qpns {
        // worth_solving parsed the BTH: at least 12 bytes.
        let dqpn = u32::from_be_bytes([0, roce[5], roce[6], roce[7]]);
        if !q.may_receive(dqpn) {
            stats.rx_icrc_no_qp += 1;
            return false;
        }
    }
    stats.rx_icrc_solves += 1;
    let Ok(Some(found)) =
        rxe_core::wire::frame::verify_icrc_from_udp_socket(src, local, roce, &mut icrc.solver)
    else {
        stats.rx_icrc_bad += 1;
        return false;
    };
    if found != 0 && rxe_core::icrc::may_be_run_index(found, roce.len()) {
        // A segment of a GSO run that reached a socket without GRO, cut by the kernel.
        stats.rx_icrc_id_solved += 1;
        return true;
    }
    let now_ms = icrc.epoch.elapsed().as_millis() as u64;
    // RC packets are resent when dropped; UD and UC ones are not.
    let reliable = roce[0] >> 5 == 0;
    let verdict = icrc.ids.lock().unwrap_or_else(|e| e.into_inner()).admit(
        u32::from(from),
        found,
        now_ms,
        !reliable,
    );
    match verdict {
        rxe_core::icrc::IdVerdict::InWindow => {
            stats.rx_icrc_id_solved += 1;
            true
        }
        rxe_core::icrc::IdVerdict::Opened => {
            stats.rx_icrc_id_solved += 1;
            stats.rx_icrc_id_opened += 1;
            true
        }
        rxe_core::icrc::IdVerdict::Learned => {
            stats.rx_icrc_id_learned += 1;
            false
        }
    }
}

// The receive side's run-index rule (`rxe_core::icrc::may_be_run_index`) is this sender's.
const _: () = assert!(
    GSO_MAX_SEGS == rxe_core::icrc::RUN_MAX_SEGS && GSO_MAX_BYTES == rxe_core::icrc::RUN_MAX_BYTES
);

fn check_icrc(local: SocketAddr, src: SocketAddr, n: usize, roce: &[u8], id: u16) -> IcrcCheck {
    let mut h = [0u8; 48];
    let udp_len = (8 + n) as u16;
    let l = match (src.ip().to_canonical(), local.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            h[0] = 0x45;
            h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
            h[4..6].copy_from_slice(&id.to_be_bytes());
            // DF.
            h[6] = 0x40;
            h[8] = 64;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            20
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            h[0] = 0x60;
            h[4..6].copy_from_slice(&udp_len.to_be_bytes());
            h[6] = 17;
            h[7] = 64;
            h[8..24].copy_from_slice(&s.octets());
            h[24..40].copy_from_slice(&d.octets());
            40
        }
        _ => return IcrcCheck::Bad,
    };
    h[l..l + 2].copy_from_slice(&src.port().to_be_bytes());
    h[l + 2..l + 4].copy_from_slice(&local.port().to_be_bytes());
    h[l + 4..l + 6].copy_from_slice(&udp_len.to_be_bytes());
    match rxe_core::icrc::verify(&h[..l + 8], roce) {
        Ok(()) => IcrcCheck::Ok,
        Err(_) if l == 20 => IcrcCheck::Unverifiable,
        Err(_) => IcrcCheck::Bad,
    }
}

enum IcrcCheck {
    Ok,
    Unverifiable,
    Bad,
}

/// A SEND_ONLY of "ping" in `buf` (ICRC slot zeroed); returns its length (tests).
#[cfg(test)]
pub(super) fn test_packet(buf: &mut [u8]) -> usize {
    use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};
    let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, 7, true);
    let (n, pr) = emit(buf, &bth, &ExtRepr::default(), 4).unwrap();
    buf[pr.start..pr.end].copy_from_slice(b"ping");
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(buf: &mut [u8]) -> usize {
        test_packet(buf)
    }

    /// `packet()` with its ICRC computed for `src` → `local` and the IPv4 ID `id`.
    fn packet_with_id(src: SocketAddr, local: SocketAddr, id: u16) -> ([u8; 256], usize) {
        let mut roce = [0u8; 256];
        let n = packet(&mut roce);
        let udp_len = (8 + n) as u16;
        let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), local.ip()) else {
            panic!("IPv4 addresses only");
        };
        let mut h = [0u8; 28];
        h[0] = 0x45;
        h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
        h[4..6].copy_from_slice(&id.to_be_bytes());
        h[6] = 0x40;
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&s.octets());
        h[16..20].copy_from_slice(&d.octets());
        h[20..22].copy_from_slice(&src.port().to_be_bytes());
        h[22..24].copy_from_slice(&local.port().to_be_bytes());
        h[24..26].copy_from_slice(&udp_len.to_be_bytes());
        rxe_core::icrc::fill(&h, &mut roce[..n]).unwrap();
        (roce, n)
    }

    fn rx_icrc(strict: bool) -> RxIcrc {
        RxIcrc {
            strict,
            solver: rxe_core::icrc::Ipv4IdSolver::new(),
            ids: Default::default(),
            epoch: std::time::Instant::now(),
            qpns: None,
        }
    }

    /// An IPv4 packet whose sender picked an IP ID other than 0 (as Linux rxe does): the
    /// first of a source teaches its ID and is dropped, the next of the sequence verifies by
    /// solving for the ID; strict mode refuses both; a corrupted one is dropped either way.
    #[test]
    fn ipv4_icrc_with_a_nonzero_id_is_solved_not_waved_through() {
        let src: SocketAddr = "10.1.2.3:49152".parse().unwrap();
        let local: SocketAddr = "10.1.2.4:4791".parse().unwrap();
        let any = EgressPolicy::default();
        let (first, n) = packet_with_id(src, local, 0xbeef);
        let (roce, _) = packet_with_id(src, local, 0xbef0);
        let mut strict = rx_icrc(true);
        let mut icrc = rx_icrc(false);
        let mut st = TransportStats::default();
        assert!(!verify_icrc(
            &mut icrc,
            &any,
            &mut st,
            local,
            src,
            &first[..n],
            0
        ));
        assert_eq!(
            (st.rx_icrc_ok, st.rx_icrc_id_learned, st.rx_icrc_bad),
            (0, 1, 0),
            "a source's first ID is learned, its packet dropped"
        );
        assert!(verify_icrc(
            &mut icrc,
            &any,
            &mut st,
            local,
            src,
            &roce[..n],
            0
        ));
        assert_eq!(
            (st.rx_icrc_ok, st.rx_icrc_id_solved, st.rx_icrc_bad),
            (0, 1, 0)
        );
        assert!(!verify_icrc(
            &mut strict,
            &any,
            &mut st,
            local,
            src,
            &roce[..n],
            0
        ));
        assert_eq!(st.rx_icrc_bad, 1, "strict: ID 0 only");
        // Strict, as segment 0xbef0 of a GRO run: that ID exactly.
        assert!(verify_icrc(
            &mut strict,
            &any,
            &mut st,
            local,
            src,
            &roce[..n],
            0xbef0
        ));
        assert_eq!(
            (st.rx_icrc_ok, st.rx_icrc_bad),
            (1, 1),
            "strict: the run index"
        );
        for bit in [0usize, 8 * 6 + 3, 8 * (n - 6)] {
            let mut bad = roce;
            bad[bit / 8] ^= 1 << (bit % 8);
            let before = (st.rx_icrc_bad, st.rx_icrc_id_learned);
            assert!(!verify_icrc(
                &mut icrc,
                &any,
                &mut st,
                local,
                src,
                &bad[..n],
                0
            ));
            assert_eq!(
                st.rx_icrc_bad + st.rx_icrc_id_learned,
                before.0 + before.1 + 1,
                "bit {bit} flipped must be dropped"
            );
        }
        // The source port is covered too.
        let other: SocketAddr = "10.1.2.3:49153".parse().unwrap();
        assert!(!verify_icrc(
            &mut icrc,
            &any,
            &mut st,
            local,
            other,
            &roce[..n],
            0
        ));
        // The sequence goes on past the corrupted packets.
        let (next, _) = packet_with_id(src, local, 0xbef1);
        assert!(verify_icrc(
            &mut icrc,
            &any,
            &mut st,
            local,
            src,
            &next[..n],
            0
        ));
    }

    /// What fails the cheap checks costs no solve: a source the egress policy refuses, a
    /// BTH the engine would drop (unknown opcode, transport version, P_Key), a packet too
    /// short for its opcode's headers.
    #[test]
    fn junk_costs_no_solve() {
        let src: SocketAddr = "10.1.2.3:49152".parse().unwrap();
        let local: SocketAddr = "10.1.2.4:4791".parse().unwrap();
        let (good, n) = packet_with_id(src, local, 0x1234);
        let only_10_9: EgressPolicy =
            EgressPolicy::new(local.ip(), vec!["10.9.0.0/16".parse().unwrap()]);
        let any = EgressPolicy::default();
        let mut icrc = rx_icrc(false);
        let mut st = TransportStats::default();
        assert!(!verify_icrc(
            &mut icrc,
            &only_10_9,
            &mut st,
            local,
            src,
            &good[..n],
            0
        ));
        let bad_bth: [fn(&mut [u8]); 3] = [
            |b| b[0] = 0x1f,        // an opcode nobody implements
            |b| b[1] |= 0x01,       // transport version 1
            |b| b[2..4].fill(0x12), // a P_Key that is not the default
        ];
        for f in bad_bth {
            let mut b = good;
            f(&mut b);
            assert!(!verify_icrc(
                &mut icrc,
                &any,
                &mut st,
                local,
                src,
                &b[..n],
                0
            ));
        }
        assert!(!verify_icrc(
            &mut icrc,
            &any,
            &mut st,
            local,
            src,
            &good[..15],
            0
        ));
        assert_eq!((st.rx_icrc_solves, st.rx_icrc_bad), (0, 5), "{st:?}");
        assert_eq!(icrc.solver.solves(), 0);
        // The same packet from an allowed source is solved (and its ID learned).
        assert!(!verify_icrc(
            &mut icrc,
            &any,
            &mut st,
            local,
            src,
            &good[..n],
            0
        ));
        assert_eq!((st.rx_icrc_solves, st.rx_icrc_id_learned), (1, 1));
    }
}
