//! The cluster's catalog on real `spate serve` processes on loopback: a
//! stream created or deleted through any node's admin API takes effect on
//! every node (one Raft group of catalog commands), a node killed with
//! kill -9 while the catalog changes learns the changes after its restart,
//! a node that joins later gets the whole catalog, and a change with no
//! majority reachable is answered 503 after a bounded wait.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Server, Subscriber};
use serde_json::{Value, json};

/// How long fresh nodes may take to see each other and elect leaders
/// (2-core box shared with builds).
const READY_WITHIN: Duration = Duration::from_secs(30);
/// How long a committed catalog change may take to reach every node.
const SPREAD_WITHIN: Duration = Duration::from_secs(15);
/// Events produced into the replicated stream.
const EVENTS: u64 = 2_000;

fn start_node(seed: Option<SocketAddr>) -> (Server, SocketAddr) {
    common::start_cluster_node(seed, "4", &["--shutdown-timeout-ms", "2000"])
}

fn cluster_of(server: &Server) -> Value {
    serde_json::from_str(&server.get("/cluster")).expect("/cluster is JSON")
}

/// Polls every server's `/cluster` until `ready` holds for all, or panics.
fn wait_for(servers: &[&Server], limit: Duration, what: &str, ready: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    loop {
        let views: Vec<Value> = servers.iter().map(|server| cluster_of(server)).collect();
        if views.iter().all(&ready) {
            return;
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}; views: {views:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn alive(count: usize) -> impl Fn(&Value) -> bool {
    move |view: &Value| {
        let members = view["members"].as_array().map_or(&[][..], Vec::as_slice);
        members.len() == count && members.iter().all(|member| member["state"] == "alive")
    }
}

/// Three nodes, the second and third joined through the first, all alive,
/// the catalog group with its three voters and a leader on each.
fn start_three() -> (Vec<Server>, SocketAddr) {
    let (first, seed) = start_node(None);
    let (second, _) = start_node(Some(seed));
    let (third, _) = start_node(Some(seed));
    let servers = vec![first, second, third];
    let all: Vec<&Server> = servers.iter().collect();
    wait_for(&all, READY_WITHIN, "three members alive", alive(3));
    wait_for(&all, READY_WITHIN, "the catalog group with 3 voters", groups_ready("(catalog)", 1, 3));
    (servers, seed)
}

/// Every partition of `stream` has a group with `voters` voters and a leader.
fn groups_ready(stream: &str, partitions: u32, voters: usize) -> impl Fn(&Value) -> bool {
    move |view: &Value| {
        let groups = view["partitions"].as_array().map_or(&[][..], Vec::as_slice);
        let ready = groups.iter().filter(|group| {
            group["stream"] == stream
                && group["voters"].as_array().is_some_and(|listed| listed.len() == voters)
                && !group["leader"].is_null()
        });
        ready.count() == partitions as usize
    }
}

/// Sends `count` events to `stream` on `server`, `#SYNC` every 100; every
/// SYNC must be answered OK (committed by a majority).
fn produce(server: &Server, stream: &str, prefix: &str, count: u64) {
    let mut producer = common::Producer::connect(server.ingest);
    producer.set_timeout(Duration::from_secs(30));
    producer.send(format!("#STREAM {stream}\n").as_bytes());
    for index in 0..count {
        producer.send(format!("key{} {prefix}-{index}\n", index % 11).as_bytes());
        if index % 100 == 99 {
            let replies = producer.sync();
            assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
        }
    }
    let replies = producer.sync();
    assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
}

/// Three nodes: an RF 3 stream created on the second only exists on all
/// three (and an ingest on the second right after its `201` is taken);
/// events produced with `#SYNC` on the first all reach a subscriber on the
/// third; a create of the same name with other settings is refused; and a
/// delete on the third removes the stream from all three.
#[test]
fn a_stream_created_on_one_node_exists_on_every_node_and_a_delete_anywhere_removes_it() {
    let (servers, _) = start_three();
    let all: Vec<&Server> = servers.iter().collect();
    let started = Instant::now();
    servers[1].create_stream(json!({ "name": "orders", "partitions": 2, "replication_factor": 3 }));
    eprintln!("POST /streams on node 1 answered in {:?}", started.elapsed());
    // Applied on the node that answered before its answer: an ingest there
    // right away finds the stream (its first SYNC waits for the groups).
    produce(&servers[1], "orders", "early", 10);
    common::wait_until_listed(&all, "orders", true, SPREAD_WITHIN);
    eprintln!("every node lists the stream {:?} after the POST", started.elapsed());
    for server in &servers {
        let listed = &server.streams()["orders"];
        assert_eq!((listed["partitions"].as_u64(), listed["replication_factor"].as_u64()), (Some(2), Some(3)));
    }
    wait_for(&all, READY_WITHIN, "both groups with 3 voters and a leader", groups_ready("orders", 2, 3));
    let mut subscriber = Subscriber::connect(servers[2].subscribe, "SUB orders * 0");
    subscriber.set_timeout(Duration::from_secs(30));
    produce(&servers[0], "orders", "event", EVENTS);
    let got: Vec<Vec<u8>> = subscriber.take(EVENTS as usize + 10).into_iter().map(|event| event.payload).collect();
    let seen: BTreeSet<Vec<u8>> = got.iter().cloned().collect();
    assert_eq!(seen.len(), got.len(), "the subscriber on node 2 got an event twice");
    let early = (0..10).map(|index| format!("early-{index}"));
    let expected: BTreeSet<Vec<u8>> =
        (0..EVENTS).map(|index| format!("event-{index}")).chain(early).map(String::into_bytes).collect();
    assert_eq!(seen, expected, "the subscriber on node 2 saw every event");

    let (status, body) = servers[0].http(
        "POST",
        "/streams",
        Some(&json!({ "name": "orders", "partitions": 3, "replication_factor": 3 })),
    );
    assert_eq!(status, 409, "a create of an existing name is refused: {body}");

    let started = Instant::now();
    servers[0].create_stream(json!({ "name": "second", "partitions": 1 }));
    let answered = started.elapsed();
    common::wait_until_listed(&all, "second", true, SPREAD_WITHIN);
    eprintln!(
        "an RF 1 create on node 0: answered in {answered:?}, on every node {:?} after the POST",
        started.elapsed()
    );
    let (status, body) = servers[2].http("DELETE", "/streams/orders", None);
    assert_eq!(status, 200, "DELETE on node 2: {body}");
    assert!(!servers[2].streams().contains_key("orders"), "gone on the node that answered");
    common::wait_until_listed(&all, "orders", false, SPREAD_WITHIN);
    let mut gone = Subscriber::connect(servers[0].subscribe, "SUB orders 0 0");
    assert!(gone.next_event().is_none(), "a subscriber of the deleted stream on node 0 is refused");
    // Every node applied the same catalog entries.
    let indexes: Vec<u64> =
        all.iter().map(|server| cluster_of(server)["catalog"]["applied_index"].as_u64().unwrap_or(0)).collect();
    assert!(indexes.iter().all(|index| *index == indexes[0] && *index > 0), "catalog indexes {indexes:?}");
}

/// A node killed with kill -9 while a stream is created and another is
/// deleted elsewhere has both changes after its restart, and takes ingest
/// into the new (RF 3) stream with every `#SYNC` answered.
#[test]
fn a_node_killed_while_the_catalog_changes_learns_the_changes_after_its_restart() {
    let (mut servers, _) = start_three();
    servers[0].create_stream(json!({ "name": "old", "partitions": 1 }));
    common::wait_until_listed(&servers.iter().collect::<Vec<_>>(), "old", true, SPREAD_WITHIN);
    servers[2].crash();
    servers[1].create_stream(json!({ "name": "late", "partitions": 2, "replication_factor": 3 }));
    let (status, body) = servers[0].http("DELETE", "/streams/old", None);
    assert_eq!(status, 200, "DELETE with one node down: {body}");
    servers[2].spawn();
    let all: Vec<&Server> = servers.iter().collect();
    common::wait_until_listed(&all, "late", true, READY_WITHIN);
    common::wait_until_listed(&all, "old", false, SPREAD_WITHIN);
    wait_for(&all, READY_WITHIN, "both groups with 3 voters and a leader", groups_ready("late", 2, 3));
    produce(&servers[2], "late", "event", 500);
}

/// A fourth node that joins after streams were created and one deleted
/// lists exactly the streams that exist, with their settings, applied up to
/// the same catalog entry as the others, and produces into the RF 3 one.
#[test]
fn a_node_that_joins_later_has_the_whole_catalog() {
    let (mut servers, seed) = start_three();
    servers[0].create_stream(json!({ "name": "kept", "partitions": 2, "replication_factor": 3 }));
    servers[1].create_stream(json!({ "name": "local", "partitions": 3, "retention_ms": 60000 }));
    servers[2].create_stream(json!({ "name": "dropped", "partitions": 1 }));
    let (status, body) = servers[0].http("DELETE", "/streams/dropped", None);
    assert_eq!(status, 200, "{body}");
    let (newcomer, _) = start_node(Some(seed));
    servers.push(newcomer);
    let all: Vec<&Server> = servers.iter().collect();
    common::wait_until_listed(&all, "kept", true, READY_WITHIN);
    common::wait_until_listed(&all, "local", true, SPREAD_WITHIN);
    common::wait_until_listed(&all, "dropped", false, SPREAD_WITHIN);
    let listed = &servers[3].streams()["local"];
    assert_eq!((listed["partitions"].as_u64(), listed["retention_ms"].as_u64()), (Some(3), Some(60_000)));
    let applied = |server: &Server| cluster_of(server)["catalog"]["applied_index"].as_u64().unwrap_or(0);
    let started = Instant::now();
    while applied(&servers[3]) != applied(&servers[0]) {
        assert!(started.elapsed() < SPREAD_WITHIN, "{} != {}", applied(&servers[3]), applied(&servers[0]));
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_for(&all, READY_WITHIN, "four members alive", alive(4));
    produce(&servers[3], "kept", "event", 500);
}

/// With two of three nodes killed, a create on the survivor is answered
/// `503 no_quorum` after the bounded wait, not left hanging, and is not
/// applied.
#[test]
fn a_change_with_no_majority_reachable_is_answered_503_in_bounded_time() {
    let (mut servers, _) = start_three();
    servers[0].create_stream(json!({ "name": "first", "partitions": 1 }));
    servers[1].crash();
    servers[2].crash();
    let started = Instant::now();
    let (status, body) = servers[0].http("POST", "/streams", Some(&json!({ "name": "orphan", "partitions": 1 })));
    let took = started.elapsed();
    eprintln!("answered {status} after {took:?}: {body}");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("no_quorum"), "{body}");
    // The bound: `spate::admin::replicated::COMMIT_TIMEOUT_MS` (20 s).
    assert!(took >= Duration::from_secs(19) && took < Duration::from_secs(25), "answered after {took:?}");
    assert!(!servers[0].streams().contains_key("orphan"));
}
