//! `Device::rereg_mr` (`ibv_rereg_mr`): a user MR changed in place, its key kept, as rxe's
//! `rxe_rereg_user_mr` does for the PD and the access (and here the translation too). A peer
//! holding the rkey from before goes on using it: access taken away fails with a remote
//! access error, given back works again; a new PD fails the old PD's QP; a new translation
//! puts the bytes in the new pages and none in the old. Refusals change nothing.

mod common;

use common::{sge, statuses};
use rxe_core::mem::{Backing, MwType};
use rxe_core::sim::*;
use rxe_core::verbs::*;

const LW: Access = Access::LOCAL_WRITE;
const ALL: Access = Access(Access::LOCAL_WRITE.0 | Access::REMOTE.0);
const IOVA: u64 = 0x5000_0100;
const LEN: u64 = 0x1800;

fn pattern(seed: u64, n: u64) -> Vec<u8> {
    rxe_core::sim::prng_pattern(seed, n as usize)
}

/// A connected RC pair; on node 1 the MR (IOVA 0x5000_0100, two pages out of order) whose
/// rkey node 0 writes to; on node 0 a source buffer.
struct Setup {
    sim: Sim,
    ep: [Endpoint; 2],
    key: u32,
    pages: Vec<u64>,
    src: u64,
    skey: u32,
}

impl Setup {
    fn new(seed: u64) -> Setup {
        let mut sim = Sim::new(seed);
        let ep = sim.connect(ConnOpts::default());
        let pages = page_run(&mut sim, 2);
        let key = sim
            .dev(1)
            .reg_mr(ep[1].pd, IOVA, LEN, ALL, pages_backing(&pages))
            .expect("the MR");
        let (src, skey) = sim.reg(0, ep[0].pd, LEN as usize, LW);
        Setup {
            sim,
            ep,
            key,
            pages,
            src,
            skey,
        }
    }

    /// Node 0 WRITEs `data` to the MR's IOVA with the rkey it had from the start.
    fn write(&mut self, id: u64, data: &[u8]) -> Vec<(u64, WcStatus)> {
        self.sim.nodes[0]
            .mem
            .slice_mut(self.src, data.len())
            .copy_from_slice(data);
        let wr = SendWr::new(
            id,
            SendOp::Write {
                remote_addr: IOVA,
                rkey: self.key,
            },
            sge(self.src, data.len() as u64, self.skey),
        );
        let (qpn, cq) = (self.ep[0].qpn, self.ep[0].cq);
        self.sim.dev(0).post_send(qpn, wr).unwrap();
        self.sim.settle(10_000);
        statuses(&self.sim.poll_all(0, cq))
    }

    /// The bytes of node 1's memory that `pages` hold for the MR's first `n` bytes.
    fn bytes_in(&self, pages: &[u64], n: u64) -> Vec<u8> {
        (0..n)
            .map(|x| {
                let p = 0x100 + x;
                self.sim.nodes[1]
                    .mem
                    .slice(pages[(p >> 12) as usize] + (p & 0xfff), 1)[0]
            })
            .collect()
    }

    /// After an error: both QPs RESET, then INIT → RTR → RTS again with fresh PSNs.
    fn reconnect(&mut self) {
        for (i, e) in self.ep.iter().enumerate() {
            let reset = QpAttr {
                qp_state: QpState::Reset,
                ..Default::default()
            };
            self.sim
                .dev(i)
                .modify_qp(e.qpn, &reset, AttrMask(AttrMask::STATE))
                .expect("reset");
        }
        let o = ConnOpts {
            sq_psn: [0x7000, 0x7100],
            ..Default::default()
        };
        let ep = self.ep;
        self.sim.bring_up(&ep, &o);
    }
}

/// `n` pages of node 1's memory, in reverse order.
fn page_run(sim: &mut Sim, n: usize) -> Vec<u64> {
    let base = (sim.alloc(1, (n + 1) * 4096) + 4095) & !4095;
    (0..n).rev().map(|i| base + i as u64 * 4096).collect()
}

fn pages_backing(pages: &[u64]) -> Backing {
    Backing::Pages {
        page_shift: 12,
        page_offset: 0x100,
        pages: pages.to_vec(),
    }
}

#[test]
fn access_taken_away_fails_the_old_rkey_and_given_back_works_again() {
    let mut s = Setup::new(1);
    let a = pattern(1, LEN);
    assert_eq!(s.write(1, &a), vec![(1, WcStatus::Success)]);
    s.sim
        .dev(1)
        .rereg_mr(s.key, None, Some(LW), None)
        .expect("rereg to local write only");
    let pages = s.pages.clone();
    let b = pattern(2, LEN);
    assert_eq!(s.write(2, &b), vec![(2, WcStatus::RemAccessErr)]);
    assert_eq!(
        s.bytes_in(&pages, LEN),
        a,
        "nothing written without the right"
    );
    s.sim
        .dev(1)
        .rereg_mr(s.key, None, Some(ALL), None)
        .expect("rereg back");
    s.reconnect();
    assert_eq!(s.write(3, &b), vec![(3, WcStatus::Success)]);
    assert_eq!(s.bytes_in(&pages, LEN), b);
}

#[test]
fn a_new_pd_fails_the_old_pds_qp() {
    let mut s = Setup::new(2);
    let pd2 = s.sim.dev(1).alloc_pd().unwrap();
    s.sim.dev(1).rereg_mr(s.key, Some(pd2), None, None).unwrap();
    assert_eq!(
        s.sim.dev(1).dealloc_pd(pd2),
        Err(VerbError::Busy),
        "the MR holds its new PD"
    );
    assert_eq!(
        s.write(1, &pattern(3, 64)),
        vec![(1, WcStatus::RemAccessErr)]
    );
    let pd1 = s.ep[1].pd;
    s.sim.dev(1).rereg_mr(s.key, Some(pd1), None, None).unwrap();
    s.sim
        .dev(1)
        .dealloc_pd(pd2)
        .expect("the new PD is free again");
    s.reconnect();
    let d = pattern(4, 64);
    assert_eq!(s.write(2, &d), vec![(2, WcStatus::Success)]);
    let pages = s.pages.clone();
    assert_eq!(s.bytes_in(&pages, 64), d);
}

#[test]
fn a_new_translation_takes_the_bytes_the_old_pages_keep_theirs() {
    let mut s = Setup::new(3);
    let a = pattern(5, LEN);
    assert_eq!(s.write(1, &a), vec![(1, WcStatus::Success)]);
    let old = s.pages.clone();
    let new = page_run(&mut s.sim, 2);
    let before = s.sim.dev(1).registered_bytes();
    s.sim
        .dev(1)
        .rereg_mr(s.key, None, None, Some((IOVA, LEN, pages_backing(&new))))
        .unwrap();
    assert_eq!(s.sim.dev(1).registered_bytes(), before);
    let b = pattern(6, LEN);
    assert_eq!(s.write(2, &b), vec![(2, WcStatus::Success)]);
    assert_eq!(s.bytes_in(&new, LEN), b);
    assert_eq!(
        s.bytes_in(&old, LEN),
        a,
        "the old pages are no longer the MR's"
    );
}

#[test]
fn refusals_change_nothing() {
    let mut s = Setup::new(4);
    let key = s.key;
    let pd = s.ep[1].pd;
    // remote write without local write (IBTA 10.6.3.1)
    assert_eq!(
        s.sim
            .dev(1)
            .rereg_mr(key, None, Some(Access::REMOTE_WRITE), None),
        Err(VerbError::Invalid)
    );
    // a page list that does not cover the new length
    let one = page_run(&mut s.sim, 1);
    assert_eq!(
        s.sim
            .dev(1)
            .rereg_mr(key, None, Some(LW), Some((IOVA, LEN, pages_backing(&one)))),
        Err(VerbError::Invalid)
    );
    // a PD that does not exist
    assert_eq!(
        s.sim.dev(1).rereg_mr(key, Some(pd + 77), Some(LW), None),
        Err(VerbError::NotFound)
    );
    // a key that names nothing
    assert_eq!(
        s.sim.dev(1).rereg_mr(key ^ 0xff, None, Some(LW), None),
        Err(VerbError::NotFound)
    );
    // an MR with a window bound to it (the right to bind given by a rereg)
    let bindable = Access(ALL.0 | Access::MW_BIND.0);
    s.sim
        .dev(1)
        .rereg_mr(key, None, Some(bindable), None)
        .expect("rereg with MW_BIND");
    let mw = s.sim.dev(1).alloc_mw(pd, MwType::Type1).unwrap();
    s.sim
        .dev(1)
        .bind_mw_type1(s.ep[1].qpn, mw, key, IOVA, 64, Access::REMOTE_WRITE)
        .expect("bind");
    assert_eq!(
        s.sim.dev(1).rereg_mr(key, None, Some(LW), None),
        Err(VerbError::Busy)
    );
    // after all of them the MR is as it was: the old rkey writes
    let d = pattern(7, LEN);
    assert_eq!(s.write(1, &d), vec![(1, WcStatus::Success)]);
    let pages = s.pages.clone();
    assert_eq!(s.bytes_in(&pages, LEN), d);
}

#[test]
fn on_demand_and_dma_mrs_are_refused() {
    let mut s = Setup::new(5);
    let pd = s.ep[1].pd;
    let odp = s
        .sim
        .dev(1)
        .reg_mr(
            pd,
            IOVA,
            LEN,
            ALL,
            Backing::Odp {
                key: 0,
                page_offset: 0x100,
                entries: vec![0; 2],
            },
        )
        .unwrap();
    assert_eq!(
        s.sim.dev(1).rereg_mr(odp, None, Some(LW), None),
        Err(VerbError::Invalid)
    );
    let dma = s.sim.dev(1).reg_dma_mr(pd, LW).unwrap();
    assert_eq!(
        s.sim.dev(1).rereg_mr(dma, None, Some(ALL), None),
        Err(VerbError::Invalid)
    );
    // a translation may not make an MR on-demand
    assert_eq!(
        s.sim.dev(1).rereg_mr(
            s.key,
            None,
            None,
            Some((
                IOVA,
                LEN,
                Backing::Odp {
                    key: 0,
                    page_offset: 0x100,
                    entries: vec![0; 2]
                }
            ))
        ),
        Err(VerbError::Invalid)
    );
}
