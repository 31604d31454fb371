//! Code shared by integration tests; a test file that needs it says `mod common;`.

// Each test binary compiles this module on its own and uses a different part of it.
#![allow(dead_code)]

pub mod tshark;
