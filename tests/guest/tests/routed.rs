//! Two hosts with a router between them, each with its own daemon on the udp transport: the
//! hosts are network namespaces of their own (A: 10.91.1.2, B: 10.91.2.2), and the router is
//! the test's namespace (10.91.1.1 and 10.91.2.1, forwarding), joined to each by a veth pair.
//! Every byte the QPs move is checked.
//!
//! - ECMP: each QP's packets cross the router from the UDP source port Linux rxe gives that
//!   QP (`rdma_get_udp_sport()` of both QP numbers), in both directions (the ACKs too), as a
//!   capture on the router shows; distinct QPs, distinct ports.
//! - Path MTU: the router–B link has a smaller MTU than the hosts' links. At 1280 the port's
//!   default path MTU of 1024 crosses as it is. At 1000 it does not: the router's ICMP
//!   "fragmentation needed" teaches host A's kernel the path MTU, the daemon's log names it
//!   and the `--mtu` that fits, and the daemons started with that `--mtu` move every byte.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::net::SocketAddr;
use std::time::Duration;

use common::{bin, run};
use rxe_core::icrc::rc_udp_sport;
use rxe_core::verbs::{Mtu, SendOp, SendWr};
use vur_testguest::netns::{self, Capture, NsThread};
use vur_testguest::*;

mod common;

const A: &str = "10.91.1.2";
const B: &str = "10.91.2.2";

/// The two hosts, each a namespace on a thread of its own; the router is the caller's.
struct Hosts {
    a: NsThread,
    b: NsThread,
}

/// Builds A — router — B; `mtu_b`: the MTU of the router–B link (both ends).
fn hosts(mtu_b: u32) -> Hosts {
    let a = NsThread::new().expect("host A's namespace");
    let b = NsThread::new().expect("host B's namespace");
    let mtu = mtu_b.to_string();
    for (r, h, ns) in [("rA", "hA", a.tid), ("rB", "hB", b.tid)] {
        netns::ip(&["link", "add", r, "type", "veth", "peer", "name", h]).unwrap();
        netns::ip(&["link", "set", h, "netns", &ns.to_string()]).unwrap();
    }
    for c in [
        vec!["addr", "add", "10.91.1.1/24", "dev", "rA"],
        vec!["addr", "add", "10.91.2.1/24", "dev", "rB"],
        vec!["link", "set", "rB", "mtu", &mtu],
        vec!["link", "set", "rA", "up"],
        vec!["link", "set", "rB", "up"],
    ] {
        netns::ip(&c).unwrap();
    }
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").expect("forwarding on the router");
    for (ns, h, addr, via, m) in [
        (&a, "hA", A, "10.91.1.1", "1500".to_string()),
        (&b, "hB", B, "10.91.2.1", mtu.clone()),
    ] {
        let cmds: Vec<Vec<String>> = [
            vec!["addr", "add", &format!("{addr}/24"), "dev", h],
            vec!["link", "set", h, "mtu", &m],
            vec!["link", "set", h, "up"],
            vec!["route", "add", "default", "via", via],
        ]
        .iter()
        .map(|c| c.iter().map(|s| s.to_string()).collect())
        .collect();
        ns.run(move || {
            for c in cmds {
                let c: Vec<&str> = c.iter().map(|s| s.as_str()).collect();
                netns::ip(&c).unwrap();
            }
        });
    }
    Hosts { a, b }
}

/// A daemon on `addr` started in namespace `ns` (its log kept), with a test guest.
fn node_in(ns: &NsThread, addr: &str, extra: &[&str]) -> Node {
    let addr: SocketAddr = format!("{addr}:4791").parse().unwrap();
    let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    let daemon = ns.run(move || {
        let e: Vec<&str> = extra.iter().map(|s| s.as_str()).collect();
        Daemon::spawn_logged(bin(), addr, &e)
    });
    let daemon = daemon.expect("daemon");
    let mut guest = Guest::connect(&daemon.socket, GuestOpts::default()).expect("guest");
    let gid = rxe_core::Gid::from_ip(addr.ip());
    guest.add_gid(0, gid).unwrap();
    Node {
        daemon,
        guest,
        gid,
        mac: [0; 6],
    }
}

/// Deterministic bytes, different for each `seed`.
fn pattern(seed: u32, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// A WRITE of `len` bytes from `a` to `b` and a READ of them back into a second buffer of
/// `a`; returns the two completions' statuses and, when both succeeded, whether every byte
/// arrived and came back as written.
fn write_and_read(
    a: &mut Node,
    b: &mut Node,
    ea: &End,
    eb: &End,
    o: &ConnOpts,
    len: usize,
    seed: u32,
) -> (u32, u32, bool) {
    let src = a.guest.reg_mr(ea.pd, len, o.access).unwrap();
    let back = a.guest.reg_mr(ea.pd, len, o.access).unwrap();
    let dst = b.guest.reg_mr(eb.pd, len, o.access).unwrap();
    let data = pattern(seed, len);
    src.write(0, &data);
    let write = SendOp::Write {
        remote_addr: dst.iova,
        rkey: dst.rkey,
    };
    let wr = SendWr::new(1, write, vec![src.sge(0, len as u32)]);
    a.guest.post_send(&ea.qp, &wr).unwrap();
    let w = a.guest.wait_cq(&ea.cq, 1, Duration::from_secs(30));
    assert_eq!(w.len(), 1, "the WRITE's completion");
    if w[0].status != 0 {
        return (w[0].status, u32::MAX, false);
    }
    let read = SendOp::Read {
        remote_addr: dst.iova,
        rkey: dst.rkey,
    };
    let wr = SendWr::new(2, read, vec![back.sge(0, len as u32)]);
    a.guest.post_send(&ea.qp, &wr).unwrap();
    let r = a.guest.wait_cq(&ea.cq, 1, Duration::from_secs(30));
    assert_eq!(r.len(), 1, "the READ's completion");
    let same = dst.to_vec(0, len) == data && back.to_vec(0, len) == data;
    (w[0].status, r[0].status, same)
}

/// RoCEv2 frames in `frames` (Ethernet, IPv4, UDP to 4791): (UDP source port, BTH
/// destination QP, IP total length).
fn roce_frames(frames: &[Vec<u8>]) -> Vec<(u16, u32, u16)> {
    frames
        .iter()
        .filter(|f| f.len() >= 14 + 20 + 8 + 12 && f[12..14] == [0x08, 0x00] && f[23] == 17)
        .filter_map(|f| {
            let ihl = ((f[14] & 0xf) * 4) as usize;
            let udp = 14 + ihl;
            let dport = u16::from_be_bytes([f[udp + 2], f[udp + 3]]);
            (dport == 4791 && f.len() >= udp + 8 + 12).then(|| {
                let bth = udp + 8;
                (
                    u16::from_be_bytes([f[udp], f[udp + 1]]),
                    u32::from_be_bytes([0, f[bth + 5], f[bth + 6], f[bth + 7]]),
                    u16::from_be_bytes([f[16], f[17]]),
                )
            })
        })
        .collect()
}

#[test]
fn qps_cross_a_router_each_from_its_own_source_port() {
    run("qps_cross_a_router_each_from_its_own_source_port", || {
        let h = hosts(1280);
        let cap = Capture::open("rA").expect("capture on the router");
        let mut a = node_in(&h.a, A, &[]);
        let mut b = node_in(&h.b, B, &[]);
        let o = ConnOpts::default();
        let mut want = Vec::new();
        for q in 0..3u32 {
            let (ea, eb) = connect_qps(&mut a, &mut b, &o).expect("connect");
            // 16 KiB at path MTU 1024: 16 WRITE packets of 1084 bytes through the 1280 link.
            let (ws, rs, same) = write_and_read(&mut a, &mut b, &ea, &eb, &o, 16 << 10, q);
            assert_eq!(
                (ws, rs, same),
                (0, 0, true),
                "QP pair {q}: WRITE, READ, bytes"
            );
            want.push((ea.qp.qpn, eb.qp.qpn, rc_udp_sport(0, ea.qp.qpn, eb.qp.qpn)));
        }
        let seen = roce_frames(&cap.frames(Duration::from_secs(2)));
        for &(qa, qb, port) in &want {
            let to_b: Vec<_> = seen.iter().filter(|f| f.1 == qb).collect();
            let to_a: Vec<_> = seen.iter().filter(|f| f.1 == qa).collect();
            assert!(
                to_b.len() >= 17 && !to_a.is_empty(),
                "QP {qa:#x} -> {qb:#x}: {} packets to B, {} to A on the router",
                to_b.len(),
                to_a.len()
            );
            assert!(
                to_b.iter().chain(&to_a).all(|f| f.0 == port),
                "QP {qa:#x} <-> {qb:#x}: every packet from port {port:#x} (rxe's), seen {:?}",
                to_b.iter().chain(&to_a).map(|f| f.0).collect::<Vec<_>>()
            );
            assert!(
                to_b.iter().all(|f| f.2 <= 1280),
                "no packet above the path MTU"
            );
        }
        let mut ports: Vec<u16> = want.iter().map(|w| w.2).collect();
        ports.dedup();
        assert_eq!(ports.len(), 3, "three QPs, three source ports: {want:x?}");
        for n in [&a, &b] {
            let t = n.daemon.counters().unwrap();
            let opened = json_u64(&t, "transport", "tx_sport_sockets").unwrap();
            let fallback = json_u64(&t, "transport", "tx_sport_fallback").unwrap();
            assert!(
                opened >= 3 && fallback == 0,
                "{opened} sockets, {fallback} fallbacks"
            );
        }
        eprintln!("source ports per QP pair: {want:x?}");
    });
}

#[test]
fn a_path_mtu_below_the_ports_is_named_and_a_port_mtu_that_fits_crosses() {
    run(
        "a_path_mtu_below_the_ports_is_named_and_a_port_mtu_that_fits_crosses",
        || {
            let h = hosts(1000);
            let o = ConnOpts {
                timeout: 8,
                retry_cnt: 3,
                ..ConnOpts::default()
            };
            {
                // The default --mtu 1500: path MTU 1024, packets of 1084 bytes. The router
                // cannot forward them (DF) and says so; host A's kernel learns path MTU 1000
                // and refuses the retries; the WRITE fails.
                let mut a = node_in(&h.a, A, &[]);
                let mut b = node_in(&h.b, B, &[]);
                let (ea, eb) = connect_qps(&mut a, &mut b, &o).expect("connect");
                let (ws, _, _) = write_and_read(&mut a, &mut b, &ea, &eb, &o, 8 << 10, 1);
                assert_ne!(
                    ws, 0,
                    "a WRITE whose packets exceed the path cannot succeed"
                );
                let log = a.daemon.log();
                let hint = format!("the path MTU to {B} is 1000");
                assert!(
                    log.contains(&hint) && log.contains("--mtu 1000 or less"),
                    "the log names the path MTU and the --mtu that fits:\n{log}"
                );
            }
            // --mtu 1000 on both hosts: path MTU 512, every byte across.
            let mut a = node_in(&h.a, A, &["--mtu", "1000"]);
            let mut b = node_in(&h.b, B, &["--mtu", "1000"]);
            let o = ConnOpts {
                mtu: Mtu::M512,
                ..o
            };
            let (ea, eb) = connect_qps(&mut a, &mut b, &o).expect("connect");
            let (ws, rs, same) = write_and_read(&mut a, &mut b, &ea, &eb, &o, 64 << 10, 2);
            assert_eq!(
                (ws, rs, same),
                (0, 0, true),
                "WRITE, READ, bytes at --mtu 1000"
            );
        },
    );
}
