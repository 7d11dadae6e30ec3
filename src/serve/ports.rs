//! Telling a port that another live server holds from one that only a dead
//! or stopped server's sockets still occupy.
//!
//! glommio binds with `SO_REUSEPORT`, so a second server on a busy port would
//! silently share it: start-up first probes each address with a plain bind
//! (`SO_REUSEADDR`, no `SO_REUSEPORT`). That bind also fails when the port
//! holds only leftovers: connections of an earlier server in `TIME_WAIT` or
//! `FIN_WAIT` (they inherited its `SO_REUSEPORT`, which glommio's bind does
//! not conflict with), or, right after a `kill -9`, listening sockets that
//! the kernel releases asynchronously because the dead process's io_uring
//! still referenced them. So when the probe fails, [`check_address`] reads
//! the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`):
//!
//! * no listening socket on the port: only leftovers; start (and say so);
//! * a listening socket some live process holds (found by its inode under
//!   `/proc/<pid>/fd`): refuse, naming the process;
//! * listening sockets no live process holds: a killed server's; wait for
//!   the kernel to release them, up to [`ADDRESS_WAIT_MS_MAX`], saying so.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::runtime::log;
use crate::serve::ServeError;

/// How long start-up waits for a listening socket that no live process owns
/// (a killed server's, which the kernel releases asynchronously), in ms.
pub(super) const ADDRESS_WAIT_MS_MAX: u64 = 10_000;
/// TCP state `LISTEN` in `/proc/net/tcp`.
const STATE_LISTEN: &str = "0A";
/// How often a wait for released sockets looks again.
const ADDRESS_POLL: Duration = Duration::from_millis(20);

/// What the kernel's tables say about a port whose probe bind failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortHolder {
    /// No listening socket: connections of an earlier server only.
    Leftovers,
    /// A live process listens on it.
    Live { pid: u32 },
    /// Listening sockets that no live process holds.
    Orphaned,
}

/// Makes sure `address` can be bound for `name`: returns once it can, or
/// refuses when a live process holds it (or orphaned listeners outlast the
/// wait).
pub fn check_address(name: &'static str, address: SocketAddr) -> Result<(), ServeError> {
    let mut waiting_since = None;
    let result = wait_for_address(name, address, &mut waiting_since);
    if let (Ok(()), Some(since)) = (&result, waiting_since) {
        log::info!("{name} {address}: free after {} ms", since.elapsed().as_millis());
    }
    result
}

fn wait_for_address(
    name: &'static str,
    address: SocketAddr,
    waiting_since: &mut Option<Instant>,
) -> Result<(), ServeError> {
    let deadline = Instant::now() + Duration::from_millis(ADDRESS_WAIT_MS_MAX);
    loop {
        let error = match std::net::TcpListener::bind(address) {
            Ok(_) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => error,
            Err(error) => return Err(ServeError::Bind { name, address, error }),
        };
        match port_holder(address) {
            PortHolder::Leftovers => {
                log::info!(
                    "{name} {address}: only connections of an earlier server remain ({error}); \
                     binding past them with SO_REUSEPORT"
                );
                return Ok(());
            }
            PortHolder::Live { pid } => return Err(ServeError::AddressInUse { name, address, pid: Some(pid) }),
            PortHolder::Orphaned if Instant::now() >= deadline => {
                return Err(ServeError::AddressInUse { name, address, pid: None });
            }
            PortHolder::Orphaned => {
                if waiting_since.is_none() {
                    log::info!(
                        "{name} {address}: listening sockets no live process holds (a killed server's, \
                         released by the kernel asynchronously); waiting up to {ADDRESS_WAIT_MS_MAX} ms"
                    );
                    *waiting_since = Some(Instant::now());
                }
                std::thread::sleep(ADDRESS_POLL);
            }
        }
    }
}

/// Who holds the listening sockets on `address`'s port, from `/proc`.
fn port_holder(address: SocketAddr) -> PortHolder {
    let mut inodes = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        // A missing table (no IPv6) has no sockets.
        let text = std::fs::read_to_string(table).unwrap_or_default();
        inodes.extend(listening_inodes(&text, address));
    }
    if inodes.is_empty() {
        return PortHolder::Leftovers;
    }
    match owner_of(&inodes) {
        Some(pid) => PortHolder::Live { pid },
        None => PortHolder::Orphaned,
    }
}

/// Inodes of the `LISTEN` sockets in a `/proc/net/tcp{,6}` table whose
/// local address conflicts with `address`: the same port, and the same IP
/// or a wildcard on either side.
pub fn listening_inodes(table: &str, address: SocketAddr) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (fields.get(1)?, fields.get(3)?, fields.get(9)?);
            let (ip, port) = parse_local_address(local)?;
            let conflicts =
                port == address.port() && (ip == address.ip() || ip.is_unspecified() || address.ip().is_unspecified());
            (*state == STATE_LISTEN && conflicts).then(|| inode.parse().ok()).flatten()
        })
        .collect()
}

/// `0100007F:24B8` (IPv4) or 32 hex digits and a port (IPv6): the kernel
/// prints each 32-bit word of the address in host (little-endian) order.
fn parse_local_address(text: &str) -> Option<(IpAddr, u16)> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..ip.len() / 8)
        .map(|index| u32::from_str_radix(&ip[index * 8..index * 8 + 8], 16).map(u32::swap_bytes))
        .collect::<Result<_, _>>()
        .ok()?;
    let ip = match words.as_slice() {
        [word] => IpAddr::from(word.to_be_bytes()),
        [a, b, c, d] => {
            let mut bytes = [0u8; 16];
            for (chunk, word) in bytes.chunks_mut(4).zip([a, b, c, d]) {
                chunk.copy_from_slice(&word.to_be_bytes());
            }
            let ip = std::net::Ipv6Addr::from(bytes);
            ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4)
        }
        _ => return None,
    };
    Some((ip, port))
}

/// A live process with a file descriptor on one of `inodes`, if any
/// (processes whose `/proc/<pid>/fd` we cannot read are not seen).
fn owner_of(inodes: &HashSet<u64>) -> Option<u32> {
    let processes = std::fs::read_dir("/proc").ok()?;
    processes.flatten().find_map(|process| {
        let pid: u32 = process.file_name().to_str()?.parse().ok()?;
        let fds = std::fs::read_dir(process.path().join("fd")).ok()?;
        fds.flatten().find_map(|fd| {
            let target = std::fs::read_link(fd.path()).ok()?;
            let inode = target.to_str()?.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()?;
            inodes.contains(&inode).then_some(pid)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:24B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0 100 0 0 10 0
   1: 0100007F:24B8 0100007F:9C40 06 00000000:00000000 03:00000F9E 00000000     0        0 0 3 0
   2: 00000000:24B9 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2222 1 0 100 0 0 10 0
";

    /// Only LISTEN sockets on the port count (TIME_WAIT does not), and a
    /// wildcard listener conflicts with a specific address and vice versa.
    #[test]
    fn listening_sockets_are_found_by_port_and_address() {
        let loopback = |port| SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(listening_inodes(TABLE, loopback(9400)), [1111]);
        assert_eq!(listening_inodes(TABLE, loopback(9401)), [2222], "0.0.0.0 holds every address");
        assert_eq!(listening_inodes(TABLE, SocketAddr::from(([0, 0, 0, 0], 9400))), [1111]);
        assert!(listening_inodes(TABLE, SocketAddr::from(([10, 0, 0, 1], 9400))).is_empty());
        assert!(listening_inodes(TABLE, loopback(9402)).is_empty());
    }

    /// Addresses parse from both tables' formats.
    #[test]
    fn local_addresses_parse() {
        assert_eq!(parse_local_address("0100007F:24B8"), Some((IpAddr::from([127, 0, 0, 1]), 9400)));
        let v6_loopback = "00000000000000000000000001000000:1F90";
        assert_eq!(parse_local_address(v6_loopback), Some(("::1".parse().unwrap(), 8080)));
        let v4_mapped = "0000000000000000FFFF00000100007F:1F90";
        assert_eq!(parse_local_address(v4_mapped), Some((IpAddr::from([127, 0, 0, 1]), 8080)));
        assert_eq!(parse_local_address("zz:1"), None);
    }

    /// A socket this process listens on is found with this process as owner.
    #[test]
    fn a_live_listener_is_found_with_its_process() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        assert_eq!(port_holder(address), PortHolder::Live { pid: std::process::id() });
        drop(listener);
        assert_eq!(port_holder(address), PortHolder::Leftovers);
    }
}
