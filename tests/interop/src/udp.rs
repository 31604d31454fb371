//! RoCEv2 over a kernel UDP socket.
//!
//! The socket is bound to a concrete address on port 4791, with path-MTU discovery forced on
//! (`IP_PMTUDISC_DO`): Linux then sends every datagram of this unconnected socket with DF set
//! and IPv4 identification 0, so the ICRC we compute over that header is the one the receiver
//! recomputes (`rxe-core::wire::frame::icrc_for_udp_socket`). For IPv6 the socket accepts the
//! zero UDP checksum RoCE senders use (`UDP_NO_CHECK6_RX`).
//!
//! Every received datagram's ICRC is checked before the engine sees it; a mismatch is dropped
//! and counted (`rx_icrc_bad`), as rxe drops it. IPv6 is checked exactly. For IPv4 the ICRC
//! also covers the identification, which a UDP socket does not show (and which rxe picks by
//! hash, not 0): the check solves for it
//! (`rxe_core::wire::frame::verify_icrc_from_udp_socket`), so a corrupted datagram passes with
//! probability 2⁻¹⁶.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use rxe_core::icrc::Ipv4IdSolver;
use rxe_core::wire::frame::{icrc_for_udp_socket, verify_icrc_from_udp_socket};

pub const ROCE_PORT: u16 = 4791;

/// Receive-side counters of the transport.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams whose ICRC matched (handed on).
    pub rx_icrc_ok: u64,
    /// Datagrams dropped because their ICRC did not match (or they were too short to hold a
    /// BTH and an ICRC).
    pub rx_icrc_bad: u64,
}

/// Bad datagrams one [`UdpTransport::recv`] call drops before it gives up for this call.
const MAX_BAD_PER_RECV: u32 = 64;

pub struct UdpTransport {
    sock: UdpSocket,
    local: SocketAddr,
    solver: Ipv4IdSolver,
    stats: UdpStats,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, val: i32) -> io::Result<()> {
    // SAFETY: `val` outlives the call and the length passed is its size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&val as *const i32).cast(),
            core::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl UdpTransport {
    pub fn bind(ip: IpAddr, port: u16) -> io::Result<Self> {
        if ip.is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "bind to a concrete address: the ICRC covers it",
            ));
        }
        let sock = UdpSocket::bind(SocketAddr::new(ip, port))?;
        let fd = sock.as_raw_fd();
        match ip {
            IpAddr::V4(_) => setsockopt_int(
                fd,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?,
            IpAddr::V6(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )?;
                setsockopt_int(fd, libc::SOL_UDP, libc::UDP_NO_CHECK6_RX, 1)?;
                setsockopt_int(fd, libc::SOL_UDP, libc::UDP_NO_CHECK6_TX, 1)?;
            }
        }
        // Room for a burst of READ responses while the pump is busy elsewhere (the kernel caps
        // it at net.core.rmem_max; as root, SO_RCVBUFFORCE lifts the cap).
        let rcvbuf = 8 << 20;
        if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, rcvbuf).is_err() {
            let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, rcvbuf);
        }
        let local = sock.local_addr()?;
        Ok(UdpTransport {
            sock,
            local,
            solver: Ipv4IdSolver::new(),
            stats: UdpStats::default(),
        })
    }

    pub fn local(&self) -> SocketAddr {
        self.local
    }

    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// Fills the ICRC of `roce` (BTH..ICRC slot) for this socket's header and sends it.
    pub fn send(&self, dst: IpAddr, roce: &mut [u8]) -> io::Result<()> {
        let to = SocketAddr::new(dst, ROCE_PORT);
        icrc_for_udp_socket(self.local, to, roce)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.sock.send_to(roce, to)?;
        Ok(())
    }

    /// Sends `roce` as it is (ICRC included): crafted or corrupted packets.
    pub fn send_raw(&self, to: SocketAddr, roce: &[u8]) -> io::Result<()> {
        self.sock.send_to(roce, to)?;
        Ok(())
    }

    /// Waits up to `timeout` for a datagram whose ICRC matches (zero: take one only if already
    /// queued). Datagrams with a bad ICRC are dropped and counted on the way.
    pub fn recv(
        &mut self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> io::Result<Option<(usize, SocketAddr)>> {
        let start = Instant::now();
        let mut wait = timeout;
        for _ in 0..MAX_BAD_PER_RECV {
            let Some((n, from)) = self.recv_any(buf, wait)? else {
                return Ok(None);
            };
            if self.icrc_ok(from, &buf[..n]) {
                return Ok(Some((n, from)));
            }
            wait = timeout.saturating_sub(start.elapsed());
        }
        Ok(None)
    }

    /// Checks (and counts) the ICRC of a datagram received from `from`.
    fn icrc_ok(&mut self, from: SocketAddr, roce: &[u8]) -> bool {
        if verify_icrc_from_udp_socket(from, self.local, roce, &mut self.solver).is_ok() {
            self.stats.rx_icrc_ok += 1;
            true
        } else {
            self.stats.rx_icrc_bad += 1;
            false
        }
    }

    fn recv_any(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> io::Result<Option<(usize, SocketAddr)>> {
        // Zero: only a datagram already queued.
        self.sock.set_nonblocking(timeout.is_zero())?;
        if !timeout.is_zero() {
            self.sock.set_read_timeout(Some(timeout))?;
        }
        match self.sock.recv_from(buf) {
            Ok(x) => Ok(Some(x)),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}
