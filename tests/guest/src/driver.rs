//! The guest driver and librxe: control commands on vq 0, doorbells on vq 1, events on
//! vq 2, and the rings in the rxe user ABI, behind a small verbs-like API ([`Guest`]).

use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rxe_core::verbs::*;
use rxe_core::Gid;
use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::VhostBackend;
use vmm_sys_util::eventfd::EventFd;

use vhost_user_rdma::abi;
use vhost_user_rdma::abi::{op, ring as hdr, Status};

use crate::error::{Error, Result};
use crate::ram::{GuestRam, VaMap, PAGE};
use crate::rings::{Cq, Mr, Qp, QueueBuf, Srq, Wc};
use crate::virtq::Virtq;
use crate::wqe::{encode_send_wqe, post_recv_ring, reg_mr_slot};

// ---------------------------------------------------------------------------------------------
// The guest

/// Options of [`Guest::connect`].
#[derive(Clone, Debug)]
pub struct GuestOpts {
    pub mem_size: u64,
    pub queue_size: u16,
    pub event_idx: bool,
    pub event_bufs: u16,
    /// Ring position every virtqueue starts at (SET_VRING_BASE, avail and used idx): non-zero
    /// plays a VMM reconnecting a running guest to a restarted daemon.
    pub vring_base: u16,
    /// Guest RAM's memfd sealed against shrinking and growing, as QEMU's memfd backend seals
    /// it by default (what `--guest-memory dmabuf` needs); false plays a VMM that does not.
    pub sealed_ram: bool,
}

impl Default for GuestOpts {
    fn default() -> Self {
        GuestOpts {
            mem_size: 64 << 20,
            queue_size: 256,
            event_idx: true,
            event_bufs: 64,
            vring_base: 0,
            sealed_ram: true,
        }
    }
}

/// A device worker [`Guest::hold_worker`] holds: the blocking eventfd its interrupt write
/// waits on.
#[must_use = "the worker stays held until Guest::release_worker"]
pub struct WorkerHold(EventFd);

pub struct Guest {
    pub ram: Arc<GuestRam>,
    pub(crate) fe: Frontend,
    pub(crate) ctrl: Virtq,
    pub(crate) db: Virtq,
    pub(crate) ev: Virtq,
    ctrl_req: u64,
    ctrl_resp: u64,
    db_bufs: u64,
    pub(crate) ev_bufs: u64,
    /// How many event buffers `ev_bufs` holds.
    pub(crate) ev_n: u16,
    seq: u64,
    pub(crate) pending_events: VecDeque<abi::Event>,
    pub config: abi::ConfigSpace,
    pub timeout: Duration,
    /// New QPs are kernel QPs (CREATE_QP_KERNEL, true by default): this guest plays the
    /// kernel driver, whose QPs alone may post REG_MR. False plays librxe-mapped QPs.
    pub kernel_qps: bool,
    /// Doorbells kick the doorbell queue (true by default). False plays a driver whose kicks
    /// the device suppressed: the entries wait on the ring until the device looks at it.
    pub kick_doorbells: bool,
}

const CTRL_BUF: u64 = 8192;

impl Guest {
    /// Connects to a daemon's vhost-user socket (retrying for up to 10 s while it starts) and
    /// brings the device up: features, memory table, three vrings, config space.
    pub fn connect(socket: &Path, opts: GuestOpts) -> Result<Guest> {
        let end = Instant::now() + Duration::from_secs(10);
        let mut fe = loop {
            match Frontend::connect(socket, abi::NUM_QUEUES as u64) {
                Ok(f) => break f,
                Err(e) if Instant::now() < end => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(e.into()),
            }
        };
        let ram = GuestRam::new_sealed(opts.mem_size, opts.sealed_ram)?;
        fe.set_owner()?;
        let features = fe.get_features()?;
        let mut want = (1u64 << 32) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if opts.event_idx {
            want |= 1 << 29;
        }
        let acked = features & want;
        if features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            let pf = fe.get_protocol_features()?;
            fe.set_protocol_features(
                pf & (VhostUserProtocolFeatures::CONFIG
                    | VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::RESET_DEVICE),
            )?;
        }
        fe.set_features(acked)?;
        let event_idx = acked & (1 << 29) != 0;
        fe.set_mem_table(&ram.memory_regions())?;
        let mut qs = Vec::new();
        for i in 0..abi::NUM_QUEUES {
            let mut q = Virtq::new(&ram, opts.queue_size, event_idx)?;
            q.start_at(opts.vring_base);
            fe.set_vring_num(i, q.size)?;
            fe.set_vring_addr(i, &q.config())?;
            fe.set_vring_base(i, opts.vring_base)?;
            fe.set_vring_call(i, &q.call)?;
            fe.set_vring_kick(i, &q.kick)?;
            fe.set_vring_enable(i, true)?;
            qs.push(q);
        }
        let sz = std::mem::size_of::<abi::ConfigSpace>() as u32;
        let (_, payload) = fe.get_config(
            0,
            sz,
            VhostUserConfigFlags::WRITABLE,
            &vec![0u8; sz as usize],
        )?;
        let config =
            abi::read_struct::<abi::ConfigSpace>(&payload).ok_or(Error::Timeout("config"))?;
        Guest::assemble(fe, ram, qs, config, opts.event_bufs)
    }

    /// The guest driver's side of a device whose vrings `qs` (control, doorbell, event) a
    /// frontend has set up: buffers for control requests and doorbells, and `event_bufs`
    /// event buffers posted.
    pub(crate) fn assemble(
        fe: Frontend,
        ram: Arc<GuestRam>,
        mut qs: Vec<Virtq>,
        config: abi::ConfigSpace,
        event_bufs: u16,
    ) -> Result<Guest> {
        assert_eq!(qs.len(), abi::NUM_QUEUES);
        let ev = qs.pop().expect("3 queues");
        let mut db = qs.pop().expect("3 queues");
        // Doorbells are fire-and-forget: no used-buffer interrupts (EVENT_IDX used_event stays
        // behind, or VRING_AVAIL_F_NO_INTERRUPT); finished buffers are reclaimed by polling.
        db.set_interrupts(false);
        let ctrl = qs.pop().expect("3 queues");
        let ctrl_req = ram.alloc_contig(CTRL_BUF, 4096)?;
        let ctrl_resp = ram.alloc_contig(CTRL_BUF, 4096)?;
        let db_bufs = ram.alloc_contig(16 * db.size as u64, 4096)?;
        let ev_bufs = ram.alloc_contig(16 * event_bufs as u64, 4096)?;
        let mut g = Guest {
            ram,
            fe,
            ctrl,
            db,
            ev,
            ctrl_req,
            ctrl_resp,
            db_bufs,
            ev_bufs,
            ev_n: event_bufs,
            seq: 0,
            pending_events: VecDeque::new(),
            config,
            timeout: Duration::from_secs(10),
            kernel_qps: true,
            kick_doorbells: true,
        };
        for i in 0..event_bufs as u64 {
            g.ev.add(&[(g.ev_bufs + 16 * i, 16, true)]);
        }
        Ok(g)
    }

    /// Closes the vhost-user connection (the daemon must drop all state and serve again).
    pub fn disconnect(self) {
        drop(self);
    }

    /// VHOST_USER_RESET_DEVICE.
    pub fn reset_device(&mut self) -> Result<()> {
        Ok(self.fe.reset_device()?)
    }

    /// Writes a page-list array (levels 0) for `pages`; returns its GPA.
    pub fn page_list(&self, pages: &[u64]) -> Result<u64> {
        self.ram.page_list(pages)
    }

    /// Sends a control request made of `parts` (device-readable) with `resp_len` bytes of
    /// device-writable response room; returns (status, response body).
    pub fn raw_cmd(&mut self, req: &[u8], resp_len: u32) -> Result<(u32, Vec<u8>)> {
        assert!(req.len() as u64 <= CTRL_BUF && resp_len as u64 <= CTRL_BUF);
        self.ram.write(self.ctrl_req, req);
        self.ram
            .write(self.ctrl_resp, &vec![0xEE; resp_len as usize]);
        let mut chain = Vec::new();
        if !req.is_empty() {
            chain.push((self.ctrl_req, req.len() as u32, false));
        }
        if resp_len > 0 {
            chain.push((self.ctrl_resp, resp_len, true));
        }
        self.raw_chain(&chain)?;
        let mut out = vec![0u8; resp_len as usize];
        self.ram.read(self.ctrl_resp, &mut out);
        let h: abi::RespHdr = abi::read_struct(&out).unwrap_or_default();
        let body = out
            .get(16..16 + (h.len as usize).min(out.len().saturating_sub(16)))
            .unwrap_or_default()
            .to_vec();
        Ok((h.status, body))
    }

    /// Puts a control command (header + `cmd`, room for the response) on the control queue
    /// without kicking it; [`Self::wait_unkicked_cmd`] waits for it. One at a time.
    pub fn post_unkicked_cmd(&mut self, opcode: u32, cmd: &[u8]) -> Result<u16> {
        let req = self.request(opcode, cmd);
        self.ram.write(self.ctrl_req, &req);
        self.ram.write(self.ctrl_resp, &[0xEE; 16]);
        let chain = [
            (self.ctrl_req, req.len() as u32, false),
            (self.ctrl_resp, 16 + 256, true),
        ];
        self.ctrl.add_unkicked(&chain).ok_or(Error::NoMemory)
    }

    /// Waits up to `timeout` for the command [`Self::post_unkicked_cmd`] put on the queue;
    /// returns its status.
    pub fn wait_unkicked_cmd(&mut self, head: u16, timeout: Duration) -> Result<u32> {
        loop {
            match self.ctrl.wait_used(timeout) {
                Some((id, _)) if id == head => {
                    let mut out = [0u8; 16];
                    self.ram.read(self.ctrl_resp, &mut out);
                    let h: abi::RespHdr = abi::read_struct(&out).unwrap_or_default();
                    return Ok(h.status);
                }
                Some(_) => continue,
                None => return Err(Error::Timeout("an unkicked control command")),
            }
        }
    }

    /// Holds the device's worker until [`Self::release_worker`], for a test that needs the
    /// device busy for as long as it says, whatever the timing (the part of a guest that keeps
    /// its worker busy with slow control commands). The control queue's interrupt eventfd is
    /// swapped for a blocking one filled to its maximum and a QUERY_DEVICE sent: the worker
    /// answers it and then blocks in its interrupt write, its device lock held, until the
    /// release reads the eventfd. When this returns the answer is on the used ring, so the
    /// worker holds the device's lock from then on. Meanwhile nothing else may use the control
    /// queue, and the device's counters cannot be read (its worker renders them).
    pub fn hold_worker(&mut self) -> Result<WorkerHold> {
        let hold = EventFd::new(libc::EFD_CLOEXEC)?;
        // An eventfd counts up to 2^64 - 2; a write that would pass it blocks.
        hold.write(u64::MAX - 1)?;
        self.fe.set_vring_call(0, &hold)?;
        // vhost-user messages are handled in order: an answered request means the call
        // eventfd was swapped before the command below is taken.
        self.fe.get_features()?;
        let head = self.post_unkicked_cmd(op::QUERY_DEVICE, &[])?;
        let _ = self.ctrl.kick.write(1);
        let status = self.wait_unkicked_cmd(head, self.timeout)?;
        if status != Status::Ok as u32 {
            return Err(Error::BadStatus(status));
        }
        Ok(WorkerHold(hold))
    }

    /// Lets the worker [`Self::hold_worker`] held go on, and proves it was held: its
    /// interrupt write, which could not complete before this read the eventfd, shows up after
    /// it (within the guest's timeout); the control queue gets its own eventfd back.
    pub fn release_worker(&mut self, hold: WorkerHold) -> Result<()> {
        let hold = hold.0;
        hold.read()?;
        let mut p = libc::pollfd {
            fd: hold.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = self.timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } != 1 {
            return Err(Error::Timeout(
                "the held worker's interrupt write (the worker was not held)",
            ));
        }
        self.fe.set_vring_call(0, &self.ctrl.call)?;
        self.fe.get_features()?;
        Ok(())
    }

    /// Submits an arbitrary descriptor chain on the control queue and waits for it.
    pub fn raw_chain(&mut self, chain: &[(u64, u32, bool)]) -> Result<u32> {
        let head = self.ctrl.add(chain).ok_or(Error::NoMemory)?;
        loop {
            match self.ctrl.wait_used(self.timeout) {
                Some((id, len)) if id == head => return Ok(len),
                Some(_) => continue,
                None => return Err(Error::Timeout("control queue")),
            }
        }
    }

    /// A control request: the header (the next sequence number) and `cmd`.
    fn request(&mut self, opcode: u32, cmd: &[u8]) -> Vec<u8> {
        self.seq += 1;
        let h = abi::CtrlHdr {
            opcode,
            flags: 0,
            seq: self.seq,
        };
        let mut req = vm_memory::ByteValued::as_slice(&h).to_vec();
        req.extend_from_slice(cmd);
        req
    }

    /// A control command: header + `cmd`, response struct returned.
    pub fn cmd(&mut self, opcode: u32, cmd: &[u8]) -> Result<Vec<u8>> {
        let req = self.request(opcode, cmd);
        let (status, body) = self.raw_cmd(&req, 16 + 256)?;
        match Status::from_u32(status) {
            Some(Status::Ok) => Ok(body),
            Some(s) => Err(Error::Status(s)),
            None => Err(Error::BadStatus(status)),
        }
    }

    fn cmd_t<C: vm_memory::ByteValued, R: vm_memory::ByteValued + Default>(
        &mut self,
        opcode: u32,
        c: &C,
    ) -> Result<R> {
        let b = self.cmd(opcode, c.as_slice())?;
        abi::read_struct(&b).ok_or(Error::BadStatus(u32::MAX))
    }

    fn handle(&mut self, opcode: u32, h: u32) -> Result<()> {
        self.cmd(
            opcode,
            vm_memory::ByteValued::as_slice(&abi::Handle {
                handle: h,
                reserved: 0,
            }),
        )
        .map(|_| ())
    }

    // ---------------------------------------------------------------- verbs

    pub fn query_device(&mut self) -> Result<abi::ConfigSpace> {
        let b = self.cmd(op::QUERY_DEVICE, &[])?;
        abi::read_struct(&b).ok_or(Error::BadStatus(u32::MAX))
    }

    pub fn query_port(&mut self) -> Result<abi::RespQueryPort> {
        self.cmd_t(
            op::QUERY_PORT,
            &abi::CmdQueryPort {
                port_num: 1,
                reserved: 0,
            },
        )
    }

    pub fn add_gid(&mut self, index: u32, gid: Gid) -> Result<()> {
        self.cmd(
            op::ADD_GID,
            vm_memory::ByteValued::as_slice(&abi::CmdAddGid {
                index,
                gid_type: abi::GID_TYPE_ROCE_UDP_ENCAP,
                gid: gid.0,
            }),
        )
        .map(|_| ())
    }

    pub fn del_gid(&mut self, index: u32) -> Result<()> {
        self.handle(op::DEL_GID, index)
    }

    pub fn alloc_pd(&mut self) -> Result<u32> {
        let h: abi::Handle =
            abi::read_struct(&self.cmd(op::CREATE_PD, &[])?).ok_or(Error::BadStatus(u32::MAX))?;
        Ok(h.handle)
    }

    pub fn dealloc_pd(&mut self, pd: u32) -> Result<()> {
        self.handle(op::DESTROY_PD, pd)
    }

    /// Allocates a user buffer of `len` bytes on scattered pages.
    pub fn alloc_buf(&self, len: usize) -> Result<VaMap> {
        let n = (len as u64).div_ceil(PAGE).max(1) as usize;
        let pages = self.ram.alloc_pages(n)?;
        self.ram.map_pages(&pages)
    }

    /// Registers a fresh buffer of `len` bytes (page list with indirection when it is large).
    pub fn reg_mr(&mut self, pd: u32, len: usize, access: Access) -> Result<Mr> {
        let buf = self.alloc_buf(len)?;
        let iova = buf.addr();
        self.reg_mr_at(pd, buf, 0, len, access, iova)
    }

    /// `ibv_reg_mr_iova`: registers `len` bytes starting `offset` bytes into a fresh buffer
    /// under an IOVA of the caller's choosing, congruent to the buffer or not.
    pub fn reg_mr_iova(
        &mut self,
        pd: u32,
        offset: usize,
        len: usize,
        access: Access,
        iova: u64,
    ) -> Result<Mr> {
        let buf = self.alloc_buf(offset + len)?;
        self.reg_mr_at(pd, buf, offset, len, access, iova)
    }

    /// The page-list array of `pages` (levels 0 up to 512 pages, else one level of 4 KiB list
    /// pages): (GPA, levels).
    pub fn page_list_levels(&self, pages: &[u64]) -> Result<(u64, u8)> {
        if pages.len() <= 512 {
            return Ok((self.page_list(pages)?, 0));
        }
        let mut tops = Vec::new();
        for chunk in pages.chunks(512) {
            let lp = self.ram.alloc_contig(PAGE, PAGE)?;
            let b: Vec<u8> = chunk.iter().flat_map(|p| p.to_le_bytes()).collect();
            self.ram.write(lp, &b);
            tops.push(lp);
        }
        Ok((self.page_list(&tops)?, 1))
    }

    fn reg_mr_at(
        &mut self,
        pd: u32,
        buf: VaMap,
        offset: usize,
        len: usize,
        access: Access,
        iova: u64,
    ) -> Result<Mr> {
        // The pages that hold bytes offset .. offset+len (at least one), as ib_umem pins them.
        let first = offset / PAGE as usize;
        let end = (offset + len).div_ceil(PAGE as usize).max(first + 1);
        let pages = buf.pages[first..end].to_vec();
        let (gpa, levels) = self.page_list_levels(&pages)?;
        let r: abi::RespMr = self.cmd_t(
            op::REG_USER_MR,
            &abi::CmdRegUserMr {
                pdn: pd,
                access: access.0,
                iova,
                length: len as u64,
                pages: abi::PageListDesc {
                    gpa,
                    num_pages: pages.len() as u32,
                    page_shift: 12,
                    levels,
                    reserved: 0,
                },
                page_offset: (offset % PAGE as usize) as u32,
                reserved: 0,
            },
        )?;
        Ok(Mr {
            lkey: r.lkey,
            rkey: r.rkey,
            buf,
            len,
            iova,
            offset,
        })
    }

    pub fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.handle(op::DEREG_MR, mr.lkey)
    }

    pub fn alloc_mw(&mut self, pd: u32, mw_type: u32) -> Result<u32> {
        let r: abi::RespMr = self.cmd_t(op::ALLOC_MW, &abi::CmdAllocMw { pdn: pd, mw_type })?;
        Ok(r.rkey)
    }

    pub fn dealloc_mw(&mut self, rkey: u32) -> Result<()> {
        self.handle(op::DEALLOC_MW, rkey)
    }

    pub fn create_cq(&mut self, cqe: u32) -> Result<Cq> {
        let slots = (cqe + 1).next_power_of_two();
        let ring = QueueBuf::new(&self.ram, slots, abi::CQE_SIZE)?;
        let r: abi::RespCreateCq = self.cmd_t(
            op::CREATE_CQ,
            &abi::CmdCreateCq {
                cqe,
                flags: 0,
                queue: ring.desc(),
            },
        )?;
        Ok(Cq {
            cqn: r.cqn,
            cqe: r.cqe,
            ring,
        })
    }

    /// RESIZE_CQ: a new ring of `cqe` entries; the device moves unconsumed entries into it.
    /// On error the old ring stays in use.
    pub fn resize_cq(&mut self, cq: &mut Cq, cqe: u32) -> Result<()> {
        let slots = (cqe + 1).next_power_of_two();
        let ring = QueueBuf::new(&self.ram, slots, abi::CQE_SIZE)?;
        let r: abi::RespCreateCq = self.cmd_t(
            op::RESIZE_CQ,
            &abi::CmdResizeCq {
                cqn: cq.cqn,
                cqe,
                queue: ring.desc(),
            },
        )?;
        cq.cqe = r.cqe;
        cq.ring = ring;
        Ok(())
    }

    /// RESIZE_SRQ: a new ring for `srq` with `max_wr`; returns the device's max_wr. On
    /// success the SRQ uses the new ring (the device moved the receives it had not taken).
    pub fn resize_srq(&mut self, srq: &mut Srq, max_wr: u32) -> Result<u32> {
        let ring = self.srq_ring(max_wr, srq.max_sge)?;
        let r: abi::RespQuerySrq = self.cmd_t(
            op::RESIZE_SRQ,
            &abi::CmdResizeSrq {
                srqn: srq.srqn,
                max_wr,
                queue: ring.desc(),
            },
        )?;
        srq.ring = ring;
        Ok(r.max_wr)
    }

    /// ALLOC_MR: a fast-registration MR; returns its key.
    pub fn alloc_mr(&mut self, pd: u32, max_num_sg: u32) -> Result<u32> {
        let r: abi::RespMr = self.cmd_t(
            op::ALLOC_MR,
            &abi::CmdAllocMr {
                pdn: pd,
                max_num_sg,
            },
        )?;
        Ok(r.lkey)
    }

    /// BIND_MW (type 1 windows): returns the window's new rkey.
    pub fn bind_mw_type1(
        &mut self,
        qp: &Qp,
        mw_rkey: u32,
        mr_lkey: u32,
        addr: u64,
        length: u64,
        access: Access,
    ) -> Result<u32> {
        let r: abi::RespMr = self.cmd_t(
            op::BIND_MW,
            &abi::CmdBindMw {
                qpn: qp.qpn,
                mw_rkey,
                mr_lkey,
                access: access.0,
                addr,
                length,
            },
        )?;
        Ok(r.rkey)
    }

    /// MODIFY_SRQ.
    pub fn modify_srq(&mut self, srq: &Srq, attr_mask: u32, max_wr: u32, limit: u32) -> Result<()> {
        self.cmd(
            op::MODIFY_SRQ,
            vm_memory::ByteValued::as_slice(&abi::CmdModifySrq {
                srqn: srq.srqn,
                attr_mask,
                max_wr,
                srq_limit: limit,
            }),
        )
        .map(|_| ())
    }

    /// Posts a REG_MR work request (the contract's kernel-only fast registration): maps
    /// `iova … iova+length` of MR `lkey` under the new `key` onto the guest pages `pages`,
    /// the first byte `page_offset` bytes into the first page (the PAGE_OFFSET flag), or
    /// where `iova` falls in a page (`None`: no flag).
    #[allow(clippy::too_many_arguments)]
    pub fn post_reg_mr(
        &mut self,
        qp: &Qp,
        wr_id: u64,
        lkey: u32,
        key: u32,
        access: Access,
        iova: u64,
        length: u64,
        pages: &[u64],
        page_offset: Option<u32>,
    ) -> Result<()> {
        let list = abi::PageListDesc {
            gpa: self.page_list(pages)?,
            num_pages: pages.len() as u32,
            page_shift: 12,
            levels: 0,
            reserved: 0,
        };
        let slot = reg_mr_slot(
            qp,
            wr_id,
            lkey,
            key,
            access,
            iova,
            length,
            &list,
            page_offset,
        )?;
        self.post_raw_send_slot(qp, &slot)
    }

    /// Writes a send WQE slot into the SQ ring without a doorbell; returns the new producer
    /// index (for [`Guest::doorbell`]).
    pub fn write_send_slot(&mut self, qp: &Qp, slot: &[u8]) -> Result<u32> {
        let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        let prod = sq.producer().load(Ordering::Relaxed);
        sq.map
            .write(sq.slot_off(prod), &slot[..slot.len().min(sq.elem_size())]);
        let next = (prod + 1) & sq.mask();
        sq.producer().store(next, Ordering::Release);
        Ok(next)
    }

    pub fn destroy_cq(&mut self, cq: Cq) -> Result<()> {
        self.handle(op::DESTROY_CQ, cq.cqn)
    }

    /// An SRQ's ring: `max_wr` receives of `max_sge` SGEs.
    fn srq_ring(&self, max_wr: u32, max_sge: u32) -> Result<QueueBuf> {
        QueueBuf::new(
            &self.ram,
            (max_wr + 1).next_power_of_two(),
            abi::rwqe::SIZE + max_sge as usize * abi::SGE_SIZE,
        )
    }

    pub fn create_srq(&mut self, pd: u32, max_wr: u32, max_sge: u32, limit: u32) -> Result<Srq> {
        let ring = self.srq_ring(max_wr, max_sge)?;
        let r: abi::RespCreateSrq = self.cmd_t(
            op::CREATE_SRQ,
            &abi::CmdCreateSrq {
                pdn: pd,
                max_wr,
                max_sge,
                srq_limit: limit,
                queue: ring.desc(),
            },
        )?;
        Ok(Srq {
            srqn: r.srqn,
            ring,
            max_sge,
        })
    }

    /// ALLOC_XRCD: an XRC domain.
    pub fn alloc_xrcd(&mut self) -> Result<u32> {
        let r: abi::Handle = self.cmd_t(op::ALLOC_XRCD, &abi::Handle::default())?;
        Ok(r.handle)
    }

    pub fn dealloc_xrcd(&mut self, xrcd: u32) -> Result<()> {
        self.handle(op::DEALLOC_XRCD, xrcd)
    }

    /// CREATE_XRC_SRQ: an SRQ of domain `xrcd` whose receive completions go to `cq`.
    pub fn create_xrc_srq(
        &mut self,
        pd: u32,
        xrcd: u32,
        cq: &Cq,
        max_wr: u32,
        max_sge: u32,
    ) -> Result<Srq> {
        let ring = self.srq_ring(max_wr, max_sge)?;
        let r: abi::RespCreateSrq = self.cmd_t(
            op::CREATE_XRC_SRQ,
            &abi::CmdCreateXrcSrq {
                srq: abi::CmdCreateSrq {
                    pdn: pd,
                    max_wr,
                    max_sge,
                    srq_limit: 0,
                    queue: ring.desc(),
                },
                xrcdn: xrcd,
                cqn: cq.cqn,
            },
        )?;
        Ok(Srq {
            srqn: r.srqn,
            ring,
            max_sge,
        })
    }

    /// CREATE_QP of an XRC TGT QP in domain `xrcd`: no ring, PD or CQ.
    pub fn create_xrc_tgt(&mut self, xrcd: u32) -> Result<Qp> {
        let r: abi::RespCreateQp = self.cmd_t(
            op::CREATE_QP,
            &abi::CmdCreateQp {
                qp_type: abi::qp_type::XRC_TGT,
                flags: if self.kernel_qps {
                    abi::CREATE_QP_KERNEL
                } else {
                    0
                },
                xrcdn: xrcd,
                ..Default::default()
            },
        )?;
        Ok(Qp {
            qpn: r.qpn,
            qp_type: QpType::XrcTgt,
            sq: None,
            rq: None,
            cap: QpCap::default(),
        })
    }

    /// CREATE_FLOW: frames matching `m` go to raw packet QP `qp`; the flow's handle.
    pub fn create_flow(&mut self, qp: &Qp, m: &abi::FlowMatch) -> Result<u32> {
        let r: abi::Handle = self.cmd_t(
            op::CREATE_FLOW,
            &abi::CmdCreateFlow {
                qpn: qp.qpn,
                flags: 0,
                m: *m,
            },
        )?;
        Ok(r.handle)
    }

    pub fn destroy_flow(&mut self, flow: u32) -> Result<()> {
        self.handle(op::DESTROY_FLOW, flow)
    }

    /// SET_RSS: raw packet QP `qp` (no ring) spreads its frames over `table` by a Toeplitz
    /// hash of `fields` under `key`.
    pub fn set_rss(&mut self, qp: &Qp, fields: u32, key: &[u8; 40], table: &[u32]) -> Result<()> {
        let mut c = abi::CmdSetRss {
            qpn: qp.qpn,
            fields,
            log_table_size: table.len().trailing_zeros(),
            key_len: 40,
            key: *key,
            ..Default::default()
        };
        c.table[..table.len()].copy_from_slice(table);
        self.cmd(op::SET_RSS, vm_memory::ByteValued::as_slice(&c))
            .map(|_| ())
    }

    pub fn destroy_srq(&mut self, srq: Srq) -> Result<()> {
        self.handle(op::DESTROY_SRQ, srq.srqn)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn create_qp(
        &mut self,
        qp_type: QpType,
        pd: u32,
        send_cq: &Cq,
        recv_cq: &Cq,
        srq: Option<&Srq>,
        cap: QpCap,
    ) -> Result<Qp> {
        let sq = if cap.max_send_wr > 0 {
            let elem = abi::swqe::SIZE
                + (cap.max_send_sge as usize * abi::SGE_SIZE).max(cap.max_inline_data as usize);
            Some(QueueBuf::new(
                &self.ram,
                (cap.max_send_wr + 1).next_power_of_two(),
                elem,
            )?)
        } else {
            None
        };
        let rq = if srq.is_none() && cap.max_recv_wr > 0 {
            let elem = abi::rwqe::SIZE + cap.max_recv_sge as usize * abi::SGE_SIZE;
            Some(QueueBuf::new(
                &self.ram,
                (cap.max_recv_wr + 1).next_power_of_two(),
                elem,
            )?)
        } else {
            None
        };
        let t = match qp_type {
            QpType::Rc => abi::qp_type::RC,
            QpType::Uc => abi::qp_type::UC,
            QpType::Ud => abi::qp_type::UD,
            QpType::Gsi => abi::qp_type::GSI,
            QpType::XrcIni => abi::qp_type::XRC_INI,
            QpType::RawPacket => abi::qp_type::RAW_PACKET,
            // No CQ or PD: `create_xrc_tgt`.
            QpType::XrcTgt => return Err(Error::Status(Status::Invalid)),
        };
        let r: abi::RespCreateQp = self.cmd_t(
            op::CREATE_QP,
            &abi::CmdCreateQp {
                qp_type: t,
                pdn: pd,
                send_cqn: send_cq.cqn,
                recv_cqn: recv_cq.cqn,
                srqn: srq.map_or(0, |s| s.srqn),
                flags: if srq.is_some() {
                    abi::CREATE_QP_HAS_SRQ
                } else {
                    0
                } | if self.kernel_qps {
                    abi::CREATE_QP_KERNEL
                } else {
                    0
                },
                max_send_wr: cap.max_send_wr,
                max_recv_wr: cap.max_recv_wr,
                max_send_sge: cap.max_send_sge,
                max_recv_sge: cap.max_recv_sge,
                max_inline_data: cap.max_inline_data,
                xrcdn: 0,
                sq: sq.as_ref().map(|q| q.desc()).unwrap_or_default(),
                rq: rq.as_ref().map(|q| q.desc()).unwrap_or_default(),
            },
        )?;
        Ok(Qp {
            qpn: r.qpn,
            qp_type,
            sq,
            rq,
            cap,
        })
    }

    pub fn destroy_qp(&mut self, qp: Qp) -> Result<()> {
        self.handle(op::DESTROY_QP, qp.qpn)
    }

    pub fn modify_qp(&mut self, qp: &Qp, attr: &QpAttr, mask: u32) -> Result<()> {
        let w = abi::QpAttrs {
            qpn: qp.qpn,
            attr_mask: mask,
            qp_state: attr.qp_state as u32,
            cur_qp_state: attr.cur_qp_state as u32,
            path_mtu: attr.path_mtu as u32,
            qkey: attr.qkey,
            rq_psn: attr.rq_psn,
            sq_psn: attr.sq_psn,
            dest_qp_num: attr.dest_qp_num,
            qp_access_flags: attr.qp_access_flags.0,
            pkey_index: attr.pkey_index,
            en_sqd_async_notify: attr.en_sqd_async_notify as u8,
            max_rd_atomic: attr.max_rd_atomic,
            max_dest_rd_atomic: attr.max_dest_rd_atomic,
            min_rnr_timer: attr.min_rnr_timer,
            port_num: attr.port_num,
            timeout: attr.timeout,
            retry_cnt: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            ah: abi::AhAttr {
                dgid: attr.av.dgid.0,
                flow_label: attr.av.flow_label,
                sgid_index: attr.av.sgid_index,
                hop_limit: attr.av.hop_limit,
                traffic_class: attr.av.traffic_class,
                dmac: attr.av.dmac,
                port_num: 1,
                ..Default::default()
            },
            ..Default::default()
        };
        self.cmd(op::MODIFY_QP, vm_memory::ByteValued::as_slice(&w))
            .map(|_| ())
    }

    pub fn query_qp(&mut self, qp: &Qp) -> Result<abi::QpAttrs> {
        self.cmd_t(
            op::QUERY_QP,
            &abi::QpAttrs {
                qpn: qp.qpn,
                ..Default::default()
            },
        )
    }

    pub fn create_ah(&mut self, pd: u32, av: &Av) -> Result<u32> {
        let h: abi::Handle = self.cmd_t(
            op::CREATE_AH,
            &abi::CmdCreateAh {
                pdn: pd,
                reserved: 0,
                attr: abi::AhAttr {
                    dgid: av.dgid.0,
                    flow_label: av.flow_label,
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                    dmac: av.dmac,
                    port_num: 1,
                    ..Default::default()
                },
            },
        )?;
        Ok(h.handle)
    }

    // ---------------------------------------------------------------- data path (librxe's part)

    /// Rings a doorbell.
    pub fn doorbell(&mut self, kind: u32, object: u32, index: u32) -> Result<()> {
        // Reclaim finished doorbells first.
        while self.db.poll_used().is_some() {}
        let end = Instant::now() + self.timeout;
        loop {
            // The buffer slot follows the descriptor that will be used: pick by free list top.
            let Some(&d) = self.db.free.last() else {
                if Instant::now() > end {
                    return Err(Error::Timeout("doorbell queue"));
                }
                self.db.wait_used(Duration::from_millis(10));
                continue;
            };
            let gpa = self.db_bufs + 16 * d as u64;
            let e = abi::Doorbell {
                kind,
                object,
                index,
                reserved: 0,
            };
            self.ram.write(gpa, vm_memory::ByteValued::as_slice(&e));
            let kick = self.kick_doorbells;
            self.db
                .add_kick(&[(gpa, 16, false)], kick)
                .ok_or(Error::NoMemory)?;
            return Ok(());
        }
    }

    /// Writes `wr` into the SQ ring as an `rxe_send_wqe`, publishes it, rings the doorbell.
    pub fn post_send(&mut self, qp: &Qp, wr: &SendWr) -> Result<()> {
        self.post_send_ah(qp, wr, 0)
    }

    /// As `post_send`, with a UD destination named by an AH number (0: AV inline).
    pub fn post_send_ah(&mut self, qp: &Qp, wr: &SendWr, ah_num: u32) -> Result<()> {
        let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        if sq.is_full() {
            return Err(Error::NoMemory);
        }
        let prod = sq.producer().load(Ordering::Relaxed);
        let slot = encode_send_wqe(wr, ah_num, sq.elem_size());
        sq.map.write(sq.slot_off(prod), &slot);
        sq.producer()
            .store((prod + 1) & sq.mask(), Ordering::Release);
        self.doorbell(abi::doorbell::SQ, qp.qpn, (prod + 1) & sq.mask())
    }

    /// Writes a raw slot into the SQ (for malformed-WQE tests) and rings the doorbell.
    pub fn post_raw_send_slot(&mut self, qp: &Qp, slot: &[u8]) -> Result<()> {
        let sq = qp.sq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        let prod = sq.producer().load(Ordering::Relaxed);
        sq.map
            .write(sq.slot_off(prod), &slot[..slot.len().min(sq.elem_size())]);
        sq.producer()
            .store((prod + 1) & sq.mask(), Ordering::Release);
        self.doorbell(abi::doorbell::SQ, qp.qpn, (prod + 1) & sq.mask())
    }

    /// Writes a receive WQE into the RQ ring (no doorbell: librxe does not ring one).
    pub fn post_recv(&mut self, qp: &Qp, wr: &RecvWr) -> Result<()> {
        let rq = qp.rq.as_ref().ok_or(Error::Status(Status::Invalid))?;
        post_recv_ring(rq, wr)
    }

    pub fn post_srq_recv(&mut self, srq: &Srq, wr: &RecvWr) -> Result<()> {
        post_recv_ring(&srq.ring, wr)
    }

    /// Reads up to `max` completions from the CQ ring.
    pub fn poll_cq(&mut self, cq: &Cq, max: usize) -> Vec<Wc> {
        let r = &cq.ring;
        let mut out = Vec::new();
        let mut cons = r.consumer().load(Ordering::Relaxed);
        let prod = r.producer().load(Ordering::Acquire);
        while cons != prod && out.len() < max {
            let mut b = [0u8; abi::CQE_SIZE];
            r.map.read(r.slot_off(cons), &mut b);
            out.push(abi::read_struct(&b).expect("48 bytes"));
            cons = (cons + 1) & r.mask();
        }
        r.consumer().store(cons, Ordering::Release);
        out
    }

    /// Polls until `n` completions arrived or the timeout passed.
    pub fn wait_cq(&mut self, cq: &Cq, n: usize, timeout: Duration) -> Vec<Wc> {
        let end = Instant::now() + timeout;
        let mut out = Vec::new();
        let mut spins = 0u32;
        while out.len() < n {
            let got = self.poll_cq(cq, n - out.len());
            if got.is_empty() {
                if Instant::now() > end {
                    break;
                }
                spins += 1;
                if spins > 200 {
                    std::thread::sleep(Duration::from_micros(50));
                } else {
                    std::hint::spin_loop();
                }
            } else {
                spins = 0;
            }
            out.extend(got);
        }
        out
    }

    /// Arms the CQ (the notify word); returns true if completions may have been missed (the
    /// ring is not empty), as `IB_CQ_REPORT_MISSED_EVENTS` does.
    pub fn req_notify_cq(&mut self, cq: &Cq, solicited_only: bool) -> bool {
        let w = if solicited_only {
            hdr::NOTIFY_SOLICITED
        } else {
            hdr::NOTIFY_NEXT_COMP
        };
        cq.ring.notify().store(w, Ordering::Release);
        fence(Ordering::SeqCst);
        cq.ring.producer().load(Ordering::Acquire) != cq.ring.consumer().load(Ordering::Relaxed)
    }

    /// Doorbell kicks so far: (buffers added with a kick, added without one because the
    /// device had kicks suppressed).
    pub fn doorbell_kicks(&self) -> (u64, u64) {
        (self.db.kicks, self.db.kicks_suppressed)
    }

    /// Events delivered so far (reposting their buffers).
    pub fn poll_events(&mut self) -> Vec<abi::Event> {
        while let Some((id, len)) = self.ev.poll_used() {
            let gpa = self.ev_bufs + 16 * id as u64;
            if len >= 16 {
                let mut b = [0u8; 16];
                self.ram.read(gpa, &mut b);
                if let Some(e) = abi::read_struct(&b) {
                    self.pending_events.push_back(e);
                }
            }
            self.ev.add(&[(gpa, 16, true)]);
        }
        self.pending_events.drain(..).collect()
    }

    /// Waits until an event matching `f` arrives.
    pub fn wait_event(
        &mut self,
        timeout: Duration,
        f: impl Fn(&abi::Event) -> bool,
    ) -> Option<abi::Event> {
        let end = Instant::now() + timeout;
        let mut seen = Vec::new();
        let r = loop {
            let evs = self.poll_events();
            let mut hit = None;
            for e in evs {
                if hit.is_none() && f(&e) {
                    hit = Some(e);
                } else {
                    seen.push(e);
                }
            }
            if hit.is_some() {
                break hit;
            }
            if Instant::now() > end {
                break None;
            }
            if let Some((id, len)) = self.ev.wait_used(Duration::from_millis(20)) {
                // Keep it for the next poll_events round and repost the buffer.
                let gpa = self.ev_bufs + 16 * id as u64;
                let mut b = [0u8; 16];
                self.ram.read(gpa, &mut b);
                if len >= 16 {
                    if let Some(e) = abi::read_struct(&b) {
                        self.pending_events.push_back(e);
                    }
                }
                self.ev.add(&[(gpa, 16, true)]);
            }
        };
        for e in seen.into_iter().rev() {
            self.pending_events.push_front(e);
        }
        r
    }
}
