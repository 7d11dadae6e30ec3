//! Consolidation on a running shard: hands partitions over, one after
//! another, while the balancer's [`crate::balance::Consolidator`] says this
//! shard should empty itself (the process is gathered onto fewer shards) or
//! send partitions home (it spread again).
//!
//! Each move is an ordinary migration ([`crate::partition::migration`]):
//! the same markers and handoff as a steal, so per-key order and exactly-once
//! delivery hold while partitions gather or spread. Partitions move in
//! batches of up to [`CONSOLIDATION_BATCH_PARTITIONS_MAX`] to one shard
//! ([`crate::partition::migration::Migrations::start_batch`]): a batch costs
//! about the round trips of one move, and a subscriber reading every
//! partition is disturbed (fetches answered "moved", partitions still
//! arriving) once per batch rather than once per partition: 128 moves one
//! after another kept it disturbed for as long as the gather lasted, and its
//! p99 rose from 5-9 ms to 14-47 ms on a loaded box (README, Benchmarks).
//! One batch out of a shard at a time; the next starts as soon as this
//! shard's part of the last one is over, not at the next gossip interval.

use std::rc::Rc;
use std::time::Duration;

use crate::shard::Shard;
use crate::shard::balancer::now_ms;

/// How often the mover looks again while a migration of this shard is in
/// flight, in ms. A move in memory takes a few mesh round trips (well under a
/// millisecond on an idle box), so one timer wake-up per move at most.
const CONSOLIDATION_POLL_MS: u64 = 1;

/// Most partitions one consolidation batch moves: a shard hands every
/// partition of the default 256 over in one batch, so a 2-shard process
/// gathers or spreads with one placement switch, one marker round and one
/// handoff round (two batches of 64 took twice as long under a saturating
/// load, each waiting for the markers behind a full credit window).
pub const CONSOLIDATION_BATCH_PARTITIONS_MAX: usize = crate::partition::migration::MIGRATION_BATCH_PARTITIONS_MAX;

impl Shard {
    /// The mover: woken by the gossip loop when there is consolidation work,
    /// moves partitions until there is none.
    pub async fn run_consolidation(self: &Rc<Self>) {
        loop {
            self.consolidation_wake.notified().await;
            while self.balancer.borrow().consolidation_due() {
                if self.is_migrating() {
                    glommio::timer::sleep(Duration::from_millis(CONSOLIDATION_POLL_MS)).await;
                    continue;
                }
                if !self.start_consolidation_move() {
                    break;
                }
            }
        }
    }

    /// Starts the next consolidation batch, if there is one; false if not.
    fn start_consolidation_move(self: &Rc<Self>) -> bool {
        let now_ms = now_ms();
        let chosen = {
            let streams = self.streams.borrow();
            let partitions = self.partitions.borrow();
            let movable = partitions.iter().map(|(partition, _)| partition).filter(|&partition| {
                // A replicated partition stays on its shard, as it does for a steal.
                let stream = streams.catalog().stream_of(partition);
                stream.is_some_and(|(spec, _)| streams.is_active(spec.id) && !spec.is_replicated())
            });
            self.balancer.borrow_mut().consolidation_move(movable, CONSOLIDATION_BATCH_PARTITIONS_MAX, now_ms)
        };
        let Some((partitions, to)) = chosen else { return false };
        let mut effects = Vec::new();
        let mut placement = self.placement.borrow_mut();
        self.migrations.borrow_mut().start_batch(&mut placement, &partitions, to, now_ms, &mut effects);
        drop(placement);
        self.carry_out(effects);
        true
    }
}

/// A producer connection handed over by another shard, opaque to the shard:
/// the ingest face that made it is the one that knows what is inside
/// ([`crate::ingest`]), and the shard only carries it.
pub struct Adoption(pub Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for Adoption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Adoption")
    }
}

impl Shard {
    /// The shard a producer connection on this one should move to now, if
    /// any: the process is gathered, this shard is outside the kept set and
    /// owns no partition any more, so every event its connections route
    /// crosses to another shard and wakes it. Cheap: one borrow each of the
    /// balancer and the partitions, once per read.
    pub fn connection_move_target(&self) -> Option<u16> {
        let balancer = self.balancer.borrow();
        let crate::balance::Consolidation::Gathered { kept_shards } = balancer.consolidator.mode() else {
            return None;
        };
        if self.id < kept_shards || self.partitions.borrow().owned_count() > 0 || self.is_migrating() {
            return None;
        }
        let stale_ms = balancer.config.report_stale_ms;
        let target = crate::balance::gather_target(&balancer.view, kept_shards, stale_ms, now_ms());
        (target != self.id).then_some(target)
    }

    /// Where a producer connection moved here while the process was
    /// gathered goes back to: `origin`, the shard that accepted it, once the
    /// process is spread by this shard's view and `origin`'s last load report
    /// says it owns partitions again (a spread sends them home first).
    ///
    /// Each shard decides the mode on its own copy of the view, with its own
    /// hold timers, and the copies can disagree for a second or two: with the
    /// mode alone, a shard that still said spread sent the connections of a
    /// gather back to their first shard, which sent them here again, and so
    /// on (`scripts/bench-gather`: 500 – 40 000 moves, a subscriber's p99 73
    /// ms to 2.2 s in the gather second, one run in three). `origin`'s report
    /// trails its handoff by up to a report interval; the hold after a
    /// partition arrives from a shard whose view is ahead
    /// ([`crate::balance::Consolidator::partition_arriving`]) covers that.
    pub fn move_back_target(&self, origin: Option<u16>) -> Option<u16> {
        let origin = origin?;
        let balancer = self.balancer.borrow();
        let spread = balancer.consolidator.mode() == crate::balance::Consolidation::Spread;
        let owns = balancer.view.report(origin).is_some_and(|report| report.partitions_owned > 0);
        (spread && owns && !balancer.consolidator.holding(now_ms())).then_some(origin)
    }

    /// Sends a connection's state to shard `to`, which adopts it
    /// ([`Shard::next_adoption`]). The caller has fenced the connection's
    /// events first: every one it routed here is applied by its owner.
    pub fn hand_over_connection(&self, to: u16, connection: Box<dyn std::any::Any + Send>) {
        self.send(to, crate::shard::frame::MeshFrame::Adopt(Adoption(connection)));
    }

    /// A connection handed over to this shard arrived.
    pub(super) fn on_adoption(&self, adoption: Adoption) {
        self.adoptions.borrow_mut().push_back(adoption.0);
        self.adoption_wake.notify();
    }

    /// The next connection handed over to this shard, for its face to serve.
    pub async fn next_adoption(&self) -> Box<dyn std::any::Any + Send> {
        loop {
            if let Some(adoption) = self.adoptions.borrow_mut().pop_front() {
                return adoption;
            }
            self.adoption_wake.notified().await;
        }
    }
}
