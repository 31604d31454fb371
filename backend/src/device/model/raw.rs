//! Raw packet QPs and flow steering (caps RAW_PACKET, docs/virtio-rdma.md §5.13). A raw packet
//! QP's send WQE is a whole Ethernet frame: the engine gathers and completes it
//! (`Device::raw_send`), and the device steers it, as a NIC's embedded switch does, to every
//! other raw packet QP with a flow that matches it (`Device::raw_receive`); a QP made an RSS QP
//! (SET_RSS, §5.14) passes each frame on to the receive-only raw packet QP its indirection
//! table names for the frame's Toeplitz hash. Every raw packet QP lives in shard [`SHARD`],
//! with the flows, so that steering takes no other shard's lock.

use rxe_core::device::RAW_MAX_FRAME;

use super::*;
use crate::abi::flow_layer as layer;
use crate::abi::rss_field as field;
use crate::memory::guest_mem::GuestRam;

/// The shard that holds every raw packet QP.
pub(super) const SHARD: usize = 0;
/// Flows per device at most.
const MAX_FLOWS: usize = 1024;

/// One flow: frames matching `m` go to `qpn`.
struct Flow {
    handle: u32,
    qpn: u32,
    m: abi::FlowMatch,
}

/// An RSS QP's hash and indirection table.
struct Rss {
    fields: u32,
    key: [u8; 40],
    table: Vec<u32>,
}

/// The flows, the RSS QPs, and the buffer frames are gathered into.
#[derive(Default)]
pub(super) struct RawState {
    flows: Vec<Flow>,
    rss: HashMap<u32, Rss>,
    next_handle: u32,
    frame: Vec<u8>,
    /// The QPs a frame goes to (kept between frames).
    targets: Vec<u32>,
}

impl RawState {
    /// DESTROY_QP: the QP's flows go with it.
    pub(super) fn forget_qp(&mut self, qpn: u32) {
        self.flows.retain(|f| f.qpn != qpn);
        self.rss.remove(&qpn);
    }
}

impl Model {
    /// op::CREATE_FLOW.
    pub(super) fn create_flow(&mut self, c: abi::CmdCreateFlow) -> CmdResult {
        if c.flags != 0 || !well_formed(&c.m) {
            return Err(Status::Invalid);
        }
        let mut s = self.shard(c.qpn);
        let raw = s.qps.get(&c.qpn).map(|q| q.qp_type == QpType::RawPacket);
        match raw {
            None => return Err(Status::NotFound),
            Some(false) => return Err(Status::Invalid),
            Some(true) => {}
        }
        let r = &mut s.raw;
        if r.flows.len() >= MAX_FLOWS {
            return Err(Status::NoMemory);
        }
        // Handles start at 1 and are not reused until they wrap.
        r.next_handle = r.next_handle.wrapping_add(1).max(1);
        while r.flows.iter().any(|f| f.handle == r.next_handle) {
            r.next_handle = r.next_handle.wrapping_add(1).max(1);
        }
        let handle = r.next_handle;
        r.flows.push(Flow {
            handle,
            qpn: c.qpn,
            m: c.m,
        });
        body(abi::Handle {
            handle,
            reserved: 0,
        })
    }

    /// op::SET_RSS: `qpn`, a raw packet QP with no ring, spreads what is steered to it over
    /// the table's raw packet QPs (each with a receive ring, none an RSS QP).
    pub(super) fn set_rss(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::CmdSetRss = cmd(b)?;
        let known = field::SRC_IPV4
            | field::DST_IPV4
            | field::SRC_IPV6
            | field::DST_IPV6
            | field::SRC_PORT_TCP
            | field::DST_PORT_TCP
            | field::SRC_PORT_UDP
            | field::DST_PORT_UDP;
        if c.log_table_size > 8 || c.key_len != 40 || c.fields & !known != 0 {
            return Err(Status::Invalid);
        }
        let mut s = lock(&self.shards[SHARD]);
        let kind = |s: &Shard, q: u32| {
            s.qps
                .get(&q)
                .filter(|q| q.qp_type == QpType::RawPacket)
                .map(|q| (q.sq.is_some(), q.rq.is_some()))
        };
        match kind(&s, c.qpn) {
            None if s.qps.contains_key(&c.qpn) => return Err(Status::Invalid),
            None => return Err(Status::NotFound),
            Some((false, false)) => {}
            Some(_) => return Err(Status::Invalid),
        }
        let table = c.table[..1 << c.log_table_size].to_vec();
        for &q in &table {
            match kind(&s, q) {
                Some((_, true)) if q != c.qpn && !s.raw.rss.contains_key(&q) => {}
                None if !s.qps.contains_key(&q) => return Err(Status::NotFound),
                _ => return Err(Status::Invalid),
            }
        }
        s.raw.rss.insert(
            c.qpn,
            Rss {
                fields: c.fields,
                key: c.key,
                table,
            },
        );
        Ok(Vec::new())
    }

    /// op::DESTROY_FLOW.
    pub(super) fn destroy_flow(&mut self, c: abi::Handle) -> CmdResult {
        let mut s = lock(&self.shards[SHARD]);
        let n = s.raw.flows.len();
        s.raw.flows.retain(|f| f.handle != c.handle);
        if s.raw.flows.len() == n {
            return Err(Status::NotFound);
        }
        Ok(Vec::new())
    }
}

impl Shard {
    /// A raw packet QP's send WQE: the engine gathers the frame and completes the WQE; the
    /// frame goes to the QPs whose flows match it. `Err` as `Device::post_send`'s: the WQE
    /// waits in the ring.
    pub(super) fn raw_send(
        &mut self,
        c: &Common,
        mem: &GuestMemoryMmap,
        qpn: u32,
        wr: &SendWr,
    ) -> Result<(), VerbError> {
        let mut frame = std::mem::take(&mut self.raw.frame);
        frame.resize(RAW_MAX_FRAME, 0);
        let r = self.dev.raw_send(Qpn(qpn), wr, &GuestRam(mem), &mut frame);
        let r = match r {
            Ok(sent) => {
                self.stats.sq_wqes += 1;
                if let Some(n) = sent {
                    self.steer(c, mem, qpn, &frame[..n]);
                }
                Ok(())
            }
            Err(e) => Err(e),
        };
        self.raw.frame = frame;
        r
    }

    /// Delivers `frame` to every raw packet QP but `from` with a flow that matches it, once
    /// each.
    fn steer(&mut self, c: &Common, mem: &GuestMemoryMmap, from: u32, frame: &[u8]) {
        let mut targets = std::mem::take(&mut self.raw.targets);
        targets.clear();
        for f in &self.raw.flows {
            if f.qpn == from || !matches(&f.m, frame) {
                continue;
            }
            // An RSS QP hands the frame to the QP of its table the hash names.
            let q = match self.raw.rss.get(&f.qpn) {
                Some(r) => {
                    r.table[toeplitz(&r.key, &hash_input(r.fields, frame)) as usize
                        & (r.table.len() - 1)]
                }
                None => f.qpn,
            };
            if q != from && !targets.contains(&q) {
                targets.push(q);
            }
        }
        for &q in &targets {
            // Its receives are in its ring until a frame comes for them.
            self.pull_rq(c, mem, q);
            let mut ram = GuestRam(mem);
            if self.dev.raw_receive(Qpn(q), frame, &mut ram).is_err() {
                self.stats.raw_dropped += 1;
            }
        }
        self.raw.targets = targets;
    }
}

/// The Toeplitz hash (Microsoft's RSS) of `input` under `key`: for each input bit set, the
/// 32 key bits starting at that bit's position are XORed in.
fn toeplitz(key: &[u8; 40], input: &[u8]) -> u32 {
    let mut h = 0u32;
    // The key's next 32 bits, and the 8 after them shifted in one by one.
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (i, &b) in input.iter().enumerate().take(key.len() - 4) {
        let next = key[i + 4];
        for bit in 0..8 {
            if b & (0x80 >> bit) != 0 {
                h ^= window;
            }
            window = (window << 1) | ((next >> (7 - bit)) & 1) as u32;
        }
    }
    h
}

/// The bytes the hash reads from `frame`, per `fields`: source then destination address
/// (IPv4 or IPv6, whichever the frame is), then source and destination port (of TCP or UDP,
/// whichever the frame carries and `fields` names). Fields the frame lacks are left out.
fn hash_input(fields: u32, frame: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(36);
    let Some(mut ty) = frame.get(12..14).map(|t| [t[0], t[1]]) else {
        return v;
    };
    let mut at = 14;
    if ty == [0x81, 0x00] {
        let Some(t) = frame.get(16..18) else {
            return v;
        };
        (ty, at) = ([t[0], t[1]], 18);
    }
    let ip = &frame[at.min(frame.len())..];
    let (src, dst, proto, l4, want) = match ty {
        [0x08, 0x00] if ip.len() >= 20 => {
            let ihl = (ip[0] & 0xf) as usize * 4;
            let first = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0;
            let l4 = first.then(|| ip.get(ihl..)).flatten();
            let want = (field::SRC_IPV4, field::DST_IPV4);
            (&ip[12..16], &ip[16..20], ip[9], l4, want)
        }
        [0x86, 0xdd] if ip.len() >= 40 => {
            let want = (field::SRC_IPV6, field::DST_IPV6);
            (&ip[8..24], &ip[24..40], ip[6], ip.get(40..), want)
        }
        _ => return v,
    };
    if fields & want.0 != 0 {
        v.extend_from_slice(src);
    }
    if fields & want.1 != 0 {
        v.extend_from_slice(dst);
    }
    let ports = match proto {
        6 => (field::SRC_PORT_TCP, field::DST_PORT_TCP),
        17 => (field::SRC_PORT_UDP, field::DST_PORT_UDP),
        _ => return v,
    };
    if let Some(p) = l4.filter(|p| p.len() >= 4) {
        if fields & ports.0 != 0 {
            v.extend_from_slice(&p[0..2]);
        }
        if fields & ports.1 != 0 {
            v.extend_from_slice(&p[2..4]);
        }
    }
    v
}

/// Masks are only where their field is (no mask bit on a layer that is not required, no
/// TCP and UDP at once, no IPv4 and IPv6 at once).
fn well_formed(m: &abi::FlowMatch) -> bool {
    let l = m.layers;
    let zero = |b: &[u8]| b.iter().all(|&x| x == 0);
    let ip = l & (layer::IPV4 | layer::IPV6) != 0;
    let l4 = l & (layer::TCP | layer::UDP) != 0;
    l & !(layer::IPV4 | layer::IPV6 | layer::TCP | layer::UDP) == 0
        && l & (layer::IPV4 | layer::IPV6) != (layer::IPV4 | layer::IPV6)
        && l & (layer::TCP | layer::UDP) != (layer::TCP | layer::UDP)
        && (!l4 || ip)
        && (ip || (zero(&m.src_ip_mask) && zero(&m.dst_ip_mask) && m.ip_proto_mask == 0))
        && (l & layer::IPV4 == 0 || (zero(&m.src_ip_mask[4..]) && zero(&m.dst_ip_mask[4..])))
        && (l4 || (zero(&m.src_port_mask) && zero(&m.dst_port_mask)))
        && m.reserved0 == [0; 2]
        && m.reserved1 == [0; 2]
}

/// `v` under `mask` equals `want` under `mask`.
fn masked(v: &[u8], want: &[u8], mask: &[u8]) -> bool {
    v.iter()
        .zip(want)
        .zip(mask)
        .all(|((a, b), m)| a & m == b & m)
}

/// Does `frame` match `m`? (Ethernet II, at most one 802.1Q tag; IPv4 with its options; IPv6
/// with the next header right after its fixed header; a fragment other than the first has
/// no ports, so it matches no TCP or UDP flow.)
fn matches(m: &abi::FlowMatch, frame: &[u8]) -> bool {
    let Some(eth) = frame.get(..14) else {
        return false;
    };
    let (mut ty, mut at, mut tci) = ([eth[12], eth[13]], 14, [0u8; 2]);
    if ty == [0x81, 0x00] {
        let Some(t) = frame.get(14..18) else {
            return false;
        };
        (tci, ty, at) = ([t[0], t[1]], [t[2], t[3]], 18);
    }
    if !(masked(&eth[..6], &m.dst_mac, &m.dst_mac_mask)
        && masked(&eth[6..12], &m.src_mac, &m.src_mac_mask)
        && masked(&ty, &m.ether_type, &m.ether_type_mask)
        && masked(&tci, &m.vlan_tci, &m.vlan_tci_mask))
    {
        return false;
    }
    let l = m.layers;
    if l & (layer::IPV4 | layer::IPV6) == 0 {
        return true;
    }
    let ip = &frame[at..];
    let (src, dst, proto, l4): (&[u8], &[u8], u8, Option<&[u8]>) = if l & layer::IPV4 != 0 {
        if ty != [0x08, 0x00] || ip.len() < 20 || ip[0] >> 4 != 4 {
            return false;
        }
        let ihl = (ip[0] & 0xf) as usize * 4;
        let first = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff == 0;
        let l4 = (ihl >= 20 && first).then(|| ip.get(ihl..)).flatten();
        (&ip[12..16], &ip[16..20], ip[9], l4)
    } else {
        if ty != [0x86, 0xdd] || ip.len() < 40 || ip[0] >> 4 != 6 {
            return false;
        }
        (&ip[8..24], &ip[24..40], ip[6], ip.get(40..))
    };
    let n = src.len();
    if !(masked(src, &m.src_ip[..n], &m.src_ip_mask[..n])
        && masked(dst, &m.dst_ip[..n], &m.dst_ip_mask[..n])
        && proto & m.ip_proto_mask == m.ip_proto & m.ip_proto_mask)
    {
        return false;
    }
    let want = match l & (layer::TCP | layer::UDP) {
        0 => return true,
        layer::TCP => 6,
        _ => 17,
    };
    match l4 {
        Some(p) if proto == want && p.len() >= 4 => {
            masked(&p[0..2], &m.src_port, &m.src_port_mask)
                && masked(&p[2..4], &m.dst_port, &m.dst_port_mask)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet/IPv4/UDP frame, or with `vlan` a tagged one.
    fn udp4(vlan: Option<u16>, sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
        if let Some(v) = vlan {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&v.to_be_bytes());
        }
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[192, 0, 2, 1]);
        ip[16..20].copy_from_slice(&[192, 0, 2, 2]);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 8, 0, 0]);
        f
    }

    fn full<const N: usize>() -> [u8; N] {
        [0xff; N]
    }

    #[test]
    fn an_empty_match_takes_every_frame_and_fields_narrow_it() {
        let f = udp4(None, 1000, 2000);
        let mut m = abi::FlowMatch::default();
        assert!(matches(&m, &f), "no field: every frame");
        assert!(!matches(&m, &f[..13]), "not even an Ethernet header");
        m.dst_mac = [2, 0, 0, 0, 0, 2];
        m.dst_mac_mask = full();
        assert!(matches(&m, &f));
        m.dst_mac[5] = 3;
        assert!(!matches(&m, &f), "another destination MAC");
        m.dst_mac_mask[5] = 0;
        assert!(matches(&m, &f), "a byte outside the mask");
    }

    #[test]
    fn ip_and_port_layers_match_their_fields_and_only_their_protocol() {
        let f = udp4(None, 1000, 2000);
        let mut m = abi::FlowMatch {
            layers: layer::IPV4 | layer::UDP,
            dst_port: 2000u16.to_be_bytes(),
            dst_port_mask: full(),
            ..Default::default()
        };
        m.dst_ip[..4].copy_from_slice(&[192, 0, 2, 2]);
        m.dst_ip_mask[..4].copy_from_slice(&[0xff; 4]);
        assert!(well_formed(&m));
        assert!(matches(&m, &f));
        assert!(!matches(&m, &udp4(None, 1000, 2001)), "another port");
        m.layers = layer::IPV4 | layer::TCP;
        assert!(!matches(&m, &f), "a UDP frame is not TCP");
        m.layers = layer::IPV6 | layer::UDP;
        assert!(!matches(&m, &f), "an IPv4 frame is not IPv6");
        // A tagged frame: the EtherType is the inner one, the TCI is matched.
        let t = udp4(Some(0x0123), 1000, 2000);
        m.layers = layer::IPV4 | layer::UDP;
        m.vlan_tci = 0x0123u16.to_be_bytes();
        m.vlan_tci_mask = full();
        assert!(matches(&m, &t));
        assert!(!matches(&m, &f), "an untagged frame has TCI 0");
        // A later fragment has no ports.
        let mut frag = f.clone();
        frag[14 + 7] = 1;
        m.vlan_tci_mask = [0; 2];
        assert!(!matches(&m, &frag));
    }

    /// Microsoft's RSS verification suite ("Verifying the RSS Hash Calculation"): its key,
    /// and the IPv4 and IPv4-with-TCP hashes of its first entries.
    #[test]
    fn the_hash_is_microsofts_toeplitz() {
        const KEY: [u8; 40] = [
            0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3,
            0x8f, 0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3,
            0x80, 0x30, 0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
        ];
        // (destination, source, destination port, source port, IPv4 hash, with TCP)
        type Case = ([u8; 4], [u8; 4], u16, u16, u32, u32);
        let cases: [Case; 3] = [
            (
                [161, 142, 100, 80],
                [66, 9, 149, 187],
                1766,
                2794,
                0x323e8fc2,
                0x51ccc178,
            ),
            (
                [65, 69, 140, 83],
                [199, 92, 111, 2],
                4739,
                14230,
                0xd718262a,
                0xc626b0ea,
            ),
            (
                [12, 22, 207, 184],
                [24, 19, 198, 95],
                38024,
                12898,
                0xd2d0a5de,
                0x5c2b394a,
            ),
        ];
        for (dst, src, dport, sport, ip, tcp) in cases {
            let mut f = vec![0u8; 12];
            f.extend_from_slice(&[0x08, 0x00]);
            let mut h = [0u8; 20];
            h[0] = 0x45;
            h[9] = 6;
            h[12..16].copy_from_slice(&src);
            h[16..20].copy_from_slice(&dst);
            f.extend_from_slice(&h);
            f.extend_from_slice(&sport.to_be_bytes());
            f.extend_from_slice(&dport.to_be_bytes());
            f.extend_from_slice(&[0; 16]);
            let both = field::SRC_IPV4 | field::DST_IPV4;
            assert_eq!(toeplitz(&KEY, &hash_input(both, &f)), ip, "{dst:?}");
            let all = both | field::SRC_PORT_TCP | field::DST_PORT_TCP;
            assert_eq!(toeplitz(&KEY, &hash_input(all, &f)), tcp, "{dst:?} TCP");
            // UDP ports are not TCP's.
            let udp = both | field::SRC_PORT_UDP | field::DST_PORT_UDP;
            assert_eq!(toeplitz(&KEY, &hash_input(udp, &f)), ip, "{dst:?} not UDP");
        }
    }

    #[test]
    fn masks_on_layers_not_required_are_refused() {
        let ok = abi::FlowMatch::default();
        assert!(well_formed(&ok));
        let bad = [
            abi::FlowMatch {
                dst_port_mask: full(),
                ..ok
            },
            abi::FlowMatch {
                ip_proto_mask: 0xff,
                ..ok
            },
            abi::FlowMatch {
                layers: layer::UDP,
                ..ok
            },
            abi::FlowMatch {
                layers: layer::IPV4 | layer::IPV6,
                ..ok
            },
            abi::FlowMatch {
                layers: 1 << 7,
                ..ok
            },
        ];
        for m in bad {
            assert!(!well_formed(&m), "{m:?}");
        }
    }
}
