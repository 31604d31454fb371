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
        self.wqe_budget_waits += o.wqe_budget_waits;
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
        let e = abi::Event {
            kind,
            event,
            object,
            reserved: 0,
        };
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
        op::CREATE_SRQ => size_of::<abi::RespCreateSrq>(),
        op::QUERY_SRQ | op::RESIZE_SRQ => size_of::<abi::RespQuerySrq>(),
        op::REG_USER_MR | op::REG_DMA_MR | op::ALLOC_MR => size_of::<abi::RespMr>(),
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

    /// The number of engine shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
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

    fn exec(&mut self, mem: &GuestMemoryMmap, opcode: u32, b: &[u8]) -> CmdResult {
        match opcode {
            op::QUERY_DEVICE => body(self.config_space()),
            op::QUERY_GID_SOURCES => {
                if self.source_gids.is_empty() {
                    return Err(Status::Unsupported);
                }
                let mut r = abi::RespGidSources {
                    count: self.source_gids.len() as u32,
                    ..Default::default()
                };
                for (d, g) in r.gids.iter_mut().zip(&self.source_gids) {
                    *d = g.0;
                }
                body(r)
            }
            op::QUERY_PORT => {
                let c: abi::CmdQueryPort = cmd(b)?;
                if c.port_num != 1 {
                    return Err(Status::Invalid);
                }
                let m = self.cfg.dev.port_mtu as u32;
                body(abi::RespQueryPort {
                    state: 4,
                    max_mtu: m,
                    active_mtu: m,
                    gid_tbl_len: self.cfg.dev.gid_table_len,
                    port_cap_flags: 0,
                    max_msg_sz: 1 << 31,
                    pkey_tbl_len: 1,
                    link_layer: 2,
                    phys_state: 5,
                    active_width: 1,
                    active_speed: 1,
                    reserved: 0,
                })
            }
            op::CREATE_PD => {
                let pd = self.any().dev.alloc_pd().map_err(verr)?;
                body(abi::Handle {
                    handle: pd,
                    reserved: 0,
                })
            }
            op::DESTROY_PD => {
                let c: abi::Handle = cmd(b)?;
                self.any().dev.dealloc_pd(c.handle).map_err(verr)?;
                Ok(Vec::new())
            }
            op::CREATE_CQ => self.create_cq(mem, cmd(b)?),
            op::RESIZE_CQ => self.resize_cq(mem, cmd(b)?),
            op::DESTROY_CQ => {
                let c: abi::Handle = cmd(b)?;
                self.any().dev.destroy_cq(c.handle).map_err(verr)?;
                let cq = write(&self.common.cqs).remove(&c.handle);
                if let Some(cq) = cq {
                    let lb = ring_list_bytes(&lock(&cq).ring);
                    self.common.lists().release(lb);
                }
                Ok(Vec::new())
            }
            op::CREATE_QP => self.create_qp(mem, cmd(b)?),
            op::MODIFY_QP => self.modify_qp(mem, cmd(b)?),
            op::QUERY_QP => {
                let c: abi::QpAttrs = cmd(b)?;
                let (a, cap) = self
                    .shard(c.qpn)
                    .dev
                    .query_qp(Qpn(c.qpn))
                    .ok_or(Status::NotFound)?;
                body(abi::QpAttrs {
                    qpn: c.qpn,
                    attr_mask: 0x1f_ffff,
                    qp_state: a.qp_state as u32,
                    cur_qp_state: a.cur_qp_state as u32,
                    path_mtu: a.path_mtu as u32,
                    qkey: a.qkey,
                    rq_psn: a.rq_psn,
                    sq_psn: a.sq_psn,
                    dest_qp_num: a.dest_qp_num,
                    qp_access_flags: a.qp_access_flags.0,
                    pkey_index: a.pkey_index,
                    en_sqd_async_notify: a.en_sqd_async_notify as u8,
                    sq_draining: a.sq_draining as u8,
                    max_rd_atomic: a.max_rd_atomic,
                    max_dest_rd_atomic: a.max_dest_rd_atomic,
                    min_rnr_timer: a.min_rnr_timer,
                    port_num: a.port_num,
                    timeout: a.timeout,
                    retry_cnt: a.retry_cnt,
                    rnr_retry: a.rnr_retry,
                    ah: from_av(&a.av),
                    max_send_wr: cap.max_send_wr,
                    max_recv_wr: cap.max_recv_wr,
                    max_send_sge: cap.max_send_sge,
                    max_recv_sge: cap.max_recv_sge,
                    max_inline_data: cap.max_inline_data,
                    ..Default::default()
                })
            }
            op::DESTROY_QP => {
                let c: abi::Handle = cmd(b)?;
                let mut s = self.shard(c.handle);
                s.dev.destroy_qp(Qpn(c.handle)).map_err(verr)?;
                if let Some(q) = s.qps.remove(&c.handle) {
                    self.common.lists().release(q.list_bytes + q.reg_mr_held);
                    self.common.wqes_release(q.wqe_held);
                }
                s.sq_backlog.remove(&c.handle);
                s.sq_active.remove(&c.handle);
                s.rq_active.remove(&c.handle);
                Ok(Vec::new())
            }
            op::CREATE_SRQ => self.create_srq(mem, cmd(b)?),
            op::MODIFY_SRQ => {
                let c: abi::CmdModifySrq = cmd(b)?;
                if c.attr_mask & !(abi::SRQ_ATTR_MAX_WR | abi::SRQ_ATTR_LIMIT) != 0 {
                    return Err(Status::Invalid);
                }
                if c.attr_mask & abi::SRQ_ATTR_MAX_WR != 0 {
                    // The ring is fixed at creation; rxe resizes by handing a new buffer,
                    // which this contract does not have a command for yet.
                    return Err(Status::Unsupported);
                }
                let limit = (c.attr_mask & abi::SRQ_ATTR_LIMIT != 0).then_some(c.srq_limit);
                self.any()
                    .dev
                    .modify_srq(c.srqn, None, limit)
                    .map_err(verr)?;
                Ok(Vec::new())
            }
            op::RESIZE_SRQ => self.resize_srq(mem, cmd(b)?),
            op::QUERY_SRQ => {
                let c: abi::Handle = cmd(b)?;
                let q = self.any().dev.query_srq(c.handle);
                let (max_wr, max_sge, limit, _) = q.ok_or(Status::NotFound)?;
                body(abi::RespQuerySrq {
                    max_wr,
                    max_sge,
                    srq_limit: limit,
                    reserved: 0,
                })
            }
            op::DESTROY_SRQ => {
                let c: abi::Handle = cmd(b)?;
                self.any().dev.destroy_srq(c.handle).map_err(verr)?;
                let srq = write(&self.common.srqs).remove(&c.handle);
                if let Some(s) = srq {
                    let lb = ring_list_bytes(&lock(&s).ring);
                    self.common.lists().release(lb);
                }
                Ok(Vec::new())
            }
            op::REG_USER_MR => {
                let (c, page_offset) = abi::CmdRegUserMr::read(b).ok_or(Status::BadRequest)?;
                self.reg_user_mr(mem, c, page_offset)
            }
            op::REG_DMA_MR => {
                let mut c: abi::CmdRegDmaMr = cmd(b)?;
                c.access &= !abi::ACCESS_IGNORED;
                if c.access & !Access::ALL.0 != 0 {
                    return Err(Status::Invalid);
                }
                let access = Access(c.access);
                // IBTA 10.6.3.1 before the policy: a malformed request is INVALID whatever
                // the daemon allows.
                if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
                    && !access.contains(Access::LOCAL_WRITE)
                {
                    return Err(Status::Invalid);
                }
                if access.0 & DMA_MR_REMOTE_RIGHTS.0 != 0 && !self.cfg.allow_remote_dma_mr {
                    crate::warn_limited!(
                        "REG_DMA_MR with remote rights {:#x} refused: every byte of guest \
                         memory would be reachable with one key (--allow-remote-dma-mr)",
                        access.0 & DMA_MR_REMOTE_RIGHTS.0
                    );
                    return Err(Status::Permission);
                }
                let k = self.any().dev.reg_dma_mr(c.pdn, access).map_err(verr)?;
                body(abi::RespMr { lkey: k, rkey: k })
            }
            op::ALLOC_MR => {
                let c: abi::CmdAllocMr = cmd(b)?;
                if c.max_num_sg == 0 || c.max_num_sg > 1 << 20 {
                    return Err(Status::Invalid);
                }
                // The MR's page list is reserved now: a REG_MR never needs more.
                let lb = list_bytes(c.max_num_sg as usize);
                self.common.lists().charge(lb)?;
                let r = self.any().dev.alloc_mr(c.pdn, c.max_num_sg);
                match r {
                    Ok(k) => body(abi::RespMr { lkey: k, rkey: k }),
                    Err(e) => {
                        self.common.lists().release(lb);
                        Err(verr(e))
                    }
                }
            }
            op::DEREG_MR => {
                let c: abi::Handle = cmd(b)?;
                {
                    let mut s = self.any();
                    let lb = s.dev.with_mr(c.handle, mr_list_bytes).unwrap_or(0);
                    s.dev.dereg_mr(c.handle).map_err(verr)?;
                    self.common.lists().release(lb);
                }
                Ok(Vec::new())
            }
            op::ALLOC_MW => {
                let c: abi::CmdAllocMw = cmd(b)?;
                let t = match c.mw_type {
                    1 => MwType::Type1,
                    2 => MwType::Type2,
                    _ => return Err(Status::Invalid),
                };
                let k = self.any().dev.alloc_mw(c.pdn, t).map_err(verr)?;
                body(abi::RespMr { lkey: k, rkey: k })
            }
            op::BIND_MW => {
                let mut c: abi::CmdBindMw = cmd(b)?;
                // As in BIND_MW work requests: local rights mean nothing for a window.
                c.access &= Access::REMOTE.0 | Access::ZERO_BASED.0;
                if c.access & !Access::ALL.0 != 0 {
                    return Err(Status::Invalid);
                }
                let mut s = self.shard(c.qpn);
                if !s.qps.contains_key(&c.qpn) {
                    return Err(Status::NotFound);
                }
                let k = s
                    .dev
                    .bind_mw_type1(
                        Qpn(c.qpn),
                        c.mw_rkey,
                        c.mr_lkey,
                        c.addr,
                        c.length,
                        Access(c.access),
                    )
                    .map_err(|_| Status::Invalid)?;
                body(abi::RespMr { lkey: k, rkey: k })
            }
            op::DEALLOC_MW => {
                let c: abi::Handle = cmd(b)?;
                // The window is named by its index: librxe's binds give it new key bytes
                // the driver never sees, so the key byte of the handle may be stale.
                let mut s = self.any();
                let r = s.dev.dealloc_mw(c.handle);
                if matches!(r, Err(VerbError::NotFound)) {
                    let found = (0..=255u32)
                        .map(|k| (c.handle & !0xff) | k)
                        .any(|key| s.dev.dealloc_mw(key).is_ok());
                    if found {
                        return Ok(Vec::new());
                    }
                }
                r.map_err(verr)?;
                Ok(Vec::new())
            }
            op::CREATE_AH => {
                let c: abi::CmdCreateAh = cmd(b)?;
                self.av_allowed(&to_av(&c.attr))?;
                let id = self
                    .any()
                    .dev
                    .create_ah(c.pdn, to_av(&c.attr))
                    .map_err(verr)?;
                // AH numbers start at 1: librxe treats ah_num 0 as "AV inline in the WQE".
                body(abi::Handle {
                    handle: id + 1,
                    reserved: 0,
                })
            }
            op::DESTROY_AH => {
                let c: abi::Handle = cmd(b)?;
                let id = c.handle.checked_sub(1).ok_or(Status::NotFound)?;
                self.any().dev.destroy_ah(id).map_err(verr)?;
                Ok(Vec::new())
            }
            op::ADD_GID => {
                let c: abi::CmdAddGid = cmd(b)?;
                if c.gid_type != abi::GID_TYPE_ROCE_UDP_ENCAP {
                    return Err(Status::Unsupported);
                }
                let g = Gid(c.gid);
                if g.is_multicast() || c.gid == [0; 16] {
                    return Err(Status::Invalid);
                }
                if c.index >= self.cfg.dev.gid_table_len {
                    return Err(Status::Invalid);
                }
                // A GID the transport cannot send from is listed but never used: a QP or AH
                // naming it would send from another address, which its peer drops.
                if !self.source_gids.is_empty() && !self.source_gids.contains(&g) {
                    let _ = self.any().dev.del_gid(c.index);
                    self.listed_gids.insert(c.index, g);
                    return Ok(Vec::new());
                }
                self.any().dev.add_gid(c.index, g).map_err(verr)?;
                self.listed_gids.remove(&c.index);
                self.gids_changed = true;
                Ok(Vec::new())
            }
            op::DEL_GID => {
                let c: abi::Handle = cmd(b)?;
                if self.listed_gids.remove(&c.handle).is_none() {
                    self.any().dev.del_gid(c.handle).map_err(verr)?;
                    self.gids_changed = true;
                }
                Ok(Vec::new())
            }
            op::ATTACH_MCAST => {
                let c: abi::CmdMcast = cmd(b)?;
                self.shard(c.qpn)
                    .dev
                    .attach_mcast(Qpn(c.qpn), Gid(c.gid))
                    .map_err(verr)?;
                Ok(Vec::new())
            }
            op::DETACH_MCAST => {
                let c: abi::CmdMcast = cmd(b)?;
                self.shard(c.qpn)
                    .dev
                    .detach_mcast(Qpn(c.qpn), Gid(c.gid))
                    .map_err(verr)?;
                Ok(Vec::new())
            }
            op::RESET => {
                self.reset();
                Ok(Vec::new())
            }
            _ => Err(Status::Unsupported),
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
            _ => return Err(Status::Unsupported),
        };
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
            cap,
            sq_sig_all: c.flags & abi::CREATE_QP_SQ_SIG_ALL != 0,
        }) {
            Ok(n) => n,
            Err(e) => {
                self.common.lists().release(lb);
                return Err(verr(e));
            }
        };
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
        if c.max_sge == 0 || c.max_sge > self.cfg.dev.max_sge || c.max_wr > self.cfg.dev.max_srq_wr
        {
            return Err(Status::Invalid);
        }
        let ring = Ring::new(mem, &c.queue, ring::recv_wqe_size(c.max_sge), c.max_wr)?;
        let lb = ring_list_bytes(&ring);
        self.common.lists().charge(lb)?;
        let r = self
            .any()
            .dev
            .create_srq(c.pdn, c.max_wr, c.max_sge, c.srq_limit);
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

    /// REG_USER_MR. `page_offset`: where the first byte lies in the first page (the 48-byte
    /// command); `None` (the 40-byte command): `iova mod page`, the rule before the field.
    fn reg_user_mr(
        &mut self,
        mem: &GuestMemoryMmap,
        mut c: abi::CmdRegUserMr,
        page_offset: Option<u32>,
    ) -> CmdResult {
        c.access &= !abi::ACCESS_IGNORED;
        if c.access & !Access::ALL.0 != 0
            || c.length > self.cfg.dev.max_mr_size
            || c.length > self.cfg.dev.max_registered_bytes
            || c.iova.checked_add(c.length).is_none()
            || !(12..=30).contains(&c.pages.page_shift)
        {
            return Err(Status::Invalid);
        }
        let shift = c.pages.page_shift as u32;
        let mask = (1u64 << shift) - 1;
        let offset = page_offset.map_or(c.iova & mask, u64::from);
        if offset > mask {
            return Err(Status::Invalid);
        }
        let need = offset
            .checked_add(c.length)
            .ok_or(Status::Invalid)?
            .div_ceil(1 << shift)
            .max(1);
        if need > crate::memory::guest_mem::MAX_PAGES as u64 || c.pages.num_pages as u64 != need {
            return Err(Status::Invalid);
        }
        // Both budgets before the list is read: a registration that cannot fit costs nothing.
        let fits = self
            .any()
            .dev
            .registered_bytes()
            .checked_add(c.length)
            .is_some_and(|t| t <= self.cfg.dev.max_registered_bytes);
        if !fits {
            return Err(Status::NoMemory);
        }
        // The list's copy is what the page-list cap bounds.
        let lb = list_bytes(need as usize);
        self.common.lists().charge(lb)?;
        let r = resolve_page_list(mem, &c.pages, need as u32).and_then(|pages| {
            self.any()
                .dev
                .reg_mr(
                    c.pdn,
                    c.iova,
                    c.length,
                    Access(c.access),
                    ring::pages_backing(c.pages.page_shift, offset, pages),
                )
                .map_err(verr)
        });
        match r {
            Ok(k) => body(abi::RespMr { lkey: k, rkey: k }),
            Err(e) => {
                self.common.lists().release(lb);
                Err(e)
            }
        }
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

    /// Raises a port event (the transport lost or regained its socket).
    pub fn port_event(&mut self, active: bool) {
        let e = if active {
            abi::event::PORT_ACTIVE
        } else {
            abi::event::PORT_ERR
        };
        self.common.push_event(abi::event::KIND_ASYNC, e, 1);
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

/// Hands a received packet to the shard of its destination QP; a multicast packet to every
/// shard in turn (each delivers to its own members; one shard locked at a time); one too
/// short to name a QP to the first, which drops it. Returns the shards it went to, a bit each.
fn route(c: &Common, shards: &[Arc<Mutex<Shard>>], p: &Packet) -> u64 {
    // The BTH's destination QP, if the packet holds a BTH.
    let b = p.bytes;
    let dqpn = (b.len() >= 12).then(|| u32::from_be_bytes([0, b[5], b[6], b[7]]));
    let n = shards.len();
    let (first, count) = match dqpn {
        Some(MULTICAST_QPN) => (0, n),
        Some(q) => (Device::shard_of(Qpn(q), n as u32) as usize, 1),
        None => (0, 1),
    };
    for s in &shards[first..first + count] {
        lock(s).handle_packet(c, p, dqpn);
    }
    (((1u128 << count) - 1) << first) as u64
}

/// One engine shard of a device for the thread that drives it (`--shard-threads`): its
/// packets, pumps and timers. Control commands and doorbells for its QPs still come from
/// the device's worker, which takes the shard's lock for them.
pub struct ShardHandle {
    k: usize,
    common: Arc<Common>,
    shards: Vec<Arc<Mutex<Shard>>>,
}

impl ShardHandle {
    /// Its index among the device's shards.
    pub fn index(&self) -> usize {
        self.k
    }

    /// [`Model::handle_packet`] for a packet this shard's socket received; returns the shards
    /// it went to, a bit each (another's only for multicast, or a packet the kernel steered
    /// elsewhere than its QPN says).
    pub fn handle_packet(
        &self,
        mem: &GuestMemoryMmap,
        now: Instant,
        meta: &RecvMeta,
        bytes: &[u8],
    ) -> u64 {
        let p = Packet {
            mem,
            now,
            meta,
            bytes,
            src: None,
            in_memory: false,
        };
        route(&self.common, &self.shards, &p)
    }

    /// [`Model::pump_budget`] for this shard.
    pub fn pump(
        &self,
        mem: &GuestMemoryMmap,
        now: Instant,
        tx: &mut dyn PacketSink,
        budget: usize,
    ) -> Pump {
        let mut left = budget;
        lock(&self.shards[self.k]).pump(&self.common, mem, now, tx, &mut left)
    }

    pub fn handle_timeout(&self, now: Instant) {
        lock(&self.shards[self.k]).dev.handle_timeout(now);
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        lock(&self.shards[self.k]).dev.poll_timeout()
    }

    /// Counts the events raised so far: when it moves, the device's worker has events to
    /// hand the guest.
    pub fn events_raised(&self) -> u64 {
        lock(&self.common.events).raised
    }
}

impl Shard {
    fn new(k: usize, dev: Device) -> Self {
        Shard {
            k,
            dev,
            qps: HashMap::new(),
            sq_backlog: BTreeSet::new(),
            sq_active: BTreeSet::new(),
            rq_active: BTreeSet::new(),
            stats: ModelStats::default(),
            mcast_scratch: Vec::new(),
            cqe_scratch: Vec::new(),
            refs_scratch: Default::default(),
            seg_buf: Vec::new(),
            slot: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// [`Model::handle_packet_refs`] in this shard, whose QP `dqpn` is (or, for multicast,
    /// whose members of the group are) the destination.
    fn handle_packet(&mut self, c: &Common, p: &Packet, dqpn: Option<u32>) {
        let (mem, meta, bytes) = (p.mem, p.meta, p.bytes);
        if let Some(dqpn) = dqpn {
            if self.qps.contains_key(&dqpn) {
                self.pull_rq(c, mem, dqpn);
            } else if dqpn == MULTICAST_QPN && meta.dst.is_multicast() {
                // Every QP of this shard attached to the group gets a copy: each needs its
                // receives.
                let mut members = std::mem::take(&mut self.mcast_scratch);
                members.clear();
                self.dev.mcast_members(&meta.dst, &mut members);
                for &q in &members {
                    if self.qps.contains_key(&q.0) {
                        self.pull_rq(c, mem, q.0);
                    }
                }
                self.mcast_scratch = members;
            }
        }
        let mut own = crate::memory::guest_mem::GuestRam(mem);
        let mut refs_ram;
        let ram: &mut dyn rxe_core::mem::Memory = match p.src {
            Some((src, refs)) if !refs.is_empty() => {
                refs_ram = crate::memory::payload_ref::RefRam::new(mem, src, refs, bytes);
                &mut refs_ram
            }
            _ => &mut own,
        };
        let _ = if p.in_memory {
            self.dev.handle_packet_in_memory(p.now, meta, bytes, ram)
        } else {
            self.dev.handle_packet(p.now, meta, bytes, ram)
        };
    }

    /// This shard's part of [`Model::pump_budget`]: at most `left` packets (counted down).
    fn pump(
        &mut self,
        c: &Common,
        mem: &GuestMemoryMmap,
        now: Instant,
        tx: &mut dyn PacketSink,
        left: &mut usize,
    ) -> Pump {
        self.apply_overflows(c);
        // What a full socket kept back goes first; it may have drained since.
        tx.flush();
        for _ in 0..64 {
            // Completions made room in the engine's send queues: take what waits in rings.
            let before = self.stats.sq_wqes;
            self.pull_backlog(c, mem);
            let mut sent = (self.stats.sq_wqes - before) as usize;
            let mut stop = None;
            loop {
                if tx.blocked() {
                    stop = Some(Pump::Blocked);
                    break;
                }
                if *left == 0 {
                    stop = Some(Pump::Budget);
                    break;
                }
                if !self.transmit(mem, now, tx) {
                    break;
                }
                *left -= 1;
                sent += 1;
                if sent.is_multiple_of(64) {
                    // Let packets and completions out between bursts.
                    tx.flush();
                    self.flush_all_cqs(c, mem);
                }
            }
            tx.flush();
            self.flush_all_cqs(c, mem);
            while let Some(e) = self.dev.poll_event() {
                Self::engine_event(c, e);
            }
            match stop {
                _ if tx.blocked() => return Pump::Blocked,
                // The flush above found room again: go on.
                Some(Pump::Blocked) => continue,
                Some(stop) => return stop,
                None => {}
            }
            if sent == 0 {
                // Local work requests (REG_MR, LOCAL_INV, BIND_MW) complete without a packet
                // and may have made room for what waits in a ring: go on only if it moved.
                let before = self.stats.sq_wqes + self.stats.bad_wqes;
                self.pull_backlog(c, mem);
                if self.stats.sq_wqes + self.stats.bad_wqes == before {
                    return Pump::Idle;
                }
            }
        }
        // Still moving after 64 rounds: the rest after other events.
        Pump::Budget
    }

    /// Moves send WQEs from the SQ ring into the engine: at most `max_send_wr` outstanding,
    /// as rxe, so the driver can never have more WQEs in flight than it sized its CQ for, and
    /// within the device's WQE budget ([`send_wqe_bytes`]).
    fn pull_sq(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
        let Some(q) = self.qps.get(&qpn) else {
            return;
        };
        let Some(sq) = q.sq.clone() else {
            return;
        };
        let Ok(prod) = sq.load_index(mem, hdr::PRODUCER_INDEX) else {
            self.qp_ring_fault(c, mem, qpn);
            return;
        };
        let caps = SqCaps {
            max_sge: q.caps.max_send_sge,
            max_inline: q.caps.max_inline_data,
            ud: matches!(q.qp_type, QpType::Ud | QpType::Gsi),
        };
        let max = q.caps.max_send_wr as usize;
        let cost = send_wqe_bytes(&q.caps);
        let mut taken = q.sq_taken;
        let outstanding = self.dev.sq_outstanding(Qpn(qpn)).unwrap_or(0);
        let mut room = max.saturating_sub(outstanding);
        self.slot.resize(sq.elem_size(), 0);
        let mut backlog = false;
        while taken != prod {
            if room == 0 {
                // Completions will make room: look again then.
                backlog = true;
                break;
            }
            if !c.wqes_fit(cost) {
                // The device's WQE budget is spent: this one waits in the ring until
                // completions give some back.
                self.stats.wqe_budget_waits += 1;
                backlog = true;
                break;
            }
            if sq.read_slot(mem, taken, &mut self.slot).is_err() {
                self.qp_ring_fault(c, mem, qpn);
                break;
            }
            let reg_list = self.reg_mr_list_in_slot();
            let mut refuse = !self.reg_mr_allowed(qpn);
            if let (Some(s), false) = (reg_list, refuse) {
                // The caps, checked before the page list is read: a QP holds at most
                // MAX_QP_REG_MR_LIST_BYTES of REG_MR lists (more waits here until its earlier
                // REG_MRs have executed); the device's budget takes the list or the WQE fails.
                let held = self.sync_reg_mr_held(c, qpn);
                if held > 0 && held.saturating_add(s) > MAX_QP_REG_MR_LIST_BYTES {
                    self.stats.reg_mr_waits += 1;
                    backlog = true;
                    break;
                }
                if !c.lists().fits(s) {
                    log::debug!("qp {qpn}: REG_MR page list of {s} bytes beyond the device cap");
                    refuse = true;
                }
            }
            if refuse {
                // Checked before the page list is read: a user ring cannot make the device
                // walk (and hold) page lists.
                let r = self.post_failed(qpn);
                if r.is_err() {
                    backlog = true;
                    break;
                }
                room -= 1;
                taken = (taken + 1) & sq.mask();
                continue;
            }
            let dev = &self.dev;
            let ah = |n: u32| n.checked_sub(1).and_then(|id| dev.ah(id));
            let r = match ring::decode_send_wqe(&self.slot, caps, &ah, mem) {
                Ok(wr) => match self.dev.post_send(Qpn(qpn), wr) {
                    Ok(()) => {
                        self.stats.sq_wqes += 1;
                        // (checked to fit above: another shard may have taken some since,
                        // by at most one WQE each)
                        c.wqes_charge(cost);
                        if let Some(q) = self.qps.get_mut(&qpn) {
                            q.wqe_held += cost;
                        }
                        Ok(())
                    }
                    Err(e @ (VerbError::NoResources | VerbError::BadState)) => Err(e),
                    Err(_) => self.post_failed(qpn),
                },
                Err((_, e)) => {
                    log::debug!("qp {qpn}: bad send WQE {e:?}");
                    self.post_failed(qpn)
                }
            };
            if r.is_err() {
                // Not ready (RESET/INIT/RTR) or full: leave the rest in the ring.
                backlog = true;
                break;
            }
            if reg_list.is_some() {
                // The engine holds the list now: it counts against the budget.
                self.sync_reg_mr_held(c, qpn);
            }
            room -= 1;
            taken = (taken + 1) & sq.mask();
        }
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.sq_taken = taken;
        }
        if backlog {
            self.sq_backlog.insert(qpn);
        } else {
            self.sq_backlog.remove(&qpn);
        }
        self.sq_active.insert(qpn);
        self.sync_sq_cons(c, mem, qpn);
    }

    /// For a REG_MR WQE in `self.slot`: the bytes of its page list (`num_pages` × 8; the
    /// list is not read). Other opcodes: `None`.
    fn reg_mr_list_in_slot(&self) -> Option<u64> {
        let at = |o: usize| u32::from_le_bytes(self.slot[o..o + 4].try_into().expect("4"));
        (at(abi::swqe::OPCODE) == abi::wr_op::REG_MR)
            .then(|| list_bytes(at(abi::swqe::REG_NUM_PAGES) as usize))
    }

    /// Brings the budget's share of `qpn`'s REG_MR lists up to what the engine holds now
    /// (lists leave it as their WQEs execute or are flushed); returns that.
    fn sync_reg_mr_held(&mut self, c: &Common, qpn: u32) -> u64 {
        let now = self.dev.sq_reg_mr_bytes(Qpn(qpn)).unwrap_or(0);
        if let Some(q) = self.qps.get_mut(&qpn) {
            let mut l = c.lists();
            l.release(q.reg_mr_held);
            l.used = l.used.saturating_add(now);
            q.reg_mr_held = now;
        }
        now
    }

    /// For a REG_MR WQE in `self.slot`: the QP is a kernel QP (CREATE_QP_KERNEL) and the MR
    /// is a fast-registration MR of the QP's PD with room for the page list. Other opcodes:
    /// true (they are validated by the decoder).
    fn reg_mr_allowed(&self, qpn: u32) -> bool {
        let at = |o: usize| u32::from_le_bytes(self.slot[o..o + 4].try_into().expect("4"));
        if at(abi::swqe::OPCODE) != abi::wr_op::REG_MR {
            return true;
        }
        let Some(q) = self.qps.get(&qpn) else {
            return false;
        };
        if !q.kernel {
            return false;
        }
        self.dev
            .with_mr(at(abi::swqe::REG_MR_LKEY), |mr| {
                mr.pd == q.pd
                    && matches!(mr.kind, rxe_core::mem::MrKind::FastReg { max_pages }
                        if at(abi::swqe::REG_NUM_PAGES) <= max_pages)
            })
            .unwrap_or(false)
    }

    /// A send WQE the device cannot execute: it completes with LOC_QP_OP_ERR in send-queue
    /// order and the QP moves to ERR (the engine flushes what came before and raises QP_FATAL).
    fn post_failed(&mut self, qpn: u32) -> Result<(), VerbError> {
        let wr_id = u64::from_le_bytes(self.slot[..8].try_into().expect("8"));
        let opc = u32::from_le_bytes(self.slot[12..16].try_into().expect("4"));
        let wc_op = match opc {
            abi::wr_op::RDMA_WRITE | abi::wr_op::RDMA_WRITE_WITH_IMM => WcOpcode::RdmaWrite,
            abi::wr_op::RDMA_READ => WcOpcode::RdmaRead,
            abi::wr_op::ATOMIC_CMP_AND_SWP => WcOpcode::CompSwap,
            abi::wr_op::ATOMIC_FETCH_AND_ADD => WcOpcode::FetchAdd,
            abi::wr_op::LOCAL_INV => WcOpcode::LocalInv,
            abi::wr_op::BIND_MW => WcOpcode::BindMw,
            abi::wr_op::REG_MR => WcOpcode::RegMr,
            abi::wr_op::ATOMIC_WRITE => WcOpcode::AtomicWrite,
            abi::wr_op::FLUSH => WcOpcode::Flush,
            _ => WcOpcode::Send,
        };
        self.dev
            .post_send_failed(Qpn(qpn), wr_id, wc_op, WcStatus::LocQpOpErr)?;
        self.stats.bad_wqes += 1;
        Ok(())
    }

    /// Publishes the SQ consumer index: the oldest WQE the engine has not completed.
    fn sync_sq_cons(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
        self.sync_reg_mr_held(c, qpn);
        let outstanding = self.dev.sq_outstanding(Qpn(qpn)).unwrap_or(0) as u32;
        let Some(q) = self.qps.get_mut(&qpn) else {
            self.sq_active.remove(&qpn);
            return;
        };
        // The WQEs that completed give their bytes back to the budget.
        let held = outstanding as u64 * send_wqe_bytes(&q.caps);
        if held < q.wqe_held {
            c.wqes_release(q.wqe_held - held);
            q.wqe_held = held;
        }
        let Some(sq) = &q.sq else {
            self.sq_active.remove(&qpn);
            return;
        };
        let cons = q.sq_taken.wrapping_sub(outstanding) & sq.mask();
        if cons != q.sq_cons {
            q.sq_cons = cons;
            if sq.store_index(mem, hdr::CONSUMER_INDEX, cons).is_err() {
                self.qp_ring_fault(c, mem, qpn);
            }
        }
        if outstanding == 0 {
            self.sq_active.remove(&qpn);
        }
    }

    /// A receive WQE the device cannot use: the QP goes to the error state (flushing what
    /// came before), then the WQE completes with LOC_QP_OP_ERR.
    /// A QP ring the device cannot read or write (its pages left guest memory): counted, and
    /// the QP moves to ERR with QP_FATAL (once), so its user sees an error rather than a QP
    /// that silently stops.
    fn qp_ring_fault(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
        self.stats.ring_faults += 1;
        let Some(q) = self.qps.get_mut(&qpn) else {
            return;
        };
        if std::mem::replace(&mut q.faulted, true) {
            return;
        }
        let cqn = q.recv_cq;
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        let _ = self
            .dev
            .modify_qp(Qpn(qpn), &attr, AttrMask(AttrMask::STATE));
        self.flush_cq(c, mem, cqn);
        c.push_event(abi::event::KIND_ASYNC, abi::event::QP_FATAL, qpn);
    }

    fn bad_recv_wqe(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32, wr_id: u64) {
        self.stats.bad_wqes += 1;
        let attr = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        let _ = self
            .dev
            .modify_qp(Qpn(qpn), &attr, AttrMask(AttrMask::STATE));
        let Some(q) = self.qps.get(&qpn) else {
            return;
        };
        let cqn = q.recv_cq;
        self.flush_cq(c, mem, cqn);
        let wc = ring::error_cqe(wr_id, qpn, WcOpcode::Recv as u32, WcStatus::LocQpOpErr);
        self.write_cqe(c, mem, cqn, &wc);
        c.push_event(abi::event::KIND_ASYNC, abi::event::QP_FATAL, qpn);
    }

    /// Moves receive WQEs from the RQ ring into the engine.
    fn pull_rq(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
        let Some(q) = self.qps.get(&qpn) else {
            return;
        };
        if let Some(s) = q.srq {
            self.pull_srq(c, mem, s);
            return;
        }
        let Some(rq) = q.rq.clone() else {
            return;
        };
        let max_sge = q.caps.max_recv_sge;
        let Ok(prod) = rq.load_index(mem, hdr::PRODUCER_INDEX) else {
            self.qp_ring_fault(c, mem, qpn);
            return;
        };
        let mut cons = q.rq_taken;
        if cons == prod {
            return;
        }
        self.slot.resize(rq.elem_size(), 0);
        while cons != prod {
            if rq.read_slot(mem, cons, &mut self.slot).is_err() {
                self.qp_ring_fault(c, mem, qpn);
                break;
            }
            match ring::decode_recv_wqe(&self.slot, max_sge) {
                Ok(wr) => match self.dev.post_recv(Qpn(qpn), wr) {
                    Ok(()) => self.stats.rq_wqes += 1,
                    // Full, or RESET: leave the rest in the ring.
                    Err(_) => break,
                },
                Err((wr_id, _)) => self.bad_recv_wqe(c, mem, qpn, wr_id),
            }
            cons = (cons + 1) & rq.mask();
        }
        if let Some(q) = self.qps.get_mut(&qpn) {
            q.rq_taken = cons;
        }
        self.rq_active.insert(qpn);
        // receives with a bad WQE completed at once
        self.sync_rq_cons(c, mem, qpn);
    }

    /// Publishes the RQ consumer index: the oldest receive the engine has not completed.
    fn sync_rq_cons(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
        let outstanding = self.dev.rq_outstanding(Qpn(qpn)).unwrap_or(0) as u32;
        let Some(q) = self.qps.get_mut(&qpn) else {
            self.rq_active.remove(&qpn);
            return;
        };
        let Some(rq) = &q.rq else {
            self.rq_active.remove(&qpn);
            return;
        };
        let cons = q.rq_taken.wrapping_sub(outstanding) & rq.mask();
        if cons != q.rq_cons {
            q.rq_cons = cons;
            if rq.store_index(mem, hdr::CONSUMER_INDEX, cons).is_err() {
                self.qp_ring_fault(c, mem, qpn);
            }
        }
        if outstanding == 0 {
            self.rq_active.remove(&qpn);
        }
    }

    fn pull_srq(&mut self, c: &Common, mem: &GuestMemoryMmap, srqn: u32) {
        let Some(srq) = c.srq(srqn) else {
            return;
        };
        // Held throughout: the receives of one SRQ are taken by one shard at a time.
        let mut s = lock(&srq);
        let ring = s.ring.clone();
        let max_sge = s.max_sge;
        let Ok(prod) = ring.load_index(mem, hdr::PRODUCER_INDEX) else {
            self.stats.ring_faults += 1;
            return;
        };
        let mut cons = s.cons;
        if cons == prod {
            return;
        }
        self.slot.resize(ring.elem_size(), 0);
        while cons != prod {
            if ring.read_slot(mem, cons, &mut self.slot).is_err() {
                self.stats.ring_faults += 1;
                break;
            }
            match ring::decode_recv_wqe(&self.slot, max_sge) {
                Ok(wr) => match self.dev.post_srq_recv(srqn, wr) {
                    Ok(()) => self.stats.rq_wqes += 1,
                    Err(_) => break,
                },
                // No QP to blame: the WQE is skipped and counted.
                Err(_) => self.stats.bad_wqes += 1,
            }
            cons = (cons + 1) & ring.mask();
        }
        s.cons = cons;
        if ring.store_index(mem, hdr::CONSUMER_INDEX, cons).is_err() {
            self.stats.ring_faults += 1;
        }
    }

    /// Is the CQ ring full? Marks the overflow (once) and tells the engine, which moves
    /// every QP using the CQ to ERR and raises CQ_ERR, as rxe: this shard at once, the
    /// others at their next pump.
    fn ring_full(
        &mut self,
        c: &Common,
        mem: &GuestMemoryMmap,
        cqn: u32,
        cq: &mut CqShadow,
    ) -> Option<bool> {
        let Ok(cons) = cq.ring.load_index(mem, hdr::CONSUMER_INDEX) else {
            self.stats.ring_faults += 1;
            return None;
        };
        if (cq.prod.wrapping_add(1).wrapping_sub(cons)) & cq.ring.mask() != 0 {
            return Some(false);
        }
        if !cq.overflowed {
            cq.overflowed = true;
            self.stats.cq_overflows += 1;
            self.dev.cq_overflow(cqn);
            for (j, o) in c.overflowed.iter().enumerate() {
                if j != self.k {
                    lock(o).push(cqn);
                }
            }
        }
        Some(true)
    }

    /// Moves the QPs of this shard that use a CQ another shard found overflowed to ERR.
    fn apply_overflows(&mut self, c: &Common) {
        let Some(o) = c.overflowed.get(self.k) else {
            return;
        };
        let cqs = std::mem::take(&mut *lock(o));
        for cqn in cqs {
            self.dev.cq_overflow(cqn);
        }
    }

    /// Writes one CQE into a CQ ring (overflow moves the CQ's QPs to the error state).
    fn write_cqe(&mut self, c: &Common, mem: &GuestMemoryMmap, cqn: u32, wc: &abi::UverbsWc) {
        let Some(cq) = c.cq(cqn) else {
            return;
        };
        let mut cq = lock(&cq);
        if self.ring_full(c, mem, cqn, &mut cq) != Some(false) {
            return;
        }
        if cq
            .ring
            .write_slot(mem, cq.prod, ring::cqe_bytes(wc))
            .is_err()
        {
            self.stats.ring_faults += 1;
            return;
        }
        cq.prod = (cq.prod + 1) & cq.ring.mask();
        if cq
            .ring
            .store_index(mem, hdr::PRODUCER_INDEX, cq.prod)
            .is_err()
        {
            self.stats.ring_faults += 1;
        }
        self.stats.cqes += 1;
        self.check_arm(c, mem, cqn, &mut cq, Some(wc.status != 0));
    }

    /// Moves the engine's completions for `cqn` into the guest ring: as many at a time as the
    /// ring has room for (up to [`CQE_BATCH`]), taken from the engine under one lock. The
    /// CQ's shadow is held throughout: completions of QPs of other shards wait.
    fn flush_cq(&mut self, c: &Common, mem: &GuestMemoryMmap, cqn: u32) {
        let Some(cq) = c.cq(cqn) else {
            return;
        };
        let mut cq = lock(&cq);
        let mut wrote = false;
        // A solicited receive or an error among them: fires a solicited-only arm.
        let mut solicited = false;
        let mut batch = std::mem::take(&mut self.cqe_scratch);
        'fill: loop {
            let Ok(cons) = cq.ring.load_index(mem, hdr::CONSUMER_INDEX) else {
                self.stats.ring_faults += 1;
                break;
            };
            // One slot stays empty: the ring is full when prod + 1 == cons.
            let mask = cq.ring.mask();
            let room = (mask - (cq.prod.wrapping_sub(cons) & mask)) as usize;
            if room == 0 {
                if self.dev.cq_len(cqn) == 0 {
                    break;
                }
                match self.ring_full(c, mem, cqn, &mut cq) {
                    // The guest took some meanwhile.
                    Some(false) => continue,
                    Some(true) => {
                        // The CQ is in error: what the engine still holds is lost, as the
                        // completion that did not fit (rxe drops it the same way).
                        batch.clear();
                        self.dev.poll_cq_into(cqn, usize::MAX, &mut batch);
                    }
                    None => {}
                }
                break;
            }
            batch.clear();
            if self.dev.poll_cq_into(cqn, room.min(CQE_BATCH), &mut batch) == 0 {
                break;
            }
            for e in &batch {
                let wc = ring::encode_cqe(e);
                if cq
                    .ring
                    .write_slot(mem, cq.prod, ring::cqe_bytes(&wc))
                    .is_err()
                {
                    self.stats.ring_faults += 1;
                    break 'fill;
                }
                cq.prod = (cq.prod + 1) & cq.ring.mask();
                self.stats.cqes += 1;
                solicited |= e.solicited || e.status != WcStatus::Success;
                wrote = true;
            }
        }
        batch.clear();
        self.cqe_scratch = batch;
        if wrote {
            if cq
                .ring
                .store_index(mem, hdr::PRODUCER_INDEX, cq.prod)
                .is_err()
            {
                self.stats.ring_faults += 1;
            }
            self.check_arm(c, mem, cqn, &mut cq, Some(solicited));
        }
    }

    /// [`Self::check_arm`] for a CQ doorbell.
    fn check_cq_arm(&mut self, c: &Common, mem: &GuestMemoryMmap, cqn: u32) {
        if let Some(cq) = c.cq(cqn) {
            self.check_arm(c, mem, cqn, &mut lock(&cq), None);
        }
    }

    /// The arm protocol (doc: "CQ notification"): after publishing CQEs the device fences and
    /// reads the notify word. `wrote` is `Some(solicited)` after publishing completions
    /// (`solicited`: one of them was a solicited receive or an error), `None` for a CQ
    /// doorbell. NEXT_COMP fires on any new CQE (on a doorbell: if the ring is not empty);
    /// SOLICITED fires on a solicited or error completion.
    fn check_arm(
        &mut self,
        c: &Common,
        mem: &GuestMemoryMmap,
        cqn: u32,
        cq: &mut CqShadow,
        wrote: Option<bool>,
    ) {
        fence(Ordering::SeqCst);
        let Ok(w) = cq.ring.buf.load_u32(mem, hdr::CQ_NOTIFY, Ordering::Acquire) else {
            self.stats.ring_faults += 1;
            return;
        };
        let fire = match wrote {
            Some(solicited) => {
                w & hdr::NOTIFY_NEXT_COMP != 0 || (w & hdr::NOTIFY_SOLICITED != 0 && solicited)
            }
            None => {
                w & hdr::NOTIFY_NEXT_COMP != 0
                    && cq
                        .ring
                        .load_index(mem, hdr::CONSUMER_INDEX)
                        .is_ok_and(|i| i != cq.prod)
            }
        };
        if fire {
            let _ = cq
                .ring
                .buf
                .store_u32(mem, hdr::CQ_NOTIFY, 0, Ordering::Release);
            c.push_event(abi::event::KIND_COMPLETION, 0, cqn);
        }
    }

    /// Pushes the engine's next packet into `tx`, with payload references where the sink
    /// takes them for an RC packet, else whole; false if the engine had none.
    fn transmit(&mut self, mem: &GuestMemoryMmap, now: Instant, tx: &mut dyn PacketSink) -> bool {
        if !tx.takes_refs() {
            let mut ram = crate::memory::guest_mem::GuestRam(mem);
            let Some(t) = self.dev.poll_transmit(now, &mut ram, tx.next_buf()) else {
                return false;
            };
            tx.push(&t);
            return true;
        }
        let refs = std::mem::take(&mut self.refs_scratch);
        let seg = tx.segment();
        let cap = (seg + rxe_core::device::SEGMENT_HEADROOM).max(PACKET_BUF);
        if self.seg_buf.len() < cap {
            self.seg_buf.resize(cap, 0);
        }
        let t = {
            let buf = &mut self.seg_buf[..cap];
            let mut ram = crate::memory::payload_ref::DeferringRam::new(mem, buf, &refs);
            let sink = &*tx;
            let in_memory = |g: &Gid| seg > 0 && sink.in_memory(g);
            self.dev
                .poll_transmit_segments(now, &mut ram, buf, &in_memory)
        };
        if let Some(t) = &t {
            let noted = !refs.borrow().is_empty();
            let rc = self.dev.qp(t.qpn).is_some_and(|q| q.qp_type == QpType::Rc);
            let roce = &self.seg_buf[..t.len.min(cap)];
            if rc && tx.wants_refs(t) {
                tx.push_refs(t, roce, &refs.borrow());
            } else {
                // For the wire: the packet's own bytes into the sink's buffer, the noted
                // payload read from guest memory straight into it.
                let buf = tx.next_buf();
                if t.len <= buf.len() {
                    crate::memory::payload_ref::copy_unreferenced(roce, &refs.borrow(), buf);
                    if noted {
                        crate::memory::payload_ref::resolve(mem, &refs.borrow(), buf);
                    }
                    tx.push(t);
                } else {
                    // A segment for a device no longer reached in memory: lost, as on a
                    // wire; the requester sends it again, in packets if it is still not.
                    self.stats.tx_lost_segments += 1;
                }
            }
        }
        self.refs_scratch = refs;
        t.is_some()
    }

    /// Pulls the SQs that left WQEs in their rings (no room, not ready, a REG_MR cap).
    fn pull_backlog(&mut self, c: &Common, mem: &GuestMemoryMmap) {
        if self.sq_backlog.is_empty() {
            return;
        }
        let mut v = std::mem::take(&mut self.scratch);
        v.clear();
        v.extend(self.sq_backlog.iter().copied());
        for &qpn in &v {
            self.pull_sq(c, mem, qpn);
        }
        self.scratch = v;
    }

    fn flush_all_cqs(&mut self, c: &Common, mem: &GuestMemoryMmap) {
        let mut v = std::mem::take(&mut self.scratch);
        // The engine retired the send and receive WQEs before it produced their completions:
        // the SQ and RQ consumer indices move first, so a guest that sees a completion and
        // posts again finds the slot free.
        v.clear();
        v.extend(self.sq_active.iter().copied());
        for &q in &v {
            self.sync_sq_cons(c, mem, q);
        }
        v.clear();
        v.extend(self.rq_active.iter().copied());
        for &q in &v {
            self.sync_rq_cons(c, mem, q);
        }
        // The CQs that received completions, not every CQ.
        // (A CQ that QPs of several shards completed into is listed by each; the first
        // to flush it finds the others' completions too.)
        v.clear();
        self.dev.take_ready_cqs(&mut v);
        for &cqn in &v {
            self.flush_cq(c, mem, cqn);
            if self.dev.cq_len(cqn) > 0 && read(&c.cqs).contains_key(&cqn) {
                // Left in the engine (a ring it could not read): try again next pass, as
                // before the list existed.
                self.dev.relist_cq(cqn);
            }
        }
        self.scratch = v;
    }

    fn engine_event(c: &Common, e: AsyncEvent) {
        use abi::event as ev;
        let (event, object) = match e {
            AsyncEvent::Completion { cqn } => {
                // The device never arms engine CQs (the notify word is checked as CQEs are
                // written), but an event from the engine is passed on all the same.
                c.push_event(ev::KIND_COMPLETION, 0, cqn);
                return;
            }
            AsyncEvent::CqErr { cqn } => (ev::CQ_ERR, cqn),
            AsyncEvent::QpFatal { qpn } => (ev::QP_FATAL, qpn.0),
            AsyncEvent::QpReqErr { qpn } => (ev::QP_REQ_ERR, qpn.0),
            AsyncEvent::QpAccessErr { qpn } => (ev::QP_ACCESS_ERR, qpn.0),
            AsyncEvent::CommEst { qpn } => (ev::COMM_EST, qpn.0),
            AsyncEvent::SqDrained { qpn } => (ev::SQ_DRAINED, qpn.0),
            AsyncEvent::QpLastWqeReached { qpn } => (ev::QP_LAST_WQE_REACHED, qpn.0),
            AsyncEvent::SrqLimitReached { srqn } => (ev::SRQ_LIMIT_REACHED, srqn),
        };
        c.push_event(ev::KIND_ASYNC, event, object);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_list_budget_charges_up_to_the_cap_and_never_overflows() {
        let mut b = PageListBudget::new(1 << 20);
        assert!(b.fits(1 << 20));
        b.charge(1 << 19).unwrap();
        b.charge(1 << 19).unwrap();
        assert_eq!(b.charge(8), Err(Status::NoMemory));
        assert_eq!(b.charge(u64::MAX), Err(Status::NoMemory));
        assert_eq!(b.used, 1 << 20, "a refused charge keeps nothing");
        b.release(1 << 19);
        assert!(b.fits(1 << 19) && !b.fits((1 << 19) + 1));
        b.release(u64::MAX);
        assert_eq!(b.used, 0);
    }

    #[test]
    fn the_config_space_states_the_caps_as_log2() {
        let m = Model::new(ModelConfig {
            dev: DeviceConfig::default(),
            max_page_list_bytes: 1 << 26,
            ..Default::default()
        });
        let c = m.config_space();
        assert_eq!(c.log2_max_page_list_bytes, 26);
        assert_eq!(
            1u64 << c.log2_max_qp_reg_mr_list_bytes,
            MAX_QP_REG_MR_LIST_BYTES
        );
        assert_ne!(c.caps & abi::caps::MR_PAGE_OFFSET, 0);
        assert_eq!(m.page_lists(), PageListBudget::new(1 << 26));
        let flush = abi::dev_cap::FLUSH_GLOBAL | abi::dev_cap::FLUSH_PERSISTENT;
        assert_eq!(c.device_cap_flags & flush, flush, "as rxe states them");
        assert_eq!(flush, (1 << 38) | (1 << 39));
    }

    /// A sink whose socket was full and has drained: the pump sends what it kept back and
    /// goes on (here: the engine is idle), rather than waiting for another EPOLLOUT.
    #[test]
    fn a_sink_that_drained_is_not_reported_blocked() {
        struct Drained {
            blocked: bool,
            buf: Vec<u8>,
        }
        impl PacketSink for Drained {
            fn next_buf(&mut self) -> &mut [u8] {
                assert!(!self.blocked, "no packet is taken while blocked");
                &mut self.buf
            }
            fn push(&mut self, _: &rxe_core::device::Transmit) {}
            fn flush(&mut self) {
                self.blocked = false;
            }
            fn blocked(&self) -> bool {
                self.blocked
            }
        }
        let mut m = Model::new(ModelConfig::default());
        let mem = GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 16)]).unwrap();
        let mut tx = Drained {
            blocked: true,
            buf: vec![0; 8192],
        };
        assert_eq!(m.pump(&mem, Instant(1), &mut tx), Pump::Idle);
        // Still full after the flush: blocked, and nothing taken from the engine.
        struct Full;
        impl PacketSink for Full {
            fn next_buf(&mut self) -> &mut [u8] {
                panic!("no packet is taken while blocked")
            }
            fn push(&mut self, _: &rxe_core::device::Transmit) {}
            fn flush(&mut self) {}
            fn blocked(&self) -> bool {
                true
            }
        }
        assert_eq!(m.pump(&mem, Instant(1), &mut Full), Pump::Blocked);
    }

    /// A device reset re-seeds: the objects created after it are not named as before.
    #[test]
    fn a_reset_draws_new_keys_and_qpns() {
        let mut m = Model::new(ModelConfig {
            dev: DeviceConfig {
                seed: Some(42),
                ..Default::default()
            },
            ..Default::default()
        });
        let names = |m: &mut Model| {
            let mut s = m.any();
            let pd = s.dev.alloc_pd().unwrap();
            let cq = s.dev.create_cq(16).unwrap();
            let key = s.dev.alloc_mr(pd, 16).unwrap();
            let qpn = s
                .dev
                .create_qp(rxe_core::QpInit {
                    qp_type: QpType::Rc,
                    pd,
                    send_cq: cq,
                    recv_cq: cq,
                    srq: None,
                    cap: QpCap::default(),
                    sq_sig_all: false,
                })
                .unwrap();
            (key, qpn.0)
        };
        let before = names(&mut m);
        m.reset();
        let after = names(&mut m);
        assert_ne!(before, after);
    }

    /// Shards handed to threads of their own: a packet this model takes for one of them
    /// (or a multicast packet, for every shard) marks it touched, so that its thread is woken;
    /// its own shard 0 is never marked; the marks are taken once.
    #[test]
    fn shards_handed_out_are_marked_when_this_model_works_on_them() {
        let mut m = Model::new(ModelConfig {
            shards: 3,
            ..Default::default()
        });
        let h = m.hand_out_shards();
        assert_eq!(h.iter().map(ShardHandle::index).collect::<Vec<_>>(), [1, 2]);
        let mem = GuestMemoryMmap::from_ranges(&[(vm_memory::GuestAddress(0), 1 << 16)]).unwrap();
        let meta = RecvMeta {
            src: Gid::from_ip("10.0.0.1".parse().unwrap()),
            dst: Gid::from_ip("10.0.0.2".parse().unwrap()),
            sport: 0,
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        };
        // A SEND_ONLY BTH to `qpn`, and an ICRC (wrong: the engine drops it, as it should).
        let packet = |qpn: u32| {
            let mut b = vec![0u8; 16];
            b[0] = 0x04;
            b[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
            b
        };
        for (qpn, touched) in [(3, 0), (4, 1 << 1), (5, 1 << 2)] {
            m.handle_packet(&mem, Instant(1), &meta, &packet(qpn));
            assert_eq!(m.take_touched(), touched, "QPN {qpn}");
            assert_eq!(m.take_touched(), 0, "QPN {qpn}: taken once");
        }
        m.handle_packet(&mem, Instant(1), &meta, &packet(MULTICAST_QPN));
        assert_eq!(m.take_touched(), 0b110, "multicast: every shard");
        // A shard's thread sees the packets of other shards land there too.
        assert_eq!(
            h[0].handle_packet(&mem, Instant(1), &meta, &packet(5)),
            1 << 2
        );
        // Without shards handed out, nothing is marked.
        let mut one = Model::new(ModelConfig {
            shards: 3,
            ..Default::default()
        });
        one.handle_packet(&mem, Instant(1), &meta, &packet(5));
        assert_eq!(one.take_touched(), 0);
        // Each packet went to the shard its QPN names, the multicast one to all three.
        let rx =
            |m: &Model| -> Vec<u64> { m.shard_loads().iter().map(|l| l.1.rx_packets).collect() };
        assert_eq!(rx(&m), [2, 2, 3]);
        assert_eq!(rx(&one), [0, 0, 1]);
    }

    /// A pending event is merged with a new one for the same object; a dropped one counts.
    #[test]
    fn events_are_counted_as_raised_merged_or_dropped() {
        let m = Model::new(ModelConfig::default());
        for _ in 0..3 {
            m.common
                .push_event(abi::event::KIND_ASYNC, abi::event::QP_FATAL, 17);
        }
        assert_eq!((m.events_len(), m.stats().events_raised), (1, 1));
        for qpn in 0..MAX_PENDING_EVENTS as u32 {
            m.common
                .push_event(abi::event::KIND_ASYNC, abi::event::QP_FATAL, qpn);
        }
        assert!(m.stats().events_dropped > 0);
        assert_eq!(
            m.stats().events_raised + m.stats().events_dropped,
            MAX_PENDING_EVENTS as u64
        );
    }
}
