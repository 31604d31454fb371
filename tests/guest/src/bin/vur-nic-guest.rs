//! A guest's virtio-net for tests outside the test harness (inside a VM, by hand): connects to
//! a daemon's `--net-socket` as a VMM and a driver would, answers ARP and ping for `--ip` with
//! `--mac`, and ends when it has answered `--pings` echo requests (exit 0) or after
//! `--seconds` (exit 1), saying what it saw.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use vur_testguest::net::{guest_stack, NetGuest, Seen};

#[derive(Parser)]
#[command(about = "A virtio-net guest that answers ARP and ping")]
struct Args {
    /// The daemon's virtio-net socket.
    #[arg(long)]
    net_socket: PathBuf,
    /// The guest's IPv4 address.
    #[arg(long)]
    ip: Ipv4Addr,
    /// The guest's MAC (the daemon's --mac).
    #[arg(long)]
    mac: String,
    /// Echo requests to answer before ending.
    #[arg(long, default_value_t = 3)]
    pings: u32,
    /// Longest it runs.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let Some(mac) = vhost_user_rdma::config::parse_mac(&a.mac) else {
        eprintln!("vur-nic-guest: --mac {}: not a unicast MAC", a.mac);
        return ExitCode::from(2);
    };
    let g = match NetGuest::connect(&a.net_socket, 0, 64, 2048) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("vur-nic-guest: {}: {e}", a.net_socket.display());
            return ExitCode::from(1);
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let (s, n, ip) = (stop.clone(), seen.clone(), a.ip.octets());
    let t = std::thread::spawn(move || guest_stack(g, ip, mac, s, n));
    let end = Instant::now() + Duration::from_secs(a.seconds);
    while Instant::now() < end && seen.lock().unwrap_or_else(|e| e.into_inner()).pings < a.pings {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = t.join();
    let s = seen.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "vur-nic-guest: {} ARP requests and {} pings answered, {} RoCE frames seen",
        s.arp_requests, s.pings, s.roce
    );
    if s.pings >= a.pings {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
