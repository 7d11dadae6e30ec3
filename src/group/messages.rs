//! The messages of consumer groups between shards, as plain data: what a
//! member's session sends its coordinator, what the coordinator answers,
//! and the hold floors and flags every shard keeps. `shard::groups` sends
//! and handles them; the mesh frame carries them boxed.

use crate::group::{MemberId, Start};
use crate::protocol::group::OffsetReset;

/// A group: its stream's id and its name.
pub type GroupKey = (u32, String);

/// Consumer-group traffic between shards.
#[derive(Debug, Clone)]
pub enum GroupFrame {
    /// To the coordinator: a member joins.
    Join { member: MemberId, key: GroupKey, stream: String, base: u32, partitions: u32, reset: OffsetReset, hold: bool },
    /// To the coordinator: a member's connection ended.
    Leave { member: MemberId, key: GroupKey },
    /// To the coordinator: a member commits.
    Commit { member: MemberId, key: GroupKey, partition: u32, next_offset: u64 },
    /// To the coordinator: where a member started in a partition the group
    /// never committed.
    CommitStart { key: GroupKey, partition: u32, offset: u64 },
    /// To the coordinator: the member wrote `REVOKED` for these.
    RevokeDone { member: MemberId, key: GroupKey, partitions: Vec<u32> },
    /// To the shard holding the member's connection.
    ToMember { member: MemberId, event: MemberEvent },
    /// To every shard: a hold group's floors (committed offsets by global
    /// partition id, `u64::MAX` where none), or `None` when it holds nothing.
    Floors { key: GroupKey, base: u32, floors: Option<Vec<u64>> },
    /// To every shard, from the partition's owner: hold or release ingest.
    Held { partition: u32, held: bool },
    /// To the coordinator: a Kafka consumer group's OffsetCommit for one
    /// stream (`(partition, next offset)`, stream-local partitions). The
    /// reply is a Kafka error code, sent once the offsets are durable.
    KafkaCommit { key: GroupKey, stream: KafkaStream, offsets: Vec<(u32, u64)>, reply: flume::Sender<i16> },
    /// To the coordinator: a Kafka group's committed offsets for a stream
    /// (one per partition), or the Kafka error code refusing them.
    KafkaOffsets { key: GroupKey, reply: flume::Sender<Result<Vec<Option<u64>>, i16>> },
}

/// A stream as a Kafka group's commit names it: name, base, partitions.
#[derive(Debug, Clone)]
pub struct KafkaStream {
    pub name: String,
    pub base: u32,
    pub partitions: u32,
}

/// What a member's session hears from its coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    Assigned {
        generation: u64,
        partitions: Vec<u32>,
        starts: Vec<Start>,
    },
    Revoke {
        generation: u64,
        partitions: Vec<u32>,
    },
    CommitOk {
        partition: u32,
        next_offset: u64,
    },
    CommitRefused {
        partition: u32,
    },
    /// The join is refused: the `ERR` line to send, then close.
    Refused(String),
    /// Cut: it did not finish a revocation in time.
    Expelled,
}
