//! The vhost-user-rdma daemon under the test crate's own name, so integration tests can
//! spawn it through `CARGO_BIN_EXE_vur-daemon` (cargo only exposes binaries of the package
//! under test). Same code path as the `vhost-user-rdma` binary: [`vhost_user_rdma::cli::main`],
//! without the tap.

/// Counts the live heap, as the `vhost-user-rdma` binary does.
#[global_allocator]
static ALLOCATOR: vhost_user_rdma::heap::Counting = vhost_user_rdma::heap::Counting;

fn main() -> std::process::ExitCode {
    vhost_user_rdma::cli::main(vhost_user_rdma::cli::Binary {
        name: "vur-daemon",
        tap: false,
    })
}
