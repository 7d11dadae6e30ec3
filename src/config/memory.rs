//! The peak memory and the file descriptors a configuration may take.
//!
//! The memory formula is one table, [`FORMULA`]: each line names its term of
//! [`MemoryBound`], its expression as `spate serve --help` prints it (built
//! from the constants of [`super::limits`], never a number typed twice) and
//! the bytes it stands for under a [`Config`]. [`Config::memory_bound`] adds
//! up the bytes and [`memory_formula_text`] prints the expressions, so the two
//! cannot drift apart without the tests here noticing: they evaluate every
//! printed expression against the computation, for many configurations, and
//! hold the README's block ("Limits and memory") to the printed text.

use super::flags::{Config, ConfigError, Storage};
use super::limits::*;
use crate::protocol::record::{BATCH_HEADER_SIZE, LOG_HEADER_SIZE};

/// A term of the memory bound: one field of [`MemoryBound`] (and of the
/// `memory_bound` object in `GET /stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    ConnectionBuffers,
    LongLineWorstCase,
    BatchesAndCredits,
    Retention,
    Subscribers,
    Fixed,
    Mesh,
    Admin,
    Groups,
    SegmentPool,
}

impl Term {
    /// Every term, in the order a term that does not fit is looked for.
    pub const ALL: [Term; 10] = [
        Term::ConnectionBuffers,
        Term::LongLineWorstCase,
        Term::BatchesAndCredits,
        Term::Retention,
        Term::Subscribers,
        Term::Fixed,
        Term::Mesh,
        Term::Admin,
        Term::Groups,
        Term::SegmentPool,
    ];

    /// The term's field name in [`MemoryBound`] and `/stats`.
    pub fn name(self) -> &'static str {
        match self {
            Term::ConnectionBuffers => "connection_buffers",
            Term::LongLineWorstCase => "long_line_worst_case",
            Term::BatchesAndCredits => "batches_and_credits",
            Term::Retention => "retention",
            Term::Subscribers => "subscribers",
            Term::Fixed => "fixed",
            Term::Mesh => "mesh",
            Term::Admin => "admin",
            Term::Groups => "groups",
            Term::SegmentPool => "segment_pool",
        }
    }

    /// The flags whose product makes the term large, for the error that
    /// refuses a term that does not fit in a `usize`.
    fn flags(self) -> &'static str {
        match self {
            Term::ConnectionBuffers => "--connections-per-shard-max and --read-buffer-bytes",
            Term::LongLineWorstCase => "--connections-per-shard-max and --line-size-max",
            Term::BatchesAndCredits => "--batch-bytes and --credit-window-bytes",
            Term::Retention => {
                "--retention-bytes, --tail-cache-bytes, --fsync-pending-bytes-max and --credit-window-bytes"
            }
            Term::Subscribers => "--subscribers-per-shard-max and --fetch-bytes-max",
            Term::Fixed => "--io-memory-bytes and --batch-bytes",
            Term::Mesh => "--credit-window-batches and --subscribers-per-shard-max",
            Term::Admin => "--partitions-max",
            Term::Groups => "--groups-max and --subscribers-per-shard-max",
            Term::SegmentPool => "--log-prefault-bytes",
        }
    }
}

/// One line of the memory formula: its text and its bytes, made from the
/// same constants.
pub struct FormulaLine {
    /// The term the line adds to.
    pub term: Term,
    /// The storage the line counts with; `None`: either.
    pub storage: Option<Storage>,
    /// The expression as `--help` prints it: flag names (`_` for `-`), `S`,
    /// `P`, `C`, `N`, numbers and `KiB`/`MiB`, `+ - * /`, `max( , )`.
    pub expression: fn() -> String,
    /// What the bytes hold, printed beside the expression.
    pub what: &'static str,
    /// The bytes the line stands for under a configuration (saturating).
    pub bytes: fn(&Config) -> usize,
}

impl FormulaLine {
    /// Whether the line counts under `storage`.
    pub fn counts_with(&self, storage: Storage) -> bool {
        self.storage.is_none_or(|only| only == storage)
    }
}

/// The memory formula, line by line, in the order `--help` prints it. The
/// long-line lines ([`Term::LongLineWorstCase`]) are printed apart, after
/// the total.
pub const FORMULA: &[FormulaLine] = &[
    FormulaLine {
        term: Term::ConnectionBuffers,
        storage: None,
        expression: || {
            format!(
                "C * (read_buffer_bytes + {} + {} + {} + 2 * key_size_max)",
                size(REPLY_BUFFER_BYTES_MAX),
                size(REPLY_LINE_SIZE_MAX),
                size(CONNECTION_STATE_BYTES)
            )
        },
        what: "busy ingest connections: read buffer, replies and a reply line, task state, JSON/ILP parser \
               scratch",
        bytes: |config| {
            let per_connection = sum(&[
                config.read_buffer_bytes,
                REPLY_BUFFER_BYTES_MAX,
                REPLY_LINE_SIZE_MAX,
                CONNECTION_STATE_BYTES,
                config.parser_scratch_bytes_max(),
            ]);
            product(&[connections(config), per_connection])
        },
    },
    FormulaLine {
        term: Term::ConnectionBuffers,
        storage: None,
        expression: || format!("S * {} * {}", REFUSALS_IN_FLIGHT_MAX, size(CONNECTION_STATE_BYTES)),
        what: "refused connections being told why",
        bytes: |config| product(&[config.shard_count(), REFUSALS_IN_FLIGHT_MAX, CONNECTION_STATE_BYTES]),
    },
    FormulaLine {
        term: Term::ConnectionBuffers,
        storage: None,
        expression: || {
            format!("C * {} * ({} * S + {})", SYNCS_IN_FLIGHT_MAX, SYNC_IN_FLIGHT_BYTES_PER_SHARD, SYNC_IN_FLIGHT_BYTES)
        },
        what: "#SYNCs in flight per ingest connection: the batch each waits for per shard, its reply's place",
        bytes: |config| {
            let per_sync =
                sum(&[product(&[SYNC_IN_FLIGHT_BYTES_PER_SHARD, config.shard_count()]), SYNC_IN_FLIGHT_BYTES]);
            product(&[connections(config), SYNCS_IN_FLIGHT_MAX, per_sync])
        },
    },
    FormulaLine {
        term: Term::Subscribers,
        storage: None,
        expression: || {
            format!(
                "N * ((S + 1) * fetch_bytes_max + S * {} + {} * P + {})",
                size(STANDING_REPLIES_STATE_BYTES),
                SUBSCRIBER_BYTES_PER_PARTITION,
                size(SUBSCRIBER_STATE_BYTES)
            )
        },
        what: "subscribers: a reply in flight from each owner and one being written, their bookkeeping, the \
               cursors of a SUB *, request and notice buffers, a connection being shed",
        bytes: |config| {
            let shards = config.shard_count();
            let per_subscriber = sum(&[
                product(&[shards + 1, config.fetch_bytes_max]),
                product(&[shards, STANDING_REPLIES_STATE_BYTES]),
                product(&[SUBSCRIBER_BYTES_PER_PARTITION, config.partitions_max as usize]),
                SUBSCRIBER_STATE_BYTES,
            ]);
            product(&[subscribers(config), per_subscriber])
        },
    },
    FormulaLine {
        term: Term::BatchesAndCredits,
        storage: None,
        expression: || "S * S * (batch_bytes + credit_window_bytes)".to_string(),
        what: "open batches and events in flight (also those a thief buffers during a migration)",
        bytes: |config| {
            let shards = config.shard_count();
            product(&[shards, shards, sum(&[config.batch_bytes, config.credit_window_bytes()])])
        },
    },
    FormulaLine {
        term: Term::Retention,
        storage: Some(Storage::Memory),
        expression: || "P * (retention_bytes + segment_bytes)".to_string(),
        what: "all of retention, and a segment being filled",
        bytes: |config| {
            product(&[config.partitions_max as usize, sum(&[config.retention_bytes(), config.segment_bytes()])])
        },
    },
    FormulaLine {
        term: Term::Retention,
        storage: Some(Storage::Disk),
        expression: || {
            format!(
                "P * (tail_cache_bytes + max(tail_cache_bytes / 4, {}) + retention_bytes / {} * {} + {})",
                LOG_HEADER_SIZE + 1,
                size(INDEX_INTERVAL_BYTES as usize),
                INDEX_ENTRY_BYTES,
                size(DISK_PARTITION_ALLOWANCE_BYTES)
            )
        },
        what: "tail caches and the cache segment being filled, offset indexes, partition state",
        bytes: |config| {
            let index_bytes = product(&[config.retention_bytes() / INDEX_INTERVAL_BYTES as usize, INDEX_ENTRY_BYTES]);
            let per_partition = sum(&[
                config.tail_cache_bytes,
                config.tail_cache_segment_bytes(),
                index_bytes,
                DISK_PARTITION_ALLOWANCE_BYTES,
            ]);
            product(&[config.partitions_max as usize, per_partition])
        },
    },
    FormulaLine {
        term: Term::Retention,
        storage: Some(Storage::Disk),
        expression: || "S * fsync_pending_bytes_max".to_string(),
        what: "write buffers waiting for an fdatasync",
        bytes: |config| product(&[config.shard_count(), config.fsync_pending_bytes_max]),
    },
    FormulaLine {
        term: Term::Retention,
        storage: Some(Storage::Disk),
        expression: || {
            format!(
                "S * (max(line_size_max + {}, {}) + {})",
                size(WAL_FRAME_SLACK_BYTES),
                size(2 * FRAME_BODY_BYTES_TARGET),
                size(WAL_BUFFER_SLACK_BYTES)
            )
        },
        what: "the write-ahead log's record being filled",
        bytes: |config| {
            let largest = (config.line_size_max + WAL_FRAME_SLACK_BYTES).max(2 * FRAME_BODY_BYTES_TARGET);
            product(&[config.shard_count(), sum(&[largest, WAL_BUFFER_SLACK_BYTES])])
        },
    },
    FormulaLine {
        term: Term::Retention,
        storage: Some(Storage::Disk),
        expression: || format!("S * {}", size(crate::storage::wal::ALLOCATE_WRITE_BYTES as usize)),
        what: "zeros the write-ahead log writes ahead of its end between rounds (its first lap only)",
        bytes: |config| product(&[config.shard_count(), crate::storage::wal::ALLOCATE_WRITE_BYTES as usize]),
    },
    FormulaLine {
        term: Term::Retention,
        storage: Some(Storage::Disk),
        expression: || "S * S * credit_window_bytes".to_string(),
        what: "write buffers of the events credits let in flight",
        bytes: |config| product(&[config.shard_count(), config.shard_count(), config.credit_window_bytes()]),
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || {
            format!(
                "S * (io_memory_bytes + {} * P + {} * (batch_bytes / {} + 2) + {} * (P + 1) + {})",
                PLACEMENT_ENTRY_BYTES,
                APPLY_ORDER_BYTES_PER_RECORD,
                BATCH_HEADER_SIZE + 1,
                APPLY_ORDER_BYTES_PER_PARTITION,
                size(SHARD_FIXED_ALLOWANCE_BYTES)
            )
        },
        what: "fixed per shard: io_uring buffers, the placement table, the order a batch is applied in, code, \
               stacks and slack",
        bytes: |config| {
            let partitions = config.partitions_max as usize;
            let placement = product(&[PLACEMENT_ENTRY_BYTES, partitions]);
            let per_shard = sum(&[
                config.io_memory_bytes,
                placement,
                config.apply_order_bytes(partitions),
                SHARD_FIXED_ALLOWANCE_BYTES,
            ]);
            product(&[config.shard_count(), per_shard])
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || format!("{KAFKA_PRODUCER_STATES_MAX} * {KAFKA_PRODUCER_STATE_BYTES}"),
        what: "the idempotent Kafka producers' (producer, partition) table, once per process",
        bytes: |config| {
            if config.ingest_kafka.0.is_some() {
                product(&[KAFKA_PRODUCER_STATES_MAX, KAFKA_PRODUCER_STATE_BYTES])
            } else {
                0
            }
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || {
            format!(
                "{} * {} + {} * {} + {}",
                CLUSTER_MEMBERS_MAX,
                size(CLUSTER_MEMBER_BYTES),
                CLUSTER_OUTBOX_DATAGRAMS_MAX,
                size(CLUSTER_DATAGRAM_BYTES_MAX),
                size(CLUSTER_THREAD_BYTES)
            )
        },
        what: "the cluster thread: members known, gossip datagrams waiting, the thread",
        bytes: |_| {
            sum(&[
                product(&[CLUSTER_MEMBERS_MAX, CLUSTER_MEMBER_BYTES]),
                product(&[CLUSTER_OUTBOX_DATAGRAMS_MAX, CLUSTER_DATAGRAM_BYTES_MAX]),
                CLUSTER_THREAD_BYTES,
            ])
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || {
            format!(
                "cluster * {} * ({} + {} + 2 * {} + {} + {})",
                TRANSPORT_PEERS_MAX,
                size(TRANSPORT_QUEUE_BYTES_MAX),
                size(TRANSPORT_FLUSH_BYTES),
                size(TRANSPORT_FRAME_BYTES_MAX),
                size(TRANSPORT_WINDOW_BYTES),
                size(TRANSPORT_READ_CHUNK_BYTES)
            )
        },
        what: "the internode transport: per peer, its queue, a write (a flush and a frame), the window this \
               node grants it and a read buffer (a frame and a chunk)",
        bytes: |config| {
            let peers = if config.cluster_address().is_some() { TRANSPORT_PEERS_MAX } else { 0 };
            product(&[peers, TRANSPORT_PEER_BYTES])
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || {
            format!(
                "cluster * ({} * {} + credit_window_bytes * S * S + 2 * S * {} * {} + {})",
                TRANSPORT_PEERS_MAX,
                size(crate::replication::node::UNSENT_BYTES_MAX),
                crate::shard::replicated::PROPOSALS_OUTSTANDING_MAX,
                crate::shard::replicated::PROPOSAL_REQUEST_BYTES,
                size(crate::replication::node::DELIVERY_WAVE_BYTES_MAX)
            )
        },
        what: "replication: the proposals of the batches in flight (a copy of their records, within the \
               credit windows; at most 256 batches and 4096 proposals per shard), the queue from the shards to \
               the cluster thread (room for each proposal twice, its bookkeeping), per peer what waits for room \
               in its queue, and one wave of committed records delivered to the shards",
        bytes: |config| {
            if config.cluster_address().is_none() {
                return 0;
            }
            let shards = config.shard_count();
            sum(&[
                product(&[shards, shards, config.credit_window_bytes()]),
                product(&[
                    crate::shard::replicated::proposal_queue_capacity(shards),
                    crate::shard::replicated::PROPOSAL_REQUEST_BYTES,
                ]),
                product(&[TRANSPORT_PEERS_MAX, crate::replication::node::UNSENT_BYTES_MAX]),
                crate::replication::node::DELIVERY_WAVE_BYTES_MAX,
            ])
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || {
            use crate::replication::catchup::GAP_SERVES_MAX;
            format!(
                "cluster * ({GAP_SERVES_MAX} * ({} + 3 * {}) + 2 * {})",
                size(crate::shard::gap_read::DISK_READ_BYTES_MAX),
                size(TRANSPORT_FRAME_BYTES_MAX),
                size(TRANSPORT_FRAME_BYTES_MAX)
            )
        },
        what: "replication: gap fetches (records a replica lacks before a snapshot's point, read from a \
               peer's partition log): per read served for a peer, a disk read and three chunks; one chunk \
               being appended here, twice",
        bytes: |config| {
            if config.cluster_address().is_none() {
                return 0;
            }
            crate::replication::catchup::GAP_MEMORY_BYTES
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || {
            use crate::replication::mirror::{MIRROR_CHUNK_BYTES, MIRROR_SERVES_MAX};
            let header = crate::replication::catchup::ANSWER_HEADER_BYTES;
            format!("cluster * {MIRROR_SERVES_MAX} * 2 * ({} + {header} + line_size_max)", size(MIRROR_CHUNK_BYTES))
        },
        what: "replication: mirrors (partitions a subscriber reads on a node holding no replica of them, read \
               from a replica): per read served for a peer, its records twice, a chunk and one record each",
        bytes: |config| {
            if config.cluster_address().is_none() {
                return 0;
            }
            crate::replication::mirror::memory_bytes(config.line_size_max)
        },
    },
    FormulaLine {
        term: Term::Fixed,
        storage: None,
        expression: || "cluster * raft_log_bytes_max".to_string(),
        what: "replication: the Raft log entries of every group, held in memory as well as in the file; \
               compacted once applied and durable in their partition, so full only when compaction is behind \
               (a snapshot sent to a lagging replica is its metadata, no data)",
        bytes: |config| {
            if config.cluster_address().is_none() {
                return 0;
            }
            usize::try_from(config.raft_log_bytes_max).unwrap_or(usize::MAX)
        },
    },
    FormulaLine {
        term: Term::Groups,
        storage: None,
        expression: || {
            format!("{KAFKA_GROUP_MEMBERS_MAX} * ({} + {KAFKA_MEMBER_STATE_BYTES})", size(KAFKA_MEMBER_BYTES_MAX))
        },
        what: "Kafka consumer group members, once per process: metadata, assignment and state",
        bytes: |config| {
            let per_member = KAFKA_MEMBER_BYTES_MAX + KAFKA_MEMBER_STATE_BYTES;
            if config.ingest_kafka.0.is_some() { product(&[KAFKA_GROUP_MEMBERS_MAX, per_member]) } else { 0 }
        },
    },
    FormulaLine {
        term: Term::SegmentPool,
        storage: None,
        expression: || "S * log_prefault_bytes".to_string(),
        what: "log segments kept ready",
        bytes: |config| product(&[config.shard_count(), config.log_prefault_bytes]),
    },
    FormulaLine {
        term: Term::Mesh,
        storage: None,
        expression: || {
            format!(
                "S * S * (credit_window_batches + 2 * subscribers_per_shard_max + {}) * {}",
                MESH_CONTROL_SLOTS, MESH_FRAME_BYTES_MAX
            )
        },
        what: "mesh rings: a slot per batch in flight, per subscriber fetch and reply, and for control",
        bytes: |config| {
            let shards = config.shard_count();
            product(&[shards, shards, config.mesh_channel_frames(), MESH_FRAME_BYTES_MAX])
        },
    },
    FormulaLine {
        term: Term::Admin,
        storage: None,
        expression: || {
            format!(
                "{} * (2 * {} + {} * P + {} * S)",
                ADMIN_CONNECTIONS_MAX,
                size(ADMIN_HEADER_BYTES_MAX),
                ADMIN_RESPONSE_BYTES_PER_PARTITION,
                size(ADMIN_RESPONSE_BYTES_PER_SHARD)
            )
        },
        what: "admin connections: request heads and a response",
        bytes: |config| {
            let response_max = sum(&[
                product(&[ADMIN_RESPONSE_BYTES_PER_PARTITION, config.partitions_max as usize]),
                product(&[ADMIN_RESPONSE_BYTES_PER_SHARD, config.shard_count()]),
            ]);
            product(&[ADMIN_CONNECTIONS_MAX, sum(&[2 * ADMIN_HEADER_BYTES_MAX, response_max])])
        },
    },
    FormulaLine {
        term: Term::Groups,
        storage: None,
        expression: || {
            format!(
                "groups_max * ({} + P * ({} + {} * S))",
                GROUP_STATE_BYTES, GROUP_BYTES_PER_PARTITION, GROUP_HOLD_FLOOR_BYTES
            )
        },
        what: "consumer groups on their coordinators, and hold floors on every shard",
        bytes: |config| {
            let per_partition =
                sum(&[GROUP_BYTES_PER_PARTITION, product(&[GROUP_HOLD_FLOOR_BYTES, config.shard_count()])]);
            let per_group = sum(&[GROUP_STATE_BYTES, product(&[config.partitions_max as usize, per_partition])]);
            product(&[config.groups_max, per_group])
        },
    },
    FormulaLine {
        term: Term::Groups,
        storage: None,
        expression: || format!("N * {} * {}", COMMITS_IN_FLIGHT_MAX, GROUP_ACK_BYTES),
        what: "group members' commit answers in flight",
        bytes: |config| product(&[subscribers(config), COMMITS_IN_FLIGHT_MAX, GROUP_ACK_BYTES]),
    },
    FormulaLine {
        term: Term::LongLineWorstCase,
        storage: None,
        expression: || "C * (line_size_max + 2 - read_buffer_bytes)".to_string(),
        what: "read buffers grown to hold the line and its CR LF",
        bytes: |config| {
            let growth = config.line_size_max.saturating_add(2).saturating_sub(config.read_buffer_bytes);
            product(&[connections(config), growth])
        },
    },
    FormulaLine {
        term: Term::LongLineWorstCase,
        storage: None,
        expression: || "C * (line_size_max - 2 * key_size_max)".to_string(),
        what: "JSON/ILP parser scratch grown to unescape the line's key",
        bytes: |config| {
            let growth = config.line_size_max.saturating_sub(config.parser_scratch_bytes_max());
            product(&[connections(config), growth])
        },
    },
    FormulaLine {
        term: Term::LongLineWorstCase,
        storage: None,
        expression: || {
            format!(
                "C * (2 * kafka_request_size_max + {} * {} + {} + {} * {})",
                KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX,
                KAFKA_PRODUCE_ENTRY_BYTES,
                KAFKA_STAGED_BYTES_MAX,
                KAFKA_STAGED_RECORDS_MAX,
                crate::kafka::batch::STAGED_RECORD_BYTES
            )
        },
        what: "Kafka connections each holding a request and a response of the largest size, Produce requests in flight, and one partition entry's checked records, encoded",
        bytes: |config| {
            let kafka_on = config.ingest_kafka.0.is_some();
            let in_flight = KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX * KAFKA_PRODUCE_ENTRY_BYTES
                + KAFKA_STAGED_BYTES_MAX
                + KAFKA_STAGED_RECORDS_MAX * crate::kafka::batch::STAGED_RECORD_BYTES;
            let per_connection = product(&[2, config.kafka_request_size_max]).saturating_add(in_flight);
            if kafka_on { product(&[connections(config), per_connection]) } else { 0 }
        },
    },
];

/// `C`: ingest connections, counted process-wide.
fn connections(config: &Config) -> usize {
    product(&[config.shard_count(), config.connections_per_shard_max])
}

/// `N`: subscriber connections, counted process-wide.
fn subscribers(config: &Config) -> usize {
    product(&[config.shard_count(), config.subscribers_per_shard_max])
}

/// A size as the formula prints it: in KiB or MiB when it is a whole number
/// of them, in bytes otherwise.
/// Bounds what a frame adds to a line in the write-ahead log's buffer
/// (batch and frame headers), rounded to a block: [`Config::wal_buffer_bytes`]
/// is at most the formula's term.
const WAL_FRAME_SLACK_BYTES: usize = 4 * KIB;
/// The blocks [`Config::wal_buffer_bytes`] adds: the carried tail, a
/// record header, rounding.
const WAL_BUFFER_SLACK_BYTES: usize = 16 * KIB;

fn size(bytes: usize) -> String {
    match bytes {
        0 => "0".to_string(),
        _ if bytes.is_multiple_of(MIB) => format!("{} MiB", bytes / MIB),
        _ if bytes.is_multiple_of(KIB) => format!("{} KiB", bytes / KIB),
        _ => bytes.to_string(),
    }
}

/// A duration in ms as the formula prints it: in seconds when whole.
fn duration(ms: u64) -> String {
    if ms.is_multiple_of(1000) { format!("{} s", ms / 1000) } else { format!("{ms} ms") }
}

/// Where the descriptions start, and how wide the text is.
const WHAT_COLUMN: usize = 50;
const TEXT_WIDTH: usize = 100;

/// The memory formula as `spate serve --help` prints it after the flags, and
/// as the README's "Limits and memory" shows it (a test holds the two equal).
pub fn memory_formula_text() -> String {
    let mut text = String::from(
        "Peak memory of the process, in bytes (GET /stats: memory_bound). S = shards, P = partitions_max\n\
         (all streams' partitions), C = S * connections_per_shard_max ingest connections and N = S *\n\
         subscribers_per_shard_max subscriber connections, both counted process-wide; every other name\n\
         is a flag of spate serve (or its default); cluster is 1 with --cluster or --join, else 0; /\n\
         rounds down, and a difference below 0 counts 0.\n",
    );
    let mut storage = None;
    let mut first = true;
    for line in FORMULA.iter().filter(|line| line.term != Term::LongLineWorstCase) {
        if line.storage.is_some() && line.storage != storage {
            let lead = if storage.is_none() { "  + partition logs, " } else { "    " };
            text += &format!("{lead}{}\n", storage_heading(line.storage));
            first = true;
        }
        storage = line.storage;
        let lead = match (storage.is_some(), first) {
            (false, true) => "    ",
            (false, false) => "  + ",
            (true, true) => "      ",
            (true, false) => "      + ",
        };
        push_line(&mut text, &format!("{lead}{}", (line.expression)()), line.what);
        first = false;
    }
    text += "plus, only if every ingest connection holds a line of line_size_max (or a Kafka request of\nkafka_request_size_max) at once:\n";
    for (index, line) in FORMULA.iter().filter(|line| line.term == Term::LongLineWorstCase).enumerate() {
        let lead = if index == 0 { "    " } else { "  + " };
        push_line(&mut text, &format!("{lead}{}", (line.expression)()), line.what);
    }
    text += &format!(
        "plus, for keyed aggregates (not in memory_bound, which cannot know what will be declared):\n\
         \x20   S * {} + Pa * A * aggregate_keys_max * key cost, for A aggregates on Pa partitions\n\
         \x20   (at most {} per stream; the key cost is in README \"Keyed aggregates\").\n\
         An idle ingest connection costs read_buffer_initial_bytes + {} (its buffers grown in a burst\n\
         are given back after {} idle).",
        size(EMIT_QUEUE_BYTES_MAX),
        AGGREGATES_PER_STREAM_MAX,
        size(CONNECTION_STATE_BYTES),
        duration(IDLE_TRIM_MS)
    );
    text
}

/// The heading of the lines that count only with `storage`.
fn storage_heading(storage: Option<Storage>) -> &'static str {
    match storage {
        Some(Storage::Memory) => "with --storage memory:",
        Some(Storage::Disk) => "with --storage disk (the log files are on disk, not in this sum):",
        None => "",
    }
}

/// Appends `expression` and `what`, the description in a column of its own
/// (on the next lines when the expression reaches into it), wrapped.
fn push_line(text: &mut String, expression: &str, what: &str) {
    let mut current = expression.to_string();
    if current.len() + 1 > WHAT_COLUMN {
        *text += &current;
        *text += "\n";
        current.clear();
    }
    for word in what.split(' ') {
        if current.len() > WHAT_COLUMN && current.len() + 1 + word.len() > TEXT_WIDTH {
            *text += current.trim_end();
            *text += "\n";
            current.clear();
        }
        if current.len() < WHAT_COLUMN {
            current += &" ".repeat(WHAT_COLUMN - current.len());
        } else {
            current += " ";
        }
        current += word;
    }
    *text += &current;
    *text += "\n";
}

/// The peak-memory formula, term by term, in bytes for the whole process:
/// each field is the sum of its lines of [`FORMULA`].
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct MemoryBound {
    /// Busy ingest connections and refused connections being told why.
    pub connection_buffers: usize,
    /// Extra when connections each hold one line of the maximum size at once.
    pub long_line_worst_case: usize,
    /// Open batches and events in flight.
    pub batches_and_credits: usize,
    /// Partition logs: all of retention in memory mode; tail caches, indexes
    /// and write buffers on disk.
    pub retention: usize,
    /// Subscriber connections (counted from accept, process-wide): replies,
    /// cursors, buffers, and a connection being shed from the slot.
    pub subscribers: usize,
    /// Fixed per-shard costs: io_memory, placement table, the order a batch
    /// is applied in ([`Config::apply_order_bytes`]) and an allowance for
    /// code, stacks and allocator slack.
    pub fixed: usize,
    /// Mesh rings.
    pub mesh: usize,
    /// The admin port: request heads and the largest response per connection.
    pub admin: usize,
    /// Log segments kept ready.
    pub segment_pool: usize,
    /// Consumer groups and hold floors, and members' commit answers in flight.
    pub groups: usize,
    /// Sum of the terms above without the long-line worst case.
    pub total: usize,
    /// `total + long_line_worst_case`.
    pub total_worst_case: usize,
}

impl MemoryBound {
    /// The bytes of `term`.
    pub fn term(&self, term: Term) -> usize {
        match term {
            Term::ConnectionBuffers => self.connection_buffers,
            Term::LongLineWorstCase => self.long_line_worst_case,
            Term::BatchesAndCredits => self.batches_and_credits,
            Term::Retention => self.retention,
            Term::Subscribers => self.subscribers,
            Term::Fixed => self.fixed,
            Term::Mesh => self.mesh,
            Term::Admin => self.admin,
            Term::Groups => self.groups,
            Term::SegmentPool => self.segment_pool,
        }
    }
}

/// The file descriptors a configuration may hold at once, by use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct FdBudget {
    /// shards * connections_per_shard_max.
    pub connections: usize,
    /// 2 * shards * subscribers_per_shard_max: a slot holds its connection
    /// and, for a moment, the one shed from it at the limit.
    pub subscribers: usize,
    /// Refused connections being told why: shards * REFUSALS_IN_FLIGHT_MAX.
    pub refusals: usize,
    /// Admin connections and listener: ADMIN_CONNECTIONS_MAX + 1.
    pub admin: usize,
    /// shards * FDS_PER_SHARD_FIXED + FDS_PROCESS_FIXED.
    pub fixed: usize,
    /// Segment files with --storage disk: each partition's active segment,
    /// plus one read in flight per subscriber per owner shard.
    pub files: usize,
    /// --fds-reserved: anything else (index files while sealing, the lock).
    pub reserved: usize,
    /// The sum.
    pub total: usize,
}

impl std::fmt::Display for FdBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} = {} ingest connections + {} subscriber connections (two per slot) + {} refusals in flight + {} admin \
             + {} for shards and the process + {} segment files + {} reserved (--fds-reserved)",
            self.total,
            self.connections,
            self.subscribers,
            self.refusals,
            self.admin,
            self.fixed,
            self.files,
            self.reserved
        )
    }
}

impl Config {
    /// The peak-memory formula for this configuration: each term the sum of
    /// its lines of [`FORMULA`] that count with this storage. Every sum and
    /// product saturates at `usize::MAX`, so huge flags give a term of
    /// `usize::MAX`, which [`Config::validate`] refuses, never a wrapped small
    /// number.
    pub fn memory_bound(&self) -> MemoryBound {
        let term = |term: Term| {
            let lines = FORMULA.iter().filter(|line| line.term == term && line.counts_with(self.storage));
            lines.fold(0, |bytes: usize, line| bytes.saturating_add((line.bytes)(self)))
        };
        let mut bound = MemoryBound {
            connection_buffers: term(Term::ConnectionBuffers),
            long_line_worst_case: term(Term::LongLineWorstCase),
            batches_and_credits: term(Term::BatchesAndCredits),
            retention: term(Term::Retention),
            subscribers: term(Term::Subscribers),
            fixed: term(Term::Fixed),
            mesh: term(Term::Mesh),
            admin: term(Term::Admin),
            groups: term(Term::Groups),
            segment_pool: term(Term::SegmentPool),
            total: 0,
            total_worst_case: 0,
        };
        let counted = Term::ALL.into_iter().filter(|&term| term != Term::LongLineWorstCase);
        bound.total = counted.fold(0, |total: usize, term| total.saturating_add(bound.term(term)));
        bound.total_worst_case = bound.total.saturating_add(bound.long_line_worst_case);
        bound
    }

    /// Every term of the memory formula is computed saturating; one that
    /// reached `usize::MAX` did not fit, and the configuration is refused
    /// with the flags that term multiplies.
    pub(super) fn validate_memory_bound(&self) -> Result<(), ConfigError> {
        let bound = self.memory_bound();
        if let Some(term) = Term::ALL.into_iter().find(|&term| bound.term(term) == usize::MAX) {
            return Err(ConfigError::MemoryBoundOverflow { term: term.name(), flags: term.flags() });
        }
        if bound.total_worst_case == usize::MAX {
            return Err(ConfigError::MemoryBoundOverflow { term: "total", flags: "the terms' flags together" });
        }
        Ok(())
    }

    /// The scratch space `partition::apply::RecordOrder` keeps per shard to
    /// apply a batch partition by partition: [`APPLY_ORDER_BYTES_PER_RECORD`]
    /// per record of the largest batch (records are at least
    /// `BATCH_HEADER_SIZE + 1` bytes, a batch at most `batch_bytes` plus one
    /// record) and [`APPLY_ORDER_BYTES_PER_PARTITION`] per partition id.
    pub fn apply_order_bytes(&self, partitions: usize) -> usize {
        let records_max = self.batch_bytes / (BATCH_HEADER_SIZE + 1) + 2;
        sum(&[
            product(&[APPLY_ORDER_BYTES_PER_RECORD, records_max]),
            product(&[APPLY_ORDER_BYTES_PER_PARTITION, partitions + 1]),
        ])
    }

    /// The file descriptors this configuration may hold at once.
    pub fn fd_budget(&self) -> FdBudget {
        // Saturating, as the memory formula: a budget past usize::MAX is
        // refused by the start-up fd check as any budget over the limit.
        let shards = self.shard_count();
        let connections = connections(self);
        let subscriber_connections = subscribers(self);
        // A shed subscribe connection may linger beside its successor.
        let subscribers = product(&[2, subscriber_connections]);
        let refusals = shards * REFUSALS_IN_FLIGHT_MAX;
        let admin = ADMIN_CONNECTIONS_MAX + 1;
        let fixed = shards * FDS_PER_SHARD_FIXED + FDS_PROCESS_FIXED;
        let files = match self.storage {
            Storage::Disk => sum(&[self.partitions_max as usize, product(&[subscriber_connections, shards])]),
            Storage::Memory => 0,
        };
        let reserved = self.fds_reserved;
        let total = sum(&[connections, subscribers, refusals, admin, fixed, files, reserved]);
        FdBudget { connections, subscribers, refusals, admin, fixed, files, reserved, total }
    }
}

/// The product of `factors`, saturating at `usize::MAX`: the memory formula
/// and the fd budget multiply flags, and a configuration whose bound does not
/// fit in a `usize` is refused at start-up ([`Config::validate`]) instead of
/// wrapping to a small, wrong bound.
fn product(factors: &[usize]) -> usize {
    factors.iter().fold(1, |product: usize, &factor| product.saturating_mul(factor))
}

/// The sum of `terms`, saturating at `usize::MAX` (see [`product`]).
fn sum(terms: &[usize]) -> usize {
    terms.iter().fold(0, |sum: usize, &term| sum.saturating_add(term))
}

#[cfg(test)]
mod tests {
    use super::super::flags::parse::parse;
    use super::*;

    /// The defaults are valid and give the documented bound for 2 shards.
    #[test]
    fn defaults_validate_and_bound_memory() {
        let config = parse(&["--shards", "2"]);
        config.validate().unwrap();
        let bound = config.memory_bound();
        // Bounded by --partitions-max (1024): streams can be created up to it.
        assert_eq!(
            bound.retention,
            1024 * (256 * KIB + 64 * KIB + 1024 * MIB / 8192 + 4 * KIB)
                + 2 * 32 * MIB
                + 2 * (MIB + 4 * KIB + 16 * KIB)
                + 2 * 64 * KIB
                + 4 * 16 * MIB
        );
        // The write-ahead log's buffer is inside its term, whatever the line size.
        for line_size_max in ["1", "1000", "524288", "1048576", "16777216"] {
            let config = parse(&["--shards", "2", "--line-size-max", line_size_max, "--segment-bytes", "67108864"]);
            let term = (config.line_size_max + WAL_FRAME_SLACK_BYTES).max(2 * FRAME_BODY_BYTES_TARGET);
            assert!(config.wal_buffer_bytes() <= term + WAL_BUFFER_SLACK_BYTES, "--line-size-max {line_size_max}");
        }
        let memory = parse(&["--shards", "2", "--storage", "memory"]);
        assert_eq!(memory.memory_bound().retention, 1024 * 9 * MIB);
        // On disk each owner has 32 MiB in flight, 16 MiB from each of 2
        // sources; in memory 4 MiB per pair.
        assert_eq!((config.credit_window_bytes(), config.credit_window_batches()), (16 * MIB, 256));
        assert_eq!(bound.batches_and_credits, 4 * (64 * KIB + 16 * MIB));
        assert_eq!((memory.credit_window_bytes(), memory.credit_window_batches()), (4 * MIB, 64));
        assert_eq!(memory.memory_bound().batches_and_credits, 4 * (64 * KIB + 4 * MIB));
        let many = parse(&["--shards", "16"]);
        assert_eq!(many.credit_window_bytes(), 4 * MIB, "never below the memory default");
        let per_connection =
            256 * KIB + REPLY_BUFFER_BYTES_MAX + REPLY_LINE_SIZE_MAX + CONNECTION_STATE_BYTES + 2 * KIB;
        let syncs_in_flight = SYNCS_IN_FLIGHT_MAX * (2 * SYNC_IN_FLIGHT_BYTES_PER_SHARD + SYNC_IN_FLIGHT_BYTES);
        assert_eq!(
            bound.connection_buffers,
            2 * 4096 * (per_connection + syncs_in_flight) + 2 * 64 * CONNECTION_STATE_BYTES
        );
        assert_eq!(bound.subscribers, 2 * 64 * (3 * 256 * KIB + 2 * 8 * KIB + 1024 * 72 + SUBSCRIBER_STATE_BYTES));
        assert_eq!(bound.admin, 16 * (32 * KIB + 1024 * 256 + 2 * 16 * KIB));
        assert_eq!(bound.mesh, 4 * config.mesh_channel_frames() * MESH_FRAME_BYTES_MAX);
        assert!(bound.total_worst_case > bound.total);
        let terms = [
            bound.connection_buffers,
            bound.batches_and_credits,
            bound.retention,
            bound.subscribers,
            bound.fixed,
            bound.mesh,
            bound.admin,
            bound.groups,
            bound.segment_pool,
        ];
        assert_eq!(bound.total, terms.iter().sum::<usize>(), "the total is the sum of its terms");
        assert_eq!(bound.segment_pool, 0, "no pool by default");
        let pooled = parse(&["--shards", "2", "--log-prefault-bytes", "1048576"]);
        assert_eq!(pooled.memory_bound().segment_pool, 2 * MIB);
    }

    /// The fd budget counts every connection the limits admit, the fixed
    /// costs and the reserve, and says so in one line.
    #[test]
    fn fd_budget_counts_every_use() {
        let config = parse(&["--shards", "2", "--connections-per-shard-max", "100", "--fds-reserved", "7"]);
        let budget = config.fd_budget();
        assert_eq!((budget.connections, budget.subscribers, budget.reserved), (200, 256, 7));
        let files = 1024 + 128 * 2;
        assert_eq!(budget.files, files, "with disk storage: active segments and reads in flight");
        assert_eq!(
            budget.total,
            200 + 256 + 2 * REFUSALS_IN_FLIGHT_MAX + 17 + 2 * FDS_PER_SHARD_FIXED + FDS_PROCESS_FIXED + files + 7
        );
        assert!(budget.to_string().starts_with(&format!("{} = 200 ingest connections", budget.total)));
    }

    /// Size flags whose memory term does not fit in a usize (u64::MAX, 2^63
    /// and products of large ones) are refused at start-up naming the term,
    /// instead of wrapping to a small bound; the sums saturate, never wrap.
    #[test]
    fn a_memory_bound_that_overflows_is_refused_with_its_term() {
        let huge = [u64::MAX, 1 << 63];
        for value in huge.map(|value| value.to_string()) {
            let cases = [
                (vec!["--connections-per-shard-max", &value], "connection_buffers"),
                (vec!["--subscribers-per-shard-max", &value], "subscribers"),
                (vec!["--fetch-bytes-max", &value], "subscribers"),
                (vec!["--groups-max", &value], "groups"),
                (vec!["--log-prefault-bytes", &value], "segment_pool"),
                (vec!["--io-memory-bytes", &value], "fixed"),
                (vec!["--tail-cache-bytes", &value], "retention"),
                (vec!["--credit-window-batches", &value], "mesh"),
            ];
            for (flags, term) in cases {
                let config = parse(&[&["--shards", "4"], flags.as_slice()].concat());
                let bound = config.memory_bound();
                assert_eq!(bound.total_worst_case, usize::MAX, "{flags:?} saturates the total");
                let error = config.validate().unwrap_err();
                assert!(
                    matches!(error, ConfigError::MemoryBoundOverflow { term: named, .. } if named == term),
                    "{flags:?}: {error}"
                );
                assert!(error.to_string().contains(flags[0]), "names the flag: {error}");
            }
        }
        // 2^40 connections of 2^24 bytes each: each factor fits, the product does not.
        let product = parse(&[
            "--shards",
            "2",
            "--connections-per-shard-max",
            "1099511627776",
            "--read-buffer-bytes",
            "16777216",
        ]);
        assert!(matches!(product.validate(), Err(ConfigError::MemoryBoundOverflow { term: "connection_buffers", .. })));
        let budget = parse(&["--shards", "2", "--subscribers-per-shard-max", &u64::MAX.to_string()]).fd_budget();
        assert_eq!(budget.total, usize::MAX, "the fd budget saturates, and the fd check refuses it");
    }

    /// Every printed expression of the formula, evaluated as a reader would
    /// (flags' values, integer arithmetic), gives the bytes the computation
    /// counts for its line, for configurations that make every flag count:
    /// the text and `memory_bound` cannot disagree, in a number or a shape.
    #[test]
    fn the_printed_formula_evaluates_to_the_computed_bytes() {
        let odd = [
            "--partitions-max",
            "7",
            "--partitions",
            "7",
            "--connections-per-shard-max",
            "11",
            "--subscribers-per-shard-max",
            "3",
            "--read-buffer-bytes",
            "3000000",
            "--key-size-max",
            "700000",
            "--fetch-bytes-max",
            "12345",
            "--batch-bytes",
            "65537",
            "--credit-window-bytes",
            "1234567",
            "--credit-window-batches",
            "77",
            "--retention-bytes",
            "100001",
            "--segment-bytes",
            "4099",
            "--tail-cache-bytes",
            "21",
            "--fsync-pending-bytes-max",
            "333",
            "--io-memory-bytes",
            "99999",
            "--log-prefault-bytes",
            "4097",
            "--groups-max",
            "5",
        ];
        let mut configurations = Vec::new();
        for shards in ["1", "2", "3", "5"] {
            for storage in ["disk", "memory"] {
                configurations.push(parse(&["--shards", shards, "--storage", storage]));
                configurations.push(parse(&[&["--shards", shards, "--storage", storage][..], &odd].concat()));
            }
        }
        configurations.push(parse(&["--shards", "4", "--tail-cache-bytes", "1000000", "--retention-bytes", "5"]));
        configurations.push(parse(&["--shards", "2", "--cluster", "127.0.0.1:9404"]));
        for config in &configurations {
            let bound = config.memory_bound();
            for term in Term::ALL {
                let mut printed = 0;
                for line in FORMULA.iter().filter(|line| line.term == term && line.counts_with(config.storage)) {
                    let expression = (line.expression)();
                    let value = evaluate(&expression, config);
                    assert_eq!(value, (line.bytes)(config) as u128, "{expression} under {config:?}");
                    printed += value;
                }
                assert_eq!(printed, bound.term(term) as u128, "{} under {config:?}", term.name());
            }
        }
    }

    /// The table covers every term of `MemoryBound` (the fields `/stats`
    /// shows), each term's name is its field's, and the printed text holds
    /// every line's expression.
    #[test]
    fn the_formula_covers_every_term_and_prints_every_line() {
        let config = parse(&["--shards", "2"]);
        let fields = serde_json::to_value(config.memory_bound()).unwrap();
        let fields = fields.as_object().unwrap();
        let names: Vec<&str> = Term::ALL.iter().map(|term| term.name()).collect();
        let mut expected: Vec<&str> =
            fields.keys().map(String::as_str).filter(|name| !name.starts_with("total")).collect();
        expected.sort_unstable();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, expected, "Term::ALL is MemoryBound's terms");
        for term in Term::ALL {
            assert!(FORMULA.iter().any(|line| line.term == term), "{} has no line", term.name());
            assert_eq!(fields[term.name()].as_u64(), Some(config.memory_bound().term(term) as u64));
        }
        let text = memory_formula_text();
        for line in FORMULA {
            let expression = (line.expression)();
            assert_eq!(text.matches(&expression).count(), 1, "{expression} is printed once in:\n{text}");
        }
        assert!(text.lines().all(|line| line.len() <= 100), "the text fits 100 columns:\n{text}");
    }

    /// The README's "Limits and memory" formula block is the text `spate
    /// serve --help` prints, character for character.
    #[test]
    fn the_readme_shows_the_printed_formula() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        let section = &readme[readme.find("\n## Limits and memory\n").expect("the README has the section")..];
        let start = section.find("\n```\n").expect("the section has a code block") + "\n```\n".len();
        let end = start + section[start..].find("\n```\n").expect("the block ends");
        let text = memory_formula_text();
        assert!(
            section[start..end] == text,
            "README.md's \"Limits and memory\" block differs from `spate serve --help`; it should read:\n{text}"
        );
    }

    /// Evaluates a printed expression under `config`: names are the flags'
    /// values (or `S`, `P`, `C`, `N`), `KiB`/`MiB` scale the number before
    /// them, `/` rounds down, a difference saturates at 0.
    fn evaluate(expression: &str, config: &Config) -> u128 {
        let mut tokens = Vec::new();
        let mut chars = expression.chars().peekable();
        while let Some(&next) = chars.peek() {
            if next.is_whitespace() {
                chars.next();
            } else if next.is_alphanumeric() || next == '_' {
                let mut token = String::new();
                while let Some(&next) = chars.peek().filter(|next| next.is_alphanumeric() || **next == '_') {
                    token.push(next);
                    chars.next();
                }
                tokens.push(token);
            } else {
                tokens.push(next.to_string());
                chars.next();
            }
        }
        let mut parser = Evaluator { tokens, position: 0, config };
        let value = parser.sum();
        assert_eq!(
            parser.position,
            parser.tokens.len(),
            "{expression}: trailing {:?}",
            &parser.tokens[parser.position..]
        );
        value
    }

    struct Evaluator<'a> {
        tokens: Vec<String>,
        position: usize,
        config: &'a Config,
    }

    impl Evaluator<'_> {
        fn next_is(&mut self, token: &str) -> bool {
            let found = self.tokens.get(self.position).is_some_and(|next| next == token);
            self.position += usize::from(found);
            found
        }

        fn sum(&mut self) -> u128 {
            let mut value = self.product();
            loop {
                if self.next_is("+") {
                    value += self.product();
                } else if self.next_is("-") {
                    value = value.saturating_sub(self.product());
                } else {
                    return value;
                }
            }
        }

        fn product(&mut self) -> u128 {
            let mut value = self.factor();
            loop {
                if self.next_is("*") {
                    value *= self.factor();
                } else if self.next_is("/") {
                    value /= self.factor();
                } else {
                    return value;
                }
            }
        }

        fn factor(&mut self) -> u128 {
            if self.next_is("(") {
                let value = self.sum();
                assert!(self.next_is(")"), "unbalanced parentheses");
                return value;
            }
            if self.next_is("max") {
                assert!(self.next_is("("));
                let first = self.sum();
                assert!(self.next_is(","));
                let second = self.sum();
                assert!(self.next_is(")"));
                return first.max(second);
            }
            let token = self.tokens[self.position].clone();
            self.position += 1;
            if let Ok(number) = token.parse::<u128>() {
                let unit = if self.next_is("KiB") {
                    KIB
                } else if self.next_is("MiB") {
                    MIB
                } else {
                    1
                };
                return number * unit as u128;
            }
            self.value(&token)
        }

        fn value(&self, name: &str) -> u128 {
            let config = self.config;
            let shards = config.shard_count();
            let value = match name {
                "S" => shards,
                "P" => config.partitions_max as usize,
                "C" => shards * config.connections_per_shard_max,
                "N" => shards * config.subscribers_per_shard_max,
                "read_buffer_bytes" => config.read_buffer_bytes,
                "key_size_max" => config.key_size_max,
                "line_size_max" => config.line_size_max,
                "kafka_request_size_max" => config.kafka_request_size_max,
                "fetch_bytes_max" => config.fetch_bytes_max,
                "batch_bytes" => config.batch_bytes,
                "credit_window_bytes" => config.credit_window_bytes(),
                "credit_window_batches" => config.credit_window_batches(),
                "subscribers_per_shard_max" => config.subscribers_per_shard_max,
                "retention_bytes" => config.retention_bytes(),
                "segment_bytes" => config.segment_bytes(),
                "tail_cache_bytes" => config.tail_cache_bytes,
                "fsync_pending_bytes_max" => config.fsync_pending_bytes_max,
                "io_memory_bytes" => config.io_memory_bytes,
                "log_prefault_bytes" => config.log_prefault_bytes,
                "groups_max" => config.groups_max,
                "cluster" => usize::from(config.cluster_address().is_some()),
                "raft_log_bytes_max" => usize::try_from(config.raft_log_bytes_max).unwrap_or(usize::MAX),
                other => panic!("the formula names {other:?}, which is no flag this test knows"),
            };
            value as u128
        }
    }
}
