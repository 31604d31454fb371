//! `--io-thread`: each daemon's UDP socket is served by a thread of its own beside the worker
//! (two daemons on loopback, a test guest on each). RC SEND, WRITE and READ of 64 KiB and
//! 16 MiB arrive whole, with the data checked; every packet went through the I/O threads
//! (their counters and the transport's agree, nothing dropped at an inbox, no ICRC refused);
//! a daemon with the flag and one without talk to each other; poll mode works beside it;
//! the error paths are the engine's (a bad rkey, RNR retries running out).

mod common;

use std::time::Duration;

use common::{bin, rnr_retries_run_out, send_write_read, write_with_a_bad_rkey};
use rxe_core::verbs::*;
use vur_testguest::*;

fn counter(n: &Node, object: &str, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, object, key).unwrap_or_else(|| panic!("no {object}.{key} in {c}"))
}

fn pair_with(a_extra: &[&str], b_extra: &[&str]) -> (Node, Node) {
    let (aa, ba) = loopback_pair(4791);
    (
        Node::start(bin(), aa, a_extra).expect("node a"),
        Node::start(bin(), ba, b_extra).expect("node b"),
    )
}

/// The socket's traffic of `n` went through its I/O thread: it sent what the worker did not
/// send itself (a few packets while the thread slept), every received datagram went through
/// its inbox into the engine (once the last ones have been taken: up to 2 s), none was
/// dropped there or failed its ICRC.
fn all_through_the_io_thread(n: &Node, name: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(2);
    let c = loop {
        let c = n.daemon.counters().unwrap();
        let through = json_u64(&c, "io_thread", "rx_packets").unwrap_or(0);
        if through == json_u64(&c, "transport", "rx_packets").unwrap_or(1)
            || std::time::Instant::now() >= end
        {
            break c;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let v = |o: &str, k: &str| json_u64(&c, o, k).unwrap_or_else(|| panic!("no {o}.{k} in {c}"));
    assert!(
        v("io_thread", "tx_batches") + v("io_thread", "tx_inline") > 0,
        "{name}: {c}"
    );
    assert_eq!(
        v("io_thread", "rx_packets"),
        v("transport", "rx_packets"),
        "{name}: every datagram through the inbox within 2 s: {c}"
    );
    assert_eq!(v("io_thread", "rx_dropped"), 0, "{name}: {c}");
    assert_eq!(v("transport", "rx_icrc_bad"), 0, "{name}: {c}");
}

#[test]
fn send_write_read_through_io_threads() {
    let (mut a, mut b) = pair_with(&["--io-thread"], &["--io-thread"]);
    send_write_read(&mut a, &mut b);
    for (n, name) in [(&a, "a"), (&b, "b")] {
        assert!(counter(n, "transport", "tx_packets") >= 64, "{name}");
        all_through_the_io_thread(n, name);
    }
}

#[test]
fn a_daemon_with_an_io_thread_talks_to_one_without() {
    let (mut a, mut b) = pair_with(&["--io-thread"], &[]);
    send_write_read(&mut a, &mut b);
    all_through_the_io_thread(&a, "a");
    let c = b.daemon.counters().unwrap();
    assert!(!c.contains("io_thread"), "{c}");
}

#[test]
fn poll_mode_beside_the_io_thread() {
    let (mut a, mut b) = pair_with(
        &["--io-thread", "--poll-us", "50"],
        &["--io-thread", "--poll-us", "50"],
    );
    send_write_read(&mut a, &mut b);
    all_through_the_io_thread(&a, "a");
    all_through_the_io_thread(&b, "b");
}

#[test]
fn error_paths_are_the_engines() {
    let (mut a, mut b) = pair_with(&["--io-thread"], &["--io-thread"]);
    write_with_a_bad_rkey(&mut a, &mut b);
    rnr_retries_run_out(&mut a, &mut b);
    all_through_the_io_thread(&a, "a");
}

/// 16 MiB WRITEs and a READ back, several in flight: more than the I/O thread's channel
/// holds, so the worker's pump meets a full channel and waits to be woken; the data is
/// checked.
#[test]
fn bulk_writes_and_reads_arrive_whole() {
    let (mut a, mut b) = pair_with(&["--io-thread"], &["--io-thread"]);
    // An ACK timeout of 0.5 s (4.096 us * 2^17): this test is about the data path, not the
    // timers; on a loaded 2-CPU machine a 16 MiB READ's responses may pause longer than the
    // default 17 ms eight times in a row, and the READ would end in RETRY_EXC_ERR.
    let o = ConnOpts {
        timeout: 17,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).expect("connect");
    let access = Access::LOCAL_WRITE.union(Access::REMOTE);
    let len = 16 << 20;
    let sa = a.guest.reg_mr(ea.pd, len, access).unwrap();
    let sb = b.guest.reg_mr(eb.pd, len, access).unwrap();
    let ra = a.guest.reg_mr(ea.pd, len, access).unwrap();
    let data: Vec<u8> = (0..len as u32)
        .map(|i| (i % 253) as u8 ^ (i >> 16) as u8)
        .collect();
    sa.buf.write(0, &data);
    // Four WRITEs of 4 MiB, posted at once.
    let part = len / 4;
    for i in 0..4 {
        let write = SendOp::Write {
            remote_addr: sb.iova + (i * part) as u64,
            rkey: sb.rkey,
        };
        let wr = SendWr::new(i as u64, write, vec![sa.sge(i * part, part as u32)]);
        a.guest.post_send(&ea.qp, &wr).unwrap();
    }
    let w = a.guest.wait_cq(&ea.cq, 4, Duration::from_secs(60));
    assert_eq!(w.len(), 4, "write completions");
    assert!(w.iter().all(|c| c.status == 0), "{w:?}");
    assert!(sb.buf.to_vec(0, len) == data, "written data");
    let read = SendOp::Read {
        remote_addr: sb.iova,
        rkey: sb.rkey,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(9, read, vec![ra.sge(0, len as u32)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, Duration::from_secs(60));
    assert_eq!(
        (w.len(), w[0].status),
        (1, 0),
        "read completion; a: {}; b: {}",
        a.daemon.counters().unwrap_or_default(),
        b.daemon.counters().unwrap_or_default()
    );
    assert!(ra.buf.to_vec(0, len) == data, "read data");
    all_through_the_io_thread(&a, "a");
    all_through_the_io_thread(&b, "b");
    // Batches of WRITE and READ packets are larger than what the worker sends itself.
    assert!(counter(&a, "io_thread", "tx_batches") > 0);
    assert!(counter(&b, "io_thread", "tx_batches") > 0);
    eprintln!(
        "a: {} batches, channel full {} times; b: {} batches, channel full {} times",
        counter(&a, "io_thread", "tx_batches"),
        counter(&a, "io_thread", "tx_channel_full"),
        counter(&b, "io_thread", "tx_batches"),
        counter(&b, "io_thread", "tx_channel_full"),
    );
}
