//! `vhost-user-rdma`: parse the command line, validate it, serve. `vhost-user-rdma tap ...`
//! runs the eBPF RoCEv2 tap instead (vur-tap, docs/tap.md), `vhost-user-rdma link ...` makes
//! the host side of a guest's NIC (netkit or veth pair, `netlink`).

use std::process::ExitCode;

use clap::Parser;
use vhost_user_rdma::config::{configs, Args};

/// Counts the live heap for the counters socket (`"heap"`, see `vhost_user_rdma::heap`).
#[global_allocator]
static ALLOCATOR: vhost_user_rdma::heap::Counting = vhost_user_rdma::heap::Counting;

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if std::env::args_os().nth(1).is_some_and(|a| a == "tap") {
        let args = std::iter::once("vhost-user-rdma tap".into()).chain(std::env::args_os().skip(2));
        return vur_tap::cli::main_with_args(args);
    }
    if std::env::args_os().nth(1).is_some_and(|a| a == "link") {
        let args =
            std::iter::once("vhost-user-rdma link".into()).chain(std::env::args_os().skip(2));
        return vhost_user_rdma::net::netlink::main_with_args(args);
    }
    let configs = match configs(Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vhost-user-rdma: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = vhost_user_rdma::start_backends(configs) {
        eprintln!("vhost-user-rdma: {e}");
        std::process::exit(1);
    }
    ExitCode::SUCCESS
}
