//! Poll mode (`--poll-us`) and notification suppression: a polling daemon suppresses the
//! guest's doorbell kicks and re-enables them before it sleeps without losing a doorbell; the
//! device respects the driver's wish for no interrupts; `--poll-us 0` polls nothing; bad
//! values are refused.

use std::path::Path;
use std::time::Duration;

use rxe_core::verbs::*;
use vur_testguest::perf::{wait_one, WaitMode};
use vur_testguest::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vur-daemon"))
}

/// The tests that run polling daemons take turns: on a small machine two of them at once
/// (each a polling daemon and a spinning guest) starve the event-driven daemons.
static SPINNERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    SPINNERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// How long one step of a ping-pong may take before the test says it stalled.
const STEP: Duration = Duration::from_secs(10);

fn counter(n: &Node, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, "worker", key).unwrap_or_else(|| panic!("no worker.{key} in {c}"))
}

/// An RC SEND ping-pong of `iters` round trips with every wait bounded: a doorbell the daemon
/// never sees (a lost wake-up) fails with the step that waited.
fn pingpong(a: &mut Node, b: &mut Node, iters: u32, mode: WaitMode) {
    // A retransmission timeout of 268 ms (4.096 µs × 2^16) instead of 16.8 ms: on a small
    // shared machine a spinning guest and a polling daemon can keep a peer off the CPU for
    // longer than seven short timeouts, and that is not what these tests are about.
    let o = ConnOpts {
        timeout: 16,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(a, b, &o).expect("connect");
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let ma = a.guest.reg_mr(ea.pd, 4096, all).expect("mr a");
    let mb = b.guest.reg_mr(eb.pd, 4096, all).expect("mr b");
    for i in 0..iters {
        let step = |what: &str, r: Result<Wc>, a: &Node, b: &Node| {
            if let Err(e) = r {
                panic!(
                    "round trip {i} of {iters} ({mode:?}): waited {STEP:?} for {what}: {e} \
                     (a doorbell or packet the daemon never picked up)\nA: {}\nB: {}",
                    a.daemon.counters().unwrap_or_default(),
                    b.daemon.counters().unwrap_or_default()
                );
            }
        };
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: 1,
                    sg_list: vec![mb.sge(0, 4096)].into(),
                },
            )
            .expect("post_recv b");
        a.guest
            .post_recv(
                &ea.qp,
                &RecvWr {
                    wr_id: 2,
                    sg_list: vec![ma.sge(2048, 2048)].into(),
                },
            )
            .expect("post_recv a");
        a.guest
            .post_send(&ea.qp, &SendWr::new(3, SendOp::Send, vec![ma.sge(0, 64)]))
            .expect("post_send a");
        step(
            "A's SEND to arrive at B",
            wait_one(&mut b.guest, &eb.cq, mode, STEP),
            a,
            b,
        );
        b.guest
            .post_send(&eb.qp, &SendWr::new(4, SendOp::Send, vec![mb.sge(0, 64)]))
            .expect("post_send b");
        step(
            "A's first completion",
            wait_one(&mut a.guest, &ea.cq, mode, STEP),
            a,
            b,
        );
        step(
            "A's second completion",
            wait_one(&mut a.guest, &ea.cq, mode, STEP),
            a,
            b,
        );
        step(
            "B's SEND completion",
            wait_one(&mut b.guest, &eb.cq, mode, STEP),
            a,
            b,
        );
    }
}

/// A ping-pong against a daemon polling for up to a second after work (the longest window,
/// so that every round trip of the test falls inside it unless the machine stops for a
/// second): the guest rings nearly every doorbell while the daemon polls, sees the kick
/// suppressed and does not kick; the event-driven daemon on the other side is woken by kicks.
/// With and without EVENT_IDX (avail event index vs VRING_USED_F_NO_NOTIFY). How many kicks a
/// shorter window saves depends on the machine's speed: that is `vur-bench`'s question.
fn polling_suppresses_kicks(event_idx: bool) {
    let _turn = one_at_a_time();
    let (aa, ba) = loopback_pair(4791);
    let opts = GuestOpts {
        event_idx,
        ..Default::default()
    };
    let mut a =
        Node::start_with(bin(), aa, &["--poll-us", "1000000"], None, opts.clone()).expect("a");
    let mut b = Node::start_with(bin(), ba, &[], None, opts).expect("b");
    let iters = 300;
    // The guest sleeps on completion events rather than spinning: the polling daemon is
    // then the only thread of this test that spins.
    pingpong(&mut a, &mut b, iters, WaitMode::Event);
    let (ka, sa) = a.guest.doorbell_kicks();
    let (kb, sb) = b.guest.doorbell_kicks();
    let why = format!(
        "event_idx {event_idx}: polling daemon: {ka} kicks, {sa} suppressed; \
         event-driven daemon: {kb} kicks, {sb} suppressed"
    );
    assert!(ka + sa >= iters as u64, "{why}");
    assert!(
        ka * 4 < ka + sa,
        "the polling daemon should suppress most kicks: {why}"
    );
    assert!(
        kb > 0 && kb + sb >= iters as u64,
        "the event-driven daemon is woken by kicks: {why}"
    );
    assert!(counter(&a, "poll_sessions") > 0, "{why}");
    assert!(counter(&a, "poll_hits") > 0, "{why}");
    assert_eq!(counter(&a, "poll_us"), 1000000);
    // Poll mode off: not one poll.
    for k in [
        "poll_us",
        "poll_window_ns",
        "poll_sessions",
        "polls",
        "poll_hits",
    ] {
        assert_eq!(counter(&b, k), 0, "{k} with --poll-us 0: {why}");
    }
}

#[test]
fn polling_suppresses_kicks_event_idx() {
    polling_suppresses_kicks(true);
}

#[test]
fn polling_suppresses_kicks_no_notify() {
    polling_suppresses_kicks(false);
}

/// A window of 1 µs (and the adaptive window shrinking to 0 under it) makes the daemon end
/// a poll session and re-enable kicks at nearly every doorbell: the re-check after
/// re-enabling is what finds a doorbell rung while kicks were still suppressed. Thousands of
/// round trips, every step bounded; completion events too (interrupts on the event queue).
#[test]
fn no_lost_wakeup_with_short_windows() {
    let _turn = one_at_a_time();
    for event_idx in [true, false] {
        let (aa, ba) = loopback_pair(4791);
        let opts = GuestOpts {
            event_idx,
            ..Default::default()
        };
        let mut a =
            Node::start_with(bin(), aa, &["--poll-us", "1"], None, opts.clone()).expect("a");
        let mut b = Node::start_with(bin(), ba, &["--poll-us", "20"], None, opts).expect("b");
        pingpong(&mut a, &mut b, 1500, WaitMode::Spin);
        pingpong(&mut a, &mut b, 200, WaitMode::Event);
        for n in [&a, &b] {
            assert!(counter(n, "poll_sessions") > 0);
            let events = n.daemon.counters().expect("counters");
            let raised = json_u64(&events, "device", "events_raised").expect("events_raised");
            // At most one interrupt per event delivered (fewer when the guest's used_event
            // or a batch covers several).
            assert!(
                counter(n, "interrupts_event") <= raised,
                "interrupts {} > events {raised}",
                counter(n, "interrupts_event")
            );
        }
    }
}

/// Without EVENT_IDX the driver asks for no doorbell interrupts with
/// VRING_AVAIL_F_NO_INTERRUPT: the device sends none (and counts what it left out); the
/// control queue, whose flag is clear, gets one per response.
#[test]
fn no_interrupt_flag_is_respected() {
    let (aa, ba) = loopback_pair(4791);
    let opts = GuestOpts {
        event_idx: false,
        ..Default::default()
    };
    let mut a = Node::start_with(bin(), aa, &[], None, opts.clone()).expect("a");
    let mut b = Node::start_with(bin(), ba, &[], None, opts).expect("b");
    pingpong(&mut a, &mut b, 50, WaitMode::Spin);
    assert_eq!(counter(&a, "interrupts_doorbell"), 0);
    assert!(counter(&a, "interrupts_suppressed_doorbell") > 0);
    assert!(counter(&a, "interrupts_ctrl") > 0);
    assert_eq!(counter(&a, "interrupts_suppressed_ctrl"), 0);
}

/// With EVENT_IDX the test guest leaves the doorbell queue's used_event at 0: one interrupt
/// when the used index first passes it, none after.
#[test]
fn used_event_is_respected() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).expect("a");
    let mut b = Node::start(bin(), ba, &[]).expect("b");
    pingpong(&mut a, &mut b, 50, WaitMode::Spin);
    assert!(counter(&a, "interrupts_doorbell") <= 1);
    assert!(counter(&a, "interrupts_suppressed_doorbell") >= 49);
}

/// Out-of-range and malformed values: exit status 2 and a one-line reason.
#[test]
fn bad_poll_us_is_refused() {
    for (bad, want) in [
        ("1000001", "--poll-us 1000001 out of range"),
        ("-5", "'-5'"),
        ("fast", "--poll-us"),
    ] {
        let out = std::process::Command::new(bin())
            .args(["--socket-path", "/nonexistent/x.sock", "--poll-us", bad])
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--poll-us {bad}: {err}");
        assert!(err.contains(want), "--poll-us {bad}: {err}");
    }
}
