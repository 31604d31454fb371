//! The raw transport's tests: frame checks, filters, rings.

use super::*;
use crate::transport::filter::run_bpf;
use crate::transport::neighbour::testing::{frame, local, MAC_B};
use rxe_core::wire::Opcode;

#[test]
fn multicast_roce_is_ours_beside_a_virtio_net_only() {
    let mut l = local("10.79.0.2");
    for (s, d, group) in [
        (
            "10.79.0.1",
            "239.1.2.3",
            [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03],
        ),
        (
            "10.79.0.1",
            "224.129.2.3",
            [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03],
        ),
        (
            "fd79::1",
            "ff0e::1:2:3",
            [0x33, 0x33, 0x00, 0x02, 0x00, 0x03],
        ),
    ] {
        assert_eq!(multicast_mac(d.parse().unwrap()), group, "{d}");
        let mut f = frame(s, d, 40);
        f[..6].copy_from_slice(&group);
        l.multicast = false;
        assert!(check_frame(&l, &f).is_err(), "{d} without multicast");
        l.multicast = true;
        let r = check_frame(&l, &f).expect("multicast RoCE");
        assert_eq!(r.meta.dst, Gid::from_ip(d.parse().unwrap()));
        // to our unicast MAC, or to another group's address: not ours
        f[..6].copy_from_slice(&MAC_B);
        assert!(check_frame(&l, &f).is_err(), "{d} to a unicast MAC");
        f[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0x7f, 0, 1]);
        assert!(check_frame(&l, &f).is_err(), "{d} to another group's MAC");
    }
    // A group MAC with a unicast destination address: not ours either.
    let mut f = frame("10.79.0.1", "10.79.0.2", 40);
    f[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0x4f, 0, 2]);
    assert!(check_frame(&l, &f).is_err());
    // The kernel filters: multicast RoCE is the raw transport's beside a virtio-net.
    let addrs: Vec<IpAddr> = vec!["10.79.0.2".parse().unwrap()];
    let roce = filter_program(&addrs, FilterKind::Roce).unwrap();
    let rest = filter_program(&addrs, FilterKind::NotRoce).unwrap();
    let plain = filter_program(&addrs, FilterKind::RoceAndNeighbours).unwrap();
    for d in ["239.1.2.3", "ff0e::1:2:3"] {
        let s = if d.contains(':') {
            "fd79::1"
        } else {
            "10.79.0.1"
        };
        let f = frame(s, d, 8);
        assert_ne!(run_bpf(&roce, &f), 0, "{d}");
        assert_eq!(run_bpf(&rest, &f), 0, "{d}");
        assert_eq!(run_bpf(&plain, &f), 0, "{d} without a virtio-net");
    }
    let mut other_port = frame("10.79.0.1", "239.1.2.3", 8);
    other_port[36..38].copy_from_slice(&5000u16.to_be_bytes());
    assert_eq!(run_bpf(&roce, &other_port), 0);
    assert_ne!(
        run_bpf(&rest, &other_port),
        0,
        "other multicast UDP: the guest's"
    );
}

fn fix_ipv4_checksum(f: &mut [u8]) {
    f[24] = 0;
    f[25] = 0;
    let c = !(sum16(0, &f[14..34]) as u16);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn a_good_frame_passes_with_its_addressing() {
    let l = local("10.79.0.2");
    for (s, d) in [("10.79.0.1", "10.79.0.2"), ("fd79::1", "fd79::2")] {
        let f = frame(s, d, 40);
        let r = check_frame(&l, &f).expect("good frame");
        assert_eq!(r.meta.src, Gid::from_ip(s.parse().unwrap()));
        assert_eq!(r.meta.dst, Gid::from_ip(d.parse().unwrap()));
        assert_eq!(r.meta.sport, 0xc001);
        assert_eq!(r.meta.hop_limit, 64);
        assert_eq!(r.roce.1, f.len());
        assert_eq!(f[r.roce.0], Opcode::RC_SEND_ONLY.0);
        // Ethernet padding after the datagram is not part of it.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 20]);
        let p = check_frame(&l, &padded).unwrap();
        assert_eq!(p.roce, r.roce);
    }
}

/// Each check on its own, with the reason it is counted under.
#[test]
fn every_bad_field_has_its_reason() {
    let l = local("10.79.0.2");
    let good = frame("10.79.0.1", "10.79.0.2", 40);
    let case = |f: &dyn Fn(&mut Vec<u8>), want: RxDrop| {
        let mut b = good.clone();
        f(&mut b);
        assert_eq!(check_frame(&l, &b).err(), Some(want));
    };
    case(&|b| b.truncate(10), RxDrop::Short);
    case(&|b| b.truncate(30), RxDrop::Short);
    case(&|b| b[0] = 0x04, RxDrop::NotOurs);
    case(
        &|b| b[12..14].copy_from_slice(&[0x08, 0x06]),
        RxDrop::EtherType,
    );
    case(&|b| b[14] = 0x46, RxDrop::Ip);
    case(&|b| b[14] = 0x65, RxDrop::Ip);
    case(&|b| b[23] = 6, RxDrop::Ip);
    case(
        &|b| b[16..18].copy_from_slice(&9000u16.to_be_bytes()),
        RxDrop::Ip,
    );
    case(&|b| b[20] |= 0x20, RxDrop::Ip);
    case(&|b| b[25] ^= 1, RxDrop::IpChecksum);
    case(
        &|b| {
            b[33] = 9;
            fix_ipv4_checksum(b);
        },
        RxDrop::NotOurs,
    );
    case(
        &|b| b[36..38].copy_from_slice(&4792u16.to_be_bytes()),
        RxDrop::Udp,
    );
    case(&|b| b[39] ^= 1, RxDrop::Udp);
    case(&|b| b[40..42].copy_from_slice(&[0x12, 0x34]), RxDrop::Udp);
    case(&|b| *b.last_mut().unwrap() ^= 1, RxDrop::Icrc);
    case(&|b| b[50] ^= 0x80, RxDrop::Icrc);
    // The source address and the IP ID are covered by the ICRC.
    case(
        &|b| {
            b[29] = 7;
            fix_ipv4_checksum(b);
        },
        RxDrop::Icrc,
    );
    case(
        &|b| {
            b[19] ^= 1;
            fix_ipv4_checksum(b);
        },
        RxDrop::Icrc,
    );
    // TTL is not: a router may change it.
    let mut b = good.clone();
    b[22] = 3;
    fix_ipv4_checksum(&mut b);
    assert_eq!(check_frame(&l, &b).unwrap().meta.hop_limit, 3);
}

/// A tiny xorshift generator: the fuzz test needs no crate.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random bytes, truncations, byte and bit flips of good frames: never a panic, a
/// RoCE packet inside the frame whenever one is accepted, and no corruption of the
/// covered bytes accepted.
#[test]
fn fuzzed_frames_never_panic_and_corruption_is_caught() {
    let l = local("10.79.0.2");
    let goods = [
        frame("10.79.0.1", "10.79.0.2", 0),
        frame("10.79.0.1", "10.79.0.2", 300),
        frame("fd79::1", "fd79::2", 17),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut st = TransportStats::default();
    let mut accepted_bad = 0;
    for round in 0..200_000 {
        let g = &goods[round % goods.len()];
        let mut f = g.clone();
        match rng.below(5) {
            0 => {
                let n = rng.below(200);
                f = (0..n).map(|_| rng.next() as u8).collect();
            }
            1 => f.truncate(rng.below(g.len() + 1)),
            2 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(f.len());
                    f[i] = rng.next() as u8;
                }
            }
            3 => {
                let i = rng.below(f.len() * 8);
                f[i / 8] ^= 1 << (i % 8);
            }
            _ => {
                let extra = rng.below(64);
                f.extend((0..extra).map(|_| rng.next() as u8));
            }
        }
        match check_frame(&l, &f) {
            Ok(r) => {
                assert!(r.roce.0 < r.roce.1 && r.roce.1 <= f.len());
                // Accepted: every byte must be the good frame's but those the ICRC masks
                // or no check covers (source MAC, TOS/traffic class, flow label, TTL/hop
                // limit, IPv4 header checksum, UDP checksum, the FECN/BECN byte) and
                // padding after the datagram.
                let free: &[usize] = if g[14] == 0x45 {
                    &[15, 22, 24, 25, 40, 41, 46]
                } else {
                    &[14, 15, 16, 17, 21, 60, 61, 66]
                };
                let differs = (0..g.len()).any(|i| {
                    f.get(i) != Some(&g[i]) && !(6..12).contains(&i) && !free.contains(&i)
                });
                if differs {
                    accepted_bad += 1;
                }
            }
            Err(d) => count(&mut st, d),
        }
    }
    assert_eq!(accepted_bad, 0, "corrupted frames accepted");
    assert!(st.rx_icrc_bad > 0 && st.rx_short > 0 && st.rx_not_ours > 0);
}

/// Ring block headers that point outside the block are refused before a byte of the
/// frame is read.
#[test]
fn ring_frame_headers_are_checked_against_the_block() {
    let mut b = vec![0u8; 4096];
    let put32 = |b: &mut Vec<u8>, at: usize, v: u32| {
        b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    };
    let at = 64;
    put32(&mut b, at, 0); // next
    put32(&mut b, at + 12, 100); // snaplen
    put32(&mut b, at + 16, 100); // len
    b[at + 24..at + 26].copy_from_slice(&(TP3_HDR as u16 + 18).to_ne_bytes());
    let (f, _) = block_frame(&b, at).unwrap();
    assert_eq!((f.at, f.snap, f.wire), (at + 66, 100, 100));
    assert!(!f.outgoing);
    put32(&mut b, at + 12, 4096);
    assert_eq!(block_frame(&b, at), None, "frame past the block end");
    put32(&mut b, at + 12, 100);
    b[at + 24..at + 26].copy_from_slice(&8u16.to_ne_bytes());
    assert_eq!(block_frame(&b, at), None, "frame inside its own header");
    assert_eq!(block_frame(&b, 4090), None, "header past the block end");
    assert_eq!(block_frame(&b, usize::MAX - 3), None);
}

#[test]
fn ring_slot_headers_are_checked_against_the_slot() {
    let mut s = vec![0u8; 2048];
    s[4..8].copy_from_slice(&100u32.to_ne_bytes()); // len
    s[8..12].copy_from_slice(&100u32.to_ne_bytes()); // snaplen
    s[12..14].copy_from_slice(&66u16.to_ne_bytes()); // mac
    let f = slot_frame_v2(&s).unwrap();
    assert_eq!((f.at, f.snap, f.wire), (66, 100, 100));
    s[8..12].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert_eq!(slot_frame_v2(&s), None, "frame past the slot end");
    s[8..12].copy_from_slice(&100u32.to_ne_bytes());
    s[12..14].copy_from_slice(&4u16.to_ne_bytes());
    assert_eq!(slot_frame_v2(&s), None, "frame inside its own header");
    assert_eq!(slot_frame_v2(&s[..20]), None, "slot shorter than a header");
}

/// Missing and down interfaces are told apart before any privilege is needed.
#[test]
fn a_missing_interface_is_named() {
    let cfg = RawConfig {
        iface: "vur-nosuch0".into(),
        addrs: vec!["10.79.0.1".parse().unwrap()],
        mac: None,
        mtu: 1500,
        ring: RingKind::V3,
        answer_neighbours: true,
    };
    match RawTransport::open(&cfg) {
        Err(RawError::NoSuchInterface(i)) => assert_eq!(i, "vur-nosuch0"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("opened a missing interface"),
    }
    assert!(iface_info("").is_err());
    assert!(iface_info("a-name-longer-than-ifnamsiz").is_err());
}
