//! The headers RoCEv2 travels in: Ethernet II (with at most one 802.1Q tag), IPv4 (no options),
//! IPv6 (no extension headers) and UDP.
//!
//! Each header has a zero-copy view (`Foo<T: AsRef<[u8]>>`, with `new_unchecked` / `new_checked`
//! and typed getters and setters) and an owned `FooRepr` with `parse` / `emit`, in the smoltcp
//! style. Nothing here allocates, and no input makes the checked constructors or the `Repr`
//! parsers panic.
//!
//! What Linux `rdma_rxe` puts on the wire (`rxe_net.c`): UDP destination port 4791, UDP checksum
//! 0 over both IPv4 and IPv6; IPv4 with DF set, TOS from the GRH traffic class and TTL from the
//! hop limit (64 by default); IPv6 with the GRH traffic class, flow label and hop limit.

use core::net::{Ipv4Addr, Ipv6Addr};

use super::field::*;
use super::WireError;

/// Ethernet II header length (no VLAN tag).
pub const ETH_HDR_LEN: usize = 14;
/// Length of one 802.1Q tag.
pub const VLAN_TAG_LEN: usize = 4;
/// Option-less IPv4 header length.
pub const IPV4_HDR_LEN: usize = 20;
/// IPv6 fixed header length.
pub const IPV6_HDR_LEN: usize = 40;
/// UDP header length.
pub const UDP_HDR_LEN: usize = 8;
/// The IANA UDP port of RoCEv2.
pub const ROCE_UDP_PORT: u16 = 4791;
/// IP protocol / IPv6 next-header number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// TTL / hop limit rxe uses when the address handle does not say otherwise.
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// Ethertypes this module knows.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const IPV6: u16 = 0x86dd;
    /// An 802.1Q VLAN tag follows the source address.
    pub const VLAN: u16 = 0x8100;
}

/// The 16-bit one's-complement sum of `data` (odd length padded with a zero byte), folded, not
/// inverted, added to `acc`: the internet checksum (RFC 1071) is its complement. The one
/// implementation of it, for the engine's headers and the daemon's frames.
#[inline]
pub fn ones_sum(mut acc: u32, data: &[u8]) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    if let [last] = chunks.remainder() {
        acc += (*last as u32) << 8;
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc
}

// ---------------------------------------------------------------------------------------------
// Ethernet II
// ---------------------------------------------------------------------------------------------

mod eth {
    pub const DST: usize = 0;
    pub const SRC: usize = 6;
    pub const ETHERTYPE: usize = 12;
    /// Inside an 802.1Q tag: TCI at 14, inner ethertype at 16.
    pub const VLAN_TCI: usize = 14;
    pub const VLAN_ETHERTYPE: usize = 16;
}

/// A view of an Ethernet II header (the first 14 bytes of a frame).
#[derive(Debug, Clone, Copy)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    /// Checks the buffer holds the 14-byte header.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        if buf.as_ref().len() < ETH_HDR_LEN {
            return Err(WireError::Truncated);
        }
        Ok(Self { buf })
    }
    pub fn into_inner(self) -> T {
        self.buf
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    #[inline]
    fn mac(&self, at: usize) -> [u8; 6] {
        let mut m = [0u8; 6];
        m.copy_from_slice(&self.b()[at..at + 6]);
        m
    }
    pub fn dst_addr(&self) -> [u8; 6] {
        self.mac(eth::DST)
    }
    pub fn src_addr(&self) -> [u8; 6] {
        self.mac(eth::SRC)
    }
    /// The outer ethertype (0x8100 when a VLAN tag follows).
    pub fn ethertype(&self) -> u16 {
        get_u16(self.b(), eth::ETHERTYPE)
    }
    /// Everything after the 14-byte header (a VLAN tag, if any, is part of it).
    pub fn payload(&self) -> &[u8] {
        &self.b()[ETH_HDR_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    #[inline]
    fn m(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    pub fn set_dst_addr(&mut self, a: [u8; 6]) {
        self.m()[eth::DST..eth::DST + 6].copy_from_slice(&a)
    }
    pub fn set_src_addr(&mut self, a: [u8; 6]) {
        self.m()[eth::SRC..eth::SRC + 6].copy_from_slice(&a)
    }
    pub fn set_ethertype(&mut self, t: u16) {
        set_u16(self.m(), eth::ETHERTYPE, t)
    }
}

/// The owned form of an Ethernet II header, with at most one 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetRepr {
    pub src: [u8; 6],
    pub dst: [u8; 6],
    /// The ethertype of the payload (inside the VLAN tag when there is one).
    pub ethertype: u16,
    /// The 802.1Q tag control information (PCP, DEI, VID), if tagged.
    pub vlan_tci: Option<u16>,
}

impl EthernetRepr {
    /// Reads the header and, when the outer ethertype is 0x8100, one VLAN tag. A second (QinQ)
    /// tag is not unwrapped: the inner ethertype is then 0x8100 and the caller rejects it.
    pub fn parse<T: AsRef<[u8]>>(f: &EthernetFrame<T>) -> Result<Self, WireError> {
        let b = f.b();
        if b.len() < ETH_HDR_LEN {
            return Err(WireError::Truncated);
        }
        let (ethertype, vlan_tci) = if f.ethertype() == ethertype::VLAN {
            if b.len() < ETH_HDR_LEN + VLAN_TAG_LEN {
                return Err(WireError::Truncated);
            }
            (
                get_u16(b, eth::VLAN_ETHERTYPE),
                Some(get_u16(b, eth::VLAN_TCI)),
            )
        } else {
            (f.ethertype(), None)
        };
        Ok(Self {
            src: f.src_addr(),
            dst: f.dst_addr(),
            ethertype,
            vlan_tci,
        })
    }
    /// Header length including the VLAN tag.
    pub const fn header_len(&self) -> usize {
        match self.vlan_tci {
            Some(_) => ETH_HDR_LEN + VLAN_TAG_LEN,
            None => ETH_HDR_LEN,
        }
    }
    /// Writes the header (and tag) at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < self.header_len() {
            return Err(WireError::Truncated);
        }
        let mut f = EthernetFrame::new_unchecked(&mut *buf);
        f.set_dst_addr(self.dst);
        f.set_src_addr(self.src);
        match self.vlan_tci {
            Some(tci) => {
                f.set_ethertype(ethertype::VLAN);
                set_u16(buf, eth::VLAN_TCI, tci);
                set_u16(buf, eth::VLAN_ETHERTYPE, self.ethertype);
            }
            None => f.set_ethertype(self.ethertype),
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// IPv4
// ---------------------------------------------------------------------------------------------

mod v4 {
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

const IPV4_DF: u16 = 0x4000;
const IPV4_MF: u16 = 0x2000;
const IPV4_FRAG_MASK: u16 = 0x1fff;

/// A view of an IPv4 header and its payload.
#[derive(Debug, Clone, Copy)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    /// Checks the version is 4, the header (with any options) fits, and the total length covers
    /// the header and fits in the buffer. After this no accessor can index out of bounds; bytes
    /// beyond the total length (link-layer padding) are ignored by [`Self::payload`].
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self { buf };
        let len = p.b().len();
        if len < IPV4_HDR_LEN {
            return Err(WireError::Truncated);
        }
        if p.version() != 4 {
            return Err(WireError::BadField);
        }
        let hl = p.header_len();
        if hl < IPV4_HDR_LEN {
            return Err(WireError::BadField);
        }
        if len < hl {
            return Err(WireError::Truncated);
        }
        let tl = p.total_len() as usize;
        if tl < hl {
            return Err(WireError::BadLength);
        }
        if tl > len {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }
    pub fn into_inner(self) -> T {
        self.buf
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    pub fn version(&self) -> u8 {
        self.b()[v4::VER_IHL] >> 4
    }
    /// Header length in bytes (IHL × 4).
    pub fn header_len(&self) -> usize {
        ((self.b()[v4::VER_IHL] & 0x0f) as usize) * 4
    }
    /// The type-of-service byte (DSCP and ECN).
    pub fn tos(&self) -> u8 {
        self.b()[v4::TOS]
    }
    pub fn total_len(&self) -> u16 {
        get_u16(self.b(), v4::TOTAL_LEN)
    }
    pub fn ident(&self) -> u16 {
        get_u16(self.b(), v4::IDENT)
    }
    pub fn dont_frag(&self) -> bool {
        get_u16(self.b(), v4::FLAGS_FRAG) & IPV4_DF != 0
    }
    pub fn more_frags(&self) -> bool {
        get_u16(self.b(), v4::FLAGS_FRAG) & IPV4_MF != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        get_u16(self.b(), v4::FLAGS_FRAG) & IPV4_FRAG_MASK
    }
    pub fn ttl(&self) -> u8 {
        self.b()[v4::TTL]
    }
    pub fn protocol(&self) -> u8 {
        self.b()[v4::PROTOCOL]
    }
    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), v4::CHECKSUM)
    }
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(get_u32(self.b(), v4::SRC))
    }
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(get_u32(self.b(), v4::DST))
    }
    /// Whether the header checksum is right (the one's-complement sum over the header is 0xffff).
    /// Needs a checked view.
    pub fn verify_checksum(&self) -> bool {
        ones_sum(0, &self.b()[..self.header_len()]) == 0xffff
    }
    /// The header, options included.
    pub fn header(&self) -> &[u8] {
        &self.b()[..self.header_len()]
    }
    /// The payload up to the total length. Needs a checked view.
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    #[inline]
    fn m(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    /// Sets version 4 and the header length in bytes (a multiple of four, 20..=60).
    pub fn set_version_and_header_len(&mut self, hl: usize) {
        self.m()[v4::VER_IHL] = 0x40 | ((hl / 4) as u8 & 0x0f);
    }
    pub fn set_tos(&mut self, v: u8) {
        self.m()[v4::TOS] = v;
    }
    pub fn set_total_len(&mut self, v: u16) {
        set_u16(self.m(), v4::TOTAL_LEN, v)
    }
    pub fn set_ident(&mut self, v: u16) {
        set_u16(self.m(), v4::IDENT, v)
    }
    /// Sets the flags and fragment offset: DF as given, MF clear, offset 0.
    pub fn set_dont_frag(&mut self, df: bool) {
        set_u16(self.m(), v4::FLAGS_FRAG, if df { IPV4_DF } else { 0 })
    }
    pub fn set_ttl(&mut self, v: u8) {
        self.m()[v4::TTL] = v;
    }
    pub fn set_protocol(&mut self, v: u8) {
        self.m()[v4::PROTOCOL] = v;
    }
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.m(), v4::CHECKSUM, v)
    }
    pub fn set_src_addr(&mut self, a: Ipv4Addr) {
        self.m()[v4::SRC..v4::SRC + 4].copy_from_slice(&a.octets())
    }
    pub fn set_dst_addr(&mut self, a: Ipv4Addr) {
        self.m()[v4::DST..v4::DST + 4].copy_from_slice(&a.octets())
    }
    /// Computes and stores the header checksum over `header_len()` bytes.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let s = ones_sum(0, &self.b()[..hl]);
        self.set_checksum(!(s as u16));
    }
}

/// The owned form of an option-less, unfragmented IPv4 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Repr {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    /// Length of the payload (total length − 20).
    pub payload_len: usize,
    /// DSCP + ECN: rxe copies the GRH traffic class here.
    pub tos: u8,
    pub ttl: u8,
    pub ident: u16,
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Reads a header from a checked view. Options (IHL ≠ 5) and fragments are rejected with
    /// [`WireError::BadField`]: RoCEv2 never uses them, and the ICRC is only defined over an
    /// option-less header. The header checksum is *not* checked here; see
    /// [`Ipv4Packet::verify_checksum`].
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Self, WireError> {
        let len = p.b().len();
        if len < IPV4_HDR_LEN {
            return Err(WireError::Truncated);
        }
        if p.version() != 4 || p.header_len() != IPV4_HDR_LEN {
            return Err(WireError::BadField);
        }
        let tl = p.total_len() as usize;
        if tl < IPV4_HDR_LEN {
            return Err(WireError::BadLength);
        }
        if tl > len {
            return Err(WireError::Truncated);
        }
        if p.more_frags() || p.frag_offset() != 0 {
            return Err(WireError::BadField);
        }
        Ok(Self {
            src: p.src_addr(),
            dst: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: tl - IPV4_HDR_LEN,
            tos: p.tos(),
            ttl: p.ttl(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
        })
    }
    pub const fn header_len(&self) -> usize {
        IPV4_HDR_LEN
    }
    /// Writes the 20-byte header, checksum included, at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < IPV4_HDR_LEN {
            return Err(WireError::Truncated);
        }
        let total = IPV4_HDR_LEN + self.payload_len;
        if total > u16::MAX as usize {
            return Err(WireError::BadLength);
        }
        let mut p = Ipv4Packet::new_unchecked(&mut buf[..IPV4_HDR_LEN]);
        p.set_version_and_header_len(IPV4_HDR_LEN);
        p.set_tos(self.tos);
        p.set_total_len(total as u16);
        p.set_ident(self.ident);
        p.set_dont_frag(self.dont_frag);
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        p.fill_checksum();
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// IPv6
// ---------------------------------------------------------------------------------------------

mod v6 {
    pub const VER_TC_FL: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: usize = 8;
    pub const DST: usize = 24;
}

/// A view of an IPv6 fixed header and its payload.
#[derive(Debug, Clone, Copy)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    /// Checks the version is 6 and the header plus the payload length fit in the buffer.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self { buf };
        let len = p.b().len();
        if len < IPV6_HDR_LEN {
            return Err(WireError::Truncated);
        }
        if p.version() != 6 {
            return Err(WireError::BadField);
        }
        if IPV6_HDR_LEN + p.payload_len() as usize > len {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }
    pub fn into_inner(self) -> T {
        self.buf
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    pub fn version(&self) -> u8 {
        self.b()[v6::VER_TC_FL] >> 4
    }
    pub fn traffic_class(&self) -> u8 {
        ((get_u16(self.b(), v6::VER_TC_FL) >> 4) & 0xff) as u8
    }
    pub fn flow_label(&self) -> u32 {
        get_u32(self.b(), v6::VER_TC_FL) & 0x000f_ffff
    }
    pub fn payload_len(&self) -> u16 {
        get_u16(self.b(), v6::PAYLOAD_LEN)
    }
    pub fn next_header(&self) -> u8 {
        self.b()[v6::NEXT_HEADER]
    }
    pub fn hop_limit(&self) -> u8 {
        self.b()[v6::HOP_LIMIT]
    }
    pub fn src_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[v6::SRC..v6::SRC + 16]);
        Ipv6Addr::from(a)
    }
    pub fn dst_addr(&self) -> Ipv6Addr {
        let mut a = [0u8; 16];
        a.copy_from_slice(&self.b()[v6::DST..v6::DST + 16]);
        Ipv6Addr::from(a)
    }
    /// The payload up to the payload length. Needs a checked view.
    pub fn payload(&self) -> &[u8] {
        &self.b()[IPV6_HDR_LEN..IPV6_HDR_LEN + self.payload_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    #[inline]
    fn m(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    /// Sets the first word: version 6, traffic class and (20-bit) flow label.
    pub fn set_version_tc_flow(&mut self, tc: u8, flow_label: u32) {
        let w = (6u32 << 28) | ((tc as u32) << 20) | (flow_label & 0x000f_ffff);
        set_u32(self.m(), v6::VER_TC_FL, w)
    }
    pub fn set_payload_len(&mut self, v: u16) {
        set_u16(self.m(), v6::PAYLOAD_LEN, v)
    }
    pub fn set_next_header(&mut self, v: u8) {
        self.m()[v6::NEXT_HEADER] = v;
    }
    pub fn set_hop_limit(&mut self, v: u8) {
        self.m()[v6::HOP_LIMIT] = v;
    }
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.m()[v6::SRC..v6::SRC + 16].copy_from_slice(&a.octets())
    }
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.m()[v6::DST..v6::DST + 16].copy_from_slice(&a.octets())
    }
}

/// The owned form of an IPv6 fixed header (no extension headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Repr {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub next_header: u8,
    pub payload_len: usize,
    pub traffic_class: u8,
    /// 20 bits.
    pub flow_label: u32,
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// Reads the fixed header. Extension headers are not followed: a caller expecting UDP checks
    /// `next_header` itself.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Result<Self, WireError> {
        let len = p.b().len();
        if len < IPV6_HDR_LEN {
            return Err(WireError::Truncated);
        }
        if p.version() != 6 {
            return Err(WireError::BadField);
        }
        let pl = p.payload_len() as usize;
        if IPV6_HDR_LEN + pl > len {
            return Err(WireError::Truncated);
        }
        Ok(Self {
            src: p.src_addr(),
            dst: p.dst_addr(),
            next_header: p.next_header(),
            payload_len: pl,
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            hop_limit: p.hop_limit(),
        })
    }
    pub const fn header_len(&self) -> usize {
        IPV6_HDR_LEN
    }
    /// Writes the 40-byte header at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < IPV6_HDR_LEN {
            return Err(WireError::Truncated);
        }
        if self.payload_len > u16::MAX as usize {
            return Err(WireError::BadLength);
        }
        let mut p = Ipv6Packet::new_unchecked(&mut buf[..IPV6_HDR_LEN]);
        p.set_version_tc_flow(self.traffic_class, self.flow_label);
        p.set_payload_len(self.payload_len as u16);
        p.set_next_header(self.next_header);
        p.set_hop_limit(self.hop_limit);
        p.set_src_addr(self.src);
        p.set_dst_addr(self.dst);
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// UDP
// ---------------------------------------------------------------------------------------------

mod udp {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
}

/// A view of a UDP header and its payload.
#[derive(Debug, Clone, Copy)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    /// Checks the header fits and the length field is at least 8 and fits in the buffer.
    pub fn new_checked(buf: T) -> Result<Self, WireError> {
        let p = Self { buf };
        let len = p.b().len();
        if len < UDP_HDR_LEN {
            return Err(WireError::Truncated);
        }
        let ul = p.len() as usize;
        if ul < UDP_HDR_LEN {
            return Err(WireError::BadLength);
        }
        if ul > len {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }
    pub fn into_inner(self) -> T {
        self.buf
    }
    #[inline]
    fn b(&self) -> &[u8] {
        self.buf.as_ref()
    }
    pub fn src_port(&self) -> u16 {
        get_u16(self.b(), udp::SRC_PORT)
    }
    pub fn dst_port(&self) -> u16 {
        get_u16(self.b(), udp::DST_PORT)
    }
    /// The length field (header plus payload).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        get_u16(self.b(), udp::LENGTH)
    }
    pub fn checksum(&self) -> u16 {
        get_u16(self.b(), udp::CHECKSUM)
    }
    /// The payload up to the length field. Needs a checked view.
    pub fn payload(&self) -> &[u8] {
        &self.b()[UDP_HDR_LEN..self.len() as usize]
    }
    /// Checks the UDP checksum against the IP addresses. A zero checksum ("none") passes: rxe
    /// always sends zero, over IPv6 too (RFC 6935 zero-checksum tunnels). Needs a checked view.
    pub fn verify_checksum(&self, src: core::net::IpAddr, dst: core::net::IpAddr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let dgram = &self.b()[..self.len() as usize];
        udp_checksum_sum(src, dst, dgram) == 0xffff
    }
}

/// One's-complement sum of the UDP pseudo header for a datagram of `len` bytes.
fn udp_pseudo_sum(src: core::net::IpAddr, dst: core::net::IpAddr, len: usize) -> u32 {
    use core::net::IpAddr;
    let acc = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => ones_sum(ones_sum(0, &s.octets()), &d.octets()),
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            ones_sum(ones_sum(0, &v6(s).octets()), &v6(d).octets())
        }
    };
    let l = len as u32;
    acc + IPPROTO_UDP as u32 + (l >> 16) + (l & 0xffff)
}

/// One's-complement sum of the UDP pseudo header and datagram (checksum field included).
fn udp_checksum_sum(src: core::net::IpAddr, dst: core::net::IpAddr, dgram: &[u8]) -> u32 {
    ones_sum(udp_pseudo_sum(src, dst, dgram.len()), dgram)
}

/// The UDP checksum of a datagram (header, whose checksum field is ignored, plus payload)
/// between two addresses, as it should be stored: a computed 0 is sent as 0xffff.
pub fn udp_checksum(src: core::net::IpAddr, dst: core::net::IpAddr, dgram: &[u8]) -> u16 {
    let n = dgram.len().min(UDP_HDR_LEN - 2);
    let mut acc = ones_sum(udp_pseudo_sum(src, dst, dgram.len()), &dgram[..n]);
    if dgram.len() > UDP_HDR_LEN {
        acc = ones_sum(acc, &dgram[UDP_HDR_LEN..]);
    }
    match !(acc as u16) {
        0 => 0xffff,
        c => c,
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    #[inline]
    fn m(&mut self) -> &mut [u8] {
        self.buf.as_mut()
    }
    pub fn set_src_port(&mut self, v: u16) {
        set_u16(self.m(), udp::SRC_PORT, v)
    }
    pub fn set_dst_port(&mut self, v: u16) {
        set_u16(self.m(), udp::DST_PORT, v)
    }
    pub fn set_len(&mut self, v: u16) {
        set_u16(self.m(), udp::LENGTH, v)
    }
    pub fn set_checksum(&mut self, v: u16) {
        set_u16(self.m(), udp::CHECKSUM, v)
    }
}

/// The owned form of a UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpRepr {
    pub src_port: u16,
    pub dst_port: u16,
    /// Length of the payload (length field − 8).
    pub payload_len: usize,
    pub checksum: u16,
}

impl UdpRepr {
    /// Reads the header of a checked view. The checksum is reported, not verified.
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Result<Self, WireError> {
        let len = p.b().len();
        if len < UDP_HDR_LEN {
            return Err(WireError::Truncated);
        }
        let ul = p.len() as usize;
        if ul < UDP_HDR_LEN {
            return Err(WireError::BadLength);
        }
        if ul > len {
            return Err(WireError::Truncated);
        }
        Ok(Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: ul - UDP_HDR_LEN,
            checksum: p.checksum(),
        })
    }
    /// Writes the 8-byte header (checksum as given; RoCEv2 uses 0).
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        if buf.len() < UDP_HDR_LEN {
            return Err(WireError::Truncated);
        }
        let total = UDP_HDR_LEN + self.payload_len;
        if total > u16::MAX as usize {
            return Err(WireError::BadLength);
        }
        let mut p = UdpPacket::new_unchecked(&mut buf[..UDP_HDR_LEN]);
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(total as u16);
        p.set_checksum(self.checksum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // The ConnectX-4 Lx CNP of tests/data/icrc-vectors.txt.
    const CNP: &str = "e41d2dab2bc27cfe90643b320800 45c2003c718c400040119161 0a0011010a0012010000 \
        12b700280000 8100ffff400001180000000000000000000000000000000000000000 82fd002a";

    #[test]
    fn parse_real_cnp_headers() {
        let b = hex(CNP);
        let e = EthernetFrame::new_checked(&b[..]).unwrap();
        let er = EthernetRepr::parse(&e).unwrap();
        assert_eq!(er.ethertype, ethertype::IPV4);
        assert_eq!(er.dst, [0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2]);
        assert_eq!(er.vlan_tci, None);
        let ip = Ipv4Packet::new_checked(e.payload()).unwrap();
        assert!(ip.verify_checksum());
        let r = Ipv4Repr::parse(&ip).unwrap();
        assert_eq!(r.src, Ipv4Addr::new(10, 0, 17, 1));
        assert_eq!(r.dst, Ipv4Addr::new(10, 0, 18, 1));
        assert_eq!(
            (r.tos, r.ttl, r.ident, r.dont_frag),
            (0xc2, 64, 0x718c, true)
        );
        assert_eq!(r.payload_len, 40);
        // Re-emitting gives the same bytes, checksum included.
        let mut out = [0u8; 20];
        r.emit(&mut out).unwrap();
        assert_eq!(&out[..], ip.header());
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        let ur = UdpRepr::parse(&u).unwrap();
        assert_eq!(
            (ur.src_port, ur.dst_port, ur.payload_len),
            (0, ROCE_UDP_PORT, 32)
        );
        assert!(u.verify_checksum(r.src.into(), r.dst.into()));
        let mut o = [0u8; 8];
        ur.emit(&mut o).unwrap();
        assert_eq!(&o[..], &ip.payload()[..8]);
    }

    #[test]
    fn udp_checksum_scapy_vector() {
        // tests/data/icrc-vectors.txt `uc_scapy_l3`: UDP checksum 0xaca2 computed by scapy.
        let b = hex(
            "4501 0040 0478 4000 4011 b4d5 c0a80007 c0a80007 c000 12b7 002c aca2 2460ffff \
             000000d3 00cf1710 4630818be28935d90e9a955054 01be885e50 0000 78f353f3",
        );
        let ip = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert!(ip.verify_checksum());
        let r = Ipv4Repr::parse(&ip).unwrap();
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(u.verify_checksum(r.src.into(), r.dst.into()));
        assert_eq!(
            udp_checksum(r.src.into(), r.dst.into(), ip.payload()),
            0xaca2
        );
        let mut bad = b.clone();
        bad[30] ^= 1;
        let ip = Ipv4Packet::new_checked(&bad[..]).unwrap();
        let u = UdpPacket::new_checked(ip.payload()).unwrap();
        assert!(!u.verify_checksum(r.src.into(), r.dst.into()));
    }

    #[test]
    fn ipv4_rejects() {
        let b = hex(CNP);
        let ip = &b[14..];
        assert_eq!(
            Ipv4Packet::new_checked(&ip[..19]).unwrap_err(),
            WireError::Truncated
        );
        let mut v = ip.to_vec();
        v[0] = 0x46; // options
        let p = Ipv4Packet::new_checked(&v[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p).unwrap_err(), WireError::BadField);
        v[0] = 0x44; // IHL 4 < 5
        assert_eq!(
            Ipv4Packet::new_checked(&v[..]).unwrap_err(),
            WireError::BadField
        );
        v[0] = 0x65;
        assert_eq!(
            Ipv4Packet::new_checked(&v[..]).unwrap_err(),
            WireError::BadField
        );
        v[0] = 0x45;
        v[6] = 0x20; // MF
        let p = Ipv4Packet::new_checked(&v[..]).unwrap();
        assert_eq!(Ipv4Repr::parse(&p).unwrap_err(), WireError::BadField);
        v[6] = 0x40;
        v[3] = 0x3d; // total length one past the buffer
        assert_eq!(
            Ipv4Packet::new_checked(&v[..]).unwrap_err(),
            WireError::Truncated
        );
        v[2] = 0;
        v[3] = 19;
        assert_eq!(
            Ipv4Packet::new_checked(&v[..]).unwrap_err(),
            WireError::BadLength
        );
        v[3] = 0x3c;
        v[8] = 1; // TTL changed, checksum now wrong
        assert!(!Ipv4Packet::new_checked(&v[..]).unwrap().verify_checksum());
        let mut p = Ipv4Packet::new_checked(&mut v[..]).unwrap();
        p.fill_checksum();
        assert!(p.verify_checksum());
    }

    #[test]
    fn ipv6_and_vlan_roundtrip() {
        let r = Ipv6Repr {
            src: "fe80::1".parse().unwrap(),
            dst: "2001:db8::2".parse().unwrap(),
            next_header: IPPROTO_UDP,
            payload_len: 4,
            traffic_class: 0xa5,
            flow_label: 0xf_1234,
            hop_limit: 64,
        };
        let mut b = [0u8; 44];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x6a, 0x5f, 0x12, 0x34]);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Ipv6Repr::parse(&p).unwrap(), r);
        assert_eq!(p.payload().len(), 4);
        assert_eq!(
            Ipv6Packet::new_checked(&b[..43]).unwrap_err(),
            WireError::Truncated
        );
        b[0] = 0x4a;
        assert_eq!(
            Ipv6Packet::new_checked(&b[..]).unwrap_err(),
            WireError::BadField
        );

        let e = EthernetRepr {
            src: [2, 0, 0, 0, 0, 1],
            dst: [2, 0, 0, 0, 0, 2],
            ethertype: ethertype::IPV6,
            vlan_tci: Some(0x6005),
        };
        let mut f = [0u8; 18];
        e.emit(&mut f).unwrap();
        assert_eq!(&f[12..], &[0x81, 0x00, 0x60, 0x05, 0x86, 0xdd]);
        let v = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&v).unwrap(), e);
        let v = EthernetFrame::new_checked(&f[..16]).unwrap();
        assert_eq!(EthernetRepr::parse(&v).unwrap_err(), WireError::Truncated);
        assert!(EthernetFrame::new_checked(&f[..13]).is_err());
    }

    #[test]
    fn udp_rejects() {
        let mut u = [0u8; 12];
        UdpRepr {
            src_port: 0xc000,
            dst_port: ROCE_UDP_PORT,
            payload_len: 4,
            checksum: 0,
        }
        .emit(&mut u)
        .unwrap();
        assert_eq!(&u[..8], &[0xc0, 0, 0x12, 0xb7, 0, 12, 0, 0]);
        assert!(UdpPacket::new_checked(&u[..]).is_ok());
        assert_eq!(
            UdpPacket::new_checked(&u[..11]).unwrap_err(),
            WireError::Truncated
        );
        u[5] = 7;
        assert_eq!(
            UdpPacket::new_checked(&u[..]).unwrap_err(),
            WireError::BadLength
        );
    }

    #[test]
    fn never_panics_on_short_input() {
        let b = hex(CNP);
        for n in 0..b.len() {
            let s = &b[..n];
            if let Ok(e) = EthernetFrame::new_checked(s) {
                let _ = EthernetRepr::parse(&e);
            }
            for off in [0usize, 14] {
                let s = s.get(off..).unwrap_or(&[]);
                if let Ok(p) = Ipv4Packet::new_checked(s) {
                    let _ = (Ipv4Repr::parse(&p), p.verify_checksum(), p.payload());
                }
                if let Ok(p) = Ipv6Packet::new_checked(s) {
                    let _ = (Ipv6Repr::parse(&p), p.payload());
                }
                if let Ok(p) = UdpPacket::new_checked(s) {
                    let _ = (UdpRepr::parse(&p), p.payload());
                }
            }
        }
    }
}
