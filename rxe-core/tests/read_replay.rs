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
    let data: Vec<u8> = (0..len).map(|i| (i * 31 + i / 1024) as u8).collect();
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
    s.sim
        .take(1, usize::MAX)
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
