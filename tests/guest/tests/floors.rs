//! The test guest's modules import one way down this table, with no circle, no file over 1500
//! lines and no production function over 150 (`vur_testkit::house`).

use std::path::Path;

/// Module-path prefix → floor; a module imports only from its own floor or lower ones.
const FLOORS: &[(&str, u32)] = &[
    ("", 6),
    // The binaries (vur-bench, vur-pingpong, ...): users of the library.
    ("bin", 6),
    // Measurements and scale runs over connected nodes.
    ("perf", 5),
    ("scale", 5),
    // A daemon with its guest and connected QPs; cloud-hypervisor's frontend over a Guest.
    ("node", 4),
    ("cloud_hypervisor", 4),
    // The guest driver and librxe (Guest).
    ("driver", 3),
    // The rings in the rxe user ABI and the work queue entries in them; virtio-net's guest.
    ("rings", 2),
    ("wqe", 2),
    ("net", 2),
    // The VMM's side: guest RAM and split virtqueues; daemon processes, apart from the guest.
    ("ram", 1),
    ("virtq", 1),
    ("daemon", 1),
    // The error type; network namespaces for the tests that need one.
    ("error", 0),
    ("netns", 0),
];

#[test]
fn the_test_guest_keeps_its_floors() {
    vur_testkit::house::check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), FLOORS);
}
