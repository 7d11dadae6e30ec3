//! Moving a partition between shards without reordering, losing or
//! duplicating an event (DESIGN section 3).
//!
//! Moving partition p from owner S to thief T:
//!
//! 1. S applies `p -> T` with epoch e+1 to itself and sends it to T
//!    ([`Frame::Placement`]); T records p as incoming and forwards the update
//!    to every other shard. Routing to T thus starts only once T knows.
//! 2. Every shard X, on that update, routes p's later events to T and queues a
//!    [`Marker`] `(p, e+1)` for S behind everything it batched for S so far
//!    (the marker rides in X's next batch to S, on the same FIFO channel).
//! 3. T buffers p's events that reach it before the handoff, and holds back the
//!    credit grants of the batches they came in, so the buffer is bounded by
//!    the sources' credit windows.
//! 4. S applies batches in arrival order. When it has the marker of every
//!    shard, it has applied every event routed to it for p; it removes p and
//!    sends it to T ([`Frame::Handoff`]): log segments, counters and rates move
//!    by ownership, offsets continue.
//! 5. T installs p, appends the buffered events in arrival order, then
//!    releases the held grants.
//!
//! Subscribers keep their cursors; a fetch for p reaching S after the handoff
//! is answered "moved" and goes to the owner the subscriber's shard now
//! knows (T's update was sent before any marker could exist, so it is at
//! most briefly behind); one reaching T before the handoff waits there.

use ahash::AHashMap;

use crate::balance::{Direction, Migration};
use crate::partition::Placement;
use crate::protocol::record::decode_log_record;
use crate::shard::Shard;
use crate::shard::balancer::now_ms;
use crate::shard::frame::{CreditGrant, Frame, Handoff, Marker};
use crate::shard::metrics::ShardMetrics;

/// The old owner's side of one migration.
struct Outgoing {
    partition: u32,
    epoch: u32,
    thief: u16,
    markers_seen: Vec<bool>,
}

/// The thief's side of one migration.
struct Incoming {
    epoch: u32,
    /// Log records of p that arrived before the handoff, in arrival order.
    pending_records: Vec<u8>,
    pending_count: u64,
}

/// Migrations in flight on one shard (the balancer allows one in or out at
/// a time; the protocol itself does not depend on that).
#[derive(Default)]
pub struct Migrations {
    outgoing: Option<Outgoing>,
    incoming: AHashMap<u32, Incoming>,
    /// Credit grants held back, in the order their batches were applied:
    /// (source, grant, the incoming partition that made us hold it, if any).
    /// Once one grant of a source is held, its later grants queue behind it,
    /// because a source takes grants strictly in sequence.
    held_grants: Vec<(u16, CreditGrant, Option<u32>)>,
}

impl Migrations {
    pub fn is_busy(&self) -> bool {
        self.outgoing.is_some() || !self.incoming.is_empty()
    }

    pub fn is_incoming(&self, partition: u32) -> bool {
        self.incoming.contains_key(&partition)
    }

    /// Bytes of events buffered for partitions not yet handed over.
    pub fn pending_bytes(&self) -> usize {
        self.incoming.values().map(|incoming| incoming.pending_records.len()).sum()
    }

    /// Buffers a record of an incoming partition; false if `partition` is
    /// not incoming here.
    pub fn buffer(&mut self, partition: u32, log_record: &[u8]) -> bool {
        let Some(incoming) = self.incoming.get_mut(&partition) else { return false };
        incoming.pending_records.extend_from_slice(log_record);
        incoming.pending_count += 1;
        true
    }

    /// Whether a grant for `source` must queue behind held ones.
    pub fn holds_grants_for(&self, source: u16) -> bool {
        self.held_grants.iter().any(|(held_source, _, _)| *held_source == source)
    }

    /// Holds a grant: until `partition` is installed, or (None) until the
    /// grants of the same source before it are released.
    pub fn hold_grant(&mut self, source: u16, grant: CreditGrant, partition: Option<u32>) {
        debug_assert!(partition.is_none_or(|partition| self.incoming.contains_key(&partition)));
        self.held_grants.push((source, grant, partition));
    }

    /// Releases, in order, every held grant no longer waiting for an
    /// incoming partition (and not queued behind one that is).
    fn release_grants(&mut self) -> Vec<(u16, CreditGrant)> {
        let mut blocked_sources: Vec<u16> = Vec::new();
        let mut released = Vec::new();
        for (source, grant, partition) in std::mem::take(&mut self.held_grants) {
            let waiting = partition.is_some_and(|partition| self.incoming.contains_key(&partition));
            if waiting || blocked_sources.contains(&source) {
                blocked_sources.push(source);
                self.held_grants.push((source, grant, partition));
            } else {
                released.push((source, grant));
            }
        }
        released
    }
}

impl Shard {
    /// Step 1, on the owner: switch locally and tell the thief.
    pub(super) fn start_migration(&self, partition: u32, thief: u16) {
        let current = self.placement.borrow().get(partition);
        assert_eq!(current.owner, self.id, "only the owner moves a partition");
        let epoch = current.epoch + 1;
        self.migrations.borrow_mut().outgoing =
            Some(Outgoing { partition, epoch, thief, markers_seen: vec![false; usize::from(self.shard_count)] });
        self.on_placement(partition, thief, epoch);
        // Only the thief hears it from us; it tells everyone else. So no
        // shard routes an event of p to the thief before the thief knows p
        // is coming (a batch from X and the update from S travel on
        // different channels and could otherwise arrive in either order).
        self.outbox.send(thief, Frame::Placement { partition, owner: thief, epoch }, &self.metrics);
    }

    /// Step 2, on every shard: switch routing and send the marker.
    pub(super) fn on_placement(&self, partition: u32, owner: u16, epoch: u32) {
        let old_owner = self.placement.borrow().owner(partition);
        if !self.placement.borrow_mut().update(partition, Placement { owner, epoch }) {
            return; // stale
        }
        if owner == self.id {
            for peer in (0..self.shard_count).filter(|&peer| peer != self.id && peer != old_owner) {
                self.outbox.send(peer, Frame::Placement { partition, owner, epoch }, &self.metrics);
            }
            let incoming = Incoming { epoch, pending_records: Vec::new(), pending_count: 0 };
            self.migrations.borrow_mut().incoming.insert(partition, incoming);
            let mut balancer = self.balancer.borrow_mut();
            balancer.request_answered();
            if !balancer.state.is_migrating() {
                let migration =
                    Migration { partition, peer: old_owner, direction: Direction::In, started_ms: now_ms() };
                balancer.state.begin(migration);
            }
        }
        self.router.borrow_mut().add_marker(old_owner, Marker { partition, epoch });
        self.flush(old_owner);
        // If the batch had no free slot, the flusher sends it (and the marker).
        self.request_flush();
    }

    /// Step 4, on the old owner: count markers; hand over when all are in.
    pub(super) fn on_marker(&self, source: u16, marker: Marker) {
        let mut migrations = self.migrations.borrow_mut();
        let Some(outgoing) = migrations.outgoing.as_mut() else { return };
        if (outgoing.partition, outgoing.epoch) != (marker.partition, marker.epoch) {
            return;
        }
        outgoing.markers_seen[usize::from(source)] = true;
        if !outgoing.markers_seen.iter().all(|&seen| seen) {
            return;
        }
        let outgoing = migrations.outgoing.take().expect("checked above");
        drop(migrations);
        let now_ms = now_ms();
        let mut partition = self.partitions.borrow_mut().remove(outgoing.partition).expect("owner holds it");
        partition.moved_ms = Some(now_ms);
        let handoff = Handoff { partition_id: outgoing.partition, epoch: outgoing.epoch, partition };
        self.outbox.send(outgoing.thief, Frame::Handoff(handoff), &self.metrics);
        self.finish_recorded_migration(outgoing.partition, now_ms);
        // Parked fetches for it must now be told it moved.
        self.fetch_notify.notify();
    }

    /// Step 5, on the thief: install, catch up, release the held credits.
    pub(super) fn on_handoff(&self, handoff: Handoff) {
        let incoming = self.migrations.borrow_mut().incoming.remove(&handoff.partition_id);
        let incoming = incoming.expect("a handoff for a partition this shard expects");
        assert_eq!(incoming.epoch, handoff.epoch, "handoff of another migration");
        let mut partition = handoff.partition;
        let mut offset = 0;
        let mut bytes = 0u64;
        while offset < incoming.pending_records.len() {
            let record = decode_log_record(&incoming.pending_records[offset..]).expect("buffered whole records");
            bytes += partition.append(&record) + 4;
            offset += record.log_record.len();
        }
        ShardMetrics::add(&self.metrics.events_stored, incoming.pending_count);
        ShardMetrics::add(&self.metrics.bytes_stored, bytes);
        let moved_ms = partition.moved_ms.unwrap_or_else(now_ms);
        self.partitions.borrow_mut().install(handoff.partition_id, partition);
        let released = self.migrations.borrow_mut().release_grants();
        for (source, grant) in released {
            self.send_grant(source, grant);
        }
        let mut balancer = self.balancer.borrow_mut();
        balancer.cooldowns.record(handoff.partition_id, moved_ms);
        balancer.counters.migrations_completed += 1;
        drop(balancer);
        self.finish_recorded_migration(handoff.partition_id, now_ms().max(moved_ms));
        self.fetch_notify.notify();
    }
}
