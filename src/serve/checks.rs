//! Checks before any shard starts, each failing with what to fix: locked
//! memory, io_uring, and addresses another process holds.

use glommio::{LocalExecutorBuilder, Placement};

use crate::config::{Config, WalBypass};
use crate::runtime::log;
use crate::serve::ServeError;

/// Least locked memory glommio needs per executor.
const MEMLOCK_BYTES_MIN: u64 = 512 * 1024;

/// Why the machine cannot run spate, and how to fix it.
#[derive(Debug)]
pub enum EnvironmentError {
    /// `RLIMIT_MEMLOCK` is below what glommio needs.
    Memlock { limit_bytes: u64, needed_bytes: u64 },
    /// An executor (an io_uring instance) could not be created.
    IoUring { error: String },
    /// `RLIMIT_NOFILE` could not be read.
    FdLimit { error: std::io::Error },
    /// What start-up allocates at once does not fit in the machine's RAM.
    EagerMemory { eager: EagerMemory, physical_bytes: u64 },
}

/// The memory a server allocates (and touches) at start, whatever its load:
/// glommio's registered buffers, the prefaulted log segments and the mesh
/// rings, each sized by flags. A configuration where these alone pass the
/// machine's RAM cannot start; it would die in an allocation instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EagerMemory {
    /// shards * --io-memory-bytes.
    pub io_memory_bytes: u64,
    /// shards * --log-prefault-bytes.
    pub log_prefault_bytes: u64,
    /// The mesh term of the memory formula (--credit-window-batches and
    /// --subscribers-per-shard-max size every ring).
    pub mesh_bytes: u64,
}

impl EagerMemory {
    pub fn of(config: &Config) -> EagerMemory {
        let shards = config.shard_count() as u64;
        EagerMemory {
            io_memory_bytes: shards.saturating_mul(config.io_memory_bytes as u64),
            log_prefault_bytes: shards.saturating_mul(config.log_prefault_bytes as u64),
            mesh_bytes: config.memory_bound().mesh as u64,
        }
    }

    pub fn total_bytes(&self) -> u64 {
        self.io_memory_bytes.saturating_add(self.log_prefault_bytes).saturating_add(self.mesh_bytes)
    }
}

impl std::fmt::Display for EnvironmentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EnvironmentError::Memlock { limit_bytes, needed_bytes } => write!(
                f,
                "locked memory limit is {} KiB; glommio (io_uring) needs at least {} KiB per process.\n\
                 fix: `ulimit -l {}` in this shell (as root, or raise the hard limit in \
                 /etc/security/limits.conf), or LimitMEMLOCK=infinity in the systemd unit",
                limit_bytes / 1024,
                needed_bytes / 1024,
                64 * 1024
            ),
            EnvironmentError::IoUring { error } => write!(
                f,
                "cannot start a glommio executor: {error}\n\
                 spate needs Linux 5.8+ with io_uring enabled and at least 512 KiB of locked memory.\n\
                 fix: check `sysctl kernel.io_uring_disabled` (must be 0), that no seccomp profile \
                 (e.g. a container runtime's) blocks io_uring_setup, and `ulimit -l`"
            ),
            EnvironmentError::FdLimit { error } => write!(f, "cannot read the file descriptor limit: {error}"),
            EnvironmentError::EagerMemory { eager, physical_bytes } => write!(
                f,
                "this configuration allocates {} MiB at start ({} MiB of io_uring buffers: shards x \
                 --io-memory-bytes; {} MiB of log segments: shards x --log-prefault-bytes; {} MiB of mesh \
                 rings: --credit-window-batches), more than this machine's {} MiB of RAM",
                eager.total_bytes() >> 20,
                eager.io_memory_bytes >> 20,
                eager.log_prefault_bytes >> 20,
                eager.mesh_bytes >> 20,
                physical_bytes >> 20
            ),
        }
    }
}

pub fn check_memlock() -> Result<(), ServeError> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) };
    if status == 0 && limit.rlim_cur != libc::RLIM_INFINITY && limit.rlim_cur < MEMLOCK_BYTES_MIN {
        return Err(ServeError::Environment(EnvironmentError::Memlock {
            limit_bytes: limit.rlim_cur,
            needed_bytes: MEMLOCK_BYTES_MIN,
        }));
    }
    Ok(())
}

/// What start-up allocates at once must fit in the machine's RAM (an
/// unknown RAM size skips the check).
pub fn check_eager_memory(config: &Config) -> Result<(), ServeError> {
    // SAFETY: sysconf reads system values and touches no memory of ours.
    let (pages, page_size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let (Ok(pages), Ok(page_size)) = (u64::try_from(pages), u64::try_from(page_size)) else { return Ok(()) };
    let physical_bytes = pages.saturating_mul(page_size);
    let eager = EagerMemory::of(config);
    if physical_bytes > 0 && eager.total_bytes() > physical_bytes {
        return Err(ServeError::Environment(EnvironmentError::EagerMemory { eager, physical_bytes }));
    }
    Ok(())
}

/// Creates (and drops) one executor, so a kernel without io_uring fails here
/// with a message instead of inside a shard thread.
pub fn check_io_uring(config: &Config) -> Result<(), ServeError> {
    let executor = LocalExecutorBuilder::new(Placement::Unbound).io_memory(config.io_memory_bytes).make();
    match executor {
        Ok(_) => Ok(()),
        Err(error) => Err(ServeError::Environment(EnvironmentError::IoUring { error: error.to_string() })),
    }
}

/// Every address must be free, or held only by an earlier server's
/// leftovers ([`crate::serve::ports`]).
pub fn check_addresses(config: &Config) -> Result<(), ServeError> {
    for (flag, address) in config.listeners() {
        crate::serve::ports::check_address(flag.trim_start_matches("--"), address)?;
    }
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and checks that the
/// configuration's file descriptors fit under it; says what it found on
/// stderr.
pub fn check_fd_limit(config: &Config) -> Result<(), ServeError> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass and nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(ServeError::Environment(EnvironmentError::FdLimit { error: std::io::Error::last_os_error() }));
    }
    let soft_before = limit.rlim_cur;
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit
        // up to the hard one is always allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit = raised;
        }
    }
    let budget = config.fd_budget();
    let available = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    if budget.total > available {
        return Err(ServeError::FdBudget { budget, limit: available });
    }
    let raised =
        if soft_before < limit.rlim_cur { format!(" (soft limit raised from {soft_before})") } else { String::new() };
    log::info!("file descriptors: limit {available}{raised}; this configuration needs at most {budget}");
    Ok(())
}

/// With `--wal-bypass on` (under `interval` or `always` on disk), a round
/// may make its segments durable with one `syncfs` of the filesystem that
/// holds `<data-dir>/streams`, and under `always` the checkpoint's
/// fdatasync of the log then flushes the device's cache: both hold only
/// when every stream and partition directory, and the log, are on that one
/// filesystem. A directory symlinked to another turns the bypass off for
/// this run, with a warning naming it (every round then writes the log).
/// Streams created later are created inside `streams/`.
pub fn check_one_filesystem(config: &mut Config) {
    use std::os::unix::fs::MetadataExt;
    let policy_syncs = config.fsync != crate::config::FsyncPolicy::Never;
    if config.storage != crate::config::Storage::Disk || !policy_syncs || config.wal_bypass != WalBypass::On {
        return;
    }
    let streams = config.data_dir.join("streams");
    let device = |path: &std::path::Path| std::fs::metadata(path).ok().map(|metadata| metadata.dev());
    let Some(home) = device(&streams).or_else(|| device(&config.data_dir)) else { return };
    let mut paths = vec![config.data_dir.join("wal")];
    for stream in std::fs::read_dir(&streams).into_iter().flatten().flatten() {
        paths.push(stream.path());
        paths.extend(std::fs::read_dir(stream.path()).into_iter().flatten().flatten().map(|entry| entry.path()));
    }
    let elsewhere = paths.into_iter().find(|path| device(path).is_some_and(|dev| dev != home));
    if let Some(path) = elsewhere {
        log::warn!(
            "--wal-bypass on: {} is on another filesystem than {}; a syncfs of one does not make the other \
             durable, so this run writes every commit round to the write-ahead log (as --wal-bypass off)",
            path.display(),
            streams.display()
        );
        config.wal_bypass = WalBypass::Off;
    }
}

/// Applies `--huge-pages` before any shard starts, and says on stderr what
/// the process got. `off` (the default) sets PR_SET_THP_DISABLE, so no
/// later fault maps a 2 MiB page: on the VM spate is measured on, a fresh
/// huge page held the thread that touched it for milliseconds (README,
/// "Transparent huge pages"). `on` leaves them to the kernel's mode,
/// `/sys/kernel/mm/transparent_hugepage/enabled`, and warns when they are
/// off anyway: the kernel's `never`, or `MIMALLOC_ALLOW_THP=0` (or a
/// parent's prctl), which turns them off for the whole process
/// (`THP_enabled: 0` in its status). Disk writes from 4 KiB pages ran at
/// 0.46 – 0.74x of the same writes from 2 MiB pages on a virtio disk
/// (`scripts/bench-disk-pages`).
pub fn set_huge_pages(config: &Config) {
    if config.huge_pages == crate::config::HugePages::Off {
        // SAFETY: prctl with PR_SET_THP_DISABLE reads its integer
        // arguments only; it sets a flag on this process's memory map.
        if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } == 0 {
            log::info!("transparent huge pages: off for this process (--huge-pages on lets the kernel use them)");
        } else {
            let error = std::io::Error::last_os_error();
            log::warn!(
                "--huge-pages off: could not turn transparent huge pages off ({error}); the kernel's mode applies"
            );
        }
        return;
    }
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .ok()
        .and_then(|modes| Some(modes.split('[').nth(1)?.split(']').next()?.to_string()));
    let process_off = std::fs::read_to_string("/proc/self/status")
        .is_ok_and(|status| status.lines().any(|line| line.split_whitespace().eq(["THP_enabled:", "0"])));
    match (mode.as_deref(), process_off) {
        (Some("never"), _) | (_, true) => log::warn!(
            "--huge-pages on, but transparent huge pages are off ({}): disk writes go out from 4 KiB pages, \
             which a virtio disk wrote at 0.46 - 0.74x the rate of 2 MiB pages (scripts/bench-disk-pages \
             measures this disk); `madvise` in /sys/kernel/mm/transparent_hugepage/enabled and no \
             MIMALLOC_ALLOW_THP=0 turn them on",
            if process_off { "MIMALLOC_ALLOW_THP=0 or prctl" } else { "kernel mode never" }
        ),
        (Some(mode), false) => {
            log::info!("transparent huge pages: {mode} (--huge-pages on: memory and disk write buffers may use them)")
        }
        (None, false) => {}
    }
}
