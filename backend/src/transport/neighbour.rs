//! Answers for the raw transport's addresses: ARP replies ([`arp_reply`]) and IPv6
//! neighbour advertisements ([`nd_reply`]), as the host's stack answers for its own (the
//! device's addresses are on no host interface, so nothing else would).

use std::net::IpAddr;

use crate::transport::filter::{
    ARP_LEN, ETH_LEN, ETH_P_ARP, ETH_P_IPV6, ICMPV6, NA_LEN, ND_ADVERT, ND_SOLICIT,
};

/// Where received frames must be addressed: the MACs and IP addresses we answer to.
#[derive(Clone, Debug)]
pub struct Local {
    pub macs: Vec<[u8; 6]>,
    pub addrs: Vec<IpAddr>,
    /// RoCE to a multicast group (to its Ethernet group address) is ours too.
    pub multicast: bool,
}

/// The big-endian u16 at `at` of `b`.
pub(super) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The 16-bit ones' complement sum (the engine's, `rxe_core::wire::ip::ones_sum`).
pub(crate) use rxe_core::wire::ip::ones_sum as sum16;

/// The Ethernet group address of multicast IP `ip` (RFC 1112, RFC 2464).
pub fn multicast_mac(ip: IpAddr) -> [u8; 6] {
    match ip {
        IpAddr::V4(v) => {
            let o = v.octets();
            [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
        }
        IpAddr::V6(v) => {
            let o = v.octets();
            [0x33, 0x33, o[12], o[13], o[14], o[15]]
        }
    }
}

/// The answer to an ARP request (Ethernet, IPv4) whose target is one of our IPv4 addresses:
/// our MAC for it, sent to the asker, as the host's own stack answers for its addresses (the
/// device's addresses are on no host interface, so nothing else would). `None` for any other
/// frame, ARP reply or request for another address. Never panics.
pub fn arp_reply(local: &Local, mac: [u8; 6], f: &[u8]) -> Option<[u8; ETH_LEN + ARP_LEN]> {
    let a = f.get(ETH_LEN..ETH_LEN + ARP_LEN)?;
    // hardware Ethernet, protocol IPv4, lengths 6 and 4, operation request
    if be16(f, 12) != ETH_P_ARP || a[..8] != [0, 1, 8, 0, 6, 4, 0, 1] {
        return None;
    }
    let sha: [u8; 6] = a[8..14].try_into().expect("6 bytes");
    let spa = &a[14..18];
    let tpa: [u8; 4] = a[24..28].try_into().expect("4 bytes");
    // a multicast or broadcast sender hardware address is no one to answer
    if sha[0] & 1 != 0 || !local.addrs.contains(&IpAddr::from(tpa)) {
        return None;
    }
    let mut r = [0u8; ETH_LEN + ARP_LEN];
    r[..6].copy_from_slice(&sha);
    r[6..12].copy_from_slice(&mac);
    r[12..14].copy_from_slice(&ETH_P_ARP.to_be_bytes());
    let b = &mut r[ETH_LEN..];
    b[..8].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    b[8..14].copy_from_slice(&mac);
    b[14..18].copy_from_slice(&tpa);
    b[18..24].copy_from_slice(&sha);
    b[24..28].copy_from_slice(spa);
    Some(r)
}

/// The answer to an IPv6 neighbour solicitation (RFC 4861 7.2.4) whose target is one of our
/// IPv6 addresses: a neighbour advertisement from that address with our MAC (solicited and
/// override set; to the all-nodes group when the solicitation came from the unspecified
/// address, duplicate address detection). The solicitation must be well formed (hop limit
/// 255, code 0, a good checksum, options of non-zero length). `None` for any other frame.
/// Never panics.
pub fn nd_reply(local: &Local, mac: [u8; 6], f: &[u8]) -> Option<[u8; ETH_LEN + NA_LEN]> {
    if f.len() < ETH_LEN + 40 || be16(f, 12) != ETH_P_IPV6 {
        return None;
    }
    let ip = &f[ETH_LEN..];
    let plen = be16(ip, 4) as usize;
    if ip[0] >> 4 != 6 || ip[6] != ICMPV6 || ip[7] != 255 || plen < 24 || ip.len() < 40 + plen {
        return None;
    }
    let src: [u8; 16] = ip[8..24].try_into().expect("16 bytes");
    let dst: [u8; 16] = ip[24..40].try_into().expect("16 bytes");
    let icmp = &ip[40..40 + plen];
    if icmp[0] != ND_SOLICIT || icmp[1] != 0 || icmpv6_sum(&src, &dst, icmp) != 0xffff {
        return None;
    }
    let target: [u8; 16] = icmp[8..24].try_into().expect("16 bytes");
    if !local.addrs.contains(&IpAddr::from(target)) {
        return None;
    }
    // options: the source link-layer address if there is one; none may have length 0
    let mut asker = None;
    let mut o = &icmp[24..];
    while o.len() >= 2 {
        let len = o[1] as usize * 8;
        if len == 0 || len > o.len() {
            return None;
        }
        if o[0] == 1 && len >= 8 {
            asker = Some(<[u8; 6]>::try_from(&o[2..8]).expect("6 bytes"));
        }
        o = &o[len..];
    }
    let dad = src == [0; 16];
    let (to_ip, to_mac) = if dad {
        let all_nodes = std::net::Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets();
        (all_nodes, [0x33, 0x33, 0, 0, 0, 1])
    } else {
        let m = asker.unwrap_or_else(|| f[6..12].try_into().expect("6 bytes"));
        if m[0] & 1 != 0 {
            return None;
        }
        (src, m)
    };
    let mut r = [0u8; ETH_LEN + NA_LEN];
    r[..6].copy_from_slice(&to_mac);
    r[6..12].copy_from_slice(&mac);
    r[12..14].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
    let ip = &mut r[ETH_LEN..];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&32u16.to_be_bytes());
    ip[6] = ICMPV6;
    ip[7] = 255;
    ip[8..24].copy_from_slice(&target);
    ip[24..40].copy_from_slice(&to_ip);
    let (hdr, na) = ip.split_at_mut(40);
    na[0] = ND_ADVERT;
    // solicited (not for DAD) and override
    na[4] = if dad { 0x20 } else { 0x60 };
    na[8..24].copy_from_slice(&target);
    na[24] = 2; // target link-layer address
    na[25] = 1;
    na[26..32].copy_from_slice(&mac);
    let s: [u8; 16] = hdr[8..24].try_into().expect("16 bytes");
    let d: [u8; 16] = hdr[24..40].try_into().expect("16 bytes");
    let sum = !icmpv6_sum(&s, &d, na);
    na[2..4].copy_from_slice(&sum.to_be_bytes());
    Some(r)
}

/// The ones'-complement sum of the ICMPv6 pseudo-header and `msg` (0xffff: a good checksum).
fn icmpv6_sum(src: &[u8; 16], dst: &[u8; 16], msg: &[u8]) -> u16 {
    let mut ph = [0u8; 8];
    ph[..4].copy_from_slice(&(msg.len() as u32).to_be_bytes());
    ph[7] = ICMPV6;
    let acc = sum16(sum16(sum16(0, src), dst), &ph);
    sum16(acc, msg) as u16
}

/// The Ethernet group a node joins for the solicitations of an IPv6 address (33:33:ff +
/// its last three bytes).
pub(super) fn solicited_node_mac(a: &std::net::Ipv6Addr) -> [u8; 6] {
    let o = a.octets();
    [0x33, 0x33, 0xff, o[13], o[14], o[15]]
}

/// Frames and addresses the transport's tests share.
#[cfg(test)]
pub(super) mod testing {
    use super::*;
    use rxe_core::wire::frame::{encap, FrameMeta};
    use rxe_core::wire::{emit, BthRepr, ExtRepr, Opcode};

    pub(crate) const MAC_A: [u8; 6] = [2, 0x79, 0, 0, 0, 1];
    pub(crate) const MAC_B: [u8; 6] = [2, 0x79, 0, 0, 0, 2];

    pub(crate) fn local(ip: &str) -> Local {
        Local {
            macs: vec![MAC_B],
            addrs: vec![ip.parse().unwrap(), "fd79::2".parse().unwrap()],
            multicast: false,
        }
    }

    /// A RoCE SEND from `src` to `dst` inside Ethernet, as the transport builds it.
    pub(crate) fn frame(src: &str, dst: &str, payload: usize) -> Vec<u8> {
        let m = FrameMeta::new(src.parse().unwrap(), dst.parse().unwrap(), 0xc001)
            .with_eth(MAC_A, MAC_B);
        let h = m.header_len().unwrap();
        let mut buf = vec![0u8; h + 64 + payload];
        let bth = BthRepr::new(Opcode::RC_SEND_ONLY, 0x12, 7, true);
        let (n, pr) = emit(&mut buf[h..], &bth, &ExtRepr::default(), payload).unwrap();
        for (i, b) in buf[h + pr.start..h + pr.end].iter_mut().enumerate() {
            *b = i as u8;
        }
        let len = encap(&mut buf, &m, n).unwrap();
        buf.truncate(len);
        buf
    }

    /// An ARP request (Ethernet, IPv4) from `sha`/`spa` for `tpa`.
    pub(crate) fn arp_request(sha: [u8; 6], spa: &str, tpa: &str) -> Vec<u8> {
        let spa: std::net::Ipv4Addr = spa.parse().unwrap();
        let tpa: std::net::Ipv4Addr = tpa.parse().unwrap();
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&sha);
        f.extend_from_slice(&ETH_P_ARP.to_be_bytes());
        f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&sha);
        f.extend_from_slice(&spa.octets());
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&tpa.octets());
        f.resize(60, 0); // Ethernet padding
        f
    }

    /// A neighbour solicitation from `sha`/`src` for `target` (with the source link-layer
    /// address option unless `src` is unspecified), to the target's solicited-node group.
    pub(crate) fn nd_solicit(sha: [u8; 6], src: &str, target: &str) -> Vec<u8> {
        let src: std::net::Ipv6Addr = src.parse().unwrap();
        let target: std::net::Ipv6Addr = target.parse().unwrap();
        let t = target.octets();
        let dst = std::net::Ipv6Addr::from([
            0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
        ]);
        let mut icmp = vec![ND_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
        icmp.extend_from_slice(&t);
        if !src.is_unspecified() {
            icmp.extend_from_slice(&[1, 1]);
            icmp.extend_from_slice(&sha);
        }
        let sum = !icmpv6_sum(&src.octets(), &dst.octets(), &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut f = solicited_node_mac(&target).to_vec();
        f.extend_from_slice(&sha);
        f.extend_from_slice(&ETH_P_IPV6.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
        f.extend_from_slice(&[ICMPV6, 255]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&icmp);
        f
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{arp_request, frame, local, nd_solicit};
    use super::*;
    use crate::transport::filter::{filter_program, run_bpf, FilterKind};

    #[test]
    fn arp_requests_for_our_addresses_are_answered_with_our_mac() {
        let l = local("10.79.0.2");
        let ours = [0x02, 0x79, 0, 0, 0, 0x0a];
        let peer = [0x02, 0x79, 0, 0, 0, 0x0b];
        let r = arp_reply(&l, ours, &arp_request(peer, "10.79.0.1", "10.79.0.2")).expect("reply");
        let mut want = peer.to_vec();
        want.extend_from_slice(&ours);
        want.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
        want.extend_from_slice(&ours);
        want.extend_from_slice(&[10, 79, 0, 2]);
        want.extend_from_slice(&peer);
        want.extend_from_slice(&[10, 79, 0, 1]);
        assert_eq!(r.to_vec(), want);
        // another target, a reply, a broadcast sender, cut short, not ARP: no answer
        assert!(arp_reply(&l, ours, &arp_request(peer, "10.79.0.1", "10.79.0.3")).is_none());
        let mut rep = arp_request(peer, "10.79.0.1", "10.79.0.2");
        rep[21] = 2;
        assert!(arp_reply(&l, ours, &rep).is_none(), "an ARP reply");
        assert!(arp_reply(&l, ours, &arp_request([0xff; 6], "10.79.0.1", "10.79.0.2")).is_none());
        let f = arp_request(peer, "10.79.0.1", "10.79.0.2");
        for n in 0..ETH_LEN + ARP_LEN {
            assert!(arp_reply(&l, ours, &f[..n]).is_none(), "cut at {n}");
        }
        assert!(arp_reply(&l, ours, &frame("10.79.0.1", "10.79.0.2", 8)).is_none());
        // the kernel filter lets exactly the ARP for our IPv4 addresses through
        let addrs: Vec<IpAddr> = vec!["10.79.0.2".parse().unwrap(), "fd79::2".parse().unwrap()];
        let prog = filter_program(&addrs, FilterKind::RoceAndNeighbours).unwrap();
        assert_ne!(run_bpf(&prog, &f), 0, "ARP for 10.79.0.2");
        let other = arp_request(peer, "10.79.0.1", "10.79.0.3");
        assert_eq!(run_bpf(&prog, &other), 0, "ARP for 10.79.0.3");
    }

    #[test]
    fn neighbour_solicitations_for_our_addresses_are_answered_with_our_mac() {
        let l = local("10.79.0.2"); // and fd79::2
        let ours = [0x02, 0x79, 0, 0, 0, 0x0a];
        let peer = [0x02, 0x79, 0, 0, 0, 0x0b];
        let ns = nd_solicit(peer, "fd79::1", "fd79::2");
        let r = nd_reply(&l, ours, &ns).expect("advertisement");
        assert_eq!(&r[..6], &peer, "to the asker's MAC");
        assert_eq!(&r[6..12], &ours);
        assert_eq!(be16(&r, 12), ETH_P_IPV6);
        let ip = &r[ETH_LEN..];
        assert_eq!((ip[0], be16(ip, 4), ip[6], ip[7]), (0x60, 32, ICMPV6, 255));
        let fd79 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
        assert_eq!(ip[8..24], fd79("fd79::2"), "from the target");
        assert_eq!(ip[24..40], fd79("fd79::1"), "to the asker");
        let na = &ip[40..];
        assert_eq!(
            (na[0], na[1], na[4]),
            (ND_ADVERT, 0, 0x60),
            "solicited, override"
        );
        assert_eq!(na[8..24], fd79("fd79::2"));
        assert_eq!(
            &na[24..32],
            &[2, 1, ours[0], ours[1], ours[2], ours[3], ours[4], ours[5]]
        );
        let (s16, d16) = (
            ip[8..24].try_into().unwrap(),
            ip[24..40].try_into().unwrap(),
        );
        assert_eq!(icmpv6_sum(&s16, &d16, na), 0xffff, "checksum");
        // duplicate address detection: to all nodes, not solicited
        let r = nd_reply(&l, ours, &nd_solicit(peer, "::", "fd79::2")).expect("DAD answer");
        assert_eq!(&r[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(r[ETH_LEN + 24..ETH_LEN + 40], fd79("ff02::1"));
        assert_eq!(r[ETH_LEN + 40 + 4], 0x20);
        // another target, a bad checksum, a forwarded one (hop limit), a zero-length option
        assert!(nd_reply(&l, ours, &nd_solicit(peer, "fd79::1", "fd79::3")).is_none());
        let mut bad = ns.clone();
        bad[ETH_LEN + 40 + 2] ^= 1;
        assert!(nd_reply(&l, ours, &bad).is_none(), "bad checksum");
        let mut fwd = ns.clone();
        fwd[ETH_LEN + 7] = 254;
        assert!(nd_reply(&l, ours, &fwd).is_none(), "hop limit 254");
        let mut zero = ns.clone();
        zero[ETH_LEN + 40 + 25] = 0;
        assert!(nd_reply(&l, ours, &zero).is_none(), "option of length 0");
        for n in 0..ns.len() {
            assert!(nd_reply(&l, ours, &ns[..n]).is_none(), "cut at {n}");
        }
        assert!(nd_reply(&l, ours, &frame("fd79::1", "fd79::2", 8)).is_none());
        // the kernel filter lets exactly the solicitations for our IPv6 addresses through
        let addrs: Vec<IpAddr> = vec!["10.79.0.2".parse().unwrap(), "fd79::2".parse().unwrap()];
        let prog = filter_program(&addrs, FilterKind::RoceAndNeighbours).unwrap();
        assert_ne!(run_bpf(&prog, &ns), 0, "NS for fd79::2");
        let other = nd_solicit(peer, "fd79::1", "fd79::3");
        assert_eq!(run_bpf(&prog, &other), 0, "NS for fd79::3");
        let mut echo = ns.clone();
        echo[ETH_LEN + 40] = 128;
        assert_eq!(run_bpf(&prog, &echo), 0, "an echo request");
    }
}
