//! What user space makes of the headers the kernel program parsed: the per-second summary,
//! the `--decode` lines, the opcode names, and the `--opcode` / `--aeth` classes. No frame
//! bytes are read here, so all of it works at any snap length.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::bpf::{ext, Direction, RoceHeaders};

/// BTH opcode names (IBTA 9.2, Table 38; FLUSH and ATOMIC_WRITE from IBTA 1.5).
pub fn opcode_name(op: u8) -> String {
    let t = match op >> 5 {
        0 => "RC",
        1 => "UC",
        2 => "RD",
        3 => "UD",
        _ if op == 0x81 => return "CNP".into(),
        _ => return format!("OP_{op:#04x}"),
    };
    let n = match op & 0x1f {
        0x00 => "SEND_FIRST",
        0x01 => "SEND_MIDDLE",
        0x02 => "SEND_LAST",
        0x03 => "SEND_LAST_IMM",
        0x04 => "SEND_ONLY",
        0x05 => "SEND_ONLY_IMM",
        0x06 => "WRITE_FIRST",
        0x07 => "WRITE_MIDDLE",
        0x08 => "WRITE_LAST",
        0x09 => "WRITE_LAST_IMM",
        0x0a => "WRITE_ONLY",
        0x0b => "WRITE_ONLY_IMM",
        0x0c => "READ_REQUEST",
        0x0d => "READ_RESPONSE_FIRST",
        0x0e => "READ_RESPONSE_MIDDLE",
        0x0f => "READ_RESPONSE_LAST",
        0x10 => "READ_RESPONSE_ONLY",
        0x11 => "ACK",
        0x12 => "ATOMIC_ACK",
        0x13 => "COMPARE_SWAP",
        0x14 => "FETCH_ADD",
        0x16 => "SEND_LAST_INV",
        0x17 => "SEND_ONLY_INV",
        0x1c => "FLUSH",
        0x1d => "ATOMIC_WRITE",
        _ => return format!("OP_{op:#04x}"),
    };
    format!("{t}_{n}")
}

/// The operation classes `--opcode` knows, as sets of the low five opcode bits
/// (for the RC, UC, RD and UD transports).
const OPERATIONS: &[(&str, &[u8])] = &[
    ("send", &[0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x16, 0x17]),
    ("write", &[0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b]),
    ("read", &[0x0c, 0x0d, 0x0e, 0x0f, 0x10]),
    ("ack", &[0x11]),
    ("atomic", &[0x12, 0x13, 0x14, 0x1d]),
    ("flush", &[0x1c]),
];
const TRANSPORTS: &[&str] = &["rc", "uc", "rd", "ud"];

/// Parses `--opcode`: a comma-separated list of transports (rc, uc, rd, ud), operations (send,
/// write, read, ack, atomic, flush), `cnp`, or opcode numbers (decimal or 0x..); the result
/// is the union, as a bitmap over the 8-bit opcode.
pub fn parse_opcode_classes(s: &str) -> Result<[u8; 32], String> {
    let mut bits = [0u8; 32];
    let mut set = |op: u8| bits[op as usize / 8] |= 1 << (op % 8);
    for word in s.split(',').map(str::trim) {
        let w = word.to_ascii_lowercase();
        if let Some(t) = TRANSPORTS.iter().position(|&t| t == w) {
            for low in 0..32u8 {
                set(((t as u8) << 5) | low);
            }
        } else if let Some((_, lows)) = OPERATIONS.iter().find(|(n, _)| *n == w) {
            for t in 0..4u8 {
                for &low in *lows {
                    set((t << 5) | low);
                }
            }
        } else if w == "cnp" {
            set(0x81);
        } else if let Some(n) = parse_number(&w).filter(|&n| n <= 0xff) {
            set(n as u8);
        } else {
            return Err(format!(
                "unknown opcode class {word:?} (want rc, uc, rd, ud, send, write, read, ack, atomic, flush, cnp or an opcode number 0..=255, comma-separated)"
            ));
        }
    }
    Ok(bits)
}

/// Decimal or 0x-prefixed hexadecimal.
pub fn parse_number(s: &str) -> Option<u32> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

/// The AETH syndrome kinds `--aeth` knows (the syndrome's top three bits, IBTA 9.7.5.1.1).
const AETH_KINDS: &[(&str, u8)] = &[("ack", 0), ("rnr", 1), ("nak", 3)];

/// Parses `--aeth`: comma-separated ack, rnr, nak; the result is a bitmap over the syndrome's
/// top three bits.
pub fn parse_aeth_kinds(s: &str) -> Result<u8, String> {
    let mut bits = 0u8;
    for word in s.split(',').map(str::trim) {
        let w = word.to_ascii_lowercase();
        match AETH_KINDS.iter().find(|(n, _)| *n == w) {
            Some((_, k)) => bits |= 1 << k,
            None => {
                return Err(format!(
                    "unknown AETH kind {word:?} (want ack, rnr or nak, comma-separated)"
                ))
            }
        }
    }
    Ok(bits)
}

/// One line with the transport headers of a frame as the kernel parsed them: the BTH, then
/// each extension header present, in wire order (`--decode`).
pub fn describe(h: &RoceHeaders) -> String {
    let b1 = h.se_m_pad_tver;
    let mut s = format!(
        "op=0x{:02x} {} dqpn=0x{:06x} psn={} a={} se={} m={} pad={} tver={} pkey=0x{:04x}",
        h.opcode,
        opcode_name(h.opcode),
        h.dest_qp,
        h.psn,
        u8::from(h.ack_req),
        b1 >> 7,
        (b1 >> 6) & 1,
        (b1 >> 4) & 3,
        b1 & 0xf,
        h.pkey
    );
    if h.has(ext::RDETH) {
        let _ = write!(s, " rdeth.ee=0x{:06x}", h.ee_ctx);
    }
    if h.has(ext::DETH) {
        let _ = write!(
            s,
            " deth.qkey=0x{:08x} deth.sqpn=0x{:06x}",
            h.qkey, h.src_qp
        );
    }
    if h.has(ext::FETH) {
        let _ = write!(s, " feth=0x{:08x}", h.feth);
    }
    if h.has(ext::RETH) {
        let _ = write!(
            s,
            " reth.va=0x{:016x} reth.rkey=0x{:08x} reth.len={}",
            h.va, h.rkey, h.dma_len
        );
    }
    if h.has(ext::ATOMIC_ETH) {
        let _ = write!(
            s,
            " atomic.va=0x{:016x} atomic.rkey=0x{:08x} atomic.swap=0x{:016x} atomic.cmp=0x{:016x}",
            h.va, h.rkey, h.swap_add, h.compare
        );
    }
    if h.has(ext::AETH) {
        let _ = write!(
            s,
            " aeth.syn=0x{:02x} aeth.msn={}",
            h.aeth >> 24,
            h.aeth & 0xff_ffff
        );
    }
    if h.has(ext::ATOMIC_ACK_ETH) {
        let _ = write!(s, " atomicack.orig=0x{:016x}", h.orig);
    }
    if h.has(ext::IMM_DT) {
        let _ = write!(s, " imm=0x{:08x}", h.imm);
    }
    if h.has(ext::IETH) {
        let _ = write!(s, " ieth.rkey=0x{:08x}", h.ieth_rkey);
    }
    if h.has(ext::TRUNCATED) {
        s.push_str(" truncated");
    }
    s
}

/// Packets that carry a request PSN of their own (not acknowledgements, read responses or
/// CNPs): a PSN that does not advance is a retransmission.
fn is_request(op: u8) -> bool {
    op < 0x80 && !matches!(op & 0x1f, 0x0d..=0x12)
}

/// A flow for PSN repeats: interface index, direction, IP source, IP destination, destination QP.
type Flow = (u32, Direction, [u8; 16], [u8; 16], u32);

/// Counts for the one-line summaries.
#[derive(Default)]
pub struct Summary {
    /// Per opcode, since the last line.
    per_opcode: HashMap<u8, u64>,
    pub frames: u64,
    pub retransmits: u64,
    pub naks: u64,
    pub rnr_naks: u64,
    pub cnps: u64,
    /// Frames that end inside a header their opcode implies.
    pub truncated: u64,
    /// Highest request PSN per flow: where the tap saw it (interface, direction), source,
    /// destination, destination QP. (One packet seen at two tap points, e.g. lo egress and
    /// ingress, is not a repeat.)
    last_psn: HashMap<Flow, u32>,
}

/// Bound on the flows remembered for PSN repeats; past it the table starts over.
const MAX_FLOWS: usize = 1 << 16;

impl Summary {
    /// Counts one frame, from the headers the kernel parsed.
    pub fn observe(&mut self, ifindex: u32, direction: Direction, h: &RoceHeaders) {
        self.frames += 1;
        if h.has(ext::TRUNCATED) {
            self.truncated += 1;
        }
        *self.per_opcode.entry(h.opcode).or_default() += 1;
        if h.opcode == 0x81 {
            self.cnps += 1;
        }
        match h.syndrome().map(|s| s >> 5) {
            Some(1) => self.rnr_naks += 1,
            Some(3) => self.naks += 1,
            _ => {}
        }
        if is_request(h.opcode) {
            if self.last_psn.len() >= MAX_FLOWS {
                self.last_psn.clear();
            }
            let last = self
                .last_psn
                .entry((ifindex, direction, h.src, h.dst, h.dest_qp))
                .or_insert(h.psn.wrapping_sub(1) & 0xff_ffff);
            // 24-bit serial arithmetic: the sign of the difference in the top 24 bits.
            let diff = ((h.psn.wrapping_sub(*last)) << 8) as i32 >> 8;
            if diff <= 0 {
                self.retransmits += 1;
            } else {
                *last = h.psn;
            }
        }
    }

    /// The counts since the last call as one line (and start counting anew), with the ring
    /// buffer drops of that interval.
    pub fn line(&mut self, secs: f64, ring_drops: u64) -> String {
        let mut s = format!("tap: {:.1}s {} frames", secs, self.frames);
        let mut ops: Vec<_> = self.per_opcode.drain().collect();
        ops.sort_unstable();
        if !ops.is_empty() {
            s.push_str(" |");
            for (op, n) in ops {
                let _ = write!(s, " {}={n}", opcode_name(op));
            }
        }
        let _ = write!(
            s,
            " | retransmits={} naks={} rnr_naks={} cnps={} ring_drops={ring_drops}",
            self.retransmits, self.naks, self.rnr_naks, self.cnps
        );
        if self.truncated > 0 {
            let _ = write!(s, " truncated={}", self.truncated);
        }
        self.frames = 0;
        self.retransmits = 0;
        self.naks = 0;
        self.rnr_naks = 0;
        self.cnps = 0;
        self.truncated = 0;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The headers of a frame from 10.0.0.1 to 10.0.0.2 with an AETH of `aeth` if not 0.
    fn hdrs(opcode: u8, dqp: u32, psn: u32, aeth: u32) -> RoceHeaders {
        let mut h = RoceHeaders {
            opcode,
            dest_qp: dqp,
            psn,
            ..Default::default()
        };
        h.src[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        h.dst[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 2]);
        if aeth != 0 {
            h.present = ext::AETH;
            h.aeth = aeth;
        }
        h
    }

    #[test]
    fn describes_every_header() {
        let mut h = hdrs(0x0b, 0x12, 7, 0);
        h.se_m_pad_tver = 0xb0;
        h.ack_req = true;
        h.pkey = 0xffff;
        h.present = ext::RETH | ext::IMM_DT;
        (h.va, h.rkey, h.dma_len, h.imm) = (0x1000, 0xabc, 4096, 0xdeadbeef);
        assert_eq!(
            describe(&h),
            "op=0x0b RC_WRITE_ONLY_IMM dqpn=0x000012 psn=7 a=1 se=1 m=0 pad=3 tver=0 pkey=0xffff \
             reth.va=0x0000000000001000 reth.rkey=0x00000abc reth.len=4096 imm=0xdeadbeef"
        );
        let mut h = hdrs(0x12, 1, 2, 0x0000_0003);
        h.present |= ext::ATOMIC_ACK_ETH | ext::TRUNCATED;
        h.orig = 5;
        assert!(describe(&h)
            .ends_with(" aeth.syn=0x00 aeth.msn=3 atomicack.orig=0x0000000000000005 truncated"));
        let mut h = hdrs(0x64, 1, 2, 0);
        h.present = ext::DETH;
        (h.qkey, h.src_qp) = (0x11111111, 0x22);
        assert!(describe(&h).ends_with(" deth.qkey=0x11111111 deth.sqpn=0x000022"));
    }

    #[test]
    fn summary_counts_repeats_naks_and_cnps() {
        let mut s = Summary::default();
        let eg = Direction::Egress;
        for psn in [0xfffffe, 0xffffff, 0, 1, 1, 0] {
            s.observe(1, eg, &hdrs(0x04, 0x11, psn, 0));
            // The same packets at another tap point are no repeats.
            s.observe(1, Direction::Ingress, &hdrs(0x04, 0x11, psn, 0));
        }
        s.observe(1, eg, &hdrs(0x11, 0x12, 1, 0x6000_0000));
        s.observe(1, eg, &hdrs(0x11, 0x12, 1, 0x2100_0000));
        s.observe(1, eg, &hdrs(0x11, 0x12, 1, 0x1f00_0000));
        s.observe(1, eg, &hdrs(0x81, 0x12, 0, 0));
        assert_eq!((s.retransmits, s.naks, s.rnr_naks, s.cnps), (4, 1, 1, 1));
        let mut s = Summary::default();
        for psn in [0xfffffe, 0xffffff, 0, 1, 1, 0] {
            s.observe(1, eg, &hdrs(0x04, 0x11, psn, 0));
        }
        s.observe(1, eg, &hdrs(0x11, 0x12, 1, 0x6000_0000));
        s.observe(1, eg, &hdrs(0x11, 0x12, 1, 0x2100_0000));
        s.observe(1, eg, &hdrs(0x11, 0x12, 1, 0x1f00_0000));
        s.observe(1, eg, &hdrs(0x81, 0x12, 0, 0));
        assert_eq!((s.retransmits, s.naks, s.rnr_naks, s.cnps), (2, 1, 1, 1));
        let line = s.line(1.0, 3);
        assert!(line.contains("RC_SEND_ONLY=6"), "{line}");
        assert!(line.contains("RC_ACK=3"), "{line}");
        assert!(
            line.contains("retransmits=2 naks=1 rnr_naks=1 cnps=1 ring_drops=3"),
            "{line}"
        );
        assert_eq!(s.frames, 0);
    }

    #[test]
    fn opcode_classes() {
        let has = |b: &[u8; 32], op: u8| b[op as usize / 8] >> (op % 8) & 1 == 1;
        let b = parse_opcode_classes("ud,ack").unwrap();
        assert!(has(&b, 0x64) && has(&b, 0x11) && has(&b, 0x31) && !has(&b, 0x04));
        let b = parse_opcode_classes("0x81").unwrap();
        assert!(has(&b, 0x81) && !has(&b, 0x80));
        assert_eq!(parse_opcode_classes("cnp").unwrap(), b);
        assert!(parse_opcode_classes("bogus").is_err());
        assert!(parse_opcode_classes("256").is_err());
        assert_eq!(parse_aeth_kinds("nak, RNR").unwrap(), 0b1010);
        assert_eq!(parse_aeth_kinds("ack").unwrap(), 1);
        assert!(parse_aeth_kinds("nack").is_err());
        assert_eq!(opcode_name(0x64), "UD_SEND_ONLY");
        assert_eq!(opcode_name(0x0c), "RC_READ_REQUEST");
    }
}
