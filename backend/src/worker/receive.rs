//! The one receive loop of the worker room: batches from a socket into the engine, at most
//! a given number of datagrams per wake-up (the sockets are level-triggered: what is left
//! wakes the thread again). The device's worker runs it over its transport, a shard's thread
//! over the shard's own socket.

use rxe_core::{Instant, RecvMeta};

use crate::clock::now;
use crate::transport::udp::{UdpTransport, RX_BATCH};
use crate::transport::Transport;

/// A receiver of datagrams in batches: `recv_batch` fills a batch, `packet(i)` hands out
/// its `i`th packet (or `None` for one the transport dropped).
pub trait RxBatch {
    fn recv_batch(&mut self) -> usize;
    fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])>;
}

impl RxBatch for Transport {
    #[inline]
    fn recv_batch(&mut self) -> usize {
        Transport::recv_batch(self)
    }

    #[inline]
    fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])> {
        Transport::packet(self, i)
    }
}

impl RxBatch for UdpTransport {
    #[inline]
    fn recv_batch(&mut self) -> usize {
        UdpTransport::recv_batch(self)
    }

    #[inline]
    fn packet(&mut self, i: usize) -> Option<(RecvMeta, &[u8])> {
        UdpTransport::packet(self, i)
    }
}

/// Receives batches from `t` until `limit` datagrams came or a batch was not full, handing
/// each packet to `f` with the time its batch came; returns how many datagrams came.
#[inline]
pub fn receive_batch<T: RxBatch>(
    t: &mut T,
    limit: usize,
    mut f: impl FnMut(Instant, &RecvMeta, &[u8]),
) -> usize {
    let mut total = 0;
    while total < limit {
        let n = t.recv_batch();
        let at = now();
        for i in 0..n {
            if let Some((meta, bytes)) = t.packet(i) {
                f(at, &meta, bytes);
            }
        }
        total += n;
        if n < RX_BATCH {
            break;
        }
    }
    total
}
