//! The ICRC must reproduce the golden vectors: one captured from a ConnectX-4 Lx (hardware), one
//! computed by scapy's RoCE layer.

use rxe_core::icrc;
use rxe_core::wire::Packet;

fn vectors() -> Vec<(String, Vec<u8>)> {
    let text = include_str!("data/icrc-vectors.txt");
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next().unwrap().to_string();
            let hex: String = it.collect();
            let bytes = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            (name, bytes)
        })
        .collect()
}

#[test]
fn golden_vectors_verify() {
    let v = vectors();
    assert_eq!(v.len(), 2);
    for (name, bytes) in v {
        let l3 = if name.ends_with("_l3") {
            &bytes[..]
        } else {
            &bytes[14..]
        };
        let ip_len = if l3[0] >> 4 == 4 { 20 } else { 40 };
        let (hdrs, roce) = l3.split_at(ip_len + 8);
        icrc::verify(hdrs, roce).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The packet parses, and a flipped payload bit is caught.
        Packet::new_checked(roce).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut bad = roce.to_vec();
        bad[14] ^= 1;
        assert!(icrc::verify(hdrs, &bad).is_err(), "{name}");
        // Variant fields do not matter: TTL, TOS, checksum, FECN/BECN.
        let mut h2 = hdrs.to_vec();
        h2[1] ^= 0xff;
        h2[8] = 1;
        let mut r2 = roce.to_vec();
        r2[4] |= 0xc0;
        icrc::verify(&h2, &r2).unwrap();
        // Invariant fields do: the IPv4 identification.
        h2[5] ^= 1;
        assert!(icrc::verify(&h2, &r2).is_err());
    }
}
