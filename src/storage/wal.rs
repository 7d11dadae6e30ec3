//! One write-ahead log per shard: every commit round's new frames, for all
//! the shard's partitions, in one sequential DMA write and, when the fsync
//! policy asks, one fdatasync.
//!
//! # Why
//!
//! A commit round that fdatasyncs each dirty partition's segment file is
//! bound by that many flushes: with 128 partitions dirty, a `#SYNC` took
//! p50 16 – 25 ms where one fdatasync on this disk takes about 0.2 ms
//! (README, "Layout"). With the log below a round costs one flush whatever
//! the number of partitions; the segment files are still written every
//! round (readers, retention and migration use them as before) but made
//! durable in bulk by a checkpoint every few seconds
//! ([`crate::shard::commit`]).
//!
//! # Layout
//!
//! ```text
//! <data-dir>/wal/shard-<N>/0000.wal .. 0003.wal   a ring of WAL_FILE_COUNT files, file_bytes each
//! <data-dir>/wal/shard-<N>/checkpoint             two 4 KiB slots, the newest valid one counts
//! ```
//!
//! A position in the log (`lsn`) counts bytes from the start of the log's
//! life and only grows: it lives in file `(lsn / file_bytes) % 4`, at
//! `lsn % file_bytes`. Files are recycled, never truncated: after the first
//! lap every write overwrites allocated blocks, so an append plus
//! fdatasync needs no metadata journal commit (`benches/disk_layout.rs`
//! measured 95 µs p50 for a 4 KiB append + fdatasync into a zero-filled
//! file against 230 – 280 µs growing it).
//!
//! # Allocation ahead
//!
//! The first lap allocates the files as the log reaches them, without
//! zero-filling 4 files up front (that would cost every new server, test
//! or small disk a quarter GB of writes). Between rounds the committer
//! keeps [`ALLOCATE_AHEAD_BYTES`] past the log's end allocated
//! ([`Wal::allocate_ahead`]): one chunk of [`ALLOCATE_CHUNK_BYTES`] zeros
//! written at a time past what the file holds, then fdatasynced (which
//! commits the new size). So a round's write lands in allocated blocks
//! within the file's size, and its fdatasync flushes data only: on this
//! box's ext4 (no journal) a growing fdatasync also writes the inode, which
//! cost a round about 80 µs of its fdatasync and 40 µs of its write at
//! p50 (`scripts/bench-sync`, README). The zeros read as the log's end
//! (no record magic), as a fresh file's end does. A log that writes
//! without pause (no idle moment between rounds) grows its files as
//! before, and so does one on a filesystem with less than
//! [`ALLOCATE_FREE_BYTES_MIN`] (or a sixteenth of it) free: zeros never
//! take the room a small or nearly full disk needs for data. Once a lap is
//! done every file is allocated and nothing more is written.
//!
//! # Rounds that bypass the log
//!
//! Under `--fsync interval` (with `--wal-bypass on`, the default) a round
//! whose log write would carry a block or more per partition it touched
//! ([`crate::shard::commit`]) does not write the log: its records stay in
//! the log's memory, its frames are written straight to their segment
//! files in the round (so they survive `kill -9`, as a written log record
//! would), and when a sync is due one `syncfs` of the segments' filesystem
//! makes every written segment durable; the log then starts again at its
//! next file ([`Wal::restart_after_direct_sync`]) with a checkpoint there,
//! so the records it held in memory are never written. A `#SYNC` that
//! comes while such records are held is answered the same way when its
//! round is large; a small round writes and fdatasyncs the log as usual,
//! those records with it (not after a round that skipped the log, below).
//! So at a high rate every byte is written once
//! (measured here: 435 – 459 MB of device writes for 381 MB of segments,
//! against 786 – 816 MB through the log), and at a low rate over many
//! partitions, where a direct write would rewrite a whole block for a few
//! bytes, the log still batches them. The records held are bounded like
//! any unsynced bytes (`--fsync-pending-bytes-max`, then a sync). Under
//! `--fsync always` every round syncs, so a round bypasses the log only
//! when it is large enough for a `#SYNC` round to (4 MiB), and is synced
//! by `syncfs` in the round.
//!
//! A round whose records alone (what the tail caches hold past the
//! writers' ends, counted before encoding) make it large enough to bypass
//! does not copy them into the log's memory at all: no copy, no CRC, no
//! write buffer for records that would never be written (about 5 % of the
//! server's CPU under disk ingest). The log then lacks records that are
//! not durable yet, so until a `syncfs` (or a direct sync) covers them,
//! every round bypasses the log (what each writer holds is written in the
//! round) and every sync goes through the filesystem, a small `#SYNC`
//! round's too; a failed `syncfs` falls back to an fdatasync of each
//! written segment file instead of the log (and so does every sync until
//! one succeeds), and a round that fails is followed by a filesystem sync.
//! Replay after a crash stops at the first frame that does not continue
//! its segment, so a log record past such a hole is never appended to a
//! segment that lost the records before it.
//!
//! # Record
//!
//! ```text
//! offset size field
//!      0    4 magic     "SPTW"
//!      4    1 kind      1: frames, 2: skip to the next file
//!      5    3 reserved  zero
//!      8    4 body_len  u32 LE
//!     12    4 epoch     u32 LE, the server run that wrote it (from the checkpoint)
//!     16    8 lsn       u64 LE, the record's own position
//!     24    4 crc32c    CRC32C of bytes 0..24, then of the body
//!     28    4 reserved  zero
//!     32      body      whole segment frames (src/storage/format.rs), back to back
//! ```
//!
//! Records are packed and never cross a file's end: a record that does not
//! fit is preceded by a skip record (or, with less than a header left, by
//! nothing) and starts the next file. A record counts only with the
//! expected `lsn` and `epoch`, a matching CRC and a body of whole valid
//! frames: stale bytes of an earlier lap carry an older `lsn`, bytes of an
//! earlier run another `epoch`, so either reads as the end of the log. As
//! in segment files, the partial last block is rewritten by the next write
//! (old and new contents agree up to the old end, so a torn rewrite keeps
//! every synced record).
//!
//! # Checkpoint and recycling
//!
//! The checkpoint names the position before which every frame is in synced
//! segment files; files wholly before it are free. It is written in place,
//! alternating between two CRC-checked 4 KiB slots (one DMA write and one
//! fdatasync, no rename, no directory sync), so a torn write leaves the
//! other slot valid. A run starts by writing a checkpoint with a new epoch
//! at the position it will write from; nothing before that write reaches
//! the log.
//!
//! # Recovery
//!
//! [`read_all`] runs once at start-up, before any shard opens: it reads
//! every `wal/shard-*` directory from its checkpoint (a partition's last
//! frames may sit in the log of a shard that owned it before a migration,
//! and `--shards` may have changed) and keeps each log's frames, which the
//! shards then append to the segments they recover (frames at or below a
//! segment's end are skipped; a log that no longer exists is skipped).
//! Only once every shard has done so does any shard start a new epoch.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};

use super::format::{FrameError, decode_frame, parse_header};
use super::index::SegmentIndex;
use super::segment::{BLOCK_SIZE, SegmentError, align_down, align_up, io_context, sync_parent_dir};
use crate::runtime::log;

/// The directory under the data directory that holds every shard's log.
pub const WAL_DIR_NAME: &str = "wal";
/// Files in one shard's ring.
pub const WAL_FILE_COUNT: u64 = 4;
/// Bytes of a record's header.
pub const RECORD_HEADER_SIZE: usize = 32;
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"SPTW");
const KIND_FRAMES: u8 = 1;
const KIND_SKIP: u8 = 2;
const CHECKPOINT_FILE_NAME: &str = "checkpoint";
const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"SPTC");
const CHECKPOINT_VERSION: u32 = 1;
const CHECKPOINT_SIZE: usize = 48;
/// Bytes the start-up read takes from a log file at once.
const READ_CHUNK_BYTES: usize = 8 << 20;

/// `<data-dir>/wal/shard-<shard>`.
pub fn wal_dir(data_dir: &Path, shard: u16) -> PathBuf {
    data_dir.join(WAL_DIR_NAME).join(format!("shard-{shard}"))
}

fn file_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:04}.wal"))
}

/// How a log's bytes are spread over its files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalGeometry {
    pub file_bytes: u64,
    pub file_count: u64,
}

impl WalGeometry {
    /// [`WAL_FILE_COUNT`] files sharing `wal_bytes_max` (whole blocks each).
    pub fn for_bytes_max(wal_bytes_max: u64) -> WalGeometry {
        WalGeometry { file_bytes: align_down(wal_bytes_max / WAL_FILE_COUNT, BLOCK_SIZE), file_count: WAL_FILE_COUNT }
    }

    fn file_index(&self, lsn: u64) -> u64 {
        (lsn / self.file_bytes) % self.file_count
    }

    fn generation(&self, lsn: u64) -> u64 {
        lsn / self.file_bytes
    }

    fn file_end(&self, lsn: u64) -> u64 {
        (lsn / self.file_bytes + 1) * self.file_bytes
    }

    /// Whether a write at `lsn` would overwrite bytes at or after
    /// `checkpoint_lsn` (a file not yet free).
    fn overruns(&self, lsn: u64, checkpoint_lsn: u64) -> bool {
        self.generation(lsn) >= self.generation(checkpoint_lsn) + self.file_count
    }
}

/// What the checkpoint file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Counts the checkpoint's writes; picks the slot and the newest.
    pub sequence: u64,
    /// The run whose records follow.
    pub epoch: u32,
    /// Every frame before it is in synced segment files.
    pub lsn: u64,
    pub geometry: WalGeometry,
}

impl Checkpoint {
    fn encode(&self, block: &mut [u8]) {
        block.fill(0);
        block[0..4].copy_from_slice(&CHECKPOINT_MAGIC.to_le_bytes());
        block[4..8].copy_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
        block[8..16].copy_from_slice(&self.sequence.to_le_bytes());
        block[16..20].copy_from_slice(&self.epoch.to_le_bytes());
        block[24..32].copy_from_slice(&self.lsn.to_le_bytes());
        block[32..40].copy_from_slice(&self.geometry.file_bytes.to_le_bytes());
        block[40..48].copy_from_slice(&self.geometry.file_count.to_le_bytes());
        let crc = crc32c::crc32c(&block[..CHECKPOINT_SIZE]);
        block[CHECKPOINT_SIZE..CHECKPOINT_SIZE + 4].copy_from_slice(&crc.to_le_bytes());
    }

    fn decode(block: &[u8]) -> Option<Checkpoint> {
        if block.len() < CHECKPOINT_SIZE + 4 || u32_at(block, 0) != CHECKPOINT_MAGIC {
            return None;
        }
        if u32_at(block, 4) != CHECKPOINT_VERSION || u32_at(block, CHECKPOINT_SIZE) != crc32c::crc32c(&block[..48]) {
            return None;
        }
        let geometry = WalGeometry { file_bytes: u64_at(block, 32), file_count: u64_at(block, 40) };
        let sane = geometry.file_bytes >= 2 * BLOCK_SIZE
            && geometry.file_bytes.is_multiple_of(BLOCK_SIZE)
            && (1..=64).contains(&geometry.file_count);
        sane.then(|| Checkpoint {
            sequence: u64_at(block, 8),
            epoch: u32_at(block, 16),
            lsn: u64_at(block, 24),
            geometry,
        })
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The newest valid checkpoint of the log in `dir`, if any (blocking: start-up).
pub fn read_checkpoint(dir: &Path) -> io::Result<Option<Checkpoint>> {
    let bytes = match std::fs::read(dir.join(CHECKPOINT_FILE_NAME)) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let slots = bytes.chunks(BLOCK_SIZE as usize).take(2).filter_map(Checkpoint::decode);
    Ok(slots.max_by_key(|checkpoint| checkpoint.sequence))
}

fn record_crc(header: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&header[..24]), body)
}

fn write_record_header(header: &mut [u8], kind: u8, epoch: u32, lsn: u64, body: &[u8]) {
    header[..RECORD_HEADER_SIZE].fill(0);
    header[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
    header[4] = kind;
    header[8..12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    header[12..16].copy_from_slice(&epoch.to_le_bytes());
    header[16..24].copy_from_slice(&lsn.to_le_bytes());
    let crc = record_crc(header, body);
    header[24..28].copy_from_slice(&crc.to_le_bytes());
}

/// A write-ahead file operation that could not be done.
#[derive(Debug)]
pub enum WalError {
    /// The next write would overwrite a file the checkpoint has not freed.
    Full,
    Io(SegmentError),
}

impl From<SegmentError> for WalError {
    fn from(error: SegmentError) -> WalError {
        WalError::Io(error)
    }
}

/// A sealed buffer of records, written or not yet.
struct WalWrite {
    lsn: u64,
    buffer: Rc<DmaBuffer>,
    end_lsn: u64,
    written: bool,
    /// Handed to a [`WalIo`] not finished yet.
    in_flight: bool,
}

/// The writes of sealed records, in log order, to do off the writer
/// ([`Wal::start_writes`]) while the round's segment writes go on. They
/// overlap by the rewritten partial block, so they run one after another.
pub struct WalIo {
    writes: Vec<RecordWrite>,
}

/// How far past its end the log keeps its files allocated during its
/// first lap (module doc, "Allocation ahead").
pub const ALLOCATE_AHEAD_BYTES: u64 = 8 << 20;
/// One allocation: this many zero bytes written and fdatasynced (about
/// 1 ms of this box's disk).
pub const ALLOCATE_CHUNK_BYTES: u64 = 1 << 20;
/// An allocation writes one zeroed buffer of this size again and again, the
/// only memory it takes while it runs. Small on purpose: glibc serves it
/// from its heap, where a buffer of 1 MiB is mapped and unmapped, and each
/// unmapping raises glibc's mapping threshold to that size, after which
/// the ingest read buffers of large lines (up to 1 MiB) stayed in the heap
/// once freed (`tests/hostile.rs` `idle_connections_give_buffers_back`:
/// RSS +84 MiB against the 60 allowed).
pub const ALLOCATE_WRITE_BYTES: u64 = 64 << 10;
/// Allocation ahead leaves at least this much of the filesystem free (and
/// at least 1/16 of it): zeros must never take the room that data, a
/// checkpoint or a replay at the next start need on a small or full disk.
pub const ALLOCATE_FREE_BYTES_MIN: u64 = 256 << 20;

/// One write of a [`WalIo`]: the sealed buffer at `lsn`, its file, path
/// and position in it.
type RecordWrite = (u64, Rc<DmaBuffer>, Rc<DmaFile>, PathBuf, u64);

impl WalIo {
    /// Does the writes in order; returns the `lsn`s written, up to the
    /// first failure, and that failure.
    pub async fn run(self) -> (Vec<u64>, Option<SegmentError>) {
        let mut done = Vec::with_capacity(self.writes.len());
        for (lsn, buffer, file, path, position) in self.writes {
            let expected = buffer.len();
            let written = crate::runtime::submit::submitted(file.write_rc_at(buffer, position)).await;
            let written = io_context(written, "write write-ahead log", &path, position);
            match written {
                Ok(written) if written == expected => done.push(lsn),
                Ok(written) => {
                    let error = SegmentError::ShortWrite { path, position, written, expected };
                    return (done, Some(error));
                }
                Err(error) => return (done, Some(error)),
            }
        }
        (done, None)
    }
}

/// The writer of one shard's log. Owned by the committer, taken out of it
/// for an await like a segment writer.
pub struct Wal {
    dir: PathBuf,
    geometry: WalGeometry,
    epoch: u32,
    files: Vec<Rc<DmaFile>>,
    /// Records not sealed yet, from `active_lsn` (a block boundary).
    active: DmaBuffer,
    active_lsn: u64,
    used: usize,
    /// Bytes at the start of `active` already in a sealed write.
    carried: usize,
    /// Where in `active` the open record's header starts.
    record_at: Option<usize>,
    pending: VecDeque<WalWrite>,
    written_lsn: u64,
    synced_lsn: u64,
    /// Files written since the last fdatasync.
    dirty_files: Vec<u64>,
    /// Per file, the bytes from its start known to be allocated (its
    /// length at open, then what was written or zero-filled).
    allocated: Vec<u64>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal")
            .field("dir", &self.dir)
            .field("epoch", &self.epoch)
            .field("end", &self.end_lsn())
            .field("written", &self.written_lsn)
            .field("synced", &self.synced_lsn)
            .finish_non_exhaustive()
    }
}

impl Wal {
    /// Opens the log in `dir` for a new run: a new epoch, recorded in the
    /// checkpoint before anything else is written. Call only after every
    /// shard has replayed what the log held ([`read_all`]). `buffer_bytes`
    /// bounds one record (at least the largest frame plus a header and a
    /// block); a log of another geometry is started afresh.
    pub async fn open(
        dir: &Path,
        geometry: WalGeometry,
        buffer_bytes: usize,
    ) -> Result<(Wal, CheckpointFile), SegmentError> {
        assert!(buffer_bytes.is_multiple_of(BLOCK_SIZE as usize) && buffer_bytes >= 2 * BLOCK_SIZE as usize);
        assert!(geometry.file_bytes >= 2 * buffer_bytes as u64, "a file holds two records at least");
        std::fs::create_dir_all(dir).map_err(|source| SegmentError::Io {
            op: "create write-ahead log directory",
            path: dir.to_path_buf(),
            position: 0,
            source,
        })?;
        let previous = read_checkpoint(dir).map_err(|source| SegmentError::Io {
            op: "read write-ahead checkpoint",
            path: dir.join(CHECKPOINT_FILE_NAME),
            position: 0,
            source,
        })?;
        let (sequence, epoch, lsn) = match previous {
            Some(old) if old.geometry == geometry => {
                (old.sequence + 1, old.epoch.wrapping_add(1), align_up(old.lsn, BLOCK_SIZE))
            }
            Some(old) => {
                remove_log_files(dir);
                (old.sequence + 1, old.epoch.wrapping_add(1), 0)
            }
            None => (1, 1, 0),
        };
        let checkpoint = Checkpoint { sequence, epoch, lsn, geometry };
        let path = dir.join(CHECKPOINT_FILE_NAME);
        let opened = OpenOptions::new().read(true).write(true).create(true).dma_open(&path).await;
        let file = io_context(opened, "open write-ahead checkpoint", &path, 0)?;
        if previous.is_none() {
            sync_parent_dir(&path).await?;
        }
        let mut checkpoint_file = CheckpointFile { file, path, checkpoint };
        checkpoint_file.write_checkpoint(checkpoint).await?;
        let mut files = Vec::new();
        let mut allocated = Vec::new();
        let mut created = false;
        for index in 0..geometry.file_count {
            let path = file_path(dir, index);
            created |= !path.exists();
            allocated.push(std::fs::metadata(&path).map_or(0, |metadata| align_down(metadata.len(), BLOCK_SIZE)));
            let opened = OpenOptions::new().read(true).write(true).create(true).dma_open(&path).await;
            files.push(Rc::new(io_context(opened, "open write-ahead log", &path, 0)?));
        }
        if created {
            sync_parent_dir(&file_path(dir, 0)).await?;
        }
        let wal = Wal {
            dir: dir.to_path_buf(),
            geometry,
            epoch,
            files,
            active: checkpoint_file.file.alloc_dma_buffer(buffer_bytes),
            active_lsn: lsn,
            used: 0,
            carried: 0,
            record_at: None,
            pending: VecDeque::new(),
            written_lsn: lsn,
            synced_lsn: lsn,
            dirty_files: Vec::new(),
            allocated,
        };
        Ok((wal, checkpoint_file))
    }

    pub fn geometry(&self) -> WalGeometry {
        self.geometry
    }

    /// The position after the last appended record byte.
    pub fn end_lsn(&self) -> u64 {
        self.active_lsn + self.used as u64
    }

    /// The position up to which records are written to the files.
    pub fn written_lsn(&self) -> u64 {
        self.written_lsn
    }

    /// The position up to which records are durable.
    pub fn synced_lsn(&self) -> u64 {
        self.synced_lsn
    }

    /// The ring's bytes.
    pub fn capacity_bytes(&self) -> u64 {
        self.geometry.file_bytes * self.geometry.file_count
    }

    /// Appends whole frames (as a segment writer's buffer holds them) to
    /// the open record, sealing records as the buffer or the file fills.
    /// Nothing is written until [`Wal::write`].
    pub fn append_frames(&mut self, mut frames: &[u8]) -> Result<(), FrameError> {
        while !frames.is_empty() {
            let frame_size = parse_header(frames)?.frame_size();
            let frame = frames
                .get(..frame_size)
                .ok_or(FrameError::Truncated { needed: frame_size, available: frames.len() })?;
            self.append_frame(frame);
            frames = &frames[frame_size..];
        }
        Ok(())
    }

    fn append_frame(&mut self, frame: &[u8]) {
        let record_max = self.active.len() - BLOCK_SIZE as usize - RECORD_HEADER_SIZE;
        assert!(frame.len() <= record_max, "a frame of {} bytes is larger than a record ({record_max})", frame.len());
        if let Some(at) = self.record_at {
            let record_lsn = self.active_lsn + at as u64;
            let fits_buffer = self.active.len() - self.used >= frame.len();
            let fits_file = self.end_lsn() + frame.len() as u64 <= self.geometry.file_end(record_lsn);
            if !(fits_buffer && fits_file) {
                self.close_record();
                self.seal_active();
            }
        }
        if self.record_at.is_none() {
            self.open_record(frame.len());
        }
        self.active.as_bytes_mut()[self.used..self.used + frame.len()].copy_from_slice(frame);
        self.used += frame.len();
    }

    /// Starts a record with room for `body_size` bytes, in the next file
    /// when this one has not that much left.
    fn open_record(&mut self, body_size: usize) {
        let needed = (RECORD_HEADER_SIZE + body_size) as u64;
        let lsn = self.end_lsn();
        let file_end = self.geometry.file_end(lsn);
        if file_end - lsn < needed {
            if file_end - lsn >= RECORD_HEADER_SIZE as u64 {
                if self.active.len() - self.used < RECORD_HEADER_SIZE {
                    self.seal_active();
                }
                let at = self.used;
                let skip_lsn = self.end_lsn();
                write_record_header(&mut self.active.as_bytes_mut()[at..], KIND_SKIP, self.epoch, skip_lsn, &[]);
                self.used += RECORD_HEADER_SIZE;
            }
            self.seal_active();
            self.active_lsn = file_end;
            self.used = 0;
            self.carried = 0;
        }
        if self.active.len() - self.used < RECORD_HEADER_SIZE + body_size {
            self.seal_active();
        }
        self.record_at = Some(self.used);
        self.active.as_bytes_mut()[self.used..self.used + RECORD_HEADER_SIZE].fill(0);
        self.used += RECORD_HEADER_SIZE;
    }

    /// Fills in the open record's header; an empty record is dropped.
    fn close_record(&mut self) {
        let Some(at) = self.record_at.take() else { return };
        if self.used == at + RECORD_HEADER_SIZE {
            self.used = at;
            return;
        }
        let lsn = self.active_lsn + at as u64;
        let epoch = self.epoch;
        let (head, body) = self.active.as_bytes_mut()[at..self.used].split_at_mut(RECORD_HEADER_SIZE);
        write_record_header(head, KIND_FRAMES, epoch, lsn, body);
    }

    /// Moves the records in `active` into a write of whole blocks (zeros
    /// after the last record) and keeps the partial last block to rewrite.
    fn seal_active(&mut self) {
        debug_assert!(self.record_at.is_none());
        if self.used == self.carried {
            return;
        }
        let used = self.used;
        let write_size = align_up(used as u64, BLOCK_SIZE) as usize;
        let keep_from = align_down(used as u64, BLOCK_SIZE) as usize;
        self.active.as_bytes_mut()[used..write_size].fill(0);
        let mut sealed = self.files[0].alloc_dma_buffer(write_size);
        sealed.as_bytes_mut().copy_from_slice(&self.active.as_bytes()[..write_size]);
        self.active.as_bytes_mut().copy_within(keep_from..used, 0);
        let end_lsn = self.end_lsn();
        let (lsn, buffer) = (self.active_lsn, Rc::new(sealed));
        self.pending.push_back(WalWrite { lsn, buffer, end_lsn, written: false, in_flight: false });
        self.active_lsn += keep_from as u64;
        self.used -= keep_from;
        self.carried = self.used;
    }

    /// Closes the open record and seals it into a write (no I/O), so the
    /// log's end is a record boundary: after a round that bypassed the log
    /// ([`crate::shard::commit`]), where a checkpoint snapshot may take
    /// that end as its position.
    pub fn close_open_record(&mut self) {
        self.close_record();
        self.seal_active();
    }

    /// Closes the open record and writes every sealed record, in order
    /// (not durably: see [`Wal::sync`]). [`WalError::Full`] when a write
    /// would reach a file not freed by the checkpoint at `checkpoint_lsn`;
    /// on any error the records stay, for a retry.
    pub async fn write(&mut self, checkpoint_lsn: u64) -> Result<u64, WalError> {
        let io = self.start_writes(checkpoint_lsn);
        let (done, failed) = match io {
            Ok(io) => io.run().await,
            Err(full) => {
                self.finish_writes(&[]);
                return Err(full);
            }
        };
        self.finish_writes(&done);
        match failed {
            Some(error) => Err(WalError::Io(error)),
            None => Ok(self.written_lsn),
        }
    }

    /// Closes the open record and hands out the writes of every sealed
    /// record not written yet, for [`WalIo::run`]; report what it did with
    /// [`Wal::finish_writes`] before the next call. Records appended
    /// meanwhile go to the next call.
    pub fn start_writes(&mut self, checkpoint_lsn: u64) -> Result<WalIo, WalError> {
        self.close_record();
        self.seal_active();
        let mut writes = Vec::new();
        for write in self.pending.iter_mut().filter(|write| !write.written && !write.in_flight) {
            if write.end_lsn <= checkpoint_lsn {
                // Rewritten after a failed fdatasync, but the segments
                // hold these frames by now: the file may be reused.
                write.written = true;
                continue;
            }
            if self.geometry.overruns(write.lsn, checkpoint_lsn) {
                return Err(WalError::Full);
            }
            let file_index = self.geometry.file_index(write.lsn);
            let position = write.lsn % self.geometry.file_bytes;
            let file = self.files[file_index as usize].clone();
            write.in_flight = true;
            writes.push((write.lsn, write.buffer.clone(), file, file_path(&self.dir, file_index), position));
        }
        Ok(WalIo { writes })
    }

    /// Records which writes of the last [`Wal::start_writes`] are done (by
    /// `lsn`); the others are written again by the next call.
    pub fn finish_writes(&mut self, done: &[u64]) {
        for write in self.pending.iter_mut() {
            if write.in_flight {
                write.in_flight = false;
                write.written = done.contains(&write.lsn);
            }
        }
        for write in self.pending.iter().filter(|write| write.written) {
            let file_index = self.geometry.file_index(write.lsn) as usize;
            let end = write.lsn % self.geometry.file_bytes + write.buffer.len() as u64;
            self.allocated[file_index] = self.allocated[file_index].max(end);
        }
        for write in self.pending.iter() {
            if !write.written {
                break;
            }
            self.written_lsn = self.written_lsn.max(write.end_lsn);
            let file_index = self.geometry.file_index(write.lsn);
            if !self.dirty_files.contains(&file_index) {
                self.dirty_files.push(file_index);
            }
        }
    }

    /// The next allocation ahead of the log's end, if one is due: the file,
    /// the position (the end of what it holds) and the bytes to zero-fill.
    pub fn allocation_due(&self) -> Option<(u64, u64, u64)> {
        let target = self.end_lsn() + ALLOCATE_AHEAD_BYTES;
        let mut lsn = self.end_lsn();
        while lsn < target {
            let file_index = self.geometry.file_index(lsn);
            let file_start = lsn - lsn % self.geometry.file_bytes;
            let wanted = (target - file_start).min(self.geometry.file_bytes);
            let position = self.allocated[file_index as usize];
            if position < wanted {
                let bytes = align_up((wanted - position).min(ALLOCATE_CHUNK_BYTES), BLOCK_SIZE);
                return Some((file_index, position, bytes.min(self.geometry.file_bytes - position)));
            }
            lsn = file_start + self.geometry.file_bytes;
        }
        None
    }

    /// Zero-fills the next allocation due ([`Wal::allocation_due`]) and
    /// fdatasyncs it; returns the bytes zero-filled, 0 when none was due.
    /// Call only between rounds: every record is written (it does nothing
    /// while records are held unwritten), so the zeros land past all of
    /// them (past what the file holds) and a later round overwrites them
    /// in place.
    pub async fn allocate_ahead(&mut self) -> Result<u64, SegmentError> {
        // Records held unwritten (rounds that bypassed the log) would land
        // where the zeros go: no allocation until they are written or
        // dropped.
        if self.pending.iter().any(|write| !write.written) {
            return Ok(0);
        }
        let Some((file_index, position, bytes)) = self.allocation_due() else { return Ok(0) };
        if !room_for_allocation(&self.dir, bytes) {
            return Ok(0);
        }
        let file = self.files[file_index as usize].clone();
        let path = file_path(&self.dir, file_index);
        let zeroed = |size: u64| {
            let mut buffer = file.alloc_dma_buffer(size as usize);
            buffer.as_bytes_mut().fill(0);
            Rc::new(buffer)
        };
        let zeros = zeroed(ALLOCATE_WRITE_BYTES.min(bytes));
        let mut at = position;
        while at < position + bytes {
            let size = ALLOCATE_WRITE_BYTES.min(position + bytes - at);
            let buffer = if size == zeros.len() as u64 { zeros.clone() } else { zeroed(size) };
            let written = io_context(file.write_rc_at(buffer, at).await, "allocate write-ahead log", &path, at)?;
            if written != size as usize {
                return Err(SegmentError::ShortWrite { path, position: at, written, expected: size as usize });
            }
            at += size;
        }
        io_context(file.fdatasync().await, "fdatasync write-ahead log allocation", &path, position)?;
        let allocated = &mut self.allocated[file_index as usize];
        *allocated = (*allocated).max(position + bytes);
        Ok(bytes)
    }

    /// fdatasyncs every file written since the last sync: every record
    /// written before the call is durable when it returns `Ok`. A failed
    /// fdatasync marks the unsynced records unwritten, to write them again.
    pub async fn sync(&mut self) -> Result<u64, SegmentError> {
        debug_assert!(self.pending.iter().all(|write| write.written));
        let dirty = std::mem::take(&mut self.dirty_files);
        for (done, &file_index) in dirty.iter().enumerate() {
            let path = file_path(&self.dir, file_index);
            if let Err(error) = crate::runtime::submit::submitted(self.files[file_index as usize].fdatasync()).await {
                self.dirty_files = dirty[done..].to_vec();
                for write in &mut self.pending {
                    write.written = false;
                }
                self.written_lsn = self.synced_lsn;
                return io_context(Err(error), "fdatasync write-ahead log", &path, 0);
            }
        }
        self.pending.retain(|write| !write.written);
        self.synced_lsn = self.written_lsn;
        Ok(self.synced_lsn)
    }

    /// After the segments were synced directly (the log was full): drops
    /// every record not yet durable (the segments hold their frames) and
    /// starts again at the next file. Returns that position, for the
    /// checkpoint.
    pub fn restart_after_direct_sync(&mut self) -> u64 {
        let next = self.geometry.file_end(self.end_lsn());
        self.record_at = None;
        self.pending.clear();
        self.dirty_files.clear();
        self.active_lsn = next;
        self.used = 0;
        self.carried = 0;
        self.written_lsn = next;
        self.synced_lsn = next;
        next
    }

    /// Closes the files (nothing is synced).
    pub async fn close(self) {
        drop(self.pending);
        for file in self.files {
            if let Ok(file) = Rc::try_unwrap(file) {
                let _ = file.close().await;
            }
        }
    }
}

/// The checkpoint of one shard's log, written apart from the log's
/// records (a checkpoint runs while commit rounds go on).
pub struct CheckpointFile {
    file: DmaFile,
    path: PathBuf,
    checkpoint: Checkpoint,
}

impl CheckpointFile {
    /// The position before which the log is no longer needed.
    pub fn lsn(&self) -> u64 {
        self.checkpoint.lsn
    }

    /// Records durably that every frame before `lsn` is in synced segment
    /// files, which frees the log's files wholly before it.
    pub async fn write(&mut self, lsn: u64) -> Result<(), SegmentError> {
        assert!(lsn >= self.checkpoint.lsn, "checkpoint {lsn} before {}", self.checkpoint.lsn);
        let checkpoint = Checkpoint { sequence: self.checkpoint.sequence + 1, lsn, ..self.checkpoint };
        self.write_checkpoint(checkpoint).await
    }

    async fn write_checkpoint(&mut self, checkpoint: Checkpoint) -> Result<(), SegmentError> {
        let mut block = self.file.alloc_dma_buffer(BLOCK_SIZE as usize);
        checkpoint.encode(block.as_bytes_mut());
        let position = (checkpoint.sequence % 2) * BLOCK_SIZE;
        let written = self.file.write_at(block, position).await;
        let written = io_context(written, "write write-ahead checkpoint", &self.path, position)?;
        if written != BLOCK_SIZE as usize {
            let (path, expected) = (self.path.clone(), BLOCK_SIZE as usize);
            return Err(SegmentError::ShortWrite { path, position, written, expected });
        }
        let synced = self.file.fdatasync().await;
        io_context(synced, "fdatasync write-ahead checkpoint", &self.path, position)?;
        self.checkpoint = checkpoint;
        Ok(())
    }

    pub async fn close(self) {
        let _ = self.file.close().await;
    }
}

/// Removes a log's files (not its checkpoint): a log of another geometry,
/// all replayed, is started afresh.
fn remove_log_files(dir: &Path) {
    for index in 0..64 {
        let _ = std::fs::remove_file(file_path(dir, index));
    }
}

/// One log's frames found at start-up, by base offset.
#[derive(Debug, Default)]
pub struct LogFrames {
    bytes: Vec<u8>,
    /// `(base_offset, start, size)` of each frame in `bytes`.
    frames: Vec<(u64, usize, usize)>,
}

impl LogFrames {
    /// The frames in offset order (frames from several shards' logs
    /// interleave when the partition moved).
    pub fn sorted(mut self) -> impl Iterator<Item = (u64, Vec<u8>)> {
        self.frames.sort_by_key(|&(base_offset, ..)| base_offset);
        let bytes = std::mem::take(&mut self.bytes);
        self.frames.into_iter().map(move |(base, start, size)| (base, bytes[start..start + size].to_vec()))
    }

    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }
}

/// The file, next to a shard's checkpoint, that says how far each
/// partition's active segment was durable at the last checkpoint: the
/// index of that prefix, so recovery trusts it and scans only what follows
/// ([`crate::storage::recovery::recover_segment`]) instead of every byte of
/// every active segment.
pub const POSITIONS_FILE_NAME: &str = "positions";
const POSITIONS_MAGIC: u32 = u32::from_le_bytes(*b"SPTP");
const POSITIONS_VERSION: u32 = 1;

/// The positions file's bytes: a header, then each index as a length and
/// its sidecar encoding (which carries its own CRC, log id and base offset).
pub fn encode_positions<'a>(indexes: impl Iterator<Item = &'a SegmentIndex>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&POSITIONS_MAGIC.to_le_bytes());
    out.extend_from_slice(&POSITIONS_VERSION.to_le_bytes());
    let mut blob = Vec::new();
    for index in indexes {
        index.encode(&mut blob);
        out.extend_from_slice(&(blob.len() as u32).to_le_bytes());
        out.extend_from_slice(&blob);
    }
    out
}

/// Reads a shard's positions file; a missing or foreign file, or a damaged
/// entry, gives nothing for it (recovery then scans as before).
pub fn read_positions(dir: &Path) -> Vec<SegmentIndex> {
    let Ok(bytes) = std::fs::read(dir.join(POSITIONS_FILE_NAME)) else { return Vec::new() };
    if bytes.len() < 8 || u32_at(&bytes, 0) != POSITIONS_MAGIC || u32_at(&bytes, 4) != POSITIONS_VERSION {
        return Vec::new();
    }
    let mut indexes = Vec::new();
    let mut at = 8;
    while let Some(len) = bytes.get(at..at + 4).map(|len| u32_at(len, 0) as usize) {
        let Some(blob) = bytes.get(at + 4..at + 4 + len) else { break };
        if blob.len() >= 32 {
            let (log_id, base_offset) = (u64_at(blob, 16), u64_at(blob, 24));
            if let Ok(index) = SegmentIndex::decode(blob, log_id, base_offset) {
                indexes.push(index);
            }
        }
        at += 4 + len;
    }
    indexes
}

/// How the start-up read of one shard's log ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalReadReport {
    pub dir: PathBuf,
    pub records: u64,
    pub frames: u64,
    pub bytes: u64,
    /// Why the log ended where it did, when not at a clean end: a torn or
    /// corrupt record, cut (counted like a segment's torn tail).
    pub cut: Option<String>,
}

/// Every log's frames past its checkpoint, for the shards to replay, and
/// the count of shards that have not finished replaying.
#[derive(Debug)]
pub struct WalReplay {
    frames: Mutex<HashMap<u64, LogFrames>>,
    /// Each log's durable active-segment prefix from the positions files
    /// (the longest, when several shards recorded one).
    positions: Mutex<HashMap<u64, SegmentIndex>>,
    pub reports: Vec<WalReadReport>,
    shards_left: AtomicUsize,
    failed: AtomicBool,
}

impl WalReplay {
    /// Nothing to replay (memory storage, tests).
    pub fn empty(shard_count: usize) -> WalReplay {
        WalReplay {
            frames: Mutex::default(),
            positions: Mutex::default(),
            reports: Vec::new(),
            shards_left: AtomicUsize::new(shard_count),
            failed: AtomicBool::new(false),
        }
    }

    /// Takes the frames of log `log_id`, if any.
    pub fn take(&self, log_id: u64) -> Option<LogFrames> {
        self.frames.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&log_id)
    }

    /// Takes the durable prefix recorded for log `log_id`'s active segment.
    pub fn take_position(&self, log_id: u64) -> Option<SegmentIndex> {
        self.positions.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&log_id)
    }

    /// Logs left unclaimed, after every shard opened its partitions: they
    /// belong to deleted streams.
    pub fn unclaimed(&self) -> usize {
        self.frames.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
    }

    /// This shard's partitions are replayed and synced (or it failed).
    pub fn shard_done(&self, failed: bool) {
        if failed {
            self.failed.store(true, Ordering::SeqCst);
        }
        self.shards_left.fetch_sub(1, Ordering::SeqCst);
    }

    /// Whether every shard is done, or one failed (then no log may start
    /// a new epoch: what it holds may not be replayed).
    pub fn progress(&self) -> ReplayProgress {
        if self.failed.load(Ordering::SeqCst) {
            ReplayProgress::Failed
        } else if self.shards_left.load(Ordering::SeqCst) == 0 {
            ReplayProgress::Done
        } else {
            ReplayProgress::Waiting
        }
    }
}

/// Where the shards are in the start-up replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayProgress {
    Waiting,
    Done,
    Failed,
}

/// Reads every shard's log under `data_dir` from its checkpoint (blocking:
/// start-up, before the shards run). An unreadable file fails the start;
/// a torn or corrupt tail ends that log and is reported.
pub fn read_all(data_dir: &Path, shard_count: usize) -> io::Result<WalReplay> {
    let mut replay = WalReplay::empty(shard_count);
    let root = data_dir.join(WAL_DIR_NAME);
    let entries = match std::fs::read_dir(&root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(replay),
        Err(error) => return Err(error),
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|entry| entry.file_name().to_str().is_some_and(|name| name.starts_with("shard-")))
        .map(|entry| entry.path())
        .collect();
    dirs.sort();
    let positions = replay.positions.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
    for index in dirs.iter().flat_map(|dir| read_positions(dir)) {
        let longer = positions
            .get(&index.log_id())
            .is_none_or(|known| (index.base_offset(), index.log_size()) > (known.base_offset(), known.log_size()));
        if longer {
            positions.insert(index.log_id(), index);
        }
    }
    let frames = replay.frames.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
    for dir in dirs {
        let Some(checkpoint) = read_checkpoint(&dir)? else { continue };
        replay.reports.push(read_log(&dir, checkpoint, frames)?);
    }
    Ok(replay)
}

/// One log's records from its checkpoint to its end.
fn read_log(dir: &Path, checkpoint: Checkpoint, out: &mut HashMap<u64, LogFrames>) -> io::Result<WalReadReport> {
    let geometry = checkpoint.geometry;
    let mut report = WalReadReport { dir: dir.to_path_buf(), records: 0, frames: 0, bytes: 0, cut: None };
    let mut reader = LogReader { dir, geometry, file: None, chunk: Vec::new(), chunk_lsn: 0 };
    let mut lsn = checkpoint.lsn;
    let limit = checkpoint.lsn + geometry.file_bytes * geometry.file_count;
    while lsn < limit {
        let file_end = geometry.file_end(lsn);
        if file_end - lsn < RECORD_HEADER_SIZE as u64 {
            lsn = file_end;
            continue;
        }
        let Some(header) = reader.bytes(lsn, RECORD_HEADER_SIZE)? else { break };
        let header = header.to_vec();
        if u32_at(&header, 0) != RECORD_MAGIC || u32_at(&header, 12) != checkpoint.epoch || u64_at(&header, 16) != lsn {
            // Zeros, an earlier lap or an earlier run: the end.
            break;
        }
        let body_len = u32_at(&header, 8) as usize;
        let crc = u32_at(&header, 24);
        if header[4] == KIND_SKIP && body_len == 0 && crc == record_crc(&header, &[]) {
            lsn = file_end;
            continue;
        }
        if header[4] != KIND_FRAMES || lsn + (RECORD_HEADER_SIZE + body_len) as u64 > file_end {
            report.cut = Some(format!("a record at {lsn} with a bad kind or length"));
            break;
        }
        let Some(body) = reader.bytes(lsn + RECORD_HEADER_SIZE as u64, body_len)? else {
            report.cut = Some(format!("a record at {lsn} cut short by the end of its file"));
            break;
        };
        if record_crc(&header, body) != crc {
            report.cut = Some(format!("a record at {lsn} whose CRC does not match"));
            break;
        }
        match collect_frames(body, out) {
            Ok(count) => report.frames += count,
            Err(error) => {
                report.cut = Some(format!("a record at {lsn} holding a bad frame: {error}"));
                break;
            }
        }
        report.records += 1;
        report.bytes += body_len as u64;
        lsn += (RECORD_HEADER_SIZE + body_len) as u64;
    }
    Ok(report)
}

/// Adds a record's frames to their logs. A record is all or nothing: it is
/// checked whole before any frame is taken.
fn collect_frames(body: &[u8], out: &mut HashMap<u64, LogFrames>) -> Result<u64, FrameError> {
    let mut at = 0;
    while at < body.len() {
        let size = decode_frame(&body[at..])?.header.frame_size();
        at += size;
    }
    let mut at = 0;
    let mut count = 0;
    while at < body.len() {
        let header = decode_frame(&body[at..])?.header;
        let size = header.frame_size();
        let log = out.entry(header.log_id).or_default();
        log.frames.push((header.base_offset, log.bytes.len(), size));
        log.bytes.extend_from_slice(&body[at..at + size]);
        at += size;
        count += 1;
    }
    Ok(count)
}

/// Reads a log's bytes by position through a chunk cache.
struct LogReader<'a> {
    dir: &'a Path,
    geometry: WalGeometry,
    file: Option<(u64, File)>,
    chunk: Vec<u8>,
    chunk_lsn: u64,
}

impl LogReader<'_> {
    /// `size` bytes at `lsn` (within one file), or `None` past the file's end.
    fn bytes(&mut self, lsn: u64, size: usize) -> io::Result<Option<&[u8]>> {
        let in_chunk = lsn >= self.chunk_lsn && lsn + size as u64 <= self.chunk_lsn + self.chunk.len() as u64;
        if !in_chunk {
            let generation = self.geometry.generation(lsn);
            if self.file.as_ref().is_none_or(|(open, _)| *open != generation) {
                let path = file_path(self.dir, self.geometry.file_index(lsn));
                match File::open(&path) {
                    Ok(file) => self.file = Some((generation, file)),
                    Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
                    Err(error) => return Err(error),
                }
            }
            let (_, file) = self.file.as_ref().expect("opened above");
            let position = lsn % self.geometry.file_bytes;
            let wanted = size.max(READ_CHUNK_BYTES).min((self.geometry.file_bytes - position) as usize);
            self.chunk.resize(wanted, 0);
            let mut filled = 0;
            while filled < wanted {
                match file.read_at(&mut self.chunk[filled..], position + filled as u64)? {
                    0 => break,
                    read => filled += read,
                }
            }
            self.chunk.truncate(filled);
            self.chunk_lsn = lsn;
            if filled < size {
                return Ok(None);
            }
        }
        let start = (lsn - self.chunk_lsn) as usize;
        Ok(Some(&self.chunk[start..start + size]))
    }
}

/// Whether the filesystem of `dir` keeps [`ALLOCATE_FREE_BYTES_MIN`] and
/// 1/16 of its size free after `bytes` more (no when it cannot tell).
fn room_for_allocation(dir: &Path, bytes: u64) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return false };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a statvfs the call fills in.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return false;
    }
    let block = stat.f_frsize as u64;
    let (free, size) = (stat.f_bavail as u64 * block, stat.f_blocks as u64 * block);
    free >= bytes + ALLOCATE_FREE_BYTES_MIN.max(size / 16)
}

/// Logs what the start-up read found.
pub fn log_reports(replay: &WalReplay) {
    for report in &replay.reports {
        if let Some(cut) = &report.cut {
            log::warn!(
                "write-ahead log {}: kept {} records ({} frames, {} bytes), cut at {cut}",
                report.dir.display(),
                report.records,
                report.frames,
                report.bytes
            );
        } else if report.records > 0 {
            log::info!(
                "write-ahead log {}: {} records ({} frames, {} bytes) past the checkpoint",
                report.dir.display(),
                report.records,
                report.frames,
                report.bytes
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::format::FrameEncoder;
    use crate::storage::segment::tests::{run, scratch_dir};

    /// A frame of log `log_id` at `base_offset` with `records` records of
    /// `payload_size` bytes.
    fn frame(log_id: u64, base_offset: u64, records: usize, payload_size: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; records * (payload_size + 64) + 64];
        let mut encoder = FrameEncoder::new(&mut bytes).unwrap();
        for index in 0..records {
            let payload = vec![b'a' + ((base_offset as usize + index) % 26) as u8; payload_size];
            encoder.append(b"key", &payload).unwrap();
        }
        let sealed = encoder.seal(log_id, base_offset, 7).unwrap();
        bytes.truncate(sealed.frame_size);
        bytes
    }

    fn geometry() -> WalGeometry {
        WalGeometry { file_bytes: 64 << 10, file_count: WAL_FILE_COUNT }
    }

    /// Appends `rounds` rounds of one frame for each of logs 1..=3 and
    /// writes (and syncs every other round), checkpointing as it goes so the
    /// ring wraps. Returns the next offset of each log.
    async fn write_rounds(wal: &mut Wal, checkpoint: u64, rounds: u64, next: &mut [u64; 3]) {
        for round in 0..rounds {
            for (log, next) in next.iter_mut().enumerate() {
                let records = 1 + (round as usize + log) % 5;
                let bytes = frame(log as u64 + 1, *next, records, 100 + 37 * log);
                wal.append_frames(&bytes).unwrap();
                *next += records as u64;
            }
            wal.write(checkpoint).await.unwrap();
            if round % 2 == 1 {
                wal.sync().await.unwrap();
            }
        }
        wal.sync().await.unwrap();
    }

    /// Records written over several laps of the ring (file switches, skip
    /// records, recycled files with stale records) read back from the last
    /// checkpoint: every log's frames, dense and in order, and nothing
    /// older.
    #[test]
    fn records_read_back_across_file_switches_and_laps() {
        let dir = scratch_dir("wal-laps");
        let (next, checkpoint_at) = run({
            let dir = dir.clone();
            async move {
                let (mut wal, mut checkpoint) = Wal::open(&dir, geometry(), 16 << 10).await.unwrap();
                let mut next = [0u64; 3];
                for _ in 0..12 {
                    write_rounds(&mut wal, checkpoint.lsn(), 40, &mut next).await;
                    checkpoint.write(wal.written_lsn()).await.unwrap();
                }
                let checkpoint_offsets = next;
                write_rounds(&mut wal, checkpoint.lsn(), 25, &mut next).await;
                checkpoint.close().await;
                assert!(wal.end_lsn() > 2 * wal.capacity_bytes(), "the ring wrapped twice");
                wal.close().await;
                (next, checkpoint_offsets)
            }
        });
        let replay = read_all(&dir.parent().unwrap().join("wal-laps-root"), 1).unwrap();
        assert_eq!(replay.reports.len(), 0, "no wal directory there");
        let mut frames = HashMap::new();
        let checkpoint = read_checkpoint(&dir).unwrap().unwrap();
        let report = read_log(&dir, checkpoint, &mut frames).unwrap();
        assert_eq!(report.cut, None, "{report:?}");
        assert!(report.records >= 25, "a record per round, more where a round met a file end: {report:?}");
        for log in 0..3 {
            let frames = frames.remove(&(log as u64 + 1)).unwrap();
            let mut expected = checkpoint_at[log];
            for (base_offset, bytes) in frames.sorted() {
                assert_eq!(base_offset, expected);
                expected = decode_frame(&bytes).unwrap().header.next_offset();
            }
            assert_eq!(expected, next[log]);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A write that would overwrite a file the checkpoint has not freed is
    /// refused as full, and goes through once a checkpoint frees it.
    #[test]
    fn a_full_ring_refuses_until_a_checkpoint() {
        let dir = scratch_dir("wal-full");
        run({
            let dir = dir.clone();
            async move {
                let (mut wal, mut checkpoint) = Wal::open(&dir, geometry(), 16 << 10).await.unwrap();
                let mut offset = 0;
                let full = loop {
                    wal.append_frames(&frame(9, offset, 10, 500)).unwrap();
                    offset += 10;
                    match wal.write(checkpoint.lsn()).await {
                        Ok(_) => {}
                        Err(error) => break error,
                    }
                };
                assert!(matches!(full, WalError::Full));
                assert!(wal.end_lsn() > 3 * geometry().file_bytes);
                wal.sync().await.unwrap();
                checkpoint.write(wal.written_lsn()).await.unwrap();
                wal.write(checkpoint.lsn()).await.unwrap();
                wal.sync().await.unwrap();
                let restart = wal.restart_after_direct_sync();
                assert_eq!(restart % geometry().file_bytes, 0);
                checkpoint.write(restart).await.unwrap();
                wal.append_frames(&frame(9, offset, 10, 500)).unwrap();
                wal.write(checkpoint.lsn()).await.unwrap();
                wal.close().await;
                checkpoint.close().await;
            }
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A torn or corrupt last record ends the log there and is reported;
    /// the records before it are kept. A new run (new epoch) reads none of
    /// the old records.
    #[test]
    fn damage_in_the_last_record_cuts_there() {
        let dir = scratch_dir("wal-damage");
        let ends = run({
            let dir = dir.clone();
            async move {
                let (mut wal, checkpoint) = Wal::open(&dir, geometry(), 16 << 10).await.unwrap();
                let mut ends = Vec::new();
                for round in 0..5u64 {
                    wal.append_frames(&frame(4, round * 3, 3, 300)).unwrap();
                    wal.write(checkpoint.lsn()).await.unwrap();
                    wal.sync().await.unwrap();
                    ends.push(wal.written_lsn());
                }
                wal.close().await;
                checkpoint.close().await;
                ends
            }
        });
        let path = file_path(&dir, 0);
        let mut bytes = std::fs::read(&path).unwrap();
        let last_start = ends[3] as usize;
        bytes[last_start + RECORD_HEADER_SIZE + 50] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let checkpoint = read_checkpoint(&dir).unwrap().unwrap();
        let mut frames = HashMap::new();
        let report = read_log(&dir, checkpoint, &mut frames).unwrap();
        assert_eq!(report.records, 4);
        assert!(report.cut.as_deref().is_some_and(|cut| cut.contains("CRC")), "{report:?}");
        assert_eq!(frames[&4].frame_count(), 4);
        // Torn: the file ends inside the last record.
        std::fs::write(&path, &bytes[..last_start + 100]).unwrap();
        let mut frames = HashMap::new();
        let report = read_log(&dir, checkpoint, &mut frames).unwrap();
        assert_eq!((report.records, frames[&4].frame_count()), (4, 4));
        assert!(report.cut.is_some(), "{report:?}");
        // A new run starts a new epoch: the old records are not its.
        run({
            let dir = dir.clone();
            async move {
                let (wal, checkpoint) = Wal::open(&dir, geometry(), 16 << 10).await.unwrap();
                wal.close().await;
                checkpoint.close().await;
            }
        });
        let replay = read_all(dir.parent().unwrap(), 1);
        drop(replay);
        let checkpoint = read_checkpoint(&dir).unwrap().unwrap();
        let mut frames = HashMap::new();
        let report = read_log(&dir, checkpoint, &mut frames).unwrap();
        assert_eq!((report.records, report.cut), (0, None));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// The checkpoint survives a torn slot: the other one counts.
    #[test]
    fn a_torn_checkpoint_slot_leaves_the_other() {
        let dir = scratch_dir("wal-checkpoint");
        run({
            let dir = dir.clone();
            async move {
                let (mut wal, mut checkpoint) = Wal::open(&dir, geometry(), 16 << 10).await.unwrap();
                wal.append_frames(&frame(1, 0, 2, 10)).unwrap();
                wal.write(checkpoint.lsn()).await.unwrap();
                wal.sync().await.unwrap();
                checkpoint.write(wal.written_lsn()).await.unwrap();
                wal.close().await;
                checkpoint.close().await;
            }
        });
        let path = dir.join(CHECKPOINT_FILE_NAME);
        let newest = read_checkpoint(&dir).unwrap().unwrap();
        assert_eq!(newest.sequence, 2);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[BLOCK_SIZE as usize * (newest.sequence % 2) as usize + 30] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let older = read_checkpoint(&dir).unwrap().unwrap();
        assert_eq!((older.sequence, older.lsn), (1, 0));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
