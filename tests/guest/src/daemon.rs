//! Daemon processes: launching, restarting and stopping them, their counters, and the
//! addresses and CPUs they run on.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// Daemon processes and two-node setups

/// A running daemon process (killed with SIGTERM on drop).
pub struct Daemon {
    /// The process; shared by the devices of one process ([`Daemon::spawn_two`]), and
    /// stopped when the last of them is dropped.
    child: Arc<Mutex<Child>>,
    pub socket: PathBuf,
    pub counters: PathBuf,
    pub addr: SocketAddr,
    dir: PathBuf,
    launch: Launch,
}

/// How a [`Daemon`] process is started (kept for [`Daemon::restart`]).
#[derive(Clone)]
struct Launch {
    bin: PathBuf,
    socket: PathBuf,
    counters: PathBuf,
    addr: SocketAddr,
    extra: Vec<String>,
    cpus: Option<Vec<usize>>,
    /// Where stderr goes ([`Daemon::spawn_logged`]), else inherited.
    log: Option<PathBuf>,
}

impl Daemon {
    /// Starts `bin` bound to `addr`.
    pub fn spawn(bin: &Path, addr: SocketAddr, extra: &[&str]) -> io::Result<Daemon> {
        Self::spawn_on(bin, addr, extra, None)
    }

    /// As [`Daemon::spawn`], with the daemon's stderr (its log, at `RUST_LOG=info`) kept in a
    /// file for [`Daemon::log`].
    pub fn spawn_logged(bin: &Path, addr: SocketAddr, extra: &[&str]) -> io::Result<Daemon> {
        Self::spawn_with(bin, addr, extra, None, true)
    }

    /// Starts `bin` bound to `addr`, restricted to the CPUs in `cpus` if given.
    pub fn spawn_on(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> io::Result<Daemon> {
        Self::spawn_with(bin, addr, extra, cpus, false)
    }

    fn spawn_with(
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
        logged: bool,
    ) -> io::Result<Daemon> {
        Self::spawn_in(Self::new_dir()?, bin, addr, extra, cpus, logged)
    }

    /// As [`Self::spawn_with`], its sockets (and log) in `dir`.
    fn spawn_in(
        dir: PathBuf,
        bin: &Path,
        addr: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
        logged: bool,
    ) -> io::Result<Daemon> {
        let launch = Launch {
            bin: bin.to_path_buf(),
            socket: dir.join("rdma.sock"),
            counters: dir.join("counters.sock"),
            addr,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            cpus: cpus.map(|c| c.to_vec()),
            log: logged.then(|| dir.join("daemon.log")),
        };
        Ok(Daemon {
            child: Arc::new(Mutex::new(launch.start()?)),
            socket: launch.socket.clone(),
            counters: launch.counters.clone(),
            addr,
            dir,
            launch,
        })
    }

    /// Starts one daemon process serving two devices (`--socket-path` and `--udp-addr`
    /// twice) on `a` and `b`, with `extra` (`--same-host`, say): one [`Daemon`] per device,
    /// both of the same process, restricted to `cpus` if given.
    pub fn spawn_two(
        bin: &Path,
        a: SocketAddr,
        b: SocketAddr,
        extra: &[&str],
        cpus: Option<&[usize]>,
    ) -> io::Result<(Daemon, Daemon)> {
        let dir = Self::new_dir()?;
        let (b_sock, b_counters) = (dir.join("rdma-b.sock"), dir.join("counters-b.sock"));
        let (b_sock, b_counters) = (
            b_sock.display().to_string(),
            b_counters.display().to_string(),
        );
        let mut all = extra.to_vec();
        all.extend(["--socket-path", &b_sock, "--udp-addr"]);
        let b_addr = b.to_string();
        all.extend([b_addr.as_str(), "--counters-socket", &b_counters]);
        let first = Self::spawn_in(dir, bin, a, &all, cpus, false)?;
        let second = Daemon {
            child: first.child.clone(),
            socket: b_sock.into(),
            counters: b_counters.into(),
            addr: b,
            dir: first.dir.clone(),
            launch: first.launch.clone(),
        };
        Ok((first, second))
    }

    /// A fresh directory for a daemon's sockets and log.
    fn new_dir() -> io::Result<PathBuf> {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vur-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Kills the daemon the way a crash does (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let mut c = lock(&self.child);
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Starts the daemon again, same binary, arguments, socket and address (a restarted
    /// daemon); the old process must be gone ([`Daemon::kill`], [`Daemon::terminate`]).
    pub fn restart(&mut self) -> io::Result<()> {
        *lock(&self.child) = self.launch.start()?;
        Ok(())
    }

    /// What the daemon logged so far ([`Daemon::spawn_logged`] only; empty otherwise).
    pub fn log(&self) -> String {
        self.launch
            .log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        lock(&self.child).id()
    }

    /// The counters JSON (waits up to 5 s for the socket to appear).
    pub fn counters(&self) -> io::Result<String> {
        use std::io::Read;
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            match std::os::unix::net::UnixStream::connect(&self.counters) {
                Ok(mut s) => {
                    let mut out = String::new();
                    s.read_to_string(&mut out)?;
                    return Ok(out);
                }
                Err(e) if Instant::now() > end => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Number of open fds of the daemon process.
    pub fn fd_count(&self) -> io::Result<usize> {
        Ok(std::fs::read_dir(format!("/proc/{}/fd", self.pid()))?.count())
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(lock(&self.child).try_wait(), Ok(None))
    }

    /// SIGTERM and wait (bounded); returns the exit status code if it exited.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut c = lock(&self.child);
        if let Ok(Some(s)) = c.try_wait() {
            return s.code();
        }
        // SAFETY: signalling our own child by pid (not reaped: try_wait said it runs).
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(5);
        while Instant::now() < end {
            if let Ok(Some(s)) = c.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

/// `$VUR_DAEMON_ARGS`: arguments for every daemon of a run (e.g. `--engine-shards 3`: the
/// whole suite against a device in shards), but for an option the test gives itself
/// (`extra`), whose value stands.
fn run_args(extra: &[String]) -> Vec<String> {
    merge_args(&std::env::var("VUR_DAEMON_ARGS").unwrap_or_default(), extra)
}

/// The words of `env` but the options `extra` names (each with its value, if it has one).
fn merge_args(env: &str, extra: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut words = env.split_whitespace().peekable();
    while let Some(w) = words.next() {
        let name = w.split('=').next().unwrap_or(w);
        let own = name.starts_with("--")
            && extra
                .iter()
                .any(|e| e == name || e.starts_with(&format!("{name}=")));
        let value = (!w.contains('=') && words.peek().is_some_and(|v| !v.starts_with("--")))
            .then(|| words.next())
            .flatten();
        if !own {
            out.push(w.to_string());
            out.extend(value.map(str::to_string));
        }
    }
    out
}

impl Launch {
    /// Starts the process on this socket, address and arguments.
    fn start(&self) -> io::Result<Child> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--socket-path")
            .arg(&self.socket)
            .arg("--udp-addr")
            .arg(self.addr.to_string());
        // Peers on the daemon's own port unless the caller names another (two daemons on
        // one address, e.g. ::1, each sending to the other's port).
        if !self
            .extra
            .iter()
            .any(|a| a == "--peer-port" || a.starts_with("--peer-port="))
        {
            cmd.arg("--peer-port").arg(self.addr.port().to_string());
        }
        cmd.arg("--counters-socket")
            .arg(&self.counters)
            .args(&self.extra)
            .args(run_args(&self.extra))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null());
        if let Some(log) = &self.log {
            cmd.env("RUST_LOG", "info");
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)?;
            cmd.stderr(f);
        }
        if let Some(cpus) = &self.cpus {
            let set = cpu_set(cpus);
            // SAFETY: the closure runs in the child between fork and exec and only calls
            // sched_setaffinity (async-signal-safe) on a set built before the fork.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
                    if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.spawn()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // The last device of the process stops it.
        if Arc::strong_count(&self.child) > 1 {
            return;
        }
        if self.is_alive() {
            self.terminate();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cpu_set(cpus: &[usize]) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is a plain bit array; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: `c` is below CPU_SETSIZE, so the bit is inside `set`.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    set
}

/// Restricts the calling thread to the CPUs in `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> io::Result<()> {
    let set = cpu_set(cpus);
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is the calling thread.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Extracts `"key":<number>` from the counters JSON (first occurrence after `section`).
pub fn json_u64(json: &str, section: &str, key: &str) -> Option<u64> {
    let from = if section.is_empty() {
        0
    } else {
        json.find(&format!("\"{section}\""))?
    };
    let pat = format!("\"{key}\":");
    let at = json[from..].find(&pat)? + from + pat.len();
    let end = json[at..]
        .find(|c: char| !c.is_ascii_digit())
        .map_or(json.len(), |e| at + e);
    json[at..end].parse().ok()
}

/// Two loopback addresses unique to this process and call: 127.X.Y.1 and 127.X.Y.2.
pub fn loopback_pair(port: u16) -> (SocketAddr, SocketAddr) {
    static N: AtomicU8 = AtomicU8::new(0);
    let x = 64 + (std::process::id() % 128) as u8;
    let y = N.fetch_add(1, Ordering::Relaxed);
    (
        SocketAddr::new(Ipv4Addr::new(127, x, y, 1).into(), port),
        SocketAddr::new(Ipv4Addr::new(127, x, y, 2).into(), port),
    )
}

/// Finds the daemon binary: `$VUR_DAEMON`, or `vhost-user-rdma` / `vur-daemon` next to the
/// running executable (or one directory up, for test executables in `deps/`).
pub fn find_daemon() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VUR_DAEMON") {
        return Some(p.into());
    }
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    for d in [dir, dir.parent()?] {
        for n in ["vhost-user-rdma", "vur-daemon"] {
            let p = d.join(n);
            if p.exists() {
                return Some(p);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::merge_args;

    #[test]
    fn run_arguments_yield_to_the_tests_own() {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let env = "--engine-shards 3 --io-thread --poll-us=20 --mtu 9000";
        assert_eq!(
            merge_args(env, &own(&["--engine-shards", "2"])),
            own(&["--io-thread", "--poll-us=20", "--mtu", "9000"])
        );
        assert_eq!(
            merge_args(env, &own(&["--poll-us", "5", "--mtu=1500"])),
            own(&["--engine-shards", "3", "--io-thread"])
        );
        assert_eq!(merge_args("", &own(&["--io-thread"])), Vec::<String>::new());
    }
}
