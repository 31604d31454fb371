//! The RoCEv2 invariant CRC, computed exactly as Linux `rxe_icrc.c` does.
//!
//! CRC-32 (reflected, polynomial 0xEDB88320) seeded with eight 0xFF bytes standing for the
//! masked LRH, over the IP header, UDP header, BTH and everything after it up to the ICRC, with
//! the variant fields masked to ones: IPv4 TOS, TTL and header checksum; IPv6 traffic class,
//! flow label and hop limit; the UDP checksum; and the BTH byte holding FECN/BECN/resv6. The
//! result is inverted and carried little-endian.

use crate::wire::opcode::BTH_LEN;
use crate::wire::WireError;

/// CRC state after the eight 0xFF bytes of the masked LRH, in crc32fast's (finalised) form:
/// `!0xdebb20e3`.
const SEED: u32 = 0x2144_df1c;

const IPV4_LEN: usize = 20;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;

/// Computes the ICRC of a packet given its IP + UDP headers (`l3l4`: an option-less IPv4 header
/// or an IPv6 header without extension headers, followed by the UDP header) and the RoCE packet
/// from the BTH up to, not including, the ICRC.
pub fn compute(l3l4: &[u8], roce: &[u8]) -> Result<u32, WireError> {
    let ip_len = match l3l4.first().map(|b| b >> 4) {
        Some(4) => IPV4_LEN,
        Some(6) => IPV6_LEN,
        _ => return Err(WireError::BadField),
    };
    if l3l4.len() != ip_len + UDP_LEN || roce.len() < BTH_LEN {
        return Err(WireError::Truncated);
    }
    if ip_len == IPV4_LEN && l3l4[0] != 0x45 {
        // IPv4 options are not used by RoCEv2 and rxe never emits them.
        return Err(WireError::BadField);
    }
    let mut ph = [0u8; IPV6_LEN + UDP_LEN + BTH_LEN];
    let n = ip_len + UDP_LEN;
    ph[..n].copy_from_slice(l3l4);
    if ip_len == IPV4_LEN {
        ph[1] = 0xff; // TOS
        ph[8] = 0xff; // TTL
        ph[10] = 0xff; // header checksum
        ph[11] = 0xff;
    } else {
        ph[0] |= 0x0f; // traffic class (high nibble)
        ph[1] = 0xff; // traffic class (low nibble) + flow label
        ph[2] = 0xff;
        ph[3] = 0xff;
        ph[7] = 0xff; // hop limit
    }
    ph[ip_len + 6] = 0xff; // UDP checksum
    ph[ip_len + 7] = 0xff;
    ph[n..n + BTH_LEN].copy_from_slice(&roce[..BTH_LEN]);
    ph[n + 4] = 0xff; // FECN, BECN, resv6
    let mut h = crc32fast::Hasher::new_with_initial(SEED);
    h.update(&ph[..n + BTH_LEN]);
    h.update(&roce[BTH_LEN..]);
    Ok(h.finalize())
}

/// Checks the ICRC at the end of `roce_with_icrc` against the headers in `l3l4`.
pub fn verify(l3l4: &[u8], roce_with_icrc: &[u8]) -> Result<(), WireError> {
    let n = roce_with_icrc.len();
    if n < BTH_LEN + 4 {
        return Err(WireError::Truncated);
    }
    let got = u32::from_le_bytes(roce_with_icrc[n - 4..].try_into().expect("4 bytes"));
    if compute(l3l4, &roce_with_icrc[..n - 4])? == got {
        Ok(())
    } else {
        Err(WireError::BadChecksum)
    }
}

/// Writes the ICRC into the last four bytes of `roce_with_icrc`.
pub fn fill(l3l4: &[u8], roce_with_icrc: &mut [u8]) -> Result<(), WireError> {
    let n = roce_with_icrc.len();
    if n < BTH_LEN + 4 {
        return Err(WireError::Truncated);
    }
    let c = compute(l3l4, &roce_with_icrc[..n - 4])?;
    roce_with_icrc[n - 4..].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// UDP source port for an RC/UC QP pair, as `rdma_get_udp_sport()` computes it: a 20-bit flow
/// label (the given one, or one folded from `lqpn * rqpn`), folded again into 14 bits, with the
/// top two bits set. It is the same in both directions.
pub fn rc_udp_sport(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let mut fl = flow_label & 0xf_ffff;
    if fl == 0 {
        let v = lqpn as u64 * rqpn as u64;
        fl = ((v ^ (v >> 20) ^ (v >> 40)) & 0xf_ffff) as u32;
    }
    (((fl & 0x3fff) ^ ((fl & 0xf_c000) >> 14)) | 0xc000) as u16
}

/// UDP source port rxe uses for UD (and any QP without a GRH flow label): `0xc000 +
/// (hash_32(qpn, 14) & 0x3fff)`.
pub fn ud_udp_sport(qpn: u32) -> u16 {
    // hash_32(val, bits) = (val * GOLDEN_RATIO_32) >> (32 - bits)
    let h = qpn.wrapping_mul(0x61C8_8647) >> (32 - 14);
    0xc000 + (h & 0x3fff) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sport_formulas() {
        // Symmetric in the two QPNs.
        assert_eq!(rc_udp_sport(0, 0x11, 0x12), rc_udp_sport(0, 0x12, 0x11));
        // lqpn*rqpn = 0x11*0x12 = 0x132 -> fl 0x132 -> sport 0xc132
        assert_eq!(rc_udp_sport(0, 0x11, 0x12), 0xc132);
        // A flow label above 14 bits folds its top 6 bits in.
        assert_eq!(rc_udp_sport(0xfc001, 0, 0), 0xc000 | (1 ^ 0x3f));
        for q in [1u32, 0x11, 0xffffff] {
            assert!(ud_udp_sport(q) >= 0xc000);
        }
        assert_eq!(ud_udp_sport(0), 0xc000);
    }
}
