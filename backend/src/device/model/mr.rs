//! User memory registration: REG_USER_MR with a page list, REREG_MR, and on-demand paging (caps ODP,
//! docs/virtio-rdma.md §5.10): MRs whose pages the driver maps and unmaps at any time. The engine stops an access at a page not mapped
//! ([`rxe_core::mem::MemError::NotPresent`]); the fault goes to the driver as a PAGE_FAULT
//! event; the driver answers with UPDATE_ODP, which maps the page and wakes the QPs waiting.

use super::*;
use rxe_core::mem::{Backing, PageFault, ODP_FAILED, ODP_PAGE_SHIFT, ODP_PRESENT, ODP_WRITABLE};

impl Model {
    /// REG_USER_MR. `page_offset`: where the first byte lies in the first page (the 48-byte
    /// command); `None` (the 40-byte command): `iova mod page`, the rule before the field.
    pub(super) fn reg_user_mr(
        &mut self,
        mem: &GuestMemoryMmap,
        mut c: abi::CmdRegUserMr,
        page_offset: Option<u32>,
    ) -> CmdResult {
        c.access &= !abi::ACCESS_IGNORED;
        if c.access & !Access::ALL.0 != 0 {
            return Err(Status::Invalid);
        }
        let (need, offset) = self.translation(c.iova, c.length, &c.pages, page_offset)?;
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
        self.reg_charged(list_bytes(need as usize), |m| {
            let pages = resolve_page_list(mem, &c.pages, need as u32)?;
            let back = ring::pages_backing(c.pages.page_shift, offset, pages);
            m.any()
                .dev
                .reg_mr(c.pdn, c.iova, c.length, Access(c.access), back)
                .map_err(verr)
        })
    }

    /// A user MR's translation as a command gives it: IOVA range and page list checked
    /// against the limits; returns the list's page count and where the first byte lies in
    /// the first page (`page_offset`, or `iova mod page` when the command has none).
    fn translation(
        &self,
        iova: u64,
        length: u64,
        pages: &abi::PageListDesc,
        page_offset: Option<u32>,
    ) -> Result<(u64, u64), Status> {
        if length > self.cfg.dev.max_mr_size
            || length > self.cfg.dev.max_registered_bytes
            || iova.checked_add(length).is_none()
            || !(12..=30).contains(&pages.page_shift)
        {
            return Err(Status::Invalid);
        }
        let shift = pages.page_shift as u32;
        let mask = (1u64 << shift) - 1;
        let offset = page_offset.map_or(iova & mask, u64::from);
        if offset > mask {
            return Err(Status::Invalid);
        }
        let need = offset
            .checked_add(length)
            .ok_or(Status::Invalid)?
            .div_ceil(1 << shift)
            .max(1);
        if need > crate::memory::guest_mem::MAX_PAGES as u64 || pages.num_pages as u64 != need {
            return Err(Status::Invalid);
        }
        Ok((need, offset))
    }

    /// op::REREG_MR (caps REREG_MR): `ibv_rereg_mr` in place, the keys kept. A new
    /// translation's list is charged to the page-list budget before it is read; the old
    /// list's bytes are given back once the MR has the new one. A refused change changes
    /// nothing.
    pub(super) fn rereg_mr(&mut self, mem: &GuestMemoryMmap, b: &[u8]) -> CmdResult {
        use abi::rereg::{ACCESS, PD, TRANS};
        let c: abi::CmdReregMr = cmd(b)?;
        if c.flags & !(TRANS | PD | ACCESS) != 0 || c.flags == 0 || c.reserved != 0 {
            return Err(Status::Invalid);
        }
        let access = if c.flags & ACCESS != 0 {
            let a = c.access & !abi::ACCESS_IGNORED;
            if a & !Access::ALL.0 != 0 || a & abi::ACCESS_ON_DEMAND != 0 {
                return Err(Status::Invalid);
            }
            Some(Access(a))
        } else {
            None
        };
        let pd = (c.flags & PD != 0).then_some(c.pdn);
        let keys = body(abi::RespMr {
            lkey: c.lkey,
            rkey: c.lkey,
        });
        if c.flags & TRANS == 0 {
            self.any()
                .dev
                .rereg_mr(c.lkey, pd, access, None)
                .map_err(verr)?;
            return keys;
        }
        let old_lb = self
            .any()
            .dev
            .with_mr(c.lkey, mr_list_bytes)
            .ok_or(Status::NotFound)?;
        let (need, offset) = self.translation(c.iova, c.length, &c.pages, Some(c.page_offset))?;
        let lb = list_bytes(need as usize);
        self.common.lists().charge(lb)?;
        let r = resolve_page_list(mem, &c.pages, need as u32).and_then(|pages| {
            let back = ring::pages_backing(c.pages.page_shift, offset, pages);
            self.any()
                .dev
                .rereg_mr(c.lkey, pd, access, Some((c.iova, c.length, back)))
                .map_err(verr)
        });
        match r {
            Ok(()) => {
                self.common.lists().release(old_lb);
                keys
            }
            Err(e) => {
                self.common.lists().release(lb);
                Err(e)
            }
        }
    }

    /// A registration whose page list (or on-demand table) holds `lb` bytes of the page-list
    /// budget: charged before `reg` runs, given back if it fails.
    fn reg_charged(
        &mut self,
        lb: u64,
        reg: impl FnOnce(&mut Self) -> Result<u32, Status>,
    ) -> CmdResult {
        self.common.lists().charge(lb)?;
        match reg(self) {
            Ok(k) => body(abi::RespMr { lkey: k, rkey: k }),
            Err(e) => {
                self.common.lists().release(lb);
                Err(e)
            }
        }
    }

    /// REG_USER_MR with `IBV_ACCESS_ON_DEMAND`: an MR none of whose pages is mapped; the
    /// command carries no page list (`num_pages` 0). Its table (8 bytes per 4 KiB) counts
    /// against the page-list budget as a list would.
    pub(super) fn reg_odp_mr(
        &mut self,
        mut c: abi::CmdRegUserMr,
        page_offset: Option<u32>,
    ) -> CmdResult {
        c.access &= !(abi::ACCESS_IGNORED | abi::ACCESS_ON_DEMAND);
        if c.iova == 0 && c.length == u64::MAX {
            return self.reg_implicit_odp_mr(c, page_offset);
        }
        let mask = (1u64 << ODP_PAGE_SHIFT) - 1;
        let offset = page_offset.map_or(c.iova & mask, u64::from);
        if c.access & !Access::ALL.0 != 0
            || c.length > self.cfg.dev.max_mr_size
            || c.iova.checked_add(c.length).is_none()
            || offset > mask
            || c.pages.num_pages != 0
        {
            return Err(Status::Invalid);
        }
        let need = (offset + c.length).div_ceil(1 << ODP_PAGE_SHIFT).max(1);
        if need > crate::memory::guest_mem::MAX_PAGES as u64 {
            return Err(Status::Invalid);
        }
        let back = Backing::Odp {
            key: 0,
            page_offset: offset,
            entries: vec![0; need as usize],
        };
        self.reg_charged(list_bytes(need as usize), |m| {
            m.any()
                .dev
                .reg_mr(c.pdn, c.iova, c.length, Access(c.access), back)
                .map_err(verr)
        })
    }

    /// The implicit on-demand-paging MR (caps IMPLICIT_ODP): IOVA 0 and length `u64::MAX`,
    /// the whole address space, no page list, no page mapped. Its entries count against the
    /// page-list budget as UPDATE_ODP maps pages.
    fn reg_implicit_odp_mr(&mut self, c: abi::CmdRegUserMr, page_offset: Option<u32>) -> CmdResult {
        if c.access & !Access::ALL.0 != 0 || page_offset.unwrap_or(0) != 0 || c.pages.num_pages != 0
        {
            return Err(Status::Invalid);
        }
        let back = Backing::OdpImplicit {
            key: 0,
            entries: Default::default(),
        };
        self.reg_charged(0, |m| {
            m.any()
                .dev
                .reg_mr(c.pdn, 0, u64::MAX, Access(c.access), back)
                .map_err(verr)
        })
    }

    /// op::UPDATE_ODP. Once it answers, no access goes through the pages' old entries (the
    /// engine's accesses hold the key table while they copy, and an on-demand page is never
    /// read later through a payload reference). Mapping or failing pages wakes the QPs of
    /// every shard that wait for a page.
    pub(super) fn update_odp(&mut self, mem: &GuestMemoryMmap, b: &[u8]) -> CmdResult {
        use abi::odp::{FAILED, UNMAP, WRITABLE};
        let c: abi::CmdUpdateOdp = cmd(b)?;
        let max = crate::memory::guest_mem::MAX_PAGES as u64;
        let unmap = c.flags & (UNMAP | FAILED);
        if c.flags & !(UNMAP | FAILED | WRITABLE) != 0
            || unmap == UNMAP | FAILED
            || (unmap != 0 && c.flags & WRITABLE != 0)
            || c.count == 0
            || c.count > max
        {
            return Err(Status::Invalid);
        }
        let entries = if unmap != 0 {
            if c.pages.num_pages != 0 {
                return Err(Status::Invalid);
            }
            let e = if unmap == FAILED { ODP_FAILED } else { 0 };
            vec![e; c.count as usize]
        } else {
            if c.pages.num_pages as u64 != c.count || c.pages.page_shift != ODP_PAGE_SHIFT {
                return Err(Status::Invalid);
            }
            // Aligned pages inside guest memory (the list's own checks).
            let bits = ODP_PRESENT
                | if c.flags & WRITABLE != 0 {
                    ODP_WRITABLE
                } else {
                    0
                };
            let mut e = resolve_page_list(mem, &c.pages, c.count as u32)?;
            e.iter_mut().for_each(|p| *p |= bits);
            e
        };
        let implicit = self
            .any()
            .dev
            .with_mr(c.lkey, |mr| {
                matches!(mr.backing, Backing::OdpImplicit { .. })
            })
            .unwrap_or(false);
        if implicit {
            self.update_implicit(c.lkey, c.first_page, &entries)?;
        } else {
            self.any()
                .dev
                .odp_update(c.lkey, c.first_page, &entries)
                .map_err(verr)?;
        }
        if unmap != UNMAP {
            self.stats.odp_updates += 1;
            for (k, s) in self.shards.iter().enumerate() {
                self.touch(1 << k);
                lock(s).dev.odp_wake();
            }
        }
        Ok(Vec::new())
    }
}

impl Model {
    /// UPDATE_ODP of an implicit MR, whose table grows with the pages mapped: the update is
    /// charged its entries against the page-list budget before it runs, and what it did not
    /// add (or what it removed) is given back after.
    fn update_implicit(&mut self, key: u32, first: u64, entries: &[u64]) -> Result<(), Status> {
        let before = self.any().dev.odp_entries(key).ok_or(Status::NotFound)?;
        let charge = list_bytes(entries.len());
        self.common.lists().charge(charge)?;
        let r = self.any().dev.odp_update(key, first, entries).map_err(verr);
        let after = self.any().dev.odp_entries(key).unwrap_or(before);
        let grown = list_bytes(after.saturating_sub(before) as usize);
        self.common.lists().release(charge - grown);
        self.common
            .lists()
            .release(list_bytes(before.saturating_sub(after) as usize));
        r
    }
}

impl Common {
    /// A page an access needs: a PAGE_FAULT event for the driver (merged with one pending
    /// for the same page).
    pub(super) fn push_page_fault(&self, f: PageFault) {
        let write = if f.write { abi::odp::FAULT_WRITE } else { 0 };
        let e = abi::Event {
            kind: abi::event::KIND_PAGE_FAULT,
            // An explicit MR's table has at most MAX_PAGES (2^26) entries, an implicit one's
            // page runs to 2^52: the bits above 32 go in `event`.
            event: write | ((f.page >> 32) as u32) << abi::odp::FAULT_PAGE_HI_SHIFT,
            object: f.key,
            reserved: f.page as u32,
        };
        self.push(e);
    }
}
