//! The XRC commands (caps XRC, docs/virtio-rdma.md §5.12): XRC domains and XRC SRQs. XRC INI
//! and TGT QPs are CREATE_QP types (`model.rs`); the engine's `rxe_core::xrc` does the rest.

use super::*;

impl Model {
    /// op::ALLOC_XRCD.
    pub(super) fn alloc_xrcd(&mut self) -> CmdResult {
        let x = self.any().dev.alloc_xrcd().map_err(verr)?;
        body(abi::Handle {
            handle: x,
            reserved: 0,
        })
    }

    /// op::DEALLOC_XRCD.
    pub(super) fn dealloc_xrcd(&mut self, b: &[u8]) -> CmdResult {
        let c: abi::Handle = cmd(b)?;
        self.any().dev.dealloc_xrcd(c.handle).map_err(verr)?;
        Ok(Vec::new())
    }

    /// op::CREATE_XRC_SRQ: CREATE_SRQ's ring and limits, in a domain and with a CQ.
    pub(super) fn create_xrc_srq(
        &mut self,
        mem: &GuestMemoryMmap,
        c: abi::CmdCreateXrcSrq,
    ) -> CmdResult {
        self.create_srq_in(mem, c.srq, Some((c.xrcdn, c.cqn)))
    }
}
