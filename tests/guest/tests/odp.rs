//! On-demand-paging MRs through the daemon (caps ODP, docs/virtio-rdma.md §5.10): guest B
//! registers an MR with `IBV_ACCESS_ON_DEMAND` and no page list, and answers the device's
//! PAGE_FAULT events as its driver would, with UPDATE_ODP. Two daemons on loopback UDP, two
//! test guests; every byte checked.

mod common;

use std::time::{Duration, Instant};

use common::{pair, status};
use rxe_core::verbs::*;
use vm_memory::ByteValued;
use vur_testguest::abi::{op, Status};
use vur_testguest::error::Error;
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
/// Where the MR starts in its buffer, and its length: four pages of table.
const OFF: usize = 0x234;
const LEN: usize = 0x3000;

/// An ODP MR over `buf[OFF .. OFF+LEN]`: its key; the command carries no page list.
fn reg_odp(g: &mut Guest, pd: u32, buf: &ram::VaMap) -> std::result::Result<u32, Status> {
    let c = abi::CmdRegUserMr {
        pdn: pd,
        access: ALL.0 | abi::ACCESS_ON_DEMAND,
        iova: buf.addr() + OFF as u64,
        length: LEN as u64,
        pages: abi::PageListDesc::default(),
        page_offset: OFF as u32,
        reserved: 0,
    };
    match g.cmd(op::REG_USER_MR, c.as_slice()) {
        Ok(b) => Ok(abi::read_struct::<abi::RespMr>(&b).unwrap().lkey),
        Err(Error::Status(s)) => Err(s),
        Err(e) => panic!("transport error {e:?}"),
    }
}

fn update(g: &mut Guest, lkey: u32, flags: u32, first: u64, entries: &[u64]) -> Status {
    let pages = if entries.is_empty() {
        abi::PageListDesc::default()
    } else {
        abi::PageListDesc {
            gpa: g.page_list(entries).unwrap(),
            num_pages: entries.len() as u32,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        }
    };
    let c = abi::CmdUpdateOdp {
        lkey,
        flags,
        first_page: first,
        count: if entries.is_empty() {
            4
        } else {
            entries.len() as u64
        },
        pages,
    };
    status(g, op::UPDATE_ODP, c.as_slice())
}

/// Guest B's driver: answers each PAGE_FAULT by mapping the page (writable for a write
/// fault) while guest A waits for `n` completions. Returns A's completions and the faults.
fn serve_faults(
    a: &mut Guest,
    acq: &Cq,
    b: &mut Guest,
    key: u32,
    buf: &ram::VaMap,
) -> (Vec<Wc>, Vec<abi::Event>) {
    let end = Instant::now() + Duration::from_secs(20);
    let (mut done, mut faults) = (Vec::new(), Vec::new());
    while done.is_empty() {
        assert!(
            Instant::now() < end,
            "no completion; faults so far {faults:?}"
        );
        for e in b.poll_events() {
            if e.kind != abi::event::KIND_PAGE_FAULT {
                continue;
            }
            assert_eq!(e.object, key);
            let write = e.event & abi::odp::FAULT_WRITE != 0;
            let flags = if write { abi::odp::WRITABLE } else { 0 };
            let page = buf.pages[e.reserved as usize];
            assert_eq!(
                update(b, key, flags, e.reserved.into(), &[page]),
                Status::Ok
            );
            faults.push(e);
        }
        done = a.wait_cq(acq, 1, Duration::from_millis(5));
    }
    (done, faults)
}

fn rdma(wr_id: u64, op: SendOp, sge: Sge) -> SendWr {
    let mut wr = SendWr::new(wr_id, op, vec![sge]);
    wr.flags = SEND_SIGNALED;
    wr
}

#[test]
fn write_and_read_through_pages_the_driver_maps_on_demand() {
    let (mut a, mut b) = pair();
    assert_ne!(
        b.guest.config.caps & abi::caps::ODP,
        0,
        "the device advertises ODP"
    );
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let buf = b.guest.alloc_buf(OFF + LEN).unwrap();
    let key = reg_odp(&mut b.guest, eb.pd, &buf).unwrap();
    let iova = buf.addr() + OFF as u64;
    let src = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let data = rxe_core::sim::prng_pattern(7, LEN);
    src.write(0, &data);

    // WRITE into an MR with no page mapped: every page is asked for, as a write.
    let wr = rdma(
        1,
        SendOp::Write {
            remote_addr: iova,
            rkey: key,
        },
        src.sge(0, LEN as u32),
    );
    a.guest.post_send(&ea.qp, &wr).unwrap();
    let (w, faults) = serve_faults(&mut a.guest, &ea.cq, &mut b.guest, key, &buf);
    assert_eq!((w[0].wr_id, w[0].status), (1, 0), "{w:?}");
    assert_eq!(buf.to_vec(OFF, LEN), data);
    let mut pages: Vec<u32> = faults.iter().map(|e| e.reserved).collect();
    pages.sort();
    pages.dedup();
    assert_eq!(pages, [0, 1, 2, 3]);
    assert!(faults.iter().all(|e| e.event & abi::odp::FAULT_WRITE != 0));

    // The driver takes the pages back (an invalidation): a READ asks for them again.
    assert_eq!(
        update(&mut b.guest, key, abi::odp::UNMAP, 0, &[]),
        Status::Ok
    );
    let dst = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let wr = rdma(
        2,
        SendOp::Read {
            remote_addr: iova,
            rkey: key,
        },
        dst.sge(0, LEN as u32),
    );
    a.guest.post_send(&ea.qp, &wr).unwrap();
    let (w, faults) = serve_faults(&mut a.guest, &ea.cq, &mut b.guest, key, &buf);
    assert_eq!((w[0].wr_id, w[0].status), (2, 0), "{w:?}");
    assert_eq!(dst.to_vec(0, LEN), data);
    // (A write fault of the WRITE's retransmissions may still arrive now: a driver maps
    // an already-mapped page again, which is harmless.)
    assert!(faults.iter().any(|e| e.event & abi::odp::FAULT_WRITE == 0));

    // A page the driver could not map fails the access instead of waiting.
    assert_eq!(
        update(&mut b.guest, key, abi::odp::FAILED, 0, &[]),
        Status::Ok
    );
    let wr = rdma(
        3,
        SendOp::Write {
            remote_addr: iova,
            rkey: key,
        },
        src.sge(0, 16),
    );
    a.guest.post_send(&ea.qp, &wr).unwrap();
    let w = common::one(&mut a.guest, &ea.cq);
    assert_eq!(w.wr_id, 3);
    assert_ne!(w.status, 0, "a failed page is an error, not a wait: {w:?}");
    let c = b.daemon.counters().unwrap();
    let faults = daemon::json_u64(&c, "port", "odp_faults").unwrap();
    let updates = daemon::json_u64(&c, "device", "odp_updates").unwrap();
    assert!(faults >= 8 && updates >= 8, "{faults} {updates}");
}

/// What REG_USER_MR (on demand) and UPDATE_ODP refuse, changing nothing.
#[test]
fn odp_commands_refuse_bad_input() {
    let (_a, mut b) = pair();
    let g = &mut b.guest;
    let pd = g.alloc_pd().unwrap();
    let buf = g.alloc_buf(OFF + LEN).unwrap();
    let key = reg_odp(g, pd, &buf).unwrap();
    let plain = g.reg_mr(pd, 4096, ALL).unwrap();
    let p = buf.pages[0];
    // A page list with an on-demand registration.
    let mut c = abi::CmdRegUserMr {
        pdn: pd,
        access: ALL.0 | abi::ACCESS_ON_DEMAND,
        iova: 0x1000,
        length: 4096,
        pages: abi::PageListDesc {
            gpa: g.page_list(&[p]).unwrap(),
            num_pages: 1,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        },
        page_offset: 0,
        reserved: 0,
    };
    assert_eq!(status(g, op::REG_USER_MR, c.as_slice()), Status::Invalid);
    c.pages = abi::PageListDesc::default();
    c.page_offset = 4096;
    assert_eq!(status(g, op::REG_USER_MR, c.as_slice()), Status::Invalid);
    // UPDATE_ODP: an unknown key, an MR that is not on demand, past the table, bad flags,
    // pages not aligned or outside guest memory, a short command.
    let w = abi::odp::WRITABLE;
    assert_eq!(update(g, key ^ 0x100, 0, 0, &[p]), Status::NotFound);
    assert_eq!(update(g, plain.lkey, 0, 0, &[p]), Status::NotFound);
    assert_eq!(update(g, key, 0, 4, &[p]), Status::Invalid);
    assert_eq!(update(g, key, 0, 3, &[p, p]), Status::Invalid);
    assert_eq!(update(g, key, 8, 0, &[p]), Status::Invalid);
    assert_eq!(
        update(g, key, abi::odp::UNMAP | abi::odp::FAILED, 0, &[]),
        Status::Invalid
    );
    assert_eq!(update(g, key, abi::odp::UNMAP | w, 0, &[]), Status::Invalid);
    assert_eq!(update(g, key, abi::odp::UNMAP, 0, &[p]), Status::Invalid);
    assert_eq!(update(g, key, w, 0, &[p | 1]), Status::Invalid);
    assert_eq!(update(g, key, w, 0, &[p | 0x800]), Status::Invalid);
    assert_eq!(update(g, key, w, 0, &[1 << 50]), Status::BadAddress);
    assert_eq!(status(g, op::UPDATE_ODP, &[0u8; 39]), Status::BadRequest);
    // And the good ones.
    assert_eq!(update(g, key, w, 3, &[p]), Status::Ok);
    assert_eq!(update(g, key, 0, 2, &[p]), Status::Ok);
    assert_eq!(update(g, key, abi::odp::UNMAP, 0, &[]), Status::Ok);
    g.dereg_mr(plain).unwrap();
    let h = abi::Handle {
        handle: key,
        reserved: 0,
    };
    assert_eq!(status(g, op::DEREG_MR, h.as_slice()), Status::Ok);
}

/// An implicit ODP MR (caps IMPLICIT_ODP): IOVA 0, length u64::MAX, the whole address space.
/// Guest A WRITEs at a high address; each PAGE_FAULT names the page with its bits above 32 in
/// `event` (bits 8..31); guest B maps it from its buffer. The table's entries count against
/// the page-list budget as they are mapped, and go back when they are unmapped.
#[test]
fn an_implicit_mr_maps_pages_anywhere_and_counts_them() {
    let (mut a, mut b) = pair();
    assert_ne!(b.guest.config.caps & abi::caps::IMPLICIT_ODP, 0);
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let c = abi::CmdRegUserMr {
        pdn: eb.pd,
        access: ALL.0 | abi::ACCESS_ON_DEMAND,
        iova: 0,
        length: u64::MAX,
        ..Default::default()
    };
    let key = abi::read_struct::<abi::RespMr>(&b.guest.cmd(op::REG_USER_MR, c.as_slice()).unwrap())
        .unwrap()
        .lkey;
    let listed = |b: &Node| {
        daemon::json_u64(&b.daemon.counters().unwrap(), "device", "page_list_bytes").unwrap()
    };
    let base = listed(&b);
    // two pages at 2^44 + 0xf00: the first page number has bits above 32
    let va: u64 = (1 << 44) + 0xf00;
    let buf = b.guest.alloc_buf(2 * 4096).unwrap();
    let src = a.guest.reg_mr(ea.pd, 512, ALL).unwrap();
    let data = rxe_core::sim::prng_pattern(9, 512);
    src.write(0, &data);
    let wr = rdma(
        1,
        SendOp::Write {
            remote_addr: va,
            rkey: key,
        },
        src.sge(0, 512),
    );
    a.guest.post_send(&ea.qp, &wr).unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let mut pages = Vec::new();
    let mut done = Vec::new();
    while done.is_empty() {
        assert!(
            Instant::now() < end,
            "no completion; pages asked for {pages:?}"
        );
        for e in b.guest.poll_events() {
            if e.kind != abi::event::KIND_PAGE_FAULT {
                continue;
            }
            assert_eq!(e.object, key);
            let page =
                u64::from(e.reserved) | u64::from(e.event >> abi::odp::FAULT_PAGE_HI_SHIFT) << 32;
            let i = (page - (va >> 12)) as usize;
            assert!(i < 2, "page {page:#x} is not one of the WRITE's");
            let st = update(&mut b.guest, key, abi::odp::WRITABLE, page, &[buf.pages[i]]);
            assert_eq!(st, Status::Ok);
            pages.push(page);
        }
        done = a.guest.wait_cq(&ea.cq, 1, Duration::from_millis(5));
    }
    assert_eq!((done[0].wr_id, done[0].status), (1, 0), "{done:?}");
    pages.sort();
    pages.dedup();
    assert_eq!(pages, [va >> 12, (va >> 12) + 1]);
    assert_eq!(buf.to_vec(0xf00, 256), &data[..256]);
    assert_eq!(buf.to_vec(4096, 256), &data[256..]);
    assert_eq!(listed(&b), base + 16, "two entries");
    // unmapping gives their bytes back; so does DEREG_MR for what is left
    let unmap_one = abi::CmdUpdateOdp {
        lkey: key,
        flags: abi::odp::UNMAP,
        first_page: va >> 12,
        count: 1,
        pages: abi::PageListDesc::default(),
    };
    assert_eq!(
        status(&mut b.guest, op::UPDATE_ODP, unmap_one.as_slice()),
        Status::Ok
    );
    assert_eq!(listed(&b), base + 8, "one entry left");
    let h = abi::Handle {
        handle: key,
        reserved: 0,
    };
    b.guest.cmd(op::DEREG_MR, h.as_slice()).unwrap();
    assert_eq!(listed(&b), base);
}
