//! A shard's life cycle as its tasks see it: whether shutdown was asked, and
//! how many connections are still open (drain waits for them).

use std::cell::Cell;

use crate::shard::notify::WaitList;

#[derive(Default)]
pub struct Lifecycle {
    shutdown_requested: Cell<bool>,
    shutdown_waiters: WaitList,
    connections_open: Cell<u64>,
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

    pub fn request_shutdown(&self) {
        self.shutdown_requested.set(true);
        self.shutdown_waiters.wake_all();
    }

    /// Counts a connection task that drain must wait for.
    pub fn connection_opened(&self) {
        self.connections_open.set(self.connections_open.get() + 1);
    }

    pub fn connection_closed(&self) {
        let open = self.connections_open.get();
        assert!(open > 0, "more connections closed than opened");
        self.connections_open.set(open - 1);
        self.connection_waiters.wake_all();
    }

    pub fn connections_open(&self) -> u64 {
        self.connections_open.get()
    }

    /// Resolves once every counted connection has closed.
    pub async fn connections_closed(&self) {
        self.connection_waiters.wait_until(|| self.connections_open.get() == 0).await
    }
}
