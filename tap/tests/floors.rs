//! The tap's modules import one way down this table, with no circle, no file over 1500 lines
//! and no production function over 150 (`vur_testkit::house`; ARCHITECTURE.md).

use std::path::Path;

/// Module-path prefix → floor; a module imports only from its own floor or lower ones.
const FLOORS: &[(&str, u32)] = &[
    ("", 4),
    // The `tap` command: attach, read the ring, write pcap.
    ("cli", 3),
    // The capture format and the RoCE header decoding.
    ("pcap", 2),
    ("roce", 2),
    // The eBPF program's records, as the kernel side writes them.
    ("bpf", 1),
];

#[test]
fn the_tap_keeps_its_floors() {
    vur_testkit::house::check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), FLOORS);
}
