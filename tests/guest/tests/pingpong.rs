//! `vur-pingpong` (ibv_rc_pingpong's other end on a daemon) against itself: two udp daemons on
//! loopback, one `vur-pingpong` listening, one connecting, 4 KiB messages in 1 KiB packets,
//! every buffer checked. The same binary runs against the stock tool on Linux rxe over netkit
//! in `tests/vm/nic-netkit.test.sh`.

mod common;

use std::process::{Command, Stdio};

use common::bin;
use vur_testguest::{loopback_pair, Daemon};

#[test]
fn two_pingpongs_on_two_daemons() {
    let (aa, ba) = loopback_pair(4791);
    let da = Daemon::spawn(bin(), aa, &[]).expect("daemon a");
    let db = Daemon::spawn(bin(), ba, &[]).expect("daemon b");
    let pp = env!("CARGO_BIN_EXE_vur-pingpong");
    // A port of this process's own: tests run side by side.
    let port = (20000 + std::process::id() % 20000).to_string();
    let common = [
        "-p",
        &port,
        "-s",
        "4096",
        "-n",
        "200",
        "--timeout",
        "30",
        "--peer-is-ours",
    ];
    let server = Command::new(pp)
        .arg("--socket")
        .arg(&da.socket)
        .args(["--ip", &aa.ip().to_string()])
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let client = Command::new(pp)
        .arg("--socket")
        .arg(&db.socket)
        .args(["--ip", &ba.ip().to_string(), "--server", "127.0.0.1"])
        .args(common)
        .output()
        .expect("client");
    let server = server.wait_with_output().expect("server output");
    for (who, o) in [("server", &server), ("client", &client)] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{who}: {}\n{out}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(out.contains("200 iters in"), "{who}: {out}");
        assert!(out.contains("verified 200 buffers"), "{who}: {out}");
    }
}
