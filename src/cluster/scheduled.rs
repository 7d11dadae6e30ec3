//! [`Scheduled`]: something due at an instant, for a min-heap
//! (`BinaryHeap<Reverse<Scheduled<T>>>`) of timers or datagrams in flight.

use std::time::Duration;

/// `item`, due at `at`; ordered by `(at, sequence)` alone, so items due at
/// the same instant come out in the order they were scheduled (a caller
/// gives each a fresh sequence number) and the item needs no ordering.
pub(crate) struct Scheduled<T> {
    pub(crate) at: Duration,
    pub(crate) sequence: u64,
    pub(crate) item: T,
}

impl<T> PartialEq for Scheduled<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.sequence) == (other.at, other.sequence)
    }
}

impl<T> Eq for Scheduled<T> {}

impl<T> PartialOrd for Scheduled<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Scheduled<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}
