//! Consumer groups as one shard runs them ([`crate::group`] has the design):
//! the groups it coordinates (their state, offsets and the writes that make
//! commits durable), the inboxes of the members whose connections it holds,
//! and the `hold` floors every shard keeps a copy of (retention and the
//! owner's hold decision read them).
//!
//! Everything arrives as a [`GroupFrame`], from this shard or over the mesh;
//! handlers never hold a borrow while they send, so a frame to this shard
//! is handled in place.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ahash::AHashMap;

pub use crate::config::COMMITS_IN_FLIGHT_MAX;
use crate::group::coordinator::{CommitError, JoinError};
pub use crate::group::messages::{GroupFrame, GroupKey, MemberEvent};
use crate::group::store::{StoredGroup, group_path};
use crate::group::{Effect, GroupState, MemberId, coordinator_of};
use crate::protocol::group::{GroupError, OffsetReset};
use crate::runtime::log::{self, Level};
use crate::runtime::notify::Notify;
use crate::shard::Shard;
use crate::shard::frame::MeshFrame;
use crate::shard::metrics::ShardMetrics;

mod kafka;

/// How often an owner checks its partitions against the `hold` floors
/// while any exist (the overshoot past `--group-hold-lag-bytes` is what
/// arrives in this time, plus the credits in flight).
pub const HOLD_CHECK_MS: u64 = 5;
/// How long a failed offsets write waits before it is tried again.
const OFFSET_WRITE_RETRY_MS: u64 = 100;

/// A member session's inbox on the shard that holds its connection.
/// Bounded by the protocol: one `Assigned` and one `Revoke` per rebalance,
/// and at most [`COMMITS_IN_FLIGHT_MAX`] commit answers.
#[derive(Default)]
pub struct MemberInbox {
    events: RefCell<VecDeque<MemberEvent>>,
    notify: Notify,
    /// Set with [`MemberEvent::Expelled`], for the session's watchdog: the
    /// session ends even if its writer is stuck on a member that does not
    /// read, so an expelled member never gets another event.
    expelled: std::cell::Cell<bool>,
    expel_notify: Notify,
}

impl MemberInbox {
    pub fn pop(&self) -> Option<MemberEvent> {
        self.events.borrow_mut().pop_front()
    }

    pub async fn wait(&self) {
        if self.events.borrow().is_empty() {
            self.notify.notified().await;
        }
    }

    /// Resolves once the coordinator expelled the member.
    pub async fn expelled(&self) {
        while !self.expelled.get() {
            self.expel_notify.notified().await;
        }
    }
}

/// A group this shard coordinates.
struct Coordinated {
    stream: String,
    base: u32,
    state: GroupState,
    /// Offsets changed since the last write.
    dirty: bool,
    /// Commits to acknowledge once written.
    acks: Vec<(MemberId, u32, u64)>,
    /// A Kafka consumer group's offsets (`kafka::groups`): no `GROUP`
    /// member may join it, and a Kafka group may not commit to a `GROUP`
    /// group's.
    kafka: bool,
}

/// One shard's consumer-group service.
pub struct Groups {
    coordinated: RefCell<AHashMap<GroupKey, Coordinated>>,
    members: RefCell<AHashMap<MemberId, Rc<MemberInbox>>>,
    persist_notify: Notify,
    /// Hold groups' floors, per group, as every shard has them.
    floors: RefCell<AHashMap<GroupKey, (u32, Vec<u64>)>>,
    /// The lowest floor of each global partition (`u64::MAX`: none).
    floor_of: RefCell<Vec<u64>>,
    /// Wakes the hold checker: floors arrived.
    hold_notify: Notify,
    /// Kafka OffsetCommits to answer (NONE) once the offsets are written.
    kafka_acks: RefCell<Vec<flume::Sender<i16>>>,
}

impl Groups {
    pub fn new(partitions_max: u32) -> Groups {
        Groups {
            coordinated: RefCell::default(),
            members: RefCell::default(),
            persist_notify: Notify::default(),
            floors: RefCell::default(),
            floor_of: RefCell::new(vec![u64::MAX; partitions_max as usize]),
            hold_notify: Notify::default(),
            kafka_acks: RefCell::default(),
        }
    }

    /// The offset from which a `hold` group still needs `partition`
    /// (`u64::MAX` when no live hold group reads it).
    pub fn floor(&self, partition: u32) -> u64 {
        self.floor_of.borrow().get(partition as usize).copied().unwrap_or(u64::MAX)
    }

    pub fn register_member(&self, member: MemberId) -> Rc<MemberInbox> {
        let inbox = Rc::new(MemberInbox::default());
        self.members.borrow_mut().insert(member, inbox.clone());
        inbox
    }

    pub fn unregister_member(&self, member: MemberId) {
        self.members.borrow_mut().remove(&member);
    }

    /// What `GET /groups` shows of the groups this shard coordinates.
    pub fn infos(&self) -> Vec<GroupInfo> {
        self.coordinated
            .borrow()
            .iter()
            .map(|((_, group), entry)| GroupInfo {
                stream: entry.stream.clone(),
                group: group.clone(),
                base: entry.base,
                hold: entry.state.hold,
                kafka: entry.kafka,
                generation: entry.state.generation,
                rebalances: entry.state.rebalances,
                members: entry.state.members().map(|member| (member, entry.state.held_by(member))).collect(),
                committed: entry.state.committed().to_vec(),
            })
            .collect()
    }
}

/// One group as `GET /groups` shows it (gathered from its coordinator).
#[derive(Debug, Clone)]
pub struct GroupInfo {
    pub stream: String,
    pub group: String,
    pub base: u32,
    pub hold: bool,
    /// A Kafka consumer group (its members are Kafka's: DescribeGroups).
    pub kafka: bool,
    pub generation: u64,
    pub rebalances: u64,
    /// Each member and the partitions it holds.
    pub members: Vec<(MemberId, Vec<u32>)>,
    pub committed: Vec<Option<u64>>,
}

impl Shard {
    /// Sends a group frame to shard `to` (this one included).
    pub fn send_group(&self, to: u16, frame: GroupFrame) {
        self.send(to, MeshFrame::Group(Box::new(frame)));
    }

    /// Sends a group frame to every shard, this one included.
    fn broadcast_group(&self, frame: GroupFrame) {
        for peer in (0..self.shard_count).filter(|&peer| peer != self.id) {
            self.send(peer, MeshFrame::Group(Box::new(frame.clone())));
        }
        self.send(self.id, MeshFrame::Group(Box::new(frame)));
    }

    /// The coordinator of a group.
    pub fn group_coordinator(&self, key: &GroupKey) -> u16 {
        coordinator_of(key.0, &key.1, self.shard_count)
    }

    pub fn handle_group_frame(self: &Rc<Self>, frame: GroupFrame) {
        match frame {
            GroupFrame::Join { member, key, stream, base, partitions, reset, hold } => {
                self.on_join(member, key, (stream, base, partitions), reset, hold)
            }
            GroupFrame::Leave { member, key } => {
                let effects =
                    self.with_group(&key, |entry, now_ms, timeout| entry.state.leave(member, now_ms, timeout));
                self.after_membership_change(&key, effects.unwrap_or_default());
            }
            GroupFrame::Commit { member, key, partition, next_offset } => {
                let outcome = self.with_group(&key, |entry, _, _| {
                    let outcome = entry.state.commit(member, partition, next_offset);
                    if outcome.is_ok() {
                        entry.dirty = true;
                        entry.acks.push((member, partition, next_offset));
                    }
                    outcome
                });
                match outcome.unwrap_or(Err(CommitError::NotAssigned)) {
                    Ok(()) => self.groups.persist_notify.notify(),
                    Err(CommitError::NotAssigned) => {
                        ShardMetrics::add(&self.metrics.group_commits_refused, 1);
                        self.to_member(member, MemberEvent::CommitRefused { partition });
                    }
                }
            }
            GroupFrame::CommitStart { key, partition, offset } => {
                let changed = self.with_group(&key, |entry, _, _| {
                    let changed = entry.state.commit_start(partition, offset);
                    entry.dirty |= changed;
                    changed
                });
                if changed == Some(true) {
                    self.groups.persist_notify.notify();
                }
            }
            GroupFrame::RevokeDone { member, key, partitions } => {
                let effects = self.with_group(&key, |entry, now_ms, timeout| {
                    entry.state.revoke_done(member, &partitions, now_ms, timeout)
                });
                self.dispatch(&key, effects.unwrap_or_default());
            }
            GroupFrame::ToMember { member, event } => {
                if let Some(inbox) = self.groups.members.borrow().get(&member) {
                    if event == MemberEvent::Expelled {
                        inbox.expelled.set(true);
                        inbox.expel_notify.notify();
                    }
                    inbox.events.borrow_mut().push_back(event);
                    inbox.notify.notify();
                }
            }
            GroupFrame::Floors { key, base, floors } => self.on_floors(key, base, floors),
            GroupFrame::Held { partition, held } => self.ingress.set_held(partition, held),
            GroupFrame::KafkaCommit { key, stream, offsets, reply } => {
                self.on_kafka_commit(key, stream, offsets, reply)
            }
            GroupFrame::KafkaOffsets { key, reply } => self.on_kafka_offsets(&key, reply),
        }
    }

    /// Runs `f` on a coordinated group with the clock and revoke timeout.
    fn with_group<R>(&self, key: &GroupKey, f: impl FnOnce(&mut Coordinated, u64, u64) -> R) -> Option<R> {
        let mut coordinated = self.groups.coordinated.borrow_mut();
        let entry = coordinated.get_mut(key)?;
        Some(f(entry, crate::shard::balancer::now_ms(), self.config.group_session_timeout_ms))
    }

    fn on_join(
        self: &Rc<Self>,
        member: MemberId,
        key: GroupKey,
        (stream, base, partitions): (String, u32, u32),
        reset: OffsetReset,
        hold: bool,
    ) {
        let outcome = {
            let mut coordinated = self.groups.coordinated.borrow_mut();
            if !coordinated.contains_key(&key)
                && coordinated.len() >= self.config.groups_per_shard_max(self.shard_count)
            {
                Err(GroupError::GroupLimit { groups_max: self.config.groups_per_shard_max(self.shard_count) }
                    .to_string())
            } else {
                let entry = coordinated.entry(key.clone()).or_insert_with(|| Coordinated {
                    stream,
                    base,
                    state: GroupState::new(vec![None; partitions as usize]),
                    dirty: false,
                    acks: Vec::new(),
                    kafka: false,
                });
                if entry.kafka {
                    let message = format!(
                        "group_conflict: {} is a Kafka consumer group of stream {}: choose another name",
                        key.1, entry.stream
                    );
                    drop(coordinated);
                    self.to_member(member, MemberEvent::Refused(message));
                    return;
                }
                let now_ms = crate::shard::balancer::now_ms();
                let timeout = self.config.group_session_timeout_ms;
                entry.state.join(member, reset, hold, self.config.group_members_max, now_ms, timeout).map_err(|error| {
                    match error {
                        JoinError::MemberLimit { members_max } => GroupError::MemberLimit { members_max }.to_string(),
                        JoinError::HoldMismatch { group_hold } => GroupError::HoldMismatch { group_hold }.to_string(),
                    }
                })
            }
        };
        match outcome {
            Ok(effects) => {
                ShardMetrics::add(&self.metrics.group_joins, 1);
                self.after_membership_change(&key, effects);
            }
            Err(message) => self.to_member(member, MemberEvent::Refused(message)),
        }
    }

    /// After a join or a leave: carry out the rebalance, and tell every
    /// shard whether a hold group holds (it does only with members).
    fn after_membership_change(self: &Rc<Self>, key: &GroupKey, effects: Vec<Effect>) {
        self.dispatch(key, effects);
        let (hold, members) = {
            let coordinated = self.groups.coordinated.borrow();
            let Some(entry) = coordinated.get(key) else { return };
            (entry.state.hold, entry.state.member_count())
        };
        if hold {
            self.publish_floors(key, members > 0);
        }
        self.forget_if_empty(key);
    }

    /// Drops a group with no members and no offsets (nothing to remember).
    fn forget_if_empty(&self, key: &GroupKey) {
        let mut coordinated = self.groups.coordinated.borrow_mut();
        if coordinated
            .get(key)
            .is_some_and(|entry| entry.state.member_count() == 0 && entry.state.committed().iter().all(Option::is_none))
        {
            coordinated.remove(key);
        }
    }

    /// Sends a hold group's floors to every shard (or says it holds nothing).
    fn publish_floors(self: &Rc<Self>, key: &GroupKey, holding: bool) {
        let frame = {
            let coordinated = self.groups.coordinated.borrow();
            let Some(entry) = coordinated.get(key) else { return };
            let floors =
                holding.then(|| entry.state.committed().iter().map(|offset| offset.unwrap_or(u64::MAX)).collect());
            GroupFrame::Floors { key: key.clone(), base: entry.base, floors }
        };
        self.broadcast_group(frame);
    }

    fn on_floors(&self, key: GroupKey, base: u32, floors: Option<Vec<u64>>) {
        let mut all = self.groups.floors.borrow_mut();
        let length = match floors {
            Some(floors) => {
                let length = floors.len();
                all.insert(key.clone(), (base, floors));
                length
            }
            None => all.remove(&key).map_or(0, |(_, floors)| floors.len()),
        };
        let mut floor_of = self.groups.floor_of.borrow_mut();
        for local in 0..length {
            let global = base as usize + local;
            let lowest = all
                .iter()
                .filter(|((stream_id, _), (group_base, _))| *stream_id == key.0 && *group_base == base)
                .filter_map(|(_, (_, floors))| floors.get(local).copied())
                .min()
                .unwrap_or(u64::MAX);
            if let Some(slot) = floor_of.get_mut(global) {
                *slot = lowest;
            }
        }
        drop((all, floor_of));
        self.groups.hold_notify.notify();
    }

    /// Carries out a coordinator's effects.
    fn dispatch(self: &Rc<Self>, key: &GroupKey, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Assign { member, generation, partitions, starts } => {
                    self.to_member(member, MemberEvent::Assigned { generation, partitions, starts });
                }
                Effect::Revoke { member, generation, partitions } => {
                    ShardMetrics::add(&self.metrics.group_rebalances, 1);
                    self.to_member(member, MemberEvent::Revoke { generation, partitions });
                    self.schedule_revoke_check(key.clone());
                }
                Effect::Expel { member } => {
                    ShardMetrics::add(&self.metrics.group_members_expelled, 1);
                    self.to_member(member, MemberEvent::Expelled);
                }
            }
        }
    }

    /// Expels the group's members that have not finished a revocation once
    /// the revoke timeout has passed.
    fn schedule_revoke_check(self: &Rc<Self>, key: GroupKey) {
        let shard = self.clone();
        let timeout = Duration::from_millis(self.config.group_session_timeout_ms.saturating_add(1));
        glommio::spawn_local(async move {
            glommio::timer::sleep(timeout).await;
            let effects = shard.with_group(&key, |entry, now_ms, timeout| entry.state.expire(now_ms, timeout));
            let effects = effects.unwrap_or_default();
            if !effects.is_empty() {
                shard.after_membership_change(&key, effects);
            }
        })
        .detach();
    }

    fn to_member(self: &Rc<Self>, member: MemberId, event: MemberEvent) {
        let to = crate::group::coordinator::member_shard(member);
        self.send_group(to, GroupFrame::ToMember { member, event });
    }

    /// A stream was deleted: its groups, and their floors, go with it
    /// (their members get `ERR stream_deleted` from their fetches).
    pub fn forget_stream_groups(self: &Rc<Self>, stream_id: u32) {
        self.groups.coordinated.borrow_mut().retain(|(id, _), _| *id != stream_id);
        let keys: Vec<(GroupKey, u32)> = self
            .groups
            .floors
            .borrow()
            .iter()
            .filter(|((id, _), _)| *id == stream_id)
            .map(|(key, (base, _))| (key.clone(), *base))
            .collect();
        for (key, base) in keys {
            self.on_floors(key, base, None);
        }
    }

    /// Loads the offsets this shard coordinates from the data directory.
    pub fn load_groups(&self, stored: Vec<StoredGroup>) {
        let streams = self.streams.borrow();
        let mut coordinated = self.groups.coordinated.borrow_mut();
        for group in stored {
            let Some(spec) = streams.catalog().get(&group.stream) else { continue };
            if spec.id != group.stream_id {
                continue;
            }
            let key = (spec.id, group.group.clone());
            if self.group_coordinator(&key) != self.id {
                continue;
            }
            let mut committed = vec![None; spec.partitions as usize];
            for (partition, offset) in group.offsets {
                if let Some(slot) = committed.get_mut(partition as usize) {
                    *slot = Some(offset);
                }
            }
            let mut state = GroupState::new(committed);
            state.hold = group.hold;
            let kafka = group.kafka;
            let entry =
                Coordinated { stream: group.stream, base: spec.base, state, dirty: false, acks: Vec::new(), kafka };
            coordinated.insert(key, entry);
        }
    }

    /// Makes commits durable in rounds: writes every changed group's file
    /// (disk storage), then acknowledges the commits it holds and sends
    /// hold groups' new floors.
    pub async fn run_offset_writer(self: &Rc<Self>) {
        // A full disk fails every retry: logged when it starts and ends.
        let write_failures = log::Episode::new("failed writes");
        let scope = log::Scope::shard(self.id);
        loop {
            self.groups.persist_notify.notified().await;
            if self.committer.as_ref().is_some_and(|committer| committer.is_read_only()) {
                // Started on a full disk: commits wait (still dirty, their
                // acknowledgements held) until the deferred writes are
                // done, without a failing write and a log line per retry.
                glommio::timer::sleep(Duration::from_millis(OFFSET_WRITE_RETRY_MS)).await;
                self.groups.persist_notify.notify();
                continue;
            }
            let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
            let mut acks = Vec::new();
            let mut hold_keys = Vec::new();
            let kafka_acks = std::mem::take(&mut *self.groups.kafka_acks.borrow_mut());
            for (key, entry) in self.groups.coordinated.borrow_mut().iter_mut().filter(|(_, entry)| entry.dirty) {
                entry.dirty = false;
                acks.append(&mut entry.acks);
                if entry.state.hold && entry.state.member_count() > 0 {
                    hold_keys.push(key.clone());
                }
                let stored = StoredGroup {
                    stream: entry.stream.clone(),
                    stream_id: key.0,
                    group: key.1.clone(),
                    hold: entry.state.hold,
                    kafka: entry.kafka,
                    offsets: (0u32..)
                        .zip(entry.state.committed())
                        .filter_map(|(partition, offset)| offset.map(|offset| (partition, offset)))
                        .collect(),
                };
                let path = group_path(&self.config.data_dir, &entry.stream, &key.1);
                files.push((path, serde_json::to_vec(&stored).expect("offsets serialize")));
            }
            if self.committer.is_some() && !files.is_empty() {
                let written =
                    glommio::executor().spawn_blocking(move || crate::group::store::write_files(&files)).await;
                if let Err(error) = written {
                    ShardMetrics::add(&self.metrics.group_offset_write_errors, 1);
                    let failed = format_args!(
                        "writing committed offsets: {error}; retrying every {OFFSET_WRITE_RETRY_MS} ms \
                         (commits are acknowledged once written)"
                    );
                    write_failures.occur(Instant::now(), Level::Warn, scope, failed);
                    self.requeue(acks);
                    self.groups.kafka_acks.borrow_mut().extend(kafka_acks);
                    glommio::timer::sleep(Duration::from_millis(OFFSET_WRITE_RETRY_MS)).await;
                    self.groups.persist_notify.notify();
                    continue;
                }
                let works = format_args!("committed offsets are written again");
                write_failures.end(Instant::now(), Level::Info, scope, works);
            }
            ShardMetrics::add(&self.metrics.group_commits, (acks.len() + kafka_acks.len()) as u64);
            for reply in kafka_acks {
                let _ = reply.send(0);
            }
            for (member, partition, next_offset) in acks {
                self.to_member(member, MemberEvent::CommitOk { partition, next_offset });
            }
            for key in hold_keys {
                self.publish_floors(&key, true);
            }
        }
    }

    /// Puts back the acknowledgements of a failed write, and marks their
    /// groups to be written again.
    fn requeue(&self, acks: Vec<(MemberId, u32, u64)>) {
        let mut coordinated = self.groups.coordinated.borrow_mut();
        for entry in coordinated.values_mut() {
            entry.dirty = true;
        }
        // Acks go back to whichever group holds the member now; a member
        // that left no longer needs them.
        for ack in acks {
            if let Some(entry) = coordinated.values_mut().find(|entry| entry.state.members().any(|m| m == ack.0)) {
                entry.acks.push(ack);
            }
        }
    }

    /// The owner's side of `hold`: every [`HOLD_CHECK_MS`] while any floor
    /// exists (and after every applied batch, [`Shard::check_holds`]),
    /// holds the owned partitions a hold group lags too far behind and
    /// releases the ones it caught up on, on every shard.
    pub async fn run_hold_checker(self: &Rc<Self>) {
        loop {
            let idle = self.groups.floors.borrow().is_empty() && self.ingress.router().held_count() == 0;
            if idle {
                self.groups.hold_notify.notified().await;
            } else {
                glommio::timer::sleep(Duration::from_millis(HOLD_CHECK_MS)).await;
            }
            self.check_holds();
        }
    }

    /// Whether any hold floor exists (then [`Shard::check_holds`] has work).
    #[inline]
    pub fn has_hold_floors(&self) -> bool {
        !self.groups.floors.borrow().is_empty()
    }

    /// Compares each owned partition's lag behind its hold floor with the
    /// limit, and holds or releases it on every shard where that changed.
    pub fn check_holds(self: &Rc<Self>) {
        let limit = self.config.group_hold_lag_limit();
        let mut changes = Vec::new();
        let mut holding = 0;
        {
            let partitions = self.partitions.borrow();
            let floor_of = self.groups.floor_of.borrow();
            for (partition_id, partition) in partitions.iter() {
                let floor = floor_of.get(partition_id as usize).copied().unwrap_or(u64::MAX);
                let lag_events = partition.log.next_offset().saturating_sub(floor);
                let mean_payload = partition.bytes_total.checked_div(partition.events_total).unwrap_or(0).max(1);
                let held = floor != u64::MAX && lag_events.saturating_mul(mean_payload) > limit;
                if held != self.ingress.is_held(partition_id) {
                    changes.push((partition_id, held));
                }
                holding += u64::from(held);
            }
        }
        for (partition, held) in changes {
            if held {
                ShardMetrics::add(&self.metrics.group_holds, 1);
            }
            self.broadcast_group(GroupFrame::Held { partition, held });
        }
        self.metrics.group_held_partitions.set(holding);
    }
}
