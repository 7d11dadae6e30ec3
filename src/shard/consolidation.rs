//! Consolidation on a running shard: hands partitions over, one after
//! another, while the balancer's [`crate::balance::Consolidator`] says this
//! shard should empty itself (the process is gathered onto fewer shards) or
//! send partitions home (it spread again).
//!
//! Each move is an ordinary migration ([`crate::partition::migration`]):
//! the same markers and handoff as a steal, so per-key order and exactly-once
//! delivery hold while partitions gather or spread. One migration out of a
//! shard at a time; the next starts as soon as this shard's part of the last
//! one is over, not at the next gossip interval, so 256 partitions gather in
//! well under a second rather than in 25.

use std::rc::Rc;
use std::time::Duration;

use crate::shard::Shard;
use crate::shard::balancer::now_ms;

/// How often the mover looks again while a migration of this shard is in
/// flight, in ms. A move in memory takes a few mesh round trips (well under a
/// millisecond on an idle box), so one timer wake-up per move at most.
const CONSOLIDATION_POLL_MS: u64 = 1;

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

    /// Starts the next consolidation move, if there is one; false if not.
    fn start_consolidation_move(self: &Rc<Self>) -> bool {
        let now_ms = now_ms();
        let chosen = {
            let streams = self.streams.borrow();
            let partitions = self.partitions.borrow();
            let movable = partitions.iter().map(|(partition, _)| partition).filter(|&partition| {
                streams.catalog().stream_of(partition).is_some_and(|(spec, _)| streams.is_active(spec.id))
            });
            self.balancer.borrow_mut().consolidation_move(movable, now_ms)
        };
        let Some((partition, to)) = chosen else { return false };
        let mut effects = Vec::new();
        let mut placement = self.placement.borrow_mut();
        self.migrations.borrow_mut().start(&mut placement, partition, to, now_ms, &mut effects);
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

    /// Whether the process is spread over every shard (by this shard's
    /// view): a connection that was moved here while it was gathered goes
    /// back to the shard that accepted it.
    pub fn is_spread(&self) -> bool {
        self.balancer.borrow().consolidator.mode() == crate::balance::Consolidation::Spread
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
