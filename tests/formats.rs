//! The JSON-lines and InfluxDB-line-protocol listeners, end to end, with
//! clients nobody here wrote where one exists: the `questdb` Python client
//! (PyPI) and the `questdb-rs` crate send ILP over TCP; JSON lines come from
//! a plain socket writer. Every row arrives exactly once, each key's or
//! series' rows in order and in one partition; bad lines get an `ERR` and
//! lose nothing else.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{Delivered, Server, Subscriber};
use serde_json::json;

/// Sends `input` and a `#SYNC`, returns every reply line up to its `OK`.
fn send_and_sync(address: std::net::SocketAddr, input: &[u8]) -> Vec<String> {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    stream.write_all(input).unwrap();
    stream.write_all(b"#SYNC done\n").unwrap();
    let mut replies = Vec::new();
    for line in BufReader::new(stream).lines() {
        let line = line.unwrap();
        let done = line.starts_with("OK ") && line.ends_with(" SYNC done");
        replies.push(line);
        if done {
            return replies;
        }
    }
    panic!("closed before OK SYNC: {replies:?}");
}

/// Every event of `stream` (from offset 0) until `count` arrived.
fn read_stream(server: &Server, stream: &str, count: usize) -> Vec<Delivered> {
    let mut subscriber = Subscriber::connect(server.subscribe, &format!("SUB {stream} * earliest"));
    subscriber.take(count)
}

#[test]
fn json_lines_route_by_a_field_and_bad_lines_lose_nothing_else() {
    let server = Server::start(&["--shards", "2", "--json-key", "/user/id"]);
    let mut input = String::new();
    let good = [
        r#"{"user":{"id":"alice"},"n":0}"#,
        r#"{"n":1,"user":{"name":"Bob","id":42}}"#,
        r#"{"user":{"id":"b\u00e9\"q\""},"msg":"h\u00e9llo \ud83d\ude00 \\ \/","n":2}"#,
        r#"  {"user":{"id":true,"tags":[1,2,{"x":null}]},"n":3}"#,
        r#"{"user":{"id":12.50},"deep":{"a":{"b":{"c":[[[]]]}}},"n":4}"#,
        "{\"user\":{\"id\":\"ünïcödé\"},\"n\":5}",
    ];
    let bad = [
        (r#"{"user":{"id":"x"},"#, "invalid_json"),
        (r#"{"other":1}"#, "key_missing"),
        (r#"{"user":{"id":{"a":1}}}"#, "key_not_scalar"),
        (r#"{"user":{"id":"y"}} trailing"#, "invalid_json"),
        (r#"{"user":{"id":nul}}"#, "invalid_json"),
    ];
    for (index, line) in good.iter().enumerate() {
        input.push_str(line);
        input.push('\n');
        if let Some((line, _)) = bad.get(index) {
            input.push_str(line);
            input.push('\n');
        }
    }
    // Order per key: 200 more of alice's.
    for n in 0..200 {
        input.push_str(&format!("{{\"user\":{{\"id\":\"alice\"}},\"seq\":{n}}}\n"));
    }
    let replies = send_and_sync(server.ingest_json, input.as_bytes());
    let errors: Vec<&String> = replies.iter().filter(|line| line.starts_with("ERR")).collect();
    assert_eq!(errors.len(), bad.len(), "{replies:?}");
    for (index, (error, (_, reason))) in errors.iter().zip(&bad).enumerate() {
        let line_number = 2 * index + 2;
        assert!(error.starts_with(&format!("ERR {line_number} {reason}")), "{error} (expected {reason})");
    }

    let events = read_stream(&server, "default", good.len() + 200);
    let by_payload: HashMap<Vec<u8>, Vec<u8>> =
        events.iter().map(|event| (event.payload.clone(), event.key.clone())).collect();
    let expected_keys: [&[u8]; 6] = [b"alice", b"42", "bé\"q\"".as_bytes(), b"true", b"12.50", "ünïcödé".as_bytes()];
    for (line, key) in good.iter().zip(expected_keys) {
        assert_eq!(by_payload.get(line.as_bytes()).map(Vec::as_slice), Some(key), "{line}");
    }
    let alice: Vec<&Delivered> = events.iter().filter(|event| event.key == b"alice").collect();
    assert_eq!(alice.len(), 201);
    assert!(alice.iter().all(|event| event.partition == alice[0].partition), "one key, one partition");
    let seqs: Vec<u64> = alice[1..]
        .iter()
        .map(|event| serde_json::from_slice::<serde_json::Value>(&event.payload).unwrap()["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (0..200).collect::<Vec<_>>(), "a key's events in order");
    let rejected = |reason: &str| -> f64 {
        let metrics = server.get("/metrics");
        let label = format!("reason=\"{reason}\"");
        metrics
            .lines()
            .filter(|line| line.starts_with("spate_lines_rejected_total{") && line.contains(&label))
            .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    assert_eq!(rejected("invalid_json"), 3.0);
    assert_eq!(rejected("json_key"), 2.0);
}

#[test]
fn json_and_ilp_listeners_feed_their_streams_and_switch_with_stream_lines() {
    let server = Server::start(&["--json-stream", "web", "--ilp-stream", "metrics", "--json-key", "user"]);
    let (status, body) = server.http("POST", "/streams", Some(&json!({ "name": "web", "partitions": 2 })));
    assert_eq!(status, 201, "{body}");
    server.create_stream(json!({ "name": "metrics", "partitions": 2 }));
    server.create_stream(json!({ "name": "other", "partitions": 1 }));
    send_and_sync(server.ingest_json, b"{\"user\":\"a\"}\n#STREAM other\n{\"user\":\"b\"}\n");
    send_and_sync(server.ingest_ilp, b"cpu,host=a usage=1 1\n#STREAM other\nmem,host=a used=2i 2\n");
    assert_eq!(read_stream(&server, "web", 1)[0].key, b"a");
    assert_eq!(read_stream(&server, "metrics", 1)[0].key, b"cpu,host=a");
    let mut other: Vec<Vec<u8>> = read_stream(&server, "other", 2).into_iter().map(|event| event.key).collect();
    other.sort();
    assert_eq!(other, [b"b".to_vec(), b"mem,host=a".to_vec()]);
}

#[test]
fn ilp_series_keys_are_canonical_and_bad_lines_are_rejected() {
    let server = Server::start(&["--shards", "2"]);
    let input = b"cpu,host=a,region=eu usage=1.5,idle=2i 1000\n\
        cpu,region=eu,host=a usage=2.5 2000\n\
        cpu,host=a,region=eu usage=\n\
        weather,city=Z\\ rich temp=-3.5,ok=t,note=\"a \\\"b\\\" c\" 3000\n\
        cpu,host=a,region=eu usage=3.5 4000\n";
    let replies = send_and_sync(server.ingest_ilp, input);
    assert_eq!(replies.len(), 2, "{replies:?}");
    assert!(replies[0].starts_with("ERR 3 field_value_empty"), "{replies:?}");
    let events = read_stream(&server, "default", 4);
    let cpu: Vec<&Delivered> = events.iter().filter(|event| event.key == b"cpu,host=a,region=eu").collect();
    assert_eq!(cpu.len(), 3, "tag order does not change the series: {events:?}");
    let times: Vec<&[u8]> = cpu.iter().map(|event| event.payload.rsplit(|&b| b == b' ').next().unwrap()).collect();
    assert_eq!(times, [b"1000", b"2000", b"4000"]);
    assert!(events.iter().any(|event| event.key == b"weather,city=Z\\ rich"), "{events:?}");
}

/// ILP clients never read replies: a flood of bad lines must not stall the
/// connection's ingest; the replies that do not fit are dropped and counted.
#[test]
fn an_ilp_client_that_never_reads_is_not_stalled_by_its_replies() {
    let server = Server::start(&[]);
    let mut stream = TcpStream::connect(server.ingest_ilp).unwrap();
    let mut input = Vec::new();
    for index in 0..200_000 {
        input.extend_from_slice(b"bad line without fields\n");
        if index % 1000 == 0 {
            input.extend_from_slice(format!("good,n=1 v={index}i\n").as_bytes());
        }
    }
    stream.write_all(&input).unwrap();
    stream.write_all(b"good,n=1 v=-1i\n").unwrap();
    // Never read; the good lines all arrive.
    let events = read_stream(&server, "default", 201);
    assert_eq!(events.last().unwrap().payload, b"good,n=1 v=-1i");
    assert!(server.metric("spate_replies_dropped_total") > 0.0);
}

/// The `questdb` Python client (PyPI) over ILP/TCP. Skipped with a message
/// when the package is missing (`scripts/test` installs it).
#[test]
fn the_questdb_python_client_sends_rows_that_arrive_once_and_in_order() {
    let has_client = std::process::Command::new("python3")
        .args(["-c", "import questdb.ingress"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !has_client {
        assert!(
            std::env::var_os("SPATE_REQUIRE_QUESTDB_PY").is_none(),
            "scripts/test installed questdb, yet it is missing"
        );
        eprintln!("skipped: python3 -c 'import questdb.ingress' failed (pip install questdb)");
        return;
    }
    let server = Server::start(&["--shards", "2"]);
    const ROWS: usize = 3000;
    let script = format!(
        r#"
import warnings
warnings.simplefilter("ignore")
from questdb.ingress import Sender, TimestampNanos
with Sender.from_conf("tcp::addr={address};") as sender:
    for i in range({ROWS}):
        sender.row(
            "trades",
            symbols={{"sym": "S%d" % (i % 7), "venue": "V%d" % (i % 3)}},
            columns={{"seq": i, "price": i * 0.5, "note": "n \"%d\"" % i, "ok": i % 2 == 0}},
            at=TimestampNanos(1_700_000_000_000_000_000 + i))
    sender.flush()
"#,
        address = server.ingest_ilp
    );
    let output = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    check_ilp_rows(&server, ROWS);
}

/// The `questdb-rs` crate over ILP/TCP.
#[test]
fn the_questdb_rust_client_sends_rows_that_arrive_once_and_in_order() {
    use questdb::ingress::{Buffer, Sender, TimestampNanos};
    let server = Server::start(&["--shards", "2"]);
    const ROWS: usize = 3000;
    let mut sender = Sender::from_conf(format!("tcp::addr={};", server.ingest_ilp)).unwrap();
    let mut buffer = Buffer::new();
    for index in 0..ROWS {
        buffer
            .table("trades")
            .unwrap()
            .symbol("sym", format!("S{}", index % 7))
            .unwrap()
            .symbol("venue", format!("V{}", index % 3))
            .unwrap()
            .column_i64("seq", index as i64)
            .unwrap()
            .column_f64("price", index as f64 * 0.5)
            .unwrap()
            .column_str("note", format!("n \"{index}\""))
            .unwrap()
            .column_bool("ok", index % 2 == 0)
            .unwrap()
            .at(TimestampNanos::new(1_700_000_000_000_000_000 + index as i64))
            .unwrap();
    }
    sender.flush(&mut buffer).unwrap();
    check_ilp_rows(&server, ROWS);
}

/// Rows `seq` 0..rows of `trades` over 21 series (sym × venue): each once,
/// each series in one partition and in `seq` order.
fn check_ilp_rows(server: &Server, rows: usize) {
    let events = read_stream(server, "default", rows);
    let mut seen = vec![false; rows];
    let mut series: HashMap<Vec<u8>, (u32, i64)> = HashMap::new();
    for event in &events {
        let payload = std::str::from_utf8(&event.payload).unwrap();
        let seq: usize = payload.split("seq=").nth(1).unwrap().split('i').next().unwrap().parse().unwrap();
        assert!(!seen[seq], "row {seq} twice");
        seen[seq] = true;
        let expected_key = format!("trades,sym=S{},venue=V{}", seq % 7, seq % 3);
        assert_eq!(event.key, expected_key.as_bytes(), "{payload}");
        let entry = series.entry(event.key.clone()).or_insert((event.partition, -1));
        assert_eq!(entry.0, event.partition, "a series in one partition");
        assert!(entry.1 < seq as i64, "a series in order");
        entry.1 = seq as i64;
    }
    assert!(seen.iter().all(|&seen| seen));
    assert_eq!(series.len(), 21);
}
