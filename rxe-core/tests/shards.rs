//! A device in shards (`Device::new_sharded`): every QP in one shard, every other object
//! shared, and the shards driven by threads of their own at the same time.

use std::sync::Barrier;

use rxe_core::device::{Device, RecvMeta};
use rxe_core::mem::{Backing, Memory, VecMemory};
use rxe_core::qp::VerbError;
use rxe_core::sim::{bring_up_pair, ConnOpts};
use rxe_core::verbs::*;
use rxe_core::{DeviceConfig, Gid, Instant, QpInit, Qpn};

const BASE: u64 = 0x1_0000_0000;
const MEM: usize = 4 << 20;

fn qp_init(pd: u32, cq: u32, srq: Option<u32>) -> QpInit {
    QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq,
        xrcd: None,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 2,
            max_recv_sge: 2,
            max_inline_data: 64,
        },
        sq_sig_all: false,
    }
}

#[test]
fn each_qp_lives_in_the_shard_that_made_it_and_everything_else_is_shared() {
    let cfg = DeviceConfig {
        max_qp: 5,
        ..Default::default()
    };
    let mut shards = Device::new_sharded(cfg, 3);
    assert_eq!(shards.len(), 3);
    // Objects made through one shard are every shard's.
    let pd = shards[0].alloc_pd().unwrap();
    let cq = shards[2].create_cq(16).unwrap();
    let srq = shards[1].create_srq(pd, 16, 1, 0).unwrap();
    let key = shards[0]
        .reg_mr(
            pd,
            BASE,
            4096,
            Access::LOCAL_WRITE,
            Backing::Contiguous { base: BASE },
        )
        .unwrap();
    assert_eq!(shards[2].with_mr(key, |m| m.length), Some(4096));
    let mut qpns = Vec::new();
    for (k, s) in shards.iter_mut().enumerate() {
        let qpn = s.create_qp(qp_init(pd, cq, Some(srq))).unwrap();
        assert_eq!(
            Device::shard_of(qpn, 3),
            k as u32,
            "{qpn:?} made in shard {k}"
        );
        assert_eq!(s.shard(), (k as u32, 3));
        qpns.push(qpn);
    }
    // A QP is its shard's alone.
    assert!(shards[0].qp(qpns[1]).is_none());
    assert!(shards[1].qp(qpns[1]).is_some());
    assert_eq!(shards[0].destroy_qp(qpns[1]), Err(VerbError::NotFound));
    // Shared objects in use cannot go, whichever shard asks.
    assert_eq!(shards[1].destroy_cq(cq), Err(VerbError::Busy));
    assert_eq!(shards[0].destroy_srq(srq), Err(VerbError::Busy));
    assert_eq!(shards[2].dealloc_pd(pd), Err(VerbError::Busy));
    // max_qp counts the QPs of every shard.
    shards[0].create_qp(qp_init(pd, cq, None)).unwrap();
    shards[1].create_qp(qp_init(pd, cq, None)).unwrap();
    assert_eq!(
        shards[2].create_qp(qp_init(pd, cq, None)),
        Err(VerbError::NoResources)
    );
    shards[0].destroy_qp(qpns[0]).unwrap();
    let again = shards[2].create_qp(qp_init(pd, cq, None)).unwrap();
    assert_eq!(Device::shard_of(again, 3), 2);
    // The GSI QP (QPN 1) only in shard 1 % 3.
    assert_eq!(
        shards[0].create_qp(QpInit {
            qp_type: QpType::Gsi,
            ..qp_init(pd, cq, None)
        }),
        Err(VerbError::Invalid)
    );
}

/// The sending side of a thread's traffic, and the memory the thread gives its shards.
struct Side {
    dev: Device,
    mem: VecMemory,
}

/// Moves packets both ways between two shards until neither has one; every packet must be
/// taken (the run is lossless).
fn pump(a: &mut Side, b: &mut Side, buf: &mut [u8]) -> usize {
    let now = Instant(1);
    let mut moved = 0;
    loop {
        let mut any = false;
        for dir in 0..2 {
            let (src, dst) = if dir == 0 {
                (&mut *a, &mut *b)
            } else {
                (&mut *b, &mut *a)
            };
            while let Some(t) = src.dev.poll_transmit(now, &mut src.mem, buf) {
                let meta = RecvMeta::from(&t);
                if let Err(e) = dst
                    .dev
                    .handle_packet(now, &meta, &buf[..t.len], &mut dst.mem)
                {
                    panic!("a packet of a lossless run was dropped: {e:?}");
                }
                moved += 1;
                any = true;
            }
        }
        if !any {
            return moved;
        }
    }
}

const MSGS: u64 = 2000;
const LEN: usize = 64;

/// Device A sends to device B, both in two shards. Shard k of A and shard k of B run on
/// thread k, at the same time as the other pair. What the two pairs share: A's MR and CQ
/// (both A QPs complete into one CQ), B's MR, CQ and SRQ (both B QPs take receives from one
/// SRQ). Each thread alternates SENDs and RDMA WRITEs; afterwards every message is accounted
/// for, in order, with its bytes.
#[test]
fn two_shards_on_two_threads_share_one_cq_one_srq_and_the_mrs() {
    let (ga, gb) = (Gid::from_ipv4([10, 0, 0, 1]), Gid::from_ipv4([10, 0, 0, 2]));
    let mut a = Device::new_sharded(DeviceConfig::default(), 2);
    let mut b = Device::new_sharded(DeviceConfig::default(), 2);
    a[0].add_gid(0, ga).unwrap();
    b[1].add_gid(0, gb).unwrap();
    let rw = Access::LOCAL_WRITE.union(Access::REMOTE);
    let (pa, pb) = (a[1].alloc_pd().unwrap(), b[0].alloc_pd().unwrap());
    let ka = a[0]
        .reg_mr(pa, BASE, MEM as u64, rw, Backing::Contiguous { base: BASE })
        .unwrap();
    let kb = b[1]
        .reg_mr(pb, BASE, MEM as u64, rw, Backing::Contiguous { base: BASE })
        .unwrap();
    let cqa = a[0].create_cq(2 * MSGS as u32).unwrap();
    let cqb = b[0].create_cq(2 * MSGS as u32).unwrap();
    let srq = b[1].create_srq(pb, 2 * MSGS as u32, 1, 0).unwrap();
    // Receive slot i is LEN bytes at BASE + i × LEN of B's memory.
    for i in 0..MSGS {
        let sge = Sge {
            addr: BASE + i * LEN as u64,
            length: LEN as u32,
            lkey: kb,
        };
        b[0].post_srq_recv(
            srq,
            RecvWr {
                wr_id: i,
                sg_list: [sge].into(),
            },
        )
        .unwrap();
    }
    let mut qa = [Qpn(0); 2];
    let mut qb = [Qpn(0); 2];
    for k in 0..2 {
        qa[k] = a[k].create_qp(qp_init(pa, cqa, None)).unwrap();
        qb[k] = b[k].create_qp(qp_init(pb, cqb, Some(srq))).unwrap();
        assert_eq!(Device::shard_of(qa[k], 2), k as u32);
        assert_eq!(Device::shard_of(qb[k], 2), k as u32);
    }
    for k in 0..2 {
        bring_up_pair(
            [&mut a[k], &mut b[k]],
            [qa[k], qb[k]],
            [ga, gb],
            &ConnOpts::default(),
        );
    }
    let sides: Vec<(Side, Side)> = a
        .into_iter()
        .zip(b)
        .map(|(a, b)| {
            let side = |dev| Side {
                dev,
                mem: VecMemory::new(BASE, MEM),
            };
            (side(a), side(b))
        })
        .collect();
    // WRITEs of thread k land in the second half of B's memory, in a region of its own.
    let write_at = |k: u64, i: u64| BASE + (MEM as u64 / 2) + (k * MSGS + i) * LEN as u64;
    let start = Barrier::new(2);
    let done: Vec<(Side, Side, usize)> = std::thread::scope(|s| {
        let hs: Vec<_> = sides
            .into_iter()
            .enumerate()
            .map(|(k, (mut a, mut b))| {
                let start = &start;
                s.spawn(move || {
                    let mut buf = vec![0u8; 8192];
                    let (qa, k64) = (qa[k], k as u64);
                    start.wait();
                    let mut moved = 0;
                    let mut next = 0;
                    while next < MSGS || a.dev.sq_outstanding(qa) != Some(0) {
                        while next < MSGS && a.dev.sq_outstanding(qa).unwrap() < 64 {
                            // The source bytes: (thread, message) in A's memory.
                            let src = BASE + (k64 * MSGS + next) * LEN as u64;
                            let mut bytes = [0u8; LEN];
                            bytes[..8].copy_from_slice(&k64.to_le_bytes());
                            bytes[8..16].copy_from_slice(&next.to_le_bytes());
                            a.mem.write(src, &bytes).unwrap();
                            let sge = Sge {
                                addr: src,
                                length: LEN as u32,
                                lkey: ka,
                            };
                            let op = if next % 2 == 0 {
                                SendOp::Send
                            } else {
                                SendOp::Write {
                                    remote_addr: write_at(k64, next),
                                    rkey: kb,
                                }
                            };
                            let wr = SendWr::new(next, op, [sge]);
                            a.dev.post_send(qa, wr).unwrap();
                            next += 1;
                        }
                        moved += pump(&mut a, &mut b, &mut buf);
                    }
                    (a, b, moved)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut done = done;
    // Every shard listed the CQs it completed into.
    for (k, (a, b, moved)) in done.iter_mut().enumerate() {
        assert!(*moved as u64 >= MSGS, "thread {k} moved {moved} packets");
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        a.dev.take_ready_cqs(&mut ra);
        b.dev.take_ready_cqs(&mut rb);
        assert_eq!((ra, rb), (vec![cqa], vec![cqb]), "shard {k}");
    }
    // A's CQ: every WQE of each QP succeeded, in posting order.
    let mut seen = [0u64; 2];
    while let Some(c) = done[0].0.dev.poll_cq(cqa) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        let k = qa
            .iter()
            .position(|q| *q == c.qp_num)
            .expect("one of A's QPs");
        assert_eq!(c.wr_id, seen[k], "QP {k} completes in order");
        seen[k] += 1;
    }
    assert_eq!(seen, [MSGS; 2]);
    // B's CQ: the SENDs of each QP, in order, each in the SRQ slot its CQE names, read from
    // the memory of the thread that took it.
    let mut got = [0u64; 2];
    let mut slots = std::collections::HashSet::new();
    while let Some(c) = done[1].1.dev.poll_cq(cqb) {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        assert_eq!(c.opcode, WcOpcode::Recv);
        let k = qb
            .iter()
            .position(|q| *q == c.qp_num)
            .expect("one of B's QPs");
        assert!(slots.insert(c.wr_id), "SRQ slot {} taken twice", c.wr_id);
        let mut bytes = [0u8; 16];
        done[k]
            .1
            .mem
            .read(BASE + c.wr_id * LEN as u64, &mut bytes)
            .unwrap();
        let who = u64::from_le_bytes(bytes[..8].try_into().unwrap());
        let seq = u64::from_le_bytes(bytes[8..].try_into().unwrap());
        assert_eq!(
            (who, seq),
            (k as u64, got[k] * 2),
            "SEND {} of QP {k}",
            got[k]
        );
        got[k] += 1;
    }
    assert_eq!(got, [MSGS / 2; 2]);
    // The WRITEs, in B's memory as each thread saw it.
    for (k, (_, b, _)) in done.iter_mut().enumerate() {
        for i in (1..MSGS).step_by(2) {
            let mut bytes = [0u8; 16];
            b.mem.read(write_at(k as u64, i), &mut bytes).unwrap();
            assert_eq!(u64::from_le_bytes(bytes[8..].try_into().unwrap()), i);
        }
    }
}
