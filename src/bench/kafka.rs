//! `--target kafka`: the same generator, keys, payloads and stamps, sent to
//! spate's Kafka listener as Produce requests, so the Kafka face and the line
//! protocol are measured the same way (README, Benchmarks; issue goal:
//! Kafka at least 0.7x the lines' events/s).
//!
//! How a connection produces:
//!
//! * At connect, a Metadata request (v1) for the topic (`--kafka-topic`,
//!   default the `default` stream that lines go to) gives its partition count.
//! * Each write of the line target becomes one Produce request (v7, acks 1
//!   by default): the lines are built exactly as for `--target spate` (same
//!   keys, same stamped payloads, same write size), then every line becomes a
//!   record (key = the line's key, value = its payload, no headers) in the
//!   batch of the partition spate's own hash gives the key (`partition_of`,
//!   what a line with that key is routed to), so both targets fill the same
//!   partitions with the same events. One record batch (v2, uncompressed,
//!   encoded by the `kafka-protocol` crate's record codec) per partition, all
//!   of them in one request, as a Kafka client sends what it has batched for
//!   every partition of a broker in one request. The request is written
//!   straight into the connection's reused buffer, each batch patched in
//!   place (the crate's decoder reads it back in a test), not built as a
//!   `ProduceRequest` and copied again by its encoder.
//! * Up to `--kafka-in-flight` requests (default 4) are outstanding per
//!   connection; the connection reads a response before sending more. At
//!   the end it waits for every response: with acks 1 each says its records
//!   are applied, as the `OK` to a line connection's `#SYNC` does. A
//!   partition error in a response is counted as an error line.
//!
//! acks 0 is not offered: without responses nothing says when the records
//! were stored, so the run's time would end before the server's work did.
//!
//! The generator's own cost per event is higher than for lines (a copy of the
//! built lines, a hash per key, a record encoding); it runs on the same
//! machine as the server, so it is part of what the ratio measures, as a
//! Kafka client's would be.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};

use crate::bench::BenchError;

/// Produce version the bench sends (record batches v2, not flexible).
pub const PRODUCE_VERSION: i16 = 7;
/// Metadata version the bench sends.
pub const METADATA_VERSION: i16 = 1;
/// How long the bench waits for the server to answer Produce before the run
/// fails (acks=1 answers once the records are applied: credits may stall it).
pub const PRODUCE_TIMEOUT_MS: i32 = 120_000;
/// Largest response the bench reads (a Produce response is a few bytes per
/// partition; Metadata lists the topic's partitions).
pub const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Most requests in flight per connection the bench allows.
pub const IN_FLIGHT_MAX: usize = 64;
/// How long a connection waits for a response.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes a record adds to its key and value at most in the bench's
/// batches: size, attributes, deltas, key and value sizes, header count.
const RECORD_OVERHEAD_BYTES_MAX: usize = 5 + 1 + 1 + 5 + 5 + 5 + 1;
/// The client id the bench sends.
const CLIENT_ID: &str = "spate-bench";

/// What a Kafka connection needs besides the address.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    pub topic: String,
    /// 1 or -1 (all).
    pub acks: i16,
    pub in_flight_max: usize,
}

/// One producer connection's Kafka state: the topic's shape, the reused
/// per-partition record lists and buffers, and the requests in flight.
pub struct KafkaProducer {
    options: KafkaOptions,
    topic: TopicName,
    partition_count: u32,
    key_width: usize,
    payload_bytes: usize,
    line_bytes: usize,
    /// A batch of as many records as a request carries, encoded once.
    template: BatchTemplate,
    /// The request being built: each line's partition, the lines of each
    /// partition, the next slot of each partition in `line_order`, and the
    /// line indexes ordered by partition (all reused); then the request
    /// itself, its batches written in place.
    partition_of_line: Vec<u32>,
    line_count_by_partition: Vec<u32>,
    next_slot: Vec<u32>,
    line_order: Vec<u32>,
    request: BytesMut,
    response: Vec<u8>,
    next_correlation_id: i32,
    /// Correlation ids sent and not yet answered, oldest first.
    in_flight: std::collections::VecDeque<i32>,
    pub error_count: u64,
    pub first_error: Option<String>,
}

impl KafkaProducer {
    /// Connects to the Kafka listener at `addr` and reads the topic's
    /// partition count.
    pub fn connect(
        addr: &str,
        options: KafkaOptions,
        key_width: usize,
        payload_bytes: usize,
    ) -> Result<(TcpStream, KafkaProducer), BenchError> {
        let mut stream = TcpStream::connect(addr).map_err(|source| BenchError::Connect {
            what: "Kafka listener",
            addr: addr.into(),
            source,
        })?;
        stream
            .set_read_timeout(Some(RESPONSE_TIMEOUT))
            .map_err(|source| BenchError::Io { what: "set timeout", source })?;
        let topic = TopicName(StrBytes::from_string(options.topic.clone()));
        let mut producer = KafkaProducer {
            options,
            topic,
            partition_count: 0,
            key_width,
            payload_bytes,
            line_bytes: key_width + 1 + payload_bytes + 1,
            template: BatchTemplate::new(key_width, payload_bytes, 1)?,
            partition_of_line: Vec::new(),
            line_count_by_partition: Vec::new(),
            next_slot: Vec::new(),
            line_order: Vec::new(),
            request: BytesMut::new(),
            response: Vec::new(),
            next_correlation_id: 0,
            in_flight: std::collections::VecDeque::new(),
            error_count: 0,
            first_error: None,
        };
        producer.partition_count = producer.metadata(&mut stream)?;
        Ok((stream, producer))
    }

    /// The topic's partition count, from a Metadata request.
    fn metadata(&mut self, stream: &mut TcpStream) -> Result<u32, BenchError> {
        let topic = MetadataRequestTopic::default().with_name(Some(self.topic.clone()));
        let request = MetadataRequest::default().with_topics(Some(vec![topic]));
        let correlation_id = self.send(stream, ApiKey::Metadata, METADATA_VERSION, &request)?;
        self.read_frame(stream, correlation_id, MetadataResponse::header_version(METADATA_VERSION))?;
        let mut body = Bytes::copy_from_slice(&self.response);
        let response = MetadataResponse::decode(&mut body, METADATA_VERSION)
            .map_err(|error| kafka_error(format!("Metadata response: {error}")))?;
        let topic = response.topics.first().ok_or_else(|| kafka_error("Metadata names no topic".into()))?;
        if topic.error_code != 0 || topic.partitions.is_empty() {
            return Err(kafka_error(format!(
                "topic {:?}: error code {} ({} partitions)",
                self.options.topic,
                topic.error_code,
                topic.partitions.len()
            )));
        }
        Ok(topic.partitions.len() as u32)
    }

    /// Encodes `body` with its header (and size) into `self.request` and writes it.
    fn send<T: Encodable + HeaderVersion>(
        &mut self,
        stream: &mut TcpStream,
        api_key: ApiKey,
        version: i16,
        body: &T,
    ) -> Result<i32, BenchError> {
        let correlation_id = self.begin_request(api_key, version, T::header_version(version))?;
        body.encode(&mut self.request, version)
            .map_err(|error| kafka_error(format!("{api_key:?} request does not encode: {error}")))?;
        self.end_request();
        stream
            .write_all(&self.request)
            .map_err(|source| BenchError::Io { what: "write to the Kafka listener", source })?;
        Ok(correlation_id)
    }

    /// Starts a request in `self.request`: a size to patch
    /// ([`KafkaProducer::end_request`]) and the header, with the next
    /// correlation id, which it returns.
    fn begin_request(&mut self, api_key: ApiKey, version: i16, header_version: i16) -> Result<i32, BenchError> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(api_key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)));
        self.request.clear();
        self.request.extend_from_slice(&[0; 4]);
        header
            .encode(&mut self.request, header_version)
            .map_err(|error| kafka_error(format!("{api_key:?} request header does not encode: {error}")))?;
        Ok(correlation_id)
    }

    /// Writes the request's size in front of it.
    fn end_request(&mut self) {
        let size = (self.request.len() - 4) as u32;
        self.request[..4].copy_from_slice(&size.to_be_bytes());
    }

    /// Reads one response into `self.response` (its body, after the header)
    /// and checks it answers `correlation_id`.
    fn read_frame(
        &mut self,
        stream: &mut TcpStream,
        correlation_id: i32,
        header_version: i16,
    ) -> Result<(), BenchError> {
        let io_error = |source| BenchError::Io { what: "read from the Kafka listener", source };
        let mut size = [0u8; 4];
        stream.read_exact(&mut size).map_err(io_error)?;
        let size = u32::from_be_bytes(size) as usize;
        if size > RESPONSE_BYTES_MAX {
            return Err(kafka_error(format!("a response of {size} bytes (at most {RESPONSE_BYTES_MAX})")));
        }
        self.response.resize(size, 0);
        stream.read_exact(&mut self.response).map_err(io_error)?;
        let mut frame = Bytes::copy_from_slice(&self.response);
        let header = ResponseHeader::decode(&mut frame, header_version)
            .map_err(|error| kafka_error(format!("response header: {error}")))?;
        if header.correlation_id != correlation_id {
            return Err(kafka_error(format!(
                "response to request {} where {correlation_id} was expected",
                header.correlation_id
            )));
        }
        self.response.drain(..size - frame.len());
        Ok(())
    }

    /// Sends `lines` (whole lines of the run's layout, as `--target spate`
    /// would write them) as one Produce request, after reading responses
    /// until fewer than `--kafka-in-flight` are outstanding.
    pub fn produce(&mut self, stream: &mut TcpStream, lines: &[u8], timestamp_ms: i64) -> Result<(), BenchError> {
        while self.in_flight.len() >= self.options.in_flight_max {
            self.read_produce_response(stream)?;
        }
        let correlation_id = self.produce_request(lines, timestamp_ms)?;
        stream
            .write_all(&self.request)
            .map_err(|source| BenchError::Io { what: "write to the Kafka listener", source })?;
        self.in_flight.push_back(correlation_id);
        Ok(())
    }

    /// Encodes the Produce request of `lines` into `self.request` and
    /// returns its correlation id: one batch per partition, records in line
    /// order, each batch the template's first records with the lines' keys
    /// and values patched in, written in place. The body's fields are those
    /// the crate's `ProduceRequest` encodes at v7 (a test decodes it with
    /// the crate): encoding it from a `ProduceRequest` cost a copy of every
    /// batch and a `Bytes` per partition.
    fn produce_request(&mut self, lines: &[u8], timestamp_ms: i64) -> Result<i32, BenchError> {
        debug_assert_eq!(lines.len() % self.line_bytes, 0);
        let line_count = lines.len() / self.line_bytes;
        if self.template.record_count() < line_count {
            self.template = BatchTemplate::new(self.key_width, self.payload_bytes, line_count)?;
        }
        self.group_by_partition(lines);
        let partitions_used = self.line_count_by_partition.iter().filter(|&&count| count > 0).count();
        let header_version = ProduceRequest::header_version(PRODUCE_VERSION);
        let correlation_id = self.begin_request(ApiKey::Produce, PRODUCE_VERSION, header_version)?;
        let topic = self.options.topic.as_bytes();
        let request = &mut self.request;
        request.reserve(
            lines.len()
                + line_count * RECORD_OVERHEAD_BYTES_MAX
                + partitions_used * (header::SIZE + 8)
                + topic.len()
                + 20,
        );
        request.extend_from_slice(&(-1i16).to_be_bytes()); // no transactional id
        request.extend_from_slice(&self.options.acks.to_be_bytes());
        request.extend_from_slice(&PRODUCE_TIMEOUT_MS.to_be_bytes());
        request.extend_from_slice(&1i32.to_be_bytes()); // one topic
        request.extend_from_slice(&(topic.len() as i16).to_be_bytes());
        request.extend_from_slice(topic);
        request.extend_from_slice(&(partitions_used as i32).to_be_bytes());
        let mut first = 0;
        for partition in 0..self.partition_count as usize {
            let count = self.line_count_by_partition[partition] as usize;
            if count == 0 {
                continue;
            }
            let order = &self.line_order[first..first + count];
            first += count;
            request.extend_from_slice(&(partition as i32).to_be_bytes());
            request.extend_from_slice(&(self.template.batch_size(count) as i32).to_be_bytes());
            let (key_width, payload_bytes, line_bytes) = (self.key_width, self.payload_bytes, self.line_bytes);
            self.template.write_batch(request, count, timestamp_ms, |record_index| {
                let line_start = order[record_index] as usize * line_bytes;
                let key = &lines[line_start..line_start + key_width];
                (key, &lines[line_start + key_width + 1..line_start + key_width + 1 + payload_bytes])
            });
        }
        self.end_request();
        Ok(correlation_id)
    }

    /// Counts the lines of each partition (spate's hash of the key, as a
    /// line with that key is routed) and orders the line indexes by
    /// partition, keeping line order within one (a counting sort).
    fn group_by_partition(&mut self, lines: &[u8]) {
        let line_count = lines.len() / self.line_bytes;
        self.line_count_by_partition.clear();
        self.line_count_by_partition.resize(self.partition_count as usize, 0);
        self.partition_of_line.clear();
        // spate's `partition_of` (xxh3 modulo the count) without a 64-bit
        // division per line when the count is a power of two (256 by
        // default), as a client's partitioner masks: the same partition,
        // for a tenth of the generator's time per event.
        let mask = self.partition_count.is_power_of_two().then(|| u64::from(self.partition_count) - 1);
        for line in lines.chunks_exact(self.line_bytes) {
            let key = &line[..self.key_width];
            let partition = match mask {
                Some(mask) => (crate::protocol::hash::key_hash(key) & mask) as u32,
                None => crate::protocol::hash::partition_of(key, self.partition_count),
            };
            self.partition_of_line.push(partition);
            self.line_count_by_partition[partition as usize] += 1;
        }
        self.next_slot.clear();
        let mut slot = 0;
        for &count in &self.line_count_by_partition {
            self.next_slot.push(slot);
            slot += count;
        }
        self.line_order.resize(line_count, 0);
        for (line_index, &partition) in self.partition_of_line.iter().enumerate() {
            let slot = &mut self.next_slot[partition as usize];
            self.line_order[*slot as usize] = line_index as u32;
            *slot += 1;
        }
    }

    /// Reads the oldest outstanding Produce response, counting its partition errors.
    fn read_produce_response(&mut self, stream: &mut TcpStream) -> Result<(), BenchError> {
        let Some(correlation_id) = self.in_flight.pop_front() else { return Ok(()) };
        self.read_frame(stream, correlation_id, ProduceResponse::header_version(PRODUCE_VERSION))?;
        let errors = produce_errors(&self.response)
            .ok_or_else(|| kafka_error(format!("Produce response of {} bytes does not parse", self.response.len())))?;
        self.error_count += errors.count;
        if let Some((partition, code)) = errors.first {
            self.first_error
                .get_or_insert_with(|| format!("Produce: partition {partition} answered error code {code}"));
        }
        Ok(())
    }

    /// Waits for every outstanding response.
    pub fn finish(&mut self, stream: &mut TcpStream) -> Result<(), BenchError> {
        while !self.in_flight.is_empty() {
            self.read_produce_response(stream)?;
        }
        Ok(())
    }
}

/// The partitions a Produce response answered with an error.
#[derive(Debug, Default, PartialEq, Eq)]
struct ProduceErrors {
    count: u64,
    /// The first one's partition and error code.
    first: Option<(i32, i16)>,
}

/// Reads the error codes of a Produce response body (v7, after its
/// header) in place: the crate's decoder builds a `Vec` per topic and a
/// struct with a `BTreeMap` per partition, for 256 partitions per response
/// here, where the bench needs only the codes (a test checks this against
/// the crate's encoder). `None` if the body does not parse.
fn produce_errors(mut body: &[u8]) -> Option<ProduceErrors> {
    fn take<const N: usize>(body: &mut &[u8]) -> Option<[u8; N]> {
        let (taken, rest) = body.split_first_chunk::<N>()?;
        *body = rest;
        Some(*taken)
    }
    let mut errors = ProduceErrors::default();
    let topic_count = i32::from_be_bytes(take(&mut body)?);
    for _ in 0..topic_count {
        let name_size = usize::try_from(i16::from_be_bytes(take(&mut body)?)).ok()?;
        body = body.get(name_size..)?;
        let partition_count = i32::from_be_bytes(take(&mut body)?);
        for _ in 0..partition_count {
            let index = i32::from_be_bytes(take(&mut body)?);
            let code = i16::from_be_bytes(take(&mut body)?);
            // Base offset, log append time, log start offset (v5+).
            take::<24>(&mut body)?;
            if code != 0 {
                errors.count += 1;
                errors.first.get_or_insert((index, code));
            }
        }
    }
    take::<4>(&mut body)?; // throttle time (v1+)
    body.is_empty().then_some(errors)
}

/// Offsets in a v2 batch header (`kafka-protocol`'s encoder writes the same).
mod header {
    pub const BATCH_LENGTH: usize = 8;
    pub const BATCH_LENGTH_FROM: usize = 12;
    pub const CRC: usize = 17;
    pub const CRC_FROM: usize = 21;
    pub const LAST_OFFSET_DELTA: usize = 23;
    pub const FIRST_TIMESTAMP: usize = 27;
    pub const MAX_TIMESTAMP: usize = 35;
    pub const RECORD_COUNT: usize = 57;
    pub const SIZE: usize = 61;
}

/// A record batch of `record_count` records with keys and values of the
/// run's widths, encoded once by the `kafka-protocol` crate's record codec,
/// and where each record's key and value lie in it. A batch of `n` records
/// is the template's header and first `n` records (a record's encoding does
/// not depend on the records after it) with the keys, values, count,
/// timestamps, length and CRC32C patched: the codec's bytes, without
/// building a `Record` per event.
struct BatchTemplate {
    bytes: Vec<u8>,
    record_ends: Vec<usize>,
    key_offsets: Vec<usize>,
    value_offsets: Vec<usize>,
}

impl BatchTemplate {
    fn new(key_width: usize, payload_bytes: usize, record_count: usize) -> Result<BatchTemplate, BenchError> {
        let (key, value) = (Bytes::from(vec![0; key_width]), Bytes::from(vec![0; payload_bytes]));
        let records: Vec<Record> =
            (0..record_count as i64).map(|offset| record(offset, 0, key.clone(), value.clone())).collect();
        let mut encoded = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut encoded, records.iter(), &options)
            .map_err(|error| kafka_error(format!("record batch does not encode: {error}")))?;
        let bytes = encoded.to_vec();
        let mut template =
            BatchTemplate { bytes, record_ends: Vec::new(), key_offsets: Vec::new(), value_offsets: Vec::new() };
        let mut position = header::SIZE;
        for _ in 0..record_count {
            position = template.walk_record(position).ok_or_else(|| kafka_error("template walk".into()))?;
        }
        Ok(template)
    }

    /// Records where the record at `start` has its key and value and ends.
    fn walk_record(&mut self, start: usize) -> Option<usize> {
        use crate::kafka::batch::get_varlong;
        let mut rest = &self.bytes[start..];
        let record_size = get_varlong(&mut rest)? as usize;
        let end = self.bytes.len() - rest.len() + record_size;
        rest = &rest[1..]; // attributes
        get_varlong(&mut rest)?; // timestamp delta
        get_varlong(&mut rest)?; // offset delta
        let key_size = get_varlong(&mut rest)? as usize;
        let key_offset = self.bytes.len() - rest.len();
        rest = &rest[key_size..];
        get_varlong(&mut rest)?; // value size
        self.key_offsets.push(key_offset);
        self.value_offsets.push(self.bytes.len() - rest.len());
        self.record_ends.push(end);
        Some(end)
    }

    fn record_count(&self) -> usize {
        self.record_ends.len()
    }

    /// Bytes of a batch of `record_count` records.
    fn batch_size(&self, record_count: usize) -> usize {
        self.record_ends[record_count - 1]
    }

    /// Appends a batch of `record_count` records to `out`; record `i` gets
    /// `key_value(i)`, whose sizes must be the template's.
    fn write_batch<'a>(
        &self,
        out: &mut BytesMut,
        record_count: usize,
        timestamp_ms: i64,
        key_value: impl Fn(usize) -> (&'a [u8], &'a [u8]),
    ) {
        assert!((1..=self.record_count()).contains(&record_count));
        let start = out.len();
        let end = self.record_ends[record_count - 1];
        out.extend_from_slice(&self.bytes[..end]);
        let batch = &mut out[start..];
        for record_index in 0..record_count {
            let (key, value) = key_value(record_index);
            let key_offset = self.key_offsets[record_index];
            batch[key_offset..key_offset + key.len()].copy_from_slice(key);
            let value_offset = self.value_offsets[record_index];
            batch[value_offset..value_offset + value.len()].copy_from_slice(value);
        }
        let put = |batch: &mut [u8], at: usize, bytes: &[u8]| batch[at..at + bytes.len()].copy_from_slice(bytes);
        put(batch, header::BATCH_LENGTH, &((end - header::BATCH_LENGTH_FROM) as i32).to_be_bytes());
        put(batch, header::LAST_OFFSET_DELTA, &(record_count as i32 - 1).to_be_bytes());
        put(batch, header::FIRST_TIMESTAMP, &timestamp_ms.to_be_bytes());
        put(batch, header::MAX_TIMESTAMP, &timestamp_ms.to_be_bytes());
        put(batch, header::RECORD_COUNT, &(record_count as i32).to_be_bytes());
        let crc = crc32c::crc32c(&batch[header::CRC_FROM..]);
        put(batch, header::CRC, &crc.to_be_bytes());
    }
}

/// Record `offset_delta` of a batch: no producer id, so its sequence is such
/// that the batch's base sequence is -1 (the codec derives the base sequence
/// from the first record's sequence and offset, and starts a new batch where
/// `offset - sequence` changes).
pub fn record(offset_delta: i64, timestamp_ms: i64, key: Bytes, value: Bytes) -> Record {
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: offset_delta,
        sequence: offset_delta as i32 - 1,
        timestamp: timestamp_ms,
        key: Some(key),
        value: Some(value),
        headers: Default::default(),
    }
}

fn kafka_error(detail: String) -> BenchError {
    BenchError::Kafka { detail }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch patched from the template is byte for byte what the crate's
    /// encoder makes of the same records, for every record count (varint
    /// widths of the offset delta change at 64 and 8192).
    #[test]
    fn patched_batches_equal_the_codecs() {
        let (key_width, payload_bytes) = (5, 70);
        let template = BatchTemplate::new(key_width, payload_bytes, 9000).unwrap();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        let keys: Vec<Vec<u8>> = (0..9000).map(|index| format!("{index:05}").into_bytes()).collect();
        let values: Vec<Vec<u8>> = (0..9000).map(|index| vec![(index % 251) as u8; payload_bytes]).collect();
        for record_count in [1, 2, 63, 64, 65, 200, 8191, 8192, 9000] {
            let mut patched = BytesMut::new();
            patched.extend_from_slice(b"previous batch");
            template.write_batch(&mut patched, record_count, 1_700_000_000_123, |index| {
                (keys[index].as_slice(), values[index].as_slice())
            });
            let records: Vec<Record> = (0..record_count)
                .map(|index| {
                    let (key, value) = (Bytes::from(keys[index].clone()), Bytes::from(values[index].clone()));
                    record(index as i64, 1_700_000_000_123, key, value)
                })
                .collect();
            let mut encoded = BytesMut::new();
            RecordBatchEncoder::encode(&mut encoded, records.iter(), &options).unwrap();
            assert_eq!(&patched[b"previous batch".len()..], &encoded[..], "{record_count} records");
        }
    }

    /// The error codes read in place from a Produce v7 response are those
    /// the crate's decoder reads from what its encoder wrote; a truncated
    /// or overlong body does not parse.
    #[test]
    fn produce_errors_read_what_the_crate_encodes() {
        use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
        let topic = |name: &'static str, codes: &[i16]| {
            let partitions = codes
                .iter()
                .enumerate()
                .map(|(index, &code)| {
                    PartitionProduceResponse::default()
                        .with_index(index as i32)
                        .with_error_code(code)
                        .with_base_offset(1_000 + index as i64)
                        .with_log_start_offset(-1)
                })
                .collect();
            TopicProduceResponse::default()
                .with_name(TopicName(StrBytes::from_static_str(name)))
                .with_partition_responses(partitions)
        };
        let cases = [
            (vec![topic("default", &[0; 256])], ProduceErrors { count: 0, first: None }),
            (
                vec![topic("default", &[0, 0, 3, 0, 10]), topic("other", &[87])],
                ProduceErrors { count: 3, first: Some((2, 3)) },
            ),
            (Vec::new(), ProduceErrors::default()),
        ];
        for (topics, expected) in cases {
            let response = ProduceResponse::default().with_responses(topics).with_throttle_time_ms(5);
            let mut encoded = BytesMut::new();
            response.encode(&mut encoded, PRODUCE_VERSION).unwrap();
            let decoded = ProduceResponse::decode(&mut encoded.clone().freeze(), PRODUCE_VERSION).unwrap();
            let crate_count: usize = decoded
                .responses
                .iter()
                .map(|topic| topic.partition_responses.iter().filter(|p| p.error_code != 0).count())
                .sum();
            assert_eq!(produce_errors(&encoded), Some(expected));
            assert_eq!(produce_errors(&encoded).unwrap().count, crate_count as u64);
            assert_eq!(produce_errors(&encoded[..encoded.len() - 1]), None, "truncated");
            assert_eq!(produce_errors(&[&encoded[..], &[0]].concat()), None, "a byte too many");
        }
    }

    /// Lines are grouped by the partition spate routes their key to
    /// (`partition_of`, whether the count is a power of two, which the
    /// generator masks, or not), in line order within a partition.
    #[test]
    fn lines_are_grouped_by_partition_in_order() {
        for partition_count in [4, 6] {
            lines_are_grouped_by_partition_in_order_of(partition_count);
        }
    }

    fn lines_are_grouped_by_partition_in_order_of(partition_count: u32) {
        let options = KafkaOptions { topic: "default".into(), acks: 1, in_flight_max: 4 };
        let (key_width, payload_bytes) = (4, 8);
        let mut producer = KafkaProducer {
            options,
            topic: TopicName(StrBytes::from_static_str("default")),
            partition_count,
            key_width,
            payload_bytes,
            line_bytes: key_width + payload_bytes + 2,
            template: BatchTemplate::new(key_width, payload_bytes, 1).unwrap(),
            partition_of_line: Vec::new(),
            line_count_by_partition: Vec::new(),
            next_slot: Vec::new(),
            line_order: Vec::new(),
            request: BytesMut::new(),
            response: Vec::new(),
            next_correlation_id: 0,
            in_flight: Default::default(),
            error_count: 0,
            first_error: None,
        };
        let keys: Vec<String> = (0..40).map(|index| format!("k{index:03}")).collect();
        let lines: String = keys.iter().enumerate().map(|(index, key)| format!("{key} payl{index:04}\n")).collect();
        let correlation_id = producer.produce_request(lines.as_bytes(), 5).unwrap();
        let mut frame = producer.request.clone().freeze();
        let size = frame.split_to(4);
        assert_eq!(u32::from_be_bytes(size[..].try_into().unwrap()) as usize, frame.len(), "the size prefix");
        let header_version = ProduceRequest::header_version(PRODUCE_VERSION);
        let header = RequestHeader::decode(&mut frame, header_version).unwrap();
        assert_eq!((header.request_api_key, header.request_api_version), (ApiKey::Produce as i16, PRODUCE_VERSION));
        assert_eq!(header.correlation_id, correlation_id);
        let request = ProduceRequest::decode(&mut frame, PRODUCE_VERSION).unwrap();
        assert!(frame.is_empty(), "the crate's decoder reads the whole request");
        assert_eq!((request.acks, request.timeout_ms, request.transactional_id), (1, PRODUCE_TIMEOUT_MS, None));
        assert_eq!((request.topic_data.len(), request.topic_data[0].name.0.as_str()), (1, "default"));
        let partitions = &request.topic_data[0].partition_data;
        assert!(partitions.len() > 1, "40 keys over {partition_count} partitions");
        let mut seen = 0;
        for data in partitions {
            let mut records = data.records.clone().unwrap();
            let sets = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut records).unwrap();
            assert_eq!(sets.len(), 1, "one batch per partition");
            let mut previous = None;
            for record in &sets[0].records {
                let key = record.key.as_ref().unwrap();
                assert_eq!(crate::protocol::hash::partition_of(key, partition_count) as i32, data.index);
                let index: usize = std::str::from_utf8(&record.value.as_ref().unwrap()[4..]).unwrap().parse().unwrap();
                assert_eq!(key.as_ref(), keys[index].as_bytes());
                assert!(previous < Some(index), "line order kept");
                previous = Some(index);
                assert_eq!((record.producer_id, record.timestamp), (-1, 5));
                seen += 1;
            }
        }
        assert_eq!(seen, 40);
    }
}
