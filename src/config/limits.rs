//! The limits of a server: constants only, each with its unit and what it
//! costs in memory, tied together by compile-time asserts.
//!
//! This file imports nothing from the crate, so any module may use it
//! without an import cycle; sizes of types that the memory formula counts
//! (a mesh frame, a placement entry) are budgets here, and the type's own
//! module asserts at compile time that it fits.
//!
//! Where a limit lives:
//! - here, when it is a term of the memory formula or the fd budget
//!   ([`super::memory`]), when several modules use it, or when only the
//!   flags use it (a default, a range);
//! - with its owner, when one module alone uses it and the memory formula
//!   does not count it (the keepalive of `net::socket`, the sweep interval of
//!   `net::registry`, the retention check of `shard::commit`, ...).
//!
//! Never both: a limit has one definition, and a module that used to own
//! one that moved here re-exports it (`pub use`) rather than define it
//! again. What a field of a wire or disk format can hold (a `u16` key size,
//! `u32` positions in a segment) is a fact of that format, not a limit: it
//! lives with the format (`protocol::record`, `storage::index`), and the
//! flags are checked against it. Names put the unit and the qualifier last
//! (`_bytes_max`, `_ms`).

/// One kibibyte, in bytes.
pub const KIB: usize = 1024;
/// One mebibyte, in bytes.
pub const MIB: usize = 1024 * KIB;

// ---------------------------------------------------------------------------
// Shards, partitions, streams.

/// Most shards a server runs (shard ids are `u16` on the wire; the
/// balancer's view holds more, the simulator's scale). Every per-shard term
/// of the memory formula is multiplied by the shard count, some twice.
pub const SHARD_COUNT_MAX: usize = 256;
const _: () = assert!(SHARD_COUNT_MAX <= u16::MAX as usize);
/// Most partitions of all streams together (partition ids are `u32` on the
/// wire; 64 Ki keeps the per-shard placement table at 512 KiB).
pub const PARTITION_COUNT_MAX: u32 = 65_536;
const _: () = assert!(PARTITION_COUNT_MAX as usize * PLACEMENT_ENTRY_BYTES <= 512 * KIB);
/// Bytes of one placement-table entry (owner and epoch), on every shard for
/// every partition: the memory formula's `fixed` term counts `P` of them
/// per shard. `partition::Placement` asserts that it fits.
pub const PLACEMENT_ENTRY_BYTES: usize = 8;
/// Longest stream name, in bytes: a directory name under `--data-dir`.
pub const STREAM_NAME_SIZE_MAX: usize = 64;
/// The default longest key, in bytes (`--key-size-max`; records hold keys
/// of up to a `u16`). Long enough for ILP series keys with a few tags.
pub const KEY_SIZE_MAX: usize = 1024;
const _: () = assert!(KEY_SIZE_MAX <= u16::MAX as usize);

// ---------------------------------------------------------------------------
// Partition logs and storage.

/// Retention per partition on disk, by default: 1 GiB of segment files
/// (costing [`INDEX_ENTRY_BYTES`] of RAM per [`INDEX_INTERVAL_BYTES`]).
pub const RETENTION_BYTES_DISK_DEFAULT: usize = 1024 * MIB;
/// Retention per partition in memory, by default: all of it is RAM.
pub const RETENTION_BYTES_MEMORY_DEFAULT: usize = 8 * MIB;
/// Segment file size on disk, by default.
pub const SEGMENT_BYTES_DISK_DEFAULT: usize = 64 * MIB;
/// In-memory segment size, by default: one segment being filled costs this
/// per partition on top of its retention.
pub const SEGMENT_BYTES_MEMORY_DEFAULT: usize = MIB;
// Retention drops whole segments: it holds at least one.
const _: () = assert!(RETENTION_BYTES_DISK_DEFAULT >= SEGMENT_BYTES_DISK_DEFAULT);
const _: () = assert!(RETENTION_BYTES_MEMORY_DEFAULT >= SEGMENT_BYTES_MEMORY_DEFAULT);
/// The longest age retention a stream (or `--retention-ms`) may ask for, in
/// ms: 100 years (36 500 days). Longer means
/// nothing a `0` ("keep regardless of age") does not say, and values near
/// `u64::MAX` once wrapped the age check and deleted every sealed segment at
/// once. A catalog written before this limit may hold a larger value: the
/// age check saturates, so it keeps segments as this maximum would.
pub const RETENTION_MS_MAX: u64 = 36_500 * 86_400_000;
/// One offset-index entry is kept in memory per this many bytes of segment
/// file: 50 GB of log costs 6 MiB of index.
pub const INDEX_INTERVAL_BYTES: u32 = 64 * KIB as u32;
/// Bytes of one offset-index entry in memory (`storage::index` asserts it).
pub const INDEX_ENTRY_BYTES: usize = 8;
/// A disk partition's own state besides its tail cache and index (its log
/// and file structs, the active segment's metadata), in bytes: an allowance
/// per partition in the memory formula, not a measured bound.
pub const DISK_PARTITION_ALLOWANCE_BYTES: usize = 4 * KIB;
/// Write buffers of a partition that may wait for an fdatasync before the
/// committer must sync it (bounded overall by --fsync-pending-bytes-max).
pub const WRITER_UNSYNCED_BUFFERS_MAX: usize = 8;
/// Largest body of a frame the committer writes, in bytes (a record larger
/// than this gets a frame of its own): a reader fetches whole frames, so
/// this bounds what one read fetches beyond its budget, and a write buffer
/// holds two of them.
pub const FRAME_BODY_BYTES_TARGET: usize = 256 * KIB;
/// The block every DMA write is aligned to and sized in
/// ([`crate::storage::segment::BLOCK_SIZE`]).
pub const WRITE_BLOCK_BYTES: usize = 4096;
/// Default bytes of each shard's write-ahead log (`--wal-bytes-max`).
pub const WAL_BYTES_MAX_DEFAULT: usize = 256 * MIB;
/// How often a failing storage write or fdatasync is retried, in ms.
pub const STORAGE_RETRY_MS: u64 = 100;

// ---------------------------------------------------------------------------
// Kafka.

/// (producer id, partition) entries the idempotent-producer table holds
/// (`kafka::producers`), process-wide; a full table evicts its least
/// recently used eighth. Each costs about [`KAFKA_PRODUCER_STATE_BYTES`]: a
/// term of the memory formula.
pub const KAFKA_PRODUCER_STATES_MAX: usize = 16_384;
/// One entry of the producer table: its key, epoch and sequence, the last
/// five batches' sequences, and the hash map's own overhead.
pub const KAFKA_PRODUCER_STATE_BYTES: usize = 160;
/// Members of Kafka consumer groups, all groups of the process together
/// (`kafka::groups`); a join past it gets GROUP_MAX_SIZE_REACHED.
pub const KAFKA_GROUP_MEMBERS_MAX: usize = 1024;
/// The most a Kafka group member may hold: its protocols' metadata (its
/// subscription, as the leader reads it) and its assignment. A consumer's
/// are a few hundred bytes; a join or an assignment past it gets
/// INVALID_REQUEST.
pub const KAFKA_MEMBER_BYTES_MAX: usize = 8 * KIB;
/// One Kafka group member besides its metadata and assignment: its ids,
/// timeouts and the waiting requests' channels.
pub const KAFKA_MEMBER_STATE_BYTES: usize = 512;
/// Produce requests one Kafka connection may have routed and not yet
/// answered (Kafka clients keep up to 5 in flight: librdkafka's and the Java
/// client's `max.in.flight` for idempotent producers). The connection reads
/// and routes its next requests while earlier ones wait for their owners,
/// and answers in request order; at this many it stops reading its socket
/// until the oldest is answered (backpressure, as for `#SYNC`s).
pub const KAFKA_PRODUCES_IN_FLIGHT_MAX: usize = 8;
/// Partition entries (a topic's partition in a Produce request) one Kafka
/// connection may hold in flight over all its Produce requests: past it
/// the connection waits for the oldest answer before routing another (one
/// request with more is still served, alone, as when nothing is
/// pipelined). Each costs [`KAFKA_PRODUCE_ENTRY_BYTES`]: a term of the
/// memory formula.
pub const KAFKA_PRODUCE_ENTRIES_IN_FLIGHT_MAX: usize = 1024;
/// One partition entry of a Produce in flight: what its answer needs, the
/// cells its first and last record's offsets are answered into, their
/// waiters in the shard's ingress and their asks in the owner's batch.
pub const KAFKA_PRODUCE_ENTRY_BYTES: usize = 256;
/// Records of one Produce partition entry a Kafka connection keeps encoded
/// between checking and routing them, so that each is decoded and encoded
/// once and routed in runs (`kafka::batch::EntryCheck`); a larger entry is
/// decoded again as it is routed. Each costs its end's position
/// (`kafka::batch::STAGED_RECORD_BYTES`, 4) besides its bytes.
pub const KAFKA_STAGED_RECORDS_MAX: usize = 4096;
/// Bytes of encoded records a Kafka connection stages for one partition
/// entry (see [`KAFKA_STAGED_RECORDS_MAX`]): 256 KiB, a term of the memory
/// formula. Entries of the Java client (`batch.size` 16 KiB) and of
/// librdkafka under a `linger.ms` of a few ms fit; a larger one is walked
/// twice instead.
pub const KAFKA_STAGED_BYTES_MAX: usize = 256 << 10;

// ---------------------------------------------------------------------------
// Ingest connections.

/// Reply bytes an ingest connection buffers (`ERR`/`OK` lines) before it
/// writes them out and stops parsing until they are written, so a flood of
/// bad lines from a producer that never reads is bounded too. Costs up to
/// this much per busy connection (a term of the memory formula).
pub const REPLY_BUFFER_BYTES_MAX: usize = 64 * KIB;
/// Longest `#SYNC`/`#PING` token, in bytes: the token is echoed in the `OK`
/// reply, so it bounds a reply line. A longer one gets `ERR token_too_long`.
pub const CONTROL_TOKEN_SIZE_MAX: usize = 256;
/// Longest reply line the server writes to a producer (an `OK` with the
/// longest token, or an `ERR` with its detail), in bytes. The reply buffer is
/// written out before a line could push it past [`REPLY_BUFFER_BYTES_MAX`],
/// so a busy connection holds up to the sum of the two.
pub const REPLY_LINE_SIZE_MAX: usize = 128 + CONTROL_TOKEN_SIZE_MAX;
const _: () = assert!(REPLY_LINE_SIZE_MAX <= REPLY_BUFFER_BYTES_MAX);
/// `#SYNC`s one ingest connection may have in flight (read, not yet
/// answered). A connection keeps reading, routing and answering other lines
/// while its SYNCs wait for durability; at this many it stops reading its
/// socket until the oldest is answered (backpressure, not an error). Each
/// costs [`SYNC_IN_FLIGHT_BYTES_PER_SHARD`] per shard plus
/// [`SYNC_IN_FLIGHT_BYTES`] (a term of the memory formula), allocated on a
/// connection's first `#SYNC` and given back when it idles.
pub const SYNCS_IN_FLIGHT_MAX: usize = 64;
/// Per `#SYNC` in flight and shard: the batch sequence it waits for.
pub const SYNC_IN_FLIGHT_BYTES_PER_SHARD: usize = 8;
/// Per `#SYNC` in flight: where its `OK` line starts among the replies.
pub const SYNC_IN_FLIGHT_BYTES: usize = 8;
/// Task state of one connection besides its buffers (its future, registry
/// entry and per-owner flags), in bytes: an allowance per connection in the
/// memory formula, as is [`SUBSCRIBER_STATE_BYTES`] for a subscriber.
pub const CONNECTION_STATE_BYTES: usize = 2 * KIB;
/// The largest read after which a connection's open batches go soon (see
/// `shard::ingress`) when the read drained its socket: a small read that
/// empties the socket means the producer trickles, so waiting for the flush
/// timer would only add latency. After a larger one batches fill quickly
/// anyway and keep the flush timer, so that a peak-rate producer still sends
/// full batches, not one small frame per read.
pub const FLUSH_SOON_READ_BYTES_MAX: usize = 16 * KIB;
/// An ingest connection that has waited this long for bytes gives its grown
/// read buffer back (down to --read-buffer-initial-bytes) and its reply
/// buffer, in ms: after it an idle connection costs its initial buffer and
/// [`CONNECTION_STATE_BYTES`].
pub const IDLE_TRIM_MS: u64 = 1000;
/// Connections refused at a limit that are being told why at once, per
/// shard; past this, a refused connection is closed without the `ERR` line.
/// Each holds a file descriptor (the fd budget) and
/// [`CONNECTION_STATE_BYTES`] (the memory formula) for at most the goodbye
/// write timeout of `net::socket`.
pub const REFUSALS_IN_FLIGHT_MAX: usize = 64;
/// Accept back-off while the process is out of file descriptors, in ms: the
/// first sleep, doubled per failure up to [`ACCEPT_BACKOFF_MS_MAX`] (ingest,
/// subscribe and admin listeners alike).
pub const ACCEPT_BACKOFF_MS_MIN: u64 = 5;
/// The longest accept back-off, in ms.
pub const ACCEPT_BACKOFF_MS_MAX: u64 = 200;
const _: () = assert!(0 < ACCEPT_BACKOFF_MS_MIN && ACCEPT_BACKOFF_MS_MIN <= ACCEPT_BACKOFF_MS_MAX);

// ---------------------------------------------------------------------------
// Batches, credits and the mesh.

/// The credit window per (source, owner) pair with memory storage, in bytes:
/// the memory formula counts shards² of them (events in flight).
pub const CREDIT_WINDOW_BYTES_MEMORY: usize = 4 * MIB;
/// With disk storage: what all sources together may have in flight to one
/// owner, in bytes (split evenly: the window per pair is this / shards, and
/// never below [`CREDIT_WINDOW_BYTES_MEMORY`]).
pub const CREDIT_WINDOW_BYTES_PER_OWNER_DISK: usize = 32 * MIB;
/// The fewest batches in flight per (source, owner) pair by default: each is
/// a slot of a mesh ring ([`MESH_FRAME_BYTES_MAX`]).
pub const CREDIT_WINDOW_BATCHES_MIN: usize = 64;
/// Applied batches whose credit grants an owner may hold for one source, to
/// send them in one frame (`shard::grants`). Below the fewest batches in
/// flight, so that a source never waits on a grant held back.
pub const GRANT_BATCHES_HELD_MAX: usize = 8;
const _: () = assert!(GRANT_BATCHES_HELD_MAX < CREDIT_WINDOW_BATCHES_MIN);
/// Batch buffers a source keeps for reuse per destination beyond the one
/// open batch: up to `shards * this * batch_bytes` per shard, inside the
/// credit term (a spare buffer is one whose credits came back). As many as
/// one merged grant returns, so steady state allocates no batch buffers.
pub const BATCH_SPARE_BUFFERS_MAX: usize = GRANT_BATCHES_HELD_MAX;
/// Frames a mesh channel holds beyond the data batches credits allow:
/// credit grants, subscriber fetches and replies, load reports and control.
/// Each is a slot of [`MESH_FRAME_BYTES_MAX`] in the ring.
pub const MESH_CONTROL_SLOTS: usize = 256;
/// Bytes one frame takes in a mesh ring (frames move by value; batches and
/// replies live on the heap): the mesh term of the memory formula counts
/// every slot of every ring at this size. `shard::frame` asserts that a
/// `MeshFrame` fits. (88, not 80, since a credit grant carries a pointer to
/// the offset asks it answers: `routing::OffsetAsks`.)
pub const MESH_FRAME_BYTES_MAX: usize = 88;
/// How long a thief waits for an answer to a steal request before it may ask
/// again (an answer is a refusal or the placement update of a migration), in
/// ms. The simulator runs the same rule with the same timeout.
pub const STEAL_REQUEST_TIMEOUT_MS: u64 = 1000;

// ---------------------------------------------------------------------------
// Subscribers and consumer groups.

/// Longest first line on the subscribe port (`SUB` or `GROUP`), in bytes.
pub const SUBSCRIBE_REQUEST_SIZE_MAX: usize = 1024;
/// Longest line a group member sends (a `GROUP` line with two longest names
/// and both options is about 150 bytes; this leaves room for whitespace).
/// Its first line is the subscribe port's first line, so it fits that limit.
pub const GROUP_REQUEST_SIZE_MAX: usize = 1024;
const _: () = assert!(GROUP_REQUEST_SIZE_MAX <= SUBSCRIBE_REQUEST_SIZE_MAX);
/// Replies a standing fetch may have in flight from one owner to one
/// subscriber (`partition::fetch`); its bytes in flight stay within
/// `--fetch-bytes-max` (the window), so this bounds the replies'
/// bookkeeping, not their data.
pub const STANDING_FETCH_REPLIES_MAX: u32 = 32;
/// The bookkeeping of one subscriber's standing-fetch replies from one
/// owner, in bytes: [`STANDING_FETCH_REPLIES_MAX`] replies of at most 256
/// bytes each (their data is in the fetch budget; compile-time checked in
/// `partition::fetch`).
pub const STANDING_REPLIES_STATE_BYTES: usize = STANDING_FETCH_REPLIES_MAX as usize * 256;
/// Inbox slots a subscriber keeps free beyond its owners' windows, for the
/// notice that its stream was deleted (`shard::subscriptions`).
pub const DELETION_NOTICE_SLOTS: usize = 1;
/// A subscriber's cursor state per partition it reads, in bytes: its cursor,
/// the entry in a fetch request and in a fetch reply (compile-time checked
/// in `subscribe::session`). A `SUB *` costs this times `P`.
pub const SUBSCRIBER_BYTES_PER_PARTITION: usize = 72;
/// The shutdown notice (`CLOSING ...`, one entry per partition) is written in
/// chunks of about this size, in bytes, so `SUB *` over 64 Ki partitions does
/// not build a 1 MiB line per subscriber at once.
pub const CLOSING_NOTICE_CHUNK_BYTES: usize = 16 * KIB;
/// A subscribe connection's request line buffer, at most, in bytes: the
/// request ([`SUBSCRIBE_REQUEST_SIZE_MAX`]) plus one read past it, grown by
/// doubling.
pub const SUBSCRIBE_REQUEST_BUFFER_BYTES_MAX: usize = 2 * KIB;
const _: () = assert!(2 * SUBSCRIBE_REQUEST_SIZE_MAX <= SUBSCRIBE_REQUEST_BUFFER_BYTES_MAX);
/// A subscribe connection being shed at the limit, which may linger next to
/// the newcomer that took its slot over (a slot holds at most one such) for
/// up to a sweep interval and a goodbye, in bytes: its request line buffer
/// and its task state.
pub const SHED_CONNECTION_BYTES: usize = SUBSCRIBE_REQUEST_BUFFER_BYTES_MAX + CONNECTION_STATE_BYTES;
/// A subscriber's fixed state besides its fetch replies and cursors, in
/// bytes: request line buffer, inbox, per-owner flags (4 KiB), the closing
/// notice chunk, and the connection that may be being shed from its slot.
pub const SUBSCRIBER_STATE_BYTES: usize = 4 * KIB + CLOSING_NOTICE_CHUNK_BYTES + SHED_CONNECTION_BYTES;
/// One consumer group's fixed state on its coordinator (names, members'
/// entries, bookkeeping), in bytes, for the memory formula.
pub const GROUP_STATE_BYTES: usize = 256;
/// A group's state per partition of its stream on its coordinator, in bytes:
/// holder, revoking flag, committed offset (and its copy in the offsets file
/// being written).
pub const GROUP_BYTES_PER_PARTITION: usize = 40;
/// A `hold` group's floor for one partition, in bytes, kept on every shard
/// (so the memory formula counts it per group, partition and shard).
pub const GROUP_HOLD_FLOOR_BYTES: usize = 8;
/// Commits a group member may have in flight (sent, not yet acknowledged);
/// its connection's reader waits past this, so a member's inbox is bounded.
pub const COMMITS_IN_FLIGHT_MAX: usize = 256;
/// One commit acknowledgement in flight (the coordinator's entry and the
/// member's inbox event), in bytes.
pub const GROUP_ACK_BYTES: usize = 64;

// ---------------------------------------------------------------------------
// Keyed aggregates (not in the memory bound, which cannot know what will be
// declared; the formula's text names their cost beside it).

/// Aggregates declared on one stream, each costing its keys on every
/// partition of the stream.
pub const AGGREGATES_PER_STREAM_MAX: usize = 16;
/// Keys one aggregate tracks on one partition, by default
/// (`--aggregate-keys-max`). Memory: this times `aggregate::key_cost_bytes`
/// per aggregate per partition, e.g. 16384 keys of 32 bytes in tumbling
/// windows without lateness (one open window per key) cost at most 16384 ×
/// 322 bytes, 5.0 MiB (keys of up to 22 bytes are stored in the slot: their
/// bytes cost nothing more).
pub const KEYS_PER_AGGREGATE_MAX: u32 = 16_384;
/// Largest `n` of a top-N query (a response holds `n` keys).
pub const TOP_N_MAX: usize = 1000;
/// Bytes of closed windows a shard's emit queue holds before its applier
/// pauses (a window is its key, about 200 bytes of JSON and 8 of framing).
pub const EMIT_QUEUE_BYTES_MAX: usize = 16 * MIB;

// ---------------------------------------------------------------------------
// Per shard and per process.

/// Bytes of fixed per-shard cost the formula allows for code, stacks, task
/// state and allocator slack (an allowance, not a measured bound).
pub const SHARD_FIXED_ALLOWANCE_BYTES: usize = 64 * MIB;
/// Bytes a shard keeps per record of its largest batch to apply the batch
/// partition by partition (`partition::apply::RecordOrder`, which asserts
/// it): the record's partition and position, and its place in the order.
pub const APPLY_ORDER_BYTES_PER_RECORD: usize = 12;
/// Bytes the same order keeps per partition id (a count).
pub const APPLY_ORDER_BYTES_PER_PARTITION: usize = 4;
/// File descriptors a shard holds besides connections: its io_uring rings
/// and eventfds (4 measured with glommio 0.9) and its two listeners, with
/// room; and with disk storage its write-ahead log (4 files and the
/// checkpoint) and the segment files a checkpoint syncs at once (8).
pub const FDS_PER_SHARD_FIXED: usize = 32;
/// File descriptors the process holds besides shards and connections: stdio,
/// the signal pipe, the admin runtime and listener, /proc reads at start.
pub const FDS_PROCESS_FIXED: usize = 64;

// ---------------------------------------------------------------------------
// The admin port.

/// Admin HTTP connections served at once; further ones wait in the listen
/// backlog until one closes. Each holds a file descriptor, two request-head
/// buffers and one response (the memory formula's admin term).
pub const ADMIN_CONNECTIONS_MAX: usize = 16;
/// Largest admin request head (request line and headers), in bytes (hyper's
/// read buffer limit: a longer head gets `431` and the connection closes).
pub const ADMIN_HEADER_BYTES_MAX: usize = 16 * KIB;
/// Allowance per partition for the largest admin response, in bytes
/// (`/partitions` is about 190 bytes of JSON per partition): each open
/// admin connection may hold one.
pub const ADMIN_RESPONSE_BYTES_PER_PARTITION: usize = 256;
/// Allowance per shard for the largest admin response, in bytes (`/metrics`
/// and `/stats` take about 6 KiB per shard).
pub const ADMIN_RESPONSE_BYTES_PER_SHARD: usize = 16 * KIB;

// ---------------------------------------------------------------------------
// The cluster thread (membership and load gossip).

/// Members a node keeps track of at most (foca's member list and the load
/// table): a cluster is a handful to a few dozen nodes; the bound keeps a
/// flood of forged identities from growing memory (datagrams are dropped
/// while it is reached, until down members expire).
pub const CLUSTER_MEMBERS_MAX: usize = 256;
/// Budget per known member, in bytes: its identity (about 120 bytes) in
/// foca's member list and in a queued update, its load broadcast queued and
/// in the load table (about 100 bytes each), one or two timers, map slack.
pub const CLUSTER_MEMBER_BYTES: usize = 2 * KIB;
/// Largest gossip datagram, sent or accepted, in bytes: under a LAN's MTU,
/// so never fragmented.
pub const CLUSTER_DATAGRAM_BYTES_MAX: usize = 1400;
/// Gossip datagrams waiting to be sent at most (a probe round queues a
/// few; more are dropped and counted, which SWIM tolerates).
pub const CLUSTER_OUTBOX_DATAGRAMS_MAX: usize = 64;
/// The cluster thread's own memory: its executor's io_uring rings and 64
/// KiB of registered buffers, its stack, the receive buffer.
pub const CLUSTER_THREAD_BYTES: usize = MIB;

// ---------------------------------------------------------------------------
// The internode transport (framed, credit-bounded TCP between nodes).

/// Peers the transport keeps a connection to (and accepts one from) at once:
/// a cluster is a handful to a few dozen nodes, and each peer costs
/// [`TRANSPORT_PEER_BYTES`] at most. Members past it are not dialed (their
/// sends fail with `PeerLimit`) and their dials are refused.
pub const TRANSPORT_PEERS_MAX: usize = 32;
/// The largest transport frame, length prefix included, in bytes: a
/// forwarded batch holds whole records, so one of a default 1 MiB line
/// (`--line-size-max`) fits with room to spare. The decoder refuses a
/// longer one from its length prefix alone.
pub const TRANSPORT_FRAME_BYTES_MAX: usize = 2 * MIB;
/// The credit window a node grants each peer's connection, in bytes: data
/// frames received and not yet released by their consumers. At 4 MiB a
/// link keeps a 1 ms round trip busy at 4 GB/s.
pub const TRANSPORT_WINDOW_BYTES: usize = 4 * MIB;
/// Messages queued for one peer and not yet written (waiting for credit,
/// the connection or the next flush), in bytes: past it, senders wait.
pub const TRANSPORT_QUEUE_BYTES_MAX: usize = 2 * MIB;
/// One write to a peer coalesces queued messages up to this many bytes (a
/// larger single message goes alone).
pub const TRANSPORT_FLUSH_BYTES: usize = 256 * KIB;
/// Bytes read from a peer's socket at once (the read buffer grows to hold
/// one whole frame, at most [`TRANSPORT_FRAME_BYTES_MAX`]).
pub const TRANSPORT_READ_CHUNK_BYTES: usize = 64 * KIB;
/// What one peer costs at most, in bytes: its queue, its write buffer (a
/// flush and one frame), the window of its inbound connection and that
/// connection's read buffer (a frame and a chunk).
pub const TRANSPORT_PEER_BYTES: usize = TRANSPORT_QUEUE_BYTES_MAX
    + TRANSPORT_FLUSH_BYTES
    + TRANSPORT_FRAME_BYTES_MAX
    + TRANSPORT_WINDOW_BYTES
    + TRANSPORT_FRAME_BYTES_MAX
    + TRANSPORT_READ_CHUNK_BYTES;
// A frame is at most half the window (so batched grants never hold back the
// credit a blocked sender waits for: `transport::credits`) and fits the
// queue (so any message can be queued).
const _: () = assert!(TRANSPORT_FRAME_BYTES_MAX <= TRANSPORT_WINDOW_BYTES / 2);
const _: () = assert!(TRANSPORT_FRAME_BYTES_MAX <= TRANSPORT_QUEUE_BYTES_MAX);
const _: () = assert!(TRANSPORT_WINDOW_BYTES <= u32::MAX as usize);

// ---------------------------------------------------------------------------
// Ranges of flags.

/// The longest timeout or interval a `--*-ms` flag takes (7 days; age
/// retention has its own, [`RETENTION_MS_MAX`]). Far beyond any use, and
/// small enough that every deadline built on one (`now + timeout`, a revoke
/// deadline, a report's staleness of 5 intervals) stays far from
/// `u64::MAX`: clap refuses a larger value at start-up.
pub const DURATION_FLAG_MS_MAX: u64 = 7 * 24 * 3600 * 1000;
const _: () = assert!(DURATION_FLAG_MS_MAX <= u64::MAX / 1024);
/// The longest `--*-us` flag (batch flush, spin before park): 1 s, past which
/// neither is a latency knob any more.
pub const DURATION_FLAG_US_MAX: u64 = 1_000_000;
/// The most the `--apply-delay-ns-per-event` test knob adds per event (1 s):
/// times the events of a batch (a `u32`) it stays within `u64`.
pub const APPLY_DELAY_NS_PER_EVENT_MAX: u64 = 1_000_000_000;
const _: () = assert!(APPLY_DELAY_NS_PER_EVENT_MAX <= u64::MAX / u32::MAX as u64);
