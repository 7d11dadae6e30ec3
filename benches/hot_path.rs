//! Micro-benchmarks of the hot pieces of the data path, in ns/event.
//!
//! Every bench processes a fixed set of realistic events per iteration (lines
//! `user<N> <64-byte payload>\n`, `N` drawn from 100k keys, filling 1 MiB) and
//! declares `Throughput::Elements(events)`, so criterion prints elem/s. The
//! time criterion prints is per iteration: **time/iter ÷ events/iter =
//! ns/event**. After the run, a summary table does that division for every
//! bench measured in this run and gives each as a multiple of the `memcpy`
//! baseline over the same 1 MiB, measured in the same process (STYLE.md:
//! benchmarks report ratios against a baseline).
//!
//! Groups, in data-path order:
//!
//! * `baseline`: `memcpy` and a `memchr` newline scan of the 1 MiB buffer.
//! * `ingest`: line split + parse through `LineBuffer`, key hash + placement
//!   lookup, `Router::try_push` with batches taken and credits granted back
//!   (steady state: the window never blocks), and all of them in one loop.
//! * `owner`: `PartitionLog::append` of records decoded from 64 KiB batches
//!   with `BatchIter`, retention active (8 MiB retention, 1 MiB segments), into
//!   one log and into the 128 partitions one of two shards owns; `_grouped`:
//!   the same in the order `apply_batch` applies a large batch (grouped by
//!   partition, `RecordOrder`, the grouping included).
//! * `subscribe`: a full log read in 256 KiB fetches, as a subscriber gets
//!   it: `read_lines` copies each fetch's records out of the log
//!   (`partition::fetch::copy_records`, the owner's side) and renders them
//!   as subscriber lines (`subscribe::render::LineRenderer`, the face's
//!   side); `copy_records` and `render_lines` time each side alone.
//!
//! Benches whose name ends in a qualifier (`_only`, `_one_pass`,
//! `_fresh_buffers`, `_cache_sized`, `_inline`, `_fresh_vec`) are diagnostics
//! that isolate one cost of the bench next to them. The machine is shared and
//! small, so read ratios within one run rather than absolute numbers across
//! runs. Setup builds ~1 GiB of partition logs even when a filter skips the
//! `owner` group. Run with `cargo bench --bench hot_path`; a filter such as
//! `cargo bench --bench hot_path -- owner` runs one group and the summary
//! lists only what ran.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use spate::config::{
    CREDIT_WINDOW_BATCHES_MIN, CREDIT_WINDOW_BYTES_MEMORY, KIB, MIB, RETENTION_BYTES_MEMORY_DEFAULT,
    SEGMENT_BYTES_MEMORY_DEFAULT,
};
use spate::partition::apply::RecordOrder;
use spate::partition::fetch::copy_records;
use spate::partition::records::FetchedRecords;
use spate::partition::{Partition, PartitionLog, PartitionManager, PlacementTable};
use spate::protocol::{BatchIter, Line, LineBuffer, Next, RecordRef, encode_batch_record, parse_line, partition_of};
use spate::routing::{CreditGrant, DataBatch, Router, route};
use spate::stream::StreamRoute;
use spate::subscribe::render::LineRenderer;

/// Size of the line buffer every bench's events come from.
const INPUT_BYTES: usize = MIB;
/// Distinct keys (`user0` .. `user99999`).
const KEY_COUNT: u64 = 100_000;
/// Payload bytes per event.
const PAYLOAD_BYTES: usize = 64;
/// Seed of the event generator, so every run benches the same bytes.
const SEED: u64 = 0x5EED_F00D_5BA7;

/// The server defaults (`spate serve`'s flags with `--storage memory`,
/// src/config/) the benches run with.
const PARTITION_COUNT: u32 = 256;
const SHARD_COUNT: u16 = 2;
const LINE_SIZE_MAX: usize = MIB;
const READ_BUFFER_INITIAL_BYTES: usize = 4 * KIB;
const READ_BUFFER_BYTES: usize = 256 * KIB;
const BATCH_BYTES: usize = 64 * KIB;
const CREDIT_WINDOW_BYTES: usize = CREDIT_WINDOW_BYTES_MEMORY;
const CREDIT_WINDOW_BATCHES: usize = CREDIT_WINDOW_BATCHES_MIN;
const RETENTION_BYTES: usize = RETENTION_BYTES_MEMORY_DEFAULT;
const SEGMENT_BYTES: usize = SEGMENT_BYTES_MEMORY_DEFAULT;
const FETCH_BYTES_MAX: usize = 256 * KIB;

/// Half-life of a partition's rate averages (the balancer default). Rates are
/// sampled on a timer, not per event, so it does not change what is measured.
const RATE_HALF_LIFE_MS: u64 = 500;

/// The shard whose owner-side work the `owner` group measures.
const OWNER_SHARD: u16 = 0;

/// `(group, bench, events per iteration)` of every bench defined, for the summary.
static BENCHES: Mutex<Vec<(String, String, u64)>> = Mutex::new(Vec::new());
/// Facts about the code under test found while setting up, printed with the summary.
static NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn note(text: String) {
    NOTES.lock().expect("notes lock").push(text);
}

/// SplitMix64: a tiny deterministic generator, so the input needs no RNG crate API.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// One event of the input, as offsets into it.
#[derive(Clone, Copy)]
struct EventSpan {
    key_start: usize,
    key_end: usize,
    payload_end: usize,
}

/// The shared input: 1 MiB of whole lines and where each event lies in it.
struct Input {
    bytes: Vec<u8>,
    spans: Vec<EventSpan>,
}

impl Input {
    fn generate() -> Input {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut random = SplitMix64(SEED);
        let mut bytes = Vec::with_capacity(INPUT_BYTES);
        let mut spans = Vec::new();
        let mut line = Vec::with_capacity(128);
        loop {
            line.clear();
            line.extend_from_slice(b"user");
            line.extend_from_slice(itoa::Buffer::new().format(random.next() % KEY_COUNT).as_bytes());
            let key_size = line.len();
            line.push(b' ');
            line.extend((0..PAYLOAD_BYTES).map(|_| ALPHABET[(random.next() % 64) as usize]));
            line.push(b'\n');
            if bytes.len() + line.len() > INPUT_BYTES {
                break;
            }
            let key_start = bytes.len();
            spans.push(EventSpan { key_start, key_end: key_start + key_size, payload_end: key_start + line.len() - 1 });
            bytes.extend_from_slice(&line);
        }
        Input { bytes, spans }
    }

    fn event_count(&self) -> u64 {
        self.spans.len() as u64
    }

    fn key(&self, span: EventSpan) -> &[u8] {
        &self.bytes[span.key_start..span.key_end]
    }

    fn payload(&self, span: EventSpan) -> &[u8] {
        &self.bytes[span.key_end + 1..span.payload_end]
    }
}

/// Registers a bench for the summary and sets its throughput.
fn throughput(group: &mut BenchmarkGroup<'_, WallTime>, group_name: &str, bench_name: &str, events: u64) {
    BENCHES.lock().expect("benches lock").push((group_name.to_string(), bench_name.to_string(), events));
    group.throughput(Throughput::Elements(events));
}

fn bench_baseline(criterion: &mut Criterion, input: &Input) {
    let mut group = criterion.benchmark_group("baseline");
    let events = input.event_count();

    throughput(&mut group, "baseline", "memcpy", events);
    let mut copy = vec![0u8; input.bytes.len()];
    group.bench_function("memcpy", |bencher| {
        bencher.iter(|| {
            copy.copy_from_slice(black_box(&input.bytes));
            black_box(&mut copy);
        })
    });

    throughput(&mut group, "baseline", "memchr_newlines", events);
    group.bench_function("memchr_newlines", |bencher| {
        bencher.iter(|| {
            let count = memchr::memchr_iter(b'\n', black_box(&input.bytes)).count();
            assert_eq!(count as u64, events);
            count
        })
    });
    group.finish();
}

/// Feeds `input` through `lines` in socket-read-sized copies and parses every
/// line, as `ingest::serve_connection` does; returns (events, key+payload bytes).
fn split_and_parse(lines: &mut LineBuffer, input: &[u8]) -> (u64, usize) {
    let (mut event_count, mut byte_count) = (0u64, 0usize);
    let mut rest = input;
    loop {
        loop {
            match lines.next_line() {
                Next::Line { line, .. } => match parse_line(line, LINE_SIZE_MAX) {
                    Ok(Line::Event { key, payload }) => {
                        event_count += 1;
                        byte_count += key.len() + payload.len();
                    }
                    other => panic!("input has only events: {other:?}"),
                },
                Next::TooLong { line_number, .. } => panic!("line {line_number} too long"),
                Next::NeedMore => break,
            }
        }
        if rest.is_empty() {
            return (event_count, byte_count);
        }
        let spare = lines.spare();
        let count = spare.len().min(rest.len());
        spare[..count].copy_from_slice(&rest[..count]);
        lines.filled(count);
        rest = &rest[count..];
    }
}

/// [`split_and_parse`] without `parse_line`: the line splitter's share.
fn split_only(lines: &mut LineBuffer, input: &[u8]) -> (u64, usize) {
    let (mut line_count, mut byte_count) = (0u64, 0usize);
    let mut rest = input;
    loop {
        while let Next::Line { line, .. } = lines.next_line() {
            line_count += 1;
            byte_count += line.len();
        }
        if rest.is_empty() {
            return (line_count, byte_count);
        }
        let spare = lines.spare();
        let count = spare.len().min(rest.len());
        spare[..count].copy_from_slice(&rest[..count]);
        lines.filled(count);
        rest = &rest[count..];
    }
}

/// What [`split_and_parse`] would cost with one `memchr_iter` pass over the
/// bytes instead of one `memchr` call per line (no buffer, no copy).
fn parse_one_pass(input: &[u8]) -> (u64, usize) {
    let (mut event_count, mut byte_count) = (0u64, 0usize);
    let mut line_start = 0;
    for newline in memchr::memchr_iter(b'\n', input) {
        let Ok(Line::Event { key, payload }) = parse_line(&input[line_start..newline], LINE_SIZE_MAX) else {
            panic!("only events")
        };
        event_count += 1;
        byte_count += key.len() + payload.len();
        line_start = newline + 1;
    }
    (event_count, byte_count)
}

/// Pushes one event, taking a full batch and granting its credits straight back.
#[inline]
fn push_and_recycle(router: &mut Router, owner: u16, partition: u32, key: &[u8], payload: &[u8], recycle: bool) {
    match router.try_push(owner, partition, key, payload) {
        Ok(false) => {}
        Ok(true) => {
            let batch = router.take_batch(owner).expect("a batch slot is free: every batch is granted at once");
            grant_back(router, owner, batch, recycle);
        }
        Err(blocked) => panic!("window blocked in steady state: {blocked:?}"),
    }
}

fn grant_back(router: &mut Router, owner: u16, batch: DataBatch, recycle: bool) {
    let credit_bytes = batch.bytes.len();
    let recycled = if recycle { batch.bytes } else { Vec::new() };
    let grant = CreditGrant {
        sequence: batch.sequence,
        batch_count: 1,
        credit_bytes,
        recycled,
        more_recycled: Vec::new(),
        sync: false,
        grant_now: false,
        offset_asks: None,
    };
    router.grant(owner, grant);
}

fn new_router() -> Router {
    Router::new(usize::from(SHARD_COUNT), BATCH_BYTES, CREDIT_WINDOW_BYTES, CREDIT_WINDOW_BATCHES)
}

/// Records how big a batch buffer really is once `try_push` reports it full.
fn note_batch_capacity(input: &Input, placement: &PlacementTable) {
    let mut router = new_router();
    for &span in &input.spans {
        let (key, payload) = (input.key(span), input.payload(span));
        let partition = partition_of(key, PARTITION_COUNT);
        let owner = placement.owner(partition);
        if router.try_push(owner, partition, key, payload) == Ok(true) {
            let batch = router.take_batch(owner).expect("slot");
            note(format!(
                "router: a full batch holds {} bytes in a buffer of capacity {} (batch_bytes {BATCH_BYTES}): \
                 the record that crosses batch_bytes reallocates the fresh Vec::with_capacity(batch_bytes)",
                batch.bytes.len(),
                batch.bytes.capacity()
            ));
            return;
        }
    }
}

fn bench_ingest(criterion: &mut Criterion, input: &Input) {
    let mut group = criterion.benchmark_group("ingest");
    let events = input.event_count();
    let placement = PlacementTable::spread(PARTITION_COUNT, SHARD_COUNT);
    // The partition count is configuration at run time: keep `%` a real division.
    let partition_count = black_box(PARTITION_COUNT);

    throughput(&mut group, "ingest", "line_split_parse", events);
    let mut lines = LineBuffer::new(READ_BUFFER_INITIAL_BYTES, READ_BUFFER_BYTES, LINE_SIZE_MAX);
    group.bench_function("line_split_parse", |bencher| {
        bencher.iter(|| {
            let (event_count, byte_count) = split_and_parse(&mut lines, black_box(&input.bytes));
            assert_eq!(event_count, events);
            byte_count
        })
    });

    throughput(&mut group, "ingest", "line_split_only", events);
    let mut lines = LineBuffer::new(READ_BUFFER_INITIAL_BYTES, READ_BUFFER_BYTES, LINE_SIZE_MAX);
    group.bench_function("line_split_only", |bencher| {
        bencher.iter(|| {
            let (line_count, byte_count) = split_only(&mut lines, black_box(&input.bytes));
            assert_eq!(line_count, events);
            byte_count
        })
    });

    throughput(&mut group, "ingest", "line_parse_one_pass", events);
    group.bench_function("line_parse_one_pass", |bencher| {
        bencher.iter(|| {
            let (event_count, byte_count) = parse_one_pass(black_box(&input.bytes));
            assert_eq!(event_count, events);
            byte_count
        })
    });

    let keys: Vec<&[u8]> = input.spans.iter().map(|&span| input.key(span)).collect();
    throughput(&mut group, "ingest", "key_hash_only", events);
    group.bench_function("key_hash_only", |bencher| {
        bencher.iter(|| keys.iter().fold(0u64, |sum, key| sum.wrapping_add(spate::protocol::key_hash(key))))
    });

    throughput(&mut group, "ingest", "hash_route", events);
    group.bench_function("hash_route", |bencher| {
        bencher.iter(|| {
            keys.iter().fold(0u64, |sum, key| {
                let partition = partition_of(key, partition_count);
                sum + u64::from(placement.owner(partition)) + u64::from(partition)
            })
        })
    });

    note_batch_capacity(input, &placement);
    let routed: Vec<(u16, u32, &[u8], &[u8])> = input
        .spans
        .iter()
        .map(|&span| {
            let partition = partition_of(input.key(span), PARTITION_COUNT);
            (placement.owner(partition), partition, input.key(span), input.payload(span))
        })
        .collect();
    for (name, recycle) in [("router_push", true), ("router_push_fresh_buffers", false)] {
        throughput(&mut group, "ingest", name, events);
        let mut router = new_router();
        group.bench_function(name, |bencher| {
            bencher.iter(|| {
                for &(owner, partition, key, payload) in black_box(&routed) {
                    push_and_recycle(&mut router, owner, partition, key, payload, recycle);
                }
            })
        });
    }

    throughput(&mut group, "ingest", "source_path_total", events);
    let mut lines = LineBuffer::new(READ_BUFFER_INITIAL_BYTES, READ_BUFFER_BYTES, LINE_SIZE_MAX);
    let mut router = new_router();
    group.bench_function("source_path_total", |bencher| {
        bencher.iter(|| source_path(&mut lines, &mut router, &placement, partition_count, black_box(&input.bytes)))
    });
    group.finish();
}

/// `ingest::process_buffered` without the shard: read, split, parse, then
/// `spate::route` (hash, place, batch, credits) as every ingest format does;
/// returns the events pushed.
fn source_path(
    lines: &mut LineBuffer,
    router: &mut Router,
    placement: &PlacementTable,
    partition_count: u32,
    input: &[u8],
) -> u64 {
    let mut event_count = 0u64;
    let mut rest = input;
    let mut taken: Vec<(u16, DataBatch)> = Vec::with_capacity(2);
    loop {
        while let Next::Line { line, .. } = lines.next_line() {
            let Ok(Line::Event { key, payload }) = parse_line(line, LINE_SIZE_MAX) else { panic!("only events") };
            let stream = StreamRoute { id: 0, base: 0, partitions: partition_count, partitioner: Default::default() };
            let routed = route(placement, router, stream, (key, payload, 0), |owner, batch| {
                taken.push((owner, batch));
            });
            assert!(routed.is_ok(), "window blocked in steady state");
            for (owner, batch) in taken.drain(..) {
                grant_back(router, owner, batch, true);
            }
            event_count += 1;
        }
        if rest.is_empty() {
            return event_count;
        }
        let spare = lines.spare();
        let count = spare.len().min(rest.len());
        spare[..count].copy_from_slice(&rest[..count]);
        lines.filled(count);
        rest = &rest[count..];
    }
}

/// The batches one source sends `owner` for the input, cut at `BATCH_BYTES`
/// as the router cuts them, and the events they hold.
fn batches_for(input: &Input, placement: &PlacementTable, owner: Option<u16>) -> (Vec<Vec<u8>>, u64) {
    let mut batches = vec![Vec::with_capacity(2 * BATCH_BYTES)];
    let mut event_count = 0u64;
    for &span in &input.spans {
        let (key, payload) = (input.key(span), input.payload(span));
        let partition = partition_of(key, PARTITION_COUNT);
        if owner.is_some_and(|owner| placement.owner(partition) != owner) {
            continue;
        }
        let batch = batches.last_mut().expect("one open batch");
        encode_batch_record(batch, partition, key, payload);
        event_count += 1;
        if batch.len() >= BATCH_BYTES {
            batches.push(Vec::with_capacity(2 * BATCH_BYTES));
        }
    }
    (batches, event_count)
}

/// Appends every batch record to one log, ignoring the partition.
fn append_all(log: &mut PartitionLog, batches: &[Vec<u8>]) -> u64 {
    let mut last_offset = 0;
    for batch in batches {
        for (_, record) in BatchIter::new(batch) {
            last_offset = log.append(record.log_record);
        }
    }
    last_offset
}

/// `Shard::apply_batch` without the shard: every record to its partition.
fn apply_all(partitions: &mut PartitionManager, batches: &[Vec<u8>]) -> u64 {
    let mut stored = 0;
    for batch in batches {
        for (partition_id, record) in BatchIter::new(batch) {
            stored += apply_one(partitions, partition_id, &record);
        }
    }
    stored
}

/// `apply_all` in the order `apply_batch` applies a large batch: grouped by
/// partition (`RecordOrder`), batch order within a partition.
fn apply_all_grouped(partitions: &mut PartitionManager, batches: &[Vec<u8>], order: &mut RecordOrder) -> u64 {
    let mut stored = 0;
    for batch in batches {
        for &position in order.group(batch) {
            let (partition_id, record) = BatchIter::new(&batch[position as usize..]).next().expect("a record");
            stored += apply_one(partitions, partition_id, &record);
        }
    }
    stored
}

/// Appends one record to its (owned) partition and counts it; returns 1.
#[inline]
fn apply_one(partitions: &mut PartitionManager, partition_id: u32, record: &RecordRef<'_>) -> u64 {
    let partition = partitions.get_mut(partition_id).expect("batch holds owned partitions only");
    partition.log.append(record.log_record);
    partition.events_total += 1;
    partition.bytes_total += record.payload.len() as u64;
    1
}

/// A log already past its retention, so every bench iteration runs the
/// steady state: segments roll and reuse the dropped ones.
fn full_log(batches: &[Vec<u8>]) -> PartitionLog {
    let mut log = PartitionLog::in_memory(RETENTION_BYTES, SEGMENT_BYTES);
    while log.earliest_offset() == 0 || log.next_offset() < 2 * log.earliest_offset() {
        append_all(&mut log, batches);
    }
    log
}

fn bench_owner(criterion: &mut Criterion, input: &Input) {
    let mut group = criterion.benchmark_group("owner");
    let placement = PlacementTable::spread(PARTITION_COUNT, SHARD_COUNT);

    let (all_batches, all_events) = batches_for(input, &placement, None);
    throughput(&mut group, "owner", "log_append", all_events);
    let mut log = full_log(&all_batches);
    group.bench_function("log_append", |bencher| bencher.iter(|| append_all(&mut log, black_box(&all_batches))));
    drop(log);

    // The 128 partitions shard 0 of 2 owns, each with the full default
    // retention: 128 * 8 MiB = 1 GiB resident while this bench runs. Two
    // diagnostics beside it: all logs shrunk to fit the L3 cache (128 *
    // 128 KiB = 16 MiB), and the logs held inline in one `Vec` rather than
    // behind `PartitionManager`'s `Option<Box<Partition>>`.
    let (owned_batches, owned_events) = batches_for(input, &placement, Some(OWNER_SHARD));
    let variants = [
        ("apply_128_partitions", RETENTION_BYTES, SEGMENT_BYTES),
        ("apply_128_partitions_cache_sized", 128 * KIB, 64 * KIB),
    ];
    for (name, retention_bytes, segment_bytes) in variants {
        throughput(&mut group, "owner", name, owned_events);
        let mut partitions = owned_partitions(&placement, retention_bytes, segment_bytes);
        while partitions.iter().any(|(_, partition)| partition.log.earliest_offset() == 0) {
            apply_all(&mut partitions, &owned_batches);
        }
        group.bench_function(name, |bencher| bencher.iter(|| apply_all(&mut partitions, black_box(&owned_batches))));
        let mut order = RecordOrder::default();
        throughput(&mut group, "owner", &format!("{name}_grouped"), owned_events);
        group.bench_function(format!("{name}_grouped"), |bencher| {
            bencher.iter(|| apply_all_grouped(&mut partitions, black_box(&owned_batches), &mut order))
        });
    }

    throughput(&mut group, "owner", "apply_128_logs_inline", owned_events);
    let mut logs: Vec<PartitionLog> =
        (0..PARTITION_COUNT).map(|_| PartitionLog::in_memory(RETENTION_BYTES, SEGMENT_BYTES)).collect();
    while logs.iter().step_by(usize::from(SHARD_COUNT)).any(|log| log.earliest_offset() == 0) {
        append_by_partition(&mut logs, &owned_batches);
    }
    group.bench_function("apply_128_logs_inline", |bencher| {
        bencher.iter(|| append_by_partition(&mut logs, black_box(&owned_batches)))
    });
    drop(logs);
    group.finish();
}

/// Every record to its partition's log, the logs inline in one `Vec`.
fn append_by_partition(logs: &mut [PartitionLog], batches: &[Vec<u8>]) -> u64 {
    let mut stored = 0;
    for batch in batches {
        for (partition_id, record) in BatchIter::new(batch) {
            logs[partition_id as usize].append(record.log_record);
            stored += 1;
        }
    }
    stored
}

/// The partitions `OWNER_SHARD` owns, with empty logs.
fn owned_partitions(placement: &PlacementTable, retention_bytes: usize, segment_bytes: usize) -> PartitionManager {
    let mut partitions = PartitionManager::new(PARTITION_COUNT);
    for (partition, _) in placement.iter().filter(|(_, placement)| placement.owner == OWNER_SHARD) {
        let log = PartitionLog::in_memory(retention_bytes, segment_bytes);
        partitions.install(partition, Box::new(Partition::new(log, RATE_HALF_LIFE_MS)));
    }
    partitions
}

/// What one pass over the log does with each fetch's records.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Copy into a fresh reply buffer (as every `FetchReply` starts), then
    /// render into the session's reused line buffer.
    FreshReply,
    /// The same with one reply buffer reused.
    ReusedReply,
    /// Copy only (the owner's side), the reply buffer reused.
    OwnerOnly,
}

/// Reads the whole log in `FETCH_BYTES_MAX` fetches, as `serve_fetch` does
/// for one cursor, and renders each as the subscriber's session does.
fn read_all(log: &PartitionLog, lines: &mut Vec<u8>, pass: Pass) -> u64 {
    let mut offset = log.earliest_offset();
    let mut event_count = 0;
    let mut records = FetchedRecords::default();
    while offset < log.next_offset() {
        if pass == Pass::FreshReply {
            records = FetchedRecords::default();
        } else {
            records.clear();
        }
        offset = copy_records(&mut records, 7, log, offset, FETCH_BYTES_MAX);
        event_count += records.record_count();
        if pass != Pass::OwnerOnly {
            render_all(&records, lines);
        }
        black_box(&mut records);
    }
    event_count
}

/// Renders records as the session does, in chunks of `FETCH_BYTES_MAX`.
fn render_all(records: &FetchedRecords, lines: &mut Vec<u8>) {
    let mut renderer = LineRenderer::new(records, 0);
    while !renderer.render(lines, FETCH_BYTES_MAX) {
        black_box(&mut *lines);
        lines.clear();
    }
    black_box(&mut *lines);
    lines.clear();
}

fn bench_subscribe(criterion: &mut Criterion, input: &Input) {
    let mut group = criterion.benchmark_group("subscribe");
    let placement = PlacementTable::spread(PARTITION_COUNT, SHARD_COUNT);
    let (batches, _) = batches_for(input, &placement, None);
    let log = full_log(&batches);
    let events = log.next_offset() - log.earliest_offset();
    let mut lines = Vec::with_capacity(2 * FETCH_BYTES_MAX);
    let passes = [
        ("read_lines", Pass::ReusedReply),
        ("read_lines_fresh_vec", Pass::FreshReply),
        ("copy_records", Pass::OwnerOnly),
    ];
    for (name, pass) in passes {
        throughput(&mut group, "subscribe", name, events);
        group.bench_function(name, |bencher| {
            bencher.iter(|| {
                let event_count = read_all(&log, &mut lines, pass);
                assert_eq!(event_count, events);
            })
        });
    }
    // The face alone: the log's records copied once, in fetch-sized replies.
    let mut replies = Vec::new();
    let mut offset = log.earliest_offset();
    while offset < log.next_offset() {
        let mut records = FetchedRecords::default();
        offset = copy_records(&mut records, 7, &log, offset, FETCH_BYTES_MAX);
        replies.push(records);
    }
    throughput(&mut group, "subscribe", "render_lines", events);
    group.bench_function("render_lines", |bencher| {
        bencher.iter(|| {
            for records in &replies {
                render_all(records, &mut lines);
            }
        })
    });
    group.finish();
}

/// Where criterion writes its estimates: `$CRITERION_HOME`, else
/// `<target>/criterion`, where this binary is `<target>/<profile>/deps/<name>`.
fn criterion_home() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return Some(PathBuf::from(home));
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(target).join("criterion"));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.parent()?.parent()?.join("criterion"))
}

/// Criterion's headline time per iteration, in ns (the slope when it has one,
/// as it prints), if this run wrote it.
fn measured_ns_per_iter(home: &std::path::Path, group: &str, bench: &str, started: SystemTime) -> Option<f64> {
    let path = home.join(group).join(bench).join("new").join("estimates.json");
    let modified = std::fs::metadata(&path).ok()?.modified().ok()?;
    if modified < started {
        return None;
    }
    let estimates: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).ok()?).ok()?;
    let estimate = match &estimates["slope"] {
        serde_json::Value::Null => &estimates["mean"],
        slope => slope,
    };
    estimate["point_estimate"].as_f64()
}

fn print_summary(started: SystemTime) {
    let Some(home) = criterion_home() else { return };
    let benches = BENCHES.lock().expect("benches lock").clone();
    let rows: Vec<(String, u64, f64)> = benches
        .iter()
        .filter_map(|(group, bench, events)| {
            let ns_per_iter = measured_ns_per_iter(&home, group, bench, started)?;
            Some((format!("{group}/{bench}"), *events, ns_per_iter / *events as f64))
        })
        .collect();
    if rows.is_empty() {
        return;
    }
    let memcpy = rows.iter().find(|(name, _, _)| name == "baseline/memcpy").map(|row| row.2);
    println!();
    println!("ns/event = criterion time/iter / events/iter; ratio = ns/event / baseline/memcpy ns/event");
    println!("{:<36} {:>12} {:>10} {:>10}", "bench", "events/iter", "ns/event", "x memcpy");
    for (name, events, ns_per_event) in &rows {
        let ratio = memcpy.map_or_else(|| "-".to_string(), |memcpy| format!("{:.1}", ns_per_event / memcpy));
        println!("{name:<36} {events:>12} {ns_per_event:>10.2} {ratio:>10}");
    }
    for text in NOTES.lock().expect("notes lock").iter() {
        println!("note: {text}");
    }
}

fn main() {
    let started = SystemTime::now();
    let input = Input::generate();
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .nresamples(20_000)
        .configure_from_args();
    bench_baseline(&mut criterion, &input);
    bench_ingest(&mut criterion, &input);
    bench_owner(&mut criterion, &input);
    bench_subscribe(&mut criterion, &input);
    criterion.final_summary();
    print_summary(started);
}
