//! A shard's life cycle as its tasks see it: whether shutdown was asked and
//! its deadline, and how many connection tasks are still open (drain waits
//! for them: ingest connections and subscriber sessions).

use std::cell::Cell;
use std::time::Instant;

use crate::runtime::notify::WaitList;

#[derive(Default)]
pub struct Lifecycle {
    shutdown_requested: Cell<bool>,
    shutdown_deadline: Cell<Option<Instant>>,
    shutdown_waiters: WaitList,
    connections_open: Cell<u64>,
    sessions_open: Cell<u64>,
    connection_waiters: WaitList,
}

impl Lifecycle {
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown_requested.get()
    }

    /// Resolves when shutdown is requested.
    pub async fn shutdown_requested(&self) {
        self.shutdown_waiters.wait_until(|| self.shutdown_requested.get()).await
    }

    /// Asks every task to stop; connections still open at `deadline` are cut.
    pub fn request_shutdown(&self, deadline: Instant) {
        self.shutdown_deadline.set(Some(deadline));
        self.shutdown_requested.set(true);
        self.shutdown_waiters.wake_all();
    }

    /// When connections are cut, once shutdown was requested.
    pub fn shutdown_deadline(&self) -> Option<Instant> {
        self.shutdown_deadline.get()
    }

    /// Counts an ingest connection task that drain must wait for.
    pub fn connection_opened(&self) {
        self.connections_open.set(self.connections_open.get() + 1);
    }

    pub fn connection_closed(&self) {
        let open = self.connections_open.get();
        assert!(open > 0, "more connections closed than opened");
        self.connections_open.set(open - 1);
        self.connection_waiters.wake_all();
    }

    /// Ingest connections open (the `connections_open` gauge).
    pub fn connections_open(&self) -> u64 {
        self.connections_open.get()
    }

    /// Counts a subscriber session that drain must wait for (it writes its
    /// closing notice).
    pub fn session_opened(&self) {
        self.sessions_open.set(self.sessions_open.get() + 1);
    }

    pub fn session_closed(&self) {
        let open = self.sessions_open.get();
        assert!(open > 0, "more sessions closed than opened");
        self.sessions_open.set(open - 1);
        self.connection_waiters.wake_all();
    }

    /// Subscriber sessions open, pre-`SUB` included.
    pub fn sessions_open(&self) -> u64 {
        self.sessions_open.get()
    }

    /// Connection tasks of either kind still open.
    pub fn tasks_open(&self) -> u64 {
        self.connections_open.get() + self.sessions_open.get()
    }

    /// Resolves once every counted connection and session has closed.
    pub async fn connections_closed(&self) {
        self.connection_waiters.wait_until(|| self.tasks_open() == 0).await
    }
}
