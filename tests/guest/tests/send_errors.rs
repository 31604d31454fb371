//! What the kernel refuses to send is logged once per cause in each rate-limit window, with
//! what to check, besides being counted (`transport.tx_dropped`). Inside a network namespace
//! the test creates, whose loopback has an MTU of 1500: two daemons on it, the first started with
//! `--mtu 9000` (wrong for its interface); its QP's path MTU of 4096 makes packets the kernel
//! refuses with EMSGSIZE, retried until the QP gives up. The log names the path MTU and the
//! `--mtu` that fits it.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::time::Duration;

use common::{bin, run};
use rxe_core::verbs::{Mtu, SendOp, SendWr};
use vur_testguest::netns;
use vur_testguest::*;

mod common;

const HINT: &str = "give the port --mtu 1500 or less";

fn node(daemon: Daemon) -> Node {
    let mut guest = Guest::connect(&daemon.socket, GuestOpts::default()).expect("guest");
    let gid = rxe_core::Gid::from_ip(daemon.addr.ip());
    guest.add_gid(0, gid).unwrap();
    Node {
        daemon,
        guest,
        gid,
        mac: [0; 6],
    }
}

#[test]
fn a_wrong_mtu_is_named_in_the_log() {
    run("a_wrong_mtu_is_named_in_the_log", || {
        // The namespace's loopback carries both daemons' traffic: at MTU 1500, as an
        // Ethernet interface would.
        netns::ip(&["link", "set", "lo", "mtu", "1500"]).unwrap();
        let (a_addr, b_addr) = loopback_pair(4791);
        let mut a = node(Daemon::spawn_logged(bin(), a_addr, &["--mtu", "9000"]).unwrap());
        let mut b = node(Daemon::spawn(bin(), b_addr, &["--mtu", "9000"]).unwrap());
        let o = ConnOpts {
            mtu: Mtu::M4096,
            timeout: 8,
            retry_cnt: 7,
            ..ConnOpts::default()
        };
        let (ea, eb) = connect_qps(&mut a, &mut b, &o).expect("connect");
        let len = 16 << 10;
        let sa = a.guest.reg_mr(ea.pd, len, o.access).unwrap();
        let sb = b.guest.reg_mr(eb.pd, len, o.access).unwrap();
        let write = SendOp::Write {
            remote_addr: sb.iova,
            rkey: sb.rkey,
        };
        let wr = SendWr::new(1, write, vec![sa.sge(0, len as u32)]);
        a.guest.post_send(&ea.qp, &wr).unwrap();
        // The WRITE ends in an error (every packet refused, retries exhausted).
        let wc = a.guest.wait_cq(&ea.cq, 1, Duration::from_secs(60));
        assert_eq!(wc.len(), 1, "the WRITE's completion");
        assert_ne!(
            wc[0].status, 0,
            "a WRITE no packet of which left cannot succeed"
        );
        let log = a.daemon.log();
        let hints = log.lines().filter(|l| l.contains(HINT)).count();
        let t = a.daemon.counters().unwrap();
        let dropped = json_u64(&t, "transport", "tx_dropped").unwrap();
        // One cause: at most a burst per 10-s window (the test takes a few seconds; two
        // windows if it straddles a boundary), however many packets were refused.
        assert!(
            (1..=10).contains(&hints) && dropped >= 8,
            "{hints} lines with the hint for {dropped} refused packets:\n{log}"
        );
        eprintln!("{hints} log lines for {dropped} refused packets");
    });
}
