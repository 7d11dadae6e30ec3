//! The committer: group commit of everything a shard applied to partitions
//! on disk, and what durability then allows.
//!
//! Apply only appends to each partition's tail cache (memory, no I/O). One
//! committer task per shard runs rounds back to back while there is work:
//!
//! 1. take the credit grants of the batches applied so far;
//! 2. write: for every partition with records not in its files, encode them
//!    into frames and write them (all partitions concurrently, each with its
//!    writer taken out of the partition so no borrow is held across an
//!    await); a full segment is sealed and a new one started;
//! 3. sync, when the policy says: always with `--fsync always`; with
//!    `interval` when `--fsync-interval-ms` has passed, when a `#SYNC` asked
//!    for it, or when the unsynced bytes pass their bound; never with
//!    `never` (a write handed to the kernel survives `kill -9`). With the
//!    write-ahead log, a round writes and syncs the log once for all its
//!    partitions ([`commit_round_logged`]); under `interval` and `always`
//!    a large round writes its segments instead and syncs them with one
//!    `syncfs` ([`commit_bypassing_log`]);
//! 4. then, and only then: readers see the new records (visible = written,
//!    or durable with `always`), the grants go back to their sources, and
//!    the grants of batches that carried a `#SYNC` go back once a round
//!    with an fdatasync covered them.
//!
//! So a credit grant means "stored as the policy promises", and the `#SYNC`
//! barrier (which waits for every grant of a connection's batches) answers
//! only once the events before it are durable under the policy. Memory
//! stays bounded the same way it always was: a source cannot have more than
//! its credit window applied and not yet committed.
//!
//! A write or sync error (ENOSPC, EIO) fails the round: nothing is released,
//! the error is logged once per episode and counted, and the round is
//! retried every [`STORAGE_RETRY_MS`]. Producers are pushed back through
//! their credits meanwhile; when space returns the retry succeeds and
//! everything resumes by itself.
//!
//! A shard whose partitions opened on a full disk starts *read-only*
//! ([`Committer::defer`]): the writes the open could not make (see
//! [`crate::partition::disk`]) wait, and every round first tries them
//! ([`complete_deferred`]), so until they succeed each round fails as
//! above: subscribers read what is stored, producers are pushed back, and
//! `#SYNC`s wait. The first round that gets them done ends the read-only
//! state and goes on with what was held.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::config::{Config, FsyncPolicy, STORAGE_RETRY_MS, WalBypass};
use crate::partition::Partition;
use crate::partition::disk::{Deferred, DiskLog, Encoded, encode_pending, now_unix_ms};
use crate::routing::CreditGrant;
use crate::runtime::log;
use crate::runtime::notify::{Notify, WaitList};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::storage::format::parse_header;
use crate::storage::segment::{SegmentError, SegmentWriter, check_writable};
use crate::storage::wal::{CheckpointFile, LogFrames, ReplayProgress, Wal, WalError, WalGeometry, WalReplay, wal_dir};

/// How often the committer applies retention (deletes expired segments)
/// after commit rounds, in ms.
const RETENTION_CHECK_MS: u64 = 1000;
/// The longest an idle committer sleeps between retention checks, in ms:
/// it wakes when the oldest sealed segment's age limit comes
/// ([`next_age_expiry`]), at least [`RETENTION_CHECK_MS`] apart and at most
/// this. A consumer group's `hold` that moves lets a segment go at the next
/// check, up to this late on a stream nobody writes to. (A fixed check every
/// second woke every idle shard once a second for nothing.)
const RETENTION_IDLE_CHECK_MS_MAX: u64 = 10_000;
/// How often a shard waiting for the others to replay the write-ahead
/// logs at start-up looks again, in ms.
const REPLAY_WAIT_POLL_MS: u64 = 2;

/// The shard's write-ahead log and its checkpoint ([`crate::storage::wal`],
/// [`super::checkpoint`]).
#[derive(Default)]
pub(super) struct WalState {
    /// Whether the shard has a log (`--fsync always` or `interval`, once it
    /// opened): then every round appends its frames to it.
    pub(super) enabled: Cell<bool>,
    /// The writer; out of the cell while a round writes it.
    pub(super) wal: RefCell<Option<Wal>>,
    /// The checkpoint; out of the cell while one is written.
    pub(super) checkpoint: RefCell<Option<CheckpointFile>>,
    /// The log position before which every frame is durable in segments.
    pub(super) checkpoint_lsn: Cell<u64>,
    /// The log's end after the last round (what a checkpoint could cover).
    pub(super) logged_lsn: Cell<u64>,
    /// Partitions whose writers took frames since the last checkpoint's
    /// snapshot.
    pub(super) dirty: RefCell<Vec<u32>>,
    /// Partitions with a write-behind running, to reap.
    pub(super) behind: RefCell<Vec<u32>>,
    /// A checkpoint asks for a snapshot, taken between rounds.
    pub(super) snapshot_requested: Cell<bool>,
    pub(super) snapshot: RefCell<Option<super::checkpoint::Snapshot>>,
    /// A snapshot's checkpoint or a direct sync is under way (they
    /// exclude each other).
    pub(super) running: Cell<bool>,
    /// A checkpoint task runs, from its request to its end.
    pub(super) checkpointing: Cell<bool>,
    /// Each partition's active segment prefix known durable (by log id),
    /// written to the positions file at every checkpoint so recovery scans
    /// only what follows ([`crate::storage::wal::POSITIONS_FILE_NAME`]).
    pub(super) positions: RefCell<std::collections::HashMap<u64, crate::storage::index::SegmentIndex>>,
    pub(super) ended: WaitList,
    /// Asks the checkpointer for a checkpoint now (half the log is used).
    pub(super) notify: Notify,
    /// A round logged frames: the checkpointer, which sleeps without a
    /// timer while nothing waits to be checkpointed, has work again.
    pub(super) logged: Notify,
    pub(super) interval: Duration,
    /// Allocating the log ahead of its end failed once this run
    /// ([`allocate_ahead`]): not tried again.
    pub(super) allocation_failed: Cell<bool>,
    /// The segments' directory, opened once for the run's filesystem
    /// syncs ([`super::checkpoint::sync_by_filesystem`]): an error of the
    /// filesystem is reported to each open file once, so one kept open
    /// reports every error since the last sync.
    pub(super) filesystem: RefCell<Option<std::sync::Arc<std::fs::File>>>,
    /// A round failed since the log was last written in full: some of the
    /// records it holds may have frames in no file, so no round bypasses
    /// the log until one writes it ([`bypasses_log`]).
    pub(super) unwritten_after_failure: Cell<bool>,
    /// The log restarted at this position ([`Wal::restart_after_direct_sync`])
    /// and the checkpoint there could not be written: the next write of the
    /// log writes it first, or fails (records past it would be out of
    /// replay's reach).
    pub(super) checkpoint_owed: Cell<Option<u64>>,
    /// A filesystem sync failed and the failure is logged (once per episode).
    pub(super) filesystem_sync_failing: Cell<bool>,
    /// Records a round wrote to their segment files without copying them
    /// into the log ([`commit_round_logged`]) are not durable yet: until a
    /// filesystem sync or a direct sync makes them so (and starts the log
    /// again), a sync must go through the filesystem, never the log alone.
    pub(super) unlogged: Cell<bool>,
    /// Bytes those rounds wrote: unsynced bytes the log does not count.
    pub(super) unlogged_bytes: Cell<usize>,
    /// The start-up replay, until this shard has done its part.
    replay: RefCell<Option<std::sync::Arc<WalReplay>>>,
}

/// One shard's committer state.
pub struct Committer {
    policy: FsyncPolicy,
    /// `--wal-bypass on` (see [`bypasses_log`]).
    bypass: bool,
    interval: Duration,
    unsynced_bytes_max: usize,
    pub(super) notify: Notify,
    /// Grants of applied batches, in apply order: each goes back after the
    /// first round that starts after it was queued (after the first synced
    /// one when its batch carried a `#SYNC`). One FIFO for all, because a
    /// source takes its grants strictly in sequence: a grant waiting for a
    /// sync holds back the ones queued after it.
    grants: RefCell<VecDeque<(u16, CreditGrant)>>,
    sync_requested: Cell<bool>,
    /// Rounds completed, and the last one that synced.
    rounds: Cell<u64>,
    synced_round: Cell<u64>,
    pub(super) round_waiters: WaitList,
    /// Rounds ended, successful or not ([`Committer::round_ended`]).
    round_ends: Cell<u64>,
    last_sync: Cell<Instant>,
    /// Bytes written and not yet synced, over all partitions.
    unsynced_bytes: Cell<usize>,
    failing: Cell<bool>,
    /// A round is running (between its start and its end).
    pub(super) in_round: Cell<bool>,
    /// Partitions whose write failed, for the next round.
    retry: RefCell<Vec<u32>>,
    /// Partitions written since the last round finished (their visible
    /// offsets move at its end).
    written: RefCell<Vec<u32>>,
    /// Partitions written since the last fdatasync.
    unsynced: RefCell<Vec<u32>>,
    last_expiry: Cell<Instant>,
    /// Partitions to take out of the shard at the next gap between rounds
    /// ([`Committer::detach`]), and those taken out, for their callers.
    /// `(partition, retire)`: retire marks it a deleted stream's, so records
    /// still in flight for it are discarded from that moment on.
    detach_requested: RefCell<Vec<(u32, bool)>>,
    detached: RefCell<Vec<(u32, Option<Box<Partition>>)>>,
    /// Why this shard is read-only: writes deferred because the disk was
    /// full when its partitions were opened; `None` once they are done.
    read_only: RefCell<Option<String>>,
    /// Where a probe file could not be written: writing one there again is
    /// the check that space is back.
    space_check_dir: RefCell<Option<PathBuf>>,
    /// A clean stop asks the committer to cut every segment file after its
    /// last block ([`Committer::trim_at_stop`]); `trims` counts the times
    /// it did.
    trim_requested: Cell<bool>,
    trims: Cell<u64>,
    pub(super) wal: WalState,
}

impl Committer {
    pub fn new(config: &Config) -> Committer {
        Committer {
            policy: config.fsync,
            bypass: config.wal_bypass == WalBypass::On,
            interval: Duration::from_millis(config.fsync_interval_ms),
            unsynced_bytes_max: config.fsync_pending_bytes_max,
            notify: Notify::default(),
            grants: RefCell::default(),
            sync_requested: Cell::new(false),
            rounds: Cell::new(0),
            synced_round: Cell::new(0),
            round_waiters: WaitList::default(),
            round_ends: Cell::new(0),
            last_sync: Cell::new(Instant::now()),
            unsynced_bytes: Cell::new(0),
            failing: Cell::new(false),
            in_round: Cell::new(false),
            retry: RefCell::default(),
            written: RefCell::default(),
            unsynced: RefCell::default(),
            last_expiry: Cell::new(Instant::now()),
            detach_requested: RefCell::default(),
            detached: RefCell::default(),
            read_only: RefCell::new(None),
            space_check_dir: RefCell::new(None),
            trim_requested: Cell::new(false),
            trims: Cell::new(0),
            wal: WalState { interval: Duration::from_millis(config.wal_checkpoint_ms), ..WalState::default() },
        }
    }

    /// The frames of log `log_id` to replay, if any.
    pub fn take_replay_frames(&self, log_id: u64) -> Option<LogFrames> {
        self.wal.replay.borrow().as_ref()?.take(log_id)
    }

    /// The durable prefix of log `log_id`'s active segment that a
    /// checkpoint recorded, if any (recovery then scans only what follows).
    pub fn take_replay_position(&self, log_id: u64) -> Option<crate::storage::index::SegmentIndex> {
        self.wal.replay.borrow().as_ref()?.take_position(log_id)
    }

    /// At a clean stop, once every event is applied and written: has the
    /// committer cut each active segment file after its last block at the
    /// next gap between rounds (writers grow their files ahead of their
    /// writes, [`crate::storage::segment`]), so the next start finds
    /// nothing to cut and no space stays allocated past the data. Waits at
    /// most [`TRIM_AT_STOP_MS`]; a file left long is cut by the next start.
    pub async fn trim_at_stop(&self) {
        let before = self.trims.get();
        self.trim_requested.set(true);
        self.notify.notify();
        let done = self.round_waiters.wait_until(|| self.trims.get() > before);
        let bound = glommio::timer::sleep(Duration::from_millis(TRIM_AT_STOP_MS));
        let _ = crate::runtime::notify::first(done, bound).await;
    }

    /// Takes partitions out of the shard (a stream deletion, a handoff) at
    /// the next gap between rounds, when every writer is back in its
    /// partition: only the committer takes writers out, and only inside a
    /// round, so a partition can never leave while its writer is out (a
    /// removal racing a round made `put_back` find the partition gone).
    /// With `retire`, the partitions belong to a deleted stream: they are
    /// marked retired in the same step ([`PartitionManager::retire`]), owned
    /// here or not. Returns each requested partition, `None` for one not
    /// owned here.
    ///
    /// [`PartitionManager::retire`]: crate::partition::PartitionManager::retire
    pub async fn detach(&self, partition_ids: &[u32], retire: bool) -> Vec<(u32, Option<Box<Partition>>)> {
        self.detach_requested.borrow_mut().extend(partition_ids.iter().map(|&id| (id, retire)));
        self.notify.notify();
        let all_detached = || {
            let detached = self.detached.borrow();
            partition_ids.iter().all(|id| detached.iter().any(|(detached_id, _)| detached_id == id))
        };
        self.round_waiters.wait_until(all_detached).await;
        let mut detached = self.detached.borrow_mut();
        let (mine, others) = detached.drain(..).partition(|(id, _)| partition_ids.contains(id));
        *detached = others;
        mine
    }

    /// Makes the shard read-only for `reason` (the first one is kept):
    /// every round first does the deferred writes, and fails, holding
    /// everything, until they succeed. `space_check_dir` is where a probe
    /// file could not be written, to try again.
    pub fn defer(&self, reason: String, space_check_dir: Option<PathBuf>) {
        self.read_only.borrow_mut().get_or_insert(reason);
        if let Some(dir) = space_check_dir {
            self.space_check_dir.borrow_mut().get_or_insert(dir);
        }
        // The start-up log said why: the failing rounds log nothing more.
        self.failing.set(true);
        self.notify.notify();
    }

    /// Whether writes deferred by a full disk at open still wait.
    pub fn is_read_only(&self) -> bool {
        self.read_only.borrow().is_some()
    }

    /// Why the shard is read-only, while it is.
    pub fn read_only_reason(&self) -> Option<String> {
        self.read_only.borrow().clone()
    }

    /// Whether `grant` may go back at once instead of after the next
    /// round: its batches stored nothing here (every record went to a
    /// replicated partition's Raft group, which answered once they were
    /// committed: durable on a majority), every grant before it went back
    /// (so a source's grants stay in sequence, and what they covered is
    /// stored as the policy promises), and, for a `#SYNC` under
    /// `interval`, no unsynced round may have released an earlier grant:
    /// only `always` (every round syncs) and `never` (written is what it
    /// promises) say so without a round.
    pub fn releases_at_once(&self, grant: &CreditGrant) -> bool {
        let stored_nothing = grant.recycled.is_empty() && grant.more_recycled.iter().all(Vec::is_empty);
        stored_nothing
            && self.grants.borrow().is_empty()
            && (!grant.sync || self.policy != FsyncPolicy::Interval)
            && !self.failing.get()
    }

    /// A batch was applied: its grant goes back after the next round
    /// (after the next synced round when it carried a `#SYNC`).
    pub fn queue_grant(&self, source: u16, grant: CreditGrant) {
        if grant.sync && self.waits_for_sync() {
            self.sync_requested.set(true);
        }
        self.grants.borrow_mut().push_back((source, grant));
        self.notify.notify();
    }

    /// Records were appended: a round is due.
    pub fn wake(&self) {
        self.notify.notify();
    }

    /// Waits until a round that starts after this call has completed with
    /// an fdatasync (a handoff moves only durable files).
    pub async fn barrier(&self) {
        // A round running now may have started before this call: the
        // request makes the one after it run and sync.
        let target = self.rounds.get() + if self.in_round.get() { 2 } else { 1 };
        self.sync_requested.set(true);
        self.notify.notify();
        self.round_waiters.wait_until(|| self.synced_round.get() >= target).await;
    }

    /// Waits until the round running now (or the next one) has ended,
    /// successfully or not: a reader that found the active segment's writer
    /// out waits here instead of asking again at once.
    pub async fn round_ended(&self) {
        let ends = self.round_ends.get();
        self.round_waiters.wait_until(|| self.round_ends.get() > ends).await;
    }

    /// Whether a grant of a batch that carried a `#SYNC` needs a synced round.
    fn waits_for_sync(&self) -> bool {
        self.policy != FsyncPolicy::Never
    }

    /// Whether a storage error is being retried now.
    pub fn is_failing(&self) -> bool {
        self.failing.get()
    }

    /// Whether this round must fdatasync; `requested` is whether a `#SYNC`
    /// (or a handoff) asked before the round started.
    fn sync_due(&self, requested: bool) -> bool {
        match self.policy {
            FsyncPolicy::Always => true,
            FsyncPolicy::Never => false,
            FsyncPolicy::Interval => {
                requested
                    || self.unsynced_bytes.get() >= self.unsynced_bytes_max
                    || (self.unsynced_bytes.get() > 0 && self.last_sync.get().elapsed() >= self.interval)
            }
        }
    }
}

/// The committer loop of one shard.
pub async fn run_committer(shard: Rc<Shard>) {
    let committer = shard.committer.as_ref().expect("a committer on disk storage");
    if committer.wal.enabled.get() {
        glommio::spawn_local(super::checkpoint::run_checkpoints(shard.clone())).detach();
    }
    loop {
        // Between rounds: every writer is in its partition.
        detach_requested(&shard);
        if committer.trim_requested.replace(false) {
            trim_writers(&shard).await;
            committer.trims.set(committer.trims.get() + 1);
            committer.round_waiters.wake_all();
        }
        super::checkpoint::take_snapshot_if_requested(&shard);
        if !has_work(&shard) && allocate_ahead(&shard).await {
            // A chunk of the log's files allocated: look for work again
            // before the next one.
            continue;
        }
        if !has_work(&shard) {
            let idle_with_unsynced = committer.policy == FsyncPolicy::Interval && committer.unsynced_bytes.get() > 0;
            if idle_with_unsynced {
                let interval = glommio::timer::sleep(committer.interval);
                let _ = crate::runtime::notify::first(committer.notify.notified(), interval).await;
            } else {
                // Idle: wake for the next retention check, so segments
                // expire by age on a stream nobody writes to.
                let check = glommio::timer::sleep(next_age_expiry(&shard));
                let _ = crate::runtime::notify::first(committer.notify.notified(), check).await;
                if !has_work(&shard) {
                    expire_if_due(&shard);
                }
                continue;
            }
            detach_requested(&shard);
        }
        // What this round covers is fixed at its start: the grants queued
        // so far, and whether a sync was asked for so far. Later ones wait
        // for the next round.
        let grants_before = committer.grants.borrow().len();
        let requested = committer.sync_requested.replace(false);
        let started = Instant::now();
        committer.in_round.set(true);
        let round = commit_round(&shard, requested).await;
        committer.in_round.set(false);
        let failed = match round {
            Ok(synced) => {
                finish_round(&shard, grants_before, synced);
                ShardMetrics::add(&shard.metrics.commit_seconds, started.elapsed().as_secs_f64());
                false
            }
            Err(error) => {
                committer.sync_requested.set(committer.sync_requested.get() || requested);
                committer.wal.unwritten_after_failure.set(true);
                report_error(&shard, &error);
                true
            }
        };
        // One wake for every waiter: barriers (synced_round) and readers
        // waiting for the writer to come back (round_ends).
        committer.round_ends.set(committer.round_ends.get() + 1);
        committer.round_waiters.wake_all();
        if failed {
            glommio::timer::sleep(Duration::from_millis(STORAGE_RETRY_MS)).await;
        }
        glommio::yield_if_needed().await;
    }
}

/// Between rounds, while the log's first lap has not allocated its files
/// far enough ahead: zero-fills one chunk ([`Wal::allocate_ahead`]).
/// Returns whether it did. A failure is logged once and ends allocation
/// for this run (rounds then grow the files as they go; their own writes
/// report a full or failing disk).
async fn allocate_ahead(shard: &Shard) -> bool {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    if !state.enabled.get() || state.allocation_failed.get() || committer.is_read_only() {
        return false;
    }
    let Some(mut wal) = state.wal.borrow_mut().take() else { return false };
    let allocated = wal.allocate_ahead().await;
    state.wal.replace(Some(wal));
    match allocated {
        Ok(bytes) => {
            ShardMetrics::add(&shard.metrics.wal_allocated_bytes, bytes);
            bytes > 0
        }
        Err(error) => {
            state.allocation_failed.set(true);
            log::warn!(
                shard = shard.id,
                "stopped allocating the write-ahead log ahead of its end ({error}); rounds grow its files"
            );
            false
        }
    }
}

/// The longest a clean stop waits for [`Committer::trim_at_stop`], in ms.
const TRIM_AT_STOP_MS: u64 = 2000;

/// Cuts every writer's file after its last block (between rounds, so every
/// writer is in its partition; each is taken out for its await). An error
/// is logged: the file keeps its allocated tail, which the next start cuts.
async fn trim_writers(shard: &Rc<Shard>) {
    let ids: Vec<u32> = shard.partitions.borrow().iter().map(|(id, _)| id).collect();
    for partition_id in ids {
        let writer = {
            let mut partitions = shard.partitions.borrow_mut();
            let Some(partition) = partitions.get_mut(partition_id) else { continue };
            let Some(disk) = partition.log.parts_mut().1 else { continue };
            disk.take_writer()
        };
        let Some(mut writer) = writer else { continue };
        let trimmed = writer.trim_allocated().await;
        put_back(shard, partition_id, writer);
        if let Err(error) = trimmed {
            log::warn!(shard = shard.id, "cutting partition {partition_id}'s file after its data: {error}");
        }
    }
}

/// Takes the partitions [`Committer::detach`] asked for out of the shard.
/// Runs only between rounds, when no writer is out.
fn detach_requested(shard: &Shard) {
    let committer = shard.committer.as_ref().expect("disk storage");
    debug_assert!(!committer.in_round.get(), "partitions leave only between rounds");
    let requested = std::mem::take(&mut *committer.detach_requested.borrow_mut());
    if requested.is_empty() {
        return;
    }
    let mut partitions = shard.partitions.borrow_mut();
    let mut detached = committer.detached.borrow_mut();
    for (partition_id, retire) in requested {
        detached.push((partition_id, partitions.remove(partition_id)));
        if retire {
            partitions.retire(partition_id);
        }
    }
    committer.round_waiters.wake_all();
}

/// Whether a round has anything to do: records to write, a sync asked
/// for, or grants that the next round releases. A grant waiting for a sync
/// with no sync asked for cannot happen: queueing it asks for one.
fn has_work(shard: &Shard) -> bool {
    let committer = shard.committer.as_ref().expect("disk storage");
    let releasable =
        committer.grants.borrow().front().is_some_and(|(_, grant)| !grant.sync || !committer.waits_for_sync());
    releasable
        || committer.sync_requested.get()
        || committer.wal.snapshot_requested.get()
        || committer.trim_requested.get()
        || committer.is_read_only()
        || !committer.retry.borrow().is_empty()
        || shard.partitions.borrow().has_dirty()
}

/// Writes every dirty partition (concurrently), then syncs if due. Returns
/// whether it synced. With the write-ahead log, see [`commit_round_logged`].
async fn commit_round(shard: &Rc<Shard>, sync_requested: bool) -> Result<bool, SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    if committer.is_read_only() {
        complete_deferred(shard).await?;
    }
    let mut dirty = shard.partitions.borrow_mut().take_dirty();
    // A partition whose last write failed is dirty until it succeeds.
    dirty.append(&mut committer.retry.borrow_mut());
    dirty.sort_unstable();
    dirty.dedup();
    if committer.wal.enabled.get() {
        return commit_round_logged(shard, dirty, sync_requested).await;
    }
    write_partitions(shard, &dirty, true).await?;
    if committer.policy == FsyncPolicy::Never {
        forget_written(shard);
        return Ok(false);
    }
    if !committer.sync_due(sync_requested) {
        return Ok(false);
    }
    timed_sync(shard, sync_all(shard)).await?;
    Ok(true)
}

/// Writes `partitions` concurrently, each taken out of its partition for
/// the awaits ([`write_partition`]); a partition that fails is retried by
/// the next round. With `log`, records encoded on the way are also copied
/// into the write-ahead log (when the shard has one).
async fn write_partitions(shard: &Rc<Shard>, partitions: &[u32], log: bool) -> Result<(), SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    // Each write runs up to its first I/O as it is spawned; the batch hands
    // them all to the kernel in one call ([`crate::runtime::submit`]).
    let batch = crate::runtime::submit::Batch::start();
    let writes: Vec<_> = partitions
        .iter()
        .map(|&partition| glommio::spawn_local(write_partition(shard.clone(), partition, log)))
        .collect();
    drop(batch);
    let mut first_error = None;
    let mut written_bytes = 0;
    for (write, partition) in writes.into_iter().zip(partitions) {
        match write.await {
            Ok(written) => written_bytes += written,
            Err(error) => {
                committer.retry.borrow_mut().push(*partition);
                first_error = first_error.or(Some(error));
            }
        }
    }
    committer.written.borrow_mut().extend_from_slice(partitions);
    if committer.policy != FsyncPolicy::Never && !committer.wal.enabled.get() {
        committer.unsynced.borrow_mut().extend_from_slice(partitions);
    }
    committer.unsynced_bytes.set(committer.unsynced_bytes.get() + written_bytes);
    ShardMetrics::add(&shard.metrics.storage_written_bytes, written_bytes as u64);
    first_error.map_or(Ok(()), Err)
}

/// A round with the write-ahead log: every dirty partition's new records
/// are encoded into its writer's buffer and copied into the log, in place
/// and without I/O; the log is written (and synced when due) once for all
/// of them; and segment files are written *behind* the log, off the
/// round's path: a writer whose buffer holds [`WRITE_BEHIND_BYTES`] starts
/// a write-behind task and stays in its partition meanwhile
/// ([`crate::storage::segment`]). So a round costs one log write and one
/// fdatasync however many partitions it touches. Only a partition whose
/// records do not fit its writer (a full buffer with writes pending, a
/// full segment) is written the old way, before the log.
async fn commit_round_logged(shard: &Rc<Shard>, dirty: Vec<u32>, sync_requested: bool) -> Result<bool, SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    reap_write_behinds(shard);
    let appended_from = log_end(committer);
    let backlog = appended_from.saturating_sub(committer.wal.wal.borrow().as_ref().map_or(0, Wal::written_lsn));
    // A round whose records alone make it large enough to bypass the log
    // does not copy them into it at all (the copy, its CRC and its write
    // buffers cost about 5 % of the server's CPU under disk ingest,
    // 2026-12-07); it must then bypass, and until a filesystem sync makes
    // them durable, no sync may rely on the log ([`WalState::unlogged`]).
    // Marked before any record is encoded: a round that fails part-way
    // leaves them in no log either.
    let pending = pending_bytes(shard, &dirty);
    let unlogged = bypasses_log(committer, pending, dirty.len(), sync_requested);
    if unlogged {
        ShardMetrics::add(&shard.metrics.wal_unlogged_rounds, 1);
        committer.wal.unlogged.set(true);
        committer.wal.unlogged_bytes.set(committer.wal.unlogged_bytes.get() + pending as usize);
    }
    let mut slow = Vec::new();
    let mut first_error = None;
    let mut slice = crate::runtime::slice::Slice::start();
    // The write-behinds the encodes start go to the kernel together, at the
    // end of the loop or before it yields ([`crate::runtime::submit`]).
    let mut batch = crate::runtime::submit::Batch::start();
    for &partition_id in &dirty {
        match encode_in_place(shard, partition_id, !unlogged) {
            Ok(true) => {}
            Ok(false) => slow.push(partition_id),
            Err(error) => {
                committer.retry.borrow_mut().push(partition_id);
                first_error = first_error.or(Some(error));
            }
        }
        // A round over a shard's partitions took 3 - 50 ms of CPU at 2 M
        // events/s with aggregates (measured, 2026-12-07), in one piece: a
        // control request waited for it. Between two partitions the state is
        // what it is after the loop, where the round's awaits already let
        // other tasks run: each partition's records are encoded (and logged)
        // whole, and an event applied meanwhile marks its partition dirty for
        // the next round. Yields only when a request (or the preempt timer)
        // is waiting, at most once per slice.
        if slice.due() {
            drop(batch);
            slice.check().await;
            batch = crate::runtime::submit::Batch::start();
        }
    }
    drop(batch);
    let slow_written = write_partitions(shard, &slow, !unlogged).await;
    committer.written.borrow_mut().extend_from_slice(&dirty);
    committer.wal.dirty.borrow_mut().extend_from_slice(&dirty);
    if let Some(error) = first_error {
        return Err(error);
    }
    slow_written?;
    let appended = log_end(committer).saturating_sub(appended_from);
    // While the log lacks records (this round's or earlier ones'), every
    // round bypasses it, so what each writer holds is written in the round
    // and a sync goes through the filesystem. After a failed round a
    // bypassing round would write only its own partitions, so this one
    // syncs, which writes every partition written since the last snapshot.
    if committer.wal.unlogged.get() {
        let sync = sync_requested || committer.wal.unwritten_after_failure.get();
        return commit_bypassing_log(shard, &dirty, sync, !unlogged).await;
    }
    if bypasses_log(committer, backlog + appended, dirty.len(), sync_requested) {
        return commit_bypassing_log(shard, &dirty, sync_requested, true).await;
    }
    commit_to_wal(shard, sync_requested).await
}

/// Bytes of the records the round will encode for `partitions`: what each
/// tail cache holds past its writer's end (frame headers aside).
fn pending_bytes(shard: &Shard, partitions: &[u32]) -> u64 {
    let partitions_ref = shard.partitions.borrow();
    partitions
        .iter()
        .filter_map(|&id| {
            let partition = partitions_ref.get(id)?;
            let from = partition.log.disk()?.writer()?.next_offset();
            Some(partition.log.memory().bytes_from(from) as u64)
        })
        .sum()
}

/// The log's end: where the next appended frame goes.
fn log_end(committer: &Committer) -> u64 {
    committer.wal.wal.borrow().as_ref().map_or(0, Wal::end_lsn)
}

/// Bytes per partition it touched that a round's log write would carry
/// for the round to bypass the log instead: one block. Writing a
/// partition's new frames to its file at once costs them rounded out to
/// whole blocks (the partial last block is written again by the next
/// round); through the log every byte is written twice (the log now, the
/// segment behind it). So from one block per partition on, the direct
/// writes cost the device less, and below it the log does (many
/// partitions at a low rate: a `#SYNC` every 10 ms over 1024 partitions
/// at 100 k events/s carries about a hundred bytes for each).
pub const BYPASS_BYTES_PER_PARTITION: u64 = 4096;

/// Bytes a round that must sync (a `#SYNC` or a handoff asked, or any
/// round under `always`) must carry to the log to bypass it: a `syncfs`
/// (metadata of every file written, then a flush) and the checkpoint after
/// it cost more than writing and fdatasyncing a few MiB of log (`scripts/bench-sync` at 16 partitions:
/// a `#SYNC` p50 of 3.1 ms against 1.6 through the log, p99 up to 354 ms
/// when the `syncfs` waited for a checkpoint).
pub const SYNC_BYPASS_BYTES_MIN: u64 = 4 << 20;

/// Whether this round bypasses the log: under `interval` or `always` with
/// `--wal-bypass on`, when the log write it would make (`log_bytes`: its
/// own frames and those earlier rounds that bypassed the log left
/// unwritten) is at least [`BYPASS_BYTES_PER_PARTITION`] per partition it
/// touched, and at least [`SYNC_BYPASS_BYTES_MIN`] when it must sync (a
/// `#SYNC` or a handoff asked, or every round under `always`). Not
/// after a failed round until the log is written in full: a failed round
/// may leave frames in the log's memory and in no file, and a bypassing
/// round writes only its own partitions.
fn bypasses_log(committer: &Committer, log_bytes: u64, partitions: usize, sync_requested: bool) -> bool {
    // Under `always` every round syncs, as a `#SYNC` round does.
    let syncs = sync_requested || committer.policy == FsyncPolicy::Always;
    committer.bypass
        && committer.policy != FsyncPolicy::Never
        && !committer.wal.unwritten_after_failure.get()
        && log_bytes >= partitions.max(1) as u64 * BYPASS_BYTES_PER_PARTITION
        && (!syncs || log_bytes >= SYNC_BYPASS_BYTES_MIN)
}

/// The rest of a round that bypasses the log (module doc of
/// [`crate::storage::wal`], "Rounds that bypass the log"). Its frames
/// stay in the log's memory, unwritten (with `log`; an unlogged round's
/// never went there), and are written to their segment files now, whole,
/// so they survive `kill -9` as a written log would have kept them. When
/// a sync is due (every round under `always`, a `#SYNC` or a handoff
/// asked, the interval passed, or the unsynced bytes reached
/// `--fsync-pending-bytes-max`), one `syncfs` makes every written segment
/// durable and the log starts again past those records: they are never
/// written to it. While a checkpoint runs, a sync due only to the interval
/// waits for the next round, one under `always` writes the log instead
/// (waits, when the log lacks records), and any other waits for the
/// checkpoint. A `syncfs` that fails leaves it to the log: written and
/// fdatasynced, with every record it holds; when the log lacks records,
/// to an fdatasync of each written segment file, and so does every sync
/// after it until one succeeds (a `syncfs` retried on the same handle
/// could report success for the failure it reported once).
async fn commit_bypassing_log(
    shard: &Rc<Shard>,
    dirty: &[u32],
    sync_requested: bool,
    log: bool,
) -> Result<bool, SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    // Encoded already: this writes what each writer holds, partial last
    // block included (and encodes, with `log` copied into the log's
    // memory, what was applied since).
    write_partitions(shard, dirty, log).await?;
    ShardMetrics::add(&shard.metrics.wal_bypassed_rounds, 1);
    let unsynced = state.wal.borrow().as_ref().map_or(0, |wal| wal.end_lsn().saturating_sub(wal.synced_lsn()));
    committer.unsynced_bytes.set(unsynced as usize + state.unlogged_bytes.get());
    state.logged_lsn.set(log_end(committer));
    state.logged.notify();
    if !committer.sync_due(sync_requested) {
        return Ok(false);
    }
    // Under `always` a round that would wait for a running checkpoint
    // writes the log instead (below): the wait would hold every grant.
    // Not when the log lacks records: then it waits.
    let must = sync_requested
        || committer.unsynced_bytes.get() >= committer.unsynced_bytes_max
        || (committer.policy == FsyncPolicy::Always && state.unlogged.get());
    let synced = if state.unlogged.get() && state.filesystem_sync_failing.get() {
        sync_directly(shard).await.map(|()| true)
    } else {
        let mut wal = state.wal.borrow_mut().take().expect("the log is here between rounds");
        let synced = timed_sync(shard, super::checkpoint::sync_by_filesystem(shard, &mut wal, must)).await;
        state.logged_lsn.set(wal.end_lsn());
        state.wal.replace(Some(wal));
        synced
    };
    match synced {
        Ok(true) => {
            if state.filesystem_sync_failing.replace(false) {
                log::info!(shard = shard.id, "filesystem syncs succeed again");
            }
            note_synced(shard);
            Ok(true)
        }
        // Not synced: under `always` the round must be, and the log still
        // holds every record since the last checkpoint (it waited when not).
        Ok(false) if committer.policy == FsyncPolicy::Always => commit_to_wal(shard, true).await,
        Ok(false) => Ok(false),
        // The log lacks records: each written segment file is synced
        // instead (a retried `syncfs` could report success for a failure it
        // reported once already), or the round fails and is retried.
        Err(error) if state.unlogged.get() => {
            ShardMetrics::add(&shard.metrics.storage_errors, 1);
            if !state.filesystem_sync_failing.replace(true) {
                log::warn!(shard = shard.id, "filesystem sync: {error}; syncing each written segment file instead");
            }
            sync_directly(shard).await?;
            note_synced(shard);
            Ok(true)
        }
        Err(error) => {
            ShardMetrics::add(&shard.metrics.storage_errors, 1);
            if !state.filesystem_sync_failing.replace(true) {
                log::warn!(shard = shard.id, "filesystem sync: {error}; syncing the write-ahead log instead");
            }
            commit_to_wal(shard, true).await
        }
    }
}

/// A round synced: nothing written is waiting for a sync any more.
fn note_synced(shard: &Shard) {
    let committer = shard.committer.as_ref().expect("disk storage");
    committer.unsynced.borrow_mut().clear();
    committer.unsynced_bytes.set(0);
    committer.last_sync.set(Instant::now());
    ShardMetrics::add(&shard.metrics.fsync_rounds, 1);
}

/// Inside a round: writes and fdatasyncs every segment file written since
/// the last snapshot and starts the log again
/// ([`super::checkpoint::sync_segments_directly`]).
async fn sync_directly(shard: &Rc<Shard>) -> Result<(), SegmentError> {
    let state = &shard.committer.as_ref().expect("disk storage").wal;
    let mut wal = state.wal.borrow_mut().take().expect("the log is here between rounds");
    let synced = timed_sync(shard, super::checkpoint::sync_segments_directly(shard, &mut wal)).await;
    state.logged_lsn.set(wal.end_lsn());
    state.wal.replace(Some(wal));
    synced
}

/// Runs a round's sync, counting its time in
/// `spate_commit_sync_seconds_total` (every way a round makes its records
/// durable goes through here).
async fn timed_sync<T>(shard: &Shard, sync: impl std::future::Future<Output = T>) -> T {
    let started = Instant::now();
    let synced = sync.await;
    ShardMetrics::add(&shard.metrics.commit_sync_seconds, started.elapsed().as_secs_f64());
    synced
}

/// Writes everything a partition's writer holds (its partial last block
/// too) to the file, without an fdatasync (one that has no room for
/// another buffer syncs instead, as [`write_partition`] does). Returns the
/// index of what the active segment then holds: durable once the
/// filesystem is synced. `None` when the partition is gone or has no
/// writer.
pub(super) async fn flush_partition(
    shard: Rc<Shard>,
    partition_id: u32,
) -> Result<Option<crate::storage::index::SegmentIndex>, SegmentError> {
    let mut writer = {
        let mut partitions = shard.partitions.borrow_mut();
        let Some(partition) = partitions.get_mut(partition_id) else { return Ok(None) };
        let Some(disk) = partition.log.parts_mut().1 else { return Ok(None) };
        let Some(writer) = disk.take_writer() else { return Ok(None) };
        writer
    };
    let before = writer.written().0;
    let flushed = if writer.needs_sync() { writer.sync().await } else { writer.flush().await };
    ShardMetrics::add(&shard.metrics.storage_written_bytes, writer.written().0.saturating_sub(before));
    let written = flushed.map(|_| {
        // The log holds these frames until the filesystem is synced (or
        // a checkpoint or a direct sync fdatasyncs the file).
        writer.drop_written();
        let (end, next_offset) = writer.written();
        writer.index().prefix(end, next_offset)
    });
    put_back(&shard, partition_id, writer);
    written.map(Some)
}

/// Bytes a writer buffers before it writes them behind the log: large
/// enough that segment writes are few and sequential, small enough that
/// the tail cache (which keeps every record not written) grows by little.
pub const WRITE_BEHIND_BYTES: usize = 128 * 1024;

/// Encodes a partition's new records into its writer in place and copies
/// the frames into the log; starts a write-behind when enough is buffered.
/// `Ok(false)` when they do not all fit without I/O (the caller writes it
/// with [`write_partition`]).
fn encode_in_place(shard: &Shard, partition_id: u32, log: bool) -> Result<bool, SegmentError> {
    let mut partitions = shard.partitions.borrow_mut();
    let Some(partition) = partitions.get_mut(partition_id) else { return Ok(true) };
    let (cache, disk) = partition.log.parts_mut();
    let Some(disk) = disk else { return Ok(true) };
    let Some(writer) = disk.writer_mut() else { return Ok(false) };
    loop {
        let before = writer.end();
        let encoded = encode_pending(cache, writer, now_unix_ms())?;
        if log {
            append_to_wal(shard, writer, before)?;
        }
        match encoded {
            Encoded::All => break,
            // A full buffer becomes a write (no I/O yet) and encoding goes
            // on; with too many writes pending, the slow path waits.
            Encoded::BufferFull => {
                if writer.seal_buffered().is_err() {
                    return Ok(false);
                }
            }
            Encoded::SegmentFull => return Ok(false),
        }
    }
    // An unlogged round writes every partition in the round anyway: its
    // writes start as each partition is encoded, not after all of them.
    if !log || writer.buffered_bytes() >= WRITE_BEHIND_BYTES {
        // With too many writes pending this waits for the next round.
        let _ = writer.seal_buffered();
    }
    if writer.start_write_behind() {
        shard.committer.as_ref().expect("disk storage").wal.behind.borrow_mut().push(partition_id);
    }
    Ok(true)
}

/// Takes the outcome of every write-behind that has ended.
pub(super) fn reap_write_behinds(shard: &Shard) {
    let committer = shard.committer.as_ref().expect("disk storage");
    let running = std::mem::take(&mut *committer.wal.behind.borrow_mut());
    let mut still = Vec::with_capacity(running.len());
    for partition_id in running {
        match reap_write_behind(shard, partition_id) {
            Reaped::Running => still.push(partition_id),
            Reaped::Done => {}
            Reaped::Failed(error) => report_error(shard, &error),
        }
    }
    committer.wal.behind.borrow_mut().extend(still);
}

pub(super) enum Reaped {
    Running,
    Done,
    Failed(SegmentError),
}

/// Takes the outcome of a partition's write-behind, if it has ended: the
/// writer counts its writes, forgets the buffers (the log holds their
/// frames; a checkpoint syncs the file), and the tail cache may drop what
/// is now in the file.
pub(super) fn reap_write_behind(shard: &Shard, partition_id: u32) -> Reaped {
    let mut partitions = shard.partitions.borrow_mut();
    let Some(partition) = partitions.get_mut(partition_id) else { return Reaped::Done };
    let (cache, disk) = partition.log.parts_mut();
    let Some(disk) = disk else { return Reaped::Done };
    // Out for a roll or a slow write: that one waits for the write-behind.
    let Some(writer) = disk.writer_mut() else { return Reaped::Done };
    if writer.write_behind().is_none() {
        return Reaped::Done;
    }
    let before = writer.written().0;
    let failed = writer.reap_write_behind();
    if writer.write_behind().is_some() {
        return Reaped::Running;
    }
    let written_bytes = writer.written().0.saturating_sub(before);
    writer.drop_written();
    disk.record_progress();
    cache.keep_from(disk.written_offset());
    ShardMetrics::add(&shard.metrics.storage_written_bytes, written_bytes);
    match failed {
        Some(error) => Reaped::Failed(error),
        None => Reaped::Done,
    }
}

/// The rest of a round with a write-ahead log: one write of the round's
/// records and, when due, one fdatasync for all its partitions. A log too
/// full to take them (a checkpoint could not keep up) syncs the segment
/// files directly instead, which makes the round durable all the same.
async fn commit_to_wal(shard: &Rc<Shard>, sync_requested: bool) -> Result<bool, SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let state = &committer.wal;
    super::checkpoint::pay_owed_checkpoint(shard).await?;
    let mut wal = state.wal.borrow_mut().take().expect("the log is here between rounds");
    let written_before = wal.written_lsn();
    let mut written = wal.write(state.checkpoint_lsn.get()).await;
    if written.is_ok() {
        state.unwritten_after_failure.set(false);
    }
    while matches!(written, Err(WalError::Full)) && state.running.get() {
        // A checkpoint is under way: it frees the log without this round
        // (every writer is in its partition now), so wait for it and try
        // again before syncing the segments directly.
        state.ended.wait_until(|| !state.running.get()).await;
        written = wal.write(state.checkpoint_lsn.get()).await;
    }
    ShardMetrics::add(&shard.metrics.wal_written_bytes, wal.written_lsn().saturating_sub(written_before));
    // Under `interval` the log's unsynced bytes bound the wait for a sync
    // (with what rounds wrote without it).
    let unsynced = wal.written_lsn().saturating_sub(wal.synced_lsn()) as usize + state.unlogged_bytes.get();
    committer.unsynced_bytes.set(unsynced);
    let outcome = match written {
        // While the log lacks records every round bypasses it
        // (`commit_round_logged`): the log's fdatasync never stands for them.
        Ok(_) if committer.sync_due(sync_requested) => {
            debug_assert!(!state.unlogged.get(), "a sync through the log while it lacks records");
            timed_sync(shard, wal.sync()).await.map(|_| true)
        }
        Ok(_) => Ok(false),
        Err(WalError::Io(error)) => Err(error),
        Err(WalError::Full) => {
            timed_sync(shard, super::checkpoint::sync_segments_directly(shard, &mut wal)).await.map(|()| true)
        }
    };
    let used_bytes = wal.end_lsn() - state.checkpoint_lsn.get();
    let capacity_bytes = wal.geometry().file_bytes * wal.geometry().file_count;
    state.logged_lsn.set(wal.end_lsn());
    state.logged.notify();
    state.wal.replace(Some(wal));
    let synced = outcome?;
    if used_bytes > capacity_bytes / 2 {
        state.notify.notify();
    }
    if synced {
        note_synced(shard);
    }
    Ok(synced)
}

/// Hands the shard the frames the write-ahead logs held at start-up, for
/// [`Committer::take_replay_frames`] while its partitions open.
pub fn set_replay(shard: &Shard, replay: std::sync::Arc<WalReplay>) {
    if let Some(committer) = &shard.committer {
        committer.wal.replay.replace(Some(replay));
    }
}

/// The end of this shard's part of the start-up replay: once every
/// shard has replayed its partitions' frames from all the logs (and synced
/// them), opens this shard's log for a new run. Shard 0 removes the logs
/// of shards that no longer exist. A log that cannot be opened (a full
/// disk) leaves the shard committing as without one: a synced round then
/// fdatasyncs each partition's files.
pub async fn finish_replay(shard: &Shard, failed: bool) -> Result<(), ()> {
    let Some(committer) = &shard.committer else { return Ok(()) };
    let Some(replay) = committer.wal.replay.take() else { return Ok(()) };
    replay.shard_done(failed);
    loop {
        match replay.progress() {
            ReplayProgress::Done => break,
            ReplayProgress::Waiting => glommio::timer::sleep(Duration::from_millis(REPLAY_WAIT_POLL_MS)).await,
            ReplayProgress::Failed => return Err(()),
        }
    }
    if shard.id == 0 {
        if replay.unclaimed() > 0 {
            log::info!("write-ahead logs: skipped the frames of {} deleted partitions", replay.unclaimed());
        }
        remove_logs_of_gone_shards(&shard.config.data_dir, shard.shard_count);
    }
    if committer.policy == FsyncPolicy::Never {
        return Ok(());
    }
    let geometry = WalGeometry::for_bytes_max(shard.config.wal_bytes_max as u64);
    let dir = wal_dir(&shard.config.data_dir, shard.id);
    crate::runtime::stage::set(Some(shard.id), "opening the write-ahead log");
    match Wal::open(&dir, geometry, shard.config.wal_buffer_bytes()).await {
        Ok((wal, checkpoint)) => {
            let state = &committer.wal;
            state.checkpoint_lsn.set(checkpoint.lsn());
            state.logged_lsn.set(checkpoint.lsn());
            state.wal.replace(Some(wal));
            state.checkpoint.replace(Some(checkpoint));
            state.enabled.set(true);
            // Recovery synced everything each writer holds.
            let mut positions = state.positions.borrow_mut();
            for (_, partition) in shard.partitions.borrow().iter() {
                let Some(writer) = partition.log.disk().and_then(|disk| disk.writer()) else { continue };
                let (end, next_offset) = writer.written();
                positions.insert(writer.log_id(), writer.index().prefix(end, next_offset));
            }
        }
        Err(error) => log::warn!(
            shard = shard.id,
            "no write-ahead log this run ({error}): each synced round fdatasyncs its partitions' files"
        ),
    }
    Ok(())
}

fn remove_logs_of_gone_shards(data_dir: &std::path::Path, shard_count: u16) {
    let root = data_dir.join(crate::storage::wal::WAL_DIR_NAME);
    let Ok(entries) = std::fs::read_dir(&root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|name| name.strip_prefix("shard-")?.parse::<u32>().ok()) else {
            continue;
        };
        if id >= u32::from(shard_count) && std::fs::remove_dir_all(entry.path()).is_ok() {
            log::info!("removed the write-ahead log of shard {id}, which this run does not have (replayed)");
        }
    }
}

/// Appends to a partition's recovered segments the frames the write-ahead
/// logs hold past their end, and syncs them: frames at or below the end
/// are skipped (the segment has them), and a frame past a gap cannot be
/// appended (logged; what follows it is lost, which only a segment damaged
/// before the checkpoint can cause). Returns the frames appended.
pub async fn replay_frames(disk: &mut DiskLog, frames: LogFrames) -> Result<usize, SegmentError> {
    let mut writer: Option<SegmentWriter> = None;
    let mut next_offset = disk.next_offset();
    let mut appended = 0;
    for (base_offset, frame) in frames.sorted() {
        let frame_next = parse_header(&frame).map(|header| header.next_offset()).unwrap_or(0);
        if frame_next <= next_offset {
            continue;
        }
        if base_offset != next_offset {
            log::warn!(
                "write-ahead log: {} ends at offset {next_offset} but the log's next frame starts at                  {base_offset}: offsets from there are lost",
                disk.dir().display()
            );
            break;
        }
        let mut current = match writer.take().or_else(|| disk.take_writer()) {
            Some(writer) => writer,
            None => return Err(replay_blocked(disk)),
        };
        current = append_replayed(disk, current, &frame).await?;
        writer = Some(current);
        next_offset = frame_next;
        appended += 1;
    }
    if let Some(mut writer) = writer {
        let synced = writer.sync().await;
        disk.put_writer(writer);
        synced?;
        let written = disk.written_offset();
        disk.set_visible(written);
    }
    Ok(appended)
}

fn replay_blocked(disk: &DiskLog) -> SegmentError {
    let source = std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        "the write-ahead log holds events for it, and its active segment cannot be opened for writing",
    );
    SegmentError::Io { op: "replay write-ahead log into", path: disk.dir().to_path_buf(), position: 0, source }
}

/// Appends one replayed frame, syncing a full buffer and rolling a full
/// segment as a round would.
async fn append_replayed(
    disk: &mut DiskLog,
    mut writer: SegmentWriter,
    frame: &[u8],
) -> Result<SegmentWriter, SegmentError> {
    loop {
        match writer.append_frame(frame) {
            Ok(()) => return Ok(writer),
            Err(SegmentError::BufferFull { .. }) | Err(SegmentError::TooManyUnsynced { .. }) => {
                writer.sync().await?;
            }
            Err(SegmentError::SegmentFull { .. }) => {
                let (log_id, next_offset, config) = (writer.log_id(), writer.next_offset(), writer.config());
                let next_path = disk.next_segment_path(next_offset);
                writer.write_seal(&disk.active_index_path()).await?;
                crate::partition::disk::remove_if_empty(&next_path);
                let next = SegmentWriter::create(&next_path, log_id, next_offset, config).await?;
                let (index, _) = writer.close_sealed().await;
                disk.on_rolled(index, next);
                writer = disk.take_writer().expect("the writer of the new segment");
            }
            Err(error) => return Err(error),
        }
    }
}

/// Does the writes that opening the partitions deferred for lack of space,
/// one at a time: while the disk is still full the first one fails (and the
/// round with it) at the cost of one small write. Then the shard is no
/// longer read-only.
async fn complete_deferred(shard: &Rc<Shard>) -> Result<(), SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let space_check_dir = committer.space_check_dir.borrow().clone();
    if let Some(dir) = space_check_dir {
        check_writable(&dir)?;
        committer.space_check_dir.replace(None);
    }
    // Until none is left: a partition installed meanwhile (a new stream)
    // may have deferred writes of its own. No await between the last check
    // and the end of the read-only state.
    while let Some((partition_id, work)) = next_deferred(shard) {
        let writer = work.run().await?;
        let mut partitions = shard.partitions.borrow_mut();
        // A partition stays while it has deferred writes: a move or a
        // stream deletion waits for a successful round.
        let partition = partitions.get_mut(partition_id).expect("a partition stays while read-only");
        partition.log.parts_mut().1.expect("a disk partition").deferred_done(&work, writer);
    }
    if let Some(reason) = committer.read_only.take() {
        log::info!(shard = shard.id, "the writes deferred at start-up are done: no longer read-only (was: {reason})");
    }
    Ok(())
}

/// The first deferred write of any partition, with the partition's id.
fn next_deferred(shard: &Shard) -> Option<(u32, Deferred)> {
    let partitions = shard.partitions.borrow();
    partitions.iter().find_map(|(partition_id, partition)| Some((partition_id, partition.log.disk()?.next_deferred()?)))
}

/// Encodes and writes one partition's new records; rolls full segments.
/// Returns the bytes written.
async fn write_partition(shard: Rc<Shard>, partition_id: u32, log: bool) -> Result<usize, SegmentError> {
    let mut written = 0;
    loop {
        let Some((mut writer, encoded)) = encode(&shard, partition_id, log)? else { return Ok(written) };
        let before = writer.written().0;
        // A writer out of room for more unsynced buffers syncs instead (the
        // round's fdatasync would come too late for it).
        let flushed = if writer.needs_sync() { writer.sync().await } else { writer.flush().await };
        written += writer.written().0.saturating_sub(before) as usize;
        if flushed.is_ok() && shard.committer.as_ref().is_some_and(|committer| committer.wal.enabled.get()) {
            // The log holds these frames: the segment file is synced in
            // bulk by a checkpoint, and needs no copy kept for a retry.
            writer.drop_written();
        }
        if let Err(error) = flushed {
            put_back(&shard, partition_id, writer);
            return Err(error);
        }
        match encoded {
            Encoded::All => {
                put_back(&shard, partition_id, writer);
                return Ok(written);
            }
            Encoded::BufferFull => put_back(&shard, partition_id, writer),
            Encoded::SegmentFull => roll(&shard, partition_id, writer).await?,
        }
    }
}

/// Takes the partition's writer out and encodes its new records into it
/// (copied into the write-ahead log too with `log`). `None` when the
/// partition is gone or has no disk.
fn encode(shard: &Shard, partition_id: u32, log: bool) -> Result<Option<(SegmentWriter, Encoded)>, SegmentError> {
    let mut partitions = shard.partitions.borrow_mut();
    let Some(partition) = partitions.get_mut(partition_id) else { return Ok(None) };
    let (cache, disk) = partition.log.parts_mut();
    let Some(disk) = disk else { return Ok(None) };
    let Some(mut writer) = disk.take_writer() else { return Ok(None) };
    let before = writer.end();
    let encoded = encode_pending(cache, &mut writer, now_unix_ms());
    let logged = match &encoded {
        Ok(_) if log => append_to_wal(shard, &writer, before),
        _ => Ok(()),
    };
    match encoded.and_then(|encoded| logged.map(|()| encoded)) {
        Ok(encoded) => Ok(Some((writer, encoded))),
        Err(error) => {
            disk.put_writer(writer);
            Err(error)
        }
    }
}

/// Copies the frames just encoded into `writer` (from its end `before`)
/// into the shard's write-ahead log, when it has one.
fn append_to_wal(shard: &Shard, writer: &SegmentWriter, before: u64) -> Result<(), SegmentError> {
    let Some(committer) = &shard.committer else { return Ok(()) };
    if !committer.wal.enabled.get() {
        return Ok(());
    }
    let mut wal = committer.wal.wal.borrow_mut();
    let wal = wal.as_mut().expect("the log stays in place while partitions are written");
    wal.append_frames(writer.appended_since(before)).map_err(|error| SegmentError::Frame {
        path: writer.path().to_path_buf(),
        position: before,
        error,
    })
}

/// Returns a writer to its partition and lets the cache drop what is now on
/// disk. The partition is still there: partitions leave only between rounds
/// ([`Committer::detach`]), never while a round has their writer out.
fn put_back(shard: &Shard, partition_id: u32, writer: SegmentWriter) {
    let mut partitions = shard.partitions.borrow_mut();
    let partition = partitions.get_mut(partition_id).expect("a partition stays while its writer is out");
    let (cache, disk) = partition.log.parts_mut();
    let disk = disk.expect("a writer belongs to a disk log");
    disk.put_writer(writer);
    // The writer keeps what it wrote until it is synced (to write it again
    // if an fdatasync fails), so the cache needs only what is not written.
    cache.keep_from(disk.written_offset());
    // A checkpoint may wait for this writer to come back.
    shard.committer.as_ref().expect("disk storage").round_waiters.wake_all();
}

/// Seals a full segment (sync, sidecar index, close) and opens the next.
/// On an error the full writer goes back to its partition, with everything
/// it has not synced, and the next round tries the roll again.
async fn roll(shard: &Rc<Shard>, partition_id: u32, mut writer: SegmentWriter) -> Result<(), SegmentError> {
    let (index_path, next_path) = {
        let partitions = shard.partitions.borrow();
        let disk = partitions.get(partition_id).and_then(|partition| partition.log.disk()).expect("disk partition");
        (disk.active_index_path(), disk.next_segment_path(writer.next_offset()))
    };
    let (log_id, next_offset, config) = (writer.log_id(), writer.next_offset(), writer.config());
    if let Err(error) = writer.write_seal(&index_path).await {
        put_back(shard, partition_id, writer);
        return Err(error);
    }
    // A create that failed half-way left an empty file.
    crate::partition::disk::remove_if_empty(&next_path);
    let next = match SegmentWriter::create(&next_path, log_id, next_offset, config).await {
        Ok(next) => next,
        Err(error) => {
            put_back(shard, partition_id, writer);
            return Err(error);
        }
    };
    let (index, closed) = writer.close_sealed().await;
    if let Err(error) = closed {
        log::warn!(shard = shard.id, "closing a sealed segment: {error} (it is synced and indexed)");
    }
    let mut partitions = shard.partitions.borrow_mut();
    let partition = partitions.get_mut(partition_id).expect("a partition stays while its writer is out");
    let (_, disk) = partition.log.parts_mut();
    disk.expect("disk partition").on_rolled(index, next);
    shard.committer.as_ref().expect("disk storage").round_waiters.wake_all();
    ShardMetrics::add(&shard.metrics.segments_rolled, 1);
    Ok(())
}

/// fdatasyncs every partition written since the last sync, concurrently.
async fn sync_all(shard: &Rc<Shard>) -> Result<(), SegmentError> {
    let committer = shard.committer.as_ref().expect("disk storage");
    let mut unsynced = std::mem::take(&mut *committer.unsynced.borrow_mut());
    unsynced.sort_unstable();
    unsynced.dedup();
    let mut syncs = Vec::new();
    {
        let mut partitions = shard.partitions.borrow_mut();
        for &partition_id in &unsynced {
            let Some(partition) = partitions.get_mut(partition_id) else { continue };
            let (_, disk) = partition.log.parts_mut();
            let Some(disk) = disk else { continue };
            if disk.durable_offset() == disk.written_offset() {
                continue;
            }
            let Some(writer) = disk.take_writer() else { continue };
            syncs.push((partition_id, glommio::spawn_local(sync_writer(shard.clone(), partition_id, writer))));
        }
    }
    let mut first_error = None;
    for (partition_id, sync) in syncs {
        if let Err(error) = sync.await {
            committer.unsynced.borrow_mut().push(partition_id);
            first_error = first_error.or(Some(error));
        }
    }
    committer.written.borrow_mut().extend_from_slice(&unsynced);
    if let Some(error) = first_error {
        return Err(error);
    }
    committer.unsynced_bytes.set(0);
    committer.last_sync.set(Instant::now());
    ShardMetrics::add(&shard.metrics.fsync_rounds, 1);
    Ok(())
}

/// Writes everything a partition's writer holds and fdatasyncs its file
/// (the log was full: [`super::checkpoint::sync_segments_directly`]).
pub(super) async fn sync_partition(shard: Rc<Shard>, partition_id: u32) -> Result<(), SegmentError> {
    let writer = {
        let mut partitions = shard.partitions.borrow_mut();
        let Some(partition) = partitions.get_mut(partition_id) else { return Ok(()) };
        let Some(disk) = partition.log.parts_mut().1 else { return Ok(()) };
        let Some(writer) = disk.take_writer() else { return Ok(()) };
        writer
    };
    sync_writer(shard, partition_id, writer).await
}

async fn sync_writer(shard: Rc<Shard>, partition_id: u32, mut writer: SegmentWriter) -> Result<(), SegmentError> {
    let synced = writer.sync().await;
    put_back(&shard, partition_id, writer);
    synced.map(drop)
}

/// `--fsync never`: what is written counts as durable.
fn forget_written(shard: &Shard) {
    let committer = shard.committer.as_ref().expect("disk storage");
    let mut partitions = shard.partitions.borrow_mut();
    for &partition_id in committer.written.borrow().iter() {
        let Some(partition) = partitions.get_mut(partition_id) else { continue };
        let (cache, disk) = partition.log.parts_mut();
        let Some(disk) = disk else { continue };
        let Some(mut writer) = disk.take_writer() else { continue };
        writer.forget_written();
        disk.put_writer(writer);
        disk.assume_durable();
        cache.keep_from(disk.written_offset());
    }
}

/// After a successful round: readers see the new records, and the first
/// `grants_before` grants (queued before it started) go back, up to the
/// first that waits for a sync when the round did not sync.
fn finish_round(shard: &Shard, grants_before: usize, synced: bool) {
    let committer = shard.committer.as_ref().expect("disk storage");
    {
        let mut partitions = shard.partitions.borrow_mut();
        let durable_only = committer.policy == FsyncPolicy::Always;
        let logged = committer.wal.enabled.get();
        let mut touched = std::mem::take(&mut *committer.written.borrow_mut());
        touched.sort_unstable();
        touched.dedup();
        for partition_id in touched {
            let Some(partition) = partitions.get_mut(partition_id) else { continue };
            let (_, disk) = partition.log.parts_mut();
            if let Some(disk) = disk {
                // With the log, what it holds (written, or synced under
                // `always`) is visible: the tail cache serves what the
                // segment file does not have yet.
                let visible = match (logged, durable_only) {
                    (true, true) if !synced => disk.visible_offset(),
                    (true, _) => disk.next_offset(),
                    (false, true) => disk.durable_offset(),
                    (false, false) => disk.written_offset(),
                };
                if visible > disk.visible_offset() {
                    disk.set_visible(visible);
                }
            }
        }
    }
    let durable = synced || committer.policy == FsyncPolicy::Never;
    // Under `always` every grant waits for durability (every round there
    // syncs or fails; this keeps it so if one ever did not).
    let all_wait = committer.policy == FsyncPolicy::Always;
    for _ in 0..grants_before {
        let released = {
            let mut grants = committer.grants.borrow_mut();
            match grants.front() {
                Some((_, grant)) if (grant.sync || all_wait) && !durable => None,
                _ => grants.pop_front(),
            }
        };
        let Some((source, grant)) = released else { break };
        if source == shard.id {
            shard.send_grant_now(source, grant);
        } else {
            shard.pending_grants.hold(source, grant);
        }
    }
    // One frame per source for everything this round released.
    for (source, grant) in shard.pending_grants.take_all() {
        shard.send_grant_now(source, grant);
    }
    if committer.failing.replace(false) {
        log::info!(shard = shard.id, "storage writes succeed again");
    }
    committer.rounds.set(committer.rounds.get() + 1);
    if synced || committer.policy == FsyncPolicy::Never {
        committer.synced_round.set(committer.rounds.get());
    }
    ShardMetrics::add(&shard.metrics.commit_rounds, 1);
    shard.subscriptions.wake_parked();
    expire_if_due(shard);
}

/// Runs retention if the last check is RETENTION_CHECK_MS old.
fn expire_if_due(shard: &Shard) {
    let committer = shard.committer.as_ref().expect("disk storage");
    if committer.last_expiry.get().elapsed() >= Duration::from_millis(RETENTION_CHECK_MS) {
        committer.last_expiry.set(Instant::now());
        expire_segments(shard);
    }
}

/// How long an idle committer may sleep before retention has work: until
/// the soonest age limit of a sealed segment on this shard, kept between
/// [`RETENTION_CHECK_MS`] and [`RETENTION_IDLE_CHECK_MS_MAX`].
fn next_age_expiry(shard: &Shard) -> Duration {
    let soonest =
        shard.partitions.borrow().iter().filter_map(|(_, partition)| partition.log.disk()?.next_age_expiry_ms()).min();
    let wait_ms =
        soonest.map_or(RETENTION_IDLE_CHECK_MS_MAX, |due_ms| due_ms.saturating_sub(now_unix_ms()).saturating_add(1));
    Duration::from_millis(wait_ms.clamp(RETENTION_CHECK_MS, RETENTION_IDLE_CHECK_MS_MAX))
}

/// Retention: deletes the sealed segments no partition keeps any more.
fn expire_segments(shard: &Shard) {
    let now_ms = now_unix_ms();
    let mut expired = Vec::new();
    for (partition_id, partition) in shard.partitions.borrow_mut().iter_mut() {
        let (_, disk) = partition.log.parts_mut();
        if let Some(disk) = disk {
            expired.extend(disk.expire(now_ms, shard.groups.floor(partition_id)));
        }
    }
    for path in expired {
        match std::fs::remove_file(&path) {
            Ok(()) => ShardMetrics::add(&shard.metrics.segment_files_deleted, 1),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => {
                log::warn!(shard = shard.id, "retention could not delete {}: {error}", path.display())
            }
        }
    }
}

fn report_error(shard: &Shard, error: &SegmentError) {
    let committer = shard.committer.as_ref().expect("disk storage");
    ShardMetrics::add(&shard.metrics.storage_errors, 1);
    if !committer.failing.replace(true) {
        let what = if error.is_storage_full() { "disk full" } else { "I/O error" };
        log::warn!(
            shard = shard.id,
            "storage {what}: {error}; ingest into the affected partitions is paused (credits held) \
             and retried every {STORAGE_RETRY_MS} ms"
        );
    }
}
