//! RC/UD operations end to end: two daemons on loopback UDP, two test guests driving them
//! through real vhost-user sockets and rings in memfd guest memory.

mod common;

use std::time::Duration;

use common::{one, pair, T};
use rxe_core::verbs::*;
use rxe_core::Qpn;
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

#[test]
fn send_with_imm_and_with_invalidate() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let s = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let r = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    // A second MR at b, to be invalidated remotely.
    let victim = b.guest.alloc_mw(eb.pd, 2).ok();
    for i in 0..2 {
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: 100 + i,
                    sg_list: vec![r.sge(0, 4096)].into(),
                },
            )
            .unwrap();
    }
    s.buf.write(0, b"imm!");
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(1, SendOp::SendWithImm(0xdead_beef), vec![s.sge(0, 4)]),
        )
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!(w.status, 0);
    assert_ne!(w.wc_flags & WC_WITH_IMM, 0);
    // imm_data is big-endian bytes in the CQE, as ibv_wc.imm_data.
    assert_eq!(u32::from_be_bytes(w.ex.to_le_bytes()), 0xdead_beef);
    assert_eq!(r.buf.to_vec(0, 4), b"imm!");

    // SEND with invalidate: the responder's type 2 window, bound first (a user MR cannot be
    // invalidated remotely, IBTA 10.6.7.2; that case is checked below).
    let mr = b
        .guest
        .reg_mr(eb.pd, 4096, ALL.union(Access::MW_BIND))
        .unwrap();
    let mw = victim.expect("alloc_mw");
    let rkey = (mw & !0xff) | 0x33;
    b.guest
        .post_send(
            &eb.qp,
            &SendWr::new(
                5,
                SendOp::BindMw {
                    mw_rkey: mw,
                    new_rkey: rkey,
                    mr_lkey: mr.lkey,
                    addr: mr.addr(0),
                    length: 4096,
                    access: Access::REMOTE_WRITE,
                },
                vec![],
            ),
        )
        .unwrap();
    assert_eq!(one(&mut b.guest, &eb.cq).status, 0);
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(2, SendOp::SendWithInv(rkey), vec![s.sge(0, 4)]),
        )
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!(w.status, 0, "{w:?}");
    assert_ne!(w.wc_flags & WC_WITH_INV, 0);
    assert_eq!(w.ex, rkey);
    // The window is invalid now: a WRITE through it is a remote access error.
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                3,
                SendOp::Write {
                    remote_addr: mr.addr(0),
                    rkey,
                },
                vec![s.sge(0, 4)],
            ),
        )
        .unwrap();
    assert_eq!(
        one(&mut a.guest, &ea.cq).status,
        WcStatus::RemAccessErr as u32
    );
}

#[test]
fn write_with_imm_read_and_atomics() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let la = a.guest.reg_mr(ea.pd, 65536, ALL).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 65536, ALL).unwrap();
    let data: Vec<u8> = (0..20000u32).map(|i| (i % 251) as u8).collect();
    la.buf.write(0, &data);
    // WRITE (multi-packet, 1024 MTU).
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: rb.addr(100),
                    rkey: rb.rkey,
                },
                vec![la.sge(0, 20000)],
            ),
        )
        .unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!((w.status, w.opcode), (0, WcOpcode::RdmaWrite as u32));
    assert_eq!(rb.buf.to_vec(100, 20000), data);
    // WRITE with immediate consumes a receive WQE.
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 9,
                sg_list: vec![].into(),
            },
        )
        .unwrap();
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                2,
                SendOp::WriteWithImm {
                    remote_addr: rb.addr(0),
                    rkey: rb.rkey,
                    imm: 77,
                },
                vec![la.sge(0, 8)],
            ),
        )
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (9, 0, WcOpcode::RecvRdmaWithImm as u32)
    );
    assert_eq!(u32::from_be_bytes(w.ex.to_le_bytes()), 77);
    // READ back into another place.
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                3,
                SendOp::Read {
                    remote_addr: rb.addr(100),
                    rkey: rb.rkey,
                },
                vec![la.sge(30000, 20000)],
            ),
        )
        .unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!(
        (w.status, w.opcode, w.byte_len),
        (0, WcOpcode::RdmaRead as u32, 20000)
    );
    assert_eq!(la.buf.to_vec(30000, 20000), data);
    // Atomics on an 8-byte word.
    rb.buf.write(40000, &5u64.to_le_bytes());
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                4,
                SendOp::CompSwap {
                    remote_addr: rb.addr(40000),
                    rkey: rb.rkey,
                    compare: 5,
                    swap: 11,
                },
                vec![la.sge(60000, 8)],
            ),
        )
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(la.buf.u64_at(60000), 5, "CMP_SWP returns the original");
    assert_eq!(rb.buf.u64_at(40000), 11);
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                5,
                SendOp::FetchAdd {
                    remote_addr: rb.addr(40000),
                    rkey: rb.rkey,
                    add: 31,
                },
                vec![la.sge(60008, 8)],
            ),
        )
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(la.buf.u64_at(60008), 11);
    assert_eq!(rb.buf.u64_at(40000), 42);
}

#[test]
fn ud_send_with_inline_av_and_with_ah() {
    let (mut a, mut b) = pair();
    let o = ConnOpts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let s = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let r = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    s.buf.write(0, b"datagram");
    for i in 0..2 {
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: i,
                    sg_list: vec![r.sge(i as usize * 1024, 1024)].into(),
                },
            )
            .unwrap();
    }
    let av = Av {
        dgid: b.gid,
        sgid_index: 0,
        hop_limit: 64,
        ..Default::default()
    };
    let mut wr = SendWr::new(1, SendOp::Send, vec![s.sge(0, 8)]);
    wr.ud = Some(UdDest {
        av,
        remote_qpn: Qpn(eb.qp.qpn),
        remote_qkey: 0x1111_1111,
    });
    a.guest.post_send(&ea.qp, &wr).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!((w.status, w.byte_len, w.src_qp), (0, 40 + 8, ea.qp.qpn));
    assert_ne!(w.wc_flags & WC_GRH, 0);
    assert_eq!(
        r.buf.to_vec(40, 8),
        b"datagram",
        "payload after the 40-byte GRH"
    );
    // Through an address handle.
    let ah = a.guest.create_ah(ea.pd, &av).unwrap();
    wr.wr_id = 2;
    a.guest.post_send_ah(&ea.qp, &wr, ah).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!((w.wr_id, w.status), (1, 0));
    assert_eq!(r.buf.to_vec(1024 + 40, 8), b"datagram");
}

#[test]
fn srq_feeds_two_qps() {
    let (mut a, mut b) = pair();
    let o = ConnOpts::default();
    let pa = a.guest.alloc_pd().unwrap();
    let pb = b.guest.alloc_pd().unwrap();
    let ca = a.guest.create_cq(255).unwrap();
    let cb = b.guest.create_cq(255).unwrap();
    let srq = b.guest.create_srq(pb, 64, 2, 0).unwrap();
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..2 {
        qa.push(
            a.guest
                .create_qp(QpType::Rc, pa, &ca, &ca, None, o.cap)
                .unwrap(),
        );
        let cap = QpCap {
            max_recv_wr: 0,
            max_recv_sge: 0,
            ..o.cap
        };
        qb.push(
            b.guest
                .create_qp(QpType::Rc, pb, &cb, &cb, Some(&srq), cap)
                .unwrap(),
        );
    }
    for i in 0..2 {
        bring_up(&mut a.guest, &qa[i], b.gid, qb[i].qpn, &o).unwrap();
        bring_up(&mut b.guest, &qb[i], a.gid, qa[i].qpn, &o).unwrap();
    }
    let s = a.guest.reg_mr(pa, 4096, ALL).unwrap();
    let r = b.guest.reg_mr(pb, 8192, ALL).unwrap();
    for i in 0..4u64 {
        b.guest
            .post_srq_recv(
                &srq,
                &RecvWr {
                    wr_id: 10 + i,
                    sg_list: vec![r.sge(i as usize * 2048, 2048)].into(),
                },
            )
            .unwrap();
    }
    for (i, q) in qa.iter().enumerate() {
        s.buf.write(i * 16, format!("to qp {i}").as_bytes());
        a.guest
            .post_send(
                q,
                &SendWr::new(i as u64, SendOp::Send, vec![s.sge(i * 16, 7)]),
            )
            .unwrap();
    }
    assert_eq!(a.guest.wait_cq(&ca, 2, T).len(), 2);
    let w = b.guest.wait_cq(&cb, 2, T);
    assert_eq!(w.len(), 2);
    let mut qpns: Vec<u32> = w.iter().map(|w| w.qp_num).collect();
    qpns.sort_unstable();
    let mut want: Vec<u32> = qb.iter().map(|q| q.qpn).collect();
    want.sort_unstable();
    assert_eq!(
        qpns, want,
        "one message on each QP, both from the shared SRQ"
    );
    assert!(w
        .iter()
        .all(|w| w.status == 0 && (10..14).contains(&w.wr_id)));
}

/// RESIZE_SRQ: the receives the device has not taken move to the new ring, in order, and the
/// SRQ goes on feeding its QP from the new ring with the new max_wr; a max_wr below what is
/// outstanding is INVALID and leaves the old ring in use.
#[test]
fn resize_srq_moves_untaken_receives_in_order() {
    let (mut a, mut b) = pair();
    let o = ConnOpts::default();
    let pa = a.guest.alloc_pd().unwrap();
    let pb = b.guest.alloc_pd().unwrap();
    let ca = a.guest.create_cq(255).unwrap();
    let cb = b.guest.create_cq(255).unwrap();
    let mut srq = b.guest.create_srq(pb, 3, 1, 0).unwrap();
    let qa = a
        .guest
        .create_qp(QpType::Rc, pa, &ca, &ca, None, o.cap)
        .unwrap();
    let cap = QpCap {
        max_recv_wr: 0,
        max_recv_sge: 0,
        ..o.cap
    };
    let qb = b
        .guest
        .create_qp(QpType::Rc, pb, &cb, &cb, Some(&srq), cap)
        .unwrap();
    bring_up(&mut a.guest, &qa, b.gid, qb.qpn, &o).unwrap();
    bring_up(&mut b.guest, &qb, a.gid, qa.qpn, &o).unwrap();
    let s = a.guest.reg_mr(pa, 4096, ALL).unwrap();
    let r = b.guest.reg_mr(pb, 8 * 256, ALL).unwrap();
    let recv = |b: &mut Node, srq: &Srq, i: u64| {
        b.guest
            .post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: 10 + i,
                    sg_list: vec![r.sge(i as usize * 256, 256)].into(),
                },
            )
            .unwrap()
    };
    for i in 0..3 {
        recv(&mut b, &srq, i);
    }
    assert!(matches!(
        b.guest.resize_srq(&mut srq, 2),
        Err(Error::Status(abi::Status::Invalid))
    ));
    assert_eq!(b.guest.resize_srq(&mut srq, 15).unwrap(), 15);
    for i in 3..8 {
        recv(&mut b, &srq, i);
    }
    for i in 0..8u64 {
        s.buf
            .write(i as usize * 16, format!("message {i}").as_bytes());
        a.guest
            .post_send(
                &qa,
                &SendWr::new(i, SendOp::Send, vec![s.sge(i as usize * 16, 9)]),
            )
            .unwrap();
    }
    assert_eq!(a.guest.wait_cq(&ca, 8, T).len(), 8);
    let w = b.guest.wait_cq(&cb, 8, T);
    let ids: Vec<u64> = w.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (10..18).collect::<Vec<_>>(), "{w:?}");
    assert!(w.iter().all(|w| w.status == 0 && w.byte_len == 9));
    for i in 0..8 {
        assert_eq!(r.buf.to_vec(i * 256, 9), format!("message {i}").as_bytes());
    }
}

#[test]
fn memory_window_bind_and_remote_access() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let mr = b
        .guest
        .reg_mr(eb.pd, 8192, ALL.union(Access::MW_BIND))
        .unwrap();
    let mw = b.guest.alloc_mw(eb.pd, 2).unwrap();
    // Bind a type 2 window over [1024, 3072) of the MR with remote write.
    let new_rkey = (mw & !0xff) | 0x5a;
    b.guest
        .post_send(
            &eb.qp,
            &SendWr::new(
                1,
                SendOp::BindMw {
                    mw_rkey: mw,
                    new_rkey,
                    mr_lkey: mr.lkey,
                    addr: mr.addr(1024),
                    length: 2048,
                    access: Access::REMOTE_WRITE.union(Access::REMOTE_READ),
                },
                vec![],
            ),
        )
        .unwrap();
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!((w.status, w.opcode), (0, WcOpcode::BindMw as u32), "{w:?}");
    la.buf.write(0, b"through the window");
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: mr.addr(1500),
                    rkey: new_rkey,
                },
                vec![la.sge(0, 18)],
            ),
        )
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(mr.buf.to_vec(1500, 18), b"through the window");
    // Outside the window: remote access error, QP in error.
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                3,
                SendOp::Write {
                    remote_addr: mr.addr(3500),
                    rkey: new_rkey,
                },
                vec![la.sge(0, 18)],
            ),
        )
        .unwrap();
    assert_eq!(
        one(&mut a.guest, &ea.cq).status,
        WcStatus::RemAccessErr as u32
    );
}

#[test]
fn stream_of_10000_messages_byte_checked() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let s = a.guest.reg_mr(ea.pd, 256 * 512, ALL).unwrap();
    let r = b.guest.reg_mr(eb.pd, 256 * 512, ALL).unwrap();
    const N: u64 = 10_000;
    const SZ: usize = 500;
    let depth = 128u64;
    let pattern = |i: u64, k: usize| (i as usize * 31 + k * 7) as u8;
    let mut posted_r = 0u64;
    let mut posted_s = 0u64;
    let mut done_s = 0u64;
    let mut done_r = 0u64;
    let end = std::time::Instant::now() + Duration::from_secs(120);
    while done_r < N {
        assert!(
            std::time::Instant::now() < end,
            "stream stalled at {done_r}"
        );
        while posted_r < N && posted_r - done_r < depth {
            let slot = (posted_r % 256) as usize * 512;
            b.guest
                .post_recv(
                    &eb.qp,
                    &RecvWr {
                        wr_id: posted_r,
                        sg_list: vec![r.sge(slot, 512)].into(),
                    },
                )
                .unwrap();
            posted_r += 1;
        }
        while posted_s < N && posted_s - done_s < depth && posted_s < posted_r {
            let slot = (posted_s % 256) as usize * 512;
            let msg: Vec<u8> = (0..SZ).map(|k| pattern(posted_s, k)).collect();
            s.buf.write(slot, &msg);
            a.guest
                .post_send(
                    &ea.qp,
                    &SendWr::new(posted_s, SendOp::Send, vec![s.sge(slot, SZ as u32)]),
                )
                .unwrap();
            posted_s += 1;
        }
        for w in a.guest.poll_cq(&ea.cq, 64) {
            assert_eq!((w.status, w.wr_id), (0, done_s));
            done_s += 1;
        }
        for w in b.guest.poll_cq(&eb.cq, 64) {
            assert_eq!((w.status, w.wr_id, w.byte_len), (0, done_r, SZ as u32));
            let slot = (done_r % 256) as usize * 512;
            let got = r.buf.to_vec(slot, SZ);
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(k, &v)| v == pattern(done_r, k)),
                "message {done_r} corrupted"
            );
            done_r += 1;
        }
    }
    let c = b.daemon.counters().unwrap();
    assert!(json_u64(&c, "device", "cqes").unwrap() >= N);
}

/// ATOMIC_WRITE as librxe's `ibv_wr_atomic_write` lays it out: the 8 bytes in
/// `dma.atomic_wr` (the inline area) with no SGE and no INLINE flag, where rxe reads them.
#[test]
fn atomic_write_in_librxe_layout() {
    use vur_testguest::abi::swqe as o;
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    let mut wr = SendWr::new(
        5,
        SendOp::AtomicWrite {
            remote_addr: rb.addr(64),
            rkey: rb.rkey,
        },
        vec![],
    );
    wr.flags = SEND_SIGNALED;
    let elem = ea.qp.sq.as_ref().unwrap().elem_size();
    let mut slot = encode_send_wqe(&wr, 0, elem);
    let v = 0x1122_3344_5566_7788u64;
    slot[o::DMA_NUM_SGE..o::DMA_NUM_SGE + 4].copy_from_slice(&0u32.to_le_bytes());
    slot[o::DMA_LENGTH..o::DMA_LENGTH + 4].copy_from_slice(&8u32.to_le_bytes());
    slot[o::DMA_DATA..o::DMA_DATA + 8].copy_from_slice(&v.to_le_bytes());
    a.guest.post_raw_send_slot(&ea.qp, &slot).unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!((w.status, w.opcode), (0, WcOpcode::AtomicWrite as u32));
    assert_eq!(rb.buf.to_vec(64, 8), v.to_le_bytes());
}
