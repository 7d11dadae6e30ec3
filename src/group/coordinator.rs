//! One consumer group's state on its coordinator shard, as a state machine:
//! members join and leave, partitions are revoked and assigned, commits are
//! recorded. Plain data with the clock passed in; what must be sent comes
//! back as [`Effect`]s.
//!
//! The protocol is cooperative, as Kafka's incremental rebalancing: a
//! partition that must move is first revoked from its holder, and only once
//! the holder's session has written its last event of it and `REVOKED`
//! (it says so with [`GroupState::revoke_done`]) is the partition assigned
//! to its next member. So at any moment each partition is held by at most
//! one live member. A member that does not finish a revocation within the
//! revoke timeout is expelled (its connection is cut), and its partitions
//! move as if it had left.

use crate::group::assign::balance;
use crate::protocol::group::OffsetReset;

/// A member: its subscription id, unique in the process (the shard that
/// holds its connection is in the top 16 bits).
pub type MemberId = u64;

/// The shard that holds a member's connection.
pub fn member_shard(member: MemberId) -> u16 {
    (member >> 48) as u16
}

#[derive(Debug, Clone)]
struct Member {
    id: MemberId,
    reset: OffsetReset,
    /// A revocation was sent to it and is not done: when it must be.
    revoke_deadline_ms: Option<u64>,
}

/// What the coordinator must send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// The member's full set from now on, with where each partition starts:
    /// the group's committed offset, or the member's reset when none.
    Assign { member: MemberId, generation: u64, partitions: Vec<u32>, starts: Vec<Start> },
    /// The member must stop reading these partitions and say when it has.
    Revoke { member: MemberId, generation: u64, partitions: Vec<u32> },
    /// The member missed its revoke deadline: cut its connection.
    Expel { member: MemberId },
}

/// Where a newly assigned partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    Committed(u64),
    Reset(OffsetReset),
}

/// Why a join is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinError {
    MemberLimit { members_max: usize },
    HoldMismatch { group_hold: bool },
}

/// Why a commit is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitError {
    NotAssigned,
}

/// One group of one stream. Partitions are the stream's numbers
/// (`0..partition_count`), not global ids.
#[derive(Debug, Clone)]
pub struct GroupState {
    pub hold: bool,
    pub generation: u64,
    pub rebalances: u64,
    members: Vec<Member>,
    owner: Vec<Option<MemberId>>,
    revoking: Vec<bool>,
    committed: Vec<Option<u64>>,
}

impl GroupState {
    /// A group with no members, and the offsets it committed before (one
    /// per partition, `None` where it never committed).
    pub fn new(committed: Vec<Option<u64>>) -> GroupState {
        let partition_count = committed.len();
        GroupState {
            hold: false,
            generation: 0,
            rebalances: 0,
            members: Vec::new(),
            owner: vec![None; partition_count],
            revoking: vec![false; partition_count],
            committed,
        }
    }

    pub fn partition_count(&self) -> u32 {
        self.owner.len() as u32
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    pub fn members(&self) -> impl Iterator<Item = MemberId> + '_ {
        self.members.iter().map(|member| member.id)
    }

    pub fn committed(&self) -> &[Option<u64>] {
        &self.committed
    }

    /// Partitions held by `member` (revoking ones included), ascending.
    pub fn held_by(&self, member: MemberId) -> Vec<u32> {
        (0..self.partition_count()).filter(|&p| self.owner[p as usize] == Some(member)).collect()
    }

    /// A member joins; the group rebalances.
    pub fn join(
        &mut self,
        member: MemberId,
        reset: OffsetReset,
        hold: bool,
        members_max: usize,
        now_ms: u64,
        revoke_timeout_ms: u64,
    ) -> Result<Vec<Effect>, JoinError> {
        if self.members.is_empty() {
            self.hold = hold;
        } else if self.hold != hold {
            return Err(JoinError::HoldMismatch { group_hold: self.hold });
        }
        if self.members.len() >= members_max {
            return Err(JoinError::MemberLimit { members_max });
        }
        self.members.push(Member { id: member, reset, revoke_deadline_ms: None });
        let mut effects = Vec::new();
        self.rebalance(now_ms, revoke_timeout_ms, &mut effects);
        if !effects.iter().any(|effect| matches!(effect, Effect::Assign { member: m, .. } if *m == member)) {
            // Nothing free for it yet (partitions are being revoked for it):
            // it still learns the generation and its empty set.
            effects.push(self.assign_effect(member));
        }
        Ok(effects)
    }

    /// A member leaves (its connection closed, it timed out, or it said
    /// `LEAVE`): its partitions are free at once, from their last commits.
    pub fn leave(&mut self, member: MemberId, now_ms: u64, revoke_timeout_ms: u64) -> Vec<Effect> {
        let Some(index) = self.members.iter().position(|m| m.id == member) else { return Vec::new() };
        self.members.remove(index);
        for (owner, revoking) in self.owner.iter_mut().zip(self.revoking.iter_mut()) {
            if *owner == Some(member) {
                *owner = None;
                *revoking = false;
            }
        }
        let mut effects = Vec::new();
        self.rebalance(now_ms, revoke_timeout_ms, &mut effects);
        effects
    }

    /// The member has written `REVOKED` for these partitions and reads them
    /// no more: they are free for their next member.
    pub fn revoke_done(
        &mut self,
        member: MemberId,
        partitions: &[u32],
        now_ms: u64,
        revoke_timeout_ms: u64,
    ) -> Vec<Effect> {
        for &partition in partitions {
            let p = partition as usize;
            if p < self.owner.len() && self.owner[p] == Some(member) && self.revoking[p] {
                self.owner[p] = None;
                self.revoking[p] = false;
            }
        }
        let still_revoking = (0..self.owner.len()).any(|p| self.owner[p] == Some(member) && self.revoking[p]);
        if let Some(entry) = self.members.iter_mut().find(|m| m.id == member)
            && !still_revoking
        {
            entry.revoke_deadline_ms = None;
        }
        let mut effects = Vec::new();
        self.rebalance(now_ms, revoke_timeout_ms, &mut effects);
        if self.members.iter().any(|m| m.id == member)
            && !effects.iter().any(|effect| matches!(effect, Effect::Assign { member: m, .. } if *m == member))
        {
            // The member's remaining set, as the protocol promises after REVOKED.
            effects.push(self.assign_effect(member));
        }
        effects
    }

    /// Records a commit from the member holding the partition.
    pub fn commit(&mut self, member: MemberId, partition: u32, next_offset: u64) -> Result<(), CommitError> {
        let p = partition as usize;
        if p >= self.owner.len() || self.owner[p] != Some(member) {
            return Err(CommitError::NotAssigned);
        }
        self.committed[p] = Some(next_offset);
        Ok(())
    }

    /// Records a commit made outside this group's membership: a Kafka
    /// consumer group's, whose members the Kafka face keeps.
    pub fn set_committed(&mut self, partition: u32, next_offset: u64) {
        if let Some(slot) = self.committed.get_mut(partition as usize) {
            *slot = Some(next_offset);
        }
    }

    /// Where a member started in a partition the group never committed: it
    /// becomes the committed offset, so a member that never commits still
    /// resumes there (and a `hold` group holds from there). Returns whether
    /// it changed anything.
    pub fn commit_start(&mut self, partition: u32, offset: u64) -> bool {
        match self.committed.get_mut(partition as usize) {
            Some(slot @ None) => {
                *slot = Some(offset);
                true
            }
            _ => false,
        }
    }

    /// Members whose revoke deadline passed: they are expelled and leave.
    pub fn expire(&mut self, now_ms: u64, revoke_timeout_ms: u64) -> Vec<Effect> {
        let late: Vec<MemberId> = self
            .members
            .iter()
            .filter(|m| m.revoke_deadline_ms.is_some_and(|deadline| deadline <= now_ms))
            .map(|m| m.id)
            .collect();
        let mut effects = Vec::new();
        for member in late {
            effects.push(Effect::Expel { member });
            effects.extend(self.leave(member, now_ms, revoke_timeout_ms));
        }
        effects
    }

    fn assign_effect(&self, member: MemberId) -> Effect {
        let reset = self.members.iter().find(|m| m.id == member).map_or(OffsetReset::Latest, |m| m.reset);
        let partitions: Vec<u32> = (0..self.partition_count())
            .filter(|&p| self.owner[p as usize] == Some(member) && !self.revoking[p as usize])
            .collect();
        let starts = partitions
            .iter()
            .map(|&p| match self.committed[p as usize] {
                Some(offset) => Start::Committed(offset),
                None => Start::Reset(reset),
            })
            .collect();
        Effect::Assign { member, generation: self.generation, partitions, starts }
    }

    /// Moves the group toward the balanced, sticky assignment: free
    /// partitions go to their member at once, held ones are revoked first.
    fn rebalance(&mut self, now_ms: u64, revoke_timeout_ms: u64, effects: &mut Vec<Effect>) {
        let index_of = |id: MemberId| self.members.iter().position(|m| m.id == id);
        let current: Vec<Option<usize>> = self.owner.iter().map(|owner| owner.and_then(index_of)).collect();
        let desired = balance(&current, self.members.len());
        let mut revokes: Vec<(MemberId, Vec<u32>)> = Vec::new();
        let mut gainers: Vec<MemberId> = Vec::new();
        for (p, desired) in desired.iter().enumerate() {
            let want = desired.map(|index| self.members[index].id);
            match self.owner[p] {
                Some(holder) if Some(holder) != want => {
                    if !self.revoking[p] {
                        self.revoking[p] = true;
                        match revokes.iter_mut().find(|(m, _)| *m == holder) {
                            Some((_, list)) => list.push(p as u32),
                            None => revokes.push((holder, vec![p as u32])),
                        }
                    }
                }
                None => {
                    if let Some(member) = want {
                        self.owner[p] = Some(member);
                        if !gainers.contains(&member) {
                            gainers.push(member);
                        }
                    }
                }
                Some(_) => {}
            }
        }
        if revokes.is_empty() && gainers.is_empty() {
            return;
        }
        self.generation += 1;
        self.rebalances += 1;
        for (member, partitions) in revokes {
            if let Some(entry) = self.members.iter_mut().find(|m| m.id == member) {
                entry.revoke_deadline_ms.get_or_insert(now_ms.saturating_add(revoke_timeout_ms));
            }
            effects.push(Effect::Revoke { member, generation: self.generation, partitions });
        }
        for member in gainers {
            effects.push(self.assign_effect(member));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: u64 = 1000;

    fn assigned(effects: &[Effect], member: MemberId) -> Option<Vec<u32>> {
        effects.iter().rev().find_map(|effect| match effect {
            Effect::Assign { member: m, partitions, .. } if *m == member => Some(partitions.clone()),
            _ => None,
        })
    }

    fn revoked(effects: &[Effect], member: MemberId) -> Vec<u32> {
        effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Revoke { member: m, partitions, .. } if *m == member => Some(partitions.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// A join revokes first and assigns only after the holder is done, so a
    /// partition never has two holders.
    #[test]
    fn join_revokes_before_it_assigns() {
        let mut group = GroupState::new(vec![None; 4]);
        let effects = group.join(1, OffsetReset::Earliest, false, 8, 0, TIMEOUT).unwrap();
        assert_eq!(assigned(&effects, 1), Some(vec![0, 1, 2, 3]));
        let effects = group.join(2, OffsetReset::Earliest, false, 8, 0, TIMEOUT).unwrap();
        let moving = revoked(&effects, 1);
        assert_eq!(moving.len(), 2);
        assert_eq!(assigned(&effects, 2), Some(vec![]), "nothing until member 1 lets go");
        group.commit(1, moving[0], 7).unwrap();
        let effects = group.revoke_done(1, &moving, 10, TIMEOUT);
        assert_eq!(assigned(&effects, 2), Some(moving.clone()));
        assert_eq!(assigned(&effects, 1).unwrap().len(), 2);
        let Some(Effect::Assign { starts, .. }) =
            effects.iter().find(|effect| matches!(effect, Effect::Assign { member: 2, .. }))
        else {
            unreachable!()
        };
        assert_eq!(starts[0], Start::Committed(7), "the next member starts at the last commit");
        assert_eq!(group.commit(1, moving[0], 9), Err(CommitError::NotAssigned));
    }

    /// A leaver's partitions are assigned at once; a late reviser is expelled.
    #[test]
    fn leave_and_revoke_timeout() {
        let mut group = GroupState::new(vec![None; 6]);
        group.join(1, OffsetReset::Latest, true, 8, 0, TIMEOUT).unwrap();
        group.join(2, OffsetReset::Latest, true, 8, 0, TIMEOUT).unwrap();
        assert_eq!(
            group.join(3, OffsetReset::Latest, false, 8, 0, TIMEOUT),
            Err(JoinError::HoldMismatch { group_hold: true })
        );
        let effects = group.expire(TIMEOUT, TIMEOUT);
        assert!(effects.contains(&Effect::Expel { member: 1 }));
        assert_eq!(assigned(&effects, 2), Some(vec![0, 1, 2, 3, 4, 5]));
        let effects = group.leave(2, 2 * TIMEOUT, TIMEOUT);
        assert!(effects.is_empty());
        assert_eq!(group.member_count(), 0);
        assert!(group.commit_start(0, 5));
        assert!(!group.commit_start(0, 9), "a start never overrides a commit");
    }

    /// A revoke timeout near u64::MAX puts the deadline at the end of time
    /// (saturated), not wrapped into the past: nobody is expelled at once.
    #[test]
    fn a_huge_revoke_timeout_never_wraps_into_the_past() {
        for timeout_ms in [u64::MAX, 1 << 63] {
            let mut group = GroupState::new(vec![None; 4]);
            let now_ms = 1_000_000;
            group.join(1, OffsetReset::Latest, false, 8, now_ms, timeout_ms).unwrap();
            let effects = group.join(2, OffsetReset::Latest, false, 8, now_ms, timeout_ms).unwrap();
            assert_eq!(revoked(&effects, 1).len(), 2, "member 1 must let two partitions go");
            let effects = group.expire(now_ms + 3_600_000, timeout_ms);
            assert!(!effects.contains(&Effect::Expel { member: 1 }), "timeout {timeout_ms}: {effects:?}");
        }
    }
}
