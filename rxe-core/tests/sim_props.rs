//! Property tests: random work over a faulty link, checked for exactly-once, in-order,
//! byte-identical delivery and exactly one completion per work request.

use proptest::prelude::*;
use rxe_core::sim::*;
use rxe_core::verbs::*;

#[derive(Clone, Debug)]
enum Op {
    Send(usize),
    SendImm(usize, u32),
    Write(usize),
    WriteImm(usize, u32),
    Read(usize),
    FetchAdd(u64),
    CmpSwap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..5000).prop_map(Op::Send),
        1 => (0usize..3000, any::<u32>()).prop_map(|(l, i)| Op::SendImm(l, i)),
        3 => (1usize..6000).prop_map(Op::Write),
        1 => (0usize..2000, any::<u32>()).prop_map(|(l, i)| Op::WriteImm(l, i)),
        3 => (1usize..6000).prop_map(Op::Read),
        1 => (1u64..1000).prop_map(Op::FetchAdd),
        1 => Just(Op::CmpSwap),
    ]
}

fn link() -> impl Strategy<Value = LinkConfig> {
    (0u32..80_000, 0u32..50_000, 0u32..80_000, 0u64..50_000).prop_map(
        |(loss, dup, reorder, delay)| LinkConfig {
            loss_ppm: loss,
            dup_ppm: dup,
            reorder_ppm: reorder,
            reorder_delay_ns: 30_000,
            delay_ns: delay,
            ..Default::default()
        },
    )
}

fn mtu() -> impl Strategy<Value = Mtu> {
    prop_oneof![Just(Mtu::M256), Just(Mtu::M1024), Just(Mtu::M4096)]
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = rxe_core::sim::Rng::new(seed);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48), .. ProptestConfig::default() })]

    #[test]
    fn rc_exactly_once_in_order(
        ops in prop::collection::vec(op(), 1..40),
        l0 in link(), l1 in link(),
        mtu in mtu(),
        psn0 in prop_oneof![Just(0xff_fff0u32), 0u32..0x100_0000],
        psn1 in 0u32..0x100_0000,
        seed in any::<u64>(),
    ) {
        let cfg = rxe_core::DeviceConfig { port_mtu: Mtu::M4096, infinite_retry_cnt: true, ..Default::default() };
        let mut sim = Sim::with_config(seed, cfg);
        sim.link = [l0, l1];
        let ep = sim.connect(ConnOpts { mtu, sq_psn: [psn0, psn1], timeout: 10, retry_cnt: 7, rnr_retry: 7, ..Default::default() });
        let all = Access::LOCAL_WRITE.union(Access::REMOTE);
        // Requester-side buffers, one per op; responder-side: a receive area per SEND, a write
        // target per WRITE, a read source per READ, one atomic word.
        let (atom, akey) = sim.reg(1, ep[1].pd, 16, all);
        let mut expect_recv = Vec::new();
        let mut expect_mem = Vec::new();
        let mut expect_read = Vec::new();
        let mut fa_total = 0u64;
        let mut swaps = 0u64;
        let mut n_atomic_results = Vec::new();
        for (i, o) in ops.iter().enumerate() {
            let wr_id = i as u64;
            let (len, imm) = match o {
                Op::Send(l) | Op::Write(l) | Op::Read(l) => (*l, None),
                Op::SendImm(l, m) | Op::WriteImm(l, m) => (*l, Some(*m)),
                Op::FetchAdd(_) | Op::CmpSwap => (8, None),
            };
            let data = pattern(len, seed ^ (i as u64) << 8);
            let (src, skey) = sim.reg(0, ep[0].pd, len.max(8), Access::LOCAL_WRITE);
            sim.nodes[0].mem.slice_mut(src, len).copy_from_slice(&data);
            let sge = vec![Sge { addr: src, length: len as u32, lkey: skey }];
            let sop = match o {
                Op::Send(_) | Op::SendImm(..) => {
                    let (dst, dkey) = sim.reg(1, ep[1].pd, len.max(1), Access::LOCAL_WRITE);
                    sim.dev(1).post_recv(ep[1].qpn, RecvWr { wr_id, sg_list: vec![Sge { addr: dst, length: len as u32, lkey: dkey }] }).unwrap();
                    expect_recv.push((wr_id, dst, data.clone(), imm, WcOpcode::Recv));
                    match imm { Some(m) => SendOp::SendWithImm(m), None => SendOp::Send }
                }
                Op::Write(_) | Op::WriteImm(..) => {
                    let (dst, dkey) = sim.reg(1, ep[1].pd, len.max(1), all);
                    expect_mem.push((dst, data.clone()));
                    match imm {
                        Some(m) => {
                            sim.dev(1).post_recv(ep[1].qpn, RecvWr { wr_id, sg_list: vec![] }).unwrap();
                            expect_recv.push((wr_id, dst, data.clone(), Some(m), WcOpcode::RecvRdmaWithImm));
                            SendOp::WriteWithImm { remote_addr: dst, rkey: dkey, imm: m }
                        }
                        None => SendOp::Write { remote_addr: dst, rkey: dkey },
                    }
                }
                Op::Read(_) => {
                    let (rsrc, rkey) = sim.reg(1, ep[1].pd, len, all);
                    let rdata = pattern(len, !seed ^ i as u64);
                    sim.nodes[1].mem.slice_mut(rsrc, len).copy_from_slice(&rdata);
                    expect_read.push((src, rdata));
                    SendOp::Read { remote_addr: rsrc, rkey }
                }
                Op::FetchAdd(a) => {
                    n_atomic_results.push((src, fa_total));
                    fa_total += a;
                    SendOp::FetchAdd { remote_addr: atom, rkey: akey, add: *a }
                }
                Op::CmpSwap => {
                    n_atomic_results.push((src, swaps));
                    swaps += 1;
                    SendOp::CompSwap { remote_addr: atom + 8, rkey: akey, compare: swaps - 1, swap: swaps }
                }
            };
            let mut wr = SendWr::new(wr_id, sop, sge);
            if i % 3 == 0 { wr.flags |= SEND_FENCE; }
            sim.dev(0).post_send(ep[0].qpn, wr).unwrap();
        }
        sim.settle(2_000_000);
        // Every WR completed exactly once, in order, successfully.
        let c0 = sim.poll_all(0, ep[0].cq);
        let ids: Vec<u64> = c0.iter().map(|c| c.wr_id).collect();
        prop_assert_eq!(ids, (0..ops.len() as u64).collect::<Vec<_>>());
        for c in &c0 { prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c); }
        // Receives: in order, byte-identical, with immediates.
        let c1 = sim.poll_all(1, ep[1].cq);
        prop_assert_eq!(c1.len(), expect_recv.len());
        for (c, (wr_id, dst, data, imm, opc)) in c1.iter().zip(&expect_recv) {
            prop_assert_eq!(c.wr_id, *wr_id);
            prop_assert_eq!(c.status, WcStatus::Success);
            prop_assert_eq!(c.opcode, *opc);
            prop_assert_eq!(c.byte_len as usize, data.len());
            if let Some(m) = imm { prop_assert_eq!(c.imm_or_inv, *m); prop_assert!(c.wc_flags & WC_WITH_IMM != 0); }
            prop_assert!(sim.nodes[1].mem.slice(*dst, data.len()) == &data[..]);
        }
        for (dst, data) in &expect_mem { prop_assert!(sim.nodes[1].mem.slice(*dst, data.len()) == &data[..]); }
        for (src, data) in &expect_read { prop_assert!(sim.nodes[0].mem.slice(*src, data.len()) == &data[..]); }
        // Atomics applied exactly once, each returning the value before it.
        let word = |a: u64| u64::from_le_bytes(sim.nodes[1].mem.slice(a, 8).try_into().unwrap());
        prop_assert_eq!(word(atom), fa_total);
        prop_assert_eq!(word(atom + 8), swaps);
        let mut fa_seen = 0;
        let mut cs_seen = 0;
        for (i, o) in ops.iter().enumerate() {
            let _ = i;
            match o {
                Op::FetchAdd(_) => { let (src, v) = n_atomic_results[fa_seen + cs_seen]; prop_assert_eq!(u64::from_le_bytes(sim.nodes[0].mem.slice(src, 8).try_into().unwrap()), v); fa_seen += 1; }
                Op::CmpSwap => { let (src, v) = n_atomic_results[fa_seen + cs_seen]; prop_assert_eq!(u64::from_le_bytes(sim.nodes[0].mem.slice(src, 8).try_into().unwrap()), v); cs_seen += 1; }
                _ => {}
            }
        }
    }

    #[test]
    fn uc_drops_whole_messages_only(
        lens in prop::collection::vec(0usize..5000, 1..40),
        loss in 0u32..150_000,
        seed in any::<u64>(),
    ) {
        let mut sim = Sim::new(seed);
        sim.link[0].loss_ppm = loss;
        let ep = sim.connect(ConnOpts { qp_type: QpType::Uc, mtu: Mtu::M1024, ..Default::default() });
        let mut sent = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let data = pattern(len, seed ^ i as u64);
            let (src, skey) = sim.reg(0, ep[0].pd, len.max(1), Access::LOCAL_WRITE);
            sim.nodes[0].mem.slice_mut(src, len).copy_from_slice(&data);
            let (dst, dkey) = sim.reg(1, ep[1].pd, 5000, Access::LOCAL_WRITE);
            sim.dev(1).post_recv(ep[1].qpn, RecvWr { wr_id: i as u64, sg_list: vec![Sge { addr: dst, length: 5000, lkey: dkey }] }).unwrap();
            sent.push((dst, data));
            sim.dev(0).post_send(ep[0].qpn, SendWr::new(i as u64, SendOp::Send, vec![Sge { addr: src, length: len as u32, lkey: skey }])).unwrap();
        }
        sim.settle(1_000_000);
        // The sender completes everything (UC has no ACKs).
        prop_assert_eq!(sim.poll_all(0, ep[0].cq).len(), lens.len());
        // Every delivered message is whole and byte-identical; a dropped message leaves its
        // receive WQE for the next one, so received data is checked by content.
        let got = sim.poll_all(1, ep[1].cq);
        prop_assert!(got.len() <= lens.len());
        let mut next = 0;
        for (k, c) in got.iter().enumerate() {
            prop_assert_eq!(c.status, WcStatus::Success);
            prop_assert_eq!(c.wr_id, k as u64, "receive WQEs are consumed in order");
            let buf = sim.nodes[1].mem.slice(sent[k].0, c.byte_len as usize).to_vec();
            // It must be one of the messages, in send order.
            let pos = sent[next..].iter().position(|(_, d)| *d == buf);
            prop_assert!(pos.is_some(), "delivered message {} is not a whole sent message", k);
            next += pos.unwrap() + 1;
        }
        if loss == 0 { prop_assert_eq!(got.len(), lens.len()); }
    }

    #[test]
    fn ud_never_delivers_corrupt_or_truncated(
        lens in prop::collection::vec(0usize..1024, 1..40),
        l0 in link(),
        seed in any::<u64>(),
    ) {
        let mut sim = Sim::new(seed);
        sim.link[0] = l0;
        let mut ep = Vec::new();
        for n in 0..2 {
            let d = sim.dev(n);
            let pd = d.alloc_pd().unwrap();
            let cq = d.create_cq(256).unwrap();
            let qpn = d.create_qp(rxe_core::QpInit { qp_type: QpType::Ud, pd, send_cq: cq, recv_cq: cq, srq: None,
                cap: QpCap { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 0 }, sq_sig_all: true }).unwrap();
            let mut a = QpAttr { qp_state: QpState::Init, qkey: 0x1234, ..Default::default() };
            d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY)).unwrap();
            a.qp_state = QpState::Rtr;
            d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE)).unwrap();
            a.qp_state = QpState::Rts;
            d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE | AttrMask::SQ_PSN)).unwrap();
            ep.push((pd, cq, qpn));
        }
        let dgid = sim.nodes[1].gid;
        let mut sent = Vec::new();
        let mut dsts = Vec::new();
        for (i, &len) in lens.iter().enumerate() {
            let data = pattern(len, seed ^ i as u64);
            let (src, skey) = sim.reg(0, ep[0].0, len.max(1), Access::LOCAL_WRITE);
            sim.nodes[0].mem.slice_mut(src, len).copy_from_slice(&data);
            // Half the receive buffers are too small for their datagram.
            let room = if i % 2 == 0 { 40 + 1024 } else { 40 + len / 2 };
            let (dst, dkey) = sim.reg(1, ep[1].0, room, Access::LOCAL_WRITE);
            dsts.push(dst);
            sim.dev(1).post_recv(ep[1].2, RecvWr { wr_id: i as u64, sg_list: vec![Sge { addr: dst, length: room as u32, lkey: dkey }] }).unwrap();
            sent.push(data);
            let mut wr = SendWr::new(i as u64, SendOp::Send, vec![Sge { addr: src, length: len as u32, lkey: skey }]);
            wr.ud = Some(UdDest { av: Av { dgid, sgid_index: 0, hop_limit: 64, ..Default::default() }, remote_qpn: ep[1].2, remote_qkey: 0x1234 });
            sim.dev(0).post_send(ep[0].2, wr).unwrap();
        }
        sim.settle(100_000);
        prop_assert_eq!(sim.poll_all(0, ep[0].1).len(), lens.len());
        for c in sim.poll_all(1, ep[1].1) {
            if c.status != WcStatus::Success {
                prop_assert_eq!(c.status, WcStatus::LocLenErr);
                continue;
            }
            prop_assert!(c.wc_flags & WC_GRH != 0);
            prop_assert_eq!(c.src_qp, ep[0].2);
            let room_ok = c.wr_id % 2 == 0;
            prop_assert!(room_ok || c.byte_len as usize <= 40 + lens[c.wr_id as usize] / 2);
            // The payload after the GRH is one of the datagrams, whole.
            let n = c.byte_len as usize - 40;
            let got = sim.nodes[1].mem.slice(dsts[c.wr_id as usize] + 40, n).to_vec();
            prop_assert!(sent.contains(&got), "payload of {} bytes matches no datagram", n);
            // The GRH area holds 20 zero bytes and the IPv4 header.
            let g = sim.nodes[1].mem.slice(dsts[c.wr_id as usize], 40).to_vec();
            prop_assert!(g[..20].iter().all(|&b| b == 0));
            prop_assert_eq!(g[20], 0x45);
            prop_assert_eq!(&g[32..36], &[10, 0, 0, 1]);
            prop_assert_eq!(c.network_hdr_type, 2);
        }
    }
}
