//! `spate simulate --nodes N`: the replication code of a cluster on a
//! simulated network, disks and clock, from one printed seed.
//!
//! Every node runs the real [`ReplicaHost`] (raft-rs groups, the one-sync
//! round, quiet groups, placement and the leader-driven reconfiguration)
//! over a [`MemoryLogStore`] with durability tracking (its disk: a crash
//! loses every write since the node's last sync), and the real foca
//! [`Membership`] whose live members feed placement, as the cluster's
//! membership simulator ([`crate::cluster::sim`]) runs it. Raft batches go
//! through their real encoding ([`PeerBatch::encode`]). The network delays
//! each packet by a seeded random time (so it reorders), drops some, and
//! cuts links; time moves only when the simulation steps.
//!
//! Scenario events, drawn from the seed: a node joins (new identity, empty
//! disk), leaves (membership goodbye, then it stops), crashes (loses unsynced
//! writes) and restarts later from its disk with a new incarnation, and a
//! link between two nodes is cut and later healed. A workload proposes
//! frames (with a (source node, source sequence) header) to the groups a
//! node leads. The last quarter of a run has no faults and no writes, so
//! the groups go quiet.
//!
//! Checked after every step ([`Checker`]), failing with the seed:
//! - at most one leader per (group, term), across the whole run;
//! - a committed entry never changes or disappears: every running
//!   replica's log up to its commit index equals the first committed copy
//!   seen anywhere (recorded per group and index);
//! - so replicas agree on every committed index;
//! - every acknowledged proposal is at the index its ack named, and per
//!   (group, source) committed proposals carry strictly increasing
//!   sequences: present once, in order.

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cluster::identity::{MemberAddresses, MemberId, NodeId, NodeIdentity};
use crate::cluster::load::LoadSummary;
use crate::cluster::membership::{MemberState, Membership};
use crate::cluster::rng::SeededRng;
use crate::cluster::scheduled::Scheduled;
use crate::replication::frame::{ProposalHeader, decode_proposal};
use crate::replication::host::{Ack, HostConfig, RAFT_TICK_MS, ReplicaHost};
use crate::replication::placement::{Candidate, REPLICATION_FACTOR_MAX, balanced_leaders, desired_replicas};
use crate::replication::store::{LogStore, MemoryLogStore};
use crate::replication::wire::PeerBatch;
use crate::replication::{GroupId, ReplicaId, replica_id_of};

/// Most nodes a simulation starts with (joins may add half as many again).
pub const SIM_NODES_MAX: usize = 64;
/// Most groups (partitions of the one simulated stream).
pub const SIM_PARTITIONS_MAX: u32 = 4096;
/// Most steps of one run (10 ms each: about 28 simulated hours).
pub const SIM_STEPS_MAX: u64 = 10_000_000;

/// How a run goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClusterSimConfig {
    pub nodes: usize,
    pub seed: u64,
    pub steps: u64,
    pub partitions: u32,
    pub replication_factor: usize,
    pub step_ms: u64,
    pub delay_ms_min: u64,
    pub delay_ms_max: u64,
    pub drop_per_mille: u32,
    /// Mean steps between scenario events (0: none).
    pub fault_every_steps: u64,
    /// Proposals tried per step, per thousand (1500: one or two a step).
    pub proposals_per_mille: u32,
}

impl Default for ClusterSimConfig {
    fn default() -> ClusterSimConfig {
        ClusterSimConfig {
            nodes: 5,
            seed: 1,
            steps: 6000,
            partitions: 16,
            replication_factor: 3,
            step_ms: 10,
            delay_ms_min: 1,
            delay_ms_max: 30,
            drop_per_mille: 20,
            fault_every_steps: 400,
            proposals_per_mille: 1500,
        }
    }
}

/// Why a run's settings cannot be simulated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClusterSimConfigError {
    NodesOutOfRange { nodes: usize, nodes_max: usize },
    PartitionsOutOfRange { partitions: u32, partitions_max: u32 },
    StepsOutOfRange { steps: u64, steps_max: u64 },
    ReplicationFactorOutOfRange { replication_factor: usize, replication_factor_max: usize },
}

impl fmt::Display for ClusterSimConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid cluster simulation: {self:?}")
    }
}

impl std::error::Error for ClusterSimConfigError {}

impl ClusterSimConfig {
    /// The `spate simulate` command that runs this configuration (network
    /// and fault settings are the defaults there).
    pub fn replay_command(&self) -> String {
        format!(
            "spate simulate --nodes {} --seed {} --steps {} --partitions {} --rf {}",
            self.nodes, self.seed, self.steps, self.partitions, self.replication_factor
        )
    }

    pub fn validate(&self) -> Result<(), ClusterSimConfigError> {
        if !(1..=SIM_NODES_MAX).contains(&self.nodes) {
            return Err(ClusterSimConfigError::NodesOutOfRange { nodes: self.nodes, nodes_max: SIM_NODES_MAX });
        }
        if !(1..=SIM_PARTITIONS_MAX).contains(&self.partitions) {
            let partitions_max = SIM_PARTITIONS_MAX;
            return Err(ClusterSimConfigError::PartitionsOutOfRange { partitions: self.partitions, partitions_max });
        }
        if !(1..=SIM_STEPS_MAX).contains(&self.steps) {
            return Err(ClusterSimConfigError::StepsOutOfRange { steps: self.steps, steps_max: SIM_STEPS_MAX });
        }
        if !(1..=REPLICATION_FACTOR_MAX).contains(&self.replication_factor) {
            let (replication_factor, replication_factor_max) = (self.replication_factor, REPLICATION_FACTOR_MAX);
            return Err(ClusterSimConfigError::ReplicationFactorOutOfRange {
                replication_factor,
                replication_factor_max,
            });
        }
        Ok(())
    }
}

/// An invariant broken: which, when, and the seed that replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub seed: u64,
    pub step: u64,
    pub what: String,
    /// The command that replays the run.
    pub replay: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant broken at step {} with seed {}: {} (replay: spate simulate --seed {} ...)",
            self.step, self.seed, self.what, self.seed
        )
    }
}

impl std::error::Error for Violation {}

/// A committed entry as first seen: its term, a hash of its bytes, and its
/// proposal header if it carries a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CommittedEntry {
    term: u64,
    digest: u64,
    header: Option<ProposalHeader>,
}

/// The invariants of the module doc, fed after every step.
#[derive(Debug, Default)]
pub struct Checker {
    leaders: BTreeMap<(GroupId, u64), ReplicaId>,
    committed: BTreeMap<GroupId, Vec<CommittedEntry>>,
    /// Per (node index, group), the highest index compared so far.
    checked: BTreeMap<(usize, GroupId), u64>,
    last_sequence: BTreeMap<(GroupId, ReplicaId), u64>,
    pending_acks: Vec<Ack>,
    pub acks: u64,
    pub committed_entries: u64,
    pub leaders_seen: u64,
}

impl Checker {
    /// Compares every index of node `node`'s group again from 1 (after a
    /// restart, and now and then to catch an entry changed below a commit).
    fn forget(&mut self, node: usize) {
        self.checked.retain(|(index, _), _| *index != node);
    }

    fn forget_all(&mut self) {
        self.checked.clear();
    }

    fn check_leader(&mut self, group: GroupId, term: u64, replica: ReplicaId) -> Result<(), String> {
        match self.leaders.insert((group, term), replica) {
            Some(other) if other != replica => {
                Err(format!("{group:?} has two leaders in term {term}: {other} and {replica}"))
            }
            Some(_) => Ok(()),
            None => {
                self.leaders_seen += 1;
                Ok(())
            }
        }
    }

    /// Compares node `node`'s log of `group` up to `commit` with the first
    /// committed copies, recording the new ones.
    fn check_log(&mut self, node: usize, group: GroupId, commit: u64, store: &MemoryLogStore) -> Result<(), String> {
        let from = self.checked.get(&(node, group)).copied().unwrap_or(0) + 1;
        if from > commit {
            return Ok(());
        }
        let Some(log) = store.log(group) else { return Err(format!("node {node} commits {group:?} without a log")) };
        for index in from..=commit {
            let Some(entry) = log.entry(index) else {
                return Err(format!("node {node}: committed {group:?} index {index} disappeared (commit {commit})"));
            };
            let header = if entry.data.is_empty() { None } else { decode_proposal(&entry.data).ok().map(|(h, _)| h) };
            let seen = CommittedEntry { term: entry.term, digest: xxhash_rust::xxh3::xxh3_64(&entry.data), header };
            let record = self.committed.entry(group).or_default();
            match record.get(index as usize - 1) {
                Some(first) if *first != seen => {
                    return Err(format!(
                        "node {node}: committed {group:?} index {index} changed: {first:?} then {seen:?}"
                    ));
                }
                Some(_) => {}
                None => {
                    record.push(seen);
                    self.committed_entries += 1;
                    if let Some(header) = header {
                        let last = self.last_sequence.insert((group, header.source_node), header.source_sequence);
                        if last.is_some_and(|last| last >= header.source_sequence) {
                            return Err(format!(
                                "{group:?} index {index}: {header:?} after sequence {last:?}: duplicated or reordered"
                            ));
                        }
                    }
                }
            }
        }
        self.checked.insert((node, group), commit);
        Ok(())
    }

    /// Every acknowledged proposal must be the committed entry at its index.
    fn check_acks(&mut self, acks: Vec<Ack>) -> Result<(), String> {
        self.pending_acks.extend(acks);
        let mut still_pending = Vec::new();
        for ack in std::mem::take(&mut self.pending_acks) {
            let recorded = self.committed.get(&ack.group).and_then(|record| record.get(ack.index as usize - 1));
            match recorded {
                None => still_pending.push(ack),
                Some(entry) if entry.header == Some(ack.header) => self.acks += 1,
                Some(entry) => return Err(format!("acknowledged {ack:?} but the committed entry is {entry:?}")),
            }
        }
        self.pending_acks = still_pending;
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    Running,
    Crashed { restart_step: u64 },
    Left,
}

struct SimNode {
    replica: ReplicaId,
    identity: NodeIdentity,
    address: SocketAddr,
    /// The node's disk: survives a crash, minus what was not synced.
    store: Rc<RefCell<MemoryLogStore>>,
    host: ReplicaHost<MemoryLogStore>,
    membership: Membership,
    state: NodeState,
    next_tick_at: Duration,
    next_load_at: Duration,
}

enum Packet {
    Gossip(Bytes),
    Raft(Vec<u8>),
}

struct Routed {
    from: usize,
    to: usize,
    packet: Packet,
}

/// What a run did.
#[derive(Clone, Debug, Default)]
pub struct ClusterSimReport {
    pub seed: u64,
    pub steps: u64,
    pub wall_ms: u64,
    pub proposals: u64,
    pub acks: u64,
    pub committed_entries: u64,
    pub leaders_seen: u64,
    pub packets_delivered: u64,
    pub packets_dropped: u64,
    pub raft_messages: u64,
    pub raft_batches: u64,
    pub syncs: u64,
    pub reconfig_steps: u64,
    pub joins: u64,
    pub leaves: u64,
    pub crashes: u64,
    pub cuts: u64,
    /// Raft messages sent in the last simulated second (the idle tail).
    pub idle_messages_last_s: u64,
    pub groups_quiet: usize,
    pub replicas: usize,
    /// Groups whose replicas equal the desired ones at the end.
    pub groups_placed: usize,
}

impl fmt::Display for ClusterSimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let steps_per_s = self.steps as f64 * 1000.0 / self.wall_ms.max(1) as f64;
        writeln!(
            f,
            "seed {}: {} steps in {} ms ({steps_per_s:.0} steps/s), every invariant held",
            self.seed, self.steps, self.wall_ms
        )?;
        writeln!(
            f,
            "proposals {} acknowledged {} committed entries {} leaders (group, term) {}",
            self.proposals, self.acks, self.committed_entries, self.leaders_seen
        )?;
        writeln!(
            f,
            "events: joins {} leaves {} crashes {} link cuts {}",
            self.joins, self.leaves, self.crashes, self.cuts
        )?;
        writeln!(
            f,
            "network: packets delivered {} dropped {}; raft messages {} in {} batches; syncs {}",
            self.packets_delivered, self.packets_dropped, self.raft_messages, self.raft_batches, self.syncs
        )?;
        write!(
            f,
            "end: {} of {} replicas quiet, {} raft messages in the last idle second, reconfiguration steps {}, groups placed as desired {}",
            self.groups_quiet, self.replicas, self.idle_messages_last_s, self.reconfig_steps, self.groups_placed
        )
    }
}

/// A simulated cluster (module doc).
pub struct ClusterSim {
    config: ClusterSimConfig,
    host_config: HostConfig,
    now: Duration,
    step: u64,
    rng: SeededRng,
    nodes: Vec<SimNode>,
    by_address: HashMap<SocketAddr, usize>,
    network: BinaryHeap<Reverse<Scheduled<Routed>>>,
    packet_sequence: u64,
    /// Cut links (lower index first) and the step they heal at.
    cuts: BTreeMap<(usize, usize), u64>,
    next_sequence: BTreeMap<(ReplicaId, GroupId), u64>,
    /// Raft messages sent per simulated second, most recent last.
    raft_messages_this_s: u64,
    raft_messages_last_s: u64,
    pub checker: Checker,
    pub report: ClusterSimReport,
}

impl ClusterSim {
    /// `config.nodes` nodes that know each other; every group bootstrapped
    /// on its HRW-desired replicas over them (as a created stream will be).
    pub fn new(config: ClusterSimConfig) -> Result<ClusterSim, ClusterSimConfigError> {
        config.validate()?;
        let host_config = HostConfig { replication_factor: config.replication_factor, ..HostConfig::default() };
        let mut simulation = ClusterSim {
            config,
            host_config,
            now: Duration::ZERO,
            step: 0,
            rng: SeededRng::new(config.seed),
            nodes: Vec::new(),
            by_address: HashMap::new(),
            network: BinaryHeap::new(),
            packet_sequence: 0,
            cuts: BTreeMap::new(),
            next_sequence: BTreeMap::new(),
            raft_messages_this_s: 0,
            raft_messages_last_s: 0,
            checker: Checker::default(),
            report: ClusterSimReport { seed: config.seed, ..ClusterSimReport::default() },
        };
        for _ in 0..config.nodes {
            simulation.add_node();
        }
        let candidates: Vec<Candidate> =
            simulation.nodes.iter().map(|node| Candidate { replica: node.replica, weight: 1.0 }).collect();
        for partition in 0..config.partitions {
            let group = GroupId { stream_id: 1, partition };
            let voters = desired_replicas(group, &candidates, config.replication_factor).replicas;
            for node in &mut simulation.nodes {
                if voters.contains(&node.replica) {
                    node.host.bootstrap(group, &voters);
                }
            }
        }
        Ok(simulation)
    }

    /// A new node with a fresh identity and an empty disk, joining through
    /// the first running node.
    fn add_node(&mut self) -> usize {
        let index = self.nodes.len();
        let node_id = NodeId((u128::from(self.rng.next()) << 64) | u128::from(self.rng.next()));
        let identity = NodeIdentity { node_id, incarnation: 1, started_unix_ms: 1 };
        let address = SocketAddr::from(([127, 0, 0, 1], 20_000 + index as u16));
        let store = Rc::new(RefCell::new(MemoryLogStore::with_durability()));
        let replica = replica_id_of(node_id);
        let mut host = ReplicaHost::new(replica, self.host_config, store.clone(), self.rng.next());
        host.set_stream(1, self.config.replication_factor, self.config.partitions);
        let membership = Membership::new(MemberId::new(identity, member_addresses(address)), self.rng.next());
        let next_tick_at = self.now + Duration::from_millis(self.rng.next() % RAFT_TICK_MS);
        let state = NodeState::Running;
        let next_load_at = self.now;
        self.nodes.push(SimNode {
            replica,
            identity,
            address,
            store,
            host,
            membership,
            state,
            next_tick_at,
            next_load_at,
        });
        self.by_address.insert(address, index);
        self.join_through_a_peer(index);
        index
    }

    fn join_through_a_peer(&mut self, index: usize) {
        let seeds: Vec<SocketAddr> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(other, node)| *other != index && node.state == NodeState::Running)
            .map(|(_, node)| node.address)
            .take(1)
            .collect();
        if !seeds.is_empty() {
            self.nodes[index].membership.join(self.now, &seeds);
        }
    }

    /// Runs every step, checking after each; the report, or the first
    /// invariant broken.
    pub fn run(mut self) -> Result<ClusterSimReport, Violation> {
        let started = Instant::now();
        for _ in 0..self.config.steps {
            // A panic in the code under test (raft-rs asserts its own
            // invariants) is a failure of this seed too: report it with it.
            let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step_once()));
            let failure = match stepped {
                Ok(Ok(())) => continue,
                Ok(Err(what)) => what,
                Err(panic) => format!("panic: {}", panic_message(&panic)),
            };
            let replay = self.config.replay_command();
            return Err(Violation { seed: self.config.seed, step: self.step, what: failure, replay });
        }
        self.report.wall_ms = started.elapsed().as_millis() as u64;
        Ok(self.finish())
    }

    /// One step: deliver what is due, run every node, inject the
    /// scenario's events, check.
    pub fn step_once(&mut self) -> Result<(), String> {
        self.step += 1;
        self.now += Duration::from_millis(self.config.step_ms);
        if self.step.is_multiple_of(1000 / self.config.step_ms.max(1)) {
            self.raft_messages_last_s = std::mem::take(&mut self.raft_messages_this_s);
        }
        self.deliver_due();
        let quiet_tail = self.step > self.config.steps - self.config.steps / 4;
        if !quiet_tail {
            self.propose_some();
            self.scenario_event();
        }
        self.heal_links();
        self.restart_due();
        for index in 0..self.nodes.len() {
            self.run_node(index);
        }
        self.check()
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (None, Some(text)) => text.clone(),
        (None, None) => "a panic without a message".to_string(),
    }
}

fn member_addresses(address: SocketAddr) -> MemberAddresses {
    MemberAddresses { cluster: address, ..MemberId::seed(address).addresses }
}

impl ClusterSim {
    fn run_node(&mut self, index: usize) {
        if self.nodes[index].state != NodeState::Running {
            return;
        }
        let now = self.now;
        let node = &mut self.nodes[index];
        node.membership.fire_due_timers(now);
        if node.next_load_at <= now {
            node.membership.publish_load(now, LoadSummary { shards: 1, ..LoadSummary::default() });
            node.next_load_at = now + Duration::from_millis(crate::cluster::driver::LOAD_REFRESH_MS);
        }
        while node.next_tick_at <= now {
            let members = live_members(&node.membership);
            node.host.set_members(members);
            node.host.tick();
            node.next_tick_at += Duration::from_millis(RAFT_TICK_MS);
        }
        node.host.process();
        self.route(index);
    }

    /// Puts node `from`'s datagrams and Raft batches on the network.
    fn route(&mut self, from: usize) {
        let mut packets = Vec::new();
        while let Some((to, data)) = self.nodes[from].membership.take_datagram() {
            if let Some(&to) = self.by_address.get(&to) {
                packets.push((to, Packet::Gossip(data)));
            }
        }
        while self.nodes[from].membership.take_notification().is_some() {}
        for batch in self.nodes[from].host.take_batches() {
            let Some(to) = self.nodes.iter().position(|node| node.replica == batch.to) else { continue };
            self.raft_messages_this_s += batch.messages.len() as u64;
            if let Ok(bytes) = batch.encode() {
                packets.push((to, Packet::Raft(bytes)));
            }
        }
        for (to, packet) in packets {
            self.send(from, to, packet);
        }
    }

    fn send(&mut self, from: usize, to: usize, packet: Packet) {
        if self.rng.next() % 1000 < u64::from(self.config.drop_per_mille) || self.is_cut(from, to) {
            self.report.packets_dropped += 1;
            return;
        }
        let spread = self.config.delay_ms_max.saturating_sub(self.config.delay_ms_min) + 1;
        let delay_ms = self.config.delay_ms_min + self.rng.next() % spread;
        self.packet_sequence += 1;
        let at = self.now + Duration::from_millis(delay_ms);
        self.network.push(Reverse(Scheduled { at, sequence: self.packet_sequence, item: Routed { from, to, packet } }));
    }

    fn is_cut(&self, one: usize, other: usize) -> bool {
        self.cuts.contains_key(&(one.min(other), one.max(other)))
    }

    fn deliver_due(&mut self) {
        while self.network.peek().is_some_and(|Reverse(packet)| packet.at <= self.now) {
            let Some(Reverse(Scheduled { item: packet, .. })) = self.network.pop() else { break };
            if self.nodes[packet.to].state != NodeState::Running || self.is_cut(packet.from, packet.to) {
                self.report.packets_dropped += 1;
                continue;
            }
            self.report.packets_delivered += 1;
            let node = &mut self.nodes[packet.to];
            match packet.packet {
                Packet::Gossip(data) => node.membership.handle_datagram(self.now, &data),
                Packet::Raft(bytes) => {
                    if let Ok(batch) = PeerBatch::decode(&bytes) {
                        node.host.receive(batch);
                    }
                }
            }
        }
    }

    /// The workload: a few frames a step, each to a random group on a
    /// random running node, taken only where that node leads the group
    /// (forwarding to the leader is the next step of the issue).
    fn propose_some(&mut self) {
        let mut budget = self.config.proposals_per_mille;
        while budget > 0 {
            let chance = budget.min(1000);
            budget -= chance;
            if self.rng.next() % 1000 >= u64::from(chance) {
                continue;
            }
            let index = (self.rng.next() % self.nodes.len() as u64) as usize;
            let group =
                GroupId { stream_id: 1, partition: (self.rng.next() % u64::from(self.config.partitions)) as u32 };
            let node = &mut self.nodes[index];
            if node.state != NodeState::Running {
                continue;
            }
            let sequence = self.next_sequence.get(&(node.replica, group)).copied().unwrap_or(0);
            let header = ProposalHeader { source_node: node.replica, source_sequence: sequence, record_count: 1 };
            if node.host.propose(group, header, &[sequence.to_le_bytes()]).is_ok() {
                self.next_sequence.insert((node.replica, group), sequence + 1);
                self.report.proposals += 1;
            }
        }
    }
}

/// The members placement may use: alive or merely suspected (moving a
/// replica on a suspicion would copy a log for nothing), one per replica id.
fn live_members(membership: &Membership) -> Vec<Candidate> {
    let mut members: Vec<Candidate> = membership
        .members()
        .into_iter()
        .filter(|member| matches!(member.state, MemberState::Alive | MemberState::Suspect))
        .map(|member| {
            let shards = member.load.map_or(1, |entry| entry.broadcast.load.shards.max(1));
            Candidate { replica: replica_id_of(member.id.node_id), weight: f64::from(shards) }
        })
        .collect();
    members.sort_by_key(|member| member.replica);
    members.dedup_by_key(|member| member.replica);
    members
}

impl ClusterSim {
    fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|index| self.nodes[*index].state == NodeState::Running).collect()
    }

    /// Now and then (mean [`ClusterSimConfig::fault_every_steps`]), one of:
    /// a join, a leave, a crash with a later restart, a link cut. At most
    /// one node is down at a time, a leave keeps at least RF nodes and
    /// waits until every group is placed (a leave without the hand-over,
    /// which is not built yet, would otherwise take a second replica of a
    /// group still missing one), so the cluster can make progress.
    fn scenario_event(&mut self) {
        let every = self.config.fault_every_steps;
        if every == 0 || !self.rng.next().is_multiple_of(every) {
            return;
        }
        let running = self.running();
        let all_up = running.len() == self.nodes.iter().filter(|node| node.state != NodeState::Left).count();
        let pick = |rng: &mut SeededRng, from: &[usize]| {
            from[(rng.next() % from.len().max(1) as u64) as usize % from.len().max(1)]
        };
        if running.is_empty() {
            return;
        }
        match self.rng.next() % 4 {
            0 if self.nodes.len() < self.config.nodes + self.config.nodes.div_ceil(2) => {
                self.add_node();
                self.report.joins += 1;
            }
            1 if all_up && running.len() > self.config.replication_factor.max(3) && self.all_placed(&running) => {
                let leaver = pick(&mut self.rng, &running);
                self.nodes[leaver].membership.leave(self.now);
                self.route(leaver);
                self.nodes[leaver].state = NodeState::Left;
                self.report.leaves += 1;
            }
            2 if all_up && running.len() > 1 => {
                let victim = pick(&mut self.rng, &running);
                self.nodes[victim].store.borrow_mut().crash();
                let restart_step = self.step + 50 + self.rng.next() % 400;
                self.nodes[victim].state = NodeState::Crashed { restart_step };
                self.report.crashes += 1;
            }
            3 if running.len() > 1 => {
                let one = pick(&mut self.rng, &running);
                let other = pick(&mut self.rng, &running);
                if one != other {
                    let heal_step = self.step + 50 + self.rng.next() % 500;
                    self.cuts.insert((one.min(other), one.max(other)), heal_step);
                    self.report.cuts += 1;
                }
            }
            _ => {}
        }
    }

    fn heal_links(&mut self) {
        let step = self.step;
        let quiet_tail = self.step > self.config.steps - self.config.steps / 4;
        self.cuts.retain(|_, heal_step| *heal_step > step && !quiet_tail);
    }

    /// Restarts crashed nodes whose time has come: the same identity with
    /// the next incarnation, the host rebuilt from what the disk kept.
    fn restart_due(&mut self) {
        let quiet_tail = self.step > self.config.steps - self.config.steps / 4;
        for index in 0..self.nodes.len() {
            let NodeState::Crashed { restart_step } = self.nodes[index].state else { continue };
            if restart_step > self.step && !quiet_tail {
                continue;
            }
            let node = &mut self.nodes[index];
            node.identity.incarnation += 1;
            node.host = ReplicaHost::new(node.replica, self.host_config, node.store.clone(), self.rng.next());
            node.host.set_stream(1, self.config.replication_factor, self.config.partitions);
            let identity = MemberId::new(node.identity, member_addresses(node.address));
            node.membership = Membership::new(identity, self.rng.next());
            node.next_tick_at = self.now;
            node.state = NodeState::Running;
            self.checker.forget(index);
            self.join_through_a_peer(index);
        }
    }

    /// Every invariant of the module doc, over every running node.
    fn check(&mut self) -> Result<(), String> {
        if self.step.is_multiple_of(200) {
            self.checker.forget_all();
        }
        for index in 0..self.nodes.len() {
            if self.nodes[index].state != NodeState::Running {
                continue;
            }
            let groups: Vec<GroupId> = self.nodes[index].host.groups().collect();
            for group in groups {
                let Some(status) = self.nodes[index].host.status(group) else { continue };
                if status.role == raft::StateRole::Leader {
                    self.checker.check_leader(group, status.term, self.nodes[index].replica)?;
                }
                let store = self.nodes[index].store.clone();
                self.checker.check_log(index, group, status.commit, &store.borrow())?;
            }
            let acks = self.nodes[index].host.take_acks();
            self.checker.check_acks(acks)?;
            if self.nodes[index].host.counters.conf_change_errors > 0 {
                return Err(format!("node {index}: raft-rs refused a committed configuration change"));
            }
        }
        Ok(())
    }
}

impl ClusterSim {
    fn finish(mut self) -> ClusterSimReport {
        let running = self.running();
        let mut report = std::mem::take(&mut self.report);
        report.steps = self.step;
        report.acks = self.checker.acks;
        report.committed_entries = self.checker.committed_entries;
        report.leaders_seen = self.checker.leaders_seen;
        report.idle_messages_last_s = self.raft_messages_last_s;
        for node in &self.nodes {
            let counters = node.host.counters;
            report.raft_messages += counters.messages_sent;
            report.raft_batches += counters.batches_sent;
            report.syncs += counters.syncs;
            report.reconfig_steps += counters.reconfig_steps;
        }
        for index in &running {
            report.replicas += self.nodes[*index].host.groups().count();
            report.groups_quiet += self.nodes[*index].host.quiet_groups();
        }
        report.groups_placed = self.groups_placed(&running);
        report
    }

    fn all_placed(&self, running: &[usize]) -> bool {
        self.groups_placed(running) == self.config.partitions as usize
    }

    /// Groups whose leader (on a running node) has exactly the replicas
    /// placement desires over the running nodes, led by the preferred one.
    fn groups_placed(&self, running: &[usize]) -> usize {
        let candidates: Vec<Candidate> =
            running.iter().map(|index| Candidate { replica: self.nodes[*index].replica, weight: 1.0 }).collect();
        let placed = balanced_leaders(1, self.config.partitions, &candidates, self.config.replication_factor);
        (0..self.config.partitions)
            .filter(|partition| {
                let group = GroupId { stream_id: 1, partition: *partition };
                let mut desired = placed[*partition as usize].replicas.clone();
                let preferred = desired.first().copied();
                desired.sort_unstable();
                running.iter().any(|index| {
                    let node = &self.nodes[*index];
                    node.host.status(group).is_some_and(|status| {
                        status.role == raft::StateRole::Leader
                            && Some(node.replica) == preferred
                            && status.voters == desired
                            && status.learners.is_empty()
                    })
                })
            })
            .count()
    }
}

/// `spate simulate --nodes N`'s flags beyond the balancer simulator's
/// (which give `--seed` and `--partitions`).
#[derive(Clone, Debug, clap::Args)]
pub struct ClusterSimArgs {
    /// Simulate a cluster of this many nodes (the replication simulator)
    /// instead of the shards of one node.
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Steps of 10 simulated ms each (with --nodes).
    #[arg(long, default_value_t = 6000)]
    pub steps: u64,
    /// Replicas per partition (with --nodes).
    #[arg(long, default_value_t = 3)]
    pub rf: usize,
}

/// Runs one simulation from the flags; `seed` and `partitions` come from
/// the shared flags (a random seed when none was given: it is printed).
pub fn try_run(
    nodes: usize,
    args: &ClusterSimArgs,
    seed: Option<u64>,
    partitions: Option<u32>,
) -> Result<ClusterSimReport, Box<dyn std::error::Error>> {
    let seed = seed.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        now.as_nanos() as u64 ^ u64::from(std::process::id())
    });
    let config = ClusterSimConfig {
        nodes,
        seed,
        steps: args.steps,
        partitions: partitions.unwrap_or(16),
        replication_factor: args.rf,
        ..ClusterSimConfig::default()
    };
    println!("{}", config.replay_command());
    let simulation = ClusterSim::new(config)?;
    Ok(simulation.run()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: ClusterSimConfig) -> ClusterSimReport {
        match ClusterSim::new(config).map(ClusterSim::run) {
            Ok(Ok(report)) => report,
            Ok(Err(violation)) => panic!("{violation}"),
            Err(error) => panic!("{error}"),
        }
    }

    /// Two runs of one seed do the same thing, packet for packet; another
    /// seed does not.
    #[test]
    fn a_seed_replays_the_same_run() {
        let summary = |seed| {
            let report = run(ClusterSimConfig { seed, steps: 3000, ..ClusterSimConfig::default() });
            (
                report.packets_delivered,
                report.packets_dropped,
                report.committed_entries,
                report.leaders_seen,
                report.acks,
            )
        };
        assert_eq!(summary(11), summary(11));
        assert_ne!(summary(11), summary(12));
    }

    /// Without faults, every group ends on its desired replicas led by its
    /// preferred leader, every replica is quiet and an idle second carries
    /// no Raft message at all.
    #[test]
    fn an_idle_cluster_is_placed_and_quiet() {
        for seed in 0..5 {
            let config = ClusterSimConfig { seed, steps: 4000, fault_every_steps: 0, ..ClusterSimConfig::default() };
            let report = run(config);
            assert_eq!(report.groups_placed, 16, "seed {seed}: {report}");
            assert_eq!(report.groups_quiet, report.replicas, "seed {seed}: {report}");
            assert_eq!(report.idle_messages_last_s, 0, "seed {seed}: {report}");
            assert!(report.acks > 100, "seed {seed}: the workload did not run: {report}");
        }
    }

    /// A node that joins takes its share: at the end every group is placed
    /// by HRW over the six nodes (so the newcomer holds about RF/N of the
    /// replicas and leads about 1/N of the groups).
    #[test]
    fn a_joining_node_takes_its_share() {
        for seed in 0..3 {
            let config = ClusterSimConfig {
                seed,
                steps: 4000,
                fault_every_steps: 0,
                partitions: 32,
                ..ClusterSimConfig::default()
            };
            let mut simulation = ClusterSim::new(config).expect("valid");
            for _ in 0..1000 {
                simulation.step_once().unwrap_or_else(|what| panic!("seed {seed}: {what}"));
            }
            let newcomer = simulation.add_node();
            while simulation.step < config.steps {
                simulation.step_once().unwrap_or_else(|what| panic!("seed {seed}: {what}"));
            }
            let replicas = simulation.nodes[newcomer].host.groups().count();
            let report = simulation.finish();
            assert_eq!(report.groups_placed, 32, "seed {seed}: {report}");
            assert!((8..=24).contains(&replicas), "seed {seed}: the newcomer holds {replicas} of 96 replicas");
        }
    }

    /// The checker catches each kind of violation it exists for.
    #[test]
    fn the_checker_catches_broken_invariants() {
        let group = GroupId { stream_id: 1, partition: 0 };
        let mut checker = Checker::default();
        assert!(checker.check_leader(group, 3, 7).is_ok());
        assert!(checker.check_leader(group, 3, 8).is_err(), "two leaders in one term");
        let entry = |term, source_sequence| raft::eraftpb::Entry {
            term,
            index: 1,
            data: crate::replication::frame::encode_proposal(
                ProposalHeader { source_node: 7, source_sequence, record_count: 1 },
                &[b"x"],
            )
            .into(),
            ..raft::eraftpb::Entry::default()
        };
        let mut store = MemoryLogStore::new();
        store.create(group, crate::replication::store::GroupLog::default());
        store.append(group, &[entry(1, 5)]);
        assert!(checker.check_log(0, group, 1, &store).is_ok());
        let mut changed = MemoryLogStore::new();
        changed.create(group, crate::replication::store::GroupLog::default());
        changed.append(group, &[entry(2, 5)]);
        assert!(checker.check_log(1, group, 1, &changed).is_err(), "a committed entry changed");
        assert!(checker.check_log(2, group, 2, &store).is_err(), "a committed entry is missing");
        let mut duplicate = MemoryLogStore::new();
        duplicate.create(group, crate::replication::store::GroupLog::default());
        let mut second = entry(1, 5);
        second.index = 2;
        duplicate.append(group, &[entry(1, 5), second]);
        assert!(checker.check_log(3, group, 2, &duplicate).is_err(), "a proposal committed twice");
        let header = ProposalHeader { source_node: 7, source_sequence: 9, record_count: 1 };
        assert!(checker.check_acks(vec![Ack { group, header, index: 1 }]).is_err(), "an ack of another entry");
    }
}
