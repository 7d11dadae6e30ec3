//! [`FileLogStore`]: the node's Raft store on disk, the first durable
//! [`LogStore`] the real node runs on (the shard WAL comes next; the module
//! doc of [`crate::replication`] says how).
//!
//! Every group's log, hard state and applied index live in memory (a
//! [`MemoryLogStore`]) and every change is also a record appended to one
//! file, `<data-dir>/replication/raft.log`. [`LogStore::sync`] writes the
//! records of the round and fdatasyncs the file once, so one sync covers
//! every group of the node, as the host's round requires. A start reads the
//! file back up to its first torn or corrupt record (what a crash left
//! unsynced) and truncates it there.
//!
//! A record: `u32` length of the body, `u32` CRC32C of the body, then the
//! body: `u8` kind, `u32` stream part and `u32` partition of the group, and
//! the kind's payload (protobuf for raft-rs's types).
//!
//! Bounds: the file and the memory grow with the replicated data, since the
//! log is never compacted yet (that needs snapshots that stream segments);
//! [`ENTRY_BYTES_MAX`] caps the entries' bytes, and proposals past it are
//! refused ([`FileLogStore::is_full`]). A failed write or sync ends the
//! process: raft-rs has been told the round is durable, and a node that
//! went on could acknowledge what it lost (PostgreSQL's "fsyncgate").

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState};

use crate::replication::GroupId;
use crate::replication::store::{GroupLog, LogStore, MemoryLogStore};
use crate::runtime::log;

/// Most bytes of entry data the store holds (every group's, memory and
/// file alike) before it refuses proposals: 256 MiB.
pub const ENTRY_BYTES_MAX: u64 = 256 << 20;
/// The store's directory under the data directory.
pub const REPLICATION_DIR_NAME: &str = "replication";
const LOG_FILE_NAME: &str = "raft.log";
/// A body longer than this is corruption (an entry is at most a proposal
/// of a batch's records; raft-rs's own messages are smaller).
const RECORD_BYTES_MAX: usize = 64 << 20;

const KIND_CREATE: u8 = 1;
const KIND_APPEND: u8 = 2;
const KIND_HARD_STATE: u8 = 3;
const KIND_COMMIT: u8 = 4;
const KIND_APPLIED: u8 = 5;
const KIND_REMOVE: u8 = 6;

/// The node's Raft store: memory, plus a log file when storage is on disk.
pub struct FileLogStore {
    memory: MemoryLogStore,
    file: Option<File>,
    path: Option<PathBuf>,
    /// Records of this round, written and synced by [`LogStore::sync`].
    pending: Vec<u8>,
    entry_bytes: u64,
    pub syncs: u64,
}

impl FileLogStore {
    /// A store in memory only (`--storage memory`: the node keeps no event
    /// across a restart, and takes a fresh identity anyway).
    pub fn in_memory() -> FileLogStore {
        FileLogStore {
            memory: MemoryLogStore::new(),
            file: None,
            path: None,
            pending: Vec::new(),
            entry_bytes: 0,
            syncs: 0,
        }
    }

    /// Opens (or creates) the store under `data_dir`, reading back every
    /// group it holds.
    pub fn open(data_dir: &Path) -> std::io::Result<FileLogStore> {
        let dir = data_dir.join(REPLICATION_DIR_NAME);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(LOG_FILE_NAME);
        let mut file = std::fs::OpenOptions::new().read(true).append(true).create(true).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let mut store = FileLogStore { path: Some(path.clone()), ..FileLogStore::in_memory() };
        let valid = store.replay(&bytes);
        if valid < bytes.len() {
            log::warn!(
                "replication: {} ends with {} bytes of a record cut short or corrupt (a crash before its sync); \
                 dropped",
                path.display(),
                bytes.len() - valid
            );
            file.set_len(valid as u64)?;
            file.sync_all()?;
        }
        store.file = Some(file);
        Ok(store)
    }

    /// Whether the entries reached [`ENTRY_BYTES_MAX`].
    pub fn is_full(&self) -> bool {
        self.entry_bytes >= ENTRY_BYTES_MAX
    }

    pub fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    /// Applies the valid records of `bytes`; returns where they end.
    fn replay(&mut self, bytes: &[u8]) -> usize {
        let mut position = 0;
        while let Some((body, used)) = next_record(&bytes[position..]) {
            if self.apply_record(body).is_none() {
                break;
            }
            position += used;
        }
        position
    }

    fn apply_record(&mut self, body: &[u8]) -> Option<()> {
        let (&kind, rest) = body.split_first()?;
        let group = GroupId {
            stream_id: u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?),
            partition: u32::from_le_bytes(rest.get(4..8)?.try_into().ok()?),
        };
        let payload = rest.get(8..)?;
        match kind {
            KIND_CREATE => self.memory.create(group, GroupLog::default()),
            KIND_APPEND => {
                let entries = decode_entries(payload)?;
                self.entry_bytes += entries.iter().map(|entry| entry.data.len() as u64).sum::<u64>();
                self.memory.append(group, &entries);
            }
            KIND_HARD_STATE => self.memory.set_hard_state(group, &HardState::parse_from_bytes(payload).ok()?),
            KIND_COMMIT => self.memory.set_commit(group, u64::from_le_bytes(payload.get(..8)?.try_into().ok()?)),
            KIND_APPLIED => {
                let applied = u64::from_le_bytes(payload.get(..8)?.try_into().ok()?);
                let conf_state = match payload.get(8..)? {
                    [] => None,
                    bytes => Some(ConfState::parse_from_bytes(bytes).ok()?),
                };
                self.memory.set_applied(group, applied, conf_state.as_ref());
            }
            KIND_REMOVE => self.memory.remove(group),
            _ => return None,
        }
        Some(())
    }

    /// Queues a record for the next sync (nothing for a memory store).
    fn record(&mut self, kind: u8, group: GroupId, payload: impl FnOnce(&mut Vec<u8>)) {
        if self.path.is_none() {
            return;
        }
        let start = self.pending.len();
        self.pending.extend_from_slice(&[0; 8]);
        self.pending.push(kind);
        self.pending.extend_from_slice(&group.stream_id.to_le_bytes());
        self.pending.extend_from_slice(&group.partition.to_le_bytes());
        payload(&mut self.pending);
        let body_bytes = self.pending.len() - start - 8;
        let crc = crc32c::crc32c(&self.pending[start + 8..]);
        self.pending[start..start + 4].copy_from_slice(&(body_bytes as u32).to_le_bytes());
        self.pending[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    fn write_pending(&mut self) -> std::io::Result<()> {
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        file.write_all(&self.pending)?;
        file.sync_data()?;
        self.pending.clear();
        Ok(())
    }
}

/// The body of the record at the start of `bytes` and the bytes it takes,
/// or `None` when it is cut short or its checksum fails.
fn next_record(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let body_bytes = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    if body_bytes > RECORD_BYTES_MAX {
        return None;
    }
    let body = bytes.get(8..8 + body_bytes)?;
    (crc32c::crc32c(body) == crc).then_some((body, 8 + body_bytes))
}

fn encode_entries(out: &mut Vec<u8>, entries: &[Entry]) {
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for entry in entries {
        let encoded = entry.write_to_bytes().unwrap_or_default();
        out.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
        out.extend_from_slice(&encoded);
    }
}

fn decode_entries(mut bytes: &[u8]) -> Option<Vec<Entry>> {
    let count = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    bytes = &bytes[4..];
    let mut entries = Vec::with_capacity(count.min(bytes.len() / 4));
    for _ in 0..count {
        let length = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        entries.push(Entry::parse_from_bytes(bytes.get(4..4 + length)?).ok()?);
        bytes = &bytes[4 + length..];
    }
    bytes.is_empty().then_some(entries)
}

impl LogStore for FileLogStore {
    fn groups(&self) -> Vec<GroupId> {
        self.memory.groups()
    }

    fn log(&self, group: GroupId) -> Option<&GroupLog> {
        self.memory.log(group)
    }

    /// A group's first state: written as its parts (create, entries, hard
    /// state, applied with the configuration), so replay needs no other kind.
    fn create(&mut self, group: GroupId, log: GroupLog) {
        self.record(KIND_CREATE, group, |_| {});
        self.memory.create(group, GroupLog::default());
        self.append(group, &log.entries);
        self.set_hard_state(group, &log.hard_state);
        self.set_applied(group, log.applied, Some(&log.conf_state));
    }

    fn append(&mut self, group: GroupId, entries: &[Entry]) {
        if entries.is_empty() {
            return;
        }
        self.entry_bytes += entries.iter().map(|entry| entry.data.len() as u64).sum::<u64>();
        self.record(KIND_APPEND, group, |out| encode_entries(out, entries));
        self.memory.append(group, entries);
    }

    fn set_hard_state(&mut self, group: GroupId, hard_state: &HardState) {
        self.record(KIND_HARD_STATE, group, |out| {
            out.extend_from_slice(&hard_state.write_to_bytes().unwrap_or_default())
        });
        self.memory.set_hard_state(group, hard_state);
    }

    fn set_commit(&mut self, group: GroupId, commit: u64) {
        self.record(KIND_COMMIT, group, |out| out.extend_from_slice(&commit.to_le_bytes()));
        self.memory.set_commit(group, commit);
    }

    fn set_applied(&mut self, group: GroupId, applied: u64, conf_state: Option<&ConfState>) {
        self.record(KIND_APPLIED, group, |out| {
            out.extend_from_slice(&applied.to_le_bytes());
            if let Some(conf_state) = conf_state {
                out.extend_from_slice(&conf_state.write_to_bytes().unwrap_or_default());
            }
        });
        self.memory.set_applied(group, applied, conf_state);
    }

    fn remove(&mut self, group: GroupId) {
        self.record(KIND_REMOVE, group, |_| {});
        self.memory.remove(group);
    }

    fn sync(&mut self) {
        self.syncs += 1;
        if self.pending.is_empty() {
            return;
        }
        if let Err(error) = self.write_pending() {
            let path = self.path.as_deref().map(Path::display);
            log::error!(
                "replication: writing the Raft log {path:?} failed ({error}); stopping, as it may have lost what it acknowledged"
            );
            std::process::exit(70);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry { index, term, data: data.to_vec().into(), ..Entry::default() }
    }

    /// What was synced comes back after a reopen, including an overwritten
    /// suffix, a removed group and the applied configuration; a torn tail
    /// (a crash mid-write) is dropped and the file stays appendable.
    #[test]
    fn synced_state_comes_back_and_a_torn_tail_is_dropped() {
        let dir = std::env::temp_dir().join(format!("spate-raft-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (first, second) = (GroupId { stream_id: 9, partition: 0 }, GroupId { stream_id: 9, partition: 1 });
        {
            let mut store = FileLogStore::open(&dir).unwrap();
            let mut log = GroupLog::default();
            log.entries.push(entry(1, 1, b"conf"));
            log.conf_state.voters = vec![1, 2, 3];
            log.applied = 1;
            store.create(first, log);
            store.append(first, &[entry(2, 1, b"a"), entry(3, 1, b"b")]);
            store.append(first, &[entry(3, 2, b"c")]);
            store.set_hard_state(first, &HardState { term: 2, vote: 1, commit: 3, ..HardState::default() });
            store.create(second, GroupLog::default());
            store.remove(second);
            store.sync();
            store.set_commit(first, 9); // never synced
        }
        let path = dir.join(REPLICATION_DIR_NAME).join(LOG_FILE_NAME);
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(&[40, 0, 0, 0, 1, 2]).unwrap(); // a torn record
        drop(file);
        let mut store = FileLogStore::open(&dir).unwrap();
        let log = store.log(first).expect("the group is back").clone();
        assert_eq!(
            log.entries.iter().map(|entry| entry.data.to_vec()).collect::<Vec<_>>(),
            [b"conf".to_vec(), b"a".to_vec(), b"c".to_vec()]
        );
        assert_eq!((log.hard_state.term, log.hard_state.commit, log.applied), (2, 3, 1));
        assert_eq!(log.conf_state.voters, [1, 2, 3]);
        assert!(store.log(second).is_none());
        store.set_commit(first, 3);
        store.sync();
        drop(store);
        assert_eq!(FileLogStore::open(&dir).unwrap().log(first).map(|log| log.hard_state.commit), Some(3));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
