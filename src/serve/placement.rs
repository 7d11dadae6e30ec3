//! Which CPUs a node's shards run on (`--cpus`).
//!
//! A shard pinned to a CPU keeps its caches warm and never migrates; that
//! is right for one node per machine, and wrong for several nodes on one
//! machine (a laptop cluster, the cluster tests), which would all pin shard
//! 0 to the same CPU and leave the others idle. So:
//!
//! - `--cpus auto` (default): pinned, spread over the CPUs this process may
//!   run on (its affinity mask: `taskset -c 2,3 spate serve` pins to 2 and
//!   3), unless there are more shards than those CPUs, or another `spate
//!   serve` already runs on this machine; then unpinned, left to the
//!   kernel's scheduler, which spreads the nodes' threads by itself. The
//!   banner says which and why.
//! - `--cpus none`: unpinned.
//! - `--cpus 0-3,6`: pinned to exactly these CPUs (one shard per CPU; the
//!   shard count defaults to the list's length). Give each node on a
//!   machine its own list to pin them all.

use glommio::{CpuSet, PoolPlacement};

use crate::config::{Config, Cpus};
use crate::serve::ServeError;

/// How the shards are placed, and the banner's words for it.
pub struct ShardPlacement {
    pub placement: PoolPlacement,
    pub description: String,
}

/// Decides where `shard_count` shards run (see the module doc).
pub fn decide(config: &Config, shard_count: usize) -> Result<ShardPlacement, ServeError> {
    let allowed = allowed_cpus();
    let unpinned = |why: String| ShardPlacement {
        placement: PoolPlacement::Unbound(shard_count),
        description: format!("unpinned: {why}"),
    };
    match &config.cpus {
        Cpus::None => Ok(unpinned("--cpus none".to_string())),
        Cpus::List(cpus) => {
            if let Some(&cpu) = cpus.iter().find(|cpu| !allowed.contains(cpu)) {
                return Err(ServeError::CpuNotAllowed { cpu, allowed });
            }
            Ok(pinned_to(shard_count, cpus, format!("pinned to --cpus {}", config.cpus)))
        }
        Cpus::Auto if shard_count > allowed.len() => {
            Ok(unpinned(format!("{shard_count} shards, {} CPUs to run on", allowed.len())))
        }
        Cpus::Auto => match other_server() {
            Some(pid) => Ok(unpinned(format!(
                "another spate server (pid {pid}) runs on this machine and pinning both would stack their \
                 shards on the same CPUs; give each node its own --cpus to pin them"
            ))),
            None => Ok(pinned_to(shard_count, &allowed, "pinned".to_string())),
        },
    }
}

/// Spread over `cpus` (glommio's MaxSpread within that set).
fn pinned_to(shard_count: usize, cpus: &[usize], description: String) -> ShardPlacement {
    let set = CpuSet::online().ok().map(|online| online.filter(|location| cpus.contains(&location.cpu)));
    ShardPlacement { placement: PoolPlacement::MaxSpread(shard_count, set), description }
}

/// The CPUs this process may run on (its affinity mask), in order.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, sched_getaffinity
    // writes at most its size into it, and CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            let count = std::thread::available_parallelism().map_or(1, |count| count.get());
            return (0..count).collect();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|cpu| libc::CPU_ISSET(*cpu, &set)).collect()
    }
}

/// The pid of another `spate serve` process on this machine, if any (from
/// `/proc/<pid>/cmdline`; processes we may not read are not seen).
fn other_server() -> Option<u32> {
    let own = std::process::id();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|process| {
        let pid: u32 = process.file_name().to_str()?.parse().ok()?;
        if pid == own {
            return None;
        }
        let cmdline = std::fs::read(process.path().join("cmdline")).ok()?;
        is_spate_serve(&cmdline).then_some(pid)
    })
}

/// Whether a NUL-separated command line runs `spate serve`.
fn is_spate_serve(cmdline: &[u8]) -> bool {
    let mut args = cmdline.split(|byte| *byte == 0);
    let program = args.next().unwrap_or_default();
    let name = program.rsplit(|byte| *byte == b'/').next().unwrap_or_default();
    name == b"spate" && args.next() == Some(b"serve")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `spate serve` is recognized by its program name and subcommand,
    /// wherever the binary lives; other commands are not.
    #[test]
    fn spate_servers_are_recognized_by_their_command_line() {
        assert!(is_spate_serve(b"/usr/local/bin/spate\0serve\0--shards\x002\0"));
        assert!(is_spate_serve(b"spate\0serve\0"));
        assert!(!is_spate_serve(b"spate\0bench\0"));
        assert!(!is_spate_serve(b"/usr/bin/spate-helper\0serve\0"));
        assert!(!is_spate_serve(b"vim\0spate\0serve\0"));
        assert!(!is_spate_serve(b""));
    }

    /// This process may run on at least one CPU, and they are listed once each.
    #[test]
    fn allowed_cpus_are_listed() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|pair| pair[0] < pair[1]));
    }
}
