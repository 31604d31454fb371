//! The engine alone: two devices joined in memory, lossless, on one core.
//!
//! Run: `cargo bench -p rxe-core --bench engine`; after `--`: `--quick` for a short run,
//! `--only send` or `--only write` for one case, `--no-baseline` to measure the engine alone
//! (e.g. under callgrind; no baseline columns and no ratio are printed then).
//!
//! Each line prints the engine's rate beside a baseline measured in the same run: the same
//! packets built with `wire::emit`, parsed with `Packet::new_checked` and their payload copied
//! between the same two memories — framing and copying with no transport logic. The ratio is
//! what the protocol engine costs on top of moving the bytes. `64 KiB WRITE seg` sends the
//! same WRITEs in segments of 64 KiB (`Device::poll_transmit_segments`, as between two
//! devices of one daemon with `--same-host`); its baseline frames and copies 64 KiB segments.
//!
//! Every packet the engine emits must be accepted by the other engine (a dropped packet
//! aborts the run rather than counting as throughput), every completion must succeed, and
//! after the timed loop the last message's bytes are compared with the source.
//!
//! `cargo test --all-targets` runs this target too, without `--bench`: it then moves a few
//! hundred messages per case with the same checks and prints no rates (a smoke test, not a
//! measurement).

use std::hint::black_box;
use std::time::{Duration, Instant as Wall};

use rxe_core::device::RecvMeta;
use rxe_core::mem::{Memory, VecMemory};
use rxe_core::sim::{ConnOpts, Sim};
use rxe_core::verbs::*;
use rxe_core::wire::{self, BthRepr, ExtRepr, Opcode, Packet};
use rxe_core::{DeviceConfig, Instant};

struct Result {
    msgs: u64,
    data_pkts: u64,
    all_pkts: u64,
    bytes: u64,
    secs: f64,
}

/// Pumps packets between the two devices of `sim` without the simulator's queue: every packet
/// goes straight from one device's `poll_transmit` into the other's `handle_packet`.
/// With `segments`, as between two devices of one process: RC packets in segments as large
/// as `buf` holds, taken in with `handle_packet_in_memory`.
fn pump(
    sim: &mut Sim,
    buf: &mut [u8],
    segments: bool,
    data_pkts: &mut u64,
    all_pkts: &mut u64,
) -> bool {
    let mut moved = false;
    let now = Instant(1);
    for from in 0..2 {
        let to = 1 - from;
        loop {
            let (a, b) = sim.nodes.split_at_mut(1);
            let (src, dst) = if from == 0 {
                (&mut a[0], &mut b[0])
            } else {
                (&mut b[0], &mut a[0])
            };
            let tx = if segments {
                src.dev
                    .poll_transmit_segments(now, &mut src.mem, buf, &|_| true)
            } else {
                src.dev.poll_transmit(now, &mut src.mem, buf)
            };
            let Some(tx) = tx else {
                break;
            };
            let meta = RecvMeta {
                src: tx.src,
                dst: tx.dst,
                sport: tx.sport,
                hop_limit: 64,
                ..Default::default()
            };
            let r = if segments {
                dst.dev
                    .handle_packet_in_memory(now, &meta, &buf[..tx.len], &mut dst.mem)
            } else {
                dst.dev
                    .handle_packet(now, &meta, &buf[..tx.len], &mut dst.mem)
            };
            if let Err(e) = r {
                panic!("node {to} dropped a packet of a lossless run: {e:?}");
            }
            *all_pkts += 1;
            if to == 1 {
                *data_pkts += 1;
            }
            moved = true;
        }
    }
    moved
}

/// How long a run goes on: for a time, or (the smoke test) for a number of messages.
#[derive(Clone, Copy)]
enum Until {
    Elapsed(Duration),
    Messages(u64),
}

/// `seg`: 0 for packets of one path MTU, else the payload of a segment.
fn run_engine(op_len: usize, write: bool, seg: usize, until: Until) -> Result {
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut sim = Sim::with_config(1, cfg);
    let ep = sim.connect(ConnOpts {
        mtu: Mtu::M4096,
        ..Default::default()
    });
    let (src, skey) = sim.reg(0, ep[0].pd, op_len.max(8), Access::LOCAL_WRITE);
    let (dst, dkey) = sim.reg(
        1,
        ep[1].pd,
        op_len.max(8),
        Access::LOCAL_WRITE.union(Access::REMOTE_WRITE),
    );
    // A source no two segments of which are alike, and a target that holds none of it.
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in sim.nodes[0].mem.slice_mut(src, op_len) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    // Built once, as the daemon builds a WR's list in place (an SGE list of one is kept
    // inline: posting allocates nothing).
    let sge: SgList = vec![Sge {
        addr: src,
        length: op_len as u32,
        lkey: skey,
    }]
    .into();
    let rsge: SgList = vec![Sge {
        addr: dst,
        length: op_len as u32,
        lkey: dkey,
    }]
    .into();
    let window = 128u64;
    let mut buf = vec![0u8; 8192.max(seg + rxe_core::device::SEGMENT_HEADROOM)];
    let segments = seg > 0;
    let (mut posted, mut done, mut data_pkts, mut all_pkts) = (0u64, 0u64, 0u64, 0u64);
    let start = Wall::now();
    let mut next_check = 0u64;
    let max = match until {
        Until::Messages(n) => n,
        Until::Elapsed(_) => u64::MAX,
    };
    loop {
        while posted - done < window && posted < max {
            if !write {
                sim.dev(1)
                    .post_recv(
                        ep[1].qpn,
                        RecvWr {
                            wr_id: posted,
                            sg_list: rsge.clone(),
                        },
                    )
                    .unwrap();
            }
            let op = if write {
                SendOp::Write {
                    remote_addr: dst,
                    rkey: dkey,
                }
            } else {
                SendOp::Send
            };
            sim.dev(0)
                .post_send(ep[0].qpn, SendWr::new(posted, op, sge.clone()))
                .unwrap();
            posted += 1;
        }
        let moved = pump(&mut sim, &mut buf, segments, &mut data_pkts, &mut all_pkts);
        while let Some(c) = sim.dev(0).poll_cq(ep[0].cq) {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done += 1;
        }
        while let Some(c) = sim.dev(1).poll_cq(ep[1].cq) {
            assert_eq!(
                (c.status, c.byte_len as usize),
                (WcStatus::Success, op_len),
                "{c:?}"
            );
        }
        assert!(
            moved || posted == done,
            "stalled with {} messages outstanding",
            posted - done
        );
        match until {
            Until::Messages(n) if done >= n => break,
            Until::Elapsed(d) if done >= next_check => {
                next_check = done + 1024;
                if start.elapsed() >= d {
                    break;
                }
            }
            _ => {}
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // Let the messages still in flight finish, then check the bytes of the last one.
    while posted > done {
        let moved = pump(&mut sim, &mut buf, segments, &mut data_pkts, &mut all_pkts);
        while let Some(c) = sim.dev(0).poll_cq(ep[0].cq) {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done += 1;
        }
        while sim.dev(1).poll_cq(ep[1].cq).is_some() {}
        assert!(moved || posted == done, "stalled while draining");
    }
    let (a, b) = (&sim.nodes[0].mem, &sim.nodes[1].mem);
    assert!(
        a.slice(src, op_len) == b.slice(dst, op_len),
        "the target does not hold the source's bytes"
    );
    Result {
        msgs: done,
        data_pkts,
        all_pkts,
        bytes: done * op_len as u64,
        secs,
    }
}

/// The baseline: the same data packets (or segments of `seg` bytes) framed, parsed and
/// copied, with no engine.
fn run_baseline(op_len: usize, write: bool, seg: usize, duration: Duration) -> Result {
    let mtu = if seg > 0 { seg } else { 4096usize };
    let mut a = VecMemory::new(0, op_len.max(8));
    let mut b = VecMemory::new(0, op_len.max(8));
    a.bytes
        .iter_mut()
        .enumerate()
        .for_each(|(i, x)| *x = i as u8);
    let mut buf = vec![0u8; 8192.max(mtu + rxe_core::device::SEGMENT_HEADROOM)];
    let (mut msgs, mut pkts) = (0u64, 0u64);
    let start = Wall::now();
    let mut psn = 0u32;
    while start.elapsed() < duration {
        for _ in 0..256 {
            let mut off = 0;
            loop {
                let n = (op_len - off).min(mtu);
                let last = off + n == op_len;
                let op = match (write, off == 0, last) {
                    (false, _, true) => Opcode::RC_SEND_ONLY,
                    (true, true, true) => Opcode::RC_RDMA_WRITE_ONLY,
                    (true, true, false) => Opcode::RC_RDMA_WRITE_FIRST,
                    (true, false, false) => Opcode::RC_RDMA_WRITE_MIDDLE,
                    _ => Opcode::RC_RDMA_WRITE_LAST,
                };
                let bth = BthRepr::new(op, 0x11, psn, last);
                let ext = ExtRepr {
                    reth: (0, 0x100, op_len as u32),
                    ..Default::default()
                };
                let (len, r) = wire::emit(&mut buf, &bth, &ext, n).unwrap();
                a.read(off as u64, &mut buf[r]).unwrap();
                let p = Packet::new_checked(&buf[..len]).unwrap();
                b.write(off as u64, black_box(p.payload())).unwrap();
                psn = (psn + 1) & 0xff_ffff;
                pkts += 1;
                off += n;
                if last {
                    break;
                }
            }
            msgs += 1;
        }
    }
    Result {
        msgs,
        data_pkts: pkts,
        all_pkts: pkts,
        bytes: msgs * op_len as u64,
        secs: start.elapsed().as_secs_f64(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |f: &str| args.iter().any(|a| a == f);
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this without it.
    let smoke = !has("--bench");
    let no_baseline = has("--no-baseline");
    let only = match args.iter().position(|a| a == "--only") {
        Some(i) => match args.get(i + 1).map(|s| s.to_ascii_lowercase()).as_deref() {
            Some(o @ ("send" | "write")) => Some(o.to_string()),
            other => {
                eprintln!("engine bench: --only wants send or write, not {other:?}");
                std::process::exit(2);
            }
        },
        None => None,
    };
    let d = Duration::from_millis(if has("--quick") { 300 } else { 2000 });
    // (name, --only, length, WRITE, segment payload: 0 for packets of one path MTU)
    let cases = [
        ("64 B RC SEND", "send", 64usize, false, 0usize),
        ("64 KiB RC WRITE", "write", 65536, true, 0),
        ("64 KiB WRITE seg", "write", 65536, true, 65536),
    ];
    let cases = cases
        .iter()
        .filter(|c| only.as_deref().is_none_or(|o| o == c.1));
    if smoke {
        for &(name, _, len, write, seg) in cases {
            let e = run_engine(len, write, seg, Until::Messages(300));
            println!(
                "{name}: {} messages, {} data packets, data checked (smoke test; `cargo bench` measures)",
                e.msgs, e.data_pkts
            );
        }
        return;
    }
    println!("rxe-core engine benchmark: two devices in one thread, lossless, path MTU 4096");
    if no_baseline {
        println!(
            "{:<16} | {:>12} {:>12} {:>12} {:>8}",
            "case", "msgs/s", "data pkt/s", "all pkt/s", "GB/s"
        );
    } else {
        println!(
            "{:<16} | {:>12} {:>12} {:>12} {:>8} | {:>12} {:>8} | {:>7}",
            "case", "msgs/s", "data pkt/s", "all pkt/s", "GB/s", "base pkt/s", "GB/s", "engine"
        );
    }
    for &(name, _, len, write, seg) in cases {
        let e = run_engine(len, write, seg, Until::Elapsed(d));
        let pps = e.data_pkts as f64 / e.secs;
        let engine = format!(
            "{:<16} | {:>12.0} {:>12.0} {:>12.0} {:>8.2}",
            name,
            e.msgs as f64 / e.secs,
            pps,
            e.all_pkts as f64 / e.secs,
            e.bytes as f64 / e.secs / 1e9,
        );
        if no_baseline {
            println!("{engine}");
            continue;
        }
        let b = run_baseline(len, write, seg, d);
        let bpps = b.data_pkts as f64 / b.secs;
        println!(
            "{engine} | {:>12.0} {:>8.2} | {:>6.0}%",
            bpps,
            b.bytes as f64 / b.secs / 1e9,
            100.0 * pps / bpps
        );
    }
    if no_baseline {
        println!("all pkt/s counts ACKs too; no baseline was run (--no-baseline).");
    } else {
        println!("all pkt/s counts ACKs too; 'engine' is the engine's data packet rate as a share of the baseline's.");
    }
}
