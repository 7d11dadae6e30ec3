//! Replicated streams on three real `spate serve` processes on loopback:
//! a stream with `"replication_factor": 3` is a Raft group per partition
//! whose committed events are in every replica's log at the same offsets,
//! and a follower killed with kill -9 under load catches up after a restart.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use common::{Delivered, Server, Subscriber, read_stream, stream_ends, stream_ends_holding, wait_until_stream_holds};
use serde_json::{Value, json};

const STREAM: &str = "orders";
const PARTITIONS: u32 = 2;
/// How long three fresh nodes may take to see each other and elect a
/// leader in every group (2-core box shared with builds).
const READY_WITHIN: Duration = Duration::from_secs(30);
/// Events sent while a follower is killed and down (#SYNC every 50).
const UNDER_LOAD_EVENTS: u64 = 30_000;
/// How long a restarted follower may take to hold every committed event.
const CATCH_UP_WITHIN: Duration = Duration::from_secs(30);

struct Node {
    server: Server,
}

fn start_node(seed: Option<SocketAddr>) -> (Node, SocketAddr) {
    let (server, cluster) = common::start_cluster_node(seed, "4", SERVE_FLAGS);
    (Node { server }, cluster)
}

/// Every node's drain on SIGTERM: short, so a test that stops a node does
/// not wait the default 10 s for connections it left open.
const SERVE_FLAGS: &[&str] = &["--shutdown-timeout-ms", "2000"];

fn cluster_of(server: &Server) -> Value {
    serde_json::from_str(&server.get("/cluster")).expect("/cluster is JSON")
}

/// Polls every node's `/cluster` until `ready` holds for all, or panics.
fn wait_for(nodes: &[&Node], limit: Duration, what: &str, ready: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    loop {
        let views: Vec<Value> = nodes.iter().map(|node| cluster_of(&node.server)).collect();
        if views.iter().all(&ready) {
            return;
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}; views: {views:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every one of the stream's `partitions` has a group with three voters
/// and a leader.
fn groups_ready(view: &Value, partitions: u32) -> bool {
    let groups = view["partitions"].as_array().map_or(&[][..], Vec::as_slice);
    let ready = groups.iter().filter(|group| {
        group["stream"] == STREAM
            && group["voters"].as_array().is_some_and(|voters| voters.len() == 3)
            && !group["leader"].is_null()
    });
    ready.count() == partitions as usize
}

/// The node leading partition `partition`, by index into `nodes`. The
/// nodes are asked one by one, so a leadership moving between two of them
/// (placement balances leaders once a stream is created) can be missed by
/// one pass: they are asked again for up to 5 s.
fn leader_of(nodes: &[&Node], partition: u32) -> usize {
    let leader = read_again_within(Duration::from_secs(5), || {
        nodes.iter().position(|node| {
            let view = cluster_of(&node.server);
            view["partitions"].as_array().is_some_and(|groups| {
                groups.iter().any(|group| {
                    group["stream"] == STREAM && group["partition"] == partition && group["leader_is_self"] == true
                })
            })
        })
    });
    leader.unwrap_or_else(|| panic!("no node leads partition {partition} (asked for 5 s)"))
}

/// `read` again every 20 ms until it gives something or `within` passed;
/// its last answer.
fn read_again_within<T>(within: Duration, mut read: impl FnMut() -> Option<T>) -> Option<T> {
    let started = Instant::now();
    loop {
        let answer = read();
        if answer.is_some() || started.elapsed() > within {
            return answer;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `count` events from `first` on, `#SYNC` every 50; every SYNC
/// must be answered OK (committed by a majority).
fn produce(server: &Server, first: u64, count: u64) {
    assert_eq!(produce_at(server.ingest, first, count), count);
}

/// [`produce`] to an ingest address; returns the events acknowledged.
fn produce_at(ingest: SocketAddr, first: u64, count: u64) -> u64 {
    let mut producer = common::Producer::connect(ingest);
    producer.send(format!("#STREAM {STREAM}\n").as_bytes());
    for index in first..first + count {
        producer.send(format!("key{} event-{index}\n", index % 7).as_bytes());
        if index % 50 == 49 {
            let replies = producer.sync();
            assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
        }
    }
    let replies = producer.sync();
    assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
    count
}

/// Starts three nodes (the second and third join through the first),
/// waits until all three see each other alive, creates the stream with
/// replication factor 3 through the first (the cluster's catalog takes it
/// to the others), and waits until every partition's group
/// has its 3 voters and a leader; returns them and the first's cluster
/// address (for a node joining later).
fn start_replicated_cluster(partitions: u32) -> (Vec<Node>, SocketAddr) {
    let (first, seed) = start_node(None);
    let (second, _) = start_node(Some(seed));
    let (third, _) = start_node(Some(seed));
    let nodes = vec![first, second, third];
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for(&all, READY_WITHIN, "three members alive", |view| {
        view["members"]
            .as_array()
            .is_some_and(|members| members.len() == 3 && members.iter().all(|member| member["state"] == "alive"))
    });
    let servers: Vec<&Server> = nodes.iter().map(|node| &node.server).collect();
    let spec = json!({ "name": STREAM, "partitions": partitions, "replication_factor": 3 });
    common::create_stream_in_cluster(&servers, spec, READY_WITHIN);
    wait_for(&all, READY_WITHIN, "every group with 3 voters and a leader", |view| groups_ready(view, partitions));
    (nodes, seed)
}

/// Three nodes, a stream of 2 partitions with replication factor 3: the
/// events a producer on one node got `OK SYNC` for are on all three
/// replicas at the same offsets; then a follower killed with kill -9 while
/// events keep coming is restarted and catches up to the same log.
#[test]
fn three_replicas_hold_the_same_committed_log_and_a_killed_follower_catches_up() {
    let (mut nodes, _) = start_replicated_cluster(PARTITIONS);
    let all: Vec<&Node> = nodes.iter().collect();
    let producer_node = leader_of(&all, 0);
    produce(&nodes[producer_node].server, 0, 1000);
    let committed = stream_ends_holding(&nodes[producer_node].server, STREAM, 1000, CATCH_UP_WITHIN);
    let expected = read_stream(&nodes[producer_node].server, STREAM, &committed);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(&node.server, STREAM, &committed, index, CATCH_UP_WITHIN);
        assert_eq!(read_stream(&node.server, STREAM, &committed), expected, "node {index}'s replica differs");
    }
    // kill -9 a follower (not the producer's node) while events keep coming.
    let victim = (producer_node + 1) % 3;
    let ingest = nodes[producer_node].server.ingest;
    let producing = std::thread::spawn(move || produce_at(ingest, 1000, UNDER_LOAD_EVENTS));
    std::thread::sleep(Duration::from_millis(200));
    assert!(!producing.is_finished(), "the producer finished before the kill: the kill was not under load");
    nodes[victim].server.crash();
    let acknowledged = producing.join().expect("the producer thread");
    assert_eq!(acknowledged, UNDER_LOAD_EVENTS, "every SYNC with one follower down is answered");
    nodes[victim].server.spawn();
    let committed =
        stream_ends_holding(&nodes[producer_node].server, STREAM, 1000 + UNDER_LOAD_EVENTS, CATCH_UP_WITHIN);
    let expected = read_stream(&nodes[producer_node].server, STREAM, &committed);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(&node.server, STREAM, &committed, index, CATCH_UP_WITHIN);
        assert_eq!(
            read_stream(&node.server, STREAM, &committed),
            expected,
            "node {index}'s replica differs after the restart"
        );
    }
}

/// Producer connections of the pipelining test, spread over the nodes.
const PIPELINED_CONNECTIONS: u64 = 6;
/// Events each of them sends, with a `#SYNC` written (not waited for)
/// after every [`PIPELINED_BURST`].
const PIPELINED_EVENTS: u64 = 12_000;
const PIPELINED_BURST: u64 = 1_500;
/// Keys per connection: each key's events must stay in their order.
const PIPELINED_KEYS: u64 = 5;

/// Pipelined proposals lose nothing and keep order: producers on all three
/// nodes send bursts with a `#SYNC` after each without waiting for it, so a
/// shard has many batches of a partition in flight at once (`GET /cluster`'s
/// `proposals_in_flight_max` above 1 shows it; a shard that waited for each
/// batch's commit had at most one per group); every `SYNC` is answered
/// OK, and every replica holds each event exactly once, at the same
/// offsets, in per-(connection, key) order.
#[test]
fn pipelined_batches_commit_once_in_order_at_the_same_offsets_on_every_replica() {
    let (nodes, _) = start_replicated_cluster(PARTITIONS);
    let producers: Vec<_> = (0..PIPELINED_CONNECTIONS)
        .map(|connection| {
            let ingest = nodes[connection as usize % 3].server.ingest;
            std::thread::spawn(move || produce_pipelined(ingest, connection))
        })
        .collect();
    for producer in producers {
        producer.join().expect("a producer thread");
    }
    let total = PIPELINED_CONNECTIONS * PIPELINED_EVENTS;
    let committed = stream_ends_holding(&nodes[0].server, STREAM, total, CATCH_UP_WITHIN);
    let expected = read_stream(&nodes[0].server, STREAM, &committed);
    check_once_in_order(&expected);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(&node.server, STREAM, &committed, index, CATCH_UP_WITHIN);
        assert_eq!(read_stream(&node.server, STREAM, &committed), expected, "node {index}'s replica differs");
    }
    let in_flight_max = nodes
        .iter()
        .flat_map(|node| cluster_of(&node.server)["partitions"].as_array().cloned().unwrap_or_default())
        .filter(|group| group["stream"] == STREAM)
        .filter_map(|group| group["proposals_in_flight_max"].as_u64())
        .max();
    assert!(
        in_flight_max.is_some_and(|max| max > 1),
        "no group ever had more than one proposal of a node in flight: {in_flight_max:?}"
    );
}

/// Sends [`PIPELINED_EVENTS`] events `c<connection>k<key> <sequence>`
/// with a `#SYNC` after every burst, reading the answers only at the end;
/// every one must be OK.
fn produce_pipelined(ingest: SocketAddr, connection: u64) {
    let mut producer = common::Producer::connect(ingest);
    producer.send(format!("#STREAM {STREAM}\n").as_bytes());
    let mut syncs_written = 0;
    for sequence in 0..PIPELINED_EVENTS {
        let key = sequence % PIPELINED_KEYS;
        producer.send(format!("c{connection}k{key} {sequence}\n").as_bytes());
        if sequence % PIPELINED_BURST == PIPELINED_BURST - 1 {
            producer.send(format!("#SYNC burst{sequence}\n").as_bytes());
            syncs_written += 1;
        }
    }
    let replies = producer.sync();
    assert!(replies.iter().all(|line| line.starts_with("OK")), "connection {connection}: {replies:?}");
    assert_eq!(replies.len(), syncs_written + 1, "connection {connection}: {replies:?}");
}

/// Every connection's events are in the log once each, and each key's in
/// the order they were sent.
fn check_once_in_order(read: &BTreeMap<u32, Vec<Delivered>>) {
    let mut last_by_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut count_by_connection: BTreeMap<String, u64> = BTreeMap::new();
    for event in read.values().flatten() {
        let key = String::from_utf8_lossy(&event.key).to_string();
        let sequence: u64 = String::from_utf8_lossy(&event.payload).parse().expect("a sequence payload");
        if let Some(last) = last_by_key.insert(event.key.clone(), sequence) {
            assert!(sequence > last, "key {key}: {sequence} at offset {} after {last}", event.offset);
        }
        let connection = key.split('k').next().unwrap_or_default().to_string();
        *count_by_connection.entry(connection).or_default() += 1;
    }
    assert_eq!(count_by_connection.len() as u64, PIPELINED_CONNECTIONS, "{count_by_connection:?}");
    for (connection, count) in count_by_connection {
        assert_eq!(count, PIPELINED_EVENTS, "connection {connection}: events stored");
    }
}

/// Partitions of the stream each burst spreads over: a batch then makes a
/// proposal for almost every partition.
const SPREAD_PARTITIONS: u32 = 256;
const SPREAD_EVENTS: u64 = 40_000;
/// Events between two `#SYNC`s.
const SPREAD_BURST: u64 = 200;
const SPREAD_KEYS: u64 = 1_000;
/// How long the whole run may take, every `#SYNC` answered (under a second
/// on a quiet box; before the shard waited for room in its queue to the
/// cluster thread, most answers took tens of seconds or never came).
const SPREAD_WITHIN: Duration = Duration::from_secs(30);

/// A producer whose bursts each touch almost all of 256 replicated
/// partitions, with a `#SYNC` after every burst and the answers read only
/// at the end, gets every `OK` within the bound, and every event is stored
/// once and in per-key order.
#[test]
fn syncs_of_bursts_spread_over_many_partitions_are_all_answered() {
    let (nodes, _) = start_replicated_cluster(SPREAD_PARTITIONS);
    let started = Instant::now();
    let mut producer = common::Producer::connect(nodes[0].server.ingest);
    producer.set_timeout(SPREAD_WITHIN);
    producer.send(format!("#STREAM {STREAM}\n").as_bytes());
    let mut syncs_written = 0;
    for sequence in 0..SPREAD_EVENTS {
        producer.send(format!("s{} {sequence}\n", sequence % SPREAD_KEYS).as_bytes());
        if sequence % SPREAD_BURST == SPREAD_BURST - 1 {
            producer.send(format!("#SYNC burst{sequence}\n").as_bytes());
            syncs_written += 1;
        }
    }
    let replies = producer.sync();
    let elapsed = started.elapsed();
    assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
    assert_eq!(replies.len(), syncs_written + 1, "{replies:?}");
    assert!(elapsed < SPREAD_WITHIN, "every #SYNC answered only after {elapsed:?}");
    let committed = stream_ends_holding(&nodes[0].server, STREAM, SPREAD_EVENTS, CATCH_UP_WITHIN);
    let mut last_by_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    for event in read_stream(&nodes[0].server, STREAM, &committed).values().flatten() {
        let sequence: u64 = String::from_utf8_lossy(&event.payload).parse().expect("a sequence payload");
        if let Some(last) = last_by_key.insert(event.key.clone(), sequence) {
            assert!(sequence > last, "key {:?}: {sequence} after {last}", String::from_utf8_lossy(&event.key));
        }
    }
    assert_eq!(last_by_key.len() as u64, SPREAD_KEYS, "keys stored");
}

/// Partitions of the stream replicated on two of three nodes.
const PARTIAL_PARTITIONS: u32 = 8;
/// Events each of the three producers sends to it.
const PARTIAL_EVENTS: u64 = 3_000;

/// Three nodes with [`STREAM`] of [`PARTIAL_PARTITIONS`] partitions at
/// replication factor 2, once all three are members.
fn start_partial_cluster() -> [Node; 3] {
    let (first, seed) = start_node(None);
    let (second, _) = start_node(Some(seed));
    let (third, _) = start_node(Some(seed));
    let nodes = [first, second, third];
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for(&all, READY_WITHIN, "three members alive", |view| {
        view["members"].as_array().is_some_and(|m| m.len() == 3)
    });
    let servers: Vec<&Server> = nodes.iter().map(|node| &node.server).collect();
    let spec = json!({ "name": STREAM, "partitions": PARTIAL_PARTITIONS, "replication_factor": 2 });
    common::create_stream_in_cluster(&servers, spec, READY_WITHIN);
    nodes
}

/// With replication factor 2 on three nodes every node lacks about a third
/// of the partitions, yet a producer on any node gets `OK` for every
/// `#SYNC` within seconds (its proposals go to the group's leader on
/// another node), and every partition's log, read from a node holding it,
/// has each connection's events once and in per-key order. A live
/// `SUB * earliest` subscriber on every node, started before the
/// producers, receives every partition's log whole, at its offsets, also
/// the partitions its node holds no replica of (its node mirrors them:
/// `replication::mirror`).
#[test]
fn a_producer_and_a_subscriber_on_a_node_without_a_replica_reach_the_partition() {
    let nodes = start_partial_cluster();
    let holders = |partition: u32| -> Vec<usize> {
        (0..nodes.len())
            .filter(|index| {
                let view = cluster_of(&nodes[*index].server);
                view["partitions"].as_array().is_some_and(|groups| {
                    groups.iter().any(|group| {
                        group["stream"] == STREAM
                            && group["partition"] == partition
                            && group["voters"].as_array().is_some_and(|voters| voters.len() == 2)
                            && !group["leader"].is_null()
                    })
                })
            })
            .collect()
    };
    let started = Instant::now();
    while !(0..PARTIAL_PARTITIONS).all(|partition| holders(partition).len() == 2) {
        assert!(started.elapsed() < READY_WITHIN, "groups with 2 voters and a leader: not within {READY_WITHIN:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (subscribers, targets): (Vec<_>, Vec<_>) = nodes
        .iter()
        .map(|node| {
            let (target, targets) = mpsc::channel();
            let subscribe = node.server.subscribe;
            (std::thread::spawn(move || subscribe_until(subscribe, targets)), target)
        })
        .unzip();
    let producers: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(connection, node)| {
            let ingest = node.server.ingest;
            std::thread::spawn(move || {
                let mut producer = common::Producer::connect(ingest);
                producer.set_timeout(Duration::from_secs(20));
                producer.send(format!("#STREAM {STREAM}\n").as_bytes());
                for sequence in 0..PARTIAL_EVENTS {
                    producer.send(format!("c{connection}k{} {sequence}\n", sequence % 16).as_bytes());
                    if sequence % 500 == 499 {
                        let replies = producer.sync();
                        assert!(
                            replies.iter().all(|line| line.starts_with("OK")),
                            "connection {connection}: {replies:?}"
                        );
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer.join().expect("every #SYNC answered OK");
    }
    let mut last_by_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut stored = 0;
    let mut logs = BTreeMap::new();
    for partition in 0..PARTIAL_PARTITIONS {
        let holder = &nodes[holders(partition)[0]].server;
        let end = stream_ends(holder, STREAM)[partition as usize];
        let log = read_partition(holder, partition, end);
        for event in &log {
            let sequence: u64 = String::from_utf8_lossy(&event.payload).parse().expect("a sequence payload");
            if let Some(last) = last_by_key.insert(event.key.clone(), sequence) {
                assert!(sequence > last, "key {:?}: {sequence} after {last}", String::from_utf8_lossy(&event.key));
            }
            stored += 1;
        }
        logs.insert(partition, log);
    }
    assert_eq!(stored, 3 * PARTIAL_EVENTS, "events stored once each over every partition");
    let ends: BTreeMap<u32, u64> = logs.iter().map(|(partition, log)| (*partition, log.len() as u64)).collect();
    let waited = Instant::now();
    for target in &targets {
        let _ = target.send(ends.clone());
    }
    for (index, subscriber) in subscribers.into_iter().enumerate() {
        let events = subscriber.join().expect("a subscriber");
        for (partition, log) in &logs {
            let held = holders(*partition).contains(&index);
            let got: Vec<&Delivered> = events.iter().filter(|event| event.partition == *partition).collect();
            assert_eq!(
                got.len(),
                log.len(),
                "subscriber on node {index}, partition {partition} (a replica here: {held}): events"
            );
            assert!(
                got.iter().zip(log).all(|(got, want)| *got == want),
                "subscriber on node {index}, partition {partition} (a replica here: {held}): not the log"
            );
        }
    }
    eprintln!("every subscriber had every partition {:?} after the producers ended", waited.elapsed());
    for (index, node) in nodes.iter().enumerate() {
        let mirrors = &cluster_of(&node.server)["replication"]["mirrors"];
        eprintln!("node {index} mirrors: {mirrors}");
    }
    // Consumer groups and aggregates are kept per node: on a replicated
    // stream they are refused with the reason, rather than run apart on
    // each node.
    let server = &nodes[1].server;
    let mut member = Subscriber::connect(server.subscribe, &format!("GROUP {STREAM} g earliest"));
    member.set_timeout(Duration::from_secs(5));
    let line = String::from_utf8_lossy(&member.next_line().expect("an answer to GROUP")).to_string();
    assert!(line.starts_with("ERR replicated_stream"), "{line}");
    let body = json!({"name": "n", "kind": "count", "window": {"type": "none"}});
    let (status, answer) = server.http("POST", &format!("/streams/{STREAM}/aggregates"), Some(&body));
    assert_eq!(status, 400, "{answer}");
    assert!(answer.starts_with("replicated_stream"), "{answer}");
    // A Kafka consumer group's offsets too (INVALID_TOPIC_EXCEPTION, 17),
    // on commit and on fetch; a stream of factor 1 takes them.
    let (commit, fetch) = kafka_offset_codes(server.ingest_kafka, STREAM);
    assert!(commit.len() == 2 && commit.iter().all(|code| *code == 17), "OffsetCommit: {commit:?}");
    assert!(fetch.len() == 2 && fetch.iter().all(|code| *code == 17), "OffsetFetch: {fetch:?}");
    let (commit, fetch) = kafka_offset_codes(server.ingest_kafka, "default");
    assert!(commit.iter().chain(&fetch).all(|code| *code == 0), "on a stream of factor 1: {commit:?} {fetch:?}");
}

/// The error codes of an OffsetCommit (v2, a manual-assignment commit:
/// generation -1, no member) of offset 1 for partitions 0 and 1 of `topic`
/// by group `kg`, then of an OffsetFetch (v1) of them, sent to a node's
/// Kafka listener over one connection.
fn kafka_offset_codes(kafka: SocketAddr, topic: &str) -> (Vec<i16>, Vec<i16>) {
    use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{
        ApiKey, GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
        RequestHeader, ResponseHeader, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
    use std::io::{Read, Write};

    fn call<Q: Encodable + HeaderVersion, A: Decodable + HeaderVersion>(
        connection: &mut std::net::TcpStream,
        key: ApiKey,
        version: i16,
        request: &Q,
    ) -> A {
        let mut frame = bytes::BytesMut::new();
        frame.extend_from_slice(&[0; 4]);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(7)
            .with_client_id(Some(StrBytes::from_static_str("replication-test")));
        header.encode(&mut frame, Q::header_version(version)).expect("the header encodes");
        request.encode(&mut frame, version).expect("the request encodes");
        let size = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        connection.write_all(&frame).expect("the request is sent");
        let mut size = [0u8; 4];
        connection.read_exact(&mut size).expect("a response");
        let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
        connection.read_exact(&mut body).expect("the response's body");
        let mut body = bytes::Bytes::from(body);
        let header = ResponseHeader::decode(&mut body, A::header_version(version)).expect("a response header");
        assert_eq!(header.correlation_id, 7);
        A::decode(&mut body, version).expect("the response decodes")
    }

    let mut connection = std::net::TcpStream::connect(kafka).expect("the Kafka listener");
    connection.set_read_timeout(Some(Duration::from_secs(10))).expect("a timeout");
    let name = TopicName(StrBytes::from_string(topic.to_string()));
    let partitions = (0..2)
        .map(|index| OffsetCommitRequestPartition::default().with_partition_index(index).with_committed_offset(1))
        .collect();
    let commit = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("kg")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default().with_name(name.clone()).with_partitions(partitions)]);
    let answer: OffsetCommitResponse = call(&mut connection, ApiKey::OffsetCommit, 2, &commit);
    let commit_codes = answer.topics.iter().flat_map(|topic| topic.partitions.iter().map(|p| p.error_code)).collect();
    let fetch = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("kg")))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default().with_name(name).with_partition_indexes(vec![0, 1])]));
    let answer: OffsetFetchResponse = call(&mut connection, ApiKey::OffsetFetch, 1, &fetch);
    let fetch_codes = answer.topics.iter().flat_map(|topic| topic.partitions.iter().map(|p| p.error_code)).collect();
    (commit_codes, fetch_codes)
}

/// On a node that holds no replica of a partition and never mirrored it
/// (its copy is empty), `SUB <p> latest` starts at the partition's end,
/// not at the copy's: it gets only the events produced after it
/// subscribed, at the replicas' offsets. An offset past the copy but
/// within the partition is served from there, and one past the
/// partition's end is refused (`replication::mirror`, "Where `latest`
/// is"). Before, `latest` resolved to the empty copy (every event of the
/// partition came) and the offset was refused as past the copy's end.
#[test]
fn latest_and_offsets_on_a_node_without_a_replica_are_the_partitions() {
    let nodes = start_partial_cluster();
    let holds = |index: usize, partition: u32| {
        cluster_of(&nodes[index].server)["partitions"].as_array().is_some_and(|groups| {
            groups.iter().any(|group| group["stream"] == STREAM && group["partition"] == partition)
        })
    };
    let settled = |partition: u32| (0..nodes.len()).filter(|index| holds(*index, partition)).count() == 2;
    let started = Instant::now();
    while !(0..PARTIAL_PARTITIONS).all(settled) {
        assert!(started.elapsed() < READY_WITHIN, "groups on 2 nodes each: not within {READY_WITHIN:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let partition = 0;
    let (outsider, holder) = {
        let outsider = (0..nodes.len()).find(|index| !holds(*index, partition)).expect("a node without partition 0");
        (outsider, (0..nodes.len()).find(|index| holds(*index, partition)).expect("a holder"))
    };
    let produce = |from: u64, count: u64| {
        let mut producer = common::Producer::connect(nodes[holder].server.ingest);
        producer.set_timeout(Duration::from_secs(20));
        producer.send(format!("#STREAM {STREAM}\n").as_bytes());
        for sequence in from..from + count {
            producer.send(format!("k{} {sequence}\n", sequence % 32).as_bytes());
        }
        let replies = producer.sync();
        assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
    };
    // Every partition's end, each read from a node that holds it.
    let ends = || -> Vec<u64> {
        (0..PARTIAL_PARTITIONS)
            .map(|each| {
                let index = (0..nodes.len()).find(|index| holds(*index, each)).expect("a holder");
                stream_ends(&nodes[index].server, STREAM)[each as usize]
            })
            .collect()
    };
    let wait_for_total = |total: u64| {
        let started = Instant::now();
        while ends().iter().sum::<u64>() < total {
            assert!(started.elapsed() < READY_WITHIN, "the holders did not get {total} events: {:?}", ends());
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    produce(0, 2_000);
    wait_for_total(2_000);
    let end = stream_ends(&nodes[holder].server, STREAM)[partition as usize];
    assert!(end > 10, "partition {partition} holds {end} events");
    let outsider_server = &nodes[outsider].server;
    assert_eq!(stream_ends(outsider_server, STREAM)[partition as usize], 0, "nothing mirrored before");
    // Past the node's (empty) copy, within the partition: served from there.
    let mut from_offset =
        Subscriber::connect(outsider_server.subscribe, &format!("SUB {STREAM} {partition} {}", end - 5));
    from_offset.set_timeout(Duration::from_secs(10));
    let tail = from_offset.take(5);
    let offsets: Vec<u64> = tail.iter().map(|event| event.offset).collect();
    assert_eq!(offsets, (end - 5..end).collect::<Vec<u64>>(), "{:?}", from_offset.notices);
    // `latest` on a fresh connection: only what comes after.
    let mut latest = Subscriber::connect(outsider_server.subscribe, &format!("SUB {STREAM} {partition} latest"));
    latest.set_timeout(Duration::from_secs(10));
    // The subscription resolves before the next events go in: wait until
    // the node's mirror (which `latest` waits for) holds the partition.
    let started = Instant::now();
    while stream_ends(outsider_server, STREAM)[partition as usize] < end {
        assert!(started.elapsed() < READY_WITHIN, "the mirror did not catch up");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    produce(2_000, 2_000);
    wait_for_total(4_000);
    let after = stream_ends(&nodes[holder].server, STREAM)[partition as usize];
    let fresh = latest.take((after - end) as usize);
    assert_eq!(fresh.first().map(|event| event.offset), Some(end), "latest started at the partition's end");
    assert_eq!(fresh.last().map(|event| event.offset), Some(after - 1));
    assert!(fresh.iter().all(|event| {
        String::from_utf8_lossy(&event.payload).parse::<u64>().is_ok_and(|sequence| sequence >= 2_000)
    }));
    // Past the partition's end: refused once the mirror has caught up.
    let mut past =
        Subscriber::connect(outsider_server.subscribe, &format!("SUB {STREAM} {partition} {}", after + 1_000));
    past.set_timeout(Duration::from_secs(10));
    let line = String::from_utf8_lossy(&past.next_line().expect("an answer")).to_string();
    assert!(line.starts_with(&format!("ERR offset_out_of_range {partition} {after}")), "{line}");
}

/// Partitions of the join test's stream (the goal is for 256;
/// 32 keep the test well under a minute on a loaded 2-core box while
/// still moving about 24 replicas and 8 leaderships to the newcomer).
const JOIN_PARTITIONS: u32 = 32;
/// How long the newcomer may take to lead its share and hold its replicas.
const SHARE_WITHIN: Duration = Duration::from_secs(30);
/// Producer connections of the join test, one per original node.
const JOIN_CONNECTIONS: u64 = 3;
/// Keys per connection (each key's events must stay in order).
const JOIN_KEYS: u64 = 8;
/// Events between two `#SYNC`s of a join-test producer.
const JOIN_SYNC_EVERY: u64 = 100;

/// What a join-test producer did: the events it sent (every one
/// acknowledged, since it ends with a `#SYNC` that must answer OK).
struct Produced {
    connection: u64,
    sent: u64,
}

/// Sends `c<connection>k<key> <sequence>` events with `#SYNC` every
/// [`JOIN_SYNC_EVERY`] (each must answer OK) until `stop` is set.
fn produce_until(ingest: SocketAddr, connection: u64, stop: Arc<AtomicBool>) -> Produced {
    let mut producer = common::Producer::connect(ingest);
    producer.send(format!("#STREAM {STREAM}\n").as_bytes());
    let mut sent = 0;
    while !stop.load(Ordering::Relaxed) || sent == 0 {
        for _ in 0..JOIN_SYNC_EVERY {
            producer.send(format!("c{connection}k{} {sent}\n", sent % JOIN_KEYS).as_bytes());
            sent += 1;
        }
        let replies = producer.sync();
        assert!(replies.iter().all(|line| line.starts_with("OK")), "connection {connection} at {sent}: {replies:?}");
    }
    Produced { connection, sent }
}

/// A `SUB <stream> * earliest` subscriber on its own thread, keeping every
/// event until `targets` says where each partition it must read in full
/// ends, and it got that far (or 30 s passed since: the check then says
/// what is missing).
fn subscribe_until(subscribe: SocketAddr, targets: mpsc::Receiver<BTreeMap<u32, u64>>) -> Vec<Delivered> {
    let mut subscriber = Subscriber::connect(subscribe, &format!("SUB {STREAM} * earliest"));
    subscriber.set_timeout(Duration::from_millis(500));
    let (mut events, mut next): (Vec<Delivered>, BTreeMap<u32, u64>) = (Vec::new(), BTreeMap::new());
    let mut wanted: Option<(BTreeMap<u32, u64>, Instant)> = None;
    loop {
        if let Ok(targets) = targets.try_recv() {
            wanted = Some((targets, Instant::now()));
        }
        if let Some((targets, since)) = &wanted {
            let reached = targets.iter().all(|(partition, end)| next.get(partition).copied().unwrap_or(0) >= *end);
            if reached || since.elapsed() > Duration::from_secs(30) {
                break;
            }
        }
        if let Some(event) = subscriber.next_event() {
            next.insert(event.partition, event.offset + 1);
            events.push(event);
        }
    }
    assert!(subscriber.notices.is_empty(), "subscriber: {:?}", subscriber.notices);
    events
}

/// This node's id as `/cluster` names it.
fn node_id(server: &Server) -> String {
    cluster_of(server)["node_id"].as_str().expect("node_id").to_string()
}

/// Per partition of the stream, its leader's view of the group (from the
/// node that leads it), if every partition has one.
fn leader_views(nodes: &[&Node], partitions: u32) -> Option<BTreeMap<u32, (usize, Value)>> {
    let mut views = BTreeMap::new();
    for (index, node) in nodes.iter().enumerate() {
        for group in cluster_of(&node.server)["partitions"].as_array().cloned().unwrap_or_default() {
            if group["stream"] == STREAM && group["leader_is_self"] == true {
                views.insert(group["partition"].as_u64()? as u32, (index, group));
            }
        }
    }
    (views.len() == partitions as usize).then_some(views)
}

/// How long a view of every partition's leader may take to be whole: the
/// views are read node by node, so a leadership moving between two of them
/// (placement rebalances leaders among the nodes left) can be missed by
/// one pass. Below the 1 s election timeout, so a group that needed an
/// election (its leader gone without a handover) is not waited for.
const TRANSFER_WITHIN: Duration = Duration::from_millis(800);

/// Whether every group is settled on `members` (ids): three voters, all
/// of them members, no learner, and each led by its node.
fn settled_on(views: &BTreeMap<u32, (usize, Value)>, members: &[String]) -> bool {
    views.values().all(|(_, group)| {
        let voters = group["voters"].as_array().map_or(&[][..], Vec::as_slice);
        voters.len() == 3
            && voters.iter().all(|voter| members.iter().any(|member| voter == member))
            && group["learners"].as_array().is_some_and(Vec::is_empty)
    })
}

/// Groups `id` leads and holds a vote in, among `views`.
fn share_of(views: &BTreeMap<u32, (usize, Value)>, nodes: &[&Node], id: &str) -> (usize, usize) {
    let index = nodes.iter().position(|node| node_id(&node.server) == id);
    let led = views.values().filter(|(leader, _)| Some(*leader) == index).count();
    let held = views
        .values()
        .filter(|(_, group)| group["voters"].as_array().is_some_and(|voters| voters.iter().any(|voter| voter == id)))
        .count();
    (led, held)
}

/// What placement gives node `id` among `members` (ids as `/cluster` names
/// them): the partitions it should lead (leaders balanced by count within
/// each group's desired replicas) and those whose rendezvous top 3 include
/// it (it should hold a vote).
fn placement_share(members: &[String], id: &str, partitions: u32) -> (usize, usize) {
    use spate::replication::placement::{Candidate, balanced_leaders};
    let replica =
        |text: &str| spate::replication::replica_id_of(spate::cluster::NodeId::parse(text).expect("a node id"));
    let candidates: Vec<Candidate> =
        members.iter().map(|member| Candidate { replica: replica(member), weight: 1.0 }).collect();
    let stream_id = spate::stream::group_stream_id(STREAM);
    let placed = balanced_leaders(stream_id, partitions, &candidates, 3);
    let first = placed.iter().filter(|desired| desired.preferred_leader() == Some(replica(id))).count();
    let top = placed.iter().filter(|desired| desired.contains(replica(id))).count();
    (first, top)
}

/// Reads partition `partition` of `server` from offset 0 up to `end`.
fn read_partition(server: &Server, partition: u32, end: u64) -> Vec<Delivered> {
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {STREAM} {partition} 0"));
    subscriber.set_timeout(Duration::from_secs(10));
    subscriber.take(end as usize)
}

/// The end checks of a membership change under load: every acknowledged
/// event is in the log once, in per-(connection, key) order; every voter
/// of a partition holds the same log at the same offsets; and what each
/// live subscriber saw of a partition is a prefix of that log, all of it
/// where its node is still a voter (a node that is not reads a partition
/// through a mirror only while a subscriber waits on it, so a prefix is
/// all that is promised there once the subscriber stops asking).
fn check_after_change(
    nodes: &[&Node],
    views: &BTreeMap<u32, (usize, Value)>,
    produced: &[Produced],
    seen: &[(usize, Vec<Delivered>)],
) {
    check_replicas_agree(nodes, views);
    let mut logs = BTreeMap::new();
    for (partition, (leader, _)) in views {
        let end = stream_ends(&nodes[*leader].server, STREAM)[*partition as usize];
        logs.insert(*partition, read_partition(&nodes[*leader].server, *partition, end));
    }
    let mut last_by_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut count_by_connection: BTreeMap<u64, u64> = BTreeMap::new();
    for event in logs.values().flatten() {
        let sequence: u64 = String::from_utf8_lossy(&event.payload).parse().expect("a sequence payload");
        if let Some(last) = last_by_key.insert(event.key.clone(), sequence) {
            assert!(
                sequence > last,
                "{:?}: {sequence} at offset {} after {last}; the nodes' proposal counters: {}",
                event.key,
                event.offset,
                proposal_counters(nodes)
            );
        }
        let key = String::from_utf8_lossy(&event.key).to_string();
        let connection = key[1..].split('k').next().and_then(|text| text.parse().ok()).expect("c<n>k<m>");
        *count_by_connection.entry(connection).or_default() += 1;
    }
    for producer in produced {
        let stored = count_by_connection.get(&producer.connection).copied().unwrap_or(0);
        assert_eq!(
            stored,
            producer.sent,
            "connection {}: events stored once each; the nodes' proposal counters: {}",
            producer.connection,
            proposal_counters(nodes)
        );
    }
    for (index, events) in seen {
        let id = node_id(&nodes[*index].server);
        for (partition, log) in &logs {
            let got: Vec<&Delivered> = events.iter().filter(|event| event.partition == *partition).collect();
            let voter = views[partition].1["voters"].as_array().is_some_and(|voters| voters.iter().any(|v| *v == id));
            assert!(got.len() <= log.len(), "subscriber on node {index}, partition {partition}: more than the log");
            assert!(
                got.iter().zip(log).all(|(got, want)| *got == want),
                "subscriber on node {index}, partition {partition}: not the log"
            );
            if voter {
                assert_eq!(
                    got.len(),
                    log.len(),
                    "subscriber on node {index}, a voter of partition {partition}: events missing"
                );
            }
        }
    }
}

/// Each node's counters of proposals sent again, refused, deduplicated
/// and timed out, for a failed order or count check to say which path
/// stored a proposal twice.
fn proposal_counters(nodes: &[&Node]) -> String {
    let names = [
        "spate_raft_proposals_retried_total",
        "spate_raft_proposals_deduplicated_total",
        "spate_raft_refusals_of_resent_total",
        "spate_replication_refusals_total",
    ];
    let per_node: Vec<String> = nodes
        .iter()
        .map(|node| {
            let counts: Vec<String> = names.iter().map(|name| format!("{}", node.server.metric(name))).collect();
            format!("[{}]", counts.join(", "))
        })
        .collect();
    format!("({}) per node: {}", names.join(", "), per_node.join(" "))
}

/// How long the leaving node may take from SIGTERM to exit: its handover
/// (a few seconds here; bounded at 30 s) and its drain.
const LEAVE_WITHIN: Duration = Duration::from_secs(45);

/// A fourth node joining three (RF 3, 32 partitions) under load takes its
/// share by itself: within 30 s it leads exactly the partitions placement
/// ranks it first for (about P/4: a binomial share, so P/4 ± 2 is not
/// promised at any P) and holds a vote in exactly those whose top 3 it is
/// in (about 3P/4), every group with 3 voters and no learner; meanwhile producers on the three first
/// nodes get every `#SYNC` answered OK, and afterwards every acknowledged
/// event is stored once in per-(connection, key) order, the voters of each
/// partition hold the same log, and live subscribers saw no gap or
/// duplicate. Then it leaves on SIGTERM, still under load: before it exits
/// (and says the handover is done) every group is back on the three first
/// nodes, with the same checks after (and the subscribers on the three,
/// voters of every partition again, saw every event).
#[test]
fn a_joining_node_takes_its_share_and_a_leaving_one_hands_it_back_under_load() {
    let (mut nodes, seed) = start_replicated_cluster(JOIN_PARTITIONS);
    let stop = Arc::new(AtomicBool::new(false));
    let (subscribers, targets): (Vec<_>, Vec<_>) = (0..3)
        .map(|index| {
            let (target, targets) = mpsc::channel();
            let subscribe = nodes[index].server.subscribe;
            (std::thread::spawn(move || (index, subscribe_until(subscribe, targets))), target)
        })
        .unzip();
    let producers: Vec<_> = (0..JOIN_CONNECTIONS)
        .map(|connection| {
            let (ingest, stop) = (nodes[connection as usize % 3].server.ingest, stop.clone());
            std::thread::spawn(move || produce_until(ingest, connection, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let (newcomer, _) = start_node(Some(seed));
    // The cluster's catalog gives it the stream.
    common::wait_until_listed(&[&newcomer.server], STREAM, true, READY_WITHIN);
    nodes.push(newcomer);
    let all: Vec<&Node> = nodes.iter().collect();
    let members: Vec<String> = all.iter().map(|node| node_id(&node.server)).collect();
    let started = Instant::now();
    let share = placement_share(&members, &members[3], JOIN_PARTITIONS);
    let views = loop {
        let views = leader_views(&all, JOIN_PARTITIONS);
        let now = views.as_ref().map(|views| share_of(views, &all, &members[3]));
        if let Some(views) = views.filter(|views| settled_on(views, &members) && now == Some(share)) {
            break views;
        }
        assert!(
            started.elapsed() < SHARE_WITHIN,
            "the newcomer has not taken its share (leads, holds) {share:?} within {SHARE_WITHIN:?}: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("the newcomer took its share (leads, holds) {share:?} of {JOIN_PARTITIONS} in {:?}", started.elapsed());
    check_replicas_agree(&all, &views);
    // Then it leaves on SIGTERM, still under load: its share must be back
    // on the three first nodes before it exits (no election needed).
    drop(all);
    let newcomer = nodes.pop().expect("the newcomer");
    let log_path = newcomer.server.log_path.clone();
    let (status, took) = newcomer.server.terminate_within(LEAVE_WITHIN).expect("the newcomer exits within the bound");
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(status.success(), "the newcomer's exit: {status:?}; log: {log}");
    assert!(log.contains("handed over in"), "the newcomer did not report its handover done; log: {log}");
    eprintln!("the newcomer handed its share over and exited {took:?} after SIGTERM");
    let firsts: Vec<&Node> = nodes.iter().collect();
    let views = read_again_within(TRANSFER_WITHIN, || leader_views(&firsts, JOIN_PARTITIONS))
        .expect("a leader for every partition as the newcomer exits");
    assert!(settled_on(&views, &members[..3]), "groups not back on the three first nodes: {views:#?}");
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let produced: Vec<Produced> = producers.into_iter().map(|producer| producer.join().expect("a producer")).collect();
    let views = read_again_within(TRANSFER_WITHIN, || leader_views(&firsts, JOIN_PARTITIONS))
        .expect("a leader for every partition");
    for (index, target) in targets.iter().enumerate() {
        let id = node_id(&firsts[index].server);
        let voter_of = views.iter().filter(|(_, (_, group))| {
            group["voters"].as_array().is_some_and(|voters| voters.iter().any(|voter| *voter == id))
        });
        let wanted: BTreeMap<u32, u64> = voter_of
            .map(|(partition, (leader, _))| {
                (*partition, stream_ends(&firsts[*leader].server, STREAM)[*partition as usize])
            })
            .collect();
        let _ = target.send(wanted);
    }
    let seen: Vec<(usize, Vec<Delivered>)> =
        subscribers.into_iter().map(|subscriber| subscriber.join().expect("a subscriber")).collect();
    check_after_change(&firsts, &views, &produced, &seen);
}

/// The voters of every partition hold the same committed log as its leader
/// (up to what the leader has now).
fn check_replicas_agree(nodes: &[&Node], views: &BTreeMap<u32, (usize, Value)>) {
    for (partition, (leader, group)) in views {
        let end = stream_ends(&nodes[*leader].server, STREAM)[*partition as usize];
        let log = read_partition(&nodes[*leader].server, *partition, end);
        for voter in group["voters"].as_array().cloned().unwrap_or_default() {
            let index = nodes.iter().position(|node| node_id(&node.server) == voter).expect("a voter is a node");
            let mut wanted = vec![0; *partition as usize + 1];
            wanted[*partition as usize] = end;
            wait_until_stream_holds(&nodes[index].server, STREAM, &wanted, index, CATCH_UP_WITHIN);
            assert_eq!(
                read_partition(&nodes[index].server, *partition, end),
                log,
                "partition {partition} on node {index}"
            );
        }
    }
}

/// How long SIGTERM may take on a node whose proposals cannot commit: the
/// handover gives up once the others are seen gone (kill -9 is detected
/// within 9 s for 3 nodes; 30 s at most), then the 2 s drain, then the
/// watchdog's 2 s, with margin for a loaded box.
const STUCK_EXIT_WITHIN: Duration = Duration::from_secs(40);

/// SIGTERM always ends a node, even one whose proposals cannot commit
/// (both other replicas killed, a producer's `#SYNC` waiting): it exits
/// within its bound, and its log shows the leave's handover step ended.
#[test]
fn sigterm_ends_a_node_whose_proposals_cannot_commit() {
    let (mut nodes, _) = start_replicated_cluster(PARTITIONS);
    produce(&nodes[0].server, 0, 100);
    nodes[1].server.crash();
    nodes[2].server.crash();
    let mut producer = common::Producer::connect(nodes[0].server.ingest);
    producer.send(format!("#STREAM {STREAM}\nkey1 stuck\nkey2 stuck\n#SYNC\n").as_bytes());
    producer.flush();
    std::thread::sleep(Duration::from_millis(500));
    let survivor = nodes.swap_remove(0);
    let log_path = survivor.server.log_path.clone();
    let stopped = survivor.server.terminate_within(STUCK_EXIT_WITHIN);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let Some((_, took)) = stopped else { panic!("still running {STUCK_EXIT_WITHIN:?} after SIGTERM; log: {log}") };
    eprintln!("the node with a stuck pipeline exited {took:?} after SIGTERM");
    let ended = ["handed over in", "no other live member", "gave up waiting"];
    assert!(ended.iter().any(|line| log.contains(line)), "the log does not show the handover step ended; log: {log}");
}

/// Partitions of the leader-kill test: each of the three nodes leads some.
const KILL_PARTITIONS: u32 = 6;
/// Events between two `#SYNC`s of a leader-kill producer.
const KILL_SYNC_EVERY: u64 = 50;

/// kill -9 of a node that leads partitions, under load, with producers on
/// the two other nodes: the surviving replicas elect new leaders by
/// themselves, every `#SYNC` is answered OK (the proposals the dead leader
/// took and never committed are proposed again), and after the victim's
/// restart every replica of every partition holds the same log, which has
/// every acknowledged event at least once (a retried proposal may be stored
/// twice: deduplication is the next issue's) and, for each key, its events
/// in the order they were sent once the duplicates are set aside.
#[test]
fn a_leader_killed_under_load_loses_nothing_acknowledged() {
    let (mut nodes, _) = start_replicated_cluster(KILL_PARTITIONS);
    let all: Vec<&Node> = nodes.iter().collect();
    let victim = leader_of(&all, 0);
    let led_by_victim = (0..KILL_PARTITIONS).filter(|partition| leader_of(&all, *partition) == victim).count();
    drop(all);
    let survivors: Vec<usize> = (0..3).filter(|index| *index != victim).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = survivors
        .iter()
        .map(|index| {
            let (ingest, stop, connection) = (nodes[*index].server.ingest, stop.clone(), *index as u64);
            std::thread::spawn(move || produce_through_a_kill(ingest, connection, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    nodes[victim].server.crash();
    let killed = Instant::now();
    eprintln!("killed node {victim}, the leader of {led_by_victim} of {KILL_PARTITIONS} partitions, under load");
    std::thread::sleep(Duration::from_secs(4));
    nodes[victim].server.spawn();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let produced: Vec<(u64, u64, Duration)> =
        producers.into_iter().map(|producer| producer.join().expect("every #SYNC answered OK")).collect();
    for (connection, sent, longest) in &produced {
        eprintln!("connection {connection}: {sent} events acknowledged, the longest #SYNC wait {longest:?}");
    }
    eprintln!("producers stopped {:?} after the kill", killed.elapsed());
    for index in &survivors {
        let server = &nodes[*index].server;
        eprintln!(
            "node {index}: {} proposals retried, {} found already in the leader's log",
            server.metric("spate_raft_proposals_retried_total"),
            server.metric("spate_raft_proposals_deduplicated_total")
        );
    }
    // Proposals the dead leader took are sent again once the election
    // names another (module doc of replication::node, "Retries"), not
    // after the 10 s proposal timeout.
    let longest = produced.iter().map(|(_, _, longest)| *longest).max().unwrap_or_default();
    assert!(longest < Duration::from_secs(5), "a #SYNC waited {longest:?} through the leader's death");
    let all: Vec<&Node> = nodes.iter().collect();
    let started = Instant::now();
    let views = loop {
        if let Some(views) = leader_views(&all, KILL_PARTITIONS).filter(|views| {
            views.values().all(|(_, group)| group["voters"].as_array().is_some_and(|voters| voters.len() == 3))
        }) {
            break views;
        }
        assert!(started.elapsed() < READY_WITHIN, "no leader with 3 voters for every partition after the restart");
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut logs = BTreeMap::new();
    for (partition, (leader, _)) in &views {
        let end = stream_ends(&all[*leader].server, STREAM)[*partition as usize];
        let log = read_partition(&all[*leader].server, *partition, end);
        for (index, node) in all.iter().enumerate() {
            let started = Instant::now();
            while stream_ends(&node.server, STREAM)[*partition as usize] < end {
                assert!(started.elapsed() < CATCH_UP_WITHIN, "node {index} did not catch up partition {partition}");
                std::thread::sleep(Duration::from_millis(100));
            }
            assert_eq!(read_partition(&node.server, *partition, end), log, "node {index}'s partition {partition}");
        }
        logs.insert(*partition, log);
    }
    // Every acknowledged event at least once; per key, in order once the
    // duplicates (a retried proposal stored again) are set aside.
    let mut seen: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    let mut last_by_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut duplicates = 0;
    for event in logs.values().flatten() {
        let sequence: u64 = String::from_utf8_lossy(&event.payload).parse().expect("a sequence payload");
        let key = String::from_utf8_lossy(&event.key).to_string();
        let connection: u64 = key[1..].split('k').next().and_then(|text| text.parse().ok()).expect("c<n>k<m>");
        let copies = seen.entry((connection, sequence)).or_default();
        *copies += 1;
        if *copies > 1 {
            duplicates += 1;
            continue;
        }
        if let Some(last) = last_by_key.insert(event.key.clone(), sequence) {
            assert!(sequence > last, "{key}: {sequence} at offset {} after {last}", event.offset);
        }
    }
    for (connection, sent, _) in &produced {
        let missing: Vec<u64> = (0..*sent).filter(|sequence| !seen.contains_key(&(*connection, *sequence))).collect();
        assert!(missing.is_empty(), "connection {connection}: {} acknowledged events lost: {missing:?}", missing.len());
    }
    eprintln!("every acknowledged event stored; {duplicates} stored twice by retries");
}

/// Sends `c<connection>k<key> <sequence>` events with a `#SYNC` every
/// [`KILL_SYNC_EVERY`], waiting for each (which must answer OK, however
/// long the election and the retries take), until `stop`; returns the
/// events acknowledged and the longest wait for a `#SYNC`.
fn produce_through_a_kill(ingest: SocketAddr, connection: u64, stop: Arc<AtomicBool>) -> (u64, u64, Duration) {
    let mut producer = common::Producer::connect(ingest);
    producer.set_timeout(Duration::from_secs(60));
    producer.send(format!("#STREAM {STREAM}\n").as_bytes());
    let (mut sent, mut longest) = (0, Duration::ZERO);
    while !stop.load(Ordering::Relaxed) || sent == 0 {
        for _ in 0..KILL_SYNC_EVERY {
            producer.send(format!("c{connection}k{} {sent}\n", sent % 8).as_bytes());
            sent += 1;
        }
        let started = Instant::now();
        let replies = producer.sync();
        longest = longest.max(started.elapsed());
        assert!(replies.iter().all(|line| line.starts_with("OK")), "connection {connection} at {sent}: {replies:?}");
    }
    (connection, sent, longest)
}
