//! A malformed SEND at an RC responder: a payload above the path MTU, a
//! short FIRST, a FIRST with a pad count. Like Linux rxe (`check_resource()` takes the receive
//! WQE before `check_length()` fails, then `do_complete()` completes it with the error), the
//! responder NAKs with "invalid request", moves the QP to ERR, and completes the consumed
//! receive WQE with REM_INV_REQ_ERR; the receives behind it are flushed. The same holds for
//! the receive WQE a WRITE with immediate claims.

use rxe_core::device::Drop;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::{emit, BthRepr, ExtRepr, NakCode, Opcode, Packet, Syndrome};

const MTU: usize = 1024;

fn setup(recvs: u64) -> (Sim, [Endpoint; 2], u64) {
    let mut sim = Sim::new(17);
    let ep = sim.connect(ConnOpts {
        mtu: Mtu::M1024,
        ..Default::default()
    });
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4 * MTU, Access::LOCAL_WRITE);
    for id in 0..recvs {
        sim.dev(1)
            .post_recv(
                ep[1].qpn,
                RecvWr {
                    wr_id: 7 + id,
                    sg_list: vec![Sge {
                        addr: dst,
                        length: 4 * MTU as u32,
                        lkey: dkey,
                    }]
                    .into(),
                },
            )
            .unwrap();
    }
    (sim, ep, dst)
}

/// A SEND packet from node 0 to node 1's QP at the PSN node 1 expects (0x100).
fn send(ep: &[Endpoint; 2], op: Opcode, plen: usize) -> Vec<u8> {
    let mut buf = vec![0u8; 8192];
    let bth = BthRepr::new(op, ep[1].qpn.0, 0x100, true);
    let (n, range) = emit(&mut buf, &bth, &ExtRepr::default(), plen).unwrap();
    buf[range].fill(0x5a);
    buf.truncate(n);
    buf
}

fn deliver(sim: &mut Sim, bytes: &[u8]) -> Result<(), Drop> {
    sim.inject(1, bytes)
}

/// What node 1 sends back: (opcode, PSN, AETH syndrome).
fn responses(sim: &mut Sim) -> Vec<(Opcode, u32, u8)> {
    sim.take(1, usize::MAX)
        .iter()
        .map(|(_, b)| {
            let p = Packet::new_checked(&b[..]).unwrap();
            let syn = p.aeth().map(|a| a.syndrome().to_byte()).unwrap_or(0xff);
            (p.opcode(), p.bth().psn(), syn)
        })
        .collect()
}

fn check_malformed(op: Opcode, plen: usize) {
    let (mut sim, ep, _) = setup(2);
    let pkt = send(&ep, op, plen);
    check_rejected(
        &mut sim,
        &ep,
        &pkt,
        NakCode::InvalidRequest,
        WcStatus::RemInvReqErr,
    );
}

/// `pkt` is NAKed with `code`, the QP goes to ERR, the first receive (wr_id 7) completes with
/// `status` and the second (8) is flushed.
fn check_rejected(sim: &mut Sim, ep: &[Endpoint; 2], pkt: &[u8], code: NakCode, status: WcStatus) {
    assert!(deliver(sim, pkt).is_err());
    let nak = Syndrome::Nak(code).to_byte();
    assert_eq!(
        responses(sim),
        [(Opcode::RC_ACKNOWLEDGE, 0x100, nak)],
        "one NAK"
    );
    assert_eq!(sim.dev(1).qp(ep[1].qpn).unwrap().state(), QpState::Err);
    let cqes: Vec<_> = sim
        .poll_all(1, ep[1].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        cqes,
        [(7, status), (8, WcStatus::WrFlushErr)],
        "the consumed receive says why; the next one is flushed"
    );
    let ev: Vec<_> = std::iter::from_fn(|| sim.dev(1).poll_event()).collect();
    let want = match code {
        NakCode::RemoteAccessError => AsyncEvent::QpAccessErr { qpn: ep[1].qpn },
        _ => AsyncEvent::QpReqErr { qpn: ep[1].qpn },
    };
    assert!(ev.contains(&want), "{ev:?}");
    let c = sim.dev(1).qp_counters(ep[1].qpn).unwrap();
    assert_eq!((c.naks_sent, c.errors), (1, 1));
}

/// A WRITE ONLY with immediate into a fresh remote-writable MR on node 1 (`rkey_xor` spoils
/// its key).
fn write_imm(sim: &mut Sim, ep: &[Endpoint; 2], plen: usize, rkey_xor: u32) -> Vec<u8> {
    let (va, rkey) = sim.reg(
        1,
        ep[1].pd,
        4 * MTU,
        Access::LOCAL_WRITE.union(Access::REMOTE),
    );
    let mut buf = vec![0u8; 8192];
    let bth = BthRepr::new(
        Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE,
        ep[1].qpn.0,
        0x100,
        true,
    );
    let ext = ExtRepr {
        reth: (va, rkey ^ rkey_xor, plen as u32),
        imm: 0xfeed,
        ..Default::default()
    };
    let (n, range) = emit(&mut buf, &bth, &ext, plen).unwrap();
    buf[range].fill(0x3c);
    buf.truncate(n);
    buf
}

#[test]
fn write_with_immediate_above_the_path_mtu_completes_its_receive_with_the_error() {
    // rxe claims the receive WQE of a WRITE with immediate in check_resource() too.
    let (mut sim, ep, _) = setup(2);
    let p = write_imm(&mut sim, &ep, MTU + 4, 0);
    check_rejected(
        &mut sim,
        &ep,
        &p,
        NakCode::InvalidRequest,
        WcStatus::RemInvReqErr,
    );
}

#[test]
fn write_with_immediate_and_a_bad_rkey_completes_its_receive_with_the_error() {
    let (mut sim, ep, _) = setup(2);
    let p = write_imm(&mut sim, &ep, 64, 0x100);
    check_rejected(
        &mut sim,
        &ep,
        &p,
        NakCode::RemoteAccessError,
        WcStatus::RemAccessErr,
    );
}

#[test]
fn a_good_write_with_immediate_still_completes() {
    let (mut sim, ep, _) = setup(1);
    let p = write_imm(&mut sim, &ep, 64, 0);
    assert_eq!(deliver(&mut sim, &p), Ok(()));
    let c = sim.poll_all(1, ep[1].cq);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].opcode, c[0].imm_or_inv),
        (7, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0xfeed)
    );
    let ack = (Opcode::RC_ACKNOWLEDGE, 0x100, Syndrome::ACK);
    assert_eq!(responses(&mut sim), [ack]);
}

#[test]
fn send_only_above_the_path_mtu() {
    check_malformed(Opcode::RC_SEND_ONLY, MTU + 4);
}

#[test]
fn short_send_first() {
    check_malformed(Opcode::RC_SEND_FIRST, MTU / 2);
}

#[test]
fn send_first_with_a_pad_count() {
    // MTU - 1 bytes of payload and one pad byte: the packet is MTU-sized, the payload is not.
    let (_, ep, _) = setup(0);
    let p = send(&ep, Opcode::RC_SEND_FIRST, MTU - 1);
    assert_eq!(Packet::new_checked(&p[..]).unwrap().bth().pad_count(), 1);
    check_malformed(Opcode::RC_SEND_FIRST, MTU - 1);
}

#[test]
fn a_malformed_send_without_a_receive_is_rnr_naked_as_rxe_does() {
    // rxe looks for the receive WQE before it checks the length: none is an RNR NAK, and the
    // QP stays usable.
    let (mut sim, ep, _) = setup(0);
    let p = send(&ep, Opcode::RC_SEND_ONLY, MTU + 4);
    assert_eq!(deliver(&mut sim, &p), Err(Drop::NoReceiveWqe));
    let rnr = Syndrome::RnrNak(1).to_byte();
    assert_eq!(responses(&mut sim), [(Opcode::RC_ACKNOWLEDGE, 0x100, rnr)]);
    assert_eq!(sim.dev(1).qp(ep[1].qpn).unwrap().state(), QpState::Rts);
    assert!(sim.poll_all(1, ep[1].cq).is_empty());
}

#[test]
fn a_well_formed_send_still_completes() {
    let (mut sim, ep, _) = setup(2);
    assert_eq!(
        deliver(&mut sim, &send(&ep, Opcode::RC_SEND_ONLY, MTU)),
        Ok(())
    );
    let cqes = sim.poll_all(1, ep[1].cq);
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wr_id, cqes[0].status, cqes[0].byte_len),
        (7, WcStatus::Success, MTU as u32)
    );
}
