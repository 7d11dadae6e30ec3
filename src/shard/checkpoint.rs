//! Checkpoints of a shard's write-ahead log: the segment files catch up
//! with the log in bulk, so the log's files can be reused.
//!
//! Commit rounds write segment files *behind* the log
//! ([`super::commit::WRITE_BEHIND_BYTES`] at a time), never sync them, and
//! leave the last part of each partition's frames in its writer's buffer.
//! Every `--wal-checkpoint-ms`, or as soon as a round finds half the log
//! used, a checkpoint:
//!
//! 1. asks the committer for a *snapshot*, taken between two rounds (every
//!    writer is then in its partition): the log's end, and each partition
//!    written since the last snapshot with the offset its writer reached;
//! 2. gets each of those partitions' frames up to that offset into the
//!    file (sealing the writer's buffer into a write-behind, waiting for
//!    it), and fdatasyncs the file through the writer's own file handle,
//!    a few partitions at a time, while rounds go on;
//! 3. writes the checkpoint at the snapshot's log end: every frame before
//!    it is now in synced segment files, so recovery starts the log there
//!    and the files wholly before it are free.
//!
//! A failure (ENOSPC, EIO) leaves the checkpoint where it was: the log
//! keeps everything since, and the next attempt comes after
//! [`STORAGE_RETRY_MS`]. A log that fills up meanwhile makes a round sync
//! the segments directly ([`sync_segments_directly`]).

use std::rc::Rc;
use std::time::Duration;

use crate::config::STORAGE_RETRY_MS;
use crate::runtime::log;
use crate::shard::Shard;
use crate::shard::commit::WalState;
use crate::shard::commit::{Reaped, reap_write_behind};
use crate::shard::metrics::ShardMetrics;
use crate::storage::index::SegmentIndex;
use crate::storage::segment::{BLOCK_SIZE, SegmentError, WriteBehind, io_context, sync_parent_dir};
use crate::storage::wal::Wal;

/// Partitions a checkpoint makes durable at once (each fdatasync and
/// write-behind is one request in flight). Each fdatasync is a device
/// cache flush, and a round's own fdatasync of the log queues behind the
/// ones in flight: with 16, every checkpoint (2 s) held the `#SYNC`s of
/// the rounds under way 3.5 – 8 ms, the p99 of `scripts/bench-sync` at 256
/// partitions; with 2 the checkpoint takes longer and nobody waits for it
/// (README, Benchmarks, "Issue 24 before and after").
const CHECKPOINT_PARTITIONS_IN_FLIGHT_MAX: usize = 2;

/// What a checkpoint makes durable: taken between two rounds.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// The log's end: every frame before it is in a writer or a file.
    lsn: u64,
    /// Each partition that took frames since the last snapshot, with the
    /// offset its writer had reached.
    targets: Vec<(u32, u64)>,
}

/// Takes the snapshot a checkpoint asked for (call between rounds).
pub(super) fn take_snapshot_if_requested(shard: &Shard) {
    let Some(committer) = &shard.committer else { return };
    let state = &committer.wal;
    if !state.snapshot_requested.replace(false) {
        return;
    }
    // At a record boundary: a round that bypassed the log, or one that
    // failed, may leave a record open, and a checkpoint inside a record
    // would start replay in the middle of it.
    let Some(lsn) = state.wal.borrow_mut().as_mut().map(|wal| {
        wal.close_open_record();
        wal.end_lsn()
    }) else {
        return;
    };
    let dirty = take_dirty(state);
    let partitions = shard.partitions.borrow();
    let targets = dirty
        .into_iter()
        .filter_map(|id| {
            let disk = partitions.get(id)?.log.disk()?;
            Some((id, disk.writer()?.next_offset()))
        })
        .collect();
    // From here until the checkpoint ends, a round that finds the log
    // full waits for it ([`sync_segments_directly`]): the snapshot's
    // partitions are no longer on the dirty list it syncs.
    state.running.set(true);
    state.snapshot.replace(Some(Snapshot { lsn, targets }));
    committer.round_waiters.wake_all();
}

/// The checkpointer of a shard with a write-ahead log (see the module doc).
pub(super) async fn run_checkpoints(shard: Rc<Shard>) {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    let mut failing = false;
    loop {
        // Nothing logged since the last checkpoint: no timer, so an idle
        // shard is not woken every interval for nothing.
        while state.logged_lsn.get() <= state.checkpoint_lsn.get() {
            state.logged.notified().await;
        }
        let timer = glommio::timer::sleep(state.interval);
        let _ = crate::runtime::notify::first(state.notify.notified(), timer).await;
        if state.checkpointing.get() || state.logged_lsn.get() <= state.checkpoint_lsn.get() {
            continue;
        }
        let checkpointed = checkpoint(&shard).await;
        match checkpointed {
            Ok(()) => {
                ShardMetrics::add(&shard.metrics.wal_checkpoints, 1);
                if std::mem::replace(&mut failing, false) {
                    log::info!(shard = shard.id, "write-ahead log checkpoints succeed again");
                }
            }
            Err(error) => {
                ShardMetrics::add(&shard.metrics.storage_errors, 1);
                if !std::mem::replace(&mut failing, true) {
                    log::warn!(
                        shard = shard.id,
                        "write-ahead log checkpoint: {error}; the log keeps what it holds, retrying"
                    );
                }
                glommio::timer::sleep(Duration::from_millis(STORAGE_RETRY_MS)).await;
            }
        }
    }
}

/// A last checkpoint at a clean stop, after the drain: the segment files
/// then hold everything, so the next start replays nothing (and a start
/// on a full disk needs no space for it). Bounded by
/// [`STOP_CHECKPOINT_MS`]; past it, or on an error, the log keeps what the
/// files lack and the next start replays it.
pub async fn checkpoint_at_stop(shard: &Rc<Shard>) {
    let Some(committer) = &shard.committer else { return };
    let state = &committer.wal;
    if !state.enabled.get() {
        return;
    }
    let last = async {
        state.ended.wait_until(|| !state.checkpointing.get()).await;
        if state.logged_lsn.get() <= state.checkpoint_lsn.get() {
            return;
        }
        let checkpointed = checkpoint(shard).await;
        if let Err(error) = checkpointed {
            log::warn!(shard = shard.id, "last write-ahead log checkpoint: {error}; the next start replays the log");
        }
    };
    let bound = glommio::timer::sleep(Duration::from_millis(STOP_CHECKPOINT_MS));
    if let crate::runtime::notify::Either::Right(()) = crate::runtime::notify::first(last, bound).await {
        log::warn!(
            shard = shard.id,
            "last write-ahead log checkpoint: not done in {STOP_CHECKPOINT_MS} ms; the next start replays the log"
        );
    }
}

/// How long a clean stop waits for its last checkpoint, in ms.
const STOP_CHECKPOINT_MS: u64 = 5000;

/// One checkpoint: snapshot, partitions durable, checkpoint written.
/// Periodic and last checkpoints run one at a time (`checkpointing`).
async fn checkpoint(shard: &Rc<Shard>) -> Result<(), SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    state.checkpointing.set(true);
    state.snapshot_requested.set(true);
    committer.notify.notify();
    committer.round_waiters.wait_until(|| state.snapshot.borrow().is_some()).await;
    let snapshot = state.snapshot.take().expect("just taken");
    let checkpointed = match make_durable(shard, &snapshot.targets).await {
        Ok(()) => {
            write_positions(shard).await;
            write_checkpoint(shard, snapshot.lsn).await
        }
        Err(error) => {
            // The next snapshot covers them again.
            state.dirty.borrow_mut().extend(snapshot.targets.iter().map(|&(id, _)| id));
            Err(error)
        }
    };
    state.running.set(false);
    state.checkpointing.set(false);
    state.ended.wake_all();
    checkpointed
}

/// Makes every partition's frames below its target offset durable in its
/// files, a few partitions at a time, and records each one's durable prefix.
async fn make_durable(shard: &Rc<Shard>, targets: &[(u32, u64)]) -> Result<(), SegmentError> {
    let durable =
        in_chunks(targets, |&(partition_id, offset)| partition_durable(shard.clone(), partition_id, offset)).await?;
    let positions = &shard.committer.as_ref().expect("disk storage").wal.positions;
    positions.borrow_mut().extend(durable.into_iter().flatten().map(|index| (index.log_id(), index)));
    Ok(())
}

/// Runs `run` on every item, [`CHECKPOINT_PARTITIONS_IN_FLIGHT_MAX`] tasks
/// at a time; stops after the first chunk with an error, and returns it.
async fn in_chunks<I, T, F>(items: &[I], run: impl Fn(&I) -> F) -> Result<Vec<T>, SegmentError>
where
    F: std::future::Future<Output = Result<T, SegmentError>> + 'static,
    T: 'static,
{
    let mut done = Vec::with_capacity(items.len());
    for chunk in items.chunks(CHECKPOINT_PARTITIONS_IN_FLIGHT_MAX) {
        let tasks: Vec<_> = chunk.iter().map(|item| glommio::spawn_local(run(item))).collect();
        let mut first_error = None;
        for task in tasks {
            match task.await {
                Ok(value) => done.push(value),
                Err(error) => first_error = first_error.or(Some(error)),
            }
        }
        if let Some(error) = first_error {
            return Err(error);
        }
    }
    Ok(done)
}

/// What a partition needs next on its way to durable.
enum Step {
    /// Gone (deleted, handed off: a handoff syncs it) or without a writer
    /// that could hold frames: nothing to do.
    Nothing,
    /// Its writer is out for a round: wait for the round's end.
    WriterOut,
    /// A write-behind runs: wait for it.
    Writing(WriteBehind),
    /// Everything up to the target is written: fdatasync this file, after
    /// which the index of what it holds is durable.
    Sync(Rc<glommio::io::DmaFile>, std::path::PathBuf, SegmentIndex),
}

/// Makes one partition durable up to `target_offset`; returns the index of
/// its active segment's durable prefix (`None` when it needs nothing).
async fn partition_durable(
    shard: Rc<Shard>,
    partition_id: u32,
    target_offset: u64,
) -> Result<Option<SegmentIndex>, SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    loop {
        match next_step(&shard, partition_id, target_offset)? {
            Step::Nothing => return Ok(None),
            Step::WriterOut => committer.round_waiters.wait_until(|| writer_back(&shard, partition_id)).await,
            Step::Writing(behind) => behind.ended().await,
            Step::Sync(file, path, durable) => {
                io_context(file.fdatasync().await, "fdatasync segment", &path, 0)?;
                return Ok(Some(durable));
            }
        }
    }
}

/// Whether a partition's writer is back (or the partition gone, or no
/// round running that could hold it): not the round's end, which may
/// itself wait for this checkpoint when the log is full.
fn writer_back(shard: &Shard, partition_id: u32) -> bool {
    let in_round = shard.committer.as_ref().is_some_and(|committer| committer.in_round.get());
    let partitions = shard.partitions.borrow();
    let back = partitions
        .get(partition_id)
        .and_then(|partition| partition.log.disk())
        .is_none_or(|disk| disk.writer().is_some());
    back || !in_round
}

fn next_step(shard: &Shard, partition_id: u32, target_offset: u64) -> Result<Step, SegmentError> {
    if let Reaped::Failed(error) = reap_write_behind(shard, partition_id) {
        return Err(error);
    }
    let mut partitions = shard.partitions.borrow_mut();
    let Some(partition) = partitions.get_mut(partition_id) else { return Ok(Step::Nothing) };
    let (_, disk) = partition.log.parts_mut();
    let Some(disk) = disk else { return Ok(Step::Nothing) };
    let Some(writer) = disk.writer_mut() else {
        // Out for a round, or deferred (a full disk at start: such a
        // partition took no frames).
        let in_round = shard.committer.as_ref().is_some_and(|committer| committer.in_round.get());
        return Ok(if in_round { Step::WriterOut } else { Step::Nothing });
    };
    if let Some(behind) = writer.write_behind() {
        return Ok(Step::Writing(behind));
    }
    // A writer that rolled since the snapshot starts at or past the
    // target: its predecessor was synced when it was sealed.
    let (written_end, written_offset) = writer.written();
    if written_offset >= target_offset {
        let durable = writer.index().prefix(written_end, written_offset);
        return Ok(Step::Sync(writer.file_handle(), writer.path().to_path_buf(), durable));
    }
    // Too many writes pending cannot be: none runs, so they are written
    // next; the buffer then joins them at the next step.
    let _ = writer.seal_buffered();
    if !writer.start_write_behind() {
        return Err(SegmentError::Io {
            op: "checkpoint segment",
            path: writer.path().to_path_buf(),
            position: writer.written().0,
            source: std::io::Error::other("frames below the checkpoint are neither written nor writable"),
        });
    }
    Ok(Step::Writing(writer.write_behind().expect("just started")))
}

/// Writes the positions file (every partition's durable active prefix)
/// in place of the last one: a temporary file written and synced through
/// DMA, renamed, the directory synced. A failure is logged and counted, not
/// fatal: recovery then scans more of the active segments.
async fn write_positions(shard: &Shard) {
    let state = &shard.committer.as_ref().expect("disk storage").wal;
    {
        // Only partitions owned now: a deleted stream's entries go, and a
        // partition moved away is the thief's to record.
        let owned: std::collections::HashSet<u64> = shard
            .partitions
            .borrow()
            .iter()
            .filter_map(|(_, partition)| partition.log.disk().map(|disk| disk.log_id()))
            .collect();
        state.positions.borrow_mut().retain(|log_id, _| owned.contains(log_id));
    }
    let bytes = crate::storage::wal::encode_positions(state.positions.borrow().values());
    let dir = crate::storage::wal::wal_dir(&shard.config.data_dir, shard.id);
    let path = dir.join(crate::storage::wal::POSITIONS_FILE_NAME);
    if let Err(error) = replace_with_dma(&path, &bytes).await {
        ShardMetrics::add(&shard.metrics.storage_errors, 1);
        log::warn!(shard = shard.id, "write-ahead log positions file: {error}; the next start scans more");
    }
}

async fn replace_with_dma(path: &std::path::Path, bytes: &[u8]) -> Result<(), SegmentError> {
    let temporary = path.with_extension("tmp");
    let opened = glommio::io::OpenOptions::new().write(true).create(true).truncate(true).dma_open(&temporary).await;
    let file = io_context(opened, "create positions file", &temporary, 0)?;
    let size = (bytes.len() as u64).div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
    let mut buffer = file.alloc_dma_buffer(size.max(BLOCK_SIZE) as usize);
    buffer.as_bytes_mut().fill(0);
    buffer.as_bytes_mut()[..bytes.len()].copy_from_slice(bytes);
    let written = async {
        io_context(file.write_at(buffer, 0).await, "write positions file", &temporary, 0)?;
        io_context(file.truncate(bytes.len() as u64).await, "truncate positions file", &temporary, 0)?;
        io_context(file.fdatasync().await, "fdatasync positions file", &temporary, 0)
    }
    .await;
    let _ = file.close().await;
    written?;
    std::fs::rename(&temporary, path).map_err(|source| SegmentError::Io {
        op: "rename positions file",
        path: path.to_path_buf(),
        position: 0,
        source,
    })?;
    sync_parent_dir(path).await
}

/// Writes the checkpoint at `lsn` and frees the log behind it. One the log
/// owes (a restart whose checkpoint failed) is paid by any at or past it.
async fn write_checkpoint(shard: &Shard, lsn: u64) -> Result<(), SegmentError> {
    let state = &shard.committer.as_ref().expect("disk storage").wal;
    if lsn <= state.checkpoint_lsn.get() {
        return Ok(());
    }
    let mut checkpoint = state.checkpoint.borrow_mut().take().expect("one checkpoint writer at a time");
    let written = checkpoint.write(lsn).await;
    state.checkpoint.replace(Some(checkpoint));
    written?;
    state.checkpoint_lsn.set(lsn);
    if state.checkpoint_owed.get().is_some_and(|owed| owed <= lsn) {
        state.checkpoint_owed.set(None);
    }
    Ok(())
}

/// Takes the partitions written since the last snapshot, each once, in
/// order (a failed pass over them puts them back).
fn take_dirty(state: &WalState) -> Vec<u32> {
    let mut dirty = std::mem::take(&mut *state.dirty.borrow_mut());
    dirty.sort_unstable();
    dirty.dedup();
    dirty
}

/// Runs `work` as the one writer of checkpoints: once a running
/// checkpoint or direct sync has ended, holding the next ones off until it
/// is done. Inside a round every writer is in its partition, so a
/// checkpoint waited for ends.
async fn exclusively<T>(state: &WalState, work: impl std::future::Future<Output = T>) -> T {
    state.ended.wait_until(|| !state.running.get()).await;
    state.running.set(true);
    let done = work.await;
    state.running.set(false);
    state.ended.wake_all();
    done
}

/// Writes the checkpoint the log owes (a restart whose checkpoint could
/// not be written), if any: before the log writes anything past it.
pub(super) async fn pay_owed_checkpoint(shard: &Shard) -> Result<(), SegmentError> {
    let state = &shard.committer.as_ref().expect("disk storage").wal;
    let Some(lsn) = state.checkpoint_owed.get() else { return Ok(()) };
    exclusively(state, write_checkpoint(shard, lsn)).await
}

/// Once the segments hold everything the log held, durably: starts the log
/// again at its next file ([`Wal::restart_after_direct_sync`]) and writes
/// the checkpoint there, or, when it cannot be written, leaves a debt the
/// next write of the log pays first.
async fn restart_log(shard: &Shard, wal: &mut Wal) -> Result<(), SegmentError> {
    let state = &shard.committer.as_ref().expect("disk storage").wal;
    let restart_lsn = wal.restart_after_direct_sync();
    state.unwritten_after_failure.set(false);
    // Every record written so far is durable in its segment file.
    state.unlogged.set(false);
    state.unlogged_bytes.set(0);
    let written = write_checkpoint(shard, restart_lsn).await;
    if written.is_err() {
        state.checkpoint_owed.set(Some(restart_lsn));
    }
    written
}

/// Under `--fsync interval` or `always`, in place of writing the log (see
/// [`super::commit`], "Rounds that bypass the log"): inside a round, with
/// every writer in its partition, writes what every partition written
/// since the last snapshot still holds, makes all of it durable with one
/// `syncfs` of the segments' filesystem (on glommio's blocking thread),
/// and starts the log again at its next file, so the records it held in
/// memory are never written. While a checkpoint runs it waits for it
/// when `wait`, and otherwise returns `Ok(false)` at once, having done
/// nothing. Counted as `spate_wal_filesystem_syncs_total`.
pub(super) async fn sync_by_filesystem(shard: &Rc<Shard>, wal: &mut Wal, wait: bool) -> Result<bool, SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    if state.running.get() && !wait {
        return Ok(false);
    }
    let synced = exclusively(state, async {
        let dirty = take_dirty(state);
        let flushed = in_chunks(&dirty, |&id| super::commit::flush_partition(shard.clone(), id)).await;
        let flushed = match flushed {
            Ok(flushed) => flushed,
            Err(error) => {
                state.dirty.borrow_mut().extend(dirty);
                return Err(error);
            }
        };
        if let Err(error) = syncfs(shard).await {
            state.dirty.borrow_mut().extend(dirty);
            return Err(error);
        }
        // Durable now: what recovery may trust without a scan.
        state.positions.borrow_mut().extend(flushed.into_iter().flatten().map(|index| (index.log_id(), index)));
        restart_log(shard, wal).await
    })
    .await;
    synced?;
    ShardMetrics::add(&shard.metrics.wal_filesystem_syncs, 1);
    Ok(true)
}

/// `syncfs` of the filesystem that holds the segments (`<data-dir>/streams`,
/// [`crate::storage::dir::stream_dir`]), through a handle kept open for the
/// run.
async fn syncfs(shard: &Shard) -> Result<(), SegmentError> {
    let state = &shard.committer.as_ref().expect("disk storage").wal;
    let dir = shard.config.data_dir.join("streams");
    let failed = |op, source| SegmentError::Io { op, path: dir.clone(), position: 0, source };
    let kept = state.filesystem.borrow().clone();
    let file = match kept {
        Some(file) => file,
        None => {
            let file = std::sync::Arc::new(
                std::fs::File::open(&dir).map_err(|source| failed("open segments directory", source))?,
            );
            state.filesystem.replace(Some(file.clone()));
            file
        }
    };
    let synced = glommio::executor()
        .spawn_blocking(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: syncfs takes any open descriptor; `file` keeps it open.
            if unsafe { libc::syncfs(file.as_raw_fd()) } == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
        })
        .await;
    synced.map_err(|source| failed("syncfs", source))
}

/// The log is full (a checkpoint could not keep up): inside a round, with
/// every writer in its partition, waits for a running checkpoint, then
/// writes and fdatasyncs every partition written since the last snapshot
/// and starts the log again at its next file.
pub(super) async fn sync_segments_directly(shard: &Rc<Shard>, wal: &mut Wal) -> Result<(), SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    exclusively(state, async {
        ShardMetrics::add(&shard.metrics.wal_direct_syncs, 1);
        let dirty = take_dirty(state);
        // Written and synced in full, each writer taken out for the awaits
        // (only inside a round, where rounds cannot collide).
        let synced = in_chunks(&dirty, |&id| super::commit::sync_partition(shard.clone(), id)).await;
        if let Err(error) = synced {
            state.dirty.borrow_mut().extend(dirty);
            return Err(error);
        }
        restart_log(shard, wal).await
    })
    .await
}
