//! A source-port socket whose buffer is full (the udp transport sends each QP's packets from a
//! socket bound to its own UDP source port, `transport::sport`): the transport names that
//! socket as the one to wait for (`blocked_port_fd`), not the bound one, whose buffer has
//! room — so the worker and the I/O thread sleep until that socket drains instead of
//! spinning on the bound socket's writability. Inside a network namespace the test creates: a
//! veth pair whose sending end is slowed to 50 Mbit/s (tbf, its queue larger than the socket
//! buffer), so the packets sent stay accounted to their socket, then drain.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::time::{Duration, Instant};

use common::run;
use rxe_core::device::Transmit;
use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};
use rxe_core::Gid;
use vhost_user_rdma::transport::sink::PacketSink;
use vhost_user_rdma::transport::udp::UdpTransport;
use vur_testguest::netns;

mod common;

const MAC_A: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x1a];
const MAC_B: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x1b];
const PORT: u16 = 0xc123;

/// Whether `fd` can take a datagram within `ms` milliseconds.
fn writable(fd: i32, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLOUT != 0 }
}

fn push(t: &mut UdpTransport, dst: Gid, psn: u32) {
    let buf = t.next_buf();
    let bth = BthRepr::new(Opcode::UD_SEND_ONLY, 0x21, psn, false);
    let (n, _) = emit(buf, &bth, &ExtRepr::default(), 1024).unwrap();
    t.push(&Transmit {
        len: n,
        src: t.gid(),
        dst,
        sport: PORT,
        traffic_class: 0,
        hop_limit: 64,
        flow_label: 0,
        dmac: [0; 6],
        qpn: rxe_core::Qpn(0x21),
    });
}

#[test]
fn a_full_source_port_socket_is_the_one_waited_for() {
    run("a_full_source_port_socket_is_the_one_waited_for", || {
        netns::veth_pair("vsa", MAC_A, "vsb", MAC_B).expect("veth pair");
        for c in [
            vec!["addr", "add", "10.79.7.1/24", "dev", "vsa"],
            vec!["addr", "add", "10.79.7.2/24", "dev", "vsb"],
            vec![
                "neigh",
                "add",
                "10.79.7.3",
                "lladdr",
                "02:79:00:00:00:1c",
                "dev",
                "vsa",
            ],
        ] {
            netns::ip(&c).unwrap();
        }
        let tc = std::process::Command::new("tc")
            .args([
                "qdisc", "add", "dev", "vsa", "root", "tbf", "rate", "50mbit",
            ])
            .args(["burst", "1600", "limit", "100000000"])
            .status()
            .expect("tc");
        assert!(tc.success(), "tbf on vsa");
        let mut t = UdpTransport::bind("10.79.7.1:4791".parse().unwrap(), 4791, true).unwrap();
        t.set_source_ports(16);
        // To an address on the link that takes nothing: the packets queue at 50 Mbit/s.
        let dst = Gid::from_ip("10.79.7.3".parse().unwrap());
        let mut psn = 0;
        while !t.blocked() && psn < 100_000 {
            push(&mut t, dst, psn);
            psn += 1;
            if psn % 16 == 0 {
                t.flush();
            }
        }
        assert!(
            t.blocked(),
            "{psn} packets of 1 KiB and the socket never filled: {:?}",
            t.all_stats()
        );
        let port = t
            .blocked_port_fd()
            .expect("the source-port socket is the full one, not the bound one");
        assert_ne!(port, t.fd());
        assert!(writable(t.fd(), 0), "the bound socket has room");
        assert!(!writable(port, 0), "the source-port socket has none");
        // At 50 Mbit/s it drains: writable again within seconds, and the held packets go.
        let end = Instant::now() + Duration::from_secs(30);
        assert!(
            writable(port, 30_000),
            "the source-port socket never drained"
        );
        while t.blocked() {
            assert!(Instant::now() < end, "the held packets never left");
            if writable(t.blocked_port_fd().unwrap_or(t.fd()), 1000) {
                t.flush();
            }
        }
        assert_eq!(t.blocked_port_fd(), None);
        eprintln!("the source-port socket filled after {psn} packets and drained");
    });
}
