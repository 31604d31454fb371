//! Error paths: remote access errors, RNR retry exhaustion, flushing, CQ overflow, and a
//! malicious guest that must get error statuses while the daemon stays alive.

mod common;

use std::time::Duration;

use common::{bin, pair, rnr_retries_run_out, status, write_with_a_bad_rkey, T};
use rxe_core::verbs::*;
use vm_memory::ByteValued;
use vur_testguest::abi::{op, Status};
use vur_testguest::*;

const ALL: Access = Access::LOCAL_WRITE.union(Access::REMOTE);

#[test]
fn bad_rkey_is_a_remote_access_error() {
    let (mut a, mut b) = pair();
    let ea = write_with_a_bad_rkey(&mut a, &mut b);
    // The responder QP learns about it too (rxe raises QP_ACCESS_ERR... on the requester it is
    // the error CQE); the requester QP is now in ERR.
    let q = a.guest.query_qp(&ea.qp).unwrap();
    assert_eq!(q.qp_state, QpState::Err as u32);
}

#[test]
fn rnr_retry_exhausted() {
    let (mut a, mut b) = pair();
    rnr_retries_run_out(&mut a, &mut b);
}

#[test]
fn qp_to_error_flushes_posted_work() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    for i in 0..5 {
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: i,
                    sg_list: vec![rb.sge(0, 64)].into(),
                },
            )
            .unwrap();
    }
    // The posted receives are in the ring; the device takes them when it needs them, or on a
    // doorbell / state change. Move to ERR: all five complete with WR_FLUSH_ERR.
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    b.guest.modify_qp(&eb.qp, &attr, AttrMask::STATE).unwrap();
    let w = b.guest.wait_cq(&eb.cq, 5, T);
    assert_eq!(w.len(), 5);
    assert!(w
        .iter()
        .enumerate()
        .all(|(i, w)| w.wr_id == i as u64 && w.status == WcStatus::WrFlushErr as u32));
    let _ = ea;
}

#[test]
fn cq_overflow_is_an_async_error() {
    let (mut a, mut b) = pair();
    let o = ConnOpts {
        cqe: 3,
        ..Default::default()
    };
    let (ea, _eb) = connect_qps(&mut a, &mut b, &o).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    // Eight signaled local operations (binding nothing: writes to ourselves would need a
    // peer; use RDMA WRITE of 0 bytes to the peer's rkey-less address) into a CQ of 3.
    for i in 0..8 {
        a.guest
            .post_send(
                &ea.qp,
                &SendWr::new(
                    i,
                    SendOp::Write {
                        remote_addr: 0,
                        rkey: 0,
                    },
                    vec![],
                ),
            )
            .unwrap();
    }
    let e = a.guest.wait_event(T, |e| {
        e.kind == abi::event::KIND_ASYNC && e.event == abi::event::CQ_ERR
    });
    assert_eq!(
        e.map(|e| e.object),
        Some(ea.cq.cqn),
        "CQ_ERR event for the overflowing CQ"
    );
    let _ = la;
    let c = a.daemon.counters().unwrap();
    assert_eq!(json_u64(&c, "device", "cq_overflows"), Some(1));
    assert!(a.daemon.is_alive());
}

#[test]
fn cq_notification_through_the_notify_word() {
    let (mut a, mut b) = pair();
    let (ea, eb) = connect_qps(&mut a, &mut b, &ConnOpts::default()).unwrap();
    let la = a.guest.reg_mr(ea.pd, 4096, ALL).unwrap();
    let rb = b.guest.reg_mr(eb.pd, 4096, ALL).unwrap();
    assert!(
        !b.guest.req_notify_cq(&eb.cq, false),
        "empty CQ: nothing missed"
    );
    b.guest
        .post_recv(
            &eb.qp,
            &RecvWr {
                wr_id: 1,
                sg_list: vec![rb.sge(0, 64)].into(),
            },
        )
        .unwrap();
    a.guest
        .post_send(&ea.qp, &SendWr::new(1, SendOp::Send, vec![la.sge(0, 8)]))
        .unwrap();
    let e = b
        .guest
        .wait_event(T, |e| e.kind == abi::event::KIND_COMPLETION);
    assert_eq!(e.map(|e| e.object), Some(eb.cq.cqn));
    assert_eq!(
        eb.cq
            .ring
            .notify()
            .load(std::sync::atomic::Ordering::Acquire),
        0,
        "device disarmed"
    );
    assert_eq!(b.guest.poll_cq(&eb.cq, 4).len(), 1);
    // Solicited-only: an unsolicited SEND does not raise an event, a solicited one does.
    b.guest.req_notify_cq(&eb.cq, true);
    for (i, flags) in [(2u64, SEND_SIGNALED), (3, SEND_SIGNALED | SEND_SOLICITED)] {
        b.guest
            .post_recv(
                &eb.qp,
                &RecvWr {
                    wr_id: i,
                    sg_list: vec![rb.sge(0, 64)].into(),
                },
            )
            .unwrap();
        let mut wr = SendWr::new(i, SendOp::Send, vec![la.sge(0, 8)]);
        wr.flags = flags;
        a.guest.post_send(&ea.qp, &wr).unwrap();
        assert_eq!(b.guest.wait_cq(&eb.cq, 1, T).len(), 1);
        let e = b.guest.wait_event(Duration::from_millis(300), |e| {
            e.kind == abi::event::KIND_COMPLETION
        });
        assert_eq!(e.is_some(), i == 3, "solicited-only arm, message {i}");
    }
}

/// A VMM that reconnects a running guest to a restarted daemon restores the ring positions;
/// the guest's objects are gone, and the device says so with DEVICE_FATAL instead of letting
/// its QPs stop silently. A fresh guest (rings at 0) gets no such event.
#[test]
fn reconnect_that_lost_state_raises_device_fatal() {
    let (aa, _) = loopback_pair(4791);
    let d = Daemon::spawn(bin(), aa, &[]).unwrap();
    let fatal =
        |e: &abi::Event| e.kind == abi::event::KIND_ASYNC && e.event == abi::event::DEVICE_FATAL;
    {
        let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
        g.alloc_pd().unwrap();
        assert!(g.wait_event(Duration::from_millis(300), fatal).is_none());
    }
    let opts = GuestOpts {
        vring_base: 7,
        ..Default::default()
    };
    let mut g = Guest::connect(&d.socket, opts).unwrap();
    g.alloc_pd().unwrap();
    let e = g.wait_event(Duration::from_secs(5), fatal);
    assert!(
        e.is_some(),
        "no DEVICE_FATAL after a reconnect at ring position 7"
    );
}

/// The udp transport sends from its bound address only: QUERY_GID_SOURCES says which. ADD_GID
/// takes any other GID into the table (the guest's table is what its netdev has), but an AH or
/// a QP that would send from it is refused with a status of its own (it would send from the
/// wrong address); the config space announces both.
#[test]
fn gid_sources_are_the_bound_address_and_other_gids_are_listed_but_never_used() {
    let (aa, _) = loopback_pair(4791);
    let d = Daemon::spawn(bin(), aa, &[]).unwrap();
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
    assert_ne!(g.config.caps & abi::caps::GID_SOURCES, 0);
    let b = g.cmd(op::QUERY_GID_SOURCES, &[]).unwrap();
    let r: abi::RespGidSources = abi::read_struct(&b).unwrap();
    let bound = rxe_core::Gid::from_ip(aa.ip());
    assert_eq!((r.count, r.gids[0]), (1, bound.0));
    let link_local = rxe_core::Gid(
        "fe80::5054:ff:fe77:2"
            .parse::<std::net::Ipv6Addr>()
            .unwrap()
            .octets(),
    );
    g.add_gid(0, link_local).unwrap();
    g.add_gid(1, bound).unwrap();
    let pd = g.alloc_pd().unwrap();
    let av = |sgid_index| Av {
        dgid: rxe_core::Gid::from_ip(aa.ip()),
        sgid_index,
        ..Default::default()
    };
    assert!(matches!(
        g.create_ah(pd, &av(0)),
        Err(Error::Status(Status::AddressNotAvailable))
    ));
    g.create_ah(pd, &av(1)).unwrap();
    // a QP that would send from the listed GID is refused at RTR; from the bound one it works
    let cq = g.create_cq(16).unwrap();
    let cap = QpCap {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = g.create_qp(QpType::Rc, pd, &cq, &cq, None, cap).unwrap();
    let mut attr = QpAttr {
        qp_state: QpState::Init,
        qp_access_flags: Access::LOCAL_WRITE,
        ..Default::default()
    };
    g.modify_qp(
        &qp,
        &attr,
        AttrMask::STATE | AttrMask::ACCESS_FLAGS | AttrMask::PKEY_INDEX | AttrMask::PORT,
    )
    .unwrap();
    attr.qp_state = QpState::Rtr;
    attr.av = av(0);
    attr.dest_qp_num = 0x11;
    attr.path_mtu = Mtu::M1024;
    let rtr = AttrMask::STATE
        | AttrMask::AV
        | AttrMask::PATH_MTU
        | AttrMask::DEST_QPN
        | AttrMask::RQ_PSN
        | AttrMask::MAX_DEST_RD_ATOMIC
        | AttrMask::MIN_RNR_TIMER;
    assert!(matches!(
        g.modify_qp(&qp, &attr, rtr),
        Err(Error::Status(Status::AddressNotAvailable))
    ));
    attr.av = av(1);
    g.modify_qp(&qp, &attr, rtr).unwrap();
    // deleting the listed entry works like any other; a second delete finds nothing
    g.del_gid(0).unwrap();
    assert!(matches!(g.del_gid(0), Err(Error::Status(Status::NotFound))));
}

#[test]
fn malicious_guest_gets_errors_and_the_daemon_survives() {
    let (aa, _) = loopback_pair(4791);
    let mut d = Daemon::spawn(bin(), aa, &["--max-registered-bytes", "16M"]).unwrap();
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
    g.add_gid(0, rxe_core::Gid::from_ip(aa.ip())).unwrap();
    let pd = g.alloc_pd().unwrap();
    bad_control_requests(&mut g);
    // Rings outside memory, absurd sizes, page lists pointing anywhere.
    let outside = g.page_list(&[0x7fff_0000_0000]).unwrap();
    bad_rings(&mut g, outside);
    bad_mrs(&mut g, pd, outside);
    let (cq, qp) = missing_objects_and_bad_states(&mut g, pd);
    garbage_wqes(&mut g, &qp, &cq, aa.ip());
    // Still serving.
    assert!(g.query_device().is_ok());
    let c = d.counters().unwrap();
    assert!(json_u64(&c, "device", "bad_wqes").unwrap() >= 1);
    assert!(json_u64(&c, "device", "bad_doorbells").unwrap() >= 2);
    assert!(d.is_alive());
}

/// Unknown opcode, non-zero flags, truncated command, response room too small; chains with
/// only a readable part or outside guest memory.
fn bad_control_requests(g: &mut Guest) {
    // Unknown opcode, non-zero flags, truncated command, response room too small.
    assert_eq!(status(g, 999, &[]), Status::Unsupported);
    let h = abi::CtrlHdr {
        opcode: op::CREATE_PD,
        flags: 1,
        seq: 1,
    };
    assert_eq!(
        g.raw_cmd(h.as_slice(), 64).unwrap().0,
        Status::BadRequest as u32
    );
    assert_eq!(status(g, op::CREATE_CQ, &[1, 2, 3]), Status::BadRequest);
    let h = abi::CtrlHdr {
        opcode: op::QUERY_DEVICE,
        flags: 0,
        seq: 2,
    };
    assert_eq!(
        g.raw_cmd(h.as_slice(), 20).unwrap().0,
        Status::BadRequest as u32
    );
    // A chain with only a readable part: completed with 0 bytes, daemon fine.
    let req = g.ram.alloc_contig(64, 8).unwrap();
    assert_eq!(g.raw_chain(&[(req, 16, false)]).unwrap(), 0);
    // A descriptor pointing outside guest memory.
    assert_eq!(
        g.raw_chain(&[(0x7fff_0000_0000, 16, false), (req, 32, true)])
            .unwrap(),
        0
    );
}

/// A queue descriptor for the bad rings: levels 0, 4 KiB pages.
fn bad_q(gpa: u64, slots: u32, log2: u32, pages: u32) -> abi::QueueDesc {
    abi::QueueDesc {
        pages: abi::PageListDesc {
            gpa,
            num_pages: pages,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        },
        num_slots: slots,
        log2_elem_size: log2,
        reserved: 0,
    }
}

/// CQ rings outside memory (`outside`: a page list whose page is), absurd sizes, too few pages.
fn bad_rings(g: &mut Guest, outside: u64) {
    let c = abi::CmdCreateCq {
        cqe: 3,
        flags: 0,
        queue: bad_q(outside, 4, 6, 1),
    };
    assert_eq!(status(g, op::CREATE_CQ, c.as_slice()), Status::BadAddress);
    let c = abi::CmdCreateCq {
        cqe: 3,
        flags: 0,
        queue: bad_q(0xffff_ffff_ffff_f000, 4, 6, 1),
    };
    assert_eq!(status(g, op::CREATE_CQ, c.as_slice()), Status::BadAddress);
    let c = abi::CmdCreateCq {
        cqe: 3,
        flags: 0,
        queue: bad_q(outside, 3, 6, 1),
    };
    assert_eq!(
        status(g, op::CREATE_CQ, c.as_slice()),
        Status::Invalid,
        "slots not a power of two"
    );
    let c = abi::CmdCreateCq {
        cqe: 1 << 30,
        flags: 0,
        queue: bad_q(outside, 1 << 31, 31, u32::MAX),
    };
    assert_eq!(status(g, op::CREATE_CQ, c.as_slice()), Status::Invalid);
    let c = abi::CmdCreateCq {
        cqe: 3,
        flags: 0,
        queue: bad_q(outside, 4, 6, 0),
    };
    assert_eq!(
        status(g, op::CREATE_CQ, c.as_slice()),
        Status::Invalid,
        "too few pages"
    );
}

/// MR: page list outside memory, wrong page count, registering beyond the byte limit.
fn bad_mrs(g: &mut Guest, pd: u32, outside: u64) {
    let m = abi::CmdRegUserMr {
        pdn: pd,
        access: 1,
        iova: 0x1000,
        length: 4096,
        pages: abi::PageListDesc {
            gpa: outside,
            num_pages: 1,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        },
        page_offset: 0,
        reserved: 0,
    };
    assert_eq!(status(g, op::REG_USER_MR, m.as_slice()), Status::BadAddress);
    let m2 = abi::CmdRegUserMr {
        length: 1 << 40,
        ..m
    };
    assert_eq!(status(g, op::REG_USER_MR, m2.as_slice()), Status::Invalid);
    let m3 = abi::CmdRegUserMr {
        pages: abi::PageListDesc {
            levels: 7,
            ..m.pages
        },
        ..m
    };
    assert_eq!(status(g, op::REG_USER_MR, m3.as_slice()), Status::Invalid);
    assert!(g.reg_mr(pd, 15 << 20, Access::LOCAL_WRITE).is_ok());
    assert!(matches!(
        g.reg_mr(pd, 2 << 20, Access::LOCAL_WRITE),
        Err(Error::Status(Status::NoMemory))
    ));
}

/// Objects that do not exist; state machine violations. Returns the CQ and QP it made.
fn missing_objects_and_bad_states(g: &mut Guest, pd: u32) -> (Cq, Qp) {
    assert_eq!(
        status(
            g,
            op::DESTROY_CQ,
            abi::Handle {
                handle: 12345,
                reserved: 0
            }
            .as_slice()
        ),
        Status::NotFound
    );
    let cq = g.create_cq(15).unwrap();
    let qp = g
        .create_qp(QpType::Rc, pd, &cq, &cq, None, ConnOpts::default().cap)
        .unwrap();
    assert_eq!(
        status(
            g,
            op::DESTROY_CQ,
            abi::Handle {
                handle: cq.cqn,
                reserved: 0
            }
            .as_slice()
        ),
        Status::Busy
    );
    assert_eq!(
        status(
            g,
            op::DESTROY_PD,
            abi::Handle {
                handle: pd,
                reserved: 0
            }
            .as_slice()
        ),
        Status::Busy
    );
    let rts = QpAttr {
        qp_state: QpState::Rts,
        ..Default::default()
    };
    assert!(matches!(
        g.modify_qp(&qp, &rts, AttrMask::STATE),
        Err(Error::Status(Status::Invalid | Status::BadState))
    ));
    let w = abi::QpAttrs {
        qpn: qp.qpn,
        attr_mask: AttrMask::STATE,
        qp_state: 99,
        ..Default::default()
    };
    assert_eq!(status(g, op::MODIFY_QP, w.as_slice()), Status::Invalid);
    (cq, qp)
}

/// Garbage WQEs: the QP errors out with a LOC_QP_OP_ERR completion; an absurd producer index
/// and doorbells for objects that do not exist.
fn garbage_wqes(g: &mut Guest, qp: &Qp, cq: &Cq, ip: std::net::IpAddr) {
    bring_up(
        g,
        qp,
        rxe_core::Gid::from_ip(ip),
        qp.qpn,
        &ConnOpts::default(),
    )
    .unwrap();
    let sq = qp.sq.as_ref().unwrap();
    let mut slot = vec![0xA5u8; sq.elem_size()];
    slot[..8].copy_from_slice(&77u64.to_le_bytes());
    g.post_raw_send_slot(qp, &slot).unwrap();
    let w = g.wait_cq(cq, 1, T);
    assert_eq!((w[0].wr_id, w[0].status), (77, WcStatus::LocQpOpErr as u32));
    // num_sge far beyond the QP's limit, valid opcode.
    let mut wr = encode_send_wqe(&SendWr::new(78, SendOp::Send, vec![]), 0, sq.elem_size());
    wr[abi::swqe::DMA_NUM_SGE..abi::swqe::DMA_NUM_SGE + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    g.post_raw_send_slot(qp, &wr).unwrap();
    let w = g.wait_cq(cq, 1, T);
    assert_eq!(w.len(), 1);
    assert_ne!(w[0].status, 0);
    // Absurd producer index and doorbells for objects that do not exist.
    sq.producer()
        .store(0xffff_fff0, std::sync::atomic::Ordering::Release);
    g.doorbell(abi::doorbell::SQ, qp.qpn, 0).unwrap();
    g.doorbell(abi::doorbell::SQ, 0xdead, 0).unwrap();
    g.doorbell(77, 1, 2).unwrap();
}

#[test]
fn reconnect_drops_state_and_leaks_nothing() {
    let (aa, _) = loopback_pair(4791);
    let mut d = Daemon::spawn(bin(), aa, &[]).unwrap();
    // The baseline: the fds of a daemon back to waiting after one connection (the first may
    // open things it keeps). Waiting means: the connection was counted and its model dropped
    // (no "objects" in the counters), and the fd count has settled (the same in 5 reads 20 ms
    // apart), since the daemon closes the connection's fds after dropping the model.
    let baseline_fds = {
        let g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
        drop(g);
        let end = std::time::Instant::now() + T;
        let mut c = d.counters().unwrap();
        while json_u64(&c, "", "connections") != Some(1) || c.contains("\"objects\"") {
            assert!(
                std::time::Instant::now() < end,
                "waited {T:?} for the daemon to drop the first connection; counters: {c}"
            );
            std::thread::sleep(Duration::from_millis(5));
            c = d.counters().unwrap();
        }
        let mut seen = vec![d.fd_count().unwrap()];
        while seen.len() < 5
            || seen[seen.len() - 5..]
                .iter()
                .any(|&n| n != seen[seen.len() - 1])
        {
            assert!(
                std::time::Instant::now() < end,
                "waited {T:?} for the daemon's fd count to settle; counts seen: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
            seen.push(d.fd_count().unwrap());
        }
        seen[seen.len() - 1]
    };
    for round in 0..5 {
        let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
        g.add_gid(0, rxe_core::Gid::from_ip(aa.ip())).unwrap();
        let pd = g.alloc_pd().unwrap();
        let cq = g.create_cq(63).unwrap();
        let _qp = g
            .create_qp(QpType::Rc, pd, &cq, &cq, None, ConnOpts::default().cap)
            .unwrap();
        let _mr = g.reg_mr(pd, 1 << 16, ALL).unwrap();
        let c = d.counters().unwrap();
        assert_eq!(
            json_u64(&c, "objects", "qps"),
            Some(1),
            "round {round}: fresh state"
        );
        drop(g);
    }
    // After the last disconnect the daemon is back to waiting, with the same fds as before.
    let end = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let n = d.fd_count().unwrap();
        if n == baseline_fds {
            break;
        }
        assert!(
            std::time::Instant::now() < end,
            "fd leak: {n} open, baseline {baseline_fds}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = d.counters().unwrap();
    assert_eq!(json_u64(&c, "", "connections"), Some(6));
    assert!(
        !c.contains("\"objects\""),
        "no model while no frontend is connected"
    );
    // A device reset in the middle of a connection forgets everything too.
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
    let pd = g.alloc_pd().unwrap();
    let _cq = g.create_cq(7).unwrap();
    g.cmd(op::RESET, &[]).unwrap();
    assert_eq!(
        status(
            &mut g,
            op::DESTROY_PD,
            abi::Handle {
                handle: pd,
                reserved: 0
            }
            .as_slice()
        ),
        Status::NotFound
    );
    // Clean exit on SIGTERM.
    drop(g);
    assert_eq!(d.terminate(), Some(0));
}

/// A memory table the daemon cannot map (here: a region whose fd is a file opened read-only,
/// as a frontend whose guest memory is not shared might hand over) ends the connection with
/// a log line that names the likely cause and the fix.
#[test]
fn a_memory_table_that_cannot_be_mapped_is_explained() {
    use std::os::fd::AsRawFd;
    use vhost::vhost_user::Frontend;
    use vhost::VhostBackend;
    use vhost::VhostUserMemoryRegionInfo;
    let (addr, _) = loopback_pair(4791);
    let d = Daemon::spawn_logged(bin(), addr, &[]).unwrap();
    let dir = std::env::temp_dir().join(format!("vur-memtable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ram");
    std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
    let ro = std::fs::File::open(&path).unwrap();
    // The daemon's socket appears once it serves (waited for, bounded to catch a hang).
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let fe = loop {
        match Frontend::connect(&d.socket, abi::NUM_QUEUES as u64) {
            Ok(fe) => break fe,
            Err(e) => assert!(std::time::Instant::now() < end, "no socket in 30 s: {e}"),
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    fe.set_owner().unwrap();
    let features = fe.get_features().unwrap();
    fe.set_features(features & (1 << 32)).unwrap();
    let region = VhostUserMemoryRegionInfo {
        guest_phys_addr: 0,
        memory_size: 1 << 20,
        userspace_addr: 0x7f00_0000_0000,
        mmap_offset: 0,
        mmap_handle: ro.as_raw_fd(),
    };
    let _ = fe.set_mem_table(&[region]);
    // The daemon ends the connection: waited for in its log (bounded to catch a hang).
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let line = loop {
        let log = d.log();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("frontend connection ended"))
        {
            break l.to_string();
        }
        assert!(
            std::time::Instant::now() < end,
            "no end of the connection logged in 30 s:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        line.contains("guest memory") && line.contains("share=on"),
        "the line names no cause: {line}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // And the daemon serves the next frontend.
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).unwrap();
    g.alloc_pd().unwrap();
}
