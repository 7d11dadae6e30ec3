//! The building blocks of spate's durable log: frame format and CRC32C,
//! segment writer and reader over glommio DMA files, sparse indexes,
//! recovery, the data directory, each shard's write-ahead log ([`wal`]),
//! and the small files replaced whole (the catalog, group offsets,
//! aggregate checkpoints: [`durable`]).
//!
//! The engine keeps one set of segment files per partition
//! ([`crate::partition::disk`], driven by [`crate::shard::commit`]): a
//! partition moves between shards by reopening its files, retention
//! deletes one partition's oldest file and a stream is deleted with its
//! directory. Durability follows the recommendation below: every commit
//! round's frames, for all of a shard's partitions, go to the shard's
//! write-ahead log in one write with one fdatasync when the policy asks,
//! and the segment files are written without an fdatasync of their own
//! and synced in bulk by a checkpoint every few seconds, after which that
//! part of the log is reused. So a round costs one flush however many
//! partitions it touches (measured in the README, "Layout", and the
//! durable benchmark), and the segment layout keeps what it made simple.
//! Frames carry their log id, so the log needed no format change.
//! Measured in the engine (README, "Benchmarks", 2026-12-04, before and
//! after in one session): a `#SYNC` every 10 ms at 100 k events/s now
//! answers in p50 8 ms instead of 1.4 – 2.2 s; closed-loop disk ingest is
//! 0.6 – 0.85x of before (every byte is written twice, and the log's first
//! lap grows its files: zero-filling ahead of the writer is the next
//! step); recovery time is unchanged.
//!
//! # Recommendation (from `benches/disk_layout.rs`, numbers below)
//!
//! * **One write-ahead file per shard, with a per-partition sparse index**,
//!   not one file per partition. A group commit that fdatasyncs K partition
//!   files is bound by K syncs even when issued concurrently: at K = 64
//!   partitions of 4 KiB each, 30 – 70 commits/s with a 15 – 20 ms p50,
//!   against 650 – 2170 commits/s and 0.4 – 1.2 ms p50 for the same bytes in
//!   one file with one fdatasync (15 – 31x, three runs); at K = 128, 21 – 42
//!   against 530 – 1580 (21 – 44x). With 64 KiB per partition the gap is
//!   still 2.3 – 5.4x. Only at K = 1 are the layouts about equal. A shard owns tens to
//!   hundreds of partitions and a commit touches most of them, so the
//!   per-partition layout cannot meet a 1 ms `#SYNC` or use the disk's
//!   bandwidth with fsync on. The price of the write-ahead file: a partition
//!   that migrates leaves its older frames in the old shard's files (read
//!   them there: sealed files are immutable, any thread may read them), and
//!   a file can be deleted only when every partition in it is past retention
//!   (retention by whole file per shard, or a cleaner that copies live frames
//!   forward, as BookKeeper's entry logs do). Frames carry a `log_id` for
//!   this: the scan of a shared file demultiplexes on it.
//! * **DMA (O_DIRECT), not buffered.** Sequential DMA writes reach the
//!   device's speed (0.99 – 1.23 GB/s, dd `oflag=direct` 0.88 – 1.3 GB/s in
//!   the same runs); buffered writes plus one fdatasync reach 0.17 – 0.21
//!   GB/s here, and a buffered 4 KiB append + fdatasync is no faster than
//!   DMA (p50 0.31 – 0.98 ms vs 0.19 – 0.28 ms).
//! * **Rewrite the partial last block, do not pad.** Rewriting costs
//!   nothing measurable (200-byte commits: 2600 – 4400 commits/s rewriting vs
//!   1900 – 3200 padding, rewriting ahead in every run; padding grows the file by a block per commit, 20x
//!   the data at 200 bytes). [`segment::SegmentWriter`] rewrites.
//! * **Recycle zero-filled files rather than fallocate.** Group commits
//!   into one zero-filled file: 2190 – 3910 commits/s (K = 64 x 4 KiB) vs
//!   840 – 1600 growing the file and 500 – 640 into fallocated space
//!   (unwritten extents still need a journal commit to convert); a single
//!   4 KiB append + fdatasync, p50 95 µs zero-filled vs 230 – 280 µs growing
//!   in the two quieter runs. [`wal`] recycles its files (after a first
//!   lap that grows them, so a new or small data directory pays nothing
//!   up front); segment files still grow, but nothing waits for their sync.
//!
//! # Measured
//!
//! `cargo bench --bench disk_layout -- /work/target-storage/disk-bench`
//! (ext4 on /dev/vda, virtio, logical block 512, physical 4096, write cache
//! write back; /tmp is the same filesystem, so it was not run separately;
//! 2-core VM shared with other builds, so absolute values drift between
//! runs by up to 2x and the p99s are noisy: compare within a run). The
//! second run of the day, the first with the poll-ring probe primed:
//!
//! ```text
//! reference: dd if=/dev/zero of=F bs=1M count=2000 oflag=direct: 2.1 GB copied, 1.91402 s, 1.1 GB/s
//! sequential, std::fs buffered write 1 MiB + one fdatasync at the end: 211 MB/s (1024 MiB in 5.09 s)
//! sequential, DMA write 1 MiB x 8 in flight + one fdatasync: 1141 MB/s (1024 MiB in 0.94 s, alignment 512)
//!
//! ### fdatasync after one 4 KiB append (µs)
//! file                             p50     p99     max write50  syncs/s
//! DMA, Growing                     282     741    5219     169     1843
//! DMA, Fallocated                  263     747    5431     279     1630
//! DMA, Zeroed                       95    1595    6319     102     2823
//! std::fs buffered, Growing        309    2407   15855       5     2445
//!
//! ### group commit: K partitions x B bytes per commit, growing files (DMA)
//! per-partition: K files, K writes concurrently, then K fdatasyncs concurrently
//! wal: one file, one write of K*B bytes, one fdatasync
//! K B        | files c/s    MB/s  p50 µs  p99 µs |   wal c/s    MB/s  p50 µs  p99 µs |  wal/f
//!    1    4K |      1125     4.6     452    6235 |      1887     7.7     434    3045 |  1.68x
//!    1   64K |      1285    84.2     509    6495 |      1795   117.6     464    2973 |  1.40x
//!    8    4K |       326    10.7    2369   12495 |      2038    66.8     272    3995 |  6.25x
//!    8   64K |       392   205.5    2213   11407 |       785   411.7     789    7223 |  2.00x
//!   64    4K |        30     7.8   17951  163583 |       658   172.4     882    8431 | 22.07x
//!   64   64K |        51   212.5   16335   49727 |       116   487.8    4827  180735 |  2.30x
//!  128    4K |        21    11.2   40319  103359 |       938   491.7     873    4215 | 44.05x
//!  128   64K |        19   162.8   37407  136831 |       104   872.3    9079   18287 |  5.36x
//!
//! ### partial last block: rewrite it next commit vs pad every commit (DMA, one file, growing)
//! commit   mode          c/s  p50 µs  p99 µs     file B/c    written B/c
//! 200      Rewrite      2617     151    4027          202           4289
//! 200      Pad          1874     243    5263         4096           4096
//! 1500     Rewrite      2345     192    4045         1501           5592
//! 1500     Pad          2424     228    4567         4096           4096
//! 6000     Rewrite      3050     227    3719         6001          10079
//! 6000     Pad          2614     230    4007         8192           8192
//!
//! ### group commit by file preparation, K = 64, B = 4 KiB (DMA)
//! K B        | files c/s    MB/s  p50 µs  p99 µs |   wal c/s    MB/s  p50 µs  p99 µs |  wal/f
//! Growing    |        54    14.1   15391   40895 |      1603   420.3     412    4191 | 29.73x
//! Fallocated |       127    33.3    5915   38655 |       640   167.7     510    9447 |  5.04x
//! Zeroed     |        86    22.6   10591   35935 |      2190   574.0     320    4011 | 25.37x
//! ```
//!
//! The ranges in the recommendation also take in the run before it, on a
//! quieter machine (dd 1.3 GB/s; K = 64 x 4 KiB: 70 vs 2168 commits/s, 31x;
//! K = 128 x 4 KiB: 42 vs 1577, 38x; rewrite 4417 vs pad 2913 commits/s at
//! 200 bytes; that run had glommio's I/O-poll ring on by accident, see
//! [`segment::prime_dma_probe`], and its ratios match), and the run after
//! it, on a busier one (dd 877 MB/s; K = 64 x 4 KiB: 45 vs 650, 15x;
//! K = 128 x 4 KiB: 25 vs 530, 21x; zero-filled write-ahead file 3913
//! commits/s, p99 0.65 ms).
//!
//! # The pieces
//!
//! * [`format`] has records and CRC32C batch frames (byte layout documented
//!   there), [`format::FrameEncoder`] to build a frame in place,
//!   [`format::decode_frame`], and the recovery [`format::scan`]. Pure.
//! * [`index`] has [`index::SegmentIndex`], a sparse offset → position index,
//!   and its sidecar file format.
//! * [`dir`] has `<data-dir>/streams/<stream>/<partition>/<base:020>.log`
//!   naming and listing, and [`dir::lock_data_dir`].
//! * [`segment`] has [`segment::SegmentWriter`] (aligned DMA appends, the
//!   partial block rewritten, fdatasync, retryable errors) and
//!   [`segment::SegmentReader`] (aligned reads through the index).
//! * [`recovery`] has [`recovery::recover_segment`], which cuts the active
//!   segment after its last valid frame, and [`recovery::open_sealed`], which opens a
//!   sealed one through its sidecar, rebuilding it when needed.
//! * [`wal`] has [`wal::Wal`], a shard's write-ahead log (a ring of recycled
//!   files, records of whole frames), its checkpoint, and [`wal::read_all`],
//!   the start-up read of every shard's log for replay.
//!
//! ```
//! use spate::storage::format::{FrameEncoder, ScanCursor, ScanStop, decode_frame, scan};
//!
//! let mut buffer = vec![0u8; 4096];
//! let mut encoder = FrameEncoder::new(&mut buffer).unwrap();
//! encoder.append(b"user42", b"clicked").unwrap();
//! encoder.append(b"user7", b"paid 12.50").unwrap();
//! let sealed = encoder.seal(/* log_id */ 3, /* base_offset */ 100, /* timestamp_ms */ 0).unwrap();
//!
//! let frame = decode_frame(&buffer[..sealed.frame_size]).unwrap();
//! let keys: Vec<&[u8]> = frame.records().map(|record| record.key).collect();
//! assert_eq!(keys, [&b"user42"[..], b"user7"]);
//!
//! // Zeros after the last frame read as a clean end.
//! let outcome = scan(&buffer, 3, ScanCursor::at_segment_start(100));
//! assert_eq!((outcome.stop, outcome.cursor.next_offset), (ScanStop::Zeros, 102));
//! ```

pub mod dir;
pub mod durable;
pub mod format;
pub mod index;
pub mod recovery;
pub mod segment;
pub mod wal;

/// Mounts a tmpfs of `size` (mount's syntax: `64k`, `1m`) on `dir` for a
/// test of a full disk; without root it says the test is skipped and
/// returns false.
#[cfg(test)]
pub(crate) fn mount_tmpfs(dir: &std::path::Path, size: &str) -> bool {
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(dir)
        .output()
        .is_ok_and(|output| output.status.success());
    if !mounted {
        eprintln!("skipped: cannot mount a {size} tmpfs on {} (needs root)", dir.display());
    }
    mounted
}
