//! Long loops on a shard that let a waiting request in, without paying a
//! trip to the back of the run queue for every step.
//!
//! `glommio::yield_if_needed` yields whenever a request from another
//! thread is waiting (vendored glommio, patch 6), which under a steady
//! stream of queries is most of the time: a loop that called it after every
//! small step (a partition's windows, 256 closed windows) went to the back
//! of the run queue at each one, behind every batch queued to apply, and
//! closing a second's windows took 100 - 150 ms instead of 5 - 20
//! (measured, `scripts/bench-aggregates` part 3). A [`Slice`] yields only
//! once it has run [`SLICE`] since its start or its last yield, so a
//! request waits at most about that long for such a loop, and the loop
//! gives way at most once per slice.

use std::time::{Duration, Instant};

/// The work a loop does between two chances to yield.
pub const SLICE: Duration = Duration::from_micros(500);

/// A loop's running slice (see the module doc).
pub struct Slice {
    started: Instant,
}

impl Slice {
    pub fn start() -> Slice {
        Slice { started: Instant::now() }
    }

    /// Whether [`Slice::check`] would yield now.
    pub fn due(&self) -> bool {
        self.started.elapsed() >= SLICE && glommio::executor().need_preempt()
    }

    /// Yields if the slice is spent and something waits (a request from
    /// another thread, or the preempt timer); starts a new slice then.
    pub async fn check(&mut self) {
        if self.due() {
            glommio::yield_if_needed().await;
            self.started = Instant::now();
        }
    }
}
