//! A node's many Raft groups: one raft-rs [`RawNode`] per (stream,
//! partition) the node replicates, one [`LogStore`] under all of them, and
//! one outgoing [`PeerBatch`] per peer node per round.
//!
//! The host is sans-IO: the driver (the simulator now, the cluster thread
//! or a shard later) calls [`ReplicaHost::tick`] every [`RAFT_TICK_MS`],
//! [`ReplicaHost::receive`] with each batch from a peer, and
//! [`ReplicaHost::process`] after either, then ships
//! [`ReplicaHost::take_batches`] and hands [`ReplicaHost::take_acks`] to
//! whoever proposed.
//!
//! # A round
//!
//! [`process_unsynced`](ReplicaHost::process_unsynced) takes every group's
//! `Ready`, queues the messages a leader may send before its own write,
//! applies the committed entries, writes every group's new entries and hard
//! state to the store and advances the `Ready` at once (raft-rs's
//! `advance_append_async`); the messages raft-rs holds until the write is
//! durable (votes, append acknowledgements) wait. Then one sync of the
//! store covers every `Ready` since the last, and
//! [`process_synced`](ReplicaHost::process_synced) tells raft-rs they are
//! durable (`on_persist_ready`) and queues those messages. So one fsync
//! covers every group of the node, nothing is promised before it is
//! durable, and groups may be stepped while a sync runs (the real node
//! syncs off its thread). [`process`](ReplicaHost::process) does both with
//! the sync in between (the simulator).
//!
//! # Quiet groups (TiKV's hibernated regions)
//!
//! A group with nothing to do costs nothing: it is not ticked and sends no
//! heartbeats. The exact rule:
//!
//! - A **leader** goes quiet after [`HostConfig::quiesce_ticks`] ticks in a
//!   row in which it was settled: every entry committed and applied, every
//!   peer (voter or learner) matching its last index, no configuration
//!   change or leadership transfer pending, and placement asking for no
//!   change. Those ticks are more than two heartbeat intervals, so the
//!   followers have heard the final commit index. Going quiet, it sends
//!   each peer a quiet notice (in the peer batch) carrying its term.
//! - A **follower** goes quiet on a quiet notice from its current leader in
//!   its current term while the membership shows that leader alive.
//! - Any group wakes (is ticked again) on: any Raft message for it other
//!   than its quiet leader's heartbeats and their late responses (stepped,
//!   but they need no ticks) or a message from a peer outside the group's
//!   configuration (a removed replica campaigning), a proposal, a change in the live members (a quiet follower whose leader
//!   is no longer alive campaigns as usual after an election timeout), and
//!   after [`HostConfig::quiet_recheck_ticks`] quiet ticks (a slow
//!   safety net for a link cut that membership does not see).
//!
//! Why it is safe: Raft's safety (one leader per term, log matching, leader
//! completeness) never depends on timers or on heartbeats arriving, only
//! on messages and durable state; quiescing only withholds ticks, which is
//! indistinguishable from a slow clock or lost heartbeats. What it can cost
//! is liveness, and the wake rules restore it: a quiet leader that died is
//! replaced once membership says so (SWIM detection instead of the election
//! timeout), a lost quiet notice leaves a follower awake (its pre-vote is
//! rejected by a leader in lease, which then heartbeats and goes quiet
//! again). Pre-vote and check-quorum are on, so a woken or partitioned
//! replica cannot disrupt a healthy leader.
//!
//! # Randomness
//!
//! raft-rs draws election timeouts from a thread-local generator; the host
//! overrides each draw from its own seeded one whenever a group's term,
//! role or leader changes (where raft-rs draws), so a simulation replays
//! from its seed.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use protobuf::Message as _;
use raft::eraftpb::{
    ConfChange, ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, Entry, EntryType, Message,
    MessageType,
};
use raft::{RawNode, StateRole};

use crate::cluster::rng::SeededRng;
use crate::replication::frame::{ProposalHeader, decode_proposal, encode_proposal};
use crate::replication::placement::{Candidate, DesiredReplicas, balanced_leaders, desired_replicas};
use crate::replication::reconfig::{self, LeaderView, Step};
use crate::replication::store::{Compacted, GroupLog, GroupStorage, LogStore};
use crate::replication::wire::{BATCH_BYTES_MAX, BATCH_MESSAGES_MAX, PeerBatch, message_bytes_estimate};
use crate::replication::{GroupId, ReplicaId};

/// How often the driver calls [`ReplicaHost::tick`]: raft-rs counts time
/// in ticks, and every `*_ticks` setting is in these.
pub const RAFT_TICK_MS: u64 = 100;
/// Most groups one node hosts; a message for a new group past it is dropped.
pub const GROUPS_MAX: usize = 1 << 16;
/// Entries of a group's log [`ReplicaHost::find_proposal`] looks back
/// through, newest first: a retried proposal comes within seconds of its
/// first send, and 4096 entries are seconds of even a busy partition's
/// rounds (one entry per group per round), for about 10 us of reading
/// their headers.
pub const DEDUP_SCAN_ENTRIES_MAX: usize = 4096;

/// How the host's groups behave; every duration is in ticks of [`RAFT_TICK_MS`].
#[derive(Clone, Copy, Debug)]
pub struct HostConfig {
    /// A follower that hears no leader for between this and twice this
    /// campaigns (1 to 2 s).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    pub quiesce_ticks: u32,
    pub quiet_recheck_ticks: u32,
    /// A group this node is not a member of, silent this long, is dropped.
    pub garbage_ticks: u32,
    pub replication_factor: usize,
    /// Reconfiguration steps the node's leaders may propose per window
    /// (each is one small configuration entry, or a leadership transfer).
    pub reconfig_steps_per_window_max: u32,
    pub reconfig_window_ticks: u32,
    /// Learners the node's leaders catch up at once: a new learner copies
    /// its group's log, so this is what bounds the disk and network a join
    /// costs (more wait for a promotion), while the steps of groups with
    /// little data go at the window's rate.
    pub learners_max: usize,
    /// Bytes of entries in one append message (raft-rs's
    /// `max_size_per_msg`): a quarter of [`BATCH_BYTES_MAX`], so a peer
    /// batch holds several and the transport's largest frame any.
    pub message_bytes_max: u64,
    /// Appends a leader has in flight to one peer before it waits for an
    /// answer (raft-rs's `max_inflight_msgs`): with pipelined proposals a
    /// leader streams one append per proposal, so 256 keep it streaming.
    pub inflight_messages_max: usize,
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            election_ticks: 10,
            heartbeat_ticks: 2,
            quiesce_ticks: 5,
            quiet_recheck_ticks: 300,
            garbage_ticks: 600,
            replication_factor: 3,
            reconfig_steps_per_window_max: 16,
            reconfig_window_ticks: 10,
            learners_max: 8,
            message_bytes_max: 256 << 10,
            inflight_messages_max: 256,
        }
    }
}

/// A proposal of this node applied (so committed): the proposer may answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub group: GroupId,
    pub header: ProposalHeader,
    pub index: u64,
}

/// Why a proposal was not taken.
#[derive(Debug)]
pub enum ProposeError {
    UnknownGroup { group: GroupId },
    NotLeader { group: GroupId, leader: Option<ReplicaId> },
    Raft(raft::Error),
}

impl std::fmt::Display for ProposeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "proposal refused: {self:?}")
    }
}

impl std::error::Error for ProposeError {}

/// What the host did, for metrics and the simulator's report.
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCounters {
    pub messages_sent: u64,
    pub batches_sent: u64,
    pub syncs: u64,
    pub proposals: u64,
    pub applied_entries: u64,
    pub reconfig_steps: u64,
    pub transfers: u64,
    pub quiet_notices: u64,
    pub messages_refused: u64,
    pub groups_created: u64,
    /// Changes of the live member set (each wakes every group).
    pub member_changes: u64,
    pub groups_dropped: u64,
    /// Groups bootstrapped here alone, emptied for the leader's log
    /// (`reset_if_bootstrapped_alone`).
    pub bootstrap_resets: u64,
    /// Configuration changes raft-rs refused to apply: must stay 0.
    pub conf_change_errors: u64,
    pub frame_errors: u64,
    /// Snapshots installed: the leader had compacted what this replica needed.
    pub snapshots_installed: u64,
    /// Snapshots sent as a leader (each reported delivered at once:
    /// [`ReplicaHost::report_snapshots_sent`]).
    pub snapshots_sent: u64,
}

/// A `Ready` advanced before its writes are durable
/// ([`ReplicaHost::process_unsynced`]).
struct AwaitingSync {
    group: GroupId,
    /// The group's opening it belongs to ([`Group::opening`]).
    opening: u64,
    number: u64,
    /// The index of the snapshot it installed, if any: applied once durable.
    snapshot_index: Option<u64>,
    /// What may leave only once it is durable.
    messages: Vec<Message>,
}

/// One group's state on this node: its Raft state machine, whose log and
/// hard state live in the node's store, and the host's bookkeeping.
struct Group<S: LogStore> {
    raw: RawNode<GroupStorage<S>>,
    quiet: bool,
    /// Ticks the leader was settled in a row, or ticks spent quiet.
    quiet_ticks: u32,
    /// Ticks since a message for this group arrived.
    silent_ticks: u32,
    /// Where raft-rs last drew an election timeout (term, role, leader).
    drawn_at: (u64, StateRole, u64),
    /// Which opening of the group this is (the host's count of groups
    /// created then): a `Ready` number waiting for a sync belongs to the
    /// `RawNode` of its opening only.
    opening: u64,
}

/// A group's state as others see it (`GET /cluster`, the simulator).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    pub role: StateRole,
    pub term: u64,
    pub leader: ReplicaId,
    pub commit: u64,
    pub last_index: u64,
    pub voters: Vec<ReplicaId>,
    pub learners: Vec<ReplicaId>,
    pub quiet: bool,
}

/// Every Raft group of one node.
pub struct ReplicaHost<S: LogStore> {
    id: ReplicaId,
    config: HostConfig,
    store: Rc<RefCell<S>>,
    groups: BTreeMap<GroupId, Group<S>>,
    /// Groups dropped here, with the applied index then: a message from
    /// before is stale, one with a higher commit re-creates the group.
    tombstones: BTreeMap<GroupId, u64>,
    members: Vec<Candidate>,
    rng: SeededRng,
    outbox: BTreeMap<ReplicaId, PeerBatch>,
    acks: Vec<Ack>,
    /// Other nodes' proposals applied here as the leader ([`Self::take_forwarded_acks`]).
    forwarded_acks: Vec<Ack>,
    /// Leaders that applied their own removal this round.
    step_downs: Vec<GroupId>,
    /// Snapshots queued this round: (group, to whom).
    snapshots_sent: Vec<(GroupId, ReplicaId)>,
    /// `Ready`s advanced before their writes are durable, in order, and
    /// whether they wrote to the store ([`Self::process_unsynced`]).
    awaiting_sync: Vec<AwaitingSync>,
    unsynced_wrote: bool,
    /// Groups that may have a `Ready` (a message, a proposal, a sync came
    /// for them): a round asks only these (`has_ready` on every group of
    /// every round was 4 – 7 % of the cluster thread). Anything rarer (a
    /// tick, members or streams that change) sets `scan_all`, and the next
    /// round asks every group, as every round did before.
    touched: std::collections::BTreeSet<GroupId>,
    scan_all: bool,
    reconfig_budget: u32,
    /// Replication factors by a group's stream part, where a stream's
    /// differs from [`HostConfig::replication_factor`] (the real node: each
    /// stream has its own).
    stream_replication: BTreeMap<u32, usize>,
    /// Partitions of each stream part, for [`balanced_leaders`].
    stream_partitions: BTreeMap<u32, u32>,
    /// Stream parts whose groups want every live member that is not a
    /// voter as a learner ([`Self::set_learners_everywhere`]).
    learners_everywhere: std::collections::BTreeSet<u32>,
    /// Per stream part, each partition's desired replicas with balanced
    /// leaders; recomputed when the members or the streams change.
    placements: HashMap<u32, Vec<DesiredReplicas>>,
    ticks: u64,
    logger: slog::Logger,
    pub counters: HostCounters,
}

impl<S: LogStore> ReplicaHost<S> {
    /// The host of node `id` over `store`, with every group the store
    /// holds (a restarting node picks up where its durable state is).
    pub fn new(id: ReplicaId, config: HostConfig, store: Rc<RefCell<S>>, seed: u64) -> ReplicaHost<S> {
        let mut host = ReplicaHost {
            id,
            config,
            store,
            groups: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            members: Vec::new(),
            rng: SeededRng::new(seed),
            outbox: BTreeMap::new(),
            acks: Vec::new(),
            forwarded_acks: Vec::new(),
            step_downs: Vec::new(),
            snapshots_sent: Vec::new(),
            awaiting_sync: Vec::new(),
            touched: std::collections::BTreeSet::new(),
            scan_all: true,
            unsynced_wrote: false,
            reconfig_budget: config.reconfig_steps_per_window_max,
            stream_replication: BTreeMap::new(),
            stream_partitions: BTreeMap::new(),
            learners_everywhere: std::collections::BTreeSet::new(),
            placements: HashMap::new(),
            ticks: 0,
            logger: slog::Logger::root(slog::Discard, slog::o!()),
            counters: HostCounters::default(),
        };
        let stored = host.store.borrow().groups();
        for group in stored {
            host.open_group(group);
        }
        host
    }

    pub fn id(&self) -> ReplicaId {
        self.id
    }

    /// Creates `group` with `voters` as its first configuration, the same
    /// way on every one of them: entries 1..=n add one voter each (as
    /// etcd's bootstrap does), already committed and applied, so a replica
    /// added later replays the configuration from its log. Nothing happens
    /// if the store already has the group.
    pub fn bootstrap(&mut self, group: GroupId, voters: &[ReplicaId]) {
        if self.store.borrow().log(group).is_some() || voters.is_empty() {
            return;
        }
        let mut log = GroupLog::default();
        for (position, voter) in voters.iter().enumerate() {
            let change = conf_change(&[(ConfChangeType::AddNode, *voter)]);
            let data = change.write_to_bytes().unwrap_or_default();
            let index = position as u64 + 1;
            log.entries.push(Entry {
                entry_type: EntryType::EntryConfChangeV2,
                term: 1,
                index,
                data: data.into(),
                ..Entry::default()
            });
        }
        log.hard_state.term = 1;
        log.hard_state.commit = voters.len() as u64;
        log.conf_state.voters = voters.to_vec();
        log.applied = voters.len() as u64;
        self.store.borrow_mut().create(group, log);
        self.open_group(group);
    }

    fn open_group(&mut self, group: GroupId) -> bool {
        if self.groups.len() >= GROUPS_MAX {
            return false;
        }
        let applied = self.store.borrow().log(group).map_or(0, |log| log.applied);
        let config = raft::Config {
            id: self.id,
            election_tick: self.config.election_ticks,
            heartbeat_tick: self.config.heartbeat_ticks,
            min_election_tick: self.config.election_ticks,
            max_election_tick: 2 * self.config.election_ticks,
            applied,
            max_size_per_msg: self.config.message_bytes_max,
            max_inflight_msgs: self.config.inflight_messages_max,
            check_quorum: true,
            pre_vote: true,
            // `batch_append` stays off (raft-rs's default): it sends a
            // leader's appends to one peer in a `Ready` as one message
            // (57 k -> 37 k messages/s per node at 256 partitions), but with
            // it the simulator found raft-rs 0.7 send an append whose entries
            // did not follow its index (`index 15, entries [15]`), which a
            // follower acknowledged as 16 without holding it, and the
            // leader's next heartbeat made it panic. `skip_bcast_commit`
            // stays off too: followers would learn a commit only with the
            // next append or heartbeat (up to 200 ms at low rates).
            ..raft::Config::default()
        };
        let storage = GroupStorage { store: self.store.clone(), group };
        let Ok(raw) = RawNode::new(&config, storage, &self.logger) else { return false };
        let drawn_at = (u64::MAX, StateRole::Follower, 0);
        let opening = self.counters.groups_created;
        let mut state = Group { raw, quiet: false, quiet_ticks: 0, silent_ticks: 0, drawn_at, opening };
        redraw_election_timeout(&mut state, &mut self.rng, self.config.election_ticks);
        self.groups.insert(group, state);
        self.touched.insert(group);
        self.counters.groups_created += 1;
        true
    }

    /// The live members placement chooses from (this node included when it
    /// is live). A change wakes every group: its leader may have to move
    /// replicas, its followers may have lost their leader.
    pub fn set_members(&mut self, mut members: Vec<Candidate>) {
        members.sort_by_key(|member| member.replica);
        let changed = members.len() != self.members.len()
            || members
                .iter()
                .zip(&self.members)
                .any(|(new, old)| new.replica != old.replica || new.weight != old.weight);
        if changed {
            self.scan_all = true;
            self.counters.member_changes += 1;
            self.members = members;
            self.place_streams();
            for group in self.groups.values_mut() {
                wake(group);
            }
        }
    }

    /// A replicated stream part's replication factor and partition count:
    /// its groups' leaders are then balanced by count
    /// ([`balanced_leaders`]) instead of being each group's first place.
    pub fn set_stream(&mut self, stream_id: u32, replication_factor: usize, partitions: u32) {
        let replication_changed =
            self.stream_replication.insert(stream_id, replication_factor) != Some(replication_factor);
        let partitions_changed = self.stream_partitions.insert(stream_id, partitions) != Some(partitions);
        if replication_changed || partitions_changed {
            self.scan_all = true;
            self.place_streams();
        }
    }

    /// Makes the groups of stream part `stream_id` want every live member
    /// that is not one of their voters as a learner, so every node applies
    /// their entries (the catalog group, [`crate::replication::node`]).
    pub fn set_learners_everywhere(&mut self, stream_id: u32) {
        self.scan_all = true;
        self.learners_everywhere.insert(stream_id);
    }

    /// Recomputes every stream's balanced placement for the current members.
    fn place_streams(&mut self) {
        self.placements.clear();
        if self.members.is_empty() {
            return;
        }
        for (stream_id, partitions) in &self.stream_partitions {
            let replication_factor =
                self.stream_replication.get(stream_id).copied().unwrap_or(self.config.replication_factor);
            let placed = balanced_leaders(*stream_id, *partitions, &self.members, replication_factor);
            self.placements.insert(*stream_id, placed);
        }
    }

    fn replication_factor_of(&self, id: GroupId) -> usize {
        self.stream_replication.get(&id.stream_id).copied().unwrap_or(self.config.replication_factor)
    }

    fn is_live(&self, replica: ReplicaId) -> bool {
        self.members.iter().any(|member| member.replica == replica)
    }

    /// One tick of every awake group, then quiescence, garbage and
    /// reconfiguration; call [`process`](Self::process) after.
    pub fn tick(&mut self) {
        self.scan_all = true;
        self.ticks += 1;
        if self.ticks.is_multiple_of(u64::from(self.config.reconfig_window_ticks.max(1))) {
            self.reconfig_budget = self.config.reconfig_steps_per_window_max;
        }
        let ids: Vec<GroupId> = self.groups.keys().copied().collect();
        for id in ids {
            self.tick_group(id);
        }
        self.reconfigure();
    }

    fn tick_group(&mut self, id: GroupId) {
        let Some(group) = self.groups.get_mut(&id) else { return };
        group.silent_ticks = group.silent_ticks.saturating_add(1);
        if group.quiet {
            group.quiet_ticks += 1;
            if group.quiet_ticks >= self.config.quiet_recheck_ticks {
                wake(group);
            }
        } else {
            group.raw.tick();
            redraw_election_timeout(group, &mut self.rng, self.config.election_ticks);
            self.maybe_quiesce(id);
        }
        self.maybe_drop(id);
    }

    /// The leader's side of the quiet rule (module doc).
    fn maybe_quiesce(&mut self, id: GroupId) {
        let desired_settled = self.placement_settled(id);
        let Some(group) = self.groups.get_mut(&id) else { return };
        if group.raw.raft.state != StateRole::Leader || !desired_settled || !leader_settled(&group.raw) {
            group.quiet_ticks = 0;
            return;
        }
        group.quiet_ticks += 1;
        if group.quiet_ticks < self.config.quiesce_ticks {
            return;
        }
        group.quiet = true;
        group.quiet_ticks = 0;
        let term = group.raw.raft.term;
        let peers: Vec<ReplicaId> =
            group.raw.raft.prs().iter().map(|(peer, _)| *peer).filter(|peer| *peer != self.id).collect();
        for peer in peers {
            self.batch_for(peer).quiet.push((id, term));
            self.counters.quiet_notices += 1;
        }
    }

    /// Drops a group this node is not a member of once it has been silent
    /// for [`HostConfig::garbage_ticks`]: a replica removed while it was
    /// away, or one created by a stale message.
    fn maybe_drop(&mut self, id: GroupId) {
        let Some(group) = self.groups.get(&id) else { return };
        if group.silent_ticks < self.config.garbage_ticks
            || group.raw.raft.prs().conf().to_conf_state().voters.contains(&self.id)
        {
            return;
        }
        let conf = group.raw.raft.prs().conf().to_conf_state();
        if conf.learners.contains(&self.id) || conf.voters_outgoing.contains(&self.id) {
            return;
        }
        let applied = group.raw.raft.raft_log.applied;
        self.groups.remove(&id);
        self.tombstones.insert(id, applied);
        self.store.borrow_mut().remove(id);
        self.counters.groups_dropped += 1;
    }

    /// Steps every message of a peer's batch into its group, creating the
    /// group for a leader's first message to a new replica.
    pub fn receive(&mut self, batch: PeerBatch) {
        if batch.to != self.id {
            self.counters.messages_refused += batch.messages.len() as u64;
            return;
        }
        for (id, message) in batch.messages {
            self.receive_message(id, message);
        }
        for (id, term) in batch.quiet {
            let live = self.is_live(batch.from);
            let Some(group) = self.groups.get_mut(&id) else { continue };
            let raft = &group.raw.raft;
            if live && raft.state == StateRole::Follower && raft.term == term && raft.leader_id == batch.from {
                group.quiet = true;
                group.quiet_ticks = 0;
            }
        }
    }

    fn receive_message(&mut self, id: GroupId, message: Message) {
        if message.to != self.id {
            self.counters.messages_refused += 1;
            return;
        }
        if !self.groups.contains_key(&id) && !self.may_create(id, &message) {
            self.counters.messages_refused += 1;
            return;
        }
        self.reset_if_bootstrapped_alone(id, &message);
        let Some(group) = self.groups.get_mut(&id) else { return };
        if group.quiet && wakes_quiet_group(&group.raw.raft, &message) {
            wake(group);
        }
        group.silent_ticks = 0;
        if group.raw.step(message).is_err() {
            self.counters.messages_refused += 1;
        }
        redraw_election_timeout(group, &mut self.rng, self.config.election_ticks);
        self.touched.insert(id);
    }

    /// Whether a message for a group this node lacks may create it: only a
    /// leader's append or heartbeat, and past the group's tombstone.
    fn may_create(&mut self, id: GroupId, message: &Message) -> bool {
        let from_leader = matches!(
            message.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
        );
        let past_tombstone = self.tombstones.get(&id).is_none_or(|applied| message.commit > *applied);
        if !from_leader || !past_tombstone || message.term == 0 {
            return false;
        }
        self.tombstones.remove(&id);
        self.store.borrow_mut().create(id, GroupLog::default());
        self.open_group(id)
    }

    /// Empties the log of a group this node bootstrapped by itself when a
    /// leader of it speaks: a node that joins a cluster and learns of a
    /// stream bootstraps the stream's groups on its own view of the
    /// members, but the others may have created them long ago with other
    /// voters, and two bootstraps disagree at the same term-1 indexes (Raft
    /// would take them as matching). The reset is safe only while the
    /// group has promised nothing: its log is the bootstrap alone (last
    /// term 1), it never voted and never had a leader; it keeps its term,
    /// and the leader sends it the group's log from index 1.
    fn reset_if_bootstrapped_alone(&mut self, id: GroupId, message: &Message) {
        let from_leader = matches!(
            message.get_msg_type(),
            MessageType::MsgAppend | MessageType::MsgHeartbeat | MessageType::MsgSnapshot
        );
        let Some(group) = self.groups.get(&id) else { return };
        let raft = &group.raw.raft;
        // Every message comes here: the cheap tests first (a group with a
        // leader returns at once), the log's last term (a store lookup)
        // last. In that order it cost 4.5 % of the cluster thread.
        if !from_leader || message.term <= 1 || raft.vote != 0 || raft.leader_id != 0 {
            return;
        }
        let log = &raft.raft_log;
        if !(log.last_index() > 0 && log.last_term() == 1 && log.applied == log.last_index()) {
            return;
        }
        let term = raft.term;
        self.groups.remove(&id);
        let mut fresh = GroupLog::default();
        fresh.hard_state.term = term;
        let mut store = self.store.borrow_mut();
        store.remove(id);
        store.create(id, fresh);
        drop(store);
        self.counters.bootstrap_resets += 1;
        self.open_group(id);
    }

    /// The leader `group`'s replica here knows (0 for none yet); `None` when
    /// this node holds no replica of it. Cheaper than [`Self::status`],
    /// which copies the configuration, for the proposal path.
    pub fn leader_of(&self, group: GroupId) -> Option<ReplicaId> {
        self.groups.get(&group).map(|state| state.raw.raft.leader_id)
    }

    /// The commit index of `group` here (what [`ReplicaHost::status`] says,
    /// without copying the configuration): the delivery reads it for every
    /// group every round.
    pub fn commit_of(&self, group: GroupId) -> Option<u64> {
        self.groups.get(&group).map(|state| state.raw.raft.raft_log.committed)
    }

    /// Wakes `group` if it is quiet: a proposal came for it and this node
    /// knows no leader (a quiet follower never ticks, so it would never
    /// campaign nor hear of one; awake, it does either within an election
    /// timeout).
    pub fn wake_group(&mut self, group: GroupId) {
        if let Some(state) = self.groups.get_mut(&group) {
            wake(state);
        }
    }

    /// Proposes `records` (a spate frame) to `group`, as `header` says; the
    /// [`Ack`] comes once it is committed and applied here.
    pub fn propose<T: AsRef<[u8]>>(
        &mut self,
        group: GroupId,
        header: ProposalHeader,
        records: &[T],
    ) -> Result<(), ProposeError> {
        let Some(state) = self.groups.get_mut(&group) else { return Err(ProposeError::UnknownGroup { group }) };
        if state.raw.raft.state != StateRole::Leader {
            let leader = Some(state.raw.raft.leader_id).filter(|leader| *leader != 0);
            return Err(ProposeError::NotLeader { group, leader });
        }
        wake(state);
        state.raw.propose(Vec::new(), encode_proposal(header, records)).map_err(ProposeError::Raft)?;
        self.touched.insert(group);
        self.counters.proposals += 1;
        Ok(())
    }
}

impl<S: LogStore> ReplicaHost<S> {
    /// Handles every group's `Ready` with one sync for all of them (module
    /// doc, "A round"), and once more what the sync made possible (a
    /// leader's commit of what it just made durable itself).
    pub fn process(&mut self) {
        for _ in 0..2 {
            self.process_unsynced();
            let covered = self.awaiting_sync_len();
            if self.take_unsynced_writes() {
                self.store.borrow_mut().sync();
            }
            self.process_synced(covered);
        }
    }

    /// The first half of a round: takes every group's `Ready`, writes its
    /// entries and hard state to the store (not synced yet), applies what
    /// is committed (raft-rs hands out only entries this node has durable)
    /// and queues the messages that may leave before the sync: a leader's
    /// appends, so its followers write and sync while it syncs, and a
    /// commit costs one sync in a row instead of two (Raft thesis 10.2.1;
    /// raft-rs's `Ready::messages`). Each `Ready` is advanced at once
    /// (raft-rs's `advance_append_async`) and its messages that need its
    /// writes durable (a follower's answers, votes) wait for
    /// [`Self::process_synced`]. So groups may be stepped, and more rounds'
    /// first halves run, while a sync is under way: a message that arrives
    /// during a sync is answered without waiting for it unless its answer
    /// needs what it syncs.
    pub fn process_unsynced(&mut self) {
        let mut wrote = self.unsynced_wrote;
        let ids: Vec<GroupId> = if std::mem::take(&mut self.scan_all) {
            self.touched.clear();
            self.groups.keys().copied().collect()
        } else {
            std::mem::take(&mut self.touched).into_iter().collect()
        };
        for id in ids {
            let Some(group) = self.groups.get_mut(&id) else { continue };
            if !group.raw.has_ready() {
                continue;
            }
            let opening = group.opening;
            let mut ready = group.raw.ready();
            let number = ready.number();
            let messages = ready.take_messages();
            let committed = ready.take_committed_entries();
            let persisted = ready.take_persisted_messages();
            let snapshot_index = Some(ready.snapshot().get_metadata().index).filter(|_| !ready.snapshot().is_empty());
            let last_committed = committed.last().map(|entry| entry.index);
            {
                let mut store = self.store.borrow_mut();
                if !ready.entries().is_empty() || ready.hs().is_some() {
                    wrote = true;
                }
                if !ready.snapshot().is_empty() {
                    // The leader compacted what this replica needs: the log
                    // restarts after the snapshot's point (store module doc).
                    store.restore(id, Compacted::of_snapshot(ready.snapshot()));
                    self.counters.snapshots_installed += 1;
                    wrote = true;
                }
                store.append(id, ready.entries());
                if let Some(hard_state) = ready.hs() {
                    store.set_hard_state(id, hard_state);
                }
            }
            self.queue_messages(id, messages);
            self.apply_committed(id, committed);
            if let Some(group) = self.groups.get_mut(&id)
                && group.opening == opening
            {
                group.raw.advance_append_async(ready);
                // Committed entries come only up to what is durable here
                // (raft-rs); a snapshot counts as applied once durable.
                if let Some(index) = last_committed {
                    group.raw.advance_apply_to(index);
                }
                redraw_election_timeout(group, &mut self.rng, self.config.election_ticks);
                if group.raw.has_ready() {
                    self.touched.insert(id);
                }
            }
            self.awaiting_sync.push(AwaitingSync { group: id, opening, number, snapshot_index, messages: persisted });
        }
        self.unsynced_wrote = wrote;
        self.step_down_removed_leaders();
    }

    /// `Ready`s advanced and waiting for a sync: a sync taken now covers
    /// the first this many ([`Self::process_synced`]).
    pub fn awaiting_sync_len(&self) -> usize {
        self.awaiting_sync.len()
    }

    /// Whether the `Ready`s since the last call wrote to the store; the
    /// caller that takes it syncs the store itself before
    /// [`Self::process_synced`].
    pub fn take_unsynced_writes(&mut self) -> bool {
        let wrote = std::mem::take(&mut self.unsynced_wrote);
        if wrote {
            self.counters.syncs += 1;
        }
        wrote
    }

    /// The second half of a round, once a sync taken when
    /// [`Self::awaiting_sync_len`] was `covered` is done: those `Ready`s
    /// are persisted (raft-rs's `on_persist_ready`: a leader counts its own
    /// copy towards the commit, which the next first half hands out), and
    /// the messages that waited for them leave.
    pub fn process_synced(&mut self, covered: usize) {
        let covered = covered.min(self.awaiting_sync.len());
        let done: Vec<_> = self.awaiting_sync.drain(..covered).collect();
        for awaiting in done {
            let opening = awaiting.opening;
            let Some(group) = self.groups.get_mut(&awaiting.group).filter(|group| group.opening == opening) else {
                continue;
            };
            group.raw.on_persist_ready(awaiting.number);
            if let Some(index) = awaiting.snapshot_index {
                group.raw.advance_apply_to(index);
            }
            self.touched.insert(awaiting.group);
            self.queue_messages(awaiting.group, awaiting.messages);
        }
        self.report_snapshots_sent();
    }

    fn step_down_removed_leaders(&mut self) {
        for id in std::mem::take(&mut self.step_downs) {
            // A leader that applied its own removal: one elected while its
            // predecessor's change was in flight. raft-rs leaves it leading
            // with no progress of its own (and panics on the next append
            // response); it steps down into the next term, as raft-rs's own
            // note says it should, once its Ready is advanced (a higher
            // term is always safe).
            let Some(group) = self.groups.get_mut(&id) else { continue };
            let raft = &mut group.raw.raft;
            if raft.state == StateRole::Leader {
                let term = raft.term + 1;
                raft.become_follower(term, raft::INVALID_ID);
            }
            self.touched.insert(id);
        }
    }

    /// Applies committed entries: configuration changes go to raft-rs and
    /// the store (with the index they take effect at), a frame proposed by
    /// this node becomes an [`Ack`]. The partition's apply (its log, its
    /// aggregates) hooks in here when the host is wired to a shard.
    fn apply_committed(&mut self, id: GroupId, entries: Vec<Entry>) {
        let Some(last) = entries.last().map(|entry| entry.index) else { return };
        let mut conf_state = None;
        for entry in entries {
            self.counters.applied_entries += 1;
            match entry.get_entry_type() {
                EntryType::EntryNormal if entry.data.is_empty() => {}
                EntryType::EntryNormal => match decode_proposal(&entry.data) {
                    Ok((header, _)) if header.source_node == self.id => {
                        self.acks.push(Ack { group: id, header, index: entry.index });
                    }
                    Ok((header, _)) if self.is_leader(id) => {
                        self.forwarded_acks.push(Ack { group: id, header, index: entry.index });
                    }
                    Ok(_) => {}
                    Err(_) => self.counters.frame_errors += 1,
                },
                EntryType::EntryConfChange | EntryType::EntryConfChangeV2 => {
                    conf_state = self.apply_conf_change(id, &entry).or(conf_state);
                }
            }
        }
        self.store.borrow_mut().set_applied(id, last, conf_state.as_ref());
    }

    fn apply_conf_change(&mut self, id: GroupId, entry: &Entry) -> Option<raft::eraftpb::ConfState> {
        let group = self.groups.get_mut(&id)?;
        let applied = if entry.get_entry_type() == EntryType::EntryConfChangeV2 {
            let change = ConfChangeV2::parse_from_bytes(&entry.data).ok();
            change.map(|change| group.raw.apply_conf_change(&change))
        } else {
            let change = ConfChange::parse_from_bytes(&entry.data).ok();
            change.map(|change| group.raw.apply_conf_change(&change))
        };
        let raft = &group.raw.raft;
        if raft.state == StateRole::Leader && !raft.prs().conf().voters().contains(self.id) {
            self.step_downs.push(id);
        }
        match applied {
            Some(Ok(conf_state)) => Some(conf_state),
            _ => {
                self.counters.conf_change_errors += 1;
                None
            }
        }
    }

    fn batch_for(&mut self, peer: ReplicaId) -> &mut PeerBatch {
        let from = self.id;
        self.outbox.entry(peer).or_insert_with(|| PeerBatch { from, to: peer, ..PeerBatch::default() })
    }

    fn queue_messages(&mut self, id: GroupId, messages: Vec<Message>) {
        for message in messages {
            if message.get_msg_type() == MessageType::MsgSnapshot {
                self.snapshots_sent.push((id, message.to));
            }
            self.batch_for(message.to).messages.push((id, message));
            self.counters.messages_sent += 1;
        }
    }

    /// Tells raft-rs that every snapshot queued this round was delivered.
    /// raft-rs pauses a follower's progress after a snapshot until told
    /// how it went; the transport delivers at most once and says nothing,
    /// so a snapshot lost on the way (the follower unreachable for a
    /// moment, as right after its restart) would pause that follower
    /// forever. Taken as delivered, the leader probes past the snapshot at
    /// the next heartbeat response; a follower that did not get it rejects
    /// the probe and is sent the snapshot again (a few bytes: its data,
    /// the records, are fetched by the follower,
    /// [`crate::replication::catchup`]).
    fn report_snapshots_sent(&mut self) {
        for (id, to) in std::mem::take(&mut self.snapshots_sent) {
            self.counters.snapshots_sent += 1;
            if let Some(group) = self.groups.get_mut(&id) {
                group.raw.report_snapshot(to, raft::SnapshotStatus::Finish);
                self.touched.insert(id);
            }
        }
    }

    /// This round's batches, one per peer (more only past
    /// [`BATCH_MESSAGES_MAX`] messages or about [`BATCH_BYTES_MAX`] bytes:
    /// a round of pipelined appends can carry many).
    pub fn take_batches(&mut self) -> Vec<PeerBatch> {
        let mut batches = Vec::with_capacity(self.outbox.len());
        for (_, mut batch) in std::mem::take(&mut self.outbox) {
            loop {
                let cut = batch_cut(&batch.messages);
                if cut == batch.messages.len() {
                    break;
                }
                let rest = batch.messages.split_off(cut);
                let full =
                    PeerBatch { messages: std::mem::replace(&mut batch.messages, rest), quiet: Vec::new(), ..batch };
                batches.push(full);
            }
            batches.push(batch);
        }
        self.counters.batches_sent += batches.len() as u64;
        batches
    }

    /// The proposals of this node applied since the last call.
    pub fn take_acks(&mut self) -> Vec<Ack> {
        std::mem::take(&mut self.acks)
    }

    /// Other nodes' proposals this node applied as the leader since the
    /// last call: the leader tells each proposer, which may hold no replica
    /// of the group (any more) and so never applies its own proposal.
    pub fn take_forwarded_acks(&mut self) -> Vec<Ack> {
        std::mem::take(&mut self.forwarded_acks)
    }

    /// Whether this node leads `id` now.
    pub fn is_leader(&self, id: GroupId) -> bool {
        self.groups.get(&id).is_some_and(|group| group.raw.raft.state == StateRole::Leader)
    }

    /// Whether `group`'s log here holds the proposal `header` names (the
    /// same proposing node and sequence), among its last
    /// [`DEDUP_SCAN_ENTRIES_MAX`] entries, the ones raft-rs holds before
    /// they reach the store included: `Some(true)` when it is applied
    /// here, `Some(false)` when it is not yet, `None` when it is not
    /// there. A leader asks before it takes a retried proposal, so the
    /// retry of one it already has is not stored twice: an entry in a
    /// leader's log is committed by that leader or by whichever leader
    /// follows (it never drops its own entries).
    pub fn find_proposal(&self, group: GroupId, header: ProposalHeader) -> Option<bool> {
        let state = self.groups.get(&group)?;
        let same = |entry: &&Entry| {
            entry.get_entry_type() == EntryType::EntryNormal
                && decode_proposal(&entry.data).is_ok_and(|(found, _)| {
                    found.source_node == header.source_node && found.source_sequence == header.source_sequence
                })
        };
        let unstable = &state.raw.raft.raft_log.unstable;
        let store = self.store.borrow();
        let log = store.log(group)?;
        // The unstable entries replace the store's from their offset on.
        let stable_end = if unstable.entries.is_empty() { u64::MAX } else { unstable.offset };
        let found =
            unstable.entries.iter().rev().chain(log.entries.iter().rev().skip_while(|entry| entry.index >= stable_end));
        found.take(DEDUP_SCAN_ENTRIES_MAX).find(same).map(|entry| entry.index <= log.applied)
    }

    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    pub fn groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        self.groups.keys().copied()
    }

    pub fn status(&self, id: GroupId) -> Option<GroupStatus> {
        let group = self.groups.get(&id)?;
        let raft = &group.raw.raft;
        let mut conf = raft.prs().conf().to_conf_state();
        conf.voters.sort_unstable();
        conf.learners.sort_unstable();
        Some(GroupStatus {
            role: raft.state,
            term: raft.term,
            leader: raft.leader_id,
            commit: raft.raft_log.committed,
            last_index: raft.raft_log.last_index(),
            voters: conf.voters,
            learners: conf.learners,
            quiet: group.quiet,
        })
    }

    /// Where placement wants `id`'s leadership, and the reconfiguration
    /// step this node would take next as its leader (`GET /cluster`).
    pub fn placement_status(&self, id: GroupId) -> (Option<ReplicaId>, Option<String>) {
        let step = self.next_reconfig_step(id).map(|step| format!("{step:?}"));
        (self.desired(id).preferred_leader(), step)
    }

    /// Where placement wants `id`'s replicas, preferred (balanced) leader
    /// first, whether or not this node holds one.
    pub fn desired_replicas(&self, id: GroupId) -> DesiredReplicas {
        self.desired(id)
    }

    /// When this node leads `id`: the lowest index a live peer (one raft-rs
    /// saw recently, or a member this node sees alive) has matched, so
    /// compaction can spare it a snapshot; `None` when not leading.
    pub fn lowest_live_match(&self, id: GroupId) -> Option<u64> {
        let raft = &self.groups.get(&id)?.raw.raft;
        if raft.state != StateRole::Leader {
            return None;
        }
        raft.prs()
            .iter()
            .filter(|(peer, progress)| **peer != self.id && (progress.recent_active || self.is_live(**peer)))
            .map(|(_, progress)| progress.matched)
            .min()
    }

    /// Ticks since a message for `id` arrived.
    pub fn silent_ticks(&self, id: GroupId) -> Option<u32> {
        self.groups.get(&id).map(|group| group.silent_ticks)
    }

    /// Groups not ticked now.
    pub fn quiet_groups(&self) -> usize {
        self.groups.values().filter(|group| group.quiet).count()
    }
}

impl<S: LogStore> ReplicaHost<S> {
    /// Where placement wants `id`'s replicas; empty before membership is known.
    fn desired(&self, id: GroupId) -> DesiredReplicas {
        if self.members.is_empty() {
            return DesiredReplicas::default();
        }
        let mut desired = match self.placements.get(&id.stream_id).and_then(|sets| sets.get(id.partition as usize)) {
            Some(placed) => placed.clone(),
            None => desired_replicas(id, &self.members, self.replication_factor_of(id)),
        };
        if self.learners_everywhere.contains(&id.stream_id) {
            let others = self.members.iter().map(|member| member.replica).filter(|replica| !desired.contains(*replica));
            desired.learners = others.collect();
        }
        desired
    }

    /// The reconfiguration step `id`'s leader (this node) would take, if any.
    fn next_reconfig_step(&self, id: GroupId) -> Option<Step> {
        let group = self.groups.get(&id)?;
        let raft = &group.raw.raft;
        if raft.state != StateRole::Leader || raft.lead_transferee.is_some() {
            return None;
        }
        let conf = raft.prs().conf().to_conf_state();
        let membership = reconfig::Membership {
            voters: sorted(conf.voters),
            learners: sorted(conf.learners),
            voters_outgoing: sorted(conf.voters_outgoing),
        };
        let matched: Vec<(ReplicaId, u64)> =
            raft.prs().iter().map(|(peer, progress)| (*peer, progress.matched)).collect();
        let desired = self.desired(id);
        let view = LeaderView {
            leader: self.id,
            membership: &membership,
            matched: &matched,
            last_index: raft.raft_log.last_index(),
            change_pending: raft.has_pending_conf(),
            desired: &desired,
        };
        reconfig::next_step(&view)
    }

    fn placement_settled(&self, id: GroupId) -> bool {
        self.next_reconfig_step(id).is_none()
    }

    /// Learners of the groups this node leads (each catching up, until its
    /// promotion).
    fn learners_led(&self) -> usize {
        self.groups
            .values()
            .filter(|group| group.raw.raft.state == StateRole::Leader)
            .map(|group| group.raw.raft.prs().conf().learners().len())
            .sum()
    }

    /// Lets each group this node leads take its next reconfiguration step,
    /// within the node's budget per window and [`HostConfig::learners_max`].
    /// Groups whose leadership is to move go first: a joining node gets its
    /// share of leaders (and so of the work) before the replicas that only
    /// add copies.
    fn reconfigure(&mut self) {
        let mut ids: Vec<GroupId> = self.groups.iter().filter(|(_, group)| !group.quiet).map(|(id, _)| *id).collect();
        if self.reconfig_budget == 0 || ids.is_empty() {
            return;
        }
        ids.sort_by_cached_key(|id| (self.desired(*id).preferred_leader() == Some(self.id), *id));
        let mut learners = self.learners_led();
        for id in ids {
            if self.reconfig_budget == 0 {
                return;
            }
            let Some(step) = self.next_reconfig_step(id) else { continue };
            if matches!(step, Step::AddLearner(_)) {
                if learners >= self.config.learners_max {
                    continue;
                }
                learners += 1;
            }
            let Some(group) = self.groups.get_mut(&id) else { continue };
            let proposed = match step {
                Step::TransferLeader(replica) => {
                    group.raw.transfer_leader(replica);
                    self.counters.transfers += 1;
                    true
                }
                Step::LeaveJoint => group.raw.propose_conf_change(Vec::new(), ConfChangeV2::default()).is_ok(),
                Step::AddLearner(replica) => {
                    let change = conf_change(&[(ConfChangeType::AddLearnerNode, replica)]);
                    group.raw.propose_conf_change(Vec::new(), change).is_ok()
                }
                Step::Promote { learner, remove } => {
                    let mut changes = vec![(ConfChangeType::AddNode, learner)];
                    changes.extend(remove.map(|voter| (ConfChangeType::RemoveNode, voter)));
                    group.raw.propose_conf_change(Vec::new(), conf_change(&changes)).is_ok()
                }
                Step::RemoveLearner(replica) | Step::RemoveVoter(replica) => {
                    let change = conf_change(&[(ConfChangeType::RemoveNode, replica)]);
                    group.raw.propose_conf_change(Vec::new(), change).is_ok()
                }
            };
            self.touched.insert(id);
            if proposed {
                self.reconfig_budget -= 1;
                self.counters.reconfig_steps += 1;
            }
        }
    }
}

/// How many of `messages` the first batch takes: up to
/// [`BATCH_MESSAGES_MAX`] and about [`BATCH_BYTES_MAX`] bytes, at least one.
fn batch_cut(messages: &[(GroupId, Message)]) -> usize {
    let mut bytes = 0;
    for (index, (_, message)) in messages.iter().enumerate().take(BATCH_MESSAGES_MAX) {
        bytes += message_bytes_estimate(message);
        if bytes > BATCH_BYTES_MAX && index > 0 {
            return index;
        }
    }
    messages.len().min(BATCH_MESSAGES_MAX)
}

fn sorted(mut replicas: Vec<ReplicaId>) -> Vec<ReplicaId> {
    replicas.sort_unstable();
    replicas
}

/// A configuration change of `changes`; two or more enter a joint
/// configuration that raft-rs leaves by itself once it is applied.
fn conf_change(changes: &[(ConfChangeType, ReplicaId)]) -> ConfChangeV2 {
    let mut change = ConfChangeV2::default();
    let singles: Vec<ConfChangeSingle> = changes
        .iter()
        .map(|(kind, replica)| {
            let mut single = ConfChangeSingle::default();
            single.set_change_type(*kind);
            single.node_id = *replica;
            single
        })
        .collect();
    change.set_changes(singles.into());
    change.set_transition(ConfChangeTransition::Auto);
    change
}

/// Whether `message` wakes a quiet group: anything but the heartbeat
/// traffic of the quiet leader it is settling with (its own heartbeats, or
/// late responses to them), which raft-rs handles without needing ticks,
/// and anything from a peer outside the group's configuration (a replica
/// removed while it was down, campaigning on its stale configuration: raft-rs
/// refuses its votes with or without ticks, and waking for it would keep
/// the group busy for as long as the stale replica lives).
fn wakes_quiet_group<S: LogStore>(raft: &raft::Raft<GroupStorage<S>>, message: &Message) -> bool {
    if raft.prs().get(message.from).is_none() {
        return false;
    }
    let heartbeat = match message.get_msg_type() {
        MessageType::MsgHeartbeat => raft.state == StateRole::Follower && message.from == raft.leader_id,
        MessageType::MsgHeartbeatResponse => raft.state == StateRole::Leader,
        _ => false,
    };
    !(heartbeat && message.term == raft.term)
}

/// Wakes a quiet group; its silence starts again (ticks spent quiet are
/// not a leader's silence: a woken follower hears from it within a
/// heartbeat interval).
fn wake<S: LogStore>(group: &mut Group<S>) {
    if group.quiet {
        group.silent_ticks = 0;
    }
    group.quiet = false;
    group.quiet_ticks = 0;
}

/// Whether a leader has nothing left to do (module doc, "Quiet groups").
fn leader_settled<S: LogStore>(raw: &RawNode<GroupStorage<S>>) -> bool {
    let raft = &raw.raft;
    let last = raft.raft_log.last_index();
    raft.raft_log.committed == last
        && raft.raft_log.applied == last
        && raft.lead_transferee.is_none()
        && !raft.has_pending_conf()
        && raft.prs().iter().all(|(peer, progress)| *peer == raft.id || progress.matched == last)
}

/// Replaces raft-rs's election timeout draw with one from the host's
/// seeded generator wherever raft-rs drew (module doc, "Randomness").
fn redraw_election_timeout<S: LogStore>(group: &mut Group<S>, rng: &mut SeededRng, election_ticks: usize) {
    let raft = &mut group.raw.raft;
    let at = (raft.term, raft.state, raft.leader_id);
    if at != group.drawn_at {
        group.drawn_at = at;
        let spread = election_ticks.max(1) as u64;
        raft.set_randomized_election_timeout(election_ticks + (rng.next() % spread) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::store::MemoryLogStore;

    const GROUP: GroupId = GroupId { stream_id: 1, partition: 0 };

    fn hosts(count: u64) -> Vec<ReplicaHost<MemoryLogStore>> {
        let voters: Vec<ReplicaId> = (1..=count).collect();
        let members: Vec<Candidate> =
            voters.iter().map(|replica| Candidate { replica: *replica, weight: 1.0 }).collect();
        voters
            .iter()
            .map(|replica| {
                let store = Rc::new(RefCell::new(MemoryLogStore::new()));
                let mut host = ReplicaHost::new(*replica, HostConfig::default(), store, *replica);
                host.bootstrap(GROUP, &voters);
                host.set_members(members.clone());
                host
            })
            .collect()
    }

    /// One tick of every host, with every batch delivered at once.
    fn round(hosts: &mut [ReplicaHost<MemoryLogStore>]) -> usize {
        let mut batches = Vec::new();
        for host in hosts.iter_mut() {
            host.tick();
            host.process();
            batches.extend(host.take_batches());
        }
        let sent = batches.iter().map(|batch| batch.messages.len()).sum();
        for batch in batches {
            if let Some(host) = hosts.iter_mut().find(|host| host.id() == batch.to) {
                host.receive(batch);
                host.process();
            }
        }
        sent
    }

    /// One tick of every host, with the batches `deliver` lets through
    /// delivered at once and the others lost.
    fn lossy_round(hosts: &mut [ReplicaHost<MemoryLogStore>], mut deliver: impl FnMut(&PeerBatch) -> bool) {
        let mut batches = Vec::new();
        for host in hosts.iter_mut() {
            host.tick();
            host.process();
            batches.extend(host.take_batches());
        }
        for batch in batches.into_iter().filter(|batch| deliver(batch)) {
            if let Some(host) = hosts.iter_mut().find(|host| host.id() == batch.to) {
                host.receive(batch);
                host.process();
            }
        }
    }

    fn leader(hosts: &[ReplicaHost<MemoryLogStore>]) -> Option<usize> {
        hosts.iter().position(|host| host.status(GROUP).is_some_and(|status| status.role == StateRole::Leader))
    }

    /// A proposal the leader replicated but had not committed when it died
    /// is in the next leader's log: [`ReplicaHost::find_proposal`] finds it
    /// on a follower (not applied), then on the new leader once that
    /// commits it (applied), so its retry is answered rather than stored
    /// twice; a header nobody proposed is not found.
    #[test]
    fn the_next_leader_finds_a_proposal_its_dead_leader_replicated() {
        let mut hosts = hosts(3);
        for _ in 0..40 {
            round(&mut hosts);
        }
        let Some(leader_index) = leader(&hosts) else { panic!("no leader after 4 s") };
        let dead = hosts[leader_index].id();
        let header = ProposalHeader { source_node: 99, source_sequence: 7, record_count: 1 };
        hosts[leader_index].propose(GROUP, header, &[b"record"]).expect("the leader takes it");
        // Its append reaches the followers; their answers never reach it.
        lossy_round(&mut hosts, |batch| batch.to != dead);
        let mut survivors: Vec<_> = hosts.into_iter().filter(|host| host.id() != dead).collect();
        for survivor in &survivors {
            assert_eq!(survivor.find_proposal(GROUP, header), Some(false), "held, not applied, on each follower");
        }
        for _ in 0..60 {
            round(&mut survivors);
        }
        let Some(next) = leader(&survivors) else { panic!("the survivors elect no leader") };
        assert_eq!(survivors[next].find_proposal(GROUP, header), Some(true), "committed by the next leader");
        let unknown = ProposalHeader { source_sequence: 8, ..header };
        assert_eq!(survivors[next].find_proposal(GROUP, unknown), None);
        let other_source = ProposalHeader { source_node: 98, ..header };
        assert_eq!(survivors[next].find_proposal(GROUP, other_source), None);
    }

    /// Three hosts elect a leader, a proposal on it is acknowledged once,
    /// every replica commits it at the same index with one sync per round,
    /// and then the group goes quiet: no messages at all.
    #[test]
    fn a_group_elects_commits_acknowledges_and_goes_quiet() {
        let mut hosts = hosts(3);
        for _ in 0..40 {
            round(&mut hosts);
        }
        let Some(leader) = leader(&hosts) else { panic!("no leader after 4 s") };
        let header = ProposalHeader { source_node: hosts[leader].id(), source_sequence: 0, record_count: 1 };
        hosts[leader].propose(GROUP, header, &[b"record"]).expect("the leader takes it");
        for _ in 0..3 {
            round(&mut hosts);
        }
        let acks = hosts[leader].take_acks();
        assert_eq!(acks.len(), 1, "{acks:?}");
        let commits: Vec<u64> =
            hosts.iter().filter_map(|host| host.status(GROUP)).map(|status| status.commit).collect();
        assert!(commits.iter().all(|commit| *commit >= acks[0].index), "{commits:?} {acks:?}");
        for _ in 0..20 {
            round(&mut hosts);
        }
        assert_eq!(hosts.iter().map(|host| host.quiet_groups()).sum::<usize>(), 3);
        assert_eq!(round(&mut hosts), 0, "a quiet group sends nothing");
        let follower = (leader + 1) % 3;
        let refused = hosts[follower].propose(GROUP, header, &[b"x"]);
        assert!(matches!(refused, Err(ProposeError::NotLeader { leader: Some(_), .. })), "{refused:?}");
    }

    /// A snapshot lost on the way (the transport delivers at most once) is
    /// sent again: the leader takes each snapshot as delivered and probes
    /// past it, so a follower that did not get it rejects the probe and is
    /// sent it again, instead of being paused forever.
    #[test]
    fn a_lost_snapshot_is_sent_again() {
        let mut hosts = hosts(3);
        for _ in 0..40 {
            round(&mut hosts);
        }
        let Some(leader) = leader(&hosts) else { panic!("no leader after 4 s") };
        let cut = hosts[(leader + 1) % 3].id();
        for sequence in 0..20 {
            let header = ProposalHeader { source_node: hosts[leader].id(), source_sequence: sequence, record_count: 1 };
            hosts[leader].propose(GROUP, header, &[b"record"]).expect("the leader takes it");
            lossy_round(&mut hosts, |batch| batch.to != cut && batch.from != cut);
        }
        for _ in 0..5 {
            lossy_round(&mut hosts, |batch| batch.to != cut && batch.from != cut);
        }
        let compacted = {
            let store = hosts[leader].store.borrow();
            let log = store.log(GROUP).expect("the leader's log");
            let term = log.entry(log.applied).expect("the applied entry").term;
            Compacted { index: log.applied, term, conf_state: log.conf_state.clone(), offset: 20 }
        };
        let commit = compacted.index;
        hosts[leader].store.borrow_mut().compact(GROUP, compacted);
        // The follower is back, but the first batch carrying a snapshot to
        // it is lost.
        let mut lost = false;
        for _ in 0..100 {
            lossy_round(&mut hosts, |batch| {
                let snapshot = batch.messages.iter().any(|(_, m)| m.get_msg_type() == MessageType::MsgSnapshot);
                if snapshot && batch.to == cut && !lost {
                    lost = true;
                    return false;
                }
                true
            });
        }
        assert!(lost, "a snapshot was sent to the follower");
        let follower = hosts.iter().find(|host| host.id() == cut).expect("the follower");
        let status = follower.status(GROUP).expect("its group");
        assert!(status.commit >= commit, "the follower's commit {} is behind {commit}", status.commit);
        assert!(follower.counters.snapshots_installed >= 1);
        assert!(hosts[leader].counters.snapshots_sent >= 2, "sent again after the loss");
    }
}
