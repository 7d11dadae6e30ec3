//! Keyed aggregates end to end, over TCP and HTTP against a real server:
//! closed windows on the output stream equal an independent computation
//! over what was produced (or, after crashes, over what the input stream
//! holds), while partitions migrate and across `kill -9`s; late events,
//! the key limit and malformed values are counted as documented.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Server, Subscriber};
use serde_json::{Value, json};

/// Window size of the test aggregates, in ms of event time.
const WINDOW_MS: u64 = 1000;
/// Event time of the first event; events advance 1 ms per few events of a connection.
const TIME_BASE_MS: u64 = 1_700_000_000_000;
/// Allowed lateness: far more than connections drift apart, so no event is
/// late (61 open windows per key, within the limit of 64).
const LATENESS_MS: u64 = 60_000;

/// (aggregate, key, window start) -> (value, count)
type Windows = BTreeMap<(String, String, u64), (f64, u64)>;

fn declare_count_and_sum(server: &Server, stream: &str, output: &str, lateness_ms: u64) {
    for (name, kind, value) in [("n", "count", None), ("total", "sum", Some("json:/v"))] {
        let mut body = json!({
            "name": name, "kind": kind, "time": "json:/ts", "allowed_lateness_ms": lateness_ms,
            "window": {"type": "tumbling", "size_ms": WINDOW_MS}, "output": output,
        });
        if let Some(value) = value {
            body["value"] = value.into();
        }
        let (status, answer) = server.http("POST", &format!("/streams/{stream}/aggregates"), Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
}

/// Adds one event to the independent computation.
fn expect(windows: &mut Windows, key: &str, ts: u64, value: u64) {
    let start = ts - ts % WINDOW_MS;
    let count = windows.entry(("n".into(), key.into(), start)).or_insert((0.0, 0));
    count.0 += 1.0;
    count.1 += 1;
    let sum = windows.entry(("total".into(), key.into(), start)).or_insert((0.0, 0));
    sum.0 += value as f64;
    sum.1 += 1;
}

/// Sends one event per partition of `stream` (`partitions` of them) with an
/// event time a day past everything: every window before it closes.
fn flush_all_windows(server: &Server, stream: &str, partitions: u32) {
    let mut covered = vec![false; partitions as usize];
    let mut producer = server.producer();
    producer.send(format!("#STREAM {stream}\n").as_bytes());
    let mut index = 0;
    while covered.iter().any(|done| !done) {
        let key = format!("flush-{index}");
        let partition = spate::protocol::partition_of(key.as_bytes(), partitions) as usize;
        if !covered[partition] {
            covered[partition] = true;
            let ts = TIME_BASE_MS + 86_400_000 * 30;
            producer.send(format!("{key} {{\"ts\":{ts},\"v\":0}}\n").as_bytes());
        }
        index += 1;
    }
    producer.sync();
}

/// Reads all of `output` and returns its windows, checking that a window
/// repeated after a crash (same aggregate, partition and sequence) is
/// repeated identically, that no (aggregate, key, window) has two
/// sequences, and ignoring the flush keys. Also returns how many events
/// the stream held.
fn read_output(server: &Server, output: &str) -> (Windows, u64) {
    let total = server.stream_end(output);
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {output} * earliest"));
    let mut by_sequence: HashMap<(String, u64, u64), (String, Value)> = HashMap::new();
    let mut windows = Windows::new();
    for index in 0..total {
        let event = subscriber
            .next_event()
            .unwrap_or_else(|| panic!("{output}: ended after {index} of {total}: {:?}", subscriber.notices));
        let key = String::from_utf8(event.key).unwrap();
        let payload: Value = serde_json::from_slice(&event.payload).unwrap();
        let aggregate = payload["aggregate"].as_str().unwrap().to_string();
        let identity =
            (aggregate.clone(), payload["partition"].as_u64().unwrap(), payload["sequence"].as_u64().unwrap());
        if let Some((first_key, first)) = by_sequence.get(&identity) {
            assert_eq!((first_key, first), (&key, &payload), "a window emitted again differs: {identity:?}");
            continue;
        }
        by_sequence.insert(identity, (key.clone(), payload.clone()));
        if key.starts_with("flush-") {
            continue;
        }
        let start = payload["window_start_ms"].as_u64().unwrap();
        assert_eq!(payload["window_end_ms"].as_u64().unwrap(), start + WINDOW_MS);
        let value = (payload["value"].as_f64().unwrap(), payload["count"].as_u64().unwrap());
        let previous = windows.insert((aggregate, key, start), value);
        assert!(previous.is_none(), "a window closed twice under different sequences: {payload}");
    }
    (windows, total)
}

fn assert_windows_equal(expected: &Windows, found: &Windows, context: &str) {
    let missing: Vec<_> = expected.iter().filter(|(window, _)| !found.contains_key(*window)).take(5).collect();
    let extra: Vec<_> = found.iter().filter(|(window, _)| !expected.contains_key(*window)).take(5).collect();
    let wrong: Vec<_> = expected
        .iter()
        .filter_map(|(window, value)| found.get(window).filter(|got| *got != value).map(|got| (window, value, got)))
        .take(5)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && wrong.is_empty(),
        "{context}: {} windows expected, {} found; missing {missing:?}, extra {extra:?}, wrong (expected, found) {wrong:?}",
        expected.len(),
        found.len()
    );
}

/// A key for event `index` of a connection: a tenth of the events go to 2000
/// cold keys, the rest to 8 hot ones (a hot spot the balancer moves).
fn key_for(state: &mut u64) -> String {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    if state.is_multiple_of(10) { format!("cold{}", (*state >> 8) % 2000) } else { format!("hot{}", (*state >> 8) % 8) }
}

/// Counts and sums per key per tumbling window equal an independent
/// computation over every event produced, with many keys and a hot spot
/// while partitions migrate; the running view (`GET /aggregates/NAME?key=K`,
/// `/top`) agrees too.
#[test]
fn windows_equal_an_independent_count_while_partitions_migrate() {
    const CONNECTIONS: u64 = 4;
    const DURATION: Duration = Duration::from_secs(6);
    let server = Server::start(&[
        "--shards",
        "4",
        "--partitions",
        "16",
        "--rebalance-interval-ms",
        "50",
        "--rebalance-cooldown-ms",
        "300",
        "--consolidate",
        "off",
    ]);
    server.create_stream(json!({ "name": "out", "partitions": 4 }));
    declare_count_and_sum(&server, "default", "out", LATENESS_MS);
    let (status, answer) = server.http(
        "POST",
        "/streams/default/aggregates",
        Some(&json!({"name": "running", "kind": "sum", "value": "json:/v", "window": {"type": "none"}})),
    );
    assert_eq!(status, 201, "{answer}");
    let started = Instant::now();
    let producers: Vec<_> = (0..CONNECTIONS)
        .map(|connection| {
            let address = server.ingest;
            std::thread::spawn(move || {
                let mut producer = common::Producer::connect(address);
                let mut windows = Windows::new();
                let mut running: HashMap<String, u64> = HashMap::new();
                let mut state = 0x9e37_79b9_7f4a_7c15 ^ (connection + 1);
                let mut chunk = Vec::with_capacity(64 * 1024);
                let mut sequence = 0u64;
                while started.elapsed() < DURATION {
                    chunk.clear();
                    for _ in 0..500 {
                        let key = key_for(&mut state);
                        let ts = TIME_BASE_MS + sequence / 4;
                        let value = sequence % 97;
                        writeln!(chunk, "{key} {{\"ts\":{ts},\"v\":{value}}}").unwrap();
                        expect(&mut windows, &key, ts, value);
                        *running.entry(key).or_insert(0) += value;
                        sequence += 1;
                    }
                    producer.send(&chunk);
                    producer.flush();
                    std::thread::sleep(Duration::from_millis(1));
                }
                producer.sync();
                (windows, running, sequence)
            })
        })
        .collect();
    let mut expected = Windows::new();
    let mut running: HashMap<String, u64> = HashMap::new();
    let mut produced = 0;
    for producer in producers {
        let (windows, sums, count) = producer.join().unwrap();
        produced += count;
        for (window, (value, count)) in windows {
            let entry = expected.entry(window).or_insert((0.0, 0));
            entry.0 += value;
            entry.1 += count;
        }
        for (key, sum) in sums {
            *running.entry(key).or_insert(0) += sum;
        }
    }
    let migrations = server.total("migrations_completed");
    eprintln!("{produced} events, {} windows expected, {migrations} migrations", expected.len());
    assert!(migrations > 0, "the hot spot made partitions move");
    for key in ["hot0", "hot5", "cold7"] {
        let view: Value = serde_json::from_str(&server.get(&format!("/aggregates/running?key={key}"))).unwrap();
        assert_eq!(view["open"][0]["value"].as_f64(), Some(running[key] as f64), "running sum of {key}: {view}");
    }
    let top: Value = serde_json::from_str(&server.get("/aggregates/running/top?n=3")).unwrap();
    let mut largest: Vec<(&String, &u64)> = running.iter().collect();
    largest.sort_by(|left, right| right.1.cmp(left.1).then(left.0.cmp(right.0)));
    let top_keys: Vec<&str> =
        top["top"].as_array().unwrap().iter().map(|entry| entry["key"].as_str().unwrap()).collect();
    let largest_keys: Vec<&str> = largest.iter().take(3).map(|(key, _)| key.as_str()).collect();
    assert_eq!(top_keys, largest_keys, "top 3 merged across shards: {top}");
    flush_all_windows(&server, "default", 16);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut found = Windows::new();
    while Instant::now() < deadline {
        found = read_output(&server, "out").0;
        if found.len() >= expected.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_windows_equal(&expected, &found, "after migrations");
    assert_eq!(server.metric("spate_aggregate_late_events_total"), 0.0);
    assert_eq!(server.metric("spate_aggregate_values_malformed_total"), 0.0);
    assert!(server.metric("spate_aggregate_windows_emitted_total") >= expected.len() as f64);
}

/// Produces `c<connection>k<j> {"ts":..,"v":..}` lines with a `#SYNC` every
/// 500 until `stop` or the connection fails; event times start at `time_ms`.
fn produce_until_cut(address: SocketAddr, connection: u64, time_ms: u64, stop: &AtomicBool) {
    let Ok(socket) = TcpStream::connect(address) else { return };
    socket.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(socket.try_clone().unwrap());
    let mut writer = std::io::BufWriter::with_capacity(64 * 1024, socket);
    let mut sequence = 0u64;
    let mut batch = Vec::with_capacity(64 * 1024);
    while !stop.load(Ordering::Relaxed) {
        batch.clear();
        for _ in 0..500 {
            let ts = time_ms + sequence / 10;
            writeln!(batch, "c{connection}k{} {{\"ts\":{ts},\"v\":{}}}", sequence % 300, sequence % 89).unwrap();
            sequence += 1;
        }
        writeln!(batch, "#SYNC s{sequence}").unwrap();
        if writer.write_all(&batch).and_then(|_| writer.flush()).is_err() {
            return;
        }
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line.starts_with("OK") => break,
                Ok(_) => assert!(!line.starts_with("ERR"), "{line}"),
            }
        }
    }
}

/// The independent computation over what the input stream holds.
fn windows_of_stream(server: &Server, stream: &str) -> Windows {
    let total = server.stream_end(stream);
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {stream} * earliest"));
    let mut windows = Windows::new();
    for index in 0..total {
        let event = subscriber.next_event().unwrap_or_else(|| panic!("{stream}: ended after {index} of {total}"));
        let key = String::from_utf8(event.key).unwrap();
        if key.starts_with("flush-") {
            continue;
        }
        let payload: Value = serde_json::from_slice(&event.payload).unwrap();
        expect(&mut windows, &key, payload["ts"].as_u64().unwrap(), payload["v"].as_u64().unwrap());
    }
    windows
}

/// `kill -9` at random moments while producers write, each followed by an
/// immediate restart: at the end every window on the output stream equals
/// the independent computation over what the input stream holds (no event
/// counted twice or missed), and each window is there once (repeats after
/// a crash are identical, with the same sequence).
#[test]
fn windows_are_exact_across_kill_9_loops() {
    const KILLS: u64 = 6;
    const CONNECTIONS: u64 = 3;
    let mut rng = common::crash_rng();
    let mut server = Server::start(&["--shards", "2", "--partitions", "4", "--aggregate-checkpoint-ms", "100"]);
    server.create_stream(json!({ "name": "out", "partitions": 2 }));
    // Windows close all the time (1 s of event time is 10 000 events of a
    // connection; 5 s of lateness is 50 000, far more than connections drift).
    declare_count_and_sum(&server, "default", "out", 5_000);
    for kill in 0..KILLS {
        let stop = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..CONNECTIONS)
            .map(|connection| {
                let (address, stop) = (server.ingest, stop.clone());
                // Each round's event times start past the last round's.
                let time_ms = TIME_BASE_MS + kill * 1_000_000;
                std::thread::spawn(move || produce_until_cut(address, kill * CONNECTIONS + connection, time_ms, &stop))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300 + rng.next() % 900));
        server.crash();
        stop.store(true, Ordering::Relaxed);
        for producer in producers {
            producer.join().unwrap();
        }
        server.spawn();
    }
    let listed: Value = serde_json::from_str(&server.get("/streams/default/aggregates")).unwrap();
    assert_eq!(listed["aggregates"].as_array().unwrap().len(), 2, "the declarations survived: {listed}");
    flush_all_windows(&server, "default", 4);
    let expected = windows_of_stream(&server, "default");
    assert!(expected.len() > 100, "the producers got events in: {} windows", expected.len());
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut found, mut held) = (Windows::new(), 0);
    while Instant::now() < deadline {
        (found, held) = read_output(&server, "out");
        if found.len() >= expected.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("{} windows, output stream holds {held} events (repeats included), seed {}", expected.len(), rng.seed);
    assert_windows_equal(&expected, &found, &format!("after {KILLS} kill -9s (seed {})", rng.seed));
    assert_eq!(server.metric("spate_aggregate_late_events_total"), 0.0);
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
}

/// Late events inside the allowed lateness count and beyond it are dropped
/// and counted; at the key limit new keys are refused and counted while
/// known keys keep counting; a malformed value is counted and the event is
/// still stored; declarations are checked, listed, persisted across a
/// restart and deleted (over HTTP and the CLI).
#[test]
fn lateness_key_limit_malformed_values_and_declarations() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "1", "--aggregate-keys-max", "3"]);
    server.create_stream(json!({ "name": "out", "partitions": 1 }));
    let declare = |body: Value| server.http("POST", "/streams/default/aggregates", Some(&body));
    let (status, answer) = declare(json!({"name": "late", "kind": "sum", "value": "json:/v", "time": "json:/ts",
        "allowed_lateness_ms": 500, "window": {"type": "tumbling", "size_ms": 1000}, "output": "out"}));
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = declare(json!({"name": "late", "kind": "count", "window": {"type": "none"}}));
    assert_eq!(status, 409, "names are unique: {answer}");
    let (status, answer) = declare(json!({"name": "x", "kind": "sum", "window": {"type": "none"}}));
    assert_eq!((status, answer.contains("value")), (400, true), "sum needs a value: {answer}");
    let (status, answer) = declare(json!({"name": "x", "kind": "count", "window": {"type": "tumbling", "size_ms": 10},
        "output": "nowhere"}));
    assert_eq!((status, answer.contains("unknown_output")), (400, true), "{answer}");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["aggregate", "create", "default", "--name", "per-key", "--kind", "count", "--admin"])
        .arg(server.admin.to_string())
        .output()
        .unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));

    // Event times: the watermark is max ts - 500.
    let mut producer = server.producer();
    let lines = [
        "a {\"ts\":10000,\"v\":1}",
        "a {\"ts\":11200,\"v\":2}",  // watermark 10700: window 10000 still open
        "a {\"ts\":10900,\"v\":4}",  // late but within the lateness: counts in 10000
        "a {\"ts\":11600,\"v\":8}",  // watermark 11100: window 10000 closes
        "a {\"ts\":10950,\"v\":16}", // beyond the lateness: dropped
        "a {\"ts\":11700,\"v\":\"many\"}",
        "b {\"ts\":11700,\"v\":1}",
        "c {\"ts\":11700,\"v\":1}",
        "d {\"ts\":11700,\"v\":1}", // a fourth key: refused
        "a {\"ts\":11700,\"v\":32}",
    ];
    for line in lines {
        producer.send(format!("{line}\n").as_bytes());
    }
    producer.sync();
    let closed_deadline = Instant::now() + Duration::from_secs(10);
    while server.stream_end("out") < 1 && Instant::now() < closed_deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB out * earliest");
    let window = subscriber.next_event().expect("the closed window");
    let payload: Value = serde_json::from_slice(&window.payload).unwrap();
    assert_eq!(
        (window.key.as_slice(), payload["value"].as_f64(), payload["count"].as_u64()),
        (&b"a"[..], Some(5.0), Some(2))
    );
    let view: Value = serde_json::from_str(&server.get("/aggregates/late?key=a")).unwrap();
    assert_eq!(view["open"][0]["value"].as_f64(), Some(42.0), "{view}");
    assert_eq!(server.metric("spate_aggregate_late_events_total"), 1.0);
    assert_eq!(server.metric("spate_aggregate_values_malformed_total"), 1.0);
    assert_eq!(server.metric("spate_aggregate_keys_refused_total"), 2.0, "d refused by both aggregates");
    assert_eq!(server.stream_end("default"), lines.len() as u64, "every event is stored");
    let (status, _) = server.http("GET", "/aggregates/late?key=d", None);
    assert_eq!(status, 404, "d was refused");
    let per_key: Value = serde_json::from_str(&server.get("/aggregates/per-key?key=a")).unwrap();
    assert_eq!(per_key["open"][0]["value"].as_f64(), Some(7.0), "a running count counts late and malformed: {per_key}");

    server.crash();
    server.spawn();
    let listed: Value = serde_json::from_str(&server.get("/streams/default/aggregates")).unwrap();
    let names: Vec<&str> = listed["aggregates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["declaration"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["late", "per-key"]);
    let view: Value = serde_json::from_str(&server.get("/aggregates/late?key=a")).unwrap();
    assert_eq!(view["open"][0]["value"].as_f64(), Some(42.0), "the state survived kill -9: {view}");
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
        .args(["aggregate", "delete", "default", "per-key", "--admin"])
        .arg(server.admin.to_string())
        .output()
        .unwrap();
    assert!(cli.status.success(), "{}", String::from_utf8_lossy(&cli.stderr));
    let (status, _) = server.http("GET", "/aggregates/per-key?key=a", None);
    assert_eq!(status, 404, "deleted");
}

/// Declares a count in tumbling 500 ms arrival-time windows from `stream` to
/// `output`; returns the status and body.
fn declare_count(server: &Server, name: &str, stream: &str, output: &str) -> (u16, String) {
    let body = json!({"name": name, "kind": "count", "window": {"type": "tumbling", "size_ms": 500}, "output": output});
    server.http("POST", &format!("/streams/{stream}/aggregates"), Some(&body))
}

/// Sends one event to `stream`, waits two seconds (four windows of 500 ms)
/// and returns the events each of `streams` then holds.
fn one_event_then_counts(server: &Server, stream: &str, streams: &[&str]) -> Vec<u64> {
    let mut producer = server.producer();
    producer.send(format!("#STREAM {stream}\nk one\n").as_bytes());
    producer.sync();
    std::thread::sleep(Duration::from_secs(2));
    streams.iter().map(|name| server.stream_end(name)).collect()
}

/// A declaration that would close a cycle of streams (two or three long) is
/// refused with 409 naming the cycle, so one event cannot feed itself for
/// ever; chains are accepted, and after a delete a declaration is checked
/// against what is left.
#[test]
fn declarations_that_close_a_cycle_are_refused_naming_it() {
    let server = Server::start(&["--shards", "2", "--partitions", "1"]);
    for name in ["in", "out", "a", "b", "c"] {
        server.create_stream(json!({ "name": name, "partitions": 1 }));
    }
    assert_eq!(declare_count(&server, "fwd", "in", "out").0, 201);
    let (status, body) = declare_count(&server, "back", "out", "in");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("cycle: in -> out -> in (aggregates fwd, back)"), "{body}");
    assert_eq!(one_event_then_counts(&server, "in", &["in", "out"]), [1, 1], "one event, one window, no loop");

    assert_eq!(declare_count(&server, "ab", "a", "b").0, 201, "a chain");
    assert_eq!(declare_count(&server, "bc", "b", "c").0, 201, "a longer chain");
    let (status, body) = declare_count(&server, "ca", "c", "a");
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("cycle: a -> b -> c -> a (aggregates ab, bc, ca)"), "{body}");

    let (status, body) = server.http("DELETE", "/streams/b/aggregates/bc", None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(declare_count(&server, "ca", "c", "a").0, 201, "no cycle once bc is gone");
    let (status, body) = declare_count(&server, "bc", "b", "c");
    assert_eq!(status, 409, "declared again, it would close the cycle the other way: {body}");
    assert!(body.contains("cycle: c -> a -> b -> c (aggregates ca, ab, bc)"), "{body}");
    assert_eq!(one_event_then_counts(&server, "c", &["a", "b", "c"]), [1, 1, 1], "the chain c -> a -> b ends");
}

/// A catalog written before cycles were refused (here: edited on disk) does
/// not stop the server: the aggregate that closes the cycle is suspended
/// (listed with its cycle, logged, not run), so one event does not feed
/// itself; new cycles are still refused, and deleting the other aggregate
/// of the cycle starts the suspended one.
#[test]
fn a_cycle_in_an_older_catalog_is_suspended_not_run() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "1"]);
    for name in ["in", "out"] {
        server.create_stream(json!({ "name": name, "partitions": 1 }));
    }
    assert_eq!(declare_count(&server, "fwd", "in", "out").0, 201);
    server.crash();
    let catalog_path = server.data_dir.join("streams.json");
    let mut catalog: Value = serde_json::from_slice(&std::fs::read(&catalog_path).unwrap()).unwrap();
    let aggregates = catalog["aggregates"].as_array_mut().unwrap();
    let mut back = aggregates[0].clone();
    back["name"] = json!("back");
    back["stream"] = json!("out");
    back["output"] = json!("in");
    aggregates.push(back);
    std::fs::write(&catalog_path, serde_json::to_vec_pretty(&catalog).unwrap()).unwrap();

    server.spawn();
    assert!(server.log().contains("aggregate back on stream out is suspended"), "{}", server.log());
    let listed: Value = serde_json::from_str(&server.get("/streams/out/aggregates")).unwrap();
    let suspended = listed["aggregates"][0]["suspended"].as_str().unwrap_or_default().to_string();
    assert_eq!(suspended, "cycle: in -> out -> in (aggregates fwd, back)", "{listed}");
    assert_eq!(one_event_then_counts(&server, "in", &["in", "out"]), [1, 1], "the suspended aggregate does not run");
    let (status, body) = declare_count(&server, "back2", "out", "in");
    assert_eq!(status, 409, "{body}");

    let (status, body) = server.http("DELETE", "/streams/in/aggregates/fwd", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"back\""), "back resumes: {body}");
    let listed: Value = serde_json::from_str(&server.get("/streams/out/aggregates")).unwrap();
    assert!(listed["aggregates"][0]["suspended"].is_null(), "{listed}");
    assert_eq!(one_event_then_counts(&server, "out", &["in", "out"]), [2, 2], "back counts out into in, once");
}

/// Events in through the JSON listener carry where the value the stream's
/// aggregates read starts (the listener finds it while it validates the
/// line; `RecordRef::value_at`), and the owner reads it there rather than
/// scanning the JSON again. Sums and maxima over such events equal what is
/// computed here, whatever the member's place, whitespace after its colon
/// (no hint then), a nested member of the same name before it, an escaped
/// first name (the first member of the name counts, read without a hint),
/// a string value; a missing or non-numeric value is counted malformed.
#[test]
fn aggregates_read_json_listener_events_right_with_the_value_hint() {
    let server = Server::start(&["--json-key", "user"]);
    for (name, kind) in [("total", "sum"), ("peak", "max")] {
        let body = json!({"name": name, "kind": kind, "value": "json:/ms", "window": {"type": "none"}});
        let (status, answer) = server.http("POST", "/streams/default/aggregates", Some(&body));
        assert_eq!(status, 201, "{answer}");
    }
    let lines: [&str; 7] = [
        r#"{"user":"u1","ms":5}"#,
        r#"{"ms": 7 ,"user":"u1"}"#,
        r#"{"user":"u2","o":{"ms":1000},"ms":3}"#,
        r#"{"user":"u2","m\u0073":4,"ms":1000}"#,
        r#"{"user":"u3","ms":"9"}"#,
        r#"{"user":"u3","x":1}"#,
        r#"{"user":"u3","ms":true}"#,
    ];
    const ROUNDS: u64 = 2_000;
    let mut producer = common::Producer::connect(server.ingest_json);
    let mut chunk = String::new();
    for _ in 0..ROUNDS {
        for line in lines {
            chunk.push_str(line);
            chunk.push('\n');
        }
    }
    producer.send(chunk.as_bytes());
    let replies = producer.sync();
    assert!(replies.iter().all(|line| line.starts_with("OK")), "{replies:?}");
    for (key, sum, max) in [("u1", 12, 7), ("u2", 7, 4), ("u3", 9, 9)] {
        let view: Value = serde_json::from_str(&server.get(&format!("/aggregates/total?key={key}"))).unwrap();
        assert_eq!(view["open"][0]["value"].as_f64(), Some((sum * ROUNDS) as f64), "sum of {key}: {view}");
        let view: Value = serde_json::from_str(&server.get(&format!("/aggregates/peak?key={key}"))).unwrap();
        assert_eq!(view["open"][0]["value"].as_f64(), Some(max as f64), "max of {key}: {view}");
    }
    // Two malformed lines per round, for each of the two aggregates.
    assert_eq!(server.metric("spate_aggregate_values_malformed_total"), (2 * 2 * ROUNDS) as f64);
}
