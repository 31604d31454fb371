//! The state of the link a transport's port stands on, as the guest sees its port: the
//! interface up with a carrier (`IFF_UP` and `IFF_RUNNING`, as Linux rxe reports its port
//! ACTIVE when its netdev runs and has a carrier, DOWN otherwise). A route netlink socket
//! subscribed to the link group follows the interface; the worker waits on it and turns a
//! change into a PORT_ACTIVE or PORT_ERR event.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

const RTMGRP_LINK: u32 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const IFF_UP: u32 = 0x1;
const IFF_RUNNING: u32 = 0x40;
/// nlmsghdr (16 bytes) and ifinfomsg (16 bytes).
const HDR: usize = 16;
const IFI: usize = 16;

/// One interface's link state, followed through route netlink.
pub struct LinkWatch {
    fd: OwnedFd,
    index: u32,
    up: bool,
    seq: u32,
}

impl LinkWatch {
    /// Follows interface `index`, whose state now is asked for first.
    pub fn open(index: u32) -> io::Result<LinkWatch> {
        // The first answer is waited for (bounded): the kernel answers at once.
        let fd = crate::sys::route_netlink(RTMGRP_LINK, 2)?;
        let mut w = LinkWatch {
            fd,
            index,
            up: false,
            seq: 0,
        };
        w.ask()?;
        let mut buf = vec![0u8; 32 << 10];
        loop {
            let n = w.recv(&mut buf, 0)?;
            match w.parse(&buf[..n]) {
                Reply::State(up) => {
                    w.up = up;
                    break;
                }
                Reply::Error(e) => return Err(e),
                Reply::None => {}
            }
        }
        // From now on read when the worker's epoll says so.
        // SAFETY: fcntl on an fd this struct owns.
        let r = unsafe { libc::fcntl(w.fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(w)
    }

    /// The interface that holds `ip` (None for a wildcard address or one no interface holds).
    pub fn index_of(ip: IpAddr) -> Option<u32> {
        if ip.is_unspecified() {
            return None;
        }
        let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `list`, freed below.
        if unsafe { libc::getifaddrs(&mut list) } != 0 {
            return None;
        }
        let mut found = None;
        let mut p = list;
        while !p.is_null() {
            // SAFETY: a node of the list getifaddrs returned, alive until freeifaddrs.
            let a = unsafe { &*p };
            p = a.ifa_next;
            if a.ifa_addr.is_null() {
                continue;
            }
            // SAFETY: ifa_addr points at a sockaddr of the family it names.
            let here = unsafe {
                match (*a.ifa_addr).sa_family as i32 {
                    libc::AF_INET => {
                        let s = &*(a.ifa_addr as *const libc::sockaddr_in);
                        Some(IpAddr::from(u32::from_be(s.sin_addr.s_addr).to_be_bytes()))
                    }
                    libc::AF_INET6 => {
                        let s = &*(a.ifa_addr as *const libc::sockaddr_in6);
                        Some(IpAddr::from(s.sin6_addr.s6_addr))
                    }
                    _ => None,
                }
            };
            if here == Some(ip.to_canonical()) {
                // SAFETY: ifa_name is a NUL-terminated name.
                let i = unsafe { libc::if_nametoindex(a.ifa_name) };
                if i != 0 {
                    found = Some(i);
                    break;
                }
            }
        }
        // SAFETY: the list getifaddrs returned, not used after.
        unsafe { libc::freeifaddrs(list) };
        // Any address of 127/8 (::1) is local through lo's local route.
        found.or_else(|| {
            // SAFETY: a NUL-terminated name.
            let lo = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
            (ip.to_canonical().is_loopback() && lo != 0).then_some(lo)
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    /// Whether the link is up with a carrier, as last seen.
    pub fn up(&self) -> bool {
        self.up
    }

    /// Reads what the kernel said since the last call; the new state when it changed.
    pub fn read(&mut self) -> Option<bool> {
        let was = self.up;
        let mut buf = vec![0u8; 32 << 10];
        loop {
            match self.recv(&mut buf, libc::MSG_DONTWAIT) {
                Ok(n) => {
                    if let Reply::State(up) = self.parse(&buf[..n]) {
                        self.up = up;
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    // Messages were lost: ask again, the answer comes with the next ones.
                    let _ = self.ask();
                }
                Err(_) => break,
            }
        }
        (self.up != was).then_some(self.up)
    }

    /// Asks the kernel for the interface's state (RTM_GETLINK for its index).
    fn ask(&mut self) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let mut m = [0u8; HDR + IFI];
        m[0..4].copy_from_slice(&((HDR + IFI) as u32).to_ne_bytes());
        m[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
        m[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        m[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        m[HDR] = libc::AF_UNSPEC as u8;
        m[HDR + 4..HDR + 8].copy_from_slice(&(self.index as i32).to_ne_bytes());
        crate::sys::netlink_send(self.fd.as_raw_fd(), &m)
    }

    fn recv(&self, buf: &mut [u8], flags: i32) -> io::Result<usize> {
        // SAFETY: receives into `buf`, valid for its length.
        let n = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// The last word on this interface in one datagram of netlink messages.
    fn parse(&self, mut b: &[u8]) -> Reply {
        let mut out = Reply::None;
        while b.len() >= HDR {
            let len = u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize;
            if len < HDR || len > b.len() {
                break;
            }
            let ty = u16::from_ne_bytes(b[4..6].try_into().unwrap());
            let seq = u32::from_ne_bytes(b[8..12].try_into().unwrap());
            let body = &b[HDR..len];
            match ty {
                RTM_NEWLINK | RTM_DELLINK if body.len() >= IFI => {
                    let index = i32::from_ne_bytes(body[4..8].try_into().unwrap());
                    let flags = u32::from_ne_bytes(body[8..12].try_into().unwrap());
                    if index as u32 == self.index {
                        let up = ty == RTM_NEWLINK
                            && flags & (IFF_UP | IFF_RUNNING) == IFF_UP | IFF_RUNNING;
                        out = Reply::State(up);
                    }
                }
                NLMSG_ERROR if seq == self.seq && body.len() >= 4 => {
                    let e = i32::from_ne_bytes(body[0..4].try_into().unwrap());
                    if e < 0 {
                        out = Reply::Error(io::Error::from_raw_os_error(-e));
                    }
                }
                _ => {}
            }
            b = &b[len.next_multiple_of(4).min(b.len())..];
        }
        out
    }
}

enum Reply {
    None,
    State(bool),
    Error(io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback: index 1, up and running in any namespace that has brought it up.
    #[test]
    fn loopback_is_followed() {
        let i = LinkWatch::index_of("127.0.0.1".parse().unwrap());
        assert_eq!(i, Some(1), "127.0.0.1 is on lo");
        let mut w = LinkWatch::open(1).expect("a route netlink socket");
        assert!(w.up(), "lo is up");
        assert_eq!(w.read(), None, "nothing changed");
        assert_eq!(
            LinkWatch::index_of("127.77.0.1".parse().unwrap()),
            Some(1),
            "127/8 on lo"
        );
        assert_eq!(LinkWatch::index_of("0.0.0.0".parse().unwrap()), None);
        assert_eq!(LinkWatch::index_of("192.0.2.77".parse().unwrap()), None);
    }

    #[test]
    fn a_missing_interface_is_an_error() {
        let e = LinkWatch::open(0x7fff_fff0)
            .err()
            .expect("no such interface");
        assert_eq!(e.raw_os_error(), Some(libc::ENODEV), "{e}");
    }
}
