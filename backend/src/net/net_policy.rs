//! What the guest's NIC (`--net-socket`) may send: every frame the guest transmits is checked
//! here before the host kernel sees it ([`NetPolicy::check_tx`]), and refused — dropped and
//! counted — unless
//!
//! - its virtio-net header asks only for offloads the guest negotiated (NEEDS_CSUM with CSUM,
//!   TCPv4/TCPv6 segmentation with HOST_TSO4/HOST_TSO6, ECN with HOST_ECN; UDP segmentation
//!   never, it is not offered);
//! - it goes from the guest's MAC (`--mac`: the Ethernet source, an ARP sender, a link-layer
//!   address in neighbour discovery), and not to a link-local group (01:80:c2:00:00:00 to
//!   :0f: STP, LLDP, 802.1X, pause);
//! - it is IPv4, ARP or IPv6 (or an EtherType `--net-ethertype` adds), without a VLAN tag;
//! - an IP packet, an ARP sender address and a neighbour advertisement's target are one of the
//!   guest's addresses: those `--net-addr` lists, else the addresses of the guest's GID table
//!   (its RDMA device's ADD_GID, which the guest's kernel keeps equal to its netdev's
//!   addresses); the link-local address of its MAC (EUI-64) always. What a guest without an
//!   address needs passes from the unspecified address: DHCP (UDP 68 to 67), an ARP probe,
//!   duplicate address detection, router solicitations and MLD reports;
//! - RoCEv2 (UDP to port 4791) goes to a destination `--allow-peer` allows, as from the RDMA
//!   device.
//!
//! Options widen it: `--net-ethertype`, `--net-vlan` (tags pass, the frame inside them is
//! checked), `--net-l2-control`, `--net-any-mac` (any source MAC, every frame received: a
//! guest that bridges), `--net-addr 0.0.0.0/0,::/0` (any source address: a guest that routes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_ECN, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6,
    VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_ECN, VIRTIO_NET_HDR_GSO_NONE,
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

use crate::transport::egress::{Cidr, EgressPolicy};

/// The UDP port of RoCEv2.
const ROCE_PORT: u16 = 4791;
const ETH_LEN: usize = 14;
/// The EtherTypes every guest may send.
pub const BASE_ETHERTYPES: [u16; 3] = [0x0800, 0x0806, 0x86dd];
const VLAN_TAGS: [u16; 3] = [0x8100, 0x88a8, 0x9100];

/// The options the policy comes from, and the guest's MAC.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetPolicy {
    /// The guest's MAC (`--mac`).
    pub mac: [u8; 6],
    /// `--net-addr`: the guest's addresses; `None`: its GIDs.
    pub addrs: Option<Vec<Cidr>>,
    /// `--net-ethertype`: EtherTypes allowed besides IPv4, ARP and IPv6 (their frames get the
    /// MAC checks only).
    pub ethertypes: Vec<u16>,
    /// `--net-vlan`: 802.1Q/802.1ad tags pass (the frame inside is checked).
    pub vlan: bool,
    /// `--net-l2-control`: frames to 01:80:c2:00:00:00 … 0f pass.
    pub l2_control: bool,
    /// `--net-any-mac`: any source MAC, and the guest receives frames to every MAC.
    pub any_mac: bool,
    /// `--allow-peer`, for RoCEv2 the guest sends through its NIC.
    pub egress: EgressPolicy,
}

impl NetPolicy {
    /// The default policy for a guest with `mac`.
    pub fn new(mac: [u8; 6]) -> Self {
        NetPolicy {
            mac,
            addrs: None,
            ethertypes: Vec::new(),
            vlan: false,
            l2_control: false,
            any_mac: false,
            egress: EgressPolicy::default(),
        }
    }

    /// The IPv6 link-local address of the guest's MAC (modified EUI-64, RFC 4291).
    pub fn link_local(&self) -> Ipv6Addr {
        let m = self.mac;
        Ipv6Addr::from([
            0xfe,
            0x80,
            0,
            0,
            0,
            0,
            0,
            0,
            m[0] ^ 2,
            m[1],
            m[2],
            0xff,
            0xfe,
            m[3],
            m[4],
            m[5],
        ])
    }

    /// Whether `ip` is the guest's: listed (`--net-addr`) or, without a list, in `learned`
    /// (its GIDs); its link-local address always.
    pub fn owns(&self, learned: &[IpAddr], ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if ip == IpAddr::V6(self.link_local()) {
            return true;
        }
        match &self.addrs {
            Some(list) => list.iter().any(|c| c.contains(ip)),
            None => learned.iter().any(|a| a.to_canonical() == ip),
        }
    }

    /// The addresses of `gids` RoCE may be taken for: all of them without `--net-addr`, else
    /// the ones it lists.
    pub fn roce_addrs(&self, gids: &[IpAddr]) -> Vec<IpAddr> {
        match &self.addrs {
            None => gids.to_vec(),
            Some(list) => gids
                .iter()
                .copied()
                .filter(|a| list.iter().any(|c| c.contains(*a)))
                .collect(),
        }
    }

    /// Checks a frame the guest transmits: `hdr` its virtio-net header (the flags other than
    /// NEEDS_CSUM are cleared: the kernel is asked for nothing else), `frame` the Ethernet
    /// frame, `acked` the features the guest negotiated, `learned` its GIDs' addresses.
    pub fn check_tx(
        &self,
        hdr: &mut [u8; 10],
        frame: &[u8],
        acked: u64,
        learned: &[IpAddr],
    ) -> Result<(), Refusal> {
        offloads_ok(hdr, acked)?;
        if frame.len() < ETH_LEN {
            return Err(Refusal::Malformed);
        }
        if !self.l2_control && frame[..5] == [0x01, 0x80, 0xc2, 0, 0] && frame[5] <= 0x0f {
            return Err(Refusal::L2Control);
        }
        if !self.any_mac && frame[6..12] != self.mac {
            return Err(Refusal::SrcMac);
        }
        let mut at = 12;
        let mut ethertype = be16(frame, at).ok_or(Refusal::Malformed)?;
        let mut tags = 0;
        while VLAN_TAGS.contains(&ethertype) {
            if !self.vlan {
                return Err(Refusal::Vlan);
            }
            tags += 1;
            if tags > 2 {
                return Err(Refusal::Malformed);
            }
            at += 4;
            ethertype = be16(frame, at).ok_or(Refusal::Malformed)?;
        }
        let l3 = &frame[at + 2..];
        match ethertype {
            0x0800 => self.ipv4(l3, learned),
            0x0806 => self.arp(l3, learned),
            0x86dd => self.ipv6(l3, learned),
            t if self.ethertypes.contains(&t) => Ok(()),
            _ => Err(Refusal::EtherType),
        }
    }

    fn arp(&self, a: &[u8], learned: &[IpAddr]) -> Result<(), Refusal> {
        if a.len() < 28 || a[..6] != [0, 1, 8, 0, 6, 4] {
            return Err(Refusal::Malformed);
        }
        if !self.any_mac && a[8..14] != self.mac {
            return Err(Refusal::SrcMac);
        }
        let spa = Ipv4Addr::new(a[14], a[15], a[16], a[17]);
        // The sender of a probe (RFC 5227) has no address yet.
        if spa.is_unspecified() || self.owns(learned, spa.into()) {
            Ok(())
        } else {
            Err(Refusal::SrcIp)
        }
    }

    fn ipv4(&self, p: &[u8], learned: &[IpAddr]) -> Result<(), Refusal> {
        if p.len() < 20 || p[0] >> 4 != 4 {
            return Err(Refusal::Malformed);
        }
        let ihl = (p[0] & 15) as usize * 4;
        if ihl < 20 || p.len() < ihl {
            return Err(Refusal::Malformed);
        }
        let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
        let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
        let first = be16(p, 6).ok_or(Refusal::Malformed)? & 0x1fff == 0;
        // The ports of a UDP datagram: in its first fragment, whole.
        let ports = if p[9] == 17 && first {
            if p.len() < ihl + 8 {
                return Err(Refusal::Malformed);
            }
            Some((be16(p, ihl), be16(p, ihl + 2)))
        } else {
            None
        };
        let dhcp = src.is_unspecified() && ports == Some((Some(68), Some(67)));
        if !dhcp && !self.owns(learned, src.into()) {
            return Err(Refusal::SrcIp);
        }
        self.roce_to(ports, dst.into())
    }

    /// RoCEv2 (UDP to 4791) only to a peer `--allow-peer` allows.
    fn roce_to(
        &self,
        ports: Option<(Option<u16>, Option<u16>)>,
        dst: IpAddr,
    ) -> Result<(), Refusal> {
        match ports {
            Some((_, Some(ROCE_PORT))) if !self.egress.allows(dst) => Err(Refusal::DeniedPeer),
            _ => Ok(()),
        }
    }

    fn ipv6(&self, p: &[u8], learned: &[IpAddr]) -> Result<(), Refusal> {
        if p.len() < 40 || p[0] >> 4 != 6 {
            return Err(Refusal::Malformed);
        }
        let addr = |at: usize| -> Ipv6Addr {
            let b: [u8; 16] = p[at..at + 16].try_into().expect("16 bytes");
            b.into()
        };
        let (src, dst) = (addr(8), addr(24));
        // The upper-layer header behind the extension headers (None: a later fragment).
        let mut next = p[6];
        let mut at = 40usize;
        let mut upper = None;
        for _ in 0..8 {
            match next {
                // hop-by-hop, routing, destination options
                0 | 43 | 60 => {
                    let len = (*p.get(at + 1).ok_or(Refusal::Malformed)? as usize + 1) * 8;
                    next = p[at];
                    at += len;
                }
                // fragment
                44 => {
                    let off = be16(p, at + 2).ok_or(Refusal::Malformed)? & 0xfff8;
                    next = p[at];
                    at += 8;
                    if off != 0 {
                        break;
                    }
                }
                // authentication header
                51 => {
                    let len = (*p.get(at + 1).ok_or(Refusal::Malformed)? as usize + 2) * 4;
                    next = p[at];
                    at += len;
                }
                n => {
                    upper = Some(n);
                    break;
                }
            }
        }
        if at > p.len() {
            return Err(Refusal::Malformed);
        }
        let l4 = &p[at..];
        let mut ports = None;
        let mut icmp_type = None;
        match upper {
            Some(17) => {
                if l4.len() < 8 {
                    return Err(Refusal::Malformed);
                }
                ports = Some((be16(l4, 0), be16(l4, 2)));
            }
            Some(58) => icmp_type = Some(*l4.first().ok_or(Refusal::Malformed)?),
            // Headers chained deeper than we look: nothing can be said of them.
            Some(0 | 43 | 44 | 51 | 60) => return Err(Refusal::Malformed),
            _ => {}
        }
        // Without an address yet: router solicitation, DAD, MLD reports (RFC 4861, 3590).
        let addressless =
            src.is_unspecified() && matches!(icmp_type, Some(133 | 135 | 131 | 132 | 143));
        if !addressless && !self.owns(learned, src.into()) {
            return Err(Refusal::SrcIp);
        }
        if let Some(t @ 133..=137) = icmp_type {
            self.nd(t, l4, learned)?;
        }
        self.roce_to(ports, dst.into())
    }

    /// Neighbour discovery: its link-layer address options hold the guest's MAC, and an
    /// advertisement is for one of the guest's addresses.
    fn nd(&self, t: u8, m: &[u8], learned: &[IpAddr]) -> Result<(), Refusal> {
        let body = match t {
            133 => 8,
            134 => 16,
            135 | 136 => 24,
            _ => 40,
        };
        if m.len() < body {
            return Err(Refusal::Nd);
        }
        if t == 136 {
            let target: [u8; 16] = m[8..24].try_into().expect("16 bytes");
            if !self.owns(learned, Ipv6Addr::from(target).into()) {
                return Err(Refusal::Nd);
            }
        }
        let mut o = &m[body..];
        while !o.is_empty() {
            let len = *o.get(1).ok_or(Refusal::Nd)? as usize * 8;
            if len == 0 || len > o.len() {
                return Err(Refusal::Nd);
            }
            if matches!(o[0], 1 | 2) && !self.any_mac && (len != 8 || o[2..8] != self.mac) {
                return Err(Refusal::Nd);
            }
            o = &o[len..];
        }
        Ok(())
    }
}

/// Why a frame the guest transmitted was refused (each is a counter of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// An offload the guest did not negotiate, or one never offered.
    Offload,
    /// Too short for what it says it is, or headers that cannot be followed.
    Malformed,
    /// To a link-local group (01:80:c2:00:00:0x).
    L2Control,
    /// From a MAC that is not the guest's (Ethernet source, ARP sender).
    SrcMac,
    /// An EtherType not allowed.
    EtherType,
    /// A VLAN tag.
    Vlan,
    /// From an IP address that is not the guest's (IP source, ARP sender).
    SrcIp,
    /// RoCEv2 to a destination `--allow-peer` refuses.
    DeniedPeer,
    /// Neighbour discovery naming another MAC, or advertising another's address.
    Nd,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::Offload,
        Refusal::Malformed,
        Refusal::L2Control,
        Refusal::SrcMac,
        Refusal::EtherType,
        Refusal::Vlan,
        Refusal::SrcIp,
        Refusal::DeniedPeer,
        Refusal::Nd,
    ];

    /// The counter's name.
    pub fn counter(self) -> &'static str {
        match self {
            Refusal::Offload => "tx_bad_offload",
            Refusal::Malformed => "tx_malformed",
            Refusal::L2Control => "tx_l2_control",
            Refusal::SrcMac => "tx_bad_src_mac",
            Refusal::EtherType => "tx_bad_ethertype",
            Refusal::Vlan => "tx_vlan",
            Refusal::SrcIp => "tx_bad_src_ip",
            Refusal::DeniedPeer => "tx_denied_peer",
            Refusal::Nd => "tx_bad_nd",
        }
    }

    pub fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).expect("listed")
    }
}

/// The header asks only for what the guest negotiated (`acked`); flags other than
/// NEEDS_CSUM are cleared.
pub fn offloads_ok(hdr: &mut [u8; 10], acked: u64) -> Result<(), Refusal> {
    let has = |f: u32| acked & (1 << f) != 0;
    hdr[0] &= VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
    if hdr[0] != 0 && !has(VIRTIO_NET_F_CSUM) {
        return Err(Refusal::Offload);
    }
    let ecn = hdr[1] & VIRTIO_NET_HDR_GSO_ECN as u8 != 0;
    let ok = match (hdr[1] & !(VIRTIO_NET_HDR_GSO_ECN as u8)) as u32 {
        VIRTIO_NET_HDR_GSO_NONE => !ecn,
        VIRTIO_NET_HDR_GSO_TCPV4 => has(VIRTIO_NET_F_HOST_TSO4),
        VIRTIO_NET_HDR_GSO_TCPV6 => has(VIRTIO_NET_F_HOST_TSO6),
        // UDP (UFO) and UDP_L4 (USO) are not offered; nothing else exists.
        _ => false,
    };
    let gso = hdr[1] != VIRTIO_NET_HDR_GSO_NONE as u8;
    if !ok || (ecn && !has(VIRTIO_NET_F_HOST_ECN)) || (gso && !has(VIRTIO_NET_F_CSUM)) {
        return Err(Refusal::Offload);
    }
    Ok(())
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The destination MAC a frame the guest receives may have: its own, or a group (broadcast
/// included); with `--net-any-mac` any.
pub fn rx_wanted(p: &NetPolicy, frame: &[u8]) -> bool {
    p.any_mac || frame.first().is_some_and(|b| b & 1 == 1) || frame.get(..6) == Some(&p.mac[..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x52, 0x54, 0, 0x79, 0, 2];
    const ALL: u64 = u64::MAX;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn eth(ethertype: u16) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 1];
        f.extend_from_slice(&MAC);
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    fn udp4(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        let mut f = eth(0x0800);
        f.extend_from_slice(&[0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 17, 0, 0]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 16, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        f
    }

    fn check(p: &NetPolicy, f: &[u8], learned: &[IpAddr]) -> Result<(), Refusal> {
        p.check_tx(&mut [0; 10], f, 0, learned)
    }

    #[test]
    fn the_link_local_address_is_the_macs_eui64() {
        assert_eq!(
            NetPolicy::new(MAC).link_local(),
            "fe80::5054:ff:fe79:2".parse::<Ipv6Addr>().unwrap()
        );
    }

    #[test]
    fn sources_are_the_guests_mac_and_learned_or_listed_addresses() {
        let p = NetPolicy::new(MAC);
        let me = [ip("10.79.0.2")];
        let ok = udp4([10, 79, 0, 2], [10, 79, 0, 1], 9, 9);
        assert_eq!(check(&p, &ok, &me), Ok(()));
        assert_eq!(check(&p, &ok, &[]), Err(Refusal::SrcIp), "not learned yet");
        let mut spoofed = ok.clone();
        spoofed[11] = 9;
        assert_eq!(check(&p, &spoofed, &me), Err(Refusal::SrcMac));
        let mut any = p.clone();
        any.any_mac = true;
        assert_eq!(check(&any, &spoofed, &me), Ok(()));
        let listed = NetPolicy {
            addrs: Some(vec!["10.79.0.0/30".parse().unwrap()]),
            ..p.clone()
        };
        assert_eq!(check(&listed, &ok, &[]), Ok(()), "listed");
        let other = udp4([10, 79, 0, 9], [10, 79, 0, 1], 9, 9);
        assert_eq!(
            check(&listed, &other, &[ip("10.79.0.9")]),
            Err(Refusal::SrcIp)
        );
        assert_eq!(
            listed.roce_addrs(&[ip("10.79.0.9"), ip("10.79.0.3")]),
            [ip("10.79.0.3")]
        );
        // DHCP from 0.0.0.0; nothing else from it.
        let dhcp = udp4([0; 4], [255; 4], 68, 67);
        assert_eq!(check(&p, &dhcp, &[]), Ok(()));
        let zero = udp4([0; 4], [255; 4], 68, 68);
        assert_eq!(check(&p, &zero, &[]), Err(Refusal::SrcIp));
    }

    #[test]
    fn roce_goes_only_to_allowed_peers() {
        let p = NetPolicy {
            egress: EgressPolicy::new(ip("10.79.0.2"), vec!["10.79.0.1".parse().unwrap()]),
            ..NetPolicy::new(MAC)
        };
        let me = [ip("10.79.0.2")];
        assert_eq!(
            check(&p, &udp4([10, 79, 0, 2], [10, 79, 0, 1], 1, 4791), &me),
            Ok(())
        );
        let far = udp4([10, 79, 0, 2], [198, 51, 100, 7], 1, 4791);
        assert_eq!(check(&p, &far, &me), Err(Refusal::DeniedPeer));
        assert_eq!(
            check(&p, &udp4([10, 79, 0, 2], [198, 51, 100, 7], 1, 53), &me),
            Ok(()),
            "not RoCE"
        );
        // A first fragment cut before its ports hides nothing.
        let mut cut = far.clone();
        cut.truncate(14 + 20 + 2);
        assert_eq!(check(&p, &cut, &me), Err(Refusal::Malformed));
    }

    #[test]
    fn tags_groups_and_other_ethertypes_are_refused_unless_allowed() {
        let p = NetPolicy::new(MAC);
        let me = [ip("10.79.0.2")];
        let ok = udp4([10, 79, 0, 2], [10, 79, 0, 1], 9, 9);
        let mut tagged = ok[..12].to_vec();
        tagged.extend_from_slice(&[0x81, 0, 0, 42]);
        tagged.extend_from_slice(&ok[12..]);
        assert_eq!(check(&p, &tagged, &me), Err(Refusal::Vlan));
        let vlan = NetPolicy {
            vlan: true,
            ..p.clone()
        };
        assert_eq!(check(&vlan, &tagged, &me), Ok(()));
        assert_eq!(
            check(&vlan, &tagged, &[]),
            Err(Refusal::SrcIp),
            "inside checked"
        );
        let mut lldp = eth(0x88cc);
        lldp[..6].copy_from_slice(&[0x01, 0x80, 0xc2, 0, 0, 0x0e]);
        assert_eq!(check(&p, &lldp, &me), Err(Refusal::L2Control));
        let open = NetPolicy {
            l2_control: true,
            ethertypes: vec![0x88cc],
            ..p.clone()
        };
        assert_eq!(check(&open, &lldp, &me), Ok(()));
        assert_eq!(check(&p, &eth(0x88b5), &me), Err(Refusal::EtherType));
        assert_eq!(check(&p, &eth(0x0800), &me), Err(Refusal::Malformed));
        assert_eq!(check(&p, &[0; 13], &me), Err(Refusal::Malformed));
    }

    #[test]
    fn offloads_need_their_features() {
        let f = |b: &[u32]| b.iter().fold(0u64, |a, x| a | 1 << x);
        let csum = f(&[VIRTIO_NET_F_CSUM]);
        let tso4 = f(&[VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_TSO4]);
        for (flags, gso, acked, ok) in [
            (0u8, 0u8, 0u64, true),
            (1, 0, 0, false),
            (1, 0, csum, true),
            (1, 1, csum, false),
            (1, 1, tso4, true),
            (1, 1, f(&[VIRTIO_NET_F_HOST_TSO4]), false),
            (1, 4, tso4, false),
            (1, 0x81, tso4, false),
            (1, 0x81, tso4 | f(&[VIRTIO_NET_F_HOST_ECN]), true),
            (0, 0x80, ALL, false),
            (1, 3, ALL, false),
            (1, 5, ALL, false),
            (1, 6, ALL, false),
        ] {
            let mut h = [flags, gso, 0, 0, 0, 0, 0, 0, 0, 0];
            assert_eq!(
                offloads_ok(&mut h, acked).is_ok(),
                ok,
                "{flags} {gso} {acked:#x}"
            );
        }
        let mut h = [0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(offloads_ok(&mut h, csum), Ok(()));
        assert_eq!(h[0], 1, "only NEEDS_CSUM is passed on");
    }

    #[test]
    fn the_receive_filter_keeps_the_guests_mac_and_groups() {
        let p = NetPolicy::new(MAC);
        let to = |m: [u8; 6]| {
            let mut f = m.to_vec();
            f.resize(60, 0);
            f
        };
        assert!(rx_wanted(&p, &to(MAC)));
        assert!(rx_wanted(&p, &to([0xff; 6])));
        assert!(rx_wanted(&p, &to([0x33, 0x33, 0, 0, 0, 1])));
        assert!(!rx_wanted(&p, &to([0x02, 0xaa, 0, 0, 0, 1])));
        assert!(!rx_wanted(&p, &[]));
    }
}
