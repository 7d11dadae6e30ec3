//! Opening segments after a restart.
//!
//! * The active (last) segment of a log is scanned frame by frame
//!   ([`scan_segment_file`]); [`recover_segment`] cuts it after its last whole
//!   valid frame, so the file again holds only whole frames and zeros, and
//!   returns a [`SegmentWriter`] positioned there with the index the scan
//!   rebuilt. Frames after the cut were never acknowledged (a torn write), or
//!   are damage the [`RecoveryReport`] names.
//! * A sealed segment is opened through its index sidecar
//!   ([`open_sealed`]), without reading the log; a missing, damaged or
//!   stale sidecar is rebuilt by the same scan and written again.
//!
//! The scan reads [`SCAN_CHUNK_BYTES`] at a time (more only for a frame
//! larger than that, bounded by the frame size limit), so recovery memory
//! does not grow with the segment.

use std::path::Path;

use glommio::io::{DmaFile, OpenOptions};

use super::format::{FRAME_SIZE_MAX, ScanCursor, ScanOutcome, ScanStop, scan_with};
use super::index::{IndexError, SegmentIndex};
use super::segment::{
    BLOCK_SIZE, SegmentConfig, SegmentError, SegmentWriter, WriterStart, align_down, align_up, io_context, parent_dir,
    prime_dma_probe, write_index_file,
};

/// Bytes the scan reads at a time.
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// What scanning a segment file found.
#[derive(Debug, Clone)]
pub struct FileScan {
    pub outcome: ScanOutcome,
    /// The index of every valid frame.
    pub index: SegmentIndex,
    pub file_size: u64,
}

/// Scans the frames of a segment file from its start; see
/// [`crate::storage::format::scan`] for when it stops.
pub async fn scan_segment_file(
    file: &DmaFile,
    path: &Path,
    log_id: u64,
    base_offset: u64,
    index_interval_bytes: u32,
) -> Result<FileScan, SegmentError> {
    scan_segment_file_from(file, path, SegmentIndex::new(log_id, base_offset, index_interval_bytes)).await
}

/// Scans a segment file from the end of `durable`, the index of a prefix
/// known to be whole and durable (a checkpoint recorded it): the frames
/// after it are scanned as [`scan_segment_file`] scans all of them. A
/// prefix longer than the file is not trusted: the whole file is scanned.
pub async fn scan_segment_file_from(
    file: &DmaFile,
    path: &Path,
    durable: SegmentIndex,
) -> Result<FileScan, SegmentError> {
    let file_size = io_context(file.file_size().await, "stat segment", path, 0)?;
    let (mut index, mut cursor) = if durable.log_size() <= file_size {
        let cursor =
            ScanCursor { position: durable.log_size(), next_offset: durable.next_offset(), ..ScanCursor::default() };
        (durable, cursor)
    } else {
        let (log_id, base_offset) = (durable.log_id(), durable.base_offset());
        (SegmentIndex::new(log_id, base_offset, durable.interval_bytes()), ScanCursor::at_segment_start(base_offset))
    };
    let log_id = index.log_id();
    let mut index_error: Option<IndexError> = None;
    let mut want = SCAN_CHUNK_BYTES;
    loop {
        let read_start = align_down(cursor.position, BLOCK_SIZE);
        let skip = (cursor.position - read_start) as usize;
        let read_size = align_up((skip + want) as u64, BLOCK_SIZE) as usize;
        let data = if read_start < file_size {
            Some(io_context(file.read_at_aligned(read_start, read_size).await, "read segment", path, read_start)?)
        } else {
            None
        };
        let bytes = data.as_ref().and_then(|data| data.get(skip..)).unwrap_or(&[]);
        let at_eof = read_start + bytes.len() as u64 + skip as u64 >= file_size || bytes.is_empty();
        let outcome = scan_with(bytes, log_id, cursor, |position, header| {
            if let Err(error) = index.on_frame(position, header) {
                index_error.get_or_insert(error);
            }
        });
        if let Some(error) = index_error {
            return Err(SegmentError::Index { path: path.to_path_buf(), error });
        }
        let more = match outcome.stop {
            ScanStop::EndOfData if !at_eof => SCAN_CHUNK_BYTES,
            ScanStop::TornTail { needed, .. } if !at_eof && needed <= FRAME_SIZE_MAX => needed.max(SCAN_CHUNK_BYTES),
            _ => return Ok(FileScan { outcome, index, file_size }),
        };
        // Progress: the cursor moved, or this read was too short for the
        // frame at the cursor and the next one covers it.
        if outcome.cursor == cursor && more <= want {
            return Ok(FileScan { outcome, index, file_size });
        }
        cursor = outcome.cursor;
        want = more;
    }
}

/// What recovering the active segment found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The scan: its cursor is the recovered end, its stop says why.
    pub outcome: ScanOutcome,
    /// The file's size before recovery.
    pub file_size: u64,
    /// Bytes cut after the last valid frame (zeros included).
    pub discarded_bytes: u64,
}

/// Opens the active segment of log `log_id` after a restart: scans it, cuts
/// it after the last whole valid frame (rewriting the partial last block
/// zero-filled past it and truncating the file after that block, then
/// fdatasync), and returns a writer that appends from there.
pub async fn recover_segment(
    path: &Path,
    log_id: u64,
    base_offset: u64,
    config: SegmentConfig,
) -> Result<(SegmentWriter, RecoveryReport), SegmentError> {
    recover_segment_from(path, SegmentIndex::new(log_id, base_offset, config.index_interval_bytes), config).await
}

/// [`recover_segment`] trusting `durable`, a prefix a checkpoint recorded
/// ([`scan_segment_file_from`]).
pub async fn recover_segment_from(
    path: &Path,
    durable: SegmentIndex,
    config: SegmentConfig,
) -> Result<(SegmentWriter, RecoveryReport), SegmentError> {
    let log_id = durable.log_id();
    prime_dma_probe(parent_dir(path)).await?;
    let opened = OpenOptions::new().read(true).write(true).dma_open(path).await;
    let file = io_context(opened, "open segment", path, 0)?;
    let scan = scan_segment_file_from(&file, path, durable).await?;
    let valid_end = scan.outcome.cursor.position;
    let block_start = align_down(valid_end, BLOCK_SIZE);
    let block_end = align_up(valid_end, BLOCK_SIZE);
    let mut tail_block = Vec::new();
    let mut changed = false;
    if valid_end > block_start {
        let read = io_context(
            file.read_at_aligned(block_start, BLOCK_SIZE as usize).await,
            "read segment",
            path,
            block_start,
        )?;
        let tail_size = (valid_end - block_start) as usize;
        tail_block.extend_from_slice(&read[..tail_size]);
        if read[tail_size..].iter().any(|&byte| byte != 0) {
            let mut block = file.alloc_dma_buffer(BLOCK_SIZE as usize);
            block.as_bytes_mut().fill(0);
            block.as_bytes_mut()[..tail_size].copy_from_slice(&tail_block);
            let written = io_context(file.write_at(block, block_start).await, "rewrite tail block", path, block_start)?;
            if written != BLOCK_SIZE as usize {
                let expected = BLOCK_SIZE as usize;
                return Err(SegmentError::ShortWrite {
                    path: path.to_path_buf(),
                    position: block_start,
                    written,
                    expected,
                });
            }
            changed = true;
        }
    }
    if scan.file_size > block_end {
        io_context(file.truncate(block_end).await, "truncate segment", path, block_end)?;
        changed = true;
    }
    if changed {
        io_context(file.fdatasync().await, "fdatasync segment", path, block_end)?;
    }
    let report = RecoveryReport {
        outcome: scan.outcome,
        file_size: scan.file_size,
        discarded_bytes: scan.file_size.saturating_sub(valid_end),
    };
    let start = WriterStart { file, path: path.to_path_buf(), log_id, config, index: scan.index, tail_block };
    Ok((SegmentWriter::start(start), report))
}

/// Why a sealed segment's index was rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexRebuildReason {
    Missing,
    Damaged(IndexError),
    /// The sidecar claims more log than the file holds.
    Stale {
        index_log_size: u64,
        file_size: u64,
    },
}

/// A sealed segment, ready to read.
#[derive(Debug)]
pub struct SealedSegment {
    pub index: SegmentIndex,
    /// Set when the sidecar could not be used; the scan that rebuilt the
    /// index is kept (its stop says whether the segment itself is damaged).
    pub rebuilt: Option<(IndexRebuildReason, ScanOutcome)>,
    /// Set when the rebuilt sidecar could not be written for lack of space:
    /// the index is good in memory, and the sidecar is written later (or
    /// rebuilt again at the next start).
    pub sidecar_unwritten: Option<SegmentError>,
}

/// Opens a sealed segment through its index sidecar, rebuilding (and
/// rewriting) the sidecar from the log when it is missing, damaged or stale.
pub async fn open_sealed(
    log_path: &Path,
    index_path: &Path,
    log_id: u64,
    base_offset: u64,
    index_interval_bytes: u32,
) -> Result<SealedSegment, SegmentError> {
    prime_dma_probe(parent_dir(log_path)).await?;
    let file = io_context(DmaFile::open(log_path).await, "open segment", log_path, 0)?;
    let file_size = io_context(file.file_size().await, "stat segment", log_path, 0)?;
    let reason = match read_index_file(index_path, log_id, base_offset).await {
        Ok(index) if index.log_size() <= file_size => {
            io_context(file.close().await, "close segment", log_path, 0)?;
            return Ok(SealedSegment { index, rebuilt: None, sidecar_unwritten: None });
        }
        Ok(index) => IndexRebuildReason::Stale { index_log_size: index.log_size(), file_size },
        Err(None) => IndexRebuildReason::Missing,
        Err(Some(error)) => IndexRebuildReason::Damaged(error),
    };
    let scan = scan_segment_file(&file, log_path, log_id, base_offset, index_interval_bytes).await?;
    io_context(file.close().await, "close segment", log_path, 0)?;
    let sidecar_unwritten = match write_index_file(index_path, &scan.index).await {
        Ok(()) => None,
        Err(error) if error.is_storage_full() => Some(error),
        Err(error) => return Err(error),
    };
    Ok(SealedSegment { index: scan.index, rebuilt: Some((reason, scan.outcome)), sidecar_unwritten })
}

/// Scans a segment without writing anything (the disk is full): the index
/// of its whole valid frames, for readers, while the cut that
/// [`recover_segment`] makes waits. An empty file is scanned without being
/// opened (opening a DMA file may need a probe file written first).
pub async fn scan_segment_read_only(
    path: &Path,
    log_id: u64,
    base_offset: u64,
    index_interval_bytes: u32,
) -> Result<FileScan, SegmentError> {
    let metadata = std::fs::metadata(path);
    let metadata =
        metadata.map_err(|source| SegmentError::Io { op: "stat segment", path: path.into(), position: 0, source })?;
    if metadata.len() == 0 {
        let outcome = ScanOutcome { cursor: ScanCursor::at_segment_start(base_offset), stop: ScanStop::EndOfData };
        return Ok(FileScan {
            outcome,
            index: SegmentIndex::new(log_id, base_offset, index_interval_bytes),
            file_size: 0,
        });
    }
    prime_dma_probe(parent_dir(path)).await?;
    let file = io_context(DmaFile::open(path).await, "open segment", path, 0)?;
    let scan = scan_segment_file(&file, path, log_id, base_offset, index_interval_bytes).await;
    let closed = file.close().await;
    let scan = scan?;
    io_context(closed, "close segment", path, 0)?;
    Ok(scan)
}

/// Reads and decodes a sidecar: `Err(None)` when it cannot be read at all.
async fn read_index_file(index_path: &Path, log_id: u64, base_offset: u64) -> Result<SegmentIndex, Option<IndexError>> {
    let file = DmaFile::open(index_path).await.map_err(|_| None)?;
    let size = file.file_size().await.map_err(|_| None)?;
    let size = usize::try_from(size).map_err(|_| None)?;
    let read = file.read_at(0, size).await;
    let _ = file.close().await;
    let bytes = read.map_err(|_| None)?;
    SegmentIndex::decode(&bytes, log_id, base_offset).map_err(Some)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::storage::format::{ScanCursor, ScanStop, scan};
    use crate::storage::segment::tests::{append_test_frame, o_direct_is_on, run, scratch_dir};

    fn config() -> SegmentConfig {
        SegmentConfig { buffer_bytes: 64 << 10, ..SegmentConfig::default() }
    }

    /// Writes `frame_count` frames of log 5 from offset 0, syncing every 4;
    /// returns the file's bytes and the end of every frame.
    fn write_log(path: PathBuf, frame_count: usize) -> (Vec<u8>, Vec<u64>) {
        let ends = run({
            let path = path.clone();
            async move {
                let mut writer = SegmentWriter::create(&path, 5, 0, config()).await.unwrap();
                let mut ends = Vec::new();
                for frame_index in 0..frame_count {
                    append_test_frame(&mut writer, frame_index).unwrap();
                    ends.push(writer.end());
                    if frame_index % 4 == 3 {
                        writer.sync().await.unwrap();
                    }
                }
                writer.sync().await.unwrap();
                writer.close().await.unwrap();
                ends
            }
        });
        (std::fs::read(&path).unwrap(), ends)
    }

    /// Recovers `bytes` as a segment file, appends one frame, syncs, and
    /// returns the report and the file's bytes after.
    fn recover_and_append(path: PathBuf, bytes: &[u8]) -> (RecoveryReport, Vec<u8>, u64) {
        std::fs::write(&path, bytes).unwrap();
        run({
            let path = path.clone();
            async move {
                let (mut writer, report) = recover_segment(&path, 5, 0, config()).await.unwrap();
                assert_eq!(writer.next_offset(), report.outcome.cursor.next_offset);
                append_test_frame(&mut writer, 999).unwrap();
                writer.sync().await.unwrap();
                let next_offset = writer.next_offset();
                writer.close().await.unwrap();
                let bytes = std::fs::read(&path).unwrap();
                (report, bytes, next_offset)
            }
        })
    }

    /// The file holds exactly the whole frames up to `end`, then zeros, and
    /// nothing past the block that holds `end`.
    fn assert_clean_file(bytes: &[u8], frame_count: u64, next_offset: u64) {
        let outcome = scan(bytes, 5, ScanCursor::at_segment_start(0));
        assert!(outcome.stop.is_clean(), "{:?}", outcome.stop);
        assert_eq!((outcome.cursor.frame_count, outcome.cursor.next_offset), (frame_count, next_offset));
        assert_eq!(bytes.len() as u64, align_up(outcome.cursor.position, BLOCK_SIZE));
        assert!(bytes[outcome.cursor.position as usize..].iter().all(|&byte| byte == 0));
    }

    /// A file cut at every byte inside its last frame recovers every frame
    /// before it, and appends after the cut leave a clean log.
    #[test]
    fn recovery_at_every_truncation_of_the_last_frame() {
        let dir = scratch_dir("recover-cut");
        let path = dir.join("00000000000000000000.log");
        let (bytes, ends) = write_log(path.clone(), 12);
        let last_start = ends[10];
        let step = ((ends[11] - last_start) / 97).max(1) as usize;
        let mut cuts: Vec<usize> = (last_start as usize + 1..ends[11] as usize).step_by(step).collect();
        cuts.extend([last_start as usize + 1, ends[11] as usize - 1]);
        for cut in cuts {
            let (report, after, next_offset) = recover_and_append(path.clone(), &bytes[..cut]);
            assert_eq!(report.outcome.cursor.position, last_start, "cut {cut}");
            assert!(matches!(report.outcome.stop, ScanStop::TornTail { .. }), "cut {cut}: {:?}", report.outcome.stop);
            assert_eq!(report.discarded_bytes, cut as u64 - last_start);
            assert_clean_file(&after, 12, next_offset);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A flipped byte anywhere in the last frame is caught (CRC or header
    /// check), the frame is dropped, and its bytes do not survive recovery.
    #[test]
    fn recovery_drops_a_damaged_last_frame() {
        let dir = scratch_dir("recover-flip");
        let path = dir.join("00000000000000000000.log");
        let (bytes, ends) = write_log(path.clone(), 9);
        let (last_start, last_end) = (ends[7] as usize, ends[8] as usize);
        for index in (last_start..last_end).step_by(((last_end - last_start) / 61).max(1)) {
            let mut damaged = bytes.clone();
            damaged[index] ^= 0x04;
            let (report, after, next_offset) = recover_and_append(path.clone(), &damaged);
            assert_eq!(report.outcome.cursor.position, last_start as u64, "byte {index}");
            assert!(!report.outcome.stop.is_clean(), "byte {index}");
            assert_clean_file(&after, 9, next_offset);
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Zeros after the log are a clean end and are cut to the block that
    /// holds the end; valid frames after a damaged one are cut too, so they
    /// can never be read as a continuation of newer appends.
    #[test]
    fn recovery_of_zeros_and_stale_frames() {
        let dir = scratch_dir("recover-zeros");
        let path = dir.join("00000000000000000000.log");
        let (mut bytes, ends) = write_log(path.clone(), 6);
        let log_end = ends[5];
        bytes.resize(bytes.len() + (64 << 10), 0);
        let (report, after, next_offset) = recover_and_append(path.clone(), &bytes);
        assert_eq!((report.outcome.stop, report.outcome.cursor.position), (ScanStop::Zeros, log_end));
        assert_clean_file(&after, 7, next_offset);
        let mut damaged = bytes.clone();
        damaged[ends[1] as usize + 10] ^= 0xFF;
        let (report, after, next_offset) = recover_and_append(path.clone(), &damaged);
        assert_eq!(report.outcome.cursor.position, ends[1]);
        assert_clean_file(&after, 3, next_offset);
        assert_eq!(report.discarded_bytes, damaged.len() as u64 - ends[1]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A sealed segment opens through its sidecar; a damaged, stale or
    /// missing sidecar is rebuilt from the log and written again.
    #[test]
    fn sealed_segment_index_is_never_fatal() {
        let dir = scratch_dir("sealed");
        let log_path = dir.join("00000000000000000000.log");
        let index_path = dir.join("00000000000000000000.index");
        run({
            let (log_path, index_path) = (log_path.clone(), index_path.clone());
            async move {
                let mut writer = SegmentWriter::create(&log_path, 5, 0, config()).await.unwrap();
                for frame_index in 0..50 {
                    append_test_frame(&mut writer, frame_index).unwrap();
                }
                let sealed_index = writer.seal(&index_path).await.unwrap();
                let opened = open_sealed(&log_path, &index_path, 5, 0, 4096).await.unwrap();
                assert_eq!((opened.index, opened.rebuilt), (sealed_index.clone(), None));
                let mut bytes = std::fs::read(&index_path).unwrap();
                bytes[60] ^= 1;
                std::fs::write(&index_path, &bytes).unwrap();
                let opened = open_sealed(&log_path, &index_path, 5, 0, 4096).await.unwrap();
                assert!(
                    matches!(opened.rebuilt, Some((IndexRebuildReason::Damaged(_), outcome)) if outcome.stop.is_clean())
                );
                assert_eq!(opened.index, sealed_index);
                std::fs::remove_file(&index_path).unwrap();
                let opened = open_sealed(&log_path, &index_path, 5, 0, 4096).await.unwrap();
                assert!(matches!(opened.rebuilt, Some((IndexRebuildReason::Missing, _))));
                let opened = open_sealed(&log_path, &index_path, 5, 0, 4096).await.unwrap();
                assert_eq!((opened.index, opened.rebuilt), (sealed_index, None));
            }
        });
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// On a full disk, appends fail with a storage-full error and no panic;
    /// once space is freed the same writer retries and every frame,
    /// including those that failed, ends up durable and readable. Needs root
    /// to mount a 1 MiB tmpfs (O_DIRECT is off there; the aligned path is
    /// covered by the tests on the disk).
    #[test]
    fn disk_full_is_an_error_and_retryable() {
        let dir = scratch_dir("enospc");
        if !crate::storage::mount_tmpfs(&dir, "1m") {
            return;
        }
        let filler = dir.join("filler");
        std::fs::write(&filler, vec![1u8; 700 << 10]).unwrap();
        let path = dir.join("00000000000000000000.log");
        let (frame_count, next_offset) = run({
            let (path, filler) = (path.clone(), filler.clone());
            async move {
                let mut writer = SegmentWriter::create(&path, 5, 0, config()).await.unwrap();
                assert!(!o_direct_is_on(writer_file(&writer)), "tmpfs has no O_DIRECT");
                let mut frame_index = 0;
                let error = loop {
                    append_test_frame(&mut writer, frame_index).unwrap();
                    frame_index += 1;
                    if let Err(error) = writer.sync().await {
                        break error;
                    }
                    assert!(frame_index < 10_000, "the disk never filled");
                };
                assert!(error.is_storage_full(), "{error}");
                assert!(writer.durable().0 < writer.end());
                std::fs::remove_file(&filler).unwrap();
                writer.sync().await.unwrap();
                assert_eq!(writer.durable().0, writer.end());
                let next_offset = writer.next_offset();
                writer.close().await.unwrap();
                (frame_index as u64, next_offset)
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        let outcome = scan(&bytes, 5, ScanCursor::at_segment_start(0));
        assert!(outcome.stop.is_clean(), "{:?}", outcome.stop);
        assert_eq!((outcome.cursor.frame_count, outcome.cursor.next_offset), (frame_count, next_offset));
        let _ = std::process::Command::new("umount").arg(&dir).status();
        std::fs::remove_dir_all(dir).unwrap();
    }

    fn writer_file(writer: &SegmentWriter) -> &DmaFile {
        writer.file_for_tests()
    }
}
