//! Several `spate serve` processes on loopback forming one cluster: joining
//! through a seed, load gossip, a kill -9 detected, a SIGTERM seen as a
//! leave, a restart rejoining with a higher incarnation, and a single node
//! that stays a cluster of one.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::Value;

/// How long a killed member of a three-node cluster may take to be down on
/// the others: the bound of `cluster::membership`'s doc for 3 nodes (5
/// probe periods of 1 s + 3 s of suspicion + gossip, under 9 s) with slack
/// for a 2-core box shared with builds.
const DOWN_WITHIN: Duration = Duration::from_secs(15);
/// How long a member that left on SIGTERM may take to be seen as left.
const LEFT_WITHIN: Duration = Duration::from_secs(3);
/// How long three fresh nodes may take to see each other alive.
const JOIN_WITHIN: Duration = Duration::from_secs(15);

/// A cluster node: the server and its cluster address.
struct Node {
    server: Server,
    cluster: SocketAddr,
}

/// Starts a node gossiping on a free loopback port, joining through `seed`
/// when given; `extra` are more flags.
fn start_node(seed: Option<SocketAddr>, extra: &[&str]) -> Node {
    let (server, cluster) = common::start_cluster_node(seed, "16", extra);
    Node { server, cluster }
}

/// Three nodes: the first is the seed the other two join through.
fn start_three(extra: &[&str]) -> Vec<Node> {
    let seed = start_node(None, extra);
    let seed_address = seed.cluster;
    vec![seed, start_node(Some(seed_address), extra), start_node(Some(seed_address), extra)]
}

fn cluster_of(server: &Server) -> Value {
    serde_json::from_str(&server.get("/cluster")).expect("/cluster is JSON")
}

/// The member with cluster address `cluster` in `view`, if listed.
fn member(view: &Value, cluster: SocketAddr) -> Option<&Value> {
    let address = cluster.to_string();
    view["members"].as_array()?.iter().find(|member| member["addresses"]["cluster"] == address.as_str())
}

/// Polls until `ready` holds for every node's `/cluster`, or panics after
/// `limit` with the last views; returns how long it took.
fn wait_for(nodes: &[&Node], limit: Duration, what: &str, ready: impl Fn(&Value) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        let views: Vec<Value> = nodes.iter().map(|node| cluster_of(&node.server)).collect();
        if views.iter().all(&ready) {
            return started.elapsed();
        }
        if started.elapsed() > limit {
            panic!("{what}: not within {limit:?}; views: {views:#?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn all_alive(count: usize) -> impl Fn(&Value) -> bool {
    move |view: &Value| {
        let members = view["members"].as_array().map_or(&[][..], Vec::as_slice);
        members.len() == count && members.iter().all(|member| member["state"] == "alive")
    }
}

/// Three nodes joined through one seed each list all three alive, with
/// every address of every member, and the load of the node that takes
/// ingest shows its events on the other nodes.
#[test]
fn three_nodes_join_through_one_seed_and_gossip_their_load() {
    let nodes = start_three(&["--storage", "memory"]);
    let all: Vec<&Node> = nodes.iter().collect();
    let with_loads = |view: &Value| {
        all_alive(3)(view)
            && view["members"]
                .as_array()
                .is_some_and(|members| members.iter().all(|member| member["load"]["partitions_owned"] == 16))
    };
    let took = wait_for(&all, JOIN_WITHIN, "three alive members with their loads", with_loads);
    eprintln!("three nodes saw each other alive with their loads after {took:?}");
    for observer in &nodes {
        let view = cluster_of(&observer.server);
        assert_eq!(view["gossip"], true);
        for node in &nodes {
            let seen = member(&view, node.cluster).expect("every node lists every member");
            let addresses = &seen["addresses"];
            let server = &node.server;
            assert_eq!(addresses["ingest"], server.ingest.to_string());
            assert_eq!(addresses["ingest_json"], server.ingest_json.to_string());
            assert_eq!(addresses["ingest_ilp"], server.ingest_ilp.to_string());
            assert_eq!(addresses["subscribe"], server.subscribe.to_string());
            assert_eq!(addresses["admin"], server.admin.to_string());
            assert_eq!(seen["incarnation"], 1);
            assert_eq!(seen["self"], std::ptr::eq(node, observer));
            assert_eq!(seen["load"]["partitions_owned"], 16, "{seen}");
        }
    }
    // Ingest on the second node only, for a few seconds.
    let loaded = &nodes[1];
    let mut producer = loaded.server.producer();
    let payload = "x".repeat(64);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut busy_seen = false;
    while started.elapsed() < Duration::from_secs(20) && !busy_seen {
        let mut chunk = String::with_capacity(1000 * 80);
        for index in 0..1000 {
            chunk.push_str(&format!("key{} {payload}\n", sent + index));
        }
        producer.send(chunk.as_bytes());
        producer.flush();
        sent += 1000;
        std::thread::sleep(Duration::from_millis(5));
        if sent.is_multiple_of(50_000) {
            busy_seen = [&nodes[0], &nodes[2]].iter().all(|observer| {
                let view = cluster_of(&observer.server);
                member(&view, loaded.cluster).is_some_and(|seen| seen["load"]["events_per_s"].as_f64() > Some(1000.0))
            });
        }
    }
    producer.sync();
    assert!(busy_seen, "the loaded node's events/s never showed on the other nodes ({sent} events sent)");
    let view = cluster_of(&nodes[0].server);
    let idle = member(&view, nodes[2].cluster).unwrap();
    assert_eq!(idle["load"]["events_per_s"], 0.0, "the idle node's load is its own: {idle}");
}

/// A node killed with SIGKILL is down on both others within the bound, and
/// the others stay alive.
#[test]
fn a_killed_node_is_down_on_the_others_within_the_bound() {
    let mut nodes = start_three(&["--storage", "memory"]);
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for(&all, JOIN_WITHIN, "three alive members", all_alive(3));
    let victim = nodes.remove(2);
    let victim_cluster = victim.cluster;
    victim.server.kill9();
    let survivors: Vec<&Node> = nodes.iter().collect();
    let took = wait_for(&survivors, DOWN_WITHIN, "the killed node down", |view| {
        member(view, victim_cluster).is_some_and(|seen| seen["state"] == "down") && view["counts"]["alive"] == 2
    });
    eprintln!("a node killed with SIGKILL was down on both others after {took:?}");
    assert_eq!(nodes[0].server.metric("spate_cluster_members{state=\"down\"}"), 1.0);
    assert_eq!(nodes[0].server.metric("spate_cluster_members{state=\"alive\"}"), 2.0);
}

/// A node stopped with SIGTERM says goodbye: the others list it as left
/// (not down) within a moment, without waiting for a failed probe.
#[test]
fn a_terminated_node_is_seen_left_promptly() {
    let mut nodes = start_three(&["--storage", "memory"]);
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for(&all, JOIN_WITHIN, "three alive members", all_alive(3));
    let leaving = nodes.remove(1);
    let leaving_cluster = leaving.cluster;
    let status = leaving.server.terminate();
    assert!(status.success(), "{status}");
    let survivors: Vec<&Node> = nodes.iter().collect();
    let took = wait_for(&survivors, LEFT_WITHIN, "the terminated node left", |view| {
        member(view, leaving_cluster).is_some_and(|seen| seen["state"] == "left")
    });
    eprintln!("a node stopped with SIGTERM was seen left after {took:?} (from its exit)");
}

/// A node restarted after a kill -9 keeps its id (from its data directory)
/// and comes back with the next incarnation, alive on every node.
#[test]
fn a_restarted_node_rejoins_with_a_higher_incarnation() {
    let mut nodes = start_three(&["--storage", "disk"]);
    let all: Vec<&Node> = nodes.iter().collect();
    wait_for(&all, JOIN_WITHIN, "three alive members", all_alive(3));
    let restarted_cluster = nodes[2].cluster;
    let own = cluster_of(&nodes[2].server);
    let node_id = member(&own, restarted_cluster).unwrap()["node_id"].clone();
    assert_eq!(member(&own, restarted_cluster).unwrap()["incarnation"], 1);
    nodes[2].server.crash();
    nodes[2].server.spawn();
    let all: Vec<&Node> = nodes.iter().collect();
    let took = wait_for(&all, JOIN_WITHIN, "the restarted node alive again", |view| {
        member(view, restarted_cluster)
            .is_some_and(|seen| seen["state"] == "alive" && seen["incarnation"] == 2 && seen["node_id"] == node_id)
            && view["counts"]["alive"] == 3
    });
    eprintln!("a restarted node was alive at incarnation 2 everywhere after {took:?}");
}

/// A node started without --join or --cluster is a cluster of one: it
/// serves as before, binds no cluster port and lists only itself.
#[test]
fn a_single_node_is_a_cluster_of_one() {
    let server = Server::start(&["--shards", "1", "--partitions", "16", "--storage", "memory"]);
    let mut producer = server.producer();
    producer.send(b"k1 hello\nk2 world\n");
    producer.sync();
    let view = cluster_of(&server);
    assert_eq!(view["gossip"], false);
    let members = view["members"].as_array().unwrap();
    assert_eq!(members.len(), 1, "{view}");
    let me = &members[0];
    assert_eq!((me["self"].as_bool(), me["state"].as_str()), (Some(true), Some("alive")));
    assert_eq!(me["addresses"]["cluster"], Value::Null);
    assert_eq!(me["addresses"]["ingest"], server.ingest.to_string());
    assert_eq!(server.metric("spate_cluster_members{state=\"alive\"}"), 1.0);
    let log = server.log();
    assert!(log.contains("a cluster of one"), "{log}");
    assert!(!log.contains("cluster gossip on udp"), "{log}");
}

/// The CPUs the shard threads of `server` (and the helper threads they
/// start, which inherit their affinity) may run on, as the kernel lists
/// them (`Cpus_allowed_list`), once each.
fn shard_cpus(server: &Server) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{}/task", server.pid())).unwrap();
    let mut cpus = Vec::new();
    for task in tasks.flatten() {
        let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !name.starts_with("spate-shard") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let allowed = status.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:"));
        cpus.push(allowed.unwrap_or_default().trim().to_string());
    }
    cpus.sort();
    cpus.dedup();
    cpus
}

/// Nodes on one machine do not stack their shards on the same CPUs:
/// `--cpus` pins each node where it says, and `--cpus auto` with another
/// spate server running leaves the shards unpinned (and says so).
#[test]
fn nodes_on_one_machine_place_their_shards_apart() {
    let first = Server::start(&["--shards", "1", "--partitions", "4", "--storage", "memory", "--cpus", "0"]);
    assert_eq!(shard_cpus(&first), ["0"], "{}", first.log());
    let auto = Server::start(&["--shards", "1", "--partitions", "4", "--storage", "memory"]);
    let log = auto.log();
    assert!(log.contains("unpinned: another spate server"), "{log}");
    let all = std::fs::read_to_string("/proc/self/status").unwrap();
    let all = all.lines().find_map(|line| line.strip_prefix("Cpus_allowed_list:")).unwrap().trim().to_string();
    assert_eq!(shard_cpus(&auto), [all], "an unpinned shard may run anywhere this process may");
    let cpus = std::thread::available_parallelism().map_or(1, |count| count.get());
    if cpus > 1 {
        let second = Server::start(&["--shards", "1", "--partitions", "4", "--storage", "memory", "--cpus", "1"]);
        assert_eq!(shard_cpus(&second), ["1"], "{}", second.log());
    }
}
