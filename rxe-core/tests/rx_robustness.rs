//! Hostile input on the receive path: mutated, truncated and forged packets are dropped or
//! answered per the protocol; the engine never panics and keeps serving.
//!
//! This runs a bounded deterministic mutation loop in every test run; `rxe-core/fuzz` has the
//! coverage-guided targets for long runs.

use rxe_core::device::RecvMeta;
use rxe_core::sim::*;
use rxe_core::verbs::*;

fn traffic(seed: u64) -> (Sim, [Endpoint; 2], Vec<Traced>) {
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
                    }],
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
    (sim, ep, t)
}

#[test]
fn mutated_packets_never_panic_and_the_qp_keeps_working() {
    let (mut sim, _, trace) = traffic(21);
    assert!(trace.len() > 20);
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
        let _ = n.dev.handle_packet(sim.now, &meta, &p, &mut n.mem);
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
    // Whatever state the junk left the QPs in, the devices still work: a fresh pair connects
    // and carries a message.
    let ep2 = sim.connect(ConnOpts::default());
    let (a, ak) = sim.reg(0, ep2[0].pd, 64, Access::LOCAL_WRITE);
    let (b, bk) = sim.reg(1, ep2[1].pd, 64, Access::LOCAL_WRITE);
    sim.nodes[0].mem.slice_mut(a, 64).fill(0x3c);
    sim.dev(1)
        .post_recv(
            ep2[1].qpn,
            RecvWr {
                wr_id: 1,
                sg_list: vec![Sge {
                    addr: b,
                    length: 64,
                    lkey: bk,
                }],
            },
        )
        .unwrap();
    sim.dev(0)
        .post_send(
            ep2[0].qpn,
            SendWr::new(
                1,
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
    let c = sim.poll_all(1, ep2[1].cq);
    assert_eq!(
        c.last().map(|c| (c.wr_id, c.status)),
        Some((1, WcStatus::Success))
    );
    assert!(sim.nodes[1].mem.slice(b, 64).iter().all(|&x| x == 0x3c));
    let pc = sim.dev(1).port_counters();
    assert!(pc.rx_dropped > 1000, "junk was counted: {pc:?}");
}

#[test]
fn packets_from_the_wrong_address_are_dropped() {
    let (mut sim, ep, trace) = traffic(22);
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
