//! Which on-disk layout should spate's durable log use?
//!
//! One segment file per partition (cheap migration and replay, but a group
//! commit must fdatasync many files) or one write-ahead file per shard with
//! per-partition indexes (one fdatasync per group commit)? This measures the
//! disk under both, with glommio DMA files (O_DIRECT through io_uring) and,
//! for comparison, buffered `std::fs` writes:
//!
//! 1. `dd oflag=direct` as the reference, then raw sequential bandwidth;
//! 2. fdatasync latency after a 4 KiB write, on a growing, a fallocated and a
//!    pre-zeroed file;
//! 3. group commit: K partition files each getting B bytes, the K writes then
//!    the K fdatasyncs issued concurrently, against the same bytes appended to
//!    one file with one fdatasync;
//! 4. rewriting the partial last block of each commit against padding each
//!    commit to the block boundary;
//! 5. the group commit again on fallocated and pre-zeroed files.
//!
//! Run: `cargo bench --bench disk_layout -- [DIR ...]` (default: the system
//! temp dir). Each DIR is measured in turn; a run takes about 40 s per DIR.
//! Files are created under `DIR/spate-disk-layout-<pid>` and removed after.

use std::error::Error;
use std::fs;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};
use glommio::{LocalExecutorBuilder, Placement, Task};
use hdrhistogram::Histogram;

type BenchResult<T> = Result<T, Box<dyn Error>>;

/// The O_DIRECT block every write is aligned to.
const BLOCK_SIZE: usize = 4096;
/// Bytes written by the sequential bandwidth runs.
const SEQUENTIAL_BYTES: u64 = 1 << 30;
/// Size of one sequential write.
const SEQUENTIAL_WRITE_SIZE: usize = 1 << 20;
/// Sequential DMA writes in flight at once.
const SEQUENTIAL_DEPTH: usize = 8;
/// Upper bound on iterations of one latency or commit run.
const ITERATIONS_MAX: u64 = 20_000;
/// Time budget of one latency run.
const LATENCY_RUN: Duration = Duration::from_millis(1000);
/// Time budget of one group-commit or partial-block run.
const COMMIT_RUN: Duration = Duration::from_millis(700);
/// Size of a prepared (fallocated or zero-filled) single file; a run stops
/// before it writes past it.
const PREPARED_FILE_BYTES: u64 = 256 << 20;
/// Size of each prepared partition file in the group-commit runs (64 of them
/// are zero-filled, so this costs 64 times its size in setup writes).
const PREPARED_PARTITION_BYTES: u64 = 4 << 20;

fn main() -> BenchResult<()> {
    let mut dirs: Vec<PathBuf> =
        std::env::args().skip(1).filter(|arg| !arg.starts_with("--")).map(PathBuf::from).collect();
    if dirs.is_empty() {
        dirs.push(std::env::temp_dir());
    }
    println!("# spate disk layout benchmark");
    println!(
        "command: cargo bench --bench disk_layout -- {}",
        dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" ")
    );
    println!("kernel: {}", fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim());
    for dir in dirs {
        let work = dir.join(format!("spate-disk-layout-{}", std::process::id()));
        fs::create_dir_all(&work)?;
        let outcome = run_dir(&work);
        fs::remove_dir_all(&work)?;
        outcome?;
    }
    Ok(())
}

fn run_dir(work: &Path) -> BenchResult<()> {
    println!("\n## {} ({})", work.display(), filesystem_of(work));
    dd_reference(work);
    buffered_sequential(work)?;
    let work = work.to_path_buf();
    // 1 MiB of registered buffers stays under this box's 8 MiB memlock limit;
    // larger buffers come from the heap, aligned.
    let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(1 << 20).make()?;
    executor.run(async move { run_dma(&work).await })
}

async fn run_dma(work: &Path) -> BenchResult<()> {
    // Without this, glommio's poll-ring probe runs on the first (empty)
    // file and sends every DMA read and write to the I/O-poll ring.
    spate::storage::segment::prime_dma_probe(work).await?;
    dma_sequential(work).await?;
    println!("\n### fdatasync after one 4 KiB append (µs)");
    println!("{:<28} {:>7} {:>7} {:>7} {:>7} {:>8}", "file", "p50", "p99", "max", "write50", "syncs/s");
    for kind in [FileKind::Growing, FileKind::Fallocated, FileKind::Zeroed] {
        fsync_latency_dma(work, kind).await?;
    }
    fsync_latency_buffered(work)?;
    group_commit_table(work).await?;
    partial_block_table(work).await?;
    preallocation_table(work).await
}

/// How a file is prepared before a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileKind {
    /// Empty; every append grows it (a metadata change per fdatasync).
    Growing,
    /// `fallocate` to its final size: blocks reserved but unwritten, so a
    /// write still converts extents (metadata) before fdatasync returns.
    Fallocated,
    /// Written with zeros and synced beforehand: appends are overwrites.
    Zeroed,
}

fn filesystem_of(path: &Path) -> String {
    let output = Command::new("findmnt").args(["-no", "FSTYPE,SOURCE", "-T"]).arg(path).output();
    let mount = output.map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
    let device = mount.split_whitespace().nth(1).and_then(|source| source.strip_prefix("/dev/"));
    let queue = |name: &str| {
        let path = format!("/sys/block/{}/queue/{name}", device.unwrap_or("none"));
        fs::read_to_string(path).map(|text| text.trim().to_string()).unwrap_or_else(|_| "?".to_string())
    };
    format!(
        "{mount}; logical block {}, physical block {}, write cache {}",
        queue("logical_block_size"),
        queue("physical_block_size"),
        queue("write_cache")
    )
}

fn dd_reference(work: &Path) {
    let target = work.join("dd.bin");
    let output = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", target.display()))
        .args(["bs=1M", "count=2000", "oflag=direct"])
        .output();
    let line = match output {
        Ok(output) => String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or("").to_string(),
        Err(error) => format!("dd failed: {error}"),
    };
    println!("reference: dd if=/dev/zero of=F bs=1M count=2000 oflag=direct: {line}");
    let _ = fs::remove_file(target);
}

fn buffered_sequential(work: &Path) -> BenchResult<()> {
    let path = work.join("buffered-seq.bin");
    let mut file = fs::File::create(&path)?;
    let chunk = vec![0x5au8; SEQUENTIAL_WRITE_SIZE];
    let start = Instant::now();
    for _ in 0..SEQUENTIAL_BYTES / SEQUENTIAL_WRITE_SIZE as u64 {
        file.write_all(&chunk)?;
    }
    file.sync_data()?;
    let elapsed = start.elapsed();
    println!(
        "sequential, std::fs buffered write 1 MiB + one fdatasync at the end: {:.0} MB/s ({} MiB in {:.2} s)",
        mb_per_s(SEQUENTIAL_BYTES, elapsed),
        SEQUENTIAL_BYTES >> 20,
        elapsed.as_secs_f64()
    );
    fs::remove_file(path)?;
    Ok(())
}

async fn dma_sequential(work: &Path) -> BenchResult<()> {
    let path = work.join("dma-seq.bin");
    let file = Rc::new(OpenOptions::new().write(true).create(true).truncate(true).dma_open(&path).await?);
    let buffer = Rc::new(filled_buffer(&file, SEQUENTIAL_WRITE_SIZE, 0x5a));
    let start = Instant::now();
    let mut position = 0u64;
    while position < SEQUENTIAL_BYTES {
        let mut writes = Vec::with_capacity(SEQUENTIAL_DEPTH);
        for _ in 0..SEQUENTIAL_DEPTH {
            let (file, buffer) = (file.clone(), buffer.clone());
            writes.push(glommio::spawn_local(async move { file.write_rc_at(buffer, position).await }));
            position += SEQUENTIAL_WRITE_SIZE as u64;
        }
        for size in join_all(writes).await {
            assert_eq!(size?, SEQUENTIAL_WRITE_SIZE);
        }
    }
    file.fdatasync().await?;
    let elapsed = start.elapsed();
    println!(
        "sequential, DMA write 1 MiB x {SEQUENTIAL_DEPTH} in flight + one fdatasync: {:.0} MB/s ({} MiB in {:.2} s, alignment {})",
        mb_per_s(position, elapsed),
        position >> 20,
        elapsed.as_secs_f64(),
        file.alignment()
    );
    close_and_remove(file, &path).await
}

fn filled_buffer(file: &DmaFile, size: usize, byte: u8) -> DmaBuffer {
    let mut buffer = file.alloc_dma_buffer(size);
    buffer.as_bytes_mut().fill(byte);
    buffer
}

async fn join_all<T: 'static>(tasks: Vec<Task<T>>) -> Vec<T> {
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await);
    }
    results
}

async fn close_and_remove(file: Rc<DmaFile>, path: &Path) -> BenchResult<()> {
    if let Ok(file) = Rc::try_unwrap(file) {
        file.close().await?;
    }
    fs::remove_file(path)?;
    Ok(())
}

/// Opens a DMA file for writing, prepared as `kind` says.
async fn prepared_dma_file(path: &Path, kind: FileKind, prepared_bytes: u64) -> BenchResult<DmaFile> {
    let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).dma_open(path).await?;
    match kind {
        FileKind::Growing => {}
        FileKind::Fallocated => file.pre_allocate(prepared_bytes, false).await?,
        FileKind::Zeroed => {
            let zeros = Rc::new(filled_buffer(&file, SEQUENTIAL_WRITE_SIZE, 0));
            let mut position = 0;
            while position < prepared_bytes {
                file.write_rc_at(zeros.clone(), position).await?;
                position += SEQUENTIAL_WRITE_SIZE as u64;
            }
        }
    }
    file.fdatasync().await?;
    Ok(file)
}

async fn fsync_latency_dma(work: &Path, kind: FileKind) -> BenchResult<()> {
    let path = work.join("fsync-latency.bin");
    let file = Rc::new(prepared_dma_file(&path, kind, PREPARED_FILE_BYTES).await?);
    let buffer = Rc::new(filled_buffer(&file, BLOCK_SIZE, 0x5a));
    let (mut sync_us, mut write_us) = (histogram(), histogram());
    let start = Instant::now();
    let mut position = 0u64;
    while start.elapsed() < LATENCY_RUN && position / (BLOCK_SIZE as u64) < ITERATIONS_MAX {
        let write_start = Instant::now();
        file.write_rc_at(buffer.clone(), position).await?;
        let sync_start = Instant::now();
        file.fdatasync().await?;
        write_us.record(micros(sync_start - write_start))?;
        sync_us.record(micros(sync_start.elapsed()))?;
        position += BLOCK_SIZE as u64;
    }
    print_latency_row(&format!("DMA, {kind:?}"), &sync_us, &write_us, start.elapsed());
    close_and_remove(file, &path).await
}

fn fsync_latency_buffered(work: &Path) -> BenchResult<()> {
    let path = work.join("fsync-latency-buffered.bin");
    let file = fs::File::create(&path)?;
    let block = [0x5au8; BLOCK_SIZE];
    let (mut sync_us, mut write_us) = (histogram(), histogram());
    let start = Instant::now();
    let mut position = 0u64;
    while start.elapsed() < LATENCY_RUN && position / (BLOCK_SIZE as u64) < ITERATIONS_MAX {
        let write_start = Instant::now();
        file.write_all_at(&block, position)?;
        let sync_start = Instant::now();
        file.sync_data()?;
        write_us.record(micros(sync_start - write_start))?;
        sync_us.record(micros(sync_start.elapsed()))?;
        position += BLOCK_SIZE as u64;
    }
    print_latency_row("std::fs buffered, Growing", &sync_us, &write_us, start.elapsed());
    fs::remove_file(path)?;
    Ok(())
}

fn print_latency_row(name: &str, sync_us: &Histogram<u64>, write_us: &Histogram<u64>, elapsed: Duration) {
    println!(
        "{name:<28} {:>7} {:>7} {:>7} {:>7} {:>8.0}",
        sync_us.value_at_quantile(0.5),
        sync_us.value_at_quantile(0.99),
        sync_us.max(),
        write_us.value_at_quantile(0.5),
        sync_us.len() as f64 / elapsed.as_secs_f64()
    );
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static histogram bounds are valid")
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64()
}

/// What one group-commit run measured.
struct CommitOutcome {
    commits_per_s: f64,
    mb_per_s: f64,
    p50_us: u64,
    p99_us: u64,
}

async fn group_commit_table(work: &Path) -> BenchResult<()> {
    println!("\n### group commit: K partitions x B bytes per commit, growing files (DMA)");
    println!("per-partition: K files, K writes concurrently, then K fdatasyncs concurrently");
    println!("wal: one file, one write of K*B bytes, one fdatasync");
    print_commit_header();
    for partition_count in [1usize, 8, 64, 128] {
        for commit_bytes in [4096usize, 65536] {
            let files = group_commit_files(work, partition_count, commit_bytes, FileKind::Growing).await?;
            let wal = group_commit_wal(work, partition_count, commit_bytes, FileKind::Growing).await?;
            print_commit_row(&format!("{partition_count:>4} {:>4}K", commit_bytes / 1024), &files, &wal);
        }
    }
    Ok(())
}

async fn preallocation_table(work: &Path) -> BenchResult<()> {
    println!("\n### group commit by file preparation, K = 64, B = 4 KiB (DMA)");
    print_commit_header();
    for kind in [FileKind::Growing, FileKind::Fallocated, FileKind::Zeroed] {
        let files = group_commit_files(work, 64, 4096, kind).await?;
        let wal = group_commit_wal(work, 64, 4096, kind).await?;
        print_commit_row(&format!("{kind:?}"), &files, &wal);
    }
    Ok(())
}

fn print_commit_header() {
    println!(
        "{:<10} | {:>9} {:>7} {:>7} {:>7} | {:>9} {:>7} {:>7} {:>7} | {:>6}",
        "K B", "files c/s", "MB/s", "p50 µs", "p99 µs", "wal c/s", "MB/s", "p50 µs", "p99 µs", "wal/f"
    );
}

fn print_commit_row(name: &str, files: &CommitOutcome, wal: &CommitOutcome) {
    println!(
        "{name:<10} | {:>9.0} {:>7.1} {:>7} {:>7} | {:>9.0} {:>7.1} {:>7} {:>7} | {:>5.2}x",
        files.commits_per_s,
        files.mb_per_s,
        files.p50_us,
        files.p99_us,
        wal.commits_per_s,
        wal.mb_per_s,
        wal.p50_us,
        wal.p99_us,
        wal.commits_per_s / files.commits_per_s
    );
}

async fn group_commit_files(
    work: &Path,
    partition_count: usize,
    commit_bytes: usize,
    kind: FileKind,
) -> BenchResult<CommitOutcome> {
    let mut files = Vec::with_capacity(partition_count);
    for index in 0..partition_count {
        let path = work.join(format!("partition-{index}.log"));
        files.push(Rc::new(prepared_dma_file(&path, kind, PREPARED_PARTITION_BYTES).await?));
    }
    let buffer = Rc::new(filled_buffer(&files[0], commit_bytes, 0x5a));
    let mut latency_us = histogram();
    let start = Instant::now();
    let mut position = 0u64;
    let position_max = if kind == FileKind::Growing { u64::MAX } else { PREPARED_PARTITION_BYTES };
    while start.elapsed() < COMMIT_RUN && latency_us.len() < ITERATIONS_MAX && position < position_max {
        let commit_start = Instant::now();
        let writes = files.iter().map(|file| {
            let (file, buffer) = (file.clone(), buffer.clone());
            glommio::spawn_local(async move { file.write_rc_at(buffer, position).await })
        });
        for size in join_all(writes.collect()).await {
            assert_eq!(size?, commit_bytes);
        }
        let syncs = files.iter().map(|file| {
            let file = file.clone();
            glommio::spawn_local(async move { file.fdatasync().await })
        });
        for synced in join_all(syncs.collect()).await {
            synced?;
        }
        latency_us.record(micros(commit_start.elapsed()))?;
        position += commit_bytes as u64;
    }
    let outcome = commit_outcome(&latency_us, start.elapsed(), partition_count * commit_bytes);
    for (index, file) in files.into_iter().enumerate() {
        close_and_remove(file, &work.join(format!("partition-{index}.log"))).await?;
    }
    Ok(outcome)
}

async fn group_commit_wal(
    work: &Path,
    partition_count: usize,
    commit_bytes: usize,
    kind: FileKind,
) -> BenchResult<CommitOutcome> {
    let path = work.join("wal.log");
    let file = Rc::new(prepared_dma_file(&path, kind, PREPARED_FILE_BYTES).await?);
    let total_bytes = partition_count * commit_bytes;
    let buffer = Rc::new(filled_buffer(&file, total_bytes, 0x5a));
    let mut latency_us = histogram();
    let start = Instant::now();
    let mut position = 0u64;
    let position_max = if kind == FileKind::Growing { u64::MAX } else { PREPARED_FILE_BYTES };
    while start.elapsed() < COMMIT_RUN && latency_us.len() < ITERATIONS_MAX && position < position_max {
        let commit_start = Instant::now();
        assert_eq!(file.write_rc_at(buffer.clone(), position).await?, total_bytes);
        file.fdatasync().await?;
        latency_us.record(micros(commit_start.elapsed()))?;
        position += total_bytes as u64;
    }
    let outcome = commit_outcome(&latency_us, start.elapsed(), total_bytes);
    close_and_remove(file, &path).await?;
    Ok(outcome)
}

fn commit_outcome(latency_us: &Histogram<u64>, elapsed: Duration, bytes_per_commit: usize) -> CommitOutcome {
    let commit_count = latency_us.len();
    CommitOutcome {
        commits_per_s: commit_count as f64 / elapsed.as_secs_f64(),
        mb_per_s: mb_per_s(commit_count * bytes_per_commit as u64, elapsed),
        p50_us: latency_us.value_at_quantile(0.5),
        p99_us: latency_us.value_at_quantile(0.99),
    }
}

/// How an append that does not end on a block boundary is written.
#[derive(Clone, Copy, Debug)]
enum TailMode {
    /// The next commit starts at the partial block and rewrites it.
    Rewrite,
    /// Every commit is padded to the block boundary; nothing is rewritten.
    Pad,
}

async fn partial_block_table(work: &Path) -> BenchResult<()> {
    println!("\n### partial last block: rewrite it next commit vs pad every commit (DMA, one file, growing)");
    println!(
        "{:<8} {:<8} {:>8} {:>7} {:>7} {:>12} {:>14}",
        "commit", "mode", "c/s", "p50 µs", "p99 µs", "file B/c", "written B/c"
    );
    for commit_bytes in [200usize, 1500, 6000] {
        for mode in [TailMode::Rewrite, TailMode::Pad] {
            partial_block_run(work, commit_bytes, mode).await?;
        }
    }
    Ok(())
}

async fn partial_block_run(work: &Path, commit_bytes: usize, mode: TailMode) -> BenchResult<()> {
    let path = work.join("tail.log");
    let file = prepared_dma_file(&path, FileKind::Growing, 0).await?;
    let mut latency_us = histogram();
    let (mut end, mut written) = (0u64, 0u64);
    let block = BLOCK_SIZE as u64;
    let start = Instant::now();
    while start.elapsed() < COMMIT_RUN && latency_us.len() < ITERATIONS_MAX {
        let commit_start = Instant::now();
        let write_start = end / block * block;
        let new_end = end + commit_bytes as u64;
        let write_end = new_end.div_ceil(block) * block;
        let size = usize::try_from(write_end - write_start)?;
        // A real writer keeps the tail block in memory; filling the buffer
        // stands for that copy.
        let buffer = filled_buffer(&file, size, 0x5a);
        assert_eq!(file.write_at(buffer, write_start).await?, size);
        file.fdatasync().await?;
        latency_us.record(micros(commit_start.elapsed()))?;
        written += size as u64;
        end = match mode {
            TailMode::Rewrite => new_end,
            TailMode::Pad => write_end,
        };
    }
    let commits = latency_us.len();
    println!(
        "{:<8} {:<8} {:>8.0} {:>7} {:>7} {:>12} {:>14}",
        commit_bytes,
        format!("{mode:?}"),
        commits as f64 / start.elapsed().as_secs_f64(),
        latency_us.value_at_quantile(0.5),
        latency_us.value_at_quantile(0.99),
        end.div_ceil(block) * block / commits.max(1),
        written / commits.max(1)
    );
    file.close().await?;
    fs::remove_file(path)?;
    Ok(())
}
