//! The external oracle: Wireshark's InfiniBand/RoCEv2 dissector must decode every frame we build
//! with the opcode and header fields we meant.
//!
//! One frame of every opcode in the table (IPv4 and IPv6, in Ethernet; IPv4 also as raw IP) with
//! distinctive field values is written to a pcap and decoded by `tshark -T fields`; every
//! frame's BTH, RETH, AETH, AtomicETH, AtomicAckETH, DETH, ImmDt, IETH and ICRC as tshark shows
//! them are compared with what we emitted.
//!
//! When tshark is not installed the test prints `SKIP tshark_decode: tshark not installed` and
//! passes, unless `CI=true`, where it fails. Set `RXE_KEEP_PCAP=1` to keep the pcap files, and
//! `RXE_FUZZ_SEED_DIR=dir` to also write every frame to `dir` as a fuzzing seed.
//!
//! The checking code ([`tshark_check`]) is in `common/tshark.rs`: it takes any list of frames and
//! derives the expectations from our own parser, so `sim_tshark` runs the same check on
//! everything the two-node simulator sends.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use common::tshark::{tshark_check, tshark_version, TsharkReport, TSHARK_4_0_UNKNOWN};
use rxe_core::icrc;
use rxe_core::wire::frame::{self, FrameMeta};
use rxe_core::wire::{emit, BthRepr, ExtRepr, OpFlags, Opcode, Packet};

fn payload_len(op: Opcode) -> usize {
    let f = op.flags();
    if f.contains(OpFlags::ATOMIC_WRITE) {
        8
    } else if f.contains(OpFlags::PAYLOAD) {
        9 // pad count 3
    } else {
        0
    }
}

/// Distinctive values: every field differs between opcodes (index `i`), and wide fields have
/// bits set in every byte.
fn ext(i: u32) -> ExtRepr {
    ExtRepr {
        reth: (
            0x8877_6655_4433_2200 + i as u64,
            0xa1b2_c300 + i,
            0x0001_0200 + i,
        ),
        // Cycle through the syndrome classes: ACK, RNR NAK, NAK.
        aeth: ([0x1f, 0x2e, 0x60, 0x62][i as usize % 4], 0x00fe_dc00 + i),
        atomic: (
            0x0fed_cba9_8765_4300 + i as u64,
            0x5a5a_0000 + i,
            0x1122_3344_5566_7788 + i as u64,
            0x99aa_bbcc_ddee_ff00 + i as u64,
        ),
        atomic_orig: 0x0123_4567_89ab_cd00 + i as u64,
        deth: (0x8001_2300 + i, 0x00ab_cd00 + i),
        imm: 0xcafe_0000 + i,
        ieth: 0x7e7e_0000 + i,
        feth: (1, 1),
        xrc_srqn: 0x00ab_cd00 + i,
    }
}

fn bth(op: Opcode, i: u32) -> BthRepr {
    BthRepr {
        opcode: op,
        solicited: i % 2 == 1,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xffff - i as u16,
        fecn: false,
        becn: false,
        dest_qp: 0x00c0_0000 + (i << 8) + i,
        ack_req: i.is_multiple_of(3),
        psn: 0x00f0_0000 + (i << 12) + i,
    }
}

fn roce(op: Opcode, i: u32) -> Vec<u8> {
    let mut b = vec![0u8; 256];
    let (n, pr) = emit(&mut b, &bth(op, i), &ext(i), payload_len(op)).unwrap();
    for (k, x) in b[pr].iter_mut().enumerate() {
        *x = 0xd0 + k as u8;
    }
    b.truncate(n);
    b
}

/// One frame of every opcode: IPv4 or IPv6, with or without Ethernet.
pub fn every_opcode_frames(v6: bool, l2: bool) -> Vec<Vec<u8>> {
    Opcode::all()
        .enumerate()
        .map(|(i, op)| {
            let i = i as u32;
            let (s, d): (IpAddr, IpAddr) = if v6 {
                (
                    "fd00:ab::1".parse::<Ipv6Addr>().unwrap().into(),
                    "fd00:ab::2".parse::<Ipv6Addr>().unwrap().into(),
                )
            } else {
                (
                    Ipv4Addr::new(10, 9, 8, 1).into(),
                    Ipv4Addr::new(10, 9, 8, 2).into(),
                )
            };
            let mut m = FrameMeta::new(s, d, icrc::rc_udp_sport(0, 0x40 + i, 0x41));
            if l2 {
                m = m.with_eth([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
            }
            m.ipv4_id = i as u16;
            m.flow_label = i;
            let r = roce(op, i);
            let mut out = vec![0u8; m.header_len().unwrap() + r.len()];
            frame::build(&mut out, &m, &r).unwrap();
            out
        })
        .collect()
}

/// Writes every frame of the tshark check to `RXE_FUZZ_SEED_DIR`, one file each: the seeds of
/// the `packet_parse` fuzz target (see `fuzz/README.md`). A tool, not a check: run it with
/// `-- --ignored`.
#[test]
#[ignore = "writes fuzzing seeds; needs RXE_FUZZ_SEED_DIR"]
fn write_fuzz_seeds() {
    let dir = PathBuf::from(std::env::var_os("RXE_FUZZ_SEED_DIR").expect("RXE_FUZZ_SEED_DIR"));
    std::fs::create_dir_all(&dir).unwrap();
    for (tag, v6, l2) in [("eth-ipv4", false, true), ("raw-ipv6", true, false)] {
        for (k, f) in every_opcode_frames(v6, l2).iter().enumerate() {
            std::fs::write(dir.join(format!("{tag}-{k:02}")), f).unwrap();
        }
    }
}

#[test]
fn tshark_decodes_every_opcode() {
    let Some(version) = tshark_version() else {
        vur_testkit::skip("tshark_decode", "tshark not installed");
        return;
    };
    println!("tshark_decode: {version}");

    // Our side first: the frames carry the values we meant.
    for (i, (op, fr)) in Opcode::all()
        .zip(every_opcode_frames(false, true))
        .enumerate()
    {
        let (_, r) = frame::parse_frame(&fr, true).unwrap();
        let p = Packet::new_checked(r).unwrap();
        let b = bth(op, i as u32);
        assert_eq!((p.opcode(), p.bth().psn()), (op, b.psn));
        assert_eq!(p.bth().dest_qp(), b.dest_qp);
        let e = ext(i as u32);
        if let Some(x) = p.reth() {
            assert_eq!((x.va(), x.rkey(), x.dma_len()), e.reth);
        }
        if let Some(x) = p.atomic_eth() {
            assert_eq!((x.va(), x.rkey(), x.swap_add(), x.compare()), e.atomic);
        }
    }

    let n = Opcode::all().count();
    for (tag, v6, l2) in [
        ("eth-ipv4", false, true),
        ("eth-ipv6", true, true),
        ("raw-ipv4", false, false),
        ("raw-ipv6", true, false),
    ] {
        let frames = every_opcode_frames(v6, l2);
        let TsharkReport { full, bth_only, .. } =
            tshark_check(tag, &frames, l2).expect("tshark vanished");
        assert_eq!(full + bth_only.len(), n);
        for op in &bth_only {
            assert!(
                TSHARK_4_0_UNKNOWN.contains(op),
                "{tag}: tshark did not decode {:?}",
                Opcode(*op)
            );
        }
        println!(
            "tshark_decode {tag}: {full}/{n} opcodes fully decoded; BTH only: {:?}",
            bth_only.iter().map(|o| Opcode(*o)).collect::<Vec<_>>()
        );
    }
}
