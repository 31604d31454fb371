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
