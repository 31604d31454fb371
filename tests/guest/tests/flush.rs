//! RDMA FLUSH through the daemon, the way pyverbs' `test_qp_ex_rc_flush` and
//! `test_qp_ex_rc_flush_type_violate` drive it through librxe: the device states
//! FLUSH_GLOBAL/FLUSH_PERSISTENT in `device_cap_flags`, takes `IBV_ACCESS_FLUSH_GLOBAL` on MRs
//! and QPs, decodes the FLUSH WQE librxe's `ibv_wr_flush` writes, and completes it with
//! IBV_WC_FLUSH (or REM_ACCESS_ERR for a placement type the MR was not registered for).

use std::path::Path;
use std::time::Duration;

use rxe_core::verbs::*;
use vur_testguest::abi::{dev_cap, swqe, wr_op, Status};
use vur_testguest::*;

const T: Duration = Duration::from_secs(10);
const LW: Access = Access::LOCAL_WRITE;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vur-daemon"))
}

/// The send slot librxe's `wr_flush()` writes: the WQE zeroed, `wr.flush` filled but for its
/// length (0), the length in `dma.length` and `dma.resid`, the address again in `iova`; no
/// SGE.
fn flush_slot(wr_id: u64, rkey: u32, addr: u64, len: u32, placement: u8, level: u8) -> Vec<u8> {
    let mut s = vec![0u8; swqe::SIZE];
    let mut put = |off: usize, v: &[u8]| s[off..off + v.len()].copy_from_slice(v);
    put(swqe::WR_ID, &wr_id.to_le_bytes());
    put(swqe::OPCODE, &wr_op::FLUSH.to_le_bytes());
    put(swqe::SEND_FLAGS, &SEND_SIGNALED.to_le_bytes());
    put(swqe::FLUSH_REMOTE_ADDR, &addr.to_le_bytes());
    put(swqe::FLUSH_RKEY, &rkey.to_le_bytes());
    put(swqe::FLUSH_TYPE, &[placement]);
    put(swqe::FLUSH_LEVEL, &[level]);
    put(swqe::IOVA, &addr.to_le_bytes());
    put(swqe::DMA_LENGTH, &len.to_le_bytes());
    put(swqe::DMA_RESID, &len.to_le_bytes());
    s
}

fn summary(w: &[Wc]) -> Vec<(u64, u32, u32, u32)> {
    w.iter()
        .map(|w| (w.wr_id, w.status, w.opcode, w.byte_len))
        .collect()
}

#[test]
fn flush_and_its_type_violation_as_pyverbs_runs_them() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).expect("node a");
    let mut b = Node::start(bin(), ba, &[]).expect("node b");
    let flush_caps = dev_cap::FLUSH_GLOBAL | dev_cap::FLUSH_PERSISTENT;
    assert_eq!(a.guest.config.device_cap_flags & flush_caps, flush_caps);
    assert_eq!(
        a.guest.query_device().unwrap().device_cap_flags & flush_caps,
        flush_caps
    );
    // pyverbs' extended RC QPs allow remote everything and both placement types.
    let opts = ConnOpts {
        access: LW
            .union(Access::REMOTE)
            .union(Access::FLUSH_GLOBAL)
            .union(Access::FLUSH_PERSISTENT),
        ..Default::default()
    };
    let (ea, eb) = connect_qps(&mut a, &mut b, &opts).expect("connect");
    // The MR: LOCAL_WRITE | FLUSH_GLOBAL | REMOTE_WRITE (pyverbs' "additional flags 258").
    let dst = b
        .guest
        .reg_mr(
            eb.pd,
            8192,
            LW.union(Access::REMOTE_WRITE).union(Access::FLUSH_GLOBAL),
        )
        .expect("an MR for global flushes");
    // Nothing is persistent memory: INVALID (EINVAL), as rxe on pages that are not pmem.
    match b
        .guest
        .reg_mr(eb.pd, 4096, LW.union(Access::FLUSH_PERSISTENT))
    {
        Err(Error::Status(Status::Invalid)) => {}
        r => panic!("a persistent MR: {:?}", r.map(|m| m.lkey)),
    }
    let src = a.guest.reg_mr(ea.pd, 8192, LW).unwrap();
    src.write(0, &[0x5a; 8192]);

    // flush_traffic(): an RDMA WRITE, then a FLUSH of that range; then (level MR) FLUSHes of
    // length 0 and of a length far beyond the MR, whose address and length do not count.
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote_addr: dst.addr(0),
                    rkey: dst.rkey,
                },
                vec![src.sge(0, 8192)],
            ),
        )
        .unwrap();
    let rkey = dst.rkey;
    for slot in [
        flush_slot(2, rkey, dst.addr(0), 8192, flush::GLOBAL, flush::RANGE),
        flush_slot(3, rkey, dst.addr(0), 0, flush::GLOBAL, flush::MR),
        flush_slot(4, rkey, dst.addr(0), 12_345_678, flush::GLOBAL, flush::MR),
    ] {
        a.guest.post_raw_send_slot(&ea.qp, &slot).unwrap();
    }
    let w = a.guest.wait_cq(&ea.cq, 4, T);
    let (ok, flush_op) = (WcStatus::Success as u32, WcOpcode::Flush as u32);
    assert_eq!(
        summary(&w),
        vec![
            (1, ok, WcOpcode::RdmaWrite as u32, 8192),
            (2, ok, flush_op, 8192),
            (3, ok, flush_op, 0),
            (4, ok, flush_op, 12_345_678),
        ]
    );
    assert_eq!(flush_op, 8, "IBV_WC_FLUSH");
    assert_eq!(dst.to_vec(0, 8192), vec![0x5a; 8192]);

    // The type violation: a persistent flush of the MR registered for global ones.
    let slot = flush_slot(5, rkey, dst.addr(0), 64, flush::PERSISTENT, flush::RANGE);
    a.guest.post_raw_send_slot(&ea.qp, &slot).unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(
        summary(&w),
        vec![(5, WcStatus::RemAccessErr as u32, flush_op, 0)]
    );
    let e = b.guest.wait_event(T, |e| {
        e.kind == abi::event::KIND_ASYNC && e.event == abi::event::QP_ACCESS_ERR
    });
    assert_eq!(
        e.map(|e| e.object),
        Some(eb.qp.qpn),
        "QP_ACCESS_ERR at the responder"
    );
}

/// A FLUSH on a QP whose peer does not allow the placement type is an invalid request
/// (rxe checks the QP's rights before the R_Key); on a UC QP it is a bad work request.
#[test]
fn flush_refused_by_the_qp() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).expect("node a");
    let mut b = Node::start(bin(), ba, &[]).expect("node b");
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).expect("connect");
    let dst = b
        .guest
        .reg_mr(eb.pd, 4096, LW.union(Access::FLUSH_GLOBAL))
        .unwrap();
    let slot = flush_slot(1, dst.rkey, dst.addr(0), 64, flush::GLOBAL, flush::RANGE);
    a.guest.post_raw_send_slot(&ea.qp, &slot).unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(
        summary(&w),
        vec![(1, WcStatus::RemInvReqErr as u32, WcOpcode::Flush as u32, 0)]
    );

    let (ua, ub) = connect_qps(
        &mut a,
        &mut b,
        &ConnOpts {
            qp_type: QpType::Uc,
            ..Default::default()
        },
    )
    .expect("connect UC");
    let _ = ub;
    let slot = flush_slot(2, dst.rkey, dst.addr(0), 64, flush::GLOBAL, flush::RANGE);
    a.guest.post_raw_send_slot(&ua.qp, &slot).unwrap();
    let w = a.guest.wait_cq(&ua.cq, 1, T);
    assert_eq!(
        summary(&w),
        vec![(2, WcStatus::LocQpOpErr as u32, WcOpcode::Flush as u32, 0)]
    );
}
