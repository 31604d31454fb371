//! The raw transport (`--iface`) end to end, inside a network namespace each test creates:
//! a veth pair with both ends in it, daemons on its ends, test guests on the daemons.
//!
//! - two raw daemons (one with each receive ring): RC SEND, WRITE and READ, and the frames
//!   on the wire carry the MACs and addresses expected (captured on the veth);
//! - a raw daemon and a udp daemon (`--udp-addr` on an address the namespace's kernel holds):
//!   the raw daemon's frames are RoCEv2 the kernel's UDP stack takes, and back, the kernel
//!   finding the raw daemon's MAC by ARP (the daemon answers for its addresses);
//! - the errors an operator meets: no such interface, interface down, no CAP_NET_RAW.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::{bin, run, send_write_read};
use vur_testguest::netns::{self, Capture};
use vur_testguest::*;

mod common;

const MAC_A: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x0b];

fn raw_node(iface: &str, mac: [u8; 6], ip: &str, ring: &str) -> Node {
    let addr = SocketAddr::new(ip.parse().unwrap(), 4791);
    let args = ["--iface", iface, "--raw-addr", ip, "--raw-ring", ring];
    let mut n = Node::start(bin(), addr, &args).expect("raw node");
    n.mac = mac;
    n
}

fn counter(n: &Node, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, "transport", key).unwrap_or_else(|| panic!("no {key} in {c}"))
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[test]
fn two_raw_daemons_over_a_veth_pair() {
    run("two_raw_daemons_over_a_veth_pair", || {
        netns::veth_pair("vra", MAC_A, "vrb", MAC_B).expect("veth pair");
        let cap = Capture::open("vrb").expect("capture socket");
        let mut a = raw_node("vra", MAC_A, "10.79.0.1", "v3");
        let mut b = raw_node("vrb", MAC_B, "10.79.0.2", "v2");
        send_write_read(&mut a, &mut b);
        // What went from a to b on the wire: Ethernet from MAC_A to MAC_B, IPv4 with a
        // right header checksum, ID 0 and DF, from 10.79.0.1 to 10.79.0.2, UDP to 4791.
        let frames = cap.frames(Duration::from_secs(1));
        let roce: Vec<&Vec<u8>> = frames
            .iter()
            .filter(|f| f.len() > 42 && be16(f, 12) == 0x0800 && f[23] == 17)
            .collect();
        assert!(roce.len() >= 64 + 3, "captured {} RoCE frames", roce.len());
        let mut from_a = 0;
        for f in &roce {
            assert_eq!(be16(f, 36), 4791, "UDP destination port");
            assert_eq!(f[14], 0x45);
            assert_eq!(be16(f, 16) as usize, f.len() - 14, "IP total length");
            let mut sum = 0u32;
            for w in f[14..34].chunks(2) {
                sum += be16(w, 0) as u32;
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            assert_eq!(sum, 0xffff, "IPv4 header checksum");
            if f[..6] == MAC_B {
                from_a += 1;
                assert_eq!(f[6..12], MAC_A);
                assert_eq!(f[26..30], [10, 79, 0, 1]);
                assert_eq!(f[30..34], [10, 79, 0, 2]);
                assert_eq!(be16(f, 18), 0, "IP ID");
                assert_eq!(be16(f, 20), 0x4000, "DF, no fragment");
                assert_eq!(be16(f, 38) as usize, f.len() - 34, "UDP length");
                assert_ne!(be16(f, 34), 0, "UDP source port");
            } else {
                assert_eq!(f[..6], MAC_A);
                assert_eq!(f[6..12], MAC_B);
                assert_eq!(f[26..30], [10, 79, 0, 2]);
            }
        }
        assert!(from_a >= 64, "{from_a} frames from a");
        for n in [&a, &b] {
            assert!(counter(n, "tx_packets") > 0);
            assert!(counter(n, "rx_icrc_ok") > 0);
            for k in [
                "rx_icrc_bad",
                "rx_not_ours",
                "rx_bad_ip",
                "rx_bad_udp",
                "rx_ip_checksum_bad",
                "rx_short",
                "rx_truncated",
                "tx_no_dmac",
                "tx_dropped",
            ] {
                assert_eq!(counter(n, k), 0, "{k}");
            }
        }
    });
}

#[test]
fn a_raw_daemon_and_a_udp_daemon_talk() {
    run("a_raw_daemon_and_a_udp_daemon_talk", || {
        netns::veth_pair("vua", MAC_A, "vub", MAC_B).expect("veth pair");
        // The kernel on the udp side holds 10.79.1.2 and learns the raw side's MAC by ARP,
        // which the raw daemon answers; the raw side's address is on no interface.
        netns::ip(&["addr", "add", "10.79.1.2/24", "dev", "vub"]).unwrap();
        let mut a = raw_node("vua", MAC_A, "10.79.1.1", "v2");
        let mut b = Node::start(bin(), "10.79.1.2:4791".parse().unwrap(), &[]).expect("udp node");
        b.mac = MAC_B;
        send_write_read(&mut a, &mut b);
        send_write_read(&mut b, &mut a);
        // The udp daemon verified the raw daemon's ICRCs with IP ID 0: exact, not solved.
        assert!(counter(&b, "rx_icrc_ok") > 0);
        assert_eq!(counter(&b, "rx_icrc_id_solved"), 0);
        assert_eq!(counter(&b, "rx_icrc_bad"), 0);
        assert!(counter(&a, "rx_icrc_ok") > 0);
        assert_eq!(counter(&a, "rx_icrc_bad"), 0);
        // The kernel resolved the raw daemon's address to its MAC through its ARP replies.
        assert!(
            counter(&a, "arp_replies") >= 1,
            "the raw daemon answered no ARP"
        );
        let neigh = Command::new("ip")
            .args(["neigh", "show", "10.79.1.1", "dev", "vub"])
            .output()
            .expect("ip neigh");
        let neigh = String::from_utf8_lossy(&neigh.stdout);
        assert!(
            neigh.contains(&netns::mac_str(MAC_A)),
            "the kernel's neighbour entry for 10.79.1.1: {neigh:?}"
        );
    });
}

/// A sender in this host whose UDP socket computes checksums (any kernel UDP sender but rxe and
/// the udp transport, which send 0): on a veth its checksum is left partial for an offload
/// that never runs, and the ring says so; the raw daemon takes its packets (their ICRC is
/// checked) instead of dropping them as bad UDP. A Linux host's tools reaching a guest whose
/// daemon is its NIC (libvirt.test.sh's rxe-peer) depend on it.
#[test]
fn a_raw_daemon_takes_packets_with_a_partial_udp_checksum() {
    run(
        "a_raw_daemon_takes_packets_with_a_partial_udp_checksum",
        || {
            use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};
            netns::veth_pair("vua", MAC_A, "vub", MAC_B).expect("veth pair");
            netns::ip(&["addr", "add", "10.79.1.2/24", "dev", "vub"]).unwrap();
            let a = raw_node("vua", MAC_A, "10.79.1.1", "v3");
            let sock = std::net::UdpSocket::bind("10.79.1.2:0").unwrap();
            // DF and IPv4 ID 0 (an unconnected socket), the UDP checksum computed (the default).
            let v: libc::c_int = libc::IP_PMTUDISC_DO;
            // SAFETY: setsockopt reads an int from a live local.
            let r = unsafe {
                libc::setsockopt(
                    std::os::fd::AsRawFd::as_raw_fd(&sock),
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0);
            let src = sock.local_addr().unwrap();
            let dst: SocketAddr = "10.79.1.1:4791".parse().unwrap();
            const N: u64 = 8;
            for i in 0..N as u32 {
                let mut buf = [0u8; 512];
                let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x7777, i, true);
                let (n, pr) = emit(&mut buf, &bth, &ExtRepr::default(), 256).unwrap();
                buf[pr.start..pr.end].fill(i as u8);
                rxe_core::wire::frame::icrc_for_udp_socket(src, dst, &mut buf[..n]).unwrap();
                sock.send_to(&buf[..n], dst).unwrap();
            }
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while counter(&a, "rx_icrc_ok") + counter(&a, "rx_bad_udp") < N {
                assert!(
                    std::time::Instant::now() < end,
                    "the raw daemon saw {} of {N} packets within 10 s",
                    counter(&a, "rx_icrc_ok") + counter(&a, "rx_bad_udp")
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            assert_eq!(
                (counter(&a, "rx_icrc_ok"), counter(&a, "rx_bad_udp")),
                (N, 0),
                "every packet checked by its ICRC, none dropped for its partial UDP checksum"
            );
        },
    );
}

/// The same over IPv6: the kernel finds the raw daemon's MAC by neighbour discovery, which
/// the raw daemon answers (a solicitation to its solicited-node group).
#[test]
fn a_raw_daemon_and_a_udp_daemon_talk_over_ipv6() {
    run("a_raw_daemon_and_a_udp_daemon_talk_over_ipv6", || {
        netns::veth_pair("vua", MAC_A, "vub", MAC_B).expect("veth pair");
        netns::ip(&["addr", "add", "fd79:1::2/64", "dev", "vub", "nodad"]).unwrap();
        let mut a = raw_node("vua", MAC_A, "fd79:1::1", "v2");
        let mut b = Node::start(bin(), "[fd79:1::2]:4791".parse().unwrap(), &[]).expect("udp node");
        b.mac = MAC_B;
        send_write_read(&mut a, &mut b);
        send_write_read(&mut b, &mut a);
        assert!(counter(&b, "rx_icrc_ok") > 0);
        assert_eq!(counter(&b, "rx_icrc_bad"), 0);
        assert!(counter(&a, "rx_icrc_ok") > 0);
        assert!(
            counter(&a, "nd_adverts") >= 1,
            "the raw daemon answered no solicitation"
        );
        let neigh = Command::new("ip")
            .args(["-6", "neigh", "show", "fd79:1::1", "dev", "vub"])
            .output()
            .expect("ip neigh");
        let neigh = String::from_utf8_lossy(&neigh.stdout);
        assert!(
            neigh.contains(&netns::mac_str(MAC_A)),
            "the kernel's neighbour entry for fd79:1::1: {neigh:?}"
        );
    });
}

/// Runs the daemon with `args`; returns its exit code and stderr (it must exit by itself).
fn daemon_fails(args: &[&str], drop_net_raw: bool) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("vur-raw-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = Command::new(bin());
    cmd.arg("--socket-path").arg(dir.join("s.sock")).args(args);
    if drop_net_raw {
        // SAFETY: the closure runs in the child between fork and exec and only calls
        // prctl, a plain syscall.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                const CAP_NET_RAW: libc::c_ulong = 13;
                if libc::prctl(libc::PR_CAPBSET_DROP, CAP_NET_RAW, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let out = cmd.output().expect("run the daemon");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn raw_transport_errors_say_what_is_wrong() {
    run("raw_transport_errors_say_what_is_wrong", || {
        let (code, err) = daemon_fails(&["--iface", "vnosuch", "--raw-addr", "10.79.2.1"], false);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("vnosuch: no such interface"), "{err}");
        netns::ip(&["link", "add", "vea", "type", "veth", "peer", "name", "veb"]).unwrap();
        let (code, err) = daemon_fails(&["--iface", "vea", "--raw-addr", "10.79.2.1"], false);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("the interface is down"), "{err}");
        netns::ip(&["link", "set", "vea", "up"]).unwrap();
        let (code, err) = daemon_fails(&["--iface", "vea", "--raw-addr", "10.79.2.1"], true);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("needs CAP_NET_RAW"), "{err}");
        let (code, err) = daemon_fails(
            &["--iface", "vea", "--raw-addr", "10.79.2.1", "--mtu", "9000"],
            false,
        );
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("larger than the MTU of vea"), "{err}");
        let (code, err) = daemon_fails(&["--iface", "vea"], false);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains("--raw-addr"), "{err}");
    });
}
