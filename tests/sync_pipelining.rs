//! `#SYNC` pipelining: a connection keeps reading, routing and answering
//! while its SYNCs wait; many may be in flight, each answered in order once
//! the events sent before it are stored as the policy promises; replies stay
//! in line order; at most 64 are in flight per connection.
//!
//! The tests that need a SYNC to stay unanswered start the server on a full
//! disk (a small tmpfs, so they need root and skip with a message
//! otherwise): nothing can become durable until space returns, so what the
//! connection does meanwhile is observable without timing races.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use common::small_fs::SmallFs;
use common::{Server, Subscriber};

/// `#SYNC`s one connection may have in flight (`SYNCS_IN_FLIGHT_MAX`).
const SYNCS_IN_FLIGHT_MAX: u64 = 64;

/// A server started on a full disk (read-only until space returns: every
/// `#SYNC` that covers an event waits).
fn full_disk_server(name: &str) -> Option<(SmallFs, Server)> {
    let disk = SmallFs::tmpfs(&format!("sync-{name}"))?;
    let data_dir = disk.mount.join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    disk.fill();
    let data = data_dir.display().to_string();
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--fsync", "always", "--data-dir", &data]);
    assert_eq!(server.stats()["storage"]["read_only"], true, "started read-only: {}", server.stats());
    Some((disk, server))
}

/// Reads reply lines until `count` arrived (each trimmed), failing after
/// `limit`.
fn read_replies(reader: &mut BufReader<TcpStream>, count: usize, limit: Duration) -> Vec<String> {
    reader.get_ref().set_read_timeout(Some(limit)).unwrap();
    let mut replies = Vec::new();
    while replies.len() < count {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) => panic!("closed after {replies:?}"),
            Ok(_) => replies.push(line.trim_end().to_string()),
            Err(error) => panic!("no reply within {limit:?} ({error}) after {replies:?}"),
        }
    }
    replies
}

/// Asserts that no reply byte arrives within `wait`.
fn assert_no_reply(reader: &mut BufReader<TcpStream>, wait: Duration, why: &str) {
    reader.get_ref().set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 1];
    match reader.read(&mut byte) {
        Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
        other => panic!("{why}: got {other:?} {:?}", reader.buffer()),
    }
}

/// Waits up to 10 s for `events_ingested` to reach `expected`, then holds
/// it there for 300 ms (it must not pass it either); returns the value.
fn settled_ingested(server: &Server, expected: u64) -> u64 {
    let reached = server.wait_for_total("events_ingested", Duration::from_secs(10), |count| count >= expected);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.total("events_ingested"), reached, "events_ingested still moving");
    reached
}

/// A pending `#SYNC` does not stop its connection: with the first SYNC
/// unanswerable (full disk), the 1000 events after it are read and routed
/// before it is answered, while the replies of later lines (an `ERR`, a
/// `PING`, the second SYNC) wait behind it and come in line order once it is.
#[test]
fn events_after_a_pending_sync_are_accepted_before_its_answer() {
    let Some((disk, server)) = full_disk_server("after") else { return };
    let stream = TcpStream::connect(server.ingest).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut input = Vec::new();
    for index in 0..10 {
        writeln!(input, "before{index} x").unwrap();
    }
    input.extend_from_slice(b"#SYNC a\n");
    for index in 0..1000 {
        writeln!(input, "after{index} y").unwrap();
    }
    input.extend_from_slice(b" key_empty\n#PING p\n#SYNC b\n");
    (&stream).write_all(&input).unwrap();

    let ingested = settled_ingested(&server, 1010);
    assert_eq!(ingested, 1010, "the events after the pending SYNC were read and routed");
    assert_no_reply(&mut reader, Duration::from_millis(200), "a reply while the first SYNC is pending");

    disk.free();
    let replies = read_replies(&mut reader, 4, Duration::from_secs(60));
    assert_eq!(replies[0], "OK 11 SYNC a");
    assert!(replies[1].starts_with("ERR 1012 key_empty"), "{replies:?}");
    assert_eq!(replies[2..], ["OK 1013 PING p", "OK 1014 SYNC b"]);
    assert_eq!(server.stream_end("default"), 1010);
    drop(server);
}

/// At most 64 `#SYNC`s are in flight per connection: with none answerable
/// (full disk), a connection sending an event and a SYNC 200 times stops at
/// the 65th SYNC (65 events routed, not 200, and no error), and once space
/// returns all 200 are answered, in order.
#[test]
fn syncs_in_flight_are_bounded_per_connection() {
    let Some((disk, server)) = full_disk_server("bound") else { return };
    let stream = TcpStream::connect(server.ingest).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let rounds = 200u64;
    let mut input = Vec::new();
    for round in 0..rounds {
        writeln!(input, "k{round} v\n#SYNC s{round}").unwrap();
    }
    (&stream).write_all(&input).unwrap();

    assert_eq!(settled_ingested(&server, SYNCS_IN_FLIGHT_MAX + 1), SYNCS_IN_FLIGHT_MAX + 1, "held at the bound");
    assert_no_reply(&mut reader, Duration::from_millis(100), "a reply while every SYNC is pending");

    disk.free();
    let replies = read_replies(&mut reader, rounds as usize, Duration::from_secs(60));
    let expected: Vec<String> = (0..rounds).map(|round| format!("OK {} SYNC s{round}", 2 * round + 2)).collect();
    assert_eq!(replies, expected);
    assert_eq!(server.total("events_ingested"), rounds);
    drop(server);
}

/// Writes `rounds` rounds of `events_per_round` events and a `#SYNC r<n>`,
/// all at once on a thread (nothing waits for an answer); the writer stops
/// quietly when the server goes away.
fn pipelined_writer(stream: TcpStream, rounds: u64, events_per_round: u64) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut writer = std::io::BufWriter::with_capacity(64 * 1024, stream);
        for round in 0..rounds {
            for index in 0..events_per_round {
                if writeln!(writer, "k{} r{round}-{index}", index % 97).is_err() {
                    return;
                }
            }
            if writeln!(writer, "#SYNC r{round}").is_err() {
                return;
            }
        }
        let _ = writer.flush();
    })
}

/// The `OK` a pipelined round gets: its SYNC's line number and token.
fn round_ok(round: u64, events_per_round: u64) -> String {
    format!("OK {} SYNC r{round}", (round + 1) * (events_per_round + 1))
}

/// Many `#SYNC`s pipelined without waiting (memory storage) are all
/// answered, in order, and each only once the events before it are stored:
/// when its `OK` is read, `/stats` counts at least that many stored events.
#[test]
fn pipelined_syncs_are_answered_in_order_after_their_events() {
    let server = Server::start(&["--shards", "2", "--storage", "memory"]);
    let (rounds, events_per_round) = (300u64, 50u64);
    let stream = TcpStream::connect(server.ingest).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let writer = pipelined_writer(stream, rounds, events_per_round);
    for round in 0..rounds {
        let reply = read_replies(&mut reader, 1, Duration::from_secs(30)).remove(0);
        assert_eq!(reply, round_ok(round, events_per_round));
        if round % 10 == 0 {
            let stored = server.total("events_total");
            assert!(stored >= (round + 1) * events_per_round, "round {round}: only {stored} stored");
        }
    }
    writer.join().unwrap();
    assert_eq!(server.total("events_total"), rounds * events_per_round);
}

/// Pipelined `#SYNC`s under `--fsync always` are answered in order, and
/// every event an answered SYNC covered survives a kill -9 right after its
/// `OK`: on restart each of them is there once, in order per key.
#[test]
fn pipelined_syncs_under_always_survive_kill_9() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "16", "--fsync", "always"]);
    let (rounds, events_per_round, crash_after) = (400u64, 50u64, 150u64);
    let stream = TcpStream::connect(server.ingest).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let writer = pipelined_writer(stream.try_clone().unwrap(), rounds, events_per_round);
    for round in 0..=crash_after {
        let reply = read_replies(&mut reader, 1, Duration::from_secs(30)).remove(0);
        assert_eq!(reply, round_ok(round, events_per_round));
    }
    server.crash();
    let _ = stream.shutdown(Shutdown::Both);
    writer.join().unwrap();
    server.spawn();

    let stored = server.stream_end("default");
    let acknowledged = (crash_after + 1) * events_per_round;
    assert!(stored >= acknowledged, "{stored} stored, {acknowledged} acknowledged");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let mut last_position: std::collections::HashMap<Vec<u8>, u64> = std::collections::HashMap::new();
    let mut positions = std::collections::HashSet::new();
    for _ in 0..stored {
        let event = subscriber.next_event().expect("every stored event");
        let payload = String::from_utf8(event.payload).unwrap();
        let (round, index) = payload[1..].split_once('-').unwrap();
        let position = round.parse::<u64>().unwrap() * events_per_round + index.parse::<u64>().unwrap();
        if let Some(last) = last_position.insert(event.key.clone(), position) {
            assert!(position > last, "key {:?}: {position} after {last}", event.key);
        }
        assert!(positions.insert(position), "event {position} twice");
    }
    let lost: Vec<u64> = (0..acknowledged).filter(|position| !positions.contains(position)).collect();
    assert_eq!(lost, Vec::<u64>::new(), "acknowledged events lost");
    drop(server);
}

/// A producer that sends its last `#SYNC`s and closes its side at once
/// (`printf ... | nc -q1`) still gets every answer before the server closes.
#[test]
fn syncs_read_before_eof_are_answered() {
    let server = Server::start(&["--shards", "2", "--fsync", "always"]);
    let stream = TcpStream::connect(server.ingest).unwrap();
    let mut input = Vec::new();
    for round in 0..20 {
        for index in 0..100 {
            writeln!(input, "k{index} v{round}").unwrap();
        }
        writeln!(input, "#SYNC e{round}").unwrap();
    }
    (&stream).write_all(&input).unwrap();
    stream.shutdown(Shutdown::Write).unwrap();
    let mut all = String::new();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    (&stream).read_to_string(&mut all).unwrap();
    let expected: Vec<String> = (0..20).map(|round| format!("OK {} SYNC e{round}", (round + 1) * 101)).collect();
    assert_eq!(all.lines().collect::<Vec<_>>(), expected, "after {:?}", started.elapsed());
    assert_eq!(server.stream_end("default"), 2000);
}
