//! Raw packet QPs and flow steering (caps RAW_PACKET, docs/virtio-rdma.md §5.13). A raw packet
//! QP's send WQE is a whole Ethernet frame: the engine gathers and completes it
//! (`Device::raw_send`), and the device steers it, as a NIC's embedded switch does, to every
//! other raw packet QP with a flow that matches it (`Device::raw_receive`). Every raw packet QP
//! lives in shard [`SHARD`], with the flows, so that steering takes no other shard's lock.

use rxe_core::device::RAW_MAX_FRAME;

use super::*;
use crate::abi::flow_layer as layer;
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

/// The flows, and the buffer frames are gathered into.
#[derive(Default)]
pub(super) struct RawState {
    flows: Vec<Flow>,
    next_handle: u32,
    frame: Vec<u8>,
    /// The QPs a frame goes to (kept between frames).
    targets: Vec<u32>,
}

impl RawState {
    /// DESTROY_QP: the QP's flows go with it.
    pub(super) fn forget_qp(&mut self, qpn: u32) {
        self.flows.retain(|f| f.qpn != qpn);
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
            if f.qpn != from && !targets.contains(&f.qpn) && matches(&f.m, frame) {
                targets.push(f.qpn);
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
