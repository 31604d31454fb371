//! System helpers below every room: the socket FFI the transports and the net room share
//! (socket options, C socket addresses, interface requests), file descriptors the daemon owns
//! on behalf of a library (vhost-user-backend's worker exit events), and dropping privileges.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::sync::lock;

/// A worker thread's exit event for vhost-user-backend; its fd is kept in `fds` for
/// [`close_exit_fds`].
pub(crate) fn exit_event(fds: &Mutex<Vec<RawFd>>) -> Option<(EventConsumer, EventNotifier)> {
    let (c, n) = new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC).ok()?;
    lock(fds).push(c.as_raw_fd());
    Some((c, n))
}

/// Closes the exit-event fds vhost-user-backend leaks. Call only after the `VhostUserDaemon`
/// that used them was dropped (its threads joined).
pub(crate) fn close_exit_fds(fds: &Mutex<Vec<RawFd>>) {
    for fd in lock(fds).drain(..) {
        // SAFETY: `fd` came from an EventConsumer we created, whose ownership
        // vhost-user-backend took with `into_raw_fd()` and abandoned; its epoll (the only
        // user) is closed, so nothing else refers to it.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
    }
}

/// A non-blocking, close-on-exec UDP socket of `addr`'s family, set up by `setup` (socket
/// options that must come first) and then bound to `addr`: what the transports' extra
/// sockets share (a steered group's, a source port's, a multicast group's).
pub(crate) fn bound_udp_socket(
    addr: SocketAddr,
    setup: impl FnOnce(RawFd) -> io::Result<()>,
) -> io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    let flags = libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: plain socket(2); the fd is checked and owned right away.
    let fd = unsafe { libc::socket(family, flags, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new socket nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    setup(fd.as_raw_fd())?;
    let mut ss = zeroed_sockaddr();
    let len = sockaddr_from(addr, &mut ss);
    // SAFETY: `ss` holds a socket address of `len` bytes.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&ss as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A new descriptor (close-on-exec) of the open file `fd`: to put a socket in an epoll a
/// second time (for writability) or keep it there after its owner closed its own.
pub(crate) fn dup_cloexec(fd: RawFd) -> io::Result<std::os::fd::OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC makes a new fd of an fd the caller holds open.
    let d = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if d < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `d` was just created and is owned by nobody else.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(d) })
}

/// Raises the soft limit of open files to `want` (at most the hard limit); says so when the
/// hard limit is lower.
pub fn raise_nofile(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } < 0 || r.rlim_cur >= want {
        return;
    }
    let to = want.min(r.rlim_max);
    if to < want {
        log::warn!(
            "the open-file limit is {} (hard): below the {want} the source-port sockets may need; their packets then leave from the bound port",
            r.rlim_max
        );
    }
    if to > r.rlim_cur {
        r.rlim_cur = to;
        // SAFETY: setrlimit reads the struct it is given.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
    }
}

/// Drops every privilege of the calling thread for good, as the daemon does once its sockets
/// are open: no capability in any set (effective, permitted, inheritable, ambient, and the
/// bounding set where the thread may still change it) and no new privileges through exec.
/// Threads the caller spawns afterwards inherit this; a thread that already runs calls it
/// itself. A process that had no privileges loses nothing and this succeeds.
pub fn drop_privileges() -> std::io::Result<()> {
    use std::io;
    let check = |r: libc::c_int, what: &str| {
        if r < 0 {
            let e = io::Error::last_os_error();
            Err(io::Error::new(e.kind(), format!("{what}: {e}")))
        } else {
            Ok(())
        }
    };
    // SAFETY: prctl with integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    check(r, "PR_SET_NO_NEW_PRIVS")?;
    // SAFETY: as above. Kernels before 4.3 have no ambient set (EINVAL): nothing to clear.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        check(r, "PR_CAP_AMBIENT_CLEAR_ALL")?;
    }
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    for cap in 0..=last {
        // SAFETY: as above. Without CAP_SETPCAP this fails with EPERM: such a thread cannot
        // regain what it does not hold anyway.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r < 0 {
            let e = io::Error::last_os_error().raw_os_error();
            if e != Some(libc::EPERM) && e != Some(libc::EINVAL) {
                check(r, "PR_CAPBSET_DROP")?;
            }
        }
    }
    // capset(2), version 3: two 32-bit words per set, all zero.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: `header` and `data` are live and laid out as the kernel's
    // __user_cap_header_struct and two __user_cap_data_struct.
    let r = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    check(r as libc::c_int, "capset")
}

/// `setsockopt(fd, level, name, v)` with the option value `v` (an `i32`, a `timeval`, a
/// `sock_fprog`, ...).
pub(crate) fn setsockopt<T>(fd: RawFd, level: i32, name: i32, v: &T) -> io::Result<()> {
    // SAFETY: `v` is a live value of the size we pass; the kernel only reads it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes `a` as a C socket address; returns its length.
pub(crate) fn sockaddr_from(a: SocketAddr, out: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((out as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((out as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads a C socket address the kernel wrote.
pub(crate) fn sockaddr_to(s: &libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    match s.ss_family as i32 {
        libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in, which it is aligned
            // for and larger than.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for sockaddr_in6.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// An all-zero `sockaddr_storage`, for the kernel or [`sockaddr_from`] to fill.
pub(crate) fn zeroed_sockaddr() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data for which all zeroes is a valid value.
    unsafe { std::mem::zeroed() }
}

/// An `ifreq` naming `name` (at most IFNAMSIZ - 1 bytes).
pub(crate) fn ifreq(name: &str) -> Option<libc::ifreq> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= libc::IFNAMSIZ || b.contains(&0) {
        return None;
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut r: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in r.ifr_name.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    Some(r)
}

/// A netlink socket of `protocol` (NETLINK_ROUTE, NETLINK_GENERIC, ...) whose receives give up
/// after `rcv_timeout_s` seconds.
pub(crate) fn netlink_socket(protocol: i32, rcv_timeout_s: i64) -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval {
        tv_sec: rcv_timeout_s,
        tv_usec: 0,
    };
    setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
    Ok(fd)
}

/// A route netlink socket (NETLINK_ROUTE), bound to the multicast `groups` (none: 0), whose
/// receives give up after `rcv_timeout_s` seconds: for a request the kernel answers at once
/// (`net::netlink`) and for following a link (`transport::link_watch`).
pub(crate) fn route_netlink(groups: u32, rcv_timeout_s: i64) -> io::Result<OwnedFd> {
    let fd = netlink_socket(libc::NETLINK_ROUTE, rcv_timeout_s)?;
    if groups != 0 {
        // SAFETY: a zeroed sockaddr_nl with the family and groups set is valid.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as u16;
        sa.nl_groups = groups;
        // SAFETY: `sa` is a sockaddr_nl of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Sends the netlink message `msg` to the kernel on `fd`.
pub(crate) fn netlink_send(fd: RawFd, msg: &[u8]) -> io::Result<()> {
    // SAFETY: sockaddr_nl is plain data; zero is the kernel's address.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: `msg` is live for `msg.len()` bytes; `sa` is a valid sockaddr_nl.
    let r = unsafe {
        libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
