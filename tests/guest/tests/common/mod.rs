//! Code shared by the integration tests; a test file that needs it says `mod common;`.

// Each test binary compiles this module on its own and uses a different part of it.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use rxe_core::verbs::*;
use vur_testguest::{abi, connect_qps, loopback_pair, ConnOpts, Cq, End, Guest, Node, Wc, PAGE};

/// How long a test waits for a completion.
pub const T: Duration = Duration::from_secs(10);

/// The daemon binary built with these tests, or `VUR_TEST_DAEMON` (a test binary run where
/// the build tree is not, as in a guest: tests/vm/guest-memory-dmabuf.test.sh).
pub fn bin() -> &'static Path {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var_os("VUR_TEST_DAEMON")
            .map(Into::into)
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_vur-daemon").into())
    })
}

/// Two daemons on loopback UDP, each with a test guest attached.
pub fn pair() -> (Node, Node) {
    let (aa, ba) = loopback_pair(4791);
    (
        Node::start(bin(), aa, &[]).expect("node a"),
        Node::start(bin(), ba, &[]).expect("node b"),
    )
}

/// The next completion of `cq`, within `t`; exactly one.
pub fn one_within(g: &mut Guest, cq: &Cq, t: Duration) -> Wc {
    let w = g.wait_cq(cq, 1, t);
    assert_eq!(w.len(), 1, "expected one completion");
    w[0]
}

/// The next completion of `cq`, within [`T`].
pub fn one(g: &mut Guest, cq: &Cq) -> Wc {
    one_within(g, cq, T)
}

/// A page list of `n` entries that all name `page`, with one level of indirection: a top
/// array of ⌈n/512⌉ pointers, every one to the same list page. Cheap in guest memory
/// whatever `n` is; the device still reads (and holds) `n` entries.
pub fn repeated_list(g: &Guest, page: u64, n: u32) -> abi::PageListDesc {
    let list_page = g.ram.alloc_contig(PAGE, PAGE).unwrap();
    let entries: Vec<u8> = (0..512).flat_map(|_| page.to_le_bytes()).collect();
    g.ram.write(list_page, &entries);
    let tops = vec![list_page; (n as usize).div_ceil(512)];
    abi::PageListDesc {
        gpa: g.page_list(&tops).unwrap(),
        num_pages: n,
        page_shift: 12,
        levels: 1,
        reserved: 0,
    }
}

/// A WRITE from `a` to `b` with a wrong rkey completes with REM_ACCESS_ERR; returns `a`'s
/// end (its QP is in ERR then).
pub fn write_with_a_bad_rkey(a: &mut Node, b: &mut Node) -> End {
    let (ea, eb) = connect_qps(a, b, &ConnOpts::default()).unwrap();
    let all = Access::LOCAL_WRITE.union(Access::REMOTE);
    let la = a.guest.reg_mr(ea.pd, 4096, all).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let write = SendOp::Write {
        remote_addr: rb.addr(0),
        rkey: rb.rkey ^ 0x100,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, write, vec![la.sge(0, 8)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the WRITE's completion");
    assert_eq!(w[0].status, WcStatus::RemAccessErr as u32);
    ea
}

/// An RC SEND from `a` to `b`, which posted no receive: RNR NAKs until the retries (one)
/// run out, RNR_RETRY_EXC_ERR.
pub fn rnr_retries_run_out(a: &mut Node, b: &mut Node) {
    let o = ConnOpts {
        rnr_retry: 1,
        min_rnr_timer: 1,
        ..Default::default()
    };
    let (ea, _eb) = connect_qps(a, b, &o).unwrap();
    let la = a
        .guest
        .reg_mr(ea.pd, 4096, Access::LOCAL_WRITE.union(Access::REMOTE))
        .unwrap();
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, SendOp::Send, vec![la.sge(0, 8)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, T);
    assert_eq!(w.len(), 1, "the SEND's completion");
    assert_eq!(w[0].status, WcStatus::RnrRetryExcErr as u32);
}

/// RC SEND (3 packets), WRITE and READ of 64 KiB from `a` to `b`, data checked.
pub fn send_write_read(a: &mut Node, b: &mut Node) {
    let (ea, eb) = connect_qps(a, b, &ConnOpts::default()).expect("connect");
    let access = Access::LOCAL_WRITE.union(Access::REMOTE);
    let len = 64 << 10;
    let sa = a.guest.reg_mr(ea.pd, len, access).unwrap();
    let sb = b.guest.reg_mr(eb.pd, len, access).unwrap();
    let wait = Duration::from_secs(10);
    // SEND of 3000 bytes (three packets at MTU 1024).
    // The shared PRNG fill: no period a segment placed at the wrong offset could hide in.
    let msg = rxe_core::sim::prng_pattern(108, 3000);
    sa.buf.write(0, &msg);
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 42,
                sg_list: vec![sb.sge(0, len as u32)].into(),
            },
        )
        .unwrap();
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, SendOp::Send, vec![sa.sge(0, 3000)]))
        .unwrap();
    let wa = a.guest.wait_cq(&ea.cq, 1, wait);
    let wb = b.guest.wait_cq(&eb.cq, 1, wait);
    assert_eq!(wa.len(), 1, "send completion");
    assert_eq!((wa[0].wr_id, wa[0].status), (1, 0));
    assert_eq!(wb.len(), 1, "receive completion");
    assert_eq!((wb[0].wr_id, wb[0].status, wb[0].byte_len), (42, 0, 3000));
    assert_eq!(sb.buf.to_vec(0, 3000), msg);
    // WRITE 64 KiB into b.
    let data = rxe_core::sim::prng_pattern(130, len);
    sa.buf.write(0, &data);
    let write = SendOp::Write {
        remote_addr: sb.iova,
        rkey: sb.rkey,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(2, write, vec![sa.sge(0, len as u32)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, wait);
    assert_eq!(w.len(), 1, "write completion");
    assert_eq!((w[0].wr_id, w[0].status), (2, 0));
    assert!(sb.buf.to_vec(0, len) == data, "written data");
    // READ it back into a fresh buffer of a.
    let ra = a.guest.reg_mr(ea.pd, len, access).unwrap();
    let read = SendOp::Read {
        remote_addr: sb.iova,
        rkey: sb.rkey,
    };
    a.guest
        .post_send(&ea.qp, &SendWr::new(3, read, vec![ra.sge(0, len as u32)]))
        .unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, wait);
    assert_eq!(w.len(), 1, "read completion");
    assert_eq!((w[0].wr_id, w[0].status), (3, 0));
    assert!(ra.buf.to_vec(0, len) == data, "read data");
}

/// Runs `f` in a network namespace of its own; when it cannot (not root, no iproute2, no
/// namespace), a skip by the workspace's rule (`vur_testkit::skip`: a failure under CI).
pub fn run(test: &str, f: impl FnOnce() + Send + 'static) {
    use vur_testguest::netns;
    if let Some(why) = netns::unavailable() {
        return vur_testkit::skip(test, &why);
    }
    if let Err(why) = netns::run_in_new_netns(f) {
        vur_testkit::skip(test, &format!("cannot create a network namespace: {why}"));
    }
}

/// A control command's status: Ok, or the device's refusal (a transport error panics).
pub fn status(g: &mut Guest, opcode: u32, body: &[u8]) -> abi::Status {
    match g.cmd(opcode, body) {
        Ok(_) => abi::Status::Ok,
        Err(vur_testguest::error::Error::Status(s)) => s,
        Err(e) => panic!("transport error {e:?}"),
    }
}
