//! Kafka consumer groups, the classic protocol: who is in a group, its
//! generation, its leader, and the assignment the leader computed.
//!
//! The broker does not assign partitions in this protocol: members join
//! (JoinGroup) with the assignors they support and their subscriptions,
//! opaque to the broker; once every known member has joined (or the
//! rebalance timeout passed) the broker picks a protocol all support, names
//! a leader and answers every join, the leader's with every member's
//! metadata; the leader computes the assignment and sends it in its
//! SyncGroup; the broker hands each member its part in the answer to its
//! own SyncGroup. Heartbeats keep a member alive and tell it when a
//! rebalance has begun (REBALANCE_IN_PROGRESS: it joins again); a member
//! silent for its session timeout is removed and the rest rebalance.
//!
//! **Where it lives, and why a lock.** One [`KafkaGroups`] for the process,
//! shared by every shard behind a mutex: a member's connection lands on
//! whichever shard the kernel picks, and all of a group's members must meet
//! in one place. Group traffic is control traffic (a heartbeat every few
//! seconds per member, joins at rebalances), never on the data path. A
//! request that must wait (a join until the rebalance completes, a
//! follower's sync until the leader's) holds the receiving end of a
//! one-shot channel; whichever shard completes the step sends the answers.
//! Timeouts are found by [`KafkaGroups::tick`], which every group request
//! and every waiting request (every 100 ms) runs.
//!
//! Committed offsets are not kept here but in spate's group store
//! (`super::offsets`): durable, shown by `GET /groups`, and refused to a
//! `GROUP` group of the same name.
//!
//! Bounded: at most `groups_max` groups and `members_max` members a group
//! (the `--groups-max` and `--group-members-max` of `GROUP` groups), at
//! most [`KAFKA_GROUP_MEMBERS_MAX`] members in all, each holding at most
//! [`KAFKA_MEMBER_BYTES_MAX`] of metadata and assignment (a term of the
//! memory formula).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::codes;
use crate::config::{KAFKA_GROUP_MEMBERS_MAX, KAFKA_MEMBER_BYTES_MAX};

/// The shortest and longest session timeout a member may ask for
/// (Kafka's broker defaults are 6 s and 30 min; spate allows shorter
/// sessions, which tests and fast failover want).
pub const SESSION_TIMEOUT_MS_MIN: i32 = 1_000;
pub const SESSION_TIMEOUT_MS_MAX: i32 = 1_800_000;

/// The answer to a JoinGroup.
#[derive(Debug, Clone, Default)]
pub struct JoinAnswer {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// Every member and its metadata for the chosen protocol: the
    /// leader's answer only.
    pub members: Vec<(String, Bytes)>,
}

/// The answer to a SyncGroup.
#[derive(Debug, Clone, Default)]
pub struct SyncAnswer {
    pub error: i16,
    pub protocol_type: String,
    pub protocol: String,
    pub assignment: Bytes,
}

/// A JoinGroup, as the group sees it.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub group: String,
    /// Empty for a member joining for the first time.
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

/// Where a group is in its cycle (Kafka's names, as DescribeGroups says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Empty,
    /// Waiting for the known members to join, until the deadline.
    PreparingRebalance {
        deadline: Instant,
    },
    /// Joins answered; waiting for the leader's SyncGroup.
    CompletingRebalance,
    Stable,
}

impl Phase {
    pub fn name(&self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::PreparingRebalance { .. } => "PreparingRebalance",
            Phase::CompletingRebalance => "CompletingRebalance",
            Phase::Stable => "Stable",
        }
    }
}

#[derive(Debug)]
struct Member {
    id: String,
    client_id: String,
    client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen: Instant,
    /// Joined in the rebalance under way; its answer goes here.
    join_waiter: Option<flume::Sender<JoinAnswer>>,
    sync_waiter: Option<flume::Sender<SyncAnswer>>,
}

#[derive(Debug)]
struct Group {
    phase: Phase,
    generation: i32,
    protocol_type: String,
    protocol: String,
    leader: String,
    members: Vec<Member>,
    /// Makes member ids unique within the group.
    members_joined: u64,
}

/// One member as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub struct MemberInfo {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// One group as DescribeGroups and ListGroups show it.
#[derive(Debug, Clone)]
pub struct GroupInfo {
    pub group: String,
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberInfo>,
}

/// Every Kafka group of the process.
pub struct KafkaGroups {
    groups: Mutex<HashMap<String, Group>>,
    groups_max: usize,
    members_max: usize,
}

impl KafkaGroups {
    pub fn new(groups_max: usize, members_max: usize) -> KafkaGroups {
        KafkaGroups { groups: Mutex::new(HashMap::new()), groups_max, members_max }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        // Every change is made whole under the lock, so a poisoned lock
        // (a panic elsewhere) still guards consistent groups.
        self.groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a Kafka group of this name exists (with members or not).
    pub fn contains(&self, group: &str) -> bool {
        self.lock().contains_key(group)
    }

    /// JoinGroup: the answer comes on the returned channel, at once for a
    /// refusal, else when the rebalance completes.
    pub fn join(&self, request: JoinRequest, now: Instant) -> flume::Receiver<JoinAnswer> {
        let (sender, receiver) = flume::bounded(1);
        let mut groups = self.lock();
        if let Err(error) = self.admit(&mut groups, &request) {
            let _ = sender.send(JoinAnswer { error, member_id: request.member_id, ..JoinAnswer::default() });
            return receiver;
        }
        let Some(group) = groups.get_mut(&request.group) else { return receiver };
        let member_id = if request.member_id.is_empty() {
            group.members_joined += 1;
            let id = format!("{}-{}-{}", request.client_id, group.members_joined, now_nanos());
            group.members.push(new_member(&request, id.clone(), now));
            id
        } else {
            request.member_id.clone()
        };
        if let Some(member) = group.members.iter_mut().find(|member| member.id == member_id) {
            member.protocols = request.protocols;
            member.session_timeout = Duration::from_millis(request.session_timeout_ms as u64);
            member.rebalance_timeout = Duration::from_millis(request.rebalance_timeout_ms.max(0) as u64);
            member.last_seen = now;
            member.join_waiter = Some(sender);
        }
        group.protocol_type = request.protocol_type;
        if !matches!(group.phase, Phase::PreparingRebalance { .. }) {
            begin_rebalance(group, now);
        }
        try_complete_join(group, now);
        receiver
    }

    /// Checks a join against the limits and the group; creates the group.
    fn admit(&self, groups: &mut HashMap<String, Group>, request: &JoinRequest) -> Result<(), i16> {
        if request.group.is_empty() {
            return Err(codes::INVALID_GROUP_ID);
        }
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&request.session_timeout_ms) {
            return Err(codes::INVALID_SESSION_TIMEOUT);
        }
        if !groups.contains_key(&request.group) {
            if groups.len() >= self.groups_max {
                return Err(codes::COORDINATOR_NOT_AVAILABLE);
            }
            groups.insert(request.group.clone(), new_group());
        }
        let Some(group) = groups.get(&request.group) else { return Err(codes::UNKNOWN_SERVER_ERROR) };
        let known = group.members.iter().any(|member| member.id == request.member_id);
        if !request.member_id.is_empty() && !known {
            return Err(codes::UNKNOWN_MEMBER_ID);
        }
        let members_total: usize = groups.values().map(|group| group.members.len()).sum();
        let full = group.members.len() >= self.members_max || members_total >= KAFKA_GROUP_MEMBERS_MAX;
        if request.member_id.is_empty() && full {
            return Err(codes::GROUP_MAX_SIZE_REACHED);
        }
        let metadata_bytes: usize = request.protocols.iter().map(|(name, bytes)| name.len() + bytes.len()).sum();
        if metadata_bytes > KAFKA_MEMBER_BYTES_MAX / 2 {
            return Err(codes::INVALID_REQUEST);
        }
        let others = group.members.iter().filter(|member| member.id != request.member_id);
        let mut others = others.peekable();
        let compatible = request
            .protocols
            .iter()
            .any(|(name, _)| others.clone().all(|member| member.protocols.iter().any(|(theirs, _)| theirs == name)));
        let same_type = others.peek().is_none() || group.protocol_type == request.protocol_type;
        if request.protocols.is_empty() || !compatible || !same_type {
            return Err(codes::INCONSISTENT_GROUP_PROTOCOL);
        }
        Ok(())
    }

    /// SyncGroup: the member's assignment, once the leader has sent it.
    pub fn sync(
        &self,
        group_id: &str,
        member_id: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
    ) -> flume::Receiver<SyncAnswer> {
        let (sender, receiver) = flume::bounded(1);
        let mut groups = self.lock();
        let refuse = |error| SyncAnswer { error, ..SyncAnswer::default() };
        let Some(group) = groups.get_mut(group_id) else {
            let _ = sender.send(refuse(codes::UNKNOWN_MEMBER_ID));
            return receiver;
        };
        let error = check_member(group, member_id, generation, now);
        if error != codes::NONE || matches!(group.phase, Phase::PreparingRebalance { .. }) {
            let error = if error == codes::NONE { codes::REBALANCE_IN_PROGRESS } else { error };
            let _ = sender.send(refuse(error));
            return receiver;
        }
        if let Some(member) = group.members.iter_mut().find(|member| member.id == member_id) {
            member.sync_waiter = Some(sender);
        }
        let too_large = assignments.iter().any(|(_, bytes)| bytes.len() > KAFKA_MEMBER_BYTES_MAX / 2);
        if too_large && group.leader == member_id {
            if let Some(waiter) =
                group.members.iter_mut().find(|member| member.id == member_id).and_then(|m| m.sync_waiter.take())
            {
                let _ = waiter.send(refuse(codes::INVALID_REQUEST));
            }
            return receiver;
        }
        if group.phase == Phase::CompletingRebalance && group.leader == member_id {
            for member in &mut group.members {
                let assignment = assignments.iter().find(|(id, _)| *id == member.id);
                member.assignment = assignment.map(|(_, bytes)| bytes.clone()).unwrap_or_default();
            }
            group.phase = Phase::Stable;
        }
        if group.phase == Phase::Stable {
            answer_syncs(group);
        }
        receiver
    }

    /// Heartbeat: NONE, or why the member must join again.
    pub fn heartbeat(&self, group_id: &str, member_id: &str, generation: i32, now: Instant) -> i16 {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else { return codes::UNKNOWN_MEMBER_ID };
        match check_member(group, member_id, generation, now) {
            codes::NONE if matches!(group.phase, Phase::PreparingRebalance { .. }) => codes::REBALANCE_IN_PROGRESS,
            error => error,
        }
    }

    /// Whether a member may commit offsets now: NONE for a member of the
    /// current generation (or a commit from outside any generation to a
    /// group without members, as a consumer with manual assignment sends).
    pub fn check_commit(&self, group_id: &str, member_id: &str, generation: i32, now: Instant) -> i16 {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else {
            // No such group now (a restart forgets generations): a member
            // must join again, a commit from outside any group is taken.
            return if generation < 0 && member_id.is_empty() { codes::NONE } else { codes::UNKNOWN_MEMBER_ID };
        };
        if generation < 0 && member_id.is_empty() {
            return if group.members.is_empty() { codes::NONE } else { codes::ILLEGAL_GENERATION };
        }
        match check_member(group, member_id, generation, now) {
            codes::NONE if group.phase == Phase::CompletingRebalance => codes::REBALANCE_IN_PROGRESS,
            error => error,
        }
    }

    /// LeaveGroup: the code for each member id.
    pub fn leave(&self, group_id: &str, member_ids: &[String], now: Instant) -> Vec<i16> {
        let mut groups = self.lock();
        let Some(group) = groups.get_mut(group_id) else {
            return vec![codes::UNKNOWN_MEMBER_ID; member_ids.len()];
        };
        let codes = member_ids
            .iter()
            .map(|id| if remove_member(group, id) { codes::NONE } else { codes::UNKNOWN_MEMBER_ID })
            .collect();
        after_removal(group, now);
        codes
    }

    /// Removes members whose session expired, completes rebalances whose
    /// deadline passed, and forgets empty groups.
    pub fn tick(&self, now: Instant) {
        let mut groups = self.lock();
        for group in groups.values_mut() {
            let expired: Vec<String> = group
                .members
                .iter()
                .filter(|member| member.join_waiter.is_none() && now > member.last_seen + member.session_timeout)
                .map(|member| member.id.clone())
                .collect();
            for id in &expired {
                remove_member(group, id);
            }
            if !expired.is_empty() {
                after_removal(group, now);
            }
            try_complete_join(group, now);
        }
        groups.retain(|_, group| !group.members.is_empty() || group.phase != Phase::Empty);
    }

    /// Every group, or the named ones (unknown names come back Dead).
    pub fn describe(&self, names: Option<&[String]>) -> Vec<GroupInfo> {
        let groups = self.lock();
        let info = |name: &String, group: &Group| GroupInfo {
            group: name.clone(),
            state: group.phase.name(),
            protocol_type: group.protocol_type.clone(),
            protocol: group.protocol.clone(),
            members: group.members.iter().map(|member| member_info(group, member)).collect(),
        };
        match names {
            None => groups.iter().map(|(name, group)| info(name, group)).collect(),
            Some(names) => names
                .iter()
                .map(|name| match groups.get(name) {
                    Some(group) => info(name, group),
                    None => GroupInfo {
                        group: name.clone(),
                        state: "Dead",
                        protocol_type: String::new(),
                        protocol: String::new(),
                        members: Vec::new(),
                    },
                })
                .collect(),
        }
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_nanos())
}

fn new_group() -> Group {
    Group {
        phase: Phase::Empty,
        generation: 0,
        protocol_type: String::new(),
        protocol: String::new(),
        leader: String::new(),
        members: Vec::new(),
        members_joined: 0,
    }
}

fn new_member(request: &JoinRequest, id: String, now: Instant) -> Member {
    Member {
        id,
        client_id: request.client_id.clone(),
        client_host: request.client_host.clone(),
        session_timeout: Duration::from_millis(request.session_timeout_ms as u64),
        rebalance_timeout: Duration::from_millis(request.rebalance_timeout_ms.max(0) as u64),
        protocols: Vec::new(),
        assignment: Bytes::new(),
        last_seen: now,
        join_waiter: None,
        sync_waiter: None,
    }
}

fn member_info(group: &Group, member: &Member) -> MemberInfo {
    let metadata = member.protocols.iter().find(|(name, _)| *name == group.protocol).map(|(_, bytes)| bytes.clone());
    MemberInfo {
        member_id: member.id.clone(),
        client_id: member.client_id.clone(),
        client_host: member.client_host.clone(),
        metadata: metadata.unwrap_or_default(),
        assignment: member.assignment.clone(),
    }
}

/// NONE for a known member of the current generation (and marks it seen).
fn check_member(group: &mut Group, member_id: &str, generation: i32, now: Instant) -> i16 {
    let Some(member) = group.members.iter_mut().find(|member| member.id == member_id) else {
        return codes::UNKNOWN_MEMBER_ID;
    };
    member.last_seen = now;
    if generation != group.generation { codes::ILLEGAL_GENERATION } else { codes::NONE }
}

/// Starts a rebalance: pending syncs are told to join again, and the known
/// members have until the longest rebalance timeout to join.
fn begin_rebalance(group: &mut Group, now: Instant) {
    let timeout = group.members.iter().map(|member| member.rebalance_timeout).max().unwrap_or_default();
    group.phase = Phase::PreparingRebalance { deadline: now + timeout };
    for member in &mut group.members {
        if let Some(waiter) = member.sync_waiter.take() {
            let _ = waiter.send(SyncAnswer { error: codes::REBALANCE_IN_PROGRESS, ..SyncAnswer::default() });
        }
    }
}

/// Completes the join phase once every member has joined, or the deadline
/// passed (members that did not join are removed): a new generation, a
/// protocol every member supports, a leader, and every join answered.
fn try_complete_join(group: &mut Group, now: Instant) {
    let Phase::PreparingRebalance { deadline } = group.phase else { return };
    let all_joined = group.members.iter().all(|member| member.join_waiter.is_some());
    if !all_joined && now < deadline {
        return;
    }
    group.members.retain(|member| member.join_waiter.is_some());
    group.generation = group.generation.wrapping_add(1).max(1);
    if group.members.is_empty() {
        group.phase = Phase::Empty;
        return;
    }
    let first = &group.members[0];
    let protocol = first
        .protocols
        .iter()
        .map(|(name, _)| name)
        .find(|name| group.members.iter().all(|member| member.protocols.iter().any(|(theirs, _)| theirs == *name)));
    group.protocol = protocol.cloned().unwrap_or_default();
    if !group.members.iter().any(|member| member.id == group.leader) {
        group.leader = group.members[0].id.clone();
    }
    let everyone: Vec<(String, Bytes)> =
        group.members.iter().map(|member| (member.id.clone(), member_info(group, member).metadata)).collect();
    for member in &mut group.members {
        member.assignment = Bytes::new();
        member.last_seen = now;
        let Some(waiter) = member.join_waiter.take() else { continue };
        let answer = JoinAnswer {
            error: codes::NONE,
            generation: group.generation,
            protocol_type: group.protocol_type.clone(),
            protocol: group.protocol.clone(),
            leader: group.leader.clone(),
            member_id: member.id.clone(),
            members: if member.id == group.leader { everyone.clone() } else { Vec::new() },
        };
        let _ = waiter.send(answer);
    }
    group.phase = Phase::CompletingRebalance;
}

/// Sends every waiting SyncGroup its member's assignment.
fn answer_syncs(group: &mut Group) {
    for member in &mut group.members {
        if let Some(waiter) = member.sync_waiter.take() {
            let answer = SyncAnswer {
                error: codes::NONE,
                protocol_type: group.protocol_type.clone(),
                protocol: group.protocol.clone(),
                assignment: member.assignment.clone(),
            };
            let _ = waiter.send(answer);
        }
    }
}

/// Removes a member, telling its waiting requests; whether it was there.
fn remove_member(group: &mut Group, member_id: &str) -> bool {
    let Some(index) = group.members.iter().position(|member| member.id == member_id) else { return false };
    let member = group.members.remove(index);
    if let Some(waiter) = member.join_waiter {
        let _ = waiter.send(JoinAnswer { error: codes::UNKNOWN_MEMBER_ID, ..JoinAnswer::default() });
    }
    if let Some(waiter) = member.sync_waiter {
        let _ = waiter.send(SyncAnswer { error: codes::UNKNOWN_MEMBER_ID, ..SyncAnswer::default() });
    }
    true
}

/// After members left: the rest rebalance, or the group is empty.
fn after_removal(group: &mut Group, now: Instant) {
    if group.members.is_empty() {
        group.phase = Phase::Empty;
        group.leader.clear();
        return;
    }
    if !matches!(group.phase, Phase::PreparingRebalance { .. }) {
        begin_rebalance(group, now);
    }
    try_complete_join(group, now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(groups: &KafkaGroups, member_id: &str, now: Instant) -> flume::Receiver<JoinAnswer> {
        let request = JoinRequest {
            group: "g".into(),
            member_id: member_id.into(),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 6000,
            rebalance_timeout_ms: 10_000,
            protocol_type: "consumer".into(),
            protocols: vec![("range".into(), Bytes::from_static(b"meta"))],
        };
        groups.join(request, now)
    }

    /// Two members join; the leader gets both members' metadata, syncs an
    /// assignment, and each member gets its part; a heartbeat after a third
    /// member joined says REBALANCE_IN_PROGRESS; a member silent past its
    /// session is removed and the rest rebalance without it.
    #[test]
    fn the_classic_protocol_relays_the_leaders_assignment() {
        let groups = KafkaGroups::new(10, 10);
        let now = Instant::now();
        let first = join(&groups, "", now).try_recv().unwrap();
        assert_eq!((first.error, first.generation, first.members.len()), (0, 1, 1));
        let leader = first.member_id.clone();
        assert_eq!(first.leader, leader);
        let second_waits = join(&groups, "", now);
        assert!(second_waits.try_recv().is_err(), "waits for the leader to join again");
        assert_eq!(groups.heartbeat("g", &leader, 1, now), codes::REBALANCE_IN_PROGRESS);
        let first = join(&groups, &leader, now).try_recv().unwrap();
        let second = second_waits.try_recv().unwrap();
        assert_eq!((first.generation, first.members.len(), second.members.len()), (2, 2, 0));
        let follower_sync = groups.sync("g", &second.member_id, 2, Vec::new(), now);
        assert!(follower_sync.try_recv().is_err(), "waits for the leader's sync");
        let plan =
            vec![(leader.clone(), Bytes::from_static(b"A")), (second.member_id.clone(), Bytes::from_static(b"B"))];
        assert_eq!(groups.sync("g", &leader, 2, plan, now).try_recv().unwrap().assignment, &b"A"[..]);
        assert_eq!(follower_sync.try_recv().unwrap().assignment, &b"B"[..]);
        assert_eq!(groups.heartbeat("g", &leader, 2, now), codes::NONE);
        assert_eq!(groups.heartbeat("g", &leader, 1, now), codes::ILLEGAL_GENERATION);
        assert_eq!(groups.check_commit("g", &leader, 2, now), codes::NONE);
        let later = now + Duration::from_millis(6001);
        assert_eq!(groups.heartbeat("g", &leader, 2, later), codes::NONE);
        groups.tick(later + Duration::from_millis(1));
        assert_eq!(groups.heartbeat("g", &second.member_id, 2, later), codes::UNKNOWN_MEMBER_ID, "expired");
        let alone = join(&groups, &leader, later).try_recv().unwrap();
        assert_eq!((alone.generation, alone.members.len()), (3, 1));
        assert_eq!(groups.leave("g", std::slice::from_ref(&leader), later), [codes::NONE]);
        assert_eq!(groups.describe(None)[0].state, "Empty");
    }

    /// Joins that cannot be served are refused at once: an unknown member
    /// id, a bad session timeout, a full group, no common protocol.
    #[test]
    fn bad_joins_are_refused() {
        let groups = KafkaGroups::new(10, 1);
        let now = Instant::now();
        assert_eq!(join(&groups, "nobody", now).try_recv().unwrap().error, codes::UNKNOWN_MEMBER_ID);
        assert_eq!(join(&groups, "", now).try_recv().unwrap().error, codes::NONE);
        assert_eq!(join(&groups, "", now).try_recv().unwrap().error, codes::GROUP_MAX_SIZE_REACHED);
        let mut request = JoinRequest {
            group: "h".into(),
            member_id: String::new(),
            client_id: "c".into(),
            client_host: String::new(),
            session_timeout_ms: 10,
            rebalance_timeout_ms: 0,
            protocol_type: "consumer".into(),
            protocols: Vec::new(),
        };
        assert_eq!(groups.join(request.clone(), now).try_recv().unwrap().error, codes::INVALID_SESSION_TIMEOUT);
        request.session_timeout_ms = 6000;
        assert_eq!(groups.join(request, now).try_recv().unwrap().error, codes::INCONSISTENT_GROUP_PROTOCOL);
    }
}
