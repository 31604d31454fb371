//! End-to-end behaviour of the engine through the two-node simulator.

use rxe_core::sim::*;
use rxe_core::verbs::*;

fn lw() -> Access {
    Access::LOCAL_WRITE
}

/// The shared PRNG fill ([`prng_pattern`]), no period a segment could hide in.
fn fill(sim: &mut Sim, node: usize, addr: u64, len: usize, seed: u8) -> Vec<u8> {
    let data = prng_pattern(seed.into(), len);
    sim.nodes[node]
        .mem
        .slice_mut(addr, len)
        .copy_from_slice(&data);
    data
}

#[test]
fn rc_send_one_message() {
    let mut sim = Sim::new(1);
    let ep = sim.connect(ConnOpts::default());
    let (src, skey) = sim.reg(0, ep[0].pd, 100, lw());
    let (dst, dkey) = sim.reg(1, ep[1].pd, 100, lw());
    let data = fill(&mut sim, 0, src, 100, 7);
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 9,
                sg_list: vec![Sge {
                    addr: dst,
                    length: 100,
                    lkey: dkey,
                }]
                .into(),
            },
        )
        .unwrap();
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                5,
                SendOp::Send,
                vec![Sge {
                    addr: src,
                    length: 100,
                    lkey: skey,
                }],
            ),
        )
        .unwrap();
    sim.settle(1000);
    let c0 = sim.poll_all(0, ep[0].cq);
    let c1 = sim.poll_all(1, ep[1].cq);
    assert_eq!(c0.len(), 1);
    assert_eq!(
        (c0[0].wr_id, c0[0].status, c0[0].opcode),
        (5, WcStatus::Success, WcOpcode::Send)
    );
    assert_eq!(c1.len(), 1);
    assert_eq!(
        (c1[0].wr_id, c1[0].status, c1[0].byte_len),
        (9, WcStatus::Success, 100)
    );
    assert_eq!(sim.nodes[1].mem.slice(dst, 100), &data[..]);
    // One SEND_ONLY and one ACK crossed the link.
    assert_eq!(sim.stats[0].sent, 1);
    assert_eq!(sim.stats[1].sent, 1);
}

#[test]
fn rc_multi_packet_send_write_read() {
    let mut sim = Sim::new(2);
    let ep = sim.connect(ConnOpts::default());
    let len = 10_000;
    let (src, skey) = sim.reg(0, ep[0].pd, len, lw());
    let (dst, dkey) = sim.reg(1, ep[1].pd, len, lw().union(Access::REMOTE));
    let data = fill(&mut sim, 0, src, len, 1);
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 1,
                sg_list: vec![Sge {
                    addr: dst,
                    length: len as u32,
                    lkey: dkey,
                }]
                .into(),
            },
        )
        .unwrap();
    let sge = vec![Sge {
        addr: src,
        length: len as u32,
        lkey: skey,
    }];
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge.clone()))
        .unwrap();
    sim.settle(10_000);
    assert_eq!(sim.nodes[1].mem.slice(dst, len), &data[..]);
    // 10 packets at MTU 1024.
    assert_eq!(sim.stats[0].sent, 10);
    // WRITE the reverse pattern, READ it back into a fresh buffer.
    let data2 = fill(&mut sim, 0, src, len, 99);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: dst,
                    rkey: dkey,
                },
                sge,
            ),
        )
        .unwrap();
    let (back, bkey) = sim.reg(0, ep[0].pd, len, lw());
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                3,
                SendOp::Read {
                    remote_addr: dst,
                    rkey: dkey,
                },
                vec![Sge {
                    addr: back,
                    length: len as u32,
                    lkey: bkey,
                }],
            ),
        )
        .unwrap();
    sim.settle(10_000);
    assert_eq!(sim.nodes[1].mem.slice(dst, len), &data2[..]);
    assert_eq!(sim.nodes[0].mem.slice(back, len), &data2[..]);
    let c: Vec<_> = sim
        .poll_all(0, ep[0].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        c,
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
}
