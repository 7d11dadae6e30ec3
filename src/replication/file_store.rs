//! [`FileLogStore`]: the node's Raft store on disk, the first durable
//! [`LogStore`] the real node runs on (the shard WAL comes next; the module
//! doc of [`crate::replication`] says how).
//!
//! Every group's log, hard state and applied index live in memory (a
//! [`MemoryLogStore`]) and every change is also a record appended to one
//! file, `<data-dir>/replication/raft.log`. [`LogStore::sync`] writes the
//! records of the round and fdatasyncs the file once, so one sync covers
//! every group of the node, as the host's round requires (the cluster
//! thread takes that write as a [`SyncJob`] and runs it on a blocking
//! thread, [`FileLogStore::take_sync_job`]). A start reads the
//! file back up to its first torn or corrupt record (what a crash left
//! unsynced) and truncates it there.
//!
//! A record: `u32` length of the body, `u32` CRC32C of the body, then the
//! body: `u8` kind, `u32` stream part and `u32` partition of the group, and
//! the kind's payload (protobuf for raft-rs's types).
//!
//! Compaction: a group's log is compacted once its entries are applied and
//! their records durable in the partition's log (the node decides when,
//! [`crate::replication::node`]); the store drops them from memory and
//! appends a compaction record. The file would still grow forever, so it
//! is *rewritten*: when it passes [`FileLogStore::rewrite_threshold_bytes`]
//! (the larger of half the entry bound and 4x the live entries), the live
//! state of every group (compaction point, entries past it, hard state,
//! applied index and configuration) is written to `raft.log.new`, synced,
//! and renamed over `raft.log` (the directory synced too), so a crash at
//! any point leaves one complete file. Each rewrite writes at most a
//! quarter of what was appended since the last, so rewriting adds at most
//! 25 % to the store's writes, and the file stays below 4x the live entries
//! (at most 4x the entry bound, 1 GiB by default). One file rewritten by
//! rename was chosen over numbered files deleted once compacted: a group
//! that goes quiet would pin every numbered file after its last entry,
//! while a rewrite carries its few live entries forward.
//!
//! Bounds: the entries' bytes (every group's, memory and file alike) are
//! capped by the entry bound (`--raft-log-bytes-max`, default
//! [`ENTRY_BYTES_MAX`]), and proposals past it are refused
//! ([`FileLogStore::is_full`]) until compaction makes room. A failed write
//! or sync ends the process: raft-rs has been told the round is durable,
//! and a node that went on could acknowledge what it lost (PostgreSQL's
//! "fsyncgate").

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState};

use crate::replication::GroupId;
use crate::replication::store::{Compacted, GroupLog, LogStore, MemoryLogStore};
use crate::runtime::log;

/// Most bytes of entry data the store holds (every group's, memory and
/// file alike) before it refuses proposals: 256 MiB.
pub const ENTRY_BYTES_MAX: u64 = 256 << 20;
/// The store's directory under the data directory.
pub const REPLICATION_DIR_NAME: &str = "replication";
const LOG_FILE_NAME: &str = "raft.log";
const REWRITE_FILE_NAME: &str = "raft.log.new";
/// A body longer than this is corruption (an entry is at most a proposal
/// of a batch's records; raft-rs's own messages are smaller).
const RECORD_BYTES_MAX: usize = 64 << 20;

const KIND_CREATE: u8 = 1;
const KIND_APPEND: u8 = 2;
const KIND_HARD_STATE: u8 = 3;
const KIND_COMMIT: u8 = 4;
const KIND_APPLIED: u8 = 5;
const KIND_REMOVE: u8 = 6;
const KIND_COMPACT: u8 = 7;
const KIND_RESTORE: u8 = 8;

/// One round's records to append to the log file and fdatasync, on a
/// thread that may block ([`FileLogStore::take_sync_job`]).
pub struct SyncJob {
    file: std::io::Result<File>,
    bytes: Vec<u8>,
}

impl SyncJob {
    /// Bytes it writes.
    pub fn bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Appends the records (the file is in append mode) and syncs them.
    pub fn run(self) -> std::io::Result<()> {
        let mut file = self.file?;
        file.write_all(&self.bytes)?;
        file.sync_data()
    }
}

/// The node's Raft store: memory, plus a log file when storage is on disk.
pub struct FileLogStore {
    memory: MemoryLogStore,
    file: Option<File>,
    path: Option<PathBuf>,
    /// Records of this round, written and synced by [`LogStore::sync`].
    pending: Vec<u8>,
    /// Bytes of entry data held (every group's live entries).
    entry_bytes: u64,
    entry_bytes_max: u64,
    /// Bytes of the file, and of its last rewrite (what was live then).
    file_bytes: u64,
    pub syncs: u64,
    pub rewrites: u64,
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
            entry_bytes_max: ENTRY_BYTES_MAX,
            file_bytes: 0,
            syncs: 0,
            rewrites: 0,
        }
    }

    /// Sets the entry bound (`--raft-log-bytes-max`).
    pub fn with_entry_bytes_max(mut self, entry_bytes_max: u64) -> FileLogStore {
        self.entry_bytes_max = entry_bytes_max.max(1);
        self
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
        store.file_bytes = valid as u64;
        store.entry_bytes = store
            .memory
            .groups()
            .iter()
            .filter_map(|group| store.memory.log(*group))
            .map(|log| log.data_bytes_from(0))
            .sum();
        Ok(store)
    }

    /// Whether the entries reached the entry bound.
    pub fn is_full(&self) -> bool {
        self.entry_bytes >= self.entry_bytes_max
    }

    pub fn entry_bytes_max(&self) -> u64 {
        self.entry_bytes_max
    }

    /// The file size past which [`LogStore::sync`] rewrites it with the
    /// live state only (module doc).
    pub fn rewrite_threshold_bytes(&self) -> u64 {
        (self.entry_bytes_max / 2).max(self.entry_bytes.saturating_mul(4))
    }

    /// Writes the live state of every group to a new file and renames it
    /// over the log (module doc), then appends to the new file.
    fn rewrite(&mut self) -> std::io::Result<()> {
        let Some(path) = self.path.clone() else { return Ok(()) };
        let mut bytes = Vec::new();
        for group in self.memory.groups() {
            let Some(log) = self.memory.log(group).cloned() else { continue };
            self.pending.clear();
            self.record(KIND_CREATE, group, |_| {});
            if log.compacted.index > 0 {
                self.record(KIND_RESTORE, group, |out| encode_compacted(out, &log.compacted));
            }
            if !log.entries.is_empty() {
                self.record(KIND_APPEND, group, |out| encode_entries(out, &log.entries));
            }
            self.record(KIND_HARD_STATE, group, |out| {
                out.extend_from_slice(&log.hard_state.write_to_bytes().unwrap_or_default())
            });
            self.record(KIND_APPLIED, group, |out| {
                out.extend_from_slice(&log.applied.to_le_bytes());
                out.extend_from_slice(&log.conf_state.write_to_bytes().unwrap_or_default());
            });
            bytes.extend_from_slice(&self.pending);
        }
        self.pending.clear();
        let new_path = path.with_file_name(REWRITE_FILE_NAME);
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&new_path)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&new_path, &path)?;
        if let Some(dir) = path.parent() {
            File::open(dir)?.sync_all()?;
        }
        self.file = Some(std::fs::OpenOptions::new().append(true).open(&path)?);
        self.file_bytes = bytes.len() as u64;
        self.rewrites += 1;
        Ok(())
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
            KIND_APPEND => self.memory.append(group, &decode_entries(payload)?),
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
            KIND_COMPACT => self.memory.compact(group, decode_compacted(payload)?),
            KIND_RESTORE => self.memory.restore(group, decode_compacted(payload)?),
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

    /// Takes the records queued for the next sync as a job to run off the
    /// cluster thread ([`SyncJob::run`]), so the thread keeps sending,
    /// receiving and delivering during the fdatasync; `None` when there is
    /// nothing to write or no file (memory). [`FileLogStore::finish_sync`]
    /// must follow before anything else syncs the store.
    pub fn take_sync_job(&mut self) -> Option<SyncJob> {
        if self.pending.is_empty() {
            return None;
        }
        let file = self.file.as_ref()?.try_clone();
        let bytes = std::mem::take(&mut self.pending);
        Some(SyncJob { file, bytes })
    }

    /// Counts a finished [`SyncJob`] (`written` bytes); a failed one ends
    /// the process as a failed [`LogStore::sync`] does.
    pub fn finish_sync(&mut self, written: u64, result: std::io::Result<()>) {
        self.syncs += 1;
        let result = result.and_then(|()| {
            self.file_bytes += written;
            if self.file_bytes > self.rewrite_threshold_bytes() {
                // Whatever was queued meanwhile is in memory: the rewrite
                // carries the live state of every group, those included.
                self.rewrite()?;
            }
            Ok(())
        });
        if let Err(error) = result {
            self.exit_on_failed_write(&error);
        }
    }

    fn exit_on_failed_write(&self, error: &std::io::Error) -> ! {
        let path = self.path.as_deref().map(Path::display);
        log::error!(
            "replication: writing the Raft log {path:?} failed ({error}); stopping, as it may have lost what it acknowledged"
        );
        std::process::exit(70);
    }

    fn write_pending(&mut self) -> std::io::Result<()> {
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        file.write_all(&self.pending)?;
        file.sync_data()?;
        self.file_bytes += self.pending.len() as u64;
        self.pending.clear();
        if self.file_bytes > self.rewrite_threshold_bytes() {
            self.rewrite()?;
        }
        Ok(())
    }

    /// Bytes of entry data of `group` from `index` on.
    fn data_bytes_from(&self, group: GroupId, index: u64) -> u64 {
        self.memory.log(group).map_or(0, |log| log.data_bytes_from(index))
    }
}

fn encode_compacted(out: &mut Vec<u8>, compacted: &Compacted) {
    out.extend_from_slice(&compacted.index.to_le_bytes());
    out.extend_from_slice(&compacted.term.to_le_bytes());
    out.extend_from_slice(&compacted.offset.to_le_bytes());
    out.extend_from_slice(&compacted.conf_state.write_to_bytes().unwrap_or_default());
}

fn decode_compacted(payload: &[u8]) -> Option<Compacted> {
    let u64_at = |at: usize| payload.get(at..at + 8).and_then(|bytes| bytes.try_into().ok()).map(u64::from_le_bytes);
    Some(Compacted {
        index: u64_at(0)?,
        term: u64_at(8)?,
        offset: u64_at(16)?,
        conf_state: ConfState::parse_from_bytes(payload.get(24..)?).ok()?,
    })
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
        let Some(first) = entries.first() else { return };
        let replaced = self.data_bytes_from(group, first.index);
        self.entry_bytes = self.entry_bytes.saturating_sub(replaced);
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

    fn compact(&mut self, group: GroupId, compacted: Compacted) {
        let Some(log) = self.memory.log(group) else { return };
        if compacted.index <= log.compacted.index || compacted.index > log.last_index() {
            return;
        }
        let dropped = log.data_bytes_through(compacted.index);
        self.entry_bytes = self.entry_bytes.saturating_sub(dropped);
        self.record(KIND_COMPACT, group, |out| encode_compacted(out, &compacted));
        self.memory.compact(group, compacted);
    }

    fn restore(&mut self, group: GroupId, compacted: Compacted) {
        self.entry_bytes = self.entry_bytes.saturating_sub(self.data_bytes_from(group, 0));
        self.record(KIND_RESTORE, group, |out| encode_compacted(out, &compacted));
        self.memory.restore(group, compacted);
    }

    fn remove(&mut self, group: GroupId) {
        self.entry_bytes = self.entry_bytes.saturating_sub(self.data_bytes_from(group, 0));
        self.record(KIND_REMOVE, group, |_| {});
        self.memory.remove(group);
    }

    fn sync(&mut self) {
        self.syncs += 1;
        if self.pending.is_empty() {
            return;
        }
        if let Err(error) = self.write_pending() {
            self.exit_on_failed_write(&error);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry { index, term, data: data.to_vec().into(), ..Entry::default() }
    }

    /// A compacted group comes back after a reopen as it was: the entries
    /// past the compaction point, the point itself (index, term, offset,
    /// configuration); the file was rewritten with the live state only, so
    /// it is far smaller than everything appended.
    #[test]
    fn compaction_and_rewrite_keep_the_live_state_only() {
        let dir = std::env::temp_dir().join(format!("spate-raft-compact-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let group = GroupId { stream_id: 3, partition: 1 };
        let payload = vec![7u8; 64 << 10];
        let mut appended = 0u64;
        {
            let mut store = FileLogStore::open(&dir).unwrap().with_entry_bytes_max(1 << 20);
            store.create(group, GroupLog::default());
            for index in 1..=64u64 {
                store.append(group, &[entry(index, 1, &payload)]);
                appended += payload.len() as u64;
                store.set_applied(group, index, None);
                if index > 4 {
                    let compacted =
                        Compacted { index: index - 4, term: 1, offset: (index - 4) * 10, ..Compacted::default() };
                    store.compact(group, compacted);
                }
                store.sync();
                assert!(!store.is_full(), "compaction makes room");
            }
            assert!(store.rewrites > 0, "the file was rewritten");
        }
        let file_bytes = std::fs::metadata(dir.join(REPLICATION_DIR_NAME).join(LOG_FILE_NAME)).unwrap().len();
        assert!(file_bytes < appended / 4, "raft.log is {file_bytes} bytes after {appended} appended");
        let store = FileLogStore::open(&dir).unwrap();
        let log = store.log(group).expect("the group is back");
        assert_eq!((log.compacted.index, log.compacted.offset, log.first_index(), log.last_index()), (60, 600, 61, 64));
        assert_eq!((log.applied, store.entry_bytes()), (64, 4 * payload.len() as u64));
        let _ = std::fs::remove_dir_all(&dir);
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
