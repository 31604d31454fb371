//! UDP GSO in the udp transport, end to end: two daemons on IPv6 and then on IPv4 addresses
//! of a network namespace this test creates (on its loopback), test guests on them, RC SEND
//! (3 packets), WRITE and READ of 64 KiB (64 packets each way at path MTU 1024), data
//! checked. The multi-packet messages must leave as GSO sends, arrive as coalesced runs (UDP
//! GRO) and be cut back into datagrams with every ICRC right (`--udp-gso`; over IPv4 with
//! `--strict-icrc`, so each segment's ICRC holds for the IP ID it was computed for); without
//! the flag no GSO send is made and no run is taken.
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::net::SocketAddr;

use common::{bin, run, send_write_read};
use vur_testguest::*;

mod common;

fn node(ip: &str, extra: &[&str]) -> Node {
    let addr = SocketAddr::new(ip.parse().unwrap(), 4791);
    Node::start(bin(), addr, extra).expect("node")
}

fn counter(n: &Node, key: &str) -> u64 {
    let c = n.daemon.counters().expect("counters");
    json_u64(&c, "transport", key).unwrap_or_else(|| panic!("no {key} in {c}"))
}

/// Adds `ips` to the namespace's loopback (this thread's namespace: one the test made).
fn on_lo(ips: &[&str]) {
    for ip in ips {
        let plen = if ip.contains(':') { "128" } else { "32" };
        netns::ip(&["addr", "add", &format!("{ip}/{plen}"), "dev", "lo"]).expect("address");
    }
}

#[test]
fn runs_of_packets_leave_as_gso_sends() {
    run("runs_of_packets_leave_as_gso_sends", || {
        on_lo(&["fd79:6::1", "fd79:6::2", "10.79.6.1", "10.79.6.2"]);
        // IPv4 with --strict-icrc: every datagram's ICRC must hold for ID 0 or, in a run,
        // for its index in it (the ID the kernel writes): nothing is solved for.
        for (x, y, extra) in [
            ("fd79:6::1", "fd79:6::2", &["--udp-gso"][..]),
            (
                "10.79.6.1",
                "10.79.6.2",
                &["--udp-gso", "--strict-icrc"][..],
            ),
        ] {
            let mut a = node(x, extra);
            let mut b = node(y, extra);
            send_write_read(&mut a, &mut b);
            for (n, name) in [(&a, "a"), (&b, "b")] {
                let c = n.daemon.counters().unwrap();
                // a: the SEND and the WRITE; b: the READ responses. Most of each message's
                // 64 packets go in runs: a run is what one flush holds for one peer (up to
                // the transport's 32-packet batch), so how the engine's passes cut a message
                // moves a few packets out of runs, never most of them.
                assert!(counter(n, "tx_gso_sends") >= 2, "{x}, daemon {name}: {c}");
                assert!(
                    counter(n, "tx_gso_segments") >= 48,
                    "{x}, daemon {name}: {c}"
                );
                assert_eq!(counter(n, "tx_gso_refused"), 0, "{x}, daemon {name}: {c}");
                // b takes the SEND and the WRITE, a the READ responses, as coalesced runs
                // (UDP GRO) cut back into the datagrams they were.
                assert!(
                    counter(n, "rx_gro_segments") >= 48,
                    "{x}, daemon {name}: {c}"
                );
                assert_eq!(counter(n, "rx_icrc_bad"), 0, "{x}, daemon {name}: {c}");
                assert_eq!(
                    counter(n, "rx_icrc_id_solved"),
                    0,
                    "{x}, daemon {name}: {c}"
                );
                assert!(counter(n, "rx_icrc_ok") >= 64, "{x}, daemon {name}: {c}");
            }
        }
    });
}

#[test]
fn no_gso_without_the_flag() {
    run("no_gso_without_the_flag", || {
        on_lo(&["fd79:7::1", "fd79:7::2", "10.79.7.1", "10.79.7.2"]);
        for (x, y) in [("fd79:7::1", "fd79:7::2"), ("10.79.7.1", "10.79.7.2")] {
            let mut a = node(x, &[]);
            let mut b = node(y, &[]);
            send_write_read(&mut a, &mut b);
            for n in [&a, &b] {
                assert_eq!(counter(n, "tx_gso_sends"), 0, "{x}");
                assert_eq!(counter(n, "rx_gro_runs"), 0, "{x}");
                assert!(counter(n, "tx_packets") >= 64, "{x}");
                assert_eq!(counter(n, "rx_icrc_bad"), 0, "{x}");
            }
        }
    });
}
