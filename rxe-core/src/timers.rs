//! The QPs' retransmission and RNR timers, in one min-heap with lazy deletion, so that finding
//! the next deadline and firing the due ones cost O(log n) per timer that moves, whatever the
//! number of idle QPs.
//!
//! Every QP with a deadline (the earlier of its retransmission and RNR timers) has one live
//! entry, at a time no later than that deadline; the QP remembers it (`Qp::timer_queued`). A
//! deadline that moves later (a retransmission timer restarted by an ACK, the common case)
//! pushes nothing: when the old entry comes up, it is found early and re-queued at the real
//! deadline. A deadline that moves earlier pushes a new entry; the old one becomes stale
//! (its time no longer matches the QP's `timer_queued`) and is dropped when it comes up, as
//! are the entries of timers that were stopped and of QPs that were destroyed. Should stale
//! entries come to outnumber the live ones (RNR waits shorter than the retransmission timer
//! they replace, over and over), the queue is compacted: amortised O(1) per push, and the
//! heap stays within twice the number of QPs with a timer.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::types::Instant;

#[derive(Debug, Default)]
pub(crate) struct TimerQueue {
    heap: BinaryHeap<Reverse<(Instant, u32)>>,
    /// QPs whose `timer_queued` is set (their live entries).
    pub live: usize,
}

impl TimerQueue {
    /// The earliest entry: (time, QPN).
    pub fn peek(&self) -> Option<(Instant, u32)> {
        self.heap.peek().map(|e| e.0)
    }
    pub fn pop(&mut self) {
        self.heap.pop();
    }
    pub fn push(&mut self, at: Instant, qpn: u32) {
        self.heap.push(Reverse((at, qpn)));
    }
    /// Entries held, live and stale.
    pub fn len(&self) -> usize {
        self.heap.len()
    }
    /// Whether stale entries outnumber the live ones enough to be worth a pass.
    pub fn wants_compaction(&self) -> bool {
        self.heap.len() > 2 * self.live + 16
    }
    /// Keeps the entries `live` says are live.
    pub fn compact(&mut self, live: impl Fn(Instant, u32) -> bool) {
        self.heap.retain(|e| live(e.0 .0, e.0 .1));
    }
}

/// The deadline of a QP's timers: the earlier of the retransmission and RNR timers.
pub(crate) fn deadline(q: &crate::qp::Qp) -> Option<Instant> {
    match (q.comp.retrans_at, q.req.rnr_until) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// After anything that may have started or moved `q`'s timers: queues an entry unless the
/// live one is no later than the deadline.
pub(crate) fn note(timers: &mut TimerQueue, q: &mut crate::qp::Qp) {
    if let Some(d) = deadline(q) {
        if q.timer_queued.is_none_or(|t| d < t) {
            timers.push(d, q.qpn.0);
            if q.timer_queued.is_none() {
                timers.live += 1;
            }
            q.timer_queued = Some(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::sim::*;
    use crate::verbs::*;
    use crate::{Device, DeviceConfig, Instant};

    /// What `poll_timeout` must say: the earliest deadline over every QP, found by a walk.
    fn walk(d: &Device) -> Option<Instant> {
        d.qps
            .iter()
            .flatten()
            .filter_map(|q| super::deadline(q))
            .min()
    }

    /// Many QPs, a few busy over a lossy link with RNR NAKs: at every step the queue's
    /// answer is the walk's, and the queue holds no more than a few entries per busy QP.
    #[test]
    fn poll_timeout_is_the_earliest_deadline_of_any_qp() {
        let mut sim = Sim::with_config(
            7,
            DeviceConfig {
                max_qp: 512,
                ..Default::default()
            },
        );
        sim.link[0].loss_ppm = 150_000;
        sim.link[1].loss_ppm = 150_000;
        let o = ConnOpts {
            timeout: 8,
            min_rnr_timer: 3,
            cqe: 64,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 16,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            ..Default::default()
        };
        let eps: Vec<_> = (0..200).map(|_| sim.connect(o)).collect();
        let busy = [3usize, 50, 51, 199];
        let mut rng = Rng::new(1);
        for round in 0..40u64 {
            for &i in &busy {
                let ep = eps[i];
                // Receives on some rounds only: the others meet RNR NAKs.
                if round % 3 != 0 {
                    let _ = sim.dev(1).post_recv(
                        ep[1].qpn,
                        RecvWr {
                            wr_id: round,
                            sg_list: vec![].into(),
                        },
                    );
                }
                let mut wr = SendWr::new(round, SendOp::Send, vec![]);
                wr.flags |= SEND_INLINE;
                wr.inline_data = vec![1; 16];
                let _ = sim.dev(0).post_send(ep[0].qpn, wr);
            }
            for _ in 0..(rng.below(50) + 1) {
                for n in 0..2 {
                    let want = walk(&sim.nodes[n].dev);
                    assert_eq!(sim.nodes[n].dev.poll_timeout(), want, "node {n}");
                    let e = sim.nodes[n].dev.timer_entries();
                    assert!(e <= 2 * busy.len() + 16, "{e} entries");
                }
                if !sim.step() {
                    break;
                }
            }
            for &i in &busy {
                for (n, ep) in eps[i].iter().enumerate() {
                    while sim.dev(n).poll_cq(ep.cq).is_some() {}
                }
            }
        }
    }

    /// Idle QPs cost the queue nothing, and a stream of restarts on one QP adds no entries.
    #[test]
    fn restarting_a_timer_adds_no_entry() {
        let mut sim = Sim::new(3);
        let eps: Vec<_> = (0..100).map(|_| sim.connect(ConnOpts::default())).collect();
        assert_eq!(sim.dev(0).timer_entries(), 0);
        assert_eq!(sim.dev(0).poll_timeout(), None);
        let ep = eps[10];
        for i in 0..1000 {
            sim.dev(1)
                .post_recv(
                    ep[1].qpn,
                    RecvWr {
                        wr_id: i,
                        sg_list: vec![].into(),
                    },
                )
                .unwrap();
            let mut wr = SendWr::new(i, SendOp::Send, vec![]);
            wr.flags |= SEND_INLINE;
            wr.inline_data = vec![1; 8];
            sim.dev(0).post_send(ep[0].qpn, wr).unwrap();
            sim.run_until(1000, |s| s.dev(0).cq_len(ep[0].cq) > 0);
            while sim.dev(0).poll_cq(ep[0].cq).is_some() {}
            assert!(sim.dev(0).timer_entries() <= 1);
        }
    }
}
