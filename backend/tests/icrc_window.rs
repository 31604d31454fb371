//! The IPv4 ICRC check of the udp transport, end to end over real sockets (security review
//! 2026-11-28, F5 and F6): datagrams from a plain UDP socket to a `UdpTransport` on loopback,
//! each ICRC computed by the test for the IPv4 ID it stands for (the receiver cannot see the
//! ID, so a datagram whose ICRC is computed for ID k is, to it, one sent with ID k).
//!
//! - F5: a 1040-byte RC packet with two bits flipped, a pair the old check (any of the 2^16
//!   IDs) accepted, is refused by default.
//! - A sender numbering its IDs (a NIC, per flow or per port; Linux rxe per destination) is
//!   accepted after its first packet, which only teaches the ID.
//! - F6: junk cycling through many lengths costs no solve when it fails the cheap checks, and
//!   one solve each (bounded, no cache thrash to amplify it) when it has a plausible BTH.

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use rxe_core::icrc::{Ipv4IdBasis, Ipv4IdSolver};
use rxe_core::wire::frame::{icrc_for_udp_socket, verify_icrc_from_udp_socket};
use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};
use vhost_user_rdma::transport::udp::UdpTransport;

/// A receiving transport (default ICRC rules) and a plain sending socket on loopback; `None`
/// (skipped) when loopback cannot be bound.
fn pair(test: &str) -> Option<(UdpTransport, UdpSocket)> {
    let at: SocketAddr = "127.0.0.1:0".parse().unwrap();
    match (UdpTransport::bind(at, 0, false), UdpSocket::bind(at)) {
        (Ok(t), Ok(s)) => Some((t, s)),
        (Err(e), _) | (_, Err(e)) => {
            vur_testkit::skip(test, &format!("127.0.0.1 cannot be bound: {e}"));
            None
        }
    }
}

/// An RC SEND_ONLY of `payload` bytes, PSN `psn`, whose ICRC is right for `from` → `to` with
/// IPv4 ID `id`.
fn rc_send(from: SocketAddr, to: SocketAddr, psn: u32, payload: usize, id: u16) -> Vec<u8> {
    let mut buf = vec![0u8; 12 + payload + 4];
    let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, psn, true);
    let (n, pr) = emit(&mut buf, &bth, &ExtRepr::default(), payload).unwrap();
    assert_eq!(n, buf.len());
    for (i, b) in buf[pr.start..pr.end].iter_mut().enumerate() {
        *b = (i * 7 + psn as usize) as u8;
    }
    icrc_for_udp_socket(from, to, &mut buf).unwrap();
    with_id(&mut buf, id);
    buf
}

/// Makes the ICRC of `roce` (right for ID 0) the one for ID `id`.
fn with_id(roce: &mut [u8], id: u16) {
    let n = roce.len();
    let c = Ipv4IdBasis::new(n).contribution(id);
    let v = u32::from_le_bytes(roce[n - 4..].try_into().unwrap()) ^ c;
    roce[n - 4..].copy_from_slice(&v.to_le_bytes());
}

/// Receives until the transport has counted `packets` datagrams in all; returns the PSNs of
/// those it delivered. Fails (after a bound that only catches a hang) saying what it waited
/// for.
fn deliver(t: &mut UdpTransport, packets: u64) -> Vec<u32> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = t.recv_batch();
        for i in 0..n {
            if let Some((_, b)) = t.packet(i) {
                got.push(u32::from_be_bytes([0, b[9], b[10], b[11]]));
            }
        }
        if n > 0 {
            continue;
        }
        if t.all_stats().rx_packets >= packets {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "waited 20 s for {packets} datagrams, the transport counted {:?}",
            t.all_stats()
        );
        std::thread::yield_now();
    }
}

/// Bits of a RoCE packet that are covered (all but the masked FECN/BECN/resv6 byte).
fn covered_bits(n: usize) -> impl Iterator<Item = usize> {
    (0..8 * n).filter(|b| b / 8 != 4)
}

/// The residue of `v` modulo the span of the 16 IPv4 ID contributions of `basis`: two
/// syndromes differ by some ID's contribution exactly when their residues are equal.
fn residue(basis: &Ipv4IdBasis, mut v: u32) -> u32 {
    // Echelon form: pivots[b] has leading bit b.
    let mut pivots = [0u32; 32];
    for k in 0..16 {
        let mut c = basis.contribution(1 << k);
        while c != 0 {
            let b = 31 - c.leading_zeros() as usize;
            if pivots[b] == 0 {
                pivots[b] = c;
                break;
            }
            c ^= pivots[b];
        }
    }
    for b in (0..32).rev() {
        if v & (1 << b) != 0 && pivots[b] != 0 {
            v ^= pivots[b];
        }
    }
    v
}

/// A pair of bits whose flip the old default (some ID of the 2^16 explains the ICRC) accepted
/// in `good`, found through the CRC syndromes of single flips: the pair passes when their
/// syndromes differ by an ID's contribution.
fn a_pair_the_full_solve_accepts(from: SocketAddr, to: SocketAddr, good: &[u8]) -> (usize, usize) {
    let n = good.len();
    let basis = Ipv4IdBasis::new(n);
    let syndrome = |bit: usize| {
        let mut f = good.to_vec();
        f[bit / 8] ^= 1 << (bit % 8);
        let got = u32::from_le_bytes(f[n - 4..].try_into().unwrap());
        icrc_for_udp_socket(from, to, &mut f).unwrap();
        got ^ u32::from_le_bytes(f[n - 4..].try_into().unwrap())
    };
    let mut seen = std::collections::HashMap::new();
    for j in covered_bits(n) {
        if let Some(&i) = seen.get(&residue(&basis, syndrome(j))) {
            return (i, j);
        }
        seen.insert(residue(&basis, syndrome(j)), j);
    }
    panic!("no 2-bit error of a {n}-byte packet passes the full solve");
}

#[test]
fn a_two_bit_corruption_the_old_solve_accepted_is_refused() {
    let Some((mut t, s)) = pair("a_two_bit_corruption_the_old_solve_accepted_is_refused") else {
        return;
    };
    let (from, to) = (s.local_addr().unwrap(), t.local_addr());
    // 1040 bytes: an RC SEND_ONLY with 1024 bytes of payload, ICRC for ID 0 (what the
    // kernel gives this unconnected DF socket's datagrams, and this daemon sends).
    let good = rc_send(from, to, 0x345, 1024, 0);
    assert_eq!(good.len(), 1040);
    let (i, j) = a_pair_the_full_solve_accepts(from, to, &good);
    let mut bad = good.clone();
    bad[i / 8] ^= 1 << (i % 8);
    bad[j / 8] ^= 1 << (j % 8);
    let id = verify_icrc_from_udp_socket(from, to, &bad, &mut Ipv4IdSolver::new())
        .expect("the old default accepted it")
        .expect("IPv4");
    println!(
        "bits {}.{} and {}.{} flipped: the full solve explains the ICRC with ID {id:#06x}",
        i / 8,
        i % 8,
        j / 8,
        j % 8
    );
    s.send_to(&bad, to).unwrap();
    let got = deliver(&mut t, 1);
    let st = &t.all_stats();
    println!(
        "default: corrupted packet accepted={} rx_icrc_id_solved={} rx_icrc_bad={}; {st:?}",
        !got.is_empty(),
        st.rx_icrc_id_solved,
        st.rx_icrc_bad
    );
    assert!(got.is_empty(), "the corrupted packet was delivered: {st:?}");
    assert_eq!(st.rx_icrc_id_solved, 0, "{st:?}");
    // The packet as sent passes (exactly, ID 0), and so does the next one.
    s.send_to(&good, to).unwrap();
    s.send_to(&rc_send(from, to, 0x346, 1024, 0), to).unwrap();
    assert_eq!(deliver(&mut t, 3), vec![0x345, 0x346]);
    assert_eq!(t.all_stats().rx_icrc_ok, 2, "{:?}", t.all_stats());
}

/// A NIC-like sender: IDs from an arbitrary start, one more per packet, in one flow and then
/// in two interleaved flows from the same address. The first packet of each sequence only
/// teaches its ID (dropped: a reliable transport resends it, as the last step shows); every
/// other packet is accepted, none is counted bad.
#[test]
fn a_sender_that_numbers_its_ids_is_accepted_after_its_first_packet() {
    let Some((mut t, s)) = pair("a_sender_that_numbers_its_ids_is_accepted_after_its_first_packet")
    else {
        return;
    };
    let (from, to) = (s.local_addr().unwrap(), t.local_addr());
    let start = 0x4242u16;
    for k in 0..50u16 {
        s.send_to(&rc_send(from, to, k as u32, 1024, start + k), to)
            .unwrap();
    }
    let got = deliver(&mut t, 50);
    assert_eq!(got, (1..50).collect::<Vec<_>>(), "{:?}", t.all_stats());
    // The first one again, as a resend carries it: the next ID.
    s.send_to(&rc_send(from, to, 0, 1024, start + 50), to)
        .unwrap();
    assert_eq!(deliver(&mut t, 51), vec![0]);
    // Two flows of one address, each counting on its own, interleaved, some packets lost
    // (IDs skipped) and a few reordered.
    let (a, b) = (0x9000u16, 0x1100u16);
    let mut sent = Vec::new();
    for k in 0..40u16 {
        let (ida, idb) = (a + 2 * k, b + k);
        sent.push(rc_send(from, to, 1000 + k as u32, 256, ida));
        sent.push(rc_send(from, to, 2000 + k as u32, 256, idb));
    }
    sent.swap(20, 22);
    for p in &sent {
        s.send_to(p, to).unwrap();
    }
    let got = deliver(&mut t, 51 + 80);
    assert_eq!(
        got.len(),
        78,
        "all but each flow's first: {got:?} {:?}",
        t.all_stats()
    );
    assert!(!got.contains(&1000) && !got.contains(&2000));
    let st = &t.all_stats();
    assert_eq!(
        (st.rx_icrc_id_learned, st.rx_icrc_bad),
        (3, 0),
        "one learned packet per sequence, none bad: {st:?}"
    );
    assert_eq!(st.rx_icrc_id_solved, 49 + 1 + 78);
}

/// F6: 1 000 junk datagrams cycling through 200 lengths. Those that fail the cheap checks
/// (no BTH the engine would take) cost no solve; those with a plausible BTH but an ICRC that
/// no acceptable ID explains cost one solve each, and are dropped. Timings are in the bench
/// (`cargo bench -p rxe-core --bench engine -- --only icrc`).
#[test]
fn junk_of_many_lengths_is_dropped_cheaply() {
    let Some((mut t, s)) = pair("junk_of_many_lengths_is_dropped_cheaply") else {
        return;
    };
    let (from, to) = (s.local_addr().unwrap(), t.local_addr());
    let mut x = 0x1234_5678u32;
    let mut rnd = || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    for i in 0..1000usize {
        let len = 16 + (i % 200) * 7;
        let mut p: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
        p[0] = 0x1f; // no such opcode
        s.send_to(&p, to).unwrap();
    }
    assert!(deliver(&mut t, 1000).is_empty());
    assert_eq!(
        (t.all_stats().rx_icrc_bad, t.all_stats().rx_icrc_solves),
        (1000, 0),
        "{:?}",
        t.all_stats()
    );
    // A plausible BTH (RC SEND_ONLY to QP 0x12, default P_Key) with a random ICRC.
    for i in 0..1000usize {
        let len = 16 + (i % 200) * 4;
        let mut p = rc_send(from, to, i as u32, len - 16, 0);
        let n = p.len();
        let r = rnd();
        p[n - 4..].copy_from_slice(&r.to_le_bytes());
        s.send_to(&p, to).unwrap();
    }
    assert!(deliver(&mut t, 2000).is_empty(), "{:?}", t.all_stats());
    let st = &t.all_stats();
    assert_eq!(
        st.rx_icrc_solves, 1000,
        "one solve per plausible packet: {st:?}"
    );
    assert_eq!(st.rx_icrc_id_solved, 0, "{st:?}");
}
