//! Segments: RC packets of several path MTUs between two devices that reach each other in
//! memory (`Device::poll_transmit_segments`, `Device::handle_packet_in_memory`). Each
//! segment takes the PSNs of the packets it stands for, so ACKs, NAKs and retransmission
//! keep their meaning; from a wire, a packet over the path MTU stays an invalid request.

use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::{packet::Packet, Opcode};

/// The shared PRNG fill ([`prng_pattern`]), no period a segment could hide in.
fn fill(sim: &mut Sim, node: usize, addr: u64, len: usize, seed: u8) -> Vec<u8> {
    let data = prng_pattern(seed.into(), len);
    sim.nodes[node]
        .mem
        .slice_mut(addr, len)
        .copy_from_slice(&data);
    data
}

fn sge(addr: u64, len: usize, lkey: u32) -> Vec<Sge> {
    vec![Sge {
        addr,
        length: len as u32,
        lkey,
    }]
}

/// (opcode, PSN, payload bytes) of every packet node `from` sent.
fn packets(sim: &Sim, from: usize) -> Vec<(Opcode, u32, usize)> {
    sim.trace
        .as_ref()
        .expect("tracing")
        .iter()
        .filter(|t| t.from == from)
        .map(|t| {
            let p = Packet::new_checked(&t.bytes[..]).expect("a packet the engine built");
            (p.opcode(), p.bth().psn(), p.payload().len())
        })
        .collect()
}

#[test]
fn send_write_read_go_in_segments_with_the_psns_of_their_packets() {
    let mut sim = Sim::new(11);
    // Four path MTUs of 1024 bytes per segment.
    sim.segment_buf = 4 * 1024 + rxe_core::device::SEGMENT_HEADROOM;
    sim.trace = Some(Vec::new());
    let ep = sim.connect(ConnOpts::default());
    let len = 10_000;
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (src, skey) = sim.reg(0, ep[0].pd, len, Access::LOCAL_WRITE);
    let (dst, dkey) = sim.reg(1, ep[1].pd, len, all);
    let (back, bkey) = sim.reg(0, ep[0].pd, len, Access::LOCAL_WRITE);
    let sent = fill(&mut sim, 0, src, len, 3);
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 7,
                sg_list: sge(dst, len, dkey).into(),
            },
        )
        .unwrap();
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge(src, len, skey)))
        .unwrap();
    sim.settle(10_000);
    assert_eq!(sim.nodes[1].mem.slice(dst, len), &sent[..]);
    let written = fill(&mut sim, 0, src, len, 77);
    let write = SendOp::Write {
        remote_addr: dst,
        rkey: dkey,
    };
    let read = SendOp::Read {
        remote_addr: dst,
        rkey: dkey,
    };
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(2, write, sge(src, len, skey)))
        .unwrap();
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(3, read, sge(back, len, bkey)))
        .unwrap();
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(4, SendOp::Send, vec![]))
        .unwrap();
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 8,
                sg_list: vec![].into(),
            },
        )
        .unwrap();
    sim.settle(10_000);
    assert_eq!(sim.nodes[1].mem.slice(dst, len), &written[..]);
    assert_eq!(sim.nodes[0].mem.slice(back, len), &written[..]);
    let c: Vec<_> = sim
        .poll_all(0, ep[0].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        c,
        [1, 2, 3, 4].map(|i| (i, WcStatus::Success)).to_vec(),
        "send completions"
    );
    let r: Vec<_> = sim
        .poll_all(1, ep[1].cq)
        .iter()
        .map(|c| (c.wr_id, c.status, c.byte_len))
        .collect();
    assert_eq!(
        r,
        vec![(7, WcStatus::Success, 10_000), (8, WcStatus::Success, 0)]
    );
    // 10 000 bytes are 10 packets of 1024 and 3 segments of at most 4096; each segment
    // starts at the PSN of the first packet it stands for.
    use Opcode as O;
    assert_eq!(
        packets(&sim, 0),
        vec![
            (O::RC_SEND_FIRST, 0x100, 4096),
            (O::RC_SEND_MIDDLE, 0x104, 4096),
            (O::RC_SEND_LAST, 0x108, 1808),
            (O::RC_RDMA_WRITE_FIRST, 0x10a, 4096),
            (O::RC_RDMA_WRITE_MIDDLE, 0x10e, 4096),
            (O::RC_RDMA_WRITE_LAST, 0x112, 1808),
            (O::RC_RDMA_READ_REQUEST, 0x114, 0),
            (O::RC_SEND_ONLY, 0x11e, 0),
        ]
    );
    assert_eq!(
        packets(&sim, 1),
        vec![
            // The SEND's ACK names the last PSN of its last segment.
            (O::RC_ACKNOWLEDGE, 0x109, 0),
            (O::RC_ACKNOWLEDGE, 0x113, 0),
            (O::RC_RDMA_READ_RESPONSE_FIRST, 0x114, 4096),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, 0x118, 4096),
            (O::RC_RDMA_READ_RESPONSE_LAST, 0x11c, 1808),
            (O::RC_ACKNOWLEDGE, 0x11e, 0),
        ]
    );
}

#[test]
fn lost_segments_are_sent_again_from_the_psn_asked_for() {
    let cfg = rxe_core::DeviceConfig {
        infinite_retry_cnt: true,
        ..Default::default()
    };
    let mut sim = Sim::with_config(12, cfg);
    sim.segment_buf = 3 * 1024 + rxe_core::device::SEGMENT_HEADROOM;
    // One packet in ten lost each way.
    sim.link[0].loss_ppm = 100_000;
    sim.link[1].loss_ppm = 100_000;
    let ep = sim.connect(ConnOpts {
        timeout: 8,
        ..Default::default()
    });
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let mut expect = Vec::new();
    for i in 0..24usize {
        let len = 1 + (i * 7919) % 20_000;
        let (src, skey) = sim.reg(0, ep[0].pd, len, Access::LOCAL_WRITE);
        let (dst, dkey) = sim.reg(1, ep[1].pd, len, all);
        let data = fill(&mut sim, 0, src, len, i as u8);
        let op = if i % 3 == 2 {
            // READ it back from where the last WRITE put it.
            let (rsrc, rkey) = sim.reg(1, ep[1].pd, len, all);
            let r = fill(&mut sim, 1, rsrc, len, !(i as u8));
            expect.push((0, src, r));
            SendOp::Read {
                remote_addr: rsrc,
                rkey,
            }
        } else {
            expect.push((1, dst, data));
            SendOp::Write {
                remote_addr: dst,
                rkey: dkey,
            }
        };
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(i as u64, op, sge(src, len, skey)))
            .unwrap();
    }
    sim.settle(1_000_000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(c.len(), 24, "every WR completed");
    for (i, c) in c.iter().enumerate() {
        assert_eq!((c.wr_id, c.status), (i as u64, WcStatus::Success));
    }
    for (k, (n, a, data)) in expect.iter().enumerate() {
        assert!(
            sim.nodes[*n].mem.slice(*a, data.len()) == &data[..],
            "memory of WR {k} on node {n}"
        );
    }
    assert!(sim.stats[0].lost > 0 && sim.stats[1].lost > 0);
    assert!(sim.dev(0).qp(ep[0].qpn).unwrap().counters.retransmits > 0);
}

#[test]
fn a_segment_from_a_wire_is_an_invalid_request() {
    let mut sim = Sim::new(13);
    let ep = sim.connect(ConnOpts::default());
    let len = 8192;
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (src, skey) = sim.reg(0, ep[0].pd, len, Access::LOCAL_WRITE);
    let (dst, dkey) = sim.reg(1, ep[1].pd, len, all);
    let write = SendOp::Write {
        remote_addr: dst,
        rkey: dkey,
    };
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, write, sge(src, len, skey)))
        .unwrap();
    // Node 0 builds a segment of the whole WRITE; node 1 gets it as if from its socket.
    let mut buf = vec![0u8; len + rxe_core::device::SEGMENT_HEADROOM];
    let n = &mut sim.nodes[0];
    let t = n
        .dev
        .poll_transmit_segments(sim.now, &mut n.mem, &mut buf, &|_| true)
        .expect("a packet");
    let p = Packet::new_checked(&buf[..t.len]).unwrap();
    assert_eq!(
        (p.opcode(), p.payload().len()),
        (Opcode::RC_RDMA_WRITE_ONLY, len)
    );
    assert!(sim.inject(1, &buf[..t.len]).is_err());
    sim.settle(10_000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(
        c.iter().map(|c| c.status).collect::<Vec<_>>(),
        vec![WcStatus::RemInvReqErr]
    );
}

/// A message of many windows: 1 MiB at MTU 1024 is 1024 PSNs, eight times the 128 a requester
/// keeps unacknowledged. Its segments ask for ACKs as its packets would, so it flows without
/// waiting for a timeout.
#[test]
fn a_message_larger_than_the_window_flows_in_segments() {
    let mut sim = Sim::new(14);
    sim.segment_buf = 16 * 1024 + rxe_core::device::SEGMENT_HEADROOM;
    let ep = sim.connect(ConnOpts::default());
    let len = 1 << 20;
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (src, skey) = sim.reg(0, ep[0].pd, len, Access::LOCAL_WRITE);
    let (dst, dkey) = sim.reg(1, ep[1].pd, len, all);
    let data = fill(&mut sim, 0, src, len, 5);
    let write = SendOp::Write {
        remote_addr: dst,
        rkey: dkey,
    };
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, write, sge(src, len, skey)))
        .unwrap();
    sim.settle(100_000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].status, WcStatus::Success);
    assert!(sim.nodes[1].mem.slice(dst, len) == &data[..]);
    let q = sim.dev(0).qp(ep[0].qpn).unwrap().counters;
    assert_eq!((q.timeouts, q.retransmits), (0, 0), "{q:?}");
    // 64 segments of 16 KiB.
    assert_eq!(sim.stats[0].sent, 64);
    assert_eq!(sim.dev(0).port_counters().tx_segments, 64);
}
