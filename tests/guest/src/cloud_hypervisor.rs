//! cloud-hypervisor's `--generic-vhost-user` frontend, replayed message for message.
//!
//! What cloud-hypervisor sends a generic vhost-user device (its `GenericVhostUser` device and
//! the common vhost-user control code, checked against v52.0, where the generic device first
//! shipped, and the main branch after v53.0), in the order it sends it:
//!
//! - **VM creation** ([`GenericVhostUserDevice::create`]): connect (retried every 100 ms),
//!   SET_OWNER, GET_FEATURES, GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES with what it asks
//!   for ([`vmm_protocol_features`]) that the backend offers; from then on every message
//!   carries NEED_REPLY if REPLY_ACK was agreed. GET_QUEUE_NUM if MQ was agreed: a
//!   `queue_sizes` list longer than that is refused (the VM does not start). The queue count is
//!   the length of `queue_sizes`; nothing else checks it.
//! - **Config space reads** ([`GenericVhostUserDevice::read_config`]): one GET_CONFIG (flags 0)
//!   per guest access, at any time; a Linux driver's `virtio_cread_bytes` reads byte by byte.
//! - **Activation** when the guest driver sets DRIVER_OK ([`GenericVhostUserDevice::activate`]),
//!   for the queues the guest enabled: SET_FEATURES (what the guest acked, plus
//!   PROTOCOL_FEATURES, within the backend's), SET_MEM_TABLE with every RAM region (each its
//!   own memfd at offset 0), SET_VRING_NUM for every queue, GET_INFLIGHT_FD + SET_INFLIGHT_FD if
//!   INFLIGHT_SHMFD was agreed, then per queue SET_VRING_ADDR, SET_VRING_BASE (the avail index
//!   in guest memory), SET_VRING_CALL, SET_VRING_KICK; then SET_VRING_ENABLE 1 for every queue,
//!   SET_BACKEND_REQ_FD if BACKEND_REQ was agreed.
//! - **Memory hotplug** ([`GenericVhostUserDevice::add_memory_region`]): ADD_MEM_REG with the new
//!   region if CONFIGURE_MEM_SLOTS was agreed, else SET_MEM_TABLE with every region. The boot
//!   memory always goes through SET_MEM_TABLE; GET_MAX_MEM_SLOTS is never sent.
//! - **Device reset** by the guest ([`GenericVhostUserDevice::reset`]): per activated queue
//!   SET_VRING_ENABLE 0 and GET_VRING_BASE. The next DRIVER_OK activates again on the same
//!   connection.
//! - **Reconnect** when the socket hangs up after activation
//!   ([`GenericVhostUserDevice::reconnect`]): connect (retried every 100 ms, up to 60 s),
//!   SET_OWNER, GET_FEATURES, SET_PROTOCOL_FEATURES with the features agreed before (no
//!   GET_PROTOCOL_FEATURES, no GET_QUEUE_NUM, no GET_CONFIG), then the activation sequence with
//!   SET_VRING_BASE at each ring's current avail index (at the used index instead only with
//!   IN_ORDER and no inflight tracking; then it also kicks the queues with work pending).
//! - **VM shutdown**: the socket is closed; nothing is sent.
//!
//! Its vhost-user-net frontend (`--net vhost_user=true,socket=…`: virtio-devices'
//! `vhost_user::net` over the same control code; read at the main branch after v53.0, and
//! v53.0) is the same sequence with other features ([`GenericVhostUserDevice::create_net`]):
//! it offers the virtio-net features of [`NET_VMM_FEATURES`], asks for the protocol features
//! of [`net_protocol_features`] (GET_CONFIG at creation only if CONFIG was agreed), and the
//! backend gets vrings 0 (RX) and 1 (TX): cloud-hypervisor serves a control queue itself.
//! It never sends NET_SET_MTU; the MTU, MAC and status of the config space are its own.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserInflight, VhostUserProtocolFeatures,
    VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo};
use vhost_user_rdma::abi;

use crate::driver::Guest;
use crate::ram::GuestRam;
use crate::virtq::Virtq;

const F_INDIRECT_DESC: u64 = 1 << 28;
const F_EVENT_IDX: u64 = 1 << 29;
const F_VERSION_1: u64 = 1 << 32;
const F_ACCESS_PLATFORM: u64 = 1 << 33;
const F_RING_PACKED: u64 = 1 << 34;
const F_IN_ORDER: u64 = 1 << 35;
const F_ORDER_PLATFORM: u64 = 1 << 36;
const F_SR_IOV: u64 = 1 << 37;
const F_NOTIFICATION_DATA: u64 = 1 << 38;
const F_RING_RESET: u64 = 1 << 40;
const F_PROTOCOL_FEATURES: u64 = VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
const F_LOG_ALL: u64 = VhostUserVirtioFeatures::LOG_ALL.bits();

/// The virtio features cloud-hypervisor offers for a generic vhost-user device; the guest
/// sees those the backend offers too.
pub const VMM_VIRTIO_FEATURES: u64 = F_INDIRECT_DESC
    | F_EVENT_IDX
    | F_VERSION_1
    | F_IN_ORDER
    | F_ORDER_PLATFORM
    | F_NOTIFICATION_DATA
    | F_PROTOCOL_FEATURES
    | F_LOG_ALL;

const F_NET_CSUM: u64 = 1 << 0;
const F_NET_GUEST_CSUM: u64 = 1 << 1;
const F_NET_MTU: u64 = 1 << 3;
const F_NET_MAC: u64 = 1 << 5;
const F_NET_GUEST_TSO4: u64 = 1 << 7;
const F_NET_GUEST_TSO6: u64 = 1 << 8;
const F_NET_GUEST_ECN: u64 = 1 << 9;
const F_NET_GUEST_UFO: u64 = 1 << 10;
const F_NET_HOST_TSO4: u64 = 1 << 11;
const F_NET_HOST_TSO6: u64 = 1 << 12;
const F_NET_HOST_ECN: u64 = 1 << 13;
const F_NET_HOST_UFO: u64 = 1 << 14;
const F_NET_MRG_RXBUF: u64 = 1 << 15;
const F_NET_STATUS: u64 = 1 << 16;
const F_NET_CTRL_VQ: u64 = 1 << 17;
const F_NET_GUEST_ANNOUNCE: u64 = 1 << 21;
const F_NET_MQ: u64 = 1 << 22;

/// The virtio-net features both cloud-hypervisor's vhost-user-net frontend offers (offloads
/// on, as by default) and a Linux virtio_net driver acks.
const NET_FEATURES: u64 = F_NET_CSUM
    | F_NET_GUEST_CSUM
    | F_NET_MTU
    | F_NET_MAC
    | F_NET_GUEST_TSO4
    | F_NET_GUEST_TSO6
    | F_NET_GUEST_ECN
    | F_NET_GUEST_UFO
    | F_NET_HOST_TSO4
    | F_NET_HOST_TSO6
    | F_NET_HOST_ECN
    | F_NET_HOST_UFO
    | F_NET_MRG_RXBUF
    | F_NET_CTRL_VQ
    | F_NET_GUEST_ANNOUNCE
    | F_NET_MQ;

/// The virtio features cloud-hypervisor offers a vhost-user-net backend: the guest sees those
/// the backend offers, and MAC (and STATUS and GUEST_ANNOUNCE with a backend's CTRL_VQ) from
/// cloud-hypervisor itself.
pub const NET_VMM_FEATURES: u64 = VMM_VIRTIO_FEATURES | NET_FEATURES;

/// What a Linux virtio_net driver acks of a virtio-net device's features (its feature table
/// and the transport's).
pub const LINUX_NET_FEATURES: u64 = LINUX_TRANSPORT_FEATURES | NET_FEATURES | F_NET_STATUS;

/// The vhost-user protocol features cloud-hypervisor asks a vhost-user-net backend for.
pub fn net_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::INFLIGHT_SHMFD
        | VhostUserProtocolFeatures::LOG_SHMFD
        | VhostUserProtocolFeatures::DEVICE_STATE
        | VhostUserProtocolFeatures::CONFIG
}

/// The transport features a Linux guest acks when its driver's feature table is empty (the
/// virtio_rdma driver's is).
pub const LINUX_TRANSPORT_FEATURES: u64 = F_INDIRECT_DESC
    | F_EVENT_IDX
    | F_VERSION_1
    | F_ACCESS_PLATFORM
    | F_RING_PACKED
    | F_IN_ORDER
    | F_ORDER_PLATFORM
    | F_SR_IOV
    | F_NOTIFICATION_DATA
    | F_RING_RESET;

/// The vhost-user protocol features cloud-hypervisor asks a generic device for.
pub fn vmm_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::CONFIG
        | VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::INFLIGHT_SHMFD
        | VhostUserProtocolFeatures::LOG_SHMFD
        | VhostUserProtocolFeatures::DEVICE_STATE
        | VhostUserProtocolFeatures::BACKEND_REQ
}

/// One frontend message, as sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    /// The socket connection (not a message).
    Connect,
    SetOwner,
    GetFeatures,
    GetProtocolFeatures,
    /// The protocol features agreed.
    SetProtocolFeatures(u64),
    GetQueueNum,
    SetFeatures(u64),
    /// The number of regions.
    SetMemTable(usize),
    /// The region's first GPA.
    AddMemReg(u64),
    SetVringNum(usize, u16),
    GetInflightFd,
    SetInflightFd,
    SetVringAddr(usize),
    SetVringBase(usize, u16),
    SetVringCall(usize),
    SetVringKick(usize),
    SetVringEnable(usize, bool),
    SetBackendReqFd,
    GetConfig {
        offset: u32,
        size: u32,
    },
    GetVringBase(usize),
}

/// Why the frontend gave up.
#[derive(Debug)]
pub enum ChError {
    /// This message failed: the backend refused it (a REPLY_ACK error) or the connection broke.
    Message(Msg, vhost::Error),
    /// `queue_sizes` lists more queues than the backend has (cloud-hypervisor's BadQueueNum:
    /// the VM does not start).
    TooManyQueues { requested: usize, backend: u64 },
    /// No backend accepted the connection in time.
    ConnectTimeout,
    /// The guest side could not be built (guest memory).
    Guest(crate::error::Error),
    /// What the backend agreed needs a part of the frontend this replay does not have.
    NotReplayed(&'static str),
}

impl std::fmt::Display for ChError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
impl std::error::Error for ChError {}

impl From<crate::error::Error> for ChError {
    fn from(e: crate::error::Error) -> Self {
        ChError::Guest(e)
    }
}

pub type Result<T> = std::result::Result<T, ChError>;

/// A generic vhost-user device as cloud-hypervisor drives it, with every message it sent.
pub struct GenericVhostUserDevice {
    socket: PathBuf,
    fe: Frontend,
    queue_sizes: Vec<u16>,
    backend_features: u64,
    /// The virtio features the guest is offered (cloud-hypervisor's and the backend's).
    pub avail_features: u64,
    /// The virtio features acked so far: PROTOCOL_FEATURES from the start, then the guest's.
    pub acked_features: u64,
    /// The protocol features agreed at VM creation.
    pub acked_protocol_features: VhostUserProtocolFeatures,
    /// What GET_QUEUE_NUM answered.
    pub backend_queue_num: Option<u64>,
    /// The queues activated (SET_VRING_ENABLE 1 sent), for reset.
    queue_indexes: Vec<usize>,
    inflight: Option<(VhostUserInflight, std::fs::File)>,
    /// Every message sent, in order.
    pub log: Vec<Msg>,
}

/// Connects to `socket`, retrying every 100 ms while it does not exist or refuses, as
/// cloud-hypervisor does.
fn connect(socket: &Path, num_queues: usize, timeout: Duration) -> Result<Frontend> {
    let end = Instant::now() + timeout;
    loop {
        match Frontend::connect(socket, num_queues as u64) {
            Ok(fe) => return Ok(fe),
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(100)),
            Err(_) => return Err(ChError::ConnectTimeout),
        }
    }
}

impl GenericVhostUserDevice {
    fn step<T>(&mut self, m: Msg, r: vhost::Result<T>) -> Result<T> {
        self.log.push(m.clone());
        r.map_err(|e| ChError::Message(m, e))
    }

    /// VM creation with `--generic-vhost-user socket=…,queue_sizes=[…]`: the handshake up to
    /// the queue-count check. On error the connection is closed (the VM does not start).
    pub fn create(
        socket: &Path,
        queue_sizes: &[u16],
        timeout: Duration,
    ) -> Result<GenericVhostUserDevice> {
        Self::create_with(
            socket,
            queue_sizes,
            timeout,
            VMM_VIRTIO_FEATURES,
            vmm_protocol_features(),
        )
    }

    /// VM creation with `--net vhost_user=true,socket=…` (one queue pair, two vrings of 256):
    /// the same handshake with the virtio-net features, then GET_CONFIG of the 17-byte
    /// virtio-net config space if CONFIG was agreed.
    pub fn create_net(socket: &Path, timeout: Duration) -> Result<GenericVhostUserDevice> {
        let mut d = Self::create_with(
            socket,
            &[256, 256],
            timeout,
            NET_VMM_FEATURES,
            net_protocol_features(),
        )?;
        if d.acked_protocol_features
            .contains(VhostUserProtocolFeatures::CONFIG)
        {
            let r =
                d.fe.get_config(0, 17, VhostUserConfigFlags::WRITABLE, &[0u8; 17]);
            d.step(
                Msg::GetConfig {
                    offset: 0,
                    size: 17,
                },
                r,
            )?;
        }
        Ok(d)
    }

    fn create_with(
        socket: &Path,
        queue_sizes: &[u16],
        timeout: Duration,
        vmm_features: u64,
        vmm_protocol: VhostUserProtocolFeatures,
    ) -> Result<GenericVhostUserDevice> {
        let fe = connect(socket, queue_sizes.len(), timeout)?;
        let mut d = GenericVhostUserDevice {
            socket: socket.to_path_buf(),
            fe,
            queue_sizes: queue_sizes.to_vec(),
            backend_features: 0,
            avail_features: 0,
            acked_features: 0,
            acked_protocol_features: VhostUserProtocolFeatures::empty(),
            backend_queue_num: None,
            queue_indexes: Vec::new(),
            inflight: None,
            log: vec![Msg::Connect],
        };
        let r = d.fe.set_owner();
        d.step(Msg::SetOwner, r)?;
        let r = d.fe.get_features();
        d.backend_features = d.step(Msg::GetFeatures, r)?;
        d.avail_features = vmm_features & d.backend_features;
        if d.avail_features & F_PROTOCOL_FEATURES != 0 {
            let r = d.fe.get_protocol_features();
            let offered = d.step(Msg::GetProtocolFeatures, r)?;
            let agreed = vmm_protocol & offered;
            let r = d.fe.set_protocol_features(agreed);
            d.step(Msg::SetProtocolFeatures(agreed.bits()), r)?;
            d.acked_protocol_features = agreed;
        }
        if d.acked_protocol_features
            .contains(VhostUserProtocolFeatures::REPLY_ACK)
        {
            d.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        let backend = if d
            .acked_protocol_features
            .contains(VhostUserProtocolFeatures::MQ)
        {
            let r = d.fe.get_queue_num();
            let n = d.step(Msg::GetQueueNum, r)?;
            d.backend_queue_num = Some(n);
            n
        } else {
            queue_sizes.len() as u64
        };
        if queue_sizes.len() as u64 > backend {
            return Err(ChError::TooManyQueues {
                requested: queue_sizes.len(),
                backend,
            });
        }
        // The PROTOCOL_FEATURES bit stays acked: the guest never acks it.
        d.acked_features = d.avail_features & F_PROTOCOL_FEATURES;
        Ok(d)
    }

    /// A guest read of `len` bytes of config space at `offset`: one GET_CONFIG (0xff bytes
    /// without the CONFIG protocol feature; cloud-hypervisor panics on an error).
    pub fn read_config(&mut self, offset: u32, len: u32) -> Result<Vec<u8>> {
        if !self
            .acked_protocol_features
            .contains(VhostUserProtocolFeatures::CONFIG)
        {
            return Ok(vec![0xff; len as usize]);
        }
        let r = self.fe.get_config(
            offset,
            len,
            VhostUserConfigFlags::empty(),
            &vec![0u8; len as usize],
        );
        let (_, payload) = self.step(Msg::GetConfig { offset, size: len }, r)?;
        Ok(payload)
    }

    /// A Linux driver's `virtio_cread_bytes(offset, len)`: one one-byte read per byte.
    pub fn read_config_bytes(&mut self, offset: u32, len: u32) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(len as usize);
        for i in 0..len {
            out.extend(self.read_config(offset + i, 1)?);
        }
        Ok(out)
    }

    /// The features the guest ends up with when it acks `guest_acks` of those offered.
    pub fn guest_features(&self, guest_acks: u64) -> u64 {
        self.acked_features | (guest_acks & self.avail_features)
    }

    /// Activation at DRIVER_OK: the guest acked `guest_acks` and enabled `queues` (index,
    /// vring) in guest memory `ram`.
    pub fn activate(
        &mut self,
        ram: &GuestRam,
        guest_acks: u64,
        queues: &[(usize, &Virtq)],
    ) -> Result<()> {
        self.acked_features = self.guest_features(guest_acks);
        self.setup(ram, queues)
    }

    /// The setup cloud-hypervisor runs at activation and after a reconnect.
    fn setup(&mut self, ram: &GuestRam, queues: &[(usize, &Virtq)]) -> Result<()> {
        self.queue_indexes.clear();
        let features = self.acked_features & self.backend_features;
        let r = self.fe.set_features(features);
        self.step(Msg::SetFeatures(features), r)?;
        let regions = ram.memory_regions();
        let r = self.fe.set_mem_table(&regions);
        self.step(Msg::SetMemTable(regions.len()), r)?;
        for &(i, q) in queues {
            let r = self.fe.set_vring_num(i, q.size);
            self.step(Msg::SetVringNum(i, q.size), r)?;
        }
        if self
            .acked_protocol_features
            .contains(VhostUserProtocolFeatures::INFLIGHT_SHMFD)
        {
            if self.inflight.is_none() {
                let ask = VhostUserInflight {
                    mmap_size: 0,
                    mmap_offset: 0,
                    num_queues: queues.len() as u16,
                    queue_size: queues[0].1.size,
                };
                let r = self.fe.get_inflight_fd(&ask);
                let got = self.step(Msg::GetInflightFd, r)?;
                self.inflight = Some(got);
            }
            let (info, file) = self.inflight.as_ref().expect("just set");
            let r = self.fe.set_inflight_fd(info, file.as_raw_fd());
            self.step(Msg::SetInflightFd, r)?;
        }
        for &(i, q) in queues {
            let r = self.fe.set_vring_addr(i, &q.config());
            self.step(Msg::SetVringAddr(i), r)?;
            let base = avail_idx(ram, q);
            let r = self.fe.set_vring_base(i, base);
            self.step(Msg::SetVringBase(i, base), r)?;
            let r = self.fe.set_vring_call(i, &q.call);
            self.step(Msg::SetVringCall(i), r)?;
            let r = self.fe.set_vring_kick(i, &q.kick);
            self.step(Msg::SetVringKick(i), r)?;
            self.queue_indexes.push(i);
        }
        for i in self.queue_indexes.clone() {
            let r = self.fe.set_vring_enable(i, true);
            self.step(Msg::SetVringEnable(i, true), r)?;
        }
        if self
            .acked_protocol_features
            .contains(VhostUserProtocolFeatures::BACKEND_REQ)
        {
            self.log.push(Msg::SetBackendReqFd);
            return Err(ChError::NotReplayed("a backend request channel"));
        }
        Ok(())
    }

    /// The guest driver of a three-queue device: it acks the transport features a Linux guest
    /// knows, enables every queue at its full size, sets DRIVER_OK (activation), posts one
    /// event buffer per event-queue entry and reads the config space byte by byte, as the
    /// virtio_rdma driver's probe does.
    pub fn activate_guest(&mut self, ram: &Arc<GuestRam>) -> Result<Guest> {
        assert_eq!(self.queue_sizes.len(), abi::NUM_QUEUES);
        let acks = LINUX_TRANSPORT_FEATURES;
        let event_idx = self.guest_features(acks) & F_EVENT_IDX != 0;
        let qs = self
            .queue_sizes
            .iter()
            .map(|&n| Virtq::new(ram, n, event_idx))
            .collect::<crate::error::Result<Vec<_>>>()?;
        let refs: Vec<(usize, &Virtq)> = qs.iter().enumerate().collect();
        self.activate(ram, acks, &refs)?;
        let ev_n = qs[abi::VQ_EVENT as usize].size;
        let mut g = Guest::assemble(
            self.fe.clone(),
            ram.clone(),
            qs,
            abi::ConfigSpace::default(),
            ev_n,
        )?;
        let sz = std::mem::size_of::<abi::ConfigSpace>() as u32;
        let bytes = self.read_config_bytes(0, sz)?;
        g.config = abi::read_struct(&bytes).expect("config space size");
        Ok(g)
    }

    /// A driver reload on the same connection ([`GenericVhostUserDevice::reset`] first): fresh
    /// rings at 0, activation again, event buffers posted, the config space read.
    pub fn reactivate_guest(&mut self, g: &mut Guest) -> Result<()> {
        let acks = LINUX_TRANSPORT_FEATURES;
        let event_idx = self.guest_features(acks) & F_EVENT_IDX != 0;
        let mut qs = self
            .queue_sizes
            .iter()
            .map(|&n| Virtq::new(&g.ram, n, event_idx))
            .collect::<crate::error::Result<Vec<_>>>()?;
        {
            let refs: Vec<(usize, &Virtq)> = qs.iter().enumerate().collect();
            self.activate(&g.ram, acks, &refs)?;
        }
        g.ev = qs.pop().expect("3 queues");
        g.db = qs.pop().expect("3 queues");
        g.db.interrupts = false;
        g.ctrl = qs.pop().expect("3 queues");
        g.pending_events.clear();
        for i in 0..g.ev_n.min(g.ev.size) as u64 {
            g.ev.add(&[(g.ev_bufs + 16 * i, 16, true)]);
        }
        let sz = std::mem::size_of::<abi::ConfigSpace>() as u32;
        let bytes = self.read_config_bytes(0, sz)?;
        g.config = abi::read_struct(&bytes).expect("config space size");
        Ok(())
    }

    /// A device reset by the guest: per activated queue SET_VRING_ENABLE 0 and
    /// GET_VRING_BASE. Returns the bases.
    pub fn reset(&mut self) -> Result<Vec<u32>> {
        let mut bases = Vec::new();
        for i in std::mem::take(&mut self.queue_indexes) {
            let r = self.fe.set_vring_enable(i, false);
            self.step(Msg::SetVringEnable(i, false), r)?;
            let r = self.fe.get_vring_base(i);
            bases.push(self.step(Msg::GetVringBase(i), r)?);
        }
        Ok(bases)
    }

    /// Memory hotplug of `region`.
    pub fn add_memory_region(
        &mut self,
        ram: &GuestRam,
        region: &VhostUserMemoryRegionInfo,
    ) -> Result<()> {
        if self
            .acked_protocol_features
            .contains(VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS)
        {
            let r = self.fe.add_mem_region(region);
            self.step(Msg::AddMemReg(region.guest_phys_addr), r)?;
        } else {
            let regions = ram.memory_regions();
            let r = self.fe.set_mem_table(&regions);
            self.step(Msg::SetMemTable(regions.len()), r)?;
        }
        Ok(())
    }

    /// Waits until the backend's end of the socket is closed (what cloud-hypervisor's device
    /// thread waits for, EPOLLHUP, before it reconnects).
    pub fn wait_hangup(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        loop {
            let mut p = libc::pollfd {
                fd: self.fe.as_raw_fd(),
                events: 0,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut p, 1, 50) };
            if p.revents & libc::POLLHUP != 0 {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
        }
    }

    /// The reconnect after a hangup, for a running guest `g`: a new connection (the old one
    /// is dropped), the features agreed before, and the rings where the guest has them.
    pub fn reconnect(&mut self, g: &mut Guest, timeout: Duration) -> Result<()> {
        self.fe = connect(&self.socket, self.queue_sizes.len(), timeout)?;
        self.log.push(Msg::Connect);
        let r = self.fe.set_owner();
        self.step(Msg::SetOwner, r)?;
        let r = self.fe.get_features();
        self.backend_features = self.step(Msg::GetFeatures, r)?;
        if self.acked_features & F_PROTOCOL_FEATURES != 0 {
            let agreed = self.acked_protocol_features;
            let r = self.fe.set_protocol_features(agreed);
            self.step(Msg::SetProtocolFeatures(agreed.bits()), r)?;
            if agreed.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                self.fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
            }
        }
        if self.acked_features & F_IN_ORDER != 0 && self.inflight.is_none() {
            return Err(ChError::NotReplayed("IN_ORDER ring positions"));
        }
        {
            let ram = g.ram.clone();
            let refs = [(0, &g.ctrl), (1, &g.db), (2, &g.ev)];
            self.setup(&ram, &refs)?;
        }
        g.fe = self.fe.clone();
        Ok(())
    }

    /// The vhost-user connection (for messages this replay does not send on its own).
    pub fn frontend(&mut self) -> &mut Frontend {
        &mut self.fe
    }
}

/// The avail index of `q` in guest memory (what the guest made available so far).
fn avail_idx(ram: &GuestRam, q: &Virtq) -> u16 {
    ram.atomic_u16(q.avail + 2).load(Ordering::Acquire)
}

/// (avail index, used index) of each of the guest's rings as guest memory has them.
pub fn ring_positions(g: &Guest) -> [(u16, u16); 3] {
    let pos = |q: &Virtq| {
        (
            avail_idx(&g.ram, q),
            g.ram.atomic_u16(q.used + 2).load(Ordering::Acquire),
        )
    };
    [pos(&g.ctrl), pos(&g.db), pos(&g.ev)]
}
