//! Property tests: random work in both directions over a faulty link (loss, duplication,
//! reordering, delay, bit flips), checked against oracles computed outside the engine.
//!
//! - RC: every work request completes exactly once, in order, successfully; every receive,
//!   WRITE target and READ sink holds exactly the bytes sent; every atomic returns the value the
//!   arithmetic predicts, including compare-and-swaps whose compare misses.
//! - UC: the receiver delivers exactly the messages all of whose packets the link delivered
//!   (read from the simulator's record of arrivals, by PSN), whole, in order, one receive WQE
//!   each; on a clean link that is every message.
//! - UD: every datagram that arrived lands in the next receive WQE, whole, or completes that
//!   WQE with `LocLenErr` exactly when it does not fit.
//!
//! Every link that corrupts must have had its corrupted packets dropped by the ICRC check.
//! 256 cases per property; `PROPTEST_CASES` overrides (e.g. 20000 for a long run).

use std::collections::HashSet;

use proptest::prelude::*;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::Packet;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

#[derive(Clone, Debug)]
enum Op {
    Send(usize),
    SendImm(usize, u32),
    Write(usize),
    WriteImm(usize, u32),
    Read(usize),
    FetchAdd(u64),
    /// `hit`: the compare equals the current value (and `swap` is stored); otherwise it differs.
    CmpSwap {
        hit: bool,
        swap: u64,
    },
}

/// One work request: which node posts it, what, and whether it carries the fence flag.
#[derive(Clone, Debug)]
struct Wr {
    from: usize,
    op: Op,
    fence: bool,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..5000).prop_map(Op::Send),
        1 => (0usize..3000, any::<u32>()).prop_map(|(l, i)| Op::SendImm(l, i)),
        3 => (1usize..6000).prop_map(Op::Write),
        1 => (0usize..2000, any::<u32>()).prop_map(|(l, i)| Op::WriteImm(l, i)),
        3 => (1usize..6000).prop_map(Op::Read),
        1 => (1u64..1000).prop_map(Op::FetchAdd),
        2 => (any::<bool>(), any::<u64>()).prop_map(|(hit, swap)| Op::CmpSwap { hit, swap }),
    ]
}

fn wr() -> impl Strategy<Value = Wr> {
    (0usize..2, op(), prop::bool::weighted(0.3)).prop_map(|(from, op, fence)| Wr {
        from,
        op,
        fence,
    })
}

/// A link with every fault; each fault is off in about a quarter of the cases.
fn link() -> impl Strategy<Value = LinkConfig> {
    let p = |max: u32| prop_oneof![1 => Just(0u32), 3 => 0..max];
    (p(80_000), p(50_000), p(80_000), 0u64..50_000, p(40_000)).prop_map(
        |(loss, dup, reorder, delay, corrupt)| LinkConfig {
            loss_ppm: loss,
            dup_ppm: dup,
            reorder_ppm: reorder,
            reorder_delay_ns: 30_000,
            delay_ns: delay,
            corrupt_ppm: corrupt,
            ..Default::default()
        },
    )
}

fn mtu() -> impl Strategy<Value = Mtu> {
    prop_oneof![Just(Mtu::M256), Just(Mtu::M1024), Just(Mtu::M4096)]
}

fn psn() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0xff_fff0u32), 0u32..0x100_0000]
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut r = rxe_core::sim::Rng::new(seed);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

fn is_recv(c: &Cqe) -> bool {
    matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

/// Splits a node's completions into (send side, receive side).
fn split(c: Vec<Cqe>) -> (Vec<Cqe>, Vec<Cqe>) {
    c.into_iter().partition(|c| !is_recv(c))
}

fn word(sim: &Sim, node: usize, a: u64) -> u64 {
    u64::from_le_bytes(sim.nodes[node].mem.slice(a, 8).try_into().unwrap())
}

/// Every packet the link corrupted was caught by the ICRC check, none reached a device.
fn corrupted_were_dropped(sim: &Sim) -> Result<(), TestCaseError> {
    for s in &sim.stats {
        prop_assert_eq!(s.icrc_dropped, s.corrupted, "{:?}", s);
    }
    Ok(())
}

/// PSNs (of requests from node `from`) that reached the other node.
fn arrived_psns(sim: &Sim, from: usize) -> HashSet<u32> {
    sim.arrivals
        .as_ref()
        .expect("arrivals recorded")
        .iter()
        .filter(|a| a.to == 1 - from)
        .map(|a| {
            Packet::new_checked(&a.bytes[..])
                .expect("parses")
                .bth()
                .psn()
        })
        .collect()
}

/// A receive that must complete: its wr_id, buffer, the bytes it must hold, the immediate and
/// the completion's opcode.
struct Recv {
    wr_id: u64,
    buf: u64,
    data: Vec<u8>,
    imm: Option<u32>,
    opcode: WcOpcode,
}

struct Expect {
    /// Per node: the wr_ids of its sends, in posting order.
    sends: [Vec<u64>; 2],
    /// Per node: the receives it must complete, in order.
    recvs: [Vec<Recv>; 2],
    /// (node, address, bytes) that must be in memory at the end.
    mem: Vec<(usize, u64, Vec<u8>)>,
}

/// A UC message: its bytes, the PSNs of its packets, and the receive WQE posted beside it on
/// the other node (buffer, wr_id).
struct UcMsg {
    data: Vec<u8>,
    psns: Vec<u32>,
    buf: u64,
    recv_id: u64,
}

/// One run of [`rc_exactly_once_in_order`]: `wrs` over links `links`, in segments of
/// `segment_buf` bytes (0: packets of one path MTU, as on a wire).
fn rc_run(
    wrs: &[Wr],
    links: [LinkConfig; 2],
    mtu: Mtu,
    psns: [u32; 2],
    seed: u64,
    segment_buf: usize,
) -> Result<(), TestCaseError> {
    let cfg = rxe_core::DeviceConfig {
        port_mtu: Mtu::M4096,
        infinite_retry_cnt: true,
        ..Default::default()
    };
    let mut sim = Sim::with_config(seed, cfg);
    sim.link = links;
    sim.segment_buf = segment_buf;
    let ep = sim.connect(ConnOpts {
        mtu,
        sq_psn: psns,
        timeout: 10,
        retry_cnt: 7,
        rnr_retry: 7,
        ..Default::default()
    });
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    // Per direction, one atomic area on the responder: a fetch-add word and a swap word.
    let mut atom = [(0u64, 0u32); 2];
    for (f, a) in atom.iter_mut().enumerate() {
        *a = sim.reg(1 - f, ep[1 - f].pd, 16, all);
    }
    let mut fa_total = [0u64; 2];
    let mut cs_cur = [0u64; 2];
    let mut ex = Expect {
        sends: [vec![], vec![]],
        recvs: [vec![], vec![]],
        mem: vec![],
    };
    for (i, w) in wrs.iter().enumerate() {
        let (f, t) = (w.from, 1 - w.from);
        let wr_id = i as u64;
        let (len, imm) = match w.op {
            Op::Send(l) | Op::Write(l) | Op::Read(l) => (l, None),
            Op::SendImm(l, m) | Op::WriteImm(l, m) => (l, Some(m)),
            Op::FetchAdd(_) | Op::CmpSwap { .. } => (8, None),
        };
        let data = pattern(len, seed ^ (i as u64) << 8);
        let (src, skey) = sim.reg(f, ep[f].pd, len.max(8), Access::LOCAL_WRITE);
        sim.nodes[f].mem.slice_mut(src, len).copy_from_slice(&data);
        let sge = vec![Sge {
            addr: src,
            length: len as u32,
            lkey: skey,
        }];
        let sop = match w.op {
            Op::Send(_) | Op::SendImm(..) => {
                let (dst, dkey) = sim.reg(t, ep[t].pd, len.max(1), Access::LOCAL_WRITE);
                sim.dev(t)
                    .post_recv(
                        ep[t].qpn,
                        RecvWr {
                            wr_id,
                            sg_list: vec![Sge {
                                addr: dst,
                                length: len as u32,
                                lkey: dkey,
                            }]
                            .into(),
                        },
                    )
                    .unwrap();
                ex.recvs[t].push(Recv {
                    wr_id,
                    buf: dst,
                    data: data.clone(),
                    imm,
                    opcode: WcOpcode::Recv,
                });
                match imm {
                    Some(m) => SendOp::SendWithImm(m),
                    None => SendOp::Send,
                }
            }
            Op::Write(_) | Op::WriteImm(..) => {
                let (dst, dkey) = sim.reg(t, ep[t].pd, len.max(1), all);
                ex.mem.push((t, dst, data.clone()));
                match imm {
                    Some(m) => {
                        sim.dev(t)
                            .post_recv(
                                ep[t].qpn,
                                RecvWr {
                                    wr_id,
                                    sg_list: vec![].into(),
                                },
                            )
                            .unwrap();
                        ex.recvs[t].push(Recv {
                            wr_id,
                            buf: dst,
                            data: data.clone(),
                            imm: Some(m),
                            opcode: WcOpcode::RecvRdmaWithImm,
                        });
                        SendOp::WriteWithImm {
                            remote_addr: dst,
                            rkey: dkey,
                            imm: m,
                        }
                    }
                    None => SendOp::Write {
                        remote_addr: dst,
                        rkey: dkey,
                    },
                }
            }
            Op::Read(_) => {
                let (rsrc, rkey) = sim.reg(t, ep[t].pd, len, all);
                let rdata = pattern(len, !seed ^ i as u64);
                sim.nodes[t]
                    .mem
                    .slice_mut(rsrc, len)
                    .copy_from_slice(&rdata);
                ex.mem.push((f, src, rdata));
                SendOp::Read {
                    remote_addr: rsrc,
                    rkey,
                }
            }
            Op::FetchAdd(a) => {
                ex.mem.push((f, src, fa_total[f].to_le_bytes().to_vec()));
                fa_total[f] += a;
                SendOp::FetchAdd {
                    remote_addr: atom[f].0,
                    rkey: atom[f].1,
                    add: a,
                }
            }
            Op::CmpSwap { hit, swap } => {
                // Every compare-and-swap returns the value before it; only a hit stores.
                ex.mem.push((f, src, cs_cur[f].to_le_bytes().to_vec()));
                let compare = if hit { cs_cur[f] } else { !cs_cur[f] };
                if hit {
                    cs_cur[f] = swap;
                }
                SendOp::CompSwap {
                    remote_addr: atom[f].0 + 8,
                    rkey: atom[f].1,
                    compare,
                    swap,
                }
            }
        };
        let mut wr = SendWr::new(wr_id, sop, sge);
        if w.fence {
            wr.flags |= SEND_FENCE;
        }
        sim.dev(f).post_send(ep[f].qpn, wr).unwrap();
        ex.sends[f].push(wr_id);
    }
    sim.settle(2_000_000);
    for (n, e) in ep.iter().enumerate() {
        // Every WR completed exactly once, in order, successfully.
        let (sends, recvs) = split(sim.poll_all(n, e.cq));
        let ids: Vec<u64> = sends.iter().map(|c| c.wr_id).collect();
        prop_assert_eq!(&ids, &ex.sends[n], "node {} send completions", n);
        for c in &sends {
            prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c);
        }
        // Receives: in order, byte-identical, with immediates.
        prop_assert_eq!(
            recvs.len(),
            ex.recvs[n].len(),
            "node {} receive completions",
            n
        );
        for (
            c,
            Recv {
                wr_id,
                buf: dst,
                data,
                imm,
                opcode: opc,
            },
        ) in recvs.iter().zip(&ex.recvs[n])
        {
            prop_assert_eq!(c.wr_id, *wr_id);
            prop_assert_eq!(c.status, WcStatus::Success);
            prop_assert_eq!(c.opcode, *opc);
            prop_assert_eq!(c.byte_len as usize, data.len());
            if let Some(m) = imm {
                prop_assert_eq!(c.imm_or_inv, *m);
                prop_assert!(c.wc_flags & WC_WITH_IMM != 0);
            }
            prop_assert!(
                sim.nodes[n].mem.slice(*dst, data.len()) == &data[..],
                "receive {} data",
                wr_id
            );
        }
    }
    // WRITE targets, READ sinks and atomic results.
    for (k, (n, a, data)) in ex.mem.iter().enumerate() {
        prop_assert!(
            sim.nodes[*n].mem.slice(*a, data.len()) == &data[..],
            "memory check {} on node {}",
            k,
            n
        );
    }
    // Atomics applied exactly once.
    for f in 0..2 {
        prop_assert_eq!(word(&sim, 1 - f, atom[f].0), fa_total[f]);
        prop_assert_eq!(word(&sim, 1 - f, atom[f].0 + 8), cs_cur[f]);
    }
    corrupted_were_dropped(&sim)?;
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), .. ProptestConfig::default() })]

    #[test]
    fn rc_exactly_once_in_order(
        wrs in prop::collection::vec(wr(), 1..40),
        l0 in link(), l1 in link(),
        mtu in mtu(),
        psn0 in psn(), psn1 in psn(),
        seed in any::<u64>(),
    ) {
        rc_run(&wrs, [l0, l1], mtu, [psn0, psn1], seed, 0)?;
    }

    /// The same between two devices in memory: SENDs, WRITEs and READ responses in segments
    /// of several path MTUs, on a link that loses, duplicates and reorders them.
    #[test]
    fn rc_exactly_once_in_order_in_segments(
        wrs in prop::collection::vec(wr(), 1..40),
        l0 in link(), l1 in link(),
        mtu in mtu(),
        psn0 in psn(), psn1 in psn(),
        seed in any::<u64>(),
        segment_buf in 4160usize..40_000,
    ) {
        rc_run(&wrs, [l0, l1], mtu, [psn0, psn1], seed, segment_buf)?;
    }

    #[test]
    fn uc_delivers_exactly_the_messages_whose_packets_all_arrived(
        msgs in prop::collection::vec((0usize..2, 0usize..5000), 1..40),
        loss in prop_oneof![1 => Just(0u32), 3 => 1u32..150_000],
        corrupt in prop_oneof![1 => Just(0u32), 1 => 1u32..60_000],
        mtu in mtu(),
        psn0 in psn(), psn1 in psn(),
        seed in any::<u64>(),
    ) {
        let cfg = rxe_core::DeviceConfig { port_mtu: Mtu::M4096, ..Default::default() };
        let mut sim = Sim::with_config(seed, cfg);
        for l in &mut sim.link {
            l.loss_ppm = loss;
            l.corrupt_ppm = corrupt;
        }
        sim.arrivals = Some(Vec::new());
        let ep = sim.connect(ConnOpts { qp_type: QpType::Uc, mtu, sq_psn: [psn0, psn1], ..Default::default() });
        let per_pkt = mtu.bytes() as usize;
        let mut next_psn = [psn0, psn1];
        let mut sent: [Vec<UcMsg>; 2] = [vec![], vec![]];
        for (i, &(f, len)) in msgs.iter().enumerate() {
            let t = 1 - f;
            let data = pattern(len, seed ^ (i as u64) << 8);
            let (src, skey) = sim.reg(f, ep[f].pd, len.max(1), Access::LOCAL_WRITE);
            sim.nodes[f].mem.slice_mut(src, len).copy_from_slice(&data);
            let (dst, dkey) = sim.reg(t, ep[t].pd, 5000, Access::LOCAL_WRITE);
            let rid = 1000 + i as u64;
            sim.dev(t).post_recv(ep[t].qpn, RecvWr { wr_id: rid, sg_list: vec![Sge { addr: dst, length: 5000, lkey: dkey }].into() }).unwrap();
            let npkts = len.div_ceil(per_pkt).max(1) as u32;
            let psns = (0..npkts).map(|k| (next_psn[f] + k) & 0xff_ffff).collect();
            next_psn[f] = (next_psn[f] + npkts) & 0xff_ffff;
            sent[f].push(UcMsg { data, psns, buf: dst, recv_id: rid });
            sim.dev(f).post_send(ep[f].qpn, SendWr::new(i as u64, SendOp::Send, vec![Sge { addr: src, length: len as u32, lkey: skey }])).unwrap();
        }
        sim.settle(1_000_000);
        let cqes = [split(sim.poll_all(0, ep[0].cq)), split(sim.poll_all(1, ep[1].cq))];
        for f in 0..2 {
            let t = 1 - f;
            let (sends, recvs) = (&cqes[f].0, &cqes[t].1);
            // The sender completes everything (UC has no ACKs).
            prop_assert_eq!(sends.len(), sent[f].len());
            for c in sends { prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c); }
            // The oracle: the messages whose every packet reached the receiver, in order. A
            // dropped message leaves its receive WQE for the next one.
            let arrived = arrived_psns(&sim, f);
            let whole: Vec<usize> = (0..sent[f].len())
                .filter(|&j| sent[f][j].psns.iter().all(|p| arrived.contains(p)))
                .collect();
            if loss == 0 && sim.stats[f].corrupted == 0 {
                prop_assert_eq!(whole.len(), sent[f].len(), "a clean link delivers every packet");
            }
            let got: Vec<u64> = recvs.iter().map(|c| c.wr_id).collect();
            prop_assert_eq!(recvs.len(), whole.len(), "direction {}: receive completions {:?} for whole messages {:?}", f, got, whole);
            for (k, (c, &j)) in recvs.iter().zip(&whole).enumerate() {
                // WQE k on the receiver was posted beside message k of this direction.
                let UcMsg { buf: dst, recv_id: rid, .. } = &sent[f][k];
                prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c);
                prop_assert_eq!(c.wr_id, *rid, "receive WQEs are consumed in order");
                let want = &sent[f][j].data;
                prop_assert_eq!(c.byte_len as usize, want.len(), "receive {} holds message {}", k, j);
                prop_assert!(sim.nodes[t].mem.slice(*dst, want.len()) == &want[..], "receive {} holds message {} byte for byte", k, j);
            }
        }
        corrupted_were_dropped(&sim)?;
    }

    #[test]
    fn ud_puts_each_arrived_datagram_in_the_next_wqe(
        dgrams in prop::collection::vec((0usize..2, 0usize..1024, any::<bool>()), 1..40),
        l0 in link(), l1 in link(),
        seed in any::<u64>(),
    ) {
        let mut sim = Sim::new(seed);
        sim.link = [l0, l1];
        sim.arrivals = Some(Vec::new());
        let mut ep = Vec::new();
        for n in 0..2 {
            let d = sim.dev(n);
            let pd = d.alloc_pd().unwrap();
            let cq = d.create_cq(256).unwrap();
            let qpn = d.create_qp(rxe_core::QpInit { qp_type: QpType::Ud, pd, send_cq: cq, recv_cq: cq, srq: None, xrcd: None,
                cap: QpCap { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 0 }, sq_sig_all: true }).unwrap();
            let mut a = QpAttr { qp_state: QpState::Init, qkey: 0x1234, ..Default::default() };
            d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY)).unwrap();
            a.qp_state = QpState::Rtr;
            d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE)).unwrap();
            a.qp_state = QpState::Rts;
            d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE | AttrMask::SQ_PSN)).unwrap();
            ep.push((pd, cq, qpn));
        }
        // Per direction: the datagrams in posting order (their PSNs count from 0), and on the
        // receiving node the WQEs in posting order (wr_id, buffer, room). Some buffers are too
        // small for the datagram they were posted beside.
        let mut sent: [Vec<Vec<u8>>; 2] = [vec![], vec![]];
        let mut wqes: [Vec<(u64, u64, usize)>; 2] = [vec![], vec![]];
        for (i, &(f, len, small)) in dgrams.iter().enumerate() {
            let t = 1 - f;
            let data = pattern(len, seed ^ (i as u64) << 8);
            let (src, skey) = sim.reg(f, ep[f].0, len.max(1), Access::LOCAL_WRITE);
            sim.nodes[f].mem.slice_mut(src, len).copy_from_slice(&data);
            let room = if small { 40 + len / 2 } else { 40 + 1024 };
            let (dst, dkey) = sim.reg(t, ep[t].0, room, Access::LOCAL_WRITE);
            sim.dev(t).post_recv(ep[t].2, RecvWr { wr_id: i as u64, sg_list: vec![Sge { addr: dst, length: room as u32, lkey: dkey }].into() }).unwrap();
            wqes[t].push((i as u64, dst, room));
            sent[f].push(data);
            let dgid = sim.nodes[t].gid;
            let mut wr = SendWr::new(i as u64, SendOp::Send, vec![Sge { addr: src, length: len as u32, lkey: skey }]);
            wr.ud = Some(UdDest { av: Av { dgid, sgid_index: 0, hop_limit: 64, ..Default::default() }, remote_qpn: ep[t].2, remote_qkey: 0x1234 });
            sim.dev(f).post_send(ep[f].2, wr).unwrap();
        }
        sim.settle(100_000);
        let cqes = [split(sim.poll_all(0, ep[0].1)), split(sim.poll_all(1, ep[1].1))];
        for f in 0..2 {
            let t = 1 - f;
            let (sends, recvs) = (&cqes[f].0, &cqes[t].1);
            prop_assert_eq!(sends.len(), sent[f].len());
            for c in sends { prop_assert_eq!(c.status, WcStatus::Success, "{:?}", c); }
            // The oracle: the datagrams (by PSN) in the order they reached the receiver,
            // duplicates included; each takes the next WQE while there is one.
            let order: Vec<usize> = sim.arrivals.as_ref().unwrap().iter()
                .filter(|a| a.to == t)
                .map(|a| Packet::new_checked(&a.bytes[..]).unwrap().bth().psn() as usize)
                .collect();
            if sim.link[f].loss_ppm == 0 && sim.stats[f].corrupted == 0 {
                prop_assert!(order.len() >= sent[f].len(), "a clean link delivers every datagram");
            }
            let want = order.len().min(wqes[t].len());
            prop_assert_eq!(recvs.len(), want, "direction {}: arrivals {:?}", f, order);
            for (k, (c, &d)) in recvs.iter().zip(&order).enumerate() {
                let (wr_id, dst, room) = wqes[t][k];
                let data = &sent[f][d];
                prop_assert_eq!(c.wr_id, wr_id, "WQEs are consumed in order");
                if 40 + data.len() > room {
                    prop_assert_eq!(c.status, WcStatus::LocLenErr, "datagram {} ({} bytes) in WQE {} of room {}", d, data.len(), k, room);
                    continue;
                }
                prop_assert_eq!(c.status, WcStatus::Success, "datagram {} ({} bytes) in WQE {} of room {}", d, data.len(), k, room);
                prop_assert!(c.wc_flags & WC_GRH != 0);
                prop_assert_eq!(c.src_qp, ep[f].2);
                prop_assert_eq!(c.byte_len as usize, 40 + data.len());
                prop_assert!(sim.nodes[t].mem.slice(dst + 40, data.len()) == &data[..], "WQE {} holds datagram {}", k, d);
                // The GRH area holds 20 zero bytes and the sender's IPv4 header.
                let g = sim.nodes[t].mem.slice(dst, 40).to_vec();
                prop_assert!(g[..20].iter().all(|&b| b == 0));
                prop_assert_eq!(g[20], 0x45);
                prop_assert_eq!(&g[32..36], &[10, 0, 0, f as u8 + 1]);
                prop_assert_eq!(c.network_hdr_type, 2);
            }
        }
        corrupted_were_dropped(&sim)?;
    }
}
