//! Two `rxe-peer` engines talk RC, UC and UD over real UDP sockets on loopback addresses,
//! after the pingpong out-of-band exchange over TCP — the same path the VM interop tests use
//! with Linux rxe on the other end.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rxe_core::verbs::Mtu;
use rxe_core::DeviceConfig;
use vur_interop::peer::Peer;
use vur_interop::pingpong::{run, Kind, Opts};

fn pair(kind: Kind, a: u8, size: usize, mtu: Mtu) {
    let server_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, a));
    let client_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 77, a + 1));
    let port = 18600 + a as u16;
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let base = Opts {
        kind,
        server: None,
        listen: SocketAddr::new(server_ip, port),
        size,
        iters: 200,
        mtu,
        rx_depth: 64,
        timeout: Duration::from_secs(60),
        peer_is_tool: false,
        tool_done: None,
        stall: Duration::from_secs(20),
    };
    let so = base.clone();
    let scfg = cfg.clone();
    let server = std::thread::spawn(move || {
        let mut p = Peer::new(server_ip, scfg, 4 * size + 16384).expect("bind server");
        run(&mut p, &so)
    });
    let mut p = Peer::new(client_ip, cfg, 4 * size + 16384).expect("bind client");
    let co = Opts {
        server: Some(SocketAddr::new(server_ip, port)),
        ..base
    };
    // Both ends' errors: the one that saw the fault first is usually the other's cause.
    let (c, s) = match (run(&mut p, &co), server.join().unwrap()) {
        (Ok(c), Ok(s)) => (c, s),
        (c, s) => panic!("client: {:?}\nserver: {:?}", c.err(), s.err()),
    };
    assert_eq!((c.verified, s.verified), (200, 200));
}

#[test]
fn rc_pingpong_over_loopback() {
    pair(Kind::Rc, 10, 4096, Mtu::M1024);
}

#[test]
fn rc_pingpong_small_and_4k_mtu() {
    pair(Kind::Rc, 20, 100, Mtu::M4096);
}

#[test]
fn uc_pingpong_over_loopback() {
    pair(Kind::Uc, 30, 3000, Mtu::M1024);
}

#[test]
fn ud_pingpong_over_loopback() {
    pair(Kind::Ud, 40, 1024, Mtu::M1024);
}
