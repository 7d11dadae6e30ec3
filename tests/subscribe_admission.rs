//! Admission on the subscribe port under an idle-connection attack (issue 22,
//! finding 8): connections that never finish their `SUB`/`GROUP` line must
//! not keep real subscribers out. Each test runs a real server over real
//! sockets with a small subscriber limit (2 shards x 2 = 4 slots).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, Subscriber};
use spate::protocol::{SubscriberLine, parse_subscriber_line};

/// The subscriber limit of every test: 2 shards x 2.
const SLOTS: usize = 4;

fn start() -> Server {
    Server::start(&["--shards", "2", "--partitions", "4", "--subscribers-per-shard-max", "2"])
}

/// Stores two events, so a `SUB * earliest` has something to read at once.
fn store_two_events(server: &Server) {
    let mut producer = server.producer();
    producer.send(b"alpha 1\nbeta 2\n");
    producer.sync();
}

/// The next line the server writes on `stream`, within `limit`.
fn read_line_within(stream: &TcpStream, limit: Duration) -> Option<String> {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut line = String::new();
    match BufReader::new(stream).read_line(&mut line) {
        Ok(count) if count > 0 => Some(line.trim_end().to_string()),
        _ => None,
    }
}

/// Opens connections to the subscribe port that send nothing, one at a
/// time, and waits until the server counts each (so their accept order is
/// their index order).
fn silent_connections(server: &Server, count: usize) -> Vec<TcpStream> {
    let open_before = server.total("subscriber_connections_open") as usize;
    (0..count)
        .map(|index| {
            let stream = TcpStream::connect(server.subscribe).unwrap();
            let want = open_before + index + 1;
            let open = server
                .wait_for_total("subscriber_connections_open", Duration::from_secs(5), |open| open as usize == want);
            assert_eq!(open as usize, want, "silent connection {index} counted");
            stream
        })
        .collect()
}

/// Asserts that `subscriber` gets an event line (not an `ERR`) within
/// `limit` of `started`.
fn assert_gets_an_event(subscriber: &mut Subscriber, started: Instant, limit: Duration) {
    subscriber.set_timeout(limit);
    let line = subscriber.next_line().map(|line| String::from_utf8_lossy(&line).into_owned());
    let is_event = line
        .as_deref()
        .is_some_and(|line| matches!(parse_subscriber_line(line.as_bytes()), Ok(SubscriberLine::Event { .. })));
    assert!(is_event, "a real subscriber is served, not refused: {line:?}");
    assert!(started.elapsed() < limit, "served within {limit:?}: {:?}", started.elapsed());
}

/// The lines `ERR shed: ...` the server wrote to `connections` (each read
/// for a short while).
fn shed_notices(connections: &[TcpStream]) -> Vec<String> {
    connections
        .iter()
        .filter_map(|connection| read_line_within(connection, Duration::from_millis(300)))
        .filter(|line| line.starts_with("ERR shed"))
        .collect()
}

/// Every subscriber slot held by a connection that never sends a byte: a
/// real `SUB * earliest` still gets its events within two seconds, and the
/// oldest silent connection is the one told `ERR shed` and counted.
#[test]
fn silent_connections_cannot_lock_out_subscribers() {
    let server = start();
    store_two_events(&server);
    let silent = silent_connections(&server, SLOTS);
    let started = Instant::now();
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    assert_gets_an_event(&mut subscriber, started, Duration::from_secs(2));
    let oldest = read_line_within(&silent[0], Duration::from_secs(1));
    let told = oldest.as_deref().is_some_and(|line| line.starts_with("ERR shed") && line.contains("subscriber limit"));
    assert!(told, "the oldest silent connection made room: {oldest:?}");
    let others = shed_notices(&silent[1..]);
    assert!(others.is_empty(), "only one was shed: {others:?}");
    assert_eq!(server.total("subscribers_shed"), 1);
    assert_eq!(server.total("subscribers_refused"), 0);
}

/// Every subscriber slot held by a connection that trickles one byte per
/// 100 ms and never a newline: a real `SUB * earliest` still gets its
/// events within two seconds.
#[test]
fn trickling_connections_cannot_lock_out_subscribers() {
    let server = start();
    store_two_events(&server);
    let mut tricklers = silent_connections(&server, SLOTS);
    let started = Instant::now();
    let trickling = std::thread::spawn(move || {
        while started.elapsed() < Duration::from_secs(3) {
            for trickler in &mut tricklers {
                // A shed one fails to write: the others go on.
                let _ = trickler.write_all(b"S");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        tricklers
    });
    std::thread::sleep(Duration::from_millis(300));
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
    assert_gets_an_event(&mut subscriber, Instant::now(), Duration::from_secs(2));
    let tricklers = trickling.join().unwrap();
    let notices = shed_notices(&tricklers);
    assert_eq!(notices.len(), 1, "one trickling connection made room: {notices:?}");
    assert_eq!(server.total("subscribers_shed"), 1);
}

/// When slots hold real subscribers, they are never shed: with two real
/// subscribers and two silent connections in the four slots, two newcomers
/// are admitted in place of the silent ones, the fifth real one gets `ERR
/// subscriber_limit`, and all four real subscribers still get new events.
#[test]
fn real_subscribers_are_never_shed() {
    let server = start();
    let mut subscribers: Vec<Subscriber> =
        (0..2).map(|_| Subscriber::connect(server.subscribe, "SUB * latest")).collect();
    let open = server.wait_for_total("subscribers_open", Duration::from_secs(5), |open| open == 2);
    assert_eq!(open, 2);
    let silent = silent_connections(&server, 2);
    for admitted in 3..=SLOTS {
        subscribers.push(Subscriber::connect(server.subscribe, "SUB * latest"));
        let open = server.wait_for_total("subscribers_open", Duration::from_secs(5), |open| open as usize == admitted);
        assert_eq!(open as usize, admitted, "a newcomer takes a silent connection's slot");
    }
    let mut refused = Subscriber::connect(server.subscribe, "SUB * latest");
    refused.set_timeout(Duration::from_secs(5));
    let refusal = refused.next_line().map(|line| String::from_utf8_lossy(&line).into_owned());
    assert!(refusal.as_deref().is_some_and(|line| line.starts_with("ERR subscriber_limit")), "{refusal:?}");
    assert_eq!(shed_notices(&silent).len(), 2, "both silent connections were shed");
    store_two_events(&server);
    for (index, subscriber) in subscribers.iter_mut().enumerate() {
        subscriber.set_timeout(Duration::from_secs(5));
        let events = subscriber.take(2);
        assert_eq!(events.len(), 2, "subscriber {index} still served");
    }
    assert_eq!(server.total("subscribers_shed"), 2);
    assert_eq!(server.total("subscribers_refused"), 1);
    assert_eq!(server.total("subscribers_open"), SLOTS as u64);
}

/// Shedding is process-wide: with every silent connection on shard 1, a
/// subscriber the kernel places on shard 0 (whose own connections are
/// none) is admitted and the oldest silent connection on shard 1 is shed.
#[test]
fn shedding_reaches_connections_on_another_shard() {
    let server = start();
    store_two_events(&server);
    let shard_gauge = |shard: usize, name: &str| server.stats()["shards"][shard][name].as_u64().unwrap() as usize;
    let mut silent: Vec<TcpStream> = Vec::new();
    for attempt in 0..40 {
        // Fill every slot with silent connections on shard 1, oldest first.
        while silent.len() < SLOTS {
            let mut more = silent_connections(&server, 1);
            if shard_gauge(1, "subscriber_connections_open") > silent.len() {
                silent.append(&mut more);
            } else {
                drop(more);
                let want = silent.len() as u64;
                server.wait_for_total("subscriber_connections_open", Duration::from_secs(5), |open| open == want);
            }
        }
        let started = Instant::now();
        let mut subscriber = Subscriber::connect(server.subscribe, "SUB * earliest");
        assert_gets_an_event(&mut subscriber, started, Duration::from_secs(2));
        let oldest = silent.remove(0);
        let notice = read_line_within(&oldest, Duration::from_secs(2));
        assert!(notice.as_deref().is_some_and(|line| line.starts_with("ERR shed")), "the oldest is shed: {notice:?}");
        if shard_gauge(0, "subscribers_open") == 1 {
            assert_eq!(server.total("subscribers_shed"), attempt as u64 + 1);
            return;
        }
        // It landed on shard 1 too: try again.
        drop(subscriber);
        let want = silent.len() as u64;
        server.wait_for_total("subscriber_connections_open", Duration::from_secs(5), |open| open == want);
    }
    panic!("no subscriber landed on shard 0 in 40 attempts");
}

/// A connection that does not finish its request line within
/// `--subscribe-request-timeout-ms` is closed with `ERR request_timeout`,
/// whether it sends nothing or trickles bytes; a subscriber that sent its
/// line stays, and the ingest port's `--idle-timeout-ms` is untouched.
#[test]
fn unfinished_requests_time_out() {
    let server = Server::start(&["--shards", "2", "--partitions", "4", "--subscribe-request-timeout-ms", "500"]);
    let silent = TcpStream::connect(server.subscribe).unwrap();
    let mut trickler = TcpStream::connect(server.subscribe).unwrap();
    let silent_ingest = TcpStream::connect(server.ingest).unwrap();
    let mut subscriber = Subscriber::connect(server.subscribe, "SUB * latest");
    let started = Instant::now();
    let trickling = std::thread::spawn(move || {
        while trickler.write_all(b"S").is_ok() && started.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(100));
        }
        trickler
    });
    let expected = "ERR request_timeout: no SUB or GROUP line within 500 ms of connecting";
    assert_eq!(read_line_within(&silent, Duration::from_secs(3)).as_deref(), Some(expected));
    let trickler = trickling.join().unwrap();
    assert_eq!(read_line_within(&trickler, Duration::from_secs(1)).as_deref(), Some(expected));
    assert!(started.elapsed() < Duration::from_secs(3), "cut after {:?}", started.elapsed());
    assert_eq!(server.total("connections_timed_out_request"), 2);
    assert_eq!(read_line_within(&silent_ingest, Duration::from_millis(500)), None, "ingest keeps 30 s");
    store_two_events(&server);
    subscriber.set_timeout(Duration::from_secs(5));
    assert_eq!(subscriber.take(2).len(), 2, "a subscriber that sent SUB is not timed out");
}
