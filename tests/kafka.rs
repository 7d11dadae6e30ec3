//! The Kafka face against real Kafka clients nobody here wrote: kcat
//! (librdkafka) lists, produces and consumes; a `SUB` subscriber sees the
//! same events at the same offsets; records keep null keys and values,
//! headers and timestamps, across a restart from disk; bad frames are
//! refused and counted.
//!
//! kcat comes from Debian (`apt-get install kcat`); `scripts/test` and
//! `.ci/run` install it. Without it these tests fail with a message saying so.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Server, Subscriber};

/// Runs kcat with `args` against the server's Kafka port, feeding `input`;
/// returns its stdout.
fn kcat(server: &Server, args: &[&str], input: &str) -> String {
    let broker = server.ingest_kafka.to_string();
    let mut child = Command::new("kcat")
        .args(["-b", &broker])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is not installed: apt-get install -y kcat (scripts/test does)");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kcat {args:?} failed: {stderr}");
    String::from_utf8(output.stdout).unwrap()
}

/// The consume format: partition, offset, key (and its length: -1 for
/// null), value (and its length), headers, timestamp.
const FORMAT: &str = "%p|%o|%k|%K|%s|%S|%h|%T\n";

fn consume_all(server: &Server, topic: &str, partition: &str, offset: &str) -> Vec<String> {
    let out = kcat(server, &["-C", "-t", topic, "-p", partition, "-o", offset, "-e", "-q", "-f", FORMAT], "");
    out.lines().map(str::to_string).collect()
}

/// kcat -L lists the streams as topics with their partitions and this
/// server as the leader of each.
#[test]
fn kcat_lists_streams_as_topics() {
    let server = Server::start(&["--shards", "2", "--partitions", "3", "--storage", "memory"]);
    let listing = kcat(&server, &["-L"], "");
    assert!(listing.contains("topic \"default\" with 3 partitions"), "{listing}");
    assert!(listing.contains(&format!("broker 0 at {}", server.ingest_kafka)), "{listing}");
    assert_eq!(listing.matches("leader 0").count(), 3, "{listing}");
}

/// kcat -P with keys, headers, null keys and null values, to partitions it
/// chose; kcat -C from the beginning and at an offset reads back exactly
/// what was sent; a SUB subscriber sees the same events at the same offsets.
#[test]
fn kcat_round_trips_records_and_sub_sees_the_same_offsets() {
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--storage", "memory"]);
    // -Z: an empty key or value is sent as null.
    kcat(
        &server,
        &["-P", "-t", "default", "-p", "1", "-K", ":", "-H", "trace=abc", "-H", "n=1"],
        "k1:v1\nk2:v2\nk3:v3\n",
    );
    kcat(&server, &["-P", "-t", "default", "-p", "2", "-K", ":", "-Z"], ":null-key\nk5:\n");
    let partition1 = consume_all(&server, "default", "1", "beginning");
    assert_eq!(partition1.len(), 3, "{partition1:?}");
    for (offset, line) in partition1.iter().enumerate() {
        let fields: Vec<&str> = line.split('|').collect();
        let key = format!("k{}", offset + 1);
        let value = format!("v{}", offset + 1);
        assert_eq!(&fields[..7], ["1", &offset.to_string(), &key, "2", &value, "2", "trace=abc,n=1"], "{line}");
        let timestamp: i64 = fields[7].parse().unwrap();
        assert!(timestamp > 1_600_000_000_000, "the producer's timestamp: {line}");
    }
    let partition2 = consume_all(&server, "default", "2", "beginning");
    assert_eq!(partition2.len(), 2, "{partition2:?}");
    assert!(partition2[0].starts_with("2|0||-1|null-key|8|"), "null key: {}", partition2[0]);
    assert!(partition2[1].starts_with("2|1|k5|2||-1|"), "null value: {}", partition2[1]);
    let from_offset = consume_all(&server, "default", "1", "2");
    assert_eq!(from_offset, partition1[2..], "-o 2 starts at offset 2");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB 1 earliest");
    let seen: Vec<(u64, Vec<u8>, Vec<u8>)> =
        subscriber.take(3).into_iter().map(|event| (event.offset, event.key, event.payload)).collect();
    let expected: Vec<(u64, Vec<u8>, Vec<u8>)> = (0..3)
        .map(|index| (index, format!("k{}", index + 1).into_bytes(), format!("v{}", index + 1).into_bytes()))
        .collect();
    assert_eq!(seen, expected);
}

/// Events sent as lines read back through Kafka (key and value, no
/// headers, timestamp -1), and Kafka records (headers, timestamps, null
/// keys) survive a kill -9 and a restart from the disk log.
#[test]
fn lines_read_through_kafka_and_kafka_records_survive_a_restart() {
    let mut server = Server::start(&["--shards", "2", "--partitions", "1", "--fsync", "always"]);
    let mut lines = TcpStream::connect(server.ingest).unwrap();
    lines.write_all(b"user7 paid\n#SYNC\n").unwrap();
    let mut ok = [0u8; 9];
    lines.read_exact(&mut ok).unwrap();
    assert_eq!(&ok, b"OK 2 SYNC");
    // kcat waits for acks=all (its default): durable, as a #SYNC.
    kcat(&server, &["-P", "-t", "default", "-p", "0", "-K", ":", "-Z", "-H", "h=v"], "k:v\n:nokey\n");
    let before = consume_all(&server, "default", "0", "beginning");
    assert_eq!(before.len(), 3, "{before:?}");
    assert_eq!(before[0], "0|0|user7|5|paid|4||-1");
    server.crash();
    server.spawn();
    let after = consume_all(&server, "default", "0", "beginning");
    assert_eq!(after, before, "the same records after a restart");
    assert!(after[2].starts_with("0|2||-1|nokey|5|h=v|"), "{}", after[2]);
}

/// Sends one raw request frame and returns the response body (after the
/// size and correlation id), or `None` when the server closed instead.
fn raw_request(server: &Server, frame: &[u8]) -> Option<Vec<u8>> {
    let mut stream = TcpStream::connect(server.ingest_kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(frame).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
    stream.read_exact(&mut body).ok()?;
    Some(body[4..].to_vec())
}

/// A size prefix over --kafka-request-size-max, an unknown API key and a
/// truncated request close the connection and are counted; ApiVersions of a
/// version past spate's gets UNSUPPORTED_VERSION (35) in a v0 response with
/// the versions it serves (KIP-511); the server keeps serving kcat.
#[test]
fn bad_frames_are_refused_and_counted() {
    let server = Server::start(&["--shards", "1", "--storage", "memory", "--kafka-request-size-max", "65536"]);
    let oversized = [0x7f, 0xff, 0xff, 0xff, 0, 18, 0, 3];
    assert_eq!(raw_request(&server, &oversized), None);
    let unknown_key = [0, 0, 0, 10, 0x40, 0x00, 0, 0, 0, 0, 0, 7, 0, 0];
    assert_eq!(raw_request(&server, &unknown_key), None);
    let truncated_metadata = [0, 0, 0, 9, 0, 3, 0, 9, 0, 0, 0, 1, 0];
    assert_eq!(raw_request(&server, &truncated_metadata), None);
    // Metadata v1 whose topic array claims 2^31 - 1 entries in 14 bytes:
    // the decoder once reserved them all up front and aborted the process.
    let huge_array = [0, 0, 0, 14, 0, 3, 0, 1, 0, 0, 0, 1, 0, 0, 0x7f, 0xff, 0xff, 0xff];
    assert_eq!(raw_request(&server, &huge_array), None);
    // ApiVersions v9, correlation id 5, client id "x".
    let future_versions = [0, 0, 0, 11, 0, 18, 0, 9, 0, 0, 0, 5, 0, 1, b'x'];
    let body = raw_request(&server, &future_versions).expect("an answer");
    assert_eq!(&body[..2], &35i16.to_be_bytes(), "UNSUPPORTED_VERSION");
    assert!(server.metric("spate_kafka_errors_total") >= 4.0, "counted");
    assert!(kcat(&server, &["-L"], "").contains("topic \"default\""));
}
