//! vhost-user-rdma: a vhost-user backend serving a paravirtual RDMA device (virtio ID 42) whose
//! RoCEv2 transport is the sans-IO `rxe-core` engine. The device contract is
//! docs/virtio-rdma.md.
//!
//! Rooms, from the top floor down; a module imports only from its own room or lower ones:
//! - the top: [`cli`] is the binaries' `main`, [`config`] turns the command line into a
//!   validated [`config::Config`],
//!   [`start_backend`] serves one frontend after another, [`vhu_rdma`] is the
//!   `VhostUserBackend` impl, [`counters`] the query socket;
//! - [`worker`]: the per-frontend worker ([`worker::queues::Worker`]: queues, polling,
//!   receiving, the counters' rendering) and the shard threads;
//! - [`net`]: the guest's virtio-net beside the device (`--net-socket`) and the `link` helper;
//! - [`device`]: the device model (commands, rings, events, engine pumping), testable without
//!   a socket;
//! - [`transport`]: the host attachment, a UDP socket or an interface's frames, and the packet
//!   sink the model pumps into;
//! - [`memory`]: guest memory and the payload references into it;
//! - the floor: [`abi`] (the device's structures), [`clock`], [`sync`], [`heap`], [`ratelog`],
//!   [`unix_socket`].

#![deny(unsafe_op_in_unsafe_fn)]

#[cfg(target_endian = "big")]
compile_error!(
    "the virtio-rdma structures are little-endian and used in place: little-endian hosts only"
);

pub mod abi;
pub mod cli;
pub mod clock;
pub mod config;
pub mod counters;
pub mod device;
pub mod heap;
pub mod memory;
pub mod metrics;
pub mod net;
pub mod ratelog;
pub mod seccomp;
pub mod sync;
pub mod sys;
pub mod transport;
pub mod unix_socket;
pub mod vhu_rdma;
pub mod worker;

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::GuestMemoryAtomic;
use vmm_sys_util::epoll::EventSet;

use crate::config::Config;
use crate::counters::Shared;
use crate::device::model::Model;
use crate::memory::guest_mem::GuestMemoryMmap;
use crate::transport::udp::UdpTransport;
use crate::transport::Transport;
use crate::vhu_rdma::{
    VhuRdma, COUNTERS_EVENT, IO_EVENT, LINK_EVENT, SAME_HOST_EVENT, TIMER_EVENT, UDP_EVENT,
    WORK_EVENT,
};

#[derive(Debug, Error)]
pub enum Error {
    #[error("binding the UDP socket {0}: {1}{hint}", hint = udp_hint(.0, .1))]
    Udp(std::net::SocketAddr, std::io::Error),
    #[error("{0}")]
    Raw(#[from] transport::raw::RawError),
    #[error("creating the vhost-user socket {0}: {1}{hint}", hint = socket_hint(.0, .1))]
    Socket(String, std::io::Error),
    #[error("--fd {0}: {1}")]
    Fd(std::os::fd::RawFd, String),
    #[error("dropping the privileges: {0}")]
    Privileges(String),
    #[error("vhost-user daemon: {0}")]
    Daemon(String),
    #[error("{0}")]
    Dmabuf(#[from] memory::dmabuf::DmabufError),
    #[error("--devmem-rx: {0}")]
    Devmem(#[from] net::devmem::DevmemRefusal),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What to do about a UDP socket that cannot be bound, when the error says.
fn udp_hint(addr: &std::net::SocketAddr, e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EADDRNOTAVAIL) => format!(
            " — no interface of this host (in this network namespace) has {}: give --udp-addr \
             an address the host holds (`ip -br addr`), or add it to an interface first",
            addr.ip()
        ),
        Some(libc::EADDRINUSE) => format!(
            " — another socket holds {addr}: another daemon of this address, or a Linux rxe \
             device on it (rxe listens on UDP 4791 of every address); pick another address"
        ),
        Some(libc::EACCES) => " — a port below 1024 needs CAP_NET_BIND_SERVICE".into(),
        _ => String::new(),
    }
}

/// What to do about a socket path that cannot be created, when the error says.
fn socket_hint(path: &str, e: &std::io::Error) -> String {
    let dir = std::path::Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| d.display().to_string());
    match (e.kind(), dir) {
        (std::io::ErrorKind::NotFound, Some(d)) => {
            format!(" — the directory {d} does not exist: create it first")
        }
        (std::io::ErrorKind::PermissionDenied, Some(d)) => {
            format!(" — this user may not create files in {d}")
        }
        _ => String::new(),
    }
}

/// 64 bits from the kernel's random source (getrandom(2)).
pub fn random_u64() -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: writing at most `b.len() - got` bytes into the live buffer `b` from `got`.
        let r = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += r as usize;
    }
    Ok(u64::from_ne_bytes(b))
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it; pthread_sigmask
    // only changes this thread's mask (threads spawned later inherit it).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Serves frontends on `config.socket_path` one after another until SIGINT or SIGTERM.
/// A frontend that disconnects is not an error: its state is dropped and the next one served.
pub fn start_backend(config: Config) -> Result<(), Error> {
    start_backends(vec![config])
}

/// What the signal thread (or a device that failed) needs to stop one device: its flags, its
/// vhost-user handlers and the sockets whose `accept()` it wakes.
struct Stopper {
    shared: Arc<Shared>,
    handle: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    net_handle: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    listening: Listening,
}

/// The device's listening sockets that may sit in `accept()`, by fd: a stop shuts them down
/// (shutdown(2) wakes a blocked accept with EINVAL), so that no shutdown goes through a
/// socket's path, which is a name that may meanwhile be another's. An fd is taken out of the
/// list, under its lock, before its socket is closed.
#[derive(Clone, Default)]
struct Listening(Arc<Mutex<Vec<std::os::fd::RawFd>>>);

/// A listening socket's place in [`Listening`], removed when this drops.
struct Registered {
    list: Listening,
    fd: std::os::fd::RawFd,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.list.remove(self.fd);
    }
}

impl Listening {
    /// Lists `fd` until the returned guard drops: declare the guard after the listener, so
    /// that it goes first on every way out, an early `?` too.
    fn register(&self, fd: std::os::fd::RawFd) -> Registered {
        sync::lock(&self.0).push(fd);
        Registered {
            list: self.clone(),
            fd,
        }
    }
    fn remove(&self, fd: std::os::fd::RawFd) {
        sync::lock(&self.0).retain(|&f| f != fd);
    }
    fn wake_all(&self) {
        for &fd in sync::lock(&self.0).iter() {
            // SAFETY: `fd` is a listening socket that stays open while it is in the list
            // (whose lock is held here); shutdown passes no memory.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
    }
}

impl Stopper {
    fn stop(&self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for h in [&self.handle, &self.net_handle] {
            if let Some(h) = h.lock().unwrap_or_else(|e| e.into_inner()).take() {
                h.shutdown();
            }
        }
        self.listening.wake_all();
    }
}

/// A device's listening sockets, and the locks that hold their paths.
struct Bound {
    main: (Listener, Option<unix_socket::PathLock>),
    net: Option<(Listener, unix_socket::PathLock)>,
    counters: Option<counters::Bound>,
}

/// One device of the process: its configuration, its host attachment and what its threads
/// share.
struct Device {
    config: Config,
    shared: Arc<Shared>,
    net: Option<(
        std::path::PathBuf,
        Arc<net::net_port::NetPort>,
        Arc<net::vhu_net::NetStats>,
    )>,
    handle: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    net_handle: Arc<Mutex<Option<vhost_user_backend::ShutdownHandle>>>,
    listening: Listening,
    /// `--guest-memory dmabuf`: /dev/udmabuf, opened while the daemon may.
    udmabuf: Option<Arc<memory::dmabuf::Udmabuf>>,
}

impl Device {
    /// Opens the device's transport (and its virtio-net port); with `hub`, joins the
    /// same-host shortcut.
    fn open(
        mut config: Config,
        hub: Option<&Arc<transport::same_host::Hub>>,
    ) -> Result<Device, Error> {
        let mut shard_links = Vec::new();
        // The QPs the guest has live: the engine hands out numbers below this span. The
        // model keeps the set, the receive path reads it.
        let live_qpns = Arc::new(transport::live_qpns::LiveQpns::new(
            rxe_core::device::FIRST_QPN + config.model.dev.max_qp.saturating_mul(2),
        ));
        config.model.live_qpns = Some(live_qpns.clone());
        let mcast = mcast_groups(&mut config);
        let mut transport = match &config.raw {
            None => {
                // `--shard-threads`: a socket per engine shard, the kernel steering each
                // packet to its QP's shard; the device's worker keeps the first.
                let mut socks = if config.shard_threads {
                    UdpTransport::bind_steered(
                        config.udp_addr,
                        config.peer_port,
                        config.strict_icrc,
                        config.model.shards,
                    )
                } else {
                    UdpTransport::bind(config.udp_addr, config.peer_port, config.strict_icrc)
                        .map(|t| vec![t])
                }
                .map_err(|e| Error::Udp(config.udp_addr, e))?;
                for s in &mut socks {
                    s.set_source_ports(config.udp_sport_sockets);
                }
                let mut t = socks.remove(0);
                t.set_groups(mcast.clone());
                let gso =
                    config.udp_gso && t.enable_gso().map_err(|e| Error::Udp(config.udp_addr, e))?;
                for mut s in socks {
                    if gso {
                        s.enable_gso().map_err(|e| Error::Udp(config.udp_addr, e))?;
                    }
                    s.set_egress(config.model.egress.clone());
                    s.set_live_qpns(live_qpns.clone());
                    shard_links.push(Arc::new(worker::shard_worker::ShardLink::new(s)));
                }
                if config.udp_gso && !gso {
                    log::warn!("--udp-gso: not used (this kernel does not know UDP GSO)");
                }
                if let Some(hub) = hub {
                    let link = transport::same_host::Link::new(hub.clone(), config.udp_addr.ip())
                        .map_err(|e| Error::Udp(config.udp_addr, e))?;
                    t.set_same_host(link, config.same_host_segment);
                }
                log::info!(
                    "udp transport on {} (peers on port {}; {}; UDP GSO {}{})",
                    t.local_addr(),
                    config.peer_port,
                    match config.udp_sport_sockets {
                        0 => "every packet from the bound port".to_string(),
                        n => format!("each QP from its own source port, up to {n} sockets"),
                    },
                    if gso { "on" } else { "off" },
                    match (hub.is_some(), config.same_host_segment) {
                        (false, _) => String::new(),
                        (true, 0) => "; same-host shortcut to the other devices of this process, packets of one path MTU".to_string(),
                        (true, n) => format!("; same-host shortcut to the other devices of this process, segments of {} KiB", n >> 10),
                    }
                );
                Transport::Udp(t)
            }
            Some(r) => {
                if config.udp_gso {
                    log::warn!("--udp-gso: not used (the raw transport builds whole frames)");
                }
                let t = transport::raw::RawTransport::open(r)?;
                // The port MAC is the one frames go out from.
                config.model.dev.mac = t.mac();
                log::info!(
                    "raw transport on {} (index {}, MTU {}), MAC {}, addresses {:?}",
                    t.iface(),
                    t.info().index,
                    t.info().mtu,
                    t.mac()
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect::<Vec<_>>()
                        .join(":"),
                    r.addrs
                );
                Transport::Raw(t)
            }
        };
        transport.set_egress(config.model.egress.clone());
        transport.set_live_qpns(live_qpns.clone());
        // `--io-thread`: the socket's work moves to a thread of its own.
        let io = match &mut transport {
            Transport::Udp(t) if config.io_thread => {
                let io = t.start_io_thread().map_err(Error::Io)?;
                log::info!("udp socket served by an I/O thread beside the worker");
                Some(Arc::new(io))
            }
            _ => None,
        };
        // The guest's virtio-net on the same interface: every frame the raw transport's filter
        // does not take.
        let net = match (&config.net_socket, &config.raw) {
            (Some(p), Some(r)) => {
                let stats = Arc::new(net::vhu_net::NetStats::default());
                let policy = config.net_policy.clone().unwrap_or_else(|| {
                    net::net_policy::NetPolicy::new(r.mac.unwrap_or(config.model.dev.mac))
                });
                let port = net::net_port::NetPort::open(&r.iface, &r.addrs, policy, stats.clone())?;
                log::info!(
                    "virtio-net on {} (MTU {}): every frame but RoCEv2 to the guest's GIDs",
                    port.iface(),
                    port.mtu(),
                );
                let port = Arc::new(port);
                if let Transport::Raw(t) = &mut transport {
                    t.set_companion(port.clone());
                }
                Some((p.clone(), port, stats))
            }
            _ => None,
        };
        let udmabuf = guest_memory_dmabuf(&config)?;
        let same_host = transport.same_host_inbox();
        let link = watch_link(&transport);
        let shared = Arc::new(Shared {
            backend: Mutex::new(None),
            transport: Arc::new(Mutex::new(transport)),
            connections: std::sync::atomic::AtomicU64::new(0),
            shutdown: std::sync::atomic::AtomicBool::new(false),
            net: net.as_ref().map(|n| n.2.clone()),
            same_host,
            io,
            shard_links,
            link,
        });
        Ok(Device {
            config,
            shared,
            net,
            handle: Arc::new(Mutex::new(None)),
            net_handle: Arc::new(Mutex::new(None)),
            listening: Listening::default(),
            udmabuf,
        })
    }

    /// Binds the device's sockets: the vhost-user listener (or takes the one handed over with
    /// `--fd`), the guest's virtio-net one, the counters one. All before any device serves, so
    /// that the privileges can go first ([`sys::drop_privileges`]).
    fn bind(&self) -> Result<Bound, Error> {
        let counters = match &self.config.counters_socket {
            Some(p) => Some(counters::bind(p, self.config.counters_access)?),
            None => None,
        };
        let net = match &self.net {
            Some((path, ..)) => Some(bind_listener(path, &self.config)?),
            None => None,
        };
        let main = match self.config.listen_fd {
            Some(fd) => (adopt_listener(fd)?, None),
            None => {
                let (l, lock) = bind_listener(&self.config.socket_path, &self.config)?;
                (l, Some(lock))
            }
        };
        Ok(Bound {
            main,
            net,
            counters,
        })
    }

    fn stopper(&self) -> Stopper {
        Stopper {
            shared: self.shared.clone(),
            handle: self.handle.clone(),
            net_handle: self.net_handle.clone(),
            listening: self.listening.clone(),
        }
    }
}

/// The multicast groups the guest's QPs are attached to, which the model publishes and the
/// udp transport joins (read by the worker: not with an I/O thread or shard threads).
fn mcast_groups(config: &mut Config) -> Arc<transport::mcast::Groups> {
    let mcast = Arc::new(transport::mcast::Groups::default());
    if config.raw.is_none() && !config.io_thread && !config.shard_threads {
        config.model.mcast = Some(mcast.clone());
    } else if config.raw.is_none() {
        log::info!("udp transport: UD multicast groups are not joined with --io-thread or --shard-threads (the worker reads the group sockets)");
    }
    mcast
}

/// Serves one device per configuration (one frontend socket each, every one on threads of
/// its own) until SIGINT or SIGTERM, or until one of them fails (which stops the others).
pub fn start_backends(configs: Vec<Config>) -> Result<(), Error> {
    let sigset = block_signals();
    // The udp transports open a socket per source port in use (--udp-sport-sockets): room
    // for them under the hard limit, as a server raises its soft one.
    let want = configs
        .iter()
        .map(|c| c.udp_sport_sockets as u64)
        .sum::<u64>()
        + 1024;
    sys::raise_nofile(want);
    let hub = configs
        .iter()
        .any(|c| c.same_host)
        .then(transport::same_host::Hub::new);
    // Every transport first: an address that cannot be bound fails before anything serves.
    let devices = configs
        .into_iter()
        .map(|c| Device::open(c, hub.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let bound = devices
        .iter()
        .map(Device::bind)
        .collect::<Result<Vec<_>, _>>()?;
    // Every socket is open: nothing the daemon does from here needs a privilege, and every
    // thread spawned from here on inherits none (the I/O threads, started with their
    // transports, drop theirs themselves).
    sys::drop_privileges().map_err(|e| Error::Privileges(e.to_string()))?;
    // And the system calls it makes from here are a known list, on every thread.
    let mode = devices
        .first()
        .map(|d| d.config.seccomp)
        .unwrap_or_default();
    seccomp::install(mode).map_err(Error::Privileges)?;
    if mode != seccomp::SeccompMode::None {
        log::info!("seccomp: {mode:?} on a system call outside the allow-list");
    }
    let stoppers: Arc<Vec<Stopper>> = Arc::new(devices.iter().map(Device::stopper).collect());
    {
        let stoppers = stoppers.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                let mut sig = 0;
                // SAFETY: `sigset` is an initialised signal set; `sig` is a live i32.
                unsafe { libc::sigwait(&sigset, &mut sig) };
                log::info!("signal {sig}: shutting down");
                stoppers.iter().for_each(Stopper::stop);
                // Every later signal is still taken: a second one ends the process at once,
                // for a shutdown that waits on something that does not come.
                // SAFETY: as above.
                unsafe { libc::sigwait(&sigset, &mut sig) };
                log::warn!("signal {sig} during the shutdown: exiting now");
                std::process::exit(1);
            })?;
    }
    if devices.len() == 1 {
        return devices
            .into_iter()
            .zip(bound)
            .next()
            .map_or(Ok(()), |(d, b)| serve(d, b));
    }
    let threads = devices
        .into_iter()
        .zip(bound)
        .enumerate()
        .map(|(i, (d, b))| {
            let stoppers = stoppers.clone();
            std::thread::Builder::new()
                .name(format!("device-{i}"))
                .spawn(move || {
                    let r = serve(d, b);
                    if let Err(e) = &r {
                        log::error!("device {i}: {e}; stopping the others");
                    }
                    // One device ended (a failure, or the shutdown): the process ends.
                    stoppers.iter().for_each(Stopper::stop);
                    r
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut result = Ok(());
    for t in threads {
        match t.join() {
            Ok(Err(e)) if result.is_ok() => result = Err(e),
            Err(_) => log::error!("a device thread panicked"),
            _ => {}
        }
    }
    result
}

/// Binds a listening vhost-user socket at `path` for the device (see [`unix_socket`]: the
/// lock returned holds the path, and removes the socket when dropped). The listener itself
/// never unlinks anything.
fn bind_listener(
    path: &std::path::Path,
    config: &Config,
) -> Result<(Listener, unix_socket::PathLock), Error> {
    unix_socket::bind_private(path, config.socket_access, || {
        std::os::unix::net::UnixListener::bind(path).map(Listener::from)
    })
    .map_err(|e| Error::Socket(path.to_string_lossy().to_string(), e))
}

/// Takes the listening socket `fd` handed over by the process that started the daemon
/// (`--fd`), after checking it is one: a unix stream socket that listens.
fn adopt_listener(fd: std::os::fd::RawFd) -> Result<Listener, Error> {
    let bad = |why: String| Error::Fd(fd, why);
    let opt = |name: i32| -> std::io::Result<i32> {
        let mut v: i32 = 0;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: `v` and `len` are live and of the sizes passed; a bad fd is an error.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut i32).cast(),
                &mut len,
            )
        };
        if r == 0 {
            Ok(v)
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let domain = opt(libc::SO_DOMAIN).map_err(|e| bad(format!("not a socket: {e}")))?;
    let ty = opt(libc::SO_TYPE).map_err(|e| bad(e.to_string()))?;
    let listening = opt(libc::SO_ACCEPTCONN).map_err(|e| bad(e.to_string()))?;
    if domain != libc::AF_UNIX || ty != libc::SOCK_STREAM || listening != 1 {
        return Err(bad("not a listening unix stream socket".into()));
    }
    // SAFETY: F_SETFD on an fd the checks above showed open; no memory passed.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the fd was handed to this process to own (it is the daemon's for its lifetime:
    // nothing else in the process refers to it), and it is a listening unix socket.
    let l =
        unsafe { <std::os::unix::net::UnixListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    Ok(Listener::from(l))
}

/// Serves one device's frontends one after another until shutdown.
fn serve(device: Device, bound: Bound) -> Result<(), Error> {
    let Device {
        config,
        shared,
        net,
        handle: shutdown_handle,
        net_handle,
        listening,
        udmabuf,
    } = device;
    let counters = match bound.counters {
        Some(b) => Some(counters::spawn(b, shared.clone())?),
        None => None,
    };
    let net_thread = match (net, bound.net) {
        (Some((path, port, stats)), Some((listener, lock))) => {
            let listener = Arc::new(listener);
            // The thread holds a clone: the fd stays open while it is listed, whichever way
            // this function ends.
            let registered = listening.register(listener.as_raw_fd());
            let shared = shared.clone();
            let handle = net_handle.clone();
            let l = listener.clone();
            let t = std::thread::Builder::new()
                .name("vhost-user-net".into())
                .spawn(move || serve_net(&path, &l, port, stats, &shared, &handle))?;
            Some((t, listener, lock, registered))
        }
        _ => None,
    };
    let path = config.socket_path.to_string_lossy().to_string();
    let (mut listener, lock) = bound.main;
    let registered = listening.register(listener.as_raw_fd());
    let result = loop {
        if shared.shutdown.load(Ordering::SeqCst) {
            break Ok(());
        }
        let (backend, shard_workers) = connection_backend(&config, &shared, &udmabuf)?;
        let mut daemon = VhostUserDaemon::new(
            "vhost-user-rdma".into(),
            backend.clone(),
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .map_err(|e| Error::Daemon(e.to_string()))?;
        register_listeners(&daemon, &backend, &shared)?;
        log::info!("waiting for a frontend on {path}");
        if let Err(e) = daemon.start(&mut listener) {
            if shared.shutdown.load(Ordering::SeqCst) {
                break Ok(());
            }
            log::error!("accepting a frontend: {e}");
            continue;
        }
        *shutdown_handle.lock().unwrap_or_else(|e| e.into_inner()) = daemon.shutdown_handle();
        if shared.shutdown.load(Ordering::SeqCst) {
            daemon.request_shutdown();
        }
        shared.connections.fetch_add(1, Ordering::Relaxed);
        *shared.backend.lock().unwrap_or_else(|e| e.into_inner()) = Some(backend.counters_desk());
        log::info!("frontend connected");
        match daemon.wait() {
            Ok(()) => log::info!("frontend disconnected"),
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => log::info!("frontend disconnected"),
            Err(e) => log::warn!("frontend connection ended: {e}{}", memory_hint(&e)),
        }
        shutdown_handle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        *shared.backend.lock().unwrap_or_else(|e| e.into_inner()) = None;
        // The guest's addresses went with it: RoCE to them is its virtio-net's again.
        if let Err(e) = shared
            .transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .follow_gids(&[])
        {
            log::warn!("giving the guest's addresses back to its virtio-net: {e}");
        }
        // Dropping the daemon stops and joins its worker thread and closes its epoll.
        drop(daemon);
        drop(shard_workers);
        backend.close_exit_fds();
    };
    shared.shutdown.store(true, Ordering::SeqCst);
    if let Some(io) = &shared.io {
        io.stop();
    }
    drop(registered);
    drop(listener);
    // The socket and its lock go together, and only ours.
    drop(lock);
    if let Some((t, listener, lock, registered)) = net_thread {
        // Its listener may sit in accept(): wake it.
        listening.wake_all();
        match t.join() {
            Ok(Err(e)) => log::warn!("virtio-net: {e}"),
            Err(_) => log::error!("virtio-net thread panicked"),
            Ok(Ok(())) => {}
        }
        drop(registered);
        drop(listener);
        drop(lock);
    }
    if let Some(c) = counters {
        let _ = c.join();
    }
    result
}

/// What to check when a frontend's connection ended because its memory table could not be
/// mapped: the region error vm-memory gives, through the vhost crates.
fn memory_hint(e: &vhost_user_backend::Error) -> &'static str {
    let vhost_user_backend::Error::HandleRequest(vhost::vhost_user::Error::ReqHandlerError(io)) = e
    else {
        return "";
    };
    let unmappable = io
        .get_ref()
        .is_some_and(|inner| inner.is::<vm_memory::mmap::MmapRegionError>());
    if unmappable {
        " — the guest memory the frontend handed over could not be mapped: it must be shared \
         memory the daemon can map read-write (QEMU: -object memory-backend-memfd,id=mem,\
         size=…,share=on -numa node,memdev=mem; cloud-hypervisor: --memory size=…,shared=on)"
    } else {
        ""
    }
}

/// `--guest-memory dmabuf`: /dev/udmabuf, opened now (the privileges go before a frontend
/// comes); with `--devmem-rx`, the probe of devmem receive on that interface.
fn guest_memory_dmabuf(config: &Config) -> Result<Option<Arc<memory::dmabuf::Udmabuf>>, Error> {
    if config.guest_memory != config::GuestMemoryKind::Dmabuf {
        return Ok(None);
    }
    let u = memory::dmabuf::Udmabuf::open()?;
    log::info!(
        "guest memory through dma-bufs ({}; size_limit_mb {})",
        memory::dmabuf::UDMABUF_DEV,
        u.limit_mib()
            .map_or_else(|| "unknown".to_string(), |l| l.to_string())
    );
    if let Some(iface) = &config.devmem_rx {
        // A dma-buf of the daemon's own: the guest's memory comes later, with its frontend.
        let probe = u.probe_buffer(2 << 20)?;
        match net::devmem::probe_rx(iface, std::os::fd::AsFd::as_fd(&probe)) {
            Ok(never) => match never {},
            Err(refusal) => return Err(refusal.into()),
        }
    }
    Ok(Some(Arc::new(u)))
}

/// The link the port stands on: the raw interface, or the one holding `--udp-addr`.
fn watch_link(t: &Transport) -> Option<Arc<Mutex<transport::link_watch::LinkWatch>>> {
    let i = t.port_ifindex()?;
    match transport::link_watch::LinkWatch::open(i) {
        Ok(w) => {
            log::info!(
                "port state follows interface index {i} (link {})",
                if w.up() { "up" } else { "down" }
            );
            Some(Arc::new(Mutex::new(w)))
        }
        Err(e) => {
            log::warn!("port state: not following interface index {i}: {e}");
            None
        }
    }
}

/// The device's side of one frontend connection: a fresh model, its backend and, with
/// `--shard-threads`, the threads of shards 1 and up.
fn connection_backend(
    config: &Config,
    shared: &Shared,
    udmabuf: &Option<Arc<memory::dmabuf::Udmabuf>>,
) -> Result<(Arc<VhuRdma>, Option<worker::shard_worker::ShardWorkers>), Error> {
    // Every connection its own key bytes and first QPN: nothing a previous guest or an
    // off-path sender learnt names this guest's MRs and QPs.
    let mut mc = config.model.clone();
    mc.dev.seed = Some(random_u64()?);
    let mut m = Model::new(mc);
    m.set_source_gids(
        shared
            .transport
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .gids(),
    );
    // `--shard-threads`: shards 1 and up to threads of their own, on their sockets.
    let shards = if shared.shard_links.is_empty() {
        Vec::new()
    } else {
        m.hand_out_shards()
    };
    let model = Arc::new(Mutex::new(m));
    let backend = Arc::new(VhuRdma::new(
        model.clone(),
        shared.transport.clone(),
        config.poll_us,
        udmabuf.clone(),
    )?);
    backend.set_shard_links(shared.shard_links.clone());
    backend.set_link_watch(shared.link.clone());
    // `--same-host`: the other devices hand their packets to this one's engine on their
    // own threads while its worker is idle.
    if let Some(inbox) = &shared.same_host {
        let d: Arc<dyn transport::same_host::Driver> = backend.clone();
        inbox.set_driver(Arc::downgrade(&d));
    }
    // Stopped and joined when dropped, which the caller does after the vhost-user daemon.
    let shard_workers = if shards.is_empty() {
        None
    } else {
        let kicks = worker::shard_worker::ShardWorkers::kicks(backend.wake_fd(), shards.len() + 1)?;
        backend.set_shard_kicks(kicks.clone());
        Some(
            worker::shard_worker::ShardWorkers::start(
                shards,
                &shared.shard_links,
                &kicks,
                &backend.memory_slot(),
            )
            .map_err(Error::Io)?,
        )
    };
    Ok((backend, shard_workers))
}

/// The worker's fds beside the queues' kicks: the socket (or the I/O thread's inbox), the
/// timer, the wake-up, the counters readers, the same-host inbox.
fn register_listeners(
    daemon: &VhostUserDaemon<Arc<VhuRdma>>,
    backend: &Arc<VhuRdma>,
    shared: &Shared,
) -> Result<(), Error> {
    let handlers = daemon.get_epoll_handlers();
    let udp_fd = shared
        .transport
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .fd();
    // With an I/O thread the socket is its: the worker waits on its inbox instead.
    match backend.io_fd() {
        Some(fd) => handlers[0].register_listener(fd, EventSet::IN, IO_EVENT as u64),
        None => handlers[0].register_listener(udp_fd, EventSet::IN, UDP_EVENT as u64),
    }
    .map_err(Error::Io)?;
    handlers[0]
        .register_listener(backend.timer_fd(), EventSet::IN, TIMER_EVENT as u64)
        .map_err(Error::Io)?;
    handlers[0]
        .register_listener(backend.work_fd(), EventSet::IN, WORK_EVENT as u64)
        .map_err(Error::Io)?;
    handlers[0]
        .register_listener(backend.counters_fd(), EventSet::IN, COUNTERS_EVENT as u64)
        .map_err(Error::Io)?;
    if let Some(fd) = backend.same_host_fd() {
        handlers[0]
            .register_listener(fd, EventSet::IN, SAME_HOST_EVENT as u64)
            .map_err(Error::Io)?;
    }
    if let Some(fd) = backend.link_fd() {
        handlers[0]
            .register_listener(fd, EventSet::IN, LINK_EVENT as u64)
            .map_err(Error::Io)?;
    }
    backend.set_epoll_handler(&handlers[0]);
    Ok(())
}

/// Serves the guest's virtio-net on `path`, one frontend after another, until shutdown. Each
/// connection goes through [`vhost_proxy`] to the vhost crate's handler, which listens on a
/// socket in a directory only this user can enter.
fn serve_net(
    path: &std::path::Path,
    listener: &Listener,
    port: Arc<net::net_port::NetPort>,
    stats: Arc<net::vhu_net::NetStats>,
    shared: &Shared,
    handle: &Mutex<Option<vhost_user_backend::ShutdownHandle>>,
) -> Result<(), Error> {
    use std::os::unix::fs::DirBuilderExt;
    let shown = path.display();
    let dir = std::env::temp_dir().join(format!(
        "vhost-user-rdma-net-{}-{:x}",
        std::process::id(),
        random_u64()?
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    let inner_path = dir.join("backend.sock");
    let result = (|| {
        let mut inner = Listener::new(&inner_path, true).map_err(|e| {
            Error::Socket(
                inner_path.display().to_string(),
                std::io::Error::other(e.to_string()),
            )
        })?;
        while !shared.shutdown.load(Ordering::SeqCst) {
            log::info!("waiting for a virtio-net frontend on {shown}");
            let front = match listener.accept() {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(_) if shared.shutdown.load(Ordering::SeqCst) => break,
                Err(e) => {
                    log::error!("accepting a virtio-net frontend: {e}");
                    continue;
                }
            };
            if shared.shutdown.load(Ordering::SeqCst) {
                break;
            }
            let backend = Arc::new(net::vhu_net::VhuNet::new(port.clone(), stats.clone())?);
            let mut daemon = VhostUserDaemon::new(
                "vhost-user-net".into(),
                backend.clone(),
                GuestMemoryAtomic::new(GuestMemoryMmap::new()),
            )
            .map_err(|e| Error::Daemon(e.to_string()))?;
            {
                let handlers = daemon.get_epoll_handlers();
                handlers[0]
                    .register_listener(
                        backend.port_fd(),
                        EventSet::IN | EventSet::EDGE_TRIGGERED,
                        net::vhu_net::PORT_EVENT as u64,
                    )
                    .map_err(Error::Io)?;
                handlers[0]
                    .register_listener(
                        backend.more_fd(),
                        EventSet::IN,
                        net::vhu_net::MORE_EVENT as u64,
                    )
                    .map_err(Error::Io)?;
            }
            // Our own connection is the one the handler accepts (the directory is ours).
            let back = UnixStream::connect(&inner_path)?;
            if let Err(e) = daemon.start(&mut inner) {
                log::error!("starting the virtio-net handler: {e}");
                continue;
            }
            let relay = net::vhost_proxy::spawn(
                front,
                back,
                net::vhost_proxy::MtuPolicy {
                    max: port.mtu(),
                    set: stats.mtu.clone(),
                },
            )?;
            *handle.lock().unwrap_or_else(|e| e.into_inner()) = daemon.shutdown_handle();
            if shared.shutdown.load(Ordering::SeqCst) {
                daemon.request_shutdown();
            }
            log::info!("virtio-net frontend connected");
            match daemon.wait() {
                Ok(())
                | Err(vhost_user_backend::Error::HandleRequest(
                    vhost::vhost_user::Error::Disconnected
                    | vhost::vhost_user::Error::PartialMessage,
                )) => log::info!("virtio-net frontend disconnected"),
                Err(e) => log::warn!("virtio-net frontend connection ended: {e}"),
            }
            handle.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(daemon);
            for t in relay {
                let _ = t.join();
            }
            backend.close_exit_fds();
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&inner_path);
    let _ = std::fs::remove_dir(&dir);
    result
}
