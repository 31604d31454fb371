//! The caps on the page lists the device keeps (docs/virtio-rdma.md §5.1): a per-device
//! budget (`--max-page-list-bytes`) that commands beyond it meet with NO_MEMORY and REG_MR
//! work requests with a local error, and a per-QP cap on REG_MR lists held for WQEs not yet
//! executed, beyond which a REG_MR waits in its ring. Memory comes back on DEREG/DESTROY; the
//! counters socket shows it (`device.page_list_bytes`).

mod common;

use std::time::Duration;

use common::{bin, one_within, repeated_list};
use rxe_core::verbs::*;
use vm_memory::ByteValued;
use vur_testguest::abi::{op, Status};
use vur_testguest::*;

const T: Duration = Duration::from_secs(20);
const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
const MIB: u64 = 1 << 20;

fn counter(n: &Node, key: &str) -> u64 {
    let json = n.daemon.counters().expect("counters");
    json_u64(&json, "device", key).unwrap_or_else(|| panic!("no device.{key} in {json}"))
}

fn no_memory<T>(r: Result<T>) -> bool {
    matches!(r, Err(Error::Status(Status::NoMemory)))
}

/// The cap is stated in the config space; commands beyond it are NO_MEMORY whatever they
/// create (a fast-registration MR's reservation, a CQ ring, a user MR); every byte comes back
/// on DEREG_MR and DESTROY_*.
#[test]
fn commands_beyond_the_device_cap_get_no_memory_and_destroy_returns_it() {
    let (addr, _) = loopback_pair(4791);
    let mut n = Node::start(bin(), addr, &["--max-page-list-bytes", "1M"]).unwrap();
    let c = n.guest.config;
    assert_eq!(
        (c.log2_max_page_list_bytes, c.log2_max_qp_reg_mr_list_bytes),
        (20, 23)
    );
    assert_eq!(counter(&n, "page_list_cap"), MIB);
    assert_eq!(counter(&n, "page_list_bytes"), 0);
    let g = &mut n.guest;
    let pd = g.alloc_pd().unwrap();
    // ALLOC_MR reserves max_num_sg × 8 bytes: two halves fill the budget exactly.
    let m1 = g.alloc_mr(pd, 1 << 16).unwrap();
    let m2 = g.alloc_mr(pd, 1 << 16).unwrap();
    assert_eq!(counter(&n, "page_list_bytes"), MIB);
    let g = &mut n.guest;
    assert!(no_memory(g.alloc_mr(pd, 1)));
    assert!(no_memory(g.create_cq(15)));
    assert!(no_memory(g.reg_mr(pd, 4096, ALL)));
    // Out of range is still INVALID, not NO_MEMORY.
    for bad in [0, (1 << 20) + 1] {
        assert!(matches!(
            g.alloc_mr(pd, bad),
            Err(Error::Status(Status::Invalid))
        ));
    }
    g.cmd(
        op::DEREG_MR,
        abi::Handle {
            handle: m1,
            reserved: 0,
        }
        .as_slice(),
    )
    .unwrap();
    assert_eq!(counter(&n, "page_list_bytes"), MIB / 2);

    // Rings and user MRs: 8 bytes a page.
    let g = &mut n.guest;
    let cq = g.create_cq(255).unwrap(); // 384 + 256 × 64 bytes: 5 pages
    let mr = g.reg_mr(pd, 10 * 4096 - 1, ALL).unwrap(); // 10 pages
    let srq = g.create_srq(pd, 63, 2, 0).unwrap();
    let qp = g
        .create_qp(QpType::Rc, pd, &cq, &cq, None, ConnOpts::default().cap)
        .unwrap();
    let with_all = counter(&n, "page_list_bytes");
    assert!(
        with_all >= MIB / 2 + (5 + 10) * 8 + 8 + 2 * 8,
        "CQ, MR, SRQ and QP rings: {with_all}"
    );
    // A user MR one page bigger than what is left does not fit; one that takes all of it
    // does (pages named many times over: the list is what counts).
    let left = MIB - with_all;
    let g = &mut n.guest;
    let page = g.alloc_buf(4096).unwrap();
    let reg = |g: &mut Guest, pages: u64| {
        let c = abi::CmdRegUserMr {
            pdn: pd,
            access: ALL.0,
            iova: 0x10_0000_0000,
            length: pages * 4096,
            pages: repeated_list(g, page.pages[0], pages as u32),
            page_offset: 0,
            reserved: 0,
        };
        g.cmd(op::REG_USER_MR, c.as_slice())
            .map(|r| u32::from_le_bytes(r[..4].try_into().unwrap()))
    };
    assert!(no_memory(reg(g, left / 8 + 1)));
    assert_eq!(counter(&n, "page_list_bytes"), with_all, "nothing kept");
    let g = &mut n.guest;
    let big = reg(g, left / 8).unwrap();
    assert_eq!(counter(&n, "page_list_bytes"), MIB);

    // Everything back.
    let g = &mut n.guest;
    g.cmd(
        op::DEREG_MR,
        abi::Handle {
            handle: big,
            reserved: 0,
        }
        .as_slice(),
    )
    .unwrap();
    g.dereg_mr(mr).unwrap();
    g.destroy_qp(qp).unwrap();
    g.destroy_srq(srq).unwrap();
    g.destroy_cq(cq).unwrap();
    g.cmd(
        op::DEREG_MR,
        abi::Handle {
            handle: m2,
            reserved: 0,
        }
        .as_slice(),
    )
    .unwrap();
    assert_eq!(counter(&n, "page_list_bytes"), 0);
}

/// RESIZE_CQ charges the new ring before it moves and returns the old one's bytes after; a
/// new ring beyond the cap is NO_MEMORY and the old ring stays in use.
#[test]
fn resize_cq_swaps_ring_lists_under_the_cap() {
    let (addr, _) = loopback_pair(4791);
    let mut n = Node::start(bin(), addr, &["--max-page-list-bytes", "64K"]).unwrap();
    let g = &mut n.guest;
    let mut cq = g.create_cq(15).unwrap(); // one page
    assert_eq!(counter(&n, "page_list_bytes"), 8);
    let g = &mut n.guest;
    g.resize_cq(&mut cq, 1023).unwrap(); // 384 + 1024 × 64: 17 pages
    assert_eq!(counter(&n, "page_list_bytes"), 17 * 8);
    // Fill the rest with a fast-registration reservation, then grow: NO_MEMORY.
    let g = &mut n.guest;
    let pd = g.alloc_pd().unwrap();
    g.alloc_mr(pd, (64 * 1024 - 17 * 8) / 8).unwrap();
    assert!(no_memory(g.resize_cq(&mut cq, 2047)));
    assert_eq!(counter(&n, "page_list_bytes"), 64 * 1024);
    // Shrinking needs the new ring's bytes too, before the old ones come back.
    let g = &mut n.guest;
    assert!(no_memory(g.resize_cq(&mut cq, 15)));
    g.destroy_cq(cq).unwrap();
    assert_eq!(counter(&n, "page_list_bytes"), 64 * 1024 - 17 * 8);
}

/// A REG_MR whose page list does not fit in what is left of the device's budget completes
/// with LOC_QP_OP_ERR (the QP moves to ERR, as for any bad WQE) and keeps nothing; one that
/// fits works, and its list lives in the MR's reservation afterwards.
#[test]
fn reg_mr_beyond_the_device_cap_is_a_local_error() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).unwrap();
    let mut b = Node::start(bin(), ba, &["--max-page-list-bytes", "1M"]).unwrap();
    let (_ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let lkey = b.guest.alloc_mr(eb.pd, 1 << 16).unwrap(); // 512 KiB reserved
    let target = b.guest.alloc_buf(2 * 4096).unwrap();
    let key = (lkey & !0xff) | 0x31;
    b.guest
        .post_reg_mr(&eb.qp, 1, lkey, key, ALL, 0x9000, 8192, &target.pages, None)
        .unwrap();
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!((w.wr_id, w.status), (1, 0), "{w:?}");
    let used = counter(&b, "page_list_bytes");
    // Leave less than 512 KiB: a REG_MR of 2^16 pages cannot be held.
    let g = &mut b.guest;
    let filler = (MIB - used - 100 * 1024) / 8;
    g.alloc_mr(eb.pd, filler as u32).unwrap();
    let before = counter(&b, "page_list_bytes");
    let bad_before = counter(&b, "bad_wqes");
    let mut inv = SendWr::new(2, SendOp::LocalInv { rkey: key }, vec![]);
    inv.flags = SEND_SIGNALED;
    let g = &mut b.guest;
    g.post_send(&eb.qp, &inv).unwrap();
    assert_eq!(one(g, &eb.cq).status, 0);
    let list = repeated_list(g, target.pages[0], 1 << 16);
    let slot = reg_mr_slot(&eb.qp, 3, key, key + 1, ALL, 0, 4096, &list, None).unwrap();
    g.post_raw_send_slot(&eb.qp, &slot).unwrap();
    let w = one(g, &eb.cq);
    assert_eq!(
        (w.wr_id, w.status, w.opcode),
        (3, WcStatus::LocQpOpErr as u32, WcOpcode::RegMr as u32),
        "{w:?}"
    );
    assert_eq!(counter(&b, "bad_wqes"), bad_before + 1);
    assert_eq!(counter(&b, "page_list_bytes"), before, "nothing held");
    let q = b.guest.query_qp(&eb.qp).unwrap();
    assert_eq!(q.qp_state, QpState::Err as u32);
}

/// Two REG_MRs of 2^20 pages (8 MiB of list each: the per-QP cap) posted with one doorbell:
/// the first is taken, the second waits in the ring until the first has executed, then both
/// complete. Afterwards the budget holds only the rings and the two reservations.
#[test]
fn reg_mr_lists_beyond_the_qp_cap_wait_then_complete() {
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(bin(), aa, &[]).unwrap();
    let mut b = Node::start(bin(), ba, &[]).unwrap();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let g = &mut b.guest;
    let m1 = g.alloc_mr(eb.pd, 1 << 20).unwrap();
    let m2 = g.alloc_mr(eb.pd, 1 << 20).unwrap();
    let target = g.alloc_buf(4096).unwrap();
    let list = repeated_list(g, target.pages[0], 1 << 20);
    let baseline = counter(&b, "page_list_bytes");
    let waits = counter(&b, "reg_mr_waits");
    let g = &mut b.guest;
    let (k1, k2) = ((m1 & !0xff) | 0x41, (m2 & !0xff) | 0x42);
    let s1 = reg_mr_slot(&eb.qp, 1, m1, k1, ALL, 0x1_0000, 4096, &list, None).unwrap();
    let s2 = reg_mr_slot(&eb.qp, 2, m2, k2, ALL, 0x2_0000, 4096, &list, None).unwrap();
    g.write_send_slot(&eb.qp, &s1).unwrap();
    let prod = g.write_send_slot(&eb.qp, &s2).unwrap();
    g.doorbell(abi::doorbell::SQ, eb.qp.qpn, prod).unwrap();
    let w = g.wait_cq(&eb.cq, 2, T);
    let got: Vec<(u64, u32)> = w.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, vec![(1, 0), (2, 0)]);
    assert!(
        counter(&b, "reg_mr_waits") > waits,
        "the second REG_MR waited"
    );
    assert_eq!(
        counter(&b, "page_list_bytes"),
        baseline,
        "no list held any more"
    );
    // The second registration maps what it should.
    let src = a.guest.reg_mr(ea.pd, 64, ALL).unwrap();
    src.write(0, &[0x6b; 64]);
    let mut wr = SendWr::new(
        9,
        SendOp::Write {
            remote_addr: 0x2_0000 + 100,
            rkey: k2,
        },
        vec![src.sge(0, 64)],
    );
    wr.flags = SEND_SIGNALED;
    a.guest.post_send(&ea.qp, &wr).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(target.to_vec(100, 64), [0x6b; 64]);
}

/// The next completion of `cq`, within this file's longer [`T`].
fn one(g: &mut Guest, cq: &Cq) -> Wc {
    one_within(g, cq, T)
}
