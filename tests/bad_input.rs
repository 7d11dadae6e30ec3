//! Bad input gets a clear error and loses nothing else: over-long lines,
//! lines with no space, binary bytes, empty keys, torn lines, idle crowds.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Server, Subscriber};

/// Every kind of bad line on one connection is answered with `ERR <line>`,
/// the connection stays open, and every good event around them is stored and
/// delivered exactly once, in order.
#[test]
fn bad_lines_are_rejected_and_good_ones_survive() {
    let server = Server::start(&["--shards", "2", "--line-size-max", "4096", "--segment-bytes", "65536"]);
    let mut producer = server.producer();
    let mut input = Vec::new();
    input.extend_from_slice(b"good 1\n"); // line 1
    input.extend_from_slice(&[b'x'; 10_000]); // line 2: too long (no LF for 10 KB)
    input.extend_from_slice(b" tail of the long line\n");
    input.extend_from_slice(b"good 2\n"); // line 3
    input.extend_from_slice(b"nospace\n"); // line 4: key with empty payload (valid)
    input.extend_from_slice(b" leading-space\n"); // line 5: empty key
    input.extend_from_slice(&[b'k'; 1100]); // line 6: key too long
    input.extend_from_slice(b" v\n");
    input.extend_from_slice(b"bin \x00\x01\xff\xfe\r\n"); // line 7: binary payload, CRLF
    input.extend_from_slice(b"\xc3\x28key \x7f\n"); // line 8: binary key
    input.extend_from_slice(b"\n\r\n"); // lines 9, 10: empty, ignored
    input.extend_from_slice(b"#NOPE\n"); // line 11: unknown control line
    input.extend_from_slice(b"good 3\n"); // line 12
    producer.send(&input);
    let replies = producer.sync();
    assert_eq!(replies.len(), 5, "four errors and the SYNC: {replies:?}");
    assert!(replies[0].starts_with("ERR 2 line_too_long"), "{}", replies[0]);
    assert!(replies[1].starts_with("ERR 5 key_empty"), "{}", replies[1]);
    assert!(replies[2].starts_with("ERR 6 key_too_long: key is 1100 bytes, limit 1024"), "{}", replies[2]);
    assert!(replies[3].starts_with("ERR 11 unknown_control"), "{}", replies[3]);
    assert_eq!(replies[4], "OK 13 SYNC t1");

    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let mut events: Vec<(Vec<u8>, Vec<u8>)> =
        subscriber.take(6).into_iter().map(|event| (event.key, event.payload)).collect();
    subscriber.set_timeout(Duration::from_millis(300));
    assert!(subscriber.next_event().is_none(), "exactly six good events");
    events.sort();
    let mut expected: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (b"good".to_vec(), b"1".to_vec()),
        (b"good".to_vec(), b"2".to_vec()),
        (b"good".to_vec(), b"3".to_vec()),
        (b"nospace".to_vec(), b"".to_vec()),
        (b"bin".to_vec(), b"\x00\x01\xff\xfe".to_vec()),
        (b"\xc3\x28key".to_vec(), b"\x7f".to_vec()),
    ];
    expected.sort();
    assert_eq!(events, expected);
    let stats = server.stats();
    assert_eq!(stats["totals"]["lines_rejected"], 3, "unknown control lines are not counted as rejected events");
    let shards = stats["shards"].as_array().unwrap();
    let line_too_long: u64 = shards.iter().map(|s| s["lines_rejected_line_too_long"].as_u64().unwrap()).sum();
    assert_eq!(line_too_long, 1);
    assert!(server.terminate().success(), "no panic, clean exit");
}

/// A 1.5 MiB line against the default 1 MiB limit is rejected; a line just
/// under the limit is accepted; the stream goes on.
#[test]
fn default_line_limit_is_one_mebibyte() {
    let server = Server::start(&["--shards", "2"]);
    let mut producer = server.producer();
    let mut big_ok = b"big ".to_vec();
    big_ok.resize(1024 * 1024, b'a');
    big_ok.push(b'\n');
    let mut too_big = b"huge ".to_vec();
    too_big.resize(1536 * 1024, b'b');
    too_big.push(b'\n');
    producer.send(&big_ok);
    producer.send(&too_big);
    producer.send(b"after 1\n");
    let replies = producer.sync();
    assert_eq!(replies.len(), 2, "{:?}", replies.iter().map(|r| &r[..r.len().min(80)]).collect::<Vec<_>>());
    assert!(replies[0].starts_with("ERR 2 line_too_long"), "{}", replies[0]);
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let mut events = subscriber.take(2);
    events.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(events[0].key, b"after");
    assert_eq!(events[1].key, b"big");
    assert_eq!(events[1].payload.len(), 1024 * 1024 - 4);
    assert!(server.terminate().success());
}

/// A connection that closes mid-line loses only that partial line (counted);
/// the complete lines before it are stored.
#[test]
fn connection_closed_mid_line_keeps_complete_lines() {
    let server = Server::start(&["--shards", "2"]);
    let mut stream = TcpStream::connect(server.ingest).unwrap();
    stream.write_all(b"torn 1\ntorn 2\ntorn 3 and then the producer cra").unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("ERR 3 unterminated_line"), "{reply}");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let payloads: Vec<_> = subscriber.take(2).into_iter().map(|event| event.payload).collect();
    assert_eq!(payloads, [b"1".to_vec(), b"2".to_vec()]);
    subscriber.set_timeout(Duration::from_millis(300));
    assert!(subscriber.next_event().is_none());
    let shards = server.stats()["shards"].as_array().unwrap().clone();
    let torn: u64 = shards.iter().map(|s| s["lines_rejected_unterminated"].as_u64().unwrap()).sum();
    assert_eq!(torn, 1);
}

/// Three thousand idle connections cost little, do not block a working
/// producer, and are all counted open; the server stays responsive.
#[test]
fn thousands_of_idle_connections_do_not_hurt() {
    let server = Server::start(&["--shards", "4"]);
    let rss_before = server.stats()["process"]["rss_bytes"].as_u64().unwrap();
    let idle: Vec<TcpStream> = (0..3000).map(|_| TcpStream::connect(server.ingest).unwrap()).collect();
    let mut producer = server.producer();
    for index in 0..10_000 {
        producer.send(format!("key{} {index}\n", index % 97).as_bytes());
    }
    assert_eq!(producer.sync(), ["OK 10001 SYNC t1"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.total("connections_open") < 3001 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats = server.stats();
    assert_eq!(stats["totals"]["connections_open"], 3001);
    assert_eq!(stats["totals"]["events_stored"], 10_000);
    let rss_after = stats["process"]["rss_bytes"].as_u64().unwrap();
    // Idle connections hold a 4 KiB buffer each: well under 64 MiB for 3000.
    assert!(rss_after - rss_before.min(rss_after) < 64 << 20, "rss grew {} MiB", (rss_after - rss_before) >> 20);
    drop(idle);
    assert!(server.terminate().success());
}

/// Past --connections-per-shard-max a connection is told why and closed;
/// the server keeps serving others.
#[test]
fn connection_limit_is_explicit() {
    let server = Server::start(&["--shards", "1", "--connections-per-shard-max", "8"]);
    let held: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(server.ingest).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = TcpStream::connect(server.ingest).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut reply = String::new();
    extra.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("ERR 0 connection_limit"), "{reply}");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    let mut producer = server.producer();
    producer.send(b"still 1\n");
    assert_eq!(producer.sync(), ["OK 2 SYNC t1"]);
}

/// A bad SUB request gets `ERR <reason>`; nothing else is affected.
#[test]
fn bad_subscribe_requests_get_errors() {
    let server = Server::start(&["--shards", "2", "--partitions", "8"]);
    for (request, reason) in [
        ("HELLO", "ERR bad_request"),
        ("SUB 8 earliest", "ERR partition_out_of_range: 8 >= 8 partitions"),
        ("SUB x 0", "ERR bad_partition"),
        ("SUB 1 soon", "ERR bad_offset"),
    ] {
        let mut subscriber = Subscriber::connect(server.subscribe, request);
        let line = String::from_utf8(subscriber.next_line().expect("an ERR line")).unwrap();
        assert!(line.starts_with(reason), "{request}: {line}");
        assert!(subscriber.next_line().is_none(), "closed after ERR");
    }
    let mut producer = server.producer();
    producer.send(b"fine 1\n");
    assert_eq!(producer.sync(), ["OK 2 SYNC t1"]);
}

/// Sends `bytes` as the first line of a subscribe connection and returns the
/// server's one reply line.
fn first_line_reply(server: &Server, bytes: &[u8]) -> String {
    let mut socket = TcpStream::connect(server.subscribe).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    socket.write_all(bytes).unwrap();
    let mut reply = String::new();
    socket.read_to_string(&mut reply).unwrap();
    reply
}

/// An overlong request line on the subscribe port is refused with its real
/// size: 5,000 and 100,000 bytes get different, true messages (both used
/// to be one buffer's size); a line whose end never comes is refused with
/// how much was read ("at least"), never a made-up size.
#[test]
fn overlong_subscribe_request_lines_are_measured() {
    let server = Server::start(&["--shards", "1", "--partitions", "2"]);
    for size in [5_000, 100_000] {
        let mut line = format!("SUB {}", "9".repeat(size - 4)).into_bytes();
        line.push(b'\n');
        let reply = first_line_reply(&server, &line);
        assert_eq!(reply, format!("ERR bad_request: request line of {size} bytes, limit 1024\n"));
    }
    // Exactly the reader's limit (1 MiB) and no LF: all of it is read, none
    // of it ends the line.
    let reply = first_line_reply(&server, &vec![b'x'; 1 << 20]);
    assert_eq!(reply, "ERR bad_request: request line of at least 1048576 bytes (its end was not read), limit 1024\n");
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    let mut producer = server.producer();
    producer.send(b"fine 1\n");
    producer.sync();
    assert_eq!(subscriber.next_event().expect("the port still serves").payload, b"1");
}
