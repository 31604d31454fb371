//! The external oracle on what the *engine* generates: a simulated workload makes the two nodes
//! send every opcode the engine can emit (all of the table but CNP), over IPv4 and, for one RC
//! connection, IPv6 GIDs; every packet the simulator saw is encapsulated in Ethernet + IP + UDP
//! with [`frame::build`] (which fills the ICRC) from the `Transmit`'s addresses, port, hop limit,
//! traffic class and flow label, and the pcap goes through the same tshark check as
//! `tshark_decode` (`common/tshark.rs`): every field tshark decodes equals what our parser
//! reads, tshark's ICRC equals ours, and tshark reports no malformed packet or expert info.
//! On top of that, tshark's (opcode, PSN, dest QP) of every frame equals what the engine put in
//! the `Transmit`, and the workload must still provoke every opcode and AETH syndrome class
//! listed in [`PROVOKED`] / [`PROVOKED_SYNDROMES`].
//!
//! When tshark is not installed the test prints `SKIP sim_tshark: tshark not installed` and
//! passes, unless `CI=true`, where it fails. `RXE_KEEP_PCAP=1` keeps the pcap.
//!
//! `write_engine_rx_seeds` (ignored; run it with `RXE_FUZZ_SEED_DIR=dir ... --ignored`) writes
//! the workload's packets as seeds of the `engine_rx` fuzz target, see `fuzz/README.md`.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

use common::sge;
use common::tshark::{tshark_check, tshark_version, TSHARK_4_0_UNKNOWN};
use rxe_core::mem::MwType;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::frame::{self, FrameMeta};
use rxe_core::wire::{Opcode, Packet};
use rxe_core::{Gid, QpInit, Qpn};

/// Every opcode the workload must make the engine emit: the whole opcode table except CNP,
/// which the engine never sends (congestion control is not implemented).
const PROVOKED: &[Opcode] = &[
    Opcode(0x00), // RC_SEND_FIRST
    Opcode(0x01), // RC_SEND_MIDDLE
    Opcode(0x02), // RC_SEND_LAST
    Opcode(0x03), // RC_SEND_LAST_WITH_IMMEDIATE
    Opcode(0x04), // RC_SEND_ONLY
    Opcode(0x05), // RC_SEND_ONLY_WITH_IMMEDIATE
    Opcode(0x06), // RC_RDMA_WRITE_FIRST
    Opcode(0x07), // RC_RDMA_WRITE_MIDDLE
    Opcode(0x08), // RC_RDMA_WRITE_LAST
    Opcode(0x09), // RC_RDMA_WRITE_LAST_WITH_IMMEDIATE
    Opcode(0x0a), // RC_RDMA_WRITE_ONLY
    Opcode(0x0b), // RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
    Opcode(0x0c), // RC_RDMA_READ_REQUEST
    Opcode(0x0d), // RC_RDMA_READ_RESPONSE_FIRST
    Opcode(0x0e), // RC_RDMA_READ_RESPONSE_MIDDLE
    Opcode(0x0f), // RC_RDMA_READ_RESPONSE_LAST
    Opcode(0x10), // RC_RDMA_READ_RESPONSE_ONLY (also the empty FLUSH / ATOMIC_WRITE response)
    Opcode(0x11), // RC_ACKNOWLEDGE (ACK, RNR NAK, PSN sequence error NAK)
    Opcode(0x12), // RC_ATOMIC_ACKNOWLEDGE
    Opcode(0x13), // RC_COMPARE_SWAP
    Opcode(0x14), // RC_FETCH_ADD
    Opcode(0x16), // RC_SEND_LAST_WITH_INVALIDATE
    Opcode(0x17), // RC_SEND_ONLY_WITH_INVALIDATE
    Opcode(0x1c), // RC_FLUSH
    Opcode(0x1d), // RC_ATOMIC_WRITE
    Opcode(0x20), // UC_SEND_FIRST
    Opcode(0x21), // UC_SEND_MIDDLE
    Opcode(0x22), // UC_SEND_LAST
    Opcode(0x23), // UC_SEND_LAST_WITH_IMMEDIATE
    Opcode(0x24), // UC_SEND_ONLY
    Opcode(0x25), // UC_SEND_ONLY_WITH_IMMEDIATE
    Opcode(0x26), // UC_RDMA_WRITE_FIRST
    Opcode(0x27), // UC_RDMA_WRITE_MIDDLE
    Opcode(0x28), // UC_RDMA_WRITE_LAST
    Opcode(0x29), // UC_RDMA_WRITE_LAST_WITH_IMMEDIATE
    Opcode(0x2a), // UC_RDMA_WRITE_ONLY
    Opcode(0x2b), // UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE
    Opcode(0x64), // UD_SEND_ONLY
    Opcode(0x65), // UD_SEND_ONLY_WITH_IMMEDIATE
];

/// A named test on an AETH syndrome byte.
type SyndromeClass = (&'static str, fn(u8) -> bool);

/// AETH syndrome classes the workload must provoke, by name and the test on the syndrome byte.
const PROVOKED_SYNDROMES: &[SyndromeClass] = &[
    ("ACK", |b| b >> 5 == 0),
    ("RNR NAK", |b| b >> 5 == 1),
    ("NAK PSN sequence error", |b| b == 0x60),
];

const LW: Access = Access::LOCAL_WRITE;
const MTU: Mtu = Mtu::M256;
/// Three packets at the 256-byte MTU: FIRST, MIDDLE, LAST.
const LONG: usize = 600;
const SHORT: usize = 100;

/// The role of a QP in the workload (the `engine_rx` seeds aim each packet at the fuzz target's
/// QP of the same role).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Rc,
    Uc,
    Ud,
}

/// What the workload leaves behind: the packets, and which QP played which role.
struct Run {
    trace: Vec<Traced>,
    roles: HashMap<(usize, Qpn), Role>,
    v6: [Gid; 2],
}

fn recv(sim: &mut Sim, node: usize, qpn: Qpn, wr_id: u64, addr: u64, len: usize, key: u32) {
    sim.dev(node)
        .post_recv(
            qpn,
            RecvWr {
                wr_id,
                sg_list: sge(addr, len, key).into(),
            },
        )
        .unwrap();
}

/// `Sim::connect` with the GIDs at `sgid_index` (`gids[i]` is node i's GID there).
fn connect_at(sim: &mut Sim, o: ConnOpts, sgid_index: u8, gids: [Gid; 2]) -> [Endpoint; 2] {
    let mut ep = [Endpoint {
        pd: 0,
        cq: 0,
        qpn: Qpn(0),
    }; 2];
    for (i, e) in ep.iter_mut().enumerate() {
        let d = sim.dev(i);
        let pd = d.alloc_pd().unwrap();
        let cq = d.create_cq(o.cqe).unwrap();
        let qpn = d
            .create_qp(QpInit {
                qp_type: o.qp_type,
                pd,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                xrcd: None,
                cap: o.cap,
                sq_sig_all: false,
            })
            .unwrap();
        *e = Endpoint { pd, cq, qpn };
    }
    for i in 0..2 {
        let mut a = QpAttr {
            qp_state: QpState::Init,
            qp_access_flags: o.access,
            ..Default::default()
        };
        let qpn = ep[i].qpn;
        let d = sim.dev(i);
        let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::ACCESS_FLAGS;
        d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
        a.qp_state = QpState::Rtr;
        a.path_mtu = o.mtu;
        a.dest_qp_num = ep[1 - i].qpn.0;
        a.rq_psn = o.sq_psn[1 - i];
        a.max_dest_rd_atomic = o.max_rd_atomic;
        a.min_rnr_timer = o.min_rnr_timer;
        a.av = Av {
            dgid: gids[1 - i],
            sgid_index,
            hop_limit: 32,
            traffic_class: 0x68,
            flow_label: 0x1234 + i as u32,
            ..Default::default()
        };
        let m = AttrMask::STATE
            | AttrMask::AV
            | AttrMask::PATH_MTU
            | AttrMask::DEST_QPN
            | AttrMask::RQ_PSN
            | AttrMask::MAX_DEST_RD_ATOMIC
            | AttrMask::MIN_RNR_TIMER;
        d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
        a.qp_state = QpState::Rts;
        a.sq_psn = o.sq_psn[i];
        a.timeout = o.timeout;
        a.retry_cnt = o.retry_cnt;
        a.rnr_retry = o.rnr_retry;
        a.max_rd_atomic = o.max_rd_atomic;
        let m = AttrMask::STATE
            | AttrMask::SQ_PSN
            | AttrMask::TIMEOUT
            | AttrMask::RETRY_CNT
            | AttrMask::RNR_RETRY
            | AttrMask::MAX_QP_RD_ATOMIC;
        d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
    }
    ep
}

/// A UD QP in RTS on `node` with Q_Key `qkey`: (pd, cq, qpn).
fn ud_qp(sim: &mut Sim, node: usize, qkey: u32) -> (u32, u32, Qpn) {
    let d = sim.dev(node);
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(64).unwrap();
    let qpn = d
        .create_qp(QpInit {
            qp_type: QpType::Ud,
            pd,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            xrcd: None,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all: true,
        })
        .unwrap();
    let mut a = QpAttr {
        qp_state: QpState::Init,
        qkey,
        ..Default::default()
    };
    let m = AttrMask::STATE | AttrMask::PKEY_INDEX | AttrMask::PORT | AttrMask::QKEY;
    d.modify_qp(qpn, &a, AttrMask(m)).unwrap();
    a.qp_state = QpState::Rtr;
    d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE)).unwrap();
    a.qp_state = QpState::Rts;
    d.modify_qp(qpn, &a, AttrMask(AttrMask::STATE | AttrMask::SQ_PSN))
        .unwrap();
    (pd, cq, qpn)
}

/// Settles and checks that every completion on `node`'s `cq` succeeded; returns their wr_ids.
fn all_ok(sim: &mut Sim, node: usize, cq: u32) -> Vec<u64> {
    sim.settle(100_000);
    let c = sim.poll_all(node, cq);
    for x in &c {
        assert_eq!(x.status, WcStatus::Success, "node {node}: {x:?}");
    }
    c.iter().map(|x| x.wr_id).collect()
}

/// Fills `len` bytes at `addr` of `node` with a pattern.
fn fill(sim: &mut Sim, node: usize, addr: u64, len: usize) {
    for (i, b) in sim.nodes[node]
        .mem
        .slice_mut(addr, len)
        .iter_mut()
        .enumerate()
    {
        *b = (i * 7 + 3) as u8;
    }
}

/// RC over IPv4: every RC opcode, a PSN sequence error NAK and an RNR NAK.
fn rc_v4(sim: &mut Sim, roles: &mut HashMap<(usize, Qpn), Role>) {
    let ep = sim.connect(ConnOpts {
        mtu: MTU,
        min_rnr_timer: 1,
        timeout: 10,
        access: LW.union(Access::REMOTE).union(Access::FLUSH_GLOBAL),
        ..Default::default()
    });
    roles.insert((0, ep[0].qpn), Role::Rc);
    roles.insert((1, ep[1].qpn), Role::Rc);
    let remote = Access(LW.0 | Access::REMOTE.0 | Access::FLUSH_GLOBAL.0);
    let (lbuf, lkey) = sim.reg(0, ep[0].pd, 8192, LW);
    fill(sim, 0, lbuf, 8192);
    let (rbuf, rkey) = sim.reg(1, ep[1].pd, 8192, remote);
    fill(sim, 1, rbuf, 8192);
    let (rq, rqkey) = sim.reg(1, ep[1].pd, 1024 * 10, LW);
    // Receives: 6 SENDs, 2 WRITEs with immediate, the SEND that loses a packet. None left for
    // the SEND that draws the RNR NAK.
    for i in 0..9 {
        recv(sim, 1, ep[1].qpn, 100 + i, rq + 1024 * i, 1024, rqkey);
    }
    // Two fast-registered MRs on node 1 for the two SENDs with invalidate to revoke.
    let page = (sim.alloc(1, 3 * 4096) + 4095) & !4095;
    let mut inv = vec![];
    for k in 0..2u64 {
        let mr = sim.dev(1).alloc_mr(ep[1].pd, 1).unwrap();
        let key = (mr & !0xff) | 0x33;
        let reg = SendOp::RegMr {
            lkey: mr,
            key,
            access: LW.union(Access::REMOTE_WRITE),
            iova: 0x7000_0000,
            length: 4096,
            page_shift: 12,
            page_offset: 0,
            pages: vec![page + 4096 * k],
        };
        sim.dev(1)
            .post_send(ep[1].qpn, SendWr::new(200 + k, reg, vec![]))
            .unwrap();
        inv.push(key);
    }
    assert_eq!(all_ok(sim, 1, ep[1].cq), vec![200, 201]);

    let ops = [
        (SendOp::Send, LONG),
        (SendOp::Send, SHORT),
        (SendOp::SendWithImm(0x1234_5678), LONG),
        (SendOp::SendWithImm(0x9abc_def0), SHORT),
        (SendOp::SendWithInv(inv[0]), LONG),
        (SendOp::SendWithInv(inv[1]), SHORT),
        (
            SendOp::Write {
                remote_addr: rbuf,
                rkey,
            },
            LONG,
        ),
        (
            SendOp::Write {
                remote_addr: rbuf + 1024,
                rkey,
            },
            SHORT,
        ),
        (
            SendOp::WriteWithImm {
                remote_addr: rbuf + 2048,
                rkey,
                imm: 0x0bad_cafe,
            },
            LONG,
        ),
        (
            SendOp::WriteWithImm {
                remote_addr: rbuf + 3072,
                rkey,
                imm: 0x00dd_ba11,
            },
            SHORT,
        ),
        (
            SendOp::Read {
                remote_addr: rbuf + 4096,
                rkey,
            },
            LONG,
        ),
        (
            SendOp::Read {
                remote_addr: rbuf + 5120,
                rkey,
            },
            SHORT,
        ),
        (
            SendOp::CompSwap {
                remote_addr: rbuf + 6144,
                rkey,
                compare: 0,
                swap: 0x1111,
            },
            8,
        ),
        (
            SendOp::FetchAdd {
                remote_addr: rbuf + 6152,
                rkey,
                add: 5,
            },
            8,
        ),
        (
            SendOp::AtomicWrite {
                remote_addr: rbuf + 6160,
                rkey,
            },
            8,
        ),
        (
            SendOp::Flush {
                remote_addr: rbuf,
                rkey,
                len: 8192,
                selectivity: 0,
                placement: 1,
            },
            0,
        ),
    ];
    let n = ops.len() as u64;
    for (i, (op, len)) in ops.into_iter().enumerate() {
        let l = if len == 0 {
            vec![]
        } else {
            sge(lbuf + 8 * i as u64, len, lkey)
        };
        let mut w = SendWr::new(i as u64, op, l);
        w.flags |= SEND_SOLICITED;
        sim.dev(0).post_send(ep[0].qpn, w).unwrap();
    }
    assert_eq!(all_ok(sim, 0, ep[0].cq), (0..n).collect::<Vec<_>>());
    assert_eq!(all_ok(sim, 1, ep[1].cq).len(), 8);

    // Lose one of the first two packets of a three-packet SEND: the responder NAKs the next
    // one with a PSN sequence error and the requester goes back.
    let naks = sim.dev(1).qp_counters(ep[1].qpn).unwrap().naks_sent;
    sim.link[0].drop_every = 2;
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(50, SendOp::Send, sge(lbuf, LONG, lkey)),
        )
        .unwrap();
    sim.step();
    sim.link[0].drop_every = 0;
    assert_eq!(all_ok(sim, 0, ep[0].cq), vec![50]);
    assert_eq!(all_ok(sim, 1, ep[1].cq), vec![108]);
    assert!(sim.dev(1).qp_counters(ep[1].qpn).unwrap().naks_sent > naks);

    // A SEND with no receive posted draws RNR NAKs until one is.
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(51, SendOp::Send, sge(lbuf, 64, lkey)),
        )
        .unwrap();
    sim.run_until(100_000, |s| {
        s.dev(1).qp_counters(ep[1].qpn).unwrap().rnr_naks_sent >= 1
    });
    recv(sim, 1, ep[1].qpn, 109, rq, 1024, rqkey);
    assert_eq!(all_ok(sim, 0, ep[0].cq), vec![51]);
    assert_eq!(all_ok(sim, 1, ep[1].cq), vec![109]);
}

/// UC over IPv4: every UC opcode.
fn uc(sim: &mut Sim, roles: &mut HashMap<(usize, Qpn), Role>) {
    let ep = sim.connect(ConnOpts {
        qp_type: QpType::Uc,
        mtu: MTU,
        ..Default::default()
    });
    roles.insert((0, ep[0].qpn), Role::Uc);
    roles.insert((1, ep[1].qpn), Role::Uc);
    let (lbuf, lkey) = sim.reg(0, ep[0].pd, 4096, LW);
    fill(sim, 0, lbuf, 4096);
    let (rbuf, rkey) = sim.reg(1, ep[1].pd, 4096, LW.union(Access::REMOTE_WRITE));
    let (rq, rqkey) = sim.reg(1, ep[1].pd, 1024 * 6, LW);
    for i in 0..6 {
        recv(sim, 1, ep[1].qpn, 300 + i, rq + 1024 * i, 1024, rqkey);
    }
    let w = |remote_addr| SendOp::Write { remote_addr, rkey };
    let wi = |remote_addr, imm| SendOp::WriteWithImm {
        remote_addr,
        rkey,
        imm,
    };
    let ops = [
        (SendOp::Send, LONG),
        (SendOp::Send, SHORT),
        (SendOp::SendWithImm(1), LONG),
        (SendOp::SendWithImm(2), SHORT),
        (w(rbuf), LONG),
        (w(rbuf + 1024), SHORT),
        (wi(rbuf + 2048, 3), LONG),
        (wi(rbuf + 3072, 4), SHORT),
    ];
    let n = ops.len() as u64;
    for (i, (op, len)) in ops.into_iter().enumerate() {
        sim.dev(0)
            .post_send(ep[0].qpn, SendWr::new(i as u64, op, sge(lbuf, len, lkey)))
            .unwrap();
    }
    assert_eq!(all_ok(sim, 0, ep[0].cq), (0..n).collect::<Vec<_>>());
    assert_eq!(all_ok(sim, 1, ep[1].cq).len(), 6);
}

/// UD over IPv4: SEND_ONLY with and without immediate.
fn ud(sim: &mut Sim, roles: &mut HashMap<(usize, Qpn), Role>) {
    let a = ud_qp(sim, 0, 0x1111);
    let b = ud_qp(sim, 1, 0x1111);
    roles.insert((0, a.2), Role::Ud);
    roles.insert((1, b.2), Role::Ud);
    let (rq, rqkey) = sim.reg(1, b.0, 512, LW);
    for i in 0..2 {
        recv(sim, 1, b.2, 400 + i, rq + 256 * i, 256, rqkey);
    }
    let av = Av {
        dgid: sim.nodes[1].gid,
        sgid_index: 0,
        hop_limit: 64,
        ..Default::default()
    };
    for (i, op) in [SendOp::Send, SendOp::SendWithImm(0x55aa)]
        .into_iter()
        .enumerate()
    {
        let mut w = SendWr::new(i as u64, op, vec![]);
        w.flags |= SEND_INLINE;
        w.inline_data = b"datagram payload, 31 bytes long".to_vec();
        w.ud = Some(UdDest {
            av,
            remote_qpn: b.2,
            remote_qkey: 0x1111,
        });
        sim.dev(0).post_send(a.2, w).unwrap();
    }
    assert_eq!(all_ok(sim, 0, a.1), vec![0, 1]);
    assert_eq!(all_ok(sim, 1, b.1), vec![400, 401]);
}

/// RC over IPv6 GIDs (index 1 on both nodes): SEND, WRITE, READ, an atomic.
fn rc_v6(sim: &mut Sim, roles: &mut HashMap<(usize, Qpn), Role>, gids: [Gid; 2]) {
    for (i, g) in gids.iter().enumerate() {
        sim.dev(i).add_gid(1, *g).unwrap();
    }
    let ep = connect_at(
        sim,
        ConnOpts {
            mtu: MTU,
            ..Default::default()
        },
        1,
        gids,
    );
    roles.insert((0, ep[0].qpn), Role::Rc);
    roles.insert((1, ep[1].qpn), Role::Rc);
    let (lbuf, lkey) = sim.reg(0, ep[0].pd, 4096, LW);
    fill(sim, 0, lbuf, 4096);
    let (rbuf, rkey) = sim.reg(1, ep[1].pd, 4096, LW.union(Access::REMOTE));
    let (rq, rqkey) = sim.reg(1, ep[1].pd, 1024, LW);
    recv(sim, 1, ep[1].qpn, 500, rq, 1024, rqkey);
    let ops = [
        (SendOp::SendWithImm(6), LONG),
        (
            SendOp::Write {
                remote_addr: rbuf,
                rkey,
            },
            SHORT,
        ),
        (
            SendOp::Read {
                remote_addr: rbuf,
                rkey,
            },
            LONG,
        ),
        (
            SendOp::FetchAdd {
                remote_addr: rbuf + 2048,
                rkey,
                add: 1,
            },
            8,
        ),
    ];
    for (i, (op, len)) in ops.into_iter().enumerate() {
        sim.dev(0)
            .post_send(
                ep[0].qpn,
                SendWr::new(i as u64, op, sge(lbuf + 1024, len, lkey)),
            )
            .unwrap();
    }
    assert_eq!(all_ok(sim, 0, ep[0].cq), vec![0, 1, 2, 3]);
    assert_eq!(all_ok(sim, 1, ep[1].cq), vec![500]);
}

/// The whole workload, traced.
fn run() -> Run {
    let mut sim = Sim::new(0x5eed);
    sim.trace = Some(Vec::new());
    let mut roles = HashMap::new();
    let v6 = [
        Gid("fd00:5eed::1"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()),
        Gid("fd00:5eed::2"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets()),
    ];
    rc_v4(&mut sim, &mut roles);
    uc(&mut sim, &mut roles);
    ud(&mut sim, &mut roles);
    rc_v6(&mut sim, &mut roles, v6);
    // A memory window is bound and used on the way, so MW keys show up too.
    let ep = sim.connect(ConnOpts::default());
    let (mr, mrkey) = sim.reg(
        1,
        ep[1].pd,
        4096,
        Access(Access::ALL.0 & !(0x60 | Access::FLUSH_PERSISTENT.0)),
    );
    let mw = sim.dev(1).alloc_mw(ep[1].pd, MwType::Type1).unwrap();
    let key = sim
        .dev(1)
        .bind_mw_type1(ep[1].qpn, mw, mrkey, mr, 4096, Access::REMOTE_READ)
        .unwrap();
    roles.insert((0, ep[0].qpn), Role::Rc);
    roles.insert((1, ep[1].qpn), Role::Rc);
    let (l, lk) = sim.reg(0, ep[0].pd, 64, LW);
    sim.dev(0)
        .post_send(
            ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Read {
                    remote_addr: mr + 64,
                    rkey: key,
                },
                sge(l, 64, lk),
            ),
        )
        .unwrap();
    assert_eq!(all_ok(&mut sim, 0, ep[0].cq), vec![1]);
    Run {
        trace: sim.trace.take().unwrap(),
        roles,
        v6,
    }
}

/// The MAC of simulator node `i` (`Sim::with_config` gives node i `02:00:00:00:00:0{i+1}`).
fn mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, i as u8 + 1]
}

/// Ethernet + IP + UDP around one traced packet, ICRC filled.
fn frame_of(t: &Traced) -> Vec<u8> {
    let tx = &t.tx;
    let dmac = if tx.dmac == [0; 6] {
        mac(1 - t.from)
    } else {
        tx.dmac
    };
    let mut m =
        FrameMeta::new(tx.src.to_ip(), tx.dst.to_ip(), tx.sport).with_eth(mac(t.from), dmac);
    m.traffic_class = tx.traffic_class;
    m.hop_limit = tx.hop_limit;
    m.flow_label = tx.flow_label;
    let mut out = vec![0u8; m.header_len().unwrap() + t.bytes.len()];
    let n = frame::build(&mut out, &m, &t.bytes).unwrap();
    assert_eq!(n, out.len());
    out
}

#[test]
fn tshark_decodes_what_the_engine_sends() {
    let r = run();
    let trace = &r.trace;

    // What the engine emitted, from the bytes it handed out.
    let mut emitted = Vec::new();
    let mut syndromes = BTreeSet::new();
    for t in trace {
        assert_eq!(t.tx.len, t.bytes.len());
        let p = Packet::new_checked(&t.bytes[..]).expect("the engine's packet parses");
        emitted.push((p.opcode().0, p.bth().psn(), p.bth().dest_qp()));
        if p.opcode() == Opcode::RC_ACKNOWLEDGE {
            syndromes.insert(p.aeth().unwrap().syndrome_byte());
        }
    }
    let ops: BTreeSet<u8> = emitted.iter().map(|e| e.0).collect();
    let missing: Vec<Opcode> = PROVOKED
        .iter()
        .filter(|o| !ops.contains(&o.0))
        .copied()
        .collect();
    assert!(
        missing.is_empty(),
        "the workload no longer provokes {missing:?}"
    );
    let unexpected: Vec<Opcode> = ops
        .iter()
        .filter(|o| !PROVOKED.contains(&Opcode(**o)))
        .map(|o| Opcode(*o))
        .collect();
    assert!(unexpected.is_empty(), "not in PROVOKED: {unexpected:?}");
    for (name, is) in PROVOKED_SYNDROMES {
        assert!(
            syndromes.iter().any(|b| is(*b)),
            "no {name} among the AETH syndromes {syndromes:x?}"
        );
    }
    // Both address families went out, and the IPv6 connection used the IPv6 GIDs.
    assert!(trace
        .iter()
        .any(|t| t.tx.src == r.v6[0] && t.tx.dst == r.v6[1]));
    assert!(trace
        .iter()
        .any(|t| t.tx.src == r.v6[1] && t.tx.dst == r.v6[0]));
    assert!(trace.iter().any(|t| t.tx.src.ipv4().is_some()));
    assert!(r.roles.values().any(|x| *x == Role::Ud));

    let Some(version) = tshark_version() else {
        vur_testkit::skip("sim_tshark", "tshark not installed");
        return;
    };
    let frames: Vec<Vec<u8>> = trace.iter().map(frame_of).collect();
    let rep = tshark_check("sim", &frames, true).expect("tshark vanished");
    assert_eq!(rep.full + rep.bth_only.len(), frames.len());
    for op in &rep.bth_only {
        assert!(
            TSHARK_4_0_UNKNOWN.contains(op),
            "tshark did not decode {:?}",
            Opcode(*op)
        );
    }
    // tshark's opcode, PSN and dest QP of every frame are the engine's.
    assert_eq!(rep.decoded, emitted);
    let decoded: BTreeSet<u8> = rep.decoded.iter().map(|d| d.0).collect();
    assert_eq!(decoded, ops);
    println!(
        "sim_tshark: {} frames, {} distinct opcodes ({} decoded fully by tshark), {version}",
        frames.len(),
        ops.len(),
        ops.iter().filter(|o| !rep.bth_only.contains(o)).count(),
    );
}

/// Role selectors of the `engine_rx` fuzz target's Inject operation (`fuzz/fuzz_targets/
/// engine_rx.rs`, `Sel`): 1 = its RC QP, 3 = its UC QP, 4 = its UD QP.
fn role_sel(r: Role) -> u8 {
    match r {
        Role::Rc => 1,
        Role::Uc => 3,
        Role::Ud => 4,
    }
}

/// One Inject operation of the `engine_rx` input format: opcode byte 0, target node, QPN
/// selector, address selector (0: from the peer's IPv4 GID), length (u16 LE), the packet.
fn inject_op(out: &mut Vec<u8>, to: usize, sel: u8, bytes: &[u8]) {
    out.extend_from_slice(&[0, to as u8, sel, 0]);
    out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
    out.extend_from_slice(bytes);
}

/// With `RXE_FUZZ_SEED_DIR` set, writes seeds for the `engine_rx` fuzz target there: the
/// workload's packets, each aimed at the fuzz target's QP of the same role, in runs of 12
/// consecutive packets of one connection. See `fuzz/README.md`.
#[test]
#[ignore = "writes fuzzing seeds; needs RXE_FUZZ_SEED_DIR"]
fn write_engine_rx_seeds() {
    let dir = PathBuf::from(std::env::var_os("RXE_FUZZ_SEED_DIR").expect("RXE_FUZZ_SEED_DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let r = run();
    // Group by connection: the (sender, QPN) of each packet.
    let mut by_conn: Vec<((usize, Qpn), Vec<&Traced>)> = Vec::new();
    for t in &r.trace {
        let k = (t.from, t.tx.qpn);
        match by_conn.iter_mut().find(|c| c.0 == k) {
            Some(c) => c.1.push(t),
            None => by_conn.push((k, vec![t])),
        }
    }
    let mut n = 0;
    for ((from, qpn), pkts) in by_conn {
        let role = r.roles[&(from, qpn)];
        for (k, chunk) in pkts.chunks(12).enumerate() {
            let mut seed = Vec::new();
            for t in chunk {
                inject_op(&mut seed, 1 - t.from, role_sel(role), &t.bytes);
            }
            let name = format!("{role:?}-node{from}-qp{:x}-{k:02}", qpn.0).to_lowercase();
            std::fs::write(dir.join(name), seed).unwrap();
            n += 1;
        }
    }
    println!("wrote {n} seeds to {}", dir.display());
}
