//! The Kafka face against the Python clients people run: confluent-kafka
//! (librdkafka) and kafka-python, both from PyPI (`scripts/test` installs
//! them; without them these tests fail saying so). Idempotent producers
//! store a retried batch once; keyed producers with `acks=all` keep every
//! acknowledged record, with its headers and timestamp, across kill -9.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Server;

/// Runs a Python script with `args` after it; returns its stdout.
fn python(script: &str, args: &[&str]) -> String {
    let output =
        Command::new("python3").arg("-c").arg(script).args(args).stdin(Stdio::null()).output().expect("python3 runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python failed (pip install kafka-python confluent-kafka: scripts/test does): {stderr}"
    );
    String::from_utf8(output.stdout).unwrap()
}

// ---------------------------------------------------------------------------
// Raw requests, encoded by hand so the test depends on no codec of spate's.

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as i16).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_varint(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// A v2 record batch of `values` (key "k"), from `producer_id` at `epoch`,
/// first sequence `sequence`.
fn record_batch(producer_id: i64, epoch: i16, sequence: i32, values: &[&str]) -> Vec<u8> {
    let mut records = Vec::new();
    for (index, value) in values.iter().enumerate() {
        put_record(&mut records, index, value);
    }
    sealed_batch(producer_id, epoch, sequence, values.len(), &records)
}

/// Appends one record (key "k", `value`, no headers) at `offset_delta`.
fn put_record(records: &mut Vec<u8>, offset_delta: usize, value: &str) {
    let mut record = vec![0u8]; // attributes
    put_varint(&mut record, 0); // timestamp delta
    put_varint(&mut record, offset_delta as i64);
    put_varint(&mut record, 1);
    record.push(b'k');
    put_varint(&mut record, value.len() as i64);
    record.extend_from_slice(value.as_bytes());
    put_varint(&mut record, 0); // headers
    put_varint(records, record.len() as i64);
    records.extend_from_slice(&record);
}

/// A v2 batch header with a valid CRC around `records` (whatever they
/// hold), which it says are `record_count`.
fn sealed_batch(producer_id: i64, epoch: i16, sequence: i32, record_count: usize, records: &[u8]) -> Vec<u8> {
    let mut after_crc = Vec::new();
    after_crc.extend_from_slice(&0i16.to_be_bytes());
    after_crc.extend_from_slice(&(record_count as i32 - 1).to_be_bytes());
    after_crc.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    after_crc.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    after_crc.extend_from_slice(&producer_id.to_be_bytes());
    after_crc.extend_from_slice(&epoch.to_be_bytes());
    after_crc.extend_from_slice(&sequence.to_be_bytes());
    after_crc.extend_from_slice(&(record_count as i32).to_be_bytes());
    after_crc.extend_from_slice(records);
    let mut batch = Vec::new();
    batch.extend_from_slice(&0i64.to_be_bytes());
    batch.extend_from_slice(&((after_crc.len() + 9) as i32).to_be_bytes());
    batch.extend_from_slice(&(-1i32).to_be_bytes());
    batch.push(2);
    batch.extend_from_slice(&crc32c::crc32c(&after_crc).to_be_bytes());
    batch.extend_from_slice(&after_crc);
    batch
}

/// Sends one request (header v1) and returns the response after its
/// correlation id.
fn exchange(stream: &mut TcpStream, api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    stream.write_all(&request_frame(api_key, version, 7, body)).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("an answer");
    let mut response = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut response).unwrap();
    response[4..].to_vec()
}

/// A request frame (size prefix included): the v1 header (client id "raw"), then `body`.
fn request_frame(api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
    let mut request = Vec::new();
    request.extend_from_slice(&api_key.to_be_bytes());
    request.extend_from_slice(&version.to_be_bytes());
    request.extend_from_slice(&correlation_id.to_be_bytes());
    put_string(&mut request, "raw");
    request.extend_from_slice(body);
    let mut frame = (request.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&request);
    frame
}

/// A Produce v3 body: `batch` to partition 0 of `topic`, no transactional id.
fn produce_body(topic: &str, acks: i16, batch: &[u8]) -> Vec<u8> {
    let mut body = (-1i16).to_be_bytes().to_vec(); // no transactional id
    body.extend_from_slice(&acks.to_be_bytes());
    body.extend_from_slice(&30_000i32.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    put_string(&mut body, topic);
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&0i32.to_be_bytes());
    body.extend_from_slice(&(batch.len() as i32).to_be_bytes());
    body.extend_from_slice(batch);
    body
}

/// InitProducerId v0; the producer id and epoch.
fn init_producer_id(stream: &mut TcpStream) -> (i64, i16) {
    let mut body = (-1i16).to_be_bytes().to_vec();
    body.extend_from_slice(&60_000i32.to_be_bytes());
    let response = exchange(stream, 22, 0, &body);
    assert_eq!(&response[4..6], &[0, 0], "no error");
    let id = i64::from_be_bytes(response[6..14].try_into().unwrap());
    let epoch = i16::from_be_bytes(response[14..16].try_into().unwrap());
    (id, epoch)
}

/// Produce v3 of `batch` to partition 0 of `topic` with acks=all; the
/// partition's error code.
fn produce(stream: &mut TcpStream, topic: &str, batch: &[u8]) -> i16 {
    let response = exchange(stream, 0, 3, &produce_body(topic, -1, batch));
    // topics (4), name (2 + len), partitions (4), index (4), error code.
    let at = 4 + 2 + topic.len() + 4 + 4;
    i16::from_be_bytes([response[at], response[at + 1]])
}

/// An idempotent producer's batch sent twice, on two connections (as a
/// client retrying after a lost answer does), is stored once and both
/// answers are success; a retry older than the last five batches gets
/// DUPLICATE_SEQUENCE_NUMBER, a gap OUT_OF_ORDER_SEQUENCE_NUMBER, an old
/// epoch INVALID_PRODUCER_EPOCH, and none of them stores anything.
#[test]
fn an_idempotent_producers_retries_are_stored_once() {
    let server = Server::start(&["--shards", "2", "--partitions", "1", "--storage", "memory"]);
    let connect = || {
        let stream = TcpStream::connect(server.ingest_kafka).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        stream
    };
    let (mut first, mut second) = (connect(), connect());
    let (producer_id, epoch) = init_producer_id(&mut first);
    assert!(producer_id > 0 && epoch == 0, "{producer_id} {epoch}");
    let (other_id, _) = init_producer_id(&mut second);
    assert_ne!(other_id, producer_id, "ids are unique");
    let batch = record_batch(producer_id, 0, 0, &["a", "b", "c"]);
    assert_eq!(produce(&mut first, "default", &batch), 0);
    assert_eq!(produce(&mut second, "default", &batch), 0, "a retry is answered with success");
    assert_eq!(server.stream_end("default"), 3, "and stored once");
    for sequence in (3..18).step_by(3) {
        let next = record_batch(producer_id, 0, sequence, &["d", "e", "f"]);
        assert_eq!(produce(&mut second, "default", &next), 0);
    }
    assert_eq!(server.stream_end("default"), 18);
    assert_eq!(produce(&mut first, "default", &batch), 46, "DUPLICATE_SEQUENCE_NUMBER");
    let gap = record_batch(producer_id, 0, 19, &["g"]);
    assert_eq!(produce(&mut first, "default", &gap), 45, "OUT_OF_ORDER_SEQUENCE_NUMBER");
    let bumped = record_batch(producer_id, 1, 0, &["h"]);
    assert_eq!(produce(&mut first, "default", &bumped), 0, "a new epoch starts at 0");
    let stale = record_batch(producer_id, 0, 18, &["i"]);
    assert_eq!(produce(&mut first, "default", &stale), 47, "INVALID_PRODUCER_EPOCH");
    let plain = record_batch(-1, -1, -1, &["j"]);
    assert_eq!(produce(&mut first, "default", &plain), 0);
    assert_eq!(produce(&mut first, "default", &plain), 0);
    assert_eq!(server.stream_end("default"), 21, "18, the new epoch's one, and two plain copies");
    assert!(server.metric("spate_kafka_duplicate_batches_total") >= 1.0);
}

/// confluent-kafka: an idempotent, keyed producer with acks=all, sending
/// headers and explicit timestamps, printing what was acknowledged.
const CONFLUENT_PRODUCE: &str = r#"
import json, sys
from confluent_kafka import Producer
broker, topic, count, idempotent = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
producer = Producer({"bootstrap.servers": broker, "acks": "all", "enable.idempotence": idempotent,
                     "linger.ms": 5, "compression.type": "none", "api.version.request": True})
acked = []
def delivered(error, message):
    if error is not None:
        sys.exit("delivery failed: %s" % error)
    acked.append(message.key().decode())
for index in range(count):
    key = "key-%d" % (index % 17)
    producer.produce(topic, value=("v%d" % index).encode(), key=key.encode(),
                     timestamp=1_700_000_000_000 + index, headers=[("seq", str(index).encode()), ("dup", b"x"), ("dup", None)],
                     on_delivery=delivered)
    producer.poll(0)
left = producer.flush(30)
if left:
    sys.exit("%d messages not delivered" % left)
print(len(acked))
"#;

/// kafka-python: an idempotent (or not), keyed producer with acks=all.
const KAFKA_PYTHON_PRODUCE: &str = r#"
import sys
from kafka import KafkaProducer
broker, topic, count, idempotent = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
producer = KafkaProducer(bootstrap_servers=broker, acks="all", enable_idempotence=idempotent, linger_ms=5)
futures = []
for index in range(count):
    futures.append(producer.send(topic, key=("key-%d" % (index % 17)).encode(), value=("v%d" % index).encode(),
                                 timestamp_ms=1_700_000_000_000 + index, headers=[("seq", str(index).encode())]))
for future in futures:
    future.get(timeout=30)
producer.flush()
print(len(futures))
"#;

/// kafka-python: reads every partition of a topic from the start (no
/// group), printing one JSON object per record.
const KAFKA_PYTHON_READ_ALL: &str = r#"
import json, sys
from kafka import KafkaConsumer, TopicPartition
broker, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
consumer = KafkaConsumer(bootstrap_servers=broker, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest", consumer_timeout_ms=5000)
partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
consumer.assign(partitions)
consumer.seek_to_beginning()
seen = 0
for message in consumer:
    headers = [[k, None if v is None else v.decode()] for k, v in message.headers]
    print(json.dumps({"p": message.partition, "o": message.offset, "k": message.key.decode(),
                      "v": message.value.decode(), "t": message.timestamp, "h": headers}))
    seen += 1
    if seen >= expected + 100:
        break
"#;

/// Reads a topic back through kafka-python: (partition, offset, key,
/// value, timestamp, headers) per record.
fn read_all(server: &Server, topic: &str, expected: usize) -> Vec<serde_json::Value> {
    let out = python(KAFKA_PYTHON_READ_ALL, &[&server.ingest_kafka.to_string(), topic, &expected.to_string()]);
    out.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// Checks that `records` are exactly values v0..v(count-1), each once,
/// each key in one partition in send order, with its timestamp and headers.
fn check_exactly_once(records: &[serde_json::Value], count: usize, header_dups: bool) {
    assert_eq!(records.len(), count, "every acknowledged record, once");
    let mut seen = vec![false; count];
    let mut last_by_key: std::collections::HashMap<String, (u64, usize)> = Default::default();
    for record in records {
        let index: usize = record["v"].as_str().unwrap()[1..].parse().unwrap();
        assert!(!seen[index], "v{index} twice");
        seen[index] = true;
        assert_eq!(record["k"], format!("key-{}", index % 17));
        assert_eq!(record["t"], 1_700_000_000_000u64 + index as u64, "the producer's timestamp");
        let mut headers = vec![serde_json::json!(["seq", index.to_string()])];
        if header_dups {
            headers.extend([serde_json::json!(["dup", "x"]), serde_json::json!(["dup", null])]);
        }
        assert_eq!(record["h"], serde_json::Value::Array(headers), "headers, duplicates and order kept");
        let partition = record["p"].as_u64().unwrap();
        let key = record["k"].as_str().unwrap().to_string();
        if let Some(&(previous_partition, previous_index)) = last_by_key.get(&key) {
            assert_eq!(previous_partition, partition, "one key, one partition");
            assert!(previous_index < index, "a key's records in send order");
        }
        last_by_key.insert(key, (partition, index));
    }
}

/// confluent-kafka with enable.idempotence and acks=all, and kafka-python
/// with acks=all (idempotent and not), produce keyed records with headers
/// and timestamps; kafka-python reads each exactly once, as sent, and again
/// after kill -9 and a restart from disk.
#[test]
fn python_producers_round_trip_and_survive_kill_9() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "4", "--fsync", "always"]);
    let broker = server.ingest_kafka.to_string();
    for topic in ["confluent", "kafkapy", "kafkapyidem"] {
        server.create_stream(serde_json::json!({"name": topic, "partitions": 3}));
    }
    let count = 3000;
    let acked = python(CONFLUENT_PRODUCE, &[&broker, "confluent", &count.to_string(), "1"]);
    assert_eq!(acked.trim(), count.to_string());
    let acked = python(KAFKA_PYTHON_PRODUCE, &[&broker, "kafkapy", &count.to_string(), "0"]);
    assert_eq!(acked.trim(), count.to_string());
    let acked = python(KAFKA_PYTHON_PRODUCE, &[&broker, "kafkapyidem", &count.to_string(), "1"]);
    assert_eq!(acked.trim(), count.to_string());
    let before: Vec<Vec<serde_json::Value>> =
        ["confluent", "kafkapy", "kafkapyidem"].iter().map(|topic| read_all(&server, topic, count)).collect();
    check_exactly_once(&before[0], count, true);
    check_exactly_once(&before[1], count, false);
    check_exactly_once(&before[2], count, false);
    server.crash();
    server.spawn();
    for (topic, records) in ["confluent", "kafkapy", "kafkapyidem"].iter().zip(&before) {
        let mut after = read_all(&server, topic, count);
        let mut records = records.clone();
        let order = |record: &serde_json::Value| (record["p"].as_u64(), record["o"].as_u64());
        after.sort_by_key(order);
        records.sort_by_key(order);
        assert_eq!(after, records, "{topic}: the same records after kill -9");
    }
}

// ---------------------------------------------------------------------------
// Consumer groups.

/// confluent-kafka: a group member that prints what it is assigned, each
/// record it reads and each commit, committing after every poll; it
/// leaves the group (close) when its stdin closes.
const CONFLUENT_MEMBER: &str = r#"
import json, sys, threading
from confluent_kafka import Consumer, KafkaException
broker, group, topic = sys.argv[1:4]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
consumer = Consumer({"bootstrap.servers": broker, "group.id": group, "enable.auto.commit": False,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                     "partition.assignment.strategy": "range"})
def say(what):
    print(json.dumps(what), flush=True)
consumer.subscribe([topic], on_assign=lambda c, ps: say({"assigned": [p.partition for p in ps]}),
                   on_revoke=lambda c, ps: say({"revoked": [p.partition for p in ps]}))
while not stop.is_set():
    messages = consumer.consume(num_messages=50, timeout=0.2)
    for message in messages:
        if message.error():
            say({"error": str(message.error())})
        else:
            say({"p": message.partition(), "o": message.offset()})
    if messages:
        try:
            done = consumer.commit(asynchronous=False)
            say({"committed": [[tp.partition, tp.offset] for tp in done]})
        except KafkaException as error:
            say({"commit_error": str(error)})
consumer.close()
"#;

/// kafka-python: the same member, on the other client library.
const KAFKA_PYTHON_MEMBER: &str = r#"
import json, sys, threading
from kafka import KafkaConsumer
from kafka.coordinator.assignors.range import RangePartitionAssignor
broker, group, topic = sys.argv[1:4]
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
consumer = KafkaConsumer(topic, bootstrap_servers=broker, group_id=group, enable_auto_commit=False,
                         auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=500,
                         partition_assignment_strategy=[RangePartitionAssignor])
def say(what):
    print(json.dumps(what), flush=True)
while not stop.is_set():
    batches = consumer.poll(timeout_ms=200)
    for tp, records in batches.items():
        for record in records:
            say({"p": record.partition, "o": record.offset})
    if batches:
        try:
            consumer.commit()
            say({"committed": [[tp.partition, consumer.position(tp)] for tp in batches]})
        except Exception as error:
            say({"commit_error": str(error)})
consumer.close()
"#;

/// A group member process and the JSON lines it printed.
struct Member {
    child: std::process::Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<serde_json::Value>>>,
}

impl Member {
    fn start(script: &str, server: &Server, group: &str, topic: &str) -> Member {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .args([&server.ingest_kafka.to_string(), group, topic])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let stdout = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let collected = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str(&line) {
                    collected.lock().unwrap().push(value);
                }
            }
        });
        Member { child, lines }
    }

    /// The (partition, offset) of every record it read.
    fn records(&self) -> Vec<(u64, u64)> {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter_map(|line| Some((line["p"].as_u64()?, line["o"].as_u64()?))).collect()
    }

    /// The partitions of its last assignment, if any.
    fn assigned(&self) -> Option<Vec<u64>> {
        let lines = self.lines.lock().unwrap();
        let last = lines.iter().rev().find(|line| line.get("assigned").is_some())?;
        Some(last["assigned"].as_array()?.iter().filter_map(serde_json::Value::as_u64).collect())
    }

    /// Leaves the group (its stdin closes) and waits for it to exit.
    fn leave(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }

    fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `ready` holds, failing with `what` after `limit`.
fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The committed offsets of `group` on `stream` from GET /groups (one per
/// partition, None where none).
fn committed(server: &Server, stream: &str, group: &str) -> Vec<Option<u64>> {
    let groups: serde_json::Value = serde_json::from_str(&server.get("/groups")).unwrap();
    let Some(found) =
        groups["groups"].as_array().unwrap().iter().find(|entry| entry["stream"] == stream && entry["group"] == group)
    else {
        return Vec::new();
    };
    found["partitions"].as_array().unwrap().iter().map(|partition| partition["committed"].as_u64()).collect()
}

fn next_offsets(server: &Server, stream: &str) -> Vec<u64> {
    server.streams()[stream]["next_offsets"].as_array().unwrap().iter().map(|offset| offset.as_u64().unwrap()).collect()
}

fn produce_confluent(server: &Server, topic: &str, count: usize) {
    let acked = python(CONFLUENT_PRODUCE, &[&server.ingest_kafka.to_string(), topic, &count.to_string(), "1"]);
    assert_eq!(acked.trim(), count.to_string());
}

/// Waits until the group's commits on `stream` reach every partition's end.
fn wait_for_commits_at_end(server: &Server, stream: &str, group: &str) {
    let ends: Vec<Option<u64>> = next_offsets(server, stream).into_iter().map(Some).collect();
    wait_until(Duration::from_secs(60), "the group's commits to reach the end", || {
        committed(server, stream, group) == ends
    });
}

/// Rounds of 60 more records the consumer-group test sends, one a second,
/// until the member that joined last has read some.
const JOINER_ROUNDS_MAX: usize = 20;

/// A consumer group of three confluent-kafka members shares a stream's
/// partitions (each partition to one member); one is killed (-9) and a
/// kafka-python member joins, and the group reads every record at least
/// once and commits up to the end; the commits are spate's (GET /groups,
/// /metrics); after kill -9 of the server and a restart, a new member
/// resumes exactly at the last commits and reads exactly the new records.
#[test]
fn a_kafka_consumer_group_shares_partitions_and_resumes_at_its_commits() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "4", "--fsync", "always"]);
    server.create_stream(serde_json::json!({"name": "shared", "partitions": 6}));
    let members: Vec<Member> = (0..3).map(|_| Member::start(CONFLUENT_MEMBER, &server, "billing", "shared")).collect();
    wait_until(Duration::from_secs(60), "three members each assigned partitions", || {
        let assigned: Vec<Vec<u64>> = members.iter().filter_map(Member::assigned).collect();
        let mut all: Vec<u64> = assigned.iter().flatten().copied().collect();
        all.sort_unstable();
        assigned.len() == 3 && assigned.iter().all(|set| !set.is_empty()) && all == [0, 1, 2, 3, 4, 5]
    });
    produce_confluent(&server, "shared", 600);
    wait_for_commits_at_end(&server, "shared", "billing");
    let mut members = members.into_iter();
    let dead = members.next().unwrap();
    let dead_partitions = dead.assigned().unwrap();
    dead.kill9();
    let mut living: Vec<Member> = members.collect();
    living.push(Member::start(KAFKA_PYTHON_MEMBER, &server, "billing", "shared"));
    produce_confluent(&server, "shared", 600);
    wait_for_commits_at_end(&server, "shared", "billing");
    // The joiner may get its partitions only after the two others read all
    // 600 (the group rebalances when it joins, at its own pace): then more
    // records come, a few at a time, until it has read some.
    let mut produced = 1200;
    for _ in 0..JOINER_ROUNDS_MAX {
        if !living.last().unwrap().records().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
        produce_confluent(&server, "shared", 60);
        produced += 60;
        wait_for_commits_at_end(&server, "shared", "billing");
    }
    let ends = next_offsets(&server, "shared");
    assert_eq!(ends.iter().sum::<u64>(), produced);
    let read: std::collections::HashSet<(u64, u64)> = living.iter().flat_map(Member::records).collect();
    for &partition in &dead_partitions {
        let tail = (ends[partition as usize] - 1, partition);
        assert!(read.contains(&(tail.1, tail.0)), "the dead member's partition {partition} was taken over");
    }
    let joiner = living.last().unwrap().records();
    assert!(!joiner.is_empty(), "the kafka-python member read its share");
    let metrics = server.get("/metrics");
    assert!(metrics.contains("spate_group_lag_events{stream=\"shared\",group=\"billing\"} 0"), "{metrics}");
    for member in living {
        member.leave();
    }
    let before_crash = committed(&server, "shared", "billing");
    server.crash();
    server.spawn();
    assert_eq!(committed(&server, "shared", "billing"), before_crash, "the commits survive kill -9");
    produce_confluent(&server, "shared", 300);
    let resumed = Member::start(CONFLUENT_MEMBER, &server, "billing", "shared");
    wait_for_commits_at_end(&server, "shared", "billing");
    let mut records = resumed.records();
    records.sort_unstable();
    records.dedup();
    assert_eq!(records.len(), 300, "exactly the records after the commits");
    for (partition, offset) in records {
        assert!(offset >= before_crash[partition as usize].unwrap(), "p{partition} o{offset} was committed");
    }
}

/// A Kafka group and a `GROUP` group of the same name on one stream are
/// refused, whichever came second: the Kafka member's offset fetch (and
/// commit) gets INCONSISTENT_GROUP_PROTOCOL, the `GROUP` member
/// `ERR group_conflict`.
#[test]
fn a_kafka_group_and_a_spate_group_of_one_name_are_refused() {
    let server = Server::start(&["--shards", "2", "--partitions", "2", "--storage", "memory"]);
    produce_confluent(&server, "default", 50);
    let member = Member::start(CONFLUENT_MEMBER, &server, "kafkaside", "default");
    wait_for_commits_at_end(&server, "default", "kafkaside");
    member.leave();
    let mut spate_member = common::Subscriber::connect(server.subscribe, "GROUP default kafkaside earliest");
    let line = String::from_utf8(spate_member.next_line().expect("an answer")).unwrap();
    assert!(line.starts_with("ERR group_conflict"), "{line}");
    let mut spate_member = common::Subscriber::connect(server.subscribe, "GROUP default spateside earliest");
    let line = String::from_utf8(spate_member.next_line().expect("an answer")).unwrap();
    assert!(line.starts_with("ASSIGNED"), "{line}");
    let member = Member::start(CONFLUENT_MEMBER, &server, "spateside", "default");
    wait_until(Duration::from_secs(30), "the Kafka member's refused commit", || {
        let lines = member.lines.lock().unwrap();
        // librdkafka reports it when it fetches the group's offsets.
        lines
            .iter()
            .any(|line| line["error"].as_str().is_some_and(|error| error.contains("Inconsistent group protocol")))
    });
}

// ---------------------------------------------------------------------------
// Across formats.

/// Sends `input` to a line-format listener, then `#SYNC`, and waits for
/// its `OK` (the events are stored).
fn send_and_sync(address: std::net::SocketAddr, input: &[u8]) {
    use std::io::BufRead;
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(input).unwrap();
    stream.write_all(b"#SYNC done\n").unwrap();
    for line in std::io::BufReader::new(stream).lines() {
        let line = line.unwrap();
        assert!(!line.starts_with("ERR"), "{line}");
        if line.ends_with(" SYNC done") {
            return;
        }
    }
    panic!("closed before OK SYNC");
}

/// (partition, offset, key, value) of every event a subscriber sees,
/// sorted.
fn delivered(events: Vec<common::Delivered>) -> Vec<(u64, u64, String, String)> {
    let mut seen: Vec<(u64, u64, String, String)> = events
        .into_iter()
        .map(|event| {
            let key = String::from_utf8(event.key).unwrap();
            (u64::from(event.partition), event.offset, key, String::from_utf8(event.payload).unwrap())
        })
        .collect();
    seen.sort();
    seen
}

/// Events sent as `KEY PAYLOAD` lines and as JSON lines reach a Kafka
/// consumer (kafka-python) with their keys and payloads, at the offsets a
/// `SUB` subscriber sees them; records a Kafka producer (confluent-kafka)
/// sent reach a `SUB` subscriber and a `GROUP` member with the same keys,
/// values, partitions and offsets as a Kafka consumer reads.
#[test]
fn lines_and_json_in_kafka_out_and_kafka_in_sub_and_group_out() {
    let server = Server::start(&["--shards", "2", "--partitions", "3", "--storage", "memory"]);
    server.create_stream(serde_json::json!({"name": "mixed", "partitions": 3}));
    send_and_sync(server.ingest, b"#STREAM mixed\nuser1 first line\nuser2 second\nuser1 third\n");
    send_and_sync(server.ingest_json, b"#STREAM mixed\n{\"key\":\"user3\",\"n\":1}\n");
    let through_kafka: Vec<(u64, u64, String, String)> = {
        let mut records: Vec<_> = read_all(&server, "mixed", 4)
            .into_iter()
            .map(|record| {
                assert_eq!((&record["t"], &record["h"]), (&serde_json::json!(-1), &serde_json::json!([])));
                let text = |field: &str| record[field].as_str().unwrap().to_string();
                (record["p"].as_u64().unwrap(), record["o"].as_u64().unwrap(), text("k"), text("v"))
            })
            .collect();
        records.sort();
        records
    };
    let mut subscriber = common::Subscriber::connect(server.subscribe, "SUB mixed * earliest");
    assert_eq!(delivered(subscriber.take(4)), through_kafka, "Kafka reads what SUB reads");
    let values: Vec<&str> = through_kafka.iter().map(|record| record.3.as_str()).collect();
    for expected in ["first line", "second", "third", "{\"key\":\"user3\",\"n\":1}"] {
        assert!(values.contains(&expected), "{expected} in {values:?}");
    }
    produce_confluent(&server, "default", 200);
    let produced: Vec<(u64, u64, String, String)> = {
        let mut records: Vec<_> = read_all(&server, "default", 200)
            .into_iter()
            .map(|record| {
                let text = |field: &str| record[field].as_str().unwrap().to_string();
                (record["p"].as_u64().unwrap(), record["o"].as_u64().unwrap(), text("k"), text("v"))
            })
            .collect();
        records.sort();
        records
    };
    assert_eq!(produced.len(), 200);
    let mut subscriber = common::Subscriber::connect(server.subscribe, "SUB * earliest");
    assert_eq!(delivered(subscriber.take(200)), produced, "SUB reads what Kafka reads");
    let mut member = common::Subscriber::connect(server.subscribe, "GROUP default readers earliest");
    let assigned = String::from_utf8(member.next_line().unwrap()).unwrap();
    assert!(assigned.starts_with("ASSIGNED"), "{assigned}");
    assert_eq!(delivered(member.take(200)), produced, "a GROUP member reads what Kafka reads");
}

/// With the benchmark knob `--kafka-produce-discard`, Produce still checks
/// every batch (a bad CRC gets CORRUPT_MESSAGE) and answers a good one with
/// success, but stores nothing; without it the same batch is stored.
#[test]
fn produce_discard_checks_batches_and_stores_nothing() {
    for (discard, stored) in [(true, 0), (false, 2)] {
        let mut args = vec!["--shards", "2", "--partitions", "1", "--storage", "memory"];
        if discard {
            args.push("--kafka-produce-discard");
        }
        let server = Server::start(&args);
        let mut stream = TcpStream::connect(server.ingest_kafka).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let batch = record_batch(-1, -1, -1, &["a", "b"]);
        assert_eq!(produce(&mut stream, "default", &batch), 0, "discard {discard}");
        let mut corrupt = batch.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        assert_eq!(produce(&mut stream, "default", &corrupt), 2, "CORRUPT_MESSAGE, discard {discard}");
        assert_eq!(server.stream_end("default"), stored, "discard {discard}");
    }
}

/// A partition entry of a good batch followed by a bad one is refused
/// whole, with CORRUPT_MESSAGE, and stores nothing, not even the good
/// batch nor the good records before the bad one in its own batch: the bad
/// one has a bad CRC, or a valid CRC around a record whose value runs past
/// the record's end, or a valid CRC around one record more than it says.
#[test]
fn a_corrupt_batch_refuses_its_whole_partition_entry() {
    let server = Server::start(&["--shards", "2", "--partitions", "1", "--storage", "memory"]);
    let mut stream = TcpStream::connect(server.ingest_kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let good = record_batch(-1, -1, -1, &["a", "b"]);
    let mut bad_crc = record_batch(-1, -1, -1, &["c", "d"]);
    *bad_crc.last_mut().unwrap() ^= 1;
    let mut records = Vec::new();
    put_record(&mut records, 0, "c");
    let mut short_value = Vec::new();
    put_record(&mut short_value, 1, "d");
    // The record's value size (after its size, attributes, two deltas, key
    // size and key, a byte each) says 3 bytes, where 2 are left in it.
    short_value[6] = 6;
    records.extend_from_slice(&short_value);
    let value_past_end = sealed_batch(-1, -1, -1, 2, &records);
    let mut records = Vec::new();
    for (index, value) in ["c", "d", "e"].iter().enumerate() {
        put_record(&mut records, index, value);
    }
    let record_more = sealed_batch(-1, -1, -1, 2, &records);
    for (what, bad) in
        [("bad CRC", &bad_crc), ("value past its record", &value_past_end), ("a record more", &record_more)]
    {
        let entry = [good.as_slice(), bad.as_slice()].concat();
        assert_eq!(produce(&mut stream, "default", &entry), 2, "CORRUPT_MESSAGE for {what}");
        assert_eq!(server.stream_end("default"), 0, "nothing stored of an entry with {what}");
    }
    let corrupt_counted: f64 = server
        .get("/metrics")
        .lines()
        .filter(|line| line.starts_with("spate_kafka_errors_total{") && line.contains(r#"reason="corrupt_batch""#))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(corrupt_counted, 3.0, "each refusal counted as corrupt_batch");
    assert_eq!(produce(&mut stream, "default", &good), 0, "a good entry alone");
    assert_eq!(server.stream_end("default"), 2, "only the good entry's two records");
}

// ---------------------------------------------------------------------------
// The murmur2 partitioner.

/// kafka-python: sends one record per key (`key-0` ... `key-N`) with no
/// partition given, so its default partitioner (murmur2 of the key, as the
/// Java client's) picks each record's partition.
const KAFKA_PYTHON_PRODUCE_KEYS: &str = r#"
import sys
from kafka import KafkaProducer
broker, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = KafkaProducer(bootstrap_servers=broker, acks=1)
for index in range(count):
    producer.send(topic, key=("key-%d" % index).encode(), value=("kafka-%d" % index).encode()).get(timeout=30)
producer.flush()
print(count)
"#;

/// The partition each key's line landed in and the one kafka-python chose
/// for it, on `topic`: `(key, line partition, kafka partition)`.
fn partitions_by_key(server: &Server, topic: &str, key_count: usize) -> Vec<(String, u64, u64)> {
    let mut producer = server.producer();
    let lines: String = (0..key_count).map(|index| format!("key-{index} line-{index}\n")).collect();
    producer.send(format!("#STREAM {topic}\n{lines}").as_bytes());
    let replies = producer.sync();
    assert!(replies.iter().all(|reply| !reply.starts_with("ERR")), "{replies:?}");
    let acked = python(KAFKA_PYTHON_PRODUCE_KEYS, &[&server.ingest_kafka.to_string(), topic, &key_count.to_string()]);
    assert_eq!(acked.trim(), key_count.to_string());
    let records = read_all(server, topic, 2 * key_count);
    assert_eq!(records.len(), 2 * key_count, "{topic}: every line and every Kafka record");
    let partition_of = |prefix: &str, index: usize| {
        let value = format!("{prefix}-{index}");
        let record = records.iter().find(|record| record["v"] == value.as_str()).expect("each value once");
        assert_eq!(record["k"], format!("key-{index}").as_str());
        record["p"].as_u64().unwrap()
    };
    (0..key_count)
        .map(|index| (format!("key-{index}"), partition_of("line", index), partition_of("kafka", index)))
        .collect()
}

/// A stream created with `"partitioner": "murmur2"` routes a key sent as a
/// line to the partition kafka-python's default (murmur2) partitioner picks
/// for the same key; on an `xxh3` stream (the default) most keys differ,
/// so the check can fail. GET /streams shows each stream's partitioner.
#[test]
fn murmur2_streams_route_lines_as_kafka_clients_do() {
    let server = Server::start(&["--shards", "2", "--partitions", "4"]);
    server.create_stream(serde_json::json!({"name": "javalike", "partitions": 7, "partitioner": "murmur2"}));
    server.create_stream(serde_json::json!({"name": "hashed", "partitions": 7}));
    let streams = server.streams();
    assert_eq!(streams["javalike"]["partitioner"], "murmur2");
    assert_eq!(streams["hashed"]["partitioner"], "xxh3");
    let key_count = 40;
    let murmur2 = partitions_by_key(&server, "javalike", key_count);
    for (key, line_partition, kafka_partition) in &murmur2 {
        assert_eq!(line_partition, kafka_partition, "{key}: line vs kafka-python on a murmur2 stream");
    }
    let xxh3 = partitions_by_key(&server, "hashed", key_count);
    let differing =
        xxh3.iter().filter(|(_, line_partition, kafka_partition)| line_partition != kafka_partition).count();
    assert!(differing > key_count / 2, "xxh3 differs from murmur2 for most keys: {differing} of {key_count}");
    let (status, body) = server.http(
        "POST",
        "/streams",
        Some(&serde_json::json!({"name": "bad", "partitions": 2, "partitioner": "fnv"})),
    );
    assert_eq!(status, 400, "{body}");
}

// ---------------------------------------------------------------------------
// Offsets in Produce answers.

/// confluent-kafka: a keyed producer printing, per delivery report, the
/// value and the partition and offset the broker answered.
const CONFLUENT_PRODUCE_REPORTING: &str = r#"
import json, sys
from confluent_kafka import Producer
broker, topic, count, acks, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
producer = Producer({"bootstrap.servers": broker, "acks": acks, "linger.ms": 5, "compression.type": "none"})
reports = []
def delivered(error, message):
    if error is not None:
        sys.exit("delivery failed: %s" % error)
    reports.append({"v": message.value().decode(), "p": message.partition(), "o": message.offset()})
for index in range(count):
    producer.produce(topic, value=("%s%d" % (prefix, index)).encode(), key=("key-%d" % (index % 29)).encode(),
                     on_delivery=delivered)
    producer.poll(0)
if producer.flush(30):
    sys.exit("messages not delivered")
for report in reports:
    print(json.dumps(report))
"#;

/// kafka-python: the same, from the futures' record metadata.
const KAFKA_PYTHON_PRODUCE_REPORTING: &str = r#"
import json, sys
from kafka import KafkaProducer
broker, topic, count, acks, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
producer = KafkaProducer(bootstrap_servers=broker, acks=(acks if acks == "all" else int(acks)), linger_ms=5)
futures = [(index, producer.send(topic, key=("key-%d" % (index % 29)).encode(),
                                 value=("%s%d" % (prefix, index)).encode())) for index in range(count)]
for index, future in futures:
    metadata = future.get(timeout=30)
    print(json.dumps({"v": "%s%d" % (prefix, index), "p": metadata.partition, "o": metadata.offset}))
producer.flush()
"#;

/// The (value, partition, offset) a producer script reported for each record.
fn reported(
    script: &str,
    server: &Server,
    topic: &str,
    count: usize,
    acks: &str,
    prefix: &str,
) -> Vec<(String, u64, i64)> {
    let out = python(script, &[&server.ingest_kafka.to_string(), topic, &count.to_string(), acks, prefix]);
    let reports: Vec<(String, u64, i64)> = out
        .lines()
        .map(|line| {
            let report: serde_json::Value = serde_json::from_str(line).unwrap();
            (
                report["v"].as_str().unwrap().to_string(),
                report["p"].as_u64().unwrap(),
                report["o"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(reports.len(), count, "a report per record");
    reports
}

/// The offsets Kafka producers are told are the offsets their records are
/// stored at: confluent-kafka (librdkafka) delivery reports and
/// kafka-python's record metadata, with acks=1 and acks=all, on a stream
/// whose partitions already hold lines and are owned by both shards, name
/// for every record the partition and offset a `SUB` subscriber then reads
/// it at (the answers' base offset was -1, which the clients report as
/// offset -1 or a count from -1).
#[test]
fn producers_are_told_the_offsets_sub_reads_their_records_at() {
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--fsync", "interval"]);
    server.create_stream(serde_json::json!({"name": "acked", "partitions": 4}));
    let lines: String = (0..40).map(|index| format!("line-key-{index} line-{index}\n")).collect();
    send_and_sync(server.ingest, format!("#STREAM acked\n{lines}").as_bytes());
    let mut reports = Vec::new();
    for (script, acks, prefix) in [
        (CONFLUENT_PRODUCE_REPORTING, "1", "c1-"),
        (CONFLUENT_PRODUCE_REPORTING, "all", "call-"),
        (KAFKA_PYTHON_PRODUCE_REPORTING, "1", "k1-"),
        (KAFKA_PYTHON_PRODUCE_REPORTING, "all", "kall-"),
    ] {
        reports.extend(reported(script, &server, "acked", 500, acks, prefix));
    }
    let mut subscriber = common::Subscriber::connect(server.subscribe, "SUB acked * earliest");
    let stored: std::collections::HashMap<String, (u64, i64)> = subscriber
        .take(40 + reports.len())
        .into_iter()
        .map(|event| (String::from_utf8(event.payload).unwrap(), (u64::from(event.partition), event.offset as i64)))
        .collect();
    let mut wrong = Vec::new();
    for (value, partition, offset) in &reports {
        if stored.get(value) != Some(&(*partition, *offset)) {
            wrong.push(format!("{value}: told p{partition} o{offset}, stored at {:?}", stored.get(value)));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} reports wrong, first: {:?}",
        wrong.len(),
        reports.len(),
        &wrong[..wrong.len().min(5)]
    );
}

/// A Produce v3 request frame (size prefix included) of `batch` to
/// partition 0 of `topic`.
fn produce_frame(topic: &str, batch: &[u8], correlation_id: i32, acks: i16) -> Vec<u8> {
    request_frame(0, 3, correlation_id, &produce_body(topic, acks, batch))
}

/// Reads one Produce v3 answer of a one-partition request to `topic`:
/// (correlation id, error code, base offset).
fn read_produce_answer(stream: &mut TcpStream, topic: &str) -> (i32, i16, i64) {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("an answer");
    let mut response = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut response).unwrap();
    let correlation_id = i32::from_be_bytes(response[..4].try_into().unwrap());
    // correlation id (4), topics (4), name (2 + len), partitions (4), index (4).
    let at = 4 + 4 + 2 + topic.len() + 4 + 4;
    let code = i16::from_be_bytes(response[at..at + 2].try_into().unwrap());
    let base_offset = i64::from_be_bytes(response[at + 2..at + 10].try_into().unwrap());
    (correlation_id, code, base_offset)
}

/// A Kafka connection pipelines Produce requests: sent twelve at once to a
/// partition whose owner takes 400 ms per record (a test knob), the first
/// eight are routed while the first still waits for its owner (before
/// any answer leaves), the connection stops reading at eight in flight,
/// and the answers come in request order, each with the base offset its
/// record got (a connection that handled one request at a time routed the
/// second only after answering the first).
#[test]
fn a_connection_routes_produce_requests_while_earlier_ones_wait() {
    let server = Server::start(&[
        "--shards",
        "1",
        "--partitions",
        "1",
        "--storage",
        "memory",
        "--apply-delay-ns-per-event",
        "400000000",
    ]);
    let mut stream = TcpStream::connect(server.ingest_kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut frames = Vec::new();
    for index in 0..12 {
        let batch = record_batch(-1, -1, -1, &[&format!("r{index}")]);
        frames.extend(produce_frame("default", &batch, 100 + index, 1));
    }
    stream.write_all(&frames).unwrap();
    let routed = || server.metric("spate_kafka_records_produced_total");
    wait_until(Duration::from_secs(2), "eight requests routed while the first waits", || routed() >= 8.0);
    let routed_then = routed();
    stream.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let answered = !matches!(stream.peek(&mut byte), Err(error) if error.kind() == std::io::ErrorKind::WouldBlock);
    stream.set_nonblocking(false).unwrap();
    assert!(!answered, "no answer has left yet (the first record takes 400 ms to apply)");
    assert_eq!(routed_then, 8.0, "at most eight requests in flight: the connection stopped reading");
    let answers: Vec<(i32, i16, i64)> = (0..12).map(|_| read_produce_answer(&mut stream, "default")).collect();
    let expected: Vec<(i32, i16, i64)> = (0..12).map(|index| (100 + index, 0, i64::from(index))).collect();
    assert_eq!(answers, expected, "answers in request order, each with its record's offset");
}

/// A Fetch v4 request frame body for `topic`: `(partition, fetch offset,
/// partition_max_bytes)` each, `max_bytes` for the response, no wait.
fn fetch_body(topic: &str, partitions: &[(i32, i64, i32)], max_bytes: i32) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(-1i32).to_be_bytes()); // replica id
    body.extend_from_slice(&0i32.to_be_bytes()); // max wait ms
    body.extend_from_slice(&1i32.to_be_bytes()); // min bytes
    body.extend_from_slice(&max_bytes.to_be_bytes());
    body.push(0); // isolation level
    body.extend_from_slice(&1i32.to_be_bytes());
    put_string(&mut body, topic);
    body.extend_from_slice(&(partitions.len() as i32).to_be_bytes());
    for &(partition, offset, partition_max_bytes) in partitions {
        body.extend_from_slice(&partition.to_be_bytes());
        body.extend_from_slice(&offset.to_be_bytes());
        body.extend_from_slice(&partition_max_bytes.to_be_bytes());
    }
    body
}

/// Per partition of a Fetch v4 answer (one topic): its records' bytes and
/// the offsets of the records its batches hold.
fn fetched(response: &[u8], topic: &str) -> Vec<(i32, usize, Vec<i64>)> {
    let mut at = 4 + 4 + 2 + topic.len(); // throttle time, topics, name
    let take = |at: &mut usize, size: usize| {
        *at += size;
        &response[*at - size..*at]
    };
    let count = i32::from_be_bytes(take(&mut at, 4).try_into().unwrap());
    let mut partitions = Vec::new();
    for _ in 0..count {
        let partition = i32::from_be_bytes(take(&mut at, 4).try_into().unwrap());
        assert_eq!(take(&mut at, 2), [0, 0], "no error");
        take(&mut at, 16); // high watermark, last stable offset
        let aborted = i32::from_be_bytes(take(&mut at, 4).try_into().unwrap());
        assert!(aborted <= 0);
        let size = i32::from_be_bytes(take(&mut at, 4).try_into().unwrap()).max(0) as usize;
        let records = take(&mut at, size);
        let mut offsets = Vec::new();
        let mut batch = records;
        while !batch.is_empty() {
            let base = i64::from_be_bytes(batch[..8].try_into().unwrap());
            let length = i32::from_be_bytes(batch[8..12].try_into().unwrap()) as usize;
            let count = i32::from_be_bytes(batch[57..61].try_into().unwrap());
            offsets.extend((0..i64::from(count)).map(|delta| base + delta));
            batch = &batch[12 + length..];
        }
        partitions.push((partition, size, offsets));
    }
    partitions
}

/// A Fetch answer respects the client's sizes, counted in the bytes it
/// receives: a partition's records stay within its `partition_max_bytes`
/// and the response's within `max_bytes`, from the requested offset on,
/// and a first record larger than either still comes (alone), so a
/// consumer always progresses (before, the caps were not applied:
/// `partition_max_bytes` was ignored and each owner shard filled
/// `max_bytes` on its own).
#[test]
fn fetch_answers_stay_within_the_clients_sizes() {
    let server = Server::start(&["--shards", "2", "--partitions", "1", "--storage", "memory"]);
    server.create_stream(serde_json::json!({"name": "sized", "partitions": 2}));
    let mut stream = TcpStream::connect(server.ingest_kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let value = "v".repeat(100);
    let values: Vec<&str> = vec![value.as_str(); 50];
    let mut frames = Vec::new();
    for partition in [0, 1] {
        let mut frame = produce_frame("sized", &record_batch(-1, -1, -1, &values), partition, 1);
        // produce_frame targets partition 0: patch the partition index.
        let at = frame.len() - record_batch(-1, -1, -1, &values).len() - 8;
        frame[at..at + 4].copy_from_slice(&partition.to_be_bytes());
        frames.extend(frame);
    }
    stream.write_all(&frames).unwrap();
    for _ in 0..2 {
        assert_eq!(read_produce_answer(&mut stream, "sized").1, 0);
    }
    let fetch = |partitions: &[(i32, i64, i32)], max_bytes: i32| {
        let response = exchange(&mut stream_for(&server), 1, 4, &fetch_body("sized", partitions, max_bytes));
        fetched(&response, "sized")
    };
    let one = fetch(&[(0, 0, 1000)], 1 << 20);
    assert!(one[0].1 <= 1000 && one[0].2.len() >= 5, "within partition_max_bytes: {:?}", (one[0].1, one[0].2.len()));
    assert_eq!(one[0].2, (0..one[0].2.len() as i64).collect::<Vec<_>>());
    let from = one[0].2.len() as i64;
    let next = fetch(&[(0, from, 1000)], 1 << 20);
    assert_eq!(next[0].2.first(), Some(&from), "the next fetch starts at the first record left out");
    let tiny = fetch(&[(0, 3, 10)], 1 << 20);
    assert_eq!(tiny[0].2, [3], "a record larger than partition_max_bytes comes alone");
    let both = fetch(&[(0, 0, 1 << 20), (1, 0, 1 << 20)], 3000);
    let total: usize = both.iter().map(|partition| partition.1).sum();
    assert!(total <= 3000 && total > 2000, "within max_bytes: {total}");
    let least = fetch(&[(0, 0, 1 << 20), (1, 0, 1 << 20)], 10);
    assert_eq!(least.iter().map(|partition| partition.2.len()).sum::<usize>(), 1, "one record past max_bytes");
    let whole = fetch(&[(0, 0, 1 << 20), (1, 0, 1 << 20)], 1 << 20);
    assert_eq!(whole.iter().map(|partition| partition.2.len()).sum::<usize>(), 100, "everything within large caps");
}

fn stream_for(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.ingest_kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream
}
