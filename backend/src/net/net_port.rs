//! The guest's virtio-net side of a host interface: an AF_PACKET socket on the interface the
//! raw transport uses, whose kernel filter keeps exactly what the raw transport's drops
//! ([`FilterKind::NotRoce`]): RoCEv2 to the guest's addresses is the engine's, every other
//! frame for the guest's MAC or a group the guest's. Frames carry a virtio-net header both
//! ways (`PACKET_VNET_HDR`), so checksum offload and TSO pass between the guest and the
//! host's stack unchanged (the offloads the guest negotiated: [`crate::net::net_policy`]).

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::net::net_policy::NetPolicy;
use crate::net::stats::NetStats;
use crate::sys::setsockopt;
use crate::transport::raw::{
    attach_filter, bind_all, iface_info, net_filter_program, Companion, RawError,
};

const PACKET_ADD_MEMBERSHIP: i32 = 1;
const PACKET_MR_PROMISC: u16 = 1;
const PACKET_MR_ALLMULTI: u16 = 2;
const PACKET_MR_UNICAST: u16 = 3;
const PACKET_VNET_HDR: i32 = 15;
const PACKET_IGNORE_OUTGOING: i32 = 23;

/// Length of the header `PACKET_VNET_HDR` puts before a frame (`struct virtio_net_hdr`).
pub const VNET_HDR: usize = 10;
/// Largest frame either way: a 64 KiB TSO frame and its Ethernet header (VLAN tag included).
pub const MAX_FRAME: usize = 65535 + 18;
/// Longest a send waits for room in the socket's buffer before the frame is dropped.
const SEND_TIMEOUT_MS: i64 = 100;

/// The packet socket (see the module documentation).
pub struct NetPort {
    fd: OwnedFd,
    iface: String,
    mtu: u32,
    /// What the guest may send and receive ([`crate::net::net_policy`]).
    policy: NetPolicy,
    /// The addresses of the guest's GIDs (learned from ADD_GID and DEL_GID).
    learned: Mutex<Arc<Vec<IpAddr>>>,
    stats: Arc<NetStats>,
}

impl NetPort {
    /// Opens the socket on `iface`, keeping every frame but RoCEv2 to `roce_addrs` that is
    /// for the guest's MAC or a group (any MAC with `--net-any-mac`), and has the interface
    /// take the guest's MAC and every group for as long as the socket lives (the guest's MAC
    /// is not the interface's): a secondary unicast address (the kernel makes a device
    /// without unicast filtering promiscuous instead), all-multicast; promiscuous mode with
    /// `--net-any-mac`.
    pub fn open(
        iface: &str,
        roce_addrs: &[IpAddr],
        policy: NetPolicy,
        stats: Arc<NetStats>,
    ) -> Result<Self, RawError> {
        let info = iface_info(iface)?;
        if !info.up {
            return Err(RawError::InterfaceDown(iface.to_string()));
        }
        let err = |what, e| RawError::Io(what, iface.to_string(), e);
        // Blocking (sends wait for room, up to SEND_TIMEOUT_MS); receives use MSG_DONTWAIT.
        // Protocol 0 until bound: nothing is queued before the filter is in place.
        // SAFETY: plain syscall; the result is checked and owned below.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => RawError::NoCapNetRaw(iface.to_string()),
                _ => err("socket(AF_PACKET)", e),
            });
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let rx_mac = (!policy.any_mac).then_some(policy.mac);
        let mut prog = net_filter_program(roce_addrs, rx_mac).ok_or_else(|| {
            err(
                "building the packet filter",
                io::Error::other("too many addresses"),
            )
        })?;
        attach_filter(raw, &mut prog).map_err(|e| err("SO_ATTACH_FILTER", e))?;
        setsockopt(raw, libc::SOL_PACKET, PACKET_VNET_HDR, &1i32)
            .map_err(|e| err("PACKET_VNET_HDR", e))?;
        // Frames any local socket sends out of the interface (ours, the raw transport's) are
        // not input.
        setsockopt(raw, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32)
            .map_err(|e| err("PACKET_IGNORE_OUTGOING", e))?;
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &(4i32 << 20));
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, &(4i32 << 20));
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: SEND_TIMEOUT_MS * 1000,
        };
        setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &tv)
            .map_err(|e| err("SO_SNDTIMEO", e))?;
        bind_all(raw, info.index).map_err(|e| err("bind", e))?;
        let member = |kind: u16, mac: Option<[u8; 6]>| {
            // SAFETY: packet_mreq is plain data; all-zero is a valid value.
            let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
            mr.mr_ifindex = info.index;
            mr.mr_type = kind;
            if let Some(m) = mac {
                mr.mr_alen = 6;
                mr.mr_address[..6].copy_from_slice(&m);
            }
            setsockopt(raw, libc::SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr)
        };
        let own = match rx_mac {
            Some(m) => member(PACKET_MR_UNICAST, Some(m))
                .and_then(|()| member(PACKET_MR_ALLMULTI, None))
                .map_err(|e| {
                    log::info!(
                        "{iface}: no secondary address for the guest's MAC ({e}): promiscuous"
                    )
                })
                .is_ok(),
            None => false,
        };
        if !own {
            member(PACKET_MR_PROMISC, None)
                .map_err(|e| err("promiscuous mode (PACKET_ADD_MEMBERSHIP)", e))?;
        }
        Ok(NetPort {
            fd,
            iface: iface.to_string(),
            mtu: info.mtu,
            policy,
            learned: Mutex::new(Arc::new(roce_addrs.to_vec())),
            stats,
        })
    }

    pub fn policy(&self) -> &NetPolicy {
        &self.policy
    }

    /// The addresses of the guest's GIDs, as last learned.
    pub fn learned(&self) -> Arc<Vec<IpAddr>> {
        self.learned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Learns the guest's addresses from its GID table (`gids`); returns those RoCE is taken
    /// for ([`NetPolicy::roce_addrs`]).
    pub fn set_guest_addrs(&self, gids: &[IpAddr]) -> Vec<IpAddr> {
        *self.learned.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(gids.to_vec());
        self.stats.addrs.store(gids.len() as u64, Ordering::Relaxed);
        self.policy.roce_addrs(gids)
    }

    /// Lets RoCEv2 to `addrs` go to the raw transport instead (the filter is replaced in
    /// one step).
    pub fn set_roce_addrs(&self, addrs: &[IpAddr]) -> io::Result<()> {
        let rx_mac = (!self.policy.any_mac).then_some(self.policy.mac);
        let mut prog = net_filter_program(addrs, rx_mac)
            .ok_or_else(|| io::Error::other("too many addresses for the packet filter"))?;
        attach_filter(self.fd(), &mut prog)
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// The interface's MTU.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Receives one frame, its [`VNET_HDR`]-byte header first, into `buf`: `Ok(None)` when
    /// none is waiting, else its whole length (more than `buf.len()`: cut short).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: the kernel writes at most `buf.len()` bytes into the live buffer.
            let r = unsafe {
                libc::recv(
                    self.fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if r >= 0 {
                return Ok(Some(r as usize));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock => return Ok(None),
                io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
    }

    /// Sends one frame, its [`VNET_HDR`]-byte header first (the kernel checks the header:
    /// a bad one is `InvalidInput`). Waits up to 100 ms for room in the socket's buffer.
    pub fn send(&self, buf: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: the kernel reads at most `buf.len()` bytes of the live buffer.
            let r = unsafe { libc::send(self.fd(), buf.as_ptr().cast(), buf.len(), 0) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Companion for NetPort {
    fn set_guest_addrs(&self, gids: &[IpAddr]) -> Vec<IpAddr> {
        NetPort::set_guest_addrs(self, gids)
    }

    fn set_roce_addrs(&self, addrs: &[IpAddr]) -> io::Result<()> {
        NetPort::set_roce_addrs(self, addrs)
    }
}
