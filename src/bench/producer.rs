//! Producer connections: each builds lines into a reusable buffer and writes
//! them in big chunks, closed loop (as fast as TCP takes them, a thread per
//! connection) or open loop (on a schedule, connections paced together by
//! [`run_group`]), then sends `#SYNC` and waits for the `OK`. Against NATS
//! (`--target nats`) the lines are `PUB` frames and the sync is `PING`/`PONG`
//! (see [`crate::bench::nats`]); everything else is the same code.
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
//!
//! Where the CPU goes (perf, this 2-vCPU VM): closed loop costs about 25 ns
//! per 72-byte line, a quarter of it building lines and the rest the kernel
//! copying them into the socket. Open loop at a few M events/s costs far more
//! per event, almost all of it per write in the kernel: the send, the
//! loopback receive path that runs in the sender's context (waking the
//! server), and the pacer's sleep and wake-up. Hence one pacer thread by
//! default and a tick that batches a write's worth of events.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use crate::bench::BenchError;
use crate::bench::args::Target;
use crate::bench::kafka::{KafkaOptions, KafkaProducer};
use crate::bench::keys::{HEAD_PADDING, KEY_WIDTH_MAX, KeySampler, draw_ring_len, resolve_head};
use crate::bench::nats;
use crate::bench::stamp::{BenchClock, RUN_TAG_WIDTH, RunTag, STAMP_WIDTH, encode_stamp};

/// How long a connection waits for its `OK ... SYNC` once everything is sent.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one write may block (the server reads nothing at all) before the
/// run fails instead of hanging: far above any credit stall of a live server.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Byte that pads a payload after its stamp.
const PADDING: u8 = HEAD_PADDING;

/// The shape of every line of a run: spate's `KEY SP PAYLOAD LF`, or NATS's
/// `PUB bench.events <n> CRLF PAYLOAD CRLF` (no key: one subject).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineLayout {
    pub target: Target,
    pub key_width: usize,
    pub payload_bytes: usize,
    /// The payload starts with a send-time stamp and the run's tag
    /// (payloads of at least [`STAMP_WIDTH`] bytes).
    pub stamped: bool,
    pub tag: RunTag,
}

impl LineLayout {
    pub fn new(target: Target, key_width: usize, payload_bytes: usize, tag: RunTag) -> LineLayout {
        LineLayout { target, key_width, payload_bytes, stamped: payload_bytes >= STAMP_WIDTH, tag }
    }

    /// Bytes of the tag that fit after the stamp.
    pub fn tag_bytes(&self) -> usize {
        if self.stamped { (self.payload_bytes - STAMP_WIDTH).min(RUN_TAG_WIDTH) } else { 0 }
    }

    /// Bytes of one line on the wire, LF (or the frame's CRLFs) included.
    pub fn line_bytes(&self) -> usize {
        self.head_bytes() + self.payload_bytes + self.tail().len()
    }

    /// Length of [`Self::head`], without building it.
    fn head_bytes(&self) -> usize {
        match self.target {
            Target::Spate | Target::Kafka => self.key_width + 1,
            Target::Nats => nats::pub_head_bytes(self.payload_bytes),
        }
    }

    /// Bytes before the payload: the key and a space (spate's key bytes are
    /// patched per line), or the `PUB` line.
    fn head(&self) -> Vec<u8> {
        match self.target {
            Target::Spate | Target::Kafka => [vec![b'k'; self.key_width], vec![b' ']].concat(),
            Target::Nats => nats::pub_head(self.payload_bytes).into_bytes(),
        }
    }

    fn tail(&self) -> &'static [u8] {
        match self.target {
            Target::Spate | Target::Kafka => b"\n",
            Target::Nats => b"\r\n",
        }
    }

    fn stamp_offset(&self) -> usize {
        self.head_bytes()
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
        let mut line = layout.head();
        line.resize(line_bytes - layout.tail().len(), PADDING);
        line.extend_from_slice(layout.tail());
        if layout.stamped {
            let tag_offset = layout.stamp_offset() + STAMP_WIDTH;
            let tag_bytes = layout.tag_bytes();
            line[tag_offset..tag_offset + tag_bytes].copy_from_slice(&layout.tag.bytes()[..tag_bytes]);
        }
        debug_assert_eq!(line.len(), line_bytes);
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
        // overwrites whatever padding it covered. NATS frames have no key.
        let keyed = layout.target != Target::Nats;
        let whole_head = line_bytes > KEY_WIDTH_MAX;
        let mask = draws.len() - 1;
        let used = line_count * line_bytes;
        for (line_index, line) in self.bytes[..used].chunks_exact_mut(line_bytes).enumerate() {
            if keyed {
                let head = resolve_head(draws[*draw_index & mask], hot_heads).to_le_bytes();
                *draw_index = draw_index.wrapping_add(1);
                if whole_head {
                    line[..KEY_WIDTH_MAX].copy_from_slice(&head);
                } else {
                    line[..key_width].copy_from_slice(&head[..key_width]);
                }
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
    /// Producers meet the main thread here once connected and with their
    /// keys drawn; only then does the main thread read the clock for
    /// `start_ns`, so the schedule does not start in the past (drawing the
    /// key rings takes tens of ms, and a schedule that started before it
    /// would begin with a burst of events stamped as if sent on time).
    pub ready_barrier: Barrier,
    /// Then here, after `start_ns` is set; then everyone reads it.
    pub start_barrier: Barrier,
    pub start_ns: AtomicU64,
    /// Set by anyone that failed, so the others stop early.
    pub abort: AtomicBool,
    pub events_sent: AtomicU64,
    pub line_bytes_sent: AtomicU64,
}

impl Shared {
    /// Shared state for `producer_thread_count` producer threads; the
    /// barriers also wait for the main thread.
    pub fn new(clock: BenchClock, producer_thread_count: usize) -> Shared {
        Shared {
            clock,
            ready_barrier: Barrier::new(producer_thread_count + 1),
            start_barrier: Barrier::new(producer_thread_count + 1),
            start_ns: AtomicU64::new(0),
            abort: AtomicBool::new(false),
            events_sent: AtomicU64::new(0),
            line_bytes_sent: AtomicU64::new(0),
        }
    }
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
    pub layout: LineLayout,
    pub write_bytes: usize,
    pub sampler: KeySampler,
    pub seed: u64,
    pub shared: Arc<Shared>,
    /// `--target kafka`: the topic, acks and requests in flight.
    pub kafka: Option<KafkaOptions>,
    /// `--stream`: named on the connection before the run (`None`: `default`).
    pub stream: Option<String>,
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

/// Runs `tasks` on the calling thread: one connection in closed loop, or any
/// number paced together in open loop (one wake-up per tick serves them all;
/// on a VM a wake-up costs about as much as the write itself). Connects and
/// draws keys, meets the other threads at the ready and start barriers,
/// sends, and syncs. The barriers are always reached, even on failure, so
/// one bad connection cannot hang the rest.
pub fn run_group(
    tasks: Vec<ProducerTask>,
    shared: Arc<Shared>,
    tick: Duration,
) -> Result<Vec<ProducerOutcome>, BenchError> {
    let open_loop = tasks.iter().any(|task| task.rate.is_some());
    assert!(open_loop || tasks.len() == 1, "closed-loop connections run one per thread");
    if open_loop {
        set_timer_slack_ns(1000);
    }
    let prepared: Result<Vec<Connection>, BenchError> = tasks.into_iter().map(Connection::prepare).collect();
    if prepared.is_err() {
        shared.abort.store(true, Ordering::SeqCst);
    }
    shared.ready_barrier.wait();
    shared.start_barrier.wait();
    let mut connections = prepared?;
    if shared.abort.load(Ordering::SeqCst) {
        return Ok(Vec::new());
    }
    let start_ns = shared.start_ns.load(Ordering::SeqCst);
    let sent = if open_loop {
        connections.iter_mut().for_each(|connection| connection.start_schedule(start_ns));
        pace(&mut connections, &shared, tick)
    } else {
        connections.iter_mut().try_for_each(|connection| connection.send_closed_loop(start_ns))
    };
    sent.inspect_err(|_| shared.abort.store(true, Ordering::SeqCst))?;
    // Every connection's #SYNC goes out before any OK is awaited, so the
    // group's connections are acknowledged in parallel.
    connections.iter_mut().try_for_each(Connection::send_sync)?;
    connections.iter_mut().try_for_each(Connection::await_sync)?;
    Ok(connections.into_iter().map(|connection| connection.outcome).collect())
}

/// Paces open-loop connections: each wake-up sends what every connection
/// has due, then sleeps until the next event is due, and at least one tick
/// after this wake-up, so events gather into one write per tick instead of
/// one per event. When the writes took longer than a tick (the server
/// pushed back), there is no sleep: what fell due meanwhile goes out at once,
/// stamped with when it should have gone.
fn pace(connections: &mut [Connection], shared: &Shared, tick: Duration) -> Result<(), BenchError> {
    let clock = shared.clock;
    let tick_ns = u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX);
    while !shared.abort.load(Ordering::Relaxed) {
        let woke_ns = clock.now_ns();
        let mut next_ns = u64::MAX;
        for connection in connections.iter_mut() {
            connection.send_due(woke_ns)?;
            next_ns = next_ns.min(connection.next_intended_ns());
        }
        if next_ns == u64::MAX {
            return Ok(());
        }
        let wake_ns = next_ns.max(woke_ns.saturating_add(tick_ns));
        let now_ns = clock.now_ns();
        if wake_ns > now_ns {
            std::thread::sleep(Duration::from_nanos(wake_ns - now_ns));
        }
    }
    Ok(())
}

/// One connection during the run.
struct Connection {
    task: ProducerTask,
    stream: TcpStream,
    draws: Vec<u64>,
    draw_index: usize,
    buffer: WriteBuffer,
    /// Line heads of the current hot set (hotspot), and where it starts.
    hot_heads: Vec<u64>,
    hot_base: u32,
    /// Open loop: the schedule, events to send in all, events sent.
    schedule: Schedule,
    quota: u64,
    sent: u64,
    outcome: ProducerOutcome,
    /// `--target kafka`: the connection's Produce state.
    kafka: Option<KafkaProducer>,
}

impl Connection {
    fn prepare(task: ProducerTask) -> Result<Connection, BenchError> {
        let mut kafka = None;
        let stream = match task.layout.target {
            Target::Spate => TcpStream::connect(&task.ingest).map_err(|source| BenchError::Connect {
                what: "ingest",
                addr: task.ingest.clone(),
                source,
            })?,
            // CONNECT, PING, PONG: the server has accepted the connection
            // before the run starts, as spate's has once it is connected.
            Target::Nats => nats::connect(&task.ingest, "NATS publisher", b"")?.0,
            // Metadata first: the topic's partitions, before the run starts.
            Target::Kafka => {
                let options = task.kafka.clone().ok_or_else(|| BenchError::Kafka { detail: "no options".into() })?;
                let layout = task.layout;
                let (stream, producer) =
                    KafkaProducer::connect(&task.ingest, options, layout.key_width, layout.payload_bytes)?;
                kafka = Some(producer);
                stream
            }
        };
        // Open-loop writes can be small; they must not wait for Nagle.
        stream.set_nodelay(true).map_err(|source| BenchError::Io { what: "set TCP_NODELAY", source })?;
        stream
            .set_write_timeout(Some(WRITE_STALL_TIMEOUT))
            .map_err(|source| BenchError::Io { what: "set write timeout", source })?;
        if let Some(name) = &task.stream {
            (&stream)
                .write_all(format!("#STREAM {name}\n").as_bytes())
                .map_err(|source| BenchError::Io { what: "send #STREAM", source })?;
        }
        let draws = task.sampler.draws(draw_ring_len(task.connection_count), task.seed);
        let buffer = WriteBuffer::new(task.layout, task.write_bytes);
        let mut hot_heads = Vec::new();
        task.sampler.hot_heads(0, &mut hot_heads);
        Ok(Connection {
            task,
            stream,
            draws,
            draw_index: 0,
            buffer,
            hot_heads,
            hot_base: 0,
            schedule: Schedule { start_ns: 0, phase_ns: 0.0, interval_ns: 1.0 },
            quota: 0,
            sent: 0,
            outcome: ProducerOutcome::default(),
            kafka,
        })
    }

    /// Keeps `hot_heads` on the hot set of `now_ns`.
    fn follow_hot_set(&mut self, now_ns: u64) {
        let start_ns = self.task.shared.start_ns.load(Ordering::Relaxed);
        let hot_base = self.task.sampler.hot_base(now_ns.saturating_sub(start_ns));
        if hot_base != self.hot_base {
            self.hot_base = hot_base;
            self.task.sampler.hot_heads(hot_base, &mut self.hot_heads);
        }
    }

    fn deadline_ns(&self) -> u64 {
        self.task.duration.map_or(u64::MAX, |duration| u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX))
    }

    fn send_closed_loop(&mut self, start_ns: u64) -> Result<(), BenchError> {
        let clock = self.task.shared.clock;
        let mut remaining = self.task.quota.unwrap_or(u64::MAX);
        let deadline_ns = self.deadline_ns();
        self.outcome.first_write_ns = clock.now_ns();
        while remaining > 0 && !self.task.shared.abort.load(Ordering::Relaxed) {
            let now_ns = clock.now_ns();
            if now_ns.saturating_sub(start_ns) >= deadline_ns {
                break;
            }
            let line_count = remaining.min(self.buffer.line_capacity() as u64) as usize;
            self.follow_hot_set(now_ns);
            self.write_lines(line_count, Stamps::One(now_ns))?;
            remaining -= line_count as u64;
        }
        Ok(())
    }

    fn start_schedule(&mut self, start_ns: u64) {
        let task = &self.task;
        let rate = task.rate.expect("open loop has a rate");
        let interval_ns = 1e9 / rate;
        let phase_ns = interval_ns * task.index as f64 / task.connection_count as f64;
        self.schedule = Schedule { start_ns, phase_ns, interval_ns };
        self.quota = match (task.quota, task.duration) {
            (Some(quota), _) => quota,
            (None, Some(duration)) => (duration.as_secs_f64() * rate).round() as u64,
            (None, None) => u64::MAX,
        };
    }

    /// Sends every event due at `now_ns`, in buffer-sized writes.
    fn send_due(&mut self, now_ns: u64) -> Result<(), BenchError> {
        let due = self.schedule.due_count(now_ns).min(self.quota);
        if self.sent == 0 && due > 0 {
            self.outcome.first_write_ns = now_ns;
        }
        self.follow_hot_set(now_ns);
        while self.sent < due {
            let line_count = (due - self.sent).min(self.buffer.line_capacity() as u64) as usize;
            self.write_lines(line_count, Stamps::Scheduled { schedule: self.schedule, first_event_index: self.sent })?;
            self.sent += line_count as u64;
        }
        Ok(())
    }

    /// When the next event is due (`u64::MAX` when all are sent).
    fn next_intended_ns(&self) -> u64 {
        if self.sent < self.quota { self.schedule.intended_ns(self.sent) } else { u64::MAX }
    }

    fn write_lines(&mut self, line_count: usize, stamps: Stamps) -> Result<(), BenchError> {
        let bytes = self.buffer.fill(line_count, &self.draws, &mut self.draw_index, &self.hot_heads, stamps);
        let written = match &mut self.kafka {
            Some(kafka) => kafka.produce(&mut self.stream, bytes, unix_ms()),
            None => self.stream.write_all(bytes).map_err(|source| BenchError::Io { what: "write to ingest", source }),
        };
        written.map_err(|error| match error {
            BenchError::Io { source, .. }
                if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
            {
                BenchError::ServerStalled { connection: self.task.index, waited_s: WRITE_STALL_TIMEOUT.as_secs() }
            }
            error => error,
        })?;
        let (event_count, byte_count) = (line_count as u64, bytes.len() as u64);
        let outcome = &mut self.outcome;
        outcome.events_sent += event_count;
        outcome.write_count += 1;
        outcome.line_bytes_sent += byte_count;
        self.task.shared.events_sent.fetch_add(event_count, Ordering::Relaxed);
        self.task.shared.line_bytes_sent.fetch_add(byte_count, Ordering::Relaxed);
        Ok(())
    }

    fn token(&self) -> String {
        format!("bench-{}", self.task.index)
    }

    fn send_sync(&mut self) -> Result<(), BenchError> {
        let line = match self.task.layout.target {
            Target::Spate => format!("#SYNC {}\n", self.token()),
            Target::Nats => "PING\r\n".to_string(),
            // The responses to the requests in flight are the sync.
            Target::Kafka => return Ok(()),
        };
        self.stream.write_all(line.as_bytes()).map_err(|source| BenchError::Io { what: "#SYNC on ingest", source })
    }

    /// Reads replies until the `OK` to this connection's `#SYNC` (NATS: the
    /// `PONG` to its `PING`, which NATS sends once every `PUB` before it
    /// was processed).
    fn await_sync(&mut self) -> Result<(), BenchError> {
        if let Some(kafka) = &mut self.kafka {
            kafka.finish(&mut self.stream)?;
            self.outcome.error_line_count += kafka.error_count;
            self.outcome.first_error_line = kafka.first_error.clone();
            self.outcome.sync_ok_ns = self.task.shared.clock.now_ns();
            return Ok(());
        }
        if self.task.layout.target == Target::Nats {
            let error_count = nats::read_control_until_pong(&mut self.stream, SYNC_TIMEOUT, |line| {
                if line.starts_with("-ERR") {
                    self.outcome.first_error_line.get_or_insert_with(|| line.to_owned());
                }
            })?;
            self.outcome.error_line_count += error_count as u64;
            self.outcome.sync_ok_ns = self.task.shared.clock.now_ns();
            return Ok(());
        }
        let sync_error = |source| BenchError::Io { what: "#SYNC on ingest", source };
        let ok_suffix = format!(" SYNC {}", self.token());
        self.stream.set_read_timeout(Some(SYNC_TIMEOUT)).map_err(sync_error)?;
        let mut reader = BufReader::new(&self.stream);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            let count = reader.read_until(b'\n', &mut line).map_err(sync_error)?;
            if count == 0 {
                return Err(BenchError::SyncClosed { connection: self.task.index });
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end();
            if text.starts_with("OK ") && text.ends_with(&ok_suffix) {
                self.outcome.sync_ok_ns = self.task.shared.clock.now_ns();
                return Ok(());
            }
            if text.starts_with("ERR ") {
                self.outcome.error_line_count += 1;
                self.outcome.first_error_line.get_or_insert_with(|| text.to_owned());
            }
        }
    }
}

/// Milliseconds since the Unix epoch: the records' creation time.
fn unix_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
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
        let layout = LineLayout::new(Target::Spate, sampler.key_width(), 40, TAG);
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
                let layout = LineLayout::new(Target::Spate, sampler.key_width(), payload_bytes, TAG);
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

    /// NATS frames are `PUB` lines with the stamped payload, and no key.
    #[test]
    fn nats_frames_carry_the_stamped_payload() {
        let sampler = uniform(100);
        let layout = LineLayout::new(Target::Nats, sampler.key_width(), 32, TAG);
        let mut buffer = WriteBuffer::new(layout, 4096);
        let draws = [sampler.line_head(1), sampler.line_head(2)];
        let mut draw_index = 0;
        let bytes = buffer.fill(2, &draws, &mut draw_index, &[], scheduled(500)).to_vec();
        assert_eq!(draw_index, 0, "no key is drawn");
        assert_eq!(layout.line_bytes(), "PUB bench.events 32\r\n".len() + 32 + 2);
        for (line_index, frame) in bytes.chunks(layout.line_bytes()).enumerate() {
            let (head, rest) = frame.split_at("PUB bench.events 32\r\n".len());
            assert_eq!(head, b"PUB bench.events 32\r\n");
            let (payload, tail) = rest.split_at(32);
            assert_eq!(tail, b"\r\n");
            assert_eq!(decode_stamp(payload), Some(500 + line_index as u64));
            assert_eq!(&payload[STAMP_WIDTH..STAMP_WIDTH + RUN_TAG_WIDTH], TAG.bytes());
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
        let mut buffer = WriteBuffer::new(LineLayout::new(Target::Spate, sampler.key_width(), 16, TAG), 4096);
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
}
