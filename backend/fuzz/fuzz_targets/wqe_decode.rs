//! Send and receive WQE slots as a hostile guest writes them: decoding must never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_user_rdma::guest_mem::GuestMemoryMmap;
use vhost_user_rdma::ring::{decode_recv_wqe, decode_send_wqe, SqCaps};
use vm_memory::GuestAddress;

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x1000), 0x1_0000)]).expect("mem");
    let caps = SqCaps {
        max_sge: data.first().map_or(4, |b| (b & 0x3f) as u32),
        max_inline: 512,
        ud: data.get(1).is_some_and(|b| b & 1 == 1),
    };
    let _ = decode_send_wqe(data, caps, &|_| None, &mem);
    let _ = decode_recv_wqe(data, caps.max_sge);
});
