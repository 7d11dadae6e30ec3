//! The one message type that crosses the channel mesh between shards.
//!
//! Frames are few and large: data moves in batches of many events, credits
//! return in grants that cover a whole batch, and subscribers pull with one
//! fetch per owner at a time. Every frame is bounded by the credit scheme
//! (see [`crate::config::Config::mesh_channel_frames`]).

use crate::balance::{LoadReport, Refusal};
use crate::partition::MovedPartition;
use crate::partition::fetch::{FetchCredit, FetchReply, FetchRequest};
use crate::routing::{CreditGrant, DataBatch};

/// A message between two shards.
#[derive(Debug)]
pub enum MeshFrame {
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
    /// A producer connection moving to the receiver, which owns the
    /// partitions its events go to while the process is gathered
    /// ([`crate::shard::consolidation`]).
    Adopt(crate::shard::consolidation::Adoption),
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

// Frames are moved through the rings by value: keep them small (batches and
// replies live on the heap), and keep the formula's figure honest.
const _: () = assert!(std::mem::size_of::<MeshFrame>() <= crate::config::limits::MESH_FRAME_BYTES_MAX);
