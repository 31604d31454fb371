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
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::RawFd;

use rxe_core::device::{RecvMeta, Transmit};
use rxe_core::wire::frame::icrc_for_udp_socket;
use rxe_core::Gid;

use crate::transport::egress::EgressPolicy;
use crate::transport::io_thread::{IoThread, Refused, TxOffload, INLINE_MAX};
use crate::transport::sink::PacketSink;
use crate::transport::socket::{UdpIo, TX_BATCH, TX_SLOT};
pub use crate::transport::socket::{RX_BATCH, RX_ERROR_LIMIT};
pub use crate::transport::stats::TransportStats;

/// The worker's side of the transport: routes the engine's packets (address family, egress
/// policy, the same-host shortcut), fills their ICRC into the socket half's send slots, and
/// sends them through it or hands them to the I/O thread.
pub struct UdpTransport {
    /// The socket half ([`crate::transport::socket`]).
    io: UdpIo,
    peer_port: u16,
    /// `--same-host`: the other ports of this process, reached without the socket.
    same_host: Option<crate::transport::same_host::Link>,
    /// The guest memory of the packets being built, while a pump runs (`--same-host`).
    payload_src: Option<std::sync::Arc<crate::memory::guest_mem::GuestMemoryMmap>>,
    /// Payload bytes of a packet to another port of the process (`--same-host-segment`).
    segment: usize,
    /// `--io-thread`: full batches go to the I/O thread instead of the socket
    /// ([`crate::transport::io_thread`]).
    offload: Option<TxOffload>,
    /// The groups the device's QPs are attached to ([`crate::transport::mcast`]).
    mcast: Option<std::sync::Arc<crate::transport::mcast::Groups>>,
}

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
        Ok(UdpTransport {
            io: UdpIo::open(sock, strict_icrc, ids)?,
            peer_port,
            same_host: None,
            mcast: None,
            payload_src: None,
            segment: 0,
            offload: None,
        })
    }

    /// Starts the I/O thread (`--io-thread`): it takes a half of the socket of its own, this
    /// transport hands it full batches from now on and no longer receives.
    pub fn start_io_thread(&mut self) -> io::Result<IoThread> {
        let (thread, offload) = IoThread::start(&self.io)?;
        self.offload = Some(offload);
        self.io.stop_receiving();
        Ok(thread)
    }

    /// The I/O thread's inbox of received packets (`--io-thread`).
    pub fn io_inbox(&self) -> Option<std::sync::Arc<crate::transport::same_host::Inbox>> {
        self.offload.as_ref().map(|o| o.inbox().clone())
    }

    /// The counters of both halves with `--io-thread` (the socket's traffic is the I/O
    /// thread's), else this transport's.
    pub fn all_stats(&self) -> TransportStats {
        match &self.offload {
            Some(o) => self.io.stats.plus(&o.io_stats()),
            None => self.io.stats,
        }
    }

    /// The worker's half: hands the pending batch to the I/O thread, or holds it while the
    /// channel is full ([`PacketSink::blocked`]).
    fn hand_off(&mut self) {
        let Some(off) = &mut self.offload else {
            return;
        };
        let io = &mut self.io;
        if io.tx_pending.is_empty() {
            io.tx_blocked = false;
            return;
        }
        let mut spare = off.spare();
        io.swap_batch(&mut spare);
        // `spare` is now the full batch.
        match off.send(spare) {
            Ok(()) => io.tx_blocked = false,
            Err(Refused::Full(mut b)) => {
                // Keep it, in order, for the next flush; the I/O thread wakes the worker.
                io.swap_batch(&mut b);
                off.keep(b);
                io.stats.tx_blocked += 1;
                io.tx_blocked = true;
            }
            Err(Refused::Gone(b)) => {
                io.stats.tx_dropped += b.pending.len() as u64;
                io.tx_blocked = false;
            }
        }
    }

    /// Sends runs of packets as UDP GSO segments from now on, and takes coalesced runs
    /// (UDP GRO) on receive, if the kernel knows UDP GSO ([`UdpIo::enable_gso`]); returns
    /// whether it will.
    pub fn enable_gso(&mut self) -> io::Result<bool> {
        self.io.enable_gso()
    }

    /// Whether runs of packets leave as UDP GSO sends ([`Self::enable_gso`], until the kernel
    /// refuses one).
    pub fn gso(&self) -> bool {
        self.io.gso()
    }

    /// Where packets may go ([`EgressPolicy`]); everything before this is called.
    pub fn set_egress(&mut self, p: EgressPolicy) {
        self.io.egress = p;
    }

    /// The device's live QPs ([`UdpIo::set_live_qpns`]); before an I/O thread starts.
    pub fn set_live_qpns(&mut self, q: std::sync::Arc<crate::transport::live_qpns::LiveQpns>) {
        self.io.set_live_qpns(q);
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.io.local_addr()
    }

    pub fn fd(&self) -> RawFd {
        self.io.fd()
    }

    /// While blocked: the source-port socket to wait for instead of the bound one
    /// ([`UdpIo::blocked_port_fd`]).
    pub fn blocked_port_fd(&self) -> Option<RawFd> {
        self.io.blocked_port_fd()
    }

    /// At most `cap` sockets send from the QPs' own source ports (0: every packet from the
    /// bound port; [`crate::transport::sport`]). Before the I/O thread starts.
    pub fn set_source_ports(&mut self, cap: usize) {
        self.io.set_source_ports(cap);
    }

    /// Joins the multicast groups the model publishes in `g` (on [`Self::sync_groups`]).
    pub fn set_groups(&mut self, g: std::sync::Arc<crate::transport::mcast::Groups>) {
        self.mcast = Some(g);
    }

    /// The groups of [`Self::set_groups`].
    pub fn groups(&self) -> Option<std::sync::Arc<crate::transport::mcast::Groups>> {
        self.mcast.clone()
    }

    /// Joins and leaves groups as the model last published them, if that changed: the
    /// sockets opened (for the worker to wait on with the bound one) and those to close
    /// (once it no longer waits on them).
    pub fn sync_groups(&mut self) -> (Vec<RawFd>, Vec<std::os::fd::OwnedFd>) {
        let Some(wanted) = self.mcast.as_ref().and_then(|g| g.take_changed()) else {
            return Default::default();
        };
        let (ip, port) = (self.io.local.ip(), self.peer_port);
        self.io
            .groups
            .get_or_insert_with(|| Box::new(crate::transport::mcast::GroupSockets::new(ip, port)))
            .sync(&wanted)
    }

    /// The GID of the bound address.
    pub fn gid(&self) -> Gid {
        self.io.gid()
    }

    /// Fills the ICRC of one packet (BTH … zeroed ICRC slot); returns its destination.
    #[cfg(test)]
    fn prepare(&mut self, t: &Transmit, roce: &mut [u8]) -> Option<SocketAddr> {
        let dst = self.route(t)?;
        if icrc_for_udp_socket(self.io.local, dst, roce).is_err() {
            self.io.stats.tx_dropped += 1;
            return None;
        }
        Some(dst)
    }

    /// Where `t` goes, if the address family and the egress policy let it go anywhere.
    fn route(&mut self, t: &Transmit) -> Option<SocketAddr> {
        let dst_ip = t.dst.to_ip();
        if dst_ip.is_ipv4() != self.io.local.is_ipv4() {
            self.io.stats.tx_wrong_family += 1;
            return None;
        }
        if !self.io.egress.allows(dst_ip) {
            // As a destination without a route: the packet is lost (the requester retries
            // and ends with RETRY_EXC_ERR; a UD datagram is gone).
            self.io.stats.tx_denied += 1;
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
    #[cfg(test)]
    fn send(&mut self, t: &Transmit, roce: &mut [u8]) {
        let Some(dst) = self.prepare(t, roce) else {
            return;
        };
        match self.io.sock.send_to(roce, dst) {
            Ok(_) => {
                self.io.stats.tx_packets += 1;
                self.io.stats.tx_bytes += roce.len() as u64;
            }
            // A full socket buffer is loss: the engine's retransmission covers it.
            Err(e) => {
                self.io.stats.tx_dropped += 1;
                if e.kind() != std::io::ErrorKind::WouldBlock {
                    super::log_send_error("udp transport", &dst, Some(dst.ip()), &e);
                }
            }
        }
    }

    /// Sends the queued packets ([`UdpIo::send_pending`]). With an I/O thread: hands the
    /// batch over, unless it is a few packets (an ACK, a lone small message) and the thread
    /// sleeps with nothing in hand: then sends them here and spares it a wake-up (and hands
    /// over what the socket did not take). Larger batches always go to it, busy or not.
    fn send_pending(&mut self) {
        match &self.offload {
            Some(o) if self.io.tx_pending.len() > INLINE_MAX || !o.io_idle() => {
                return self.hand_off()
            }
            Some(o) if !self.io.tx_pending.is_empty() => o.sent_inline(),
            _ => {}
        }
        self.io.send_pending();
        if self.io.tx_blocked && self.offload.is_some() {
            self.hand_off();
        }
    }

    /// Receives a batch of datagrams ([`UdpIo::recv_batch`]); read them with [`Self::packet`].
    #[inline]
    pub fn recv_batch(&mut self) -> usize {
        self.io.recv_batch()
    }

    /// Whether the last [`Self::recv_batch`] gave up on errors: the socket keeps failing,
    /// and the caller should leave it alone for a while.
    pub fn rx_failing(&self) -> bool {
        self.io.rx_failing()
    }

    /// Receives and drops at most `max` datagrams (no guest memory to take them); returns
    /// how many.
    pub fn drop_unattached(&mut self, max: usize) -> usize {
        self.io.drop_unattached(max)
    }

    /// Datagram `i` of the last [`Self::recv_batch`], checked (length, ICRC); `None` if it
    /// was dropped (counted).
    #[inline]
    pub fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])> {
        self.io.packet(i)
    }

    /// Receives one datagram into `buf` ([`UdpIo::recv`]).
    #[cfg(test)]
    fn recv(&mut self, buf: &mut [u8]) -> Option<(RecvMeta, usize)> {
        self.io.recv(buf)
    }
}

impl PacketSink for UdpTransport {
    fn next_buf(&mut self) -> &mut [u8] {
        let r = self.io.slot(self.io.tx_pending.len());
        &mut self.io.tx_buf[r]
    }

    fn push(&mut self, t: &Transmit) {
        let i = self.io.tx_pending.len();
        let len = t.len.min(TX_SLOT);
        let at = self.io.slot(i).start;
        let Some(dst) = self.route(t) else {
            return;
        };
        if let Some(l) = &mut self.same_host {
            if l.deliver(t, &self.io.tx_buf[at..at + len]) {
                return;
            }
        }
        let sport = self.io.source_port(t.sport);
        let src = SocketAddr::new(self.io.local.ip(), sport);
        if icrc_for_udp_socket(src, dst, &mut self.io.tx_buf[at..at + len]).is_err() {
            self.io.stats.tx_dropped += 1;
            return;
        }
        self.io.tx_pending.push((len, dst, sport));
        if self.io.tx_pending.len() == TX_BATCH {
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
        self.io.tx_blocked
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
        let r = self.io.slot(self.io.tx_pending.len());
        if roce.len() > r.len() {
            self.io.stats.tx_dropped += 1;
            return;
        }
        let dst = &mut self.io.tx_buf[r.start..r.start + roce.len()];
        crate::memory::payload_ref::copy_unreferenced(roce, refs, dst);
        if let Some(src) = &src {
            crate::memory::payload_ref::resolve(src, refs, dst);
        }
        self.push(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::socket::{
        setsockopt_int, test_packet as packet, GSO_REFUSALS_OFF, TX_STRIDE, UDP_NO_CHECK6_TX,
    };
    use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};
    use std::net::UdpSocket;

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
            ta.io.sock.send_to(b"x", dead).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(5));
            let _ = ta.recv_batch();
        }
        assert!(ta.io.stats.rx_errors >= 1, "{:?}", ta.io.stats);
        assert!(!ta.rx_failing(), "a few errors are not a failing socket");
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        peer.send_to(&[0u8; 20], ta.local_addr()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert_eq!(ta.drop_unattached(RX_BATCH * 4), 1);
        assert_eq!(ta.io.stats.rx_unattached, 1);
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
            ta.io.tx_pending.push((3, dst, ta.io.local.port()));
        }
        // As after a sendmmsg that took the first packet and then met EAGAIN.
        ta.io.tx_blocked = true;
        ta.io.keep_unsent(1);
        assert!(ta.blocked());
        assert_eq!(ta.io.tx_pending.len(), 3);
        ta.flush();
        assert!(!ta.blocked());
        let mut b = [0u8; 16];
        for i in 1..4u8 {
            let n = rx.recv(&mut b).unwrap();
            assert_eq!(&b[..n], &[i, i, i]);
        }
        assert_eq!(ta.io.stats.tx_packets, 3);
    }

    /// Builds packet `i` of a run in the next slot: a SEND of `payload` bytes with PSN `i`.
    fn push_send(t: &mut UdpTransport, dst: Gid, i: u32, payload: usize) {
        push_send_from(t, dst, i, payload, 0);
    }

    /// [`push_send`] for a packet the engine gave UDP source port `sport`.
    fn push_send_from(t: &mut UdpTransport, dst: Gid, i: u32, payload: usize, sport: u16) {
        let buf = t.next_buf();
        let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, i, true);
        let (n, pr) = emit(buf, &bth, &ExtRepr::default(), payload).unwrap();
        buf[pr.start..pr.end].fill(i as u8);
        let tx = Transmit {
            len: n,
            src: t.gid(),
            dst,
            sport,
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

    /// Each packet leaves from the UDP source port the engine gave it (its QP's, as rxe
    /// computes it), interleaved in one batch, with and without GSO, over IPv4 and IPv6; the
    /// receiver (strict ICRC) sees each port and finds each ICRC right, as it covers the
    /// port. A port another program holds falls back to the bound socket's, counted, its
    /// ICRC computed for that port.
    #[test]
    fn packets_leave_from_their_qps_source_ports() {
        for ip in ["127.0.0.1", "::1"] {
            for gso in [false, true] {
                packets_leave_from_their_source_ports(ip, gso);
            }
        }
    }

    fn packets_leave_from_their_source_ports(ip: &str, gso: bool) {
        let at: SocketAddr = SocketAddr::new(ip.parse().unwrap(), 0);
        let (mut ta, mut tb) = match (
            UdpTransport::bind(at, 0, true),
            UdpTransport::bind(at, 0, true),
        ) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                vur_testkit::skip(
                    "packets_leave_from_their_qps_source_ports",
                    &format!("{ip} cannot be bound ({e})"),
                );
                return;
            }
        };
        if gso {
            // The receiver with GRO too: it sees each segment's ID, its index in its run.
            assert!(ta.enable_gso().unwrap() && tb.enable_gso().unwrap());
        }
        ta.peer_port = tb.local_addr().port();
        let free: Vec<u16> = (0xc000..=0xffffu16)
            .filter(|&p| std::net::UdpSocket::bind((at.ip(), p)).is_ok())
            .take(3)
            .collect();
        // A port another program holds (bound without SO_REUSEADDR).
        let foreign = std::net::UdpSocket::bind(at).unwrap();
        let held = foreign.local_addr().unwrap().port();
        let ports = [free[0], free[1], free[0], free[2], held, free[1]];
        let dst = tb.gid();
        let mut want = Vec::new();
        for (k, &p) in ports.iter().enumerate() {
            // Two packets a port (a GSO run each, with GSO on).
            for j in 0..2 {
                let i = (2 * k + j) as u32;
                push_send_from(&mut ta, dst, i, 1024, p);
                let leaves = if p == held { ta.local_addr().port() } else { p };
                want.push((i, leaves));
            }
        }
        ta.flush();
        let mut got = Vec::new();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < want.len() && std::time::Instant::now() < end {
            let k = tb.recv_batch();
            if k == 0 {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            for i in 0..k {
                if let Some((m, rb)) = tb.packet(i) {
                    got.push((u32::from_be_bytes([0, rb[9], rb[10], rb[11]]), m.sport));
                }
            }
        }
        assert_eq!(
            got, want,
            "{ip} gso={gso}: each packet from its port, in order"
        );
        assert_eq!(
            tb.io.stats.rx_icrc_ok,
            want.len() as u64,
            "{:?}",
            tb.io.stats
        );
        assert_eq!(ta.io.stats.tx_sport_fallback, 2, "{:?}", ta.io.stats);
        assert_eq!(ta.io.stats.tx_sport_sockets, 3);
        assert_eq!(ta.io.stats.tx_packets, want.len() as u64);
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
        assert!(tb.io.rx.gro, "UDP GRO on a 6.x kernel");
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
        assert_eq!(tb.io.stats.rx_icrc_ok, 23);
        assert_eq!(tb.io.stats.rx_icrc_bad, 0);
        assert_eq!(
            (ta.io.stats.tx_gso_sends, ta.io.stats.tx_gso_segments),
            (3, 23),
            "runs of 15, 6 (the 1000 B packet ends the second) and 2; {:?}",
            ta.io.stats
        );
        assert_eq!(ta.io.stats.tx_packets, 23);
        assert!(
            tb.io.stats.rx_gro_runs >= 1 && tb.io.stats.rx_gro_segments >= 6,
            "the runs arrive coalesced on loopback: {:?}",
            tb.io.stats
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
                tc.io.stats.rx_icrc_ok,
                tc.io.stats.rx_icrc_id_solved,
                tc.io.stats.rx_gro_runs
            ),
            (exact, solved, 0)
        );
        assert_eq!(ta.io.stats.tx_gso_sends, 4);
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
        assert_eq!(ta.io.stats.tx_gso_sends, 5);
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
        assert_eq!(tc.io.stats.tx_gso_sends, 0);
        // A kernel that refuses GSO (here: the checksum turned off behind the transport's
        // back, EINVAL) loses nothing: each run goes out packet by packet, its ICRCs for ID 0
        // again (the strict receiver checks); GSO stays on for the next batch until
        // GSO_REFUSALS_OFF refusals in a row, then it is off.
        if v4 {
            setsockopt_int(ta.fd(), libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).unwrap();
        } else {
            setsockopt_int(ta.fd(), libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, 1).unwrap();
        }
        let ok_before = tb.io.stats.rx_icrc_ok;
        for batch in 0..GSO_REFUSALS_OFF {
            assert!(ta.gso(), "still on after {batch} refusals");
            for i in 0..3 {
                push_send(&mut ta, dst, batch * 3 + i, 4096);
            }
            ta.flush();
        }
        let n = 3 * GSO_REFUSALS_OFF as usize;
        assert_eq!(receive_n(&mut tb, n).len(), n, "{:?}", ta.io.stats);
        assert_eq!(tb.io.stats.rx_icrc_ok - ok_before, n as u64);
        assert_eq!(ta.io.stats.tx_gso_refused, GSO_REFUSALS_OFF as u64);
        assert!(!ta.gso());
        assert_eq!(ta.io.stats.tx_gso_sends, 5);
        assert_eq!(ta.io.stats.tx_packets, 35 + n as u64);
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
            assert_eq!(tb.io.stats.rx_icrc_ok, 1);
            // Corrupt one payload byte after the ICRC was computed.
            buf[n - 5] ^= 1;
            ta.io
                .sock
                .send_to(&buf[..n], tb.local_addr())
                .expect("raw send");
            let mut dropped = false;
            for _ in 0..200 {
                if tb.recv(&mut rb).is_some() {
                    break;
                }
                if tb.io.stats.rx_icrc_bad == 1 {
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
        ta.peer_port = tb.io.local.port();
        tb.peer_port = ta.io.local.port();
        let (ga, gb) = (ta.gid(), tb.gid());
        let io_a = ta.start_io_thread().unwrap();
        let io_b = tb.start_io_thread().unwrap();
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
        assert_eq!(ta.io.stats.tx_dropped, 1);
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
        let (off, from_worker) =
            crate::transport::io_thread::offload_without_thread(&ta.io).unwrap();
        ta.offload = Some(off);
        ta.io.stop_receiving();
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
        assert_eq!(ta.io.tx_pending.len(), 5);
        assert!(ta.offload.as_ref().unwrap().waits());
        assert_eq!(ta.io.stats.tx_blocked, 1);
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
            ta.io.stats.tx_dropped, 1,
            "a gone I/O thread loses what it is handed"
        );
        assert!(!ta.blocked());
    }
}
