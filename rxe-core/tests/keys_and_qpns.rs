//! L_Keys/R_Keys and QPNs an off-path sender cannot count to. With a seed (the daemon gives
//! each device its own) the key byte — the low 8 bits of every key — is drawn at random and
//! never repeats on the reuse of a key index, as rxe's `rxe_get_next_key()`; the first QPN is
//! drawn too. Without one the sequence is the fixed one tests and fuzz regressions rely on.

mod common;

use std::collections::BTreeSet;

use common::{sge, statuses};
use rxe_core::mem::Backing;
use rxe_core::sim::*;
use rxe_core::verbs::*;
use rxe_core::{Device, DeviceConfig, QpInit, VerbError};

fn device(seed: Option<u64>) -> Device {
    Device::new(DeviceConfig {
        seed,
        ..Default::default()
    })
}

fn user_mr(d: &mut Device, pd: u32) -> u32 {
    d.reg_mr(
        pd,
        0x1000,
        4096,
        Access::LOCAL_WRITE.union(Access::REMOTE),
        Backing::Contiguous { base: 0x1000 },
    )
    .unwrap()
}

fn first_qpn(d: &mut Device) -> u32 {
    let pd = d.alloc_pd().unwrap();
    let cq = d.create_cq(16).unwrap();
    d.create_qp(QpInit {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        xrcd: None,
        cap: ConnOpts::default().cap,
        sq_sig_all: false,
    })
    .unwrap()
    .0
}

#[test]
fn without_a_seed_keys_and_qpns_follow_the_fixed_sequence() {
    let mut d = device(None);
    let pd = d.alloc_pd().unwrap();
    assert_eq!(user_mr(&mut d, pd), 0x111);
    assert_eq!(user_mr(&mut d, pd), 0x211);
    assert_eq!(first_qpn(&mut d), 0x11);
}

#[test]
fn seeded_devices_draw_the_key_byte_and_the_first_qpn() {
    let mut first_keys = BTreeSet::new();
    let mut second_keys = BTreeSet::new();
    let mut qpns = BTreeSet::new();
    for seed in 0..64u64 {
        let mut d = device(Some(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        let pd = d.alloc_pd().unwrap();
        let k1 = user_mr(&mut d, pd);
        let k2 = user_mr(&mut d, pd);
        // The index stays in the high bits; only the key byte is drawn.
        assert_eq!((k1 >> 8, k2 >> 8), (1, 2));
        first_keys.insert(k1 & 0xff);
        second_keys.insert(k2 & 0xff);
        let q = first_qpn(&mut d);
        assert!((0x11..0x11 + 2 * 1024).contains(&q), "QPN {q:#x}");
        qpns.insert(q);
    }
    // 64 draws from 256 key bytes (2048 QPNs): a fixed sequence would give one value.
    assert!(
        first_keys.len() > 40,
        "{} distinct first keys",
        first_keys.len()
    );
    assert!(second_keys.len() > 40);
    assert!(qpns.len() > 56, "{} distinct first QPNs", qpns.len());
}

#[test]
fn a_reused_key_index_never_gets_its_last_key_byte_again() {
    let mut d = device(Some(7));
    let pd = d.alloc_pd().unwrap();
    let mut last = user_mr(&mut d, pd);
    let mut seen = BTreeSet::new();
    for _ in 0..2000 {
        d.dereg_mr(last).unwrap();
        let k = user_mr(&mut d, pd);
        assert_eq!(k >> 8, last >> 8, "the freed index is reused");
        assert_ne!(k, last, "a stale key must not match the new MR");
        seen.insert(k & 0xff);
        last = k;
    }
    assert!(seen.len() > 200, "{} key bytes in 2000 draws", seen.len());
}

/// Traffic between two seeded devices: random QPNs and keys change nothing on the wire.
#[test]
fn seeded_devices_talk_as_before() {
    let mut sim = Sim::with_config(
        5,
        DeviceConfig {
            seed: Some(0xfeed),
            ..Default::default()
        },
    );
    let ep = sim.connect(ConnOpts::default());
    assert_ne!(ep[0].qpn, ep[1].qpn, "each node draws its own");
    let (src, lkey) = sim.reg(0, ep[0].pd, 4096, Access::LOCAL_WRITE);
    let (dst, rkey) = sim.reg(1, ep[1].pd, 4096, Access::LOCAL_WRITE.union(Access::REMOTE));
    sim.nodes[0].mem.slice_mut(src, 4096).fill(0x5a);
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote_addr: dst,
            rkey,
        },
        sge(src, 4096u32, lkey),
    );
    sim.dev(0).post_send(ep[0].qpn, wr).unwrap();
    sim.settle(10_000);
    assert_eq!(
        statuses(&sim.poll_all(0, ep[0].cq)),
        [(1, WcStatus::Success)]
    );
    assert!(sim.nodes[1].mem.slice(dst, 4096).iter().all(|&b| b == 0x5a));
}

/// A DMA MR follows the rule every MR does (IBTA 10.6.3.1, ib_core's
/// `ib_check_mr_access()`): remote write or atomic without local write is invalid.
#[test]
fn a_dma_mr_with_remote_write_needs_local_write() {
    let mut d = device(None);
    let pd = d.alloc_pd().unwrap();
    for bad in [
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
        Access::REMOTE,
        Access(1 << 12),
    ] {
        assert_eq!(d.reg_dma_mr(pd, bad), Err(VerbError::Invalid), "{bad:?}");
    }
    d.reg_dma_mr(pd, Access::REMOTE_READ).unwrap();
    d.reg_dma_mr(pd, Access::LOCAL_WRITE.union(Access::REMOTE))
        .unwrap();
}
