//! Private network namespaces for tests and benchmarks of the raw transport: a thread that
//! moves itself into a new, unnamed network namespace (`unshare(CLONE_NEWNET)`), where the
//! test creates its veth pair and starts its daemons. Nothing is configured in the caller's
//! namespace, and the namespace — with its interfaces — is gone once the thread and the
//! processes it started have exited, also when the test fails.

use std::io;
use std::process::Command;
use std::time::{Duration, Instant};

/// Why namespace tests cannot run here, if they cannot: not root, or no `ip` tool.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some(
            "needs root (CAP_SYS_ADMIN and CAP_NET_RAW) to create a network namespace".into(),
        );
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` tool (iproute2) is not installed".into());
    }
    None
}

/// Runs `f` on a new thread inside a new network namespace and returns its result; a panic
/// in `f` is passed on. `Err` when the namespace cannot be created (the reason).
pub fn run_in_new_netns<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let h = std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            // SAFETY: unshare only changes this thread's namespaces.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(format!(
                    "unshare(CLONE_NEWNET): {}",
                    io::Error::last_os_error()
                ));
            }
            ip(&["link", "set", "lo", "up"]).map_err(|e| e.to_string())?;
            Ok(f())
        })
        .map_err(|e| e.to_string())?;
    match h.join() {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    }
}

/// Runs `ip ARGS` (in the calling thread's namespace); an error carries its stderr.
pub fn ip(args: &[&str]) -> io::Result<()> {
    let out = Command::new("ip").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Formats a MAC address.
pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Creates the veth pair `a`–`b` with the given MACs and brings both ends up.
pub fn veth_pair(a: &str, mac_a: [u8; 6], b: &str, mac_b: [u8; 6]) -> io::Result<()> {
    ip(&["link", "add", a, "type", "veth", "peer", "name", b])?;
    ip(&["link", "set", a, "address", &mac_str(mac_a)])?;
    ip(&["link", "set", b, "address", &mac_str(mac_b)])?;
    ip(&["link", "set", a, "up"])?;
    ip(&["link", "set", b, "up"])?;
    Ok(())
}

/// An AF_PACKET socket that sees every frame on one interface (both directions), to check
/// what the daemons put on the wire.
pub struct Capture {
    fd: std::os::fd::OwnedFd,
}

impl Capture {
    pub fn open(iface: &str) -> io::Result<Capture> {
        use std::os::fd::FromRawFd;
        let name = std::ffi::CString::new(iface).map_err(io::Error::other)?;
        // SAFETY: `name` is a valid NUL-terminated string.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if index == 0 {
            return Err(io::Error::last_os_error());
        }
        let all = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain syscall; the result is checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                all as i32,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = all;
        sll.sll_ifindex = index as i32;
        // SAFETY: `sll` is a valid sockaddr_ll of the size passed; `fd` is ours.
        let r = unsafe {
            libc::bind(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                (&sll as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Capture { fd })
    }

    /// Every frame captured so far (waits up to `wait` for the first).
    pub fn frames(&self, wait: Duration) -> Vec<Vec<u8>> {
        let end = Instant::now() + wait;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: reading into a live buffer of its length from our socket.
            let n = unsafe {
                libc::recv(
                    std::os::fd::AsRawFd::as_raw_fd(&self.fd),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                out.push(buf[..n as usize].to_vec());
                continue;
            }
            if !out.is_empty() || Instant::now() > end {
                return out;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread living in a second new network namespace, running what it is given there: the
/// other end of a veth pair, its addresses and the processes started on it. `tid` names the
/// namespace to `ip link set DEV netns TID`.
pub struct NsThread {
    tx: Option<std::sync::mpsc::Sender<Job>>,
    handle: Option<std::thread::JoinHandle<()>>,
    pub tid: i32,
}

impl NsThread {
    pub fn new() -> Result<NsThread, String> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("netns-peer".into())
            .spawn(move || {
                // SAFETY: unshare only changes this thread's namespaces; gettid has no
                // preconditions.
                let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
                if r != 0 {
                    let _ = ready_tx.send(Err(io::Error::last_os_error().to_string()));
                    return;
                }
                if let Err(e) = ip(&["link", "set", "lo", "up"]) {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
                // SAFETY: as above.
                let _ = ready_tx.send(Ok(unsafe { libc::gettid() }));
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .map_err(|e| e.to_string())?;
        let tid = ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| "the namespace thread did not start within 10 s".to_string())??;
        Ok(NsThread {
            tx: Some(tx),
            handle: Some(handle),
            tid,
        })
    }

    /// Runs `f` in the namespace and returns its result (a panic in `f` is passed on).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        let job: Job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r);
        });
        self.tx
            .as_ref()
            .expect("namespace thread")
            .send(job)
            .expect("namespace thread alive");
        match rx.recv().expect("namespace thread answers") {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl Drop for NsThread {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
