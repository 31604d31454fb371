//! The events the device holds while the driver has no event buffer posted: merged per
//! object (an event already pending for the same object is not queued twice), looked up in
//! O(1), and bounded with separate room for completion and asynchronous events, so that CQs
//! notifying without end cannot crowd out a QP_FATAL or a CQ_ERR.

use std::collections::{HashSet, VecDeque};

use crate::abi::{self, event};

/// Events pending at most, all kinds together (the last place is for EVENTS_LOST).
pub const MAX_PENDING_EVENTS: usize = 4096;
/// Of which completion events at most: the rest is kept for asynchronous events.
pub const MAX_PENDING_COMPLETIONS: usize = MAX_PENDING_EVENTS / 2;

type Key = (u32, u32, u32, u32);

/// What makes two events the same: kind, event and object (and for a PAGE_FAULT the page,
/// which the `reserved` word carries; other kinds have it 0).
fn key(e: &abi::Event) -> Key {
    (e.kind, e.event, e.object, e.reserved)
}

/// What [`EventQueue::push`] did with an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// The same event for the same object was pending already.
    Merged,
    /// No room: dropped, and EVENTS_LOST is pending.
    Dropped,
}

#[derive(Debug, Default)]
pub struct EventQueue {
    order: VecDeque<abi::Event>,
    pending: HashSet<Key>,
    completions: usize,
}

impl EventQueue {
    pub fn push(&mut self, e: abi::Event) -> Pushed {
        if self.pending.contains(&key(&e)) {
            return Pushed::Merged;
        }
        let completion = e.kind == event::KIND_COMPLETION;
        let room = if completion {
            self.completions < MAX_PENDING_COMPLETIONS
        } else {
            self.order.len() - self.completions < MAX_PENDING_EVENTS - MAX_PENDING_COMPLETIONS - 1
        };
        if !room {
            let lost = abi::Event {
                kind: event::KIND_EVENTS_LOST,
                ..Default::default()
            };
            if self.pending.insert(key(&lost)) {
                self.order.push_back(lost);
            }
            return Pushed::Dropped;
        }
        self.pending.insert(key(&e));
        self.completions += completion as usize;
        self.order.push_back(e);
        Pushed::Queued
    }

    /// The oldest pending event.
    pub fn pop(&mut self) -> Option<abi::Event> {
        let e = self.order.pop_front()?;
        self.pending.remove(&key(&e));
        self.completions -= (e.kind == event::KIND_COMPLETION) as usize;
        Some(e)
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn clear(&mut self) {
        self.order.clear();
        self.pending.clear();
        self.completions = 0;
    }

    /// The pending events, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &abi::Event> {
        self.order.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u32, event: u32, object: u32) -> abi::Event {
        abi::Event {
            kind,
            event,
            object,
            reserved: 0,
        }
    }

    /// Completions of every CQ there is, then a QP_FATAL: the QP_FATAL is kept.
    #[test]
    fn busy_cqs_do_not_crowd_out_an_async_error() {
        let mut q = EventQueue::default();
        for cqn in 0..2 * MAX_PENDING_EVENTS as u32 {
            q.push(ev(event::KIND_COMPLETION, 0, cqn));
        }
        assert_eq!(
            q.push(ev(event::KIND_ASYNC, event::QP_FATAL, 17)),
            Pushed::Queued
        );
        let all: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert!(all.contains(&ev(event::KIND_ASYNC, event::QP_FATAL, 17)));
        let lost = all
            .iter()
            .filter(|e| e.kind == event::KIND_EVENTS_LOST)
            .count();
        assert_eq!(lost, 1, "the dropped completions are reported, once");
        assert_eq!(all.len(), MAX_PENDING_COMPLETIONS + 2);
    }

    /// The same event for the same object is pending once, until it is delivered.
    #[test]
    fn events_merge_per_object() {
        let mut q = EventQueue::default();
        let f = ev(event::KIND_ASYNC, event::QP_FATAL, 17);
        assert_eq!(q.push(f), Pushed::Queued);
        assert_eq!(q.push(f), Pushed::Merged);
        assert_eq!(
            q.push(ev(event::KIND_ASYNC, event::QP_FATAL, 18)),
            Pushed::Queued
        );
        assert_eq!(q.push(ev(event::KIND_COMPLETION, 0, 17)), Pushed::Queued);
        assert_eq!(q.len(), 3);
        assert_eq!(q.pop(), Some(f));
        assert_eq!(q.push(f), Pushed::Queued, "delivered: a new one is news");
    }

    /// Distinct asynchronous events beyond their room: dropped, reported by one EVENTS_LOST;
    /// completions still have theirs.
    #[test]
    fn async_events_beyond_their_room_end_in_one_events_lost() {
        let mut q = EventQueue::default();
        let room = MAX_PENDING_EVENTS - MAX_PENDING_COMPLETIONS - 1;
        for qpn in 0..room as u32 + 10 {
            q.push(ev(event::KIND_ASYNC, event::QP_FATAL, qpn));
        }
        assert_eq!(q.len(), room + 1);
        assert_eq!(
            q.iter().last().map(|e| e.kind),
            Some(event::KIND_EVENTS_LOST)
        );
        assert_eq!(q.push(ev(event::KIND_COMPLETION, 0, 5)), Pushed::Queued);
        for _ in 0..100 {
            q.pop();
        }
        assert_eq!(
            q.push(ev(event::KIND_ASYNC, event::QP_FATAL, 1 << 20)),
            Pushed::Queued,
            "once the driver took some, events flow again"
        );
    }
}
