//! The command-line clients: `spate pub`, `spate sub`, `spate stream` and
//! `spate aggregate`, each a plain client of a running server's ports
//! (ingest, subscribe, admin), as any other program would be.

pub mod aggregate;
pub mod publish;
pub mod stream;
pub mod sub;

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// How long `spate pub` and `spate sub` wait for one address to answer
/// before they try the next.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects to the first of `servers` (comma-separated `HOST:PORT`s, any
/// nodes of a cluster: each serves every stream) that answers, in order;
/// the address used. The error names every address tried and why it
/// failed.
pub fn connect_any(servers: &str) -> Result<(TcpStream, String), (String, std::io::Error)> {
    let mut failures = Vec::new();
    let mut last_error = None;
    for server in servers.split(',').map(str::trim).filter(|server| !server.is_empty()) {
        let addresses = match server.to_socket_addrs() {
            Ok(addresses) => addresses.collect::<Vec<_>>(),
            Err(error) => {
                failures.push(format!("{server} ({error})"));
                last_error = Some(error);
                continue;
            }
        };
        for address in addresses {
            match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
                Ok(stream) => return Ok((stream, server.to_string())),
                Err(error) => {
                    failures.push(format!("{server} ({error})"));
                    last_error = Some(error);
                }
            }
        }
    }
    let error = last_error.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address"));
    if failures.len() <= 1 {
        return Err((servers.to_string(), error));
    }
    let tried = failures.join(", ");
    Err((servers.to_string(), std::io::Error::new(error.kind(), format!("none answered: {tried}"))))
}
