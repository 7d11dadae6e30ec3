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
use crate::runtime::notify::{Either, first};
use crate::shard::lifecycle::Lifecycle;
use crate::shard::metrics::ShardMetrics;

/// A run of accept failures for lack of resources, and the quiet time after
/// it that ends it.
const EPISODE_QUIET: Duration = Duration::from_secs(1);

struct Episode {
    started: Instant,
    last_failure: Instant,
    failures: u64,
    shed: u64,
    backoff_ms: u64,
}

/// One face's accept loop state on one shard.
pub struct Acceptor<'a> {
    pub listener: TcpListener,
    pub name: &'static str,
    pub shard_id: u16,
    pub lifecycle: &'a Lifecycle,
    pub connections: &'a Connections,
    pub metrics: &'a ShardMetrics,
    episode: Option<Episode>,
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
        Acceptor { listener, name, shard_id, lifecycle, connections, metrics, episode: None }
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
        let (shard_id, name) = (self.shard_id, self.name);
        let episode = self.episode.get_or_insert_with(|| {
            eprintln!(
                "spate: shard {shard_id}: {name} accept failed: {error}; out of file descriptors: backing off and \
                 shedding idle connections (logged once per episode)"
            );
            Episode { started: now, last_failure: now, failures: 0, shed: 0, backoff_ms: ACCEPT_BACKOFF_MS_MIN }
        });
        episode.failures += 1;
        episode.last_failure = now;
        // The first back-off lets sockets that are closing anyway go; after
        // that, make room.
        if episode.failures > 1 && self.connections.shed_oldest().is_some() {
            episode.shed += 1;
            ShardMetrics::add(&self.metrics.connections_shed, 1);
        }
        let pause = Duration::from_millis(episode.backoff_ms);
        episode.backoff_ms = (episode.backoff_ms * 2).min(ACCEPT_BACKOFF_MS_MAX);
        pause
    }

    fn on_success(&mut self, now: Instant) {
        if let Some(episode) = &mut self.episode {
            episode.backoff_ms = ACCEPT_BACKOFF_MS_MIN;
        }
        self.end_episode_if_quiet(now);
    }

    /// Ends (and reports) the episode if its last failure is a second old.
    fn end_episode_if_quiet(&mut self, now: Instant) {
        let quiet =
            self.episode.as_ref().is_some_and(|episode| now.duration_since(episode.last_failure) >= EPISODE_QUIET);
        if quiet && let Some(episode) = self.episode.take() {
            eprintln!(
                "spate: shard {}: {} accept works again: {} accepts failed over {:.1}s, {} connections shed",
                self.shard_id,
                self.name,
                episode.failures,
                episode.last_failure.duration_since(episode.started).as_secs_f64(),
                episode.shed
            );
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
