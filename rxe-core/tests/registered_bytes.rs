//! `max_registered_bytes` covers every MR that maps memory: user MRs for their length from
//! registration, fast-registration MRs for the length they map last (from the REG_MR work
//! request until they map another or are deregistered). A REG_MR beyond the budget fails
//! (LOC_QP_OP_ERR, as its other failures) and changes nothing.

mod common;

use common::statuses;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::DeviceConfig;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
const BUDGET: u64 = 64 << 10;

fn reg_wr(id: u64, mr: u32, key: u8, pages: &[u64]) -> SendWr {
    let op = SendOp::RegMr {
        lkey: mr,
        key: (mr & !0xff) | key as u32,
        access: ALL,
        iova: 0,
        length: pages.len() as u64 * 4096,
        page_shift: 12,
        page_offset: 0,
        pages: pages.to_vec(),
    };
    SendWr::new(id, op, vec![])
}

/// A connected pair under a 64 KiB budget, and on node 1 a fast-registration MR of 32
/// pages with 32 pages of memory for it.
struct Setup {
    sim: Sim,
    q: rxe_core::Qpn,
    cq: u32,
    pd: u32,
    base: u64,
    pages: Vec<u64>,
    mr: u32,
}

fn setup() -> Setup {
    let mut sim = Sim::with_config(
        3,
        DeviceConfig {
            max_registered_bytes: BUDGET,
            ..Default::default()
        },
    );
    let ep = sim.connect(ConnOpts::default());
    let base = (sim.alloc(1, 40 * 4096) + 4095) & !4095;
    let pages = (0..32).map(|i| base + i * 4096).collect();
    let mr = sim.dev(1).alloc_mr(ep[1].pd, 32).unwrap();
    Setup {
        sim,
        q: ep[1].qpn,
        cq: ep[1].cq,
        pd: ep[1].pd,
        base,
        pages,
        mr,
    }
}

#[test]
fn fast_registration_is_charged_to_the_registered_bytes_budget() {
    let Setup {
        mut sim,
        q,
        cq,
        pages,
        mr,
        ..
    } = setup();
    assert_eq!(sim.dev(1).registered_bytes(), 0, "nothing mapped yet");

    // 32 pages (128 KiB) do not fit 64 KiB.
    sim.dev(1).post_send(q, reg_wr(1, mr, 1, &pages)).unwrap();
    sim.settle(100);
    assert_eq!(statuses(&sim.poll_all(1, cq)), [(1, WcStatus::LocQpOpErr)]);
    assert_eq!(sim.dev(1).registered_bytes(), 0);

    // A fresh pair (the QP above is in ERR): 12 pages fit and are charged.
    let Setup {
        mut sim,
        q,
        cq,
        pd,
        base,
        pages,
        mr,
    } = setup();
    sim.dev(1)
        .post_send(q, reg_wr(1, mr, 1, &pages[..12]))
        .unwrap();
    sim.settle(100);
    assert_eq!(statuses(&sim.poll_all(1, cq)), [(1, WcStatus::Success)]);
    assert_eq!(sim.dev(1).registered_bytes(), 12 * 4096);
    // What is left (16 KiB) is all a user MR can have now.
    assert!(sim
        .dev(1)
        .reg_mr(pd, base, 5 * 4096, ALL, contiguous(base))
        .is_err());
    let user = sim
        .dev(1)
        .reg_mr(pd, base, 4 * 4096, ALL, contiguous(base))
        .unwrap();
    assert_eq!(sim.dev(1).registered_bytes(), BUDGET);
    sim.dev(1).dereg_mr(user).unwrap();
    // Invalidated and mapped again, smaller: the charge follows the mapping.
    let inv = SendOp::LocalInv {
        rkey: (mr & !0xff) | 1,
    };
    sim.dev(1)
        .post_send(q, SendWr::new(2, inv, vec![]))
        .unwrap();
    sim.dev(1)
        .post_send(q, reg_wr(3, mr, 2, &pages[..2]))
        .unwrap();
    sim.settle(100);
    assert_eq!(
        statuses(&sim.poll_all(1, cq)),
        [(2, WcStatus::Success), (3, WcStatus::Success)]
    );
    assert_eq!(sim.dev(1).registered_bytes(), 2 * 4096);
    sim.dev(1).dereg_mr((mr & !0xff) | 2).unwrap();
    assert_eq!(sim.dev(1).registered_bytes(), 0, "DEREG returns it");
}

fn contiguous(base: u64) -> rxe_core::mem::Backing {
    rxe_core::mem::Backing::Contiguous { base }
}
