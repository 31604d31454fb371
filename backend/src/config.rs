//! Command line and the validated configuration it turns into.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use rxe_core::device::DeviceConfig;
use rxe_core::verbs::Mtu;
use thiserror::Error;

use crate::device::model::ModelConfig;
use crate::transport::egress::{Cidr, EgressPolicy};
use crate::unix_socket::{resolve_group, SocketAccess};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportKind {
    /// RoCEv2 over a kernel UDP socket (unprivileged).
    Udp,
    /// Whole frames on a host interface through an AF_PACKET socket (`--iface`; needs
    /// CAP_NET_RAW).
    Raw,
}

/// How the daemon maps the guest's memory (`--guest-memory`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum GuestMemoryKind {
    /// The VMM's memory fds, mapped as they come.
    #[default]
    Mapped,
    /// Each region as a host dma-buf (udmabuf over the VMM's memfd), mapped through it: the
    /// object a host device imports to reach the guest's memory (docs/daemon.md, "Guest
    /// memory as dma-bufs").
    Dmabuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RawRing {
    V3,
    V2,
}

/// vhost-user backend for a virtio-rdma (virtio ID 42) soft-RoCE device.
#[derive(Parser, Debug, Clone)]
#[command(version, about)]
pub struct Args {
    /// vhost-user unix socket to listen on. Repeat it, with one --udp-addr each (and one
    /// --counters-socket each, if any), to serve several frontends from one process: each is
    /// a device of its own, on a worker thread of its own.
    #[arg(
        long,
        required_unless_present_any = ["fd", "print_capabilities", "device"],
        help_heading = "Sockets"
    )]
    pub socket_path: Vec<PathBuf>,
    /// A listening vhost-user socket handed over by file descriptor (by a VMM, libvirt, or
    /// systemd socket activation, which passes fd 3), instead of --socket-path: one device,
    /// and no path for the daemon to create or remove.
    #[arg(
        long,
        value_name = "FDNUM",
        conflicts_with = "socket_path",
        help_heading = "Sockets"
    )]
    pub fd: Option<i32>,
    /// One device, its settings grouped: `socket=PATH,udp-addr=ADDR[,mac=MAC][,counters=PATH]`.
    /// Repeat it for several devices (instead of pairing the n-th --socket-path with the n-th
    /// --udp-addr); the other options apply to every device.
    #[arg(
        long,
        value_name = "SPEC",
        conflicts_with_all = ["socket_path", "fd", "udp_addr", "mac", "counters_socket"],
        help_heading = "Sockets"
    )]
    pub device: Vec<String>,
    /// Print what this backend is and offers as JSON (QEMU's vhost-user backend program
    /// conventions) and exit.
    #[arg(long, help_heading = "Sockets")]
    pub print_capabilities: bool,
    /// Host attachment.
    #[arg(long, value_enum, default_value_t = TransportKind::Udp, help_heading = "Transport")]
    pub transport: TransportKind,
    /// Local address of the UDP socket (a concrete IP: the ICRC covers it). Its IP is the one
    /// RoCEv2 GID the guest should add.
    #[arg(long, default_value = "127.0.0.1:4791", help_heading = "Transport")]
    pub udp_addr: Vec<SocketAddr>,
    /// UDP destination port of every packet sent (4791 on a real network; tests may use
    /// another).
    #[arg(long, default_value_t = 4791, help_heading = "Transport")]
    pub peer_port: u16,
    /// Check IPv4 ICRCs exactly: with IP ID 0, or with a datagram's index in a coalesced run
    /// (--udp-gso), nothing else (plain CRC-32; for daemon-only networks). Without it an
    /// ICRC that fails for ID 0 is solved for the ID the socket cannot see and accepted only
    /// when that ID is a GSO run index or lies in a window of its source's ID sequence (Linux
    /// rxe numbers IDs per destination); see docs/daemon.md, "ICRC over a UDP socket".
    #[arg(long, help_heading = "Transport")]
    pub strict_icrc: bool,
    /// With a udp transport: send runs of equal-length packets to one peer (a multi-packet
    /// WRITE, SEND or READ response) as one UDP GSO send, and take coalesced runs (UDP GRO).
    /// For peers behind a kernel UDP stack or a NIC (which cut the runs); not for a
    /// raw-transport peer on a veth or netkit pair, which would get a run whole. Over IPv4
    /// each segment's ICRC is for the IP ID the kernel gives it (its index in the run).
    #[arg(long, help_heading = "Transport")]
    pub udp_gso: bool,
    /// With a udp transport: each QP's packets leave from the UDP source port Linux rxe would
    /// give them (so that ECMP routers and the receivers' RSS spread QPs), through a
    /// send-only socket per port in use, bound to the --udp-addr address: at most N open
    /// (the least recently used closed first; one idle 10 s is closed). 0: every packet from
    /// the --udp-addr port.
    #[arg(long, value_name = "N", default_value_t = crate::transport::sport::DEFAULT_CAP, help_heading = "Transport")]
    pub udp_sport_sockets: usize,
    /// Port MAC address (default 02:00:00:00:00:01; with --iface the interface's MAC).
    /// With several --socket-path: one --mac for all, or one per --socket-path.
    #[arg(long, help_heading = "Transport")]
    pub mac: Vec<String>,
    /// Host interface for the raw transport: the daemon sends and receives whole Ethernet
    /// frames on it (AF_PACKET, needs CAP_NET_RAW). Selects `--transport raw`.
    #[arg(long, help_heading = "Transport")]
    pub iface: Option<String>,
    /// With --iface: an IP address the device sources from and answers to (repeat or
    /// separate with commas; IPv4 and IPv6). Each is a GID the guest should add. Best an
    /// address the host itself does not hold on that interface (else its own UDP stack
    /// answers the packets too, with ICMP port unreachable).
    #[arg(long, value_delimiter = ',', help_heading = "Transport")]
    pub raw_addr: Vec<std::net::IpAddr>,
    /// With --iface: the receive ring. v2: each frame handed over at once (the default: as
    /// fast as the UDP socket); v3: blocks of frames handed over full or after 1 ms (fewer
    /// wake-ups for a steady stream, but a lone packet waits up to 1 ms).
    #[arg(long, value_enum, default_value_t = RawRing::V2, help_heading = "Transport")]
    pub raw_ring: RawRing,
    /// Netdev MTU the port is modelled on (active path MTU = largest IB MTU <= MTU - 80).
    #[arg(long, default_value_t = 1500, help_heading = "Transport")]
    pub mtu: u32,
    /// Queue pairs the guest may create (QP1, the GSI QP, not counted).
    #[arg(long, default_value_t = 1024, help_heading = "Limits")]
    pub max_qp: u32,
    /// Completion queues the guest may create.
    #[arg(long, default_value_t = 2048, help_heading = "Limits")]
    pub max_cq: u32,
    /// Memory regions and windows the guest may register (a kernel PD's DMA MR counts).
    #[arg(long, default_value_t = 4096, help_heading = "Limits")]
    pub max_mr: u32,
    /// Protection domains the guest may allocate.
    #[arg(long, default_value_t = 1024, help_heading = "Limits")]
    pub max_pd: u32,
    /// Shared receive queues the guest may create.
    #[arg(long, default_value_t = 1024, help_heading = "Limits")]
    pub max_srq: u32,
    /// Total bytes the guest may register (MRs), e.g. 8G, 512M.
    #[arg(long, default_value = "8G", help_heading = "Limits")]
    pub max_registered_bytes: String,
    /// Cap on the page lists the device keeps for all objects together (rings, MRs,
    /// fast-registration reservations, REG_MR work requests in flight): a power of two
    /// from 64K to 1T.
    #[arg(long, default_value = "64M", help_heading = "Limits")]
    pub max_page_list_bytes: String,
    /// Cap on the heap the engine may hold for the guest's send work requests, e.g. 256M:
    /// past it, WQEs wait in the guest's rings until earlier ones complete (from 1M to 1T).
    #[arg(long, default_value = "256M", help_heading = "Limits")]
    pub max_wqe_bytes: String,
    /// Let the guest register DMA MRs (all of guest memory) with remote rights. Off: such a
    /// registration gets PERMISSION; one key would expose every byte of the guest.
    #[arg(long, help_heading = "Security")]
    pub allow_remote_dma_mr: bool,
    /// What a system call outside the daemon's allow-list does once it serves (installed on
    /// every thread after the sockets are open, docs/daemon.md "Privileges"): the kernel
    /// kills the process, or allows and logs the call (an audit line, type=1326, naming it),
    /// or raises SIGSYS; none installs no filter.
    #[arg(long, value_enum, default_value_t, help_heading = "Security")]
    pub seccomp: crate::seccomp::SeccompMode,
    /// How the guest's memory is mapped: as the VMM's memfds (mapped), or through a host
    /// dma-buf per region (dmabuf: udmabuf over the memfd; needs /dev/udmabuf, a memfd
    /// sealed against shrinking as QEMU's memory-backend-memfd makes, and regions within
    /// udmabuf's size_limit_mb).
    #[arg(long, value_enum, default_value_t, help_heading = "Guest memory")]
    pub guest_memory: GuestMemoryKind,
    /// Receive RoCE payloads for the guest straight into its memory's dma-bufs on this host
    /// interface (devmem receive, netdev bind-rx). Needs --guest-memory dmabuf. Probed at
    /// start; today's kernels serve devmem receive to TCP only, so the probe refuses and
    /// says what it found (docs/decisions.md, "Devmem receive").
    #[arg(long, value_name = "IFACE", help_heading = "Guest memory")]
    pub devmem_rx: Option<String>,
    /// Unix socket that prints the counters as JSON to whoever connects.
    #[arg(long, help_heading = "Sockets")]
    pub counters_socket: Vec<PathBuf>,
    /// With several --socket-path: a packet one of the devices sends to another's address
    /// goes to it through memory, not through the kernel's UDP stack (docs/daemon.md,
    /// "Same-host shortcut"). The egress policy (--allow-peer) still applies.
    #[arg(long, help_heading = "Performance")]
    pub same_host: bool,
    /// With --same-host: the payload an RC packet to another device of the process may
    /// carry, a segment of whole path MTUs that takes the PSNs of the packets it stands
    /// for (one hand-over and one copy per segment instead of per packet). 0: packets of
    /// one path MTU, as on a wire. 4K to 1M.
    #[arg(long, default_value = "64K", help_heading = "Performance")]
    pub same_host_segment: String,
    /// The engine of each device in N shards (1 to 64): its QPs spread over them by QPN,
    /// everything else shared (docs/decisions.md, "The engine in shards"). The device's
    /// worker drives every shard in turn, unless --shard-threads runs shards 1 and up on
    /// threads (and cores) of their own.
    #[arg(long, default_value_t = 1, help_heading = "Performance")]
    pub engine_shards: u32,
    /// With --engine-shards N: shards 1 to N-1 each on a thread of their own, with a UDP
    /// socket of their own that the kernel steers their QPs' packets to (a SO_REUSEPORT
    /// group); the device's worker keeps the virtqueues and shard 0. udp transport, not with
    /// --io-thread or --same-host.
    #[arg(long, help_heading = "Performance")]
    pub shard_threads: bool,
    /// Every device's UDP socket work (sendmmsg, recvmmsg, receive-side ICRC checks) on a
    /// thread of its own beside the worker that runs the engine: two cores per frontend,
    /// for bulk traffic; a lone small message waits for one more thread wake-up each way
    /// (docs/daemon.md, "I/O thread"). udp transport only.
    #[arg(long, help_heading = "Performance")]
    pub io_thread: bool,
    /// Peers the guest may send to (address or prefix, IPv4 or IPv6; repeat or separate with
    /// commas). Without it every destination but the unspecified and broadcast addresses is
    /// allowed, and loopback only when --udp-addr is a loopback address.
    #[arg(long, value_delimiter = ',', help_heading = "Security")]
    pub allow_peer: Vec<String>,
    /// Group (name or GID) whose members may connect to the vhost-user socket and the
    /// --net-socket too (the VMM's user): mode 0660 instead of 0600. Not the counters socket.
    #[arg(long, help_heading = "Sockets")]
    pub socket_group: Option<String>,
    /// Group (name or GID) whose members may read the counters socket too (a monitoring
    /// user): mode 0660 instead of 0600. Without it the counters are the daemon's user's.
    #[arg(long, help_heading = "Sockets")]
    pub counters_group: Option<String>,
    /// Poll mode: after doing work, the worker keeps polling its doorbell and control queues
    /// and its UDP socket for up to this many microseconds before it sleeps, with the guest's
    /// kicks suppressed meanwhile; the window adapts (halved while polling finds nothing,
    /// doubled back when it would have). 0 (the default) sleeps in epoll at once. Polling
    /// needs a core of its own: on a machine where the daemon shares its CPU with the guest's
    /// vCPUs it only takes time from them (docs/daemon.md, "Poll mode").
    #[arg(
        long,
        default_value_t = 0,
        value_name = "N",
        help_heading = "Performance"
    )]
    pub poll_us: u32,
    /// Serve the guest's virtio-net too, on this vhost-user socket (QEMU `-netdev
    /// vhost-user`): the daemon is then the guest's RoCE NIC on --iface. Frames that are not
    /// RoCEv2 to a --raw-addr pass between the interface and the guest untouched; the guest's
    /// stack answers ARP and ND. Needs --iface and --mac, the MAC the VMM gives the guest's
    /// virtio-net (RoCE frames leave from it too).
    #[arg(long, help_heading = "The guest's NIC (--net-socket)")]
    pub net_socket: Option<PathBuf>,
    /// With --net-socket: the guest's addresses (address or prefix, IPv4 or IPv6; repeat or
    /// separate with commas), the only ones its NIC may send from and RoCE is taken for.
    /// Without it the guest's addresses are its GIDs (ADD_GID). `0.0.0.0/0,::/0`: any (a
    /// guest that routes). The link-local address of --mac is the guest's in any case.
    #[arg(
        long,
        value_delimiter = ',',
        help_heading = "The guest's NIC (--net-socket)"
    )]
    pub net_addr: Vec<String>,
    /// With --net-socket: EtherTypes the guest may send besides IPv4, ARP and IPv6 (hex like
    /// 0x88cc; repeat or separate with commas). Their frames are checked for the guest's MAC
    /// only.
    #[arg(
        long,
        value_delimiter = ',',
        help_heading = "The guest's NIC (--net-socket)"
    )]
    pub net_ethertype: Vec<String>,
    /// With --net-socket: the guest may send VLAN-tagged frames (802.1Q, 802.1ad; the frame
    /// inside the tags is checked as an untagged one).
    #[arg(long, help_heading = "The guest's NIC (--net-socket)")]
    pub net_vlan: bool,
    /// With --net-socket: the guest may send to the link-local groups 01:80:c2:00:00:00 to
    /// 01:80:c2:00:00:0f (STP, LLDP, 802.1X, pause frames).
    #[arg(long, help_heading = "The guest's NIC (--net-socket)")]
    pub net_l2_control: bool,
    /// With --net-socket: the guest may send from any MAC, and receives frames to every MAC
    /// on the interface (a guest that bridges).
    #[arg(long, help_heading = "The guest's NIC (--net-socket)")]
    pub net_any_mac: bool,
}

/// Largest `--poll-us`: one second.
pub const MAX_POLL_US: u32 = 1_000_000;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("invalid MAC address {0:?} (want xx:xx:xx:xx:xx:xx, unicast)")]
    Mac(String),
    #[error("--device {0:?}: {1} (want socket=PATH,udp-addr=ADDR[,mac=MAC][,counters=PATH])")]
    Device(String, String),
    #[error("--udp-addr must be a concrete address, not {0}")]
    UnspecifiedAddr(SocketAddr),
    #[error("--mtu {0} out of range (576..=65535)")]
    Mtu(u32),
    #[error("{0} must be between 1 and {1}")]
    Limit(&'static str, u32),
    #[error("invalid size {0:?} (want a number with an optional K, M or G suffix)")]
    Size(String),
    #[error("--max-page-list-bytes {0:?} must be a power of two from 64K to 1T")]
    PageListBytes(String),
    #[error("--max-wqe-bytes {0:?} must be a size from 1M to 1T (e.g. 256M)")]
    WqeBytes(String),
    #[error("--socket-group {0:?}: no such group")]
    Group(String),
    #[error("--allow-peer {0}")]
    Peer(String),
    #[error("--poll-us {0} out of range (0..=1000000 microseconds)")]
    PollUs(u32),
    #[error(
        "--devmem-rx receives into the guest memory's dma-bufs: it needs --guest-memory dmabuf"
    )]
    DevmemNeedsDmabuf,
    #[error("--transport raw needs --iface IFNAME")]
    RawNeedsIface,
    #[error("--iface needs at least one --raw-addr IP (the addresses the device answers to)")]
    RawNeedsAddr,
    #[error("--raw-addr {0}: must be a unicast address (not unspecified, loopback or multicast)")]
    RawAddr(std::net::IpAddr),
    #[error("--raw-addr: at most {0} addresses")]
    RawAddrCount(usize),
    #[error("--net-socket needs --iface IFNAME (the host interface the guest's NIC is on)")]
    NetNeedsIface,
    #[error("--net-socket needs --mac, the MAC the VMM gives the guest's virtio-net")]
    NetNeedsMac,
    #[error(
        "--net-socket takes no --raw-addr: RoCE is taken for the addresses the guest gives its \
         RDMA device (its GID table, which follows its virtio-net's addresses)"
    )]
    NetRawAddr,
    #[error("{0} is an option of the guest's NIC: it needs --net-socket")]
    NetOnly(&'static str),
    #[error("--net-ethertype {0:?}: want an EtherType from 0x0600 to 0xffff, not a VLAN tag (see --net-vlan)")]
    EtherType(String),
    #[error("--net-socket and --socket-path must be different paths")]
    NetSamePath,
    #[error("{0} --socket-path but {1} --udp-addr: give one --udp-addr per --socket-path")]
    UdpAddrCount(usize, usize),
    #[error("{0} --socket-path but {1} --counters-socket: give none or one per --socket-path")]
    CountersCount(usize, usize),
    #[error("{0} --socket-path but {1} --mac: give one for all or one per --socket-path")]
    MacCount(usize, usize),
    #[error("{0} is given twice: every device needs its own")]
    Twice(String),
    #[error("--iface and --net-socket serve one frontend: give one --socket-path")]
    RawSeveral,
    #[error("--same-host needs two or more --socket-path (the devices it connects) on udp")]
    SameHostAlone,
    #[error("--same-host-segment {0}: want 0 or a size from 4K to 1M")]
    Segment(String),
    #[error("--engine-shards {0}: want 1 to 64")]
    Shards(u32),
    #[error("--io-thread is for the udp transport (the raw one shares its ring with the worker)")]
    IoThreadRaw,
    #[error(
        "--shard-threads needs --engine-shards 2 or more on the udp transport, without \
         --io-thread or --same-host (each shard's thread has a socket of its own)"
    )]
    ShardThreads,
    #[error("this is one device's configuration; {0} --socket-path make {0}: use configs()")]
    Several(usize),
}

/// The validated configuration of one device (one frontend socket).
#[derive(Clone, Debug)]
pub struct Config {
    /// The vhost-user socket's path; with `listen_fd`, only a name for messages.
    pub socket_path: PathBuf,
    /// `--fd`: the listening socket to serve, handed over by the process that started this
    /// one.
    pub listen_fd: Option<i32>,
    /// `--same-host`: this device reaches the others of the process through memory.
    pub same_host: bool,
    /// `--same-host-segment`: payload bytes of a packet to another device of the process
    /// (0: one path MTU).
    pub same_host_segment: usize,
    /// `--io-thread`: the UDP socket's work on a thread of its own.
    pub io_thread: bool,
    /// `--seccomp`: what a call outside the allow-list does (the whole process's).
    pub seccomp: crate::seccomp::SeccompMode,
    /// `--guest-memory`: the guest's memory mapped as it comes, or through host dma-bufs.
    pub guest_memory: GuestMemoryKind,
    /// `--devmem-rx`: the interface to receive into the guest memory's dma-bufs on.
    pub devmem_rx: Option<String>,
    /// `--shard-threads`: engine shards 1 and up on threads (and sockets) of their own.
    pub shard_threads: bool,
    pub transport: TransportKind,
    pub udp_addr: SocketAddr,
    pub peer_port: u16,
    pub strict_icrc: bool,
    /// UDP GSO for runs of packets (udp transport).
    pub udp_gso: bool,
    /// `--udp-sport-sockets`: the sockets that send from the QPs' own source ports.
    pub udp_sport_sockets: usize,
    /// The raw transport's setup (`--iface`), when it is the transport.
    pub raw: Option<crate::transport::raw::RawConfig>,
    pub counters_socket: Option<PathBuf>,
    /// Mode and group of the unix sockets.
    pub socket_access: SocketAccess,
    /// Mode and group of the counters socket (`--counters-group`).
    pub counters_access: SocketAccess,
    /// Poll window in microseconds (0: no polling).
    pub poll_us: u32,
    /// The guest's virtio-net socket (`--net-socket`): the raw transport's interface is then
    /// shared with it.
    pub net_socket: Option<PathBuf>,
    /// What the guest's NIC may send and receive (with `net_socket`).
    pub net_policy: Option<crate::net::net_policy::NetPolicy>,
    pub model: ModelConfig,
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let v: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16).ok().filter(|_| p.len() == 2))
        .collect::<Option<_>>()?;
    let m: [u8; 6] = v.try_into().ok()?;
    (m[0] & 1 == 0).then_some(m)
}

/// An EtherType for `--net-ethertype`: `0x88cc` (or decimal), 0x0600 and up, not a VLAN tag.
pub fn parse_ethertype(s: &str) -> Option<u16> {
    let s = s.trim();
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u16::from_str_radix(h, 16).ok()?,
        None => s.parse().ok()?,
    };
    (v >= 0x0600 && ![0x8100, 0x88a8, 0x9100].contains(&v)).then_some(v)
}

pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 1u64 << 10),
        'm' | 'M' => (&s[..s.len() - 1], 1 << 20),
        'g' | 'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// A size option ([`parse_size`]) that `ok` accepts, or the error `err` makes of the text
/// given.
fn size_option(
    given: &str,
    ok: impl Fn(u64) -> bool,
    err: fn(String) -> ConfigError,
) -> Result<u64, ConfigError> {
    parse_size(given)
        .filter(|&v| ok(v))
        .ok_or_else(|| err(given.to_string()))
}

/// The raw transport's configuration (`--iface`), checked; `None` for the UDP transport.
fn raw_config(
    a: &Args,
    transport: TransportKind,
    mac: Option<[u8; 6]>,
) -> Result<Option<crate::transport::raw::RawConfig>, ConfigError> {
    Ok(match (transport, &a.iface) {
        (TransportKind::Udp, _) => None,
        (TransportKind::Raw, None) => return Err(ConfigError::RawNeedsIface),
        (TransportKind::Raw, Some(iface)) => {
            if a.raw_addr.is_empty() && a.net_socket.is_none() {
                return Err(ConfigError::RawNeedsAddr);
            }
            if !a.raw_addr.is_empty() && a.net_socket.is_some() {
                return Err(ConfigError::NetRawAddr);
            }
            if a.raw_addr.len() > 8 {
                return Err(ConfigError::RawAddrCount(8));
            }
            let mut addrs = Vec::new();
            for ip in &a.raw_addr {
                let ip = ip.to_canonical();
                let v4_bcast = matches!(ip, std::net::IpAddr::V4(v) if v.is_broadcast());
                if ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || v4_bcast {
                    return Err(ConfigError::RawAddr(ip));
                }
                if !addrs.contains(&ip) {
                    addrs.push(ip);
                }
            }
            Some(crate::transport::raw::RawConfig {
                iface: iface.clone(),
                addrs,
                mac,
                mtu: a.mtu,
                ring: match a.raw_ring {
                    RawRing::V3 => crate::transport::raw::RingKind::V3,
                    RawRing::V2 => crate::transport::raw::RingKind::V2,
                },
                // Beside a virtio-net the guest's own stack answers for its addresses.
                answer_neighbours: a.net_socket.is_none(),
            })
        }
    })
}

/// The guest's virtio-net (`--net-socket`) needs an interface, a MAC and a socket of its
/// own; its policy options mean nothing without it.
fn check_net_options(
    a: &Args,
    mac_given: bool,
    socket_path: &std::path::Path,
) -> Result<(), ConfigError> {
    if let Some(p) = &a.net_socket {
        if a.iface.is_none() {
            return Err(ConfigError::NetNeedsIface);
        }
        if !mac_given {
            return Err(ConfigError::NetNeedsMac);
        }
        if *p == socket_path {
            return Err(ConfigError::NetSamePath);
        }
    }
    if a.net_socket.is_none() {
        for (given, name) in [
            (!a.net_addr.is_empty(), "--net-addr"),
            (!a.net_ethertype.is_empty(), "--net-ethertype"),
            (a.net_vlan, "--net-vlan"),
            (a.net_l2_control, "--net-l2-control"),
            (a.net_any_mac, "--net-any-mac"),
        ] {
            if given {
                return Err(ConfigError::NetOnly(name));
            }
        }
    }
    Ok(())
}

/// What the guest's virtio-net may send and receive (`--net-socket`'s policy options).
fn net_policy(
    a: &Args,
    mac: [u8; 6],
    egress: &EgressPolicy,
) -> Result<Option<crate::net::net_policy::NetPolicy>, ConfigError> {
    Ok(match &a.net_socket {
        None => None,
        Some(_) => Some(crate::net::net_policy::NetPolicy {
            mac,
            addrs: if a.net_addr.is_empty() {
                None
            } else {
                Some(
                    a.net_addr
                        .iter()
                        .map(|s| {
                            s.parse::<Cidr>()
                                .map_err(|e| ConfigError::Peer(format!("(--net-addr) {e}")))
                        })
                        .collect::<Result<_, _>>()?,
                )
            },
            ethertypes: a
                .net_ethertype
                .iter()
                .map(|s| parse_ethertype(s).ok_or_else(|| ConfigError::EtherType(s.clone())))
                .collect::<Result<_, _>>()?,
            vlan: a.net_vlan,
            l2_control: a.net_l2_control,
            any_mac: a.net_any_mac,
            egress: egress.clone(),
        }),
    })
}

/// The access a `--*-group` option gives a socket.
fn access(group: &Option<String>) -> Result<SocketAccess, ConfigError> {
    Ok(SocketAccess {
        group: match group {
            Some(g) => Some(resolve_group(g).ok_or_else(|| ConfigError::Group(g.clone()))?),
            None => None,
        },
    })
}

impl TryFrom<Args> for Config {
    type Error = ConfigError;

    fn try_from(a: Args) -> Result<Self, Self::Error> {
        if a.socket_path.len() != 1
            || a.udp_addr.len() != 1
            || a.counters_socket.len() > 1
            || a.mac.len() > 1
        {
            return Err(ConfigError::Several(a.socket_path.len()));
        }
        let socket_path = a.socket_path[0].clone();
        let udp_addr = a.udp_addr[0];
        let counters_socket = a.counters_socket.first().cloned();
        let mac = match a.mac.first() {
            Some(m) => Some(parse_mac(m).ok_or_else(|| ConfigError::Mac(m.clone()))?),
            None => None,
        };
        let transport = if a.iface.is_some() {
            TransportKind::Raw
        } else {
            a.transport
        };
        if a.io_thread && transport == TransportKind::Raw {
            return Err(ConfigError::IoThreadRaw);
        }
        if a.shard_threads
            && (a.engine_shards < 2
                || transport == TransportKind::Raw
                || a.io_thread
                || a.same_host)
        {
            return Err(ConfigError::ShardThreads);
        }
        let raw = raw_config(&a, transport, mac)?;
        check_net_options(&a, mac.is_some(), &socket_path)?;
        let mac = mac.unwrap_or([2, 0, 0, 0, 0, 1]);
        let local_ip = match &raw {
            Some(r) => r
                .addrs
                .first()
                .copied()
                .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
            None => udp_addr.ip(),
        };
        if raw.is_none() && udp_addr.ip().is_unspecified() {
            return Err(ConfigError::UnspecifiedAddr(udp_addr));
        }
        if !(576..=65535).contains(&a.mtu) {
            return Err(ConfigError::Mtu(a.mtu));
        }
        let lim = |name, v: u32, max: u32| {
            if v == 0 || v > max {
                Err(ConfigError::Limit(name, max))
            } else {
                Ok(v)
            }
        };
        if a.poll_us > MAX_POLL_US {
            return Err(ConfigError::PollUs(a.poll_us));
        }
        if a.devmem_rx.is_some() && a.guest_memory != GuestMemoryKind::Dmabuf {
            return Err(ConfigError::DevmemNeedsDmabuf);
        }
        let defaults = DeviceConfig::default();
        let dev = DeviceConfig {
            max_qp: lim("--max-qp", a.max_qp, 1 << 16)?,
            max_cq: lim("--max-cq", a.max_cq, 1 << 16)?,
            max_mr: lim("--max-mr", a.max_mr, 1 << 20)?,
            max_pd: lim("--max-pd", a.max_pd, 1 << 16)?,
            max_srq: lim("--max-srq", a.max_srq, 1 << 16)?,
            max_registered_bytes: size_option(
                &a.max_registered_bytes,
                |v| v > 0,
                ConfigError::Size,
            )?,
            port_mtu: Mtu::for_netdev_mtu(a.mtu),
            mac,
            ..defaults
        };
        let same_host_segment = size_option(
            &a.same_host_segment,
            |v| v == 0 || (4 << 10..=1 << 20).contains(&v),
            ConfigError::Segment,
        )? as usize;
        let egress = EgressPolicy::new(
            local_ip,
            a.allow_peer
                .iter()
                .map(|s| s.parse::<Cidr>().map_err(ConfigError::Peer))
                .collect::<Result<_, _>>()?,
        );
        let net_policy = net_policy(&a, mac, &egress)?;
        Ok(Config {
            socket_path,
            listen_fd: a.fd,
            same_host: a.same_host,
            same_host_segment,
            io_thread: a.io_thread,
            seccomp: a.seccomp,
            guest_memory: a.guest_memory,
            devmem_rx: a.devmem_rx.clone(),
            shard_threads: a.shard_threads,
            transport,
            raw,
            udp_addr,
            peer_port: a.peer_port,
            strict_icrc: a.strict_icrc,
            udp_gso: a.udp_gso,
            udp_sport_sockets: a.udp_sport_sockets,
            counters_socket,
            poll_us: a.poll_us,
            net_socket: a.net_socket,
            net_policy,
            socket_access: access(&a.socket_group)?,
            counters_access: access(&a.counters_group)?,
            model: ModelConfig {
                dev,
                netdev_mtu: a.mtu,
                max_page_list_bytes: size_option(
                    &a.max_page_list_bytes,
                    |v| v.is_power_of_two() && (1 << 16..=1 << 40).contains(&v),
                    ConfigError::PageListBytes,
                )?,
                allow_remote_dma_mr: a.allow_remote_dma_mr,
                max_wqe_bytes: size_option(
                    &a.max_wqe_bytes,
                    |v| (1 << 20..=1 << 40).contains(&v),
                    ConfigError::WqeBytes,
                )?,
                shards: Some(a.engine_shards)
                    .filter(|n| (1..=64).contains(n))
                    .ok_or(ConfigError::Shards(a.engine_shards))?,
                egress,
                // Set by the device as it opens its transport.
                live_qpns: None,
                mcast: None,
            },
        })
    }
}

/// `--device` specs into the per-device lists (`--socket-path`, `--udp-addr`, `--mac`,
/// `--counters-socket`) that [`configs`] checks: every spec names its socket and address;
/// a MAC or a counters socket given for one device must be given for all (as the lists ask).
fn group_devices(a: &mut Args) -> Result<(), ConfigError> {
    let (mut socks, mut addrs, mut macs, mut counters) = (vec![], vec![], vec![], vec![]);
    for spec in &a.device {
        let bad = |why: &str| ConfigError::Device(spec.clone(), why.to_string());
        let (mut sock, mut addr) = (None, None);
        for part in spec.split(',') {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("want key=value pairs"))?;
            match k {
                "socket" => sock = Some(PathBuf::from(v)),
                "udp-addr" => addr = Some(v.parse().map_err(|_| bad("udp-addr is no IP:port"))?),
                "mac" => macs.push(v.to_string()),
                "counters" => counters.push(PathBuf::from(v)),
                _ => return Err(bad(&format!("no key {k:?}"))),
            }
        }
        socks.push(sock.ok_or_else(|| bad("no socket="))?);
        addrs.push(addr.ok_or_else(|| bad("no udp-addr="))?);
    }
    let n = socks.len();
    if (!macs.is_empty() && macs.len() != n) || (!counters.is_empty() && counters.len() != n) {
        return Err(ConfigError::Device(
            a.device.join(" "),
            "give mac= and counters= to every device or to none".into(),
        ));
    }
    (a.socket_path, a.udp_addr, a.mac, a.counters_socket) = (socks, addrs, macs, counters);
    Ok(())
}

/// The configurations of the devices the command line asks for: one per `--socket-path`, each
/// with its own `--udp-addr` and `--counters-socket`, everything else shared.
pub fn configs(mut a: Args) -> Result<Vec<Config>, ConfigError> {
    if let Some(fd) = a.fd {
        a.socket_path = vec![PathBuf::from(format!("fd {fd}"))];
    }
    if !a.device.is_empty() {
        group_devices(&mut a)?;
    }
    let n = a.socket_path.len();
    if a.udp_addr.len() != n {
        return Err(ConfigError::UdpAddrCount(n, a.udp_addr.len()));
    }
    if !a.counters_socket.is_empty() && a.counters_socket.len() != n {
        return Err(ConfigError::CountersCount(n, a.counters_socket.len()));
    }
    if a.mac.len() > 1 && a.mac.len() != n {
        return Err(ConfigError::MacCount(n, a.mac.len()));
    }
    if n > 1 && (a.iface.is_some() || a.net_socket.is_some() || a.transport == TransportKind::Raw) {
        return Err(ConfigError::RawSeveral);
    }
    if a.same_host && (n < 2 || a.iface.is_some() || a.transport == TransportKind::Raw) {
        return Err(ConfigError::SameHostAlone);
    }
    let mut paths: Vec<&PathBuf> = a.socket_path.iter().chain(&a.counters_socket).collect();
    paths.extend(a.net_socket.as_ref());
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].contains(p) {
            return Err(ConfigError::Twice(p.display().to_string()));
        }
    }
    for (i, u) in a.udp_addr.iter().enumerate() {
        let seen = &a.udp_addr[..i];
        if seen.contains(u) || (a.same_host && seen.iter().any(|s| s.ip() == u.ip())) {
            return Err(ConfigError::Twice(format!("--udp-addr {}", u.ip())));
        }
    }
    (0..n)
        .map(|i| {
            let mut one = a.clone();
            one.socket_path = vec![a.socket_path[i].clone()];
            one.udp_addr = vec![a.udp_addr[i]];
            one.counters_socket = a.counters_socket.get(i).cloned().into_iter().collect();
            one.mac = a
                .mac
                .get(i)
                .or(a.mac.first())
                .cloned()
                .into_iter()
                .collect();
            Config::try_from(one)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["vhost-user-rdma", "--socket-path", "/tmp/x.sock"];
        v.extend_from_slice(extra);
        Args::parse_from(v)
    }

    /// `--device` groups one device's socket, address, MAC and counters socket.
    #[test]
    fn devices_are_grouped_by_device() {
        let parse = |v: &[&str]| {
            let mut all = vec!["vhost-user-rdma"];
            all.extend_from_slice(v);
            configs(Args::try_parse_from(all).unwrap())
        };
        let cs = parse(&[
            "--device",
            "socket=/tmp/a.sock,udp-addr=127.0.0.2:4791,mac=02:00:00:00:00:0a,counters=/tmp/a.c",
            "--device",
            "udp-addr=127.0.0.3:4791,socket=/tmp/b.sock,counters=/tmp/b.c,mac=02:00:00:00:00:0b",
            "--mtu",
            "9000",
        ])
        .unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[1].socket_path, PathBuf::from("/tmp/b.sock"));
        assert_eq!(cs[1].udp_addr, "127.0.0.3:4791".parse().unwrap());
        assert_eq!(cs[1].model.dev.mac, [2, 0, 0, 0, 0, 0x0b]);
        assert_eq!(cs[0].counters_socket, Some(PathBuf::from("/tmp/a.c")));
        assert_eq!(
            (cs[0].model.netdev_mtu, cs[1].model.netdev_mtu),
            (9000, 9000)
        );
        for (bad, why) in [
            ("socket=/tmp/a.sock", "no udp-addr="),
            ("udp-addr=127.0.0.2:4791", "no socket="),
            (
                "socket=/tmp/a.sock,udp-addr=nowhere",
                "udp-addr is no IP:port",
            ),
            (
                "socket=/tmp/a.sock,udp-addr=127.0.0.2:4791,colour=red",
                "no key",
            ),
        ] {
            let e = parse(&["--device", bad]).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let e = parse(&[
            "--device",
            "socket=/tmp/a.sock,udp-addr=127.0.0.2:4791,mac=02:00:00:00:00:0a",
            "--device",
            "socket=/tmp/b.sock,udp-addr=127.0.0.3:4791",
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("to every device or to none"), "{e}");
        // Not together with the positional lists.
        assert!(Args::try_parse_from([
            "vhost-user-rdma",
            "--device",
            "socket=/tmp/a.sock,udp-addr=127.0.0.2:4791",
            "--socket-path",
            "/tmp/x.sock"
        ])
        .is_err());
    }

    /// Several sockets make several devices, each with its own address and counters socket;
    /// counts that do not match, a path or address given twice, the raw transport with
    /// several, and `--same-host` with one are refused with what to give instead.
    #[test]
    fn several_sockets_make_several_devices() {
        let two = [
            "--socket-path",
            "/tmp/y.sock",
            "--udp-addr",
            "127.0.0.1:4791",
            "--udp-addr",
            "127.0.0.2:4791",
        ];
        let cs = configs(args(&two)).unwrap();
        assert_eq!(cs.len(), 2);
        assert_eq!(cs[1].socket_path, PathBuf::from("/tmp/y.sock"));
        assert_eq!(cs[1].udp_addr, "127.0.0.2:4791".parse().unwrap());
        assert!(cs
            .iter()
            .all(|c| !c.same_host && c.counters_socket.is_none()));
        let mut with = two.to_vec();
        with.extend(["--same-host", "--counters-socket", "/tmp/a.c"]);
        with.extend(["--counters-socket", "/tmp/b.c"]);
        let cs = configs(args(&with)).unwrap();
        assert!(cs.iter().all(|c| c.same_host));
        assert_eq!(cs[0].counters_socket, Some(PathBuf::from("/tmp/a.c")));

        assert_eq!(cs[1].counters_socket, Some(PathBuf::from("/tmp/b.c")));
        assert_eq!(
            cs[0].model.dev.mac, cs[1].model.dev.mac,
            "one --mac (none) for all"
        );
        let macs = ["--mac", "02:00:00:00:00:0a", "--mac", "02:00:00:00:00:0b"];
        let cs = configs(args(&[&two[..], &macs[..]].concat())).unwrap();
        assert_eq!(cs[1].model.dev.mac, [2, 0, 0, 0, 0, 0xb]);
        assert_eq!(
            configs(args(
                &[&two[..], &macs[..], &["--mac", "02:00:00:00:00:0c"]].concat()
            ))
            .unwrap_err(),
            ConfigError::MacCount(2, 3)
        );
        assert_eq!(configs(args(&[])).unwrap().len(), 1);
        assert_eq!(
            configs(args(&["--socket-path", "/tmp/y.sock"])).unwrap_err(),
            ConfigError::UdpAddrCount(2, 1)
        );
        assert_eq!(
            configs(args(
                &[&two[..], &["--counters-socket", "/tmp/a.c"]].concat()
            ))
            .unwrap_err(),
            ConfigError::CountersCount(2, 1)
        );
        let same_path = ["--socket-path", "/tmp/x.sock", "--udp-addr", "127.0.0.1:1"];
        assert!(matches!(
            configs(args(
                &[&same_path[..], &["--udp-addr", "127.0.0.1:2"]].concat()
            )),
            Err(ConfigError::Twice(_))
        ));
        // Two ports of one IP are two devices, but not two same-host ports.
        let one_ip = ["--udp-addr", "127.0.0.1:1", "--udp-addr", "127.0.0.1:2"];
        let one_ip = [&["--socket-path", "/tmp/y.sock"][..], &one_ip[..]].concat();
        assert!(configs(args(&one_ip)).is_ok());
        assert!(matches!(
            configs(args(&[&one_ip[..], &["--same-host"]].concat())),
            Err(ConfigError::Twice(_))
        ));
        assert_eq!(
            configs(args(&["--same-host"])).unwrap_err(),
            ConfigError::SameHostAlone
        );
        // Segments: 64 KiB by default, 0 (packets) or 4K..1M.
        let sh = [&two[..], &["--same-host"]].concat();
        assert!(configs(args(&sh))
            .unwrap()
            .iter()
            .all(|c| c.same_host_segment == 64 << 10));
        for (v, ok) in [("0", Some(0)), ("1M", Some(1 << 20)), ("4K", Some(4096))] {
            let c = configs(args(&[&sh[..], &["--same-host-segment", v]].concat())).unwrap();
            assert_eq!(Some(c[0].same_host_segment), ok);
        }
        for v in ["2K", "2M", "lots", "1.5K"] {
            assert_eq!(
                configs(args(&[&sh[..], &["--same-host-segment", v]].concat())).unwrap_err(),
                ConfigError::Segment(v.into())
            );
        }
        // Engine shards: 1 by default, 1 to 64.
        assert!(configs(args(&two))
            .unwrap()
            .iter()
            .all(|c| c.model.shards == 1));
        let c = configs(args(&[&two[..], &["--engine-shards", "4"]].concat())).unwrap();
        assert!(c.iter().all(|c| c.model.shards == 4));
        for v in [0, 65] {
            assert_eq!(
                configs(args(
                    &[&two[..], &["--engine-shards", &v.to_string()]].concat()
                ))
                .unwrap_err(),
                ConfigError::Shards(v)
            );
        }
        assert_eq!(
            configs(args(&[
                "--io-thread",
                "--iface",
                "eth0",
                "--raw-addr",
                "10.0.0.1"
            ]))
            .unwrap_err(),
            ConfigError::IoThreadRaw
        );
        // --shard-threads: shards to run on threads, each with a udp socket of its own.
        let st = |extra: &[&str]| {
            configs(args(&[&two[..], &["--shard-threads"], extra].concat())).map(|c| c[0].clone())
        };
        let c = st(&["--engine-shards", "2"]).unwrap();
        assert!(c.shard_threads && c.model.shards == 2);
        for bad in [
            &["--engine-shards", "1"][..],
            &[],
            &["--engine-shards", "2", "--io-thread"],
            &["--engine-shards", "2", "--same-host"],
        ] {
            assert_eq!(st(bad).unwrap_err(), ConfigError::ShardThreads, "{bad:?}");
        }
        let raw = ["--shard-threads", "--engine-shards", "2", "--iface", "eth0"];
        assert_eq!(
            configs(args(&[&raw[..], &["--raw-addr", "10.0.0.1"]].concat())).unwrap_err(),
            ConfigError::ShardThreads
        );
        let io = configs(args(&[&two[..], &["--io-thread"]].concat())).unwrap();
        assert!(io.iter().all(|c| c.io_thread));
        assert_eq!(
            configs(args(
                &[&two[..], &["--iface", "eth0", "--raw-addr", "10.0.0.1"]].concat()
            ))
            .unwrap_err(),
            ConfigError::RawSeveral
        );
        assert_eq!(
            Config::try_from(args(&two)).unwrap_err(),
            ConfigError::Several(2)
        );
    }

    #[test]
    fn defaults_and_validation() {
        let c = Config::try_from(args(&[])).unwrap();
        assert_eq!(c.model.dev.port_mtu, Mtu::M1024);
        assert_eq!(c.model.dev.max_registered_bytes, 8 << 30);
        assert_eq!(c.peer_port, 4791);
        assert!(matches!(
            Config::try_from(args(&["--mac", "01:00:00:00:00:01"])),
            Err(ConfigError::Mac(_))
        ));
        assert!(matches!(
            Config::try_from(args(&["--udp-addr", "0.0.0.0:4791"])),
            Err(ConfigError::UnspecifiedAddr(_))
        ));
        assert!(matches!(
            Config::try_from(args(&["--max-qp", "0"])),
            Err(ConfigError::Limit(..))
        ));
        assert_eq!(
            Config::try_from(args(&["--mtu", "9000"]))
                .unwrap()
                .model
                .dev
                .port_mtu,
            Mtu::M4096
        );
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(c.model.max_page_list_bytes, 64 << 20);
        for bad in ["3M", "32K", "2048G", "x"] {
            assert!(matches!(
                Config::try_from(args(&["--max-page-list-bytes", bad])),
                Err(ConfigError::PageListBytes(_))
            ));
        }
        assert_eq!(
            Config::try_from(args(&["--max-page-list-bytes", "1M"]))
                .unwrap()
                .model
                .max_page_list_bytes,
            1 << 20
        );
        assert_eq!(parse_size("x"), None);
        assert_eq!(c.socket_access.mode(), 0o600);
        let e = Config::try_from(args(&["--allow-peer", "10.77.0.0/16,fd77::/64"])).unwrap();
        assert!(e.model.egress.allows("10.77.1.1".parse().unwrap()));
        assert!(!e.model.egress.allows("10.78.1.1".parse().unwrap()));
        assert!(matches!(
            Config::try_from(args(&["--allow-peer", "10.0.0.0/40"])),
            Err(ConfigError::Peer(_))
        ));
        assert_eq!(c.model.dev.mac, [2, 0, 0, 0, 0, 1]);
        assert!(c.raw.is_none());
        let g = Config::try_from(args(&["--socket-group", "0"])).unwrap();
        assert_eq!(
            (g.socket_access.group, g.socket_access.mode()),
            (Some(0), 0o660)
        );
        // The counters socket is the operator's unless given a group of its own.
        assert_eq!(g.counters_access.mode(), 0o600);
        let m = Config::try_from(args(&["--counters-group", "0"])).unwrap();
        assert_eq!(
            (m.counters_access.group, m.socket_access.group),
            (Some(0), None)
        );
        assert!(matches!(
            Config::try_from(args(&["--socket-group", "no-such-group-here"])),
            Err(ConfigError::Group(_))
        ));
    }

    #[test]
    fn guest_memory_and_devmem_rx() {
        let c = Config::try_from(args(&[])).unwrap();
        assert_eq!(c.guest_memory, GuestMemoryKind::Mapped);
        assert_eq!(c.devmem_rx, None);
        let c =
            Config::try_from(args(&["--guest-memory", "dmabuf", "--devmem-rx", "eth0"])).unwrap();
        assert_eq!(c.guest_memory, GuestMemoryKind::Dmabuf);
        assert_eq!(c.devmem_rx.as_deref(), Some("eth0"));
        let e = Config::try_from(args(&["--devmem-rx", "eth0"])).unwrap_err();
        assert!(e.to_string().contains("needs --guest-memory dmabuf"), "{e}");
        assert!(Args::try_parse_from([
            "vhost-user-rdma",
            "--socket-path",
            "/x",
            "--guest-memory",
            "gpu"
        ])
        .is_err());
    }

    #[test]
    fn poll_us() {
        assert_eq!(Config::try_from(args(&[])).unwrap().poll_us, 0);
        assert_eq!(
            Config::try_from(args(&["--poll-us", "50"]))
                .unwrap()
                .poll_us,
            50
        );
        assert_eq!(
            Config::try_from(args(&["--poll-us", "1000000"]))
                .unwrap()
                .poll_us,
            MAX_POLL_US
        );
        let e = Config::try_from(args(&["--poll-us", "1000001"])).unwrap_err();
        assert_eq!(e, ConfigError::PollUs(1_000_001));
        assert!(e.to_string().contains("--poll-us 1000001 out of range"));
        for bad in ["-1", "abc", "1.5", "99999999999"] {
            assert!(
                Args::try_parse_from(["vhost-user-rdma", "--socket-path", "/x", "--poll-us", bad])
                    .is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn raw_transport_options() {
        let c = Config::try_from(args(&[
            "--iface",
            "veth0",
            "--raw-addr",
            "10.79.0.1,fd79::1",
        ]))
        .unwrap();
        assert_eq!(c.transport, TransportKind::Raw);
        let r = c.raw.unwrap();
        assert_eq!(r.iface, "veth0");
        assert_eq!(r.addrs.len(), 2);
        assert_eq!(r.mac, None, "the interface's MAC unless --mac");
        assert_eq!(
            r.ring,
            crate::transport::raw::RingKind::V2,
            "one slot per frame unless --raw-ring v3"
        );
        assert!(!c.model.egress.deny_loopback || r.addrs[0].is_ipv4());
        let m = Config::try_from(args(&[
            "--iface",
            "veth0",
            "--raw-addr",
            "10.79.0.1",
            "--mac",
            "02:00:00:00:00:07",
        ]))
        .unwrap();
        assert_eq!(m.raw.unwrap().mac, Some([2, 0, 0, 0, 0, 7]));
        assert_eq!(
            Config::try_from(args(&["--iface", "veth0"])).unwrap_err(),
            ConfigError::RawNeedsAddr
        );
        assert_eq!(
            Config::try_from(args(&["--transport", "raw"])).unwrap_err(),
            ConfigError::RawNeedsIface
        );
        for bad in ["0.0.0.0", "127.0.0.1", "224.0.0.1", "::", "ff02::1"] {
            assert!(matches!(
                Config::try_from(args(&["--iface", "veth0", "--raw-addr", bad])),
                Err(ConfigError::RawAddr(_))
            ));
        }
    }

    #[test]
    fn nic_options() {
        let nic = [
            "--iface",
            "vh0",
            "--mac",
            "52:54:00:79:00:02",
            "--net-socket",
            "/n",
        ];
        let c = Config::try_from(args(&nic)).unwrap();
        assert_eq!(c.net_socket.as_deref(), Some(std::path::Path::new("/n")));
        let r = c.raw.unwrap();
        assert_eq!(r.mac, Some([0x52, 0x54, 0, 0x79, 0, 2]));
        assert!(r.addrs.is_empty(), "the guest's GIDs, once it adds them");
        assert!(!r.answer_neighbours, "the guest's stack answers ARP and ND");
        let plain =
            Config::try_from(args(&[&nic[..4], &["--raw-addr", "10.79.0.2"]].concat())).unwrap();
        assert!(plain.raw.unwrap().answer_neighbours);
        assert_eq!(
            Config::try_from(args(&[&nic[..], &["--raw-addr", "10.79.0.2"]].concat())).unwrap_err(),
            ConfigError::NetRawAddr
        );
        assert_eq!(
            Config::try_from(args(&["--net-socket", "/n"])).unwrap_err(),
            ConfigError::NetNeedsIface
        );
        let no_mac = [&nic[..2], &nic[4..]].concat();
        assert_eq!(
            Config::try_from(args(&no_mac)).unwrap_err(),
            ConfigError::NetNeedsMac
        );
        let mut same = nic.to_vec();
        same[5] = "/tmp/x.sock";
        assert_eq!(
            Config::try_from(args(&same)).unwrap_err(),
            ConfigError::NetSamePath
        );
    }

    #[test]
    fn the_nics_policy_options() {
        let nic = [
            "--iface",
            "vh0",
            "--mac",
            "52:54:00:79:00:02",
            "--net-socket",
            "/n",
        ];
        let p = Config::try_from(args(&nic)).unwrap().net_policy.unwrap();
        assert_eq!(p.mac, [0x52, 0x54, 0, 0x79, 0, 2]);
        assert_eq!(
            (p.addrs, p.vlan, p.l2_control, p.any_mac),
            (None, false, false, false),
            "safe by default: the GIDs, no tags, no link-local groups, the guest's MAC"
        );
        assert!(p.ethertypes.is_empty());
        let wide = [
            "--net-addr",
            "10.79.0.0/24,fd79::2",
            "--net-ethertype",
            "0x88cc,35063",
            "--net-vlan",
            "--net-l2-control",
            "--net-any-mac",
            "--allow-peer",
            "10.79.0.1",
        ];
        let p = Config::try_from(args(&[&nic[..], &wide[..]].concat()))
            .unwrap()
            .net_policy
            .unwrap();
        assert_eq!(p.addrs.as_ref().map(Vec::len), Some(2));
        assert_eq!(p.ethertypes, [0x88cc, 0x88f7]);
        assert!(p.vlan && p.l2_control && p.any_mac);
        assert!(
            !p.egress.allows("10.79.0.3".parse().unwrap()),
            "--allow-peer"
        );
        for bad in ["0x8100", "0x05ff", "x", "0x10000"] {
            assert_eq!(
                Config::try_from(args(&[&nic[..], &["--net-ethertype", bad]].concat()))
                    .unwrap_err(),
                ConfigError::EtherType(bad.into())
            );
        }
        assert!(
            Config::try_from(args(&[&nic[..], &["--net-addr", "10.0.0.0/40"]].concat())).is_err()
        );
        assert_eq!(
            Config::try_from(args(&["--net-vlan"])).unwrap_err(),
            ConfigError::NetOnly("--net-vlan")
        );
        assert!(Config::try_from(args(&[])).unwrap().net_policy.is_none());
    }
}
