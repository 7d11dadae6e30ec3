//! Where a node keeps the Raft state of all its groups: one [`LogStore`]
//! per node (later: per shard), so a single [`LogStore::sync`] makes every
//! group's new entries and hard state durable at once, the way the shard
//! write-ahead log makes one fdatasync cover every partition it touches.
//!
//! Writes are buffered until `sync`; reads see them at once (as a page
//! cache would). raft-rs reads a group through [`GroupStorage`], a handle on
//! the node's store that implements [`raft::Storage`].
//!
//! [`MemoryLogStore`] is the store until the shard WAL implements the trait.
//! With durability tracking on, it is also the simulator's disk: it keeps
//! the synced state apart, and [`MemoryLogStore::crash`] throws away every
//! write since the last sync, as a power cut would.
//!
//! A group's log is compacted ([`LogStore::compact`]) once its entries are
//! applied and their records durable in the partition's own log: the
//! entries up to a point are dropped and the point ([`Compacted`]: index,
//! term, configuration and the partition offset after it) is kept. A peer
//! that needs a dropped entry gets a Raft snapshot instead, of the newest
//! applied entry ([`GroupLog::snapshot_point`], via [`GroupStorage`]'s
//! `snapshot`), installed with [`LogStore::restore`]; the partition's
//! records before it come from a peer's partition log
//! ([`crate::replication::catchup`]).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

use crate::replication::GroupId;

/// Where a group's log was compacted: every entry up to `index` is gone.
/// It is also what a snapshot of the group says (raft-rs's metadata, and
/// the partition offset in its data).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Compacted {
    pub index: u64,
    /// The term of the entry at `index`.
    pub term: u64,
    /// The configuration as of `index`.
    pub conf_state: ConfState,
    /// The partition offset the records of the entry after `index` start
    /// at: how many records the entries up to `index` hold.
    pub offset: u64,
}

impl Compacted {
    /// The compaction point a snapshot describes (its data: the offset,
    /// `u64` little-endian; a snapshot without it counts as offset 0).
    pub fn of_snapshot(snapshot: &Snapshot) -> Compacted {
        let metadata = snapshot.get_metadata();
        let offset = snapshot.data.get(..8).and_then(|bytes| bytes.try_into().ok()).map_or(0, u64::from_le_bytes);
        Compacted { index: metadata.index, term: metadata.term, conf_state: metadata.get_conf_state().clone(), offset }
    }

    /// The snapshot that describes this compaction point.
    pub fn to_snapshot(&self) -> Snapshot {
        let mut snapshot = Snapshot { data: self.offset.to_le_bytes().to_vec().into(), ..Snapshot::default() };
        let metadata = snapshot.mut_metadata();
        metadata.index = self.index;
        metadata.term = self.term;
        metadata.set_conf_state(self.conf_state.clone());
        snapshot
    }
}

/// A group's persistent Raft state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GroupLog {
    /// Entries after the compaction point:
    /// `entries[i].index == compacted.index + 1 + i`.
    pub entries: Vec<Entry>,
    pub hard_state: HardState,
    /// The configuration as of `applied`, written with it.
    pub conf_state: ConfState,
    pub applied: u64,
    /// The index of the last configuration change applied: the log may be
    /// compacted only at or past it, so `conf_state` is the configuration
    /// as of the compaction point.
    pub conf_index: u64,
    pub compacted: Compacted,
}

impl GroupLog {
    pub fn first_index(&self) -> u64 {
        self.compacted.index + 1
    }

    pub fn last_index(&self) -> u64 {
        self.compacted.index + self.entries.len() as u64
    }

    pub fn entry(&self, index: u64) -> Option<&Entry> {
        index.checked_sub(self.first_index()).and_then(|position| self.entries.get(usize::try_from(position).ok()?))
    }

    /// The point a snapshot describes: the last applied entry (at or past
    /// the compaction point), with the configuration as of it and the
    /// partition offset after it. Not the compaction point itself: its
    /// configuration may predate a replica added since (a learner that
    /// replaces one removed while it was down), and raft-rs refuses a
    /// snapshot whose configuration lacks its recipient, so that replica
    /// would wait until the next compaction, which may never come on an
    /// idle group. The entries between the two points are still here, so
    /// their term and record counts are known.
    pub fn snapshot_point(&self) -> Compacted {
        let index = self.applied.min(self.last_index());
        let Some(term) = self.entry(index).map(|entry| entry.term).filter(|_| index >= self.conf_index) else {
            return self.compacted.clone();
        };
        let records: u64 = self
            .entries
            .iter()
            .take_while(|entry| entry.index <= index)
            .filter(|entry| entry.get_entry_type() == raft::eraftpb::EntryType::EntryNormal)
            .filter_map(|entry| crate::replication::frame::decode_proposal(&entry.data).ok())
            .map(|(header, _)| u64::from(header.record_count))
            .sum();
        Compacted { index, term, conf_state: self.conf_state.clone(), offset: self.compacted.offset + records }
    }

    /// Bytes of entry data from `index` on (all of them from index 0).
    pub fn data_bytes_from(&self, index: u64) -> u64 {
        let skip = usize::try_from(index.saturating_sub(self.first_index())).unwrap_or(usize::MAX);
        self.entries.iter().skip(skip).map(|entry| entry.data.len() as u64).sum()
    }

    /// Bytes of entry data up to and including `index` (what a compaction
    /// to it drops): walks those entries only.
    pub fn data_bytes_through(&self, index: u64) -> u64 {
        let take = usize::try_from((index + 1).saturating_sub(self.first_index())).unwrap_or(usize::MAX);
        self.entries.iter().take(take).map(|entry| entry.data.len() as u64).sum()
    }

    /// Appends `entries`, first cutting off any suffix they replace.
    fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        let keep = usize::try_from(first.index.saturating_sub(self.first_index())).unwrap_or(usize::MAX);
        self.entries.truncate(keep);
        let skip = usize::try_from(self.first_index().saturating_sub(first.index)).unwrap_or(usize::MAX);
        self.entries.extend_from_slice(entries.get(skip..).unwrap_or_default());
    }

    /// Drops the entries up to `compacted.index` (never past the last).
    fn compact(&mut self, compacted: Compacted) {
        if compacted.index <= self.compacted.index || compacted.index > self.last_index() {
            return;
        }
        let drop = usize::try_from(compacted.index - self.compacted.index).unwrap_or(usize::MAX);
        self.entries.drain(..drop.min(self.entries.len()));
        self.compacted = compacted;
    }

    /// Installs a snapshot: the log restarts after its point, as applied.
    fn restore(&mut self, compacted: Compacted) {
        self.entries.clear();
        self.hard_state.commit = self.hard_state.commit.max(compacted.index);
        self.conf_state = compacted.conf_state.clone();
        self.applied = compacted.index;
        self.conf_index = compacted.index;
        self.compacted = compacted;
    }
}

/// One write to a node's store.
#[derive(Clone, Debug)]
enum Write {
    Create(Box<GroupLog>),
    Append(Vec<Entry>),
    HardState(HardState),
    Commit(u64),
    Applied { applied: u64, conf_state: Option<ConfState> },
    Compact(Compacted),
    Restore(Compacted),
    Remove,
}

fn apply_write(groups: &mut BTreeMap<GroupId, GroupLog>, group: GroupId, write: Write) {
    if let Write::Create(log) = write {
        groups.insert(group, *log);
        return;
    }
    if let Write::Remove = write {
        groups.remove(&group);
        return;
    }
    let Some(log) = groups.get_mut(&group) else { return };
    match write {
        Write::Append(entries) => log.append(&entries),
        Write::HardState(hard_state) => log.hard_state = hard_state,
        Write::Commit(commit) => log.hard_state.commit = commit,
        Write::Applied { applied, conf_state } => {
            log.applied = applied;
            if let Some(conf_state) = conf_state {
                log.conf_state = conf_state;
                log.conf_index = applied;
            }
        }
        Write::Compact(compacted) => log.compact(compacted),
        Write::Restore(compacted) => log.restore(compacted),
        Write::Create(_) | Write::Remove => {}
    }
}

/// A node's store of every group's Raft log and state. The shard WAL will
/// implement it: writes append WAL records, `sync` is the group commit's
/// one fdatasync, reads come from the segments and the tail cache.
pub trait LogStore {
    /// The groups the store holds (a restarting node recreates them).
    fn groups(&self) -> Vec<GroupId>;
    fn log(&self, group: GroupId) -> Option<&GroupLog>;
    fn create(&mut self, group: GroupId, log: GroupLog);
    fn append(&mut self, group: GroupId, entries: &[Entry]);
    fn set_hard_state(&mut self, group: GroupId, hard_state: &HardState);
    fn set_commit(&mut self, group: GroupId, commit: u64);
    /// Records what the node applied, with the configuration as of it
    /// when a configuration change was applied.
    fn set_applied(&mut self, group: GroupId, applied: u64, conf_state: Option<&ConfState>);
    /// Drops the entries up to `compacted.index`: they are applied and
    /// their records durable in the partition's log.
    fn compact(&mut self, group: GroupId, compacted: Compacted);
    /// Installs a snapshot from the leader: every entry goes, the log
    /// restarts after `compacted.index`, applied up to it.
    fn restore(&mut self, group: GroupId, compacted: Compacted);
    fn remove(&mut self, group: GroupId);
    /// Makes every write so far durable: one fsync for all groups.
    fn sync(&mut self);
}

/// The in-memory store; with durability tracking, the simulated disk.
#[derive(Debug, Default)]
pub struct MemoryLogStore {
    current: BTreeMap<GroupId, GroupLog>,
    /// The synced state, kept only when durability is tracked.
    durable: Option<BTreeMap<GroupId, GroupLog>>,
    unsynced: Vec<(GroupId, Write)>,
    pub syncs: u64,
}

impl MemoryLogStore {
    pub fn new() -> MemoryLogStore {
        MemoryLogStore::default()
    }

    /// A store that remembers what is synced, so [`crash`](Self::crash) can
    /// lose the rest.
    pub fn with_durability() -> MemoryLogStore {
        MemoryLogStore { durable: Some(BTreeMap::new()), ..MemoryLogStore::default() }
    }

    /// A power cut: every write since the last sync is gone.
    pub fn crash(&mut self) {
        self.unsynced.clear();
        if let Some(durable) = &self.durable {
            self.current = durable.clone();
        }
    }

    fn write(&mut self, group: GroupId, write: Write) {
        if self.durable.is_some() {
            self.unsynced.push((group, write.clone()));
        }
        apply_write(&mut self.current, group, write);
    }
}

impl LogStore for MemoryLogStore {
    fn groups(&self) -> Vec<GroupId> {
        self.current.keys().copied().collect()
    }

    fn log(&self, group: GroupId) -> Option<&GroupLog> {
        self.current.get(&group)
    }

    fn create(&mut self, group: GroupId, log: GroupLog) {
        self.write(group, Write::Create(Box::new(log)));
    }

    fn append(&mut self, group: GroupId, entries: &[Entry]) {
        if !entries.is_empty() {
            self.write(group, Write::Append(entries.to_vec()));
        }
    }

    fn set_hard_state(&mut self, group: GroupId, hard_state: &HardState) {
        self.write(group, Write::HardState(hard_state.clone()));
    }

    fn set_commit(&mut self, group: GroupId, commit: u64) {
        self.write(group, Write::Commit(commit));
    }

    fn set_applied(&mut self, group: GroupId, applied: u64, conf_state: Option<&ConfState>) {
        self.write(group, Write::Applied { applied, conf_state: conf_state.cloned() });
    }

    fn compact(&mut self, group: GroupId, compacted: Compacted) {
        self.write(group, Write::Compact(compacted));
    }

    fn restore(&mut self, group: GroupId, compacted: Compacted) {
        self.write(group, Write::Restore(compacted));
    }

    fn remove(&mut self, group: GroupId) {
        self.write(group, Write::Remove);
    }

    fn sync(&mut self) {
        self.syncs += 1;
        if let Some(durable) = &mut self.durable {
            for (group, write) in self.unsynced.drain(..) {
                apply_write(durable, group, write);
            }
        }
    }
}

/// One group's view of its node's store, as raft-rs reads it.
pub struct GroupStorage<S: LogStore> {
    pub store: Rc<RefCell<S>>,
    pub group: GroupId,
}

fn unavailable() -> raft::Error {
    raft::Error::Store(StorageError::Unavailable)
}

impl<S: LogStore> raft::Storage for GroupStorage<S> {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let store = self.store.borrow();
        let log = store.log(self.group).ok_or_else(unavailable)?;
        Ok(RaftState { hard_state: log.hard_state.clone(), conf_state: log.conf_state.clone() })
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let store = self.store.borrow();
        let log = store.log(self.group).ok_or_else(unavailable)?;
        if low < log.first_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > log.last_index() + 1 || low > high {
            return Err(unavailable());
        }
        let first = log.first_index();
        let range = usize::try_from(low - first).map_err(|_| unavailable())?
            ..usize::try_from(high - first).map_err(|_| unavailable())?;
        let mut entries = log.entries[range].to_vec();
        raft::util::limit_size(&mut entries, max_size.into());
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        let store = self.store.borrow();
        let log = store.log(self.group).ok_or_else(unavailable)?;
        if index == log.compacted.index {
            return Ok(log.compacted.term);
        }
        if index < log.compacted.index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        log.entry(index).map(|entry| entry.term).ok_or_else(unavailable)
    }

    fn first_index(&self) -> raft::Result<u64> {
        let store = self.store.borrow();
        Ok(store.log(self.group).map_or(1, GroupLog::first_index))
    }

    fn last_index(&self) -> raft::Result<u64> {
        let store = self.store.borrow();
        Ok(store.log(self.group).map_or(0, GroupLog::last_index))
    }

    /// The newest applied point ([`GroupLog::snapshot_point`]): raft-rs
    /// asks only for a peer that needs an entry before the compaction point
    /// (the partition's records come apart, module doc).
    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let store = self.store.borrow();
        let log = store.log(self.group).ok_or_else(unavailable)?;
        let point = log.snapshot_point();
        if log.compacted.index == 0 || point.index < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(point.to_snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, ..Entry::default() }
    }

    /// A snapshot describes the last applied entry, not the compaction
    /// point: the newest applied configuration (a learner added since is
    /// in it, or raft-rs on the learner refuses the snapshot) and the
    /// partition offset after the records of the entries in between.
    #[test]
    fn a_snapshot_describes_the_last_applied_entry() {
        use crate::replication::frame::{ProposalHeader, encode_proposal};
        let proposal = |index, term, record_count| {
            let header = ProposalHeader { source_node: 1, source_sequence: index, record_count };
            Entry { index, term, data: encode_proposal(header, &[b"records"]).into(), ..Entry::default() }
        };
        let voters = ConfState { voters: vec![1, 2], ..ConfState::default() };
        let mut log = GroupLog {
            compacted: Compacted { index: 10, term: 2, conf_state: voters.clone(), offset: 100 },
            entries: vec![proposal(11, 2, 3), entry(12, 3), proposal(13, 3, 4), proposal(14, 3, 5)],
            ..GroupLog::default()
        };
        let with_learner = ConfState { voters: vec![1, 2], learners: vec![3], ..ConfState::default() };
        (log.applied, log.conf_state, log.conf_index) = (13, with_learner.clone(), 12);
        let point = log.snapshot_point();
        assert_eq!((point.index, point.term, point.offset), (13, 3, 107), "{point:?}");
        assert_eq!(point.conf_state, with_learner);
        log.applied = 10;
        assert_eq!(log.snapshot_point(), log.compacted, "nothing applied past the compaction point");
    }

    /// A crash loses exactly the writes after the last sync, for every
    /// group at once; an untracked store has nothing to lose.
    #[test]
    fn a_crash_loses_only_unsynced_writes() {
        let (first, second) = (GroupId { stream_id: 0, partition: 0 }, GroupId { stream_id: 0, partition: 1 });
        let mut store = MemoryLogStore::with_durability();
        for group in [first, second] {
            store.create(group, GroupLog::default());
            store.append(group, &[entry(1, 1), entry(2, 1)]);
        }
        store.sync();
        store.append(first, &[entry(2, 2), entry(3, 2)]);
        store.set_commit(second, 2);
        assert_eq!(store.log(first).map(GroupLog::last_index), Some(3));
        store.crash();
        assert_eq!(store.log(first).map(|log| log.entries.clone()), Some(vec![entry(1, 1), entry(2, 1)]));
        assert_eq!(store.log(second).map(|log| log.hard_state.commit), Some(0));
        assert_eq!(store.syncs, 1);
    }
}
