//! What a guest may put on the wire through its NIC (`--net-socket`), and what it gets from
//! it: the attacks of the 2026-11-28 security review (F2, F3, F7) against the daemon on a
//! veth pair in a network namespace of the test's own (the daemon on `vh0`, the kernel on
//! `vp0` with 10.79.0.1/24, a capture on `vp0`).
//!
//! - F2: the guest sends from another MAC, from an address that is not its own, with a VLAN
//!   tag, to a link-local group (LLDP), an EtherType nobody allowed, RoCEv2 to a peer
//!   `--allow-peer` refuses, ARP and ND that claim other addresses: none of it reaches `vp0`,
//!   each refusal is counted; what an address-less guest needs (DHCP from 0.0.0.0, DAD from
//!   ::, an ARP probe) and its own traffic from the addresses it holds do reach it. Its
//!   addresses are learned from its GID table (ADD_GID; DEL_GID takes one back) or given
//!   with `--net-addr`.
//! - F3: frames on `vh0` for another MAC or for `vh0`'s own MAC never reach the guest; its
//!   own, broadcast and multicast do.
//! - F7: offloads the guest did not negotiate (USO, TSO, a partial checksum) are refused
//!   before the host kernel sees them; negotiated ones pass.
//!
//! Every check waits for a fence — a frame that must pass, sent after the ones that must not —
//! so "nothing arrived" is never a matter of waiting long enough. Skipped (one line saying
//! why) when not root or without iproute2.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{bin, run};
use vur_testguest::net::*;
use vur_testguest::netns;
use vur_testguest::*;

mod common;

const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0x79, 0, 2];
const HOST_MAC: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x0a];
const PEER_MAC: [u8; 6] = [0x02, 0x79, 0, 0, 0, 0x0b];
const OTHER_MAC: [u8; 6] = [0x02, 0x66, 0, 0, 0, 0x66];
const GUEST_IP: [u8; 4] = [10, 79, 0, 2];
const PEER_IP: [u8; 4] = [10, 79, 0, 1];
const BCAST: [u8; 6] = [0xff; 6];

/// The veth pair, the peer's address, and the NIC daemon on `vh0` with `extra` options;
/// returns the daemon and its virtio-net socket.
fn nic_daemon(extra: &[&str]) -> (Daemon, PathBuf) {
    netns::veth_pair("vh0", HOST_MAC, "vp0", PEER_MAC).expect("veth pair");
    netns::ip(&["addr", "add", "10.79.0.1/24", "dev", "vp0"]).unwrap();
    // vp0's kernel stays quiet on IPv6 (no router solicitations or MLD in the capture).
    let _ = std::fs::write("/proc/sys/net/ipv6/conf/vp0/disable_ipv6", "1");
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let net = std::env::temp_dir().join(format!("vur-nicp-{}-{n}.sock", std::process::id()));
    let guest_mac = netns::mac_str(GUEST_MAC);
    let mut args = vec![
        "--iface",
        "vh0",
        "--mac",
        &guest_mac,
        "--net-socket",
        net.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let d = Daemon::spawn(bin(), "10.79.0.2:4791".parse().unwrap(), &args).expect("daemon");
    (d, net)
}

fn counters_of(d: &Daemon) -> String {
    d.counters().expect("counters")
}

fn net_counter(d: &Daemon, key: &str) -> u64 {
    let c = counters_of(d);
    json_u64(&c, "net", key).unwrap_or_else(|| panic!("no net.{key} in {c}"))
}

fn sum16(data: &[u8], mut sum: u32) -> u32 {
    for c in data.chunks(2) {
        sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An IPv4 header (DF, TTL 64, checksum right) for `proto` with `l4` behind it.
fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, proto, 0, 0];
    ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let c = fold(sum16(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip.extend_from_slice(l4);
    ip
}

/// A UDP header and `payload` (checksum 0: none, over IPv4).
fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = sport.to_be_bytes().to_vec();
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// An Ethernet frame with an IPv4 UDP datagram.
fn udp4(
    (smac, dmac): ([u8; 6], [u8; 6]),
    (src, dst): ([u8; 4], [u8; 4]),
    (sport, dport): (u16, u16),
    payload: &[u8],
) -> Vec<u8> {
    let mut f = eth(dmac, smac, 0x0800);
    f.extend_from_slice(&ipv4(src, dst, 17, &udp(sport, dport, payload)));
    f
}

/// An ARP packet (`op` 1 request, 2 reply) from `sha`/`spa` for `tpa`, `marker` as padding.
fn arp(
    dmac: [u8; 6],
    smac: [u8; 6],
    op: u16,
    (sha, spa): ([u8; 6], [u8; 4]),
    tpa: [u8; 4],
    marker: &[u8],
) -> Vec<u8> {
    let mut f = eth(dmac, smac, 0x0806);
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tpa);
    f.extend_from_slice(marker);
    f
}

/// An IPv6 ICMPv6 packet `msg` (its checksum filled in) from `src` to `dst`.
fn icmp6(dmac: [u8; 6], smac: [u8; 6], src: [u8; 16], dst: [u8; 16], msg: &[u8]) -> Vec<u8> {
    let mut f = eth(dmac, smac, 0x86dd);
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[58, 255]);
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&dst);
    let mut m = msg.to_vec();
    let pseudo = sum16(&src, 0) + sum16(&dst, 0) + msg.len() as u32 + 58;
    let c = fold(sum16(&m, pseudo));
    m[2..4].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&m);
    f
}

/// A neighbour solicitation (135) or advertisement (136) for `target`, with a link-layer
/// address option (`lla`: 1 source, 2 target) holding `mac`, then `marker` (as an option
/// of an unknown type, 8-byte aligned).
fn nd(kind: u8, target: [u8; 16], lla: u8, mac: [u8; 6], marker: &[u8; 6]) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0, 0, 0, 0, 0];
    if kind == 136 {
        m[4] = 0x20; // override
    }
    m.extend_from_slice(&target);
    m.extend_from_slice(&[lla, 1]);
    m.extend_from_slice(&mac);
    m.extend_from_slice(&[250, 1]);
    m.extend_from_slice(marker);
    m
}

fn v6(s: &str) -> [u8; 16] {
    s.parse::<std::net::Ipv6Addr>().unwrap().octets()
}

fn contains(f: &[u8], marker: &[u8]) -> bool {
    f.windows(marker.len()).any(|w| w == marker)
}

/// Every frame captured on `cap` until one holds `fence` (within 20 s: only a hang is
/// caught).
fn wire_until(cap: &netns::Capture, fence: &[u8], d: &Daemon) -> Vec<Vec<u8>> {
    let end = Instant::now() + Duration::from_secs(20);
    let mut all = Vec::new();
    loop {
        let got = cap.frames(Duration::from_millis(200));
        let done = got.iter().any(|f| contains(f, fence));
        all.extend(got);
        if done {
            return all;
        }
        assert!(
            Instant::now() < end,
            "the fence {:?} never reached vp0; counters {}",
            String::from_utf8_lossy(fence),
            d.counters().unwrap_or_default()
        );
    }
}

/// Asserts that no frame of `wire` (what vp0 or the guest got) holds one of `markers`
/// (each named by what it was).
fn none_of(wire: &[Vec<u8>], markers: &[(&str, &[u8])]) {
    let out: Vec<&str> = markers
        .iter()
        .filter(|(_, m)| wire.iter().any(|f| contains(f, m)))
        .map(|(what, _)| *what)
        .collect();
    assert!(out.is_empty(), "got through: {out:?}");
}

fn all_of(wire: &[Vec<u8>], markers: &[(&str, &[u8])]) {
    let missing: Vec<&str> = markers
        .iter()
        .filter(|(_, m)| !wire.iter().any(|f| contains(f, m)))
        .map(|(what, _)| *what)
        .collect();
    assert!(missing.is_empty(), "never got through: {missing:?}");
}

/// The guest's RDMA device on the daemon, with `gids` added (index 0 up); returns it once
/// the daemon has learned them (its `net.addrs` counter).
fn rdma_guest_with(d: &Daemon, gids: &[[u8; 4]]) -> Guest {
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).expect("rdma guest");
    for (i, ip) in gids.iter().enumerate() {
        let gid = rxe_core::Gid::from_ip(std::net::Ipv4Addr::from(*ip).into());
        g.add_gid(i as u32, gid).unwrap();
    }
    wait_addrs(d, gids.len() as u64);
    g
}

/// Waits (up to 20 s: only a hang is caught) until the daemon holds `n` learned addresses.
fn wait_addrs(d: &Daemon, n: u64) {
    let end = Instant::now() + Duration::from_secs(20);
    while json_u64(&counters_of(d), "net", "addrs") != Some(n) {
        assert!(
            Instant::now() < end,
            "the daemon did not learn {n} guest addresses; counters {}",
            counters_of(d)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A frame the guest sends: what it is, the marker its payload carries, its bytes.
type Frame = (&'static str, &'static [u8], Vec<u8>);

/// F2's frames the daemon must refuse (the guest at 10.79.0.2, `--allow-peer 10.79.0.1`).
fn refused_frames() -> Vec<Frame> {
    let me = (GUEST_MAC, PEER_MAC);
    let mine = (GUEST_IP, PEER_IP);
    vec![
        (
            "RoCEv2 to a peer --allow-peer refuses",
            b"BAD-roce-far",
            udp4(
                me,
                (GUEST_IP, [198, 51, 100, 7]),
                (49152, 4791),
                b"BAD-roce-far",
            ),
        ),
        (
            "a spoofed source MAC",
            b"BAD-src-mac",
            udp4((OTHER_MAC, PEER_MAC), mine, (9, 9), b"BAD-src-mac"),
        ),
        (
            "a spoofed source IP",
            b"BAD-src-ip",
            udp4(me, ([10, 79, 0, 250], PEER_IP), (9, 9), b"BAD-src-ip"),
        ),
        (
            "spoofed RoCEv2 (MAC and IP) to an allowed peer",
            b"BAD-roce-spoof",
            udp4(
                (OTHER_MAC, PEER_MAC),
                ([10, 79, 0, 250], PEER_IP),
                (49152, 4791),
                b"BAD-roce-spoof",
            ),
        ),
        ("a VLAN tag", b"BAD-vlan", {
            let inner = udp4(me, mine, (9, 9), b"BAD-vlan");
            let mut f = inner[..12].to_vec();
            f.extend_from_slice(&[0x81, 0x00, 0, 42]);
            f.extend_from_slice(&inner[12..]);
            f
        }),
        ("LLDP to 01:80:c2:00:00:0e", b"BAD-lldp", {
            let mut f = eth([0x01, 0x80, 0xc2, 0, 0, 0x0e], GUEST_MAC, 0x88cc);
            f.extend_from_slice(b"BAD-lldp");
            f
        }),
        ("IPv4 to a link-local group MAC", b"BAD-group", {
            udp4(
                (GUEST_MAC, [0x01, 0x80, 0xc2, 0, 0, 0]),
                mine,
                (9, 9),
                b"BAD-group",
            )
        }),
        ("an EtherType nobody allowed", b"BAD-type", {
            let mut f = eth(PEER_MAC, GUEST_MAC, 0x88b5);
            f.extend_from_slice(b"BAD-type");
            f
        }),
        (
            "ARP claiming another address",
            b"BAD-arp-ip",
            arp(
                BCAST,
                GUEST_MAC,
                2,
                (GUEST_MAC, [10, 79, 0, 1]),
                [10, 79, 0, 1],
                b"BAD-arp-ip",
            ),
        ),
        (
            "ARP claiming another MAC",
            b"BAD-arp-mac",
            arp(
                BCAST,
                GUEST_MAC,
                1,
                (OTHER_MAC, GUEST_IP),
                PEER_IP,
                b"BAD-arp-mac",
            ),
        ),
        (
            "DHCP-shaped UDP from 0.0.0.0 to another port",
            b"BAD-zero-src",
            udp4(
                (GUEST_MAC, BCAST),
                ([0; 4], [255; 4]),
                (68, 9999),
                b"BAD-zero-src",
            ),
        ),
        (
            "a neighbour advertisement for another's address",
            b"BADna",
            {
                icmp6(
                    [0x33, 0x33, 0, 0, 0, 1],
                    GUEST_MAC,
                    v6("fe80::5054:ff:fe79:2"),
                    v6("ff02::1"),
                    &nd(136, v6("fe80::1"), 2, GUEST_MAC, b"BADna\0"),
                )
            },
        ),
        ("a solicitation naming another MAC", b"BADns", {
            icmp6(
                [0x33, 0x33, 0xff, 0, 0, 1],
                GUEST_MAC,
                v6("fe80::5054:ff:fe79:2"),
                v6("ff02::1:ff00:1"),
                &nd(135, v6("fe80::1"), 1, OTHER_MAC, b"BADns\0"),
            )
        }),
    ]
}

/// F2's frames the daemon passes: an address-less guest's DHCP, ARP probe and DAD; its own
/// traffic.
fn passed_frames() -> Vec<Frame> {
    let me = (GUEST_MAC, PEER_MAC);
    let mine = (GUEST_IP, PEER_IP);
    vec![
        (
            "a DHCP discover from 0.0.0.0",
            b"OK-dhcp",
            udp4((GUEST_MAC, BCAST), ([0; 4], [255; 4]), (68, 67), b"OK-dhcp"),
        ),
        (
            "an ARP probe (sender 0.0.0.0)",
            b"OK-probe",
            arp(
                BCAST,
                GUEST_MAC,
                1,
                (GUEST_MAC, [0; 4]),
                [10, 79, 0, 77],
                b"OK-probe",
            ),
        ),
        ("duplicate address detection from ::", b"OKdad", {
            let mut m = vec![135, 0, 0, 0, 0, 0, 0, 0];
            m.extend_from_slice(&v6("fe80::5054:ff:fe79:2"));
            m.extend_from_slice(&[250, 1]);
            m.extend_from_slice(b"OKdad\0");
            icmp6(
                [0x33, 0x33, 0xff, 0x79, 0, 2],
                GUEST_MAC,
                [0; 16],
                v6("ff02::1:ff79:2"),
                &m,
            )
        }),
        (
            "a neighbour advertisement from its link-local address (its MAC's)",
            b"OK-na",
            icmp6(
                [0x33, 0x33, 0, 0, 0, 1],
                GUEST_MAC,
                v6("fe80::5054:ff:fe79:2"),
                v6("ff02::1"),
                &nd(136, v6("fe80::5054:ff:fe79:2"), 2, GUEST_MAC, b"OK-na\0"),
            ),
        ),
        (
            "a gratuitous ARP for its address",
            b"OK-garp",
            arp(
                BCAST,
                GUEST_MAC,
                2,
                (GUEST_MAC, GUEST_IP),
                GUEST_IP,
                b"OK-garp",
            ),
        ),
        (
            "RoCEv2 to the allowed peer",
            b"OK-roce-near",
            udp4(me, mine, (49152, 4791), b"OK-roce-near"),
        ),
        (
            "UDP from its address (the fence)",
            b"OK-fence",
            udp4(me, mine, (9, 9), b"OK-fence"),
        ),
    ]
}

/// F2. The guest's addresses are its GIDs: 10.79.0.2 (ADD_GID). `--allow-peer 10.79.0.1`.
#[test]
fn the_guests_nic_sends_only_from_its_own_mac_and_addresses_and_to_allowed_peers() {
    run(
        "the_guests_nic_sends_only_from_its_own_mac_and_addresses_and_to_allowed_peers",
        || {
            let (d, net) = nic_daemon(&["--allow-peer", "10.79.0.1/32"]);
            let mut g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
            let mut rdma = rdma_guest_with(&d, &[GUEST_IP]);
            let cap = netns::Capture::open("vp0").expect("capture");
            let me = (GUEST_MAC, PEER_MAC);
            let mine = (GUEST_IP, PEER_IP);
            let bad = refused_frames();
            let good = passed_frames();
            for (_, _, f) in bad.iter().chain(&good) {
                g.send([0; HDR], f).expect("transmit");
            }
            let wire = wire_until(&cap, b"OK-fence", &d);
            let named = |v: &[(&'static str, &'static [u8], Vec<u8>)]| -> Vec<(&'static str, &'static [u8])> {
                v.iter().map(|(w, m, _)| (*w, *m)).collect()
            };
            none_of(&wire, &named(&bad));
            all_of(&wire, &named(&good));
            let c = counters_of(&d);
            for (key, want) in [
                ("tx_denied_peer", 1),
                ("tx_bad_src_mac", 3),
                ("tx_bad_src_ip", 3),
                ("tx_vlan", 1),
                ("tx_l2_control", 2),
                ("tx_bad_ethertype", 1),
                ("tx_bad_nd", 2),
                ("tx_frames", good.len() as u64),
            ] {
                assert_eq!(json_u64(&c, "net", key), Some(want), "net.{key} in {c}");
            }
            // Once the guest deletes its GID the address is not its own any more.
            rdma.del_gid(0).unwrap();
            wait_addrs(&d, 0);
            g.send([0; HDR], &udp4(me, mine, (9, 9), b"BAD-deleted"))
                .unwrap();
            g.send(
                [0; HDR],
                &udp4(
                    (GUEST_MAC, BCAST),
                    ([0; 4], [255; 4]),
                    (68, 67),
                    b"OK-fence2",
                ),
            )
            .unwrap();
            let wire = wire_until(&cap, b"OK-fence2", &d);
            none_of(
                &wire,
                &[("UDP from a deleted GID's address", b"BAD-deleted")],
            );
            assert_eq!(net_counter(&d, "tx_bad_src_ip"), 4);
        },
    );
}

/// F2 with the addresses given (`--net-addr`): the guest sources from them only, whatever
/// its GID table holds, and RoCE to a GID outside them is not its RDMA device's.
#[test]
fn net_addr_is_the_guests_address_list() {
    run("net_addr_is_the_guests_address_list", || {
        let (d, net) = nic_daemon(&["--net-addr", "10.79.0.2/32,fd79::2"]);
        let mut g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
        // A GID outside the list is not the guest's (nor its RDMA device's).
        let _rdma = rdma_guest_with(&d, &[[10, 79, 0, 9]]);
        let cap = netns::Capture::open("vp0").expect("capture");
        let me = (GUEST_MAC, PEER_MAC);
        g.send(
            [0; HDR],
            &udp4(me, ([10, 79, 0, 9], PEER_IP), (9, 9), b"BAD-gid"),
        )
        .unwrap();
        g.send(
            [0; HDR],
            &udp4(me, (GUEST_IP, PEER_IP), (9, 9), b"OK-listed"),
        )
        .unwrap();
        let wire = wire_until(&cap, b"OK-listed", &d);
        none_of(
            &wire,
            &[("UDP from a GID --net-addr does not list", b"BAD-gid")],
        );
        assert_eq!(net_counter(&d, "tx_bad_src_ip"), 1);
        // UDP 4791 to that GID reaches the guest's virtio-net: the engine did not take it.
        let s = raw_sender("vp0");
        let to = |ip: [u8; 4], marker: &[u8]| {
            udp4((PEER_MAC, GUEST_MAC), (PEER_IP, ip), (49152, 4791), marker)
        };
        recv_until(&mut g, &d, &[b"OK-not-a-gid"], || {
            send_raw(&s, &to([10, 79, 0, 9], b"OK-not-a-gid"))
        });
    });
}

/// What the guest receives while `send` is called again and again, until every one of
/// `want` arrived (within 20 s: only a hang is caught; the device may not have started its
/// receive queue when the first frames come).
fn recv_until(g: &mut NetGuest, d: &Daemon, want: &[&[u8]], send: impl Fn()) -> Vec<Vec<u8>> {
    let mut got: Vec<Vec<u8>> = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while !want.iter().all(|m| got.iter().any(|f| contains(f, m))) {
        let missing: Vec<_> = want
            .iter()
            .filter(|m| !got.iter().any(|f| contains(f, m)))
            .map(|m| String::from_utf8_lossy(m))
            .collect();
        assert!(
            Instant::now() < end,
            "never reached the guest: {missing:?}; counters {}",
            d.counters().unwrap_or_default()
        );
        send();
        while let Some(r) = g.recv(Duration::from_millis(200)) {
            got.push(r.frame);
        }
    }
    got
}

/// An AF_PACKET socket on `iface` that sends whole frames.
fn raw_sender(iface: &str) -> OwnedFd {
    let name = std::ffi::CString::new(iface).unwrap();
    // SAFETY: `name` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(index, 0, "no {iface}");
    // SAFETY: plain syscall; the result is checked and owned below.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: `fd` was just created and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_ifindex = index as i32;
    // SAFETY: `sll` is a valid sockaddr_ll of the size passed; `fd` is ours.
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
    fd
}

fn send_raw(fd: &OwnedFd, f: &[u8]) {
    // SAFETY: the kernel reads `f.len()` bytes of the live slice.
    let r = unsafe { libc::send(fd.as_raw_fd(), f.as_ptr().cast(), f.len(), 0) };
    assert_eq!(
        r,
        f.len() as isize,
        "send: {}",
        std::io::Error::last_os_error()
    );
}

/// F3: frames on the interface for other MACs (another host's, the interface's own) are not
/// the guest's; its own MAC, broadcast and multicast are.
#[test]
fn the_guest_receives_only_its_own_broadcast_and_multicast_frames() {
    run(
        "the_guest_receives_only_its_own_broadcast_and_multicast_frames",
        || {
            let (d, net) = nic_daemon(&[]);
            let mut g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
            let s = raw_sender("vp0");
            let frame = |dst: [u8; 6], marker: &[u8]| {
                let mut f = eth(dst, PEER_MAC, 0x88b5);
                f.extend_from_slice(marker);
                f.resize(60, 0);
                f
            };
            let got = recv_until(&mut g, &d, &[b"OK-bcast", b"OK-mcast", b"OK-mine"], || {
                send_raw(
                    &s,
                    &frame([0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee], b"BAD-other"),
                );
                send_raw(&s, &frame(HOST_MAC, b"BAD-iface"));
                send_raw(&s, &frame(BCAST, b"OK-bcast"));
                send_raw(
                    &s,
                    &frame([0x01, 0x00, 0x5e, 0x01, 0x02, 0x03], b"OK-mcast"),
                );
                send_raw(&s, &frame(GUEST_MAC, b"OK-mine"));
            });
            none_of(
                &got,
                &[
                    ("to another MAC", b"BAD-other"),
                    ("to vh0's own MAC", b"BAD-iface"),
                ],
            );
        },
    );
}

/// A frame of `len` bytes: IPv4 UDP from the guest to the peer's port 9, `marker` first in
/// the payload, the UDP checksum left to the device (pseudo-header sum only).
fn big_udp(len: usize, marker: &[u8]) -> Vec<u8> {
    let mut payload = marker.to_vec();
    payload.resize(len - 42, 0x5a);
    let mut f = udp4((GUEST_MAC, PEER_MAC), (GUEST_IP, PEER_IP), (9, 9), &payload);
    let pseudo = sum16(&GUEST_IP, 0) + sum16(&PEER_IP, 0) + 17 + (len - 34) as u32;
    let c = !fold(pseudo);
    f[40..42].copy_from_slice(&c.to_be_bytes());
    f
}

/// A virtio-net header: NEEDS_CSUM at 34 + `off`, `gso` type with `size`.
fn offload_hdr(gso: u8, size: u16, off: u16) -> [u8; HDR] {
    let mut h = [0u8; HDR];
    h[0] = 1;
    h[1] = gso;
    h[2..4].copy_from_slice(&42u16.to_le_bytes());
    h[4..6].copy_from_slice(&size.to_le_bytes());
    h[6..8].copy_from_slice(&34u16.to_le_bytes());
    h[8..10].copy_from_slice(&off.to_le_bytes());
    h
}

/// F7: what a guest may ask the host kernel to do for it is what it negotiated.
#[test]
fn offloads_the_guest_did_not_negotiate_are_refused() {
    run("offloads_the_guest_did_not_negotiate_are_refused", || {
        let (d, net) = nic_daemon(&["--net-addr", "10.79.0.2"]);
        // A guest that acked no offload.
        let mut g = NetGuest::connect(&net, 0, 64, 2048).expect("virtio-net");
        let cap = netns::Capture::open("vp0").expect("capture");
        const UDP_L4: u8 = 5;
        const UDP: u8 = 3;
        const TCPV4: u8 = 1;
        g.send(offload_hdr(UDP_L4, 1000, 6), &big_udp(3014, b"BAD-uso"))
            .unwrap();
        g.send(offload_hdr(TCPV4, 1000, 6), &big_udp(3014, b"BAD-tso"))
            .unwrap();
        g.send(offload_hdr(0, 0, 6), &big_udp(300, b"BAD-csum"))
            .unwrap();
        g.send([0; HDR], &big_udp(300, b"OK-plain")).unwrap();
        let wire = wire_until(&cap, b"OK-plain", &d);
        none_of(
            &wire,
            &[
                ("USO (never offered)", b"BAD-uso"),
                ("TSO without HOST_TSO4", b"BAD-tso"),
                ("a partial checksum without CSUM", b"BAD-csum"),
            ],
        );
        assert_eq!(net_counter(&d, "tx_bad_offload"), 3);
        drop(g);
        // A guest that acked CSUM and HOST_TSO4: its checksum and TSO go to the kernel, UDP
        // segmentation (never offered) still does not.
        let want = (1 << VIRTIO_NET_F_CSUM) | (1 << VIRTIO_NET_F_HOST_TSO4);
        let end = Instant::now() + Duration::from_secs(20);
        let mut g = loop {
            // The daemon serves one frontend at a time: the old one's end is seen first.
            match NetGuest::connect(&net, want, 64, 2048) {
                Ok(g) if g.acked & want == want => break g,
                r => assert!(Instant::now() < end, "a second frontend: {:?}", r.err()),
            }
        };
        let sock = std::net::UdpSocket::bind("10.79.0.1:9").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        g.send(offload_hdr(UDP, 1000, 6), &big_udp(3014, b"BAD-ufo"))
            .unwrap();
        g.send(offload_hdr(0, 0, 6), &big_udp(300, b"OK-csum"))
            .unwrap();
        let wire = wire_until(&cap, b"OK-csum", &d);
        none_of(&wire, &[("UFO (never offered)", b"BAD-ufo")]);
        let mut buf = [0u8; 2048];
        let n = sock
            .recv(&mut buf)
            .expect("the kernel took the datagram whose checksum the guest left to it");
        assert!(buf[..n].starts_with(b"OK-csum"));
        assert_eq!(net_counter(&d, "tx_bad_offload"), 4);
    });
}
