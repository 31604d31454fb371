//! `vhost-user-rdma`: parse the command line, validate it, serve. `vhost-user-rdma tap ...`
//! runs the eBPF RoCEv2 tap instead (vur-tap, docs/tap.md), `vhost-user-rdma link ...` makes
//! the host side of a guest's NIC (netkit or veth pair, `netlink`). The whole of it is
//! [`vhost_user_rdma::cli::main`].

use std::process::ExitCode;

/// Counts the live heap for the counters socket (`"heap"`, see `vhost_user_rdma::heap`).
#[global_allocator]
static ALLOCATOR: vhost_user_rdma::heap::Counting = vhost_user_rdma::heap::Counting;

fn main() -> ExitCode {
    vhost_user_rdma::cli::main(vhost_user_rdma::cli::Binary {
        name: "vhost-user-rdma",
        tap: true,
    })
}
