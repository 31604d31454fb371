//! Log lines a guest can cause, limited per cause.
//!
//! A guest decides how often it resets its device, sends a command the policy refuses or
//! breaks a virtqueue; each of those deserves a line in the host's log, but not one per
//! occurrence: a guest in a loop would fill the host's disk (a review measured 2.6 MB of log in
//! 0.7 s from GID churn). [`warn_limited!`](crate::warn_limited) and
//! [`info_limited!`](crate::info_limited) log the first [`RateLimit::BURST`] lines of a cause
//! (a call site) in each [`RateLimit::WINDOW_SECS`]-second window and count the rest; the
//! first line of a later window says how many were left out. The counts of all causes together
//! are in the counters (`worker.log_suppressed`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Lines left out by every rate limit of the process (the counters' `log_suppressed`).
pub static SUPPRESSED: AtomicU64 = AtomicU64::new(0);

/// The limit of one cause: a window, the lines logged in it, and those left out since the
/// last line logged.
#[derive(Debug)]
pub struct RateLimit {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    window: u64,
    logged: u32,
    suppressed: u64,
}

impl RateLimit {
    /// Lines of one cause logged per window.
    pub const BURST: u32 = 5;
    /// The window, in seconds.
    pub const WINDOW_SECS: u64 = 10;

    pub const fn new() -> RateLimit {
        RateLimit {
            state: Mutex::new(State {
                window: u64::MAX,
                logged: 0,
                suppressed: 0,
            }),
        }
    }

    /// Whether a line may be logged now; `Some(n)`: yes, and `n` lines of this cause were
    /// left out before it.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(secs_since_start())
    }

    /// [`allow`](Self::allow) at `secs` seconds since the process started.
    pub fn allow_at(&self, secs: u64) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let window = secs / Self::WINDOW_SECS;
        if s.window != window {
            s.window = window;
            s.logged = 0;
        }
        if s.logged < Self::BURST {
            s.logged += 1;
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed += 1;
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        Self::new()
    }
}

fn secs_since_start() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs()
}

/// `log::warn!` for a line a guest can cause: limited per call site ([`RateLimit`]).
#[macro_export]
macro_rules! warn_limited {
    ($($arg:tt)+) => {
        $crate::log_limited!(log::Level::Warn, $($arg)+)
    };
}

/// `log::info!` for a line a guest can cause: limited per call site ([`RateLimit`]).
#[macro_export]
macro_rules! info_limited {
    ($($arg:tt)+) => {
        $crate::log_limited!(log::Level::Info, $($arg)+)
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! log_limited {
    ($level:expr, $($arg:tt)+) => {{
        static LIMIT: $crate::ratelog::RateLimit = $crate::ratelog::RateLimit::new();
        match LIMIT.allow() {
            Some(0) => log::log!($level, $($arg)+),
            Some(n) => log::log!(
                $level,
                "{} ({n} more like it left out of the log)",
                format_args!($($arg)+)
            ),
            None => {}
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst per window, the rest counted, and the first line of a later window told how
    /// many were left out.
    #[test]
    fn a_burst_per_window_then_counts() {
        let l = RateLimit::new();
        let before = SUPPRESSED.load(Ordering::Relaxed);
        for _ in 0..RateLimit::BURST {
            assert_eq!(l.allow_at(3), Some(0));
        }
        for _ in 0..1000 {
            assert_eq!(l.allow_at(5), None);
        }
        assert!(SUPPRESSED.load(Ordering::Relaxed) >= before + 1000);
        assert_eq!(l.allow_at(RateLimit::WINDOW_SECS), Some(1000));
        assert_eq!(l.allow_at(RateLimit::WINDOW_SECS + 1), Some(0));
    }
}
