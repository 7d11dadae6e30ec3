//! The one subscriber of a run. Against spate: `SUB * latest` (or
//! `earliest`), reading `<partition> <offset> <key> <payload>` lines
//! ([`LineScanner`]); against NATS: `SUB bench.events 1`, reading `MSG` frames
//! ([`crate::bench::nats::NatsScanner`]). Either way it is opened before the
//! producers start, reads big chunks, and the [`Recorder`] times every bench
//! event from its stamp (intended send time) to now in an HDR histogram of
//! nanoseconds: the same code for both targets, so their latencies compare.
//!
//! The clock is read once per read and then every [`CLOCK_EVERY_LINES`]
//! events, not per event: at millions of events a second a clock read per
//! event would cost more than the parsing, and a chunk is scanned in far less
//! time than the latencies it measures. Lines that are not bench events
//! (another producer's, or a payload without this run's tag) are counted as
//! foreign and skipped.
//!
//! Warm-up: events stamped before `record_from_ns` (the end of `--warmup-s`)
//! are counted but not timed. Timed events also go into one small histogram
//! per second of their intended send time (`latency_by_second_ns`), so a
//! spike (a partition migrating, a hot spot moving) shows when it happened.

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
/// Events between two clock reads.
pub const CLOCK_EVERY_LINES: u64 = 128;
/// Highest latency the histogram tracks (larger values are clamped), in ns.
pub const LATENCY_NS_MAX: u64 = 600 * 1_000_000_000;
/// Significant decimal digits of the histogram.
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;
/// Seconds tracked one by one in `latency_by_second_ns`; events of later
/// seconds go into the last one. Each costs one histogram of
/// [`SECOND_LATENCY_SIGNIFICANT_DIGITS`] (about 16 KiB), so at most ~10 MiB.
pub const SECONDS_TRACKED_MAX: usize = 600;
/// Highest latency a per-second histogram tracks (larger values are clamped).
pub const SECOND_LATENCY_NS_MAX: u64 = 60 * 1_000_000_000;
/// Significant digits of the per-second histograms (1 % resolution).
pub const SECOND_LATENCY_SIGNIFICANT_DIGITS: u8 = 2;
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
    /// Events stamped earlier are warm-up: counted, not timed. Set before
    /// the producers start.
    pub record_from_ns: AtomicU64,
    pub stop: AtomicBool,
    /// Set when the subscriber thread has ended (the server closed it, or it failed).
    pub finished: AtomicBool,
}

impl SubscriberShared {
    pub fn new(clock: BenchClock) -> SubscriberShared {
        SubscriberShared {
            clock,
            events_received: AtomicU64::new(0),
            events_truncated: AtomicU64::new(0),
            latency_p99_ns: AtomicU64::new(0),
            events_expected: AtomicU64::new(u64::MAX),
            record_from_ns: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        }
    }
}

/// What the subscriber saw.
#[derive(Debug, Clone)]
pub struct SubscriberOutcome {
    /// Latency of the timed events (after the warm-up).
    pub latency_ns: Histogram<u64>,
    /// Timed events by second of intended send time since the warm-up ended.
    pub latency_by_second_ns: Vec<Histogram<u32>>,
    /// Every event of this run received, warm-up included.
    pub events_received: u64,
    /// Of those, received but not timed (stamped during the warm-up).
    pub events_warmup: u64,
    pub foreign_line_count: u64,
    pub truncated_notice_count: u64,
    /// Events the `TRUNCATED` notices skipped (they fell out of retention
    /// before the subscriber read them); they will never arrive.
    pub events_truncated: u64,
    /// Bench-clock time the last of this run's events arrived.
    pub last_event_ns: u64,
}

/// Recognises this run's payloads and times them: the part of a
/// subscriber that does not depend on the wire format.
pub struct Recorder {
    payload_bytes: usize,
    /// The part of this run's tag that fits in a payload.
    tag: Vec<u8>,
    pub outcome: SubscriberOutcome,
    pub record_from_ns: u64,
    event_count: u64,
}

impl Recorder {
    pub fn new(payload_bytes: usize, tag: RunTag) -> Recorder {
        let latency_ns = Histogram::new_with_bounds(1, LATENCY_NS_MAX, LATENCY_SIGNIFICANT_DIGITS)
            .expect("constant histogram bounds are valid");
        let outcome = SubscriberOutcome {
            latency_ns,
            latency_by_second_ns: Vec::new(),
            events_received: 0,
            events_warmup: 0,
            foreign_line_count: 0,
            truncated_notice_count: 0,
            events_truncated: 0,
            last_event_ns: 0,
        };
        let tag_bytes = payload_bytes.saturating_sub(STAMP_WIDTH).min(RUN_TAG_WIDTH);
        Recorder { payload_bytes, tag: tag.bytes()[..tag_bytes].to_vec(), outcome, record_from_ns: 0, event_count: 0 }
    }

    /// Bytes of every payload of this run.
    pub fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }

    /// The stamp of a payload of this run: the right size, a stamp, our tag.
    #[inline]
    pub fn stamp_of_payload(&self, payload: &[u8]) -> Option<u64> {
        if payload.len() != self.payload_bytes {
            return None;
        }
        if payload.get(STAMP_WIDTH..STAMP_WIDTH + self.tag.len())? != self.tag.as_slice() {
            return None;
        }
        decode_stamp(payload)
    }

    /// Refreshes `now_ns` every [`CLOCK_EVERY_LINES`] calls.
    #[inline]
    pub fn refresh_clock(&mut self, clock: &BenchClock, now_ns: &mut u64) {
        self.event_count += 1;
        if self.event_count.is_multiple_of(CLOCK_EVERY_LINES) {
            *now_ns = clock.now_ns();
        }
    }

    /// Counts one event of this run and times it unless it is warm-up.
    #[inline]
    pub fn event(&mut self, stamp_ns: u64, now_ns: u64) {
        let outcome = &mut self.outcome;
        outcome.events_received += 1;
        if stamp_ns < self.record_from_ns {
            outcome.events_warmup += 1;
            return;
        }
        let latency_ns = now_ns.saturating_sub(stamp_ns);
        outcome.latency_ns.saturating_record(latency_ns);
        let second = (((stamp_ns - self.record_from_ns) / 1_000_000_000) as usize).min(SECONDS_TRACKED_MAX - 1);
        while outcome.latency_by_second_ns.len() <= second {
            let histogram = Histogram::new_with_bounds(1, SECOND_LATENCY_NS_MAX, SECOND_LATENCY_SIGNIFICANT_DIGITS)
                .expect("constant histogram bounds are valid");
            outcome.latency_by_second_ns.push(histogram);
        }
        outcome.latency_by_second_ns[second].saturating_record(latency_ns);
    }
}

/// What one scan of the unread bytes did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scanned {
    /// Bytes of whole lines or frames consumed (the rest is a partial one).
    pub used: usize,
    /// `PING`s the server sent, each to be answered with a `PONG` (NATS).
    pub pings: usize,
}

/// A wire format's parser over the subscriber's byte stream.
pub trait Scan {
    fn recorder(&mut self) -> &mut Recorder;
    /// Scans every complete line or frame of `data`. `now_ns` is the time
    /// of the read; it is refreshed from `clock` as events are counted.
    fn scan(&mut self, data: &[u8], clock: &BenchClock, now_ns: u64) -> Result<Scanned, BenchError>;
}

/// Parses spate's subscription lines.
pub struct LineScanner {
    pub recorder: Recorder,
}

impl LineScanner {
    pub fn new(recorder: Recorder) -> LineScanner {
        LineScanner { recorder }
    }

    /// The stamp of this run's event line: its payload is the last
    /// `payload_bytes` bytes, after a space, and is a stamp and our tag.
    #[inline]
    fn stamp_of(&self, line: &[u8]) -> Option<u64> {
        let payload_start = line.len().checked_sub(self.recorder.payload_bytes)?;
        if payload_start == 0 || line[payload_start - 1] != b' ' {
            return None;
        }
        self.recorder.stamp_of_payload(&line[payload_start..])
    }
}

impl Scan for LineScanner {
    fn recorder(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    fn scan(&mut self, data: &[u8], clock: &BenchClock, mut now_ns: u64) -> Result<Scanned, BenchError> {
        let mut line_start = 0;
        let received_before = self.recorder.outcome.events_received;
        for line_end in memchr::memchr_iter(b'\n', data) {
            let line = &data[line_start..line_end];
            line_start = line_end + 1;
            if let Some(stamp_ns) = self.stamp_of(line) {
                self.recorder.refresh_clock(clock, &mut now_ns);
                self.recorder.event(stamp_ns, now_ns);
                continue;
            }
            let outcome = &mut self.recorder.outcome;
            if let Some(notice) = line.strip_prefix(b"TRUNCATED ") {
                outcome.truncated_notice_count += 1;
                outcome.events_truncated += skipped_by(notice).unwrap_or(0);
            } else if line.starts_with(b"ERR ") {
                return Err(BenchError::SubscribeRefused { line: String::from_utf8_lossy(line).into_owned() });
            } else {
                outcome.foreign_line_count += 1;
            }
        }
        if self.recorder.outcome.events_received > received_before {
            self.recorder.outcome.last_event_ns = now_ns;
        }
        Ok(Scanned { used: line_start, pings: 0 })
    }
}

/// Events skipped by a `<partition> <requested-offset> <next-readable-offset>` notice.
fn skipped_by(notice: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(notice).ok()?;
    let mut numbers = text.split(' ').skip(1).map(|number| number.parse::<u64>().ok());
    let (requested, next) = (numbers.next()??, numbers.next()??);
    next.checked_sub(requested)
}

/// Connects to spate and sends the `SUB` line (on the caller's thread, so a
/// refused connection fails the run before any producer starts).
pub fn subscribe(addr: &str, from: SubFrom) -> Result<TcpStream, BenchError> {
    let mut stream = TcpStream::connect(addr).map_err(|source| BenchError::Connect {
        what: "subscribe",
        addr: addr.into(),
        source,
    })?;
    stream.set_nodelay(true).map_err(|source| BenchError::Io { what: "set TCP_NODELAY", source })?;
    stream
        .write_all(format!("SUB * {}\n", from.as_str()).as_bytes())
        .map_err(|source| BenchError::Io { what: "send SUB", source })?;
    Ok(stream)
}

/// Sets `finished` when the subscriber thread ends, however it ends.
struct FinishedOnDrop<'a>(&'a AtomicBool);

impl Drop for FinishedOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Reads until every expected event arrived, `stop` is set, or the server
/// closes the connection; answers `PING`s the scanner reports.
pub fn run<S: Scan>(
    mut stream: TcpStream,
    mut scanner: S,
    shared: Arc<SubscriberShared>,
) -> Result<SubscriberOutcome, BenchError> {
    let _finished = FinishedOnDrop(&shared.finished);
    stream
        .set_read_timeout(Some(READ_TIMEOUT))
        .map_err(|source| BenchError::Io { what: "set read timeout", source })?;
    let clock = shared.clock;
    let mut buffer = vec![0u8; READ_BYTES];
    let mut filled = 0usize;
    let mut published_at_ns = clock.now_ns();
    loop {
        let received = scanner.recorder().outcome.events_received;
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
        // Loaded after the read: the producers start only after it is set,
        // so any event in this read was sent after it was.
        scanner.recorder().record_from_ns = shared.record_from_ns.load(Ordering::SeqCst);
        let scanned = scanner.scan(&buffer[..filled], &clock, now_ns)?;
        for _ in 0..scanned.pings {
            stream.write_all(b"PONG\r\n").map_err(|source| BenchError::Io { what: "answer PING", source })?;
        }
        buffer.copy_within(scanned.used..filled, 0);
        filled -= scanned.used;
        if filled == buffer.len() {
            return Err(BenchError::SubscribeLineTooLong { line_bytes_min: filled });
        }
        let outcome = &scanner.recorder().outcome;
        shared.events_received.store(outcome.events_received, Ordering::Relaxed);
        shared.events_truncated.store(outcome.events_truncated, Ordering::Relaxed);
        if now_ns - published_at_ns >= 1_000_000_000 {
            published_at_ns = now_ns;
            shared.latency_p99_ns.store(outcome.latency_ns.value_at_quantile(0.99), Ordering::Relaxed);
        }
    }
    let outcome = scanner.recorder().outcome.clone();
    shared.events_received.store(outcome.events_received, Ordering::Relaxed);
    Ok(outcome)
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
        let mut scanner = LineScanner::new(Recorder::new(32, TAG));
        let scanned = scanner.scan(&data, &clock, 10_000).unwrap();
        assert_eq!(scanned, Scanned { used: data.len() - 10, pings: 0 });
        let outcome = &scanner.recorder.outcome;
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
        let mut scanner = LineScanner::new(Recorder::new(16, TAG));
        let error = scanner.scan(b"ERR subscriber_limit: full\n", &BenchClock::new(), 0).unwrap_err();
        assert!(matches!(error, BenchError::SubscribeRefused { line } if line.contains("subscriber_limit")));
    }

    /// Warm-up events are counted but not timed; timed ones land in the
    /// second of their intended send time after the warm-up.
    #[test]
    fn warmup_is_counted_not_timed_and_seconds_are_bucketed() {
        let second_ns = 1_000_000_000;
        let mut recorder = Recorder::new(32, TAG);
        recorder.record_from_ns = 10 * second_ns;
        recorder.event(9 * second_ns, 9 * second_ns + 5_000);
        recorder.event(10 * second_ns, 10 * second_ns + 1_000);
        recorder.event(12 * second_ns + 1, 12 * second_ns + 2_001);
        recorder.event(10_000 * second_ns, 10_000 * second_ns + 3_000);
        let outcome = &recorder.outcome;
        assert_eq!((outcome.events_received, outcome.events_warmup), (4, 1));
        assert_eq!(outcome.latency_ns.len(), 3);
        assert!(outcome.latency_ns.equivalent(outcome.latency_ns.max(), 3_000), "the warm-up's 5 µs is not timed");
        let counts: Vec<u64> = outcome.latency_by_second_ns.iter().map(Histogram::len).collect();
        assert_eq!(counts.len(), SECONDS_TRACKED_MAX, "late seconds fold into the last one");
        assert_eq!((counts[0], counts[1], counts[2], counts[SECONDS_TRACKED_MAX - 1]), (1, 0, 1, 1));
    }
}
