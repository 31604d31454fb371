//! The port's state follows the link under the transport, as a NIC's does: QUERY_PORT says
//! ACTIVE (LinkUp) or DOWN (Disabled), and the guest gets PORT_ERR when the link goes down
//! and PORT_ACTIVE when it comes back (what `ibv_asyncwatch` shows, and the kernel's
//! `ports/1/state`). Inside a network namespace each test creates: a veth pair, the daemon
//! on one end (its udp transport on an address of that end, or its raw transport on it),
//! the link taken down from either end (its own, or the peer's, which takes its carrier).
//!
//! Skipped (one line saying why) when not root or without iproute2.

use std::net::SocketAddr;
use std::time::Duration;

use common::{bin, run};
use vur_testguest::netns;
use vur_testguest::*;

mod common;

const MAC_A: [u8; 6] = [0x02, 0x7a, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0x7a, 0, 0, 0, 0x0b];
const WAIT: Duration = Duration::from_secs(30);

fn port(g: &mut Guest) -> (u32, u32) {
    let p = g.query_port().expect("QUERY_PORT");
    (p.state, p.phys_state.into())
}

fn active(d: &Daemon) -> Option<u64> {
    json_u64(&d.counters().expect("counters"), "port", "active")
}

/// With the daemon up on `vpa`: the port is ACTIVE; `ip link set DOWN down` makes it DOWN
/// with a PORT_ERR event; up again, ACTIVE with PORT_ACTIVE.
fn port_follows_link(d: &Daemon, down: &str) {
    let mut g = Guest::connect(&d.socket, GuestOpts::default()).expect("guest");
    assert_eq!(port(&mut g), (4, 5), "ACTIVE, LinkUp at first");
    assert_eq!(active(d), Some(1));
    for (cmd, event, want, name) in [
        ("down", abi::event::PORT_ERR, (1, 3), "PORT_ERR"),
        ("up", abi::event::PORT_ACTIVE, (4, 5), "PORT_ACTIVE"),
    ] {
        netns::ip(&["link", "set", down, cmd]).unwrap();
        let e = g.wait_event(WAIT, |e| {
            e.kind == abi::event::KIND_ASYNC
                && (e.event == abi::event::PORT_ERR || e.event == abi::event::PORT_ACTIVE)
        });
        let e = e.unwrap_or_else(|| panic!("`ip link set {down} {cmd}`: no {name} in {WAIT:?}"));
        assert_eq!((e.event, e.object), (event, 1), "{name} for port 1");
        assert_eq!(port(&mut g), want, "QUERY_PORT after `{down} {cmd}`");
        assert_eq!(active(d), Some(u64::from(want.0 == 4)));
    }
    // Nothing more: one event per change.
    std::thread::sleep(Duration::from_millis(100));
    let more: Vec<_> = g
        .poll_events()
        .into_iter()
        .filter(|e| e.kind == abi::event::KIND_ASYNC)
        .collect();
    assert!(more.is_empty(), "events after the link settled: {more:?}");
}

fn veth_with_address() {
    netns::veth_pair("vpa", MAC_A, "vpb", MAC_B).expect("veth pair");
    netns::ip(&["addr", "add", "10.81.0.1/24", "dev", "vpa"]).unwrap();
}

#[test]
fn the_udp_transports_port_follows_its_interface() {
    run("the_udp_transports_port_follows_its_interface", || {
        veth_with_address();
        let addr: SocketAddr = "10.81.0.1:4791".parse().unwrap();
        let d = Daemon::spawn(bin(), addr, &[]).expect("daemon");
        port_follows_link(&d, "vpa");
        // The peer's end down: no carrier here, the port is DOWN too.
        port_follows_link(&d, "vpb");
    });
}

#[test]
fn the_raw_transports_port_follows_its_interface() {
    run("the_raw_transports_port_follows_its_interface", || {
        veth_with_address();
        let addr: SocketAddr = "10.81.0.1:4791".parse().unwrap();
        let args = ["--iface", "vpa", "--raw-addr", "10.81.0.1"];
        let d = Daemon::spawn(bin(), addr, &args).expect("daemon");
        port_follows_link(&d, "vpb");
    });
}

/// An address of 127/8 that no interface lists (lo holds 127.0.0.1/8) stands on lo.
#[test]
fn a_loopback_address_follows_lo() {
    run("a_loopback_address_follows_lo", || {
        let (addr, _) = loopback_pair(4791);
        let d = Daemon::spawn(bin(), addr, &[]).expect("daemon");
        port_follows_link(&d, "lo");
    });
}
