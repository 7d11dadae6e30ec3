//! The source side of the data path: per-destination batches and credits.
//!
//! Every event a shard ingests is encoded into the open batch for its owner
//! shard (the shard itself included: local appends use the same accounting),
//! and costs its record size in credits. An owner grants each source a window
//! of `credit_window_bytes` and `credit_window_batches`; credits come back in
//! a [`CreditGrant`] once the owner has applied a batch. A source without
//! credits for an event's owner must stop (the connection stops reading its
//! socket), so bytes in flight between any two shards never exceed the window.
//!
//! The router is plain data with no I/O, so the accounting is unit-tested
//! without executors.

use crate::protocol::record::{batch_record_size, encode_batch_record};
use crate::shard::frame::{CreditGrant, DataBatch, Marker};

/// Batch buffers kept for reuse per destination beyond the one open batch.
const SPARE_BUFFERS_MAX: usize = 4;

/// One destination (owner shard) as seen by this source.
#[derive(Debug)]
struct Destination {
    batch: Vec<u8>,
    batch_event_count: u32,
    /// Credit bytes this source may still spend on the owner.
    credit_bytes: usize,
    /// Batches this source may still send before a grant returns one.
    batch_slots: usize,
    sequence_sent: u64,
    sequence_applied: u64,
    spare_buffers: Vec<Vec<u8>>,
    /// Markers to send behind the open batch's events.
    markers: Vec<Marker>,
}

/// Why an event cannot be batched now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    pub owner: u16,
    pub credit_bytes_needed: usize,
}

/// Per-destination batches and credit windows of one source shard.
#[derive(Debug)]
pub struct Router {
    destinations: Vec<Destination>,
    batch_bytes: usize,
    credit_window_bytes: usize,
    credit_window_batches: usize,
}

impl Router {
    pub fn new(
        shard_count: usize,
        batch_bytes: usize,
        credit_window_bytes: usize,
        credit_window_batches: usize,
    ) -> Router {
        assert!(shard_count > 0 && batch_bytes > 0 && credit_window_batches > 0);
        let destinations = (0..shard_count)
            .map(|_| Destination {
                batch: Vec::with_capacity(batch_bytes),
                batch_event_count: 0,
                credit_bytes: credit_window_bytes,
                batch_slots: credit_window_batches,
                sequence_sent: 0,
                sequence_applied: 0,
                spare_buffers: Vec::new(),
                markers: Vec::new(),
            })
            .collect();
        Router { destinations, batch_bytes, credit_window_bytes, credit_window_batches }
    }

    /// Encodes an event into its owner's open batch, spending its credits.
    /// `Ok(true)` means the batch reached `batch_bytes` and should be taken.
    #[inline]
    pub fn try_push(&mut self, owner: u16, partition: u32, key: &[u8], payload: &[u8]) -> Result<bool, Blocked> {
        let size = batch_record_size(key, payload);
        let destination = &mut self.destinations[usize::from(owner)];
        if destination.credit_bytes < size {
            return Err(Blocked { owner, credit_bytes_needed: size });
        }
        destination.credit_bytes -= size;
        encode_batch_record(&mut destination.batch, partition, key, payload);
        destination.batch_event_count += 1;
        Ok(destination.batch.len() >= self.batch_bytes)
    }

    /// Whether a record of `size` bytes would push `owner`'s open batch past
    /// its buffer: take the batch first, so buffers never reallocate (and an
    /// in-flight batch holds `batch_bytes`, not twice that).
    #[inline]
    pub fn would_overflow(&self, owner: u16, size: usize) -> bool {
        let batch = &self.destinations[usize::from(owner)].batch;
        !batch.is_empty() && batch.len() + size > batch.capacity()
    }

    /// Whether an event of `size` credit bytes for `owner` fits now.
    pub fn has_credits(&self, owner: u16, size: usize) -> bool {
        self.destinations[usize::from(owner)].credit_bytes >= size
    }

    /// Takes the owner's open batch for sending, if it has events and a batch
    /// slot is free. The credits stay spent until the owner grants them back.
    pub fn take_batch(&mut self, owner: u16) -> Option<DataBatch> {
        let batch_bytes = self.batch_bytes;
        let destination = &mut self.destinations[usize::from(owner)];
        if (destination.batch.is_empty() && destination.markers.is_empty()) || destination.batch_slots == 0 {
            return None;
        }
        destination.batch_slots -= 1;
        destination.sequence_sent += 1;
        let fresh = destination.spare_buffers.pop().unwrap_or_else(|| Vec::with_capacity(batch_bytes));
        let bytes = std::mem::replace(&mut destination.batch, fresh);
        let event_count = std::mem::take(&mut destination.batch_event_count);
        let markers = std::mem::take(&mut destination.markers);
        Some(DataBatch { sequence: destination.sequence_sent, bytes, event_count, markers })
    }

    /// Queues a marker for `owner` behind every event batched for it so far;
    /// it leaves with the next batch taken (which may hold no events).
    pub fn add_marker(&mut self, owner: u16, marker: Marker) {
        self.destinations[usize::from(owner)].markers.push(marker);
    }

    /// Applies a grant from `owner`: credits and a batch slot come back.
    pub fn grant(&mut self, owner: u16, grant: CreditGrant) {
        let destination = &mut self.destinations[usize::from(owner)];
        assert_eq!(grant.sequence, destination.sequence_applied + 1, "grants arrive in order");
        assert!(grant.sequence <= destination.sequence_sent, "grant for an unsent batch");
        destination.sequence_applied = grant.sequence;
        destination.credit_bytes += grant.credit_bytes;
        destination.batch_slots += 1;
        assert!(destination.credit_bytes <= self.credit_window_bytes, "credits returned twice");
        assert!(destination.batch_slots <= self.credit_window_batches);
        if destination.spare_buffers.len() < SPARE_BUFFERS_MAX && grant.recycled.capacity() >= self.batch_bytes {
            let mut buffer = grant.recycled;
            buffer.clear();
            destination.spare_buffers.push(buffer);
        }
    }

    /// Owners with an open, non-empty batch.
    pub fn pending_owners(&self) -> impl Iterator<Item = u16> + '_ {
        self.destinations.iter().enumerate().map(|(owner, _)| owner as u16).filter(|&owner| self.has_pending(owner))
    }

    /// Whether `owner` has an open batch (events or markers) not yet sent.
    pub fn has_pending(&self, owner: u16) -> bool {
        let destination = &self.destinations[usize::from(owner)];
        !destination.batch.is_empty() || !destination.markers.is_empty()
    }

    /// Sequence of the last batch sent to / applied by `owner`.
    pub fn sequences(&self, owner: u16) -> (u64, u64) {
        let destination = &self.destinations[usize::from(owner)];
        (destination.sequence_sent, destination.sequence_applied)
    }

    /// True when nothing is batched or in flight to any owner.
    pub fn is_idle(&self) -> bool {
        self.destinations.iter().all(|destination| {
            destination.batch.is_empty()
                && destination.markers.is_empty()
                && destination.sequence_applied == destination.sequence_sent
        })
    }

    /// Credit bytes spent and not yet returned, over all owners.
    pub fn credits_outstanding_bytes(&self) -> usize {
        self.destinations.iter().map(|destination| self.credit_window_bytes - destination.credit_bytes).sum()
    }

    /// Bytes in open (unsent) batches.
    pub fn batch_buffered_bytes(&self) -> usize {
        self.destinations.iter().map(|destination| destination.batch.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant_for(batch: DataBatch) -> CreditGrant {
        CreditGrant { sequence: batch.sequence, credit_bytes: batch.bytes.len(), recycled: batch.bytes }
    }

    /// A source can never have more than the window in flight: once spent,
    /// pushes are refused until the owner grants the credits back.
    #[test]
    fn credits_bound_bytes_in_flight() {
        let mut router = Router::new(2, 64, 100, 8);
        let size = batch_record_size(b"key", b"0123456789");
        let mut accepted = 0;
        while router.try_push(1, 5, b"key", b"0123456789").is_ok() {
            accepted += 1;
        }
        assert_eq!(accepted, 100 / size);
        assert_eq!(router.try_push(1, 5, b"key", b"0123456789"), Err(Blocked { owner: 1, credit_bytes_needed: size }));
        assert!(router.has_credits(0, size), "other owners are not affected");
        let batch = router.take_batch(1).expect("batch with events");
        assert!(router.try_push(1, 5, b"key", b"0123456789").is_err(), "sending does not return credits");
        router.grant(1, grant_for(batch));
        assert!(router.try_push(1, 5, b"key", b"0123456789").is_ok(), "applying does");
        assert_eq!(router.credits_outstanding_bytes(), size);
    }

    /// Batch slots bound the number of batches in flight, and sequences are
    /// dense so SYNC and drain can wait for "applied == sent".
    #[test]
    fn batch_slots_and_sequences() {
        let mut router = Router::new(1, 16, 10_000, 2);
        let mut in_flight = Vec::new();
        for _ in 0..3 {
            assert_eq!(router.try_push(0, 0, b"k", b"0123456789"), Ok(true));
            if let Some(batch) = router.take_batch(0) {
                in_flight.push(batch);
            }
        }
        assert_eq!(in_flight.len(), 2, "third batch waits for a slot");
        assert_eq!(router.sequences(0), (2, 0));
        assert!(!router.is_idle());
        for batch in in_flight.drain(..) {
            router.grant(0, grant_for(batch));
        }
        let last = router.take_batch(0).expect("slot is back");
        assert_eq!(last.event_count, 1);
        router.grant(0, grant_for(last));
        assert_eq!(router.sequences(0), (3, 3));
        assert!(router.is_idle());
        assert_eq!(router.credits_outstanding_bytes(), 0);
    }
}
