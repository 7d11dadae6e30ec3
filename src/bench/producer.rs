//! One producer connection: builds lines into a reusable buffer and writes
//! them in big chunks, closed loop (as fast as TCP takes them) or open loop
//! (on a schedule), then sends `#SYNC` and waits for the `OK`.
//!
//! The hot path allocates nothing and reads no clock per event. Every line of a
//! run has the same length (`KEY SP STAMP PADDING LF`, keys of one width), so
//! the [`WriteBuffer`] is laid out once, padding and separators included, and
//! each event only patches its key (one 8-byte store of a pre-drawn line
//! head, see [`crate::bench::keys`]) and its 16-digit stamp in place.
//!
//! Open loop is coordinated-omission-correct: event `i` of a connection has an
//! intended send time on a fixed schedule, and that time (not the time it was
//! actually written) is its stamp. When the server pushes back, the events
//! that fell due meanwhile are sent as soon as the socket takes them, still
//! stamped with when they should have gone, so the stall shows in the
//! latency instead of silently thinning the load.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::bench::BenchError;
use crate::bench::keys::{HEAD_PADDING, KEY_WIDTH_MAX, KeySampler, draw_ring_len, resolve_head};
use crate::bench::stamp::{BenchClock, RUN_TAG_WIDTH, RunTag, STAMP_WIDTH, encode_stamp};

/// How long a connection waits for its `OK ... SYNC` once everything is sent.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one write may block (the server reads nothing at all) before the
/// run fails instead of hanging: far above any credit stall of a live server.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Byte that pads a payload after its stamp.
const PADDING: u8 = HEAD_PADDING;

/// The shape of every line of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineLayout {
    pub key_width: usize,
    pub payload_bytes: usize,
    /// The payload starts with a send-time stamp and the run's tag
    /// (payloads of at least [`STAMP_WIDTH`] bytes).
    pub stamped: bool,
    pub tag: RunTag,
}

impl LineLayout {
    pub fn new(key_width: usize, payload_bytes: usize, tag: RunTag) -> LineLayout {
        LineLayout { key_width, payload_bytes, stamped: payload_bytes >= STAMP_WIDTH, tag }
    }

    /// Bytes of the tag that fit after the stamp.
    pub fn tag_bytes(&self) -> usize {
        if self.stamped { (self.payload_bytes - STAMP_WIDTH).min(RUN_TAG_WIDTH) } else { 0 }
    }

    /// Bytes of one line on the wire, LF included.
    pub fn line_bytes(&self) -> usize {
        self.key_width + 1 + self.payload_bytes + 1
    }

    fn stamp_offset(&self) -> usize {
        self.key_width + 1
    }
}

/// Lines built in place, reused for every write of a connection.
pub struct WriteBuffer {
    bytes: Vec<u8>,
    layout: LineLayout,
    line_capacity: usize,
}

/// The stamps of the lines of one fill.
#[derive(Debug, Clone, Copy)]
pub enum Stamps {
    /// Every line gets this time (closed loop: when the chunk was built).
    One(u64),
    /// Line `i` gets the intended time of event `first_event_index + i`.
    Scheduled { schedule: Schedule, first_event_index: u64 },
}

impl WriteBuffer {
    /// A buffer of as many whole lines as fit in `write_bytes` (at least one),
    /// with separators and padding already in place.
    pub fn new(layout: LineLayout, write_bytes: usize) -> WriteBuffer {
        let line_bytes = layout.line_bytes();
        let line_capacity = (write_bytes / line_bytes).max(1);
        let mut line = vec![PADDING; line_bytes];
        line[..layout.key_width].fill(b'k');
        line[layout.key_width] = b' ';
        if layout.stamped {
            let tag_offset = layout.stamp_offset() + STAMP_WIDTH;
            let tag_bytes = layout.tag_bytes();
            line[tag_offset..tag_offset + tag_bytes].copy_from_slice(&layout.tag.bytes()[..tag_bytes]);
        }
        line[line_bytes - 1] = b'\n';
        let bytes = line.repeat(line_capacity);
        WriteBuffer { bytes, layout, line_capacity }
    }

    pub fn line_capacity(&self) -> usize {
        self.line_capacity
    }

    /// Patches `line_count` lines: line heads (keys) from the `draws` ring,
    /// advancing `draw_index`, and stamps. Returns the bytes to write.
    pub fn fill(
        &mut self,
        line_count: usize,
        draws: &[u64],
        draw_index: &mut usize,
        hot_heads: &[u64],
        stamps: Stamps,
    ) -> &[u8] {
        match stamps {
            Stamps::One(nanos) => {
                let mut digits = [0u8; STAMP_WIDTH];
                encode_stamp(nanos, &mut digits);
                self.fill_with(line_count, draws, draw_index, hot_heads, |_| digits)
            }
            Stamps::Scheduled { schedule, first_event_index } => {
                self.fill_with(line_count, draws, draw_index, hot_heads, |line_index| {
                    let mut digits = [0u8; STAMP_WIDTH];
                    encode_stamp(schedule.intended_ns(first_event_index + line_index as u64), &mut digits);
                    digits
                })
            }
        }
    }

    #[inline]
    fn fill_with(
        &mut self,
        line_count: usize,
        draws: &[u64],
        draw_index: &mut usize,
        hot_heads: &[u64],
        mut stamp_of: impl FnMut(usize) -> [u8; STAMP_WIDTH],
    ) -> &[u8] {
        assert!(line_count <= self.line_capacity);
        assert!(draws.len().is_power_of_two());
        let layout = self.layout;
        let (key_width, stamp_offset, line_bytes) = (layout.key_width, layout.stamp_offset(), layout.line_bytes());
        // A line head is 8 bytes: key, space, padding. It may be stored whole
        // when the line's LF lies beyond it; the stamp, written after it,
        // overwrites whatever padding it covered.
        let whole_head = line_bytes > KEY_WIDTH_MAX;
        let mask = draws.len() - 1;
        let used = line_count * line_bytes;
        for (line_index, line) in self.bytes[..used].chunks_exact_mut(line_bytes).enumerate() {
            let head = resolve_head(draws[*draw_index & mask], hot_heads).to_le_bytes();
            *draw_index = draw_index.wrapping_add(1);
            if whole_head {
                line[..KEY_WIDTH_MAX].copy_from_slice(&head);
            } else {
                line[..key_width].copy_from_slice(&head[..key_width]);
            }
            if layout.stamped {
                line[stamp_offset..stamp_offset + STAMP_WIDTH].copy_from_slice(&stamp_of(line_index));
            }
        }
        &self.bytes[..used]
    }
}

/// Open-loop schedule of one connection: event `i` is due at
/// `start_ns + phase_ns + i * interval_ns`. Connections get phases spread over
/// one interval so that together they send evenly.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub start_ns: u64,
    pub phase_ns: f64,
    pub interval_ns: f64,
}

impl Schedule {
    #[inline]
    pub fn intended_ns(&self, event_index: u64) -> u64 {
        self.start_ns + (self.phase_ns + event_index as f64 * self.interval_ns) as u64
    }

    /// How many events are due at `now_ns` (intended at or before it).
    pub fn due_count(&self, now_ns: u64) -> u64 {
        let first_ns = self.start_ns as f64 + self.phase_ns;
        if (now_ns as f64) < first_ns {
            return 0;
        }
        ((now_ns as f64 - first_ns) / self.interval_ns) as u64 + 1
    }
}

/// Everything shared by the producers and the main thread: the start line,
/// abort and live counters for the progress line.
pub struct Shared {
    pub clock: BenchClock,
    /// Producers and the main thread meet here; then everyone reads `start_ns`.
    pub start_barrier: Barrier,
    pub start_ns: AtomicU64,
    /// Set by anyone that failed, so the others stop early.
    pub abort: AtomicBool,
    pub events_sent: AtomicU64,
    pub line_bytes_sent: AtomicU64,
}

/// What one connection does.
pub struct ProducerTask {
    pub index: usize,
    pub ingest: String,
    /// Events to send; `None` means until `duration`.
    pub quota: Option<u64>,
    pub duration: Option<Duration>,
    /// Events/s of this connection (open loop).
    pub rate: Option<f64>,
    pub connection_count: usize,
    pub tick: Duration,
    pub layout: LineLayout,
    pub write_bytes: usize,
    pub sampler: KeySampler,
    pub seed: u64,
    pub shared: Arc<Shared>,
}

/// What one connection did.
#[derive(Debug, Clone, Default)]
pub struct ProducerOutcome {
    pub events_sent: u64,
    pub line_bytes_sent: u64,
    /// `write` calls that carried them (each may be several syscalls).
    pub write_count: u64,
    /// Bench-clock time of the first write and of the `OK` to `#SYNC`.
    pub first_write_ns: u64,
    pub sync_ok_ns: u64,
    /// `ERR` lines the server sent back (none expected).
    pub error_line_count: u64,
    pub first_error_line: Option<String>,
}

/// The connection before the start line.
struct Ready {
    stream: TcpStream,
    draws: Vec<u64>,
    buffer: WriteBuffer,
    /// Line heads of the current hot set (hotspot), and where it starts.
    hot_heads: Vec<u64>,
    hot_base: u32,
}

impl Ready {
    /// Keeps `hot_heads` on the hot set of `elapsed_ns` into the run.
    fn follow_hot_set(&mut self, sampler: &KeySampler, elapsed_ns: u64) {
        let hot_base = sampler.hot_base(elapsed_ns);
        if hot_base != self.hot_base {
            self.hot_base = hot_base;
            sampler.hot_heads(hot_base, &mut self.hot_heads);
        }
    }
}

impl ProducerTask {
    /// Connects and draws keys, meets the others at the start barrier, sends,
    /// and syncs. The barrier is always reached, even on failure, so one bad
    /// connection cannot hang the rest.
    pub fn run(self) -> Result<ProducerOutcome, BenchError> {
        let ready = self.prepare();
        if ready.is_err() {
            self.shared.abort.store(true, Ordering::SeqCst);
        }
        self.shared.start_barrier.wait();
        let mut ready = ready?;
        if self.shared.abort.load(Ordering::SeqCst) {
            return Ok(ProducerOutcome::default());
        }
        let start_ns = self.shared.start_ns.load(Ordering::SeqCst);
        let mut outcome = match self.rate {
            None => self.send_closed_loop(&mut ready, start_ns),
            Some(rate) => self.send_open_loop(&mut ready, start_ns, rate),
        }
        .inspect_err(|_| self.shared.abort.store(true, Ordering::SeqCst))?;
        self.sync(&mut ready.stream, &mut outcome)?;
        Ok(outcome)
    }

    fn prepare(&self) -> Result<Ready, BenchError> {
        let stream = TcpStream::connect(&self.ingest).map_err(|source| BenchError::Connect {
            what: "ingest",
            addr: self.ingest.clone(),
            source,
        })?;
        // Open-loop writes can be small; they must not wait for Nagle.
        stream.set_nodelay(true).map_err(|source| BenchError::Io { what: "set TCP_NODELAY", source })?;
        stream
            .set_write_timeout(Some(WRITE_STALL_TIMEOUT))
            .map_err(|source| BenchError::Io { what: "set write timeout", source })?;
        if self.rate.is_some() {
            set_timer_slack_ns(1000);
        }
        let draws = self.sampler.draws(draw_ring_len(self.connection_count), self.seed);
        let buffer = WriteBuffer::new(self.layout, self.write_bytes);
        let mut hot_heads = Vec::new();
        self.sampler.hot_heads(0, &mut hot_heads);
        Ok(Ready { stream, draws, buffer, hot_heads, hot_base: 0 })
    }

    fn elapsed_deadline_ns(&self) -> u64 {
        self.duration.map_or(u64::MAX, |duration| u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }

    fn send_closed_loop(&self, ready: &mut Ready, start_ns: u64) -> Result<ProducerOutcome, BenchError> {
        let clock = self.shared.clock;
        let mut remaining = self.quota.unwrap_or(u64::MAX);
        let deadline_ns = self.elapsed_deadline_ns();
        let mut outcome = ProducerOutcome { first_write_ns: clock.now_ns(), ..ProducerOutcome::default() };
        let mut draw_index = 0usize;
        while remaining > 0 && !self.shared.abort.load(Ordering::Relaxed) {
            let now_ns = clock.now_ns();
            let elapsed_ns = now_ns.saturating_sub(start_ns);
            if elapsed_ns >= deadline_ns {
                break;
            }
            let line_count = remaining.min(ready.buffer.line_capacity() as u64) as usize;
            ready.follow_hot_set(&self.sampler, elapsed_ns);
            let bytes =
                ready.buffer.fill(line_count, &ready.draws, &mut draw_index, &ready.hot_heads, Stamps::One(now_ns));
            self.write(&mut ready.stream, bytes, line_count as u64, &mut outcome)?;
            remaining -= line_count as u64;
        }
        Ok(outcome)
    }

    fn send_open_loop(&self, ready: &mut Ready, start_ns: u64, rate: f64) -> Result<ProducerOutcome, BenchError> {
        let clock = self.shared.clock;
        let interval_ns = 1e9 / rate;
        let phase_ns = interval_ns * self.index as f64 / self.connection_count as f64;
        let schedule = Schedule { start_ns, phase_ns, interval_ns };
        let quota = match (self.quota, self.duration) {
            (Some(quota), _) => quota,
            (None, Some(duration)) => (duration.as_secs_f64() * rate).round() as u64,
            (None, None) => u64::MAX,
        };
        let tick_ns = self.tick.as_nanos() as u64;
        let mut outcome = ProducerOutcome::default();
        let mut draw_index = 0usize;
        let mut sent = 0u64;
        while sent < quota && !self.shared.abort.load(Ordering::Relaxed) {
            let woke_ns = clock.now_ns();
            let due = schedule.due_count(woke_ns).min(quota);
            if sent == 0 && due > 0 {
                outcome.first_write_ns = woke_ns;
            }
            ready.follow_hot_set(&self.sampler, woke_ns.saturating_sub(start_ns));
            // Everything due at wake-up goes out now, in buffer-sized writes.
            while sent < due {
                let line_count = (due - sent).min(ready.buffer.line_capacity() as u64) as usize;
                let stamps = Stamps::Scheduled { schedule, first_event_index: sent };
                let bytes = ready.buffer.fill(line_count, &ready.draws, &mut draw_index, &ready.hot_heads, stamps);
                self.write(&mut ready.stream, bytes, line_count as u64, &mut outcome)?;
                sent += line_count as u64;
            }
            // Then sleep: until the next event is due, and at least a tick
            // after this wake-up, so that events gather into one write per
            // tick instead of one write per event. When the writes took
            // longer than a tick (the server pushed back), there is no sleep
            // and the events that fell due meanwhile go out at once.
            let wake_ns = schedule.intended_ns(sent).max(woke_ns + tick_ns);
            let now_ns = clock.now_ns();
            if sent < quota && wake_ns > now_ns {
                std::thread::sleep(Duration::from_nanos(wake_ns - now_ns));
            }
        }
        Ok(outcome)
    }

    fn write(
        &self,
        stream: &mut TcpStream,
        bytes: &[u8],
        event_count: u64,
        outcome: &mut ProducerOutcome,
    ) -> Result<(), BenchError> {
        stream.write_all(bytes).map_err(|source| match source.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                BenchError::ServerStalled { connection: self.index, waited_s: WRITE_STALL_TIMEOUT.as_secs() }
            }
            _ => BenchError::Io { what: "write to ingest", source },
        })?;
        outcome.events_sent += event_count;
        outcome.write_count += 1;
        outcome.line_bytes_sent += bytes.len() as u64;
        self.shared.events_sent.fetch_add(event_count, Ordering::Relaxed);
        self.shared.line_bytes_sent.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Sends `#SYNC bench-<index>` and reads replies until its `OK`.
    fn sync(&self, stream: &mut TcpStream, outcome: &mut ProducerOutcome) -> Result<(), BenchError> {
        let token = format!("bench-{}", self.index);
        let sync_error = |source| BenchError::Io { what: "#SYNC on ingest", source };
        stream.write_all(format!("#SYNC {token}\n").as_bytes()).map_err(sync_error)?;
        stream.set_read_timeout(Some(SYNC_TIMEOUT)).map_err(sync_error)?;
        let mut reader = BufReader::new(&*stream);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let count = reader.read_until(b'\n', &mut line).map_err(sync_error)?;
            if count == 0 {
                return Err(BenchError::SyncClosed { connection: self.index });
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if text.starts_with("OK ") && text.ends_with(&format!(" SYNC {token}")) {
                outcome.sync_ok_ns = self.shared.clock.now_ns();
                return Ok(());
            }
            if text.starts_with("ERR ") {
                outcome.error_line_count += 1;
                outcome.first_error_line.get_or_insert_with(|| text.to_owned());
            }
        }
    }
}

/// Lets `nanosleep` wake this thread within `slack_ns` of the asked time
/// (Linux defaults to 50 µs, which would blur the open-loop schedule).
fn set_timer_slack_ns(slack_ns: u64) {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and only affects
    // the calling thread; failure just leaves the default slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, slack_ns as libc::c_ulong, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::keys::KeyDistribution;
    use crate::bench::stamp::decode_stamp;
    use crate::protocol::{Line, parse_line};

    const TAG: RunTag = RunTag::from_seed(7);

    fn uniform(key_count: u32) -> KeySampler {
        KeySampler::new(KeyDistribution::Uniform, key_count).unwrap()
    }

    fn scheduled(start_ns: u64) -> Stamps {
        Stamps::Scheduled { schedule: Schedule { start_ns, phase_ns: 0.0, interval_ns: 1.0 }, first_event_index: 0 }
    }

    /// Built lines are valid protocol lines: the drawn key, then the stamp,
    /// then padding to exactly the payload size.
    #[test]
    fn built_lines_parse_back() {
        let sampler = uniform(1000);
        let layout = LineLayout::new(sampler.key_width(), 40, TAG);
        let mut buffer = WriteBuffer::new(layout, 4096);
        assert_eq!(buffer.line_capacity(), 4096 / layout.line_bytes());
        let expected_keys = [5u32, 999, 0, 42, 5, 999];
        let draws: Vec<u64> = expected_keys[..4].iter().map(|&index| sampler.line_head(index)).collect();
        let mut draw_index = 0;
        let bytes = buffer.fill(6, &draws, &mut draw_index, &[], scheduled(1000)).to_vec();
        assert_eq!(draw_index, 6);
        assert_eq!(bytes.len(), 6 * layout.line_bytes());
        for (line_index, line) in bytes.split(|&byte| byte == b'\n').take(6).enumerate() {
            let Ok(Line::Event { key, payload }) = parse_line(line, 1 << 20) else { panic!("{line:?}") };
            assert_eq!(key, sampler.key(expected_keys[line_index]));
            assert_eq!(payload.len(), 40);
            assert_eq!(decode_stamp(payload), Some(1000 + line_index as u64));
            assert_eq!(&payload[STAMP_WIDTH..STAMP_WIDTH + RUN_TAG_WIDTH], TAG.bytes());
            assert!(payload[STAMP_WIDTH + RUN_TAG_WIDTH..].iter().all(|&byte| byte == PADDING));
        }
        let bytes = buffer.fill(2, &draws, &mut draw_index, &[], Stamps::One(77)).to_vec();
        let (key, payload) = bytes.split_at(sampler.key_width() + 1);
        assert_eq!(key, b"k000 ");
        assert_eq!(decode_stamp(payload), Some(77));
    }

    /// Keys of every width, with and without stamps, and lines shorter than
    /// a line head, come out right.
    #[test]
    fn every_key_width_and_short_lines() {
        for key_count in [1, 10, 100, 10_000, 10_000_000] {
            let sampler = uniform(key_count);
            for payload_bytes in [0, 1, 5, 15, 16, 17, 64] {
                let layout = LineLayout::new(sampler.key_width(), payload_bytes, TAG);
                let mut buffer = WriteBuffer::new(layout, 4096);
                let draws = [sampler.line_head(key_count - 1), sampler.line_head(0)];
                let bytes = buffer.fill(3, &draws, &mut 0, &[], Stamps::One(u64::MAX)).to_vec();
                assert_eq!(bytes.len(), 3 * layout.line_bytes());
                for (line_index, line) in bytes.split(|&byte| byte == b'\n').take(3).enumerate() {
                    let expected_key = sampler.key(if line_index == 1 { 0 } else { key_count - 1 });
                    let (key, payload) = line.split_at(sampler.key_width());
                    assert_eq!(key, expected_key, "{key_count} keys, {payload_bytes} B");
                    assert_eq!(payload[0], b' ');
                    let payload = &payload[1..];
                    assert_eq!(payload.len(), payload_bytes);
                    let mut padding_start = 0;
                    if layout.stamped {
                        assert_eq!(&payload[..STAMP_WIDTH], b"ffffffffffffffff");
                        let tag = &payload[STAMP_WIDTH..STAMP_WIDTH + layout.tag_bytes()];
                        assert_eq!(tag, &TAG.bytes()[..layout.tag_bytes()]);
                        padding_start = STAMP_WIDTH + layout.tag_bytes();
                    }
                    let padding = &payload[padding_start..];
                    assert!(padding.iter().all(|&byte| byte == PADDING), "{key_count} keys, {payload_bytes} B");
                }
            }
        }
    }

    /// Hot draws land in the hot set that is current when the chunk is built.
    #[test]
    fn hot_draws_follow_the_hot_set() {
        let distribution = KeyDistribution::Hotspot { hot_key_count: 4, hot_share: 1.0, shift_every_ns: 1_000_000 };
        let sampler = KeySampler::new(distribution, 100).unwrap();
        let draws = sampler.draws(8, 1);
        let mut hot_heads = Vec::new();
        sampler.hot_heads(sampler.hot_base(3_000_000), &mut hot_heads);
        let mut buffer = WriteBuffer::new(LineLayout::new(sampler.key_width(), 16, TAG), 4096);
        let bytes = buffer.fill(8, &draws, &mut 0, &hot_heads, Stamps::One(0)).to_vec();
        for line in bytes.split(|&byte| byte == b'\n').take(8) {
            let index: u32 = std::str::from_utf8(&line[1..3]).unwrap().parse().unwrap();
            assert!((12..16).contains(&index), "{index}");
        }
    }

    /// The schedule is even, phased, and counts what is due.
    #[test]
    fn schedule_counts_due_events() {
        let schedule = Schedule { start_ns: 1_000, phase_ns: 50.0, interval_ns: 100.0 };
        assert_eq!(schedule.intended_ns(0), 1_050);
        assert_eq!(schedule.intended_ns(3), 1_350);
        assert_eq!(schedule.due_count(1_049), 0);
        assert_eq!(schedule.due_count(1_050), 1);
        assert_eq!(schedule.due_count(1_349), 3);
        assert_eq!(schedule.due_count(1_350), 4);
    }

    /// Scratch: fill speed (run with --ignored --nocapture).
    #[test]
    #[ignore]
    fn fill_speed() {
        let sampler = uniform(100_000);
        let draws = sampler.draws(1 << 20, 1);
        let mut buffer = WriteBuffer::new(LineLayout::new(sampler.key_width(), 64, TAG), 256 * 1024);
        let lines = buffer.line_capacity();
        let mut draw_index = 0;
        let rounds = 3000;
        for (name, one) in [("scheduled", false), ("one stamp", true)] {
            let started = std::time::Instant::now();
            let mut sum = 0u64;
            for round in 0..rounds {
                let stamps = if one { Stamps::One(round) } else { scheduled(round) };
                sum += u64::from(buffer.fill(lines, &draws, &mut draw_index, &[], stamps)[17]);
            }
            let ns = started.elapsed().as_nanos() as f64 / (rounds as usize * lines) as f64;
            eprintln!("{name}: {ns:.2} ns/event ({sum})");
        }
    }
}
