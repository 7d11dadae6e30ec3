//! Socket options on accepted connections, and the last words to one being
//! closed: bounded in time, so a peer that does not read cannot hold a file
//! descriptor with them.

use std::cell::Cell;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::time::Duration;

use futures_lite::AsyncWriteExt;
use glommio::net::TcpStream;

use crate::config::REFUSALS_IN_FLIGHT_MAX;
use crate::runtime::notify::{Either, first};

/// How long a last line to a connection being closed (a refusal, a timeout,
/// shedding) may wait for the peer's window before the socket is closed, in ms.
pub const GOODBYE_WRITE_TIMEOUT_MS: u64 = 200;
/// TCP keepalive on accepted sockets, so a peer that vanished (power loss, a
/// cable, a NAT that forgot the flow) is noticed after about
/// `idle + interval * probes` = 2 minutes instead of never: the idle time
/// before the first probe, in seconds.
const KEEPALIVE_IDLE_S: u32 = 60;
/// Seconds between keepalive probes.
const KEEPALIVE_INTERVAL_S: u32 = 10;
/// Unanswered keepalive probes before the connection is dropped.
const KEEPALIVE_PROBES: u32 = 6;

/// A duplicate of a connection's socket, to hand the connection to another
/// shard ([`crate::shard::consolidation`]): the caller's copy closes with
/// its stream. `None` when no descriptor is left to duplicate into.
pub fn duplicate_for_handover(stream: &TcpStream) -> Option<OwnedFd> {
    // SAFETY: the descriptor is the stream's own, open while it lives.
    let borrowed = unsafe { BorrowedFd::borrow_raw(stream.as_raw_fd()) };
    borrowed.try_clone_to_owned().ok()
}

/// The stream of a socket another shard handed over
/// ([`duplicate_for_handover`]).
pub fn adopt_handed_over(fd: OwnedFd) -> TcpStream {
    // SAFETY: a connected TCP socket this process owns, duplicated by the
    // old shard, whose copy is closed: nothing else holds it.
    unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) }
}

/// Sets the options of an accepted socket: TCP keepalive
/// ([`KEEPALIVE_IDLE_S`], [`KEEPALIVE_INTERVAL_S`], [`KEEPALIVE_PROBES`]) and
/// `TCP_NODELAY`. The server already gathers what it writes into few large
/// writes (a subscriber's fetch reply, a chunk's replies), so Nagle's
/// algorithm has nothing left to merge: it only held a write back until the
/// peer acknowledged the previous one, which a receiver in delayed-ACK mode
/// does after milliseconds (it was most of the 8 ms p99 of a 100 k/s
/// subscriber).
pub fn tune_accepted(stream: &TcpStream) -> std::io::Result<()> {
    let fd = stream.as_raw_fd();
    let options = [
        (libc::IPPROTO_TCP, libc::TCP_NODELAY, 1),
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, KEEPALIVE_IDLE_S as libc::c_int),
        (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S as libc::c_int),
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, KEEPALIVE_PROBES as libc::c_int),
    ];
    for (level, name, value) in options {
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from `&value`,
        // which lives across the call; `fd` is the open socket we own.
        let status = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if status != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Bytes that can be written to `stream` now without blocking: its send
/// buffer's size less what is queued in it (`SO_SNDBUF` and `TIOCOUTQ`).
/// `None` if either is unknown.
pub fn send_space(stream: &TcpStream) -> Option<usize> {
    let fd = stream.as_raw_fd();
    let mut size: libc::c_int = 0;
    let mut length = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `length` bytes into `size`.
    let got = unsafe { libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, (&raw mut size).cast(), &mut length) };
    let mut queued: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one c_int.
    let asked = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut queued) };
    if got != 0 || asked != 0 {
        return None;
    }
    // The kernel reports twice the size asked for (half is bookkeeping).
    let usable = usize::try_from(size).ok()? / 2;
    Some(usable.saturating_sub(usize::try_from(queued).ok()?))
}

/// Writes a last message, waiting at most [`GOODBYE_WRITE_TIMEOUT_MS`] for
/// the peer's window, then closes the socket. Errors are the peer's problem.
pub async fn say_goodbye(mut stream: TcpStream, message: &[u8]) {
    write_goodbye(&mut stream, message).await;
    let _ = stream.close().await;
}

/// Writes a last message within [`GOODBYE_WRITE_TIMEOUT_MS`]; the caller
/// closes (or drops) the socket.
pub async fn write_goodbye(stream: &mut TcpStream, message: &[u8]) {
    let timeout = glommio::timer::sleep(Duration::from_millis(GOODBYE_WRITE_TIMEOUT_MS));
    if let Either::Left(Ok(())) = first(stream.write_all(message), timeout).await {
        let _ = stream.flush().await;
    }
}

/// Connections of one shard being refused with a message; past
/// [`REFUSALS_IN_FLIGHT_MAX`] a refused connection is closed at once.
#[derive(Default)]
pub struct Refusals {
    in_flight: Cell<usize>,
}

impl Refusals {
    /// Refuses `stream`: spawns the goodbye if there is room for one more,
    /// else drops (closes) it now.
    pub fn refuse(self: &std::rc::Rc<Self>, stream: TcpStream, message: String) {
        if self.in_flight.get() >= REFUSALS_IN_FLIGHT_MAX {
            drop(stream);
            return;
        }
        self.in_flight.set(self.in_flight.get() + 1);
        let refusals = self.clone();
        glommio::spawn_local(async move {
            say_goodbye(stream, message.as_bytes()).await;
            refusals.in_flight.set(refusals.in_flight.get() - 1);
        })
        .detach();
    }
}
