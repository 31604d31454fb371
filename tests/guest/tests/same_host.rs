//! The same-host shortcut (`--same-host`): one daemon process serving two devices (two
//! `--socket-path`, two `--udp-addr` on loopback), a test guest on each. With the flag, RC
//! SEND, WRITE and READ of 64 KiB between them go from one worker to the other through
//! memory — the `same_host` counters carry every packet, the UDP sockets none — and their
//! payloads as references, copied once from one guest's memory into the other's, with the
//! data checked; UD datagrams carry their payload (a UD send completes when it leaves); the
//! error paths are the engine's as on the wire (a bad rkey is a remote access error, RNR
//! retries run out). Without the flag the same devices talk through their sockets.

mod common;

use common::{bin, rnr_retries_run_out, send_write_read, write_with_a_bad_rkey, T};
use rxe_core::verbs::*;
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

fn counter(n: &Node, object: &str, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, object, key).unwrap_or_else(|| panic!("no {object}.{key} in {c}"))
}

fn two(extra: &[&str]) -> (Node, Node) {
    let (a, b) = loopback_pair(4791);
    Node::start_two(bin(), a, b, extra, None).expect("two devices in one daemon")
}

#[test]
fn packets_between_devices_of_one_daemon_skip_the_kernel() {
    let (mut a, mut b) = two(&["--same-host"]);
    assert_eq!(a.daemon.pid(), b.daemon.pid(), "one process");
    send_write_read(&mut a, &mut b);
    for (n, name) in [(&a, "a"), (&b, "b")] {
        let c = n.daemon.counters().unwrap();
        // a: the SEND, the WRITE and the READ request; b: the ACKs and the READ response.
        assert!(counter(n, "same_host", "tx_packets") >= 3, "{name}: {c}");
        assert!(counter(n, "same_host", "rx_packets") >= 3, "{name}: {c}");
        assert_eq!(counter(n, "same_host", "rx_dropped"), 0, "{name}: {c}");
        assert_eq!(counter(n, "transport", "tx_packets"), 0, "{name}: {c}");
        assert_eq!(counter(n, "transport", "rx_packets"), 0, "{name}: {c}");
    }
    // In segments of up to 64 KiB (the default): a's SEND (3000 B, 3 packets at MTU 1024)
    // and WRITE (64 KiB, 64 packets), b's READ response (64 KiB) are one segment each.
    assert_eq!(counter(&a, "port", "tx_segments"), 2);
    assert_eq!(counter(&b, "port", "tx_segments"), 1);
    assert!(counter(&a, "same_host", "tx_packets") < 10);
    // Every payload referred to its bytes in the sender's guest memory.
    assert_eq!(counter(&a, "same_host", "tx_ref_bytes"), 3000 + (64 << 10));
    assert_eq!(counter(&b, "same_host", "tx_ref_bytes"), 64 << 10);
}

/// `--same-host-segment 0`: packets of one path MTU between the devices, as on a wire;
/// `--same-host-segment 16K`: segments of 16 KiB (16 packets at MTU 1024).
#[test]
fn the_segment_size_is_the_operators() {
    let (mut a, mut b) = two(&["--same-host", "--same-host-segment", "0"]);
    send_write_read(&mut a, &mut b);
    // a: 3 SEND + 64 WRITE + 1 READ request packets; b: the ACKs and 64 READ responses.
    for n in [&a, &b] {
        assert!(counter(n, "same_host", "tx_packets") >= 64);
        assert_eq!(counter(n, "port", "tx_segments"), 0);
    }
    assert!(counter(&a, "same_host", "tx_ref_packets") >= 3 + 64);
    assert_eq!(counter(&a, "same_host", "tx_ref_bytes"), 3000 + (64 << 10));
    drop((a, b));
    let (mut a, mut b) = two(&["--same-host", "--same-host-segment", "16K"]);
    send_write_read(&mut a, &mut b);
    // a: the SEND (3000 B) and 4 WRITE segments; b: 4 READ response segments.
    assert_eq!(counter(&a, "port", "tx_segments"), 1 + 4);
    assert_eq!(counter(&b, "port", "tx_segments"), 4);
    assert_eq!(counter(&b, "same_host", "tx_ref_bytes"), 64 << 10);
}

#[test]
fn ud_datagrams_carry_their_payload() {
    let (mut a, mut b) = two(&["--same-host"]);
    let o = ConnOpts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let lb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    let msg: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    la.buf.write(0, &msg);
    let recv = RecvWr {
        wr_id: 7,
        sg_list: vec![lb.sge(0, 4096)].into(),
    };
    b.guest.post_recv(&eb.qp, &recv).unwrap();
    let mut wr = SendWr::new(1, SendOp::Send, vec![la.sge(0, 1000)]);
    wr.ud = Some(ud_dest(b.gid, eb.qp.qpn, 0x1111_1111));
    a.guest.post_send(&ea.qp, &wr).unwrap();
    assert_eq!(a.guest.wait_cq(&ea.cq, 1, T)[0].status, 0);
    // The sender may reuse its buffer once the send completed: the receiver must still get
    // what was sent.
    la.buf.write(0, &[0u8; 1000]);
    let w = b.guest.wait_cq(&eb.cq, 1, T);
    assert_eq!((w.len(), w[0].status, w[0].byte_len), (1, 0, 1040));
    assert_eq!(lb.buf.to_vec(40, 1000), msg);
    assert!(counter(&a, "same_host", "tx_packets") >= 1);
    assert_eq!(counter(&a, "same_host", "tx_ref_packets"), 0);
}

/// With I/O threads too (`--io-thread`): the shortcut still carries everything between the
/// devices; their I/O threads send and receive nothing.
#[test]
fn the_shortcut_goes_before_the_io_thread() {
    let (mut a, mut b) = two(&["--same-host", "--io-thread"]);
    send_write_read(&mut a, &mut b);
    for n in [&a, &b] {
        let c = n.daemon.counters().unwrap();
        assert!(counter(n, "same_host", "tx_packets") >= 3, "{c}");
        assert_eq!(counter(n, "transport", "tx_packets"), 0, "{c}");
        assert_eq!(counter(n, "io_thread", "tx_batches"), 0, "{c}");
        assert_eq!(counter(n, "io_thread", "rx_packets"), 0, "{c}");
    }
}

#[test]
fn without_the_flag_the_devices_talk_through_their_sockets() {
    let (mut a, mut b) = two(&[]);
    send_write_read(&mut a, &mut b);
    for n in [&a, &b] {
        let c = n.daemon.counters().unwrap();
        assert!(!c.contains("same_host"), "{c}");
        assert!(counter(n, "transport", "tx_packets") >= 64, "{c}");
        assert_eq!(counter(n, "transport", "rx_icrc_bad"), 0, "{c}");
    }
}

#[test]
fn error_paths_are_the_engines_as_on_the_wire() {
    let (mut a, mut b) = two(&["--same-host"]);
    // A bad rkey: the responder NAKs, the requester completes with REM_ACCESS_ERR.
    write_with_a_bad_rkey(&mut a, &mut b);
    // No receive posted: RNR NAKs until the retries run out.
    rnr_retries_run_out(&mut a, &mut b);
    assert_eq!(counter(&a, "transport", "tx_packets"), 0);
    assert!(counter(&b, "same_host", "tx_packets") >= 3, "the NAKs");
}

/// A peer device whose guest went away: what the shortcut hands it is dropped at its inbox
/// (counted), as a packet to a host that stopped listening is lost, and the requester's
/// retries run out (RETRY_EXC_ERR) instead of hanging.
#[test]
fn a_peer_without_a_guest_loses_the_packets_and_the_retries_run_out() {
    let (mut a, b) = two(&["--same-host"]);
    let o = ConnOpts {
        timeout: 8, // 4.096 us * 2^8: about 1 ms
        retry_cnt: 1,
        ..Default::default()
    };
    let mut b = b;
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    let (raddr, rkey) = (rb.addr(0), rb.rkey);
    let Node {
        daemon: bd, guest, ..
    } = b;
    drop(guest); // the frontend disconnects; the device stays, without a guest
                 // Until the daemon has let the guest go, its engine would still answer.
    let end = std::time::Instant::now() + T;
    loop {
        let c = bd.counters().unwrap();
        if !c.contains("\"qps\"") {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "b's device still serves the departed guest after {T:?}: {c}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let write = SendOp::Write {
        remote_addr: raddr,
        rkey,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, write, vec![la.sge(0, 2048)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the WRITE's completion");
    assert_eq!(w[0].status, WcStatus::RetryExcErr as u32);
    let c = bd.counters().unwrap();
    let dropped = json_u64(&c, "same_host", "rx_dropped").unwrap_or(0);
    // The first try and one retry, at least (the daemon drops what waits when it wakes).
    assert!(dropped >= 2, "{c}");
    assert_eq!(counter(&a, "transport", "tx_packets"), 0);
}

/// A device whose worker is idle takes a batch on the sender's thread (run to completion:
/// `same_host.rx_driven`), its guest's completions and the answers the batch starts as its
/// worker would give them: 100 round trips of 64 B SENDs, each side idle while the other
/// sends, every message completed. The worker still takes what comes while it is busy.
#[test]
fn an_idle_receivers_side_runs_on_the_senders_thread() {
    let (mut a, mut b) = two(&["--same-host"]);
    perf::rc_pingpong_wait(&mut a, &mut b, 64, 100, perf::WaitMode::Spin).expect("ping-pong");
    for (n, name) in [(&a, "a"), (&b, "b")] {
        let c = n.daemon.counters().unwrap();
        assert!(counter(n, "same_host", "rx_driven") > 0, "{name}: {c}");
        assert_eq!(counter(n, "same_host", "rx_dropped"), 0, "{name}: {c}");
    }
    // And bulk data as before.
    send_write_read(&mut a, &mut b);
}
