//! The device: every object table plus the sans-IO driving surface.
//!
//! ```text
//!  verbs (create_qp, post_send, poll_cq, ...)      ─┐
//!  handle_packet(now, meta, bytes, mem)             ├─► Device ─► poll_transmit(now, mem, buf)
//!  handle_timeout(now)                              ─┘            poll_timeout(), poll_event()
//! ```

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::brlock::BrLock;
use crate::mem::*;
use crate::qp::*;
use crate::slab::Slab;
use crate::types::{Gid, Instant, Psn, Qpn};
use crate::verbs::*;
use crate::wire::{OpFlags, Packet};

use crate::shared::*;

mod raw_verbs;
mod xrc_verbs;
pub use crate::shared::{
    DeviceConfig, Drop, PortCounters, QpInit, RecvMeta, Transmit, FIRST_QPN, MAX_XRCD,
    SEGMENT_HEADROOM,
};
pub use raw_verbs::{RAW_MAX_FRAME, RAW_MIN_FRAME};

/// A soft-RoCE device: the engine instance for one port, or one shard of it
/// ([`Device::new_sharded`]).
pub struct Device {
    pub(crate) res: Resources,
    /// Indexed by QPN; this shard's QPs only.
    pub(crate) qps: Vec<Option<Box<Qp>>>,
    pub(crate) sched: VecDeque<Qpn>,
    /// Retransmission and RNR timers of this shard's QPs.
    timers: crate::timers::TimerQueue,
    next_qpn: u32,
    shard: u32,
}

/// Queues a receive on a QP's RQ or an SRQ within its limits.
fn push_recv(
    queue: &mut VecDeque<RecvWqe>,
    max_sge: u32,
    max_wr: u32,
    wr: RecvWr,
) -> Result<(), VerbError> {
    if wr.sg_list.len() as u32 > max_sge {
        return Err(VerbError::Invalid);
    }
    if queue.len() as u32 >= max_wr {
        return Err(VerbError::NoResources);
    }
    let len = sge_total(&wr.sg_list);
    queue.push_back(RecvWqe {
        wr_id: wr.wr_id,
        sges: wr.sg_list,
        len,
    });
    Ok(())
}

/// What an MR holds of `max_registered_bytes`: a user MR its length from registration, a
/// fast-registration MR the length it mapped last; a DMA MR nothing (it pins nothing the guest
/// has not got), nor an implicit on-demand-paging MR (the whole address space; it pins
/// nothing, and its entries count against the daemon's page-list budget as they are mapped).
fn registered_len(mr: &Mr) -> u64 {
    match (&mr.kind, &mr.backing) {
        (_, Backing::OdpImplicit { .. }) | (MrKind::Dma, _) => 0,
        _ => mr.length,
    }
}

/// The access a user MR may have: known bits; remote write or atomic only with local write
/// (IBTA 10.6.3.1); no FLUSH_PERSISTENT (no memory is persistent memory to the engine: a FLUSH
/// could never make it persistent; rxe refuses the right for every page that is not pmem).
fn user_mr_access_ok(access: Access) -> bool {
    access.0 & !Access::ALL.0 == 0
        && (access.contains(Access::LOCAL_WRITE)
            || !(access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC)))
        && !access.contains(Access::FLUSH_PERSISTENT)
}

impl Device {
    pub fn new(cfg: DeviceConfig) -> Self {
        Self::new_sharded(cfg, 1).remove(0)
    }

    /// A device of `shards` shards (1 to 64), each a `Device` of its own that one thread at
    /// a time drives, all sharing the device's objects: PDs, MRs and MWs, AHs, GIDs, CQs,
    /// SRQs and multicast groups. A QP lives in one shard, [`Self::shard_of`] its QPN;
    /// `create_qp` on a shard gives it a QPN of that shard. Verbs on shared objects may be
    /// called on any shard; verbs on a QP, its packets and its timers, on its own shard.
    ///
    /// What a shard cannot do alone, its caller does on every shard: a multicast packet is
    /// handed to each (each delivers to its own members), and [`Self::cq_overflow`] moves
    /// the QPs of the shard it is called on. Completions a shard posts are listed by that
    /// shard's [`Self::take_ready_cqs`].
    pub fn new_sharded(cfg: DeviceConfig, shards: u32) -> Vec<Self> {
        let shards = shards.clamp(1, 64);
        let objs = Objects {
            pds: Slab::new(cfg.max_pd),
            xrcds: Slab::new(MAX_XRCD),
            keys: match cfg.seed {
                Some(seed) => KeyTable::with_seed(cfg.max_mr, seed),
                None => KeyTable::new(cfg.max_mr),
            },
            registered_bytes: 0,
            ahs: Slab::new(cfg.max_ah),
            gids: vec![None; cfg.gid_table_len as usize],
            gid_set: Vec::new(),
            mcast: HashMap::new(),
        };
        let shared = Arc::new(Shared {
            objs: BrLock::new(shards as usize, objs),
            cqs: RwLock::new(Slab::new(cfg.max_cq)),
            srqs: RwLock::new(Slab::new(cfg.max_srq)),
            atomics: Mutex::new(()),
            gid_gen: AtomicU64::new(0),
            live_qps: AtomicU32::new(0),
            shards,
        });
        // The QPN space is FIRST_QPN .. FIRST_QPN + 2 × max_qp, handed out round-robin.
        let start = match cfg.seed {
            Some(seed) => {
                let span = cfg.max_qp as u64 * 2;
                FIRST_QPN + crate::types::Rng::new(seed ^ 0x0051_504e).below(span) as u32
            }
            None => FIRST_QPN,
        };
        (0..shards)
            .map(|shard| {
                let res = Resources {
                    cfg: cfg.clone(),
                    shared: shared.clone(),
                    shard: shard as usize,
                    shard_bit: 1 << shard,
                    gids: vec![None; cfg.gid_table_len as usize],
                    gid_set: Vec::new(),
                    gid_gen: 0,
                    events: VecDeque::new(),
                    faults: VecDeque::new(),
                    fault_waiters: Vec::new(),
                    port: PortCounters::default(),
                    ready_cqs: Vec::new(),
                    rx_in_memory: false,
                };
                // The QP table is indexed by QPN: its whole span is reserved now (8 bytes a
                // number, pages the kernel maps only once numbers are reached), so that
                // handing out new numbers never reallocates it and the heap stays flat while
                // QPs come and go.
                let qps = Vec::with_capacity((FIRST_QPN + cfg.max_qp.saturating_mul(2)) as usize);
                Device {
                    res,
                    qps,
                    sched: VecDeque::new(),
                    timers: Default::default(),
                    next_qpn: start,
                    shard,
                }
            })
            .collect()
    }

    /// The shard (of `shards`) that a QP numbered `qpn` lives in.
    pub fn shard_of(qpn: Qpn, shards: u32) -> u32 {
        qpn.0 % shards.max(1)
    }

    /// This shard's index and the device's number of shards.
    pub fn shard(&self) -> (u32, u32) {
        (self.shard, self.res.shared.shards)
    }

    pub fn config(&self) -> &DeviceConfig {
        &self.res.cfg
    }
    pub fn port_counters(&self) -> PortCounters {
        self.res.port
    }

    // ---------------------------------------------------------------- GIDs, PDs, AHs

    /// Sets GID table entry `index` (the guest owns the table: it adds and deletes entries).
    pub fn add_gid(&mut self, index: u32, gid: Gid) -> Result<(), VerbError> {
        {
            let mut o = self.res.objs_mut();
            let slot = o.gids.get_mut(index as usize).ok_or(VerbError::Invalid)?;
            *slot = Some(gid);
            o.refresh_gid_set();
            self.res.shared.gid_gen.fetch_add(1, Ordering::Release);
        }
        self.res.sync_gids();
        Ok(())
    }
    pub fn del_gid(&mut self, index: u32) -> Result<(), VerbError> {
        {
            let mut o = self.res.objs_mut();
            let slot = o.gids.get_mut(index as usize).ok_or(VerbError::Invalid)?;
            slot.take().ok_or(VerbError::NotFound)?;
            o.refresh_gid_set();
            self.res.shared.gid_gen.fetch_add(1, Ordering::Release);
        }
        self.res.sync_gids();
        Ok(())
    }
    pub fn gid(&self, index: u32) -> Option<Gid> {
        self.res.objs().gids.get(index as usize).copied().flatten()
    }

    /// The multicast groups with at least one QP attached (of every shard).
    pub fn mcast_groups(&self) -> Vec<Gid> {
        self.res.objs().mcast.keys().copied().collect()
    }

    /// The QPs attached to multicast group `gid` (of every shard).
    pub fn mcast_members(&self, gid: &Gid, out: &mut Vec<Qpn>) {
        if let Some(v) = self.res.objs().mcast.get(gid) {
            out.extend_from_slice(v);
        }
    }

    /// The distinct GIDs in the table.
    pub fn gid_set(&self) -> Vec<Gid> {
        self.res.objs().gid_set.clone()
    }

    pub fn alloc_pd(&mut self) -> Result<u32, VerbError> {
        self.res
            .objs_mut()
            .pds
            .insert(Pd::default())
            .ok_or(VerbError::NoResources)
    }
    pub fn dealloc_pd(&mut self, pd: u32) -> Result<(), VerbError> {
        let mut o = self.res.objs_mut();
        let p = o.pds.get(pd).ok_or(VerbError::NotFound)?;
        if p.users != 0 {
            return Err(VerbError::Busy);
        }
        o.pds.remove(pd);
        Ok(())
    }
    fn pd_ref(&mut self, pd: u32, delta: i32) -> Result<(), VerbError> {
        self.res.objs_mut().pd_ref(pd, delta)
    }

    pub fn create_ah(&mut self, pd: u32, av: Av) -> Result<u32, VerbError> {
        let mut o = self.res.objs_mut();
        if o.gid(av.sgid_index).is_none() {
            return Err(VerbError::Invalid);
        }
        o.pd_ref(pd, 0)?;
        let id = o.ahs.insert((pd, av)).ok_or(VerbError::NoResources)?;
        o.pd_ref(pd, 1)?;
        Ok(id)
    }
    pub fn ah(&self, id: u32) -> Option<Av> {
        self.res.objs().ahs.get(id).map(|a| a.1)
    }
    pub fn destroy_ah(&mut self, id: u32) -> Result<(), VerbError> {
        let mut o = self.res.objs_mut();
        let (pd, _) = o.ahs.remove(id).ok_or(VerbError::NotFound)?;
        o.pd_ref(pd, -1)
    }

    // ---------------------------------------------------------------- MRs and MWs

    /// Bytes the MRs hold of `max_registered_bytes`.
    pub fn registered_bytes(&self) -> u64 {
        self.res.objs().registered_bytes
    }

    /// Registers memory; returns the key (lkey == rkey, as in rxe).
    pub fn reg_mr(
        &mut self,
        pd: u32,
        iova: u64,
        length: u64,
        access: Access,
        backing: Backing,
    ) -> Result<u32, VerbError> {
        let max_bytes = self.res.cfg.max_registered_bytes;
        let mut o = self.res.objs_mut();
        o.pd_ref(pd, 0)?;
        if !user_mr_access_ok(access) {
            return Err(VerbError::Invalid);
        }
        if let Backing::OdpImplicit { entries, .. } = &backing {
            // The whole address space, no page mapped yet.
            if iova != 0 || length != u64::MAX || !entries.is_empty() {
                return Err(VerbError::Invalid);
            }
        } else {
            self.check_translation(iova, length, &backing)?;
        }
        if let Backing::Odp {
            page_offset,
            entries,
            ..
        } = &backing
        {
            // An on-demand-paging MR starts with no page mapped; the driver maps them.
            let need = page_offset
                .checked_add(length)
                .map(|e| e.div_ceil(1 << ODP_PAGE_SHIFT).max(1));
            if *page_offset >> ODP_PAGE_SHIFT != 0
                || need != Some(entries.len() as u64)
                || entries.iter().any(|&e| e != 0)
            {
                return Err(VerbError::Invalid);
            }
        }
        let mr = Mr {
            pd,
            kind: MrKind::User,
            iova,
            length,
            access,
            backing,
            state: KeyState::Valid,
            bound_mws: 0,
        };
        let total = o
            .registered_bytes
            .checked_add(registered_len(&mr))
            .filter(|t| *t <= max_bytes)
            .ok_or(VerbError::NoResources)?;
        let k = o
            .keys
            .insert(KeyObj::Mr(mr))
            .ok_or(VerbError::NoResources)?;
        if let Some(KeyObj::Mr(Mr {
            backing: Backing::Odp { key, .. } | Backing::OdpImplicit { key, .. },
            ..
        })) = o.keys.get_mut(k)
        {
            *key = k;
        }
        o.registered_bytes = total;
        o.pd_ref(pd, 1)?;
        Ok(k)
    }

    /// Maps or unmaps pages `first …` of the on-demand-paging MR `key`: each entry an address
    /// with [`ODP_PRESENT`] (and [`ODP_WRITABLE`]), or 0. Once it returns, no access goes
    /// through the old entries. QPs waiting for a page are woken by [`Self::odp_wake`]
    /// (of every shard).
    pub fn odp_update(&mut self, key: u32, first: u64, entries: &[u64]) -> Result<(), VerbError> {
        self.res
            .objs_mut()
            .keys
            .odp_update(key, first, entries)
            .map_err(|e| match e {
                MemError::BadKey => VerbError::NotFound,
                _ => VerbError::Invalid,
            })
    }

    /// The page-table entries of the on-demand-paging MR `key` (its table's length; for an
    /// implicit one the pages it has an entry for); `None` if `key` names no such MR.
    pub fn odp_entries(&self, key: u32) -> Option<u64> {
        self.res.objs().keys.odp_entries(key)
    }

    /// Wakes the QPs that stopped at a page not mapped: each tries again (and, if its page is
    /// still not mapped, asks for it again). A requester that dropped a READ response or
    /// atomic ACK asks again from its oldest PSN not acknowledged, spending no retry.
    pub fn odp_wake(&mut self) {
        let waiters = core::mem::take(&mut self.res.fault_waiters);
        for qpn in waiters {
            let Some(q) = self
                .qps
                .get_mut(qpn.0 as usize)
                .and_then(|q| q.as_deref_mut())
            else {
                continue;
            };
            q.req.odp_wait = false;
            q.resp.odp_wait = false;
            if core::mem::take(&mut q.req.odp_retry)
                && matches!(q.state(), QpState::Rts | QpState::Sqd)
            {
                let psn = q.comp.psn;
                q.retry_from(psn);
            }
            self.schedule(qpn);
        }
    }

    /// Whether [`Self::poll_page_fault`] has a fault to give.
    pub fn page_faults_pending(&self) -> bool {
        !self.res.faults.is_empty()
    }

    /// The next page an access found not mapped (each page once while it is asked for).
    pub fn poll_page_fault(&mut self) -> Option<PageFault> {
        self.res.faults.pop_front()
    }

    /// A DMA MR covering all of memory (`ib_get_dma_mr`): addresses are memory addresses.
    pub fn reg_dma_mr(&mut self, pd: u32, access: Access) -> Result<u32, VerbError> {
        self.pd_ref(pd, 0)?;
        // As for every MR (IBTA 10.6.3.1; ib_core's `ib_check_mr_access()`): remote write
        // and atomic need local write.
        if access.0 & !Access::ALL.0 != 0
            || ((access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
                && !access.contains(Access::LOCAL_WRITE))
        {
            return Err(VerbError::Invalid);
        }
        let mr = Mr {
            pd,
            kind: MrKind::Dma,
            iova: 0,
            length: u64::MAX,
            access,
            backing: Backing::Contiguous { base: 0 },
            state: KeyState::Valid,
            bound_mws: 0,
        };
        self.insert_key(pd, KeyObj::Mr(mr))
    }

    /// An MR for fast registration (`ib_alloc_mr`), registered later by a REG_MR work request.
    pub fn alloc_mr(&mut self, pd: u32, max_pages: u32) -> Result<u32, VerbError> {
        self.pd_ref(pd, 0)?;
        if max_pages == 0 || max_pages > 1 << 20 {
            return Err(VerbError::Invalid);
        }
        let mr = Mr {
            pd,
            kind: MrKind::FastReg { max_pages },
            iova: 0,
            length: 0,
            access: Access(0),
            backing: Backing::Empty,
            state: KeyState::Free,
            bound_mws: 0,
        };
        self.insert_key(pd, KeyObj::Mr(mr))
    }

    fn insert_key(&mut self, pd: u32, obj: KeyObj) -> Result<u32, VerbError> {
        let mut o = self.res.objs_mut();
        o.pd_ref(pd, 0)?;
        let k = o.keys.insert(obj).ok_or(VerbError::NoResources)?;
        o.pd_ref(pd, 1)?;
        Ok(k)
    }

    pub fn dereg_mr(&mut self, key: u32) -> Result<(), VerbError> {
        let mut o = self.res.objs_mut();
        match o.keys.get(key) {
            Some(KeyObj::Mr(mr)) if mr.bound_mws > 0 => return Err(VerbError::Busy),
            Some(KeyObj::Mr(_)) => {}
            _ => return Err(VerbError::NotFound),
        }
        let Some(KeyObj::Mr(mr)) = o.keys.remove(key) else {
            return Err(VerbError::NotFound);
        };
        o.registered_bytes -= registered_len(&mr);
        o.pd_ref(mr.pd, -1)
    }

    /// A user MR's IOVA range and page list: inside the limits, the list covering the range.
    fn check_translation(
        &self,
        iova: u64,
        length: u64,
        backing: &Backing,
    ) -> Result<(), VerbError> {
        if length > self.res.cfg.max_mr_size || iova.checked_add(length).is_none() {
            return Err(VerbError::Invalid);
        }
        if let Backing::Pages {
            page_shift,
            page_offset,
            pages,
        } = backing
        {
            check_page_list(*page_offset, length, *page_shift, pages)
                .map_err(|_| VerbError::Invalid)?;
        }
        Ok(())
    }

    /// Changes the user MR `key` in place, its key kept (`ibv_rereg_mr`, as rxe's
    /// `rxe_rereg_user_mr` does for the PD and the access, here also the translation): to PD
    /// `pd`, access `access`, and `trans` = (IOVA, length, pages of memory). What is `None`
    /// stays. On-demand-paging MRs, other kinds of MR and MRs with windows bound are refused;
    /// a refused change changes nothing. Work already under way finishes under the old
    /// registration; every access after this uses the new one.
    pub fn rereg_mr(
        &mut self,
        key: u32,
        pd: Option<u32>,
        access: Option<Access>,
        trans: Option<(u64, u64, Backing)>,
    ) -> Result<(), VerbError> {
        let max_bytes = self.res.cfg.max_registered_bytes;
        if let Some((iova, length, backing)) = &trans {
            if backing.on_demand() {
                return Err(VerbError::Invalid);
            }
            self.check_translation(*iova, *length, backing)?;
        }
        let mut o = self.res.objs_mut();
        let (old_pd, old_len, old_access) = match o.keys.get(key) {
            Some(KeyObj::Mr(mr)) if mr.kind != MrKind::User => return Err(VerbError::Invalid),
            Some(KeyObj::Mr(mr)) if mr.backing.on_demand() => return Err(VerbError::Invalid),
            Some(KeyObj::Mr(mr)) if mr.bound_mws > 0 => return Err(VerbError::Busy),
            Some(KeyObj::Mr(mr)) => (mr.pd, mr.length, mr.access),
            _ => return Err(VerbError::NotFound),
        };
        let new_pd = pd.unwrap_or(old_pd);
        o.pd_ref(new_pd, 0)?;
        let new_access = access.unwrap_or(old_access);
        if !user_mr_access_ok(new_access) {
            return Err(VerbError::Invalid);
        }
        let new_len = trans.as_ref().map_or(old_len, |t| t.1);
        let total = (o.registered_bytes - old_len)
            .checked_add(new_len)
            .filter(|t| *t <= max_bytes)
            .ok_or(VerbError::NoResources)?;
        if new_pd != old_pd {
            o.pd_ref(new_pd, 1)?;
            o.pd_ref(old_pd, -1)?;
        }
        o.registered_bytes = total;
        let Some(KeyObj::Mr(mr)) = o.keys.get_mut(key) else {
            return Err(VerbError::NotFound);
        };
        mr.pd = new_pd;
        mr.access = new_access;
        if let Some((iova, length, backing)) = trans {
            mr.iova = iova;
            mr.length = length;
            mr.backing = backing;
        }
        Ok(())
    }

    /// Runs `f` on the MR that `key` names, if it names one.
    pub fn with_mr<R>(&self, key: u32, f: impl FnOnce(&Mr) -> R) -> Option<R> {
        match self.res.objs().keys.get(key) {
            Some(KeyObj::Mr(m)) => Some(f(m)),
            _ => None,
        }
    }

    pub fn alloc_mw(&mut self, pd: u32, mw_type: MwType) -> Result<u32, VerbError> {
        self.pd_ref(pd, 0)?;
        let mw = Mw {
            pd,
            mw_type,
            state: KeyState::Free,
            mr_key: 0,
            addr: 0,
            length: 0,
            access: Access(0),
            qpn: 0,
        };
        self.insert_key(pd, KeyObj::Mw(mw))
    }

    pub fn dealloc_mw(&mut self, key: u32) -> Result<(), VerbError> {
        let mut o = self.res.objs_mut();
        match o.keys.get(key) {
            Some(KeyObj::Mw(_)) => {}
            _ => return Err(VerbError::NotFound),
        }
        let Some(KeyObj::Mw(mw)) = o.keys.remove(key) else {
            return Err(VerbError::NotFound);
        };
        if mw.state == KeyState::Valid {
            if let Some(KeyObj::Mr(mr)) = o.keys.get_mut(mw.mr_key) {
                mr.bound_mws = mr.bound_mws.saturating_sub(1);
            }
        }
        o.pd_ref(mw.pd, -1)
    }

    /// Binds a type 1 MW (`ibv_bind_mw`); returns the new rkey. Type 2 windows are bound with a
    /// BIND_MW work request instead.
    pub fn bind_mw_type1(
        &mut self,
        qpn: Qpn,
        mw_rkey: u32,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<u32, WcStatus> {
        let pd = self.qp(qpn).map(|q| q.pd).ok_or(WcStatus::MwBindErr)?;
        let new_key = (mw_rkey & !0xff) | ((mw_rkey.wrapping_add(1)) & 0xff);
        crate::req::bind_mw(
            &mut self.res.objs_mut().keys,
            pd,
            qpn.0,
            mw_rkey,
            new_key,
            mr_lkey,
            addr,
            length,
            access,
            Some(MwType::Type1),
        )?;
        Ok(new_key)
    }

    // ---------------------------------------------------------------- CQs

    fn insert_cq(&mut self, cap: u32, queue: VecDeque<Cqe>) -> Result<u32, VerbError> {
        write(&self.res.shared.cqs)
            .insert(Arc::new(Mutex::new(Cq {
                cap,
                queue,
                listed: 0,
                armed: None,
                error: false,
                users: 0,
            })))
            .ok_or(VerbError::NoResources)
    }

    pub fn create_cq(&mut self, cqe: u32) -> Result<u32, VerbError> {
        if cqe == 0 || cqe > self.res.cfg.max_cqe {
            return Err(VerbError::Invalid);
        }
        self.insert_cq(cqe, VecDeque::with_capacity(cqe.min(4096) as usize))
    }
    /// A CQ with no capacity of its own, for a caller that drains it into a ring of its own
    /// after every call and decides overflow there (the daemon and the guest's CQ ring).
    pub fn create_staging_cq(&mut self) -> Result<u32, VerbError> {
        self.insert_cq(u32::MAX, VecDeque::new())
    }

    pub fn resize_cq(&mut self, cqn: u32, cqe: u32) -> Result<(), VerbError> {
        let max = self.res.cfg.max_cqe;
        self.res
            .with_cq(cqn, |cq| {
                if cqe == 0 || cqe > max || (cqe as usize) < cq.queue.len() {
                    return Err(VerbError::Invalid);
                }
                cq.cap = cqe;
                Ok(())
            })
            .ok_or(VerbError::NotFound)?
    }
    pub fn destroy_cq(&mut self, cqn: u32) -> Result<(), VerbError> {
        let mut t = write(&self.res.shared.cqs);
        let cq = t.get_mut(cqn).ok_or(VerbError::NotFound)?;
        if lock(cq).users != 0 {
            return Err(VerbError::Busy);
        }
        t.remove(cqn);
        Ok(())
    }
    pub fn poll_cq(&mut self, cqn: u32) -> Option<Cqe> {
        self.res.with_cq(cqn, |c| c.queue.pop_front()).flatten()
    }
    /// Moves up to `max` completions of CQ `cqn` into `out` (one lock for all of them).
    pub fn poll_cq_into(&mut self, cqn: u32, max: usize, out: &mut Vec<Cqe>) -> usize {
        self.res
            .with_cq(cqn, |c| {
                let n = c.queue.len().min(max);
                let (a, b) = c.queue.as_slices();
                let from_a = a.len().min(n);
                out.extend_from_slice(&a[..from_a]);
                out.extend_from_slice(&b[..n - from_a]);
                c.queue.drain(..n);
                n
            })
            .unwrap_or(0)
    }
    pub fn cq_len(&self, cqn: u32) -> usize {
        self.res.with_cq(cqn, |c| c.queue.len()).unwrap_or(0)
    }
    pub fn cq_in_error(&self, cqn: u32) -> bool {
        self.res.with_cq(cqn, |c| c.error).unwrap_or(false)
    }
    /// Arms the CQ: the next (solicited) completion raises [`AsyncEvent::Completion`].
    pub fn req_notify_cq(&mut self, cqn: u32, solicited_only: bool) -> Result<(), VerbError> {
        self.res
            .with_cq(cqn, |cq| cq.armed = Some(solicited_only))
            .ok_or(VerbError::NotFound)
    }

    // ---------------------------------------------------------------- SRQs

    pub fn create_srq(
        &mut self,
        pd: u32,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<u32, VerbError> {
        if max_wr == 0
            || max_wr > self.res.cfg.max_srq_wr
            || max_sge == 0
            || max_sge > self.res.cfg.max_sge
            || limit > max_wr
        {
            self.pd_ref(pd, 0)?;
            return Err(VerbError::Invalid);
        }
        let mut o = self.res.objs_mut();
        o.pd_ref(pd, 0)?;
        let id = write(&self.res.shared.srqs)
            .insert(Arc::new(Mutex::new(Srq {
                pd,
                xrc: None,
                max_wr,
                max_sge,
                limit,
                queue: VecDeque::with_capacity(max_wr.min(4096) as usize),
                users: 0,
            })))
            .ok_or(VerbError::NoResources)?;
        o.pd_ref(pd, 1)?;
        Ok(id)
    }
    /// Sets `max_wr` (resize) and/or the limit (arms the SRQ_LIMIT_REACHED event).
    pub fn modify_srq(
        &mut self,
        srqn: u32,
        max_wr: Option<u32>,
        limit: Option<u32>,
    ) -> Result<(), VerbError> {
        let max = self.res.cfg.max_srq_wr;
        self.res
            .with_srq(srqn, |s| {
                let new_max = max_wr.unwrap_or(s.max_wr);
                let new_limit = limit.unwrap_or(s.limit);
                if new_max == 0
                    || new_max > max
                    || (new_max as usize) < s.queue.len()
                    || new_limit > new_max
                {
                    return Err(VerbError::Invalid);
                }
                s.max_wr = new_max;
                s.limit = new_limit;
                Ok(())
            })
            .ok_or(VerbError::NotFound)?
    }
    /// (max_wr, max_sge, limit, posted)
    pub fn query_srq(&self, srqn: u32) -> Option<(u32, u32, u32, usize)> {
        self.res
            .with_srq(srqn, |s| (s.max_wr, s.max_sge, s.limit, s.queue.len()))
    }
    pub fn destroy_srq(&mut self, srqn: u32) -> Result<(), VerbError> {
        let mut o = self.res.objs_mut();
        let mut t = write(&self.res.shared.srqs);
        let s = t.get_mut(srqn).ok_or(VerbError::NotFound)?;
        if lock(s).users != 0 {
            return Err(VerbError::Busy);
        }
        let s = t.remove(srqn).ok_or(VerbError::NotFound)?;
        let mut s = lock(&s);
        if let Some(x) = s.xrc.take() {
            crate::xrc::release_srq(&mut o, x);
        }
        o.pd_ref(s.pd, -1)
    }
    pub fn post_srq_recv(&mut self, srqn: u32, wr: RecvWr) -> Result<(), VerbError> {
        self.res
            .with_srq(srqn, |s| push_recv(&mut s.queue, s.max_sge, s.max_wr, wr))
            .ok_or(VerbError::NotFound)?
    }

    // ---------------------------------------------------------------- QPs

    /// Creates a QP in this shard (its QPN is one of this shard's, [`Self::shard_of`]; the
    /// GSI QP, QPN 1, only in shard `1 % shards`).
    pub fn create_qp(&mut self, init: QpInit) -> Result<Qpn, VerbError> {
        let c = &self.res.cfg;
        let cap = init.cap;
        if cap.max_send_wr > c.max_qp_wr
            || cap.max_recv_wr > c.max_qp_wr
            || cap.max_send_sge > c.max_sge
            || cap.max_recv_sge > c.max_sge
            || cap.max_inline_data > c.max_inline
        {
            return Err(VerbError::Invalid);
        }
        if init.srq.is_some() && init.qp_type != QpType::Rc && init.qp_type != QpType::Ud {
            return Err(VerbError::Invalid);
        }
        crate::xrc::check_init(&init)?;
        let tgt = init.qp_type == QpType::XrcTgt;
        let max_qp = c.max_qp;
        let shards = self.res.shared.shards;
        let shared = self.res.shared.clone();
        let mut o = shared.objs.write();
        match init.xrcd {
            Some(x) if tgt => crate::xrc::xrcd_ref(&mut o, x, 0)?,
            _ => o.pd_ref(init.pd, 0)?,
        }
        // An XRC INI QP has no receive CQ: both are its send CQ.
        let recv_cq = match init.qp_type {
            QpType::XrcIni => init.send_cq,
            _ => init.recv_cq,
        };
        // A raw packet QP with no queue (an RSS QP) may name no CQ, as an XRC TGT names none.
        let ringless = init.qp_type == QpType::RawPacket
            && cap.max_send_wr == 0
            && cap.max_recv_wr == 0
            && init.send_cq == 0
            && init.recv_cq == 0;
        let cq_objs = if tgt || ringless {
            crate::xrc::tgt_placeholder_cqs()
        } else {
            let cqs = read(&shared.cqs);
            match (cqs.get(init.send_cq), cqs.get(recv_cq)) {
                (Some(s), Some(r)) => [s.clone(), r.clone()],
                _ => return Err(VerbError::NotFound),
            }
        };
        let srq_obj = match init.srq {
            Some(s) => Some(
                read(&shared.srqs)
                    .get(s)
                    .ok_or(VerbError::NotFound)?
                    .clone(),
            ),
            None => None,
        };
        let qpn = if init.qp_type == QpType::Gsi {
            if Self::shard_of(Qpn::GSI, shards) != self.shard {
                return Err(VerbError::Invalid);
            }
            if self.qp(Qpn::GSI).is_some() {
                return Err(VerbError::Busy);
            }
            Qpn::GSI
        } else {
            let live = &shared.live_qps;
            if live
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    (n < max_qp).then_some(n + 1)
                })
                .is_err()
            {
                return Err(VerbError::NoResources);
            }
            match self.alloc_qpn() {
                Ok(q) => q,
                Err(e) => {
                    live.fetch_sub(1, Ordering::Relaxed);
                    return Err(e);
                }
            }
        };
        for c in &cq_objs {
            lock(c).users += 1;
        }
        if let Some(s) = &srq_obj {
            lock(s).users += 1;
        }
        let mut qp = Qp::new(qpn, &init, cq_objs, srq_obj);
        if init.qp_type == QpType::Gsi {
            qp.attr.qkey = GSI_QKEY;
        }
        let idx = qpn.0 as usize;
        if self.qps.len() <= idx {
            self.qps.resize_with(idx + 1, || None);
        }
        self.qps[idx] = Some(Box::new(qp));
        match init.xrcd {
            Some(x) if tgt => crate::xrc::xrcd_ref(&mut o, x, 1)?,
            _ => o.pd_ref(init.pd, 1)?,
        }
        Ok(qpn)
    }

    fn alloc_qpn(&mut self) -> Result<Qpn, VerbError> {
        // QPNs are handed out round-robin so a recently destroyed QPN is not reused at once
        // (stray packets for the old QP must not land on a new one). A shard takes the
        // numbers of its own residue.
        let shards = self.res.shared.shards;
        let limit = FIRST_QPN + self.res.cfg.max_qp * 2;
        for _ in 0..limit {
            let n = self.next_qpn;
            self.next_qpn = if n + 1 >= limit { FIRST_QPN } else { n + 1 };
            if Self::shard_of(Qpn(n), shards) == self.shard
                && self.qps.get(n as usize).is_none_or(|q| q.is_none())
            {
                return Ok(Qpn(n));
            }
        }
        Err(VerbError::NoResources)
    }

    pub fn qp(&self, qpn: Qpn) -> Option<&Qp> {
        self.qps.get(qpn.0 as usize)?.as_deref()
    }
    pub fn qpns(&self) -> impl Iterator<Item = Qpn> + '_ {
        self.qps.iter().filter_map(|q| q.as_ref().map(|q| q.qpn))
    }

    pub fn destroy_qp(&mut self, qpn: Qpn) -> Result<(), VerbError> {
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.take())
            .ok_or(VerbError::NotFound)?;
        if qpn != Qpn::GSI {
            self.res.shared.live_qps.fetch_sub(1, Ordering::Relaxed);
        }
        if q.timer_queued.is_some() {
            // Its entry is stale now (no QP answers to it); it goes when it comes up.
            self.timers.live -= 1;
        }
        if q.scheduled {
            self.sched.retain(|x| *x != qpn);
        }
        let shared = &self.res.shared;
        let mut o = shared.objs.write();
        for g in &q.mcast {
            if let Some(v) = o.mcast.get_mut(g) {
                v.retain(|x| *x != qpn);
                if v.is_empty() {
                    o.mcast.remove(g);
                }
            }
        }
        if let (QpType::XrcTgt, Some(x)) = (q.qp_type, q.xrcd) {
            // Its CQs, SRQ and PD are those of the SRQ its last request named: not its own.
            return crate::xrc::xrcd_ref(&mut o, x, -1);
        }
        for c in &q.cq_objs {
            lock(c).users -= 1;
        }
        if let Some(s) = &q.srq_obj {
            lock(s).users -= 1;
        }
        o.pd_ref(q.pd, -1)
    }

    pub fn query_qp(&self, qpn: Qpn) -> Option<(QpAttr, QpCap)> {
        self.qp(qpn).map(|q| {
            let mut a = q.attr;
            a.cur_qp_state = a.qp_state;
            a.sq_draining = a.qp_state == QpState::Sqd
                && q.sq.iter().any(|w| w.state == crate::qp::WqeState::Pending);
            (a, q.cap)
        })
    }

    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr, mask: AttrMask) -> Result<(), VerbError> {
        let port_mtu = self.res.cfg.port_mtu;
        let gid_ok = |i: u8| self.res.objs().gid(i).is_some();
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        let next = q.check_modify(attr, mask, port_mtu, &gid_ok)?;
        let cur = q.attr.qp_state;
        q.apply_attrs(attr, mask);
        match next {
            QpState::Reset if cur != QpState::Reset => q.reset(),
            QpState::Err if cur != QpState::Err => {
                q.attr.qp_state = QpState::Err;
                crate::complete::flush(q, &mut self.res);
            }
            QpState::Rtr if cur != QpState::Rtr => {
                q.resp.psn = Psn::new(q.attr.rq_psn);
            }
            QpState::Sqd => q.drained_notified = false,
            _ => {}
        }
        q.attr.qp_state = next;
        if next == QpState::Rts || next == QpState::Sqd {
            self.schedule(qpn);
        }
        Ok(())
    }

    pub fn attach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), VerbError> {
        let max_grp = self.res.cfg.max_mcast_grp as usize;
        let max_att = self.res.cfg.max_mcast_qp_attach as usize;
        if !gid.is_multicast() {
            return Err(VerbError::Invalid);
        }
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        if !matches!(q.qp_type, QpType::Ud) {
            return Err(VerbError::Invalid);
        }
        let mut o = self.res.objs_mut();
        if !o.mcast.contains_key(&gid) && o.mcast.len() >= max_grp {
            return Err(VerbError::NoResources);
        }
        let v = o.mcast.entry(gid).or_default();
        if v.contains(&qpn) {
            return Ok(());
        }
        if v.len() >= max_att {
            return Err(VerbError::NoResources);
        }
        v.push(qpn);
        q.mcast.push(gid);
        Ok(())
    }

    pub fn detach_mcast(&mut self, qpn: Qpn, gid: Gid) -> Result<(), VerbError> {
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        let mut o = self.res.objs_mut();
        let v = o.mcast.get_mut(&gid).ok_or(VerbError::NotFound)?;
        let before = v.len();
        v.retain(|x| *x != qpn);
        if v.len() == before {
            return Err(VerbError::NotFound);
        }
        if v.is_empty() {
            o.mcast.remove(&gid);
        }
        q.mcast.retain(|g| *g != gid);
        Ok(())
    }

    // ---------------------------------------------------------------- work requests

    pub fn post_send(&mut self, qpn: Qpn, wr: SendWr) -> Result<(), VerbError> {
        self.res.sync_gids();
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        crate::req::post_send(q, &mut self.res, wr)?;
        self.schedule(qpn);
        Ok(())
    }

    /// Completes a send work request that could not be decoded, in order, and moves the QP to
    /// ERR (the backend's answer to a malformed WQE in a guest ring).
    pub fn post_send_failed(
        &mut self,
        qpn: Qpn,
        wr_id: u64,
        opcode: WcOpcode,
        status: WcStatus,
    ) -> Result<(), VerbError> {
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        crate::req::post_failed(q, &mut self.res, wr_id, opcode, status)
    }

    /// Bytes of REG_MR page lists the QP's send WQEs hold: posted REG_MRs not yet executed
    /// (executing one moves its list into the MR).
    pub fn sq_reg_mr_bytes(&self, qpn: Qpn) -> Option<u64> {
        self.qp(qpn).map(|q| q.reg_mr_list_bytes)
    }

    /// Send WQEs posted and not yet completed (they count against `max_send_wr`).
    pub fn sq_outstanding(&self, qpn: Qpn) -> Option<usize> {
        self.qp(qpn).map(|q| q.sq.len())
    }

    /// Receives the QP holds that have not completed (its own receive queue, not an SRQ's).
    pub fn rq_outstanding(&self, qpn: Qpn) -> Option<usize> {
        self.qp(qpn).map(|q| q.rq.len())
    }

    pub fn post_recv(&mut self, qpn: Qpn, wr: RecvWr) -> Result<(), VerbError> {
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        if q.srq.is_some() || q.qp_type.is_xrc() || q.state() == QpState::Reset {
            return Err(VerbError::Invalid);
        }
        push_recv(&mut q.rq, q.cap.max_recv_sge, q.cap.max_recv_wr, wr)?;
        if q.state() == QpState::Err {
            crate::complete::flush(q, &mut self.res);
        }
        Ok(())
    }

    pub(crate) fn schedule(&mut self, qpn: Qpn) {
        if let Some(q) = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
        {
            if !q.scheduled {
                q.scheduled = true;
                self.sched.push_back(qpn);
            }
        }
    }

    // ---------------------------------------------------------------- the sans-IO surface

    /// Produces the next packet to send into `buf` (which must hold a path-MTU packet plus
    /// headers: 4096 + 64 bytes is always enough), or `None` when nothing is ready.
    pub fn poll_transmit(
        &mut self,
        now: Instant,
        mem: &mut dyn Memory,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        self.poll_transmit_segments(now, mem, buf, &|_| false)
    }

    /// [`Self::poll_transmit`] for a caller that can carry an RC packet larger than the path
    /// MTU to the destinations `in_memory` names: a SEND or WRITE to one of them, or a READ
    /// response, leaves in **segments** of as many whole path MTUs as `buf` holds (after
    /// [`SEGMENT_HEADROOM`] bytes of headers), each taking the PSNs of the packets it stands
    /// for. The receiving device takes them with [`Self::handle_packet_in_memory`]; on a
    /// wire they would be invalid. Retransmission, ACKs and NAKs keep their PSN meaning.
    pub fn poll_transmit_segments(
        &mut self,
        now: Instant,
        mem: &mut dyn Memory,
        buf: &mut [u8],
        in_memory: &dyn Fn(&Gid) -> bool,
    ) -> Option<Transmit> {
        self.res.sync_gids();
        while let Some(qpn) = self.sched.pop_front() {
            let Some(q) = self
                .qps
                .get_mut(qpn.0 as usize)
                .and_then(|q| q.as_deref_mut())
            else {
                continue;
            };
            q.scheduled = false;
            let t = crate::resp::next_response(q, &mut self.res, mem, buf, in_memory)
                .or_else(|| crate::req::next_request(q, &mut self.res, mem, now, buf, in_memory));
            crate::complete::drain(q, &mut self.res);
            crate::timers::note(&mut self.timers, q);
            if let Some(t) = t {
                q.counters.tx_packets += 1;
                q.counters.tx_bytes += t.len as u64;
                self.res.port.tx_packets += 1;
                self.res.port.tx_bytes += t.len as u64;
                q.scheduled = true;
                self.sched.push_back(qpn);
                return Some(t);
            }
        }
        None
    }

    /// Processes one received RoCE packet (BTH through ICRC; the transport has verified the
    /// ICRC). Returns why it was dropped, if it was.
    pub fn handle_packet(
        &mut self,
        now: Instant,
        meta: &RecvMeta,
        bytes: &[u8],
        mem: &mut dyn Memory,
    ) -> Result<(), Drop> {
        self.res.sync_gids();
        self.res.port.rx_packets += 1;
        self.res.port.rx_bytes += bytes.len() as u64;
        let r = self.handle_packet_inner(now, meta, bytes, mem);
        if r.is_err() {
            self.res.port.rx_dropped += 1;
        }
        r
    }

    /// [`Self::handle_packet`] for a packet that another device of this process handed over
    /// in memory (built by [`Self::poll_transmit_segments`]): an RC SEND, WRITE or READ
    /// response may be a segment of several path MTUs. Nothing else differs.
    pub fn handle_packet_in_memory(
        &mut self,
        now: Instant,
        meta: &RecvMeta,
        bytes: &[u8],
        mem: &mut dyn Memory,
    ) -> Result<(), Drop> {
        self.res.rx_in_memory = true;
        let r = self.handle_packet(now, meta, bytes, mem);
        self.res.rx_in_memory = false;
        r
    }

    fn handle_packet_inner(
        &mut self,
        now: Instant,
        meta: &RecvMeta,
        bytes: &[u8],
        mem: &mut dyn Memory,
    ) -> Result<(), Drop> {
        let pkt = Packet::new_checked(bytes).map_err(|e| {
            self.res.port.rx_malformed += 1;
            Drop::Malformed(e)
        })?;
        let bth = pkt.bth();
        if bth.tver() != 0 {
            return Err(Drop::BadVersion);
        }
        if pkt.flags().contains(OpFlags::CNP) {
            // Congestion control is not implemented yet: CNPs are counted and ignored.
            self.res.port.rx_cnp += 1;
            return Ok(());
        }
        if bth.pkey() & 0x7fff != 0x7fff {
            return Err(Drop::BadPkey);
        }
        let dqpn = bth.dest_qp();
        if dqpn == Qpn::MULTICAST.0 {
            if !meta.dst.is_multicast() {
                return Err(Drop::NotOurGid);
            }
            let members = self.res.objs().mcast.get(&meta.dst).cloned();
            let Some(members) = members.filter(|m| !m.is_empty()) else {
                return Err(Drop::UnknownQp);
            };
            // Members of other shards are theirs to serve (the caller gives each shard
            // the packet).
            for qpn in members {
                if let Some(q) = self
                    .qps
                    .get_mut(qpn.0 as usize)
                    .and_then(|q| q.as_deref_mut())
                {
                    let _ = crate::resp::handle_request(q, &mut self.res, mem, meta, &pkt);
                }
            }
            return Ok(());
        }
        if !self.res.is_our_gid(&meta.dst) {
            self.res.port.rx_bad_gid += 1;
            return Err(Drop::NotOurGid);
        }
        let Some(q) = self
            .qps
            .get_mut(dqpn as usize)
            .and_then(|q| q.as_deref_mut())
        else {
            self.res.port.rx_unknown_qp += 1;
            return Err(Drop::UnknownQp);
        };
        q.counters.rx_packets += 1;
        q.counters.rx_bytes += bytes.len() as u64;
        if q.is_connected() {
            let sgid = self.res.gid(q.attr.av.sgid_index);
            if meta.src != q.attr.av.dgid || Some(meta.dst) != sgid {
                q.counters.dropped += 1;
                return Err(Drop::AddressMismatch);
            }
        }
        let r = if pkt.flags().contains(OpFlags::REQ) {
            crate::resp::handle_request(q, &mut self.res, mem, meta, &pkt)
        } else {
            crate::comp::handle_response(q, &mut self.res, mem, now, &pkt)
        };
        if r.is_err() {
            q.counters.dropped += 1;
        }
        crate::complete::drain(q, &mut self.res);
        crate::timers::note(&mut self.timers, q);
        let qpn = q.qpn;
        self.schedule(qpn);
        r
    }

    /// The earliest time `handle_timeout` has work to do. O(log n) per timer that moved
    /// since the last call, whatever the number of QPs (`timers.rs`).
    pub fn poll_timeout(&mut self) -> Option<Instant> {
        if self.timers.wants_compaction() {
            let qps = &self.qps;
            self.timers.compact(|t, qpn| {
                qps.get(qpn as usize)
                    .and_then(|q| q.as_deref())
                    .is_some_and(|q| q.timer_queued == Some(t))
            });
        }
        while let Some((t, qpn)) = self.timers.peek() {
            self.timers.pop();
            let Some(q) = self
                .qps
                .get_mut(qpn as usize)
                .and_then(|q| q.as_deref_mut())
            else {
                continue;
            };
            if q.timer_queued != Some(t) {
                continue; // stale: the QP has a later-pushed, earlier entry
            }
            match crate::timers::deadline(q) {
                Some(d) => {
                    // Put back at the real deadline (== t: the entry is exact).
                    self.timers.push(d, qpn);
                    q.timer_queued = Some(d);
                    if d == t {
                        return Some(t);
                    }
                }
                None => {
                    q.timer_queued = None;
                    self.timers.live -= 1;
                }
            }
        }
        None
    }

    /// Fires the retransmission and RNR timers that are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        let mut requeue = Vec::new();
        while let Some((t, qpn)) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            let Some(q) = self
                .qps
                .get_mut(qpn as usize)
                .and_then(|q| q.as_deref_mut())
            else {
                continue;
            };
            if q.timer_queued != Some(t) {
                continue;
            }
            q.timer_queued = None;
            self.timers.live -= 1;
            let mut fired = false;
            if q.req.rnr_until.is_some_and(|t| t <= now) {
                q.req.rnr_until = None;
                fired = true;
            }
            if q.comp.retrans_at.is_some_and(|t| t <= now) {
                crate::comp::retransmit_timeout(q, &mut self.res, now);
                crate::complete::drain(q, &mut self.res);
                fired = true;
            }
            // Pushed after the loop, so a deadline that is already due is not fired twice.
            requeue.push(qpn);
            if fired {
                self.schedule(Qpn(qpn));
            }
        }
        for qpn in requeue {
            if let Some(q) = self
                .qps
                .get_mut(qpn as usize)
                .and_then(|q| q.as_deref_mut())
            {
                crate::timers::note(&mut self.timers, q);
            }
        }
    }

    /// Entries in the timer queue, live and stale (a bound for tests: it must not grow with
    /// the number of timer restarts).
    pub fn timer_entries(&self) -> usize {
        self.timers.len()
    }

    /// Appends the CQs that received completions since the last call to `out` (each once,
    /// in the order they first received one), so a caller that moves completions elsewhere
    /// visits those and not every CQ.
    pub fn take_ready_cqs(&mut self, out: &mut Vec<u32>) {
        if self.res.ready_cqs.is_empty() {
            return;
        }
        let bit = self.res.shard_bit;
        let t = read(&self.res.shared.cqs);
        for cqn in self.res.ready_cqs.drain(..) {
            if let Some(cq) = t.get(cqn) {
                let mut cq = lock(cq);
                if cq.listed & bit != 0 {
                    cq.listed &= !bit;
                    out.push(cqn);
                }
            }
        }
    }

    /// Lists `cqn` again for [`Self::take_ready_cqs`] (the caller could not drain it all).
    pub fn relist_cq(&mut self, cqn: u32) {
        let bit = self.res.shard_bit;
        let t = read(&self.res.shared.cqs);
        if let Some(cq) = t.get(cqn) {
            let mut cq = lock(cq);
            if cq.listed & bit == 0 {
                cq.listed |= bit;
                self.res.ready_cqs.push(cqn);
            }
        }
    }

    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.res.events.pop_front()
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<QpCounters> {
        self.qp(qpn).map(|q| q.counters)
    }

    /// Moves every QP of this shard using `cqn` to the error state (the backend calls this,
    /// on every shard, when the guest's CQ ring overflows).
    pub fn cq_overflow(&mut self, cqn: u32) {
        let newly = self
            .res
            .with_cq(cqn, |cq| !std::mem::replace(&mut cq.error, true));
        if newly == Some(true) {
            self.res.events.push_back(AsyncEvent::CqErr { cqn });
        }
        for q in self.qps.iter_mut().flatten() {
            if (q.send_cq == cqn || q.recv_cq == cqn) && q.state() != QpState::Err {
                crate::complete::set_error(q, &mut self.res);
            }
        }
    }
}
