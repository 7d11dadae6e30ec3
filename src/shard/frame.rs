//! The one message type that crosses the channel mesh between shards.
//!
//! Frames are few and large: data moves in batches of many events, credits
//! return in grants that cover a whole batch, and subscribers pull with one
//! fetch per owner at a time. Every frame is bounded by the credit scheme
//! (see [`crate::config::Config::mesh_channel_frames`]).

use crate::balance::{LoadReport, Refusal};
use crate::partition::MovedPartition;
use crate::partition::fetch::{FetchCredit, FetchReply, FetchRequest};
pub use crate::partition::migration::Marker;

/// A message between two shards.
#[derive(Debug)]
pub enum Frame {
    /// Events for partitions the receiver owns.
    Data(DataBatch),
    /// The receiver's credits come back: the sender applied its batches.
    Credit(CreditGrant),
    /// A subscriber on the sending shard asks for events.
    Fetch(FetchRequest),
    /// Events for a subscriber on the receiving shard (boxed: one per fetch,
    /// and it is the largest frame).
    FetchReply(Box<FetchReply>),
    /// A subscriber on the sending shard wrote out replies of its standing
    /// fetch here: the window comes back.
    FetchCredit(FetchCredit),
    /// A subscriber on the sending shard went away: forget its parked fetch.
    FetchCancel { subscription_id: u64 },
    /// A subscriber on the sending shard has cursors for the receiver that
    /// its parked fetch does not carry (a partition moved here): answer the
    /// parked fetch now, so it can send one that does.
    FetchWake { subscription_id: u64 },
    /// Gossip: the sender's load, every report interval.
    Load(LoadReport),
    /// The sender (an underloaded shard) asks the receiver for a partition.
    StealRequest { thief_events_per_s: f64 },
    /// The receiver's steal request was refused.
    StealRefused(Refusal),
    /// The sender, the partition's current owner, moves it to `owner` with a
    /// higher epoch (step 1 of the migration protocol, sent to every shard).
    Placement { partition: u32, owner: u16, epoch: u32 },
    /// The partition itself, once the old owner has applied every event
    /// routed to it before the switch (step 4).
    Handoff(Handoff),
    /// Consumer-group traffic: joins, commits, assignments, hold floors
    /// ([`crate::shard::groups`] handles them). Boxed: rare and larger than
    /// the rest.
    Group(Box<crate::group::messages::GroupFrame>),
}

/// A partition in transit: its in-memory log (segments move, no copy), its
/// files' metadata (the thief opens them again), and its rate history.
/// Offsets continue at the thief without a gap.
#[derive(Debug)]
pub struct Handoff {
    pub partition_id: u32,
    pub epoch: u32,
    pub partition: Box<MovedPartition>,
}

/// Bytes one frame takes in a mesh ring (the memory formula's mesh term).
pub const FRAME_SIZE_BYTES: usize = std::mem::size_of::<Frame>();
// Frames are moved through the rings by value: keep them small (batches and
// replies live on the heap), and keep the formula's figure honest.
const _: () = assert!(FRAME_SIZE_BYTES <= 128, "Frame grew: check the mesh term of the memory formula");

/// A batch of events from one source shard for one owner shard.
#[derive(Debug)]
pub struct DataBatch {
    /// Per (source, owner) sequence number, from 1, without gaps.
    pub sequence: u64,
    /// Batch records ([`crate::protocol::record`]).
    pub bytes: Vec<u8>,
    pub event_count: u32,
    /// Markers that follow this batch's events (usually none: no allocation).
    pub markers: Vec<Marker>,
    /// A `#SYNC` waits for this batch: its grant returns only once the
    /// events before it are durable under the fsync policy.
    pub sync: bool,
    /// The source wants its credits back promptly: the owner sends this
    /// batch's grant, and every grant it holds for the source, at once
    /// (`shard::grants`). Otherwise grants may wait at the owner
    /// to leave several in one frame.
    pub grant_now: bool,
}

/// Credits returned by an owner after applying `batch_count` batches, the
/// last of them `sequence` (grants arrive in order).
#[derive(Debug)]
pub struct CreditGrant {
    /// Sequence of the last applied batch covered.
    pub sequence: u64,
    /// Batches covered: `sequence - batch_count + 1 ..= sequence`.
    pub batch_count: u32,
    /// Credit bytes returned (the record bytes of those batches).
    pub credit_bytes: usize,
    /// The applied batches' buffers, returned for reuse so steady state
    /// allocates no batch buffers (and frees none across threads): the
    /// first here, the others in `more_recycled` (empty, so no allocation,
    /// for a grant of one batch).
    pub recycled: Vec<u8>,
    pub more_recycled: Vec<Vec<u8>>,
    /// A covered batch carried a `#SYNC` (see [`DataBatch::sync`]).
    pub sync: bool,
    /// A covered batch asked for its grant at once ([`DataBatch::grant_now`]).
    pub grant_now: bool,
}

impl CreditGrant {
    /// Folds the grant of the next batch in sequence into this one.
    pub fn merge(&mut self, next: CreditGrant) {
        assert_eq!(next.sequence, self.sequence + u64::from(next.batch_count), "grants merge in sequence");
        self.sequence = next.sequence;
        self.batch_count += next.batch_count;
        self.credit_bytes += next.credit_bytes;
        self.more_recycled.push(next.recycled);
        self.more_recycled.extend(next.more_recycled);
        self.sync |= next.sync;
        self.grant_now |= next.grant_now;
    }
}

impl crate::partition::apply::Batch for DataBatch {
    type Grant = CreditGrant;

    fn records(&self) -> &[u8] {
        &self.bytes
    }

    fn markers(&self) -> &[Marker] {
        &self.markers
    }

    /// The grant returns the batch's credits and its buffer, for reuse.
    fn into_grant(self) -> CreditGrant {
        CreditGrant {
            sequence: self.sequence,
            batch_count: 1,
            credit_bytes: self.bytes.len(),
            recycled: self.bytes,
            more_recycled: Vec::new(),
            sync: self.sync,
            grant_now: self.grant_now,
        }
    }
}
