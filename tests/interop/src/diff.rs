//! The differential wire test: the same crafted RoCEv2 sequences go to two implementations of
//! the responder and requester — Linux rxe and the virtio-rdma device — and what each sends back
//! and leaves behind is written as a transcript in terms that do not depend on the
//! implementation's choices (PSNs relative to the start, keys and addresses as names, data as a
//! digest). Two transcripts are compared line by line.
//!
//! The target side is `tests/vm/diff-target.py` in a guest: it sets up one queue pair at a time
//! on the device it is asked for, posts work requests, and reports completions, the QP state
//! and a digest of the memory region. Cases are in [`cases`].

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rxe_core::wire::frame::icrc_for_udp_socket;
use rxe_core::wire::{emit, BthRepr, ExtRepr, OpFlags, Opcode, Packet, Syndrome};

use crate::udp::{UdpTransport, ROCE_PORT};

/// Bytes of the target's memory region; its receives are `RECV_LEN` each, back to back.
pub const MR_LEN: u64 = 16384;
pub const RECV_LEN: u64 = 4096;
const MTU: usize = 1024;

/// What a case knows about the target's queue pair once it is set up.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// The target's QPN, and ours (the crafted packets' source).
    pub qpn: u32,
    pub my_qpn: u32,
    /// The PSN the target's responder expects first, and the first its requester sends.
    pub psn: u32,
    pub sq_psn: u32,
    pub rkey: u32,
    pub va: u64,
    pub mw_rkey: u32,
}

/// The MR's initial contents (diff-target.py's `pattern`).
pub fn mr_pattern(off: u64) -> u8 {
    ((off * 7 + 3) % 251) as u8
}

/// One crafted packet: headers, payload, and an optional change made after the ICRC is sealed
/// (a corrupted packet).
#[derive(Clone)]
pub struct Pkt {
    pub bth: BthRepr,
    pub ext: ExtRepr,
    pub payload: Vec<u8>,
    /// Opcode byte to write over the emitted one (opcodes the table does not know).
    pub raw_opcode: Option<u8>,
    /// (byte offset in the BTH.., bit) flipped after the ICRC is computed.
    pub flip: Option<(usize, u8)>,
}

impl Pkt {
    pub fn new(op: Opcode, c: &Ctx, psn_off: u32, payload_len: usize) -> Self {
        let psn = c.psn.wrapping_add(psn_off) & 0xff_ffff;
        let ack = op.flags().intersects(OpFlags::LAST.union(OpFlags::READ))
            || op.flags().contains(OpFlags::ATOMIC)
            || op.flags().contains(OpFlags::ATOMIC_WRITE)
            || op.flags().contains(OpFlags::FLUSH);
        Pkt {
            bth: BthRepr::new(op, c.qpn, psn, ack),
            ext: ExtRepr::default(),
            payload: (0..payload_len)
                .map(|i| (i * 13 + 0x21) as u8 ^ (i >> 8) as u8)
                .collect(),
            raw_opcode: None,
            flip: None,
        }
    }
    pub fn reth(mut self, va: u64, rkey: u32, len: u32) -> Self {
        self.ext.reth = (va, rkey, len);
        self
    }
    pub fn atomic(mut self, va: u64, rkey: u32, swap_add: u64, compare: u64) -> Self {
        self.ext.atomic = (va, rkey, swap_add, compare);
        self
    }
    pub fn aeth(mut self, syndrome: u8, msn: u32) -> Self {
        self.ext.aeth = (syndrome, msn);
        self
    }
    pub fn deth(mut self, qkey: u32, src_qp: u32) -> Self {
        self.ext.deth = (qkey, src_qp);
        self
    }
    pub fn imm(mut self, v: u32) -> Self {
        self.ext.imm = v;
        self
    }
    pub fn ieth(mut self, rkey: u32) -> Self {
        self.ext.ieth = rkey;
        self
    }
    /// PSN in the target requester's space (responses to the target's requests).
    pub fn sq(mut self, c: &Ctx, off: u32) -> Self {
        self.bth.psn = c.sq_psn.wrapping_add(off) & 0xff_ffff;
        self
    }
    pub fn with(mut self, f: impl FnOnce(&mut Pkt)) -> Self {
        f(&mut self);
        self
    }

    /// The packet's bytes (BTH..ICRC, ICRC slot zero).
    fn bytes(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 64 + self.payload.len() + 8];
        let (n, range) = emit(&mut buf, &self.bth, &self.ext, self.payload.len())
            .expect("a case builds a packet the codec can emit");
        buf[range].copy_from_slice(&self.payload);
        buf.truncate(n);
        if let Some(op) = self.raw_opcode {
            buf[0] = op;
        }
        buf
    }
}

/// Builds a step's packets from what the case knows of the target.
pub type Packets = Box<dyn Fn(&Ctx) -> Vec<Pkt>>;
/// Builds a step's work request ("post" words for diff-target.py).
pub type WorkRequest = Box<dyn Fn(&Ctx) -> String>;

/// One step of a case.
pub enum Step {
    /// Crafted packets, sent in order; then the responses are collected.
    Send(Packets),
    /// A work request posted on the target; then the packets it sends are collected.
    Post(WorkRequest),
}

pub struct Case {
    pub name: &'static str,
    /// Words added to the target's "setup" request (type, access, limits).
    pub setup: &'static str,
    pub steps: Vec<Step>,
    /// A difference between the two implementations that is known and documented, with its
    /// reason; the case then fails when the transcripts are the same (the exception is stale).
    pub known: Option<&'static str>,
}

impl Case {
    fn known(mut self, why: &'static str) -> Self {
        self.known = Some(why);
        self
    }

    /// How many of the packets this case sends carry a corrupted ICRC.
    pub fn corrupted_packets(&self) -> usize {
        let c = Ctx {
            qpn: 1,
            my_qpn: 2,
            psn: 0,
            sq_psn: 0,
            rkey: 0,
            va: 0,
            mw_rkey: 0,
        };
        self.steps
            .iter()
            .map(|s| match s {
                Step::Send(f) => f(&c).iter().filter(|p| p.flip.is_some()).count(),
                Step::Post(_) => 0,
            })
            .sum()
    }
}

fn send(f: impl Fn(&Ctx) -> Vec<Pkt> + 'static) -> Step {
    Step::Send(Box::new(f))
}
fn post(f: impl Fn(&Ctx) -> String + 'static) -> Step {
    Step::Post(Box::new(f))
}
fn case(name: &'static str, setup: &'static str, steps: Vec<Step>) -> Case {
    Case {
        name,
        setup,
        steps,
        known: None,
    }
}

use Opcode as O;
const UC_WRITE_ONLY: Opcode = O::RC_RDMA_WRITE_ONLY.with_transport(0x20);
const UC_WRITE_ONLY_IMM: Opcode = O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.with_transport(0x20);
const UC_SEND_LAST: Opcode = O::RC_SEND_LAST.with_transport(0x20);

/// Syndromes of the AETHs the cases send.
const ACK: u8 = Syndrome::ACK;
const NAK_SEQ: u8 = 0x60;
const NAK_INV: u8 = 0x61;
const NAK_ACCESS: u8 = 0x62;
const RNR_NAK: u8 = 0x21;

/// The cases, in the order they run. Every case starts from a fresh queue pair on the target
/// (RC, path MTU 1024, 4 receives of 4 KiB over a 16 KiB MR with local write and every remote
/// access, unless its setup words say otherwise).
pub fn cases() -> Vec<Case> {
    [
        rc_send_write_read(),
        rc_atomics_sequence_malformed(),
        icrc_cases(),
        uc_ud_rc_requester(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// RC responder: SEND, WRITE and READ.
fn rc_send_write_read() -> Vec<Case> {
    vec![
        // --- RC responder: SEND ---
        case("rc send only", "", vec![send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 100)])]),
        case("rc send first/middle/last", "", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_FIRST, c, 0, MTU),
            Pkt::new(O::RC_SEND_MIDDLE, c, 1, MTU),
            Pkt::new(O::RC_SEND_LAST, c, 2, 100),
        ])]),
        case("rc send with immediate", "", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_ONLY_WITH_IMMEDIATE, c, 0, 33).imm(0x1234_5678),
        ])]),
        case("rc send zero length", "", vec![send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 0)])]),
        case("rc send with invalidate of a user MR", "", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_ONLY_WITH_INVALIDATE, c, 0, 16).ieth(c.rkey),
        ])])
        .known("rxe answers a positive ACK to a SEND with Invalidate it failed (false success at the requester) and completes the receive with REM_INV_REQ_ERR; the device NAKs it (invalid request), so both ends learn"),
        case("rc send with invalidate of a memory window, then a write through it",
            "mr=LW,RW,RR,RA,MB mw=1", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY_WITH_INVALIDATE, c, 0, 16).ieth(c.mw_rkey)]),
            send(|c| vec![Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 1, 8).reth(c.va, c.mw_rkey, 8)]),
        ])
        .known("rxe hands user space the kernel's IB_WC_WITH_INVALIDATE bit (1 << 2), which libibverbs reads as IBV_WC_IP_CSUM_OK; the device reports IBV_WC_WITH_INV"),
        case("rc write through a memory window, in and beyond its range",
            "mr=LW,RW,RR,RA,MB mw=1", vec![
            send(|c| vec![Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 64).reth(c.va + 64, c.mw_rkey, 64)]),
            send(|c| vec![Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 1, 64)
                .reth(c.va + MR_LEN - 32, c.mw_rkey, 64)]),
        ]),
        case("rc send longer than the receive buffer", "recv_len=64",
            vec![send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 100)])])
        .known("IBTA: a receive buffer too small is a length error (NAK invalid request, LOC_LEN_ERR), as the device does; rxe's copy_data returns -EINVAL where its responder looks for -ENOSPC, so it NAKs remote operational error and completes LOC_QP_OP_ERR"),
        case("rc send with no receive posted (RNR NAK)", "recvs=0",
            vec![send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)])]),
        case("rc send to a shared receive queue", "srq=1",
            vec![send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 200), Pkt::new(O::RC_SEND_ONLY, c, 1, 300)])]),
        // --- RC responder: WRITE ---
        case("rc write only", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 200).reth(c.va + 100, c.rkey, 200),
        ])]),
        case("rc write first/middle/last", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_FIRST, c, 0, MTU).reth(c.va + 8, c.rkey, 2 * MTU as u32 + 5),
            Pkt::new(O::RC_RDMA_WRITE_MIDDLE, c, 1, MTU),
            Pkt::new(O::RC_RDMA_WRITE_LAST, c, 2, 5),
        ])]),
        case("rc write with immediate", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, c, 0, 40).reth(c.va, c.rkey, 40).imm(7),
        ])]),
        case("rc zero-length write with immediate", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, c, 0, 0).reth(0, 0, 0).imm(9),
        ])]),
        case("rc write with a bad rkey", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 8).reth(c.va, c.rkey ^ 0x100, 8),
        ])]),
        case("rc write beyond the MR", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 100).reth(c.va + MR_LEN - 10, c.rkey, 100),
        ])]),
        case("rc write whose address wraps", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 100).reth(u64::MAX - 10, c.rkey, 100),
        ])]),
        case("rc write to an MR without remote write", "mr=LW,RR", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 8).reth(c.va, c.rkey, 8),
        ])]),
        case("rc write on a QP without remote write", "qp=RR,RA", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 8).reth(c.va, c.rkey, 8),
        ])]),
        case("rc write whose length disagrees with its payload", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_WRITE_ONLY, c, 0, 64).reth(c.va, c.rkey, 32),
        ])]),
        // --- RC responder: READ ---
        case("rc read only", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va + 3, c.rkey, 100),
        ])]),
        case("rc read of three packets", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va, c.rkey, 3000),
        ])]),
        case("rc read of zero bytes", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(0, 0, 0),
        ])]),
        case("rc read with a bad rkey", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va, c.rkey ^ 0x100, 64),
        ])]),
        case("rc read beyond the MR", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va + MR_LEN - 8, c.rkey, 64),
        ])]),
        case("rc read from an MR without remote read", "mr=LW,RW", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va, c.rkey, 64),
        ])]),
        // The READs read the last receive buffer, the SEND lands in the first: a SEND after a
        // READ may be placed before the READ's data is read (IBTA's ordering rules leave it to
        // the requester's fence), so overlapping them would make the data a matter of timing.
        case("rc two reads, then a send", "", vec![send(|c| vec![
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va + 3 * RECV_LEN, c.rkey, 1500),
            Pkt::new(O::RC_RDMA_READ_REQUEST, c, 2, 0).reth(c.va + 3 * RECV_LEN + 2048, c.rkey, 10),
            Pkt::new(O::RC_SEND_ONLY, c, 3, 10),
        ])]),
    ]
}

/// RC responder: atomics, ATOMIC_WRITE and FLUSH; sequence, duplicates and replay;
/// malformed and filtered packets.
fn rc_atomics_sequence_malformed() -> Vec<Case> {
    vec![
        // --- RC responder: atomics, ATOMIC_WRITE, FLUSH ---
        case("rc compare and swap that matches", "", vec![send(|c| vec![
            Pkt::new(O::RC_COMPARE_SWAP, c, 0, 0).atomic(c.va + 8, c.rkey, 0xabcd, pattern_u64(8)),
        ])]),
        case("rc compare and swap that does not match", "", vec![send(|c| vec![
            Pkt::new(O::RC_COMPARE_SWAP, c, 0, 0).atomic(c.va + 8, c.rkey, 0xabcd, 1),
        ])]),
        case("rc fetch and add", "", vec![send(|c| vec![
            Pkt::new(O::RC_FETCH_ADD, c, 0, 0).atomic(c.va + 16, c.rkey, 5, 0),
        ])]),
        case("rc misaligned atomic", "", vec![send(|c| vec![
            Pkt::new(O::RC_FETCH_ADD, c, 0, 0).atomic(c.va + 4, c.rkey, 5, 0),
        ])]),
        case("rc atomic on a QP without remote atomic", "qp=RW,RR", vec![send(|c| vec![
            Pkt::new(O::RC_FETCH_ADD, c, 0, 0).atomic(c.va, c.rkey, 5, 0),
        ])]),
        case("rc atomic beyond the MR", "", vec![send(|c| vec![
            Pkt::new(O::RC_FETCH_ADD, c, 0, 0).atomic(c.va + MR_LEN, c.rkey, 5, 0),
        ])]),
        case("rc atomic write", "", vec![send(|c| vec![
            Pkt::new(O::RC_ATOMIC_WRITE, c, 0, 8).reth(c.va + 24, c.rkey, 8),
        ])]),
        case("rc flush (global visibility)", "mr=LW,RW,RR,RA,FG", vec![send(|c| vec![
            Pkt::new(O::RC_FLUSH, c, 0, 0).reth(c.va, c.rkey, 64).with(|p| p.ext.feth = (0, 1)),
        ])]),
        case("rc flush of an MR without flush access", "", vec![send(|c| vec![
            Pkt::new(O::RC_FLUSH, c, 0, 0).reth(c.va, c.rkey, 64).with(|p| p.ext.feth = (0, 1)),
        ])]),
        // --- RC responder: sequence, duplicates, replay ---
        case("rc send one PSN ahead (sequence NAK)", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 1, 10)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 2, 10)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
        ]),
        case("rc duplicate send", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
        ]),
        case("rc duplicate read", "", vec![
            send(|c| vec![Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va, c.rkey, 2000)]),
            send(|c| vec![Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va, c.rkey, 2000)]),
        ]),
        case("rc duplicate read restarting mid-message", "", vec![
            send(|c| vec![Pkt::new(O::RC_RDMA_READ_REQUEST, c, 0, 0).reth(c.va, c.rkey, 3000)]),
            send(|c| vec![Pkt::new(O::RC_RDMA_READ_REQUEST, c, 1, 0)
                .reth(c.va + MTU as u64, c.rkey, 3000 - MTU as u32)]),
        ]),
        case("rc duplicate atomic is replayed, not executed again", "", vec![
            send(|c| vec![Pkt::new(O::RC_FETCH_ADD, c, 0, 0).atomic(c.va + 16, c.rkey, 5, 0)]),
            send(|c| vec![Pkt::new(O::RC_FETCH_ADD, c, 0, 0).atomic(c.va + 16, c.rkey, 5, 0)]),
        ]),
        case("rc request far behind (outside the duplicate window)", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0x80_0000 + 5, 10)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
        ])
        .known("both ACK the duplicate; rxe puts PSN 0xffffff in it (its last-ACKed PSN is still 0 before its first ACK), the device rq_psn - 1"),
        case("rc send across the PSN wrap", "psn_base=0xfffffe", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_FIRST, c, 0, MTU),
            Pkt::new(O::RC_SEND_MIDDLE, c, 1, MTU),
            Pkt::new(O::RC_SEND_LAST, c, 2, 100),
            Pkt::new(O::RC_SEND_ONLY, c, 3, 7),
        ])]),
        // --- RC responder: malformed and filtered packets ---
        case("rc bad P_Key is dropped", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10).with(|p| p.bth.pkey = 0x1234)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
        ]),
        case("rc bad transport version is dropped", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10).with(|p| p.bth.tver = 1)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
        ]),
        case("rc to a QPN that does not exist", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10).with(|p| p.bth.dest_qp ^= 0x40_0000)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 10)]),
        ]),
        case("rc pad count on a FIRST", "", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_FIRST, c, 0, MTU).with(|p| p.bth.pad_count = 1),
        ])]),
        case("rc payload above the path MTU", "", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_ONLY, c, 0, MTU + 64),
        ])]),
        case("rc short FIRST", "", vec![send(|c| vec![Pkt::new(O::RC_SEND_FIRST, c, 0, 512)])]),
        case("rc MIDDLE without a FIRST", "", vec![send(|c| vec![Pkt::new(O::RC_SEND_MIDDLE, c, 0, MTU)])]),
        case("rc WRITE MIDDLE inside a SEND", "", vec![send(|c| vec![
            Pkt::new(O::RC_SEND_FIRST, c, 0, MTU),
            Pkt::new(O::RC_RDMA_WRITE_MIDDLE, c, 1, MTU),
        ])]),
        case("rc unknown opcode", "", vec![
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 8).with(|p| p.raw_opcode = Some(0x1f))]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 8)]),
        ]),
        case("rc response opcode sent to a responder", "", vec![
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).aeth(ACK, 1)]),
            send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 8)]),
        ]),
    ]
}

/// ICRC: one bit flipped in each field the ICRC covers, and in the payload; each is dropped
/// without a trace, and the same packet intact afterwards is taken.
fn icrc_cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (name, at) in [
        ("rc corrupted ICRC: opcode bit", (0usize, 0x01u8)),
        ("rc corrupted ICRC: P_Key bit", (2, 0x01)),
        ("rc corrupted ICRC: dest QP bit", (7, 0x01)),
        ("rc corrupted ICRC: PSN bit", (11, 0x01)),
        ("rc corrupted ICRC: payload bit", (12 + 5, 0x10)),
        ("rc corrupted ICRC: the ICRC itself", (12 + 16, 0x80)),
    ] {
        v.push(case(
            name,
            "",
            vec![
                send(
                    move |c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 16).with(|p| p.flip = Some(at))],
                ),
                send(|c| vec![Pkt::new(O::RC_SEND_ONLY, c, 0, 16)]),
            ],
        ));
    }
    v
}

/// UC, UD, and the RC requester (the target posts, the crafter answers).
fn uc_ud_rc_requester() -> Vec<Case> {
    vec![
        // --- UC ---
        case("uc send only", "type=uc", vec![send(|c| vec![Pkt::new(O::UC_SEND_ONLY, c, 0, 100)])]),
        case("uc write, then a write with immediate", "type=uc", vec![send(|c| vec![
            Pkt::new(UC_WRITE_ONLY, c, 0, 64).reth(c.va, c.rkey, 64),
            Pkt::new(UC_WRITE_ONLY_IMM, c, 1, 8).reth(c.va + 64, c.rkey, 8).imm(3),
        ])]),
        case("uc message with a lost middle is dropped, the next one taken", "type=uc", vec![send(|c| vec![
            Pkt::new(O::UC_SEND_FIRST, c, 0, MTU),
            Pkt::new(UC_SEND_LAST, c, 2, 10),
            Pkt::new(O::UC_SEND_ONLY, c, 3, 20),
            Pkt::new(O::UC_SEND_ONLY, c, 4, 30),
            Pkt::new(O::UC_SEND_FIRST, c, 5, MTU),
            Pkt::new(UC_SEND_LAST, c, 6, 40),
        ])])
        .known("IBTA: after a dropped UC message the next FIRST or ONLY starts a new one; the device takes the ONLY right after the gap, rxe drops it too (its sequence state still holds the dropped FIRST) and resynchronises one message later"),
        case("uc write with a bad rkey is dropped", "type=uc", vec![send(|c| vec![
            Pkt::new(UC_WRITE_ONLY, c, 0, 8).reth(c.va, c.rkey ^ 0x100, 8),
            Pkt::new(O::UC_SEND_ONLY, c, 1, 20),
        ])]),
        // --- UD ---
        case("ud send", "type=ud", vec![send(|c| vec![
            Pkt::new(O::UD_SEND_ONLY, c, 0, 100).deth(UD_QKEY, c.my_qpn),
        ])]),
        case("ud send with immediate", "type=ud", vec![send(|c| vec![
            Pkt::new(O::UD_SEND_ONLY_WITH_IMMEDIATE, c, 0, 10).deth(UD_QKEY, c.my_qpn).imm(0x55),
        ])]),
        case("ud send with a wrong Q_Key is dropped", "type=ud", vec![send(|c| vec![
            Pkt::new(O::UD_SEND_ONLY, c, 0, 100).deth(UD_QKEY ^ 1, c.my_qpn),
            Pkt::new(O::UD_SEND_ONLY, c, 1, 50).deth(UD_QKEY, c.my_qpn),
        ])]),
        case("ud send above the path MTU is dropped", "type=ud", vec![send(|c| vec![
            Pkt::new(O::UD_SEND_ONLY, c, 0, MTU + 64).deth(UD_QKEY, c.my_qpn),
        ])]),
        case("ud send larger than the receive buffer", "type=ud recv_len=64", vec![send(|c| vec![
            Pkt::new(O::UD_SEND_ONLY, c, 0, 100).deth(UD_QKEY, c.my_qpn),
        ])])
        .known("the device completes the receive with LOC_LEN_ERR so the application learns a datagram was lost to a short buffer (the QP stays RTS); rxe drops it silently and keeps the receive"),
        case("ud send with no receive posted is dropped", "type=ud recvs=0", vec![send(|c| vec![
            Pkt::new(O::UD_SEND_ONLY, c, 0, 10).deth(UD_QKEY, c.my_qpn),
        ])]),
        // --- RC requester: the target posts, the crafter answers ---
        case("requester send, acknowledged", "", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(ACK, 1)]),
        ]),
        case("requester send, a ghost ACK ahead of it, then the real one", "", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 5).aeth(ACK, 9)]),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(ACK, 1)]),
        ]),
        case("requester send, an old ACK, then the real one", "", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0xff_ffff).aeth(ACK, 0)]),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(ACK, 1)]),
        ]),
        case("requester send, remote access NAK", "", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(NAK_ACCESS, 0)]),
        ]),
        case("requester send, invalid request NAK", "", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(NAK_INV, 0)]),
        ]),
        case("requester send, sequence NAK, retransmitted, acknowledged", "", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(NAK_SEQ, 0)]),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(ACK, 1)]),
        ]),
        case("requester send, RNR NAK twice with rnr_retry=1", "rnr_retry=1", vec![
            post(|_| "opcode=SEND len=100".into()),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(RNR_NAK, 0)]),
            send(|c| vec![Pkt::new(O::RC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(RNR_NAK, 0)]),
        ]),
        case("requester send, no answer with retry_cnt=1", "retry=1 timeout=12", vec![
            post(|_| "opcode=SEND len=100".into()),
        ]),
        case("requester read, answered", "", vec![
            post(|c| format!("opcode=READ len=100 raddr={} rkey=4660", 0x10_0000u64 + c.my_qpn as u64)),
            send(|c| vec![Pkt::new(O::RC_RDMA_READ_RESPONSE_ONLY, c, 0, 100).sq(c, 0).aeth(ACK, 1)]),
        ]),
        case("requester read of two packets, answered", "", vec![
            post(|_| "opcode=READ len=1500 raddr=4096 rkey=4660".into()),
            send(|c| vec![
                Pkt::new(O::RC_RDMA_READ_RESPONSE_FIRST, c, 0, MTU).sq(c, 0).aeth(ACK, 1),
                Pkt::new(O::RC_RDMA_READ_RESPONSE_LAST, c, 0, 1500 - MTU).sq(c, 1).aeth(ACK, 1),
            ]),
        ]),
        case("requester read answered with a LAST first", "", vec![
            post(|_| "opcode=READ len=1500 raddr=4096 rkey=4660".into()),
            send(|c| vec![Pkt::new(O::RC_RDMA_READ_RESPONSE_LAST, c, 0, 1500 - MTU).sq(c, 1).aeth(ACK, 1)]),
        ])
        .known("the device takes the gap as an implied sequence NAK and asks again from the missing PSN at once; rxe discards the response and waits for its transport timer; both recover"),
        case("requester fetch and add, answered", "", vec![
            post(|_| "opcode=FAA raddr=4096 rkey=4660 compare=3".into()),
            send(|c| vec![Pkt::new(O::RC_ATOMIC_ACKNOWLEDGE, c, 0, 0).sq(c, 0).aeth(ACK, 1)
                .with(|p| p.ext.atomic_orig = 0x1122_3344_5566_7788)]),
        ]),
    ]
}

const UD_QKEY: u32 = 0x1111_1111;

/// The MR's initial 8 bytes at `off`, as an atomic sees them (little-endian host memory).
fn pattern_u64(off: u64) -> u64 {
    u64::from_le_bytes(core::array::from_fn(|i| mr_pattern(off + i as u64)))
}

/// A target: a device in the guest and the address its RoCE traffic uses.
#[derive(Clone, Debug)]
pub struct Target {
    pub dev: String,
    pub addr: IpAddr,
}

/// The control connection to diff-target.py.
pub struct Control {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Control {
    pub fn connect(at: SocketAddr, wait: Duration) -> io::Result<Self> {
        let end = Instant::now() + wait;
        let s = loop {
            match TcpStream::connect_timeout(&at, Duration::from_secs(2)) {
                Ok(s) => break s,
                Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(200)),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("diff-target at {at} not reachable within {wait:?}: {e}"),
                    ))
                }
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        Ok(Control {
            r: BufReader::new(s.try_clone()?),
            w: s,
        })
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "diff-target closed the connection",
            ));
        }
        Ok(l.trim_end().to_string())
    }

    /// Sends one request; returns the first reply line.
    fn ask(&mut self, req: &str) -> io::Result<String> {
        writeln!(self.w, "{req}")?;
        self.line()
    }

    pub fn bye(&mut self) {
        let _ = self.ask("bye");
    }
}

fn field(reply: &str, key: &str) -> Option<u64> {
    reply
        .split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

/// Runs one case against one target; returns its transcript.
pub fn run_case(
    ctl: &mut Control,
    udp: &mut UdpTransport,
    t: &Target,
    case: &Case,
    my_qpn: u32,
    quiet: Duration,
) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let psn = case
        .setup
        .split_whitespace()
        .find_map(|w| w.strip_prefix("psn_base="))
        .map(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or(0))
        .unwrap_or(0x10_0000 + (my_qpn & 0xff) * 0x100);
    let sq_psn = 0x20_0000 + (my_qpn & 0xff) * 0x100;
    let dgid = udp.local().ip();
    let mut words = format!(
        "setup dev={} self_ip={} type=rc dgid={dgid} peer_qpn={my_qpn} psn={psn} sq_psn={sq_psn} mtu={MTU} \
         recvs=4 recv_len={RECV_LEN} mr_len={MR_LEN} mr=LW,RW,RR,RA qp=RW,RR,RA timeout=19",
        t.dev, t.addr
    );
    for w in case
        .setup
        .split_whitespace()
        .filter(|w| !w.starts_with("psn_base="))
    {
        // a later key=value replaces the default
        let key = w.split('=').next().unwrap_or("");
        words = words
            .split_whitespace()
            .filter(|d| d.split('=').next() != Some(key))
            .collect::<Vec<_>>()
            .join(" ");
        words.push(' ');
        words.push_str(w);
    }
    let r = ctl.ask(&words)?;
    if !r.starts_with("ok ") {
        out.push(format!("setup: {r}"));
        return Ok(out);
    }
    let c = Ctx {
        qpn: field(&r, "qpn").unwrap_or(0) as u32,
        my_qpn,
        psn,
        sq_psn,
        rkey: field(&r, "rkey").unwrap_or(0) as u32,
        va: field(&r, "va").unwrap_or(0),
        mw_rkey: field(&r, "mw_rkey").unwrap_or(0) as u32,
    };
    // anything still in flight from an earlier case is not this case's
    drain(udp, Duration::ZERO);
    for (i, step) in case.steps.iter().enumerate() {
        match step {
            Step::Send(f) => {
                for p in f(&c) {
                    if let Err(e) = send_pkt(udp, t.addr, &p) {
                        out.push(format!("step {i}: not sent: {e}"));
                    }
                }
            }
            Step::Post(f) => {
                let r = ctl.ask(&format!("post {}", f(&c)))?;
                if r != "ok" {
                    out.push(format!("step {i}: post: {r}"));
                    continue;
                }
            }
        }
        let got: Vec<String> = collect(udp, quiet)
            .iter()
            .map(|p| describe(&c, p))
            .collect();
        for l in coalesce_acks(got) {
            out.push(format!("step {i}: {l}"));
        }
    }
    writeln!(ctl.w, "result")?;
    loop {
        let l = ctl.line()?;
        if l == "end" {
            break;
        }
        if l.starts_with("err") {
            out.push(format!("result: {l}"));
            break;
        }
        out.push(normalize_result(&c, &l));
    }
    Ok(out)
}

fn send_pkt(udp: &UdpTransport, dst: IpAddr, p: &Pkt) -> io::Result<()> {
    let mut b = p.bytes();
    let to = SocketAddr::new(dst, ROCE_PORT);
    icrc_for_udp_socket(udp.local(), to, &mut b)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if let Some((off, bit)) = p.flip {
        let off = off.min(b.len() - 1);
        b[off] ^= bit;
    }
    match udp.send_raw(to, &b) {
        Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a {}-byte datagram does not fit the path to {dst}", b.len()),
        )),
        r => r,
    }
}

/// Datagrams (ICRC checked) until none arrives for `quiet`; at most 5 s.
fn collect(udp: &mut UdpTransport, quiet: Duration) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    let mut buf = vec![0u8; 9000];
    while Instant::now() < end {
        match udp.recv(&mut buf, quiet) {
            Ok(Some((n, _))) => v.push(buf[..n].to_vec()),
            _ => break,
        }
    }
    v
}

fn drain(udp: &mut UdpTransport, quiet: Duration) {
    let _ = collect(udp, quiet);
}

/// One received packet in implementation-neutral terms.
fn describe(c: &Ctx, b: &[u8]) -> String {
    let Ok(p) = Packet::new_checked(b) else {
        return format!("unparseable packet of {} bytes", b.len());
    };
    let op = p.opcode();
    let fl = op.flags();
    let name = op.info().map(|i| i.name).unwrap_or("?");
    let bth = p.bth();
    // requests come from the target's requester (its sq PSNs), responses answer ours
    let base = if fl.contains(OpFlags::REQ) {
        c.sq_psn
    } else {
        c.psn
    };
    let rel = bth.psn().wrapping_sub(base) & 0xff_ffff;
    let mut s = format!("{name} psn=+{rel}");
    if bth.dest_qp() != c.my_qpn {
        let _ = write!(s, " dest_qp=OTHER({:#x})", bth.dest_qp());
    }
    if let Some(a) = p.aeth() {
        let _ = write!(
            s,
            " syndrome={:#04x} msn={}",
            a.syndrome().to_byte(),
            a.msn()
        );
    }
    if let Some(a) = p.atomic_ack_eth() {
        let _ = write!(s, " orig={:#x}", a.orig());
    }
    if let Some(r) = p.reth() {
        // only the target's requests carry one: the address and key are the crafter's
        let _ = write!(s, " reth=({:#x}, {:#x}, {})", r.va(), r.rkey(), r.dma_len());
    }
    if let Some(a) = p.atomic_eth() {
        let _ = write!(
            s,
            " atomic=(rkey {}, {:#x}, {:#x})",
            a.rkey(),
            a.swap_add(),
            a.compare()
        );
    }
    if bth.solicited() {
        s.push_str(" se");
    }
    if p.payload_len() > 0 {
        let _ = write!(s, " payload={}B:{:08x}", p.payload_len(), fnv(p.payload()));
    }
    s
}

/// A run of positive ACKs stands for its last one: an ACK acknowledges every PSN up to its own
/// (IBTA 9.7.5.1.1), so an implementation may coalesce them, and whether two arrive together
/// or apart is timing, not behaviour.
fn coalesce_acks(lines: Vec<String>) -> Vec<String> {
    let is_ack = |l: &str| l.starts_with("RC_ACKNOWLEDGE ") && l.contains(" syndrome=0x1f ");
    let mut out: Vec<String> = Vec::new();
    for l in lines {
        if is_ack(&l) && out.last().is_some_and(|p| is_ack(p)) {
            out.pop();
        }
        out.push(l);
    }
    out
}

fn fnv(b: &[u8]) -> u32 {
    b.iter().fold(0x811c_9dc5u32, |h, &x| {
        (h ^ x as u32).wrapping_mul(0x0100_0193)
    })
}

/// A result line of diff-target.py with the target's own numbers named.
fn normalize_result(c: &Ctx, l: &str) -> String {
    l.split_whitespace()
        .map(|w| match w.split_once('=') {
            Some(("src_qp", v)) if v.parse() == Ok(c.my_qpn) => "src_qp=PEER".to_string(),
            Some(("imm", v)) if v.parse() == Ok(c.mw_rkey) && c.mw_rkey != 0 => {
                "imm=MW_RKEY".into()
            }
            Some(("imm", v)) if v.parse() == Ok(c.rkey) => "imm=MR_RKEY".into(),
            _ => w.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The lines where two transcripts differ, as "-a / +b" pairs (empty: the same).
pub fn differences(a: &[String], b: &[String]) -> Vec<String> {
    let n = a.len().max(b.len());
    (0..n)
        .filter_map(|i| {
            let (x, y) = (a.get(i), b.get(i));
            (x != y).then(|| {
                format!(
                    "{} | {}",
                    x.map(String::as_str).unwrap_or("(nothing)"),
                    y.map(String::as_str).unwrap_or("(nothing)")
                )
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_positive_acks_stand_for_their_last() {
        let l = |s: &str| s.to_string();
        let got = coalesce_acks(vec![
            l("RC_ACKNOWLEDGE psn=+0 syndrome=0x1f msn=1"),
            l("RC_ACKNOWLEDGE psn=+1 syndrome=0x1f msn=2"),
            l("RC_ACKNOWLEDGE psn=+2 syndrome=0x60 msn=2"),
            l("RC_ACKNOWLEDGE psn=+2 syndrome=0x1f msn=3"),
        ]);
        assert_eq!(
            got,
            vec![
                l("RC_ACKNOWLEDGE psn=+1 syndrome=0x1f msn=2"),
                l("RC_ACKNOWLEDGE psn=+2 syndrome=0x60 msn=2"),
                l("RC_ACKNOWLEDGE psn=+2 syndrome=0x1f msn=3"),
            ]
        );
    }

    #[test]
    fn every_case_builds_its_packets() {
        let c = Ctx {
            qpn: 0x11,
            my_qpn: 0xd001,
            psn: 0xff_fffe,
            sq_psn: 5,
            rkey: 0x1234,
            va: 0x7000_0000,
            mw_rkey: 0x99,
        };
        let all = cases();
        assert!(all.len() >= 60, "{} cases", all.len());
        let mut names = std::collections::HashSet::new();
        for case in &all {
            assert!(names.insert(case.name), "two cases named {}", case.name);
            for s in &case.steps {
                match s {
                    Step::Send(f) => {
                        for p in f(&c) {
                            let b = p.bytes();
                            assert!(
                                b.len() >= 16 && b.len() <= 1500 - 28,
                                "{}: {} bytes",
                                case.name,
                                b.len()
                            );
                        }
                    }
                    Step::Post(f) => assert!(f(&c).starts_with("opcode="), "{}", case.name),
                }
            }
        }
        assert_eq!(all.iter().map(Case::corrupted_packets).sum::<usize>(), 6);
    }

    #[test]
    fn differences_pair_lines_and_show_what_is_missing() {
        let a = vec!["x".to_string(), "y".to_string()];
        let b = vec!["x".to_string()];
        assert!(differences(&a, &a).is_empty());
        assert_eq!(differences(&a, &b), vec!["y | (nothing)".to_string()]);
    }

    #[test]
    fn the_pattern_matches_the_target_script() {
        // diff-target.py: bytes((i * 7 + 3) % 251 for i in range(n))
        assert_eq!(
            (0..4).map(mr_pattern).collect::<Vec<_>>(),
            vec![3, 10, 17, 24]
        );
        assert_eq!(mr_pattern(250), ((250 * 7 + 3) % 251) as u8);
    }
}
