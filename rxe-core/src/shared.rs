//! What the engine's state machines share, below them all: the device's configuration and
//! resources (object tables, counters, the shared state of its shards), the objects QPs
//! point at (CQs, SRQs, PDs), and the packet-I/O types (`RecvMeta`, `Transmit`, `Drop`).
//! `device.rs` above is the driving surface alone (quinn-proto's `shared.rs` split).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::brlock::{BrLock, BrRead, BrWrite};
use crate::mem::*;
use crate::slab::Slab;
use crate::types::{Gid, Qpn};
use crate::verbs::*;
use crate::wire;

/// Device limits and identity (what `ibv_query_device` / `ibv_query_port` report).
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_inline: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_mr_size: u64,
    /// Total bytes all MRs may register.
    pub max_registered_bytes: u64,
    pub max_pd: u32,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_ah: u32,
    pub max_mcast_grp: u32,
    pub max_mcast_qp_attach: u32,
    pub gid_table_len: u32,
    /// The port's active MTU (largest path MTU QPs may use).
    pub port_mtu: Mtu,
    pub mac: [u8; 6],
    /// `retry_cnt = 7` retries forever, as Linux rxe does. Off by default: IBTA gives "7 =
    /// infinite" only to `rnr_retry`; with `retry_cnt = 7` a WQE is sent at most eight times
    /// and then completes with `RetryExcErr` (as hardware RoCE NICs do), so a requester whose
    /// peer has gone ends instead of retrying for ever.
    pub infinite_retry_cnt: bool,
    /// Seed of the key bytes (the low 8 bits of every L_Key/R_Key) and of the first QPN.
    /// `None`: a fixed sequence (keys step by 0x11 from 0x11, QPNs start at 0x11), for
    /// tests and reproducible fuzzing. `Some`: key bytes drawn at random, as rxe's
    /// `rxe_get_next_key()`, and QPNs starting at a random place, so that an off-path sender
    /// cannot name a guest's MR or QP by counting. The daemon gives every device its own.
    pub seed: Option<u64>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            max_qp: 1024,
            max_qp_wr: 16384,
            max_sge: 32,
            max_inline: 512,
            max_cq: 2048,
            max_cqe: 32767,
            max_mr: 4096,
            max_mr_size: u64::MAX,
            max_registered_bytes: 8 << 30,
            max_pd: 1024,
            max_srq: 1024,
            max_srq_wr: 16384,
            max_ah: 4096,
            max_mcast_grp: 256,
            max_mcast_qp_attach: 56,
            gid_table_len: 1024,
            port_mtu: Mtu::M1024,
            mac: [0x02, 0, 0, 0, 0, 1],
            infinite_retry_cnt: false,
            seed: None,
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Cq {
    pub cap: u32,
    pub queue: VecDeque<Cqe>,
    /// Bit `i`: in shard `i`'s `Resources::ready_cqs`.
    pub listed: u64,
    /// Armed for the next completion: `Some(solicited_only)`.
    pub armed: Option<bool>,
    pub error: bool,
    pub users: u32,
}

#[derive(Debug)]
pub(crate) struct Srq {
    pub pd: u32,
    /// An XRC SRQ's domain and CQ (it holds one of the CQ's `users`); `None` for an SRQ of
    /// RC and UD QPs.
    pub xrc: Option<SrqXrc>,
    pub max_wr: u32,
    pub max_sge: u32,
    pub limit: u32,
    pub queue: VecDeque<RecvWqe>,
    pub users: u32,
}

/// The XRC part of an SRQ: the XRC domain it belongs to and the CQ its receive completions
/// go to.
#[derive(Debug)]
pub(crate) struct SrqXrc {
    pub xrcd: u32,
    pub cqn: u32,
    pub cq: Arc<Mutex<Cq>>,
}

#[derive(Debug, Default)]
pub(crate) struct Pd {
    pub users: u32,
}

/// An XRC domain: its XRC SRQs and XRC TGT QPs count as its users.
#[derive(Debug, Default)]
pub(crate) struct Xrcd {
    pub users: u32,
}

/// XRC domains a device has at most.
pub const MAX_XRCD: u32 = 256;

/// Counters for the whole port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_unknown_qp: u64,
    pub rx_bad_gid: u64,
    pub rx_malformed: u64,
    /// Congestion notification packets received (counted; congestion control is future work).
    pub rx_cnp: u64,
    /// Packets sent as segments of more than one path MTU, to devices reached in memory
    /// ([`Device::poll_transmit_segments`]).
    pub tx_segments: u64,
    /// Accesses that stopped at a page of an on-demand-paging MR not mapped.
    pub odp_faults: u64,
}

impl PortCounters {
    /// Adds `o` in (the counters of a device in shards are every shard's).
    pub fn add(&mut self, o: &PortCounters) {
        self.rx_packets += o.rx_packets;
        self.rx_bytes += o.rx_bytes;
        self.tx_packets += o.tx_packets;
        self.tx_bytes += o.tx_bytes;
        self.rx_dropped += o.rx_dropped;
        self.rx_unknown_qp += o.rx_unknown_qp;
        self.rx_bad_gid += o.rx_bad_gid;
        self.rx_malformed += o.rx_malformed;
        self.rx_cnp += o.rx_cnp;
        self.tx_segments += o.tx_segments;
        self.odp_faults += o.odp_faults;
    }
}

/// Where an incoming packet came from (filled in by the transport).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvMeta {
    pub src: Gid,
    pub dst: Gid,
    pub sport: u16,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
}

/// A packet the engine wants sent: `buf[..len]` holds BTH through a zeroed ICRC slot; the
/// transport builds the IP/UDP headers from these fields and fills the ICRC.
#[derive(Clone, Copy, Debug)]
pub struct Transmit {
    pub len: usize,
    pub src: Gid,
    pub dst: Gid,
    pub sport: u16,
    pub traffic_class: u8,
    pub hop_limit: u8,
    pub flow_label: u32,
    pub dmac: [u8; 6],
    pub qpn: Qpn,
}

impl From<&Transmit> for RecvMeta {
    /// What the receiver of `t` sees of its addressing, when nothing on the way changes it (a
    /// packet handed over in memory, a simulated wire).
    fn from(t: &Transmit) -> RecvMeta {
        RecvMeta {
            src: t.src,
            dst: t.dst,
            sport: t.sport,
            traffic_class: t.traffic_class,
            hop_limit: t.hop_limit,
            flow_label: t.flow_label,
        }
    }
}

/// Why an incoming packet was dropped (counted; never an error for the caller to act on).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drop {
    Malformed(wire::WireError),
    BadVersion,
    BadPkey,
    NotOurGid,
    UnknownQp,
    WrongQpState,
    AddressMismatch,
    BadQkey,
    NoReceiveWqe,
    Duplicate,
    OutOfSequence,
    Unexpected,
    /// A response whose PSN the requester never sent (IBTA's "ghost" response).
    Ghost,
    /// The packet's data needs a page of an on-demand-paging MR that is not mapped: the
    /// page is asked for ([`crate::Device::poll_page_fault`]) and the packet comes again
    /// (an RNR NAK for a SEND or WRITE, a retransmission for the rest).
    PageFault,
}

/// The objects every shard of a device sees (PDs, keys, AHs, GIDs, multicast groups): read
/// on the packet path, written by verbs and by the few work requests that change a key.
pub(crate) struct Objects {
    pub pds: Slab<Pd>,
    pub xrcds: Slab<Xrcd>,
    pub keys: KeyTable,
    pub registered_bytes: u64,
    pub ahs: Slab<(u32, Av)>,
    pub gids: Vec<Option<Gid>>,
    /// The distinct GIDs in `gids`, for the per-packet destination check.
    pub gid_set: Vec<Gid>,
    pub mcast: HashMap<Gid, Vec<Qpn>>,
}

impl Objects {
    pub(crate) fn refresh_gid_set(&mut self) {
        self.gid_set.clear();
        for g in self.gids.iter().flatten() {
            if !self.gid_set.contains(g) {
                self.gid_set.push(*g);
            }
        }
    }

    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.gids.get(index as usize).copied().flatten()
    }

    pub(crate) fn pd_ref(&mut self, pd: u32, delta: i32) -> Result<(), VerbError> {
        let p = self.pds.get_mut(pd).ok_or(VerbError::NotFound)?;
        p.users = p.users.wrapping_add_signed(delta);
        Ok(())
    }
}

/// What the shards of one device share ([`Device::new_sharded`]). Lock order: `objs`, then
/// the `cqs` or `srqs` table, then one CQ or SRQ. No lock is held across a call that takes
/// one earlier in that order.
pub(crate) struct Shared {
    pub objs: BrLock<Objects>,
    /// CQs: a read lock on the table and the CQ's own lock post a completion, so shards that
    /// post to different CQs do not wait for each other.
    pub cqs: RwLock<Slab<Arc<Mutex<Cq>>>>,
    pub srqs: RwLock<Slab<Arc<Mutex<Srq>>>>,
    /// Held across an atomic's read-modify-write: QPs of two shards may aim at one address.
    pub atomics: Mutex<()>,
    /// Bumped (under `objs`) whenever the GID table changes.
    pub gid_gen: AtomicU64,
    /// QPs of every shard (the `max_qp` check).
    pub live_qps: AtomicU32,
    pub shards: u32,
}

/// A lock whose holder panicked is still the object's only lock: the engine never leaves an
/// object half-changed across a panic it could catch, so the data is taken as it is.
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}
pub(crate) fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// Page faults held for the caller at most; more are dropped from the queue (a QP waiting
/// on one faults again when woken, so the page is asked for again).
pub const MAX_PENDING_FAULTS: usize = 1024;

/// One shard's view of the device: the shared objects and what the shard keeps for itself.
pub(crate) struct Resources {
    pub cfg: DeviceConfig,
    pub shared: Arc<Shared>,
    /// This shard's index (its reader lock of `Shared::objs`) and bit in [`Cq::listed`].
    pub shard: usize,
    pub shard_bit: u64,
    /// This shard's copy of the GID table and its distinct GIDs, as of `gid_gen` (every
    /// packet reads them; [`Resources::sync_gids`] renews them when the table changed).
    pub gids: Vec<Option<Gid>>,
    pub gid_set: Vec<Gid>,
    pub gid_gen: u64,
    pub events: VecDeque<AsyncEvent>,
    /// Pages of on-demand-paging MRs an access found not mapped, for
    /// [`crate::Device::poll_page_fault`], and the QPs waiting on one of them.
    pub faults: VecDeque<crate::mem::PageFault>,
    pub fault_waiters: Vec<crate::types::Qpn>,
    pub port: PortCounters,
    /// CQs that received completions from this shard since [`Device::take_ready_cqs`] last
    /// looked, each once: the caller drains those, not every CQ.
    pub ready_cqs: Vec<u32>,
    /// The packet being handled came through memory from another device of this process
    /// ([`Device::handle_packet_in_memory`]): an RC packet may then be a segment of more
    /// than one path MTU.
    pub rx_in_memory: bool,
}

impl Resources {
    #[inline]
    pub fn objs(&self) -> BrRead<'_, Objects> {
        self.shared.objs.read(self.shard)
    }
    pub fn objs_mut(&self) -> BrWrite<'_, Objects> {
        self.shared.objs.write()
    }

    /// Notes that an access of QP `qpn` stopped at `f` (the caller keeps the QP from
    /// retrying until [`crate::Device::odp_update`] maps pages, which wakes it).
    pub fn page_fault(&mut self, qpn: crate::types::Qpn, f: crate::mem::PageFault) {
        self.port.odp_faults += 1;
        if self.faults.len() < MAX_PENDING_FAULTS && !self.faults.contains(&f) {
            self.faults.push_back(f);
        }
        if !self.fault_waiters.contains(&qpn) {
            self.fault_waiters.push(qpn);
        }
    }

    /// Runs `f` on CQ `cqn` under its lock.
    pub fn with_cq<R>(&self, cqn: u32, f: impl FnOnce(&mut Cq) -> R) -> Option<R> {
        let t = read(&self.shared.cqs);
        let mut cq = lock(t.get(cqn)?);
        Some(f(&mut cq))
    }

    /// Runs `f` on SRQ `srqn` under its lock.
    pub fn with_srq<R>(&self, srqn: u32, f: impl FnOnce(&mut Srq) -> R) -> Option<R> {
        let t = read(&self.shared.srqs);
        let mut s = lock(t.get(srqn)?);
        Some(f(&mut s))
    }

    /// Posts a CQE. On overflow the CQ enters the error state and `Err` tells the caller to
    /// move the QP to ERR.
    pub fn post_cqe(
        &mut self,
        cq: &Mutex<Cq>,
        cqn: u32,
        cqe: Cqe,
        solicited: bool,
    ) -> Result<(), ()> {
        self.push_cqe(&mut lock(cq), cqn, cqe, solicited)
    }

    /// [`Self::post_cqe`] to a CQ whose lock the caller holds (to post a run of completions
    /// under one lock).
    pub fn push_cqe(&mut self, cq: &mut Cq, cqn: u32, cqe: Cqe, solicited: bool) -> Result<(), ()> {
        let bit = self.shard_bit;
        let (events, ready) = (&mut self.events, &mut self.ready_cqs);
        if cq.error {
            return Err(());
        }
        if cq.queue.len() as u32 >= cq.cap {
            cq.error = true;
            events.push_back(AsyncEvent::CqErr { cqn });
            return Err(());
        }
        cq.queue.push_back(cqe);
        if cq.listed & bit == 0 {
            cq.listed |= bit;
            ready.push(cqn);
        }
        if let Some(sol_only) = cq.armed {
            if !sol_only || solicited || cqe.status != WcStatus::Success {
                cq.armed = None;
                events.push_back(AsyncEvent::Completion { cqn });
            }
        }
        Ok(())
    }

    /// Takes the GID table again if a verb changed it since this shard last looked (one
    /// load when it did not).
    #[inline]
    pub fn sync_gids(&mut self) {
        if self.shared.gid_gen.load(Ordering::Acquire) != self.gid_gen {
            let o = self.shared.objs.read(self.shard);
            self.gids.clone_from(&o.gids);
            self.gid_set.clone_from(&o.gid_set);
            self.gid_gen = self.shared.gid_gen.load(Ordering::Relaxed);
        }
    }

    pub fn gid(&self, index: u8) -> Option<Gid> {
        self.gids.get(index as usize).copied().flatten()
    }

    pub fn is_our_gid(&self, g: &Gid) -> bool {
        self.gid_set.contains(g)
    }
}

/// First QPN handed to ordinary QPs (0 and 1 are SMI/GSI, rxe starts at 0x11).
pub const FIRST_QPN: u32 = 0x11;

/// Bytes of a segment's buffer kept for the headers and the ICRC slot
/// ([`Device::poll_transmit_segments`]; BTH, RETH, ImmDt and ICRC are 36).
pub const SEGMENT_HEADROOM: usize = 64;

/// The payload of a segment built into a buffer of `buf_len` bytes: as many whole path MTUs
/// as fit after [`SEGMENT_HEADROOM`], and at least one.
pub(crate) fn segment_payload(buf_len: usize, mtu: u32) -> u32 {
    let n = buf_len.saturating_sub(SEGMENT_HEADROOM) / mtu as usize;
    (n.clamp(1, 1024) as u32) * mtu
}

/// Parameters of `create_qp`.
#[derive(Clone, Copy, Debug)]
pub struct QpInit {
    pub qp_type: QpType,
    /// Not used by an XRC TGT QP (it has no PD of its own).
    pub pd: u32,
    /// Not used by an XRC TGT QP.
    pub send_cq: u32,
    /// Not used by XRC QPs (INI: no receive side; TGT: each XRC SRQ's CQ).
    pub recv_cq: u32,
    pub srq: Option<u32>,
    /// The XRC domain of an XRC TGT QP (required there, refused on every other type).
    pub xrcd: Option<u32>,
    pub cap: QpCap,
    pub sq_sig_all: bool,
}

impl QpInit {
    /// An XRC TGT QP in domain `xrcd`: no PD, CQ, SRQ or queue of its own.
    pub fn xrc_tgt(xrcd: u32) -> Self {
        QpInit {
            qp_type: QpType::XrcTgt,
            pd: 0,
            send_cq: 0,
            recv_cq: 0,
            srq: None,
            xrcd: Some(xrcd),
            cap: QpCap::default(),
            sq_sig_all: false,
        }
    }
}
