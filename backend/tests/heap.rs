//! The counting allocator counts: live bytes and blocks follow allocations and frees.

use vhost_user_rdma::heap::{stats, Counting};

#[global_allocator]
static A: Counting = Counting;

#[test]
fn live_bytes_follow_allocations_and_frees() {
    let before = stats().expect("the counting allocator is installed");
    let v: Vec<u8> = Vec::with_capacity(1 << 20);
    let during = stats().unwrap();
    // other test threads may allocate too: the megabyte dominates
    assert!(
        during.live_bytes >= before.live_bytes + (1 << 20) - (64 << 10),
        "{before:?} {during:?}"
    );
    assert!(during.allocations > before.allocations);
    let mut v = std::hint::black_box(v);
    v.reserve_exact(2 << 20);
    let grown = stats().unwrap();
    assert!(
        grown.live_bytes >= before.live_bytes + (2 << 20) - (64 << 10),
        "{grown:?}"
    );
    drop(v);
    let after = stats().unwrap();
    assert!(
        after.live_bytes < before.live_bytes + (64 << 10),
        "{before:?} {after:?}"
    );
}
