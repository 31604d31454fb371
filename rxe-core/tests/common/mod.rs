//! Code shared by integration tests; a test file that needs it says `mod common;`.

// Each test binary compiles this module on its own and uses a different part of it.
#![allow(dead_code)]

pub mod tshark;

use rxe_core::verbs::{Cqe, Sge, WcStatus};

/// A one-entry scatter list.
pub fn sge(addr: u64, len: impl TryInto<u32>, lkey: u32) -> Vec<Sge> {
    let length = len
        .try_into()
        .unwrap_or_else(|_| panic!("an SGE is at most 4 GiB"));
    vec![Sge { addr, length, lkey }]
}

/// Each completion's work request id and status.
pub fn statuses(c: &[Cqe]) -> Vec<(u64, WcStatus)> {
    c.iter().map(|c| (c.wr_id, c.status)).collect()
}
