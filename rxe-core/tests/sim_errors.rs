//! Error paths and the less common verbs, through the simulator.

mod common;

use common::{sge, statuses};
use rxe_core::mem::MwType;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::Gid;

const LW: Access = Access::LOCAL_WRITE;
const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE.0 | Access::MW_BIND.0);

fn events(sim: &mut Sim, n: usize) -> Vec<AsyncEvent> {
    std::iter::from_fn(|| sim.dev(n).poll_event()).collect()
}

#[test]
fn bad_rkey_is_a_remote_access_error_and_writes_nothing() {
    let mut sim = Sim::new(3);
    let ep = sim.connect(ConnOpts::default());
    let (src, skey) = sim.reg(0, ep[0].pd, 64, LW);
    sim.nodes[0].mem.slice_mut(src, 64).fill(0xaa);
    let (dst, dkey) = sim.reg(1, ep[1].pd, 64, ALL);
    let mut w = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: dst,
            rkey: dkey ^ 0x100,
        },
        sge(src, 64, skey),
    );
    w.flags = 0; // unsignaled: errors complete anyway
    sim.dev(0).post_send(ep[0].qpn, w).unwrap();
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: dst,
                    rkey: dkey,
                },
                sge(src, 64, skey),
            ),
        )
        .unwrap();
    // Out of bounds with the right key is the same error.
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::RemAccessErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(
        sim.nodes[1].mem.slice(dst, 64).iter().all(|&b| b == 0),
        "nothing written"
    );
    assert_eq!(sim.dev(0).qp(ep[0].qpn).unwrap().state(), QpState::Err);
    assert_eq!(sim.dev(1).qp(ep[1].qpn).unwrap().state(), QpState::Err);
    assert!(events(&mut sim, 1).contains(&AsyncEvent::QpAccessErr { qpn: ep[1].qpn }));
    assert_eq!(sim.dev(1).qp_counters(ep[1].qpn).unwrap().naks_sent, 1);
    assert_eq!(sim.dev(0).qp_counters(ep[0].qpn).unwrap().naks_received, 1);
}

#[test]
fn out_of_bounds_read_is_a_remote_access_error() {
    let mut sim = Sim::new(4);
    let ep = sim.connect(ConnOpts::default());
    let (src, skey) = sim.reg(0, ep[0].pd, 128, LW);
    let (dst, dkey) = sim.reg(1, ep[1].pd, 64, ALL);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Read {
                    remote_addr: dst + 1,
                    rkey: dkey,
                },
                sge(src, 64, skey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::RemAccessErr)]
    );
}

#[test]
fn rnr_retry_exhausted() {
    let mut sim = Sim::new(5);
    let ep = sim.connect(ConnOpts {
        rnr_retry: 2,
        min_rnr_timer: 1,
        ..Default::default()
    });
    let (src, skey) = sim.reg(0, ep[0].pd, 16, LW);
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge(src, 16, skey)))
        .unwrap();
    sim.settle(10_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::RnrRetryExcErr)]
    );
    // The first try and two retries were each refused.
    assert_eq!(sim.dev(1).qp_counters(ep[1].qpn).unwrap().rnr_naks_sent, 3);
}

#[test]
fn rnr_then_success_when_a_receive_arrives() {
    let mut sim = Sim::new(6);
    let ep = sim.connect(ConnOpts {
        rnr_retry: 7,
        min_rnr_timer: 14,
        ..Default::default()
    });
    let (src, skey) = sim.reg(0, ep[0].pd, 16, LW);
    let (dst, dkey) = sim.reg(1, ep[1].pd, 16, LW);
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge(src, 16, skey)))
        .unwrap();
    // Let a few RNR NAKs happen, then post the receive.
    sim.run_until(100_000, |s| {
        s.dev(1).qp_counters(ep[1].qpn).unwrap().rnr_naks_sent >= 3
    });
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 7,
                sg_list: sge(dst, 16, dkey).into(),
            },
        )
        .unwrap();
    sim.settle(100_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(7, WcStatus::Success)]
    );
}

#[test]
fn retry_count_exhausted_on_a_dead_link() {
    let mut sim = Sim::new(7);
    sim.link[0].loss_ppm = 1_000_000;
    let ep = sim.connect(ConnOpts {
        retry_cnt: 3,
        timeout: 8,
        ..Default::default()
    });
    let (src, skey) = sim.reg(0, ep[0].pd, 3000, LW);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(1, SendOp::Send, sge(src, 3000, skey)),
        )
        .unwrap();
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(2, SendOp::Send, sge(src, 10, skey)))
        .unwrap();
    sim.settle(10_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let c = sim.dev(0).qp_counters(ep[0].qpn).unwrap();
    assert_eq!(c.timeouts, 4, "first timeout plus three retries");
    assert_eq!(c.retransmits, 3);
    assert!(events(&mut sim, 0).contains(&AsyncEvent::QpFatal { qpn: ep[0].qpn }));
}

#[test]
fn psn_wraps_across_2_pow_24() {
    let mut sim = Sim::new(8);
    sim.link[0].drop_every = 7;
    let ep = sim.connect(ConnOpts {
        sq_psn: [0xff_fffa, 0xff_fffe],
        mtu: Mtu::M256,
        timeout: 8,
        ..Default::default()
    });
    let (src, skey) = sim.reg(0, ep[0].pd, 2000, LW);
    let data = rxe_core::sim::prng_pattern(190, 2000);
    sim.nodes[0].mem.slice_mut(src, 2000).copy_from_slice(&data);
    let mut dsts = vec![];
    for i in 0..20 {
        let (dst, dkey) = sim.reg(1, ep[1].pd, 2000, LW);
        dsts.push(dst);
        sim.dev(1)
            .post_recv(
                ep[1].qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: sge(dst, 2000, dkey).into(),
                },
            )
            .unwrap();
        sim.dev(0)
            .post_send(
                ep[0].qpn,
                SendWr::new(i, SendOp::Send, sge(src, 2000, skey)),
            )
            .unwrap();
    }
    sim.settle(100_000);
    assert_eq!(
        sim.poll_all(0, ep[0].cq)
            .iter()
            .filter(|c| c.status == WcStatus::Success)
            .count(),
        20
    );
    assert_eq!(sim.poll_all(1, ep[1].cq).len(), 20);
    for d in dsts {
        assert_eq!(sim.nodes[1].mem.slice(d, 2000), &data[..]);
    }
    // 20 messages of 8 packets from 0xfffffa: the PSN wrapped.
    let (attr, _) = sim.dev(1).query_qp(ep[1].qpn).unwrap();
    assert_eq!(attr.qp_state, QpState::Rts);
}

#[test]
fn qp_to_error_flushes_everything() {
    let mut sim = Sim::new(9);
    sim.link[0].loss_ppm = 1_000_000;
    let ep = sim.connect(ConnOpts {
        timeout: 20,
        ..Default::default()
    });
    let (buf, key) = sim.reg(0, ep[0].pd, 64, LW);
    for i in 0..3 {
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(i, SendOp::Send, sge(buf, 64, key)))
            .unwrap();
    }
    for i in 10..12 {
        sim.dev(0)
            .post_recv(
                ep[0].qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: sge(buf, 64, key).into(),
                },
            )
            .unwrap();
    }
    sim.step();
    let a = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    sim.dev(0)
        .modify_qp(ep[0].qpn, &a, AttrMask(AttrMask::STATE))
        .unwrap();
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(
        statuses(&c),
        vec![
            (0, WcStatus::WrFlushErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr),
            (10, WcStatus::WrFlushErr),
            (11, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(c[3].opcode, WcOpcode::Recv);
    // Posting in ERR completes at once with a flush error.
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(5, SendOp::Send, sge(buf, 64, key)))
        .unwrap();
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(5, WcStatus::WrFlushErr)]
    );
    // And back to RESET empties it without completions.
    let a = QpAttr {
        qp_state: QpState::Reset,
        ..Default::default()
    };
    sim.dev(0)
        .modify_qp(ep[0].qpn, &a, AttrMask(AttrMask::STATE))
        .unwrap();
    assert_eq!(sim.dev(0).qp(ep[0].qpn).unwrap().state(), QpState::Reset);
    assert!(sim
        .dev(0)
        .post_send(ep[0].qpn, SendWr::new(6, SendOp::Send, vec![]))
        .is_err());
}

/// A receive WQE the responder took for a SEND of several packets, of which only the first
/// arrived, is flushed when the QP goes to ERR — first, before the receives still queued —
/// with an RQ and with an SRQ. (It used to be dropped without a completion.)
#[test]
fn a_receive_taken_for_a_send_in_progress_is_flushed() {
    for srq in [false, true] {
        let mut sim = Sim::new(11);
        let ep = sim.connect(ConnOpts {
            mtu: Mtu::M256,
            srq,
            ..Default::default()
        });
        let (buf, key) = sim.reg(0, ep[0].pd, 1024, LW);
        let (rbuf, rkey) = sim.reg(1, ep[1].pd, 1024, LW);
        for i in 10..13 {
            let wr = RecvWr {
                wr_id: i,
                sg_list: sge(rbuf, 1024, rkey).into(),
            };
            if srq {
                let s = sim.dev(1).qp(ep[1].qpn).unwrap().srq.unwrap();
                sim.dev(1).post_srq_recv(s, wr).unwrap();
            } else {
                sim.dev(1).post_recv(ep[1].qpn, wr).unwrap();
            }
        }
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge(buf, 600, key)))
            .unwrap();
        let pkts = sim.take(0, 16);
        assert_eq!(pkts.len(), 3, "SEND FIRST, MIDDLE, LAST at MTU 256");
        sim.inject(1, &pkts[0].1).unwrap();
        let a = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        sim.dev(1)
            .modify_qp(ep[1].qpn, &a, AttrMask(AttrMask::STATE))
            .unwrap();
        let c = sim.poll_all(1, ep[1].cq);
        // With an SRQ, the receives still in it are the SRQ's, not flushed with the QP.
        let want: &[(u64, WcStatus)] = if srq {
            &[(10, WcStatus::WrFlushErr)]
        } else {
            &[
                (10, WcStatus::WrFlushErr),
                (11, WcStatus::WrFlushErr),
                (12, WcStatus::WrFlushErr),
            ]
        };
        assert_eq!(statuses(&c), want, "srq: {srq}");
        assert!(c
            .iter()
            .all(|c| c.opcode == WcOpcode::Recv && c.qp_num == ep[1].qpn));
    }
}

#[test]
fn cq_overflow_puts_the_cq_and_qp_in_error() {
    let mut sim = Sim::new(10);
    let ep = sim.connect(ConnOpts {
        cqe: 2,
        ..Default::default()
    });
    let (buf, key) = sim.reg(0, ep[0].pd, 8, ALL);
    for i in 0..5 {
        sim.dev(0)
            .post_send(
                ep[0].qpn,
                SendWr::new(
                    i,
                    SendOp::Write {
                        remote_addr: buf,
                        rkey: key,
                    },
                    vec![],
                ),
            )
            .unwrap();
    }
    // A zero-length WRITE to ourselves' key is fine on the peer: use the peer's own buffer.
    sim.settle(10_000);
    assert!(sim.dev(0).cq_in_error(ep[0].cq));
    assert_eq!(sim.dev(0).qp(ep[0].qpn).unwrap().state(), QpState::Err);
    let ev = events(&mut sim, 0);
    assert!(ev.contains(&AsyncEvent::CqErr { cqn: ep[0].cq }), "{ev:?}");
    assert_eq!(sim.dev(0).cq_len(ep[0].cq), 2);
}

#[test]
fn send_with_invalidate_and_type2_window() {
    let mut sim = Sim::new(11);
    let ep = sim.connect(ConnOpts::default());
    let (src, skey) = sim.reg(0, ep[0].pd, 256, LW);
    sim.nodes[0].mem.slice_mut(src, 256).fill(0x5a);
    let (mr, mrkey) = sim.reg(1, ep[1].pd, 4096, ALL);
    let (rbuf, rkey) = sim.reg(1, ep[1].pd, 256, LW);
    // The responder binds a type 2 window over 1 KiB of its MR with a BIND_MW work request.
    let mw = sim.dev(1).alloc_mw(ep[1].pd, MwType::Type2).unwrap();
    let new_rkey = (mw & !0xff) | 0x42;
    let bind = SendOp::BindMw {
        mw_rkey: mw,
        new_rkey,
        mr_lkey: mrkey,
        addr: mr + 1024,
        length: 1024,
        access: Access::REMOTE_WRITE,
    };
    sim.dev(1)
        .post_send(ep[1].qpn, SendWr::new(100, bind, vec![]))
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(100, WcStatus::Success)]
    );
    // WRITE through the window lands in the MR; outside it is refused later.
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: mr + 1024,
                    rkey: new_rkey,
                },
                sge(src, 256, skey),
            ),
        )
        .unwrap();
    // SEND with invalidate revokes the window at the responder.
    sim.dev(1)
        .post_recv(
            ep[1].qpn,
            RecvWr {
                wr_id: 7,
                sg_list: sge(rbuf, 256, rkey).into(),
            },
        )
        .unwrap();
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(2, SendOp::SendWithInv(new_rkey), sge(src, 16, skey)),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let c = sim.poll_all(1, ep[1].cq);
    assert_eq!(c[0].wc_flags & WC_WITH_INV, WC_WITH_INV);
    assert_eq!(c[0].imm_or_inv, new_rkey);
    assert!(sim.nodes[1]
        .mem
        .slice(mr + 1024, 256)
        .iter()
        .all(|&b| b == 0x5a));
    assert!(sim.nodes[1].mem.slice(mr, 1024).iter().all(|&b| b == 0));
    // The invalidated window no longer grants access.
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                3,
                SendOp::Write {
                    remote_addr: mr + 1024,
                    rkey: new_rkey,
                },
                sge(src, 8, skey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(3, WcStatus::RemAccessErr)]
    );
}

#[test]
fn type1_window_bounds_remote_reads() {
    let mut sim = Sim::new(12);
    let ep = sim.connect(ConnOpts::default());
    let (mr, mrkey) = sim.reg(1, ep[1].pd, 4096, ALL);
    sim.nodes[1]
        .mem
        .slice_mut(mr, 4096)
        .iter_mut()
        .enumerate()
        .for_each(|(i, b)| *b = i as u8);
    let mw = sim.dev(1).alloc_mw(ep[1].pd, MwType::Type1).unwrap();
    let rkey = sim
        .dev(1)
        .bind_mw_type1(ep[1].qpn, mw, mrkey, mr + 100, 200, Access::REMOTE_READ)
        .unwrap();
    assert!(
        sim.dev(1).dereg_mr(mrkey).is_err(),
        "an MR with a bound window cannot go away"
    );
    let (dst, dkey) = sim.reg(0, ep[0].pd, 300, LW);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Read {
                    remote_addr: mr + 100,
                    rkey,
                },
                sge(dst, 200, dkey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.nodes[0].mem.slice(dst, 200),
        sim.nodes[1].mem.slice(mr + 100, 200)
    );
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Read {
                    remote_addr: mr + 100,
                    rkey,
                },
                sge(dst, 201, dkey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(2, WcStatus::RemAccessErr)]
    );
}

#[test]
fn fast_reg_then_local_invalidate() {
    let mut sim = Sim::new(13);
    let ep = sim.connect(ConnOpts::default());
    let page = sim.alloc(1, 8192);
    let page = (page + 4095) & !4095;
    let mr = sim.dev(1).alloc_mr(ep[1].pd, 4).unwrap();
    let key = (mr & !0xff) | 0x77;
    let reg = SendOp::RegMr {
        lkey: mr,
        key,
        access: Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
        iova: 0x5000_0000,
        length: 4096,
        page_shift: 12,
        page_offset: 0,
        pages: vec![page],
    };
    sim.dev(1)
        .post_send(ep[1].qpn, SendWr::new(1, reg, vec![]))
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(1, WcStatus::Success)]
    );
    let (src, skey) = sim.reg(0, ep[0].pd, 64, LW);
    sim.nodes[0].mem.slice_mut(src, 64).fill(9);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: 0x5000_0010,
                    rkey: key,
                },
                sge(src, 64, skey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::Success)]
    );
    assert!(sim.nodes[1]
        .mem
        .slice(page + 0x10, 64)
        .iter()
        .all(|&b| b == 9));
    sim.dev(1)
        .post_send(
            ep[1].qpn,
            SendWr::new(2, SendOp::LocalInv { rkey: key }, vec![]),
        )
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(2, WcStatus::Success)]
    );
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: 0x5000_0010,
                    rkey: key,
                },
                sge(src, 64, skey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(2, WcStatus::RemAccessErr)]
    );
}

#[test]
fn srq_shared_receives_and_limit_event() {
    let mut sim = Sim::new(14);
    let ep = sim.connect(ConnOpts {
        srq: true,
        ..Default::default()
    });
    let srq = 1;
    let (dst, dkey) = sim.reg(1, ep[1].pd, 64 * 8, LW);
    for i in 0..8u64 {
        sim.dev(1)
            .post_srq_recv(
                srq,
                RecvWr {
                    wr_id: i,
                    sg_list: sge(dst + 64 * i, 64, dkey).into(),
                },
            )
            .unwrap();
    }
    assert!(
        sim.dev(1).post_recv(ep[1].qpn, RecvWr::default()).is_err(),
        "a QP with an SRQ takes no RQ posts"
    );
    sim.dev(1).modify_srq(srq, None, Some(4)).unwrap();
    let (src, skey) = sim.reg(0, ep[0].pd, 64, LW);
    for i in 0..5 {
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(i, SendOp::Send, sge(src, 64, skey)))
            .unwrap();
    }
    sim.settle(1000);
    assert_eq!(sim.poll_all(1, ep[1].cq).len(), 5);
    assert_eq!(
        events(&mut sim, 1),
        vec![AsyncEvent::SrqLimitReached { srqn: srq }]
    );
    assert_eq!(
        sim.dev(1).query_srq(srq).unwrap(),
        (1024, 4, 0, 3),
        "the limit disarms after firing"
    );
}

fn ud_qp(sim: &mut Sim, n: usize, qkey: u32, gsi: bool) -> (u32, u32, rxe_core::Qpn) {
    let d = sim.dev(n);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp_type = if gsi { QpType::Gsi } else { QpType::Ud };
    let qpn = d
        .create_qp(rxe_core::QpInit {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap,
            sq_sig_all: true,
        })
        .unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..Default::default()
    };
    d.modify_qp(
        qpn,
        &a,
        AttrMask(AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY),
    )
    .unwrap();
    a.qp_state = QpState::Rtr;
    d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE)).unwrap();
    a.qp_state = QpState::Rts;
    d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE | AttrMask::SQ_PSN))
        .unwrap();
    (pd, cq, qpn)
}

#[test]
fn ud_qkey_gsi_and_multicast() {
    let mut sim = Sim::new(15);
    let a = ud_qp(&mut sim, 0, 0x1111, false);
    let b = ud_qp(&mut sim, 1, 0x1111, false);
    let g = ud_qp(&mut sim, 1, 0, true);
    assert_eq!(g.2, rxe_core::Qpn::GSI);
    let (dst, dkey) = sim.reg(1, b.0, 200, LW);
    let (gdst, gkey) = sim.reg(1, g.0, 200, LW);
    sim.dev(1)
        .post_recv(
            b.2,
            RecvWr {
                wr_id: 1,
                sg_list: sge(dst, 100, dkey).into(),
            },
        )
        .unwrap();
    sim.dev(1)
        .post_recv(
            b.2,
            RecvWr {
                wr_id: 2,
                sg_list: sge(dst + 100, 100, dkey).into(),
            },
        )
        .unwrap();
    sim.dev(1)
        .post_recv(
            g.2,
            RecvWr {
                wr_id: 3,
                sg_list: sge(gdst, 100, gkey).into(),
            },
        )
        .unwrap();
    let av = Av {
        dgid: sim.nodes[1].gid,
        sgid_index: 0,
        hop_limit: 64,
        ..Default::default()
    };
    let send = |sim: &mut Sim, id, qpn, qkey, data: &[u8]| {
        let mut w = SendWr::new(id, SendOp::SendWithImm(id as u32), vec![]);
        w.flags |= SEND_INLINE;
        w.inline_data = data.to_vec();
        w.ud = Some(UdDest {
            av,
            remote_qpn: qpn,
            remote_qkey: qkey,
        });
        sim.dev(0).post_send(a.2, w).unwrap();
    };
    send(&mut sim, 10, b.2, 0x2222, b"wrong qkey");
    send(&mut sim, 11, b.2, 0x1111, b"the right Q_Key here");
    send(&mut sim, 12, g.2, 0x8001_0000, b"to gsi");
    sim.settle(1000);
    assert_eq!(sim.poll_all(0, a.1).len(), 3);
    // The wrong Q_Key was dropped.
    let c = sim.poll_all(1, b.1);
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0].wr_id, c[0].imm_or_inv, c[0].byte_len),
        (1, 11, 40 + 20)
    );
    assert_eq!(
        sim.nodes[1].mem.slice(dst + 40, 20),
        b"the right Q_Key here"
    );
    assert_eq!(c[0].src_qp, a.2);
    let c = sim.poll_all(1, g.1);
    assert_eq!((c.len(), c[0].wr_id, c[0].qp_num), (1, 3, g.2));
    assert_eq!(sim.nodes[1].mem.slice(gdst + 40, 6), b"to gsi");
    // Multicast: two QPs on node 1 attached to one group both get a copy.
    let mgid = Gid::from_ipv4([239, 1, 2, 3]);
    let c2 = ud_qp(&mut sim, 1, 0x1111, false);
    sim.dev(1).attach_mcast(b.2, mgid).unwrap();
    sim.dev(1).attach_mcast(c2.2, mgid).unwrap();
    let (d2, k2) = sim.reg(1, c2.0, 100, LW);
    sim.dev(1)
        .post_recv(
            c2.2,
            RecvWr {
                wr_id: 4,
                sg_list: sge(d2, 100, k2).into(),
            },
        )
        .unwrap();
    let mut w = SendWr::new(20, SendOp::Send, vec![]);
    w.flags |= SEND_INLINE;
    w.inline_data = b"hello group".to_vec();
    w.ud = Some(UdDest {
        av: Av { dgid: mgid, ..av },
        remote_qpn: rxe_core::Qpn::MULTICAST,
        remote_qkey: 0x1111,
    });
    sim.dev(0).post_send(a.2, w).unwrap();
    sim.settle(1000);
    assert_eq!(sim.poll_all(1, b.1).len(), 1);
    assert_eq!(sim.poll_all(1, c2.1).len(), 1);
    assert_eq!(sim.nodes[1].mem.slice(d2 + 40, 11), b"hello group");
    sim.dev(1).detach_mcast(b.2, mgid).unwrap();
    assert!(sim.dev(1).detach_mcast(b.2, mgid).is_err());
}

#[test]
fn atomic_write_and_flush() {
    let mut sim = Sim::new(16);
    let access = ALL.union(Access::FLUSH_GLOBAL);
    // The QPs allow both placement types (as pyverbs' extended QPs do); the MR only global.
    let ep = sim.connect(ConnOpts {
        access: ConnOpts::default()
            .access
            .union(Access::FLUSH_GLOBAL)
            .union(Access::FLUSH_PERSISTENT),
        ..Default::default()
    });
    let (dst, dkey) = sim.reg(1, ep[1].pd, 64, access);
    let (src, skey) = sim.reg(0, ep[0].pd, 8, LW);
    sim.nodes[0]
        .mem
        .slice_mut(src, 8)
        .copy_from_slice(&0x0102030405060708u64.to_le_bytes());
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::AtomicWrite {
                    remote_addr: dst + 8,
                    rkey: dkey,
                },
                sge(src, 8, skey),
            ),
        )
        .unwrap();
    let flush = SendOp::Flush {
        remote_addr: dst,
        rkey: dkey,
        len: 64,
        selectivity: 0,
        placement: 1,
    };
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(2, flush, vec![]))
        .unwrap();
    let flush = SendOp::Flush {
        remote_addr: dst,
        rkey: dkey,
        len: 64,
        selectivity: 0,
        placement: 2,
    };
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(3, flush, vec![]))
        .unwrap();
    sim.settle(1000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(
        statuses(&c),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::RemAccessErr)
        ]
    );
    assert_eq!(c[1].opcode, WcOpcode::Flush);
    assert_eq!(
        sim.nodes[1].mem.slice(dst + 8, 8),
        &0x0102030405060708u64.to_le_bytes()
    );
}

#[test]
fn sqd_drains_and_notifies() {
    let mut sim = Sim::new(17);
    let ep = sim.connect(ConnOpts::default());
    let (buf, key) = sim.reg(1, ep[1].pd, 8192, ALL);
    let (src, skey) = sim.reg(0, ep[0].pd, 8192, LW);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: buf,
                    rkey: key,
                },
                sge(src, 8192, skey),
            ),
        )
        .unwrap();
    sim.step();
    let a = QpAttr {
        qp_state: QpState::Sqd,
        en_sqd_async_notify: true,
        ..Default::default()
    };
    sim.dev(0)
        .modify_qp(
            ep[0].qpn,
            &a,
            AttrMask(AttrMask::STATE | AttrMask::EN_SQD_ASYNC_NOTIFY),
        )
        .unwrap();
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: buf,
                    rkey: key,
                },
                sge(src, 8, skey),
            ),
        )
        .unwrap();
    sim.settle(10_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::Success)],
        "WR 2 waits in SQD"
    );
    assert!(events(&mut sim, 0).contains(&AsyncEvent::SqDrained { qpn: ep[0].qpn }));
    let a = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    sim.dev(0)
        .modify_qp(ep[0].qpn, &a, AttrMask(AttrMask::STATE))
        .unwrap();
    sim.settle(10_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(2, WcStatus::Success)]
    );
}

#[test]
fn armed_cq_raises_one_completion_event() {
    let mut sim = Sim::new(18);
    let ep = sim.connect(ConnOpts::default());
    let (buf, key) = sim.reg(1, ep[1].pd, 64, ALL);
    sim.dev(0).req_notify_cq(ep[0].cq, false).unwrap();
    for i in 0..3 {
        sim.dev(0)
            .post_send(
                ep[0].qpn,
                SendWr::new(
                    i,
                    SendOp::Write {
                        remote_addr: buf,
                        rkey: key,
                    },
                    vec![],
                ),
            )
            .unwrap();
    }
    sim.settle(1000);
    let ev: Vec<_> = events(&mut sim, 0)
        .into_iter()
        .filter(|e| matches!(e, AsyncEvent::Completion { .. }))
        .collect();
    assert_eq!(ev, vec![AsyncEvent::Completion { cqn: ep[0].cq }]);
}

#[test]
fn a_failed_wqe_completes_in_order_and_errors_the_qp() {
    let mut sim = Sim::new(19);
    let ep = sim.connect(ConnOpts::default());
    let (buf, key) = sim.reg(1, ep[1].pd, 64, ALL);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: buf,
                    rkey: key,
                },
                vec![],
            ),
        )
        .unwrap();
    assert_eq!(sim.dev(0).sq_outstanding(ep[0].qpn), Some(1));
    sim.dev(0)
        .post_send_failed(ep[0].qpn, 2, WcOpcode::Send, WcStatus::LocQpOpErr)
        .unwrap();
    sim.settle(1000);
    // The WRITE in flight is flushed by the error, then the failed WR reports its status.
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(
        statuses(&c),
        vec![(1, WcStatus::WrFlushErr), (2, WcStatus::LocQpOpErr)]
    );
    assert_eq!(c[1].opcode, WcOpcode::Send);
    assert_eq!(sim.dev(0).qp(ep[0].qpn).unwrap().state(), QpState::Err);
    assert_eq!(sim.dev(0).sq_outstanding(ep[0].qpn), Some(0));
}

#[test]
fn staging_cq_has_no_limit_and_receives_report_solicited() {
    let mut sim = Sim::new(20);
    let ep = sim.connect(ConnOpts::default());
    let cq = sim.dev(1).create_staging_cq().unwrap();
    assert_eq!(sim.dev(1).cq_len(cq), 0);
    let (src, skey) = sim.reg(0, ep[0].pd, 8, LW);
    let (dst, dkey) = sim.reg(1, ep[1].pd, 16, LW);
    for i in 0..2 {
        sim.dev(1)
            .post_recv(
                ep[1].qpn,
                RecvWr {
                    wr_id: i,
                    sg_list: sge(dst, 16, dkey).into(),
                },
            )
            .unwrap();
        let mut w = SendWr::new(i, SendOp::Send, sge(src, 8, skey));
        if i == 1 {
            w.flags |= SEND_SOLICITED;
        }
        sim.dev(0).post_send(ep[0].qpn, w).unwrap();
    }
    sim.settle(1000);
    let c = sim.poll_all(1, ep[1].cq);
    assert_eq!(
        c.iter().map(|c| c.solicited).collect::<Vec<_>>(),
        vec![false, true]
    );
}

#[test]
fn a_lost_read_response_restarts_the_requester_once() {
    // 64 pipelined 64 KiB READs; every 200th response is lost. Each loss must send the
    // requester back once, not once per response of the burst that follows it.
    let cfg = rxe_core::DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut sim = Sim::with_config(23, cfg);
    sim.link[1].drop_every = 200;
    let ep = sim.connect(ConnOpts {
        mtu: Mtu::M4096,
        max_rd_atomic: 16,
        ..Default::default()
    });
    let (src, skey) = sim.reg(1, ep[1].pd, 65536, ALL);
    let (dst, dkey) = sim.reg(0, ep[0].pd, 65536, LW);
    for k in 0..64 {
        let wr = SendWr::new(
            k,
            SendOp::Read {
                remote_addr: src,
                rkey: skey,
            },
            sge(dst, 65536, dkey),
        );
        sim.dev(0).post_send(ep[0].qpn, wr).unwrap();
    }
    sim.settle(1_000_000);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(c.len(), 64);
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    let lost = sim.stats[1].lost;
    let retransmits = sim.dev(0).qp_counters(ep[0].qpn).unwrap().retransmits;
    assert!(lost > 0);
    assert!(
        retransmits <= lost,
        "{retransmits} restarts for {lost} lost responses"
    );
}

#[test]
fn type1_window_bound_by_a_work_request_as_librxe_does() {
    let mut sim = Sim::new(24);
    let ep = sim.connect(ConnOpts::default());
    let (mr, mrkey) = sim.reg(1, ep[1].pd, 4096, ALL);
    let mw = sim.dev(1).alloc_mw(ep[1].pd, MwType::Type1).unwrap();
    let new_rkey = (mw & !0xff) | ((mw + 1) & 0xff);
    let bind = SendOp::BindMw {
        mw_rkey: mw,
        new_rkey,
        mr_lkey: mrkey,
        addr: mr,
        length: 512,
        access: Access::REMOTE_READ,
    };
    sim.dev(1)
        .post_send(ep[1].qpn, SendWr::new(1, bind, vec![]))
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(1, WcStatus::Success)]
    );
    let (dst, dkey) = sim.reg(0, ep[0].pd, 512, LW);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                2,
                SendOp::Read {
                    remote_addr: mr,
                    rkey: new_rkey,
                },
                sge(dst, 512, dkey),
            ),
        )
        .unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(2, WcStatus::Success)]
    );
}

#[test]
fn a_fenced_request_waits_for_earlier_reads() {
    let mut sim = Sim::new(25);
    sim.link[0].delay_ns = 50_000;
    sim.link[1].delay_ns = 50_000;
    sim.trace = Some(Vec::new());
    let ep = sim.connect(ConnOpts::default());
    let (remote, rkey) = sim.reg(1, ep[1].pd, 4096, ALL);
    let (local, lkey) = sim.reg(0, ep[0].pd, 4096, LW);
    let read = SendOp::Read {
        remote_addr: remote,
        rkey,
    };
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, read, sge(local, 4096, lkey)))
        .unwrap();
    let mut w = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: remote,
            rkey,
        },
        sge(local, 64, lkey),
    );
    w.flags |= SEND_FENCE;
    sim.dev(0).post_send(ep[0].qpn, w).unwrap();
    sim.settle(10_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    // On the wire: the WRITE leaves only after the last READ response arrived.
    let t = sim.trace.take().unwrap();
    let op = |x: &Traced| {
        rxe_core::wire::Packet::new_checked(&x.bytes[..])
            .unwrap()
            .opcode()
    };
    let last_resp = t
        .iter()
        .filter(|x| op(x) == rxe_core::wire::Opcode::RC_RDMA_READ_RESPONSE_LAST)
        .map(|x| x.at)
        .max()
        .unwrap();
    let write = t
        .iter()
        .find(|x| op(x) == rxe_core::wire::Opcode::RC_RDMA_WRITE_ONLY)
        .unwrap()
        .at;
    assert!(
        write >= last_resp.plus_ns(50_000),
        "WRITE at {write:?}, last READ response sent at {last_resp:?}"
    );
    // Without the fence the WRITE would have followed the READ request at once.
}

/// `retry_cnt = 7` is seven retries (IBTA): a SEND to a peer that has gone is sent eight times
/// and completes with RetryExcErr, which is how an interop run whose peer exited after the last
/// ACK was lost ends. Linux rxe's "7 = for ever" is a device option.
#[test]
fn retry_cnt_7_is_seven_retries_unless_configured_infinite() {
    for infinite in [false, true] {
        let cfg = rxe_core::DeviceConfig {
            infinite_retry_cnt: infinite,
            ..Default::default()
        };
        let mut sim = Sim::with_config(11, cfg);
        sim.link[0].loss_ppm = 1_000_000;
        let ep = sim.connect(ConnOpts {
            retry_cnt: 7,
            timeout: 8,
            ..Default::default()
        });
        let (src, skey) = sim.reg(0, ep[0].pd, 64, LW);
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(1, SendOp::Send, sge(src, 64, skey)))
            .unwrap();
        if infinite {
            let qpn = ep[0].qpn;
            let retrying = sim.run_until(20_000, |s| {
                s.dev(0).qp_counters(qpn).unwrap().retransmits >= 20
            });
            assert!(retrying, "rxe semantics keep retrying past seven");
            assert!(statuses(&sim.poll_all(0, ep[0].cq)).is_empty());
        } else {
            sim.settle(20_000);
            let done = statuses(&sim.poll_all(0, ep[0].cq));
            let c = sim.dev(0).qp_counters(ep[0].qpn).unwrap();
            assert_eq!(done, vec![(1, WcStatus::RetryExcErr)]);
            assert_eq!(c.retransmits, 7, "seven retries after the first send");
            assert_eq!(c.timeouts, 8);
        }
    }
}

/// A receiver that posts late: every RNR NAK of a burst's head is followed by a sequence NAK
/// for the rest of the burst. With retry_cnt 7 finite (IBTA) those must not use up retries,
/// or an RNR-only stall ends in RetryExcErr although rnr_retry 7 means "for ever".
#[test]
fn sequence_naks_behind_an_rnr_nak_spend_no_retries() {
    let mut sim = Sim::new(8);
    let ep = sim.connect(ConnOpts {
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 1,
        ..Default::default()
    });
    let (src, skey) = sim.reg(0, ep[0].pd, 4 * 64, LW);
    for i in 0..4u64 {
        sim.dev(0)
            .post_send(
                ep[0].qpn,
                SendWr::new(i + 1, SendOp::Send, sge(src + 64 * i, 64, skey)),
            )
            .unwrap();
    }
    let qpn = ep[0].qpn;
    let stalled = sim.run_until(200_000, |s| {
        let c = s.dev(0).qp_counters(qpn).unwrap();
        c.rnr_naks_received >= 12 && c.naks_received >= 12
    });
    assert!(stalled, "RNR NAKs and sequence NAKs, round after round");
    assert!(
        sim.poll_all(0, ep[0].cq).is_empty(),
        "nothing completed yet"
    );
    let (dst, dkey) = sim.reg(1, ep[1].pd, 4 * 64, LW);
    for i in 0..4u64 {
        sim.dev(1)
            .post_recv(
                ep[1].qpn,
                RecvWr {
                    wr_id: 10 + i,
                    sg_list: sge(dst + 64 * i, 64, dkey).into(),
                },
            )
            .unwrap();
    }
    sim.settle(100_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        (1..=4).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
}

/// A REG_MR's page list counts against its QP (`Device::sq_reg_mr_bytes`) from the post until
/// the WQE executes (the list moves into the MR) or leaves the send queue unexecuted (flush).
#[test]
fn reg_mr_page_lists_are_held_until_executed_or_flushed() {
    let mut sim = Sim::new(17);
    let ep = sim.connect(ConnOpts::default());
    let page = (sim.alloc(1, 3 * 4096) + 4095) & !4095;
    let mr = sim.dev(1).alloc_mr(ep[1].pd, 4).unwrap();
    let reg = |key: u32, lkey: u32| SendOp::RegMr {
        lkey,
        key,
        access: LW,
        iova: 0x5000_0000,
        length: 8192,
        page_shift: 12,
        page_offset: 0,
        pages: vec![page, page + 4096],
    };
    let qpn = ep[1].qpn;
    assert_eq!(sim.dev(1).sq_reg_mr_bytes(qpn), Some(0));
    let key = (mr & !0xff) | 0x21;
    sim.dev(1)
        .post_send(qpn, SendWr::new(1, reg(key, mr), vec![]))
        .unwrap();
    assert_eq!(sim.dev(1).sq_reg_mr_bytes(qpn), Some(16));
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(
        sim.dev(1).sq_reg_mr_bytes(qpn),
        Some(0),
        "moved into the MR"
    );
    // Posted, then the QP goes to ERR before it runs: flushed, and the list is dropped.
    sim.dev(1)
        .post_send(qpn, SendWr::new(2, reg(key + 1, key), vec![]))
        .unwrap();
    assert_eq!(sim.dev(1).sq_reg_mr_bytes(qpn), Some(16));
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    sim.dev(1)
        .modify_qp(qpn, &err, AttrMask(AttrMask::STATE))
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(2, WcStatus::WrFlushErr)]
    );
    assert_eq!(sim.dev(1).sq_reg_mr_bytes(qpn), Some(0), "flushed");
    // Posted to a QP in ERR: flushed at once.
    sim.dev(1)
        .post_send(qpn, SendWr::new(3, reg(key + 2, key), vec![]))
        .unwrap();
    assert_eq!(sim.dev(1).sq_reg_mr_bytes(qpn), Some(0));
}
