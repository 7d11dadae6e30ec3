//! [`FileLogStore`]: the node's Raft store on disk, the first durable
//! [`LogStore`] the real node runs on (the shard WAL comes next; the module
//! doc of [`crate::replication`] says how).
//!
//! Every group's log, hard state and applied index live in memory (a
//! [`MemoryLogStore`]) and every change is also a record appended to the
//! current *tail* file, `<data-dir>/replication/raft-<seq>.log`.
//! [`LogStore::sync`] writes the records of the round and fdatasyncs the
//! file once, so one sync covers every group of the node, as the host's
//! round requires (the cluster thread takes that write as a [`SyncJob`]
//! and runs it on a blocking thread, [`FileLogStore::take_sync_job`]). A
//! start reads the files back, each up to its first torn or corrupt record
//! (what a crash left unsynced), and truncates it there.
//!
//! A record: `u32` length of the body, `u32` CRC32C of the body, then the
//! body: `u8` kind, `u32` stream part and `u32` partition of the group, and
//! the kind's payload (protobuf for raft-rs's types).
//!
//! Compaction: a group's log is compacted once its entries are applied and
//! their records durable in the partition's log (the node decides when,
//! [`crate::replication::node`]); the store drops them from memory and
//! appends a compaction record. The files would still grow forever, so
//! the store *rolls*: when the tails since the last base pass
//! [`FileLogStore::rewrite_threshold_bytes`] (the larger of half the entry
//! bound and 4x the live entries), the records so far go to the current
//! tail as usual, later ones to a new tail `raft-<seq+2>.log`, and the live
//! state of every group at that point (compaction point, entries past it,
//! hard state, applied index and configuration) is written as a *base*,
//! `raft-<seq+1>.base`, by a thread of its own: in chunks, each
//! fdatasynced, then renamed from `.base.new` (the directory synced), after
//! which every older file is deleted. A start replays the newest base and
//! the tails after it, or, while a base is not complete, the older base and
//! every tail, so a crash at any point leaves a complete log. Each base
//! writes at most a quarter of what was appended since the last, so bases
//! add at most 25 % to the store's writes, and the files stay below 5x the
//! live entries (at most 5x the entry bound). A base carries a quiet
//! group's few live entries forward, so no group pins old files (the reason
//! one file rewritten by rename was chosen first); it is written beside the
//! tails rather than in their place because it is tens of MB: written as a
//! sync job, on the cluster thread or in the sync's place, it held every
//! group's commits for 0.3 – 0.6 s (a replicated `#SYNC` at 100 k events/s:
//! p99 19 ms in 8 s runs, 340 ms in 16 s runs, where the first one fell).
//! An older data directory's single `raft.log` is read as the first tail.
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
/// The single log file of a data directory written before bases: read as
/// the tail of sequence 0 (renamed to it at the first open).
const LEGACY_FILE_NAME: &str = "raft.log";
/// A base is written in chunks of this many bytes, each fdatasynced, so it
/// never puts tens of MB of dirty pages in front of the tails' syncs.
const BASE_CHUNK_BYTES: usize = 4 << 20;
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

/// Largest body of one record a base writes for a group's entries: a
/// group with more live entries than this gets several append records, so
/// no record passes [`RECORD_BYTES_MAX`], which replay reads as corruption.
const BASE_RECORD_BYTES: usize = 16 << 20;

/// One round's records to append to the current tail and fdatasync, on a
/// thread that may block ([`FileLogStore::take_sync_job`]).
pub struct SyncJob {
    file: std::io::Result<File>,
    bytes: Vec<u8>,
    /// The directory to sync after the file: the first write to a new
    /// tail makes its name durable too.
    new_file_in: Option<PathBuf>,
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
        file.sync_data()?;
        match self.new_file_in {
            Some(dir) => sync_dir(&dir),
            None => Ok(()),
        }
    }
}

/// A base to write (module doc): every group's live state at a roll, a
/// copy that shares the entries' data with the store (`Bytes`), so taking
/// it costs the cluster thread about a millisecond; the base's thread
/// encodes it (60 – 110 ms for 35 MB of entries here).
struct BaseWrite {
    dir: PathBuf,
    seq: u64,
    groups: Vec<(GroupId, GroupLog)>,
    entry_bytes: u64,
}

impl BaseWrite {
    /// Writes `raft-<seq>.base.new` in fdatasynced chunks, renames it to
    /// `raft-<seq>.base`, syncs the directory, then deletes every file of
    /// a lower sequence.
    fn run(self) -> std::io::Result<()> {
        // The lowest CPU priority: the encode (60 – 110 ms of CPU for 35 MB
        // of entries) must not take the CPU from the threads whose commits
        // wait (nice applies per thread on Linux); it only has to end
        // before the next roll, seconds away. Best effort: on failure it
        // runs at the usual priority.
        // SAFETY: setpriority on this thread's own id, no memory involved.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
        let bytes = encode_live_state(&self.groups, self.entry_bytes);
        let new_path = self.dir.join(format!("{}.new", base_name(self.seq)));
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&new_path)?;
        for chunk in bytes.chunks(BASE_CHUNK_BYTES) {
            file.write_all(chunk)?;
            file.sync_data()?;
        }
        file.sync_all()?;
        std::fs::rename(&new_path, self.dir.join(base_name(self.seq)))?;
        sync_dir(&self.dir)?;
        for (seq, path, _) in list_files(&self.dir)? {
            if seq < self.seq {
                std::fs::remove_file(path)?;
            }
        }
        sync_dir(&self.dir)
    }
}

/// Makes `dir`'s entries (a file created, renamed or removed) durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn tail_name(seq: u64) -> String {
    format!("raft-{seq:08}.log")
}

fn base_name(seq: u64) -> String {
    format!("raft-{seq:08}.base")
}

/// The store's files (sequence, path, whether a base), in sequence order;
/// a base's `.new` file (a write a crash cut short) is removed.
fn list_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf, bool)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else { continue };
        if name.ends_with(".base.new") {
            std::fs::remove_file(&path)?;
            continue;
        }
        let parsed = name.strip_prefix("raft-").and_then(|rest| {
            let (seq, kind) = rest.split_once('.')?;
            Some((seq.parse::<u64>().ok()?, kind))
        });
        match parsed {
            Some((seq, "log")) => files.push((seq, path, false)),
            Some((seq, "base")) => files.push((seq, path, true)),
            _ => {}
        }
    }
    files.sort_by_key(|(seq, _, is_base)| (*seq, *is_base));
    Ok(files)
}

/// The node's Raft store: memory, plus a log file when storage is on disk.
pub struct FileLogStore {
    memory: MemoryLogStore,
    /// The current tail, open for appending.
    file: Option<File>,
    /// The store's directory (`None` in memory).
    dir: Option<PathBuf>,
    /// The current tail's sequence.
    seq: u64,
    /// The current tail is new: its first sync makes its name durable.
    new_tail: bool,
    /// Records of this round, written and synced by [`LogStore::sync`].
    pending: Vec<u8>,
    /// Bytes of entry data held (every group's live entries).
    entry_bytes: u64,
    entry_bytes_max: u64,
    /// Bytes of the tails since the last base.
    file_bytes: u64,
    /// The base being written by its own thread: its end arrives here.
    base_in_flight: Option<flume::Receiver<std::io::Result<()>>>,
    pub syncs: u64,
    /// Bases written (module doc).
    pub rewrites: u64,
}

impl FileLogStore {
    /// A store in memory only (`--storage memory`: the node keeps no event
    /// across a restart, and takes a fresh identity anyway).
    pub fn in_memory() -> FileLogStore {
        FileLogStore {
            memory: MemoryLogStore::new(),
            file: None,
            dir: None,
            seq: 0,
            new_tail: false,
            pending: Vec::new(),
            entry_bytes: 0,
            entry_bytes_max: ENTRY_BYTES_MAX,
            file_bytes: 0,
            base_in_flight: None,
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
        let legacy = dir.join(LEGACY_FILE_NAME);
        if legacy.exists() {
            std::fs::rename(&legacy, dir.join(tail_name(0)))?;
            sync_dir(&dir)?;
        }
        let files = list_files(&dir)?;
        // The newest complete base, and the tails after it.
        let base = files.iter().rev().find(|(_, _, is_base)| *is_base).map(|(seq, _, _)| *seq);
        let mut store = FileLogStore { dir: Some(dir.clone()), ..FileLogStore::in_memory() };
        let mut last_tail = None;
        for (seq, path, is_base) in &files {
            if base.is_some_and(|base| *seq < base || (*seq == base && !is_base)) {
                continue;
            }
            let mut file = std::fs::OpenOptions::new().read(true).append(true).open(path)?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            let valid = store.replay(&bytes);
            if valid < bytes.len() {
                log::warn!(
                    "replication: {} ends with {} bytes of a record cut short or corrupt (a crash before its \
                     sync); dropped",
                    path.display(),
                    bytes.len() - valid
                );
                file.set_len(valid as u64)?;
                file.sync_all()?;
            }
            if !is_base {
                store.file_bytes += valid as u64;
                last_tail = Some((*seq, file));
            }
        }
        let (seq, file, new_tail) = match last_tail {
            Some((seq, file)) => (seq, file, false),
            None => {
                let seq = base.map_or(0, |base| base + 1);
                let file = std::fs::OpenOptions::new().append(true).create(true).open(dir.join(tail_name(seq)))?;
                (seq, file, true)
            }
        };
        (store.file, store.seq, store.new_tail) = (Some(file), seq, new_tail);
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

    /// Whether the tails since the last base (the records just taken for a
    /// sync included) passed the threshold, with no base being written.
    fn roll_due(&mut self) -> bool {
        if let Some(done) = &self.base_in_flight {
            match done.try_recv() {
                Ok(result) => {
                    self.base_in_flight = None;
                    self.finish_base(result);
                }
                Err(flume::TryRecvError::Empty) => return false,
                Err(flume::TryRecvError::Disconnected) => self.base_in_flight = None,
            }
        }
        self.file_bytes > self.rewrite_threshold_bytes()
    }

    /// Rolls to a new tail once the pending records are taken for the
    /// current one (module doc); returns the base to write, the live state
    /// now.
    fn roll(&mut self, dir: PathBuf) -> std::io::Result<BaseWrite> {
        let groups =
            self.memory.groups().into_iter().filter_map(|group| Some((group, self.memory.log(group)?.clone())));
        let groups = groups.collect();
        self.file =
            Some(std::fs::OpenOptions::new().append(true).create(true).open(dir.join(tail_name(self.seq + 2)))?);
        let base = BaseWrite { dir, seq: self.seq + 1, groups, entry_bytes: self.entry_bytes };
        self.seq += 2;
        self.new_tail = true;
        self.file_bytes = 0;
        Ok(base)
    }

    /// Counts a base written; a failed one is logged and left (the tails
    /// still hold everything; the next roll writes another).
    fn finish_base(&mut self, result: std::io::Result<()>) {
        match result {
            Ok(()) => self.rewrites += 1,
            Err(error) => log::warn!("replication: writing a base of the Raft log failed: {error}"),
        }
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
        if self.dir.is_some() {
            write_record(&mut self.pending, kind, group, payload);
        }
    }

    /// Takes the records queued for the next sync as a job to run off the
    /// cluster thread ([`SyncJob::run`]), so the thread keeps sending,
    /// receiving and delivering during the fdatasync; `None` when there is
    /// nothing to write or no file (memory). When the tails pass their
    /// threshold, the store rolls after this job's records (module doc) and
    /// the base starts on a thread of its own. [`FileLogStore::finish_sync`]
    /// must follow before anything else syncs the store.
    pub fn take_sync_job(&mut self) -> Option<SyncJob> {
        if self.pending.is_empty() {
            return None;
        }
        let file = self.file.as_ref()?.try_clone();
        let new_file_in = std::mem::take(&mut self.new_tail).then(|| self.dir.clone()).flatten();
        let job = SyncJob { file, bytes: std::mem::take(&mut self.pending), new_file_in };
        self.file_bytes += job.bytes();
        if let Some(dir) = self.dir.clone().filter(|_| self.roll_due()) {
            match self.roll(dir) {
                Ok(base) => {
                    let (done, receiver) = flume::bounded(1);
                    let spawned = std::thread::Builder::new()
                        .name("spate-raft-base".into())
                        .spawn(move || drop(done.send(base.run())));
                    match spawned {
                        Ok(_) => self.base_in_flight = Some(receiver),
                        Err(error) => self.finish_base(Err(error)),
                    }
                }
                Err(error) => self.exit_on_failed_write(&error),
            }
        }
        Some(job)
    }

    /// Counts a finished [`SyncJob`]; a failed one ends the process as a
    /// failed [`LogStore::sync`] does.
    pub fn finish_sync(&mut self, result: std::io::Result<()>) {
        self.syncs += 1;
        if let Err(error) = result {
            self.exit_on_failed_write(&error);
        }
    }

    fn exit_on_failed_write(&self, error: &std::io::Error) -> ! {
        let path = self.dir.as_deref().map(|dir| dir.join(tail_name(self.seq)));
        let path = path.as_deref().map(Path::display);
        log::error!(
            "replication: writing the Raft log {path:?} failed ({error}); stopping, as it may have lost what it acknowledged"
        );
        std::process::exit(70);
    }

    /// [`Self::take_sync_job`] and its base run on the calling thread.
    fn write_pending(&mut self) -> std::io::Result<()> {
        self.wait_for_base();
        let Some(job) = self.take_sync_job() else { return Ok(()) };
        job.run()?;
        self.wait_for_base();
        Ok(())
    }

    /// Waits for the base being written, if any, and counts it.
    fn wait_for_base(&mut self) {
        if let Some(done) = self.base_in_flight.take() {
            let result = done.recv().unwrap_or(Ok(()));
            self.finish_base(result);
        }
    }

    /// Bytes of entry data of `group` from `index` on.
    fn data_bytes_from(&self, group: GroupId, index: u64) -> u64 {
        self.memory.log(group).map_or(0, |log| log.data_bytes_from(index))
    }
}

/// The records of every group's live state (compaction point, entries
/// past it, hard state, applied index and configuration): what a base
/// holds, which replays to the store as it was when `groups` was taken.
fn encode_live_state(groups: &[(GroupId, GroupLog)], entry_bytes: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(entry_bytes as usize + (groups.len() << 8));
    for (group, log) in groups {
        let group = *group;
        write_record(&mut bytes, KIND_CREATE, group, |_| {});
        if log.compacted.index > 0 {
            write_record(&mut bytes, KIND_RESTORE, group, |out| encode_compacted(out, &log.compacted));
        }
        let mut entries = &log.entries[..];
        while !entries.is_empty() {
            // Whole entries up to BASE_RECORD_BYTES (at least one).
            let mut taken = 0;
            let mut record_bytes = 0;
            while taken < entries.len() && (taken == 0 || record_bytes < BASE_RECORD_BYTES) {
                record_bytes += entries[taken].data.len();
                taken += 1;
            }
            write_record(&mut bytes, KIND_APPEND, group, |out| encode_entries(out, &entries[..taken]));
            entries = &entries[taken..];
        }
        write_record(&mut bytes, KIND_HARD_STATE, group, |out| {
            out.extend_from_slice(&log.hard_state.write_to_bytes().unwrap_or_default())
        });
        write_record(&mut bytes, KIND_APPLIED, group, |out| {
            out.extend_from_slice(&log.applied.to_le_bytes());
            out.extend_from_slice(&log.conf_state.write_to_bytes().unwrap_or_default());
        });
    }
    bytes
}

/// Appends one record (length, CRC32C, then the body: kind, group and
/// `payload`) to `out`.
fn write_record(out: &mut Vec<u8>, kind: u8, group: GroupId, payload: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 8]);
    out.push(kind);
    out.extend_from_slice(&group.stream_id.to_le_bytes());
    out.extend_from_slice(&group.partition.to_le_bytes());
    payload(out);
    let body_bytes = out.len() - start - 8;
    let crc = crc32c::crc32c(&out[start + 8..]);
    out[start..start + 4].copy_from_slice(&(body_bytes as u32).to_le_bytes());
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
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

/// The entries' count, then each as its length and its protobuf bytes,
/// encoded in place (no buffer of its own per entry: this runs for every
/// append on every replica).
fn encode_entries(out: &mut Vec<u8>, entries: &[Entry]) {
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for entry in entries {
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        if entry.write_to_vec(out).is_err() {
            // As before: an entry that does not encode is written empty.
            out.truncate(at + 4);
        }
        let length = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&length.to_le_bytes());
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

    /// Bytes of the store's files.
    fn store_bytes(dir: &Path) -> u64 {
        let files = list_files(&dir.join(REPLICATION_DIR_NAME)).unwrap();
        files.iter().map(|(_, path, _)| std::fs::metadata(path).unwrap().len()).sum()
    }

    /// A compacted group comes back after a reopen as it was: the entries
    /// past the compaction point, the point itself (index, term, offset,
    /// configuration); bases of the live state replaced the older files,
    /// so the store is far smaller than everything appended.
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
        let file_bytes = store_bytes(&dir);
        assert!(file_bytes < appended / 4, "the store is {file_bytes} bytes after {appended} appended");
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
        let path = dir.join(REPLICATION_DIR_NAME).join(tail_name(0));
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

    /// A crash while a base is written (its `.new` file half there) loses
    /// nothing: the older files still hold every record; and a data
    /// directory of the single-file layout (`raft.log`) opens with its
    /// groups.
    #[test]
    fn a_base_cut_short_and_the_single_file_layout_both_open_whole() {
        let dir = std::env::temp_dir().join(format!("spate-raft-base-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let group = GroupId { stream_id: 4, partition: 2 };
        {
            let mut store = FileLogStore::open(&dir).unwrap();
            store.create(group, GroupLog::default());
            store.append(group, &[entry(1, 1, b"one"), entry(2, 1, b"two")]);
            store.set_hard_state(group, &HardState { term: 1, vote: 1, commit: 2, ..HardState::default() });
            store.sync();
        }
        let replication = dir.join(REPLICATION_DIR_NAME);
        // The single-file layout: the same records under the old name.
        std::fs::rename(replication.join(tail_name(0)), replication.join(LEGACY_FILE_NAME)).unwrap();
        // A base a crash cut short.
        std::fs::write(replication.join(format!("{}.new", base_name(1))), [9u8; 100]).unwrap();
        let mut store = FileLogStore::open(&dir).unwrap();
        let log = store.log(group).expect("the group is back").clone();
        assert_eq!((log.last_index(), log.hard_state.commit), (2, 2));
        assert!(
            !replication.join(LEGACY_FILE_NAME).exists() && !replication.join(format!("{}.new", base_name(1))).exists()
        );
        // A roll now (a tiny threshold) writes a base; the reopen reads it.
        store.entry_bytes_max = 1;
        store.append(group, &[entry(3, 1, b"three")]);
        store.sync();
        store.append(group, &[entry(4, 1, b"four")]);
        store.sync();
        assert!(store.rewrites > 0, "a base was written");
        drop(store);
        let files = list_files(&replication).unwrap();
        assert!(files.iter().any(|(_, _, is_base)| *is_base), "{files:?}");
        let store = FileLogStore::open(&dir).unwrap();
        let log = store.log(group).expect("the group is back");
        let data: Vec<Vec<u8>> = log.entries.iter().map(|entry| entry.data.to_vec()).collect();
        assert_eq!(data, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec(), b"four".to_vec()]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
