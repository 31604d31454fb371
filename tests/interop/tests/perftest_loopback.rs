//! Two instances of our perftest side talk to each other over real UDP sockets on loopback
//! addresses, after perftest's out-of-band exchange over TCP — the path the VM interop test
//! uses with the stock tools on Linux rxe at the other end. Every check runs: READ contents,
//! send_lat buffers, the write target, every value an atomic returns and the final slots.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use rxe_core::verbs::Mtu;
use rxe_core::DeviceConfig;
use vur_interop::peer::Peer;
use vur_interop::perftest::{self, run, AtomicKind, Opts, PeerKind, Report, Test};

const TX_DEPTH: u32 = 32;

fn pair(test: Test, a: u8, size: usize, iters: u32, mtus: (Mtu, Mtu)) -> (Report, Report) {
    let server_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 78, a));
    let client_ip = IpAddr::V4(Ipv4Addr::new(127, 0, 78, a + 1));
    let port = 18700 + a as u16;
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let base = Opts {
        test,
        server: None,
        listen: SocketAddr::new(server_ip, port),
        size,
        iters,
        mtu: mtus.0,
        tx_depth: TX_DEPTH,
        timeout: Duration::from_secs(60),
        peer: PeerKind::Ours,
    };
    let so = base.clone();
    let scfg = cfg.clone();
    let server = std::thread::spawn(move || {
        let mut p =
            Peer::new(server_ip, scfg, perftest::mem_needed(size, TX_DEPTH)).expect("bind server");
        run(&mut p, &so)
    });
    let mut p =
        Peer::new(client_ip, cfg, perftest::mem_needed(size, TX_DEPTH)).expect("bind client");
    let co = Opts {
        server: Some(SocketAddr::new(server_ip, port)),
        mtu: mtus.1,
        ..base
    };
    // Both ends' errors: the one that saw the fault first is usually the other's cause.
    let (c, s) = match (run(&mut p, &co), server.join().unwrap()) {
        (Ok(c), Ok(s)) => (c, s),
        (c, s) => panic!("client: {:?}\nserver: {:?}", c.err(), s.err()),
    };
    let mtu = mtus.0.min(mtus.1);
    assert_eq!((c.mtu, s.mtu), (mtu, mtu));
    assert_eq!(c.peer_version, perftest::VERSION);
    if test.is_bw() {
        assert_eq!(c.completions, iters as u64);
        let pr = s.peer_report.expect("client report");
        assert_eq!((pr.size, pr.iters), (size as u64, iters as u64));
    }
    (c, s)
}

#[test]
fn send_lat_over_loopback() {
    let (c, s) = pair(Test::SendLat, 10, 64, 100, (Mtu::M1024, Mtu::M4096));
    assert_eq!((c.verified, s.verified), (100, 100));
    assert_eq!((c.completions, s.completions), (200, 200));
}

#[test]
fn send_lat_multi_packet() {
    let (c, s) = pair(Test::SendLat, 20, 3000, 50, (Mtu::M1024, Mtu::M1024));
    assert_eq!((c.verified, s.verified), (50, 50));
}

#[test]
fn write_bw_large_over_loopback() {
    let (c, s) = pair(Test::WriteBw, 30, 65536, 100, (Mtu::M4096, Mtu::M4096));
    assert_eq!(c.bytes, 100 * 65536);
    assert_eq!(s.verified, 1);
}

#[test]
fn write_bw_cycling_small() {
    // 500-byte writes step by 512 through the 4 KiB cycle buffer: 8 regions, and the gaps
    // between them must stay scrubbed.
    let (_, s) = pair(Test::WriteBw, 40, 500, 100, (Mtu::M1024, Mtu::M256));
    assert_eq!(s.verified, 8);
}

#[test]
fn read_bw_over_loopback() {
    let (c, _) = pair(Test::ReadBw, 50, 16384, 100, (Mtu::M1024, Mtu::M1024));
    assert_eq!(c.verified, 100);
}

#[test]
fn read_bw_cycling_small() {
    let (c, _) = pair(Test::ReadBw, 60, 100, 100, (Mtu::M4096, Mtu::M4096));
    assert_eq!(c.verified, 100);
}

#[test]
fn atomic_fetch_add_over_loopback() {
    let (c, s) = pair(
        Test::AtomicBw(AtomicKind::FetchAdd),
        70,
        8,
        200,
        (Mtu::M1024, Mtu::M1024),
    );
    assert_eq!(c.verified, 200);
    assert_eq!(s.verified, 64);
}

#[test]
fn atomic_cmp_swap_over_loopback() {
    let (c, s) = pair(
        Test::AtomicBw(AtomicKind::CmpSwap),
        80,
        8,
        300,
        (Mtu::M1024, Mtu::M1024),
    );
    assert_eq!(c.verified, 300);
    assert_eq!(s.verified, 64);
}
