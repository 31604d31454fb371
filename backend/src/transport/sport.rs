//! The udp transport's source ports: each QP's packets leave from the UDP source port the
//! engine gives them ([`rxe_core::device::Transmit::sport`], as Linux rxe computes it:
//! `rdma_get_udp_sport()` for RC/UC, a hash of the QP number for UD), so that routers that
//! spread flows by their 5-tuple (ECMP, RSS on the receiving host) spread QPs as they do
//! rxe's and a NIC's.
//!
//! A kernel UDP socket sends from the port it is bound to, so each port in use gets a
//! send-only socket bound to the transport's address and that port: opened on first use,
//! closed after [`IDLE_SECS`] without a packet, at most `cap` open (the least recently used
//! is closed first; `--udp-sport-sockets`). Each is bound with `SO_REUSEADDR` (the halves of
//! one transport — the worker's, an I/O thread's, a steered shard's — each open their own
//! for the same port), takes nothing in (a classic BPF filter that drops every datagram, and
//! the smallest receive buffer), and has the bound socket's send options: path MTU
//! discovery on (DF, IPv4 ID 0: the ICRC rule of [`crate::transport::udp`]) and the same
//! UDP checksum rule.
//!
//! A port the kernel will not bind (another program's socket holds it without
//! `SO_REUSEADDR`) is not retried for [`RETRY_SECS`]: its packets leave from the bound
//! socket's port meanwhile, which is what a transport with `cap` 0 does for every packet
//! (`tx_sport_fallback` counts them).

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use crate::sys::setsockopt;

/// A socket unused for this long is closed (checked at most once a second, on a send).
pub const IDLE_SECS: u64 = 10;
/// A port that could not be bound is tried again after this long.
pub const RETRY_SECS: u64 = 5;
/// `--udp-sport-sockets` default.
pub const DEFAULT_CAP: usize = 1024;

/// `UDP_NO_CHECK6_TX` (linux/udp.h).
const UDP_NO_CHECK6_TX: i32 = 101;

struct Entry {
    /// `None`: the port could not be bound (at `used`).
    sock: Option<OwnedFd>,
    /// The sweep epoch of its last use (or of the failed bind).
    used: u64,
}

/// One transport half's send-only sockets, by source port (see the module documentation).
pub struct SourcePorts {
    local: SocketAddr,
    cap: usize,
    /// Runs of packets leave as UDP GSO sends: the sockets send a UDP checksum.
    checksum: bool,
    map: HashMap<u16, Entry>,
    /// Open sockets in `map`.
    open: usize,
    /// The last port looked up and its socket (most packets of a batch share one QP).
    last: Option<(u16, RawFd)>,
    /// `last` was looked up since the last sweep.
    last_hit: bool,
    /// Advances once a second at most, on a send ([`Self::sweep`]).
    epoch: u64,
    swept: Instant,
    lookups: u32,
    /// Sockets opened so far.
    pub opened: u64,
}

impl SourcePorts {
    /// Sockets for source ports on `local`'s address, at most `cap` open (0: none; every
    /// packet then leaves from the bound socket's port).
    pub fn new(local: SocketAddr, cap: usize) -> SourcePorts {
        SourcePorts {
            local,
            cap,
            checksum: false,
            map: HashMap::new(),
            open: 0,
            last: None,
            last_hit: false,
            epoch: 0,
            swept: Instant::now(),
            lookups: 0,
            opened: 0,
        }
    }

    /// The same limits for another half of the transport (its own sockets).
    pub fn sibling(&self) -> SourcePorts {
        let mut s = SourcePorts::new(self.local, self.cap);
        s.checksum = self.checksum;
        s
    }

    /// The sockets send a UDP checksum (GSO needs it): closes those open without.
    pub fn set_checksum(&mut self, on: bool) {
        if self.checksum != on {
            self.checksum = on;
            self.map.clear();
            self.open = 0;
            self.last = None;
        }
    }

    /// Whether packets from `port` should leave from a socket of this pool.
    pub fn wants(&self, port: u16) -> bool {
        self.cap > 0 && port != self.local.port() && port != 0
    }

    /// How many sockets are open.
    pub fn open_now(&self) -> usize {
        self.open
    }

    /// The socket that sends from `port`, opened if need be; `None` when the bound socket
    /// must send instead (`port` is its own, the pool is off, or the port cannot be bound).
    pub fn fd(&mut self, port: u16) -> Option<RawFd> {
        if !self.wants(port) {
            return None;
        }
        self.lookups = self.lookups.wrapping_add(1);
        if self.lookups.is_multiple_of(256) {
            self.sweep();
        }
        if let Some((p, fd)) = self.last {
            if p == port {
                self.last_hit = true;
                return Some(fd);
            }
        }
        let epoch = self.epoch;
        if let Some(e) = self.map.get_mut(&port) {
            match &e.sock {
                Some(s) => {
                    e.used = epoch;
                    let fd = s.as_raw_fd();
                    self.last = Some((port, fd));
                    return Some(fd);
                }
                None if epoch.saturating_sub(e.used) < RETRY_SECS => return None,
                None => {
                    self.map.remove(&port);
                }
            }
        }
        self.sweep();
        if self.open >= self.cap {
            self.close_oldest();
        }
        let sock = match open(SocketAddr::new(self.local.ip(), port), self.checksum) {
            Ok(s) => s,
            Err(e) => {
                log::debug!(
                    "udp transport: source port {port} cannot be bound ({e}): its packets leave from port {} for {RETRY_SECS} s",
                    self.local.port()
                );
                self.map.insert(
                    port,
                    Entry {
                        sock: None,
                        used: self.epoch,
                    },
                );
                return None;
            }
        };
        let fd = sock.as_raw_fd();
        self.map.insert(
            port,
            Entry {
                sock: Some(sock),
                used: self.epoch,
            },
        );
        self.open += 1;
        self.opened += 1;
        self.last = Some((port, fd));
        Some(fd)
    }

    /// Once a second at most: advances the epoch and closes the sockets idle for
    /// [`IDLE_SECS`] (and forgets the ports refused [`RETRY_SECS`] ago).
    fn sweep(&mut self) {
        let now = Instant::now();
        let secs = now.duration_since(self.swept).as_secs();
        if secs == 0 {
            return;
        }
        self.swept += Duration::from_secs(secs);
        self.epoch += secs;
        let epoch = self.epoch;
        // The last port is looked up without touching its entry: used since the last sweep?
        if std::mem::take(&mut self.last_hit) {
            if let Some(e) = self.last.and_then(|(p, _)| self.map.get_mut(&p)) {
                e.used = epoch;
            }
        }
        let before = self.map.len();
        self.map.retain(|_, e| match e.sock {
            Some(_) => epoch - e.used < IDLE_SECS,
            None => epoch - e.used < RETRY_SECS,
        });
        if self.map.len() != before {
            self.open = self.map.values().filter(|e| e.sock.is_some()).count();
            self.last = None;
        }
    }

    /// Closes the least recently used socket.
    fn close_oldest(&mut self) {
        let oldest = self
            .map
            .iter()
            .filter(|(_, e)| e.sock.is_some())
            .min_by_key(|(_, e)| e.used)
            .map(|(&p, _)| p);
        if let Some(p) = oldest {
            self.map.remove(&p);
            self.open -= 1;
            self.last = None;
        }
    }
}

/// A non-blocking, send-only UDP socket bound to `addr` with `SO_REUSEADDR`.
fn open(addr: SocketAddr, checksum: bool) -> io::Result<OwnedFd> {
    crate::sys::bound_udp_socket(addr, |raw| {
        let int = |level, name, v: i32| setsockopt(raw, level, name, &v);
        int(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
        // Nothing comes in: every datagram is dropped before it is queued.
        let mut drop_all = [libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k: 0,
        }];
        crate::transport::filter::attach_filter(raw, &mut drop_all)?;
        let _ = int(libc::SOL_SOCKET, libc::SO_RCVBUF, 0);
        let _ = int(libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
        if addr.is_ipv4() {
            int(
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )?;
            int(libc::SOL_SOCKET, libc::SO_NO_CHECK, i32::from(!checksum))
        } else {
            int(
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )?;
            int(libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, i32::from(!checksum))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    fn local() -> UdpSocket {
        UdpSocket::bind("127.0.0.1:0").unwrap()
    }

    /// A free port at or above 0xc000 on 127.0.0.1 (as the engine's ports are).
    fn free_port() -> u16 {
        (0xc000..=0xffffu16)
            .find(|&p| UdpSocket::bind(("127.0.0.1", p)).is_ok())
            .expect("a free port")
    }

    #[test]
    fn a_packet_leaves_from_its_port_and_nothing_comes_in() {
        let bound = local();
        let rx = local();
        let mut ports = SourcePorts::new(bound.local_addr().unwrap(), 4);
        let p = free_port();
        let fd = ports.fd(p).expect("a socket for the port");
        let dst = rx.local_addr().unwrap();
        let sent = UdpSocket::from(crate::sys::dup_cloexec(fd).unwrap());
        sent.send_to(b"roce", dst).unwrap();
        let mut buf = [0u8; 16];
        let (n, from) = rx.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from.port()), (&b"roce"[..], p));
        // The port's socket takes nothing in.
        rx.send_to(b"back", SocketAddr::new(from.ip(), p)).unwrap();
        sent.set_nonblocking(true).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            sent.recv_from(&mut buf).is_err(),
            "the send socket queued a datagram"
        );
        // The same port again: the same socket; the bound socket's own port: none.
        assert_eq!(ports.fd(p), Some(fd));
        assert_eq!(ports.fd(bound.local_addr().unwrap().port()), None);
        assert_eq!((ports.open_now(), ports.opened), (1, 1));
    }

    #[test]
    fn two_halves_share_a_port_and_a_foreign_socket_makes_it_fall_back() {
        let bound = local();
        let mut a = SourcePorts::new(bound.local_addr().unwrap(), 4);
        let mut b = a.sibling();
        let p = free_port();
        assert!(
            a.fd(p).is_some() && b.fd(p).is_some(),
            "SO_REUSEADDR on both"
        );
        // A socket of another program on a port (no SO_REUSEADDR): the bound port instead,
        // and the port is not tried again for a while.
        let foreign = UdpSocket::bind("127.0.0.1:0").unwrap();
        let q = foreign.local_addr().unwrap().port();
        assert_eq!(a.fd(q), None);
        assert_eq!(a.fd(q), None);
        assert_eq!(a.opened, 1);
    }

    #[test]
    fn the_cap_closes_the_least_recently_used() {
        let bound = local();
        let mut ports = SourcePorts::new(bound.local_addr().unwrap(), 2);
        let mut free = (0xc000..=0xffffu16).filter(|&p| UdpSocket::bind(("127.0.0.1", p)).is_ok());
        let (p1, p2, p3) = (
            free.next().unwrap(),
            free.next().unwrap(),
            free.next().unwrap(),
        );
        ports.fd(p1).unwrap();
        ports.fd(p2).unwrap();
        // p1 used more recently than p2 (a later epoch)
        ports.epoch += 1;
        ports.fd(p1).unwrap();
        ports.fd(p3).unwrap();
        assert_eq!(ports.open_now(), 2);
        assert!(ports.map.contains_key(&p1) && ports.map.contains_key(&p3));
        assert!(
            !ports.map.contains_key(&p2),
            "the least recently used was closed"
        );
        // Off: every packet from the bound port.
        let mut off = SourcePorts::new(bound.local_addr().unwrap(), 0);
        assert_eq!(off.fd(p1), None);
    }

    #[test]
    fn idle_sockets_are_closed() {
        let bound = local();
        let mut ports = SourcePorts::new(bound.local_addr().unwrap(), 8);
        let p = free_port();
        ports.fd(p).unwrap();
        // As if IDLE_SECS passed since the last use.
        ports.swept -= Duration::from_secs(IDLE_SECS);
        ports.sweep();
        assert_eq!(ports.open_now(), 0);
        assert!(ports.map.is_empty());
    }
}
