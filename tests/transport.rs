//! The internode transport between real `spate serve` processes on
//! loopback: nodes that join link to each other and ping over TCP, a node
//! killed with kill -9 is seen unreachable and relinked after its restart,
//! a slow receiver holds its sender to the credit window with bounded
//! memory, and a stranger speaking another protocol version is refused by
//! name.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::Server;
use serde_json::Value;

/// How long joined nodes may take to link and see a pong.
const LINKED_WITHIN: Duration = Duration::from_secs(20);

struct Node {
    server: Server,
    cluster: SocketAddr,
}

fn start_node(seed: Option<SocketAddr>, extra: &[&str]) -> Node {
    let (server, cluster) = common::start_cluster_node(seed, "4", extra);
    Node { server, cluster }
}

/// This node's transport link to the peer at `cluster`, if it has one.
fn link_to(node: &Node, cluster: SocketAddr) -> Option<Value> {
    let view: Value = serde_json::from_str(&node.server.get("/cluster")).expect("/cluster is JSON");
    let address = cluster.to_string();
    view["transport"].as_array()?.iter().find(|peer| peer["address"] == address.as_str()).cloned()
}

/// Polls `node`'s link to `peer` until `ready` holds, or panics with it.
fn wait_link(node: &Node, peer: &Node, limit: Duration, what: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let started = Instant::now();
    loop {
        let link = link_to(node, peer.cluster);
        if let Some(link) = link.as_ref().filter(|link| ready(link)) {
            return link.clone();
        }
        assert!(started.elapsed() < limit, "{what}: not within {limit:?}; link: {link:#?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn number(link: &Value, field: &str) -> u64 {
    link[field].as_u64().unwrap_or_else(|| panic!("{field} in {link:#}"))
}

/// Two joined nodes link both ways and ping each other over the transport
/// (a round trip shown per peer); after a kill -9 the survivor sees the
/// peer unreachable, and once it restarts (same id, same port) the link
/// comes back by itself, counted as a reconnect, and pings flow again.
#[test]
fn nodes_ping_over_the_transport_and_relink_after_kill_9() {
    let first = start_node(None, &[]);
    let mut second = start_node(Some(first.cluster), &[]);
    let pinged = |link: &Value| link["state"] == "connected" && link["pongs_received"].as_u64() >= Some(2);
    for (node, peer) in [(&first, &second), (&second, &first)] {
        let link = wait_link(node, peer, LINKED_WITHIN, "a link with pongs", pinged);
        let rtt_us = number(&link, "rtt_us");
        eprintln!("ping round trip {rtt_us} µs; link {link:#}");
        assert!(rtt_us < 500_000, "a loopback round trip of {rtt_us} µs");
        assert!(number(&link, "frames_received") >= 2, "pings and pongs arrive: {link:#}");
        assert!(number(&link, "bytes_sent") >= 2 * 22);
    }
    let metrics = first.server.get("/metrics");
    assert!(metrics.contains("spate_transport_rtt_seconds{peer="), "{metrics}");
    second.server.crash();
    let down = wait_link(&first, &second, Duration::from_secs(10), "the killed peer unreachable", |link| {
        link["state"] == "unreachable" && link["connect_failures"].as_u64() >= Some(1)
    });
    eprintln!("after kill -9: {down:#}");
    let pongs_before = number(&down, "pongs_received");
    second.server.spawn();
    let back = wait_link(&first, &second, LINKED_WITHIN, "the restarted peer relinked", |link| {
        link["state"] == "connected"
            && link["reconnects"].as_u64() >= Some(1)
            && link["pongs_received"].as_u64() > Some(pongs_before)
    });
    eprintln!("after the restart: {back:#}");
    wait_link(&second, &first, LINKED_WITHIN, "the restarted node links back", pinged);
}

/// A node that floods a slow receiver (it releases 64 KiB every 64 ms,
/// about 1 MiB/s) is held to the credit window: the sender stalls on
/// credits and its callers wait, it sends no more than what the receiver
/// consumed plus the window and the queue, and neither process's memory
/// grows with the backlog.
#[test]
fn a_slow_receiver_holds_its_sender_to_the_credit_window() {
    let receiver = start_node(None, &["--transport-test-receive-us-per-kib", "1000"]);
    let sender = start_node(Some(receiver.cluster), &["--transport-test-flood"]);
    wait_link(&sender, &receiver, LINKED_WITHIN, "the flood's link", |link| link["state"] == "connected");
    let rss_start = [rss_bytes(&sender.server), rss_bytes(&receiver.server)];
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(6));
    let link = link_to(&sender, receiver.cluster).expect("linked");
    let elapsed = started.elapsed().as_secs_f64();
    let sent = number(&link, "bytes_sent");
    eprintln!("sender after {elapsed:.1} s: {link:#}");
    assert!(number(&link, "credit_stalls") >= 1, "the sender ran out of credit: {link:#}");
    assert!(number(&link, "sender_waits") >= 1, "the flood's sends waited: {link:#}");
    assert!(number(&link, "queued_bytes") <= 2 * 1024 * 1024, "the queue is bounded: {link:#}");
    // Consumed: at most 1 MiB/s since the link came up (plus the time to
    // link); in flight: the 4 MiB window. Without credits it would be GBs.
    let allowed = (elapsed + 10.0) * 1024.0 * 1024.0 + 4.0 * 1024.0 * 1024.0;
    assert!((sent as f64) < allowed, "{sent} bytes sent, past {allowed} consumed + window");
    let rss_end = [rss_bytes(&sender.server), rss_bytes(&receiver.server)];
    for (start, end) in rss_start.iter().zip(rss_end) {
        assert!(end < start + 64 * 1024 * 1024, "memory grew from {start} to {end} bytes");
    }
}

/// A node with a fast receiver moves the flood at full speed (a
/// measurement printed for the README, asserting only that it flows
/// without credit errors).
#[test]
fn the_flood_between_two_nodes_flows_at_speed() {
    let receiver = start_node(None, &[]);
    let sender = start_node(Some(receiver.cluster), &["--transport-test-flood"]);
    let first = wait_link(&sender, &receiver, LINKED_WITHIN, "the flood's link", |link| {
        link["state"] == "connected" && link["bulk_sent"].as_u64() > Some(0)
    });
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let last = link_to(&sender, receiver.cluster).expect("linked");
    let bytes = number(&last, "bytes_sent") - number(&first, "bytes_sent");
    let writes = number(&last, "writes") - number(&first, "writes");
    let rate = bytes as f64 / started.elapsed().as_secs_f64();
    eprintln!("flood: {:.0} MB/s, {writes} writes; link {last:#}", rate / 1e6);
    assert!(rate > 10e6, "the transport moved only {rate} bytes/s");
    assert_eq!(last["state"], "connected", "no credit error dropped the link: {last:#}");
    assert_eq!(number(&last, "reconnects"), 0, "{last:#}");
}

/// A client that speaks another transport protocol version is refused
/// with a frame naming both versions, and a stranger (not a spate
/// handshake) is refused too; the node keeps serving.
#[test]
fn a_mismatched_handshake_is_refused_by_name() {
    let node = start_node(None, &[]);
    let mut hello = Vec::new();
    hello.extend_from_slice(&43u32.to_le_bytes());
    hello.push(1);
    hello.extend_from_slice(b"spate-tp");
    hello.extend_from_slice(&99u16.to_le_bytes());
    hello.extend_from_slice(&[0u8; 32]);
    let refusal = exchange(node.cluster, &hello);
    assert!(refusal.contains("version 99 is not this node's 1"), "{refusal:?}");
    let refusal = exchange(node.cluster, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(refusal.contains("undecodable") || refusal.is_empty(), "{refusal:?}");
    assert!(node.server.log().contains("refused a connection"), "the refusal is logged");
    let view: Value = serde_json::from_str(&node.server.get("/cluster")).unwrap();
    assert_eq!(view["gossip"], true);
}

/// Sends `bytes` to the transport port and reads what comes back until the
/// node closes the connection.
fn exchange(address: SocketAddr, bytes: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).expect("the transport listens on the cluster port");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream.write_all(bytes).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).into_owned()
}

fn rss_bytes(server: &Server) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}
