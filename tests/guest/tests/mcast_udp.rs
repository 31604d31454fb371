//! UD multicast on the udp transport (`transport::mcast`): a QP attached to a group
//! (ATTACH_MCAST) makes its daemon join the group on the host, so datagrams a QP of another
//! daemon sends to the group reach it, and so do those a QP of the same device sends (the
//! host loops a copy back, as for Linux rxe). Detaching the last QP leaves the group. Every
//! datagram's ICRC is checked against the group address. Two daemons on loopback addresses
//! inside a network namespace the test creates.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::time::Duration;

use common::{bin, run};
use rxe_core::verbs::*;
use vur_testguest::*;

mod common;

const GROUP: &str = "239.1.2.4";

struct UdEnd {
    qp: Qp,
    cq: Cq,
    mr: Mr,
}

fn ud_end(n: &mut Node) -> UdEnd {
    let o = ConnOpts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let pd = n.guest.alloc_pd().unwrap();
    let cq = n.guest.create_cq(64).unwrap();
    let qp = n
        .guest
        .create_qp(QpType::Ud, pd, &cq, &cq, None, o.cap)
        .unwrap();
    let group = rxe_core::Gid::from_ip(GROUP.parse().unwrap());
    bring_up(&mut n.guest, &qp, group, 0, &o).unwrap();
    let mr = n.guest.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    UdEnd { qp, cq, mr }
}

/// ATTACH_MCAST or DETACH_MCAST of `e`'s QP to the group (what ib_attach_mcast does).
fn mcast(n: &mut Node, e: &UdEnd, op: u32) {
    let group = rxe_core::Gid::from_ip(GROUP.parse().unwrap());
    let mut c = Vec::new();
    c.extend_from_slice(&e.qp.qpn.to_le_bytes());
    c.extend_from_slice(&0u32.to_le_bytes());
    c.extend_from_slice(&group.0);
    n.guest.cmd(op, &c).expect("attach or detach");
}

fn post_recv(n: &mut Node, e: &UdEnd, wr_id: u64) {
    let wr = RecvWr {
        wr_id,
        sg_list: vec![e.mr.sge(0, 4096)].into(),
    };
    n.guest.post_recv(&e.qp, &wr).unwrap();
}

fn send_to_group(n: &mut Node, e: &UdEnd, msg: &[u8]) {
    e.mr.write(0, msg);
    let mut wr = SendWr::new(1, SendOp::Send, vec![e.mr.sge(0, msg.len() as u32)]);
    wr.ud = Some(UdDest {
        av: Av {
            dgid: rxe_core::Gid::from_ip(GROUP.parse().unwrap()),
            sgid_index: 0,
            hop_limit: 1,
            ..Default::default()
        },
        remote_qpn: rxe_core::Qpn(0xff_ffff),
        remote_qkey: 0x1111_1111,
    });
    n.guest.post_send(&e.qp, &wr).unwrap();
    assert_eq!(common::one(&mut n.guest, &e.cq).status, 0, "the send");
}

/// How many sockets of this network namespace are members of the group on `lo`
/// (/proc/net/igmp's Users, read in the test thread's namespace).
fn group_users() -> u32 {
    let igmp = std::fs::read_to_string("/proc/thread-self/net/igmp").unwrap();
    // The group's address as the kernel prints it: the network-order u32, in hex, as the
    // host reads it.
    let ip: std::net::Ipv4Addr = GROUP.parse().unwrap();
    let hex = format!("{:08X}", u32::from_ne_bytes(ip.octets()));
    let mut w = igmp.split_whitespace();
    while let Some(f) = w.next() {
        if f == hex {
            return w.next().and_then(|u| u.parse().ok()).unwrap_or(0);
        }
    }
    0
}

/// The datagram `e` received (after its 40-byte GRH), within `t`; `None` if none came.
fn received(n: &mut Node, e: &UdEnd, len: usize, t: Duration) -> Option<Vec<u8>> {
    let w = n.guest.wait_cq(&e.cq, 1, t);
    let w = w.first()?;
    assert_eq!((w.status, w.byte_len), (0, 40 + len as u32));
    Some(e.mr.to_vec(40, len))
}

#[test]
fn ud_multicast_between_daemons_and_back_to_the_sender() {
    run(
        "ud_multicast_between_daemons_and_back_to_the_sender",
        || {
            let (aa, ba) = loopback_pair(4791);
            let mut a = Node::start(bin(), aa, &[]).expect("node a");
            let mut b = Node::start(bin(), ba, &[]).expect("node b");
            let sender = ud_end(&mut a);
            let mate = ud_end(&mut a);
            let far = ud_end(&mut b);
            // Each daemon has joined the group by the time its ATTACH_MCAST answers.
            assert_eq!(group_users(), 0);
            mcast(&mut a, &mate, abi::op::ATTACH_MCAST);
            assert_eq!(group_users(), 1, "a joined before ATTACH_MCAST answered");
            mcast(&mut b, &far, abi::op::ATTACH_MCAST);
            assert_eq!(group_users(), 2, "b joined before ATTACH_MCAST answered");
            post_recv(&mut a, &mate, 7);
            post_recv(&mut b, &far, 8);
            // The groups are joined once the commands are served: the next send reaches them.
            send_to_group(&mut a, &sender, b"to the group");
            let t = common::T;
            assert_eq!(
                received(&mut b, &far, 12, t).as_deref(),
                Some(&b"to the group"[..])
            );
            assert_eq!(
                received(&mut a, &mate, 12, t).as_deref(),
                Some(&b"to the group"[..])
            );
            for n in [&a, &b] {
                let c = n.daemon.counters().unwrap();
                assert_eq!(json_u64(&c, "transport", "rx_icrc_bad"), Some(0));
                assert!(json_u64(&c, "transport", "rx_icrc_ok").unwrap() >= 1);
            }
            // b's last member leaves: b leaves the group, a's member still gets the next one.
            mcast(&mut b, &far, abi::op::DETACH_MCAST);
            assert_eq!(group_users(), 1, "b left before DETACH_MCAST answered");
            post_recv(&mut a, &mate, 9);
            post_recv(&mut b, &far, 10);
            send_to_group(&mut a, &sender, b"only a's mate");
            assert_eq!(
                received(&mut a, &mate, 13, t).as_deref(),
                Some(&b"only a's mate"[..])
            );
            assert_eq!(
                received(&mut b, &far, 13, Duration::from_millis(500)),
                None,
                "b left the group"
            );
        },
    );
}
