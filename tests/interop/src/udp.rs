//! RoCEv2 over a kernel UDP socket.
//!
//! The socket is bound to a concrete address on port 4791, with path-MTU discovery forced on
//! (`IP_PMTUDISC_DO`): Linux then sends every datagram of this unconnected socket with DF set
//! and IPv4 identification 0, so the ICRC we compute over that header is the one the receiver
//! recomputes (`rxe-core::wire::frame::icrc_for_udp_socket`). For IPv6 the socket accepts the
//! zero UDP checksum RoCE senders use (`UDP_NO_CHECK6_RX`).
//!
//! On receive a UDP socket does not show the IPv4 identification, so the ICRC of IPv4
//! datagrams is not checked here (the UDP checksum, when present, still is, by the kernel).

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use rxe_core::wire::frame::icrc_for_udp_socket;

pub const ROCE_PORT: u16 = 4791;

pub struct UdpTransport {
    sock: UdpSocket,
    local: SocketAddr,
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
        Ok(UdpTransport { sock, local })
    }

    pub fn local(&self) -> SocketAddr {
        self.local
    }

    /// Fills the ICRC of `roce` (BTH..ICRC slot) for this socket's header and sends it.
    pub fn send(&self, dst: IpAddr, roce: &mut [u8]) -> io::Result<()> {
        let to = SocketAddr::new(dst, ROCE_PORT);
        icrc_for_udp_socket(self.local, to, roce)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        self.sock.send_to(roce, to)?;
        Ok(())
    }

    /// Waits up to `timeout` for a datagram (zero: take one only if already queued).
    pub fn recv(
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
