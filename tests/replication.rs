//! Replicated streams on three real `spate serve` processes on loopback:
//! a stream with `"replication_factor": 3` is a Raft group per partition
//! whose committed events are in every replica's log at the same offsets,
//! and a follower killed with kill -9 under load catches up after a restart.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Delivered, Server, Subscriber};
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
    let (server, cluster) = common::start_cluster_node(seed, "4", &[]);
    (Node { server }, cluster)
}

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

/// Every partition of the stream has a group with three voters and a leader.
fn groups_ready(view: &Value) -> bool {
    let groups = view["partitions"].as_array().map_or(&[][..], Vec::as_slice);
    let ready = groups.iter().filter(|group| {
        group["stream"] == STREAM
            && group["voters"].as_array().is_some_and(|voters| voters.len() == 3)
            && !group["leader"].is_null()
    });
    ready.count() == PARTITIONS as usize
}

/// The node leading partition `partition`, by index into `nodes`.
fn leader_of(nodes: &[&Node], partition: u32) -> usize {
    nodes
        .iter()
        .position(|node| {
            let view = cluster_of(&node.server);
            view["partitions"].as_array().is_some_and(|groups| {
                groups.iter().any(|group| {
                    group["stream"] == STREAM && group["partition"] == partition && group["leader_is_self"] == true
                })
            })
        })
        .expect("a leader")
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

/// Every event of every partition of the stream a node's subscriber reads
/// from offset 0, up to the offsets in `ends`.
fn read_all(server: &Server, ends: &[u64]) -> BTreeMap<u32, Vec<Delivered>> {
    let mut read = BTreeMap::new();
    for (partition, &end) in ends.iter().enumerate() {
        let partition = partition as u32;
        let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {STREAM} {partition} 0"));
        subscriber.set_timeout(Duration::from_secs(10));
        read.insert(partition, subscriber.take(end as usize));
    }
    read
}

/// The next offset of every partition of the stream on `server`.
fn ends(server: &Server) -> Vec<u64> {
    let streams = server.streams();
    let offsets = streams[STREAM]["next_offsets"].as_array().expect("next_offsets").clone();
    offsets.iter().map(|offset| offset.as_u64().unwrap_or(0)).collect()
}

/// Starts three nodes (the second and third join through the first),
/// waits until all three see each other alive, creates the stream with
/// replication factor 3 on each, and waits until every partition's group
/// has its 3 voters and a leader.
fn start_replicated_cluster() -> Vec<Node> {
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
    for node in &nodes {
        node.server.create_stream(json!({ "name": STREAM, "partitions": PARTITIONS, "replication_factor": 3 }));
    }
    wait_for(&all, READY_WITHIN, "every group with 3 voters and a leader", groups_ready);
    nodes
}

/// Three nodes, a stream of 2 partitions with replication factor 3: the
/// events a producer on one node got `OK SYNC` for are on all three
/// replicas at the same offsets; then a follower killed with kill -9 while
/// events keep coming is restarted and catches up to the same log.
#[test]
fn three_replicas_hold_the_same_committed_log_and_a_killed_follower_catches_up() {
    let mut nodes = start_replicated_cluster();
    let all: Vec<&Node> = nodes.iter().collect();
    let producer_node = leader_of(&all, 0);
    produce(&nodes[producer_node].server, 0, 1000);
    let committed = ends(&nodes[producer_node].server);
    assert_eq!(committed.iter().sum::<u64>(), 1000, "offsets on the producing node: {committed:?}");
    let expected = read_all(&nodes[producer_node].server, &committed);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_holds(&node.server, &committed, index);
        assert_eq!(read_all(&node.server, &committed), expected, "node {index}'s replica differs");
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
    let committed = ends(&nodes[producer_node].server);
    assert_eq!(committed.iter().sum::<u64>(), 1000 + UNDER_LOAD_EVENTS, "offsets on the producing node: {committed:?}");
    let expected = read_all(&nodes[producer_node].server, &committed);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_holds(&node.server, &committed, index);
        assert_eq!(read_all(&node.server, &committed), expected, "node {index}'s replica differs after the restart");
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
    let nodes = start_replicated_cluster();
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
    let committed = ends(&nodes[0].server);
    assert_eq!(committed.iter().sum::<u64>(), total, "offsets on node 0: {committed:?}");
    let expected = read_all(&nodes[0].server, &committed);
    check_once_in_order(&expected);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_holds(&node.server, &committed, index);
        assert_eq!(read_all(&node.server, &committed), expected, "node {index}'s replica differs");
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

/// Waits until `server`'s partitions hold at least `ends` events.
fn wait_until_holds(server: &Server, ends_wanted: &[u64], index: usize) {
    let started = Instant::now();
    loop {
        let now = ends(server);
        if now.iter().zip(ends_wanted).all(|(have, want)| have >= want) {
            return;
        }
        assert!(
            started.elapsed() < CATCH_UP_WITHIN,
            "node {index} holds {now:?}, not {ends_wanted:?}, after {CATCH_UP_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
