//! Demo: two vhost-user-rdma daemons on loopback UDP, two test guests; an RC ping-pong and an
//! RC WRITE bandwidth run, results printed.
//!
//! Run: `cargo run --release -p vur-testguest --bin vur-demo` (builds the daemon alongside).

use std::time::Instant;

use vur_testguest::{find_daemon, loopback_pair, perf, Node};

fn main() {
    let Some(bin) = find_daemon() else {
        eprintln!("vur-demo: daemon binary not found (build vur-daemon or set VUR_DAEMON)");
        std::process::exit(2);
    };
    let (aa, ba) = loopback_pair(4791);
    println!("daemon: {}", bin.display());
    println!("starting two daemons: {aa} and {ba}");
    let t = Instant::now();
    let mut a = Node::start(&bin, aa, &["--mtu", "9000"]).expect("node a");
    let mut b = Node::start(&bin, ba, &["--mtu", "9000"]).expect("node b");
    println!(
        "both guests attached in {:?}; device: max_qp {} max_cqe {} active MTU {}",
        t.elapsed(),
        a.guest.config.max_qp,
        a.guest.config.max_cqe,
        128u32 << a.guest.config.active_mtu
    );
    let rtt = perf::rc_pingpong(&mut a, &mut b, 64, 2000).expect("ping-pong");
    println!(
        "RC SEND ping-pong, 64 B, 2000 iterations: half round trip {:.1} us",
        rtt.as_secs_f64() * 1e6
    );
    let bw = perf::rc_write_bw(&mut a, &mut b, 64 << 10, 256 << 20, 16).expect("write bw");
    println!(
        "RC WRITE, 64 KiB messages, 256 MiB: {:.2} Gbit/s",
        bw * 8.0 / 1e9
    );
    println!(
        "daemon a counters: {}",
        a.daemon.counters().unwrap_or_default().trim()
    );
}
