//! The cluster simulator over many seeds: the real replication code (raft-rs
//! groups, placement, reconfiguration, quiet groups, foca membership) on a
//! simulated network, disks and clock, with joins, leaves, crashes and link
//! cuts; every invariant is checked after every step and a failure names
//! the seed that replays it (`spate simulate --nodes N --seed S`).

use spate::replication::sim::{ClusterSim, ClusterSimConfig, ClusterSimReport};

fn run_seeds(base: ClusterSimConfig, seeds: std::ops::Range<u64>) -> Vec<ClusterSimReport> {
    seeds
        .map(|seed| {
            let config = ClusterSimConfig { seed, ..base };
            let simulation = ClusterSim::new(config).unwrap_or_else(|error| panic!("{error}"));
            simulation.run().unwrap_or_else(|violation| panic!("{violation}"))
        })
        .collect()
}

/// Over 120 seeds of five nodes (RF 3, 16 partitions, 60 simulated s each,
/// faults every ~4 s), no invariant breaks, and the runs are not vacuous:
/// proposals are acknowledged, leaders change, and every kind of event
/// happens somewhere.
#[test]
fn five_nodes_hold_every_invariant_for_many_seeds() {
    let reports = run_seeds(ClusterSimConfig::default(), 0..120);
    let total = |field: fn(&ClusterSimReport) -> u64| reports.iter().map(field).sum::<u64>();
    assert!(total(|report| report.acks) > 50_000, "too few acknowledgements");
    assert!(total(|report| report.joins) > 10 && total(|report| report.leaves) > 10);
    assert!(total(|report| report.crashes) > 10 && total(|report| report.cuts) > 10);
    assert!(reports.iter().all(|report| report.leaders_seen >= 16));
}

/// Three nodes with RF 3 (every crash takes a third of every group) and
/// seven nodes with 64 partitions and a lossy network, a few seeds each.
#[test]
fn other_shapes_hold_every_invariant() {
    let three = ClusterSimConfig { nodes: 3, ..ClusterSimConfig::default() };
    run_seeds(three, 1000..1030);
    let seven = ClusterSimConfig { nodes: 7, partitions: 64, drop_per_mille: 100, ..ClusterSimConfig::default() };
    run_seeds(seven, 2000..2006);
}
