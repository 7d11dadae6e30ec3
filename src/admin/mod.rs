//! The admin face: HTTP/1.1 on its own thread, reaching the shards over
//! flume. Nothing on the data path waits for it: a shard answers a
//! [`ControlRequest`] between its other tasks.
//!
//! * `GET /metrics`: Prometheus text exposition format 0.0.4.
//! * `GET /stats`: JSON, per shard and totals.
//! * `GET /partitions`: JSON placement table with offsets.
//! * `GET /cluster`: JSON, the members this node knows ([`cluster`]).
//!
//! The server is hyper 1.x (HTTP/1 only) on a current-thread tokio runtime
//! that the admin thread owns ([`http`]): at most [`ADMIN_CONNECTIONS_MAX`]
//! connections at once (more wait in the listen backlog), a request head of
//! at most [`ADMIN_HEADER_BYTES_MAX`] read within
//! [`ADMIN_HEADER_READ_TIMEOUT_MS`], bodies of at most
//! [`ADMIN_BODY_BYTES_MAX`], and a connection closed after
//! [`ADMIN_CONNECTION_LIFETIME_MS`]. An accept that fails for lack of file
//! descriptors backs off instead of ending the thread. Routes are one
//! `match` in [`routes`]; a route that takes a body gets it already read
//! and bounded.
//!
//! [`ADMIN_CONNECTIONS_MAX`]: crate::config::ADMIN_CONNECTIONS_MAX
//! [`ADMIN_HEADER_BYTES_MAX`]: crate::config::ADMIN_HEADER_BYTES_MAX
//! [`ADMIN_HEADER_READ_TIMEOUT_MS`]: http::ADMIN_HEADER_READ_TIMEOUT_MS
//! [`ADMIN_BODY_BYTES_MAX`]: routes::ADMIN_BODY_BYTES_MAX
//! [`ADMIN_CONNECTION_LIFETIME_MS`]: http::ADMIN_CONNECTION_LIFETIME_MS

mod aggregates;
mod cluster;
mod http;
mod render;
pub mod replicated;
mod routes;
mod streams;

pub use streams::{Failure as StreamFailure, StreamCommand};

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{Config, MemoryBound};
use crate::runtime::log;
use crate::shard::control::{ControlRequest, PartitionInfo};
use crate::shard::metrics::ShardStats;

/// How long the admin thread waits for a shard's answer.
pub(crate) const SHARD_REPLY_TIMEOUT: Duration = Duration::from_secs(2);
/// How long stopping the admin server waits for its connections.
const STOP_TIMEOUT: Duration = Duration::from_secs(1);

/// What the admin thread needs to answer requests.
pub struct AdminState {
    pub controls: Vec<flume::Sender<ControlRequest>>,
    pub config: Arc<Config>,
    pub memory_bound: MemoryBound,
    pub started: Instant,
    /// The admin server's own counters (`/metrics`).
    pub counters: AdminCounters,
    /// The stream catalog: the one copy that changes, held for the whole of
    /// a create or delete, so they run one at a time.
    pub catalog: tokio::sync::Mutex<crate::stream::Catalog>,
    /// Deleted streams' ranges waiting for their fences (touched only with
    /// the catalog lock held).
    pub fences: std::sync::Mutex<Vec<streams::Fence>>,
    /// Set while the catalog created at start-up waits for disk space.
    pub catalog_unsaved: crate::stream::UnsavedCatalog,
    /// Stream changes the shards ask for (Kafka's CreateTopics, ...).
    pub stream_commands: flume::Receiver<StreamCommand>,
    /// The cluster thread (`GET /cluster`, the member gauges of `/metrics`).
    pub cluster: flume::Sender<crate::cluster::ClusterRequest>,
    /// In a cluster (`--cluster`/`--join`): the catalog is the cluster's,
    /// changed through its Raft group ([`replicated`]); `None` on a single
    /// node, whose changes are local as ever.
    pub replicated: Option<replicated::Replicated>,
}

/// What the admin server counts about itself.
#[derive(Default)]
pub struct AdminCounters {
    pub connections_open: AtomicU64,
    pub accept_errors: AtomicU64,
}

/// Why the admin server could not start.
#[derive(Debug)]
pub enum AdminError {
    Bind { address: std::net::SocketAddr, error: String },
    Runtime(std::io::Error),
    Thread(std::io::Error),
}

impl std::fmt::Display for AdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminError::Bind { address, error } => write!(f, "bind admin {address}: {error}"),
            AdminError::Runtime(error) => write!(f, "start the admin runtime: {error}"),
            AdminError::Thread(error) => write!(f, "spawn admin thread: {error}"),
        }
    }
}

/// A shard that did not answer a control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardUnavailable {
    NotRunning { shard: usize },
    Timeout { shard: usize },
}

impl std::fmt::Display for ShardUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardUnavailable::NotRunning { shard } => writeln!(f, "shard {shard} is not running"),
            ShardUnavailable::Timeout { shard } => {
                writeln!(f, "shard {shard} did not answer within {}s", SHARD_REPLY_TIMEOUT.as_secs())
            }
        }
    }
}

/// A running admin server; [`AdminServer::stop`] ends its thread.
pub struct AdminServer {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Binds the admin address and starts serving on the admin thread.
    pub fn start(state: AdminState) -> Result<AdminServer, AdminError> {
        let address = state.config.admin;
        let bind_error = |error: std::io::Error| AdminError::Bind { address, error: error.to_string() };
        let listener = std::net::TcpListener::bind(address).map_err(bind_error)?;
        listener.set_nonblocking(true).map_err(bind_error)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(AdminError::Runtime)?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let state = Arc::new(state);
        let thread = std::thread::Builder::new()
            .name("spate-admin".into())
            .spawn(move || {
                set_control_priority(state.config.control_nice);
                runtime.block_on(async move {
                    tokio::spawn(streams::serve_commands(state.clone(), state.stream_commands.clone()));
                    if let Some(replicated) = &state.replicated {
                        tokio::spawn(replicated::apply_committed(state.clone(), replicated.entries.clone()));
                    }
                    if state.catalog_unsaved.reason().is_some() {
                        tokio::spawn(save_deferred_catalog(state.clone()));
                    }
                    http::serve(listener, state, stopped).await
                });
                runtime.shutdown_timeout(STOP_TIMEOUT);
            })
            .map_err(AdminError::Thread)?;
        Ok(AdminServer { stop: Some(stop), thread: Some(thread) })
    }

    pub fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Gives the admin thread its `--control-nice` value (see
/// [`crate::runtime::priority`]); a refusal is logged and the thread runs on.
fn set_control_priority(nice: i32) {
    if let Err(error) = crate::runtime::priority::set_current_thread_nice(nice) {
        log::info!(
            "the admin thread keeps the process's priority: nice {nice} was refused ({error}); it needs \
             CAP_SYS_NICE, or pass --control-nice 0"
        );
    }
}

/// Saves the catalog that start-up could not write (the disk was full),
/// retrying every [`STORAGE_RETRY_MS`] under the catalog lock (so it never
/// writes over a newer one) until it is on disk.
///
/// [`STORAGE_RETRY_MS`]: crate::config::STORAGE_RETRY_MS
async fn save_deferred_catalog(state: Arc<AdminState>) {
    // A full disk is expected here and not logged; other failures are, once
    // until the save succeeds.
    let failures = log::Episode::new("failed saves");
    let scope = log::Scope::process();
    while state.catalog_unsaved.reason().is_some() {
        tokio::time::sleep(Duration::from_millis(crate::config::STORAGE_RETRY_MS)).await;
        let catalog = state.catalog.lock().await;
        match catalog.save(&state.config.data_dir) {
            Ok(()) => {
                state.catalog_unsaved.clear();
                let saved = "the stream catalog deferred at start-up is saved";
                if !failures.end(Instant::now(), log::Level::Info, scope, format_args!("{saved}")) {
                    log::info!("{saved}");
                }
            }
            Err(error) if error.is_storage_full() => {}
            Err(error) => {
                let failed = format_args!("saving the stream catalog deferred at start-up: {error}; retrying");
                failures.occur(Instant::now(), log::Level::Warn, scope, failed);
            }
        }
    }
}

/// Asks every shard for its stats; an error names the shard that did not answer.
pub async fn collect_stats(state: &AdminState) -> Result<Vec<ShardStats>, ShardUnavailable> {
    ask_all(state, ControlRequest::Stats).await
}

/// Every consumer group (from its coordinator) and every partition (for
/// the groups' lag).
pub async fn collect_groups(
    state: &AdminState,
) -> Result<(Vec<crate::shard::groups::GroupInfo>, Vec<PartitionInfo>), ShardUnavailable> {
    let mut groups: Vec<_> = ask_all(state, ControlRequest::Groups).await?.into_iter().flatten().collect();
    groups.sort_by(|a, b| (&a.stream, &a.group).cmp(&(&b.stream, &b.group)));
    Ok((groups, collect_partitions(state).await?))
}

async fn collect_partitions(state: &AdminState) -> Result<Vec<PartitionInfo>, ShardUnavailable> {
    let mut partitions: Vec<PartitionInfo> =
        ask_all(state, ControlRequest::Partitions).await?.into_iter().flatten().collect();
    partitions.sort_by_key(|info| info.partition);
    Ok(partitions)
}

async fn ask_all<T>(
    state: &AdminState,
    make: impl Fn(flume::Sender<T>) -> ControlRequest,
) -> Result<Vec<T>, ShardUnavailable> {
    ask_all_within(state, make, SHARD_REPLY_TIMEOUT).await
}

/// Like [`ask_all`], with a timeout per shard's answer.
async fn ask_all_within<T>(
    state: &AdminState,
    make: impl Fn(flume::Sender<T>) -> ControlRequest,
    timeout: Duration,
) -> Result<Vec<T>, ShardUnavailable> {
    let mut replies = Vec::with_capacity(state.controls.len());
    for (shard, control) in state.controls.iter().enumerate() {
        let (sender, receiver) = flume::bounded(1);
        // A full control queue is a busy shard: wait for room (the admin
        // thread's runtime goes on meanwhile), within the same timeout.
        match tokio::time::timeout(timeout, control.send_async(make(sender))).await {
            Ok(Ok(())) => replies.push(receiver),
            Ok(Err(_)) => return Err(ShardUnavailable::NotRunning { shard }),
            Err(_) => return Err(ShardUnavailable::Timeout { shard }),
        }
    }
    let mut answers = Vec::with_capacity(replies.len());
    for (shard, receiver) in replies.into_iter().enumerate() {
        match tokio::time::timeout(timeout, receiver.recv_async()).await {
            Ok(Ok(answer)) => answers.push(answer),
            Ok(Err(_)) => return Err(ShardUnavailable::NotRunning { shard }),
            Err(_) => return Err(ShardUnavailable::Timeout { shard }),
        }
    }
    Ok(answers)
}

/// This process's resident set size and its peak, in bytes (from /proc).
pub fn process_rss_bytes() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}
