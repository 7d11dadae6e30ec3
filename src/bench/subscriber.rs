//! The one subscriber of a run: `SUB * latest` (or `earliest`), opened before
//! the producers start; reads `<partition> <offset> <key> <payload>` lines in
//! big chunks and records, for every bench event, the time from its stamp
//! (intended send time) to now in an HDR histogram of nanoseconds.
//!
//! The clock is read once per read and then every [`CLOCK_EVERY_LINES`]
//! lines, not per event: at millions of lines a second a clock read per line
//! would cost more than the parsing, and a chunk is scanned in far less time
//! than the latencies it measures. Lines that are not bench events (another
//! producer's, or a payload without a stamp) are counted as foreign and
//! skipped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::bench::BenchError;
use crate::bench::args::SubFrom;
use crate::bench::stamp::{BenchClock, RUN_TAG_WIDTH, RunTag, STAMP_WIDTH, decode_stamp};

/// Bytes the subscriber reads at once; also the longest line it accepts
/// (above the server's default 1 MiB line limit plus the line prefix).
pub const READ_BYTES: usize = 4 * 1024 * 1024;
/// Lines between two clock reads.
pub const CLOCK_EVERY_LINES: u64 = 128;
/// Highest latency the histogram tracks (larger values are clamped), in ns.
pub const LATENCY_NS_MAX: u64 = 600 * 1_000_000_000;
/// Significant decimal digits of the histogram.
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;
/// How often a blocked read wakes up to look at the stop flag.
const READ_TIMEOUT: Duration = Duration::from_millis(100);

/// Shared with the main thread while the subscriber runs.
pub struct SubscriberShared {
    pub clock: BenchClock,
    pub events_received: AtomicU64,
    pub events_truncated: AtomicU64,
    /// p99 latency so far in ns, refreshed about once a second.
    pub latency_p99_ns: AtomicU64,
    /// Events the producers sent, once they are done (`u64::MAX` before).
    pub events_expected: AtomicU64,
    pub stop: AtomicBool,
}

impl SubscriberShared {
    pub fn new(clock: BenchClock) -> SubscriberShared {
        SubscriberShared {
            clock,
            events_received: AtomicU64::new(0),
            events_truncated: AtomicU64::new(0),
            latency_p99_ns: AtomicU64::new(0),
            events_expected: AtomicU64::new(u64::MAX),
            stop: AtomicBool::new(false),
        }
    }
}

/// What the subscriber saw.
#[derive(Debug, Clone)]
pub struct SubscriberOutcome {
    pub latency_ns: Histogram<u64>,
    pub events_received: u64,
    pub foreign_line_count: u64,
    pub truncated_notice_count: u64,
    /// Events the `TRUNCATED` notices skipped (they fell out of retention
    /// before the subscriber read them); they will never arrive.
    pub events_truncated: u64,
    /// Bench-clock time the last of this run's events arrived.
    pub last_event_ns: u64,
}

/// Counts and latencies of scanned lines.
pub struct LineScanner {
    payload_bytes: usize,
    /// The part of this run's tag that fits in a payload.
    tag: Vec<u8>,
    pub outcome: SubscriberOutcome,
    line_count: u64,
}

impl LineScanner {
    pub fn new(payload_bytes: usize, tag: RunTag) -> LineScanner {
        let latency_ns = Histogram::new_with_bounds(1, LATENCY_NS_MAX, LATENCY_SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        let outcome = SubscriberOutcome {
            latency_ns,
            events_received: 0,
            foreign_line_count: 0,
            truncated_notice_count: 0,
            events_truncated: 0,
            last_event_ns: 0,
        };
        let tag_bytes = payload_bytes.saturating_sub(STAMP_WIDTH).min(RUN_TAG_WIDTH);
        LineScanner { payload_bytes, tag: tag.bytes()[..tag_bytes].to_vec(), outcome, line_count: 0 }
    }

    /// Scans every complete line of `data`; returns how many bytes it used
    /// (the rest is a partial line). `now_ns` is refreshed from `clock` every
    /// [`CLOCK_EVERY_LINES`] lines.
    pub fn scan(&mut self, data: &[u8], clock: &BenchClock, mut now_ns: u64) -> Result<usize, BenchError> {
        let mut line_start = 0;
        let received_before = self.outcome.events_received;
        for line_end in memchr::memchr_iter(b'\n', data) {
            let line = &data[line_start..line_end];
            line_start = line_end + 1;
            self.line_count += 1;
            if self.line_count.is_multiple_of(CLOCK_EVERY_LINES) {
                now_ns = clock.now_ns();
            }
            if let Some(stamp_ns) = self.stamp_of(line) {
                self.outcome.latency_ns.saturating_record(now_ns.saturating_sub(stamp_ns));
                self.outcome.events_received += 1;
            } else if let Some(notice) = line.strip_prefix(b"TRUNCATED ") {
                self.outcome.truncated_notice_count += 1;
                self.outcome.events_truncated += skipped_by(notice).unwrap_or(0);
            } else if line.starts_with(b"ERR ") {
                return Err(BenchError::SubscribeRefused { line: String::from_utf8_lossy(line).into_owned() });
            } else {
                self.outcome.foreign_line_count += 1;
            }
        }
        if self.outcome.events_received > received_before {
            self.outcome.last_event_ns = now_ns;
        }
        Ok(line_start)
    }

    /// The stamp of this run's event line: its payload is the last
    /// `payload_bytes` bytes, after a space, and is a stamp and our tag.
    #[inline]
    fn stamp_of(&self, line: &[u8]) -> Option<u64> {
        let payload_start = line.len().checked_sub(self.payload_bytes)?;
        if payload_start == 0 || line[payload_start - 1] != b' ' {
            return None;
        }
        let payload = &line[payload_start..];
        if payload.get(STAMP_WIDTH..STAMP_WIDTH + self.tag.len())? != self.tag.as_slice() {
            return None;
        }
        decode_stamp(payload)
    }
}

/// Events skipped by a `<partition> <requested-offset> <next-readable-offset>` notice.
fn skipped_by(notice: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(notice).ok()?;
    let mut numbers = text.split(' ').skip(1).map(|number| number.parse::<u64>().ok());
    let (requested, next) = (numbers.next()??, numbers.next()??);
    next.checked_sub(requested)
}

/// Connects and sends the `SUB` line (on the caller's thread, so a refused
/// connection fails the run before any producer starts).
pub fn subscribe(addr: &str, from: SubFrom) -> Result<TcpStream, BenchError> {
    let mut stream = TcpStream::connect(addr).map_err(|source| BenchError::Connect {
        what: "subscribe",
        addr: addr.into(),
        source,
    })?;
    stream
        .write_all(format!("SUB * {}\n", from.as_str()).as_bytes())
        .map_err(|source| BenchError::Io { what: "send SUB", source })?;
    stream
        .set_read_timeout(Some(READ_TIMEOUT))
        .map_err(|source| BenchError::Io { what: "set read timeout", source })?;
    Ok(stream)
}

/// Reads until every expected event arrived, `stop` is set, or the server
/// closes the connection.
pub fn run(
    mut stream: TcpStream,
    payload_bytes: usize,
    tag: RunTag,
    shared: Arc<SubscriberShared>,
) -> Result<SubscriberOutcome, BenchError> {
    let clock = shared.clock;
    let mut scanner = LineScanner::new(payload_bytes, tag);
    let mut buffer = vec![0u8; READ_BYTES];
    let mut filled = 0usize;
    let mut published_at_ns = clock.now_ns();
    loop {
        let received = scanner.outcome.events_received;
        if shared.stop.load(Ordering::Relaxed) || received >= shared.events_expected.load(Ordering::Relaxed) {
            // Events lost to truncation end the run through the main thread's
            // drain wait, which gives stragglers a moment first.
            break;
        }
        let count = match stream.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                continue;
            }
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(source) => return Err(BenchError::Io { what: "read subscription", source }),
        };
        filled += count;
        let now_ns = clock.now_ns();
        let used = scanner.scan(&buffer[..filled], &clock, now_ns)?;
        buffer.copy_within(used..filled, 0);
        filled -= used;
        if filled == buffer.len() {
            return Err(BenchError::SubscribeLineTooLong { line_bytes_min: filled });
        }
        shared.events_received.store(scanner.outcome.events_received, Ordering::Relaxed);
        shared.events_truncated.store(scanner.outcome.events_truncated, Ordering::Relaxed);
        if now_ns - published_at_ns >= 1_000_000_000 {
            published_at_ns = now_ns;
            shared.latency_p99_ns.store(scanner.outcome.latency_ns.value_at_quantile(0.99), Ordering::Relaxed);
        }
    }
    shared.events_received.store(scanner.outcome.events_received, Ordering::Relaxed);
    Ok(scanner.outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stamp::encode_stamp;

    const TAG: RunTag = RunTag::from_seed(3);

    fn event_line(partition: u32, offset: u64, key: &str, stamp_ns: u64, payload_bytes: usize) -> Vec<u8> {
        tagged_line(partition, offset, key, stamp_ns, payload_bytes, TAG)
    }

    fn tagged_line(
        partition: u32,
        offset: u64,
        key: &str,
        stamp_ns: u64,
        payload_bytes: usize,
        tag: RunTag,
    ) -> Vec<u8> {
        let mut stamp = [0u8; 16];
        encode_stamp(stamp_ns, &mut stamp);
        let mut payload = stamp.to_vec();
        payload.extend_from_slice(tag.bytes());
        payload.resize(payload_bytes, b'.');
        let mut line = format!("{partition} {offset} {key} ").into_bytes();
        line.extend_from_slice(&payload);
        line.push(b'\n');
        line
    }

    /// Bench events are timed, notices and foreign lines counted, and a
    /// partial line is left for the next read.
    #[test]
    fn scanner_times_bench_events_and_keeps_partial_lines() {
        let clock = BenchClock::new();
        let mut data = event_line(3, 0, "k001", 1_000, 32);
        data.extend_from_slice(&event_line(200, 17, "k999", 4_000, 32));
        data.extend_from_slice(b"TRUNCATED 5 0 100\n");
        data.extend_from_slice(b"7 3 user42 clicked\n");
        data.extend_from_slice(&tagged_line(3, 1, "k001", 2_000, 32, RunTag::from_seed(4)));
        let partial = event_line(1, 1, "k002", 0, 32);
        data.extend_from_slice(&partial[..10]);
        let mut scanner = LineScanner::new(32, TAG);
        let used = scanner.scan(&data, &clock, 10_000).unwrap();
        assert_eq!(used, data.len() - 10);
        let outcome = &scanner.outcome;
        assert_eq!(outcome.events_received, 2);
        assert_eq!(outcome.last_event_ns, 10_000);
        assert_eq!(outcome.truncated_notice_count, 1);
        assert_eq!(outcome.events_truncated, 100);
        assert_eq!(outcome.foreign_line_count, 2, "another run's events are foreign");
        assert_eq!(outcome.latency_ns.len(), 2);
        assert!(outcome.latency_ns.equivalent(outcome.latency_ns.max(), 9_000), "latencies are now - stamp");
        assert!(outcome.latency_ns.equivalent(outcome.latency_ns.min(), 6_000));
    }

    /// An `ERR` from the server ends the run with its text.
    #[test]
    fn scanner_reports_a_refusal() {
        let mut scanner = LineScanner::new(16, TAG);
        let error = scanner.scan(b"ERR subscriber_limit: full\n", &BenchClock::new(), 0).unwrap_err();
        assert!(matches!(error, BenchError::SubscribeRefused { line } if line.contains("subscriber_limit")));
    }
}
