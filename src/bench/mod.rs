//! `spate bench`: the load generator.
//!
//! It drives a running server (`--ingest/--subscribe/--admin`), starts one
//! (`--start-server`, see [`server`]), or drives nats-server with the same
//! code (`--target nats`, see [`nats`]), and measures what spate's
//! performance goals are stated in (README, Benchmarks): stored, routed events/s, end-to-end latency percentiles, and
//! the server's CPU per event.
//!
//! A run, in order:
//!
//! 1. [`args::Plan`] checks the flags and builds the [`keys::KeySampler`];
//!    the [`session::Session`] starts or finds the server and its pid.
//! 2. `/stats` is read ([`stats`]; spate only).
//! 3. The subscriber ([`subscriber`]) subscribes (spate: `SUB * latest`, and
//!    the bench waits until the server counts it; NATS: `SUB` then `PING`,
//!    and waits for the `PONG`), so it sees every event sent afterwards.
//!    Then "how it was run" is printed.
//! 4. The producer threads ([`producer`]) connect, draw their rings of keys,
//!    and wait at a barrier; then all start at once. Closed loop has a thread
//!    per connection; open loop has `--pacer-threads` (default 1) that each
//!    pace a share of the connections. Lines are built into reusable buffers
//!    and written in big chunks; every connection ends with `#SYNC` (NATS:
//!    `PING`), and the run's time is from the first byte to the last `OK`.
//! 5. Meanwhile the sampler polls `/stats` every 200 ms (plot data) and prints
//!    a progress line each second. The first `--warmup-s` seconds are sent
//!    and received but not timed; CPU is measured from their end.
//! 6. The subscriber drains; `/stats` is read again; the [`report`] (table,
//!    `--json`) and the [`plot`]s (`--plot-dir`) are written; a started server
//!    gets SIGTERM.
//!
//! `--sweep` repeats 2 to 6 at each rate against the same server and prints
//! one table of latency and CPU against rate ([`sweep`]); `--compare` puts
//! sweeps of different targets side by side.
//!
//! Every event's payload starts with its send time ([`stamp`]): in open loop
//! the *intended* time on the schedule, so latency is coordinated-omission-
//! correct; in closed loop the time its chunk was built, so latency includes
//! queueing behind the producers' own backlog (the report says so).
//!
//! ```no_run
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     bench: spate::bench::BenchArgs,
//! }
//! let cli = Cli::parse_from(["bench", "--start-server", "--events", "1000000", "--no-subscriber"]);
//! spate::bench::run(&cli.bench).unwrap();
//! ```

mod args;
pub mod kafka;
mod keys;
mod nats;
mod plot;
mod procstat;
mod producer;
mod report;
mod server;
mod session;
mod stamp;
mod stats;
mod subscriber;
mod sweep;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use args::{BenchArgs, KeyDist, SubFrom, Target};
pub use keys::KeyError;
pub use report::Report;
pub use sweep::{Comparison, SweepReport};

use args::{Plan, Stop};
use producer::{LineLayout, ProducerOutcome, ProducerTask, Shared};
use report::{CpuUse, LatencyUs, Machine, RunInfo, SecondLatency, ServerInfo, SubscriberCounts};
use session::Session;
use stamp::{BenchClock, RunTag};
use stats::{ProgressSample, SamplerInputs, StatsSnapshot};
use subscriber::{LineScanner, Recorder, SubscriberOutcome, SubscriberShared};

/// How long the bench waits for the server to count its subscriber.
const SUBSCRIBED_TIMEOUT: Duration = Duration::from_secs(5);
/// After the server counts the subscriber, time for its first fetches to
/// resolve `latest` on every owner (they are answered at once).
const SUBSCRIBED_SETTLE: Duration = Duration::from_millis(100);

/// Why a bench run failed.
#[derive(Debug)]
pub enum BenchError {
    Invalid { flag: &'static str, value: String, reason: &'static str },
    Keys(KeyError),
    Connect { what: &'static str, addr: String, source: std::io::Error },
    Io { what: &'static str, source: std::io::Error },
    Admin { url: String, detail: String },
    StatsJson { detail: String },
    StatsField { field: &'static str },
    ServerExited { status: String, log_tail: String },
    ServerNotReady { waited_s: u64, log_tail: String },
    ServerStopTimeout { waited_s: u64, log_tail: String },
    SyncClosed { connection: usize },
    ServerStalled { connection: usize, waited_s: u64 },
    SubscribeRefused { line: String },
    SubscribeLineTooLong { line_bytes_min: usize },
    NatsClosed { during: &'static str },
    NatsUnexpected { line: String },
    Kafka { detail: String },
    ReadSweep { path: PathBuf, detail: String },
    WriteReport { path: PathBuf, source: std::io::Error },
    Plot { path: PathBuf, detail: String },
    ThreadPanicked { thread: String },
}

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BenchError::Invalid { flag, value, reason } => write!(f, "{flag} {value}: {reason}"),
            BenchError::Keys(error) => write!(f, "{error}"),
            BenchError::Connect { what, addr, source } => write!(f, "connect to {what} {addr}: {source}"),
            BenchError::Io { what, source } => write!(f, "{what}: {source}"),
            BenchError::Admin { url, detail } => write!(f, "GET {url}: {detail}"),
            BenchError::StatsJson { detail } => write!(f, "/stats is not JSON: {detail}"),
            BenchError::StatsField { field } => write!(f, "/stats has no field {field:?}"),
            BenchError::ServerExited { status, log_tail } => {
                write!(f, "the started server exited ({status}):\n{log_tail}")
            }
            BenchError::ServerNotReady { waited_s, log_tail } => {
                write!(f, "the started server did not answer /stats within {waited_s} s:\n{log_tail}")
            }
            BenchError::ServerStopTimeout { waited_s, log_tail } => {
                write!(f, "the started server did not stop within {waited_s} s of SIGTERM (killed):\n{log_tail}")
            }
            BenchError::SyncClosed { connection } => {
                write!(f, "producer {connection}: the server closed the connection before answering #SYNC")
            }
            BenchError::ServerStalled { connection, waited_s } => {
                write!(f, "producer {connection}: the server read nothing for {waited_s} s (hung or crashed?)")
            }
            BenchError::SubscribeRefused { line } => write!(f, "the server refused the subscriber: {line}"),
            BenchError::SubscribeLineTooLong { line_bytes_min } => {
                write!(f, "a subscription line is longer than the subscriber's buffer ({line_bytes_min} bytes)")
            }
            BenchError::NatsClosed { during } => write!(f, "nats-server closed the connection during {during}"),
            BenchError::NatsUnexpected { line } => write!(f, "unexpected line from nats-server: {line:?}"),
            BenchError::Kafka { detail } => write!(f, "Kafka listener: {detail}"),
            BenchError::ReadSweep { path, detail } => write!(f, "read sweep {}: {detail}", path.display()),
            BenchError::WriteReport { path, source } => write!(f, "write {}: {source}", path.display()),
            BenchError::Plot { path, detail } => write!(f, "plot {}: {detail}", path.display()),
            BenchError::ThreadPanicked { thread } => write!(f, "thread {thread} panicked"),
        }
    }
}

impl std::error::Error for BenchError {}

/// What a bench invocation produced.
#[derive(Debug, Clone)]
pub enum Outcome {
    Run(Box<Report>),
    Sweep(Box<SweepReport>),
    Compare(Comparison),
}

/// CPU clocks and the send count at one moment of a run.
#[derive(Debug, Clone, Copy)]
struct CpuMark {
    at_ns: u64,
    bench_cpu_s: f64,
    server_cpu_s: Option<f64>,
    events_sent: u64,
}

impl CpuMark {
    fn take(session: &Session, shared: &Shared) -> CpuMark {
        CpuMark {
            at_ns: shared.clock.now_ns(),
            bench_cpu_s: procstat::own_cpu_seconds(),
            server_cpu_s: session.server_cpu_seconds(),
            events_sent: shared.events_sent.load(Ordering::SeqCst),
        }
    }

    /// CPU used from `self` to `end`.
    fn until(&self, end: &CpuMark) -> CpuUse {
        let server_cpu_s = self.server_cpu_s.zip(end.server_cpu_s).map(|(start, end)| (end - start).max(0.0));
        CpuUse::new(
            end.at_ns.saturating_sub(self.at_ns) as f64 / 1e9,
            end.events_sent.saturating_sub(self.events_sent),
            (end.bench_cpu_s - self.bench_cpu_s).max(0.0),
            server_cpu_s,
        )
    }
}

/// What the threads of a run measured.
struct Measured {
    producers: Vec<ProducerOutcome>,
    subscriber: Option<SubscriberOutcome>,
    samples: Vec<ProgressSample>,
    cpu: CpuUse,
}

/// One measured run against a session's server.
struct Point {
    report: Report,
    measured: Measured,
}

/// Runs a bench as `args` say and prints (and writes) its report.
pub fn run(args: &BenchArgs) -> Result<Outcome, BenchError> {
    if let Some(files) = &args.compare {
        return sweep::compare(args, files).map(Outcome::Compare);
    }
    let plan = Plan::from_args(args)?;
    let mut session = Session::open(args)?;
    let result = match plan.sweep_rates.clone() {
        None => run_once(args, &plan, &mut session).map(|report| Outcome::Run(Box::new(report))),
        Some(rates) => sweep::run(args, &plan, &mut session, &rates).map(|sweep| Outcome::Sweep(Box::new(sweep))),
    };
    if result.is_err()
        && let Some(log) = session.log_tail()
    {
        eprintln!("spate bench: the started server's log {log}");
    }
    let closed = session.close();
    let outcome = result?;
    closed?;
    Ok(outcome)
}

/// One run: the full report, JSON and plots.
fn run_once(args: &BenchArgs, plan: &Plan, session: &mut Session) -> Result<Report, BenchError> {
    let Point { report, measured } = measure(args, plan, session, true)?;
    print!("{}", report::render_report(&report));
    if let Some(stored) = report.events_stored_delta
        && stored != report.events
    {
        eprintln!(
            "spate bench: warning: the server stored {stored} events during the run, the producers had {} \
             acknowledged (another producer on the server?)",
            report.events
        );
    }
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if let Some(dir) = &args.plot_dir {
        write_plots(dir, &report, &measured)?;
    }
    Ok(report)
}

fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(value).expect("reports serialize");
    std::fs::write(path, text + "\n").map_err(|source| BenchError::WriteReport { path: path.to_path_buf(), source })
}

/// Subscribes, drives the producers, and builds the report of one run.
fn measure(args: &BenchArgs, plan: &Plan, session: &mut Session, print_header: bool) -> Result<Point, BenchError> {
    let layout = LineLayout::new(plan.target, plan.sampler.key_width(), plan.payload_bytes, RunTag::for_this_run());
    let before = session.admin.as_ref().map(stats::AdminClient::stats).transpose()?;
    let clock = BenchClock::new();
    let subscriber = match plan.subscriber {
        true => Some(start_subscriber(args, layout, session, before.as_ref(), clock)?),
        false => None,
    };
    let run_info = run_info(args, plan, layout, session, before.as_ref());
    if print_header {
        print!("{}", report::render_run_info(&run_info));
        // The header goes out before the progress lines on stderr.
        let _ = std::io::stdout().flush();
    }
    let measured = drive(plan, session, before.as_ref(), layout, clock, subscriber)?;
    let after = session.admin.as_ref().map(stats::AdminClient::stats).transpose()?;
    let report = build_report(run_info, plan, layout, before.as_ref().zip(after.as_ref()), &measured);
    Ok(Point { report, measured })
}

fn run_info(
    args: &BenchArgs,
    plan: &Plan,
    layout: LineLayout,
    session: &Session,
    before: Option<&StatsSnapshot>,
) -> RunInfo {
    let key_dist = match args.key_dist {
        KeyDist::Uniform => "uniform".to_string(),
        KeyDist::Zipf => format!("zipf(s={})", args.zipf_s),
        KeyDist::Hotspot => format!(
            "hotspot({} hot keys take {}%, shifting every {} s)",
            args.hot_keys,
            args.hot_share * 100.0,
            args.shift_every_s
        ),
    };
    let (events_requested, duration_s_requested) = match plan.stop {
        Stop::Events(events) => (Some(events), None),
        Stop::Duration(duration) => (None, Some(duration.as_secs_f64())),
    };
    let server = session.server.as_ref();
    RunInfo {
        command_line: std::env::args().collect::<Vec<_>>().join(" "),
        target: plan.target.as_str(),
        mode: if plan.rate.is_some() { "open-loop" } else { "closed-loop" },
        rate_per_s: plan.rate,
        connections: plan.connection_count,
        events_requested,
        duration_s_requested,
        warmup_s: plan.warmup.as_secs_f64(),
        payload_bytes: plan.payload_bytes,
        line_bytes: layout.line_bytes(),
        keys: args.keys,
        key_dist,
        subscriber: plan.subscriber.then_some(args.sub_from.as_str()),
        write_bytes: plan.write_bytes,
        tick_us: plan.rate.map(|_| plan.tick.as_micros() as u64),
        pacer_threads: plan.rate.map(|_| plan.pacer_thread_count),
        server: ServerInfo {
            name: session.server_name(),
            started: server.is_some(),
            command_line: server.map(|server| server.command_line.clone()),
            ingest: session.targets.ingest.clone(),
            pid: session.server_pid,
            pid_source: session.server_pid_source.clone(),
            shards: before.and_then(|before| before.shard_count.or(Some(before.shards.len() as u64))),
            partitions: before.and_then(|before| before.partition_count),
        },
        machine: Machine::detect(),
    }
}

fn spawn<T: Send + 'static>(
    name: String,
    body: impl FnOnce() -> T + Send + 'static,
) -> Result<(String, JoinHandle<T>), BenchError> {
    let handle = std::thread::Builder::new()
        .name(name.clone())
        .spawn(body)
        .map_err(|source| BenchError::Io { what: "spawn a bench thread", source })?;
    Ok((name, handle))
}

fn join<T>((name, handle): (String, JoinHandle<T>)) -> Result<T, BenchError> {
    handle.join().map_err(|_| BenchError::ThreadPanicked { thread: name })
}

/// Sleeps until the bench clock reads `until_ns`, or a producer failed.
fn sleep_until(clock: BenchClock, until_ns: u64, abort: &AtomicBool) {
    const STEP: Duration = Duration::from_millis(10);
    loop {
        let now_ns = clock.now_ns();
        if now_ns >= until_ns || abort.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(STEP.min(Duration::from_nanos(until_ns - now_ns)));
    }
}

type ProducerThread = (String, JoinHandle<Result<Vec<ProducerOutcome>, BenchError>>);

/// Spreads the connections over the producer threads and starts them (they
/// connect, then wait at the ready barrier).
fn spawn_producers(
    plan: &Plan,
    session: &Session,
    layout: LineLayout,
    shared: &Arc<Shared>,
) -> Result<Vec<ProducerThread>, BenchError> {
    let mut groups: Vec<Vec<ProducerTask>> = (0..plan.producer_thread_count()).map(|_| Vec::new()).collect();
    for index in 0..plan.connection_count {
        groups[index % plan.producer_thread_count()].push(ProducerTask {
            index,
            ingest: session.targets.ingest.clone(),
            quota: plan.connection_quota(index),
            duration: match plan.stop {
                Stop::Duration(duration) => Some(duration),
                Stop::Events(_) => None,
            },
            rate: plan.rate.map(|rate| rate / plan.connection_count as f64),
            connection_count: plan.connection_count,
            layout,
            write_bytes: plan.write_bytes,
            sampler: plan.sampler.clone(),
            seed: plan.seed.wrapping_add(index as u64),
            kafka: plan.kafka.clone(),
            stream: plan.stream.clone(),
            shared: shared.clone(),
        });
    }
    let mut producers = Vec::with_capacity(groups.len());
    for (thread_index, group) in groups.into_iter().enumerate() {
        let (shared, tick) = (shared.clone(), plan.tick);
        producers
            .push(spawn(format!("bench-producer-{thread_index}"), move || producer::run_group(group, shared, tick))?);
    }
    Ok(producers)
}

/// Starts the producers and the sampler; waits for all, then for the subscriber.
fn drive(
    plan: &Plan,
    session: &Session,
    before: Option<&StatsSnapshot>,
    layout: LineLayout,
    clock: BenchClock,
    subscriber: Option<SubscriberThread>,
) -> Result<Measured, BenchError> {
    let shared = Arc::new(Shared::new(clock, plan.producer_thread_count()));
    let producers = spawn_producers(plan, session, layout, &shared)?;
    let warmup_ns = u64::try_from(plan.warmup.as_nanos()).unwrap_or(u64::MAX);
    shared.ready_barrier.wait();
    let mark_at_start = (warmup_ns == 0).then(|| CpuMark::take(session, &shared));
    let start_ns = clock.now_ns();
    shared.start_ns.store(start_ns, Ordering::SeqCst);
    if let Some((subscriber_shared, _)) = &subscriber {
        subscriber_shared.record_from_ns.store(start_ns.saturating_add(warmup_ns), Ordering::SeqCst);
    }
    shared.start_barrier.wait();
    let sampler_stop = Arc::new(AtomicBool::new(false));
    let inputs = SamplerInputs {
        admin: session.admin.clone(),
        before: before.cloned().unwrap_or_default(),
        producers: shared.clone(),
        subscriber: subscriber.as_ref().map(|(shared, _)| shared.clone()),
        start_ns,
        warmup_s: plan.warmup.as_secs_f64(),
        stop: sampler_stop.clone(),
    };
    let sampler = spawn("bench-sampler".into(), move || stats::run_sampler(inputs))?;
    let mark_start = mark_at_start.unwrap_or_else(|| {
        sleep_until(clock, start_ns.saturating_add(warmup_ns), &shared.abort);
        CpuMark::take(session, &shared)
    });
    let outcomes: Vec<Result<Vec<ProducerOutcome>, BenchError>> =
        producers.into_iter().map(|producer| join(producer).and_then(|outcomes| outcomes)).collect();
    let mark_end = CpuMark::take(session, &shared);
    let events_sent = mark_end.events_sent;
    let subscriber = match subscriber {
        Some(subscriber) => Some(finish_subscriber(subscriber, events_sent, plan.drain_timeout)?),
        None => None,
    };
    sampler_stop.store(true, Ordering::SeqCst);
    let samples = join(sampler)?;
    Ok(Measured {
        producers: outcomes.into_iter().collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect(),
        subscriber,
        samples,
        cpu: mark_start.until(&mark_end),
    })
}

type SubscriberThread = (Arc<SubscriberShared>, (String, JoinHandle<Result<SubscriberOutcome, BenchError>>));

/// Tells the subscriber how many events were sent, waits until it has them
/// (see [`wait_drained`]), stops it and returns what it measured.
fn finish_subscriber(
    (shared, handle): SubscriberThread,
    events_sent: u64,
    drain_timeout: Duration,
) -> Result<SubscriberOutcome, BenchError> {
    shared.events_expected.store(events_sent, Ordering::SeqCst);
    wait_drained(&shared, events_sent, drain_timeout);
    shared.stop.store(true, Ordering::SeqCst);
    join(handle)?
}

/// Subscribes and waits until the server has the subscription, so that it
/// sees every event sent afterwards: spate counts it in `/stats` (and
/// `latest` is resolved); NATS answers the `PING` sent after the `SUB`.
fn start_subscriber(
    args: &BenchArgs,
    layout: LineLayout,
    session: &mut Session,
    before: Option<&StatsSnapshot>,
    clock: BenchClock,
) -> Result<SubscriberThread, BenchError> {
    let shared = Arc::new(SubscriberShared::new(clock));
    let thread_shared = shared.clone();
    let recorder = Recorder::new(layout.payload_bytes, layout.tag);
    let handle = match session.target {
        // A Kafka run is read by the same `SUB` subscriber as lines: the
        // events are the same, and so is the reader's cost.
        Target::Spate | Target::Kafka => {
            let stream = subscriber::subscribe(&session.targets.subscribe, args.sub_from)?;
            if let (Some(admin), Some(before)) = (&session.admin, before) {
                wait_subscribed(admin, before)?;
            }
            let scanner = LineScanner::new(recorder);
            spawn("bench-subscriber".into(), move || subscriber::run(stream, scanner, thread_shared))?
        }
        Target::Nats => {
            let (stream, handshake) = nats::subscribe(&session.targets.subscribe)?;
            session.server_version = handshake.server_version.or(session.server_version.take());
            let scanner = nats::NatsScanner::new(recorder);
            spawn("bench-subscriber".into(), move || subscriber::run(stream, scanner, thread_shared))?
        }
    };
    Ok((shared, handle))
}

/// Waits until spate's `/stats` counts one more subscriber than `before`.
fn wait_subscribed(admin: &stats::AdminClient, before: &StatsSnapshot) -> Result<(), BenchError> {
    let started = Instant::now();
    loop {
        if admin.stats()?.subscribers_open() > before.subscribers_open() {
            std::thread::sleep(SUBSCRIBED_SETTLE);
            return Ok(());
        }
        if started.elapsed() > SUBSCRIBED_TIMEOUT {
            eprintln!("spate bench: warning: /stats does not count the subscriber yet; it may miss the first events");
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How long the drain waits without progress once every sent event is
/// either received or reported lost to truncation (late lines may still come).
const DRAIN_GRACE_TRUNCATED: Duration = Duration::from_secs(1);

/// Waits until the subscriber has every sent event, its thread ended (the
/// server closed it), or it made no progress for `timeout` (a shorter grace
/// if the missing ones were truncated).
fn wait_drained(shared: &SubscriberShared, events_sent: u64, timeout: Duration) {
    let mut last = (shared.events_received.load(Ordering::Relaxed), Instant::now());
    loop {
        let received = shared.events_received.load(Ordering::Relaxed);
        if received >= events_sent || shared.finished.load(Ordering::SeqCst) {
            return;
        }
        let truncated = shared.events_truncated.load(Ordering::Relaxed);
        let patience = if received + truncated >= events_sent { timeout.min(DRAIN_GRACE_TRUNCATED) } else { timeout };
        if received != last.0 {
            last = (received, Instant::now());
        } else if last.1.elapsed() >= patience {
            eprintln!(
                "spate bench: the subscriber saw {received} of {events_sent} events ({truncated} reported \
                 truncated); stopped waiting after {patience:?} without progress"
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn build_report(
    run: RunInfo,
    plan: &Plan,
    layout: LineLayout,
    stats: Option<(&StatsSnapshot, &StatsSnapshot)>,
    measured: &Measured,
) -> Report {
    let producers = &measured.producers;
    let events: u64 = producers.iter().map(|outcome| outcome.events_sent).sum();
    let line_bytes: u64 = producers.iter().map(|outcome| outcome.line_bytes_sent).sum();
    let writes: u64 = producers.iter().map(|outcome| outcome.write_count).sum();
    let first_ns = producers.iter().map(|outcome| outcome.first_write_ns).min().unwrap_or(0);
    let last_ns = producers.iter().map(|outcome| outcome.sync_ok_ns).max().unwrap_or(0);
    let seconds = last_ns.saturating_sub(first_ns) as f64 / 1e9;
    let per_s = |count: f64| if seconds > 0.0 { count / seconds } else { 0.0 };
    let per_shard = stats.map(|(before, after)| report::shard_deltas(before, after, seconds)).unwrap_or_default();
    let subscriber = measured.subscriber.as_ref();
    Report {
        events,
        events_stored_delta: stats.map(|(before, after)| after.events_stored.saturating_sub(before.events_stored)),
        seconds,
        events_per_s: per_s(events as f64),
        mb_per_s: per_s((events * layout.payload_bytes as u64) as f64) / 1e6,
        line_mb_per_s: per_s(line_bytes as f64) / 1e6,
        latency_us: subscriber.and_then(|outcome| LatencyUs::from_histogram(&outcome.latency_ns)),
        latency_note: plan.subscriber.then_some(if plan.rate.is_some() {
            report::OPEN_LOOP_LATENCY_NOTE
        } else {
            report::CLOSED_LOOP_LATENCY_NOTE
        }),
        latency_by_second: subscriber
            .map(|outcome| SecondLatency::series(&outcome.latency_by_second_ns))
            .unwrap_or_default(),
        subscriber: subscriber.map(|outcome| {
            let seconds = outcome.last_event_ns.saturating_sub(first_ns) as f64 / 1e9;
            SubscriberCounts {
                events_received: outcome.events_received,
                seconds,
                events_per_s: if seconds > 0.0 { outcome.events_received as f64 / seconds } else { 0.0 },
                events_missing: events.saturating_sub(outcome.events_received),
                foreign_lines: outcome.foreign_line_count,
                truncated_notices: outcome.truncated_notice_count,
                events_truncated: outcome.events_truncated,
            }
        }),
        imbalance: report::imbalance(&per_shard),
        per_shard,
        credit_stalls: stats.map_or(0, |(before, after)| after.credit_stalls().saturating_sub(before.credit_stalls())),
        credit_stall_seconds: stats
            .map_or(0.0, |(before, after)| (after.credit_stall_seconds() - before.credit_stall_seconds()).max(0.0)),
        migrations_completed: stats
            .and_then(|(before, after)| Some(after.migrations_completed?.saturating_sub(before.migrations_completed?))),
        error_lines: producers.iter().map(|outcome| outcome.error_line_count).sum(),
        writes,
        bytes_per_write: if writes > 0 { line_bytes as f64 / writes as f64 } else { 0.0 },
        cpu: measured.cpu,
        run,
    }
}

fn write_plots(dir: &std::path::Path, report: &Report, measured: &Measured) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|source| BenchError::WriteReport { path: dir.to_path_buf(), source })?;
    let run = &report.run;
    let mode = match run.rate_per_s {
        Some(rate) => format!("open loop {}/s", report::format_rate(rate)),
        None => "closed loop".into(),
    };
    let subtitle = match run.target {
        "nats" => format!(
            "{}: {mode}, {} conns, {} B payload, one subject: {} events/s",
            run.server.name,
            run.connections,
            run.payload_bytes,
            report::format_rate(report.events_per_s)
        ),
        _ => format!(
            "{mode}, {} conns, {} B payload, {} keys {}, {} shards: {} events/s stored",
            run.connections,
            run.payload_bytes,
            report::format_count(u64::from(run.keys)),
            run.key_dist,
            run.server.shards.unwrap_or(0),
            report::format_rate(report.events_per_s)
        ),
    };
    if let Some(outcome) = &measured.subscriber
        && !outcome.latency_ns.is_empty()
    {
        let path = plot::latency_plot(dir, &outcome.latency_ns, &subtitle)?;
        println!("  plot                   {}", path.display());
    }
    if !report.per_shard.is_empty() {
        let path = plot::shard_plot(dir, &measured.samples, report.seconds, &subtitle)?;
        println!("  plot                   {}", path.display());
    }
    Ok(())
}
