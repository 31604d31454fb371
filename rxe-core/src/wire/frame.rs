//! RoCEv2 encapsulation: a RoCE packet (BTH … ICRC, as [`super::emit`] writes it) inside UDP
//! (destination port 4791), inside IPv4 or IPv6, optionally inside Ethernet II.
//!
//! The ICRC covers the IP and UDP headers (with the variant fields masked), so it can only be
//! filled once they are known: [`encap`] writes the headers in front of a packet already in the
//! buffer and then fills the ICRC; [`parse_frame`] checks the headers and verifies it. Both are
//! allocation-free; [`parse_frame`] never panics.
//!
//! A sender that goes through a kernel UDP socket does not see the IP header the kernel writes;
//! [`icrc_for_udp_socket`] computes the ICRC such a socket's datagrams need.
//!
//! Checksums on receive ([`parse_frame`]), all reported as [`WireError::BadChecksum`]:
//! - the ICRC, always;
//! - the UDP checksum when it is not zero (rxe sends zero over IPv4 and IPv6; Linux verifies a
//!   non-zero one before handing the datagram to rxe's encapsulation socket);
//! - the IPv4 header checksum. The ICRC masks this field (like TTL and TOS), so a frame whose
//!   IPv4 header checksum alone is wrong has a valid ICRC; it is still rejected, because the
//!   kernel's IP layer drops it before rxe ever sees it. Use [`parse_headers`] and the
//!   [`RawFrame`] methods to tell which check failed.

use core::net::{IpAddr, SocketAddr};

use super::ip::*;
use super::opcode::{BTH_LEN, ICRC_LEN};
use super::WireError;
use crate::icrc;

/// The Ethernet part of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthMeta {
    pub src: [u8; 6],
    pub dst: [u8; 6],
    /// 802.1Q tag control information, if the frame is (or is to be) tagged.
    pub vlan_tci: Option<u16>,
}

/// Everything outside the RoCE packet: link, IP and UDP header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameMeta {
    /// Ethernet addresses; `None` for a bare IP datagram (the L3-only form).
    pub eth: Option<EthMeta>,
    /// Source and destination must be the same family.
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    /// UDP source port (rxe derives it from the QPNs or the flow label, see
    /// [`crate::icrc::rc_udp_sport`]).
    pub sport: u16,
    /// UDP destination port: [`ROCE_UDP_PORT`] on every RoCEv2 frame.
    pub dport: u16,
    /// IPv4 TOS or IPv6 traffic class (DSCP + ECN).
    pub traffic_class: u8,
    /// IPv4 TTL or IPv6 hop limit.
    pub hop_limit: u8,
    /// IPv6 flow label (20 bits); ignored, and parsed as 0, for IPv4.
    pub flow_label: u32,
    /// IPv4 identification; ignored, and parsed as 0, for IPv6. It is covered by the ICRC.
    pub ipv4_id: u16,
}

impl FrameMeta {
    /// An L3-only frame with rxe's defaults: port 4791, traffic class 0, hop limit 64, flow
    /// label 0, IPv4 ID 0.
    pub const fn new(src_ip: IpAddr, dst_ip: IpAddr, sport: u16) -> Self {
        Self {
            eth: None,
            src_ip,
            dst_ip,
            sport,
            dport: ROCE_UDP_PORT,
            traffic_class: 0,
            hop_limit: DEFAULT_HOP_LIMIT,
            flow_label: 0,
            ipv4_id: 0,
        }
    }

    /// The same frame inside untagged Ethernet II.
    pub const fn with_eth(mut self, src: [u8; 6], dst: [u8; 6]) -> Self {
        self.eth = Some(EthMeta {
            src,
            dst,
            vlan_tci: None,
        });
        self
    }

    /// `Some(true)` for IPv4, `Some(false)` for IPv6, `None` when the families differ.
    pub const fn is_ipv4(&self) -> Option<bool> {
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => Some(true),
            (IpAddr::V6(_), IpAddr::V6(_)) => Some(false),
            _ => None,
        }
    }

    /// Bytes in front of the RoCE packet: Ethernet (and tag) if any, IP, UDP.
    /// [`WireError::BadField`] when source and destination are of different families.
    pub fn header_len(&self) -> Result<usize, WireError> {
        let ip = match self.is_ipv4() {
            Some(true) => IPV4_HDR_LEN,
            Some(false) => IPV6_HDR_LEN,
            None => return Err(WireError::BadField),
        };
        let eth = match self.eth {
            Some(EthMeta { vlan_tci: None, .. }) => ETH_HDR_LEN,
            Some(EthMeta {
                vlan_tci: Some(_), ..
            }) => ETH_HDR_LEN + VLAN_TAG_LEN,
            None => 0,
        };
        Ok(eth + ip + UDP_HDR_LEN)
    }
}

/// Writes the IP + UDP headers for a RoCE packet of `roce_len` bytes into `out` (exactly 28 or
/// 48 bytes, as `header_len` minus the Ethernet part) and returns their length.
fn emit_l3l4(out: &mut [u8], m: &FrameMeta, roce_len: usize) -> Result<usize, WireError> {
    let ip_len = match (m.src_ip, m.dst_ip) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            Ipv4Repr {
                src,
                dst,
                protocol: IPPROTO_UDP,
                payload_len: UDP_HDR_LEN + roce_len,
                tos: m.traffic_class,
                ttl: m.hop_limit,
                ident: m.ipv4_id,
                dont_frag: true,
            }
            .emit(out)?;
            IPV4_HDR_LEN
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            Ipv6Repr {
                src,
                dst,
                next_header: IPPROTO_UDP,
                payload_len: UDP_HDR_LEN + roce_len,
                traffic_class: m.traffic_class,
                flow_label: m.flow_label,
                hop_limit: m.hop_limit,
            }
            .emit(out)?;
            IPV6_HDR_LEN
        }
        _ => return Err(WireError::BadField),
    };
    UdpRepr {
        src_port: m.sport,
        dst_port: m.dport,
        payload_len: roce_len,
        checksum: 0,
    }
    .emit(out.get_mut(ip_len..).ok_or(WireError::Truncated)?)?;
    Ok(ip_len + UDP_HDR_LEN)
}

/// Encapsulates a RoCE packet in place.
///
/// `buf[h..h + roce_len]`, where `h = meta.header_len()?`, must already hold the packet from the
/// BTH up to and including a (zeroed or stale) ICRC slot, e.g. as [`super::emit`] wrote it at
/// offset `h`. This writes the Ethernet header (if `meta.eth` is set), the IPv4 (DF set,
/// checksum filled) or IPv6 header and the UDP header (checksum 0) into `buf[..h]`, fills the
/// ICRC, and returns the frame length `h + roce_len`.
///
/// Frames are not padded to the 60-byte Ethernet minimum; the NIC or the kernel does that.
pub fn encap(buf: &mut [u8], meta: &FrameMeta, roce_len: usize) -> Result<usize, WireError> {
    let h = meta.header_len()?;
    if roce_len < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let total = h.checked_add(roce_len).ok_or(WireError::BadLength)?;
    if buf.len() < total {
        return Err(WireError::Truncated);
    }
    let (hdrs, rest) = buf.split_at_mut(h);
    let roce = &mut rest[..roce_len];
    let eth_len = match meta.eth {
        Some(e) => {
            let r = EthernetRepr {
                src: e.src,
                dst: e.dst,
                ethertype: if meta.is_ipv4() == Some(true) {
                    ethertype::IPV4
                } else {
                    ethertype::IPV6
                },
                vlan_tci: e.vlan_tci,
            };
            r.emit(hdrs)?;
            r.header_len()
        }
        None => 0,
    };
    let l3l4 = &mut hdrs[eth_len..];
    emit_l3l4(l3l4, meta, roce_len)?;
    icrc::fill(l3l4, roce)?;
    Ok(total)
}

/// Copies `roce` (BTH … ICRC slot) into `out` behind freshly built headers and fills the ICRC;
/// returns the frame length. The copying form of [`encap`].
pub fn build(out: &mut [u8], meta: &FrameMeta, roce: &[u8]) -> Result<usize, WireError> {
    let h = meta.header_len()?;
    let end = h.checked_add(roce.len()).ok_or(WireError::BadLength)?;
    out.get_mut(h..end)
        .ok_or(WireError::Truncated)?
        .copy_from_slice(roce);
    encap(out, meta, roce.len())
}

/// A frame whose headers have been checked but whose checksums have not: what
/// [`parse_headers`] returns. [`parse_frame`] is this plus every checksum.
#[derive(Debug, Clone, Copy)]
pub struct RawFrame<'a> {
    pub meta: FrameMeta,
    /// From the IP header to the end of the UDP payload (IP total length; padding excluded).
    l3: &'a [u8],
    ip_hdr_len: usize,
    udp_checksum: u16,
}

impl<'a> RawFrame<'a> {
    /// The IP and UDP headers, as [`crate::icrc`] wants them.
    pub fn l3l4(&self) -> &'a [u8] {
        &self.l3[..self.ip_hdr_len + UDP_HDR_LEN]
    }
    /// The UDP payload: the RoCE packet, BTH through ICRC.
    pub fn roce(&self) -> &'a [u8] {
        &self.l3[self.ip_hdr_len + UDP_HDR_LEN..]
    }
    /// The UDP checksum field (0 from rxe).
    pub fn udp_checksum(&self) -> u16 {
        self.udp_checksum
    }
    /// Verifies the ICRC.
    pub fn verify_icrc(&self) -> Result<(), WireError> {
        icrc::verify(self.l3l4(), self.roce())
    }
    /// Whether the IPv4 header checksum is right (always true for IPv6).
    pub fn ipv4_checksum_ok(&self) -> bool {
        self.ip_hdr_len != IPV4_HDR_LEN
            || Ipv4Packet::new_unchecked(&self.l3[..IPV4_HDR_LEN]).verify_checksum()
    }
    /// Whether the UDP checksum is zero or right.
    pub fn udp_checksum_ok(&self) -> bool {
        UdpPacket::new_unchecked(&self.l3[self.ip_hdr_len..])
            .verify_checksum(self.meta.src_ip, self.meta.dst_ip)
    }
}

/// Parses and checks the headers of a RoCEv2 frame without verifying any checksum.
///
/// `l2`: whether `bytes` starts with an Ethernet II header (at most one 802.1Q tag is skipped)
/// or directly with the IP header. Checks: the ethertype (0x0800 / 0x86DD) agrees with the IP
/// version; IPv4 has no options, is not a fragment and its total length fits in the buffer;
/// IPv6 has no extension header and its payload length fits; the protocol is UDP; the UDP
/// length equals the IP payload length; the destination port is 4791; the RoCE packet holds at
/// least a BTH and an ICRC. At L2 bytes after the IP datagram (Ethernet padding, an FCS) are
/// ignored; at L3 there must be none.
///
/// Errors: [`WireError::Truncated`] when the buffer is shorter than a header or a length field
/// says, [`WireError::BadLength`] for inconsistent lengths, [`WireError::BadField`] for a wrong
/// ethertype, version, protocol, port, IPv4 options or fragment.
pub fn parse_headers(bytes: &[u8], l2: bool) -> Result<RawFrame<'_>, WireError> {
    let (eth, want_v4, ip) = if l2 {
        let f = EthernetFrame::new_checked(bytes)?;
        let r = EthernetRepr::parse(&f)?;
        let want_v4 = match r.ethertype {
            ethertype::IPV4 => true,
            ethertype::IPV6 => false,
            _ => return Err(WireError::BadField),
        };
        let eth = EthMeta {
            src: r.src,
            dst: r.dst,
            vlan_tci: r.vlan_tci,
        };
        (Some(eth), Some(want_v4), &bytes[r.header_len()..])
    } else {
        (None, None, bytes)
    };
    let version = ip.first().ok_or(WireError::Truncated)? >> 4;
    let (meta, ip_hdr_len, ip_total) = match version {
        4 if want_v4 != Some(false) => {
            let p = Ipv4Packet::new_checked(ip)?;
            let r = Ipv4Repr::parse(&p)?;
            if r.protocol != IPPROTO_UDP {
                return Err(WireError::BadField);
            }
            let m = FrameMeta {
                eth,
                src_ip: r.src.into(),
                dst_ip: r.dst.into(),
                sport: 0,
                dport: 0,
                traffic_class: r.tos,
                hop_limit: r.ttl,
                flow_label: 0,
                ipv4_id: r.ident,
            };
            (m, IPV4_HDR_LEN, IPV4_HDR_LEN + r.payload_len)
        }
        6 if want_v4 != Some(true) => {
            let p = Ipv6Packet::new_checked(ip)?;
            let r = Ipv6Repr::parse(&p)?;
            if r.next_header != IPPROTO_UDP {
                return Err(WireError::BadField);
            }
            let m = FrameMeta {
                eth,
                src_ip: r.src.into(),
                dst_ip: r.dst.into(),
                sport: 0,
                dport: 0,
                traffic_class: r.traffic_class,
                hop_limit: r.hop_limit,
                flow_label: r.flow_label,
                ipv4_id: 0,
            };
            (m, IPV6_HDR_LEN, IPV6_HDR_LEN + r.payload_len)
        }
        _ => return Err(WireError::BadField),
    };
    // The IP parsers checked `ip_total <= ip.len()`.
    if !l2 && ip.len() != ip_total {
        return Err(WireError::BadLength);
    }
    let l3 = ip.get(..ip_total).ok_or(WireError::Truncated)?;
    let udp_bytes = &l3[ip_hdr_len..];
    let udp = UdpPacket::new_checked(udp_bytes)?;
    let u = UdpRepr::parse(&udp)?;
    if UDP_HDR_LEN + u.payload_len != udp_bytes.len() {
        return Err(WireError::BadLength);
    }
    if u.dst_port != ROCE_UDP_PORT {
        return Err(WireError::BadField);
    }
    if u.payload_len < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let mut meta = meta;
    meta.sport = u.src_port;
    meta.dport = u.dst_port;
    Ok(RawFrame {
        meta,
        l3,
        ip_hdr_len,
        udp_checksum: u.checksum,
    })
}

/// Parses a received RoCEv2 frame: [`parse_headers`], then the ICRC, a non-zero UDP checksum
/// and the IPv4 header checksum, any of which failing gives [`WireError::BadChecksum`] (see the
/// module documentation). Returns the header fields and the RoCE packet (BTH through ICRC),
/// ready for [`super::Packet::new_checked`].
pub fn parse_frame(bytes: &[u8], l2: bool) -> Result<(FrameMeta, &[u8]), WireError> {
    let f = parse_headers(bytes, l2)?;
    f.verify_icrc()?;
    if !f.udp_checksum_ok() || !f.ipv4_checksum_ok() {
        return Err(WireError::BadChecksum);
    }
    Ok((f.meta, f.roce()))
}

/// Fills the ICRC of `roce` (BTH … ICRC slot) for a datagram that will be sent from a kernel UDP
/// socket bound to `src` to `dst`.
///
/// The ICRC covers the invariant IP header fields, which such a sender does not write itself.
/// For IPv4 the only one it cannot otherwise predict is the identification. Linux chooses it in
/// `ip_select_ident_segs()`: a *connected* socket uses its own counter (`inet_id++`); an
/// unconnected one whose datagram has DF set and `!skb->ignore_df` gets **ID 0**; anything else
/// gets a hashed, unpredictable ID. `ignore_df` is false only with `IP_MTU_DISCOVER` set to
/// `IP_PMTUDISC_DO` or `IP_PMTUDISC_PROBE`, which also sets DF. So the sender must: bind to a
/// concrete source address (not `0.0.0.0`, the ICRC covers it) and port, set
/// `IP_PMTUDISC_DO`, and send with `sendto` on an unconnected socket. Then the header is
/// predictable: version 4, IHL 5, total length 28 + `roce.len()`, ID 0, DF, protocol 17, and
/// the addresses; TOS, TTL and the header checksum are masked by the ICRC, as is the UDP
/// checksum.
///
/// IPv6 has no identification: traffic class, flow label and hop limit are masked, and the
/// payload length, next header (17, no extension headers) and addresses are known.
///
/// Errors: [`WireError::BadField`] if the families differ or `src` is unspecified,
/// [`WireError::Truncated`] if `roce` is shorter than a BTH plus ICRC.
pub fn icrc_for_udp_socket(
    src: SocketAddr,
    dst: SocketAddr,
    roce: &mut [u8],
) -> Result<(), WireError> {
    if src.ip().is_unspecified() {
        return Err(WireError::BadField);
    }
    if roce.len() < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let mut m = FrameMeta::new(src.ip(), dst.ip(), src.port());
    m.dport = dst.port();
    let mut hdr = [0u8; IPV6_HDR_LEN + UDP_HDR_LEN];
    let n = emit_l3l4(&mut hdr, &m, roce.len())?;
    icrc::fill(&hdr[..n], roce)
}

/// Checks the ICRC of a RoCE datagram (`roce`: BTH … ICRC) that a kernel UDP socket bound to
/// `local` received from `src`: the receiving side of [`icrc_for_udp_socket`].
///
/// The IP and UDP headers the ICRC covers are rebuilt from what the socket shows — addresses,
/// ports, and the lengths implied by the datagram's size — with the fields a socket does not
/// show set as rxe sends them: IPv4 DF set and fragment offset 0 (the kernel reassembles
/// fragments, so the sender's values cannot be seen), next header UDP without extension
/// headers. The masked fields (TOS, TTL, traffic class, flow label, hop limit, checksums) do
/// not matter. IPv4-mapped IPv6 addresses count as IPv4.
///
/// IPv6 is checked exactly: `Ok(None)`. IPv4 also covers the identification, which a socket
/// does not show; it is solved for instead ([`icrc::Ipv4IdSolver`]): `Ok(Some(id))` when some
/// ID makes the ICRC match — a random corruption passes with probability 2⁻¹⁶, and a flip in
/// the length, flags or fragment fields never. [`WireError::BadChecksum`] when the ICRC does
/// not match; [`WireError::BadField`] when the families differ or an address is unspecified;
/// [`WireError::Truncated`] when `roce` is shorter than a BTH and an ICRC.
pub fn verify_icrc_from_udp_socket(
    src: SocketAddr,
    local: SocketAddr,
    roce: &[u8],
    solver: &mut icrc::Ipv4IdSolver,
) -> Result<Option<u16>, WireError> {
    let (s, d) = (src.ip().to_canonical(), local.ip().to_canonical());
    if s.is_unspecified() || d.is_unspecified() {
        return Err(WireError::BadField);
    }
    if roce.len() < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated);
    }
    let mut m = FrameMeta::new(s, d, src.port());
    m.dport = local.port();
    let mut hdr = [0u8; IPV6_HDR_LEN + UDP_HDR_LEN];
    let n = emit_l3l4(&mut hdr, &m, roce.len())?;
    if n == IPV4_HDR_LEN + UDP_HDR_LEN {
        solver.verify(&hdr[..n], roce).map(Some)
    } else {
        icrc::verify(&hdr[..n], roce).map(|()| None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{emit, BthRepr, ExtRepr, Opcode, Packet};
    use core::net::{Ipv4Addr, Ipv6Addr};

    fn roce(buf: &mut [u8], at: usize) -> usize {
        let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, 0x345, true);
        let (n, pr) = emit(&mut buf[at..], &bth, &ExtRepr::default(), 5).unwrap();
        buf[at + pr.start..at + pr.end].copy_from_slice(b"hello");
        n
    }

    #[test]
    fn encap_parse_v4_l2() {
        let s = Ipv4Addr::new(10, 0, 0, 1).into();
        let d = Ipv4Addr::new(10, 0, 0, 2).into();
        let mut m = FrameMeta::new(s, d, 0xc011).with_eth([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        m.traffic_class = 0x02;
        m.ipv4_id = 0x1234;
        let h = m.header_len().unwrap();
        assert_eq!(h, 42);
        let mut buf = [0u8; 128];
        let n = roce(&mut buf, h);
        let total = encap(&mut buf, &m, n).unwrap();
        let (pm, r) = parse_frame(&buf[..total], true).unwrap();
        assert_eq!(pm, m);
        assert_eq!(Packet::new_checked(r).unwrap().payload(), b"hello");
        // Ethernet padding is fine at L2; the same bytes at L3 with a trailer are not.
        assert!(parse_frame(&buf[..total + 6], true).is_ok());
        assert!(parse_frame(&buf[14..total], false).is_ok());
        assert_eq!(
            parse_frame(&buf[14..total + 1], false).unwrap_err(),
            WireError::BadLength
        );
    }

    #[test]
    fn udp_socket_icrc_matches_encap_with_id0() {
        for (s, d) in [
            ("10.1.2.3:49152", "10.1.2.4:4791"),
            ("[fd00::1]:49153", "[fd00::2]:4791"),
        ] {
            let s: SocketAddr = s.parse().unwrap();
            let d: SocketAddr = d.parse().unwrap();
            let mut a = [0u8; 128];
            let h = FrameMeta::new(s.ip(), d.ip(), 0).header_len().unwrap();
            let n = roce(&mut a, h);
            let mut m = FrameMeta::new(s.ip(), d.ip(), s.port());
            m.traffic_class = 0x12;
            m.hop_limit = 3;
            m.flow_label = 0xabcde;
            let total = encap(&mut a, &m, n).unwrap();
            let mut b = a[h..h + n].to_vec();
            b[n - 4..].fill(0);
            icrc_for_udp_socket(s, d, &mut b).unwrap();
            assert_eq!(&b[..], &a[h..total]);
        }
        let mut b = [0u8; 16];
        let v4: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert_eq!(
            icrc_for_udp_socket(v4, v6, &mut b),
            Err(WireError::BadField)
        );
        assert_eq!(
            icrc_for_udp_socket(any, v4, &mut b),
            Err(WireError::BadField)
        );
    }

    #[test]
    fn udp_socket_receiver_checks_what_udp_socket_sender_filled() {
        let mut solver = icrc::Ipv4IdSolver::new();
        for (s, d) in [
            ("10.1.2.3:49152", "10.1.2.4:4791"),
            ("[fd00::1]:49153", "[fd00::2]:4791"),
        ] {
            let s: SocketAddr = s.parse().unwrap();
            let d: SocketAddr = d.parse().unwrap();
            let mut b = [0u8; 128];
            let n = roce(&mut b, 0);
            let r = &mut b[..n];
            icrc_for_udp_socket(s, d, r).unwrap();
            let want = if s.is_ipv4() { Some(0) } else { None };
            assert_eq!(verify_icrc_from_udp_socket(s, d, r, &mut solver), Ok(want));
            // Another source port, or a flipped payload bit: rejected.
            let s2 = SocketAddr::new(s.ip(), s.port() ^ 1);
            assert_eq!(
                verify_icrc_from_udp_socket(s2, d, r, &mut solver),
                Err(WireError::BadChecksum)
            );
            r[n - 6] ^= 0x10;
            assert_eq!(
                verify_icrc_from_udp_socket(s, d, r, &mut solver),
                Err(WireError::BadChecksum)
            );
        }
        // A frame sent with a non-zero IPv4 ID (a connected socket, a NIC) is accepted, and
        // the ID is found.
        let s = Ipv4Addr::new(10, 0, 0, 1);
        let d = Ipv4Addr::new(10, 0, 0, 2);
        let mut m = FrameMeta::new(s.into(), d.into(), 0xc123);
        m.ipv4_id = 0xbeef;
        let mut buf = [0u8; 128];
        let h = m.header_len().unwrap();
        let n = roce(&mut buf, h);
        let total = encap(&mut buf, &m, n).unwrap();
        let from = SocketAddr::new(s.into(), 0xc123);
        let mapped = SocketAddr::new(s.to_ipv6_mapped().into(), 0xc123);
        let to = SocketAddr::new(d.into(), ROCE_UDP_PORT);
        for f in [from, mapped] {
            assert_eq!(
                verify_icrc_from_udp_socket(f, to, &buf[h..total], &mut solver),
                Ok(Some(0xbeef))
            );
        }
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        for (a, b) in [(any, to), (from, v6)] {
            assert_eq!(
                verify_icrc_from_udp_socket(a, b, &buf[h..total], &mut solver),
                Err(WireError::BadField)
            );
        }
        assert_eq!(
            verify_icrc_from_udp_socket(from, to, &buf[h..h + 8], &mut solver),
            Err(WireError::Truncated)
        );
    }

    #[test]
    fn mixed_families_rejected() {
        let m = FrameMeta::new(
            Ipv4Addr::LOCALHOST.into(),
            Ipv6Addr::LOCALHOST.into(),
            0xc000,
        );
        assert_eq!(m.header_len(), Err(WireError::BadField));
        let mut buf = [0u8; 128];
        assert_eq!(encap(&mut buf, &m, 16), Err(WireError::BadField));
    }
}
