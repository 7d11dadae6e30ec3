//! The process's allocator, and handing memory it no longer uses back to
//! the kernel.
//!
//! The `spate` binary runs on mimalloc rather than glibc's malloc (its
//! `#[global_allocator]` is in `src/main.rs`: the library leaves the choice
//! to the binary, so benchmarks can count allocations). The ingest hot path
//! allocates nothing per event, but other paths do: raft-rs builds a
//! message, an entry vector and a protobuf buffer per group per round, and
//! disk storage allocates its write-behind and read buffers as it goes.
//! Under glibc, `_int_malloc`, `_int_free`, `unlink_chunk` and
//! `malloc_consolidate` were 18 % of an RF 3 node's cluster thread at 256
//! partitions, and disk ingest ran at 0.7x of what it does on mimalloc
//! (README, Benchmarks). mimalloc keeps its free lists per thread, so a
//! thread allocating and freeing its own memory takes no lock.
//!
//! mimalloc gives freed memory back to the kernel a while after it was
//! freed (its purge delay, 1 s), and only when the thread that freed it
//! calls into the allocator again. A shard that went quiet after a burst
//! (forty connections that each sent a 900 KiB line, then idle) might never
//! do so, and its RSS would keep what the memory formula no longer counts.
//! So each shard's connection sweeper, which runs while the shard has
//! connections, purges what is due ([`purge_due`]), and purges everything
//! once its last connection is gone ([`purge_all`]). Purging at once on
//! every free (`purge_delay` 0) was measured too: disk ingest cost 740
//! instead of 538 ns an event of server CPU, its pages faulted in again on
//! the next round.

/// Hands back to the kernel the memory this thread freed whose purge delay
/// has passed. Cheap: it walks this thread's heap. (In a binary on another
/// allocator it only sets up mimalloc's empty state for the thread.)
pub fn purge_due() {
    // SAFETY: mimalloc's own entry point, safe from any thread at any time.
    unsafe { libmimalloc_sys::mi_collect(false) };
}

/// Hands back to the kernel all memory this thread freed, delay or not.
pub fn purge_all() {
    // SAFETY: as above.
    unsafe { libmimalloc_sys::mi_collect(true) };
}
