//! The rig the `backend/fuzz` targets drive (fuzz_targets/rig/mod.rs), in the normal test
//! run: a fixed exchange proves it carries traffic end to end (so a fuzz run that finds
//! nothing is not a rig that does nothing), the inputs the fuzzers found are replayed, and a
//! bounded seeded loop of random inputs runs every time.

#[path = "../fuzz/fuzz_targets/rig/mod.rs"]
mod rig;

use rig::{Input, Rig};

/// Bytes for `Rig::post_recv`: one SGE into the writable MR at `off`, `len` bytes.
fn recv_args(off: u16, len: u16) -> Vec<u8> {
    let mut v = vec![0, 0];
    v.extend(off.to_le_bytes());
    v.extend(len.to_le_bytes());
    v
}

/// Bytes for `Rig::post_send`: opcode kind `kind` (0 = SEND, 4 = WRITE, 6 = READ), one SGE.
fn send_args(kind: u8, off: u16, len: u16) -> Vec<u8> {
    let mut v = vec![kind, 0, 0, 0, 0]; // kind, ex
    v.extend(0x100u16.to_le_bytes()); // remote offset in the MR
    v.push(0); // rkey: the writable MR
    v.push(1); // one SGE
    v.push(0); // into the writable MR
    v.extend(off.to_le_bytes());
    v.extend(len.to_le_bytes());
    v
}

/// Pumps and delivers until the wire is quiet.
fn settle(r: &mut Rig) {
    for _ in 0..16 {
        r.pump(1024);
        while !r.wire.is_empty() {
            r.deliver(0, false, None, 0);
        }
    }
}

#[test]
fn the_rig_carries_rc_uc_and_ud_traffic_to_completion() {
    let mut r = Rig::new();
    let before = r.m.stats().cqes;
    // RC (QP 0 → QP 1, whose receives come from the SRQ): a SEND, a WRITE and a READ.
    r.post_recv(1, &mut Input(&recv_args(0x1000, 0x400)))
        .unwrap();
    r.doorbell(vhost_user_rdma::abi::doorbell::SRQ, r.srqn());
    for (kind, len) in [(0, 0x300), (4, 0x200), (6, 0x100)] {
        r.post_send(0, &mut Input(&send_args(kind, 0x2000, len)))
            .unwrap();
    }
    // UC (QP 2 → 3) and UD (QP 4 → 5) SENDs.
    for (s, d) in [(2, 3), (4, 5)] {
        r.post_recv(d, &mut Input(&recv_args(0x3000, 0x400)))
            .unwrap();
        r.post_send(s, &mut Input(&send_args(0, 0x2000, 0x80)))
            .unwrap();
    }
    for q in [0, 2, 4] {
        let qpn = r.qpn(q);
        r.doorbell(vhost_user_rdma::abi::doorbell::SQ, qpn);
    }
    settle(&mut r);
    for c in 0..rig::NCQ {
        r.consume(c, 64);
    }
    let p = r.m.port_counters();
    assert!(p.rx_packets >= 8, "packets looped back: {p:?}");
    assert_eq!(p.rx_dropped, 0, "{p:?}");
    // 3 RC sends + 1 RC receive + 2 × (send + receive).
    assert_eq!(r.m.stats().cqes - before, 8, "{:?}", r.m.stats());
    r.finish();
}

/// Random inputs of every length, seeded: the same every run.
#[test]
fn a_seeded_random_loop_keeps_every_invariant() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..300 {
        let n = (next() % 512) as usize;
        let data: Vec<u8> = (0..n).map(|_| next() as u8).collect();
        rig::run(&data, 64);
    }
}

/// What the fuzzers found, kept as inputs: backend/fuzz/regressions/<target>/<name>.
#[test]
fn regressions_replay() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
    let mut n = 0;
    for t in std::fs::read_dir(&dir).expect("backend/fuzz/regressions") {
        let t = t.unwrap().path();
        let run: fn(&[u8], usize) = match t.file_name().and_then(|n| n.to_str()) {
            Some("ring_ops") => rig::run,
            Some("rx_place") => rig::run_rx,
            other => panic!("regressions of an unknown target {other:?}"),
        };
        for f in std::fs::read_dir(&t).unwrap() {
            let f = f.unwrap().path();
            eprintln!("replaying {}", f.display());
            run(&std::fs::read(&f).unwrap(), 64);
            n += 1;
        }
    }
    assert!(n > 0, "no regression inputs in {}", dir.display());
}

/// A receive taken for a multi-packet SEND whose first packet arrived, then the QP moved to
/// ERR: the receive completes (flushed) like every other. It used to be dropped.
#[test]
fn a_receive_of_a_send_in_progress_completes_when_its_qp_errs() {
    let mut r = Rig::new();
    r.prologue();
    // The first packet of QP 1's two-packet SEND to QP 0 (its receive is QP 0's first).
    let k = r
        .wire
        .iter()
        .position(|(t, b)| t.qpn.0 == r.qpn(1) && b[0] == 0x00)
        .expect("a SEND FIRST from QP 1");
    r.deliver(k, false, None, 0);
    r.finish();
}
