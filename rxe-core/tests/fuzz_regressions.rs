//! Crashes found by the `engine_rx` fuzz target (`fuzz/fuzz_targets/engine_rx.rs`), as plain
//! tests through the simulator. A reproducer of a bug that is not fixed yet is marked
//! `#[ignore]` with a comment saying where it panics; drop the `#[ignore]` with the fix.
//!
//! Both bugs below were arithmetic overflows on values the guest chooses in a fast-registration
//! (REG_MR) work request; they panicked where overflow checks are on (debug builds, tests, the
//! fuzz targets) and wrapped in release builds. Fixed in 725253b (`mem::check_page_list`).
//!
//! So these tests only mean something with overflow checks on: they run in the test profile
//! (`cargo test`, as `tests/run.sh` does), are reported as ignored in an optimised build
//! without debug assertions (`cargo test --release`), and fail if overflow checks are off in
//! a build that runs them.

use rxe_core::sim::*;
use rxe_core::verbs::*;

/// Overflow checks are on in this build (this test crate is built with the same profile
/// settings as rxe-core): an overflowing addition panics instead of wrapping. The probe runs
/// once, with the panic hook silenced so its panic does not show in a failure's output.
fn assert_overflow_checks_on() {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| {
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let x: u8 = std::hint::black_box(u8::MAX);
        let panicked = std::panic::catch_unwind(|| x + std::hint::black_box(1u8)).is_err();
        std::panic::set_hook(hook);
        panicked
    });
    assert!(
        on,
        "overflow checks are off in this build: these regression tests target overflow panics; \
         run them in the test profile (cargo test without --release)"
    );
}

/// A connected RC pair and a fast-reg MR (`alloc_mr`, 4 pages) on node 0; returns the
/// endpoints, the MR's lkey and a page-aligned page of node 0's memory.
fn setup() -> (Sim, [Endpoint; 2], u32, u64) {
    let mut sim = Sim::new(1);
    let ep = sim.connect(ConnOpts::default());
    let page = (sim.alloc(0, 8192) + 4095) & !4095;
    let mr = sim.dev(0).alloc_mr(ep[0].pd, 4).unwrap();
    (sim, ep, mr, page)
}

fn reg_mr(lkey: u32, iova: u64, length: u64, pages: Vec<u64>) -> SendOp {
    SendOp::RegMr {
        lkey,
        key: (lkey & !0xff) | 0x77,
        access: Access::LOCAL_WRITE.union(Access::REMOTE),
        iova,
        length,
        page_shift: 12,
        // Where `iova` falls in a page, as when the WQE carries no explicit offset.
        page_offset: iova & 0xfff,
        pages,
    }
}

/// Fuzz artifact `regmr-length-overflow.bin` (16 bytes, `38 38 38 34 fe 34 34 d0 38 38 c9 d0
/// 2b ff 38 29`), decoded: post LOCAL_INV of the setup's fast-reg MR on node 0 (so it is free
/// again), then post REG_MR of it with iova 0x5000_0a40, length `u64::MAX`, one page.
///
/// `req::local_op` checks the page count with `((iova & page_mask) + length).div_ceil(..)`
/// before it checks `iova.checked_add(length)`: the addition overflows when the iova is not
/// page-aligned and the length is close to `u64::MAX`. Panicked at `src/req.rs:230` ("attempt
/// to add with overflow") from `Device::poll_transmit` → `req::next_request` → `req::local_op`.
/// Expected: the WR completes with `LocQpOpErr` (as a length whose end overflows does in
/// release builds), like `Device::reg_mr`, which checks `iova.checked_add(length)` first.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs overflow checks: run in the test profile (without --release)"
)]
fn reg_mr_wr_with_huge_length_fails_cleanly() {
    assert_overflow_checks_on();
    let (mut sim, ep, mr, page) = setup();
    let op = reg_mr(mr, 0x5000_0a40, u64::MAX, vec![page]);
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, op, vec![]))
        .unwrap();
    sim.settle(100);
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::LocQpOpErr));
}

/// Same family, found by reading the code the fuzzer pointed at (see `fuzz/README.md`): a
/// REG_MR whose page address is not page-aligned and sits at the top of the address space
/// (`u64::MAX - 0xff`) is accepted; a remote WRITE through it then overflows in
/// `Region::for_each_extent` (`pa + in_page`, `src/mem.rs`), called from
/// `Device::handle_packet` → `resp::execute` → `Region::write`. Release builds wrap to a low
/// address. Expected: REG_MR refuses page addresses that are not aligned to the page size (or
/// whose page end overflows), or the translation fails with `OutOfRange`, which NAKs the WRITE
/// with a remote operational / access error.
#[test]
#[cfg_attr(
    not(debug_assertions),
    ignore = "needs overflow checks: run in the test profile (without --release)"
)]
fn write_through_a_page_at_the_top_of_memory_fails_cleanly() {
    assert_overflow_checks_on();
    let (mut sim, ep, mr, _) = setup();
    let key = (mr & !0xff) | 0x77;
    let op = reg_mr(mr, 0x5000_0000, 4096, vec![u64::MAX - 0xff]);
    sim.dev(0)
        .post_send(ep[0].qpn, SendWr::new(1, op, vec![]))
        .unwrap();
    sim.settle(100);
    // The REG_MR completes exactly once: refused as a local operation error (the fix in
    // check_page_list: the page is not aligned), or accepted — and then the WRITE through it
    // must fail cleanly below.
    let c = sim.poll_all(0, ep[0].cq);
    assert_eq!(c.len(), 1, "one completion for the REG_MR: {c:?}");
    assert_eq!(c[0].wr_id, 1);
    if c[0].status != WcStatus::Success {
        assert_eq!(c[0].status, WcStatus::LocQpOpErr, "{:?}", c[0]);
        // The MR stays invalid: a WRITE through its key is refused by the responder.
    }
    let (src, skey) = sim.reg(1, ep[1].pd, 64, Access::LOCAL_WRITE);
    sim.dev(1)
        .post_send(
            ep[1].qpn,
            SendWr::new(
                2,
                SendOp::Write {
                    remote_addr: 0x5000_0200,
                    rkey: key,
                },
                vec![Sge {
                    addr: src,
                    length: 64,
                    lkey: skey,
                }],
            ),
        )
        .unwrap();
    sim.settle(10_000);
    let c = sim.poll_all(1, ep[1].cq);
    assert_eq!(c.len(), 1);
    assert_ne!(c[0].status, WcStatus::Success);
}
