//! Replicated partitions: every (stream, partition) is a Raft group
//! (raft-rs, TiKV's `RawNode`), and the logic that decides is sans-IO, so the
//! real node and `spate simulate --nodes N` run the same code.
//!
//! - [`placement`]: where a group's replicas should live: weighted
//!   rendezvous hashing over the live members (desired set = top RF,
//!   preferred leader = first), weights = capacity (shards), not load.
//! - [`host`]: [`host::ReplicaHost`], every group of one node: ticks, steps,
//!   one store sync per round for all groups, one [`wire::PeerBatch`] per
//!   peer per round, quiet (hibernated) groups, acks of applied proposals,
//!   and the leader-driven reconfiguration.
//! - [`reconfig`]: the pure rule a group's leader follows towards the
//!   desired replicas (learner, catch up, joint promote + remove, transfer).
//! - [`store`]: [`store::LogStore`], the node's store of every group's log
//!   and hard state; [`store::MemoryLogStore`] (and, with durability
//!   tracking, the simulated disk).
//! - [`frame`]: an entry is a spate frame (a batch of records) behind a
//!   (source node, source sequence) header for deduplication.
//! - [`wire`]: the per-peer batch's encoding (bounded decoder).
//! - [`sim`]: the deterministic cluster simulator and its invariant checker.
//! - [`node`]: the real node's wiring (first slice): one host on the
//!   cluster thread, [`file_store::FileLogStore`] as its durable store, the
//!   transport for its peer batches and forwarded proposals, and the shards'
//!   proposals and committed records ([`crate::shard::replicated`]).
//! - The cluster's catalog is one more group, [`CATALOG_GROUP`], whose
//!   entries are stream creates and deletes that every node applies
//!   ([`node`], "The catalog group"; [`crate::admin::replicated`]).
//! - [`catchup`]: the records a replica's partition lacks before a
//!   snapshot's point, fetched in bounded chunks from a peer's partition
//!   log over the transport ([`crate::shard::gap_read`] reads them there).
//!
//! # A group's state
//!
//! On each replica a group is: its Raft log (entries from index 1, each
//! either a configuration change or a frame; compacted once applied and
//! durable in the partition, [`node`] "Compaction and snapshots"), its hard
//! state (term, vote, commit) and its applied index with the configuration
//! as of it (voters, learners, outgoing voters while joint), all in the
//! node's [`store::LogStore`]; in memory, the `RawNode` (role, leader,
//! progress of each peer when leading) and the host's quiet state. The
//! partition's data *is* the committed log: offsets are log positions of
//! frames, identical on every replica. What the next issue adds to the
//! replicated state is the dedup table: per source node, the highest source
//! sequence applied, so that even a proposal retried as a new one after
//! its timeout is dropped instead of stored twice (the header is already
//! in every entry). Until then a retry within the timeout is deduplicated
//! by the leader's log ([`node`], "Retries").
//!
//! # Wiring into the node (the target; [`node`] has what runs today)
//!
//! - **Store: the shard WAL implements [`store::LogStore`].** `append` and
//!   `set_hard_state` become WAL records of the shard's group commit,
//!   `sync` is its one fdatasync (so every group of a shard shares it, as
//!   every partition does today), reads come from the partition's segments
//!   and tail cache, and a checkpoint lets a group's log be compacted; a
//!   lagging or new replica then catches up from a snapshot that streams
//!   segments (today the node's own store compacts, a snapshot carries
//!   only its metadata and the partition offset, and the records come
//!   apart, fetched by [`catchup`] from a peer's partition log).
//! - **Host: one [`host::ReplicaHost`] per shard,** owning the groups of the
//!   partitions that shard owns (a group moves with its partition between
//!   shards, as its log does). The shard's committer calls `process()`
//!   after each group commit, a shard timer calls `tick()` every
//!   [`host::RAFT_TICK_MS`], and applied frames go to the partition's apply
//!   (log, aggregates, subscribers up to the commit index); `take_acks()`
//!   answers `#SYNC` and returns credits.
//! - **Transport: [`wire::PeerBatch`] is a transport message.** Each shard
//!   hands its batches to the cluster thread's per-peer queue
//!   ([`crate::transport`], credit-bounded, so a slow peer pushes back);
//!   the receiving cluster thread decodes and routes each group's messages
//!   to the shard owning that partition (merging the shards' batches per
//!   peer keeps one message per node pair per tick).
//! - **Membership: the cluster thread's live members** (alive or suspect,
//!   weight = shard count from the load gossip) go to every host's
//!   `set_members`, as the simulator does from foca.
//! - **Node ids:** a node's Raft id is [`replica_id_of`] its
//!   [`NodeId`](crate::cluster::NodeId).

pub mod catchup;
pub mod file_store;
pub mod frame;
pub mod host;
pub mod mirror;
pub mod node;
pub mod placement;
pub mod reconfig;
pub mod sim;
pub mod store;
pub mod wire;

use crate::cluster::NodeId;

/// A node as a Raft peer: raft-rs names peers by a non-zero `u64`, derived
/// from the node's 128-bit [`NodeId`] by [`replica_id_of`].
pub type ReplicaId = u64;

/// One Raft group: a (stream, partition).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId {
    pub stream_id: u32,
    pub partition: u32,
}

/// The cluster's catalog: one Raft group whose entries are stream creates
/// and deletes ([`node`], "The catalog group"). Its stream part is one no
/// replicated stream may take ([`crate::stream::Catalog::create`] refuses a
/// name hashing to it).
pub const CATALOG_GROUP: GroupId = GroupId { stream_id: u32::MAX, partition: 0 };

/// The Raft peer id of a node: the xor of its id's halves, or 1 if that is
/// 0 (raft-rs reserves 0 for "none"). Two nodes colliding needs equal
/// halves-xor of random 128-bit ids (2^-64); a node refusing a member with
/// its own replica id is the wiring's job.
pub fn replica_id_of(node_id: NodeId) -> ReplicaId {
    let folded = (node_id.0 as u64) ^ ((node_id.0 >> 64) as u64);
    if folded == 0 { 1 } else { folded }
}
