//! The admin HTTP server: hyper 1.x (HTTP/1) on the admin thread's
//! current-thread tokio runtime, with every resource bounded and every
//! resource error survived.

use std::convert::Infallible;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_lite::future::or;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::admin::{AdminState, routes};
use crate::config::{ACCEPT_BACKOFF_MS_MAX, ACCEPT_BACKOFF_MS_MIN, ADMIN_CONNECTIONS_MAX, ADMIN_HEADER_BYTES_MAX};
use crate::runtime::log::{self, Level};

/// An admin client must send a whole request head within this, in ms.
pub(super) const ADMIN_HEADER_READ_TIMEOUT_MS: u64 = 5000;
/// An admin connection is closed (gracefully, after its request in progress)
/// this long after it was accepted, in ms, so a keep-alive client cannot
/// hold one of the [`ADMIN_CONNECTIONS_MAX`] slots for ever.
pub(super) const ADMIN_CONNECTION_LIFETIME_MS: u64 = 60_000;
/// Most header fields in one request.
const ADMIN_HEADER_COUNT_MAX: usize = 64;
/// How long a connection past its lifetime gets to finish its request.
const GRACEFUL_CLOSE: Duration = Duration::from_secs(5);

/// Serves until `stop` fires (or its sender is dropped).
pub async fn serve(listener: std::net::TcpListener, state: Arc<AdminState>, mut stop: oneshot::Receiver<()>) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            log::error!("admin: cannot serve: {error}");
            return;
        }
    };
    let permits = Arc::new(Semaphore::new(ADMIN_CONNECTIONS_MAX));
    let mut backoff_ms = ACCEPT_BACKOFF_MS_MIN;
    let accept_failures = log::Episode::new("failed accepts");
    let scope = log::Scope::process();
    loop {
        // A connection slot first: past the limit, clients wait in the backlog.
        let permit = or(async { permits.clone().acquire_owned().await.ok() }, async {
            let _ = (&mut stop).await;
            None
        });
        let Some(permit) = permit.await else { return };
        let accepted = or(async { Some(listener.accept().await) }, async {
            let _ = (&mut stop).await;
            None
        });
        match accepted.await {
            None => return,
            Some(Ok((stream, _))) => {
                accept_failures.end(Instant::now(), Level::Info, scope, format_args!("admin accept works again"));
                backoff_ms = ACCEPT_BACKOFF_MS_MIN;
                tokio::spawn(serve_connection(stream, state.clone(), permit));
            }
            Some(Err(error)) => {
                state.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                let failed =
                    format_args!("admin accept failed: {error}; backing off (logged once until it works again)");
                accept_failures.occur(Instant::now(), Level::Warn, scope, failed);
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(ACCEPT_BACKOFF_MS_MAX);
            }
        }
    }
}

/// Serves one connection: bounded request heads, a header read timeout, and
/// a lifetime after which it is closed once its request in progress is done.
async fn serve_connection(stream: TcpStream, state: Arc<AdminState>, permit: OwnedSemaphorePermit) {
    state.counters.connections_open.fetch_add(1, Ordering::Relaxed);
    let service_state = state.clone();
    let service = service_fn(move |request| {
        let state = service_state.clone();
        async move { Ok::<_, Infallible>(routes::route(&state, request).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(ADMIN_HEADER_READ_TIMEOUT_MS))
        .max_header_size(ADMIN_HEADER_BYTES_MAX)
        .max_buf_size(2 * ADMIN_HEADER_BYTES_MAX)
        .max_headers(ADMIN_HEADER_COUNT_MAX);
    let mut connection = pin!(builder.serve_connection(TokioIo::new(stream), service));
    let lifetime = tokio::time::sleep(Duration::from_millis(ADMIN_CONNECTION_LIFETIME_MS));
    let expired = or(async { (&mut connection).await.map(|()| false) }, async {
        lifetime.await;
        Ok(true)
    })
    .await;
    if let Ok(true) = expired {
        connection.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(GRACEFUL_CLOSE, connection).await;
    }
    state.counters.connections_open.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
}
