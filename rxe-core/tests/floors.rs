//! The engine's floors (ARCHITECTURE.md): imports run one way down this table, no import
//! circle, no file over 1500 lines, no production function over 150 (`vur_testkit::house`).

use std::path::Path;

/// Module-path prefix → floor; a module imports only from its own floor or lower ones.
const FLOORS: &[(&str, u32)] = &[
    ("", 10),
    // A two-node simulator and a pcap writer over the engine, for tests and tools.
    ("sim", 10),
    ("pcap", 10),
    // The driving surface: verbs, handle_packet, poll_transmit, timers.
    ("device", 9),
    // The state machines, as Linux rxe names them.
    ("req", 8),
    ("resp", 8),
    ("comp", 8),
    // What they all end in: completions, and the QP timers.
    ("complete", 7),
    ("timers", 7),
    // XRC's checks and the TGT QP's binding to the SRQ a request names.
    ("xrc", 7),
    ("qp", 6),
    // What the state machines share: configuration, object tables, packet-I/O types.
    ("shared", 5),
    ("mem", 4),
    // Frames (headers below RoCE) use the ICRC.
    ("wire::frame", 3),
    ("icrc", 2),
    ("verbs", 2),
    ("wire", 1),
    ("types", 1),
    ("brlock", 1),
    ("slab", 1),
];

#[test]
fn the_engine_keeps_its_floors() {
    vur_testkit::house::check(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), FLOORS);
}
