//! `spate serve`: checks the machine, starts one executor per shard, the
//! admin thread and the signal handler, and runs the two-phase shutdown.

mod checks;
mod cluster;
mod placement;
mod ports;
mod startup;

pub use checks::EnvironmentError;
pub use startup::{ShardContext, run_shard};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::channels::channel_mesh::MeshBuilder;
use glommio::{LocalExecutorPoolBuilder, PoolPlacement, PoolThreadHandles};

use crate::admin::{AdminError, AdminServer, AdminState};
use crate::cluster::{ClusterHandle, ClusterRequest};
use crate::config::{Config, STORAGE_RETRY_MS};
use crate::net::Admission;
use crate::runtime::log;
use crate::shard::control::{ControlRequest, ShardEvent, ShardFailure};

/// Control requests queued per shard (admin and signal threads to a shard):
/// the admin thread waits for each answer, so a handful is plenty.
const CONTROL_CHANNEL_CAPACITY: usize = 64;
/// Deliveries queued per shard (the cluster thread's committed records and
/// catch-up reads), on a queue of their own: a wave sends one per group it
/// delivers, often more than the control queue holds, and an admin request
/// behind them would wait for the whole wave. What they hold is bounded by
/// the wave's bytes (`DELIVERY_WAVE_BYTES_MAX`), which the cluster thread
/// waits on before it sends more.
const DELIVERY_CHANNEL_CAPACITY: usize = 64;
/// Life-cycle events each shard sends `main` (started or failed, drained).
const SHARD_EVENTS_PER_SHARD_MAX: usize = 3;
/// How long the first SIGINT/SIGTERM waits for the cluster thread to put
/// this node's goodbye on the wire before the drain starts, in ms.
const CLUSTER_LEAVE_WAIT_MS: u64 = 500;
/// After the shutdown deadline plus this, the process exits whatever is
/// still running (status 1), in ms; a second SIGINT/SIGTERM exits at once.
const SHUTDOWN_FORCE_MARGIN_MS: u64 = 2000;
/// How long the first SIGINT/SIGTERM of a cluster node waits for it to
/// hand its replicas over before the drain starts, in ms: the cluster
/// thread's own bound plus a second.
const LEAVE_HANDOVER_WAIT_MS: u64 = crate::cluster::driver::LEAVE_HANDOVER_TIMEOUT_MS + 1000;

/// Why the server could not start or stopped abnormally.
#[derive(Debug)]
pub enum ServeError {
    Config(crate::config::ConfigError),
    /// The machine cannot run glommio; the text says how to fix it.
    Environment(EnvironmentError),
    /// A live process listens on the address (`pid`), or listening sockets
    /// no process holds did not go away in time (`None`).
    AddressInUse {
        name: &'static str,
        address: SocketAddr,
        pid: Option<u32>,
    },
    /// The file descriptors the limits need do not fit `RLIMIT_NOFILE`.
    FdBudget {
        budget: crate::config::FdBudget,
        limit: usize,
    },
    /// An address could not be bound for another reason.
    Bind {
        name: &'static str,
        address: SocketAddr,
        error: std::io::Error,
    },
    /// The executor pool could not be created.
    Executors(glommio::GlommioError<()>),
    /// A shard failed to start (`None`: before it knew its id).
    Shard {
        shard: Option<u16>,
        failure: ShardFailure,
    },
    /// Not every shard reported in time.
    StartTimeout {
        started: usize,
        shard_count: usize,
        /// Where the others stopped (`runtime::stage`).
        stages: String,
    },
    Admin(AdminError),
    /// The stream catalog cannot be read or does not fit the flags.
    Catalog(crate::stream::CatalogError),
    /// The data directory cannot be used (another server holds it, or it
    /// cannot be created).
    DataDir(crate::storage::dir::DirError),
    /// A `--cpus` CPU this process may not run on.
    CpuNotAllowed {
        cpu: usize,
        allowed: Vec<usize>,
    },
    /// The node identity in the data directory cannot be read or saved.
    Identity(crate::cluster::identity::IdentityError),
    /// The Raft store (`<data-dir>/replication/raft-*`) cannot be read.
    ReplicationStore(std::io::Error),
    /// A helper thread (signals) could not start.
    Thread {
        name: &'static str,
        error: std::io::Error,
    },
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServeError::Config(error) => write!(f, "invalid configuration: {error}"),
            ServeError::Environment(error) => write!(f, "{error}"),
            ServeError::AddressInUse { name, address, pid: Some(pid) } => write!(
                f,
                "{name} address {address} is already in use by process {pid} (another spate running?); \
                 stop it or pick another address with --{name}"
            ),
            ServeError::AddressInUse { name, address, pid: None } => write!(
                f,
                "{name} address {address} is already in use: listening sockets no live process holds did not \
                 go away within {} ms; pick another address with --{name}",
                ports::ADDRESS_WAIT_MS_MAX
            ),
            ServeError::FdBudget { budget, limit } => write!(
                f,
                "this configuration may need {budget} file descriptors, above the limit of {limit} \
                 (RLIMIT_NOFILE, soft raised to hard).\nfix: raise the hard limit (`ulimit -Hn`, \
                 LimitNOFILE= in a systemd unit) or lower --connections-per-shard-max, \
                 --subscribers-per-shard-max or --fds-reserved"
            ),
            ServeError::Bind { name, address, error } => write!(f, "failed to start: bind {name} {address}: {error}"),
            ServeError::Executors(error) => write!(f, "failed to start the executor pool: {error}"),
            ServeError::Shard { shard: Some(shard), failure } => write!(f, "shard {shard} failed to start: {failure}"),
            ServeError::Shard { shard: None, failure } => write!(f, "a shard failed to start: {failure}"),
            ServeError::StartTimeout { started, shard_count, stages } => write!(
                f,
                "only {started} of {shard_count} shards started within --start-timeout-ms ({stages}); \
                 exiting without waiting for the others (start it again: a supervisor does)"
            ),
            ServeError::Admin(error) => write!(f, "failed to start the admin server: {error}"),
            ServeError::Catalog(error) => write!(f, "{error}"),
            ServeError::DataDir(error) => write!(f, "{error} (--data-dir; is another spate running on it?)"),
            ServeError::Identity(error) => write!(f, "{error} (--data-dir)"),
            ServeError::CpuNotAllowed { cpu, allowed } => {
                let allowed: Vec<String> = allowed.iter().map(usize::to_string).collect();
                write!(f, "--cpus: CPU {cpu} is not one this process may run on ({})", allowed.join(","))
            }
            ServeError::Thread { name, error } => write!(f, "failed to start the {name} thread: {error}"),
            ServeError::ReplicationStore(error) => {
                write!(f, "failed to start: the Raft log in <data-dir>/replication cannot be read: {error}")
            }
        }
    }
}

impl std::error::Error for ServeError {}

/// Runs a server until SIGINT or SIGTERM, then drains and returns.
pub fn serve(mut config: Config) -> Result<(), ServeError> {
    install_fail_fast_hook();
    config.validate().map_err(ServeError::Config)?;
    // Before anything allocates much: the flag applies to later faults.
    checks::set_huge_pages(&config);
    checks::check_memlock()?;
    checks::check_eager_memory(&config)?;
    checks::check_io_uring(&config)?;
    checks::check_fd_limit(&config)?;
    checks::check_addresses(&config)?;
    // Held until the server exits: a second server on the data directory is
    // refused with the holder's pid.
    let _data_dir_lock = lock_data_dir(&config)?;
    // Absolute from here on: glommio's DMA opens of a relative path fail
    // (EBADF) on the shard threads, so `./spate-data` would not start.
    if let Ok(absolute) = std::fs::canonicalize(&config.data_dir) {
        config.data_dir = absolute;
    }
    checks::check_one_filesystem(&mut config);
    let cluster_start = cluster::prepare(&config)?;
    let (catalog, catalog_unsaved) = open_catalog(&config)?;
    let config = Arc::new(config);
    let shard_count = config.shard_count();
    let wal_replay = read_write_ahead_logs(&config)?;
    let (events_sender, events) = flume::bounded(shard_count * SHARD_EVENTS_PER_SHARD_MAX);
    let (controls, control_receivers): (Vec<_>, Vec<_>) =
        (0..shard_count).map(|_| flume::bounded(CONTROL_CHANNEL_CAPACITY)).unzip();
    let (deliveries, delivery_receivers): (Vec<_>, Vec<_>) =
        (0..shard_count).map(|_| flume::bounded(DELIVERY_CHANNEL_CAPACITY)).unzip();
    // Each Kafka connection waits for its command's answer before it sends
    // another: at most one command per connection is queued.
    let (stream_commands_sender, stream_commands) = flume::bounded(shard_count * config.connections_per_shard_max);
    let context = ShardContext {
        config: config.clone(),
        mesh: MeshBuilder::full(shard_count, config.mesh_channel_frames()),
        control: Arc::new(control_receivers),
        deliveries: Arc::new(delivery_receivers),
        events: events_sender.clone(),
        admission: Arc::new(Admission::new(&config)),
        catalog: Arc::new(catalog.running()),
        wal_replay: Arc::new(wal_replay),
        stream_commands: stream_commands_sender,
        kafka_producers: Arc::new(crate::kafka::ProducerTable::new(crate::config::KAFKA_PRODUCER_STATES_MAX)),
        kafka_groups: Arc::new(crate::kafka::KafkaGroups::new(config.groups_max, config.group_members_max)),
        proposals: cluster_start.proposals.clone(),
    };
    let placement = placement::decide(&config, shard_count)?;
    let pool = start_shards(&config, placement.placement, context)?;
    let started = Instant::now();
    let startup = wait_for_start(&events, shard_count, Duration::from_millis(config.start_timeout_ms));
    let cluster_banner = cluster::describe(&config, &cluster_start);
    // Committed catalog entries, from the cluster thread to the admin
    // thread that applies them; one batch at a time (the cluster thread
    // waits for each answer).
    let (catalog_entries_sender, catalog_entries) = flume::bounded(1);
    let admin = startup.and_then(|read_only| {
        let replicated_catalog = (catalog.replicated_index(), catalog_entries_sender);
        let cluster = cluster::start(
            &config,
            cluster_start,
            (&controls, &deliveries),
            catalog.streams().to_vec(),
            replicated_catalog,
        )?;
        let catalog = (catalog, stream_commands, catalog_entries);
        match start_admin(&controls, &config, started, catalog, catalog_unsaved.clone(), cluster.requests()) {
            Ok(admin) => Ok((admin, cluster, read_only)),
            Err(error) => {
                cluster.stop();
                Err(error)
            }
        }
    });
    let (admin, cluster, read_only) = match admin {
        Ok(started) => started,
        Err(error @ ServeError::StartTimeout { .. }) => {
            // A shard that never started never reads its Exit either:
            // joining it would wedge the process for good. Exit instead
            // (status 1), so a supervisor starts it again; nothing was
            // acknowledged yet, and recovery does not depend on a clean stop.
            std::mem::forget(pool);
            return Err(error);
        }
        Err(error) => {
            broadcast(&controls, || ControlRequest::Exit);
            let _ = pool.join_all();
            return Err(error);
        }
    };
    print_banner(&config, shard_count, &placement.description);
    log::info!("{cluster_banner}");
    print_read_only(&read_only, catalog_unsaved.reason().as_deref());
    let clustered = config.cluster_address().is_some();
    spawn_signal_thread(&controls, &cluster, clustered, Duration::from_millis(config.shutdown_timeout_ms))?;
    let complete = wait_for_drain(&events, shard_count);
    stop_shards(&controls, pool);
    admin.stop();
    cluster.stop();
    print_stopped(started.elapsed(), complete);
    Ok(())
}

/// Makes a panic on any thread end the process at once (SIGABRT, after the
/// panic's message and a line saying so). A shard that panicked would
/// otherwise leave the process half-alive: its peers wait for it forever,
/// the admin port answers 503, `#SYNC`s hang. Dead is better than wedged:
/// a supervisor (the systemd unit's `Restart=on-failure`) starts it again,
/// and recovery brings back every acknowledged event from the log.
fn install_fail_fast_hook() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        let thread = std::thread::current();
        log::error!(
            "thread '{}' panicked; stopping the process now (SIGABRT) so that a supervisor \
             restarts it: acknowledged events are safe in the log",
            thread.name().unwrap_or("unnamed")
        );
        std::process::abort();
    }));
}

/// Locks the data directory with disk storage; `None` in memory.
fn lock_data_dir(config: &Config) -> Result<Option<crate::storage::dir::DataDirLock>, ServeError> {
    match config.storage {
        crate::config::Storage::Disk => {
            Ok(Some(crate::storage::dir::lock_data_dir(&config.data_dir).map_err(ServeError::DataDir)?))
        }
        crate::config::Storage::Memory => Ok(None),
    }
}

/// Starts one executor per shard, each running [`run_shard`], where
/// [`placement::decide`] put them.
fn start_shards(
    config: &Config,
    placement: PoolPlacement,
    context: ShardContext,
) -> Result<PoolThreadHandles<()>, ServeError> {
    LocalExecutorPoolBuilder::new(placement)
        .name("spate-shard")
        .io_memory(config.io_memory_bytes)
        .spin_before_park(Duration::from_micros(config.spin_before_park_us))
        .on_all_shards(move || run_shard(context))
        .map_err(ServeError::Executors)
}

/// Starts the admin HTTP server, which reaches the shards through `controls`.
fn start_admin(
    controls: &[flume::Sender<ControlRequest>],
    config: &Arc<Config>,
    started: Instant,
    (catalog, stream_commands, catalog_entries): (
        crate::stream::Catalog,
        flume::Receiver<crate::admin::StreamCommand>,
        flume::Receiver<crate::replication::node::CatalogEntries>,
    ),
    catalog_unsaved: crate::stream::UnsavedCatalog,
    cluster: flume::Sender<ClusterRequest>,
) -> Result<AdminServer, ServeError> {
    AdminServer::start(AdminState {
        controls: controls.to_vec(),
        config: config.clone(),
        memory_bound: config.memory_bound(),
        started,
        counters: Default::default(),
        catalog: tokio::sync::Mutex::new(catalog),
        fences: std::sync::Mutex::default(),
        catalog_unsaved,
        stream_commands,
        cluster,
        replicated: config
            .cluster_address()
            .is_some()
            .then(|| crate::admin::replicated::Replicated::new(catalog_entries)),
    })
    .map_err(ServeError::Admin)
}

/// Tells every shard to exit and waits for the executors; a shard that ended
/// with an error is reported, and the others are still waited for.
fn stop_shards(controls: &[flume::Sender<ControlRequest>], pool: PoolThreadHandles<()>) {
    broadcast(controls, || ControlRequest::Exit);
    for result in pool.join_all() {
        if let Err(error) = result {
            log::error!("a shard ended with an error: {error}");
        }
    }
}

/// The last line the server prints: how long it ran, and whether the drain
/// had to cut connections.
fn print_stopped(elapsed: Duration, complete: bool) {
    let elapsed = elapsed.as_secs_f64();
    if complete {
        log::info!("stopped cleanly after {elapsed:.1}s");
    } else {
        log::info!("stopped after {elapsed:.1}s; connections still open at the shutdown deadline were cut");
    }
}

fn broadcast(controls: &[flume::Sender<ControlRequest>], make: impl Fn() -> ControlRequest) {
    for control in controls {
        let _ = control.send(make());
    }
}

/// Waits until every shard started; returns the shards that started
/// read-only, with why.
fn wait_for_start(
    events: &flume::Receiver<ShardEvent>,
    shard_count: usize,
    timeout: Duration,
) -> Result<Vec<(u16, String)>, ServeError> {
    let deadline = Instant::now() + timeout;
    let mut started = 0;
    let mut read_only = Vec::new();
    while started < shard_count {
        match events.recv_deadline(deadline) {
            Ok(ShardEvent::Started { shard, read_only: reason }) => {
                started += 1;
                read_only.extend(reason.map(|reason| (shard, reason)));
            }
            Ok(ShardEvent::Failed { shard, failure }) => return Err(ServeError::Shard { shard, failure }),
            Ok(ShardEvent::Drained { .. }) => {}
            Err(_) => {
                let stages = crate::runtime::stage::describe_unfinished();
                return Err(ServeError::StartTimeout { started, shard_count, stages });
            }
        }
    }
    read_only.sort_unstable();
    Ok(read_only)
}

/// The one line saying the server started read-only, and why.
fn print_read_only(shards: &[(u16, String)], catalog_unsaved: Option<&str>) {
    let Some(reason) = shards.first().map(|(_, reason)| reason.as_str()).or(catalog_unsaved) else { return };
    let ids: Vec<String> = shards.iter().map(|(shard, _)| shard.to_string()).collect();
    let which = if ids.is_empty() { "the stream catalog".to_string() } else { format!("shards {}", ids.join(", ")) };
    log::warn!(
        "started read-only ({which}): {reason}. Stored events are served to subscribers; ingest is held \
         back (credits held, #SYNC waits) and the deferred writes are retried every {STORAGE_RETRY_MS} ms until \
         space returns"
    );
}

/// Waits for the shutdown signal's drain to finish on every shard; returns
/// whether every shard drained completely (nothing cut at the deadline).
fn wait_for_drain(events: &flume::Receiver<ShardEvent>, shard_count: usize) -> bool {
    let (mut drained, mut complete) = (0, true);
    while drained < shard_count {
        match events.recv() {
            Ok(ShardEvent::Drained { complete: shard_complete }) => {
                drained += 1;
                complete &= shard_complete;
            }
            Ok(ShardEvent::Failed { shard: Some(shard), failure }) => log::error!(shard = shard, "failed: {failure}"),
            Ok(ShardEvent::Failed { shard: None, failure }) => log::error!("a shard failed: {failure}"),
            Ok(ShardEvent::Started { .. }) => {}
            Err(_) => return false,
        }
    }
    complete
}

/// The first SIGINT/SIGTERM arms a watchdog that ends the process if it
/// still runs [`SHUTDOWN_FORCE_MARGIN_MS`] after the whole bound below;
/// makes this node leave the cluster (a cluster node hands its replicas
/// over first, at most [`LEAVE_HANDOVER_WAIT_MS`]; its goodbye on the wire,
/// waited for at most [`CLUSTER_LEAVE_WAIT_MS`]); then asks every shard to
/// drain within `timeout`. A second signal ends it at once.
fn spawn_signal_thread(
    controls: &[flume::Sender<ControlRequest>],
    cluster: &ClusterHandle,
    clustered: bool,
    timeout: Duration,
) -> Result<(), ServeError> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|error| ServeError::Thread { name: "signal", error })?;
    let controls = controls.to_vec();
    let cluster = cluster.requests();
    std::thread::Builder::new()
        .name("spate-signals".into())
        .spawn(move || {
            let mut signals = signals.forever();
            let Some(signal) = signals.next() else { return };
            let leave_wait = Duration::from_millis(if clustered { LEAVE_HANDOVER_WAIT_MS } else { 0 });
            // Armed first, so nothing below (a handover, a shard that does
            // not read its control queue) can keep the process alive.
            arm_watchdog(Instant::now() + leave_wait + timeout + Duration::from_millis(SHUTDOWN_FORCE_MARGIN_MS));
            log::info!(
                "signal {signal}: stopping (a cluster node first hands its replicas over, at most {} ms; then no \
                 new connections; draining what was read; connections still open {} ms later are cut; a second \
                 signal exits at once)",
                leave_wait.as_millis(),
                timeout.as_millis()
            );
            leave_cluster(&cluster, leave_wait);
            let deadline = Instant::now() + timeout;
            for control in &controls {
                let _ = control.send_deadline(ControlRequest::Shutdown { deadline }, deadline);
            }
            if let Some(signal) = signals.next() {
                log::warn!("second signal {signal}: exiting now without draining");
                std::process::exit(1);
            }
        })
        .map_err(|error| ServeError::Thread { name: "signal", error })?;
    Ok(())
}

/// Ends the process at `force_at` if it still runs then, saying so.
fn arm_watchdog(force_at: Instant) {
    let watchdog = std::thread::Builder::new().name("spate-watchdog".into()).spawn(move || {
        std::thread::sleep(force_at.saturating_duration_since(Instant::now()));
        log::error!(
            "gave up waiting: still running {SHUTDOWN_FORCE_MARGIN_MS} ms after the shutdown deadline (a shard or \
             the cluster thread did not finish); exiting now with status 1"
        );
        std::process::exit(1);
    });
    if let Err(error) = watchdog {
        log::warn!("could not start the shutdown watchdog: {error}");
    }
}

/// Asks the cluster thread to leave (hand the replicas over, then say
/// goodbye) and waits at most `handover` plus [`CLUSTER_LEAVE_WAIT_MS`].
fn leave_cluster(cluster: &flume::Sender<ClusterRequest>, handover: Duration) {
    let (reply, left) = flume::bounded(1);
    if cluster.try_send(ClusterRequest::Leave(reply)).is_ok() {
        let _ = left.recv_timeout(handover + Duration::from_millis(CLUSTER_LEAVE_WAIT_MS));
    }
}

fn print_banner(config: &Config, shard_count: usize, placement: &str) {
    let bound = config.memory_bound();
    log::info!(
        "{shard_count} shards ({}), {} partitions; ingest {}, json {}, ilp {}, kafka {}, subscribe {}, admin http://{}",
        placement,
        config.partitions,
        config.ingest,
        config.ingest_json,
        config.ingest_ilp,
        config.ingest_kafka,
        config.subscribe,
        config.admin
    );
    log::info!(
        "memory bound {} MiB (worst case with every connection holding a max-size line: {} MiB)",
        bound.total >> 20,
        bound.total_worst_case >> 20
    );
}

/// What every shard's write-ahead log holds past its checkpoint (disk
/// storage), read before any shard opens its partitions.
fn read_write_ahead_logs(config: &Config) -> Result<crate::storage::wal::WalReplay, ServeError> {
    let shard_count = config.shard_count();
    if config.storage != crate::config::Storage::Disk {
        return Ok(crate::storage::wal::WalReplay::empty(shard_count));
    }
    let replay = crate::storage::wal::read_all(&config.data_dir, shard_count).map_err(|source| {
        let path = config.data_dir.join(crate::storage::wal::WAL_DIR_NAME);
        ServeError::DataDir(crate::storage::dir::DirError::Io { op: "read write-ahead logs", path, source })
    })?;
    crate::storage::wal::log_reports(&replay);
    Ok(replay)
}

/// The stream catalog: from the data directory (created with `default` on
/// first start), or just `default` in memory. A new catalog that the full
/// disk cannot take yet is marked unsaved: the admin thread saves it later.
fn open_catalog(config: &Config) -> Result<(crate::stream::Catalog, crate::stream::UnsavedCatalog), ServeError> {
    let limits = config.catalog_limits();
    let unsaved = crate::stream::UnsavedCatalog::default();
    let catalog = match config.storage {
        crate::config::Storage::Disk => {
            let (catalog, error) = crate::stream::Catalog::open_deferring(&config.data_dir, &limits, config.partitions)
                .map_err(ServeError::Catalog)?;
            if let Some(error) = error {
                unsaved.set(error.to_string());
            }
            catalog
        }
        crate::config::Storage::Memory => {
            crate::stream::Catalog::with_default(&limits, config.partitions).map_err(ServeError::Catalog)?
        }
    };
    // Events of a replicated stream are stored only through its Raft
    // groups, which a node outside a cluster does not run.
    if config.cluster_address().is_none()
        && let Some(spec) = catalog.streams().iter().find(|spec| spec.is_replicated())
    {
        return Err(ServeError::Catalog(crate::stream::CatalogError::Invalid {
            why: format!(
                "stream {:?} has replication factor {}: start this node in its cluster (--cluster/--join)",
                spec.name, spec.replication_factor
            ),
        }));
    }
    let mut catalog = catalog;
    for (declaration, cycle) in catalog.suspend_cycles() {
        log::warn!(
            "aggregate {name} on stream {stream} is suspended (kept, not run): it closes the {cycle}, and \
             an aggregate fed by its own output grows its streams for ever (declared before cycles were \
             refused). Delete it (DELETE /streams/{stream}/aggregates/{name}) or another aggregate of the \
             cycle, and it runs again when it no longer closes one.",
            name = declaration.name,
            stream = declaration.stream,
        );
    }
    if config.storage == crate::config::Storage::Disk {
        // Deleted streams' files an earlier run left: off the start-up path.
        let data_dir = config.data_dir.clone();
        let _ = std::thread::Builder::new()
            .name("spate-trash".into())
            .spawn(move || crate::stream::trash::empty_trash(&data_dir));
    }
    Ok((catalog, unsaved))
}
