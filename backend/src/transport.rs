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
//! sender chose. The receiver tries ID 0 (what this daemon and any sender following the rule
//! above uses); on a match the packet is verified. Otherwise (Linux rxe picks a hashed ID) the
//! packet is accepted unverified and counted in `rx_icrc_unverified`, or dropped when
//! `strict_icrc` is set.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use rxe_core::device::{RecvMeta, Transmit};
use rxe_core::wire::frame::icrc_for_udp_socket;
use rxe_core::Gid;

/// Transport counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct TransportStats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub tx_wrong_family: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_icrc_ok: u64,
    pub rx_icrc_unverified: u64,
    pub rx_icrc_bad: u64,
    pub rx_short: u64,
}

pub struct UdpTransport {
    sock: UdpSocket,
    local: SocketAddr,
    peer_port: u16,
    strict_icrc: bool,
    pub stats: TransportStats,
}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: `fd` is an open socket owned by the caller; the option value is a live i32 whose
    // size we pass.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &v as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
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
        sock.set_nonblocking(true)?;
        let fd = sock.as_raw_fd();
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
        Ok(UdpTransport {
            sock,
            local,
            peer_port,
            strict_icrc,
            stats: TransportStats::default(),
        })
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

    /// Sends one packet (BTH … zeroed ICRC slot); fills the ICRC first.
    pub fn send(&mut self, t: &Transmit, roce: &mut [u8]) {
        let dst_ip = t.dst.to_ip();
        if dst_ip.is_ipv4() != self.local.is_ipv4() {
            self.stats.tx_wrong_family += 1;
            return;
        }
        let dst = SocketAddr::new(dst_ip, self.peer_port);
        if icrc_for_udp_socket(self.local, dst, roce).is_err() {
            self.stats.tx_dropped += 1;
            return;
        }
        match self.sock.send_to(roce, dst) {
            Ok(_) => {
                self.stats.tx_packets += 1;
                self.stats.tx_bytes += roce.len() as u64;
            }
            // A full socket buffer is loss: the engine's retransmission covers it.
            Err(_) => self.stats.tx_dropped += 1,
        }
    }

    /// Receives one datagram into `buf`; `None` when nothing is waiting. Packets that fail
    /// the checks are counted and skipped.
    pub fn recv(&mut self, buf: &mut [u8]) -> Option<(RecvMeta, usize)> {
        loop {
            let (n, src) = match self.sock.recv_from(buf) {
                Ok(v) => v,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ICMP errors surface here (ECONNREFUSED on a closed peer port): not fatal.
                Err(_) => continue,
            };
            self.stats.rx_packets += 1;
            self.stats.rx_bytes += n as u64;
            if n < 12 + 4 {
                self.stats.rx_short += 1;
                continue;
            }
            match self.check_icrc(src, n, &buf[..n]) {
                IcrcCheck::Ok => self.stats.rx_icrc_ok += 1,
                IcrcCheck::Unverifiable if !self.strict_icrc => self.stats.rx_icrc_unverified += 1,
                _ => {
                    self.stats.rx_icrc_bad += 1;
                    continue;
                }
            }
            let meta = RecvMeta {
                src: Gid::from_ip(unmap(src.ip())),
                dst: self.gid(),
                sport: src.port(),
                traffic_class: 0,
                hop_limit: 64,
                flow_label: 0,
            };
            return Some((meta, n));
        }
    }

    fn check_icrc(&self, src: SocketAddr, n: usize, roce: &[u8]) -> IcrcCheck {
        let mut h = [0u8; 48];
        let udp_len = (8 + n) as u16;
        let l = match (unmap(src.ip()), self.local.ip()) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                h[0] = 0x45;
                h[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
                // ID 0, DF.
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
        h[l + 2..l + 4].copy_from_slice(&self.local.port().to_be_bytes());
        h[l + 4..l + 6].copy_from_slice(&udp_len.to_be_bytes());
        match rxe_core::icrc::verify(&h[..l + 8], roce) {
            Ok(()) => IcrcCheck::Ok,
            Err(_) if l == 20 => IcrcCheck::Unverifiable,
            Err(_) => IcrcCheck::Bad,
        }
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
        let bth = BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: 0,
            tver: 0,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0x12,
            ack_req: true,
            psn: 7,
        };
        let (n, pr) = emit(buf, &bth, &ExtRepr::default(), 4).unwrap();
        buf[pr.start..pr.end].copy_from_slice(b"ping");
        n
    }

    /// Two sockets on loopback: what one sends the other verifies (ID 0 over IPv4), and a
    /// corrupted packet is caught over IPv6 (where the check is complete).
    #[test]
    fn icrc_round_trip_over_real_sockets() {
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
        }
    }
}
