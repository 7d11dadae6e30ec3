//! Keyed aggregates on a shard: the engine side of [`crate::aggregate`].
//!
//! # Where the state lives
//!
//! Each owned partition of a stream with aggregates holds a
//! [`PartitionProcessor`] ([`crate::partition::Partition::processor`]). The
//! apply path runs it on every event as it is appended, in offset order, on
//! the owning shard: no extra hop and no allocation per event (a key seen
//! for the first time allocates its entry). It moves with the partition
//! when the partition migrates (it is part of the handoff), so the values
//! read before and after a move are the same.
//!
//! # Closed windows
//!
//! Windows a processor closes wait in the processor until the shard moves
//! them, right after the batch (or clock tick) that closed them, into its
//! emit queue ([`ShardAggregates`]). The emitter task routes them to their
//! output stream exactly as a connection routes events (key = the window's
//! key, payload = [`crate::aggregate::ClosedWindow::write_json`]), spending
//! credits and waiting for them. The queue's limit is
//! [`EMIT_QUEUE_BYTES_MAX`]: over it the applier pauses after each batch
//! (up to [`EMIT_WAIT_MS_MAX`] at a time, so that two shards whose emitters
//! wait on each other's credits cannot deadlock), which pushes back on
//! producers through the usual credits. Windows whose output stream does not
//! exist (deleted) are dropped and counted.
//!
//! Arrival-time windows close by the clock: while any aggregate is
//! declared, a tick every [`TICK_MS`] advances every processor whose next
//! window end has passed. With none declared the clock waits for a
//! declaration instead, so an idle server without aggregates never wakes
//! for it (the tick cost 500 wake-ups a second per shard).
//!
//! # Checkpoints (disk storage)
//!
//! Every `--aggregate-checkpoint-ms` the shard encodes the processors of
//! its partitions that changed and writes each to
//! `<partition dir>/aggregates.ckpt`, replaced atomically and durably
//! ([`crate::storage::durable::replace_durably`]). A checkpoint covers
//! offsets below its `next_offset`, and it is renamed into place only once
//! (1) every window it counts as closed has been routed and is durable at
//! its output owner ([`crate::shard::ingress::Source::sync_barrier`]), and
//! (2) every event it covers is durable in the log (a synced commit round):
//! so after a crash the checkpoint never covers an event the log lost, nor
//! a closed window the output stream lost. A declaration writes its first checkpoint before
//! `POST` answers.
//!
//! # Recovery
//!
//! At start, each partition of a stream with aggregates loads its
//! checkpoint and replays its log from the checkpoint's offset (with each
//! frame's write time as the arrival time), so no event is counted twice or
//! missed. Windows closed by the replay are emitted again: those that had
//! been emitted before the crash come out identical (value, count, offsets
//! and `sequence` are a function of the log), so a reader drops a window
//! whose `(aggregate, partition, sequence)` it has seen. A checkpoint that
//! is missing, corrupt, or does not fit the log (it covers more than the log
//! holds, or retention deleted what follows it) is replaced by an empty
//! processor replaying the whole retained log, and counted.
//!
//! Memory storage runs the same processors without checkpoints.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::aggregate::{
    AggregateDeclaration, AggregateStats, ClosedOutputs, KeyView, PartitionProcessor, ProcessorLimits, TopEntry,
};
use crate::partition::PartitionManager;
use crate::partition::disk::{DiskLog, Located, now_unix_ms};
use crate::routing::Blocked;
use crate::runtime::log::{self, Level, Scope};
use crate::runtime::notify::{Notify, first};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::storage::durable::{ReplaceError, replace_durably};
use crate::storage::format::decode_frame;
use crate::storage::segment::{SegmentError, SegmentReader};
use crate::stream::StreamSpec;

/// The checkpoint file in each partition's directory.
pub const CHECKPOINT_FILE_NAME: &str = "aggregates.ckpt";
pub use crate::config::limits::EMIT_QUEUE_BYTES_MAX;
/// The longest one pause of the applier for the emit queue, in ms.
pub const EMIT_WAIT_MS_MAX: u64 = 50;
/// How often arrival-time windows are checked for closing, in ms.
pub const TICK_MS: u64 = 2;
/// Windows the emitter routes between two looks at its
/// [`crate::runtime::slice`] (about 0.7 ms of work here; each is a JSON
/// payload routed as an event).
const EMIT_CHUNK_WINDOWS: u64 = 256;
/// The most one replay read asks for (frames are tens of KiB).
const REPLAY_READ_BYTES: usize = 4 << 20;

/// A request about aggregates from the control plane.
pub enum AggregateRequest {
    /// A new aggregate (already in the admin catalog): add it to the
    /// processors of the owned partitions of its stream, checkpoint them.
    Declare { declaration: AggregateDeclaration, reply: flume::Sender<Result<(), AggregateError>> },
    /// Drop an aggregate and its state.
    Remove { name: String, reply: flume::Sender<()> },
    /// One key's windows, from the shard owning the key's partition.
    Query { name: String, key: Vec<u8>, reply: flume::Sender<Option<KeyView>> },
    /// The `n` largest keys over the owned partitions.
    Top { name: String, n: usize, reply: flume::Sender<Vec<TopEntry>> },
    /// Per aggregate and owned partition.
    Stats { reply: flume::Sender<Vec<AggregateStats>> },
}

/// Why a shard could not declare an aggregate or checkpoint its state.
#[derive(Debug)]
pub enum AggregateError {
    /// The aggregate's stream is not in this shard's catalog (the admin
    /// side checks it first: a stream deleted in between).
    UnknownStream { stream: String },
    /// A partition's checkpoint file could not be written; the next round
    /// (every `--aggregate-checkpoint-ms`) writes it again.
    Checkpoint { partition_id: u32, error: ReplaceError },
}

impl AggregateError {
    /// The HTTP status a declaration answers with: `404` for a stream that
    /// is gone, `507` when the disk is full, `500` for another write error.
    /// The declaration stays in the catalog either way, and runs.
    pub fn http_status(&self) -> u16 {
        match self {
            AggregateError::UnknownStream { .. } => 404,
            AggregateError::Checkpoint { error, .. } if error.is_storage_full() => 507,
            AggregateError::Checkpoint { .. } => 500,
        }
    }
}

impl std::fmt::Display for AggregateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AggregateError::UnknownStream { stream } => write!(f, "unknown_stream: {stream}"),
            AggregateError::Checkpoint { partition_id, error } if error.is_storage_full() => write!(
                f,
                "storage_full: aggregate checkpoint of partition {partition_id}: {error} (written again once the \
                 data directory's disk has space)"
            ),
            AggregateError::Checkpoint { partition_id, error } => {
                write!(f, "storage_error: aggregate checkpoint of partition {partition_id}: {error}")
            }
        }
    }
}

impl std::error::Error for AggregateError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AggregateError::UnknownStream { .. } => None,
            AggregateError::Checkpoint { error, .. } => Some(error),
        }
    }
}

/// One shard's aggregate machinery: the emit queue, the clock, checkpoints.
pub struct ShardAggregates {
    emit: RefCell<ClosedOutputs>,
    emit_notify: Notify,
    emit_drained: Notify,
    /// Windows put in the emit queue, and routed out of it, since start.
    pushed_total: Cell<u64>,
    routed_total: Cell<u64>,
    routed_notify: crate::runtime::notify::WaitList,
    /// The arrival clock (Unix ms), never going back.
    clock_ms: Cell<u64>,
    /// Partition -> the offset its last checkpoint covers.
    checkpointed: RefCell<HashMap<u32, u64>>,
    /// Checkpoint writes failing (a full disk fails every round): logged
    /// when it starts and once a round writes them all again.
    checkpoint_failures: log::Episode,
    /// A periodic checkpoint round is running: the clock starts no other
    /// (a round waits for durability, which can take longer than the period
    /// under load; rounds must not pile up).
    round_running: Rc<Cell<bool>>,
    /// Wakes the clock when the first aggregate is declared.
    declared_notify: Notify,
    pub limits: ProcessorLimits,
}

impl ShardAggregates {
    pub fn new(config: &crate::config::Config) -> ShardAggregates {
        ShardAggregates {
            emit: RefCell::default(),
            emit_notify: Notify::default(),
            emit_drained: Notify::default(),
            pushed_total: Cell::new(0),
            routed_total: Cell::new(0),
            routed_notify: crate::runtime::notify::WaitList::default(),
            clock_ms: Cell::new(0),
            checkpointed: RefCell::default(),
            checkpoint_failures: log::Episode::new("failed checkpoint writes"),
            round_running: Rc::default(),
            declared_notify: Notify::default(),
            limits: ProcessorLimits { keys_per_aggregate_max: config.aggregate_keys_max },
        }
    }

    /// The arrival time for what is applied now (Unix ms, never going back).
    pub fn clock(&self) -> u64 {
        let now_ms = now_unix_ms().max(self.clock_ms.get());
        self.clock_ms.set(now_ms);
        now_ms
    }

    /// Moves the closed windows of the partitions the apply path marked
    /// into the emit queue.
    pub fn collect(&self, partitions: &mut PartitionManager) {
        let mut emit = self.emit.borrow_mut();
        let before = emit.count();
        for partition_id in partitions.take_emitting() {
            let processor = partitions.get_mut(partition_id).and_then(|partition| partition.processor.as_deref_mut());
            if let Some(processor) = processor {
                processor.take_output(&mut emit);
            }
        }
        self.pushed(&mut emit, before);
    }

    /// Moves every processor's closed windows into the emit queue (after a
    /// clock tick, a handoff, a recovery).
    pub fn collect_all(&self, partitions: &mut PartitionManager) {
        let mut emit = self.emit.borrow_mut();
        let before = emit.count();
        for (_, partition) in partitions.iter_mut() {
            if let Some(processor) = partition.processor.as_deref_mut().filter(|processor| processor.has_output()) {
                processor.take_output(&mut emit);
            }
        }
        self.pushed(&mut emit, before);
    }

    fn pushed(&self, emit: &mut ClosedOutputs, before: u64) {
        let added = emit.count() - before;
        if added > 0 {
            self.pushed_total.set(self.pushed_total.get() + added);
            self.emit_notify.notify();
        }
    }

    /// Partitions of a deleted stream left this shard: their ids may go to
    /// a new stream, whose checkpoints start afresh.
    pub fn forget_partitions(&self, partition_ids: &[u32]) {
        let mut checkpointed = self.checkpointed.borrow_mut();
        for partition_id in partition_ids {
            checkpointed.remove(partition_id);
        }
    }

    pub fn emit_queue_bytes(&self) -> usize {
        self.emit.borrow().size_bytes()
    }
}

/// After a batch is applied: collect closed windows, and pause while the
/// emit queue is over its limit (bounded, see the module doc).
pub async fn after_apply(shard: &Shard, any_processor: bool) {
    if !any_processor {
        return;
    }
    shard.aggregates.collect(&mut shard.partitions.borrow_mut());
    let deadline = Instant::now() + Duration::from_millis(EMIT_WAIT_MS_MAX);
    while shard.aggregates.emit_queue_bytes() > EMIT_QUEUE_BYTES_MAX {
        ShardMetrics::add(&shard.metrics.aggregate_emit_waits, 1);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        first(shard.aggregates.emit_drained.notified(), glommio::timer::sleep(left)).await;
    }
}

/// Whether any stream has aggregates (the apply path skips the collection
/// otherwise).
pub fn any_declared(shard: &Shard) -> bool {
    !shard.streams.borrow().catalog().aggregates().is_empty()
}

/// The shard's aggregate tasks: the emitter, and the clock (arrival-time
/// windows, checkpoints).
///
/// Both run in an urgent task queue (`create_urgent_task_queue`, vendored
/// glommio patch 6): closing and emitting a second's windows is a burst
/// that gives way to waiting requests once per [`crate::runtime::slice`];
/// from the default queue each such yield waited behind every batch queued
/// to apply, and the first closed window of a second reached a subscriber
/// 9 - 19 ms after its end instead of 4 - 5 (`scripts/bench-aggregates`
/// part 3, with back-to-back queries).
pub fn spawn_tasks(shard: &Rc<Shard>) {
    let queue = glommio::executor().create_urgent_task_queue("aggregates");
    let created = "the aggregates task queue was just created";
    glommio::spawn_local_into(run_emitter(shard.clone()), queue).expect(created).detach();
    glommio::spawn_local_into(run_clock(shard.clone()), queue).expect(created).detach();
}

async fn run_emitter(shard: Rc<Shard>) {
    loop {
        shard.aggregates.emit_notify.notified().await;
        let mut slice = crate::runtime::slice::Slice::start();
        loop {
            match emit_some(&shard) {
                None => break,
                Some(Ok(())) => slice.check().await,
                Some(Err(blocked)) => {
                    shard.ingress.wait_for_credits(blocked.owner, blocked.credit_bytes_needed).await;
                }
            }
        }
    }
}

/// Routes up to [`EMIT_CHUNK_WINDOWS`] queued windows. `None` when the
/// queue is empty, `Err` when an owner has no credits for the next.
fn emit_some(shard: &Shard) -> Option<Result<(), Blocked>> {
    let aggregates = &shard.aggregates;
    let mut emit = aggregates.emit.borrow_mut();
    if emit.is_empty() {
        return None;
    }
    let streams = shard.streams.borrow();
    let mut route = shard.ingress.begin(&shard.placement);
    let (mut position, mut count, mut dropped) = (0, 0u64, 0u64);
    let mut outcome = Ok(());
    while count < EMIT_CHUNK_WINDOWS {
        let Some((output, key, payload, next)) = emit.read_at(position) else { break };
        match streams.route_for(output.as_bytes()) {
            Some(stream) => {
                if let Err(blocked) = route.route_event(stream, key, payload) {
                    outcome = Err(blocked);
                    break;
                }
            }
            None => dropped += 1,
        }
        position = next;
        count += 1;
    }
    drop(route);
    emit.consume(position, count);
    ShardMetrics::add(&shard.metrics.aggregate_windows_emitted, count - dropped);
    ShardMetrics::add(&shard.metrics.aggregate_windows_dropped, dropped);
    aggregates.routed_total.set(aggregates.routed_total.get() + count);
    aggregates.routed_notify.wake_all();
    if emit.size_bytes() <= EMIT_QUEUE_BYTES_MAX {
        aggregates.emit_drained.notify();
    }
    Some(outcome)
}

async fn run_clock(shard: Rc<Shard>) {
    let checkpoint_every = Duration::from_millis(shard.config.aggregate_checkpoint_ms);
    let mut last_checkpoint = Instant::now();
    loop {
        if !any_declared(&shard) {
            shard.aggregates.declared_notify.notified().await;
            continue;
        }
        glommio::timer::sleep(Duration::from_millis(TICK_MS)).await;
        let now_ms = shard.aggregates.clock();
        close_due(&shard, now_ms).await;
        // Windows another path closed (any append leaves its output to the
        // next collection): a sweep of flags, cheap.
        shard.aggregates.collect_all(&mut shard.partitions.borrow_mut());
        let running = shard.aggregates.round_running.clone();
        // A read-only shard (started on a full disk) checkpoints once its
        // deferred writes are done, not a failing write per partition per
        // period meanwhile.
        let writable = shard.committer.as_ref().is_some_and(|committer| !committer.is_read_only());
        if writable && last_checkpoint.elapsed() >= checkpoint_every && !running.get() {
            last_checkpoint = Instant::now();
            running.set(true);
            let round = checkpoint_round(shard.clone(), None);
            glommio::spawn_local(async move {
                let _ = round.await;
                running.set(false);
            })
            .detach();
        }
    }
}

/// Closes the arrival-time windows due at `now_ms`, a partition at a time,
/// letting a waiting request in once a [`crate::runtime::slice`] is spent:
/// at a window end every key of every partition closes at once (10 000
/// keys of two aggregates took 1.3 - 3.7 ms on this box), which in one
/// piece held a control request that long.
async fn close_due(shard: &Shard, now_ms: u64) {
    let due: Vec<u32> = shard
        .partitions
        .borrow()
        .iter()
        .filter(|(_, partition)| {
            let processor = partition.processor.as_deref();
            processor.and_then(PartitionProcessor::next_close_ms).is_some_and(|close_ms| close_ms <= now_ms)
        })
        .map(|(partition_id, _)| partition_id)
        .collect();
    let mut slice = crate::runtime::slice::Slice::start();
    for partition_id in due {
        {
            let mut partitions = shard.partitions.borrow_mut();
            // Gone (moved to another shard) while this task yielded.
            let Some(processor) = partitions.get_mut(partition_id).and_then(|p| p.processor.as_deref_mut()) else {
                continue;
            };
            processor.advance(now_ms);
            let mut emit = shard.aggregates.emit.borrow_mut();
            let before = emit.count();
            processor.take_output(&mut emit);
            shard.aggregates.pushed(&mut emit, before);
        }
        slice.check().await;
    }
}

/// Writes the checkpoints of the owned partitions whose processors moved
/// on (or, with `stream`, of every owned partition of that stream) once
/// what they cover is durable; see the module doc. Returns the first error.
pub async fn checkpoint_round(shard: Rc<Shard>, stream: Option<u32>) -> Result<(), AggregateError> {
    let Some(committer) = shard.committer.as_ref() else { return Ok(()) };
    shard.aggregates.collect_all(&mut shard.partitions.borrow_mut());
    let pushed = shard.aggregates.pushed_total.get();
    let mut files = Vec::new();
    {
        let partitions = shard.partitions.borrow();
        let checkpointed = shard.aggregates.checkpointed.borrow();
        for (partition_id, partition) in partitions.iter() {
            let (Some(processor), Some(disk)) = (partition.processor.as_deref(), partition.log.disk()) else {
                continue;
            };
            let forced = stream.is_some_and(|base| base == partition.stream_base);
            if !forced && checkpointed.get(&partition_id) == Some(&processor.next_offset()) {
                continue;
            }
            let mut bytes = Vec::new();
            processor.encode_checkpoint(&mut bytes);
            files.push((partition_id, processor.next_offset(), disk.dir().to_path_buf(), bytes));
        }
    }
    if files.is_empty() {
        return Ok(());
    }
    // (1) Every window closed so far is routed, then stored at its owner.
    let aggregates = &shard.aggregates;
    aggregates.routed_notify.wait_until(|| aggregates.routed_total.get() >= pushed).await;
    shard.ingress.sync_barrier(0..shard.shard_count).await;
    // (2) Every event covered is durable in the log.
    committer.barrier().await;
    let shard_id = shard.id;
    let jobs: Vec<(u32, u64, PathBuf, Vec<u8>)> = files;
    let results = glommio::executor()
        .spawn_blocking(move || {
            jobs.into_iter()
                .map(|(partition_id, offset, dir, bytes)| (partition_id, offset, write_checkpoint(&dir, &bytes)))
                .collect::<Vec<_>>()
        })
        .await;
    let mut first_error = Ok(());
    let mut checkpointed = aggregates.checkpointed.borrow_mut();
    let (scope, now) = (Scope::shard(shard_id), Instant::now());
    for (partition_id, offset, result) in results {
        match result {
            Ok(()) => {
                checkpointed.insert(partition_id, offset);
                ShardMetrics::add(&shard.metrics.aggregate_checkpoints_written, 1);
            }
            Err(error) => {
                ShardMetrics::add(&shard.metrics.aggregate_checkpoint_errors, 1);
                let error = AggregateError::Checkpoint { partition_id, error };
                let failed = format_args!("{error}; the next round writes it again");
                aggregates.checkpoint_failures.occur(now, Level::Warn, scope, failed);
                if first_error.is_ok() {
                    first_error = Err(error);
                }
            }
        }
    }
    if first_error.is_ok() {
        let works = format_args!("aggregate checkpoints are written again");
        aggregates.checkpoint_failures.end(now, Level::Info, scope, works);
    }
    first_error
}

/// Writes `bytes` as `dir/aggregates.ckpt`, atomically and durably (the
/// temporary file's name is unique, so the old and the new owner of a
/// partition that moves never write into one). Runs on a blocking thread.
fn write_checkpoint(dir: &Path, bytes: &[u8]) -> Result<(), ReplaceError> {
    replace_durably(&dir.join(CHECKPOINT_FILE_NAME), bytes)
}

/// Makes `processor` run exactly `declarations` (the stream's aggregates in
/// the catalog): drops it when there are none, adds the missing ones
/// (counting from `next_offset`) and removes those no longer declared.
pub fn reconcile(
    processor: &mut Option<Box<PartitionProcessor>>,
    declarations: &[AggregateDeclaration],
    stream: &str,
    local_partition: u32,
    next_offset: u64,
    limits: ProcessorLimits,
) {
    if declarations.is_empty() {
        *processor = None;
        return;
    }
    let processor = processor
        .get_or_insert_with(|| Box::new(PartitionProcessor::new(stream, local_partition, next_offset, limits)));
    let stale: Vec<String> =
        processor.declarations().filter(|held| !declarations.contains(held)).map(|held| held.name.clone()).collect();
    for name in stale {
        processor.remove_aggregate(&name);
    }
    for declaration in declarations {
        if processor.from_offset(&declaration.name).is_none() {
            // Refusals (too many, wrong stream) were checked by the admin side.
            let _ = processor.add_aggregate(declaration.clone(), next_offset);
        }
    }
}

/// The stream's aggregates, from this shard's catalog copy.
fn declarations_of(shard: &Shard, stream: &str) -> Vec<AggregateDeclaration> {
    shard.streams.borrow().catalog().aggregates_of(stream).cloned().collect()
}

/// Brings a partition that just arrived (handoff) in line with the catalog.
pub fn reconcile_partition(shard: &Shard, partition_id: u32) {
    let Some((name, base)) =
        shard.streams.borrow().catalog().stream_of(partition_id).map(|(spec, _)| (spec.name.clone(), spec.base))
    else {
        return;
    };
    let declarations = declarations_of(shard, &name);
    let mut partitions = shard.partitions.borrow_mut();
    let Some(partition) = partitions.get_mut(partition_id) else { return };
    let next_offset = partition.log.next_offset();
    let limits = shard.aggregates.limits;
    reconcile(&mut partition.processor, &declarations, &name, partition_id - base, next_offset, limits);
}

/// Handles one request; those that wait run as their own task.
pub fn handle(shard: &Rc<Shard>, request: AggregateRequest) {
    match request {
        AggregateRequest::Declare { declaration, reply } => {
            let shard = shard.clone();
            glommio::spawn_local(async move {
                let _ = reply.send(declare(&shard, declaration).await);
            })
            .detach();
        }
        AggregateRequest::Remove { name, reply } => {
            remove(shard, &name);
            let _ = reply.send(());
        }
        AggregateRequest::Query { name, key, reply } => {
            let _ = reply.send(query(shard, &name, &key));
        }
        AggregateRequest::Top { name, n, reply } => {
            let mut lists = Vec::new();
            for (_, partition) in shard.partitions.borrow().iter() {
                if let Some(processor) = &partition.processor {
                    lists.push(processor.top(&name, n));
                }
            }
            let _ = reply.send(crate::aggregate::merge_top(lists, n));
        }
        AggregateRequest::Stats { reply } => {
            let partitions = shard.partitions.borrow();
            let stats = partitions.iter().filter_map(|(_, partition)| partition.processor.as_ref());
            let _ = reply.send(stats.flat_map(|processor| processor.stats()).collect());
        }
    }
}

async fn declare(shard: &Rc<Shard>, declaration: AggregateDeclaration) -> Result<(), AggregateError> {
    let spec = shard.streams.borrow().catalog().get(&declaration.stream).cloned();
    let Some(spec) = spec else { return Err(AggregateError::UnknownStream { stream: declaration.stream }) };
    shard.streams.borrow_mut().catalog_mut().add_aggregate(declaration);
    shard.aggregates.declared_notify.notify();
    reconcile_stream(shard, &spec);
    checkpoint_round(shard.clone(), Some(spec.base)).await
}

fn remove(shard: &Shard, name: &str) {
    let removed = shard.streams.borrow_mut().catalog_mut().remove_aggregate(name);
    let spec = removed.and_then(|declaration| shard.streams.borrow().catalog().get(&declaration.stream).cloned());
    if let Some(spec) = spec {
        reconcile_stream(shard, &spec);
        // The next round rewrites their checkpoints without it.
        shard.aggregates.checkpointed.borrow_mut().clear();
    }
}

/// Reconciles every owned partition of `spec` with the catalog.
fn reconcile_stream(shard: &Shard, spec: &StreamSpec) {
    let declarations = declarations_of(shard, &spec.name);
    let limits = shard.aggregates.limits;
    let mut partitions = shard.partitions.borrow_mut();
    for local in 0..spec.partitions {
        let Some(partition) = partitions.get_mut(spec.global(local)) else { continue };
        let next_offset = partition.log.next_offset();
        reconcile(&mut partition.processor, &declarations, &spec.name, local, next_offset, limits);
    }
}

fn query(shard: &Shard, name: &str, key: &[u8]) -> Option<KeyView> {
    if key.is_empty() {
        return None;
    }
    let streams = shard.streams.borrow();
    let catalog = streams.catalog();
    let declaration = catalog.aggregates().iter().find(|declaration| declaration.name == name)?;
    let spec = catalog.get(&declaration.stream)?;
    let partition_id = spec.base + spec.partition_of(key);
    let partitions = shard.partitions.borrow();
    partitions.get(partition_id)?.processor.as_ref()?.current(name, key)
}

/// Sets the aggregate gauges and counters (summed over the owned
/// partitions' processors: they move with their partitions) before a stats
/// snapshot.
pub fn set_metrics(shard: &Shard) {
    let metrics = &shard.metrics;
    let (mut late, mut malformed, mut refused, mut closed, mut keys, mut memory) = (0, 0, 0, 0, 0, 0);
    for (_, partition) in shard.partitions.borrow().iter() {
        let Some(processor) = &partition.processor else { continue };
        memory += processor.memory_bytes();
        for (counters, key_count) in processor.counters() {
            late += counters.late_events_dropped;
            malformed += counters.value_malformed + counters.time_malformed;
            refused += counters.keys_refused;
            closed += counters.windows_closed;
            keys += key_count;
        }
    }
    metrics.aggregate_late_events_dropped.set(late);
    metrics.aggregate_values_malformed.set(malformed);
    metrics.aggregate_keys_refused.set(refused);
    metrics.aggregate_windows_closed.set(closed);
    metrics.aggregate_keys.set(keys);
    metrics.aggregate_memory_bytes.set(memory);
    metrics.aggregate_emit_queue_bytes.set(shard.aggregates.emit_queue_bytes() as u64);
}

/// At start (disk storage): the processor of a partition whose stream has
/// `declarations`, from its checkpoint, caught up by replaying the log
/// after it. `Ok(None)` when the stream has none.
pub async fn recover(
    disk: &DiskLog,
    spec: &StreamSpec,
    local_partition: u32,
    declarations: &[AggregateDeclaration],
    limits: ProcessorLimits,
) -> Result<Option<Box<PartitionProcessor>>, SegmentError> {
    if declarations.is_empty() {
        return Ok(None);
    }
    let path = disk.dir().join(CHECKPOINT_FILE_NAME);
    let loaded = match std::fs::read(&path) {
        Ok(bytes) => match PartitionProcessor::decode_checkpoint(&bytes, limits) {
            Ok(processor) => Some(processor),
            Err(error) => {
                log::warn!(stream = &spec.name, "{}: {error}; replaying the whole retained log", path.display());
                None
            }
        },
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
        Err(error) => {
            log::warn!(stream = &spec.name, "read {}: {error}; replaying the whole retained log", path.display());
            None
        }
    };
    let fits = |processor: &PartitionProcessor| {
        processor.stream() == spec.name
            && processor.partition() == local_partition
            && (disk.earliest_offset()..=disk.next_offset()).contains(&processor.next_offset())
    };
    let mut processor = match loaded {
        Some(processor) if fits(&processor) => Some(Box::new(processor)),
        Some(processor) => {
            log::warn!(
                stream = &spec.name,
                "{}: covers offsets below {}, the log holds {}..{}; replaying the whole retained log",
                path.display(),
                processor.next_offset(),
                disk.earliest_offset(),
                disk.next_offset()
            );
            None
        }
        None => None,
    };
    let start = processor.as_ref().map_or(disk.earliest_offset(), |processor| processor.next_offset());
    reconcile(&mut processor, declarations, &spec.name, local_partition, start, limits);
    let mut processor = processor.expect("declarations are not empty");
    replay(disk, &mut processor).await?;
    Ok(Some(processor))
}

/// Feeds the processor the log's events from its `next_offset` to the end,
/// with each frame's write time as their arrival time.
async fn replay(disk: &DiskLog, processor: &mut PartitionProcessor) -> Result<(), SegmentError> {
    let mut frames = Vec::new();
    while processor.next_offset() < disk.next_offset() {
        let offset = processor.next_offset();
        let (path, position, readable_end) = match disk.locate(offset) {
            Located::File { path, position, readable_end } => (path, position, readable_end),
            Located::Gone { earliest } => {
                // Retention deleted events the state never counted.
                log::warn!("replay of {}: offsets {offset}..{earliest} are gone", disk.dir().display());
                processor.skip_to(earliest);
                continue;
            }
            Located::Busy => return Ok(()),
        };
        let reader = SegmentReader::open(&path).await?;
        frames.clear();
        let size = REPLAY_READ_BYTES.min(usize::try_from(readable_end - position).unwrap_or(usize::MAX));
        reader.read_into(position, size, &mut frames).await?;
        let mut rest = frames.as_slice();
        while let Ok(frame) = decode_frame(rest) {
            rest = &rest[frame.header.frame_size()..];
            for record in frame.records() {
                processor.process(record.offset, record.key, record.payload, frame.header.timestamp_ms, 0);
            }
        }
        if processor.next_offset() == offset {
            log::warn!("replay of {}: no frame at offset {offset}; stopping", disk.dir().display());
            return Ok(());
        }
        glommio::yield_if_needed().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint_failure(errno: i32) -> AggregateError {
        let path = PathBuf::from("/data/streams/s/3/aggregates.ckpt");
        let error = ReplaceError { op: "write", path, source: std::io::Error::from_raw_os_error(errno) };
        AggregateError::Checkpoint { partition_id: 3, error }
    }

    /// A declaration's errors map to HTTP statuses: a stream gone is 404, a
    /// full disk 507 (saying it is written again), another write error 500;
    /// each names the partition and the file.
    #[test]
    fn aggregate_errors_map_to_http_statuses() {
        assert_eq!(AggregateError::UnknownStream { stream: "gone".into() }.http_status(), 404);
        let full = checkpoint_failure(libc::ENOSPC);
        assert_eq!(full.http_status(), 507);
        let text = full.to_string();
        assert!(text.starts_with("storage_full: aggregate checkpoint of partition 3: write /data/"), "{text}");
        assert!(text.contains("written again"), "{text}");
        let other = checkpoint_failure(libc::EIO);
        assert_eq!(other.http_status(), 500);
        assert!(other.to_string().starts_with("storage_error: aggregate checkpoint of partition 3"), "{other}");
    }
}
