//! The same-host shortcut (`--same-host`): one daemon process serving two devices (two
//! `--socket-path`, two `--udp-addr` on loopback), a test guest on each. With the flag, RC
//! SEND, WRITE and READ of 64 KiB between them go from one worker to the other through
//! memory — the `same_host` counters carry every packet, the UDP sockets none — with the data
//! checked; the error paths are the engine's as on the wire (a bad rkey is a remote access
//! error, RNR retries run out). Without the flag the same devices talk through their sockets.

mod common;

use common::{bin, send_write_read, T};
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
        // a: 3 SEND + 64 WRITE + 1 READ request packets; b: the ACKs and 64 READ responses.
        assert!(counter(n, "same_host", "tx_packets") >= 64, "{name}: {c}");
        assert!(counter(n, "same_host", "rx_packets") >= 64, "{name}: {c}");
        assert_eq!(counter(n, "same_host", "rx_dropped"), 0, "{name}: {c}");
        assert_eq!(counter(n, "transport", "tx_packets"), 0, "{name}: {c}");
        assert_eq!(counter(n, "transport", "rx_packets"), 0, "{name}: {c}");
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
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    let write = SendOp::Write {
        remote_addr: rb.addr(0),
        rkey: rb.rkey ^ 0x100,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, write, vec![la.sge(0, 8)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the WRITE's completion");
    assert_eq!(w[0].status, WcStatus::RemAccessErr as u32);
    // No receive posted: RNR NAKs until the retries run out.
    let o = ConnOpts {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..Default::default()
    };
    let (ea, _eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    a.guest
        .post_send(&ea.qp, &SendWr::new(2, SendOp::Send, vec![la.sge(0, 8)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the SEND's completion");
    assert_eq!(w[0].status, WcStatus::RnrRetryExcErr as u32);
    assert_eq!(counter(&a, "transport", "tx_packets"), 0);
    assert!(counter(&b, "same_host", "tx_packets") >= 3, "the NAKs");
}
