//! CPU time of processes, from `/proc`: the server's (any server, spate or a
//! peer such as nats-server, started by the bench or not) and the bench's own.
//!
//! The server's CPU is `utime + stime` of `/proc/<pid>/stat`, every thread
//! included, read before and after a measured interval. For a server the
//! bench did not start, the pid comes from `--server-pid` or, failing that,
//! from the owner of the listening socket of the target address
//! ([`listener_pid`]): `/proc/net/tcp{,6}` names the socket's inode and one
//! process has that inode among its `/proc/<pid>/fd` links. Both need the
//! bench to run as the server's user (or root); when neither works the report
//! says the server's CPU was not measured rather than guessing.

use std::net::{SocketAddr, ToSocketAddrs};

/// Most `/proc/<pid>` directories scanned for a listener (a bound on the
/// work, far above the processes of a benchmark machine).
const PROCESS_SCAN_MAX: usize = 100_000;
/// `st` of a listening socket in `/proc/net/tcp`.
const TCP_LISTEN_STATE: &str = "0A";

/// CPU seconds (user + system, every thread) process `pid` has used so far.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu_ticks(&stat).and_then(ticks_to_seconds)
}

/// `utime + stime` in clock ticks from a `/proc/<pid>/stat` line.
pub fn parse_stat_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name is parenthesised and may hold spaces or parentheses:
    // fields are counted after the last ')'. utime and stime are fields 14
    // and 15 of the whole line, 12 and 13 after the name.
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn ticks_to_seconds(ticks: u64) -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_s > 0).then(|| ticks as f64 / ticks_per_s as f64)
}

/// User plus system CPU seconds of this process (every thread).
pub fn own_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage struct, which we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The pid of the process listening on `addr` (a loopback or local TCP
/// address), if `/proc` tells.
pub fn listener_pid(addr: &str) -> Option<u32> {
    let addr: SocketAddr = addr.to_socket_addrs().ok()?.next()?;
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            inodes.extend(listening_inodes(&text, addr.port()));
        }
    }
    if inodes.is_empty() {
        return None;
    }
    let own_pid = std::process::id();
    for entry in std::fs::read_dir("/proc").ok()?.flatten().take(PROCESS_SCAN_MAX) {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        if pid == own_pid {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else { continue };
            let link = link.to_string_lossy();
            let inode = link.strip_prefix("socket:[").and_then(|rest| rest.strip_suffix(']'));
            if inode.is_some_and(|inode| inodes.iter().any(|listening| listening == inode)) {
                return Some(pid);
            }
        }
    }
    None
}

/// Inodes of the sockets listening on `port` in a `/proc/net/tcp` table
/// (`sl local_address rem_address st ... uid timeout inode`, addresses as
/// `HEXIP:HEXPORT`). Any local address matches: a server bound to 0.0.0.0
/// serves loopback too.
pub fn listening_inodes(table: &str, port: u16) -> Vec<String> {
    let port_hex = format!("{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields.get(1)?.rsplit(':').next()?;
            let listening = *fields.get(3)? == TCP_LISTEN_STATE;
            (listening && local_port.eq_ignore_ascii_case(&port_hex))
                .then(|| fields.get(9).map(|inode| inode.to_string()))?
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// utime and stime are read after the command name, spaces and all.
    #[test]
    fn stat_ticks_skip_odd_command_names() {
        let stat = "4242 (nats server) (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1000 0 0";
        assert_eq!(parse_stat_cpu_ticks(stat), Some(325));
        assert_eq!(parse_stat_cpu_ticks("4242 (short) S 1"), None);
    }

    /// Only listening sockets on the asked port are picked.
    #[test]
    fn listening_inodes_match_port_and_state() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:24C8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0 100 0 0 10 0
   1: 0100007F:24C8 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0 20 4 30 10 -1
   2: 00000000:1092 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3333 1 0 100 0 0 10 0";
        assert_eq!(listening_inodes(table, 9416), ["1111"]);
        assert_eq!(listening_inodes(table, 4242), ["3333"]);
        assert!(listening_inodes(table, 1).is_empty());
    }

    /// The bench's own sockets are never taken for the server's, and the
    /// bench can read its own CPU time.
    #[test]
    fn own_process_is_never_reported() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        assert_eq!(listener_pid(&addr), None, "the bench's own sockets are not a server");
        assert!(process_cpu_seconds(std::process::id()).is_some());
    }
}
