//! The control queue goes before bulk work: a command the guest made available is served on
//! the worker's next wake-up, whatever woke it, and between slices of a long pump — not only
//! after the events that came before its own kick.

mod common;

use std::time::Duration;

use common::{bin, T};
use rxe_core::verbs::*;
use vur_testguest::*;

fn worker(n: &Node, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, "worker", key).unwrap_or_else(|| panic!("no worker.{key} in {c}"))
}

/// A QUERY_PORT put on the control queue without a kick, then an RC WRITE: the WRITE's
/// doorbell wakes the worker, which serves the command before the doorbell. Without the
/// priority the command would wait for a kick that never comes.
#[test]
fn a_command_in_the_control_ring_is_served_before_a_doorbell() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).expect("node a");
    let mut b = Node::start(bin(), ba, &[]).expect("node b");
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).expect("connect");
    const LEN: usize = 64 << 10;
    let ma = a.guest.reg_mr(ea.pd, LEN, Access::LOCAL_WRITE).unwrap();
    let mb = b
        .guest
        .reg_mr(
            eb.pd,
            LEN,
            Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        )
        .unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 13 % 251) as u8).collect();
    ma.buf.write(0, &data);
    let before = worker(&a, "ctrl_first");
    let port = abi::CmdQueryPort {
        port_num: 1,
        reserved: 0,
    };
    let head = a
        .guest
        .post_unkicked_cmd(abi::op::QUERY_PORT, vm_memory::ByteValued::as_slice(&port))
        .expect("command on the ring");
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: mb.addr(0),
            rkey: mb.rkey,
        },
        vec![ma.sge(0, LEN as u32)],
    );
    a.guest.post_send(&ea.qp, &wr).expect("post WRITE");
    let status = a
        .guest
        .wait_unkicked_cmd(head, Duration::from_secs(5))
        .expect("the command served on the doorbell's wake-up");
    assert_eq!(status, 0, "QUERY_PORT status");
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "WRITE completion");
    assert_eq!(w[0].status, 0, "{w:?}");
    assert_eq!(mb.buf.to_vec(0, LEN), data, "written bytes");
    assert!(
        worker(&a, "ctrl_first") > before,
        "the worker counted no command served ahead of other work"
    );
}
