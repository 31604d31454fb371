//! The packet sequence that leaves a Linux rxe 6.12 requester with a SEND that never
//! completes (docs/interop.md, "A Linux rxe 6.12 requester that never completes a SEND"),
//! replayed against our engine packet by packet: the ACK of a multi-packet SEND is lost, the
//! requester retransmits, the responder's ACK of the duplicate FIRST arrives while the
//! retransmission is still going out, and the ACK of the retransmitted LAST is lost too. rxe's
//! completer moves past the WQE without completing it and never retries; ours must complete
//! the SEND exactly once, successfully, and leave nothing outstanding.

use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::Transmit;

/// Hands `pkts` to node `to`, as the link would.
fn deliver(sim: &mut Sim, to: usize, pkts: &[(Transmit, Vec<u8>)]) {
    for (_, bytes) in pkts {
        let _ = sim.inject(to, bytes);
    }
}

fn opcode(p: &(Transmit, Vec<u8>)) -> u8 {
    p.1[0]
}

#[test]
fn an_ack_that_arrives_mid_retransmission_completes_the_send() {
    let mut sim = Sim::new(21);
    let ep = sim.connect(ConnOpts {
        mtu: Mtu::M1024,
        timeout: 8,
        retry_cnt: 7,
        ..Default::default()
    });
    let len = 4096;
    let (src, skey) = sim.reg(0, ep[0].pd, len, Access::LOCAL_WRITE);
    let (dst, dkey) = sim.reg(1, ep[1].pd, len, Access::LOCAL_WRITE);
    let data = rxe_core::sim::prng_pattern(36, len);
    sim.nodes[0].mem.slice_mut(src, len).copy_from_slice(&data);
    let sge = |addr, lkey| {
        vec![Sge {
            addr,
            length: len as u32,
            lkey,
        }]
    };
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 9,
                sg_list: sge(dst, dkey).into(),
            },
        )
        .unwrap();
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge(src, skey)))
        .unwrap();

    // First transmission: all four packets arrive; the ACK of the LAST is lost.
    let first = sim.take(0, 16);
    assert_eq!(first.iter().map(opcode).collect::<Vec<_>>(), [0, 1, 1, 2]);
    deliver(&mut sim, 1, &first);
    let acks = sim.take(1, 16);
    assert_eq!(acks.iter().map(opcode).collect::<Vec<_>>(), [17], "one ACK");
    assert_eq!(
        sim.poll_all(1, ep[1].cq).len(),
        1,
        "the receive completed once"
    );

    // The retransmit timer fires; the retransmitted FIRST goes out alone.
    let t = sim.dev(0).poll_timeout().expect("retransmit timer armed");
    sim.now = t;
    sim.dev(0).handle_timeout(t);
    let retx_first = sim.take(0, 1);
    assert_eq!(retx_first.iter().map(opcode).collect::<Vec<_>>(), [0]);
    // The responder answers the duplicate FIRST with an ACK of the message's last PSN, and it
    // reaches the requester before the rest of the retransmission has left.
    deliver(&mut sim, 1, &retx_first);
    let dup_ack = sim.take(1, 16);
    assert_eq!(dup_ack.iter().map(opcode).collect::<Vec<_>>(), [17]);
    deliver(&mut sim, 0, &dup_ack);
    // Whatever is left of the retransmission reaches the responder; its ACKs are lost.
    let rest = sim.take(0, 16);
    deliver(&mut sim, 1, &rest);
    let _lost = sim.take(1, 16);

    // From here on the link is perfect: the SEND completes once, successfully.
    sim.settle(10_000);
    let done: Vec<_> = sim
        .poll_all(0, ep[0].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(done, [(1, WcStatus::Success)]);
    assert_eq!(sim.dev(0).sq_outstanding(ep[0].qpn), Some(0));
    assert!(sim.poll_all(1, ep[1].cq).is_empty(), "no second delivery");
    assert_eq!(sim.nodes[1].mem.slice(dst, len), &data[..]);
}
