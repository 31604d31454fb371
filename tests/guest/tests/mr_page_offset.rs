//! MRs whose IOVA is not congruent to their buffer (`ibv_reg_mr_iova`), through the daemon:
//! RegUserMr's `page_offset` and the REG_MR work request's PAGE_OFFSET flag say where the
//! first byte lies in the first page, so IOVA 0x1000_0123 can name a buffer that starts 0x456
//! bytes into its page. Two daemons on loopback UDP, two test guests.

mod common;

use common::{one, pair};
use rxe_core::verbs::*;
use vm_memory::ByteValued;
use vur_testguest::abi::{op, Status};
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);
const IOVA: u64 = 0x1000_0123;
const OFF: usize = 0x456;
/// 0x456 + 0x2000 bytes: three pages.
const LEN: usize = 0x2000;

/// The shared PRNG fill: a page or segment at the wrong offset cannot compare equal.
fn pattern(n: usize, seed: u8) -> Vec<u8> {
    rxe_core::sim::prng_pattern(seed.into(), n)
}

/// Builds the operation of an RDMA work request from (remote address, rkey).
type RdmaOp = fn(u64, u32) -> SendOp;

fn rdma(wr_id: u64, op: RdmaOp, sge: Sge, remote: u64, rkey: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, op(remote, rkey), vec![sge]);
    wr.flags = SEND_SIGNALED;
    wr
}

fn write(remote_addr: u64, rkey: u32) -> SendOp {
    SendOp::Write { remote_addr, rkey }
}

fn read(remote_addr: u64, rkey: u32) -> SendOp {
    SendOp::Read { remote_addr, rkey }
}

/// Marks the bytes just outside the MR in its buffer, to see that nothing touches them.
fn fence_posts(mr: &Mr) {
    mr.buf.write(mr.offset - 1, &[0x5a]);
    mr.buf.write(mr.offset + mr.len, &[0x5a]);
}

fn fence_posts_intact(mr: &Mr) -> bool {
    mr.buf.to_vec(mr.offset - 1, 1) == [0x5a] && mr.buf.to_vec(mr.offset + mr.len, 1) == [0x5a]
}

#[test]
fn write_read_send_through_an_iova_apart_from_the_buffer() {
    let (mut a, mut b) = pair();
    assert_ne!(
        b.guest.config.caps & abi::caps::MR_PAGE_OFFSET,
        0,
        "the device advertises MR_PAGE_OFFSET"
    );
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    let mr = b.guest.reg_mr_iova(eb.pd, OFF, LEN, ALL, IOVA).unwrap();
    assert_eq!(mr.addr(0), IOVA);
    assert_ne!(
        IOVA % 4096,
        mr.buf.addr() % 4096 + OFF as u64,
        "not congruent"
    );
    fence_posts(&mr);

    // WRITE the whole MR, first byte to last.
    let data = pattern(LEN, 0);
    src.write(0, &data);
    a.guest
        .post_send(
            &ea.qp,
            &rdma(1, write, src.sge(0, LEN as u32), IOVA, mr.rkey),
        )
        .unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!((w.wr_id, w.status), (1, 0), "{w:?}");
    assert_eq!(mr.to_vec(0, LEN), data);
    assert!(fence_posts_intact(&mr));

    // READ from an offset that crosses both page boundaries of the buffer.
    let dst = a.guest.reg_mr(ea.pd, LEN, ALL).unwrap();
    a.guest
        .post_send(
            &ea.qp,
            &rdma(
                2,
                read,
                dst.sge(0, (LEN - 0x100) as u32),
                IOVA + 0x100,
                mr.rkey,
            ),
        )
        .unwrap();
    let w = one(&mut a.guest, &ea.cq);
    assert_eq!((w.wr_id, w.status), (2, 0), "{w:?}");
    assert_eq!(dst.to_vec(0, LEN - 0x100), &data[0x100..]);

    // SEND into a receive SGE on the MR, ending at its last byte.
    let msg = pattern(0x1800, 0xff);
    src.write(0, &msg);
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 9,
                sg_list: vec![mr.sge(LEN - 0x1800, 0x1800)].into(),
            },
        )
        .unwrap();
    let mut send = SendWr::new(3, SendOp::Send, vec![src.sge(0, 0x1800)]);
    send.flags = SEND_SIGNALED;
    a.guest.post_send(&ea.qp, &send).unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!((w.wr_id, w.status, w.byte_len), (9, 0, 0x1800), "{w:?}");
    assert_eq!(mr.to_vec(LEN - 0x1800, 0x1800), msg);
    assert_eq!(mr.to_vec(0, LEN - 0x1800), &data[..LEN - 0x1800]);
    assert!(fence_posts_intact(&mr));

    // SEND from the MR's first bytes (its local key gathers them).
    let rbuf = a.guest.reg_mr(ea.pd, 64, ALL).unwrap();
    a.guest
        .post_recv(
            &ea.qp,
            &RecvWr {
                wr_id: 10,
                sg_list: vec![rbuf.sge(0, 64)].into(),
            },
        )
        .unwrap();
    let mut send = SendWr::new(4, SendOp::Send, vec![mr.sge(0, 32)]);
    send.flags = SEND_SIGNALED;
    b.guest.post_send(&eb.qp, &send).unwrap();
    assert_eq!(one(&mut b.guest, &eb.cq).status, 0);
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(rbuf.to_vec(0, 32), &data[..32]);
    b.guest.dereg_mr(mr).unwrap();
}

/// One byte before the MR and one past its end are remote access errors that write nothing;
/// the last byte is inside.
#[test]
fn bounds_at_both_ends_of_an_incongruent_mr() {
    let (mut a, mut b) = pair();
    let cases: [(&str, RdmaOp, u64, u32, u32); 5] = [
        (
            "write before",
            write,
            IOVA - 1,
            1,
            WcStatus::RemAccessErr as u32,
        ),
        (
            "write past the end",
            write,
            IOVA + LEN as u64 - 1,
            2,
            WcStatus::RemAccessErr as u32,
        ),
        (
            "read past the end",
            read,
            IOVA + LEN as u64 - 3,
            4,
            WcStatus::RemAccessErr as u32,
        ),
        (
            "read before",
            read,
            IOVA - 1,
            4,
            WcStatus::RemAccessErr as u32,
        ),
        ("write the last byte", write, IOVA + LEN as u64 - 1, 1, 0),
    ];
    for (what, op, addr, n, want) in cases {
        let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
        let src = a.guest.reg_mr(ea.pd, 64, ALL).unwrap();
        src.write(0, &[0xee; 64]);
        let mr = b.guest.reg_mr_iova(eb.pd, OFF, LEN, ALL, IOVA).unwrap();
        fence_posts(&mr);
        a.guest
            .post_send(&ea.qp, &rdma(1, op, src.sge(0, n), addr, mr.rkey))
            .unwrap();
        let w = one(&mut a.guest, &ea.cq);
        assert_eq!(w.status, want, "{what}: {w:?}");
        assert!(fence_posts_intact(&mr), "{what}");
        let touched = mr.to_vec(0, LEN).iter().filter(|&&x| x != 0).count();
        assert_eq!(touched, usize::from(want == 0), "{what}");
    }
}

/// The command's rules: an offset beyond the first page and a page count that does not match
/// offset + length are INVALID; the 40-byte form (drivers written before `page_offset`) still
/// works and takes `iova mod page`.
#[test]
fn reg_user_mr_page_offset_rules_and_the_40_byte_form() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let g = &mut b.guest;
    let buf = g.alloc_buf(3 * 4096).unwrap();
    let (gpa, _) = g.page_list_levels(&buf.pages).unwrap();
    let cmd = abi::CmdRegUserMr {
        pdn: eb.pd,
        access: ALL.0,
        iova: IOVA,
        length: LEN as u64,
        pages: abi::PageListDesc {
            gpa,
            num_pages: 3,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        },
        page_offset: OFF as u32,
        reserved: 0,
    };
    let status = |g: &mut Guest, bytes: &[u8]| match g.cmd(op::REG_USER_MR, bytes) {
        Ok(r) => {
            let k = u32::from_le_bytes(r[..4].try_into().unwrap());
            g.cmd(
                op::DEREG_MR,
                abi::Handle {
                    handle: k,
                    reserved: 0,
                }
                .as_slice(),
            )
            .unwrap();
            Status::Ok
        }
        Err(Error::Status(s)) => s,
        Err(e) => panic!("{e:?}"),
    };
    assert_eq!(status(g, cmd.as_slice()), Status::Ok);
    let beyond = abi::CmdRegUserMr {
        page_offset: 4096,
        ..cmd
    };
    assert_eq!(
        status(g, beyond.as_slice()),
        Status::Invalid,
        "offset ≥ page"
    );
    let short = abi::CmdRegUserMr {
        page_offset: 0x10,
        ..cmd
    };
    // 0x10 + 0x2000 bytes fit in three pages but need exactly three: 0 + 0x2000 needs two.
    assert_eq!(status(g, short.as_slice()), Status::Ok);
    let two = abi::CmdRegUserMr {
        page_offset: 0,
        ..cmd
    };
    assert_eq!(status(g, two.as_slice()), Status::Invalid, "too many pages");
    // The 40-byte form: the offset is iova mod page (0x123 + 0x2000 needs three pages).
    assert_eq!(status(g, &cmd.as_slice()[..40]), Status::Ok);
    assert_eq!(status(g, &cmd.as_slice()[..39]), Status::BadRequest);

    // Through the 40-byte form the first byte is at iova mod page: a WRITE to IOVA lands
    // 0x123 bytes into the first page.
    let r = g.cmd(op::REG_USER_MR, &cmd.as_slice()[..40]).unwrap();
    let key = u32::from_le_bytes(r[..4].try_into().unwrap());
    let src = a.guest.reg_mr(ea.pd, 64, ALL).unwrap();
    src.write(0, &[0x77; 16]);
    a.guest
        .post_send(&ea.qp, &rdma(1, write, src.sge(0, 16), IOVA, key))
        .unwrap();
    assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
    assert_eq!(buf.to_vec(0x123, 16), [0x77; 16]);
    assert_eq!(buf.to_vec(OFF, 16), [0; 16]);
}

/// REG_MR with the PAGE_OFFSET flag: a zero-based IOVA (what `ib_map_mr_sg_zbva` leaves)
/// over pages whose first byte is 0x456 into the first one. Without the flag the same WQE
/// maps from the IOVA's page offset (0).
#[test]
fn fast_registration_with_a_page_offset() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let src = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let data = pattern(4096, 0x33);
    src.write(0, &data);
    let lkey = b.guest.alloc_mr(eb.pd, 4).unwrap();
    let target = b.guest.alloc_buf(2 * 4096).unwrap();
    // The device knows the MR by the key of its last registration.
    let mut key = lkey;
    for (round, off) in [(0u32, Some(OFF as u32)), (1, None)] {
        let cur = key;
        key = (key & !0xff) | (0x30 + round);
        b.guest
            .post_reg_mr(&eb.qp, 7, cur, key, ALL, 0, 4096, &target.pages, off)
            .unwrap();
        let w = one(&mut b.guest, &eb.cq);
        assert_eq!((w.status, w.opcode), (0, WcOpcode::RegMr as u32), "{w:?}");
        a.guest
            .post_send(&ea.qp, &rdma(1, write, src.sge(0, 4096), 0, key))
            .unwrap();
        assert_eq!(one(&mut a.guest, &ea.cq).status, 0);
        let start = off.map_or(0, |o| o as usize);
        assert_eq!(target.to_vec(start, 4096), data, "round {round}");
        target.write(0, &[0; 8192]);
        let mut inv = SendWr::new(8, SendOp::LocalInv { rkey: key }, vec![]);
        inv.flags = SEND_SIGNALED;
        b.guest.post_send(&eb.qp, &inv).unwrap();
        assert_eq!(one(&mut b.guest, &eb.cq).status, 0);
    }
    // An offset beyond the first page: the WQE completes with a local error.
    b.guest
        .post_reg_mr(
            &eb.qp,
            11,
            key,
            key + 1,
            ALL,
            0,
            16,
            &target.pages,
            Some(4096),
        )
        .unwrap();
    let w = one(&mut b.guest, &eb.cq);
    assert_eq!(
        (w.wr_id, w.status),
        (11, WcStatus::LocQpOpErr as u32),
        "an offset beyond the first page: {w:?}"
    );
}
