//! On-demand-paging MRs: an MR whose pages are mapped and unmapped at any time by its owner
//! (the guest driver, here a pager in the test). An access to a page not mapped is not an
//! error: the page is asked for (`Device::poll_page_fault`), and once the pager maps it
//! (`Device::odp_update`, `Device::odp_wake`) the operation goes on — at the requester by
//! building the packet again, at a responder by an RNR NAK (SEND, WRITE) or by answering
//! later (READ), or by the peer's retransmission (atomics). Every byte is checked.

mod common;

use common::{sge, statuses};
use rxe_core::mem::{Backing, PageFault, ODP_PRESENT, ODP_WRITABLE};
use rxe_core::sim::*;
use rxe_core::verbs::*;

const LW: Access = Access::LOCAL_WRITE;
const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE.0);
const IOVA: u64 = 0x7f00_0000_0234;
/// Where the MR's first byte lies in its first page.
const OFF: u64 = 0x234;
/// 0x234 + 0x3000 bytes: four pages.
const LEN: u64 = 0x3000;
const NPAGES: usize = 4;

fn pattern(seed: u64, n: u64) -> Vec<u8> {
    rxe_core::sim::prng_pattern(seed, n as usize)
}

/// An ODP MR on `node` of a connected pair, with the pages that back it (what the driver's
/// page tables say: out of order, as a guest's are).
struct Odp {
    sim: Sim,
    ep: [Endpoint; 2],
    node: usize,
    key: u32,
    pages: Vec<u64>,
    /// Every fault the device asked for, in order.
    faults: Vec<PageFault>,
    /// Map pages read-only on read faults (as a guest maps the zero page for a read).
    read_only_on_read: bool,
    /// Stop answering faults (a driver that does not answer).
    silent: bool,
}

impl Odp {
    fn new(seed: u64, node: usize, opts: ConnOpts) -> Odp {
        let mut sim = Sim::new(seed);
        let ep = sim.connect(opts);
        let base = (sim.alloc(node, (NPAGES + 1) * 4096) + 4095) & !4095;
        let pages = vec![base + 2 * 4096, base, base + 3 * 4096, base + 4096];
        let key = sim
            .dev(node)
            .reg_mr(
                ep[node].pd,
                IOVA,
                LEN,
                ALL,
                Backing::Odp {
                    key: 0,
                    page_offset: OFF,
                    entries: vec![0; NPAGES],
                },
            )
            .expect("an ODP MR");
        Odp {
            sim,
            ep,
            node,
            key,
            pages,
            faults: Vec::new(),
            read_only_on_read: false,
            silent: false,
        }
    }

    /// Node memory address of byte `x` of the MR.
    fn at(&self, x: u64) -> u64 {
        let p = OFF + x;
        self.pages[(p >> 12) as usize] + (p & 0xfff)
    }

    fn mr_bytes(&self, x: u64, n: u64) -> Vec<u8> {
        (x..x + n)
            .map(|i| self.sim.nodes[self.node].mem.slice(self.at(i), 1)[0])
            .collect()
    }

    fn fill_mr(&mut self, data: &[u8]) {
        for (i, b) in data.iter().enumerate() {
            let a = self.at(i as u64);
            self.sim.nodes[self.node].mem.slice_mut(a, 1)[0] = *b;
        }
    }

    /// Unmaps every page (what an invalidation of the whole range does).
    fn unmap_all(&mut self) {
        self.sim
            .dev(self.node)
            .odp_update(self.key, 0, &[0; NPAGES])
            .unwrap();
    }

    /// Answers the faults the device asked for, as a driver does: maps the page (writable
    /// for a write fault), then wakes the waiters. Returns whether there were any.
    fn page_in(&mut self) -> bool {
        let mut any = false;
        for n in 0..2 {
            while let Some(f) = self.sim.dev(n).poll_page_fault() {
                assert_eq!(n, self.node, "a fault on the node without the ODP MR");
                assert_eq!(f.key, self.key);
                self.faults.push(f);
                any = true;
                if self.silent {
                    continue;
                }
                let w = if f.write || !self.read_only_on_read {
                    ODP_WRITABLE
                } else {
                    0
                };
                let e = self.pages[f.page as usize] | ODP_PRESENT | w;
                let r = self.sim.dev(n).odp_update(f.key, f.page, &[e]);
                assert_eq!(r, Ok(()), "mapping {f:?} as {e:#x}");
            }
        }
        if any && !self.silent {
            self.sim.dev(self.node).odp_wake();
        }
        any
    }

    /// Runs until nothing moves and no fault is left to answer.
    fn run(&mut self) {
        for _ in 0..100_000 {
            let moved = self.sim.step();
            if !self.page_in() && !moved {
                return;
            }
        }
        panic!("the simulation did not settle");
    }

    fn post(&mut self, node: usize, wr: SendWr) -> Vec<(u64, WcStatus)> {
        let (qpn, cq) = (self.ep[node].qpn, self.ep[node].cq);
        self.sim.dev(node).post_send(qpn, wr).unwrap();
        self.run();
        statuses(&self.sim.poll_all(node, cq))
    }

    fn recv(&mut self, node: usize, wr_id: u64, sg: Vec<Sge>) {
        let qpn = self.ep[node].qpn;
        self.sim
            .dev(node)
            .post_recv(
                qpn,
                RecvWr {
                    wr_id,
                    sg_list: sg.into(),
                },
            )
            .unwrap();
    }

    fn faulted_pages(&self) -> Vec<u64> {
        let mut p: Vec<u64> = self.faults.iter().map(|f| f.page).collect();
        p.sort();
        p.dedup();
        p
    }
}

/// A WRITE into an ODP MR none of whose pages is mapped: every page is asked for (as a
/// write), the responder RNR-NAKs until it is mapped, and the WRITE lands whole.
#[test]
fn write_into_pages_not_mapped() {
    let mut s = Odp::new(1, 1, ConnOpts::default());
    let data = pattern(11, LEN);
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, LEN as usize, LW);
    s.sim.nodes[0]
        .mem
        .slice_mut(src, LEN as usize)
        .copy_from_slice(&data);
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
    assert_eq!(s.faulted_pages(), vec![0, 1, 2, 3]);
    assert!(s.faults.iter().all(|f| f.write));
    let req = s.sim.dev(0).qp_counters(s.ep[0].qpn).unwrap();
    assert!(req.rnr_naks_received >= 1, "{req:?}");
    assert_eq!(req.errors, 0);
    assert_eq!(
        s.sim.dev(1).port_counters().odp_faults,
        s.faults.len() as u64
    );

    // Unmapped again (the owner took the pages back): the next WRITE faults them in again.
    s.unmap_all();
    s.faults.clear();
    let data2 = pattern(12, LEN);
    s.sim.nodes[0]
        .mem
        .slice_mut(src, LEN as usize)
        .copy_from_slice(&data2);
    let wr = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: IOVA,
            rkey: s.key,
        },
        sge(src, LEN, skey),
    );
    assert_eq!(s.post(0, wr), vec![(2, WcStatus::Success)]);
    assert_eq!(s.mr_bytes(0, LEN), data2);
    assert_eq!(s.faulted_pages(), vec![0, 1, 2, 3]);
}

/// A READ of an ODP MR at the responder: its responses wait for their pages, then carry the
/// MR's bytes; a page mapped read-only serves a READ without a write fault.
#[test]
fn read_from_pages_not_mapped() {
    let mut s = Odp::new(2, 1, ConnOpts::default());
    s.read_only_on_read = true;
    let data = pattern(21, LEN);
    s.fill_mr(&data);
    let (dst, dkey) = s.sim.reg(0, s.ep[0].pd, LEN as usize, LW);
    let wr = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: IOVA + 0x10,
            rkey: s.key,
        },
        sge(dst, LEN - 0x10, dkey),
    );
    assert_eq!(s.post(0, wr), vec![(1, WcStatus::Success)]);
    assert_eq!(
        s.sim.nodes[0].mem.slice(dst, (LEN - 0x10) as usize),
        &data[0x10..]
    );
    assert_eq!(s.faulted_pages(), vec![0, 1, 2, 3]);
    assert!(s.faults.iter().all(|f| !f.write));
    // The responses waited for their pages: nothing timed out, nothing was asked twice.
    let req = s.sim.dev(0).qp_counters(s.ep[0].qpn).unwrap();
    assert_eq!((req.errors, req.timeouts), (0, 0), "{req:?}");

    // The pages are mapped read-only now: a WRITE faults each again, as a write.
    s.faults.clear();
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, 0x100, LW);
    s.sim.nodes[0].mem.slice_mut(src, 0x100).fill(0x5a);
    let wr = SendWr::new(
        2,
        SendOp::Write {
            remote_addr: IOVA + 0xd80,
            rkey: s.key,
        },
        sge(src, 0x100, skey),
    );
    assert_eq!(s.post(0, wr), vec![(2, WcStatus::Success)]);
    assert_eq!(s.mr_bytes(0xd80, 0x100), vec![0x5a; 0x100]);
    assert_eq!(s.faulted_pages(), vec![0, 1]);
    assert!(s.faults.iter().all(|f| f.write));
    assert_eq!(s.mr_bytes(0, 0xd80), &data[..0xd80]);
    assert_eq!(s.mr_bytes(0xe80, LEN - 0xe80), &data[0xe80..]);
}

/// SENDs into and out of an ODP MR: the receive WQE is given back while its page is asked
/// for (it completes once, with every byte), and a requester gathering from pages not mapped
/// waits for them.
#[test]
fn send_into_and_out_of_pages_not_mapped() {
    let mut s = Odp::new(3, 1, ConnOpts::default());
    let msg = pattern(31, 0x2800);
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, msg.len(), LW);
    s.sim.nodes[0]
        .mem
        .slice_mut(src, msg.len())
        .copy_from_slice(&msg);
    s.recv(1, 9, sge(IOVA + 0x400, 0x2800, s.key));
    let wr = SendWr::new(1, SendOp::Send, sge(src, 0x2800, skey));
    assert_eq!(s.post(0, wr), vec![(1, WcStatus::Success)]);
    let (qpn1, cq1) = (s.ep[1].qpn, s.ep[1].cq);
    let got = s.sim.poll_all(1, cq1);
    assert_eq!(statuses(&got), vec![(9, WcStatus::Success)]);
    assert_eq!(got[0].byte_len, 0x2800);
    assert_eq!(s.mr_bytes(0x400, 0x2800), msg);
    assert_eq!(s.sim.dev(1).rq_outstanding(qpn1), Some(0));

    // Node 1 sends from the MR after its pages were taken back.
    s.unmap_all();
    s.faults.clear();
    let (rbuf, rkey) = s.sim.reg(0, s.ep[0].pd, 0x2000, LW);
    s.recv(0, 10, sge(rbuf, 0x2000, rkey));
    let wr = SendWr::new(2, SendOp::Send, sge(IOVA + 0x800, 0x2000, s.key));
    assert_eq!(s.post(1, wr), vec![(2, WcStatus::Success)]);
    let cq0 = s.ep[0].cq;
    assert_eq!(
        statuses(&s.sim.poll_all(0, cq0)),
        vec![(10, WcStatus::Success)]
    );
    assert_eq!(s.sim.nodes[0].mem.slice(rbuf, 0x2000), &msg[0x400..0x2400]);
    assert!(s.faults.iter().all(|f| !f.write));
    assert_eq!(s.faulted_pages(), vec![0, 1, 2]);
}

/// A READ and an atomic whose local buffer is an ODP MR: the response that cannot be placed
/// is dropped, the requester waits for the page and asks again (spending no retry), and the
/// atomic is executed once at the responder (its replay answers the second request).
#[test]
fn read_response_and_atomic_ack_into_pages_not_mapped() {
    let mut s = Odp::new(4, 0, ConnOpts::default());
    let data = pattern(41, 0x1800);
    let (rsrc, rskey) = s.sim.reg(1, s.ep[1].pd, data.len(), ALL);
    s.sim.nodes[1]
        .mem
        .slice_mut(rsrc, data.len())
        .copy_from_slice(&data);
    let wr = SendWr::new(
        1,
        SendOp::Read {
            remote_addr: rsrc,
            rkey: rskey,
        },
        sge(IOVA + 0x100, 0x1800, s.key),
    );
    assert_eq!(s.post(0, wr), vec![(1, WcStatus::Success)]);
    assert_eq!(s.mr_bytes(0x100, 0x1800), data);
    assert!(s.faults.iter().all(|f| f.write));
    let c = s.sim.dev(0).qp_counters(s.ep[0].qpn).unwrap();
    assert_eq!((c.errors, c.timeouts), (0, 0), "{c:?}");

    // FETCH_ADD into a target of 5: 5 comes back into the ODP page, the target is 12.
    s.unmap_all();
    let (t, tkey) = s.sim.reg(1, s.ep[1].pd, 8, ALL);
    s.sim.nodes[1]
        .mem
        .slice_mut(t, 8)
        .copy_from_slice(&5u64.to_le_bytes());
    let wr = SendWr::new(
        2,
        SendOp::FetchAdd {
            remote_addr: t,
            rkey: tkey,
            add: 7,
        },
        sge(IOVA + 0x2000, 8, s.key),
    );
    assert_eq!(s.post(0, wr), vec![(2, WcStatus::Success)]);
    assert_eq!(s.mr_bytes(0x2000, 8), 5u64.to_le_bytes());
    assert_eq!(s.sim.nodes[1].mem.slice(t, 8), 12u64.to_le_bytes());
}

/// An atomic on an ODP MR at the responder: dropped until its page is mapped, then executed
/// once (the requester's retransmission brings it back).
#[test]
fn atomic_on_a_page_not_mapped() {
    let mut s = Odp::new(5, 1, ConnOpts::default());
    s.fill_mr(&[0u8; LEN as usize]);
    let a = s.at(0x1004);
    s.sim.nodes[1]
        .mem
        .slice_mut(a, 8)
        .copy_from_slice(&40u64.to_le_bytes());
    let (dst, dkey) = s.sim.reg(0, s.ep[0].pd, 8, LW);
    let wr = SendWr::new(
        1,
        SendOp::CompSwap {
            remote_addr: IOVA + 0x1004,
            rkey: s.key,
            compare: 40,
            swap: 2,
        },
        sge(dst, 8, dkey),
    );
    assert_eq!(s.post(0, wr), vec![(1, WcStatus::Success)]);
    assert_eq!(s.sim.nodes[0].mem.slice(dst, 8), 40u64.to_le_bytes());
    assert_eq!(s.mr_bytes(0x1004, 8), 2u64.to_le_bytes());
    assert_eq!(s.faults.len(), 1, "{:?}", s.faults);
    assert!(s.faults[0].write);
}

/// A driver that does not answer: the WRITE waits (RNR NAKs, which rnr_retry 7 repeats for
/// ever) without completing in error, and each page is asked for once per wait, not once
/// per packet.
#[test]
fn a_fault_nobody_answers_waits_and_is_asked_once() {
    let mut s = Odp::new(6, 1, ConnOpts::default());
    s.silent = true;
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, 64, LW);
    let (qpn, cq) = (s.ep[0].qpn, s.ep[0].cq);
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: IOVA,
            rkey: s.key,
        },
        sge(src, 64, skey),
    );
    s.sim.dev(0).post_send(qpn, wr).unwrap();
    for _ in 0..2000 {
        s.page_in();
        s.sim.step();
    }
    assert!(s.sim.poll_all(0, cq).is_empty());
    let c = s.sim.dev(0).qp_counters(qpn).unwrap();
    assert!(c.rnr_naks_received > 10, "{c:?}");
    // Every RNR NAK'd retry faulted again, but the queue held each page once at a time.
    assert!(s.faults.iter().all(|f| f.page == 0));
    // Now answer: the WRITE completes.
    s.silent = false;
    s.faults.clear();
    s.run();
    assert_eq!(
        statuses(&s.sim.poll_all(0, cq)),
        vec![(1, WcStatus::Success)]
    );
}

/// What `odp_update` refuses, changing nothing: an unknown key, an MR that is not on demand,
/// a range past the table, an entry with stray low bits or not present.
#[test]
fn odp_update_refuses_what_is_not_a_page_of_an_odp_mr() {
    let mut s = Odp::new(7, 1, ConnOpts::default());
    let (_, plain) = s.sim.reg(1, s.ep[1].pd, 4096, LW);
    let p = s.pages[0];
    let dev = s.sim.dev(1);
    assert_eq!(
        dev.odp_update(s.key ^ 1, 0, &[p | ODP_PRESENT]),
        Err(VerbError::NotFound)
    );
    assert_eq!(
        dev.odp_update(plain, 0, &[p | ODP_PRESENT]),
        Err(VerbError::NotFound)
    );
    assert_eq!(
        dev.odp_update(s.key, 3, &[p | ODP_PRESENT, p | ODP_PRESENT]),
        Err(VerbError::Invalid)
    );
    assert_eq!(
        dev.odp_update(s.key, u64::MAX, &[p | ODP_PRESENT]),
        Err(VerbError::Invalid)
    );
    assert_eq!(
        dev.odp_update(s.key, 0, &[p | ODP_PRESENT | 4]),
        Err(VerbError::Invalid)
    );
    assert_eq!(
        dev.odp_update(s.key, 0, &[p | ODP_WRITABLE]),
        Err(VerbError::Invalid)
    );
    // A registration must start with nothing mapped and a table of the right size.
    let pd = s.ep[1].pd;
    let odp = |entries: Vec<u64>, page_offset| Backing::Odp {
        key: 0,
        page_offset,
        entries,
    };
    let dev = s.sim.dev(1);
    assert!(dev.reg_mr(pd, 0, 4096, LW, odp(vec![p | 1], 0)).is_err());
    assert!(dev.reg_mr(pd, 0, 4096, LW, odp(vec![0, 0], 0)).is_err());
    assert!(dev.reg_mr(pd, 0, 4096, LW, odp(vec![0], 4096)).is_err());
    assert!(dev.reg_mr(pd, 0, 4096, LW, odp(vec![0, 0], 1)).is_ok());
}
