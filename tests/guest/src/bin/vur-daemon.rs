//! The vhost-user-rdma daemon under the test crate's own name, so integration tests can
//! spawn it through `CARGO_BIN_EXE_vur-daemon` (cargo only exposes binaries of the package
//! under test). Same code path as the `vhost-user-rdma` binary.

use clap::Parser;
use vhost_user_rdma::config::{configs, Args};

/// Counts the live heap, as the `vhost-user-rdma` binary does.
#[global_allocator]
static ALLOCATOR: vhost_user_rdma::heap::Counting = vhost_user_rdma::heap::Counting;

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    if std::env::args_os().nth(1).is_some_and(|a| a == "link") {
        let args =
            std::iter::once("vhost-user-rdma link".into()).chain(std::env::args_os().skip(2));
        return vhost_user_rdma::net::netlink::main_with_args(args);
    }
    let configs = match configs(Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vur-daemon: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = vhost_user_rdma::start_backends(configs) {
        eprintln!("vur-daemon: {e}");
        std::process::exit(1);
    }
    std::process::ExitCode::SUCCESS
}
