//! The tshark oracle, shared by `tshark_decode` (hand-built frames of every opcode) and
//! `sim_tshark` (everything the engine sends in a simulated workload): write frames to a pcap,
//! decode it with `tshark -T fields`, and compare every frame's RoCE fields with what our own
//! parser reads from the same bytes.
//!
//! [`tshark_check`] takes any list of frames and derives the expectations from our own parser.
//! Set `RXE_KEEP_PCAP=1` to keep the pcap files.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use rxe_core::pcap::{write_frames_pcap, LinkType};
use rxe_core::wire::frame;
use rxe_core::wire::{Opcode, Packet};

/// Opcodes tshark 4.0 does not know. Its opcode table predates the IBTA memory-placement
/// extensions and RoCEv2 congestion control: RC_FLUSH (0x1c, FETH + RETH), RC_ATOMIC_WRITE
/// (0x1d, RETH + 8-byte payload) and CNP (0x81) are shown as "Unknown OpCode" and nothing after
/// the BTH is dissected, not even the ICRC. For these we check the opcode number and the BTH
/// (and UDP) fields only; a newer tshark that decodes them gets the full check.
///
/// The XRC opcodes (0xa0 … 0xb7) tshark 4.0 names ("Extended Reliable Connection (XRC) - …")
/// but dissects nothing after their BTH either: no XRCETH, RETH, AETH or ICRC, only
/// "Unknown/Vendor Specific Data" (`tests/xrc.rs` checks the XRCETH in those bytes).
pub const TSHARK_4_0_UNKNOWN: &[u8] = &[
    0x1c, 0x1d, 0x81, 0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac,
    0xad, 0xae, 0xaf, 0xb0, 0xb1, 0xb2, 0xb3, 0xb4, 0xb6, 0xb7,
];

const FIELDS: &[&str] = &[
    "frame.number",
    "infiniband.bth.opcode",
    "infiniband.bth.se",
    "infiniband.bth.padcnt",
    "infiniband.bth.p_key",
    "infiniband.bth.destqp",
    "infiniband.bth.a",
    "infiniband.bth.psn",
    "infiniband.reth.va",
    "infiniband.reth.r_key",
    "infiniband.reth.dmalen",
    "infiniband.aeth.syndrome",
    "infiniband.aeth.msn",
    "infiniband.atomiceth.swapdt",
    "infiniband.atomiceth.cmpdt",
    "infiniband.atomicacketh.origremdt",
    "infiniband.deth.q_key",
    "infiniband.deth.srcqp",
    "infiniband.immdt",
    "infiniband.ieth",
    "infiniband.invariant.crc",
    "udp.srcport",
    "udp.dstport",
    // Must stay empty: no malformed-packet or other expert info on any frame.
    "_ws.malformed",
    "_ws.expert.severity",
];

fn col(name: &str) -> usize {
    FIELDS.iter().position(|f| *f == name).unwrap()
}

/// The field values tshark should print for one frame, from our own parser. `None` means the
/// field must be absent.
fn expected(frame: &[u8], l2: bool) -> Vec<Option<u64>> {
    let (m, r) = frame::parse_frame(frame, l2).expect("our own frame parses");
    let p = Packet::new_checked(r).expect("our own packet parses");
    let b = p.bth();
    let mut e = vec![None; FIELDS.len()];
    let mut set = |name: &str, v: u64| e[col(name)] = Some(v);
    set("infiniband.bth.opcode", p.opcode().0 as u64);
    set("infiniband.bth.se", b.solicited() as u64);
    set("infiniband.bth.padcnt", b.pad_count() as u64);
    set("infiniband.bth.p_key", b.pkey() as u64);
    set("infiniband.bth.destqp", b.dest_qp() as u64);
    set("infiniband.bth.a", b.ack_req() as u64);
    set("infiniband.bth.psn", b.psn() as u64);
    if let Some(x) = p.reth() {
        set("infiniband.reth.va", x.va());
        set("infiniband.reth.r_key", x.rkey() as u64);
        set("infiniband.reth.dmalen", x.dma_len() as u64);
    }
    if let Some(x) = p.aeth() {
        set("infiniband.aeth.syndrome", x.syndrome_byte() as u64);
        set("infiniband.aeth.msn", x.msn() as u64);
    }
    if let Some(x) = p.atomic_eth() {
        // Wireshark shows the AtomicETH VA and R_Key under the RETH field names.
        set("infiniband.reth.va", x.va());
        set("infiniband.reth.r_key", x.rkey() as u64);
        set("infiniband.atomiceth.swapdt", x.swap_add());
        set("infiniband.atomiceth.cmpdt", x.compare());
    }
    if let Some(x) = p.atomic_ack_eth() {
        set("infiniband.atomicacketh.origremdt", x.orig());
    }
    if let Some(x) = p.deth() {
        set("infiniband.deth.q_key", x.qkey() as u64);
        set("infiniband.deth.srcqp", x.src_qp() as u64);
    }
    if let Some(x) = p.imm() {
        set("infiniband.immdt", x as u64);
    }
    if let Some(x) = p.ieth() {
        set("infiniband.ieth", x as u64);
    }
    // tshark shows the four ICRC bytes as a big-endian number; `icrc()` is the little-endian CRC.
    set("infiniband.invariant.crc", p.icrc().swap_bytes() as u64);
    set("udp.srcport", m.sport as u64);
    set("udp.dstport", m.dport as u64);
    e
}

/// Fields tshark prints as raw bytes (hex digits).
const BYTES_FIELDS: &[&str] = &["infiniband.immdt", "infiniband.ieth"];

fn hex_bytes(s: &str) -> Option<u64> {
    let h: String = s.trim().chars().filter(|c| *c != ':').collect();
    if h.is_empty() {
        None
    } else {
        u64::from_str_radix(&h, 16).ok()
    }
}

/// Parses a tshark number field: decimal, `0x` hex or a boolean.
fn num(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    match s {
        "True" | "true" | "1" => return Some(1),
        "False" | "false" | "0" => return Some(0),
        _ => {}
    }
    if let Some(h) = s.strip_prefix("0x") {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse::<u64>().ok()
}

/// Deletes a file when dropped (unless `RXE_KEEP_PCAP` is set).
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        if std::env::var_os("RXE_KEEP_PCAP").is_some() {
            println!("kept {}", self.0.display());
        } else {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn temp_pcap(tag: &str) -> TempFile {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    TempFile(std::env::temp_dir().join(format!(
        "rxe-core-tshark-{}-{tag}-{nanos}.pcap",
        std::process::id()
    )))
}

/// `tshark --version`'s first line, or `None` when tshark is not installed.
pub fn tshark_version() -> Option<String> {
    match Command::new("tshark").arg("--version").output() {
        Ok(o) => Some(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string(),
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => panic!("running tshark: {e}"),
    }
}

/// Runs tshark over a pcap and returns one row of `FIELDS` per frame.
fn tshark_fields(path: &Path) -> Vec<Vec<String>> {
    let mut cmd = Command::new("tshark");
    // RRoCE on UDP 4791 is tshark's default (preference `infiniband.rroce.port`), so no `-d`:
    // the decode-as name differs between versions (4.0 has `infiniband`, not `rroce`). The
    // RPC-over-RDMA heuristic dissector would claim SEND payloads and stop the dissection with
    // "Malformed Packet" before the ICRC, so it is disabled. `occurrence=f`: tshark adds some
    // fields (ImmDt, IETH) twice. tshark also checks our IPv4 header checksums (an error would
    // show as expert info); a zero UDP checksum over IPv6 is what rxe sends (RFC 6935 tunnels),
    // which tshark would otherwise flag as illegal.
    cmd.arg("-r")
        .arg(path)
        .args(["--disable-protocol", "rpcordma"])
        .args(["-o", "ip.check_checksum:TRUE"])
        .args(["-o", "udp.ignore_ipv6_zero_checksum:TRUE"])
        .args(["-T", "fields", "-E", "separator=,", "-E", "occurrence=f"]);
    for f in FIELDS {
        cmd.args(["-e", f]);
    }
    let o = cmd.output().expect("run tshark");
    assert!(
        o.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .expect("tshark output is UTF-8")
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// What [`tshark_check`] found.
#[derive(Debug)]
pub struct TsharkReport {
    /// Frames tshark decoded fully (every extension header and the ICRC).
    pub full: usize,
    /// Opcodes of the frames tshark decoded only the BTH of (in frame order, repeats kept).
    pub bth_only: Vec<u8>,
    /// `(opcode, PSN, destination QP)` of every frame, as tshark printed them, in frame order.
    pub decoded: Vec<(u8, u32, u32)>,
}

/// Writes `frames` (Ethernet frames if `l2`, else IP datagrams) to a temporary pcap, decodes it
/// with tshark and checks every frame's RoCE fields against our parser. Returns the number of
/// frames tshark decoded fully, the opcodes it only decoded the BTH of and its BTH fields, or
/// `None` when tshark is not installed.
pub fn tshark_check(tag: &str, frames: &[Vec<u8>], l2: bool) -> Option<TsharkReport> {
    tshark_version()?;
    let f = temp_pcap(tag);
    let lt = if l2 {
        LinkType::ETHERNET
    } else {
        LinkType::RAW
    };
    write_frames_pcap(&f.0, lt, frames).expect("write pcap");
    let rows = tshark_fields(&f.0);
    assert_eq!(rows.len(), frames.len(), "{tag}: one row per frame");
    let mut full = 0;
    let mut bth_only = Vec::new();
    let mut decoded = Vec::new();
    for (k, (fr, row)) in frames.iter().zip(&rows).enumerate() {
        assert_eq!(row.len(), FIELDS.len(), "{tag} frame {k}: {row:?}");
        assert_eq!(num(&row[0]), Some(k as u64 + 1));
        let want = expected(fr, l2);
        let op = want[col("infiniband.bth.opcode")].unwrap() as u8;
        let got: Vec<Option<u64>> = row
            .iter()
            .zip(FIELDS)
            .map(|(s, name)| {
                if name.starts_with("_ws.") {
                    // Present at all is a failure; any text maps to a value `want` never has.
                    (!s.trim().is_empty()).then_some(u64::MAX)
                } else if BYTES_FIELDS.contains(name) {
                    hex_bytes(s)
                } else {
                    num(s)
                }
            })
            .collect();
        let ctx = format!("{tag} frame {} opcode {:?}: row {row:?}", k + 1, Opcode(op));
        // tshark dissected only the BTH: it does not know the opcode.
        let unknown = got[col("infiniband.invariant.crc")].is_none();
        for (c, name) in FIELDS.iter().enumerate().skip(1) {
            let is_bth = !name.starts_with("infiniband.") || name.starts_with("infiniband.bth.");
            if unknown && !is_bth {
                continue;
            }
            assert_eq!(got[c], want[c], "{ctx}: field {name}");
        }
        let field = |name| got[col(name)].unwrap_or(u64::MAX);
        decoded.push((
            field("infiniband.bth.opcode") as u8,
            field("infiniband.bth.psn") as u32,
            field("infiniband.bth.destqp") as u32,
        ));
        if unknown {
            bth_only.push(op);
        } else {
            full += 1;
        }
    }
    Some(TsharkReport {
        full,
        bth_only,
        decoded,
    })
}
