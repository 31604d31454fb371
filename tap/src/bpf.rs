//! Loading bpf/roce_tap.bpf.c, setting its filters, attaching it with tcx and reading its ring
//! buffer and counters. The structs here mirror the C ones byte for byte.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::tc::{NlOptions, SchedClassifier, TcAttachOptions, TcAttachType};
use aya::programs::{LinkOrder, ProgramError};
use aya::{Ebpf, EbpfLoader};
use thiserror::Error;

/// Largest frame prefix a record carries (MAX_SNAPLEN in the C program).
pub const MAX_SNAPLEN: u32 = 9216;

#[repr(C, align(8))]
struct Aligned<B: ?Sized>(B);

// object's ELF parser wants the bytes 8-aligned.
static OBJECT: &Aligned<[u8]> =
    &Aligned(*include_bytes!(concat!(env!("OUT_DIR"), "/roce_tap.bpf.o")));

const F_QPN: u32 = 1 << 0;
const F_OPCODE: u32 = 1 << 1;
const F_IP: u32 = 1 << 2;
const F_AETH: u32 = 1 << 3;
const F_HEADERS: u32 = 1 << 4;
const F_ENABLED: u32 = 1 << 31;

/// The kernel-side filters (`struct tap_config`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelConfig {
    flags: u32,
    qpn: u32,
    snaplen: u32,
    wake_bytes: u32,
    ip: [u8; 16],
    opcodes: [u8; 32],
    aeth_kinds: u8,
    pad: [u8; 7],
}

// SAFETY: repr(C), only integers and byte arrays, no padding (4 * 4 + 16 + 32 + 8 bytes).
unsafe impl aya::Pod for KernelConfig {}

/// What the in-kernel filters let through. `None` = no filter on that field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// BTH destination QPN (or, for UD, the DETH source QPN).
    pub qpn: Option<u32>,
    /// Bitmap over the 8-bit BTH opcode.
    pub opcodes: Option<[u8; 32]>,
    /// Source or destination address (IPv4 as IPv4-mapped IPv6).
    pub ip: Option<[u8; 16]>,
    /// Only frames with an AETH whose syndrome kind (its top three bits: 0 ACK, 1 RNR NAK,
    /// 3 NAK) has its bit set here.
    pub aeth_kinds: Option<u8>,
}

/// How much of each frame the kernel copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Snap {
    /// At most this many bytes from the Ethernet header.
    Bytes(u32),
    /// Up to the end of the transport headers (BTH and extension headers) the kernel found.
    Headers,
}

impl KernelConfig {
    /// `wake_bytes`: a CPU wakes the reader once it has put this much into the ring buffer
    /// since its last wakeup (the reader polls every [`POLL_INTERVAL`] anyway).
    pub fn new(filter: &Filter, snap: Snap, wake_bytes: u32) -> Self {
        let mut c = KernelConfig {
            flags: F_ENABLED,
            snaplen: MAX_SNAPLEN,
            wake_bytes,
            ..Default::default()
        };
        match snap {
            Snap::Bytes(n) => c.snaplen = n.clamp(1, MAX_SNAPLEN),
            Snap::Headers => c.flags |= F_HEADERS,
        }
        if let Some(q) = filter.qpn {
            c.flags |= F_QPN;
            c.qpn = q;
        }
        if let Some(o) = filter.opcodes {
            c.flags |= F_OPCODE;
            c.opcodes = o;
        }
        if let Some(ip) = filter.ip {
            c.flags |= F_IP;
            c.ip = ip;
        }
        if let Some(k) = filter.aeth_kinds {
            c.flags |= F_AETH;
            c.aeth_kinds = k;
        }
        c
    }
}

/// How often the reader looks at the ring buffer when the program did not wake it.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// Default ring buffer size (bytes).
pub const DEFAULT_RING_BYTES: u32 = 4 << 20;

/// Size of `struct tap_record`, which precedes the frame bytes in every ring buffer record.
pub const RECORD_HEADER: usize = 160;
/// Where `struct roce_hdrs` starts in it.
const ROCE_HDRS: usize = 32;

/// Which way a frame went through the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// One ring buffer record, parsed.
#[derive(Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// CLOCK_MONOTONIC nanoseconds.
    pub ts_ns: u64,
    pub ifindex: u32,
    pub orig_len: u32,
    pub direction: Direction,
    /// A VLAN tag kept out of the frame bytes by VLAN offload: (TPID, TCI).
    pub vlan: Option<(u16, u16)>,
    /// The transport headers as the kernel program parsed them.
    pub roce: RoceHeaders,
    pub data: &'a [u8],
}

/// Which extension headers follow the BTH (`RoceHeaders::present`), in wire order.
pub mod ext {
    pub const RDETH: u16 = 1 << 0;
    pub const DETH: u16 = 1 << 1;
    pub const FETH: u16 = 1 << 2;
    pub const RETH: u16 = 1 << 3;
    pub const ATOMIC_ETH: u16 = 1 << 4;
    pub const AETH: u16 = 1 << 5;
    pub const ATOMIC_ACK_ETH: u16 = 1 << 6;
    pub const IMM_DT: u16 = 1 << 7;
    pub const IETH: u16 = 1 << 8;
    /// The frame ends inside a header its opcode implies; the fields after it are zero.
    pub const TRUNCATED: u16 = 1 << 15;
}

/// The BTH and extension headers of one frame, parsed by the kernel program (`struct
/// roce_hdrs`); fields of absent headers are zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoceHeaders {
    /// IP source and destination, IPv6 or IPv4-mapped.
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub opcode: u8,
    /// BTH byte 1: SE, M, PadCnt, TVer.
    pub se_m_pad_tver: u8,
    pub pkey: u16,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
    /// `ext::*` bits.
    pub present: u16,
    /// Bytes from the start of the frame to the payload.
    pub hdr_len: u16,
    /// RDETH end-to-end context.
    pub ee_ctx: u32,
    pub qkey: u32,
    pub src_qp: u32,
    pub feth: u32,
    /// RETH or AtomicETH.
    pub va: u64,
    /// RETH or AtomicETH.
    pub rkey: u32,
    pub dma_len: u32,
    pub swap_add: u64,
    pub compare: u64,
    /// AETH: syndrome << 24 | MSN.
    pub aeth: u32,
    /// AtomicAckETH original remote data.
    pub orig: u64,
    pub imm: u32,
    pub ieth_rkey: u32,
}

impl RoceHeaders {
    /// From the bytes of `struct roce_hdrs` (128, native byte order).
    fn from_c(h: &[u8]) -> Self {
        let u64_at = |o: usize| u64::from_ne_bytes(h[o..o + 8].try_into().unwrap());
        let u32_at = |o: usize| u32::from_ne_bytes(h[o..o + 4].try_into().unwrap());
        let u16_at = |o: usize| u16::from_ne_bytes(h[o..o + 2].try_into().unwrap());
        RoceHeaders {
            va: u64_at(0),
            swap_add: u64_at(8),
            compare: u64_at(16),
            orig: u64_at(24),
            rkey: u32_at(32),
            dma_len: u32_at(36),
            src: h[40..56].try_into().unwrap(),
            dst: h[56..72].try_into().unwrap(),
            dest_qp: u32_at(72),
            psn: u32_at(76),
            aeth: u32_at(80),
            qkey: u32_at(84),
            src_qp: u32_at(88),
            imm: u32_at(92),
            ieth_rkey: u32_at(96),
            feth: u32_at(100),
            ee_ctx: u32_at(104),
            pkey: u16_at(108),
            present: u16_at(110),
            hdr_len: u16_at(112),
            opcode: h[114],
            se_m_pad_tver: h[115],
            ack_req: h[116] != 0,
        }
    }

    pub fn has(&self, x: u16) -> bool {
        self.present & x != 0
    }

    /// The AETH syndrome, when there is an AETH.
    pub fn syndrome(&self) -> Option<u8> {
        self.has(ext::AETH).then_some((self.aeth >> 24) as u8)
    }
}

impl<'a> Record<'a> {
    /// Parses a record as the C program writes it; `None` for a malformed one.
    pub fn parse(b: &'a [u8]) -> Option<Self> {
        let h = b.get(..RECORD_HEADER)?;
        let u32_at = |o: usize| u32::from_ne_bytes(h[o..o + 4].try_into().unwrap());
        let cap_len = u32_at(16) as usize;
        Some(Record {
            ts_ns: u64::from_ne_bytes(h[..8].try_into().unwrap()),
            ifindex: u32_at(8),
            orig_len: u32_at(12),
            direction: if h[20] == 0 {
                Direction::Ingress
            } else {
                Direction::Egress
            },
            vlan: (h[21] != 0).then(|| {
                (
                    u16::from_be_bytes([h[24], h[25]]),
                    u16::from_ne_bytes([h[22], h[23]]),
                )
            }),
            roce: RoceHeaders::from_c(&h[ROCE_HDRS..RECORD_HEADER]),
            data: b.get(RECORD_HEADER..RECORD_HEADER + cap_len)?,
        })
    }
}

/// The tap's in-kernel counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// RoCEv2 frames that passed the filters.
    pub matched: u64,
    /// Of those, lost because the ring buffer was full.
    pub ring_full: u64,
    /// RoCEv2 frames the filters left out.
    pub filtered: u64,
    /// Of the matched: an AETH with a NAK syndrome.
    pub naks: u64,
    /// Of the matched: an AETH with an RNR NAK syndrome.
    pub rnr_naks: u64,
    /// Of the matched: CNPs.
    pub cnps: u64,
    /// Of the matched: the frame ends inside a header its opcode implies.
    pub truncated: u64,
}

#[derive(Debug, Error)]
pub enum BpfError {
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("the eBPF object has no {0}")]
    Missing(&'static str),
    #[error("map {0}: {1}")]
    Map(&'static str, aya::maps::MapError),
    #[error("loading program {0} into the kernel: {1}{2}")]
    Program(&'static str, ProgramError, String),
    #[error("attaching ({3}) to {1} of {0}: {2}")]
    Attach(String, &'static str, Box<ProgramError>, &'static str),
    #[error("adding the clsact qdisc to {0}: {1}")]
    Clsact(String, Box<aya::programs::tc::TcError>),
}

/// How the programs are attached: tcx links (Linux 6.6 and later: ordered, owned by the
/// process), or the older tc clsact attachment through netlink (a direct-action filter on the
/// interface's clsact qdisc, added when it has none), which every kernel since 4.5 has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    Tcx,
    Netlink,
}

impl Attach {
    /// tcx where the running kernel has it (6.6 and later), else netlink.
    pub fn for_this_kernel() -> Attach {
        if kernel_at_least(6, 6) {
            Attach::Tcx
        } else {
            Attach::Netlink
        }
    }

    /// The hook's name in messages and capture files.
    pub fn hook(self) -> &'static str {
        match self {
            Attach::Tcx => "tcx",
            Attach::Netlink => "tc",
        }
    }
}

/// Whether the running kernel's release (uname) is at least `major.minor`.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    release_at_least(&kernel_release(), major, minor)
}

fn kernel_release() -> String {
    // SAFETY: uname fills the zeroed struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::uname(&mut u) } != 0 {
        return String::new();
    }
    // SAFETY: release is a NUL-terminated string within the struct.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

/// `6.12.0-1-amd64` ≥ 6.6: the leading numbers of a release string.
fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// The loaded programs, attached until dropped (dropping closes the tcx links).
pub struct Tap {
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
}

impl Tap {
    /// Loads the object, writes the filters, and attaches both programs with tcx to every
    /// interface in `ifaces` — last in the tcx chain, so programs already there run first.
    /// `ring_bytes`: size of the ring buffer (a power of two, at least a page).
    pub fn attach(
        ifaces: &[String],
        cfg: &KernelConfig,
        ring_bytes: u32,
        how: Attach,
    ) -> Result<Self, BpfError> {
        let mut ebpf = EbpfLoader::new()
            .map_max_entries("events", ring_bytes)
            .load(&OBJECT.0)?;
        {
            let map = ebpf
                .map_mut("config")
                .ok_or(BpfError::Missing("map config"))?;
            let mut arr: Array<_, KernelConfig> =
                Array::try_from(map).map_err(|e| BpfError::Map("config", e))?;
            arr.set(0, cfg, 0).map_err(|e| BpfError::Map("config", e))?;
        }
        let ring = ebpf
            .take_map("events")
            .ok_or(BpfError::Missing("map events"))?;
        let ring = RingBuf::try_from(ring).map_err(|e| BpfError::Map("events", e))?;
        for (name, at) in [
            ("tap_ingress", TcAttachType::Ingress),
            ("tap_egress", TcAttachType::Egress),
        ] {
            let prog: &mut SchedClassifier = ebpf
                .program_mut(name)
                .ok_or(BpfError::Missing("program"))?
                .try_into()
                .map_err(|e| BpfError::Program(name, e, String::new()))?;
            prog.load().map_err(|e| {
                let log = match &e {
                    ProgramError::LoadError { verifier_log, .. } => {
                        format!("\nverifier log:\n{verifier_log}")
                    }
                    _ => String::new(),
                };
                BpfError::Program(name, e, log)
            })?;
            for iface in ifaces {
                let dir = if at == TcAttachType::Ingress {
                    "ingress"
                } else {
                    "egress"
                };
                let opts = match how {
                    Attach::Tcx => TcAttachOptions::TcxOrder(LinkOrder::last()),
                    Attach::Netlink => {
                        if at == TcAttachType::Ingress {
                            add_clsact(iface)?;
                        }
                        TcAttachOptions::Netlink(NlOptions::default())
                    }
                };
                prog.attach_with_options(iface, at, opts)
                    .map_err(|e| BpfError::Attach(iface.clone(), dir, Box::new(e), how.hook()))?;
            }
        }
        Ok(Tap { ebpf, ring })
    }

    /// The ring buffer's fd, readable when records are waiting.
    pub fn ring_fd(&self) -> RawFd {
        self.ring.as_fd().as_raw_fd()
    }

    /// Hands every waiting record to `f`; returns how many there were.
    pub fn drain(&mut self, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            f(&item);
            n += 1;
        }
        n
    }

    /// The in-kernel counters, summed over CPUs.
    pub fn stats(&self) -> Result<KernelStats, BpfError> {
        let map = self
            .ebpf
            .map("stats")
            .ok_or(BpfError::Missing("map stats"))?;
        let arr: PerCpuArray<_, u64> =
            PerCpuArray::try_from(map).map_err(|e| BpfError::Map("stats", e))?;
        let sum = |i: u32| -> Result<u64, BpfError> {
            Ok(arr
                .get(&i, 0)
                .map_err(|e| BpfError::Map("stats", e))?
                .iter()
                .sum())
        };
        Ok(KernelStats {
            matched: sum(0)?,
            ring_full: sum(1)?,
            filtered: sum(2)?,
            naks: sum(3)?,
            rnr_naks: sum(4)?,
            cnps: sum(5)?,
            truncated: sum(6)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_c() {
        assert_eq!(std::mem::size_of::<KernelConfig>(), 72);
        let c = KernelConfig::new(
            &Filter {
                qpn: Some(0x11),
                ..Default::default()
            },
            Snap::Bytes(0),
            4096,
        );
        assert_eq!(c.flags, F_ENABLED | F_QPN);
        assert_eq!(c.snaplen, 1);
        assert_eq!(
            KernelConfig::new(&Filter::default(), Snap::Bytes(u32::MAX), 0).snaplen,
            MAX_SNAPLEN
        );
        let c = KernelConfig::new(
            &Filter {
                aeth_kinds: Some(0b1010),
                ..Default::default()
            },
            Snap::Headers,
            0,
        );
        assert_eq!(c.flags, F_ENABLED | F_AETH | F_HEADERS);
        assert_eq!(c.aeth_kinds, 0b1010);
    }

    #[test]
    fn record_parse() {
        let mut b = vec![0u8; RECORD_HEADER + 3];
        b[..8].copy_from_slice(&7u64.to_ne_bytes());
        b[8..12].copy_from_slice(&3u32.to_ne_bytes());
        b[12..16].copy_from_slice(&100u32.to_ne_bytes());
        b[16..20].copy_from_slice(&3u32.to_ne_bytes());
        b[20] = 1;
        // struct roce_hdrs: an ACK (0x11) to QP 0x12, PSN 5, AETH NAK (0x60) MSN 9.
        let h = &mut b[ROCE_HDRS..];
        h[72..76].copy_from_slice(&0x12u32.to_ne_bytes());
        h[76..80].copy_from_slice(&5u32.to_ne_bytes());
        h[80..84].copy_from_slice(&0x6000_0009u32.to_ne_bytes());
        h[110..112].copy_from_slice(&ext::AETH.to_ne_bytes());
        h[112..114].copy_from_slice(&58u16.to_ne_bytes());
        h[114] = 0x11;
        b[RECORD_HEADER..].copy_from_slice(&[1, 2, 3]);
        let r = Record::parse(&b).unwrap();
        assert_eq!((r.ts_ns, r.ifindex, r.orig_len), (7, 3, 100));
        assert_eq!(
            (r.roce.opcode, r.roce.dest_qp, r.roce.psn, r.roce.hdr_len),
            (0x11, 0x12, 5, 58)
        );
        assert_eq!(r.roce.syndrome(), Some(0x60));
        assert!(!r.roce.has(ext::RETH));
        assert_eq!(r.direction, Direction::Egress);
        assert_eq!(r.vlan, None);
        assert_eq!(r.data, &[1, 2, 3]);
        b[16..20].copy_from_slice(&4u32.to_ne_bytes());
        assert!(Record::parse(&b).is_none());
        b[16..20].copy_from_slice(&3u32.to_ne_bytes());
        b[21] = 1;
        b[22..24].copy_from_slice(&77u16.to_ne_bytes());
        b[24..26].copy_from_slice(&[0x81, 0x00]);
        assert_eq!(Record::parse(&b).unwrap().vlan, Some((0x8100, 77)));
    }
}

/// The clsact qdisc on `iface`, unless it has one (tc's own `tc qdisc add dev X clsact`): the
/// netlink attachment's filters hang from it. It stays when the tap ends (as after tc).
fn add_clsact(iface: &str) -> Result<(), BpfError> {
    match aya::programs::tc::qdisc_add_clsact(iface) {
        Ok(()) => Ok(()),
        Err(aya::programs::tc::TcError::NetlinkError(e))
            if e.raw_os_error() == Some(libc::EEXIST) =>
        {
            Ok(())
        }
        Err(e) => Err(BpfError::Clsact(iface.to_string(), Box::new(e))),
    }
}

#[cfg(test)]
mod attach_tests {
    use super::*;

    #[test]
    fn kernel_releases_compare() {
        assert!(release_at_least("6.12.117+deb13-amd64", 6, 6));
        assert!(release_at_least("6.6.0", 6, 6));
        assert!(release_at_least("7.3.4+deb13-amd64", 6, 6));
        assert!(!release_at_least("6.1.0-28-amd64", 6, 6));
        assert!(!release_at_least("5.15.0", 6, 6));
        assert!(!release_at_least("", 6, 6));
    }
}
