//! End-to-end ingest: many connections, many keys, a 4-shard server, and a
//! subscriber that checks every event arrives once and in order.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Server, Subscriber};

const CONNECTION_COUNT: usize = 32;
const EVENTS_PER_CONNECTION: usize = 31_250; // 32 * 31_250 = 1_000_000
const KEY_COUNT: usize = 5_000;

/// Builds one connection's lines: key `k<n>`, payload `<connection> <seq>`,
/// where seq counts per (connection, key) from 0.
fn connection_lines(connection: usize) -> Vec<u8> {
    let mut sequences = vec![0u32; KEY_COUNT];
    let mut lines = Vec::with_capacity(EVENTS_PER_CONNECTION * 24);
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ connection as u64;
    for _ in 0..EVENTS_PER_CONNECTION {
        // xorshift: a cheap, deterministic key choice per connection.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let key = (state % KEY_COUNT as u64) as usize;
        lines.extend_from_slice(format!("k{key} {connection} {}\n", sequences[key]).as_bytes());
        sequences[key] += 1;
    }
    lines
}

/// A million events from 32 connections over 5,000 keys into 4 shards: a
/// `SUB * earliest` subscriber (connected before the producers, so it sees
/// both live tail and replay) receives each exactly once, in send order per
/// (connection, key), with dense offsets per partition; /stats agrees.
#[test]
fn million_events_arrive_exactly_once_in_order() {
    let server = Server::start(&["--shards", "4"]);
    let total = CONNECTION_COUNT * EVENTS_PER_CONNECTION;
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let started = Instant::now();
    let producers: Vec<_> = (0..CONNECTION_COUNT)
        .map(|connection| {
            let address = server.ingest;
            std::thread::spawn(move || {
                let mut producer = common::Producer::connect(address);
                producer.send(&connection_lines(connection));
                let replies = producer.sync();
                assert_eq!(replies.len(), 1, "only the SYNC reply: {replies:?}");
            })
        })
        .collect();
    let mut next_sequence: HashMap<(Vec<u8>, u32), u32> = HashMap::new();
    let mut next_offset: HashMap<u32, u64> = HashMap::new();
    for index in 0..total {
        let event = subscriber.next_event().unwrap_or_else(|| panic!("subscriber ended after {index} of {total}"));
        let payload = std::str::from_utf8(&event.payload).unwrap();
        let (connection, sequence) = payload.split_once(' ').unwrap();
        let (connection, sequence): (u32, u32) = (connection.parse().unwrap(), sequence.parse().unwrap());
        let expected = next_sequence.entry((event.key.clone(), connection)).or_insert(0);
        assert_eq!(sequence, *expected, "order of key {:?} on connection {connection}", event.key);
        *expected += 1;
        let offset = next_offset.entry(event.partition).or_insert(0);
        assert_eq!(event.offset, *offset, "dense offsets in partition {}", event.partition);
        *offset += 1;
    }
    for producer in producers {
        producer.join().unwrap();
    }
    let elapsed = started.elapsed();
    let delivered: u32 = next_sequence.values().sum();
    assert_eq!(delivered as usize, total);
    // No extra events after the million.
    subscriber.set_timeout(Duration::from_millis(300));
    assert!(subscriber.next_event().is_none(), "an event beyond the {total} sent");
    // A partition migrating between shards is absent from /stats and
    // /partitions for the few ms of its handoff: wait for none in flight.
    let owned = server.wait_for_total("partitions_owned", Duration::from_secs(5), |owned| owned == 256);
    let stats = server.stats();
    assert_eq!(owned, 256);
    assert_eq!(stats["totals"]["events_ingested"], total as u64);
    assert_eq!(stats["totals"]["events_stored"], total as u64);
    assert_eq!(stats["totals"]["partitions_owned"], 256);
    let per_shard: u64 = stats["shards"].as_array().unwrap().iter().map(|s| s["events_total"].as_u64().unwrap()).sum();
    assert_eq!(per_shard, total as u64);
    let partitions: serde_json::Value = serde_json::from_str(&server.get("/partitions")).unwrap();
    let offsets: u64 =
        partitions["partitions"].as_array().unwrap().iter().map(|p| p["next_offset"].as_u64().unwrap()).sum();
    assert_eq!(offsets, total as u64, "/partitions next offsets add up to what was sent");
    for (partition, next) in &next_offset {
        assert_eq!(partitions["partitions"][*partition as usize]["next_offset"], *next);
    }
    eprintln!("1M events over 32 connections into 4 shards, delivered in {elapsed:?}");
    assert!(server.terminate().success());
}

/// A backlog many fetch windows long, read after it was written (so every
/// reply is cut by its budget, not by the end of the log): standing fetches
/// serve it back to back, their windows coming back as the subscriber
/// writes, and every event arrives once, in order, on memory and on disk.
#[test]
fn a_backlog_larger_than_the_fetch_window_arrives_whole() {
    const EVENTS: usize = 200_000;
    for storage in ["memory", "disk"] {
        let server = Server::start(&["--shards", "2", "--storage", storage, "--fetch-bytes-max", "16384"]);
        let mut producer = server.producer();
        let mut lines = Vec::with_capacity(EVENTS * 16);
        for event in 0..EVENTS {
            lines.extend_from_slice(format!("k{} {event}\n", event % 97).as_bytes());
        }
        producer.send(&lines);
        producer.sync();
        let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
        let mut last: HashMap<Vec<u8>, i64> = HashMap::new();
        for index in 0..EVENTS {
            let event = subscriber
                .next_event()
                .unwrap_or_else(|| panic!("{storage}: the stream ended after {index} of {EVENTS}"));
            let sequence: i64 = String::from_utf8(event.payload).unwrap().parse().unwrap();
            let previous = last.insert(event.key.clone(), sequence).unwrap_or(-1);
            assert!(sequence > previous, "{storage}: key order broken at {index}");
        }
        assert_eq!(last.len(), 97);
        assert_eq!(server.total("events_delivered"), EVENTS as u64, "{storage}: nothing twice");
    }
}
