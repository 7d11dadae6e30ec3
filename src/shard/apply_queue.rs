//! The owner's apply queue: batches to apply, from every source (this shard
//! included), in arrival order, FIFO per source.
//!
//! Mesh receivers only enqueue here, so frames that are not data (grants,
//! fetches, replies) never wait behind a slow apply; the shard's applier
//! task drains it. Its size is bounded by the credits every source holds
//! against this shard (`shards * credit_window_bytes`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use crate::routing::DataBatch;
use crate::runtime::notify::Notify;

#[derive(Default)]
pub struct ApplyQueue {
    batches: RefCell<VecDeque<(u16, DataBatch)>>,
    bytes: Cell<usize>,
    notify: Notify,
}

impl ApplyQueue {
    /// Queues a batch from `source` and wakes the applier.
    pub fn push(&self, source: u16, batch: DataBatch) {
        self.bytes.set(self.bytes.get() + batch.bytes.len());
        self.batches.borrow_mut().push_back((source, batch));
        self.notify.notify();
    }

    /// The oldest batch, if any.
    pub fn pop(&self) -> Option<(u16, DataBatch)> {
        let popped = self.batches.borrow_mut().pop_front();
        if let Some((_, batch)) = &popped {
            self.bytes.set(self.bytes.get() - batch.bytes.len());
        }
        popped
    }

    /// Waits until a batch may have been queued.
    pub async fn pushed(&self) {
        self.notify.notified().await
    }

    /// Bytes of batch records waiting.
    pub fn bytes(&self) -> usize {
        self.bytes.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(sequence: u64, size: usize) -> DataBatch {
        DataBatch {
            sequence,
            bytes: vec![0; size],
            event_count: 1,
            markers: Vec::new(),
            sync: false,
            grant_now: false,
            offset_asks: None,
            in_runs: false,
            replicated_bytes: 0,
        }
    }

    /// Batches come out in arrival order and the byte gauge follows them.
    #[test]
    fn fifo_with_a_byte_gauge() {
        let queue = ApplyQueue::default();
        queue.push(1, batch(1, 10));
        queue.push(0, batch(1, 5));
        queue.push(1, batch(2, 7));
        assert_eq!(queue.bytes(), 22);
        let order: Vec<(u16, u64)> =
            std::iter::from_fn(|| queue.pop()).map(|(source, b)| (source, b.sequence)).collect();
        assert_eq!(order, [(1, 1), (0, 1), (1, 2)]);
        assert_eq!(queue.bytes(), 0);
    }
}
