//! The leader-driven reconfiguration: what the leader of a group does next
//! about a difference between the group's replicas and the ones placement
//! desires. A pure function of what the leader knows, so every rule here is
//! unit-tested and runs unchanged in the simulator.
//!
//! Only a group's current leader calls it, and it proposes at most one step
//! at a time through the group's own log (raft-rs refuses a second
//! configuration change while one is pending), so two nodes with different
//! views of the membership can never both change one group: each change is
//! ordered by that group's log. The steps, in the order they are taken:
//!
//! 1. leave a joint configuration left over from a leader change;
//! 2. if the leader is itself not desired, hand leadership to the preferred
//!    leader as soon as it is a caught-up voter (the new leader then
//!    continues);
//! 3. add one missing desired replica as a learner (one at a time, so a
//!    join does not flood a disk);
//! 4. once that learner is caught up, promote it with one joint-consensus
//!    change that also removes an undesired voter, if there is one and the
//!    group already has enough voters, so the group never has fewer than
//!    it had;
//! 5. add one wanted learner that is not a replica yet (only a group whose
//!    placement wants learners beyond its voters: the catalog, which every
//!    node applies), remove undesired learners, then undesired voters
//!    beyond the desired count (a dead or departed node);
//! 6. transfer leadership to the preferred leader once it is a caught-up
//!    voter.

use crate::replication::ReplicaId;
use crate::replication::placement::DesiredReplicas;

/// A learner this many entries or fewer behind the leader's last index
/// counts as caught up: promoting it cannot stall commits for long.
pub const CATCH_UP_LAG_ENTRIES_MAX: u64 = 16;

/// The group's configuration as the leader has applied it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    pub voters: Vec<ReplicaId>,
    pub learners: Vec<ReplicaId>,
    /// Non-empty while the group is in a joint configuration.
    pub voters_outgoing: Vec<ReplicaId>,
}

/// What the leader knows when it decides.
#[derive(Clone, Debug)]
pub struct LeaderView<'a> {
    pub leader: ReplicaId,
    pub membership: &'a Membership,
    /// Each peer's highest index known to match the leader's log.
    pub matched: &'a [(ReplicaId, u64)],
    pub last_index: u64,
    /// A configuration change is proposed and not yet applied.
    pub change_pending: bool,
    pub desired: &'a DesiredReplicas,
}

/// One step of a reconfiguration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    LeaveJoint,
    AddLearner(ReplicaId),
    /// Make `learner` a voter and, in the same joint change, remove `remove`.
    Promote {
        learner: ReplicaId,
        remove: Option<ReplicaId>,
    },
    RemoveLearner(ReplicaId),
    RemoveVoter(ReplicaId),
    TransferLeader(ReplicaId),
}

impl LeaderView<'_> {
    fn caught_up(&self, replica: ReplicaId) -> bool {
        if replica == self.leader {
            return true;
        }
        self.matched
            .iter()
            .find(|(peer, _)| *peer == replica)
            .is_some_and(|(_, matched)| matched + CATCH_UP_LAG_ENTRIES_MAX >= self.last_index)
    }

    fn is_voter(&self, replica: ReplicaId) -> bool {
        self.membership.voters.contains(&replica)
    }

    fn is_learner(&self, replica: ReplicaId) -> bool {
        self.membership.learners.contains(&replica)
    }

    fn undesired_voter(&self) -> Option<ReplicaId> {
        // The last-listed first: deterministic, and never the leader.
        self.membership
            .voters
            .iter()
            .rev()
            .copied()
            .find(|voter| *voter != self.leader && !self.desired.contains(*voter))
    }

    fn preferred_ready(&self) -> Option<ReplicaId> {
        let preferred = self.desired.preferred_leader()?;
        (preferred != self.leader && self.is_voter(preferred) && self.caught_up(preferred)).then_some(preferred)
    }
}

/// The next step the leader should propose, or `None` when there is
/// nothing to do (or it must wait for a pending change or a learner).
pub fn next_step(view: &LeaderView<'_>) -> Option<Step> {
    if view.change_pending || view.desired.replicas.is_empty() {
        return None;
    }
    if !view.membership.voters_outgoing.is_empty() {
        return Some(Step::LeaveJoint);
    }
    if !view.desired.contains(view.leader)
        && let Some(preferred) = view.preferred_ready()
    {
        return Some(Step::TransferLeader(preferred));
    }
    let catching_up = view.desired.replicas.iter().copied().find(|replica| view.is_learner(*replica));
    match catching_up {
        Some(learner) if view.caught_up(learner) => {
            let enough_voters = view.membership.voters.len() >= view.desired.replicas.len();
            let remove = if enough_voters { view.undesired_voter() } else { None };
            return Some(Step::Promote { learner, remove });
        }
        Some(_) => return None,
        None => {}
    }
    let missing = view.desired.replicas.iter().copied().find(|replica| !view.is_voter(*replica));
    if let Some(missing) = missing {
        return Some(Step::AddLearner(missing));
    }
    let wanted = view.desired.learners.iter().copied();
    if let Some(learner) = wanted.clone().find(|replica| !view.is_voter(*replica) && !view.is_learner(*replica)) {
        return Some(Step::AddLearner(learner));
    }
    if let Some(learner) = view.membership.learners.iter().copied().find(|learner| !view.desired.wants(*learner)) {
        return Some(Step::RemoveLearner(learner));
    }
    if view.membership.voters.len() > view.desired.replicas.len()
        && let Some(voter) = view.undesired_voter()
    {
        return Some(Step::RemoveVoter(voter));
    }
    view.preferred_ready().map(Step::TransferLeader)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decide(membership: &Membership, matched: &[(ReplicaId, u64)], desired: &[ReplicaId]) -> Option<Step> {
        let desired = DesiredReplicas { replicas: desired.to_vec(), learners: Vec::new() };
        let view =
            LeaderView { leader: 1, membership, matched, last_index: 100, change_pending: false, desired: &desired };
        next_step(&view)
    }

    fn voters(voters: &[ReplicaId]) -> Membership {
        Membership { voters: voters.to_vec(), ..Membership::default() }
    }

    /// A replacement goes learner, then (caught up) a joint promote that
    /// removes the undesired voter, then leadership to the preferred one.
    #[test]
    fn a_replacement_goes_learner_promote_transfer() {
        assert_eq!(decide(&voters(&[1, 2, 3]), &[], &[4, 1, 2]), Some(Step::AddLearner(4)));
        let learning = Membership { learners: vec![4], ..voters(&[1, 2, 3]) };
        assert_eq!(decide(&learning, &[(4, 10)], &[4, 1, 2]), None, "a lagging learner is waited for");
        assert_eq!(decide(&learning, &[(4, 95)], &[4, 1, 2]), Some(Step::Promote { learner: 4, remove: Some(3) }));
        assert_eq!(decide(&voters(&[1, 2, 4]), &[(4, 100)], &[4, 1, 2]), Some(Step::TransferLeader(4)));
        assert_eq!(decide(&voters(&[1, 2, 4]), &[(4, 50)], &[4, 1, 2]), None);
    }

    /// Nothing is done while a change is pending, a joint configuration is
    /// left first, and a settled group with its preferred leader is left alone.
    #[test]
    fn one_step_at_a_time() {
        let desired = DesiredReplicas { replicas: vec![1, 2, 3], learners: Vec::new() };
        let settled = voters(&[1, 2, 3]);
        let mut view = LeaderView {
            leader: 1,
            membership: &settled,
            matched: &[],
            last_index: 5,
            change_pending: true,
            desired: &desired,
        };
        assert_eq!(next_step(&view), None);
        view.change_pending = false;
        assert_eq!(next_step(&view), None);
        let joint = Membership { voters_outgoing: vec![1, 2, 4], ..voters(&[1, 2, 3]) };
        view.membership = &joint;
        assert_eq!(next_step(&view), Some(Step::LeaveJoint));
    }

    /// A leader that is no longer desired hands over before anything else
    /// once the preferred leader is a caught-up voter; a departed voter
    /// beyond the desired count is removed, never the leader.
    #[test]
    fn undesired_leader_hands_over_and_departed_voters_go() {
        assert_eq!(decide(&voters(&[1, 2, 3]), &[(2, 100)], &[2, 3]), Some(Step::TransferLeader(2)));
        assert_eq!(decide(&voters(&[1, 2, 3, 4]), &[], &[1, 2, 3]), Some(Step::RemoveVoter(4)));
        assert_eq!(decide(&voters(&[1, 2]), &[], &[2]), None, "only the preferred leader may remove the leader");
        let extra = Membership { learners: vec![9], ..voters(&[1, 2, 3]) };
        assert_eq!(decide(&extra, &[], &[1, 2, 3]), Some(Step::RemoveLearner(9)));
    }

    /// A group that wants every other member as a learner (the catalog)
    /// adds them one at a time once its voters are settled, keeps them
    /// (never promotes them), and drops a learner no longer wanted.
    #[test]
    fn wanted_learners_are_added_after_the_voters_and_kept() {
        let desired = DesiredReplicas { replicas: vec![1, 2, 3], learners: vec![4, 5] };
        let decide_with = |membership: &Membership, matched: &[(ReplicaId, u64)]| {
            let view = LeaderView {
                leader: 1,
                membership,
                matched,
                last_index: 100,
                change_pending: false,
                desired: &desired,
            };
            next_step(&view)
        };
        assert_eq!(decide_with(&voters(&[1, 2]), &[]), Some(Step::AddLearner(3)), "voters first");
        assert_eq!(decide_with(&voters(&[1, 2, 3]), &[]), Some(Step::AddLearner(4)));
        let one = Membership { learners: vec![4], ..voters(&[1, 2, 3]) };
        assert_eq!(decide_with(&one, &[(4, 100)]), Some(Step::AddLearner(5)), "a wanted learner is not promoted");
        let both = Membership { learners: vec![4, 5], ..voters(&[1, 2, 3]) };
        assert_eq!(decide_with(&both, &[(4, 100), (5, 100)]), None, "settled");
        let stale = Membership { learners: vec![4, 5, 6], ..voters(&[1, 2, 3]) };
        assert_eq!(decide_with(&stale, &[]), Some(Step::RemoveLearner(6)));
    }
}
