//! A partition's files with `--storage disk`: sealed segments and the
//! active one, in `<data-dir>/streams/<stream>/<partition>/`
//! ([`crate::storage`] has the formats and the I/O).
//!
//! The data structure is plain and synchronous: which segments exist, how
//! far the log is written, durable and visible, and encoding records from
//! the tail cache into frames in the active segment's write buffer. The
//! shard's committer ([`crate::shard::commit`]) does the awaiting: it takes
//! the [`SegmentWriter`] out ([`DiskLog::take_writer`]), flushes and syncs it
//! with no borrow held across an await, and puts it back. Everything else
//! that touches a partition (apply, fetch) never waits for the disk.
//!
//! Offsets and positions only grow: `durable <= written <= encoded <= next`,
//! and `visible` is `written` or `durable` depending on the fsync policy.
//!
//! # Opening on a full disk
//!
//! Opening may have to write: the partition directory and an empty active
//! segment for a new partition, the cut of a torn tail, a rebuilt sidecar
//! index, glommio's probe file. When one of them fails for lack of space,
//! [`DiskLog::open`] does not fail: the partition opens read-only, with
//! everything that exists readable, and the write is deferred
//! ([`Deferred`]) until the committer finds that writing works again.
//!
//! * The cut of a torn tail is deferred, not skipped: the active segment is
//!   scanned without writing, readers never read past its last whole frame
//!   (the index ends there), and no writer exists until the segment has
//!   been recovered again, cut and synced. So nothing is ever appended
//!   after bytes that a later scan could take for frames, and no byte that
//!   was acknowledged is touched. (The cut itself rewrites a block that is
//!   already allocated and truncates, so it frees space and rarely fails on
//!   a full ext4, xfs or tmpfs; a copy-on-write filesystem may refuse it.)
//! * A partition whose directory or first segment cannot be created holds
//!   nothing yet: it opens empty and both are created later.
//! * A rebuilt sidecar is kept in memory and written later; the next start
//!   would rebuild it again anyway.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::config::limits::{INDEX_INTERVAL_BYTES, WRITER_UNSYNCED_BUFFERS_MAX};
use crate::partition::log::MemoryLog;
use crate::storage::dir::{SegmentFiles, index_path, list_segments, segment_path};
use crate::storage::format::{FRAME_HEADER_SIZE, FrameError};
use crate::storage::index::SegmentIndex;
use crate::storage::recovery::{
    RecoveryReport, SealedSegment, open_sealed, recover_segment, recover_segment_from, scan_segment_read_only,
};
use crate::storage::segment::{SegmentConfig, SegmentError, SegmentWriter, remove_stale_probe_files, write_index_file};
use crate::stream::StreamSpec;

pub use crate::config::limits::FRAME_BODY_BYTES_TARGET;

/// How a partition's files are laid out and kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskConfig {
    pub writer: SegmentConfig,
    /// Bytes of files kept per partition; whole sealed segments go first.
    pub retention_bytes: u64,
    /// Age after which a sealed segment is deleted (by its file's last
    /// write); 0 keeps segments regardless of age.
    pub retention_ms: u64,
}

/// How a partition's files follow the flags (here rather than in `config`,
/// which knows no partition types).
impl Config {
    /// How the files of a partition of `spec` are written and kept (its
    /// stream's retention).
    pub fn disk_config_for(&self, spec: &StreamSpec) -> DiskConfig {
        DiskConfig { retention_bytes: spec.retention_bytes, retention_ms: spec.retention_ms, ..self.disk_config() }
    }

    /// How one partition's files are written and kept.
    pub fn disk_config(&self) -> DiskConfig {
        let buffer_bytes = self.segment_buffer_bytes();
        DiskConfig {
            writer: SegmentConfig {
                buffer_bytes,
                unsynced_buffers_max: WRITER_UNSYNCED_BUFFERS_MAX,
                segment_bytes_max: self.segment_bytes() as u64,
                index_interval_bytes: INDEX_INTERVAL_BYTES,
            },
            retention_bytes: self.retention_bytes() as u64,
            retention_ms: self.retention_ms,
        }
    }
}

/// A sealed segment: immutable, readable by any shard.
#[derive(Debug, Clone)]
pub struct SealedMeta {
    pub log_path: PathBuf,
    pub index_path: PathBuf,
    pub index: SegmentIndex,
    /// Last write to the file, ms since the Unix epoch (age retention).
    pub modified_ms: u64,
    /// The sidecar was rebuilt at open and could not be written (disk full).
    pub sidecar_unwritten: bool,
}

impl SealedMeta {
    fn size_bytes(&self) -> u64 {
        self.index.log_size()
    }
}

/// What opening a partition's files found, for the log and /metrics.
#[derive(Debug, Clone)]
pub struct OpenReport {
    pub dir: PathBuf,
    pub sealed_count: usize,
    /// The active segment's recovery, when it existed.
    pub recovery: Option<(PathBuf, RecoveryReport)>,
    /// Sealed segments whose sidecar index had to be rebuilt.
    pub indexes_rebuilt: usize,
    /// Why a write of the open was deferred (the disk is full): the
    /// partition is read-only until [`DiskLog::next_deferred`] is done.
    pub deferred: Option<String>,
    /// Frames appended from the write-ahead logs after the segments.
    pub replayed_frames: usize,
}

/// The active segment while the disk is too full to open it for writing.
#[derive(Debug)]
struct DeferredActive {
    /// The active segment's whole valid frames (none when it does not exist
    /// yet): readers read up to their end.
    index: SegmentIndex,
    /// Whether the file exists (to recover again) or is to be created, with
    /// its directory.
    exists: bool,
}

/// How the active segment starts: with its writer, or deferred.
enum ActiveStart {
    /// Boxed: it is built once per open, and far larger than the other.
    Writer(Box<SegmentWriter>),
    Deferred {
        path: PathBuf,
        deferred: DeferredActive,
    },
}

/// A write [`DiskLog::open`] deferred because the disk was full, for the
/// committer to do once writing works again ([`DiskLog::next_deferred`]).
#[derive(Debug, Clone)]
pub enum Deferred {
    /// Write a sealed segment's rebuilt sidecar index.
    Sidecar { index_path: PathBuf, index: SegmentIndex },
    /// Open the active segment for writing: recover it again (making the
    /// cut the scan found) when it `exists`, else create it and its
    /// directory. Its log ends at `next_offset`.
    Active { path: PathBuf, log_id: u64, base_offset: u64, config: SegmentConfig, exists: bool, next_offset: u64 },
}

impl Deferred {
    /// Does the deferred write; [`Deferred::Active`] gives the writer,
    /// for [`DiskLog::deferred_done`].
    pub async fn run(&self) -> Result<Option<SegmentWriter>, SegmentError> {
        match self {
            Deferred::Sidecar { index_path, index } => write_index_file(index_path, index).await.map(|()| None),
            Deferred::Active { path, log_id, base_offset, config, exists: true, next_offset } => {
                let (writer, _) = recover_segment(path, *log_id, *base_offset, *config).await?;
                // Nothing wrote the file since the read-only scan: the
                // recovery finds the same frames.
                assert_eq!(writer.next_offset(), *next_offset, "{}: the log changed while read-only", path.display());
                Ok(Some(writer))
            }
            Deferred::Active { path, log_id, base_offset, config, exists: false, .. } => {
                let dir = crate::storage::segment::parent_dir(path);
                std::fs::create_dir_all(dir).map_err(|source| SegmentError::Io {
                    op: "create partition directory",
                    path: dir.to_path_buf(),
                    position: 0,
                    source,
                })?;
                remove_if_empty(path);
                SegmentWriter::create(path, *log_id, *base_offset, *config).await.map(Some)
            }
        }
    }
}

/// Removes `path` if it is an empty file: what a create that failed half
/// way (the file made, its directory entry not synced) leaves. Nothing was
/// ever written to it.
pub fn remove_if_empty(path: &Path) {
    if std::fs::metadata(path).is_ok_and(|metadata| metadata.is_file() && metadata.len() == 0) {
        let _ = std::fs::remove_file(path);
    }
}

/// Where a read of one offset must go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    /// Retention deleted it: the log starts at `earliest`.
    Gone { earliest: u64 },
    /// In a file: read from `position` (a frame at or before the offset),
    /// never past `readable_end`.
    File { path: PathBuf, position: u64, readable_end: u64 },
    /// In the active segment while the committer has its writer out: try
    /// again after the commit.
    Busy,
}

/// One partition's files.
#[derive(Debug)]
pub struct DiskLog {
    dir: PathBuf,
    log_id: u64,
    config: DiskConfig,
    sealed: VecDeque<SealedMeta>,
    sealed_bytes: u64,
    active_base: u64,
    active_path: PathBuf,
    /// `None` while the committer has it out, or while deferred.
    writer: Option<SegmentWriter>,
    /// Set while the active segment could not be opened for writing.
    deferred_active: Option<DeferredActive>,
    /// The active segment's size as of the last time the writer was here.
    active_size: u64,
    written_offset: u64,
    durable_offset: u64,
    visible_offset: u64,
}

/// A partition's files in transit to another shard: everything but the open
/// file, which the thief opens again ([`DiskLog::reopen`]).
#[derive(Debug)]
pub struct MovedDisk {
    dir: PathBuf,
    log_id: u64,
    config: DiskConfig,
    sealed: VecDeque<SealedMeta>,
    active_base: u64,
    active_path: PathBuf,
    active_index: SegmentIndex,
    visible_offset: u64,
}

impl DiskLog {
    /// Opens (creating if need be) the files of one partition: sealed
    /// segments through their sidecars, the last one recovered (a torn or
    /// corrupt tail cut after the last whole frame). A write it cannot make
    /// for lack of space is deferred (see the module doc), never fatal.
    pub async fn open(dir: &Path, log_id: u64, config: DiskConfig) -> Result<(DiskLog, OpenReport), SegmentError> {
        DiskLog::open_with(dir, log_id, config, None).await
    }

    /// [`DiskLog::open`], trusting `durable` (the active segment's prefix a
    /// write-ahead log checkpoint recorded as durable) instead of scanning
    /// it, when it names the active segment.
    pub async fn open_with(
        dir: &Path,
        log_id: u64,
        config: DiskConfig,
        durable: Option<SegmentIndex>,
    ) -> Result<(DiskLog, OpenReport), SegmentError> {
        remove_stale_probe_files(dir);
        let mut report = OpenReport {
            dir: dir.to_path_buf(),
            sealed_count: 0,
            recovery: None,
            indexes_rebuilt: 0,
            deferred: None,
            replayed_frames: 0,
        };
        if let Err(source) = std::fs::create_dir_all(dir) {
            let error =
                SegmentError::Io { op: "create partition directory", path: dir.to_path_buf(), position: 0, source };
            if !error.is_storage_full() {
                return Err(error);
            }
            report.deferred = Some(error.to_string());
            let index = SegmentIndex::new(log_id, 0, config.writer.index_interval_bytes);
            let active =
                ActiveStart::Deferred { path: segment_path(dir, 0), deferred: DeferredActive { index, exists: false } };
            return Ok((DiskLog::assemble(dir, log_id, config, VecDeque::new(), 0, active), report));
        }
        let listed = list_segments(dir)?;
        let mut sealed = VecDeque::new();
        let interval = config.writer.index_interval_bytes;
        for files in listed.iter().take(listed.len().saturating_sub(1)) {
            let index_path = index_path(dir, files.base_offset);
            let SealedSegment { index, rebuilt, sidecar_unwritten } =
                open_sealed(&files.log_path, &index_path, log_id, files.base_offset, interval).await?;
            report.indexes_rebuilt += usize::from(rebuilt.is_some());
            if let Some(error) = &sidecar_unwritten {
                report.deferred.get_or_insert_with(|| error.to_string());
            }
            let modified_ms = modified_ms(&files.log_path);
            let sidecar_unwritten = sidecar_unwritten.is_some();
            let log_path = files.log_path.clone();
            sealed.push_back(SealedMeta { log_path, index_path, index, modified_ms, sidecar_unwritten });
        }
        report.sealed_count = sealed.len();
        let (active, active_base) = match listed.last() {
            Some(files) => {
                let durable =
                    durable.filter(|index| index.log_id() == log_id && index.base_offset() == files.base_offset);
                (open_active(files, log_id, config.writer, durable, &mut report).await?, files.base_offset)
            }
            None => (create_active(dir, log_id, config.writer, &mut report).await?, 0),
        };
        Ok((DiskLog::assemble(dir, log_id, config, sealed, active_base, active), report))
    }

    fn assemble(
        dir: &Path,
        log_id: u64,
        config: DiskConfig,
        sealed: VecDeque<SealedMeta>,
        active_base: u64,
        active: ActiveStart,
    ) -> DiskLog {
        let (active_path, active_size, next_offset, writer, deferred_active) = match active {
            ActiveStart::Writer(writer) => {
                (writer.path().to_path_buf(), writer.end(), writer.next_offset(), Some(*writer), None)
            }
            ActiveStart::Deferred { path, deferred } => {
                (path, deferred.index.log_size(), deferred.index.next_offset(), None, Some(deferred))
            }
        };
        DiskLog {
            dir: dir.to_path_buf(),
            log_id,
            config,
            sealed_bytes: sealed.iter().map(SealedMeta::size_bytes).sum(),
            sealed,
            active_base,
            active_path,
            active_size,
            writer,
            deferred_active,
            written_offset: next_offset,
            durable_offset: next_offset,
            visible_offset: next_offset,
        }
    }

    /// Whether a write of the open waits for disk space.
    pub fn has_deferred(&self) -> bool {
        self.deferred_active.is_some() || self.sealed.iter().any(|sealed| sealed.sidecar_unwritten)
    }

    /// The next deferred write, if any: sidecars first, then the active
    /// segment. Run it ([`Deferred::run`]) and report it done
    /// ([`DiskLog::deferred_done`]); meanwhile readers read as before.
    pub fn next_deferred(&self) -> Option<Deferred> {
        if let Some(sealed) = self.sealed.iter().find(|sealed| sealed.sidecar_unwritten) {
            return Some(Deferred::Sidecar { index_path: sealed.index_path.clone(), index: sealed.index.clone() });
        }
        let deferred = self.deferred_active.as_ref()?;
        Some(Deferred::Active {
            path: self.active_path.clone(),
            log_id: self.log_id,
            base_offset: self.active_base,
            config: self.config.writer,
            exists: deferred.exists,
            next_offset: deferred.index.next_offset(),
        })
    }

    /// Records a deferred write done; `writer` is what [`Deferred::run`]
    /// gave for [`Deferred::Active`].
    pub fn deferred_done(&mut self, done: &Deferred, writer: Option<SegmentWriter>) {
        match done {
            Deferred::Sidecar { index_path, .. } => {
                // Retention may have deleted the segment meanwhile.
                if let Some(sealed) = self.sealed.iter_mut().find(|sealed| &sealed.index_path == index_path) {
                    sealed.sidecar_unwritten = false;
                }
            }
            Deferred::Active { next_offset, .. } => {
                let writer = writer.expect("a deferred active segment opens with a writer");
                assert!(self.deferred_active.take().is_some() && self.writer.is_none(), "one writer per partition");
                assert_eq!(writer.path(), self.active_path, "the writer of the active segment");
                assert_eq!((writer.next_offset(), self.written_offset), (*next_offset, *next_offset));
                self.active_size = writer.end();
                self.writer = Some(writer);
            }
        }
    }

    /// The offset after the last record in the files (with the writer here).
    pub fn next_offset(&self) -> u64 {
        self.writer.as_ref().map_or(self.written_offset, SegmentWriter::next_offset)
    }

    pub fn earliest_offset(&self) -> u64 {
        self.sealed.front().map_or(self.active_base, |sealed| sealed.index.base_offset())
    }

    pub fn written_offset(&self) -> u64 {
        self.written_offset
    }

    pub fn durable_offset(&self) -> u64 {
        self.durable_offset
    }

    pub fn visible_offset(&self) -> u64 {
        self.visible_offset
    }

    /// Bytes of the partition's log on disk: its segment files, with the
    /// frames its writer still holds behind the write-ahead log (durable
    /// there, in the file at the next write-behind or checkpoint) counted
    /// as the file's.
    pub fn bytes(&self) -> u64 {
        self.sealed_bytes + self.writer.as_ref().map_or(self.active_size, SegmentWriter::end)
    }

    pub fn segment_count(&self) -> usize {
        self.sealed.len() + 1
    }

    pub fn log_id(&self) -> u64 {
        self.log_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The active segment's writer, when it is here.
    pub fn writer(&self) -> Option<&SegmentWriter> {
        self.writer.as_ref()
    }

    /// Takes the active segment's writer out for an await; `None` if it is
    /// already out.
    pub fn take_writer(&mut self) -> Option<SegmentWriter> {
        self.writer.take()
    }

    /// Puts the writer back and records how far it got.
    pub fn put_writer(&mut self, writer: SegmentWriter) {
        assert!(self.writer.is_none(), "one writer per partition");
        assert_eq!(writer.path(), self.active_path, "the writer of the active segment");
        self.writer = Some(writer);
        self.record_progress();
    }

    /// The active segment's writer, to append to it in place (a write-behind
    /// goes on without taking it out, see [`SegmentWriter::start_write_behind`]).
    pub fn writer_mut(&mut self) -> Option<&mut SegmentWriter> {
        self.writer.as_mut()
    }

    /// Records how far the writer (here) got: after a write-behind was reaped.
    pub fn record_progress(&mut self) {
        let Some(writer) = &self.writer else { return };
        let (written_end, written_offset) = writer.written();
        let (_, durable_offset) = writer.durable();
        assert!(written_offset >= self.written_offset && durable_offset >= self.durable_offset.min(written_offset));
        self.written_offset = written_offset;
        self.durable_offset = self.durable_offset.max(durable_offset);
        self.active_size = written_end;
    }

    /// Marks everything written as durable without an fdatasync (`--fsync
    /// never`: handed to the kernel is the promise).
    pub fn assume_durable(&mut self) {
        self.durable_offset = self.written_offset;
    }

    /// Readers see offsets below `offset`: never more than the files have
    /// (written, or still in the writer's buffer with the write-ahead log
    /// holding them: the tail cache keeps every record not written, so a
    /// read past `written_offset` never goes to the file).
    pub fn set_visible(&mut self, offset: u64) {
        assert!(offset <= self.next_offset() && offset >= self.visible_offset, "visible {offset}");
        self.visible_offset = offset;
    }

    /// Where a read of `offset` (below the tail cache) must go.
    pub fn locate(&self, offset: u64) -> Located {
        let earliest = self.earliest_offset();
        if offset < earliest {
            return Located::Gone { earliest };
        }
        if let Some(sealed) = self.sealed.iter().find(|sealed| offset < sealed.index.next_offset()) {
            let position = sealed.index.lookup(offset).expect("the offset is in this segment");
            let readable_end = sealed.index.log_size();
            return Located::File { path: sealed.log_path.clone(), position, readable_end };
        }
        // A deferred active segment is read up to its last whole frame.
        let active = match (&self.writer, &self.deferred_active) {
            (Some(writer), _) => Some((writer.index(), writer.written().0)),
            (None, Some(deferred)) => Some((&deferred.index, deferred.index.log_size())),
            (None, None) => None,
        };
        match active {
            Some((index, readable_end)) => match index.lookup(offset) {
                Some(position) if offset < self.visible_offset.min(self.written_offset) => {
                    Located::File { path: self.active_path.clone(), position, readable_end }
                }
                _ => Located::Busy,
            },
            None => Located::Busy,
        }
    }

    /// A sealed segment (or the active one) to roll to: the active one is
    /// full when the writer refuses the next frame; see [`Self::on_rolled`].
    pub fn next_segment_path(&self, base_offset: u64) -> PathBuf {
        segment_path(&self.dir, base_offset)
    }

    pub fn active_index_path(&self) -> PathBuf {
        index_path(&self.dir, self.active_base)
    }

    /// Records a roll: the old active segment (sealed by the committer, with
    /// `index`) joins the sealed ones and `writer` is the new active one.
    pub fn on_rolled(&mut self, index: SegmentIndex, writer: SegmentWriter) {
        assert!(self.writer.is_none(), "the committer holds the writer while rolling");
        assert_eq!(index.next_offset(), writer.next_offset(), "the new segment continues the old");
        let log_path = std::mem::replace(&mut self.active_path, writer.path().to_path_buf());
        let index_path = index_path(&self.dir, self.active_base);
        self.sealed_bytes += index.log_size();
        let modified_ms = now_unix_ms();
        self.sealed.push_back(SealedMeta { log_path, index_path, index, modified_ms, sidecar_unwritten: false });
        self.active_base = writer.next_offset();
        self.active_size = 0;
        self.writer = Some(writer);
    }

    /// Drops the sealed segments that retention no longer keeps (by bytes,
    /// then by age) and returns their files, for the caller to delete.
    /// Segments holding offsets at or past `keep_from` stay whatever their
    /// size and age (a `hold` consumer group has not committed them).
    pub fn expire(&mut self, now_ms: u64, keep_from: u64) -> Vec<PathBuf> {
        let mut files = Vec::new();
        while let Some(oldest) = self.sealed.front() {
            if oldest.index.next_offset() > keep_from {
                break;
            }
            let over_bytes = self.bytes() > self.config.retention_bytes;
            let too_old = is_past_age_retention(oldest.modified_ms, self.config.retention_ms, now_ms);
            if !over_bytes && !too_old {
                break;
            }
            let oldest = self.sealed.pop_front().expect("checked above");
            self.sealed_bytes -= oldest.size_bytes();
            files.push(oldest.log_path);
            files.push(oldest.index_path);
        }
        files
    }

    /// When age retention may next drop a segment of this log (ms since the
    /// Unix epoch): its oldest sealed segment's age limit, or `None` when it
    /// has no sealed segment or no age limit. Size retention needs no clock:
    /// only a write grows the log, and every commit round checks after it.
    pub fn next_age_expiry_ms(&self) -> Option<u64> {
        let oldest = self.sealed.front()?;
        (self.config.retention_ms > 0).then(|| oldest.modified_ms.saturating_add(self.config.retention_ms))
    }

    /// Takes the files apart for a move: the writer must be out and closed
    /// (everything written and durable first).
    pub fn into_moved(self, active_index: SegmentIndex) -> MovedDisk {
        assert!(self.writer.is_none(), "close the writer before moving the files");
        assert!(!self.has_deferred(), "a move waits for a successful round, which does what was deferred");
        assert_eq!(self.durable_offset, self.written_offset, "move only durable files");
        MovedDisk {
            dir: self.dir,
            log_id: self.log_id,
            config: self.config,
            sealed: self.sealed,
            active_base: self.active_base,
            active_path: self.active_path,
            active_index,
            visible_offset: self.visible_offset,
        }
    }

    /// Opens moved files on this shard, appending where the old owner
    /// stopped.
    /// The moved files stay with the caller, to try again after an error
    /// (out of file descriptors, say): nothing is lost meanwhile.
    pub async fn reopen(moved: &MovedDisk) -> Result<DiskLog, SegmentError> {
        let writer = SegmentWriter::reopen(&moved.active_path, moved.active_index.clone(), moved.config.writer).await?;
        let active = ActiveStart::Writer(Box::new(writer));
        let mut log =
            DiskLog::assemble(&moved.dir, moved.log_id, moved.config, moved.sealed.clone(), moved.active_base, active);
        log.visible_offset = moved.visible_offset.min(log.written_offset);
        Ok(log)
    }
}

/// Recovers the active segment; when the disk is too full for the cut (or
/// for the probe file), scans it without writing and defers the rest.
async fn open_active(
    files: &SegmentFiles,
    log_id: u64,
    config: SegmentConfig,
    durable: Option<SegmentIndex>,
    report: &mut OpenReport,
) -> Result<ActiveStart, SegmentError> {
    let path = files.log_path.clone();
    let durable = durable.unwrap_or_else(|| SegmentIndex::new(log_id, files.base_offset, config.index_interval_bytes));
    let error = match recover_segment_from(&path, durable, config).await {
        Ok((writer, recovery)) => {
            report.recovery = Some((path, recovery));
            return Ok(ActiveStart::Writer(Box::new(writer)));
        }
        Err(error) if error.is_storage_full() => error,
        Err(error) => return Err(error),
    };
    let scan = scan_segment_read_only(&path, log_id, files.base_offset, config.index_interval_bytes).await?;
    let discarded_bytes = scan.file_size.saturating_sub(scan.outcome.cursor.position);
    report.recovery =
        Some((path.clone(), RecoveryReport { outcome: scan.outcome, file_size: scan.file_size, discarded_bytes }));
    report.deferred.get_or_insert_with(|| error.to_string());
    Ok(ActiveStart::Deferred { path, deferred: DeferredActive { index: scan.index, exists: true } })
}

/// Creates the first segment of a new partition, or defers it when the
/// disk is full.
async fn create_active(
    dir: &Path,
    log_id: u64,
    config: SegmentConfig,
    report: &mut OpenReport,
) -> Result<ActiveStart, SegmentError> {
    let path = segment_path(dir, 0);
    match SegmentWriter::create(&path, log_id, 0, config).await {
        Ok(writer) => Ok(ActiveStart::Writer(Box::new(writer))),
        Err(error) if error.is_storage_full() => {
            remove_if_empty(&path);
            report.deferred.get_or_insert_with(|| error.to_string());
            let index = SegmentIndex::new(log_id, 0, config.index_interval_bytes);
            Ok(ActiveStart::Deferred { path, deferred: DeferredActive { index, exists: false } })
        }
        Err(error) => Err(error),
    }
}

/// What [`encode_pending`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoded {
    /// Every record of the cache is in a frame.
    All,
    /// The write buffer is full: flush, then encode again.
    BufferFull,
    /// The segment is full: roll to a new one, then encode again.
    SegmentFull,
}

/// Encodes the cache's records not yet in the files into frames in the
/// writer's buffer (each record copied once, straight into DMA memory).
pub fn encode_pending(
    cache: &MemoryLog,
    writer: &mut SegmentWriter,
    timestamp_ms: u64,
) -> Result<Encoded, SegmentError> {
    // Room for all of it in one buffer when it can be (a frame header per
    // target-sized frame besides the records).
    let pending = cache.bytes_from(writer.next_offset());
    writer.reserve(pending + FRAME_HEADER_SIZE * (pending / FRAME_BODY_BYTES_TARGET + 1));
    while writer.next_offset() < cache.next_offset() {
        let base_offset = writer.next_offset();
        let log_id = writer.log_id();
        let mut encoder = match writer.frame_encoder() {
            Ok(encoder) => encoder,
            Err(SegmentError::SegmentFull { .. }) => return Ok(Encoded::SegmentFull),
            Err(SegmentError::BufferFull { .. }) => return Ok(Encoded::BufferFull),
            Err(error) => return Err(error),
        };
        // Whole spans of the cache, one copy each, up to the frame's target
        // size; the records are in log format already (the frame body is
        // the same bytes).
        let body_room = encoder.available().min(FRAME_BODY_BYTES_TARGET);
        cache.read_spans_within(base_offset, cache.next_offset(), body_room, |_, count, span, may_hold_extended| {
            // Cannot fail: the spans stay within the room the encoder has.
            if let Err(error) = encoder.append_records(span, count, may_hold_extended) {
                panic!("cached records do not frame: {error}");
            }
        });
        // A first record larger than the target goes alone, when it fits.
        let mut refused_size = None;
        if encoder.record_count() == 0 {
            cache.read(base_offset, |_, record| {
                match encoder.append_record(record.log_record) {
                    Ok(()) => {}
                    Err(FrameError::FrameFull { .. }) => refused_size = Some(record.log_record.len()),
                    Err(error) => panic!("a cached record does not frame: {error}"),
                }
                false
            });
        }
        if encoder.record_count() == 0 {
            // Not even one record fits what is left of the buffer or the
            // segment: the caller flushes or rolls first.
            let frame_size = FRAME_HEADER_SIZE + refused_size.unwrap_or(0);
            let segment_full = writer.would_pass_segment_limit(frame_size);
            return Ok(if segment_full { Encoded::SegmentFull } else { Encoded::BufferFull });
        }
        let sealed = encoder.seal(log_id, base_offset, timestamp_ms).map_err(|error| SegmentError::Frame {
            path: writer.path().to_path_buf(),
            position: writer.end(),
            error,
        })?;
        writer.commit_encoded(sealed)?;
    }
    Ok(Encoded::All)
}

/// Whether a sealed segment last written at `modified_ms` is older than
/// `retention_ms` at `now_ms` (0 keeps it regardless of age). The sum
/// saturates: a retention near `u64::MAX` (a catalog from before the API
/// limit, [`crate::stream::RETENTION_MS_MAX`]) once wrapped below the clock
/// and deleted every sealed segment at once.
pub fn is_past_age_retention(modified_ms: u64, retention_ms: u64, now_ms: u64) -> bool {
    retention_ms > 0 && modified_ms.saturating_add(retention_ms) < now_ms
}

/// Milliseconds since the Unix epoch (frame timestamps and age retention).
pub fn now_unix_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

fn modified_ms(path: &Path) -> u64 {
    let modified = std::fs::metadata(path).and_then(|metadata| metadata.modified());
    let since = modified.ok().and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok()).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use super::*;
    use crate::storage::segment::tests::{append_test_frame, run, scratch_dir};
    use crate::storage::segment::{BLOCK_SIZE, align_up};

    fn config() -> DiskConfig {
        let writer = SegmentConfig { buffer_bytes: 64 << 10, ..SegmentConfig::default() };
        DiskConfig { writer, retention_bytes: u64::MAX, retention_ms: 0 }
    }

    /// A partition whose torn tail's cut is deferred (as on a full disk)
    /// reads up to its last whole frame, writes nothing and has no writer
    /// until the deferred recovery ran; that recovery cuts the tail and the
    /// writer appends after the last whole frame.
    #[test]
    fn a_deferred_cut_reads_whole_frames_and_writes_nothing_until_done() {
        let dir = scratch_dir("deferred-cut");
        let path = segment_path(&dir, 0);
        run({
            let (dir, path) = (dir.clone(), path.clone());
            async move {
                let mut writer = SegmentWriter::create(&path, 9, 0, config().writer).await.unwrap();
                for frame_index in 0..20 {
                    append_test_frame(&mut writer, frame_index).unwrap();
                }
                writer.sync().await.unwrap();
                let (end, next_offset) = writer.durable();
                writer.close().await.unwrap();
                let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                file.seek(SeekFrom::Start(end)).unwrap();
                file.write_all(&[0x5a; 5000]).unwrap();
                drop(file);
                let torn_size = std::fs::metadata(&path).unwrap().len();

                let interval = config().writer.index_interval_bytes;
                let scan = scan_segment_read_only(&path, 9, 0, interval).await.unwrap();
                let deferred = DeferredActive { index: scan.index, exists: true };
                let active = ActiveStart::Deferred { path: path.clone(), deferred };
                let mut disk = DiskLog::assemble(&dir, 9, config(), VecDeque::new(), 0, active);
                assert!(disk.has_deferred() && disk.writer().is_none());
                assert_eq!((disk.next_offset(), disk.visible_offset()), (next_offset, next_offset));
                match disk.locate(next_offset - 1) {
                    Located::File { readable_end, .. } => assert_eq!(readable_end, end, "whole frames only"),
                    other => panic!("{other:?}"),
                }
                assert_eq!(disk.locate(next_offset), Located::Busy, "nothing past the last whole frame");
                assert!(disk.take_writer().is_none(), "no writer while the cut waits");

                let work = disk.next_deferred().unwrap();
                assert!(matches!(work, Deferred::Active { exists: true, .. }), "{work:?}");
                assert_eq!(std::fs::metadata(&path).unwrap().len(), torn_size, "nothing written while deferred");
                let writer = work.run().await.unwrap();
                disk.deferred_done(&work, writer);
                assert!(!disk.has_deferred() && disk.next_deferred().is_none());
                assert_eq!(std::fs::metadata(&path).unwrap().len(), align_up(end, BLOCK_SIZE), "the tail is cut");
                let mut writer = disk.take_writer().unwrap();
                assert_eq!(writer.next_offset(), next_offset);
                append_test_frame(&mut writer, 20).unwrap();
                writer.sync().await.unwrap();
                writer.close().await.unwrap();
            }
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A new partition whose directory could not be created (as on a full
    /// disk) is empty and read-only; the deferred create makes the
    /// directory and its first segment.
    #[test]
    fn a_deferred_create_makes_the_directory_and_segment() {
        let base = scratch_dir("deferred-create");
        let dir = base.join("streams").join("default").join("3");
        run({
            let dir = dir.clone();
            async move {
                let index = SegmentIndex::new(4, 0, config().writer.index_interval_bytes);
                let deferred = DeferredActive { index, exists: false };
                let active = ActiveStart::Deferred { path: segment_path(&dir, 0), deferred };
                let mut disk = DiskLog::assemble(&dir, 4, config(), VecDeque::new(), 0, active);
                assert_eq!((disk.next_offset(), disk.earliest_offset()), (0, 0));
                assert_eq!(disk.locate(0), Located::Busy);
                let work = disk.next_deferred().unwrap();
                let writer = work.run().await.unwrap();
                disk.deferred_done(&work, writer);
                assert!(segment_path(&dir, 0).exists() && !disk.has_deferred());
                disk.take_writer().unwrap().close().await.unwrap();
            }
        });
        std::fs::remove_dir_all(base).unwrap();
    }

    /// Age retention keeps a segment until it is older than the retention,
    /// never wraps (u64::MAX, 2^63, a clock or file time near u64::MAX), and
    /// 0 keeps everything.
    #[test]
    fn age_retention_saturates_instead_of_wrapping() {
        let now_ms = 1_780_000_000_000;
        assert!(is_past_age_retention(now_ms - 2000, 1000, now_ms));
        assert!(!is_past_age_retention(now_ms - 1000, 1000, now_ms), "exactly the retention old is kept");
        assert!(!is_past_age_retention(now_ms - 500, 1000, now_ms));
        assert!(!is_past_age_retention(0, 0, now_ms), "0 keeps segments regardless of age");
        for retention_ms in [u64::MAX, 1 << 63, u64::MAX - now_ms + 1] {
            assert!(!is_past_age_retention(now_ms - 3_600_000, retention_ms, now_ms), "retention {retention_ms}");
        }
        assert!(!is_past_age_retention(u64::MAX, 1000, u64::MAX), "a file time far in the future");
        assert!(is_past_age_retention(0, crate::stream::RETENTION_MS_MAX, u64::MAX));
    }
}
