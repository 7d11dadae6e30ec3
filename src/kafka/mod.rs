//! The Kafka face: the Kafka wire protocol over the same engine, so Kafka
//! clients (librdkafka and kcat, kafka-python, the Java client) produce to
//! and consume from spate unchanged.
//!
//! Topics are streams, Kafka partitions are a stream's partitions, offsets
//! are spate's. Every shard listens on `--ingest-kafka` (SO_REUSEPORT, like
//! the other ingest listeners) and Metadata names one broker, node 0 at
//! `--kafka-advertise`, as the leader of every partition: whichever shard
//! the kernel gives a connection, it routes each record to the partition's
//! owner through the shard's ingress, with the same batches, credits,
//! backpressure (the connection stops reading while it waits for credits)
//! and durability as a line ([`produce`]), and reads through the same owner
//! fetches as a `SUB` subscriber ([`fetch`]).
//!
//! Idempotent producers' sequences are checked per partition before their
//! records are routed (`producers`); consumer groups follow Kafka's classic
//! protocol, membership in `groups` and committed offsets in spate's group
//! store (`group_api`, `crate::group`). Both tables are process-wide, behind
//! a lock taken per batch or per group request, never per record: a
//! client's connections land on any shard.
//!
//! Requests and responses are decoded and encoded by the `kafka-protocol`
//! crate; record batches by [`batch`]. A connection reads a request's
//! 4-byte size, refuses a size over `--kafka-request-size-max` by closing
//! (Kafka's own broker does the same: the frame cannot be skipped without
//! reading it), and reads the request. Kafka answers a connection's
//! requests in order, and producers keep several Produce requests in
//! flight: so a Produce is routed as soon as it is read, and the connection
//! reads and routes the next ones while it waits for its owners; answers
//! leave in request order as they become answerable. At most
//! [`crate::config::KAFKA_PRODUCES_IN_FLIGHT_MAX`] requests (and
//! [`crate::config::KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX`] partition entries)
//! are in flight; then the connection stops reading until the oldest is
//! answered. Any other request is served alone, after the answers before
//! it.
//! ApiVersions answers exactly the versions [`api::SUPPORTED`] lists; a
//! request of another version or API key gets UNSUPPORTED_VERSION where its
//! response can be encoded, and otherwise closes the connection (counted in
//! `spate_kafka_errors_total`).

mod api;
pub mod batch;
pub mod codes;
mod fetch;
mod group_api;
mod groups;
mod produce;
mod producers;
mod topics;

pub use groups::KafkaGroups;
pub use producers::ProducerTable;

use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};
use kafka_protocol::messages::ApiKey;

use crate::config::{Config, KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX, KAFKA_PRODUCES_IN_FLIGHT_MAX};
use crate::net::accept::Acceptor;
use crate::net::socket::tune_accepted;
use crate::net::{Connection, Face, ShardNet};
use crate::runtime::notify::{Either, first};
use crate::shard::Shard;
use crate::shard::metrics::ShardMetrics;

/// What every Kafka connection of a shard shares: the flags it needs,
/// resolved once.
pub struct KafkaFace {
    /// What Metadata names as the broker.
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Partitions of a stream a Kafka client creates by naming it, if on.
    pub auto_create_partitions: Option<u32>,
    pub request_size_max: usize,
    /// `--kafka-produce-discard`: Produce checks batches, stores nothing.
    pub produce_discard: bool,
    /// The largest record a Produce may carry (its stored size): the line
    /// size limit, so a Kafka record is bounded like a line.
    pub record_size_max: usize,
    pub stream_commands: flume::Sender<crate::admin::StreamCommand>,
    /// Idempotent producers' ids and sequences, shared by every shard.
    pub producers: std::sync::Arc<ProducerTable>,
    /// Kafka consumer groups' membership, shared by every shard.
    pub groups: std::sync::Arc<KafkaGroups>,
    /// Request buffers of this shard's connections between requests (see
    /// [`RequestBuffers`]).
    pub request_buffers: RequestBuffers,
}

/// Spare request buffers of one shard: a connection takes one to read a
/// request into and gives it back once the request is answered, so a busy
/// connection reuses its allocation (a fresh `vec![0; size]` per request
/// cost a large allocation, its zeroing and, above the allocator's mmap
/// threshold, a page fault per 4 KiB: a third of the server's time per
/// Produce record in `spate bench --target kafka`), while an idle
/// connection holds none. At most [`REQUEST_BUFFERS_KEPT_MAX`] buffers of
/// at most [`REQUEST_BUFFER_KEPT_BYTES_MAX`] each are kept per shard.
#[derive(Default)]
pub struct RequestBuffers {
    spare: std::cell::RefCell<Vec<bytes::BytesMut>>,
}

/// Most spare request buffers a shard keeps.
pub const REQUEST_BUFFERS_KEPT_MAX: usize = 4;
/// Largest spare request buffer a shard keeps (a larger one is freed):
/// 4 x 1 MiB per shard at most, beside the formula's per-connection requests.
pub const REQUEST_BUFFER_KEPT_BYTES_MAX: usize = 1 << 20;

impl RequestBuffers {
    fn take(&self) -> bytes::BytesMut {
        self.spare.borrow_mut().pop().unwrap_or_default()
    }

    /// Keeps `buffer` for the next request, if there is room. Its last
    /// request's bytes may still be referenced; `reserve` reuses the
    /// allocation only once they are not.
    fn give_back(&self, buffer: bytes::BytesMut) {
        let mut spare = self.spare.borrow_mut();
        if spare.len() < REQUEST_BUFFERS_KEPT_MAX && buffer.capacity() <= REQUEST_BUFFER_KEPT_BYTES_MAX {
            spare.push(buffer);
        }
    }
}

impl KafkaFace {
    pub fn new(
        config: &Config,
        stream_commands: flume::Sender<crate::admin::StreamCommand>,
        (producers, groups): (std::sync::Arc<ProducerTable>, std::sync::Arc<KafkaGroups>),
    ) -> KafkaFace {
        let listen = config.ingest_kafka.0.unwrap_or_else(|| ([127, 0, 0, 1], 9092).into());
        let (advertised_host, advertised_port) = match &config.kafka_advertise {
            Some(advertise) => split_host_port(advertise, listen.port()),
            None if listen.ip().is_unspecified() => ("127.0.0.1".to_string(), i32::from(listen.port())),
            None => (listen.ip().to_string(), i32::from(listen.port())),
        };
        KafkaFace {
            advertised_host,
            advertised_port,
            auto_create_partitions: config.kafka_auto_create.0,
            request_size_max: config.kafka_request_size_max,
            produce_discard: config.kafka_produce_discard,
            record_size_max: config.line_size_max + crate::protocol::record::EXTENDED_FIXED_SIZE + 1024,
            stream_commands,
            producers,
            groups,
            request_buffers: RequestBuffers::default(),
        }
    }
}

/// `host:port` (or `host`, with the listener's port).
fn split_host_port(advertise: &str, default_port: u16) -> (String, i32) {
    match advertise.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
            (host.trim_matches(['[', ']']).to_string(), port.parse::<i32>().unwrap_or(i32::from(default_port)))
        }
        _ => (advertise.to_string(), i32::from(default_port)),
    }
}

/// Accepts Kafka connections until shutdown, within the process-wide ingest
/// connection limit (shared with the line formats).
pub async fn accept_loop(shard: Rc<Shard>, net: Rc<ShardNet>, listener: TcpListener, face: KafkaFace) {
    let face = Rc::new(face);
    let metrics = &shard.metrics();
    let mut acceptor =
        Acceptor::new(listener, "ingest-kafka", shard.id(), shard.lifecycle(), &net.connections, metrics);
    while let Some(stream) = acceptor.next().await {
        let _ = tune_accepted(&stream);
        let Some(slot) = net.admission.ingest.try_acquire() else {
            // Kafka has no greeting to refuse with: the close is the answer.
            ShardMetrics::add(&metrics.connections_refused, 1);
            drop(stream);
            continue;
        };
        ShardMetrics::add(&metrics.connections_accepted, 1);
        shard.lifecycle().connection_opened();
        let connection = net.connections.register(Face::Ingest);
        let (shard, face) = (shard.clone(), face.clone());
        glommio::spawn_local(async move {
            let served = serve_connection(&shard, &face, stream, &connection);
            let _ = first(served, connection.close_requested()).await;
            drop((connection, slot));
            shard.lifecycle().connection_closed();
        })
        .detach();
    }
}

/// A decoded request frame: its header fields and the body after them.
pub struct Frame {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
    /// The client's name (the header's `client_id`; empty when absent).
    pub client_id: kafka_protocol::protocol::StrBytes,
    pub body: Bytes,
}

/// Why a connection is closed rather than answered.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    TooLarge { size: i64, size_max: usize },
    Malformed(String),
}

/// Splits a request (the bytes after the size prefix) into its header and
/// body. Pure and total over any input (fuzzed through [`decode_request`]).
pub fn decode_frame(mut request: Bytes) -> Result<Frame, FrameError> {
    use kafka_protocol::messages::{ApiKey, RequestHeader};
    use kafka_protocol::protocol::Decodable;
    if request.len() < 8 {
        return Err(FrameError::Malformed(format!("a request of {} bytes has no header", request.len())));
    }
    let api_key = i16::from_be_bytes([request[0], request[1]]);
    let api_version = i16::from_be_bytes([request[2], request[3]]);
    let correlation_id = i32::from_be_bytes([request[4], request[5], request[6], request[7]]);
    let header_version = match ApiKey::try_from(api_key) {
        Ok(key) if api::is_supported(api_key, api_version) => key.request_header_version(api_version),
        // Unknown keys and versions: only the fixed fields are read.
        _ => {
            return Ok(Frame {
                api_key,
                api_version,
                correlation_id,
                client_id: Default::default(),
                body: Bytes::new(),
            });
        }
    };
    let header = RequestHeader::decode(&mut request, header_version)
        .map_err(|error| FrameError::Malformed(format!("request header: {error}")))?;
    let client_id = header.client_id.unwrap_or_default();
    Ok(Frame { api_key, api_version, correlation_id, client_id, body: request })
}

/// Decodes a whole request as the server does before serving it: the
/// header ([`decode_frame`]), then the body with its API's decoder, and a
/// Produce's record batches and records. Pure and total over any input:
/// the `kafka_request` fuzz target's entry point (it must never panic, nor
/// allocate much more than the input's size).
pub fn decode_request(request: Bytes, record_size_max: usize) -> Result<(), FrameError> {
    let mut frame = decode_frame(request)?;
    api::decode_body(frame.api_key, frame.api_version, &mut frame.body, record_size_max)
}

/// Waits for the first byte of the next request: one read, so it is
/// cancel-safe (glommio polls readiness and takes bytes only when the read
/// completes), and the connection may stop waiting to answer a Produce.
/// `None` at a clean EOF between requests.
async fn read_request_start(stream: &mut TcpStream, connection: &Connection) -> std::io::Result<Option<u8>> {
    let mut first = [0u8; 1];
    connection.set_reading(Some(Instant::now()));
    let read = stream.read(&mut first).await;
    connection.set_reading(None);
    Ok((read? == 1).then_some(first[0]))
}

/// Reads the rest of a request that began with `first`: the size prefix,
/// then that many bytes (not cancel-safe: a request once begun is read
/// whole, within `--line-timeout-ms`).
async fn read_request_rest(
    stream: &mut TcpStream,
    connection: &Connection,
    face: &KafkaFace,
    first: u8,
) -> std::io::Result<Result<Bytes, FrameError>> {
    let request_size_max = face.request_size_max;
    let mut size = [first, 0, 0, 0];
    // A request has begun: the rest must come within --line-timeout-ms.
    connection.set_partial_line(Some(1), Instant::now());
    connection.set_reading(Some(Instant::now()));
    stream.read_exact(&mut size[1..]).await?;
    let size = i32::from_be_bytes(size);
    let Some(size) = usize::try_from(size).ok().filter(|&size| size <= request_size_max) else {
        connection.set_reading(None);
        return Ok(Err(FrameError::TooLarge { size: i64::from(size), size_max: request_size_max }));
    };
    let mut buffer = face.request_buffers.take();
    buffer.clear();
    buffer.reserve(size);
    buffer.resize(size, 0);
    let read = stream.read_exact(&mut buffer).await;
    let body = buffer.split().freeze();
    // Back before the request is served: the next request of any of the
    // shard's connections reuses it once this one's bytes are dropped.
    face.request_buffers.give_back(buffer);
    read?;
    connection.set_reading(None);
    connection.set_partial_line(None, Instant::now());
    Ok(Ok(body))
}

/// A Produce request routed and not yet answered, with what its answer's
/// header needs.
struct InFlight {
    version: i16,
    correlation_id: i32,
    produce: produce::RoutedProduce,
}

/// The Produce requests a connection has routed and not yet answered,
/// oldest first: at most [`KAFKA_PRODUCES_IN_FLIGHT_MAX`] holding at most
/// [`KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX`] partition entries (one larger
/// request alone).
#[derive(Default)]
struct Pipeline {
    requests: VecDeque<InFlight>,
    entry_count: usize,
    /// The check of the partition entry being routed, reused by every
    /// request of the connection.
    check: batch::EntryCheck,
}

impl Pipeline {
    /// Whether a request of `entry_count` entries must wait for the oldest
    /// answer before it is routed.
    fn is_full(&self, entry_count: usize) -> bool {
        !self.requests.is_empty()
            && (self.requests.len() >= KAFKA_PRODUCES_IN_FLIGHT_MAX
                || self.entry_count + entry_count > KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX)
    }

    fn push(&mut self, request: InFlight) {
        self.entry_count += request.produce.entry_count();
        self.requests.push_back(request);
    }

    /// Resolves once the oldest request is answerable; never, when none is
    /// in flight.
    async fn oldest_answerable(&self, shard: &Shard) {
        match self.requests.front() {
            Some(oldest) => oldest.produce.answerable(shard.ingress()).await,
            None => std::future::pending().await,
        }
    }

    /// Encodes into `out` the answers of the oldest requests, in order: of
    /// those answerable now, or (`count` > 0) waiting for at least the
    /// `count` oldest.
    async fn answer(
        &mut self,
        shard: &Shard,
        face: &KafkaFace,
        out: &mut Vec<u8>,
        mut count: usize,
    ) -> Result<(), FrameError> {
        while let Some(oldest) = self.requests.front() {
            if count > 0 {
                oldest.produce.answerable(shard.ingress()).await;
                count -= 1;
            } else if !oldest.produce.is_answerable(shard.ingress()) {
                break;
            }
            let Some(InFlight { version, correlation_id, produce }) = self.requests.pop_front() else { break };
            self.entry_count -= produce.entry_count();
            if let Some(response) = produce.answer(face).await {
                api::respond(out, ApiKey::Produce, version, correlation_id, &response)?;
            }
        }
        Ok(())
    }
}

/// What waiting for the next request ended with.
enum Next {
    Request(Bytes),
    /// The oldest Produce in flight can be answered.
    Answerable,
    /// EOF, a read error or shutdown: answer what is in flight and close.
    End,
    Refused(FrameError),
}

/// Waits for the next request, or for the oldest Produce in flight to be
/// answerable, or for shutdown.
async fn next_request(
    shard: &Shard,
    face: &KafkaFace,
    stream: &mut TcpStream,
    connection: &Connection,
    pipeline: &Pipeline,
) -> Next {
    let start = read_request_start(stream, connection);
    let first_byte =
        match first(first(start, pipeline.oldest_answerable(shard)), shard.lifecycle().shutdown_requested()).await {
            Either::Left(Either::Left(Ok(Some(byte)))) => byte,
            Either::Left(Either::Right(())) => return Next::Answerable,
            Either::Left(Either::Left(Ok(None) | Err(_))) | Either::Right(()) => return Next::End,
        };
    let rest = read_request_rest(stream, connection, face, first_byte);
    match first(rest, shard.lifecycle().shutdown_requested()).await {
        Either::Left(Ok(Ok(request))) => Next::Request(request),
        Either::Left(Ok(Err(error))) => Next::Refused(error),
        Either::Left(Err(_)) | Either::Right(()) => Next::End,
    }
}

/// Serves one connection's requests until it closes, sends a frame that
/// cannot be answered, or the server shuts down. Produce requests are
/// pipelined: each is routed as soon as it is read, and answered, in
/// request order, once its owners have applied it ([`Pipeline`]); any other
/// request waits for the answers before it, and is served alone.
async fn serve_connection(shard: &Shard, face: &KafkaFace, mut stream: TcpStream, connection: &Connection) {
    let mut response = Vec::new();
    let mut pipeline = Pipeline::default();
    loop {
        let answered = pipeline.answer(shard, face, &mut response, 0).await;
        if flush(shard, &mut stream, &mut response, answered, face).await.is_err() {
            return;
        }
        let request = match next_request(shard, face, &mut stream, connection, &pipeline).await {
            Next::Request(request) => request,
            Next::Answerable => continue,
            Next::End => {
                let answered = pipeline.answer(shard, face, &mut response, pipeline.requests.len()).await;
                let _ = flush(shard, &mut stream, &mut response, answered, face).await;
                return;
            }
            Next::Refused(error) => return refuse_frame(shard, error),
        };
        connection.greet();
        ShardMetrics::add(&shard.metrics().kafka_requests, 1);
        let served = match decode_frame(request) {
            Ok(frame)
                if frame.api_key == ApiKey::Produce as i16 && api::is_supported(frame.api_key, frame.api_version) =>
            {
                route_produce(shard, face, frame, &mut pipeline, &mut response).await
            }
            Ok(frame) => {
                // Answered after every Produce before it, alone.
                let in_flight = pipeline.requests.len();
                match pipeline.answer(shard, face, &mut response, in_flight).await {
                    Ok(()) => api::handle(shard, face, frame, &mut response).await.map(|_| ()),
                    Err(error) => Err(error),
                }
            }
            Err(error) => Err(error),
        };
        if flush(shard, &mut stream, &mut response, served, face).await.is_err() {
            return;
        }
    }
}

/// Routes a Produce request into the pipeline, first answering (into
/// `out`) as many of the oldest as must make room for it.
async fn route_produce(
    shard: &Shard,
    face: &KafkaFace,
    frame: Frame,
    pipeline: &mut Pipeline,
    out: &mut Vec<u8>,
) -> Result<(), FrameError> {
    let request = api::decode_produce(frame.api_version, frame.body)?;
    let entry_count = produce::entry_count(&request);
    while pipeline.is_full(entry_count) {
        pipeline.answer(shard, face, out, 1).await?;
    }
    let produce = produce::route(shard, face, request, &mut pipeline.check).await;
    pipeline.push(InFlight { version: frame.api_version, correlation_id: frame.correlation_id, produce });
    Ok(())
}

/// Writes the answers in `response` (if `served`; else refuses the frame
/// and fails, closing the connection), then empties it.
async fn flush(
    shard: &Shard,
    stream: &mut TcpStream,
    response: &mut Vec<u8>,
    served: Result<(), FrameError>,
    face: &KafkaFace,
) -> Result<(), ()> {
    if let Err(error) = served {
        refuse_frame(shard, error);
        return Err(());
    }
    if !response.is_empty() {
        stream.write_all(response).await.map_err(|_| ())?;
        response.clear();
    }
    if response.capacity() > face.request_size_max {
        *response = Vec::new();
    }
    Ok(())
}

/// Counts and logs a request the connection cannot go on after.
fn refuse_frame(shard: &Shard, error: FrameError) {
    let metrics = shard.metrics();
    match &error {
        FrameError::TooLarge { .. } => ShardMetrics::add(&metrics.kafka_errors_frame_too_large, 1),
        FrameError::Malformed(_) => ShardMetrics::add(&metrics.kafka_errors_malformed, 1),
    }
    // Counted, not logged: a client that sends garbage is not an operator's
    // problem, and a log line per connection would let it flood the log.
    let _ = error;
}
