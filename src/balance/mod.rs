//! Load balancing between shards: gossip of load reports, and the rule that decides who steals
//! which partition from whom.
//!
//! # Gossip
//!
//! Every `report_interval_ms` (100 ms) each shard publishes a [`LoadReport`] to every peer: its
//! events/s and bytes/s, busy ratio, credit stalls, how many partitions it owns, whether it is
//! migrating, and its hottest partitions. Each shard keeps the latest report of every shard in
//! its [`View`]: a local picture of the whole process, stale by about one interval. No shard is
//! special and there is no coordinator.
//!
//! # The load metric
//!
//! Load is events per second, averaged by an [`Ewma`] with a half-life of 500 ms. Events, not
//! bytes, because spate's cost is per event (parse, route, append, credit accounting) for the
//! small events it is built for; bytes/s is reported too, for operators and for the day large
//! payloads make copying dominate. Busy ratio is reported but not balanced on: it saturates at 1
//! and cannot tell an overloaded shard from a hopelessly overloaded one. A partition's rate
//! average travels with it on migration, so the new owner's load is right at once.
//!
//! # The rule
//!
//! [`want_to_steal`] (thief side) and [`pick_partition`] (owner side) are pure functions of the
//! view, the shard's own bookkeeping ([`ShardState`], [`Cooldowns`]) and the time.
//!
//! - The *reference* load is the water level of the reported partitions: the mean shard load
//!   once every partition hotter than the level has a shard to itself. One key lives in one
//!   partition, so such a partition cannot be helped; counting it in a plain mean would make
//!   every other shard look underloaded. A shard left alone with such a partition is *pinned*:
//!   it owns one partition and is never asked.
//! - A shard below the reference (`thief_load_ratio_max`, 1.0) asks a peer that is above
//!   `victim_load_ratio_min` (1.15) of it, owns at least two partitions, and is at least
//!   `steal_gap_ratio_min` (0.3) of the reference more loaded than the thief. Near the mean this
//!   is a dead band of +-15%; a badly overloaded peer is helped by any shard below the mean.
//!   Thieves are ranked least loaded first and victims most loaded first, and the i-th thief
//!   asks the i-th victim, so requests spread instead of herding onto one peer.
//! - The owner re-checks with its fresh load (refusing if the gap has closed or it is
//!   migrating), then hands over the partition closest to half the gap that does not overshoot
//!   (the thief may not end above the owner by more than `overshoot_ratio_max` of the gap) and is
//!   not cooling down; otherwise it answers with a [`Refusal`].
//!
//! # Stability
//!
//! - Hysteresis: while no shard is 15% above the reference nothing moves, so noise near the mean
//!   moves nothing; and below `load_min_events_per_s` an idle system moves nothing at all.
//! - No ping-pong: a moved partition is always lighter than the gap, so every move lowers the
//!   sum of squared shard loads; with steady loads moves cannot cycle.
//! - A partition that moved stays put for `cooldown_ms`; a shard is in at most one migration
//!   (in or out) at a time; a thief that just received waits `settle_ms` until its peers have
//!   seen its new load; a thief refused for a lasting reason asks another victim for a while.
//!
//! # Consolidation at low load
//!
//! While the whole process's load fits in fewer shards with room to spare, every partition is
//! gathered onto the lowest-numbered shards with the same ordered migration, and spread back to
//! its home shard when the load rises: [`Consolidator`] decides, with a band of hysteresis
//! between its gather and spread thresholds. See the `consolidate` module for the rule.
//!
//! # Simulation
//!
//! [`sim`] drives these same functions for 64 to 1024 simulated shards with a simulated clock,
//! delayed gossip, migrations that take time, and skewed or shifting workloads, checking the
//! invariants on every tick and printing the seed. With 256 shards and Zipf keys whose hot set
//! changes every 15 s, every hot partition ends alone (imbalance at its bound), the rest is
//! within the band about 5 s after each shift, and no partition moves more than a few times a
//! minute. With `overshoot_ratio_max` at 0 (no overshoot at all), a shifting hotspot stays at
//! twice its bound: two hot partitions that land on one shard are never split.
//!
//! # Example
//!
//! ```
//! use spate::balance::{
//!     BalanceConfig, Cooldowns, LoadReport, PartitionLoad, ShardState, View, pick_partition,
//!     want_to_steal,
//! };
//!
//! let cfg = BalanceConfig::default();
//! let now_ms = 10_000;
//! let mut view = View::new(2);
//! for (shard, events_per_s) in [(0, 20_000.0), (1, 180_000.0)] {
//!     view.update(LoadReport {
//!         shard,
//!         sequence: 1,
//!         at_ms: now_ms - cfg.report_interval_ms,
//!         events_per_s,
//!         recent_events_per_s: events_per_s,
//!         bytes_per_s: events_per_s * 80.0,
//!         busy_ratio: 0.5,
//!         credit_stalls: 0,
//!         partitions_owned: 3,
//!         migrating: false,
//!         hottest: Vec::new(),
//!     });
//! }
//! // Shard 0 is far below the mean and shard 1 far above: 0 asks 1.
//! let request = want_to_steal(&view, 0, &cfg, &ShardState::new(), now_ms).expect("a request");
//! assert_eq!(request.victim, 1);
//! // Shard 1 hands over the partition closest to half the gap (80_000 events/s).
//! let mine = [(7, 100_000.0), (8, 70_000.0), (9, 10_000.0)]
//!     .map(|(partition, events_per_s)| PartitionLoad { partition, events_per_s, bytes_per_s: 0.0 });
//! let chosen = pick_partition(
//!     &mine,
//!     180_000.0,
//!     request.thief_events_per_s,
//!     &cfg,
//!     &Cooldowns::new(),
//!     &ShardState::new(),
//!     now_ms,
//! );
//! assert_eq!(chosen, Ok(8));
//! ```

mod consolidate;
mod report;
mod rule;
pub mod sim;

pub use consolidate::{
    Consolidation, ConsolidationConfig, ConsolidationConfigError, Consolidator, gather_target, home_shard,
};
pub use report::{Ewma, HOTTEST_PARTITIONS_MAX, LoadReport, PartitionLoad, SHARDS_MAX, View, hottest_partitions};
pub use rule::{
    BalanceConfig, BalanceConfigError, Census, Cooldowns, Direction, Ledger, Migration, Refusal, ShardState,
    StealRequest, pick_partition, want_to_steal, water_level_events_per_s,
};
