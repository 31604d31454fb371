//! The control commands: [`Model::exec`] dispatches each to a function of its own here
//! (the larger ones, CREATE_QP, MODIFY_QP, CREATE_CQ and the like, live beside the objects
//! they make in `model.rs`).

use super::*;

impl Model {
    pub(super) fn exec(&mut self, mem: &GuestMemoryMmap, opcode: u32, b: &[u8]) -> CmdResult {
        let r = self.dispatch(mem, opcode, b);
        // The groups the engine has members in, for the udp transport to join or leave.
        if r.is_ok()
            && matches!(
                opcode,
                op::ATTACH_MCAST | op::DETACH_MCAST | op::DESTROY_QP | op::RESET
            )
        {
            if let Some(g) = &self.cfg.mcast {
                g.publish(self.any().dev.mcast_groups());
            }
        }
        r
    }

    /// One command, by its opcode.
    fn dispatch(&mut self, mem: &GuestMemoryMmap, opcode: u32, b: &[u8]) -> CmdResult {
        match opcode {
            op::QUERY_DEVICE => body(self.config_space()),
            op::QUERY_GID_SOURCES => self.query_gid_sources(),
            op::QUERY_STATS => body(self.hw_stats()),
            op::QUERY_PORT => self.query_port(b),
            op::CREATE_PD => self.create_pd(),
            op::DESTROY_PD => self.destroy_pd(b),
            op::CREATE_CQ => self.create_cq(mem, cmd(b)?),
            op::RESIZE_CQ => self.resize_cq(mem, cmd(b)?),
            op::DESTROY_CQ => self.destroy_cq(b),
            op::CREATE_QP => self.create_qp(mem, cmd(b)?),
            op::MODIFY_QP => self.modify_qp(mem, cmd(b)?),
            op::QUERY_QP => self.query_qp(b),
            op::DESTROY_QP => self.destroy_qp(b),
            op::CREATE_SRQ => self.create_srq(mem, cmd(b)?),
            op::MODIFY_SRQ => self.modify_srq(b),
            op::RESIZE_SRQ => self.resize_srq(mem, cmd(b)?),
            op::QUERY_SRQ => self.query_srq(b),
            op::DESTROY_SRQ => self.destroy_srq(b),
            op::REG_USER_MR => self.reg_user_mr_cmd(mem, b),
            op::REG_DMA_MR => self.reg_dma_mr(b),
            op::ALLOC_MR => self.alloc_mr(b),
            op::DEREG_MR => self.dereg_mr(b),
            op::ALLOC_MW => self.alloc_mw(b),
            op::BIND_MW => self.bind_mw(b),
            op::DEALLOC_MW => self.dealloc_mw(b),
            op::CREATE_AH => self.create_ah(b),
            op::DESTROY_AH => self.destroy_ah(b),
            op::ADD_GID => self.add_gid(b),
            op::DEL_GID => self.del_gid(b),
            op::ATTACH_MCAST => self.attach_mcast(b),
            op::DETACH_MCAST => self.detach_mcast(b),
            op::RESET => self.reset_cmd(),
            op::UPDATE_ODP => self.update_odp(mem, b),
            op::REREG_MR => self.rereg_mr(mem, b),
            op::ALLOC_XRCD => self.alloc_xrcd(),
            op::DEALLOC_XRCD => self.dealloc_xrcd(b),
            op::CREATE_XRC_SRQ => self.create_xrc_srq(mem, cmd(b)?),
            op::CREATE_FLOW => self.create_flow(cmd(b)?),
            op::DESTROY_FLOW => self.destroy_flow(cmd(b)?),
            op::SET_RSS => self.set_rss(b),
            _ => Err(Status::Unsupported),
        }
    }

    /// op::QUERY_GID_SOURCES.
    fn query_gid_sources(&mut self) -> CmdResult {
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

    /// op::QUERY_STATS: the port's counters by rxe's names ([`abi::stat`]), over every QP the
    /// device had, those destroyed included.
    fn hw_stats(&self) -> abi::RespQueryStats {
        use abi::stat;
        let mut q = self.retired;
        for (_, c) in self.qp_counters() {
            q.add(&c);
        }
        let p = self.port_counters();
        let mut r = abi::RespQueryStats {
            count: stat::COUNT as u32,
            ..Default::default()
        };
        let v = &mut r.values;
        v[stat::SENT_PKTS] = p.tx_packets;
        v[stat::RCVD_PKTS] = p.rx_packets;
        v[stat::DUP_REQ] = q.duplicate_requests;
        v[stat::OUT_OF_SEQ_REQ] = q.out_of_seq_requests;
        v[stat::RCV_RNR] = q.rnr_naks_received;
        v[stat::SND_RNR] = q.rnr_naks_sent;
        v[stat::RCV_SEQ_ERR] = q.seq_naks_received;
        v[stat::RETRY_EXCEEDED] = q.retry_exceeded;
        v[stat::RNR_RETRY_EXCEEDED] = q.rnr_retry_exceeded;
        v[stat::COMP_RETRY] = q.completer_retries;
        v[stat::LINK_DOWNED] = self.link_downed;
        r
    }

    /// op::QUERY_PORT.
    fn query_port(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::CmdQueryPort = cmd(b)?;
        if c.port_num != 1 {
            return Err(Status::Invalid);
        }
        let m = self.cfg.dev.port_mtu as u32;
        // As rxe: ACTIVE and LinkUp, or DOWN and Disabled without a link.
        let (state, phys_state) = if self.port_active() { (4, 5) } else { (1, 3) };
        body(abi::RespQueryPort {
            state,
            max_mtu: m,
            active_mtu: m,
            gid_tbl_len: self.cfg.dev.gid_table_len,
            port_cap_flags: 0,
            max_msg_sz: 1 << 31,
            pkey_tbl_len: 1,
            link_layer: 2,
            phys_state,
            active_width: 1,
            active_speed: 1,
            reserved: 0,
        })
    }

    /// op::CREATE_PD.
    fn create_pd(&mut self) -> CmdResult {
        let pd = self.any().dev.alloc_pd().map_err(verr)?;
        body(abi::Handle {
            handle: pd,
            reserved: 0,
        })
    }

    /// op::DESTROY_PD.
    fn destroy_pd(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        self.any().dev.dealloc_pd(c.handle).map_err(verr)?;
        Ok(Vec::new())
    }

    /// op::DESTROY_CQ.
    fn destroy_cq(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        self.any().dev.destroy_cq(c.handle).map_err(verr)?;
        let cq = write(&self.common.cqs).remove(&c.handle);
        if let Some(cq) = cq {
            let lb = ring_list_bytes(&lock(&cq).ring);
            self.common.lists().release(lb);
        }
        Ok(Vec::new())
    }

    /// op::QUERY_QP.
    fn query_qp(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::DESTROY_QP.
    fn destroy_qp(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        let counters = {
            let mut s = self.shard(c.handle);
            let counters = s.dev.qp_counters(Qpn(c.handle));
            s.dev.destroy_qp(Qpn(c.handle)).map_err(verr)?;
            if let Some(q) = s.qps.remove(&c.handle) {
                self.common.lists().release(q.list_bytes + q.reg_mr_held);
                self.common.wqes_release(q.wqe_held);
            }
            s.sq_backlog.remove(&c.handle);
            s.raw.forget_qp(c.handle);
            s.sq_active.remove(&c.handle);
            s.rq_active.remove(&c.handle);
            counters
        };
        if let Some(q) = &self.cfg.live_qpns {
            q.remove(c.handle);
        }
        // Its counts stay in the device's (QUERY_STATS).
        if let Some(q) = counters {
            self.retired.add(&q);
        }
        Ok(Vec::new())
    }

    /// op::MODIFY_SRQ.
    fn modify_srq(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::QUERY_SRQ.
    fn query_srq(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::DESTROY_SRQ.
    fn destroy_srq(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        self.any().dev.destroy_srq(c.handle).map_err(verr)?;
        let srq = write(&self.common.srqs).remove(&c.handle);
        if let Some(s) = srq {
            let lb = ring_list_bytes(&lock(&s).ring);
            self.common.lists().release(lb);
        }
        Ok(Vec::new())
    }

    /// op::REG_USER_MR.
    fn reg_user_mr_cmd(&mut self, mem: &GuestMemoryMmap, b: &[u8]) -> CmdResult {
        let (c, page_offset) = abi::CmdRegUserMr::read(b).ok_or(Status::BadRequest)?;
        if c.access & abi::ACCESS_ON_DEMAND != 0 {
            return self.reg_odp_mr(c, page_offset);
        }
        self.reg_user_mr(mem, c, page_offset)
    }

    /// op::REG_DMA_MR.
    fn reg_dma_mr(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::ALLOC_MR.
    fn alloc_mr(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::DEREG_MR.
    fn dereg_mr(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        {
            let mut s = self.any();
            let lb = s.dev.with_mr(c.handle, mr_list_bytes).unwrap_or(0);
            s.dev.dereg_mr(c.handle).map_err(verr)?;
            self.common.lists().release(lb);
        }
        Ok(Vec::new())
    }

    /// op::ALLOC_MW.
    fn alloc_mw(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::CmdAllocMw = cmd(b)?;
        let t = match c.mw_type {
            1 => MwType::Type1,
            2 => MwType::Type2,
            _ => return Err(Status::Invalid),
        };
        let k = self.any().dev.alloc_mw(c.pdn, t).map_err(verr)?;
        body(abi::RespMr { lkey: k, rkey: k })
    }

    /// op::BIND_MW.
    fn bind_mw(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::DEALLOC_MW.
    fn dealloc_mw(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::CREATE_AH.
    fn create_ah(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::DESTROY_AH.
    fn destroy_ah(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        let id = c.handle.checked_sub(1).ok_or(Status::NotFound)?;
        self.any().dev.destroy_ah(id).map_err(verr)?;
        Ok(Vec::new())
    }

    /// op::ADD_GID.
    fn add_gid(&mut self, b: &[u8]) -> CmdResult {
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

    /// op::DEL_GID.
    fn del_gid(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        if self.listed_gids.remove(&c.handle).is_none() {
            self.any().dev.del_gid(c.handle).map_err(verr)?;
            self.gids_changed = true;
        }
        Ok(Vec::new())
    }

    /// op::ATTACH_MCAST.
    fn attach_mcast(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::CmdMcast = cmd(b)?;
        self.shard(c.qpn)
            .dev
            .attach_mcast(Qpn(c.qpn), Gid(c.gid))
            .map_err(verr)?;
        Ok(Vec::new())
    }

    /// op::DETACH_MCAST.
    fn detach_mcast(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::CmdMcast = cmd(b)?;
        self.shard(c.qpn)
            .dev
            .detach_mcast(Qpn(c.qpn), Gid(c.gid))
            .map_err(verr)?;
        Ok(Vec::new())
    }

    /// op::RESET.
    fn reset_cmd(&mut self) -> CmdResult {
        self.reset();
        Ok(Vec::new())
    }
}
