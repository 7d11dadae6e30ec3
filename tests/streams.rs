//! Named streams, end to end: created, used, listed and deleted over the
//! admin port and the CLI; `#STREAM` on ingest and `SUB <stream> ...` on the
//! subscribe port; the catalog and the logs survive a restart; retention by
//! bytes and by age deletes segments and subscribers get `TRUNCATED`; one
//! server per data directory.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Addresses, Server, Subscriber};
use serde_json::json;

/// Every event of `stream` from offset 0, per partition, until `count` arrived.
fn read_all(server: &Server, stream: &str, count: u64) -> Vec<common::Delivered> {
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {stream} * earliest"));
    let events = subscriber.take(count as usize);
    assert!(subscriber.notices.is_empty(), "{:?}", subscriber.notices);
    events
}

#[test]
fn streams_are_created_used_listed_and_deleted() {
    let server = Server::start(&["--shards", "2", "--partitions", "4"]);
    let created = server.create_stream(json!({ "name": "orders", "partitions": 3 }));
    assert_eq!(created["name"], "orders");
    assert_eq!(created["partitions"], 3);

    // Bad requests are refused with a reason and change nothing.
    let (status, body) = server.http("POST", "/streams", Some(&json!({ "name": "orders", "partitions": 1 })));
    assert_eq!(status, 409, "{body}");
    let (status, body) = server.http("POST", "/streams", Some(&json!({ "name": "Bad Name!", "partitions": 1 })));
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.http("POST", "/streams", Some(&json!({ "name": "x", "partitions": 0 })));
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.http("POST", "/streams", Some(&json!({ "name": "huge", "partitions": 100_000 })));
    assert!(status == 400 || status == 409, "{status} {body}");

    // One connection writes to default, then orders, then an unknown stream
    // (one ERR for the whole run of lines), then orders again.
    let mut producer = server.producer();
    producer.send(b"d1 default-1\n#STREAM orders\no1 a\no2 b\no1 c\n");
    producer.send(b"#STREAM nope\nx 1\ny 2\nz 3\n#STREAM orders\no3 d\n#STREAM default\nd2 default-2\n");
    let replies = producer.sync();
    let errors: Vec<&String> = replies.iter().filter(|line| line.starts_with("ERR")).collect();
    assert_eq!(errors.len(), 1, "one ERR for the unknown stream's lines: {replies:?}");
    assert!(errors[0].contains("unknown_stream: nope"), "{replies:?}");

    let orders = read_all(&server, "orders", 4);
    assert!(orders.iter().all(|event| event.partition < 3), "stream-local partition numbers: {orders:?}");
    let mut payloads: Vec<&[u8]> = orders.iter().map(|event| event.payload.as_slice()).collect();
    payloads.sort();
    assert_eq!(payloads, [b"a", b"b", b"c", b"d"]);
    let o1: Vec<&[u8]> = orders.iter().filter(|e| e.key == b"o1").map(|e| e.payload.as_slice()).collect();
    assert_eq!(o1, [b"a", b"c"], "a key's events in order");
    let default = read_all(&server, "default", 2);
    let mut payloads: Vec<&[u8]> = default.iter().map(|event| event.payload.as_slice()).collect();
    payloads.sort();
    assert_eq!(payloads, [b"default-1".as_slice(), b"default-2"]);

    // The listing counts what each stream holds.
    let streams = server.streams();
    assert_eq!(streams["orders"]["events"], 4, "{streams:?}");
    assert_eq!(server.stream_end("orders"), 4);
    assert_eq!(streams["default"]["partitions"], 4);
    assert!(streams["orders"]["disk_bytes"].as_u64().unwrap() > 0, "{streams:?}");

    // Unknown streams and partitions on the subscribe port.
    let mut unknown = Subscriber::connect(server.subscribe, "SUB nope 0 earliest");
    assert!(unknown.next_event().is_none());
    assert!(unknown.notices[0].contains("unknown_stream"), "{:?}", unknown.notices);
    let mut out_of_range = Subscriber::connect(server.subscribe, "SUB orders 3 earliest");
    assert!(out_of_range.next_event().is_none());
    assert!(out_of_range.notices[0].contains("out_of_range"), "{:?}", out_of_range.notices);

    // Delete: gone from the listing, from ingest and from disk.
    let files = server.data_dir.join("streams").join("orders");
    assert!(files.exists());
    let (status, body) = server.http("DELETE", "/streams/orders", None);
    assert_eq!(status, 200, "{body}");
    assert!(!server.streams().contains_key("orders"));
    assert!(!files.exists(), "the stream's files are deleted");
    let (status, _) = server.http("DELETE", "/streams/orders", None);
    assert_eq!(status, 404);
    let mut producer = server.producer();
    producer.send(b"#STREAM orders\no1 after-delete\n");
    let replies = producer.sync();
    assert!(replies.iter().any(|line| line.contains("unknown_stream: orders")), "{replies:?}");
    // The name can be used again, from offset 0.
    server.create_stream(json!({ "name": "orders", "partitions": 1 }));
    assert_eq!(server.stream_end("orders"), 0);
}

#[test]
fn the_cli_creates_lists_and_deletes_streams() {
    let server = Server::start(&[]);
    let admin = server.admin.to_string();
    let spate = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_spate"))
            .args(["stream", "--admin", &admin])
            .args(args)
            .output()
            .unwrap()
    };
    let created = spate(&["create", "clicks", "--partitions", "2", "--retention-bytes", "1073741824"]);
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let listed = spate(&["list"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains("\"clicks\"") && listed.contains("1073741824"), "{listed}");
    let again = spate(&["create", "clicks", "--partitions", "2"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("409"), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(spate(&["delete", "clicks"]).status.success());
    assert!(!server.streams().contains_key("clicks"));
}

#[test]
fn a_restart_keeps_streams_offsets_and_settings() {
    let data_dir = std::env::temp_dir().join(format!("spate-streams-restart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data_dir);
    let data = data_dir.display().to_string();
    let mut server = Server::start(&["--shards", "2", "--data-dir", &data]);
    server.create_stream(
        json!({ "name": "metrics", "partitions": 2, "retention_bytes": 512 << 20, "retention_ms": 3_600_000 }),
    );
    let mut producer = server.producer();
    producer.send(b"#STREAM metrics\n");
    for index in 0..1000 {
        producer.send(format!("k{} v{index}\n", index % 7).as_bytes());
    }
    producer.sync();
    let before = server.streams()["metrics"].clone();

    server.crash();
    server.spawn();
    let after = server.streams()["metrics"].clone();
    for field in ["id", "partitions", "retention_bytes", "retention_ms", "next_offsets", "events"] {
        assert_eq!(before[field], after[field], "{field} after a restart: {before} vs {after}");
    }
    // Offsets continue where they were.
    let mut producer = server.producer();
    producer.send(b"#STREAM metrics\n");
    for index in 1000..1500 {
        producer.send(format!("k{} v{index}\n", index % 7).as_bytes());
    }
    producer.sync();
    let events = read_all(&server, "metrics", 1500);
    let mut by_partition: HashMap<u32, Vec<u64>> = HashMap::new();
    let mut by_key: HashMap<Vec<u8>, Vec<u64>> = HashMap::new();
    for event in &events {
        by_partition.entry(event.partition).or_default().push(event.offset);
        let index: u64 = std::str::from_utf8(&event.payload[1..]).unwrap().parse().unwrap();
        by_key.entry(event.key.clone()).or_default().push(index);
    }
    for offsets in by_partition.values() {
        assert!(offsets.iter().enumerate().all(|(at, &offset)| offset == at as u64), "dense offsets from 0");
    }
    for indexes in by_key.values() {
        assert!(indexes.windows(2).all(|pair| pair[0] < pair[1]), "a key's events in order across the restart");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[test]
fn a_second_server_on_the_same_data_dir_is_refused() {
    let server = Server::start(&[]);
    let data = server.data_dir.display().to_string();
    let output = Server::command(Addresses::free(), &["--data-dir", &data]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("data directory is in use"), "{stderr}");
    assert!(stderr.contains(&server.pid().to_string()), "names the holder: {stderr}");
}

/// Writes `count` events of `payload_bytes` each to `stream` and syncs.
fn fill(server: &Server, stream: &str, count: usize, payload_bytes: usize) {
    let mut producer = server.producer();
    producer.send(format!("#STREAM {stream}\n").as_bytes());
    let payload = "p".repeat(payload_bytes);
    for index in 0..count {
        producer.send(format!("key {index}-{payload}\n").as_bytes());
    }
    producer.sync();
}

/// The first thing a subscriber from offset 0 of partition 0 gets: a
/// `TRUNCATED` notice and the first event's offset.
fn first_from_zero(server: &Server, stream: &str) -> (Vec<String>, u64) {
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {stream} 0 0"));
    let event = subscriber.next_event().expect("an event");
    (subscriber.notices, event.offset)
}

#[test]
fn retention_by_bytes_and_by_age_deletes_segments() {
    let segment = 64 * 1024;
    let server = Server::start(&["--shards", "1", "--line-size-max", "4096", "--segment-bytes", &segment.to_string()]);
    server.create_stream(json!({ "name": "sized", "partitions": 1, "retention_bytes": 2 * segment }));
    server.create_stream(json!({ "name": "aged", "partitions": 1, "retention_ms": 500 }));
    server.create_stream(json!({ "name": "kept", "partitions": 1 }));

    // About 16 segments of 1 KiB events into each.
    for stream in ["sized", "aged", "kept"] {
        fill(&server, stream, 1000, 1000);
    }
    // Nothing is written from here on: retention runs on idle streams too.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let streams = server.streams();
        let sized = streams["sized"]["disk_bytes"].as_u64().unwrap();
        let aged = streams["aged"]["disk_bytes"].as_u64().unwrap();
        if sized <= 3 * segment && aged <= 2 * segment {
            break;
        }
        assert!(Instant::now() < deadline, "retention did not run: {streams:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(server.metric("spate_segment_files_deleted_total") > 0.0);
    let kept = server.streams()["kept"]["disk_bytes"].as_u64().unwrap();
    assert!(kept > 10 * segment, "a stream under its retention keeps its segments: {kept}");

    for stream in ["sized", "aged"] {
        let (notices, first) = first_from_zero(&server, stream);
        assert!(first > 0, "{stream}: the oldest events are gone");
        assert!(notices.iter().any(|notice| notice.starts_with("TRUNCATED")), "{stream}: {notices:?}");
    }
    let (notices, first) = first_from_zero(&server, "kept");
    assert_eq!((notices.len(), first), (0, 0));
}

/// The default `--data-dir` is relative (`./spate-data`): a server started
/// with a relative data dir comes up and writes its files there.
#[test]
fn a_relative_data_dir_works() {
    let cwd = std::env::temp_dir().join(format!("spate-relative-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(&cwd).unwrap();
    let addresses = Addresses::free();
    let mut child = Server::command(addresses, &["--shards", "1", "--partitions", "2", "--data-dir", "spate-data"])
        .current_dir(&cwd)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = format!("http://{}/stats", addresses.admin);
    while ureq::get(&url).call().is_err() {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
            panic!("spate exited ({status}) with a relative --data-dir: {stderr}");
        }
        assert!(Instant::now() < deadline, "spate did not become ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(cwd.join("spate-data").join("streams").join("default").join("0").is_dir());
    let _ = std::fs::remove_dir_all(&cwd);
}

/// The largest `retention_ms` the API accepts (100 years): must match
/// `spate::stream::RETENTION_MS_MAX`.
const RETENTION_MS_MAX: u64 = 36_500 * 86_400_000;

/// `retention_ms` is checked at the API: u64::MAX and 2^63 (which the age
/// check used to wrap, deleting every sealed segment at once) are refused
/// with 400 naming the field and the maximum; the maximum itself and 0
/// (keep regardless of age) are accepted.
#[test]
fn retention_past_its_maximum_is_refused_at_the_api() {
    let server = Server::start(&["--shards", "1"]);
    for retention_ms in [u64::MAX, 1 << 63, RETENTION_MS_MAX + 1] {
        let request = json!({ "name": "rmax", "partitions": 1, "retention_ms": retention_ms });
        let (status, body) = server.http("POST", "/streams", Some(&request));
        assert_eq!(status, 400, "retention_ms {retention_ms}: {body}");
        assert!(body.contains("retention_ms") && body.contains(&RETENTION_MS_MAX.to_string()), "{body}");
    }
    assert!(!server.streams().contains_key("rmax"), "a refused stream is not created");
    let accepted = server.create_stream(json!({ "name": "rmax", "partitions": 1, "retention_ms": RETENTION_MS_MAX }));
    assert_eq!(accepted["retention_ms"], RETENTION_MS_MAX);
    server.create_stream(json!({ "name": "forever", "partitions": 1, "retention_ms": 0 }));
}

/// With memory storage a stream's `retention_bytes` is at most
/// `--retention-bytes`: that is what the memory formula counts per
/// partition, so a larger one would pass the documented bound.
#[test]
fn memory_retention_past_the_flag_is_refused_at_the_api() {
    let retention = 4 << 20;
    let server = Server::start(&["--shards", "1", "--storage", "memory", "--retention-bytes", &retention.to_string()]);
    let request = json!({ "name": "big", "partitions": 1, "retention_bytes": 2 * retention });
    let (status, body) = server.http("POST", "/streams", Some(&request));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("--retention-bytes") && body.contains(&retention.to_string()), "{body}");
    server.create_stream(json!({ "name": "fits", "partitions": 1, "retention_bytes": retention }));
}

/// A stream whose age retention is u64::MAX or 2^63 (a catalog written
/// before the API checked it) keeps every sealed segment: the age check
/// saturates instead of wrapping. Before, `modified + u64::MAX` wrapped
/// below the clock and all but the active segment were deleted (5000
/// events: 19 remained).
#[test]
fn a_huge_age_retention_from_an_older_catalog_keeps_every_segment() {
    let mut server = Server::start(&["--shards", "1", "--segment-bytes", "65536", "--line-size-max", "60000"]);
    for name in ["rmax", "r63", "aged"] {
        server.create_stream(json!({ "name": name, "partitions": 1, "retention_ms": 1000 }));
    }
    server.crash();
    let catalog_path = server.data_dir.join("streams.json");
    let mut catalog: serde_json::Value = serde_json::from_slice(&std::fs::read(&catalog_path).unwrap()).unwrap();
    for stream in catalog["streams"].as_array_mut().unwrap() {
        match stream["name"].as_str().unwrap() {
            "rmax" => stream["retention_ms"] = json!(u64::MAX),
            "r63" => stream["retention_ms"] = json!(1u64 << 63),
            _ => {}
        }
    }
    std::fs::write(&catalog_path, serde_json::to_vec_pretty(&catalog).unwrap()).unwrap();
    server.spawn();
    assert_eq!(server.streams()["rmax"]["retention_ms"], u64::MAX, "an older catalog is read as it is");
    for stream in ["rmax", "r63", "aged"] {
        fill(&server, stream, 5000, 1000);
    }
    // Age retention runs once a second: "aged" (1 s) shows it ran.
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.streams()["aged"]["events"].as_u64().unwrap() >= 5000 {
        assert!(Instant::now() < deadline, "age retention did not run: {:?}", server.streams());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(2));
    let streams = server.streams();
    for stream in ["rmax", "r63"] {
        assert_eq!(streams[stream]["events"], 5000, "{stream} keeps every event: {:?}", streams[stream]);
    }
}
