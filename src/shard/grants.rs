//! The owner's side of credit grants: which grants leave now, and which wait
//! to leave together.
//!
//! Every applied batch turns into a [`CreditGrant`] for its source. Sending
//! each one in its own frame cost a mesh frame per batch, and a frame to a
//! parked shard wakes it: on a 2-core VM a cross-CPU wake-up costs tens of
//! microseconds of CPU, more than the events of a small batch. A source with
//! most of its window left has no use for its credits yet, so the owner
//! holds them here and merges consecutive grants of a source into one
//! ([`CreditGrant::merge`]). It sends a source's held grants:
//!
//! * when a batch asked for its grant ([`DataBatch::grant_now`]: the source
//!   is below half of its window, or a `#SYNC` or a drain waits), so a
//!   source that runs low never waits on grants held here;
//! * when [`GRANT_BATCHES_HELD_MAX`] batches or a quarter of the credit
//!   window are held, so the source gets its credits back in steady steps;
//! * with disk storage, at the end of every commit round
//!   ([`PendingGrants::take_all`]): a round already gathers many batches,
//!   and throughput there is bound by how fast credits return.
//!
//! Holding grants delays nothing a producer can see: events are stored and
//! visible once applied (memory) or committed (disk); only the source's
//! credits come back later, and the source never needs them before it has
//! asked. Memory stays within the same bound: held grants are credits still
//! spent, counted in the window.
//!
//! [`DataBatch::grant_now`]: crate::routing::DataBatch::grant_now

use std::cell::RefCell;

use crate::config::GRANT_BATCHES_HELD_MAX;
use crate::routing::CreditGrant;

/// Grants held per source, each merged into one.
pub struct PendingGrants {
    held: RefCell<Vec<Option<CreditGrant>>>,
    /// Credit bytes held for one source before they leave.
    bytes_max: usize,
}

impl PendingGrants {
    /// For `shard_count` sources whose windows are `credit_window_bytes`.
    pub fn new(shard_count: usize, credit_window_bytes: usize) -> PendingGrants {
        PendingGrants {
            held: RefCell::new((0..shard_count).map(|_| None).collect()),
            bytes_max: credit_window_bytes / 4,
        }
    }

    /// Adds `source`'s next grant; returns the merged grant if it must leave
    /// now (see the module doc).
    pub fn add(&self, source: u16, grant: CreditGrant) -> Option<CreditGrant> {
        let merged = self.merge(source, grant);
        let due = merged.grant_now
            || merged.batch_count as usize >= GRANT_BATCHES_HELD_MAX
            || merged.credit_bytes >= self.bytes_max;
        drop(merged);
        if due { self.held.borrow_mut()[usize::from(source)].take() } else { None }
    }

    /// Merges `source`'s next grant into what it holds and keeps it; returns
    /// a view of the result (for `add`'s decision).
    fn merge(&self, source: u16, grant: CreditGrant) -> std::cell::RefMut<'_, CreditGrant> {
        let mut held = self.held.borrow_mut();
        let slot = &mut held[usize::from(source)];
        match slot {
            Some(merged) => merged.merge(grant),
            None => *slot = Some(grant),
        }
        std::cell::RefMut::map(held, |held| held[usize::from(source)].as_mut().expect("just stored"))
    }

    /// Merges without sending (a commit round releases many; the round's end
    /// takes them all).
    pub fn hold(&self, source: u16, grant: CreditGrant) {
        drop(self.merge(source, grant));
    }

    /// Takes every held grant, one merged grant per source.
    pub fn take_all(&self) -> Vec<(u16, CreditGrant)> {
        let mut held = self.held.borrow_mut();
        held.iter_mut().enumerate().filter_map(|(source, slot)| Some((source as u16, slot.take()?))).collect()
    }

    /// Batches whose grants are held, over all sources (a gauge).
    pub fn held_batches(&self) -> usize {
        self.held.borrow().iter().flatten().map(|grant| grant.batch_count as usize).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(sequence: u64, credit_bytes: usize, grant_now: bool) -> CreditGrant {
        CreditGrant {
            sequence,
            batch_count: 1,
            credit_bytes,
            recycled: vec![0; 4],
            more_recycled: Vec::new(),
            sync: false,
            grant_now,
            offset_asks: None,
        }
    }

    /// Grants of one source are held and merged in sequence until one asks
    /// to leave; then every held one leaves with it, as one grant.
    #[test]
    fn held_grants_leave_with_the_first_that_asks() {
        let pending = PendingGrants::new(2, 1 << 20);
        assert!(pending.add(1, grant(1, 10, false)).is_none());
        assert!(pending.add(1, grant(2, 20, false)).is_none());
        assert!(pending.add(0, grant(1, 5, false)).is_none(), "sources are held apart");
        let merged = pending.add(1, grant(3, 30, true)).expect("asked to leave");
        assert_eq!((merged.sequence, merged.batch_count, merged.credit_bytes), (3, 3, 60));
        assert_eq!(merged.more_recycled.len(), 2, "every batch's buffer comes back");
        assert_eq!(pending.held_batches(), 1, "source 0's grant is still held");
        let rest = pending.take_all();
        assert_eq!(rest.len(), 1);
        assert_eq!((rest[0].0, rest[0].1.sequence, rest[0].1.batch_count), (0, 1, 1));
        assert_eq!(pending.held_batches(), 0);
    }

    /// Nothing is held past GRANT_BATCHES_HELD_MAX batches or a quarter of
    /// the window, whether or not a batch asked.
    #[test]
    fn holding_is_bounded() {
        let pending = PendingGrants::new(1, 4000);
        let mut sent = Vec::new();
        for sequence in 1..=(3 * GRANT_BATCHES_HELD_MAX as u64) {
            if let Some(grant) = pending.add(0, grant(sequence, 1, false)) {
                sent.push(grant.batch_count as usize);
            }
            assert!(pending.held_batches() < GRANT_BATCHES_HELD_MAX);
        }
        assert_eq!(sent, [GRANT_BATCHES_HELD_MAX; 3]);
        let big = pending.add(0, grant(3 * GRANT_BATCHES_HELD_MAX as u64 + 1, 1000, false));
        assert!(big.is_some(), "a quarter of the window leaves at once");
    }

    /// Grants must merge in sequence: a gap is a bug.
    #[test]
    #[should_panic(expected = "grants merge in sequence")]
    fn merging_out_of_sequence_is_a_bug() {
        let pending = PendingGrants::new(1, 1 << 20);
        pending.hold(0, grant(1, 1, false));
        pending.hold(0, grant(3, 1, false));
    }
}
