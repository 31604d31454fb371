//! The daemon's clock: engine time ([`now`], CLOCK_MONOTONIC), the timerfd the worker arms
//! with the engine's deadlines ([`Timer`]), and the back-off of a failing socket
//! ([`RxBackoff`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use crate::sync::lock;

/// Engine time: CLOCK_MONOTONIC in nanoseconds.
pub fn now() -> rxe_core::Instant {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    rxe_core::Instant(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// A non-blocking CLOCK_MONOTONIC timerfd armed with absolute deadlines.
pub struct Timer {
    fd: OwnedFd,
    /// The deadline the kernel holds, so re-arming with the same one costs no syscall.
    armed: Mutex<Option<rxe_core::Instant>>,
}

impl Timer {
    pub fn new() -> io::Result<Timer> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Timer {
            // SAFETY: `fd` was just created and is owned by nobody else.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: Mutex::new(None),
        })
    }
    /// Arms for `at` (engine time), or disarms with `None`.
    pub fn arm(&self, at: Option<rxe_core::Instant>) {
        let mut armed = lock(&self.armed);
        if *armed == at {
            return;
        }
        *armed = at;
        let mut v: libc::itimerspec =
            // SAFETY: itimerspec is plain integers; all-zero is a valid (disarmed) value.
            unsafe { std::mem::zeroed() };
        if let Some(t) = at {
            let ns = t.0.max(1);
            v.it_value.tv_sec = (ns / 1_000_000_000) as libc::time_t;
            v.it_value.tv_nsec = (ns % 1_000_000_000) as libc::c_long;
        }
        // SAFETY: the fd is a timerfd we own; `v` is a valid itimerspec.
        unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &v,
                std::ptr::null_mut(),
            )
        };
    }
    /// Arms for `at` if that is sooner than the deadline held (or none is).
    pub fn arm_sooner(&self, at: Option<rxe_core::Instant>) {
        let Some(at) = at else {
            return;
        };
        if lock(&self.armed).is_none_or(|held| at < held) {
            self.arm(Some(at));
        }
    }

    pub fn consume(&self) {
        let mut b = [0u8; 8];
        // SAFETY: reading 8 bytes into a live buffer from a non-blocking timerfd we own.
        unsafe { libc::read(self.fd.as_raw_fd(), b.as_mut_ptr().cast(), 8) };
        // It fired: the kernel holds no deadline any more.
        *lock(&self.armed) = None;
    }
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// How long the receive path leaves a failing socket alone: 1 ms, doubling while it keeps
/// failing, up to [`RxBackoff::MAX_NS`]; back to nothing once a receive works.
#[derive(Debug, Default)]
pub struct RxBackoff {
    /// The socket is out of the epoll until then.
    pub until: Option<rxe_core::Instant>,
    delay_ns: u64,
}

impl RxBackoff {
    pub const MIN_NS: u64 = 1_000_000;
    pub const MAX_NS: u64 = 1_000_000_000;

    /// The socket failed at `now`: until when to leave it alone.
    pub fn fail(&mut self, now: rxe_core::Instant) -> rxe_core::Instant {
        self.delay_ns = (self.delay_ns * 2).clamp(Self::MIN_NS, Self::MAX_NS);
        let until = now.plus_ns(self.delay_ns);
        self.until = Some(until);
        until
    }

    /// A receive worked.
    pub fn ok(&mut self) {
        self.delay_ns = 0;
    }
}
