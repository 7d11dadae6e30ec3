//! The ingest face: TCP connections carrying events in one of three
//! formats, one listener each ([`Format`]): `KEY PAYLOAD` lines
//! ([`crate::protocol::line`], `--ingest`), JSON lines
//! ([`crate::protocol::json`], `--ingest-json`: the key from `--json-key`,
//! the line as the payload) and the InfluxDB line protocol
//! ([`crate::protocol::ilp`], `--ingest-ilp`: the series as the key, the line
//! as the payload). Everything below is the same for all three: control
//! lines (`#SYNC`, `#PING`, `#STREAM`), `ERR` replies, credits, limits and
//! timeouts; each format's events go through [`crate::shard::ingress::route`].
//! Keys longer than `--key-size-max` are rejected in every format.
//!
//! ILP clients do not read replies. On an ILP connection a batch of replies
//! is written only if the socket's send buffer has room for all of it, and
//! is otherwise dropped and counted (`spate_replies_dropped_total`): a
//! client that never reads cannot stall its own ingest, and no reply line is
//! ever torn. The other formats' replies are written in full (a producer
//! that never reads them is pushed back, like one that never drains).
//!
//! Every shard accepts on the ingest port (the kernel spreads connections
//! with `SO_REUSEPORT`). A connection task reads large chunks into its
//! [`LineBuffer`], splits them with `memchr`, and routes each event to the open
//! batch of its partition's owner. When an owner has no credits left, the task
//! stops parsing *and stops reading its socket* until credits return: the
//! kernel's receive buffer fills, the TCP window closes, and the producer is
//! pushed back. Connections whose events go to other owners keep flowing.
//!
//! Replies on the ingest connection (the producer may ignore them):
//! * `ERR <line-number> <reason>: <detail>` for a rejected line; the
//!   connection stays open and later lines are processed.
//! * `OK <line-number> SYNC [token]` for a `#SYNC [token]` control line, sent
//!   once every event sent before it on this shard has been applied by its
//!   owner (stored as the `--fsync` policy promises and visible to
//!   subscribers).
//! * `OK <line-number> PING [token]` for `#PING [token]`; a token over
//!   [`crate::config::CONTROL_TOKEN_SIZE_MAX`] bytes gets `ERR ... token_too_long`.
//! * `ERR <line-number> idle_timeout|line_timeout|shed: ...` just before the
//!   server closes a connection that sent no line within --idle-timeout-ms,
//!   held a line incomplete for --line-timeout-ms, or was shed because the
//!   process ran out of file descriptors.
//!
//! Replies come in line order. A `#SYNC` does not stop its connection: the
//! connection keeps reading, routing and answering while up to
//! [`crate::config::SYNCS_IN_FLIGHT_MAX`] SYNCs wait, and only the writing
//! of replies waits: an `ERR` or `OK PING` for a line after a pending SYNC
//! is sent after that SYNC's `OK` ([`replies`]). With that many in flight
//! the connection stops reading until the oldest is answered
//! (backpressure). A connection that ends (EOF, shutdown) answers the
//! SYNCs it read before it closes.
//!
//! Connections are counted against a process-wide limit (shards *
//! --connections-per-shard-max, [`crate::net::admission`]); past it a new
//! one gets `ERR 0 connection_limit: ...` and is closed. Accepted sockets
//! have TCP keepalive on. The reply buffer is bounded
//! ([`crate::config::REPLY_BUFFER_BYTES_MAX`]) and given back after a burst; an idle
//! connection's grown read buffer is given back after a second.
//!
//! A connection that closes in the middle of a line loses only that partial
//! line (counted as `unterminated`): a torn line is more likely a crashed
//! producer than a complete event. On shutdown, what a connection has read
//! is processed; bytes still in the kernel's buffer are not read.

use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::time::Instant;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

mod replies;

use crate::config::FLUSH_SOON_READ_BYTES_MAX;
use crate::net::accept::Acceptor;
use crate::net::socket::{adopt_handed_over, duplicate_for_handover, send_space, tune_accepted, write_goodbye};
use crate::net::{CloseReason, Connection, Face, ShardNet};
use crate::protocol::control::{UnknownControl, write_err, write_ok};
use crate::protocol::ilp::{IlpError, IlpLine, IlpScratch, parse_ilp_line};
use crate::protocol::json::{JsonError, JsonLine, parse_json_line_with};
use crate::protocol::{Control, Line, LineBuffer, LineError, Next, parse_control, parse_line_with};
use crate::routing::Blocked;
use crate::runtime::notify::{Either, first};
use crate::shard::Shard;
use crate::shard::ingress::Route;
use crate::shard::metrics::ShardMetrics;
use crate::stream::{DEFAULT_STREAM, STREAM_NAME_SIZE_MAX, StreamRoute};
use replies::Replies;

/// The format a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `KEY PAYLOAD` lines (`--ingest`).
    Lines,
    /// JSON lines (`--ingest-json`).
    Json,
    /// InfluxDB line protocol (`--ingest-ilp`).
    Ilp,
}

impl Format {
    fn name(self) -> &'static str {
        match self {
            Format::Lines => "ingest",
            Format::Json => "ingest-json",
            Format::Ilp => "ingest-ilp",
        }
    }

    /// The stream a new connection of this format starts on.
    fn start_stream(self, config: &crate::config::Config) -> &[u8] {
        match self {
            Format::Lines => DEFAULT_STREAM.as_bytes(),
            Format::Json => config.json_stream.as_bytes(),
            Format::Ilp => config.ilp_stream.as_bytes(),
        }
    }
}

/// A connection's format and the buffers its parser reuses (they grow to
/// the longest key or series seen, then parsing allocates nothing).
struct Parser {
    format: Format,
    json_scratch: Vec<u8>,
    ilp_scratch: IlpScratch,
    /// JSON: the top-level member the stream's aggregates read (empty:
    /// none), looked up once per chunk of lines: [`Parser::parse`] gives
    /// where an event's value of it starts
    /// ([`crate::protocol::record::RecordRef::value_at`]).
    value_member: Vec<u8>,
}

/// Why a line was rejected, in any format.
enum Rejection {
    Line(LineError),
    Json(JsonError),
    Ilp(IlpError),
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Line(error) => error.fmt(f),
            Rejection::Json(error) => error.fmt(f),
            Rejection::Ilp(error) => error.fmt(f),
        }
    }
}

impl Parser {
    fn new(format: Format) -> Parser {
        Parser { format, json_scratch: Vec::new(), ilp_scratch: IlpScratch::default(), value_member: Vec::new() }
    }

    /// Parses one line into the line format's terms: an event (key and
    /// payload), a control line or an empty line; with the event's value
    /// hint (0 but for JSON).
    #[inline]
    fn parse<'a>(&'a mut self, line: &'a [u8], config: &crate::config::Config) -> Result<(Line<'a>, u16), Rejection> {
        // A long key or series may have grown a scratch buffer for one line:
        // give it back rather than keep it for the connection's life.
        let scratch_max = config.parser_scratch_bytes_max();
        let mut value_at = 0;
        let parsed = match self.format {
            Format::Lines => {
                return parse_line_with(line, config.line_size_max, config.key_size_max)
                    .map(|line| (line, 0))
                    .map_err(Rejection::Line);
            }
            Format::Json => {
                if self.json_scratch.capacity() > scratch_max {
                    self.json_scratch = Vec::new();
                }
                match parse_json_line_with(line, &config.json_key, &self.value_member, &mut self.json_scratch) {
                    Ok((JsonLine::Event { key, payload }, at)) => {
                        value_at = at;
                        Line::Event { key, payload }
                    }
                    Ok((JsonLine::Control(text), _)) => Line::Control(text),
                    Ok((JsonLine::Empty, _)) => Line::Empty,
                    Err(error) => return Err(Rejection::Json(error)),
                }
            }
            Format::Ilp => {
                if self.ilp_scratch.capacity_bytes() > scratch_max {
                    self.ilp_scratch = IlpScratch::default();
                }
                match parse_ilp_line(line, &mut self.ilp_scratch) {
                    Ok(IlpLine::Point(point)) => Line::Event { key: point.series_key(), payload: point.payload() },
                    Ok(IlpLine::Control(text)) => Line::Control(text),
                    Ok(IlpLine::Empty) => Line::Empty,
                    Err(error) => return Err(Rejection::Ilp(error)),
                }
            }
        };
        match parsed {
            Line::Event { key, .. } if key.len() > config.key_size_max => {
                Err(Rejection::Line(LineError::KeyTooLong { key_size: key.len(), key_size_max: config.key_size_max }))
            }
            parsed => Ok((parsed, value_at)),
        }
    }
}

/// Accepts connections of `format` until shutdown, within the process-wide
/// ingest connection limit (shared by all formats).
pub async fn accept_loop(shard: Rc<Shard>, net: Rc<ShardNet>, listener: TcpListener, format: Format) {
    let metrics = &shard.metrics();
    let mut acceptor = Acceptor::new(listener, format.name(), shard.id(), shard.lifecycle(), &net.connections, metrics);
    while let Some(stream) = acceptor.next().await {
        // Best effort: a socket without these options still works.
        let _ = tune_accepted(&stream);
        let Some(slot) = net.admission.ingest.try_acquire() else {
            ShardMetrics::add(&metrics.connections_refused, 1);
            let limit = net.admission.ingest.max();
            net.refusals
                .refuse(stream, format!("ERR 0 connection_limit: the server already has {limit} connections\n"));
            continue;
        };
        ShardMetrics::add(&metrics.connections_accepted, 1);
        let config = shard.config();
        let lines = LineBuffer::new(config.read_buffer_initial_bytes, config.read_buffer_bytes, config.line_size_max);
        let route = shard.route_for(format.start_stream(config));
        spawn_connection(&shard, &net, stream, Handover { fd: None, lines, format, route, slot, origin: None });
    }
}

/// A producer connection between shards: its socket, what it read and has
/// not parsed yet (a partial line), its format and stream, and its slot in
/// the process-wide connection limit. Everything a connection keeps across
/// reads, once its `#SYNC`s are answered and its events applied.
struct Handover {
    /// The socket, duplicated off the old shard's (none for a new one).
    fd: Option<OwnedFd>,
    lines: LineBuffer,
    format: Format,
    route: Option<StreamRoute>,
    slot: crate::net::admission::Slot,
    /// The shard that accepted it, while it is served elsewhere: it goes
    /// back there once the process spreads again, so the parsing of many
    /// connections does not stay on the shard that kept the partitions.
    origin: Option<u16>,
}

/// Serves a connection on this shard, new or adopted, and hands it over to
/// the shard that owns its partitions when the process gathers.
fn spawn_connection(shard: &Rc<Shard>, net: &Rc<ShardNet>, stream: TcpStream, handover: Handover) {
    shard.lifecycle().connection_opened();
    let connection = net.connections.register(Face::Ingest);
    let shard = shard.clone();
    glommio::spawn_local(async move {
        let Handover { lines, format, route, slot, origin, .. } = handover;
        let moving = run_connection(&shard, stream, lines, route, origin, &connection, format).await;
        drop(connection);
        shard.lifecycle().connection_closed();
        if let Some((to, fd, lines, route)) = moving {
            ShardMetrics::add(&shard.metrics().connections_handed_over, 1);
            // Back home it has no origin; elsewhere it remembers the first.
            let origin = if origin == Some(to) { None } else { origin.or(Some(shard.id())) };
            let handover = Handover { fd: Some(fd), lines, format, route, slot, origin };
            shard.hand_over_connection(to, Box::new(handover));
        }
    })
    .detach();
}

/// Serves `adoption` if it is a producer connection another shard handed
/// over ([`crate::shard::consolidation`]); gives it back otherwise.
pub fn adopt(
    shard: &Rc<Shard>,
    net: &Rc<ShardNet>,
    adoption: Box<dyn std::any::Any + Send>,
) -> Result<(), Box<dyn std::any::Any + Send>> {
    let mut handover = adoption.downcast::<Handover>()?;
    let Some(fd) = handover.fd.take() else { return Ok(()) };
    let stream = adopt_handed_over(fd);
    ShardMetrics::add(&shard.metrics().connections_adopted, 1);
    spawn_connection(shard, net, stream, *handover);
    Ok(())
}

/// Serves one connection until it ends or the server closes it (a timeout,
/// shedding, the shutdown deadline), telling the peer why when it can.
/// Returns what a move to another shard needs (the shard, the socket, the
/// buffer and the stream) when the connection is to move there.
async fn run_connection(
    shard: &Shard,
    mut stream: TcpStream,
    mut lines: LineBuffer,
    route: Option<StreamRoute>,
    origin: Option<u16>,
    connection: &Connection,
    format: Format,
) -> Option<(u16, OwnedFd, LineBuffer, Option<StreamRoute>)> {
    let config = &shard.config();
    let served = serve_connection(shard, &mut stream, &mut lines, (route, origin), connection, format);
    let reason = match first(served, connection.close_requested()).await {
        Either::Left(Ok(Served::Move { to, fd, route })) => return Some((to, fd, lines, route)),
        Either::Left(_) => return None,
        Either::Right(reason) => reason,
    };
    let metrics = &shard.metrics();
    let detail = match reason {
        CloseReason::IdleTimeout => {
            ShardMetrics::add(&metrics.connections_timed_out_idle, 1);
            format!("idle_timeout: no complete line within {} ms of connecting", config.idle_timeout_ms)
        }
        CloseReason::LineTimeout => {
            ShardMetrics::add(&metrics.connections_timed_out_line, 1);
            format!("line_timeout: line incomplete for {} ms", config.line_timeout_ms)
        }
        CloseReason::Shed => "shed: the server ran out of file descriptors and closed this idle connection".to_string(),
        // The deadline has passed: no time for last words. The other two are
        // the subscribe port's.
        CloseReason::ShutdownDeadline | CloseReason::RequestTimeout | CloseReason::ShedAtLimit => return None,
    };
    let mut message = Vec::new();
    write_err(&mut message, lines.next_line_number(), detail);
    write_goodbye(&mut stream, &message).await;
    None
}

/// How serving a connection on this shard ended, if not with an error.
enum Served {
    /// The peer or the server closed it.
    Closed,
    /// It moves to shard `to`: its events so far are applied and its
    /// `#SYNC`s answered; `fd` is its socket, duplicated.
    Move { to: u16, fd: OwnedFd, route: Option<StreamRoute> },
}

/// What parsing the buffered lines stopped on.
enum Progress {
    /// Every complete line is handled: read more.
    NeedMore,
    /// The next event's owner has no credits.
    Blocked(Blocked),
    /// The next line is a `#SYNC` and [`crate::config::SYNCS_IN_FLIGHT_MAX`]
    /// are in flight: wait for the oldest.
    SyncsFull,
    /// The reply buffer is full: write it out first.
    RepliesFull,
}

async fn serve_connection(
    shard: &Shard,
    stream: &mut TcpStream,
    lines: &mut LineBuffer,
    (route, origin): (Option<StreamRoute>, Option<u16>),
    connection: &Connection,
    format: Format,
) -> std::io::Result<Served> {
    let mut replies = Replies::new(usize::from(shard.shard_count()));
    let mut parser = Parser::new(format);
    let mut target = Target { stream: route, touched: vec![false; usize::from(shard.shard_count())] };
    let mut buffer_gauge = BufferGauge::new(shard, lines.capacity());
    // The last read left nothing waiting in the socket (see `read_more`).
    let mut drained = false;
    loop {
        let mut chunk = Chunk { lines, replies: &mut replies, target: &mut target, parser: &mut parser, drained };
        process_chunk(shard, stream, &mut chunk, format).await?;
        replies.answer_ready(shard.ingress());
        write_replies(shard, stream, &mut replies, format).await?;
        // Parsing may have given a long line's buffer back.
        buffer_gauge.set(lines.capacity());
        if shard.lifecycle().is_shutting_down() {
            return answer_pending(shard, stream, &mut replies, format).await.map(|()| Served::Closed);
        }
        if let Some(to) = shard.connection_move_target().or_else(|| shard.move_back_target(origin))
            && let Some(fd) = fence_for_move(shard, stream, &mut replies, format).await?
        {
            return Ok(Served::Move { to, fd, route: target.stream });
        }
        let count = match read_more(shard, stream, lines, &replies, connection).await {
            Read::Bytes { count, drained: read_drained } => {
                drained = read_drained;
                count?
            }
            Read::Shutdown => {
                return answer_pending(shard, stream, &mut replies, format).await.map(|()| Served::Closed);
            }
            Read::Trim => {
                lines.trim();
                replies.trim();
                buffer_gauge.set(lines.capacity());
                continue;
            }
            // Answered and written at the top of the loop.
            Read::SyncAnswerable => continue,
        };
        if count == 0 {
            answer_pending(shard, stream, &mut replies, format).await?;
            return finish_at_eof(shard, lines, stream).await.map(|()| Served::Closed);
        }
        lines.filled(count);
        buffer_gauge.set(lines.capacity());
        // A read that fills the buffer completes at once (glommio tries a
        // non-blocking recv first), so a busy socket would keep this task
        // running: let a control request or the preempt timer in.
        glommio::yield_if_needed().await;
    }
}

/// A connection's parsing state, as one chunk of buffered lines is handled.
struct Chunk<'a> {
    lines: &'a mut LineBuffer,
    replies: &'a mut Replies,
    target: &'a mut Target,
    parser: &'a mut Parser,
    /// The read that filled the buffer drained the socket.
    drained: bool,
}

/// Handles every complete buffered line, waiting where one cannot go on:
/// for credits or a held partition, for the oldest `#SYNC` when
/// [`crate::config::SYNCS_IN_FLIGHT_MAX`] are in flight, or to write the
/// replies when their buffer is full.
async fn process_chunk(
    shard: &Shard,
    stream: &mut TcpStream,
    chunk: &mut Chunk<'_>,
    format: Format,
) -> std::io::Result<()> {
    loop {
        let Chunk { lines, replies, target, parser, drained } = chunk;
        match process_buffered(shard, lines, replies, target, parser, *drained) {
            Progress::NeedMore => return Ok(()),
            Progress::Blocked(Blocked { held: Some(partition), .. }) => {
                shard.ingress().wait_for_release(partition).await;
            }
            Progress::Blocked(blocked) => {
                shard.ingress().wait_for_credits(blocked.owner, blocked.credit_bytes_needed).await;
            }
            Progress::SyncsFull | Progress::RepliesFull => {
                replies.answer_ready(shard.ingress());
                // Room comes only from the oldest SYNC's answer when every
                // SYNC slot is taken or every buffered reply is held behind it.
                if replies.syncs_full() || (replies.syncs_pending() > 0 && replies.writable().is_empty()) {
                    replies.oldest_answerable(shard.ingress()).await;
                    replies.answer_ready(shard.ingress());
                }
                write_replies(shard, stream, replies, format).await?;
            }
        }
    }
}

/// Waits for every pending `#SYNC` to be answerable and writes the replies:
/// a connection that ends (the producer's EOF, shutdown) still answers what
/// it read. Bounded by the shutdown deadline, which closes the connection.
async fn answer_pending(
    shard: &Shard,
    stream: &mut TcpStream,
    replies: &mut Replies,
    format: Format,
) -> std::io::Result<()> {
    while replies.syncs_pending() > 0 {
        replies.oldest_answerable(shard.ingress()).await;
        replies.answer_ready(shard.ingress());
        write_replies(shard, stream, replies, format).await?;
    }
    Ok(())
}

/// The fence before a connection moves to another shard, which keeps its
/// order: its pending `#SYNC`s are answered and every reply written, then
/// every event this shard accepted is applied by its owner (a grant for each
/// batch returned), so the events the new shard routes for it land behind
/// them. Returns a duplicate of the socket (the original closes with the
/// task), or `None` to stay (no descriptor left to duplicate into).
async fn fence_for_move(
    shard: &Shard,
    stream: &mut TcpStream,
    replies: &mut Replies,
    format: Format,
) -> std::io::Result<Option<OwnedFd>> {
    answer_pending(shard, stream, replies, format).await?;
    write_replies(shard, stream, replies, format).await?;
    shard.ingress().sync_barrier(0..shard.shard_count()).await;
    Ok(duplicate_for_handover(stream))
}

/// What waiting for the socket ended with.
enum Read {
    /// `drained`: a small read (at most [`FLUSH_SOON_READ_BYTES_MAX`]) that
    /// returned less than the buffer had room for: the socket had nothing
    /// more waiting and the producer trickles.
    Bytes {
        count: std::io::Result<usize>,
        drained: bool,
    },
    Shutdown,
    /// The connection has been idle: give buffers back, then read again.
    Trim,
    /// The oldest pending `#SYNC` can be answered (nothing was read).
    SyncAnswerable,
}

/// Reads the next chunk, telling the registry what the connection waits
/// for meanwhile (its first line, the rest of a line, or nothing), unless
/// the oldest pending `#SYNC` becomes answerable first (a read is
/// cancel-safe in glommio: readiness is polled, the bytes are taken by a
/// plain `recv` only when the read completes).
async fn read_more(
    shard: &Shard,
    stream: &mut TcpStream,
    lines: &mut LineBuffer,
    replies: &Replies,
    connection: &Connection,
) -> Read {
    let now = Instant::now();
    if lines.next_line_number() > 1 {
        connection.greet();
    }
    connection.set_partial_line(lines.in_partial_line().then(|| lines.next_line_number()), now);
    let spare_memory = lines.capacity() > shard.config().read_buffer_initial_bytes || replies.capacity() > 0;
    connection.set_holds_spare_memory(spare_memory);
    connection.set_reading(Some(now));
    let stop = first(shard.lifecycle().shutdown_requested(), connection.trim_requested());
    let stop = first(stop, replies.oldest_answerable(shard.ingress()));
    let spare = lines.spare();
    let room = spare.len();
    let read = match first(stream.read(spare), stop).await {
        Either::Left(result) => {
            let drained = result.as_ref().is_ok_and(|&count| count < room && count <= FLUSH_SOON_READ_BYTES_MAX);
            Read::Bytes { count: result, drained }
        }
        Either::Right(Either::Left(Either::Left(()))) => Read::Shutdown,
        Either::Right(Either::Left(Either::Right(()))) => {
            connection.take_trim_request();
            Read::Trim
        }
        Either::Right(Either::Right(())) => Read::SyncAnswerable,
    };
    connection.set_reading(None);
    read
}

/// Writes the replies that may go now ([`Replies::writable`]: those before
/// the oldest pending `#SYNC`); on ILP, only if they fit in the socket's
/// send buffer now, else they are dropped and counted.
async fn write_replies(
    shard: &Shard,
    stream: &mut TcpStream,
    replies: &mut Replies,
    format: Format,
) -> std::io::Result<()> {
    let writable = replies.writable();
    if writable.is_empty() {
        return Ok(());
    }
    let fits = format != Format::Ilp || send_space(stream).is_none_or(|space| writable.len() <= space);
    if fits {
        stream.write_all(writable).await?;
    } else {
        let dropped = writable.iter().filter(|&&byte| byte == b'\n').count();
        ShardMetrics::add(&shard.metrics().replies_dropped, dropped as u64);
    }
    let count = writable.len();
    replies.consume(count);
    Ok(())
}

/// Keeps the shard's `read_buffer_bytes` gauge in step with one
/// connection's buffer, and takes it back out when the connection ends.
struct BufferGauge<'a> {
    shard: &'a Shard,
    size: usize,
}

impl<'a> BufferGauge<'a> {
    fn new(shard: &'a Shard, size: usize) -> BufferGauge<'a> {
        ShardMetrics::add(&shard.metrics().read_buffer_bytes, size as u64);
        BufferGauge { shard, size }
    }

    fn set(&mut self, size: usize) {
        if size != self.size {
            let gauge = &self.shard.metrics().read_buffer_bytes;
            gauge.set(gauge.get() + size as u64 - self.size as u64);
            self.size = size;
        }
    }
}

impl Drop for BufferGauge<'_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

async fn finish_at_eof(shard: &Shard, lines: &LineBuffer, stream: &mut TcpStream) -> std::io::Result<()> {
    if let Some(tail) = lines.unterminated_tail() {
        ShardMetrics::add(&shard.metrics().lines_rejected_unterminated, 1);
        let mut message = Vec::new();
        let detail = format!("unterminated_line: connection closed mid-line, {} bytes dropped", tail.len());
        write_err(&mut message, lines.next_line_number(), detail);
        // The peer may have closed both directions; the error is counted anyway.
        write_goodbye(stream, &message).await;
    }
    Ok(())
}

/// Where a connection's events go: its stream (set by `#STREAM`), and the
/// owners it sent to since its last `#SYNC` (a SYNC waits only for them, so
/// a stalled shard does not hold up connections that never write to it).
struct Target {
    /// `None` after a `#STREAM` naming no active stream: event lines are
    /// rejected (counted, one `ERR` at the `#STREAM` line) until the next
    /// valid one.
    stream: Option<StreamRoute>,
    touched: Vec<bool>,
}

impl Target {
    /// The stream to route to now: a stream deleted since `#STREAM` is
    /// unknown from here on (checked once per chunk).
    fn check(&mut self, shard: &Shard) -> Option<StreamRoute> {
        if let Some(stream) = self.stream
            && !shard.stream_is_active(stream.id)
        {
            self.stream = None;
        }
        self.stream
    }
}

/// Parses and routes every complete buffered line, holding the shard's
/// placement and router borrowed for the whole chunk (one borrow per chunk,
/// not per event). `drained`: the chunk's read left the socket empty, so
/// its open batches go soon ([`crate::shard::ingress`]).
fn process_buffered(
    shard: &Shard,
    lines: &mut LineBuffer,
    replies: &mut Replies,
    target: &mut Target,
    parser: &mut Parser,
    drained: bool,
) -> Progress {
    let config = &shard.config();
    let mut stream = target.check(shard);
    let refresh_member = |parser: &mut Parser, stream: Option<StreamRoute>| {
        if parser.format == Format::Json {
            match stream {
                Some(stream) => shard.json_value_member(stream.id, &mut parser.value_member),
                None => parser.value_member.clear(),
            }
        }
    };
    refresh_member(parser, stream);
    let mut route = shard.begin_route();
    route.drained = drained;
    let (mut event_count, mut byte_count) = (0u64, 0u64);
    let progress = loop {
        if replies.is_full() {
            break Progress::RepliesFull;
        }
        let (line, line_number) = match lines.next_line() {
            Next::Line { line, line_number } => (line, line_number),
            Next::TooLong { line_number, line_size } => {
                let error = LineError::LineTooLong { line_size, line_size_max: config.line_size_max };
                reject(shard, replies, line_number, Rejection::Line(error));
                continue;
            }
            Next::NeedMore => break Progress::NeedMore,
        };
        let line_size = line.len() as u64 + 1;
        match parser.parse(line, config) {
            Ok((Line::Event { .. }, _)) if stream.is_none() => {
                ShardMetrics::add(&shard.metrics().lines_rejected_unknown_stream, 1);
            }
            Ok((Line::Event { key, payload }, value_at)) => {
                match route.route_hinted(stream.expect("checked"), key, payload, value_at) {
                    Ok(owner) => {
                        target.touched[usize::from(owner)] = true;
                        event_count += 1;
                        byte_count += line_size;
                    }
                    Err(blocked) => {
                        lines.unread_last_line();
                        break Progress::Blocked(blocked);
                    }
                }
            }
            Ok((Line::Empty, _)) => {}
            Ok((Line::Control(text), _)) => {
                let control = parse_control(text);
                if matches!(control, Control::Sync { .. }) && replies.syncs_full() {
                    lines.unread_last_line();
                    break Progress::SyncsFull;
                }
                ShardMetrics::add(&shard.metrics().control_lines, 1);
                control_line(shard, &mut route, replies, target, line_number, control);
                stream = target.stream;
                refresh_member(parser, stream);
            }
            Err(error) => reject(shard, replies, line_number, error),
        }
    };
    drop(route);
    ShardMetrics::add(&shard.metrics().events_ingested, event_count);
    ShardMetrics::add(&shard.metrics().bytes_ingested, byte_count);
    progress
}

/// `#STREAM name`: routes the lines after it to stream `name`, or, if no
/// such stream is active, answers one `ERR unknown_stream` and rejects the
/// event lines up to the next valid `#STREAM`.
fn switch_stream(shard: &Shard, replies: &mut Replies, line_number: u64, name: &[u8], target: &mut Target) {
    target.stream = shard.route_for(name);
    if target.stream.is_none() {
        ShardMetrics::add(&shard.metrics().lines_rejected_unknown_stream, 1);
        let shown = String::from_utf8_lossy(&name[..name.len().min(STREAM_NAME_SIZE_MAX + 1)]).into_owned();
        write_err(replies.line(), line_number, format!("unknown_stream: {shown}"));
    }
}

/// Handles a control line. A `#SYNC` (the caller checked there is room for
/// one more in flight) takes a sync point in every owner the connection
/// sent to since its previous one, and waits in `replies`, not here.
fn control_line(
    shard: &Shard,
    route: &mut Route<'_>,
    replies: &mut Replies,
    target: &mut Target,
    line_number: u64,
    control: Control<'_>,
) {
    match control {
        Control::Sync { token } => replies.push_sync(line_number, token, |sequences| {
            for (owner, touched) in target.touched.iter_mut().enumerate() {
                if std::mem::take(touched) {
                    sequences[owner] = route.sync_point(owner as u16);
                }
            }
        }),
        Control::Ping { token } => write_ok(replies.line(), line_number, b"PING", token),
        Control::Stream { name } => switch_stream(shard, replies, line_number, name, target),
        Control::Unknown { command } => {
            ShardMetrics::add(&shard.metrics().control_lines_unknown, 1);
            write_err(replies.line(), line_number, UnknownControl::new(command));
        }
        Control::TokenTooLong(error) => {
            ShardMetrics::add(&shard.metrics().control_tokens_too_long, 1);
            write_err(replies.line(), line_number, error);
        }
    }
}

fn reject(shard: &Shard, replies: &mut Replies, line_number: u64, rejection: Rejection) {
    let metrics = &shard.metrics();
    let counter = match &rejection {
        Rejection::Line(LineError::KeyEmpty) => &metrics.lines_rejected_key_empty,
        Rejection::Line(LineError::KeyTooLong { .. }) => &metrics.lines_rejected_key_too_long,
        Rejection::Line(LineError::LineTooLong { .. }) => &metrics.lines_rejected_line_too_long,
        Rejection::Json(JsonError::Invalid { .. } | JsonError::TooDeep { .. }) => &metrics.lines_rejected_invalid_json,
        Rejection::Json(_) => &metrics.lines_rejected_json_key,
        Rejection::Ilp(_) => &metrics.lines_rejected_invalid_ilp,
    };
    ShardMetrics::add(counter, 1);
    write_err(replies.line(), line_number, rejection);
}
