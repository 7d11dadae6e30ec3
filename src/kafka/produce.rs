//! Produce: a Kafka producer's records into the same engine as lines.
//!
//! Each partition's data is checked whole first ([`super::batch`]): a bad
//! CRC, a compressed batch, a record that does not parse or an oversized
//! record refuses that partition's data (with Kafka's code) and nothing of
//! it is stored. The check decodes each record once and keeps where its
//! parts lie ([`EntryCheck`]), so routing does not decode it again. Then every record
//! is routed to the partition the client chose (Kafka clients pick
//! partitions themselves; spate stores what they chose), through the
//! shard's ingress: the same open batches, credits, holds and backpressure
//! as a line, and no allocation per record (the record is copied once, from
//! the request into the owner's batch). While an owner has no credits the
//! connection waits, and does not read its next request.
//!
//! A request is handled in two steps, so that a connection can route its
//! next requests while earlier ones wait ([`super::serve_connection`]):
//! [`route`] routes its records and notes, per owner it touched, the batch
//! whose grant answers it ([`RoutedProduce`]); [`RoutedProduce::answer`]
//! builds the answer once those grants came back
//! ([`RoutedProduce::answerable`]). The answer waits as `acks` asks: `0`
//! none; `1` until every owner the request touched has applied its records
//! (stored and visible to subscribers); `all` (-1) until they are durable
//! under `--fsync`, exactly as a `#SYNC` waits.
//!
//! **Offsets.** The owner assigns offsets as it applies batches from every
//! connection, so the request asks it for two: those of the first and the
//! last record it routes to each partition ([`crate::routing::OffsetAsk`],
//! answered in the grant the answer waits for anyway). The answer's base
//! offset is the first, and its log start offset the partition's earliest
//! then. A client numbers the records of a batch from the base offset, so
//! the base offset is given only when the records are consecutive in the
//! partition (the last's offset is the first's plus the count): always,
//! unless another connection's records for the same partition came between
//! them (the request's records were split over two owner batches, or it
//! waited for credits halfway); then, and for a partition still migrating
//! when its records arrived, it is -1 (unknown), as before offsets were
//! returned (librdkafka, kafka-python and the Java client report it as
//! unknown). A retry of an idempotent producer's stored batch answers -1
//! too (the original's offsets are not kept).
//!
//! Batches of idempotent producers are checked against the producer table
//! first ([`super::producers`]): a retry of a stored batch is not routed
//! again, and is answered once its original was.
//!
//! With `--kafka-produce-discard` (a hidden benchmark knob) the batches are
//! decoded and checked as above and answered without being routed: what a
//! client reaches against it is its own ceiling against this listener.

use std::cell::Cell;

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use std::time::{Duration, Instant};

use super::batch::{CheckedBatch, EntryCheck, StagedRun};
use super::producers::{BatchIdentity, Verdict};
use super::{KafkaFace, codes};
use crate::config::limits::KAFKA_PRODUCE_ENTRY_BYTES;
use crate::protocol::record::ExtendedRecord;
use crate::routing::Blocked;
use crate::shard::Shard;
use crate::shard::ingress::{Ingress, OffsetSlots};
use crate::shard::metrics::ShardMetrics;

/// A Produce request whose records are routed, waiting to be answered.
pub struct RoutedProduce {
    acks: i16,
    /// Per owner shard: the batch sequence whose grant answers the request
    /// (0: nothing to wait for).
    sequences: Vec<u64>,
    /// Each topic of the request, with its entries in `partitions`.
    topics: Vec<(TopicName, std::ops::Range<usize>)>,
    partitions: Vec<RoutedPartition>,
    /// Per entry of `partitions`, the offsets of its first (`2 * i`) and
    /// last (`2 * i + 1`) routed record; empty when nothing is asked
    /// (acks=0, `--kafka-produce-discard`).
    slots: OffsetSlots,
    /// Idempotent batches it took: their duplicates wait for this answer.
    taken: Vec<(u32, BatchIdentity)>,
    /// Retries of batches already taken: answered once the original is.
    duplicates: Vec<(u32, BatchIdentity)>,
}

/// One partition entry of a Produce request, as routed.
#[derive(Debug, Clone, Copy)]
struct RoutedPartition {
    index: i32,
    code: i16,
    /// Records routed for it.
    routed_count: u64,
    /// Every batch of it was routed (none was a retry already stored).
    whole: bool,
    /// Its records went to the owner in one run (one copy into one owner
    /// batch, [`route_staged`]): they are applied one after the other, so
    /// only the first asked for its offset, and the last's is the first's
    /// plus the count less one.
    one_run: bool,
}

// The memory formula's cost per entry in flight covers the entry, its two
// offset cells, the two waiters of the shard's ingress and the two asks of
// the batches that carry them.
const _: () = assert!(
    std::mem::size_of::<RoutedPartition>()
        + 2 * std::mem::size_of::<Cell<(i64, i64)>>()
        + 2 * 48
        + 2 * std::mem::size_of::<crate::routing::OffsetAsk>()
        <= KAFKA_PRODUCE_ENTRY_BYTES
);

/// Partition entries of a Produce request: what it holds in flight.
pub fn entry_count(request: &ProduceRequest) -> usize {
    request.topic_data.iter().map(|topic| topic.partition_data.len()).sum()
}

/// Checks and routes every record of a Produce request (waiting for credits
/// or held partitions as a line does); the answer is built later, by
/// [`RoutedProduce::answer`].
pub async fn route(shard: &Shard, face: &KafkaFace, request: ProduceRequest, check: &mut EntryCheck) -> RoutedProduce {
    let acks = request.acks;
    let shard_count = usize::from(shard.shard_count());
    let entries = entry_count(&request);
    let asking = acks != 0 && !face.produce_discard;
    let slots: OffsetSlots = (0..if asking { 2 * entries } else { 0 }).map(|_| Cell::new((-1, -1))).collect();
    let mut routed = RoutedProduce {
        acks,
        sequences: vec![0; shard_count],
        topics: Vec::with_capacity(request.topic_data.len()),
        partitions: Vec::with_capacity(entries),
        slots,
        taken: Vec::new(),
        duplicates: Vec::new(),
    };
    let mut touched = vec![false; shard_count];
    for topic in request.topic_data {
        let name = topic.name.0.to_string();
        let route = match shard.route_for(name.as_bytes()) {
            None => super::topics::auto_create(shard, face, &name).await,
            route => route,
        };
        let start = routed.partitions.len();
        for data in topic.partition_data {
            let entry = routed.partitions.len();
            let mut partition =
                RoutedPartition { index: data.index, code: codes::NONE, routed_count: 0, whole: true, one_run: false };
            partition.code = match route {
                _ if !matches!(acks, -1..=1) => codes::INVALID_REQUIRED_ACKS,
                Some(route) if (0..route.partitions as i64).contains(&i64::from(data.index)) => {
                    let records = data.records.unwrap_or_default();
                    let global = route.base + data.index as u32;
                    let mut target =
                        Target { partition: global, entry, touched: &mut touched, routed: &mut routed, one_run: false };
                    let (code, count, whole) = produce_partition(shard, face, &mut target, &records, check).await;
                    (partition.routed_count, partition.whole, partition.one_run) = (count, whole, target.one_run);
                    code
                }
                _ => codes::UNKNOWN_TOPIC_OR_PARTITION,
            };
            if partition.code != codes::NONE {
                ShardMetrics::add(&shard.metrics().kafka_errors_partition, 1);
            }
            routed.partitions.push(partition);
        }
        // Owned, so the request's buffer is not held while it waits.
        routed.topics.push((TopicName(StrBytes::from_string(name)), start..routed.partitions.len()));
    }
    check.trim();
    if acks != 0 {
        routed.sequences = answering_points(shard, &touched, acks == -1);
    }
    routed
}

/// Where one partition entry's records go, and what they report to.
struct Target<'a> {
    /// Global partition id.
    partition: u32,
    /// The entry's index in the request (its offset slots).
    entry: usize,
    touched: &'a mut [bool],
    routed: &'a mut RoutedProduce,
    /// The entry's records went in one run ([`RoutedPartition::one_run`]).
    one_run: bool,
}

impl RoutedProduce {
    /// Partition entries it holds while in flight.
    pub fn entry_count(&self) -> usize {
        self.partitions.len()
    }

    /// Whether every owner it waits for has granted back its batch.
    pub fn is_answerable(&self, ingress: &Ingress) -> bool {
        self.sequences.iter().enumerate().all(|(owner, &sequence)| ingress.granted(owner as u16, sequence))
    }

    /// Resolves once [`RoutedProduce::is_answerable`].
    pub async fn answerable(&self, ingress: &Ingress) {
        ingress.wait_granted(&self.sequences).await;
    }

    /// The answer, once answerable (waiting only for originals of retried
    /// batches); `None` for acks=0 (no response is sent).
    pub async fn answer(self, face: &KafkaFace) -> Option<ProduceResponse> {
        for (partition, batch) in &self.taken {
            face.producers.answered(*partition, batch);
        }
        wait_for_originals(face, &self.duplicates).await;
        if self.acks == 0 {
            return None;
        }
        let mut responses = Vec::with_capacity(self.topics.len());
        for (name, entries) in &self.topics {
            let partitions = entries.clone().map(|entry| self.partition_response(entry)).collect();
            responses
                .push(TopicProduceResponse::default().with_name(name.clone()).with_partition_responses(partitions));
        }
        Some(ProduceResponse::default().with_responses(responses))
    }

    /// The answer for entry `entry`, with its offsets when they are known
    /// and consecutive (see the module doc).
    fn partition_response(&self, entry: usize) -> PartitionProduceResponse {
        let partition = self.partitions[entry];
        let slot = |index: usize| self.slots.get(index).map_or((-1, -1), Cell::get);
        let (first, log_start) = slot(2 * entry);
        let last = if partition.routed_count == 1 || partition.one_run {
            first + partition.routed_count as i64 - 1
        } else {
            slot(2 * entry + 1).0
        };
        let consecutive = first >= 0 && last - first + 1 == partition.routed_count as i64;
        let known = partition.code == codes::NONE && partition.whole && consecutive;
        PartitionProduceResponse::default()
            .with_index(partition.index)
            .with_error_code(partition.code)
            .with_base_offset(if known { first } else { -1 })
            .with_log_append_time_ms(-1)
            .with_log_start_offset(if known { log_start } else { -1 })
    }
}

/// The longest a retry waits for its original's answer (a request waiting
/// for credits or durability); past it the retry is answered anyway, as
/// the original's records are already in the owner's hands.
const ORIGINAL_WAIT_MS_MAX: u64 = 30_000;

/// Waits until the original of every duplicate has been answered, polling:
/// a duplicate racing its original is rare (a retry on a new connection
/// while the first still waits), and needs no wake-up machinery.
async fn wait_for_originals(face: &KafkaFace, duplicates: &[(u32, BatchIdentity)]) {
    let started = Instant::now();
    for (partition, batch) in duplicates {
        while !face.producers.is_answered(*partition, batch)
            && started.elapsed() < Duration::from_millis(ORIGINAL_WAIT_MS_MAX)
        {
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// Checks one partition's batches (decoding each record once, into
/// `check`) and routes their records: the Kafka code for the partition, the
/// records routed, and whether every batch was.
async fn produce_partition(
    shard: &Shard,
    face: &KafkaFace,
    target: &mut Target<'_>,
    records: &bytes::Bytes,
    check: &mut EntryCheck,
) -> (i16, u64, bool) {
    if let Err(error) = check.check(records, target.partition, face.record_size_max) {
        if error.code() == codes::CORRUPT_MESSAGE {
            ShardMetrics::add(&shard.metrics().kafka_errors_corrupt_batch, 1);
        }
        return (error.code(), 0, false);
    }
    if face.produce_discard {
        // Checked whole above, as when stored; nothing is routed.
        return (codes::NONE, 0, false);
    }
    let batches = check.batches();
    let last = batches.len().saturating_sub(1);
    if batches.iter().all(|batch| batch.producer_id < 0) {
        // Not an idempotent producer: nothing to check, no lock taken.
        let mut count = 0;
        for (index, batch) in batches.iter().enumerate() {
            count += route_checked(shard, target, check, records, (index, batch), (index == 0, index == last)).await;
        }
        return (codes::NONE, count, true);
    }
    let identities: Vec<BatchIdentity> = batches.iter().map(CheckedBatch::identity).collect();
    let mut verdicts = Vec::with_capacity(batches.len());
    if let Err(code) = face.producers.check(target.partition, &identities, &mut verdicts) {
        return (code, 0, false);
    }
    let (mut count, mut whole) = (0, true);
    for (index, ((batch, identity), verdict)) in batches.iter().zip(identities).zip(verdicts).enumerate() {
        match verdict {
            Verdict::Duplicate => {
                ShardMetrics::add(&shard.metrics().kafka_duplicate_batches, 1);
                target.routed.duplicates.push((target.partition, identity));
                whole = false;
            }
            Verdict::Take | Verdict::Refuse(_) => {
                count +=
                    route_checked(shard, target, check, records, (index, batch), (index == 0, index == last)).await;
                if identity.producer_id >= 0 {
                    target.routed.taken.push((target.partition, identity));
                }
            }
        }
    }
    (codes::NONE, count, whole)
}

/// Routes checked batch `index` of `check`'s entry (whose bytes are
/// `records`): from its staged encoding when the entry was staged, else
/// decoding its records again.
async fn route_checked(
    shard: &Shard,
    target: &mut Target<'_>,
    check: &EntryCheck,
    records: &bytes::Bytes,
    (index, batch): (usize, &CheckedBatch),
    ends: (bool, bool),
) -> u64 {
    match check.staged(index) {
        Some(run) => route_staged(shard, target, run, ends).await,
        None => route_batch(shard, target, batch, check.records(records, index), ends).await,
    }
}

/// [`route_batch`] for a staged batch: its records go in runs, each one
/// copy into the owner's batch ([`crate::routing::route_encoded`]). The
/// entry's first and last records ask for their offsets, so a run starts
/// at each and the last one is routed on its own.
async fn route_staged(shard: &Shard, target: &mut Target<'_>, run: StagedRun<'_>, (first, last): (bool, bool)) -> u64 {
    let count = run.ends.len();
    let slots = (!target.routed.slots.is_empty()).then(|| target.routed.slots.clone());
    let (mut index, mut start) = (0usize, run.start);
    while index < count {
        let (mut routed, mut bytes) = (0u64, 0u64);
        let blocked = {
            let mut route = shard.begin_route();
            // A request is a whole unit: its batches go soon, not after
            // the flush timer.
            route.drained = true;
            let mut blocked = None;
            while index < count {
                let ask = offset_ask(slots.as_ref(), target.entry, (first, last), index as u64, count as u64);
                // The last record asks on its own: the run stops before it,
                // unless the entry's records may all go in one run (then
                // the first's offset gives the last's).
                let whole_entry = first && last && index == 0;
                let run_end =
                    if slots.is_some() && last && index + 1 < count && !whole_entry { count - 1 } else { count };
                match route.route_encoded(target.partition, (run.encoded, start, &run.ends[index..run_end]), ask) {
                    Ok((owner, taken)) => {
                        target.touched[usize::from(owner)] = true;
                        target.one_run = whole_entry && taken == count;
                        let end = run.ends[index + taken - 1] as usize;
                        // A record's log size is its batch size less the
                        // partition id.
                        bytes += (end - start - 4 * taken) as u64;
                        (start, index, routed) = (end, index + taken, routed + taken as u64);
                    }
                    Err(error) => {
                        blocked = Some(error);
                        break;
                    }
                }
            }
            blocked
        };
        if !settle(shard, (routed, bytes), blocked).await {
            break;
        }
    }
    index as u64
}

/// Routes a checked batch's records (`records`, from its [`EntryCheck`]) to
/// the target partition, waiting for credits or a held partition whenever
/// routing is blocked, and resuming at the record that was blocked.
/// `(first, last)`: whether the batch is the entry's first or last, whose
/// first or last record's offset is asked for. Returns the records routed.
async fn route_batch<'a>(
    shard: &Shard,
    target: &mut Target<'_>,
    batch: &CheckedBatch,
    records: impl Iterator<Item = ExtendedRecord<'a>>,
    (first, last): (bool, bool),
) -> u64 {
    let record_count = u64::try_from(batch.record_count).unwrap_or(0);
    let slots = (!target.routed.slots.is_empty()).then(|| target.routed.slots.clone());
    let mut records = records.peekable();
    let mut index = 0u64;
    loop {
        let (mut count, mut bytes) = (0u64, 0u64);
        let blocked = {
            let mut route = shard.begin_route();
            // A request is a whole unit: its batches go soon, not after
            // the flush timer.
            route.drained = true;
            let mut blocked = None;
            while let Some(record) = records.peek() {
                let ask = offset_ask(slots.as_ref(), target.entry, (first, last), index, record_count);
                match route.route_extended(target.partition, record, ask) {
                    Ok(owner) => {
                        target.touched[usize::from(owner)] = true;
                        count += 1;
                        index += 1;
                        bytes += record.log_size() as u64;
                        records.next();
                    }
                    Err(error) => {
                        blocked = Some(error);
                        break;
                    }
                }
            }
            blocked
        };
        if !settle(shard, (count, bytes), blocked).await {
            return index;
        }
    }
}

/// The offset slot record `index` of a batch of `count` asks its owner to
/// fill, if any: the entry's first record (in its first batch) and its last
/// (in its last batch, unless that is the first record itself), whose
/// offsets the Produce answer names; `None` when acks=0 (no `slots`).
fn offset_ask(
    slots: Option<&OffsetSlots>,
    entry: usize,
    (first, last): (bool, bool),
    index: u64,
    count: u64,
) -> Option<(&OffsetSlots, usize)> {
    let slots = slots?;
    if first && index == 0 {
        Some((slots, 2 * entry))
    } else if last && index + 1 == count {
        Some((slots, 2 * entry + 1))
    } else {
        None
    }
}

/// Counts one routing pass's records and bytes, then waits for what
/// blocked it (credits, or a held partition's release). Returns whether
/// routing goes on (it was blocked).
async fn settle(shard: &Shard, (records, bytes): (u64, u64), blocked: Option<Blocked>) -> bool {
    let metrics = shard.metrics();
    ShardMetrics::add(&metrics.events_ingested, records);
    ShardMetrics::add(&metrics.bytes_ingested, bytes);
    ShardMetrics::add(&metrics.kafka_records_produced, records);
    match blocked {
        None => return false,
        Some(Blocked { held: Some(held), .. }) => {
            shard.ingress().wait_for_release(held).await;
        }
        Some(blocked) => {
            shard.ingress().wait_for_credits(blocked.owner, blocked.credit_bytes_needed).await;
        }
    }
    true
}

/// Per owner, the batch sequence whose grant means that what this request
/// routed to it is applied (`durable`: made durable under the fsync
/// policy): a `#SYNC`'s point ([`crate::shard::ingress::Route::sync_point`]).
/// 0 for owners it did not touch.
fn answering_points(shard: &Shard, touched: &[bool], durable: bool) -> Vec<u64> {
    let mut sequences = vec![0u64; touched.len()];
    let mut route = shard.begin_route();
    for (owner, _) in touched.iter().enumerate().filter(|(_, touched)| **touched) {
        let owner_id = owner as u16;
        sequences[owner] = if durable { route.sync_point(owner_id) } else { route.applied_point(owner_id) };
    }
    sequences
}
