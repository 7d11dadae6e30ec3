//! Accepting connections through resource exhaustion.
//!
//! An accept that fails for lack of file descriptors (`EMFILE`, `ENFILE`) or
//! kernel memory is not a per-connection error: the pending connection stays
//! in the kernel's queue and the next accept fails the same way at once. So
//! [`Acceptor::next`] counts the failure
//! (`spate_accept_errors_total{reason="fd_exhausted"}`), sheds the oldest
//! connection that has sent nothing yet (or the longest-idle ingest one,
//! `spate_connections_shed_total`) so a descriptor comes free, and sleeps a
//! back-off ([`ACCEPT_BACKOFF_MS_MIN`] doubling to [`ACCEPT_BACKOFF_MS_MAX`])
//! so the tasks that close sockets get to run. It logs once when an episode
//! starts and once when accepts have worked again for a second. Any other
//! accept error (an aborted handshake) is counted and retried after a
//! millisecond, never in a tight loop.

use std::time::{Duration, Instant};

use glommio::GlommioError;
use glommio::net::{TcpListener, TcpStream};

use crate::config::{ACCEPT_BACKOFF_MS_MAX, ACCEPT_BACKOFF_MS_MIN};
use crate::net::registry::Connections;
use crate::runtime::log::{self, Level, Scope};
use crate::runtime::notify::{Either, first};
use crate::shard::lifecycle::Lifecycle;
use crate::shard::metrics::ShardMetrics;

/// A run of accept failures for lack of resources, and the quiet time after
/// it that ends it.
const EPISODE_QUIET: Duration = Duration::from_secs(1);

/// One face's accept loop state on one shard.
pub struct Acceptor<'a> {
    pub listener: TcpListener,
    pub name: &'static str,
    pub shard_id: u16,
    pub lifecycle: &'a Lifecycle,
    pub connections: &'a Connections,
    pub metrics: &'a ShardMetrics,
    /// Accepts failed for lack of resources, logged once per episode.
    failures: log::Episode,
    /// Connections shed in the running episode.
    shed: u64,
    /// The next back-off after a failure.
    backoff_ms: u64,
}

impl<'a> Acceptor<'a> {
    pub fn new(
        listener: TcpListener,
        name: &'static str,
        shard_id: u16,
        lifecycle: &'a Lifecycle,
        connections: &'a Connections,
        metrics: &'a ShardMetrics,
    ) -> Acceptor<'a> {
        let failures = log::Episode::new("failed accepts");
        Acceptor {
            listener,
            name,
            shard_id,
            lifecycle,
            connections,
            metrics,
            failures,
            shed: 0,
            backoff_ms: ACCEPT_BACKOFF_MS_MIN,
        }
    }

    /// The next connection, or `None` once shutdown is requested.
    pub async fn next(&mut self) -> Option<TcpStream> {
        loop {
            let accepted = match first(self.listener.accept(), self.lifecycle.shutdown_requested()).await {
                Either::Left(accepted) => accepted,
                Either::Right(()) => return None,
            };
            let pause = match accepted {
                Ok(stream) => {
                    self.on_success(Instant::now());
                    return Some(stream);
                }
                Err(error) => self.on_error(&error, Instant::now()),
            };
            if let Either::Right(()) = first(glommio::timer::sleep(pause), self.lifecycle.shutdown_requested()).await {
                return None;
            }
        }
    }

    /// Counts an accept error, sheds a connection if descriptors ran out,
    /// and returns how long to wait before the next accept.
    fn on_error(&mut self, error: &GlommioError<()>, now: Instant) -> Duration {
        if !is_resource_exhaustion(error) {
            ShardMetrics::add(&self.metrics.accept_errors_other, 1);
            return Duration::from_millis(1);
        }
        ShardMetrics::add(&self.metrics.accept_errors_fd_exhausted, 1);
        self.end_episode_if_quiet(now);
        let failed = format_args!(
            "{} accept failed: {error}; out of file descriptors: backing off and shedding idle connections \
             (logged once per episode)",
            self.name
        );
        if self.failures.occur(now, Level::Warn, Scope::shard(self.shard_id), failed) {
            self.shed = 0;
            self.backoff_ms = ACCEPT_BACKOFF_MS_MIN;
        }
        // The first back-off lets sockets that are closing anyway go; after
        // that, make room.
        if self.failures.occurrences() > 1 && self.connections.shed_oldest().is_some() {
            self.shed += 1;
            ShardMetrics::add(&self.metrics.connections_shed, 1);
        }
        let pause = Duration::from_millis(self.backoff_ms);
        self.backoff_ms = (self.backoff_ms * 2).min(ACCEPT_BACKOFF_MS_MAX);
        pause
    }

    fn on_success(&mut self, now: Instant) {
        self.backoff_ms = ACCEPT_BACKOFF_MS_MIN;
        self.end_episode_if_quiet(now);
    }

    /// Ends (and reports) the episode if its last failure is a second old.
    fn end_episode_if_quiet(&mut self, now: Instant) {
        if self.failures.quiet_for(now).is_some_and(|quiet| quiet >= EPISODE_QUIET) {
            let works = format_args!("{} accept works again, {} connections shed", self.name, self.shed);
            self.failures.end(now, Level::Info, Scope::shard(self.shard_id), works);
        }
    }
}

/// Whether an accept error means the process or kernel ran out of a
/// resource (file descriptors, socket memory) rather than one connection
/// failing.
pub fn is_resource_exhaustion(error: &GlommioError<()>) -> bool {
    let GlommioError::IoError(error) = error else { return false };
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}
