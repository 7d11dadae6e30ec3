//! Idempotent producers: producer ids (InitProducerId) and the
//! per-partition (producer id, epoch, sequence) check that makes a retried
//! batch stored once.
//!
//! An idempotent Kafka producer numbers the records it sends to each
//! partition (a batch carries its first sequence and its record count) and
//! resends a batch, unchanged, when it does not learn the outcome. Before a
//! batch is routed, [`ProducerTable::check`] compares it with what the
//! partition took last from that producer, as Kafka's broker does:
//!
//! - the next sequence: taken (and reserved at once, so a retry racing the
//!   original on another connection is a duplicate, not a second copy);
//! - one of the last [`RECENT_BATCHES`] batches: a duplicate, answered with
//!   success once the original is answered (a retry never learns of success
//!   before the original is stored, or durable under `acks=all`);
//! - behind those: DUPLICATE_SEQUENCE_NUMBER, which clients treat as stored;
//! - a gap: OUT_OF_ORDER_SEQUENCE_NUMBER; an older epoch:
//!   INVALID_PRODUCER_EPOCH; a newer epoch starts over at sequence 0.
//!
//! A (producer, partition) spate has no state for takes any sequence: that
//! is a new producer, one whose state was evicted, or any producer after a
//! restart.
//!
//! **Where the state lives, and why a lock.** One table for the process,
//! shared by every shard behind a mutex: a producer's retry may come on a
//! new connection, which the kernel may hand to any shard, and the check
//! must see the original. It is taken once per batch (never per record),
//! only for idempotent producers, and held for a hash lookup: an
//! uncontended lock is tens of nanoseconds, where asking a home shard over
//! the mesh would cost a cross-core wake-up per batch.
//!
//! **Bounded.** At most [`crate::config::KAFKA_PRODUCER_STATES_MAX`]
//! (producer, partition) entries; a full table evicts its least recently
//! used eighth. An evicted producer's next batch is taken whatever its
//! sequence, like a restart's.
//!
//! **Restarts.** The table is in memory only. After a restart a retried
//! batch that was stored before the crash but never acknowledged is stored
//! again (at least once across a crash, exactly once within a run); every
//! acknowledged batch is stored once. Producer ids start from the
//! wall clock in microseconds at startup, so a run never hands out an id an
//! earlier run did (unless that run handed out more ids than it ran
//! microseconds).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

use super::codes;

/// Batches per (producer, partition) recognised as duplicates and answered
/// with success: Kafka's own number (a producer has at most five requests
/// in flight per connection when idempotent).
pub const RECENT_BATCHES: usize = 5;

/// One batch a partition took from a producer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct TakenBatch {
    first_sequence: i32,
    last_sequence: i32,
    /// Its Produce has been answered (stored, or durable for `acks=all`).
    answered: bool,
}

/// What a partition knows of one producer.
#[derive(Debug, Clone)]
struct PartitionState {
    epoch: i16,
    last_sequence: i32,
    /// The last batches taken, oldest first (at most [`RECENT_BATCHES`]).
    recent: Vec<TakenBatch>,
    last_used: Instant,
}

/// The check's verdict on one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Route it; call [`ProducerTable::answered`] once its Produce is answered.
    Take,
    /// Already taken: route nothing; answer success once
    /// [`ProducerTable::is_answered`] says the original was.
    Duplicate,
    /// Refuse the partition's data with this Kafka code.
    Refuse(i16),
}

/// A batch as the check sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchIdentity {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_sequence: i32,
    pub record_count: i32,
}

impl BatchIdentity {
    /// The sequence of its last record (sequences wrap to 0 after
    /// `i32::MAX`, as Kafka's do).
    fn last_sequence(&self) -> i32 {
        next_sequence(self.first_sequence, self.record_count.max(1) - 1)
    }
}

fn next_sequence(sequence: i32, increment: i32) -> i32 {
    let next = i64::from(sequence) + i64::from(increment);
    if next > i64::from(i32::MAX) { (next - i64::from(i32::MAX) - 1) as i32 } else { next as i32 }
}

/// The producer ids and per-partition state of the whole process.
pub struct ProducerTable {
    next_producer_id: AtomicI64,
    states: Mutex<HashMap<(i64, u32), PartitionState>>,
    states_max: usize,
}

impl ProducerTable {
    pub fn new(states_max: usize) -> ProducerTable {
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |elapsed| i64::try_from(elapsed.as_micros()).unwrap_or(1));
        ProducerTable {
            next_producer_id: AtomicI64::new(now_us.max(1)),
            states: Mutex::new(HashMap::new()),
            states_max: states_max.max(1),
        }
    }

    /// A new producer id (InitProducerId).
    pub fn allocate(&self) -> i64 {
        self.next_producer_id.fetch_add(1, Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i64, u32), PartitionState>> {
        // A panic while holding the lock leaves a consistent map (every
        // update is one assignment), so a poisoned lock is still usable.
        self.states.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks `batches` (one partition's data, in order) and reserves the
    /// ones taken: all or nothing, so a refused batch leaves the state as
    /// it was. Returns one verdict per batch, or the partition's refusal.
    pub fn check(&self, partition: u32, batches: &[BatchIdentity], verdicts: &mut Vec<Verdict>) -> Result<(), i16> {
        verdicts.clear();
        let mut states = self.lock();
        let now = Instant::now();
        let mut updates: Vec<(i64, PartitionState)> = Vec::new();
        for batch in batches {
            if batch.producer_id < 0 {
                verdicts.push(Verdict::Take);
                continue;
            }
            let current = updates
                .iter()
                .rev()
                .find(|(id, _)| *id == batch.producer_id)
                .map(|(_, state)| state)
                .or_else(|| states.get(&(batch.producer_id, partition)));
            let (verdict, state) = decide(current, batch, now);
            if let Verdict::Refuse(code) = verdict {
                return Err(code);
            }
            if let Some(state) = state {
                updates.push((batch.producer_id, state));
            }
            verdicts.push(verdict);
        }
        if !updates.is_empty() && states.len() + updates.len() > self.states_max {
            evict_oldest(&mut states, self.states_max / 8 + updates.len());
        }
        for (producer_id, state) in updates {
            states.insert((producer_id, partition), state);
        }
        Ok(())
    }

    /// Marks a taken batch's Produce answered, releasing its duplicates.
    pub fn answered(&self, partition: u32, batch: &BatchIdentity) {
        if batch.producer_id < 0 {
            return;
        }
        if let Some(state) = self.lock().get_mut(&(batch.producer_id, partition)) {
            let last_sequence = batch.last_sequence();
            for taken in state.recent.iter_mut() {
                if taken.first_sequence == batch.first_sequence && taken.last_sequence == last_sequence {
                    taken.answered = true;
                }
            }
        }
    }

    /// Whether the original of a duplicate has been answered (or is no
    /// longer tracked, which only happens once later batches were taken).
    pub fn is_answered(&self, partition: u32, batch: &BatchIdentity) -> bool {
        let states = self.lock();
        let Some(state) = states.get(&(batch.producer_id, partition)) else { return true };
        let last_sequence = batch.last_sequence();
        state
            .recent
            .iter()
            .find(|taken| taken.first_sequence == batch.first_sequence && taken.last_sequence == last_sequence)
            .is_none_or(|taken| taken.answered)
    }

    /// (producer, partition) entries held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The verdict on one batch given the partition's state for its producer,
/// and the state to store if it is taken.
fn decide(current: Option<&PartitionState>, batch: &BatchIdentity, now: Instant) -> (Verdict, Option<PartitionState>) {
    let taken =
        TakenBatch { first_sequence: batch.first_sequence, last_sequence: batch.last_sequence(), answered: false };
    let fresh = || PartitionState {
        epoch: batch.epoch,
        last_sequence: taken.last_sequence,
        recent: vec![taken],
        last_used: now,
    };
    let Some(state) = current else {
        return (Verdict::Take, Some(fresh()));
    };
    if batch.epoch < state.epoch {
        return (Verdict::Refuse(codes::INVALID_PRODUCER_EPOCH), None);
    }
    if batch.epoch > state.epoch {
        return if batch.first_sequence == 0 {
            (Verdict::Take, Some(fresh()))
        } else {
            (Verdict::Refuse(codes::OUT_OF_ORDER_SEQUENCE_NUMBER), None)
        };
    }
    let is_recent = |recent: &TakenBatch| {
        recent.first_sequence == taken.first_sequence && recent.last_sequence == taken.last_sequence
    };
    if state.recent.iter().any(is_recent) {
        return (Verdict::Duplicate, None);
    }
    // How far the batch starts past the expected sequence, on the circle
    // of sequences: negative is behind (already taken), positive a gap.
    let expected = next_sequence(state.last_sequence, 1);
    let distance = batch.first_sequence.wrapping_sub(expected);
    if distance == 0 {
        let mut state = state.clone();
        if state.recent.len() == RECENT_BATCHES {
            state.recent.remove(0);
        }
        state.recent.push(taken);
        state.last_sequence = taken.last_sequence;
        state.last_used = now;
        return (Verdict::Take, Some(state));
    }
    let code = if distance < 0 { codes::DUPLICATE_SEQUENCE_NUMBER } else { codes::OUT_OF_ORDER_SEQUENCE_NUMBER };
    (Verdict::Refuse(code), None)
}

/// Removes the `count` least recently used entries (at least one).
fn evict_oldest(states: &mut HashMap<(i64, u32), PartitionState>, count: usize) {
    let mut ages: Vec<Instant> = states.values().map(|state| state.last_used).collect();
    if ages.is_empty() {
        return;
    }
    let index = count.clamp(1, ages.len()) - 1;
    let (_, cutoff, _) = ages.select_nth_unstable(index);
    let cutoff = *cutoff;
    states.retain(|_, state| state.last_used > cutoff);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(producer_id: i64, epoch: i16, first_sequence: i32, record_count: i32) -> BatchIdentity {
        BatchIdentity { producer_id, epoch, first_sequence, record_count }
    }

    fn check_one(table: &ProducerTable, identity: BatchIdentity) -> Result<Verdict, i16> {
        let mut verdicts = Vec::new();
        table.check(3, &[identity], &mut verdicts).map(|()| verdicts[0])
    }

    /// The next sequence is taken, a retry of a recent batch is a
    /// duplicate (held until the original is answered), an older one
    /// DUPLICATE_SEQUENCE_NUMBER, a gap OUT_OF_ORDER_SEQUENCE_NUMBER, an
    /// older epoch INVALID_PRODUCER_EPOCH.
    #[test]
    fn sequences_are_checked_as_kafka_does() {
        let table = ProducerTable::new(100);
        let id = table.allocate();
        assert_eq!(check_one(&table, batch(id, 0, 0, 10)), Ok(Verdict::Take));
        assert_eq!(check_one(&table, batch(id, 0, 0, 10)), Ok(Verdict::Duplicate));
        assert!(!table.is_answered(3, &batch(id, 0, 0, 10)), "the original is still in flight");
        table.answered(3, &batch(id, 0, 0, 10));
        assert!(table.is_answered(3, &batch(id, 0, 0, 10)));
        for first in (10..70).step_by(10) {
            assert_eq!(check_one(&table, batch(id, 0, first, 10)), Ok(Verdict::Take), "{first}");
        }
        assert_eq!(check_one(&table, batch(id, 0, 0, 10)), Err(codes::DUPLICATE_SEQUENCE_NUMBER));
        assert_eq!(check_one(&table, batch(id, 0, 71, 1)), Err(codes::OUT_OF_ORDER_SEQUENCE_NUMBER));
        assert_eq!(check_one(&table, batch(id, 1, 5, 1)), Err(codes::OUT_OF_ORDER_SEQUENCE_NUMBER));
        assert_eq!(check_one(&table, batch(id, 1, 0, 1)), Ok(Verdict::Take), "a new epoch starts at 0");
        assert_eq!(check_one(&table, batch(id, 0, 70, 1)), Err(codes::INVALID_PRODUCER_EPOCH));
        assert_eq!(check_one(&table, batch(-1, -1, -1, 5)), Ok(Verdict::Take), "not idempotent");
    }

    /// Sequences wrap to 0 after i32::MAX, and a batch across the wrap is
    /// followed by sequence numbers from its end.
    #[test]
    fn sequences_wrap() {
        let table = ProducerTable::new(100);
        assert_eq!(check_one(&table, batch(9, 0, i32::MAX - 1, 4)), Ok(Verdict::Take));
        assert_eq!(check_one(&table, batch(9, 0, 2, 1)), Ok(Verdict::Take));
        assert_eq!(check_one(&table, batch(9, 0, 1, 1)), Err(codes::DUPLICATE_SEQUENCE_NUMBER));
    }

    /// A refused batch in a partition's data leaves the state untouched,
    /// even when an earlier batch of the same data would have been taken.
    #[test]
    fn a_refused_partition_reserves_nothing() {
        let table = ProducerTable::new(100);
        let mut verdicts = Vec::new();
        assert_eq!(table.check(1, &[batch(4, 0, 0, 2), batch(4, 0, 5, 1)], &mut verdicts), Err(45));
        assert!(table.is_empty());
        assert_eq!(table.check(1, &[batch(4, 0, 0, 2), batch(4, 0, 2, 1)], &mut verdicts), Ok(()));
        assert_eq!(verdicts, [Verdict::Take, Verdict::Take]);
    }

    /// The table never holds more than its limit: the least recently used
    /// entries go.
    #[test]
    fn the_table_is_bounded() {
        let table = ProducerTable::new(64);
        for producer in 0..1000 {
            assert_eq!(check_one(&table, batch(producer, 0, 0, 1)), Ok(Verdict::Take));
            assert!(table.len() <= 64, "{}", table.len());
        }
        assert_eq!(check_one(&table, batch(999, 0, 0, 1)), Ok(Verdict::Duplicate), "the newest is kept");
    }
}
