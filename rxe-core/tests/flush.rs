//! RDMA FLUSH (IBTA 1.5 Memory Placement Extensions) as Linux rxe 6.12 does it: the request
//! carries FETH + RETH and no payload, the responder checks the QP's rights for the placement
//! type (an invalid request if missing), then the R_Key with the memory rights of the placement
//! type and, for selectivity "range", the RETH range (a remote access error if any fails), and
//! answers with an empty RDMA READ response ONLY; duplicates are answered from the responder
//! resource; the requester completes the WQE with the FLUSH opcode and its length.

use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::{Opcode, Packet, Syndrome};

const LW: Access = Access::LOCAL_WRITE;
const FG: Access = Access::FLUSH_GLOBAL;
const FP: Access = Access::FLUSH_PERSISTENT;

/// QP rights as pyverbs' extended RC QPs have them: remote everything and both placements.
fn qp_access() -> Access {
    LW.union(Access::REMOTE).union(FG).union(FP)
}

fn pair(seed: u64, access: Access) -> (Sim, [Endpoint; 2]) {
    let mut sim = Sim::new(seed);
    let ep = sim.connect(ConnOpts {
        access,
        timeout: 10,
        ..Default::default()
    });
    (sim, ep)
}

fn flush(remote_addr: u64, rkey: u32, len: u32, selectivity: u8, placement: u8) -> SendOp {
    SendOp::Flush {
        remote_addr,
        rkey,
        len,
        selectivity,
        placement,
    }
}

fn post(sim: &mut Sim, ep: &[Endpoint; 2], id: u64, op: SendOp) {
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(id, op, vec![]))
        .expect("post FLUSH");
}

/// Runs one FLUSH to completion; returns its completion.
fn run_one(sim: &mut Sim, ep: &[Endpoint; 2], op: SendOp) -> Cqe {
    post(sim, ep, 9, op);
    sim.settle(1000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(c.len(), 1, "{c:?}");
    c[0]
}

fn events(sim: &mut Sim, n: usize) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| sim.dev(n).poll_event()).collect()
}

#[test]
fn write_then_flush_range_and_whole_mr() {
    let (mut sim, ep) = pair(71, qp_access());
    sim.trace = Some(Vec::new());
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, LW.union(Access::REMOTE_WRITE).union(FG));
    let (src, skey) = sim.reg(0, ep[0].pd, 4096, LW);
    sim.nodes[0].mem.slice_mut(src, 4096).fill(0x5a);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: dst,
                    rkey: dkey,
                },
                vec![Sge {
                    addr: src,
                    length: 4096,
                    lkey: skey,
                }],
            ),
        )
        .unwrap();
    post(
        &mut sim,
        &ep,
        2,
        flush(dst + 16, dkey, 1000, flush::RANGE, flush::GLOBAL),
    );
    // Level "memory region": the RETH's address and length are not looked at (pyverbs sends
    // random lengths far beyond the MR).
    post(
        &mut sim,
        &ep,
        3,
        flush(0, dkey, 12_345_678, flush::MR, flush::GLOBAL),
    );
    // An empty range at the MR's end is inside it.
    post(
        &mut sim,
        &ep,
        4,
        flush(dst + 4096, dkey, 0, flush::RANGE, flush::GLOBAL),
    );
    sim.settle(1000);
    let c = sim.poll_all(0, ep[0].cq);
    let got: Vec<_> = c
        .iter()
        .map(|c| (c.wr_id, c.status, c.opcode, c.byte_len))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, WcStatus::Success, WcOpcode::RdmaWrite, 4096),
            (2, WcStatus::Success, WcOpcode::Flush, 1000),
            (3, WcStatus::Success, WcOpcode::Flush, 12_345_678),
            (4, WcStatus::Success, WcOpcode::Flush, 0),
        ]
    );
    assert!(sim.nodes[1].mem.slice(dst, 4096).iter().all(|&b| b == 0x5a));
    assert_eq!(sim.dev(1).qp(ep[1].qpn).unwrap().state(), QpState::Rts);

    // On the wire: FETH (selectivity in bits 5:4, placement in 3:0, big-endian) right after
    // the BTH, then the RETH; no payload. The answer: RDMA READ response ONLY, same PSN, an
    // ACK syndrome, no payload.
    let trace = sim.trace.take().unwrap();
    let reqs: Vec<_> = trace
        .iter()
        .filter(|t| t.from == 0 && t.bytes[0] == Opcode::RC_FLUSH.0)
        .collect();
    assert_eq!(reqs.len(), 3);
    let b = &reqs[0].bytes;
    assert_eq!(&b[12..16], &[0, 0, 0, 0x01], "FETH: range, global");
    let p = Packet::new_checked(&b[..]).unwrap();
    let reth = p.reth().unwrap();
    assert_eq!(
        (reth.va(), reth.rkey(), reth.dma_len()),
        (dst + 16, dkey, 1000)
    );
    assert_eq!(p.payload_len(), 0);
    assert!(p.bth().ack_req());
    assert_eq!(b.len(), 12 + 4 + 16 + 4, "BTH FETH RETH ICRC");
    assert_eq!(&reqs[1].bytes[12..16], &[0, 0, 0, 0x11], "FETH: MR, global");
    let psns: Vec<u32> = reqs
        .iter()
        .map(|t| Packet::new_checked(&t.bytes[..]).unwrap().bth().psn())
        .collect();
    for psn in psns {
        let resp: Vec<_> = trace
            .iter()
            .filter(|t| t.from == 1)
            .map(|t| Packet::new_checked(&t.bytes[..]).unwrap())
            .filter(|p| p.bth().psn() == psn)
            .map(|p| (p.opcode(), p.aeth().map(|a| a.syndrome()), p.payload_len()))
            .collect();
        assert_eq!(
            resp,
            vec![(
                Opcode::RC_RDMA_READ_RESPONSE_ONLY,
                Some(Syndrome::Ack(0x1f)),
                0
            )],
            "psn {psn:#x}"
        );
    }
}

/// The errors rxe answers with a remote access error NAK: the requester's WQE completes with
/// REM_ACCESS_ERR, both QPs go to ERR, the responder raises QP_ACCESS_ERR.
#[test]
fn rkey_access_and_range_errors_are_remote_access_errors() {
    struct Case {
        what: &'static str,
        mr: Access,
        op: fn(u64, u32) -> SendOp,
    }
    let cases = [
        Case {
            what: "a bad R_Key",
            mr: LW.union(FG),
            op: |a, k| flush(a, k ^ 0x100, 64, flush::RANGE, flush::GLOBAL),
        },
        Case {
            what: "an MR without FLUSH_GLOBAL",
            mr: LW.union(Access::REMOTE),
            op: |a, k| flush(a, k, 64, flush::RANGE, flush::GLOBAL),
        },
        Case {
            what: "the same, level MR",
            mr: LW.union(Access::REMOTE),
            op: |a, k| flush(a, k, 64, flush::MR, flush::GLOBAL),
        },
        Case {
            what: "a range past the MR's end",
            mr: LW.union(FG),
            op: |a, k| flush(a + 1, k, 4096, flush::RANGE, flush::GLOBAL),
        },
        Case {
            what: "a range before the MR",
            mr: LW.union(FG),
            op: |a, k| flush(a - 1, k, 1, flush::RANGE, flush::GLOBAL),
        },
        Case {
            // pyverbs' test_qp_ex_rc_flush_type_violate
            what: "placement PERSISTENT on an MR registered for GLOBAL only",
            mr: LW.union(Access::REMOTE_WRITE).union(FG),
            op: |a, k| flush(a, k, 64, flush::RANGE, flush::PERSISTENT),
        },
        Case {
            what: "both placements on an MR registered for GLOBAL only",
            mr: LW.union(FG),
            op: |a, k| flush(a, k, 64, flush::MR, flush::GLOBAL | flush::PERSISTENT),
        },
    ];
    for (i, c) in cases.iter().enumerate() {
        let (mut sim, ep) = pair(80 + i as u64, qp_access());
        let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, c.mr);
        let cqe = run_one(&mut sim, &ep, (c.op)(dst, dkey));
        assert_eq!(
            (cqe.status, cqe.opcode),
            (WcStatus::RemAccessErr, WcOpcode::Flush),
            "{}",
            c.what
        );
        assert_eq!(cqe.byte_len, 0, "{}", c.what);
        assert_eq!(sim.dev(0).qp(ep[0].qpn).unwrap().state(), QpState::Err);
        assert_eq!(sim.dev(1).qp(ep[1].qpn).unwrap().state(), QpState::Err);
        assert!(
            events(&mut sim, 1).contains(&AsyncEvent::QpAccessErr { qpn: ep[1].qpn }),
            "{}",
            c.what
        );
    }
}

/// rxe checks the QP's rights first (`check_qp_attr_access`): a FLUSH whose placement type the
/// responder's QP does not allow is an invalid request, whatever the MR allows.
#[test]
fn placement_not_allowed_on_the_qp_is_an_invalid_request() {
    for (placement, qp) in [
        (flush::GLOBAL, LW.union(Access::REMOTE)),
        (flush::PERSISTENT, LW.union(Access::REMOTE).union(FG)),
    ] {
        let (mut sim, ep) = pair(90, qp);
        let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, LW.union(FG));
        let cqe = run_one(&mut sim, &ep, flush(dst, dkey, 64, flush::RANGE, placement));
        assert_eq!(cqe.status, WcStatus::RemInvReqErr, "placement {placement}");
        assert!(events(&mut sim, 1).contains(&AsyncEvent::QpReqErr { qpn: ep[1].qpn }));
    }
    // A DMA length beyond 2^31 is an invalid request too (C9-94), checked before the key.
    let (mut sim, ep) = pair(91, qp_access());
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, LW.union(FG));
    let cqe = run_one(
        &mut sim,
        &ep,
        flush(dst, dkey, (1 << 31) + 1, flush::MR, flush::GLOBAL),
    );
    assert_eq!(cqe.status, WcStatus::RemInvReqErr);
}

/// Nothing can be made persistent: an MR cannot be registered for it (rxe: not pmem, EINVAL),
/// and a persistent flush through an MR that has the right anyway (a DMA MR) fails unless
/// its range is empty, as rxe's does.
#[test]
fn persistence_is_never_claimed() {
    let (mut sim, ep) = pair(92, qp_access());
    let a = sim.alloc(1, 4096);
    for access in [LW.union(FP), LW.union(FG).union(FP)] {
        assert_eq!(
            sim.dev(1).reg_mr(
                ep[1].pd,
                a,
                4096,
                access,
                rxe_core::mem::Backing::Contiguous { base: a }
            ),
            Err(rxe_core::VerbError::Invalid),
            "{access:?}"
        );
    }
    let dma = sim
        .dev(1)
        .reg_dma_mr(ep[1].pd, LW.union(FG).union(FP))
        .unwrap();
    let c = run_one(
        &mut sim,
        &ep,
        flush(a, dma, 0, flush::RANGE, flush::PERSISTENT),
    );
    assert_eq!(c.status, WcStatus::Success, "an empty range");
    let c = run_one(
        &mut sim,
        &ep,
        flush(a, dma, 64, flush::RANGE, flush::GLOBAL),
    );
    assert_eq!(c.status, WcStatus::Success, "global through the DMA MR");
    let c = run_one(
        &mut sim,
        &ep,
        flush(a, dma, 64, flush::RANGE, flush::PERSISTENT),
    );
    assert_eq!(c.status, WcStatus::RemAccessErr);
}

/// Placement type 0 asks for no rights (rxe reads the field so): the key and range are still
/// checked.
#[test]
fn placement_zero_needs_no_rights() {
    let (mut sim, ep) = pair(93, LW.union(Access::REMOTE));
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, LW);
    let c = run_one(&mut sim, &ep, flush(dst, dkey, 4096, flush::RANGE, 0));
    assert_eq!(c.status, WcStatus::Success);
    let c = run_one(&mut sim, &ep, flush(dst, dkey, 4097, flush::RANGE, 0));
    assert_eq!(c.status, WcStatus::RemAccessErr);
}

#[test]
fn flush_is_rc_only() {
    let mut sim = Sim::new(94);
    let ep = sim.connect(ConnOpts {
        qp_type: QpType::Uc,
        ..Default::default()
    });
    let r = sim.dev(0).post_send(
        ep[0].qpn,
        SendWr::new(1, flush(0, 0x100, 8, flush::RANGE, flush::GLOBAL), vec![]),
    );
    assert_eq!(r, Err(rxe_core::VerbError::Invalid));
}

/// The response to a FLUSH is lost: the requester times out and sends it again; the responder
/// sees a duplicate and answers it from its resource (same PSN and MSN) without executing it
/// again.
#[test]
fn lost_response_is_replayed_from_the_resource() {
    let (mut sim, ep) = pair(95, qp_access());
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, LW.union(FG));
    post(
        &mut sim,
        &ep,
        1,
        flush(dst, dkey, 64, flush::RANGE, flush::GLOBAL),
    );
    let req = sim.take(0, 8);
    assert_eq!(req.len(), 1);
    sim.inject(1, &req[0].1).unwrap();
    let lost = sim.take(1, 8);
    assert_eq!(lost.len(), 1, "the response, dropped");
    let first = Packet::new_checked(&lost[0].1[..]).unwrap();
    assert_eq!(first.opcode(), Opcode::RC_RDMA_READ_RESPONSE_ONLY);
    let (psn, msn) = (first.bth().psn(), first.aeth().unwrap().msn());
    sim.arrivals = Some(Vec::new());
    sim.settle(1000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success)]
    );
    let replay: Vec<_> = sim
        .arrivals
        .take()
        .unwrap()
        .into_iter()
        .filter(|a| a.to == 0)
        .map(|a| {
            let p = Packet::new_checked(&a.bytes[..]).unwrap();
            (p.opcode(), p.bth().psn(), p.aeth().unwrap().msn())
        })
        .collect();
    assert_eq!(replay, vec![(Opcode::RC_RDMA_READ_RESPONSE_ONLY, psn, msn)]);
    assert_eq!(sim.dev(1).qp_counters(ep[1].qpn).unwrap().duplicates, 1);
    assert!(sim.dev(0).qp_counters(ep[0].qpn).unwrap().timeouts >= 1);
}

/// A FLUSH's response is lost, but the ACK of a WRITE after it arrives: as for a READ, the
/// ACK does not complete the FLUSH; the requester goes back and sends it again, and both
/// complete in order.
#[test]
fn ack_past_a_flush_sends_it_again() {
    let (mut sim, ep) = pair(96, qp_access());
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4096, LW.union(Access::REMOTE).union(FG));
    let (src, skey) = sim.reg(0, ep[0].pd, 64, LW);
    post(
        &mut sim,
        &ep,
        1,
        flush(dst, dkey, 64, flush::RANGE, flush::GLOBAL),
    );
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: dst,
                    rkey: dkey,
                },
                vec![Sge {
                    addr: src,
                    length: 64,
                    lkey: skey,
                }],
            ),
        )
        .unwrap();
    let reqs = sim.take(0, 8);
    assert_eq!(reqs.len(), 2);
    for (_, b) in &reqs {
        sim.inject(1, b).unwrap();
    }
    let resps = sim.take(1, 8);
    assert_eq!(resps.len(), 2, "the FLUSH's response and the WRITE's ACK");
    // Only the ACK arrives.
    sim.inject(0, &resps[1].1).unwrap();
    assert!(
        sim.poll_all(0, ep[0].cq).is_empty(),
        "nothing completes yet"
    );
    sim.settle(1000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    assert!(sim.dev(0).qp_counters(ep[0].qpn).unwrap().retransmits >= 1);
}
