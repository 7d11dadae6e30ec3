//! Stream lifecycle under fire: streams created and deleted while producers
//! write to them, subscribers and group members read them, and the server
//! is killed at random moments. A delete is atomic across a crash (the
//! stream comes back whole or not at all), nothing a delete races with can
//! crash a shard, subscribers of a deleted stream are told at once, and a
//! deleted stream's partitions are free again.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Server, Subscriber};
use serde_json::json;
use spate::protocol::SubscriberLine;
use spate::protocol::group::{GroupLine, parse_group_line};

/// A producer loop on its own connection: `#STREAM name`, 50 events,
/// `#SYNC`, again and again, until `stop`; returns how many SYNCs were
/// answered. A stream that does not exist (yet, or any more) only gets its
/// lines rejected: the connection and its SYNCs carry on.
fn churn_producer(server: &Server, name: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let address = server.ingest;
    std::thread::spawn(move || {
        let mut producer = common::Producer::connect(address);
        let mut round = 0u64;
        while !stop.load(Ordering::Relaxed) {
            producer.send(format!("#STREAM {name}\n").as_bytes());
            for index in 0..50 {
                producer.send(format!("k{index} v{round}\n").as_bytes());
            }
            producer.sync();
            round += 1;
        }
        round
    })
}

/// Deleting streams while producers write to them never crashes a shard:
/// every create and delete is answered, the server keeps serving every
/// stream, deleted streams leave nothing on disk, and SIGTERM stops it
/// cleanly. (Before the fix a shard panicked within 13-16 s: "a partition
/// stays while its writer is out", and the process stayed up, wedged.)
#[test]
fn deleting_streams_while_they_are_written_never_crashes_a_shard() {
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--partitions-max", "4096"]);
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> =
        (0..3).map(|index| churn_producer(&server, format!("churn{index}"), stop.clone())).collect();
    let started = Instant::now();
    let mut cycles = 0;
    while started.elapsed() < Duration::from_secs(20) {
        for index in 0..3 {
            let (status, body) =
                server.http("POST", "/streams", Some(&json!({ "name": format!("churn{index}"), "partitions": 4 })));
            assert_eq!(status, 201, "create churn{index} in cycle {cycles}: {body}\n{}", server.log());
        }
        std::thread::sleep(Duration::from_millis(10));
        for index in 0..3 {
            let asked = Instant::now();
            let (status, body) = server.http("DELETE", &format!("/streams/churn{index}"), None);
            assert_eq!(status, 200, "delete churn{index} in cycle {cycles}: {body}\n{}", server.log());
            assert!(asked.elapsed() < Duration::from_secs(5), "a delete took {:?}\n{}", asked.elapsed(), server.log());
        }
        cycles += 1;
    }
    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        let rounds = producer.join().expect("a producer loop failed");
        assert!(rounds > 0, "every producer got SYNCs answered");
    }
    assert!(!server.log().contains("panicked"), "{}", server.log());
    // The server still serves: stats, the default stream, a SYNC.
    server.stats();
    let mut producer = server.producer();
    producer.send(b"after churn\n");
    producer.sync();
    for index in 0..3 {
        let dir = server.data_dir.join("streams").join(format!("churn{index}"));
        assert!(!dir.exists(), "{} is left on disk after {cycles} cycles", dir.display());
    }
    let log = server.log_path.clone();
    let stopped = server.terminate_within(Duration::from_secs(15));
    let (status, _) =
        stopped.unwrap_or_else(|| panic!("no stop within 15 s: {}", std::fs::read_to_string(&log).unwrap()));
    assert!(status.success(), "SIGTERM after the churn: {status}");
    eprintln!("{cycles} create/delete cycles of three streams");
}

/// A panic on any shard stops the whole process at once, loudly, instead
/// of leaving it half-alive (the others waiting for the dead shard forever).
#[test]
fn a_panicking_shard_stops_the_process_at_once() {
    let addresses = common::Addresses::free();
    let started = Instant::now();
    let output = Server::command(addresses, &["--shards", "2", "--storage", "memory", "--test-panic-after-ms", "300"])
        .output()
        .expect("run spate");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "exit status {:?}: {stderr}", output.status);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?} to stop", started.elapsed());
    assert!(stderr.contains("panics on purpose"), "{stderr}");
    assert!(stderr.contains("stopping the process now"), "{stderr}");
}

/// A shard that never finishes starting does not wedge the process: after
/// `--start-timeout-ms` it exits with status 1 and says why, so a
/// supervisor starts it again. (A rare start-up hang seen in CI left one
/// shard asleep for good, and the process then joined it for ever.)
#[test]
fn a_shard_that_never_starts_makes_the_process_exit() {
    let addresses = common::Addresses::free();
    let args = ["--shards", "2", "--storage", "memory", "--test-stall-start", "--start-timeout-ms", "1000"];
    let mut child = Server::command(addresses, &args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run spate");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("spate still running 20 s after its start timeout of 1 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("stderr");
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("only 1 of 2 shards started within --start-timeout-ms"), "{stderr}");
    // It says where the shard that did not start stopped.
    assert!(stderr.contains("(shard 1: building the shard (for "), "{stderr}");
}

/// A group member connection, read line by line.
struct RawMember {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl RawMember {
    fn join(address: SocketAddr, line: &str) -> RawMember {
        let mut writer = TcpStream::connect(address).unwrap();
        writer.write_all(format!("{line}\n").as_bytes()).unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        reader.get_ref().set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        RawMember { reader, writer }
    }

    /// The next line (without LF), or `None` at the end of the stream.
    fn line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end().to_string()),
        }
    }

    /// Reads until `ASSIGNED` with a non-empty set; returns the set.
    fn assigned(&mut self) -> Vec<u32> {
        loop {
            let line = self.line().expect("ASSIGNED");
            if let Ok(GroupLine::Assigned { partitions, .. }) = parse_group_line(line.as_bytes())
                && !partitions.is_empty()
            {
                return partitions.iter().collect();
            }
        }
    }
}

/// Every subscriber and group member of a deleted stream is told `ERR
/// stream_deleted` at once, on a quiet server (nothing else written), with
/// a `SUB` subscriber and members (one pinging, one silent) on the same
/// stream; and none of them reads the stream created again under the name.
/// (Before the fix the `SUB` subscriber heard nothing for 12 s, and a
/// pinging member nothing for 7 s.)
#[test]
fn subscribers_and_members_of_a_deleted_stream_are_told_at_once() {
    let server = Server::start(&["--shards", "2", "--partitions", "4"]);
    server.create_stream(json!({ "name": "gx", "partitions": 4 }));
    let mut producer = server.producer();
    producer.send(b"#STREAM gx\na 1\nb 2\nc 3\n");
    producer.sync();
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB gx * earliest");
    assert_eq!(subscriber.take(3).len(), 3);
    let mut pinging = RawMember::join(server.subscribe, "GROUP gx pinging earliest");
    pinging.assigned();
    let mut silent = RawMember::join(server.subscribe, "GROUP gx silent earliest");
    silent.assigned();
    let pinger = {
        let mut writer = pinging.writer.try_clone().unwrap();
        std::thread::spawn(move || {
            while writer.write_all(b"PING\n").is_ok() {
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // Quiet: nothing is written anywhere from here on.
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = server.http("DELETE", "/streams/gx", None);
    assert_eq!(status, 200, "{body}");
    let deleted = Instant::now();
    subscriber.set_timeout(Duration::from_secs(5));
    assert_eq!(subscriber.next_event(), None);
    assert!(subscriber.notices.iter().any(|notice| notice.contains("stream_deleted")), "{:?}", subscriber.notices);
    let told = deleted.elapsed();
    assert!(told < Duration::from_millis(500), "the subscriber was told after {told:?}");
    for (name, member) in [("pinging", &mut pinging), ("silent", &mut silent)] {
        member.reader.get_ref().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Past the events it had already been sent (it started earliest).
        let mut lines = Vec::new();
        while let Some(line) = member.line() {
            let end = line.starts_with("ERR");
            lines.push(line);
            if end {
                break;
            }
        }
        let told = deleted.elapsed();
        assert!(lines.last().is_some_and(|line| line.starts_with("ERR stream_deleted")), "{name}: {lines:?}");
        assert!(told < Duration::from_millis(500), "{name} was told after {told:?}");
    }
    // The name is taken again: nothing of the new stream reaches them.
    server.create_stream(json!({ "name": "gx", "partitions": 4 }));
    let mut producer = server.producer();
    producer.send(b"#STREAM gx\nnew 1\n");
    producer.sync();
    assert!(subscriber.next_line().is_none(), "the old subscriber's connection is closed");
    for member in [&mut pinging, &mut silent] {
        assert!(member.line().is_none(), "the old member's connection is closed");
    }
    drop(pinging);
    pinger.join().unwrap();
}

/// The same, timed: on a quiet server every subscriber of a deleted stream
/// has its `ERR stream_deleted` within 100 ms of the delete's answer.
#[test]
fn a_deletion_notice_arrives_within_100_ms() {
    let server = Server::start(&["--shards", "2", "--partitions", "2"]);
    server.create_stream(json!({ "name": "quiet", "partitions": 8 }));
    let mut subscribers: Vec<Subscriber> =
        (0..4).map(|_| Subscriber::connect(server.subscribe, "SUB quiet * earliest")).collect();
    std::thread::sleep(Duration::from_millis(300));
    let (status, body) = server.http("DELETE", "/streams/quiet", None);
    assert_eq!(status, 200, "{body}");
    let answered = Instant::now();
    for subscriber in &mut subscribers {
        subscriber.set_timeout(Duration::from_secs(5));
        assert_eq!(subscriber.next_event(), None);
        assert!(subscriber.notices.iter().any(|notice| notice.contains("stream_deleted")), "{:?}", subscriber.notices);
    }
    let told = answered.elapsed();
    assert!(told < Duration::from_millis(100), "the last subscriber was told {told:?} after the delete answered");
}

/// A deleted stream's partitions are free again at once: many more
/// create/delete cycles than `--partitions-max` allows at a time all
/// succeed, and a stream on reused ids holds only its own events, from
/// offset 0. (Before the fix the ids were free only after a restart: the
/// 16th cycle got `507 no_room`.)
#[test]
fn deleted_streams_partitions_are_free_again() {
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--partitions-max", "64"]);
    for cycle in 0..40 {
        let name = format!("cycle{}", cycle % 3);
        let (status, body) = server.http("POST", "/streams", Some(&json!({ "name": name, "partitions": 60 })));
        assert_eq!(status, 201, "cycle {cycle}: {body}");
        let mut producer = server.producer();
        producer.send(format!("#STREAM {name}\n").as_bytes());
        for index in 0..20 {
            producer.send(format!("k{index} {cycle}\n").as_bytes());
        }
        producer.sync();
        let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {name} * earliest"));
        let events = subscriber.take(20);
        assert!(events.iter().all(|event| event.payload == cycle.to_string().as_bytes()), "cycle {cycle}: {events:?}");
        let mut offsets: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for event in &events {
            offsets.entry(event.partition).or_default().push(event.offset);
        }
        for list in offsets.values() {
            assert!(list.iter().enumerate().all(|(at, &offset)| offset == at as u64), "cycle {cycle}: {offsets:?}");
        }
        let (status, body) = server.http("DELETE", &format!("/streams/{name}"), None);
        assert_eq!(status, 200, "cycle {cycle}: {body}");
    }
    assert_eq!(server.total("partitions_owned"), 4, "only default's partitions are left");
}

/// Writes `count` events over 1000 keys into `stream`, then `#SYNC`.
fn fill(server: &Server, stream: &str, count: u64, tag: &str) {
    let mut producer = server.producer();
    producer.send(format!("#STREAM {stream}\n").as_bytes());
    for index in 0..count {
        producer.send(format!("k{} {tag}-{index}\n", index % 1000).as_bytes());
    }
    producer.sync();
}

/// A group member that reads `count` events, commits every partition's
/// end, waits for every commit's `OK` and leaves; returns the commits.
fn commit_everything(server: &Server, stream: &str, group: &str, count: u64) -> BTreeMap<u32, u64> {
    let mut member = RawMember::join(server.subscribe, &format!("GROUP {stream} {group} earliest"));
    let mut ends: BTreeMap<u32, u64> = BTreeMap::new();
    let mut seen = 0;
    while seen < count {
        let line = member.line().unwrap_or_else(|| panic!("member ended after {seen} events"));
        if let Ok(GroupLine::Subscriber(SubscriberLine::Event { partition, offset, .. })) =
            parse_group_line(line.as_bytes())
        {
            ends.insert(partition, offset + 1);
            seen += 1;
        }
    }
    let commits: String = ends.iter().map(|(partition, end)| format!("COMMIT {partition} {end}\n")).collect();
    member.writer.write_all(commits.as_bytes()).unwrap();
    let mut acknowledged = 0;
    while acknowledged < ends.len() {
        let line = member.line().expect("OK COMMIT");
        if matches!(parse_group_line(line.as_bytes()), Ok(GroupLine::CommitOk { .. })) {
            acknowledged += 1;
        }
    }
    member.writer.write_all(b"LEAVE\n").unwrap();
    while member.line().is_some() {}
    ends
}

/// The committed offsets `/groups` shows for one group, by partition.
fn committed(server: &Server, stream: &str, group: &str) -> Option<BTreeMap<u64, serde_json::Value>> {
    let groups: serde_json::Value = serde_json::from_str(&server.get("/groups")).unwrap();
    let found =
        groups["groups"].as_array()?.iter().find(|entry| entry["stream"] == stream && entry["group"] == group)?.clone();
    let partitions = found["partitions"].as_array()?.iter();
    Some(partitions.map(|entry| (entry["partition"].as_u64().unwrap(), entry.clone())).collect())
}

/// kill -9 at random moments inside `DELETE /streams/NAME` never leaves a
/// half-deleted stream: after each restart the stream is whole (every
/// event, and its group's committed offsets) or gone (no files, no group),
/// and a stream created again under the name starts empty with no old
/// offsets, so a group reads every new event. (Before the fix the stream
/// came back with some partitions reset to 0 and its group kept offsets
/// past their end: newly acknowledged events were never delivered.)
#[test]
fn a_crash_during_a_delete_leaves_the_stream_whole_or_gone() {
    let data_dir = std::env::temp_dir().join(format!("spate-delete-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let data = data_dir.display().to_string();
    let mut server = Server::start(&["--shards", "2", "--partitions", "4", "--data-dir", &data]);
    let mut rng = common::crash_rng();
    let (mut whole, mut gone) = (0, 0);
    for round in 0..10 {
        server.create_stream(json!({ "name": "big", "partitions": 64 }));
        fill(&server, "big", 20_000, &format!("r{round}"));
        let ends = commit_everything(&server, "big", "g", 20_000);
        let delay = Duration::from_micros(rng.next() % 25_000);
        let admin = server.admin;
        let deleting = std::thread::spawn(move || {
            let url = format!("http://{admin}/streams/big");
            ureq::delete(&url).call().map(|response| response.status().as_u16()).ok()
        });
        std::thread::sleep(delay);
        server.crash();
        let answered = deleting.join().unwrap();
        server.spawn();
        let streams = server.streams();
        match streams.get("big") {
            Some(big) => {
                whole += 1;
                assert_eq!(answered, None, "round {round}: a delete answered 200 and the stream came back");
                assert_eq!(server.stream_end("big"), 20_000, "round {round}: big came back partly: {big}");
                let kept = committed(&server, "big", "g").expect("the group's offsets come back with the stream");
                for (partition, end) in &ends {
                    let entry = &kept[&u64::from(*partition)];
                    assert_eq!(entry["committed"], *end, "round {round}: partition {partition}: {entry}");
                    assert_eq!(entry["end"], *end, "round {round}: partition {partition}: {entry}");
                }
                let (status, body) = server.http("DELETE", "/streams/big", None);
                assert_eq!(status, 200, "{body}");
            }
            None => {
                gone += 1;
                assert!(!data_dir.join("streams").join("big").exists(), "round {round}: big's files are back");
                assert!(!data_dir.join("groups").join("big").exists(), "round {round}: big's groups are back");
                assert!(committed(&server, "big", "g").is_none(), "round {round}: the group outlived its stream");
            }
        }
        // The name starts afresh: a group of the same name reads every new
        // event from offset 0, none of the old.
        server.create_stream(json!({ "name": "big", "partitions": 64 }));
        fill(&server, "big", 260, "new");
        let mut member = RawMember::join(server.subscribe, "GROUP big g earliest");
        let mut fresh = 0;
        while fresh < 260 {
            let line = member.line().unwrap_or_else(|| panic!("round {round}: the group got {fresh} of 260"));
            if let Ok(GroupLine::Subscriber(SubscriberLine::Event { payload, .. })) = parse_group_line(line.as_bytes())
            {
                assert!(payload.starts_with(b"new-"), "round {round}: an old event: {line}");
                fresh += 1;
            }
        }
        drop(member);
        let (status, body) = server.http("DELETE", "/streams/big", None);
        assert_eq!(status, 200, "{body}");
    }
    eprintln!("10 kills during a delete: the stream came back whole {whole} times, was gone {gone} times");
    assert!(!server.log().contains("panicked"), "{}", server.log());
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// A group whose committed offset is past its partition's end (the log
/// lost events the group had read: here, its offsets file is edited to say
/// so) is a detected inconsistency: `/groups` flags it, it is logged and
/// counted, and the group reads every event written since the restart,
/// none skipped.
#[test]
fn a_committed_offset_past_the_end_is_detected_not_silent() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "4"]);
    server.create_stream(json!({ "name": "lost", "partitions": 1 }));
    fill(&server, "lost", 50, "old");
    commit_everything(&server, "lost", "g", 50);
    server.crash();
    let path = server.data_dir.join("groups").join("lost").join("g.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut stored: serde_json::Value = serde_json::from_str(&text).unwrap();
    stored["offsets"] = json!([[0, 5000]]);
    std::fs::write(&path, stored.to_string()).unwrap();
    server.spawn();
    let partitions = committed(&server, "lost", "g").expect("the group is loaded");
    assert_eq!(partitions[&0]["committed_past_end"], true, "{:?}", partitions[&0]);
    fill(&server, "lost", 30, "new");
    let mut member = RawMember::join(server.subscribe, "GROUP lost g earliest");
    let mut events = Vec::new();
    while events.len() < 30 {
        let line = member.line().unwrap_or_else(|| panic!("the member got {} of 30", events.len()));
        if let Ok(GroupLine::Subscriber(SubscriberLine::Event { offset, .. })) = parse_group_line(line.as_bytes()) {
            events.push(offset);
        }
    }
    assert_eq!(events, (50..80).collect::<Vec<u64>>(), "it resumed at the end and read every new event");
    assert_eq!(server.metric("spate_group_offsets_past_end_total"), 1.0);
    let log = server.log();
    assert!(log.contains("committed offset 5000 of partition 0 is past its end 80"), "{log}");
    assert!(log.contains("reading resumes at 50"), "{log}");
}

/// The soak's shared state: the streams producers and subscribers may use,
/// and what each stream acknowledged (payloads whose `#SYNC` was answered).
#[derive(Default)]
struct SoakState {
    writable: Vec<String>,
    acked: std::collections::HashMap<String, Vec<String>>,
    stop: bool,
}

type Shared = Arc<std::sync::Mutex<SoakState>>;

/// A producer that keeps writing 100 events and a `#SYNC` to one of the
/// writable streams after another, reconnecting through restarts, and
/// records what was acknowledged (payloads are unique).
fn soak_producer(address: SocketAddr, state: Shared, index: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut round = 0u64;
        loop {
            let name = {
                let state = state.lock().unwrap();
                if state.stop {
                    return;
                }
                if state.writable.is_empty() {
                    None
                } else {
                    Some(state.writable[(round as usize + index) % state.writable.len()].clone())
                }
            };
            round += 1;
            let Some(name) = name else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let payloads: Vec<String> = (0..100).map(|at| format!("{name}-p{index}-{round}-{at}")).collect();
            if let Some(true) = produce_once(address, &name, &payloads) {
                state.lock().unwrap().acked.entry(name).or_default().extend(payloads);
            } else {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    })
}

/// One producer round on a fresh connection: `Some(true)` when the `#SYNC`
/// was answered with no `ERR` (every event stored), `None` on an I/O error.
fn produce_once(address: SocketAddr, name: &str, payloads: &[String]) -> Option<bool> {
    let stream = TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let mut text = format!("#STREAM {name}\n");
    for (at, payload) in payloads.iter().enumerate() {
        text.push_str(&format!("k{} {payload}\n", at % 10));
    }
    text.push_str("#SYNC done\n");
    (&stream).write_all(text.as_bytes()).ok()?;
    let mut reader = BufReader::new(stream);
    let mut clean = true;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        clean &= !line.starts_with("ERR");
        if line.starts_with("OK") && line.contains("SYNC done") {
            return Some(clean);
        }
    }
}

/// A subscriber that keeps reading one writable stream after another from
/// the start, through deletes and restarts, only to put them under load.
fn soak_subscriber(address: SocketAddr, state: Shared, index: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut round = 0usize;
        loop {
            let name = {
                let state = state.lock().unwrap();
                if state.stop {
                    return;
                }
                state.writable.get((round + index) % state.writable.len().max(1)).cloned()
            };
            round += 1;
            let Some(name) = name else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let Ok(mut stream) = TcpStream::connect(address) else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            if stream.write_all(format!("SUB {name} * earliest\n").as_bytes()).is_err() {
                continue;
            }
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            for _ in 0..2000 {
                line.clear();
                if !matches!(reader.read_line(&mut line), Ok(count) if count > 0) || line.starts_with("ERR") {
                    break;
                }
            }
        }
    })
}

/// Every acknowledged payload of `name` is stored once: each partition is
/// read from offset 0 up to its next offset.
fn check_whole(server: &Server, name: &str, acked: &[String]) -> Result<(), String> {
    // A partition migrating between shards has no next offset for a few ms.
    let deadline = Instant::now() + Duration::from_secs(10);
    let next_offsets = loop {
        let streams = server.streams();
        let stream = streams.get(name).ok_or_else(|| format!("{name} is gone"))?;
        let next_offsets: Option<Vec<u64>> =
            stream["next_offsets"].as_array().unwrap().iter().map(serde_json::Value::as_u64).collect();
        match next_offsets {
            Some(next_offsets) => break next_offsets,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            None => return Err(format!("{name}: a partition has no next offset for 10 s: {stream}")),
        }
    };
    let mut stored = std::collections::HashSet::new();
    for (partition, &next) in next_offsets.iter().enumerate() {
        if next == 0 {
            continue;
        }
        let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {name} {partition} earliest"));
        for event in subscriber.take(next as usize) {
            let payload = String::from_utf8(event.payload).unwrap();
            if !stored.insert(payload.clone()) {
                return Err(format!("{name}: {payload} is stored twice"));
            }
        }
    }
    let missing: Vec<&String> = acked.iter().filter(|payload| !stored.contains(*payload)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{name}: {} of {} acknowledged events are missing, e.g. {}",
            missing.len(),
            acked.len(),
            missing[0]
        ));
    }
    Ok(())
}

/// Open file descriptors and threads of a process.
/// Open file descriptors and the server's own threads: io_uring's kernel
/// workers (`iou-wrk-*`, listed as the process's tasks) come and go as the
/// kernel pleases, so they are not counted (one more of them failed this
/// test once, 27 -> 28 threads, with nothing of spate's changed).
fn fds_and_threads(pid: u32) -> (usize, usize) {
    let count = |dir: String| std::fs::read_dir(dir).map(|entries| entries.count()).unwrap_or(0);
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks
                .flatten()
                .filter(|task| {
                    let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
                    !name.starts_with("iou-wrk")
                })
                .count()
        })
        .unwrap_or(0);
    (count(format!("/proc/{pid}/fd")), threads)
}

/// Streams created, written, read and deleted in a loop for 60 s with
/// producers and subscribers connected, and kill -9 at random moments (some
/// inside a delete): no panic, every acknowledged event of every surviving
/// stream present once, no deleted stream back, not even partly; and at the
/// end no leaked file descriptors, threads or partitions.
#[test]
fn stream_churn_soak_with_kill_9() {
    let data_dir = std::env::temp_dir().join(format!("spate-churn-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let data = data_dir.display().to_string();
    let args = ["--shards", "2", "--partitions", "4", "--partitions-max", "256", "--data-dir", &data];
    let mut server = Server::start(&args);
    let state: Shared = Arc::default();
    let mut workers: Vec<_> = (0..3).map(|index| soak_producer(server.ingest, state.clone(), index)).collect();
    workers.extend((0..2).map(|index| soak_subscriber(server.subscribe, state.clone(), index)));
    let mut rng = common::crash_rng();
    // Streams that exist as far as this test knows, by name, with their
    // partition count; names are never reused.
    let mut live: BTreeMap<String, u64> = BTreeMap::new();
    let mut deleted: Vec<String> = Vec::new();
    let (mut created, mut kills, mut kills_in_delete) = (0, 0, 0);
    let started = Instant::now();
    let mut last_kill = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        match rng.next() % 10 {
            0..=3 if live.len() < 8 => {
                let name = format!("s{created}");
                created += 1;
                let partitions = 1 + rng.next() % 8;
                server.create_stream(json!({ "name": name, "partitions": partitions }));
                live.insert(name.clone(), partitions);
                state.lock().unwrap().writable.push(name);
            }
            4..=5 if live.len() > 2 => {
                let name = live.keys().nth((rng.next() % live.len() as u64) as usize).unwrap().clone();
                state.lock().unwrap().writable.retain(|writable| *writable != name);
                let (status, body) = server.http("DELETE", &format!("/streams/{name}"), None);
                assert_eq!(status, 200, "delete {name}: {body}");
                live.remove(&name);
                state.lock().unwrap().acked.remove(&name);
                deleted.push(name);
            }
            6 if last_kill.elapsed() > Duration::from_secs(6) && !live.is_empty() => {
                last_kill = Instant::now();
                kills += 1;
                // Half of the kills land inside a delete.
                let in_doubt = rng.next().is_multiple_of(2).then(|| live.keys().next().unwrap().clone());
                let deleting = in_doubt.clone().map(|name| {
                    let url = format!("http://{}/streams/{name}", server.admin);
                    std::thread::spawn(move || {
                        ureq::delete(&url).call().map(|response| response.status().as_u16()).ok()
                    })
                });
                std::thread::sleep(Duration::from_micros(rng.next() % 20_000));
                server.crash();
                let answered = deleting.map(|thread| thread.join().unwrap());
                server.spawn();
                let streams = server.streams();
                for name in &deleted {
                    assert!(!streams.contains_key(name), "deleted stream {name} is back after kill {kills}");
                }
                if let Some(name) = in_doubt {
                    let gone = !streams.contains_key(&name);
                    if gone {
                        kills_in_delete += 1;
                        live.remove(&name);
                        state.lock().unwrap().writable.retain(|writable| *writable != name);
                        state.lock().unwrap().acked.remove(&name);
                        deleted.push(name);
                    } else {
                        assert_eq!(answered, Some(None), "{name}: its delete was answered, yet it is back");
                    }
                }
                for name in live.keys() {
                    let acked = state.lock().unwrap().acked.get(name).cloned().unwrap_or_default();
                    check_whole(&server, name, &acked).unwrap_or_else(|error| panic!("after kill {kills}: {error}"));
                }
            }
            7 if !live.is_empty() => {
                let name = live.keys().nth((rng.next() % live.len() as u64) as usize).unwrap().clone();
                let acked = state.lock().unwrap().acked.get(&name).cloned().unwrap_or_default();
                check_whole(&server, &name, &acked).unwrap_or_else(|error| panic!("{error}"));
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    state.lock().unwrap().stop = true;
    for worker in workers {
        worker.join().unwrap();
    }
    for name in live.keys() {
        let acked = state.lock().unwrap().acked.get(name).cloned().unwrap_or_default();
        check_whole(&server, name, &acked).unwrap_or_else(|error| panic!("at the end: {error}"));
    }
    let acked: usize = state.lock().unwrap().acked.values().map(Vec::len).sum();
    eprintln!(
        "soak: {created} streams created, {} deleted, {kills} kills ({kills_in_delete} inside a delete that took), \
         {acked} acknowledged events checked in {} live streams",
        deleted.len(),
        live.len()
    );
    assert!(kills >= 5, "only {kills} kills in 60 s");

    // Leaks: more churn with a subscriber on each stream changes neither
    // the descriptors nor the threads, and only live streams hold partitions.
    std::thread::sleep(Duration::from_millis(500));
    let before = fds_and_threads(server.pid());
    for cycle in 0..20 {
        let name = format!("leak{cycle}");
        server.create_stream(json!({ "name": name, "partitions": 8 }));
        fill(&server, &name, 100, "x");
        let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {name} * earliest"));
        subscriber.take(100);
        let (status, body) = server.http("DELETE", &format!("/streams/{name}"), None);
        assert_eq!(status, 200, "{body}");
        assert_eq!(subscriber.next_event(), None, "the subscriber is told");
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = fds_and_threads(server.pid());
    assert!(after.0 <= before.0 + 4, "file descriptors {} -> {}", before.0, after.0);
    assert_eq!(after.1, before.1, "threads");
    let expected: u64 = 4 + live.values().sum::<u64>();
    assert_eq!(server.total("partitions_owned"), expected, "partitions owned");
    assert!(!server.log().contains("panicked"), "{}", server.log());
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

fn without_huge_pages(command: &mut std::process::Command) {
    command.env("MIMALLOC_ALLOW_THP", "0");
}

/// The process's `THP_enabled` (0 when transparent huge pages are off for it).
fn thp_enabled(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| Some(line.strip_prefix("THP_enabled:")?.trim().to_string()))
}

/// A server turns transparent huge pages off for itself unless `--huge-pages on` asks for them
/// (a fresh huge page stalls a thread for milliseconds here), and says so at start; with `on` it
/// says what the kernel gives, and warns, naming the cause, when the process has them off anyway
/// (MIMALLOC_ALLOW_THP=0).
#[test]
fn a_server_says_whether_huge_pages_are_on() {
    let thp_mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let default = Server::start(&["--storage", "disk"]);
    let log = default.log();
    assert!(log.contains("transparent huge pages: off for this process"), "{log}");
    assert_eq!(thp_enabled(default.pid()).as_deref(), Some("0"), "PR_SET_THP_DISABLE is set");
    drop(default);
    let off = Server::start_prepared(&["--storage", "disk", "--huge-pages", "on"], without_huge_pages);
    let log = off.log();
    assert!(log.contains("transparent huge pages are off (MIMALLOC_ALLOW_THP=0"), "{log}");
    drop(off);
    let on = Server::start(&["--storage", "memory", "--huge-pages", "on"]);
    let log = on.log();
    if thp_mode.contains("[never]") || thp_mode.is_empty() {
        eprintln!("THP mode {thp_mode:?} here: only the warning can be checked");
        assert!(log.contains("transparent huge pages are off"), "{log}");
    } else {
        assert!(log.contains("transparent huge pages: ") && !log.contains("are off"), "{log}");
        assert_eq!(thp_enabled(on.pid()).as_deref(), Some("1"), "the kernel's mode applies");
    }
}
