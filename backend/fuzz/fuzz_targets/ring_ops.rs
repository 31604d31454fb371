//! The guest's rings under a hostile guest: work requests posted on RC, UC and UD QPs (one
//! on an SRQ), doorbells for any object or none, pumps with small and large budgets, the
//! model's packets looped back into it dropped, duplicated, reordered, corrupted or cut,
//! timers, CQs consumed, armed and resized with live entries, QPs moved between states or
//! destroyed and re-created, and the guest writing over rings, page lists and MRs while the
//! device runs. After every operation the rig checks where the device wrote, the limits and
//! the work done; at the end, exactly-once completion and a page-list budget back at zero
//! (see `rig/mod.rs`).
//!
//! Input: a sequence of operations, each an opcode byte, an argument byte and what that
//! operation reads (`Rig::step`); at most 64 per run.
//!
//! `cargo fuzz run ring_ops --sanitizer none` (from backend/fuzz), or tests/fuzz.sh.

#![no_main]

mod rig;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rig::run(data, 64);
});
