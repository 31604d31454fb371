//! What user space reads from a captured frame: enough of Ethernet / IP / UDP / BTH / AETH for
//! the per-second summary, the opcode names, and the `--opcode` classes.

use std::collections::HashMap;
use std::fmt::Write as _;

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

/// The fields the summary needs from one RoCEv2 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Headers {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub opcode: u8,
    pub dest_qp: u32,
    pub psn: u32,
    /// AETH syndrome, for ACKNOWLEDGE and ATOMIC_ACKNOWLEDGE.
    pub syndrome: Option<u8>,
}

/// Parses Ethernet (up to two VLAN tags) / IPv4 or IPv6 / UDP 4791 / BTH [/ AETH]; `None` for
/// anything else or a frame cut before the BTH.
pub fn parse(f: &[u8]) -> Option<Headers> {
    let be16 =
        |o: usize| -> Option<u16> { Some(u16::from_be_bytes(f.get(o..o + 2)?.try_into().ok()?)) };
    let mut off = 12;
    let mut proto = be16(off)?;
    off += 2;
    for _ in 0..2 {
        if proto != 0x8100 && proto != 0x88a8 {
            break;
        }
        proto = be16(off + 2)?;
        off += 4;
    }
    let (mut src, mut dst) = ([0u8; 16], [0u8; 16]);
    match proto {
        0x0800 => {
            let ip = f.get(off..off + 20)?;
            if ip[0] >> 4 != 4 || ip[9] != 17 {
                return None;
            }
            src[10..12].copy_from_slice(&[0xff, 0xff]);
            dst[10..12].copy_from_slice(&[0xff, 0xff]);
            src[12..].copy_from_slice(&ip[12..16]);
            dst[12..].copy_from_slice(&ip[16..20]);
            off += (ip[0] as usize & 0xf) * 4;
        }
        0x86dd => {
            let ip = f.get(off..off + 40)?;
            if ip[0] >> 4 != 6 || ip[6] != 17 {
                return None;
            }
            src.copy_from_slice(&ip[8..24]);
            dst.copy_from_slice(&ip[24..40]);
            off += 40;
        }
        _ => return None,
    }
    if be16(off + 2)? != 4791 {
        return None;
    }
    let bth = f.get(off + 8..off + 20)?;
    let opcode = bth[0];
    let syndrome = if opcode < 0x80 && matches!(opcode & 0x1f, 0x11 | 0x12) {
        f.get(off + 20).copied()
    } else {
        None
    };
    Some(Headers {
        src,
        dst,
        opcode,
        dest_qp: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
        psn: u32::from_be_bytes([0, bth[9], bth[10], bth[11]]),
        syndrome,
    })
}

/// Packets that carry a request PSN of their own (not acknowledgements, read responses or
/// CNPs): a PSN that does not advance is a retransmission.
fn is_request(op: u8) -> bool {
    op < 0x80 && !matches!(op & 0x1f, 0x0d..=0x12)
}

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
    pub not_roce: u64,
    /// Highest request PSN per (source, destination, destination QP).
    last_psn: HashMap<([u8; 16], [u8; 16], u32), u32>,
}

/// Bound on the flows remembered for PSN repeats; past it the table starts over.
const MAX_FLOWS: usize = 1 << 16;

impl Summary {
    pub fn observe(&mut self, frame: &[u8]) {
        self.frames += 1;
        let Some(h) = parse(frame) else {
            self.not_roce += 1;
            return;
        };
        *self.per_opcode.entry(h.opcode).or_default() += 1;
        if h.opcode == 0x81 {
            self.cnps += 1;
        }
        match h.syndrome.map(|s| s >> 5) {
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
                .entry((h.src, h.dst, h.dest_qp))
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
        if self.not_roce > 0 {
            let _ = write!(s, " unparsed={}", self.not_roce);
        }
        self.frames = 0;
        self.retransmits = 0;
        self.naks = 0;
        self.rnr_naks = 0;
        self.cnps = 0;
        self.not_roce = 0;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet / IPv4 / UDP 4791 / BTH (+ 4 bytes after it).
    fn frame(opcode: u8, dqp: u32, psn: u32, after: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let mut ip = [0u8; 20];
        ip[0] = 0x45;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&[10, 0, 0, 1]);
        ip[16..20].copy_from_slice(&[10, 0, 0, 2]);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0xc0, 0x00, 0x12, 0xb7, 0, 0, 0, 0]);
        let d = dqp.to_be_bytes();
        let p = psn.to_be_bytes();
        f.extend_from_slice(&[
            opcode, 0, 0xff, 0xff, 0, d[1], d[2], d[3], 0, p[1], p[2], p[3],
        ]);
        f.extend_from_slice(&after);
        f
    }

    #[test]
    fn parses_bth_and_aeth() {
        let h = parse(&frame(0x11, 0x12, 0xabcdef, [0x60, 0, 0, 0])).unwrap();
        assert_eq!(
            (h.opcode, h.dest_qp, h.psn, h.syndrome),
            (0x11, 0x12, 0xabcdef, Some(0x60))
        );
        assert_eq!(&h.src[10..], &[0xff, 0xff, 10, 0, 0, 1]);
        let mut vlan = frame(4, 1, 2, [0; 4]);
        vlan.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        assert_eq!(parse(&vlan).unwrap().dest_qp, 1);
        let mut not = frame(4, 1, 2, [0; 4]);
        not[14 + 20 + 3] = 0x35; // port 4789
        assert!(parse(&not).is_none());
        assert!(parse(&frame(4, 1, 2, [0; 4])[..40]).is_none());
    }

    #[test]
    fn summary_counts_repeats_naks_and_cnps() {
        let mut s = Summary::default();
        for psn in [0xfffffe, 0xffffff, 0, 1, 1, 0] {
            s.observe(&frame(0x04, 0x11, psn, [0; 4]));
        }
        s.observe(&frame(0x11, 0x12, 1, [0x60, 0, 0, 0]));
        s.observe(&frame(0x11, 0x12, 1, [0x21, 0, 0, 0]));
        s.observe(&frame(0x11, 0x12, 1, [0x1f, 0, 0, 0]));
        s.observe(&frame(0x81, 0x12, 0, [0; 4]));
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
        assert_eq!(opcode_name(0x64), "UD_SEND_ONLY");
        assert_eq!(opcode_name(0x0c), "RC_READ_REQUEST");
    }
}
