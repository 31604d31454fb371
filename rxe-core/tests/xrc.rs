//! XRC through the simulator: an XRC INI QP on node 0 sends to an XRC TGT QP on node 1, whose
//! XRC domain has two XRC SRQs (each with its own CQ, the second in a PD of its own). Each
//! message names its SRQ in the XRCETH; the TGT takes the receive WQE from that SRQ, completes
//! it on that SRQ's CQ and checks R_Keys against that SRQ's PD.

mod common;

use std::process::Command;

use common::sge;
use common::tshark::{tshark_check, tshark_version};
use rxe_core::pcap::{write_frames_pcap, LinkType};
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::frame::{self, FrameMeta};
use rxe_core::wire::{Opcode, Packet, Transport};
use rxe_core::{QpInit, Qpn};

const MTU: Mtu = Mtu::M1024;
const SQ_PSN: [u32; 2] = [0x100, 0x200];

/// Node 1's XRC objects, and node 0's PD and CQ.
struct Xrc {
    pd_a: u32,
    cq_a: u32,
    xrcd: u32,
    /// The PDs of SRQ 0 and SRQ 1.
    pd_b: [u32; 2],
    srq: [u32; 2],
    srq_cq: [u32; 2],
}

fn objects(sim: &mut Sim) -> Xrc {
    let a = sim.dev(0);
    let pd_a = a.alloc_pd().unwrap();
    let cq_a = a.create_cq(1024).unwrap();
    let b = sim.dev(1);
    let xrcd = b.alloc_xrcd().unwrap();
    let pd_b = [b.alloc_pd().unwrap(), b.alloc_pd().unwrap()];
    let srq_cq = [b.create_cq(1024).unwrap(), b.create_cq(1024).unwrap()];
    let srq = [0, 1].map(|i| {
        b.create_srq_xrc(pd_b[i], xrcd, srq_cq[i], 256, 2, 0)
            .unwrap()
    });
    Xrc {
        pd_a,
        cq_a,
        xrcd,
        pd_b,
        srq,
        srq_cq,
    }
}

fn ini_init(x: &Xrc) -> QpInit {
    QpInit {
        qp_type: QpType::XrcIni,
        pd: x.pd_a,
        send_cq: x.cq_a,
        recv_cq: x.cq_a,
        srq: None,
        xrcd: None,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 0,
            max_send_sge: 2,
            max_recv_sge: 0,
            max_inline_data: 64,
        },
        sq_sig_all: false,
    }
}

/// Creates an INI QP on node 0 and a TGT QP on node 1 and connects them: the INI through
/// RTS with its requester attributes, the TGT to RTR with its responder attributes.
fn pair(sim: &mut Sim, x: &Xrc) -> (Qpn, Qpn) {
    let ini = sim.dev(0).create_qp(ini_init(x)).unwrap();
    let tgt = sim.dev(1).create_qp(QpInit::xrc_tgt(x.xrcd)).unwrap();
    let gids = [sim.nodes[0].gid, sim.nodes[1].gid];
    for (node, qpn, peer) in [(0, ini, tgt), (1, tgt, ini)] {
        let d = sim.dev(node);
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: Access::LOCAL_WRITE.union(Access::REMOTE),
            ..Default::default()
        };
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
        a.qp_state = QpState::Rtr;
        a.path_mtu = MTU;
        a.dest_qp_num = peer.0;
        a.rq_psn = SQ_PSN[1 - node];
        a.max_dest_rd_atomic = 16;
        a.min_rnr_timer = 1;
        a.av = Av {
            dgid: gids[1 - node],
            hop_limit: 64,
            ..Default::default()
        };
        let mut m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN;
        if node == 1 {
            // The responder's attributes: the INI has none to give (kernel qp_state_table).
            assert_eq!(
                d.modify_qp(qpn, &a, AttrMask(m)),
                Err(VerbError::Invalid),
                "TGT RTR needs the responder attributes"
            );
            m |= AttrMask::MAX_DEST_RD_ATOMIC | AttrMask::MIN_RNR_TIMER;
            d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
            continue; // a TGT QP may stay in RTR
        }
        let mut bad = a;
        bad.max_dest_rd_atomic = 16;
        let rm = AttrMask(m | AttrMask::MAX_DEST_RD_ATOMIC);
        assert_eq!(d.modify_qp(qpn, &bad, rm), Err(VerbError::Invalid));
        d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
        a.qp_state = QpState::Rts;
        a.sq_psn = SQ_PSN[node];
        a.timeout = 14;
        a.retry_cnt = 7;
        a.rnr_retry = 7;
        a.max_rd_atomic = 16;
        let m = AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
        d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
    }
    (ini, tgt)
}

fn xwr(id: u64, op: SendOp, sg: Vec<Sge>, srqn: u32) -> SendWr {
    SendWr {
        xrc_remote_srqn: Some(srqn),
        ..SendWr::new(id, op, sg)
    }
}

/// Runs until node 0's CQ holds `n` completions (or the simulation settles); returns them.
fn complete(sim: &mut Sim, cq: u32, n: usize) -> Vec<Cqe> {
    let mut got = Vec::new();
    sim.run_until(2_000_000, |s| {
        got.extend(s.poll_all(0, cq));
        got.len() >= n
    });
    got
}

#[test]
fn sends_land_in_the_srq_they_name() {
    let mut sim = Sim::new(1);
    let x = objects(&mut sim);
    let (ini, tgt) = pair(&mut sim, &x);
    let sizes = [1usize, 3, 1023, 1024, 1025, 2048, 3 * 1024 + 5, 5000];
    let total: usize = sizes.iter().sum();
    let (src, ks) = sim.reg(0, x.pd_a, total, Access::LOCAL_WRITE);
    let dst = [0, 1].map(|i| sim.reg(1, x.pd_b[i], total, Access::LOCAL_WRITE));
    prng_fill(7, sim.nodes[0].mem.slice_mut(src, total));
    let mut off = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let s = i % 2;
        let (addr, key) = dst[s];
        let r = RecvWr {
            wr_id: 100 + i as u64,
            sg_list: sge(addr + off as u64, len, key).into(),
        };
        sim.dev(1).post_srq_recv(x.srq[s], r).unwrap();
        let w = xwr(
            i as u64,
            SendOp::Send,
            sge(src + off as u64, len, ks),
            x.srq[s],
        );
        sim.dev(0).post_send(ini, w).unwrap();
        off += len;
    }
    let c = complete(&mut sim, x.cq_a, sizes.len());
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    sim.settle(100_000);
    let mut off = 0;
    let mut cqes = [0, 1].map(|s| sim.poll_all(1, x.srq_cq[s]).into_iter());
    for (i, &len) in sizes.iter().enumerate() {
        let s = i % 2;
        let c = cqes[s]
            .next()
            .expect("a receive completion on the SRQ's CQ");
        assert_eq!(c.wr_id, 100 + i as u64, "message {i} in SRQ {s}");
        assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Recv));
        assert_eq!(c.qp_num, tgt, "the TGT QP's number");
        assert_eq!(c.byte_len as usize, len);
        let want = sim.nodes[0].mem.slice(src + off as u64, len).to_vec();
        let got = sim.nodes[1].mem.slice(dst[s].0 + off as u64, len);
        assert!(got == &want[..], "message {i}: bytes differ");
        let other = sim.nodes[1].mem.slice(dst[1 - s].0 + off as u64, len);
        assert!(
            other.iter().all(|&b| b == 0),
            "message {i} also in the other SRQ"
        );
        off += len;
    }
    assert!(cqes.iter_mut().all(|c| c.next().is_none()));
    assert_eq!(sim.dev(1).query_srq(x.srq[0]).unwrap().3, 0);
}

#[test]
fn rdma_under_the_named_srqs_pd() {
    let mut sim = Sim::new(2);
    let x = objects(&mut sim);
    let (ini, _) = pair(&mut sim, &x);
    let len = 3000;
    let (src, ks) = sim.reg(0, x.pd_a, 2 * len, Access::LOCAL_WRITE);
    prng_fill(9, sim.nodes[0].mem.slice_mut(src, len));
    // An MR of SRQ 0's PD.
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (ra, rk) = sim.reg(1, x.pd_b[0], len + 8, all);
    let s0 = x.srq[0];
    let write = SendOp::Write {
        remote_addr: ra,
        rkey: rk,
    };
    let read = SendOp::Read {
        remote_addr: ra,
        rkey: rk,
    };
    let fadd = SendOp::FetchAdd {
        remote_addr: ra + len as u64,
        rkey: rk,
        add: 5,
    };
    let d = sim.dev(0);
    d.post_send(ini, xwr(1, write.clone(), sge(src, len, ks), s0))
        .unwrap();
    d.post_send(
        ini,
        xwr(2, read.clone(), sge(src + len as u64, len, ks), s0),
    )
    .unwrap();
    d.post_send(ini, xwr(3, fadd, sge(src + len as u64, 8, ks), s0))
        .unwrap();
    let c = complete(&mut sim, x.cq_a, 3);
    let st: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(st, [1, 2, 3].map(|i| (i, WcStatus::Success)));
    let want = sim.nodes[0].mem.slice(src, len).to_vec();
    assert!(sim.nodes[1].mem.slice(ra, len) == &want[..], "WRITE data");
    // The READ brought it back over the first 8 bytes the atomic then replaced.
    assert!(
        sim.nodes[0].mem.slice(src + len as u64 + 8, len - 8) == &want[8..],
        "READ data"
    );
    assert_eq!(
        sim.nodes[1].mem.slice(ra + len as u64, 8),
        &5u64.to_le_bytes()
    );

    // The same MR named through SRQ 1, whose PD is another: a remote access error.
    for op in [write, read] {
        let (ini, _) = pair(&mut sim, &x);
        let w = xwr(9, op.clone(), sge(src, 64, ks), x.srq[1]);
        sim.dev(0).post_send(ini, w).unwrap();
        let c = complete(&mut sim, x.cq_a, 1);
        assert_eq!(c[0].status, WcStatus::RemAccessErr, "{op:?}");
    }
}

#[test]
fn an_xrceth_naming_no_srq_of_the_domain_is_an_invalid_request() {
    let mut sim = Sim::new(3);
    let x = objects(&mut sim);
    let (src, ks) = sim.reg(0, x.pd_a, 64, Access::LOCAL_WRITE);
    let b = sim.dev(1);
    let plain = b.create_srq(x.pd_b[0], 16, 1, 0).unwrap();
    let xrcd2 = b.alloc_xrcd().unwrap();
    let foreign = b
        .create_srq_xrc(x.pd_b[0], xrcd2, x.srq_cq[0], 16, 1, 0)
        .unwrap();
    let (ra, rk) = sim.reg(1, x.pd_b[0], 64, Access::LOCAL_WRITE);
    for s in [plain, foreign] {
        let r = RecvWr {
            wr_id: 1,
            sg_list: sge(ra, 64, rk).into(),
        };
        sim.dev(1).post_srq_recv(s, r).unwrap();
    }
    for (what, srqn) in [("non-XRC", plain), ("other domain", foreign), ("none", 999)] {
        let (ini, tgt) = pair(&mut sim, &x);
        let w = xwr(5, SendOp::Send, sge(src, 16, ks), srqn);
        sim.dev(0).post_send(ini, w).unwrap();
        let c = complete(&mut sim, x.cq_a, 1);
        assert_eq!(c[0].status, WcStatus::RemInvReqErr, "{what}");
        sim.settle(100_000);
        let tq = sim.dev(1).qp(tgt).unwrap();
        assert_eq!(tq.state(), QpState::Err, "{what}");
        assert_eq!(tq.counters.naks_sent, 1, "{what}");
    }
    // Nothing was taken from the SRQs named, nothing completed anywhere on node 1.
    assert_eq!(sim.dev(1).query_srq(plain).unwrap().3, 1);
    assert_eq!(sim.dev(1).query_srq(foreign).unwrap().3, 1);
    for cq in x.srq_cq {
        let c = sim.poll_all(1, cq);
        assert!(c.is_empty(), "{c:?}");
    }
}

#[test]
fn lost_packets_are_retried_as_rc() {
    let mut sim = Sim::new(4);
    sim.link[0].loss_ppm = 100_000;
    sim.link[1].loss_ppm = 100_000;
    let x = objects(&mut sim);
    let (ini, tgt) = pair(&mut sim, &x);
    let n = 24usize;
    let len = 2500;
    let (src, ks) = sim.reg(0, x.pd_a, 2 * n * len, Access::LOCAL_WRITE);
    prng_fill(11, sim.nodes[0].mem.slice_mut(src, n * len));
    let dst = [0, 1].map(|i| {
        sim.reg(
            1,
            x.pd_b[i],
            n * len,
            Access::LOCAL_WRITE.union(Access::REMOTE),
        )
    });
    for i in 0..n {
        let s = i % 2;
        let at = (i * len) as u64;
        let (op, wr_sg) = match i % 3 {
            0 | 1 => {
                let r = RecvWr {
                    wr_id: i as u64,
                    sg_list: sge(dst[s].0 + at, len, dst[s].1).into(),
                };
                sim.dev(1).post_srq_recv(x.srq[s], r).unwrap();
                (SendOp::Send, sge(src + at, len, ks))
            }
            _ => (
                SendOp::Write {
                    remote_addr: dst[s].0 + at,
                    rkey: dst[s].1,
                },
                sge(src + at, len, ks),
            ),
        };
        sim.dev(0)
            .post_send(ini, xwr(i as u64, op, wr_sg, x.srq[s]))
            .unwrap();
    }
    // READ messages 0 and 1 back (each from its SRQ's side) into the second half.
    let back = (n * len) as u64;
    for (s, (&(addr, rkey), &srqn)) in dst.iter().zip(&x.srq).enumerate() {
        let op = SendOp::Read {
            remote_addr: addr + (s * len) as u64,
            rkey,
        };
        let to = src + back + (s * len) as u64;
        let w = xwr(100 + s as u64, op, sge(to, len, ks), srqn);
        sim.dev(0).post_send(ini, w).unwrap();
    }
    let c = complete(&mut sim, x.cq_a, n + 2);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    sim.settle(1_000_000);
    for i in 0..n {
        let s = i % 2;
        let at = (i * len) as u64;
        let want = sim.nodes[0].mem.slice(src + at, len).to_vec();
        assert!(
            sim.nodes[1].mem.slice(dst[s].0 + at, len) == &want[..],
            "message {i}"
        );
    }
    let sent = sim.nodes[0].mem.slice(src, 2 * len).to_vec();
    assert!(
        sim.nodes[0].mem.slice(src + back, 2 * len) == &sent[..],
        "READ data"
    );
    let recvs: Vec<Cqe> = [0, 1]
        .iter()
        .flat_map(|&s| sim.poll_all(1, x.srq_cq[s]))
        .collect();
    assert_eq!(recvs.len(), (0..n).filter(|i| i % 3 != 2).count());
    assert!(recvs
        .iter()
        .all(|c| c.status == WcStatus::Success && c.qp_num == tgt));
    let ctr = sim.dev(0).qp_counters(ini).unwrap();
    assert!(ctr.retransmits > 0 && sim.stats[0].lost > 0 && sim.stats[1].lost > 0);
}

#[test]
fn verbs_rules_and_busy_objects() {
    let mut sim = Sim::new(5);
    let x = objects(&mut sim);
    let (ini, tgt) = pair(&mut sim, &x);
    let b = sim.dev(1);
    assert_eq!(b.srq_xrcd(x.srq[1]), Some(x.xrcd));
    // In use: the domain (SRQs, TGT QP), the SRQs' CQs and PDs.
    assert_eq!(b.dealloc_xrcd(x.xrcd), Err(VerbError::Busy));
    assert_eq!(b.destroy_cq(x.srq_cq[0]), Err(VerbError::Busy));
    assert_eq!(b.dealloc_pd(x.pd_b[1]), Err(VerbError::Busy));
    assert_eq!(
        b.create_srq_xrc(x.pd_b[0], 77, x.srq_cq[0], 8, 1, 0),
        Err(VerbError::NotFound)
    );
    assert_eq!(
        b.create_srq_xrc(x.pd_b[0], x.xrcd, 77, 8, 1, 0),
        Err(VerbError::NotFound)
    );
    // A regular SRQ in use by an RC QP is Busy too, as before.
    let cq = b.create_cq(8).unwrap();
    let srq = b.create_srq(x.pd_b[0], 8, 1, 0).unwrap();
    let rc = b
        .create_qp(QpInit {
            qp_type: QpType::Rc,
            srq: Some(srq),
            pd: x.pd_b[0],
            send_cq: cq,
            recv_cq: cq,
            ..ini_init(&x)
        })
        .unwrap();
    assert_eq!(b.destroy_srq(srq), Err(VerbError::Busy));
    b.destroy_qp(rc).unwrap();
    b.destroy_srq(srq).unwrap();
    for s in x.srq {
        b.destroy_srq(s).unwrap();
    }
    assert_eq!(b.dealloc_xrcd(x.xrcd), Err(VerbError::Busy), "the TGT QP");
    b.destroy_qp(tgt).unwrap();
    b.dealloc_xrcd(x.xrcd).unwrap();
    b.destroy_cq(x.srq_cq[0]).unwrap();
    b.dealloc_pd(x.pd_b[1]).unwrap();

    // The types' rules.
    let mut bad = ini_init(&x);
    bad.cap.max_recv_wr = 1;
    assert_eq!(sim.dev(0).create_qp(bad), Err(VerbError::Invalid));
    let xrcd = sim.dev(0).alloc_xrcd().unwrap();
    for init in [
        QpInit {
            xrcd: Some(xrcd),
            ..ini_init(&x)
        },
        QpInit {
            xrcd: Some(xrcd),
            qp_type: QpType::Rc,
            ..ini_init(&x)
        },
        QpInit {
            xrcd: None,
            ..QpInit::xrc_tgt(xrcd)
        },
        QpInit {
            cap: ini_init(&x).cap,
            ..QpInit::xrc_tgt(xrcd)
        },
    ] {
        assert_eq!(
            sim.dev(0).create_qp(init),
            Err(VerbError::Invalid),
            "{init:?}"
        );
    }
    let t0 = sim.dev(0).create_qp(QpInit::xrc_tgt(xrcd)).unwrap();
    let w = SendWr::new(1, SendOp::Send, Vec::new());
    assert_eq!(sim.dev(0).post_send(t0, w.clone()), Err(VerbError::Invalid));
    assert_eq!(
        sim.dev(0).post_send(ini, w.clone()),
        Err(VerbError::Invalid)
    );
    let flush = SendOp::AtomicWrite {
        remote_addr: 0,
        rkey: 1,
    };
    assert_eq!(
        sim.dev(0).post_send(ini, xwr(1, flush, sge(0, 8, 0), 1)),
        Err(VerbError::Invalid)
    );
    assert_eq!(
        sim.dev(0).post_recv(ini, RecvWr::default()),
        Err(VerbError::Invalid)
    );
    sim.dev(0).destroy_qp(t0).unwrap();
    sim.dev(0).dealloc_xrcd(xrcd).unwrap();
    let mut n = 0;
    while sim.dev(0).alloc_xrcd().is_ok() {
        n += 1;
    }
    assert_eq!(n, rxe_core::device::MAX_XRCD);
}

/// The bytes after the BTH of every XRC request carry the XRCETH; responses carry none.
fn check_wire(trace: &[Traced], srqs: &[u32]) -> usize {
    let mut requests = 0;
    for t in trace {
        let p = Packet::new_checked(&t.bytes[..]).unwrap();
        assert_eq!(p.opcode().transport(), Transport::Xrc, "{:?}", p.opcode());
        assert_eq!(p.opcode().0 & 0xe0, 0xa0);
        let b = &t.bytes;
        if t.from == 0 {
            requests += 1;
            let n = u32::from_be_bytes([0, b[13], b[14], b[15]]);
            assert_eq!(b[12], 0, "XRCETH reserved byte");
            assert!(srqs.contains(&n), "{:?}: XRCETH {n:#x}", p.opcode());
            assert_eq!(p.xrceth(), Some(n));
            if let Some(r) = p.reth() {
                // The RETH starts after the XRCETH.
                assert_eq!(r.va().to_be_bytes(), b[16..24]);
            }
        } else {
            assert_eq!(p.xrceth(), None);
            let aeth = p.aeth().map(|a| a.syndrome_byte());
            assert!(
                aeth.is_none() || aeth == Some(b[12]),
                "AETH right after the BTH"
            );
        }
    }
    requests
}

#[test]
fn wire_format_and_tshark() {
    let mut sim = Sim::new(6);
    let x = objects(&mut sim);
    let (ini, _) = pair(&mut sim, &x);
    sim.trace = Some(Vec::new());
    let (src, ks) = sim.reg(0, x.pd_a, 8192, Access::LOCAL_WRITE);
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (ra, rk) = sim.reg(1, x.pd_b[1], 8192, all);
    for s in 0..2 {
        for i in 0..3 {
            let r = RecvWr {
                wr_id: i,
                sg_list: sge(ra, 4096, rk).into(),
            };
            let pd = x.pd_b[s];
            let (a, k) = sim.reg(1, pd, 4096, Access::LOCAL_WRITE);
            let r = RecvWr {
                sg_list: sge(a, 4096, k).into(),
                ..r
            };
            sim.dev(1).post_srq_recv(x.srq[s], r).unwrap();
        }
    }
    let s1 = x.srq[1];
    let ops = [
        (SendOp::Send, 5, x.srq[0]),
        (SendOp::Send, 2500, x.srq[0]),
        (SendOp::SendWithImm(0x1234), 1500, s1),
        (
            SendOp::Write {
                remote_addr: ra,
                rkey: rk,
            },
            100,
            s1,
        ),
        (
            SendOp::WriteWithImm {
                remote_addr: ra,
                rkey: rk,
                imm: 7,
            },
            2100,
            s1,
        ),
        (
            SendOp::Read {
                remote_addr: ra,
                rkey: rk,
            },
            2500,
            s1,
        ),
        (
            SendOp::FetchAdd {
                remote_addr: ra + 4096,
                rkey: rk,
                add: 1,
            },
            8,
            s1,
        ),
        (
            SendOp::CompSwap {
                remote_addr: ra + 4096,
                rkey: rk,
                compare: 1,
                swap: 2,
            },
            8,
            s1,
        ),
    ];
    let n = ops.len();
    for (i, (op, len, srqn)) in ops.into_iter().enumerate() {
        sim.dev(0)
            .post_send(ini, xwr(i as u64, op, sge(src, len, ks), srqn))
            .unwrap();
    }
    let c = complete(&mut sim, x.cq_a, n);
    assert!(c.iter().all(|c| c.status == WcStatus::Success), "{c:?}");
    sim.settle(100_000);
    let trace = sim.trace.take().unwrap();
    let reqs = check_wire(&trace, &x.srq);
    let ops: std::collections::BTreeSet<u8> = trace.iter().map(|t| t.bytes[0]).collect();
    for op in [
        0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa6, 0xa7, 0xa9, 0xaa, 0xac, 0xad, 0xae, 0xaf, 0xb1, 0xb2,
        0xb3, 0xb4,
    ] {
        assert!(ops.contains(&op), "{:?} not sent", Opcode(op));
    }
    // Every packet in a frame: the ICRC is recomputed from the headers and checks out.
    let frames: Vec<Vec<u8>> = trace.iter().map(frame_of).collect();
    for f in &frames {
        let raw = frame::parse_headers(f, true).unwrap();
        raw.verify_icrc().expect("ICRC");
    }

    let Some(version) = tshark_version() else {
        vur_testkit::skip("xrc wire_format_and_tshark", "tshark not installed");
        return;
    };
    // The BTH of every frame as tshark reads it, no malformed packet or expert info.
    let rep = tshark_check("xrc", &frames, true).expect("tshark vanished");
    assert_eq!(rep.decoded.len(), frames.len());
    // tshark names the XRC opcode and shows the XRCETH (tshark 4.0: as the first bytes of
    // the data it does not dissect further).
    let rows = tshark_xrc(&frames);
    let mut named = 0;
    for ((t, row), f) in trace.iter().zip(&rows).zip(&frames) {
        let (name, data) = row;
        let op = Opcode(t.bytes[0]);
        let want = xrc_name(op);
        assert_eq!(name, &want, "{op:?}");
        if t.from == 0 {
            let xrceth = &t.bytes[12..16];
            assert!(
                data.starts_with(&hex(xrceth)),
                "{op:?}: {data} / {}",
                hex(xrceth)
            );
            named += 1;
        }
        assert!(f.len() > 16);
    }
    assert_eq!(named, reqs);
    println!(
        "xrc: {} frames ({reqs} requests) decoded by {version}",
        frames.len()
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Wireshark's name of an XRC opcode ("Extended Reliable Connection (XRC) - SEND Only").
fn xrc_name(op: Opcode) -> String {
    let n = op.info().unwrap().name.strip_prefix("XRC_").unwrap();
    let rc = match n {
        "SEND_FIRST" => "SEND First",
        "SEND_MIDDLE" => "SEND Middle",
        "SEND_LAST" => "SEND Last",
        "SEND_LAST_WITH_IMMEDIATE" => "SEND Last with Immediate",
        "SEND_ONLY" => "SEND Only",
        "SEND_ONLY_WITH_IMMEDIATE" => "SEND Only with Immediate",
        "RDMA_WRITE_FIRST" => "RDMA WRITE First",
        "RDMA_WRITE_MIDDLE" => "RDMA WRITE Middle",
        "RDMA_WRITE_LAST" => "RDMA WRITE Last",
        "RDMA_WRITE_LAST_WITH_IMMEDIATE" => "RDMA WRITE Last with Immediate",
        "RDMA_WRITE_ONLY" => "RDMA WRITE Only",
        "RDMA_WRITE_ONLY_WITH_IMMEDIATE" => "RDMA WRITE Only with Immediate",
        "RDMA_READ_REQUEST" => "RDMA READ Request",
        "RDMA_READ_RESPONSE_FIRST" => "RDMA READ response First",
        "RDMA_READ_RESPONSE_MIDDLE" => "RDMA READ response Middle",
        "RDMA_READ_RESPONSE_LAST" => "RDMA READ response Last",
        "RDMA_READ_RESPONSE_ONLY" => "RDMA READ response Only",
        "ACKNOWLEDGE" => "Acknowledge",
        "ATOMIC_ACKNOWLEDGE" => "ATOMIC Acknowledge",
        "COMPARE_SWAP" => "CmpSwap",
        "FETCH_ADD" => "FetchAdd",
        other => panic!("{other}"),
    };
    format!("Extended Reliable Connection (XRC) - {rc}")
}

/// tshark's opcode name and undissected data (hex) of every frame.
fn tshark_xrc(frames: &[Vec<u8>]) -> Vec<(String, String)> {
    let path = std::env::temp_dir().join(format!("rxe-core-xrc-{}.pcap", std::process::id()));
    write_frames_pcap(&path, LinkType::ETHERNET, frames).unwrap();
    let o = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["--disable-protocol", "rpcordma"])
        .args(["-T", "fields", "-E", "separator=|", "-E", "occurrence=l"])
        .args(["-e", "infiniband.bth.opcode", "-e", "infiniband.vendor"])
        .output()
        .expect("run tshark");
    let v = Command::new("tshark")
        .arg("-r")
        .arg(&path)
        .args(["--disable-protocol", "rpcordma", "-V"])
        .output()
        .expect("run tshark");
    let _ = std::fs::remove_file(&path);
    assert!(o.status.success() && v.status.success());
    let text = String::from_utf8(v.stdout).unwrap();
    let names: Vec<String> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Opcode: "))
        .map(|l| l.rsplit_once(" (").unwrap().0.to_string())
        .collect();
    let rows: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('|').nth(1).unwrap_or("").replace(':', ""))
        .collect();
    assert_eq!(names.len(), frames.len(), "{text}");
    names.into_iter().zip(rows).collect()
}

fn frame_of(t: &Traced) -> Vec<u8> {
    let tx = &t.tx;
    let mac = |i: usize| [2, 0, 0, 0, 0, i as u8 + 1];
    let m = FrameMeta::new(tx.src.to_ip(), tx.dst.to_ip(), tx.sport)
        .with_eth(mac(t.from), mac(1 - t.from));
    let mut out = vec![0u8; m.header_len().unwrap() + t.bytes.len()];
    frame::build(&mut out, &m, &t.bytes).unwrap();
    out
}
