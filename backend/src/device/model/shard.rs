//! The engine's shards: each holds a part of the device's QPs (by QPN), the shadows of their
//! guest rings, and its own engine; [`route`] picks a received packet's shard, and a
//! [`ShardHandle`] lets a shard's own thread drive it (`--shard-threads`).

use super::*;

/// Hands a received packet to the shard of its destination QP; a multicast packet to every
/// shard in turn (each delivers to its own members; one shard locked at a time); one too
/// short to name a QP to the first, which drops it. Returns the shards it went to, a bit each.
pub(super) fn route(c: &Common, shards: &[Arc<Mutex<Shard>>], p: &Packet) -> u64 {
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
    pub(super) k: usize,
    pub(super) common: Arc<Common>,
    pub(super) shards: Vec<Arc<Mutex<Shard>>>,
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
    pub(super) fn new(k: usize, dev: Device) -> Self {
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
            raw: Default::default(),
        }
    }

    /// [`Model::handle_packet_refs`] in this shard, whose QP `dqpn` is (or, for multicast,
    /// whose members of the group are) the destination.
    pub(super) fn handle_packet(&mut self, c: &Common, p: &Packet, dqpn: Option<u32>) {
        let (mem, meta, bytes) = (p.mem, p.meta, p.bytes);
        if let Some(dqpn) = dqpn {
            if let Some(q) = self.qps.get(&dqpn) {
                if q.qp_type == QpType::XrcTgt {
                    // Its receives are those of the XRC SRQ the request names (the engine
                    // checks that it may use it).
                    let srqn = rxe_core::wire::Packet::new_checked(bytes)
                        .ok()
                        .and_then(|p| p.xrceth());
                    if let Some(s) = srqn {
                        self.pull_srq(c, mem, s);
                    }
                } else {
                    self.pull_rq(c, mem, dqpn);
                }
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
    pub(super) fn pump(
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
            while let Some(f) = self.dev.poll_page_fault() {
                c.push_page_fault(f);
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
    pub(super) fn pull_sq(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
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
            xrc: q.qp_type == QpType::XrcIni,
        };
        let raw = q.qp_type == QpType::RawPacket;
        let max = q.caps.max_send_wr as usize;
        let cost = send_wqe_bytes(&q.caps);
        let mut taken = q.sq_taken;
        let outstanding = self.dev.sq_outstanding(Qpn(qpn)).unwrap_or(0);
        let mut room = max.saturating_sub(outstanding);
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
            // (Each time: a raw packet QP's frame pulls the receive rings of the QPs it goes
            // to through the same buffer.)
            self.slot.resize(sq.elem_size(), 0);
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
                // A frame: sent now, completed now (no WQE held).
                Ok(wr) if raw => self.raw_send(c, mem, qpn, &wr),
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
    pub(super) fn reg_mr_list_in_slot(&self) -> Option<u64> {
        let at = |o: usize| u32::from_le_bytes(self.slot[o..o + 4].try_into().expect("4"));
        (at(abi::swqe::OPCODE) == abi::wr_op::REG_MR)
            .then(|| list_bytes(at(abi::swqe::REG_NUM_PAGES) as usize))
    }

    /// Brings the budget's share of `qpn`'s REG_MR lists up to what the engine holds now
    /// (lists leave it as their WQEs execute or are flushed); returns that.
    pub(super) fn sync_reg_mr_held(&mut self, c: &Common, qpn: u32) -> u64 {
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
    pub(super) fn reg_mr_allowed(&self, qpn: u32) -> bool {
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
    pub(super) fn post_failed(&mut self, qpn: u32) -> Result<(), VerbError> {
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
    pub(super) fn sync_sq_cons(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
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
    pub(super) fn qp_ring_fault(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
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

    pub(super) fn bad_recv_wqe(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32, wr_id: u64) {
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
    pub(super) fn pull_rq(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
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
    pub(super) fn sync_rq_cons(&mut self, c: &Common, mem: &GuestMemoryMmap, qpn: u32) {
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

    pub(super) fn pull_srq(&mut self, c: &Common, mem: &GuestMemoryMmap, srqn: u32) {
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
    pub(super) fn ring_full(
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
    pub(super) fn apply_overflows(&mut self, c: &Common) {
        let Some(o) = c.overflowed.get(self.k) else {
            return;
        };
        let cqs = std::mem::take(&mut *lock(o));
        for cqn in cqs {
            self.dev.cq_overflow(cqn);
        }
    }

    /// Writes one CQE into a CQ ring (overflow moves the CQ's QPs to the error state).
    pub(super) fn write_cqe(
        &mut self,
        c: &Common,
        mem: &GuestMemoryMmap,
        cqn: u32,
        wc: &abi::UverbsWc,
    ) {
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
    pub(super) fn flush_cq(&mut self, c: &Common, mem: &GuestMemoryMmap, cqn: u32) {
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
    pub(super) fn check_cq_arm(&mut self, c: &Common, mem: &GuestMemoryMmap, cqn: u32) {
        if let Some(cq) = c.cq(cqn) {
            self.check_arm(c, mem, cqn, &mut lock(&cq), None);
        }
    }

    /// The arm protocol (doc: "CQ notification"): after publishing CQEs the device fences and
    /// reads the notify word. `wrote` is `Some(solicited)` after publishing completions
    /// (`solicited`: one of them was a solicited receive or an error), `None` for a CQ
    /// doorbell. NEXT_COMP fires on any new CQE (on a doorbell: if the ring is not empty);
    /// SOLICITED fires on a solicited or error completion.
    pub(super) fn check_arm(
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
    pub(super) fn transmit(
        &mut self,
        mem: &GuestMemoryMmap,
        now: Instant,
        tx: &mut dyn PacketSink,
    ) -> bool {
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
    pub(super) fn pull_backlog(&mut self, c: &Common, mem: &GuestMemoryMmap) {
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

    pub(super) fn flush_all_cqs(&mut self, c: &Common, mem: &GuestMemoryMmap) {
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

    pub(super) fn engine_event(c: &Common, e: AsyncEvent) {
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
