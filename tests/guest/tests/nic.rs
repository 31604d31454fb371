//! The daemon as a guest's RoCE NIC (`--net-socket`): its virtio-net and its virtio-rdma
//! device on one host interface, inside a network namespace each test creates (a veth pair:
//! the daemon on `vh0`, the namespace's kernel on `vp0` with 10.79.0.1/24).
//!
//! The test plays the guest: a virtio-net driver ([`NetGuest`]) with a tiny IP stack that
//! answers ARP and ping for 10.79.0.2, and the RDMA test guest on the same daemon.
//!
//! - ping from the kernel: ARP and ICMP pass both ways through the virtio-net rings, the
//!   kernel learns the guest's MAC from the guest (not from the daemon);
//! - UDP from the kernel to the guest: the checksum the kernel left partial is finished by
//!   the daemon for a guest without GUEST_CSUM, and handed over as NEEDS_CSUM to one with it;
//!   a datagram the guest sends with NEEDS_CSUM reaches the kernel's socket;
//! - RC SEND, WRITE and READ between the guest's RDMA device (GID 10.79.0.2) and a udp
//!   daemon on 10.79.0.1: the RoCE frames never reach the guest's virtio-net, everything
//!   else (ARP) does; once the guest deletes the GID, UDP 4791 to it is its stack's again;
//! - UD multicast: a datagram the udp daemon sends to a group reaches the guest's UD QP
//!   attached to it, and a datagram the guest sends to a group leaves with the group's
//!   Ethernet address, the guest's own IP and MAC;
//! - bad transmit buffers are refused and counted, and the device goes on; a transmit ring
//!   whose index the guest made nonsense does not keep the daemon busy: receiving goes on.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{bin, run, send_write_read};
use rxe_core::verbs::*;
use vur_testguest::net::*;
use vur_testguest::netns;
use vur_testguest::*;

mod common;

const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0x79, 0, 2];
const HOST_MAC: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x0a];
const PEER_MAC: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x0b];
const GUEST_IP: [u8; 4] = [10, 79, 0, 2];
const PEER_IP: [u8; 4] = [10, 79, 0, 1];

/// The veth pair, the peer's address, and the NIC daemon on `vh0`; returns the daemon and
/// its virtio-net socket.
fn nic_daemon() -> (Daemon, PathBuf) {
    nic_daemon_mtu(1500)
}

/// [`nic_daemon`] with both ends of the veth at `mtu`.
fn nic_daemon_mtu(mtu: u32) -> (Daemon, PathBuf) {
    netns::veth_pair("vh0", HOST_MAC, "vp0", PEER_MAC).expect("veth pair");
    if mtu != 1500 {
        for dev in ["vh0", "vp0"] {
            netns::ip(&["link", "set", dev, "mtu", &mtu.to_string()]).unwrap();
        }
    }
    netns::ip(&["addr", "add", "10.79.0.1/24", "dev", "vp0"]).unwrap();
    // One path per test: the tests of this file run side by side in one process.
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let net = std::env::temp_dir().join(format!("vur-nic-{}-{n}.sock", std::process::id()));
    let guest_mac = netns::mac_str(GUEST_MAC);
    // The guest's address is given: the stack of these tests answers ARP and ping without
    // adding it to an RDMA device's GID table.
    let args = [
        "--iface",
        "vh0",
        "--mac",
        &guest_mac,
        "--net-socket",
        net.to_str().unwrap(),
        "--net-addr",
        "10.79.0.2",
    ];
    let d = Daemon::spawn(bin(), "10.79.0.2:4791".parse().unwrap(), &args).expect("daemon");
    (d, net)
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Runs [`guest_stack`] on a thread; stop it with the flag, get the guest back by joining.
fn start_stack(
    g: NetGuest,
) -> (
    Arc<AtomicBool>,
    Arc<Mutex<Seen>>,
    std::thread::JoinHandle<NetGuest>,
) {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (s, n) = (stop.clone(), seen.clone());
    let t = std::thread::spawn(move || guest_stack(g, GUEST_IP, GUEST_MAC, s, n));
    (stop, seen, t)
}

fn net_counter(d: &Daemon, key: &str) -> u64 {
    let c = d.counters().expect("counters");
    json_u64(&c, "net", key).unwrap_or_else(|| panic!("no net.{key} in {c}"))
}

fn transport_counter(d: &Daemon, key: &str) -> u64 {
    let c = d.counters().expect("counters");
    json_u64(&c, "transport", key).unwrap_or_else(|| panic!("no transport.{key} in {c}"))
}

fn neighbour_of(ip: &str) -> String {
    let o = Command::new("ip")
        .args(["neigh", "show", ip, "dev", "vp0"])
        .output()
        .expect("ip neigh");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn the_guest_answers_arp_and_ping_through_its_virtio_net() {
    run(
        "the_guest_answers_arp_and_ping_through_its_virtio_net",
        || {
            let (d, net) = nic_daemon();
            let g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
            let (stop, seen, t) = start_stack(g);
            let out = Command::new("ping")
                .args(["-c", "3", "-i", "0.2", "-W", "5", "10.79.0.2"])
                .output()
                .expect("ping");
            stop.store(true, Ordering::Relaxed);
            t.join().expect("guest stack");
            assert!(
                out.status.success(),
                "ping 10.79.0.2: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            let s = seen.lock().unwrap();
            assert!(s.arp_requests >= 1, "{s:?}");
            assert_eq!(s.pings, 3, "{s:?}");
            assert!(
                neighbour_of("10.79.0.2").contains(&netns::mac_str(GUEST_MAC)),
                "the kernel's entry for the guest: {}",
                neighbour_of("10.79.0.2")
            );
            // The guest answered, not the daemon's raw transport.
            assert_eq!(transport_counter(&d, "arp_replies"), 0);
            assert!(
                net_counter(&d, "tx_frames") >= 4,
                "ARP reply and 3 echo replies"
            );
            assert!(net_counter(&d, "rx_frames") >= 4);
            for k in ["tx_bad", "tx_dropped", "rx_dropped", "faults", "rx_errors"] {
                assert_eq!(net_counter(&d, k), 0, "net.{k}");
            }
        },
    );
}

/// A datagram from the kernel on vp0 to the guest's port 9000; returns what the guest got.
fn udp_to_guest(d: &Daemon, g: NetGuest, payload: &[u8]) -> (NetGuest, Received) {
    let (stop, seen, t) = start_stack(g);
    let s = UdpSocket::bind("10.79.0.1:0").unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let got = loop {
        // Until the kernel has resolved the guest (the first datagram waits for ARP).
        s.send_to(payload, "10.79.0.2:9000").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        if let Some(r) = seen.lock().unwrap().udp.first().cloned() {
            break r;
        }
        assert!(
            Instant::now() < end,
            "no datagram reached the guest: {:?}, counters {}",
            seen.lock().unwrap(),
            d.counters().unwrap_or_default()
        );
    };
    stop.store(true, Ordering::Relaxed);
    (t.join().expect("guest stack"), got)
}

#[test]
fn checksums_the_kernel_left_partial_are_finished_or_handed_over() {
    run(
        "checksums_the_kernel_left_partial_are_finished_or_handed_over",
        || {
            let (d, net) = nic_daemon();
            let payload: Vec<u8> = (0..301u32).map(|i| (i * 13) as u8).collect();
            // A guest without GUEST_CSUM: a complete, right checksum and no flag.
            let g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
            let (g, r) = udp_to_guest(&d, g, &payload);
            let f = &r.frame;
            assert_eq!(r.hdr[0], 0, "flags for a guest without GUEST_CSUM");
            assert_eq!(&f[42..], &payload[..]);
            let pseudo: u32 = [&f[26..28], &f[28..30], &f[30..32], &f[32..34]]
                .iter()
                .map(|w| be16(w, 0) as u32)
                .sum::<u32>()
                + 17
                + (f.len() - 34) as u32;
            assert_eq!(csum(&f[34..], pseudo), 0, "UDP checksum verifies");
            let done = net_counter(&d, "rx_csum_done");
            assert!(
                done >= 1,
                "the kernel left the checksum partial; the daemon finished it"
            );
            drop(g);
            // The same to a guest with GUEST_CSUM: NEEDS_CSUM, where the checksum is.
            std::thread::sleep(Duration::from_millis(200));
            let want = (1 << VIRTIO_NET_F_GUEST_CSUM) | (1 << VIRTIO_NET_F_CSUM);
            let g = NetGuest::connect(&net, want, 64, 2048).expect("virtio-net again");
            assert_ne!(g.acked & (1 << VIRTIO_NET_F_GUEST_CSUM), 0);
            let (mut g, r) = udp_to_guest(&d, g, &payload);
            assert_eq!(r.hdr[0] & 1, 1, "NEEDS_CSUM for a guest with GUEST_CSUM");
            let start = u16::from_le_bytes([r.hdr[6], r.hdr[7]]);
            let off = u16::from_le_bytes([r.hdr[8], r.hdr[9]]);
            assert_eq!((start, off), (34, 6), "UDP checksum at 34 + 6");
            assert_eq!(
                net_counter(&d, "rx_csum_done"),
                done,
                "none finished for it"
            );
            // And back: the guest leaves its checksum to the host (pseudo-header sum only).
            let sock = UdpSocket::bind("10.79.0.1:9001").unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut e = r.frame.clone();
            e[..6].copy_from_slice(&r.frame[6..12]);
            e[6..12].copy_from_slice(&GUEST_MAC);
            e[26..30].copy_from_slice(&GUEST_IP);
            e[30..34].copy_from_slice(&PEER_IP);
            e[34..36].copy_from_slice(&9000u16.to_be_bytes());
            e[36..38].copy_from_slice(&9001u16.to_be_bytes());
            let pseudo = 0x0a4f + 0x0002 + 0x0a4f + 0x0001 + 17 + (e.len() - 34) as u32;
            e[40..42].copy_from_slice(&(!csum(&[], pseudo)).to_be_bytes());
            let mut hdr = [0u8; HDR];
            hdr[0] = 1; // NEEDS_CSUM
            hdr[6..8].copy_from_slice(&34u16.to_le_bytes());
            hdr[8..10].copy_from_slice(&6u16.to_le_bytes());
            g.send(hdr, &e).expect("send");
            let mut buf = [0u8; 2048];
            let (n, from) = sock
                .recv_from(&mut buf)
                .expect("the kernel took the guest's datagram (its checksum was finished)");
            assert_eq!(&buf[..n], &payload[..]);
            assert_eq!(from, "10.79.0.2:9000".parse::<SocketAddr>().unwrap());
        },
    );
}

#[test]
fn roce_to_the_guests_address_ends_in_its_rdma_device() {
    run("roce_to_the_guests_address_ends_in_its_rdma_device", || {
        let (d, net) = nic_daemon();
        let g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
        let (stop, seen, t) = start_stack(g);
        // The guest's RDMA device, its GID the guest's address.
        let mut guest = Guest::connect(&d.socket, GuestOpts::default()).expect("rdma guest");
        let gid = rxe_core::Gid::from_ip("10.79.0.2".parse().unwrap());
        guest.add_gid(0, gid).unwrap();
        let mut a = Node {
            daemon: d,
            guest,
            gid,
            mac: GUEST_MAC,
        };
        // A udp daemon on the peer's address: the kernel on vp0 carries its RoCE.
        let mut b = Node::start(bin(), "10.79.0.1:4791".parse().unwrap(), &[]).expect("udp node");
        b.mac = PEER_MAC;
        send_write_read(&mut a, &mut b);
        send_write_read(&mut b, &mut a);
        // A stray datagram to port 4791 of the guest's GID: the device's (and dropped there).
        // Waited for until the device's transport has counted it as a drop: from then on
        // the negative check below is not vacuous (a frame goes to one side, never both).
        let drops = |d: &Daemon| -> u64 {
            [
                "rx_short",
                "rx_bad_udp",
                "rx_not_ours",
                "rx_icrc_bad",
                "rx_bad_ip",
            ]
            .iter()
            .map(|k| transport_counter(d, k))
            .sum()
        };
        let before = drops(&a.daemon);
        let stray = UdpSocket::bind("10.79.0.1:0").unwrap();
        stray.send_to(b"not RoCE", "10.79.0.2:4791").unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        while drops(&a.daemon) == before {
            assert!(
                Instant::now() < end,
                "the stray datagram to the GID's port 4791 was not dropped by the device in 60 s"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            seen.lock().unwrap().roce,
            0,
            "RoCE frames reached the virtio-net"
        );
        // Once the guest deletes the GID, port 4791 of that address is its stack's again.
        a.guest.del_gid(0).unwrap();
        let end = Instant::now() + Duration::from_secs(60);
        while seen.lock().unwrap().roce == 0 {
            assert!(
                Instant::now() < end,
                "the datagram never reached the virtio-net"
            );
            stray.send_to(b"not RoCE", "10.79.0.2:4791").unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        t.join().expect("guest stack");
        let s = seen.lock().unwrap();
        assert!(
            s.arp_requests >= 1,
            "the kernel asked the guest for its MAC: {s:?}"
        );
        assert!(transport_counter(&a.daemon, "rx_icrc_ok") > 0);
        assert_eq!(transport_counter(&a.daemon, "arp_replies"), 0);
        assert_eq!(transport_counter(&a.daemon, "rx_icrc_bad"), 0);
    });
}

#[test]
fn bad_transmit_buffers_are_refused_and_counted() {
    run("bad_transmit_buffers_are_refused_and_counted", || {
        let (d, net) = nic_daemon();
        let mut g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
        let a = g.tx_area();
        // Shorter than a header and an Ethernet header; longer than any frame; outside
        // guest memory; a device-writable buffer.
        g.send_chain(&[(a, 20, false)]).expect("short");
        g.send_chain(&[(a, 70_000, false)]).expect("long");
        g.send_chain(&[(1 << 40, 100, false)]).expect("outside");
        g.send_chain(&[(a, 100, true)]).expect("writable");
        assert_eq!(net_counter(&d, "tx_frames"), 0);
        assert!(net_counter(&d, "tx_bad") + net_counter(&d, "faults") >= 4);
        // Still a working NIC: a gratuitous ARP reaches the kernel.
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&GUEST_MAC);
        arp.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
        arp.extend_from_slice(&GUEST_MAC);
        arp.extend_from_slice(&GUEST_IP);
        arp.extend_from_slice(&[0xff; 6]);
        arp.extend_from_slice(&GUEST_IP);
        g.send([0; HDR], &arp).expect("gratuitous ARP");
        assert_eq!(net_counter(&d, "tx_frames"), 1);
    });
}

#[test]
fn a_broken_transmit_ring_stalls_nothing_but_itself() {
    run("a_broken_transmit_ring_stalls_nothing_but_itself", || {
        let (d, net) = nic_daemon();
        let mut g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
        g.break_tx_ring(5000);
        // The worker that serves the broken queue still delivers what arrives.
        let (_g, r) = udp_to_guest(&d, g, b"still here");
        assert_eq!(&r.frame[42..], b"still here");
    });
}

#[test]
fn ud_multicast_both_ways() {
    run("ud_multicast_both_ways", || {
        let (d, net) = nic_daemon();
        // The kernel on vp0 sends multicast out of vp0.
        netns::ip(&["route", "add", "224.0.0.0/4", "dev", "vp0"]).unwrap();
        let g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
        let (stop, seen, t) = start_stack(g);
        let mut guest = Guest::connect(&d.socket, GuestOpts::default()).expect("rdma guest");
        let gid = rxe_core::Gid::from_ip("10.79.0.2".parse().unwrap());
        guest.add_gid(0, gid).unwrap();
        let mut a = Node {
            daemon: d,
            guest,
            gid,
            mac: GUEST_MAC,
        };
        let mut b = Node::start(bin(), "10.79.0.1:4791".parse().unwrap(), &[]).expect("udp node");
        let group = rxe_core::Gid::from_ip("239.1.2.3".parse().unwrap());
        let group_mac = [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03];
        let ud = ConnOpts {
            qp_type: QpType::Ud,
            ..Default::default()
        };
        let ud_end = |n: &mut Node| {
            let pd = n.guest.alloc_pd().unwrap();
            let cq = n.guest.create_cq(64).unwrap();
            let qp = n
                .guest
                .create_qp(QpType::Ud, pd, &cq, &cq, None, ud.cap)
                .unwrap();
            bring_up(&mut n.guest, &qp, group, 0, &ud).unwrap();
            let mr = n.guest.reg_mr(pd, 4096, Access::LOCAL_WRITE).unwrap();
            (qp, cq, mr)
        };
        let (qa, cqa, mra) = ud_end(&mut a);
        let (qb, cqb, mrb) = ud_end(&mut b);
        // a joins the group (what ib_attach_mcast does for the guest's kernel).
        let mut c = Vec::new();
        c.extend_from_slice(&qa.qpn.to_le_bytes());
        c.extend_from_slice(&0u32.to_le_bytes());
        c.extend_from_slice(&group.0);
        a.guest.cmd(abi::op::ATTACH_MCAST, &c).expect("attach");
        a.guest
            .post_recv(
                &qa,
                &RecvWr {
                    wr_id: 7,
                    sg_list: vec![mra.sge(0, 4096)].into(),
                },
            )
            .unwrap();
        let to_group = || UdDest {
            av: Av {
                dgid: group,
                sgid_index: 0,
                hop_limit: 1,
                dmac: group_mac,
                ..Default::default()
            },
            remote_qpn: rxe_core::Qpn(0xff_ffff),
            remote_qkey: 0x1111_1111,
        };
        // b → the group → a
        mrb.write(0, b"to the group");
        let mut wr = SendWr::new(1, SendOp::Send, vec![mrb.sge(0, 12)]);
        wr.ud = Some(to_group());
        b.guest.post_send(&qb, &wr).unwrap();
        assert_eq!(common::one(&mut b.guest, &cqb).status, 0);
        let w = common::one(&mut a.guest, &cqa);
        assert_eq!((w.wr_id, w.status, w.byte_len), (7, 0, 40 + 12));
        assert_eq!(mra.to_vec(40, 12), b"to the group");
        // a → the group: on the wire from the guest's MAC and address to the group's.
        let cap = netns::Capture::open("vp0").expect("capture");
        mra.write(0, b"from the guest");
        let mut wr = SendWr::new(2, SendOp::Send, vec![mra.sge(0, 14)]);
        wr.ud = Some(to_group());
        a.guest.post_send(&qa, &wr).unwrap();
        assert_eq!(common::one(&mut a.guest, &cqa).status, 0);
        let frames = cap.frames(Duration::from_secs(1));
        let f = frames
            .iter()
            .find(|f| f.len() > 42 && be16(f, 12) == 0x0800 && be16(f, 36) == 4791)
            .expect("the guest's multicast datagram on the wire");
        assert_eq!(f[..6], group_mac);
        assert_eq!(f[6..12], GUEST_MAC);
        assert_eq!(f[26..30], GUEST_IP);
        assert_eq!(f[30..34], [239, 1, 2, 3]);
        stop.store(true, Ordering::Relaxed);
        t.join().expect("guest stack");
        assert_eq!(
            seen.lock().unwrap().roce,
            0,
            "multicast RoCE reached the virtio-net"
        );
    });
}

/// The MTU a VMM gives its guest (QEMU's `host_mtu`: VIRTIO_NET_F_MTU and NET_SET_MTU) is
/// the host interface's at most: 9000 on a 1500 veth is refused (QEMU then fails to start
/// the device, rather than the guest sending frames the interface drops); on a 9000 veth it
/// is taken, shown in the counters, and 8000-byte pings pass both ways through mergeable
/// receive buffers of 2 KiB.
#[test]
fn the_mtu_a_vmm_sets_is_the_interfaces_at_most() {
    run("the_mtu_a_vmm_sets_is_the_interfaces_at_most", || {
        let (d, net) = nic_daemon();
        assert_eq!(
            net_counter(&d, "mtu"),
            0,
            "no MTU before a frontend sets one"
        );
        match NetGuest::connect_mtu(&net, 0, 64, 2048, Some(9000)) {
            Err(Error::BadStatus(1)) => {}
            Err(e) => panic!("MTU 9000 over a 1500 interface: {e}"),
            Ok(_) => panic!("MTU 9000 over a 1500 interface was taken"),
        }
        assert_eq!(net_counter(&d, "mtu"), 0, "a refused MTU is not kept");
        let g = NetGuest::connect_mtu(&net, 0, 64, 2048, Some(1500)).expect("MTU 1500");
        assert_ne!(
            g.acked & (1 << VIRTIO_NET_F_MTU),
            0,
            "VIRTIO_NET_F_MTU offered"
        );
        assert_eq!(net_counter(&d, "mtu"), 1500);
        drop(g);
        drop(d);

        // Jumbo frames: both ends of the veth at 9000, the daemon started after.
        netns::ip(&["link", "del", "vh0"]).unwrap();
        let (d, net) = nic_daemon_mtu(9000);
        let g = NetGuest::connect_mtu(&net, 1 << VIRTIO_NET_F_MRG_RXBUF, 64, 2048, Some(9000))
            .expect("MTU 9000 over a 9000 interface");
        assert_eq!(net_counter(&d, "mtu"), 9000);
        let (stop, seen, t) = start_stack(g);
        let out = Command::new("ping")
            .args([
                "-c",
                "2",
                "-i",
                "0.2",
                "-W",
                "5",
                "-M",
                "do",
                "-s",
                "8000",
                "10.79.0.2",
            ])
            .output()
            .expect("ping");
        stop.store(true, Ordering::Relaxed);
        t.join().expect("guest stack");
        assert!(
            out.status.success(),
            "ping -s 8000 10.79.0.2: {}{}; counters {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            d.counters().unwrap_or_default()
        );
        assert_eq!(seen.lock().unwrap().pings, 2);
        for k in ["tx_bad", "tx_dropped", "rx_dropped", "faults", "rx_errors"] {
            assert_eq!(net_counter(&d, k), 0, "net.{k}");
        }
    });
}

/// cloud-hypervisor's vhost-user-net frontend (`--net vhost_user=true,socket=…`), replayed
/// message for message ([`vur_testguest::cloud_hypervisor`]): VM creation, activation with
/// what a Linux virtio_net driver acks, ping through the rings; then a guest reset
/// (SET_VRING_ENABLE 0 and GET_VRING_BASE per ring) and a second activation on the same
/// connection with fresh rings, ping again.
#[test]
fn cloud_hypervisors_vhost_user_net_frontend() {
    use vur_testguest::cloud_hypervisor::{GenericVhostUserDevice, Msg, LINUX_NET_FEATURES};
    run("cloud_hypervisors_vhost_user_net_frontend", || {
        let (d, net) = nic_daemon();
        let mut dev =
            GenericVhostUserDevice::create_net(&net, Duration::from_secs(10)).expect("create");
        let agreed = vhost::vhost_user::message::VhostUserProtocolFeatures::REPLY_ACK
            | vhost::vhost_user::message::VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS;
        assert_eq!(
            dev.log,
            [
                Msg::Connect,
                Msg::SetOwner,
                Msg::GetFeatures,
                Msg::GetProtocolFeatures,
                Msg::SetProtocolFeatures(agreed.bits()),
            ],
            "no MQ (no GET_QUEUE_NUM), no CONFIG (no GET_CONFIG)"
        );
        let features = dev.guest_features(LINUX_NET_FEATURES);
        for (bit, name) in [
            (VIRTIO_NET_F_MRG_RXBUF, "MRG_RXBUF"),
            (VIRTIO_NET_F_MTU, "MTU"),
            (VIRTIO_NET_F_CSUM, "CSUM"),
            (VIRTIO_NET_F_GUEST_CSUM, "GUEST_CSUM"),
        ] {
            assert_ne!(features & (1 << bit), 0, "{name} agreed");
        }
        assert_eq!(
            features & (1 << 17),
            0,
            "no CTRL_VQ: the backend offers none, and cloud-hypervisor then adds no control queue"
        );
        let event_idx = features & (1 << 29) != 0;
        let ram = GuestRam::new(32 << 20).unwrap();
        for round in 0..2 {
            let rx = Virtq::new(&ram, 256, event_idx).unwrap();
            let tx = Virtq::new(&ram, 256, event_idx).unwrap();
            let at = dev.log.len();
            dev.activate(&ram, LINUX_NET_FEATURES, &[(0, &rx), (1, &tx)])
                .unwrap_or_else(|e| panic!("activation {round}: {e}"));
            assert!(
                matches!(dev.log[at], Msg::SetFeatures(f) if f & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0)
            );
            assert_eq!(
                dev.log[dev.log.len() - 2..],
                [Msg::SetVringEnable(0, true), Msg::SetVringEnable(1, true)]
            );
            let fe = dev.frontend().clone();
            let g = NetGuest::from_parts(fe, ram.clone(), rx, tx, features, 64, 2048).unwrap();
            let (stop, seen, t) = start_stack(g);
            let out = Command::new("ping")
                .args(["-c", "2", "-i", "0.2", "-W", "5", "10.79.0.2"])
                .output()
                .expect("ping");
            stop.store(true, Ordering::Relaxed);
            t.join().expect("guest stack");
            assert!(
                out.status.success(),
                "activation {round}: ping 10.79.0.2: {}; counters {}",
                String::from_utf8_lossy(&out.stdout),
                d.counters().unwrap_or_default()
            );
            assert_eq!(seen.lock().unwrap().pings, 2, "activation {round}");
            if round == 0 {
                let bases = dev.reset().expect("reset");
                assert_eq!(bases.len(), 2, "GET_VRING_BASE for RX and TX");
            }
        }
        for k in ["tx_bad", "tx_dropped", "faults", "rx_errors"] {
            assert_eq!(net_counter(&d, k), 0, "net.{k}");
        }
    });
}
