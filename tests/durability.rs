//! Durability, proven by crashing: `kill -9` at random moments while many
//! connections produce to several streams, an immediate restart, and a check
//! that every acknowledged event is there exactly once, in order, with dense
//! offsets; torn and corrupt tails cut to the last whole frame; a full disk
//! that pushes back and loses nothing.

mod common;

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::small_fs::SmallFs;
use common::{Server, Subscriber};
use serde_json::json;

/// Events between two `#SYNC`s of a crash-test producer.
const SYNC_EVERY: u64 = 2000;
/// Distinct keys per producer connection.
const KEYS_PER_CONNECTION: u64 = 5;

/// Produces `c<conn>k<j> c<conn>-<seq>` lines to `stream` with a `#SYNC` every
/// SYNC_EVERY events until `stop` or the connection fails; returns how many
/// events (from seq 0) were acknowledged.
fn produce_until_cut(address: SocketAddr, stream: &str, connection: u64, stop: &AtomicBool) -> u64 {
    let Ok(socket) = TcpStream::connect(address) else { return 0 };
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let mut writer = std::io::BufWriter::with_capacity(64 * 1024, socket);
    let mut acked = 0;
    let mut batch = Vec::with_capacity(64 * 1024);
    while !stop.load(Ordering::Relaxed) {
        batch.clear();
        batch.extend_from_slice(format!("#STREAM {stream}\n").as_bytes());
        for seq in acked..acked + SYNC_EVERY {
            writeln!(batch, "c{connection}k{} c{connection}-{seq}", seq % KEYS_PER_CONNECTION).unwrap();
        }
        let token = format!("s{}", acked + SYNC_EVERY);
        writeln!(batch, "#SYNC {token}").unwrap();
        if writer.write_all(&batch).and_then(|_| writer.flush()).is_err() {
            return acked;
        }
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return acked,
                Ok(_) => {}
            }
            let line = line.trim_end();
            assert!(!line.starts_with("ERR"), "connection {connection}: {line}");
            if let Some(spate::protocol::Reply::Ok { command: b"SYNC", token: got, .. }) =
                spate::protocol::parse_reply(line.as_bytes())
                && got == token.as_bytes()
            {
                acked += SYNC_EVERY;
                break;
            }
        }
    }
    acked
}

/// The (connection, seq) pairs a check found: one bit per pair, by
/// connection. The crash loops read millions of events after every kill, so
/// this is a bitset rather than a hash set (which cost most of the test's
/// time).
#[derive(Default)]
struct Seen {
    by_connection: Vec<Vec<u64>>,
    count: u64,
}

impl Seen {
    /// Records a pair; false if it was there already.
    fn insert(&mut self, connection: u64, seq: u64) -> bool {
        let (connection, word, bit) = (connection as usize, (seq / 64) as usize, seq % 64);
        if self.by_connection.len() <= connection {
            self.by_connection.resize_with(connection + 1, Vec::new);
        }
        let words = &mut self.by_connection[connection];
        if words.len() <= word {
            words.resize(word + 1, 0);
        }
        let fresh = words[word] & (1 << bit) == 0;
        words[word] |= 1 << bit;
        self.count += u64::from(fresh);
        fresh
    }

    fn contains(&self, connection: u64, seq: u64) -> bool {
        self.by_connection
            .get(connection as usize)
            .and_then(|words| words.get((seq / 64) as usize))
            .is_some_and(|word| word & (1 << (seq % 64)) != 0)
    }
}

/// Reads all of `stream` from offset 0 and checks it: dense offsets from 0 in
/// every partition, every event whole and present once (in `seen`, which
/// the streams of one check share), each (connection, key)'s events in
/// order.
fn check_stream(server: &Server, stream: &str, seen: &mut Seen) {
    let total = server.stream_end(stream);
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {stream} * earliest"));
    let mut next_offset: HashMap<u32, u64> = HashMap::new();
    // By connection * KEYS_PER_CONNECTION + key: the last seq seen, plus one.
    let mut last_seq: Vec<u64> = Vec::new();
    let mut expected_key = String::new();
    for index in 0..total {
        let event = subscriber
            .next_event()
            .unwrap_or_else(|| panic!("{stream}: ended after {index} of {total} events: {:?}", subscriber.notices));
        let expected = next_offset.entry(event.partition).or_insert(0);
        assert_eq!(event.offset, *expected, "{stream} partition {}: offsets are dense from 0", event.partition);
        *expected += 1;
        let key = std::str::from_utf8(&event.key).expect("a whole key");
        let payload = std::str::from_utf8(&event.payload).expect("a whole payload");
        let (connection, seq) = payload
            .strip_prefix('c')
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(connection, seq)| Some((connection.parse::<u64>().ok()?, seq.parse::<u64>().ok()?)))
            .unwrap_or_else(|| panic!("{stream}: a damaged event {key:?} {payload:?}"));
        let key_index = seq % KEYS_PER_CONNECTION;
        expected_key.clear();
        write!(expected_key, "c{connection}k{key_index}").unwrap();
        assert_eq!(key, expected_key, "{stream}: key and payload agree");
        assert!(seen.insert(connection, seq), "{stream}: c{connection}-{seq} is there twice");
        let slot = (connection * KEYS_PER_CONNECTION + key_index) as usize;
        if last_seq.len() <= slot {
            last_seq.resize(slot + 1, 0);
        }
        if let Some(previous) = last_seq[slot].checked_sub(1) {
            assert!(previous < seq, "{stream}: {key} has c{connection}-{seq} after c{connection}-{previous}");
        }
        last_seq[slot] = seq + 1;
    }
    assert!(subscriber.notices.is_empty(), "{stream}: {:?}", subscriber.notices);
}

/// At least ten `kill -9`s at random moments while producers write to three
/// streams, each followed by an immediate restart and a full check.
#[test]
fn acknowledged_events_survive_kill_9_loops() {
    kill_9_loop(&["--shards", "2", "--partitions", "3"]);
}

/// The kill -9 loop with a small write-ahead log (4 MiB files, so the
/// rounds switch files often) checkpointed every 20 ms, and rebalancing
/// every 50 ms: kills land during checkpoints, file switches and
/// migrations, and no acknowledged event is lost or duplicated.
#[test]
fn kill_9_during_checkpoints_file_switches_and_migrations() {
    kill_9_loop(&[
        "--shards",
        "2",
        "--partitions",
        "3",
        "--wal-bytes-max",
        "16777216",
        "--wal-checkpoint-ms",
        "20",
        "--rebalance-interval-ms",
        "50",
        "--rebalance-cooldown-ms",
        "200",
        "--consolidate",
        "off",
    ]);
}

/// A write-ahead log far too small for the load (its smallest size, and
/// checkpoints only when half of it is used) fills again and again while
/// checkpoints run: rounds that find it full sync the segments directly,
/// and ingest never stalls (a round waiting for a checkpoint that waited
/// for the round once hung the server for good). Every acknowledged event
/// is stored once.
#[test]
fn a_log_that_fills_while_checkpoints_run_never_stalls_ingest() {
    let data_dir = fresh_data_dir("wal-full");
    let data = data_dir.display().to_string();
    // Every round through the log (rounds this large would bypass it).
    let args = [
        "--shards",
        "2",
        "--partitions",
        "8",
        "--data-dir",
        &data,
        "--wal-bytes-max",
        "8519680",
        "--wal-bypass",
        "off",
    ];
    let server = Server::start(&args);
    let started = std::time::Instant::now();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for connection in 0..4 {
        let mut producer = server.producer();
        let done_tx = done_tx.clone();
        std::thread::spawn(move || {
            for round in 0..100 {
                for index in 0..2000 {
                    let line = format!("k{index} c{connection}-{round}-{index}-{}\n", "x".repeat(200));
                    producer.send(line.as_bytes());
                }
                producer.sync();
            }
            let _ = done_tx.send(());
        });
    }
    for _ in 0..4 {
        let answered = done_rx.recv_timeout(std::time::Duration::from_secs(60));
        assert!(answered.is_ok(), "ingest stalled: a producer's SYNCs were not all answered in 60 s");
    }
    let elapsed = started.elapsed();
    assert!(elapsed < std::time::Duration::from_secs(60), "800 000 events took {elapsed:?}");
    assert_eq!(server.stream_end("default"), 800_000);
    let filled = server.metric("spate_wal_direct_syncs_total") + server.metric("spate_wal_checkpoints_total");
    assert!(filled > 0.0, "the log filled up or was checkpointed");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

fn kill_9_loop(args: &[&str]) {
    const KILLS: u64 = 10;
    const CONNECTIONS: u64 = 6;
    let mut rng = common::crash_rng();
    let mut server = Server::start(args);
    server.create_stream(json!({ "name": "alpha", "partitions": 4 }));
    server.create_stream(json!({ "name": "beta", "partitions": 2 }));
    let streams = ["default", "alpha", "beta"];
    // connection -> (stream, acknowledged events)
    let mut acknowledged: HashMap<u64, (&str, u64)> = HashMap::new();
    let mut total_acked = 0;
    for kill in 0..KILLS {
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..CONNECTIONS)
            .map(|index| {
                let connection = kill * CONNECTIONS + index;
                let stream = streams[(connection % 3) as usize];
                let (address, stop) = (server.ingest, stop.clone());
                (connection, stream, std::thread::spawn(move || produce_until_cut(address, stream, connection, &stop)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(150 + rng.next() % 750));
        server.crash();
        stop.store(true, Ordering::Relaxed);
        for (connection, stream, producer) in producers {
            let acked = producer.join().unwrap();
            total_acked += acked;
            acknowledged.insert(connection, (stream, acked));
        }
        server.spawn();
        let mut present = Seen::default();
        for stream in streams {
            check_stream(&server, stream, &mut present);
        }
        for (&connection, &(stream, acked)) in &acknowledged {
            for seq in 0..acked {
                assert!(
                    present.contains(connection, seq),
                    "after kill {kill}: acknowledged c{connection}-{seq} of {stream} is missing (seed {})",
                    rng.seed
                );
            }
        }
        eprintln!("kill {kill}: {total_acked} acknowledged events, {} present", present.count);
    }
    assert!(total_acked >= KILLS * SYNC_EVERY, "the producers got acknowledgements: {total_acked}");
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}

/// Writes the events `seqs` of connection `connection` to `default`
/// (`c<conn>k<j> c<conn>-<seq>`, as the crash loops do) without a `#SYNC`.
fn produce_unsynced(address: SocketAddr, connection: u64, seqs: std::ops::Range<u64>) {
    let mut producer = common::Producer::connect(address);
    let mut batch = String::new();
    for seq in seqs {
        writeln!(batch, "c{connection}k{} c{connection}-{seq}", seq % KEYS_PER_CONNECTION).unwrap();
        if batch.len() > 64 * 1024 {
            producer.send(batch.as_bytes());
            batch.clear();
        }
    }
    producer.send(batch.as_bytes());
    producer.flush();
}

/// `connections` producers write the events `seqs` each, at once, without
/// a `#SYNC`; `subscriber` (on `default`) reads all of them.
fn produce_and_read(server: &Server, subscriber: &mut Subscriber, connections: u64, seqs: std::ops::Range<u64>) {
    let producers: Vec<_> = (0..connections)
        .map(|connection| {
            let (address, seqs) = (server.ingest, seqs.clone());
            std::thread::spawn(move || produce_unsynced(address, connection, seqs))
        })
        .collect();
    let expected = (connections * (seqs.end - seqs.start)) as usize;
    assert_eq!(subscriber.take(expected).len(), expected, "the subscriber saw every event");
    for producer in producers {
        producer.join().unwrap();
    }
}

/// Under the default `--fsync interval`, rounds that carry a block or more
/// per partition bypass the write-ahead log: their frames go straight to
/// the segment files, and a filesystem sync makes them durable. Such an
/// event survives kill -9 once written, `#SYNC` or not: producers write
/// without one, a subscriber reads every event (it sees only written
/// ones), the server is killed at once and restarted, and every event is
/// there once, in order; the log carried less than the segments.
/// Then a large batch with a `#SYNC` goes through a filesystem sync, and
/// survives a second kill -9 too.
#[test]
fn rounds_that_bypass_the_write_ahead_log_lose_nothing_to_kill_9() {
    const CONNECTIONS: u64 = 4;
    const EVENTS: u64 = 100_000;
    // No interval sync during the test (and its 16 MB stay below the
    // unsynced bound): only the rounds' own writes keep the events.
    let args = ["--shards", "2", "--partitions", "8", "--fsync-interval-ms", "60000"];
    let (mut server, mut subscriber) = burst_that_bypasses_the_log(&args, CONNECTIONS, EVENTS);
    // Killed once the subscriber has read the last event, with no sync
    // since: what it saw was written, and nothing more.
    produce_and_read(&server, &mut subscriber, CONNECTIONS, EVENTS..2 * EVENTS);
    assert_eq!(crash_and_count(&mut server), CONNECTIONS * 2 * EVENTS, "every written event after kill -9");

    // A burst whose rounds skip the log, then one event and a `#SYNC`: that
    // round is small, but the log lacks the burst's records, so the sync
    // goes through the filesystem, not the log's fdatasync.
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB default * latest");
    produce_and_read(&server, &mut subscriber, CONNECTIONS, 2 * EVENTS..3 * EVENTS);
    let unlogged = server.metric("spate_wal_unlogged_rounds_total");
    assert!(unlogged > 0.0, "rounds skipped the log: {}", server.get("/metrics"));
    let filesystem_syncs = server.metric("spate_wal_filesystem_syncs_total");
    let mut producer = server.producer();
    let small = CONNECTIONS + 1;
    producer.send(format!("c{small}k0 c{small}-0\n").as_bytes());
    let replies = producer.sync();
    assert!(replies.iter().all(|reply| !reply.starts_with("ERR")), "{replies:?}");
    assert!(
        server.metric("spate_wal_filesystem_syncs_total") > filesystem_syncs,
        "a filesystem sync answered the #SYNC: {}",
        server.get("/metrics")
    );
    drop(producer);

    // Over 4 MiB per shard held unwritten when the `#SYNC` comes: it is
    // answered by a filesystem sync, not by writing them to the log.
    const SYNCED: u64 = 1_000_000;
    let mut producer = server.producer();
    for seq in 0..SYNCED {
        producer.send(format!("c{CONNECTIONS}k{} c{CONNECTIONS}-{seq}\n", seq % KEYS_PER_CONNECTION).as_bytes());
    }
    let replies = producer.sync();
    assert!(replies.iter().all(|reply| !reply.starts_with("ERR")), "{replies:?}");
    assert!(server.metric("spate_wal_filesystem_syncs_total") >= 1.0, "{}", server.get("/metrics"));
    let expected = CONNECTIONS * 3 * EVENTS + 1 + SYNCED;
    assert_eq!(crash_and_count(&mut server), expected, "every synced event after a second kill -9");
    assert!(!server.log().contains("panicked"));
}

/// Starts a server with `args`, has `connections` producers write `events`
/// each without a `#SYNC` while a subscriber on `default` reads them all,
/// and checks that rounds bypassed the log and that the log carried fewer
/// bytes than the segments (through the log alone it would carry every
/// byte the segments got, and more: record headers, rewritten blocks).
fn burst_that_bypasses_the_log(args: &[&str], connections: u64, events: u64) -> (Server, Subscriber) {
    let server = Server::start(args);
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB default * earliest");
    produce_and_read(&server, &mut subscriber, connections, 0..events);
    let bypassed = server.metric("spate_wal_bypassed_rounds_total");
    let logged = server.metric("spate_wal_written_bytes_total");
    let stored = server.metric("spate_storage_written_bytes_total");
    eprintln!("{bypassed} rounds bypassed the log, which carried {logged} bytes of the segments' {stored}");
    assert!(bypassed > 0.0, "rounds bypassed the log: {}", server.get("/metrics"));
    assert!(logged < stored, "the log carried {logged} bytes of {stored}");
    (server, subscriber)
}

/// Kills the server with kill -9, restarts it, checks all of `default`
/// ([`check_stream`]) and returns how many events it holds.
fn crash_and_count(server: &mut Server) -> u64 {
    server.crash();
    server.spawn();
    let mut seen = Seen::default();
    check_stream(server, "default", &mut seen);
    seen.count
}

/// The kill -9 loop under `--fsync always`: every round syncs, so an
/// acknowledged event is durable whether its round wrote the log or (a
/// round of 4 MiB or more) bypassed it and was synced by `syncfs`.
#[test]
fn acknowledged_events_survive_kill_9_loops_under_always() {
    kill_9_loop(&["--shards", "2", "--partitions", "3", "--fsync", "always"]);
}

/// Under `--fsync always` a burst makes rounds of 4 MiB and more, which
/// bypass the log and are synced by `syncfs` in the round; every event is
/// there once, in order, after kill -9, and the log carried less than the
/// segments.
#[test]
fn rounds_that_bypass_the_log_under_always_lose_nothing_to_kill_9() {
    const CONNECTIONS: u64 = 8;
    const EVENTS: u64 = 400_000;
    let args = ["--shards", "2", "--partitions", "8", "--fsync", "always"];
    let (mut server, _subscriber) = burst_that_bypasses_the_log(&args, CONNECTIONS, EVENTS);
    let bypassed = server.metric("spate_wal_bypassed_rounds_total");
    let synced = server.metric("spate_wal_filesystem_syncs_total");
    assert!(synced >= bypassed, "every bypassing round synced: {}", server.get("/metrics"));
    assert_eq!(crash_and_count(&mut server), CONNECTIONS * EVENTS, "every written event after kill -9");
    assert!(!server.log().contains("panicked"));
}

/// The frames of a segment file: (position, size, next offset after it).
fn frames_of(bytes: &[u8]) -> Vec<(usize, usize, u64)> {
    let mut frames = Vec::new();
    let mut position = 0;
    while position + 4 <= bytes.len() && bytes[position..position + 4] != [0; 4] {
        let header = spate::storage::format::parse_header(&bytes[position..]).expect("a whole log before the damage");
        frames.push((position, header.frame_size(), header.next_offset()));
        position += header.frame_size();
    }
    frames
}

/// The last segment file of stream `default`, partition 0.
fn last_segment(data_dir: &std::path::Path) -> std::path::PathBuf {
    let dir = data_dir.join("streams").join("default").join("0");
    let mut logs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .collect();
    logs.sort();
    logs.pop().expect("a segment")
}

/// Damages the last frame of the log with `damage`, restarts, and checks
/// that the cut is reported and every frame before it is kept; with a
/// write-ahead log (`fsync` `interval`) the damaged frame comes back from
/// it, without one (`never`) it is lost. New events continue densely after
/// the kept ones.
fn recovery_after(damage: impl Fn(&std::path::Path, &[(usize, usize, u64)]), name: &str, fsync: &str) {
    let data_dir = fresh_data_dir(&format!("torn-{name}-{fsync}"));
    let data = data_dir.display().to_string();
    let mut server = start_logging_everything(&data, &["--fsync", fsync]);
    write_4000_synced(&server);
    let written = server.stream_end("default");
    assert_eq!(written, 4000);
    server.crash();
    let segment = last_segment(&data_dir);
    let frames = frames_of(&std::fs::read(&segment).unwrap());
    assert!(frames.len() >= 2, "several frames: {frames:?}");
    let with_wal = fsync != "never";
    // With the log, segments are written behind it: the file may end
    // before the last events (the log has them).
    let segment_end = frames.last().unwrap().2;
    assert!(segment_end == written || (with_wal && segment_end < written), "{segment_end} of {written}");
    let kept = if with_wal { written } else { frames[frames.len() - 2].2 };
    damage(&segment, &frames);

    server.spawn();
    assert_eq!(server.stream_end("default"), kept, "every whole frame before the damage is kept");
    assert_eq!(server.metric("spate_recovery_truncations_total"), 1.0);
    assert!(server.metric("spate_recovery_discarded_bytes_total") > 0.0);
    let log = server.log();
    assert!(log.contains(&format!("recovered {}", segment.display())) && log.contains("dropped"), "{log}");
    assert_eq!(log.contains("frames from the write-ahead logs"), with_wal, "{log}");
    let mut producer = server.producer();
    producer.send(b"k after-recovery\n");
    producer.sync();
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB 0 earliest");
    let events = subscriber.take(kept as usize + 1);
    assert!(events.iter().enumerate().all(|(index, event)| event.offset == index as u64), "dense offsets");
    assert_eq!(events.last().unwrap().payload, b"after-recovery");
    assert!(events[..kept as usize].iter().all(|event| event.payload.len() > 100), "whole events");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[test]
fn a_torn_tail_is_cut_to_the_last_whole_frame() {
    recovery_after(tear_last_frame, "truncated", "never");
}

/// A segment torn in its last frame after kill -9 (as a power cut may
/// leave an unsynced segment) gets the frame back from the write-ahead log.
#[test]
fn a_torn_segment_tail_is_restored_from_the_write_ahead_log() {
    recovery_after(tear_last_frame, "truncated", "interval");
}

/// A segment whose last frame is corrupt gets it back from the
/// write-ahead log.
#[test]
fn a_corrupt_segment_frame_is_restored_from_the_write_ahead_log() {
    recovery_after(flip_in_last_frame, "flipped", "always");
}

fn tear_last_frame(segment: &std::path::Path, frames: &[(usize, usize, u64)]) {
    let &(position, size, _) = frames.last().unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(segment).unwrap();
    file.set_len((position + size / 2) as u64).unwrap();
}

fn flip_in_last_frame(segment: &std::path::Path, frames: &[(usize, usize, u64)]) {
    let &(position, size, _) = frames.last().unwrap();
    let mut bytes = std::fs::read(segment).unwrap();
    bytes[position + 44 + (size - 44) / 2] ^= 0x5a;
    std::fs::write(segment, bytes).unwrap();
}

#[test]
fn a_corrupt_last_frame_is_cut() {
    recovery_after(flip_in_last_frame, "flipped", "never");
}

/// A data directory on a small tmpfs that fills up: producers are pushed
/// back, nothing acknowledged is lost, and ingest resumes once space is
/// freed; then kill -9 and a restart keep every event. The rounds are
/// large enough to skip the write-ahead log, so rounds that fail half-way
/// leave records in no log. Needs root to mount the tmpfs; skipped with a
/// message otherwise.
#[test]
fn a_full_disk_pushes_back_and_recovers() {
    let Some(fs) = SmallFs::tmpfs("enospc") else { return };
    std::fs::write(fs.filler(), vec![1u8; 12 << 20]).unwrap();
    let data = fs.mount.join("data").display().to_string();
    let segment = (1 << 20).to_string();
    let mut server = Server::start(&[
        "--shards",
        "1",
        "--partitions",
        "2",
        "--data-dir",
        &data,
        "--line-size-max",
        "4096",
        "--segment-bytes",
        &segment,
    ]);
    // About 8 MiB of events: more than the 4 MiB left.
    const EVENTS: u64 = 8000;
    let producer = {
        let address = server.ingest;
        std::thread::spawn(move || {
            let mut producer = common::Producer::connect(address);
            let payload = "y".repeat(1000);
            for index in 0..EVENTS {
                producer.send(format!("k{} {index}-{payload}\n", index % 4).as_bytes());
                if index % 500 == 499 {
                    producer.sync();
                }
            }
            producer.sync();
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("spate_storage_errors_total") == 0.0 {
        assert!(Instant::now() < deadline, "the disk never filled: {}", server.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    // Stalled, not crashed: nothing more is stored while the disk is full.
    let stored = server.stream_end("default");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(server.stream_end("default"), stored, "nothing is stored while the disk is full");
    assert!(stored < EVENTS);
    assert!(!producer.is_finished(), "the producer is pushed back");
    assert!(server.log().contains("disk full"), "{}", server.log());

    fs.free();
    producer.join().expect("the producer finishes once space is back");
    assert_eq!(server.stream_end("default"), EVENTS, "every event stored: {}", server.log());
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let events: Vec<_> = (0..EVENTS).map_while(|_| subscriber.next_event()).collect();
    assert_eq!(events.len() as u64, EVENTS, "{:?} {}", subscriber.notices, server.log());
    let mut seen: HashSet<u64> = HashSet::new();
    let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
    for event in events {
        let payload = std::str::from_utf8(&event.payload).unwrap();
        let (index, rest) = payload.split_once('-').unwrap();
        assert_eq!(rest.len(), 1000, "whole events");
        let index: u64 = index.parse().unwrap();
        assert!(seen.insert(index), "event {index} twice");
        if let Some(previous) = last.insert(event.key.clone(), index) {
            assert!(previous < index, "a key's events in order");
        }
    }
    assert_eq!(seen.len() as u64, EVENTS);
    let unlogged = server.metric("spate_wal_unlogged_rounds_total");
    assert!(unlogged > 0.0, "rounds skipped the log: {}", server.get("/metrics"));
    server.crash();
    server.spawn();
    assert_eq!(server.stream_end("default"), EVENTS, "every event after kill -9: {}", server.log());
    drop(server);
}

/// The write-ahead log's records in `wal_file` from its start (a first
/// lap): (position, body size, the offset after the record's last frame).
fn wal_records(wal_file: &std::path::Path) -> Vec<(usize, usize, u64)> {
    use spate::storage::wal::RECORD_HEADER_SIZE;
    let bytes = std::fs::read(wal_file).unwrap();
    let mut records = Vec::new();
    let mut position = 0;
    while position + RECORD_HEADER_SIZE <= bytes.len() && &bytes[position..position + 4] == b"SPTW" {
        assert_eq!(bytes[position + 4], 1, "a record of frames");
        let body_size = u32::from_le_bytes(bytes[position + 8..position + 12].try_into().unwrap()) as usize;
        let body = &bytes[position + RECORD_HEADER_SIZE..position + RECORD_HEADER_SIZE + body_size];
        let last_next = frames_of(body).last().expect("frames in a record").2;
        records.push((position, body_size, last_next));
        position += RECORD_HEADER_SIZE + body_size;
    }
    records
}

/// Empties every segment file of `stream`: what a power cut may leave of
/// segment files written since the last checkpoint (the tests run with no
/// checkpoint after the start).
fn empty_segments(data_dir: &std::path::Path, stream: &str) -> usize {
    let mut emptied = 0;
    for partition in std::fs::read_dir(data_dir.join("streams").join(stream)).unwrap() {
        for file in std::fs::read_dir(partition.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.extension().is_some_and(|extension| extension == "log") {
                std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
                emptied += 1;
            }
        }
    }
    emptied
}

/// A data directory of its own for a test (`name`), left over from an
/// earlier run removed first.
fn fresh_data_dir(name: &str) -> std::path::PathBuf {
    let data_dir = std::env::temp_dir().join(format!("spate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    data_dir
}

/// A server on `data` with one shard and one partition, and `more` flags,
/// whose write-ahead log keeps every frame: no checkpoint after the start,
/// no round bypassing it.
fn start_logging_everything(data: &str, more: &[&str]) -> Server {
    let mut args = vec![
        "--shards",
        "1",
        "--partitions",
        "1",
        "--data-dir",
        data,
        "--wal-checkpoint-ms",
        "600000",
        "--wal-bypass",
        "off",
    ];
    args.extend_from_slice(more);
    Server::start(&args)
}

/// A server with one shard and one partition whose write-ahead log keeps
/// every frame (no checkpoint after the start, no round bypassing it), in
/// a fresh data directory,
/// holding 4000 acknowledged events ([`write_4000_synced`]); with its data
/// directory and the log's first file.
fn one_logged_partition_with_4000_synced(name: &str) -> (Server, std::path::PathBuf, std::path::PathBuf) {
    let data_dir = fresh_data_dir(name);
    let data = data_dir.display().to_string();
    let server = start_logging_everything(&data, &[]);
    write_4000_synced(&server);
    assert_eq!(server.stream_end("default"), 4000);
    let wal_file = data_dir.join("wal").join("shard-0").join("0000.wal");
    (server, data_dir, wal_file)
}

/// Writes 4000 events of about 120 bytes to `default` in 20 rounds of 200,
/// each round acknowledged by a `#SYNC`.
fn write_4000_synced(server: &Server) {
    let mut producer = server.producer();
    for round in 0..20 {
        for index in 0..200 {
            producer.send(format!("k r{round}-{index}-{}\n", "x".repeat(100)).as_bytes());
        }
        producer.sync();
    }
}

/// Writes 4000 acknowledged events to one partition, kills the server,
/// empties its segment (as a power cut before any checkpoint may), damages
/// the write-ahead log's last record with `damage`, restarts, and checks
/// that every event of the records before it is back, exactly once and
/// densely, and the cut is logged.
fn wal_damage(damage: impl Fn(&std::path::Path, usize, usize), name: &str, logged: &str) {
    let (mut server, data_dir, wal_file) = one_logged_partition_with_4000_synced(&format!("wal-{name}"));
    server.crash();
    let records = wal_records(&wal_file);
    assert!(records.len() >= 2, "several records: {records:?}");
    assert_eq!(records.last().unwrap().2, 4000, "the log holds every event");
    let kept = records[records.len() - 2].2;
    assert_eq!(empty_segments(&data_dir, "default"), 1);
    let &(position, body_size, _) = records.last().unwrap();
    damage(&wal_file, position, body_size);

    server.spawn();
    assert_eq!(server.stream_end("default"), kept, "every record before the damage is replayed");
    let log = server.log();
    assert!(log.contains(logged), "{log}");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB 0 earliest");
    let events = subscriber.take(kept as usize);
    assert!(events.iter().enumerate().all(|(index, event)| event.offset == index as u64), "dense offsets");
    let expected: Vec<String> =
        (0..kept).map(|offset| format!("r{}-{}-{}", offset / 200, offset % 200, "x".repeat(100))).collect();
    let payloads: Vec<String> = events.iter().map(|event| String::from_utf8(event.payload.clone()).unwrap()).collect();
    assert_eq!(payloads, expected, "each event once, in order");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Between rounds the shard zero-fills its write-ahead log ahead of its
/// end during the first lap (so a round's write lands in allocated blocks
/// and its fdatasync flushes no inode); the zeros read as the log's clean
/// end after kill -9, and later rounds write over them.
#[test]
fn the_write_ahead_log_is_allocated_ahead_and_its_zeros_read_as_its_end() {
    use spate::storage::segment::BLOCK_SIZE;
    use spate::storage::wal::{ALLOCATE_AHEAD_BYTES, RECORD_HEADER_SIZE};
    let (mut server, data_dir, wal_file) = one_logged_partition_with_4000_synced("wal-allocate");
    let &(position, body_size, _) = wal_records(&wal_file).last().expect("records");
    let end = (position + RECORD_HEADER_SIZE + body_size) as u64;
    let started = Instant::now();
    while std::fs::metadata(&wal_file).unwrap().len() < end + ALLOCATE_AHEAD_BYTES {
        assert!(started.elapsed() < Duration::from_secs(10), "the log is not allocated ahead: {end}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let allocated = server.metric("spate_wal_allocated_bytes_total") as u64;
    assert!(allocated >= ALLOCATE_AHEAD_BYTES, "counted: {allocated}");
    let bytes = std::fs::read(&wal_file).unwrap();
    let after_last_block = end.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
    assert!(bytes[after_last_block as usize..].iter().all(|&byte| byte == 0), "zeros past the records");

    server.crash();
    assert_eq!(empty_segments(&data_dir, "default"), 1);
    server.spawn();
    assert_eq!(server.stream_end("default"), 4000, "every acknowledged event replayed from the log");
    let log = server.log();
    assert!(log.contains("past the checkpoint") && !log.contains(", cut at "), "the zeros are a clean end: {log}");
    // The next run writes over the zeros, in place: the file does not grow
    // by what it writes.
    let length = std::fs::metadata(&wal_file).unwrap().len();
    let mut producer = server.producer();
    for index in 0..2000 {
        producer.send(format!("k again-{index}-{}\n", "y".repeat(100)).as_bytes());
    }
    producer.sync();
    assert_eq!(server.stream_end("default"), 6000);
    // The new run starts at the checkpoint's position (none was taken
    // after the start), well inside what is allocated: no growth, and no
    // allocation either (its end plus the lead is inside the file).
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(std::fs::metadata(&wal_file).unwrap().len(), length, "written inside the allocated part");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A write-ahead log torn inside its last record: the records before it
/// are replayed into the emptied segment, the tail is cut and logged.
#[test]
fn a_torn_write_ahead_log_tail_keeps_the_records_before_it() {
    wal_damage(
        |wal_file, position, body_size| {
            let file = std::fs::OpenOptions::new().write(true).open(wal_file).unwrap();
            file.set_len((position + 32 + body_size / 2) as u64).unwrap();
        },
        "torn",
        "cut short by the end of its file",
    );
}

/// A flipped byte in the write-ahead log's last record: the records before
/// it are replayed, the record is cut and logged.
#[test]
fn a_flipped_byte_in_the_last_write_ahead_record_keeps_the_records_before_it() {
    wal_damage(
        |wal_file, position, body_size| {
            let mut bytes = std::fs::read(wal_file).unwrap();
            bytes[position + 32 + body_size / 2] ^= 0x5a;
            std::fs::write(wal_file, bytes).unwrap();
        },
        "flipped",
        "whose CRC does not match",
    );
}

/// 1024 partitions, each with acknowledged events whose segment files are
/// not synced (no checkpoint after the start): after kill -9 and every
/// segment emptied, as a power cut may leave them, the write-ahead logs
/// bring back every acknowledged event exactly once.
#[test]
fn a_crash_with_1024_partitions_dirty_recovers_every_event_once() {
    const EVENTS: u64 = 24_000;
    let mut server = Server::start(&[
        "--shards",
        "2",
        "--partitions",
        "1024",
        "--wal-checkpoint-ms",
        "600000",
        "--rebalance",
        "off",
    ]);
    let mut producer = server.producer();
    for seq in 0..EVENTS {
        producer.send(format!("key{seq} c0-{seq}\n").as_bytes());
        if seq % 2000 == 1999 {
            producer.sync();
        }
    }
    drop(producer);
    assert_eq!(server.stream_end("default"), EVENTS);
    let stats: serde_json::Value = serde_json::from_str(&server.get("/partitions")).unwrap();
    let written =
        stats["partitions"].as_array().unwrap().iter().filter(|p| p["next_offset"].as_u64() > Some(0)).count();
    assert_eq!(written, 1024, "every partition holds events");
    server.crash();
    assert_eq!(empty_segments(&server.data_dir, "default"), 1024);
    server.spawn();
    assert_eq!(server.stream_end("default"), EVENTS, "every acknowledged event is back");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB default * earliest");
    let mut seen = HashSet::new();
    let mut next_offset: HashMap<u32, u64> = HashMap::new();
    for _ in 0..EVENTS {
        let event = subscriber.next_event().expect("an event");
        let expected = next_offset.entry(event.partition).or_insert(0);
        assert_eq!(event.offset, *expected, "dense offsets in partition {}", event.partition);
        *expected += 1;
        let payload = String::from_utf8(event.payload.clone()).unwrap();
        assert!(seen.insert(payload.clone()), "{payload} is there twice");
    }
    assert_eq!(seen.len() as u64, EVENTS);
    assert!(server.log().contains("replayed"), "{}", server.log());
}

/// A data directory written by the server before the write-ahead log
/// (no `wal/` directory) opens with every event intact, then keeps new
/// ones across a kill -9. Needs the old binary: `SPATE_OLD_BINARY`, or
/// /work/wt-old/target/release/spate; skipped with a message otherwise.
#[test]
fn a_data_dir_from_before_the_write_ahead_log_opens_intact() {
    let old_binary = std::env::var("SPATE_OLD_BINARY").unwrap_or_else(|_| "/work/wt-old/target/release/spate".into());
    if !std::path::Path::new(&old_binary).exists() {
        eprintln!("skipped: no old binary at {old_binary} (set SPATE_OLD_BINARY)");
        return;
    }
    let data_dir = fresh_data_dir("old-dir");
    let data = data_dir.display().to_string();
    let addresses = common::Addresses::free();
    let mut command = std::process::Command::new(&old_binary);
    let mut args: Vec<_> = Server::command(addresses, &["--shards", "2", "--partitions", "8", "--data-dir", &data])
        .get_args()
        .map(|arg| arg.to_owned())
        .collect();
    // Flags newer than the old binary (the Kafka listener came later).
    if let Some(at) = args.iter().position(|arg| arg == "--ingest-kafka") {
        args.drain(at..at + 2);
    }
    let log_path = data_dir.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut child = command.args(&args).stdout(log.try_clone().unwrap()).stderr(log).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let producer = loop {
        if let Ok(socket) = TcpStream::connect(addresses.ingest) {
            break socket;
        }
        assert!(
            Instant::now() < deadline,
            "the old server did not start: {}",
            std::fs::read_to_string(&log_path).unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut reader = BufReader::new(producer.try_clone().unwrap());
    let mut writer = std::io::BufWriter::new(producer);
    for seq in 0..5000u64 {
        writeln!(writer, "key{} old-{seq}", seq % 64).unwrap();
    }
    writeln!(writer, "#SYNC done").unwrap();
    writer.flush().unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.starts_with("OK ") && line.trim_end().ends_with("SYNC done"), "{line}");
    drop((reader, writer));
    let _ = child.kill();
    let _ = child.wait();
    assert!(!data_dir.join("wal").exists(), "the old server writes no log");

    let mut server = Server::start_on(addresses, &["--shards", "2", "--partitions", "8", "--data-dir", &data]);
    assert_eq!(server.stream_end("default"), 5000, "every event of the old server");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB default * earliest");
    let payloads: HashSet<Vec<u8>> = (0..5000).map(|_| subscriber.next_event().unwrap().payload).collect();
    assert_eq!(payloads.len(), 5000);
    drop(subscriber);
    let mut producer = server.producer();
    producer.send(b"key1 new-0\n");
    producer.sync();
    drop(producer);
    server.crash();
    server.spawn();
    assert_eq!(server.stream_end("default"), 5001);
    assert!(data_dir.join("wal").join("shard-0").join("checkpoint").exists());
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
    let _ = std::fs::remove_file(&log_path);
}

/// A handoff makes the moving partition's files hold every event it took:
/// killed with -9 right after a migration that happened while nothing was
/// in flight, the moved partition's segment files alone (no write-ahead
/// log of either shard) hold every one of its events, so the thief's
/// recovery never needs the old owner's log; and a restart has every
/// acknowledged event. (Without the handoff's write of what its writer
/// still buffered, the files ended up to 128 KiB short.)
#[test]
fn a_kill_9_right_after_a_handoff_loses_nothing() {
    let data_dir = fresh_data_dir("handoff-kill");
    let data = data_dir.display().to_string();
    let args = [
        "--shards",
        "2",
        "--partitions",
        "4",
        "--data-dir",
        &data,
        "--fsync",
        "always",
        "--wal-checkpoint-ms",
        "600000",
        "--rebalance-interval-ms",
        "1500",
        "--rebalance-cooldown-ms",
        "100",
        "--consolidate",
        "off",
    ];
    let mut server = Server::start(&args);
    // Learn which partition each key lands in, and keep keys of shard 0's.
    let mut producer = server.producer();
    for key in 0..64 {
        producer.send(format!("k{key} learn\n").as_bytes());
    }
    producer.sync();
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let mut per_partition = [0u64; 4];
    let mut hot: Vec<(String, u32)> = Vec::new();
    let owners = partition_owners(&server);
    for event in subscriber.take(64) {
        per_partition[event.partition as usize] += 1;
        if owners[event.partition as usize] == 0 {
            hot.push((String::from_utf8(event.key.clone()).unwrap(), event.partition));
        }
    }
    assert!(!hot.is_empty(), "shard 0 owns partitions");
    // A burst on shard 0's partitions, then nothing: the balancer moves one
    // while no event is in flight, so the handoff point is the end. The
    // balancer acts on a load average (half-life 500 ms) at its next tick
    // (every 1.5 s): a short burst on a fast box can decay below its
    // minimum load first (CI once saw no migration at all), so another
    // burst follows, up to three.
    let mut bursts = 0;
    'burst: loop {
        bursts += 1;
        for batch in 0..11 {
            // The last batch is small: what it adds stays in the writers'
            // buffers (below the write-behind size) until the handoff.
            let batch_size = if batch == 10 { 200 } else { 2000 };
            for index in 0..batch_size {
                let (key, partition) = &hot[index % hot.len()];
                producer.send(format!("{key} n{bursts}b{batch}-{index}-{}\n", "x".repeat(100)).as_bytes());
                per_partition[*partition as usize] += 1;
            }
            producer.sync();
        }
        assert_eq!(server.total("migrations_started"), 0, "burst {bursts} ended before any rebalance moved");
        let (started, deadline) = (Instant::now(), Instant::now() + Duration::from_secs(6));
        while Instant::now() < deadline || server.total("migrations_started") > 0 {
            if server.total("migrations_completed") > 0 {
                break 'burst;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "a migration started but did not end in 20 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(bursts < 3, "no migration within 6 s of each of {bursts} bursts");
        eprintln!("no migration within 6 s of burst {bursts}: another burst");
    }
    let epochs = partition_epochs(&server);
    server.crash();
    let moved: Vec<usize> = (0..4).filter(|&partition| epochs[partition] > 0).collect();
    assert!(!moved.is_empty(), "a partition carries a new epoch");
    for &partition in &moved {
        let in_files = segment_files_end(&data_dir.join("streams").join("default").join(partition.to_string()));
        assert_eq!(in_files, per_partition[partition], "partition {partition}: its files alone hold all its events");
    }
    server.spawn();
    assert_eq!(server.stream_end("default"), per_partition.iter().sum::<u64>(), "every acknowledged event");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

fn partition_table(server: &Server) -> Vec<serde_json::Value> {
    let table: serde_json::Value = serde_json::from_str(&server.get("/partitions")).unwrap();
    let mut rows: Vec<_> =
        table["partitions"].as_array().unwrap().iter().filter(|row| row["stream"] == "default").cloned().collect();
    rows.sort_by_key(|row| row["stream_partition"].as_u64().unwrap());
    rows
}

fn partition_owners(server: &Server) -> Vec<u64> {
    partition_table(server).iter().map(|row| row["owner"].as_u64().unwrap()).collect()
}

fn partition_epochs(server: &Server) -> Vec<u64> {
    partition_table(server).iter().map(|row| row["epoch"].as_u64().unwrap()).collect()
}

/// The offset after the last whole frame in a partition's segment files.
fn segment_files_end(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .filter_map(|path| frames_of(&std::fs::read(&path).unwrap()).last().map(|frame| frame.2))
        .max()
        .unwrap_or(0)
}

/// A stream directory symlinked onto another filesystem: a `syncfs` of the
/// data directory's filesystem would not make its segments durable, so
/// the server turns the log bypass off for the run, says so, and every
/// round goes through the write-ahead log (a burst that would bypass it
/// does not). Needs root to mount the tmpfs; skipped with a message
/// otherwise.
#[test]
fn a_stream_on_another_filesystem_turns_the_log_bypass_off() {
    let Some(fs) = SmallFs::tmpfs("bypass-elsewhere") else { return };
    let data_dir = std::env::temp_dir().join(format!("spate-bypass-elsewhere-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    std::fs::create_dir_all(data_dir.join("streams")).unwrap();
    let elsewhere = fs.mount.join("default");
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, data_dir.join("streams").join("default")).unwrap();
    let data = data_dir.display().to_string();
    let server = Server::start(&["--shards", "2", "--partitions", "2", "--data-dir", &data]);
    assert!(
        server.log().contains("is on another filesystem than") && server.log().contains("as --wal-bypass off"),
        "{}",
        server.log()
    );
    let mut producer = server.producer();
    let payload = "y".repeat(200);
    for index in 0..20_000u64 {
        producer.send(format!("k{} {index}-{payload}\n", index % 8).as_bytes());
    }
    producer.sync();
    assert_eq!(server.stream_end("default"), 20_000);
    assert_eq!(server.metric("spate_wal_bypassed_rounds_total"), 0.0, "{}", server.get("/metrics"));
    assert!(server.metric("spate_wal_written_bytes_total") > 4_000_000.0, "every round went to the log");
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}
