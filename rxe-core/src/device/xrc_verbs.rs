//! The XRC verbs of the device: XRC domains and XRC SRQs (the engine side is `xrc.rs`).

use crate::device::Device;
use crate::shared::{lock, read, SrqXrc, Xrcd};
use crate::verbs::*;

impl Device {
    /// Allocates an XRC domain (at most [`crate::shared::MAX_XRCD`] per device).
    pub fn alloc_xrcd(&mut self) -> Result<u32, VerbError> {
        self.res
            .objs_mut()
            .xrcds
            .insert(Xrcd::default())
            .ok_or(VerbError::NoResources)
    }

    /// Frees an XRC domain; `Busy` while an XRC SRQ or an XRC TGT QP belongs to it.
    pub fn dealloc_xrcd(&mut self, xrcd: u32) -> Result<(), VerbError> {
        let mut o = self.res.objs_mut();
        if o.xrcds.get(xrcd).ok_or(VerbError::NotFound)?.users != 0 {
            return Err(VerbError::Busy);
        }
        o.xrcds.remove(xrcd);
        Ok(())
    }

    /// Creates an XRC SRQ in domain `xrcd`: its receive WQEs are for the XRC TGT QPs of that
    /// domain, its receive completions go to CQ `cqn` (which it holds: the CQ is `Busy` until
    /// the SRQ is destroyed), and R_Keys of requests naming it are checked against `pd`.
    /// Receives are posted with [`Device::post_srq_recv`] as for any SRQ.
    pub fn create_srq_xrc(
        &mut self,
        pd: u32,
        xrcd: u32,
        cqn: u32,
        max_wr: u32,
        max_sge: u32,
        limit: u32,
    ) -> Result<u32, VerbError> {
        // The domain and the CQ first; `create_srq` checks the PD.
        let exists = |d: &Self| {
            d.res.objs().xrcds.get(xrcd).is_some() && read(&d.res.shared.cqs).get(cqn).is_some()
        };
        if !exists(self) {
            return Err(VerbError::NotFound);
        }
        let id = self.create_srq(pd, max_wr, max_sge, limit)?;
        // Lock order of `shared.rs`: `objs`, the CQ table (let go), one CQ, the SRQ table.
        let attached = {
            let shared = self.res.shared.clone();
            let mut o = shared.objs.write();
            let cq = read(&shared.cqs).get(cqn).cloned();
            match (o.xrcds.get_mut(xrcd), cq) {
                (Some(x), Some(cq)) => {
                    x.users += 1;
                    lock(&cq).users += 1;
                    let t = read(&shared.srqs);
                    let s = t.get(id).expect("created above");
                    lock(s).xrc = Some(SrqXrc { xrcd, cqn, cq });
                    true
                }
                _ => false,
            }
        };
        if !attached {
            // The domain or the CQ went away meanwhile (another shard's verb).
            self.destroy_srq(id)?;
            return Err(VerbError::NotFound);
        }
        Ok(id)
    }

    /// The XRC domain of an XRC SRQ (`None` for an SRQ of RC and UD QPs).
    pub fn srq_xrcd(&self, srqn: u32) -> Option<u32> {
        let t = read(&self.res.shared.srqs);
        let x = lock(t.get(srqn)?).xrc.as_ref().map(|x| x.xrcd);
        x
    }
}
