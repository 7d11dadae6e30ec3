//! What shards tell each other: load reports, the view built from them, and the rate average.
//!
//! Everything here is plain data. A shard fills a [`LoadReport`] every report interval and
//! sends a copy to every peer; each peer keeps the latest one per shard in its [`View`]. Time is
//! always passed in (`now_ms`, milliseconds on the process-wide monotonic clock), never read,
//! so the simulator can drive the same code with a simulated clock.

use serde::Serialize;

/// How many of its hottest partitions a shard lists in a report.
///
/// Costs `HOTTEST_PARTITIONS_MAX * size_of::<PartitionLoad>()` = 192 bytes per report, and a view
/// holds one report per shard (192 KiB for 1024 shards). Eight is enough for an operator to see
/// what is hot and for a thief to judge a victim, while keeping a report a few cache lines.
pub const HOTTEST_PARTITIONS_MAX: usize = 8;

/// The most shards a view can index: shard ids are `u16` on the wire, and 4096 is far past the
/// core count of any box this engine targets, so a larger count is a bug, not a big machine.
pub const SHARDS_MAX: u16 = 4096;
// A view holds every shard a server may run.
const _: () = assert!(crate::config::limits::SHARD_COUNT_MAX <= SHARDS_MAX as usize);

/// The measured load of one partition, as the owner sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PartitionLoad {
    pub partition: u32,
    /// Events applied per second, an EWMA (see [`Ewma`]). This is the balancer's load metric.
    pub events_per_s: f64,
    /// Bytes applied per second, an EWMA. Reported for operators; the rule does not use it.
    pub bytes_per_s: f64,
}

/// What a shard publishes to every peer each report interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LoadReport {
    pub shard: u16,
    /// Counts up by one per report from this shard, so a reordered or duplicated report is
    /// recognised and ignored.
    pub sequence: u64,
    /// When the shard measured this, on the process-wide monotonic clock. Peers judge staleness
    /// from it, so a report that sat in a full ring counts as old.
    pub at_ms: u64,
    /// Sum of the shard's partition rates: the load the rule balances.
    pub events_per_s: f64,
    /// Events/s stored over the last report interval alone, not averaged: consolidation spreads
    /// on it once the average is past the gather threshold ([`crate::balance::Consolidator`]).
    pub recent_events_per_s: f64,
    pub bytes_per_s: f64,
    /// Fraction of the last interval the shard's executor spent running tasks, in 0..=1.
    pub busy_ratio: f64,
    /// How many times a connection task on this shard has stopped reading for lack of credits,
    /// since start. A rising count means the shard's destinations are pushing back.
    pub credit_stalls: u64,
    pub partitions_owned: u32,
    /// True while a migration into or out of this shard is in flight: such a shard refuses
    /// steal requests, so thieves skip it.
    pub migrating: bool,
    /// Up to [`HOTTEST_PARTITIONS_MAX`] partitions, hottest first.
    pub hottest: Vec<PartitionLoad>,
}

impl LoadReport {
    /// Asserts the properties every report must have; a violation is a bug in the sender.
    pub fn assert_valid(&self) {
        assert!(self.shard < SHARDS_MAX, "shard {} out of range", self.shard);
        assert!(rate_is_valid(self.events_per_s), "events_per_s {}", self.events_per_s);
        assert!(rate_is_valid(self.recent_events_per_s), "recent_events_per_s {}", self.recent_events_per_s);
        assert!(rate_is_valid(self.bytes_per_s), "bytes_per_s {}", self.bytes_per_s);
        assert!((0.0..=1.0).contains(&self.busy_ratio), "busy_ratio {}", self.busy_ratio);
        assert!(self.hottest.len() <= HOTTEST_PARTITIONS_MAX);
        assert!(self.hottest.len() <= self.partitions_owned as usize);
        for pair in self.hottest.windows(2) {
            assert!(pair[0].events_per_s >= pair[1].events_per_s, "hottest not sorted");
        }
    }
}

fn rate_is_valid(rate: f64) -> bool {
    rate.is_finite() && rate >= 0.0
}

/// Picks the [`HOTTEST_PARTITIONS_MAX`] hottest partitions, hottest first, ties by partition id
/// so the result does not depend on the input order.
pub fn hottest_partitions(partitions: &[PartitionLoad]) -> Vec<PartitionLoad> {
    let mut hottest: Vec<PartitionLoad> = Vec::with_capacity(HOTTEST_PARTITIONS_MAX + 1);
    for candidate in partitions {
        let position = hottest.iter().position(|kept| hotter(candidate, kept)).unwrap_or(hottest.len());
        if position < HOTTEST_PARTITIONS_MAX {
            hottest.insert(position, candidate.clone());
            hottest.truncate(HOTTEST_PARTITIONS_MAX);
        }
    }
    hottest
}

fn hotter(a: &PartitionLoad, b: &PartitionLoad) -> bool {
    a.events_per_s > b.events_per_s || (a.events_per_s == b.events_per_s && a.partition < b.partition)
}

/// The latest report of every shard (including this one), indexed by shard id.
///
/// A full copy lives on every shard; it is the only input of the thief side of the rule.
#[derive(Clone, Debug)]
pub struct View {
    reports: Vec<Option<LoadReport>>,
}

impl View {
    pub fn new(shard_count: u16) -> View {
        assert!(shard_count > 0 && shard_count <= SHARDS_MAX, "shard_count {shard_count}");
        View { reports: vec![None; usize::from(shard_count)] }
    }

    pub fn shard_count(&self) -> u16 {
        // The constructor bounds the length by SHARDS_MAX, so this cannot truncate.
        self.reports.len() as u16
    }

    /// Stores `report` unless the view already holds a newer one from that shard.
    /// Returns whether it was stored.
    pub fn update(&mut self, report: LoadReport) -> bool {
        report.assert_valid();
        let slot = &mut self.reports[usize::from(report.shard)];
        if let Some(held) = slot {
            if held.sequence >= report.sequence {
                return false;
            }
            assert!(report.at_ms >= held.at_ms, "shard {} clock went back", report.shard);
        }
        *slot = Some(report);
        true
    }

    pub fn report(&self, shard: u16) -> Option<&LoadReport> {
        self.reports.get(usize::from(shard)).and_then(Option::as_ref)
    }

    /// How old the held report of `shard` is, or `None` if the view has none.
    pub fn age_ms(&self, shard: u16, now_ms: u64) -> Option<u64> {
        self.report(shard).map(|report| now_ms.saturating_sub(report.at_ms))
    }

    /// The reports no older than `stale_ms`, in shard order. An older report is a peer that has
    /// stopped talking (stuck or overloaded); judging it by what it said long ago would be wrong.
    pub fn fresh(&self, now_ms: u64, stale_ms: u64) -> impl Iterator<Item = &LoadReport> {
        self.reports.iter().flatten().filter(move |report| now_ms.saturating_sub(report.at_ms) <= stale_ms)
    }
}

/// An exponentially weighted moving average with a half-life in milliseconds.
///
/// A half-life, rather than a fixed alpha, makes the average independent of how often it is
/// updated: a sample's weight halves every `half_life_ms` whatever the interval, so a late
/// report interval does not skew the rate. The first sample is taken as is, so a new partition
/// does not look idle while the average warms up.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ewma {
    value: f64,
    half_life_ms: u64,
    updated_ms: Option<u64>,
}

impl Ewma {
    pub fn new(half_life_ms: u64) -> Ewma {
        assert!(half_life_ms > 0, "half_life_ms must be positive");
        Ewma { value: 0.0, half_life_ms, updated_ms: None }
    }

    pub fn value(&self) -> f64 {
        self.value
    }

    pub fn half_life_ms(&self) -> u64 {
        self.half_life_ms
    }

    /// Folds in `sample` (a rate measured over the interval that ends at `now_ms`) and returns
    /// the new average. A second sample at the same instant is ignored: it carries no time.
    pub fn update(&mut self, sample: f64, now_ms: u64) -> f64 {
        assert!(rate_is_valid(sample), "sample {sample}");
        match self.updated_ms {
            None => self.value = sample,
            Some(updated_ms) => {
                assert!(now_ms >= updated_ms, "time went back: {now_ms} < {updated_ms}");
                let elapsed_ms = now_ms - updated_ms;
                if elapsed_ms == 0 {
                    return self.value;
                }
                let keep = (-(elapsed_ms as f64) / self.half_life_ms as f64).exp2();
                self.value = sample + (self.value - sample) * keep;
            }
        }
        self.updated_ms = Some(now_ms);
        assert!(rate_is_valid(self.value));
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(shard: u16, sequence: u64, at_ms: u64, events_per_s: f64) -> LoadReport {
        LoadReport {
            shard,
            sequence,
            at_ms,
            events_per_s,
            recent_events_per_s: events_per_s,
            bytes_per_s: events_per_s * 100.0,
            busy_ratio: 0.5,
            credit_stalls: 0,
            partitions_owned: 4,
            migrating: false,
            hottest: Vec::new(),
        }
    }

    #[test]
    fn ewma_halves_the_distance_every_half_life() {
        // Proves the half-life meaning: after one half-life a step is half absorbed.
        let mut ewma = Ewma::new(1000);
        assert_eq!(ewma.update(100.0, 0), 100.0);
        let after_one = ewma.update(0.0, 1000);
        assert!((after_one - 50.0).abs() < 1e-9, "{after_one}");
        // Two updates of 500 ms weigh the same as one of 1000 ms.
        let mut split = Ewma::new(1000);
        split.update(100.0, 0);
        split.update(0.0, 500);
        let after_split = split.update(0.0, 1000);
        assert!((after_split - 50.0).abs() < 1e-9, "{after_split}");
        // A repeated instant changes nothing.
        assert_eq!(split.update(1e9, 1000), after_split);
        // Before the first sample there is no average to blend with.
        assert_eq!(Ewma::new(1000).update(7.0, 123_456), 7.0);
    }

    #[test]
    fn view_keeps_the_newest_report_and_filters_stale_ones() {
        // Proves a reordered report is ignored and staleness hides silent peers.
        let mut view = View::new(3);
        assert!(view.update(report(1, 2, 200, 10.0)));
        assert!(!view.update(report(1, 1, 100, 99.0)));
        assert_eq!(view.report(1).map(|r| r.events_per_s), Some(10.0));
        assert!(view.update(report(0, 1, 0, 5.0)));
        assert_eq!(view.age_ms(0, 250), Some(250));
        assert_eq!(view.age_ms(2, 250), None);
        let fresh: Vec<u16> = view.fresh(250, 100).map(|r| r.shard).collect();
        assert_eq!(fresh, vec![1]);
    }

    #[test]
    fn hottest_partitions_keeps_the_top_sorted() {
        // Proves the list is bounded, hottest first, and independent of input order.
        let partitions: Vec<PartitionLoad> = (0..20u32)
            .map(|partition| PartitionLoad {
                partition,
                events_per_s: f64::from((partition * 7) % 20),
                bytes_per_s: 0.0,
            })
            .collect();
        let hottest = hottest_partitions(&partitions);
        assert_eq!(hottest.len(), HOTTEST_PARTITIONS_MAX);
        let rates: Vec<f64> = hottest.iter().map(|p| p.events_per_s).collect();
        assert_eq!(rates, vec![19.0, 18.0, 17.0, 16.0, 15.0, 14.0, 13.0, 12.0]);
        let mut reversed = partitions.clone();
        reversed.reverse();
        assert_eq!(hottest_partitions(&reversed), hottest);
    }
}
