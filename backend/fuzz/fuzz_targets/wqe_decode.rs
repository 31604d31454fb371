//! Send and receive WQE slots as a hostile guest writes them: decoding must never panic.
//!
//! The input also chooses what a WQE can point at: guest memory (where REG_MR page lists are
//! read from) and a table of address handles (what a UD WQE's AH number resolves to), so the
//! paths behind the page-list resolution and the AH lookup see real data.
//!
//! Input layout:
//! - byte 0: the QP's max_sge (low 6 bits);
//! - byte 1: bit 0 set: a UD QP (the WQE carries a destination);
//! - byte 2: how many 16-byte units of the input after the header seed guest memory at its
//!   start (GPA 0x1000, 64 KiB);
//! - byte 3: how many address handles follow the memory seed (at most 8), each a 4-byte
//!   little-endian AH number and an 88-byte `rxe_av`;
//! - the rest: the WQE slot, decoded as a send WQE and as a receive WQE.
//!
//! `cargo fuzz run wqe_decode --sanitizer none` (from backend/fuzz).

#![no_main]

use libfuzzer_sys::fuzz_target;
use rxe_core::verbs::Av;
use vhost_user_rdma::abi;
use vhost_user_rdma::memory::guest_mem::GuestMemoryMmap;
use vhost_user_rdma::device::ring::{decode_av, decode_recv_wqe, decode_send_wqe, SqCaps};
use vm_memory::{Bytes, GuestAddress};

const MEM_BASE: u64 = 0x1000;
const MEM_SIZE: usize = 0x1_0000;
const AH_LEN: usize = 4 + abi::av::SIZE;

fuzz_target!(|data: &[u8]| {
    let Some((hdr, rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let caps = SqCaps {
        max_sge: (hdr[0] & 0x3f) as u32,
        max_inline: 512,
        ud: hdr[1] & 1 == 1,
        xrc: hdr[1] & 2 == 2,
    };
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(MEM_BASE), MEM_SIZE)]).expect("mem");
    let (seed, rest) = rest.split_at(rest.len().min(hdr[2] as usize * 16));
    mem.write_slice(seed, GuestAddress(MEM_BASE))
        .expect("the seed fits guest memory");
    let n_ah = (hdr[3] as usize).min(8).min(rest.len() / AH_LEN);
    let (ahs, slot) = rest.split_at(n_ah * AH_LEN);
    let table: Vec<(u32, Av)> = ahs
        .chunks_exact(AH_LEN)
        .map(|c| {
            let num = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            (num, decode_av(c, 4))
        })
        .collect();
    let lookup = |num: u32| table.iter().find(|(n, _)| *n == num).map(|(_, av)| *av);
    let _ = decode_send_wqe(slot, caps, &lookup, &mem);
    let _ = decode_recv_wqe(slot, caps.max_sge);
});
