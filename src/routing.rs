//! The source side of the data path as plain data: where an event goes
//! ([`route`]), the open batch and credit window of each owner ([`Router`]),
//! and what crosses between a source and an owner ([`DataBatch`] one way,
//! [`CreditGrant`] the other).
//!
//! [`route`] places an event by its key's stable hash, encodes it into the
//! open batch of the partition's owner shard (the shard itself included:
//! local appends use the same accounting) and spends its record size in
//! credits. An owner grants each source a window of `credit_window_bytes`
//! and `credit_window_batches`; credits come back in a [`CreditGrant`] once
//! the owner has applied a batch. A source without credits for an event's
//! owner gets [`Blocked`] and must stop (the connection stops reading its
//! socket), so bytes in flight between any two shards never exceed the
//! window.
//!
//! Grants need not come back one frame per batch: a frame to a parked shard
//! wakes it, and a source with most of its window left has no use for its
//! credits yet. So an owner may hold grants and send several in one frame
//! (`shard::grants`), and a source marks a batch [`DataBatch::grant_now`]
//! when it wants them promptly: once less than half of its window (bytes or
//! batches) is left after the batch, or when a `#SYNC` or a drain waits for
//! the owner. The owner then sends that grant and every one it holds for the
//! source. A source that lacks credits therefore never waits for grants an
//! owner is holding: every batch it sent since it fell below half asked for
//! them.
//!
//! A Kafka Produce must tell its producer the offsets its records got, and
//! only the owner knows them, as it applies. So a source may ask for the
//! offset of a record as it batches it ([`OffsetAsk`], a few per Produce,
//! never one per record): the asks travel with the batch, the owner writes
//! each asked record's offset into them as it applies the batch, and they
//! come back in its grant. Lines ask for nothing and carry nothing but an
//! empty `Option` (no allocation, no work at the owner).
//!
//! Nothing here does I/O or waits: it is unit-tested and benchmarked without
//! executors. The shard's ingress service (`shard::ingress`) drives it.

use crate::config::BATCH_SPARE_BUFFERS_MAX;
use crate::partition::PlacementTable;
use crate::partition::migration::Marker;
use crate::protocol::record::{
    ExtendedRecord, batch_record_size, encode_batch_record, encode_extended_batch_record, partition_at, partition_word,
};
use crate::stream::StreamRoute;

/// Places one event of `stream` by its key (the stream's partition
/// `xxh3_64(key) % partitions`, at global id `base +` that) and encodes it
/// into its owner's open batch. Batches that must leave (the next record
/// would overflow the open one, or it reached `batch_bytes`) are handed to
/// `deliver`. Returns the owner, or [`Blocked`] when the owner has no
/// credits (nothing was encoded). `value_at` is the hint for the stream's
/// keyed aggregates ([`crate::protocol::record::RecordRef::value_at`], 0
/// for none).
#[inline]
pub fn route(
    placement: &PlacementTable,
    router: &mut Router,
    stream: StreamRoute,
    (key, payload, value_at): (&[u8], &[u8], u16),
    mut deliver: impl FnMut(u16, DataBatch),
) -> Result<u16, Blocked> {
    let partition = stream.base + stream.partitioner.partition_of(key, stream.partitions);
    let owner = placement.owner(partition);
    if router.is_held(partition) {
        return Err(Blocked { owner, credit_bytes_needed: 0, held: Some(partition) });
    }
    if router.would_overflow(owner, batch_record_size(key, payload))
        && let Some(batch) = router.take_batch(owner)
    {
        deliver(owner, batch);
    }
    let batch_full = router.try_push(owner, partition_word(partition, value_at), key, payload)?;
    if batch_full && let Some(batch) = router.take_batch(owner) {
        deliver(owner, batch);
    }
    Ok(owner)
}

/// Places one Kafka record in the partition its producer chose (`partition`,
/// a global id the caller checked is in the stream) and encodes it as an
/// extended record into its owner's open batch: the same batches, credits,
/// holds and backpressure as [`route`], only the partition is not hashed.
/// With `ask`, the batch also asks the owner for the record's offset
/// ([`OffsetAsk`]); the ask is returned, to match the grant's answer.
#[inline]
pub fn route_extended(
    placement: &PlacementTable,
    router: &mut Router,
    partition: u32,
    record: &ExtendedRecord<'_>,
    ask: bool,
    mut deliver: impl FnMut(u16, DataBatch),
) -> Result<(u16, Option<OffsetAsk>), Blocked> {
    let owner = placement.owner(partition);
    if router.is_held(partition) {
        return Err(Blocked { owner, credit_bytes_needed: 0, held: Some(partition) });
    }
    if router.would_overflow(owner, record.batch_size())
        && let Some(batch) = router.take_batch(owner)
    {
        deliver(owner, batch);
    }
    let (batch_full, asked) = router.try_push_extended(owner, partition, record, ask)?;
    if batch_full && let Some(batch) = router.take_batch(owner) {
        deliver(owner, batch);
    }
    Ok((owner, asked))
}

/// Routes a run of records the Kafka face already encoded
/// ([`crate::kafka::batch::StagedRun`]: record `i` ends at `ends[i]` in
/// `encoded`, the first starts at `start`) to the partition its producer
/// chose: as many whole records as the owner's credits and the open batch's
/// room take, in one copy, so a Kafka batch costs one placement lookup and
/// one credit check per run instead of per record. Returns the owner and
/// how many were routed (at least one), and with `ask`, the first record's
/// [`OffsetAsk`]. `Err` when not even the first fits the credits.
#[inline]
pub fn route_encoded(
    placement: &PlacementTable,
    router: &mut Router,
    partition: u32,
    (encoded, start, ends): (&[u8], usize, &[u32]),
    ask: bool,
    mut deliver: impl FnMut(u16, DataBatch),
) -> Result<(u16, usize, Option<OffsetAsk>), Blocked> {
    let owner = placement.owner(partition);
    if router.is_held(partition) {
        return Err(Blocked { owner, credit_bytes_needed: 0, held: Some(partition) });
    }
    let first_size = ends[0] as usize - start;
    if router.would_overflow(owner, first_size)
        && let Some(batch) = router.take_batch(owner)
    {
        deliver(owner, batch);
    }
    let (count, batch_full, asked) = router.try_push_encoded(owner, (encoded, start, ends), ask)?;
    if batch_full && let Some(batch) = router.take_batch(owner) {
        deliver(owner, batch);
    }
    Ok((owner, count, asked))
}

/// A source's question to an owner: which offset did the record at
/// `position` of batch `sequence` get? Asked for a Kafka Produce's first
/// and last record of each partition (its answer names the first record's
/// offset, and the records' offsets must be consecutive for the client to
/// number them from it); answered by the owner as it applies the batch
/// ([`crate::partition::apply::apply_batch`]), returned in its grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetAsk {
    pub sequence: u64,
    /// Where the record starts in the batch's bytes.
    pub position: u32,
    /// The record's offset; -1 until answered, and when the owner did not
    /// store it as it applied the batch (its partition was still migrating
    /// there, or its stream was deleted).
    pub offset: i64,
    /// The partition's earliest readable offset then (Kafka's
    /// `log_start_offset`); -1 likewise.
    pub log_start_offset: i64,
}

/// A batch's asks, boxed so that a batch or grant without any (every line
/// batch) carries one null pointer: frames cross the mesh by value and stay
/// within [`crate::config::limits::MESH_FRAME_BYTES_MAX`].
pub type OffsetAsks = Option<Box<Vec<OffsetAsk>>>;

/// One destination (owner shard) as seen by this source.
#[derive(Debug)]
struct Destination {
    batch: Vec<u8>,
    batch_event_count: u32,
    /// Credit bytes this source may still spend on the owner.
    credit_bytes: usize,
    /// Batches this source may still send before a grant returns one.
    batch_slots: usize,
    sequence_sent: u64,
    sequence_applied: u64,
    spare_buffers: Vec<Vec<u8>>,
    /// Markers to send behind the open batch's events.
    markers: Vec<Marker>,
    /// The next batch must carry a sync request (a `#SYNC` waits for it).
    sync: bool,
    /// The next batch (possibly an empty one) must ask for its grant at
    /// once: a `#SYNC`, a drain or a stall waits for the owner's grants.
    grant_requested: bool,
    /// The open batch's offset asks (Kafka only), and one spare box of
    /// them returned by a grant, for reuse.
    offset_asks: OffsetAsks,
    spare_offset_asks: OffsetAsks,
    /// Records the open batch took in runs ([`Router::try_push_encoded`]),
    /// and how many runs: whether it is applied in arrival order
    /// ([`DataBatch::in_runs`]).
    run_event_count: u32,
    run_count: u32,
    /// The partition of the open batch's last run: a run of the same
    /// partition right after it (one the offset asks split) continues it.
    run_partition: u32,
}

/// Records a run brings on average, at least, for a batch made of runs
/// only to be applied in arrival order ([`DataBatch::in_runs`]): then a
/// partition's struct and log tail are fetched once per run, which costs
/// per record less than ordering the batch does. `spate bench --target
/// kafka` (256 partitions, about 14 records per partition per request):
/// server 142-146 ns/event ordering such batches, 126-130 in arrival order.
pub const RUN_RECORDS_MIN: u32 = 8;

impl Destination {
    /// Adds an ask for the record about to be encoded into the open batch.
    fn ask_offset(&mut self) -> OffsetAsk {
        let position = u32::try_from(self.batch.len()).expect("a batch is smaller than 4 GiB");
        let ask = OffsetAsk { sequence: self.sequence_sent + 1, position, offset: -1, log_start_offset: -1 };
        let spare = &mut self.spare_offset_asks;
        self.offset_asks.get_or_insert_with(|| spare.take().unwrap_or_default()).push(ask);
        ask
    }
}

/// The most asks a spare box kept for reuse may have room for (a box that
/// grew past it in a burst is freed): 64 KiB per destination at most.
pub const OFFSET_ASKS_KEPT_MAX: usize = 2048;

/// Why an event cannot be batched now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocked {
    pub owner: u16,
    pub credit_bytes_needed: usize,
    /// The partition is held by a lagging `hold` consumer group
    /// ([`crate::group`]): wait for its release, not for credits.
    pub held: Option<u32>,
}

/// Per-destination batches and credit windows of one source shard.
#[derive(Debug)]
pub struct Router {
    destinations: Vec<Destination>,
    batch_bytes: usize,
    credit_window_bytes: usize,
    credit_window_batches: usize,
    /// Partitions (global ids) a `hold` group holds: events for them wait.
    /// Grown on the first hold, so a server without hold groups checks an
    /// empty Vec.
    held: Vec<bool>,
}

impl Router {
    pub fn new(
        shard_count: usize,
        batch_bytes: usize,
        credit_window_bytes: usize,
        credit_window_batches: usize,
    ) -> Router {
        assert!(shard_count > 0 && batch_bytes > 0 && credit_window_batches > 0);
        let destinations = (0..shard_count)
            .map(|_| Destination {
                batch: Vec::with_capacity(batch_bytes),
                batch_event_count: 0,
                credit_bytes: credit_window_bytes,
                batch_slots: credit_window_batches,
                sequence_sent: 0,
                sequence_applied: 0,
                spare_buffers: Vec::new(),
                markers: Vec::new(),
                sync: false,
                grant_requested: false,
                offset_asks: None,
                spare_offset_asks: None,
                run_event_count: 0,
                run_count: 0,
                run_partition: 0,
            })
            .collect();
        Router { destinations, batch_bytes, credit_window_bytes, credit_window_batches, held: Vec::new() }
    }

    /// Whether events for `partition` must wait for a `hold` group.
    #[inline]
    pub fn is_held(&self, partition: u32) -> bool {
        self.held.get(partition as usize).copied().unwrap_or(false)
    }

    /// Marks `partition` held or released.
    pub fn set_held(&mut self, partition: u32, held: bool) {
        let index = partition as usize;
        if index >= self.held.len() {
            if !held {
                return;
            }
            self.held.resize(index + 1, false);
        }
        self.held[index] = held;
    }

    /// How many partitions are held.
    pub fn held_count(&self) -> usize {
        self.held.iter().filter(|&&held| held).count()
    }

    /// Encodes an event into its owner's open batch, spending its credits.
    /// `Ok(true)` means the batch reached `batch_bytes` and should be taken.
    /// `partition` is the batch record's partition word
    /// ([`crate::protocol::record::partition_word`]).
    #[inline]
    pub fn try_push(&mut self, owner: u16, partition: u32, key: &[u8], payload: &[u8]) -> Result<bool, Blocked> {
        let size = batch_record_size(key, payload);
        let destination = &mut self.destinations[usize::from(owner)];
        if destination.credit_bytes < size {
            return Err(Blocked { owner, credit_bytes_needed: size, held: None });
        }
        destination.credit_bytes -= size;
        encode_batch_record(&mut destination.batch, partition, key, payload);
        destination.batch_event_count += 1;
        Ok(destination.batch.len() >= self.batch_bytes)
    }

    /// [`Router::try_push`] for an extended (Kafka) record; with `ask`, the
    /// open batch asks the owner for the record's offset (the ask is
    /// returned too).
    #[inline]
    pub fn try_push_extended(
        &mut self,
        owner: u16,
        partition: u32,
        record: &ExtendedRecord<'_>,
        ask: bool,
    ) -> Result<(bool, Option<OffsetAsk>), Blocked> {
        let size = record.batch_size();
        let destination = &mut self.destinations[usize::from(owner)];
        if destination.credit_bytes < size {
            return Err(Blocked { owner, credit_bytes_needed: size, held: None });
        }
        destination.credit_bytes -= size;
        let asked = ask.then(|| destination.ask_offset());
        encode_extended_batch_record(&mut destination.batch, partition, record);
        destination.batch_event_count += 1;
        Ok((destination.batch.len() >= self.batch_bytes, asked))
    }

    /// Appends the longest prefix of a run of encoded records (see
    /// [`route_encoded`]) that the owner's credits and the open batch's
    /// room take, at least the first record if the credits take it (as
    /// [`Router::try_push_extended`] would, past a batch it could not
    /// send). Returns how many, whether the batch reached `batch_bytes`,
    /// and the first record's ask.
    #[inline]
    pub fn try_push_encoded(
        &mut self,
        owner: u16,
        (encoded, start, ends): (&[u8], usize, &[u32]),
        ask: bool,
    ) -> Result<(usize, bool, Option<OffsetAsk>), Blocked> {
        let destination = &mut self.destinations[usize::from(owner)];
        let first_size = ends[0] as usize - start;
        if destination.credit_bytes < first_size {
            return Err(Blocked { owner, credit_bytes_needed: first_size, held: None });
        }
        let room = destination.batch.capacity().saturating_sub(destination.batch.len()).max(first_size);
        let limit = destination.credit_bytes.min(room);
        let count = ends.partition_point(|&end| end as usize - start <= limit);
        let end = ends[count - 1] as usize;
        destination.credit_bytes -= end - start;
        let asked = ask.then(|| destination.ask_offset());
        destination.batch.extend_from_slice(&encoded[start..end]);
        // Exact: a run is at most KAFKA_STAGED_RECORDS_MAX records.
        destination.batch_event_count += count as u32;
        destination.run_event_count += count as u32;
        let partition = partition_at(encoded, start).unwrap_or(u32::MAX);
        if destination.run_count == 0 || partition != destination.run_partition {
            destination.run_count += 1;
            destination.run_partition = partition;
        }
        Ok((count, destination.batch.len() >= self.batch_bytes, asked))
    }

    /// Takes back the asks a grant returned, as the open batches' next box.
    pub fn recycle_offset_asks(&mut self, owner: u16, mut asks: Box<Vec<OffsetAsk>>) {
        let destination = &mut self.destinations[usize::from(owner)];
        if destination.spare_offset_asks.is_none() && asks.capacity() <= OFFSET_ASKS_KEPT_MAX {
            asks.clear();
            destination.spare_offset_asks = Some(asks);
        }
    }

    /// Whether a record of `size` bytes would push `owner`'s open batch past
    /// its buffer: take the batch first, so buffers never reallocate (and an
    /// in-flight batch holds `batch_bytes`, not twice that).
    #[inline]
    pub fn would_overflow(&self, owner: u16, size: usize) -> bool {
        let batch = &self.destinations[usize::from(owner)].batch;
        !batch.is_empty() && batch.len() + size > batch.capacity()
    }

    /// Whether an event of `size` credit bytes for `owner` fits now.
    pub fn has_credits(&self, owner: u16, size: usize) -> bool {
        self.destinations[usize::from(owner)].credit_bytes >= size
    }

    /// Takes the owner's open batch for sending, if it has events (or
    /// markers, or a request) and a batch slot is free. The credits stay
    /// spent until the owner grants them back. The batch asks for its grant
    /// at once ([`DataBatch::grant_now`]) when less than half of the window
    /// is left after it, or when asked to.
    pub fn take_batch(&mut self, owner: u16) -> Option<DataBatch> {
        let batch_bytes = self.batch_bytes;
        let destination = &mut self.destinations[usize::from(owner)];
        let empty = destination.batch.is_empty()
            && destination.markers.is_empty()
            && !destination.sync
            && !destination.grant_requested;
        if empty || destination.batch_slots == 0 {
            return None;
        }
        destination.batch_slots -= 1;
        destination.sequence_sent += 1;
        let fresh = destination.spare_buffers.pop().unwrap_or_else(|| Vec::with_capacity(batch_bytes));
        let bytes = std::mem::replace(&mut destination.batch, fresh);
        let event_count = std::mem::take(&mut destination.batch_event_count);
        let markers = std::mem::take(&mut destination.markers);
        let sync = std::mem::take(&mut destination.sync);
        let requested = std::mem::take(&mut destination.grant_requested);
        let offset_asks = destination.offset_asks.take();
        let run_event_count = std::mem::take(&mut destination.run_event_count);
        let run_count = std::mem::take(&mut destination.run_count);
        let in_runs = event_count > 0
            && run_event_count == event_count
            && u64::from(run_event_count) >= u64::from(RUN_RECORDS_MIN) * u64::from(run_count);
        let sequence = destination.sequence_sent;
        let grant_now = requested || sync || self.below_half(owner);
        Some(DataBatch {
            sequence,
            bytes,
            event_count,
            markers,
            sync,
            grant_now,
            in_runs,
            offset_asks,
            replicated_bytes: 0,
        })
    }

    /// Queues a marker for `owner` behind every event batched for it so far;
    /// it leaves with the next batch taken (which may hold no events).
    pub fn add_marker(&mut self, owner: u16, marker: Marker) {
        self.destinations[usize::from(owner)].markers.push(marker);
    }

    /// Makes the next batch for `owner` (possibly an empty one) carry a sync
    /// request: its grant comes back once the events before it are durable.
    pub fn request_sync(&mut self, owner: u16) {
        self.destinations[usize::from(owner)].sync = true;
    }

    /// Whether less than half of `owner`'s window (bytes or batches) is left.
    pub fn below_half(&self, owner: u16) -> bool {
        let destination = &self.destinations[usize::from(owner)];
        destination.batch_slots * 2 < self.credit_window_batches
            || destination.credit_bytes * 2 < self.credit_window_bytes
    }

    /// Makes the next batch for `owner` (possibly an empty one) ask for its
    /// grant, and every grant the owner holds for this source, at once.
    pub fn request_grant(&mut self, owner: u16) {
        self.destinations[usize::from(owner)].grant_requested = true;
    }

    /// Applies a grant from `owner`: credits and batch slots come back.
    pub fn grant(&mut self, owner: u16, grant: CreditGrant) {
        let destination = &mut self.destinations[usize::from(owner)];
        let batch_count = u64::from(grant.batch_count);
        assert!(batch_count > 0, "a grant covers at least one batch");
        assert_eq!(grant.sequence, destination.sequence_applied + batch_count, "grants arrive in order");
        assert!(grant.sequence <= destination.sequence_sent, "grant for an unsent batch");
        destination.sequence_applied = grant.sequence;
        destination.credit_bytes += grant.credit_bytes;
        destination.batch_slots += grant.batch_count as usize;
        assert!(destination.credit_bytes <= self.credit_window_bytes, "credits returned twice");
        assert!(destination.batch_slots <= self.credit_window_batches);
        for mut buffer in std::iter::once(grant.recycled).chain(grant.more_recycled) {
            if destination.spare_buffers.len() >= BATCH_SPARE_BUFFERS_MAX {
                break;
            }
            if buffer.capacity() >= self.batch_bytes {
                buffer.clear();
                destination.spare_buffers.push(buffer);
            }
        }
    }

    /// Owners with an open, non-empty batch.
    pub fn pending_owners(&self) -> impl Iterator<Item = u16> + '_ {
        self.destinations.iter().enumerate().map(|(owner, _)| owner as u16).filter(|&owner| self.has_pending(owner))
    }

    /// Whether `owner` has an open batch (events, markers, a sync or grant
    /// request) not yet sent.
    pub fn has_pending(&self, owner: u16) -> bool {
        let destination = &self.destinations[usize::from(owner)];
        !destination.batch.is_empty()
            || !destination.markers.is_empty()
            || destination.sync
            || destination.grant_requested
    }

    /// Sequence of the last batch sent to / applied by `owner`.
    pub fn sequences(&self, owner: u16) -> (u64, u64) {
        let destination = &self.destinations[usize::from(owner)];
        (destination.sequence_sent, destination.sequence_applied)
    }

    /// True when nothing is batched or in flight to any owner.
    pub fn is_idle(&self) -> bool {
        self.destinations.iter().all(|destination| {
            destination.batch.is_empty()
                && destination.markers.is_empty()
                && !destination.sync
                && !destination.grant_requested
                && destination.sequence_applied == destination.sequence_sent
        })
    }

    /// Credit bytes spent and not yet returned, over all owners.
    pub fn credits_outstanding_bytes(&self) -> usize {
        self.destinations.iter().map(|destination| self.credit_window_bytes - destination.credit_bytes).sum()
    }

    /// Bytes in open (unsent) batches.
    pub fn batch_buffered_bytes(&self) -> usize {
        self.destinations.iter().map(|destination| destination.batch.len()).sum()
    }
}

/// A batch of events from one source shard for one owner shard.
#[derive(Debug)]
pub struct DataBatch {
    /// Per (source, owner) sequence number, from 1, without gaps.
    pub sequence: u64,
    /// Batch records ([`crate::protocol::record`]).
    pub bytes: Vec<u8>,
    pub event_count: u32,
    /// Markers that follow this batch's events (usually none: no allocation).
    pub markers: Vec<Marker>,
    /// A `#SYNC` waits for this batch: its grant returns only once the
    /// events before it are durable under the fsync policy.
    pub sync: bool,
    /// The source wants its credits back promptly: the owner sends this
    /// batch's grant, and every grant it holds for the source, at once
    /// (`shard::grants`). Otherwise grants may wait at the owner
    /// to leave several in one frame.
    pub grant_now: bool,
    /// Every record came in runs of one partition each, [`RUN_RECORDS_MIN`]
    /// records long on average (a Kafka producer's batches: the Kafka face
    /// routes each as runs, [`route_encoded`]): the owner applies it in
    /// arrival order, which touches each partition once per run, rather
    /// than ordering it by partition first as it does a large batch of
    /// lines ([`crate::partition::apply::RecordOrder`]). Either order
    /// appends a partition's records in arrival order.
    pub in_runs: bool,
    /// Records whose offsets the source asks for ([`OffsetAsk`]), in
    /// position order; `None` for nearly every batch.
    pub offset_asks: OffsetAsks,
    /// Bytes of records taken out for replicated partitions
    /// ([`crate::shard::replicated`]): still part of the credit the grant
    /// returns. 0 unless a stream is replicated.
    pub replicated_bytes: usize,
}

/// Credits returned by an owner after applying `batch_count` batches, the
/// last of them `sequence` (grants arrive in order).
#[derive(Debug)]
pub struct CreditGrant {
    /// Sequence of the last applied batch covered.
    pub sequence: u64,
    /// Batches covered: `sequence - batch_count + 1 ..= sequence`.
    pub batch_count: u32,
    /// Credit bytes returned (the record bytes of those batches).
    pub credit_bytes: usize,
    /// The applied batches' buffers, returned for reuse so steady state
    /// allocates no batch buffers (and frees none across threads): the
    /// first here, the others in `more_recycled` (empty, so no allocation,
    /// for a grant of one batch).
    pub recycled: Vec<u8>,
    pub more_recycled: Vec<Vec<u8>>,
    /// A covered batch carried a `#SYNC` (see [`DataBatch::sync`]).
    pub sync: bool,
    /// A covered batch asked for its grant at once ([`DataBatch::grant_now`]).
    pub grant_now: bool,
    /// The covered batches' offset asks, answered, in sequence and position
    /// order ([`OffsetAsk`]).
    pub offset_asks: OffsetAsks,
}

impl CreditGrant {
    /// Folds the grant of the next batch in sequence into this one.
    pub fn merge(&mut self, next: CreditGrant) {
        assert_eq!(next.sequence, self.sequence + u64::from(next.batch_count), "grants merge in sequence");
        self.sequence = next.sequence;
        self.batch_count += next.batch_count;
        self.credit_bytes += next.credit_bytes;
        self.more_recycled.push(next.recycled);
        self.more_recycled.extend(next.more_recycled);
        self.sync |= next.sync;
        self.grant_now |= next.grant_now;
        match (&mut self.offset_asks, next.offset_asks) {
            (Some(asks), Some(more)) => asks.extend_from_slice(&more),
            (asks @ None, more) => *asks = more,
            (Some(_), None) => {}
        }
    }
}

impl crate::partition::apply::Batch for DataBatch {
    type Grant = CreditGrant;

    fn records(&self) -> &[u8] {
        &self.bytes
    }

    fn markers(&self) -> &[Marker] {
        &self.markers
    }

    fn take_offset_asks(&mut self) -> OffsetAsks {
        self.offset_asks.take()
    }

    fn in_runs(&self) -> bool {
        self.in_runs
    }

    fn put_offset_asks(&mut self, asks: OffsetAsks) {
        self.offset_asks = asks;
    }

    /// The grant returns the batch's credits and its buffer, for reuse,
    /// and its answered offset asks.
    fn into_grant(self) -> CreditGrant {
        CreditGrant {
            sequence: self.sequence,
            batch_count: 1,
            credit_bytes: self.bytes.len() + self.replicated_bytes,
            recycled: self.bytes,
            more_recycled: Vec::new(),
            sync: self.sync,
            grant_now: self.grant_now,
            offset_asks: self.offset_asks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant_for(batch: DataBatch) -> CreditGrant {
        crate::partition::apply::Batch::into_grant(batch)
    }

    /// A batch is marked `in_runs` (applied in arrival order) only when
    /// every record came in runs ([`Router::try_push_encoded`]) of
    /// [`RUN_RECORDS_MIN`] records or more on average: not with a line or a
    /// single Kafka record among them, nor with short runs.
    #[test]
    fn only_batches_of_long_runs_are_in_runs() {
        let record = ExtendedRecord { key: Some(b"k"), value: Some(b"v"), headers: &[0], timestamp_ms: 5 };
        // RUN_RECORDS_MIN records of partition 3, as many of partition 4.
        let mut encoded = Vec::new();
        let mut ends = Vec::new();
        for partition in [3, 4] {
            for _ in 0..RUN_RECORDS_MIN {
                encode_extended_batch_record(&mut encoded, partition, &record);
                ends.push(encoded.len() as u32);
            }
        }
        let mut router = Router::new(1, 1 << 16, 1 << 20, 64);
        let size = RUN_RECORDS_MIN as usize;
        // `count` records of partition 3 (or 4), from the run's `skip`th.
        let run = |router: &mut Router, partition: u32, skip: usize, count: usize| {
            let first = (partition as usize - 3) * size + skip;
            let start = if first == 0 { 0 } else { ends[first - 1] as usize };
            let taken = router.try_push_encoded(0, (&encoded, start, &ends[first..first + count]), false).unwrap();
            assert_eq!(taken.0, count);
        };
        run(&mut router, 3, 0, size);
        run(&mut router, 4, 0, size);
        assert!(router.take_batch(0).unwrap().in_runs, "two long runs");
        run(&mut router, 3, 0, size - 1);
        run(&mut router, 3, size - 1, 1);
        assert!(router.take_batch(0).unwrap().in_runs, "a run split in two (an offset ask) is one run");
        run(&mut router, 3, 0, size);
        router.try_push(0, 3, b"line", b"payload").unwrap();
        assert!(!router.take_batch(0).unwrap().in_runs, "a line among them");
        run(&mut router, 3, 0, size);
        router.try_push_extended(0, 3, &record, false).unwrap();
        assert!(!router.take_batch(0).unwrap().in_runs, "a record routed alone among them");
        run(&mut router, 3, 0, size);
        run(&mut router, 4, 0, 1);
        assert!(!router.take_batch(0).unwrap().in_runs, "runs shorter than RUN_RECORDS_MIN on average");
        router.try_push(0, 3, b"line", b"payload").unwrap();
        assert!(!router.take_batch(0).unwrap().in_runs, "lines only");
    }

    /// A source can never have more than the window in flight: once spent,
    /// pushes are refused until the owner grants the credits back.
    #[test]
    fn credits_bound_bytes_in_flight() {
        let mut router = Router::new(2, 64, 100, 8);
        let size = batch_record_size(b"key", b"0123456789");
        let mut accepted = 0;
        while router.try_push(1, 5, b"key", b"0123456789").is_ok() {
            accepted += 1;
        }
        assert_eq!(accepted, 100 / size);
        assert_eq!(
            router.try_push(1, 5, b"key", b"0123456789"),
            Err(Blocked { owner: 1, credit_bytes_needed: size, held: None })
        );
        assert!(router.has_credits(0, size), "other owners are not affected");
        let batch = router.take_batch(1).expect("batch with events");
        assert!(router.try_push(1, 5, b"key", b"0123456789").is_err(), "sending does not return credits");
        router.grant(1, grant_for(batch));
        assert!(router.try_push(1, 5, b"key", b"0123456789").is_ok(), "applying does");
        assert_eq!(router.credits_outstanding_bytes(), size);
    }

    /// A Kafka record's offset ask names the batch and position it was
    /// encoded at, leaves with that batch (a line batch carries none), and
    /// comes back in the grant, merged in order with the next batches'.
    #[test]
    fn offset_asks_travel_with_their_batch_and_grant() {
        let record = ExtendedRecord { key: Some(b"k"), value: Some(b"value"), headers: &[0], timestamp_ms: 5 };
        let mut router = Router::new(1, 1 << 16, 1 << 20, 8);
        assert_eq!(router.try_push_extended(0, 3, &record, false).unwrap(), (false, None));
        let (_, first) = router.try_push_extended(0, 3, &record, true).unwrap();
        let first = first.expect("asked");
        assert_eq!((first.sequence, first.position as usize, first.offset), (1, record.batch_size(), -1));
        let batch = router.take_batch(0).unwrap();
        assert_eq!(batch.offset_asks.as_deref(), Some(&vec![first]));
        router.try_push(0, 3, b"line", b"payload").unwrap();
        let lines = router.take_batch(0).unwrap();
        assert!(lines.offset_asks.is_none(), "a line batch asks nothing");
        let (_, second) = router.try_push_extended(0, 3, &record, true).unwrap();
        assert_eq!((second.unwrap().sequence, second.unwrap().position), (3, 0));
        let third = router.take_batch(0).unwrap();
        let mut grant = grant_for(batch);
        grant.merge(grant_for(lines));
        grant.merge(grant_for(third));
        let asks = grant.offset_asks.take().expect("the asks come back");
        assert_eq!(
            asks.iter().map(|ask| (ask.sequence, ask.position)).collect::<Vec<_>>(),
            [(1, first.position), (3, 0)]
        );
        router.grant(0, grant);
        router.recycle_offset_asks(0, asks);
        let (_, reused) = router.try_push_extended(0, 3, &record, true).unwrap();
        assert_eq!(reused.unwrap().sequence, 4);
        assert!(
            router.take_batch(0).unwrap().offset_asks.is_some_and(|asks| asks.capacity() >= 2),
            "the box is reused"
        );
    }

    /// A run of pre-encoded records goes in whole records only, within the
    /// credits and each batch's room: the batches, in order, hold exactly
    /// the run's bytes, each a whole number of records counted right, and a
    /// run refused for credits names the first record's size.
    #[test]
    fn encoded_runs_cut_at_credits_and_batch_room() {
        static VALUE: [u8; 100] = [b'v'; 100];
        let (mut encoded, mut ends) = (Vec::new(), Vec::new());
        for index in 0..60 {
            let value = &VALUE[..index * 37 % 100];
            let record = ExtendedRecord { key: Some(b"key"), value: Some(value), headers: &[0], timestamp_ms: 5 };
            crate::protocol::record::encode_extended_batch_record(&mut encoded, 1, &record);
            ends.push(encoded.len() as u32);
        }
        let placement = PlacementTable::spread(4, 2);
        let owner = placement.owner(1);
        let mut router = Router::new(2, 256, 1_000, 64);
        let (mut start, mut index, mut refusals) = (0usize, 0usize, 0);
        // Every batch sent (its bytes and count), and those not granted yet.
        let (mut sent, mut in_flight) = (Vec::new(), Vec::new());
        let mut keep = |batch: DataBatch, in_flight: &mut Vec<DataBatch>| {
            sent.push((batch.bytes.clone(), batch.event_count));
            in_flight.push(batch);
        };
        while index < ends.len() {
            let mut delivered = Vec::new();
            let routed = route_encoded(&placement, &mut router, 1, (&encoded, start, &ends[index..]), false, |_, b| {
                delivered.push(b)
            });
            delivered.into_iter().for_each(|batch| keep(batch, &mut in_flight));
            match routed {
                Ok((to, count, _)) => {
                    assert_eq!(to, owner);
                    start = ends[index + count - 1] as usize;
                    index += count;
                }
                Err(blocked) => {
                    refusals += 1;
                    assert_eq!(blocked.credit_bytes_needed, ends[index] as usize - start);
                    if let Some(batch) = router.take_batch(owner) {
                        keep(batch, &mut in_flight);
                    }
                    for batch in in_flight.drain(..) {
                        router.grant(owner, grant_for(batch));
                    }
                }
            }
        }
        if let Some(batch) = router.take_batch(owner) {
            keep(batch, &mut in_flight);
        }
        assert!(refusals > 0, "the window is smaller than the run");
        let mut all = Vec::new();
        for (bytes, event_count) in &sent {
            assert_eq!(
                crate::protocol::record::BatchIter::new(bytes).count(),
                *event_count as usize,
                "whole records, counted"
            );
            assert!(bytes.len() <= 256, "within the batch's room: {}", bytes.len());
            all.extend_from_slice(bytes);
        }
        assert_eq!(all, encoded);
    }

    /// Batch slots bound the number of batches in flight, and sequences are
    /// dense so SYNC and drain can wait for "applied == sent".
    #[test]
    fn batch_slots_and_sequences() {
        let mut router = Router::new(1, 16, 10_000, 2);
        let mut in_flight = Vec::new();
        for _ in 0..3 {
            assert_eq!(router.try_push(0, 0, b"k", b"0123456789"), Ok(true));
            if let Some(batch) = router.take_batch(0) {
                in_flight.push(batch);
            }
        }
        assert_eq!(in_flight.len(), 2, "third batch waits for a slot");
        assert_eq!(router.sequences(0), (2, 0));
        assert!(!router.is_idle());
        for batch in in_flight.drain(..) {
            router.grant(0, grant_for(batch));
        }
        let last = router.take_batch(0).expect("slot is back");
        assert_eq!(last.event_count, 1);
        router.grant(0, grant_for(last));
        assert_eq!(router.sequences(0), (3, 3));
        assert!(router.is_idle());
        assert_eq!(router.credits_outstanding_bytes(), 0);
    }
}
