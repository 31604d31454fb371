//! Fast registration, memory windows of type 1, CQ resizing, the GSI QP, SRQ modification and
//! the SQ consumer index, end to end: two daemons on loopback UDP, two test guests.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{one, pair, T};
use rxe_core::verbs::*;
use rxe_core::{Gid, Qpn};
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

/// Polls `probe` until it reports that the condition holds; after `T`, fails saying what it
/// waited for and what it saw last.
fn wait_for(what: &str, mut probe: impl FnMut() -> (bool, String)) {
    let end = std::time::Instant::now() + T;
    loop {
        let (done, seen) = probe();
        if done {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "waited {T:?} for {what}; last seen: {seen}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The sum of `key` over every QP in a counters document.
fn qp_sum(json: &str, key: &str) -> u64 {
    let pat = format!("\"{key}\":");
    json.match_indices(&pat)
        .filter_map(|(i, _)| {
            let v = &json[i + pat.len()..];
            v[..v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len())]
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn write_wr(wr_id: u64, src: &Mr, len: u32, remote_addr: u64, rkey: u32) -> SendWr {
    let mut wr = SendWr::new(
        wr_id,
        SendOp::Write { remote_addr, rkey },
        vec![src.sge(0, len)],
    );
    wr.flags = SEND_SIGNALED;
    wr
}

/// REG_MR is kernel-only: on a QP created without CREATE_QP_KERNEL (a ring librxe maps for
/// any process) it completes with LOC_QP_OP_ERR before the device reads its page list, and
/// so does a REG_MR naming an MR that is not a fast-registration MR of the QP's PD or whose
/// page list is longer than the MR's max_num_sg.
#[test]
fn reg_mr_only_from_kernel_qps_and_checked_before_the_page_list() {
    let (mut a, mut b) = pair();
    for case in 0..3 {
        b.guest.kernel_qps = case != 0;
        let (_ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
        let lkey = b.guest.alloc_mr(eb.pd, 2).unwrap();
        let target = b.guest.alloc_buf(4 * 4096).unwrap();
        let (key, npages) = match case {
            // user QP, otherwise valid
            0 => ((lkey & !0xff) | 0x11, 2),
            // kernel QP, three pages into an MR allocated for two
            1 => ((lkey & !0xff) | 0x12, 3),
            // kernel QP, an lkey that is no fast-registration MR
            _ => (0x00ab_cd00, 2),
        };
        let mr_lkey = if case == 2 { key } else { lkey };
        b.guest
            .post_reg_mr(
                &eb.qp,
                9,
                mr_lkey,
                key,
                ALL,
                0x1000,
                npages as u64 * 4096,
                &target.pages[..npages],
                None,
            )
            .unwrap();
        let w = one(&mut b.guest, &eb.cq);
        assert_eq!(
            (w.wr_id, w.status),
            (9, WcStatus::LocQpOpErr as u32),
            "case {case}: {w:?}"
        );
    }
}

/// ALLOC_MR + a REG_MR work request map guest pages under a new key; the peer writes through
/// that key; LOCAL_INV revokes it and the next remote write is a remote access error.
#[test]
fn fast_registration_remote_write_then_local_invalidate() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, 8192, ALL).unwrap();
    let lkey = b.guest.alloc_mr(eb.pd, 16).unwrap();
    // Two scattered pages, mapped at an IOVA of our choosing (not their address).
    let target = b.guest.alloc_buf(8192).unwrap();
    let iova = 0x7000_0000_1000u64;
    let key = (lkey & !0xff) | 0x5c;
    b.guest
        .post_reg_mr(&eb.qp, 7, lkey, key, ALL, iova, 8192, &target.pages, None)
        .unwrap();
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!(
        (w.status, w.opcode, w.wr_id),
        (0, WcOpcode::RegMr as u32, 7)
    );

    // A write that straddles the two pages, through the new key.
    let data = rxe_core::sim::prng_pattern(121, 6000);
    src.buf.write(0, &data);
    a.guest
        .post_send(&ea.qp, &write_wr(1, &src, 6000, iova + 1000, key))
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(target.to_vec(1000, 6000), data);

    let mut inv = SendWr::new(8, SendOp::LocalInv { rkey: key }, vec![]);
    inv.flags = SEND_SIGNALED;
    b.guest.post_send(&eb.qp, &inv).unwrap();
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!((w.status, w.opcode), (0, WcOpcode::LocalInv as u32));

    a.guest
        .post_send(&ea.qp, &write_wr(2, &src, 16, iova, key))
        .unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!(w.status, WcStatus::RemAccessErr as u32, "{w:?}");
}

/// RESIZE_CQ to a larger ring with unconsumed completions in it keeps them, in order, and
/// new completions continue in the new ring; shrinking below the unconsumed count fails and
/// leaves the CQ working.
#[test]
fn resize_cq_grow_with_entries_in_flight_and_shrink_below_count() {
    let (mut a, mut b) = pair();
    let o = ConnOpts {
        cqe: 15,
        ..Default::default()
    };
    let (mut ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let src = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let dst = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    let post = |g: &mut Guest, qp: &Qp, id: u64| {
        g.post_send(qp, &write_wr(id, &src, 64, dst.addr(0), dst.rkey))
            .unwrap();
    };
    for id in 0..10 {
        post(&mut a.guest, &ea.qp, id);
    }
    // Wait until all ten are in the ring, without consuming them.
    let end = std::time::Instant::now() + T;
    while ea.cq.ring.producer().load(Ordering::Acquire) != 10 {
        assert!(
            std::time::Instant::now() < end,
            "completions did not arrive"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // Armed before the resize: the arm moves with the CQ (the missed-event check says the
    // ring is not empty, as the ten entries are still there).
    assert!(a.guest.req_notify_cq(&ea.cq, false));
    a.guest.resize_cq(&mut ea.cq, 63).unwrap();
    assert_eq!(ea.cq.cqe, 63);
    assert_eq!(
        ea.cq.ring.notify().load(Ordering::Acquire),
        abi::ring::NOTIFY_NEXT_COMP,
        "the notify word is kept"
    );
    // A CQ of more slots than any CQ may have is refused, as at CREATE_CQ.
    let max = a.guest.config.max_cqe;
    assert!(matches!(
        a.guest.resize_cq(&mut ea.cq, max + 1),
        Err(Error::Status(abi::Status::Invalid))
    ));
    for id in 10..20 {
        post(&mut a.guest, &ea.qp, id);
    }
    let w = a.guest.wait_cq(&ea.cq, 20, T);
    let ids: Vec<u64> = w.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    assert!(w.iter().all(|w| w.status == 0));

    // Ten unconsumed entries do not fit a ring of 7.
    for id in 20..30 {
        post(&mut a.guest, &ea.qp, id);
    }
    while ea.cq.ring.producer().load(Ordering::Acquire) != 30 {
        assert!(
            std::time::Instant::now() < end,
            "completions did not arrive"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(matches!(
        a.guest.resize_cq(&mut ea.cq, 7),
        Err(Error::Status(abi::Status::Invalid))
    ));
    let w = a.guest.wait_cq(&ea.cq, 10, T);
    assert_eq!(
        w.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (20..30).collect::<Vec<_>>()
    );
}

/// QP1 (GSI) on both sides: a UD send to QPN 1 with Q_Key 0x80010000 arrives with the GRH
/// area and the source QPN 1; a send with another Q_Key is dropped by the receiver.
#[test]
fn gsi_qp1_send_and_receive_with_the_gsi_qkey() {
    let (mut a, mut b) = pair();
    let mk = |n: &mut Node| {
        let pd = n.guest.alloc_pd().unwrap();
        let cq = n.guest.create_cq(63).unwrap();
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 64,
        };
        let qp = n
            .guest
            .create_qp(QpType::Gsi, pd, &cq, &cq, None, cap)
            .unwrap();
        assert_eq!(qp.qpn, 1, "the GSI QP is QPN 1");
        let mut attr = QpAttr {
            qp_state: QpState::Init,
            qkey: 0x8001_0000,
            ..Default::default()
        };
        // Exactly the masks of Linux's MAD layer (ib_mad_change_qp_state_to_rts): no PORT.
        n.guest
            .modify_qp(
                &qp,
                &attr,
                AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::QKEY,
            )
            .unwrap();
        attr.qp_state = QpState::Rtr;
        n.guest.modify_qp(&qp, &attr, AttrMask::STATE).unwrap();
        attr.qp_state = QpState::Rts;
        n.guest
            .modify_qp(&qp, &attr, AttrMask::STATE | AttrMask::SQ_PSN)
            .unwrap();
        (pd, cq, qp)
    };
    let (pa, cqa, qpa) = mk(&mut a);
    let (pb, cqb, qpb) = mk(&mut b);
    let src = a.guest.reg_mr(pa, 4096, ALL).unwrap();
    let dst = b.guest.reg_mr(pb, 4096, ALL).unwrap();
    for i in 0..2 {
        b.guest
            .post_recv(
                &qpb,
                &RecvWr {
                    wr_id: 50 + i,
                    sg_list: vec![dst.sge(0, 4096)].into(),
                },
            )
            .unwrap();
    }
    let send = |g: &mut Guest, id: u64, qkey: u32, dgid: Gid| {
        src.buf.write(0, b"a MAD, more or less");
        let mut wr = SendWr::new(id, SendOp::Send, vec![src.sge(0, 19)]);
        wr.flags = SEND_SIGNALED;
        wr.ud = Some(UdDest {
            av: Av {
                dgid,
                sgid_index: 0,
                hop_limit: 64,
                ..Default::default()
            },
            remote_qpn: Qpn(1),
            remote_qkey: qkey,
        });
        g.post_send(&qpa, &wr).unwrap();
    };
    // QP1 always sends the GSI Q_Key, whatever the WR says (as rxe: `req.rs` puts GSI_QKEY in
    // the DETH of every QP1 send), so both arrive, in order.
    send(&mut a.guest, 1, 0x1234, b.gid);
    assert_eq!(one(&mut a.guest, &cqa).status, 0);
    send(&mut a.guest, 2, 0x8001_0000, b.gid);
    assert_eq!(one(&mut a.guest, &cqa).status, 0);
    for wr_id in [50, 51] {
        let w = one(&mut b.guest, &cqb);
        assert_eq!((w.status, w.wr_id), (0, wr_id));
        assert_eq!(w.src_qp, 1);
        assert_eq!(w.byte_len, 40 + 19);
        assert_ne!(w.wc_flags & WC_GRH, 0);
    }
    assert_eq!(dst.buf.to_vec(40, 19), b"a MAD, more or less");
    assert!(b.guest.poll_cq(&cqb, 1).is_empty());
    let _ = (pa, qpb);
}

/// A type 1 window bound with the BIND_MW command: a remote READ inside it succeeds, one
/// that runs past its end is a remote access error.
#[test]
fn type1_window_bound_by_command_read_inside_and_outside() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let mr = b
        .guest
        .reg_mr(eb.pd, 8192, ALL.union(Access::MW_BIND))
        .unwrap();
    let pattern = rxe_core::sim::prng_pattern(317, 8192);
    mr.buf.write(0, &pattern);
    let mw = b.guest.alloc_mw(eb.pd, 1).unwrap();
    let rkey = b
        .guest
        .bind_mw_type1(
            &eb.qp,
            mw,
            mr.lkey,
            mr.addr(4000),
            1024,
            Access::REMOTE_READ,
        )
        .unwrap();
    assert_ne!(rkey, mw, "a bind changes the key byte");
    assert_eq!(rkey & !0xff, mw & !0xff);
    // Binding outside the MR fails.
    assert!(b
        .guest
        .bind_mw_type1(
            &eb.qp,
            rkey,
            mr.lkey,
            mr.addr(8000),
            1024,
            Access::REMOTE_READ
        )
        .is_err());

    let sink = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let mut rd = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: mr.addr(4100),
            rkey,
        },
        vec![sink.sge(0, 512)],
    );
    rd.flags = SEND_SIGNALED;
    a.guest.post_send(&ea.qp, &rd).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(sink.buf.to_vec(0, 512), &pattern[4100..4612]);

    // 4000 + 1024 = 5024 is the end of the window: 4900 + 200 runs past it.
    let mut rd = SendWr::new(
        2,
        SendOp::Read {
            remote_addr: mr.addr(4900),
            rkey,
        },
        vec![sink.sge(0, 200)],
    );
    rd.flags = SEND_SIGNALED;
    a.guest.post_send(&ea.qp, &rd).unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!(w.status, WcStatus::RemAccessErr as u32, "{w:?}");
}

/// MODIFY_SRQ: the limit can be set (and arms SRQ_LIMIT_REACHED); MAX_WR is UNSUPPORTED there
/// (a new max_wr needs a new ring: RESIZE_SRQ, tests/verbs.rs).
#[test]
fn modify_srq_limit_yes_max_wr_no() {
    let (mut a, _b) = pair();
    let pd = a.guest.alloc_pd().unwrap();
    let srq = a.guest.create_srq(pd, 15, 1, 0).unwrap();
    a.guest.modify_srq(&srq, abi::SRQ_ATTR_LIMIT, 0, 4).unwrap();
    assert!(matches!(
        a.guest.modify_srq(&srq, abi::SRQ_ATTR_MAX_WR, 31, 0),
        Err(Error::Status(abi::Status::Unsupported))
    ));
    assert!(matches!(
        a.guest.modify_srq(&srq, abi::SRQ_ATTR_LIMIT, 0, 16),
        Err(Error::Status(abi::Status::Invalid))
    ));
}

/// The device takes at most max_send_wr WQEs off the SQ ring and the consumer index moves
/// as WQEs complete (rxe semantics), not when the device copies them.
#[test]
fn sq_consumer_index_follows_completions() {
    let (mut a, mut b) = pair();
    let o = ConnOpts {
        cap: QpCap {
            max_send_wr: 4,
            ..ConnOpts::default().cap
        },
        min_rnr_timer: 1,
        rnr_retry: 7,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let src = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let dst = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    // Seven SENDs (the ring has 8 slots) with no receive posted: RNR NAKs keep them
    // outstanding.
    for id in 0..7 {
        let mut wr = SendWr::new(id, SendOp::Send, vec![src.sge(0, 8)]);
        wr.flags = SEND_SIGNALED;
        a.guest.post_send(&ea.qp, &wr).unwrap();
    }
    // Wait until the device has taken max_send_wr (4) WQEs and the responder has refused at
    // least one with an RNR NAK: from then on the SENDs are provably outstanding.
    wait_for(
        "4 SQ WQEs taken by the device and an RNR NAK received",
        || {
            let c = a.daemon.counters().unwrap();
            let done = json_u64(&c, "device", "sq_wqes") == Some(4)
                && qp_sum(&c, "rnr_naks_received") >= 1;
            (done, c)
        },
    );
    let sq = ea.qp.sq.as_ref().unwrap();
    assert_eq!(
        sq.consumer().load(Ordering::Acquire),
        0,
        "nothing completed while the receiver has no receive posted"
    );
    assert!(a.guest.poll_cq(&ea.cq, 8).is_empty(), "no completion yet");
    let c = a.daemon.counters().unwrap();
    assert_eq!(
        json_u64(&c, "device", "sq_wqes"),
        Some(4),
        "the device takes no more than max_send_wr WQEs: {c}"
    );
    for i in 0..7 {
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: i,
                    sg_list: vec![dst.sge(0, 64)].into(),
                },
            )
            .unwrap();
    }
    let w = a.guest.wait_cq(&ea.cq, 7, T);
    assert_eq!(w.len(), 7);
    assert!(w.iter().all(|w| w.status == 0));
    assert_eq!(
        w.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        (0..7).collect::<Vec<_>>()
    );
    assert_eq!(sq.consumer().load(Ordering::Acquire), 7);
    assert_eq!(b.guest.wait_cq(&eb.cq, 7, T).len(), 7);
}

/// The RQ consumer index is the oldest receive not yet completed (rxe semantics), not the
/// device's read position: receives the device has taken but not completed keep their slots,
/// and a driver that has to complete the ring's receives itself (a dead device) knows where
/// they start.
#[test]
fn rq_consumer_index_follows_completions() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let dst = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    for i in 0..3 {
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: i,
                    sg_list: vec![dst.sge(i as usize * 64, 64)].into(),
                },
            )
            .unwrap();
    }
    let rq = eb.qp.rq.as_ref().unwrap();
    for n in 1..=3u32 {
        let mut wr = SendWr::new(n as u64, SendOp::Send, vec![src.sge(0, 8)]);
        wr.flags = SEND_SIGNALED;
        a.guest.post_send(&ea.qp, &wr).unwrap();
        assert_eq!(a.guest.wait_cq(&ea.cq, 1, T).len(), 1);
        assert_eq!(b.guest.wait_cq(&eb.cq, 1, T).len(), 1);
        let c = b.daemon.counters().unwrap();
        assert_eq!(
            json_u64(&c, "device", "rq_wqes"),
            Some(3),
            "the device took every posted receive at the first message: {c}"
        );
        assert_eq!(
            rq.consumer().load(Ordering::Acquire),
            n,
            "{n} receives completed, the rest still the device's"
        );
    }
}

/// A command sees the work posted before it: six UD SENDs whose doorbells wait on their ring
/// unkicked (a driver whose kicks the device suppressed), then RESIZE_CQ to one entry. The
/// device takes the doorbells before the command, the SENDs complete, and the resize is
/// refused because six completions do not fit one entry (rdma-core's test_resize_cq). Served
/// in the other order, the resize would succeed and the completions overflow the CQ.
#[test]
fn resize_cq_sees_the_sends_posted_before_it() {
    let (mut a, mut b) = pair();
    let o = ConnOpts {
        qp_type: QpType::Ud,
        cqe: 7,
        ..Default::default()
    };
    let (mut ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let s = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let mut wr = SendWr::new(0, SendOp::Send, vec![s.sge(0, 8)]);
    wr.ud = Some(ud_dest(b.gid, eb.qp.qpn, 0x1111_1111));
    let before = json_u64(&a.daemon.counters().unwrap(), "worker", "doorbells_first").unwrap();
    a.guest.kick_doorbells = false;
    for id in 0..6 {
        wr.wr_id = id;
        a.guest.post_send(&ea.qp, &wr).unwrap();
    }
    a.guest.kick_doorbells = true;
    assert!(
        matches!(
            a.guest.resize_cq(&mut ea.cq, 1),
            Err(Error::Status(abi::Status::Invalid))
        ),
        "a resize to one entry below six completions must be refused"
    );
    let w = a.guest.wait_cq(&ea.cq, 6, T);
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        (0..6).map(|i| (i, 0)).collect::<Vec<_>>()
    );
    let after = json_u64(&a.daemon.counters().unwrap(), "worker", "doorbells_first").unwrap();
    assert!(after > before, "doorbells_first {before} -> {after}");
}
