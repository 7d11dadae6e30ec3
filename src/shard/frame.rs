//! The one message type that crosses the channel mesh between shards.
//!
//! Frames are few and large: data moves in batches of many events, credits
//! return in grants that cover a whole batch, and subscribers pull with one
//! fetch per owner at a time. Every frame is bounded by the credit scheme
//! (see [`crate::config::Config::mesh_channel_frames`]).

use crate::subscribe::{FetchReply, FetchRequest};

/// A message between two shards.
#[derive(Debug)]
pub enum Frame {
    /// Events for partitions the receiver owns.
    Data(DataBatch),
    /// The receiver's credits come back: the sender applied its batches.
    Credit(CreditGrant),
    /// A subscriber on the sending shard asks for events.
    Fetch(FetchRequest),
    /// Events for a subscriber on the receiving shard.
    FetchReply(FetchReply),
    /// A subscriber on the sending shard went away: forget its parked fetch.
    FetchCancel { subscription_id: u64 },
}

/// A batch of events from one source shard for one owner shard.
#[derive(Debug)]
pub struct DataBatch {
    /// Per (source, owner) sequence number, from 1, without gaps.
    pub sequence: u64,
    /// Batch records ([`crate::protocol::record`]).
    pub bytes: Vec<u8>,
    pub event_count: u32,
}

/// Credits returned by an owner after applying batches up to `sequence`.
#[derive(Debug)]
pub struct CreditGrant {
    /// Sequence of the last applied batch (grants arrive in order).
    pub sequence: u64,
    /// Credit bytes returned (the record bytes of the applied batch).
    pub credit_bytes: usize,
    /// The applied batch's buffer, returned for reuse so steady state
    /// allocates no batch buffers (and frees none across threads).
    pub recycled: Vec<u8>,
}
