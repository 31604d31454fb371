//! `rxe-peer`: the host side of interop tests. Runs our RoCEv2 engine on a UDP socket and
//! speaks the out-of-band exchange of rdma-core's pingpong examples.
//!
//! ```text
//! rxe-peer --local-ip 10.77.0.1 rc [--server 10.77.0.2] [-s 4096] [-n 1000] [-m 1024]
//! ```
//! With `--server` we are the client of a tool listening there; without, we listen (port 18515)
//! and the tool connects to us. `--tool-done FILE`: the harness writes the tool's exit code
//! there when the tool has exited; we stay on the wire until then. `--stall SECS` (default 10):
//! fail, saying what we wait for, when nothing arrives and nothing completes for that long. Prints the tool's style of result line and exits non-zero on any
//! error, completion error, data mismatch or timeout.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use rxe_core::verbs::Mtu;
use rxe_core::DeviceConfig;
use vur_interop::peer::Peer;
use vur_interop::pingpong::{self, Kind, Opts};

fn usage() -> ExitCode {
    eprintln!(
        "usage: rxe-peer --local-ip IP {{rc|uc|ud}} [--server IP] [-p PORT] [-s SIZE] [-n ITERS] [-m MTU] [-r RX_DEPTH] [--timeout SECS] [--stall SECS] [--tool-done FILE]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut local: Option<IpAddr> = None;
    let mut kind = None;
    let mut server: Option<IpAddr> = None;
    let mut self_test = false;
    let mut tool_done: Option<std::path::PathBuf> = None;
    let mut stall = 10.0f64;
    let (mut port, mut size, mut iters, mut mtu, mut rx_depth, mut timeout) =
        (18515u16, 4096usize, 1000u32, 1024u32, 500u32, 120u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        let parsed = match a.as_str() {
            "--local-ip" => val().parse().map(|v| local = Some(v)).is_ok(),
            "--server" => val().parse().map(|v| server = Some(v)).is_ok(),
            "-p" | "--port" => val().parse().map(|v| port = v).is_ok(),
            "-s" | "--size" => val().parse().map(|v| size = v).is_ok(),
            "-n" | "--iters" => val().parse().map(|v| iters = v).is_ok(),
            "-m" | "--mtu" => val().parse().map(|v| mtu = v).is_ok(),
            "-r" | "--rx-depth" => val().parse().map(|v| rx_depth = v).is_ok(),
            "--timeout" => val().parse().map(|v| timeout = v).is_ok(),
            "--stall" => val()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .map(|v| stall = v)
                .is_some(),
            "--tool-done" => {
                let v = val();
                tool_done = Some(v.clone().into());
                !v.is_empty()
            }
            "--peer-is-rxe-peer" => {
                self_test = true;
                true
            }
            "rc" => kind.replace(Kind::Rc).is_none(),
            "uc" => kind.replace(Kind::Uc).is_none(),
            "ud" => kind.replace(Kind::Ud).is_none(),
            _ => false,
        };
        if !parsed {
            eprintln!("rxe-peer: bad argument {a:?}");
            return usage();
        }
    }
    let (Some(local), Some(kind)) = (local, kind) else {
        return usage();
    };
    let Some(mtu) = [256, 512, 1024, 2048, 4096]
        .iter()
        .position(|&m| m == mtu)
        .and_then(|i| Mtu::from_enum(i as u8 + 1))
    else {
        eprintln!("rxe-peer: MTU must be 256, 512, 1024, 2048 or 4096");
        return ExitCode::from(2);
    };
    if size == 0 || size > 1 << 24 || rx_depth == 0 || rx_depth > 16384 || iters == 0 {
        eprintln!("rxe-peer: size must be 1..16 MiB, rx depth 1..16384, iters > 0");
        return ExitCode::from(2);
    }
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut peer = match Peer::new(local, cfg, 2 * size + 2 * 4096 + 80) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rxe-peer: cannot bind {local}:4791: {e}");
            return ExitCode::FAILURE;
        }
    };
    let o = Opts {
        kind,
        server: server.map(|s| SocketAddr::new(s, port)),
        listen: SocketAddr::new(local, port),
        size,
        iters,
        mtu,
        rx_depth,
        timeout: Duration::from_secs(timeout),
        peer_is_tool: !self_test,
        tool_done,
        stall: Duration::from_secs_f64(stall),
    };
    match pingpong::run(&mut peer, &o) {
        Ok(r) => {
            println!(
                "  local address:  LID 0x0000, QPN {:#08x}, GID {:?}\n  remote address: LID {:#06x}, QPN {:#08x}, PSN {:#08x}, GID {:?}",
                peer.dev.qpns().next().map_or(0, |q| q.0),
                rxe_core::Gid::from_ip(local),
                r.remote.lid,
                r.remote.qpn,
                r.remote.psn,
                r.remote.gid
            );
            println!(
                "{} bytes in {:.2} seconds = {:.2} Mbit/sec",
                r.bytes,
                r.secs,
                r.bytes as f64 * 8.0 / r.secs / 1e6
            );
            println!(
                "{} iters in {:.2} seconds = {:.2} usec/iter",
                r.iters,
                r.secs,
                r.secs * 1e6 / r.iters as f64
            );
            println!(
                "verified {} received buffers byte for byte; {} packets sent, {} received",
                r.verified, peer.sent, peer.received
            );
            let c = r.counters;
            let u = peer.udp.stats();
            println!(
                "counters: retransmits={} timeouts={} naks_sent={} naks_received={} rnr_naks_sent={} rnr_naks_received={} duplicates={} dropped={} rx_icrc_ok={} rx_icrc_bad={}",
                c.retransmits, c.timeouts, c.naks_sent, c.naks_received, c.rnr_naks_sent, c.rnr_naks_received, c.duplicates, c.dropped, u.rx_icrc_ok, u.rx_icrc_bad
            );
            match r.end {
                pingpong::End::Complete => println!("end: complete"),
                pingpong::End::LastSendAfterToolLeft => println!(
                    "end: last SEND retry-exceeded after the tool exited 0 (its ACK was lost; documented in docs/interop.md)"
                ),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rxe-peer: {e}");
            ExitCode::FAILURE
        }
    }
}
