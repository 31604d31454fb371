//! The daemon's rooms and floors (ARCHITECTURE.md): imports run one way down this table, no
//! import circle, no file over 1500 lines, no production function over 150
//! (`vur_testkit::house`).

use std::path::Path;

/// Module-path prefix → floor; a module imports only from its own floor or lower ones.
const FLOORS: &[(&str, u32)] = &[
    // The top: the command line, serving frontends, the vhost-user impl, the query socket.
    ("", 8),
    ("cli", 8),
    ("config", 8),
    ("counters", 8),
    ("metrics", 8),
    ("vhu_rdma", 8),
    ("worker", 7),
    ("net", 6),
    ("device", 5),
    ("transport", 4),
    ("memory", 3),
    // The floor: the device's structures and system helpers every room may use.
    ("abi", 1),
    ("clock", 1),
    ("heap", 1),
    ("ratelog", 1),
    ("sync", 1),
    ("seccomp", 1),
    ("sys", 1),
    ("unix_socket", 1),
];

#[test]
fn the_daemon_keeps_its_floors() {
    vur_testkit::house::check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), FLOORS);
}
