//! Poll mode's adaptive window and the worker's notification counters.
//!
//! After a wake-up that found work, the worker polls its doorbell and control queues and its
//! socket for up to the current window before it sleeps in epoll again ([`PollWindow`]). The
//! window adapts the way KVM's halt polling does: a sleep that ended within the longest
//! window (`--poll-us`) means polling longer would have caught that work, so the window grows
//! (doubling, from [`PollWindow::GROW_START_NS`]); a sleep longer than that means the polling
//! before it was wasted, so the window halves (to 0 below the start value).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::abi::NUM_QUEUES;

/// The adaptive poll window of one worker.
#[derive(Debug)]
pub struct PollWindow {
    max_ns: u64,
    window_ns: u64,
    /// When the worker last went to sleep after work, if it has not woken for work since.
    slept_at: Option<u64>,
}

impl PollWindow {
    /// The window a grow starts from when it was 0 (and the smallest one kept by a shrink).
    pub const GROW_START_NS: u64 = 10_000;

    /// A window of at most `max_us` microseconds (0: never poll), starting at the most.
    pub fn new(max_us: u32) -> PollWindow {
        let max_ns = max_us as u64 * 1000;
        PollWindow {
            max_ns,
            window_ns: max_ns,
            slept_at: None,
        }
    }

    /// Whether poll mode is on at all (`--poll-us` > 0).
    pub fn enabled(&self) -> bool {
        self.max_ns > 0
    }

    /// How long to poll now, in nanoseconds.
    pub fn window_ns(&self) -> u64 {
        self.window_ns
    }

    /// The worker goes to sleep at `now` (ns) after work: its poll window, if any, is spent.
    pub fn sleeping(&mut self, now: u64) {
        if self.enabled() {
            self.slept_at = Some(now);
        }
    }

    /// The worker woke at `now` (ns) and found work: adapt the window to how long it slept.
    pub fn woke(&mut self, now: u64) {
        let Some(at) = self.slept_at.take() else {
            return;
        };
        let slept = now.saturating_sub(at);
        if slept > self.max_ns {
            // Nothing came within the longest window: the polling was wasted.
            self.window_ns /= 2;
            if self.window_ns < Self::GROW_START_NS.min(self.max_ns) {
                self.window_ns = 0;
            }
        } else if self.window_ns < self.max_ns {
            // A longer window would have found this work without a wake-up.
            self.window_ns = (self.window_ns * 2)
                .max(Self::GROW_START_NS)
                .min(self.max_ns);
        }
    }
}

/// What the worker counts about polling and notifications (the counters' `worker` section).
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Poll sessions started (after a wake-up that found work, with a non-zero window).
    pub poll_sessions: AtomicU64,
    /// Passes over the queues and the socket while polling.
    pub polls: AtomicU64,
    /// Of those, passes that found work.
    pub poll_hits: AtomicU64,
    /// Wake-ups by each queue's kick (control, doorbell, event).
    pub kicks: [AtomicU64; NUM_QUEUES],
    /// Used-buffer notifications (interrupts) sent on each queue.
    pub interrupts: [AtomicU64; NUM_QUEUES],
    /// Used buffers added on each queue without a notification: the guest did not want one
    /// (EVENT_IDX's used_event, or VRING_AVAIL_F_NO_INTERRUPT without EVENT_IDX).
    pub interrupts_suppressed: [AtomicU64; NUM_QUEUES],
    /// Times the control queue was served ahead of the event at hand (commands that came
    /// while the worker was busy with other work).
    pub ctrl_first: AtomicU64,
    /// Times a control command found doorbells on their ring and had them served first.
    pub doorbells_first: AtomicU64,
}

/// Adds one to a counter.
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl WorkerStats {
    /// The `worker` section's members (no braces).
    pub fn render(&self, poll_us: u32, window_ns: u64) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut o = format!(
            "\"poll_us\":{poll_us},\"poll_window_ns\":{window_ns},\"poll_sessions\":{},\
             \"polls\":{},\"poll_hits\":{},\"ctrl_first\":{},\"doorbells_first\":{},\
             \"log_suppressed\":{}",
            g(&self.poll_sessions),
            g(&self.polls),
            g(&self.poll_hits),
            g(&self.ctrl_first),
            g(&self.doorbells_first),
            g(&crate::ratelog::SUPPRESSED)
        );
        for (i, q) in ["ctrl", "doorbell", "event"].iter().enumerate() {
            o.push_str(&format!(
                ",\"kicks_{q}\":{},\"interrupts_{q}\":{},\"interrupts_suppressed_{q}\":{}",
                g(&self.kicks[i]),
                g(&self.interrupts[i]),
                g(&self.interrupts_suppressed[i])
            ));
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;

    #[test]
    fn off_never_polls() {
        let mut w = PollWindow::new(0);
        assert!(!w.enabled());
        w.sleeping(0);
        w.woke(1);
        assert_eq!(w.window_ns(), 0);
    }

    /// Long sleeps halve the window down to 0; short ones grow it back to the most.
    #[test]
    fn shrinks_when_idle_grows_when_work_comes_soon() {
        let mut w = PollWindow::new(100);
        assert_eq!(w.window_ns(), 100 * US);
        let mut t = 0;
        let mut seen = vec![];
        for _ in 0..6 {
            w.sleeping(t);
            t += 1_000 * US; // a millisecond: longer than the longest window
            w.woke(t);
            seen.push(w.window_ns() / US);
        }
        assert_eq!(seen, [50, 25, 12, 0, 0, 0]);
        let mut seen = vec![];
        for _ in 0..5 {
            w.sleeping(t);
            t += 30 * US; // within the longest window
            w.woke(t);
            seen.push(w.window_ns() / US);
        }
        assert_eq!(seen, [10, 20, 40, 80, 100]);
    }

    /// A wake-up with no sleep recorded before it (work found while polling, or the first
    /// one) leaves the window alone; each sleep counts once.
    #[test]
    fn only_a_recorded_sleep_adapts() {
        let mut w = PollWindow::new(100);
        w.woke(10_000 * US);
        assert_eq!(w.window_ns(), 100 * US);
        w.sleeping(0);
        w.woke(10_000 * US);
        w.woke(20_000 * US);
        assert_eq!(w.window_ns(), 50 * US);
    }

    /// A window smaller than the grow start: shrinks to 0, grows straight back to the most.
    #[test]
    fn tiny_windows() {
        let mut w = PollWindow::new(3);
        w.sleeping(0);
        w.woke(1_000 * US);
        assert_eq!(w.window_ns(), 0);
        w.sleeping(0);
        w.woke(US);
        assert_eq!(w.window_ns(), 3 * US);
    }

    #[test]
    fn render_is_json_members() {
        let s = WorkerStats::default();
        bump(&s.kicks[1]);
        bump(&s.interrupts_suppressed[2]);
        let r = s.render(50, 25_000);
        assert!(r.starts_with("\"poll_us\":50,\"poll_window_ns\":25000,"));
        assert!(r.contains("\"kicks_doorbell\":1,"));
        assert!(r.ends_with("\"interrupts_suppressed_event\":1"));
    }
}
