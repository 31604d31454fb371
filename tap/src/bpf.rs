//! Loading bpf/roce_tap.bpf.c, setting its filters, attaching it with tcx and reading its ring
//! buffer and counters. The structs here mirror the C ones byte for byte.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use aya::programs::tc::{SchedClassifier, TcAttachOptions, TcAttachType};
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
}

// SAFETY: repr(C), only integers and byte arrays, no padding (4 * 4 + 16 + 32 bytes).
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
}

impl KernelConfig {
    /// `wake_bytes`: the reader is woken once this much waits in the ring buffer (it polls
    /// every [`POLL_INTERVAL`] anyway).
    pub fn new(filter: &Filter, snaplen: u32, wake_bytes: u32) -> Self {
        let mut c = KernelConfig {
            flags: F_ENABLED,
            snaplen: snaplen.clamp(1, MAX_SNAPLEN),
            wake_bytes,
            ..Default::default()
        };
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
        c
    }
}

/// How often the reader looks at the ring buffer when the program did not wake it.
pub const POLL_INTERVAL: std::time::Duration = std::time::Duration::from_millis(20);

/// Default ring buffer size (bytes).
pub const DEFAULT_RING_BYTES: u32 = 4 << 20;

/// Size of `struct tap_record`, which precedes the frame bytes in every ring buffer record.
pub const RECORD_HEADER: usize = 32;

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
    pub data: &'a [u8],
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
    #[error("attaching to tcx {1} of {0}: {2}")]
    Attach(String, &'static str, ProgramError),
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
                prog.attach_with_options(iface, at, TcAttachOptions::TcxOrder(LinkOrder::last()))
                    .map_err(|e| BpfError::Attach(iface.clone(), dir, e))?;
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
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_layout_matches_c() {
        assert_eq!(std::mem::size_of::<KernelConfig>(), 64);
        let c = KernelConfig::new(
            &Filter {
                qpn: Some(0x11),
                ..Default::default()
            },
            0,
            4096,
        );
        assert_eq!(c.flags, F_ENABLED | F_QPN);
        assert_eq!(c.snaplen, 1);
        assert_eq!(
            KernelConfig::new(&Filter::default(), u32::MAX, 0).snaplen,
            MAX_SNAPLEN
        );
    }

    #[test]
    fn record_parse() {
        let mut b = vec![0u8; RECORD_HEADER + 3];
        b[..8].copy_from_slice(&7u64.to_ne_bytes());
        b[8..12].copy_from_slice(&3u32.to_ne_bytes());
        b[12..16].copy_from_slice(&100u32.to_ne_bytes());
        b[16..20].copy_from_slice(&3u32.to_ne_bytes());
        b[20] = 1;
        b[RECORD_HEADER..].copy_from_slice(&[1, 2, 3]);
        let r = Record::parse(&b).unwrap();
        assert_eq!((r.ts_ns, r.ifindex, r.orig_len), (7, 3, 100));
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
