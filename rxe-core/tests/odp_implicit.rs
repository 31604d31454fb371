//! Implicit on-demand-paging MRs (`ibv_reg_mr(pd, NULL, SIZE_MAX, IBV_ACCESS_ON_DEMAND)`): one
//! MR over the whole address space, IOVA 0 onwards, whose page `x >> 12` the driver maps when
//! the device asks for it. Here a pager plays the driver: it gives each page asked for a fresh
//! page of the node's memory. Every byte is checked; the table holds only the pages mapped.

mod common;

use std::collections::HashMap;

use common::{sge, statuses};
use rxe_core::mem::{Backing, ODP_PRESENT, ODP_WRITABLE};
use rxe_core::sim::*;
use rxe_core::verbs::*;

const LW: Access = Access::LOCAL_WRITE;
const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE.0);
/// A buffer high in the address space, starting inside its page, over three pages.
const VA: u64 = 0x7f12_3456_7f00;
const LEN: u64 = 0x2100;

struct Implicit {
    sim: Sim,
    ep: [Endpoint; 2],
    key: u32,
    /// The node-1 page the pager gave each page of the address space.
    pages: HashMap<u64, u64>,
    faults: usize,
}

impl Implicit {
    fn new(seed: u64) -> Implicit {
        let mut sim = Sim::new(seed);
        let ep = sim.connect(ConnOpts::default());
        let key = sim
            .dev(1)
            .reg_mr(
                ep[1].pd,
                0,
                u64::MAX,
                ALL,
                Backing::OdpImplicit {
                    key: 0,
                    entries: Default::default(),
                },
            )
            .expect("an implicit ODP MR");
        Implicit {
            sim,
            ep,
            key,
            pages: HashMap::new(),
            faults: 0,
        }
    }

    /// Node 1's memory address of IOVA `va`, if its page was mapped.
    fn at(&self, va: u64) -> Option<u64> {
        self.pages.get(&(va >> 12)).map(|p| p + (va & 0xfff))
    }

    fn bytes(&self, va: u64, n: u64) -> Vec<u8> {
        (va..va + n)
            .map(|a| self.sim.nodes[1].mem.slice(self.at(a).expect("mapped"), 1)[0])
            .collect()
    }

    /// Answers every fault: a fresh page of node 1's memory, writable.
    fn page_in(&mut self) -> bool {
        let mut any = false;
        while let Some(f) = self.sim.dev(1).poll_page_fault() {
            assert_eq!(f.key, self.key);
            any = true;
            self.faults += 1;
            let pa = match self.pages.get(&f.page) {
                Some(&p) => p,
                None => {
                    let p = (self.sim.alloc(1, 8192) + 4095) & !4095;
                    self.pages.insert(f.page, p);
                    p
                }
            };
            let e = pa | ODP_PRESENT | ODP_WRITABLE;
            assert_eq!(self.sim.dev(1).odp_update(f.key, f.page, &[e]), Ok(()));
        }
        if any {
            self.sim.dev(1).odp_wake();
        }
        any
    }

    fn post(&mut self, wr: SendWr) -> Vec<(u64, WcStatus)> {
        let (qpn, cq) = (self.ep[0].qpn, self.ep[0].cq);
        self.sim.dev(0).post_send(qpn, wr).unwrap();
        for _ in 0..100_000 {
            let moved = self.sim.step();
            if !self.page_in() && !moved {
                return statuses(&self.sim.poll_all(0, cq));
            }
        }
        panic!("the simulation did not settle");
    }
}

#[test]
fn write_and_read_anywhere_in_the_address_space() {
    let mut s = Implicit::new(1);
    let before = s.sim.dev(1).registered_bytes();
    let data = rxe_core::sim::prng_pattern(3, LEN as usize);
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, LEN as usize, LW);
    s.sim.nodes[0]
        .mem
        .slice_mut(src, LEN as usize)
        .copy_from_slice(&data);
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: VA,
            rkey: s.key,
        },
        sge(src, LEN, skey),
    );
    assert_eq!(s.post(wr), vec![(1, WcStatus::Success)]);
    assert_eq!(s.bytes(VA, LEN), data);
    let mut mapped: Vec<u64> = s.pages.keys().copied().collect();
    mapped.sort();
    assert_eq!(mapped, vec![VA >> 12, (VA >> 12) + 1, (VA >> 12) + 2]);
    assert_eq!(
        s.sim.dev(1).odp_entries(s.key),
        Some(3),
        "only the pages mapped"
    );
    assert_eq!(
        s.sim.dev(1).registered_bytes(),
        before,
        "the MR registers no bytes"
    );

    // READ it back, and from a page near the top of the address space.
    let (dst, dkey) = s.sim.reg(0, s.ep[0].pd, LEN as usize, LW);
    let wr = SendWr::new(
        2,
        SendOp::Read {
            remote_addr: VA,
            rkey: s.key,
        },
        sge(dst, LEN, dkey),
    );
    assert_eq!(s.post(wr), vec![(2, WcStatus::Success)]);
    assert_eq!(s.sim.nodes[0].mem.slice(dst, LEN as usize), &data[..]);
    let top = (1u64 << 63) + 0x123;
    let wr = SendWr::new(
        3,
        SendOp::Write {
            remote_addr: top,
            rkey: s.key,
        },
        sge(src, 64, skey),
    );
    assert_eq!(s.post(wr), vec![(3, WcStatus::Success)]);
    assert_eq!(s.bytes(top, 64), &data[..64]);
    assert!(s.pages.contains_key(&(top >> 12)), "page 2^51 asked for");
}

#[test]
fn an_unmapped_page_is_asked_for_again_and_the_table_shrinks() {
    let mut s = Implicit::new(2);
    let (src, skey) = s.sim.reg(0, s.ep[0].pd, 64, LW);
    let key = s.key;
    let write = |id| {
        SendWr::new(
            id,
            SendOp::Write {
                remote_addr: VA,
                rkey: key,
            },
            sge(src, 64, skey),
        )
    };
    let wr = write(1);
    assert_eq!(s.post(wr), vec![(1, WcStatus::Success)]);
    let faults = s.faults;
    assert_eq!(s.sim.dev(1).odp_entries(s.key), Some(1));
    // the invalidation of the page: its entry goes
    s.sim.dev(1).odp_update(key, VA >> 12, &[0]).unwrap();
    assert_eq!(s.sim.dev(1).odp_entries(key), Some(0));
    assert_eq!(s.post(write(2)), vec![(2, WcStatus::Success)]);
    assert!(s.faults > faults, "the page was asked for again");
}

#[test]
fn what_the_implicit_table_refuses() {
    let mut s = Implicit::new(3);
    let pd = s.ep[1].pd;
    let key = s.key;
    let implicit = || Backing::OdpImplicit {
        key: 0,
        entries: Default::default(),
    };
    // only IOVA 0, length u64::MAX, and no entry at registration
    assert_eq!(
        s.sim.dev(1).reg_mr(pd, 0x1000, u64::MAX, ALL, implicit()),
        Err(VerbError::Invalid)
    );
    assert_eq!(
        s.sim.dev(1).reg_mr(pd, 0, 1 << 20, ALL, implicit()),
        Err(VerbError::Invalid)
    );
    let mut pre = std::collections::BTreeMap::new();
    pre.insert(5u64, 0x1000 | ODP_PRESENT);
    assert_eq!(
        s.sim.dev(1).reg_mr(
            pd,
            0,
            u64::MAX,
            ALL,
            Backing::OdpImplicit {
                key: 0,
                entries: pre
            }
        ),
        Err(VerbError::Invalid)
    );
    // pages past 2^52, and entries with stray low bits, change nothing
    let last = (1u64 << 52) - 1;
    assert_eq!(
        s.sim
            .dev(1)
            .odp_update(key, last, &[0x1000 | ODP_PRESENT, 0x2000 | ODP_PRESENT]),
        Err(VerbError::Invalid)
    );
    assert_eq!(
        s.sim
            .dev(1)
            .odp_update(key, 7, &[0x1000 | ODP_PRESENT | 0x80]),
        Err(VerbError::Invalid)
    );
    assert_eq!(s.sim.dev(1).odp_entries(key), Some(0));
    assert_eq!(
        s.sim.dev(1).odp_update(key, last, &[0x1000 | ODP_PRESENT]),
        Ok(())
    );
    assert_eq!(s.sim.dev(1).odp_entries(key), Some(1));
    // no rereg of an on-demand MR
    assert_eq!(
        s.sim.dev(1).rereg_mr(key, None, Some(LW), None),
        Err(VerbError::Invalid)
    );
}
