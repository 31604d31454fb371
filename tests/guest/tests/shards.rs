//! `--engine-shards`: two daemons whose engines run in three shards, two test guests. The
//! guests' QPs land in every shard (their QPNs say which) and share one CQ per side and one
//! SRQ, as QPs of one device do; every message arrives, in order per QP, with its bytes.
//!
//! The whole suite also runs against sharded daemons:
//! `VUR_DAEMON_ARGS="--engine-shards 3" cargo test -p vur-testguest`.

mod common;

use common::{bin, T};
use rxe_core::verbs::*;
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
const SHARDS: u32 = 3;
const PAIRS: usize = 6;
const MSGS: usize = 20;

#[test]
fn qps_of_every_shard_share_one_cq_and_one_srq() {
    shared_cq_and_srq(&["--engine-shards", "3"]);
}

/// The same with `--shard-threads`: shards 1 and 2 on threads of their own, each with a
/// socket the kernel steers its QPs' packets to. Their sockets carried their QPs' traffic.
#[test]
fn qps_of_every_shard_share_one_cq_and_one_srq_with_a_thread_per_shard() {
    shared_cq_and_srq(&["--engine-shards", "3", "--shard-threads"]);
}

fn shared_cq_and_srq(arg: &[&str]) {
    // (The whole suite may run with threads: `VUR_DAEMON_ARGS`.)
    let threads = arg.contains(&"--shard-threads")
        || std::env::var("VUR_DAEMON_ARGS").is_ok_and(|a| a.contains("--shard-threads"));
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, arg).expect("node a");
    let mut b = Node::start(bin(), ba, arg).expect("node b");
    let o = ConnOpts::default();
    let pa = a.guest.alloc_pd().unwrap();
    let pb = b.guest.alloc_pd().unwrap();
    let ca = a.guest.create_cq(1023).unwrap();
    let cb = b.guest.create_cq(1023).unwrap();
    let srq = b.guest.create_srq(pb, 256, 1, 0).unwrap();
    let cap_b = QpCap {
        max_recv_wr: 0,
        max_recv_sge: 0,
        ..o.cap
    };
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..PAIRS {
        qa.push(
            a.guest
                .create_qp(QpType::Rc, pa, &ca, &ca, None, o.cap)
                .unwrap(),
        );
        qb.push(
            b.guest
                .create_qp(QpType::Rc, pb, &cb, &cb, Some(&srq), cap_b)
                .unwrap(),
        );
    }
    // The QPs went to every shard: their QPNs take every residue.
    for (side, qs) in [("a", &qa), ("b", &qb)] {
        let mut shards: Vec<u32> = qs.iter().map(|q| q.qpn % SHARDS).collect();
        shards.sort_unstable();
        shards.dedup();
        let qpns: Vec<u32> = qs.iter().map(|q| q.qpn).collect();
        assert_eq!(shards, [0, 1, 2], "side {side}: QPNs {qpns:?}");
    }
    for i in 0..PAIRS {
        bring_up(&mut a.guest, &qa[i], b.gid, qb[i].qpn, &o).unwrap();
        bring_up(&mut b.guest, &qb[i], a.gid, qa[i].qpn, &o).unwrap();
    }
    let (s, r) = (
        a.guest.reg_mr(pa, PAIRS * MSGS * 64, ALL).unwrap(),
        b.guest.reg_mr(pb, 2 * PAIRS * MSGS * 64, ALL).unwrap(),
    );
    post_traffic(&mut a, &mut b, &srq, &qa, &s, &r);
    sends_complete_in_order(&mut a, &ca, &qa);
    sends_land_in_their_srq_slots(&mut b, &cb, &qb, &r);
    every_shard_has_two_qps_and_traffic(&a, &b);
    shard_sockets_carry_their_shards_packets(&a, &b, threads);
    for (i, _) in qa.iter().enumerate() {
        for m in (1..MSGS).step_by(2) {
            let mut got = [0u8; 17];
            r.buf.read(write_at(i, m), &mut got);
            assert_eq!(
                String::from_utf8_lossy(&got),
                format!("pair {i} message {m:02}")
            );
        }
    }
}

/// Where message `m` of pair `i` is written, if it is a WRITE: the second half of b's MR.
fn write_at(i: usize, m: usize) -> usize {
    PAIRS * MSGS * 64 + (i * MSGS + m) * 64
}

/// Receives into b's SRQ (slot k: 64 bytes at k × 64 of `r`); message m of pair i from a's
/// `s`: a SEND when m is even (into an SRQ slot), else a WRITE into the second half of `r`.
fn post_traffic(a: &mut Node, b: &mut Node, srq: &Srq, qa: &[Qp], s: &Mr, r: &Mr) {
    // Receive slot k: 64 bytes at k × 64.
    for k in 0..PAIRS * MSGS / 2 {
        b.guest
            .post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: k as u64,
                    sg_list: vec![r.sge(k * 64, 64)].into(),
                },
            )
            .unwrap();
    }
    // Message m of pair i: a SEND when m is even (into an SRQ slot), else a WRITE into the
    // second half of b's MR.
    for m in 0..MSGS {
        for (i, q) in qa.iter().enumerate() {
            let at = (i * MSGS + m) * 64;
            s.buf
                .write(at, format!("pair {i} message {m:02}").as_bytes());
            let op = if m % 2 == 0 {
                SendOp::Send
            } else {
                SendOp::Write {
                    remote_addr: r.addr(write_at(i, m)),
                    rkey: r.rkey,
                }
            };
            let wr = SendWr::new((i * MSGS + m) as u64, op, vec![s.sge(at, 64)]);
            a.guest.post_send(q, &wr).unwrap();
        }
    }
}

/// a: every WQE of each QP succeeded, in posting order.
fn sends_complete_in_order(a: &mut Node, ca: &Cq, qa: &[Qp]) {
    let wa = a.guest.wait_cq(ca, PAIRS * MSGS, T);
    assert_eq!(wa.len(), PAIRS * MSGS, "send completions on the shared CQ");
    let mut next = [0usize; PAIRS];
    for w in &wa {
        assert_eq!(w.status, 0, "{w:?}");
        let i = qa
            .iter()
            .position(|q| q.qpn == w.qp_num)
            .expect("one of a's QPs");
        assert_eq!(
            w.wr_id as usize,
            i * MSGS + next[i],
            "QP {i} completes in order"
        );
        next[i] += 1;
    }
}

/// b: each QP's SENDs, in order, each in the SRQ slot its completion names.
fn sends_land_in_their_srq_slots(b: &mut Node, cb: &Cq, qb: &[Qp], r: &Mr) {
    let wb = b.guest.wait_cq(cb, PAIRS * MSGS / 2, T);
    assert_eq!(
        wb.len(),
        PAIRS * MSGS / 2,
        "receive completions on the shared CQ"
    );
    let mut next = [0usize; PAIRS];
    for w in &wb {
        assert_eq!(w.status, 0, "{w:?}");
        let i = qb
            .iter()
            .position(|q| q.qpn == w.qp_num)
            .expect("one of b's QPs");
        let mut got = [0u8; 17];
        r.buf.read(w.wr_id as usize * 64, &mut got);
        let want = format!("pair {i} message {:02}", next[i]);
        assert_eq!(
            String::from_utf8_lossy(&got),
            want,
            "SEND {} of QP {i}",
            next[i] / 2
        );
        next[i] += 2;
    }
}

/// Each daemon's counters: two QPs in every shard, and packets through every shard.
fn every_shard_has_two_qps_and_traffic(a: &Node, b: &Node) {
    for (side, n) in [("a", a), ("b", b)] {
        let c = n.daemon.counters().expect("counters");
        for k in 0..SHARDS {
            let get = |key| {
                json_u64(&c, &format!("shard{k}"), key)
                    .unwrap_or_else(|| panic!("side {side}: no shard{k}.{key} in {c}"))
            };
            assert_eq!(get("qps"), 2, "side {side}, shard {k}: {c}");
            // The two QPs' messages one way, ACKs (coalesced) the other.
            let (rx, tx) = (get("rx_packets"), get("tx_packets"));
            assert!(rx > 0 && tx > 0, "side {side}, shard {k}: {c}");
            assert!(rx.max(tx) >= 2 * MSGS as u64, "side {side}, shard {k}: {c}");
        }
        assert!(!c.contains("\"shard3\""), "side {side}: {c}");
    }
}

/// With threads: shards 1 and 2 sent and received on their own sockets, every packet of
/// their QPs and nothing else. A thread publishes its socket's counters at the end of the
/// pass that sent the last ACK: wait for that pass, no longer.
fn shard_sockets_carry_their_shards_packets(a: &Node, b: &Node, threads: bool) {
    for (side, n) in [("a", a), ("b", b)] {
        let sockets = |c: &str| -> Vec<Option<(u64, u64, u64, u64)>> {
            (1..SHARDS)
                .map(|k| {
                    let s = &c[c.find("\"shard_sockets\"")?..];
                    let sh = format!("shard{k}");
                    Some((
                        json_u64(s, &sh, "rx_packets")?,
                        json_u64(s, &sh, "tx_packets")?,
                        json_u64(c, &sh, "rx_packets")?,
                        json_u64(c, &sh, "tx_packets")?,
                    ))
                })
                .collect()
        };
        let mut c = n.daemon.counters().expect("counters");
        if !threads {
            assert!(!c.contains("shard_sockets"), "side {side}: {c}");
            continue;
        }
        let agree = |c: &str| {
            sockets(c)
                .iter()
                .all(|s| s.is_some_and(|(rx, tx, erx, etx)| rx == erx && tx == etx))
        };
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !agree(&c) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(10));
            c = n.daemon.counters().expect("counters");
        }
        assert!(
            agree(&c),
            "side {side}: the sockets of shards 1 and 2 (rx, tx) did not come to carry \
             exactly their engine shards' packets (rx, tx) within 5 s: {:?} in {c}",
            sockets(&c)
        );
    }
}
