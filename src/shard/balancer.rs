//! Gossip and stealing on a running shard: the glue between the pure rule in
//! [`crate::balance`] and the shard's partitions and mesh.
//!
//! Every `report_interval_ms` each shard samples its partitions' rates,
//! publishes a [`LoadReport`] to every peer, and, if rebalancing is on and the
//! rule says so, asks the most loaded peer for work. The owner answers by
//! starting a migration ([`crate::shard::migration`]) or with a refusal.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::balance::{
    BalanceConfig, Cooldowns, Direction, LoadReport, Migration, PartitionLoad, Refusal, ShardState, View,
    hottest_partitions, pick_partition, want_to_steal,
};
use crate::shard::Shard;
use crate::shard::frame::Frame;

/// How long a thief waits for an answer to a steal request before it may ask
/// again (an answer is a refusal or the placement update of a migration).
const STEAL_REQUEST_TIMEOUT_MS: u64 = 1000;

/// Milliseconds on the process-wide monotonic clock (shared by all shards,
/// so report ages compare across them).
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// One shard's balancer state.
pub struct Balancer {
    pub config: BalanceConfig,
    pub enabled: bool,
    pub view: View,
    pub state: ShardState,
    pub cooldowns: Cooldowns,
    report_sequence: u64,
    last_sample_ms: Option<u64>,
    /// This shard's partition loads at the last sample, for `pick_partition`.
    loads: Vec<PartitionLoad>,
    pub events_per_s: f64,
    pub bytes_per_s: f64,
    /// (victim, sent_ms) of the steal request waiting for an answer.
    pending_request: Option<(u16, u64)>,
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
}

impl Balancer {
    pub fn new(config: BalanceConfig, enabled: bool, shard_count: u16) -> Balancer {
        Balancer {
            config,
            enabled,
            view: View::new(shard_count),
            state: ShardState::new(),
            cooldowns: Cooldowns::new(),
            report_sequence: 0,
            last_sample_ms: None,
            loads: Vec::new(),
            events_per_s: 0.0,
            bytes_per_s: 0.0,
            pending_request: None,
            counters: BalanceCounters::default(),
        }
    }

    /// Forgets the outstanding steal request (it was answered).
    pub fn request_answered(&mut self) {
        self.pending_request = None;
    }

    /// The hottest partition's rate this shard owns.
    pub fn hottest_events_per_s(&self) -> f64 {
        self.loads.iter().map(|load| load.events_per_s).fold(0.0, f64::max)
    }
}

impl Shard {
    /// The gossip loop: sample, report, maybe ask for work.
    pub(super) async fn run_balancer(&self) {
        let interval = Duration::from_millis(self.balancer.borrow().config.report_interval_ms);
        loop {
            glommio::timer::sleep(interval).await;
            self.balance_tick(now_ms());
        }
    }

    fn balance_tick(&self, now_ms: u64) {
        let report = self.sample_load(now_ms);
        for peer in (0..self.shard_count).filter(|&peer| peer != self.id) {
            self.outbox.send(peer, Frame::Load(report.clone()), &self.metrics);
        }
        let migrating = self.is_migrating();
        let mut balancer = self.balancer.borrow_mut();
        balancer.view.update(report);
        if !balancer.enabled || migrating {
            return;
        }
        if let Some((_, sent_ms)) = balancer.pending_request
            && now_ms < sent_ms + STEAL_REQUEST_TIMEOUT_MS
        {
            return;
        }
        let Some(request) = want_to_steal(&balancer.view, self.id, &balancer.config, &balancer.state, now_ms) else {
            return;
        };
        balancer.pending_request = Some((request.victim, now_ms));
        balancer.counters.steal_requests_sent += 1;
        let frame = Frame::StealRequest {
            thief_events_per_s: request.thief_events_per_s,
            victim_events_per_s: request.victim_events_per_s,
        };
        drop(balancer);
        self.outbox.send(request.victim, frame, &self.metrics);
    }

    /// Samples every owned partition's rate and builds this shard's report.
    fn sample_load(&self, now_ms: u64) -> LoadReport {
        let migrating = self.is_migrating();
        let mut balancer = self.balancer.borrow_mut();
        let elapsed_ms = balancer.last_sample_ms.map_or(0, |last| now_ms - last);
        let mut partitions = self.partitions.borrow_mut();
        let mut loads = Vec::with_capacity(partitions.owned_count() as usize);
        for (partition_id, partition) in partitions.iter_mut() {
            if balancer.last_sample_ms.is_some() {
                partition.sample_rates(elapsed_ms, now_ms);
            }
            loads.push(PartitionLoad {
                partition: partition_id,
                events_per_s: partition.events_rate.value(),
                bytes_per_s: partition.bytes_rate.value(),
            });
        }
        balancer.last_sample_ms = Some(now_ms);
        balancer.events_per_s = loads.iter().map(|load| load.events_per_s).sum();
        balancer.bytes_per_s = loads.iter().map(|load| load.bytes_per_s).sum();
        balancer.report_sequence += 1;
        let report = LoadReport {
            shard: self.id,
            sequence: balancer.report_sequence,
            at_ms: now_ms,
            events_per_s: balancer.events_per_s,
            bytes_per_s: balancer.bytes_per_s,
            // Not measured yet: glommio 0.9 exposes no cheap per-interval
            // busy time; the rule does not use it.
            busy_ratio: 0.0,
            credit_stalls: self.metrics.credit_stalls.get(),
            partitions_owned: partitions.owned_count(),
            migrating,
            hottest: hottest_partitions(&loads),
        };
        balancer.loads = loads;
        report
    }

    /// A thief asks this shard for a partition.
    pub(super) fn on_steal_request(&self, thief: u16, thief_events_per_s: f64) {
        let now_ms = now_ms();
        let choice = {
            let balancer = self.balancer.borrow();
            if self.migrations.borrow().is_busy() {
                Err(Refusal::AlreadyMigrating { partition: u32::MAX })
            } else {
                // The loads are from the last sample: drop partitions that
                // left since (a partition is only ever moved by its owner).
                let partitions = self.partitions.borrow();
                let owned: Vec<PartitionLoad> =
                    balancer.loads.iter().filter(|load| partitions.get(load.partition).is_some()).cloned().collect();
                pick_partition(
                    &owned,
                    balancer.events_per_s,
                    thief_events_per_s,
                    &balancer.config,
                    &balancer.cooldowns,
                    &balancer.state,
                    now_ms,
                )
            }
        };
        match choice {
            Ok(partition) => {
                let mut balancer = self.balancer.borrow_mut();
                let migration = Migration { partition, peer: thief, direction: Direction::Out, started_ms: now_ms };
                balancer.state.begin(migration);
                balancer.counters.migrations_started += 1;
                drop(balancer);
                self.start_migration(partition, thief);
            }
            Err(refusal) => {
                self.balancer.borrow_mut().counters.steal_refusals_sent += 1;
                self.outbox.send(thief, Frame::StealRefused(refusal), &self.metrics);
            }
        }
    }

    /// Ends the balancer's record of the migration of `partition`, if it is
    /// the one it recorded (a shard can be in the protocol for a partition
    /// the balancer did not start, e.g. a thief already busy as an owner).
    pub(super) fn finish_recorded_migration(&self, partition: u32, now_ms: u64) {
        let mut balancer = self.balancer.borrow_mut();
        if balancer.state.migration().is_some_and(|migration| migration.partition == partition) {
            balancer.state.finish(partition, now_ms);
        }
    }

    pub(super) fn on_steal_refused(&self, victim: u16, refusal: Refusal) {
        let mut balancer = self.balancer.borrow_mut();
        let config = balancer.config.clone();
        balancer.state.note_refusal(victim, &refusal, now_ms(), &config);
        balancer.counters.steal_refusals_received += 1;
        balancer.request_answered();
    }
}
