//! The flags of `spate serve` ([`Config`], clap), the values they resolve
//! to (a default that depends on the storage or the shard count), and the
//! checks that tie them together ([`ConfigError`]).
//!
//! Ranges, and defaults that other code shares, come from [`super::limits`];
//! a default that only its flag uses is written on the flag. The memory a
//! configuration may take is [`super::memory`]'s, and [`Config::validate`]
//! (in `config/mod.rs`) runs both checks. Modules that turn the flags into
//! their own configuration do it next to that configuration
//! (`Config::disk_config` in `partition::disk`, `Config::catalog_limits` in
//! `stream`, `Config::balance_config` in `shard::balancer`), so this file
//! knows none of their types.

use std::net::SocketAddr;

use super::limits::*;
use crate::protocol::record::{BATCH_HEADER_SIZE, KEY_SIZE_LIMIT, LOG_HEADER_SIZE, PAYLOAD_SIZE_LIMIT};
use crate::storage::index::SEGMENT_SIZE_MAX;

/// `spate serve` configuration. Sizes are bytes, durations carry their unit.
#[derive(clap::Args, Debug, Clone)]
pub struct Config {
    /// Shards (one glommio executor each). Default: one per CPU this
    /// process may run on (or per CPU of a --cpus list).
    #[arg(long)]
    pub shards: Option<usize>,

    /// Which CPUs the shards run on: `auto` (pinned, spread over the CPUs
    /// this process may run on, unless there are more shards than those or
    /// another spate server runs on this machine: then unpinned), `none`
    /// (unpinned), or a list such as `0-3,6` (pinned to exactly these; give
    /// each node on one machine its own).
    #[arg(long, default_value = "auto")]
    pub cpus: Cpus,

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

    /// Kafka wire-protocol address, or `off`: Kafka producers and consumers
    /// (librdkafka, kcat, kafka-python, the Java client) use spate as a
    /// broker; topics are streams (README, "Kafka").
    #[arg(long, default_value = "0.0.0.0:9092")]
    pub ingest_kafka: Listen,

    /// The `host:port` Kafka clients are told to connect to (Metadata).
    /// Default: the --ingest-kafka address, with 127.0.0.1 for an
    /// unspecified one (0.0.0.0).
    #[arg(long)]
    pub kafka_advertise: Option<String>,

    /// Kafka clients may create a stream by naming it (Metadata with
    /// auto-creation, Produce): `off`, or the partition count such a stream
    /// gets. Off by default: a stream takes partitions from
    /// --partitions-max, and a typo should not.
    #[arg(long, default_value = "off", value_parser = parse_auto_create)]
    pub kafka_auto_create: AutoCreate,

    /// Largest Kafka request (and Fetch response) in bytes; a larger size
    /// prefix closes the connection, counted. Each Kafka connection holds
    /// at most one request and one response of this size (the memory
    /// formula's Kafka term).
    #[arg(long, default_value_t = 4 << 20)]
    pub kafka_request_size_max: usize,

    /// BENCHMARK KNOB, off by default: Produce decodes and checks every
    /// batch exactly as when storing (request, CRC32C, framing, every
    /// record's size) and answers success without routing a record, so
    /// nothing is stored (the idempotence table is not consulted either).
    /// It measures a Kafka client's own ceiling against this listener
    /// (scripts/bench-kafka); never for data.
    #[arg(long, hide = true)]
    pub kafka_produce_discard: bool,

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
    #[arg(long, default_value_t = KEY_SIZE_MAX)]
    pub key_size_max: usize,

    /// Subscribe address.
    #[arg(long, default_value = "0.0.0.0:9401")]
    pub subscribe: SocketAddr,

    /// Admin HTTP address (/metrics, /stats, /partitions). Loopback by default.
    #[arg(long, default_value = "127.0.0.1:9402")]
    pub admin: SocketAddr,

    /// This node's internode address (UDP gossip, and the node-to-node TCP
    /// transport on the same port number). A node binds it only when this
    /// flag or --join is given [default with --join: 0.0.0.0:9404]; without
    /// either, the node is a cluster of one that binds nothing more than
    /// before, so two single nodes on one machine never clash on it.
    #[arg(long)]
    pub cluster: Option<SocketAddr>,

    /// Members to join through (comma-separated `host:port` cluster
    /// addresses; any live member will do). Implies --cluster.
    #[arg(long, value_delimiter = ',', value_parser = parse_socket_address)]
    pub join: Vec<SocketAddr>,

    /// The cluster address other nodes should use for this one [default:
    /// --cluster when its IP is specific, else the local IP that routes to
    /// the first --join address, else 127.0.0.1]. Listeners bound to
    /// 0.0.0.0 are advertised on this IP.
    #[arg(long, value_parser = parse_socket_address)]
    pub advertise: Option<SocketAddr>,

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

    /// With `--storage disk` and `--fsync always` or `interval`: bytes of
    /// each shard's write-ahead log, a ring of 4 recycled files that every
    /// commit round appends to (one write, one fdatasync for all its
    /// partitions). When it fills, segment files are synced directly.
    #[arg(long, default_value_t = WAL_BYTES_MAX_DEFAULT)]
    pub wal_bytes_max: usize,

    /// With `--fsync interval` or `always`: `on` lets a commit round whose
    /// log write would carry a block (4 KiB) or more per partition (4 MiB
    /// or more for a round that must sync: a `#SYNC`'s, or any under
    /// `always`) write its frames straight to the segment files instead,
    /// and make them durable with one syncfs of the data directory's
    /// filesystem when a sync is due, so each byte is written once instead
    /// of twice (log and segment); `off` writes every round to the log.
    /// Either keeps the policy's promise (README, Storage and durability).
    #[arg(long, value_enum, default_value_t = WalBypass::On)]
    pub wal_bypass: WalBypass,

    /// Transparent huge pages for this process. `off` asks the kernel for
    /// none (prctl PR_SET_THP_DISABLE, before any shard starts): on the VM
    /// spate is measured on, a fresh 2 MiB page stalled the thread that
    /// touched it first for milliseconds, which set the replicated `#SYNC`
    /// p99 (25 - 97 ms at 16 partitions, 6 - 7 ms without) and cost memory
    /// and disk ingest throughput. `on` leaves them to the kernel's mode:
    /// the allocator's memory, disk write buffers included, may use them,
    /// and O_DIRECT writes from 2 MiB pages ran 1.35x faster on this disk;
    /// worth it where the disk, not the CPU, bounds ingest (README,
    /// "Transparent huge pages").
    #[arg(long, value_enum, default_value_t = HugePages::Off)]
    pub huge_pages: HugePages,

    /// With a write-ahead log: how often the segment files written since
    /// the last checkpoint are fdatasynced in bulk, freeing the log behind
    /// them, in ms (sooner when half the log is used).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=DURATION_FLAG_MS_MAX))]
    pub wal_checkpoint_ms: u64,

    /// With `--storage disk`: recent events each partition keeps in memory,
    /// in bytes, so live subscribers read without I/O.
    #[arg(long, default_value_t = 256 * KIB)]
    pub tail_cache_bytes: usize,

    /// Keys one aggregate tracks per partition; a new key beyond it is
    /// refused (counted in spate_aggregate_keys_refused_total). Memory: see
    /// README "Keyed aggregates" (at most 322 bytes per key of 32 bytes in
    /// tumbling windows).
    #[arg(long, default_value_t = KEYS_PER_AGGREGATE_MAX)]
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

    /// Nice value of the admin thread (HTTP: aggregate queries, /stats,
    /// stream changes), -20..19. It uses next to no CPU; a lower value lets
    /// it run as soon as a request or a shard's answer wakes it while the
    /// shards keep the cores busy (measured on a 2-core box at half the peak
    /// rate: the reply hop's p99 3.7 -> 1.9-2.2 ms). Needs CAP_SYS_NICE to go
    /// below 0; without it the thread keeps the process's value (logged).
    #[arg(long, default_value_t = -10, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub control_nice: i32,

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

    /// Consolidation at low load: `on` gathers every partition onto fewer
    /// shards while the whole process's load fits in them with room to spare
    /// (a write then wakes one shard instead of a chain of them, and the
    /// others park), and spreads them out again when the load rises; `off`
    /// keeps every shard in use (the default for now: not every test suite
    /// passes with it on yet, see README, Dynamic partitioning). Off with
    /// `--rebalance off` too.
    #[arg(long, value_enum, default_value_t = Rebalance::Off)]
    pub consolidate: Rebalance,

    /// Gather onto fewer shards while the process's stored events/s is at
    /// most this per kept shard (for `--consolidate-hold-ms`).
    #[arg(long, default_value_t = 600_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub consolidate_events_per_s_max: u64,

    /// Spread again as soon as the stored events/s exceeds this per kept
    /// shard. Must be above --consolidate-events-per-s-max: the band between
    /// them is the hysteresis that keeps a load near either from flapping.
    #[arg(long, default_value_t = 1_200_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub spread_events_per_s_min: u64,

    /// Spread again when a kept shard stays busier than this share of its
    /// time (percent) for half a second, whatever the events rate.
    #[arg(long, default_value_t = 75, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub spread_busy_percent_min: u8,

    /// How long the load must stay low enough before partitions gather, in ms.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=DURATION_FLAG_MS_MAX))]
    pub consolidate_hold_ms: u64,

    /// TEST KNOB, off by default: nanoseconds of extra work per applied event,
    /// to make the apply stage slow and exercise backpressure.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=APPLY_DELAY_NS_PER_EVENT_MAX))]
    pub apply_delay_ns_per_event: u64,

    /// TEST KNOB, off by default: every peer's transport link is kept full
    /// of 64 KiB filler messages (channel `bulk`), to measure throughput and
    /// exercise the transport's credits.
    #[arg(long, default_value_t = false)]
    pub transport_test_flood: bool,

    /// TEST KNOB, off by default: microseconds this node's consumer of the
    /// transport's filler messages takes per KiB before it releases one (a
    /// slow receiver: its credits come back slowly).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub transport_test_receive_us_per_kib: u64,

    /// With `--cluster`: bytes of Raft log entries (every replicated
    /// group's, memory and `replication/raft-*` files alike) the node holds
    /// before it refuses proposals. Entries leave once applied and durable
    /// in their partition's log (compaction), so this is reached only when
    /// compaction falls behind; it is in the memory formula.
    #[arg(long, default_value_t = crate::replication::file_store::ENTRY_BYTES_MAX, value_parser = clap::value_parser!(u64).range(MIB as u64..=(1 << 40)))]
    pub raft_log_bytes_max: u64,

    /// TEST KNOB: shards the apply delay applies to (comma-separated ids);
    /// empty means every shard. Makes one shard the slow, "hot" one.
    #[arg(long, value_delimiter = ',')]
    pub apply_delay_shards: Vec<u16>,

    /// TEST KNOB, off by default: the last shard panics this many ms after
    /// it started, to prove that a panic stops the whole process at once.
    #[arg(long, hide = true)]
    pub test_panic_after_ms: Option<u64>,

    /// TEST KNOB, off by default: the last shard never finishes starting
    /// (it waits for nothing, asleep), as a start-up hang seen in CI did,
    /// to prove that the process then exits after --start-timeout-ms.
    #[arg(long, hide = true)]
    pub test_stall_start: bool,

    /// How long every shard may take to start (open and recover its
    /// partitions) before the process gives up and exits with status 1, in
    /// ms: a shard that never starts must not wedge the process, and a
    /// supervisor starts it again.
    #[arg(long, default_value_t = 30_000)]
    pub start_timeout_ms: u64,
}

/// Where events are kept.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    Disk,
    Memory,
}

/// Which CPUs the shards run on (`--cpus`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cpus {
    Auto,
    None,
    /// Sorted, without duplicates.
    List(Vec<usize>),
}

/// The highest CPU id `--cpus` takes (the kernel's affinity mask size).
pub const CPU_ID_MAX: usize = 1023;

impl std::str::FromStr for Cpus {
    type Err = String;

    fn from_str(text: &str) -> Result<Cpus, String> {
        match text {
            "auto" => return Ok(Cpus::Auto),
            "none" => return Ok(Cpus::None),
            _ => {}
        }
        let bad = |why: &str| format!("{text:?}: {why} (auto, none, or CPU ids and ranges such as 0-3,6)");
        let mut cpus = Vec::new();
        for part in text.split(',') {
            let (first, last) = part.split_once('-').unwrap_or((part, part));
            let (Ok(first), Ok(last)) = (first.trim().parse::<usize>(), last.trim().parse::<usize>()) else {
                return Err(bad("not a CPU id"));
            };
            if first > last || last > CPU_ID_MAX {
                return Err(bad(&format!("a range must go up, to at most {CPU_ID_MAX}")));
            }
            cpus.extend(first..=last);
        }
        cpus.sort_unstable();
        cpus.dedup();
        Ok(Cpus::List(cpus))
    }
}

impl std::fmt::Display for Cpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cpus::Auto => write!(f, "auto"),
            Cpus::None => write!(f, "none"),
            Cpus::List(cpus) => {
                let ids: Vec<String> = cpus.iter().map(usize::to_string).collect();
                write!(f, "{}", ids.join(","))
            }
        }
    }
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

/// `--kafka-auto-create`: off, or the partitions a stream created by a
/// Kafka client gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoCreate(pub Option<u32>);

fn parse_auto_create(text: &str) -> Result<AutoCreate, String> {
    if text == "off" {
        return Ok(AutoCreate(None));
    }
    match text.parse::<u32>() {
        Ok(partitions) if partitions > 0 => Ok(AutoCreate(Some(partitions))),
        _ => Err(format!("expected `off` or a partition count of at least 1, got {text:?}")),
    }
}

/// `host:port` or `ip:port`, resolved once at start-up.
fn parse_socket_address(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let mut resolved = text.to_socket_addrs().map_err(|error| format!("{text}: {error}"))?;
    resolved.next().ok_or_else(|| format!("{text}: resolves to no address"))
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

/// Whether `--fsync interval` rounds may bypass the write-ahead log.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalBypass {
    On,
    Off,
}

/// Whether the process may use transparent huge pages.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugePages {
    On,
    Off,
}

/// Whether shards move partitions between them at runtime.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rebalance {
    On,
    Off,
}

/// The internode address a node binds once `--join` is given without
/// `--cluster`.
pub const CLUSTER_ADDRESS_DEFAULT: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), 9404);

/// A configuration that cannot work, with the numbers involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// `--advertise` on a node that is not in a cluster (no `--cluster`, no `--join`).
    AdvertiseWithoutCluster,
    /// Two of the node's listeners on one port of overlapping addresses
    /// (every shard binds its listeners with SO_REUSEPORT, so the kernel
    /// would not refuse it: the two would share the connections).
    SameAddress {
        first: &'static str,
        second: &'static str,
        address: SocketAddr,
    },
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
            ConfigError::AdvertiseWithoutCluster => {
                write!(f, "--advertise needs --cluster or --join: a node without them is a cluster of one")
            }
            ConfigError::SameAddress { first, second, address } => write!(
                f,
                "{first} and {second} both listen on {address}: give each its own port (or `off` where the \
                 flag takes it)"
            ),
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

impl Config {
    /// Shards to run: --shards, or one per CPU of --cpus, or one per CPU
    /// this process may run on.
    pub fn shard_count(&self) -> usize {
        self.shards.unwrap_or_else(|| match &self.cpus {
            Cpus::List(cpus) => cpus.len(),
            Cpus::Auto | Cpus::None => std::thread::available_parallelism().map(|count| count.get()).unwrap_or(1),
        })
    }

    /// The internode address this node binds, or `None` for a cluster of
    /// one (no `--cluster`, no `--join`).
    pub fn cluster_address(&self) -> Option<SocketAddr> {
        self.cluster.or_else(|| (!self.join.is_empty()).then_some(CLUSTER_ADDRESS_DEFAULT))
    }

    /// Checks that the flags fit together, one by one and in pairs; the
    /// memory bound's check is [`Config::validate`]'s, which runs this first.
    pub(super) fn validate_flags(&self) -> Result<(), ConfigError> {
        self.validate_counts()?;
        self.validate_format_limits()?;
        self.validate_relations()
    }

    fn validate_counts(&self) -> Result<(), ConfigError> {
        let shard_count = self.shard_count();
        if shard_count == 0 || shard_count > SHARD_COUNT_MAX {
            return Err(ConfigError::ShardCount { shard_count, shard_count_max: SHARD_COUNT_MAX });
        }
        if let Cpus::List(cpus) = &self.cpus
            && shard_count > cpus.len()
        {
            let why = "--cpus pins one shard per CPU";
            return Err(ConfigError::TooLarge { name: "--shards", value: shard_count, max: cpus.len(), why });
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
            ("--key-size-max", self.key_size_max, KEY_SIZE_LIMIT, "a record's key size is a u16"),
            ("--line-size-max", self.line_size_max, PAYLOAD_SIZE_LIMIT, "a record's payload size is a u32"),
            (
                "--segment-bytes",
                self.segment_bytes(),
                SEGMENT_SIZE_MAX as usize,
                "record positions in a segment are u32",
            ),
        ];
        for (name, value, max, why) in limits {
            if value > max {
                return Err(ConfigError::TooLarge { name, value, max, why });
            }
        }
        Ok(())
    }

    fn validate_relations(&self) -> Result<(), ConfigError> {
        if self.advertise.is_some() && self.cluster_address().is_none() {
            return Err(ConfigError::AdvertiseWithoutCluster);
        }
        self.validate_listeners_apart()?;
        if self.spread_events_per_s_min <= self.consolidate_events_per_s_max {
            return Err(ConfigError::TooSmall {
                name: "--spread-events-per-s-min",
                value: usize::try_from(self.spread_events_per_s_min).unwrap_or(usize::MAX),
                min: usize::try_from(self.consolidate_events_per_s_max).unwrap_or(usize::MAX).saturating_add(1),
                why: "above --consolidate-events-per-s-max, or a load between them would flap",
            });
        }
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
        if self.storage == Storage::Disk && self.wal_bytes_max < self.wal_bytes_min() {
            return Err(ConfigError::TooSmall {
                name: "--wal-bytes-max",
                value: self.wal_bytes_max,
                min: self.wal_bytes_min(),
                why: "each of the write-ahead log's 4 files holds two of its largest records",
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

    /// The node's client-facing listeners (ingest in every format,
    /// subscribe, admin) by flag, `off` ones left out: what start-up probes
    /// ([`crate::serve::checks::check_addresses`]) and keeps apart. The
    /// cluster address, bound by the cluster thread, is not one.
    pub(crate) fn listeners(&self) -> Vec<(&'static str, SocketAddr)> {
        let mut listeners = vec![("--ingest", self.ingest), ("--subscribe", self.subscribe), ("--admin", self.admin)];
        let optional = [
            ("--ingest-json", self.ingest_json.0),
            ("--ingest-ilp", self.ingest_ilp.0),
            ("--ingest-kafka", self.ingest_kafka.0),
        ];
        listeners.extend(optional.into_iter().filter_map(|(flag, address)| Some((flag, address?))));
        listeners
    }

    /// Refuses two listeners on one port whose addresses overlap (equal, or
    /// one of them unspecified in the same family), the cluster address
    /// among them (it also carries the node-to-node TCP transport). Port 0
    /// asks the kernel for a free port each time, so it never clashes.
    fn validate_listeners_apart(&self) -> Result<(), ConfigError> {
        let overlap = |a: SocketAddr, b: SocketAddr| {
            a.port() != 0
                && a.port() == b.port()
                && a.is_ipv4() == b.is_ipv4()
                && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
        };
        let mut listeners = self.listeners();
        listeners.extend(self.cluster_address().map(|address| ("--cluster", address)));
        for (index, &(first, a)) in listeners.iter().enumerate() {
            if let Some(&(second, _)) = listeners[index + 1..].iter().find(|&&(_, b)| overlap(a, b)) {
                return Err(ConfigError::SameAddress { first, second, address: a });
            }
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
        (self.tail_cache_bytes / 4).max(LOG_HEADER_SIZE + 1)
    }

    /// The largest batch record a line can produce (its credit cost).
    pub fn line_record_size_max(&self) -> usize {
        BATCH_HEADER_SIZE + self.line_size_max
    }

    /// Bytes of a partition's segment write buffer: the largest record in
    /// one frame, and a frame's target size, with a block to spare for the
    /// carried tail.
    pub fn segment_buffer_bytes(&self) -> usize {
        let largest_frame = self.line_record_size_max() + crate::storage::format::FRAME_HEADER_SIZE;
        let bytes = largest_frame.max(FRAME_BODY_BYTES_TARGET * 2) + WRITE_BLOCK_BYTES;
        bytes.div_ceil(WRITE_BLOCK_BYTES) * WRITE_BLOCK_BYTES
    }

    /// Bytes of a shard's write-ahead log buffer: a record holds whatever
    /// one segment write buffer holds, after a header and a carried block.
    pub fn wal_buffer_bytes(&self) -> usize {
        self.segment_buffer_bytes() + 2 * WRITE_BLOCK_BYTES
    }

    /// The smallest `--wal-bytes-max`: each of the ring's files holds two
    /// records of the largest size.
    pub fn wal_bytes_min(&self) -> usize {
        crate::storage::wal::WAL_FILE_COUNT as usize * 2 * self.wal_buffer_bytes()
    }

    /// The apply delay, in ns per event, for `shard` (the test knob).
    pub fn apply_delay_ns_per_event_on(&self, shard: u16) -> u64 {
        let applies = self.apply_delay_shards.is_empty() || self.apply_delay_shards.contains(&shard);
        if applies { self.apply_delay_ns_per_event } else { 0 }
    }

    /// Frames each mesh channel holds: every credited batch plus control.
    pub fn mesh_channel_frames(&self) -> usize {
        // Saturating, as the memory formula that multiplies it.
        self.credit_window_batches()
            .saturating_add(self.subscribers_per_shard_max.saturating_mul(2))
            .saturating_add(MESH_CONTROL_SLOTS)
    }
}

/// Parses `spate serve` flags for tests, as clap does at start-up.
#[cfg(test)]
pub(crate) mod parse {
    use clap::Parser;

    use super::Config;

    #[derive(clap::Parser)]
    pub(crate) struct Cli {
        #[command(flatten)]
        pub config: Config,
    }

    /// The configuration `args` (after `spate serve`) give; panics on a flag clap refuses.
    pub(crate) fn parse(args: &[&str]) -> Config {
        Cli::parse_from(std::iter::once("spate").chain(args.iter().copied())).config
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::parse::{Cli, parse};
    use super::*;

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

    /// `--cpus` takes auto, none, or ids and ranges (sorted, deduplicated);
    /// anything else is refused with the accepted forms, and a list sets
    /// the default shard count and caps --shards.
    #[test]
    fn cpu_lists_parse_and_bad_ones_are_refused() {
        assert_eq!("auto".parse::<Cpus>(), Ok(Cpus::Auto));
        assert_eq!("none".parse::<Cpus>(), Ok(Cpus::None));
        assert_eq!("3,0-1,1".parse::<Cpus>(), Ok(Cpus::List(vec![0, 1, 3])));
        assert_eq!(Cpus::List(vec![0, 1, 3]).to_string(), "0,1,3");
        for bad in ["", "x", "3-1", "0-", "-1", "1024", "0,,1"] {
            let error = bad.parse::<Cpus>().unwrap_err();
            assert!(error.contains("0-3,6"), "{bad}: {error}");
        }
        assert_eq!(parse(&["--cpus", "0-2"]).shard_count(), 3);
        let error = parse(&["--cpus", "0", "--shards", "2"]).validate().unwrap_err();
        assert!(matches!(error, ConfigError::TooLarge { name: "--shards", value: 2, max: 1, .. }), "{error}");
        let error = parse(&["--shards", "1", "--advertise", "127.0.0.1:1"]).validate().unwrap_err();
        assert_eq!(error, ConfigError::AdvertiseWithoutCluster);
    }

    /// Two listeners on one port of overlapping addresses are refused,
    /// naming both flags; port 0, other ports, `off` and distinct specific
    /// addresses are not.
    #[test]
    fn two_listeners_on_one_address_are_refused() {
        let error = parse(&["--subscribe", "0.0.0.0:9400"]).validate().unwrap_err();
        let address: SocketAddr = "0.0.0.0:9400".parse().unwrap();
        assert_eq!(error, ConfigError::SameAddress { first: "--ingest", second: "--subscribe", address });
        assert!(error.to_string().contains("--ingest and --subscribe both listen on 0.0.0.0:9400"), "{error}");
        let error = parse(&["--admin", "127.0.0.1:9092"]).validate().unwrap_err();
        assert!(matches!(error, ConfigError::SameAddress { first: "--admin", second: "--ingest-kafka", .. }));
        let error = parse(&["--cluster", "127.0.0.1:9401"]).validate().unwrap_err();
        assert!(matches!(error, ConfigError::SameAddress { first: "--subscribe", second: "--cluster", .. }));
        parse(&[]).validate().expect("the defaults are apart");
        parse(&["--ingest", "127.0.0.1:0", "--subscribe", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .validate()
            .expect("port 0 never clashes");
        parse(&["--ingest", "127.0.0.1:7000", "--subscribe", "127.0.0.2:7000"]).validate().expect("distinct IPs");
        parse(&["--ingest-kafka", "off", "--admin", "127.0.0.1:9092"]).validate().expect("off listens nowhere");
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
}
