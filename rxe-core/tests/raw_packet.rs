//! Raw packet QPs in the engine: the QP's state machine (the kernel's RAW_PACKET column), a
//! send gathering a whole frame from its SGEs and completing, a frame filling a receive, and
//! every error a send or a receive can meet.

mod common;

use common::{sge, statuses};
use rxe_core::device::Drop;
use rxe_core::device::{RAW_MAX_FRAME, RAW_MIN_FRAME};
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::{QpInit, Qpn};

struct Raw {
    pd: u32,
    cq: u32,
    qp: Qpn,
}

/// A raw packet QP's init: both queues' completions to `cq` (0: none, for a QP with no queue).
fn raw_init(pd: u32, cq: u32, cap: QpCap, sq_sig_all: bool) -> QpInit {
    QpInit {
        qp_type: QpType::RawPacket,
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        xrcd: None,
        cap,
        sq_sig_all,
    }
}

fn raw_qp(sim: &mut Sim, sq_sig_all: bool) -> Raw {
    let d = sim.dev(0);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64).unwrap();
    let cap = QpCap {
        max_send_wr: 8,
        max_recv_wr: 8,
        max_send_sge: 2,
        max_recv_sge: 2,
        max_inline_data: 64,
    };
    let qp = d.create_qp(raw_init(pd, cq, cap, sq_sig_all)).unwrap();
    Raw { pd, cq, qp }
}

fn to_state(sim: &mut Sim, qp: Qpn, s: QpState, mask: u32) -> Result<(), VerbError> {
    let a = QpAttr {
        qp_state: s,
        port_num: 1,
        ..Default::default()
    };
    sim.dev(0)
        .modify_qp(qp, &a, AttrMask(AttrMask::STATE | mask))
}

/// `Device::raw_send` on node 0, with node 0's memory.
fn send(sim: &mut Sim, qp: Qpn, wr: &SendWr, out: &mut [u8]) -> Result<Option<usize>, VerbError> {
    let Node { dev, mem, .. } = &mut sim.nodes[0];
    dev.raw_send(qp, wr, mem, out)
}

fn to_rts(sim: &mut Sim, qp: Qpn) {
    to_state(sim, qp, QpState::Init, AttrMask::PORT).unwrap();
    to_state(sim, qp, QpState::Rtr, 0).unwrap();
    to_state(sim, qp, QpState::Rts, 0).unwrap();
}

#[test]
fn the_state_machine_is_the_kernels_raw_packet_column() {
    let mut sim = Sim::new(1);
    let r = raw_qp(&mut sim, false);
    // RESET to INIT needs the port, and takes no access flags or Q_Key.
    let e = to_state(&mut sim, r.qp, QpState::Init, 0);
    assert_eq!(e, Err(VerbError::Invalid), "INIT without the port");
    let e = to_state(
        &mut sim,
        r.qp,
        QpState::Init,
        AttrMask::PORT | AttrMask::QKEY,
    );
    assert_eq!(e, Err(VerbError::Invalid), "INIT with a Q_Key");
    to_rts(&mut sim, r.qp);
    assert_eq!(sim.dev(0).qp(r.qp).unwrap().state(), QpState::Rts);
    // No RoCE request reaches it, and it queues no RoCE work.
    let wr = SendWr::new(1, SendOp::Send, Vec::new());
    assert_eq!(sim.dev(0).post_send(r.qp, wr), Err(VerbError::Invalid));
}

#[test]
fn a_send_gathers_a_frame_and_a_receive_takes_it_whole() {
    let mut sim = Sim::new(2);
    let a = raw_qp(&mut sim, false);
    let (buf, lkey) = sim.reg(0, a.pd, 8192, Access::LOCAL_WRITE);
    to_rts(&mut sim, a.qp);
    // A 1514-byte frame in two pieces.
    let frame = prng_pattern(7, 1514);
    sim.nodes[0]
        .mem
        .slice_mut(buf, 1514)
        .copy_from_slice(&frame);
    let sg = vec![
        Sge {
            addr: buf,
            length: 100,
            lkey,
        },
        Sge {
            addr: buf + 100,
            length: 1414,
            lkey,
        },
    ];
    let wr = SendWr::new(11, SendOp::Send, sg);
    let mut out = vec![0u8; RAW_MAX_FRAME];
    let n = send(&mut sim, a.qp, &wr, &mut out).expect("raw_send");
    assert_eq!(n, Some(1514));
    assert!(out[..1514] == frame[..], "the gathered frame");
    let c = sim.poll_all(0, a.cq);
    assert_eq!(statuses(&c), [(11, WcStatus::Success)]);
    assert_eq!((c[0].opcode, c[0].byte_len), (WcOpcode::Send, 1514));
    // Into a receive at 4096, whole, with its length.
    let recv = RecvWr {
        wr_id: 12,
        sg_list: sge(buf + 4096, 2048, lkey).into(),
    };
    sim.dev(0).post_recv(a.qp, recv).unwrap();
    let Node { dev, mem, .. } = &mut sim.nodes[0];
    dev.raw_receive(a.qp, &out[..1514], mem)
        .expect("raw_receive");
    assert!(
        sim.nodes[0].mem.slice(buf + 4096, 1514) == &frame[..],
        "received bytes"
    );
    let c = sim.poll_all(0, a.cq);
    assert_eq!(statuses(&c), [(12, WcStatus::Success)]);
    assert_eq!((c[0].opcode, c[0].byte_len), (WcOpcode::Recv, 1514));
    assert_eq!((c[0].qp_num, c[0].src_qp, c[0].wc_flags), (a.qp, Qpn(0), 0));
    // An unsignaled send completes silently; inline data is a frame too.
    let mut wr = SendWr::new(13, SendOp::Send, Vec::new());
    wr.flags = SEND_INLINE;
    wr.inline_data = frame[..60].to_vec();
    let n = send(&mut sim, a.qp, &wr, &mut out);
    assert_eq!(n, Ok(Some(60)));
    assert_eq!(out[..60], frame[..60]);
    assert!(sim.poll_all(0, a.cq).is_empty(), "unsignaled");
}

#[test]
fn a_receive_cq_that_overflows_takes_the_qp_to_error() {
    let mut sim = Sim::new(7);
    let d = sim.dev(0);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(1).unwrap();
    let cap = QpCap {
        max_recv_wr: 4,
        max_recv_sge: 1,
        ..Default::default()
    };
    let qp = d.create_qp(raw_init(pd, cq, cap, false)).unwrap();
    let (buf, lkey) = sim.reg(0, pd, 4096, Access::LOCAL_WRITE);
    to_state(&mut sim, qp, QpState::Init, AttrMask::PORT).unwrap();
    to_state(&mut sim, qp, QpState::Rtr, 0).unwrap();
    let cap_of = 1u64; // create_cq(1) holds one completion
    for i in 0..=cap_of {
        let wr = RecvWr {
            wr_id: i,
            sg_list: sge(buf + 64 * i, 64, lkey).into(),
        };
        sim.dev(0).post_recv(qp, wr).unwrap();
    }
    let frame = prng_pattern(9, 60);
    for _ in 0..=cap_of {
        let Node { dev, mem, .. } = &mut sim.nodes[0];
        dev.raw_receive(qp, &frame, mem).unwrap();
    }
    assert_eq!(
        sim.dev(0).qp(qp).unwrap().state(),
        QpState::Err,
        "after the overflow"
    );
}

#[test]
fn a_raw_packet_qp_with_no_queue_needs_no_cq() {
    let mut sim = Sim::new(6);
    let d = sim.dev(0);
    let pd = d.alloc_pd().unwrap();
    let init = |cq, cap| raw_init(pd, cq, cap, false);
    let qp = d.create_qp(init(0, QpCap::default())).expect("an RSS QP's");
    d.destroy_qp(qp).unwrap();
    // With a queue, the CQ must be there.
    let cap = QpCap {
        max_recv_wr: 4,
        max_recv_sge: 1,
        ..Default::default()
    };
    assert_eq!(d.create_qp(init(0, cap)), Err(VerbError::NotFound));
}

#[test]
fn receives_drop_what_they_cannot_take_and_fail_what_does_not_fit() {
    let mut sim = Sim::new(3);
    let a = raw_qp(&mut sim, true);
    let (buf, lkey) = sim.reg(0, a.pd, 4096, Access::LOCAL_WRITE);
    let frame = prng_pattern(8, 200);
    // Before RTR: dropped, nothing taken.
    let Node { dev, mem, .. } = &mut sim.nodes[0];
    assert_eq!(dev.raw_receive(a.qp, &frame, mem), Err(Drop::WrongQpState));
    to_rts(&mut sim, a.qp);
    // No receive posted: dropped.
    let Node { dev, mem, .. } = &mut sim.nodes[0];
    assert_eq!(dev.raw_receive(a.qp, &frame, mem), Err(Drop::NoReceiveWqe));
    // A receive of 100 bytes: LOC_LEN_ERR, nothing written beyond it.
    let recv = RecvWr {
        wr_id: 21,
        sg_list: sge(buf, 100, lkey).into(),
    };
    sim.dev(0).post_recv(a.qp, recv).unwrap();
    let Node { dev, mem, .. } = &mut sim.nodes[0];
    dev.raw_receive(a.qp, &frame, mem).unwrap();
    let c = sim.poll_all(0, a.cq);
    assert_eq!(statuses(&c), [(21, WcStatus::LocLenErr)]);
    assert!(sim.nodes[0]
        .mem
        .slice(buf + 100, 100)
        .iter()
        .all(|&b| b == 0));
}

#[test]
fn sends_fail_on_length_key_and_operation_and_the_qp_goes_to_error() {
    let cases: [(&str, usize, u32, SendOp, WcStatus); 4] = [
        (
            "shorter than a header",
            RAW_MIN_FRAME - 1,
            0,
            SendOp::Send,
            WcStatus::LocLenErr,
        ),
        (
            "longer than the largest",
            RAW_MAX_FRAME + 1,
            0,
            SendOp::Send,
            WcStatus::LocLenErr,
        ),
        (
            "a wrong lkey",
            64,
            0x100,
            SendOp::Send,
            WcStatus::LocProtErr,
        ),
        (
            "not a SEND",
            64,
            0,
            SendOp::Write {
                remote_addr: 0,
                rkey: 0,
            },
            WcStatus::LocQpOpErr,
        ),
    ];
    for (what, len, bad_key, op, want) in cases {
        let mut sim = Sim::new(4);
        let a = raw_qp(&mut sim, false);
        let (buf, lkey) = sim.reg(0, a.pd, 2 * RAW_MAX_FRAME, Access::LOCAL_WRITE);
        to_rts(&mut sim, a.qp);
        let wr = SendWr::new(31, op, sge(buf, len, lkey ^ bad_key));
        let mut out = vec![0u8; RAW_MAX_FRAME];
        let n = send(&mut sim, a.qp, &wr, &mut out);
        assert_eq!(n, Ok(None), "{what}: no frame");
        let c = sim.poll_all(0, a.cq);
        assert_eq!(statuses(&c), [(31, want)], "{what}: an error completion");
        assert_eq!(sim.dev(0).qp(a.qp).unwrap().state(), QpState::Err, "{what}");
        // What follows is flushed.
        let wr = SendWr::new(32, SendOp::Send, sge(buf, 64, lkey));
        let n = send(&mut sim, a.qp, &wr, &mut out);
        assert_eq!(n, Ok(None), "{what}: flushed");
        let c = sim.poll_all(0, a.cq);
        assert_eq!(statuses(&c), [(32, WcStatus::WrFlushErr)], "{what}");
    }
    // Before RTS a send waits (BadState), as on any QP; a QP of another type is refused.
    let mut sim = Sim::new(5);
    let a = raw_qp(&mut sim, false);
    let wr = SendWr::new(41, SendOp::Send, Vec::new());
    let mut out = vec![0u8; 64];
    let n = send(&mut sim, a.qp, &wr, &mut out);
    assert_eq!(n, Err(VerbError::BadState));
    let [e, _] = sim.connect(ConnOpts::default());
    let n = send(&mut sim, e.qpn, &wr, &mut out);
    assert_eq!(n, Err(VerbError::Invalid));
}
