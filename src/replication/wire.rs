//! The one message per peer node per round that carries every group's Raft
//! messages (TiKV batches the same way): heartbeats of a thousand groups
//! between two nodes cost one transport frame, not a thousand.
//!
//! Layout (little-endian): `from: u64`, `to: u64`, `count: u32`, then per
//! message `stream_id: u32`, `partition: u32`, `bytes: u32` and the raft-rs
//! message in its protobuf encoding; then `quiet_count: u32` and per notice
//! `stream_id: u32`, `partition: u32`, `term: u64`. A decoder checks every length against
//! what is left and the limits below, so a peer's bytes cannot make it
//! allocate or panic.

use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::replication::{GroupId, ReplicaId};

/// Most messages in one batch (a node with this many groups sharing a peer
/// sends several batches). 64 Ki messages of heartbeats is about 2 MiB.
pub const BATCH_MESSAGES_MAX: usize = 65_536;
/// Bytes a batch is cut at (by [`message_bytes_estimate`]): well under
/// the transport's largest frame, so a batch of appends always fits one.
pub const BATCH_BYTES_MAX: usize = 1 << 20;
/// Largest encoded raft-rs message: an append of entries up to the Raft
/// config's `max_size_per_msg` plus headers.
pub const MESSAGE_BYTES_MAX: usize = 8 << 20;
const BATCH_HEADER_BYTES: usize = 8 + 8 + 4;
const MESSAGE_HEADER_BYTES: usize = 4 + 4 + 4;
const QUIET_NOTICE_BYTES: usize = 4 + 4 + 8;

/// About the bytes `message` takes in a batch: its entries' data plus a
/// generous allowance for the headers (exact sizes would need protobuf's
/// size pass over every message).
pub fn message_bytes_estimate(message: &Message) -> usize {
    MESSAGE_HEADER_BYTES + 96 + message.entries.iter().map(|entry| entry.data.len() + 48).sum::<usize>()
}

/// Every group's messages from one node to another.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerBatch {
    pub from: ReplicaId,
    pub to: ReplicaId,
    pub messages: Vec<(GroupId, Message)>,
    /// Groups whose leader (the sender) went quiet in the given term
    /// (the host's doc: a follower that hears this stops its election timer).
    pub quiet: Vec<(GroupId, u64)>,
}

/// Why bytes from a peer are not a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    Truncated { needed_bytes: usize, left_bytes: usize },
    TooManyMessages { count: u64, count_max: usize },
    MessageTooLarge { message_bytes: u64, message_bytes_max: usize },
    Protobuf { reason: String },
    TrailingBytes { left_bytes: usize },
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad replication batch: {self:?}")
    }
}

impl std::error::Error for WireError {}

impl PeerBatch {
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut bytes = Vec::with_capacity(BATCH_HEADER_BYTES + self.messages.len() * 64);
        bytes.extend_from_slice(&self.from.to_le_bytes());
        bytes.extend_from_slice(&self.to.to_le_bytes());
        bytes.extend_from_slice(&(self.messages.len() as u32).to_le_bytes());
        for (group, message) in &self.messages {
            let encoded =
                message.write_to_bytes().map_err(|error| WireError::Protobuf { reason: error.to_string() })?;
            bytes.extend_from_slice(&group.stream_id.to_le_bytes());
            bytes.extend_from_slice(&group.partition.to_le_bytes());
            bytes.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
            bytes.extend_from_slice(&encoded);
        }
        bytes.extend_from_slice(&(self.quiet.len() as u32).to_le_bytes());
        for (group, term) in &self.quiet {
            bytes.extend_from_slice(&group.stream_id.to_le_bytes());
            bytes.extend_from_slice(&group.partition.to_le_bytes());
            bytes.extend_from_slice(&term.to_le_bytes());
        }
        Ok(bytes)
    }

    pub fn decode(bytes: &[u8]) -> Result<PeerBatch, WireError> {
        let mut reader = Reader { bytes };
        let from = reader.u64()?;
        let to = reader.u64()?;
        let count = reader.u32()? as usize;
        if count > BATCH_MESSAGES_MAX {
            return Err(WireError::TooManyMessages { count: count as u64, count_max: BATCH_MESSAGES_MAX });
        }
        // Each message takes at least its header: the count cannot ask for
        // more room than the bytes could fill.
        let mut messages = Vec::with_capacity(count.min(reader.bytes.len() / MESSAGE_HEADER_BYTES));
        for _ in 0..count {
            let group = GroupId { stream_id: reader.u32()?, partition: reader.u32()? };
            let length = reader.u32()? as usize;
            if length > MESSAGE_BYTES_MAX {
                let message_bytes_max = MESSAGE_BYTES_MAX;
                return Err(WireError::MessageTooLarge { message_bytes: length as u64, message_bytes_max });
            }
            let encoded = reader.take(length)?;
            let message = Message::parse_from_bytes(encoded)
                .map_err(|error| WireError::Protobuf { reason: error.to_string() })?;
            messages.push((group, message));
        }
        let quiet_count = reader.u32()? as usize;
        if quiet_count > BATCH_MESSAGES_MAX {
            return Err(WireError::TooManyMessages { count: quiet_count as u64, count_max: BATCH_MESSAGES_MAX });
        }
        let mut quiet = Vec::with_capacity(quiet_count.min(reader.bytes.len() / QUIET_NOTICE_BYTES));
        for _ in 0..quiet_count {
            quiet.push((GroupId { stream_id: reader.u32()?, partition: reader.u32()? }, reader.u64()?));
        }
        if !reader.bytes.is_empty() {
            return Err(WireError::TrailingBytes { left_bytes: reader.bytes.len() });
        }
        Ok(PeerBatch { from, to, messages, quiet })
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> Result<&'a [u8], WireError> {
        let Some((taken, rest)) = self.bytes.split_at_checked(count) else {
            return Err(WireError::Truncated { needed_bytes: count, left_bytes: self.bytes.len() });
        };
        self.bytes = rest;
        Ok(taken)
    }

    fn u32(&mut self) -> Result<u32, WireError> {
        let mut word = [0u8; 4];
        word.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(word))
    }

    fn u64(&mut self) -> Result<u64, WireError> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::eraftpb::{Entry, MessageType};

    /// A batch decodes to what was encoded; every truncation of it, and a
    /// count that promises more than the bytes hold, is an error, not a
    /// panic or an allocation the size of the lie.
    #[test]
    fn batch_round_trips_and_rejects_truncation() {
        let mut append = Message::default();
        append.set_msg_type(MessageType::MsgAppend);
        append
            .set_entries(vec![Entry { index: 3, term: 2, data: b"frame".to_vec().into(), ..Entry::default() }].into());
        let mut heartbeat = Message::default();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        let batch = PeerBatch {
            from: 1,
            to: 2,
            messages: vec![
                (GroupId { stream_id: 0, partition: 5 }, append),
                (GroupId { stream_id: 1, partition: 0 }, heartbeat),
            ],
            quiet: vec![(GroupId { stream_id: 2, partition: 9 }, 4)],
        };
        let bytes = batch.encode().expect("encodes");
        assert_eq!(PeerBatch::decode(&bytes), Ok(batch));
        for cut in 0..bytes.len() {
            assert!(PeerBatch::decode(&bytes[..cut]).is_err(), "a batch cut at {cut} decoded");
        }
        let mut lying = bytes[..BATCH_HEADER_BYTES].to_vec();
        lying[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(PeerBatch::decode(&lying), Err(WireError::TooManyMessages { .. })));
    }
}
