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

/// glommio binds with SO_REUSEPORT, so a second server on a busy port would
/// silently share it. Probe each address with a plain bind first.
pub fn check_addresses(config: &Config) -> Result<(), ServeError> {
    let addresses = [("ingest", config.ingest), ("subscribe", config.subscribe), ("admin", config.admin)];
    for (name, address) in addresses {
        if let Err(error) = std::net::TcpListener::bind(address) {
            if error.kind() == std::io::ErrorKind::AddrInUse {
                return Err(ServeError::AddressInUse { name, address });
            }
            return Err(ServeError::Bind { name, address, error });
        }
    }
    Ok(())
}
