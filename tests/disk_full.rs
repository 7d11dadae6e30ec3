//! A server started while its disk is full: it starts read-only, serves
//! what is stored, holds ingest back as a full disk does at run time, leaves
//! no probe file behind, and resumes writing by itself once space returns.
//!
//! Both tests need root to mount a small filesystem and skip with a message
//! otherwise: one on tmpfs (where glommio silently drops O_DIRECT), one on a
//! loop-mounted ext4 image (where O_DIRECT and the DMA alignment are real).

mod common;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::small_fs::SmallFs;
use common::{Addresses, Producer, Server, Subscriber};

/// Events written (and acknowledged) before the disk fills.
const EVENTS_BEFORE: u64 = 2000;
/// Events sent while the disk is full.
const EVENTS_AFTER: u64 = 300;
/// Distinct keys, spread over the partitions.
const KEY_COUNT: u64 = 16;
/// The prefix of glommio's probe files (`src/storage/segment.rs`).
const PROBE_PREFIX: &str = ".spate-dma-probe-";

/// Every probe file under `dir`.
fn probe_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.file_name().is_some_and(|name| name.to_string_lossy().starts_with(PROBE_PREFIX)) {
                found.push(path);
            }
        }
    }
    found
}

fn event_line(tag: &str, index: u64) -> String {
    format!("k{} {tag}-{index}-{}\n", index % KEY_COUNT, "p".repeat(64))
}

/// Reads `count` events from `subscriber` and returns their payload tags
/// (`before-17`), checking each is whole and none comes twice.
fn take_tags(subscriber: &mut Subscriber, count: u64) -> HashSet<String> {
    let mut tags = HashSet::new();
    for event in subscriber.take(count as usize) {
        let payload = String::from_utf8(event.payload).expect("a whole payload");
        let (tag, pad) = payload.rsplit_once('-').expect("tag-index-pad");
        assert_eq!(pad.len(), 64, "a whole event: {payload}");
        assert!(tags.insert(tag.to_string()), "{tag} delivered twice");
    }
    tags
}

fn expected_tags(tag: &str, count: u64) -> HashSet<String> {
    (0..count).map(|index| format!("{tag}-{index}")).collect()
}

/// `/stats`' storage section: (read-only, its reason).
fn read_only(server: &Server) -> (bool, String) {
    let stats = server.stats();
    let storage = &stats["storage"];
    (storage["read_only"].as_bool().unwrap_or(false), storage["read_only_reason"].as_str().unwrap_or("").to_string())
}

/// Writes and acknowledges events, stops the server, fills the disk, starts
/// it again, and checks the read-only start, the push-back, the resume once
/// space is freed, and every acknowledged event after one more restart.
fn starts_on_a_full_disk(fs: SmallFs) {
    let data_dir = fs.mount.join("data");
    let data = data_dir.display().to_string();
    let args = ["--shards", "2", "--partitions", "4", "--data-dir", &data];
    let addresses = Addresses::free();
    let server = Server::start_on(addresses, &args);
    let mut producer = server.producer();
    for index in 0..EVENTS_BEFORE {
        producer.send(event_line("before", index).as_bytes());
        if index % 500 == 499 {
            producer.sync();
        }
    }
    producer.sync();
    drop(producer);
    assert_eq!(server.stream_end("default"), EVENTS_BEFORE);
    let log_path = server.log_path.clone();
    assert!(server.terminate().success());

    // A probe file a crashed run left behind, then a full disk.
    let stale_probe = data_dir.join("streams").join("default").join("0").join(format!("{PROBE_PREFIX}1-ThreadId7"));
    std::fs::write(&stale_probe, b"").unwrap();
    fs.fill();
    let log_before = std::fs::metadata(&log_path).map_or(0, |metadata| metadata.len() as usize);
    let server = Server::start_on(addresses, &args);

    let (is_read_only, reason) = read_only(&server);
    assert!(is_read_only, "/stats says read-only: {}", server.get("/stats"));
    assert!(reason.contains("No space left on device"), "the reason names the full disk: {reason}");
    assert!(server.metric("spate_storage_read_only") >= 1.0, "/metrics shows it");
    let log = server.log()[log_before..].to_string();
    assert_eq!(log.matches("started read-only").count(), 1, "said once: {log}");
    assert_eq!(probe_files(&data_dir), Vec::<PathBuf>::new(), "no probe file, stale or new, is left");

    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    assert_eq!(take_tags(&mut subscriber, EVENTS_BEFORE), expected_tags("before", EVENTS_BEFORE));

    let (synced, answered) = mpsc::channel();
    let ingest = server.ingest;
    let producer = std::thread::spawn(move || {
        let mut producer = Producer::connect(ingest);
        for index in 0..EVENTS_AFTER {
            producer.send(event_line("after", index).as_bytes());
        }
        producer.sync();
        let _ = synced.send(());
    });
    assert!(answered.recv_timeout(Duration::from_secs(2)).is_err(), "#SYNC answered on a full disk");
    assert!(server.metric("spate_storage_failing") >= 1.0, "the held writes show: {}", server.get("/stats"));
    assert_eq!(probe_files(&data_dir), Vec::<PathBuf>::new(), "no probe file is left by the retries");

    fs.free();
    answered.recv_timeout(Duration::from_secs(60)).expect("#SYNC answered once space is back");
    producer.join().unwrap();
    assert_eq!(take_tags(&mut subscriber, EVENTS_AFTER), expected_tags("after", EVENTS_AFTER));
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_only(&server).0 {
        assert!(Instant::now() < deadline, "still read-only with space back: {}", server.get("/stats"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(server.metric("spate_storage_failing"), 0.0);
    assert!(server.log().contains("no longer read-only"), "{}", server.log());
    drop(subscriber);
    assert!(server.terminate().success());

    let server = Server::start_on(addresses, &args);
    assert!(!read_only(&server).0, "writable after a restart with space");
    assert_eq!(server.stream_end("default"), EVENTS_BEFORE + EVENTS_AFTER);
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let mut expected = expected_tags("before", EVENTS_BEFORE);
    expected.extend(expected_tags("after", EVENTS_AFTER));
    assert_eq!(take_tags(&mut subscriber, EVENTS_BEFORE + EVENTS_AFTER), expected, "every acknowledged event");
    assert_eq!(probe_files(&data_dir), Vec::<PathBuf>::new());
    let log = server.log();
    assert!(!log.contains("panicked"), "{log}");
    drop(subscriber);
    drop(server);
    drop(fs);
}

/// Starts a server on a new, empty data directory of a full disk: the
/// catalog and every partition's directory and segment are deferred, the
/// server starts read-only, and once space returns it creates them, takes
/// the held events, and keeps them across a restart.
fn starts_new_on_a_full_disk(fs: SmallFs) {
    let data_dir = fs.mount.join("data");
    // The directory exists (an operator made it): a new directory needs a
    // block on ext4, and with no directory there is nothing to lock.
    std::fs::create_dir_all(&data_dir).unwrap();
    fs.fill();
    let data = data_dir.display().to_string();
    let args = ["--shards", "2", "--partitions", "4", "--data-dir", &data];
    let addresses = Addresses::free();
    let server = Server::start_on(addresses, &args);
    let stats = server.stats();
    assert_eq!(stats["storage"]["read_only"], true, "{stats}");
    assert_eq!(stats["storage"]["catalog_unsaved"], true, "{stats}");
    assert_eq!(server.metric("spate_catalog_unsaved"), 1.0);
    assert!(server.log().matches("started read-only").count() == 1, "{}", server.log());

    let (synced, answered) = mpsc::channel();
    let ingest = server.ingest;
    let producer = std::thread::spawn(move || {
        let mut producer = Producer::connect(ingest);
        for index in 0..EVENTS_AFTER {
            producer.send(event_line("new", index).as_bytes());
        }
        producer.sync();
        let _ = synced.send(());
    });
    assert!(answered.recv_timeout(Duration::from_secs(2)).is_err(), "#SYNC answered on a full disk");
    assert_eq!(probe_files(&data_dir), Vec::<PathBuf>::new());

    fs.free();
    answered.recv_timeout(Duration::from_secs(60)).expect("#SYNC answered once space is back");
    producer.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_only(&server).0 {
        assert!(Instant::now() < deadline, "still read-only with space back: {}", server.get("/stats"));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(data_dir.join("streams.json").exists(), "the deferred catalog is saved");
    let log_path = server.log_path.clone();
    assert!(server.terminate().success());

    let server = Server::start_on(addresses, &args);
    assert!(
        !read_only(&server).0,
        "writable after a restart with space: {}",
        std::fs::read_to_string(log_path).unwrap()
    );
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    assert_eq!(take_tags(&mut subscriber, EVENTS_AFTER), expected_tags("new", EVENTS_AFTER));
    assert_eq!(probe_files(&data_dir), Vec::<PathBuf>::new());
    drop(subscriber);
    drop(server);
    drop(fs);
}

/// A new data directory on a full tmpfs starts read-only and is created
/// once space returns.
#[test]
fn a_new_data_directory_on_a_full_tmpfs() {
    if let Some(fs) = SmallFs::tmpfs("new-tmpfs") {
        starts_new_on_a_full_disk(fs);
    }
}

/// A new data directory on a full ext4 starts read-only and is created
/// once space returns.
#[test]
fn a_new_data_directory_on_a_full_ext4() {
    if let Some(fs) = SmallFs::ext4("new-ext4") {
        starts_new_on_a_full_disk(fs);
    }
}

/// On a full tmpfs the server starts read-only and resumes by itself.
#[test]
fn a_server_starts_on_a_full_tmpfs() {
    if let Some(fs) = SmallFs::tmpfs("tmpfs") {
        starts_on_a_full_disk(fs);
    }
}

/// On a full ext4 (O_DIRECT on, DMA alignment real) the server starts
/// read-only and resumes by itself.
#[test]
fn a_server_starts_on_a_full_ext4() {
    if let Some(fs) = SmallFs::ext4("ext4") {
        starts_on_a_full_disk(fs);
    }
}
