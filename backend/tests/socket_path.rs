//! A socket path belongs to one daemon at a time (backend/src/unix_socket.rs): a second
//! daemon on a live daemon's path is refused and touches nothing; a shutdown never goes
//! through the path (no phantom frontend); the socket and its lock go with their daemon; a
//! stale socket is replaced; a path another program listens on is left alone.
//!
//! These run the real daemon binary on loopback addresses (127.x.y.z of this test).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Upper bound for a daemon to start or to stop: it catches a hang, not a slow machine.
const HANG: Duration = Duration::from_secs(20);

fn dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "vur-sockpath-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A loopback address of this test run, distinct per call.
fn addr() -> String {
    static N: AtomicU32 = AtomicU32::new(1);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id();
    format!("127.{}.{}.{}:4791", 200 + (pid % 50), (pid >> 8) & 0xff, n)
}

/// A daemon whose log lines arrive on a channel.
struct Daemon {
    child: Child,
    lines: mpsc::Receiver<String>,
    log: Vec<String>,
}

impl Daemon {
    fn spawn(socket: &Path, counters: Option<&Path>) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"));
        cmd.arg("--socket-path").arg(socket);
        Self::spawn_cmd(cmd, counters)
    }

    fn spawn_cmd(mut cmd: Command, counters: Option<&Path>) -> Daemon {
        cmd.arg("--udp-addr")
            .arg(addr())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(c) = counters {
            cmd.arg("--counters-socket").arg(c);
        }
        let mut child = cmd.spawn().expect("starting the daemon");
        let err = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Daemon {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// Reads the log until a line contains `what`; panics naming it after [`HANG`] or when the
    /// daemon's log ends first.
    fn wait_for(&mut self, what: &str) {
        let end = Instant::now() + HANG;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.contains(what);
                    self.log.push(l);
                    if hit {
                        return;
                    }
                }
                Err(e) => panic!(
                    "waited for a log line with {what:?} ({e:?}); the log:\n{}",
                    self.log.join("\n")
                ),
            }
        }
    }

    /// Waits for the process to end by itself.
    fn wait_exit(&mut self) -> ExitStatus {
        let end = Instant::now() + HANG;
        while Instant::now() < end {
            if let Some(s) = self.child.try_wait().unwrap() {
                self.log.extend(self.lines.iter());
                return s;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("the daemon did not exit within {HANG:?}");
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child, which try_wait has not reaped.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    fn terminate(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait_exit()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn lock_of(socket: &Path) -> PathBuf {
    let mut s = socket.as_os_str().to_os_string();
    s.push(".lock");
    s.into()
}

fn inode(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn a_second_daemon_on_a_live_path_is_refused_and_the_first_stops_cleanly() {
    let d = dir();
    let sock = d.join("rdma.sock");
    let counters = d.join("counters.sock");
    let mut first = Daemon::spawn(&sock, Some(&counters));
    first.wait_for("waiting for a frontend");
    let (sock_ino, counters_ino) = (inode(&sock), inode(&counters));
    let holder = std::fs::read_to_string(lock_of(&sock)).unwrap();
    assert_eq!(
        holder.trim(),
        first.child.id().to_string(),
        "the lock names its holder"
    );

    // The same vhost-user path, and (another run) the same counters path: refused, nothing
    // of the first's touched.
    for (s, c) in [
        (&sock, None),
        (&d.join("other.sock"), Some(counters.as_path())),
    ] {
        let mut second = Daemon::spawn(s, c);
        let st = second.wait_exit();
        let log = second.log.join("\n");
        assert!(!st.success(), "a second daemon must fail; its log:\n{log}");
        assert!(
            log.contains("is served by another daemon")
                && log.contains(&format!("pid {}", first.child.id())),
            "the refusal must say who holds the path; the log:\n{log}"
        );
        assert!(
            !log.contains("waiting for a frontend"),
            "it must not serve; the log:\n{log}"
        );
    }
    assert_eq!(inode(&sock), sock_ino, "the first's socket was replaced");
    assert_eq!(
        inode(&counters),
        counters_ino,
        "the first's counters socket was replaced"
    );

    // One SIGTERM stops the first: no phantom frontend, its files gone.
    let st = first.terminate();
    let log = first.log.join("\n");
    assert!(st.success(), "exit {st:?}; the log:\n{log}");
    assert!(
        !log.contains("frontend connected") && !log.contains("frontend disconnected"),
        "a shutdown went through the socket's path (a phantom frontend); the log:\n{log}"
    );
    for p in [&sock, &lock_of(&sock), &counters, &lock_of(&counters)] {
        assert!(!p.exists(), "{} outlived its daemon", p.display());
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_stale_socket_is_replaced_and_another_programs_is_left_alone() {
    let d = dir();
    // Stale: bound, then closed; nobody listens, nobody holds the lock.
    let stale = d.join("stale.sock");
    drop(UnixListener::bind(&stale).unwrap());
    let mut a = Daemon::spawn(&stale, None);
    a.wait_for("waiting for a frontend");
    assert!(a.terminate().success());
    assert!(!stale.exists());

    // Another program listens there (no lock): refused, its socket stays.
    let live = d.join("live.sock");
    let other = UnixListener::bind(&live).unwrap();
    let ino = inode(&live);
    let mut b = Daemon::spawn(&live, None);
    let st = b.wait_exit();
    let log = b.log.join("\n");
    assert!(!st.success(), "the log:\n{log}");
    assert!(
        log.contains("another program listens on"),
        "the refusal must say why; the log:\n{log}"
    );
    assert_eq!(inode(&live), ino, "another program's socket was replaced");
    assert!(
        !lock_of(&live).exists(),
        "the refused daemon left its lock file"
    );
    drop(other);
    std::fs::remove_dir_all(&d).unwrap();
}

/// One vhost-user request and its reply, as a frontend sends it: VHOST_USER_GET_FEATURES.
fn get_features(path: &Path) -> u64 {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(HANG)).unwrap();
    // request 1 (GET_FEATURES), flags: version 1, size 0.
    let mut req = [0u8; 12];
    req[..4].copy_from_slice(&1u32.to_le_bytes());
    req[4..8].copy_from_slice(&1u32.to_le_bytes());
    s.write_all(&req).unwrap();
    let mut rep = [0u8; 20];
    s.read_exact(&mut rep).expect("a reply to GET_FEATURES");
    assert_eq!(
        u32::from_le_bytes(rep[..4].try_into().unwrap()),
        1,
        "{rep:?}"
    );
    assert_ne!(
        u32::from_le_bytes(rep[4..8].try_into().unwrap()) & 4,
        0,
        "the reply flag"
    );
    assert_eq!(
        u32::from_le_bytes(rep[8..12].try_into().unwrap()),
        8,
        "{rep:?}"
    );
    u64::from_le_bytes(rep[12..20].try_into().unwrap())
}

#[test]
fn a_listening_socket_handed_over_with_fd_is_served_and_its_path_left_alone() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let d = dir();
    let path = d.join("handed.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"));
    cmd.arg("--fd").arg("3");
    // SAFETY: between fork and exec the closure only calls dup2, as systemd's socket
    // activation hands over its first socket as fd 3.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself keeps close-on-exec: clear it then.
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut a = Daemon::spawn_cmd(cmd, None);
    a.wait_for("waiting for a frontend on fd 3");
    drop(listener);
    // VIRTIO_F_VERSION_1 (bit 32) and VHOST_USER_F_PROTOCOL_FEATURES (bit 30).
    let features = get_features(&path);
    assert_eq!(
        features & (1 << 32 | 1 << 30),
        1 << 32 | 1 << 30,
        "{features:#x}"
    );
    a.wait_for("frontend connected");
    assert!(a.terminate().success(), "{}", a.log.join("\n"));
    assert!(
        path.exists(),
        "a path the daemon did not create is not its to remove"
    );
    assert!(!lock_of(&path).exists());

    // Anything but a listening unix socket is refused, saying so.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"));
    cmd.arg("--fd").arg("0").stdin(Stdio::null());
    let mut b = Daemon::spawn_cmd(cmd, None);
    let st = b.wait_exit();
    let log = b.log.join("\n");
    assert!(!st.success(), "{log}");
    assert!(log.contains("--fd 0: not a socket"), "{log}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn capabilities_are_printed_as_qemu_asks() {
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"))
        .arg("--print-capabilities")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("{\"type\":\"rdma\",\"features\":["),
        "{text}"
    );
    assert!(text.contains("\"fd\""), "{text}");
    // The description file QEMU's discovery reads names the same type.
    let desc =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/qemu/50-vhost-user-rdma.json");
    let desc = std::fs::read_to_string(&desc).unwrap();
    assert!(desc.contains("\"type\": \"rdma\""), "{desc}");
    assert!(
        desc.contains("\"binary\": \"/usr/libexec/vhost-user-rdma\""),
        "{desc}"
    );
}

#[test]
fn the_counters_socket_has_a_group_of_its_own() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    let d = dir();
    let (sock, counters) = (d.join("rdma.sock"), d.join("counters.sock"));
    for (args, want) in [
        (&["--socket-group", "0"][..], (0o660, 0o600)),
        (&["--counters-group", "0"][..], (0o600, 0o660)),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"));
        cmd.arg("--socket-path").arg(&sock).args(args);
        let mut a = Daemon::spawn_cmd(cmd, Some(&counters));
        a.wait_for("waiting for a frontend");
        assert_eq!((mode(&sock), mode(&counters)), want, "with {args:?}");
        assert!(a.terminate().success());
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn start_up_errors_say_what_to_do() {
    let d = dir();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let missing = d.join("no-such-dir/rdma.sock");
    let e = run(&[
        "--socket-path",
        missing.to_str().unwrap(),
        "--udp-addr",
        &addr(),
    ]);
    assert!(e.contains("does not exist: create it first"), "{e}");
    // An address no interface holds (TEST-NET-1: bound, never sent to).
    let sock = d.join("rdma.sock");
    let e = run(&[
        "--socket-path",
        sock.to_str().unwrap(),
        "--udp-addr",
        "192.0.2.1:4791",
    ]);
    assert!(e.contains("no interface of this host"), "{e}");
    assert!(!sock.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Every capability of every thread, and NoNewPrivs, from /proc/PID/task/*/status.
fn privileges(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().path();
        let Ok(status) = std::fs::read_to_string(t.join("status")) else {
            continue; // the thread ended meanwhile
        };
        let name = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        for l in status.lines() {
            let held = match l.split_once(':') {
                Some((k, v)) if k.starts_with("Cap") => u64::from_str_radix(v.trim(), 16) != Ok(0),
                Some(("NoNewPrivs", v)) => v.trim() != "1",
                // Every thread under the seccomp filter (mode 2: a filter).
                Some(("Seccomp", v)) => v.trim() != "2",
                _ => false,
            };
            if held {
                out.push(format!("{}: {l}", name.trim()));
            }
        }
    }
    out
}

/// Once its sockets are open the daemon keeps no privilege, on any thread (the I/O thread,
/// started before, drops its own; the vhost-user threads of a frontend are born without),
/// and every thread runs under the seccomp allow-list (backend/src/seccomp.rs).
#[test]
fn nothing_privileged_is_kept_once_the_sockets_are_open() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        vur_testkit::skip(
            "nothing_privileged_is_kept_once_the_sockets_are_open",
            "needs root (a daemon with privileges to drop)",
        );
        return;
    }
    let d = dir();
    let (sock, counters) = (d.join("rdma.sock"), d.join("counters.sock"));
    for extra in [&[][..], &["--io-thread"][..]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"));
        cmd.arg("--socket-path").arg(&sock).args(extra);
        let mut a = Daemon::spawn_cmd(cmd, Some(&counters));
        a.wait_for("waiting for a frontend");
        // A frontend's threads too.
        get_features(&sock);
        a.wait_for("frontend connected");
        let held = privileges(a.child.id());
        assert!(held.is_empty(), "with {extra:?}, still held: {held:#?}");
        assert!(a.terminate().success(), "{}", a.log.join("\n"));
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// `--seccomp none`: no filter (and the check above sees it).
#[test]
fn seccomp_none_installs_no_filter() {
    let d = dir();
    let sock = d.join("rdma.sock");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"));
    cmd.arg("--socket-path")
        .arg(&sock)
        .args(["--seccomp", "none"]);
    let mut a = Daemon::spawn_cmd(cmd, None);
    a.wait_for("waiting for a frontend");
    let held = privileges(a.child.id());
    assert!(
        held.iter().any(|l| l.contains("Seccomp:\t0")),
        "no thread without the filter: {held:#?}"
    );
    assert!(a.terminate().success(), "{}", a.log.join("\n"));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn counters_read_as_json_and_as_openmetrics() {
    let d = dir();
    let (sock, counters) = (d.join("rdma.sock"), d.join("counters.sock"));
    let mut a = Daemon::spawn(&sock, Some(&counters));
    a.wait_for("waiting for a frontend");
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"))
            .arg("counters")
            .arg(&counters)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json = run(&[]);
    assert!(json.starts_with("{\"connections\":0,"), "{json}");
    let om = run(&["--openmetrics"]);
    let device = counters.display().to_string();
    assert!(
        om.contains(&format!(
            "vhost_user_rdma_transport_tx_packets{{device=\"{device}\"}} 0\n"
        )),
        "{om}"
    );
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(a.terminate().success());
    // A path that is no counters socket: said so.
    let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"))
        .args(["counters", "/nonexistent/counters.sock"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is it a daemon's --counters-socket?"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// `help` lists the commands and options; `help COMMAND` prints that command's own help.
#[test]
fn help_names_every_command() {
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_vhost-user-rdma"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (rc, top) = run(&["help"]);
    assert_eq!(rc, Some(0), "{top}");
    for c in ["link", "counters", "man", "tap", "help"] {
        assert!(
            top.contains(&format!("\n  {c} ")),
            "help lists no {c}: {top}"
        );
    }
    for (c, text) in [
        ("tap", "Capture RoCEv2 frames"),
        ("link", "host side of a guest's NIC"),
        ("counters", "counters"),
        ("man", "man page"),
    ] {
        let (rc, out) = run(&["help", c]);
        assert_eq!(rc, Some(0), "help {c}: {out}");
        assert!(out.contains(text), "help {c}: {out}");
    }
    assert_eq!(run(&["help", "nope"]).0, Some(2));
}
