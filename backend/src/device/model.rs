//! The device model: the engine plus what the guest's rings and objects look like from the
//! device side. Everything here is testable without a socket: give it a `GuestMemoryMmap`.
//!
//! ```text
//!  control vq ──► handle_ctrl ─┐
//!  doorbell vq ─► doorbell ────┤                ┌─► transmit (UDP)
//!  UDP socket ──► handle_packet┼─► rxe-core ────┤
//!  timerfd ─────► handle_timeout┘   Device       └─► pump: CQEs → CQ rings, events → event vq
//! ```

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use rxe_core::device::{DeviceConfig, QpInit, RecvMeta};
use rxe_core::mem::MwType;
use rxe_core::verbs::*;
use rxe_core::{Device, Gid, Instant, Qpn, VerbError};
use vm_memory::ByteValued;

use crate::abi::{self, op, ring as hdr, Status};
use crate::device::ring::{self, Ring, SqCaps};
use crate::memory::guest_mem::{resolve_page_list, GuestMemoryMmap};
use crate::transport::sink::PacketSink;

mod commands;
mod mr;
mod raw;
mod shard;
mod xrc;
use shard::route;
pub use shard::ShardHandle;

/// The smallest buffer a packet is built in while the sink takes payload references: one
/// of path MTU 4096 and its headers (a segment's buffer is larger:
/// [`PacketSink::segment`]).
const PACKET_BUF: usize = 4096 + rxe_core::device::SEGMENT_HEADROOM;

/// Packets one [`Model::pump`] sends at most before it returns, so that doorbells, received
/// packets, timers and control commands are served between the slices of a long READ
/// response or a deep send queue. About 1 ms of work at 1 µs a packet.
pub const TX_BUDGET: usize = 1024;
/// The destination QPN of UD multicast (IBTA 10.5.2.3: every QP attached to the group).
const MULTICAST_QPN: u32 = 0xff_ffff;

/// Why [`Model::pump`] returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pump {
    /// The engine has nothing more to send now.
    Idle,
    /// The packet budget is spent and work remains: pump again soon, after other events.
    Budget,
    /// The sink is [`PacketSink::blocked`]: pump again once the socket is writable.
    Blocked,
}

pub use crate::device::events::MAX_PENDING_EVENTS;
use crate::device::events::{EventQueue, Pushed};
use crate::sync::{lock, read, write};

/// Bytes of REG_MR page lists one QP may hold for WQEs taken from its ring and not yet
/// executed: one largest list (2^20 pages of 8 bytes). A REG_MR that would take the QP beyond
/// it waits in the ring until the QP's earlier REG_MRs have executed.
pub const MAX_QP_REG_MR_LIST_BYTES: u64 = (1 << 20) * 8;

/// Default cap on the page lists the device keeps, all objects together.
pub const DEFAULT_MAX_PAGE_LIST_BYTES: u64 = 64 << 20;

/// Bytes of `n` page-list entries.
fn list_bytes(n: usize) -> u64 {
    n as u64 * 8
}

/// The page lists the device keeps, in bytes (8 a page), against its cap: ring lists (CQs,
/// QPs, SRQs), REG_USER_MR lists, ALLOC_MR's `max_num_sg` (reserved at allocation, so a fast
/// registration never needs more) and the lists of REG_MR WQEs taken and not yet executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageListBudget {
    pub cap: u64,
    pub used: u64,
}

impl PageListBudget {
    pub fn new(cap: u64) -> Self {
        PageListBudget { cap, used: 0 }
    }
    /// Whether `bytes` more fit under the cap.
    pub fn fits(&self, bytes: u64) -> bool {
        self.used.checked_add(bytes).is_some_and(|t| t <= self.cap)
    }
    /// Takes `bytes`; NO_MEMORY beyond the cap.
    pub fn charge(&mut self, bytes: u64) -> Result<(), Status> {
        if !self.fits(bytes) {
            return Err(Status::NoMemory);
        }
        self.used += bytes;
        Ok(())
    }
    pub fn release(&mut self, bytes: u64) {
        self.used = self.used.saturating_sub(bytes);
    }
}

/// Heap bytes the engine holds for one send WQE of a QP with `caps`, at most: the work request
/// and the engine's progress words beside it, its scatter list when longer than the engine
/// keeps in place, and its inline data. Charged to the device's WQE budget
/// ([`ModelConfig::max_wqe_bytes`]) for every send WQE taken from a ring until it completes:
/// a guest that parks WQEs (behind a fence, towards a dead peer) holds at most that much of
/// the host's heap, not `max_qp` × `max_qp_wr` of them.
fn send_wqe_bytes(caps: &QpCap) -> u64 {
    let base = std::mem::size_of::<rxe_core::verbs::SendWr>() as u64 + 32;
    let sges = if caps.max_send_sge as usize > rxe_core::verbs::SgList::INLINE {
        caps.max_send_sge as u64 * std::mem::size_of::<rxe_core::verbs::Sge>() as u64
    } else {
        0
    };
    base + sges + caps.max_inline_data as u64
}

/// What an MR holds of the page-list budget: a user MR its list, a fast-registration MR
/// its `max_num_sg` (whatever it maps now).
fn mr_list_bytes(mr: &rxe_core::mem::Mr) -> u64 {
    use rxe_core::mem::{Backing, MrKind};
    match (&mr.kind, &mr.backing) {
        (MrKind::FastReg { max_pages }, _) => list_bytes(*max_pages as usize),
        (MrKind::User, Backing::Pages { pages, .. }) => list_bytes(pages.len()),
        (MrKind::User, Backing::Odp { entries, .. }) => list_bytes(entries.len()),
        (MrKind::User, Backing::OdpImplicit { entries, .. }) => list_bytes(entries.len()),
        _ => 0,
    }
}

/// Device-side counters beyond the engine's.
#[derive(Clone, Copy, Debug, Default)]
pub struct ModelStats {
    pub ctrl_cmds: u64,
    pub ctrl_errors: u64,
    pub doorbells: u64,
    pub bad_doorbells: u64,
    pub bad_wqes: u64,
    pub ring_faults: u64,
    pub cq_overflows: u64,
    pub events_raised: u64,
    pub events_dropped: u64,
    pub sq_wqes: u64,
    pub rq_wqes: u64,
    pub cqes: u64,
    /// Times a REG_MR WQE was left in its ring because its QP held its cap of page lists.
    pub reg_mr_waits: u64,
    /// Segments built for a device reached in memory that the sink then sent toward the
    /// wire, where they cannot go: lost (the requester sends them again).
    pub tx_lost_segments: u64,
    /// Times a ring's send WQEs waited because the device's WQE budget was spent.
    pub wqe_budget_waits: u64,
    /// UPDATE_ODP commands that mapped or failed pages (each wakes the QPs waiting).
    pub odp_updates: u64,
    /// Frames a flow steered to a raw packet QP that could not take them (no receive).
    pub raw_dropped: u64,
}

impl ModelStats {
    /// Adds `o`'s counts to these.
    pub fn add(&mut self, o: &ModelStats) {
        self.ctrl_cmds += o.ctrl_cmds;
        self.ctrl_errors += o.ctrl_errors;
        self.doorbells += o.doorbells;
        self.bad_doorbells += o.bad_doorbells;
        self.bad_wqes += o.bad_wqes;
        self.ring_faults += o.ring_faults;
        self.cq_overflows += o.cq_overflows;
        self.events_raised += o.events_raised;
        self.events_dropped += o.events_dropped;
        self.sq_wqes += o.sq_wqes;
        self.rq_wqes += o.rq_wqes;
        self.cqes += o.cqes;
        self.reg_mr_waits += o.reg_mr_waits;
        self.tx_lost_segments += o.tx_lost_segments;
        self.raw_dropped += o.raw_dropped;
        self.wqe_budget_waits += o.wqe_budget_waits;
        self.odp_updates += o.odp_updates;
    }
}

#[derive(Debug)]
struct QpShadow {
    qp_type: QpType,
    sq: Option<Ring>,
    rq: Option<Ring>,
    /// SQ consumer index as published: the oldest WQE not yet completed (rxe semantics).
    sq_cons: u32,
    /// Next SQ slot to take into the engine (`sq_cons` + the engine's outstanding WQEs).
    sq_taken: u32,
    /// RQ consumer index as published: the oldest receive not yet completed (rxe semantics:
    /// the slot of a receive still in use is not the guest's to overwrite, and a driver that
    /// must complete the ring's receives itself knows where they start).
    rq_cons: u32,
    /// Next RQ slot to take into the engine (`rq_cons` + the engine's outstanding receives).
    rq_taken: u32,
    recv_cq: u32,
    srq: Option<u32>,
    caps: QpCap,
    pd: u32,
    /// CREATE_QP_KERNEL: the only QPs whose SQ may carry REG_MR.
    kernel: bool,
    /// A ring of this QP faulted: it went to ERR with QP_FATAL (once).
    faulted: bool,
    /// Page-list bytes of the rings.
    list_bytes: u64,
    /// REG_MR page-list bytes the engine holds for this QP, as last charged to the budget.
    reg_mr_held: u64,
    /// Heap bytes of its send WQEs the engine holds ([`send_wqe_bytes`] each), as charged to
    /// the WQE budget.
    wqe_held: u64,
}

#[derive(Debug)]
struct CqShadow {
    ring: Ring,
    prod: u32,
    overflowed: bool,
}

/// Completions [`Shard::flush_cq`] takes from the engine at a time.
const CQE_BATCH: usize = 64;

fn ring_list_bytes(r: &Ring) -> u64 {
    list_bytes(r.buf.pages.len())
}

#[derive(Debug)]
struct SrqShadow {
    ring: Ring,
    cons: u32,
    max_sge: u32,
}

/// Limits and identity beyond the engine's `DeviceConfig`.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub dev: DeviceConfig,
    pub netdev_mtu: u32,
    /// Cap on the page lists the device keeps ([`PageListBudget`]); a power of two (the
    /// config space states it as log2).
    pub max_page_list_bytes: u64,
    /// REG_DMA_MR may grant remote rights (or MW_BIND, through which a window could): a
    /// key that reaches every byte of guest memory from the network. Off unless the operator
    /// asks for it.
    pub allow_remote_dma_mr: bool,
    /// Destinations address vectors may name (CREATE_AH, MODIFY_QP's AV).
    pub egress: crate::transport::egress::EgressPolicy,
    /// Engine shards (`--engine-shards`, 1 to 64): QPs are spread over them.
    pub shards: u32,
    /// Cap on the heap bytes of the send WQEs the engine holds for the device
    /// (`--max-wqe-bytes`): beyond it, WQEs wait in the guest's rings until others complete.
    pub max_wqe_bytes: u64,
    /// The QPs live now, kept for the transport's receive checks (shared with it; emptied
    /// by a new model and by a reset).
    pub live_qpns: Option<Arc<crate::transport::live_qpns::LiveQpns>>,
    /// The multicast groups the QPs are attached to, for the udp transport to join.
    pub mcast: Option<Arc<crate::transport::mcast::Groups>>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            dev: DeviceConfig::default(),
            netdev_mtu: 1500,
            max_page_list_bytes: DEFAULT_MAX_PAGE_LIST_BYTES,
            allow_remote_dma_mr: false,
            egress: Default::default(),
            shards: 1,
            max_wqe_bytes: DEFAULT_MAX_WQE_BYTES,
            live_qpns: None,
            mcast: None,
        }
    }
}

/// `--max-wqe-bytes`' default: 256 MiB, some 200 000 WQEs of 32 SGEs and 512 inline bytes.
pub const DEFAULT_MAX_WQE_BYTES: u64 = 256 << 20;

/// Rights of a DMA MR that reach it from the network: remote access, the FLUSH targets, and
/// MW_BIND (a window bound to it would carry remote rights).
const DMA_MR_REMOTE_RIGHTS: Access = Access(
    Access::REMOTE.0 | Access::MW_BIND.0 | Access::FLUSH_GLOBAL.0 | Access::FLUSH_PERSISTENT.0,
);

/// A device: its engine in `ModelConfig::shards` shards, each with the QPs it holds and
/// their ring shadows behind a lock of its own, and what the shards share ([`Common`]).
/// The control path takes the lock of a QP's shard for a QP command; a packet, a doorbell
/// or a pump for a QP takes that shard's lock and, to write completions, one CQ's.
pub struct Model {
    common: Arc<Common>,
    shards: Vec<Arc<Mutex<Shard>>>,
    /// The shard the next QP goes to.
    next_shard: usize,
    /// The shard [`Self::pump_budget`] pumps first.
    tx_shard: usize,
    /// Shards another thread drives (`--shard-threads`): this model's pumps and timers
    /// leave them out.
    remote: u64,
    /// Remote shards this model worked on since [`Self::take_touched`]: their threads must
    /// look at them (a doorbell pulled WQEs, a packet came on another shard's socket).
    touched: std::cell::Cell<u64>,
    cfg: ModelConfig,
    /// The control path's counters (the shards keep their own).
    stats: ModelStats,
    /// A control command freed an object since [`Model::clear_released`].
    released: bool,
    /// GIDs the transport can send from. Empty: no restriction.
    source_gids: Vec<Gid>,
    /// The GID table changed since [`Model::take_changed_gids`] last looked.
    gids_changed: bool,
    /// GID table entries the transport cannot send from (index → GID): listed, so the guest's
    /// table is what its netdev has, but an address vector that names one is refused.
    listed_gids: std::collections::BTreeMap<u32, Gid>,
    /// The port's state as QUERY_PORT reports it: ACTIVE, or DOWN while the link under the
    /// transport is down or its socket keeps failing ([`Self::set_port_active`]).
    port_active: bool,
    /// Times the port went DOWN (QUERY_STATS' `link_downed`).
    link_downed: u64,
    /// The counters of the QPs destroyed so far (QUERY_STATS adds the live ones').
    retired: rxe_core::QpCounters,
}

/// What the shards of a device share: the CQ and SRQ shadows, each behind its own lock (a
/// CQ may take the completions of QPs of several shards), the events waiting for the
/// guest, the page-list budget. Lock order: a shard, then one CQ or SRQ shadow, then the
/// events or the budget; never two shards, never the table locks while holding a shadow.
struct Common {
    cqs: RwLock<HashMap<u32, Arc<Mutex<CqShadow>>>>,
    srqs: RwLock<HashMap<u32, Arc<Mutex<SrqShadow>>>>,
    events: Mutex<Events>,
    lists: Mutex<PageListBudget>,
    /// The send WQEs the engine holds, in heap bytes ([`send_wqe_bytes`]): an atomic, as it
    /// changes with every WQE taken (the cap is `wqe_cap`).
    wqes: AtomicU64,
    wqe_cap: u64,
    /// Per shard: CQs that overflowed while another shard wrote them; the shard moves its
    /// QPs using them to ERR at its next pump ([`Shard::apply_overflows`]).
    overflowed: Vec<Mutex<Vec<u32>>>,
}

/// Events waiting for an event-queue buffer, and what became of those raised.
#[derive(Default)]
struct Events {
    q: EventQueue,
    raised: u64,
    dropped: u64,
}

/// One engine shard and the shadows of the QPs it holds.
struct Shard {
    /// Its index in [`Model::shards`].
    k: usize,
    dev: Device,
    qps: HashMap<u32, QpShadow>,
    sq_backlog: BTreeSet<u32>,
    /// QPs with send WQEs in the engine: their SQ consumer index follows completions.
    sq_active: BTreeSet<u32>,
    /// QPs with receives taken from their RQ ring and not yet completed.
    rq_active: BTreeSet<u32>,
    stats: ModelStats,
    /// The members of a multicast group a packet is for (kept between packets).
    mcast_scratch: Vec<rxe_core::Qpn>,
    /// [`Shard::flush_cq`]'s batch of completions.
    cqe_scratch: Vec<rxe_core::verbs::Cqe>,
    /// The payload references of the packet being built ([`Shard::transmit`]).
    refs_scratch: std::cell::RefCell<Vec<crate::memory::payload_ref::PayloadRef>>,
    /// Where packets are built while the sink takes payload references: room for a
    /// segment of [`PacketSink::segment`] bytes, allocated on first use.
    seg_buf: Vec<u8>,
    slot: Vec<u8>,
    /// Scratch list of object numbers (no allocation per pass).
    scratch: Vec<u32>,
    /// Raw packet QPs' flows and frames (in shard [`raw::SHARD`] only).
    raw: raw::RawState,
}

impl Common {
    fn new(shards: usize, lists: u64, wqes: u64) -> Self {
        Common {
            cqs: Default::default(),
            srqs: Default::default(),
            events: Default::default(),
            lists: Mutex::new(PageListBudget::new(lists)),
            wqes: AtomicU64::new(0),
            wqe_cap: wqes,
            overflowed: (0..shards).map(|_| Mutex::default()).collect(),
        }
    }

    fn cq(&self, cqn: u32) -> Option<Arc<Mutex<CqShadow>>> {
        read(&self.cqs).get(&cqn).cloned()
    }

    fn srq(&self, srqn: u32) -> Option<Arc<Mutex<SrqShadow>>> {
        read(&self.srqs).get(&srqn).cloned()
    }

    fn lists(&self) -> MutexGuard<'_, PageListBudget> {
        lock(&self.lists)
    }

    /// Whether `bytes` more of send WQEs fit under the cap.
    fn wqes_fit(&self, bytes: u64) -> bool {
        self.wqes.load(Ordering::Relaxed) + bytes <= self.wqe_cap
    }

    fn wqes_charge(&self, bytes: u64) {
        self.wqes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn wqes_release(&self, bytes: u64) {
        self.wqes.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn push_event(&self, kind: u32, event: u32, object: u32) {
        let reserved = 0;
        self.push(abi::Event {
            kind,
            event,
            object,
            reserved,
        })
    }

    fn push(&self, e: abi::Event) {
        let mut ev = lock(&self.events);
        match ev.q.push(e) {
            Pushed::Queued => ev.raised += 1,
            Pushed::Merged => {}
            Pushed::Dropped => ev.dropped += 1,
        }
    }
}

fn verr(e: VerbError) -> Status {
    match e {
        VerbError::Invalid => Status::Invalid,
        VerbError::NoResources => Status::NoMemory,
        VerbError::NotFound => Status::NotFound,
        VerbError::Busy => Status::Busy,
        VerbError::BadState => Status::BadState,
    }
}

type CmdResult = Result<Vec<u8>, Status>;

fn body<T: ByteValued>(v: T) -> CmdResult {
    Ok(v.as_slice().to_vec())
}

/// Size of the response struct of each opcode (0 for commands that return only a header).
pub fn resp_size(opcode: u32) -> usize {
    use std::mem::size_of;
    match opcode {
        op::QUERY_DEVICE => size_of::<abi::ConfigSpace>(),
        op::QUERY_PORT => size_of::<abi::RespQueryPort>(),
        op::CREATE_PD => size_of::<abi::Handle>(),
        op::CREATE_CQ => size_of::<abi::RespCreateCq>(),
        op::RESIZE_CQ => size_of::<abi::RespCreateCq>(),
        op::CREATE_QP => size_of::<abi::RespCreateQp>(),
        op::QUERY_QP => size_of::<abi::QpAttrs>(),
        op::CREATE_SRQ | op::CREATE_XRC_SRQ => size_of::<abi::RespCreateSrq>(),
        op::ALLOC_XRCD | op::CREATE_FLOW => size_of::<abi::Handle>(),
        op::QUERY_SRQ | op::RESIZE_SRQ => size_of::<abi::RespQuerySrq>(),
        op::REG_USER_MR | op::REG_DMA_MR | op::ALLOC_MR | op::REREG_MR => size_of::<abi::RespMr>(),
        op::ALLOC_MW | op::BIND_MW => size_of::<abi::RespMr>(),
        op::CREATE_AH => size_of::<abi::Handle>(),
        op::QUERY_GID_SOURCES => size_of::<abi::RespGidSources>(),
        _ => 0,
    }
}

fn cmd<T: ByteValued + Default>(b: &[u8]) -> Result<T, Status> {
    abi::read_struct(b).ok_or(Status::BadRequest)
}

fn to_av(a: &abi::AhAttr) -> Av {
    Av {
        dgid: Gid(a.dgid),
        sgid_index: a.sgid_index,
        flow_label: a.flow_label & 0xf_ffff,
        traffic_class: a.traffic_class,
        hop_limit: a.hop_limit,
        dmac: a.dmac,
    }
}

fn from_av(a: &Av) -> abi::AhAttr {
    abi::AhAttr {
        dgid: a.dgid.0,
        flow_label: a.flow_label,
        sgid_index: a.sgid_index,
        hop_limit: a.hop_limit,
        traffic_class: a.traffic_class,
        dmac: a.dmac,
        port_num: 1,
        ..Default::default()
    }
}

fn qp_state(v: u32) -> Option<QpState> {
    Some(match v {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

/// Converts the wire attributes, checking the enumerations the mask selects.
fn to_qp_attr(w: &abi::QpAttrs) -> Result<QpAttr, Status> {
    let m = AttrMask(w.attr_mask);
    let st = |v, bit| {
        if m.has(bit) {
            qp_state(v).ok_or(Status::Invalid)
        } else {
            Ok(QpState::Reset)
        }
    };
    let path_mtu = if m.has(AttrMask::PATH_MTU) {
        Mtu::from_enum(w.path_mtu as u8)
            .filter(|_| w.path_mtu <= 5)
            .ok_or(Status::Invalid)?
    } else {
        Mtu::M256
    };
    Ok(QpAttr {
        qp_state: st(w.qp_state, AttrMask::STATE)?,
        cur_qp_state: st(w.cur_qp_state, AttrMask::CUR_STATE)?,
        path_mtu,
        qkey: w.qkey,
        rq_psn: w.rq_psn & 0xff_ffff,
        sq_psn: w.sq_psn & 0xff_ffff,
        dest_qp_num: w.dest_qp_num & 0xff_ffff,
        qp_access_flags: Access(w.qp_access_flags & !abi::ACCESS_IGNORED),
        av: to_av(&w.ah),
        pkey_index: w.pkey_index,
        en_sqd_async_notify: w.en_sqd_async_notify != 0,
        max_rd_atomic: w.max_rd_atomic,
        max_dest_rd_atomic: w.max_dest_rd_atomic,
        min_rnr_timer: w.min_rnr_timer,
        port_num: w.port_num,
        timeout: w.timeout,
        retry_cnt: w.retry_cnt,
        rnr_retry: w.rnr_retry,
        sq_draining: false,
    })
}

impl Model {
    pub fn new(cfg: ModelConfig) -> Self {
        cfg.live_qpns.iter().for_each(|q| q.clear());
        cfg.mcast.iter().for_each(|g| g.publish(Vec::new()));
        let devs = Device::new_sharded(cfg.dev.clone(), cfg.shards);
        let n = devs.len();
        Model {
            common: Arc::new(Common::new(n, cfg.max_page_list_bytes, cfg.max_wqe_bytes)),
            shards: devs
                .into_iter()
                .enumerate()
                .map(|(k, dev)| Arc::new(Mutex::new(Shard::new(k, dev))))
                .collect(),
            next_shard: 0,
            tx_shard: 0,
            remote: 0,
            touched: Default::default(),
            stats: ModelStats::default(),
            released: false,
            source_gids: Vec::new(),
            gids_changed: false,
            listed_gids: Default::default(),
            port_active: true,
            link_downed: 0,
            retired: Default::default(),
            cfg,
        }
    }

    /// The shard that holds QP `qpn`, locked.
    fn shard(&self, qpn: u32) -> MutexGuard<'_, Shard> {
        let n = self.shards.len() as u32;
        let k = Device::shard_of(Qpn(qpn), n) as usize;
        self.touch(1 << k);
        lock(&self.shards[k])
    }

    fn touch(&self, shards: u64) {
        self.touched
            .set(self.touched.get() | (shards & self.remote));
    }

    /// Hands shards `1..` to threads of their own ([`ShardHandle`]): from now on this
    /// model's pumps and timers run shard 0 only, and [`Self::take_touched`] says which of
    /// the others it worked on.
    pub fn hand_out_shards(&mut self) -> Vec<ShardHandle> {
        let n = self.shards.len();
        self.remote = ((1u128 << n) - 2) as u64;
        (1..n)
            .map(|k| ShardHandle {
                k,
                common: self.common.clone(),
                shards: self.shards.clone(),
            })
            .collect()
    }

    /// The shards driven by other threads that this model worked on since the last call,
    /// a bit each: their threads must pump them.
    pub fn take_touched(&self) -> u64 {
        self.touched.replace(0)
    }

    /// Whether shard `k` is this model's to pump.
    fn local(&self, k: usize) -> bool {
        self.remote & (1 << k) == 0
    }

    /// A shard for what all of them share (PDs, MRs, AHs, GIDs, CQs, SRQs), locked.
    fn any(&self) -> MutexGuard<'_, Shard> {
        lock(&self.shards[0])
    }

    /// Device reset: every object destroyed, every ring forgotten.
    pub fn reset(&mut self) {
        // A new device instance draws new key bytes and a new first QPN: the objects the
        // driver re-creates are not named as the ones before the reset were.
        if let Some(s) = self.cfg.dev.seed.as_mut() {
            *s = rxe_core::types::Rng::new(*s).next_u64();
        }
        if let Some(q) = &self.cfg.live_qpns {
            q.clear();
        }
        // A new device instance counts from zero, as the one the guest probes again.
        self.retired = Default::default();
        self.link_downed = 0;
        let devs = Device::new_sharded(self.cfg.dev.clone(), self.cfg.shards);
        for (s, dev) in self.shards.iter().zip(devs) {
            let mut s = lock(s);
            let k = s.k;
            let stats = s.stats;
            *s = Shard::new(k, dev);
            s.stats = stats;
        }
        write(&self.common.cqs).clear();
        write(&self.common.srqs).clear();
        lock(&self.common.events).q.clear();
        self.common.lists().used = 0;
        self.common.wqes.store(0, Ordering::Relaxed);
        for o in &self.common.overflowed {
            lock(o).clear();
        }
        self.listed_gids.clear();
        self.gids_changed = true;
    }

    /// The distinct GIDs of the table, when it changed since the last call (ADD_GID,
    /// DEL_GID, a reset): a transport that follows the guest's addresses takes them.
    pub fn take_changed_gids(&mut self) -> Option<Vec<Gid>> {
        if !std::mem::take(&mut self.gids_changed) {
            return None;
        }
        Some(self.any().dev.gid_set())
    }

    /// The page lists the device keeps against its cap.
    pub fn page_lists(&self) -> PageListBudget {
        *self.common.lists()
    }

    /// The send-WQE budget: heap bytes held now and the cap (`--max-wqe-bytes`).
    pub fn wqe_budget(&self) -> PageListBudget {
        PageListBudget {
            cap: self.common.wqe_cap,
            used: self.common.wqes.load(Ordering::Relaxed),
        }
    }

    /// Number of live objects (QPs, CQs, SRQs): for leak checks.
    pub fn object_counts(&self) -> (usize, usize, usize) {
        let qps = self.shards.iter().map(|s| lock(s).qps.len()).sum();
        (
            qps,
            read(&self.common.cqs).len(),
            read(&self.common.srqs).len(),
        )
    }

    pub fn qpns(&self) -> Vec<u32> {
        let mut v: Vec<u32> = Vec::new();
        for s in &self.shards {
            v.extend(lock(s).qps.keys().copied());
        }
        v.sort_unstable();
        v
    }

    /// The device's counters: the control path's and every shard's, added up.
    pub fn stats(&self) -> ModelStats {
        let mut t = self.stats;
        for s in &self.shards {
            t.add(&lock(s).stats);
        }
        let ev = lock(&self.common.events);
        t.events_raised += ev.raised;
        t.events_dropped += ev.dropped;
        t
    }

    /// Whether events wait for an event-queue buffer.
    pub fn has_events(&self) -> bool {
        !lock(&self.common.events).q.is_empty()
    }

    /// Events waiting for an event-queue buffer.
    pub fn events_len(&self) -> usize {
        lock(&self.common.events).q.len()
    }

    /// The oldest event waiting for an event-queue buffer.
    pub fn pop_event(&self) -> Option<abi::Event> {
        lock(&self.common.events).q.pop()
    }

    /// The GIDs the transport sends from (the udp transport: its bound address). From then
    /// on ADD_GID takes only these, and QUERY_GID_SOURCES lists them.
    pub fn set_source_gids(&mut self, gids: Vec<Gid>) {
        self.source_gids = gids;
        self.source_gids.truncate(abi::MAX_GID_SOURCES);
    }

    pub fn config_space(&self) -> abi::ConfigSpace {
        let c = &self.cfg.dev;
        abi::ConfigSpace {
            version: abi::VERSION,
            caps: abi::caps::CQ_NOTIFY_WORD
                | abi::caps::MULTI_LEVEL_PAGE_LIST
                | abi::caps::FAST_REG
                | abi::caps::MEM_WINDOW
                | abi::caps::SRQ
                | abi::caps::MR_PAGE_OFFSET
                | abi::caps::SRQ_RESIZE
                | abi::caps::HW_STATS
                | abi::caps::ODP
                | abi::caps::REREG_MR
                | abi::caps::IMPLICIT_ODP
                | abi::caps::XRC
                | abi::caps::RAW_PACKET
                | abi::caps::RSS
                | if self.source_gids.is_empty() {
                    0
                } else {
                    abi::caps::GID_SOURCES
                },
            mac: c.mac,
            log2_max_page_list_bytes: self.cfg.max_page_list_bytes.ilog2() as u8,
            log2_max_qp_reg_mr_list_bytes: MAX_QP_REG_MR_LIST_BYTES.ilog2() as u8,
            netdev_mtu: self.cfg.netdev_mtu,
            port_state: 4,
            active_mtu: c.port_mtu as u8,
            max_mtu: c.port_mtu as u8,
            phys_port_cnt: 1,
            gid_tbl_len: c.gid_table_len,
            max_qp: c.max_qp,
            max_qp_wr: c.max_qp_wr,
            max_sge: c.max_sge,
            max_cq: c.max_cq,
            max_cqe: c.max_cqe,
            max_mr: c.max_mr,
            max_pd: c.max_pd,
            max_mr_size: c.max_mr_size,
            // 4 KiB … 1 GiB: page lists take page_shift 12..=30 (no 2 GiB pages).
            page_size_cap: 0x7fff_f000,
            max_qp_rd_atom: 128,
            max_qp_init_rd_atom: 128,
            max_srq: c.max_srq,
            max_srq_wr: c.max_srq_wr,
            max_srq_sge: c.max_sge,
            max_ah: c.max_ah,
            max_mcast_grp: c.max_mcast_grp,
            max_mcast_qp_attach: c.max_mcast_qp_attach,
            max_inline: c.max_inline,
            max_mw: c.max_mr,
            max_registered_bytes: c.max_registered_bytes,
            // Of rxe's set, what the device implements: no SRQ_RESIZE (§5.7), none of the
            // counters, path migration or port-change flags.
            device_cap_flags: abi::dev_cap::RC_RNR_NAK_GEN
                | abi::dev_cap::MEM_WINDOW
                | abi::dev_cap::MEM_MGT_EXTENSIONS
                | abi::dev_cap::MEM_WINDOW_TYPE_2B
                | abi::dev_cap::FLUSH_GLOBAL
                | abi::dev_cap::FLUSH_PERSISTENT,
        }
    }

    // ------------------------------------------------------------------ control commands

    /// Whether a control command freed an object (destroyed a QP, CQ or SRQ, or deregistered
    /// an MR) since [`Model::clear_released`]: the worker then returns freed heap to the kernel.
    pub fn released(&self) -> bool {
        self.released
    }

    pub fn clear_released(&mut self) {
        self.released = false;
    }

    /// Executes one control request (`req` = header + command). `resp_cap` is the size of the
    /// device-writable part. Returns the response header and struct.
    pub fn handle_ctrl(
        &mut self,
        mem: &GuestMemoryMmap,
        req: &[u8],
        resp_cap: usize,
    ) -> (abi::RespHdr, Vec<u8>) {
        self.stats.ctrl_cmds += 1;
        let Some(h) = abi::read_struct::<abi::CtrlHdr>(req) else {
            self.stats.ctrl_errors += 1;
            return (
                abi::RespHdr {
                    status: Status::BadRequest as u32,
                    ..Default::default()
                },
                Vec::new(),
            );
        };
        let need = std::mem::size_of::<abi::RespHdr>() + resp_size(h.opcode);
        let r = if h.flags != 0 || resp_cap < need {
            Err(Status::BadRequest)
        } else {
            self.exec(mem, h.opcode, &req[std::mem::size_of::<abi::CtrlHdr>()..])
        };
        if r.is_ok()
            && matches!(
                h.opcode,
                op::DESTROY_QP | op::DESTROY_CQ | op::DESTROY_SRQ | op::DEREG_MR
            )
        {
            self.released = true;
        }
        match r {
            Ok(b) => (
                abi::RespHdr {
                    status: Status::Ok as u32,
                    len: b.len() as u32,
                    seq: h.seq,
                },
                b,
            ),
            Err(s) => {
                self.stats.ctrl_errors += 1;
                log::debug!("control opcode {} failed: {:?}", h.opcode, s);
                (
                    abi::RespHdr {
                        status: s as u32,
                        len: 0,
                        seq: h.seq,
                    },
                    Vec::new(),
                )
            }
        }
    }

    fn create_cq(&mut self, mem: &GuestMemoryMmap, c: abi::CmdCreateCq) -> CmdResult {
        if c.flags != 0 || c.cqe == 0 || c.cqe > self.cfg.dev.max_cqe {
            return Err(Status::Invalid);
        }
        if c.queue.num_slots > (self.cfg.dev.max_cqe + 1).next_power_of_two() {
            return Err(Status::Invalid);
        }
        let ring = Ring::new(mem, &c.queue, abi::CQE_SIZE, c.cqe)?;
        let cap = ring.mask();
        let lb = ring_list_bytes(&ring);
        self.common.lists().charge(lb)?;
        // The engine's queue is only a staging area drained into the ring after every step;
        // overflow is decided by the guest ring, as in rxe.
        let r = self.any().dev.create_staging_cq();
        let cqn = match r {
            Ok(n) => n,
            Err(e) => {
                self.common.lists().release(lb);
                return Err(verr(e));
            }
        };
        // The device owns the producer index from here on; start from what the driver wrote
        // (0 for a fresh ring), masked.
        let prod = ring.load_index(mem, hdr::PRODUCER_INDEX).unwrap_or(0);
        write(&self.common.cqs).insert(
            cqn,
            Arc::new(Mutex::new(CqShadow {
                ring,
                prod,
                overflowed: false,
            })),
        );
        body(abi::RespCreateCq { cqn, cqe: cap })
    }

    fn resize_cq(&mut self, mem: &GuestMemoryMmap, c: abi::CmdResizeCq) -> CmdResult {
        // The same bounds as CREATE_CQ.
        if c.cqe == 0
            || c.cqe > self.cfg.dev.max_cqe
            || c.queue.num_slots > (self.cfg.dev.max_cqe + 1).next_power_of_two()
        {
            return Err(Status::Invalid);
        }
        let Some(cq) = self.common.cq(c.cqn) else {
            return Err(Status::NotFound);
        };
        let new = Ring::new(mem, &c.queue, abi::CQE_SIZE, c.cqe)?;
        let lb = ring_list_bytes(&new);
        self.common.lists().charge(lb)?;
        let moved = Self::move_cq(mem, &mut lock(&cq), new);
        match moved {
            Ok((cap, old_lb)) => {
                self.common.lists().release(old_lb);
                body(abi::RespCreateCq {
                    cqn: c.cqn,
                    cqe: cap,
                })
            }
            Err(e) => {
                self.common.lists().release(lb);
                Err(e)
            }
        }
    }

    /// RESIZE_CQ's move into the new ring; returns its capacity and the page-list bytes of
    /// the old one. On error the old ring stays in use.
    fn move_cq(mem: &GuestMemoryMmap, old: &mut CqShadow, new: Ring) -> Result<(u32, u64), Status> {
        // Move the entries the driver has not consumed yet to the start of the new ring.
        let cons = old
            .ring
            .load_index(mem, hdr::CONSUMER_INDEX)
            .map_err(|_| Status::BadAddress)?;
        let n = old.prod.wrapping_sub(cons) & old.ring.mask();
        if n > new.mask() {
            return Err(Status::Invalid);
        }
        let mut e = vec![0u8; abi::CQE_SIZE];
        for i in 0..n {
            old.ring
                .read_slot(mem, cons.wrapping_add(i), &mut e)
                .map_err(|_| Status::BadAddress)?;
            new.write_slot(mem, i, &e).map_err(|_| Status::BadAddress)?;
        }
        // An armed CQ stays armed in its new ring.
        let notify = old
            .ring
            .buf
            .load_u32(mem, hdr::CQ_NOTIFY, Ordering::Acquire)
            .map_err(|_| Status::BadAddress)?;
        new.init_header(mem).map_err(|_| Status::BadAddress)?;
        new.buf
            .store_u32(mem, hdr::CQ_NOTIFY, notify, Ordering::Release)
            .map_err(|_| Status::BadAddress)?;
        new.store_index(mem, hdr::PRODUCER_INDEX, n)
            .map_err(|_| Status::BadAddress)?;
        let cap = new.mask();
        let old_lb = ring_list_bytes(&old.ring);
        old.ring = new;
        old.prod = n;
        Ok((cap, old_lb))
    }

    fn create_qp(&mut self, mem: &GuestMemoryMmap, c: abi::CmdCreateQp) -> CmdResult {
        let qp_type = match c.qp_type {
            abi::qp_type::RC => QpType::Rc,
            abi::qp_type::UC => QpType::Uc,
            abi::qp_type::UD => QpType::Ud,
            abi::qp_type::GSI => QpType::Gsi,
            abi::qp_type::XRC_INI => QpType::XrcIni,
            abi::qp_type::XRC_TGT => QpType::XrcTgt,
            abi::qp_type::RAW_PACKET => QpType::RawPacket,
            _ => return Err(Status::Unsupported),
        };
        // The device's caps bit and the engine's rules (`rxe_core::xrc::check_init`) decide
        // the rest: an XRC INI QP has an SQ only, an XRC TGT QP no ring at all.
        let xrcd = (qp_type == QpType::XrcTgt).then_some(c.xrcdn);
        if c.flags & !(abi::CREATE_QP_HAS_SRQ | abi::CREATE_QP_SQ_SIG_ALL | abi::CREATE_QP_KERNEL)
            != 0
        {
            return Err(Status::Invalid);
        }
        let d = &self.cfg.dev;
        if c.max_send_wr > d.max_qp_wr
            || c.max_recv_wr > d.max_qp_wr
            || c.max_send_sge > d.max_sge
            || c.max_recv_sge > d.max_sge
            || c.max_inline_data > d.max_inline
        {
            return Err(Status::Invalid);
        }
        let has_srq = c.flags & abi::CREATE_QP_HAS_SRQ != 0;
        let sq = if c.sq.pages.num_pages == 0 {
            if c.max_send_wr != 0 {
                return Err(Status::Invalid);
            }
            None
        } else {
            let min = ring::send_wqe_size(c.max_send_sge, c.max_inline_data);
            Some(Ring::new(mem, &c.sq, min, c.max_send_wr)?)
        };
        let rq = if has_srq || c.rq.pages.num_pages == 0 {
            if !has_srq && c.max_recv_wr != 0 {
                return Err(Status::Invalid);
            }
            None
        } else {
            let min = ring::recv_wqe_size(c.max_recv_sge);
            Some(Ring::new(mem, &c.rq, min, c.max_recv_wr)?)
        };
        let cap = QpCap {
            max_send_wr: c.max_send_wr,
            max_recv_wr: if has_srq { 0 } else { c.max_recv_wr },
            max_send_sge: c.max_send_sge,
            max_recv_sge: if has_srq { 0 } else { c.max_recv_sge },
            max_inline_data: c.max_inline_data,
        };
        let srq = has_srq.then_some(c.srqn);
        let lb = sq.as_ref().map_or(0, ring_list_bytes) + rq.as_ref().map_or(0, ring_list_bytes);
        self.common.lists().charge(lb)?;
        // A new QP goes to the next shard in turn (the GSI QP to the one its number names).
        let n = self.shards.len();
        let shard = if qp_type == QpType::Gsi {
            Device::shard_of(Qpn::GSI, n as u32) as usize
        } else if qp_type == QpType::RawPacket {
            // Frames go from one raw packet QP to another inside the shard that holds them
            // all, with the flows that steer them (`model/raw.rs`).
            raw::SHARD
        } else {
            self.next_shard = (self.next_shard + 1) % n;
            self.next_shard
        };
        let mut s = lock(&self.shards[shard]);
        let qpn = match s.dev.create_qp(QpInit {
            qp_type,
            pd: c.pdn,
            send_cq: c.send_cqn,
            recv_cq: c.recv_cqn,
            srq,
            xrcd,
            cap,
            sq_sig_all: c.flags & abi::CREATE_QP_SQ_SIG_ALL != 0,
        }) {
            Ok(n) => n,
            Err(e) => {
                self.common.lists().release(lb);
                return Err(verr(e));
            }
        };
        if let Some(q) = &self.cfg.live_qpns {
            q.insert(qpn.0);
        }
        let sq_cons = sq
            .as_ref()
            .and_then(|r| r.load_index(mem, hdr::CONSUMER_INDEX).ok())
            .unwrap_or(0);
        let rq_cons = rq
            .as_ref()
            .and_then(|r| r.load_index(mem, hdr::CONSUMER_INDEX).ok())
            .unwrap_or(0);
        s.qps.insert(
            qpn.0,
            QpShadow {
                qp_type,
                sq,
                rq,
                sq_cons,
                sq_taken: sq_cons,
                rq_cons,
                rq_taken: rq_cons,
                recv_cq: c.recv_cqn,
                srq,
                caps: cap,
                pd: c.pdn,
                kernel: c.flags & abi::CREATE_QP_KERNEL != 0,
                faulted: false,
                list_bytes: lb,
                reg_mr_held: 0,
                wqe_held: 0,
            },
        );
        body(abi::RespCreateQp {
            qpn: qpn.0,
            max_send_wr: cap.max_send_wr,
            max_recv_wr: cap.max_recv_wr,
            max_send_sge: cap.max_send_sge,
            max_recv_sge: cap.max_recv_sge,
            max_inline_data: cap.max_inline_data,
            reserved: 0,
        })
    }

    fn modify_qp(&mut self, mem: &GuestMemoryMmap, mut c: abi::QpAttrs) -> CmdResult {
        let qp_type = self.shard(c.qpn).qps.get(&c.qpn).map(|q| q.qp_type);
        let Some(qp_type) = qp_type else {
            return Err(Status::NotFound);
        };
        // IBTA's GSI column (Linux ib_modify_qp_is_ok): a move to INIT needs PKEY_INDEX and
        // QKEY, not PORT, and the MAD layer sends exactly STATE|PKEY_INDEX|QKEY. The engine's
        // table treats GSI as UD, which requires PORT: name the one port for the driver.
        if matches!(qp_type, QpType::Gsi)
            && c.attr_mask & AttrMask::STATE != 0
            && c.qp_state == 1
            && c.attr_mask & AttrMask::PORT == 0
        {
            c.attr_mask |= AttrMask::PORT;
            c.port_num = 1;
        }
        let attr = to_qp_attr(&c)?;
        if AttrMask(c.attr_mask).has(AttrMask::AV) {
            self.av_allowed(&attr.av)?;
        }
        let mut s = self.shard(c.qpn);
        s.dev
            .modify_qp(Qpn(c.qpn), &attr, AttrMask(c.attr_mask))
            .map_err(verr)?;
        // WQEs the driver posted while the QP could not take them can go now (or be flushed).
        s.pull_rq(&self.common, mem, c.qpn);
        s.pull_sq(&self.common, mem, c.qpn);
        Ok(Vec::new())
    }

    /// An address vector the egress policy refuses: PERMISSION, at once, rather than
    /// packets that vanish later.
    /// An address vector may be used: its source GID is one the transport sends from, and
    /// the egress policy allows its destination.
    fn av_allowed(&self, av: &Av) -> Result<(), Status> {
        if self.listed_gids.contains_key(&(av.sgid_index as u32)) {
            return Err(Status::AddressNotAvailable);
        }
        let ip = av.dgid.to_ip();
        if self.cfg.egress.allows(ip) {
            Ok(())
        } else {
            log::debug!("address vector to {ip} refused by the egress policy");
            Err(Status::Permission)
        }
    }

    fn create_srq(&mut self, mem: &GuestMemoryMmap, c: abi::CmdCreateSrq) -> CmdResult {
        self.create_srq_in(mem, c, None)
    }

    /// CREATE_SRQ, and CREATE_XRC_SRQ with `xrc` = (domain, CQ).
    fn create_srq_in(
        &mut self,
        mem: &GuestMemoryMmap,
        c: abi::CmdCreateSrq,
        xrc: Option<(u32, u32)>,
    ) -> CmdResult {
        if c.max_sge == 0 || c.max_sge > self.cfg.dev.max_sge || c.max_wr > self.cfg.dev.max_srq_wr
        {
            return Err(Status::Invalid);
        }
        let ring = Ring::new(mem, &c.queue, ring::recv_wqe_size(c.max_sge), c.max_wr)?;
        let lb = ring_list_bytes(&ring);
        self.common.lists().charge(lb)?;
        let r = match xrc {
            None => self
                .any()
                .dev
                .create_srq(c.pdn, c.max_wr, c.max_sge, c.srq_limit),
            Some((xrcd, cqn)) => {
                self.any()
                    .dev
                    .create_srq_xrc(c.pdn, xrcd, cqn, c.max_wr, c.max_sge, c.srq_limit)
            }
        };
        let srqn = match r {
            Ok(n) => n,
            Err(e) => {
                self.common.lists().release(lb);
                return Err(verr(e));
            }
        };
        let cons = ring.load_index(mem, hdr::CONSUMER_INDEX).unwrap_or(0);
        write(&self.common.srqs).insert(
            srqn,
            Arc::new(Mutex::new(SrqShadow {
                ring,
                cons,
                max_sge: c.max_sge,
            })),
        );
        body(abi::RespCreateSrq {
            srqn,
            max_wr: c.max_wr,
            max_sge: c.max_sge,
            reserved: 0,
        })
    }

    /// RESIZE_SRQ: the receives the device has not taken yet move to the start of the new
    /// ring, which the SRQ uses from then on with the new max_wr; on error the old ring stays.
    fn resize_srq(&mut self, mem: &GuestMemoryMmap, c: abi::CmdResizeSrq) -> CmdResult {
        let srq = self.common.srq(c.srqn).ok_or(Status::NotFound)?;
        if c.max_wr == 0 || c.max_wr > self.cfg.dev.max_srq_wr {
            return Err(Status::Invalid);
        }
        // The shard that pulls the SRQ's receives, then the SRQ: the lock order.
        let mut sh = self.any();
        let mut s = lock(&srq);
        let max_sge = s.max_sge;
        let new = Ring::new(mem, &c.queue, ring::recv_wqe_size(max_sge), c.max_wr)?;
        let old = s.ring.clone();
        let cons = s.cons;
        let prod = old
            .load_index(mem, hdr::PRODUCER_INDEX)
            .map_err(|_| Status::BadAddress)?;
        let n = prod.wrapping_sub(cons) & old.mask();
        // the new ring holds what is queued in it and what the device holds already
        let (_, _, limit, posted) = sh.dev.query_srq(c.srqn).ok_or(Status::NotFound)?;
        if n > new.mask() || (n as usize + posted) > c.max_wr as usize || limit > c.max_wr {
            return Err(Status::Invalid);
        }
        let lb = ring_list_bytes(&new);
        self.common.lists().charge(lb)?;
        let moved = (|| -> Result<(), Status> {
            let mut e = vec![0u8; old.elem_size()];
            e.resize(old.elem_size().max(new.elem_size()), 0);
            for i in 0..n {
                old.read_slot(mem, cons.wrapping_add(i), &mut e[..old.elem_size()])
                    .map_err(|_| Status::BadAddress)?;
                new.write_slot(mem, i, &e[..new.elem_size()])
                    .map_err(|_| Status::BadAddress)?;
            }
            new.init_header(mem).map_err(|_| Status::BadAddress)?;
            new.store_index(mem, hdr::PRODUCER_INDEX, n)
                .map_err(|_| Status::BadAddress)
        })();
        if let Err(e) = moved.and_then(|_| {
            sh.dev
                .modify_srq(c.srqn, Some(c.max_wr), None)
                .map_err(verr)
        }) {
            self.common.lists().release(lb);
            return Err(e);
        }
        let old_lb = ring_list_bytes(&s.ring);
        s.ring = new;
        s.cons = 0;
        drop(s);
        self.common.lists().release(old_lb);
        // a bigger SRQ may take receives the old one had no room for
        sh.pull_srq(&self.common, mem, c.srqn);
        body(abi::RespQuerySrq {
            max_wr: c.max_wr,
            max_sge,
            srq_limit: limit,
            reserved: 0,
        })
    }

    // ------------------------------------------------------------------ doorbells and rings

    /// Handles one doorbell entry: in the QP's shard for an SQ or RQ, in shard 0 for an SRQ
    /// or CQ.
    pub fn doorbell(&mut self, mem: &GuestMemoryMmap, db: &abi::Doorbell) {
        self.stats.doorbells += 1;
        let c = &*self.common;
        let known = match db.kind {
            abi::doorbell::SQ | abi::doorbell::RQ => {
                let mut s = self.shard(db.object);
                let known = s.qps.contains_key(&db.object);
                if known && db.kind == abi::doorbell::SQ {
                    s.pull_sq(c, mem, db.object);
                } else if known {
                    s.pull_rq(c, mem, db.object);
                }
                known
            }
            // Any shard may take an SRQ's receives or check a CQ's arm: shard 0, which is
            // always this model's own.
            abi::doorbell::SRQ if c.srq(db.object).is_some() => {
                self.any().pull_srq(c, mem, db.object);
                true
            }
            abi::doorbell::CQ if c.cq(db.object).is_some() => {
                self.any().check_cq_arm(c, mem, db.object);
                true
            }
            _ => false,
        };
        if !known {
            self.stats.bad_doorbells += 1;
        }
    }

    /// The guest's objects are gone (a reconnect lost the device's state): DEVICE_FATAL.
    pub fn device_fatal(&mut self) {
        self.common
            .push_event(abi::event::KIND_ASYNC, abi::event::DEVICE_FATAL, 0);
    }

    // ------------------------------------------------------------------ network side

    /// Hands a received RoCE packet (BTH … ICRC) to the engine, after pulling the destination
    /// QP's receive WQEs from its ring.
    pub fn handle_packet(
        &mut self,
        mem: &GuestMemoryMmap,
        now: Instant,
        meta: &RecvMeta,
        bytes: &[u8],
    ) {
        self.handle_packet_refs(mem, now, meta, bytes, None, false)
    }

    /// [`Self::handle_packet`] for a packet from another device of this process whose
    /// payload is partly references into that device's guest memory `src`
    /// ([`crate::memory::payload_ref`]).
    pub fn handle_packet_refs(
        &mut self,
        mem: &GuestMemoryMmap,
        now: Instant,
        meta: &RecvMeta,
        bytes: &[u8],
        src: Option<(&GuestMemoryMmap, &[crate::memory::payload_ref::PayloadRef])>,
        in_memory: bool,
    ) {
        let p = Packet {
            mem,
            now,
            meta,
            bytes,
            src,
            in_memory,
        };
        let t = route(&self.common, &self.shards, &p);
        self.touch(t);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        for (k, s) in self.shards.iter().enumerate() {
            if self.local(k) {
                lock(s).dev.handle_timeout(now);
            }
        }
    }

    pub fn poll_timeout(&mut self) -> Option<Instant> {
        self.shards
            .iter()
            .enumerate()
            .filter(|(k, _)| self.local(*k))
            .filter_map(|(_, s)| lock(s).dev.poll_timeout())
            .min()
    }

    /// `f` on the engine shard QP `qpn` lives in.
    pub fn with_qp_dev<R>(&self, qpn: u32, f: impl FnOnce(&Device) -> R) -> R {
        f(&self.shard(qpn).dev)
    }

    /// Each engine shard's QPs and port counters, in shard order.
    pub fn shard_loads(&self) -> Vec<(usize, rxe_core::device::PortCounters)> {
        self.shards
            .iter()
            .map(|s| {
                let s = lock(s);
                (s.dev.qpns().count(), s.dev.port_counters())
            })
            .collect()
    }

    /// The device's port counters: every shard's, added up.
    pub fn port_counters(&self) -> rxe_core::device::PortCounters {
        let mut p = rxe_core::device::PortCounters::default();
        for s in &self.shards {
            p.add(&lock(s).dev.port_counters());
        }
        p
    }

    /// Runs the engine for at most [`TX_BUDGET`] packets: sends what it produces through
    /// `tx`, moves completions into CQ rings, collects events. Says why it stopped.
    pub fn pump(&mut self, mem: &GuestMemoryMmap, now: Instant, tx: &mut dyn PacketSink) -> Pump {
        self.pump_budget(mem, now, tx, TX_BUDGET)
    }

    /// [`Self::pump`] with a packet budget of `budget`, for the shards in turn: a shard that
    /// spends what is left ends the pump, and the next pump starts with the shard after it.
    pub fn pump_budget(
        &mut self,
        mem: &GuestMemoryMmap,
        now: Instant,
        tx: &mut dyn PacketSink,
        budget: usize,
    ) -> Pump {
        self.pump_shards(mem, now, tx, budget, false)
    }

    /// [`Self::pump_budget`]; with `everywhere`, over the shards other threads drive too
    /// (through `tx`): for a control command that must find what the work posted before it
    /// completed.
    pub fn pump_shards(
        &mut self,
        mem: &GuestMemoryMmap,
        now: Instant,
        tx: &mut dyn PacketSink,
        budget: usize,
        everywhere: bool,
    ) -> Pump {
        let n = self.shards.len();
        let mut left = budget;
        for i in 0..n {
            let k = (self.tx_shard + i) % n;
            if !everywhere && !self.local(k) {
                continue;
            }
            let p = lock(&self.shards[k]).pump(&self.common, mem, now, tx, &mut left);
            if p != Pump::Idle {
                self.tx_shard = (k + 1) % n;
                return p;
            }
        }
        Pump::Idle
    }

    /// The port went ACTIVE or DOWN (the link under the transport, its socket): QUERY_PORT
    /// says so from now on and, with `tell`, the guest gets PORT_ACTIVE or PORT_ERR (as an
    /// IB device's port events). Nothing when the state is the one already reported.
    pub fn set_port_active(&mut self, active: bool, tell: bool) {
        if active == self.port_active {
            return;
        }
        self.port_active = active;
        if !active {
            self.link_downed += 1;
        }
        if tell {
            let e = if active {
                abi::event::PORT_ACTIVE
            } else {
                abi::event::PORT_ERR
            };
            self.common.push_event(abi::event::KIND_ASYNC, e, 1);
        }
    }

    /// Whether QUERY_PORT reports the port ACTIVE.
    pub fn port_active(&self) -> bool {
        self.port_active
    }

    /// Per-QP counters as (qpn, counters).
    pub fn qp_counters(&self) -> Vec<(u32, rxe_core::QpCounters)> {
        let mut v = Vec::new();
        for s in &self.shards {
            let s = lock(s);
            v.extend(
                s.qps
                    .keys()
                    .filter_map(|&q| s.dev.qp_counters(Qpn(q)).map(|c| (q, c))),
            );
        }
        v.sort_unstable_by_key(|e| e.0);
        v
    }
}

/// A received packet on its way into the engine ([`Model::handle_packet_refs`]).
struct Packet<'a> {
    mem: &'a GuestMemoryMmap,
    now: Instant,
    meta: &'a RecvMeta,
    bytes: &'a [u8],
    src: Option<(
        &'a GuestMemoryMmap,
        &'a [crate::memory::payload_ref::PayloadRef],
    )>,
    in_memory: bool,
}

#[cfg(test)]
mod tests;
