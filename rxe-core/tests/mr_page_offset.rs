//! An MR whose IOVA is not congruent to its buffer (`ibv_reg_mr_iova`): IOVA 0x1000_0123 over
//! a buffer that starts 0x456 bytes into its first page. The page list's `page_offset`, not
//! `iova mod page`, says where the first byte is; WRITE, READ and SEND through the MR must hit
//! exactly the buffer's bytes, and the bounds hold at both ends.

mod common;

use common::{sge, statuses};
use rxe_core::mem::Backing;
use rxe_core::sim::*;
use rxe_core::verbs::*;

const LW: Access = Access::LOCAL_WRITE;
const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE.0);
const IOVA: u64 = 0x1000_0123;
const OFF: u64 = 0x456;
/// 0x456 + 0x2000 bytes: three pages.
const LEN: u64 = 0x2000;

/// The shared PRNG fill: a page or segment at the wrong offset cannot compare equal.
fn pattern(n: u64) -> Vec<u8> {
    rxe_core::sim::prng_pattern(0x0ff5e7, n as usize)
}

/// A connected RC pair and, on node 1, the MR: its key and its pages (out of order).
struct Setup {
    sim: Sim,
    ep: [Endpoint; 2],
    key: u32,
    pages: Vec<u64>,
}

impl Setup {
    fn new(seed: u64) -> Setup {
        let mut sim = Sim::new(seed);
        let ep = sim.connect(ConnOpts::default());
        let base = (sim.alloc(1, 5 * 4096) + 4095) & !4095;
        let pages = vec![base + 2 * 4096, base, base + 3 * 4096];
        let key = sim
            .dev(1)
            .reg_mr(
                ep[1].pd,
                IOVA,
                LEN,
                ALL,
                Backing::Pages {
                    page_shift: 12,
                    page_offset: OFF,
                    pages: pages.clone(),
                },
            )
            .expect("an MR with an incongruent IOVA");
        Setup {
            sim,
            ep,
            key,
            pages,
        }
    }

    /// Node 1's memory address of byte `x` of the MR.
    fn at(&self, x: u64) -> u64 {
        let p = OFF + x;
        self.pages[(p >> 12) as usize] + (p & 0xfff)
    }

    /// The MR's bytes `x .. x+n`, gathered from node 1's memory.
    fn mr_bytes(&self, x: u64, n: u64) -> Vec<u8> {
        (x..x + n)
            .map(|i| self.sim.nodes[1].mem.slice(self.at(i), 1)[0])
            .collect()
    }

    fn post(&mut self, node: usize, wr: SendWr) -> Vec<(u64, WcStatus)> {
        let (qpn, cq) = (self.ep[node].qpn, self.ep[node].cq);
        self.sim.dev(node).post_send(qpn, wr).unwrap();
        self.sim.settle(10_000);
        statuses(&self.sim.poll_all(node, cq))
    }
}

#[test]
fn write_read_and_send_hit_the_buffer_bytes() {
    let mut s = Setup::new(21);
    let data = pattern(LEN);
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, LEN as usize, LW);
    s.sim.nodes[0]
        .mem
        .slice_mut(src, LEN as usize)
        .copy_from_slice(&data);
    // WRITE of the whole MR, first byte to last.
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: IOVA,
            rkey: s.key,
        },
        sge(src, LEN, skey),
    );
    assert_eq!(s.post(0, wr), vec![(1, WcStatus::Success)]);
    assert_eq!(s.mr_bytes(0, LEN), data);
    // Byte 0 is 0x456 into the first page (not 0x123, the IOVA's page offset).
    assert_eq!(s.at(0), s.pages[0] + 0x456);
    let mem = &s.sim.nodes[1].mem;
    assert_eq!(mem.slice(s.pages[0] + 0x123, 1), &[0]);
    assert_eq!(mem.slice(s.pages[0] + 0x455, 1), &[0], "byte before the MR");
    assert_eq!(mem.slice(s.pages[2] + 0x456, 1), &[0], "byte after the MR");

    // READ it back, through an offset that crosses two page boundaries.
    let (dst, dkey) = s.sim.reg(0, s.ep[0].pd, LEN as usize, LW);
    let wr = SendWr::new(
        2,
        SendOp::Read {
            remote_addr: IOVA + 0x100,
            rkey: s.key,
        },
        sge(dst, LEN - 0x100, dkey),
    );
    assert_eq!(s.post(0, wr), vec![(2, WcStatus::Success)]);
    assert_eq!(
        s.sim.nodes[0].mem.slice(dst, (LEN - 0x100) as usize),
        &data[0x100..]
    );

    // SEND into a receive SGE on the MR (the local key and the same translation).
    let msg: Vec<u8> = pattern(0x1800).iter().map(|b| b ^ 0xff).collect();
    s.sim.nodes[0]
        .mem
        .slice_mut(src, msg.len())
        .copy_from_slice(&msg);
    let (qpn1, cq1) = (s.ep[1].qpn, s.ep[1].cq);
    s.sim
        .dev(1)
        .post_recv(
            qpn1,
            RecvWr {
                wr_id: 9,
                sg_list: sge(IOVA + LEN - 0x1800, 0x1800, s.key).into(),
            },
        )
        .unwrap();
    let wr = SendWr::new(3, SendOp::Send, sge(src, 0x1800, skey));
    assert_eq!(s.post(0, wr), vec![(3, WcStatus::Success)]);
    assert_eq!(
        statuses(&s.sim.poll_all(1, cq1)),
        vec![(9, WcStatus::Success)]
    );
    assert_eq!(s.mr_bytes(LEN - 0x1800, 0x1800), msg);
    assert_eq!(
        s.mr_bytes(0, LEN - 0x1800),
        &data[..(LEN - 0x1800) as usize]
    );

    // And a SEND from the MR's last bytes (gathered through the local key).
    let (rbuf, rkey) = s.sim.reg(0, s.ep[0].pd, 64, LW);
    let (qpn0, cq0) = (s.ep[0].qpn, s.ep[0].cq);
    s.sim
        .dev(0)
        .post_recv(
            qpn0,
            RecvWr {
                wr_id: 10,
                sg_list: sge(rbuf, 64, rkey).into(),
            },
        )
        .unwrap();
    let wr = SendWr::new(4, SendOp::Send, sge(IOVA + LEN - 16, 16, s.key));
    assert_eq!(s.post(1, wr), vec![(4, WcStatus::Success)]);
    assert_eq!(
        statuses(&s.sim.poll_all(0, cq0)),
        vec![(10, WcStatus::Success)]
    );
    assert_eq!(s.sim.nodes[0].mem.slice(rbuf, 16), &msg[msg.len() - 16..]);
}

/// One byte before the MR, one byte past its end: remote accesses are refused and write
/// nothing; so is a local SGE that reaches past the end.
#[test]
fn bounds_at_both_ends() {
    let remote_cases = [
        ("write before", IOVA - 1, 1, true),
        ("write past the end", IOVA + LEN - 1, 2, true),
        ("write at the end", IOVA + LEN, 1, true),
        ("read before", IOVA - 1, 4, false),
        ("read past the end", IOVA + LEN - 3, 4, false),
    ];
    for (i, (what, addr, n, write)) in remote_cases.into_iter().enumerate() {
        let mut s = Setup::new(30 + i as u64);
        let (buf, bkey) = s.sim.reg(0, s.ep[0].pd, 64, LW);
        s.sim.nodes[0].mem.slice_mut(buf, 64).fill(0xee);
        let op = if write {
            SendOp::Write {
                remote_addr: addr,
                rkey: s.key,
            }
        } else {
            SendOp::Read {
                remote_addr: addr,
                rkey: s.key,
            }
        };
        let got = s.post(0, SendWr::new(1, op, sge(buf, n, bkey)));
        assert_eq!(got, vec![(1, WcStatus::RemAccessErr)], "{what}");
        assert!(
            s.mr_bytes(0, LEN).iter().all(|&b| b == 0),
            "{what}: the MR is untouched"
        );
        let mem = &s.sim.nodes[1].mem;
        assert_eq!(mem.slice(s.pages[0] + 0x455, 1), &[0], "{what}");
        assert_eq!(mem.slice(s.pages[2] + 0x456, 1), &[0], "{what}");
    }
    // The last byte exactly is inside.
    let mut s = Setup::new(40);
    let (buf, bkey) = s.sim.reg(0, s.ep[0].pd, 64, LW);
    s.sim.nodes[0].mem.slice_mut(buf, 64).fill(0xee);
    let op = SendOp::Write {
        remote_addr: IOVA + LEN - 1,
        rkey: s.key,
    };
    assert_eq!(
        s.post(0, SendWr::new(1, op, sge(buf, 1, bkey))),
        vec![(1, WcStatus::Success)]
    );
    assert_eq!(s.mr_bytes(LEN - 1, 1), [0xee]);
    // A local SGE one byte too long.
    let mut s = Setup::new(41);
    let wr = SendWr::new(2, SendOp::Send, sge(IOVA + LEN - 16, 17, s.key));
    assert_eq!(s.post(1, wr), vec![(2, WcStatus::LocProtErr)]);
}

/// Fast registration carries the same offset: a REG_MR whose IOVA is 0 (zero-based, as
/// `ib_map_mr_sg_zbva` leaves it) over a buffer 0x456 bytes into its first page.
#[test]
fn fast_reg_with_a_page_offset_apart_from_the_iova() {
    let mut sim = Sim::new(50);
    let ep = sim.connect(ConnOpts::default());
    let base = (sim.alloc(1, 4 * 4096) + 4095) & !4095;
    let pages = vec![base + 4096, base];
    let mr = sim.dev(1).alloc_mr(ep[1].pd, 4).unwrap();
    let key = (mr & !0xff) | 0x42;
    let reg = SendOp::RegMr {
        lkey: mr,
        key,
        access: ALL,
        iova: 0,
        length: 0x1000,
        page_shift: 12,
        page_offset: OFF,
        pages: pages.clone(),
    };
    sim.dev(1)
        .post_send(ep[1].qpn, SendWr::new(1, reg, vec![]))
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(1, WcStatus::Success)]
    );
    let data = pattern(0x1000);
    let (src, skey) = sim.reg(0, ep[0].pd, 0x1000, LW);
    sim.nodes[0]
        .mem
        .slice_mut(src, 0x1000)
        .copy_from_slice(&data);
    let wr = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: 0,
            rkey: key,
        },
        sge(src, 0x1000, skey),
    );
    sim.dev(0).post_send(ep[0].qpn, wr).unwrap();
    sim.settle(1000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        vec![(2, WcStatus::Success)]
    );
    let m = &sim.nodes[1].mem;
    assert_eq!(
        m.slice(pages[0] + OFF, 0x1000 - OFF as usize),
        &data[..0xbaa]
    );
    assert_eq!(m.slice(pages[1], OFF as usize), &data[0xbaa..]);
    // An offset beyond the first page: the REG_MR fails locally.
    let mut inv = SendWr::new(3, SendOp::LocalInv { rkey: key }, vec![]);
    inv.flags = SEND_SIGNALED;
    sim.dev(1).post_send(ep[1].qpn, inv).unwrap();
    let bad = SendOp::RegMr {
        lkey: mr,
        key: key + 1,
        access: ALL,
        iova: 0,
        length: 16,
        page_shift: 12,
        page_offset: 0x1000,
        pages,
    };
    sim.dev(1)
        .post_send(ep[1].qpn, SendWr::new(4, bad, vec![]))
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, ep[1].cq)),
        vec![(3, WcStatus::Success), (4, WcStatus::LocQpOpErr)]
    );
}
