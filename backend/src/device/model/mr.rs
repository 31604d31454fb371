//! User memory registration: REG_USER_MR with a page list, and on-demand paging (caps ODP,
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
        self.reg_charged(list_bytes(need as usize), |m| {
            let pages = resolve_page_list(mem, &c.pages, need as u32)?;
            let back = ring::pages_backing(c.pages.page_shift, offset, pages);
            m.any()
                .dev
                .reg_mr(c.pdn, c.iova, c.length, Access(c.access), back)
                .map_err(verr)
        })
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
        self.any()
            .dev
            .odp_update(c.lkey, c.first_page, &entries)
            .map_err(verr)?;
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

impl Common {
    /// A page an access needs: a PAGE_FAULT event for the driver (merged with one pending
    /// for the same page).
    pub(super) fn push_page_fault(&self, f: PageFault) {
        let e = abi::Event {
            kind: abi::event::KIND_PAGE_FAULT,
            event: if f.write { abi::odp::FAULT_WRITE } else { 0 },
            object: f.key,
            // A table has at most MAX_PAGES (2^26) entries.
            reserved: f.page as u32,
        };
        self.push(e);
    }
}
