//! The external oracle: Wireshark's InfiniBand/RoCEv2 dissector must decode every frame we build
//! with the opcode and header fields we meant.
//!
//! One frame of every opcode in the table (IPv4 and IPv6, in Ethernet; IPv4 also as raw IP) with
//! distinctive field values is written to a pcap and decoded by `tshark -T fields`; every
//! frame's BTH, RETH, AETH, AtomicETH, AtomicAckETH, DETH, ImmDt, IETH and ICRC as tshark shows
//! them are compared with what we emitted.
//!
//! When tshark is not installed the test prints `SKIP tshark_decode: tshark not installed` and
//! passes, unless `CI=true`, where it fails. Set `RXE_KEEP_PCAP=1` to keep the pcap files, and
//! `RXE_FUZZ_SEED_DIR=dir` to also write every frame to `dir` as a fuzzing seed.
//!
//! [`tshark_check`] takes any list of frames and derives the expectations from our own parser,
//! so the two-node simulator can dump everything the engine sends and run the same check.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;

use rxe_core::icrc;
use rxe_core::pcap::{write_frames_pcap, LinkType};
use rxe_core::wire::frame::{self, FrameMeta};
use rxe_core::wire::{emit, BthRepr, ExtRepr, OpFlags, Opcode, Packet};

/// Opcodes tshark 4.0 does not know. Its opcode table predates the IBTA memory-placement
/// extensions and RoCEv2 congestion control: RC_FLUSH (0x1c, FETH + RETH), RC_ATOMIC_WRITE
/// (0x1d, RETH + 8-byte payload) and CNP (0x81) are shown as "Unknown OpCode" and nothing after
/// the BTH is dissected, not even the ICRC. For these we check the opcode number and the BTH
/// (and UDP) fields only; a newer tshark that decodes them gets the full check.
const TSHARK_4_0_UNKNOWN: [u8; 3] = [0x1c, 0x1d, 0x81];

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

fn payload_len(op: Opcode) -> usize {
    let f = op.flags();
    if f.contains(OpFlags::ATOMIC_WRITE) {
        8
    } else if f.contains(OpFlags::PAYLOAD) {
        9 // pad count 3
    } else {
        0
    }
}

/// Distinctive values: every field differs between opcodes (index `i`), and wide fields have
/// bits set in every byte.
fn ext(i: u32) -> ExtRepr {
    ExtRepr {
        reth: (
            0x8877_6655_4433_2200 + i as u64,
            0xa1b2_c300 + i,
            0x0001_0200 + i,
        ),
        // Cycle through the syndrome classes: ACK, RNR NAK, NAK.
        aeth: ([0x1f, 0x2e, 0x60, 0x62][i as usize % 4], 0x00fe_dc00 + i),
        atomic: (
            0x0fed_cba9_8765_4300 + i as u64,
            0x5a5a_0000 + i,
            0x1122_3344_5566_7788 + i as u64,
            0x99aa_bbcc_ddee_ff00 + i as u64,
        ),
        atomic_orig: 0x0123_4567_89ab_cd00 + i as u64,
        deth: (0x8001_2300 + i, 0x00ab_cd00 + i),
        imm: 0xcafe_0000 + i,
        ieth: 0x7e7e_0000 + i,
        feth: (1, 1),
    }
}

fn bth(op: Opcode, i: u32) -> BthRepr {
    BthRepr {
        opcode: op,
        solicited: i % 2 == 1,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xffff - i as u16,
        fecn: false,
        becn: false,
        dest_qp: 0x00c0_0000 + (i << 8) + i,
        ack_req: i.is_multiple_of(3),
        psn: 0x00f0_0000 + (i << 12) + i,
    }
}

fn roce(op: Opcode, i: u32) -> Vec<u8> {
    let mut b = vec![0u8; 256];
    let (n, pr) = emit(&mut b, &bth(op, i), &ext(i), payload_len(op)).unwrap();
    for (k, x) in b[pr].iter_mut().enumerate() {
        *x = 0xd0 + k as u8;
    }
    b.truncate(n);
    b
}

/// One frame of every opcode: IPv4 or IPv6, with or without Ethernet.
pub fn every_opcode_frames(v6: bool, l2: bool) -> Vec<Vec<u8>> {
    Opcode::all()
        .enumerate()
        .map(|(i, op)| {
            let i = i as u32;
            let (s, d): (IpAddr, IpAddr) = if v6 {
                (
                    "fd00:ab::1".parse::<Ipv6Addr>().unwrap().into(),
                    "fd00:ab::2".parse::<Ipv6Addr>().unwrap().into(),
                )
            } else {
                (
                    Ipv4Addr::new(10, 9, 8, 1).into(),
                    Ipv4Addr::new(10, 9, 8, 2).into(),
                )
            };
            let mut m = FrameMeta::new(s, d, icrc::rc_udp_sport(0, 0x40 + i, 0x41));
            if l2 {
                m = m.with_eth([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
            }
            m.ipv4_id = i as u16;
            m.flow_label = i;
            let r = roce(op, i);
            let mut out = vec![0u8; m.header_len().unwrap() + r.len()];
            frame::build(&mut out, &m, &r).unwrap();
            out
        })
        .collect()
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
fn tshark_version() -> Option<String> {
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

/// Writes `frames` (Ethernet frames if `l2`, else IP datagrams) to a temporary pcap, decodes it
/// with tshark and checks every frame's RoCE fields against our parser. Returns the number of
/// frames tshark decoded fully and the opcodes it only decoded the BTH of, or `None` when
/// tshark is not installed.
pub fn tshark_check(tag: &str, frames: &[Vec<u8>], l2: bool) -> Option<(usize, Vec<u8>)> {
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
        if unknown {
            bth_only.push(op);
        } else {
            full += 1;
        }
    }
    Some((full, bth_only))
}

/// With `RXE_FUZZ_SEED_DIR` set, writes every frame of the tshark check there, one file each:
/// the seeds of the `packet_parse` fuzz target (see `fuzz/README.md`). Otherwise does nothing.
#[test]
fn write_fuzz_seeds() {
    let Some(dir) = std::env::var_os("RXE_FUZZ_SEED_DIR") else {
        return;
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (tag, v6, l2) in [("eth-ipv4", false, true), ("raw-ipv6", true, false)] {
        for (k, f) in every_opcode_frames(v6, l2).iter().enumerate() {
            std::fs::write(dir.join(format!("{tag}-{k:02}")), f).unwrap();
        }
    }
}

#[test]
fn tshark_decodes_every_opcode() {
    let Some(version) = tshark_version() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("tshark_decode: tshark not installed and CI=true");
        }
        println!("SKIP tshark_decode: tshark not installed");
        return;
    };
    println!("tshark_decode: {version}");

    // Our side first: the frames carry the values we meant.
    for (i, (op, fr)) in Opcode::all()
        .zip(every_opcode_frames(false, true))
        .enumerate()
    {
        let (_, r) = frame::parse_frame(&fr, true).unwrap();
        let p = Packet::new_checked(r).unwrap();
        let b = bth(op, i as u32);
        assert_eq!((p.opcode(), p.bth().psn()), (op, b.psn));
        assert_eq!(p.bth().dest_qp(), b.dest_qp);
        let e = ext(i as u32);
        if let Some(x) = p.reth() {
            assert_eq!((x.va(), x.rkey(), x.dma_len()), e.reth);
        }
        if let Some(x) = p.atomic_eth() {
            assert_eq!((x.va(), x.rkey(), x.swap_add(), x.compare()), e.atomic);
        }
    }

    let n = Opcode::all().count();
    for (tag, v6, l2) in [
        ("eth-ipv4", false, true),
        ("eth-ipv6", true, true),
        ("raw-ipv4", false, false),
        ("raw-ipv6", true, false),
    ] {
        let frames = every_opcode_frames(v6, l2);
        let (full, bth_only) = tshark_check(tag, &frames, l2).expect("tshark vanished");
        assert_eq!(full + bth_only.len(), n);
        for op in &bth_only {
            assert!(
                TSHARK_4_0_UNKNOWN.contains(op),
                "{tag}: tshark did not decode {:?}",
                Opcode(*op)
            );
        }
        println!(
            "tshark_decode {tag}: {full}/{n} opcodes fully decoded; BTH only: {:?}",
            bth_only.iter().map(|o| Opcode(*o)).collect::<Vec<_>>()
        );
    }
}
