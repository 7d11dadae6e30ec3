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
//! **When freed memory goes back to the kernel.** mimalloc purges memory a
//! while after it was freed (its purge delay), and only when the thread
//! that freed it calls into the allocator again. spate sets the delay to
//! 10 s ([`PURGE_DELAY_MS`], what jemalloc's `dirty_decay_ms` defaults to;
//! `MIMALLOC_PURGE_DELAY` in the environment overrides it). mimalloc's own
//! default, 1 s, let a shard purge the memory of a log segment or a key
//! table it was about to reuse and then fault it in again, a 2 MiB
//! transparent huge page at a time: `clear_page_erms` was 23 % of the
//! shards' samples with two aggregates, and memory storage ran at 6.1 M
//! events/s against glibc's 7.5 M; with 10 s it moves within this VM's
//! noise of glibc (9.2, 5.3, 5.6 against 6.6, 5.3, 6.1 M). Purging at
//! once on every free (delay 0) cost disk ingest 740 instead of 538 ns an
//! event. Without huge pages (mimalloc's `no_thp`) the disk path lost what
//! it gained (1.85 against glibc's 1.71 M events/s, 2.24 with them): the
//! O_DIRECT writes then go out from 4 KiB pages, which this VM's disk
//! writes at 0.46 – 0.69x the rate of the same writes from huge pages
//! (`scripts/bench-disk-pages`; README, "Disk writes from huge pages").
//! glibc serves a large allocation with an `mmap` of about its own size,
//! too small and unaligned to hold a huge page: likely why THP `always`
//! gave glibc little (1.87 M events/s; not checked in `smaps`).
//!
//! **Huge pages are off for a server by default** (`--huge-pages off`,
//! `crate::serve` sets PR_SET_THP_DISABLE before its shards start; mimalloc
//! still `madvise`s its arenas, and the kernel ignores it). The measurements
//! above were taken when every byte reached the disk twice and the device
//! bounded disk ingest. Since large `interval` rounds bypass the log, it no
//! longer does, and what huge pages cost came first: each fresh 2 MiB page
//! is zeroed in one fault that on this VM takes milliseconds, so the thread
//! that touches it stalls. With them, the replicated `#SYNC` p99 at 16
//! partitions was 25 – 97 ms against 6 – 7 ms without (it came with
//! mimalloc, bisected), and memory and disk ingest ran slower in the median
//! of four alternating runs (memory 11.45 against 9.72 M events/s, disk
//! `interval` 5.06 against 4.65, `always` 4.74 against 4.14; README,
//! "Transparent huge pages"). `--huge-pages on` gives them back where the
//! disk bounds ingest and page faults are cheap.
//!
//! A shard that went quiet after a burst (forty connections that each sent
//! a 900 KiB line, then idle) might never call the allocator again, and its
//! RSS would keep what the memory formula no longer counts. So each shard's
//! gossip loop (`Shard::run_balancer`), which ticks every report interval
//! (100 ms) while anything moves and every 5 s while the whole process is
//! idle, purges what is due at each busy tick ([`purge_due`]) and everything
//! at each idle tick ([`purge_all`]): a shard's RSS falls within a tick or
//! two of the process going idle, and within about 10 s on a busy one.

/// mimalloc's purge delay, in ms (module doc).
pub const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// `mi_option_purge_delay` in mimalloc's `mi_option_e` (v2 and v3 alike;
/// the binding names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Sets spate's allocator options; the binary calls it first thing.
pub fn configure() {
    // SAFETY: mimalloc's own entry point; it sets a default that
    // `MIMALLOC_PURGE_DELAY` in the environment still overrides.
    unsafe { libmimalloc_sys::mi_option_set_default(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
}

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
