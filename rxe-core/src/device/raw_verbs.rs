//! Raw packet QPs (`QpType::RawPacket`): the engine keeps their state, PD, CQs and receive
//! queue and completes their work; the caller moves the frames (it steers received frames to
//! QPs and sends what [`Device::raw_send`] gathers), since they are not RoCE.

use crate::device::Device;
use crate::mem::*;
use crate::qp::*;
use crate::shared::Drop;
use crate::types::Qpn;
use crate::verbs::*;

/// The largest frame a raw packet QP sends or receives: a 9000-byte payload behind an
/// Ethernet header with one VLAN tag (the FCS is the NIC's).
pub const RAW_MAX_FRAME: usize = 9000 + 14 + 4;
/// The smallest: an Ethernet header.
pub const RAW_MIN_FRAME: usize = 14;

impl Device {
    /// Sends work request `wr` of raw packet QP `qpn`: gathers the frame it describes (its
    /// SGEs, or its inline data) into `frame` and completes it. `Ok(Some(n))`: the frame is
    /// `frame[..n]`, for the caller to deliver; `Ok(None)`: the request completed in error
    /// (LOC_QP_OP_ERR for an operation other than SEND, LOC_LEN_ERR for a frame shorter than
    /// an Ethernet header or longer than [`RAW_MAX_FRAME`] or `frame`, LOC_PROT_ERR for an
    /// SGE its lkey does not cover) and the QP is in ERR. `BadState` before RTS (the request
    /// waits, as on any QP), `Invalid` for a QP that is not a raw packet QP.
    pub fn raw_send(
        &mut self,
        qpn: Qpn,
        wr: &SendWr,
        mem: &dyn Memory,
        frame: &mut [u8],
    ) -> Result<Option<usize>, VerbError> {
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(VerbError::NotFound)?;
        if q.qp_type != QpType::RawPacket {
            return Err(VerbError::Invalid);
        }
        if !matches!(q.state(), QpState::Rts | QpState::Err) {
            return Err(VerbError::BadState);
        }
        if q.sq.len() as u32 >= q.cap.max_send_wr.max(1) {
            return Err(VerbError::NoResources);
        }
        let inline = wr.flags & SEND_INLINE != 0;
        let len = if inline {
            wr.inline_data.len() as u64
        } else {
            sge_total(&wr.sg_list)
        };
        let cap = frame.len().min(RAW_MAX_FRAME) as u64;
        let status = if q.state() == QpState::Err {
            WcStatus::WrFlushErr
        } else if !matches!(wr.op, SendOp::Send) {
            WcStatus::LocQpOpErr
        } else if len < RAW_MIN_FRAME as u64 || len > cap {
            WcStatus::LocLenErr
        } else if inline {
            frame[..len as usize].copy_from_slice(&wr.inline_data);
            WcStatus::Success
        } else {
            let dst = &mut frame[..len as usize];
            match copy_from_sges(&self.res.objs().keys, mem, q.pd, &wr.sg_list, 0, dst) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocProtErr,
            }
        };
        let ok = status == WcStatus::Success;
        let signaled = !ok || q.sq_sig_all || wr.flags & SEND_SIGNALED != 0;
        let wqe = SendWqe::done(wr.wr_id, WcOpcode::Send, status, len as u32, signaled);
        q.sq.push_back(wqe);
        if ok {
            q.counters.tx_packets += 1;
            q.counters.tx_bytes += len;
        } else if status != WcStatus::WrFlushErr {
            q.counters.errors += 1;
            crate::complete::set_error(q, &mut self.res);
        }
        crate::complete::drain(q, &mut self.res);
        Ok(ok.then_some(len as usize))
    }

    /// Delivers `frame` to the next receive of raw packet QP `qpn` (in RTR or RTS): the
    /// receive completes with the frame's length, or with LOC_LEN_ERR when its buffers are
    /// shorter. Why it was dropped otherwise: no receive posted, a QP not ready, not a raw
    /// packet QP.
    pub fn raw_receive(
        &mut self,
        qpn: Qpn,
        frame: &[u8],
        mem: &mut dyn Memory,
    ) -> Result<(), Drop> {
        let q = self
            .qps
            .get_mut(qpn.0 as usize)
            .and_then(|q| q.as_deref_mut())
            .ok_or(Drop::UnknownQp)?;
        if q.qp_type != QpType::RawPacket {
            return Err(Drop::Unexpected);
        }
        let r = crate::resp::raw_recv(q, &mut self.res, mem, frame);
        if r.is_ok() {
            q.counters.rx_packets += 1;
            q.counters.rx_bytes += frame.len() as u64;
        }
        if q.resp.goto_error {
            // The receive CQ overflowed (it is in error): the QP goes to ERR, as a UD QP's.
            q.resp.goto_error = false;
            crate::complete::set_error(q, &mut self.res);
            // (the send queue's flushed WQEs complete)
            crate::complete::drain(q, &mut self.res);
        }
        r
    }
}
