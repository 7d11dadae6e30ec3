//! `spate bench` flags, and the checked [`Plan`] a run follows.

use std::path::PathBuf;
use std::time::Duration;

use crate::bench::BenchError;
use crate::bench::keys::{KeyDistribution, KeySampler};
use crate::bench::stamp::STAMP_WIDTH;
use crate::protocol::KEY_SIZE_MAX;

/// Most producer connections (each costs a thread, a write buffer and a 4 MiB draw ring).
pub const CONNECTION_COUNT_MAX: usize = 1024;
/// Largest payload (a line must stay far below the server's 1 MiB default limit).
pub const PAYLOAD_BYTES_MAX: usize = 64 * 1024;
/// Largest write buffer per connection.
pub const WRITE_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Longest pacing tick of the open loop.
pub const TICK_US_MAX: u64 = 100_000;
/// Run length when neither --events nor --duration-s is given.
pub const DURATION_S_DEFAULT: f64 = 10.0;
/// Measured length of each sweep point when --duration-s is not given.
pub const SWEEP_DURATION_S_DEFAULT: f64 = 5.0;
/// Warm-up of each sweep point when --warmup-s is not given (single runs have none).
pub const SWEEP_WARMUP_S_DEFAULT: f64 = 1.0;
/// Longest run (warm-up included) against NATS: its producers do not read
/// until the end, so they miss the server's PINGs (every 120 s; two missed
/// and NATS drops the connection as stale).
pub const NATS_RUN_S_MAX: f64 = 200.0;
/// Most rates in one --sweep.
pub const SWEEP_POINT_COUNT_MAX: usize = 64;
/// Most sweep files one --compare draws together.
pub const COMPARE_FILE_COUNT_MAX: usize = 8;

/// `spate bench` flags.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "Closed loop (no --rate) sends as fast as TCP accepts, so its latency includes queueing \
behind the producer's own backlog. Open loop (--rate) sends on a fixed schedule and measures latency from each \
event's intended send time (coordinated-omission-correct). --sweep runs one open-loop point per rate against one \
server. --target nats drives nats-server with the same generator and subscriber (see src/bench/nats.rs).")]
pub struct BenchArgs {
    /// What to drive: spate (the line protocol) or nats (NATS core: PUB to one subject, one subscriber).
    #[arg(long, value_enum, default_value_t = Target::Spate)]
    pub target: Target,
    /// Address of nats-server (--target nats; start it yourself, e.g. scripts/bench-latency does).
    #[arg(long, default_value = "127.0.0.1:4222")]
    pub nats: String,
    /// Kafka listener of a running server (--target kafka without --start-server).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub kafka: String,
    /// Topic (stream) --target kafka produces to; `default` is the stream lines go to.
    #[arg(long, default_value = "default")]
    pub kafka_topic: String,
    /// Stream the line-protocol producers write to (a `#STREAM` line first on each connection);
    /// another than `default` needs --no-subscriber (the subscriber reads `default`).
    #[arg(long, default_value = crate::stream::DEFAULT_STREAM)]
    pub stream: String,
    /// acks of --target kafka's Produce requests: 1 (applied) or -1 (all: durable under --fsync).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true)]
    pub kafka_acks: i16,
    /// Produce requests in flight per connection (--target kafka).
    #[arg(long, default_value_t = 4)]
    pub kafka_in_flight: usize,
    /// Pid of a server the bench did not start, for its CPU time (/proc/<pid>/stat). Without it the bench
    /// looks for the process listening on the ingest (or --nats) port.
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// Ingest address of a running server (unused with --start-server).
    #[arg(long, default_value = "127.0.0.1:9400")]
    pub ingest: String,
    /// Subscribe address of a running server (unused with --start-server).
    #[arg(long, default_value = "127.0.0.1:9401")]
    pub subscribe: String,
    /// Admin HTTP address of a running server (unused with --start-server).
    #[arg(long, default_value = "127.0.0.1:9402")]
    pub admin: String,
    /// Start `spate serve` (this binary) on free loopback ports, and stop it with SIGTERM at the end.
    #[arg(long)]
    pub start_server: bool,
    /// Shards of the server --start-server starts.
    #[arg(long, default_value_t = 2)]
    pub server_shards: usize,
    /// Storage of the server --start-server starts: `memory` (the default
    /// here, so runs measure the engine, not the disk) or `disk`, in a fresh
    /// temporary --data-dir removed afterwards.
    #[arg(long, value_enum, default_value_t = crate::config::Storage::Memory)]
    pub storage: crate::config::Storage,
    /// --fsync of the started server (with --storage disk).
    #[arg(long, value_enum, default_value_t = crate::config::FsyncPolicy::Interval)]
    pub fsync: crate::config::FsyncPolicy,
    /// One more argument for the started server, repeated per token:
    /// `--server-arg=--partitions --server-arg=64`.
    #[arg(long = "server-arg", allow_hyphen_values = true, value_name = "ARG")]
    pub server_args: Vec<String>,
    /// --log-prefault-bytes of the server --start-server starts with memory
    /// storage. Default: about the log this run writes per shard (its
    /// events, or rate times seconds, closed loop by duration at 10 M/s),
    /// at most 1 GiB, so a run measures the engine rather than how fast the
    /// machine faults in fresh pages. 0 = none. The report's server command
    /// line shows the value.
    #[arg(long, value_name = "BYTES")]
    pub server_prefault_bytes: Option<usize>,

    /// Producer connections (closed loop: a thread each; open loop: shared by the --pacer-threads).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Events to send in total (split evenly over connections).
    #[arg(long, conflicts_with = "duration_s")]
    pub events: Option<u64>,
    /// Send for this many seconds instead of a fixed count (default 10 s if --events is absent).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Payload bytes per event. The first 16 carry the send-time stamp.
    #[arg(long, default_value_t = 64)]
    pub payload_bytes: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 100_000)]
    pub keys: u32,
    /// How keys are drawn.
    #[arg(long, value_enum, default_value_t = KeyDist::Uniform)]
    pub key_dist: KeyDist,
    /// Zipf exponent (--key-dist zipf).
    #[arg(long, default_value_t = 1.1)]
    pub zipf_s: f64,
    /// Keys in the hot set (--key-dist hotspot).
    #[arg(long, default_value_t = 16)]
    pub hot_keys: u32,
    /// Share of events that go to the hot set (--key-dist hotspot).
    #[arg(long, default_value_t = 0.5)]
    pub hot_share: f64,
    /// The hot set moves to other keys this often, in seconds (--key-dist hotspot).
    #[arg(long, default_value_t = 5.0)]
    pub shift_every_s: f64,

    /// Open loop: send this many events/s in total, on a fixed schedule. Absent: closed loop, as fast as possible.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Latency against rate: one open-loop point per rate (comma-separated events/s), each --warmup-s then
    /// --duration-s (default 5 s), against one server, with a fresh subscriber per point.
    #[arg(long, value_delimiter = ',', value_name = "RATES", conflicts_with_all = ["rate", "events"])]
    pub sweep: Option<Vec<f64>>,
    /// Seconds at the start of a run (or of each sweep point) that are sent and received but not timed, and
    /// not counted in the CPU per event (default: 1 with --sweep, else 0).
    #[arg(long)]
    pub warmup_s: Option<f64>,
    /// Name of this run in sweep tables and plots (default: the target and its version).
    #[arg(long)]
    pub label: Option<String>,
    /// Run nothing: read sweep JSON files (written by --sweep --json), print them side by side (latency ratios
    /// against the first) and, with --plot-dir, draw them on one plot; --json writes the combined document.
    #[arg(long, value_delimiter = ',', value_name = "FILES", conflicts_with_all = ["sweep", "rate", "start_server"])]
    pub compare: Option<Vec<PathBuf>>,
    /// Open loop: a pacer wakes up at most once per tick and sends everything due, one write per connection. The
    /// wait counts in the latency (up to one tick); shorter ticks cost more CPU (a wake-up and a write per
    /// connection per tick cost tens of µs on a VM, loopback receive path included).
    #[arg(long, default_value_t = 100)]
    pub tick_us: u64,
    /// Open loop: threads that pace the connections (each serves its share of them, one wake-up per tick).
    #[arg(long, default_value_t = 1)]
    pub pacer_threads: usize,
    /// Bytes a connection builds and writes at once.
    #[arg(long, default_value_t = 256 * 1024)]
    pub write_bytes: usize,
    /// No subscriber: measure pure ingest (no latency figures).
    #[arg(long)]
    pub no_subscriber: bool,
    /// Where the subscriber starts: `latest` (opened before sending starts) or `earliest` (replay too).
    #[arg(long, value_enum, default_value_t = SubFrom::Latest)]
    pub sub_from: SubFrom,
    /// After the last SYNC, wait this long (without progress) for the subscriber to see every event.
    #[arg(long, default_value_t = 10.0)]
    pub drain_timeout_s: f64,
    /// Seed of the key draws (connection i uses seed + i).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write latency.svg and shards.svg into this directory (--sweep: latency-vs-rate.svg; --compare:
    /// latency-vs-rate-compare.svg).
    #[arg(long, value_name = "DIR")]
    pub plot_dir: Option<PathBuf>,
}

/// `--key-dist`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyDist {
    Uniform,
    Zipf,
    Hotspot,
}

/// `--target`: the server the generator drives.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Spate,
    Nats,
    /// spate's Kafka listener: Produce requests (src/bench/kafka.rs).
    Kafka,
}

impl BenchArgs {
    /// The arguments of the server --start-server starts, after --shards and
    /// the addresses: its storage (unless a --server-arg names it), then
    /// every --server-arg.
    pub fn server_command_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        for (flag, value) in [("--storage", value_name(&self.storage)), ("--fsync", value_name(&self.fsync))] {
            if !self.server_args.iter().any(|arg| arg == flag) {
                args.extend([flag.to_string(), value]);
            }
        }
        let named = |flag: &str| self.server_args.iter().any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")));
        if self.storage == crate::config::Storage::Memory && !named("--log-prefault-bytes") {
            let bytes = self.server_prefault_bytes.unwrap_or_else(|| self.log_bytes_per_shard());
            args.extend(["--log-prefault-bytes".to_string(), bytes.to_string()]);
        }
        args.extend(self.server_args.iter().cloned());
        args
    }

    /// About the log bytes one shard of a started server will hold after
    /// this run (records and their index slots, a quarter more for uneven
    /// partitions), at most [`PREFAULT_BYTES_PER_SHARD_MAX`].
    fn log_bytes_per_shard(&self) -> usize {
        let warmup_s = self.warmup_s.unwrap_or(if self.sweep.is_some() { 1.0 } else { 0.0 });
        let seconds = self.duration_s.unwrap_or(10.0) + warmup_s;
        let events = match (self.events, &self.sweep, self.rate) {
            (Some(events), _, _) => events as f64,
            (None, Some(rates), _) => rates.iter().sum::<f64>() * seconds,
            (None, None, Some(rate)) => rate * seconds,
            (None, None, None) => CLOSED_LOOP_EVENTS_PER_S_ASSUMED * seconds,
        };
        let record_bytes = crate::protocol::record::batch_record_size(&[0; 8], &vec![0; self.payload_bytes]) + 4;
        let bytes = events * record_bytes as f64 * 1.25 / self.server_shards.max(1) as f64;
        (bytes as usize).min(PREFAULT_BYTES_PER_SHARD_MAX)
    }
}

/// The most a started server pre-faults per shard by default (the default
/// memory retention of 256 partitions over 2 shards is 1 GiB per shard).
pub const PREFAULT_BYTES_PER_SHARD_MAX: usize = 1 << 30;
/// The closed-loop rate assumed for a run by duration when sizing the
/// started server's pre-faulted log (about this machine's peak).
const CLOSED_LOOP_EVENTS_PER_S_ASSUMED: f64 = 10e6;

fn value_name(value: &impl clap::ValueEnum) -> String {
    value.to_possible_value().map(|value| value.get_name().to_string()).unwrap_or_default()
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Spate => "spate",
            Target::Nats => "nats",
            Target::Kafka => "kafka",
        }
    }
}

/// `--sub-from`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubFrom {
    Earliest,
    Latest,
}

impl SubFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            SubFrom::Earliest => "earliest",
            SubFrom::Latest => "latest",
        }
    }
}

/// When the producers stop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this many events in total.
    Events(u64),
    /// After this long.
    Duration(Duration),
}

/// A run's checked parameters, in units the code uses.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: Target,
    pub connection_count: usize,
    pub stop: Stop,
    pub payload_bytes: usize,
    pub sampler: KeySampler,
    /// Events/s over all connections; `None` is closed loop.
    pub rate: Option<f64>,
    pub tick: Duration,
    /// Open loop: threads pacing the connections.
    pub pacer_thread_count: usize,
    pub write_bytes: usize,
    pub subscriber: bool,
    pub drain_timeout: Duration,
    /// Sent and received, not timed, at the start of the run (of each sweep point).
    pub warmup: Duration,
    /// `--sweep`: the open-loop rates, in the order given.
    pub sweep_rates: Option<Vec<f64>>,
    /// Seed of the key draws (connection i uses seed + i).
    pub seed: u64,
    /// --target kafka: the topic, acks and requests in flight.
    pub kafka: Option<crate::bench::kafka::KafkaOptions>,
    /// `--stream` other than `default`: the stream named on each connection.
    pub stream: Option<String>,
}

impl Plan {
    /// Checks the flags against their limits and returns the plan in the
    /// units the code uses; the first bad flag is the error.
    pub fn from_args(args: &BenchArgs) -> Result<Plan, BenchError> {
        let subscriber = !args.no_subscriber;
        check_connections(args)?;
        check_payload_bytes(args, subscriber)?;
        let sweep_rates = match &args.sweep {
            Some(rates) => Some(check_sweep(rates)?),
            None => None,
        };
        let warmup = check_warmup(args, sweep_rates.is_some())?;
        let stop = check_stop(args, sweep_rates.is_some(), warmup)?;
        if args.target == Target::Nats {
            check_nats(args, stop, subscriber)?;
        }
        let kafka = (args.target == Target::Kafka).then(|| check_kafka(args)).transpose()?;
        check_sending(args)?;
        check_drain_timeout(args)?;
        check_server_shards(args)?;
        let stream = check_stream(args, subscriber)?;
        let sampler = key_sampler(args)?;
        Ok(Plan {
            target: args.target,
            connection_count: args.connections,
            stop,
            payload_bytes: args.payload_bytes,
            sampler,
            rate: args.rate,
            tick: Duration::from_micros(args.tick_us),
            pacer_thread_count: args.pacer_threads.min(args.connections),
            write_bytes: args.write_bytes,
            subscriber,
            drain_timeout: Duration::from_secs_f64(args.drain_timeout_s),
            warmup,
            sweep_rates,
            seed: args.seed,
            kafka,
            stream,
        })
    }

    /// This plan as one open-loop point at `rate` events/s.
    pub fn at_rate(&self, rate: f64) -> Plan {
        Plan { rate: Some(rate), sweep_rates: None, ..self.clone() }
    }

    /// Producer threads: one per connection in closed loop, the pacers in open loop.
    pub fn producer_thread_count(&self) -> usize {
        if self.rate.is_some() { self.pacer_thread_count } else { self.connection_count }
    }

    /// Events connection `index` sends under `Stop::Events` (the remainder
    /// goes to the first connections); `None` for a timed run.
    pub fn connection_quota(&self, index: usize) -> Option<u64> {
        let Stop::Events(events) = self.stop else { return None };
        let count = self.connection_count as u64;
        Some(events / count + u64::from((index as u64) < events % count))
    }
}

/// The error for a flag whose `value` breaks `reason`.
fn invalid(flag: &'static str, value: String, reason: &'static str) -> BenchError {
    BenchError::Invalid { flag, value, reason }
}

/// Checks the `--kafka-*` flags of `--target kafka`.
fn check_kafka(args: &BenchArgs) -> Result<crate::bench::kafka::KafkaOptions, BenchError> {
    if !matches!(args.kafka_acks, 1 | -1) {
        return Err(invalid("--kafka-acks", args.kafka_acks.to_string(), "must be 1 or -1 (0 acknowledges nothing)"));
    }
    if !(1..=crate::bench::kafka::IN_FLIGHT_MAX).contains(&args.kafka_in_flight) {
        return Err(invalid("--kafka-in-flight", args.kafka_in_flight.to_string(), "must be between 1 and 64"));
    }
    if args.kafka_topic.is_empty() {
        return Err(invalid("--kafka-topic", String::new(), "must name a stream"));
    }
    Ok(crate::bench::kafka::KafkaOptions {
        topic: args.kafka_topic.clone(),
        acks: args.kafka_acks,
        in_flight_max: args.kafka_in_flight,
    })
}

/// Checks `--connections`.
fn check_connections(args: &BenchArgs) -> Result<(), BenchError> {
    if args.connections == 0 || args.connections > CONNECTION_COUNT_MAX {
        return Err(invalid("--connections", args.connections.to_string(), "must be between 1 and 1024"));
    }
    Ok(())
}

/// Checks `--payload-bytes`: room for the send-time stamp when a subscriber
/// reads it, and far below the server's line limit.
fn check_payload_bytes(args: &BenchArgs, subscriber: bool) -> Result<(), BenchError> {
    if subscriber && args.payload_bytes < STAMP_WIDTH {
        return Err(invalid(
            "--payload-bytes",
            args.payload_bytes.to_string(),
            "must be at least 16 (the send-time stamp) unless --no-subscriber",
        ));
    }
    if args.payload_bytes > PAYLOAD_BYTES_MAX {
        return Err(invalid("--payload-bytes", args.payload_bytes.to_string(), "must be at most 65536"));
    }
    Ok(())
}

/// Checks the rates of `--sweep`.
fn check_sweep(rates: &[f64]) -> Result<Vec<f64>, BenchError> {
    let invalid = |value: String, reason| BenchError::Invalid { flag: "--sweep", value, reason };
    if rates.is_empty() || rates.len() > SWEEP_POINT_COUNT_MAX {
        return Err(invalid(rates.len().to_string(), "must list between 1 and 64 rates"));
    }
    if let Some(rate) = rates.iter().find(|rate| !(rate.is_finite() && **rate >= 1.0)) {
        return Err(invalid(rate.to_string(), "every rate must be at least 1 event/s"));
    }
    Ok(rates.to_vec())
}

/// The warm-up: `--warmup-s`, else 1 s for a sweep and none for a single run.
fn check_warmup(args: &BenchArgs, sweep: bool) -> Result<Duration, BenchError> {
    let warmup_s = args.warmup_s.unwrap_or(if sweep { SWEEP_WARMUP_S_DEFAULT } else { 0.0 });
    if !(warmup_s.is_finite() && (0.0..1e6).contains(&warmup_s)) {
        return Err(invalid("--warmup-s", warmup_s.to_string(), "must be a number of seconds >= 0"));
    }
    Ok(Duration::from_secs_f64(warmup_s))
}

/// When the producers stop: after `--events`, else after the warm-up plus
/// `--duration-s` (default 10 s, or 5 s per sweep point).
fn check_stop(args: &BenchArgs, sweep: bool, warmup: Duration) -> Result<Stop, BenchError> {
    match (args.events, args.duration_s) {
        (Some(0), _) => Err(invalid("--events", "0".into(), "must be at least 1")),
        (Some(events), _) => Ok(Stop::Events(events)),
        (None, duration_s) => {
            let default_s = if sweep { SWEEP_DURATION_S_DEFAULT } else { DURATION_S_DEFAULT };
            let duration_s = duration_s.unwrap_or(default_s);
            if !(duration_s.is_finite() && duration_s > 0.0 && duration_s < 1e6) {
                return Err(invalid("--duration-s", duration_s.to_string(), "must be a number of seconds > 0"));
            }
            // The warm-up comes first, then the measured --duration-s.
            Ok(Stop::Duration(warmup + Duration::from_secs_f64(duration_s)))
        }
    }
}

/// What a run against NATS cannot do: run long (see [`NATS_RUN_S_MAX`]),
/// start the server, or replay history.
fn check_nats(args: &BenchArgs, stop: Stop, subscriber: bool) -> Result<(), BenchError> {
    if let Stop::Duration(duration) = stop
        && duration.as_secs_f64() > NATS_RUN_S_MAX
    {
        return Err(invalid(
            "--duration-s",
            duration.as_secs_f64().to_string(),
            "a run against NATS must stay under 200 s (producers do not answer the server's PINGs)",
        ));
    }
    if args.start_server {
        return Err(invalid(
            "--start-server",
            "nats".into(),
            "spate bench starts only spate; start nats-server yourself",
        ));
    }
    if subscriber && args.sub_from == SubFrom::Earliest {
        return Err(invalid("--sub-from", "earliest".into(), "NATS core keeps no history: use latest"));
    }
    Ok(())
}

/// Checks how the producers send: `--rate`, `--tick-us`, `--pacer-threads`
/// and `--write-bytes`.
fn check_sending(args: &BenchArgs) -> Result<(), BenchError> {
    if let Some(rate) = args.rate
        && !(rate.is_finite() && rate >= 1.0)
    {
        return Err(invalid("--rate", rate.to_string(), "must be at least 1 event/s"));
    }
    if args.tick_us == 0 || args.tick_us > TICK_US_MAX {
        return Err(invalid("--tick-us", args.tick_us.to_string(), "must be between 1 and 100000"));
    }
    if args.pacer_threads == 0 {
        return Err(invalid("--pacer-threads", "0".into(), "must be at least 1"));
    }
    if args.write_bytes < 4096 || args.write_bytes > WRITE_BYTES_MAX {
        return Err(invalid("--write-bytes", args.write_bytes.to_string(), "must be between 4 KiB and 64 MiB"));
    }
    Ok(())
}

/// Checks `--stream`: a stream name for line-protocol producers, without a
/// subscriber (which reads `default`); `None` for `default`.
fn check_stream(args: &BenchArgs, subscriber: bool) -> Result<Option<String>, BenchError> {
    if args.stream == crate::stream::DEFAULT_STREAM {
        return Ok(None);
    }
    if args.stream.is_empty() || args.stream.bytes().any(|byte| byte.is_ascii_whitespace()) {
        return Err(invalid("--stream", args.stream.clone(), "must be a stream name without spaces"));
    }
    if args.target != Target::Spate || subscriber {
        return Err(invalid("--stream", args.stream.clone(), "needs --target spate and --no-subscriber"));
    }
    Ok(Some(args.stream.clone()))
}

/// Checks `--drain-timeout-s`.
fn check_drain_timeout(args: &BenchArgs) -> Result<(), BenchError> {
    if !(args.drain_timeout_s.is_finite() && args.drain_timeout_s >= 0.0 && args.drain_timeout_s < 1e6) {
        return Err(invalid("--drain-timeout-s", args.drain_timeout_s.to_string(), "must be a number of seconds"));
    }
    Ok(())
}

/// Checks `--server-shards` when the bench starts the server.
fn check_server_shards(args: &BenchArgs) -> Result<(), BenchError> {
    if args.start_server && (args.server_shards == 0 || args.server_shards > crate::config::SHARD_COUNT_MAX) {
        return Err(invalid("--server-shards", args.server_shards.to_string(), "must be between 1 and 256"));
    }
    Ok(())
}

/// The key sampler of `--key-dist` and its parameters, over `--keys` keys.
fn key_sampler(args: &BenchArgs) -> Result<KeySampler, BenchError> {
    let distribution = match args.key_dist {
        KeyDist::Uniform => KeyDistribution::Uniform,
        KeyDist::Zipf => KeyDistribution::Zipf { exponent: args.zipf_s },
        KeyDist::Hotspot => {
            if !(args.shift_every_s.is_finite() && args.shift_every_s > 0.0 && args.shift_every_s < 1e6) {
                return Err(invalid("--shift-every-s", args.shift_every_s.to_string(), "must be > 0"));
            }
            KeyDistribution::Hotspot {
                hot_key_count: args.hot_keys,
                hot_share: args.hot_share,
                shift_every_ns: (args.shift_every_s * 1e9) as u64,
            }
        }
    };
    KeySampler::new(distribution, args.keys).map_err(BenchError::Keys)
}

// Bench keys must be valid protocol keys.
const _: () = assert!(crate::bench::keys::KEY_WIDTH_MAX <= KEY_SIZE_MAX, "the widest bench key is a valid key");

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn plan(flags: &[&str]) -> Result<Plan, BenchError> {
        let cli = Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied())).unwrap();
        Plan::from_args(&cli.args)
    }

    /// Defaults give a 10 s closed-loop run with a subscriber.
    #[test]
    fn defaults_are_a_timed_closed_loop() {
        let plan = plan(&[]).unwrap();
        assert_eq!(plan.stop, Stop::Duration(Duration::from_secs(10)));
        assert_eq!(plan.rate, None);
        assert!(plan.subscriber);
        assert_eq!(plan.connection_count, 4);
    }

    /// Event quotas add up to --events exactly.
    #[test]
    fn quotas_add_up() {
        let plan = plan(&["--events", "10", "--connections", "4"]).unwrap();
        let quotas: Vec<u64> = (0..4).map(|index| plan.connection_quota(index).unwrap()).collect();
        assert_eq!(quotas, [3, 3, 2, 2]);
    }

    /// Bad flags are refused with the flag's name.
    #[test]
    fn bad_flags_are_refused() {
        let flag_of = |flags: &[&str]| match plan(flags) {
            Err(BenchError::Invalid { flag, .. }) => flag,
            other => panic!("{flags:?}: {other:?}"),
        };
        assert_eq!(flag_of(&["--connections", "0"]), "--connections");
        assert_eq!(flag_of(&["--payload-bytes", "8"]), "--payload-bytes");
        assert_eq!(flag_of(&["--rate", "0"]), "--rate");
        assert_eq!(flag_of(&["--events", "0"]), "--events");
        assert!(plan(&["--payload-bytes", "8", "--no-subscriber"]).is_ok());
        assert!(matches!(plan(&["--key-dist", "hotspot", "--hot-keys", "0"]), Err(BenchError::Keys(_))));
    }

    /// A sweep gets a 1 s warm-up and 5 s points by default; the warm-up
    /// comes on top of the measured duration; bad rates are refused.
    #[test]
    fn sweep_defaults_and_checks() {
        let sweep = plan(&["--sweep", "1000,20000"]).unwrap();
        assert_eq!(sweep.sweep_rates.as_deref(), Some([1000.0, 20000.0].as_slice()));
        assert_eq!(sweep.warmup, Duration::from_secs(1));
        assert_eq!(sweep.stop, Stop::Duration(Duration::from_secs(6)));
        let point = sweep.at_rate(20000.0);
        assert_eq!((point.rate, point.sweep_rates), (Some(20000.0), None));
        let single = plan(&["--rate", "1000", "--warmup-s", "0.5", "--duration-s", "2"]).unwrap();
        assert_eq!(single.stop, Stop::Duration(Duration::from_millis(2500)));
        assert!(matches!(plan(&["--sweep", "1000,0"]), Err(BenchError::Invalid { flag: "--sweep", .. })));
        assert!(Cli::try_parse_from(["bench", "--sweep", "1000", "--rate", "5"]).is_err());
    }

    /// --target kafka takes acks 1 or -1, 1 to 64 requests in flight and a topic.
    #[test]
    fn kafka_target_checks() {
        let kafka_plan = plan(&["--target", "kafka", "--kafka-acks", "-1", "--kafka-in-flight", "8"]).unwrap();
        let options = kafka_plan.kafka.unwrap();
        assert_eq!((options.topic.as_str(), options.acks, options.in_flight_max), ("default", -1, 8));
        assert!(plan(&[]).unwrap().kafka.is_none(), "only --target kafka has Kafka options");
        let flag_of = |flags: &[&str]| match plan(flags) {
            Err(BenchError::Invalid { flag, .. }) => flag,
            other => panic!("{flags:?}: {other:?}"),
        };
        assert_eq!(flag_of(&["--target", "kafka", "--kafka-acks", "0"]), "--kafka-acks");
        assert_eq!(flag_of(&["--target", "kafka", "--kafka-in-flight", "0"]), "--kafka-in-flight");
        assert_eq!(flag_of(&["--target", "kafka", "--kafka-in-flight", "65"]), "--kafka-in-flight");
        assert_eq!(flag_of(&["--target", "kafka", "--kafka-topic", ""]), "--kafka-topic");
    }

    /// NATS runs need an external server and a live subscription.
    #[test]
    fn nats_target_checks() {
        assert!(plan(&["--target", "nats", "--sweep", "1000"]).is_ok());
        let flag_of = |flags: &[&str]| match plan(flags) {
            Err(BenchError::Invalid { flag, .. }) => flag,
            other => panic!("{flags:?}: {other:?}"),
        };
        assert_eq!(flag_of(&["--target", "nats", "--start-server"]), "--start-server");
        assert_eq!(flag_of(&["--target", "nats", "--sub-from", "earliest"]), "--sub-from");
        assert_eq!(flag_of(&["--target", "nats", "--duration-s", "300"]), "--duration-s");
    }

    /// Server arguments pass through, hyphens and all.
    #[test]
    fn server_args_pass_through() {
        let cli = Cli::try_parse_from(["bench", "--server-arg=--partitions", "--server-arg", "64"]).unwrap();
        assert_eq!(cli.args.server_args, ["--partitions", "64"]);
    }

    /// A started memory server pre-faults about the log the run writes per
    /// shard, at most 1 GiB; a flag or a --server-arg overrides it, and a
    /// disk server gets none.
    #[test]
    fn a_started_server_prefaults_the_run_s_log() {
        let prefault = |args: &[&str]| {
            let cli = Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).unwrap();
            let command = cli.args.server_command_args();
            let at = command.iter().position(|arg| arg == "--log-prefault-bytes");
            at.map(|at| command[at + 1].parse::<usize>().unwrap())
        };
        // 1 M events of 64 bytes (8-byte keys): 88 B records + 4 B of index,
        // a quarter more, over 2 shards.
        let record = crate::protocol::record::batch_record_size(&[0; 8], &[0; 64]) + 4;
        assert_eq!(prefault(&["--events", "1000000"]), Some(1_000_000 * record * 5 / 4 / 2));
        assert_eq!(prefault(&["--rate", "100000", "--duration-s", "5"]), Some(500_000 * record * 5 / 4 / 2));
        assert_eq!(prefault(&[]), Some(PREFAULT_BYTES_PER_SHARD_MAX), "closed loop for 10 s: capped");
        assert_eq!(prefault(&["--server-prefault-bytes", "0"]), Some(0));
        assert_eq!(
            prefault(&["--server-arg=--log-prefault-bytes", "--server-arg=7"]),
            Some(7),
            "passed through as given"
        );
        assert_eq!(prefault(&["--storage", "disk"]), None);
    }
}
