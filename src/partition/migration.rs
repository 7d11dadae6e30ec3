//! Moving a partition between shards without reordering, losing or
//! duplicating an event (DESIGN section 3), as a state machine.
//!
//! [`Migrations`] is one shard's side of every migration it takes part in.
//! It is pure: each step takes the shard's placement table and the time, and
//! appends the [`Effect`]s the shard must carry out (send a frame, hand over
//! a partition, return credits). [`carry_out`] hands each effect, in order,
//! to a [`Carrier`]: the engine's (`shard`) sends on the mesh; `spate
//! simulate`'s ([`crate::balance::sim`]) on a simulated network with random
//! delays, checking on every step that no event is lost, duplicated or
//! reordered.
//!
//! Moving partition p from owner S to thief T:
//!
//! 1. S switches `p -> T` with epoch e+1 in its own table and tells T
//!    ([`Migrations::start`]). Only T hears it from S, and T forwards it to
//!    every other shard: so no shard routes an event of p to T before T
//!    knows p is coming (a batch from X and an update from S travel on
//!    different channels and could otherwise arrive in either order).
//! 2. Every shard X, on the update ([`Migrations::on_placement`]), routes
//!    p's later events to T and sends S a [`Marker`] `(p, e+1)` behind
//!    everything it batched for S so far, on the same FIFO channel.
//! 3. T buffers p's events that arrive before the handoff
//!    ([`Migrations::pending_mut`]) and holds back the credits of the batches
//!    they came in ([`Migrations::settle_grant`]), so the buffer is bounded by
//!    the sources' credit windows. Once one grant of a source is held, its
//!    later grants queue behind it: a source takes grants strictly in order.
//! 4. S applies batches in arrival order. When it has the marker of every
//!    shard ([`Migrations::on_marker`]), it has applied every event routed to
//!    it for p; it hands p to T: log, counters and rates move by ownership,
//!    offsets continue.
//! 5. T installs p, appends the buffered events in arrival order, then
//!    releases the held grants ([`Migrations::on_handoff`]).
//!
//! Subscribers keep their cursors; a fetch for p reaching S after the
//! handoff is answered "moved", one reaching T before it waits there.
//!
//! A batch ([`Migrations::start_batch`]) moves several partitions from S to
//! T at once: the same steps for each, started back to back, so their
//! placement updates, markers and handoffs travel together and a batch costs
//! about the round trips of one move. Consolidation moves partitions this
//! way (`shard::consolidation`): a subscriber then sees one disturbance
//! (fetches answered "moved", a partition still arriving) per batch instead
//! of one per partition. Markers of one source reach S in the order the
//! placements were sent (each channel is FIFO), so the partitions of a batch
//! are handed over in the order they were started.

use std::collections::VecDeque;

use ahash::AHashMap;

use crate::balance::{Direction, Migration};
use crate::partition::{Placement, PlacementTable};

/// Step 2 of the protocol: "every event I routed to you for `partition`
/// before epoch `epoch` is in front of this marker".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marker {
    pub partition: u32,
    pub epoch: u32,
}

/// What a shard must do after a step, in order. `G` is a credit grant.
#[derive(Debug, PartialEq)]
pub enum Effect<G> {
    /// Send shard `to` the placement update `partition -> owner` at `epoch`.
    SendPlacement { to: u16, partition: u32, owner: u16, epoch: u32 },
    /// Queue `marker` behind everything batched for shard `to` (the
    /// partition's old owner, possibly this shard) and send it.
    SendMarker { to: u16, marker: Marker },
    /// Remove `partition` from this shard and hand it to `to` with `epoch`.
    SendHandoff { to: u16, partition: u32, epoch: u32 },
    /// Return credits to `source` (possibly this shard).
    Grant { source: u16, grant: G },
    /// For the balancer: a migration into this shard began.
    Began(Migration),
    /// For the balancer: this shard's part in moving `partition` ended.
    Ended { partition: u32, direction: Direction, at_ms: u64 },
}

/// What carries out a shard's [`Effect`]s: the engine's shard, the
/// simulator's shard. Each method is one effect; [`carry_out`] calls them
/// in the order the state machine decided.
pub trait Carrier<G> {
    /// Sends shard `to` the placement update `partition -> owner` at `epoch`.
    fn send_placement(&mut self, to: u16, partition: u32, owner: u16, epoch: u32);
    /// Queues `marker` behind everything batched for shard `to` and sends it.
    fn send_marker(&mut self, to: u16, marker: Marker);
    /// Hands `partition` over to `to` (at `epoch`), once it may leave.
    fn send_handoff(&mut self, to: u16, partition: u32, epoch: u32);
    /// Returns credits to `source` (possibly this shard).
    fn grant(&mut self, source: u16, grant: G);
    /// For the balancer: a migration of this shard began.
    fn began(&mut self, migration: Migration);
    /// For the balancer: this shard's part in moving `partition` ended.
    fn ended(&mut self, partition: u32, direction: Direction, at_ms: u64);
}

/// Carries out `effects`, in order, emptying the vector (so its capacity is
/// reused for the next step).
pub fn carry_out<G>(effects: &mut Vec<Effect<G>>, carrier: &mut impl Carrier<G>) {
    for effect in effects.drain(..) {
        match effect {
            Effect::SendPlacement { to, partition, owner, epoch } => {
                carrier.send_placement(to, partition, owner, epoch)
            }
            Effect::SendMarker { to, marker } => carrier.send_marker(to, marker),
            Effect::SendHandoff { to, partition, epoch } => carrier.send_handoff(to, partition, epoch),
            Effect::Grant { source, grant } => carrier.grant(source, grant),
            Effect::Began(migration) => carrier.began(migration),
            Effect::Ended { partition, direction, at_ms } => carrier.ended(partition, direction, at_ms),
        }
    }
}

/// The old owner's side of one migration.
#[derive(Debug)]
struct Outgoing {
    partition: u32,
    epoch: u32,
    thief: u16,
    markers_seen: Vec<bool>,
    markers_missing: u16,
}

/// The thief's side of one migration: records that arrived early.
#[derive(Debug)]
struct Incoming<P> {
    epoch: u32,
    pending: P,
}

/// A credit grant held back, and the incoming partitions it waits for
/// (none: it waits only for earlier held grants of the same source).
#[derive(Debug)]
struct HeldGrant<G> {
    source: u16,
    grant: G,
    waits_for: Vec<u32>,
}

/// Most partitions one batch moves ([`Migrations::start_batch`]). Each costs
/// an [`Outgoing`] (a few dozen bytes and one flag per shard) on the old
/// owner, an entry with its early records on the thief, and a placement
/// update, a marker per shard and a handoff on the mesh.
pub const MIGRATION_BATCH_PARTITIONS_MAX: usize = 256;

/// One shard's migrations in flight. `G` is a credit grant, `P` the buffer of
/// records an incoming partition receives before its handoff.
#[derive(Debug)]
pub struct Migrations<G, P> {
    me: u16,
    shard_count: u16,
    /// The partitions this shard is handing over (one batch, in start order).
    outgoing: Vec<Outgoing>,
    /// Partitions whose handoff was decided but not yet sent (on disk the
    /// shard first makes its files durable): still busy until then.
    handing_off: Vec<u32>,
    incoming: AHashMap<u32, Incoming<P>>,
    held_grants: VecDeque<HeldGrant<G>>,
}

impl<G, P: Default> Migrations<G, P> {
    pub fn new(me: u16, shard_count: u16) -> Migrations<G, P> {
        assert!(me < shard_count);
        Migrations {
            me,
            shard_count,
            outgoing: Vec::new(),
            handing_off: Vec::new(),
            incoming: AHashMap::new(),
            held_grants: VecDeque::new(),
        }
    }

    /// Whether a migration into or out of this shard is in flight.
    pub fn is_busy(&self) -> bool {
        !self.outgoing.is_empty() || !self.handing_off.is_empty() || !self.incoming.is_empty()
    }

    /// The shard sent the handoff an [`Effect::SendHandoff`] asked for.
    pub fn handoff_sent(&mut self, partition: u32) {
        let index = self.handing_off.iter().position(|&handing| handing == partition);
        let index = index.unwrap_or_else(|| panic!("handoff of {partition}, which was not asked for"));
        self.handing_off.remove(index);
    }

    pub fn is_incoming(&self, partition: u32) -> bool {
        self.incoming.contains_key(&partition)
    }

    /// Whether `partition` is moving into or out of this shard.
    pub fn is_moving(&self, partition: u32) -> bool {
        self.incoming.contains_key(&partition) || self.is_outgoing(partition) || self.handing_off.contains(&partition)
    }

    /// Whether this shard is handing `partition` over (its markers are not
    /// all in yet).
    pub fn is_outgoing(&self, partition: u32) -> bool {
        self.outgoing.iter().any(|outgoing| outgoing.partition == partition)
    }

    /// Incoming partitions' pending buffers, for their size.
    pub fn pending(&self) -> impl Iterator<Item = &P> + '_ {
        self.incoming.values().map(|incoming| &incoming.pending)
    }

    /// Grants held back now.
    pub fn held_grant_count(&self) -> usize {
        self.held_grants.len()
    }

    /// Step 1, on the owner: move `partition` to `thief`.
    pub fn start(
        &mut self,
        placement: &mut PlacementTable,
        partition: u32,
        thief: u16,
        now_ms: u64,
        effects: &mut Vec<Effect<G>>,
    ) {
        self.start_batch(placement, &[partition], thief, now_ms, effects);
    }

    /// Step 1 for a batch, on the owner: move every partition of
    /// `partitions` (distinct, at most [`MIGRATION_BATCH_PARTITIONS_MAX`]) to
    /// `thief`, in that order.
    pub fn start_batch(
        &mut self,
        placement: &mut PlacementTable,
        partitions: &[u32],
        thief: u16,
        now_ms: u64,
        effects: &mut Vec<Effect<G>>,
    ) {
        assert!(!partitions.is_empty() && partitions.len() <= MIGRATION_BATCH_PARTITIONS_MAX, "batch size");
        assert_ne!(thief, self.me, "a partition moves to another shard");
        assert!(self.outgoing.is_empty(), "one outgoing batch at a time");
        for &partition in partitions {
            let current = placement.get(partition);
            assert_eq!(current.owner, self.me, "only the owner moves a partition");
            let epoch = current.epoch + 1;
            let markers_seen = vec![false; usize::from(self.shard_count)];
            let markers_missing = self.shard_count;
            self.outgoing.push(Outgoing { partition, epoch, thief, markers_seen, markers_missing });
            // Switch locally (this shard's own marker goes behind its batches
            // to itself), then tell only the thief.
            self.on_placement(placement, partition, thief, epoch, now_ms, effects);
            effects.push(Effect::SendPlacement { to: thief, partition, owner: thief, epoch });
        }
    }

    /// Step 2, on every shard: a placement update for `partition` arrived.
    pub fn on_placement(
        &mut self,
        placement: &mut PlacementTable,
        partition: u32,
        owner: u16,
        epoch: u32,
        now_ms: u64,
        effects: &mut Vec<Effect<G>>,
    ) {
        let old_owner = placement.owner(partition);
        if !placement.update(partition, Placement { owner, epoch }) {
            return; // stale
        }
        if owner == self.me {
            for peer in (0..self.shard_count).filter(|&peer| peer != self.me && peer != old_owner) {
                effects.push(Effect::SendPlacement { to: peer, partition, owner, epoch });
            }
            let previous = self.incoming.insert(partition, Incoming { epoch, pending: P::default() });
            assert!(previous.is_none(), "partition {partition} incoming twice");
            let migration = Migration { partition, peer: old_owner, direction: Direction::In, started_ms: now_ms };
            effects.push(Effect::Began(migration));
        }
        effects.push(Effect::SendMarker { to: old_owner, marker: Marker { partition, epoch } });
    }

    /// The buffer of an incoming partition (for a record that reached this
    /// shard before the partition did); `None` if it is not incoming.
    #[inline]
    pub fn pending_mut(&mut self, partition: u32) -> Option<&mut P> {
        self.incoming.get_mut(&partition).map(|incoming| &mut incoming.pending)
    }

    /// After a batch from `source` is applied: its grant goes back now, or is
    /// held while the batch carried records for incoming partitions
    /// (`held_for`: every one of them, so the records waiting at this shard
    /// stay within the sources' credit windows) or an earlier grant of the
    /// same source is held.
    pub fn settle_grant(&mut self, source: u16, grant: G, held_for: Vec<u32>, effects: &mut Vec<Effect<G>>) {
        debug_assert!(held_for.iter().all(|partition| self.incoming.contains_key(partition)));
        let queued_behind = self.held_grants.iter().any(|held| held.source == source);
        if !held_for.is_empty() || queued_behind {
            self.held_grants.push_back(HeldGrant { source, grant, waits_for: held_for });
        } else {
            effects.push(Effect::Grant { source, grant });
        }
    }

    /// Step 4, on the old owner: a marker from `source` arrived (after every
    /// event `source` routed here before it). Hands over once all are in.
    pub fn on_marker(&mut self, source: u16, marker: Marker, now_ms: u64, effects: &mut Vec<Effect<G>>) {
        // Every shard sends one marker per (partition, epoch), to the owner
        // that is moving it: anything else is a bug, which would otherwise
        // show only as a migration that never ends.
        let index = self.outgoing.iter().position(|outgoing| outgoing.partition == marker.partition);
        let Some(index) = index else {
            debug_assert!(false, "marker {marker:?} from {source} with no migration of it out of shard {}", self.me);
            return;
        };
        let outgoing = &mut self.outgoing[index];
        if outgoing.epoch != marker.epoch {
            debug_assert!(false, "marker {marker:?} from {source} for another migration (epoch {})", outgoing.epoch);
            return;
        }
        let seen = &mut outgoing.markers_seen[usize::from(source)];
        assert!(!*seen, "two markers from shard {source} for {marker:?}");
        *seen = true;
        outgoing.markers_missing -= 1;
        if outgoing.markers_missing > 0 {
            return;
        }
        let Outgoing { partition, epoch, thief, .. } = self.outgoing.remove(index);
        self.handing_off.push(partition);
        effects.push(Effect::SendHandoff { to: thief, partition, epoch });
        effects.push(Effect::Ended { partition, direction: Direction::Out, at_ms: now_ms });
    }

    /// Step 5, on the thief: `partition` arrived. Returns the records buffered
    /// for it, which the caller appends (in order) after installing it and
    /// before carrying out the effects, which release the held grants.
    pub fn on_handoff(&mut self, partition: u32, epoch: u32, now_ms: u64, effects: &mut Vec<Effect<G>>) -> P {
        let incoming = self.incoming.remove(&partition);
        let incoming = incoming.unwrap_or_else(|| panic!("handoff of partition {partition}, which is not incoming"));
        assert_eq!(incoming.epoch, epoch, "handoff of another migration of partition {partition}");
        self.release_grants(effects);
        effects.push(Effect::Ended { partition, direction: Direction::In, at_ms: now_ms });
        incoming.pending
    }

    /// Releases, in order, every held grant no longer waiting for an
    /// incoming partition and not queued behind one of its source that is.
    fn release_grants(&mut self, effects: &mut Vec<Effect<G>>) {
        let mut blocked_sources: Vec<u16> = Vec::new();
        for held in std::mem::take(&mut self.held_grants) {
            let waiting = held.waits_for.iter().any(|partition| self.incoming.contains_key(partition));
            if waiting || blocked_sources.contains(&held.source) {
                blocked_sources.push(held.source);
                self.held_grants.push_back(held);
            } else {
                effects.push(Effect::Grant { source: held.source, grant: held.grant });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Machine = Migrations<u64, Vec<u64>>;

    fn grants(effects: &[Effect<u64>]) -> Vec<(u16, u64)> {
        effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Grant { source, grant } => Some((*source, *grant)),
                _ => None,
            })
            .collect()
    }

    /// The owner switches locally, queues its own marker and tells only the
    /// thief; the thief forwards to everyone else and marks the old owner.
    #[test]
    fn start_and_forward() {
        let mut owner_table = PlacementTable::spread(8, 3);
        let mut owner: Machine = Migrations::new(0, 3);
        let mut effects = Vec::new();
        owner.start(&mut owner_table, 3, 1, 0, &mut effects);
        assert_eq!(owner_table.get(3), Placement { owner: 1, epoch: 1 });
        assert_eq!(
            effects,
            [
                Effect::SendMarker { to: 0, marker: Marker { partition: 3, epoch: 1 } },
                Effect::SendPlacement { to: 1, partition: 3, owner: 1, epoch: 1 },
            ]
        );
        let mut thief_table = PlacementTable::spread(8, 3);
        let mut thief: Machine = Migrations::new(1, 3);
        let mut effects = Vec::new();
        thief.on_placement(&mut thief_table, 3, 1, 1, 42, &mut effects);
        assert!(thief.is_incoming(3) && thief.is_busy());
        assert_eq!(effects[0], Effect::SendPlacement { to: 2, partition: 3, owner: 1, epoch: 1 });
        assert!(matches!(effects[1], Effect::Began(Migration { partition: 3, peer: 0, started_ms: 42, .. })));
        assert_eq!(effects[2], Effect::SendMarker { to: 0, marker: Marker { partition: 3, epoch: 1 } });
        let mut again = Vec::new();
        thief.on_placement(&mut thief_table, 3, 1, 1, 43, &mut again);
        assert!(again.is_empty(), "a stale (same-epoch) update does nothing");
    }

    /// The owner hands over only once every shard's marker is in, and
    /// ignores markers of other migrations.
    #[test]
    fn handoff_waits_for_every_marker() {
        let mut table = PlacementTable::spread(8, 3);
        let mut owner: Machine = Migrations::new(0, 3);
        let mut effects = Vec::new();
        owner.start(&mut table, 3, 2, 0, &mut effects);
        effects.clear();
        let marker = Marker { partition: 3, epoch: 1 };
        owner.on_marker(0, marker, 10, &mut effects);
        owner.on_marker(2, marker, 10, &mut effects);
        assert!(effects.is_empty() && owner.is_busy(), "shard 1's marker is missing");
        owner.on_marker(1, marker, 11, &mut effects);
        assert_eq!(effects[0], Effect::SendHandoff { to: 2, partition: 3, epoch: 1 });
        assert_eq!(effects[1], Effect::Ended { partition: 3, direction: Direction::Out, at_ms: 11 });
        assert!(owner.is_busy(), "busy until the handoff is sent");
        owner.handoff_sent(3);
        assert!(!owner.is_busy());
    }

    /// A batch switches every partition at once (one marker and one
    /// placement update each), hands each over once its own markers are in,
    /// and keeps the shard busy until the last handoff is sent.
    #[test]
    fn a_batch_hands_each_partition_over_once_its_markers_are_in() {
        let mut table = PlacementTable::spread(8, 2);
        let mut owner: Machine = Migrations::new(1, 2);
        let mut effects = Vec::new();
        owner.start_batch(&mut table, &[1, 3, 5], 0, 0, &mut effects);
        let placements = effects.iter().filter(|effect| matches!(effect, Effect::SendPlacement { to: 0, .. })).count();
        let markers = effects.iter().filter(|effect| matches!(effect, Effect::SendMarker { to: 1, .. })).count();
        assert_eq!((placements, markers), (3, 3));
        assert!([1, 3, 5].iter().all(|&partition| table.owner(partition) == 0 && owner.is_outgoing(partition)));
        effects.clear();
        for partition in [1, 3, 5] {
            owner.on_marker(1, Marker { partition, epoch: 1 }, 5, &mut effects);
        }
        assert!(effects.is_empty(), "the thief's markers are missing");
        owner.on_marker(0, Marker { partition: 1, epoch: 1 }, 6, &mut effects);
        owner.on_marker(0, Marker { partition: 3, epoch: 1 }, 6, &mut effects);
        let handoffs: Vec<u32> = effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::SendHandoff { to: 0, partition, epoch: 1 } => Some(*partition),
                _ => None,
            })
            .collect();
        assert_eq!(handoffs, [1, 3]);
        assert!(owner.is_outgoing(5) && !owner.is_outgoing(1));
        owner.handoff_sent(1);
        owner.handoff_sent(3);
        assert!(owner.is_busy(), "partition 5 is still outgoing");
        effects.clear();
        owner.on_marker(0, Marker { partition: 5, epoch: 1 }, 7, &mut effects);
        assert_eq!(effects[0], Effect::SendHandoff { to: 0, partition: 5, epoch: 1 });
        owner.handoff_sent(5);
        assert!(!owner.is_busy());
    }

    /// Regression (f2a4dea): once a grant of a source is held, its later
    /// grants queue behind it even when their own batch held nothing back,
    /// and the handoff releases them in the order they were applied.
    #[test]
    fn held_grants_are_released_in_order() {
        let mut table = PlacementTable::spread(8, 3);
        let mut thief: Machine = Migrations::new(1, 3);
        let mut effects = Vec::new();
        thief.on_placement(&mut table, 3, 1, 1, 0, &mut effects);
        effects.clear();
        thief.pending_mut(3).expect("incoming").push(100);
        thief.settle_grant(0, 1, vec![3], &mut effects);
        thief.settle_grant(0, 2, vec![], &mut effects);
        thief.settle_grant(2, 1, vec![], &mut effects);
        thief.settle_grant(0, 3, vec![], &mut effects);
        assert_eq!(grants(&effects), [(2, 1)], "source 2 holds nothing back");
        assert_eq!(thief.held_grant_count(), 3);
        effects.clear();
        let pending = thief.on_handoff(3, 1, 5, &mut effects);
        assert_eq!(pending, [100]);
        assert_eq!(grants(&effects), [(0, 1), (0, 2), (0, 3)]);
        assert_eq!(thief.held_grant_count(), 0);
        assert!(!thief.is_busy());
    }

    /// Grants held for one incoming partition stay held while another
    /// incoming partition of the same source is still missing.
    #[test]
    fn grants_wait_for_their_own_partition() {
        let mut table = PlacementTable::spread(8, 2);
        let mut thief: Machine = Migrations::new(1, 2);
        let mut effects = Vec::new();
        thief.on_placement(&mut table, 2, 1, 1, 0, &mut effects);
        thief.on_placement(&mut table, 4, 1, 1, 0, &mut effects);
        effects.clear();
        thief.settle_grant(0, 1, vec![4], &mut effects);
        thief.settle_grant(0, 2, vec![2], &mut effects);
        thief.on_handoff(2, 1, 1, &mut effects);
        assert!(grants(&effects).is_empty(), "grant 1 waits for partition 4, grant 2 queues behind it");
        thief.on_handoff(4, 1, 2, &mut effects);
        assert_eq!(grants(&effects), [(0, 1), (0, 2)]);
    }
}
