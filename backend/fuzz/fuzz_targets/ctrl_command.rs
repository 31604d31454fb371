//! Control commands from a hostile guest: arbitrary request bytes (header + command) against a
//! device model over a small guest memory whose first page the input also fills (so page
//! lists and rings can point into it). Must never panic; every result is a status.
//!
//! `cargo fuzz run ctrl_command --sanitizer none` (from backend/fuzz).

#![no_main]

use libfuzzer_sys::fuzz_target;
use rxe_core::device::DeviceConfig;
use vhost_user_rdma::memory::guest_mem::GuestMemoryMmap;
use vhost_user_rdma::device::model::{Model, ModelConfig};
use vm_memory::{Bytes, GuestAddress};

fuzz_target!(|data: &[u8]| {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x1000), 0x10_0000)]).expect("mem");
    let mut m = Model::new(ModelConfig {
        dev: DeviceConfig {
            max_registered_bytes: 1 << 20,
            ..DeviceConfig::default()
        },
        max_page_list_bytes: 1 << 20,
        // Every registration path reachable, the DMA MR with remote rights included.
        allow_remote_dma_mr: true,
        ..ModelConfig::default()
    });
    // Byte 0: how many 16-byte units of input seed guest memory; the rest is a sequence of
    // requests, each prefixed by a one-byte length (in 8-byte units).
    let Some((&k, data)) = data.split_first() else {
        return;
    };
    let (seed, mut rest) = data.split_at(data.len().min(k as usize * 16));
    let _ = mem.write_slice(seed, GuestAddress(0x1000));
    while let Some((&n, tail)) = rest.split_first() {
        let n = (n as usize * 8).min(tail.len());
        let (req, t) = tail.split_at(n);
        let (h, body) = m.handle_ctrl(&mem, req, 4096);
        assert!(h.len as usize == body.len());
        rest = t;
    }
    m.pump(
        &mem,
        rxe_core::Instant(0),
        &mut vhost_user_rdma::transport::sink::FnSink::new(|_, _| {}),
    );
});
