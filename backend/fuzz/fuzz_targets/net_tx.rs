//! Frames the guest transmits on its NIC (`--net-socket`), through the checks the daemon
//! makes before the host kernel sees them (`net_policy::NetPolicy::check_tx`, what
//! `vhu_net`'s transmit calls for every frame), under every combination of the policy's
//! options and the features a guest may have negotiated. It must never panic, and a frame it
//! passes must be what the policy allows, checked here again from the bytes: the header asks
//! only for negotiated offloads, the source MAC is the guest's, no link-local group, an
//! allowed EtherType, an IP or ARP source of the guest's, RoCEv2 only to an allowed peer.
//! The receive filter (`net_policy::rx_wanted`) gets the same frames.
//!
//! Input layout:
//! - byte 0: the policy: bit 0 `--net-addr` (else the learned GIDs), bit 1 `--net-vlan`,
//!   bit 2 `--net-l2-control`, bit 3 `--net-any-mac`, bit 4 `--net-ethertype 0x88cc`, bit 5
//!   `--allow-peer 10.79.0.1`, bit 6: write the guest's MAC as the source (so the fuzzer
//!   gets past it), bit 7: nothing learned;
//! - byte 1: the acked features: bit 0 CSUM, 1 HOST_TSO4, 2 HOST_TSO6, 3 HOST_ECN;
//! - 10 bytes: the virtio-net header;
//! - the rest: the Ethernet frame.
//!
//! `cargo fuzz run net_tx --sanitizer none` (from backend/fuzz).

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use vhost_user_rdma::net::net_policy::{rx_wanted, NetPolicy};
use vhost_user_rdma::transport::egress::EgressPolicy;

const MAC: [u8; 6] = [0x52, 0x54, 0, 0x79, 0, 2];
const ME: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 2);
const ME6: Ipv6Addr = Ipv6Addr::new(0xfd79, 0, 0, 0, 0, 0, 0, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const ETH: usize = 14;
// virtio-net feature bits
const CSUM: u32 = 0;
const HOST_TSO4: u32 = 11;
const HOST_TSO6: u32 = 12;
const HOST_ECN: u32 = 13;

/// The upper-layer protocol of an IPv6 packet `p` whose header passed the policy: the next
/// header behind hop-by-hop, routing, destination options, a first fragment's header and
/// authentication headers (None: a later fragment, or a chain deeper than 8). An MLD report
/// from :: comes behind a hop-by-hop header (RFC 3590); any chain may precede ICMPv6.
fn upper_v6(p: &[u8]) -> Option<u8> {
    let (mut next, mut at) = (p[6], 40usize);
    for _ in 0..8 {
        match next {
            0 | 43 | 60 => (next, at) = (p[at], at + (p[at + 1] as usize + 1) * 8),
            44 if be16(p, at + 2) & 0xfff8 == 0 => (next, at) = (p[at], at + 8),
            44 => return None,
            51 => (next, at) = (p[at], at + (p[at + 1] as usize + 2) * 4),
            n => return Some(n),
        }
    }
    None
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    let (mode, feat) = (data[0], data[1]);
    let mut hdr: [u8; 10] = data[2..12].try_into().unwrap();
    let mut f = data[12..].to_vec();
    if mode & 0x40 != 0 && f.len() >= 12 {
        f[6..12].copy_from_slice(&MAC);
    }
    let mut p = NetPolicy::new(MAC);
    if mode & 1 != 0 {
        p.addrs = Some(vec![
            "10.79.0.0/30".parse().unwrap(),
            "fd79::2".parse().unwrap(),
        ]);
    }
    p.vlan = mode & 2 != 0;
    p.l2_control = mode & 4 != 0;
    p.any_mac = mode & 8 != 0;
    if mode & 0x10 != 0 {
        p.ethertypes = vec![0x88cc];
    }
    if mode & 0x20 != 0 {
        p.egress = EgressPolicy::new(IpAddr::V4(ME), vec!["10.79.0.1".parse().unwrap()]);
    }
    let learned: Vec<IpAddr> = if mode & 0x80 != 0 {
        Vec::new()
    } else {
        vec![IpAddr::V4(ME), IpAddr::V6(ME6)]
    };
    let acked = [CSUM, HOST_TSO4, HOST_TSO6, HOST_ECN]
        .iter()
        .enumerate()
        .filter(|(i, _)| feat & (1 << i) != 0)
        .fold(0u64, |a, (_, b)| a | 1 << b);
    let wanted = rx_wanted(&p, &f);
    assert_eq!(
        wanted,
        p.any_mac || (!f.is_empty() && f[0] & 1 == 1) || (f.len() >= 6 && f[..6] == MAC),
        "the receive filter"
    );
    if p.check_tx(&mut hdr, &f, acked, &learned).is_err() {
        return;
    }
    // Passed: the header.
    let has = |b: u32| acked & (1 << b) != 0;
    assert!(hdr[0] <= 1, "flags besides NEEDS_CSUM passed on");
    assert!(hdr[0] == 0 || has(CSUM), "NEEDS_CSUM without CSUM");
    match hdr[1] & 0x7f {
        0 => assert_eq!(hdr[1], 0, "ECN without segmentation"),
        1 => assert!(has(HOST_TSO4) && has(CSUM), "TSO4 not negotiated"),
        4 => assert!(has(HOST_TSO6) && has(CSUM), "TSO6 not negotiated"),
        g => panic!("GSO type {g} passed"),
    }
    assert!(hdr[1] & 0x80 == 0 || has(HOST_ECN), "ECN not negotiated");
    // The Ethernet header.
    assert!(f.len() >= ETH);
    assert!(
        p.l2_control || f[..5] != [0x01, 0x80, 0xc2, 0, 0] || f[5] > 0x0f,
        "to a link-local group"
    );
    assert!(p.any_mac || f[6..12] == MAC, "from another MAC");
    let mut at = 12;
    while matches!(be16(&f, at), 0x8100 | 0x88a8 | 0x9100) {
        assert!(p.vlan, "a VLAN tag passed");
        at += 4;
    }
    let l3 = &f[at + 2..];
    let owns = |ip: IpAddr| p.owns(&learned, ip);
    match be16(&f, at) {
        0x0806 => {
            assert!(p.any_mac || l3[8..14] == MAC, "ARP for another MAC");
            let spa = Ipv4Addr::new(l3[14], l3[15], l3[16], l3[17]);
            assert!(spa.is_unspecified() || owns(spa.into()), "ARP from {spa}");
        }
        0x0800 => {
            let src = Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15]);
            let dst = Ipv4Addr::new(l3[16], l3[17], l3[18], l3[19]);
            let ihl = (l3[0] & 15) as usize * 4;
            let udp = (l3[9] == 17 && be16(l3, 6) & 0x1fff == 0).then(|| &l3[ihl..]);
            let ports = udp.map(|u| (be16(u, 0), be16(u, 2)));
            assert!(
                owns(src.into()) || (src.is_unspecified() && ports == Some((68, 67))),
                "IPv4 from {src}"
            );
            if ports.is_some_and(|(_, d)| d == 4791) {
                assert!(p.egress.allows(dst.into()), "RoCEv2 to {dst}");
            }
            if mode & 0x20 != 0 && ports.is_some_and(|(_, d)| d == 4791) {
                assert_eq!(dst, PEER);
            }
        }
        0x86dd => {
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&l3[8..24]).unwrap());
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&l3[24..40]).unwrap());
            if src.is_unspecified() {
                assert_eq!(upper_v6(l3), Some(58), "from :: but not ICMPv6");
            } else {
                assert!(owns(src.into()), "IPv6 from {src}");
            }
            if l3[6] == 17 && be16(l3, 42) == 4791 {
                assert!(p.egress.allows(dst.into()), "RoCEv2 to {dst}");
            }
        }
        t => assert!(p.ethertypes.contains(&t), "EtherType {t:#06x}"),
    }
});
