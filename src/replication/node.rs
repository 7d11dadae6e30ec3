//! The replication of a real node: the [`ReplicaHost`] of every Raft group
//! this node holds, run on the cluster thread beside the membership and the
//! transport, and its two ends on the shards (proposals in, committed
//! records out).
//!
//! **Why the cluster thread, for now.** The issue wants one host per shard,
//! each with the groups of the partitions it owns, sharing the shard WAL's
//! fsync. This first slice runs one host per node on the cluster thread:
//! the peer batches go straight into the transport's queues (one message
//! per node pair per tick, as designed), no Raft message has to be routed
//! to the shard owning its partition (which moves between shards), and a
//! partition moving between shards needs nothing from its group. The costs:
//! proposals and committed records cross one thread boundary each way, the
//! Raft log is its own file (its own fsync, not the shard WAL's), and every
//! replicated partition of the node shares one thread's CPU.
//!
//! # The path of an event
//!
//! 1. A shard applying a batch ([`crate::shard`]) takes out the records of
//!    replicated partitions, one [`ProposalRequest`] per partition (the
//!    records in log format: a spate frame, never one event), and applies
//!    the rest of the batch and returns its credits only once they are
//!    committed, so `#SYNC` (which waits for the credits) answers only once
//!    they are committed, and producers are pushed back meanwhile. It does
//!    not wait for one batch before proposing the next (pipelining,
//!    [`crate::shard::replicated`]).
//! 2. Here a proposal goes to its group: proposed when this node leads it,
//!    else forwarded to the leader over the transport ([`Channel::Propose`])
//!    with this node's id in its header. The entry's header names the node
//!    that proposed, so the node whose own replica applies it answers.
//! 3. Committed entries are delivered in log order to the shard owning the
//!    partition ([`CommittedRecords`]), on every replica alike, with the
//!    offset their first record must take: the shard appends what it does
//!    not have yet and says where its log ends, so a replica that lost an
//!    unsynced tail in a crash gets it again, and one that has it gets
//!    nothing twice. So offsets are log positions, identical on every
//!    replica, and subscribers (who read the partition's log) see committed
//!    events only.
//! 4. A proposal is answered once its entry is committed: durable on a
//!    majority, which is what `#SYNC` promises. A leader knows it when it
//!    applies the entry; a node that forwarded it hears it from the leader
//!    ([`Channel::ProposeAck`]) or applies it itself, whichever comes first.
//!    Committed entries are handed out by raft-rs only once this node has
//!    them durable too, so both happen in the first half of a round, not
//!    one sync later. The delivery to this node's partition (what its
//!    subscribers read) follows on its own, usually within the same round:
//!    waiting for it too cost a third of the `#SYNC` p99 at 256 partitions
//!    (measured in stop 36), and the promise is durability, not
//!    visibility here. Until then the records are in the Raft log, whose
//!    bound refuses proposals when delivery falls behind.
//!
//! # Pipelining
//!
//! Many proposals are in flight at once, so a round must carry many: the
//! cluster thread steps everything that arrived and takes every queued
//! proposal before one round (one fdatasync, one [`PeerBatch`] per peer,
//! cut at [`crate::replication::wire::BATCH_BYTES_MAX`]). A leader streams
//! appends without waiting for each answer (the host's
//! `inflight_messages_max`). A peer batch or forwarded proposal that finds
//! the transport's queue full waits, in order, up to [`UNSENT_BYTES_MAX`]
//! per peer: dropping a pipelined append would make the leader find the gap
//! only at the next heartbeat and send everything after it again. A shard's
//! proposals of one group carry sequences that this node takes only in
//! order ([`ProposalRequest`]), so a refusal never lets a later batch
//! overtake an earlier one.
//!
//! A batch spread over many partitions makes one small proposal per
//! partition (a 10 ms tick of 1000 events over 256 partitions: about 250).
//! Three things keep that from costing per batch what it costs per group:
//! - the proposals one drain of the shards' queue takes are proposed as
//!   runs ([`ReplicationNode::propose_queued`]): a (shard, group)'s
//!   consecutive proposals become one entry, answered together;
//! - committed records go to the shards in waves ([`deliver`]): every due
//!   group's delivery is sent before any answer is awaited, so a round
//!   costs one wait for the shard, not one per group;
//! - each `Ready` is advanced as soon as its writes are in the store
//!   (raft-rs's `advance_append_async`), and the Raft log's write and
//!   fdatasync run on glommio's blocking thread in a sync task of their
//!   own, one at a time, each covering every round since the last: the
//!   leaders' appends leave before the sync (their followers write and
//!   sync meanwhile), the messages that need the writes durable wait for
//!   it (`on_persist_ready`), and this thread keeps stepping, proposing,
//!   sending and delivering meanwhile, so a message that arrives during a
//!   sync waits for it only if its answer needs it;
//! - a shard never finds its queue to this thread full: it waits for room
//!   among its own outstanding proposals
//!   ([`crate::shard::replicated::PROPOSALS_OUTSTANDING_MAX`]), and the
//!   queue holds each of them twice. (Before, a full queue refused the
//!   proposal as if there were no leader, every refusal made the shard
//!   propose the group's later ones again, and at 256 partitions the
//!   queue never drained: most `#SYNC`s waited tens of seconds.)
//!
//! # Refused forwards
//!
//! A leader may not take a forwarded proposal: raft-rs drops proposals
//! while leadership is in transfer (every join and leave moves leaders),
//! and a full Raft log refuses them. The leader then says so at once
//! ([`Channel::ProposeRefused`]) instead of letting the proposer wait for
//! [`PROPOSAL_TIMEOUT_MS`]. For order it also refuses every later
//! proposal of that node for the group, until one comes as
//! [`Channel::ProposeAfterRefusal`]: the later ones follow the refused one
//! on the same connection, so the proposer, on the refusal, answers them
//! all refused at once, sets each shard's next expected sequence back to
//! its first refused one, and the shards propose them again in order
//! (the first of them marked as coming after the refusal). A proposal
//! taken by a leader that then loses its leadership before the commit is
//! sent again (next section).
//!
//! A refusal is about one send, and a proposal sent again (next section)
//! may be refused through one send after another was taken: the deposed
//! leader of its first send refuses it (it was in a leadership transfer)
//! after its retry reached the new leader, or a node that knows no leader
//! refuses the retry of one the old leader took. Answered refused, its
//! records would be proposed again by the shard under a new header and
//! stored twice (seen in CI as a key's events going back, in the
//! join-and-leave test). So a refusal answers the proposal (and sweeps
//! the later ones) only when each of them was sent once; else the refused
//! one is sent again at the next tick as [`Channel::ProposeAfterRefusal`],
//! which the leader, like a retry, looks up in its log before it takes it
//! (`spate_raft_refusals_of_resent_total`), and the group takes no new
//! proposal until the ones pending then are answered: the resend ends the
//! refusing node's refusals, and a new proposal taken there would be swept
//! along by the refusals of the earlier ones still on their way back. For
//! the same reason a node that passes proposals on refuses one whose
//! leader is another than the one it passed the proposer's last one of the
//! group to: the old leader may refuse the earlier one while the new one
//! takes this one.
//!
//! # Retries
//!
//! A leader that dies (or is deposed) may have taken proposals it never
//! committed, and the answer of one it did commit may be lost with it. So
//! each pending proposal keeps its header and records (shared bytes), and
//! each Raft tick ([`ReplicationNode::retry_proposals`]) sends again, as
//! [`Channel::ProposeRetry`] with the same header, those whose group's
//! leader is now another than the node they went to (the election's
//! outcome, 1 - 2 s after the death), and those unanswered for
//! [`PROPOSAL_RETRY_MS`] since they were last sent (a lost message, a
//! proposer that holds no replica and so sees no election), in sequence
//! order. A new proposal whose group's leader changed sends the group's
//! pending ones to the new leader first, so it does not overtake them.
//!
//! The leader that gets a retry looks for its header in its log
//! ([`ReplicaHost::find_proposal`], the last
//! [`crate::replication::host::DEDUP_SCAN_ENTRIES_MAX`] entries): one it
//! holds was replicated to it before the old leader died, and it commits
//! it as it commits everything in its log, so it does not store it again;
//! it answers it at once if already applied, else when it applies it (as
//! for any forwarded proposal). Only one it does not hold is proposed. A
//! proposal passed on by another node is looked for too: the first send,
//! still on its way through the deposed leader, may come after its retry.
//! So a leader's death costs its producers about an election, not
//! [`PROPOSAL_TIMEOUT_MS`], and stores nothing twice; what can still
//! store a proposal twice is the timeout's retry as a new proposal, and a
//! copy older than the scan's reach. Metrics:
//! `spate_raft_proposals_retried_total`,
//! `spate_raft_proposals_deduplicated_total`.
//!
//! # Compaction and snapshots
//!
//! A group's log is compacted on each node by itself, up to a point whose
//! entries are applied and whose records are durable in the partition's
//! log: each delivery's answer says where the partition's log ends and up
//! to where it survives a kill -9 under the fsync policy
//! ([`PartitionEnd`]); the delivered positions are kept per group and the
//! newest one below that is the compaction point (never before the last
//! configuration change, so the configuration as of it is known). A tail
//! of an eighth of the store's bound (shared by the groups) stays, and a
//! leader keeps what a live follower has not matched while the store is
//! under half full, so a follower that lags briefly catches up from the
//! log. After a restart, delivery starts at the compaction point's offset;
//! the partition holds it, since only durable records were compacted.
//!
//! A peer that needs a compacted entry gets a Raft snapshot: index, term,
//! configuration, and the partition offset after it in its data, a few
//! bytes, so nothing to bound. It describes the newest applied entry, not
//! the compaction point ([`crate::replication::store::GroupLog::snapshot_point`]):
//! a replica removed while it was down and added back as a learner is in
//! no configuration as old as the compaction point, and raft-rs refuses a
//! snapshot that does not name it. The leader takes each snapshot as
//! delivered once it is queued (the transport delivers at most once, and
//! raft-rs would otherwise pause that follower until told), so a lost one
//! is sent again after the next probe.
//!
//! The replica installs it, but its partition then lacks the records
//! before the point (the gap): its delivery finds the partition ending
//! before the snapshot's offset, counts it (`spate_raft_partition_gaps_total`,
//! logged once per episode) and waits, and the node fetches the records
//! `[partition end, snapshot offset)` from another replica's partition log
//! over the transport, in chunks of at most 1 MiB, one request per group
//! and two groups at once, retrying on the next replica with a backoff
//! when one dies or lacks them ([`crate::replication::catchup`]). Each
//! chunk is delivered to the shard like committed records, at the offset
//! its first record takes, so the records keep their offsets. Once the
//! partition reaches the offset, the delivery of committed entries goes on
//! (`spate_raft_gaps_open` goes back to 0). A peer whose retention deleted
//! the records cannot help: that is logged and counted
//! (`spate_raft_gap_peer_lacked_total`), and the fetch keeps asking the
//! other replicas.
//!
//! # Groups
//!
//! The groups are those of the streams with a replication factor above 1
//! (the admin thread gives the catalog after every change). A group's id is
//! (a hash of the stream's name, the stream's partition), the same on
//! every node (each allocates its own stream ids). A node with the
//! stream that is in the group's desired replicas (placement over the live
//! members, once at least that many are live) bootstraps the group with
//! those replicas; a node the leader adds later gets the group from the
//! leader's first append.
//!
//! # The catalog group
//!
//! One more group, [`CATALOG_GROUP`], holds the cluster's catalog: its
//! entries are catalog commands (JSON, [`crate::admin::replicated`]) behind
//! the same proposal header, proposed and forwarded like a shard's
//! ([`ReplicationNode::propose_catalog`], under a shard number no shard
//! has). Its placement: voters the top `min(`[`CATALOG_VOTERS_MAX`]`, live
//! members)` by rendezvous hashing (re-set at every membership change),
//! and every other live member a learner
//! ([`ReplicaHost::set_learners_everywhere`]), so every node holds its log
//! and the leader's usual reconfiguration steps keep it so as nodes join
//! and leave. Only the node started without `--join` (the founder) creates
//! it, alone, at its first start (never once it applied any entry): a node
//! that joins never bootstraps one, so two catalogs cannot start apart.
//! Its committed entries are not delivered to a shard: a task of the
//! cluster thread hands them, in order, to the admin thread, which applies
//! them to the node's catalog and says up to where ([`CatalogEntries`]).
//! A proposal is answered at its commit, like a shard's; the admin thread
//! answers its request once its own apply recorded the command's outcome
//! (by the command's request id). The catalog saves
//! the last applied index, from which a restarted node goes on. Its log is
//! never compacted (an entry per create or delete), so a node that joins
//! later replays it from index 1 and no snapshot has to carry a catalog.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::cluster::NodeId;
use crate::cluster::membership::{MemberState, MemberView};
use crate::protocol::record::decode_log_record;
use crate::replication::file_store::{FileLogStore, SyncJob};
use crate::replication::frame::{ProposalHeader, decode_proposal, encode_proposal_into};
use crate::replication::host::{HostConfig, ProposeError, ReplicaHost};
use crate::replication::placement::{Candidate, desired_replicas};
use crate::replication::store::{Compacted, LogStore};
use crate::replication::wire::PeerBatch;
use crate::replication::{CATALOG_GROUP, GroupId, ReplicaId, replica_id_of};
use crate::runtime::log;
use crate::stream::StreamSpec;
use crate::transport::{Channel, SendError, TransportHandle};

/// How long a proposal may wait for its commit before it is answered
/// [`ProposalRefused::TimedOut`] (the shard proposes it again, as a new
/// proposal: stored twice if the first did commit after all). Retries
/// ([`PROPOSAL_RETRY_MS`], module doc "Retries") answer nearly all before.
pub const PROPOSAL_TIMEOUT_MS: u64 = 10_000;
/// A proposal unanswered this long since it was last sent goes again, as
/// the same proposal, to the leader this node knows now (module doc,
/// "Retries"); one whose leader changed goes at once.
pub const PROPOSAL_RETRY_MS: u64 = 2_000;
/// Proposals waiting for their commit at once; more are refused (the
/// shards' credit windows keep them far below).
pub const PROPOSALS_PENDING_MAX: usize = 65_536;
/// Bytes of records one entry carries when several queued proposals of a
/// (shard, group) are proposed together (module doc, "Pipelining").
pub const PROPOSAL_RUN_BYTES_MAX: usize = 256 << 10;
/// Bytes of records delivered to a shard in one request.
pub const DELIVERY_BYTES_MAX: usize = 1 << 20;
/// Bytes of records in the deliveries sent to the shards at once (one
/// wave, [`deliver`]); a wave may pass it by one delivery.
pub const DELIVERY_WAVE_BYTES_MAX: usize = 8 << 20;
/// Bytes of Raft batches and forwarded proposals kept for one peer while
/// the transport's queue to it is full (module doc, "Pipelining"); past it
/// a Raft batch is dropped (Raft sends its entries again) and a forwarded
/// proposal refused (the shard proposes it again).
pub const UNSENT_BYTES_MAX: usize = 16 << 20;
/// Ticks without a message from an awake group's leader after which a
/// leaving node takes itself as removed from it ([`ReplicationNode::replicas_held`]):
/// five heartbeat intervals.
const REMOVED_SILENT_TICKS: u32 = 10;
/// (Proposing node, group) pairs a node refuses forwards of at once
/// (module doc, "Refused forwards"): nodes x groups in practice; past it
/// the oldest state is forgotten, which costs order only if that very pair
/// is still in a refusal.
const REFUSING_MAX: usize = 65_536;
/// How long a shard may take to answer a delivery before the next round
/// asks again, in ms.
const DELIVERY_TIMEOUT_MS: u64 = 5_000;
/// Most voters of the catalog group: `min(3, live members)`; every other
/// live member is its learner (module doc, "The catalog group").
pub const CATALOG_VOTERS_MAX: usize = 3;
/// Catalog entries handed to the admin thread at once.
pub const CATALOG_ENTRIES_PER_APPLY_MAX: usize = 64;
/// The "shard" catalog proposals are numbered under (no real shard has it).
const CATALOG_SHARD: u16 = u16::MAX;

/// Committed entries of the catalog group for the admin thread to apply
/// to this node's catalog, in log order: (Raft index, command). `through`
/// is the last index they cover (configuration entries between them carry
/// no command); the answer is the last index applied, `through` unless an
/// entry could not be applied yet (it comes again).
pub struct CatalogEntries {
    pub entries: Vec<(u64, Bytes)>,
    pub through: u64,
    pub reply: flume::Sender<u64>,
}

/// A shard's request: replicate `records` (log-format records of one
/// partition) through `group`; answered once committed here.
///
/// A shard keeps several proposals of one group in flight (module doc,
/// "Pipelining"): `sequence` numbers them per (shard, group), and one that
/// does not follow the last taken is refused [`ProposalRefused::OutOfOrder`],
/// so a refused proposal is never overtaken by a later one of the same
/// shard and group.
pub struct ProposalRequest {
    pub group: GroupId,
    /// The proposing shard: sequences are per (shard, group).
    pub shard: u16,
    pub sequence: u64,
    /// Take it whatever the sequence expected: the retry of a proposal whose
    /// answer was lost or timed out (it was taken, so later ones may be too).
    pub resync: bool,
    pub records: Bytes,
    pub record_count: u32,
    pub reply: flume::Sender<Result<(), ProposalRefused>>,
}

/// Why a proposal was not committed: the shard tries again a moment later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposalRefused {
    /// This node holds no replica of the group (yet).
    NotAReplica,
    /// The group has no leader this node knows of (an election).
    NoLeader,
    TimedOut,
    /// The Raft store is full ([`crate::replication::file_store::ENTRY_BYTES_MAX`]).
    StoreFull,
    TooManyPending,
    /// An earlier proposal of the same shard and group was refused: this
    /// one waits for it, so their records stay in order.
    OutOfOrder,
    /// The node it was forwarded to did not take it (a leadership transfer,
    /// a full Raft log): module doc, "Refused forwards".
    LeaderRefused,
    /// The queue from the shard to the cluster thread had no room.
    NotQueued,
    /// An earlier proposal of the group, refused after it was sent more
    /// than once, is being sent again: module doc, "Refused forwards".
    EarlierResent,
}

impl std::fmt::Display for ProposalRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProposalRefused::NotAReplica => write!(f, "this node holds no replica of the partition"),
            ProposalRefused::NoLeader => write!(f, "the partition's group has no leader yet"),
            ProposalRefused::TimedOut => write!(f, "not committed within {PROPOSAL_TIMEOUT_MS} ms"),
            ProposalRefused::StoreFull => write!(f, "the node's Raft log is full"),
            ProposalRefused::TooManyPending => write!(f, "{PROPOSALS_PENDING_MAX} proposals are pending"),
            ProposalRefused::OutOfOrder => write!(f, "an earlier proposal of this shard and partition was refused"),
            ProposalRefused::LeaderRefused => write!(f, "the leader it was forwarded to did not take it"),
            ProposalRefused::NotQueued => write!(f, "the queue to the cluster thread is full"),
            ProposalRefused::EarlierResent => write!(f, "an earlier proposal of the partition is being sent again"),
        }
    }
}

/// Committed records for a shard: append those of `records` from offset
/// `first_offset` on that the partition does not have; the answer is where
/// its log ends then, or `None` when the shard does not own the partition.
pub struct CommittedRecords {
    /// The global partition id.
    pub partition: u32,
    pub first_offset: u64,
    pub records: Bytes,
    pub reply: DeliveryReply,
}

/// Where a shard answers one delivery: a slot of its wave's one answer
/// queue (a queue per delivery cost an allocation each, 256 a wave with
/// as many busy partitions).
pub struct DeliveryReply {
    answers: flume::Sender<(usize, Option<PartitionEnd>)>,
    slot: usize,
}

impl DeliveryReply {
    /// Answers the delivery: where the partition's log ends now, or `None`
    /// when this shard does not own it. Fails only when nobody waits any
    /// more (the wave timed out).
    pub fn send(self, end: Option<PartitionEnd>) -> Result<(), flume::SendError<(usize, Option<PartitionEnd>)>> {
        self.answers.send((self.slot, end))
    }
}

/// Where a partition's log ends, as its shard answers a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionEnd {
    pub end_offset: u64,
    /// Records below it survive a `kill -9` under the fsync policy (the
    /// partition's visible offset: written under `interval` and `never`,
    /// synced under `always`; everything with `--storage memory`, where
    /// nothing survives anyway): the group's log may be compacted up to it.
    pub durable_offset: u64,
}

/// Most delivered positions a group keeps as compaction candidates; older
/// ones are dropped (a later one serves as well).
const DURABLE_POINTS_MAX: usize = 4096;
/// Entries a compaction drops at least (unless they hold a quarter of the
/// group's tail bytes, or the store is half full): compacting at every delivery, one entry at a time,
/// wrote a record and moved the whole tail up each time, and took a tenth
/// of the cluster thread at 256 partitions.
const COMPACT_ENTRIES_MIN: u64 = 64;
/// How long a group whose partition lacks records before its compaction
/// point waits before it looks again, in ms.
const GAP_RETRY_MS: u64 = 1000;

/// One group as `GET /cluster` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupView {
    pub stream: String,
    pub partition: u32,
    pub role: String,
    pub leader: Option<String>,
    pub leader_is_self: bool,
    pub term: u64,
    pub commit: u64,
    pub last_index: u64,
    pub voters: Vec<String>,
    pub learners: Vec<String>,
    pub quiet: bool,
    /// Events of the committed log delivered to this node's partition.
    pub delivered_offset: Option<u64>,
    /// The most proposals of this node for the group pending at once since
    /// it started: above 1 when shards pipeline their batches.
    pub proposals_in_flight_max: u64,
    /// This node's proposals for the group waiting for their commit now.
    pub proposals_pending: u64,
    /// The leader placement wants for the group (balanced by count).
    pub preferred_leader: Option<String>,
    /// The reconfiguration step this node, as the leader, would take next
    /// (`None`: settled, waiting for a learner, or not leading).
    pub next_step: Option<String>,
}

/// Where a group's delivery stands: the next entry to deliver and the
/// offset its first record takes; `None` until learnt from the shard.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    index: u64,
    offset: u64,
    /// Entry data bytes walked since the cursor was last learnt (only
    /// differences count: the tail kept at compaction).
    bytes: u64,
}

/// Where a proposal's answer goes (the shard's [`ProposalRequest::reply`]).
type Reply = flume::Sender<Result<(), ProposalRefused>>;

/// The answers of the proposals one entry carries: a run of one
/// (shard, group)'s proposals, in their order (module doc, "Pipelining").
struct Replies(Vec<Reply>);

impl Replies {
    /// Answers every proposal of the run: all committed, or the first
    /// refused for `reason` and the later ones out of order behind it
    /// (the shard proposes the first again, then the rest).
    fn answer(&mut self, result: Result<(), ProposalRefused>) {
        for (index, reply) in self.0.drain(..).enumerate() {
            let answer = match result {
                Err(_) if index > 0 => Err(ProposalRefused::OutOfOrder),
                other => other,
            };
            let _ = reply.send(answer);
        }
    }
}

/// Proposals of one (shard, group) with consecutive sequences, taken in
/// one drain of the shards' queue: proposed as one entry.
struct Run {
    group: GroupId,
    shard: u16,
    first_sequence: u64,
    last_sequence: u64,
    resync: bool,
    records: Vec<Bytes>,
    bytes: usize,
    record_count: u32,
    replies: Replies,
}

impl Run {
    fn of(request: ProposalRequest) -> Run {
        Run {
            group: request.group,
            shard: request.shard,
            first_sequence: request.sequence,
            last_sequence: request.sequence,
            resync: request.resync,
            bytes: request.records.len(),
            records: vec![request.records],
            record_count: request.record_count,
            replies: Replies(vec![request.reply]),
        }
    }

    /// Takes `request` at the run's end if it follows it; gives it back
    /// if not.
    fn extend(&mut self, request: ProposalRequest) -> Result<(), ProposalRequest> {
        let follows = !request.resync
            && request.sequence == self.last_sequence + 1
            && self.bytes + request.records.len() <= PROPOSAL_RUN_BYTES_MAX;
        if !follows {
            return Err(request);
        }
        self.last_sequence = request.sequence;
        self.bytes += request.records.len();
        self.records.push(request.records);
        self.record_count = self.record_count.saturating_add(request.record_count);
        self.replies.0.push(request.reply);
        Ok(())
    }
}

/// The runs of `requests`: each (shard, group)'s proposals with
/// consecutive sequences together, in their order, a (shard, group)'s
/// later runs after its earlier ones.
fn runs_of(requests: impl IntoIterator<Item = ProposalRequest>) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    // The run each (shard, group) extends: its last, so order holds.
    let mut last: HashMap<(u16, GroupId), usize> = HashMap::new();
    for request in requests {
        let key = (request.shard, request.group);
        let request = match last.get(&key) {
            Some(&index) => match runs[index].extend(request) {
                Ok(()) => continue,
                Err(request) => request,
            },
            None => request,
        };
        last.insert(key, runs.len());
        runs.push(Run::of(request));
    }
    runs
}

struct Pending {
    group: GroupId,
    /// The proposing shard and its sequence ([`ProposalRequest`]).
    shard: u16,
    shard_sequence: u64,
    /// The node it was forwarded to; `None` when proposed here.
    sent_to: Option<NodeId>,
    replies: Replies,
    since: Instant,
    /// What a retry sends again (module doc, "Retries"): the same header,
    /// so a leader that has it knows, and the records (shared with the
    /// shard's batch in flight, which it holds until answered anyway: no
    /// memory beyond the formula's).
    header: ProposalHeader,
    records: Vec<Bytes>,
    /// When it was last sent.
    sent_at: Instant,
    /// How many times it was sent: a refusal of a proposal sent more than
    /// once may be about one send while another was taken (module doc,
    /// "Refused forwards").
    sends: u32,
    /// Refused after more than one send: sent again at the next tick, as
    /// [`Channel::ProposeAfterRefusal`], which the leader looks up in its
    /// log before it takes it.
    retry_after_refusal: bool,
}

/// Where a group's proposals go now: this node (its leader) or a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Here,
    Peer(NodeId),
}

impl Target {
    fn of(sent_to: Option<NodeId>) -> Target {
        sent_to.map_or(Target::Here, Target::Peer)
    }

    /// [`Pending::sent_to`] for it (the inverse of [`Target::of`]).
    fn sent_to(self) -> Option<NodeId> {
        match self {
            Target::Here => None,
            Target::Peer(node) => Some(node),
        }
    }
}

/// A forwarded proposal's payload ([`Channel::Propose`] and its kin): the
/// group, then the proposal frame ([`ReplicationNode::propose_forwarded`]
/// reads it back).
fn forward_payload(group: GroupId, header: ProposalHeader, records: &[Bytes]) -> Bytes {
    let mut payload = Vec::new();
    payload.extend_from_slice(&group.stream_id.to_le_bytes());
    payload.extend_from_slice(&group.partition.to_le_bytes());
    encode_proposal_into(&mut payload, header, records);
    Bytes::from(payload)
}

/// A [`Channel::ProposeAck`]'s payload, (group, source sequence); a
/// [`Channel::ProposeRefused`]'s is the same followed by the leader hint.
fn propose_answer(group: GroupId, source_sequence: u64) -> Vec<u8> {
    let mut payload = Vec::with_capacity(24);
    payload.extend_from_slice(&group.stream_id.to_le_bytes());
    payload.extend_from_slice(&group.partition.to_le_bytes());
    payload.extend_from_slice(&source_sequence.to_le_bytes());
    payload
}

/// The (group, source sequence) of a [`Channel::ProposeAck`] (and the
/// first 16 bytes of a [`Channel::ProposeRefused`]): [`propose_answer`] read back.
fn decode_propose_ack(payload: &[u8]) -> Option<(GroupId, u64)> {
    let stream_id = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?);
    let partition = u32::from_le_bytes(payload.get(4..8)?.try_into().ok()?);
    let sequence = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((GroupId { stream_id, partition }, sequence))
}

/// What waits for room in the transport's queue to one peer, in order.
#[derive(Default)]
struct Unsent {
    messages: VecDeque<(Channel, Bytes)>,
    bytes: usize,
}

/// A replicated stream as this node knows it.
#[derive(Clone, Debug)]
struct ReplicatedStream {
    name: String,
    base: u32,
    partitions: u32,
    replication_factor: usize,
}

/// Every Raft group of this node, and the bookkeeping around them.
pub struct ReplicationNode {
    pub host: ReplicaHost<FileLogStore>,
    store: Rc<RefCell<FileLogStore>>,
    self_id: ReplicaId,
    node_ids: HashMap<ReplicaId, NodeId>,
    live: Vec<Candidate>,
    /// By the group id's stream part.
    streams: BTreeMap<u32, ReplicatedStream>,
    next_sequence: u64,
    /// The sequence the next proposal of each (shard, group) must have; at
    /// most shards x groups entries.
    expected: HashMap<(u16, GroupId), u64>,
    pending: HashMap<u64, Pending>,
    /// Per group, this node's proposals pending now and at most at once
    /// (`GET /cluster`'s `proposals_in_flight_max`: pipelining at work).
    in_flight: HashMap<GroupId, (u64, u64)>,
    /// (Proposing node, group) pairs whose forwarded proposals this node
    /// refuses until one comes as [`Channel::ProposeAfterRefusal`] (module
    /// doc, "Refused forwards"); at most [`REFUSING_MAX`].
    refusing: HashSet<(ReplicaId, GroupId)>,
    /// Groups whose next forwarded proposal goes as
    /// [`Channel::ProposeAfterRefusal`]: a forward of this node was refused.
    restart: HashSet<GroupId>,
    /// Groups holding new proposals back ([`ReplicationNode::held`]): one
    /// of their proposals was refused and not answered (module doc,
    /// "Refused forwards"); cleared when a new proposal finds the group
    /// with nothing pending.
    held_groups: HashSet<GroupId>,
    /// Per (proposer, group), the leader this node last passed a forwarded
    /// proposal on to ([`Self::propose_forwarded`]), at most
    /// [`REFUSING_MAX`].
    relayed: HashMap<(ReplicaId, GroupId), ReplicaId>,
    /// For groups this node holds no replica of: the leader the last
    /// refusal named ([`ReplicationNode::leader_elsewhere`]); at most
    /// [`REFUSING_MAX`].
    leader_hints: HashMap<GroupId, ReplicaId>,
    cursors: HashMap<GroupId, Cursor>,
    /// The shard last found owning each group's partition.
    owners: HashMap<GroupId, u16>,
    transport: TransportHandle,
    /// Per peer, what its transport queue had no room for yet; at most
    /// [`UNSENT_BYTES_MAX`] each.
    unsent: HashMap<NodeId, Unsent>,
    pub batches_dropped: u64,
    pub forwarded_refused: u64,
    /// Per group, where its last proposal went ([`Target`]): a proposal
    /// that goes elsewhere first sends the group's pending ones there
    /// (module doc, "Retries"); at most one entry per group.
    last_target: HashMap<GroupId, Target>,
    /// Per group, delivered positions oldest first: compaction candidates
    /// once the partition says their records are durable (module doc,
    /// "Compaction and snapshots"); at most [`DURABLE_POINTS_MAX`] each.
    durable_points: HashMap<GroupId, VecDeque<Cursor>>,
    /// Groups whose partition lacks records before the compaction point,
    /// and since when.
    gaps: HashMap<GroupId, Instant>,
    /// The fetches of the records those partitions lack, from peers.
    pub catchup: crate::replication::catchup::Catchup,
    /// The partitions mirrored for subscribers here, and the reads served
    /// for peers' mirrors ([`crate::replication::mirror`]).
    pub mirrors: crate::replication::mirror::Mirrors,
    pub stats: ReplicationStats,
    full_refusals: log::Episode,
    /// The catalog group's next entry to apply to this node's catalog.
    catalog_cursor: u64,
    /// Started without `--join`: the node that creates the catalog group.
    catalog_founder: bool,
    catalog_sequence: u64,
    gap_warnings: log::Episode,
}

/// The node's Raft store and compaction counters (`/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReplicationStats {
    pub entry_bytes: u64,
    pub entry_bytes_max: u64,
    /// Proposals refused because the store was full.
    pub full_refusals: u64,
    pub compactions: u64,
    pub snapshots_installed: u64,
    pub store_rewrites: u64,
    /// Deliveries held because the partition lacks records before its
    /// group's compaction point.
    pub gaps: u64,
    /// Groups whose partition lacks records before the compaction point now.
    pub gaps_open: u64,
    /// The fetches of those records from peers
    /// ([`crate::replication::catchup`]).
    pub gap_fetches: crate::replication::catchup::GapStats,
    /// The partitions mirrored for subscribers of a node holding no
    /// replica ([`crate::replication::mirror`]).
    pub mirrors: crate::replication::mirror::MirrorStats,
    /// Raft store syncs (one per round that wrote), Raft messages and peer
    /// batches sent, entries proposed here and applied.
    pub syncs: u64,
    pub messages_sent: u64,
    pub batches_sent: u64,
    pub proposals: u64,
    pub applied_entries: u64,
    /// Delivery waves to the shards, and the deliveries they carried.
    pub delivery_waves: u64,
    pub deliveries: u64,
    /// This node's proposals sent again (module doc, "Retries"), and
    /// proposals this node, as the leader, found already in its log and
    /// did not store again.
    pub proposals_retried: u64,
    pub proposals_deduplicated: u64,
    /// Refusals of a proposal sent more than once, which send it again
    /// with a lookup instead of answering it refused
    /// ([`ReplicationNode::receive_propose_refused`]).
    pub refusals_of_resent: u64,
}

impl ReplicationNode {
    pub fn new(node_id: NodeId, store: FileLogStore, transport: TransportHandle) -> ReplicationNode {
        let self_id = replica_id_of(node_id);
        let store = Rc::new(RefCell::new(store));
        let config = HostConfig::default();
        let mut host = ReplicaHost::new(self_id, config, store.clone(), rand::random());
        host.set_learners_everywhere(CATALOG_GROUP.stream_id);
        host.set_stream(CATALOG_GROUP.stream_id, 1, 1);
        ReplicationNode {
            host,
            store,
            self_id,
            node_ids: HashMap::from([(self_id, node_id)]),
            live: Vec::new(),
            streams: BTreeMap::new(),
            next_sequence: 1,
            expected: HashMap::new(),
            pending: HashMap::new(),
            in_flight: HashMap::new(),
            refusing: HashSet::new(),
            restart: HashSet::new(),
            held_groups: HashSet::new(),
            relayed: HashMap::new(),
            leader_hints: HashMap::new(),
            cursors: HashMap::new(),
            owners: HashMap::new(),
            transport,
            unsent: HashMap::new(),
            batches_dropped: 0,
            forwarded_refused: 0,
            last_target: HashMap::new(),
            durable_points: HashMap::new(),
            gaps: HashMap::new(),
            catchup: crate::replication::catchup::Catchup::default(),
            mirrors: crate::replication::mirror::Mirrors::default(),
            stats: ReplicationStats::default(),
            full_refusals: log::Episode::new("proposals refused: Raft log full"),
            gap_warnings: log::Episode::new("partitions behind their group's compaction point"),
            catalog_cursor: 1,
            catalog_founder: false,
            catalog_sequence: 0,
        }
    }

    /// The store and compaction counters as of now.
    pub fn stats(&self) -> ReplicationStats {
        let store = self.store.borrow();
        ReplicationStats {
            entry_bytes: store.entry_bytes(),
            entry_bytes_max: store.entry_bytes_max(),
            snapshots_installed: self.host.counters.snapshots_installed,
            store_rewrites: store.rewrites,
            gaps_open: self.gaps.len() as u64,
            gap_fetches: self.catchup.stats,
            mirrors: self.mirrors.stats(),
            syncs: self.host.counters.syncs,
            messages_sent: self.host.counters.messages_sent,
            batches_sent: self.host.counters.batches_sent,
            proposals: self.host.counters.proposals,
            applied_entries: self.host.counters.applied_entries,
            ..self.stats
        }
    }

    /// Counts and (once per episode) logs a proposal refused because the
    /// store is full: compaction is behind (module doc).
    fn note_full(&mut self) {
        self.stats.full_refusals += 1;
        let (bytes, bytes_max) = (self.store.borrow().entry_bytes(), self.store.borrow().entry_bytes_max());
        self.full_refusals.occur(
            Instant::now(),
            log::Level::Warn,
            log::Scope::process(),
            format_args!(
                "replication: the Raft log holds {bytes} bytes of entries (--raft-log-bytes-max {bytes_max}): \
                 proposals are refused until compaction catches up (applied entries whose records are durable \
                 in their partition are dropped)"
            ),
        );
    }

    /// Where the catalog stands: `applied` is the last catalog entry this
    /// node's catalog holds (its `replicated_index`); a `founder` (started
    /// without `--join`) creates the catalog group if it has none and has
    /// applied none (module doc, "The catalog group").
    pub fn set_catalog(&mut self, applied: u64, founder: bool) {
        self.catalog_cursor = applied + 1;
        self.catalog_founder = founder;
        if founder && applied == 0 && self.store.borrow().log(CATALOG_GROUP).is_none() {
            self.host.bootstrap(CATALOG_GROUP, &[self.self_id]);
        }
    }

    /// Proposes a catalog command (bytes the admin thread encodes): here if
    /// this node leads the catalog group, else forwarded to its leader;
    /// `reply` is answered once it is committed (the admin thread then
    /// waits for its apply here), or refused.
    pub fn propose_catalog(&mut self, command: Bytes, reply: flume::Sender<Result<(), ProposalRefused>>) {
        self.catalog_sequence += 1;
        let request = ProposalRequest {
            group: CATALOG_GROUP,
            shard: CATALOG_SHARD,
            sequence: self.catalog_sequence,
            resync: true,
            records: command,
            record_count: 0,
            reply,
        };
        self.propose(request);
    }

    /// The committed catalog entries this node's catalog lacks, at most
    /// [`CATALOG_ENTRIES_PER_APPLY_MAX`] commands; `None` when it has them all.
    pub fn catalog_due(&self) -> Option<(Vec<(u64, Bytes)>, u64)> {
        let store = self.store.borrow();
        let log = store.log(CATALOG_GROUP)?;
        let commit = self.host.commit_of(CATALOG_GROUP)?.min(log.last_index());
        if commit < self.catalog_cursor {
            return None;
        }
        if self.catalog_cursor < log.first_index() {
            // Never compacted (module doc): a log that starts later is not
            // one this node can apply from.
            log::error!(
                "replication: the catalog log starts at index {} but this node's catalog is at {}: not applied",
                log.first_index(),
                self.catalog_cursor - 1
            );
            return None;
        }
        let mut entries = Vec::new();
        let mut through = self.catalog_cursor - 1;
        while through < commit && entries.len() < CATALOG_ENTRIES_PER_APPLY_MAX {
            let index = through + 1;
            let Some(entry) = log.entry(index) else { break };
            if entry.get_entry_type() == raft::eraftpb::EntryType::EntryNormal
                && let Ok((_, command)) = decode_proposal(&entry.data)
                && !command.is_empty()
            {
                entries.push((index, Bytes::copy_from_slice(command)));
            }
            through = index;
        }
        (through >= self.catalog_cursor).then_some((entries, through))
    }

    /// The admin thread applied the catalog up to `through`: the next
    /// entries come from there.
    pub fn catalog_applied(&mut self, through: u64) {
        self.catalog_cursor = self.catalog_cursor.max(through + 1);
    }

    /// Whether there is anything to run: a replicated stream or a group.
    pub fn is_active(&self) -> bool {
        !self.streams.is_empty() || self.host.groups().next().is_some()
    }

    /// The streams of the catalog; the replicated ones get groups.
    pub fn set_streams(&mut self, specs: &[StreamSpec]) {
        self.streams = specs
            .iter()
            .filter(|spec| spec.is_replicated())
            .map(|spec| {
                let stream = ReplicatedStream {
                    name: spec.name.clone(),
                    base: spec.base,
                    partitions: spec.partitions,
                    replication_factor: spec.replication_factor as usize,
                };
                (spec.group_stream_id(), stream)
            })
            .collect();
        for (stream_id, stream) in &self.streams {
            self.host.set_stream(*stream_id, stream.replication_factor, stream.partitions);
        }
    }

    /// The live members (alive or suspect) as placement's candidates, all
    /// of weight 1 for now.
    pub fn set_members(&mut self, members: &[MemberView]) {
        let mut live = Vec::new();
        for member in members {
            let replica = replica_id_of(member.id.node_id);
            self.node_ids.insert(replica, member.id.node_id);
            if matches!(member.state, MemberState::Alive | MemberState::Suspect) {
                live.push(Candidate { replica, weight: 1.0 });
            }
        }
        self.live = live.clone();
        let catalog_voters = live.len().clamp(1, CATALOG_VOTERS_MAX);
        self.host.set_stream(CATALOG_GROUP.stream_id, catalog_voters, 1);
        self.host.set_members(live);
    }

    /// Creates the groups this node should start (module doc, "Groups").
    pub fn bootstrap_groups(&mut self) {
        let mut wanted = Vec::new();
        for (stream_id, stream) in &self.streams {
            if self.live.len() < stream.replication_factor {
                continue;
            }
            for partition in 0..stream.partitions {
                let group = GroupId { stream_id: *stream_id, partition };
                if self.store.borrow().log(group).is_some() {
                    continue;
                }
                let desired = desired_replicas(group, &self.live, stream.replication_factor);
                if desired.contains(self.self_id) {
                    wanted.push((group, desired.replicas));
                }
            }
        }
        for (group, voters) in wanted {
            self.host.bootstrap(group, &voters);
        }
    }

    /// Takes a shard's proposal: proposes it here, forwards it to the
    /// leader, or answers why not.
    pub fn propose(&mut self, request: ProposalRequest) {
        self.propose_run(Run::of(request));
    }

    /// Takes the proposals the shards queued since the last drain, each
    /// (shard, group)'s consecutive ones as one entry: a batch spread over
    /// many partitions makes one small proposal per partition, and one
    /// entry per group per round keeps the Raft work per round bounded by
    /// the groups, not the batches (module doc, "Pipelining").
    pub fn propose_queued(&mut self, requests: impl IntoIterator<Item = ProposalRequest>) {
        for run in runs_of(requests) {
            self.propose_run(run);
        }
    }

    fn propose_run(&mut self, mut run: Run) {
        match self.take_run(&run) {
            Ok((header, sent_to)) => {
                let sequence = header.source_sequence;
                self.expected.insert((run.shard, run.group), run.last_sequence + 1);
                let now = Instant::now();
                let pending = Pending {
                    group: run.group,
                    shard: run.shard,
                    shard_sequence: run.first_sequence,
                    sent_to,
                    replies: run.replies,
                    since: now,
                    header,
                    records: run.records,
                    sent_at: now,
                    sends: 1,
                    retry_after_refusal: false,
                };
                self.pending.insert(sequence, pending);
                let in_flight = self.in_flight.entry(run.group).or_default();
                in_flight.0 += 1;
                in_flight.1 = in_flight.1.max(in_flight.0);
            }
            Err(reason) => run.replies.answer(Err(reason)),
        }
    }

    /// Proposes a run here or forwards it to the leader: its header (this
    /// node's sequence for it) and where it went (`None`: here), or why not.
    fn take_run(&mut self, run: &Run) -> Result<(ProposalHeader, Option<NodeId>), ProposalRefused> {
        // A shard numbers each group's proposals from 0 (both live as long
        // as the process), so a later one never overtakes a first refused.
        let expected = *self.expected.entry((run.shard, run.group)).or_insert(0);
        if !run.resync && expected != run.first_sequence {
            return Err(ProposalRefused::OutOfOrder);
        }
        if self.held(run.group) {
            return Err(ProposalRefused::EarlierResent);
        }
        let replica_leader = self.host.leader_of(run.group);
        let leader = replica_leader.unwrap_or_else(|| self.leader_elsewhere(run.group));
        if self.store.borrow().is_full() {
            self.note_full();
            return Err(ProposalRefused::StoreFull);
        }
        if self.pending.len() >= PROPOSALS_PENDING_MAX {
            return Err(ProposalRefused::TooManyPending);
        }
        let sequence = self.next_sequence;
        let header =
            ProposalHeader { source_node: self.self_id, source_sequence: sequence, record_count: run.record_count };
        let target = self.target_for(leader);
        // The group's earlier proposals go there first, so this one does
        // not overtake them (module doc, "Retries"); if one cannot, neither
        // can this one.
        if let Some(target) = target
            && !self.resend_if_moved(run.group, target)
        {
            return Err(ProposalRefused::NoLeader);
        }
        let sent_to = match target {
            Some(Target::Here) => {
                if self.host.propose(run.group, header, &run.records).is_err() {
                    return Err(ProposalRefused::NoLeader);
                }
                None
            }
            Some(Target::Peer(leader)) => {
                if !self.forward(leader, run.group, header, &run.records) {
                    return Err(ProposalRefused::NoLeader);
                }
                Some(leader)
            }
            None if replica_leader.is_none() => return Err(ProposalRefused::NotAReplica),
            None => {
                self.host.wake_group(run.group);
                return Err(ProposalRefused::NoLeader);
            }
        };
        self.next_sequence += 1;
        self.last_target.insert(run.group, Target::of(sent_to));
        Ok((header, sent_to))
    }

    /// Whether `group` holds new proposals back: since one of its
    /// proposals was refused and not answered (it is sent again instead),
    /// until none of those pending then is left. A new one waits (the
    /// shard proposes it again a moment later): the refused one's resend
    /// ends the refusing node's refusals, so a new one could be taken there
    /// while the group's later proposals, refused before, are on their way
    /// back, and answering those refused would sweep the new one along.
    fn held(&mut self, group: GroupId) -> bool {
        if !self.held_groups.contains(&group) {
            return false;
        }
        let held = self.pending.values().any(|pending| pending.group == group);
        if !held {
            self.held_groups.remove(&group);
        }
        held
    }

    /// Where `group`'s proposals go now, as [`Self::take_run`] chooses;
    /// `None` when nowhere (no leader known).
    fn target_of(&self, group: GroupId) -> Option<Target> {
        self.target_for(self.host.leader_of(group).unwrap_or_else(|| self.leader_elsewhere(group)))
    }

    /// Where proposals for `leader` (a replica id, 0 for none) go.
    fn target_for(&self, leader: ReplicaId) -> Option<Target> {
        if leader == self.self_id {
            return Some(Target::Here);
        }
        self.node_ids.get(&leader).filter(|_| leader != 0).map(|node| Target::Peer(*node))
    }

    /// Sends `group`'s pending proposals that went elsewhere to `target`,
    /// in their order, if the group's last proposal went elsewhere; whether
    /// every one went (the group's target moves only then).
    fn resend_if_moved(&mut self, group: GroupId, target: Target) -> bool {
        if self.last_target.get(&group).is_none_or(|last| *last == target) {
            return true;
        }
        let mut moved: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, pending)| pending.group == group && Target::of(pending.sent_to) != target)
            .map(|(sequence, _)| *sequence)
            .collect();
        moved.sort_unstable();
        for sequence in moved {
            if !self.resend(sequence, target) {
                return false;
            }
        }
        self.last_target.insert(group, target);
        true
    }

    /// Sends pending proposals again (module doc, "Retries"), each Raft
    /// tick: those whose group's leader is now another than the one they
    /// went to, and those unanswered for [`PROPOSAL_RETRY_MS`] since they
    /// were last sent; in sequence order, so a group's stay in order.
    pub fn retry_proposals(&mut self) {
        let retry_after = Duration::from_millis(PROPOSAL_RETRY_MS);
        let mut due: Vec<(u64, Target)> = Vec::new();
        let mut targets: HashMap<GroupId, Option<Target>> = HashMap::new();
        for (sequence, pending) in &self.pending {
            let target = *targets.entry(pending.group).or_insert_with(|| self.target_of(pending.group));
            let Some(target) = target else { continue };
            if target != Target::of(pending.sent_to)
                || pending.sent_at.elapsed() >= retry_after
                || pending.retry_after_refusal
            {
                due.push((*sequence, target));
            }
        }
        due.sort_unstable_by_key(|(sequence, _)| *sequence);
        // A group whose resend could not go sends none of its later ones
        // (they would overtake it) and keeps its target.
        let mut failed: HashSet<GroupId> = HashSet::new();
        for (sequence, target) in due {
            let Some(group) = self.pending.get(&sequence).map(|pending| pending.group) else { continue };
            if failed.contains(&group) {
                continue;
            }
            if self.resend(sequence, target) {
                self.last_target.insert(group, target);
            } else {
                failed.insert(group);
            }
        }
    }

    /// Sends one pending proposal again to `target`, with its header: a
    /// leader that has it in its log does not take it again (and answers
    /// it if applied), so the retry of a proposal that did get in costs a
    /// look, not a second copy. Whether it went (or was found answered).
    fn resend(&mut self, sequence: u64, target: Target) -> bool {
        let Some(pending) = self.pending.get(&sequence) else { return true };
        let (group, header, records) = (pending.group, pending.header, pending.records.clone());
        let channel = if pending.retry_after_refusal { Channel::ProposeAfterRefusal } else { Channel::ProposeRetry };
        self.stats.proposals_retried += 1;
        let sent = match target {
            Target::Here => match self.host.find_proposal(group, header) {
                Some(true) => {
                    if let Some(mut pending) = self.pending.remove(&sequence) {
                        self.leave_flight(group);
                        pending.replies.answer(Ok(()));
                    }
                    return true;
                }
                // Its apply here answers it.
                Some(false) => true,
                None => self.host.propose(group, header, &records).is_ok(),
            },
            Target::Peer(node) => self.send_to_peer(node, channel, forward_payload(group, header, &records)),
        };
        if sent && let Some(pending) = self.pending.get_mut(&sequence) {
            pending.sent_to = target.sent_to();
            pending.sent_at = Instant::now();
            pending.sends += 1;
            pending.retry_after_refusal = false;
        }
        sent
    }

    /// Where a proposal for a group this node holds no replica of goes: the
    /// leader a refusal last named, if it is live, else the group's
    /// preferred leader by placement (a replica once the group settles,
    /// which passes it on to the leader it knows); 0 for nobody. So a
    /// producer on any node reaches every partition, also one whose
    /// replicas moved away from its node (module doc, "Groups").
    fn leader_elsewhere(&self, group: GroupId) -> ReplicaId {
        let live = |replica: &ReplicaId| *replica != self.self_id && self.live.iter().any(|c| c.replica == *replica);
        if let Some(hint) = self.leader_hints.get(&group).filter(|hint| live(hint)) {
            return *hint;
        }
        if !self.streams.contains_key(&group.stream_id) && group != CATALOG_GROUP {
            return 0;
        }
        self.host.desired_replicas(group).replicas.into_iter().find(live).unwrap_or(0)
    }

    /// Sends a proposal to `leader`: the first of `group` since one was
    /// refused as [`Channel::ProposeAfterRefusal`]; whether it was sent.
    fn forward(&mut self, leader: NodeId, group: GroupId, header: ProposalHeader, records: &[Bytes]) -> bool {
        let after_refusal = self.restart.contains(&group);
        let channel = if after_refusal { Channel::ProposeAfterRefusal } else { Channel::Propose };
        let sent = self.send_to_peer(leader, channel, forward_payload(group, header, records));
        if sent && after_refusal {
            self.restart.remove(&group);
        }
        sent
    }

    /// A proposal another node (`from`) forwarded to this one (as the
    /// leader); `after_refusal` when it came as
    /// [`Channel::ProposeAfterRefusal`]. One that finds this node no longer
    /// leading goes on to the leader it knows, once (only when it came from
    /// its proposer): a node removed from the group keeps forwarding to the
    /// leader it last knew, which learns of a transfer and so knows better.
    /// One not taken is refused at once (module doc, "Refused forwards").
    ///
    /// A leader asks its log first for a `retry` ([`Channel::ProposeRetry`]),
    /// for one that comes after a refusal (it may be a refused proposal
    /// sent again, whose other send was taken) and for a proposal passed
    /// on by another node (it may be the first send of one whose retry got
    /// here before it): one it holds is not stored again, only answered if
    /// applied (module doc, "Retries").
    pub fn propose_forwarded(&mut self, from: NodeId, payload: &Bytes, after_refusal: bool, retry: bool) {
        let Some((group_bytes, proposal)) = payload.split_at_checked(8) else { return };
        let group = GroupId {
            stream_id: u32::from_le_bytes(group_bytes[..4].try_into().unwrap_or_default()),
            partition: u32::from_le_bytes(group_bytes[4..].try_into().unwrap_or_default()),
        };
        let Ok((header, records)) = decode_proposal(proposal) else { return };
        let source = (header.source_node, group);
        if after_refusal {
            self.refusing.remove(&source);
        }
        let leader_known = |node: &Self| node.host.leader_of(group).unwrap_or(0);
        let proposer = self.node_ids.get(&header.source_node).copied();
        if (retry || after_refusal || proposer != Some(from))
            && self.host.is_leader(group)
            && let Some(applied) = self.host.find_proposal(group, header)
        {
            self.stats.proposals_deduplicated += 1;
            if let (true, Some(proposer)) = (applied, proposer) {
                let payload = propose_answer(group, header.source_sequence);
                self.send_to_peer(proposer, Channel::ProposeAck, Bytes::from(payload));
            }
            return;
        }
        if self.refusing.contains(&source) {
            return self.refuse_forwarded(group, header, leader_known(self));
        }
        if self.store.borrow().is_full() {
            self.note_full();
            return self.refuse_forwarded(group, header, leader_known(self));
        }
        match self.host.propose(group, header, &[records]) {
            Ok(()) => {}
            Err(ProposeError::NotLeader { leader: Some(leader), .. })
                if proposer == Some(from) && leader != self.self_id =>
            {
                // Passed on to another leader than the proposer's last one
                // of the group: that one may refuse the earlier proposal
                // (a transfer) while this one is taken, and its refusal
                // would sweep this one along at the proposer. Refused here
                // instead, it and the later ones follow the earlier one.
                if self.relayed.len() >= REFUSING_MAX {
                    self.relayed.clear();
                }
                if self.relayed.insert(source, leader).is_some_and(|last| last != leader) {
                    return self.refuse_forwarded(group, header, leader);
                }
                let next = self.node_ids.get(&leader).copied();
                let channel = match (after_refusal, retry) {
                    (true, _) => Channel::ProposeAfterRefusal,
                    (false, true) => Channel::ProposeRetry,
                    (false, false) => Channel::Propose,
                };
                if !next.is_some_and(|next| self.send_to_peer(next, channel, payload.clone())) {
                    self.refuse_forwarded(group, header, leader);
                }
            }
            Err(_) => self.refuse_forwarded(group, header, leader_known(self)),
        }
    }

    /// Tells a forwarded proposal's proposer that it was not taken, and
    /// refuses the proposer's later ones of the group until it says it
    /// knows ([`Channel::ProposeAfterRefusal`]); `leader` (0 for none) is
    /// the group's leader as this node knows it, for a proposer holding no
    /// replica of the group.
    fn refuse_forwarded(&mut self, group: GroupId, header: ProposalHeader, leader: ReplicaId) {
        self.forwarded_refused += 1;
        if self.refusing.len() >= REFUSING_MAX {
            self.refusing.clear();
        }
        self.refusing.insert((header.source_node, group));
        let Some(proposer) = self.node_ids.get(&header.source_node).copied() else { return };
        let mut payload = propose_answer(group, header.source_sequence);
        payload.extend_from_slice(&leader.to_le_bytes());
        // Lost: the proposer times out and proposes again.
        self.send_to_peer(proposer, Channel::ProposeRefused, Bytes::from(payload));
    }

    /// A node this one forwarded a proposal to did not take it
    /// ([`Channel::ProposeRefused`]): that one and every later one of the
    /// group sent the same way (which that node refuses too, as they follow
    /// on the same connection) are answered now, each shard's next expected
    /// sequence goes back to its first refused one, and the group's next
    /// forward says it comes after a refusal.
    ///
    /// Only when it and every later one swept were sent once are they
    /// answered so: one sent more than once may have been taken through
    /// another send, and answering it refused would have the shard propose
    /// its records a second time. It is sent again at the next tick instead
    /// ([`Self::retry_proposals`]), as [`Channel::ProposeAfterRefusal`],
    /// which the leader looks up in its log first, and the group holds new
    /// proposals back until the ones pending now are answered
    /// ([`Self::held`]; `spate_raft_refusals_of_resent_total`).
    pub fn receive_propose_refused(&mut self, payload: &[u8]) {
        let Some((group, sequence)) = decode_propose_ack(payload) else { return };
        let hint = payload.get(16..24).and_then(|bytes| bytes.try_into().ok()).map_or(0, u64::from_le_bytes);
        if hint != 0 && hint != self.self_id {
            if self.leader_hints.len() >= REFUSING_MAX {
                self.leader_hints.clear();
            }
            self.leader_hints.insert(group, hint);
        }
        let Some(sent_to) = self.pending.get(&sequence).filter(|pending| pending.group == group).map(|p| p.sent_to)
        else {
            return;
        };
        let mut refused: Vec<u64> = self
            .pending
            .iter()
            .filter(|(later, pending)| **later >= sequence && pending.group == group && pending.sent_to == sent_to)
            .map(|(later, _)| *later)
            .collect();
        // Sent more than once (it or a later one the refusal would sweep):
        // another send may have been taken, so it is sent again instead.
        if refused.iter().any(|later| self.pending.get(later).is_some_and(|pending| pending.sends > 1)) {
            if let Some(pending) = self.pending.get_mut(&sequence) {
                pending.retry_after_refusal = true;
            }
            self.held_groups.insert(group);
            self.stats.refusals_of_resent += 1;
            return;
        }
        refused.sort_unstable();
        let mut restarted = HashSet::new();
        for later in refused {
            let Some(mut pending) = self.pending.remove(&later) else { continue };
            self.leave_flight(group);
            let first_of_shard = restarted.insert(pending.shard);
            if first_of_shard {
                self.expected.insert((pending.shard, group), pending.shard_sequence);
            }
            let reason = if first_of_shard { ProposalRefused::LeaderRefused } else { ProposalRefused::OutOfOrder };
            pending.replies.answer(Err(reason));
        }
        self.restart.insert(group);
    }

    /// The leader's word that a proposal this node forwarded is committed
    /// ([`Channel::ProposeAck`]): answered now (module doc, step 4), or
    /// when this node's own replica applies it, whichever comes first.
    pub fn receive_propose_ack(&mut self, payload: &[u8]) {
        let Some((group, sequence)) = decode_propose_ack(payload) else { return };
        if let std::collections::hash_map::Entry::Occupied(entry) = self.pending.entry(sequence)
            && entry.get().group == group
        {
            entry.remove().replies.answer(Ok(()));
            self.leave_flight(group);
        }
    }

    /// Tells each proposer of a forwarded proposal this node applied as the
    /// leader that it is committed.
    fn send_forwarded_acks(&mut self) {
        for ack in self.host.take_forwarded_acks() {
            let Some(peer) = self.node_ids.get(&ack.header.source_node).copied() else { continue };
            let payload = propose_answer(ack.group, ack.header.source_sequence);
            // Lost: the proposer times out and proposes again.
            self.send_to_peer(peer, Channel::ProposeAck, Bytes::from(payload));
        }
    }

    /// A peer's Raft batch.
    pub fn receive(&mut self, payload: &[u8]) {
        match PeerBatch::decode(payload) {
            Ok(batch) => self.host.receive(batch),
            Err(error) => log::warn!("replication: dropped a peer batch: {error}"),
        }
    }

    /// The first half of a round ([`ReplicaHost::process_unsynced`]): the
    /// leaders' appends are shipped, what is committed is answered, and
    /// the `Ready`s wait for a sync ([`Self::take_sync`]). It may run while
    /// an earlier round's sync is under way.
    pub fn round_unsynced(&mut self) {
        self.flush_unsent();
        self.host.process_unsynced();
        self.ship_batches();
        // Entries raft-rs hands out as committed are durable on a majority
        // already (it gives out none past what this node persisted): their
        // proposers hear now, not one sync later.
        self.take_acks();
    }

    /// The sync the `Ready`s of the rounds so far wait for: the store's
    /// job (run off the thread, `None` when there is nothing to write or
    /// the store is in memory) and how many `Ready`s it covers, for
    /// [`Self::round_synced`]; `None` when nothing waits.
    pub fn take_sync(&mut self) -> Option<(Option<SyncJob>, usize)> {
        let covered = self.host.awaiting_sync_len();
        if covered == 0 {
            return None;
        }
        if !self.host.take_unsynced_writes() {
            return Some((None, covered));
        }
        let job = self.store.borrow_mut().take_sync_job();
        if job.is_none() {
            // Memory storage: nothing to write.
            self.store.borrow_mut().sync();
        }
        Some((job, covered))
    }

    /// Counts a sync job of [`Self::take_sync`] done.
    pub fn finish_sync(&self, result: std::io::Result<()>) {
        self.store.borrow_mut().finish_sync(result);
    }

    /// The second half of a round, once the sync covering the first
    /// `covered` `Ready`s is done: what waited for it is shipped, and
    /// acknowledged proposals are taken.
    pub fn round_synced(&mut self, covered: usize) {
        self.host.process_synced(covered);
        self.ship_batches();
        self.take_acks();
    }

    /// Tells the proposers of entries this node applied as the leader, and
    /// answers this node's own proposals that are committed (module doc,
    /// step 4).
    fn take_acks(&mut self) {
        self.send_forwarded_acks();
        for ack in self.host.take_acks() {
            if let Some(mut pending) = self.pending.remove(&ack.header.source_sequence)
                && self.leave_flight(pending.group)
                && pending.group == ack.group
            {
                pending.replies.answer(Ok(()));
            }
        }
    }

    /// Sends the host's Raft batches to their peers.
    fn ship_batches(&mut self) {
        for batch in self.host.take_batches() {
            let Some(peer) = self.node_ids.get(&batch.to).copied() else { continue };
            let sent = batch.encode().ok().map(|bytes| self.send_to_peer(peer, Channel::Raft, Bytes::from(bytes)));
            if sent != Some(true) {
                // Raft retransmits what a peer did not get.
                self.batches_dropped += 1;
            }
        }
    }

    /// Sends `payload` to `peer` behind what waits for it, or keeps it
    /// until the transport's queue has room ([`UNSENT_BYTES_MAX`]);
    /// whether it was sent or kept. Dropping a pipelined append would make
    /// the leader find the gap and send again, so they wait instead.
    fn send_to_peer(&mut self, peer: NodeId, channel: Channel, payload: Bytes) -> bool {
        let unsent = self.unsent.entry(peer).or_default();
        if unsent.messages.is_empty() {
            match self.transport.try_send(peer, channel, payload.clone()) {
                Ok(()) => return true,
                Err(SendError::Full { .. }) => {}
                Err(_) => return false,
            }
        }
        if unsent.bytes + payload.len() > UNSENT_BYTES_MAX {
            return false;
        }
        unsent.bytes += payload.len();
        unsent.messages.push_back((channel, payload));
        true
    }

    /// Moves what waits for each peer into its transport queue, in order,
    /// as far as there is room; whether anything still waits.
    pub fn flush_unsent(&mut self) -> bool {
        let mut waiting = false;
        for (peer, unsent) in &mut self.unsent {
            while let Some((channel, payload)) = unsent.messages.front() {
                match self.transport.try_send(*peer, *channel, payload.clone()) {
                    Ok(()) => {}
                    Err(SendError::Full { .. }) => {
                        waiting = true;
                        break;
                    }
                    // Gone or unreachable: Raft sends again once it is back.
                    Err(_) => self.batches_dropped += 1,
                }
                unsent.bytes -= payload.len();
                unsent.messages.pop_front();
            }
        }
        waiting
    }

    /// Counts a proposal of `group` answered or expired; always true (for
    /// use in a condition).
    fn leave_flight(&mut self, group: GroupId) -> bool {
        if let Some(in_flight) = self.in_flight.get_mut(&group) {
            in_flight.0 = in_flight.0.saturating_sub(1);
        }
        true
    }

    /// Whether anything waits for room in a peer's transport queue.
    pub fn has_unsent(&self) -> bool {
        self.unsent.values().any(|unsent| !unsent.messages.is_empty())
    }

    /// Answers proposals that waited past [`PROPOSAL_TIMEOUT_MS`].
    pub fn expire_proposals(&mut self) {
        let timeout = Duration::from_millis(PROPOSAL_TIMEOUT_MS);
        let mut expired_groups = Vec::new();
        self.pending.retain(|_, pending| {
            let expired = pending.since.elapsed() > timeout;
            if expired {
                pending.replies.answer(Err(ProposalRefused::TimedOut));
                expired_groups.push(pending.group);
            }
            !expired
        });
        for group in expired_groups {
            self.leave_flight(group);
        }
    }

    /// Whether `group`'s compaction waits to learn that its partition made
    /// delivered records durable: a delivery's answer says how far the
    /// partition was durable *before* it, so the last one's records are
    /// known durable only at the next. When the store is half full that is
    /// worth asking (an empty delivery, once per round): with nothing
    /// more to deliver, because the full store refuses every proposal,
    /// the group would never compact and the node would refuse for ever.
    fn compaction_waits(&self, group: GroupId) -> bool {
        self.store_half_full() && self.durable_points.get(&group).is_some_and(|points| !points.is_empty())
    }

    /// Whether the Raft store holds half its bound of entry bytes or more.
    fn store_half_full(&self) -> bool {
        let store = self.store.borrow();
        store.entry_bytes() >= store.entry_bytes_max() / 2
    }

    /// The next delivery to make: a group with committed entries this
    /// node's shard may not have, its partition, and where to start.
    fn next_delivery(&self) -> Vec<(GroupId, u32)> {
        let mut due = Vec::new();
        for group in self.host.groups() {
            let Some(stream) = self.streams.get(&group.stream_id) else { continue };
            if group.partition >= stream.partitions {
                continue;
            }
            let Some(commit) = self.host.commit_of(group) else { continue };
            if self.gaps.get(&group).is_some_and(|since| since.elapsed() < Duration::from_millis(GAP_RETRY_MS)) {
                continue;
            }
            let cursor = self.cursors.get(&group);
            if cursor.is_none_or(|cursor| cursor.index <= commit) || self.compaction_waits(group) {
                due.push((group, stream.base + group.partition));
            }
        }
        due
    }

    /// The records of committed entries from `cursor` on, at most
    /// [`DELIVERY_BYTES_MAX`] of them; returns the records and the cursor
    /// after them.
    ///
    /// The records of a delivery of one entry are that entry's own bytes
    /// (no copy); several are copied once into a buffer of their size.
    fn committed_records(&self, group: GroupId, cursor: Cursor) -> (Bytes, Cursor) {
        let store = self.store.borrow();
        let Some(log) = store.log(group) else { return (Bytes::new(), cursor) };
        let commit = self.host.commit_of(group).unwrap_or(0).min(log.last_index());
        let frames = || {
            (cursor.index..=commit).map_while(|index| log.entry(index)).map(|entry| {
                let frame = decode_proposal(&entry.data)
                    .ok()
                    .filter(|_| entry.get_entry_type() == raft::eraftpb::EntryType::EntryNormal);
                (entry, frame)
            })
        };
        // The entries of this delivery: at most DELIVERY_BYTES_MAX of
        // records (at least one entry).
        let (mut count, mut size) = (0usize, 0usize);
        for (_, frame) in frames() {
            if size >= DELIVERY_BYTES_MAX {
                break;
            }
            size += frame.map_or(0, |(_, frame)| frame.len());
            count += 1;
        }
        let mut next = cursor;
        let mut records = Vec::with_capacity(if count == 1 { 0 } else { size });
        let mut single = None;
        for (entry, frame) in frames().take(count) {
            if let Some((header, frame)) = frame {
                if count == 1 {
                    single = Some(entry.data.slice_ref(frame));
                } else {
                    records.extend_from_slice(frame);
                }
                next.offset += u64::from(header.record_count);
            }
            next.bytes += entry.data.len() as u64;
            next.index += 1;
        }
        (single.unwrap_or_else(|| Bytes::from(records)), next)
    }

    /// Where delivery to a shard whose log ends at `end_offset` starts:
    /// the first committed entry holding an offset at or past it; `None`
    /// when the partition lacks records before the group's compaction
    /// point (they are in no entry here).
    fn cursor_for(&self, group: GroupId, end_offset: u64) -> Option<Cursor> {
        let store = self.store.borrow();
        let Some(log) = store.log(group) else { return Some(Cursor { index: 1, offset: 0, bytes: 0 }) };
        let mut cursor = Cursor { index: log.first_index(), offset: log.compacted.offset, bytes: 0 };
        if end_offset < cursor.offset {
            return None;
        }
        let commit = self.host.commit_of(group).unwrap_or(0).min(log.last_index());
        while cursor.index <= commit {
            let count = log
                .entry(cursor.index)
                .filter(|entry| entry.get_entry_type() == raft::eraftpb::EntryType::EntryNormal)
                .and_then(|entry| decode_proposal(&entry.data).ok())
                .map_or(0, |(header, _)| u64::from(header.record_count));
            if cursor.offset + count > end_offset {
                break;
            }
            cursor.offset += count;
            cursor.index += 1;
        }
        Some(cursor)
    }

    /// Records a delivery the shard answered: `delivered` is where the
    /// cursor now stands, and compacts the group's log up to the newest
    /// delivered position whose records are durable, keeping a tail of
    /// [`Self::tail_bytes`] (module doc, "Compaction and snapshots").
    fn delivered(&mut self, group: GroupId, delivered: Cursor, durable_offset: u64) {
        let tail_bytes = self.tail_bytes();
        let half_full = self.store_half_full();
        let points = self.durable_points.entry(group).or_default();
        if points.back().is_none_or(|last| last.index < delivered.index) {
            if points.len() >= DURABLE_POINTS_MAX {
                points.pop_front();
            }
            points.push_back(delivered);
        }
        // A leader spares a live follower a snapshot (whose records it
        // would have to fetch) while the store is less than half full.
        let spare = self.host.lowest_live_match(group).filter(|_| !half_full);
        let mut target = None;
        while let Some(front) = points.front()
            && front.offset <= durable_offset
            && delivered.bytes.saturating_sub(front.bytes) >= tail_bytes
            && spare.is_none_or(|matched| front.index <= matched + 1)
        {
            target = points.pop_front();
        }
        let Some(target) = target else { return };
        let compacted = {
            let store = self.store.borrow();
            let Some(log) = store.log(group) else { return };
            let index = target.index - 1;
            // Not applied yet, or before the last configuration change, or
            // too little to drop for its cost (a compaction record, and the
            // log's entries moved up): try again at a later delivery.
            let worth = index.saturating_sub(log.compacted.index) >= COMPACT_ENTRIES_MIN
                || log.data_bytes_through(index) >= tail_bytes / 4
                || half_full;
            if index > log.applied || index < log.conf_index || !worth {
                points.push_front(target);
                return;
            }
            let Some(term) = log.entry(index).map(|entry| entry.term) else { return };
            Compacted { index, term, conf_state: log.conf_state.clone(), offset: target.offset }
        };
        self.store.borrow_mut().compact(group, compacted);
        self.stats.compactions += 1;
    }

    /// Entry bytes a group keeps past its compaction point, so a follower
    /// that lags briefly catches up from the log rather than a snapshot:
    /// an eighth of the store's bound, shared by the groups.
    fn tail_bytes(&self) -> u64 {
        let groups = self.host.group_count().max(1) as u64;
        self.store.borrow().entry_bytes_max() / 8 / groups
    }

    /// The partition of `group` lacks records before the compaction point
    /// (a snapshot was installed, or a power cut took records a kill would
    /// not): nothing is delivered until they are fetched from a peer
    /// ([`crate::replication::catchup`]), logged once per episode.
    fn note_gap(&mut self, group: GroupId, partition: u32, end_offset: u64) {
        self.stats.gaps += 1;
        self.gaps.insert(group, Instant::now());
        let needed = self.store.borrow().log(group).map_or(0, |log| log.compacted.offset);
        self.catchup.open(group, partition, end_offset, needed);
        self.gap_warnings.occur(
            Instant::now(),
            log::Level::Warn,
            log::Scope::process(),
            format_args!(
                "replication: partition {} of group stream {:08x} ends at offset {end_offset}, before its group's \
                 compaction point (offset {needed}): fetching the records up to there from another replica's \
                 partition log; delivery to it waits until then",
                group.partition, group.stream_id
            ),
        );
    }

    /// The global partition id of `group` on this node, if its stream is in
    /// the catalog.
    pub(crate) fn partition_of(&self, group: GroupId) -> Option<u32> {
        let stream = self.streams.get(&group.stream_id)?;
        (group.partition < stream.partitions).then(|| stream.base + group.partition)
    }

    /// The offset the partition of `group` must reach to close its gap:
    /// its group's compaction point here.
    pub(crate) fn gap_needed(&self, group: GroupId) -> Option<u64> {
        self.store.borrow().log(group).map(|log| log.compacted.offset)
    }

    /// The other replicas of `group` a gap's records may come from, its
    /// leader first.
    pub(crate) fn gap_sources(&self, group: GroupId) -> Vec<NodeId> {
        let Some(status) = self.host.status(group) else { return Vec::new() };
        let others = status.voters.iter().chain(&status.learners).filter(|replica| **replica != status.leader);
        std::iter::once(&status.leader)
            .chain(others)
            .filter(|replica| **replica != 0 && **replica != self.self_id)
            .filter_map(|replica| self.node_ids.get(replica).copied())
            .collect()
    }

    /// Whether this node holds a replica of `group` (voter or learner).
    pub(crate) fn holds(&self, group: GroupId) -> bool {
        self.host.commit_of(group).is_some()
    }

    /// The replicated partitions (global ids, sorted) of which this node
    /// holds no replica ([`crate::replication::mirror::MirrorView`]).
    pub(crate) fn unheld_partitions(&self) -> Vec<u32> {
        let mut unheld = Vec::new();
        for (stream_id, stream) in &self.streams {
            for partition in 0..stream.partitions {
                if !self.holds(GroupId { stream_id: *stream_id, partition }) {
                    unheld.push(stream.base + partition);
                }
            }
        }
        unheld.sort_unstable();
        unheld
    }

    /// Whether this node is a voter of `group` (its partition log is then
    /// the committed log up to a recent point).
    pub(crate) fn is_voter(&self, group: GroupId) -> bool {
        self.host.status(group).is_some_and(|status| status.voters.contains(&self.self_id))
    }

    /// The replicas a mirror of `group` (held nowhere here) may read from:
    /// the leader a refusal last named, then the placement's replicas, all
    /// live and other than this node.
    pub(crate) fn mirror_sources(&self, group: GroupId) -> Vec<NodeId> {
        let live = |replica: &ReplicaId| *replica != self.self_id && self.live.iter().any(|c| c.replica == *replica);
        let mut replicas: Vec<ReplicaId> =
            self.leader_hints.get(&group).filter(|hint| live(hint)).copied().into_iter().collect();
        if self.streams.contains_key(&group.stream_id) {
            for replica in self.host.desired_replicas(group).replicas {
                if live(&replica) && !replicas.contains(&replica) {
                    replicas.push(replica);
                }
            }
        }
        replicas.iter().filter_map(|replica| self.node_ids.get(replica).copied()).collect()
    }

    /// The gap of `group` is filled (or the group is no longer held here):
    /// delivery goes on at its next round.
    pub(crate) fn gap_filled(&mut self, group: GroupId) {
        self.gaps.remove(&group);
    }

    /// How the gap fetches send to peers.
    pub(crate) fn transport_handle(&self) -> TransportHandle {
        self.transport.clone()
    }

    /// Live members placement may choose, this node included unless it is
    /// leaving: 0 when a leaving node has nobody to hand over to.
    pub fn live_members(&self) -> usize {
        self.live.len()
    }

    /// Groups that still have a replica on this node as it leaves: it
    /// leads them, or is a voter or learner of them as far as it knows and
    /// still hears from their leader (a replica removed while the leader's
    /// last word to it was lost never learns it; a second of silence from
    /// the other leader of an awake group says so; a group with no leader
    /// at all is held).
    pub fn replicas_held(&self) -> usize {
        self.host
            .groups()
            .filter(|group| {
                let Some(status) = self.host.status(*group) else { return false };
                let member = status.voters.contains(&self.self_id) || status.learners.contains(&self.self_id);
                let silent = self.host.silent_ticks(*group).is_some_and(|ticks| ticks >= REMOVED_SILENT_TICKS);
                let removed = silent && !status.quiet && status.leader != 0;
                status.leader == self.self_id || (member && !removed)
            })
            .count()
    }

    /// Every group as `GET /cluster` shows it.
    pub fn views(&self) -> Vec<GroupView> {
        let name_of = |replica: &ReplicaId| {
            self.node_ids.get(replica).map_or_else(|| format!("replica {replica:x}"), |node| node.to_string())
        };
        self.host
            .groups()
            .filter_map(|group| {
                let status = self.host.status(group)?;
                let stream = self.streams.get(&group.stream_id).map_or_else(
                    || match group == CATALOG_GROUP {
                        true => "(catalog)".to_string(),
                        false => format!("(group stream {:08x}, not in this node's catalog)", group.stream_id),
                    },
                    |stream| stream.name.clone(),
                );
                let (preferred_leader, next_step) = self.host.placement_status(group);
                Some(GroupView {
                    preferred_leader: preferred_leader.as_ref().map(name_of),
                    next_step,
                    stream,
                    partition: group.partition,
                    role: format!("{:?}", status.role).to_lowercase(),
                    leader: (status.leader != 0).then(|| name_of(&status.leader)),
                    leader_is_self: status.leader == self.self_id,
                    term: status.term,
                    commit: status.commit,
                    last_index: status.last_index,
                    voters: status.voters.iter().map(name_of).collect(),
                    learners: status.learners.iter().map(name_of).collect(),
                    quiet: status.quiet,
                    delivered_offset: self.cursors.get(&group).map(|cursor| cursor.offset),
                    proposals_in_flight_max: self.in_flight.get(&group).map_or(0, |in_flight| in_flight.1),
                    proposals_pending: self.in_flight.get(&group).map_or(0, |in_flight| in_flight.0),
                })
            })
            .collect()
    }
}

/// Delivers committed records to the shards (module doc, step 3) until
/// nothing is due; then answers what was delivered.
///
/// Deliveries go in waves: every due group's next records are sent to its
/// shard at once, up to [`DELIVERY_WAVE_BYTES_MAX`], and the answers are
/// taken after; one at a time, a round touching 150 groups waited for 150
/// thread round trips to the shard in a row, which held every `#SYNC` of
/// a stream with many partitions for tens of milliseconds. A group has at
/// most one delivery in flight, so its records still arrive in order.
pub async fn deliver(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<crate::shard::control::ControlRequest>],
) {
    let mut due = node.borrow().next_delivery();
    for _ in 0..64 {
        if due.is_empty() {
            break;
        }
        due = deliver_wave(node, controls, &due).await;
    }
}

/// A delivery sent, waiting for its shard's answer.
struct InDelivery {
    group: GroupId,
    partition: u32,
    first_offset: u64,
    after: Option<Cursor>,
    shard: u16,
    records: Bytes,
    /// Nothing new, sent only to learn how durable the partition is
    /// ([`ReplicationNode::compaction_waits`]): its answer does not make
    /// the group due again in this pass.
    probe: bool,
}

/// One wave of deliveries (see [`deliver`]): the groups that may have
/// more, for the next wave.
async fn deliver_wave(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<crate::shard::control::ControlRequest>],
    due: &[(GroupId, u32)],
) -> Vec<(GroupId, u32)> {
    let mut more = Vec::new();
    let mut sent = Vec::new();
    let mut wave_bytes = 0;
    let (answer_sender, answers) = flume::bounded(due.len());
    for &(group, partition) in due {
        if wave_bytes >= DELIVERY_WAVE_BYTES_MAX {
            more.push((group, partition));
            continue;
        }
        let first_index = node.borrow().store.borrow().log(group).map_or(1, |log| log.first_index());
        // A cursor before the compaction point (a snapshot came): learn again.
        let known = node.borrow().cursors.get(&group).copied().filter(|cursor| cursor.index >= first_index);
        let (records, first_offset, after, probe) = match known {
            Some(cursor) => {
                let (records, after) = node.borrow().committed_records(group, cursor);
                // Nothing new: only a compaction that waits asks (an empty
                // delivery, which does not make the group due again).
                if after.index == cursor.index && !node.borrow().compaction_waits(group) {
                    continue;
                }
                (records, cursor.offset, Some(after), after.index == cursor.index)
            }
            // Learn where the shard's log ends first (an empty delivery).
            None => (Bytes::new(), u64::MAX, None, false),
        };
        wave_bytes += records.len();
        let shard = node.borrow().owners.get(&group).copied().unwrap_or(0);
        let Some(control) = controls.get(usize::from(shard)) else { continue };
        let reply = DeliveryReply { answers: answer_sender.clone(), slot: sent.len() };
        let request = CommittedRecords { partition, first_offset, records: records.clone(), reply };
        if control.send_async(crate::shard::control::ControlRequest::Committed(request)).await.is_err() {
            continue;
        }
        sent.push(InDelivery { group, partition, first_offset, after, shard, records, probe });
    }
    // Only the requests hold senders now: once every shard answered or
    // dropped its request, the queue says so and nothing waits longer.
    drop(answer_sender);
    {
        let stats = &mut node.borrow_mut().stats;
        stats.delivery_waves += 1;
        stats.deliveries += sent.len() as u64;
    }
    let answered = take_answers(&answers, sent.len()).await;
    for (delivery, answer) in sent.into_iter().zip(answered) {
        let end = match answer {
            Some(Some(end)) => {
                node.borrow_mut().owners.insert(delivery.group, delivery.shard);
                Some(end)
            }
            // Not this shard's (the partition moved) or no answer in time:
            // the other shards in turn (which records the one that answers).
            Some(None) | None => {
                ask_owner(node, controls, delivery.group, delivery.partition, delivery.first_offset, delivery.records)
                    .await
            }
        };
        let Some(end) = end else { continue };
        if settle_delivery(&mut node.borrow_mut(), delivery.group, delivery.partition, delivery.after, end)
            && !delivery.probe
        {
            more.push((delivery.group, delivery.partition));
        }
    }
    more
}

/// The answers to a wave's `count` deliveries, by slot, as they come within
/// [`DELIVERY_TIMEOUT_MS`] (one timer for the wave, and none at all for
/// what is already there): `None` for a delivery not answered in time or
/// dropped unanswered.
async fn take_answers(
    answers: &flume::Receiver<(usize, Option<PartitionEnd>)>,
    count: usize,
) -> Vec<Option<Option<PartitionEnd>>> {
    let mut taken = vec![None; count];
    let mut timeout = std::pin::pin!(glommio::timer::sleep(Duration::from_millis(DELIVERY_TIMEOUT_MS)));
    let mut left = count;
    while left > 0 {
        let answer = match answers.try_recv() {
            Ok(answer) => answer,
            Err(flume::TryRecvError::Disconnected) => break,
            Err(flume::TryRecvError::Empty) => {
                let next = async { answers.recv_async().await.ok() };
                let expired = async {
                    (&mut timeout).await;
                    None
                };
                match futures_lite::future::or(next, expired).await {
                    Some(answer) => answer,
                    None => break,
                }
            }
        };
        let (slot, end) = answer;
        if let Some(taken) = taken.get_mut(slot).filter(|taken| taken.is_none()) {
            *taken = Some(end);
            left -= 1;
        }
    }
    taken
}

/// Takes a shard's answer to a delivery: moves the group's cursor and
/// answers what it delivered; whether there may be more to deliver.
fn settle_delivery(
    node: &mut ReplicationNode,
    group: GroupId,
    partition: u32,
    after: Option<Cursor>,
    end: PartitionEnd,
) -> bool {
    match after {
        Some(after) if after.offset == end.end_offset => {
            node.cursors.insert(group, after);
            node.delivered(group, after, end.durable_offset);
            true
        }
        _ => {
            // First contact, or the shard's log is not where the cursor
            // thought (it lost an unsynced tail, or has more): start again
            // from where it ends.
            node.durable_points.remove(&group);
            let Some(cursor) = node.cursor_for(group, end.end_offset) else {
                node.cursors.remove(&group);
                node.note_gap(group, partition, end.end_offset);
                return false;
            };
            node.gaps.remove(&group);
            node.catchup.close(group);
            node.cursors.insert(group, cursor);
            true
        }
    }
}

/// Sends a delivery to the shard owning `partition`, trying the others when
/// it moved; the shard's log end, or `None` when no shard answered.
pub(crate) async fn ask_owner(
    node: &RefCell<ReplicationNode>,
    controls: &[flume::Sender<crate::shard::control::ControlRequest>],
    group: GroupId,
    partition: u32,
    first_offset: u64,
    records: Bytes,
) -> Option<PartitionEnd> {
    let first = node.borrow().owners.get(&group).copied().unwrap_or(0);
    let count = controls.len() as u16;
    for step in 0..count {
        let shard = (first + step) % count;
        let (answers, answer) = flume::bounded(1);
        let reply = DeliveryReply { answers, slot: 0 };
        let request = CommittedRecords { partition, first_offset, records: records.clone(), reply };
        let control = &controls[usize::from(shard)];
        if control.send_async(crate::shard::control::ControlRequest::Committed(request)).await.is_err() {
            return None;
        }
        if let [Some(Some(end))] = take_answers(&answer, 1).await[..] {
            node.borrow_mut().owners.insert(group, shard);
            return Some(end);
        }
    }
    None
}

/// The shard's side of a delivery: appends the records of `committed` that
/// `partition_end_offset` says the partition lacks, through `append`;
/// returns the log's new end.
pub fn append_committed(
    committed: &CommittedRecords,
    partition_end_offset: u64,
    mut append: impl FnMut(&crate::protocol::record::RecordRef<'_>),
) -> u64 {
    if committed.first_offset > partition_end_offset {
        return partition_end_offset;
    }
    let mut skip = partition_end_offset - committed.first_offset;
    let mut end = partition_end_offset;
    let mut position = 0;
    while let Some(record) = committed.records.get(position..).and_then(decode_log_record) {
        position += record.log_record.len();
        if skip > 0 {
            skip -= 1;
            continue;
        }
        append(&record);
        end += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDERS: GroupId = GroupId { stream_id: 7, partition: 0 };
    const OTHER: GroupId = GroupId { stream_id: 7, partition: 1 };

    fn request(
        shard: u16,
        group: GroupId,
        sequence: u64,
        resync: bool,
        records: &[u8],
    ) -> (ProposalRequest, flume::Receiver<Result<(), ProposalRefused>>) {
        let (reply, answer) = flume::bounded(1);
        let request = ProposalRequest {
            group,
            shard,
            sequence,
            resync,
            records: Bytes::copy_from_slice(records),
            record_count: 1,
            reply,
        };
        (request, answer)
    }

    fn shape(runs: &[Run]) -> Vec<(u16, u32, u64, u64, u32, Vec<u8>)> {
        runs.iter()
            .map(|run| {
                let records = run.records.concat();
                (run.shard, run.group.partition, run.first_sequence, run.last_sequence, run.record_count, records)
            })
            .collect()
    }

    #[test]
    fn consecutive_proposals_of_a_shard_and_group_become_one_run_in_order() {
        let requests = vec![
            request(0, ORDERS, 4, false, b"a").0,
            request(0, OTHER, 9, false, b"x").0,
            request(1, ORDERS, 0, false, b"p").0,
            request(0, ORDERS, 5, false, b"b").0,
            request(0, ORDERS, 6, false, b"c").0,
            request(0, OTHER, 10, false, b"y").0,
        ];
        assert_eq!(
            shape(&runs_of(requests)),
            vec![(0, 0, 4, 6, 3, b"abc".to_vec()), (0, 1, 9, 10, 2, b"xy".to_vec()), (1, 0, 0, 0, 1, b"p".to_vec()),]
        );
    }

    #[test]
    fn a_gap_a_resync_or_the_byte_bound_starts_a_later_run() {
        let big = vec![b'z'; PROPOSAL_RUN_BYTES_MAX];
        let requests = vec![
            request(0, ORDERS, 1, false, b"a").0,
            request(0, ORDERS, 3, false, b"c").0,
            request(0, ORDERS, 4, true, b"d").0,
            request(0, ORDERS, 5, false, b"e").0,
            request(0, ORDERS, 6, false, &big).0,
        ];
        let runs = runs_of(requests);
        let sequences: Vec<(u64, u64)> = runs.iter().map(|run| (run.first_sequence, run.last_sequence)).collect();
        assert_eq!(sequences, vec![(1, 1), (3, 3), (4, 5), (6, 6)]);
        assert!(runs[2].resync && !runs[1].resync, "a resync opens its own run");
    }

    #[test]
    fn a_refused_run_refuses_its_first_proposal_and_puts_the_rest_behind_it() {
        let (first, first_answer) = request(0, ORDERS, 0, false, b"a");
        let (second, second_answer) = request(0, ORDERS, 1, false, b"b");
        let mut runs = runs_of(vec![first, second]);
        runs[0].replies.answer(Err(ProposalRefused::NoLeader));
        assert_eq!(first_answer.try_recv(), Ok(Err(ProposalRefused::NoLeader)));
        assert_eq!(second_answer.try_recv(), Ok(Err(ProposalRefused::OutOfOrder)));

        let (first, first_answer) = request(0, ORDERS, 2, false, b"c");
        let (second, second_answer) = request(0, ORDERS, 3, false, b"d");
        let mut runs = runs_of(vec![first, second]);
        runs[0].replies.answer(Ok(()));
        assert_eq!((first_answer.try_recv(), second_answer.try_recv()), (Ok(Ok(())), Ok(Ok(()))));
    }

    /// A node with no peer and no group (proposals to it are pending ones
    /// put in place by [`pend`]).
    fn bare_node() -> ReplicationNode {
        ReplicationNode::new(NodeId(1), FileLogStore::in_memory(), TransportHandle::new())
    }

    /// Puts a pending proposal of `ORDERS` from shard 0 in place, as
    /// [`ReplicationNode::propose_run`] would have: source sequence
    /// `sequence` (also its shard sequence), sent `sends` times, last to
    /// `sent_to`; its answer.
    fn pend(
        node: &mut ReplicationNode,
        sequence: u64,
        sent_to: NodeId,
        sends: u32,
    ) -> flume::Receiver<Result<(), ProposalRefused>> {
        let (request, answer) = request(0, ORDERS, sequence, false, b"a");
        let run = Run::of(request);
        let header = ProposalHeader { source_node: node.self_id, source_sequence: sequence, record_count: 1 };
        let now = Instant::now();
        let pending = Pending {
            group: ORDERS,
            shard: 0,
            shard_sequence: sequence,
            sent_to: Some(sent_to),
            replies: run.replies,
            since: now,
            header,
            records: run.records,
            sent_at: now,
            sends,
            retry_after_refusal: false,
        };
        node.pending.insert(sequence, pending);
        node.in_flight.entry(ORDERS).or_default().0 += 1;
        node.expected.insert((0, ORDERS), sequence + 1);
        answer
    }

    #[test]
    fn a_refusal_answers_a_proposal_sent_once_and_sends_one_sent_twice_again() {
        // Sent once: the refusal is about that send (from the node it went
        // to, or the leader that node passed it on to), and about the later
        // ones sent the same way.
        let mut node = bare_node();
        let (first, later) = (pend(&mut node, 1, NodeId(2), 1), pend(&mut node, 2, NodeId(2), 1));
        node.receive_propose_refused(&propose_answer(ORDERS, 1));
        assert_eq!(first.try_recv(), Ok(Err(ProposalRefused::LeaderRefused)));
        assert_eq!(later.try_recv(), Ok(Err(ProposalRefused::OutOfOrder)));
        assert!(node.pending.is_empty());
        assert_eq!(node.expected[&(0, ORDERS)], 1, "the shard proposes them again from the first");

        // Sent twice (the leader changed in between): the other send may
        // have been taken, and answering it refused would have the shard
        // propose its records again under a new header, stored twice. It
        // stays, due to be sent again (looked up by the leader) next tick.
        let mut node = bare_node();
        let answer = pend(&mut node, 1, NodeId(3), 2);
        node.receive_propose_refused(&propose_answer(ORDERS, 1));
        assert!(answer.try_recv().is_err(), "a proposal sent twice was answered refused");
        assert!(node.pending[&1].retry_after_refusal, "not due to be sent again");
        assert_eq!(node.stats.refusals_of_resent, 1);
        // Meanwhile the group takes no new proposal: it would go out while
        // the held one's later proposals are refused on their way back.
        let (second, second_answer) = request(0, ORDERS, 2, false, b"b");
        node.propose(second);
        assert_eq!(second_answer.try_recv(), Ok(Err(ProposalRefused::EarlierResent)));
        let (other, other_answer) = request(0, OTHER, 0, false, b"x");
        node.propose(other);
        assert_ne!(other_answer.try_recv(), Ok(Err(ProposalRefused::EarlierResent)));
        // Once it is answered (here: committed), the group takes them again.
        node.receive_propose_ack(&propose_answer(ORDERS, 1));
        assert_eq!(answer.try_recv(), Ok(Ok(())));
        let (second, second_answer) = request(0, ORDERS, 2, false, b"b");
        node.propose(second);
        assert_ne!(second_answer.try_recv(), Ok(Err(ProposalRefused::EarlierResent)));

        // Sent once, but a later one the refusal would sweep was sent twice:
        // that one may have been taken, so neither is answered.
        let mut node = bare_node();
        let (first, later) = (pend(&mut node, 1, NodeId(2), 1), pend(&mut node, 2, NodeId(2), 2));
        node.receive_propose_refused(&propose_answer(ORDERS, 1));
        assert!(first.try_recv().is_err() && later.try_recv().is_err(), "answered a sweep with a proposal sent twice");
        assert!(node.pending[&1].retry_after_refusal);
    }
}
