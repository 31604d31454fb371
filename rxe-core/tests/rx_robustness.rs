//! Hostile input on the receive path: mutated, truncated and forged packets are dropped or
//! answered per the protocol; the engine never panics, writes no memory a packet may not
//! reach, and the attacked QPs keep serving (or go to the error state and come back from it
//! the verbs way).
//!
//! This runs a bounded deterministic mutation loop in every test run; `rxe-core/fuzz` has the
//! coverage-guided targets for long runs.

use rxe_core::device::RecvMeta;
use rxe_core::sim::*;
use rxe_core::verbs::*;

/// Each node's one MR, (address, key), 4 KiB each.
type Mrs = [(u64, u32); 2];

/// The traffic the mutations start from; also returns the MRs: the only memory a remote
/// packet may change.
fn traffic(seed: u64) -> (Sim, [Endpoint; 2], Vec<Traced>, Mrs) {
    let mut sim = Sim::new(seed);
    sim.trace = Some(Vec::new());
    let ep = sim.connect(ConnOpts {
        mtu: Mtu::M256,
        ..Default::default()
    });
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (a, ak) = sim.reg(0, ep[0].pd, 4096, all);
    let (b, bk) = sim.reg(1, ep[1].pd, 4096, all);
    for i in 0..4 {
        sim.dev(1)
            .post_recv(
                ep[1].qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: vec![Sge {
                        addr: b,
                        length: 4096,
                        lkey: bk,
                    }]
                    .into(),
                },
            )
            .unwrap();
    }
    let sge = |len| {
        vec![Sge {
            addr: a,
            length: len,
            lkey: ak,
        }]
    };
    for (i, op) in [
        SendOp::Send,
        SendOp::SendWithImm(7),
        SendOp::Write {
            remote_addr: b,
            rkey: bk,
        },
        SendOp::WriteWithImm {
            remote_addr: b,
            rkey: bk,
            imm: 9,
        },
        SendOp::Read {
            remote_addr: b,
            rkey: bk,
        },
    ]
    .into_iter()
    .enumerate()
    {
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(i as u64, op, sge(1000)))
            .unwrap();
    }
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                8,
                SendOp::FetchAdd {
                    remote_addr: b,
                    rkey: bk,
                    add: 1,
                },
                sge(8),
            ),
        )
        .unwrap();
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                9,
                SendOp::CompSwap {
                    remote_addr: b,
                    rkey: bk,
                    compare: 1,
                    swap: 2,
                },
                sge(8),
            ),
        )
        .unwrap();
    sim.settle(10_000);
    let t = sim.trace.take().unwrap();
    (sim, ep, t, [(a, ak), (b, bk)])
}

/// Sends 64 bytes of `fill` from node 0's MR to node 1's on `ep`; returns the completions of
/// both nodes.
fn send_one(sim: &mut Sim, ep: &[Endpoint; 2], mrs: Mrs, fill: u8) -> [Vec<Cqe>; 2] {
    let [(a, ak), (b, bk)] = mrs;
    sim.nodes[0].mem.slice_mut(a, 64).fill(fill);
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 100,
                sg_list: vec![Sge {
                    addr: b,
                    length: 4096,
                    lkey: bk,
                }]
                .into(),
            },
        )
        .unwrap();
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                101,
                SendOp::Send,
                vec![Sge {
                    addr: a,
                    length: 64,
                    lkey: ak,
                }],
            ),
        )
        .unwrap();
    sim.settle(100_000);
    [sim.poll_all(0, ep[0].cq), sim.poll_all(1, ep[1].cq)]
}

#[test]
fn mutated_packets_never_panic_and_the_qp_keeps_working() {
    let (mut sim, ep, trace, mrs) = traffic(21);
    assert!(trace.len() > 20);
    for (n, e) in ep.iter().enumerate() {
        let _ = sim.poll_all(n, e.cq);
    }
    // Everything but the two MRs must come through the junk unchanged.
    let before = [
        sim.nodes[0].mem.bytes.clone(),
        sim.nodes[1].mem.bytes.clone(),
    ];
    let dropped_before =
        sim.dev(1).port_counters().rx_dropped + sim.dev(0).port_counters().rx_dropped;
    let mut refused = 0u64;
    let mut rng = Rng::new(99);
    let mut buf = vec![0u8; 8192];
    for round in 0..200_000u64 {
        let t = &trace[rng.below(trace.len() as u64) as usize];
        let mut p = t.bytes.clone();
        match rng.below(6) {
            0 => {
                let i = rng.below(p.len() as u64) as usize;
                p[i] ^= 1 << rng.below(8);
            }
            1 => p.truncate(rng.below(p.len() as u64 + 1) as usize),
            2 => {
                // Rewrite a header byte with anything.
                let i = rng.below(p.len().min(48) as u64) as usize;
                p[i] = rng.next_u64() as u8;
            }
            3 => {
                // Another opcode on the same headers.
                p[0] = rng.next_u64() as u8;
            }
            4 => {
                // Aim it at another QP or the multicast QPN.
                let q = [0u32, 1, 0x11, 0x12, 0x13, 0xffffff][rng.below(6) as usize];
                p[5..8].copy_from_slice(&q.to_be_bytes()[1..]);
            }
            _ => p.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8)),
        }
        let to = if rng.below(2) == 0 { 1 } else { 0 };
        let from_gid = sim.nodes[1 - to].gid;
        let meta = RecvMeta {
            src: from_gid,
            dst: sim.nodes[to].gid,
            hop_limit: 64,
            ..Default::default()
        };
        let n = &mut sim.nodes[to];
        if n.dev.handle_packet(sim.now, &meta, &p, &mut n.mem).is_err() {
            refused += 1;
        }
        if round % 64 == 0 {
            for k in 0..2 {
                let n = &mut sim.nodes[k];
                while n.dev.poll_transmit(sim.now, &mut n.mem, &mut buf).is_some() {}
            }
            sim.now = sim.now.plus_ns(1_000_000);
            for k in 0..2 {
                sim.nodes[k].dev.handle_timeout(sim.now);
            }
        }
    }
    let dropped = sim.dev(1).port_counters().rx_dropped + sim.dev(0).port_counters().rx_dropped;
    assert_eq!(
        dropped - dropped_before,
        refused,
        "every refused packet is counted once"
    );
    assert!(refused > 1000, "junk is refused: {refused} of 200000");
    // Memory: node 0 has nothing outstanding and no receive posted, so no packet may change
    // any byte of it (a READ response or atomic ACK nobody waits for is dropped). On node 1
    // an accepted WRITE or SEND (a mutated payload at the expected PSN) may change its MR, and
    // nothing else.
    let changed = |n: usize, skip: std::ops::Range<usize>| {
        let (now, was) = (&sim.nodes[n].mem.bytes, &before[n]);
        if now[..skip.start] == was[..skip.start] && now[skip.end..] == was[skip.end..] {
            return None;
        }
        (0..now.len())
            .find(|i| !skip.contains(i) && now[*i] != was[*i])
            .map(|i| MEM_BASE + i as u64)
    };
    assert_eq!(changed(0, 0..0), None, "node 0 memory changed");
    let b = (mrs[1].0 - MEM_BASE) as usize;
    assert_eq!(
        changed(1, b..b + 4096),
        None,
        "node 1 memory outside its MR changed"
    );
    // The attacked pair: each QP is still RTS or has gone to the error state (a responder
    // that meets a fatal request error does; IBTA 9.9.3). A SEND on it then either succeeds,
    // or completes the way a QP in error completes work: flushed on the QP in error, and on
    // an RTS sender whose responder is in error, RetryExcErr (the responder stays silent).
    let state = |sim: &Sim, n: usize| sim.nodes[n].dev.query_qp(ep[n].qpn).unwrap().0.qp_state;
    let s = [state(&sim, 0), state(&sim, 1)];
    for (n, st) in s.iter().enumerate() {
        assert!(
            matches!(st, QpState::Rts | QpState::Err),
            "node {n}: {st:?}"
        );
        let left: Vec<_> = sim.poll_all(n, ep[n].cq).iter().map(|c| c.status).collect();
        assert!(
            *st == QpState::Rts || left.iter().all(|&s| s == WcStatus::WrFlushErr),
            "node {n}: completions left by the junk on a QP in error: {left:?}"
        );
    }
    let c = send_one(&mut sim, &ep, mrs, 0x3c);
    let st = |c: &[Cqe]| c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>();
    match s {
        [QpState::Rts, QpState::Rts] => {
            assert_eq!(st(&c[0]), [(101, WcStatus::Success)]);
            assert_eq!(st(&c[1]), [(100, WcStatus::Success)]);
        }
        [QpState::Rts, _] => {
            assert_eq!(st(&c[0]), [(101, WcStatus::RetryExcErr)]);
            assert_eq!(st(&c[1]), [(100, WcStatus::WrFlushErr)]);
        }
        [_, s1] => {
            assert_eq!(st(&c[0]), [(101, WcStatus::WrFlushErr)]);
            if s1 == QpState::Err {
                assert_eq!(st(&c[1]), [(100, WcStatus::WrFlushErr)]);
            }
        }
    }
    // Whatever state the junk left, the same QPs go back to work the verbs way out of the
    // error state: RESET, then INIT → RTR → RTS.
    if s != [QpState::Rts, QpState::Rts] {
        reconnect(&mut sim, &ep);
        for (n, e) in ep.iter().enumerate() {
            let _ = sim.poll_all(n, e.cq);
        }
        let c = send_one(&mut sim, &ep, mrs, 0x5a);
        assert_eq!(st(&c[0]), [(101, WcStatus::Success)]);
        assert_eq!(st(&c[1]), [(100, WcStatus::Success)]);
        assert_eq!(c[1][0].byte_len, 64);
    }
    let sent = sim.nodes[0].mem.slice(mrs[0].0, 64).to_vec();
    assert_eq!(sim.nodes[1].mem.slice(mrs[1].0, 64), &sent[..]);
}

/// RESET, then INIT → RTR → RTS with fresh PSNs, as `Sim::connect` brings a pair up.
fn reconnect(sim: &mut Sim, ep: &[Endpoint; 2]) {
    for (i, e) in ep.iter().enumerate() {
        let reset = QpAttr {
            qp_state: QpState::Reset,
            ..Default::default()
        };
        sim.dev(i)
            .modify_qp(e.qpn, &reset, AttrMask(AttrMask::STATE))
            .expect("reset");
    }
    let o = ConnOpts {
        mtu: Mtu::M256,
        sq_psn: [0x7000, 0x7100],
        ..Default::default()
    };
    sim.bring_up(ep, &o);
}

#[test]
fn packets_from_the_wrong_address_are_dropped() {
    let (mut sim, ep, trace, _) = traffic(22);
    let req = trace.iter().find(|t| t.from == 0).unwrap();
    let before = sim.dev(1).qp_counters(ep[1].qpn).unwrap();
    let stranger = rxe_core::Gid::from_ipv4([10, 9, 9, 9]);
    for (src, dst) in [(stranger, sim.nodes[1].gid), (sim.nodes[0].gid, stranger)] {
        let meta = RecvMeta {
            src,
            dst,
            ..Default::default()
        };
        let n = &mut sim.nodes[1];
        assert!(n
            .dev
            .handle_packet(sim.now, &meta, &req.bytes, &mut n.mem)
            .is_err());
    }
    let after = sim.dev(1).qp_counters(ep[1].qpn).unwrap();
    assert_eq!(
        after.duplicates, before.duplicates,
        "never reached the responder"
    );
}
