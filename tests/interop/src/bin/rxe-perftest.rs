//! `rxe-perftest`: our RoCEv2 engine on a UDP socket as the other end of the stock perftest
//! tools (`ib_send_lat`, `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`), with perftest's
//! out-of-band TCP exchange.
//!
//! ```text
//! rxe-perftest --local-ip 10.77.0.1 write_bw [--server 10.77.0.2 | --listen 10.77.0.1]
//!              [-p 18515] [-s SIZE] [-n 100] [-m 4096] [-t 128] [-A FETCH_AND_ADD]
//! rxe-perftest --payload-file     # what to give the tool as --payload_file_path
//! ```
//! With `--server` we are the client of a tool listening there; without, we listen (on
//! `--listen`, default the local IP) and the tool connects to us. `--local-ip` is the RoCE
//! address (our GID); the TCP exchange may use another family (perftest's TCP is IPv4 unless
//! told otherwise). Exits non-zero on any error, completion error, data mismatch or timeout.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use rxe_core::verbs::Mtu;
use rxe_core::DeviceConfig;
use vur_interop::peer::Peer;
use vur_interop::perftest::{self, AtomicKind, Opts, PeerKind, Test};

fn usage() -> ExitCode {
    eprintln!(
        "usage: rxe-perftest --local-ip IP {{send_lat|write_bw|read_bw|atomic_bw}} [--server IP | --listen IP] \
         [-p PORT] [-s SIZE] [-n ITERS] [-m MTU] [-t TX_DEPTH] [-A CMP_AND_SWAP|FETCH_AND_ADD] \
         [--timeout SECS] [--peer-is-rxe-perftest]\n       rxe-perftest --payload-file"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut local: Option<IpAddr> = None;
    let mut listen: Option<IpAddr> = None;
    let mut server: Option<IpAddr> = None;
    let mut test: Option<Test> = None;
    let mut atomic = AtomicKind::FetchAdd;
    let mut peer = PeerKind::Tool;
    let mut size: Option<usize> = None;
    let (mut port, mut iters, mut mtu, mut tx_depth, mut timeout) =
        (perftest::DEF_PORT, 1000u32, 4096u32, 128u32, 120u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        let parsed = match a.as_str() {
            "--payload-file" => {
                print!("{}", perftest::payload_file());
                return ExitCode::SUCCESS;
            }
            "--local-ip" => val().parse().map(|v| local = Some(v)).is_ok(),
            "--listen" => val().parse().map(|v| listen = Some(v)).is_ok(),
            "--server" => val().parse().map(|v| server = Some(v)).is_ok(),
            "-p" | "--port" => val().parse().map(|v| port = v).is_ok(),
            "-s" | "--size" => val().parse().map(|v| size = Some(v)).is_ok(),
            "-n" | "--iters" => val().parse().map(|v| iters = v).is_ok(),
            "-m" | "--mtu" => val().parse().map(|v| mtu = v).is_ok(),
            "-t" | "--tx-depth" => val().parse().map(|v| tx_depth = v).is_ok(),
            "--timeout" => val().parse().map(|v| timeout = v).is_ok(),
            "-A" | "--atomic_type" => match val().as_str() {
                "CMP_AND_SWAP" => {
                    atomic = AtomicKind::CmpSwap;
                    true
                }
                "FETCH_AND_ADD" => {
                    atomic = AtomicKind::FetchAdd;
                    true
                }
                _ => false,
            },
            "--peer-is-rxe-perftest" => {
                peer = PeerKind::Ours;
                true
            }
            "send_lat" => test.replace(Test::SendLat).is_none(),
            "write_bw" => test.replace(Test::WriteBw).is_none(),
            "read_bw" => test.replace(Test::ReadBw).is_none(),
            "atomic_bw" => test.replace(Test::AtomicBw(AtomicKind::FetchAdd)).is_none(),
            _ => false,
        };
        if !parsed {
            eprintln!("rxe-perftest: bad argument {a:?}");
            return usage();
        }
    }
    let (Some(local), Some(mut test)) = (local, test) else {
        return usage();
    };
    if let Test::AtomicBw(_) = test {
        test = Test::AtomicBw(atomic);
    }
    let Some(mtu) = [256, 512, 1024, 2048, 4096]
        .iter()
        .position(|&m| m == mtu)
        .and_then(|i| Mtu::from_enum(i as u8 + 1))
    else {
        eprintln!("rxe-perftest: MTU must be 256, 512, 1024, 2048 or 4096");
        return ExitCode::from(2);
    };
    let size = size.unwrap_or(test.default_size());
    if size == 0 || size > 1 << 24 || iters == 0 || tx_depth == 0 || tx_depth > 8192 {
        eprintln!("rxe-perftest: size must be 1..16 MiB, iters > 0, tx depth 1..8192");
        return ExitCode::from(2);
    }
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut p = match Peer::new(local, cfg, perftest::mem_needed(size, tx_depth)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rxe-perftest: cannot bind {local}:4791: {e}");
            return ExitCode::FAILURE;
        }
    };
    let o = Opts {
        test,
        server: server.map(|s| SocketAddr::new(s, port)),
        listen: SocketAddr::new(listen.unwrap_or(local), port),
        size,
        iters,
        mtu,
        tx_depth,
        timeout: Duration::from_secs(timeout),
        peer,
    };
    match perftest::run(&mut p, &o) {
        Ok(r) => {
            let k = |k: &perftest::Keys| {
                format!(
                    "QPN {:#08x} PSN {:#08x} OUT {:#04x} RKey {:#010x} VAddr {:#018x} GID {:?}",
                    k.qpn, k.psn, k.out_reads, k.rkey, k.vaddr, k.gid
                )
            };
            println!(" local address:  {}", k(&r.local));
            println!(" remote address: {}", k(&r.remote));
            println!(
                " {} ({}) as {}, peer version {}, MTU {}",
                test.tool(),
                test.name(),
                if r.client { "client" } else { "server" },
                r.peer_version,
                r.mtu.bytes()
            );
            if let (Some(ours), Some(theirs)) = (r.our_report, r.peer_report) {
                println!(
                    " reports: ours size={} iters={} avg={:.2} MiB/s; peer's size={} iters={} avg={:.2} MiB/s",
                    ours.size, ours.iters, ours.bw_avg, theirs.size, theirs.iters, theirs.bw_avg
                );
            }
            println!(
                "RESULT test={} role={} size={} iters={} completions={} verified={} bytes={} secs={:.3}",
                test.name(),
                if r.client { "client" } else { "server" },
                r.size,
                r.iters,
                r.completions,
                r.verified,
                r.bytes,
                r.secs
            );
            println!("packets: sent={} received={}", p.sent, p.received);
            let c = r.counters;
            let u = p.udp.stats();
            println!(
                "counters: retransmits={} timeouts={} naks_sent={} naks_received={} rnr_naks_sent={} rnr_naks_received={} duplicates={} dropped={} rx_icrc_ok={} rx_icrc_bad={}",
                c.retransmits, c.timeouts, c.naks_sent, c.naks_received, c.rnr_naks_sent, c.rnr_naks_received, c.duplicates, c.dropped, u.rx_icrc_ok, u.rx_icrc_bad
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rxe-perftest: {e}");
            ExitCode::FAILURE
        }
    }
}
