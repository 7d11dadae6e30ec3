//! What the micro-benchmarks share.

use std::time::Instant;

/// Runs a measured pass this many times; the fastest is what counts.
pub const RUN_COUNT: usize = 15;

/// The fastest of [`RUN_COUNT`] passes of `run` (which returns the events
/// it handled), in ns per event: the least disturbed by the neighbours on a
/// shared box.
pub fn fastest_ns_per_event(mut run: impl FnMut() -> usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..RUN_COUNT {
        let started = Instant::now();
        let events = run();
        best = best.min(started.elapsed().as_nanos() as f64 / events as f64);
    }
    best
}
