//! UD multicast on the udp transport: the groups the guest's QPs are attached to
//! (ATTACH_MCAST), joined on the host so that their datagrams reach the daemon.
//!
//! A socket bound to a unicast address never receives multicast, so each group gets a socket
//! of its own, bound to the group's address and the peers' RoCE port (`SO_REUSEADDR`: every
//! daemon on a host in the group binds the same), that joins the group on the interface of
//! the transport's address (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`; IGMP or MLD tell the
//! network) and takes that group only (`IP_MULTICAST_ALL` off). The worker waits on these
//! sockets with the bound one (its receive event) and the transport reads them in the same
//! batch; a datagram's ICRC is checked against the group address, its destination.
//! Sending needs nothing: a datagram to a group leaves from the transport's sockets, on the
//! interface of their address, and the host loops a copy back to its own members (the
//! sender's device included, as Linux rxe's).
//!
//! The device model publishes the set of groups its engine has members of ([`Groups`]) after
//! each command that can change it; the worker then brings the sockets in line
//! ([`GroupSockets::sync`]).

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rxe_core::Gid;

use crate::sync::lock;
use crate::sys::setsockopt;

/// `IPV6_MULTICAST_ALL` (linux/in6.h).
const IPV6_MULTICAST_ALL: i32 = 29;

/// The groups the device's QPs are attached to, as the model last published them.
#[derive(Debug, Default)]
pub struct Groups {
    wanted: Mutex<Vec<Gid>>,
    changed: AtomicBool,
}

impl Groups {
    /// The engine's groups now (the model, after a command that may change them).
    pub fn publish(&self, mut groups: Vec<Gid>) {
        groups.sort_by_key(|g| g.0);
        let mut w = lock(&self.wanted);
        if *w != groups {
            *w = groups;
            self.changed.store(true, Ordering::Release);
        }
    }

    /// Whether the groups changed since the last [`Self::take_changed`].
    pub fn pending(&self) -> bool {
        self.changed.load(Ordering::Acquire)
    }

    /// The groups, if they changed since the last call.
    pub fn take_changed(&self) -> Option<Vec<Gid>> {
        if !self.changed.swap(false, Ordering::AcqRel) {
            return None;
        }
        Some(lock(&self.wanted).clone())
    }
}

/// The group sockets of one udp transport.
pub struct GroupSockets {
    /// The transport's own address: the interface to join on.
    local: IpAddr,
    /// The peers' RoCE port, where group datagrams go.
    port: u16,
    joined: Vec<(SocketAddr, OwnedFd)>,
}

impl GroupSockets {
    pub fn new(local: IpAddr, port: u16) -> GroupSockets {
        GroupSockets {
            local,
            port,
            joined: Vec::new(),
        }
    }

    /// The joined groups: (group address and port, socket).
    pub fn sockets(&self) -> impl Iterator<Item = (SocketAddr, RawFd)> + '_ {
        self.joined.iter().map(|(a, s)| (*a, s.as_raw_fd()))
    }

    /// Joins the groups of `wanted` (of this transport's family) not joined yet and leaves
    /// the others; returns the sockets opened (to wait on) and those to close (after the
    /// caller stopped waiting on them). A group that cannot be joined is logged and left out.
    pub fn sync(&mut self, wanted: &[Gid]) -> (Vec<RawFd>, Vec<OwnedFd>) {
        let want: Vec<SocketAddr> = wanted
            .iter()
            .map(|g| g.to_ip())
            .filter(|ip| ip.is_multicast() && ip.is_ipv4() == self.local.is_ipv4())
            .map(|ip| SocketAddr::new(ip, self.port))
            .collect();
        let mut gone = Vec::new();
        let mut i = 0;
        while i < self.joined.len() {
            if want.contains(&self.joined[i].0) {
                i += 1;
            } else {
                let (a, s) = self.joined.swap_remove(i);
                log::info!("udp transport: left multicast group {}", a.ip());
                gone.push(s);
            }
        }
        let mut added = Vec::new();
        for a in want {
            if self.joined.iter().any(|(j, _)| *j == a) {
                continue;
            }
            match join(a, self.local) {
                Ok(s) => {
                    log::info!(
                        "udp transport: joined multicast group {} on the interface of {}",
                        a.ip(),
                        self.local
                    );
                    added.push(s.as_raw_fd());
                    self.joined.push((a, s));
                }
                Err(e) => crate::warn_limited!(
                    "udp transport: cannot join multicast group {}: {e}; its datagrams do not reach this device",
                    a.ip()
                ),
            }
        }
        (added, gone)
    }
}

/// A non-blocking socket bound to `group` that joined it on the interface of `local`.
fn join(group: SocketAddr, local: IpAddr) -> io::Result<OwnedFd> {
    crate::sys::bound_udp_socket(group, |raw| {
        setsockopt(raw, libc::SOL_SOCKET, libc::SO_REUSEADDR, &1i32)?;
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, &(1i32 << 20));
        match (group.ip(), local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => {
                setsockopt(raw, libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, &0i32)?;
                let m = libc::ip_mreq {
                    imr_multiaddr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(g.octets()),
                    },
                    imr_interface: libc::in_addr {
                        s_addr: u32::from_ne_bytes(l.octets()),
                    },
                };
                setsockopt(raw, libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &m)
            }
            (IpAddr::V6(g), l) => {
                setsockopt(raw, libc::IPPROTO_IPV6, IPV6_MULTICAST_ALL, &0i32)?;
                let ifindex = crate::transport::link_watch::LinkWatch::index_of(l).unwrap_or(0);
                let m = libc::ipv6_mreq {
                    ipv6mr_multiaddr: libc::in6_addr {
                        s6_addr: g.octets(),
                    },
                    ipv6mr_interface: ifindex,
                };
                setsockopt(raw, libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP, &m)
            }
            _ => Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;

    #[test]
    fn groups_publish_changes_only() {
        let g = Groups::default();
        assert!(g.take_changed().is_none());
        let a = Gid::from_ip("239.1.2.3".parse().unwrap());
        g.publish(vec![a]);
        assert_eq!(g.take_changed(), Some(vec![a]));
        g.publish(vec![a]);
        assert!(g.take_changed().is_none(), "the same set is no change");
        g.publish(vec![]);
        assert_eq!(g.take_changed(), Some(vec![]));
    }

    /// On loopback (which takes multicast when it has the group's route): a joined group's
    /// datagrams reach its socket; leaving closes it.
    #[test]
    fn a_joined_group_receives_and_a_left_one_does_not() {
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let tx = UdpSocket::bind((local, 0)).unwrap();
        let port = tx.local_addr().unwrap().port();
        let mut s = GroupSockets::new(local, port);
        let g = Gid::from_ip("239.7.7.7".parse().unwrap());
        let (added, gone) = s.sync(&[g, Gid::from_ip("10.0.0.1".parse().unwrap())]);
        if added.is_empty() {
            // No multicast route to loopback here (a host without one): nothing to check.
            return vur_testkit::skip(
                "a_joined_group_receives_and_a_left_one_does_not",
                "joining 239.7.7.7 on loopback failed",
            );
        }
        assert_eq!(
            (added.len(), gone.len()),
            (1, 0),
            "the unicast GID is no group"
        );
        let (addr, fd) = s.sockets().next().unwrap();
        assert_eq!(addr, SocketAddr::new("239.7.7.7".parse().unwrap(), port));
        let _ = fd;
        let (added, gone) = s.sync(&[]);
        assert_eq!((added.len(), gone.len()), (0, 1));
        assert_eq!(s.sockets().count(), 0);
    }
}
