//! The `raw` transport: RoCEv2 frames on a host interface through an AF_PACKET socket.
//!
//! The daemon owns the whole frame: it writes the Ethernet, IP and UDP headers in front of each
//! RoCE packet the engine built (source MAC: the port MAC; destination MAC: the address
//! vector's `dmac`, as the guest driver resolved it), fills the ICRC over exactly those headers
//! (IPv4 ID 0 with DF, as the `udp` transport's kernel socket sends; UDP checksum 0 as rxe
//! does) and sends them in batches (`sendmmsg` with `PACKET_QDISC_BYPASS`).
//!
//! Reception goes through a TPACKET_V3 ring mapped into the daemon: the kernel fills blocks
//! of frames and hands a block over when it is full or when its retire timer
//! ([`BLOCK_TIMEOUT_MS`]) fires; the worker walks the frames of every block handed over in
//! batches and gives each block back once it has walked it. A classic BPF filter in the kernel
//! keeps only UDP to port 4791 of our addresses (unfragmented). Every frame is checked again
//! here — Ethernet type and destination, IP version, header length, checksum and total
//! length, UDP length and port, a non-zero UDP checksum (unless the ring says the kernel
//! verified it, or left it partial for an offload that never ran: a sender in this host on a
//! veth or netkit pair), destination address, and the full ICRC (the IPv4 ID is in the
//! frame: no solving) — and each reason for a drop is counted ([`TransportStats`]). Nothing in
//! a frame is trusted: offsets the ring's headers give are checked against the block before a
//! byte is read.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use rxe_core::device::{RecvMeta, Transmit};
use rxe_core::Gid;

use crate::sys::{ifreq, setsockopt};
use crate::transport::egress::EgressPolicy;
pub(crate) use crate::transport::filter::{attach_filter, filter_program, net_filter_program};
pub use crate::transport::filter::{FilterKind, MAX_ADDRS_PER_FAMILY};
use crate::transport::filter::{
    ETH_LEN, ETH_P_ALL, ETH_P_ARP, ETH_P_IP, ETH_P_IPV6, ICMPV6, ROCE_PORT,
};
pub(crate) use crate::transport::neighbour::sum16;
pub use crate::transport::neighbour::{arp_reply, multicast_mac, nd_reply, Local};
use crate::transport::neighbour::{be16, solicited_node_mac};
use crate::transport::sink::PacketSink;
use crate::transport::stats::TransportStats;

/// Packets sent with one `sendmmsg`.
pub const TX_BATCH: usize = 32;
/// Frames handed to the caller per [`RawTransport::recv_batch`].
pub const RX_BATCH: usize = 32;
/// Headers in front of a RoCE packet at most: Ethernet, IPv6, UDP.
const HDR_ROOM: usize = ETH_LEN + 40 + 8;
/// Room per transmitted frame: the headers, a 4096-byte path MTU and every RoCE header.
const TX_SLOT: usize = HDR_ROOM + 4096 + 256;
/// Bytes per ring block (a multiple of the page size; holds the largest frame many times).
const BLOCK_SIZE: usize = 1 << 18;
/// Blocks in the receive ring (4 MiB).
const BLOCK_NR: usize = 16;
/// Nominal frame size the kernel wants for a V3 ring (frames are packed, not slotted).
const FRAME_SIZE: usize = 2048;
/// TPACKET_V2 ring: slots of this size (a 9000-byte frame and its header fit)…
const V2_FRAME: usize = 16384;
/// …in kernel blocks of this size…
const V2_BLOCK: usize = 1 << 16;
/// …this many slots (4 MiB).
const V2_FRAMES: usize = 256;
/// A block the kernel has put frames in is handed over at the latest this long after it was
/// opened (the latency floor of a lone packet).
pub const BLOCK_TIMEOUT_MS: u32 = 1;

// linux/if_packet.h
const PACKET_ADD_MEMBERSHIP: i32 = 1;
const PACKET_MR_MULTICAST: u16 = 0;

// linux/if_packet.h
const PACKET_RX_RING: i32 = 5;
const PACKET_STATISTICS: i32 = 6;
const PACKET_VERSION: i32 = 10;
const PACKET_QDISC_BYPASS: i32 = 20;
const PACKET_IGNORE_OUTGOING: i32 = 23;
const TPACKET_V2: i32 = 1;
const TPACKET_V3: i32 = 2;
const TP_STATUS_KERNEL: u32 = 0;
const TP_STATUS_USER: u32 = 1;
const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// The frame's checksum is partial: its sender is local and the kernel left it to an offload
/// that never ran (a veth or netkit peer's socket).
const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
/// The kernel (or the NIC) verified the frame's checksum.
const TP_STATUS_CSUM_VALID: u32 = 1 << 7;
const PACKET_OUTGOING: u8 = 4;

/// Why the raw transport could not be set up.
#[derive(Debug)]
pub enum RawError {
    NoSuchInterface(String),
    InterfaceDown(String),
    /// The interface is not Ethernet (no 6-byte hardware address).
    NotEthernet(String),
    MtuTooLarge {
        iface: String,
        want: u32,
        has: u32,
    },
    /// `socket(AF_PACKET)` was refused: the process lacks CAP_NET_RAW.
    NoCapNetRaw(String),
    Io(&'static str, String, io::Error),
}

impl fmt::Display for RawError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawError::NoSuchInterface(i) => write!(f, "--iface {i}: no such interface"),
            RawError::InterfaceDown(i) => {
                write!(f, "--iface {i}: the interface is down (ip link set {i} up)")
            }
            RawError::NotEthernet(i) => write!(f, "--iface {i}: not an Ethernet interface"),
            RawError::MtuTooLarge { iface, want, has } => write!(
                f,
                "--mtu {want} is larger than the MTU of {iface} ({has}): frames would not fit"
            ),
            RawError::NoCapNetRaw(i) => write!(
                f,
                "--iface {i}: opening a packet socket needs CAP_NET_RAW, which this process \
                 does not have (run as root or grant it: setcap cap_net_raw+ep on the binary)"
            ),
            RawError::Io(what, i, e) => write!(f, "--iface {i}: {what}: {e}"),
        }
    }
}

impl std::error::Error for RawError {}

/// The guest's virtio-net socket on the same interface ([`crate::net::net_port`]), as the
/// raw transport sees it when their filters split the frames ([`RawTransport::set_addrs`]).
pub trait Companion: Send + Sync {
    /// Learns the guest's addresses (its GID table); returns those RoCE is taken for.
    fn set_guest_addrs(&self, gids: &[IpAddr]) -> Vec<IpAddr>;
    /// Lets RoCEv2 to `addrs` go to the raw transport (its filter replaced in one step).
    fn set_roce_addrs(&self, addrs: &[IpAddr]) -> io::Result<()>;
}

/// What the raw transport needs to know of its interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfaceInfo {
    pub index: i32,
    pub mac: [u8; 6],
    pub mtu: u32,
    pub up: bool,
}

/// Looks `name` up: index, MAC, MTU, whether it is up. Needs no privileges.
pub fn iface_info(name: &str) -> Result<IfaceInfo, RawError> {
    let none = || RawError::NoSuchInterface(name.to_string());
    let cname = CString::new(name).map_err(|_| none())?;
    // SAFETY: `cname` is a valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(none());
    }
    let io = |what, e| RawError::Io(what, name.to_string(), e);
    // SAFETY: plain syscall; the result is checked and owned below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(io("socket for ioctl", io::Error::last_os_error()));
    }
    // SAFETY: `s` was just created and is owned by nobody else.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    let call = |req: libc::c_ulong, r: &mut libc::ifreq| -> io::Result<()> {
        // SAFETY: `r` is a live ifreq naming the interface; the kernel writes its union.
        if unsafe { libc::ioctl(s.as_raw_fd(), req as _, r as *mut libc::ifreq) } < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    let mut r = ifreq(name).ok_or_else(none)?;
    call(libc::SIOCGIFFLAGS, &mut r).map_err(|e| io("SIOCGIFFLAGS", e))?;
    // SAFETY: SIOCGIFFLAGS filled the flags member of the union.
    let flags = unsafe { r.ifr_ifru.ifru_flags } as i32;
    let mut r = ifreq(name).ok_or_else(none)?;
    call(libc::SIOCGIFMTU, &mut r).map_err(|e| io("SIOCGIFMTU", e))?;
    // SAFETY: SIOCGIFMTU filled the mtu member.
    let mtu = unsafe { r.ifr_ifru.ifru_mtu } as u32;
    let mut r = ifreq(name).ok_or_else(none)?;
    call(libc::SIOCGIFHWADDR, &mut r).map_err(|e| io("SIOCGIFHWADDR", e))?;
    // SAFETY: SIOCGIFHWADDR filled the hwaddr member (a sockaddr).
    let hw = unsafe { r.ifr_ifru.ifru_hwaddr };
    if hw.sa_family != libc::ARPHRD_ETHER {
        return Err(RawError::NotEthernet(name.to_string()));
    }
    let mut mac = [0u8; 6];
    for (d, s) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(IfaceInfo {
        index: index as i32,
        mac,
        mtu,
        up: flags & libc::IFF_UP != 0,
    })
}

/// Binds the packet socket `fd` to every protocol of the interface `index`.
pub(crate) fn bind_all(fd: RawFd, index: i32) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ETH_P_ALL.to_be();
    sll.sll_ifindex = index;
    // SAFETY: `sll` is a valid sockaddr_ll of the size passed.
    let r = unsafe {
        libc::bind(
            fd,
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Why a received frame was dropped; each has its counter in [`TransportStats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxDrop {
    /// Shorter than its headers, or a RoCE packet shorter than a BTH and an ICRC
    /// (`rx_short`).
    Short,
    /// Neither IPv4 nor IPv6, or VLAN-tagged (`rx_bad_ethertype`).
    EtherType,
    /// Not version 4 with a 20-byte header or version 6 without extension headers; a
    /// fragment; not UDP; a total length the frame does not hold (`rx_bad_ip`).
    Ip,
    /// Wrong IPv4 header checksum (`rx_ip_checksum_bad`).
    IpChecksum,
    /// UDP length not the IP payload's, destination port not 4791, or a wrong non-zero UDP
    /// checksum (`rx_bad_udp`).
    Udp,
    /// Destination MAC or IP address not ours (`rx_not_ours`).
    NotOurs,
    /// The ICRC does not match (`rx_icrc_bad`).
    Icrc,
}

/// Whether a non-zero UDP checksum is right (zero: not computed, as rxe sends).
fn udp_checksum_ok(src: IpAddr, dst: IpAddr, udp: &[u8]) -> bool {
    if be16(udp, 6) == 0 {
        return true;
    }
    let mut acc = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => sum16(sum16(0, &s.octets()), &d.octets()),
        (IpAddr::V6(s), IpAddr::V6(d)) => sum16(sum16(0, &s.octets()), &d.octets()),
        _ => return false,
    };
    acc = sum16(acc + 17 + udp.len() as u32, udp);
    acc == 0xffff
}

/// A checked frame: where its RoCE packet (BTH … ICRC) lies in it, and its addressing.
#[derive(Clone, Copy, Debug)]
pub struct RxFrame {
    pub meta: RecvMeta,
    pub roce: (usize, usize),
}

/// Whether [`check_frame_with`] verifies a non-zero UDP checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpChecksum {
    Check,
    /// The ring says the checksum is partial (a local sender's offload) or already verified.
    Skip,
}

/// Checks one received Ethernet frame completely (see the module documentation). Never
/// panics: every index is checked against the frame first.
pub fn check_frame(local: &Local, f: &[u8]) -> Result<RxFrame, RxDrop> {
    check_frame_with(local, f, UdpChecksum::Check)
}

/// [`check_frame`], with the UDP checksum checked or not as the ring's status says.
pub fn check_frame_with(local: &Local, f: &[u8], csum: UdpChecksum) -> Result<RxFrame, RxDrop> {
    if f.len() < ETH_LEN {
        return Err(RxDrop::Short);
    }
    let dmac: [u8; 6] = f[..6].try_into().expect("6 bytes");
    let unicast = local.macs.contains(&dmac);
    if !(unicast || local.multicast && dmac[0] & 1 == 1) {
        return Err(RxDrop::NotOurs);
    }
    let ip = &f[ETH_LEN..];
    let (src, dst, ihl, total, tc, hop, flow) = match be16(f, 12) {
        ETH_P_IP => {
            if ip.len() < 20 {
                return Err(RxDrop::Short);
            }
            // Version 4, no options (RoCEv2 uses none and the ICRC covers exactly 20 bytes).
            if ip[0] != 0x45 {
                return Err(RxDrop::Ip);
            }
            let total = be16(ip, 2) as usize;
            if total < 20 + 8 || total > ip.len() || be16(ip, 6) & 0x3fff != 0 || ip[9] != 17 {
                return Err(RxDrop::Ip);
            }
            if sum16(0, &ip[..20]) != 0xffff {
                return Err(RxDrop::IpChecksum);
            }
            let s: [u8; 4] = ip[12..16].try_into().expect("4 bytes");
            let d: [u8; 4] = ip[16..20].try_into().expect("4 bytes");
            (IpAddr::from(s), IpAddr::from(d), 20, total, ip[1], ip[8], 0)
        }
        ETH_P_IPV6 => {
            if ip.len() < 40 {
                return Err(RxDrop::Short);
            }
            let total = 40 + be16(ip, 4) as usize;
            if ip[0] >> 4 != 6 || ip[6] != 17 || total < 40 + 8 || total > ip.len() {
                return Err(RxDrop::Ip);
            }
            let s: [u8; 16] = ip[8..24].try_into().expect("16 bytes");
            let d: [u8; 16] = ip[24..40].try_into().expect("16 bytes");
            let tc = (ip[0] << 4) | (ip[1] >> 4);
            let flow = u32::from_be_bytes([0, ip[1] & 0x0f, ip[2], ip[3]]);
            (IpAddr::from(s), IpAddr::from(d), 40, total, tc, ip[7], flow)
        }
        _ => return Err(RxDrop::EtherType),
    };
    let ours = if dst.is_multicast() {
        local.multicast && dmac == multicast_mac(dst)
    } else {
        unicast && local.addrs.contains(&dst)
    };
    if !ours {
        return Err(RxDrop::NotOurs);
    }
    // Bytes past the IP total length are Ethernet padding.
    let l3 = &ip[..total];
    let udp = &l3[ihl..];
    if be16(udp, 4) as usize != udp.len() || be16(udp, 2) != ROCE_PORT {
        return Err(RxDrop::Udp);
    }
    if csum == UdpChecksum::Check && !udp_checksum_ok(src, dst, udp) {
        return Err(RxDrop::Udp);
    }
    let roce = &udp[8..];
    if roce.len() < 12 + 4 {
        return Err(RxDrop::Short);
    }
    if rxe_core::icrc::verify(&l3[..ihl + 8], roce).is_err() {
        return Err(RxDrop::Icrc);
    }
    let at = ETH_LEN + ihl + 8;
    Ok(RxFrame {
        meta: RecvMeta {
            src: Gid::from_ip(src),
            dst: Gid::from_ip(dst),
            sport: be16(udp, 0),
            traffic_class: tc,
            hop_limit: hop,
            flow_label: flow,
        },
        roce: (at, at + roce.len()),
    })
}

/// Counts a drop.
fn count(st: &mut TransportStats, d: RxDrop) {
    match d {
        RxDrop::Short => st.rx_short += 1,
        RxDrop::EtherType => st.rx_bad_ethertype += 1,
        RxDrop::Ip => st.rx_bad_ip += 1,
        RxDrop::IpChecksum => st.rx_ip_checksum_bad += 1,
        RxDrop::Udp => st.rx_bad_udp += 1,
        RxDrop::NotOurs => st.rx_not_ours += 1,
        RxDrop::Icrc => st.rx_icrc_bad += 1,
    }
}

/// One frame of a ring block, as its `tpacket3_hdr` describes it, checked against the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockFrame {
    /// Offset of the frame's first byte (the Ethernet header) in the block.
    at: usize,
    /// Bytes of it in the ring.
    snap: usize,
    /// Bytes the frame had on the wire (more than `snap` when it was cut).
    wire: usize,
    /// `tp_status` bits.
    status: u32,
    /// The frame left this host (should not be here with PACKET_IGNORE_OUTGOING).
    outgoing: bool,
}

/// The native-endian u32 at `at + off` of `b`, if all of it is inside.
fn rd32(b: &[u8], at: usize, off: usize) -> Option<u32> {
    let i = at.checked_add(off)?;
    Some(u32::from_ne_bytes(
        b.get(i..i.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn rd16(b: &[u8], at: usize, off: usize) -> Option<u16> {
    let i = at.checked_add(off)?;
    Some(u16::from_ne_bytes(
        b.get(i..i.checked_add(2)?)?.try_into().ok()?,
    ))
}

/// Size of `tpacket3_hdr`, aligned (TPACKET_ALIGN): where the `sockaddr_ll` follows.
const TP3_HDR: usize = 48;

/// Reads the frame header at `at` of `block`; `None` if any part of it or of the frame it
/// describes lies outside the block. Returns the frame and the offset of the next one.
fn block_frame(block: &[u8], at: usize) -> Option<(BlockFrame, u32)> {
    let next = rd32(block, at, 0)?;
    let snap = rd32(block, at, 12)? as usize;
    let wire = rd32(block, at, 16)? as usize;
    let status = rd32(block, at, 20)?;
    let mac = rd16(block, at, 24)? as usize;
    // sockaddr_ll: family, protocol, ifindex, hatype, then pkttype.
    let pkttype = *block.get(at.checked_add(TP3_HDR + 10)?)?;
    let start = at.checked_add(mac)?;
    let end = start.checked_add(snap)?;
    if mac < TP3_HDR || end > block.len() {
        return None;
    }
    Some((
        BlockFrame {
            at: start,
            snap,
            wire,
            status,
            outgoing: pkttype == PACKET_OUTGOING,
        },
        next,
    ))
}

/// Size of `tpacket2_hdr`, aligned: where the `sockaddr_ll` follows.
const TP2_HDR: usize = 32;

/// Reads the frame of a TPACKET_V2 slot; `None` if its header points outside the slot.
fn slot_frame_v2(slot: &[u8]) -> Option<BlockFrame> {
    let status = rd32(slot, 0, 0)?;
    let wire = rd32(slot, 0, 4)? as usize;
    let snap = rd32(slot, 0, 8)? as usize;
    let mac = rd16(slot, 0, 12)? as usize;
    let pkttype = *slot.get(TP2_HDR + 10)?;
    let end = mac.checked_add(snap)?;
    if mac < TP2_HDR || end > slot.len() {
        return None;
    }
    Some(BlockFrame {
        at: mac,
        snap,
        wire,
        status,
        outgoing: pkttype == PACKET_OUTGOING,
    })
}

/// A block's header: (number of frames, offset of the first).
fn block_header(block: &[u8]) -> Option<(u32, usize)> {
    Some((rd32(block, 0, 12)?, rd32(block, 0, 16)? as usize))
}

/// The receive ring shared with the kernel: TPACKET_V3, `BLOCK_NR` blocks of `BLOCK_SIZE`
/// bytes holding many frames each, or TPACKET_V2, `V2_FRAMES` slots of one frame each (a
/// "unit" below is a block or a slot). A unit belongs to us from the moment its status has
/// TP_STATUS_USER until we store TP_STATUS_KERNEL into it; only then do we read it.
struct Ring {
    base: *mut u8,
    kind: RingKind,
    /// Bytes per unit, units, and where a unit's status word is.
    unit: usize,
    nr: usize,
    status_at: usize,
    /// The block to walk next (or being walked).
    cur: usize,
    /// Walking `cur`: (offset of the next frame, frames left).
    walk: Option<(usize, u32)>,
    /// Blocks walked to the end whose frames the last batch may still refer to: handed back
    /// at the next batch.
    done: Vec<usize>,
}

// SAFETY: the mapping is owned by the ring (unmapped on drop) and only used through `&mut`.
unsafe impl Send for Ring {}

const TP_STATUS_LOSING: u32 = 1 << 2;

impl Ring {
    /// Sets the TPACKET version `kind` on the packet socket `raw` (of interface `name`), has
    /// the kernel allocate its receive ring, and maps it.
    fn map(raw: RawFd, kind: RingKind, name: &str) -> Result<Ring, RawError> {
        let version = match kind {
            RingKind::V3 => TPACKET_V3,
            RingKind::V2 => TPACKET_V2,
        };
        setsockopt(raw, libc::SOL_PACKET, PACKET_VERSION, &version)
            .map_err(|e| RawError::Io("PACKET_VERSION", name.to_string(), e))?;
        let ring_err = |e| RawError::Io("PACKET_RX_RING", name.to_string(), e);
        let (unit, nr, status_at) = match kind {
            RingKind::V3 => {
                // struct tpacket_req3.
                let req: [u32; 7] = [
                    BLOCK_SIZE as u32,
                    BLOCK_NR as u32,
                    FRAME_SIZE as u32,
                    (BLOCK_SIZE * BLOCK_NR / FRAME_SIZE) as u32,
                    BLOCK_TIMEOUT_MS,
                    0,
                    0,
                ];
                setsockopt(raw, libc::SOL_PACKET, PACKET_RX_RING, &req).map_err(ring_err)?;
                (BLOCK_SIZE, BLOCK_NR, 8)
            }
            RingKind::V2 => {
                // struct tpacket_req.
                let req: [u32; 4] = [
                    V2_BLOCK as u32,
                    (V2_FRAME * V2_FRAMES / V2_BLOCK) as u32,
                    V2_FRAME as u32,
                    V2_FRAMES as u32,
                ];
                setsockopt(raw, libc::SOL_PACKET, PACKET_RX_RING, &req).map_err(ring_err)?;
                (V2_FRAME, V2_FRAMES, 0)
            }
        };
        // SAFETY: mapping the ring the kernel just allocated for this socket, of its size.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                unit * nr,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                raw,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            return Err(RawError::Io(
                "mmap of the receive ring",
                name.to_string(),
                e,
            ));
        }
        Ok(Ring {
            base: base.cast(),
            kind,
            unit,
            nr,
            status_at,
            cur: 0,
            walk: None,
            done: Vec::with_capacity(RX_BATCH + BLOCK_NR),
        })
    }

    fn status(&self, b: usize) -> &AtomicU32 {
        // SAFETY: unit `b` < nr lies in the mapping; it starts page-aligned (V3) or at a
        // multiple of 16 KiB (V2), so the status word (offset 8 or 0) is aligned; the kernel
        // updates it atomically.
        unsafe {
            &*self
                .base
                .add(b * self.unit + self.status_at)
                .cast::<AtomicU32>()
        }
    }

    /// Block `b`, which must be ours (TP_STATUS_USER seen with Acquire and not yet handed
    /// back): the kernel does not write it meanwhile.
    fn block(&self, b: usize) -> &[u8] {
        // SAFETY: the block lies in the mapping, and while it is ours nothing else writes it.
        unsafe { std::slice::from_raw_parts(self.base.add(b * self.unit), self.unit) }
    }

    /// Hands back the blocks the previous batch finished.
    fn release_done(&mut self) {
        for i in 0..self.done.len() {
            let b = self.done[i];
            self.status(b).store(TP_STATUS_KERNEL, Ordering::Release);
        }
        self.done.clear();
    }
}

/// Has the interface `index` take the solicited-node groups of the IPv6 addresses among
/// `addrs`, where neighbour solicitations for them come (a NIC filters other multicast out).
fn join_solicited_node_groups(raw: RawFd, index: i32, addrs: &[IpAddr]) -> io::Result<()> {
    for a in addrs {
        if let IpAddr::V6(v6) = a {
            // SAFETY: packet_mreq is plain data; all-zero is a valid value.
            let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
            mr.mr_ifindex = index;
            mr.mr_type = PACKET_MR_MULTICAST;
            mr.mr_alen = 6;
            mr.mr_address[..6].copy_from_slice(&solicited_node_mac(v6));
            setsockopt(raw, libc::SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr)?;
        }
    }
    Ok(())
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of this size we made; nothing refers to it any more.
        unsafe { libc::munmap(self.base.cast(), self.unit * self.nr) };
    }
}

/// How the raw transport is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawConfig {
    pub iface: String,
    /// The addresses the device sources from and answers to (its GIDs).
    pub addrs: Vec<IpAddr>,
    /// Port MAC: frames go out from it, and frames to it (or the interface MAC) are ours.
    /// `None`: the interface's MAC.
    pub mac: Option<[u8; 6]>,
    /// The netdev MTU the port is modelled on: must fit the interface's.
    pub mtu: u32,
    /// The receive ring's kind.
    pub ring: RingKind,
    /// Answer ARP and neighbour solicitations for `addrs` with `mac`. Off when a guest's
    /// virtio-net shares the interface ([`crate::net::vhu_net`]): the guest's stack answers.
    pub answer_neighbours: bool,
}

/// How received frames reach the daemon.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RingKind {
    /// TPACKET_V3: blocks of many frames, handed over full or after [`BLOCK_TIMEOUT_MS`]; the
    /// fewest wake-ups under load, but a lone packet waits for its block's timeout.
    #[default]
    V3,
    /// TPACKET_V2: one slot per frame, each handed over (and the worker woken) at once.
    V2,
}

/// The raw transport (see the module documentation).
pub struct RawTransport {
    fd: OwnedFd,
    iface: String,
    info: IfaceInfo,
    /// Source MAC of every frame.
    mac: [u8; 6],
    local: Local,
    egress: EgressPolicy,
    pub stats: TransportStats,
    ring: Ring,
    /// The last batch: (block, frame offset in it, length, its `tp_status`).
    batch: Vec<(usize, usize, usize, u32)>,
    tx_buf: Vec<u8>,
    /// Frames waiting for `sendmmsg`: (start in the slot, length, IPv4, destination MAC).
    tx_pending: Vec<(usize, usize, bool, [u8; 6])>,
    tx_blocked: bool,
    answer_neighbours: bool,
    /// The guest's virtio-net socket on the same interface ([`crate::net::net_port`]): its filter
    /// stays the complement of ours, and our addresses follow the guest's GID table.
    companion: Option<Arc<dyn Companion>>,
}

impl RawTransport {
    /// Opens the packet socket on `cfg.iface`: checks the interface (exists, up, Ethernet,
    /// MTU), then needs CAP_NET_RAW.
    pub fn open(cfg: &RawConfig) -> Result<Self, RawError> {
        let name = cfg.iface.as_str();
        let info = iface_info(name)?;
        if !info.up {
            return Err(RawError::InterfaceDown(name.to_string()));
        }
        if cfg.mtu > info.mtu {
            return Err(RawError::MtuTooLarge {
                iface: name.to_string(),
                want: cfg.mtu,
                has: info.mtu,
            });
        }
        // Protocol 0: nothing is queued before the filter and the ring are in place and the
        // socket is bound.
        // SAFETY: plain syscall; the result is checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::EACCES) => RawError::NoCapNetRaw(name.to_string()),
                _ => RawError::Io("socket(AF_PACKET)", name.to_string(), e),
            });
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        let kind = if cfg.answer_neighbours {
            FilterKind::RoceAndNeighbours
        } else {
            FilterKind::Roce
        };
        let mut prog = filter_program(&cfg.addrs, kind).ok_or_else(|| {
            RawError::Io(
                "building the packet filter",
                name.to_string(),
                io::Error::other("too many addresses"),
            )
        })?;
        attach_filter(raw, &mut prog)
            .map_err(|e| RawError::Io("SO_ATTACH_FILTER", name.to_string(), e))?;
        let ring = Ring::map(raw, cfg.ring, name)?;
        setsockopt(raw, libc::SOL_PACKET, PACKET_QDISC_BYPASS, &1i32)
            .map_err(|e| RawError::Io("PACKET_QDISC_BYPASS", name.to_string(), e))?;
        // Our own frames (and those of other sockets) leaving the interface are not input;
        // older kernels lack the option and the ring walk skips them instead.
        let _ = setsockopt(raw, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, &1i32);
        if cfg.answer_neighbours {
            join_solicited_node_groups(raw, info.index, &cfg.addrs).map_err(|e| {
                RawError::Io("joining the solicited-node group", name.to_string(), e)
            })?;
        }
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, &(4i32 << 20));
        bind_all(raw, info.index).map_err(|e| RawError::Io("bind", name.to_string(), e))?;
        let mac = cfg.mac.unwrap_or(info.mac);
        let mut macs = vec![mac];
        if info.mac != mac {
            macs.push(info.mac);
        }
        Ok(RawTransport {
            fd,
            iface: name.to_string(),
            info,
            mac,
            local: Local {
                macs,
                addrs: cfg.addrs.clone(),
                multicast: !cfg.answer_neighbours,
            },
            egress: EgressPolicy::default(),
            stats: TransportStats::default(),
            ring,
            batch: Vec::with_capacity(RX_BATCH),
            tx_buf: vec![0; TX_BATCH * TX_SLOT],
            tx_pending: Vec::with_capacity(TX_BATCH),
            tx_blocked: false,
            answer_neighbours: cfg.answer_neighbours,
            companion: None,
        })
    }

    /// Shares the interface with the guest's virtio-net socket `port`: from now on the
    /// addresses are the guest's ([`Self::set_addrs`]), and what is not RoCE for them is the
    /// port's.
    pub fn set_companion(&mut self, port: Arc<dyn Companion>) {
        self.companion = Some(port);
    }

    /// Whether the addresses follow the guest's GID table (a virtio-net shares the
    /// interface).
    pub fn follows_gids(&self) -> bool {
        self.companion.is_some()
    }

    /// Makes `addrs` the addresses RoCE is taken for (at most [`MAX_ADDRS_PER_FAMILY`] of
    /// each family), in the kernel filters of both sockets. A frame for an address being
    /// added or removed goes to one socket or the other at every moment, never to both: an
    /// address is taken by our filter before the virtio-net's lets it go, and the reverse
    /// when it is removed.
    pub fn set_addrs(&mut self, addrs: &[IpAddr]) -> io::Result<()> {
        // Beside a virtio-net the GIDs are the guest's addresses (its NIC may send from
        // them), and RoCE is taken for those `--net-addr` allows.
        let allowed;
        let addrs = match &self.companion {
            Some(p) => {
                allowed = p.set_guest_addrs(addrs);
                allowed.as_slice()
            }
            None => addrs,
        };
        if addrs == self.local.addrs.as_slice() {
            return Ok(());
        }
        let too_many = [true, false]
            .iter()
            .any(|&v4| addrs.iter().filter(|a| a.is_ipv4() == v4).count() > MAX_ADDRS_PER_FAMILY);
        if too_many {
            return Err(io::Error::other(format!(
                "more than {MAX_ADDRS_PER_FAMILY} addresses of one family"
            )));
        }
        let kind = if self.answer_neighbours {
            FilterKind::RoceAndNeighbours
        } else {
            FilterKind::Roce
        };
        let mut ours = filter_program(addrs, kind).ok_or_else(|| io::Error::other("filter"))?;
        let growing = self.local.addrs.iter().all(|a| addrs.contains(a));
        if growing {
            attach_filter(self.fd(), &mut ours)?;
        }
        if let Some(p) = &self.companion {
            p.set_roce_addrs(addrs)?;
        }
        if !growing {
            attach_filter(self.fd(), &mut ours)?;
        }
        self.local.addrs = addrs.to_vec();
        Ok(())
    }

    /// Where packets may go ([`EgressPolicy`]).
    pub fn set_egress(&mut self, p: EgressPolicy) {
        self.egress = p;
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn iface(&self) -> &str {
        &self.iface
    }

    pub fn info(&self) -> IfaceInfo {
        self.info
    }

    /// Source MAC of the frames sent.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The GIDs of our addresses.
    pub fn gids(&self) -> Vec<Gid> {
        self.local.addrs.iter().map(|a| Gid::from_ip(*a)).collect()
    }

    /// Frames the kernel could not put in the ring (it was full) since the last call.
    fn ring_losses(&mut self) {
        // struct tpacket_stats_v3: packets, drops, freeze_q_cnt (reset by reading).
        let mut s = [0u32; 3];
        let mut len = std::mem::size_of_val(&s) as libc::socklen_t;
        // SAFETY: `s` is a live buffer of `len` bytes the kernel writes.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_STATISTICS,
                s.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if r == 0 {
            self.stats.rx_ring_lost += s[1] as u64;
        }
    }

    /// Collects up to [`RX_BATCH`] frames from the blocks the kernel handed over, handing
    /// back the blocks the previous batch finished; returns how many (0: none waiting). Read
    /// them with [`Self::packet`].
    pub fn recv_batch(&mut self) -> usize {
        self.ring.release_done();
        self.batch.clear();
        if self.ring.kind == RingKind::V2 {
            return self.recv_batch_v2();
        }
        let mut steps = 0;
        while self.batch.len() < RX_BATCH && steps < RX_BATCH + BLOCK_NR {
            steps += 1;
            let b = self.ring.cur;
            let (off, left) = match self.ring.walk {
                Some(w) => w,
                None => {
                    let st = self.ring.status(b).load(Ordering::Acquire);
                    if st & TP_STATUS_USER == 0 {
                        break;
                    }
                    if st & TP_STATUS_LOSING != 0 {
                        self.ring_losses();
                    }
                    match block_header(self.ring.block(b)) {
                        Some((n, first)) => (first, n),
                        None => (0, 0),
                    }
                }
            };
            if left == 0 {
                self.finish_block();
                continue;
            }
            let Some((f, next)) = block_frame(self.ring.block(b), off) else {
                // A header that points outside the block: give the rest of it up.
                self.stats.rx_short += left as u64;
                self.finish_block();
                continue;
            };
            let left = left - 1;
            self.ring.walk = Some((off.saturating_add(next as usize), left));
            if left > 0 && next == 0 {
                self.stats.rx_short += left as u64;
                self.finish_block();
            } else if left == 0 {
                self.finish_block();
            }
            self.take(b, f);
        }
        self.batch.len()
    }

    /// Counts a frame of unit `b` and puts it in the batch unless it is to be dropped.
    fn take(&mut self, b: usize, f: BlockFrame) {
        if f.outgoing {
            return;
        }
        self.stats.rx_packets += 1;
        self.stats.rx_bytes += f.wire as u64;
        if f.snap < f.wire {
            self.stats.rx_truncated += 1;
            return;
        }
        if f.status & TP_STATUS_VLAN_VALID != 0 {
            // The kernel took an 802.1Q tag off: not our (untagged) segment.
            self.stats.rx_bad_ethertype += 1;
            return;
        }
        let frame = &self.ring.block(b)[f.at..f.at + f.snap];
        if !self.answer_neighbours {
            // (The filter passes RoCE only.)
        } else if frame.len() >= ETH_LEN && be16(frame, 12) == ETH_P_ARP {
            match arp_reply(&self.local, self.mac, frame) {
                Some(r) => self.send_answer(&r, ETH_P_ARP),
                None => self.stats.rx_arp_ignored += 1,
            }
            return;
        } else if frame.len() > ETH_LEN + 6
            && be16(frame, 12) == ETH_P_IPV6
            && frame[ETH_LEN + 6] == ICMPV6
        {
            match nd_reply(&self.local, self.mac, frame) {
                Some(r) => self.send_answer(&r, ETH_P_IPV6),
                None => self.stats.rx_arp_ignored += 1,
            }
            return;
        }
        self.batch.push((b, f.at, f.snap, f.status));
    }

    /// [`Self::recv_batch`] on a TPACKET_V2 ring: one frame per slot.
    fn recv_batch_v2(&mut self) -> usize {
        for _ in 0..RX_BATCH {
            let s = self.ring.cur;
            let st = self.ring.status(s).load(Ordering::Acquire);
            if st & TP_STATUS_USER == 0 {
                break;
            }
            if st & TP_STATUS_LOSING != 0 {
                self.ring_losses();
            }
            let f = slot_frame_v2(self.ring.block(s));
            self.finish_block();
            match f {
                Some(f) => self.take(s, f),
                None => self.stats.rx_short += 1,
            }
        }
        self.batch.len()
    }

    /// The current block is walked: it goes back to the kernel with the next batch.
    fn finish_block(&mut self) {
        self.ring.done.push(self.ring.cur);
        self.ring.cur = (self.ring.cur + 1) % self.ring.nr;
        self.ring.walk = None;
    }

    /// Receives and drops at most `max` frames (no guest memory to take them); returns how
    /// many.
    pub fn drop_unattached(&mut self, max: usize) -> usize {
        let mut total = 0;
        while total < max {
            let n = self.recv_batch();
            self.stats.rx_unattached += n as u64;
            total += n;
            if n < RX_BATCH {
                break;
            }
        }
        total
    }

    /// Frame `i` of the last [`Self::recv_batch`], checked; `None` if it was dropped
    /// (counted).
    pub fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])> {
        let &(b, at, len, status) = self.batch.get(i)?;
        let frame = &self.ring.block(b)[at..at + len];
        // A frame a local socket sent with checksum offload (a veth or netkit peer in this
        // host) carries a partial UDP checksum the kernel has not finished: not checkable.
        let csum = if status & (TP_STATUS_CSUMNOTREADY | TP_STATUS_CSUM_VALID) != 0 {
            UdpChecksum::Skip
        } else {
            UdpChecksum::Check
        };
        match check_frame_with(&self.local, frame, csum) {
            Ok(f) => {
                self.stats.rx_icrc_ok += 1;
                Some((f.meta, &frame[f.roce.0..f.roce.1]))
            }
            Err(d) => {
                count(&mut self.stats, d);
                None
            }
        }
    }

    /// The raw transport does not give up on errors (a ring has none to report).
    pub fn rx_failing(&self) -> bool {
        false
    }

    /// Builds the headers in front of the packet in slot `i` and fills the ICRC; returns
    /// (frame start in the slot, frame length, IPv4).
    fn prepare(&mut self, t: &Transmit, i: usize) -> Option<(usize, usize, bool)> {
        let (src, dst) = (t.src.to_ip(), t.dst.to_ip());
        if src.is_ipv4() != dst.is_ipv4() {
            self.stats.tx_wrong_family += 1;
            return None;
        }
        if !self.local.addrs.contains(&src) {
            self.stats.tx_bad_source += 1;
            return None;
        }
        if !self.egress.allows(dst) {
            self.stats.tx_denied += 1;
            return None;
        }
        // A unicast destination gets a unicast MAC; a group its group's MAC (the guest's
        // neighbour entry cannot make a unicast packet a broadcast).
        let dmac_ok = if dst.is_multicast() {
            t.dmac == multicast_mac(dst)
        } else {
            t.dmac != [0; 6] && t.dmac[0] & 1 == 0
        };
        if !dmac_ok {
            self.stats.tx_no_dmac += 1;
            return None;
        }
        let mut m =
            rxe_core::wire::frame::FrameMeta::new(src, dst, t.sport).with_eth(self.mac, t.dmac);
        m.traffic_class = t.traffic_class;
        // A hop limit of 0 would be dropped by the first router: rxe's default instead.
        m.hop_limit = if t.hop_limit == 0 { 64 } else { t.hop_limit };
        m.flow_label = t.flow_label;
        let h = m.header_len().ok()?;
        let len = t.len.min(TX_SLOT - HDR_ROOM);
        let start = HDR_ROOM - h;
        let slot = &mut self.tx_buf[i * TX_SLOT + start..(i + 1) * TX_SLOT];
        match rxe_core::wire::frame::encap(slot, &m, len) {
            Ok(n) => Some((start, n, src.is_ipv4())),
            Err(_) => {
                self.stats.tx_dropped += 1;
                None
            }
        }
    }

    /// Sends the queued frames with as few `sendmmsg` calls as the kernel allows.
    /// Sends an ARP reply or a neighbour advertisement at once (one frame, not batched: it
    /// answers a peer that waits to send to us). An answer the device refuses is lost; the
    /// peer asks again.
    fn send_answer(&mut self, frame: &[u8], ethertype: u16) {
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut s: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        s.sll_family = libc::AF_PACKET as u16;
        s.sll_protocol = ethertype.to_be();
        s.sll_ifindex = self.info.index;
        s.sll_halen = 6;
        s.sll_addr[..6].copy_from_slice(&frame[..6]);
        // SAFETY: `frame` and `s` are alive for the call; the kernel reads `frame.len()` bytes
        // and a sockaddr_ll of the size given.
        let r = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
                (&s as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if r == frame.len() as isize {
            if ethertype == ETH_P_ARP {
                self.stats.arp_replies += 1;
            } else {
                self.stats.nd_adverts += 1;
            }
        } else {
            self.stats.tx_dropped += 1;
        }
    }

    fn send_pending(&mut self) {
        let n = self.tx_pending.len();
        if n == 0 {
            self.tx_blocked = false;
            return;
        }
        let mut names: [libc::sockaddr_ll; TX_BATCH] =
            // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
            unsafe { std::mem::zeroed() };
        let mut iov: [libc::iovec; TX_BATCH] =
            // SAFETY: iovec is a pointer and a length; all-zero is a valid (empty) value.
            unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; TX_BATCH] =
            // SAFETY: mmsghdr is plain data and pointers; all-zero is a valid (empty) value.
            unsafe { std::mem::zeroed() };
        for (i, &(start, len, v4, dmac)) in self.tx_pending.iter().enumerate() {
            let s = &mut names[i];
            s.sll_family = libc::AF_PACKET as u16;
            s.sll_protocol = if v4 { ETH_P_IP } else { ETH_P_IPV6 }.to_be();
            s.sll_ifindex = self.info.index;
            s.sll_halen = 6;
            s.sll_addr[..6].copy_from_slice(&dmac);
            iov[i].iov_base = self.tx_buf[i * TX_SLOT + start..].as_mut_ptr().cast();
            iov[i].iov_len = len;
            msgs[i].msg_hdr.msg_name = (s as *mut libc::sockaddr_ll).cast();
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        let mut done = 0usize;
        let mut tries = 0;
        while done < n && tries < 4 * TX_BATCH {
            tries += 1;
            // SAFETY: `msgs[done..n]` are initialised headers whose name, iovec and data
            // pointers point into `names`, `iov` and `self.tx_buf`, all alive and unmoved for
            // the duration of the call.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    msgs[done..].as_mut_ptr(),
                    (n - done) as libc::c_uint,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                for &(_, len, _, _) in &self.tx_pending[done..done + r as usize] {
                    self.stats.tx_packets += 1;
                    self.stats.tx_bytes += len as u64;
                }
                done += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            if r < 0 && e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            if r < 0 && e.kind() == io::ErrorKind::WouldBlock {
                self.stats.tx_blocked += 1;
                self.tx_blocked = true;
                self.keep_unsent(done);
                return;
            }
            // The device refused this frame (queue full with the qdisc bypassed, link down,
            // too large): it is lost and the engine's retransmission covers it.
            self.stats.tx_dropped += 1;
            if e.raw_os_error() != Some(libc::ENOBUFS) {
                super::log_send_error("raw transport", &self.iface, None, &e);
            }
            done += 1;
        }
        self.stats.tx_dropped += (n - done) as u64;
        self.tx_pending.clear();
        self.tx_blocked = false;
    }

    /// Moves the frames from `done` on to the front of the batch.
    fn keep_unsent(&mut self, done: usize) {
        for i in done..self.tx_pending.len() {
            let (start, len, _, _) = self.tx_pending[i];
            let from = i * TX_SLOT + start;
            self.tx_buf
                .copy_within(from..from + len, (i - done) * TX_SLOT + start);
        }
        self.tx_pending.drain(..done);
    }
}

impl PacketSink for RawTransport {
    fn next_buf(&mut self) -> &mut [u8] {
        let i = self.tx_pending.len();
        &mut self.tx_buf[i * TX_SLOT + HDR_ROOM..(i + 1) * TX_SLOT]
    }

    fn push(&mut self, t: &Transmit) {
        let i = self.tx_pending.len();
        if let Some((start, len, v4)) = self.prepare(t, i) {
            self.tx_pending.push((start, len, v4, t.dmac));
            if self.tx_pending.len() == TX_BATCH {
                self.send_pending();
            }
        }
    }

    fn flush(&mut self) {
        self.send_pending();
    }

    fn blocked(&self) -> bool {
        self.tx_blocked
    }
}

#[cfg(test)]
mod tests;
