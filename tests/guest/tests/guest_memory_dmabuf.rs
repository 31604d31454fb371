//! `--guest-memory dmabuf`: the daemon maps each region of the guest's memory through a host
//! dma-buf (udmabuf over the VMM's memfd) and reads and writes every payload, completion and
//! ring through it; `--devmem-rx` probes devmem receive on an interface and refuses with what
//! it found.
//!
//! This host's kernel may have no udmabuf (this project's CI host has none): the first test
//! runs everywhere and checks what the daemon says either way. The others need /dev/udmabuf
//! and are `#[ignore]`d here; `tests/vm/guest-memory-dmabuf.test.sh` runs them
//! (`--include-ignored`) in the trixie guest, whose kernel has udmabuf.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{bin, run, send_write_read};
use vur_testguest::*;

const DMABUF: [&str; 2] = ["--guest-memory", "dmabuf"];

fn udmabuf() -> bool {
    Path::new("/dev/udmabuf").exists()
}

/// The daemon's exit code and stderr for `args` (it must end by itself within 20 s).
fn daemon_exit(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempdir();
    let sock = format!("{dir}/r.sock");
    let mut cmd = Command::new(bin());
    cmd.args(["--socket-path", &sock, "--udp-addr", "127.0.0.1:47911"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("spawn the daemon");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            let _ = std::fs::remove_dir_all(&dir);
            return (st.code(), err);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the daemon did not end within 20 s with {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tempdir() -> String {
    let d = std::env::temp_dir().join(format!(
        "vur-dmabuf-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d.to_string_lossy()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "/-_.".contains(*c))
        .collect()
}

/// Without /dev/udmabuf the daemon does not start, and says how to get it; with it, the
/// daemon serves (the other tests below).
#[test]
fn without_udmabuf_the_daemon_refuses_at_start_and_says_why() {
    if udmabuf() {
        // This host has one: starting must work (a frontend would then be served through
        // dma-bufs); the daemon is stopped right after it says so.
        let d = Daemon::spawn_logged(bin(), "127.0.0.1:47912".parse().unwrap(), &DMABUF)
            .expect("the daemon starts with /dev/udmabuf");
        let end = Instant::now() + Duration::from_secs(10);
        while !d.log().contains("guest memory through dma-bufs") {
            assert!(Instant::now() < end, "no start line: {}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        return;
    }
    let (code, err) = daemon_exit(&DMABUF);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("/dev/udmabuf"), "{err}");
    assert!(err.contains("modprobe udmabuf"), "{err}");
    // --devmem-rx without dma-bufs is a usage error, whatever the host has.
    let (code, err) = daemon_exit(&["--devmem-rx", "lo"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("needs --guest-memory dmabuf"), "{err}");
    println!(
        "note: no /dev/udmabuf on this host: the data path through dma-bufs runs in the guest \
         (tests/vm/guest-memory-dmabuf.test.sh)"
    );
}

/// The daemon's mappings of dma-bufs (udmabuf's mmap is a dma-buf file: "/dmabuf:" in maps),
/// in bytes.
fn dmabuf_mapped(pid: u32) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    maps.lines()
        .filter(|l| l.contains("dmabuf"))
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some(u64::from_str_radix(b, 16).ok()? - u64::from_str_radix(a, 16).ok()?)
        })
        .sum()
}

/// Two daemons with `--guest-memory dmabuf`: SEND, WRITE and READ of 64 KiB, every byte
/// checked, through mappings of dma-bufs as large as the guests' RAM.
#[test]
#[ignore = "needs /dev/udmabuf: tests/vm/guest-memory-dmabuf.test.sh runs it in the guest"]
fn every_byte_crosses_through_dmabuf_mappings() {
    run("every_byte_crosses_through_dmabuf_mappings", || {
        let (aa, ba) = loopback_pair(4791);
        let mut a = Node::start(bin(), aa, &DMABUF).expect("node a");
        let mut b = Node::start(bin(), ba, &DMABUF).expect("node b");
        send_write_read(&mut a, &mut b);
        let ram = GuestOpts::default().mem_size;
        for n in [&a, &b] {
            let got = dmabuf_mapped(n.daemon.pid());
            println!(
                "daemon {}: {} MiB of dma-buf mapped",
                n.daemon.pid(),
                got >> 20
            );
            assert!(
                got >= ram,
                "the daemon maps {got} bytes of dma-bufs, not the guest's {ram}"
            );
        }
    });
}

/// A memfd that is not sealed against shrinking (a VMM that does not seal its memory) and a
/// region above udmabuf's size limit: the memory table is refused with the reason, the
/// daemon keeps serving, and a guest whose memory qualifies is served next.
#[test]
#[ignore = "needs /dev/udmabuf: tests/vm/guest-memory-dmabuf.test.sh runs it in the guest"]
fn memory_udmabuf_cannot_take_is_refused_with_the_reason() {
    run(
        "memory_udmabuf_cannot_take_is_refused_with_the_reason",
        || {
            let d = Daemon::spawn_logged(bin(), "127.0.0.1:4791".parse().unwrap(), &DMABUF)
                .expect("daemon");
            let unsealed = GuestOpts {
                sealed_ram: false,
                ..GuestOpts::default()
            };
            let e = Guest::connect(&d.socket, unsealed)
                .err()
                .expect("an unsealed memfd is refused");
            println!("unsealed: {e}");
            wait_log(&d, "not sealed against shrinking");
            // Above the size limit (the module's parameter, lowered for the test and restored).
            let param = "/sys/module/udmabuf/parameters/size_limit_mb";
            let was = std::fs::read_to_string(param).expect("size_limit_mb");
            std::fs::write(param, "16").expect("lower size_limit_mb");
            let r = Guest::connect(&d.socket, GuestOpts::default());
            std::fs::write(param, was.trim()).expect("restore size_limit_mb");
            let e = r.err().expect("a region above size_limit_mb is refused");
            println!("too large: {e}");
            wait_log(&d, "above udmabuf's size_limit_mb");
            // The daemon is still there, and serves memory it can take.
            let mut g = Guest::connect(&d.socket, GuestOpts::default()).expect("a sealed memfd");
            g.alloc_pd().expect("the device answers");
            assert!(dmabuf_mapped(d.pid()) >= GuestOpts::default().mem_size);
        },
    );
}

fn wait_log(d: &Daemon, what: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    while !d.log().contains(what) {
        assert!(
            Instant::now() < end,
            "the daemon's log never said {what:?}: {}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--devmem-rx` on a veth (no queue-management API, no parent device) and on an interface
/// that does not exist: the daemon does not start, and its refusal lists what the probe
/// checked and found, ending with why a bound queue would still not carry RoCEv2.
#[test]
#[ignore = "needs /dev/udmabuf: tests/vm/guest-memory-dmabuf.test.sh runs it in the guest"]
fn devmem_receive_is_probed_and_refused_with_what_was_found() {
    run(
        "devmem_receive_is_probed_and_refused_with_what_was_found",
        || {
            vur_testguest::netns::ip(&[
                "link", "add", "vdm0", "type", "veth", "peer", "name", "vdm1",
            ])
            .unwrap();
            vur_testguest::netns::ip(&["link", "set", "vdm0", "up"]).unwrap();
            let (code, err) = daemon_exit(&["--guest-memory", "dmabuf", "--devmem-rx", "vdm0"]);
            println!("veth: {err}");
            assert_eq!(code, Some(1), "{err}");
            for want in [
                "devmem receive on vdm0 is unavailable",
                "\"netdev\"",
                "bind-rx",
                "RX queue",
                "TCP sockets only",
            ] {
                assert!(err.contains(want), "no {want:?} in: {err}");
            }
            let (code, err) = daemon_exit(&["--guest-memory", "dmabuf", "--devmem-rx", "nosuch0"]);
            println!("missing: {err}");
            assert_eq!(code, Some(1), "{err}");
            assert!(
                err.contains("devmem receive on nosuch0 is unavailable"),
                "{err}"
            );
        },
    );
}
