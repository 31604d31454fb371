//! The ICRC check a UDP-socket receiver can make (`frame::verify_icrc_from_udp_socket`),
//! against real Linux rxe 6.12 traffic: every frame of `tests/data/rxe-6.12-capture.pcap`,
//! seen only as a socket sees it (addresses, ports, the datagram), passes — IPv6 exactly, IPv4
//! by solving for the identification, which rxe picks by hash (so a check with ID 0 would
//! drop almost every rxe packet) and which the solver finds exactly. A bit flipped in the
//! datagram is rejected.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};

use rxe_core::icrc::Ipv4IdSolver;
use rxe_core::pcap::PcapReader;
use rxe_core::wire::frame;
use rxe_core::wire::WireError;

#[test]
fn every_rxe_frame_passes_the_udp_socket_check_and_its_ipv4_id_is_found() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/rxe-6.12-capture.pcap"
    );
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut r = PcapReader::new(std::io::BufReader::new(file)).unwrap();
    let mut solver = Ipv4IdSolver::new();
    let (mut n, mut v4, mut flips) = (0, 0, 0u64);
    let mut ids = BTreeSet::new();
    let mut buf = Vec::new();
    while let Some(_h) = r.next_into(&mut buf).unwrap() {
        n += 1;
        let (m, roce) = frame::parse_frame(&buf, true).unwrap_or_else(|e| panic!("frame {n}: {e}"));
        let src = SocketAddr::new(m.src_ip, m.sport);
        let dst = SocketAddr::new(m.dst_ip, m.dport);
        let got = frame::verify_icrc_from_udp_socket(src, dst, roce, &mut solver);
        match m.src_ip {
            IpAddr::V4(_) => {
                v4 += 1;
                ids.insert(m.ipv4_id);
                assert_eq!(got, Ok(Some(m.ipv4_id)), "frame {n}");
            }
            IpAddr::V6(_) => assert_eq!(got, Ok(None), "frame {n}"),
        }
        // One flipped bit in each byte (outside the masked BTH byte 4) is rejected.
        let mut bad = roce.to_vec();
        for i in (0..bad.len()).filter(|&i| i != 4) {
            let bit = 1 << ((i + n) % 8);
            bad[i] ^= bit;
            let v = frame::verify_icrc_from_udp_socket(src, dst, &bad, &mut solver);
            assert_eq!(v, Err(WireError::BadChecksum), "frame {n} byte {i}");
            bad[i] ^= bit;
            flips += 1;
        }
        // So is a different source port or address.
        let other = SocketAddr::new(m.src_ip, m.sport ^ 0x0100);
        assert_eq!(
            frame::verify_icrc_from_udp_socket(other, dst, roce, &mut solver),
            Err(WireError::BadChecksum),
            "frame {n}"
        );
    }
    assert_eq!((n, v4), (306, 286));
    assert!(flips > 10_000);
    // rxe's IPv4 identification is not 0 (it is `__ip_select_ident()`'s hash): checking with
    // ID 0, as a UDP-socket sender of ours fills it, would drop these.
    assert!(ids.len() > 100, "{} distinct IDs", ids.len());
}
