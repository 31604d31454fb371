//! Where a counters reader asks the worker for a rendering and waits for it: the worker
//! renders between two events, so that a reader never holds the device's locks.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use vmm_sys_util::eventfd::EventFd;

use crate::sync::lock;

pub struct CountersDesk {
    /// Signalled by a reader; the worker renders into `slot` and notifies.
    req: EventFd,
    /// The latest rendering and its generation.
    slot: Mutex<(u64, String)>,
    cv: Condvar,
}

impl CountersDesk {
    pub fn new() -> std::io::Result<Self> {
        Ok(CountersDesk {
            req: EventFd::new(libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)?,
            slot: Mutex::new((0, String::new())),
            cv: Condvar::new(),
        })
    }

    /// The eventfd a reader signals (the worker's epoll waits on it).
    pub fn fd(&self) -> RawFd {
        self.req.as_raw_fd()
    }

    /// The counters (members of a JSON object), rendered by the worker thread between two
    /// events; `None` if the worker did not get to it within `wait`.
    pub fn render_counters(&self, wait: Duration) -> Option<String> {
        let mut c = lock(&self.slot);
        let asked = c.0;
        let _ = self.req.write(1);
        let end = std::time::Instant::now() + wait;
        while c.0 == asked {
            let left = end.checked_duration_since(std::time::Instant::now())?;
            c = self
                .cv
                .wait_timeout(c, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        // Taken, not cloned: a rendering kept here would stay a long-lived block that moves
        // with every read, in the worker's arena, where it pins freed memory above it (the
        // resident set crept while the live heap stayed flat). Readers come one at a time
        // (the counters thread); one that finds it taken gets None ("busy").
        let body = std::mem::take(&mut c.1);
        (!body.is_empty()).then_some(body)
    }

    /// Takes the readers' request (worker thread, before it renders).
    pub fn take_request(&self) {
        let _ = self.req.read();
    }

    /// Hands the readers waiting a rendering (worker thread).
    pub fn publish(&self, body: String) {
        let mut c = lock(&self.slot);
        *c = (c.0 + 1, body);
        self.cv.notify_all();
    }
}
