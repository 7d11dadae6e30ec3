//! The stealing rule: pure functions of a shard's view, its own bookkeeping and the time.
//!
//! Nothing here reads a clock, spawns a task or draws a random number; time comes in as
//! `now_ms`. The engine calls these functions on every report interval and on every steal
//! request; the simulator ([`crate::balance::sim`]) calls the very same functions for hundreds
//! of simulated shards. See the module doc of [`crate::balance`] for the rule in prose.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use crate::balance::report::{LoadReport, PartitionLoad, View};

/// Every threshold of the balancer, with the reason for its default.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceConfig {
    /// How often a shard publishes its [`LoadReport`] and evaluates the thief side. 100 ms
    /// reacts well within a second. Every shard sends one report to each peer per interval, so
    /// the whole process carries `shards^2 * 10` small frames per second: 650 K/s at 256 shards
    /// is noise next to the data path, 10 M/s at 1024 is not, and calls for a longer interval.
    pub report_interval_ms: u64,
    /// A report older than this is ignored: its sender has stopped talking, and three missed
    /// intervals is past any scheduling hiccup.
    pub report_stale_ms: u64,
    /// Half-life of the rate averages. Half a second smooths the per-interval noise of bursty
    /// producers (five intervals weigh in) and absorbs 90% of a load step in 1.7 s. In the
    /// simulator, one second instead slows convergence after a hotspot shift by about 1.5 s.
    pub ewma_half_life_ms: u64,
    /// A shard asks for work only while its load is below this fraction of the reference load.
    pub thief_load_ratio_max: f64,
    /// A shard is asked for work only while its load is above this fraction of the reference.
    /// This is the hysteresis: while no shard is above it, nothing moves at all, so measurement
    /// noise of a few percent around the mean moves nothing.
    pub victim_load_ratio_min: f64,
    /// A thief asks a victim only if the victim's load exceeds its own by at least this fraction
    /// of the reference. With the thief ratio at 1 this makes the band symmetric near the mean
    /// (a victim just above 1.15 needs a thief below 0.85) while a badly overloaded victim can
    /// be helped by any shard below the mean, instead of waiting for one far below it.
    pub steal_gap_ratio_min: f64,
    /// How far the thief may end up above the owner after a move, as a fraction of the gap
    /// before it. 0 forbids any overshoot. Anything below 1 keeps every move a strict
    /// improvement (see [`pick_partition`]); 0.5 lets two equally hot partitions that share a
    /// shard be split up, which a zero tolerance would forbid whenever the thief is not idle
    /// (in the simulator, 0 leaves a shifting hotspot at twice its lower bound).
    pub overshoot_ratio_max: f64,
    /// The owner refuses when the gap between it and the thief has shrunk below this fraction
    /// of its own load since the thief looked (another thief got there first).
    pub gap_closed_ratio: f64,
    /// Below this mean load per shard nothing moves: an idle system must not churn on noise.
    pub load_min_events_per_s: f64,
    /// A partition slower than this is not worth a migration: moving it closes no gap.
    pub partition_load_min_events_per_s: f64,
    /// A partition that just moved stays put this long. It is ten rate half-lives, so the
    /// partition's new home is judged on settled numbers before it moves again, and short
    /// enough that a hotspot that moves every few tens of seconds can still be followed.
    pub cooldown_ms: u64,
    /// After a migration ends, the thief waits this long before asking again, so that peers have
    /// seen its new load (one interval to publish, one to arrive, one of slack).
    pub settle_ms: u64,
    /// After a victim refuses for a reason that will not change soon (cooldown, too hot,
    /// nothing to move), the thief asks another victim for this long.
    pub refusal_backoff_ms: u64,
}

impl Default for BalanceConfig {
    fn default() -> BalanceConfig {
        BalanceConfig {
            report_interval_ms: 100,
            report_stale_ms: 500,
            ewma_half_life_ms: 500,
            thief_load_ratio_max: 1.0,
            victim_load_ratio_min: 1.15,
            steal_gap_ratio_min: 0.30,
            overshoot_ratio_max: 0.5,
            gap_closed_ratio: 0.10,
            load_min_events_per_s: 1000.0,
            partition_load_min_events_per_s: 1.0,
            cooldown_ms: 5000,
            settle_ms: 300,
            refusal_backoff_ms: 1000,
        }
    }
}

/// Why a [`BalanceConfig`] cannot work, with the numbers involved.
#[derive(Clone, Debug, PartialEq)]
pub enum BalanceConfigError {
    ReportIntervalZero,
    HalfLifeZero,
    StaleBeforeInterval { report_stale_ms: u64, report_interval_ms: u64 },
    SettleTooShort { settle_ms: u64, settle_ms_min: u64 },
    RatiosOutOfOrder { thief_load_ratio_max: f64, victim_load_ratio_min: f64, steal_gap_ratio_min: f64 },
    OvershootOutOfRange { overshoot_ratio_max: f64 },
    GapClosedOutOfRange { gap_closed_ratio: f64, gap_closed_ratio_max: f64 },
    NegativeMinimum { load_min_events_per_s: f64, partition_load_min_events_per_s: f64 },
}

impl fmt::Display for BalanceConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid balance config: {self:?}")
    }
}

impl std::error::Error for BalanceConfigError {}

impl BalanceConfig {
    /// Checks the relations the rule relies on.
    pub fn validate(&self) -> Result<(), BalanceConfigError> {
        use BalanceConfigError as E;
        if self.report_interval_ms == 0 {
            return Err(E::ReportIntervalZero);
        }
        if self.ewma_half_life_ms == 0 {
            return Err(E::HalfLifeZero);
        }
        if self.report_stale_ms < self.report_interval_ms {
            let (report_stale_ms, report_interval_ms) = (self.report_stale_ms, self.report_interval_ms);
            return Err(E::StaleBeforeInterval { report_stale_ms, report_interval_ms });
        }
        // A thief's new load takes one interval to be published and one to arrive.
        let settle_ms_min = 2 * self.report_interval_ms;
        if self.settle_ms < settle_ms_min {
            return Err(E::SettleTooShort { settle_ms: self.settle_ms, settle_ms_min });
        }
        let (thief, victim) = (self.thief_load_ratio_max, self.victim_load_ratio_min);
        let gap = self.steal_gap_ratio_min;
        if !(thief > 0.0 && thief <= 1.0 && victim > 1.0 && victim.is_finite() && gap > 0.0) {
            return Err(E::RatiosOutOfOrder {
                thief_load_ratio_max: thief,
                victim_load_ratio_min: victim,
                steal_gap_ratio_min: gap,
            });
        }
        if !(0.0..1.0).contains(&self.overshoot_ratio_max) {
            return Err(E::OvershootOutOfRange { overshoot_ratio_max: self.overshoot_ratio_max });
        }
        // A request that just triggered must not be refused as closed. Relative to the victim's
        // load, the smallest gap a request can carry is at the lightest victim that can ask,
        // `victim_min = max(victim, thief + gap)`, with a gap of `victim_min - thief` or more.
        let victim_min = victim.max(thief + gap);
        let gap_closed_ratio_max = (victim_min - thief).max(gap) / victim_min;
        if !(self.gap_closed_ratio >= 0.0 && self.gap_closed_ratio < gap_closed_ratio_max) {
            let gap_closed_ratio = self.gap_closed_ratio;
            return Err(E::GapClosedOutOfRange { gap_closed_ratio, gap_closed_ratio_max });
        }
        if !(self.load_min_events_per_s >= 0.0 && self.partition_load_min_events_per_s >= 0.0) {
            return Err(E::NegativeMinimum {
                load_min_events_per_s: self.load_min_events_per_s,
                partition_load_min_events_per_s: self.partition_load_min_events_per_s,
            });
        }
        Ok(())
    }
}

/// Which way a migration goes, seen from the shard that records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Direction {
    In,
    Out,
}

/// A migration in flight, as one of its two shards records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Migration {
    pub partition: u32,
    /// The other shard: the thief for `Out`, the owner for `In`.
    pub peer: u16,
    pub direction: Direction,
    pub started_ms: u64,
}

/// A refusal the thief remembers, so it asks someone else for a while.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Backoff {
    victim: u16,
    until_ms: u64,
}

/// The balancer's bookkeeping on one shard: at most one migration, and what happened last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardState {
    migration: Option<Migration>,
    last_migration_end_ms: Option<u64>,
    backoff: Option<Backoff>,
}

impl ShardState {
    pub fn new() -> ShardState {
        ShardState::default()
    }

    pub fn migration(&self) -> Option<&Migration> {
        self.migration.as_ref()
    }

    pub fn is_migrating(&self) -> bool {
        self.migration.is_some()
    }

    pub fn last_migration_end_ms(&self) -> Option<u64> {
        self.last_migration_end_ms
    }

    /// Records the start of a migration. Panics if one is already in flight: at most one
    /// migration into or out of a shard at a time is the invariant this state exists for.
    pub fn begin(&mut self, migration: Migration) {
        assert!(self.migration.is_none(), "second migration {migration:?} over {self:?}");
        if let Some(end_ms) = self.last_migration_end_ms {
            assert!(migration.started_ms >= end_ms, "migration starts before the last ended");
        }
        self.migration = Some(migration);
    }

    /// Records the end (completed or aborted) of the migration of `partition`.
    pub fn finish(&mut self, partition: u32, now_ms: u64) -> Migration {
        let migration = self.migration.take().expect("finish without a migration in flight");
        assert_eq!(migration.partition, partition, "finish of a migration not in flight");
        assert!(now_ms >= migration.started_ms, "migration ends before it started");
        self.last_migration_end_ms = Some(now_ms);
        migration
    }

    /// Remembers a refusal from `victim`, if it is one that waiting a moment will not cure.
    pub fn note_refusal(&mut self, victim: u16, refusal: &Refusal, now_ms: u64, cfg: &BalanceConfig) {
        if refusal.backs_off() {
            let until_ms = now_ms.saturating_add(cfg.refusal_backoff_ms);
            self.backoff = Some(Backoff { victim, until_ms });
        }
    }

    /// A thief that just received a partition waits `settle_ms` before it
    /// asks again, so its peers see its new load first.
    pub fn settling(&self, now_ms: u64, cfg: &BalanceConfig) -> bool {
        self.last_migration_end_ms.is_some_and(|end_ms| now_ms < end_ms.saturating_add(cfg.settle_ms))
    }

    fn backed_off(&self, victim: u16, now_ms: u64) -> bool {
        self.backoff.is_some_and(|backoff| backoff.victim == victim && now_ms < backoff.until_ms)
    }
}

/// One shard's balancer bookkeeping between steps: the migration it takes
/// part in (as the rule records it), the cooldowns of partitions it
/// received, and the steal request waiting for its answer. The engine's
/// balancer (`shard::balancer`) and the simulator's shards both keep one and
/// change it only through these methods, so the simulator runs the engine's
/// bookkeeping, not a copy of it.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    pub state: ShardState,
    pub cooldowns: Cooldowns,
    /// `(victim, sent_ms)` of the steal request waiting for its answer.
    pub pending_request: Option<(u16, u64)>,
}

impl Ledger {
    /// A steal request went to `victim` at `now_ms`.
    pub fn request_sent(&mut self, victim: u16, now_ms: u64) {
        self.pending_request = Some((victim, now_ms));
    }

    /// Whether a steal request still waits for its answer at `now_ms` (after
    /// `timeout_ms` the shard may ask again).
    pub fn awaiting_answer(&self, now_ms: u64, timeout_ms: u64) -> bool {
        self.pending_request.is_some_and(|(_, sent_ms)| now_ms < sent_ms.saturating_add(timeout_ms))
    }

    /// Whether a steal request from another shard must be refused: a
    /// migration is in flight, or this shard waits for the answer to its own
    /// request (it may become a thief any moment: giving a partition away
    /// meanwhile could make it a thief and an owner at once, whose held
    /// grants could wait on each other across shards).
    pub fn refuses_steal(&self, migrations_busy: bool) -> bool {
        migrations_busy || self.pending_request.is_some()
    }

    /// This shard learnt that a partition is migrating to it: the answer to
    /// its steal request (or a migration it did not ask for).
    pub fn migration_began(&mut self, migration: Migration) {
        self.pending_request = None;
        if !self.state.is_migrating() {
            self.state.begin(migration);
        }
    }

    /// This shard's part in moving `partition` ended. A thief records the
    /// cooldown from `moved_ms`, when the old owner handed it over.
    pub fn migration_ended(&mut self, partition: u32, direction: Direction, at_ms: u64, moved_ms: u64) {
        if direction == Direction::In {
            self.cooldowns.record(partition, moved_ms);
        }
        // A shard can be in the protocol for a partition the balancer did not
        // record (e.g. a thief already busy as an owner).
        if self.state.migration().is_some_and(|migration| migration.partition == partition) {
            self.state.finish(partition, at_ms.max(moved_ms));
        }
    }

    /// `victim` refused this shard's steal request.
    pub fn refused(&mut self, victim: u16, refusal: &Refusal, now_ms: u64, cfg: &BalanceConfig) {
        self.state.note_refusal(victim, refusal, now_ms, cfg);
        self.pending_request = None;
    }
}

/// When each recently moved partition arrived at its current owner.
///
/// In the engine the time travels with the partition's `Handoff`, so the new owner knows it;
/// the simulator keeps one table for all shards, which holds the same facts. Memory is bounded by
/// [`Cooldowns::prune`]: only partitions moved within the last `cooldown_ms` are kept.
#[derive(Clone, Debug, Default)]
pub struct Cooldowns {
    moved_ms: HashMap<u32, u64>,
}

impl Cooldowns {
    pub fn new() -> Cooldowns {
        Cooldowns::default()
    }

    pub fn record(&mut self, partition: u32, moved_ms: u64) {
        self.moved_ms.insert(partition, moved_ms);
    }

    /// When `partition` last finished moving, if it is remembered.
    pub fn moved_ms(&self, partition: u32) -> Option<u64> {
        self.moved_ms.get(&partition).copied()
    }

    /// How long `partition` must still stay put; 0 if it may move.
    pub fn remaining_ms(&self, partition: u32, now_ms: u64, cooldown_ms: u64) -> u64 {
        match self.moved_ms.get(&partition) {
            Some(&moved_ms) => moved_ms.saturating_add(cooldown_ms).saturating_sub(now_ms),
            None => 0,
        }
    }

    /// Forgets partitions whose cooldown is over.
    pub fn prune(&mut self, now_ms: u64, cooldown_ms: u64) {
        self.moved_ms.retain(|_, moved_ms| moved_ms.saturating_add(cooldown_ms) > now_ms);
    }

    pub fn len(&self) -> usize {
        self.moved_ms.len()
    }

    pub fn is_empty(&self) -> bool {
        self.moved_ms.is_empty()
    }
}

/// What a thief sends to the victim it picked.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StealRequest {
    pub victim: u16,
    /// The thief's load as its last report said; the owner compares it with its own fresh load.
    pub thief_events_per_s: f64,
    /// The victim's load as the thief saw it, for logs and metrics.
    pub victim_events_per_s: f64,
}

/// Why an owner did not hand over a partition.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Refusal {
    /// The owner already has a migration in or out.
    AlreadyMigrating { partition: u32 },
    /// The owner is no longer clearly above the thief.
    GapClosed { owner_events_per_s: f64, thief_events_per_s: f64 },
    /// Every partition that would fit moved recently.
    Cooldown { remaining_ms: u64 },
    /// Every partition with load is too hot: moving any would overshoot.
    TooHot { ideal_events_per_s: f64, lightest_events_per_s: f64 },
    /// The owner has no partition with enough load to be worth moving.
    NothingToMove { partitions_owned: u32 },
    /// The process is gathered onto fewer shards ([`crate::balance::Consolidation`]): nothing
    /// is stolen until the load spreads it again.
    Gathered { kept_shards: u16 },
}

impl Refusal {
    /// A short stable name, for metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Refusal::AlreadyMigrating { .. } => "already_migrating",
            Refusal::GapClosed { .. } => "gap_closed",
            Refusal::Cooldown { .. } => "cooldown",
            Refusal::TooHot { .. } => "too_hot",
            Refusal::NothingToMove { .. } => "nothing_to_move",
            Refusal::Gathered { .. } => "gathered",
        }
    }

    /// Whether the thief should leave this victim alone for a while. A busy owner or a closed
    /// gap changes within an interval; the victim's partitions being too hot or cooling does not.
    pub fn backs_off(&self) -> bool {
        matches!(
            self,
            Refusal::Cooldown { .. }
                | Refusal::TooHot { .. }
                | Refusal::NothingToMove { .. }
                | Refusal::Gathered { .. }
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "steal refused: {self:?}")
    }
}

/// The whole process's load as one view shows it, with the thieves and victims ranked.
///
/// Built once per view and shared by every question asked of it: the engine asks for one shard,
/// the simulator for all of them, and building the ranking once keeps that `O(n log n)`.
#[derive(Clone, Debug)]
pub struct Census {
    /// Mean load over the shards with a fresh report.
    pub mean_events_per_s: f64,
    /// The load a shard should carry: the water level (see [`water_level_events_per_s`]) of the
    /// reported partitions. A partition hotter than that belongs on a shard of its own, and
    /// counting its load in the mean would make every other shard look underloaded.
    pub reference_events_per_s: f64,
    /// Fresh loads by shard id.
    loads: Vec<Option<f64>>,
    /// Rank of each thief, least loaded first, by shard id.
    thief_ranks: Vec<Option<usize>>,
    /// Victims, most loaded first: (shard, load).
    victims: Vec<(u16, f64)>,
}

impl Census {
    pub fn of(view: &View, cfg: &BalanceConfig, now_ms: u64) -> Census {
        let shard_count = usize::from(view.shard_count());
        let fresh: Vec<&LoadReport> = view.fresh(now_ms, cfg.report_stale_ms).collect();
        let mut census = Census {
            mean_events_per_s: 0.0,
            reference_events_per_s: 0.0,
            loads: vec![None; shard_count],
            thief_ranks: vec![None; shard_count],
            victims: Vec::new(),
        };
        for report in &fresh {
            census.loads[usize::from(report.shard)] = Some(report.events_per_s);
        }
        // One shard alone has no one to balance with.
        if fresh.len() < 2 {
            return census;
        }
        let total: f64 = fresh.iter().map(|report| report.events_per_s).sum();
        let mean = total / fresh.len() as f64;
        // The reports list every shard's hottest partitions, which include every partition
        // above the level, so the level they give is the level of the whole process.
        let mut listed: Vec<f64> =
            fresh.iter().flat_map(|report| report.hottest.iter().map(|partition| partition.events_per_s)).collect();
        listed.sort_by(|a, b| b.total_cmp(a));
        let reference = water_level_events_per_s(&listed, total, fresh.len());
        census.mean_events_per_s = mean;
        census.reference_events_per_s = reference;
        if reference < cfg.load_min_events_per_s {
            return census;
        }
        census.rank(&fresh, cfg);
        census
    }

    fn rank(&mut self, fresh: &[&LoadReport], cfg: &BalanceConfig) {
        let thief_load_max = self.reference_events_per_s * cfg.thief_load_ratio_max;
        let victim_load_min = self.reference_events_per_s * cfg.victim_load_ratio_min;
        let mut thieves: Vec<(u16, f64)> = fresh
            .iter()
            .filter(|report| !report.migrating && report.events_per_s < thief_load_max)
            .map(|report| (report.shard, report.events_per_s))
            .collect();
        thieves.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        for (rank, (shard, _)) in thieves.iter().enumerate() {
            self.thief_ranks[usize::from(*shard)] = Some(rank);
        }
        // A victim must own two partitions: with one, whatever it gave would leave it idle. A
        // victim that reported a migration is still asked: the report is an interval old and
        // the migration is likely over, and a refusal costs one small frame. Thieves that
        // reported one are left out, as they are likely still settling and would hold a rank.
        self.victims = fresh
            .iter()
            .filter(|report| report.partitions_owned >= 2)
            .filter(|report| report.events_per_s > victim_load_min)
            .map(|report| (report.shard, report.events_per_s))
            .collect();
        self.victims.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    }

    pub fn victim_count(&self) -> usize {
        self.victims.len()
    }

    /// The thief side of the rule for shard `me`: whom to ask for work, if anyone.
    ///
    /// The i-th least loaded thief asks the i-th most loaded victim, so that in one interval
    /// every victim hears from at most one thief (views agree up to one interval of staleness)
    /// instead of all thieves herding onto the most loaded peer and being refused but one. With
    /// a single victim this is "the least loaded shard asks the most loaded one". The pair must
    /// be at least `steal_gap_ratio_min` of the reference apart.
    pub fn steal_for(&self, me: u16, cfg: &BalanceConfig, state: &ShardState, now_ms: u64) -> Option<StealRequest> {
        let me_index = usize::from(me);
        assert!(me_index < self.loads.len(), "shard {me} not in the view");
        if state.is_migrating() || state.settling(now_ms, cfg) {
            return None;
        }
        let rank = self.thief_ranks[me_index]?;
        let thief_events_per_s = self.loads[me_index]?;
        if rank >= self.victims.len() {
            return None;
        }
        let mut index = rank;
        if state.backed_off(self.victims[index].0, now_ms) {
            if self.victims.len() == 1 {
                return None;
            }
            index = (rank + 1) % self.victims.len();
        }
        let (victim, victim_events_per_s) = self.victims[index];
        assert_ne!(victim, me, "a shard cannot be both thief and victim");
        assert!(victim_events_per_s > thief_events_per_s);
        let gap_min_events_per_s = cfg.steal_gap_ratio_min * self.reference_events_per_s;
        if victim_events_per_s - thief_events_per_s < gap_min_events_per_s {
            return None;
        }
        Some(StealRequest { victim, thief_events_per_s, victim_events_per_s })
    }
}

/// The water level: the mean shard load once every partition hotter than the level has a shard
/// to itself. No placement can bring every shard that shares its partitions below it, so it is
/// what a shard should carry. `loads_desc` are partition loads, hottest first (any subset that
/// includes every partition above the level gives the same answer); `total_events_per_s` is the
/// load of all partitions, spread over `shard_count` shards.
pub fn water_level_events_per_s(loads_desc: &[f64], total_events_per_s: f64, shard_count: usize) -> f64 {
    assert!(shard_count > 0, "water level of no shards");
    for pair in loads_desc.windows(2) {
        assert!(pair[0] >= pair[1], "loads must be sorted hottest first");
    }
    let mut remaining_events_per_s = total_events_per_s;
    let mut shards_left = shard_count;
    for &load in loads_desc {
        if shards_left <= 1 || load <= remaining_events_per_s / shards_left as f64 {
            break;
        }
        remaining_events_per_s -= load;
        shards_left -= 1;
    }
    (remaining_events_per_s / shards_left as f64).max(0.0)
}

/// The thief side of the rule: whether shard `me` should ask a peer for work, and whom.
///
/// An underloaded shard (below `thief_load_ratio_max` of the reference load) asks an overloaded
/// peer (above `victim_load_ratio_min`) at least `steal_gap_ratio_min` of the reference above it,
/// unless it is migrating, has just finished a migration (its new load is not yet known to its
/// peers), or the system is idle.
pub fn want_to_steal(
    view: &View,
    me: u16,
    cfg: &BalanceConfig,
    state: &ShardState,
    now_ms: u64,
) -> Option<StealRequest> {
    Census::of(view, cfg, now_ms).steal_for(me, cfg, state, now_ms)
}

/// Whether moving `partition_events_per_s` from the owner to the thief stays within the allowed
/// overshoot. The thief may end above the owner by at most `overshoot_ratio_max` of the gap.
fn fits(partition_events_per_s: f64, gap_events_per_s: f64, cfg: &BalanceConfig) -> bool {
    let overshoot_events_per_s = 2.0 * partition_events_per_s - gap_events_per_s;
    overshoot_events_per_s <= cfg.overshoot_ratio_max * gap_events_per_s
}

/// The owner side of the rule: which partition to hand to a thief, or why none.
///
/// The ideal move is half the gap, `(owner - thief) / 2`: both end at the pair's mean. The owner
/// picks the partition closest to that ideal among those that do not overshoot (the thief may
/// end above the owner by at most `overshoot_ratio_max` of the gap; 0 means never above) and are
/// not cooling down. Because `overshoot_ratio_max < 1`, every partition moved is lighter than the
/// gap, so each move lowers the sum of squared shard loads by `2 x (gap - x) > 0`; with loads
/// steady, moves cannot cycle, which is the no-ping-pong guarantee.
pub fn pick_partition(
    my_partitions: &[PartitionLoad],
    owner_events_per_s: f64,
    thief_events_per_s: f64,
    cfg: &BalanceConfig,
    cooldowns: &Cooldowns,
    state: &ShardState,
    now_ms: u64,
) -> Result<u32, Refusal> {
    if let Some(migration) = state.migration() {
        return Err(Refusal::AlreadyMigrating { partition: migration.partition });
    }
    let gap_events_per_s = owner_events_per_s - thief_events_per_s;
    let gap_min_events_per_s = (cfg.gap_closed_ratio * owner_events_per_s).max(cfg.load_min_events_per_s);
    if gap_events_per_s < gap_min_events_per_s {
        return Err(Refusal::GapClosed { owner_events_per_s, thief_events_per_s });
    }
    let ideal_events_per_s = gap_events_per_s / 2.0;
    let mut best: Option<&PartitionLoad> = None;
    let mut cooling_ms_min: Option<u64> = None;
    let mut too_hot_events_per_s_min: Option<f64> = None;
    for candidate in my_partitions {
        let load = candidate.events_per_s;
        if load < cfg.partition_load_min_events_per_s {
            continue;
        }
        if !fits(load, gap_events_per_s, cfg) {
            too_hot_events_per_s_min = Some(too_hot_events_per_s_min.map_or(load, |m| m.min(load)));
            continue;
        }
        let remaining_ms = cooldowns.remaining_ms(candidate.partition, now_ms, cfg.cooldown_ms);
        if remaining_ms > 0 {
            cooling_ms_min = Some(cooling_ms_min.map_or(remaining_ms, |m| m.min(remaining_ms)));
            continue;
        }
        if best.is_none_or(|held| closer(candidate, held, ideal_events_per_s)) {
            best = Some(candidate);
        }
    }
    if let Some(chosen) = best {
        assert!(chosen.events_per_s < gap_events_per_s, "a move must be lighter than the gap");
        return Ok(chosen.partition);
    }
    if let Some(remaining_ms) = cooling_ms_min {
        return Err(Refusal::Cooldown { remaining_ms });
    }
    if let Some(lightest_events_per_s) = too_hot_events_per_s_min {
        return Err(Refusal::TooHot { ideal_events_per_s, lightest_events_per_s });
    }
    let partitions_owned = u32::try_from(my_partitions.len()).unwrap_or(u32::MAX);
    Err(Refusal::NothingToMove { partitions_owned })
}

/// Whether `a` is a better move than `b`: closer to the ideal, then lighter (less overshoot, a
/// cheaper move), then the lower partition id so the choice never depends on input order.
fn closer(a: &PartitionLoad, b: &PartitionLoad, ideal_events_per_s: f64) -> bool {
    let distance_a = (a.events_per_s - ideal_events_per_s).abs();
    let distance_b = (b.events_per_s - ideal_events_per_s).abs();
    distance_a
        .total_cmp(&distance_b)
        .then(a.events_per_s.total_cmp(&b.events_per_s))
        .then(a.partition.cmp(&b.partition))
        .is_lt()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: u64 = 100_000;

    fn partition(partition: u32, events_per_s: f64) -> PartitionLoad {
        PartitionLoad { partition, events_per_s, bytes_per_s: events_per_s * 100.0 }
    }

    fn report(shard: u16, events_per_s: f64, partitions_owned: u32) -> LoadReport {
        LoadReport {
            shard,
            sequence: 1,
            at_ms: NOW_MS - 100,
            events_per_s,
            recent_events_per_s: events_per_s,
            bytes_per_s: events_per_s * 100.0,
            busy_ratio: 0.5,
            credit_stalls: 0,
            partitions_owned,
            migrating: false,
            hottest: Vec::new(),
        }
    }

    /// A view with one report per load, shard ids in order, four partitions each.
    fn view_of(loads: &[f64]) -> View {
        let mut view = View::new(loads.len() as u16);
        for (shard, &load) in loads.iter().enumerate() {
            view.update(report(shard as u16, load, 4));
        }
        view
    }

    fn pick(partitions: &[PartitionLoad], owner: f64, thief: f64) -> Result<u32, Refusal> {
        let cfg = BalanceConfig::default();
        pick_partition(partitions, owner, thief, &cfg, &Cooldowns::new(), &ShardState::new(), NOW_MS)
    }

    #[test]
    fn default_config_is_valid_and_bad_ones_are_named() {
        // Proves the defaults satisfy the rule's relations and a broken band is reported.
        assert_eq!(BalanceConfig::default().validate(), Ok(()));
        let inverted = BalanceConfig { thief_load_ratio_max: 1.2, ..BalanceConfig::default() };
        assert!(matches!(inverted.validate(), Err(BalanceConfigError::RatiosOutOfOrder { .. })));
        let short = BalanceConfig { settle_ms: 150, ..BalanceConfig::default() };
        assert!(matches!(short.validate(), Err(BalanceConfigError::SettleTooShort { .. })));
        let wide = BalanceConfig { gap_closed_ratio: 0.5, ..BalanceConfig::default() };
        assert!(matches!(wide.validate(), Err(BalanceConfigError::GapClosedOutOfRange { .. })));
    }

    #[test]
    fn picks_the_partition_closest_to_half_the_gap() {
        // Proves best fit: gap 60_000, ideal 30_000, so 28_000 beats 10_000 and 45_000.
        let partitions =
            [partition(1, 10_000.0), partition(2, 28_000.0), partition(3, 45_000.0), partition(4, 2_000.0)];
        assert_eq!(pick(&partitions, 85_000.0, 25_000.0), Ok(2));
    }

    #[test]
    fn refuses_a_partition_that_would_overshoot() {
        // Proves overshoot refusal: with a 20_000 gap, a 16_000 partition would leave the thief
        // 12_000 above the owner, beyond half the gap, so the owner refuses.
        let partitions = [partition(1, 16_000.0), partition(2, 60_000.0)];
        let refusal = pick(&partitions, 76_000.0, 56_000.0);
        assert!(matches!(refusal, Err(Refusal::TooHot { .. })), "{refusal:?}");
        // With no tolerance at all, even a slight overshoot is refused: gap 20_000, the
        // partition of 10_500 would leave the thief 1_000 above the owner.
        let strict = BalanceConfig { overshoot_ratio_max: 0.0, ..BalanceConfig::default() };
        let partitions = [partition(1, 10_500.0), partition(2, 65_500.0)];
        let state = ShardState::new();
        let refusal = pick_partition(&partitions, 76_000.0, 56_000.0, &strict, &Cooldowns::new(), &state, NOW_MS);
        assert!(matches!(refusal, Err(Refusal::TooHot { .. })), "{refusal:?}");
        // Within the tolerance the same move is allowed: it still lowers the pair's maximum.
        assert_eq!(pick(&partitions, 76_000.0, 56_000.0), Ok(1));
    }

    #[test]
    fn splits_two_equally_hot_partitions_sharing_a_shard() {
        // Proves the overshoot tolerance earns its keep: two 40_000 partitions on one shard,
        // a thief at 15_000; strict no-overshoot would refuse, the default moves one.
        let partitions = [partition(7, 40_000.0), partition(8, 40_000.0)];
        assert_eq!(pick(&partitions, 80_000.0, 15_000.0), Ok(7));
    }

    #[test]
    fn refuses_when_the_gap_has_closed() {
        // Proves the owner re-checks with its own fresh load: 5% apart is not worth a move.
        let partitions = [partition(1, 2_000.0), partition(2, 50_000.0)];
        let refusal = pick(&partitions, 52_000.0, 49_500.0);
        assert!(matches!(refusal, Err(Refusal::GapClosed { .. })), "{refusal:?}");
    }

    #[test]
    fn one_migration_at_a_time() {
        // Proves an owner with a migration in flight refuses, and its thief side stays quiet.
        let cfg = BalanceConfig::default();
        let mut state = ShardState::new();
        state.begin(Migration { partition: 9, peer: 3, direction: Direction::In, started_ms: NOW_MS });
        let partitions = [partition(1, 10_000.0), partition(2, 50_000.0)];
        let refusal = pick_partition(&partitions, 60_000.0, 10_000.0, &cfg, &Cooldowns::new(), &state, NOW_MS);
        assert_eq!(refusal, Err(Refusal::AlreadyMigrating { partition: 9 }));
        let view = view_of(&[10_000.0, 60_000.0, 35_000.0]);
        assert_eq!(want_to_steal(&view, 0, &cfg, &state, NOW_MS), None);
        state.finish(9, NOW_MS + 50);
        assert!(pick_partition(&partitions, 60_000.0, 10_000.0, &cfg, &Cooldowns::new(), &state, NOW_MS + 50).is_ok());
    }

    #[test]
    #[should_panic(expected = "second migration")]
    fn a_second_concurrent_migration_panics() {
        // Proves the state itself enforces one migration in or out at a time.
        let mut state = ShardState::new();
        state.begin(Migration { partition: 9, peer: 3, direction: Direction::In, started_ms: NOW_MS });
        state.begin(Migration { partition: 1, peer: 4, direction: Direction::Out, started_ms: NOW_MS });
    }

    #[test]
    fn cooldown_keeps_a_partition_that_just_moved() {
        // Proves a partition that moved less than cooldown_ms ago is skipped for the next best,
        // and the owner refuses with the remaining time when it is the only fit.
        let cfg = BalanceConfig::default();
        let mut cooldowns = Cooldowns::new();
        cooldowns.record(2, NOW_MS - 1_000);
        let state = ShardState::new();
        let partitions = [partition(1, 10_000.0), partition(2, 28_000.0), partition(3, 90_000.0)];
        let chosen = pick_partition(&partitions, 128_000.0, 60_000.0, &cfg, &cooldowns, &state, NOW_MS);
        assert_eq!(chosen, Ok(1));
        let only = [partition(2, 28_000.0), partition(3, 100_000.0)];
        let refusal = pick_partition(&only, 128_000.0, 60_000.0, &cfg, &cooldowns, &state, NOW_MS);
        assert_eq!(refusal, Err(Refusal::Cooldown { remaining_ms: 4_000 }));
        let later_ms = NOW_MS + 4_000;
        assert_eq!(pick_partition(&only, 128_000.0, 60_000.0, &cfg, &cooldowns, &state, later_ms), Ok(2));
        cooldowns.prune(later_ms, cfg.cooldown_ms);
        assert!(cooldowns.is_empty());
    }

    #[test]
    fn huge_cooldowns_and_backoffs_saturate_instead_of_wrapping() {
        // Proves that a cooldown, settle time or refusal back-off near u64::MAX (2^63, u64::MAX)
        // keeps the partition or the thief waiting, where a wrapped sum let it go at once.
        for huge_ms in [u64::MAX, 1 << 63] {
            let mut cooldowns = Cooldowns::new();
            cooldowns.record(2, NOW_MS);
            assert!(cooldowns.remaining_ms(2, NOW_MS + 1, huge_ms) >= (1 << 63) - 1, "cooldown {huge_ms}");
            cooldowns.prune(NOW_MS + 1_000_000, huge_ms);
            assert_eq!(cooldowns.len(), 1, "still cooling down");
            let cfg = BalanceConfig { settle_ms: huge_ms, refusal_backoff_ms: huge_ms, ..BalanceConfig::default() };
            let mut state = ShardState::new();
            state.last_migration_end_ms = Some(NOW_MS);
            assert!(state.settling(NOW_MS + 1_000_000, &cfg));
            state.note_refusal(3, &Refusal::NothingToMove { partitions_owned: 0 }, NOW_MS, &cfg);
            assert!(state.backed_off(3, NOW_MS + 1_000_000));
        }
    }

    #[test]
    fn hysteresis_band_keeps_near_mean_shards_still() {
        // Proves the dead band: with loads 0.9 and 1.1 of the mean nobody asks; at 0.8 and 1.2
        // the underloaded shard asks the overloaded one; a pair closer than the gap ratio
        // (0.92 and 1.18: a victim, but only 0.26 apart) does not move.
        let cfg = BalanceConfig::default();
        let state = ShardState::new();
        let calm = view_of(&[90_000.0, 110_000.0, 100_000.0, 100_000.0]);
        for shard in 0..4 {
            assert_eq!(want_to_steal(&calm, shard, &cfg, &state, NOW_MS), None);
        }
        let skewed = view_of(&[80_000.0, 120_000.0, 100_000.0, 100_000.0]);
        let request = want_to_steal(&skewed, 0, &cfg, &state, NOW_MS).expect("shard 0 should ask");
        assert_eq!(request.victim, 1);
        assert_eq!(request.thief_events_per_s, 80_000.0);
        for shard in 1..4 {
            assert_eq!(want_to_steal(&skewed, shard, &cfg, &state, NOW_MS), None);
        }
        let close = view_of(&[92_000.0, 118_000.0, 95_000.0, 95_000.0]);
        for shard in 0..4 {
            assert_eq!(want_to_steal(&close, shard, &cfg, &state, NOW_MS), None);
        }
    }

    #[test]
    fn a_badly_overloaded_victim_is_helped_by_a_shard_just_below_the_mean() {
        // Proves the gap rule: with a victim at 1.45 of the reference, a thief at 0.86 of it
        // still asks (no fixed band far below the mean is needed), as the pair is 0.59 apart.
        let cfg = BalanceConfig::default();
        let view = view_of(&[95_000.0, 160_000.0, 97_000.0, 98_000.0, 100_000.0]);
        let census = Census::of(&view, &cfg, NOW_MS);
        assert_eq!(census.reference_events_per_s, 110_000.0);
        let request = census.steal_for(0, &cfg, &ShardState::new(), NOW_MS);
        assert_eq!(request.map(|r| r.victim), Some(1));
    }

    #[test]
    fn idle_system_does_nothing() {
        // Proves the minimum load: a 10x skew at a few hundred events/s moves nothing, on
        // either side of the rule.
        let cfg = BalanceConfig::default();
        let state = ShardState::new();
        let idle = view_of(&[50.0, 500.0, 100.0, 150.0]);
        for shard in 0..4 {
            assert_eq!(want_to_steal(&idle, shard, &cfg, &state, NOW_MS), None);
        }
        let refusal = pick(&[partition(1, 200.0), partition(2, 300.0)], 500.0, 50.0);
        assert!(matches!(refusal, Err(Refusal::GapClosed { .. })), "{refusal:?}");
    }

    #[test]
    fn thieves_pair_with_victims_in_rank_order() {
        // Proves requests spread: the least loaded asks the most loaded, the next the next,
        // and a third thief with no victim left stays quiet instead of piling on.
        let cfg = BalanceConfig::default();
        let state = ShardState::new();
        let view = view_of(&[20_000.0, 180_000.0, 40_000.0, 150_000.0, 60_000.0, 150_000.0]);
        let victim_of = |shard| want_to_steal(&view, shard, &cfg, &state, NOW_MS).map(|r| r.victim);
        assert_eq!(victim_of(0), Some(1));
        assert_eq!(victim_of(2), Some(3));
        assert_eq!(victim_of(4), Some(5));
        let two_victims = view_of(&[20_000.0, 180_000.0, 40_000.0, 150_000.0, 60_000.0, 100_000.0]);
        assert_eq!(want_to_steal(&two_victims, 4, &cfg, &state, NOW_MS), None);
    }

    #[test]
    fn pinned_shards_do_not_skew_the_reference() {
        // Proves a shard holding one partition hotter than the level is neither asked (it has
        // nothing to give) nor counted in the reference (else everyone else looks underloaded).
        let cfg = BalanceConfig::default();
        let mut view = View::new(4);
        let mut pinned = report(0, 900_000.0, 1);
        pinned.hottest = vec![partition(42, 900_000.0)];
        view.update(pinned);
        for (shard, load) in [(1, 100_000.0), (2, 95_000.0), (3, 105_000.0)] {
            view.update(report(shard, load, 4));
        }
        let census = Census::of(&view, &cfg, NOW_MS);
        assert_eq!(census.mean_events_per_s, 300_000.0);
        assert_eq!(census.reference_events_per_s, 100_000.0);
        assert_eq!(census.victim_count(), 0);
        for shard in 1..4 {
            let request = census.steal_for(shard, &cfg, &ShardState::new(), NOW_MS);
            assert_eq!(request, None);
        }
        // A hot partition that shares its shard is not pinned: its neighbours are taken away,
        // so that it ends up alone.
        let mut crowded = report(0, 960_000.0, 5);
        crowded.sequence = 2;
        crowded.hottest = vec![partition(42, 900_000.0), partition(43, 60_000.0)];
        view.update(crowded);
        let census = Census::of(&view, &cfg, NOW_MS);
        assert_eq!(census.reference_events_per_s, 120_000.0);
        let request = census.steal_for(2, &cfg, &ShardState::new(), NOW_MS);
        assert_eq!(request.map(|r| r.victim), Some(0));
    }

    #[test]
    fn thief_settles_after_a_migration_and_backs_off_after_refusal() {
        // Proves a thief does not ask again until peers have seen its new load, and after a
        // lasting refusal asks a different victim.
        let cfg = BalanceConfig::default();
        let view = view_of(&[20_000.0, 180_000.0, 100_000.0, 170_000.0, 30_000.0]);
        let mut state = ShardState::new();
        state.begin(Migration { partition: 5, peer: 1, direction: Direction::In, started_ms: NOW_MS - 500 });
        state.finish(5, NOW_MS - 100);
        assert_eq!(want_to_steal(&view, 0, &cfg, &state, NOW_MS), None);
        let settled_ms = NOW_MS - 100 + cfg.settle_ms;
        let request = want_to_steal(&view, 0, &cfg, &state, settled_ms).expect("settled thief asks");
        assert_eq!(request.victim, 1);
        let too_hot = Refusal::TooHot { ideal_events_per_s: 1.0, lightest_events_per_s: 2.0 };
        state.note_refusal(1, &too_hot, settled_ms, &cfg);
        let retry = want_to_steal(&view, 0, &cfg, &state, settled_ms).expect("asks someone else");
        assert_eq!(retry.victim, 3);
        let busy = Refusal::AlreadyMigrating { partition: 1 };
        let mut other = ShardState::new();
        other.note_refusal(1, &busy, settled_ms, &cfg);
        assert_eq!(want_to_steal(&view, 0, &cfg, &other, settled_ms).map(|r| r.victim), Some(1));
    }

    #[test]
    fn stale_reports_are_ignored() {
        // Proves a peer silent for longer than report_stale_ms is not asked: the same view with
        // a longer staleness limit does produce a request.
        let cfg = BalanceConfig::default();
        let mut view = View::new(4);
        for shard in 0..3 {
            view.update(report(shard, 100_000.0, 4));
        }
        let mut stale = report(3, 500_000.0, 8);
        stale.at_ms = NOW_MS - cfg.report_stale_ms - 1;
        view.update(stale);
        assert_eq!(want_to_steal(&view, 0, &cfg, &ShardState::new(), NOW_MS), None);
        let patient = BalanceConfig { report_stale_ms: 10 * cfg.report_stale_ms, ..cfg };
        let request = want_to_steal(&view, 0, &patient, &ShardState::new(), NOW_MS);
        assert_eq!(request.map(|r| r.victim), Some(3));
    }
}
