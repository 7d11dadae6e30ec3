//! The ingest face: TCP connections carrying the line protocol
//! ([`crate::protocol::line`]).
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
//!   owner (stored and visible to subscribers).
//! * `OK <line-number> PING` for `#PING`.
//!
//! A connection that closes in the middle of a line loses only that partial
//! line (counted as `unterminated`): a torn line is more likely a crashed
//! producer than a complete event. On shutdown, what a connection has read
//! is processed; bytes still in the kernel's buffer are not read.

use std::rc::Rc;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use crate::protocol::{Line, LineBuffer, LineError, Next, batch_record_size, parse_line, partition_of};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;
use crate::shard::notify::{Either, first};
use crate::shard::router::Blocked;

/// Reply bytes a connection buffers before it writes them out (and stops
/// parsing until they are written), so a flood of bad lines from a producer
/// that never reads is bounded too.
const REPLY_BUFFER_BYTES_MAX: usize = 64 * 1024;

/// Accepts ingest connections until shutdown.
pub async fn accept_loop(shard: Rc<Shard>, listener: TcpListener) {
    loop {
        let stream = match first(listener.accept(), shard.shutdown_requested()).await {
            Either::Left(Ok(stream)) => stream,
            // Accept errors (EMFILE, aborted handshakes) are per connection.
            Either::Left(Err(_)) => continue,
            Either::Right(()) => return,
        };
        if shard.metrics.connections_open.get() as usize >= shard.config.connections_per_shard_max {
            ShardMetrics::add(&shard.metrics.connections_refused, 1);
            glommio::spawn_local(refuse(stream, shard.config.connections_per_shard_max)).detach();
            continue;
        }
        ShardMetrics::add(&shard.metrics.connections_accepted, 1);
        shard.connection_opened();
        let shard = shard.clone();
        glommio::spawn_local(async move {
            let _ = serve_connection(&shard, stream).await;
            shard.connection_closed();
        })
        .detach();
    }
}

async fn refuse(mut stream: TcpStream, limit: usize) {
    let message = format!("ERR 0 connection_limit: this shard already has {limit} connections\n");
    let _ = stream.write_all(message.as_bytes()).await;
    let _ = stream.close().await;
}

/// What parsing the buffered lines stopped on.
enum Progress {
    /// Every complete line is handled: read more.
    NeedMore,
    /// The next event's owner has no credits.
    Blocked(Blocked),
    /// A control line that needs the task (it may wait).
    Control(Control),
    /// The reply buffer is full: write it out first.
    RepliesFull,
}

enum Control {
    Sync { line_number: u64, token: Vec<u8> },
}

async fn serve_connection(shard: &Shard, mut stream: TcpStream) -> std::io::Result<()> {
    let config = &shard.config;
    let mut lines = LineBuffer::new(config.read_buffer_initial_bytes, config.read_buffer_bytes, config.line_size_max);
    let mut replies = Vec::new();
    // Owners this connection sent events to since its last #SYNC: a SYNC
    // waits only for them, so a stalled shard does not hold up connections
    // that never write to it.
    let mut touched = vec![false; usize::from(shard.shard_count)];
    let mut buffer_gauge = BufferGauge::new(shard, lines.capacity());
    loop {
        loop {
            match process_buffered(shard, &mut lines, &mut replies, &mut touched) {
                Progress::NeedMore => break,
                Progress::Blocked(blocked) => {
                    shard.wait_for_credits(blocked.owner, blocked.credit_bytes_needed).await;
                }
                Progress::Control(Control::Sync { line_number, token }) => {
                    let owners = touched.iter().enumerate().filter(|(_, touched)| **touched);
                    let owners: Vec<u16> = owners.map(|(owner, _)| owner as u16).collect();
                    touched.fill(false);
                    shard.sync_barrier(owners.into_iter()).await;
                    write_ok(&mut replies, line_number, b"SYNC", &token);
                }
                Progress::RepliesFull => {
                    stream.write_all(&replies).await?;
                    replies.clear();
                }
            }
        }
        if !replies.is_empty() {
            stream.write_all(&replies).await?;
            replies.clear();
        }
        if shard.is_shutting_down() {
            return Ok(());
        }
        let count = match first(stream.read(lines.spare()), shard.shutdown_requested()).await {
            Either::Left(result) => result?,
            Either::Right(()) => return Ok(()),
        };
        if count == 0 {
            return finish_at_eof(shard, &lines, &mut stream).await;
        }
        lines.filled(count);
        buffer_gauge.set(lines.capacity());
    }
}

/// Keeps the shard's `read_buffer_bytes` gauge in step with one
/// connection's buffer, and takes it back out when the connection ends.
struct BufferGauge<'a> {
    shard: &'a Shard,
    size: usize,
}

impl<'a> BufferGauge<'a> {
    fn new(shard: &'a Shard, size: usize) -> BufferGauge<'a> {
        ShardMetrics::add(&shard.metrics.read_buffer_bytes, size as u64);
        BufferGauge { shard, size }
    }

    fn set(&mut self, size: usize) {
        if size != self.size {
            let gauge = &self.shard.metrics.read_buffer_bytes;
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
        ShardMetrics::add(&shard.metrics.lines_rejected_unterminated, 1);
        let message = format!(
            "ERR {} unterminated_line: connection closed mid-line, {} bytes dropped\n",
            lines.next_line_number(),
            tail.len()
        );
        // The peer may have closed both directions; the error is counted anyway.
        let _ = stream.write_all(message.as_bytes()).await;
    }
    Ok(())
}

/// Parses and routes every complete buffered line, holding the shard's
/// placement and router borrowed for the whole chunk (one borrow per chunk,
/// not per event).
fn process_buffered(shard: &Shard, lines: &mut LineBuffer, replies: &mut Vec<u8>, touched: &mut [bool]) -> Progress {
    let config = &shard.config;
    let placement = shard.placement.borrow();
    let mut router = shard.router.borrow_mut();
    let (mut event_count, mut byte_count) = (0u64, 0u64);
    let progress = loop {
        if replies.len() >= REPLY_BUFFER_BYTES_MAX {
            break Progress::RepliesFull;
        }
        let (line, line_number) = match lines.next_line() {
            Next::Line { line, line_number } => (line, line_number),
            Next::TooLong { line_number, line_size } => {
                let error = LineError::LineTooLong { line_size, line_size_max: config.line_size_max };
                reject(shard, replies, line_number, error);
                continue;
            }
            Next::NeedMore => break Progress::NeedMore,
        };
        let line_size = line.len() as u64 + 1;
        match parse_line(line, config.line_size_max) {
            Ok(Line::Event { key, payload }) => {
                let partition = partition_of(key, config.partitions);
                let owner = placement.owner(partition);
                if router.would_overflow(owner, batch_record_size(key, payload))
                    && let Some(batch) = router.take_batch(owner)
                {
                    shard.deliver(owner, batch);
                }
                match router.try_push(owner, partition, key, payload) {
                    Ok(batch_full) => {
                        touched[usize::from(owner)] = true;
                        event_count += 1;
                        byte_count += line_size;
                        if batch_full && let Some(batch) = router.take_batch(owner) {
                            shard.deliver(owner, batch);
                        }
                    }
                    Err(blocked) => {
                        lines.unread_last_line();
                        break Progress::Blocked(blocked);
                    }
                }
            }
            Ok(Line::Empty) => {}
            Ok(Line::Control(text)) => {
                ShardMetrics::add(&shard.metrics.control_lines, 1);
                if let Some(control) = control_line(replies, line_number, text) {
                    break Progress::Control(control);
                }
            }
            Err(error) => reject(shard, replies, line_number, error),
        }
    };
    let has_open_batches = router.pending_owners().next().is_some();
    drop(router);
    if has_open_batches {
        shard.request_flush();
    }
    ShardMetrics::add(&shard.metrics.events_ingested, event_count);
    ShardMetrics::add(&shard.metrics.bytes_ingested, byte_count);
    progress
}

/// Handles a control line; returns the ones the task must act on.
fn control_line(replies: &mut Vec<u8>, line_number: u64, text: &[u8]) -> Option<Control> {
    let (command, argument) = match memchr::memchr(b' ', text) {
        Some(space) => (&text[..space], &text[space + 1..]),
        None => (text, &text[text.len()..]),
    };
    match command {
        b"SYNC" => Some(Control::Sync { line_number, token: argument.to_vec() }),
        b"PING" => {
            write_ok(replies, line_number, b"PING", argument);
            None
        }
        _ => {
            let shown = String::from_utf8_lossy(&command[..command.len().min(32)]).into_owned();
            let message = format!("ERR {line_number} unknown_control: #{shown} (known: #SYNC, #PING)\n");
            replies.extend_from_slice(message.as_bytes());
            None
        }
    }
}

fn write_ok(replies: &mut Vec<u8>, line_number: u64, command: &[u8], token: &[u8]) {
    replies.extend_from_slice(b"OK ");
    replies.extend_from_slice(itoa::Buffer::new().format(line_number).as_bytes());
    replies.push(b' ');
    replies.extend_from_slice(command);
    if !token.is_empty() {
        replies.push(b' ');
        replies.extend_from_slice(token);
    }
    replies.push(b'\n');
}

fn reject(shard: &Shard, replies: &mut Vec<u8>, line_number: u64, error: LineError) {
    let metrics = &shard.metrics;
    let counter = match error {
        LineError::KeyEmpty => &metrics.lines_rejected_key_empty,
        LineError::KeyTooLong { .. } => &metrics.lines_rejected_key_too_long,
        LineError::LineTooLong { .. } => &metrics.lines_rejected_line_too_long,
    };
    ShardMetrics::add(counter, 1);
    let message = format!("ERR {line_number} {error}\n");
    replies.extend_from_slice(message.as_bytes());
}
