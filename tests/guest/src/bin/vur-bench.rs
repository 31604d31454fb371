//! Benchmarks, side by side with the kernel's own loopback paths, in one run:
//! 64 B RC SEND ping-pong half-RTT vs a UDP-socket ping-pong; 64 KiB RC WRITE throughput vs a
//! TCP loopback stream; 64 B RC SEND message rate vs a UDP-socket stream of 64 B datagrams.
//!
//! Run: `cargo build --release -p vur-testguest && target/release/vur-bench`.
//! `--compare PATH` adds a column for a second daemon binary (e.g. an older build), measured
//! in the same run; `--only pingpong|write|rate` runs one row; `--wait spin|event` chooses how
//! the test guest waits for completions (busy polling, or CQ events like `ibv_rc_pingpong -e`).

use std::path::PathBuf;

use clap::Parser;
use vur_testguest::perf::{self, WaitMode};
use vur_testguest::{find_daemon, loopback_pair, Node};

#[derive(Parser, Debug)]
#[command(about = "vhost-user-rdma benchmarks, side by side with kernel UDP/TCP loopback")]
struct Args {
    /// Daemon binary (default: $VUR_DAEMON, or next to this executable).
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// A second daemon binary measured in the same run (an extra column).
    #[arg(long)]
    compare: Option<PathBuf>,
    /// Run one row only.
    #[arg(long, value_parser = ["pingpong", "write", "rate"])]
    only: Option<String>,
    /// How the guest waits for completions.
    #[arg(long, default_value = "spin", value_parser = ["spin", "event"])]
    wait: String,
    /// Ping-pong iterations.
    #[arg(long, default_value_t = 5000)]
    iters: u32,
    /// Bytes written in the WRITE test.
    #[arg(long, default_value_t = 1 << 30)]
    write_bytes: u64,
    /// Pin the daemons to this CPU and the guest (this process) to the others, as a VMM would
    /// keep vCPU threads and the vhost-user backend apart. Default: no pinning.
    #[arg(long)]
    daemon_cpu: Option<usize>,
    /// Messages sent in the message-rate test.
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
}

#[derive(Default, Clone, Copy)]
struct Row {
    half_rtt_us: f64,
    write_gbit: f64,
    msg_rate: f64,
}

fn run_daemon(bin: &std::path::Path, a: &Args, wait: WaitMode) -> Row {
    let (aa, ba) = loopback_pair(4791);
    let cpus = a.daemon_cpu.map(|c| [c]);
    let cpus = cpus.as_ref().map(|c| &c[..]);
    let mut x = Node::start_on(bin, aa, &["--mtu", "9000"], cpus).expect("node a");
    let mut y = Node::start_on(bin, ba, &["--mtu", "9000"], cpus).expect("node b");
    let want = |w: &str| a.only.as_deref().is_none_or(|o| o == w);
    let mut r = Row::default();
    if want("pingpong") {
        let d = perf::rc_pingpong_wait(&mut x, &mut y, 64, a.iters, wait).expect("ping-pong");
        r.half_rtt_us = d.as_secs_f64() * 1e6;
    }
    if want("write") {
        let bw = perf::rc_write_bw(&mut x, &mut y, 64 << 10, a.write_bytes, 16).expect("write");
        r.write_gbit = bw * 8.0 / 1e9;
    }
    if want("rate") {
        r.msg_rate = perf::rc_msg_rate(&mut x, &mut y, 64, a.messages, 256).expect("msg rate");
    }
    r
}

fn main() {
    let a = Args::parse();
    let Some(bin) = a.daemon.clone().or_else(find_daemon) else {
        eprintln!("vur-bench: daemon binary not found (build vur-daemon or set VUR_DAEMON)");
        std::process::exit(2);
    };
    let wait = if a.wait == "event" {
        WaitMode::Event
    } else {
        WaitMode::Spin
    };
    let want = |w: &str| a.only.as_deref().is_none_or(|o| o == w);
    if let Some(c) = a.daemon_cpu {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        let others: Vec<usize> = (0..n).filter(|&x| x != c).collect();
        if !others.is_empty() {
            vur_testguest::pin_current_thread(&others).expect("sched_setaffinity");
        }
    }
    let ours = run_daemon(&bin, &a, wait);
    let other = a.compare.as_ref().map(|c| run_daemon(c, &a, wait));
    let mut k = Row::default();
    if want("pingpong") {
        k.half_rtt_us = perf::udp_pingpong(64, a.iters).expect("udp").as_secs_f64() * 1e6;
    }
    if want("write") {
        k.write_gbit = perf::tcp_stream(64 << 10, 4 << 30).expect("tcp") * 8.0 / 1e9;
    }
    if want("rate") {
        k.msg_rate = perf::udp_stream_rate(64, 1_000_000).expect("udp stream");
    }

    let cmp_hdr = if other.is_some() { "compare" } else { "" };
    println!(
        "{:<34} {:>16} {:>16} {:>8} {:>16}",
        "", "vhost-user-rdma", "kernel", "ratio", cmp_hdr
    );
    let line = |name: &str, v: f64, kv: f64, o: Option<f64>, unit: &str, prec: usize| {
        let ratio = if kv > 0.0 { v / kv } else { 0.0 };
        let o = o.map_or(String::new(), |o| format!("{o:>9.prec$} {unit:<6}"));
        println!("{name:<34} {v:>9.prec$} {unit:<6} {kv:>9.prec$} {unit:<6} {ratio:>7.2}x {o}");
    };
    if want("pingpong") {
        line(
            "64 B RC SEND half RTT (UDP pp)",
            ours.half_rtt_us,
            k.half_rtt_us,
            other.map(|o| o.half_rtt_us),
            "us",
            1,
        );
    }
    if want("write") {
        line(
            "64 KiB RC WRITE (TCP stream)",
            ours.write_gbit,
            k.write_gbit,
            other.map(|o| o.write_gbit),
            "Gbit/s",
            2,
        );
    }
    if want("rate") {
        line(
            "64 B RC SEND rate (UDP stream)",
            ours.msg_rate / 1e3,
            k.msg_rate / 1e3,
            other.map(|o| o.msg_rate / 1e3),
            "k/s",
            0,
        );
    }
    println!("wait mode: {}; daemon: {}", a.wait, bin.display());
    if let Some(c) = &a.compare {
        println!("compare: {}", c.display());
    }
}
