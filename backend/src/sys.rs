//! System helpers below every room: file descriptors the daemon owns on behalf of a library
//! (vhost-user-backend's worker exit events).

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
