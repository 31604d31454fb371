//! `--same-host` and revocation (security review 2026-11-28, F1): what a device receives
//! through the shortcut is what the sender's memory held when the sender's engine sent it,
//! while its rights were valid — not what the memory holds when the receiver gets round to
//! copying. A receiver that keeps its own worker busy (here held for sure with
//! [`Guest::hold_worker`], the part of a guest that queues slow control commands) takes its
//! packets late; a sender that revoked the memory meanwhile (DEREG_MR returned, or its WQE
//! completed with an error) may reuse it at once, and those later bytes must not reach the
//! peer. Both directions: the READ responder's MR, the WRITE requester's buffer.

mod common;

use common::{bin, T};
use rxe_core::verbs::*;
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
const LEN: usize = 64 << 10;

fn counter(n: &Node, object: &str, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, object, key).unwrap_or_else(|| panic!("no {object}.{key} in {c}"))
}

/// Waits (up to [`T`]) until `n`'s counter `object.key` reaches `want`.
fn wait_counter(n: &Node, object: &str, key: &str, want: u64, what: &str) {
    let end = std::time::Instant::now() + T;
    loop {
        let got = counter(n, object, key);
        if got >= want {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "waited {T:?} for {what}: {object}.{key} is {got}, not {want}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// How the two devices of one daemon reach each other, and the counters that show it.
#[derive(Clone, Copy)]
struct Path {
    flags: &'static [&'static str],
    /// The counters' object: `same_host`, or `transport` (the sockets).
    obj: &'static str,
    /// The counter of payload bytes sent.
    payload: &'static str,
}

/// The shortcut: the case under test.
const SHORTCUT: Path = Path {
    flags: &["--same-host"],
    obj: "same_host",
    payload: "tx_ref_bytes",
};

/// The sockets, as a wire would: what the shortcut must match.
const SOCKETS: Path = Path {
    flags: &[],
    obj: "transport",
    payload: "tx_bytes",
};

fn two(path: Path) -> (Node, Node) {
    let (a, b) = loopback_pair(4791);
    Node::start_two(bin(), a, b, path.flags, None).expect("two devices in one daemon")
}

/// How many bytes of `got` are `b`, and the first byte that is not.
fn summary(got: &[u8], b: u8) -> String {
    let n = got.iter().filter(|&&x| x == b).count();
    let other = got.iter().find(|&&x| x != b);
    format!(
        "{n} of {} bytes {:?}, first other byte {:?}",
        got.len(),
        b as char,
        other.map(|&x| x as char)
    )
}

/// READ: a reads b's MR, which b exposed to it. a's worker is held, so b's READ response (64
/// KiB, one segment) waits in a's inbox; b deregisters the MR (DEREG_MR returns) and reuses
/// its pages. a's READ must then complete with what the MR held when b's engine sent the
/// response, 'O', never with b's later bytes 'S'.
///
/// Why the old bytes and a successful completion are right (IBTA): the responder read the MR
/// while it was registered, when it sent the response; a deregistration after that cannot
/// recall a response in flight, on a wire or on a real HCA alike (the same test over the
/// sockets gives 'O'). What deregistration forbids is access *after* it returned: the
/// shortcut must not read b's memory then.
fn read_then_dereg(path: Path) {
    let (mut a, mut b) = two(path);
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let ra = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let sb = b.guest.reg_mr(eb.pd, LEN, ALL).unwrap();
    ra.buf.write(0, &vec![b'.'; LEN]);
    sb.buf.write(0, &vec![b'O'; LEN]);
    let (iova, rkey, pages) = (sb.iova, sb.rkey, sb.buf.pages.clone());
    // b held: a's READ request waits in b's inbox.
    let hold_b = b.guest.hold_worker().expect("hold b's worker");
    let read = SendOp::Read {
        remote_addr: iova,
        rkey,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, read, vec![ra.sge(0, LEN as u32)]))
        .unwrap();
    wait_counter(&a, path.obj, "tx_packets", 1, "a's READ request");
    // a held, then b let go: b answers into a's inbox, which nothing drains.
    let hold_a = a.guest.hold_worker().expect("hold a's worker");
    b.guest.release_worker(hold_b).expect("b's worker was held");
    wait_counter(&b, path.obj, path.payload, LEN as u64, "b's READ response");
    // b revokes a's access and reuses the pages.
    b.guest.dereg_mr(sb).expect("DEREG_MR");
    for p in &pages {
        b.guest.ram.write(*p, &[b'S'; PAGE as usize]);
    }
    a.guest.release_worker(hold_a).expect("a's worker was held");
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the READ's completion");
    let got = ra.buf.to_vec(0, LEN);
    assert!(
        !got.contains(&b'S'),
        "a read b's memory after b's DEREG_MR returned (status {}): {}",
        w[0].status,
        summary(&got, b'S')
    );
    assert_eq!(w[0].status, WcStatus::Success as u32);
    assert!(got == vec![b'O'; LEN], "{}", summary(&got, b'O'));
}

#[test]
fn a_read_response_is_what_the_mr_held_before_dereg() {
    read_then_dereg(SHORTCUT);
}

#[test]
fn a_read_response_is_what_the_mr_held_before_dereg_over_the_sockets() {
    read_then_dereg(SOCKETS);
}

/// WRITE: a writes 64 KiB to b while b's worker is held, so the WRITE (and its retry) wait in
/// b's inbox; a's retries run out and its WQE completes with RETRY_EXC_ERR; a reuses the
/// buffer ('S'). When b takes the packets, its MR must get what a's engine sent, 'P', never
/// a's later bytes: the buffer was a's again once the WQE completed.
fn write_then_error(path: Path) {
    let (mut a, mut b) = two(path);
    let o = ConnOpts {
        timeout: 8, // 4.096 us * 2^8: about 1 ms
        retry_cnt: 1,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let la = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let sb = b.guest.reg_mr(eb.pd, LEN, ALL).unwrap();
    la.buf.write(0, &vec![b'P'; LEN]);
    sb.buf.write(0, &vec![b'.'; LEN]);
    let hold_b = b.guest.hold_worker().expect("hold b's worker");
    let write = SendOp::Write {
        remote_addr: sb.iova,
        rkey: sb.rkey,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, write, vec![la.sge(0, LEN as u32)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the WRITE's completion");
    assert_eq!(w[0].status, WcStatus::RetryExcErr as u32);
    // The buffer is a's again: a secret goes in.
    la.buf.write(0, &vec![b'S'; LEN]);
    let sent = counter(&a, path.obj, "tx_packets");
    assert!(sent >= 2, "the WRITE and its retry: {sent}");
    b.guest.release_worker(hold_b).expect("b's worker was held");
    // Everything a sent is taken into b's engine (the counters are rendered by b's worker,
    // after the event that took the packets).
    wait_counter(&b, path.obj, "rx_packets", sent, "b to take a's packets");
    let got = sb.buf.to_vec(0, LEN);
    assert!(
        !got.contains(&b'S'),
        "b got a's buffer as a wrote it after its WRITE failed: {}",
        summary(&got, b'S')
    );
    assert!(got == vec![b'P'; LEN], "{}", summary(&got, b'P'));
}

#[test]
fn a_write_lands_what_was_sent_not_what_the_requester_wrote_after_its_error() {
    write_then_error(SHORTCUT);
}

#[test]
fn a_write_lands_what_was_sent_not_what_the_requester_wrote_after_its_error_over_the_sockets() {
    write_then_error(SOCKETS);
}

/// The other half of the finding: a guest must not hold its worker against its data path
/// with control commands. A worker serves at most 32 commands a turn and comes back for the
/// rest after the events that wait. 100 commands queued at once (while the worker is held,
/// so they are all there when it goes on) take at least ⌈101/32⌉ = 4 turns with the one that
/// held it, each ending in an interrupt decision (`worker.interrupts_ctrl` and
/// `interrupts_suppressed_ctrl`); without the bound one pass takes them all. The rest is
/// served without a kick from the guest (they were queued unkicked), and a packet another
/// device sent meanwhile is taken too.
#[test]
fn a_flooded_control_queue_is_served_in_turns() {
    let (mut a, mut b) = two(SHORTCUT);
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let lb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    let recv = RecvWr {
        wr_id: 9,
        sg_list: vec![la.sge(0, 4096)].into(),
    };
    a.guest.post_recv(&ea.qp, &recv).unwrap();
    let visits = |n: &Node| {
        counter(n, "worker", "interrupts_ctrl") + counter(n, "worker", "interrupts_suppressed_ctrl")
    };
    let before = visits(&a);
    let hold = a.guest.hold_worker().expect("hold a's worker");
    let mut last = 0;
    for _ in 0..100 {
        last = a
            .guest
            .post_unkicked_cmd(abi::op::QUERY_DEVICE, &[])
            .unwrap();
    }
    b.guest
        .post_send(&eb.qp, &SendWr::new(1, SendOp::Send, vec![lb.sge(0, 64)]))
        .unwrap();
    wait_counter(&b, "same_host", "tx_packets", 1, "b's SEND");
    a.guest.release_worker(hold).expect("a's worker was held");
    let status = a
        .guest
        .wait_unkicked_cmd(last, T)
        .unwrap_or_else(|e| panic!("the 100th command: {e}: {}", a.daemon.counters().unwrap()));
    assert_eq!(status, 0);
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!((w.len(), w[0].wr_id, w[0].status), (1, 9, 0), "a's receive");
    let turns = visits(&a) - before;
    assert!(
        turns >= 101usize.div_ceil(32) as u64,
        "101 commands served in {turns} turns"
    );
}
