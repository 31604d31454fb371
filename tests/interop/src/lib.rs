//! A host-side RoCEv2 peer: the rxe-core engine on a UDP socket, plus the out-of-band (TCP)
//! exchanges of the stock rdma-core example programs, so that unmodified `ibv_*_pingpong` in a
//! VM running Linux `rdma_rxe` can be the other end.

pub mod diff;
pub mod oob;
pub mod peer;
pub mod perftest;
pub mod pingpong;
pub mod udp;

/// The shared test fill (a position-keyed PRNG; see [`rxe_core::sim::prng_pattern`]): no two
/// segments of a buffer are alike, so a segment placed at the wrong offset, duplicated or
/// swapped shows in a byte check whatever the path MTU.
pub use rxe_core::sim::{prng_byte, prng_fill, prng_pattern};
