//! Process-wide connection limits: one atomic count per kind of connection,
//! shared by every shard. A connection takes a [`Slot`] at accept and gives
//! it back when it closes; past the limit, it is refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::Config;

/// The process-wide limits: ingest connections and subscriber connections.
pub struct Admission {
    pub ingest: Arc<Slots>,
    pub subscribers: Arc<Slots>,
}

impl Admission {
    /// Limits of `shards * per-shard` of each kind, as configured.
    pub fn new(config: &Config) -> Admission {
        let shards = config.shard_count();
        Admission {
            ingest: Arc::new(Slots::new(shards * config.connections_per_shard_max)),
            subscribers: Arc::new(Slots::new(shards * config.subscribers_per_shard_max)),
        }
    }
}

/// A bounded count of open connections.
pub struct Slots {
    open: AtomicUsize,
    max: usize,
}

impl Slots {
    pub fn new(max: usize) -> Slots {
        Slots { open: AtomicUsize::new(0), max }
    }

    /// Takes a slot, or `None` when all `max` are taken.
    pub fn try_acquire(self: &Arc<Self>) -> Option<Slot> {
        let taken =
            self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < self.max).then_some(open + 1));
        taken.ok().map(|_| Slot { slots: self.clone() })
    }

    #[cfg(test)]
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// One taken slot; dropping it gives it back.
pub struct Slot {
    slots: Arc<Slots>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let previous = self.slots.open.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(previous > 0, "a slot given back twice");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots never exceed the limit, even from several threads at once, and
    /// come back when dropped.
    #[test]
    fn slots_hold_the_limit_across_threads() {
        let slots = Arc::new(Slots::new(10));
        let taken: Vec<Vec<Slot>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| (0..10).filter_map(|_| slots.try_acquire()).collect::<Vec<_>>()))
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).collect()
        });
        assert_eq!(taken.iter().map(Vec::len).sum::<usize>(), 10);
        assert_eq!(slots.open(), 10);
        assert!(slots.try_acquire().is_none());
        drop(taken);
        assert_eq!(slots.open(), 0);
        assert!(slots.try_acquire().is_some());
    }
}
