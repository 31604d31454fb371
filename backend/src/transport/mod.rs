//! The host attachment the worker sends and receives through: the `udp` transport (a kernel
//! UDP socket, [`crate::transport::udp`]) or the `raw` one (an AF_PACKET socket on an interface,
//! [`crate::transport::raw`]). Both hand the worker batches of checked RoCE packets and take the
//! engine's packets through [`PacketSink`].

pub mod egress;
pub mod filter;
pub mod io_thread;
pub mod link_watch;
pub mod live_qpns;
pub mod mcast;
pub mod neighbour;
pub mod raw;
pub mod same_host;
pub mod sink;
pub mod socket;
pub mod sport;
pub mod stats;
pub mod steer;
pub mod udp;

use std::os::fd::RawFd;

use rxe_core::device::{RecvMeta, Transmit};
use rxe_core::Gid;

use crate::transport::egress::EgressPolicy;
use crate::transport::raw::RawTransport;
use crate::transport::sink::PacketSink;
use crate::transport::stats::TransportStats;
use crate::transport::udp::UdpTransport;

/// Logs a packet the kernel refused to send, once per cause in each rate-limit window
/// ([`crate::ratelog`]; the packets themselves are counted in `tx_dropped`), with what to
/// check: a wrong `--mtu`, a route, a closed peer port, a firewall.
/// `to`: the destination's address (the udp transport), for the path MTU in an EMSGSIZE line.
pub(crate) fn log_send_error(
    via: &str,
    dst: &dyn std::fmt::Display,
    to: Option<std::net::IpAddr>,
    e: &std::io::Error,
) {
    match e.raw_os_error() {
        Some(libc::EMSGSIZE) => crate::warn_limited!(
            "{via}: sending to {dst}: {e}: a packet longer than the path takes; {}",
            match to.and_then(path_mtu) {
                Some(m) => format!(
                    "the path MTU to {} is {m} (the route's, or an ICMP message on the way said so): give the port --mtu {m} or less, or raise the MTU on the way",
                    to.expect("some")
                ),
                None => "is --mtu above the interface's MTU?".to_string(),
            }
        ),
        Some(libc::ECONNREFUSED) => crate::warn_limited!(
            "{via}: sending to {dst}: {e}: nothing listens on the peer's RoCE port (is its daemon or rdma_rxe up, is --peer-port right?)"
        ),
        Some(libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN) => crate::warn_limited!(
            "{via}: sending to {dst}: {e}: no route to the peer; check this host's routes and addresses"
        ),
        Some(libc::ENETDOWN) => crate::warn_limited!(
            "{via}: sending to {dst}: {e}: the interface is down (the guest's port is DOWN until it is up)"
        ),
        Some(libc::EPERM | libc::EACCES) => {
            crate::warn_limited!("{via}: sending to {dst}: {e}: refused by a firewall rule")
        }
        _ => crate::warn_limited!("{via}: sending to {dst}: {e}"),
    }
}

/// The path MTU the kernel knows to `dst`: its route's, or a smaller one an ICMP
/// "fragmentation needed" or "packet too big" taught it (a connected socket's `IP_MTU`).
pub(crate) fn path_mtu(dst: std::net::IpAddr) -> Option<u32> {
    let any: std::net::SocketAddr = if dst.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let s = std::net::UdpSocket::bind(any).ok()?;
    s.connect((dst, 4791)).ok()?;
    let (level, name) = if dst.is_ipv4() {
        (libc::IPPROTO_IP, libc::IP_MTU)
    } else {
        (libc::IPPROTO_IPV6, libc::IPV6_MTU)
    };
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&s),
            level,
            name,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (r == 0 && v > 0).then_some(v as u32)
}

pub enum Transport {
    Udp(UdpTransport),
    Raw(RawTransport),
}

macro_rules! each {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            Transport::Udp($t) => $e,
            Transport::Raw($t) => $e,
        }
    };
}

impl Transport {
    /// The fd the worker waits on for input (and, duplicated, for writability).
    pub fn fd(&self) -> RawFd {
        each!(self, t => t.fd())
    }

    /// The multicast groups the udp transport joins, as the model publishes them.
    pub fn groups(&self) -> Option<std::sync::Arc<crate::transport::mcast::Groups>> {
        match self {
            Transport::Udp(t) => t.groups(),
            Transport::Raw(_) => None,
        }
    }

    /// The udp transport's multicast sockets opened and to close ([`UdpTransport::sync_groups`]).
    pub fn sync_groups(&mut self) -> (Vec<RawFd>, Vec<std::os::fd::OwnedFd>) {
        match self {
            Transport::Udp(t) => t.sync_groups(),
            Transport::Raw(_) => Default::default(),
        }
    }

    /// While blocked: the udp transport's source-port socket that is full, to wait on for
    /// writability instead of [`Self::fd`].
    pub fn blocked_port_fd(&self) -> Option<RawFd> {
        match self {
            Transport::Udp(t) => t.blocked_port_fd(),
            Transport::Raw(_) => None,
        }
    }

    /// The GIDs the device sources from: the UDP socket's address, or the raw addresses.
    pub fn gids(&self) -> Vec<Gid> {
        match self {
            Transport::Udp(t) => vec![t.gid()],
            Transport::Raw(t) => t.gids(),
        }
    }

    /// Whether the addresses follow the guest's GID table (raw beside a virtio-net).
    pub fn follows_gids(&self) -> bool {
        matches!(self, Transport::Raw(t) if t.follows_gids())
    }

    /// Takes RoCE for the IP addresses of `gids` (see [`RawTransport::set_addrs`]); nothing
    /// for a transport that does not follow the guest's GIDs.
    pub fn follow_gids(&mut self, gids: &[Gid]) -> std::io::Result<()> {
        match self {
            Transport::Raw(t) if t.follows_gids() => {
                let addrs: Vec<std::net::IpAddr> = gids.iter().map(|g| g.to_ip()).collect();
                t.set_addrs(&addrs)
            }
            _ => Ok(()),
        }
    }

    /// The interface the port stands on: the raw transport's, or the one that holds the
    /// udp transport's address (none for a wildcard address).
    pub fn port_ifindex(&self) -> Option<u32> {
        match self {
            Transport::Udp(t) => link_watch::LinkWatch::index_of(t.local_addr().ip()),
            Transport::Raw(t) => u32::try_from(t.info().index).ok(),
        }
    }

    pub fn stats(&self) -> TransportStats {
        match self {
            Transport::Udp(t) => t.all_stats(),
            Transport::Raw(t) => t.stats,
        }
    }

    pub fn set_egress(&mut self, p: EgressPolicy) {
        each!(self, t => t.set_egress(p))
    }

    /// The device's live QPs, for the receive path's cheap checks (the udp transport's: the
    /// raw one sees the IPv4 ID and has no solve to spare).
    pub fn set_live_qpns(&mut self, q: std::sync::Arc<live_qpns::LiveQpns>) {
        if let Transport::Udp(t) = self {
            t.set_live_qpns(q);
        }
    }

    pub fn recv_batch(&mut self) -> usize {
        each!(self, t => t.recv_batch())
    }

    pub fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])> {
        each!(self, t => t.packet(i))
    }

    pub fn drop_unattached(&mut self, max: usize) -> usize {
        each!(self, t => t.drop_unattached(max))
    }

    /// The same-host inbox (`--same-host`, udp transport only).
    pub fn same_host_inbox(&self) -> Option<std::sync::Arc<crate::transport::same_host::Inbox>> {
        match self {
            Transport::Udp(t) => t.same_host_inbox().cloned(),
            Transport::Raw(_) => None,
        }
    }

    /// The I/O thread's inbox (`--io-thread`, udp transport only): the worker then takes
    /// received packets from there and never reads the socket.
    pub fn io_inbox(&self) -> Option<std::sync::Arc<crate::transport::same_host::Inbox>> {
        match self {
            Transport::Udp(t) => t.io_inbox(),
            Transport::Raw(_) => None,
        }
    }

    /// The guest memory the packets of the next pump are built from (`--same-host`, udp
    /// transport only: packets to another device of the process refer to it).
    pub fn set_payload_source(
        &mut self,
        mem: Option<std::sync::Arc<crate::memory::guest_mem::GuestMemoryMmap>>,
    ) {
        if let Transport::Udp(t) = self {
            t.set_payload_source(mem);
        }
    }

    pub fn rx_failing(&self) -> bool {
        each!(self, t => t.rx_failing())
    }
}

impl PacketSink for Transport {
    fn next_buf(&mut self) -> &mut [u8] {
        each!(self, t => t.next_buf())
    }

    fn push(&mut self, tx: &Transmit) {
        each!(self, t => t.push(tx))
    }

    fn flush(&mut self) {
        each!(self, t => t.flush())
    }

    fn blocked(&self) -> bool {
        each!(self, t => t.blocked())
    }

    fn takes_refs(&self) -> bool {
        each!(self, t => t.takes_refs())
    }

    fn wants_refs(&mut self, tx: &Transmit) -> bool {
        each!(self, t => t.wants_refs(tx))
    }

    fn segment(&self) -> usize {
        each!(self, t => t.segment())
    }

    fn in_memory(&self, dst: &rxe_core::types::Gid) -> bool {
        each!(self, t => t.in_memory(dst))
    }

    fn push_refs(
        &mut self,
        tx: &Transmit,
        roce: &[u8],
        refs: &[crate::memory::payload_ref::PayloadRef],
    ) {
        each!(self, t => t.push_refs(tx, roce, refs))
    }
}
