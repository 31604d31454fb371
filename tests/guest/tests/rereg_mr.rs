//! REREG_MR through the daemon (caps REREG_MR, `ibv_rereg_mr`): guest B changes an MR in
//! place while guest A holds its rkey from before. The keys stay; access taken away makes A's
//! WRITE fail with a remote access error and given back makes it work again; a new
//! translation puts A's bytes in the new pages and none in the old, and moves the MR's share
//! of the page-list budget; malformed and refused commands change nothing. Two daemons on
//! loopback UDP, two test guests.

mod common;

use common::{one, pair, status};
use rxe_core::verbs::*;
use vm_memory::ByteValued;
use vur_testguest::abi::{op, Status};
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
const LEN: usize = 0x1800;

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    rxe_core::sim::prng_pattern(seed.into(), n)
}

fn write_wr(id: u64, src: &Mr, mr: &Mr) -> SendWr {
    write_to(id, src, mr.iova, mr.rkey)
}

fn write_to(id: u64, src: &Mr, remote_addr: u64, rkey: u32) -> SendWr {
    let mut wr = SendWr::new(
        id,
        SendOp::Write { remote_addr, rkey },
        vec![src.sge(0, LEN as u32)],
    );
    wr.flags = SEND_SIGNALED;
    wr
}

/// REREG_MR of `mr`: `flags`, and with TRANS the pages of `to` (all of it, at its own IOVA).
fn rereg(g: &mut Guest, mr: &Mr, flags: u32, pd: u32, access: Access, to: Option<&Mr>) -> Status {
    let mut c = abi::CmdReregMr {
        lkey: mr.lkey,
        flags,
        pdn: pd,
        access: access.0,
        ..Default::default()
    };
    if let Some(t) = to {
        c.iova = t.iova;
        c.length = t.len as u64;
        c.pages = abi::PageListDesc {
            gpa: g.page_list(&t.buf.pages).unwrap(),
            num_pages: t.buf.pages.len() as u32,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        };
    }
    status(g, op::REREG_MR, c.as_slice())
}

fn page_list_bytes(d: &Daemon) -> u64 {
    json_u64(&d.counters().unwrap(), "device", "page_list_bytes").unwrap()
}

#[test]
fn rereg_keeps_the_keys_and_changes_access_and_translation() {
    use abi::rereg::{ACCESS, TRANS};
    let (mut a, mut b) = pair();
    assert_ne!(
        b.guest.config.caps & abi::caps::REREG_MR,
        0,
        "the device advertises REREG_MR"
    );
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let mr = b.guest.reg_mr(eb.pd, LEN, ALL).unwrap();
    let d1 = pattern(LEN, 1);
    src.write(0, &d1);
    a.guest.post_send(&ea.qp, &write_wr(1, &src, &mr)).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(mr.to_vec(0, LEN), d1);

    // Local write only: A's WRITE with the rkey it has is refused, nothing lands.
    let lw = Access::LOCAL_WRITE;
    assert_eq!(rereg(&mut b.guest, &mr, ACCESS, 0, lw, None), Status::Ok);
    src.write(0, &pattern(LEN, 2));
    a.guest.post_send(&ea.qp, &write_wr(2, &src, &mr)).unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!(w.status, WcStatus::RemAccessErr as u32, "{w:?}");
    assert_eq!(mr.to_vec(0, LEN), d1, "nothing written without the right");

    // A new translation with the rights back, in one command: same keys, new pages.
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    // the MR belongs to the first pair's PD: move it to the new pair's with the rest
    let to = b.guest.reg_mr(eb.pd, LEN, ALL).unwrap();
    let listed = page_list_bytes(&b.daemon);
    let flags = ACCESS | TRANS | abi::rereg::PD;
    assert_eq!(
        rereg(&mut b.guest, &mr, flags, eb.pd, ALL, Some(&to)),
        Status::Ok
    );
    assert_eq!(
        page_list_bytes(&b.daemon),
        listed,
        "the new list (as many pages) replaces the old one in the budget"
    );
    let d3 = pattern(LEN, 3);
    src.write(0, &d3);
    // the old rkey, at the new IOVA
    a.guest
        .post_send(&ea.qp, &write_to(3, &src, to.iova, mr.rkey))
        .unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!(w.status, 0, "{w:?}");
    assert_eq!(to.to_vec(0, LEN), d3, "the bytes are in the new pages");
    assert_eq!(mr.to_vec(0, LEN), d1, "and not in the old ones");
}

#[test]
fn malformed_and_refused_rereg_change_nothing() {
    use abi::rereg::{ACCESS, PD, TRANS};
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let mr = b.guest.reg_mr(eb.pd, LEN, ALL).unwrap();
    let lw = Access::LOCAL_WRITE;
    let cases: Vec<(&str, u32, u32, Access, Status)> = vec![
        ("no flag", 0, eb.pd, lw, Status::Invalid),
        ("an unknown flag", 1 << 3, eb.pd, lw, Status::Invalid),
        (
            "remote write without local",
            ACCESS,
            eb.pd,
            Access::REMOTE_WRITE,
            Status::Invalid,
        ),
        (
            "on-demand",
            ACCESS,
            eb.pd,
            Access(ALL.0 | abi::ACCESS_ON_DEMAND),
            Status::Invalid,
        ),
        (
            "a PD that does not exist",
            PD,
            eb.pd + 99,
            lw,
            Status::NotFound,
        ),
    ];
    for (what, flags, pd, access, want) in cases {
        assert_eq!(
            rereg(&mut b.guest, &mr, flags, pd, access, None),
            want,
            "{what}"
        );
    }
    // a translation whose list does not cover the length
    let short = b.guest.reg_mr(eb.pd, 0x800, ALL).unwrap();
    let mut c = abi::CmdReregMr {
        lkey: mr.lkey,
        flags: TRANS,
        iova: short.iova,
        length: LEN as u64,
        pages: abi::PageListDesc {
            gpa: b.guest.page_list(&short.buf.pages).unwrap(),
            num_pages: short.buf.pages.len() as u32,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        },
        ..Default::default()
    };
    let listed = page_list_bytes(&b.daemon);
    assert_eq!(
        status(&mut b.guest, op::REREG_MR, c.as_slice()),
        Status::Invalid
    );
    // a key that names nothing, with a well-formed translation
    c.lkey ^= 0xff;
    c.length = 0x800;
    assert_eq!(
        status(&mut b.guest, op::REREG_MR, c.as_slice()),
        Status::NotFound
    );
    assert_eq!(
        page_list_bytes(&b.daemon),
        listed,
        "a refused translation gives its list's bytes back"
    );
    // a short command
    assert_eq!(
        status(&mut b.guest, op::REREG_MR, &c.as_slice()[..40]),
        Status::BadRequest
    );
    // the MR is as it was: the rkey from before writes
    let d = pattern(LEN, 9);
    src.write(0, &d);
    a.guest.post_send(&ea.qp, &write_wr(1, &src, &mr)).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(mr.to_vec(0, LEN), d);
}
