//! Consumer groups over TCP against a real server: sharing a stream's
//! partitions with members dying and joining, committed offsets surviving
//! kill -9, and `hold` groups pausing the producers.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::Server;
use spate::protocol::SubscriberLine;
use spate::protocol::group::{GroupLine, parse_group_line};

/// What one member saw, in order.
#[derive(Debug, Clone)]
enum Seen {
    Assigned { generation: u64, partitions: Vec<u32> },
    Revoked { generation: u64, partitions: Vec<u32> },
    Event { partition: u32, offset: u64, key: Vec<u8>, payload: Vec<u8>, at: Instant },
    CommitOk { partition: u32, next_offset: u64 },
    Error(String),
}

/// A group member on its own thread: reads, commits after every burst of
/// lines, pings every 500 ms; can be paused (stops reading, keeps pinging),
/// killed (socket shut without `LEAVE`) or asked to leave.
struct Member {
    seen: Arc<Mutex<Vec<Seen>>>,
    paused: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    socket: TcpStream,
    thread: Option<JoinHandle<()>>,
    pinger: Option<JoinHandle<()>>,
}

impl Member {
    fn join(address: SocketAddr, line: &str) -> Member {
        let socket = TcpStream::connect(address).unwrap();
        socket.set_nodelay(true).unwrap();
        let writer = Arc::new(Mutex::new(socket.try_clone().unwrap()));
        writer.lock().unwrap().write_all(format!("{line}\n").as_bytes()).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let paused = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let reading = socket.try_clone().unwrap();
        reading.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let thread = {
            let (seen, paused, stop, writer) = (seen.clone(), paused.clone(), stop.clone(), writer.clone());
            std::thread::spawn(move || read_member(reading, &seen, &paused, &stop, &writer))
        };
        let pinger = {
            let (stop, writer) = (stop.clone(), writer.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if writer.lock().unwrap().write_all(b"PING\n").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
        };
        Member { seen, paused, stop, socket, thread: Some(thread), pinger: Some(pinger) }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Dies: the connection is cut without `LEAVE` (as a killed process's).
    fn kill(mut self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.socket.shutdown(Shutdown::Both);
        self.join_threads();
        self.seen()
    }

    fn join_threads(&mut self) {
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        if let Some(pinger) = self.pinger.take() {
            pinger.join().unwrap();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.socket.shutdown(Shutdown::Both);
        self.join_threads();
    }
}

fn read_member(
    socket: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    paused: &AtomicBool,
    stop: &AtomicBool,
    writer: &Mutex<TcpStream>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, socket);
    let mut line = Vec::new();
    let mut progress: BTreeMap<u32, (u64, bool)> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        if paused.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) if line.last() == Some(&b'\n') => {}
            Ok(_) => continue,
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        }
        line.pop();
        let entry = match parse_group_line(&line) {
            Ok(GroupLine::Assigned { generation, partitions }) => {
                Seen::Assigned { generation, partitions: partitions.iter().collect() }
            }
            Ok(GroupLine::Revoked { generation, partitions }) => {
                let partitions: Vec<u32> = partitions.iter().collect();
                for partition in &partitions {
                    progress.remove(partition);
                }
                Seen::Revoked { generation, partitions }
            }
            Ok(GroupLine::CommitOk { partition, next_offset }) => Seen::CommitOk { partition, next_offset },
            Ok(GroupLine::Subscriber(SubscriberLine::Event { partition, offset, key, payload })) => {
                progress.insert(partition, (offset + 1, true));
                Seen::Event { partition, offset, key: key.to_vec(), payload: payload.to_vec(), at: Instant::now() }
            }
            _ => Seen::Error(String::from_utf8_lossy(&line).into_owned()),
        };
        seen.lock().unwrap().push(entry);
        line.clear();
        if reader.buffer().is_empty() {
            let mut request = String::new();
            for (partition, (next, moved)) in progress.iter_mut().filter(|(_, (_, moved))| *moved) {
                request.push_str(&format!("COMMIT {partition} {next}\n"));
                *moved = false;
            }
            if !request.is_empty() && writer.lock().unwrap().write_all(request.as_bytes()).is_err() {
                return;
            }
        }
    }
}

/// Produces `count` events `key{k} {k} {sequence}` over `keys` keys, in
/// chunks with a pause between them, then syncs.
fn produce(server: &Server, stream: &str, keys: u64, count: u64, chunk: u64, pause: Duration) -> JoinHandle<()> {
    let mut producer = server.producer();
    let stream = stream.to_string();
    std::thread::spawn(move || {
        producer.send(format!("#STREAM {stream}\n").as_bytes());
        let mut sequence = vec![0u64; keys as usize];
        for start in (0..count).step_by(chunk as usize) {
            let mut bytes = Vec::new();
            for index in start..(start + chunk).min(count) {
                let key = index.wrapping_mul(2654435761) % keys;
                bytes.extend_from_slice(format!("key{key} {key} {}\n", sequence[key as usize]).as_bytes());
                sequence[key as usize] += 1;
            }
            producer.send(&bytes);
            producer.flush();
            std::thread::sleep(pause);
        }
        producer.sync();
    })
}

/// One member's holding of one partition, from its `ASSIGNED` on.
struct Span {
    partition: u32,
    /// The generation it began at.
    generation: u64,
    /// The first offset delivered in it.
    first: Option<u64>,
    /// The last commit acknowledged in it.
    acked: Option<u64>,
}

/// Holding spans of one member: per partition, the generation it got the
/// partition at and the one it lost it at (`None`: until its end).
fn spans(seen: &[Seen]) -> Vec<(u32, u64, Option<u64>)> {
    let mut open: HashMap<u32, u64> = HashMap::new();
    let mut spans = Vec::new();
    for entry in seen {
        match entry {
            Seen::Assigned { generation, partitions } => {
                for partition in partitions {
                    open.entry(*partition).or_insert(*generation);
                }
            }
            Seen::Revoked { generation, partitions } => {
                for partition in partitions {
                    let start = open.remove(partition).expect("REVOKED for a partition not assigned");
                    spans.push((*partition, start, Some(*generation)));
                }
            }
            _ => {}
        }
    }
    spans.extend(open.into_iter().map(|(partition, start)| (partition, start, None)));
    spans
}

fn last_generation(seen: &[Seen]) -> u64 {
    seen.iter()
        .filter_map(|entry| match entry {
            Seen::Assigned { generation, .. } | Seen::Revoked { generation, .. } => Some(*generation),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Four members share a 12-partition stream; one is killed mid-stream and
/// another joins. Every event reaches the group, no partition is held by two
/// live members at once, each member sees each key in order, and events are
/// delivered again only from the last commit of the member that lost them.
#[test]
fn members_share_a_stream_while_one_dies_and_one_joins() {
    let server = Server::start(&["--shards", "2", "--group-session-timeout-ms", "3000"]);
    server.create_stream(serde_json::json!({"name": "orders", "partitions": 12}));
    let join = "GROUP orders billing earliest";
    let mut members: Vec<Option<Member>> = (0..4).map(|_| Some(Member::join(server.subscribe, join))).collect();
    let total = 120_000u64;
    let producer = produce(&server, "orders", 2000, total, 2000, Duration::from_millis(50));
    std::thread::sleep(Duration::from_millis(1200));
    let killed_at = Instant::now();
    let dead = members[0].take().unwrap().kill();
    std::thread::sleep(Duration::from_millis(1200));
    members.push(Some(Member::join(server.subscribe, join)));
    producer.join().unwrap();
    // Wait until the group has every event.
    let deadline = Instant::now() + Duration::from_secs(60);
    let delivered = |members: &[Option<Member>]| {
        let mut offsets: HashSet<(u32, u64)> = HashSet::new();
        for seen in members.iter().flatten().map(Member::seen).chain([dead.clone()]) {
            for entry in seen {
                if let Seen::Event { partition, offset, .. } = entry {
                    offsets.insert((partition, offset));
                }
            }
        }
        offsets.len() as u64
    };
    while delivered(&members) < total {
        assert!(Instant::now() < deadline, "the group got {} of {total} events\n{}", delivered(&members), server.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut histories: Vec<Vec<Seen>> = vec![dead.clone()];
    histories.extend(members.iter().flatten().map(Member::seen));
    let dead_generation = last_generation(&dead);
    let dead_partitions: HashSet<u32> =
        spans(&dead).iter().filter(|span| span.2.is_none()).map(|span| span.0).collect();
    assert!(!dead_partitions.is_empty(), "the killed member held partitions");

    // At most one live holder per partition: holding spans of different
    // members never overlap in generations.
    let mut by_partition: HashMap<u32, Vec<(u64, u64, usize)>> = HashMap::new();
    for (index, seen) in histories.iter().enumerate() {
        for (partition, start, end) in spans(seen) {
            let end = end.unwrap_or(if index == 0 { dead_generation } else { u64::MAX });
            by_partition.entry(partition).or_default().push((start, end, index));
        }
    }
    for (partition, spans) in &mut by_partition {
        spans.sort();
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "partition {partition} held by two members at once: {pair:?}");
        }
    }

    // Per member: events only of partitions it holds, offsets consecutive
    // within a holding span, each key in production order within a span.
    let mut span_starts: Vec<Span> = Vec::new();
    for (index, seen) in histories.iter().enumerate() {
        let mut holding: HashMap<u32, usize> = HashMap::new();
        let mut last_offset: HashMap<u32, u64> = HashMap::new();
        let mut last_sequence: HashMap<(u32, Vec<u8>), u64> = HashMap::new();
        for entry in seen {
            match entry {
                Seen::Assigned { generation, partitions } => {
                    for partition in partitions {
                        holding.entry(*partition).or_insert_with(|| {
                            let (partition, generation) = (*partition, *generation);
                            span_starts.push(Span { partition, generation, first: None, acked: None });
                            span_starts.len() - 1
                        });
                    }
                }
                Seen::Revoked { partitions, .. } => {
                    for partition in partitions {
                        holding.remove(partition);
                        last_offset.remove(partition);
                        last_sequence.retain(|(p, _), _| p != partition);
                    }
                }
                Seen::Event { partition, offset, key, payload, .. } => {
                    let span = *holding
                        .get(partition)
                        .unwrap_or_else(|| panic!("member {index} got partition {partition} it does not hold"));
                    span_starts[span].first.get_or_insert(*offset);
                    if let Some(previous) = last_offset.insert(*partition, *offset) {
                        assert_eq!(*offset, previous + 1, "member {index} partition {partition}");
                    }
                    let text = String::from_utf8_lossy(payload);
                    let sequence: u64 = text.split(' ').nth(1).unwrap().parse().unwrap();
                    if let Some(previous) = last_sequence.insert((*partition, key.clone()), sequence) {
                        assert!(sequence > previous, "member {index}: key {key:?} out of order");
                    }
                }
                Seen::CommitOk { partition, next_offset } => {
                    if let Some(&span) = holding.get(partition) {
                        span_starts[span].acked = Some(*next_offset);
                    }
                }
                Seen::Error(_) => {}
            }
        }
        // A commit racing its REVOKED line is refused (not_assigned); any
        // other error is a bug.
        let errors: Vec<&Seen> = seen
            .iter()
            .filter(|entry| matches!(entry, Seen::Error(text) if !text.starts_with("ERR not_assigned")))
            .collect();
        assert!(errors.is_empty(), "member {index}: {errors:?}");
    }
    // Redelivery starts no earlier than the last acknowledged commit of the
    // member that held the partition before.
    span_starts.sort_by_key(|span| (span.partition, span.generation));
    for pair in span_starts.windows(2) {
        let (previous, next) = (&pair[0], &pair[1]);
        if previous.partition != next.partition {
            continue;
        }
        if let (Some(commit), Some(start)) = (previous.acked, next.first) {
            assert!(start >= commit, "partition {} restarted at {start} before commit {commit}", next.partition);
        }
    }
    // The dead member's partitions flowed again within the session timeout
    // plus a second (its connection closed, so at once in fact).
    let resumed = histories[1..]
        .iter()
        .flatten()
        .filter_map(|entry| match entry {
            Seen::Event { partition, at, .. } if dead_partitions.contains(partition) && *at > killed_at => Some(*at),
            _ => None,
        })
        .min()
        .expect("the dead member's partitions were delivered again");
    let gap = resumed - killed_at;
    eprintln!("dead member's partitions delivering again after {gap:?}");
    assert!(gap < Duration::from_millis(3000 + 1000), "took {gap:?}");
    // The join moved at most ceil(12 / 4) partitions.
    let join_generation = histories.last().unwrap().iter().find_map(|entry| match entry {
        Seen::Assigned { generation, .. } => Some(*generation),
        _ => None,
    });
    let moved: usize = histories
        .iter()
        .flatten()
        .filter_map(|entry| match entry {
            Seen::Revoked { generation, partitions } if Some(*generation) == join_generation => Some(partitions.len()),
            _ => None,
        })
        .sum();
    assert!(moved <= 3, "the join moved {moved} partitions");
    let groups: serde_json::Value = serde_json::from_str(&server.get("/groups")).unwrap();
    assert_eq!(groups["groups"][0]["members"].as_array().unwrap().len(), 4, "{groups}");
}

/// Acknowledged commits survive kill -9 of the server at random moments,
/// and a member that joins after the restart resumes from them.
#[test]
fn committed_offsets_survive_kill_9() {
    let mut server = Server::start(&["--shards", "2"]);
    server.create_stream(serde_json::json!({"name": "pay", "partitions": 4}));
    produce(&server, "pay", 100, 40_000, 4000, Duration::ZERO).join().unwrap();
    let mut rng = common::crash_rng();
    let mut last_acked: HashMap<u32, u64> = HashMap::new();
    for round in 0..3 {
        // More events each round, so every round has commits in flight
        // when the server dies.
        let producer = produce(&server, "pay", 100, 40_000, 2000, Duration::from_millis(10));
        let member = Member::join(server.subscribe, "GROUP pay audit earliest");
        std::thread::sleep(Duration::from_millis(100 + rng.next() % 300));
        server.crash();
        let seen = member.kill();
        // The producer's connection died with the server.
        let _ = producer.join();
        for entry in &seen {
            if let Seen::CommitOk { partition, next_offset } = entry {
                last_acked.insert(*partition, *next_offset);
            }
        }
        // Where each partition starts after the restart.
        let starts: Vec<(u32, u64)> = seen
            .iter()
            .filter_map(|entry| match entry {
                Seen::Event { partition, offset, .. } => Some((*partition, *offset)),
                _ => None,
            })
            .collect();
        eprintln!("round {round}: {} events, acked {last_acked:?}", starts.len());
        server.spawn();
        let groups: serde_json::Value = serde_json::from_str(&server.get("/groups")).unwrap();
        let group = &groups["groups"][0];
        for (partition, acked) in &last_acked {
            let committed = group["partitions"][*partition as usize]["committed"].as_u64().unwrap_or(0);
            assert!(committed >= *acked, "round {round}: partition {partition} committed {committed} < acked {acked}");
        }
    }
    // A member joining now starts each partition at its committed offset.
    let groups: serde_json::Value = serde_json::from_str(&server.get("/groups")).unwrap();
    let committed: Vec<u64> = groups["groups"][0]["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|partition| partition["committed"].as_u64().unwrap_or(0))
        .collect();
    let member = Member::join(server.subscribe, "GROUP pay audit earliest");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut firsts: HashMap<u32, u64> = HashMap::new();
    while firsts.len() < 4 && Instant::now() < deadline {
        for entry in member.seen() {
            if let Seen::Event { partition, offset, .. } = entry {
                firsts.entry(partition).or_insert(offset);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for (partition, first) in &firsts {
        assert_eq!(*first, committed[*partition as usize], "partition {partition} resumed elsewhere");
    }
    assert!(!last_acked.is_empty(), "some commits were acknowledged");
}

/// A hold group whose only member stops reading stalls the producers, with
/// memory and disk bounded; once it reads again everything is delivered and
/// the producers finish. A lagging non-hold group never stalls them.
#[test]
fn hold_group_pauses_producers_until_it_catches_up() {
    let server = Server::start(&[
        "--shards",
        "2",
        "--group-hold-lag-bytes",
        "1000000",
        "--segment-bytes",
        "1048576",
        "--group-session-timeout-ms",
        "20000",
        // The lag can pass the limit by what is in flight when the owner
        // holds the partition: at most the credit windows.
        "--credit-window-bytes",
        "1048576",
        "--line-size-max",
        "65536",
    ]);
    server.create_stream(serde_json::json!({"name": "sensors", "partitions": 4, "retention_bytes": 1048576}));
    let payload = "x".repeat(100);
    let produce_payloads = |count: u64| {
        let mut producer = server.producer();
        let payload = payload.clone();
        let done = Arc::new(AtomicU64::new(0));
        let progress = done.clone();
        let thread = std::thread::spawn(move || {
            producer.send(b"#STREAM sensors\n");
            for start in (0..count).step_by(1000) {
                let mut bytes = Vec::new();
                for index in start..start + 1000 {
                    bytes.extend_from_slice(format!("key{} {index} {payload}\n", index % 64).as_bytes());
                }
                producer.send(&bytes);
                producer.flush();
                progress.store(start + 1000, Ordering::Relaxed);
            }
            producer.sync();
        });
        (thread, done)
    };
    // A non-hold group that stops reading does not stall anyone.
    let idle = Member::join(server.subscribe, "GROUP sensors dashboards latest");
    std::thread::sleep(Duration::from_millis(300));
    idle.paused.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let (thread, _) = produce_payloads(50_000);
    thread.join().unwrap();
    eprintln!("50k events past a paused non-hold group in {:?}", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(server.metric("spate_group_hold_stalls_total"), 0.0);

    // A hold group: its member reads a little, then stops.
    let member = Member::join(server.subscribe, "GROUP sensors archive latest hold");
    std::thread::sleep(Duration::from_millis(500));
    member.paused.store(true, Ordering::Relaxed);
    let base = server.stream_end("sensors");
    let count = 100_000u64; // 100k * ~115 B = 11.5 MB, far past the 1 MB hold
    let (thread, progress) = produce_payloads(count);
    // The producer stalls: the stream stops growing well before the end.
    let mut plateau = 0;
    let mut previous = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while plateau < 10 {
        assert!(Instant::now() < deadline, "ingest never stalled\n{}", server.log());
        std::thread::sleep(Duration::from_millis(100));
        let end = server.stream_end("sensors");
        plateau = if end == previous { plateau + 1 } else { 0 };
        previous = end;
    }
    let held_at = previous - base;
    eprintln!("held after {held_at} events (producer at {})", progress.load(Ordering::Relaxed));
    // 1 MB of lag per partition (4), plus at most 1 source x 2 owners x
    // 1 MiB of credits in flight.
    assert!(held_at * 115 < 4 * 1_000_000 + 2 * 1_048_576, "held only after {held_at} of {count}");
    assert!(server.metric("spate_group_hold_stalls_total") > 0.0);
    assert!(server.metric("spate_group_held_partitions") > 0.0);
    // Disk: per partition, retention (1 MiB) + the hold lag (1 MB, which
    // retention must keep) + the active segment (1 MiB), plus what was in
    // flight; the 17 MB produced would not fit.
    let disk = server.metric("spate_disk_bytes");
    eprintln!("disk while held: {disk} bytes");
    assert!(disk < 4.0 * (3.0 * 1_048_576.0) + 2.0 * 1_048_576.0, "disk {disk}");
    let rss = server.metric("spate_process_resident_bytes");
    let bound = server.metric("spate_memory_bound_bytes");
    assert!(rss < bound, "rss {rss} over the bound {bound}");
    // The member reads again: every event arrives and the producer ends.
    member.paused.store(false, Ordering::Relaxed);
    thread.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events: HashSet<(u32, u64)> = member
            .seen()
            .into_iter()
            .filter_map(|entry| match entry {
                Seen::Event { partition, offset, .. } => Some((partition, offset)),
                _ => None,
            })
            .collect();
        let mut ends = 0;
        for (partition, next) in server.streams()["sensors"]["next_offsets"].as_array().unwrap().iter().enumerate() {
            let first = events.iter().filter(|(p, _)| *p == partition as u32).map(|(_, o)| *o).min().unwrap_or(0);
            ends += next.as_u64().unwrap() - first;
        }
        if events.len() as u64 >= ends && ends > 0 {
            assert!(events.len() as u64 >= count, "the hold member got {} events", events.len());
            break;
        }
        assert!(Instant::now() < deadline, "the hold member got {} of {ends}", events.len());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.metric("spate_group_held_partitions"), 0.0);
}

/// Bad lines from a member get a clear `ERR` and change nothing; the
/// connection and its partitions survive. A bad `GROUP` line or an unknown
/// stream is refused and closed.
#[test]
fn bad_member_lines_are_refused_and_change_nothing() {
    let server = Server::start(&["--shards", "2", "--partitions", "4"]);
    let refused = |line: &str| {
        let mut socket = TcpStream::connect(server.subscribe).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        socket.write_all(format!("{line}\n").as_bytes()).unwrap();
        let mut reply = String::new();
        BufReader::new(socket).read_line(&mut reply).unwrap();
        reply
    };
    assert!(refused("GROUP default").starts_with("ERR bad_request"), "too few words");
    assert!(refused("GROUP default Bad/Name").starts_with("ERR bad_request"));
    assert!(refused("GROUP nosuch g").starts_with("ERR unknown_stream"));
    assert!(refused("GROUP default g sometimes").starts_with("ERR bad_request"));

    produce(&server, "default", 50, 1000, 1000, Duration::ZERO).join().unwrap();
    let mut socket = TcpStream::connect(server.subscribe).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    socket.write_all(b"GROUP default g earliest\n").unwrap();
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let mut next = || {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    };
    assert_eq!(next(), "ASSIGNED 1 0,1,2,3");
    let mut events = 0;
    while events < 1000 {
        let line = next();
        assert!(line.chars().next().unwrap().is_ascii_digit(), "{line}");
        events += 1;
    }
    let long = "x".repeat(2000);
    socket
        .write_all(
            format!("COMMIT 9 1\nCOMMIT 0 999999\nCOMMIT zero 1\nHELLO\n{long}\nGROUP default g\nCOMMIT 0 3\n")
                .as_bytes(),
        )
        .unwrap();
    let replies: Vec<String> = (0..7).map(|_| next()).collect();
    assert!(replies[0].starts_with("ERR partition_out_of_range"), "{replies:?}");
    assert!(replies[1].starts_with("ERR offset_out_of_range"), "{replies:?}");
    assert!(replies[2].starts_with("ERR bad_request: partition"), "{replies:?}");
    assert!(replies[3].starts_with("ERR bad_request: unknown command"), "{replies:?}");
    assert!(replies[4].starts_with("ERR bad_request: line of"), "{replies:?}");
    assert!(replies[5].starts_with("ERR bad_request: this connection already joined"), "{replies:?}");
    assert_eq!(replies[6], "OK COMMIT 0 3");
    let groups: serde_json::Value = serde_json::from_str(&server.get("/groups")).unwrap();
    assert_eq!(groups["groups"][0]["partitions"][0]["committed"], 3, "{groups}");
    assert_eq!(groups["groups"][0]["members"].as_array().unwrap().len(), 1);
}

/// A member's overlong lines are refused with their real sizes (5,000 and
/// 100,000 bytes: different, true messages, where both used to say the
/// 4096 bytes of one read), and the lines after them are served.
#[test]
fn overlong_member_lines_are_measured() {
    let server = Server::start(&["--shards", "1", "--partitions", "1"]);
    let mut socket = TcpStream::connect(server.subscribe).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    socket.write_all(b"GROUP default g earliest\n").unwrap();
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let mut next = || {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        line.trim_end().to_string()
    };
    assert_eq!(next(), "ASSIGNED 1 0");
    for size in [5_000, 100_000] {
        socket.write_all(format!("{}\n", "x".repeat(size)).as_bytes()).unwrap();
    }
    socket.write_all(b"COMMIT 0 0\n").unwrap();
    assert_eq!(next(), "ERR bad_request: line of 5000 bytes, limit 1024");
    assert_eq!(next(), "ERR bad_request: line of 100000 bytes, limit 1024");
    assert_eq!(next(), "OK COMMIT 0 0", "the connection goes on");
}

/// A member that goes silent (no line, not reading: a hung process whose
/// connection stays open) is cut after the session timeout, and its
/// partitions deliver to the others within the timeout plus a second.
#[test]
fn a_silent_member_is_cut_after_the_session_timeout() {
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--group-session-timeout-ms", "1000"]);
    let mut silent = TcpStream::connect(server.subscribe).unwrap();
    silent.write_all(b"GROUP default g earliest\n").unwrap();
    // Its last line: the join.
    let went_silent = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    let alive = Member::join(server.subscribe, "GROUP default g earliest");
    std::thread::sleep(Duration::from_millis(300));
    let producer = produce(&server, "default", 50, 20_000, 500, Duration::from_millis(20));
    let deadline = went_silent + Duration::from_millis(1000 + 1000);
    let mut partitions: HashSet<u32> = HashSet::new();
    while partitions.len() < 4 {
        assert!(Instant::now() < deadline, "the live member has {partitions:?} after {:?}", went_silent.elapsed());
        partitions = alive
            .seen()
            .iter()
            .filter_map(|entry| match entry {
                Seen::Event { partition, .. } => Some(*partition),
                _ => None,
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("all partitions delivering to the live member {:?} after the other went silent", went_silent.elapsed());
    producer.join().unwrap();
    let mut reply = String::new();
    silent.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = BufReader::new(&mut silent).read_to_string(&mut reply);
    assert!(reply.contains("ERR session_timeout"), "{reply}");
    assert!(server.metric("spate_group_members_expelled_total") >= 1.0);
}
