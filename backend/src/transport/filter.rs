//! The classic BPF filters of the packet sockets on an interface: the raw transport's
//! ([`filter_program`]: RoCEv2 to our addresses, with ARP and neighbour solicitations for them
//! when it answers them itself) and the guest's virtio-net's ([`net_filter_program`]: exactly
//! what the raw transport's drops, for the guest's MAC), assembled from symbolic jumps
//! ([`assemble`]). Also the Ethernet, IP and neighbour-discovery constants the filters and the
//! frame checks share.

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;

use crate::sys::setsockopt;

pub(super) const ETH_LEN: usize = 14;
pub(super) const ETH_P_ALL: u16 = 0x0003;
pub(super) const ETH_P_IP: u16 = 0x0800;
pub(super) const ETH_P_IPV6: u16 = 0x86dd;
pub(super) const ETH_P_ARP: u16 = 0x0806;
/// An ARP packet for IPv4 over Ethernet.
pub(super) const ARP_LEN: usize = 28;
/// A neighbour advertisement: IPv6 header, ICMPv6 NA with the target link-layer address.
pub(super) const NA_LEN: usize = 40 + 24 + 8;
pub(super) const ICMPV6: u8 = 58;
pub(super) const ND_SOLICIT: u8 = 135;
pub(super) const ND_ADVERT: u8 = 136;
/// The UDP port of RoCEv2.
pub(super) const ROCE_PORT: u16 = 4791;
/// Bytes of a frame the kernel copies into the ring at most (the filter's return value).
pub(super) const SNAP_LEN: u32 = 65535;

/// One classic BPF instruction with symbolic jump targets, resolved by [`assemble`].
#[derive(Clone, Copy)]
enum Op {
    /// A statement (load, return, …).
    S(u16, u32),
    /// A conditional jump: taken to `.1`, not taken to `.2`.
    J(u16, u32, Target, Target),
    At(Label),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    Next,
    /// Over this many instructions.
    Skip(usize),
    To(Label),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Label {
    Arp,
    Nd,
    V4,
    V6,
    V4Port,
    Accept,
    Drop,
    /// The virtio-net's destination check passed ([`net_filter_program`]).
    Mine,
    /// Dropped whatever the kind of filter.
    Refuse,
}

const BPF_LD_H_ABS: u16 = 0x28;
const BPF_LD_B_ABS: u16 = 0x30;
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_LDX_MSH: u16 = 0xb1;
const BPF_LD_H_IND: u16 = 0x48;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JSET_K: u16 = 0x45;
const BPF_RET_K: u16 = 0x06;
const BPF_ALU_AND_K: u16 = 0x54;

/// Resolves the labels of `ops` into relative jumps (each within 255 instructions).
fn assemble(ops: &[Op]) -> Option<Vec<libc::sock_filter>> {
    let mut at = Vec::new();
    let mut n = 0usize;
    for op in ops {
        match op {
            Op::At(l) => at.push((*l, n)),
            _ => n += 1,
        }
    }
    let pos = |l: Label| at.iter().find(|(x, _)| *x == l).map(|&(_, p)| p);
    let mut out = Vec::with_capacity(n);
    for op in ops {
        match *op {
            Op::At(_) => {}
            Op::S(code, k) => out.push(libc::sock_filter {
                code,
                jt: 0,
                jf: 0,
                k,
            }),
            Op::J(code, k, t, f) => {
                let here = out.len();
                let rel = |t: Target| -> Option<u8> {
                    match t {
                        Target::Next => Some(0),
                        Target::Skip(n) => u8::try_from(n).ok(),
                        Target::To(l) => u8::try_from(pos(l)?.checked_sub(here + 1)?).ok(),
                    }
                };
                out.push(libc::sock_filter {
                    code,
                    jt: rel(t)?,
                    jf: rel(f)?,
                    k,
                });
            }
        }
    }
    Some(out)
}

/// Most addresses of one family a filter holds (its jumps stay within 255 instructions).
pub const MAX_ADDRS_PER_FAMILY: usize = 8;

/// Which frames a packet filter keeps (see [`filter_program`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilterKind {
    /// RoCEv2 to our addresses, ARP for our IPv4 ones and neighbour solicitations for our
    /// IPv6 ones: the raw transport that answers for its addresses itself.
    RoceAndNeighbours,
    /// RoCEv2 to our addresses or to a multicast group: the raw transport beside a guest's
    /// virtio-net, where the guest's own stack answers ARP and ND and joins the groups.
    Roce,
    /// Everything [`FilterKind::Roce`] does not keep: what the guest's virtio-net receives.
    NotRoce,
}

/// The kernel-side filter. RoCEv2 is untagged IPv4 (unfragmented) or IPv6 UDP to port 4791
/// of one of `addrs`; with [`FilterKind::RoceAndNeighbours`] also ARP for one of the IPv4
/// ones and neighbour solicitations for one of the IPv6 ones; [`FilterKind::NotRoce`] keeps
/// exactly what [`FilterKind::Roce`] drops.
pub(crate) fn filter_program(addrs: &[IpAddr], kind: FilterKind) -> Option<Vec<libc::sock_filter>> {
    assemble(&filter_ops(addrs, kind))
}

/// The guest's virtio-net filter: [`FilterKind::NotRoce`] for `addrs`, and with `mac` only
/// frames to that MAC or to a group (multicast, broadcast).
pub(crate) fn net_filter_program(
    addrs: &[IpAddr],
    mac: Option<[u8; 6]>,
) -> Option<Vec<libc::sock_filter>> {
    use Label::*;
    use Op::*;
    use Target::*;
    let mut p = Vec::new();
    if let Some(m) = mac {
        p.extend([
            S(BPF_LD_B_ABS, 0),
            J(BPF_JSET_K, 1, To(Mine), Next),
            S(BPF_LD_W_ABS, 2),
            J(
                BPF_JEQ_K,
                u32::from_be_bytes([m[2], m[3], m[4], m[5]]),
                Next,
                To(Refuse),
            ),
            S(BPF_LD_H_ABS, 0),
            J(
                BPF_JEQ_K,
                u16::from_be_bytes([m[0], m[1]]) as u32,
                To(Mine),
                Next,
            ),
            At(Refuse),
            S(BPF_RET_K, 0),
            At(Mine),
        ]);
    }
    p.extend(filter_ops(addrs, FilterKind::NotRoce));
    assemble(&p)
}

fn filter_ops(addrs: &[IpAddr], kind: FilterKind) -> Vec<Op> {
    use Label::*;
    use Op::*;
    use Target::*;
    let neighbours = kind == FilterKind::RoceAndNeighbours;
    // Beside a virtio-net, RoCE to any multicast group is the engine's too (it delivers to the
    // QPs attached to the group; the guest's stack joins the groups on the wire).
    let multicast = !neighbours;
    // What a frame that is ours (RoCE for our addresses) and one that is not return.
    let (yes, no) = match kind {
        FilterKind::NotRoce => (0, SNAP_LEN),
        _ => (SNAP_LEN, 0),
    };
    let mut p = vec![
        S(BPF_LD_H_ABS, 12),
        J(BPF_JEQ_K, ETH_P_IP as u32, To(V4), Next),
        J(
            BPF_JEQ_K,
            ETH_P_ARP as u32,
            if neighbours { To(Arp) } else { To(Drop) },
            Next,
        ),
        J(BPF_JEQ_K, ETH_P_IPV6 as u32, To(V6), To(Drop)),
    ];
    if neighbours {
        // ARP whose target protocol address is one of ours (answered, see `arp_reply`)
        p.extend([At(Arp), S(BPF_LD_W_ABS, (ETH_LEN + 24) as u32)]);
        for a in addrs {
            if let IpAddr::V4(v4) = a {
                p.push(J(BPF_JEQ_K, u32::from(*v4), To(Accept), Next));
            }
        }
        p.push(S(BPF_RET_K, no));
    }
    p.extend([
        At(V4),
        S(BPF_LD_B_ABS, 23),
        J(BPF_JEQ_K, 17, Next, To(Drop)),
        S(BPF_LD_H_ABS, 20),
        // More fragments or a fragment offset: not for us (a RoCE packet has DF).
        J(BPF_JSET_K, 0x3fff, To(Drop), Next),
        S(BPF_LD_W_ABS, 30),
    ]);
    for a in addrs {
        if let IpAddr::V4(v4) = a {
            p.push(J(BPF_JEQ_K, u32::from(*v4), To(V4Port), Next));
        }
    }
    if multicast {
        // 224.0.0.0/4
        p.extend([
            S(BPF_ALU_AND_K, 0xf000_0000),
            J(BPF_JEQ_K, 0xe000_0000, To(V4Port), Next),
        ]);
    }
    p.extend([
        S(BPF_RET_K, no),
        At(V4Port),
        S(BPF_LDX_MSH, ETH_LEN as u32),
        S(BPF_LD_H_IND, ETH_LEN as u32 + 2),
        J(BPF_JEQ_K, ROCE_PORT as u32, To(Accept), To(Drop)),
        At(V6),
        S(BPF_LD_B_ABS, ETH_LEN as u32 + 6),
        J(
            BPF_JEQ_K,
            ICMPV6 as u32,
            if neighbours { To(Nd) } else { To(Drop) },
            Next,
        ),
        J(BPF_JEQ_K, 17, Next, To(Drop)),
        S(BPF_LD_H_ABS, ETH_LEN as u32 + 40 + 2),
        J(BPF_JEQ_K, ROCE_PORT as u32, Next, To(Drop)),
    ]);
    for a in addrs {
        if let IpAddr::V6(v6) = a {
            let o = v6.octets();
            for w in 0..4 {
                let word = u32::from_be_bytes(o[4 * w..4 * w + 4].try_into().expect("4"));
                p.push(S(BPF_LD_W_ABS, (ETH_LEN + 24 + 4 * w) as u32));
                // A mismatch goes on with the next address: past the rest of this one's.
                let t = if w == 3 { To(Accept) } else { Next };
                p.push(J(BPF_JEQ_K, word, t, Skip((3 - w) * 2)));
            }
        }
    }
    if multicast {
        // ff00::/8
        p.extend([
            S(BPF_LD_B_ABS, (ETH_LEN + 24) as u32),
            J(BPF_JEQ_K, 0xff, To(Accept), Next),
        ]);
    }
    p.push(S(BPF_RET_K, no));
    if neighbours {
        // ICMPv6 neighbour solicitation whose target is one of ours (see `nd_reply`)
        p.extend([
            At(Nd),
            S(BPF_LD_B_ABS, (ETH_LEN + 40) as u32),
            J(BPF_JEQ_K, ND_SOLICIT as u32, Next, To(Drop)),
        ]);
        for a in addrs {
            if let IpAddr::V6(v6) = a {
                let o = v6.octets();
                for w in 0..4 {
                    let word = u32::from_be_bytes(o[4 * w..4 * w + 4].try_into().expect("4"));
                    p.push(S(BPF_LD_W_ABS, (ETH_LEN + 40 + 8 + 4 * w) as u32));
                    let t = if w == 3 { To(Accept) } else { Next };
                    p.push(J(BPF_JEQ_K, word, t, Skip((3 - w) * 2)));
                }
            }
        }
    }
    p.extend([At(Drop), S(BPF_RET_K, no), At(Accept), S(BPF_RET_K, yes)]);
    p
}

/// Attaches `prog` to the socket `fd`.
pub(crate) fn attach_filter(fd: RawFd, prog: &mut [libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::other("filter too long"))?,
        filter: prog.as_mut_ptr(),
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
}

/// A classic BPF interpreter for the instructions the filters use (tests).
#[cfg(test)]
pub(super) fn run_bpf(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
    let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
    let ld = |at: usize, n: usize| -> Option<u32> {
        let b = pkt.get(at..at + n)?;
        Some(b.iter().fold(0u32, |v, &c| (v << 8) | c as u32))
    };
    for _ in 0..prog.len() {
        let i = prog[pc];
        pc += 1;
        let k = i.k as usize;
        // A load past the packet ends the program with 0, as in the kernel.
        match i.code {
            BPF_LD_H_ABS => match ld(k, 2) {
                Some(v) => a = v,
                None => return 0,
            },
            BPF_LD_B_ABS => match ld(k, 1) {
                Some(v) => a = v,
                None => return 0,
            },
            BPF_LD_W_ABS => match ld(k, 4) {
                Some(v) => a = v,
                None => return 0,
            },
            BPF_LDX_MSH => match ld(k, 1) {
                Some(v) => x = (v & 0xf) * 4,
                None => return 0,
            },
            BPF_LD_H_IND => match ld(x as usize + k, 2) {
                Some(v) => a = v,
                None => return 0,
            },
            BPF_ALU_AND_K => a &= i.k,
            BPF_RET_K => return i.k,
            BPF_JEQ_K | BPF_JSET_K => {
                let hit = if i.code == BPF_JEQ_K {
                    a == i.k
                } else {
                    a & i.k != 0
                };
                pc += if hit { i.jt } else { i.jf } as usize;
            }
            c => panic!("unexpected opcode {c:#x}"),
        }
        assert!(pc < prog.len(), "ran off the program");
    }
    panic!("no return")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::neighbour::testing::{arp_request, frame, nd_solicit};

    #[test]
    fn the_kernel_filter_keeps_roce_to_our_addresses_only() {
        let addrs: Vec<IpAddr> = vec![
            "10.79.0.2".parse().unwrap(),
            "fd79::2".parse().unwrap(),
            "10.79.0.3".parse().unwrap(),
            "fd79::3".parse().unwrap(),
        ];
        let prog = filter_program(&addrs, FilterKind::RoceAndNeighbours).unwrap();
        for (s, d, want) in [
            ("10.79.0.1", "10.79.0.2", true),
            ("10.79.0.1", "10.79.0.3", true),
            ("10.79.0.1", "10.79.0.4", false),
            ("fd79::1", "fd79::2", true),
            ("fd79::1", "fd79::3", true),
            ("fd79::1", "fd79::4", false),
            ("fd79::1", "fd78::2", false),
        ] {
            let f = frame(s, d, 8);
            assert_eq!(run_bpf(&prog, &f) != 0, want, "{s} -> {d}");
        }
        let mut f = frame("10.79.0.1", "10.79.0.2", 8);
        f[36..38].copy_from_slice(&4792u16.to_be_bytes());
        assert_eq!(run_bpf(&prog, &f), 0, "other port");
        let mut f = frame("10.79.0.1", "10.79.0.2", 8);
        f[20] |= 0x20;
        assert_eq!(run_bpf(&prog, &f), 0, "fragment");
        let mut f = frame("fd79::1", "fd79::2", 8);
        f[20] = 6;
        assert_eq!(run_bpf(&prog, &f), 0, "not UDP");
        assert_eq!(run_bpf(&prog, &[0u8; 10]), 0, "runt");
        // Eight addresses of each family still assemble (jumps within 255).
        let many: Vec<IpAddr> = (0..8)
            .flat_map(|i| {
                [
                    format!("10.79.1.{i}").parse().unwrap(),
                    format!("fd79::1:{i}").parse().unwrap(),
                ]
            })
            .collect();
        assert!(filter_program(&many, FilterKind::RoceAndNeighbours).is_some());
    }

    #[test]
    fn beside_a_virtio_net_the_two_filters_split_every_frame() {
        let addrs: Vec<IpAddr> = vec!["10.79.0.2".parse().unwrap(), "fd79::2".parse().unwrap()];
        let roce = filter_program(&addrs, FilterKind::Roce).unwrap();
        let rest = filter_program(&addrs, FilterKind::NotRoce).unwrap();
        let peer = [0x02, 0x79, 0, 0, 0, 0x0b];
        let mut frames = vec![
            ("roce v4", frame("10.79.0.1", "10.79.0.2", 8), true),
            ("roce v6", frame("fd79::1", "fd79::2", 8), true),
            (
                "udp v4 to another",
                frame("10.79.0.1", "10.79.0.3", 8),
                false,
            ),
            ("udp v6 to another", frame("fd79::1", "fd79::3", 8), false),
            ("arp", arp_request(peer, "10.79.0.1", "10.79.0.2"), false),
            ("nd", nd_solicit(peer, "fd79::1", "fd79::2"), false),
        ];
        let mut port = frame("10.79.0.1", "10.79.0.2", 8);
        port[36..38].copy_from_slice(&4792u16.to_be_bytes());
        frames.push(("udp v4 other port", port, false));
        let mut frag = frame("10.79.0.1", "10.79.0.2", 8);
        frag[20] |= 0x20;
        frames.push(("fragment", frag, false));
        let mut tcp = frame("fd79::1", "fd79::2", 8);
        tcp[20] = 6;
        frames.push(("tcp v6", tcp, false));
        let mut vlan = frame("10.79.0.1", "10.79.0.2", 8);
        vlan[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
        frames.push(("tagged", vlan, false));
        for (what, f, is_roce) in frames {
            assert_eq!(run_bpf(&roce, &f) != 0, is_roce, "{what}: raw transport");
            assert_eq!(run_bpf(&rest, &f) != 0, !is_roce, "{what}: virtio-net");
        }
        // Shorter than an Ethernet header: neither's (the kernel ends a filter that loads
        // past the frame with 0).
        let runt = [0u8; 10];
        assert_eq!((run_bpf(&roce, &runt), run_bpf(&rest, &runt)), (0, 0));
    }

    /// The guest's virtio-net takes frames to its MAC and to groups only (the rest of its
    /// filter unchanged); without a MAC (`--net-any-mac`) every MAC.
    #[test]
    fn the_virtio_nets_filter_keeps_the_guests_mac_and_groups() {
        let addrs: Vec<IpAddr> = vec!["10.79.0.2".parse().unwrap()];
        let guest = [0x52, 0x54, 0, 0x79, 0, 2];
        let mine = net_filter_program(&addrs, Some(guest)).unwrap();
        let any = net_filter_program(&addrs, None).unwrap();
        let to = |mac: [u8; 6], dst: &str| {
            let mut f = frame("10.79.0.1", dst, 8);
            f[..6].copy_from_slice(&mac);
            f
        };
        for (what, mac, dst, want, want_any) in [
            ("the guest's", guest, "10.79.0.3", true, true),
            ("broadcast", [0xff; 6], "10.79.0.3", true, true),
            (
                "multicast",
                [0x01, 0, 0x5e, 0, 0, 1],
                "10.79.0.3",
                true,
                true,
            ),
            (
                "another MAC",
                [0x02, 0xaa, 0, 0, 0, 1],
                "10.79.0.3",
                false,
                true,
            ),
            (
                "the last byte differs",
                [0x52, 0x54, 0, 0x79, 0, 3],
                "10.79.0.3",
                false,
                true,
            ),
            (
                "the first bytes differ",
                [0x50, 0x54, 0, 0x79, 0, 2],
                "10.79.0.3",
                false,
                true,
            ),
            ("RoCE to its GID", guest, "10.79.0.2", false, false),
        ] {
            assert_eq!(run_bpf(&mine, &to(mac, dst)) != 0, want, "{what}");
            assert_eq!(
                run_bpf(&any, &to(mac, dst)) != 0,
                want_any,
                "{what}, any MAC"
            );
        }
    }
}
