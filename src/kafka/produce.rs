//! Produce: a Kafka producer's records into the same engine as lines.
//!
//! Each partition's data is checked whole first ([`super::batch`]): a bad
//! CRC, a compressed batch or an oversized record refuses that partition's
//! data (with Kafka's code) and nothing of it is stored. Then every record
//! is routed to the partition the client chose (Kafka clients pick
//! partitions themselves; spate stores what they chose), through the
//! shard's ingress: the same open batches, credits, holds and backpressure
//! as a line, and no allocation per record (the record is copied once, from
//! the request into the owner's batch). While an owner has no credits the
//! connection waits, and does not read its next request.
//!
//! The answer waits as `acks` asks: `0` none; `1` until every owner the
//! request touched has applied its records (stored and visible to
//! subscribers); `all` (-1) until they are durable under `--fsync`, exactly
//! as a `#SYNC` waits.
//!
//! Batches of idempotent producers are checked against the producer table
//! first ([`super::producers`]): a retry of a stored batch is not routed
//! again, and is answered once its original was.
//!
//! With `--kafka-produce-discard` (a hidden benchmark knob) the batches are
//! decoded and checked as above and answered without being routed: what a
//! client reaches against it is its own ceiling against this listener.
//!
//! The response's base offset is -1 (unknown): offsets are assigned by the
//! owner as it applies batches from many connections, after the records
//! left this shard, and the owner's answer to the source (a credit grant,
//! shared with every line) carries no offsets. Returning them would widen
//! the grant every line batch pays for; clients need no base offset to
//! produce (librdkafka and the Java client report -1 as "unknown").

use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};

use std::time::{Duration, Instant};

use super::batch::{ProducedBatch, check_batches};
use super::producers::{BatchIdentity, Verdict};
use super::{KafkaFace, codes};
use crate::routing::Blocked;
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;

/// Handles a Produce request; `None` for acks=0 (no response is sent).
pub async fn produce(shard: &Shard, face: &KafkaFace, request: ProduceRequest) -> Option<ProduceResponse> {
    let acks = request.acks;
    let mut pending = Pending { touched: vec![false; usize::from(shard.shard_count())], ..Pending::default() };
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let name = topic.name.0.to_string();
        let route = match shard.route_for(name.as_bytes()) {
            None => super::topics::auto_create(shard, face, &name).await,
            route => route,
        };
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            let code = match route {
                _ if !matches!(acks, -1..=1) => codes::INVALID_REQUIRED_ACKS,
                Some(route) if (0..route.partitions as i64).contains(&i64::from(data.index)) => {
                    let records = data.records.unwrap_or_default();
                    produce_partition(shard, face, route.base + data.index as u32, records, &mut pending).await
                }
                _ => codes::UNKNOWN_TOPIC_OR_PARTITION,
            };
            if code != codes::NONE {
                ShardMetrics::add(&shard.metrics().kafka_errors_partition, 1);
            }
            let response = PartitionProduceResponse::default()
                .with_index(data.index)
                .with_error_code(code)
                .with_base_offset(-1)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(-1);
            partitions.push(response);
        }
        responses.push(TopicProduceResponse::default().with_name(topic.name).with_partition_responses(partitions));
    }
    if acks != 0 {
        wait_for_owners(shard, &pending.touched, acks == -1).await;
    }
    for (partition, batch) in &pending.taken {
        face.producers.answered(*partition, batch);
    }
    wait_for_originals(face, &pending.duplicates).await;
    (acks != 0).then(|| ProduceResponse::default().with_responses(responses))
}

/// What one Produce request waits for before it answers.
#[derive(Default)]
struct Pending {
    /// Owners the request routed records to.
    touched: Vec<bool>,
    /// Idempotent batches it took: their duplicates wait for this answer.
    taken: Vec<(u32, BatchIdentity)>,
    /// Retries of batches already taken: answered once the original is.
    duplicates: Vec<(u32, BatchIdentity)>,
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

/// Checks one partition's batches and routes their records; the Kafka code
/// for the partition.
async fn produce_partition(
    shard: &Shard,
    face: &KafkaFace,
    partition: u32,
    records: bytes::Bytes,
    pending: &mut Pending,
) -> i16 {
    let batches = match check_batches(records, face.record_size_max) {
        Ok(batches) => batches,
        Err(error) => {
            if error.code() == codes::CORRUPT_MESSAGE {
                ShardMetrics::add(&shard.metrics().kafka_errors_corrupt_batch, 1);
            }
            return error.code();
        }
    };
    if face.produce_discard {
        // Checked whole above, as when stored; nothing is routed.
        return codes::NONE;
    }
    if batches.iter().all(|batch| batch.producer_id < 0) {
        // Not an idempotent producer: nothing to check, no lock taken.
        for batch in &batches {
            route_batch(shard, partition, batch, &mut pending.touched).await;
        }
        return codes::NONE;
    }
    let identities: Vec<BatchIdentity> = batches.iter().map(ProducedBatch::identity).collect();
    let mut verdicts = Vec::with_capacity(batches.len());
    if let Err(code) = face.producers.check(partition, &identities, &mut verdicts) {
        return code;
    }
    for ((batch, identity), verdict) in batches.iter().zip(identities).zip(verdicts) {
        match verdict {
            Verdict::Duplicate => {
                ShardMetrics::add(&shard.metrics().kafka_duplicate_batches, 1);
                pending.duplicates.push((partition, identity));
            }
            Verdict::Take | Verdict::Refuse(_) => {
                route_batch(shard, partition, batch, &mut pending.touched).await;
                if identity.producer_id >= 0 {
                    pending.taken.push((partition, identity));
                }
            }
        }
    }
    codes::NONE
}

/// Routes a checked batch's records to `partition`, waiting for credits or
/// a held partition whenever routing is blocked, and resuming at the record
/// that was blocked.
async fn route_batch(shard: &Shard, partition: u32, batch: &ProducedBatch, touched: &mut [bool]) {
    let mut records = batch.records().map_while(Result::ok).peekable();
    loop {
        let (mut count, mut bytes) = (0u64, 0u64);
        let blocked = {
            let mut route = shard.begin_route();
            // A request is a whole unit: its batches go soon, not after
            // the flush timer.
            route.drained = true;
            let mut blocked = None;
            while let Some(record) = records.peek() {
                match route.route_extended(partition, record) {
                    Ok(owner) => {
                        touched[usize::from(owner)] = true;
                        count += 1;
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
        let metrics = shard.metrics();
        ShardMetrics::add(&metrics.events_ingested, count);
        ShardMetrics::add(&metrics.bytes_ingested, bytes);
        ShardMetrics::add(&metrics.kafka_records_produced, count);
        match blocked {
            None => return,
            Some(Blocked { held: Some(held), .. }) => {
                shard.ingress().wait_for_release(held).await;
            }
            Some(blocked) => {
                shard.ingress().wait_for_credits(blocked.owner, blocked.credit_bytes_needed).await;
            }
        }
    }
}

/// Waits until every touched owner has applied (`durable`: made durable
/// under the fsync policy) what this request routed to it: a `#SYNC`'s wait.
async fn wait_for_owners(shard: &Shard, touched: &[bool], durable: bool) {
    let mut sequences = vec![0u64; touched.len()];
    {
        let mut route = shard.begin_route();
        for (owner, _) in touched.iter().enumerate().filter(|(_, touched)| **touched) {
            let owner_id = owner as u16;
            sequences[owner] = if durable { route.sync_point(owner_id) } else { route.applied_point(owner_id) };
        }
    }
    shard.ingress().wait_granted(&sequences).await;
}
