//! Process-wide connection limits, shared by every shard. An ingest
//! connection takes a [`Slot`] of an atomic count at accept and gives it back
//! when it closes; past the limit, it is refused. A subscribe connection
//! takes a [`SubscriberSlot`] of a [`SubscriberSlots`] table, which can also
//! take a slot over from the oldest connection that has not finished its
//! request line (see there).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::config::Config;

/// The process-wide limits: ingest connections and subscriber connections.
pub struct Admission {
    pub ingest: Arc<Slots>,
    pub subscribers: Arc<SubscriberSlots>,
}

impl Admission {
    /// Limits of `shards * per-shard` of each kind, as configured.
    pub fn new(config: &Config) -> Admission {
        let shards = config.shard_count();
        Admission {
            ingest: Arc::new(Slots::new(shards * config.connections_per_shard_max)),
            subscribers: Arc::new(SubscriberSlots::new(shards * config.subscribers_per_shard_max)),
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

/// How many times an admission looks for a slot again after losing a race
/// (a compare-and-swap another shard's admission, request line or close got
/// to first) before it refuses the newcomer. Each lost race is another
/// connection's progress, so this bounds the work under a storm of
/// simultaneous accepts, not the fairness of a quiet moment.
const ADMIT_ATTEMPTS_MAX: usize = 8;

/// One subscriber slot's word: bits 0-1 its state, bit 2 whether a
/// connection shed from it is still closing, bits 3.. the admission sequence
/// of the connection that holds it (0 when free).
const STATE_MASK: u64 = 0b11;
const FREE: u64 = 0;
/// Held by a connection that has not finished its request line.
const PENDING: u64 = 1;
/// Held by a subscriber or group member (its request line came).
const ACTIVE: u64 = 2;
const SHED_CLOSING: u64 = 0b100;
const SEQUENCE_SHIFT: u32 = 3;

/// The process-wide subscriber slots: `shards * --subscribers-per-shard-max`
/// atomic words (8 bytes each), one per admitted subscribe connection,
/// counted from accept.
///
/// An idle-connection attack fills every slot with connections that never
/// finish their `SUB`/`GROUP` line. So when no slot is free, a newcomer takes
/// over the slot of the oldest connection still without a request (oldest by
/// a process-wide admission sequence, so wherever the kernel placed either
/// connection), and that connection is shed: its shard's sweeper (or the
/// accepting shard at once, when it is local) sees [`SubscriberSlot::is_taken_over`]
/// and closes it with `ERR shed`. Only when every slot holds a subscriber is
/// the newcomer refused. Real clients send their request line in their first
/// write, so a newcomer sheds one of them only if the slots were all taken
/// by connections younger than one round trip.
///
/// A slot taken over keeps a mark until the shed connection has closed, and
/// a marked slot is not taken over again: each slot holds at most one
/// connection and one being shed, both without a subscription's buffers (a
/// shed one never sent its request), which the memory formula's
/// per-subscriber term covers many times over; the fd budget counts two
/// descriptors per slot.
pub struct SubscriberSlots {
    words: Box<[AtomicU64]>,
    /// The next admission's sequence (from 1: 0 marks a free word).
    next_sequence: AtomicU64,
}

/// What a subscribe connection got at accept.
pub enum Admit {
    /// A free slot.
    Free(SubscriberSlot),
    /// The slot of the oldest connection that had not sent its request
    /// line; that connection is being shed.
    TakenOver(SubscriberSlot),
    /// Every slot holds a subscriber (or a connection whose slot was just
    /// taken over from another one that has not closed yet).
    Full,
}

impl SubscriberSlots {
    pub fn new(max: usize) -> SubscriberSlots {
        SubscriberSlots { words: (0..max).map(|_| AtomicU64::new(FREE)).collect(), next_sequence: AtomicU64::new(1) }
    }

    pub fn max(&self) -> usize {
        self.words.len()
    }

    /// Admits a new connection: into a free slot, else into the slot of the
    /// oldest connection that has not sent its request line, else not. A
    /// scan of the table (about a nanosecond per slot), on accept only.
    pub fn try_admit(self: &Arc<Self>) -> Admit {
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        debug_assert!(sequence < 1 << (64 - SEQUENCE_SHIFT), "admission sequence overflow");
        for _ in 0..ADMIT_ATTEMPTS_MAX {
            let Some((index, word)) = self.candidate() else { return Admit::Full };
            let taking_over = word & STATE_MASK == PENDING;
            let shed_mark = if taking_over { SHED_CLOSING } else { word & SHED_CLOSING };
            let claimed = (sequence << SEQUENCE_SHIFT) | shed_mark | PENDING;
            if self.words[index].compare_exchange(word, claimed, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                let slot = SubscriberSlot { slots: self.clone(), index, sequence };
                return if taking_over { Admit::TakenOver(slot) } else { Admit::Free(slot) };
            }
        }
        Admit::Full
    }

    /// A free slot, else the slot of the oldest pending connection whose
    /// slot has no shed connection still closing; with its word as read.
    fn candidate(&self) -> Option<(usize, u64)> {
        let mut oldest: Option<(usize, u64)> = None;
        for (index, word) in self.words.iter().enumerate() {
            let word = word.load(Ordering::Acquire);
            if word & STATE_MASK == FREE {
                return Some((index, word));
            }
            let sheddable = word & STATE_MASK == PENDING && word & SHED_CLOSING == 0;
            if sheddable && oldest.is_none_or(|(_, older)| word >> SEQUENCE_SHIFT < older >> SEQUENCE_SHIFT) {
                oldest = Some((index, word));
            }
        }
        oldest
    }

    /// Slots held (pending or active) now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.words.iter().filter(|word| word.load(Ordering::Acquire) & STATE_MASK != FREE).count()
    }
}

/// A subscribe connection's slot; dropping it frees the slot (or, if the
/// slot was taken over, lets it be taken over again).
pub struct SubscriberSlot {
    slots: Arc<SubscriberSlots>,
    index: usize,
    sequence: u64,
}

impl SubscriberSlot {
    /// The connection sent its request line: from now on it is never shed.
    /// Returns `false` if a newcomer took its slot over first (it is being
    /// shed and must close).
    pub fn activate(&self) -> bool {
        let word = &self.slots.words[self.index];
        let activated = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            self.holds(current).then_some((current & !STATE_MASK) | ACTIVE)
        });
        activated.is_ok()
    }

    /// A newcomer took this connection's slot over: it is being shed.
    pub fn is_taken_over(&self) -> bool {
        !self.holds(self.slots.words[self.index].load(Ordering::Acquire))
    }

    fn holds(&self, word: u64) -> bool {
        word >> SEQUENCE_SHIFT == self.sequence
    }
}

impl Drop for SubscriberSlot {
    fn drop(&mut self) {
        let word = &self.slots.words[self.index];
        let released = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |current| {
            // The holder frees the slot (keeping the mark of a shed
            // connection still closing); a shed connection clears its mark.
            Some(if self.holds(current) { current & SHED_CLOSING } else { current & !SHED_CLOSING })
        });
        debug_assert!(
            released.is_ok_and(|previous| self.holds(previous) || previous & SHED_CLOSING != 0),
            "a shed subscriber slot closed without its mark"
        );
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
    fn pending(admit: Admit) -> SubscriberSlot {
        match admit {
            Admit::Free(slot) => slot,
            Admit::TakenOver(_) => panic!("took a slot over while one was free"),
            Admit::Full => panic!("refused while a slot was free"),
        }
    }

    fn taken_over(admit: Admit) -> SubscriberSlot {
        match admit {
            Admit::TakenOver(slot) => slot,
            Admit::Free(_) => panic!("found a free slot in a full table"),
            Admit::Full => panic!("refused while a pending connection held a slot"),
        }
    }

    /// Free slots go first; then a newcomer takes over the oldest pending
    /// connection's slot, never a subscriber's; with every slot held by
    /// subscribers it is refused.
    #[test]
    fn newcomers_take_over_the_oldest_pending_slot_only() {
        let slots = Arc::new(SubscriberSlots::new(3));
        let subscriber = pending(slots.try_admit());
        assert!(subscriber.activate());
        let older = pending(slots.try_admit());
        let younger = pending(slots.try_admit());
        let newcomer = taken_over(slots.try_admit());
        assert!(older.is_taken_over() && !older.activate(), "the oldest pending one is shed");
        assert!(!younger.is_taken_over() && !subscriber.is_taken_over());
        assert!(younger.activate() && newcomer.activate());
        assert!(matches!(slots.try_admit(), Admit::Full), "every slot holds a subscriber");
        assert!(!younger.is_taken_over() && !newcomer.is_taken_over() && !subscriber.is_taken_over());
        drop(older);
        assert_eq!(slots.held(), 3);
        drop((subscriber, younger, newcomer));
        assert_eq!(slots.held(), 0);
        assert!(slots.words.iter().all(|word| word.load(Ordering::Acquire) == FREE));
    }

    /// A slot taken over is not taken over again until the connection shed
    /// from it has closed, so a slot never holds more than two connections;
    /// freed meanwhile, it still admits a newcomer.
    #[test]
    fn a_slot_holds_at_most_one_connection_being_shed() {
        let slots = Arc::new(SubscriberSlots::new(1));
        let first = pending(slots.try_admit());
        let second = taken_over(slots.try_admit());
        assert!(matches!(slots.try_admit(), Admit::Full), "the shed one has not closed yet");
        drop(second);
        let third = pending(slots.try_admit());
        assert!(matches!(slots.try_admit(), Admit::Full), "still one closing");
        drop(first);
        let fourth = taken_over(slots.try_admit());
        assert!(third.is_taken_over() && !fourth.is_taken_over());
        drop((third, fourth));
        assert_eq!(slots.words[0].load(Ordering::Acquire), FREE);
    }

    /// From several threads at once: never more holders than slots, each
    /// slot held by one connection, and every slot free once all are dropped.
    #[test]
    fn subscriber_slots_hold_the_limit_across_threads() {
        let slots = Arc::new(SubscriberSlots::new(8));
        let admitted: Vec<Vec<SubscriberSlot>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|worker| {
                    let slots = &slots;
                    scope.spawn(move || {
                        let mut kept = Vec::new();
                        for round in 0..200 {
                            let slot = match slots.try_admit() {
                                Admit::Free(slot) | Admit::TakenOver(slot) => slot,
                                Admit::Full => continue,
                            };
                            if (round + worker) % 3 == 0 {
                                let _ = slot.activate();
                            }
                            if round % 5 == 0 {
                                drop(slot);
                            } else {
                                kept.push(slot);
                            }
                        }
                        kept
                    })
                })
                .collect();
            workers.into_iter().map(|worker| worker.join().unwrap()).collect()
        });
        let holders: Vec<usize> =
            admitted.iter().flatten().filter(|slot| !slot.is_taken_over()).map(|slot| slot.index).collect();
        let mut distinct = holders.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), holders.len(), "one holder per slot");
        assert_eq!(holders.len(), slots.held());
        assert!(holders.len() <= 8);
        drop(admitted);
        assert!(slots.words.iter().all(|word| word.load(Ordering::Acquire) == FREE));
    }
}
