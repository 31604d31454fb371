//! Ethernet frames as the network sends them to the raw-L2 transport's receive check
//! (`raw::check_frame`): it must never panic, and a frame it accepts must be what it says —
//! addressed to one of our MACs and addresses, its RoCE packet inside the frame and within
//! the IP total length, its ICRC good. The same frames go to the ARP and neighbour-discovery
//! responders (`raw::arp_reply`, `raw::nd_reply`): they answer only a request or a
//! solicitation for our own address, with our MAC.
//!
//! Input layout:
//! - byte 0, bit 0: repair the frame before the check (the IPv4 header checksum, a zero UDP
//!   checksum and the ICRC, where the headers leave room for them), so that the fuzzer gets
//!   past the checksums to what follows them; bit 1: address the frame to us (our MAC and,
//!   per its EtherType, our IPv4 or IPv6 address);
//! - the rest: the frame, from its destination MAC.
//!
//! `cargo fuzz run raw_frame --sanitizer none` (from backend/fuzz).

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use vhost_user_rdma::transport::raw::{arp_reply, check_frame, multicast_mac, nd_reply, Local};

const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x07];
const V4: Ipv4Addr = Ipv4Addr::new(10, 79, 0, 1);
const V6: Ipv6Addr = Ipv6Addr::new(0xfd79, 0, 0, 0, 0, 0, 0, 1);
const ETH: usize = 14;

fn be16(b: &[u8], at: usize) -> usize {
    u16::from_be_bytes([b[at], b[at + 1]]) as usize
}

/// Makes the frame's checksums and ICRC right where its headers and lengths allow.
fn repair(f: &mut [u8], to_us: bool) {
    if f.len() < ETH {
        return;
    }
    if to_us {
        f[..6].copy_from_slice(&MAC);
    }
    let (ihl, total) = match be16(f, 12) {
        0x0800 if f.len() >= ETH + 20 => {
            if to_us {
                f[ETH + 16..ETH + 20].copy_from_slice(&V4.octets());
            }
            let ip = &mut f[ETH..ETH + 20];
            ip[10] = 0;
            ip[11] = 0;
            let mut s: u32 = ip
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]) as u32)
                .sum();
            while s > 0xffff {
                s = (s & 0xffff) + (s >> 16);
            }
            ip[10..12].copy_from_slice(&(!(s as u16)).to_be_bytes());
            (20, be16(f, ETH + 2))
        }
        0x86dd if f.len() >= ETH + 40 => {
            if to_us {
                f[ETH + 24..ETH + 40].copy_from_slice(&V6.octets());
            }
            (40, 40 + be16(f, ETH + 4))
        }
        _ => return,
    };
    let l3 = ETH..(ETH + total).min(f.len());
    if l3.len() < ihl + 8 + 16 {
        return;
    }
    let l3 = &mut f[l3];
    l3[ihl + 6] = 0;
    l3[ihl + 7] = 0;
    let (hdrs, roce) = l3.split_at_mut(ihl + 8);
    let _ = rxe_core::icrc::fill(hdrs, roce);
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, frame)) = data.split_first() else {
        return;
    };
    let mut f = frame.to_vec();
    if mode & 1 != 0 {
        repair(&mut f, mode & 2 != 0);
    }
    // Beside a virtio-net (mode bit 2) RoCE to multicast groups is ours too.
    let local = Local {
        macs: vec![MAC],
        addrs: vec![IpAddr::V4(V4), IpAddr::V6(V6)],
        multicast: mode & 4 != 0,
    };
    if let Some(r) = arp_reply(&local, MAC, &f) {
        assert_eq!(&f[12..14], &[8, 6], "answered a frame that is not ARP");
        assert_eq!(&f[ETH + 6..ETH + 8], &[0, 1], "answered an ARP reply");
        assert_eq!(
            &f[ETH + 24..ETH + 28],
            &V4.octets(),
            "answered for another address"
        );
        assert_eq!(&r[..6], &f[ETH + 8..ETH + 14], "reply not to the asker");
        assert_eq!(&r[ETH + 8..ETH + 14], &MAC, "reply without our MAC");
    }
    if let Some(r) = nd_reply(&local, MAC, &f) {
        assert_eq!(
            &f[12..14],
            &[0x86, 0xdd],
            "answered a frame that is not IPv6"
        );
        assert_eq!(
            f[ETH + 40],
            135,
            "answered something else than a solicitation"
        );
        assert_eq!(
            &f[ETH + 48..ETH + 64],
            &V6.octets(),
            "answered for another address"
        );
        assert_eq!(
            &r[ETH + 8..ETH + 24],
            &V6.octets(),
            "advertised from another address"
        );
        assert_eq!(
            &r[ETH + 40 + 26..ETH + 40 + 32],
            &MAC,
            "advertised another MAC"
        );
    }
    if let Ok(r) = check_frame(&local, &f) {
        let (a, b) = r.roce;
        assert!(
            a <= b && b <= f.len(),
            "RoCE packet {a}..{b} outside a {}-byte frame",
            f.len()
        );
        assert!(b - a >= 16, "a RoCE packet shorter than a BTH and an ICRC");
        let dst = r.meta.dst;
        if dst.is_multicast() {
            assert!(local.multicast, "accepted multicast without being asked to");
            assert_eq!(
                f[..6],
                multicast_mac(dst.to_ip()),
                "multicast accepted for another group address"
            );
        } else {
            assert_eq!(&f[..6], &MAC, "accepted for another MAC");
            assert!(
                dst == rxe_core::Gid::from_ip(IpAddr::V4(V4))
                    || dst == rxe_core::Gid::from_ip(IpAddr::V6(V6)),
                "accepted for another address: {dst:?}"
            );
        }
        let ihl = if be16(&f, 12) == 0x0800 { 20 } else { 40 };
        assert!(
            rxe_core::icrc::verify(&f[ETH..a], &f[a..b]).is_ok() && a == ETH + ihl + 8,
            "accepted with a bad ICRC or headers of the wrong size"
        );
    }
});
