//! The QP numbers a device has live, for the receive path's cheap checks: a packet for no
//! live QP is dropped before any costly work on it (the IPv4 ID solve of the udp transport's
//! ICRC check, `crate::transport::socket`). The device model sets and clears a number as the
//! guest creates and destroys QPs; the receive path, on the worker or an I/O or shard
//! thread, reads it without a lock.

use std::sync::atomic::{AtomicU64, Ordering};

/// QP 1 (the GSI QP, which the guest's kernel creates but whose packets also come before it
/// does) and the multicast QPN are always taken.
const ALWAYS: [u32; 2] = [1, 0xff_ffff];

/// A bitmap over the QP numbers below `span`.
pub struct LiveQpns {
    bits: Box<[AtomicU64]>,
}

impl LiveQpns {
    /// A set for numbers below `span` (`FIRST_QPN + 2 × max_qp`: the engine hands out no
    /// other), all absent.
    pub fn new(span: u32) -> Self {
        LiveQpns {
            bits: (0..span.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, qpn: u32) -> Option<(&AtomicU64, u64)> {
        let w = self.bits.get((qpn / 64) as usize)?;
        Some((w, 1 << (qpn % 64)))
    }

    /// QP `qpn` was created. A number beyond the span is not recorded (none is handed out).
    pub fn insert(&self, qpn: u32) {
        if let Some((w, b)) = self.slot(qpn) {
            w.fetch_or(b, Ordering::Relaxed);
        }
    }

    /// QP `qpn` was destroyed.
    pub fn remove(&self, qpn: u32) {
        if let Some((w, b)) = self.slot(qpn) {
            w.fetch_and(!b, Ordering::Relaxed);
        }
    }

    /// Every QP is gone (a device reset, a new frontend connection).
    pub fn clear(&self) {
        for w in self.bits.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    /// Whether a packet for `qpn` may be for a QP of this device.
    pub fn may_receive(&self, qpn: u32) -> bool {
        ALWAYS.contains(&qpn)
            || self
                .slot(qpn)
                .is_some_and(|(w, b)| w.load(Ordering::Relaxed) & b != 0)
    }
}

impl std::fmt::Debug for LiveQpns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n: u32 = self
            .bits
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum();
        write!(f, "LiveQpns({n} of {})", self.bits.len() * 64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_come_and_go() {
        let s = LiveQpns::new(0x11 + 2 * 64);
        assert!(
            s.may_receive(1) && s.may_receive(0xff_ffff),
            "QP1 and multicast"
        );
        assert!(!s.may_receive(0x11) && !s.may_receive(0x12));
        s.insert(0x11);
        s.insert(0x90);
        assert!(s.may_receive(0x11) && s.may_receive(0x90) && !s.may_receive(0x12));
        s.remove(0x11);
        assert!(!s.may_receive(0x11) && s.may_receive(0x90));
        s.clear();
        assert!(!s.may_receive(0x90));
        // Beyond the span: never recorded, never taken (but QP1 and multicast are).
        s.insert(0x10_0000);
        assert!(!s.may_receive(0x10_0000) && !s.may_receive(0xff_fffe));
        assert_eq!(format!("{s:?}"), "LiveQpns(0 of 192)");
    }
}
