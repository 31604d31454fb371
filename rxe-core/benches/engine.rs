//! The engine alone: two devices joined in memory, lossless, on one core (and, in the shards
//! table, on a thread per shard).
//!
//! Run: `cargo bench -p rxe-core --bench engine`; after `--`: `--quick` for a short run,
//! `--only send`, `--only write`, `--only shards` or `--only icrc` for one case, `--no-baseline` to measure
//! the engine alone (e.g. under callgrind; no baseline columns and no ratio are printed then).
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
//! The shards table runs 64 B SENDs with both devices in 1, 2 (and, on a machine with more
//! cores, as many as cores) shards (`Device::new_sharded`), a QP pair and a thread per shard;
//! the one-shard rate of the same run is its baseline.
//!
//! The icrc table is the receive-side ICRC check of a UDP-socket receiver per packet: the
//! plain CRC check (`icrc::verify`, what an ID-0 packet costs) beside an IPv4 ID solve with
//! the basis cached, a solve for packets cycling through more lengths than the solver caches
//! (each builds its basis: the junk of security review F6), and a solve plus the window
//! decision (`Ipv4IdWindows`), all in the same run.
//!
//! `cargo test --all-targets` runs this target too, without `--bench`: it then moves a few
//! hundred messages per case with the same checks and prints no rates (a smoke test, not a
//! measurement).

use std::hint::black_box;
use std::time::{Duration, Instant as Wall};

use rxe_core::device::RecvMeta;
use rxe_core::mem::{Backing, Memory, VecMemory};
use rxe_core::sim::{bring_up_pair, ConnOpts, Sim};
use rxe_core::verbs::*;
use rxe_core::wire::{self, BthRepr, ExtRepr, Opcode, Packet};
use rxe_core::{Device, DeviceConfig, Gid, Instant, QpInit};

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

/// Polls CQ `cq` empty, up to 64 completions at a time (as `ibv_poll_cq` with an array).
fn drain_cq(dev: &mut Device, cq: u32, cqes: &mut Vec<Cqe>, mut f: impl FnMut(&Cqe)) {
    loop {
        cqes.clear();
        if dev.poll_cq_into(cq, 64, cqes) == 0 {
            return;
        }
        cqes.iter().for_each(&mut f);
    }
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
    let mut cqes = Vec::with_capacity(64);
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
        drain_cq(sim.dev(0), ep[0].cq, &mut cqes, |c| {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done += 1;
        });
        drain_cq(sim.dev(1), ep[1].cq, &mut cqes, |c| {
            assert_eq!(
                (c.status, c.byte_len as usize),
                (WcStatus::Success, op_len),
                "{c:?}"
            );
        });
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
        drain_cq(sim.dev(0), ep[0].cq, &mut cqes, |c| {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done += 1;
        });
        drain_cq(sim.dev(1), ep[1].cq, &mut cqes, |_| {});
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

/// 64 B RC SENDs between two devices of `shards` shards each, one QP pair per shard and a
/// thread per pair, each thread driving its two shards as `run_engine` drives two devices.
/// What the pairs share: each device's PD, MR and object tables (a QP's CQ is its own).
/// Returns the messages of all threads and the longest thread's time.
fn run_shards(shards: u32, until: Until) -> (u64, f64) {
    const LEN: usize = 64;
    const MEM: usize = 1 << 20;
    let (ga, gb) = (Gid::from_ipv4([10, 0, 0, 1]), Gid::from_ipv4([10, 0, 0, 2]));
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut a = Device::new_sharded(cfg.clone(), shards);
    let mut b = Device::new_sharded(cfg, shards);
    a[0].add_gid(0, ga).unwrap();
    b[0].add_gid(0, gb).unwrap();
    let (pa, pb) = (a[0].alloc_pd().unwrap(), b[0].alloc_pd().unwrap());
    let full = Backing::Contiguous { base: 0 };
    let ka = a[0]
        .reg_mr(pa, 0, MEM as u64, Access::LOCAL_WRITE, full.clone())
        .unwrap();
    let kb = b[0]
        .reg_mr(pb, 0, MEM as u64, Access::LOCAL_WRITE, full)
        .unwrap();
    let opts = ConnOpts {
        mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut pairs = Vec::new();
    for (mut da, mut db) in a.into_iter().zip(b) {
        let cqs = [da.create_cq(4096).unwrap(), db.create_cq(4096).unwrap()];
        let mk = |d: &mut Device, pd, cq| {
            d.create_qp(QpInit {
                qp_type: QpType::Rc,
                pd,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                xrcd: None,
                cap: opts.cap,
                sq_sig_all: false,
            })
            .unwrap()
        };
        let qpns = [mk(&mut da, pa, cqs[0]), mk(&mut db, pb, cqs[1])];
        bring_up_pair([&mut da, &mut db], qpns, [ga, gb], &opts);
        pairs.push((da, db, qpns, cqs));
    }
    let start = std::sync::Barrier::new(shards as usize);
    let runs: Vec<(u64, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = pairs
            .into_iter()
            .map(|(mut da, mut db, qpns, cqs)| {
                let start = &start;
                s.spawn(move || {
                    let mut ma = VecMemory::new(0, MEM);
                    let mut mb = VecMemory::new(0, MEM);
                    let sge: SgList = vec![Sge {
                        addr: 0,
                        length: LEN as u32,
                        lkey: ka,
                    }]
                    .into();
                    let rsge: SgList = vec![Sge {
                        addr: 0,
                        length: LEN as u32,
                        lkey: kb,
                    }]
                    .into();
                    let mut buf = vec![0u8; 8192];
                    let mut cqes = Vec::with_capacity(64);
                    let (mut posted, mut done) = (0u64, 0u64);
                    let max = match until {
                        Until::Messages(n) => n,
                        Until::Elapsed(_) => u64::MAX,
                    };
                    let now = rxe_core::Instant(1);
                    start.wait();
                    let t0 = Wall::now();
                    loop {
                        while posted - done < 128 && posted < max {
                            let wr = RecvWr {
                                wr_id: posted,
                                sg_list: rsge.clone(),
                            };
                            db.post_recv(qpns[1], wr).unwrap();
                            let wr = SendWr::new(posted, SendOp::Send, sge.clone());
                            da.post_send(qpns[0], wr).unwrap();
                            posted += 1;
                        }
                        let mut moved = false;
                        for dir in 0..2 {
                            let (src, dst, ms, md) = if dir == 0 {
                                (&mut da, &mut db, &mut ma, &mut mb)
                            } else {
                                (&mut db, &mut da, &mut mb, &mut ma)
                            };
                            while let Some(t) = src.poll_transmit(now, ms, &mut buf) {
                                let meta = RecvMeta::from(&t);
                                if let Err(e) = dst.handle_packet(now, &meta, &buf[..t.len], md) {
                                    panic!("a packet of a lossless run was dropped: {e:?}");
                                }
                                moved = true;
                            }
                        }
                        drain_cq(&mut da, cqs[0], &mut cqes, |c| {
                            assert_eq!(c.status, WcStatus::Success, "{c:?}");
                            done += 1;
                        });
                        drain_cq(&mut db, cqs[1], &mut cqes, |c| {
                            assert_eq!(c.status, WcStatus::Success, "{c:?}");
                        });
                        assert!(moved || posted == done, "stalled");
                        match until {
                            Until::Messages(n) if done >= n => break,
                            Until::Elapsed(d) if t0.elapsed() >= d => break,
                            _ => {}
                        }
                    }
                    (done, t0.elapsed().as_secs_f64())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let msgs = runs.iter().map(|r| r.0).sum();
    let secs = runs.iter().map(|r| r.1).fold(0.0, f64::max);
    (msgs, secs)
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
            Some(o @ ("send" | "write" | "shards" | "icrc")) => Some(o.to_string()),
            other => {
                eprintln!("engine bench: --only wants send, write, shards or icrc, not {other:?}");
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
    let shards = only.as_deref().is_none_or(|o| o == "shards");
    let icrc = only.as_deref().is_none_or(|o| o == "icrc");
    if smoke {
        if icrc {
            print_icrc(Until::Messages(200));
        }
        if shards {
            let (msgs, _) = run_shards(2, Until::Messages(300));
            println!("64 B RC SEND in 2 shards on 2 threads: {msgs} messages (smoke test)");
        }
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
    if shards {
        print_shards(d);
    }
    if icrc {
        print_icrc(Until::Elapsed(d));
    }
}

/// The icrc table (module documentation): per-packet cost of each receive-side check.
fn print_icrc(until: Until) {
    use rxe_core::icrc;
    let mut rng = rxe_core::sim::Rng::new(0x1c4c);
    // 80 lengths (more than the solver's 64 cached ones) around 580 B, and 8 of them.
    let lens: Vec<usize> = (0..80).map(|i| 400 + 4 * i).collect();
    let packets: Vec<([u8; 28], Vec<u8>)> = lens
        .iter()
        .map(|&len| {
            let mut h = [0u8; 28];
            for b in h.iter_mut() {
                *b = rng.next_u64() as u8;
            }
            h[0] = 0x45;
            h[4..6].copy_from_slice(&(rng.next_u64() as u16 | 0x100).to_be_bytes());
            let mut r: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            r[0] = 0x04;
            icrc::fill(&h, &mut r).unwrap();
            (h, r)
        })
        .collect();
    let run = |f: &mut dyn FnMut(usize) -> bool| -> (u64, f64) {
        let t = Wall::now();
        let mut n = 0u64;
        loop {
            for i in 0..64 {
                assert!(f(n as usize + i), "a right ICRC was refused");
            }
            n += 64;
            match until {
                Until::Messages(m) if n >= m => break,
                Until::Elapsed(d) if t.elapsed() >= d => break,
                _ => {}
            }
        }
        (n, t.elapsed().as_secs_f64())
    };
    let (mut s8, mut s80, mut sw) = (
        icrc::Ipv4IdSolver::new(),
        icrc::Ipv4IdSolver::new(),
        icrc::Ipv4IdSolver::new(),
    );
    let mut windows = icrc::Ipv4IdWindows::new();
    let rows: [(&str, &mut dyn FnMut(usize) -> bool); 4] = [
        ("plain CRC check (ID known)", &mut |i| {
            let (h, r) = &packets[i % 8];
            black_box(icrc::verify(h, r)).is_ok()
        }),
        ("ID solve, 8 lengths (cached)", &mut |i| {
            let (h, r) = &packets[i % 8];
            black_box(s8.verify(h, r)).is_ok()
        }),
        ("ID solve, 80 lengths in turn", &mut |i| {
            let (h, r) = &packets[i % 80];
            black_box(s80.verify(h, r)).is_ok()
        }),
        ("ID solve + window, 80 lengths", &mut |i| {
            let (h, r) = &packets[i % 80];
            let id = sw.verify(h, r).unwrap();
            // Every packet its own source, its ID the one after a head (steady traffic).
            windows.admit(i as u32 % 80, id.wrapping_sub(1), 0, false);
            black_box(windows.admit(i as u32 % 80, id, 0, false)) != icrc::IdVerdict::Learned
        }),
    ];
    println!();
    println!("receive-side ICRC check per IPv4 packet (400-716 B)");
    println!(
        "{:<30} | {:>12} | {:>10}",
        "check", "packets/s", "ns/packet"
    );
    for (name, f) in rows {
        let (n, secs) = run(f);
        if let Until::Messages(_) = until {
            println!("{name}: {n} packets accepted (smoke test; `cargo bench` measures)");
            continue;
        }
        println!(
            "{name:<30} | {:>12.0} | {:>10.1}",
            n as f64 / secs,
            secs * 1e9 / n as f64
        );
    }
}

/// The shards table: 64 B SENDs with the devices in 1, 2 and (where the machine has more
/// cores) as many shards as cores, a thread per shard; one shard is the baseline.
fn print_shards(d: Duration) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let mut counts = vec![1, 2];
    if cores > 2 {
        counts.push(cores.min(8));
    }
    println!();
    println!("64 B RC SEND, both devices in N shards, a QP pair and a thread per shard ({cores} cores here)");
    println!("{:>6} | {:>12} | {:>10}", "shards", "msgs/s", "x 1 shard");
    let mut one = 0.0;
    for n in counts {
        let (msgs, secs) = run_shards(n, Until::Elapsed(d));
        let rate = msgs as f64 / secs;
        if n == 1 {
            one = rate;
        }
        println!("{n:>6} | {rate:>12.0} | {:>9.2}x", rate / one);
    }
}
