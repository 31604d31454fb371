//! A host-side RoCEv2 peer: the rxe-core engine on a UDP socket, plus the out-of-band (TCP)
//! exchanges of the stock rdma-core example programs, so that unmodified `ibv_*_pingpong` in a
//! VM running Linux `rdma_rxe` can be the other end.

pub mod diff;
pub mod oob;
pub mod peer;
pub mod perftest;
pub mod pingpong;
pub mod udp;

/// `len` bytes of a position-keyed PRNG (splitmix64 of `seed` and the 8-byte block index): no
/// two segments of a buffer are alike, so a segment placed at the wrong offset, duplicated or
/// swapped shows in a byte check whatever the path MTU.
pub fn prng_pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (splitmix64(seed ^ (i as u64 >> 3)) >> (8 * (i & 7))) as u8)
        .collect()
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
