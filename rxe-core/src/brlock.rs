//! A reader-writer lock with one reader lock per shard (a "big-reader" lock): readers of
//! different shards never write the same cache line, so a table every packet reads (the keys,
//! on every data packet) costs each shard an uncontended lock of its own; a writer takes
//! every shard's lock, in index order.
//!
//! What a shard reads through it (the device's `Objects`) changes through verbs and a few
//! work requests (fast registration, invalidation, window binding), all rare beside the
//! packets that read it.

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One shard's lock, alone on its cache lines (two: adjacent-line prefetch pairs them).
#[repr(align(128))]
struct Slot(RwLock<()>);

pub(crate) struct BrLock<T> {
    slots: Box<[Slot]>,
    data: UnsafeCell<T>,
}

// SAFETY: `data` is reached only through `BrRead` (some shard's lock held for reading, so
// no writer holds every lock) or `BrWrite` (every lock held for writing, so no reader and no
// other writer): the rules of `RwLock<T>`, which is `Sync` for `T: Send + Sync`.
unsafe impl<T: Send + Sync> Sync for BrLock<T> {}

impl<T> BrLock<T> {
    pub fn new(shards: usize, data: T) -> Self {
        BrLock {
            slots: (0..shards.max(1)).map(|_| Slot(RwLock::new(()))).collect(),
            data: UnsafeCell::new(data),
        }
    }

    /// Reads through shard `shard`'s lock (any index: it is taken modulo the shards).
    pub fn read(&self, shard: usize) -> BrRead<'_, T> {
        let n = self.slots.len();
        let slot = &self.slots[if shard < n { shard } else { shard % n }];
        let guard = slot.0.read().unwrap_or_else(|e| e.into_inner());
        BrRead {
            _guard: guard,
            // SAFETY: a read lock is held until the `BrRead` goes; a writer needs it too.
            data: unsafe { &*self.data.get() },
        }
    }

    /// Writes, holding every shard's lock.
    pub fn write(&self) -> BrWrite<'_, T> {
        let guards = self
            .slots
            .iter()
            .map(|s| s.0.write().unwrap_or_else(|e| e.into_inner()))
            .collect();
        BrWrite {
            _guards: guards,
            // SAFETY: every lock is held for writing until the `BrWrite` goes: no reader
            // and no other writer can reach the data meanwhile.
            data: unsafe { &mut *self.data.get() },
        }
    }
}

pub(crate) struct BrRead<'a, T> {
    _guard: RwLockReadGuard<'a, ()>,
    data: &'a T,
}

impl<T> Deref for BrRead<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.data
    }
}

pub(crate) struct BrWrite<'a, T> {
    _guards: Vec<RwLockWriteGuard<'a, ()>>,
    data: &'a mut T,
}

impl<T> Deref for BrWrite<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.data
    }
}

impl<T> DerefMut for BrWrite<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.data
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_exclude_the_readers_of_every_shard() {
        // Two counters a writer keeps equal: a reader that ever sees them differ read
        // while a write was half done.
        let l = BrLock::new(3, (0u64, 0u64));
        std::thread::scope(|s| {
            for shard in 0..3 {
                let l = &l;
                s.spawn(move || {
                    for _ in 0..20_000 {
                        let g = l.read(shard);
                        assert_eq!(g.0, g.1, "shard {shard} saw a write half done");
                    }
                });
            }
            let l = &l;
            s.spawn(move || {
                for _ in 0..20_000 {
                    let mut g = l.write();
                    g.0 += 1;
                    std::hint::black_box(&mut *g);
                    g.1 += 1;
                }
            });
        });
        assert_eq!(*l.read(7), (20_000, 20_000));
    }
}
