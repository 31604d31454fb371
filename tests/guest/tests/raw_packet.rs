//! Raw packet QPs and flow steering through the daemon (caps RAW_PACKET, docs/virtio-rdma.md
//! §5.13): whole Ethernet frames from one raw packet QP to the others whose flows match them,
//! every byte checked; what a flow lets through and what it does not; the refusals.

mod common;

use std::time::Duration;

use common::{bin, status, T};
use rxe_core::verbs::*;
use vur_testguest::abi::flow_layer;
use vur_testguest::*;

const DST: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x22];
const SRC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x11];

fn guest() -> (Daemon, Guest) {
    let (aa, _) = loopback_pair(4791);
    let d = Daemon::spawn(bin(), aa, &[]).expect("spawn");
    let g = Guest::connect(&d.socket, GuestOpts::default()).expect("connect");
    (d, g)
}

struct RawEnd {
    cq: Cq,
    qp: Qp,
}

fn raw_qp(g: &mut Guest, pd: u32) -> RawEnd {
    let cq = g.create_cq(255).unwrap();
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
        max_recv_sge: 1,
        max_inline_data: 128,
    };
    let qp = g
        .create_qp(QpType::RawPacket, pd, &cq, &cq, None, cap)
        .expect("raw packet QP");
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    g.modify_qp(&qp, &a, AttrMask::STATE | AttrMask::PORT)
        .expect("INIT");
    a.qp_state = QpState::Rtr;
    g.modify_qp(&qp, &a, AttrMask::STATE).expect("RTR");
    a.qp_state = QpState::Rts;
    g.modify_qp(&qp, &a, AttrMask::STATE).expect("RTS");
    RawEnd { cq, qp }
}

/// An Ethernet/IPv4/UDP frame of `len` bytes from SRC to DST, its payload a pattern of
/// `seed`.
fn frame(len: usize, dport: u16, seed: u64) -> Vec<u8> {
    let mut f = Vec::with_capacity(len);
    f.extend_from_slice(&DST);
    f.extend_from_slice(&SRC);
    f.extend_from_slice(&[0x08, 0x00]);
    let ip_len = (len - 14) as u16;
    f.extend_from_slice(&[0x45, 0, ip_len.to_be_bytes()[0], ip_len.to_be_bytes()[1]]);
    f.extend_from_slice(&[
        0, 0, 0x40, 0, 64, 17, 0, 0, 198, 51, 100, 1, 198, 51, 100, 2,
    ]);
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((len - 34) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(&rxe_core::sim::prng_pattern(seed, len - 42));
    f
}

fn dst_mac_flow() -> abi::FlowMatch {
    abi::FlowMatch {
        dst_mac: DST,
        dst_mac_mask: [0xff; 6],
        ..Default::default()
    }
}

fn post_recvs(g: &mut Guest, e: &RawEnd, mr: &Mr, n: usize, size: usize) {
    for i in 0..n {
        let wr = RecvWr {
            wr_id: 1000 + i as u64,
            sg_list: vec![mr.sge(i * size, size as u32)].into(),
        };
        g.post_recv(&e.qp, &wr).unwrap();
    }
}

#[test]
fn frames_go_from_one_raw_qp_to_another_through_a_flow_every_byte() {
    let (_d, mut g) = guest();
    assert_ne!(g.config.caps & abi::caps::RAW_PACKET, 0, "caps RAW_PACKET");
    let pd = g.alloc_pd().unwrap();
    let (client, server) = (raw_qp(&mut g, pd), raw_qp(&mut g, pd));
    // The sender's own match-all flow: a QP is not sent its own frames.
    let all = g
        .create_flow(&client.qp, &abi::FlowMatch::default())
        .unwrap();
    g.create_flow(&server.qp, &dst_mac_flow())
        .expect("CREATE_FLOW");
    let slot = 9216;
    let sbuf = g.reg_mr(pd, 16 * slot, Access::LOCAL_WRITE).unwrap();
    let rbuf = g.reg_mr(pd, 16 * slot, Access::LOCAL_WRITE).unwrap();
    post_recvs(&mut g, &server, &rbuf, 16, slot);
    // Receives on the sender too: a frame sent back to it would complete one.
    let ebuf = g.reg_mr(pd, 2 * slot, Access::LOCAL_WRITE).unwrap();
    post_recvs(&mut g, &client, &ebuf, 2, slot);
    // Ten frames from the smallest to a jumbo one, the odd ones in two SGEs.
    let lens = [60, 64, 128, 511, 1000, 1514, 1518, 4096, 8000, 9018];
    let frames: Vec<_> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| frame(l, 5000, i as u64))
        .collect();
    for (i, f) in frames.iter().enumerate() {
        sbuf.buf.write(i * slot, f);
        let sg = if i % 2 == 1 {
            vec![
                sbuf.sge(i * slot, 20),
                sbuf.sge(i * slot + 20, f.len() as u32 - 20),
            ]
        } else {
            vec![sbuf.sge(i * slot, f.len() as u32)]
        };
        let wr = SendWr::new(i as u64, SendOp::Send, sg);
        g.post_send(&client.qp, &wr).unwrap();
    }
    let sent = g.wait_cq(&client.cq, lens.len(), T);
    let st: Vec<_> = sent.iter().map(|c| (c.wr_id, c.status)).collect();
    let want: Vec<_> = (0..lens.len() as u64).map(|i| (i, 0)).collect();
    assert_eq!(st, want, "the sends complete in order");
    let got = g.wait_cq(&server.cq, lens.len(), T);
    assert_eq!(got.len(), lens.len(), "a receive per frame");
    for (i, (c, f)) in got.iter().zip(&frames).enumerate() {
        assert_eq!(
            (c.wr_id, c.status, c.byte_len),
            (1000 + i as u64, 0, f.len() as u32)
        );
        assert_eq!((c.qp_num, c.opcode), (server.qp.qpn, WcOpcode::Recv as u32));
        assert!(
            rbuf.buf.to_vec(i * slot, f.len()) == *f,
            "frame {i}'s bytes"
        );
    }
    assert!(
        g.poll_cq(&client.cq, 4).is_empty(),
        "nothing echoed to the sender"
    );
    g.destroy_flow(all).unwrap();
}

#[test]
fn a_flow_takes_only_what_it_matches_and_nothing_once_destroyed() {
    let (_d, mut g) = guest();
    let pd = g.alloc_pd().unwrap();
    let (client, server) = (raw_qp(&mut g, pd), raw_qp(&mut g, pd));
    let m = abi::FlowMatch {
        layers: flow_layer::IPV4 | flow_layer::UDP,
        dst_port: 5000u16.to_be_bytes(),
        dst_port_mask: [0xff; 2],
        ..Default::default()
    };
    let flow = g.create_flow(&server.qp, &m).unwrap();
    let sbuf = g.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let rbuf = g.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    post_recvs(&mut g, &server, &rbuf, 2, 2048);
    let send = |g: &mut Guest, id: u64, f: &[u8]| {
        sbuf.buf.write(0, f);
        let wr = SendWr::new(id, SendOp::Send, vec![sbuf.sge(0, f.len() as u32)]);
        g.post_send(&client.qp, &wr).unwrap();
        let c = g.wait_cq(&client.cq, 1, T);
        assert_eq!((c[0].wr_id, c[0].status), (id, 0), "send {id}");
    };
    // Another port: not taken (the receive stays posted).
    send(&mut g, 1, &frame(100, 5001, 1));
    let none = g.wait_cq(&server.cq, 1, Duration::from_millis(200));
    assert!(none.is_empty(), "port 5001 is not the flow's");
    let f = frame(100, 5000, 2);
    send(&mut g, 2, &f);
    let c = g.wait_cq(&server.cq, 1, T);
    assert_eq!((c[0].wr_id, c[0].byte_len), (1000, 100), "port 5000 is");
    assert!(rbuf.buf.to_vec(0, 100) == f);
    g.destroy_flow(flow).unwrap();
    send(&mut g, 3, &frame(100, 5000, 3));
    let none = g.wait_cq(&server.cq, 1, Duration::from_millis(200));
    assert!(none.is_empty(), "no flow, no frame");
    let gone = status(&mut g, abi::op::DESTROY_FLOW, &handle(flow));
    assert_eq!(gone, abi::Status::NotFound);
}

#[test]
fn a_frame_shorter_than_a_header_fails_and_the_refusals_hold() {
    let (_d, mut g) = guest();
    let pd = g.alloc_pd().unwrap();
    let client = raw_qp(&mut g, pd);
    let sbuf = g.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
    let wr = SendWr::new(7, SendOp::Send, vec![sbuf.sge(0, 13)]);
    g.post_send(&client.qp, &wr).unwrap();
    let c = g.wait_cq(&client.cq, 1, T);
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (7, WcStatus::LocLenErr as u32),
        "13 bytes are no frame"
    );
    // A flow needs a raw packet QP, masks only where the layers are, flags 0.
    let cq = g.create_cq(15).unwrap();
    let rc = g
        .create_qp(QpType::Rc, pd, &cq, &cq, None, QpCap::default())
        .unwrap();
    let e = g.create_flow(&rc, &dst_mac_flow()).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::Invalid))),
        "{e:?}"
    );
    let bad = abi::FlowMatch {
        dst_port_mask: [0xff; 2],
        ..Default::default()
    };
    let e = g.create_flow(&client.qp, &bad).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::Invalid))),
        "{e:?}"
    );
    // A raw packet QP takes no SRQ.
    let srq = g.create_srq(pd, 4, 1, 0).unwrap();
    let e = g
        .create_qp(
            QpType::RawPacket,
            pd,
            &cq,
            &cq,
            Some(&srq),
            QpCap::default(),
        )
        .err();
    assert!(e.is_some(), "a raw packet QP with an SRQ");
}

/// Microsoft's RSS verification key.
const MS_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// A receive-only raw packet QP (a work queue) in RTR, or with no ring at all (an RSS QP).
fn rx_qp(g: &mut Guest, pd: u32, cq: &Cq, max_recv_wr: u32) -> Qp {
    let cap = QpCap {
        max_recv_wr,
        max_recv_sge: u32::from(max_recv_wr > 0),
        ..Default::default()
    };
    let qp = g
        .create_qp(QpType::RawPacket, pd, cq, cq, None, cap)
        .expect("receive-only raw packet QP");
    let mut a = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        ..Default::default()
    };
    g.modify_qp(&qp, &a, AttrMask::STATE | AttrMask::PORT)
        .unwrap();
    a.qp_state = QpState::Rtr;
    g.modify_qp(&qp, &a, AttrMask::STATE).unwrap();
    qp
}

#[test]
fn an_rss_qp_spreads_frames_over_its_table_by_the_toeplitz_hash() {
    use vur_testguest::abi::rss_field;
    let (_d, mut g) = guest();
    assert_ne!(g.config.caps & abi::caps::RSS, 0, "caps RSS");
    let pd = g.alloc_pd().unwrap();
    let client = raw_qp(&mut g, pd);
    let cq = g.create_cq(255).unwrap();
    let wqs: Vec<_> = (0..4).map(|_| rx_qp(&mut g, pd, &cq, 64)).collect();
    let rss = rx_qp(&mut g, pd, &cq, 0);
    let table: Vec<u32> = wqs.iter().map(|q| q.qpn).collect();
    let fields = rss_field::SRC_IPV4 | rss_field::DST_IPV4;
    g.set_rss(&rss, fields, &MS_KEY, &table).expect("SET_RSS");
    g.create_flow(&rss, &dst_mac_flow()).unwrap();
    let slot = 2048;
    let rbuf = g.reg_mr(pd, 4 * 64 * slot, Access::LOCAL_WRITE).unwrap();
    for (w, q) in wqs.iter().enumerate() {
        for i in 0..64 {
            let off = (w * 64 + i) * slot;
            let wr = RecvWr {
                wr_id: (w * 1000 + i) as u64,
                sg_list: vec![rbuf.sge(off, slot as u32)].into(),
            };
            g.post_recv(q, &wr).unwrap();
        }
    }
    // Microsoft's first vector, 66.9.149.187 to 161.142.100.80, hashes to 0x323e8fc2: entry
    // 2 of 4. Then 32 frames from other sources, each sent twice.
    let sbuf = g.reg_mr(pd, 2048, Access::LOCAL_WRITE).unwrap();
    let mut sent = Vec::new();
    let mut srcs = vec![([66, 9, 149, 187], [161, 142, 100, 80])];
    srcs.extend((0u8..32).map(|i| ([10, i, 2 * i, 7], [198, 51, 100, 2])));
    for (n, &(src, dst)) in srcs.iter().enumerate() {
        for rep in 0..2 {
            let mut f = frame(200, 5000, (n * 2 + rep) as u64);
            f[26..30].copy_from_slice(&src);
            f[30..34].copy_from_slice(&dst);
            sbuf.buf.write(0, &f);
            let wr = SendWr::new(n as u64, SendOp::Send, vec![sbuf.sge(0, f.len() as u32)]);
            g.post_send(&client.qp, &wr).unwrap();
            let c = g.wait_cq(&client.cq, 1, T);
            assert_eq!(c[0].status, 0, "send {n}");
            sent.push((n, f));
        }
    }
    let got = g.wait_cq(&cq, sent.len(), T);
    assert_eq!(
        got.len(),
        sent.len(),
        "every frame once, in some work queue"
    );
    let mut queue_of = std::collections::HashMap::new();
    let mut next = [0usize; 4];
    for ((n, f), c) in sent.iter().zip(&got) {
        assert_eq!((c.status, c.byte_len), (0, 200), "frame {n}");
        let w = table
            .iter()
            .position(|&q| q == c.qp_num)
            .expect("a work queue's QPN");
        assert_eq!(
            c.wr_id,
            (w * 1000 + next[w]) as u64,
            "in order within its queue"
        );
        let off = (w * 64 + next[w]) * slot;
        assert!(rbuf.buf.to_vec(off, 200) == *f, "frame {n}'s bytes");
        next[w] += 1;
        // One source, one queue.
        assert_eq!(
            *queue_of.entry(*n).or_insert(w),
            w,
            "source {n} stays in its queue"
        );
    }
    assert_eq!(queue_of[&0], 2, "0x323e8fc2 & 3");
    let used = next.iter().filter(|&&k| k > 0).count();
    assert!(
        used >= 3,
        "33 sources over 4 queues use at least 3: {next:?}"
    );
    // The refusals: a table entry with no receive ring, an RSS QP with a ring.
    let e = g.set_rss(&rss, fields, &MS_KEY, &[rss.qpn]).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::Invalid))),
        "{e:?}"
    );
    let e = g.set_rss(&wqs[0], fields, &MS_KEY, &table).err();
    assert!(
        matches!(e, Some(Error::Status(abi::Status::Invalid))),
        "{e:?}"
    );
}

fn handle(h: u32) -> Vec<u8> {
    vm_memory::ByteValued::as_slice(&abi::Handle {
        handle: h,
        reserved: 0,
    })
    .to_vec()
}
