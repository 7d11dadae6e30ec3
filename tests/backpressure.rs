//! Credit-based backpressure, end to end: overload turns into TCP
//! backpressure with bounded memory and no loss, and one stalled shard does
//! not stall connections that never write to it.

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Server, Subscriber};
use spate::protocol::partition_of;

const PAYLOAD_SIZE: usize = 4000;

/// Server flags that make the memory bound small enough to mean something.
const BOUNDED: &[&str] = &[
    // The bound counts retention as memory: this test is about memory.
    "--storage",
    "memory",
    "--shards",
    "2",
    "--partitions",
    "64",
    "--retention-bytes",
    "4194304",
    "--segment-bytes",
    "1048576",
    "--connections-per-shard-max",
    "64",
    "--subscribers-per-shard-max",
    "4",
];

/// One producer: `bytes_total` of `k<i> <connection> <seq> <padding>` lines
/// as fast as the socket takes them, then #SYNC. Returns the events and
/// bytes sent once the OK is in.
fn produce(address: std::net::SocketAddr, connection: usize, bytes_total: usize, keys: usize) -> (u64, usize) {
    let mut producer = common::Producer::connect(address);
    let mut sequences = vec![0u64; keys];
    let mut chunk = Vec::with_capacity(1 << 20);
    let (mut sent_bytes, mut events) = (0usize, 0u64);
    while sent_bytes < bytes_total {
        chunk.clear();
        while chunk.len() < (1 << 20) - PAYLOAD_SIZE - 64 {
            let key = (events as usize * 7 + connection) % keys;
            let head = format!("k{key} {connection} {} ", sequences[key]);
            sequences[key] += 1;
            chunk.extend_from_slice(head.as_bytes());
            chunk.resize(chunk.len() + PAYLOAD_SIZE - head.len(), b'.');
            chunk.push(b'\n');
            events += 1;
        }
        producer.send(&chunk);
        sent_bytes += chunk.len();
    }
    let replies = producer.sync();
    assert_eq!(replies.len(), 1, "{replies:?}");
    (events, sent_bytes)
}

/// Runs `connections` producers; returns the events sent and the aggregate
/// rate: all bytes over the wall time until the last one's `#SYNC` came
/// back (a sum of per-connection rates would overstate it whenever one
/// connection finishes early).
fn produce_all(server: &Server, connections: usize, bytes_per_connection: usize) -> (u64, f64) {
    let address = server.ingest;
    let started = Instant::now();
    let threads: Vec<_> = (0..connections)
        .map(|connection| std::thread::spawn(move || produce(address, connection, bytes_per_connection, 500)))
        .collect();
    let results: Vec<(u64, usize)> = threads.into_iter().map(|thread| thread.join().unwrap()).collect();
    let bytes: usize = results.iter().map(|r| r.1).sum();
    (results.iter().map(|r| r.0).sum(), bytes as f64 / started.elapsed().as_secs_f64())
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kib.unwrap_or(0) * 1024
}

/// Producers push 2 GiB as fast as they can into a server whose apply stage
/// is made ~10x slower than an unthrottled run measured in the same test.
/// The server's RSS (sampled, and its kernel-reported peak) stays under the
/// configured memory bound, the producers are pushed back to the apply rate
/// (stall metrics > 0, write rate far below the unthrottled one), and the
/// subscriber receives every event exactly once and in order.
#[test]
fn overload_becomes_backpressure_with_bounded_memory() {
    // Baseline in the same run: the same producers, no apply delay.
    let baseline = Server::start(BOUNDED);
    let (_, rate_unthrottled) = produce_all(&baseline, 2, 200 << 20);
    drop(baseline);

    // Make the apply stage ~8x slower than the unthrottled run just
    // measured (at most ~200 MB/s: 2 shards * 1e9/40_000 events/s * 4 KB),
    // so the ratio holds on a slower or busier machine too.
    let apply_target_bytes_per_s = (rate_unthrottled / 8.0).min(200e6);
    let delay_ns = (2.0 * 1e9 * (PAYLOAD_SIZE + 1) as f64 / apply_target_bytes_per_s).max(40_000.0) as u64;
    let mut args = BOUNDED.to_vec();
    let delay = delay_ns.to_string();
    args.extend(["--apply-delay-ns-per-event", &delay]);
    let server = Server::start(&args);
    let bound = server.stats()["memory_bound"]["total"].as_u64().unwrap();
    let pid = server.pid();
    let done = Arc::new(AtomicBool::new(false));
    let rss_max = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (done, rss_max) = (done.clone(), rss_max.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                rss_max.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let subscribe_address = server.subscribe;
    let events_seen = Arc::new(AtomicU64::new(0));
    let subscriber = {
        let events_seen = events_seen.clone();
        std::thread::spawn(move || {
            let mut subscriber = Subscriber::connect(subscribe_address, "SUB * earliest");
            let mut next: HashMap<(Vec<u8>, u64), u64> = HashMap::new();
            while let Some(event) = subscriber.next_event() {
                let mut fields = event.payload.split(|&byte| byte == b' ');
                let connection: u64 = std::str::from_utf8(fields.next().unwrap()).unwrap().parse().unwrap();
                let sequence: u64 = std::str::from_utf8(fields.next().unwrap()).unwrap().parse().unwrap();
                let expected = next.entry((event.key, connection)).or_insert(0);
                assert_eq!(sequence, *expected, "order per (connection, key)");
                *expected += 1;
                if events_seen.fetch_add(1, Ordering::Relaxed) + 1 == u64::MAX {
                    break;
                }
            }
            subscriber.notices
        })
    };
    let started = Instant::now();
    // About 7 s of apply, and always at least twice the memory bound.
    let bytes_per_connection = ((apply_target_bytes_per_s * 3.5) as usize).clamp(512 << 20, 1 << 30);
    let (events_sent, rate_throttled) = produce_all(&server, 2, bytes_per_connection);
    let elapsed = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(60);
    while events_seen.load(Ordering::Relaxed) < events_sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let stats = server.stats();
    let rss_peak = stats["process"]["rss_peak_bytes"].as_u64().unwrap();
    let stalls = stats["totals"]["credit_stalls"].as_u64().unwrap();
    let stall_seconds = stats["totals"]["credit_stall_seconds"].as_f64().unwrap();
    let apply_rate_bound = 2.0 * 1e9 / delay_ns as f64 * (PAYLOAD_SIZE + 1) as f64;
    eprintln!(
        "overload: unthrottled {:.0} MB/s, throttled {:.0} MB/s (apply bound {:.0} MB/s), {events_sent} events in \
         {elapsed:?}; rss sampled max {} MiB, kernel peak {} MiB, bound {} MiB; {stalls} stalls, {stall_seconds:.1} s",
        rate_unthrottled / 1e6,
        rate_throttled / 1e6,
        apply_rate_bound / 1e6,
        rss_max.load(Ordering::Relaxed) >> 20,
        rss_peak >> 20,
        bound >> 20,
    );
    let seen = events_seen.load(Ordering::Relaxed);
    let mesh_overflow: u64 =
        stats["shards"].as_array().unwrap().iter().map(|s| s["mesh_overflow_frames"].as_u64().unwrap()).sum();
    drop(server);
    let notices = subscriber.join().unwrap();
    assert!(notices.is_empty(), "the subscriber kept up: {} notices, first {:?}", notices.len(), notices.first());
    assert_eq!(seen, events_sent, "subscriber saw every event");
    assert_eq!(stats["totals"]["events_stored"].as_u64().unwrap(), events_sent);
    assert!(rss_peak < bound, "peak RSS {rss_peak} over the bound {bound}");
    assert!(rss_max.load(Ordering::Relaxed) < bound);
    assert!(stalls > 0 && stall_seconds > 1.0, "producers were pushed back: {stalls} stalls, {stall_seconds} s");
    assert!(rate_throttled < apply_rate_bound * 1.3, "producers ran at the apply rate, not faster");
    assert!(rate_unthrottled > 4.0 * rate_throttled, "the apply stage was the bottleneck");
    assert_eq!(mesh_overflow, 0, "credits kept every mesh send from finding a full ring");
}

/// Keys whose partition (of 256) is owned by `owner` on a 2-shard server.
fn keys_owned_by(owner: u32, count: usize) -> Vec<String> {
    (0..)
        .map(|index| format!("key{index}"))
        .filter(|key| partition_of(key.as_bytes(), 256) % 2 == owner)
        .take(count)
        .collect()
}

/// With shard 0's apply stage slowed to 500 events/s, a connection writing
/// 10 KB events only to shard 0 is held to that rate by TCP backpressure,
/// while connections writing only to shard 1 (wherever the kernel placed
/// them, possibly on the same source shard) finish at full speed meanwhile.
#[test]
fn stalled_shard_does_not_stall_other_connections() {
    // Static placement: the test is about one slow owner; the balancer
    // would see the slowed shard storing few events/s and move shard 1's
    // partitions to it (its load measure is events stored, not time busy).
    let server = Server::start(&[
        "--shards",
        "2",
        "--apply-delay-ns-per-event",
        "2000000",
        "--apply-delay-shards",
        "0",
        "--rebalance",
        "off",
    ]);
    let slow_keys = keys_owned_by(0, 10);
    let mut slow = TcpStream::connect(server.ingest).unwrap();
    slow.set_write_timeout(Some(Duration::from_millis(100))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let slow_writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let line = format!("{} {}\n", slow_keys[0], "s".repeat(10_000));
            let (started, mut written) = (Instant::now(), 0usize);
            while !stop.load(Ordering::Relaxed) {
                // A timed-out write may have sent part of the line; the
                // stream's framing no longer matters, only its rate.
                match slow.write(line.as_bytes()) {
                    Ok(count) => written += count,
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(error) if error.kind() == std::io::ErrorKind::TimedOut => {}
                    Err(error) => panic!("slow writer: {error}"),
                }
            }
            (written, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_secs(1));

    let fast_keys = Arc::new(keys_owned_by(1, 100));
    let started = Instant::now();
    let fast: Vec<_> = (0..4)
        .map(|connection| {
            let (address, keys) = (server.ingest, fast_keys.clone());
            std::thread::spawn(move || {
                let mut producer = common::Producer::connect(address);
                let mut lines = Vec::new();
                for index in 0..50_000 {
                    lines.extend_from_slice(format!("{} {connection} {index}\n", keys[index % keys.len()]).as_bytes());
                }
                producer.send(&lines);
                assert_eq!(producer.sync().len(), 1);
            })
        })
        .collect();
    for thread in fast {
        thread.join().unwrap();
    }
    let fast_elapsed = started.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let (slow_written, slow_elapsed) = slow_writer.join().unwrap();
    let stats = server.stats();
    let shards = stats["shards"].as_array().unwrap();
    let stored_on_fast = shards[1]["events_stored"].as_u64().unwrap();
    let slow_rate = slow_written as f64 / slow_elapsed.as_secs_f64();
    eprintln!(
        "fast connections: 200k events in {fast_elapsed:?}; slow connection wrote {:.1} MB/s (apply rate 5 MB/s)",
        slow_rate / 1e6
    );
    assert_eq!(stored_on_fast, 200_000, "every fast event stored");
    assert!(fast_elapsed < Duration::from_secs(10), "fast connections were not held up: {fast_elapsed:?}");
    // 500 events/s * 10 KB plus what the credit window and the socket
    // buffers absorb once (a few MB over a few seconds).
    assert!(slow_rate < 20e6, "the slow connection was pushed back to the slow apply rate: {slow_rate} B/s");
    assert!(stats["totals"]["credit_stalls"].as_u64().unwrap() > 0);
}
