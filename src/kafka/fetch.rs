//! Fetch and ListOffsets: Kafka consumers read the same logs, through the
//! same owner fetches, as a `SUB` subscriber ([`crate::partition::fetch`]).
//!
//! A Fetch asks each owner once for every requested partition it holds, at
//! the requested offsets (an offset past the end is OFFSET_OUT_OF_RANGE;
//! one behind retention reads from the earliest kept). If what came back
//! is less than `min_bytes` and `max_wait_ms` allows, it asks again at the
//! new offsets: those fetches park at the owners until their partitions are
//! appended to, and the first answer with records (or the deadline) ends
//! the wait; whatever is still parked is cancelled. Records are rendered as
//! one Kafka batch per run of offsets ([`super::batch::write_batch`]).
//!
//! **Sizes.** A response's batches hold at most the request's `max_bytes`
//! (and half of `--kafka-request-size-max`), a partition's at most its
//! `partition_max_bytes`, counted in the bytes the client receives; the
//! rest of what an owner sent is not rendered, and the partition's next
//! Fetch starts at the first record left out. As in Kafka, the first
//! records of the response are returned even if they pass a cap, so a
//! consumer always progresses: spate's batches are made per response, so
//! that is its first record (one larger than the caps comes whole, alone).
//! Owners are asked for at most the sum of the caps of the partitions they
//! hold.
//!
//! The high watermark is the offset after the last record returned when
//! the owner read to the end, else one past it (so a client never takes a
//! budget cut for the end of the partition).

use std::time::Duration;

use bytes::Bytes;
use glommio::channels::local_channel;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse};

use super::{KafkaFace, codes};
use crate::partition::fetch::{FetchReply, FetchRequest as OwnerFetch, Position};
use crate::partition::records::{Entry, Run};
use crate::runtime::notify::{Either, first};
use crate::shard::Shard;
use crate::shard::subscriptions::DELETION_NOTICE_SLOTS;

/// One requested partition and what has been read for it.
struct Wanted {
    /// Global partition id, or `None` for an unknown topic or partition.
    partition: Option<u32>,
    stream_id: u32,
    offset: u64,
    error: i16,
    high_watermark: i64,
    records: Vec<u8>,
    /// The client's `partition_max_bytes` for it.
    partition_bytes_max: usize,
    /// A cap left some of its records out: it takes no more in this
    /// response, and `offset` is the first left out.
    full: bool,
}

/// What the records of a response may still take ([`take_reply`]).
struct ResponseBudget {
    bytes_max: usize,
    used_bytes: usize,
}

/// One request's registration with the shard (an inbox for owner replies);
/// dropping it cancels whatever is still parked at owners.
struct Registration<'a> {
    shard: &'a Shard,
    id: u64,
    inbox: local_channel::LocalReceiver<FetchReply>,
}

impl<'a> Registration<'a> {
    fn new(shard: &'a Shard, stream_id: u32, fetch_count: usize) -> Registration<'a> {
        let (sender, inbox) = local_channel::new_bounded(fetch_count + DELETION_NOTICE_SLOTS + 1);
        let id = shard.subscriptions().register(sender, stream_id);
        Registration { shard, id, inbox }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.shard.unregister_subscription(self.id);
    }
}

/// Sends one owner fetch per (stream, owner) for the wanted partitions
/// that still read; returns how many went out.
fn send_fetches(
    shard: &Shard,
    registration: &Registration<'_>,
    wanted: &[Wanted],
    first_round: bool,
    bytes_max: usize,
) -> usize {
    let mut requests: Vec<OwnerFetch> = Vec::new();
    let mut owners: Vec<(u32, u16)> = Vec::new();
    let reads = |want: &&Wanted| want.error == codes::NONE && !want.full && (first_round || want.records.is_empty());
    for want in wanted.iter().filter(reads) {
        let Some(partition) = want.partition else { continue };
        let owner = shard.owner_of(partition);
        let position = if first_round { Position::Requested(want.offset) } else { Position::At(want.offset) };
        let index = match owners.iter().position(|&key| key == (want.stream_id, owner)) {
            Some(index) => index,
            None => {
                owners.push((want.stream_id, owner));
                requests.push(OwnerFetch {
                    subscription_id: registration.id,
                    stream_id: want.stream_id,
                    cursors: Vec::new(),
                    bytes_max: 0,
                    window: None,
                });
                owners.len() - 1
            }
        };
        let request = &mut requests[index];
        request.cursors.push((partition, position));
        request.bytes_max = request.bytes_max.saturating_add(want.partition_bytes_max).min(bytes_max);
    }
    let count = requests.len();
    for ((_, owner), request) in owners.into_iter().zip(requests) {
        shard.send_fetch(owner, request);
    }
    count
}

/// Takes one owner reply into the wanted partitions: records rendered as
/// Kafka batches within the caps, new offsets, high watermarks, refusals.
fn take_reply(wanted: &mut [Wanted], reply: &FetchReply, budget: &mut ResponseBudget) {
    let find = |wanted: &mut [Wanted], partition: u32| -> Option<usize> {
        wanted.iter().position(|want| want.partition == Some(partition))
    };
    for entry in reply.records.entries() {
        if let Entry::Run(run) = entry
            && let Some(index) = find(wanted, run.partition)
        {
            render_run(&mut wanted[index], &run, budget);
        }
    }
    for &(partition, offset) in &reply.cursors {
        if let Some(index) = find(wanted, partition) {
            if !wanted[index].full {
                wanted[index].offset = offset;
            }
            wanted[index].high_watermark = offset as i64 + i64::from(reply.more);
        }
    }
    for &(partition, end) in &reply.out_of_range {
        if let Some(index) = find(wanted, partition) {
            wanted[index].error = codes::OFFSET_OUT_OF_RANGE;
            wanted[index].high_watermark = end as i64;
        }
    }
    for &partition in reply.deleted.iter().chain(&reply.moved) {
        if let Some(index) = find(wanted, partition) {
            wanted[index].error = codes::UNKNOWN_TOPIC_OR_PARTITION;
        }
    }
}

/// Renders as many records of `run` as the response's and the partition's
/// caps leave room for (the response's first record whatever its size);
/// marks the partition full when some are left out.
fn render_run(want: &mut Wanted, run: &Run<'_>, budget: &mut ResponseBudget) {
    if want.full {
        return;
    }
    let room = budget.bytes_max.saturating_sub(budget.used_bytes);
    let room = room.min(want.partition_bytes_max.saturating_sub(want.records.len()));
    let records = run.records().map(|(_, record)| record);
    let record_count = run.record_count as usize;
    // Counting each record's size costs about as much as writing it: only
    // when the whole run might not fit.
    let count = if super::batch::batch_size_bound(record_count, run.log_records.len()) <= room {
        record_count
    } else {
        super::batch::records_fitting(records.clone(), room, budget.used_bytes == 0)
    };
    if count > 0 {
        let before = want.records.len();
        super::batch::write_batch(&mut want.records, run.base_offset, records.take(count));
        budget.used_bytes += want.records.len() - before;
    }
    if count < record_count {
        want.full = true;
        want.offset = run.base_offset + count as u64;
    }
}

/// Waits for `count` replies (or, with `until_records`, for the first that
/// carries records), until `deadline`; `false` if the deadline came first.
async fn collect(
    registration: &Registration<'_>,
    wanted: &mut [Wanted],
    budget: &mut ResponseBudget,
    mut count: usize,
    until_records: bool,
    deadline: Duration,
) -> bool {
    let timer = glommio::timer::sleep(deadline);
    futures_lite::pin!(timer);
    while count > 0 {
        let reply = match first(registration.inbox.recv(), &mut timer).await {
            Either::Left(Some(reply)) => reply,
            Either::Left(None) | Either::Right(()) => return false,
        };
        count = count.saturating_sub(1);
        take_reply(wanted, &reply, budget);
        if until_records && !reply.records.is_empty() {
            return true;
        }
    }
    true
}

/// The wanted partitions of a Fetch request, in request order.
fn plan(shard: &Shard, request: &FetchRequest) -> Vec<Wanted> {
    let mut wanted = Vec::new();
    for topic in &request.topics {
        let route = shard.route_for(topic.topic.0.as_bytes());
        for partition in &topic.partitions {
            let known = route.filter(|route| (0..route.partitions as i64).contains(&i64::from(partition.partition)));
            wanted.push(Wanted {
                partition: known.map(|route| route.base + partition.partition as u32),
                stream_id: known.map_or(0, |route| route.id),
                offset: u64::try_from(partition.fetch_offset).unwrap_or(u64::MAX),
                error: if known.is_some() && partition.fetch_offset >= 0 {
                    codes::NONE
                } else if known.is_some() {
                    codes::OFFSET_OUT_OF_RANGE
                } else {
                    codes::UNKNOWN_TOPIC_OR_PARTITION
                },
                high_watermark: -1,
                records: Vec::new(),
                partition_bytes_max: usize::try_from(partition.partition_max_bytes).unwrap_or(0).max(1),
                full: false,
            });
        }
    }
    wanted
}

/// Fetch: see the module doc.
pub async fn fetch(shard: &Shard, face: &KafkaFace, request: FetchRequest) -> FetchResponse {
    let mut wanted = plan(shard, &request);
    let stream_id = wanted.iter().find(|want| want.partition.is_some()).map_or(0, |want| want.stream_id);
    let budget = usize::try_from(request.max_bytes).unwrap_or(0).clamp(1, face.request_size_max / 2);
    let max_wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0).min(60_000));
    let registration = Registration::new(shard, stream_id, 2 * wanted.len());
    let mut response = ResponseBudget { bytes_max: budget, used_bytes: 0 };
    let sent = send_fetches(shard, &registration, &wanted, true, budget);
    collect(&registration, &mut wanted, &mut response, sent, false, Duration::from_secs(30)).await;
    if response.used_bytes < usize::try_from(request.min_bytes).unwrap_or(0).max(1) && !max_wait.is_zero() {
        let sent = send_fetches(shard, &registration, &wanted, false, budget);
        collect(&registration, &mut wanted, &mut response, sent, true, max_wait).await;
    }
    drop(registration);
    respond(request, wanted)
}

fn respond(request: FetchRequest, wanted: Vec<Wanted>) -> FetchResponse {
    let mut wanted = wanted.into_iter();
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let Some(want) = wanted.next() else { break };
            let high_watermark = if want.high_watermark < 0 { want.offset as i64 } else { want.high_watermark };
            let data = PartitionData::default()
                .with_partition_index(partition.partition)
                .with_error_code(want.error)
                .with_high_watermark(high_watermark)
                .with_last_stable_offset(high_watermark)
                .with_log_start_offset(-1)
                .with_records(Some(Bytes::from(want.records)));
            partitions.push(data);
        }
        topics.push(FetchableTopicResponse::default().with_topic(topic.topic).with_partitions(partitions));
    }
    FetchResponse::default().with_responses(topics)
}

/// Asks the owner of `partition` once where `position` resolves to: the
/// first offset of what comes back (or the cursor, when nothing does).
async fn resolve(
    shard: &Shard,
    stream_id: u32,
    partition: u32,
    position: Position,
    bytes_max: usize,
) -> Option<FetchReply> {
    let registration = Registration::new(shard, stream_id, 1);
    let request = OwnerFetch {
        subscription_id: registration.id,
        stream_id,
        cursors: vec![(partition, position)],
        bytes_max,
        window: None,
    };
    shard.send_fetch(shard.owner_of(partition), request);
    let timer = glommio::timer::sleep(Duration::from_secs(30));
    match first(registration.inbox.recv(), timer).await {
        Either::Left(reply) => reply,
        Either::Right(()) => None,
    }
}

/// The first offset a reply's records start at.
fn first_offset(reply: &FetchReply) -> Option<u64> {
    reply.records.entries().find_map(|entry| match entry {
        Entry::Run(run) => Some(run.base_offset),
        Entry::Truncated { .. } => None,
    })
}

/// The offset ListOffsets answers for `timestamp` (-2 earliest, -1 latest,
/// else the first record whose timestamp is at least it, found by reading
/// the partition from its start: records carry no index by time). `None`
/// when the partition is gone; `(-1, -1)` when no record is that late.
async fn offset_for(shard: &Shard, stream_id: u32, partition: u32, timestamp: i64) -> Option<(i64, i64)> {
    match timestamp {
        -1 => {
            let reply = resolve(shard, stream_id, partition, Position::Latest, 1).await?;
            Some((-1, reply.cursors.first()?.1 as i64))
        }
        -2 => {
            let reply = resolve(shard, stream_id, partition, Position::Earliest, 1).await?;
            let offset = first_offset(&reply).or(reply.cursors.first().map(|cursor| cursor.1))?;
            Some((-1, offset as i64))
        }
        _ => scan_for_timestamp(shard, stream_id, partition, timestamp).await,
    }
}

async fn scan_for_timestamp(shard: &Shard, stream_id: u32, partition: u32, timestamp: i64) -> Option<(i64, i64)> {
    let mut position = Position::Earliest;
    loop {
        let reply = resolve(shard, stream_id, partition, position, 1 << 20).await?;
        for entry in reply.records.entries() {
            let Entry::Run(run) = entry else { continue };
            for (offset, record) in run.records() {
                let stamp = record.extended.map_or(-1, |extension| extension.timestamp_ms);
                if stamp >= timestamp {
                    return Some((stamp, offset as i64));
                }
            }
        }
        let next = reply.cursors.first()?.1;
        if reply.records.is_empty() || position == Position::At(next) {
            return Some((-1, -1));
        }
        position = Position::At(next);
    }
}

/// ListOffsets: earliest, latest, or by timestamp, per partition.
pub async fn list_offsets(shard: &Shard, request: ListOffsetsRequest) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let route = shard.route_for(topic.name.0.as_bytes());
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for wanted in topic.partitions {
            let mut response = ListOffsetsPartitionResponse::default().with_partition_index(wanted.partition_index);
            let known = route.filter(|route| (0..route.partitions as i64).contains(&i64::from(wanted.partition_index)));
            let found = match known {
                Some(route) => {
                    let partition = route.base + wanted.partition_index as u32;
                    offset_for(shard, route.id, partition, wanted.timestamp).await
                }
                None => None,
            };
            match found {
                Some((timestamp, offset)) => {
                    response.timestamp = timestamp;
                    response.offset = offset;
                }
                None => response.error_code = codes::UNKNOWN_TOPIC_OR_PARTITION,
            }
            partitions.push(response);
        }
        topics.push(ListOffsetsTopicResponse::default().with_name(topic.name).with_partitions(partitions));
    }
    ListOffsetsResponse::default().with_topics(topics)
}
