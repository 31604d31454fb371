//! Where the device model puts the packets the engine produces ([`PacketSink`]): each
//! transport batches them its own way. [`FnSink`] hands each packet to a closure (tests,
//! fuzzing).

use rxe_core::device::Transmit;

/// Where the device model's pump (`Model::pump`) puts the packets the engine produces: the transport batches them.
pub trait PacketSink {
    /// Room for the next packet (at least 4096 + 64 bytes).
    fn next_buf(&mut self) -> &mut [u8];
    /// The packet the engine just built at the front of `next_buf()` is complete.
    fn push(&mut self, t: &Transmit);
    /// Sends everything pushed so far, or as much as the socket takes.
    fn flush(&mut self);
    /// The sink holds packets the socket did not take (its buffer is full): it takes no more
    /// until it has sent them. the device model's pump (`Model::pump`) stops and the caller waits for writability.
    fn blocked(&self) -> bool {
        false
    }
    /// Whether some packets may leave with payload references ([`crate::memory::payload_ref`]): the
    /// engine's large reads into packets are then noted, not made.
    fn takes_refs(&self) -> bool {
        false
    }
    /// Whether `t` may leave with its payload references (it goes to another device of this
    /// process); if not, the device model's pump (`Model::pump`) makes the reads before [`Self::push`].
    fn wants_refs(&mut self, _t: &Transmit) -> bool {
        false
    }
    /// Whether a packet to `dst` goes to another device of this process, in memory: the
    /// engine may then send an RC packet as a segment of several path MTUs
    /// ([`rxe_core::Device::poll_transmit_segments`]). Asked only while
    /// [`Self::takes_refs`] holds.
    fn in_memory(&self, _dst: &rxe_core::types::Gid) -> bool {
        false
    }
    /// The payload bytes a packet to a device reached in memory may carry (0: one path MTU).
    fn segment(&self) -> usize {
        0
    }
    /// As [`Self::push`], for the packet `roce` (built outside `next_buf()`) whose payload is
    /// partly `refs` (asked for with [`Self::wants_refs`]). A sink that answers yes there
    /// implements this; the default, for sinks that never do, sends `roce` as it is.
    fn push_refs(
        &mut self,
        t: &Transmit,
        roce: &[u8],
        _refs: &[crate::memory::payload_ref::PayloadRef],
    ) {
        let n = t.len.min(roce.len());
        let buf = self.next_buf();
        if n <= buf.len() {
            buf[..n].copy_from_slice(&roce[..n]);
            self.push(t)
        }
    }
}

/// A sink that hands each packet to a closure at once (tests, fuzzing).
pub struct FnSink<F: FnMut(&Transmit, &mut [u8])> {
    pub buf: Vec<u8>,
    pub f: F,
}

impl<F: FnMut(&Transmit, &mut [u8])> FnSink<F> {
    pub fn new(f: F) -> Self {
        FnSink {
            buf: vec![0; 65536],
            f,
        }
    }
}

impl<F: FnMut(&Transmit, &mut [u8])> PacketSink for FnSink<F> {
    fn next_buf(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    fn push(&mut self, t: &Transmit) {
        (self.f)(t, &mut self.buf[..t.len]);
    }
    fn flush(&mut self) {}
}
