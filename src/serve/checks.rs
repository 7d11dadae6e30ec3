//! Checks before any shard starts, each failing with what to fix: locked
//! memory, io_uring, and addresses another process holds.

use glommio::{LocalExecutorBuilder, Placement};

use crate::config::Config;
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
    let addresses = [
        ("ingest", Some(config.ingest)),
        ("ingest-json", config.ingest_json.0),
        ("ingest-ilp", config.ingest_ilp.0),
        ("subscribe", Some(config.subscribe)),
        ("admin", Some(config.admin)),
    ];
    for (name, address) in addresses {
        if let Some(address) = address {
            crate::serve::ports::check_address(name, address)?;
        }
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
    eprintln!("spate: file descriptors: limit {available}{raised}; this configuration needs at most {budget}");
    Ok(())
}
