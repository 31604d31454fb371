//! A duplicate READ request replayed from the responder's resources. Like
//! Linux rxe (`duplicate_request()` marks the resource `rdatm_res_state_replay` unless the PSN
//! is the READ's first, and `read_reply()` then sends MIDDLE or LAST): a duplicate that
//! restarts inside the message is answered MIDDLE … LAST (LAST alone for its last packet); one
//! from the READ's first PSN is answered FIRST … LAST (ONLY when it fits one packet). Same
//! PSNs and data either way.

use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode, Packet};

const MTU: u32 = 1024;
const PSN: u32 = 0x100;

struct Setup {
    sim: Sim,
    ep: [Endpoint; 2],
    va: u64,
    rkey: u32,
    data: Vec<u8>,
}

fn setup() -> Setup {
    let mut sim = Sim::new(33);
    let ep = sim.connect(ConnOpts {
        mtu: Mtu::M1024,
        ..Default::default()
    });
    let len = 4 * MTU as usize;
    let (va, rkey) = sim.reg(1, ep[1].pd, len, Access::LOCAL_WRITE.union(Access::REMOTE));
    let data = rxe_core::sim::prng_pattern(31, len);
    sim.nodes[1].mem.slice_mut(va, len).copy_from_slice(&data);
    Setup {
        sim,
        ep,
        va,
        rkey,
        data,
    }
}

/// A READ request from node 0 to node 1's QP.
fn read_req(s: &mut Setup, psn: u32, va: u64, len: u32) {
    let mut buf = vec![0u8; 256];
    let bth = BthRepr::new(Opcode::RC_RDMA_READ_REQUEST, s.ep[1].qpn.0, psn, true);
    let ext = ExtRepr {
        reth: (va, s.rkey, len),
        ..Default::default()
    };
    let (n, _) = emit(&mut buf, &bth, &ext, 0).unwrap();
    let _ = s.sim.inject(1, &buf[..n]);
}

/// What node 1 sends: (opcode, PSN, payload).
fn responses(s: &mut Setup) -> Vec<(Opcode, u32, Vec<u8>)> {
    responses_n(s, usize::MAX)
}

/// The first `n` packets node 1 has ready.
fn responses_n(s: &mut Setup, n: usize) -> Vec<(Opcode, u32, Vec<u8>)> {
    s.sim
        .take(1, n)
        .iter()
        .map(|(_, b)| {
            let p = Packet::new_checked(&b[..]).unwrap();
            (p.opcode(), p.bth().psn(), p.payload().to_vec())
        })
        .collect()
}

fn ops(r: &[(Opcode, u32, Vec<u8>)]) -> Vec<(Opcode, u32)> {
    r.iter().map(|(o, p, _)| (*o, *p)).collect()
}

fn payload(r: &[(Opcode, u32, Vec<u8>)]) -> Vec<u8> {
    r.iter().flat_map(|(_, _, d)| d.iter().copied()).collect()
}

use Opcode as O;

/// The original READ (4 packets, PSN 0x100..0x103), answered in full.
fn original(s: &mut Setup) {
    let va = s.va;
    read_req(s, PSN, va, 4 * MTU);
    let r = responses(s);
    assert_eq!(
        ops(&r),
        [
            (O::RC_RDMA_READ_RESPONSE_FIRST, PSN),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN + 1),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN + 2),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN + 3),
        ]
    );
    assert_eq!(payload(&r), s.data);
}

#[test]
fn a_duplicate_read_from_mid_message_continues_with_middle_then_last() {
    let mut s = setup();
    original(&mut s);
    // The requester lost the responses from PSN 0x102 on and asks again from there.
    let va = s.va + 2 * MTU as u64;
    read_req(&mut s, PSN + 2, va, 2 * MTU);
    let r = responses(&mut s);
    assert_eq!(
        ops(&r),
        [
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN + 2),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN + 3),
        ]
    );
    assert_eq!(payload(&r), &s.data[2 * MTU as usize..]);
    assert_eq!(s.sim.dev(1).qp_counters(s.ep[1].qpn).unwrap().duplicates, 1);
}

#[test]
fn a_duplicate_read_of_the_last_packet_is_a_lone_last() {
    let mut s = setup();
    original(&mut s);
    let va = s.va + 3 * MTU as u64;
    read_req(&mut s, PSN + 3, va, MTU);
    let r = responses(&mut s);
    assert_eq!(ops(&r), [(O::RC_RDMA_READ_RESPONSE_LAST, PSN + 3)]);
    assert_eq!(payload(&r), &s.data[3 * MTU as usize..]);
}

#[test]
fn a_duplicate_read_from_the_first_psn_starts_with_first() {
    let mut s = setup();
    original(&mut s);
    let va = s.va;
    read_req(&mut s, PSN, va, 4 * MTU);
    let r = responses(&mut s);
    assert_eq!(
        ops(&r),
        [
            (O::RC_RDMA_READ_RESPONSE_FIRST, PSN),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN + 1),
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN + 2),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN + 3),
        ]
    );
    assert_eq!(payload(&r), s.data);
    // A sub-range from the first PSN that fits one packet is an ONLY.
    read_req(&mut s, PSN, va, 100);
    let r = responses(&mut s);
    assert_eq!(ops(&r), [(O::RC_RDMA_READ_RESPONSE_ONLY, PSN)]);
    assert_eq!(payload(&r), &s.data[..100]);
}

#[test]
fn a_requester_completes_a_read_whose_responses_resume_with_middle() {
    // End to end: the link loses the third READ response once; our requester asks again from
    // PSN + 2, our responder answers MIDDLE, LAST, and the READ completes with the right data.
    let mut s = setup();
    let len = 4 * MTU as usize;
    let (dst, dkey) = s.sim.reg(0, s.ep[0].pd, len, Access::LOCAL_WRITE);
    s.sim.trace = Some(Vec::new());
    // Node 1's packets: the 3rd (the second MIDDLE) is lost.
    s.sim.link[1].drop_every = 3;
    s.sim
        .dev(0)
        .post_send(
            s.ep[0].qpn,
            SendWr::new(
                1,
                SendOp::Read {
                    remote_addr: s.va,
                    rkey: s.rkey,
                },
                vec![Sge {
                    addr: dst,
                    length: len as u32,
                    lkey: dkey,
                }],
            ),
        )
        .unwrap();
    s.sim.run_until(100_000, |sim| sim.stats[1].lost > 0);
    s.sim.link[1].drop_every = 0;
    s.sim.settle(100_000);
    let c: Vec<_> = s
        .sim
        .poll_all(0, s.ep[0].cq)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(c, [(1, WcStatus::Success)]);
    assert_eq!(s.sim.nodes[0].mem.slice(dst, len), &s.data[..]);
    let from1: Vec<_> = s
        .sim
        .trace
        .as_ref()
        .unwrap()
        .iter()
        .filter(|t| t.from == 1)
        .map(|t| Opcode(t.bytes[0]))
        .collect();
    assert_eq!(
        from1,
        [
            O::RC_RDMA_READ_RESPONSE_FIRST,
            O::RC_RDMA_READ_RESPONSE_MIDDLE,
            O::RC_RDMA_READ_RESPONSE_MIDDLE, // lost
            O::RC_RDMA_READ_RESPONSE_LAST,
            O::RC_RDMA_READ_RESPONSE_MIDDLE, // the replay from PSN + 2
            O::RC_RDMA_READ_RESPONSE_LAST,
        ]
    );
}

/// The AETH syndrome of a response packet.
fn syndrome(b: &[u8]) -> Option<u8> {
    Packet::new_checked(b)
        .ok()?
        .aeth()
        .map(|a| a.syndrome_byte())
}

/// A READ longer than max_msg_sz (2^31) is an invalid request, as in rxe's `check_length()`:
/// one NAK, no data. 2^32 - 1 bytes at MTU 256 would also span 2^24 PSNs, the whole space.
#[test]
fn a_read_longer_than_max_msg_sz_is_naked_invalid_request() {
    for len in [(1u32 << 31) + 1, u32::MAX] {
        let mut s = setup();
        let va = s.va;
        read_req(&mut s, PSN, va, len);
        let r = s.sim.take(1, 16);
        assert_eq!(r.len(), 1, "one NAK, no READ response");
        let b = &r[0].1;
        assert_eq!(Opcode(b[0]), O::RC_ACKNOWLEDGE);
        assert_eq!(syndrome(b), Some(0x61), "NAK invalid request");
        assert_eq!(s.sim.dev(1).qp(s.ep[1].qpn).unwrap().state(), QpState::Err);
    }
    // 2^31 itself is allowed: checked against the MR (far smaller here), an access error.
    let mut s = setup();
    let va = s.va;
    read_req(&mut s, PSN, va, 1 << 31);
    let r = s.sim.take(1, 16);
    assert_eq!(r.len(), 1);
    assert_eq!(syndrome(&r[0].1), Some(0x62), "NAK remote access error");
}

/// A WRITE whose RETH states more than max_msg_sz (2^31) is an invalid request too, checked
/// before the R_Key as rxe's `check_length()` does: one NAK, nothing written, the QP in
/// error. 2^31 itself passes the length check and fails on the (far smaller) MR.
#[test]
fn a_write_longer_than_max_msg_sz_is_naked_invalid_request() {
    let write_first = |s: &mut Setup, len: u32| {
        let mut buf = vec![0u8; 2048];
        let bth = BthRepr::new(Opcode::RC_RDMA_WRITE_FIRST, s.ep[1].qpn.0, PSN, true);
        let ext = ExtRepr {
            reth: (s.va, s.rkey, len),
            ..Default::default()
        };
        let (n, _) = emit(&mut buf, &bth, &ext, MTU as usize).unwrap();
        let _ = s.sim.inject(1, &buf[..n]);
    };
    for len in [(1u32 << 31) + 1, u32::MAX] {
        let mut s = setup();
        write_first(&mut s, len);
        let r = s.sim.take(1, 16);
        assert_eq!(r.len(), 1, "one NAK for a {len}-byte WRITE");
        let b = &r[0].1;
        assert_eq!(Opcode(b[0]), O::RC_ACKNOWLEDGE);
        assert_eq!(syndrome(b), Some(0x61), "NAK invalid request");
        assert_eq!(s.sim.dev(1).qp(s.ep[1].qpn).unwrap().state(), QpState::Err);
        let va = s.va;
        assert_eq!(
            s.sim.nodes[1].mem.slice_mut(va, s.data.len()).to_vec(),
            s.data,
            "nothing written"
        );
    }
    let mut s = setup();
    write_first(&mut s, 1 << 31);
    let r = s.sim.take(1, 16);
    assert_eq!(r.len(), 1);
    assert_eq!(syndrome(&r[0].1), Some(0x62), "NAK remote access error");
}

/// Duplicate READs for one resource keep one replay: each replaces what is still queued of
/// the resource (the answer or an earlier replay) instead of adding a full copy of it.
#[test]
fn duplicate_reads_keep_one_replay_per_resource() {
    let mut s = setup();
    let va = s.va;
    read_req(&mut s, PSN, va, 4 * MTU);
    // None of the 4 responses went out yet; the requester asks again, ten times.
    for _ in 0..10 {
        read_req(&mut s, PSN, va, 4 * MTU);
    }
    let r = responses(&mut s);
    assert_eq!(r.len(), 4, "one answer, not 11");
    assert_eq!(payload(&r), s.data);
    assert_eq!(
        s.sim.dev(1).qp_counters(s.ep[1].qpn).unwrap().duplicates,
        10
    );

    // Half of the answer went out; a duplicate from mid-message replaces the rest.
    read_req(&mut s, PSN, va, 4 * MTU);
    let first = responses_n(&mut s, 2);
    assert_eq!(first.len(), 2);
    for _ in 0..5 {
        read_req(&mut s, PSN + 2, va + 2 * MTU as u64, 2 * MTU);
    }
    let r = responses(&mut s);
    assert_eq!(
        ops(&r),
        [
            (O::RC_RDMA_READ_RESPONSE_MIDDLE, PSN + 2),
            (O::RC_RDMA_READ_RESPONSE_LAST, PSN + 3),
        ]
    );
}

/// A requester that ignores its max_rd_atomic and floods READs: the queued answers never hold
/// more than one READ per responder resource, and the response queue stays bounded whatever
/// the mix of duplicates.
#[test]
fn the_response_queue_is_bounded_under_a_read_flood() {
    let mut s = setup();
    let va = s.va;
    let per = 4u32; // packets per READ
    let res = ConnOpts::default().max_rd_atomic as u32;
    for i in 0..4 * res {
        read_req(&mut s, PSN + i * per, va, per * MTU);
        // And a duplicate of every READ so far.
        for j in 0..=i {
            read_req(&mut s, PSN + j * per, va, per * MTU);
        }
    }
    let r = s.sim.take(1, usize::MAX);
    assert!(
        r.len() <= (res * per) as usize,
        "{} packets queued for {res} resources of {per} packets",
        r.len()
    );
    let c = s.sim.dev(1).qp_counters(s.ep[1].qpn).unwrap();
    assert!(c.duplicates > 0);
}
