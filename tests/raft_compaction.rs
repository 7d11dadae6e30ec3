//! Raft log compaction on three real `spate serve` processes on loopback,
//! each with a small `--raft-log-bytes-max`: a replicated stream takes
//! several times that bound and keeps answering every `#SYNC` OK (an
//! uncompacted log would refuse proposals once full and never answer), the
//! replicas hold the same records at the same offsets, and a node killed
//! with kill -9 after compaction comes back with nothing acknowledged lost.
//! A node that was down while the others compacted past everything it had
//! gets a snapshot, fetches the records it lacks from a peer's partition log
//! and ends up with every record at the same offsets.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Delivered, Server, read_stream, stream_ends, stream_ends_holding, wait_until_stream_holds};
use serde_json::{Value, json};

const STREAM: &str = "compacted";
const PARTITIONS: u32 = 2;
/// The Raft store's bound on every node: 2 MiB of entries.
const RAFT_LOG_BYTES_MAX: u64 = 2 << 20;
/// Events sent: about 230 bytes of entry each, so 12 MiB in all, six
/// times the bound.
const EVENTS: u64 = 48_000;
/// A `#SYNC` after every this many events.
const SYNC_EVERY: u64 = 500;
const PAYLOAD_BYTES: usize = 200;
const READY_WITHIN: Duration = Duration::from_secs(30);
const CATCH_UP_WITHIN: Duration = Duration::from_secs(60);
/// A node killed with kill -9 is down on the others within 9 s (README,
/// "Membership"); its groups' leaders replace it soon after.
const REMOVED_WITHIN: Duration = Duration::from_secs(60);

fn start_node(seed: Option<SocketAddr>, extra: &[&str]) -> (Server, SocketAddr) {
    let bound = RAFT_LOG_BYTES_MAX.to_string();
    let mut flags = vec!["--raft-log-bytes-max", &bound];
    flags.extend(extra);
    common::start_cluster_node(seed, "4", &flags)
}

fn cluster_of(server: &Server) -> Value {
    serde_json::from_str(&server.get("/cluster")).expect("/cluster is JSON")
}

fn wait_for(nodes: &[Server], limit: Duration, what: &str, ready: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    loop {
        let views: Vec<Value> = nodes.iter().map(cluster_of).collect();
        if views.iter().all(&ready) {
            return;
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}; views: {views:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn groups_ready(view: &Value) -> bool {
    let groups = view["partitions"].as_array().map_or(&[][..], Vec::as_slice);
    let ready = groups.iter().filter(|group| {
        group["stream"] == STREAM
            && group["voters"].as_array().is_some_and(|voters| voters.len() == 3)
            && !group["leader"].is_null()
    });
    ready.count() == PARTITIONS as usize
}

/// Three nodes joined, the RF 3 stream on each, every group with its
/// voters and a leader.
fn start_cluster() -> Vec<Server> {
    start_cluster_with(&[])
}

/// [`start_cluster`] with `extra` flags on every node.
fn start_cluster_with(extra: &[&str]) -> Vec<Server> {
    let (first, seed) = start_node(None, extra);
    let (second, _) = start_node(Some(seed), extra);
    let (third, _) = start_node(Some(seed), extra);
    let nodes = vec![first, second, third];
    wait_for(&nodes, READY_WITHIN, "three members alive", |view| {
        view["members"]
            .as_array()
            .is_some_and(|members| members.len() == 3 && members.iter().all(|member| member["state"] == "alive"))
    });
    let servers: Vec<&Server> = nodes.iter().collect();
    let spec = json!({ "name": STREAM, "partitions": PARTITIONS, "replication_factor": 3 });
    common::create_stream_in_cluster(&servers, spec, READY_WITHIN);
    wait_for(&nodes, READY_WITHIN, "every group with 3 voters and a leader", groups_ready);
    nodes
}

/// Sends `count` events from `first` on to `ingest`, `#SYNC` every
/// [`SYNC_EVERY`]; every SYNC must be answered OK.
fn produce(ingest: SocketAddr, first: u64, count: u64) {
    let padding = "x".repeat(PAYLOAD_BYTES);
    let mut producer = common::Producer::connect(ingest);
    producer.send(format!("#STREAM {STREAM}\n").as_bytes());
    for index in first..first + count {
        producer.send(format!("key{} {index:08} {padding}\n", index % 7).as_bytes());
        if index % SYNC_EVERY == SYNC_EVERY - 1 {
            let replies = producer.sync();
            assert!(replies.iter().all(|line| line.starts_with("OK")), "event {index}: {replies:?}");
        }
    }
    let replies = producer.sync();
    assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
}

/// Every event `0..total` is in `read` exactly once.
fn check_each_once(read: &BTreeMap<u32, Vec<Delivered>>, total: u64) {
    let mut seen: Vec<u64> = read
        .values()
        .flatten()
        .map(|event| {
            let payload = String::from_utf8_lossy(&event.payload).to_string();
            payload.split(' ').next().and_then(|index| index.parse().ok()).expect("an indexed payload")
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen.len() as u64, total, "events stored");
    assert!(seen.iter().copied().eq(0..total), "every event once");
}

/// Every node holds the committed log of node `reference`, record for
/// record at the same offsets, and it holds each of `total` events once.
fn check_replicas_agree(nodes: &[Server], reference: usize, total: u64) {
    let committed = stream_ends_holding(&nodes[reference], STREAM, total, CATCH_UP_WITHIN);
    let expected = read_stream(&nodes[reference], STREAM, &committed);
    check_each_once(&expected, total);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(node, STREAM, &committed, index, CATCH_UP_WITHIN);
        assert_eq!(read_stream(node, STREAM, &committed), expected, "node {index}'s replica differs");
    }
}

/// A store with every group's log compacted stays below its bound: entries
/// held under `--raft-log-bytes-max`, `raft.log` below 4x it.
fn check_store_bounded(node: &Server, index: usize) {
    assert!(node.metric("spate_raft_log_compactions_total") > 0.0, "node {index} never compacted");
    let held = node.metric("spate_raft_log_entry_bytes");
    assert!(held < RAFT_LOG_BYTES_MAX as f64, "node {index} holds {held} bytes of entries");
    let file = node.data_dir.join("replication").join("raft.log");
    let file_bytes = std::fs::metadata(&file).map(|metadata| metadata.len()).unwrap_or(0);
    assert!(file_bytes < 4 * RAFT_LOG_BYTES_MAX, "node {index}'s raft.log is {file_bytes} bytes");
}

/// A 3-node RF 3 stream takes six times the nodes' `--raft-log-bytes-max`
/// with every `#SYNC` answered OK: entries applied and durable in their
/// partition are compacted away (without it, the store fills after a sixth
/// and the next `#SYNC` is never answered), every replica holds every event
/// once at the same offsets, and each store stays within its bound.
#[test]
fn a_replicated_stream_takes_several_times_the_raft_log_bound() {
    let nodes = start_cluster();
    let producers: Vec<_> = (0..3u64)
        .map(|node| {
            let ingest = nodes[node as usize].ingest;
            std::thread::spawn(move || produce(ingest, node * EVENTS / 3, EVENTS / 3))
        })
        .collect();
    for producer in producers {
        producer.join().expect("a producer thread");
    }
    check_replicas_agree(&nodes, 0, EVENTS);
    for (index, node) in nodes.iter().enumerate() {
        check_store_bounded(node, index);
        assert_eq!(node.metric("spate_raft_log_full_refusals_total"), 0.0, "node {index} refused proposals");
    }
}

/// kill -9 of a node after its log was compacted loses nothing
/// acknowledged: it restarts from its partition logs and the Raft log past
/// the compaction point, takes more events, and every replica then holds
/// every event exactly once at the same offsets.
#[test]
fn a_node_killed_after_compaction_restarts_with_nothing_acknowledged_lost() {
    let mut nodes = start_cluster();
    produce(nodes[0].ingest, 0, EVENTS / 2);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(node, STREAM, &stream_ends(&nodes[0], STREAM), index, CATCH_UP_WITHIN);
    }
    let victim = 1;
    assert!(nodes[victim].metric("spate_raft_log_compactions_total") > 0.0, "compacted before the kill");
    nodes[victim].crash();
    nodes[victim].spawn();
    wait_for(&nodes, READY_WITHIN, "every group with 3 voters and a leader after the restart", groups_ready);
    produce(nodes[victim].ingest, EVENTS / 2, EVENTS / 2);
    check_replicas_agree(&nodes, 0, EVENTS);
    check_store_bounded(&nodes[victim], victim);
}

/// Waits until every group on `survivors` has two voters: the killed
/// third node was seen down and removed.
fn wait_until_removed(survivors: &[Server]) {
    wait_for(survivors, REMOVED_WITHIN, "the victim removed from every group", |view| {
        let groups = view["partitions"].as_array().map_or(&[][..], Vec::as_slice);
        let two_voters = groups.iter().filter(|group| {
            group["stream"] == STREAM && group["voters"].as_array().is_some_and(|voters| voters.len() == 2)
        });
        two_voters.count() == PARTITIONS as usize
    });
}

/// A node killed with kill -9 while the others compact their Raft logs past
/// everything it has gets a snapshot on its restart, fetches the records
/// its partitions lack from a peer (module doc of
/// `src/replication/catchup.rs`), and ends up holding every event at the
/// same offsets as the others; without the fetch its delivery waits
/// forever and its partitions never get past where they were.
#[test]
fn a_node_behind_the_compaction_point_fetches_the_gap_from_a_peer() {
    let mut nodes = start_cluster();
    let first_batch = EVENTS / 8;
    produce(nodes[0].ingest, 0, first_batch);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(node, STREAM, &stream_ends(&nodes[0], STREAM), index, CATCH_UP_WITHIN);
    }
    let victim = 2;
    let before = stream_ends(&nodes[victim], STREAM);
    nodes[victim].crash();
    // Seen down and replaced in every group before the others write and
    // compact: it comes back as a new learner, so the snapshot it gets
    // must name it in its configuration (the compaction point's does not).
    wait_until_removed(&nodes[..victim]);
    // Six times the Raft log's bound while the victim is down: the others
    // compact past everything it has.
    produce(nodes[0].ingest, first_batch, EVENTS);
    let total = first_batch + EVENTS;
    let compacted_from = nodes[0].metric("spate_raft_log_compactions_total");
    assert!(compacted_from > 0.0, "node 0 compacted while the victim was down");
    let files_read = |nodes: &[Server]| -> f64 {
        nodes[..victim].iter().map(|node| node.metric("spate_storage_read_bytes_total")).sum()
    };
    let files_read_before = files_read(&nodes);
    let restarted = Instant::now();
    nodes[victim].spawn();
    wait_for(&nodes, READY_WITHIN, "every group with 3 voters and a leader after the restart", groups_ready);
    wait_until_stream_holds(&nodes[victim], STREAM, &stream_ends(&nodes[0], STREAM), victim, CATCH_UP_WITHIN);
    let caught_up = restarted.elapsed();
    // No subscriber has read yet: what the peers read from their files
    // was for the gap (past their 256 KiB tail cache per partition).
    let files_read_for_gaps = files_read(&nodes) - files_read_before;
    check_replicas_agree(&nodes, 0, total);
    let gaps = nodes[victim].metric("spate_raft_partition_gaps_total");
    let fetched = nodes[victim].metric("spate_raft_gap_records_fetched_total");
    let fetched_bytes = nodes[victim].metric("spate_raft_gap_bytes_fetched_total");
    let snapshots = nodes[victim].metric("spate_raft_snapshots_installed_total");
    eprintln!(
        "victim: ends before the kill {before:?}, {snapshots} snapshots installed, {gaps} gap deliveries held, \
         {fetched} records ({fetched_bytes} bytes) fetched for gaps; ends now {:?}; the peers read \
         {files_read_for_gaps} bytes of segment files for it; caught up {caught_up:?} after its restart",
        stream_ends(&nodes[victim], STREAM)
    );
    assert!(gaps > 0.0, "the victim's partitions were behind a snapshot (ends before the kill: {before:?})");
    assert!(fetched > 0.0 && fetched_bytes > fetched, "the victim fetched {fetched} records ({fetched_bytes} bytes)");
    assert_eq!(nodes[victim].metric("spate_raft_gaps_open"), 0.0, "no gap left open");
    let served: f64 = nodes[..victim].iter().map(|node| node.metric("spate_raft_gap_reads_served_total")).sum();
    assert!(served > 0.0, "the peers served the gap reads");
    assert!(files_read_for_gaps > 0.0, "the peers read the gap from their segment files");
}

/// A gap no peer can fill, because every peer's retention deleted its
/// records, is said so: the fetching node counts the answers
/// (`spate_raft_gap_peer_lacked_total`), logs it naming the offsets, and
/// keeps the gap open (`spate_raft_gaps_open`) rather than start its
/// partition past a hole.
#[test]
fn a_gap_the_peers_retention_deleted_is_counted_and_logged() {
    // 1 MiB segments, 2 MiB kept per partition: the peers keep about the
    // last 9 000 of each partition's 25 000 events.
    let mut nodes = start_cluster_with(&["--segment-bytes", "1048576", "--retention-bytes", "2097152"]);
    let first_batch = EVENTS / 8;
    produce(nodes[0].ingest, 0, first_batch);
    for (index, node) in nodes.iter().enumerate() {
        wait_until_stream_holds(node, STREAM, &stream_ends(&nodes[0], STREAM), index, CATCH_UP_WITHIN);
    }
    let victim = 2;
    let victim_ends = stream_ends(&nodes[victim], STREAM);
    nodes[victim].crash();
    wait_until_removed(&nodes[..victim]);
    produce(nodes[0].ingest, first_batch, EVENTS);
    // Retention runs once a second: restarted before it deleted what the
    // victim lacks, the victim would fetch it and never hear "lacked".
    let started = Instant::now();
    while !nodes[..victim].iter().all(|node| deleted_through(node, &victim_ends)) {
        assert!(started.elapsed() < CATCH_UP_WITHIN, "the peers' retention did not delete the victim's gap");
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes[victim].spawn();
    let started = Instant::now();
    let lacked = loop {
        let lacked = nodes[victim].metric("spate_raft_gap_peer_lacked_total");
        if lacked > 0.0 {
            break lacked;
        }
        assert!(started.elapsed() < CATCH_UP_WITHIN, "no peer said it lacks the records: {}", nodes[victim].log());
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = nodes[victim].log();
    assert!(log.contains("(retention deleted them)"), "logged: {log}");
    assert!(nodes[victim].metric("spate_raft_gaps_open") > 0.0, "the gap stays open");
    eprintln!("the victim's peers lacked the records {lacked} times");
}

/// Whether every partition of [`STREAM`] on `node` starts past `ends` (its
/// retention deleted everything before them).
fn deleted_through(node: &Server, ends: &[u64]) -> bool {
    let listed: serde_json::Value = serde_json::from_str(&node.get("/partitions")).unwrap();
    let partitions = listed["partitions"].as_array().unwrap();
    ends.iter().enumerate().all(|(index, end)| {
        partitions.iter().any(|info| {
            info["stream"] == STREAM
                && info["stream_partition"] == index as u64
                && info["earliest_offset"].as_u64().is_some_and(|earliest| earliest > *end)
        })
    })
}
