//! Kafka consumer groups' offsets on their coordinator shard: the same
//! entries, files and acknowledgements as a `GROUP` group's commits
//! (`GET /groups` and `/metrics` show them alike), marked as Kafka's so
//! neither kind of group can take over the other's name.
//!
//! A Kafka group is not tied to a stream: its offsets for each stream it
//! commits to are one entry `(stream id, group)`, coordinated by that
//! entry's shard like any group's. Kafka's membership (joins, generations)
//! is not here but in `kafka::groups`; the coordinator only stores offsets.

use std::rc::Rc;

use crate::group::GroupState;
use crate::group::messages::{GroupKey, KafkaStream};
use crate::kafka::codes;
use crate::shard::Shard;

use super::Coordinated;

impl Shard {
    /// Records a Kafka group's commit and answers once it is durable (the
    /// offsets writer sends NONE); refuses at once a `GROUP` group's name,
    /// a partition out of range, or a full coordinator.
    pub(super) fn on_kafka_commit(
        self: &Rc<Self>,
        key: GroupKey,
        stream: KafkaStream,
        offsets: Vec<(u32, u64)>,
        reply: flume::Sender<i16>,
    ) {
        let refusal = {
            let mut coordinated = self.groups.coordinated.borrow_mut();
            let full = coordinated.len() >= self.config.groups_per_shard_max(self.shard_count);
            if !coordinated.contains_key(&key) && full {
                Some(codes::COORDINATOR_NOT_AVAILABLE)
            } else {
                let entry = coordinated.entry(key).or_insert_with(|| Coordinated {
                    stream: stream.name,
                    base: stream.base,
                    state: GroupState::new(vec![None; stream.partitions as usize]),
                    dirty: false,
                    acks: Vec::new(),
                    kafka: true,
                });
                record_commit(entry, &offsets)
            }
        };
        match refusal {
            Some(code) => {
                let _ = reply.send(code);
            }
            None => {
                self.groups.kafka_acks.borrow_mut().push(reply);
                self.groups.persist_notify.notify();
            }
        }
    }

    /// A Kafka group's committed offsets for one stream (none committed:
    /// an empty list), or INCONSISTENT_GROUP_PROTOCOL for a `GROUP` group.
    pub(super) fn on_kafka_offsets(
        self: &Rc<Self>,
        key: &GroupKey,
        reply: flume::Sender<Result<Vec<Option<u64>>, i16>>,
    ) {
        let answer = match self.groups.coordinated.borrow().get(key) {
            None => Ok(Vec::new()),
            Some(entry) if !entry.kafka => Err(codes::INCONSISTENT_GROUP_PROTOCOL),
            Some(entry) => Ok(entry.state.committed().to_vec()),
        };
        let _ = reply.send(answer);
    }
}

/// Sets the committed offsets of a Kafka group's entry; the refusal code,
/// if any (then nothing changes).
fn record_commit(entry: &mut Coordinated, offsets: &[(u32, u64)]) -> Option<i16> {
    if !entry.kafka {
        return Some(codes::INCONSISTENT_GROUP_PROTOCOL);
    }
    if offsets.iter().any(|&(partition, _)| partition >= entry.state.partition_count()) {
        return Some(codes::UNKNOWN_TOPIC_OR_PARTITION);
    }
    for &(partition, offset) in offsets {
        entry.state.set_committed(partition, offset);
    }
    entry.dirty = true;
    None
}
