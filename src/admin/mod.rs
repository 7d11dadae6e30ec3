//! The admin face: HTTP on a control thread (tiny_http), reaching the shards
//! over flume. Nothing on the data path waits for it: a shard answers a
//! [`ControlRequest`] between its other tasks.
//!
//! * `GET /metrics`: Prometheus text exposition format 0.0.4.
//! * `GET /stats`: JSON, per shard and totals.
//! * `GET /partitions`: JSON placement table with offsets.

mod render;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::config::{Config, MemoryBound};
use crate::shard::control::{ControlRequest, PartitionInfo};
use crate::shard::metrics::ShardStats;

/// How long the admin thread waits for a shard's answer.
const SHARD_REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// What the admin thread needs to answer requests.
pub struct AdminState {
    pub controls: Vec<flume::Sender<ControlRequest>>,
    pub config: Arc<Config>,
    pub memory_bound: MemoryBound,
    pub started: Instant,
}

/// Why the admin server could not start.
#[derive(Debug)]
pub enum AdminError {
    Bind { address: std::net::SocketAddr, error: String },
    Thread(std::io::Error),
}

impl std::fmt::Display for AdminError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminError::Bind { address, error } => write!(f, "bind admin {address}: {error}"),
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
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    pub fn start(state: AdminState) -> Result<AdminServer, AdminError> {
        let address = state.config.admin;
        let server =
            tiny_http::Server::http(address).map_err(|error| AdminError::Bind { address, error: error.to_string() })?;
        let server = Arc::new(server);
        let serving = server.clone();
        let thread = std::thread::Builder::new()
            .name("spate-admin".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    respond(&state, request);
                }
            })
            .map_err(AdminError::Thread)?;
        Ok(AdminServer { server, thread: Some(thread) })
    }

    pub fn stop(mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn respond(state: &AdminState, request: tiny_http::Request) {
    let path = request.url().split('?').next().unwrap_or("").to_string();
    let is_get = *request.method() == tiny_http::Method::Get;
    let (status, content_type, body) = match (is_get, path.as_str()) {
        (true, "/metrics") => match collect_stats(state) {
            Ok(stats) => (200, "text/plain; version=0.0.4; charset=utf-8", render::prometheus(state, &stats)),
            Err(error) => (503, "text/plain", error.to_string()),
        },
        (true, "/stats") => match collect_stats(state) {
            Ok(stats) => (200, "application/json", render::stats_json(state, &stats)),
            Err(error) => (503, "text/plain", error.to_string()),
        },
        (true, "/partitions") => match collect_partitions(state) {
            Ok(partitions) => (200, "application/json", render::partitions_json(&partitions)),
            Err(error) => (503, "text/plain", error.to_string()),
        },
        (true, "/") => (200, "text/plain", "spate admin: GET /metrics, /stats, /partitions\n".to_string()),
        (true, _) => (404, "text/plain", format!("not found: {path}\n")),
        (false, _) => (405, "text/plain", "only GET is supported\n".to_string()),
    };
    let header = tiny_http::Header::from_bytes("Content-Type", content_type).expect("static header is valid");
    let response = tiny_http::Response::from_string(body).with_status_code(status).with_header(header);
    let _ = request.respond(response);
}

/// Asks every shard for its stats; an error names the shard that did not answer.
pub fn collect_stats(state: &AdminState) -> Result<Vec<ShardStats>, ShardUnavailable> {
    ask_all(state, ControlRequest::Stats)
}

fn collect_partitions(state: &AdminState) -> Result<Vec<PartitionInfo>, ShardUnavailable> {
    let mut partitions: Vec<PartitionInfo> =
        ask_all(state, ControlRequest::Partitions)?.into_iter().flatten().collect();
    partitions.sort_by_key(|info| info.partition);
    Ok(partitions)
}

fn ask_all<T>(
    state: &AdminState,
    make: impl Fn(flume::Sender<T>) -> ControlRequest,
) -> Result<Vec<T>, ShardUnavailable> {
    let replies: Vec<_> = state
        .controls
        .iter()
        .map(|control| {
            let (sender, receiver) = flume::bounded(1);
            let sent = control.send(make(sender)).is_ok();
            (sent, receiver)
        })
        .collect();
    replies
        .into_iter()
        .enumerate()
        .map(|(shard, (sent, receiver))| {
            if !sent {
                return Err(ShardUnavailable::NotRunning { shard });
            }
            receiver.recv_timeout(SHARD_REPLY_TIMEOUT).map_err(|_| ShardUnavailable::Timeout { shard })
        })
        .collect()
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
