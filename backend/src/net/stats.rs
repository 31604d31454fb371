//! The guest's virtio-net counters (the counters socket's `"net"`), kept by the device
//! ([`crate::net::vhu_net`]) and its packet socket ([`crate::net::net_port`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::net::net_policy::Refusal;

/// The device's counters (the counters socket's `"net"`).
#[derive(Debug, Default)]
pub struct NetStats {
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    /// Frames held because the guest had no receive buffer (delivered once it posts some).
    pub rx_no_buffer: AtomicU64,
    /// Frames dropped: longer than [`crate::net::net_port::MAX_FRAME`], a segmentation offload the guest did not
    /// accept, or too large for every buffer the guest has.
    pub rx_dropped: AtomicU64,
    /// Checksums finished in software for a guest without GUEST_CSUM.
    pub rx_csum_done: AtomicU64,
    pub rx_errors: AtomicU64,
    /// Frames that came while the guest had no receive queue running (dropped, as by a NIC
    /// whose driver is down).
    pub rx_no_queue: AtomicU64,
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Transmit buffers refused: shorter than a header, longer than [`crate::net::net_port::MAX_FRAME`], or
    /// unreadable. (Frames the policy refuses are `tx_refused`.)
    pub tx_bad: AtomicU64,
    /// Frames the interface refused or had no room for.
    pub tx_dropped: AtomicU64,
    /// Receive or transmit buffers outside guest memory.
    pub faults: AtomicU64,
    /// The MTU the frontend set with NET_SET_MTU (0: none; [`crate::net::vhost_proxy`]).
    pub mtu: Arc<AtomicU64>,
    /// Frames the guest transmitted that its policy refused, per [`Refusal`] (in its order).
    pub tx_refused: [AtomicU64; Refusal::ALL.len()],
    /// Frames from the interface for another MAC (the kernel filter keeps them out; this
    /// counts what got past it).
    pub rx_not_for_guest: AtomicU64,
    /// The addresses of the guest's GIDs the daemon holds ([`crate::net::net_port`]).
    pub addrs: AtomicU64,
}

impl NetStats {
    /// The members of a JSON object (no braces).
    pub fn render(&self) -> String {
        let f = [
            ("rx_frames", &self.rx_frames),
            ("rx_bytes", &self.rx_bytes),
            ("rx_no_buffer", &self.rx_no_buffer),
            ("rx_dropped", &self.rx_dropped),
            ("rx_csum_done", &self.rx_csum_done),
            ("rx_errors", &self.rx_errors),
            ("rx_no_queue", &self.rx_no_queue),
            ("tx_frames", &self.tx_frames),
            ("tx_bytes", &self.tx_bytes),
            ("tx_bad", &self.tx_bad),
            ("tx_dropped", &self.tx_dropped),
            ("faults", &self.faults),
            ("mtu", &*self.mtu),
            ("rx_not_for_guest", &self.rx_not_for_guest),
            ("addrs", &self.addrs),
        ];
        let refused = Refusal::ALL
            .iter()
            .map(|r| (r.counter(), &self.tx_refused[r.index()]));
        f.into_iter()
            .chain(refused)
            .map(|(k, v)| format!("\"{k}\":{}", v.load(Ordering::Relaxed)))
            .collect::<Vec<_>>()
            .join(",")
    }
}
