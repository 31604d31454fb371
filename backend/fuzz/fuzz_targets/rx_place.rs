//! Received packets placed into guest memory: the rig (see `rig/mod.rs`) first posts real
//! traffic on every QP — SENDs into RQ and SRQ receives, WRITEs, READs and atomics into the
//! MRs, UC and UD SENDs — and pumps it onto its wire without delivering it. The input then
//! delivers those packets back with its mutations: bytes flipped anywhere (ICRC is the
//! transport's to check, so every header and payload field reaches the engine), a 32-bit field
//! overwritten (RETH address, key, length; AETH; PSN; QPN), cut short, duplicated, out of
//! order; and pumps, timers and CQ reads in between. The device may write only the MR that
//! grants local write and remote rights, the CQ rings and ring indices, never the read-only
//! MR, a ring slot, a page list or a page no object names; every work request completes at
//! most once, and all of them once their QPs are moved to the error state.
//!
//! `cargo fuzz run rx_place --sanitizer none` (from backend/fuzz), or tests/fuzz.sh.

#![no_main]

mod rig;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    rig::run_rx(data, 64);
});
