//! Ghost responses: a response whose PSN is not before the next PSN the
//! requester would send acknowledges something never sent. It must be dropped and counted —
//! never complete a pending WQE or move the completer — so that the peer's real responses
//! afterwards complete the work normally.

use rxe_core::device::Drop;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::{emit, BthRepr, ExtRepr, NakCode, Opcode, Syndrome};

const LEN: usize = 256;

/// The requester side: node 0 writes into node 1. Returns (sim, endpoints, src, dst, dkey).
fn setup(sq_psn: u32) -> (Sim, [Endpoint; 2], (u64, u32), (u64, u32)) {
    let mut sim = Sim::new(41);
    let ep = sim.connect(ConnOpts {
        sq_psn: [sq_psn, 0x200],
        timeout: 10,
        ..Default::default()
    });
    let src = sim.reg(0, ep[0].pd, 2 * LEN, Access::LOCAL_WRITE);
    let dst = sim.reg(
        1,
        ep[1].pd,
        2 * LEN,
        Access::LOCAL_WRITE.union(Access::REMOTE),
    );
    let data = rxe_core::sim::prng_pattern(28, 2 * LEN);
    sim.nodes[0]
        .mem
        .slice_mut(src.0, 2 * LEN)
        .copy_from_slice(&data);
    (sim, ep, src, dst)
}

fn write(sim: &mut Sim, ep: &[Endpoint; 2], id: u64, src: (u64, u32), dst: (u64, u32)) {
    let off = (id - 1) * LEN as u64;
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                id,
                SendOp::Write {
                    remote_addr: dst.0 + off,
                    rkey: dst.1,
                },
                vec![Sge {
                    addr: src.0 + off,
                    length: LEN as u32,
                    lkey: src.1,
                }],
            ),
        )
        .unwrap();
}

/// Sends everything node 0 has ready into the void (the link loses it).
fn lose_all(sim: &mut Sim) -> usize {
    sim.take(0, usize::MAX).len()
}

/// A response from node 1 to node 0's QP, as a forger (or a confused peer) would send it.
fn response(ep: &[Endpoint; 2], op: Opcode, psn: u32, syndrome: u8) -> Vec<u8> {
    let ext = ExtRepr {
        aeth: (syndrome, 1),
        atomic_orig: 0x1234,
        ..Default::default()
    };
    let plen = if op == Opcode::RC_RDMA_READ_RESPONSE_ONLY {
        8
    } else {
        0
    };
    let mut buf = vec![0u8; 128];
    let bth = BthRepr::new(op, ep[0].qpn.0, psn, false);
    let (n, _) = emit(&mut buf, &bth, &ext, plen).unwrap();
    buf.truncate(n);
    buf
}

fn deliver_to_requester(sim: &mut Sim, bytes: &[u8]) -> Result<(), Drop> {
    sim.inject(0, bytes)
}

/// Every kind of response, with `psn`.
fn all_kinds(ep: &[Endpoint; 2], psn: u32) -> Vec<Vec<u8>> {
    let ack = Syndrome::ACK;
    let seq_nak = Syndrome::Nak(NakCode::PsnSeqError).to_byte();
    let acc_nak = Syndrome::Nak(NakCode::RemoteAccessError).to_byte();
    let rnr = Syndrome::RnrNak(1).to_byte();
    vec![
        response(ep, Opcode::RC_ACKNOWLEDGE, psn, ack),
        response(ep, Opcode::RC_ACKNOWLEDGE, psn, seq_nak),
        response(ep, Opcode::RC_ACKNOWLEDGE, psn, acc_nak),
        response(ep, Opcode::RC_ACKNOWLEDGE, psn, rnr),
        response(ep, Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn, ack),
        response(ep, Opcode::RC_ATOMIC_ACKNOWLEDGE, psn, ack),
    ]
}

fn check_ghosts_then_recovery(sq_psn: u32) {
    let (mut sim, ep, src, dst) = setup(sq_psn);
    // WRITE 1 (one packet, PSN sq_psn) is lost on the link.
    write(&mut sim, &ep, 1, src, dst);
    assert_eq!(lose_all(&mut sim), 1);
    let max_psn = (sq_psn + 1) & 0xff_ffff;
    let mut forged = Vec::new();
    // Exactly the next PSN to send, just past it, and far ahead (half the PSN space minus one).
    for ahead in [0u32, 1, 0x1000, (1 << 23) - 1] {
        forged.extend(all_kinds(&ep, (max_psn + ahead) & 0xff_ffff));
    }
    for f in &forged {
        assert_eq!(deliver_to_requester(&mut sim, f), Err(Drop::Ghost));
    }
    let c = sim.dev(0).qp_counters(ep[0].qpn).unwrap();
    assert_eq!(c.ghost_responses, forged.len() as u64);
    assert_eq!(c.naks_received, 0, "a ghost NAK is not a NAK");
    assert_eq!(c.rnr_naks_received, 0);
    assert!(
        sim.poll_all(0, ep[0].cq).is_empty(),
        "a ghost must not complete the lost WRITE"
    );
    assert_eq!(sim.dev(0).sq_outstanding(ep[0].qpn), Some(1));
    assert_eq!(sim.dev(0).qp(ep[0].qpn).unwrap().state(), QpState::Rts);

    // The real traffic afterwards: the retransmit timer resends WRITE 1, WRITE 2 follows, and
    // the peer's real ACKs complete both, successfully and in order.
    write(&mut sim, &ep, 2, src, dst);
    sim.settle(100_000);
    let done: Vec<_> = sim
        .poll_all(0, ep[0].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(done, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(sim.dev(0).sq_outstanding(ep[0].qpn), Some(0));
    let want = sim.nodes[0].mem.slice(src.0, 2 * LEN).to_vec();
    assert_eq!(sim.nodes[1].mem.slice(dst.0, 2 * LEN), &want[..]);
    let c = sim.dev(0).qp_counters(ep[0].qpn).unwrap();
    assert_eq!(c.ghost_responses, forged.len() as u64);
    assert!(c.retransmits >= 1, "WRITE 1 came back by retransmission");
}

#[test]
fn ghost_responses_are_dropped_and_the_real_ack_completes() {
    check_ghosts_then_recovery(0x100);
}

#[test]
fn ghost_responses_across_the_psn_wrap() {
    // max_psn wraps to 0: PSNs 0, 1, ... are ahead of it, 0xffffff is the WRITE's own.
    check_ghosts_then_recovery(0xff_ffff);
}

#[test]
fn responses_before_the_next_psn_are_not_ghosts() {
    let (mut sim, ep, src, dst) = setup(0x100);
    write(&mut sim, &ep, 1, src, dst);
    assert_eq!(lose_all(&mut sim), 1);
    // An ACK of an old PSN is a duplicate; the ACK of the PSN just sent is the real one.
    let old = response(&ep, Opcode::RC_ACKNOWLEDGE, 0x80, Syndrome::ACK);
    assert_eq!(deliver_to_requester(&mut sim, &old), Err(Drop::Duplicate));
    let real = response(&ep, Opcode::RC_ACKNOWLEDGE, 0x100, Syndrome::ACK);
    assert_eq!(deliver_to_requester(&mut sim, &real), Ok(()));
    let done: Vec<_> = sim
        .poll_all(0, ep[0].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(done, [(1, WcStatus::Success)]);
    assert_eq!(
        sim.dev(0).qp_counters(ep[0].qpn).unwrap().ghost_responses,
        0
    );
}
