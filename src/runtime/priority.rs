//! The scheduling priority of the server's own threads.
//!
//! The admin thread answers HTTP (aggregate queries, `/stats`, stream
//! changes) and uses next to no CPU, while under load the shards keep every
//! core busy. The kernel then makes a woken admin thread wait for a core:
//! on the 2-core test box a reply that a shard had ready waited 1 - 2 ms
//! (p99) for the admin thread to run and write it. A lower nice value
//! (`--control-nice`, default -10) gives that thread a larger share of
//! weight, so a wake-up runs at once, and costs nothing while it sleeps.
//! Lowering a nice value needs `CAP_SYS_NICE` (root has it) or an
//! `RLIMIT_NICE` that allows it; without either the thread stays at the
//! process's priority and the server says so once.

use std::io;

/// Sets the calling thread's nice value (Linux keeps one per thread:
/// `setpriority(PRIO_PROCESS, tid)` changes that thread alone).
pub fn set_current_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid and setpriority take no pointers.
    let tid = unsafe { libc::gettid() };
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current_nice() -> i32 {
        // SAFETY: as above. getpriority returns the nice value (which may be
        // -1, so errno is the only error signal; these calls do not fail).
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn a_thread_changes_its_own_nice_value_and_no_other() {
        let before = current_nice();
        let raised = std::thread::spawn(|| {
            // Raising the value (lower priority) needs no privilege.
            set_current_thread_nice(current_nice() + 1).map(|()| current_nice())
        })
        .join()
        .unwrap();
        assert_eq!(raised.unwrap(), before + 1);
        assert_eq!(current_nice(), before, "another thread's value must not move");
    }
}
