//! Where a (stream, partition) group's replicas should live: weighted
//! rendezvous hashing (highest random weight, HRW) of the group over the live
//! members, so every node that sees the same members computes the same
//! answer with no coordinator and no shared table.
//!
//! Each member `m` scores a group `g` as `weight(m) / -ln(u(g, m))`, where
//! `u` is a stable 64-bit hash of `(stream id, partition, member)` mapped into
//! the open interval (0, 1). This is the logarithmic method of weighted
//! rendezvous hashing (Schindelhauer and Schomaker, 2005; also Resch's
//! "weighted HRW"): a member with twice the weight wins twice as many first
//! places, and the ranking of two members never depends on a third, which is
//! what makes it stable:
//!
//! - a member that joins takes a first place from about `1/N` of the groups
//!   and a place in the top `RF` of about `RF/N` of them, and nothing else
//!   moves;
//! - a member that leaves gives up exactly its own places: every other
//!   member keeps its place in every group's ranking (the ones below move up
//!   by one).
//!
//! The desired replica set is the top `RF` of the ranking. The preferred
//! leader is its first, except where [`balanced_leaders`] evens out a
//! stream's leaderships: first places are binomial (a node of four may be
//! first in 50 or 78 of 256 groups), and the leader does the work of the
//! group (it takes the proposals and sends every append), so the leaders
//! of a stream's partitions are moved, each within its own desired set,
//! from members with more to members with fewer until no such move is
//! left. Every node computes the same answer from the same members and
//! partition count, and only leadership (no data) moves for it. The weight is a member's *capacity* (its shard
//! count, from its gossiped [`LoadSummary`](crate::cluster::load::LoadSummary)),
//! not its instantaneous load: a weight that followed load would move
//! replicas every time traffic shifted, and moving a replica copies its log.
//! Load is levelled by moving leadership (no data moves) in a later step.
//!
//! The hash is xxh3-64 over the little-endian bytes of
//! `(stream_id: u32, partition: u32, member: u64)`: stable across restarts,
//! versions and machines (test vectors below), because every node must rank
//! the same way.

use crate::replication::{GroupId, ReplicaId};

/// The most replicas a group may ask for. Raft groups larger than 7 buy no
/// safety worth their write amplification; the bound keeps the ranking's
/// scratch on the stack.
pub const REPLICATION_FACTOR_MAX: usize = 7;

/// A live member the placement may choose, with its capacity weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub replica: ReplicaId,
    /// Relative capacity, above 0 (a member's shard count; 1 if unknown).
    /// A weight that is not a positive finite number counts as 1.
    pub weight: f64,
}

/// A group's desired replicas, best first: `replicas[0]` is the preferred
/// leader.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredReplicas {
    pub replicas: Vec<ReplicaId>,
    /// Members wanted as learners beyond the voters: every other live
    /// member for a group that must reach every node (the catalog,
    /// [`crate::replication::node`] "The catalog group"); empty otherwise.
    pub learners: Vec<ReplicaId>,
}

impl DesiredReplicas {
    /// The preferred leader: the first in the ranking.
    pub fn preferred_leader(&self) -> Option<ReplicaId> {
        self.replicas.first().copied()
    }

    pub fn contains(&self, replica: ReplicaId) -> bool {
        self.replicas.contains(&replica)
    }

    /// Whether `replica` is wanted as a voter or as a learner.
    pub fn wants(&self, replica: ReplicaId) -> bool {
        self.replicas.contains(&replica) || self.learners.contains(&replica)
    }
}

/// The stable 64-bit hash of a (group, member) pair (module doc).
pub fn pair_hash(group: GroupId, replica: ReplicaId) -> u64 {
    let mut bytes = [0u8; 16];
    bytes[..4].copy_from_slice(&group.stream_id.to_le_bytes());
    bytes[4..8].copy_from_slice(&group.partition.to_le_bytes());
    bytes[8..].copy_from_slice(&replica.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&bytes)
}

/// Member `candidate`'s score for `group`: `weight / -ln(u)` with `u` in (0, 1).
pub fn score(group: GroupId, candidate: Candidate) -> f64 {
    let weight = if candidate.weight.is_finite() && candidate.weight > 0.0 { candidate.weight } else { 1.0 };
    // The top 53 bits, shifted to the middle of their cell: never 0, never 1.
    let unit = ((pair_hash(group, candidate.replica) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    weight / -unit.ln()
}

/// Every candidate ranked for `group`, best first; ties (equal scores, which
/// needs equal hashes) go to the lower replica id, so the order is total.
pub fn rank(group: GroupId, candidates: &[Candidate]) -> Vec<ReplicaId> {
    let mut scored: Vec<(f64, ReplicaId)> =
        candidates.iter().map(|candidate| (score(group, *candidate), candidate.replica)).collect();
    scored.sort_by(|left, right| right.0.total_cmp(&left.0).then(left.1.cmp(&right.1)));
    scored.dedup_by_key(|entry| entry.1);
    scored.into_iter().map(|(_, replica)| replica).collect()
}

/// The top `replication_factor` of the ranking (fewer if there are fewer
/// candidates; at most [`REPLICATION_FACTOR_MAX`]).
pub fn desired_replicas(group: GroupId, candidates: &[Candidate], replication_factor: usize) -> DesiredReplicas {
    let mut replicas = rank(group, candidates);
    replicas.truncate(replication_factor.clamp(1, REPLICATION_FACTOR_MAX));
    DesiredReplicas { replicas, learners: Vec::new() }
}

/// Passes of [`balanced_leaders`] over a stream's groups; each move lowers
/// the sum of squared counts, so it stops well before in practice.
const BALANCE_PASSES_MAX: usize = 16;

/// The desired replicas of each of a stream's `partitions` groups (index =
/// partition), with preferred leaders balanced by count (module doc): a
/// group's leadership moves to another of its desired replicas that leads
/// at least two fewer groups of the stream, until no group has such a
/// replica. Deterministic: equal counts go to the earlier in the ranking.
pub fn balanced_leaders(
    stream_id: u32,
    partitions: u32,
    candidates: &[Candidate],
    replication_factor: usize,
) -> Vec<DesiredReplicas> {
    let mut sets: Vec<DesiredReplicas> = (0..partitions)
        .map(|partition| desired_replicas(GroupId { stream_id, partition }, candidates, replication_factor))
        .collect();
    let mut counts: std::collections::HashMap<ReplicaId, usize> = std::collections::HashMap::new();
    for set in &sets {
        if let Some(first) = set.preferred_leader() {
            *counts.entry(first).or_default() += 1;
        }
    }
    for _ in 0..BALANCE_PASSES_MAX {
        let mut moved = false;
        for set in &mut sets {
            let Some(leader) = set.preferred_leader() else { continue };
            let leader_count = counts.get(&leader).copied().unwrap_or(0);
            let fewest = set
                .replicas
                .iter()
                .enumerate()
                .skip(1)
                .min_by_key(|(rank, replica)| (counts.get(replica).copied().unwrap_or(0), *rank));
            let Some((rank, &other)) = fewest else { continue };
            if counts.get(&other).copied().unwrap_or(0) + 1 < leader_count {
                let chosen = set.replicas.remove(rank);
                set.replicas.insert(0, chosen);
                *counts.entry(leader).or_default() -= 1;
                *counts.entry(other).or_default() += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(count: u64) -> Vec<Candidate> {
        (1..=count).map(|replica| Candidate { replica: replica * 7919, weight: 1.0 }).collect()
    }

    fn groups(count: u32) -> impl Iterator<Item = GroupId> {
        (0..count).map(|index| GroupId { stream_id: index % 3, partition: index })
    }

    /// The hash is pinned: these vectors change only if placement changes
    /// for every cluster, which would move every replica on upgrade.
    #[test]
    fn pair_hash_test_vectors() {
        let group = GroupId { stream_id: 1, partition: 2 };
        assert_eq!(pair_hash(group, 3), xxhash_rust::xxh3::xxh3_64(&[1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]));
        assert_eq!(pair_hash(group, 3), 11_174_855_311_262_025_031);
        let first = desired_replicas(GroupId { stream_id: 0, partition: 0 }, &members(5), 3);
        assert_eq!(first.replicas.len(), 3);
        assert_eq!(first, desired_replicas(GroupId { stream_id: 0, partition: 0 }, &members(5), 3));
    }

    /// The ranking depends on the set of candidates, not on their order.
    #[test]
    fn ranking_is_deterministic_and_order_free() {
        let forward = members(6);
        let mut backward = forward.clone();
        backward.reverse();
        for group in groups(200) {
            assert_eq!(rank(group, &forward), rank(group, &backward));
        }
    }

    /// A joining member takes a first place from about 1/N of the groups
    /// and a top-RF place in about RF/N, and every move is to the newcomer.
    #[test]
    fn a_join_moves_about_rf_over_n() {
        let (group_count, replication_factor) = (4000u32, 3usize);
        let before = members(4);
        let mut after = before.clone();
        let newcomer = Candidate { replica: 999_983, weight: 1.0 };
        after.push(newcomer);
        let (mut first_moved, mut replicas_moved) = (0usize, 0usize);
        for group in groups(group_count) {
            let old = desired_replicas(group, &before, replication_factor);
            let new = desired_replicas(group, &after, replication_factor);
            if old.preferred_leader() != new.preferred_leader() {
                assert_eq!(new.preferred_leader(), Some(newcomer.replica));
                first_moved += 1;
            }
            let gained: Vec<_> = new.replicas.iter().filter(|replica| !old.contains(**replica)).collect();
            assert!(gained.iter().all(|replica| **replica == newcomer.replica));
            replicas_moved += gained.len();
        }
        let first_share = first_moved as f64 / f64::from(group_count);
        let replica_share = replicas_moved as f64 / f64::from(group_count);
        assert!((first_share - 1.0 / 5.0).abs() < 0.03, "first places moved: {first_share}");
        assert!((replica_share - 3.0 / 5.0).abs() < 0.05, "replicas moved: {replica_share}");
    }

    /// A leaving member gives up its own places only: every other member's
    /// relative order in every group is unchanged.
    #[test]
    fn a_leave_moves_only_the_leavers_places() {
        let before = members(6);
        let leaver = before[2].replica;
        let after: Vec<Candidate> = before.iter().copied().filter(|candidate| candidate.replica != leaver).collect();
        for group in groups(2000) {
            let mut old = rank(group, &before);
            old.retain(|replica| *replica != leaver);
            assert_eq!(old, rank(group, &after));
            let old_set = desired_replicas(group, &before, 3);
            let new_set = desired_replicas(group, &after, 3);
            if !old_set.contains(leaver) {
                assert_eq!(old_set, new_set, "{group:?} moved without the leaver");
            }
        }
    }

    /// Balanced leaders keep every group's desired set, give each of four
    /// members 64 +- 1 of 256 leaderships (plain first places spread much
    /// wider), and are the same whatever the candidates' order.
    #[test]
    fn balanced_leaders_even_out_first_places_within_the_desired_sets() {
        let candidates = members(4);
        let balanced = balanced_leaders(7, 256, &candidates, 3);
        let mut counts = std::collections::BTreeMap::new();
        let mut plain_counts = std::collections::BTreeMap::new();
        for (partition, set) in balanced.iter().enumerate() {
            let group = GroupId { stream_id: 7, partition: partition as u32 };
            let plain = desired_replicas(group, &candidates, 3);
            let (mut sorted, mut plain_sorted) = (set.replicas.clone(), plain.replicas.clone());
            sorted.sort_unstable();
            plain_sorted.sort_unstable();
            assert_eq!(sorted, plain_sorted, "partition {partition}: the desired set changed");
            *counts.entry(set.preferred_leader()).or_insert(0) += 1;
            *plain_counts.entry(plain.preferred_leader()).or_insert(0) += 1;
        }
        assert!(counts.values().all(|count| (63..=65).contains(count)), "balanced {counts:?}, plain {plain_counts:?}");
        let mut reversed = candidates.clone();
        reversed.reverse();
        assert_eq!(balanced, balanced_leaders(7, 256, &reversed, 3));
    }

    /// A member with twice the weight wins about twice as many first places;
    /// a nonsense weight counts as 1.
    #[test]
    fn weights_scale_first_places() {
        let mut candidates = members(3);
        candidates[0].weight = 2.0;
        let mut firsts = [0usize; 3];
        for group in groups(8000) {
            let first = rank(group, &candidates)[0];
            firsts[candidates.iter().position(|candidate| candidate.replica == first).unwrap_or(0)] += 1;
        }
        let heavy = firsts[0] as f64 / 8000.0;
        assert!((heavy - 0.5).abs() < 0.03, "weight 2 of 4 took {heavy} of first places: {firsts:?}");
        let nonsense = Candidate { replica: 5, weight: f64::NAN };
        let one = Candidate { replica: 5, weight: 1.0 };
        assert_eq!(
            score(GroupId { stream_id: 0, partition: 1 }, nonsense),
            score(GroupId { stream_id: 0, partition: 1 }, one)
        );
    }
}
