//! `vhost-user-rdma`: parse the command line, validate it, serve.

use clap::Parser;
use vhost_user_rdma::config::{Args, Config};

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let config = match Config::try_from(Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vhost-user-rdma: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = vhost_user_rdma::start_backend(config) {
        eprintln!("vhost-user-rdma: {e}");
        std::process::exit(1);
    }
}
