//! Benchmarks, side by side with the kernel's own loopback paths:
//! 64 B RC SEND ping-pong half-RTT vs a UDP-socket ping-pong; 64 KiB RC WRITE throughput vs a
//! TCP loopback stream; 64 B RC SEND message rate.
//!
//! Run: `cargo run --release -p vur-testguest --bin vur-bench`.

use vur_testguest::{find_daemon, loopback_pair, perf, Node};

fn main() {
    let Some(bin) = find_daemon() else {
        eprintln!("vur-bench: daemon binary not found (build vur-daemon or set VUR_DAEMON)");
        std::process::exit(2);
    };
    let (aa, ba) = loopback_pair(4791);
    let mut a = Node::start(&bin, aa, &["--mtu", "9000"]).expect("node a");
    let mut b = Node::start(&bin, ba, &["--mtu", "9000"]).expect("node b");
    let rc = perf::rc_pingpong(&mut a, &mut b, 64, 5000).expect("rc ping-pong");
    let udp = perf::udp_pingpong(64, 5000).expect("udp ping-pong");
    let wr = perf::rc_write_bw(&mut a, &mut b, 64 << 10, 1 << 30, 16).expect("rc write");
    let tcp = perf::tcp_stream(64 << 10, 4 << 30).expect("tcp stream");
    let rate = perf::rc_msg_rate(&mut a, &mut b, 64, 200_000, 256).expect("msg rate");
    println!("{:<34} {:>14} {:>14}", "", "vhost-user-rdma", "kernel");
    println!(
        "{:<34} {:>11.1} us {:>11.1} us",
        "64 B ping-pong, half RTT",
        rc.as_secs_f64() * 1e6,
        udp.as_secs_f64() * 1e6
    );
    println!(
        "{:<34} {:>9.2} Gbit/s {:>9.2} Gbit/s",
        "64 KiB RC WRITE vs TCP stream",
        wr * 8.0 / 1e9,
        tcp * 8.0 / 1e9
    );
    println!("{:<34} {:>10.0} msg/s", "64 B RC SEND message rate", rate);
}
