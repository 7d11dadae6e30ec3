//! Every limit and default of a server, in one place, each with its unit and
//! what it costs in memory.
//!
//! [`Config`] is both the `spate serve` flags (clap) and the runtime
//! configuration. [`Config::validate`] ties the limits together and
//! [`Config::memory_bound`] turns them into the peak-memory formula that the
//! README documents and the overload test checks.

use std::net::SocketAddr;

use crate::protocol::record::PAYLOAD_SIZE_LIMIT;
use crate::stream::RETENTION_MS_MAX;

pub const KIB: usize = 1024;
pub const MIB: usize = 1024 * KIB;

/// Most shards a server runs (shard ids are `u16` on the wire; the balancer's
/// view holds up to [`crate::balance::SHARDS_MAX`], the simulator's scale).
pub const SHARD_COUNT_MAX: usize = 256;
const _: () = assert!(SHARD_COUNT_MAX <= crate::balance::SHARDS_MAX as usize && SHARD_COUNT_MAX <= u16::MAX as usize);
/// Most partitions (partition ids are `u32` on the wire; 64 Ki keeps the
/// per-shard placement table at 512 KiB).
pub const PARTITION_COUNT_MAX: u32 = 65_536;
/// Frames a mesh channel holds beyond the data batches credits allow:
/// credit grants, subscriber fetches and replies, load reports and control.
pub const MESH_CONTROL_SLOTS: usize = 256;
/// Retention per partition on disk, by default: 1 GiB of segment files.
pub const RETENTION_BYTES_DISK_DEFAULT: usize = 1024 * MIB;
/// Retention per partition in memory, by default.
pub const RETENTION_BYTES_MEMORY_DEFAULT: usize = 8 * MIB;
/// Segment file size on disk, by default.
pub const SEGMENT_BYTES_DISK_DEFAULT: usize = 64 * MIB;
/// In-memory segment size, by default.
pub const SEGMENT_BYTES_MEMORY_DEFAULT: usize = MIB;
/// One offset-index entry (8 bytes, in memory) per this many bytes of
/// segment file: 50 GB of log costs 6 MiB of index.
pub const INDEX_INTERVAL_BYTES: u32 = 64 * 1024;
/// Write buffers of a partition that may wait for an fdatasync before the
/// committer must sync it (bounded overall by --fsync-pending-bytes-max).
pub const WRITER_UNSYNCED_BUFFERS_MAX: usize = 8;
/// How often the committer applies retention (deletes expired segments).
pub const RETENTION_CHECK_MS: u64 = 1000;
/// How often a failing storage write or fdatasync is retried, in ms.
pub const STORAGE_RETRY_MS: u64 = 100;
/// The largest log segment: record positions within one are `u32`.
pub const SEGMENT_BYTES_LIMIT: usize = u32::MAX as usize;
/// Reply bytes an ingest connection buffers (`ERR`/`OK` lines) before it
/// writes them out and stops parsing until they are written, so a flood of
/// bad lines from a producer that never reads is bounded too. Costs up to
/// this much per busy connection (a term of the memory formula).
pub const REPLY_BUFFER_BYTES_MAX: usize = 64 * KIB;
/// The largest read after which a connection's open batches go soon (see
/// `shard::source`) when the read drained its socket: a small read
/// that empties the socket means the producer trickles, so waiting for the
/// flush timer would only add latency. After a larger one batches fill
/// quickly anyway and keep the flush timer, so that a peak-rate producer
/// still sends full batches, not one small frame per read.
pub const FLUSH_SOON_READ_BYTES_MAX: usize = 16 * KIB;
/// Replies a standing fetch may have in flight from one owner to one
/// subscriber ([`crate::partition::fetch`]); its bytes in flight stay
/// within `--fetch-bytes-max` (the window), so this bounds the replies'
/// bookkeeping, not their data.
pub const STANDING_FETCH_REPLIES_MAX: u32 = 32;
/// Applied batches whose credit grants an owner may hold for one source, to
/// send them in one frame (`shard::grants`).
pub const GRANT_BATCHES_HELD_MAX: usize = 8;
/// Batch buffers a source keeps for reuse per destination beyond the one
/// open batch: up to `shards * this * batch_bytes` per shard, inside the
/// credit term (a spare buffer is one whose credits came back). As many as
/// one merged grant returns, so steady state allocates no batch buffers.
pub const BATCH_SPARE_BUFFERS_MAX: usize = GRANT_BATCHES_HELD_MAX;
/// How long a thief waits for an answer to a steal request before it may ask
/// again (an answer is a refusal or the placement update of a migration).
pub const STEAL_REQUEST_TIMEOUT_MS: u64 = 1000;
/// The gossip interval while the whole process is idle (no shard reports
/// traffic, nothing migrates): an idle server wakes once a second per shard
/// for gossip instead of ten times. The first batch applied, or the first
/// report of traffic from a peer, brings the normal interval back at once.
pub const GOSSIP_IDLE_INTERVAL_MS: u64 = 1000;
/// Below this rate (events/s, the balancer's average) a shard counts as
/// idle for the gossip pace: no traffic at all, not merely little.
pub const GOSSIP_IDLE_EVENTS_PER_S: f64 = 1.0;
/// Control requests queued per shard (admin and signal threads to a shard):
/// the admin thread waits for each answer, so a handful is plenty.
pub const CONTROL_CHANNEL_CAPACITY: usize = 64;
/// Life-cycle events each shard sends `main` (started or failed, drained).
pub const SHARD_EVENTS_PER_SHARD_MAX: usize = 3;
/// Longest `SUB` request line, in bytes.
pub const SUBSCRIBE_REQUEST_SIZE_MAX: usize = 1024;
/// How far the subscribe port reads (and drops) a longer first line to tell
/// its real size in the `ERR`; past this it says "at least" and closes.
pub const SUBSCRIBE_REQUEST_SKIP_BYTES_MAX: usize = MIB;
/// A fetch reply's buffer is reserved this large (or at the fetch's budget)
/// once it has data, so a full reply does not regrow it.
pub const FETCH_BUFFER_BYTES_INITIAL_MAX: usize = 256 * KIB;
/// Bytes of fixed per-shard cost the formula allows for code, stacks, task
/// state and allocator slack (an allowance, not a measured bound).
pub const SHARD_FIXED_ALLOWANCE_BYTES: usize = 64 * MIB;

/// Longest `#SYNC`/`#PING` token, in bytes: the token is echoed in the `OK`
/// reply, so it bounds a reply line. A longer one gets `ERR token_too_long`.
pub const CONTROL_TOKEN_SIZE_MAX: usize = 256;
/// Longest reply line the server writes to a producer (an `OK` with the
/// longest token, or an `ERR` with its detail), in bytes. The reply buffer is
/// written out before a line could push it past [`REPLY_BUFFER_BYTES_MAX`].
pub const REPLY_LINE_SIZE_MAX: usize = 128 + CONTROL_TOKEN_SIZE_MAX;
/// Reply buffer a connection allocates on its first reply and keeps between
/// writes; a buffer that grew past it in a burst is given back once written.
pub const REPLY_BUFFER_RETAINED_BYTES: usize = 4 * KIB;
/// Task state of one connection besides its buffers (its future, registry
/// entry and per-owner flags), in bytes: an allowance per connection in the
/// memory formula, as is [`SUBSCRIBER_STATE_BYTES`] for a subscriber.
pub const CONNECTION_STATE_BYTES: usize = 2 * KIB;
/// A subscriber's fixed state besides its fetch replies and cursors: request
/// line buffer, inbox, per-owner flags and the closing notice chunk; and
/// the connection that may be being shed from its slot
/// ([`SHED_CONNECTION_BYTES`]).
pub const SUBSCRIBER_STATE_BYTES: usize = 4 * KIB + CLOSING_NOTICE_CHUNK_BYTES + SHED_CONNECTION_BYTES;
/// A subscribe connection being shed at the limit, which may linger next to
/// the newcomer that took its slot over (a slot holds at most one such) for
/// up to a sweep interval and a goodbye: its request line buffer
/// (SUBSCRIBE_REQUEST_SIZE_MAX plus a read, grown to at most 2 KiB) and its
/// task state.
pub const SHED_CONNECTION_BYTES: usize = 2 * KIB + CONNECTION_STATE_BYTES;
/// One consumer group's fixed state on its coordinator (names, members'
/// entries, bookkeeping), for the memory formula.
pub const GROUP_STATE_BYTES: usize = 256;
/// A group's state per partition of its stream: holder, revoking flag,
/// committed offset (and its copy in the offsets file being written).
pub const GROUP_BYTES_PER_PARTITION: usize = 40;
/// Commits a group member may have in flight (sent, not yet acknowledged);
/// its connection's reader waits past this, so a member's inbox is bounded.
pub const COMMITS_IN_FLIGHT_MAX: usize = 256;
/// One commit acknowledgement in flight (the coordinator's entry and the
/// member's inbox event).
pub const GROUP_ACK_BYTES: usize = 64;
/// A subscriber's cursor state per partition it reads: its cursor, the
/// entry in a fetch request and in a fetch reply (compile-time checked in
/// `subscribe::session`).
pub const SUBSCRIBER_BYTES_PER_PARTITION: usize = 72;
/// The bookkeeping of one subscriber's standing-fetch replies from one
/// owner: STANDING_FETCH_REPLIES_MAX replies of at most 256 bytes each
/// (their data is in the fetch budget; compile-time checked in
/// `partition::fetch`).
pub const STANDING_REPLIES_STATE_BYTES: usize = STANDING_FETCH_REPLIES_MAX as usize * 256;
/// The shutdown notice (`CLOSING ...`, one entry per partition) is written in
/// chunks of about this size, so `SUB *` over 64 Ki partitions does not build
/// a 1 MiB line per subscriber at once.
pub const CLOSING_NOTICE_CHUNK_BYTES: usize = 16 * KIB;

/// Connections refused at a limit that are being told why at once, per
/// shard; past this, a refused connection is closed without the `ERR` line.
/// Each holds a file descriptor for at most [`GOODBYE_WRITE_TIMEOUT_MS`].
pub const REFUSALS_IN_FLIGHT_MAX: usize = 64;
/// How long a last line to a connection being closed (a refusal, a timeout,
/// shedding) may wait for the peer's window before the socket is closed.
pub const GOODBYE_WRITE_TIMEOUT_MS: u64 = 200;
/// How often each shard's connection sweeper checks the idle and line
/// timeouts, idle buffers and the shutdown deadline: they fire up to this late.
pub const CONNECTION_SWEEP_INTERVAL_MS: u64 = 100;
/// An ingest connection that has waited this long for bytes gives its grown
/// read buffer back (down to --read-buffer-initial-bytes) and its reply buffer.
pub const IDLE_TRIM_MS: u64 = 1000;
/// Accept back-off while the process is out of file descriptors: the first
/// sleep, doubled per failure up to the longest.
pub const ACCEPT_BACKOFF_MS_MIN: u64 = 5;
pub const ACCEPT_BACKOFF_MS_MAX: u64 = 200;
/// TCP keepalive on accepted sockets, so a peer that vanished (power loss, a
/// cable, a NAT that forgot the flow) is noticed after about
/// `idle + interval * probes` = 2 minutes instead of never.
pub const KEEPALIVE_IDLE_S: u32 = 60;
pub const KEEPALIVE_INTERVAL_S: u32 = 10;
pub const KEEPALIVE_PROBES: u32 = 6;

/// File descriptors a shard holds besides connections: its io_uring rings
/// and eventfds (4 measured with glommio 0.9) and its two listeners, with room.
pub const FDS_PER_SHARD_FIXED: usize = 16;
/// File descriptors the process holds besides shards and connections: stdio,
/// the signal pipe, the admin runtime and listener, /proc reads at start.
pub const FDS_PROCESS_FIXED: usize = 64;

/// Admin HTTP connections served at once; further ones wait in the listen
/// backlog until one closes.
pub const ADMIN_CONNECTIONS_MAX: usize = 16;
/// Largest admin request head (request line and headers), in bytes (hyper's
/// read buffer limit: a longer head gets `431` and the connection closes).
pub const ADMIN_HEADER_BYTES_MAX: usize = 16 * KIB;
/// Largest admin request body read, in bytes (`413` beyond). No route takes a
/// body yet; routes that will (`POST /streams`) get it already bounded.
pub const ADMIN_BODY_BYTES_MAX: usize = 64 * KIB;
/// An admin client must send a whole request head within this, in ms.
pub const ADMIN_HEADER_READ_TIMEOUT_MS: u64 = 5000;
/// An admin connection is closed (gracefully, after its request in progress)
/// this long after it was accepted, so a keep-alive client cannot hold one of
/// the [`ADMIN_CONNECTIONS_MAX`] slots for ever.
pub const ADMIN_CONNECTION_LIFETIME_MS: u64 = 60_000;
/// Allowance per partition and per shard for the largest admin response
/// (`/partitions` is about 190 bytes of JSON per partition; `/metrics` and
/// `/stats` about 6 KiB per shard): each open admin connection may hold one.
pub const ADMIN_RESPONSE_BYTES_PER_PARTITION: usize = 256;
pub const ADMIN_RESPONSE_BYTES_PER_SHARD: usize = 16 * KIB;

/// After the shutdown deadline, how long a shard still waits for the events
/// it has read to be applied (the connections themselves are cut at the
/// deadline), in ms.
pub const SHUTDOWN_DRAIN_MARGIN_MS: u64 = 500;
/// After the shutdown deadline plus this, the process exits whatever is
/// still running (status 1); a second SIGINT/SIGTERM exits at once.
pub const SHUTDOWN_FORCE_MARGIN_MS: u64 = 2000;
/// How long start-up waits for a listening socket that no live process owns
/// (a killed server's, which the kernel releases asynchronously), in ms.
pub const ADDRESS_WAIT_MS_MAX: u64 = 10_000;

/// The credit window per (source, owner) pair with memory storage.
pub const CREDIT_WINDOW_BYTES_MEMORY: usize = 4 * MIB;
/// With disk storage: what all sources together may have in flight to one
/// owner (split evenly: the window per pair is this / shards).
pub const CREDIT_WINDOW_BYTES_PER_OWNER_DISK: usize = 32 * MIB;
/// The fewest batches in flight per (source, owner) pair by default.
pub const CREDIT_WINDOW_BATCHES_MIN: usize = 64;

/// The longest timeout or interval a `--*-ms` flag takes (7 days; age
/// retention has its own, [`crate::stream::RETENTION_MS_MAX`]). Far beyond
/// any use, and small enough that every deadline built on one (`now +
/// timeout`, a revoke deadline, a report's staleness of 5 intervals) stays
/// far from `u64::MAX`: clap refuses a larger value at start-up.
pub const DURATION_FLAG_MS_MAX: u64 = 7 * 24 * 3600 * 1000;
/// The longest `--*-us` flag (batch flush, spin before park): 1 s, past which
/// neither is a latency knob any more.
pub const DURATION_FLAG_US_MAX: u64 = 1_000_000;
/// The most the `--apply-delay-ns-per-event` test knob adds per event (1 s):
/// times the events of a batch (a `u32`) it stays within `u64`.
pub const APPLY_DELAY_NS_PER_EVENT_MAX: u64 = 1_000_000_000;

/// How long a subscriber waits before asking again for a partition that is
/// moving between owners, in ms.
pub const FETCH_RETRY_DELAY_MS: u64 = 1;

/// The peak-memory formula, as `spate serve --help` prints it.
pub const MEMORY_FORMULA_HELP: &str = "\
Peak memory (S = shards, P = --partitions-max, all streams' partitions; C = S * connections_per_shard_max ingest connections
and N = S * subscribers_per_shard_max subscriber connections, both counted process-wide; see
README \"Limits and memory\"):
    C * (read_buffer_bytes + 64 KiB + 384 + 2 KiB + 2 * key_size_max)   busy connections: read buffer,
                                                                 replies, task state, parser scratch
  + S * 64 * 2 KiB                                               refusals being written
  + N * ((S + 1) * fetch_bytes_max + S * 8 KiB + 72 * P + 24 KiB) subscribers: fetch replies
                                                                 and their bookkeeping, cursors,
                                                                 state and notice, and a
                                                                 connection being shed
  + S * S * (batch_bytes + credit_window_bytes)                  open batches + events in flight
                                                                 (includes events a thief buffers
                                                                 during a migration handoff)
  + partition logs, with --storage memory:
      P * (retention_bytes + segment_bytes)
    with --storage disk (the files are on disk, not in this sum):
      P * (tail_cache_bytes * 5/4 + retention_bytes / 8192 + 4 KiB) tail caches, offset index
      + S * fsync_pending_bytes_max + S * S * credit_window_bytes    write buffers
  + S * (io_memory_bytes + 12 * P + batch_bytes * 12 / 11 + 64 MiB) fixed per shard
  + S * log_prefault_bytes                                       log segments kept ready
  + S * S * mesh_channel_frames * frame size                     mesh rings
  + 16 * (2 * 16 KiB + 256 * P + 16 KiB * S)                     admin connections and responses
plus, only if every connection holds a maximum-size line at once,
    C * (line_size_max + 2 - read_buffer_bytes) + C * (line_size_max - 2 * key_size_max).
An idle connection costs read_buffer_initial_bytes + 2 KiB (buffers grown in a burst are given
back after 1 s idle). GET /stats shows the bound for the running configuration (memory_bound)
next to the measured RSS.";

/// `spate serve` configuration. Sizes are bytes, durations carry their unit.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    /// Shards (one glommio executor each). Default: one per online CPU,
    /// pinned. More shards than CPUs run unpinned.
    #[arg(long)]
    pub shards: Option<usize>,

    /// Partitions of the `default` stream; `partition = xxh3_64(key) %
    /// partitions`. Fixed for the life of the data.
    #[arg(long, default_value_t = 256)]
    pub partitions: u32,

    /// Partitions of all streams together (the capacity `POST /streams` draws
    /// from); every per-partition term of the memory formula uses it.
    #[arg(long, default_value_t = 1024)]
    pub partitions_max: u32,

    /// Ingest address (line protocol). Every shard binds it (SO_REUSEPORT).
    #[arg(long, default_value = "0.0.0.0:9400")]
    pub ingest: SocketAddr,

    /// JSON-lines ingest address, or `off` (one JSON value per line, the key
    /// from --json-key, the line itself as the payload).
    #[arg(long, default_value = "0.0.0.0:9403")]
    pub ingest_json: Listen,

    /// InfluxDB line protocol ingest address, or `off` (the key is the
    /// series: measurement and sorted tags; the line is the payload). 9009
    /// is where ILP clients (QuestDB's) send by default.
    #[arg(long, default_value = "0.0.0.0:9009")]
    pub ingest_ilp: Listen,

    /// The field of a JSON line that holds its key: a top-level name
    /// (`user_id`) or an RFC 6901 pointer (`/user/id`).
    #[arg(long, default_value = "key", value_parser = parse_json_key)]
    pub json_key: crate::protocol::json::JsonKeySpec,

    /// The stream a JSON connection starts on (`#STREAM` switches it).
    #[arg(long, default_value = "default")]
    pub json_stream: String,

    /// The stream an ILP connection starts on (`#STREAM` switches it).
    #[arg(long, default_value = "default")]
    pub ilp_stream: String,

    /// Longest event key in bytes, in every format (ILP series keys are
    /// often longer than a user id). At most 65535: a record's key size is
    /// a u16.
    #[arg(long, default_value_t = crate::protocol::KEY_SIZE_MAX)]
    pub key_size_max: usize,

    /// Subscribe address.
    #[arg(long, default_value = "0.0.0.0:9401")]
    pub subscribe: SocketAddr,

    /// Admin HTTP address (/metrics, /stats, /partitions). Loopback by default.
    #[arg(long, default_value = "127.0.0.1:9402")]
    pub admin: SocketAddr,

    /// Longest accepted line in bytes (without CR LF). Longer lines get
    /// `ERR <line> line_too_long` and are skipped.
    #[arg(long, default_value_t = MIB)]
    pub line_size_max: usize,

    /// A connection's read buffer once it is busy, in bytes. It starts at
    /// --read-buffer-initial-bytes and only one long line grows it beyond this
    /// (up to --line-size-max + 2, given back afterwards).
    #[arg(long, default_value_t = 256 * KIB)]
    pub read_buffer_bytes: usize,

    /// What an idle connection's read buffer costs, in bytes.
    #[arg(long, default_value_t = 4 * KIB)]
    pub read_buffer_initial_bytes: usize,

    /// Ingest connections, per shard: the process admits shards * this,
    /// counted process-wide (so a connection is refused only when the whole
    /// process is full, wherever the kernel placed it); further ones get
    /// `ERR 0 connection_limit` and are closed.
    #[arg(long, default_value_t = 4096)]
    pub connections_per_shard_max: usize,

    /// An ingest connection that has sent no complete line within this many
    /// ms of connecting gets `ERR 1 idle_timeout` and is closed. Connections
    /// that have sent a line may stay idle (TCP keepalive notices a vanished
    /// peer). The subscribe port has its own, shorter deadline.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=DURATION_FLAG_MS_MAX))]
    pub idle_timeout_ms: u64,

    /// A connection to the subscribe port that has not sent its whole `SUB`
    /// or `GROUP` line within this many ms of connecting gets `ERR
    /// request_timeout` and is closed. A client sends that line in its first
    /// write, so 5 s covers a round trip and two retransmissions of a lost
    /// segment (1 s, then 2 s more) while bounding how long a connection that
    /// trickles bytes holds a subscriber slot (at the limit, a newcomer sheds
    /// the oldest such connection at once anyway).
    #[arg(long, default_value_t = 5_000)]
    pub subscribe_request_timeout_ms: u64,

    /// An ingest line that stays incomplete this many ms while spate waits
    /// for its bytes (a slowloris) gets `ERR <line> line_timeout` and the
    /// connection is closed. Time stalled on backpressure does not count.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1..=DURATION_FLAG_MS_MAX))]
    pub line_timeout_ms: u64,

    /// On SIGINT/SIGTERM, connections get this many ms to finish (replies,
    /// subscribers' last data and `CLOSING` notice); then they are cut and
    /// the process exits within about a second more. A second signal exits
    /// at once.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_MS_MAX))]
    pub shutdown_timeout_ms: u64,

    /// File descriptors kept free for anything the other limits do not
    /// count (index files while a segment is sealed, the data-dir lock), on
    /// top of the connections, subscribers and segment files. Start-up
    /// raises the soft RLIMIT_NOFILE to the hard limit and refuses a
    /// configuration whose total does not fit.
    #[arg(long, default_value_t = 256)]
    pub fds_reserved: usize,

    /// A batch for one destination shard is sent when it reaches this size.
    #[arg(long, default_value_t = 64 * KIB)]
    pub batch_bytes: usize,

    /// A non-empty batch is sent at the latest after this long.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_US_MAX))]
    pub batch_flush_us: u64,

    /// Credit window, in bytes of batch records, that each owner shard grants
    /// each source shard (including itself): events in flight between them
    /// [default: 4 MiB with --storage memory; with disk, 32 MiB / shards
    /// and at least 4 MiB, so an owner has 32 MiB in flight while a commit
    /// round runs].
    #[arg(long)]
    pub credit_window_bytes: Option<usize>,

    /// Batches in flight per (source, owner) pair; bounds the mesh queue
    /// [default: the credit window / --batch-bytes, at least 64].
    #[arg(long)]
    pub credit_window_batches: Option<usize>,

    /// Where events are kept: `disk` (segment files in --data-dir, an
    /// acknowledged event survives kill -9) or `memory` (RAM only, bounded
    /// by --retention-bytes; for benchmarks and caches).
    #[arg(long, value_enum, default_value_t = Storage::Disk)]
    pub storage: Storage,

    /// Data directory (created if missing; locked against a second server).
    #[arg(long, default_value = "./spate-data")]
    pub data_dir: std::path::PathBuf,

    /// When written events are made durable with fdatasync: `always` (each
    /// group commit; `#SYNC` and credits wait for it), `interval` (every
    /// --fsync-interval-ms, at once when a `#SYNC` asks), `never` (written
    /// to the kernel only: survives kill -9, not power loss).
    #[arg(long, value_enum, default_value_t = FsyncPolicy::Interval)]
    pub fsync: FsyncPolicy,

    /// With `--fsync interval`: the longest a written event waits for an
    /// fdatasync, in ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_MS_MAX))]
    pub fsync_interval_ms: u64,

    /// With `--fsync interval`: written bytes a shard lets wait for an
    /// fdatasync before it syncs early. Bounds the write buffers kept for a
    /// retry after a failed fdatasync.
    #[arg(long, default_value_t = 32 * MIB)]
    pub fsync_pending_bytes_max: usize,

    /// With `--storage disk`: recent events each partition keeps in memory,
    /// in bytes, so live subscribers read without I/O.
    #[arg(long, default_value_t = 256 * KIB)]
    pub tail_cache_bytes: usize,

    /// Keys one aggregate tracks per partition; a new key beyond it is
    /// refused (counted in spate_aggregate_keys_refused_total). Memory: see
    /// README "Keyed aggregates" (at most 322 bytes per key of 32 bytes in
    /// tumbling windows).
    #[arg(long, default_value_t = crate::aggregate::KEYS_PER_AGGREGATE_MAX)]
    pub aggregate_keys_max: u32,

    /// With `--storage disk`: how often each partition's aggregate state is
    /// checkpointed next to its log, in ms (a crash replays about this much
    /// of the log; more when a round waits for durability under load).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=DURATION_FLAG_MS_MAX))]
    pub aggregate_checkpoint_ms: u64,

    /// Retention per partition in bytes [default: 1 GiB of files on disk, 8
    /// MiB of memory with --storage memory]; whole oldest segments go first.
    #[arg(long)]
    pub retention_bytes: Option<usize>,

    /// Retention by age in ms [default: 7 days]: sealed segments whose last
    /// write is older are deleted (disk only). 0 keeps them regardless; at
    /// most 100 years.
    #[arg(long, default_value_t = 7 * 24 * 3600 * 1000, value_parser = clap::value_parser!(u64).range(0..=RETENTION_MS_MAX))]
    pub retention_ms: u64,

    /// Segment size in bytes, the unit of retention [default: 64 MiB files
    /// on disk, 1 MiB in memory].
    #[arg(long)]
    pub segment_bytes: Option<usize>,

    /// Subscriber connections, per shard: the process admits shards * this,
    /// counted process-wide from accept (a connection that has not sent
    /// `SUB` yet counts). At the limit a newcomer takes over the slot of the
    /// oldest connection that has not sent its `SUB`/`GROUP` line (which gets
    /// `ERR shed`); when every slot holds a subscriber it gets `ERR
    /// subscriber_limit`.
    #[arg(long, default_value_t = 64)]
    pub subscribers_per_shard_max: usize,

    /// Most bytes one fetch reply carries to a subscriber (its window per
    /// owner shard: one fetch per owner is in flight at a time).
    #[arg(long, default_value_t = 256 * KIB)]
    pub fetch_bytes_max: usize,

    /// Consumer groups the process keeps (with members or committed
    /// offsets), split evenly over the coordinator shards; a join that would
    /// create one more gets `ERR group_limit`. Each costs 256 B + (40 + 8 *
    /// shards) B per partition (see the memory formula).
    #[arg(long, default_value_t = 1024)]
    pub groups_max: usize,

    /// Members one consumer group may have at once (`ERR member_limit`).
    #[arg(long, default_value_t = 64)]
    pub group_members_max: usize,

    /// A group member that sends no line (`COMMIT`, `PING`) for this long is
    /// cut and its partitions are reassigned. It is also how long a member
    /// may take to finish a revocation (to read up to its `REVOKED` line).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=DURATION_FLAG_MS_MAX))]
    pub group_session_timeout_ms: u64,

    /// A `hold` group whose lag on a partition passes this many payload
    /// bytes (lag events times the partition's mean payload size) pauses
    /// ingest into that partition until it commits. With memory storage the
    /// limit is at most half the retention, so a held group never falls off.
    #[arg(long, default_value_t = 64 * MIB as u64)]
    pub group_hold_lag_bytes: u64,

    /// Registered io_uring buffer memory per shard (glommio io_memory), bytes.
    /// Locked memory: keep shards * this under `ulimit -l`.
    #[arg(long, default_value_t = 512 * KIB)]
    pub io_memory_bytes: usize,

    /// Microseconds an idle shard spins before it parks (glommio
    /// spin_before_park): it trades CPU for a cheaper wake-up. 0 = park at
    /// once. Measured on a 2-core VM that also runs the load generator, at
    /// 100 k events/s: 20 us lowered p99 from 1.1-2.1 to 0.7-1.4 ms for 17 %
    /// more CPU, 50 us cost 38 % more with no better tail (README,
    /// Benchmarks). Try it on dedicated cores.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_US_MAX))]
    pub spin_before_park_us: u64,

    /// Bytes of log segments each shard writes once at start and keeps
    /// ready, so that logs growing toward their retention take memory that
    /// is already mapped instead of faulting in fresh pages while events
    /// arrive ([`crate::partition::log::SegmentPool`]). The pool also keeps
    /// segments that logs give up, up to this size. Costs shards * this of
    /// memory at once, and start-up time to write it. 0 = no pool.
    #[arg(long, default_value_t = 0)]
    pub log_prefault_bytes: usize,

    /// Dynamic partitioning: `on` lets idle shards steal hot partitions from
    /// busy ones at runtime; `off` keeps the initial static placement.
    #[arg(long, value_enum, default_value_t = Rebalance::On)]
    pub rebalance: Rebalance,

    /// How often each shard gossips its load (and may ask for work), in ms.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_MS_MAX))]
    pub rebalance_interval_ms: u64,

    /// A partition that moved stays put at least this long, in ms.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_MS_MAX))]
    pub rebalance_cooldown_ms: u64,

    /// TEST KNOB, off by default: nanoseconds of extra work per applied event,
    /// to make the apply stage slow and exercise backpressure.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=APPLY_DELAY_NS_PER_EVENT_MAX))]
    pub apply_delay_ns_per_event: u64,

    /// TEST KNOB: shards the apply delay applies to (comma-separated ids);
    /// empty means every shard. Makes one shard the slow, "hot" one.
    #[arg(long, value_delimiter = ',')]
    pub apply_delay_shards: Vec<u16>,

    /// TEST KNOB, off by default: the last shard panics this many ms after
    /// it started, to prove that a panic stops the whole process at once.
    #[arg(long, hide = true)]
    pub test_panic_after_ms: Option<u64>,
}

/// Where events are kept.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    Disk,
    Memory,
}

/// A listener's address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

impl std::str::FromStr for Listen {
    type Err = std::net::AddrParseError;

    fn from_str(text: &str) -> Result<Listen, Self::Err> {
        if text == "off" { Ok(Listen(None)) } else { text.parse().map(|address| Listen(Some(address))) }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(address) => write!(f, "{address}"),
            None => write!(f, "off"),
        }
    }
}

fn parse_json_key(text: &str) -> Result<crate::protocol::json::JsonKeySpec, String> {
    crate::protocol::json::JsonKeySpec::parse(text).map_err(|error| error.to_string())
}

/// When written events are made durable (see `--fsync`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    Always,
    Interval,
    Never,
}

/// Whether shards move partitions between them at runtime.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebalance {
    On,
    Off,
}

/// A configuration that cannot work, with the numbers involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    ShardCount {
        shard_count: usize,
        shard_count_max: usize,
    },
    PartitionCount {
        name: &'static str,
        partition_count: u32,
        partition_count_max: u32,
    },
    CreditWindowBelowLine {
        credit_window_bytes: usize,
        line_record_size_max: usize,
    },
    SegmentBelowLine {
        segment_bytes: usize,
        line_size_max: usize,
    },
    RetentionBelowSegment {
        retention_bytes: usize,
        segment_bytes: usize,
    },
    ReadBuffer {
        read_buffer_initial_bytes: usize,
        read_buffer_bytes: usize,
    },
    Zero {
        name: &'static str,
    },
    /// A size beyond what a field of the record or log format holds.
    TooLarge {
        name: &'static str,
        value: usize,
        max: usize,
        why: &'static str,
    },
    /// A size below what its use needs.
    TooSmall {
        name: &'static str,
        value: usize,
        min: usize,
        why: &'static str,
    },
    /// A term of the memory formula does not fit in a `usize`: the flags it
    /// multiplies are absurd (the bound would otherwise wrap to a small,
    /// wrong number).
    MemoryBoundOverflow {
        term: &'static str,
        flags: &'static str,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::ShardCount { shard_count, shard_count_max } => {
                write!(f, "--shards {shard_count}: must be 1..={shard_count_max}")
            }
            ConfigError::PartitionCount { name, partition_count, partition_count_max } => {
                write!(f, "{name} {partition_count}: must be 1..={partition_count_max}")
            }
            ConfigError::CreditWindowBelowLine { credit_window_bytes, line_record_size_max } => write!(
                f,
                "--credit-window-bytes {credit_window_bytes} must hold the largest event \
                 record ({line_record_size_max} bytes)"
            ),
            ConfigError::SegmentBelowLine { segment_bytes, line_size_max } => {
                write!(f, "--segment-bytes {segment_bytes} must be >= --line-size-max {line_size_max}")
            }
            ConfigError::RetentionBelowSegment { retention_bytes, segment_bytes } => {
                write!(f, "--retention-bytes {retention_bytes} must be >= --segment-bytes {segment_bytes}")
            }
            ConfigError::ReadBuffer { read_buffer_initial_bytes, read_buffer_bytes } => write!(
                f,
                "--read-buffer-initial-bytes {read_buffer_initial_bytes} must be 1..=--read-buffer-bytes \
                 {read_buffer_bytes}"
            ),
            ConfigError::Zero { name } => write!(f, "{name} must be greater than zero"),
            ConfigError::TooLarge { name, value, max, why } => {
                write!(f, "{name} {value} is above its maximum {max} ({why})")
            }
            ConfigError::TooSmall { name, value, min, why } => {
                write!(f, "{name} {value} is below its minimum {min} ({why})")
            }
            ConfigError::MemoryBoundOverflow { term, flags } => write!(
                f,
                "the memory bound's {term} term does not fit in {} bits: {flags} multiply to more than any \
                 machine holds (the formula is in `spate serve --help`)",
                usize::BITS
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// The peak-memory formula, term by term, in bytes for the whole process.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct MemoryBound {
    /// Busy ingest connections, counted process-wide:
    /// shards * connections_per_shard_max * (read_buffer_bytes +
    /// REPLY_BUFFER_BYTES_MAX + REPLY_LINE_SIZE_MAX + CONNECTION_STATE_BYTES),
    /// plus shards * REFUSALS_IN_FLIGHT_MAX * CONNECTION_STATE_BYTES.
    pub connection_buffers: usize,
    /// Extra when connections each hold one line of the maximum size at once:
    /// shards * connections_per_shard_max * (line_size_max + 2 - read_buffer_bytes).
    pub long_line_worst_case: usize,
    /// Open batches and events in flight:
    /// shards * shards * (batch_bytes + credit_window_bytes).
    pub batches_and_credits: usize,
    /// Partition logs ([`Config::partition_log_bytes`]): all of retention in
    /// memory mode; tail caches, indexes and write buffers on disk.
    pub retention: usize,
    /// Subscriber connections (counted from accept, process-wide): shards *
    /// subscribers_per_shard_max * ((shards + 1) * fetch_bytes_max +
    /// shards * STANDING_REPLIES_STATE_BYTES +
    /// partitions * SUBSCRIBER_BYTES_PER_PARTITION + SUBSCRIBER_STATE_BYTES),
    /// that is one reply in flight per owner plus one being written, the
    /// cursors of a `SUB *`, the request and closing-notice buffers, and a
    /// connection being shed from the slot.
    pub subscribers: usize,
    /// Fixed per-shard costs: io_memory, placement table, the order a batch
    /// is applied in ([`Config::apply_order_bytes`]) and an allowance for
    /// code, stacks and allocator slack (SHARD_FIXED_ALLOWANCE_BYTES).
    pub fixed: usize,
    /// Mesh rings: shards * shards * mesh_channel_frames * FRAME_SIZE_BYTES.
    pub mesh: usize,
    /// The admin port: ADMIN_CONNECTIONS_MAX * (2 * ADMIN_HEADER_BYTES_MAX +
    /// the largest response), where the largest response is
    /// partitions * ADMIN_RESPONSE_BYTES_PER_PARTITION + shards *
    /// ADMIN_RESPONSE_BYTES_PER_SHARD.
    pub admin: usize,
    /// Log segments kept ready: shards * log_prefault_bytes.
    pub segment_pool: usize,
    /// Consumer groups: groups_max * (GROUP_STATE_BYTES + partitions *
    /// (GROUP_BYTES_PER_PARTITION + 8 * shards)), the state on the
    /// coordinator and the hold floors every shard keeps, plus each member's
    /// commit acknowledgements in flight: subscribers * COMMITS_IN_FLIGHT_MAX
    /// * GROUP_ACK_BYTES (its cursors are in `subscribers`).
    pub groups: usize,
    /// Sum of the terms above without the long-line worst case.
    pub total: usize,
    /// `total + long_line_worst_case`.
    pub total_worst_case: usize,
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
    /// Shards to run: --shards, or one per online CPU.
    pub fn shard_count(&self) -> usize {
        self.shards.unwrap_or_else(|| std::thread::available_parallelism().map(|count| count.get()).unwrap_or(1))
    }

    /// Checks that the limits fit together; see each [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_counts()?;
        self.validate_format_limits()?;
        self.validate_relations()?;
        self.validate_memory_bound()
    }

    /// Every term of the memory formula is computed saturating; one that
    /// reached `usize::MAX` did not fit, and the configuration is refused
    /// with the flags that term multiplies.
    fn validate_memory_bound(&self) -> Result<(), ConfigError> {
        let bound = self.memory_bound();
        let terms = [
            ("connection_buffers", bound.connection_buffers, "--connections-per-shard-max and --read-buffer-bytes"),
            ("long_line_worst_case", bound.long_line_worst_case, "--connections-per-shard-max and --line-size-max"),
            ("batches_and_credits", bound.batches_and_credits, "--batch-bytes and --credit-window-bytes"),
            (
                "retention",
                bound.retention,
                "--retention-bytes, --tail-cache-bytes, --fsync-pending-bytes-max and --credit-window-bytes",
            ),
            ("subscribers", bound.subscribers, "--subscribers-per-shard-max and --fetch-bytes-max"),
            ("fixed", bound.fixed, "--io-memory-bytes and --batch-bytes"),
            ("mesh", bound.mesh, "--credit-window-batches and --subscribers-per-shard-max"),
            ("groups", bound.groups, "--groups-max and --subscribers-per-shard-max"),
            ("segment_pool", bound.segment_pool, "--log-prefault-bytes"),
            ("total", bound.total_worst_case, "the terms' flags together"),
        ];
        match terms.into_iter().find(|&(_, bytes, _)| bytes == usize::MAX) {
            Some((term, _, flags)) => Err(ConfigError::MemoryBoundOverflow { term, flags }),
            None => Ok(()),
        }
    }

    fn validate_counts(&self) -> Result<(), ConfigError> {
        let shard_count = self.shard_count();
        if shard_count == 0 || shard_count > SHARD_COUNT_MAX {
            return Err(ConfigError::ShardCount { shard_count, shard_count_max: SHARD_COUNT_MAX });
        }
        if self.partitions_max == 0 || self.partitions_max > PARTITION_COUNT_MAX {
            return Err(ConfigError::PartitionCount {
                name: "--partitions-max",
                partition_count: self.partitions_max,
                partition_count_max: PARTITION_COUNT_MAX,
            });
        }
        if self.partitions == 0 || self.partitions > self.partitions_max {
            return Err(ConfigError::PartitionCount {
                name: "--partitions",
                partition_count: self.partitions,
                partition_count_max: self.partitions_max,
            });
        }
        let nonzero = [
            ("--line-size-max", self.line_size_max),
            ("--key-size-max", self.key_size_max),
            ("--connections-per-shard-max", self.connections_per_shard_max),
            ("--batch-bytes", self.batch_bytes),
            ("--credit-window-batches", self.credit_window_batches()),
            ("--subscribers-per-shard-max", self.subscribers_per_shard_max),
            ("--fetch-bytes-max", self.fetch_bytes_max),
            ("--groups-max", self.groups_max),
            ("--group-members-max", self.group_members_max),
            ("--group-session-timeout-ms", self.group_session_timeout_ms as usize),
            ("--group-hold-lag-bytes", self.group_hold_lag_bytes as usize),
            ("--idle-timeout-ms", self.idle_timeout_ms as usize),
            ("--subscribe-request-timeout-ms", self.subscribe_request_timeout_ms as usize),
            ("--line-timeout-ms", self.line_timeout_ms as usize),
            ("--aggregate-keys-max", self.aggregate_keys_max as usize),
            ("--aggregate-checkpoint-ms", self.aggregate_checkpoint_ms as usize),
        ];
        match nonzero.iter().find(|(_, value)| *value == 0) {
            Some((name, _)) => Err(ConfigError::Zero { name }),
            None => Ok(()),
        }
    }

    /// Sizes that reach fixed-width fields: a payload's `u32` size in every
    /// record, a record's `u32` position in a log segment.
    fn validate_format_limits(&self) -> Result<(), ConfigError> {
        let limits = [
            (
                "--key-size-max",
                self.key_size_max,
                crate::protocol::record::KEY_SIZE_LIMIT,
                "a record's key size is a u16",
            ),
            ("--line-size-max", self.line_size_max, PAYLOAD_SIZE_LIMIT, "a record's payload size is a u32"),
            ("--segment-bytes", self.segment_bytes(), SEGMENT_BYTES_LIMIT, "record positions in a segment are u32"),
        ];
        for (name, value, max, why) in limits {
            if value > max {
                return Err(ConfigError::TooLarge { name, value, max, why });
            }
        }
        Ok(())
    }

    fn validate_relations(&self) -> Result<(), ConfigError> {
        let line_record_size_max = self.line_record_size_max();
        if self.credit_window_bytes() < line_record_size_max {
            return Err(ConfigError::CreditWindowBelowLine {
                credit_window_bytes: self.credit_window_bytes(),
                line_record_size_max,
            });
        }
        if self.segment_bytes() < self.line_size_max {
            return Err(ConfigError::SegmentBelowLine {
                segment_bytes: self.segment_bytes(),
                line_size_max: self.line_size_max,
            });
        }
        if self.retention_bytes() < self.segment_bytes() {
            return Err(ConfigError::RetentionBelowSegment {
                retention_bytes: self.retention_bytes(),
                segment_bytes: self.segment_bytes(),
            });
        }
        if self.tail_cache_bytes < self.tail_cache_segment_bytes() {
            return Err(ConfigError::TooSmall {
                name: "--tail-cache-bytes",
                value: self.tail_cache_bytes,
                min: self.tail_cache_segment_bytes(),
                why: "the cache holds at least one in-memory segment of one record",
            });
        }
        if self.read_buffer_initial_bytes == 0 || self.read_buffer_initial_bytes > self.read_buffer_bytes {
            return Err(ConfigError::ReadBuffer {
                read_buffer_initial_bytes: self.read_buffer_initial_bytes,
                read_buffer_bytes: self.read_buffer_bytes,
            });
        }
        Ok(())
    }

    /// The credit window per (source, owner) pair, in bytes (the flag, or
    /// the storage's default: a commit round on disk takes milliseconds, and
    /// what a source may have in flight meanwhile bounds its rate; measured
    /// in the README, "Benchmarks").
    pub fn credit_window_bytes(&self) -> usize {
        self.credit_window_bytes.unwrap_or(match self.storage {
            Storage::Memory => CREDIT_WINDOW_BYTES_MEMORY,
            Storage::Disk => (CREDIT_WINDOW_BYTES_PER_OWNER_DISK / self.shard_count()).max(CREDIT_WINDOW_BYTES_MEMORY),
        })
    }

    /// Batches in flight per (source, owner) pair (the flag, or enough
    /// full batches to carry the credit window).
    pub fn credit_window_batches(&self) -> usize {
        self.credit_window_batches
            .unwrap_or_else(|| (self.credit_window_bytes() / self.batch_bytes.max(1)).max(CREDIT_WINDOW_BATCHES_MIN))
    }

    /// What a JSON or ILP connection's parser keeps between lines (its
    /// scratch grows to the longest key or series it unescaped and is given
    /// back once over this).
    pub fn parser_scratch_bytes_max(&self) -> usize {
        self.key_size_max.saturating_mul(2)
    }

    /// The lag, in payload bytes, past which a `hold` group pauses ingest
    /// into a partition: the flag, and with memory storage at most half the
    /// retention (memory retention is the hard bound there).
    pub fn group_hold_lag_limit(&self) -> u64 {
        match self.storage {
            Storage::Disk => self.group_hold_lag_bytes,
            Storage::Memory => self.group_hold_lag_bytes.min(self.retention_bytes() as u64 / 2),
        }
    }

    /// Groups one coordinator shard keeps: `--groups-max` over the shards.
    pub fn groups_per_shard_max(&self, shard_count: u16) -> usize {
        self.groups_max.div_ceil(usize::from(shard_count.max(1)))
    }

    /// Retention per partition, in bytes (the flag, or the storage's default).
    pub fn retention_bytes(&self) -> usize {
        let default = match self.storage {
            Storage::Disk => RETENTION_BYTES_DISK_DEFAULT,
            Storage::Memory => RETENTION_BYTES_MEMORY_DEFAULT,
        };
        self.retention_bytes.unwrap_or(default)
    }

    /// Segment size in bytes (the flag, or the storage's default).
    pub fn segment_bytes(&self) -> usize {
        let default = match self.storage {
            Storage::Disk => SEGMENT_BYTES_DISK_DEFAULT,
            Storage::Memory => SEGMENT_BYTES_MEMORY_DEFAULT,
        };
        self.segment_bytes.unwrap_or(default)
    }

    /// The size of one in-memory segment of a disk partition's tail cache:
    /// a quarter of the cache, so retention drops it in steps.
    pub fn tail_cache_segment_bytes(&self) -> usize {
        (self.tail_cache_bytes / 4).max(crate::protocol::record::LOG_HEADER_SIZE + 1)
    }

    /// How the files of a partition of `spec` are written and kept (its
    /// stream's retention).
    pub fn disk_config_for(&self, spec: &crate::stream::StreamSpec) -> crate::partition::disk::DiskConfig {
        crate::partition::disk::DiskConfig {
            retention_bytes: spec.retention_bytes,
            retention_ms: spec.retention_ms,
            ..self.disk_config()
        }
    }

    /// How one partition's files are written and kept.
    pub fn disk_config(&self) -> crate::partition::disk::DiskConfig {
        use crate::storage::segment::{BLOCK_SIZE, SegmentConfig};
        // A write buffer holds the largest record in one frame, and a
        // frame's target size, with a block to spare for the carried tail.
        let largest_frame = self.line_record_size_max() + crate::storage::format::FRAME_HEADER_SIZE;
        let buffer_bytes = largest_frame.max(crate::partition::disk::FRAME_BODY_BYTES_TARGET * 2) + BLOCK_SIZE as usize;
        let buffer_bytes = buffer_bytes.div_ceil(BLOCK_SIZE as usize) * BLOCK_SIZE as usize;
        crate::partition::disk::DiskConfig {
            writer: SegmentConfig {
                buffer_bytes,
                unsynced_buffers_max: WRITER_UNSYNCED_BUFFERS_MAX,
                segment_bytes_max: self.segment_bytes() as u64,
                index_interval_bytes: INDEX_INTERVAL_BYTES,
            },
            retention_bytes: self.retention_bytes() as u64,
            retention_ms: self.retention_ms,
        }
    }

    /// What the stream catalog applies: the capacity and the defaults.
    pub fn catalog_limits(&self) -> crate::stream::CatalogLimits {
        let retention_bytes_max = match self.storage {
            Storage::Memory => self.retention_bytes() as u64,
            Storage::Disk => u64::MAX,
        };
        crate::stream::CatalogLimits {
            partitions_max: self.partitions_max,
            retention_bytes: self.retention_bytes() as u64,
            retention_bytes_max,
            retention_ms: self.retention_ms,
            segment_bytes: self.segment_bytes() as u64,
        }
    }

    /// The largest batch record a line can produce (its credit cost).
    pub fn line_record_size_max(&self) -> usize {
        crate::protocol::record::BATCH_HEADER_SIZE + self.line_size_max
    }

    /// The balancer's configuration: its defaults, with the flags applied.
    pub fn balance_config(&self) -> crate::balance::BalanceConfig {
        let defaults = crate::balance::BalanceConfig::default();
        let report_interval_ms = self.rebalance_interval_ms.max(1);
        crate::balance::BalanceConfig {
            report_interval_ms,
            report_stale_ms: defaults.report_stale_ms.max(report_interval_ms.saturating_mul(5)),
            cooldown_ms: self.rebalance_cooldown_ms,
            ..defaults
        }
    }

    /// The apply delay, in ns per event, for `shard` (the test knob).
    pub fn apply_delay_ns_per_event_on(&self, shard: u16) -> u64 {
        let applies = self.apply_delay_shards.is_empty() || self.apply_delay_shards.contains(&shard);
        if applies { self.apply_delay_ns_per_event } else { 0 }
    }

    /// Frames each mesh channel holds: every credited batch plus control.
    pub fn mesh_channel_frames(&self) -> usize {
        sum(&[self.credit_window_batches(), product(&[self.subscribers_per_shard_max, 2]), MESH_CONTROL_SLOTS])
    }

    /// The partition-log term of the memory formula: all of retention in
    /// memory mode; with disk storage, the tail caches, the offset indexes
    /// and the write buffers (what waits for an fdatasync, and a second
    /// copy of what credits let in flight), but not the files.
    pub fn partition_log_bytes(&self) -> usize {
        let partitions = self.partitions_max as usize;
        match self.storage {
            Storage::Memory => product(&[partitions, sum(&[self.retention_bytes(), self.segment_bytes()])]),
            Storage::Disk => {
                let shards = self.shard_count();
                let index_bytes = product(&[self.retention_bytes() / INDEX_INTERVAL_BYTES as usize, 8]);
                let per_partition =
                    sum(&[self.tail_cache_bytes, self.tail_cache_segment_bytes(), index_bytes, 4 * KIB]);
                sum(&[
                    product(&[partitions, per_partition]),
                    product(&[shards, self.fsync_pending_bytes_max]),
                    product(&[shards, shards, self.credit_window_bytes()]),
                ])
            }
        }
    }

    /// The scratch space `partition::apply::RecordOrder` keeps per shard to
    /// apply a batch partition by partition: 12 bytes per record of the
    /// largest batch (records are at least `BATCH_HEADER_SIZE + 1` bytes, a
    /// batch at most `batch_bytes` plus one record) and 4 per partition id.
    pub fn apply_order_bytes(&self, partitions: usize) -> usize {
        let record_size_min = crate::protocol::record::BATCH_HEADER_SIZE + 1;
        sum(&[product(&[12, self.batch_bytes / record_size_min + 2]), product(&[4, partitions + 1])])
    }

    /// The peak-memory formula for this configuration. Every sum and
    /// product saturates at `usize::MAX` (see [`product`]), so huge flags
    /// give a term of `usize::MAX`, which [`Config::validate`] refuses, never
    /// a wrapped small number.
    pub fn memory_bound(&self) -> MemoryBound {
        let shards = self.shard_count();
        let partitions = self.partitions_max as usize;
        let connections = product(&[shards, self.connections_per_shard_max]);
        let per_connection = sum(&[
            self.read_buffer_bytes,
            REPLY_BUFFER_BYTES_MAX,
            REPLY_LINE_SIZE_MAX,
            CONNECTION_STATE_BYTES,
            self.parser_scratch_bytes_max(),
        ]);
        let connection_buffers = sum(&[
            product(&[connections, per_connection]),
            product(&[shards, REFUSALS_IN_FLIGHT_MAX, CONNECTION_STATE_BYTES]),
        ]);
        // A long line may also grow a JSON or ILP parser's scratch to its
        // size, for that line only.
        let long_line_worst_case = sum(&[
            product(&[connections, self.line_size_max.saturating_add(2).saturating_sub(self.read_buffer_bytes)]),
            product(&[connections, self.line_size_max.saturating_sub(self.parser_scratch_bytes_max())]),
        ]);
        let batches_and_credits = product(&[shards, shards, sum(&[self.batch_bytes, self.credit_window_bytes()])]);
        let retention = self.partition_log_bytes();
        let per_subscriber = sum(&[
            product(&[shards + 1, self.fetch_bytes_max]),
            product(&[shards, STANDING_REPLIES_STATE_BYTES]),
            product(&[partitions, SUBSCRIBER_BYTES_PER_PARTITION]),
            SUBSCRIBER_STATE_BYTES,
        ]);
        let subscribers = product(&[shards, self.subscribers_per_shard_max, per_subscriber]);
        let placement = partitions * std::mem::size_of::<crate::partition::Placement>();
        let mesh = product(&[shards, shards, self.mesh_channel_frames(), crate::shard::frame::FRAME_SIZE_BYTES]);
        let fixed = product(&[
            shards,
            sum(&[self.io_memory_bytes, placement, self.apply_order_bytes(partitions), SHARD_FIXED_ALLOWANCE_BYTES]),
        ]);
        let response_max = partitions * ADMIN_RESPONSE_BYTES_PER_PARTITION + shards * ADMIN_RESPONSE_BYTES_PER_SHARD;
        let admin = ADMIN_CONNECTIONS_MAX * (2 * ADMIN_HEADER_BYTES_MAX + response_max);
        let group_per_partition = sum(&[GROUP_BYTES_PER_PARTITION, product(&[8, shards])]);
        let groups = sum(&[
            product(&[self.groups_max, sum(&[GROUP_STATE_BYTES, product(&[partitions, group_per_partition])])]),
            product(&[shards, self.subscribers_per_shard_max, COMMITS_IN_FLIGHT_MAX, GROUP_ACK_BYTES]),
        ]);
        let segment_pool = product(&[shards, self.log_prefault_bytes]);
        let total = sum(&[
            connection_buffers,
            batches_and_credits,
            retention,
            subscribers,
            fixed,
            mesh,
            admin,
            groups,
            segment_pool,
        ]);
        MemoryBound {
            connection_buffers,
            long_line_worst_case,
            batches_and_credits,
            retention,
            subscribers,
            fixed,
            mesh,
            admin,
            groups,
            segment_pool,
            total,
            total_worst_case: sum(&[total, long_line_worst_case]),
        }
    }

    /// The file descriptors this configuration may hold at once.
    pub fn fd_budget(&self) -> FdBudget {
        // Saturating, as the memory formula: a budget past usize::MAX is
        // refused by the start-up fd check as any budget over the limit.
        let shards = self.shard_count();
        let connections = product(&[shards, self.connections_per_shard_max]);
        // A shed subscribe connection may linger beside its successor.
        let subscribers = product(&[2, shards, self.subscribers_per_shard_max]);
        let refusals = shards * REFUSALS_IN_FLIGHT_MAX;
        let admin = ADMIN_CONNECTIONS_MAX + 1;
        let fixed = shards * FDS_PER_SHARD_FIXED + FDS_PROCESS_FIXED;
        let files = match self.storage {
            Storage::Disk => {
                sum(&[self.partitions_max as usize, product(&[shards, self.subscribers_per_shard_max, shards])])
            }
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
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    fn parse(args: &[&str]) -> Config {
        Cli::parse_from(std::iter::once("spate").chain(args.iter().copied())).config
    }

    /// The defaults are valid and give the documented bound for 2 shards.
    #[test]
    fn defaults_validate_and_bound_memory() {
        let config = parse(&["--shards", "2"]);
        config.validate().unwrap();
        let bound = config.memory_bound();
        // Bounded by --partitions-max (1024): streams can be created up to it.
        assert_eq!(
            bound.retention,
            1024 * (256 * KIB + 64 * KIB + 1024 * MIB / 8192 + 4 * KIB) + 2 * 32 * MIB + 4 * 16 * MIB
        );
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
        assert_eq!(bound.connection_buffers, 2 * 4096 * per_connection + 2 * 64 * CONNECTION_STATE_BYTES);
        assert_eq!(bound.subscribers, 2 * 64 * (3 * 256 * KIB + 2 * 8 * KIB + 1024 * 72 + SUBSCRIBER_STATE_BYTES));
        assert_eq!(bound.admin, 16 * (32 * KIB + 1024 * 256 + 2 * 16 * KIB));
        assert_eq!(bound.mesh, 4 * config.mesh_channel_frames() * crate::shard::frame::FRAME_SIZE_BYTES);
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

    /// Limits that cannot work together are refused with their numbers.
    #[test]
    fn inconsistent_limits_are_refused() {
        let small_window = parse(&["--shards", "1", "--credit-window-bytes", "1000"]);
        assert!(matches!(small_window.validate(), Err(ConfigError::CreditWindowBelowLine { .. })));
        let zero_partitions = parse(&["--shards", "1", "--partitions", "0"]);
        assert!(matches!(zero_partitions.validate(), Err(ConfigError::PartitionCount { .. })));
        let no_cache = parse(&["--shards", "1", "--tail-cache-bytes", "0"]);
        let error = no_cache.validate().unwrap_err();
        assert!(matches!(error, ConfigError::TooSmall { name: "--tail-cache-bytes", value: 0, .. }), "{error}");
        let small_retention = parse(&["--shards", "1", "--retention-bytes", "1000"]);
        assert!(matches!(small_retention.validate(), Err(ConfigError::RetentionBelowSegment { .. })));
        let huge_segment =
            parse(&["--shards", "1", "--segment-bytes", "5000000000", "--retention-bytes", "6000000000"]);
        let error = huge_segment.validate().unwrap_err();
        assert!(matches!(error, ConfigError::TooLarge { name: "--segment-bytes", value: 5_000_000_000, .. }));
        assert!(error.to_string().contains("4294967295"), "{error}");
    }

    /// Time flags past their maxima (u64::MAX, 2^63, the maximum + 1) are
    /// refused when parsed, with the range; the maxima themselves parse
    /// and validate.
    #[test]
    fn time_flags_past_their_maxima_are_refused_by_clap() {
        let parse_result =
            |args: &[String]| Cli::try_parse_from(std::iter::once("spate".to_string()).chain(args.iter().cloned()));
        let flags = [
            ("--retention-ms", RETENTION_MS_MAX),
            ("--idle-timeout-ms", DURATION_FLAG_MS_MAX),
            ("--line-timeout-ms", DURATION_FLAG_MS_MAX),
            ("--shutdown-timeout-ms", DURATION_FLAG_MS_MAX),
            ("--fsync-interval-ms", DURATION_FLAG_MS_MAX),
            ("--aggregate-checkpoint-ms", DURATION_FLAG_MS_MAX),
            ("--group-session-timeout-ms", DURATION_FLAG_MS_MAX),
            ("--rebalance-interval-ms", DURATION_FLAG_MS_MAX),
            ("--rebalance-cooldown-ms", DURATION_FLAG_MS_MAX),
            ("--batch-flush-us", DURATION_FLAG_US_MAX),
            ("--spin-before-park-us", DURATION_FLAG_US_MAX),
            ("--apply-delay-ns-per-event", APPLY_DELAY_NS_PER_EVENT_MAX),
        ];
        for (flag, max) in flags {
            for value in [u64::MAX, 1 << 63, max + 1] {
                let args = ["--shards".to_string(), "1".to_string(), flag.to_string(), value.to_string()];
                let error = parse_result(&args).err().unwrap_or_else(|| panic!("{flag} {value} was accepted"));
                assert!(error.to_string().contains(&max.to_string()), "{flag} {value}: {error}");
            }
            let args = ["--shards".to_string(), "1".to_string(), flag.to_string(), max.to_string()];
            let config = parse_result(&args).unwrap_or_else(|error| panic!("{flag} {max}: {error}")).config;
            config.validate().unwrap_or_else(|error| panic!("{flag} {max}: {error}"));
        }
        let slow = parse(&["--shards", "1", "--rebalance-interval-ms", &DURATION_FLAG_MS_MAX.to_string()]);
        assert_eq!(slow.balance_config().report_stale_ms, 5 * DURATION_FLAG_MS_MAX);
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
}
