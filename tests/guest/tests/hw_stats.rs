//! QUERY_STATS (caps HW_STATS): the port's counters under Linux rxe's hw counter names, what
//! the guest driver registers as hw_stats (`rdma statistic`, ports/1/hw_counters/). Two test
//! guests on two daemons over loopback: a SEND that arrives, then a SEND to a QP with no
//! receive posted (RNR NAKs until the requester's RNR retries run out), then the QPs
//! destroyed: every count lands where rxe puts it, and stays after the QPs are gone.

use std::time::Duration;

use common::bin;
use rxe_core::verbs::{RecvWr, SendOp, SendWr};
use vur_testguest::*;

mod common;

fn stats(g: &mut Guest) -> [u64; abi::MAX_STATS] {
    let b = g.cmd(abi::op::QUERY_STATS, &[]).expect("QUERY_STATS");
    let r: abi::RespQueryStats = abi::read_struct(&b).expect("a QUERY_STATS response");
    assert_eq!(r.count as usize, abi::stat::COUNT);
    r.values
}

#[test]
fn the_ports_counters_are_rxes() {
    use abi::stat::*;
    let (a_addr, b_addr) = loopback_pair(4791);
    let mut a = Node::start(bin(), a_addr, &[]).unwrap();
    let mut b = Node::start(bin(), b_addr, &[]).unwrap();
    let caps = a.guest.query_device().unwrap().caps;
    assert_ne!(caps & abi::caps::HW_STATS, 0, "caps {caps:#x}");
    assert_eq!(
        stats(&mut a.guest),
        [0; abi::MAX_STATS],
        "a new device counts nothing"
    );
    let o = ConnOpts {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..ConnOpts::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let sa = a.guest.reg_mr(ea.pd, 4096, o.access).unwrap();
    let sb = b.guest.reg_mr(eb.pd, 4096, o.access).unwrap();
    let wait = Duration::from_secs(10);
    // A SEND that finds its receive: one request, one ACK.
    let rwr = RecvWr {
        wr_id: 7,
        sg_list: vec![sb.sge(0, 4096)].into(),
    };
    b.guest.post_recv(&eb.qp, &rwr).unwrap();
    let send = |id| SendWr::new(id, SendOp::Send, vec![sa.sge(0, 64)]);
    a.guest.post_send(&ea.qp, &send(1)).unwrap();
    assert_eq!(a.guest.wait_cq(&ea.cq, 1, wait)[0].status, 0);
    assert_eq!(b.guest.wait_cq(&eb.cq, 1, wait)[0].status, 0);
    let (sa1, sb1) = (stats(&mut a.guest), stats(&mut b.guest));
    assert!(sa1[SENT_PKTS] >= 1 && sa1[RCVD_PKTS] >= 1, "a: {sa1:?}");
    assert!(sb1[SENT_PKTS] >= 1 && sb1[RCVD_PKTS] >= 1, "b: {sb1:?}");
    // A SEND with no receive posted: RNR NAKs, then RNR_RETRY_EXC_ERR after 2 retries.
    a.guest.post_send(&ea.qp, &send(2)).unwrap();
    let wc = a.guest.wait_cq(&ea.cq, 1, wait);
    assert_eq!(wc.len(), 1);
    assert_eq!(
        wc[0].status,
        rxe_core::verbs::WcStatus::RnrRetryExcErr as u32
    );
    let (sa2, sb2) = (stats(&mut a.guest), stats(&mut b.guest));
    assert_eq!(sa2[RCV_RNR], 3, "a received an RNR NAK per try: {sa2:?}");
    assert_eq!(sa2[RNR_RETRY_EXCEEDED], 1, "{sa2:?}");
    assert_eq!(sb2[SND_RNR], 3, "b sent them: {sb2:?}");
    assert_eq!(sa2[RETRY_EXCEEDED] + sb2[RETRY_EXCEEDED], 0);
    assert!(sa2[SENT_PKTS] >= sa1[SENT_PKTS] + 3, "{sa1:?} -> {sa2:?}");
    // The QPs go; their counts stay the device's.
    a.guest.destroy_qp(ea.qp).unwrap();
    b.guest.destroy_qp(eb.qp).unwrap();
    assert_eq!(stats(&mut a.guest), sa2);
    assert_eq!(stats(&mut b.guest), sb2);
}
