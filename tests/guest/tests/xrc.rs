//! XRC through the device contract (caps XRC, docs/virtio-rdma.md §5.12): two daemons on
//! loopback, an XRC INI QP on one and an XRC TGT QP with two XRC SRQs on the other, every byte
//! checked; and the commands' refusals.

mod common;

use std::time::Duration;

use common::{bin, pair, status, T};
use rxe_core::verbs::*;
use vur_testguest::*;

/// The target side: a domain, one TGT QP, two XRC SRQs (each with its own CQ) and an MR in
/// the SRQs' PD.
struct Target {
    pd: u32,
    xrcd: u32,
    tgt: Qp,
    srqs: [Srq; 2],
    cqs: [Cq; 2],
}

fn target(g: &mut Guest) -> Target {
    let pd = g.alloc_pd().unwrap();
    let xrcd = g.alloc_xrcd().expect("ALLOC_XRCD");
    let cqs = [g.create_cq(63).unwrap(), g.create_cq(63).unwrap()];
    let srqs = [
        g.create_xrc_srq(pd, xrcd, &cqs[0], 16, 2)
            .expect("CREATE_XRC_SRQ"),
        g.create_xrc_srq(pd, xrcd, &cqs[1], 16, 2)
            .expect("CREATE_XRC_SRQ"),
    ];
    let tgt = g.create_xrc_tgt(xrcd).expect("XRC TGT QP");
    Target {
        pd,
        xrcd,
        tgt,
        srqs,
        cqs,
    }
}

fn ini_cap() -> QpCap {
    QpCap {
        max_send_wr: 32,
        max_recv_wr: 0,
        max_send_sge: 2,
        max_recv_sge: 0,
        max_inline_data: 64,
    }
}

fn xrc_wr(wr_id: u64, op: SendOp, sge: Vec<Sge>, srqn: u32) -> SendWr {
    let mut w = SendWr::new(wr_id, op, sge);
    w.xrc_remote_srqn = Some(srqn);
    w
}

#[test]
fn xrc_send_write_read_atomic_through_two_srqs_every_byte() {
    let (mut a, mut b) = pair();
    assert_ne!(a.guest.config.caps & abi::caps::XRC, 0, "caps XRC");
    let t = target(&mut b.guest);
    let pd = a.guest.alloc_pd().unwrap();
    let cq = a.guest.create_cq(63).unwrap();
    let ini = a
        .guest
        .create_qp(QpType::XrcIni, pd, &cq, &cq, None, ini_cap())
        .expect("XRC INI QP");
    let o = ConnOpts::default();
    bring_up(&mut a.guest, &ini, b.gid, t.tgt.qpn, &o).expect("INI to RTS");
    bring_up(&mut b.guest, &t.tgt, a.gid, ini.qpn, &o).expect("TGT to RTS");

    let access = Access::LOCAL_WRITE.union(Access::REMOTE);
    let len = 16 << 10;
    let sa = a.guest.reg_mr(pd, len, access).unwrap();
    let rb = b.guest.reg_mr(t.pd, len, access).unwrap();
    // One receive on each SRQ; two SENDs, three packets each at MTU 1024, one to each SRQ.
    for (i, s) in t.srqs.iter().enumerate() {
        let off = i * 4096;
        let wr = RecvWr {
            wr_id: 100 + i as u64,
            sg_list: vec![rb.sge(off, 4096)].into(),
        };
        b.guest.post_srq_recv(s, &wr).unwrap();
    }
    let msgs = [
        rxe_core::sim::prng_pattern(37, 3000),
        rxe_core::sim::prng_pattern(38, 2500),
    ];
    sa.buf.write(0, &msgs[0]);
    sa.buf.write(4096, &msgs[1]);
    for (i, m) in msgs.iter().enumerate() {
        let sge = vec![sa.sge(i * 4096, m.len() as u32)];
        let wr = xrc_wr(i as u64 + 1, SendOp::Send, sge, t.srqs[i].srqn);
        a.guest.post_send(&ini, &wr).unwrap();
    }
    let w = a.guest.wait_cq(&cq, 2, T);
    let st: Vec<_> = w.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(st, [(1, 0), (2, 0)], "the INI's send completions");
    for (i, m) in msgs.iter().enumerate() {
        let w = b.guest.wait_cq(&t.cqs[i], 1, T);
        assert_eq!(w.len(), 1, "SRQ {i}'s receive completion in its own CQ");
        let c = &w[0];
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (100 + i as u64, 0, m.len() as u32)
        );
        assert_eq!(c.qp_num, t.tgt.qpn, "the completion names the TGT QP");
        assert!(rb.buf.to_vec(i * 4096, m.len()) == *m, "SEND {i}'s bytes");
    }

    // WRITE 16 KiB (R_Key checked in SRQ 1's PD), READ it back, then a fetch-and-add.
    let data = rxe_core::sim::prng_pattern(39, len);
    sa.buf.write(0, &data);
    let write = SendOp::Write {
        remote_addr: rb.iova,
        rkey: rb.rkey,
    };
    let srqn = t.srqs[1].srqn;
    a.guest
        .post_send(&ini, &xrc_wr(3, write, vec![sa.sge(0, len as u32)], srqn))
        .unwrap();
    let w = a.guest.wait_cq(&cq, 1, T);
    assert_eq!((w[0].wr_id, w[0].status), (3, 0), "WRITE");
    assert!(rb.buf.to_vec(0, len) == data, "written bytes");
    let back = a.guest.reg_mr(pd, len, access).unwrap();
    let read = SendOp::Read {
        remote_addr: rb.iova,
        rkey: rb.rkey,
    };
    a.guest
        .post_send(&ini, &xrc_wr(4, read, vec![back.sge(0, len as u32)], srqn))
        .unwrap();
    let w = a.guest.wait_cq(&cq, 1, T);
    assert_eq!((w[0].wr_id, w[0].status), (4, 0), "READ");
    assert!(back.buf.to_vec(0, len) == data, "read bytes");
    rb.buf.write(64, &7u64.to_le_bytes());
    let fa = SendOp::FetchAdd {
        remote_addr: rb.iova + 64,
        rkey: rb.rkey,
        add: 5,
    };
    a.guest
        .post_send(&ini, &xrc_wr(5, fa, vec![back.sge(0, 8)], srqn))
        .unwrap();
    let w = a.guest.wait_cq(&cq, 1, T);
    assert_eq!((w[0].wr_id, w[0].status), (5, 0), "fetch-and-add");
    assert_eq!(back.buf.to_vec(0, 8), 7u64.to_le_bytes(), "the old value");
    assert_eq!(rb.buf.to_vec(64, 8), 12u64.to_le_bytes(), "the new value");
    // Nothing more arrived on either SRQ's CQ.
    for c in &t.cqs {
        assert!(b.guest.poll_cq(c, 4).is_empty(), "no extra completion");
    }
}

#[test]
fn a_send_to_an_srq_outside_the_domain_fails_at_the_initiator_only() {
    let (mut a, mut b) = pair();
    let t = target(&mut b.guest);
    // An ordinary SRQ of the same PD: not an XRC SRQ, so no request may name it.
    let plain = b.guest.create_srq(t.pd, 8, 1, 0).unwrap();
    let pd = a.guest.alloc_pd().unwrap();
    let cq = a.guest.create_cq(63).unwrap();
    let ini = a
        .guest
        .create_qp(QpType::XrcIni, pd, &cq, &cq, None, ini_cap())
        .unwrap();
    let o = ConnOpts::default();
    bring_up(&mut a.guest, &ini, b.gid, t.tgt.qpn, &o).unwrap();
    bring_up(&mut b.guest, &t.tgt, a.gid, ini.qpn, &o).unwrap();
    let sa = a.guest.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let rb = b.guest.reg_mr(t.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let wr = RecvWr {
        wr_id: 9,
        sg_list: vec![rb.sge(0, 4096)].into(),
    };
    b.guest.post_srq_recv(&plain, &wr).unwrap();
    let send = xrc_wr(1, SendOp::Send, vec![sa.sge(0, 100)], plain.srqn);
    a.guest.post_send(&ini, &send).unwrap();
    let w = a.guest.wait_cq(&cq, 1, T);
    assert_eq!(w.len(), 1, "the INI's completion");
    assert_eq!(
        (w[0].wr_id, w[0].status),
        (1, WcStatus::RemInvReqErr as u32),
        "a NAK for an invalid request"
    );
    let late = b.guest.wait_cq(&t.cqs[0], 1, Duration::from_millis(300));
    assert!(late.is_empty(), "nothing reached the target's CQs");
    assert!(b.guest.poll_cq(&t.cqs[1], 4).is_empty());
}

#[test]
fn the_xrc_commands_refuse_what_they_must() {
    let (aa, _) = loopback_pair(4791);
    let d = Daemon::spawn(bin(), aa, &[]).expect("spawn");
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).expect("connect");
    let t = target(&mut g);
    // The domain is in use by the SRQs and the TGT QP.
    let busy = status(&mut g, abi::op::DEALLOC_XRCD, &handle(t.xrcd));
    assert_eq!(busy, abi::Status::Busy, "DEALLOC_XRCD of a domain in use");
    // A CQ an XRC SRQ completes into cannot go.
    let cq_busy = status(&mut g, abi::op::DESTROY_CQ, &handle(t.cqs[0].cqn));
    assert_eq!(cq_busy, abi::Status::Busy, "DESTROY_CQ of an XRC SRQ's CQ");
    // Unknown domain, unknown CQ.
    let cq = &t.cqs[0];
    let e = g.create_xrc_srq(t.pd, t.xrcd + 7, cq, 4, 1).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::NotFound))),
        "{e:?}"
    );
    let e = g.create_xrc_tgt(t.xrcd + 7).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::NotFound))),
        "{e:?}"
    );
    // An XRC INI QP has no receive queue.
    let pd = t.pd;
    let mut cap = ini_cap();
    cap.max_recv_wr = 4;
    cap.max_recv_sge = 1;
    let e = g.create_qp(QpType::XrcIni, pd, cq, cq, None, cap).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::Invalid))),
        "{e:?}"
    );
    // Everything goes in order, and then the domain does.
    g.destroy_qp(t.tgt).unwrap();
    let [s0, s1] = t.srqs;
    g.destroy_srq(s0).unwrap();
    g.destroy_srq(s1).unwrap();
    g.dealloc_xrcd(t.xrcd).expect("DEALLOC_XRCD once empty");
    let gone = status(&mut g, abi::op::DEALLOC_XRCD, &handle(t.xrcd));
    assert_eq!(gone, abi::Status::NotFound);
}

fn handle(h: u32) -> Vec<u8> {
    vm_memory::ByteValued::as_slice(&abi::Handle {
        handle: h,
        reserved: 0,
    })
    .to_vec()
}
