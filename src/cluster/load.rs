//! How loaded each member is: a [`LoadSummary`] of the whole node that
//! every member publishes as a foca custom broadcast ([`LoadBroadcast`])
//! and every member keeps the latest of, per node ([`LoadTable`]).
//!
//! A broadcast carries its origin's `(started_unix_ms, incarnation,
//! sequence)`, its version: foca hands every broadcast it receives to
//! [`LoadHandler::receive_item`], which keeps it (and lets foca pass it on)
//! only when it is newer than what the table holds for that node. foca
//! replaces a queued broadcast by a newer one of the same node
//! ([`LoadKey`]'s `Invalidates`), so its backlog holds at most one per
//! member: the broadcasts cost `MEMBERS_MAX` entries at most, whatever the
//! rate.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cluster::MEMBERS_MAX;
use crate::cluster::identity::NodeId;
use crate::shard::metrics::ShardStats;

/// One node's load, summed over its shards (the same gauges as `/stats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadSummary {
    /// Stored events/s, averaged over the balancer's half-life.
    pub events_per_s: f64,
    /// Stored payload bytes/s, same average.
    pub bytes_per_s: f64,
    /// The mean share of time the node's shards spent running tasks.
    pub busy_ratio: f64,
    /// Bytes of segment files the node's partitions hold.
    pub disk_bytes: u64,
    /// Partitions (of every stream) the node's shards own.
    pub partitions_owned: u32,
    pub shards: u16,
}

impl LoadSummary {
    /// The node's load from every shard's stats.
    pub fn of(stats: &[ShardStats]) -> LoadSummary {
        let shards = stats.len().max(1) as f64;
        LoadSummary {
            events_per_s: stats.iter().map(|shard| shard.counters.load_events_per_s).sum(),
            bytes_per_s: stats.iter().map(|shard| shard.counters.load_bytes_per_s).sum(),
            busy_ratio: stats.iter().map(|shard| shard.counters.busy_ratio).sum::<f64>() / shards,
            disk_bytes: stats.iter().map(|shard| shard.counters.disk_bytes).sum(),
            partitions_owned: stats.iter().map(|shard| shard.counters.partitions_owned as u32).sum(),
            shards: u16::try_from(stats.len()).unwrap_or(u16::MAX),
        }
    }

    /// The summary as it is worth gossiping: rates to whole units, the busy
    /// ratio to a percent, disk to KiB. A node whose rounded load did not
    /// change has nothing new to say (an idle cluster stays quiet).
    pub fn rounded(self) -> LoadSummary {
        LoadSummary {
            events_per_s: self.events_per_s.round(),
            bytes_per_s: self.bytes_per_s.round(),
            busy_ratio: (self.busy_ratio * 100.0).round() / 100.0,
            disk_bytes: self.disk_bytes / 1024 * 1024,
            ..self
        }
    }
}

/// A broadcast's version: later starts, incarnations and sequences win.
pub type LoadVersion = (u64, u64, u64);

/// What one member gossips about itself.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadBroadcast {
    pub node_id: NodeId,
    pub version: LoadVersion,
    /// Set in the broadcast a node sends as it leaves (SIGTERM): the others
    /// then tell "left" from "down".
    pub leaving: bool,
    pub load: LoadSummary,
}

impl LoadBroadcast {
    /// Most bytes an encoded broadcast takes (postcard: varints, two f64 +
    /// one f64, a u128 id); checked by a test.
    pub const ENCODED_BYTES_MAX: usize = 96;

    pub fn encode(&self) -> Vec<u8> {
        // Serializing plain numbers into a Vec cannot fail.
        postcard::to_allocvec(self).unwrap_or_default()
    }
}

/// The key foca files a broadcast under: a newer one of a node replaces
/// the one queued.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadKey {
    node_id: NodeId,
}

impl foca::Invalidates for LoadKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.node_id == other.node_id
    }
}

/// A node's latest broadcast and when it arrived (on the membership's clock).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadEntry {
    pub broadcast: LoadBroadcast,
    pub received_at: Duration,
}

/// The latest load of every node heard from, shared by the membership and
/// the broadcast handler foca owns (both on the cluster thread).
#[derive(Default)]
pub struct LoadTable {
    entries: HashMap<NodeId, LoadEntry>,
    /// The membership's clock, set before each call into foca.
    pub now: Duration,
    /// Broadcasts dropped because the table was full of other nodes.
    pub dropped_full: u64,
}

impl LoadTable {
    pub fn get(&self, node_id: NodeId) -> Option<&LoadEntry> {
        self.entries.get(&node_id)
    }

    /// Keeps `broadcast` if it is newer than the node's entry; whether it was.
    pub fn offer(&mut self, broadcast: LoadBroadcast) -> bool {
        if let Some(entry) = self.entries.get(&broadcast.node_id)
            && entry.broadcast.version >= broadcast.version
        {
            return false;
        }
        if self.entries.len() >= MEMBERS_MAX && !self.entries.contains_key(&broadcast.node_id) {
            self.dropped_full += 1;
            return false;
        }
        self.entries.insert(broadcast.node_id, LoadEntry { broadcast, received_at: self.now });
        true
    }

    /// Forgets the nodes `keep` says no: foca no longer knows them.
    pub fn retain(&mut self, keep: impl Fn(NodeId) -> bool) {
        self.entries.retain(|node_id, _| keep(*node_id));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A broadcast that does not decode: foca drops the rest of its packet.
#[derive(Debug)]
pub struct LoadDecodeError(postcard::Error);

impl std::fmt::Display for LoadDecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "undecodable load broadcast: {}", self.0)
    }
}

impl std::error::Error for LoadDecodeError {}

/// foca's side of the load broadcasts: decodes and files them.
pub struct LoadHandler {
    pub table: Rc<RefCell<LoadTable>>,
}

impl<T> foca::BroadcastHandler<T> for LoadHandler {
    type Key = LoadKey;
    type Error = LoadDecodeError;

    fn receive_item(&mut self, data: &[u8], _sender: Option<&T>) -> Result<Option<LoadKey>, LoadDecodeError> {
        let broadcast: LoadBroadcast = postcard::from_bytes(data).map_err(LoadDecodeError)?;
        let fresh = self.table.borrow_mut().offer(broadcast);
        Ok(fresh.then_some(LoadKey { node_id: broadcast.node_id }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn broadcast(node: u128, version: LoadVersion, events_per_s: f64) -> LoadBroadcast {
        let load = LoadSummary { events_per_s, ..Default::default() };
        LoadBroadcast { node_id: NodeId(node), version, leaving: false, load }
    }

    /// Only a newer broadcast of a node replaces its entry; older and equal
    /// ones are neither kept nor passed on.
    #[test]
    fn only_newer_broadcasts_are_kept() {
        let mut table = LoadTable::default();
        assert!(table.offer(broadcast(1, (10, 1, 5), 100.0)));
        assert!(!table.offer(broadcast(1, (10, 1, 5), 200.0)), "a duplicate");
        assert!(!table.offer(broadcast(1, (10, 1, 4), 300.0)), "an older sequence");
        assert!(table.offer(broadcast(1, (20, 2, 0), 400.0)), "a restart starts its sequence again");
        assert_eq!(table.get(NodeId(1)).unwrap().broadcast.load.events_per_s, 400.0);
    }

    /// The table holds at most MEMBERS_MAX nodes; past that, new nodes'
    /// broadcasts are dropped and counted while known nodes still update.
    #[test]
    fn the_table_is_bounded() {
        let mut table = LoadTable::default();
        for node in 0..MEMBERS_MAX as u128 {
            assert!(table.offer(broadcast(node, (1, 1, 1), 1.0)));
        }
        assert!(!table.offer(broadcast(u128::MAX, (1, 1, 1), 1.0)));
        assert_eq!((table.len(), table.dropped_full), (MEMBERS_MAX, 1));
        assert!(table.offer(broadcast(0, (1, 1, 2), 2.0)));
    }

    /// Broadcasts round-trip through their encoding within the size budget,
    /// and garbage is an error, not a panic.
    #[test]
    fn broadcasts_round_trip_and_garbage_is_refused() {
        let mut handler = LoadHandler { table: Rc::default() };
        let load = LoadSummary {
            events_per_s: 1e12,
            bytes_per_s: 1e15,
            busy_ratio: 1.0,
            disk_bytes: u64::MAX,
            partitions_owned: u32::MAX,
            shards: u16::MAX,
        };
        let big =
            LoadBroadcast { node_id: NodeId(u128::MAX), version: (u64::MAX, u64::MAX, u64::MAX), leaving: true, load };
        let bytes = big.encode();
        assert!(bytes.len() <= LoadBroadcast::ENCODED_BYTES_MAX, "{} bytes", bytes.len());
        let key = foca::BroadcastHandler::<()>::receive_item(&mut handler, &bytes, None).unwrap();
        assert_eq!(key, Some(LoadKey { node_id: NodeId(u128::MAX) }));
        assert_eq!(handler.table.borrow().get(NodeId(u128::MAX)).unwrap().broadcast, big);
        for garbage in [&b""[..], b"\xff", &bytes[..bytes.len() - 3]] {
            assert!(foca::BroadcastHandler::<()>::receive_item(&mut handler, garbage, None).is_err());
        }
    }
}
