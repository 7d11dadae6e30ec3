//! Consolidation at low load: gather every partition onto fewer shards while the whole process's
//! load fits in them with room to spare, and spread them out again when the load rises.
//!
//! Why: at a low rate the cost of an event is not its parsing or its append but the wake-ups it
//! causes. A producer's write wakes the shard of its connection, whose batch for a partition
//! another shard owns wakes that shard, whose reply wakes the subscriber's shard: on a VM a
//! cross-CPU wake-up costs about 22 µs of CPU. With every partition on one shard, a write wakes
//! one shard, and an idle shard parks and costs nothing.
//!
//! The decision is a pure function of the view (every shard's latest [`LoadReport`]) and the
//! time, run by every shard on its own copy of the view: the views agree up to one report
//! interval, so the shards agree on the mode without talking about it. The kept shards are the
//! lowest ids (`0..kept_shards`), so every shard names the same ones.
//!
//! - **Gather** while the total load is at most `gather_events_per_s_max` per kept shard, that
//!   is, to `ceil(total / gather_events_per_s_max)` shards (at least one) when that is fewer
//!   than the shards there are, once the load has stayed that low for `gather_hold_ms` (a dip
//!   of a second does not move 256 partitions; a quarter of it when the load is under a quarter
//!   of what the kept shards would carry), or at once while the process is idle (below
//!   `idle_events_per_s_max`), so a server started idle is gathered before traffic arrives.
//! - **Spread** (back to every shard) as soon as the total exceeds `spread_events_per_s_min` per
//!   kept shard, or a kept shard has stayed busier than `spread_busy_ratio_min` for
//!   `spread_busy_hold_ms` (events that cost more than usual: aggregates, large payloads).
//! - **Hysteresis:** the spread threshold is above the gather threshold (2x by default), so a
//!   load near either one moves nothing; after a spread for business, the process gathers again
//!   only once its load has fallen to `regather_load_ratio_max` of the load it spread at, since
//!   the events rate that made the shard too busy would otherwise gather it again at once.
//!
//! In the engine, a shard outside the kept set hands its partitions, in batches
//! (`shard::consolidation`), to the least loaded kept shard with the ordinary ordered migration;
//! after a spread, a shard hands the partitions it holds away from their home (the initial
//! placement, `partition % shards`) back home, a batch per home shard.
//! While gathered no shard steals. The stealing rule ([`crate::balance::want_to_steal`]) takes
//! over again once the spread is done.

use serde::Serialize;

use crate::balance::report::{LoadReport, View};

/// The thresholds of consolidation, with the reason for each default.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConsolidationConfig {
    /// `--consolidate off` keeps every shard in use whatever the load.
    pub enabled: bool,
    /// Gather while the load is at most this per kept shard. On the 2-core VM of the README one
    /// shard costs less CPU per event than two at every rate up to 1 M events/s (wake-ups
    /// dominate: 0.49 against 1.03 µs/event at 1 M, 0.78 against 1.87 at 500 k) with a tail no
    /// worse (p99 0.34 – 0.38 ms against 0.47 – 0.51 at 1 M), and the stall a spread under a fast
    /// ramp once caused went when connections started moving back home. 150 k (the first
    /// default) spread the process at 500 k, where it then used more CPU per event than NATS;
    /// 600 k keeps one shard up to 1 M with room to spare (README, Benchmarks).
    pub gather_events_per_s_max: f64,
    /// Spread as soon as the load exceeds this per kept shard: twice the gather threshold, the
    /// hysteresis band.
    pub spread_events_per_s_min: f64,
    /// Spread when a kept shard's busy ratio (share of the report interval spent running tasks)
    /// stays above this for `spread_busy_hold_ms`, whatever the events rate.
    pub spread_busy_ratio_min: f64,
    /// How long a kept shard must stay busy before the process spreads: five report intervals,
    /// so one slow interval (a migration, a checkpoint) does not spread.
    pub spread_busy_hold_ms: u64,
    /// How long the load must stay low enough before the process gathers.
    pub gather_hold_ms: u64,
    /// After a spread for business, gather again only below this share of the load at the spread.
    pub regather_load_ratio_max: f64,
    /// Below this total rate the process is idle and gathers at once, without `gather_hold_ms`:
    /// a move costs nothing to events that do not exist, and a server started idle is gathered
    /// before its first producer arrives, so the moves never meet traffic.
    pub idle_events_per_s_max: f64,
}

impl Default for ConsolidationConfig {
    fn default() -> ConsolidationConfig {
        ConsolidationConfig {
            enabled: true,
            gather_events_per_s_max: 600_000.0,
            spread_events_per_s_min: 1_200_000.0,
            spread_busy_ratio_min: 0.75,
            spread_busy_hold_ms: 500,
            gather_hold_ms: 2_000,
            regather_load_ratio_max: 0.5,
            idle_events_per_s_max: 1.0,
        }
    }
}

/// Why a [`ConsolidationConfig`] cannot work, with the numbers involved.
#[derive(Clone, Debug, PartialEq)]
pub enum ConsolidationConfigError {
    /// The band is empty or inverted: spreading at or below the gather threshold would flap.
    NoHysteresis {
        gather_events_per_s_max: f64,
        spread_events_per_s_min: f64,
    },
    BusyRatioOutOfRange {
        spread_busy_ratio_min: f64,
    },
    RegatherRatioOutOfRange {
        regather_load_ratio_max: f64,
    },
}

impl ConsolidationConfig {
    /// Checks the relations the decision relies on.
    pub fn validate(&self) -> Result<(), ConsolidationConfigError> {
        let (gather, spread) = (self.gather_events_per_s_max, self.spread_events_per_s_min);
        if !(gather > 0.0 && spread.is_finite() && spread > gather) {
            return Err(ConsolidationConfigError::NoHysteresis {
                gather_events_per_s_max: gather,
                spread_events_per_s_min: spread,
            });
        }
        if !(self.spread_busy_ratio_min > 0.0 && self.spread_busy_ratio_min <= 1.0) {
            return Err(ConsolidationConfigError::BusyRatioOutOfRange {
                spread_busy_ratio_min: self.spread_busy_ratio_min,
            });
        }
        if !(self.regather_load_ratio_max > 0.0 && self.regather_load_ratio_max < 1.0) {
            return Err(ConsolidationConfigError::RegatherRatioOutOfRange {
                regather_load_ratio_max: self.regather_load_ratio_max,
            });
        }
        Ok(())
    }
}

impl std::fmt::Display for ConsolidationConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid consolidation config: {self:?}")
    }
}

impl std::error::Error for ConsolidationConfigError {}

/// Where the process's partitions should live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Consolidation {
    /// Every shard in use; the stealing rule balances them.
    Spread,
    /// Every partition on shards `0..kept_shards`; the others own none and park.
    Gathered { kept_shards: u16 },
}

impl Consolidation {
    /// Whether shard `shard` should own partitions in this mode.
    pub fn keeps(&self, shard: u16) -> bool {
        match self {
            Consolidation::Spread => true,
            Consolidation::Gathered { kept_shards } => shard < *kept_shards,
        }
    }
}

/// The shard a partition lives on when the process is spread and nothing has been stolen: the
/// initial placement ([`crate::partition::PlacementTable::spread`] uses this function).
pub fn home_shard(partition: u32, shard_count: u16) -> u16 {
    assert!(shard_count > 0, "home shard among no shards");
    (partition % u32::from(shard_count)) as u16
}

/// One shard's consolidation state: the mode, and the timers of its hysteresis.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Consolidator {
    mode: Consolidation,
    /// Since when the load has been low enough to gather (to fewer shards than now).
    low_since_ms: Option<u64>,
    /// Since when a kept shard has been busier than `spread_busy_ratio_min`.
    busy_since_ms: Option<u64>,
    /// The load at the last spread for business; gathering waits for it to fall well below.
    busy_spread_events_per_s: Option<f64>,
    /// A spread happened and this shard may still hold partitions away from their home.
    spreading: bool,
    /// Until when this shard keeps partitions and connections that another shard, its view ahead
    /// of this one's, just moved here ([`Consolidator::partition_arriving`]).
    hold_until_ms: u64,
}

impl Default for Consolidator {
    fn default() -> Consolidator {
        Consolidator {
            mode: Consolidation::Spread,
            low_since_ms: None,
            busy_since_ms: None,
            busy_spread_events_per_s: None,
            spreading: false,
            hold_until_ms: 0,
        }
    }
}

impl Consolidator {
    pub fn new() -> Consolidator {
        Consolidator::default()
    }

    pub fn mode(&self) -> Consolidation {
        self.mode
    }

    /// Whether this shard should still send partitions home after a spread.
    pub fn spreading(&self) -> bool {
        self.spreading && self.mode == Consolidation::Spread
    }

    /// This shard holds no partition away from its home any more.
    pub fn spread_done(&mut self) {
        self.spreading = false;
    }

    /// Shard `me` is receiving `partition`, moved by a shard whose view may be a report interval
    /// ahead of this one's (each shard decides the mode on its own copy of the view):
    ///
    /// - while gathered, outside the kept set, a partition homed here: the sender spread the
    ///   process; this shard's view would hand it straight back, a second move of the whole
    ///   batch into a spread (`scripts/bench-gather`: a subscriber's p99 54 ms in the spread
    ///   second, one run in two);
    /// - while spread, a partition homed elsewhere: the sender gathered it here (or it is a
    ///   steal); this shard's view would send the producer connections that follow it back to
    ///   their first shard, which sends them here again, and so on until the views agree
    ///   (about 570 moves each way in 95 ms, the subscriber's p99 73 – 82 ms in that second).
    ///
    /// Either way this shard gives no partition and no connection away for `hold_ms`, time for
    /// its view to show what the sender saw (or, if the views truly disagree, for its own rule to
    /// win as before).
    pub fn partition_arriving(&mut self, me: u16, partition: u32, shard_count: u16, now_ms: u64, hold_ms: u64) {
        let home = home_shard(partition, shard_count) == me;
        let ahead = match self.mode {
            Consolidation::Gathered { .. } => !self.mode.keeps(me) && home,
            Consolidation::Spread => !home,
        };
        if ahead {
            self.hold_until_ms = self.hold_until_ms.max(now_ms + hold_ms);
        }
    }

    /// Whether this shard keeps its partitions and connections for now
    /// ([`Consolidator::partition_arriving`]).
    pub fn holding(&self, now_ms: u64) -> bool {
        now_ms < self.hold_until_ms
    }

    /// Decides the mode from the view at `now_ms`, and returns it. Reports older than
    /// `report_stale_ms` do not count; without a fresh report of every shard the mode stays as
    /// it is (a shard that stopped talking may carry any load).
    pub fn step(&mut self, view: &View, cfg: &ConsolidationConfig, report_stale_ms: u64, now_ms: u64) -> Consolidation {
        let shard_count = view.shard_count();
        if !cfg.enabled || shard_count < 2 {
            self.set(Consolidation::Spread);
            return self.mode;
        }
        let fresh: Vec<_> = view.fresh(now_ms, report_stale_ms).collect();
        if fresh.len() < usize::from(shard_count) {
            self.low_since_ms = None;
            return self.mode;
        }
        let total_events_per_s = total_load(&fresh, self.mode, shard_count, cfg);
        let wanted = kept_shards_for(total_events_per_s, cfg).min(shard_count);
        if let Consolidation::Gathered { kept_shards } = self.mode {
            let spread_events_per_s = f64::from(kept_shards) * cfg.spread_events_per_s_min;
            if total_events_per_s > spread_events_per_s {
                self.busy_spread_events_per_s = None;
                self.set(Consolidation::Spread);
                return self.mode;
            }
            let busy = fresh.iter().any(|report| {
                report.shard < kept_shards && !report.migrating && report.busy_ratio > cfg.spread_busy_ratio_min
            });
            let busy_since_ms = if busy { *self.busy_since_ms.get_or_insert(now_ms) } else { now_ms };
            self.busy_since_ms = busy.then_some(busy_since_ms);
            if busy && now_ms.saturating_sub(busy_since_ms) >= cfg.spread_busy_hold_ms {
                self.busy_spread_events_per_s = Some(total_events_per_s);
                self.set(Consolidation::Spread);
                return self.mode;
            }
        }
        let kept_now = match self.mode {
            Consolidation::Spread => shard_count,
            Consolidation::Gathered { kept_shards } => kept_shards,
        };
        let calm = self
            .busy_spread_events_per_s
            .is_none_or(|spread_at| total_events_per_s <= cfg.regather_load_ratio_max * spread_at);
        if wanted < kept_now && calm {
            let low_since_ms = *self.low_since_ms.get_or_insert(now_ms);
            let idle = total_events_per_s < cfg.idle_events_per_s_max;
            // Far below what the kept shards would carry, a quarter of the hold: a server that
            // missed its idle gather (traffic arrived within its first report intervals, as a
            // benchmark's does) otherwise ran spread, each event waking both shards, for the
            // whole hold: 800 ms/s of CPU at 50 k events/s for 2 s against 250 ms/s gathered.
            let deep = total_events_per_s * DEEP_LOAD_FACTOR <= f64::from(wanted) * cfg.gather_events_per_s_max;
            let hold_ms = if deep { cfg.gather_hold_ms / DEEP_LOAD_FACTOR as u64 } else { cfg.gather_hold_ms };
            if idle || now_ms.saturating_sub(low_since_ms) >= hold_ms {
                self.busy_spread_events_per_s = None;
                self.set(Consolidation::Gathered { kept_shards: wanted });
            }
        } else {
            self.low_since_ms = None;
        }
        self.mode
    }

    fn set(&mut self, mode: Consolidation) {
        if mode == self.mode {
            return;
        }
        if mode == Consolidation::Spread {
            self.spreading = true;
        }
        self.mode = mode;
        self.low_since_ms = None;
        self.busy_since_ms = None;
    }
}

/// A load this many times below what the kept shards would carry gathers after this fraction of
/// `gather_hold_ms`.
const DEEP_LOAD_FACTOR: f64 = 4.0;

/// The process's load as the decision sees it: the sum of the shards' averages, or of their last
/// intervals' rates when that is higher and the average is already past the gather threshold of
/// the shards in use. So a load that arrives all at once (a closed-loop producer on a gathered
/// process) spreads the process an interval or two after it arrives, not once the average (half-life
/// 500 ms) has caught up with it while one shard carries everything; and a short burst on a light
/// load (a producer catching up after a stall) spreads nothing, since its average stays low.
fn total_load(fresh: &[&LoadReport], mode: Consolidation, shard_count: u16, cfg: &ConsolidationConfig) -> f64 {
    let average: f64 = fresh.iter().map(|report| report.events_per_s).sum();
    let recent: f64 = fresh.iter().map(|report| report.recent_events_per_s).sum();
    let kept_shards = match mode {
        Consolidation::Spread => shard_count,
        Consolidation::Gathered { kept_shards } => kept_shards,
    };
    if average > f64::from(kept_shards) * cfg.gather_events_per_s_max { average.max(recent) } else { average }
}

/// How many shards carry `total_events_per_s` at most `gather_events_per_s_max` each (at least one).
fn kept_shards_for(total_events_per_s: f64, cfg: &ConsolidationConfig) -> u16 {
    let shards = (total_events_per_s / cfg.gather_events_per_s_max).ceil();
    if shards.is_finite() && shards < f64::from(u16::MAX) { (shards as u16).max(1) } else { u16::MAX }
}

/// The kept shard a shard outside the kept set hands its partitions to: the least loaded one in
/// the view (ties to the lowest id), so several emptying shards spread what they give.
pub fn gather_target(view: &View, kept_shards: u16, report_stale_ms: u64, now_ms: u64) -> u16 {
    let mut best: Option<(u16, f64)> = None;
    for report in view.fresh(now_ms, report_stale_ms).filter(|report| report.shard < kept_shards) {
        if best.is_none_or(|(shard, load)| report.events_per_s.total_cmp(&load).then(report.shard.cmp(&shard)).is_lt())
        {
            best = Some((report.shard, report.events_per_s));
        }
    }
    best.map_or(0, |(shard, _)| shard)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE_MS: u64 = 500;

    fn view_at(loads: &[(f64, f64)], now_ms: u64) -> View {
        let mut view = View::new(loads.len() as u16);
        for (shard, &(events_per_s, busy_ratio)) in loads.iter().enumerate() {
            view.update(LoadReport {
                shard: shard as u16,
                sequence: now_ms,
                at_ms: now_ms,
                events_per_s,
                recent_events_per_s: events_per_s,
                bytes_per_s: events_per_s * 80.0,
                busy_ratio,
                credit_stalls: 0,
                partitions_owned: 4,
                migrating: false,
                hottest: Vec::new(),
            });
        }
        view
    }

    /// The thresholds these tests exercise the rule with (the first defaults: 150 k gather,
    /// 300 k spread), fixed here so the tests say what the rule does whatever the defaults are.
    fn rule_config() -> ConsolidationConfig {
        ConsolidationConfig {
            gather_events_per_s_max: 150_000.0,
            spread_events_per_s_min: 300_000.0,
            ..ConsolidationConfig::default()
        }
    }

    /// Steps `consolidator` every 100 ms from `from_ms` for `for_ms` with the same loads.
    fn run(consolidator: &mut Consolidator, loads: &[(f64, f64)], from_ms: u64, for_ms: u64) -> Consolidation {
        let cfg = rule_config();
        let mut now_ms = from_ms;
        while now_ms <= from_ms + for_ms {
            consolidator.step(&view_at(loads, now_ms), &cfg, STALE_MS, now_ms);
            now_ms += 100;
        }
        consolidator.mode()
    }

    #[test]
    fn default_config_is_valid_and_a_band_without_hysteresis_is_named() {
        // Proves the defaults pass and a spread threshold at the gather threshold is refused.
        assert_eq!(ConsolidationConfig::default().validate(), Ok(()));
        let flat = ConsolidationConfig { spread_events_per_s_min: 600_000.0, ..ConsolidationConfig::default() };
        assert!(matches!(flat.validate(), Err(ConsolidationConfigError::NoHysteresis { .. })));
    }

    #[test]
    fn low_load_gathers_after_the_hold_and_high_load_spreads_at_once() {
        // Proves the gather waits for gather_hold_ms of low load, to the fewest shards that fit,
        // and a rise past the spread threshold spreads on the next step.
        let mut consolidator = Consolidator::new();
        let low = [(60_000.0, 0.3), (40_000.0, 0.3), (0.0, 0.0), (0.0, 0.0)];
        assert_eq!(run(&mut consolidator, &low, 10_000, 1_900), Consolidation::Spread);
        assert_eq!(run(&mut consolidator, &low, 12_000, 0), Consolidation::Gathered { kept_shards: 1 });
        let medium = [(225_000.0, 0.5), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)];
        assert_eq!(run(&mut consolidator, &medium, 12_100, 5_000), Consolidation::Gathered { kept_shards: 1 });
        let high = [(325_000.0, 0.6), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)];
        assert_eq!(run(&mut consolidator, &high, 17_200, 0), Consolidation::Spread);
        assert!(consolidator.spreading());
        // Spread across four shards, 325 k needs three: it gathers to three after the hold.
        assert_eq!(run(&mut consolidator, &high, 17_300, 2_000), Consolidation::Gathered { kept_shards: 3 });
    }

    #[test]
    fn a_shard_holds_what_a_shard_with_a_later_view_moved_to_it() {
        // Proves a gathered shard that receives partitions homed on it (a kept shard spread
        // first) holds them for the hold time, and a spread shard that receives a partition
        // homed elsewhere (another gathered first) holds too; a partition that arrives as this
        // shard's own view expects holds nothing.
        let mut consolidator = Consolidator::new();
        run(&mut consolidator, &[(100_000.0, 0.3), (0.0, 0.0)], 0, 2_000);
        assert_eq!(consolidator.mode(), Consolidation::Gathered { kept_shards: 1 });
        consolidator.partition_arriving(1, 4, 2, 5_000, 500);
        assert!(!consolidator.holding(5_000), "partition 4's home is shard 0");
        consolidator.partition_arriving(0, 3, 2, 5_000, 500);
        assert!(!consolidator.holding(5_000), "shard 0 is kept");
        consolidator.partition_arriving(1, 3, 2, 5_000, 500);
        assert!(consolidator.holding(5_000) && consolidator.holding(5_499));
        assert!(!consolidator.holding(5_500), "the hold ends");
        run(&mut consolidator, &[(0.0, 0.0), (0.0, 0.0)], 5_600, 0);
        consolidator.partition_arriving(1, 3, 2, 5_600, 500);
        assert!(consolidator.holding(5_600), "idle and gathered: a partition sent home is held too");
        run(&mut consolidator, &[(400_000.0, 0.7), (0.0, 0.0)], 5_700, 0);
        assert_eq!(consolidator.mode(), Consolidation::Spread);
        let mut spread = consolidator.clone();
        spread.hold_until_ms = 0;
        spread.partition_arriving(1, 3, 2, 5_800, 500);
        assert!(!spread.holding(5_800), "spread: a partition sent home is what this view expects");
        spread.partition_arriving(0, 3, 2, 5_800, 500);
        assert!(spread.holding(5_800), "spread: a partition gathered here means the sender gathered");
    }

    #[test]
    fn a_load_far_below_the_threshold_gathers_after_a_quarter_of_the_hold() {
        // Proves the deep-load rule: 30 k events/s (a fifth of the 150 k one kept shard carries)
        // gathers after 500 ms of the 2 s hold, while 100 k (two thirds) still waits for all of it.
        let mut deep = Consolidator::new();
        let light = [(15_000.0, 0.2), (15_000.0, 0.2)];
        assert_eq!(run(&mut deep, &light, 10_000, 400), Consolidation::Spread);
        assert_eq!(run(&mut deep, &light, 10_500, 0), Consolidation::Gathered { kept_shards: 1 });
        let mut near = Consolidator::new();
        let medium = [(50_000.0, 0.3), (50_000.0, 0.3)];
        assert_eq!(run(&mut near, &medium, 10_000, 1_900), Consolidation::Spread);
        assert_eq!(run(&mut near, &medium, 12_000, 0), Consolidation::Gathered { kept_shards: 1 });
    }

    #[test]
    fn a_load_near_either_threshold_does_not_flap() {
        // Proves the hysteresis band: loads wobbling around the gather threshold, once gathered,
        // stay gathered; wobbling around it while spread, stay spread (never below it long enough).
        let mut consolidator = Consolidator::new();
        let cfg = rule_config();
        let mut changes = 0;
        let mut last = consolidator.mode();
        for tick in 0..600u64 {
            let total = if tick % 10 < 5 { 145_000.0 } else { 160_000.0 };
            let now_ms = 10_000 + tick * 100;
            let mode =
                consolidator.step(&view_at(&[(total / 2.0, 0.4), (total / 2.0, 0.4)], now_ms), &cfg, STALE_MS, now_ms);
            changes += usize::from(mode != last);
            last = mode;
        }
        assert_eq!(changes, 0, "never 2 s below the threshold in a row: stays spread");
        let mut gathered = Consolidator::new();
        run(&mut gathered, &[(100_000.0, 0.3), (0.0, 0.0)], 0, 2_000);
        assert_eq!(gathered.mode(), Consolidation::Gathered { kept_shards: 1 });
        for total in [275_000.0, 160_000.0, 295_000.0, 140_000.0] {
            assert_eq!(
                run(&mut gathered, &[(total, 0.5), (0.0, 0.0)], 3_000, 3_000),
                Consolidation::Gathered { kept_shards: 1 }
            );
        }
    }

    #[test]
    fn a_busy_kept_shard_spreads_and_the_load_must_halve_to_gather_again() {
        // Proves the busy trigger: 100 k events/s that keep the kept shard 90% busy for the hold
        // spread the process, and it gathers again only under half of that load.
        let mut consolidator = Consolidator::new();
        run(&mut consolidator, &[(100_000.0, 0.3), (0.0, 0.0)], 0, 2_000);
        assert_eq!(consolidator.mode(), Consolidation::Gathered { kept_shards: 1 });
        assert_eq!(
            run(&mut consolidator, &[(100_000.0, 0.9), (0.0, 0.0)], 3_000, 300),
            Consolidation::Gathered { kept_shards: 1 }
        );
        assert_eq!(run(&mut consolidator, &[(100_000.0, 0.9), (0.0, 0.0)], 3_400, 200), Consolidation::Spread);
        assert_eq!(run(&mut consolidator, &[(60_000.0, 0.5), (40_000.0, 0.5)], 4_000, 10_000), Consolidation::Spread);
        assert_eq!(
            run(&mut consolidator, &[(30_000.0, 0.3), (15_000.0, 0.3)], 15_000, 2_000),
            Consolidation::Gathered { kept_shards: 1 }
        );
    }

    #[test]
    fn a_missing_report_keeps_the_mode_and_off_means_spread() {
        // Proves a shard with no fresh report freezes the decision, and disabling spreads.
        let mut consolidator = Consolidator::new();
        let cfg = rule_config();
        // 80 k in all: low enough to gather after the full hold, not so low that a quarter of
        // it (the deep-load rule) would fit in the 500 ms shard 1's last report stays fresh.
        let mut view = view_at(&[(40_000.0, 0.0), (40_000.0, 0.0)], 0);
        for now_ms in (0..=3_000).step_by(100) {
            let mut report = view.report(0).cloned().expect("reported");
            report.sequence = now_ms + 1;
            report.at_ms = now_ms;
            view.update(report);
            consolidator.step(&view, &cfg, STALE_MS, now_ms);
        }
        assert_eq!(consolidator.mode(), Consolidation::Spread, "shard 1 went silent at 0 ms");
        run(&mut consolidator, &[(50.0, 0.0), (50.0, 0.0)], 4_000, 2_000);
        assert_eq!(consolidator.mode(), Consolidation::Gathered { kept_shards: 1 });
        let off = ConsolidationConfig { enabled: false, ..cfg };
        assert_eq!(
            consolidator.step(&view_at(&[(0.0, 0.0), (0.0, 0.0)], 7_000), &off, STALE_MS, 7_000),
            Consolidation::Spread
        );
    }

    #[test]
    fn a_load_arriving_at_once_spreads_on_the_last_interval_and_a_burst_on_a_light_load_does_not() {
        // Proves the last interval's rate spreads a gathered process once the average is past the
        // gather threshold (200 k average, 1 M in the last interval: over 300 k), while a catch-up
        // burst on a light load (average 50 k, 400 k in one interval) leaves it gathered.
        let cfg = rule_config();
        let with_recent = |average: f64, recent: f64, now_ms: u64| {
            let mut view = view_at(&[(average, 0.5), (0.0, 0.0)], now_ms);
            let mut report = view.report(0).cloned().expect("reported");
            report.recent_events_per_s = recent;
            report.sequence += 1;
            view.update(report);
            view
        };
        let mut consolidator = Consolidator::new();
        run(&mut consolidator, &[(0.0, 0.0), (0.0, 0.0)], 0, 0);
        assert_eq!(consolidator.mode(), Consolidation::Gathered { kept_shards: 1 });
        let burst = consolidator.step(&with_recent(50_000.0, 400_000.0, 1_000), &cfg, STALE_MS, 1_000);
        assert_eq!(burst, Consolidation::Gathered { kept_shards: 1 });
        let average_only = consolidator.step(&with_recent(200_000.0, 200_000.0, 1_100), &cfg, STALE_MS, 1_100);
        assert_eq!(average_only, Consolidation::Gathered { kept_shards: 1 }, "200 k is inside the band");
        let arrived = consolidator.step(&with_recent(200_000.0, 1_000_000.0, 1_200), &cfg, STALE_MS, 1_200);
        assert_eq!(arrived, Consolidation::Spread);
    }

    #[test]
    fn an_idle_process_gathers_at_once() {
        // Proves the idle shortcut: no traffic at all gathers on the first step, while the
        // lightest real load still waits for the hold.
        let mut idle = Consolidator::new();
        assert_eq!(run(&mut idle, &[(0.0, 0.0), (0.5, 0.0)], 1_000, 0), Consolidation::Gathered { kept_shards: 1 });
        let mut light = Consolidator::new();
        assert_eq!(run(&mut light, &[(50.0, 0.0), (0.0, 0.0)], 1_000, 0), Consolidation::Spread);
    }

    #[test]
    fn emptying_shards_give_to_the_least_loaded_kept_shard() {
        // Proves the target is the least loaded kept shard, and home is the initial placement.
        let view = view_at(&[(50_000.0, 0.2), (20_000.0, 0.1), (90_000.0, 0.3), (0.0, 0.0)], 1_000);
        assert_eq!(gather_target(&view, 2, STALE_MS, 1_000), 1);
        assert_eq!(gather_target(&view, 1, STALE_MS, 1_000), 0);
        assert_eq!(home_shard(13, 4), 1);
        assert!(Consolidation::Gathered { kept_shards: 2 }.keeps(1));
        assert!(!Consolidation::Gathered { kept_shards: 2 }.keeps(2));
    }
}
