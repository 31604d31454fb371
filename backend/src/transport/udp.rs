//! The `udp` transport: RoCEv2 over a kernel UDP socket (unprivileged).
//!
//! The socket is bound to one concrete address (the ICRC covers the source address, so it
//! must be known) and carries every QP's traffic. Datagrams go to `peer_port` (4791 unless
//! told otherwise) of the destination GID's address.
//!
//! ICRC on send: exact. IPv4 with `IP_PMTUDISC_DO` on an unconnected socket makes Linux pick
//! IP ID 0 and set DF, so the header the kernel writes is predictable
//! ([`rxe_core::wire::frame::icrc_for_udp_socket`]). IPv6 has no ID.
//!
//! ICRC on receive: IPv6 is verified in full. For IPv4 a UDP socket cannot see the IP ID the
//! sender chose. The receiver tries ID 0 first (what this daemon and any sender following the
//! rule above uses: `rx_icrc_ok`), or a GRO datagram's index in its run. Otherwise (Linux rxe
//! numbers its IDs per destination), unless `strict_icrc`, a packet that passes the cheap
//! checks (source allowed, a BTH the engine would take) is solved for its ID
//! ([`rxe_core::icrc::Ipv4IdSolver`]: the CRC is affine in the ID's 16 bits, the ID unique) and
//! accepted only when that ID is a GSO run index or lies in a window of its source's ID
//! sequence ([`rxe_core::icrc::Ipv4IdWindows`]: `rx_icrc_id_solved`); an ID outside every
//! window is learned and its packet dropped (`rx_icrc_id_learned`), but for a UD/UC packet
//! whose source has no window yet (`rx_icrc_id_opened`); anything else is dropped
//! (`rx_icrc_bad`). docs/daemon.md, "ICRC over a UDP socket", has the measured bounds.
//!
//! UDP GSO ([`UdpTransport::enable_gso`]): consecutive packets to one destination whose
//! lengths are equal (the last of a run may be shorter) leave in one `sendmsg` with
//! `UDP_SEGMENT`, and whoever segments them — the kernel's software GSO, a NIC's USO, or the
//! receiving socket on loopback and veth — cuts exactly there, so each segment is the packet
//! whose ICRC was computed. IPv6 has no field the segmenter picks. IPv4 has the ID: the
//! kernel gives the run the ID 0 (DF, unconnected socket, as above) and each segment the
//! run's ID plus its index (`inet_gso_segment`), so segment k's ICRC is computed for ID k
//! (the ICRC is affine in the ID: [`rxe_core::icrc::Ipv4IdBasis::contribution`]). A packet
//! that leaves alone (a refused run included) carries the ICRC for ID 0. A receiver that
//! gets a run coalesced (GRO) tries each datagram's index in it first. GSO needs the UDP
//! checksum, so a socket with GSO sends one (the ICRC masks the field; receivers verify it
//! as usual).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use rxe_core::device::{RecvMeta, Transmit};

use rxe_core::wire::frame::icrc_for_udp_socket;
use rxe_core::Gid;

use crate::sys::{setsockopt, sockaddr_from, sockaddr_to};
use crate::transport::egress::EgressPolicy;
use crate::transport::sink::PacketSink;
pub use crate::transport::stats::TransportStats;

/// Packets sent with one `sendmmsg`.
pub const TX_BATCH: usize = 32;
/// Datagrams received with one `recvmmsg`.
pub const RX_BATCH: usize = 32;
/// Room per packet: a 4096-byte path MTU plus every RoCE header and the ICRC.
const TX_SLOT: usize = 4096 + 256;
/// Distance between two send slots: whole pages, so that every slot starts at the same
/// offset in its page ([`TX_PAGE_OFFSET`]).
const TX_STRIDE: usize = 8192;
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
const GSO_REFUSALS_OFF: u32 = 8;
/// Room for one `UDP_SEGMENT` cmsg (CMSG_SPACE of a u16), as u64s for the alignment.
const GSO_CMSG_WORDS: usize = 3;
/// Socket errors one receive call takes (each counted) before it gives up and reports the
/// socket as failing ([`UdpTransport::rx_failing`]).
pub const RX_ERROR_LIMIT: u32 = 16;
pub struct UdpTransport {
    sock: UdpSocket,
    local: SocketAddr,
    peer_port: u16,
    /// How received ICRCs are checked ([`verify_icrc`]); its solver also serves the send
    /// side (with GSO) to put a packet's ID, its index in its run, into its ICRC.
    icrc: Box<RxIcrc>,
    egress: EgressPolicy,
    pub stats: TransportStats,
    /// Packets waiting for `sendmmsg`: `TX_BATCH` slots of `TX_SLOT` bytes, slot `i` at
    /// `tx_base + i * TX_STRIDE` ([`UdpTransport::slot`]).
    tx_buf: Vec<u8>,
    tx_base: usize,
    tx_pending: Vec<(usize, SocketAddr)>,
    /// The last `sendmmsg` found the socket buffer full; `tx_pending` holds what it did not
    /// take, sent first once the socket is writable again.
    tx_blocked: bool,
    /// Runs of equal-length packets to one destination leave as one UDP GSO send.
    gso: bool,
    /// GSO sends refused in a row ([`GSO_REFUSALS_OFF`]).
    gso_refusals: u32,
    /// The last receive gave up after [`RX_ERROR_LIMIT`] errors in a row.
    rx_failing: bool,
    rx: RxBatch,
    /// `--same-host`: the other ports of this process, reached without the socket.
    same_host: Option<crate::transport::same_host::Link>,
    /// The guest memory of the packets being built, while a pump runs (`--same-host`).
    payload_src: Option<std::sync::Arc<crate::memory::guest_mem::GuestMemoryMmap>>,
    /// Payload bytes of a packet to another port of the process (`--same-host-segment`).
    segment: usize,
    /// `--io-thread`: full batches go to the I/O thread instead of the socket
    /// ([`crate::transport::io_thread`]).
    offload: Option<crate::transport::io_thread::TxOffload>,
}

/// `recvmmsg` state: buffers, source addresses, and the datagrams found in them.
struct RxBatch {
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
    gro: bool,
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

    /// No buffers: a transport half that does not receive ([`UdpTransport::recv_batch`]
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
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    setsockopt(fd, level, name, &v)
}

/// `UDP_NO_CHECK6_TX` / `UDP_NO_CHECK6_RX` (linux/udp.h).
const UDP_NO_CHECK6_TX: i32 = 101;
const UDP_NO_CHECK6_RX: i32 = 102;

impl UdpTransport {
    pub fn bind(addr: SocketAddr, peer_port: u16, strict_icrc: bool) -> io::Result<Self> {
        if addr.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the udp transport needs a concrete bind address (the ICRC covers it)",
            ));
        }
        let sock = UdpSocket::bind(addr)?;
        Self::with_socket(sock, peer_port, strict_icrc, Default::default())
    }

    /// `n` transports on `addr` in a steered group ([`crate::transport::steer`]): the kernel hands
    /// transport `k` the RoCE packets whose destination QPN is `k` modulo `n`, the QPs of
    /// engine shard `k`. Each sends from the same address.
    pub fn bind_steered(
        addr: SocketAddr,
        peer_port: u16,
        strict_icrc: bool,
        n: u32,
    ) -> io::Result<Vec<Self>> {
        if addr.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the udp transport needs a concrete bind address (the ICRC covers it)",
            ));
        }
        // One source's packets reach every socket of the group (by QPN) but carry one ID
        // sequence: the group shares the windows it learns.
        let ids = std::sync::Arc::<std::sync::Mutex<_>>::default();
        crate::transport::steer::bind_steered(addr, n)?
            .into_iter()
            .map(|s| Self::with_socket(s, peer_port, strict_icrc, std::sync::Arc::clone(&ids)))
            .collect()
    }

    /// A transport on the bound socket `sock`.
    fn with_socket(
        sock: UdpSocket,
        peer_port: u16,
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
        let b = Self::new_batch();
        Ok(UdpTransport {
            sock,
            local,
            peer_port,
            icrc: Box::new(RxIcrc {
                strict: strict_icrc,
                solver: rxe_core::icrc::Ipv4IdSolver::new(),
                ids,
                epoch: std::time::Instant::now(),
            }),
            egress: EgressPolicy::default(),
            stats: TransportStats::default(),
            tx_buf: b.buf,
            tx_base: b.base,
            tx_pending: b.pending,
            tx_blocked: false,
            gso: false,
            gso_refusals: 0,
            rx_failing: false,
            same_host: None,
            payload_src: None,
            segment: 0,
            rx: RxBatch::new(false),
            offload: None,
        })
    }

    /// An empty send batch: [`TX_BATCH`] slots, each starting [`TX_PAGE_OFFSET`] into a page.
    pub(crate) fn new_batch() -> crate::transport::io_thread::TxBatch {
        let buf = vec![0u8; TX_BATCH * TX_STRIDE + 4096];
        // The heap block never moves (the vector is never grown), so neither do the slots.
        let base = (TX_PAGE_OFFSET + 4096 - buf.as_ptr() as usize % 4096) % 4096;
        crate::transport::io_thread::TxBatch {
            buf,
            base,
            pending: Vec::with_capacity(TX_BATCH),
        }
    }

    /// The I/O thread's half of this transport (`--io-thread`): the same socket (a duplicate
    /// fd), address, GSO and ICRC rules, with its own send and receive buffers and counters.
    pub(crate) fn io_half(&self) -> io::Result<UdpTransport> {
        let b = Self::new_batch();
        Ok(UdpTransport {
            sock: self.sock.try_clone()?,
            local: self.local,
            peer_port: self.peer_port,
            icrc: Box::new(RxIcrc {
                strict: self.icrc.strict,
                solver: rxe_core::icrc::Ipv4IdSolver::new(),
                ids: std::sync::Arc::clone(&self.icrc.ids),
                epoch: self.icrc.epoch,
            }),
            egress: self.egress.clone(),
            stats: TransportStats::default(),
            tx_buf: b.buf,
            tx_base: b.base,
            tx_pending: b.pending,
            tx_blocked: false,
            gso: self.gso,
            gso_refusals: 0,
            rx_failing: false,
            rx: RxBatch::new(self.rx.gro),
            same_host: None,
            payload_src: None,
            segment: 0,
            offload: None,
        })
    }

    /// Hands full batches to the I/O thread from now on; this half no longer receives (its
    /// receive buffers are let go).
    pub(crate) fn set_offload(&mut self, o: crate::transport::io_thread::TxOffload) {
        self.offload = Some(o);
        self.rx = RxBatch::none();
    }

    /// The I/O thread's inbox of received packets (`--io-thread`).
    pub fn io_inbox(&self) -> Option<std::sync::Arc<crate::transport::same_host::Inbox>> {
        self.offload.as_ref().map(|o| o.inbox().clone())
    }

    /// The counters of both halves with `--io-thread` (the socket's traffic is the I/O
    /// thread's), else this transport's.
    pub fn all_stats(&self) -> TransportStats {
        match &self.offload {
            Some(o) => self.stats.plus(&o.io_stats()),
            None => self.stats,
        }
    }

    /// Whether packets the socket did not take wait (the I/O thread's half).
    pub(crate) fn tx_blocked_now(&self) -> bool {
        self.tx_blocked
    }

    /// Sends what the socket did not take before (the I/O thread's half).
    pub(crate) fn send_held(&mut self) {
        self.send_pending();
    }

    /// Sends `b` (the I/O thread's half; nothing may be held, [`Self::tx_blocked_now`]);
    /// what the socket does not take stays held. Returns an empty batch.
    pub(crate) fn send_batch(
        &mut self,
        mut b: crate::transport::io_thread::TxBatch,
    ) -> crate::transport::io_thread::TxBatch {
        debug_assert!(self.tx_pending.is_empty());
        std::mem::swap(&mut self.tx_buf, &mut b.buf);
        std::mem::swap(&mut self.tx_base, &mut b.base);
        std::mem::swap(&mut self.tx_pending, &mut b.pending);
        b.pending.clear();
        self.send_pending();
        b
    }

    /// The worker's half: hands the pending batch to the I/O thread, or holds it while the
    /// channel is full ([`PacketSink::blocked`]).
    fn hand_off(&mut self) {
        let Some(off) = &mut self.offload else {
            return;
        };
        if self.tx_pending.is_empty() {
            self.tx_blocked = false;
            return;
        }
        let mut spare = off.spare();
        std::mem::swap(&mut self.tx_buf, &mut spare.buf);
        std::mem::swap(&mut self.tx_base, &mut spare.base);
        std::mem::swap(&mut self.tx_pending, &mut spare.pending);
        // `spare` is now the full batch.
        match off.send(spare) {
            Ok(()) => self.tx_blocked = false,
            Err(crate::transport::io_thread::Refused::Full(mut b)) => {
                // Keep it, in order, for the next flush; the I/O thread wakes the worker.
                std::mem::swap(&mut self.tx_buf, &mut b.buf);
                std::mem::swap(&mut self.tx_base, &mut b.base);
                std::mem::swap(&mut self.tx_pending, &mut b.pending);
                off.keep(b);
                self.stats.tx_blocked += 1;
                self.tx_blocked = true;
            }
            Err(crate::transport::io_thread::Refused::Gone(b)) => {
                self.stats.tx_dropped += b.pending.len() as u64;
                self.tx_blocked = false;
            }
        }
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

    /// Where packets may go ([`EgressPolicy`]); everything before this is called.
    pub fn set_egress(&mut self, p: EgressPolicy) {
        self.egress = p;
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The GID of the bound address.
    pub fn gid(&self) -> Gid {
        Gid::from_ip(self.local.ip())
    }

    /// Fills the ICRC of one packet (BTH … zeroed ICRC slot); returns its destination.
    fn prepare(&mut self, t: &Transmit, roce: &mut [u8]) -> Option<SocketAddr> {
        let dst = self.route(t)?;
        if icrc_for_udp_socket(self.local, dst, roce).is_err() {
            self.stats.tx_dropped += 1;
            return None;
        }
        Some(dst)
    }

    /// The bytes of send slot `i`.
    fn slot(&self, i: usize) -> std::ops::Range<usize> {
        let at = self.tx_base + i * TX_STRIDE;
        at..at + TX_SLOT
    }

    /// Where `t` goes, if the address family and the egress policy let it go anywhere.
    fn route(&mut self, t: &Transmit) -> Option<SocketAddr> {
        let dst_ip = t.dst.to_ip();
        if dst_ip.is_ipv4() != self.local.is_ipv4() {
            self.stats.tx_wrong_family += 1;
            return None;
        }
        if !self.egress.allows(dst_ip) {
            // As a destination without a route: the packet is lost (the requester retries
            // and ends with RETRY_EXC_ERR; a UD datagram is gone).
            self.stats.tx_denied += 1;
            return None;
        }
        Some(SocketAddr::new(dst_ip, self.peer_port))
    }

    /// Joins the same-host shortcut: packets to another port of `link`'s hub go there
    /// instead of to the socket ([`crate::transport::same_host`]).
    /// `segment`: the payload bytes an RC packet to another port may carry (0: one path
    /// MTU; [`PacketSink::segment`]).
    pub fn set_same_host(&mut self, link: crate::transport::same_host::Link, segment: usize) {
        self.same_host = Some(link);
        self.segment = segment;
    }

    /// The guest memory the packets of the next pump are built from: packets to another
    /// port of the process may then refer to it instead of carrying their payload.
    pub fn set_payload_source(
        &mut self,
        mem: Option<std::sync::Arc<crate::memory::guest_mem::GuestMemoryMmap>>,
    ) {
        self.payload_src = mem;
    }

    /// This port's same-host inbox, with the shortcut on.
    pub fn same_host_inbox(&self) -> Option<&std::sync::Arc<crate::transport::same_host::Inbox>> {
        self.same_host.as_ref().map(|l| l.inbox())
    }

    /// Sends one packet at once (BTH … zeroed ICRC slot); fills the ICRC first.
    pub fn send(&mut self, t: &Transmit, roce: &mut [u8]) {
        let Some(dst) = self.prepare(t, roce) else {
            return;
        };
        match self.sock.send_to(roce, dst) {
            Ok(_) => {
                self.stats.tx_packets += 1;
                self.stats.tx_bytes += roce.len() as u64;
            }
            // A full socket buffer is loss: the engine's retransmission covers it.
            Err(_) => self.stats.tx_dropped += 1,
        }
    }

    /// Sends the queued packets with as few `sendmmsg` calls as the kernel allows; with GSO,
    /// each run of packets [`Self::gso_run`] finds is one message of that call.
    fn send_pending(&mut self) {
        // With an I/O thread: hand the batch over, unless it is a few packets (an ACK, a lone
        // small message) and the thread sleeps with nothing in hand: then send them here and
        // spare it a wake-up. Larger batches always go to it, busy or not.
        match &self.offload {
            Some(o)
                if self.tx_pending.len() > crate::transport::io_thread::INLINE_MAX
                    || !o.io_idle() =>
            {
                return self.hand_off()
            }
            Some(o) if !self.tx_pending.is_empty() => o.sent_inline(),
            _ => {}
        }
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
        for (i, &(_, dst)) in self.tx_pending.iter().enumerate() {
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
        'build: while done < n {
            // This pass's messages: a packet's ICRC first takes the IPv4 ID the kernel will
            // write (its index in its GSO run), then its iovec points at it.
            let mut m = 0usize;
            let mut i = done;
            while i < n {
                let count = if gso { self.gso_run(i) } else { 1 };
                for k in 0..count {
                    let id = if count > 1 { k as u16 } else { 0 };
                    self.set_ip_id(&mut ids, i + k, id);
                }
                runs[m] = (i, count);
                m += 1;
                i += count;
            }
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
            let mut sent = 0usize;
            while sent < m {
                // SAFETY: `msgs[sent..m]` are initialised headers whose name, iovec, control
                // and data pointers point into `names`, `iov`, `cmsgs` and `self.tx_buf`, all
                // alive and unmoved for the duration of the call.
                let r = unsafe {
                    libc::sendmmsg(
                        self.sock.as_raw_fd(),
                        msgs[sent..m].as_mut_ptr(),
                        (m - sent) as libc::c_uint,
                        0,
                    )
                };
                if r > 0 {
                    for &(first, count) in &runs[sent..sent + r as usize] {
                        for &(len, _) in &self.tx_pending[first..first + count] {
                            self.stats.tx_packets += 1;
                            self.stats.tx_bytes += len as u64;
                        }
                        if count > 1 {
                            self.stats.tx_gso_sends += 1;
                            self.stats.tx_gso_segments += count as u64;
                            self.gso_refusals = 0;
                        }
                        done = first + count;
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
                    for i in done..n {
                        self.set_ip_id(&mut ids, i, 0);
                    }
                    self.keep_unsent(done);
                    if self.offload.is_some() {
                        self.hand_off();
                    }
                    return;
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
                    gso = false;
                    done = first;
                    continue 'build;
                }
                // An error of this packet (an ICMP error reported on this call, a route that
                // refuses it) loses it: the engine's retransmission covers it. Try the rest.
                self.stats.tx_dropped += 1;
                done = first + 1;
                sent += 1;
            }
        }
        self.tx_pending.clear();
        self.tx_blocked = false;
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

    /// How many packets from `first` on can leave as one GSO send: the same destination,
    /// the same length as the first (the last of the run may be shorter), within
    /// [`GSO_MAX_BYTES`] and [`GSO_MAX_SEGS`].
    fn gso_run(&self, first: usize) -> usize {
        let (len, dst) = self.tx_pending[first];
        let mut bytes = len;
        let mut count = 1;
        for &(l, d) in &self.tx_pending[first + 1..] {
            if d != dst || l > len || bytes + l > GSO_MAX_BYTES || count == GSO_MAX_SEGS {
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
    fn keep_unsent(&mut self, done: usize) {
        for i in done..self.tx_pending.len() {
            let (len, _) = self.tx_pending[i];
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
        if !verify_icrc(
            &mut self.icrc,
            &self.egress,
            &mut self.stats,
            self.local,
            src,
            bytes,
            seg.index,
        ) {
            return None;
        }
        let meta = self.meta(src);
        Some((meta, &self.rx.buf[at..at + n]))
    }

    fn meta(&self, src: SocketAddr) -> RecvMeta {
        RecvMeta {
            src: Gid::from_ip(unmap(src.ip())),
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
    pub fn recv(&mut self, buf: &mut [u8]) -> Option<(RecvMeta, usize)> {
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

impl PacketSink for UdpTransport {
    fn next_buf(&mut self) -> &mut [u8] {
        let r = self.slot(self.tx_pending.len());
        &mut self.tx_buf[r]
    }

    fn push(&mut self, t: &Transmit) {
        let i = self.tx_pending.len();
        let len = t.len.min(TX_SLOT);
        let at = self.slot(i).start;
        let Some(dst) = self.route(t) else {
            return;
        };
        if let Some(l) = &mut self.same_host {
            if l.deliver(t, &self.tx_buf[at..at + len]) {
                return;
            }
        }
        if icrc_for_udp_socket(self.local, dst, &mut self.tx_buf[at..at + len]).is_err() {
            self.stats.tx_dropped += 1;
            return;
        }
        self.tx_pending.push((len, dst));
        if self.tx_pending.len() == TX_BATCH {
            self.send_pending();
        }
    }

    fn flush(&mut self) {
        self.send_pending();
        if let Some(l) = &mut self.same_host {
            l.flush();
        }
    }

    fn blocked(&self) -> bool {
        self.tx_blocked
    }

    fn takes_refs(&self) -> bool {
        self.same_host.is_some() && self.payload_src.is_some()
    }

    fn wants_refs(&mut self, t: &Transmit) -> bool {
        self.payload_src.is_some()
            && self
                .same_host
                .as_mut()
                .is_some_and(|l| l.reaches(t.dst.to_ip()))
    }

    fn segment(&self) -> usize {
        self.segment
    }

    fn in_memory(&self, dst: &Gid) -> bool {
        self.segment > 0
            && self.payload_src.is_some()
            && self
                .same_host
                .as_ref()
                .is_some_and(|l| l.reaches_now(dst.to_ip()))
    }

    fn push_refs(
        &mut self,
        t: &Transmit,
        roce: &[u8],
        refs: &[crate::memory::payload_ref::PayloadRef],
    ) {
        if self.route(t).is_none() {
            return;
        }
        let src = self.payload_src.clone();
        let roce = &roce[..t.len.min(roce.len())];
        if let Some(l) = &mut self.same_host {
            if l.deliver_refs(t, roce, refs, src.as_ref()) {
                return;
            }
        }
        // Not another port after all (wants_refs said it was): the packet whole, by the wire.
        let r = self.slot(self.tx_pending.len());
        if roce.len() > r.len() {
            self.stats.tx_dropped += 1;
            return;
        }
        let dst = &mut self.tx_buf[r.start..r.start + roce.len()];
        crate::memory::payload_ref::copy_unreferenced(roce, refs, dst);
        if let Some(src) = &src {
            crate::memory::payload_ref::resolve(src, refs, dst);
        }
        self.push(t);
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
}

/// Checks a received datagram's ICRC and counts the verdict; false when it must be dropped.
/// `id`: the IPv4 ID tried first and exactly (its index in a GRO run, 0 for a datagram
/// alone). Otherwise, unless strict, an IPv4 packet that passes the cheap checks (a source
/// the egress policy allows, a BTH the engine would look at: [`rxe_core::icrc::worth_solving`])
/// is solved for its ID, and accepted only if that ID lies in a window of its source's ID
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
    let IpAddr::V4(from) = unmap(src.ip()) else {
        stats.rx_icrc_bad += 1;
        return false;
    };
    if !egress.allows(IpAddr::V4(from)) || !rxe_core::icrc::worth_solving(roce) {
        stats.rx_icrc_bad += 1;
        return false;
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
    let l = match (unmap(src.ip()), local.ip()) {
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

fn unmap(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};

    fn packet(buf: &mut [u8]) -> usize {
        let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, 7, true);
        let (n, pr) = emit(buf, &bth, &ExtRepr::default(), 4).unwrap();
        buf[pr.start..pr.end].copy_from_slice(b"ping");
        n
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

    /// ICMP errors reported on the socket are counted and do not stop the receive path:
    /// datagrams that arrive after them are still read.
    #[test]
    fn receive_errors_are_counted_and_bounded() {
        let Ok(mut ta) = UdpTransport::bind("127.0.0.1:0".parse().unwrap(), 0, false) else {
            vur_testkit::skip(
                "receive_errors_are_counted_and_bounded",
                "127.0.0.1 cannot be bound",
            );
            return;
        };
        // A port nobody listens on: each datagram sent there comes back as ECONNREFUSED
        // (reported on an unconnected socket with IP_RECVERR).
        setsockopt_int(ta.fd(), libc::IPPROTO_IP, libc::IP_RECVERR, 1).unwrap();
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dead = closed.local_addr().unwrap();
        drop(closed);
        for _ in 0..3 {
            ta.sock.send_to(b"x", dead).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
            let _ = ta.recv_batch();
        }
        assert!(ta.stats.rx_errors >= 1, "{:?}", ta.stats);
        assert!(!ta.rx_failing(), "a few errors are not a failing socket");
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(&[0u8; 20], ta.local_addr()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(ta.drop_unattached(RX_BATCH * 4), 1);
        assert_eq!(ta.stats.rx_unattached, 1);
    }

    /// A full socket buffer keeps the packets it did not take, in order, for the next flush;
    /// the transport says it is blocked meanwhile (the pump then takes nothing more).
    #[test]
    fn packets_the_socket_did_not_take_wait_in_order() {
        let Ok(mut ta) = UdpTransport::bind("127.0.0.1:0".parse().unwrap(), 0, false) else {
            vur_testkit::skip(
                "packets_the_socket_did_not_take_wait_in_order",
                "127.0.0.1 cannot be bound",
            );
            return;
        };
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let dst = rx.local_addr().unwrap();
        for i in 0..4u8 {
            let buf = ta.next_buf();
            buf[..3].copy_from_slice(&[i, i, i]);
            ta.tx_pending.push((3, dst));
        }
        // As after a sendmmsg that took the first packet and then met EAGAIN.
        ta.tx_blocked = true;
        ta.keep_unsent(1);
        assert!(ta.blocked());
        assert_eq!(ta.tx_pending.len(), 3);
        ta.flush();
        assert!(!ta.blocked());
        let mut b = [0u8; 16];
        for i in 1..4u8 {
            let n = rx.recv(&mut b).unwrap();
            assert_eq!(&b[..n], &[i, i, i]);
        }
        assert_eq!(ta.stats.tx_packets, 3);
    }

    /// Builds packet `i` of a run in the next slot: a SEND of `payload` bytes with PSN `i`.
    fn push_send(t: &mut UdpTransport, dst: Gid, i: u32, payload: usize) {
        let buf = t.next_buf();
        let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, i, true);
        let (n, pr) = emit(buf, &bth, &ExtRepr::default(), payload).unwrap();
        buf[pr.start..pr.end].fill(i as u8);
        let tx = Transmit {
            len: n,
            src: t.gid(),
            dst,
            sport: 0,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
            dmac: [0; 6],
            qpn: rxe_core::Qpn(0x12),
        };
        t.push(&tx);
    }

    /// Reads datagrams until `n` arrived or 2 s passed; returns (PSN, length) of each.
    fn receive_n(t: &mut UdpTransport, n: usize) -> Vec<(u32, usize)> {
        let mut got = Vec::new();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < n && std::time::Instant::now() < end {
            let k = t.recv_batch();
            if k == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            for i in 0..k {
                let Some((_, rb)) = t.packet(i) else {
                    continue;
                };
                let psn = u32::from_be_bytes([0, rb[9], rb[10], rb[11]]);
                assert!(
                    rb[12..rb.len() - 4].iter().all(|&b| b == psn as u8),
                    "segment {psn}: payload is not its own"
                );
                got.push((psn, rb.len()));
            }
        }
        got
    }

    /// With GSO, over IPv6 and over IPv4: a batch of equal packets to one peer (the last
    /// shorter) leaves in few sends and arrives as the same datagrams, in order, each with the
    /// ICRC it was given (strict checking on: over IPv4, each segment's ICRC is for its index
    /// in the run, the ID the kernel writes); a shorter packet ends a run. A receiver with GRO
    /// gets the runs whole and cuts them into the same datagrams; one without gets them one
    /// by one, cut by the kernel (over IPv4 the ID solved from each is its index: what Linux
    /// rxe, which checks the header it sees, gets). A run the kernel refuses goes out packet
    /// by packet, each ICRC for ID 0 again.
    #[test]
    fn gso_runs_arrive_as_the_packets_they_were_ipv6() {
        gso_runs_arrive_as_the_packets_they_were("::1");
    }

    #[test]
    fn gso_runs_arrive_as_the_packets_they_were_ipv4() {
        gso_runs_arrive_as_the_packets_they_were("127.0.0.1");
    }

    fn gso_runs_arrive_as_the_packets_they_were(ip: &str) {
        let v4 = !ip.contains(':');
        let at: SocketAddr = SocketAddr::new(ip.parse().unwrap(), 0);
        let (mut ta, mut tb, mut tc) = match (
            UdpTransport::bind(at, 0, true),
            UdpTransport::bind(at, 0, true),
        ) {
            (Ok(a), Ok(b)) => {
                // Strict over IPv6; over IPv4 a receiver without GRO cannot see the IDs of
                // the segments the kernel cut: it solves for them.
                let c = UdpTransport::bind(at, 0, !v4).unwrap();
                (a, b, c)
            }
            (Err(e), _) | (_, Err(e)) => {
                vur_testkit::skip(
                    "gso_runs_arrive_as_the_packets_they_were",
                    &format!("{ip} cannot be bound ({e}): GSO was not checked"),
                );
                return;
            }
        };
        assert!(ta.enable_gso().unwrap());
        assert!(tb.enable_gso().unwrap());
        assert!(tb.rx.gro, "UDP GRO on a 6.x kernel");
        ta.peer_port = tb.local_addr().port();
        let dst = tb.gid();
        // 20 packets of 4 KiB (GSO_MAX_BYTES splits them 15 + 5), one of 1000 B ending the
        // second run, then a third run of two: 4 KiB and a 64 B tail.
        for i in 0..20 {
            push_send(&mut ta, dst, i, 4096);
        }
        push_send(&mut ta, dst, 20, 1000);
        push_send(&mut ta, dst, 21, 4096);
        push_send(&mut ta, dst, 22, 64);
        ta.flush();
        let got = receive_n(&mut tb, 23);
        let psns: Vec<u32> = got.iter().map(|g| g.0).collect();
        assert_eq!(psns, (0..23).collect::<Vec<_>>(), "every packet, in order");
        assert!(got[..20].iter().all(|g| g.1 == 12 + 4096 + 4), "{got:?}");
        assert_eq!(got[20].1, 12 + 1000 + 4);
        assert_eq!(
            (got[21].1, got[22].1),
            (12 + 4096 + 4, 12 + 64 + 4),
            "the short tail"
        );
        assert_eq!(tb.stats.rx_icrc_ok, 23);
        assert_eq!(tb.stats.rx_icrc_bad, 0);
        assert_eq!(
            (ta.stats.tx_gso_sends, ta.stats.tx_gso_segments),
            (3, 23),
            "runs of 15, 6 (the 1000 B packet ends the second) and 2; {:?}",
            ta.stats
        );
        assert_eq!(ta.stats.tx_packets, 23);
        assert!(
            tb.stats.rx_gro_runs >= 1 && tb.stats.rx_gro_segments >= 6,
            "the runs arrive coalesced on loopback: {:?}",
            tb.stats
        );
        // A receiver without GRO gets the same run as separate datagrams (the kernel cuts it
        // at the receiving socket), each ICRC right.
        ta.peer_port = tc.local_addr().port();
        for i in 0..6 {
            push_send(&mut ta, tc.gid(), i, 4096);
        }
        ta.flush();
        assert_eq!(receive_n(&mut tc, 6).len(), 6);
        let (exact, solved) = if v4 { (1, 5) } else { (6, 0) };
        assert_eq!(
            (
                tc.stats.rx_icrc_ok,
                tc.stats.rx_icrc_id_solved,
                tc.stats.rx_gro_runs
            ),
            (exact, solved, 0)
        );
        assert_eq!(ta.stats.tx_gso_sends, 4);
        // The IDs the kernel gave the segments it cut, seen as a plain socket sees them.
        let plain = UdpSocket::bind(at).unwrap();
        plain
            .set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        ta.peer_port = plain.local_addr().unwrap().port();
        for i in 0..6 {
            push_send(&mut ta, tc.gid(), i, 4096);
        }
        ta.flush();
        assert_eq!(ta.stats.tx_gso_sends, 5);
        let mut solver = rxe_core::icrc::Ipv4IdSolver::new();
        let local = plain.local_addr().unwrap();
        for k in 0..6u16 {
            let mut buf = [0u8; 8192];
            let (n, from) = plain
                .recv_from(&mut buf)
                .unwrap_or_else(|e| panic!("segment {k} of the run did not come: {e}"));
            let id = rxe_core::wire::frame::verify_icrc_from_udp_socket(
                from,
                local,
                &buf[..n],
                &mut solver,
            )
            .expect("a right ICRC");
            assert_eq!(id, v4.then_some(k), "segment {k}: its ID is its index");
        }
        ta.peer_port = tb.local_addr().port();
        // Without GSO every packet is its own send.
        tc.peer_port = tb.local_addr().port();
        for i in 0..8 {
            push_send(&mut tc, dst, i, 4096);
        }
        tc.flush();
        assert_eq!(receive_n(&mut tb, 8).len(), 8);
        assert_eq!(tc.stats.tx_gso_sends, 0);
        // A kernel that refuses GSO (here: the checksum turned off behind the transport's
        // back, EINVAL) loses nothing: each run goes out packet by packet, its ICRCs for ID 0
        // again (the strict receiver checks); GSO stays on for the next batch until
        // GSO_REFUSALS_OFF refusals in a row, then it is off.
        if v4 {
            setsockopt_int(ta.fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).unwrap();
        } else {
            setsockopt_int(ta.fd(), libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, 1).unwrap();
        }
        let ok_before = tb.stats.rx_icrc_ok;
        for batch in 0..GSO_REFUSALS_OFF {
            assert!(ta.gso(), "still on after {batch} refusals");
            for i in 0..3 {
                push_send(&mut ta, dst, batch * 3 + i, 4096);
            }
            ta.flush();
        }
        let n = 3 * GSO_REFUSALS_OFF as usize;
        assert_eq!(receive_n(&mut tb, n).len(), n, "{:?}", ta.stats);
        assert_eq!(tb.stats.rx_icrc_ok - ok_before, n as u64);
        assert_eq!(ta.stats.tx_gso_refused, GSO_REFUSALS_OFF as u64);
        assert!(!ta.gso());
        assert_eq!(ta.stats.tx_gso_sends, 5);
        assert_eq!(ta.stats.tx_packets, 35 + n as u64);
    }

    /// Two sockets on loopback: what one sends the other verifies (ID 0 over IPv4), and a
    /// corrupted packet is caught over IPv6 (where the check is complete). A family whose
    /// loopback cannot be bound is skipped with a line saying so; when neither can, the test
    /// fails under CI=true (where both must work) and says so otherwise.
    #[test]
    fn icrc_round_trip_over_real_sockets() {
        let mut checked = Vec::new();
        for (a, b) in [("127.0.0.1:0", "127.0.0.1:0"), ("[::1]:0", "[::1]:0")] {
            let mut ta = match UdpTransport::bind(a.parse().unwrap(), 0, true) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("skip {a}: {e}");
                    continue;
                }
            };
            let mut tb = UdpTransport::bind(b.parse().unwrap(), 0, true).unwrap();
            ta.peer_port = tb.local_addr().port();
            let mut buf = [0u8; 256];
            let n = packet(&mut buf);
            let t = Transmit {
                len: n,
                src: ta.gid(),
                dst: tb.gid(),
                sport: 0,
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
                dmac: [0; 6],
                qpn: rxe_core::Qpn(0x11),
            };
            ta.send(&t, &mut buf[..n]);
            let mut rb = [0u8; 256];
            let mut got = None;
            for _ in 0..1000 {
                if let Some(r) = tb.recv(&mut rb) {
                    got = Some(r);
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let (meta, len) = got.expect("datagram");
            assert_eq!(len, n);
            assert_eq!(meta.src, ta.gid());
            assert_eq!(tb.stats.rx_icrc_ok, 1);
            // Corrupt one payload byte after the ICRC was computed.
            buf[n - 5] ^= 1;
            ta.sock
                .send_to(&buf[..n], tb.local_addr())
                .expect("raw send");
            let mut dropped = false;
            for _ in 0..200 {
                if tb.recv(&mut rb).is_some() {
                    break;
                }
                if tb.stats.rx_icrc_bad == 1 {
                    dropped = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert!(dropped, "corrupted packet must be dropped in strict mode");
            checked.push(a);
        }
        if checked.is_empty() {
            vur_testkit::skip(
                "icrc_round_trip_over_real_sockets",
                "neither 127.0.0.1 nor ::1 could be bound: nothing was checked",
            );
        }
    }

    /// Waits up to 2 s for `n` packets in `inbox`; returns (PSN, length) of each, checking
    /// that each carries its own payload.
    fn inbox_n(inbox: &crate::transport::same_host::Inbox, n: usize) -> Vec<(u32, usize)> {
        let mut got = Vec::new();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while got.len() < n && std::time::Instant::now() < end {
            let k = inbox.drain(usize::MAX, |_, rb, _| {
                let psn = u32::from_be_bytes([0, rb[9], rb[10], rb[11]]);
                assert!(
                    rb[12..rb.len() - 4].iter().all(|&b| b == psn as u8),
                    "packet {psn}: payload is not its own"
                );
                got.push((psn, rb.len()));
            });
            if k == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        got
    }

    /// `--io-thread`: packets the worker's half builds leave through the I/O thread in
    /// order, and what arrives is checked (strict ICRC) and handed over in order, both ways;
    /// the counters of the socket's traffic are the I/O thread's.
    #[test]
    fn io_threads_carry_packets_in_order_both_ways() {
        let (Ok(mut ta), Ok(mut tb)) = (
            UdpTransport::bind("127.0.0.1:0".parse().unwrap(), 0, true),
            UdpTransport::bind("127.0.0.1:0".parse().unwrap(), 0, true),
        ) else {
            vur_testkit::skip(
                "io_threads_carry_packets_in_order_both_ways",
                "127.0.0.1 cannot be bound",
            );
            return;
        };
        ta.peer_port = tb.local.port();
        tb.peer_port = ta.local.port();
        let (ga, gb) = (ta.gid(), tb.gid());
        let io_a = crate::transport::io_thread::IoThread::start(&mut ta).unwrap();
        let io_b = crate::transport::io_thread::IoThread::start(&mut tb).unwrap();
        // 1000 packets of 1 KiB from a, flushed every 100 as a pump does; a full channel
        // stops it until the I/O thread wakes the worker through the inbox's eventfd. Each
        // hundred is taken at b before the next leaves: b's socket buffer holds about two
        // hundred of them (net.core.rmem_max), and on a loaded machine b's I/O thread may
        // not run in time to take more, when the kernel drops them, as it may any datagram.
        let mut waits = 0;
        let mut got = Vec::new();
        for i in 0..1000u32 {
            while ta.blocked() {
                let mut p = libc::pollfd {
                    fd: io_a.inbox().fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one live pollfd.
                let r = unsafe { libc::poll(&mut p, 1, 2000) };
                assert_eq!(r, 1, "a worker waiting for room was not woken within 2 s");
                io_a.inbox().drain(0, |_, _, _| {});
                ta.flush();
                waits += 1;
            }
            push_send(&mut ta, gb, i, 1024);
            if i % 100 == 99 {
                ta.flush();
                got.extend(inbox_n(io_b.inbox(), 100));
                assert_eq!(
                    got.len(),
                    i as usize + 1,
                    "b's I/O thread handed over {} of the first {} within 10 s",
                    got.len(),
                    i + 1
                );
            }
        }
        assert!(got.iter().enumerate().all(|(i, &(psn, _))| psn == i as u32));
        for i in 0..10u32 {
            push_send(&mut tb, ga, i, 64);
        }
        tb.flush();
        assert_eq!(inbox_n(io_a.inbox(), 10).len(), 10);
        let (sa, sb) = (ta.all_stats(), tb.all_stats());
        assert_eq!(
            (sa.tx_packets, sa.rx_packets, sa.rx_icrc_ok),
            (1000, 10, 10)
        );
        assert_eq!(
            (sb.tx_packets, sb.rx_packets, sb.rx_icrc_ok),
            (10, 1000, 1000)
        );
        assert_eq!(sb.rx_icrc_bad + sa.rx_icrc_bad, 0);
        assert!(io_a.render().contains("\"tx_batches\":"));
        eprintln!("the worker waited for room {waits} times");
        // A lone packet while b's I/O thread sleeps with nothing in hand leaves from the
        // worker itself; a's I/O thread receives it as any other.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while !tb.offload.as_ref().unwrap().io_idle() {
            assert!(
                std::time::Instant::now() < end,
                "b's I/O thread never went idle"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        push_send(&mut tb, ga, 10, 64);
        tb.flush();
        assert_eq!(inbox_n(io_a.inbox(), 1), vec![(10, 12 + 64 + 4)]);
        assert!(
            io_b.render().contains("\"tx_inline\":1,"),
            "{}",
            io_b.render()
        );
        assert_eq!(tb.all_stats().tx_packets, 11);
        // Stopping joins the threads; the worker's half then loses what it hands over.
        drop(io_a);
        push_send(&mut ta, gb, 0, 64);
        ta.flush();
        assert_eq!(ta.stats.tx_dropped, 1);
    }

    /// The worker's half with a full channel holds its batch, in order, says it is blocked
    /// and asks to be woken; once the I/O thread has taken a batch the next flush hands it
    /// over.
    #[test]
    fn a_full_io_channel_holds_the_batch() {
        let Ok(mut ta) = UdpTransport::bind("127.0.0.1:0".parse().unwrap(), 0, true) else {
            vur_testkit::skip(
                "a_full_io_channel_holds_the_batch",
                "127.0.0.1 cannot be bound",
            );
            return;
        };
        ta.peer_port = 9;
        let dst = ta.gid();
        let (off, from_worker) = crate::transport::io_thread::offload_without_thread(&ta).unwrap();
        ta.set_offload(off);
        let n = crate::transport::io_thread::CHANNEL_BATCHES * TX_BATCH;
        for i in 0..n as u32 {
            push_send(&mut ta, dst, i, 64);
        }
        assert!(!ta.blocked());
        for i in 0..5 {
            push_send(&mut ta, dst, n as u32 + i, 64);
        }
        ta.flush();
        assert!(
            ta.blocked(),
            "the channel holds {n} packets: the rest must wait"
        );
        assert_eq!(ta.tx_pending.len(), 5);
        assert!(ta.offload.as_ref().unwrap().waits());
        assert_eq!(ta.stats.tx_blocked, 1);
        let first = from_worker.try_recv().unwrap();
        assert_eq!(first.pending.len(), TX_BATCH);
        ta.flush();
        assert!(!ta.blocked());
        let mut psns = Vec::new();
        while let Ok(b) = from_worker.try_recv() {
            for i in 0..b.pending.len() {
                let at = b.base + i * TX_STRIDE;
                psns.push(u32::from_be_bytes([
                    0,
                    b.buf[at + 9],
                    b.buf[at + 10],
                    b.buf[at + 11],
                ]));
            }
        }
        let want: Vec<u32> = (TX_BATCH as u32..n as u32 + 5).collect();
        assert_eq!(psns, want, "every packet once, in order");
        drop(from_worker);
        push_send(&mut ta, dst, 0, 64);
        ta.flush();
        assert_eq!(
            ta.stats.tx_dropped, 1,
            "a gone I/O thread loses what it is handed"
        );
        assert!(!ta.blocked());
    }
}
