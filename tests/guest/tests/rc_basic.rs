//! Thin slice: two daemons on loopback, two test guests, query_device and one RC SEND.

use std::path::Path;
use std::time::Duration;

use rxe_core::verbs::*;
use vur_testguest::*;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_vur-daemon"))
}

#[test]
fn query_device_over_the_control_queue() {
    let (a, _) = loopback_pair(4791);
    let d = Daemon::spawn(bin(), a, &["--max-qp", "77"]).expect("spawn");
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).expect("connect");
    let q = g.query_device().expect("query_device");
    assert_eq!(q.version, abi::VERSION);
    assert_eq!(q.max_qp, 77);
    assert_eq!(q, g.config, "QUERY_DEVICE and the config space agree");
    let p = g.query_port().expect("query_port");
    assert_eq!(p.state, 4);
    assert_eq!(p.active_mtu, Mtu::M1024 as u32);
}

#[test]
fn rc_send_recv() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).expect("node a");
    let mut b = Node::start(bin(), ba, &[]).expect("node b");
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).expect("connect");
    let access = Access::LOCAL_WRITE;
    let sbuf = a.guest.reg_mr(ea.pd, 4096, access).unwrap();
    let rbuf = b.guest.reg_mr(eb.pd, 4096, access).unwrap();
    let msg = rxe_core::sim::prng_pattern(36, 3000);
    sbuf.buf.write(0, &msg);
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 42,
                sg_list: vec![rbuf.sge(0, 4096)].into(),
            },
        )
        .unwrap();
    a.guest
        .post_send(
            &ea.qp,
            &SendWr::new(7, SendOp::Send, vec![sbuf.sge(0, msg.len() as u32)]),
        )
        .unwrap();
    let wa = a.guest.wait_cq(&ea.cq, 1, Duration::from_secs(5));
    let wb = b.guest.wait_cq(&eb.cq, 1, Duration::from_secs(5));
    assert_eq!(wa.len(), 1, "send completion");
    assert_eq!(wb.len(), 1, "recv completion");
    assert_eq!((wa[0].wr_id, wa[0].status), (7, 0));
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].byte_len), (42, 0, 3000));
    assert_eq!(wb[0].opcode, WcOpcode::Recv as u32);
    assert_eq!(wb[0].src_qp, 0);
    assert_eq!(rbuf.buf.to_vec(0, 3000), msg);
}
