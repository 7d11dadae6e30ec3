//! Segment files on glommio DMA (O_DIRECT through io_uring): the writer and
//! the reader.
//!
//! # How the writer keeps the file readable
//!
//! O_DIRECT writes whole aligned blocks ([`BLOCK_SIZE`], 4 KiB). Frames are
//! encoded into an aligned in-memory buffer (`active`) that starts at a block
//! boundary of the file. A flush writes the buffer up to the next block
//! boundary, zero-filled past the last frame, so the file always ends in
//! whole frames followed by zeros: the recovery scan reads that as a clean
//! end. The partial last block is copied (at most 4 KiB) to the start of a
//! fresh buffer, and the next flush rewrites that block with the new frames
//! after the old bytes. The layout benchmark found the rewrite costs nothing
//! measurable, where padding every commit to a block wastes up to 4 KiB of
//! disk per commit (`benches/disk_layout.rs`).
//!
//! A torn rewrite cannot damage acknowledged data: the old and new contents
//! of the rewritten block are identical up to the old end, so any mix of
//! them keeps every synced frame; what follows is cut by the scan.
//!
//! # Buffers
//!
//! glommio 0.9's `DmaFile::write_rc_at` writes a whole `DmaBuffer`, so a
//! flush hands the encode buffer itself to its write (trimmed to the write:
//! `trim_to_size`, and `trim_front` past a head, a four-line patch of the
//! vendored glommio) and the writer goes on in a fresh buffer that starts
//! with the copied partial block. Every byte is copied into DMA memory once,
//! by the encoder. A fresh buffer is [`ACTIVE_BYTES_MIN`]; before a round
//! encodes, [`SegmentWriter::reserve`] grows it to what the round has for
//! the partition, up to `buffer_bytes`, so a write holds about what it
//! writes. (Until 2026-12-07 the encode buffer was `buffer_bytes` for the
//! writer's life and each flush copied its bytes into a buffer sized to the
//! write: 6.7 ns of memory-bound copying per event under disk ingest.)
//!
//! A flushed buffer is kept (shared with the kernel through an `Rc`) until
//! its bytes are durable, which is what makes errors retryable: a failed
//! or short write leaves the writer's state as it was and the next
//! [`SegmentWriter::flush`] writes the same bytes at the same position
//! again; a failed `fdatasync` marks every unsynced buffer unwritten, so
//! the next [`SegmentWriter::sync`] rewrites and syncs them all (retrying
//! only the fdatasync could report success for data the kernel already
//! dropped).
//!
//! # Writes that stay inline
//!
//! io_uring first tries a write without blocking, and hands it to a kernel
//! worker thread (an io-wq "punt") when the filesystem says it would
//! block. ext4 says so for every O_DIRECT write that extends the file (the
//! size change needs the inode's lock to itself) and for every write that
//! is not a pure overwrite of allocated blocks, which includes one that
//! covers a written block and unwritten ones together. An appending writer
//! hit both on every write: it extended the file, and it began by
//! rewriting the partial last block. So every segment write ran on a
//! worker thread, with a context switch each way and a device doorbell of
//! its own (about a fifth of the server's CPU under disk ingest, 2026-12-07).
//!
//! Two changes keep them inline:
//! - the writer grows its file ahead of its writes with `fallocate`
//!   (unwritten extents, the size set): by its size so far, at least
//!   [`ALLOCATE_STEP_MIN`] and at most [`ALLOCATE_STEP_MAX`] at a time,
//!   never past the segment's limit. The allocated part reads as zeros, a
//!   clean end to the recovery scan, which cuts the file after its last
//!   block at the next start; sealing (durably) and closing cut it too.
//!   If `fallocate` fails (a full disk, a filesystem without it), that
//!   writer's writes extend the file as before.
//! - a write that rewrites a partial block sends that block as a request of
//!   its own (the *head*), beside the rest (the *body*), both at once.
//!
//! # Write-behind
//!
//! With the shard's write-ahead log ([`crate::storage::wal`]) a segment
//! file no longer has to be written in the round that makes its frames
//! durable: the committer encodes frames into `active`, copies them into the
//! log, and writes the segment *behind* it ([`SegmentWriter::start_write_behind`]):
//! the sealed buffers go out in a task of their own that holds only the
//! file and the buffers, so the writer stays in its partition and keeps
//! taking frames while they are written. One write-behind runs at a time
//! per writer (consecutive writes overlap by the rewritten partial block, so
//! they must not be in flight together); [`SegmentWriter::reap_write_behind`]
//! takes its outcome, and every operation that writes itself (flush, sync,
//! close) waits for it first.
//!
//! # Memory
//!
//! A writer holds `(unsynced_buffers_max + 1) * buffer_bytes` at most, plus
//! its index (8 bytes per `index_interval_bytes` of segment). In the usual
//! group commit (append, then [`SegmentWriter::sync`]) one flushed buffer is
//! alive while the next fills. On disk an open segment holds at most
//! [`ALLOCATE_STEP_MAX`] of allocated space past its data (its size so far
//! while smaller: a partition that wrote 100 KB holds 256 KiB).

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::GlommioError;
use glommio::io::{DmaBuffer, DmaFile, OpenOptions};

use super::dir::DirError;
use super::format::{
    FRAME_HEADER_SIZE, FrameEncoder, FrameError, FrameHeader, SealedFrame, decode_frame, parse_header,
};
use super::index::{IndexError, SEGMENT_SIZE_MAX, SegmentIndex};

/// The block every write is aligned to and sized in. Larger than glommio's
/// `alignment()` on this box (512, the logical block size) on purpose: the
/// device's physical block is 4 KiB, and a sub-block write would make it
/// read-modify-write.
pub const BLOCK_SIZE: u64 = crate::config::limits::WRITE_BLOCK_BYTES as u64;

/// Limits of one segment writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentConfig {
    /// Bytes of the aligned write buffer (a multiple of [`BLOCK_SIZE`], at
    /// least two blocks). Costs this much per buffer alive.
    pub buffer_bytes: usize,
    /// Flushed buffers that may wait for an fdatasync; past it, `flush`
    /// asks for a `sync` first.
    pub unsynced_buffers_max: usize,
    /// The writer refuses frames past this size; the caller rolls.
    pub segment_bytes_max: u64,
    /// Spacing of index entries.
    pub index_interval_bytes: u32,
}

/// Limits for the storage layer's own tests: a 1 MiB buffer, 4 buffers
/// waiting for an fdatasync, 256 MiB segments, an index entry per 4 KiB. A
/// server's writers take theirs from its flags and `config::limits`
/// (`Config::disk_config`), the only values in production.
#[cfg(test)]
impl Default for SegmentConfig {
    fn default() -> SegmentConfig {
        SegmentConfig {
            buffer_bytes: 1 << 20,
            unsynced_buffers_max: 4,
            segment_bytes_max: 256 << 20,
            index_interval_bytes: 4096,
        }
    }
}

impl SegmentConfig {
    /// Bytes of a fresh encode buffer: [`ACTIVE_BYTES_MIN`], or
    /// `buffer_bytes` when smaller.
    fn fresh_buffer_bytes(&self) -> usize {
        self.buffer_bytes.min(ACTIVE_BYTES_MIN)
    }

    fn check(&self) {
        assert!(self.buffer_bytes >= 2 * BLOCK_SIZE as usize, "buffer_bytes {}", self.buffer_bytes);
        assert!(self.buffer_bytes.is_multiple_of(BLOCK_SIZE as usize), "buffer_bytes {}", self.buffer_bytes);
        assert!(self.unsynced_buffers_max >= 1);
        assert!(self.segment_bytes_max > 0 && self.segment_bytes_max <= SEGMENT_SIZE_MAX);
        assert!(self.index_interval_bytes > 0);
    }
}

/// A segment operation that failed. I/O errors keep the OS error (so
/// `ENOSPC` and `EIO` are visible through [`SegmentError::os_error`]) and say
/// what was being done where.
#[derive(Debug)]
pub enum SegmentError {
    Io {
        op: &'static str,
        path: PathBuf,
        position: u64,
        source: io::Error,
    },
    /// The kernel wrote fewer bytes than asked (the disk filled up mid-way).
    ShortWrite {
        path: PathBuf,
        position: u64,
        written: usize,
        expected: usize,
    },
    /// The frame does not fit in the write buffer: flush (and sync) first.
    BufferFull {
        needed: usize,
        available: usize,
    },
    /// Too many flushed buffers wait for an fdatasync: sync first.
    TooManyUnsynced {
        buffer_count: usize,
    },
    /// The segment reached its size limit: roll to a new one.
    SegmentFull {
        segment_size: u64,
        needed: u64,
        segment_bytes_max: u64,
    },
    /// A frame given to the writer, or read back, is not valid.
    Frame {
        path: PathBuf,
        position: u64,
        error: FrameError,
    },
    /// A valid frame that does not continue this segment's log.
    NotNext {
        expected_log_id: u64,
        expected_offset: u64,
        log_id: u64,
        base_offset: u64,
    },
    Index {
        path: PathBuf,
        error: IndexError,
    },
    /// A read outside the readable part of a segment.
    OutOfRange {
        path: PathBuf,
        offset: u64,
        readable_end: u64,
    },
    /// A partition's directory: its name, or listing it.
    Dir(DirError),
}

impl From<DirError> for SegmentError {
    fn from(error: DirError) -> SegmentError {
        SegmentError::Dir(error)
    }
}

impl SegmentError {
    /// The OS error number behind an I/O failure, if any.
    pub fn os_error(&self) -> Option<i32> {
        match self {
            SegmentError::Io { source, .. } | SegmentError::Dir(DirError::Io { source, .. }) => source.raw_os_error(),
            _ => None,
        }
    }

    /// Whether the disk (or quota) is full: backpressure, not a crash.
    pub fn is_storage_full(&self) -> bool {
        matches!(self.os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
            || matches!(self, SegmentError::ShortWrite { .. })
    }
}

impl fmt::Display for SegmentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SegmentError::Io { op, path, position, source } => {
                write!(f, "{op} {} at {position}: {source}", path.display())
            }
            SegmentError::ShortWrite { path, position, written, expected } => {
                write!(f, "short write to {} at {position}: {written} of {expected} bytes", path.display())
            }
            SegmentError::BufferFull { needed, available } => {
                write!(f, "segment write buffer full: needs {needed} bytes, {available} free")
            }
            SegmentError::TooManyUnsynced { buffer_count } => {
                write!(f, "{buffer_count} flushed buffers wait for fdatasync: sync first")
            }
            SegmentError::SegmentFull { segment_size, needed, segment_bytes_max } => {
                write!(f, "segment of {segment_size} bytes cannot take {needed} more (limit {segment_bytes_max}): roll")
            }
            SegmentError::Frame { path, position, error } => write!(f, "{} at {position}: {error}", path.display()),
            SegmentError::NotNext { expected_log_id, expected_offset, log_id, base_offset } => write!(
                f,
                "frame of log {log_id} at offset {base_offset} does not continue log {expected_log_id} at {expected_offset}"
            ),
            SegmentError::Index { path, error } => write!(f, "{}: {error}", path.display()),
            SegmentError::OutOfRange { path, offset, readable_end } => {
                write!(
                    f,
                    "{}: offset or position {offset} is outside the readable log (end {readable_end})",
                    path.display()
                )
            }
            SegmentError::Dir(error) => write!(f, "{error}"),
        }
    }
}

impl std::error::Error for SegmentError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SegmentError::Io { source, .. } => Some(source),
            SegmentError::Frame { error, .. } => Some(error),
            SegmentError::Index { error, .. } => Some(error),
            SegmentError::Dir(error) => Some(error),
            _ => None,
        }
    }
}

/// The `io::Error` inside a glommio error, with its OS error number kept
/// (glommio's own conversion rebuilds the error from its text and loses it).
pub(crate) fn io_error_of(error: GlommioError<()>) -> io::Error {
    match error {
        GlommioError::IoError(source) | GlommioError::EnhancedIoError { source, .. } => source,
        other => other.into(),
    }
}

/// Wraps a glommio result into [`SegmentError::Io`].
pub(crate) fn io_context<T>(
    result: Result<T, GlommioError<()>>,
    op: &'static str,
    path: &Path,
    position: u64,
) -> Result<T, SegmentError> {
    result.map_err(|error| SegmentError::Io { op, path: path.to_path_buf(), position, source: io_error_of(error) })
}

pub(crate) fn align_down(value: u64, block_size: u64) -> u64 {
    value / block_size * block_size
}

pub(crate) fn align_up(value: u64, block_size: u64) -> u64 {
    value.div_ceil(block_size) * block_size
}

/// A flushed buffer whose bytes are not yet durable.
struct PendingWrite {
    /// Aligned file position of the write's first byte.
    position: u64,
    /// The write's first block, written as a request of its own, when it
    /// rewrites a partial block (module doc, "Writes that stay inline");
    /// `body` then starts one block later.
    head: Option<Rc<DmaBuffer>>,
    body: Rc<DmaBuffer>,
    /// The log end (file position after the last frame) it covers.
    end: u64,
    /// The offset after its last record.
    next_offset: u64,
    written: bool,
}

impl PendingWrite {
    fn len(&self) -> usize {
        self.head.as_ref().map_or(0, |head| head.len()) + self.body.len()
    }

    /// The file position after its last byte.
    fn file_end(&self) -> u64 {
        self.position + self.len() as u64
    }

    /// Its requests, as a write-behind takes them.
    fn requests(&self) -> WriteRequests {
        WriteRequests { position: self.position, head: self.head.clone(), body: self.body.clone() }
    }
}

/// One pending write's requests, shared with the kernel while they run.
struct WriteRequests {
    position: u64,
    head: Option<Rc<DmaBuffer>>,
    body: Rc<DmaBuffer>,
}

impl WriteRequests {
    /// Writes the head and the body concurrently (they cover different
    /// blocks) and fails unless both wrote every byte.
    async fn write(self, file: &DmaFile, path: &Path) -> Result<(), SegmentError> {
        let body_position = self.position + self.head.as_ref().map_or(0, |head| head.len() as u64);
        let head = async {
            match self.head {
                Some(head) => write_whole(file, path, head, self.position).await,
                None => Ok(()),
            }
        };
        let body = write_whole(file, path, self.body, body_position);
        let (head, body) = futures_lite::future::zip(head, body).await;
        head.and(body)
    }
}

/// Writes `buffer` at `position`: an error, or a short write, fails.
async fn write_whole(file: &DmaFile, path: &Path, buffer: Rc<DmaBuffer>, position: u64) -> Result<(), SegmentError> {
    let expected = buffer.len();
    let written = crate::runtime::submit::submitted(file.write_rc_at(buffer, position)).await;
    let written = io_context(written, "write segment", path, position)?;
    if written != expected {
        return Err(SegmentError::ShortWrite { path: path.to_path_buf(), position, written, expected });
    }
    Ok(())
}

/// Grows `file` to `size` bytes with `fallocate` (the new part reads as
/// zeros, a clean end to the recovery scan). Returns whether it did.
async fn allocate(file: &DmaFile, size: u64) -> bool {
    crate::runtime::submit::submitted(file.pre_allocate(size, false)).await.is_ok()
}

/// The smallest step by which a writer grows its file ahead of its writes
/// (module doc, "Writes that stay inline"); each step is the file's size so
/// far, between this and [`ALLOCATE_STEP_MAX`].
pub const ALLOCATE_STEP_MIN: u64 = 256 << 10;
/// The largest such step: an active segment holds at most this much
/// allocated space past its last write.
pub const ALLOCATE_STEP_MAX: u64 = 8 << 20;

/// Where a writer starts: an empty segment or the end of a recovered one.
pub(crate) struct WriterStart {
    pub file: DmaFile,
    pub path: PathBuf,
    pub log_id: u64,
    pub config: SegmentConfig,
    pub index: SegmentIndex,
    /// The last partial block of the log (empty when the log ends on a
    /// block boundary), read back from the file.
    pub tail_block: Vec<u8>,
}

impl fmt::Debug for SegmentWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentWriter")
            .field("path", &self.path)
            .field("log_id", &self.log_id)
            .field("next_offset", &self.next_offset)
            .field("written", &(self.written_end, self.written_next_offset))
            .field("durable", &(self.durable_end, self.durable_next_offset))
            .finish_non_exhaustive()
    }
}

/// What a write-behind task reports, shared with the writer that started
/// it: how many of its writes were done, in order, and the error that
/// stopped it (`None` while it runs).
#[derive(Default)]
struct BehindState {
    /// Taken by the reaper.
    outcome: std::cell::RefCell<Option<(usize, Option<SegmentError>)>>,
    /// Set once the task has ended and never cleared: waiters look at
    /// this, not at `outcome`, which a reaper may have taken already.
    done: std::cell::Cell<bool>,
    /// Growing the file failed (its writes went ahead).
    allocation_failed: std::cell::Cell<bool>,
    ended: crate::runtime::notify::WaitList,
}

/// A handle to wait for a writer's write-behind without borrowing the
/// writer across the await.
#[derive(Clone)]
pub struct WriteBehind(Rc<BehindState>);

impl WriteBehind {
    /// Waits until the write-behind task has ended (successfully or not).
    pub async fn ended(&self) {
        self.0.ended.wait_until(|| self.0.done.get()).await;
    }
}

/// Bytes of a fresh encode buffer (`active`), when `buffer_bytes` is
/// larger: [`SegmentWriter::reserve`] grows it, up to `buffer_bytes`, for
/// the records a round has for it. A buffer goes to its write whole
/// (module doc, "Buffers"), so one sized to the round is all that write
/// holds.
pub const ACTIVE_BYTES_MIN: usize = 256 << 10;

/// Appends frames of one log to one segment file.
pub struct SegmentWriter {
    /// Shared with a running write-behind task and with a checkpoint that
    /// fdatasyncs it ([`SegmentWriter::file_handle`]).
    file: Rc<DmaFile>,
    /// The write-behind running now, if any.
    behind: Option<Rc<BehindState>>,
    path: PathBuf,
    log_id: u64,
    config: SegmentConfig,
    /// Frames not flushed yet, from file position `active_position`.
    active: DmaBuffer,
    active_position: u64,
    active_used: usize,
    /// Bytes at the start of `active` already inside a pending write (the
    /// copied partial block).
    active_carried: usize,
    unsynced: VecDeque<PendingWrite>,
    /// The file's size as far as this writer knows: writes that end inside
    /// it do not extend the file (module doc, "Writes that stay inline").
    allocated_end: u64,
    /// The writer grew its file ahead of its writes at least once: closing
    /// or sealing it cuts the file after its last block.
    allocated: bool,
    /// Growing the file failed (a full disk, a filesystem without
    /// `fallocate`): this writer's writes extend the file themselves.
    allocation_off: bool,
    next_offset: u64,
    written_end: u64,
    written_next_offset: u64,
    durable_end: u64,
    durable_next_offset: u64,
    index: SegmentIndex,
}

impl SegmentWriter {
    /// Creates a new, empty segment file for log `log_id` starting at
    /// `base_offset`. Fails if the file exists.
    pub async fn create(
        path: &Path,
        log_id: u64,
        base_offset: u64,
        config: SegmentConfig,
    ) -> Result<SegmentWriter, SegmentError> {
        config.check();
        prime_dma_probe(parent_dir(path)).await?;
        let opened = OpenOptions::new().read(true).write(true).create_new(true).dma_open(path).await;
        let file = io_context(opened, "create segment", path, 0)?;
        sync_parent_dir(path).await?;
        let index = SegmentIndex::new(log_id, base_offset, config.index_interval_bytes);
        let start = WriterStart { file, path: path.to_path_buf(), log_id, config, index, tail_block: Vec::new() };
        Ok(SegmentWriter::start(start))
    }

    /// Opens an existing, clean segment whose `index` is known (the old
    /// owner of a moved partition wrote, synced and closed it) and appends
    /// after its last frame, with no scan: only the partial last block is
    /// read back.
    pub async fn reopen(
        path: &Path,
        index: SegmentIndex,
        config: SegmentConfig,
    ) -> Result<SegmentWriter, SegmentError> {
        config.check();
        prime_dma_probe(parent_dir(path)).await?;
        let opened = OpenOptions::new().read(true).write(true).dma_open(path).await;
        let file = io_context(opened, "open segment", path, 0)?;
        let end = index.log_size();
        let block_start = align_down(end, BLOCK_SIZE);
        let mut tail_block = Vec::new();
        if end > block_start {
            let read = file.read_at_aligned(block_start, BLOCK_SIZE as usize).await;
            let read = io_context(read, "read segment", path, block_start)?;
            let tail_size = (end - block_start) as usize;
            if read.len() < tail_size {
                let (path, position) = (path.to_path_buf(), block_start);
                return Err(SegmentError::ShortWrite { path, position, written: read.len(), expected: tail_size });
            }
            tail_block.extend_from_slice(&read[..tail_size]);
        }
        let log_id = index.log_id();
        let start = WriterStart { file, path: path.to_path_buf(), log_id, config, index, tail_block };
        Ok(SegmentWriter::start(start))
    }

    /// Whether a frame of `frame_size` bytes would take the segment past its
    /// limit (the caller rolls to a new segment).
    pub fn would_pass_segment_limit(&self, frame_size: usize) -> bool {
        self.end() + frame_size as u64 > self.config.segment_bytes_max
    }

    /// Drops flushed buffers once written, without counting them durable:
    /// with a write-ahead log, which holds their frames until a checkpoint
    /// or a filesystem sync makes the file durable, no copy is needed for
    /// a retry, and the next [`SegmentWriter::sync`] still fdatasyncs them
    /// (a handoff, a direct sync, a roll). [`SegmentWriter::forget_written`]
    /// also counts them durable, which only `--fsync never` may.
    pub fn drop_written(&mut self) {
        while self.unsynced.front().is_some_and(|pending| pending.written) {
            self.unsynced.pop_front();
        }
    }

    /// Forgets flushed buffers once written, without an fdatasync: for
    /// `--fsync never`, where a write handed to the kernel is the promise.
    pub fn forget_written(&mut self) {
        if let Some(last) = self.unsynced.iter().take_while(|pending| pending.written).last() {
            self.durable_end = last.end;
            self.durable_next_offset = last.next_offset;
        }
        self.drop_written();
    }

    /// The frames appended since the writer's end was `position`, still in
    /// its buffer (call before the next flush): what a commit round copies
    /// into the shard's write-ahead log.
    pub fn appended_since(&self, position: u64) -> &[u8] {
        assert!(position >= self.active_position && position <= self.end(), "position {position}");
        let start = (position - self.active_position) as usize;
        &self.active.as_bytes()[start..self.active_used]
    }

    /// Bytes in flushed buffers waiting for an fdatasync.
    pub fn unsynced_bytes(&self) -> usize {
        self.unsynced.iter().map(PendingWrite::len).sum()
    }

    /// Whether the writer has no room to flush again before a sync.
    pub fn needs_sync(&self) -> bool {
        self.unsynced.len() >= self.config.unsynced_buffers_max
    }

    /// A writer at the end of the log that `start` describes, all of it
    /// already durable.
    pub(crate) fn start(start: WriterStart) -> SegmentWriter {
        let WriterStart { file, path, log_id, config, index, tail_block } = start;
        config.check();
        let file = Rc::new(file);
        let end = index.log_size();
        assert_eq!(tail_block.len() as u64, end - align_down(end, BLOCK_SIZE));
        let mut active = file.alloc_dma_buffer(config.fresh_buffer_bytes());
        active.as_bytes_mut()[..tail_block.len()].copy_from_slice(&tail_block);
        let next_offset = index.next_offset();
        SegmentWriter {
            file,
            behind: None,
            path,
            log_id,
            config,
            active,
            active_position: align_down(end, BLOCK_SIZE),
            active_used: tail_block.len(),
            active_carried: tail_block.len(),
            unsynced: VecDeque::new(),
            allocated_end: align_up(end, BLOCK_SIZE),
            allocated: false,
            allocation_off: false,
            next_offset,
            written_end: end,
            written_next_offset: next_offset,
            durable_end: end,
            durable_next_offset: next_offset,
            index,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn log_id(&self) -> u64 {
        self.log_id
    }

    pub fn config(&self) -> SegmentConfig {
        self.config
    }

    /// The offset the next appended frame must start at.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// File position after the last appended frame.
    pub fn end(&self) -> u64 {
        self.active_position + self.active_used as u64
    }

    /// File position up to which frames are written to the file (readable
    /// with a [`SegmentReader`]), and the offset after them.
    pub fn written(&self) -> (u64, u64) {
        (self.written_end, self.written_next_offset)
    }

    /// File position up to which frames are durable (fdatasync returned),
    /// and the offset after them.
    pub fn durable(&self) -> (u64, u64) {
        (self.durable_end, self.durable_next_offset)
    }

    /// The index of every appended frame.
    pub fn index(&self) -> &SegmentIndex {
        &self.index
    }

    #[cfg(test)]
    pub(crate) fn file_for_tests(&self) -> &DmaFile {
        &self.file
    }

    /// Free space for the next frame, bounded by the buffer and the segment.
    fn spare(&self) -> Result<usize, SegmentError> {
        let segment_room = self.config.segment_bytes_max.saturating_sub(self.end());
        let buffer_room = self.active.len() - self.active_used;
        let needed = (FRAME_HEADER_SIZE + super::format::RECORD_HEADER_SIZE) as u64;
        if segment_room < needed {
            let segment_bytes_max = self.config.segment_bytes_max;
            return Err(SegmentError::SegmentFull { segment_size: self.end(), needed, segment_bytes_max });
        }
        Ok(buffer_room.min(usize::try_from(segment_room).unwrap_or(usize::MAX)))
    }

    /// Grows the encode buffer so that `bytes` more fit after what it
    /// holds, up to `buffer_bytes`; what it holds is copied (at most a block
    /// right after a flush, which is when a round calls this). A buffer that
    /// has the room already stays as it is.
    pub fn reserve(&mut self, bytes: usize) {
        let needed = self.active_used.saturating_add(bytes);
        if needed <= self.active.len() {
            return;
        }
        // At least twice the size: a writer appending frame after frame
        // (a replay) copies each byte a bounded number of times.
        let size = (align_up(needed as u64, BLOCK_SIZE) as usize)
            .max(2 * self.active.len())
            .max(ACTIVE_BYTES_MIN)
            .min(self.config.buffer_bytes);
        if size <= self.active.len() {
            return;
        }
        let mut grown = self.file.alloc_dma_buffer(size);
        grown.as_bytes_mut()[..self.active_used].copy_from_slice(&self.active.as_bytes()[..self.active_used]);
        self.active = grown;
    }

    /// A [`FrameEncoder`] over the free part of the write buffer, so records
    /// are copied once, straight into DMA memory. After
    /// [`FrameEncoder::seal`], hand the [`SealedFrame`] to
    /// [`SegmentWriter::commit_encoded`]; a frame never committed is
    /// overwritten by the next one.
    pub fn frame_encoder(&mut self) -> Result<FrameEncoder<'_>, SegmentError> {
        let spare = self.spare()?;
        let range = self.active_used..self.active_used + spare;
        FrameEncoder::new(&mut self.active.as_bytes_mut()[range])
            .map_err(|_| SegmentError::BufferFull { needed: FRAME_HEADER_SIZE, available: spare })
    }

    /// Appends the frame that the last [`SegmentWriter::frame_encoder`]
    /// sealed.
    pub fn commit_encoded(&mut self, sealed: SealedFrame) -> Result<(), SegmentError> {
        let start = self.active_used;
        let spare = self.active.len() - start;
        if sealed.frame_size > spare {
            return Err(SegmentError::BufferFull { needed: sealed.frame_size, available: spare });
        }
        let frame = &self.active.as_bytes()[start..start + sealed.frame_size];
        let header = parse_header(frame).map_err(|error| self.frame_error(error))?;
        debug_assert!(decode_frame(frame).is_ok());
        assert_eq!((header.base_offset, header.record_count), (sealed.base_offset, sealed.record_count));
        assert_eq!(header.frame_size(), sealed.frame_size);
        self.accept(&header)
    }

    /// Copies one already-framed, checked frame into the write buffer.
    pub fn append_frame(&mut self, frame: &[u8]) -> Result<(), SegmentError> {
        let header = decode_frame(frame).map_err(|error| self.frame_error(error))?.header;
        if header.frame_size() != frame.len() {
            let error = FrameError::Truncated { needed: header.frame_size(), available: frame.len() };
            return Err(self.frame_error(error));
        }
        self.reserve(frame.len());
        let spare = self.spare()?;
        if frame.len() > spare {
            return Err(self.full_error(frame.len() as u64, spare));
        }
        self.check_next(&header)?;
        let start = self.active_used;
        self.active.as_bytes_mut()[start..start + frame.len()].copy_from_slice(frame);
        self.accept(&header)
    }

    fn frame_error(&self, error: FrameError) -> SegmentError {
        SegmentError::Frame { path: self.path.clone(), position: self.end(), error }
    }

    fn full_error(&self, needed: u64, spare: usize) -> SegmentError {
        if self.end() + needed > self.config.segment_bytes_max {
            let segment_bytes_max = self.config.segment_bytes_max;
            return SegmentError::SegmentFull { segment_size: self.end(), needed, segment_bytes_max };
        }
        SegmentError::BufferFull { needed: needed as usize, available: spare }
    }

    fn check_next(&self, header: &FrameHeader) -> Result<(), SegmentError> {
        if header.log_id != self.log_id || header.base_offset != self.next_offset {
            return Err(SegmentError::NotNext {
                expected_log_id: self.log_id,
                expected_offset: self.next_offset,
                log_id: header.log_id,
                base_offset: header.base_offset,
            });
        }
        Ok(())
    }

    /// Takes the frame now at the end of the buffer into the log.
    fn accept(&mut self, header: &FrameHeader) -> Result<(), SegmentError> {
        self.check_next(header)?;
        let position = self.end();
        let indexed = self.index.on_frame(position, header);
        indexed.map_err(|error| SegmentError::Index { path: self.path.clone(), error })?;
        self.active_used += header.frame_size();
        self.next_offset = header.next_offset();
        debug_assert_eq!(self.index.log_size(), self.end());
        debug_assert_eq!(self.index.next_offset(), self.next_offset);
        Ok(())
    }

    /// Moves the appended frames into a pending write and starts a fresh
    /// buffer holding the partial last block.
    fn seal_active(&mut self) -> Result<(), SegmentError> {
        if self.active_used == self.active_carried {
            return Ok(());
        }
        if self.unsynced.len() >= self.config.unsynced_buffers_max {
            return Err(SegmentError::TooManyUnsynced { buffer_count: self.unsynced.len() });
        }
        let used = self.active_used;
        let write_size = align_up(used as u64, BLOCK_SIZE) as usize;
        let keep_from = align_down(used as u64, BLOCK_SIZE) as usize;
        // Zeros after the last frame: the scan reads them as a clean end.
        self.active.as_bytes_mut()[used..write_size].fill(0);
        // The buffer itself goes to the write (module doc, "Buffers"); the
        // next frames go into a fresh one that starts with the partial last
        // block. A write that rewrites a partial block sends that block as
        // a request of its own (module doc, "Writes that stay inline").
        let block = BLOCK_SIZE as usize;
        let head_size = if self.active_carried > 0 && write_size > block { block } else { 0 };
        let head = (head_size > 0).then(|| {
            let mut head = self.file.alloc_dma_buffer(head_size);
            head.as_bytes_mut().copy_from_slice(&self.active.as_bytes()[..head_size]);
            Rc::new(head)
        });
        let mut next = self.file.alloc_dma_buffer(self.config.fresh_buffer_bytes());
        next.as_bytes_mut()[..used - keep_from].copy_from_slice(&self.active.as_bytes()[keep_from..used]);
        let mut body = std::mem::replace(&mut self.active, next);
        body.trim_to_size(write_size);
        body.trim_front(head_size);
        self.unsynced.push_back(PendingWrite {
            position: self.active_position,
            head,
            body: Rc::new(body),
            end: self.end(),
            next_offset: self.next_offset,
            written: false,
        });
        self.active_position += keep_from as u64;
        self.active_used -= keep_from;
        self.active_carried = self.active_used;
        Ok(())
    }

    /// The size to grow the file to before a write that ends at
    /// `write_end`, or `None` when the write ends inside the file (or the
    /// writer does not grow its file): the file's size so far again, at
    /// least [`ALLOCATE_STEP_MIN`] and at most [`ALLOCATE_STEP_MAX`] more,
    /// never past the segment's limit.
    fn allocation_for(&self, write_end: u64) -> Option<u64> {
        if self.allocation_off || write_end <= self.allocated_end {
            return None;
        }
        let step = self.allocated_end.clamp(ALLOCATE_STEP_MIN, ALLOCATE_STEP_MAX);
        let limit = align_up(self.config.segment_bytes_max, BLOCK_SIZE);
        Some((self.allocated_end + step).min(limit).max(write_end))
    }

    /// Records growing the file to `size`, or that it failed: then this
    /// writer's writes extend the file themselves from now on.
    fn allocated_after(&mut self, size: u64, succeeded: bool) {
        self.allocated = true;
        if succeeded {
            self.allocated_end = self.allocated_end.max(size);
        } else {
            self.allocation_off = true;
        }
    }

    /// Waits for a running write-behind, then cuts the file after its last
    /// written block if the writer grew it ahead (a clean stop). Without an
    /// fdatasync: a cut lost to a crash is made again by recovery.
    pub async fn trim_allocated(&mut self) -> Result<(), SegmentError> {
        self.settle_write_behind().await;
        self.trim().await.map(drop)
    }

    /// Cuts the file after its last written block when the writer grew it
    /// ahead, so a closed segment holds no allocated space past its data.
    /// Returns whether it cut.
    async fn trim(&mut self) -> Result<bool, SegmentError> {
        let end = align_up(self.written_end, BLOCK_SIZE);
        if !self.allocated || self.allocated_end == end && !self.allocation_off {
            return Ok(false);
        }
        io_context(self.file.truncate(end).await, "truncate segment", &self.path, end)?;
        self.allocated_end = end;
        self.allocated = false;
        Ok(true)
    }

    /// Writes every appended frame to the file (not durably: see
    /// [`SegmentWriter::sync`]) and returns the written end. On error
    /// nothing is lost: call it again to retry the same writes.
    pub async fn flush(&mut self) -> Result<u64, SegmentError> {
        self.settle_write_behind().await;
        self.seal_active()?;
        self.write_pending().await
    }

    /// Writes the flushed buffers not written yet, in file order (they
    /// overlap by the rewritten partial block, so the order matters).
    async fn write_pending(&mut self) -> Result<u64, SegmentError> {
        let last_end = self.unsynced.back().filter(|pending| !pending.written).map(PendingWrite::file_end);
        if let Some(size) = last_end.and_then(|end| self.allocation_for(end)) {
            let allocated = allocate(&self.file, size).await;
            self.allocated_after(size, allocated);
        }
        for pending in self.unsynced.iter_mut().filter(|pending| !pending.written) {
            pending.requests().write(&self.file, &self.path).await?;
            pending.written = true;
            self.written_end = pending.end;
            self.written_next_offset = pending.next_offset;
        }
        Ok(self.written_end)
    }

    /// Flushes, then fdatasyncs: every frame appended before the call is
    /// durable when it returns `Ok`. Returns the durable end.
    pub async fn sync(&mut self) -> Result<u64, SegmentError> {
        self.settle_write_behind().await;
        if self.unsynced.len() >= self.config.unsynced_buffers_max {
            // No room to flush the active buffer: make the pending ones
            // durable first.
            self.write_pending().await?;
            self.sync_written().await?;
        }
        self.flush().await?;
        self.sync_written().await
    }

    /// fdatasyncs what is written.
    async fn sync_written(&mut self) -> Result<u64, SegmentError> {
        debug_assert!(self.unsynced.iter().all(|pending| pending.written));
        if self.durable_end == self.written_end {
            return Ok(self.durable_end);
        }
        let synced = crate::runtime::submit::submitted(self.file.fdatasync()).await;
        if let Err(error) = synced {
            // What the kernel did with the written blocks is unknown: write
            // them all again before the next fdatasync.
            for pending in &mut self.unsynced {
                pending.written = false;
            }
            self.written_end = self.durable_end;
            self.written_next_offset = self.durable_next_offset;
            return io_context(Err(error), "fdatasync segment", &self.path, self.durable_end);
        }
        self.durable_end = self.written_end;
        self.durable_next_offset = self.written_next_offset;
        self.unsynced.clear();
        Ok(self.durable_end)
    }

    /// Syncs, writes the index sidecar (atomically: temporary file, fdatasync,
    /// rename, directory sync) and closes the segment. Returns its index.
    pub async fn seal(mut self, index_path: &Path) -> Result<SegmentIndex, SegmentError> {
        self.write_seal(index_path).await?;
        let (index, closed) = self.close_sealed().await;
        closed.map(|()| index)
    }

    /// The first half of [`SegmentWriter::seal`]: syncs and writes the index
    /// sidecar. On an error (a full disk, say) the writer is unharmed and the
    /// call can be retried; a sealer that consumed the writer on error would
    /// lose the records it had not synced.
    pub async fn write_seal(&mut self, index_path: &Path) -> Result<(), SegmentError> {
        self.sync().await?;
        if self.trim().await? {
            let synced = self.file.fdatasync().await;
            io_context(synced, "fdatasync segment", &self.path, self.durable_end)?;
        }
        write_index_file(index_path, &self.index).await
    }

    /// The second half of [`SegmentWriter::seal`]: closes the file and hands
    /// back its index. After [`SegmentWriter::write_seal`] the segment is
    /// durable and indexed, so the index comes back even if the close fails.
    pub async fn close_sealed(mut self) -> (SegmentIndex, Result<(), SegmentError>) {
        self.settle_write_behind().await;
        let closed = close_shared(self.file).await;
        (self.index, io_context(closed, "close segment", &self.path, self.durable_end))
    }

    /// Closes the file without syncing: what was not synced may be lost.
    /// The file is cut after its last written block first (when the writer
    /// grew it ahead); a failed cut is reported after the close.
    pub async fn close(mut self) -> Result<(), SegmentError> {
        self.settle_write_behind().await;
        let trimmed = self.trim().await;
        let end = self.durable_end;
        io_context(close_shared(self.file).await, "close segment", &self.path, end)?;
        trimmed.map(|_| ())
    }

    /// Bytes of frames appended and not yet sealed into a write.
    pub fn buffered_bytes(&self) -> usize {
        self.active_used - self.active_carried
    }

    /// Moves the buffered frames into a write (no I/O): what
    /// [`SegmentWriter::start_write_behind`] then writes. Fails with
    /// [`SegmentError::TooManyUnsynced`] when the writer holds as many
    /// unwritten buffers as it may.
    pub fn seal_buffered(&mut self) -> Result<(), SegmentError> {
        self.seal_active()
    }

    /// Starts writing the sealed buffers not written yet in a task of its
    /// own (see the module doc), unless one runs already or there is none.
    /// Returns whether it started one.
    pub fn start_write_behind(&mut self) -> bool {
        if self.behind.is_some() {
            return false;
        }
        let writes: Vec<WriteRequests> =
            self.unsynced.iter().filter(|pending| !pending.written).map(PendingWrite::requests).collect();
        let Some(last) = self.unsynced.back().filter(|_| !writes.is_empty()) else { return false };
        // Counted allocated now; a failure reaches `reap_write_behind`.
        let allocation = self.allocation_for(last.file_end());
        if let Some(size) = allocation {
            self.allocated_after(size, true);
        }
        let state = Rc::new(BehindState::default());
        let task = write_behind(self.file.clone(), self.path.clone(), allocation, writes, state.clone());
        glommio::spawn_local(task).detach();
        self.behind = Some(state);
        true
    }

    /// The running write-behind, to wait for it.
    pub fn write_behind(&self) -> Option<WriteBehind> {
        self.behind.as_ref().map(|state| WriteBehind(state.clone()))
    }

    /// Takes the outcome of a write-behind that has ended: its writes count
    /// as written; one that failed is written again by the next flush or
    /// write-behind. Returns its error, if any; nothing while it runs.
    pub fn reap_write_behind(&mut self) -> Option<SegmentError> {
        let state = self.behind.as_ref()?;
        let (done, error) = state.outcome.borrow_mut().take()?;
        if state.allocation_failed.get() {
            self.allocated_after(0, false);
        }
        self.behind = None;
        // The task wrote the first `done` buffers that were unwritten when
        // it started, in order; buffers sealed since come after them.
        for pending in self.unsynced.iter_mut().filter(|pending| !pending.written).take(done) {
            pending.written = true;
            self.written_end = pending.end;
            self.written_next_offset = pending.next_offset;
        }
        error
    }

    /// Waits for a running write-behind and takes its outcome (an error is
    /// dropped: the caller writes the same buffers again itself).
    async fn settle_write_behind(&mut self) {
        if let Some(state) = self.behind.clone() {
            WriteBehind(state).ended().await;
            let _ = self.reap_write_behind();
        }
    }

    /// The file, for an fdatasync that must not wait for the writer (a
    /// checkpoint): it covers every write done before it starts.
    pub fn file_handle(&self) -> Rc<DmaFile> {
        self.file.clone()
    }
}

/// Grows the file to `allocation` first, when given, then writes `writes`
/// in order (they overlap by a rewritten block) and reports how many were
/// done, and why it stopped, into `state`.
async fn write_behind(
    file: Rc<DmaFile>,
    path: PathBuf,
    allocation: Option<u64>,
    writes: Vec<WriteRequests>,
    state: Rc<BehindState>,
) {
    if let Some(size) = allocation {
        state.allocation_failed.set(!allocate(&file, size).await);
    }
    let mut done = 0;
    let mut failed = None;
    for write in writes {
        match write.write(&file, &path).await {
            Ok(()) => done += 1,
            Err(error) => {
                failed = Some(error);
                break;
            }
        }
    }
    state.outcome.replace(Some((done, failed)));
    state.done.set(true);
    state.ended.wake_all();
}

/// Closes a file that a checkpoint's fdatasync may still share: the last
/// owner's drop closes it then.
async fn close_shared(file: Rc<DmaFile>) -> Result<(), GlommioError<()>> {
    match Rc::try_unwrap(file) {
        Ok(file) => file.close().await,
        Err(_) => Ok(()),
    }
}

/// The name every probe file starts with: `<prefix><pid>-<thread>`.
pub const PROBE_FILE_PREFIX: &str = ".spate-dma-probe-";
/// Directories [`prime_dma_probe`] searches for an existing file to probe
/// with when it cannot write its own: the partition directory and its
/// parents up to the data directory (`streams/<stream>/<partition>`).
const PROBE_STAND_IN_DEPTH_MAX: usize = 4;
/// Directory entries looked at per directory in that search.
const PROBE_STAND_IN_ENTRIES_MAX: usize = 4096;

thread_local! {
    /// Devices (`st_dev`) whose io_uring poll support glommio has probed on
    /// this thread with a real read.
    static PROBED_DEVICES: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The first probe file this thread could not write (the disk was full),
    /// where an existing file stood in: its shard starts read-only and
    /// checks, by writing a probe file again, when writing works again.
    static PROBE_WRITE_FAILURE: std::cell::RefCell<Option<(PathBuf, SegmentError)>> =
        const { std::cell::RefCell::new(None) };
}

/// Makes glommio's first open of a DMA file on `dir`'s device (per thread)
/// probe a non-empty file.
///
/// glommio 0.9 decides once per device and thread whether reads and writes
/// go to its I/O-poll ring, by reading one block at position 0 of the first
/// DMA file opened there. When that file is empty (a new segment) the read
/// returns 0 bytes without reaching the device, the probe "succeeds", and
/// every later read of a non-empty file fails with EOPNOTSUPP on a device
/// without poll queues (virtio-blk here). Opening a one-block file first
/// makes the probe see the truth.
///
/// When that file cannot be written (a full disk), any existing non-empty
/// file on the device does as well: a segment in `dir`, or a file in a
/// parent (the catalog). The failed write is kept for
/// [`take_probe_write_failure`]. The probe file is removed on every path;
/// only when no file can stand in does the write's error come back.
pub async fn prime_dma_probe(dir: &Path) -> Result<(), SegmentError> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(dir).map_err(io_error("stat directory", dir))?.dev();
    if PROBED_DEVICES.with(|devices| devices.borrow().contains(&device)) {
        return Ok(());
    }
    match write_probe_file(dir) {
        Ok(probe_path) => {
            let opened = DmaFile::open(&probe_path).await;
            let removed = std::fs::remove_file(&probe_path);
            let file = io_context(opened, "open probe file", &probe_path, 0)?;
            io_context(file.close().await, "close probe file", &probe_path, 0)?;
            removed.map_err(io_error("remove probe file", &probe_path))?;
        }
        Err(write_error) => {
            let Some(stand_in) = find_probe_stand_in(dir, device) else { return Err(write_error) };
            let file = io_context(DmaFile::open(&stand_in).await, "open probe stand-in", &stand_in, 0)?;
            io_context(file.close().await, "close probe stand-in", &stand_in, 0)?;
            PROBE_WRITE_FAILURE.with(|failure| {
                failure.borrow_mut().get_or_insert_with(|| (dir.to_path_buf(), write_error));
            });
        }
    }
    PROBED_DEVICES.with(|devices| devices.borrow_mut().push(device));
    Ok(())
}

/// The probe write that failed on this thread, if one did since the last
/// call: the directory and the error.
pub fn take_probe_write_failure() -> Option<(PathBuf, SegmentError)> {
    PROBE_WRITE_FAILURE.with(|failure| failure.borrow_mut().take())
}

/// Whether a block can be written in `dir` now: writes a probe file and
/// removes it (on failure too).
pub fn check_writable(dir: &Path) -> Result<(), SegmentError> {
    let probe_path = write_probe_file(dir)?;
    std::fs::remove_file(&probe_path).map_err(io_error("remove probe file", &probe_path))
}

/// Removes the probe files that earlier processes left in `dir` (a crash
/// between writing and removing one); returns how many. Files of this
/// process are left alone: another thread may be probing with one.
pub fn remove_stale_probe_files(dir: &Path) -> usize {
    let own_prefix = format!("{PROBE_FILE_PREFIX}{}-", std::process::id());
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let stale = entries.flatten().map(|entry| entry.path()).filter(|path| {
        let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
        name.starts_with(PROBE_FILE_PREFIX) && !name.starts_with(&own_prefix)
    });
    stale.filter(|path| std::fs::remove_file(path).is_ok()).count()
}

/// Writes this thread's one-block probe file in `dir`; on failure nothing
/// is left behind (the file is created before its block is written).
fn write_probe_file(dir: &Path) -> Result<PathBuf, SegmentError> {
    let thread = format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_ascii_alphanumeric(), "");
    let probe_path = dir.join(format!("{PROBE_FILE_PREFIX}{}-{thread}", std::process::id()));
    if let Err(source) = std::fs::write(&probe_path, [0u8; BLOCK_SIZE as usize]) {
        let _ = std::fs::remove_file(&probe_path);
        return Err(SegmentError::Io { op: "write probe file", path: probe_path, position: 0, source });
    }
    Ok(probe_path)
}

/// An existing non-empty file on `device`, in `dir` or one of its parents
/// (bounded search), to probe with instead of a new one.
fn find_probe_stand_in(dir: &Path, device: u64) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut current = Some(dir);
    for _ in 0..PROBE_STAND_IN_DEPTH_MAX {
        let here = current?;
        let entries = std::fs::read_dir(here).into_iter().flatten().flatten().take(PROBE_STAND_IN_ENTRIES_MAX);
        for entry in entries {
            if entry.file_name().to_string_lossy().starts_with(PROBE_FILE_PREFIX) {
                continue;
            }
            // `DirEntry::metadata` does not follow symlinks.
            let usable = entry.metadata().is_ok_and(|meta| meta.is_file() && meta.len() > 0 && meta.dev() == device);
            if usable {
                return Some(entry.path());
            }
        }
        current = here.parent();
    }
    None
}

fn io_error(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SegmentError {
    let path = path.to_path_buf();
    move |source| SegmentError::Io { op, path, position: 0, source }
}

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// fsyncs the directory holding `path`, so a created or renamed file stays.
pub(crate) async fn sync_parent_dir(path: &Path) -> Result<(), SegmentError> {
    let parent = parent_dir(path);
    let dir = io_context(glommio::io::Directory::open(parent).await, "open directory", parent, 0)?;
    io_context(dir.sync().await, "sync directory", parent, 0)?;
    io_context(dir.close().await, "close directory", parent, 0)
}

/// Writes an index sidecar atomically. On failure (a full disk) no
/// temporary file is left behind and the old sidecar, if any, stays.
pub async fn write_index_file(index_path: &Path, index: &SegmentIndex) -> Result<(), SegmentError> {
    let mut temporary = index_path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let written = write_index_through(&temporary, index_path, index).await;
    if written.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    written
}

/// [`write_index_file`] through `temporary`.
async fn write_index_through(temporary: &Path, index_path: &Path, index: &SegmentIndex) -> Result<(), SegmentError> {
    let temporary = temporary.to_path_buf();
    let mut bytes = Vec::with_capacity(index.encoded_size());
    index.encode(&mut bytes);
    prime_dma_probe(parent_dir(index_path)).await?;
    let opened = OpenOptions::new().write(true).create(true).truncate(true).dma_open(&temporary).await;
    let file = io_context(opened, "create index", &temporary, 0)?;
    let mut buffer = file.alloc_dma_buffer(align_up(bytes.len() as u64, BLOCK_SIZE) as usize);
    buffer.as_bytes_mut().fill(0);
    buffer.as_bytes_mut()[..bytes.len()].copy_from_slice(&bytes);
    let expected = buffer.len();
    let written = io_context(file.write_at(buffer, 0).await, "write index", &temporary, 0)?;
    if written != expected {
        return Err(SegmentError::ShortWrite { path: temporary, position: 0, written, expected });
    }
    io_context(file.truncate(bytes.len() as u64).await, "truncate index", &temporary, 0)?;
    io_context(file.fdatasync().await, "fdatasync index", &temporary, 0)?;
    io_context(file.rename(index_path).await, "rename index", &temporary, 0)?;
    io_context(file.close().await, "close index", index_path, 0)?;
    sync_parent_dir(index_path).await
}

/// What [`SegmentReader::read_frames`] put in the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramesRead {
    /// File position of the first frame read.
    pub position: u64,
    /// Offset of the first record of the first frame (at or before the
    /// offset asked for).
    pub base_offset: u64,
    /// The offset after the last record read.
    pub next_offset: u64,
    pub frame_count: u32,
    pub byte_count: usize,
}

/// Reads a sealed or active segment with aligned DMA reads.
pub struct SegmentReader {
    file: DmaFile,
    path: PathBuf,
}

impl SegmentReader {
    pub async fn open(path: &Path) -> Result<SegmentReader, SegmentError> {
        prime_dma_probe(parent_dir(path)).await?;
        let file = io_context(DmaFile::open(path).await, "open segment", path, 0)?;
        Ok(SegmentReader { file, path: path.to_path_buf() })
    }

    /// Appends the file's bytes `position .. position + size` to `out`
    /// (fewer at the end of the file) and returns how many. The read itself
    /// is widened to whole blocks.
    pub async fn read_into(&self, position: u64, size: usize, out: &mut Vec<u8>) -> Result<usize, SegmentError> {
        let start = align_down(position, BLOCK_SIZE);
        let end = align_up(position + size as u64, BLOCK_SIZE);
        let result = crate::runtime::submit::submitted(self.file.read_at_aligned(start, (end - start) as usize)).await;
        let data = io_context(result, "read segment", &self.path, start)?;
        let skip = (position - start) as usize;
        let available = data.len().saturating_sub(skip).min(size);
        out.extend_from_slice(&data[skip..skip + available]);
        Ok(available)
    }

    /// Appends to `out` whole, CRC-checked frames from the one holding
    /// `offset`, up to `bytes_max` bytes (at least one frame) and never past
    /// `readable_end` (the index's log size for a sealed segment, the
    /// writer's written or durable end for the active one). Seeks through
    /// `index`, then walks at most one index interval of frame headers.
    pub async fn read_frames(
        &self,
        index: &SegmentIndex,
        offset: u64,
        readable_end: u64,
        bytes_max: usize,
        out: &mut Vec<u8>,
    ) -> Result<FramesRead, SegmentError> {
        let out_of_range = || SegmentError::OutOfRange { path: self.path.clone(), offset, readable_end };
        let mut position = index.lookup(offset).ok_or_else(out_of_range)?;
        let mut chunk = Vec::new();
        let mut chunk_position = position;
        loop {
            if position >= readable_end {
                return Err(out_of_range());
            }
            let in_chunk = (position - chunk_position) as usize;
            let header = match chunk.get(in_chunk..).map(parse_header) {
                Some(Ok(header)) if in_chunk + header.frame_size() <= chunk.len() => header,
                _ => {
                    // Read from this frame on: enough for the request, or
                    // for the whole frame once its header is known.
                    let frame_size =
                        chunk.get(in_chunk..).and_then(|rest| parse_header(rest).ok()).map(|h| h.frame_size());
                    let want = bytes_max.max(frame_size.unwrap_or(FRAME_HEADER_SIZE)).max(BLOCK_SIZE as usize);
                    let want = want.min((readable_end - position) as usize);
                    chunk.clear();
                    chunk_position = position;
                    self.read_into(position, want, &mut chunk).await?;
                    let header = parse_header(&chunk).map_err(|error| self.frame_error(position, error))?;
                    if header.frame_size() > chunk.len() {
                        let error = FrameError::Truncated { needed: header.frame_size(), available: chunk.len() };
                        return Err(self.frame_error(position, error));
                    }
                    continue;
                }
            };
            if header.contains(offset) {
                return self.take_frames(&chunk[in_chunk..], position, bytes_max, out);
            }
            position += header.frame_size() as u64;
        }
    }

    fn frame_error(&self, position: u64, error: FrameError) -> SegmentError {
        SegmentError::Frame { path: self.path.clone(), position, error }
    }

    /// Copies the whole frames at the start of `bytes` (read from
    /// `position`) into `out`, checking each, up to `bytes_max`.
    fn take_frames(
        &self,
        bytes: &[u8],
        position: u64,
        bytes_max: usize,
        out: &mut Vec<u8>,
    ) -> Result<FramesRead, SegmentError> {
        let mut read = FramesRead { position, base_offset: 0, next_offset: 0, frame_count: 0, byte_count: 0 };
        while read.byte_count < bytes.len() {
            let frame = match decode_frame(&bytes[read.byte_count..]) {
                Ok(frame) => frame,
                // A bad frame after good ones is reported by the next read,
                // which starts at it.
                Err(_) if read.frame_count > 0 => break,
                Err(error) => return Err(self.frame_error(position + read.byte_count as u64, error)),
            };
            let frame_size = frame.header.frame_size();
            if read.frame_count > 0
                && (read.byte_count + frame_size > bytes_max || frame.header.base_offset != read.next_offset)
            {
                break;
            }
            if read.frame_count == 0 {
                read.base_offset = frame.header.base_offset;
            }
            out.extend_from_slice(&bytes[read.byte_count..read.byte_count + frame_size]);
            read.byte_count += frame_size;
            read.frame_count += 1;
            read.next_offset = frame.header.next_offset();
        }
        Ok(read)
    }

    pub async fn close(self) -> Result<(), SegmentError> {
        io_context(self.file.close().await, "close segment", &self.path, 0)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::future::Future;
    use std::os::fd::AsRawFd;

    use glommio::{LocalExecutorBuilder, Placement};

    use super::*;
    use crate::storage::format::{ScanCursor, ScanStop, scan};

    /// Runs `future` on a fresh glommio executor (small io_memory: the test
    /// box's memlock limit is 8 MiB).
    pub(crate) fn run<T: 'static>(future: impl Future<Output = T> + 'static) -> T {
        let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(512 << 10).make();
        executor.expect("glommio executor").run(future)
    }

    /// An empty directory on a disk filesystem, so O_DIRECT is really on
    /// (glommio silently drops it on tmpfs).
    pub(crate) fn scratch_dir(name: &str) -> PathBuf {
        let mut base = std::env::temp_dir();
        let output = std::process::Command::new("stat").args(["-f", "-c", "%T"]).arg(&base).output();
        if output.is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "tmpfs") {
            base = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target");
        }
        let dir = base.join(format!("spate-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    pub(crate) fn o_direct_is_on(file: &DmaFile) -> bool {
        // SAFETY: F_GETFL on an open descriptor.
        let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        flags & libc::O_DIRECT != 0
    }

    /// Appends frame number `frame_index` (1 to 4 records) through the
    /// in-place encoder, or as copied bytes every third frame.
    pub(crate) fn append_test_frame(writer: &mut SegmentWriter, frame_index: usize) -> Result<(), SegmentError> {
        let base_offset = writer.next_offset();
        let payload = vec![b'a' + (frame_index % 26) as u8; (frame_index * 37) % 700];
        let record_count = 1 + frame_index % 4;
        if frame_index % 3 == 2 {
            let mut bytes = vec![0u8; 4 * (payload.len() + 64)];
            let mut encoder = FrameEncoder::new(&mut bytes).unwrap();
            for _ in 0..record_count {
                encoder.append(b"user42", &payload).unwrap();
            }
            let sealed = encoder.seal(writer.log_id(), base_offset, frame_index as u64).unwrap();
            return writer.append_frame(&bytes[..sealed.frame_size]);
        }
        let log_id = writer.log_id();
        let mut encoder = writer.frame_encoder()?;
        for _ in 0..record_count {
            encoder.append(b"user42", &payload).map_err(|error| SegmentError::Frame {
                path: PathBuf::new(),
                position: 0,
                error,
            })?;
        }
        let sealed = encoder.seal(log_id, base_offset, frame_index as u64).unwrap();
        writer.commit_encoded(sealed)
    }

    fn small_config() -> SegmentConfig {
        SegmentConfig { buffer_bytes: 16 << 10, unsynced_buffers_max: 2, ..SegmentConfig::default() }
    }

    /// Frames appended with syncs in between read back whole from the
    /// file, in order, through O_DIRECT, and the file ends in zeros on a
    /// block boundary.
    #[test]
    fn writer_round_trip_on_disk() {
        let dir = scratch_dir("round-trip");
        let path = dir.join("00000000000000001000.log");
        let (log_end, next_offset) = run({
            let path = path.clone();
            async move {
                let mut writer = SegmentWriter::create(&path, 7, 1000, small_config()).await.unwrap();
                assert!(o_direct_is_on(&writer.file), "O_DIRECT must be on for this test");
                for frame_index in 0..300 {
                    append_test_frame(&mut writer, frame_index).unwrap();
                    if frame_index % 5 == 4 {
                        let end = writer.end();
                        assert_eq!(writer.sync().await.unwrap(), end);
                        assert_eq!(writer.durable(), (end, writer.next_offset()));
                    }
                }
                append_test_frame(&mut writer, 300).unwrap();
                assert_eq!(writer.flush().await.unwrap(), writer.end());
                assert!(writer.durable().0 < writer.end());
                writer.sync().await.unwrap();
                let result = (writer.end(), writer.next_offset());
                writer.close().await.unwrap();
                result
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, align_up(log_end, BLOCK_SIZE));
        let outcome = scan(&bytes, 7, ScanCursor::at_segment_start(1000));
        assert_eq!(outcome.stop, if bytes.len() as u64 == log_end { ScanStop::EndOfData } else { ScanStop::Zeros });
        assert_eq!(
            (outcome.cursor.position, outcome.cursor.next_offset, outcome.cursor.frame_count),
            (log_end, next_offset, 301)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A writer grows its file ahead of its writes (zeros past the last
    /// frame, a clean end); a crash leaves that, and recovery keeps every
    /// frame and cuts the file after its last block; sealing cuts it too.
    #[test]
    fn a_writer_grows_its_file_ahead_and_cuts_it_when_sealed() {
        let dir = scratch_dir("allocate-ahead");
        let path = dir.join("00000000000000000000.log");
        let file_len = |path: &Path| std::fs::metadata(path).unwrap().len();
        let (end, next_offset) = run({
            let path = path.clone();
            async move {
                let mut writer = SegmentWriter::create(&path, 5, 0, small_config()).await.unwrap();
                for frame_index in 0..40 {
                    append_test_frame(&mut writer, frame_index).unwrap();
                    if frame_index % 7 == 6 {
                        writer.sync().await.unwrap();
                    }
                    if frame_index == 22 {
                        // A write-behind grows the file as a flush does.
                        writer.seal_buffered().unwrap();
                        assert!(writer.start_write_behind());
                        writer.write_behind().unwrap().ended().await;
                        assert!(writer.reap_write_behind().is_none());
                    }
                }
                writer.sync().await.unwrap();
                assert!(writer.allocated && !writer.allocation_off);
                let end = writer.end();
                assert!(end < ALLOCATE_STEP_MIN, "the test stays inside the first step");
                assert_eq!(file_len(&path), ALLOCATE_STEP_MIN, "grown by the first step");
                // Dropped without a close: what kill -9 leaves.
                let result = (end, writer.next_offset());
                drop(writer);
                result
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes[end as usize..].iter().all(|&byte| byte == 0), "zeros past the last frame");
        let outcome = scan(&bytes, 5, ScanCursor::at_segment_start(0));
        assert_eq!(
            (outcome.stop, outcome.cursor.position, outcome.cursor.next_offset),
            (ScanStop::Zeros, end, next_offset)
        );
        run({
            let path = path.clone();
            async move {
                let (mut writer, report) =
                    crate::storage::recovery::recover_segment(&path, 5, 0, small_config()).await.unwrap();
                assert!(report.outcome.stop.is_clean(), "{:?}", report.outcome.stop);
                assert_eq!((writer.end(), writer.next_offset()), (end, next_offset));
                assert_eq!(file_len(&path), align_up(end, BLOCK_SIZE), "recovery cuts after the last block");
                for frame_index in 40..50 {
                    append_test_frame(&mut writer, frame_index).unwrap();
                }
                writer.flush().await.unwrap();
                assert!(file_len(&path) > align_up(writer.end(), BLOCK_SIZE), "grown again");
                let end = writer.end();
                writer.seal(&path.with_extension("index")).await.unwrap();
                assert_eq!(file_len(&path), align_up(end, BLOCK_SIZE), "sealing cuts after the last block");
            }
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A flush hands the encode buffer itself to its write, trimmed to what
    /// it writes (past a head when it rewrites a partial block), and the
    /// writer goes on in a fresh buffer of [`ACTIVE_BYTES_MIN`] that starts
    /// with the partial block; `reserve` grows a buffer for a round, and
    /// everything reads back after a crash.
    #[test]
    fn a_flush_hands_its_buffer_to_the_write_and_starts_a_fresh_one() {
        let dir = scratch_dir("handoff");
        let path = dir.join("00000000000000000000.log");
        let config = SegmentConfig::default();
        let (end, next_offset) = run({
            let path = path.clone();
            async move {
                let mut writer = SegmentWriter::create(&path, 5, 0, config).await.unwrap();
                assert_eq!(writer.active.len(), ACTIVE_BYTES_MIN);
                let mut frame_index = 0;
                for round in 0..6 {
                    // A round: room for its frames first, then its frames.
                    writer.reserve(700 << 10);
                    assert!(writer.active.len() >= writer.active_used + (700 << 10), "round {round}");
                    assert!(writer.active.len() <= config.buffer_bytes);
                    let started = writer.end();
                    while writer.end() - started < 600 << 10 {
                        append_test_frame(&mut writer, frame_index).unwrap();
                        frame_index += 1;
                    }
                    let (position, carried, used) = (writer.active_position, writer.active_carried, writer.active_used);
                    writer.seal_buffered().unwrap();
                    let pending = writer.unsynced.back().unwrap();
                    let write_size = align_up(used as u64, BLOCK_SIZE) as usize;
                    assert_eq!(pending.position, position);
                    assert_eq!(pending.len(), write_size, "round {round}");
                    assert_eq!(pending.head.is_some(), carried > 0, "a partial block goes as a head");
                    assert_eq!(writer.active.len(), ACTIVE_BYTES_MIN, "a fresh buffer");
                    assert_eq!(writer.active_used, used % BLOCK_SIZE as usize, "holding the partial block");
                    assert!(writer.start_write_behind());
                    writer.write_behind().unwrap().ended().await;
                    assert!(writer.reap_write_behind().is_none());
                    writer.drop_written();
                }
                // Without a reserve a fresh buffer fills and flushes.
                while writer.end() < 5 << 20 {
                    if writer.active.len() - writer.active_used < 8 << 10 {
                        writer.sync().await.unwrap();
                    }
                    append_test_frame(&mut writer, frame_index).unwrap();
                    frame_index += 1;
                }
                writer.flush().await.unwrap();
                let result = (writer.end(), writer.next_offset());
                drop(writer);
                result
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        let outcome = scan(&bytes, 5, ScanCursor::at_segment_start(0));
        assert_eq!(
            (outcome.stop, outcome.cursor.position, outcome.cursor.next_offset),
            (ScanStop::Zeros, end, next_offset)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The reader finds every offset through the index with aligned reads,
    /// and returns whole checked frames within its byte budget.
    #[test]
    fn reader_finds_every_offset() {
        let dir = scratch_dir("reader");
        let path = dir.join("00000000000000000000.log");
        run(async move {
            let mut writer = SegmentWriter::create(&path, 3, 0, small_config()).await.unwrap();
            for frame_index in 0..120 {
                append_test_frame(&mut writer, frame_index).unwrap();
                if frame_index % 10 == 0 {
                    writer.sync().await.unwrap();
                }
            }
            writer.sync().await.unwrap();
            let reader = SegmentReader::open(&path).await.unwrap();
            let (readable_end, next_offset) = writer.durable();
            for offset in 0..next_offset {
                let mut out = Vec::new();
                let read = reader.read_frames(writer.index(), offset, readable_end, 2000, &mut out).await.unwrap();
                assert!(read.base_offset <= offset && offset < read.next_offset, "offset {offset}: {read:?}");
                assert!(read.frame_count == 1 || read.byte_count <= 2000);
                assert_eq!(out.len(), read.byte_count);
                let outcome = scan(&out, 3, ScanCursor { next_offset: read.base_offset, ..ScanCursor::default() });
                assert_eq!(
                    (outcome.stop, outcome.cursor.frame_count),
                    (ScanStop::EndOfData, u64::from(read.frame_count))
                );
            }
            let mut out = Vec::new();
            let past = reader.read_frames(writer.index(), next_offset, readable_end, 2000, &mut out).await;
            assert!(matches!(past, Err(SegmentError::OutOfRange { .. })));
            assert_eq!(reader.read_into(5, 10, &mut out).await.unwrap(), 10);
            assert_eq!(out, std::fs::read(&path).unwrap()[5..15]);
            reader.close().await.unwrap();
            writer.close().await.unwrap();
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Probe files of earlier processes are removed, this process's are
    /// not, and a write check leaves no file behind.
    #[test]
    fn stale_probe_files_are_removed() {
        let dir = scratch_dir("stale-probes");
        let stale = dir.join(format!("{PROBE_FILE_PREFIX}1-ThreadId2"));
        let own = dir.join(format!("{PROBE_FILE_PREFIX}{}-ThreadId2", std::process::id()));
        let segment = dir.join("00000000000000000000.log");
        for path in [&stale, &own, &segment] {
            std::fs::write(path, b"").unwrap();
        }
        assert_eq!(remove_stale_probe_files(&dir), 1);
        assert!(!stale.exists() && own.exists() && segment.exists());
        std::fs::remove_file(&own).unwrap();
        check_writable(&dir).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only the segment is left");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// On a full filesystem the probe leaves no file: it fails when no
    /// existing file can stand in, and succeeds with one that can, keeping
    /// the failed write for the shard to report. Needs root to mount a
    /// small tmpfs; skipped otherwise.
    #[test]
    fn a_full_disk_leaves_no_probe_file() {
        let dir = scratch_dir("probe-full");
        if !crate::storage::mount_tmpfs(&dir, "256k") {
            return;
        }
        let partition = dir.join("streams").join("default").join("0");
        std::fs::create_dir_all(&partition).unwrap();
        let mut filler = std::fs::File::create(dir.join("filler")).unwrap();
        while std::io::Write::write_all(&mut filler, &[1u8; 4096]).is_ok() {}
        let probes = |dir: &Path| {
            std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .filter(|entry| entry.file_name().to_string_lossy().starts_with(PROBE_FILE_PREFIX))
                .count()
        };
        let (no_stand_in, with_stand_in) = run({
            let partition = partition.clone();
            async move {
                std::fs::write(partition.join("empty"), b"").unwrap();
                // One level below a partition directory: the search (up to
                // the data directory, PROBE_STAND_IN_DEPTH_MAX levels) does
                // not reach the filler at the root, and finds only the
                // empty file on its way.
                let lonely = partition.join("lonely");
                std::fs::create_dir_all(&lonely).unwrap();
                let no_stand_in = prime_dma_probe(&lonely).await;
                (no_stand_in, prime_dma_probe(&partition).await)
            }
        });
        let error = no_stand_in.expect_err("nothing non-empty to probe with");
        assert!(error.is_storage_full(), "{error}");
        with_stand_in.unwrap();
        assert_eq!(probes(&partition) + probes(&partition.join("lonely")), 0, "no probe file is left");
        let (failed_dir, failure) = take_probe_write_failure().expect("the failed write is kept");
        assert!(failure.is_storage_full() && failed_dir == partition, "{failure}");
        assert!(check_writable(&partition).unwrap_err().is_storage_full());
        assert_eq!(probes(&partition), 0);
        // Lazily: the probe's stand-in may still be open in the test's
        // executor thread, and a plain unmount would leave the tmpfs behind.
        let _ = std::process::Command::new("umount").arg("-l").arg(&dir).status();
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The writer refuses what breaks its limits or the log, with errors
    /// that say what to do, and stays usable after each.
    #[test]
    fn writer_limits() {
        let dir = scratch_dir("limits");
        let path = dir.join("00000000000000000000.log");
        run(async move {
            let config = SegmentConfig { segment_bytes_max: 64 << 10, ..small_config() };
            let mut writer = SegmentWriter::create(&path, 1, 0, config).await.unwrap();
            assert!(SegmentWriter::create(&path, 1, 0, config).await.is_err(), "create must not reuse a file");
            let mut encoder = writer.frame_encoder().unwrap();
            assert!(matches!(encoder.append(b"k", &vec![0; 20 << 10]), Err(FrameError::FrameFull { .. })));
            let mut foreign = vec![0u8; 128];
            let mut other = FrameEncoder::new(&mut foreign).unwrap();
            other.append(b"k", b"v").unwrap();
            let sealed = other.seal(2, 0, 0).unwrap();
            assert!(matches!(writer.append_frame(&foreign[..sealed.frame_size]), Err(SegmentError::NotNext { .. })));
            // Flushed buffers pile up without a sync until the limit.
            let mut frame_index = 0;
            let outcome = loop {
                append_test_frame(&mut writer, frame_index).unwrap();
                frame_index += 1;
                if let Err(error) = writer.flush().await {
                    break error;
                }
            };
            assert!(matches!(outcome, SegmentError::TooManyUnsynced { buffer_count: 2 }), "{outcome}");
            writer.sync().await.unwrap();
            let full = loop {
                if let Err(error) = append_test_frame(&mut writer, frame_index) {
                    break error;
                }
                frame_index += 1;
                if writer.end() > 12 << 10 {
                    writer.sync().await.unwrap();
                }
            };
            assert!(matches!(full, SegmentError::SegmentFull { .. } | SegmentError::BufferFull { .. }), "{full}");
            writer.sync().await.unwrap();
            assert!(writer.end() <= 64 << 10);
            writer.close().await.unwrap();
        });
        std::fs::remove_dir_all(dir).unwrap();
    }
}
