//! `--target nats`: the same generator, pacer, stamps and histograms, driving
//! NATS core (nats-server) instead of spate, so the two are measured the same
//! way (spate's goal is a latency "never worse than NATS core's at the same
//! rate", README, Benchmarks).
//!
//! How NATS is driven, raw protocol over TCP (no client library, whose own
//! per-message cost would be measured too):
//!
//! * Every producer connection sends `CONNECT {"verbose":false,"pedantic":false}`
//!   (no `+OK` per frame, no extra subject checks) and a `PING`, and waits for
//!   the `PONG` before the run starts. Then it writes pre-built frames
//!   `PUB bench.events <n>\r\n<payload>\r\n`, where the payload is the same
//!   stamped payload a spate line carries, in the same big writes on the same
//!   schedule as spate's lines (one write per connection per tick), with
//!   `TCP_NODELAY`. It ends with `PING` and waits for `PONG`: NATS answers in
//!   order, so the `PONG` says every `PUB` before it was processed (spate's
//!   `#SYNC` plays that part).
//! * Every event goes to one subject ([`SUBJECT`]), which one subscriber
//!   connection reads: `CONNECT`, `SUB bench.events 1`, `PING`, and the run
//!   starts only after its `PONG` (the subscription is registered). It parses
//!   `MSG <subject> <sid> [reply-to] <n>\r\n<payload>\r\n` frames
//!   ([`NatsScanner`]), answers a server `PING` with `PONG`, and times each
//!   event from the stamp in its payload, exactly as spate's subscriber does.
//!
//! NATS keeps nothing (core NATS is fire-and-forget; a subscriber that falls
//! too far behind is cut off as a slow consumer, which shows as events
//! missing), so there is no "stored" count and no `/stats`.
//!
//! Limit: producers read nothing until their final `PING`, so they do not
//! answer the server's own `PING`s (every 2 minutes by default; after 2
//! unanswered ones NATS closes the connection as stale). A run (or sweep
//! point) against NATS must stay under about 4 minutes; the bench refuses
//! one longer than [`crate::bench::args::NATS_RUN_S_MAX`].
//!
//! ```text
//! spate bench --target nats --nats 127.0.0.1:4222 --sweep 50000,100000,1000000 --json nats.json
//! ```

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::bench::BenchError;
use crate::bench::stamp::BenchClock;
use crate::bench::subscriber::{Recorder, Scan, Scanned};

/// The one subject every event is published to and the subscriber reads.
pub const SUBJECT: &str = "bench.events";
/// The subscription id the subscriber uses.
pub const SUBSCRIPTION_ID: &str = "1";
/// Sent first on every connection: no `+OK` acknowledgements, no pedantic checks.
pub const CONNECT_LINE: &[u8] = b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\n";
/// How long a handshake (`CONNECT` ... `PONG`) may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest control line (`INFO` can be a few KiB with cluster URLs).
pub const CONTROL_LINE_BYTES_MAX: usize = 64 * 1024;
/// Fields of a `MSG` line: `MSG subject sid [reply-to] size`.
const MSG_FIELD_COUNT_MAX: usize = 5;
/// Digits of a payload size (NATS's max_payload is at most 64 MiB).
const MSG_SIZE_DIGITS_MAX: usize = 9;

/// `PUB <SUBJECT> <payload_bytes>\r\n`: the bytes before every payload.
pub fn pub_head(payload_bytes: usize) -> String {
    format!("PUB {SUBJECT} {payload_bytes}\r\n")
}

/// `pub_head(payload_bytes).len()`, without building it.
pub fn pub_head_bytes(payload_bytes: usize) -> usize {
    let digits = payload_bytes.checked_ilog10().unwrap_or(0) as usize + 1;
    "PUB ".len() + SUBJECT.len() + 1 + digits + "\r\n".len()
}

/// What the `PONG` of a handshake came after.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Handshake {
    /// `version` from the server's `INFO`, if it sent one.
    pub server_version: Option<String>,
}

/// Connects, sends `CONNECT`, then `extra` (e.g. a `SUB`), then `PING`, and
/// waits for the `PONG`. An `-ERR` before it fails the handshake.
pub fn connect(addr: &str, what: &'static str, extra: &[u8]) -> Result<(TcpStream, Handshake), BenchError> {
    let mut stream =
        TcpStream::connect(addr).map_err(|source| BenchError::Connect { what, addr: addr.into(), source })?;
    stream.set_nodelay(true).map_err(|source| BenchError::Io { what: "set TCP_NODELAY", source })?;
    let mut hello = CONNECT_LINE.to_vec();
    hello.extend_from_slice(extra);
    hello.extend_from_slice(b"PING\r\n");
    stream.write_all(&hello).map_err(|source| BenchError::Io { what: "NATS CONNECT", source })?;
    let mut handshake = Handshake::default();
    read_control_until_pong(&mut stream, HANDSHAKE_TIMEOUT, |line| {
        if let Some(info) = line.strip_prefix("INFO ") {
            handshake.server_version = info_version(info);
        }
    })?;
    Ok((stream, handshake))
}

/// The `version` field of an `INFO` JSON document.
pub fn info_version(info_json: &str) -> Option<String> {
    let document: serde_json::Value = serde_json::from_str(info_json).ok()?;
    document.get("version")?.as_str().map(str::to_owned)
}

/// Reads control lines until `PONG`, answering `PING`s, failing on `-ERR`
/// (and on anything else than `INFO`, `+OK`, `PING`: no `MSG` can arrive on
/// a connection without a subscription, and a subscriber's handshake ends
/// before any event is published). `on_line` sees every line. Reads one byte
/// at a time so nothing after the `PONG` is consumed.
pub fn read_control_until_pong(
    stream: &mut TcpStream,
    timeout: Duration,
    mut on_line: impl FnMut(&str),
) -> Result<usize, BenchError> {
    let io_error = |source| BenchError::Io { what: "NATS handshake", source };
    stream.set_read_timeout(Some(timeout)).map_err(io_error)?;
    let started = Instant::now();
    let mut line = Vec::with_capacity(1024);
    let mut error_count = 0;
    loop {
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => return Err(BenchError::NatsClosed { during: "the handshake or the final PING" }),
            Ok(_) => line.push(byte[0]),
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(io_error(source)),
        }
        if line.len() > CONTROL_LINE_BYTES_MAX {
            return Err(BenchError::SubscribeLineTooLong { line_bytes_min: line.len() });
        }
        if !line.ends_with(b"\r\n") {
            continue;
        }
        let text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
        line.clear();
        on_line(&text);
        match text.as_str() {
            "PONG" => return Ok(error_count),
            "PING" => stream.write_all(b"PONG\r\n").map_err(io_error)?,
            "+OK" => {}
            _ if text.starts_with("INFO ") => {}
            _ if text.starts_with("-ERR") => error_count += 1,
            _ => return Err(BenchError::NatsUnexpected { line: text }),
        }
        if started.elapsed() > timeout {
            return Err(BenchError::Io { what: "NATS handshake", source: std::io::ErrorKind::TimedOut.into() });
        }
    }
}

/// Subscribes one connection to [`SUBJECT`]; when this returns, the server
/// has registered the subscription (its `PONG` came after the `SUB`).
pub fn subscribe(addr: &str) -> Result<(TcpStream, Handshake), BenchError> {
    let sub = format!("SUB {SUBJECT} {SUBSCRIPTION_ID}\r\n");
    let (stream, handshake) = connect(addr, "NATS subscriber", sub.as_bytes())?;
    Ok((stream, handshake))
}

/// Parses the subscriber's byte stream: `MSG` frames (timed through the
/// [`Recorder`]), `PING` (counted, for the caller to answer), `PONG`, `+OK`,
/// `INFO` (ignored), `-ERR` (fails the run).
pub struct NatsScanner {
    pub recorder: Recorder,
    /// `MSG bench.events 1 <payload_bytes>`: the header of every one of our
    /// events, recognised whole so the common case parses nothing.
    expected_head: Vec<u8>,
    expected_size: usize,
}

impl NatsScanner {
    pub fn new(recorder: Recorder) -> NatsScanner {
        let expected_size = recorder.payload_bytes();
        let expected_head = format!("MSG {SUBJECT} {SUBSCRIPTION_ID} {expected_size}").into_bytes();
        NatsScanner { recorder, expected_head, expected_size }
    }
}

/// One complete control line or frame at the start of the unread bytes.
#[derive(Debug, PartialEq)]
enum Op<'a> {
    /// A message: its payload, and the bytes it takes with its framing.
    Msg {
        payload: &'a [u8],
        bytes: usize,
    },
    Control {
        line: &'a [u8],
        bytes: usize,
    },
}

/// The next whole op of `data`, `Ok(None)` if `data` ends inside one.
/// A `MSG` line equal to `expected_head` has `expected_size` bytes.
fn next_op<'a>(data: &'a [u8], expected_head: &[u8], expected_size: usize) -> Result<Option<Op<'a>>, BenchError> {
    let Some(newline) = memchr::memchr(b'\n', data) else {
        if data.len() > CONTROL_LINE_BYTES_MAX {
            return Err(BenchError::SubscribeLineTooLong { line_bytes_min: data.len() });
        }
        return Ok(None);
    };
    let line = data[..newline].strip_suffix(b"\r").unwrap_or(&data[..newline]);
    let head_bytes = newline + 1;
    if !(line.starts_with(b"MSG ") || line.starts_with(b"MSG\t")) {
        return Ok(Some(Op::Control { line, bytes: head_bytes }));
    }
    let size = if line == expected_head { Some(expected_size) } else { msg_payload_size(line) };
    let size = size.ok_or_else(|| BenchError::NatsUnexpected { line: String::from_utf8_lossy(line).into_owned() })?;
    let frame_bytes = head_bytes + size + 2;
    if data.len() < frame_bytes {
        return Ok(None);
    }
    if &data[head_bytes + size..frame_bytes] != b"\r\n" {
        return Err(BenchError::NatsUnexpected { line: String::from_utf8_lossy(line).into_owned() });
    }
    Ok(Some(Op::Msg { payload: &data[head_bytes..head_bytes + size], bytes: frame_bytes }))
}

/// The payload size of `MSG <subject> <sid> [reply-to] <size>`: the last
/// field. Parsed by hand, backwards from the end: this runs once per event.
fn msg_payload_size(line: &[u8]) -> Option<usize> {
    let is_blank = |byte: &u8| *byte == b' ' || *byte == b'\t';
    let end = line.iter().rposition(|byte| !is_blank(byte))? + 1;
    let start = line[..end].iter().rposition(is_blank).map_or(0, |blank| blank + 1);
    let digits = &line[start..end];
    if digits.is_empty() || digits.len() > MSG_SIZE_DIGITS_MAX || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut field_count = 0;
    let mut in_field = false;
    for byte in &line[..end] {
        let starts_field = !is_blank(byte) && !in_field;
        field_count += usize::from(starts_field);
        in_field = !is_blank(byte);
    }
    if !(4..=MSG_FIELD_COUNT_MAX).contains(&field_count) {
        return None;
    }
    Some(digits.iter().fold(0usize, |size, digit| size * 10 + usize::from(digit - b'0')))
}

impl Scan for NatsScanner {
    fn recorder(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    fn scan(&mut self, data: &[u8], clock: &BenchClock, mut now_ns: u64) -> Result<Scanned, BenchError> {
        let mut scanned = Scanned::default();
        let received_before = self.recorder.outcome.events_received;
        while let Some(op) = next_op(&data[scanned.used..], &self.expected_head, self.expected_size)? {
            match op {
                Op::Msg { payload, bytes } => {
                    scanned.used += bytes;
                    self.recorder.refresh_clock(clock, &mut now_ns);
                    match self.recorder.stamp_of_payload(payload) {
                        Some(stamp_ns) => self.recorder.event(stamp_ns, now_ns),
                        None => self.recorder.outcome.foreign_line_count += 1,
                    }
                }
                Op::Control { line, bytes } => {
                    scanned.used += bytes;
                    match line {
                        b"PING" => scanned.pings += 1,
                        b"PONG" | b"+OK" => {}
                        _ if line.starts_with(b"INFO ") => {}
                        _ if line.starts_with(b"-ERR") => {
                            return Err(BenchError::SubscribeRefused {
                                line: String::from_utf8_lossy(line).into_owned(),
                            });
                        }
                        _ => self.recorder.outcome.foreign_line_count += 1,
                    }
                }
            }
        }
        if self.recorder.outcome.events_received > received_before {
            self.recorder.outcome.last_event_ns = now_ns;
        }
        Ok(scanned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stamp::{RunTag, encode_stamp};

    const TAG: RunTag = RunTag::from_seed(11);
    const PAYLOAD_BYTES: usize = 32;

    fn payload(stamp_ns: u64) -> Vec<u8> {
        let mut stamp = [0u8; 16];
        encode_stamp(stamp_ns, &mut stamp);
        let mut payload = stamp.to_vec();
        payload.extend_from_slice(TAG.bytes());
        payload.resize(PAYLOAD_BYTES, b'.');
        payload
    }

    fn msg(stamp_ns: u64) -> Vec<u8> {
        let mut frame = format!("MSG {SUBJECT} 1 {PAYLOAD_BYTES}\r\n").into_bytes();
        frame.extend_from_slice(&payload(stamp_ns));
        frame.extend_from_slice(b"\r\n");
        frame
    }

    fn scanner() -> NatsScanner {
        NatsScanner::new(Recorder::new(PAYLOAD_BYTES, TAG))
    }

    /// Feeds `data` in pieces of `piece_bytes`, keeping the unused tail like
    /// the subscriber's read loop; returns the pings seen and the leftover.
    fn feed(scanner: &mut NatsScanner, data: &[u8], piece_bytes: usize) -> (usize, usize) {
        let clock = BenchClock::new();
        let (mut buffer, mut pings) = (Vec::new(), 0);
        for piece in data.chunks(piece_bytes) {
            buffer.extend_from_slice(piece);
            let scanned = scanner.scan(&buffer, &clock, 100_000).unwrap();
            pings += scanned.pings;
            buffer.drain(..scanned.used);
        }
        (pings, buffer.len())
    }

    /// Frames split anywhere across reads (inside the header, the payload,
    /// the trailing CRLF) are timed once each, and a PING between them is
    /// counted for an answer.
    #[test]
    fn frames_split_across_reads_with_a_ping_between() {
        let mut data = b"INFO {\"version\":\"2.9.10\"}\r\n".to_vec();
        data.extend_from_slice(&msg(1_000));
        data.extend_from_slice(b"PING\r\n");
        data.extend_from_slice(&msg(2_000));
        data.extend_from_slice(b"+OK\r\nPONG\r\n");
        data.extend_from_slice(&msg(3_000));
        for piece_bytes in [1, 2, 3, 7, 13, 31, 64, data.len()] {
            let mut scanner = scanner();
            let (pings, leftover) = feed(&mut scanner, &data, piece_bytes);
            assert_eq!(pings, 1, "pieces of {piece_bytes}");
            assert_eq!(leftover, 0, "pieces of {piece_bytes}");
            let outcome = &scanner.recorder.outcome;
            assert_eq!(outcome.events_received, 3, "pieces of {piece_bytes}");
            assert_eq!(outcome.foreign_line_count, 0);
            assert!(outcome.latency_ns.equivalent(outcome.latency_ns.max(), 99_000));
            assert!(outcome.latency_ns.equivalent(outcome.latency_ns.min(), 97_000));
        }
    }

    /// A frame whose payload has not fully arrived is left for the next
    /// read, header and all.
    #[test]
    fn partial_payload_is_kept() {
        let frame = msg(5);
        let mut scanner = scanner();
        let cut = frame.len() - 3;
        let scanned = scanner.scan(&frame[..cut], &BenchClock::new(), 10).unwrap();
        assert_eq!(scanned.used, 0);
        assert_eq!(scanner.recorder.outcome.events_received, 0);
        let scanned = scanner.scan(&frame, &BenchClock::new(), 10).unwrap();
        assert_eq!(scanned.used, frame.len());
        assert_eq!(scanner.recorder.outcome.events_received, 1);
    }

    /// Reply subjects are allowed; payloads of other runs are foreign; a
    /// payload containing CRLF is read by its size, not its line ends.
    #[test]
    fn reply_subjects_foreign_payloads_and_crlf_in_payloads() {
        let mut data = format!("MSG {SUBJECT} 1 _INBOX.x {PAYLOAD_BYTES}\r\n").into_bytes();
        data.extend_from_slice(&payload(7));
        data.extend_from_slice(b"\r\nMSG other 9 6\r\nab\r\ncd\r\n");
        let mut scanner = scanner();
        let (pings, leftover) = feed(&mut scanner, &data, 5);
        assert_eq!((pings, leftover), (0, 0));
        assert_eq!(scanner.recorder.outcome.events_received, 1);
        assert_eq!(scanner.recorder.outcome.foreign_line_count, 1);
    }

    /// `-ERR` ends the run with the server's words; a malformed MSG too.
    #[test]
    fn errors_and_malformed_frames_fail() {
        let error = scanner().scan(b"-ERR 'Slow Consumer'\r\n", &BenchClock::new(), 0).unwrap_err();
        assert!(matches!(error, BenchError::SubscribeRefused { line } if line.contains("Slow Consumer")));
        let error = scanner().scan(b"MSG a 1 x\r\n", &BenchClock::new(), 0).unwrap_err();
        assert!(matches!(error, BenchError::NatsUnexpected { .. }));
        let error = scanner().scan(b"MSG a 1 2\r\nabXY", &BenchClock::new(), 0).unwrap_err();
        assert!(matches!(error, BenchError::NatsUnexpected { .. }), "payload not followed by CRLF");
    }

    /// The PUB head is what NATS expects, and INFO yields the version.
    #[test]
    fn pub_head_and_info() {
        assert_eq!(pub_head(64), "PUB bench.events 64\r\n");
        for payload_bytes in [0, 1, 9, 10, 99, 100, 65536] {
            assert_eq!(pub_head_bytes(payload_bytes), pub_head(payload_bytes).len(), "{payload_bytes}");
        }
        assert_eq!(
            info_version(r#"{"server_id":"x","version":"2.9.10","max_payload":1048576}"#).as_deref(),
            Some("2.9.10")
        );
        assert_eq!(info_version("not json"), None);
    }
}
