//! Gossip and stealing on a running shard: the state between the pure rule
//! in [`crate::balance`] and the shard.
//!
//! Every `report_interval_ms` the shard samples its partitions' rates and
//! publishes a [`LoadReport`] to every peer ([`Balancer::tick`]); if
//! rebalancing is on and the rule says so, it asks the most loaded peer for
//! work. The owner answers ([`Balancer::answer_steal`]) by starting a
//! migration ([`crate::partition::migration`]) or with a refusal. The
//! balancer only decides; the shard sends the frames.

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::balance::{
    BalanceConfig, Consolidation, ConsolidationConfig, Consolidator, Direction, Ledger, LoadReport, Migration,
    PartitionLoad, Refusal, StealRequest, View, gather_target, home_shard, hottest_partitions, pick_partition,
    want_to_steal,
};
use crate::config::{Config, STEAL_REQUEST_TIMEOUT_MS};
use crate::partition::PartitionManager;
use crate::runtime::notify::{Notify, first};

/// The gossip interval while the whole process is idle (no shard reports
/// traffic, nothing migrates), in ms: an idle server wakes once every 5 s
/// per shard for gossip instead of ten times a second. The first batch
/// applied, or the first report of traffic from a peer, brings the normal
/// interval back at once, and the rates' window starts then
/// ([`Balancer::restart_window`]).
pub const GOSSIP_IDLE_INTERVAL_MS: u64 = 5000;
/// The window of the first sample after traffic ended an idle sleep, in
/// ms (at most the report interval).
pub const GOSSIP_WAKE_SAMPLE_MS: u64 = 100;
/// Below this rate (events/s, the balancer's average) a shard counts as
/// idle for the gossip pace: no traffic at all, not merely little.
pub(super) const GOSSIP_IDLE_EVENTS_PER_S: f64 = 1.0;

/// What the balancer takes from the flags (here rather than in `config`,
/// which knows no balancer types).
impl Config {
    /// The balancer's configuration: its defaults, with the flags applied.
    pub fn balance_config(&self) -> BalanceConfig {
        let defaults = BalanceConfig::default();
        let report_interval_ms = self.rebalance_interval_ms.max(1);
        BalanceConfig {
            report_interval_ms,
            report_stale_ms: defaults.report_stale_ms.max(report_interval_ms.saturating_mul(5)),
            cooldown_ms: self.rebalance_cooldown_ms,
            ..defaults
        }
    }

    /// Consolidation's thresholds from the flags; off with `--rebalance off` too (the static
    /// placement stays as it is).
    pub fn consolidation_config(&self) -> ConsolidationConfig {
        ConsolidationConfig {
            enabled: self.rebalance == crate::config::Rebalance::On && self.consolidate == crate::config::Rebalance::On,
            gather_events_per_s_max: self.consolidate_events_per_s_max as f64,
            spread_events_per_s_min: self.spread_events_per_s_min as f64,
            spread_busy_ratio_min: f64::from(self.spread_busy_percent_min) / 100.0,
            gather_hold_ms: self.consolidate_hold_ms,
            ..ConsolidationConfig::default()
        }
    }
}

/// Milliseconds on the process-wide monotonic clock (shared by all shards,
/// so report ages compare across them). Only the engine reads it: the
/// migration state machine and the rule take the time as an argument.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// One shard's balancer state.
pub struct Balancer {
    pub config: BalanceConfig,
    pub enabled: bool,
    pub consolidation_config: ConsolidationConfig,
    /// Whether the process is gathered onto fewer shards, by this shard's view.
    pub consolidator: Consolidator,
    me: u16,
    pub view: View,
    /// Its own migrations, cooldowns and steal request.
    pub ledger: Ledger,
    report_sequence: u64,
    last_sample_ms: Option<u64>,
    /// Executor run time at the last sample, for the busy ratio.
    last_runtime: Option<std::time::Duration>,
    /// This shard's partition loads at the last sample, for `pick_partition`.
    loads: Vec<PartitionLoad>,
    pub events_per_s: f64,
    pub bytes_per_s: f64,
    /// Share of the last interval the executor spent running tasks.
    pub busy_ratio: f64,
    pub counters: BalanceCounters,
}

/// Monotonic balancer counters, for /stats and /metrics.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct BalanceCounters {
    pub steal_requests_sent: u64,
    pub steal_refusals_sent: u64,
    pub steal_refusals_received: u64,
    pub migrations_started: u64,
    pub migrations_completed: u64,
    /// Partitions this shard handed over to gather the process onto fewer shards, or to send
    /// them home after a spread ([`Consolidator`]).
    pub consolidation_moves: u64,
    /// The batches those moves went in (one per [`Balancer::consolidation_move`]).
    pub consolidation_batches: u64,
}

/// What this shard measured for its report, besides its partitions.
pub struct LoadSample {
    pub now_ms: u64,
    /// Total time the executor has spent running tasks (glommio's stats).
    pub runtime: std::time::Duration,
    pub credit_stalls: u64,
    pub migrating: bool,
}

impl Balancer {
    pub fn new(
        config: BalanceConfig,
        enabled: bool,
        consolidation_config: ConsolidationConfig,
        me: u16,
        shard_count: u16,
    ) -> Balancer {
        Balancer {
            config,
            enabled,
            consolidation_config,
            consolidator: Consolidator::new(),
            me,
            view: View::new(shard_count),
            ledger: Ledger::default(),
            report_sequence: 0,
            last_sample_ms: None,
            last_runtime: None,
            loads: Vec::new(),
            events_per_s: 0.0,
            bytes_per_s: 0.0,
            busy_ratio: 0.0,
            counters: BalanceCounters::default(),
        }
    }

    /// No traffic anywhere this shard can see: its own rate and every
    /// peer's last reported rate are below [`GOSSIP_IDLE_EVENTS_PER_S`], and
    /// nothing migrates or waits for an answer.
    pub fn is_idle(&self) -> bool {
        let quiet = |events_per_s: f64| events_per_s < GOSSIP_IDLE_EVENTS_PER_S;
        let peers_quiet = (0..self.view.shard_count())
            .filter(|&shard| shard != self.me)
            .filter_map(|shard| self.view.report(shard))
            .all(|report| quiet(report.events_per_s) && !report.migrating);
        quiet(self.events_per_s)
            && peers_quiet
            && self.ledger.pending_request.is_none()
            && !self.ledger.state.is_migrating()
    }

    /// Consolidation is on and the process is not gathered yet: an idle
    /// process keeps gossiping at the report interval until it is, because
    /// at the idle pace (one report a second) every report is older than
    /// `report_stale_ms` when the next arrives, and the rule decides nothing
    /// without a fresh report of every shard. A server started idle then
    /// gathers within a few report intervals instead of at its first
    /// producer, whose events the moves would meet.
    pub fn gather_pending(&self) -> bool {
        self.consolidation_config.enabled
            && self.view.shard_count() > 1
            && self.consolidator.mode() == Consolidation::Spread
    }

    /// The hottest partition's rate this shard owns.
    pub fn hottest_events_per_s(&self) -> f64 {
        self.loads.iter().map(|load| load.events_per_s).fold(0.0, f64::max)
    }

    /// One gossip interval: samples the partitions' rates into this shard's
    /// report (to publish) and, if the rule says so, a steal request (to
    /// send to its victim).
    pub fn tick(
        &mut self,
        partitions: &mut PartitionManager,
        sample: LoadSample,
    ) -> (LoadReport, Option<StealRequest>) {
        let report = self.sample_load(partitions, &sample);
        self.view.update(report.clone());
        self.ledger.cooldowns.prune(sample.now_ms, self.config.cooldown_ms);
        let stale_ms = self.config.report_stale_ms;
        let mode = self.consolidator.step(&self.view, &self.consolidation_config, stale_ms, sample.now_ms);
        // Nothing is stolen while gathered, nor while partitions go home after a spread.
        let consolidating = mode != Consolidation::Spread || self.consolidator.spreading();
        if !self.enabled
            || consolidating
            || sample.migrating
            || self.ledger.awaiting_answer(sample.now_ms, STEAL_REQUEST_TIMEOUT_MS)
        {
            return (report, None);
        }
        let request = want_to_steal(&self.view, self.me, &self.config, &self.ledger.state, sample.now_ms);
        if let Some(request) = &request {
            self.ledger.request_sent(request.victim, sample.now_ms);
            self.counters.steal_requests_sent += 1;
        }
        (report, request)
    }

    /// Traffic woke the shard from its idle pace: the next sample measures
    /// from now, not from the last idle tick. Idle means the events since
    /// that tick are about none but the waking batch's, so dividing a burst
    /// that follows by the whole idle gap (up to [`GOSSIP_IDLE_INTERVAL_MS`])
    /// would report a fraction of its rate: a thief would then find the
    /// owner's rate below its own and the steal refused.
    pub fn restart_window(&mut self, now_ms: u64, runtime: std::time::Duration) {
        if self.last_sample_ms.is_some() {
            self.last_sample_ms = Some(now_ms);
            self.last_runtime = Some(runtime);
        }
    }

    fn sample_load(&mut self, partitions: &mut PartitionManager, sample: &LoadSample) -> LoadReport {
        let now_ms = sample.now_ms;
        let elapsed_ms = self.last_sample_ms.map_or(0, |last| now_ms.saturating_sub(last));
        self.loads.clear();
        let mut recent_events_per_s = 0.0;
        for (partition_id, partition) in partitions.iter_mut() {
            if self.last_sample_ms.is_some() {
                recent_events_per_s += partition.sample_rates(elapsed_ms, now_ms);
            }
            self.loads.push(PartitionLoad {
                partition: partition_id,
                events_per_s: partition.events_rate.value(),
                bytes_per_s: partition.bytes_rate.value(),
            });
        }
        if let Some(last_runtime) = self.last_runtime
            && elapsed_ms > 0
        {
            let busy_ms = sample.runtime.saturating_sub(last_runtime).as_secs_f64() * 1000.0;
            self.busy_ratio = (busy_ms / elapsed_ms as f64).min(1.0);
        }
        self.last_sample_ms = Some(now_ms);
        self.last_runtime = Some(sample.runtime);
        self.events_per_s = self.loads.iter().map(|load| load.events_per_s).sum();
        self.bytes_per_s = self.loads.iter().map(|load| load.bytes_per_s).sum();
        self.report_sequence += 1;
        LoadReport {
            shard: self.me,
            sequence: self.report_sequence,
            at_ms: now_ms,
            events_per_s: self.events_per_s,
            recent_events_per_s,
            bytes_per_s: self.bytes_per_s,
            busy_ratio: self.busy_ratio,
            credit_stalls: sample.credit_stalls,
            partitions_owned: partitions.owned_count(),
            // A shard whose steal request is out, or that just received a
            // partition, reports itself busy: otherwise, until its placement
            // update arrives, it keeps its thief rank and is paired with one
            // of the most loaded victims, which then gets no request (the
            // simulator measured convergence 2.5x slower without this).
            migrating: sample.migrating
                || self.ledger.pending_request.is_some()
                || self.ledger.state.settling(now_ms, &self.config),
            hottest: hottest_partitions(&self.loads),
        }
    }

    /// A thief asks this shard for a partition: the partition to move (the
    /// migration is recorded as begun), or why not.
    pub fn answer_steal(
        &mut self,
        partitions: &PartitionManager,
        movable: impl Fn(u32) -> bool,
        migrations_busy: bool,
        thief: u16,
        thief_events_per_s: f64,
        now_ms: u64,
    ) -> Result<u32, Refusal> {
        if self.ledger.refuses_steal(migrations_busy) {
            self.counters.steal_refusals_sent += 1;
            return Err(Refusal::AlreadyMigrating { partition: u32::MAX });
        }
        if let Consolidation::Gathered { kept_shards } = self.consolidator.mode() {
            self.counters.steal_refusals_sent += 1;
            return Err(Refusal::Gathered { kept_shards });
        }
        // The loads are from the last sample: drop partitions that left
        // since (a partition is only ever moved by its owner), and those
        // that may not move (their stream is being created or deleted).
        let owned: Vec<PartitionLoad> = self
            .loads
            .iter()
            .filter(|load| partitions.get(load.partition).is_some() && movable(load.partition))
            .cloned()
            .collect();
        let choice = pick_partition(
            &owned,
            self.events_per_s,
            thief_events_per_s,
            &self.config,
            &self.ledger.cooldowns,
            &self.ledger.state,
            now_ms,
        );
        match choice {
            Ok(partition) => {
                let migration = Migration { partition, peer: thief, direction: Direction::Out, started_ms: now_ms };
                self.ledger.state.begin(migration);
                self.counters.migrations_started += 1;
            }
            Err(_) => self.counters.steal_refusals_sent += 1,
        }
        choice
    }

    /// This shard learnt that a partition is migrating to it: the answer to
    /// its steal request (or a migration it did not ask for).
    pub fn migration_began(&mut self, migration: Migration) {
        if migration.direction == Direction::In {
            let (shard_count, hold_ms) = (self.view.shard_count(), self.config.report_stale_ms);
            self.consolidator.partition_arriving(
                self.me,
                migration.partition,
                shard_count,
                migration.started_ms,
                hold_ms,
            );
        }
        self.ledger.migration_began(migration);
    }

    /// This shard's part in moving `partition` ended. A thief records the
    /// cooldown from `moved_ms`, when the old owner handed it over.
    pub fn migration_ended(&mut self, partition: u32, direction: Direction, at_ms: u64, moved_ms: u64) {
        if direction == Direction::In {
            self.counters.migrations_completed += 1;
        }
        self.ledger.migration_ended(partition, direction, at_ms, moved_ms);
    }

    /// The partitions this shard should hand over now for consolidation, as one batch, and to
    /// which shard: while gathered, the lowest-numbered partitions of a shard outside the kept
    /// set, to the least loaded kept shard; after a spread, partitions away from their home, those
    /// of one home shard, to it. At most `batch_max` of them. `owned` lists the partitions this
    /// shard owns that may move now. Records the migration as begun (by the batch's last
    /// partition, the last to be handed over).
    pub fn consolidation_move(
        &mut self,
        owned: impl Iterator<Item = u32>,
        batch_max: usize,
        now_ms: u64,
    ) -> Option<(Vec<u32>, u16)> {
        if self.ledger.state.is_migrating()
            || self.ledger.pending_request.is_some()
            || self.consolidator.holding(now_ms)
        {
            return None;
        }
        let shard_count = self.view.shard_count();
        let mut owned: Vec<u32> = owned.collect();
        owned.sort_unstable();
        let chosen = match self.consolidator.mode() {
            Consolidation::Gathered { kept_shards } if self.me >= kept_shards => {
                let target = gather_target(&self.view, kept_shards, self.config.report_stale_ms, now_ms);
                owned.truncate(batch_max);
                (!owned.is_empty()).then_some((owned, target))
            }
            Consolidation::Spread if self.consolidator.spreading() => {
                let away = owned.iter().copied().find(|&partition| home_shard(partition, shard_count) != self.me);
                if away.is_none() {
                    self.consolidator.spread_done();
                }
                away.map(|first| {
                    let home = home_shard(first, shard_count);
                    owned.retain(|&partition| home_shard(partition, shard_count) == home);
                    owned.truncate(batch_max);
                    (owned, home)
                })
            }
            _ => None,
        };
        let (partitions, to) = chosen?;
        assert_ne!(to, self.me, "a consolidation move goes to another shard");
        let last = *partitions.last().expect("a batch is never empty");
        let migration = Migration { partition: last, peer: to, direction: Direction::Out, started_ms: now_ms };
        self.ledger.state.begin(migration);
        let count = partitions.len() as u64;
        self.counters.migrations_started += count;
        self.counters.consolidation_moves += count;
        self.counters.consolidation_batches += 1;
        Some((partitions, to))
    }

    /// Whether this shard has consolidation work it may do: it is outside the kept set while
    /// gathered, or sending partitions home after a spread.
    pub fn consolidation_due(&self) -> bool {
        match self.consolidator.mode() {
            Consolidation::Gathered { kept_shards } => self.me >= kept_shards,
            Consolidation::Spread => self.consolidator.spreading(),
        }
    }

    pub fn on_refused(&mut self, victim: u16, refusal: &Refusal, now_ms: u64) {
        self.ledger.refused(victim, refusal, now_ms, &self.config);
        self.counters.steal_refusals_received += 1;
    }
}

/// How often the gossip loop runs: every report interval while anything
/// moves, every [`GOSSIP_IDLE_INTERVAL_MS`] while the whole process is idle
/// ([`Balancer::is_idle`]), and at once when traffic shows up again.
#[derive(Default)]
pub struct GossipPace {
    idle: Cell<bool>,
    /// Traffic was seen since the last tick.
    seen: Cell<bool>,
    wake: Notify,
}

impl GossipPace {
    /// Sets the pace after a tick: idle only if `idle` and no traffic came
    /// since the previous tick (a burst the tick's sample did not count yet,
    /// such as one before the first sample, keeps the normal pace, so the
    /// next sample counts it over one interval).
    pub fn set_idle(&self, idle: bool) {
        self.idle.set(idle && !self.seen.replace(false));
    }

    /// Traffic was seen (a batch applied, a peer's report of load): a loop
    /// sleeping its idle interval ticks now.
    #[inline]
    pub fn traffic(&self) {
        self.seen.set(true);
        if self.idle.replace(false) {
            self.wake.notify();
        }
    }

    /// Sleeps until the next tick: `interval`, or the idle interval;
    /// returns whether traffic ended an idle sleep.
    pub async fn sleep(&self, interval: Duration) -> bool {
        if self.idle.get() {
            let idle_interval = glommio::timer::sleep(Duration::from_millis(GOSSIP_IDLE_INTERVAL_MS));
            matches!(first(idle_interval, self.wake.notified()).await, crate::runtime::notify::Either::Right(()))
        } else {
            glommio::timer::sleep(interval).await;
            false
        }
    }
}
