//! Consumer groups: members share a stream's partitions, the group
//! remembers how far it got, and a `hold` group can pause the producers.
//!
//! # Where group state lives
//!
//! Each group has one **coordinator shard**, `xxh3(stream id, group) %
//! shards`: it holds the group's members, generation, assignment and
//! committed offsets ([`coordinator::GroupState`]) and writes the offsets to
//! `<data-dir>/groups/<stream>/<group>.json` ([`store`]). Hashing spreads
//! groups over the shards, so no shard coordinates every group, and a
//! group's decisions are made in one place without locks. A member's
//! connection may be on any shard: its session reads the partitions from
//! their owners like any subscriber and talks to the coordinator over the
//! mesh (joins, commits, revocations done; assignments and acks back).
//!
//! Committed offsets are the group's, not the partition's: they stay on the
//! coordinator when a partition migrates between shards, so a move changes
//! where members fetch from and nothing else (no offset travels, none can be
//! lost in transit). A busy coordinator shard delays its groups' joins,
//! commit acks and rebalances (they queue on its mesh rings, which are
//! bounded by the protocol: one join, a bounded number of commits in flight
//! per member, one revocation per rebalance), never another shard's events.
//!
//! # Rebalancing
//!
//! Sticky and balanced by partition count ([`assign::balance`]), cooperative
//! ([`coordinator`]): a partition that moves is revoked from its holder, and
//! assigned to its next member only after the holder's session wrote its
//! last event and `REVOKED`. Events after the holder's last commit are
//! delivered again to the next member (at least once).
//!
//! # Hold groups
//!
//! While a `hold` group has live members, its committed offsets are a floor
//! for every partition: retention never deletes a segment at or past it, and
//! when `(end - committed)` times the partition's mean record size exceeds
//! `--group-hold-lag-bytes`, the partition's owner marks it held on every
//! shard: ingest routing into it waits (the connection stops reading its
//! socket, as when it runs out of credits) until the group commits enough.
//! A connection that mixes partitions waits at the first event of a held
//! partition, so its events for other partitions wait behind it
//! (head-of-line, to keep each connection's order). A hold group with no
//! live member holds nothing: an abandoned group must not stop a stream.

pub mod assign;
pub mod coordinator;
pub mod messages;
pub mod store;

pub use coordinator::{Effect, GroupState, MemberId, Start};

/// The coordinator shard of a group.
pub fn coordinator_of(stream_id: u32, group: &str, shard_count: u16) -> u16 {
    let mut key = Vec::with_capacity(4 + group.len());
    key.extend_from_slice(&stream_id.to_le_bytes());
    key.extend_from_slice(group.as_bytes());
    (crate::protocol::key_hash(&key) % u64::from(shard_count)) as u16
}
