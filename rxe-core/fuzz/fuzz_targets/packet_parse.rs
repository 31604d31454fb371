//! Every parser that sees bytes from the network: `wire::Packet::new_checked` and all its
//! accessors on the raw input, and `frame::parse_headers` / `frame::parse_frame` at L2 and L3,
//! with the accessors again on any RoCE packet they return. Nothing may panic, and a frame that
//! parses must re-encapsulate to a frame that parses to the same header fields and packet.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rxe_core::wire::{frame, BthRepr, Packet};

fn exercise_packet(b: &[u8]) {
    let Ok(p) = Packet::new_checked(b) else {
        return;
    };
    let _ = (p.info(), p.opcode(), p.flags(), BthRepr::parse(&p.bth()));
    if let Some(x) = p.reth() {
        let _ = (x.va(), x.rkey(), x.dma_len());
    }
    if let Some(x) = p.aeth() {
        let _ = (x.syndrome(), x.syndrome_byte(), x.msn());
    }
    if let Some(x) = p.atomic_eth() {
        let _ = (x.va(), x.rkey(), x.swap_add(), x.compare());
    }
    if let Some(x) = p.atomic_ack_eth() {
        let _ = x.orig();
    }
    if let Some(x) = p.deth() {
        let _ = (x.qkey(), x.src_qp());
    }
    if let Some(x) = p.feth() {
        let _ = (x.selectivity(), x.placement_type());
    }
    let _ = (p.imm(), p.ieth(), p.icrc(), p.icrc_covered().len());
    assert_eq!(
        p.payload().len() + p.bth().pad_count() + p.info().hdr_len as usize + 4,
        b.len()
    );
}

fuzz_target!(|data: &[u8]| {
    exercise_packet(data);
    for l2 in [false, true] {
        if let Ok(raw) = frame::parse_headers(data, l2) {
            let _ = (
                raw.verify_icrc(),
                raw.ipv4_checksum_ok(),
                raw.udp_checksum_ok(),
            );
            assert!(raw.roce().len() >= 16);
        }
        if let Ok((meta, roce)) = frame::parse_frame(data, l2) {
            exercise_packet(roce);
            let mut out = vec![0u8; meta.header_len().unwrap() + roce.len()];
            let n = frame::build(&mut out, &meta, roce).unwrap();
            let (m2, r2) = frame::parse_frame(&out[..n], l2).unwrap();
            assert_eq!(m2, meta);
            // The ICRC may differ: `build` always sets DF and clears the reserved flag.
            assert_eq!(r2[..r2.len() - 4], roce[..roce.len() - 4]);
        }
    }
});
